//! What a completion's byte count means, on every transport, mechanism and buffer kind: the
//! bytes the operation moved, and `data()` exactly those. Every case hands over a buffer with
//! room to spare, since a count that reports the buffer's size instead of the bytes moved
//! looks right whenever the two are equal.
//!
//! The sizes hit each mechanism on both transports: empty, tiny, inline (InfiniBand) and eager
//! (TCP), fast RDMA (InfiniBand) and rendezvous (TCP), and server-based RDMA. Receive buffers
//! start out filled with [`FILL`], so a transport that writes past what it counts shows.

use bytes::{Bytes, BytesMut};
use ionet::{Access, Direction, OpBuf, ServiceLevel};

use super::*;

/// Data sizes of every class.
const SIZES: [usize; 7] = [0, 1, 100, 4 * 1024, 60 * 1024, 100_000, 1 << 20];

/// What a receive buffer holds before the operation.
const FILL: u8 = 0xA5;

/// Where a receiving caller keeps its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `BytesMut`.
    Mut,
    /// A registered buffer from `ep.alloc`.
    Pool,
    /// A three-piece scatter list, cut off the data's natural boundaries.
    List,
    /// A scatter list of more pieces than InfiniBand registers one by one (it stages them).
    Pieces,
}

/// `Pieces` first: the pool buffer its bytes are staged in was last a `Pool` case's buffer, so
/// a stage that copied back more than the extent shows past it.
const KINDS: [Kind; 4] = [Kind::Pieces, Kind::Mut, Kind::List, Kind::Pool];

/// A receive buffer of `cap` bytes of [`FILL`].
fn rbuf(kind: Kind, cap: usize) -> RBuf {
    let filled = |n| BytesMut::from(&vec![FILL; n][..]);
    let list = |lens: Vec<usize>| RBuf::List(lens.into_iter().filter(|&n| n > 0).map(filled).collect());
    match kind {
        Kind::Mut => RBuf::Mut(filled(cap)),
        Kind::Pool => RBuf::Pool(filled(cap)),
        Kind::List => {
            let a = cap / 3;
            let b = (cap - a).min(7);
            list(vec![a, b, cap - a - b])
        }
        Kind::Pieces => {
            let n = cap.min(150);
            list((0..n).map(|i| cap / n + usize::from(i < cap % n)).collect())
        }
    }
}

/// A receive buffer with room to spare beyond `len` bytes.
fn roomy(len: usize) -> usize {
    len + len / 2 + 100
}

/// Asserts that `c` moved exactly `want` into a `cap`-byte buffer of [`FILL`]: `len()` counts
/// it, `data()` is it, and nothing past it was written.
fn assert_moved(c: &Completion, want: &[u8], cap: usize, what: &str) {
    assert_eq!(c.len(), want.len(), "{what}: len()");
    let data = c.data().unwrap_or_else(|| panic!("{what}: no receive buffer back"));
    assert!(data[..] == want[..], "{what}: data() is not the bytes moved ({} bytes)", data.len());
    let OpBuf::Recv(r) = &c.buf else { panic!("{what}: no receive buffer back") };
    assert_eq!(r.capacity(), cap, "{what}: the buffer comes back whole");
    let all = r.to_bytes(cap);
    assert!(all[want.len()..].iter().all(|&b| b == FILL), "{what}: bytes written past len()");
}

/// Receives: the count is the message's length, whatever room the buffer had.
pub fn received_len_is_the_message_length(net: &Net) {
    let (srv, cli, p) = pair(net, Config::default(), Config::default());
    let sp = introduce(&srv, &cli, p);
    let mut tag = 0;
    for len in SIZES {
        for kind in KINDS {
            tag += 1;
            let data = pattern(len, tag);
            let cap = roomy(len);
            let r = srv.recv(sp, tag, rbuf(kind, cap)).unwrap();
            let s = cli.send(p, tag, Bytes::from(data.clone()), ServiceLevel::Normal).unwrap();
            assert_eq!(wait_ok(&cli, s).len(), len, "send of {len} B");
            let c = wait_ok(&srv, r);
            assert_moved(&c, &data, cap, &format!("{kind:?} receive of {len} B into {cap}"));
        }
    }
}

/// Gets: the count is the requested length (the local buffer's), also from a longer exposure;
/// puts count what they wrote.
pub fn get_len_is_the_requested_length(net: &Net) {
    let (srv, cli, p) = pair(net, Config::default(), Config::default());
    for (i, len) in SIZES.into_iter().enumerate() {
        let region = pattern(roomy(len), i as u64);
        let x = srv.expose(region.clone(), Access::READ_WRITE).unwrap();
        let h = x.handle();
        for kind in KINDS {
            // From inside the exposure, and from its start with the handle longer than the read.
            for (off, handle) in [(50, h.slice(50, len as u64).unwrap()), (0, h)] {
                let what = format!("{kind:?} get of {len} B at {off} of a {} B exposure", h.len);
                let g = cli.get(p, rbuf(kind, len), handle, ServiceLevel::Normal).unwrap();
                assert_moved(&wait_ok(&cli, g), &region[off..off + len], len, &what);
            }
        }
        let data = pattern(len, 1000 + i as u64);
        let put =
            cli.put(p, Bytes::from(data.clone()), h.slice(50, len as u64).unwrap(), ServiceLevel::Normal);
        assert_eq!(wait_ok(&cli, put.unwrap()).len(), len, "put of {len} B");
        srv.with_exposed(&x, |b| assert!(b[50..50 + len] == data[..], "put of {len} B landed")).unwrap();
        srv.revoke(x).unwrap();
    }
}

/// Pulls: each pull counts the bytes it pulled (its buffer's length); the client's request
/// counts its whole OUT payload, also when the server pulls only part of it. Over TCP both
/// with the payload streamed behind the request and waiting for the pulls.
pub fn pull_len_is_the_bytes_pulled(net: &Net) {
    for streamed in [true, false] {
        pulls_with(net, Config::default().stream_requests(streamed));
    }
}

fn pulls_with(net: &Net, cli_cfg: Config) {
    let (srv, cli, p) = pair(net, Config::default(), cli_cfg);
    let srv2 = srv.clone();
    let requests = SIZES.len() * KINDS.len() + SIZES.len();
    let server = std::thread::spawn(move || {
        for _ in 0..requests {
            let req = srv2.next_request(Some(T)).unwrap().expect("request");
            assert_eq!(req.direction(), Direction::Out);
            let len = req.payload_len() as usize;
            let want = pattern(len, len as u64);
            let kind = KINDS[usize::from(req.header()[0]) % KINDS.len()];
            let whole = req.header()[1] == 1;
            // Two pulls (the second only when the whole payload is wanted), posted together.
            let half = len / 2;
            let mut pulls = vec![(0, half)];
            if whole {
                pulls.push((half, len - half));
            }
            let ops: Vec<_> =
                pulls.iter().map(|&(off, n)| req.pull_into(rbuf(kind, n), off as u64).unwrap()).collect();
            for (op, (off, n)) in ops.into_iter().zip(pulls) {
                let what = format!("{kind:?} pull of {n} B at {off} of {len}");
                assert_moved(&wait_ok(&srv2, op), &want[off..off + n], n, &what);
            }
            assert_eq!(wait_ok(&srv2, req.reply(Bytes::from_static(b"ok")).unwrap()).len(), 0, "reply");
        }
    });
    for len in SIZES {
        let cases = (0..KINDS.len()).map(|k| (k as u8, 1u8)).chain([(0, 0)]);
        for (kind, whole) in cases {
            let data = Bytes::from(pattern(len, len as u64));
            let payload = Payload::Out(data.into());
            let op = cli.request(p, 1, vec![kind, whole], payload, ServiceLevel::Normal).unwrap();
            let c = wait_ok(&cli, op);
            let part = if whole == 1 { "" } else { " (half pulled)" };
            assert_eq!(c.len(), len, "write of {len} B{part}: the request counts its payload");
        }
    }
    server.join().unwrap();
}

/// Pushes: the client's request counts up to the end of the furthest byte the server pushed,
/// so `data()` is what the server wrote (holes between pushes keep the caller's bytes, but in
/// a read InfiniBand stages), and nothing past it changed.
pub fn pushed_len_is_the_extent_written(net: &Net) {
    // Room for reply headers too large for a message (InfiniBand fetches them with RDMA).
    let cfg = || Config::default().max_header(BIG_REPLY);
    let (srv, cli, p) = pair(net, cfg(), cfg());
    // IN buffers of every class: inline (InfiniBand) / eager (TCP), fast RDMA, server-based
    // RDMA, and one larger than the largest push.
    let caps = [4 * 1024, 64 * 1024, 1 << 20, 3 << 19];
    // Per buffer: every size that leaves room, then pushes with holes, out of order, and one
    // ending at the buffer's end.
    let plans = |cap: usize| -> Vec<Vec<(usize, usize)>> {
        let q = cap / 8;
        let mut v: Vec<Vec<(usize, usize)>> = vec![vec![]];
        v.extend(SIZES.into_iter().filter(|&n| n < cap).map(|n| vec![(0, n)]));
        v.extend([vec![(0, q), (4 * q, q)], vec![(4 * q, q), (0, q)], vec![(4 * q, q)], vec![(cap - q, q)]]);
        v
    };
    // (buffer, pushes, kind, large reply header): every plan into every kind, then pushes with
    // a hole answered with a large header.
    let mut cases = Vec::new();
    for cap in caps {
        for pushes in plans(cap) {
            cases.extend(KINDS.map(|kind| (cap, pushes.clone(), kind, false)));
        }
        cases.push((cap, vec![(0, cap / 8), (cap / 2, cap / 8)], Kind::Mut, true));
    }
    let requests = cases.len();
    let srv2 = srv.clone();
    let server = std::thread::spawn(move || {
        let mut srcs = std::collections::HashMap::new();
        for _ in 0..requests {
            let req = srv2.next_request(Some(T)).unwrap().expect("request");
            assert_eq!(req.direction(), Direction::In);
            let cap = req.payload_len() as usize;
            let src = &*srcs.entry(cap).or_insert_with(|| pattern(cap, cap as u64));
            let pushes: Vec<(usize, usize)> = req
                .header()
                .chunks_exact(16)
                .map(|c| {
                    let off = u64::from_le_bytes(c[..8].try_into().unwrap()) as usize;
                    (off, u64::from_le_bytes(c[8..].try_into().unwrap()) as usize)
                })
                .collect();
            let ops: Vec<_> = pushes
                .iter()
                .map(|&(off, n)| {
                    req.push_from(Bytes::copy_from_slice(&src[off..off + n]), off as u64).unwrap()
                })
                .collect();
            for (op, (off, n)) in ops.into_iter().zip(pushes) {
                assert_eq!(wait_ok(&srv2, op).len(), n, "push of {n} B at {off} into {cap}");
            }
            let big = req.tag() == 3;
            assert_eq!(
                wait_ok(&srv2, req.reply(reply_header(big)).unwrap()).len(),
                0,
                "a reply moves no payload"
            );
        }
    });
    let mut srcs = std::collections::HashMap::new();
    for (cap, pushes, kind, big) in cases {
        let src = &*srcs.entry(cap).or_insert_with(|| pattern(cap, cap as u64));
        let end = pushes.iter().filter(|p| p.1 > 0).map(|&(off, n)| off + n).max().unwrap_or(0);
        let mut want = vec![FILL; end];
        for &(off, n) in &pushes {
            want[off..off + n].copy_from_slice(&src[off..off + n]);
        }
        let header: Vec<u8> = pushes
            .iter()
            .flat_map(|&(off, n)| [(off as u64).to_le_bytes(), (n as u64).to_le_bytes()])
            .flatten()
            .collect();
        let what = format!("{kind:?} read into {cap} B, pushes {pushes:?}, large reply: {big}");
        let payload = Payload::In(rbuf(kind, cap));
        let tag = if big { 3 } else { 2 };
        let c = wait_ok(&cli, cli.request(p, tag, header, payload, ServiceLevel::Normal).unwrap());
        assert!(c.reply.as_ref() == Some(&reply_header(big)), "{what}: reply header");
        if kind == Kind::Pieces {
            // InfiniBand stages this list: holes below the extent are unspecified there (see
            // `Completion::len`); the pushed bytes, the count and the untouched tail are not.
            let data = c.data().unwrap();
            for &(off, n) in &pushes {
                assert!(data[off..off + n] == src[off..off + n], "{what}: pushed bytes");
            }
            if data.len() == want.len() {
                want.copy_from_slice(&data);
            }
        }
        assert_moved(&c, &want, cap, &what);
    }
    server.join().unwrap();
}

/// A reply header larger than a fast-RDMA ring slot.
const BIG_REPLY: usize = 100 << 10;

fn reply_header(big: bool) -> Bytes {
    if big { Bytes::from(vec![b'd'; BIG_REPLY]) } else { Bytes::from_static(b"done") }
}

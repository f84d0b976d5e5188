//! Two engines joined through the software provider in one process, with the side channel
//! left out: the test brings their queue pairs up with each other's limits, drives both
//! engines' rounds itself and passes the time in. Unlike the scripted peer of `scripted.rs`,
//! both ends are the engine, so every exchange runs both halves of the protocol as they run
//! in production — rendezvous announcement, the receiver's RDMA READ and its FIN; a request's
//! pulls, pushes and reply; a withdrawn send answered by the receiver — on a clock the test
//! moves (cancel grace periods pass without waiting).
//!
//! The provider finishes most work requests inside `post_send`; the few it leaves to its
//! progress thread (a FENCE behind an RDMA READ) arrive a little later, so a test waits for the
//! outcome it expects ([`Pair::until`]) rather than for a fixed number of rounds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::backend::{Cmd, PullCmd, PushCmd, RecvCmd, ReplyCmd, RequestCmd, SendCmd};
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::op::{Completion, Payload as OpPayload, RequestMeta};

type Soft = crate::ib::soft::SoftContext;

/// The address each end knows the other by (no socket is ever opened to it).
fn addr_of(end: usize) -> SocketAddr {
    ([127, 0, 0, 1], 10 + end as u16).into()
}

/// Two engines, `0` and `1`, connected on every service level.
struct Pair {
    ends: [IbBackend<Soft>; 2],
    /// How each end names the other.
    peer: [PeerId; 2],
    now: Instant,
    next_op: u64,
    /// Each end's completions so far, in order.
    done: [Vec<Completion>; 2],
}

impl Pair {
    fn new() -> Pair {
        let ends = [tests::backend(), tests::backend()];
        let now = ends[0].lock().last_timers.max(ends[1].lock().last_timers);
        let mut peer = [PeerId(0); 2];
        for (e, be) in ends.iter().enumerate() {
            let mut st = be.lock();
            // End 0 dialled end 1; end 1 accepted it (and cannot dial back).
            peer[e] = if e == 0 {
                st.peers.dialled(addr_of(1), 16, || ()).expect("peer")
            } else {
                st.peers.accepted(7, addr_of(0), 0, || ())
            };
        }
        for sl in ServiceLevel::ALL {
            let cid = [0, 1].map(|e| ends[e].lock().create_conn(peer[e], sl).expect("queue pair"));
            let info = [0, 1].map(|e| ends[e].lock().local_info(cid[e], addr_of(1 - e)).expect("info"));
            for e in 0..2 {
                let mut st = ends[e].lock();
                st.bring_up(cid[e], info[1 - e], addr_of(1 - e)).expect("bring-up");
                st.peers[peer[e]].conns[sl.index()] = Some(cid[e]);
                st.conn_mut(cid[e]).expect("connection").ready = true;
            }
        }
        Pair { ends, peer, now, next_op: 1, done: [Vec::new(), Vec::new()] }
    }

    fn st(&self, end: usize) -> std::sync::MutexGuard<'_, State<Soft>> {
        self.ends[end].lock()
    }

    /// Posts `cmd` at `end` on the pair's clock.
    fn post(&mut self, end: usize, cmd: Cmd) -> OpId {
        let op = OpId(self.next_op);
        self.next_op += 1;
        let now = self.now;
        self.st(end).post(op, cmd, now).expect("posted");
        op
    }

    fn send(&mut self, end: usize, tag: u64, data: Bytes) -> OpId {
        let peer = self.peer[end];
        self.post(
            end,
            Cmd::Send(SendCmd {
                peer,
                tag,
                sl: ServiceLevel::Normal,
                buf: SendBuf::Bytes(data),
                unexpected: false,
            }),
        )
    }

    fn recv(&mut self, end: usize, tag: u64, cap: usize) -> OpId {
        let peer = self.peer[end];
        self.post(end, Cmd::Recv(RecvCmd { peer, tag, buf: RecvBuf::Mut(BytesMut::zeroed(cap)) }))
    }

    fn cancel(&mut self, end: usize, op: OpId, why: Error) {
        let now = self.now;
        self.st(end).cancel(op, why, now);
    }

    /// One round at each end: completions polled, queued messages posted, timers run on the
    /// pair's clock, completions collected. Whether anything happened.
    fn round(&mut self) -> bool {
        let mut progressed = false;
        for e in 0..2 {
            let be = &self.ends[e];
            let mut st = be.lock();
            let before = (st.events, st.ops.done_len());
            st.poll_cq();
            st.pump_all();
            st.timers(false, self.now);
            progressed |= (st.events, st.ops.done_len()) != before;
            st.ops.retire(|x| x.retire(&be.cache));
            self.done[e].extend(st.ops.take_done());
        }
        progressed
    }

    /// Runs rounds until `cond` holds; fails the test if it does not within a few seconds of
    /// real time (what the provider's progress thread may need, many times over).
    fn until(&mut self, what: &str, cond: impl Fn(&Pair) -> bool) {
        let give_up = Instant::now() + Duration::from_secs(10);
        while !cond(self) {
            if !self.round() {
                assert!(Instant::now() < give_up, "never happened: {what}");
                std::thread::yield_now();
            }
        }
    }

    /// Runs rounds until nothing happens for a while: for asserting that something does not.
    fn settle(&mut self) {
        let mut idle = 0;
        while idle < 200 {
            if self.round() {
                idle = 0;
            } else {
                idle += 1;
                std::thread::yield_now();
            }
        }
    }

    /// Moves the pair's clock on.
    fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    fn count(&self, end: usize, op: OpId) -> usize {
        self.done[end].iter().filter(|c| c.op == op).count()
    }

    fn completed(&self, end: usize, op: OpId) -> bool {
        self.count(end, op) > 0
    }

    fn completion(&self, end: usize, op: OpId) -> &Completion {
        self.done[end].iter().find(|c| c.op == op).expect("completed")
    }

    fn received(&self, end: usize, op: OpId) -> Vec<u8> {
        let c = self.completion(end, op);
        match (&c.buf, &c.result) {
            (OpBuf::Recv(RecvBuf::Mut(b)), Ok(n)) => b[..*n].to_vec(),
            _ => panic!("not a completed receive: {:?}", c.result),
        }
    }

    /// The next request queued at `end` for its application, once one is.
    fn next_request(&mut self, end: usize) -> RequestMeta {
        self.until("a request arrives", |p| !p.ends[end].core.lock().requests.is_empty());
        self.ends[end].core.lock().requests.pop_front().expect("queued")
    }

    /// Whether `end` has torn down its connections to the other (a peer it dialled stays
    /// known, to be dialled again; one it accepted is marked lost).
    fn torn_down(&self, end: usize) -> bool {
        self.st(end).peers.get(self.peer[end]).is_none_or(|p| p.conns.iter().all(Option::is_none))
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>().into()
}

/// A message of every size around the policy's thresholds crosses, byte for byte, by the
/// mechanism the thresholds name, and both ends report the same one; posted before or after
/// the message arrives.
#[test]
fn messages_cross_by_the_mechanism_their_size_calls_for() {
    let mut p = Pair::new();
    let t = p.st(0).s.policy.thresholds(ServiceLevel::Normal);
    assert!(0 < t.inline_max && t.inline_max < t.fast_max, "{t:?}");
    let expect = |len: usize| match len {
        n if n <= t.inline_max => Mechanism::Inline,
        n if n <= t.fast_max => Mechanism::FastRdma,
        _ => Mechanism::ServerRdma,
    };
    let sizes = [0, 1, t.inline_max, t.inline_max + 1, t.fast_max, t.fast_max + 1, 1 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        for recv_first in [true, false] {
            let tag = (i * 2 + usize::from(recv_first)) as u64;
            let data = pattern(len, i as u8);
            let (s, r) = if recv_first {
                let r = p.recv(1, tag, len.max(1));
                (p.send(0, tag, data.clone()), r)
            } else {
                let s = p.send(0, tag, data.clone());
                p.settle();
                (s, p.recv(1, tag, len.max(1)))
            };
            p.until("both ends complete", |p| p.completed(0, s) && p.completed(1, r));
            assert_eq!(p.received(1, r), data, "{len} bytes");
            let (sc, rc) = (p.completion(0, s), p.completion(1, r));
            assert_eq!(sc.result.as_ref().ok(), Some(&len), "{len} bytes");
            let want = if len == 0 { Mechanism::Inline } else { expect(len) };
            assert_eq!((sc.mechanism, rc.mechanism), (Some(want), Some(want)), "{len} bytes");
        }
    }
    p.settle();
    for e in 0..2 {
        let mut ops: Vec<OpId> = p.done[e].iter().map(|c| c.op).collect();
        ops.sort();
        ops.dedup();
        assert_eq!(ops.len(), p.done[e].len(), "each operation completes once");
    }
}

/// A request with a payload the server pulls in pieces, then one whose IN payload the server
/// pushes into, each answered by a reply carrying the server's header: the client's request
/// completes once, after every transfer, with the bytes pushed.
#[test]
fn a_request_s_payload_is_pulled_and_pushed_before_its_reply() {
    let mut p = Pair::new();
    let out = pattern(300 << 10, 3);
    let (peer, sl) = (p.peer[0], ServiceLevel::Bulk);
    let req = p.post(
        0,
        Cmd::Request(RequestCmd {
            peer,
            tag: 9,
            sl,
            header: Bytes::from_static(b"write"),
            payload: OpPayload::Out(SendBuf::Bytes(out.clone())),
        }),
    );
    let m = p.next_request(1);
    assert_eq!((&m.header[..], m.len), (&b"write"[..], out.len() as u64));
    let server = p.peer[1];
    let halves = [0, out.len() / 2].map(|offset| {
        let buf = RecvBuf::Mut(BytesMut::zeroed(out.len() / 2));
        p.post(1, Cmd::Pull(PullCmd { peer: server, req: m.id, sl, offset: offset as u64, buf }))
    });
    p.until("both pulls complete", |p| halves.iter().all(|h| p.completed(1, *h)));
    let got: Vec<u8> = halves.iter().flat_map(|h| p.received(1, *h)).collect();
    assert_eq!(got, out);
    assert!(!p.completed(0, req), "no reply yet");
    let reply = ReplyCmd { peer: server, req: m.id, sl, header: Bytes::from_static(b"done"), status: 0 };
    let rep = p.post(1, Cmd::Reply(reply));
    p.until("the reply arrives", |p| p.completed(0, req) && p.completed(1, rep));
    let c = p.completion(0, req);
    assert_eq!(
        (c.result.as_ref().ok(), c.reply.as_deref()),
        (Some(&out.len()), Some(&b"done"[..])),
        "{:?}",
        c.result
    );

    // Reading: the server pushes two pieces into the client's buffer, then replies.
    let into = RecvBuf::Mut(BytesMut::zeroed(200 << 10));
    let read = p.post(
        0,
        Cmd::Request(RequestCmd {
            peer,
            tag: 9,
            sl,
            header: Bytes::from_static(b"read"),
            payload: OpPayload::In(into),
        }),
    );
    let m = p.next_request(1);
    let data = pattern(150 << 10, 5);
    let pushes = [0usize, 100 << 10].map(|at| {
        let piece = data.slice(at..(at + (100 << 10)).min(data.len()));
        p.post(
            1,
            Cmd::Push(PushCmd { peer: server, req: m.id, sl, offset: at as u64, buf: SendBuf::Bytes(piece) }),
        )
    });
    let reply = ReplyCmd { peer: server, req: m.id, sl, header: Bytes::new(), status: 0 };
    p.post(1, Cmd::Reply(reply));
    p.until("the read completes", |p| p.completed(0, read));
    assert!(pushes.iter().all(|op| p.count(1, *op) == 1), "each push once");
    let c = p.completion(0, read);
    assert_eq!(c.result.as_ref().ok(), Some(&data.len()), "the bytes pushed: {:?}", c.result);
    let OpBuf::Recv(RecvBuf::Mut(b)) = &c.buf else { panic!("the read's buffer comes back") };
    assert_eq!(&b[..data.len()], &data[..]);
    assert_eq!(p.count(0, read), 1);
}

/// Cancelling on either side: a receive cancelled before its message is not used, for an
/// eager message or a rendezvous announcement; a large send withdrawn while the receiver holds
/// its announcement is answered by the receiver (the receive that matches it learns of the
/// withdrawal, the FIN lets the sender go), so neither end is torn down after the grace.
#[test]
fn cancel_before_and_after_match_is_answered_by_the_other_engine() {
    let mut p = Pair::new();
    let r = p.recv(1, 5, 64);
    p.cancel(1, r, Error::Cancelled);
    let s = p.send(0, 5, Bytes::from_static(b"abc"));
    let r2 = p.recv(1, 5, 64);
    p.until("the message meets the second receive", |p| p.completed(1, r2) && p.completed(0, s));
    assert!(matches!(p.completion(1, r).result, Err(Error::Cancelled)));
    assert_eq!(p.received(1, r2), b"abc");

    // A rendezvous send withdrawn before the receiver reads it.
    let big = pattern(1 << 20, 1);
    let s = p.send(0, 6, big.clone());
    p.settle();
    let grace = p.st(0).s.cfg.ib.cancel_grace;
    p.cancel(0, s, Error::Cancelled);
    // The withdrawal reaches the receiver before its receive does.
    p.settle();
    let r = p.recv(1, 6, 1 << 20);
    p.until("both ends complete", |p| p.completed(0, s) && p.completed(1, r));
    assert!(matches!(p.completion(0, s).result, Err(Error::Cancelled)), "{:?}", p.completion(0, s).result);
    let rc = &p.completion(1, r).result;
    assert!(matches!(rc, Err(Error::PeerCancelled)), "the receive learns of the withdrawal: {rc:?}");
    p.advance(grace * 2);
    p.settle();
    assert!(!p.torn_down(0) && !p.torn_down(1), "answered in time: both ends stay connected");

    // A deadline passing on a receive the announcement has not reached yet: it ends with its
    // own error, and the message goes to the next receive, read once.
    let r = p.recv(1, 7, 1 << 20);
    let s = p.send(0, 7, big.clone());
    p.cancel(1, r, Error::Timeout);
    let r2 = p.recv(1, 7, 1 << 20);
    p.until("the send meets the next receive", |p| p.completed(0, s) && p.completed(1, r2));
    assert!(matches!(p.completion(1, r).result, Err(Error::Timeout)));
    assert_eq!(p.received(1, r2), big);
    p.advance(grace * 2);
    p.settle();
    assert_eq!((p.count(0, s), p.count(1, r), p.count(1, r2)), (1, 1, 1));
    let r = p.recv(1, 8, 16);
    let s = p.send(0, 8, Bytes::from_static(b"after"));
    p.until("the next message", |p| p.completed(1, r) && p.completed(0, s));
    assert_eq!(p.received(1, r), b"after");
}

/// A peer that holds a cancelled transfer past the grace period is torn down, on the pair's
/// clock: the sender's ops on it fail once each, and no time passes for real.
#[test]
fn a_transfer_not_released_within_the_grace_loses_the_peer() {
    let mut p = Pair::new();
    let grace = p.st(0).s.cfg.ib.cancel_grace;
    // End 1 stops running: its FIN for the withdrawn message never comes.
    let s = p.send(0, 1, pattern(1 << 20, 2));
    let r = p.recv(0, 2, 16);
    p.cancel(0, s, Error::Cancelled);
    let step = |p: &mut Pair| {
        let be = &p.ends[0];
        let mut st = be.lock();
        st.poll_cq();
        st.pump_all();
        st.timers(false, p.now);
        p.done[0].extend(st.ops.take_done());
    };
    step(&mut p);
    p.advance(grace / 2);
    step(&mut p);
    assert_eq!(p.count(0, s), 0, "held within the grace");
    p.advance(grace);
    step(&mut p);
    assert!(p.torn_down(0), "torn down after the grace");
    for op in [s, r] {
        assert_eq!(p.count(0, op), 1, "{op:?} once");
    }
    assert!(
        matches!(p.completion(0, r).result, Err(Error::PeerLost { .. })),
        "{:?}",
        p.completion(0, r).result
    );
}

/// When one engine loses the other mid-transfer (its queue pairs gone), the other learns it
/// from its own work requests and fails each of its operations on that peer once.
#[test]
fn a_peer_lost_mid_transfer_fails_each_op_once_at_the_other_end() {
    let mut p = Pair::new();
    let r = p.recv(0, 3, 64);
    let big = p.send(0, 1, pattern(1 << 20, 4));
    p.settle();
    {
        let peer = p.peer[1];
        p.st(1).fail_peer(peer, Loss::Lost("test".into()));
    }
    // The next message finds no queue pair at the other end.
    let s = p.send(0, 2, Bytes::from_static(b"hello"));
    p.until("end 0 notices", |p| p.torn_down(0));
    p.settle();
    // The small send was copied and completed as it was posted; the send queue's error is
    // how its loss was noticed.
    assert_eq!(p.count(0, s), 1);
    for op in [r, big] {
        assert_eq!(p.count(0, op), 1, "{op:?} once");
        assert!(
            matches!(&p.completion(0, op).result, Err(Error::PeerLost { peer, .. }) if *peer == p.peer[0]),
            "{op:?}: {:?}",
            p.completion(0, op).result
        );
    }
}

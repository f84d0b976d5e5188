//! One engine and a peer played by the test: the peer's messages are written straight into
//! the engine's receive buffers and ring slots and announced as receive completions; what the
//! engine wants to send stays in its connection's queue, where the test reads it (the queue
//! pair is never made ready, so nothing is posted and no unit of a transfer starts). Time is
//! whatever the test passes in. No second endpoint, no side channel, no traffic through the
//! provider: the provider only supplies the memory registrations a send by server-based RDMA
//! needs.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::msg::{self, MSG_HDR, Prefix, Segment};
use super::side::IbInfo;
use super::*;
use crate::backend::{Cmd, RecvCmd, SendCmd};
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::flowctl::{CreditConfig, Credits, RingSender, encode_imm};
use crate::wire::{Header, Kind};

type Soft = crate::ib::soft::SoftContext;

use super::tests::backend;

/// The scripted peer of one connection: which receive buffer and ring slot its next SEND and
/// ring write use (the engine posts its receives in order and consumes slots in ring order).
struct Peer {
    id: PeerId,
    cid: u32,
    next_recv: u32,
    next_slot: u16,
}

/// Opens a connection to a new peer whose limits equal this endpoint's; it is never made
/// ready, so the engine's messages for it stay queued.
fn connect(st: &mut State<Soft>, port: u16) -> Peer {
    let id = st.peers.dialled(([127, 0, 0, 1], port).into(), 16, || ()).expect("peer");
    let sl = ServiceLevel::Normal;
    let cid = st.create_conn(id, sl).expect("connection");
    let info = IbInfo {
        qp: QpEndpointInfo { qpn: 1, psn: 0, lid: 1, gid: Gid([0; 16]) },
        recv_buffers: st.s.n_recv,
        recv_size: st.s.recv_size,
        ring_addr: 0x10_0000,
        ring_rkey: 1,
        ring_slots: st.s.n_ring,
        slot_size: st.s.slot_size,
        link_layer: LinkLayer::InfiniBand,
        mtu: Mtu::Mtu4096,
    };
    let credits =
        Credits::new(&CreditConfig::default().recv_buffers(st.s.n_recv), info.recv_buffers).unwrap();
    let ring = RingSender::new(info.ring_slots, info.slot_size).unwrap();
    let c = st.conn_mut(cid).unwrap();
    c.link.connect(credits, ring);
    c.remote = Some(info);
    st.peers[id].conns[sl.index()] = Some(cid);
    Peer { id, cid, next_recv: 0, next_slot: 0 }
}

fn header(kind: Kind, a: u64, len: usize) -> Header {
    let mut h = Header::new(kind, ServiceLevel::Normal);
    h.a = a;
    h.len = len as u32;
    h
}

fn wc(
    st: &State<Soft>,
    cid: u32,
    idx: u32,
    opcode: WcOpcode,
    byte_len: usize,
    imm: Option<u32>,
) -> WorkCompletion {
    let gen_ = st.conn(cid).unwrap().gen_;
    WorkCompletion {
        wr_id: wr_id(WR_RECV, cid, gen_, idx),
        status: WcStatus::Success,
        opcode,
        byte_len: byte_len as u32,
        imm_data: imm,
        qp_num: 0,
        src_qp: 0,
        vendor_err: 0,
    }
}

fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; MSG_HDR];
    msg::encode_into(&mut b, Prefix::default(), h);
    b.extend_from_slice(payload);
    b
}

impl Peer {
    /// The peer SENDs a message into the engine's next receive buffer.
    fn send(&mut self, st: &mut State<Soft>, h: Header, payload: &[u8]) {
        let b = frame(&h, payload);
        let idx = self.next_recv;
        let c = st.conn(self.cid).unwrap();
        self.next_recv = (idx + 1) % c.link.layout().n_recv as u32;
        c.mem.write_at(c.link.layout().recv_off(idx), &b);
        let w = wc(st, self.cid, idx, WcOpcode::Recv, b.len(), None);
        st.on_wc(&w);
    }

    /// The peer writes a message into the engine's next ring slot.
    fn ring(&mut self, st: &mut State<Soft>, h: Header, payload: &[u8]) {
        let b = frame(&h, payload);
        let slot = self.next_slot;
        let c = st.conn(self.cid).unwrap();
        self.next_slot = (slot + 1) % c.link.layout().n_ring as u16;
        c.mem.write_at(c.link.layout().ring_off(slot), &b);
        let idx = self.next_recv;
        self.next_recv = (idx + 1) % c.link.layout().n_recv as u32;
        let w =
            wc(st, self.cid, idx, WcOpcode::RecvRdmaWithImm, b.len(), Some(encode_imm(slot, b.len() as u32)));
        st.on_wc(&w);
    }

    /// The engine's messages queued for this peer: (how, kind, header).
    fn out(&self, st: &State<Soft>) -> Vec<(Via, Kind, Header)> {
        st.conn(self.cid)
            .map_or(Vec::new(), |c| c.out.iter().map(|m| (m.via, m.header.kind, m.header)).collect())
    }

    /// The queue pair fails: the provider flushes the receive it held.
    fn lose(&self, st: &mut State<Soft>) {
        let mut w = wc(st, self.cid, 0, WcOpcode::Recv, 0, None);
        w.status = WcStatus::RetryExcErr;
        st.on_wc(&w);
    }
}

fn recv(st: &mut State<Soft>, p: &Peer, op: u64, tag: u64, cap: usize, now: Instant) -> OpId {
    let cmd = Cmd::Recv(RecvCmd { peer: p.id, tag, buf: RecvBuf::Mut(BytesMut::zeroed(cap)) });
    st.post(OpId(op), cmd, now).unwrap();
    OpId(op)
}

fn send(st: &mut State<Soft>, p: &Peer, op: u64, tag: u64, data: Bytes, now: Instant) -> OpId {
    let cmd = Cmd::Send(SendCmd {
        peer: p.id,
        sl: ServiceLevel::Normal,
        tag,
        buf: SendBuf::Bytes(data),
        unexpected: false,
    });
    st.post(OpId(op), cmd, now).unwrap();
    OpId(op)
}

/// Completions so far, in order: (op, result with the error spelled out).
fn done(st: &State<Soft>) -> Vec<(OpId, std::result::Result<usize, String>)> {
    st.ops
        .done()
        .iter()
        .map(|c| (c.op, c.result.as_ref().map(|n| *n).map_err(|e| format!("{e:?}"))))
        .collect()
}

fn received(st: &State<Soft>, op: OpId) -> Vec<u8> {
    let c = st.ops.done().iter().find(|c| c.op == op).expect("completed");
    match (&c.buf, &c.result) {
        (OpBuf::Recv(RecvBuf::Mut(b)), Ok(n)) => b[..*n].to_vec(),
        _ => panic!("not a completed receive: {:?}", c.result),
    }
}

fn count(st: &State<Soft>, op: OpId) -> usize {
    st.ops.done().iter().filter(|c| c.op == op).count()
}

#[test]
fn receives_match_early_arrivals_by_tag_in_arrival_order() {
    let be = backend();
    let mut st = be.lock();
    let now = Instant::now();
    let mut p = connect(&mut st, 1);
    for (tag, body) in [(1, &b"one-a"[..]), (2, b"two"), (1, b"one-b")] {
        p.send(&mut st, header(Kind::Eager, tag, body.len()), body);
    }
    assert!(done(&st).is_empty());
    let r1 = recv(&mut st, &p, 1, 1, 64, now);
    let r2 = recv(&mut st, &p, 2, 2, 64, now);
    let r3 = recv(&mut st, &p, 3, 1, 64, now);
    assert_eq!(received(&st, r1), b"one-a");
    assert_eq!(received(&st, r2), b"two");
    assert_eq!(received(&st, r3), b"one-b");
    // Posted first, then the message: matched on arrival (here by a ring write).
    let r4 = recv(&mut st, &p, 4, 3, 64, now);
    assert_eq!(count(&st, r4), 0);
    p.ring(&mut st, header(Kind::Eager, 3, 5), b"three");
    assert_eq!(received(&st, r4), b"three");
    assert_eq!(st.ops.done().len(), 4, "each once");
    assert_eq!(st.ops.done()[3].mechanism, Some(Mechanism::FastRdma));
    // A receive too small for its message fails with the sizes.
    let r5 = recv(&mut st, &p, 5, 4, 2, now);
    p.send(&mut st, header(Kind::Eager, 4, 3), b"abc");
    assert_eq!(done(&st).last().unwrap(), &(r5, Err("Truncated { len: 3, capacity: 2 }".into())));
}

#[test]
fn messages_at_the_buffer_and_slot_limits() {
    let be = backend();
    let mut st = be.lock();
    let now = Instant::now();
    let mut p = connect(&mut st, 1);
    let (rs, slot) = (st.s.recv_size as usize, st.s.slot_size as usize);
    // Arriving: a SEND fills a receive buffer at most, a ring write a slot.
    for (i, len) in [rs - MSG_HDR - 1, rs - MSG_HDR].into_iter().enumerate() {
        let r = recv(&mut st, &p, 10 + i as u64, 7, len, now);
        p.send(&mut st, header(Kind::Eager, 7, len), &vec![i as u8; len]);
        assert_eq!(received(&st, r).len(), len);
    }
    for (i, len) in [slot - MSG_HDR - 1, slot - MSG_HDR].into_iter().enumerate() {
        let r = recv(&mut st, &p, 20 + i as u64, 8, len, now);
        p.ring(&mut st, header(Kind::Eager, 8, len), &vec![i as u8; len]);
        assert_eq!(received(&st, r).len(), len);
    }
    // Posting, with inline forced: inline up to what a receive buffer carries, then fast RDMA
    // up to a slot, then server-based RDMA (a rendezvous announcing a segment list).
    st.s.policy.force(Some(Mechanism::Inline));
    let (inline, fast) = (rs - MSG_HDR, slot - MSG_HDR);
    let cases = [
        (inline - 1, Via::Send, Kind::Eager),
        (inline, Via::Send, Kind::Eager),
        (inline + 1, Via::Ring, Kind::Eager),
        (fast - 1, Via::Ring, Kind::Eager),
        (fast, Via::Ring, Kind::Eager),
        (fast + 1, Via::Send, Kind::Rdv),
    ];
    for (i, (len, via, kind)) in cases.into_iter().enumerate() {
        send(&mut st, &p, 100 + i as u64, 9, Bytes::from(vec![1u8; len]), now);
        let (v, k, h) = *p.out(&st).last().unwrap();
        assert_eq!((v, k), (via, kind), "{len} bytes");
        if kind == Kind::Rdv {
            assert_eq!(h.c, len as u64, "the rendezvous announces the whole body");
        }
    }
    // A message whose header announces more than its buffer holds is a broken peer: lost.
    let mut q = connect(&mut st, 2);
    let r = recv(&mut st, &q, 30, 1, 8, now);
    let c = st.conn(q.cid).unwrap();
    let too_long = c.link.layout().rs.max(c.link.layout().slot) + 1 - MSG_HDR;
    q.send(&mut st, header(Kind::Eager, 1, too_long), &vec![0; too_long.min(rs - MSG_HDR)]);
    assert!(
        matches!(st.ops.done().last().map(|c| (c.op, &c.result)), Some((o, Err(Error::Protocol { .. }))) if o == r),
        "{:?}",
        done(&st).last()
    );
}

/// Sends posted before the peer's limits are known wait for them, then go in posting order by
/// what the peer's smaller buffers carry; an unexpected send that no longer fits a slot fails
/// then, and a waiting send cancelled meanwhile never goes.
#[test]
fn sends_held_for_the_peers_limits_go_in_posting_order() {
    let be = backend();
    let mut st = be.lock();
    let now = Instant::now();
    let p = connect(&mut st, 1);
    // Back to before the peer's limits came: its buffers and slots are half ours.
    let info = st.conn_mut(p.cid).unwrap().remote.take().unwrap();
    let (rs, slot) = (st.s.recv_size as usize / 2, st.s.slot_size as usize / 2);
    st.s.policy.force(Some(Mechanism::Inline));
    let data = |len| Bytes::from(vec![5u8; len]);
    send(&mut st, &p, 1, 1, data(rs - MSG_HDR), now);
    // Inline by our own buffers; the peer's need its ring.
    send(&mut st, &p, 2, 2, data(rs - MSG_HDR + 1), now);
    let unexpected = SendCmd {
        peer: p.id,
        sl: ServiceLevel::Normal,
        tag: 3,
        buf: SendBuf::Bytes(data(slot - MSG_HDR + 1)),
        unexpected: true,
    };
    st.post(OpId(3), Cmd::Send(unexpected), now).expect("fits our own slots");
    send(&mut st, &p, 4, 4, data(8), now);
    // Fast RDMA by our own slots; the peer's are too small: a rendezvous.
    send(&mut st, &p, 5, 5, data(slot - MSG_HDR + 1), now);
    st.cancel(OpId(4), Error::Cancelled, now);
    assert!(p.out(&st).is_empty(), "nothing goes before the limits are known");
    assert_eq!(done(&st), [(OpId(4), Err("Cancelled".into()))]);

    st.conn_mut(p.cid).unwrap().remote =
        Some(IbInfo { recv_size: rs as u32, slot_size: slot as u32, ..info });
    st.place_waiting_posts(p.cid, now);
    let out: Vec<_> = p.out(&st).into_iter().map(|(via, kind, h)| (via, kind, h.a)).collect();
    assert_eq!(out, [(Via::Send, Kind::Eager, 1), (Via::Ring, Kind::Eager, 2), (Via::Send, Kind::Rdv, 5)]);
    let too_large =
        format!("{:?}", Error::TooLarge { len: (slot - MSG_HDR + 1) as u64, max: (slot - MSG_HDR) as u64 });
    // The others complete when their messages are posted (or, op 5, at the receiver's FIN).
    assert_eq!(done(&st)[1..], [(OpId(3), Err(too_large))]);
}

#[test]
fn cancel_before_and_after_match() {
    let be = backend();
    let mut st = be.lock();
    let t0 = st.last_timers + Duration::from_secs(1);
    let grace = st.s.cfg.ib.cancel_grace;
    let mut p = connect(&mut st, 1);
    // Before the match: the receive completes cancelled, and the message that would have
    // matched it waits for the next receive.
    let r = recv(&mut st, &p, 1, 5, 16, t0);
    st.cancel(r, Error::Cancelled, t0);
    p.send(&mut st, header(Kind::Eager, 5, 3), b"abc");
    let r2 = recv(&mut st, &p, 2, 5, 16, t0);
    assert_eq!(done(&st)[0], (r, Err("Cancelled".into())));
    assert_eq!(received(&st, r2), b"abc");
    // After the match: a rendezvous receive whose body is being read stops and completes
    // cancelled; a deadline is a cancel with its own error.
    let r3 = recv(&mut st, &p, 3, 6, 4096, t0);
    let mut segs = Vec::new();
    msg::encode_segments(&mut segs, &[Segment { addr: 0x1000, len: 4096, rkey: 9 }]);
    let mut h = header(Kind::Rdv, 6, segs.len());
    h.b = 77;
    h.c = 4096;
    p.send(&mut st, h, &segs);
    assert!(matches!(st.ops.get(&r3).map(|o| o.st), Some(OpSt::Moving)));
    st.cancel(r3, Error::Timeout, t0);
    assert_eq!(count(&st, r3), 1);
    assert!(matches!(st.ops.done().last().unwrap().result, Err(Error::Timeout)));
    // A rendezvous send cancelled after the receiver matched it: withdrawn (a CTS the peer
    // answers with FIN), held until the FIN or the grace.
    st.s.policy.force(Some(Mechanism::ServerRdma));
    let s = send(&mut st, &p, 4, 8, Bytes::from(vec![3u8; 4096]), t0);
    let (_, kind, rdv) = *p.out(&st).last().unwrap();
    assert_eq!(kind, Kind::Rdv);
    assert!(matches!(st.ops.get(&s).map(|o| o.st), Some(OpSt::WaitFin { msg }) if msg == rdv.b));
    st.cancel(s, Error::Cancelled, t0);
    let (_, kind, cts) = *p.out(&st).last().unwrap();
    assert_eq!((kind, cts.b, cts.aux), (Kind::Cts, rdv.b, RDV_WITHDRAW));
    st.timers(false, t0 + grace / 2);
    assert_eq!(count(&st, s), 0, "held within the grace");
    let mut fin = header(Kind::Fin, 0, 0);
    fin.b = rdv.b;
    fin.aux = FIN_CANCELLED;
    p.send(&mut st, fin, &[]);
    assert_eq!(count(&st, s), 1);
    st.timers(false, t0 + grace * 2);
    assert_eq!(count(&st, s), 1, "exactly once");
    assert!(st.peers.get(p.id).is_some_and(|x| x.lost.is_none()), "the FIN came in time: the peer stays");
}

#[test]
fn a_peer_lost_mid_transfer_fails_each_of_its_ops_once() {
    let be = backend();
    let mut st = be.lock();
    let now = Instant::now();
    let mut p = connect(&mut st, 1);
    let other = connect(&mut st, 2);
    // A receive posted, one whose rendezvous body is being read, an early arrival, a send by
    // each mechanism queued, and an op on another peer that must not be touched.
    let posted = recv(&mut st, &p, 1, 1, 16, now);
    let moving = recv(&mut st, &p, 2, 2, 4096, now);
    let mut segs = Vec::new();
    msg::encode_segments(&mut segs, &[Segment { addr: 0x1000, len: 4096, rkey: 9 }]);
    let mut h = header(Kind::Rdv, 2, segs.len());
    h.b = 5;
    h.c = 4096;
    p.send(&mut st, h, &segs);
    p.send(&mut st, header(Kind::Eager, 3, 2), b"hi");
    let sends: Vec<OpId> = [(10, 8usize), (11, 20_000), (12, 1 << 20)]
        .into_iter()
        .map(|(op, len)| send(&mut st, &p, op, 4, Bytes::from(vec![0u8; len]), now))
        .collect();
    let untouched = recv(&mut st, &other, 20, 1, 16, now);
    assert!(st.ops.done().is_empty());
    p.lose(&mut st);
    let mut ops = vec![posted, moving];
    ops.extend(&sends);
    for op in &ops {
        assert_eq!(count(&st, *op), 1, "{op:?} once");
        let c = st.ops.done().iter().find(|c| c.op == *op).unwrap();
        assert!(
            matches!(&c.result, Err(Error::PeerLost { peer, .. }) if *peer == p.id),
            "{op:?}: {:?}",
            c.result
        );
    }
    assert_eq!(st.ops.done().len(), ops.len());
    assert_eq!(count(&st, untouched), 0);
    // The peer may be dialled again; what arrived early on the lost connection is gone with it.
    let late = recv(&mut st, &p, 30, 3, 16, now);
    assert_eq!(count(&st, late), 0, "the early arrival went with the connection");
    assert!(st.peers.get(p.id).is_some_and(|x| x.conns.iter().all(Option::is_none)));
}

#[test]
fn early_arrivals_beyond_the_peer_budget_wait_in_their_buffers_in_order() {
    let be = backend();
    let mut st = be.lock();
    let now = Instant::now();
    st.s.cfg.early_bytes_per_peer = 8;
    let mut p = connect(&mut st, 1);
    for (tag, body) in [(1, &b"first"[..]), (2, b"second"), (3, b"third")] {
        p.send(&mut st, header(Kind::Eager, tag, body.len()), body);
    }
    // The first fits the budget; the second does not and stays in its receive buffer, the
    // third behind it (order per connection), neither read nor given back.
    assert_eq!(st.conn(p.cid).unwrap().link.held(), 2);
    let r3 = recv(&mut st, &p, 3, 3, 16, now);
    assert_eq!(count(&st, r3), 0, "not overtaking the held second message");
    let r1 = recv(&mut st, &p, 1, 1, 16, now);
    // Taking the first frees the budget: the held messages are processed in arrival order.
    assert_eq!(received(&st, r1), b"first");
    assert_eq!(received(&st, r3), b"third");
    assert_eq!(st.conn(p.cid).unwrap().link.held(), 0);
    let r2 = recv(&mut st, &p, 2, 2, 16, now);
    assert_eq!(received(&st, r2), b"second");
    assert_eq!(st.ops.done().len(), 3);
}

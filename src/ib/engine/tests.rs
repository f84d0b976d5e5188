//! Engine state checks that need no second endpoint: a backend over the software provider,
//! driven through its state directly.

use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::op::OpKind;
use crate::wire::{Header, Kind};

/// An engine on a fresh software-provider context, for tests that drive it by hand.
pub(super) fn backend() -> IbBackend<crate::ib::soft::SoftContext> {
    let ctx = crate::ib::soft::SoftProvider::new(Default::default()).open(None).expect("softib");
    IbBackend::new(
        Scheme::SoftIb,
        ctx,
        &route::select(None, &crate::IbConfig::default(), None).unwrap(),
        None,
        &Config::default(),
        Arc::new(Completions::default()),
    )
    .expect("engine")
}

fn peer(st: &mut State<crate::ib::soft::SoftContext>, port: u16) -> PeerId {
    st.peers.dialled(([127, 0, 0, 1], port).into(), 16, || ()).expect("peer")
}

/// A FIN is accepted only from the peer the rendezvous message went to: another peer must not
/// be able to hand a send buffer back to its user (or release a reply header) while the real
/// receiver may still be reading it.
#[test]
fn fin_only_from_the_peer_it_belongs_to() {
    let be = backend();
    let mut st = be.lock();
    let a = peer(&mut st, 1);
    let b = peer(&mut st, 2);
    let op = OpId(1);
    let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from_static(b"data")));
    st.ops.insert(op, OpKind::Send, a, 5, ServiceLevel::Normal, buf, OpSt::WaitFin { msg: 7 });
    st.fin_wait.insert(7, FinWait::Send(op));
    st.fin_wait.insert(8, FinWait::Header { peer: a, regs: Vec::new(), keep: Vec::new() });
    let fin = |msg| {
        let mut h = Header::new(Kind::Fin, ServiceLevel::Normal);
        h.b = msg;
        h.aux = FIN_OK;
        h
    };
    for msg in [7, 8] {
        assert!(matches!(st.on_fin(b, &fin(msg)), Err(Loss::Protocol(_))), "FIN {msg} from another peer");
        assert!(st.fin_wait.contains_key(&msg), "FIN {msg} still awaited");
    }
    assert!(st.ops.done().is_empty(), "the send did not complete");
    for msg in [7, 8] {
        assert!(st.on_fin(a, &fin(msg)).is_ok(), "FIN {msg} from its peer");
    }
    assert!(st.fin_wait.is_empty());
    assert_eq!(st.ops.done().len(), 1);
    assert!(matches!(st.ops.done()[0].result, Ok(4)));
}

/// A reply says how far the server pushed into the request's IN buffer (the client cannot see
/// RDMA writes): the read counts that, and a claim beyond the buffer is a protocol error.
#[test]
fn reply_counts_the_pushed_extent_within_the_buffer() {
    let be = backend();
    let mut st = be.lock();
    let peer = peer(&mut st, 1);
    let reply = |op: OpId, pushed| {
        let mut h = Header::new(Kind::Reply, ServiceLevel::Normal);
        h.b = op.0;
        h.a = pushed;
        h
    };
    let read = |st: &mut State<_>, op| {
        let buf = OpBuf::Recv(RecvBuf::Mut(bytes::BytesMut::zeroed(100)));
        st.ops.insert(op, OpKind::Request, peer, 1, ServiceLevel::Normal, buf, OpSt::WaitReply);
    };
    read(&mut st, OpId(1));
    assert!(matches!(st.on_reply(0, peer, &reply(OpId(1), 101), Vec::new()), Err(Loss::Protocol(_))));
    assert!(st.ops.done().is_empty(), "not completed by the bad reply");
    read(&mut st, OpId(2));
    assert!(st.on_reply(0, peer, &reply(OpId(2), 60), Vec::new()).is_ok());
    assert_eq!(st.ops.done().len(), 1);
    assert!(matches!(st.ops.done()[0].result, Ok(60)), "{:?}", st.ops.done()[0].result);
    // A write has no room to push into.
    let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from_static(b"payload")));
    st.ops.insert(OpId(3), OpKind::Request, peer, 1, ServiceLevel::Normal, buf, OpSt::WaitReply);
    assert!(matches!(st.on_reply(0, peer, &reply(OpId(3), 1), Vec::new()), Err(Loss::Protocol(_))));
    assert!(st.on_reply(0, peer, &reply(OpId(3), 0), Vec::new()).is_ok());
    assert!(
        matches!(st.ops.done()[1].result, Ok(7)),
        "a write counts its payload: {:?}",
        st.ops.done()[1].result
    );
}

/// A rendezvous send cancelled while the receiver may be reading it: held for the grace period
/// (on the time the driver passes in), then its peer is torn down; the op completes once, with
/// the cancellation.
#[test]
fn a_cancelled_rendezvous_send_waits_out_the_grace_then_its_peer_is_lost() {
    let be = backend();
    let mut st = be.lock();
    let a = peer(&mut st, 1);
    let b = peer(&mut st, 2);
    let grace = st.s.cfg.ib.cancel_grace;
    let t0 = st.last_timers + Duration::from_secs(1);
    let op = OpId(1);
    let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from_static(b"data")));
    st.ops.insert(op, OpKind::Send, a, 5, ServiceLevel::Normal, buf, OpSt::WaitFin { msg: 7 });
    st.fin_wait.insert(7, FinWait::Send(op));
    st.cancel(op, Error::Cancelled, t0);
    assert!(matches!(st.ops.get(&op).map(|o| o.st), Some(OpSt::Cancelling { until }) if until == t0 + grace));
    st.timers(false, t0 + grace / 2);
    assert!(st.ops.done().is_empty(), "held within the grace");
    assert!(st.peers.get(a).is_some_and(|p| p.lost.is_none()));
    st.timers(false, t0 + grace);
    assert_eq!(st.ops.done().len(), 1);
    assert!(matches!(st.ops.done()[0].result, Err(Error::Cancelled)), "{:?}", st.ops.done()[0].result);
    st.timers(false, t0 + grace * 3);
    assert_eq!(st.ops.done().len(), 1, "exactly once");
    assert!(st.peers.get(b).is_some_and(|p| p.lost.is_none()), "only the op's peer is lost");
}

/// The receiver's FIN within the grace period lets the cancelled send go without losing the
/// peer; the grace running out later changes nothing.
#[test]
fn a_fin_within_the_grace_completes_a_cancelled_send_and_keeps_the_peer() {
    let be = backend();
    let mut st = be.lock();
    let a = peer(&mut st, 1);
    let grace = st.s.cfg.ib.cancel_grace;
    let t0 = st.last_timers + Duration::from_secs(1);
    let op = OpId(1);
    let buf = OpBuf::Send(SendBuf::Bytes(Bytes::from_static(b"data")));
    st.ops.insert(op, OpKind::Send, a, 5, ServiceLevel::Normal, buf, OpSt::WaitFin { msg: 7 });
    st.fin_wait.insert(7, FinWait::Send(op));
    st.cancel(op, Error::Cancelled, t0);
    let mut fin = Header::new(Kind::Fin, ServiceLevel::Normal);
    fin.b = 7;
    fin.aux = FIN_CANCELLED;
    assert!(st.on_fin(a, &fin).is_ok());
    assert_eq!(st.ops.done().len(), 1);
    assert!(matches!(st.ops.done()[0].result, Err(Error::Cancelled)), "{:?}", st.ops.done()[0].result);
    st.timers(false, t0 + grace * 2);
    assert_eq!(st.ops.done().len(), 1, "exactly once");
    assert!(st.peers.get(a).is_some_and(|p| p.lost.is_none()), "the peer stays");
}

//! A reply to one of our requests, without the device (sans-IO): which request it answers (the
//! rule the TCP session applies too, [`requests::incoming_reply`]), whether the bytes it says
//! the server pushed fit the request's buffer, where its header is, and how the request then
//! completes — cancelled, failed with the server's status, or with the bytes it moved, copied
//! out of the staging buffer the server wrote into.
//!
//! What needs the device comes back as a [`ReplyStep`]: fetching a header the server left in
//! its memory (then a FIN lets the server release it).

use std::collections::HashSet;

use bytes::Bytes;

use crate::buffers::buf::OpBuf;
use crate::core::loss::Loss;
use crate::core::peers::Peers;
use crate::core::requests;
use crate::error::Error;
use crate::info::Counters;
use crate::op::status;
use crate::types::{OpId, PeerId};
use crate::wire::Header;

use super::inbound::{self, HeaderIn, unexpected};
use super::msg::Segment;
use super::{OpSt, Ops};

/// What a reply leads to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReplyStep {
    /// It answers a request cancelled and forgotten here: nothing to do.
    Forget,
    /// Complete request `op` with the header (see [`complete`]).
    Complete { op: OpId, header: Bytes },
    /// The header lies in the server's memory: read `len` bytes from `segs`, then complete
    /// (and tell the server with a FIN that it may let go of the header).
    Fetch { op: OpId, segs: Vec<Segment>, len: usize },
}

/// A REPLY from `peer`: `h.b` the request, `h.a` the end of the furthest byte the server
/// pushed into the request's IN buffer (the client cannot see RDMA writes), with
/// `FLAG_RDV_HEADER` a body that is the header's segment list (at most `max_header` bytes).
/// `cancelled` is the peer's set of requests cancelled and forgotten here.
pub(crate) fn arrived(
    ops: &mut Ops,
    cancelled: &mut HashSet<u64>,
    peer: PeerId,
    h: &Header,
    body: Vec<u8>,
    max_header: u64,
) -> Result<ReplyStep, Loss> {
    let Some(o) = requests::incoming_reply(ops, cancelled, peer, h.b).map_err(Loss::Protocol)? else {
        return Ok(ReplyStep::Forget);
    };
    let room = match &o.buf {
        OpBuf::Recv(b) => b.capacity() as u64,
        _ => 0,
    };
    if h.a > room {
        return Err(unexpected("REPLY claims pushes beyond the request's buffer".into()));
    }
    let op = OpId(h.b);
    Ok(match inbound::reply_header(h, body, max_header)? {
        HeaderIn::Here(header) => ReplyStep::Complete { op, header },
        HeaderIn::Remote { segs, len } => ReplyStep::Fetch { op, segs, len },
    })
}

/// A reply with status `st` and `header` in hand: request `op` completes. A request cancelled
/// here completes cancelled (the server is done with its memory) and its peer forgets its id.
/// A read counts the bytes up to the
/// end of the furthest one pushed (`pushed`, as the server reports it, or as its PUSH messages
/// showed), so `Completion::data` is exactly what the server wrote; staged through a pool
/// buffer, those bytes are copied into the caller's buffer.
pub(crate) fn complete<C: Copy + PartialEq, D>(
    ops: &mut Ops,
    peers: &mut Peers<C, D>,
    counters: &Counters,
    op: OpId,
    st: u32,
    header: Bytes,
    pushed: u64,
) {
    Counters::add(&counters.msgs_received, 1);
    let Some(o) = ops.get_mut(&op) else { return };
    if matches!(o.st, OpSt::Cancelling { .. }) {
        o.st = OpSt::Finishing;
        if let Some(p) = peers.get_mut(o.peer) {
            p.cancelled_reqs.remove(&op.0);
        }
        ops.complete(op, Err(Error::Cancelled));
        return;
    }
    let moved = requests::reply_moved(o, pushed);
    let mut copied = 0;
    if st == status::OK
        && let (OpBuf::Recv(user), Some(staged)) = (&mut o.buf, o.x.stage_in.as_ref())
    {
        copied = moved.min(staged.len());
        user.copy_in(0, &staged[..copied]);
    }
    let r = requests::reply_result(o, st, header, moved);
    counters.copied(copied);
    ops.complete(op, r);
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;

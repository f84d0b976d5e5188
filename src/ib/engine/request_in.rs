//! A request arriving at the server, without the device (sans-IO): whether its client's budget
//! admits it now, how its body is laid out (by [`inbound::request`]), and whether it is
//! delivered at once or once its header is fetched from the client's memory; then opening it in
//! the server's table ([`Requests::arrived`], the rule the TCP session applies too).
//!
//! The engine reads the body out of the receive buffer or ring slot only when the budget
//! admits the request (a held request stays where it lies), starts the header's RDMA READ when
//! told to, and hands the delivered [`RequestMeta`] to the application.

use bytes::Bytes;

use crate::comm::Mechanism;
use crate::core::loss::Loss;
use crate::core::peers::Budget;
use crate::core::requests::{Req, Requests};
use crate::info::Counters;
use crate::op::{Direction, RequestMeta};
use crate::types::{PeerId, ServiceLevel, Tag};
use crate::wire::Header;

use super::inbound::{self, HeaderIn};
use super::msg::Segment;
use super::sreq::IbReq;

/// A request decoded, not yet open: delivered once its header is in hand.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PendingRequest {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub id: u64,
    pub cid: u32,
    pub dir: Direction,
    pub len: u64,
    pub inline: Option<Bytes>,
    /// How the inline data came (inline or fast RDMA).
    pub inline_mech: Mechanism,
    pub segs: Vec<Segment>,
    pub cost: usize,
}

/// What the server accepts of one client's requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Open requests a client may have.
    pub requests: usize,
    /// Bytes a client may make us hold (early arrivals, unexpected messages, open requests).
    pub early: usize,
    /// The largest request header.
    pub max_header: u64,
    /// The largest payload.
    pub max_message: u64,
}

/// What an arrived request leads to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RequestStep {
    /// The client's budget is spent: the message stays in its buffer until the application
    /// answers one of its requests.
    Hold,
    /// Open and deliver it now (see [`deliver`]).
    Deliver { pending: PendingRequest, header: Bytes },
    /// Its header lies in the client's memory: read `len` bytes from `segs`, then deliver.
    Fetch { pending: Box<PendingRequest>, segs: Vec<Segment>, len: usize },
}

/// A request message `h` from `peer` on connection `cid` (`via`: how it came). Its body (the
/// message's payload, `h.len` bytes) is read by `body` only once the budget admits it; the
/// bytes it costs the budget stay charged until the reply. A malformed body costs the peer.
pub(crate) fn arrived(
    budget: &mut Budget,
    limits: Limits,
    counters: &Counters,
    (peer, cid): (PeerId, u32),
    h: &Header,
    via: Mechanism,
    body: impl FnOnce() -> Bytes,
) -> Result<RequestStep, Loss> {
    let cost = h.len as usize;
    if !budget.admit_request(cost, limits.requests, limits.early) {
        return Ok(RequestStep::Hold);
    }
    Counters::add(&counters.msgs_received, 1);
    let inbound::RequestBody { dir, header, inline, segs } =
        inbound::request(h, body(), limits.max_header, limits.max_message)?;
    if let Some(d) = &inline {
        counters.copied(d.len());
    }
    let pending = PendingRequest {
        peer,
        tag: h.a,
        sl: h.sl,
        id: h.b,
        cid,
        dir,
        len: h.c,
        inline,
        inline_mech: via,
        segs,
        cost,
    };
    Ok(match header {
        HeaderIn::Here(header) => RequestStep::Deliver { pending, header },
        HeaderIn::Remote { segs, len } => RequestStep::Fetch { pending: Box::new(pending), segs, len },
    })
}

/// Opens a request whose header is in hand: what the application is handed, or the loss of a
/// client that reused an id still open.
pub(crate) fn deliver(
    sreqs: &mut Requests<IbReq>,
    p: PendingRequest,
    header: Bytes,
) -> Result<RequestMeta, Loss> {
    let mut r = Req::new(p.sl, p.dir, p.len, p.cost);
    r.inline = p.inline;
    r.inline_mech = p.inline_mech;
    r.x = IbReq::new(p.cid, p.segs);
    sreqs.arrived(p.peer, p.tag, p.id, header, r).map_err(Loss::Protocol)
}

#[cfg(test)]
#[path = "request_in_tests.rs"]
mod tests;

//! The engine's part of an open request on the server: where its pulls, pushes and reply go,
//! and when the reply may go. Pulls and pushes are RDMA the server starts; the reply is a
//! message on the same connection that would overtake them, so it waits until they are done.

use bytes::Bytes;

use crate::types::OpId;

use super::msg;

/// A reply ready to go: its op, header and status.
pub(crate) type Reply = (OpId, Bytes, u32);

/// The engine's part of an open request (server side).
#[derive(Default)]
pub(crate) struct IbReq {
    /// The connection it came on: its pulls, pushes and reply go there.
    pub conn: u32,
    /// The client's registered payload, for the server's RDMA.
    pub segs: Vec<msg::Segment>,
    /// Pulls and pushes not finished: the reply waits for them.
    xfers: u32,
    /// A reply posted while transfers were still running.
    deferred_reply: Option<Reply>,
    /// End of the furthest byte pushed so far (by pushes that finished, or went out as
    /// messages): the reply tells the client, whose RDMA-written buffer cannot tell it.
    pushed: u64,
}

impl IbReq {
    pub fn new(conn: u32, segs: Vec<msg::Segment>) -> IbReq {
        IbReq { conn, segs, ..IbReq::default() }
    }

    /// A pull or push of the request starts moving bytes.
    pub fn xfer_started(&mut self) {
        self.xfers += 1;
    }

    /// Pushed bytes up to `end` reached the client (a push finished, or went out as a message
    /// ahead of the reply).
    pub fn pushed_to(&mut self, end: u64) {
        self.pushed = self.pushed.max(end);
    }

    /// Where the furthest pushed byte ends.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// The reply, to send now; or None while pulls or pushes still move: it waits for them,
    /// since the client may hold a registered buffer for them until it comes.
    pub fn reply(&mut self, reply: Reply) -> Option<Reply> {
        if self.xfers > 0 {
            self.deferred_reply = Some(reply);
            return None;
        }
        Some(reply)
    }

    /// A pull or push finished: the reply that waited for it, if it was the last.
    pub fn xfer_finished(&mut self) -> Option<Reply> {
        self.xfers = self.xfers.saturating_sub(1);
        if self.xfers == 0 { self.deferred_reply.take() } else { None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(op: u64) -> Reply {
        (OpId(op), Bytes::from_static(b"hdr"), 0)
    }

    #[test]
    fn a_reply_goes_at_once_without_transfers() {
        let mut r = IbReq::new(1, Vec::new());
        assert_eq!(r.reply(reply(5)).map(|r| r.0), Some(OpId(5)));
        assert!(r.xfer_finished().is_none(), "nothing deferred");
    }

    #[test]
    fn a_reply_waits_for_a_transfer_under_way() {
        let mut r = IbReq::new(1, Vec::new());
        r.xfer_started();
        assert!(r.reply(reply(5)).is_none(), "a pull or push moves");
        assert_eq!(r.xfer_finished().map(|r| r.0), Some(OpId(5)));
    }

    #[test]
    fn a_reply_waits_for_the_last_transfer() {
        let mut r = IbReq::new(1, Vec::new());
        r.xfer_started();
        r.xfer_started();
        assert!(r.reply(reply(5)).is_none(), "two transfers move");
        assert!(r.xfer_finished().is_none(), "one still moves");
        assert_eq!(r.xfer_finished().map(|r| r.0), Some(OpId(5)));
        assert!(r.xfer_finished().is_none(), "released once");
        // Later transfers (none expected after a reply) defer nothing.
        r.xfer_started();
        assert!(r.xfer_finished().is_none());
    }

    #[test]
    fn the_furthest_pushed_byte_is_kept() {
        let mut r = IbReq::default();
        r.pushed_to(300);
        r.pushed_to(100);
        assert_eq!(r.pushed(), 300);
    }
}

//! What an arrived message's body says, decoded and checked without the device (sans-IO).
//!
//! The receive path (`recv.rs`) decides what a message leads to from the engine's tables —
//! which receive it matches, whether the peer's budget admits it, which request a reply closes.
//! The rules about the bytes themselves are here, once: how large a rendezvous or a request may
//! be, how a request's body is laid out (header or its segment list, inline data, segment
//! list, nothing after), what a reply's header list may announce, and what a FIN's status means
//! for the send it completes. Each function takes the header and the body the engine read out
//! of the receive buffer or ring slot and returns the parts, or the [`Loss`] the peer's
//! violation costs; none reads memory, tables or clocks, so each is tested alone and fuzzed.

use bytes::Bytes;

use crate::core::loss::Loss;
use crate::core::requests::direction;
use crate::error::{Error, ProtocolError};
use crate::op::Direction;
use crate::wire::{FLAG_INLINE_DATA, FLAG_RDV_HEADER, FLAG_SEGMENTS, Header};

use super::link::LinkError;
use super::msg::{self, MSG_HDR, Prefix, Segment};
use super::{FIN_OK, FIN_TRUNCATED};

/// A message's framing, from its first [`MSG_HDR`] bytes `hb`, checked against the `len` bytes
/// that arrived: its header must announce exactly the rest, or the peer broke the framing.
pub(crate) fn framing(hb: &[u8], len: usize) -> Result<(Prefix, Header), Loss> {
    match msg::decode_framing(hb) {
        Ok((prefix, h)) if MSG_HDR + h.len as usize == len => Ok((prefix, h)),
        Ok((_, h)) => Err(unexpected(format!("{:?} announces {} bytes, {len} arrived", h.kind, h.len))),
        Err(e) => Err(unexpected(e.to_string())),
    }
}

/// What a flow-control or framing violation of the peer costs: the peer.
pub(crate) fn link_loss(e: LinkError) -> Loss {
    match e {
        LinkError::Flow(f) => Loss::Protocol(ProtocolError::FlowControl(f.to_string())),
        LinkError::NoImm => unexpected("ring write without immediate data".into()),
        LinkError::BadLength(len) => unexpected(format!("message of {len} bytes")),
        LinkError::NotConnected => unexpected("message before the connection's limits".into()),
    }
}

/// The peer broke the protocol in a way `what` names.
pub(crate) fn unexpected(what: String) -> Loss {
    Loss::Protocol(ProtocolError::Unexpected { what })
}

fn bad_list(e: msg::MsgError) -> Loss {
    unexpected(e.to_string())
}

/// A rendezvous announcement (RTS, `Kind::Rdv`): the sender's segment list for message `h.b`
/// of `h.c` bytes. Larger than `max_message` is refused before anything is allocated for it.
pub(crate) fn rts(h: &Header, body: &[u8], max_message: u64) -> Result<Vec<Segment>, Loss> {
    if h.c > max_message {
        return Err(unexpected(format!("rendezvous of {} bytes", h.c)));
    }
    let (segs, rest) = msg::decode_segments(body, h.c).map_err(bad_list)?;
    if !rest.is_empty() {
        return Err(unexpected("trailing bytes after a segment list".into()));
    }
    Ok(segs)
}

/// Where a request's (or a reply's) header is.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderIn {
    /// In the message itself.
    Here(Bytes),
    /// In the peer's memory, `len` bytes to fetch by RDMA READ before delivery.
    Remote { segs: Vec<Segment>, len: usize },
}

/// A request's body, decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RequestBody {
    pub dir: Direction,
    pub header: HeaderIn,
    /// OUT payload sent along (sliced out of the body, no copy).
    pub inline: Option<Bytes>,
    /// OUT payload the server reads, or IN buffer it writes, by RDMA.
    pub segs: Vec<Segment>,
}

/// A request (`Kind::Request`): `h.aux` header bytes, `h.c` payload bytes in direction
/// `h.flags`; the body holds the header (or, with `FLAG_RDV_HEADER`, its segment list), then the
/// inline OUT data (`FLAG_INLINE_DATA`), then the payload's segment list (`FLAG_SEGMENTS`), and
/// nothing after. Inline parts are slices of `body`, the one copy out of the receive buffer.
pub(crate) fn request(
    h: &Header,
    body: Bytes,
    max_header: u64,
    max_message: u64,
) -> Result<RequestBody, Loss> {
    if u64::from(h.aux) > max_header || h.c > max_message {
        return Err(Loss::Protocol(ProtocolError::FlowControl("request larger than our limits".into())));
    }
    let dir = direction(h.flags, h.c).map_err(Loss::Protocol)?;
    let mut rest = &body[..];
    let at = |rest: &[u8]| body.len() - rest.len();
    let header = if h.flags & FLAG_RDV_HEADER != 0 {
        let (segs, r) = msg::decode_segments(rest, u64::from(h.aux)).map_err(bad_list)?;
        rest = r;
        HeaderIn::Remote { segs, len: h.aux as usize }
    } else {
        let n = h.aux as usize;
        if rest.len() < n {
            return Err(unexpected("request header truncated".into()));
        }
        let start = at(rest);
        rest = &rest[n..];
        HeaderIn::Here(body.slice(start..start + n))
    };
    let inline = if h.flags & FLAG_INLINE_DATA != 0 {
        if dir != Direction::Out {
            return Err(unexpected("inline data on a request without OUT payload".into()));
        }
        let n = h.c as usize;
        if rest.len() < n {
            return Err(unexpected("inline request data truncated".into()));
        }
        let start = at(rest);
        rest = &rest[n..];
        Some(body.slice(start..start + n))
    } else {
        None
    };
    let segs = if h.flags & FLAG_SEGMENTS != 0 {
        let (s, r) = msg::decode_segments(rest, h.c).map_err(bad_list)?;
        rest = r;
        s
    } else {
        Vec::new()
    };
    if !rest.is_empty() {
        return Err(unexpected("trailing bytes in a request".into()));
    }
    if dir == Direction::Out && inline.is_none() && segs.is_empty() && h.c > 0 {
        return Err(unexpected("OUT payload with neither data nor segments".into()));
    }
    Ok(RequestBody { dir, header, inline, segs })
}

/// A reply's header (`Kind::Reply`), once the reply is known to close one of our requests: in
/// the body, or (`FLAG_RDV_HEADER`) a segment list of at most `max_header` bytes in the server's
/// memory and nothing after it.
pub(crate) fn reply_header(h: &Header, body: Vec<u8>, max_header: u64) -> Result<HeaderIn, Loss> {
    if h.flags & FLAG_RDV_HEADER == 0 {
        return Ok(HeaderIn::Here(Bytes::from(body)));
    }
    let (segs, n, rest) = msg::decode_segments_within(&body, max_header).map_err(bad_list)?;
    if !rest.is_empty() {
        return Err(unexpected("trailing bytes after a reply's segment list".into()));
    }
    Ok(HeaderIn::Remote { segs, len: n as usize })
}

/// What a FIN with `status` (and, when truncated, the receiver's `capacity`) means for the
/// rendezvous send of `sent` bytes it completes.
pub(crate) fn fin_result(status: u32, sent: usize, capacity: u64) -> Result<usize, Error> {
    match status {
        FIN_OK => Ok(sent),
        FIN_TRUNCATED => Err(Error::Truncated { len: sent as u64, capacity }),
        _ => Err(Error::PeerCancelled),
    }
}

/// Every body decoder here, for the fuzz target.
pub(crate) fn fuzz(h: &Header, body: &[u8]) {
    let _ = rts(h, body, u64::MAX);
    let _ = request(h, Bytes::copy_from_slice(body), u64::from(u32::MAX), u64::MAX);
    let _ = reply_header(h, body.to_vec(), u64::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ServiceLevel;
    use crate::wire::{FLAG_PAYLOAD_IN, FLAG_PAYLOAD_OUT, Kind};

    fn hdr(kind: Kind, flags: u8, aux: u32, c: u64) -> Header {
        let mut h = Header::new(kind, ServiceLevel::Bulk);
        h.flags = flags;
        h.aux = aux;
        h.c = c;
        h
    }

    fn list(segs: &[Segment]) -> Vec<u8> {
        let mut v = Vec::new();
        msg::encode_segments(&mut v, segs);
        v
    }

    const SEG: Segment = Segment { addr: 0x1000, len: 100, rkey: 7 };

    fn what(r: Result<impl std::fmt::Debug, Loss>) -> String {
        match r {
            Err(Loss::Protocol(e)) => e.to_string(),
            other => panic!("expected a protocol loss, got {other:?}"),
        }
    }

    #[test]
    fn a_message_announces_exactly_what_arrived() {
        let mut hb = [0u8; MSG_HDR];
        let mut h = hdr(Kind::Eager, 0, 0, 0);
        h.len = 10;
        msg::encode_into(&mut hb, Prefix { credits: 2, ring_returns: 1 }, &h);
        let (p, got) = framing(&hb, MSG_HDR + 10).unwrap();
        assert_eq!((p.credits, p.ring_returns, got.len), (2, 1, 10));
        for len in [MSG_HDR + 9, MSG_HDR + 11, MSG_HDR] {
            assert!(what(framing(&hb, len)).contains(&format!("announces 10 bytes, {len} arrived")));
        }
        hb[5] = 1;
        assert!(framing(&hb, MSG_HDR + 10).is_err(), "reserved bytes set");
        assert!(framing(&hb[..MSG_HDR - 1], MSG_HDR + 10).is_err(), "a cut header");
    }

    #[test]
    fn a_link_violation_costs_the_peer_as_a_protocol_error() {
        let flow = link_loss(LinkError::Flow(crate::flowctl::FlowError::NoCredit));
        assert!(matches!(flow, Loss::Protocol(ProtocolError::FlowControl(_))));
        for e in [LinkError::NoImm, LinkError::BadLength(3), LinkError::NotConnected] {
            assert!(matches!(link_loss(e), Loss::Protocol(ProtocolError::Unexpected { .. })));
        }
    }

    #[test]
    fn a_rendezvous_is_bounded_and_its_list_must_match_its_length() {
        let body = list(&[SEG]);
        assert_eq!(rts(&hdr(Kind::Rdv, 0, 0, 100), &body, 100).unwrap(), vec![SEG]);
        assert!(what(rts(&hdr(Kind::Rdv, 0, 0, 100), &body, 99)).contains("rendezvous of 100 bytes"));
        assert!(what(rts(&hdr(Kind::Rdv, 0, 0, 101), &body, 1000)).contains("segment"));
        let mut tail = body.clone();
        tail.push(0);
        assert!(what(rts(&hdr(Kind::Rdv, 0, 0, 100), &tail, 1000)).contains("trailing"));
    }

    #[test]
    fn a_request_body_is_header_inline_data_then_segments_and_nothing_else() {
        let out = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        let r = request(&hdr(Kind::Request, out, 3, 2), Bytes::from_static(b"hdrab"), 64, 1 << 20).unwrap();
        assert_eq!(r.dir, Direction::Out);
        assert_eq!(r.header, HeaderIn::Here(Bytes::from_static(b"hdr")));
        assert_eq!(r.inline, Some(Bytes::from_static(b"ab")));
        assert!(r.segs.is_empty());

        // Header in the client's memory, IN payload into its segments.
        let mut body = list(&[Segment { len: 3, ..SEG }]);
        body.extend(list(&[SEG]));
        let h = hdr(Kind::Request, FLAG_PAYLOAD_IN | FLAG_RDV_HEADER | FLAG_SEGMENTS, 3, 100);
        let r = request(&h, Bytes::from(body), 64, 1 << 20).unwrap();
        assert_eq!((r.dir, r.inline), (Direction::In, None));
        assert_eq!(r.header, HeaderIn::Remote { segs: vec![Segment { len: 3, ..SEG }], len: 3 });
        assert_eq!(r.segs, vec![SEG]);

        // No payload, no flags.
        let r = request(&hdr(Kind::Request, 0, 0, 0), Bytes::new(), 64, 1 << 20).unwrap();
        assert_eq!((r.dir, r.header), (Direction::None, HeaderIn::Here(Bytes::new())));
    }

    #[test]
    fn a_malformed_request_costs_the_peer() {
        let out = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        let req = |flags, aux, c, body: &'static [u8]| {
            request(&hdr(Kind::Request, flags, aux, c), Bytes::from_static(body), 8, 16)
        };
        assert!(what(req(out, 9, 0, b"")).contains("larger than our limits"), "header over the limit");
        assert!(what(req(out, 0, 17, b"")).contains("larger than our limits"), "payload over the limit");
        assert!(what(req(FLAG_PAYLOAD_OUT | FLAG_PAYLOAD_IN, 0, 1, b"")).contains("direction"));
        assert!(what(req(out, 4, 0, b"hdr")).contains("header truncated"));
        assert!(what(req(FLAG_PAYLOAD_IN | FLAG_INLINE_DATA, 0, 2, b"ab")).contains("without OUT"));
        assert!(what(req(out, 0, 3, b"ab")).contains("inline request data truncated"));
        assert!(what(req(out, 0, 2, b"abc")).contains("trailing"));
        assert!(what(req(FLAG_PAYLOAD_OUT, 0, 2, b"")).contains("neither data nor segments"));
        assert!(
            what(req(FLAG_PAYLOAD_OUT | FLAG_SEGMENTS, 0, 2, b"\x01")).contains("truncated"),
            "a cut list"
        );
    }

    #[test]
    fn a_reply_header_list_is_bounded_and_alone() {
        let h = hdr(Kind::Reply, FLAG_RDV_HEADER, 0, 0);
        let body = list(&[SEG]);
        assert_eq!(
            reply_header(&h, body.clone(), 100).unwrap(),
            HeaderIn::Remote { segs: vec![SEG], len: 100 }
        );
        assert!(reply_header(&h, body.clone(), 99).is_err(), "beyond the largest header");
        let mut tail = body;
        tail.push(1);
        assert!(what(reply_header(&h, tail, 100)).contains("trailing"));
        let plain = hdr(Kind::Reply, 0, 0, 0);
        assert_eq!(
            reply_header(&plain, b"hi".to_vec(), 0).unwrap(),
            HeaderIn::Here(Bytes::from_static(b"hi"))
        );
    }

    #[test]
    fn a_fin_status_decides_the_send_result() {
        assert_eq!(fin_result(FIN_OK, 10, 0).unwrap(), 10);
        assert!(matches!(fin_result(FIN_TRUNCATED, 10, 4), Err(Error::Truncated { len: 10, capacity: 4 })));
        assert!(matches!(fin_result(super::super::FIN_CANCELLED, 10, 0), Err(Error::PeerCancelled)));
        assert!(matches!(fin_result(77, 10, 0), Err(Error::PeerCancelled)), "unknown: not delivered");
    }

    proptest::proptest! {
        #[test]
        fn body_decoders_are_total(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            flags in proptest::prelude::any::<u8>(),
            aux in 0u32..300,
            c in 0u64..10_000,
        ) {
            fuzz(&hdr(Kind::Request, flags, aux, c), &bytes);
        }
    }
}

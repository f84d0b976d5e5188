//! Message formats of the InfiniBand engine (sans-IO).
//!
//! Every two-sided message — a SEND into a pre-posted receive buffer, or an
//! RDMA_WRITE_WITH_IMM into a fast-RDMA ring slot — is an 8-byte *prefix* carrying flow-control
//! returns, then the shared 40-byte [`Header`](crate::wire::Header), then the payload:
//!
//! ```text
//!  0 u16 credits returned (receive buffers re-posted)
//!  2 u16 ring slots returned
//!  4 u32 reserved, 0
//!  8 .. 48  wire header
//! 48 ..     payload (header.len bytes)
//! ```
//!
//! Large payloads never travel in messages: the owner registers the memory and sends a
//! *segment list* (address, length, rkey per piece) that the peer reads or writes with RDMA.
//! Decoding is total: any bytes give a value or a typed error.

use crate::wire::{HEADER_LEN, Header, WireError};

/// Bytes before the payload.
pub const MSG_HDR: usize = 8 + HEADER_LEN;
/// Bytes per segment in a segment list.
pub const SEG_LEN: usize = 16;
/// Most segments one list may carry (a list rides in one message).
pub const MAX_SEGMENTS: usize = 256;

/// Flow-control returns carried by every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prefix {
    /// Receive buffers re-posted since the last report.
    pub credits: u16,
    /// Ring slots released since the last report.
    pub ring_returns: u16,
}

/// Why a message failed to decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// Shorter than its framing says.
    #[error("message truncated: {have} of {need} bytes")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Reserved prefix bits set.
    #[error("reserved prefix bits set")]
    Reserved,
    /// The wire header is bad.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A segment list is malformed (count, overflow, zero length, total mismatch).
    #[error("bad segment list: {0}")]
    Segments(&'static str),
}

/// Writes prefix + header into the first `MSG_HDR` bytes of `out`.
pub fn encode_into(out: &mut [u8], p: Prefix, h: &Header) {
    out[0..2].copy_from_slice(&p.credits.to_le_bytes());
    out[2..4].copy_from_slice(&p.ring_returns.to_le_bytes());
    out[4..8].fill(0);
    out[8..MSG_HDR].copy_from_slice(&h.encode());
}

/// Decodes the prefix and header at the front of a message (its payload stays where it is).
pub fn decode_framing(bytes: &[u8]) -> Result<(Prefix, Header), MsgError> {
    if bytes.len() < MSG_HDR {
        return Err(MsgError::Truncated { need: MSG_HDR, have: bytes.len() });
    }
    if bytes[4..8] != [0; 4] {
        return Err(MsgError::Reserved);
    }
    let p = Prefix {
        credits: u16::from_le_bytes([bytes[0], bytes[1]]),
        ring_returns: u16::from_le_bytes([bytes[2], bytes[3]]),
    };
    Ok((p, Header::decode(&bytes[8..MSG_HDR])?))
}

/// Decodes a whole message: prefix, header, and exactly `header.len` payload bytes.
pub fn decode(bytes: &[u8]) -> Result<(Prefix, Header, &[u8]), MsgError> {
    let (p, h) = decode_framing(bytes)?;
    let need = MSG_HDR + h.len as usize;
    let payload = bytes.get(MSG_HDR..need).ok_or(MsgError::Truncated { need, have: bytes.len() })?;
    Ok((p, h, payload))
}

/// One registered piece of a peer's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Address in the owner's address space.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// Remote key.
    pub rkey: u32,
}

/// Appends a segment list (`u32` count, then the segments).
pub fn encode_segments(out: &mut Vec<u8>, segs: &[Segment]) {
    out.reserve(segments_len(segs.len()));
    out.extend_from_slice(&(segs.len() as u32).to_le_bytes());
    for s in segs {
        out.extend_from_slice(&s.addr.to_le_bytes());
        out.extend_from_slice(&s.len.to_le_bytes());
        out.extend_from_slice(&s.rkey.to_le_bytes());
    }
}

/// Encoded size of a list of `n` segments.
pub fn segments_len(n: usize) -> usize {
    4 + n * SEG_LEN
}

/// Decodes a segment list from the front of `bytes`; returns it and the rest. The segments'
/// total must equal `total` (a peer cannot make us read or write beyond what it announced).
pub fn decode_segments(bytes: &[u8], total: u64) -> Result<(Vec<Segment>, &[u8]), MsgError> {
    let (segs, sum, rest) = decode_list(bytes)?;
    if sum != total {
        return Err(MsgError::Segments("segments do not add up to the announced length"));
    }
    Ok((segs, rest))
}

/// Decodes a segment list whose total nothing else announces (a reply header's): its total is
/// the length, and must not exceed `max`. Returns the list, its total and the rest.
pub fn decode_segments_within(bytes: &[u8], max: u64) -> Result<(Vec<Segment>, u64, &[u8]), MsgError> {
    let (segs, sum, rest) = decode_list(bytes)?;
    if sum > max {
        return Err(MsgError::Segments("segments exceed the length limit"));
    }
    Ok((segs, sum, rest))
}

/// A segment list, its total and the rest of `bytes`.
fn decode_list(bytes: &[u8]) -> Result<(Vec<Segment>, u64, &[u8]), MsgError> {
    let n = bytes.get(..4).ok_or(MsgError::Truncated { need: 4, have: bytes.len() })?;
    let n = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
    if n == 0 || n > MAX_SEGMENTS {
        return Err(MsgError::Segments("count out of range"));
    }
    let need = segments_len(n);
    let body = bytes.get(4..need).ok_or(MsgError::Truncated { need, have: bytes.len() })?;
    let mut segs = Vec::with_capacity(n);
    let mut sum: u64 = 0;
    for c in body.chunks_exact(SEG_LEN) {
        let addr = u64::from_le_bytes(c[0..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(c[8..12].try_into().expect("4 bytes"));
        let rkey = u32::from_le_bytes(c[12..16].try_into().expect("4 bytes"));
        if len == 0 {
            return Err(MsgError::Segments("zero-length segment"));
        }
        addr.checked_add(u64::from(len)).ok_or(MsgError::Segments("segment wraps"))?;
        sum = sum.checked_add(u64::from(len)).ok_or(MsgError::Segments("total overflows"))?;
        segs.push(Segment { addr, len, rkey });
    }
    Ok((segs, sum, &bytes[need..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ServiceLevel;
    use crate::wire::Kind;

    #[test]
    fn message_round_trips() {
        let mut h = Header::new(Kind::Eager, ServiceLevel::Bulk);
        h.a = 42;
        h.len = 3;
        let mut buf = vec![0u8; MSG_HDR + 3];
        encode_into(&mut buf, Prefix { credits: 5, ring_returns: 2 }, &h);
        buf[MSG_HDR..].copy_from_slice(b"abc");
        let (p, h2, payload) = decode(&buf).unwrap();
        assert_eq!(p, Prefix { credits: 5, ring_returns: 2 });
        assert_eq!(h2, h);
        assert_eq!(payload, b"abc");
        assert!(matches!(decode(&buf[..MSG_HDR + 2]), Err(MsgError::Truncated { .. })));
        buf[5] = 1;
        assert_eq!(decode(&buf), Err(MsgError::Reserved));
    }

    #[test]
    fn segment_lists_are_validated() {
        let segs = [Segment { addr: 0x1000, len: 100, rkey: 7 }, Segment { addr: 0x9000, len: 50, rkey: 8 }];
        let mut v = Vec::new();
        encode_segments(&mut v, &segs);
        v.extend_from_slice(b"tail");
        let (got, rest) = decode_segments(&v, 150).unwrap();
        assert_eq!(got, segs);
        assert_eq!(rest, b"tail");
        assert!(decode_segments(&v, 151).is_err(), "total must match");
        let (got, total, rest) = decode_segments_within(&v, 150).unwrap();
        assert_eq!((got.len(), total, rest), (2, 150, &b"tail"[..]));
        assert!(decode_segments_within(&v, 149).is_err(), "total within the limit");
        assert!(decode_segments(&v[..20], 150).is_err());
        assert!(decode_segments(&[0, 0, 0, 0], 0).is_err(), "empty list");
        let mut bad = Vec::new();
        encode_segments(&mut bad, &[Segment { addr: u64::MAX, len: 2, rkey: 0 }]);
        assert!(decode_segments(&bad, 2).is_err(), "wrap");
        let mut huge = Vec::new();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_segments(&huge, 1).is_err(), "count bound before allocating");
    }

    proptest::proptest! {
        #[test]
        fn decoders_are_total(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300), total in 0u64..10_000) {
            let _ = decode(&bytes);
            let _ = decode_segments(&bytes, total);
            let _ = decode_segments_within(&bytes, total);
        }
    }
}

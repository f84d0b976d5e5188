//! Frame headers shared by the backends.
//!
//! Every frame is a fixed 40-byte little-endian header, optionally followed by `len` payload
//! bytes:
//!
//! ```text
//!  0  u16 magic 0x4E49 ("IN")     16  u64 a   (tag, op id, endpoint id, ...)
//!  2  u8  version (1)             24  u64 b   (message / request id, memory key, ...)
//!  3  u8  kind                    32  u64 c   (total length, offset, address, ...)
//!  4  u8  service level
//!  5  u8  flags
//!  6  u16 reserved, must be 0
//!  8  u32 len  (payload bytes that follow)
//! 12  u32 aux  (kind-specific: header length, status, requested length)
//! ```
//!
//! Decoding is total: any 40 bytes give a [`Header`] or a [`WireError`], and a header's `len` is
//! checked against the receiver's [`Limits`] *before* anything is allocated for the payload.

use crate::types::ServiceLevel;

/// Size of every frame header.
pub const HEADER_LEN: usize = 40;
/// "IN" little-endian.
pub const MAGIC: u16 = 0x4E49;
/// Protocol version spoken by this crate.
pub const VERSION: u8 = 1;

/// Flag: last DATA frame of a rendezvous body.
pub const FLAG_LAST: u8 = 1;
/// Flag: the sender aborted this transfer (DATA) or could not serve it (PULL_DATA).
pub const FLAG_ABORT: u8 = 2;
/// Flag (REQUEST): the request carries a payload the server will pull.
pub const FLAG_PAYLOAD_OUT: u8 = 4;
/// Flag (REQUEST): the request expects the server to push data into the client's buffer.
pub const FLAG_PAYLOAD_IN: u8 = 8;
/// Flag (REQUEST): the whole OUT payload follows the request header inline.
pub const FLAG_INLINE_DATA: u8 = 16;
/// Flag (InfiniBand REQUEST): a segment list describing the client's registered payload
/// follows (the server reads or writes it with RDMA).
pub const FLAG_SEGMENTS: u8 = 32;
/// Flag (InfiniBand REQUEST / REPLY / EAGER): the header is not inline; a segment list the
/// receiver reads it from follows instead (headers too large for a message slot).
pub const FLAG_RDV_HEADER: u8 = 64;
/// Flag (TCP REQUEST): the OUT payload follows the request on its connection, in STREAM
/// frames, instead of waiting for the server's PULLs.
pub const FLAG_STREAMED: u8 = 128;
const IB_ONLY_FLAGS: u8 = FLAG_SEGMENTS | FLAG_RDV_HEADER;

/// Frame kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Expected message, sent whole. a = tag.
    Eager = 1,
    /// Unexpected message (no receive will be posted for it). a = tag.
    Unexpected = 2,
    /// Rendezvous announcement. a = tag, b = message id, c = total length.
    Rts = 3,
    /// Receiver is ready for a rendezvous body. b = message id.
    Cts = 4,
    /// Rendezvous body chunk. b = message id, c = offset.
    Data = 5,
    /// Request. a = tag, b = request id, c = payload length, aux = request-header length;
    /// payload = request header, then inline OUT data when `FLAG_INLINE_DATA`.
    Request = 6,
    /// Server asks for OUT payload bytes. a = pull id, b = request id, c = offset, aux = length.
    Pull = 7,
    /// Client answers a pull. a = pull id, b = request id; aux = status when `FLAG_ABORT`.
    PullData = 8,
    /// Server writes into the client's IN buffer. b = request id, c = offset.
    Push = 9,
    /// Server ends a request. b = request id, aux = status (0 = ok); payload = reply header.
    /// InfiniBand: a = end of the furthest byte pushed into the request's IN buffer (its
    /// client cannot see RDMA writes); with `FLAG_RDV_HEADER`, c = message id and the payload
    /// is the header's segment list.
    Reply = 10,
    /// Emulated RDMA write. a = op id, b = key, c = address.
    Put = 11,
    /// Target's answer to a put. a = op id, aux = status.
    PutAck = 12,
    /// Emulated RDMA read. a = op id, b = key, c = address, aux = length.
    Get = 13,
    /// Target's answer to a get. a = op id, aux = status; payload = the bytes.
    GetResp = 14,
    /// The client gave up a request; the server drops it. b = request id.
    CancelRequest = 15,
    /// Orderly close.
    Bye = 16,
    /// InfiniBand: an explicit credit return (credits travel in the message prefix).
    Credit = 17,
    /// InfiniBand: the receiver finished reading a rendezvous body or header with RDMA_READ;
    /// the sender may release it. b = message id.
    Fin = 18,
    /// InfiniBand: a pushed or rendezvous payload announcement carrying remote segments.
    /// a = tag / request id, b = message id, c = total length; payload = segment list.
    Rdv = 19,
    /// Handshake, client → server. a = endpoint id, aux = handshake flags; payload = nonce.
    Hello = 20,
    /// Handshake, server → client. a = endpoint id, aux = handshake flags;
    /// payload = nonce, then proof when authenticating.
    HelloAck = 21,
    /// Handshake, client → server: proof of the key.
    Auth = 22,
    /// Handshake result, server → client. aux = 0 accepted, else a reject code.
    Ready = 23,
    /// InfiniBand side channel: queue-pair and buffer information (after READY).
    IbInfo = 24,
    /// InfiniBand side channel: the client's queue pair is ready to receive.
    IbReady = 25,
    /// TCP: OUT payload bytes of a streamed request, in order, right behind it. b = request id,
    /// c = offset; with `FLAG_ABORT` (and no payload) the client stopped the stream at c.
    Stream = 26,
}

impl Kind {
    /// Decodes a kind byte.
    pub fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Eager,
            2 => Unexpected,
            3 => Rts,
            4 => Cts,
            5 => Data,
            6 => Request,
            7 => Pull,
            8 => PullData,
            9 => Push,
            10 => Reply,
            11 => Put,
            12 => PutAck,
            13 => Get,
            14 => GetResp,
            15 => CancelRequest,
            16 => Bye,
            17 => Credit,
            18 => Fin,
            19 => Rdv,
            20 => Hello,
            21 => HelloAck,
            22 => Auth,
            23 => Ready,
            24 => IbInfo,
            25 => IbReady,
            26 => Stream,
            _ => return None,
        })
    }

    /// True for the handshake kinds, which are only valid before a connection is ready.
    pub fn is_handshake(self) -> bool {
        matches!(self, Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::Ready | Kind::IbInfo | Kind::IbReady)
    }
}

/// Why a header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a header.
    #[error("truncated header: {0} of 40 bytes")]
    Truncated(usize),
    /// Not our protocol.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// A version we do not speak.
    #[error("unsupported protocol version {0} (we speak {VERSION})")]
    BadVersion(u8),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Service level out of range.
    #[error("invalid service level {0}")]
    BadServiceLevel(u8),
    /// Flags we do not know, or reserved bits set.
    #[error("invalid flags {flags:#04x} / reserved {reserved:#06x}")]
    BadFlags {
        /// The flags byte.
        flags: u8,
        /// The reserved field.
        reserved: u16,
    },
    /// The payload length exceeds what this kind may carry under our limits.
    #[error("{kind:?} frame carries {len} bytes, limit {max}")]
    TooLong {
        /// Frame kind.
        kind: Kind,
        /// Announced payload length.
        len: u64,
        /// Our limit for it.
        max: u64,
    },
    /// Fields inconsistent with each other (e.g. header length larger than the payload).
    #[error("inconsistent {0} frame")]
    Inconsistent(&'static str),
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Frame kind.
    pub kind: Kind,
    /// Service level of the message.
    pub sl: ServiceLevel,
    /// Kind-specific flags.
    pub flags: u8,
    /// Payload bytes following the header.
    pub len: u32,
    /// Kind-specific 32-bit field.
    pub aux: u32,
    /// Kind-specific 64-bit fields.
    pub a: u64,
    /// See the module docs.
    pub b: u64,
    /// See the module docs.
    pub c: u64,
}

/// Receiver-side limits applied to announced lengths before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest eager / unexpected message payload.
    pub eager: u32,
    /// Largest DATA / PULL_DATA / PUSH / PUT / GET chunk.
    pub chunk: u32,
    /// Largest request or reply header.
    pub header: u32,
    /// Largest message or request payload (RTS and REQUEST totals).
    pub message: u64,
}

impl Header {
    /// A header with zeroed fields.
    pub fn new(kind: Kind, sl: ServiceLevel) -> Self {
        Header { kind, sl, flags: 0, len: 0, aux: 0, a: 0, b: 0, c: 0 }
    }

    /// Encodes into 40 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2] = VERSION;
        out[3] = self.kind as u8;
        out[4] = self.sl as u8;
        out[5] = self.flags;
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.aux.to_le_bytes());
        out[16..24].copy_from_slice(&self.a.to_le_bytes());
        out[24..32].copy_from_slice(&self.b.to_le_bytes());
        out[32..40].copy_from_slice(&self.c.to_le_bytes());
        out
    }

    /// Decodes and validates the fixed fields (not lengths; see [`Header::check_limits`]).
    pub fn decode(bytes: &[u8]) -> Result<Header, WireError> {
        let b: &[u8; HEADER_LEN] = bytes
            .get(..HEADER_LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(WireError::Truncated(bytes.len()))?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[2] != VERSION {
            return Err(WireError::BadVersion(b[2]));
        }
        let kind = Kind::from_u8(b[3]).ok_or(WireError::UnknownKind(b[3]))?;
        let sl = ServiceLevel::from_u8(b[4]).ok_or(WireError::BadServiceLevel(b[4]))?;
        let flags = b[5];
        let reserved = u16_at(6);
        // Every flag bit has a meaning now (which kinds it is valid for is checked with the
        // lengths); the reserved field must stay zero.
        if reserved != 0 {
            return Err(WireError::BadFlags { flags, reserved });
        }
        Ok(Header {
            kind,
            sl,
            flags,
            len: u32_at(8),
            aux: u32_at(12),
            a: u64_at(16),
            b: u64_at(24),
            c: u64_at(32),
        })
    }

    /// Checks the announced lengths against `lim` (the TCP framing). Call before allocating for
    /// the payload.
    pub fn check_limits(&self, lim: &Limits) -> Result<(), WireError> {
        let len = u64::from(self.len);
        if self.flags & IB_ONLY_FLAGS != 0 {
            return Err(WireError::Inconsistent("InfiniBand-only flags"));
        }
        let too_long = |max: u64| {
            if len > max { Err(WireError::TooLong { kind: self.kind, len, max }) } else { Ok(()) }
        };
        match self.kind {
            Kind::Eager | Kind::Unexpected => too_long(u64::from(lim.eager)),
            Kind::Rts => {
                too_long(0)?;
                if self.c > lim.message {
                    return Err(WireError::TooLong { kind: self.kind, len: self.c, max: lim.message });
                }
                Ok(())
            }
            Kind::Data | Kind::PullData | Kind::Push | Kind::Put | Kind::GetResp => {
                too_long(u64::from(lim.chunk))
            }
            Kind::Stream => {
                if self.flags & FLAG_ABORT != 0 {
                    return too_long(0);
                }
                too_long(u64::from(lim.chunk))?;
                if self.len == 0 {
                    return Err(WireError::Inconsistent("empty stream"));
                }
                Ok(())
            }
            Kind::Get | Kind::Pull => {
                too_long(0)?;
                if self.aux > lim.chunk {
                    return Err(WireError::TooLong {
                        kind: self.kind,
                        len: u64::from(self.aux),
                        max: u64::from(lim.chunk),
                    });
                }
                Ok(())
            }
            Kind::Request => {
                if self.c > lim.message {
                    return Err(WireError::TooLong { kind: self.kind, len: self.c, max: lim.message });
                }
                if self.aux > lim.header {
                    return Err(WireError::TooLong {
                        kind: self.kind,
                        len: u64::from(self.aux),
                        max: u64::from(lim.header),
                    });
                }
                if self.aux > self.len {
                    return Err(WireError::Inconsistent("request header length"));
                }
                let inline = u64::from(self.len - self.aux);
                let has_inline = self.flags & FLAG_INLINE_DATA != 0;
                let out = self.flags & FLAG_PAYLOAD_OUT != 0;
                let inn = self.flags & FLAG_PAYLOAD_IN != 0;
                if out && inn {
                    return Err(WireError::Inconsistent("request direction"));
                }
                if self.flags & FLAG_STREAMED != 0 && (!out || has_inline || self.c == 0) {
                    return Err(WireError::Inconsistent("streamed request payload"));
                }
                if has_inline {
                    if !out || inline != self.c {
                        return Err(WireError::Inconsistent("inline request data"));
                    }
                    if inline > u64::from(lim.eager) {
                        return Err(WireError::TooLong {
                            kind: self.kind,
                            len: inline,
                            max: u64::from(lim.eager),
                        });
                    }
                } else if inline != 0 || (!out && !inn && self.c != 0) {
                    return Err(WireError::Inconsistent("request payload"));
                }
                Ok(())
            }
            Kind::Reply => too_long(u64::from(lim.header)),
            Kind::Cts
            | Kind::PutAck
            | Kind::CancelRequest
            | Kind::Bye
            | Kind::Ready
            | Kind::Credit
            | Kind::Fin => too_long(0),
            Kind::IbReady => too_long(0),
            // A segment list: bounded by the header limit.
            Kind::Rdv => too_long(u64::from(lim.header)),
            Kind::Hello | Kind::HelloAck | Kind::Auth | Kind::IbInfo => {
                too_long(MAX_HANDSHAKE_PAYLOAD as u64)
            }
        }
    }
}

/// Largest handshake payload (nonce + proof + limits); anything longer is hostile.
pub const MAX_HANDSHAKE_PAYLOAD: usize = 128;

/// Decodes a byte stream into headers and payload lengths until the bytes run out or a frame is
/// rejected. Used by the fuzz target and the corpus-replay test: it must never panic and never
/// allocate from announced lengths.
pub fn scan_stream(mut bytes: &[u8], lim: &Limits) -> Result<usize, WireError> {
    let mut frames = 0;
    while bytes.len() >= HEADER_LEN {
        let h = Header::decode(bytes)?;
        h.check_limits(lim)?;
        let total = HEADER_LEN + h.len as usize;
        if bytes.len() < total {
            break;
        }
        // Round-trip identity: what we decode re-encodes to the same bytes.
        debug_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
        bytes = &bytes[total..];
        frames += 1;
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim() -> Limits {
        Limits { eager: 16384, chunk: 1 << 20, header: 4096, message: 64 << 20 }
    }

    #[test]
    fn header_round_trips() {
        let mut h = Header::new(Kind::Request, ServiceLevel::Bulk);
        h.flags = FLAG_PAYLOAD_OUT | FLAG_INLINE_DATA;
        h.len = 100 + 24;
        h.aux = 24;
        h.a = u64::MAX;
        h.b = 7;
        h.c = 100;
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes).unwrap(), h);
        h.check_limits(&lim()).unwrap();
    }

    #[test]
    fn rejects_each_malformed_field() {
        let good = Header::new(Kind::Eager, ServiceLevel::Normal).encode();
        let mut b = good;
        b[0] = 0;
        assert!(matches!(Header::decode(&b), Err(WireError::BadMagic(_))));
        let mut b = good;
        b[2] = 2;
        assert_eq!(Header::decode(&b), Err(WireError::BadVersion(2)));
        let mut b = good;
        b[3] = 99;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind(99)));
        let mut b = good;
        b[4] = 3;
        assert_eq!(Header::decode(&b), Err(WireError::BadServiceLevel(3)));
        let mut b = good;
        b[6] = 0x80;
        assert!(matches!(Header::decode(&b), Err(WireError::BadFlags { .. })));
        let mut b = good;
        b[7] = 1;
        assert!(matches!(Header::decode(&b), Err(WireError::BadFlags { .. })));
        assert_eq!(Header::decode(&good[..39]), Err(WireError::Truncated(39)));
    }

    #[test]
    fn lengths_are_checked_before_allocation() {
        let l = lim();
        let mut h = Header::new(Kind::Eager, ServiceLevel::Normal);
        h.len = l.eager;
        assert!(h.check_limits(&l).is_ok());
        h.len = l.eager + 1;
        assert!(matches!(h.check_limits(&l), Err(WireError::TooLong { .. })));
        let mut h = Header::new(Kind::Rts, ServiceLevel::Normal);
        h.c = l.message + 1;
        assert!(h.check_limits(&l).is_err());
        let mut h = Header::new(Kind::Get, ServiceLevel::Normal);
        h.aux = l.chunk + 1;
        assert!(h.check_limits(&l).is_err());
        let mut h = Header::new(Kind::Cts, ServiceLevel::Normal);
        h.len = 1;
        assert!(h.check_limits(&l).is_err());
        let mut h = Header::new(Kind::Request, ServiceLevel::Normal);
        h.aux = 10;
        h.len = 5;
        assert_eq!(h.check_limits(&l), Err(WireError::Inconsistent("request header length")));
        h.len = 20; // 10 inline bytes without the inline flag
        h.flags = FLAG_PAYLOAD_OUT;
        assert!(h.check_limits(&l).is_err());
        // A streamed payload is OUT, not inline, and not empty.
        let mut h = Header::new(Kind::Request, ServiceLevel::Normal);
        (h.aux, h.len, h.c) = (10, 10, 1 << 20);
        h.flags = FLAG_PAYLOAD_OUT | FLAG_STREAMED;
        assert!(h.check_limits(&l).is_ok());
        for bad in [FLAG_PAYLOAD_IN | FLAG_STREAMED, FLAG_STREAMED] {
            h.flags = bad;
            assert_eq!(h.check_limits(&l), Err(WireError::Inconsistent("streamed request payload")));
        }
        h.flags = FLAG_PAYLOAD_OUT | FLAG_STREAMED;
        h.c = 0;
        assert!(h.check_limits(&l).is_err());
        // STREAM frames: bounded by the chunk limit, never empty, and an abort carries nothing.
        let mut h = Header::new(Kind::Stream, ServiceLevel::Bulk);
        h.len = l.chunk;
        assert!(h.check_limits(&l).is_ok());
        h.len = l.chunk + 1;
        assert!(matches!(h.check_limits(&l), Err(WireError::TooLong { .. })));
        h.len = 0;
        assert_eq!(h.check_limits(&l), Err(WireError::Inconsistent("empty stream")));
        h.flags = FLAG_ABORT;
        assert!(h.check_limits(&l).is_ok());
        h.len = 1;
        assert!(h.check_limits(&l).is_err());
    }

    #[test]
    fn stream_scan_counts_frames() {
        let mut s = Vec::new();
        let mut h = Header::new(Kind::Eager, ServiceLevel::Control);
        h.len = 3;
        s.extend_from_slice(&h.encode());
        s.extend_from_slice(b"abc");
        s.extend_from_slice(&Header::new(Kind::Bye, ServiceLevel::Control).encode());
        assert_eq!(scan_stream(&s, &lim()), Ok(2));
    }

    proptest::proptest! {
        #[test]
        fn decode_is_total(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(h) = Header::decode(&bytes) {
                let _ = h.check_limits(&lim());
                proptest::prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
            }
            let _ = scan_stream(&bytes, &lim());
        }
    }
}

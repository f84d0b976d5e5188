//! One link's framing state: where its receive state machine stands, its staging buffer, and
//! the frames queued on it, with the types that say where received bytes go ([`Sink`],
//! [`RecvInto`]) and which bytes leave next ([`IoVec`]).

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

use crate::admission::Dialled;
use crate::buffers::buf::OpBuf;
use crate::core::ops::OpTable;
use crate::error::AccessError;
use crate::expose::ExposureTable;
use crate::handshake::Hs;
use crate::types::{Access, OpId, PeerId, ServiceLevel};
use crate::wire::{HEADER_LEN, Header};

use super::{Op, OpSt, RX_BUF};

/// iovecs per write or read.
pub(crate) const MAX_IOV: usize = 64;

/// Where a frame's payload goes.
pub(crate) enum Sink {
    Discard,
    Vec(Vec<u8>),
    /// Into an op's receive buffer at `base + got`.
    Op {
        op: OpId,
        base: usize,
    },
    /// Into exposed memory (re-validated per chunk).
    Exposure {
        key: u64,
        addr: u64,
        denied: Option<AccessError>,
    },
}

/// Where the receive state machine of a link stands.
pub(crate) enum Rx {
    Header,
    Payload {
        hdr: Header,
        sink: Sink,
        got: usize,
    },
    /// A header parsed but not admitted (the peer's budget is used up): parsed again when the
    /// peer consumes something.
    Stalled(Header),
    /// Inside a STREAM frame of request `req`, `left` bytes to go, between runs: each run goes
    /// to one pull (or the void). Left in this state only while no pull covers the next byte.
    Stream {
        req: u64,
        left: u32,
    },
}

impl Rx {
    /// Not waiting for something that says itself when reading may go on.
    pub(crate) fn may_read(&self) -> bool {
        !matches!(self, Rx::Stalled(_) | Rx::Stream { .. })
    }
}

#[derive(Debug)]
pub(crate) enum OnDone {
    Nothing,
    /// The op is done when this frame is written.
    Complete(OpId),
    /// The frame referenced the op's buffer; release that reference.
    Release(OpId),
    /// Close the link once written (handshake refusals).
    Close,
}

/// A frame queued on a link: header, bytes it owns, and bytes of an op's buffer.
pub(crate) struct Frame {
    pub hdr: [u8; HEADER_LEN],
    pub sent: usize,
    pub prefix: Bytes,
    pub op_part: Option<(OpId, usize, usize)>,
    pub done: OnDone,
    /// Bytes charged to the transmit bound of the peer this frame answers (0: the
    /// application's own traffic, bounded by what it posts).
    pub charge: usize,
}

impl Frame {
    pub(crate) fn new(
        h: Header,
        prefix: Bytes,
        op_part: Option<(OpId, usize, usize)>,
        done: OnDone,
    ) -> Frame {
        Frame { hdr: h.encode(), sent: 0, prefix, op_part, done, charge: 0 }
    }

    pub(crate) fn total(&self) -> usize {
        HEADER_LEN + self.prefix.len() + self.op_part.map_or(0, |p| p.2)
    }

    /// Appends the bytes not yet sent.
    pub(crate) fn unsent<'a>(&'a self, ops: &'a OpTable<OpSt, ()>, iov: &mut IoVec<'a>) {
        let mut skip = self.sent;
        if skip < HEADER_LEN {
            iov.push(&self.hdr[skip..]);
            skip = 0;
        } else {
            skip -= HEADER_LEN;
        }
        if skip < self.prefix.len() {
            iov.push(&self.prefix[skip..]);
            skip = 0;
        } else {
            skip -= self.prefix.len();
        }
        if let Some((op, off, len)) = self.op_part
            && skip < len
            && let Some(o) = ops.get(&op)
        {
            match &o.buf {
                OpBuf::Send(b) => b.for_each_slice(off + skip, len - skip, |s| iov.push(s)),
                OpBuf::Recv(_) | OpBuf::None => {}
            }
        }
    }
}

/// Where a link is in its life.
pub(crate) enum Phase {
    Connecting,
    /// In the handshake both transports share.
    Handshake(Hs),
    Ready,
    Closing,
}

impl Phase {
    /// How far a link this end dialled has got, while it is still dialling.
    pub(crate) fn dialled(&self) -> Option<Dialled> {
        match self {
            Phase::Connecting => Some(Dialled::Connecting),
            Phase::Handshake(hs) if hs.is_client() => Some(Dialled::Handshaking),
            _ => None,
        }
    }
}

/// What the last [`RecvInto`] lent out, so [`super::Session::received`] knows where the bytes
/// landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lent {
    Nothing,
    Staging,
    Sink,
}

/// One link's protocol state.
pub(crate) struct Link {
    pub sl: ServiceLevel,
    pub peer: Option<PeerId>,
    pub remote: SocketAddr,
    pub phase: Phase,
    /// When the current deadline's clock started (dial, connect, accept); `None` until the
    /// driver says when it dialled.
    pub since: Option<Instant>,
    pub rx: Rx,
    /// Staging buffer; bytes `rx_start..rx_end` are received and not yet parsed.
    pub rxbuf: Box<[u8]>,
    pub rx_start: usize,
    pub rx_end: usize,
    pub lent: Lent,
    pub hs_tx: VecDeque<Frame>,
    pub tx: VecDeque<Frame>,
    /// The link takes bytes: its last write was not refused.
    pub writable: bool,
    /// The last body was read straight into its destination: read the next header alone, so
    /// that if another large body follows it is not staged (and copied) in part.
    pub bulk: bool,
}

impl Link {
    pub(crate) fn new(remote: SocketAddr, sl: ServiceLevel, phase: Phase, since: Option<Instant>) -> Link {
        Link {
            sl,
            peer: None,
            remote,
            phase,
            since,
            rx: Rx::Header,
            rxbuf: vec![0u8; RX_BUF].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            lent: Lent::Nothing,
            hs_tx: VecDeque::new(),
            tx: VecDeque::new(),
            writable: false,
            bulk: false,
        }
    }

    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// Frames wait that may be sent now.
    pub(crate) fn has_frames(&self) -> bool {
        !self.hs_tx.is_empty() || (self.is_ready() && !self.tx.is_empty())
    }

    pub(crate) fn staged(&self) -> usize {
        self.rx_end - self.rx_start
    }

    /// Room at the end of the staging buffer for at most `max` more bytes, compacting first
    /// when the tail is full.
    pub(crate) fn staging_room(&mut self, max: usize) -> (usize, usize) {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx_end == self.rxbuf.len() {
            self.rxbuf.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        let room = (self.rxbuf.len() - self.rx_end).min(max);
        (self.rx_end, self.rx_end + room)
    }

    /// Puts a parsed header back in front of the staged bytes, to be parsed again.
    pub(crate) fn unparse(&mut self, h: &Header) {
        let enc = h.encode();
        if self.rx_start >= HEADER_LEN {
            self.rx_start -= HEADER_LEN;
            self.rxbuf[self.rx_start..self.rx_start + HEADER_LEN].copy_from_slice(&enc);
        } else {
            let staged = self.rx_end - self.rx_start;
            self.rxbuf.copy_within(self.rx_start..self.rx_end, HEADER_LEN);
            self.rxbuf[..HEADER_LEN].copy_from_slice(&enc);
            self.rx_start = 0;
            self.rx_end = HEADER_LEN + staged;
        }
    }
}

/// Where the next bytes received on a link go (see [`super::Session::recv_buffers`]).
// Returned once per read and never stored: the inline iovecs cost nothing to keep unboxed.
#[allow(clippy::large_enum_variant)]
pub(crate) enum RecvInto<'a> {
    /// Into the link's staging buffer, at most this much.
    Staging(&'a mut [u8]),
    /// Straight into the destination of the payload being read.
    Direct(RecvIov<'a>),
    /// Nothing: the link is not read now (an [`super::Action::Resume`] says when to again),
    /// or it is gone.
    Paused,
}

/// iovecs for one write, inline on the stack up to 16 (no allocation, no initialisation of
/// unused slots), at most [`MAX_IOV`].
#[derive(Default)]
pub(crate) struct IoVec<'a> {
    v: smallvec::SmallVec<[IoSlice<'a>; 16]>,
}

impl<'a> IoVec<'a> {
    pub(crate) fn push(&mut self, s: &'a [u8]) {
        if self.v.len() < MAX_IOV && !s.is_empty() {
            self.v.push(IoSlice::new(s));
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.v.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.v.is_empty()
    }
    pub(crate) fn slices(&self) -> &[IoSlice<'a>] {
        &self.v
    }
    /// Bytes in all slices.
    pub(crate) fn bytes(&self) -> usize {
        self.v.iter().map(|s| s.len()).sum()
    }
}

/// The destinations of one direct read: iovecs inline on the stack up to 16, at most
/// [`MAX_IOV`].
pub(crate) type RecvIov<'a> = smallvec::SmallVec<[IoSliceMut<'a>; 16]>;

/// Copies staged bytes into a sink at payload offset `at`.
pub(crate) fn sink_write(
    sink: &mut Sink,
    at: usize,
    data: &[u8],
    ops: &mut OpTable<OpSt, ()>,
    exposures: &mut ExposureTable,
) {
    match sink {
        Sink::Discard => {}
        Sink::Vec(v) => crate::buffers::copy::copy_bytes(&mut v[at..at + data.len()], data),
        Sink::Op { op, base } => {
            if let Some(Op { buf: OpBuf::Recv(b), .. }) = ops.get_mut(op) {
                b.copy_in(*base + at, data);
            }
        }
        Sink::Exposure { key, addr, denied } => {
            if denied.is_some() {
                return;
            }
            // Re-validated per chunk: the owner may have revoked it between reads.
            match exposures.validate(*key, *addr + at as u64, data.len() as u64, Access::WRITE) {
                Ok(dst) => crate::buffers::copy::copy_bytes(dst, data),
                Err(e) => *denied = Some(e),
            }
        }
    }
}

/// Where the next `max` bytes of a sink go, for a direct read: every piece of a scatter list
/// up to [`MAX_IOV`], so one read takes as much as a contiguous buffer would (a striped read's
/// destination is a list of stripe-sized pieces, and one read per piece costs measurably).
/// Nothing for sinks that are not plain memory.
pub(crate) fn sink_slices<'a>(
    sink: &'a mut Sink,
    at: usize,
    max: usize,
    ops: &'a mut OpTable<OpSt, ()>,
    out: &mut RecvIov<'a>,
) {
    let mut push = |s: &'a mut [u8]| {
        out.push(IoSliceMut::new(s));
        out.len() < MAX_IOV
    };
    match sink {
        Sink::Vec(v) => {
            push(&mut v[at..at + max]);
        }
        Sink::Op { op, base } => {
            if let Some(Op { buf: OpBuf::Recv(b), .. }) = ops.get_mut(op) {
                b.for_each_slice_mut(*base + at, max, push);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::buffers::buf::RecvBuf;
    use crate::op::OpKind;
    use bytes::BytesMut;

    /// Bytes the iovecs of one read hold.
    fn bytes(iov: &RecvIov<'_>) -> usize {
        iov.iter().map(|s| s.len()).sum()
    }

    /// A receive op whose buffer is a scatter list of `n` segments of `seg` bytes each.
    pub(crate) fn list_op(n: usize, seg: usize) -> (OpId, OpTable<OpSt, ()>) {
        let id = OpId(7);
        let list = (0..n).map(|_| BytesMut::zeroed(seg)).collect();
        let mut ops = OpTable::default();
        ops.insert(
            id,
            OpKind::Recv,
            PeerId(0),
            0,
            ServiceLevel::Bulk,
            OpBuf::Recv(RecvBuf::List(list)),
            OpSt::Receiving,
        );
        (id, ops)
    }

    #[test]
    fn a_direct_read_fills_every_segment_of_a_scatter_list() {
        let (seg, n, at) = (4096, 4, 1000);
        let data: Vec<u8> = (0..seg * n - at).map(|i| (i % 251) as u8).collect();
        let (id, mut ops) = list_op(n, seg);
        let mut sink = Sink::Op { op: id, base: 0 };
        {
            let mut iov = RecvIov::new();
            sink_slices(&mut sink, at, data.len(), &mut ops, &mut iov);
            assert_eq!(iov.len(), n, "one iovec per segment from the one holding the offset");
            assert_eq!(bytes(&iov), data.len());
            let mut rest = &data[..];
            for s in iov.iter_mut() {
                let (now, later) = rest.split_at(s.len());
                s.copy_from_slice(now);
                rest = later;
            }
        }
        let Some(Op { buf: OpBuf::Recv(RecvBuf::List(l)), .. }) = ops.get(&id) else { panic!() };
        let flat: Vec<u8> = l.iter().flat_map(|b| b.iter().copied()).collect();
        assert!(flat[..at].iter().all(|&b| b == 0), "nothing before the offset");
        assert_eq!(&flat[at..], &data[..]);
    }

    #[test]
    fn a_direct_read_takes_at_most_max_iov_segments_and_stops_at_the_limit() {
        let (id, mut ops) = list_op(MAX_IOV + 8, 16);
        let mut sink = Sink::Op { op: id, base: 0 };
        let mut iov = RecvIov::new();
        sink_slices(&mut sink, 0, usize::MAX, &mut ops, &mut iov);
        assert_eq!((iov.len(), bytes(&iov)), (MAX_IOV, MAX_IOV * 16));
        let (id, mut ops) = list_op(8, 16);
        let mut sink = Sink::Op { op: id, base: 0 };
        let mut iov = RecvIov::new();
        sink_slices(&mut sink, 20, 30, &mut ops, &mut iov);
        let lens: Vec<usize> = iov.iter().map(|s| s.len()).collect();
        assert_eq!(lens, [12, 16, 2], "[20, 50) across segments of 16");
    }
}

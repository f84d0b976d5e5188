//! Posting decisions: which mechanism carries a send, a request, a push or a reply, what its
//! message looks like, how a buffer is opened to the peer, and the posts held until the
//! peer's limits are known. Plain rules over the connection's limits ([`MsgCaps`]) and the
//! policy, apart from the device: the engine registers what a plan says to register and
//! queues the messages it describes.

use std::collections::VecDeque;

use crate::backend::{Cmd, SendCmd};
use crate::buffers::buf::{OpBuf, RecvBuf, SendBuf};
use crate::comm::{Conditions, Mechanism, Policy};
use crate::core::requests;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::op::{Direction, OpKind};
use crate::regcache::Span;
use crate::types::{OpId, PeerId, ServiceLevel, Tag};
use crate::wire::{FLAG_INLINE_DATA, FLAG_SEGMENTS, Header, Kind};

use super::link::Via;
use super::msg::{self, MSG_HDR, Segment};

/// Message sizes a connection can carry: the smaller of this endpoint's and the peer's
/// receive-buffer and ring-slot sizes (each side announces its own in the side-channel info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MsgCaps {
    /// Largest message (header included) that fits a receive buffer: a SEND.
    pub recv: usize,
    /// Largest message (header included) that fits a ring slot: a fast-RDMA write.
    pub slot: usize,
}

impl MsgCaps {
    /// Largest payload of a message written into a ring slot (the eager limit).
    pub fn slot_payload_max(&self) -> usize {
        self.slot - MSG_HDR
    }

    /// What a connection carries: our own limits, lowered to the peer's once they are known.
    pub fn with_peer(self, peer: Option<MsgCaps>) -> MsgCaps {
        match peer {
            Some(p) => MsgCaps { recv: self.recv.min(p.recv), slot: self.slot.min(p.slot) },
            None => self,
        }
    }

    /// How a message of `payload` bytes that carries no op data travels: a SEND when it fits
    /// a receive buffer, a ring write otherwise.
    pub fn via(&self, payload: usize) -> Via {
        if MSG_HDR + payload <= self.recv { Via::Send } else { Via::Ring }
    }

    /// Whether a message of `payload` bytes fits a ring slot, the largest message there is.
    pub fn fits_slot(&self, payload: usize) -> bool {
        MSG_HDR + payload <= self.slot
    }
}

/// What to register a buffer for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum For {
    /// The peer reads it.
    PeerRead,
    /// The peer writes it.
    PeerWrite,
}

/// The mechanism for `len` payload bytes travelling with `extra` bytes of other payload
/// (a request header): the policy's choice — the table's, or the forced mechanism — moved
/// up to the next mechanism that can carry the message when it does not fit (inline needs
/// a receive buffer, fast RDMA a ring slot), and down to inline for an empty payload, which
/// server-based RDMA has nothing to move for. The table's thresholds fit this endpoint's own
/// buffers (they are clamped at start-up), but a peer's may be smaller, and a forced
/// mechanism may not fit either: the connection's [`MsgCaps`] decide.
pub(crate) fn mechanism(
    policy: &Policy,
    caps: MsgCaps,
    len: usize,
    sl: ServiceLevel,
    extra: usize,
) -> Mechanism {
    let inline_cap = caps.recv.saturating_sub(MSG_HDR + extra);
    let fast_cap = caps.slot.saturating_sub(MSG_HDR + extra);
    match policy.choose(len, sl, Conditions::idle(true)) {
        Mechanism::ServerRdma if len == 0 => Mechanism::Inline,
        Mechanism::Inline if len > inline_cap && len <= fast_cap => Mechanism::FastRdma,
        Mechanism::Inline | Mechanism::FastRdma if len > fast_cap => Mechanism::ServerRdma,
        m => m,
    }
}

/// How a message carrying its data travels: inline by SEND, fast RDMA into a ring slot.
fn message_via(mech: Mechanism) -> Via {
    if mech == Mechanism::Inline { Via::Send } else { Via::Ring }
}

/// An unexpected message lands in a ring slot of the peer's: it must fit the connection's
/// (the smaller) eager limit.
pub(crate) fn check_unexpected(caps: MsgCaps, len: usize, unexpected: bool) -> Result<()> {
    let eager = caps.slot_payload_max();
    if unexpected && len > eager {
        return Err(Error::TooLarge { len: len as u64, max: eager as u64 });
    }
    Ok(())
}

/// How an op's buffer is opened to the peer's RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Registration {
    /// A pool buffer: registered once, the cache only finds it.
    Owned,
    /// The caller's memory, registered through the cache for the op's lifetime; with the
    /// allocation hint, `parent` is the pieces' span (their parent allocation), registered
    /// whole on a miss so the next list from it hits.
    Foreign { parent: Option<Span> },
    /// A list of more pieces than half the segments a list may carry: a pool buffer carries
    /// the bytes. (Also what the engine falls back to when registering fails: see
    /// [`Registration::acquire`].)
    Stage,
}

/// How the pin-down cache is asked for the registration of each piece of an op's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Pool memory, registered once when the pool made it: only found, never registered here
    /// (a pool buffer the cache does not know, another endpoint's, is not ours to register).
    Find,
    /// The caller's memory, registered on a miss.
    Register,
    /// The caller's memory; on a miss the whole parent allocation is registered, so the next
    /// list from it hits.
    RegisterParent(Span),
}

impl Registration {
    /// How to ask the cache for the pieces; None: staged at once. A request the cache cannot
    /// grant (it is full of pinned memory, the provider refuses the pages, a pool buffer it
    /// does not know) stages the op too: its bytes are all here, and a copy through a pool
    /// buffer costs less than failing it. The op fails only when staging does.
    pub fn acquire(self) -> Option<Acquire> {
        match self {
            Registration::Owned => Some(Acquire::Find),
            Registration::Foreign { parent: None } => Some(Acquire::Register),
            Registration::Foreign { parent: Some(p) } => Some(Acquire::RegisterParent(p)),
            Registration::Stage => None,
        }
    }
}

/// Whether a refused registration is worth a note: the caller's memory refused (pin limits,
/// read-only pages) explains an op slower than it should be; a pool buffer the cache does not
/// know is staged as a matter of course.
pub(crate) fn note_refusal(ask: Acquire) -> bool {
    ask != Acquire::Find
}

/// The pool buffer that carries an op's bytes when its own memory is not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Staging {
    /// Bytes to allocate: at least one, the pool has no empty buffers.
    pub alloc: usize,
    /// Bytes the peer reads or writes: the pieces' total.
    pub len: usize,
    /// The op's bytes are copied in first (the peer reads them); a buffer the peer writes is
    /// copied out into the op's when the reply comes instead.
    pub fill: bool,
}

/// How an op whose `pieces` are not registered is staged, for `purpose`.
pub(crate) fn staging(purpose: For, pieces: &[(usize, usize)]) -> Staging {
    let len: usize = pieces.iter().map(|p| p.1).sum();
    Staging { alloc: len.max(1), len, fill: purpose == For::PeerRead }
}

/// The pieces (address, length) of an op's buffer the peer would read or write, and whether
/// it is a pool buffer. Empty pieces of scatter lists are left out.
pub(crate) fn buffer_pieces(buf: &OpBuf) -> (Vec<(usize, usize)>, bool) {
    let pieces = match buf {
        OpBuf::Send(SendBuf::Registered(b)) | OpBuf::Recv(RecvBuf::Registered(b)) => {
            return (vec![(b.addr(), b.len())], true);
        }
        OpBuf::Send(s) => {
            let mut v = Vec::new();
            s.for_each_slice(0, s.len(), |p| v.push((p.as_ptr() as usize, p.len())));
            v
        }
        OpBuf::Recv(RecvBuf::Mut(b)) => vec![(b.as_ptr() as usize, b.len())],
        // Scatter lists (plain or mapped): their non-empty segments.
        OpBuf::Recv(r) => {
            let mut v = Vec::new();
            r.for_each_slice(0, r.capacity(), |p| v.push((p.as_ptr() as usize, p.len())));
            v
        }
        OpBuf::None => Vec::new(),
    };
    (pieces, false)
}

/// How to open `pieces` (of a pool buffer when `owned`) to the peer; `alloc_hint`: the
/// pieces of a list come from one allocation (see [`Registration::Foreign`]).
pub(crate) fn registration(owned: bool, pieces: &[(usize, usize)], alloc_hint: bool) -> Registration {
    if owned {
        return Registration::Owned;
    }
    // Each piece would be a segment of the list announced to the peer.
    if pieces.len() > msg::MAX_SEGMENTS / 2 {
        return Registration::Stage;
    }
    let parent = (alloc_hint && pieces.len() > 1).then(|| {
        let lo = pieces.iter().map(|p| p.0).min().unwrap_or(0);
        let hi = pieces.iter().map(|p| p.0 + p.1).max().unwrap_or(lo);
        Span::new(lo, hi - lo)
    });
    Registration::Foreign { parent }
}

/// How a send goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendPlan {
    /// Header and data in one message: a SEND for inline, a ring write for fast RDMA. The op
    /// completes when it is posted, or when its work request does if it goes without a copy.
    Message { mech: Mechanism, via: Via, header: Header },
    /// Server-based RDMA: the buffer is registered for the peer to read, and an announcement
    /// (`header`: its message id in `b` and length still to fill) carries the segment list;
    /// the op waits for the receiver's FIN.
    Rendezvous { header: Header },
}

/// Plans a send of `len` bytes on a connection whose limits are `caps`.
pub(crate) fn plan_send(
    policy: &Policy,
    caps: MsgCaps,
    tag: Tag,
    sl: ServiceLevel,
    len: usize,
    unexpected: bool,
) -> Result<SendPlan> {
    check_unexpected(caps, len, unexpected)?;
    let mut mech = mechanism(policy, caps, len, sl, 0);
    if unexpected && mech == Mechanism::ServerRdma {
        // Nobody will post a receive to pull it: it fits a ring slot (eager limit).
        mech = Mechanism::FastRdma;
    }
    let mut h = Header::new(if unexpected { Kind::Unexpected } else { Kind::Eager }, sl);
    h.a = tag;
    Ok(match mech {
        Mechanism::Inline | Mechanism::FastRdma => {
            h.len = len as u32;
            SendPlan::Message { mech, via: message_via(mech), header: h }
        }
        Mechanism::ServerRdma => {
            h.kind = Kind::Rdv;
            h.c = len as u64;
            SendPlan::Rendezvous { header: h }
        }
    })
}

/// How a request goes: its payload in the message or registered for the server's RDMA; its
/// header in the message or, when the message would not fit a ring slot, registered too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestPlan {
    /// The wire header, with [`FLAG_INLINE_DATA`] or [`FLAG_SEGMENTS`] as the payload goes;
    /// the engine adds the header's rendezvous flag and the length.
    pub header: Header,
    /// The mechanism the payload's bytes go by.
    pub chosen: Mechanism,
    /// What the op reports: none without a payload. A read's data comes in the server's PUSH
    /// messages unless registered: the server picks their mechanism and the client reports
    /// how they came (this choice if none came).
    pub mech: Option<Mechanism>,
    /// Payload bytes in the message, after the header.
    pub inline_len: usize,
    /// The payload is registered for the server's RDMA, for this.
    pub register: Option<For>,
}

/// Plans request `op` with a `header_len`-byte header and a `len`-byte payload going `dir`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_request(
    policy: &Policy,
    caps: MsgCaps,
    op: OpId,
    tag: Tag,
    sl: ServiceLevel,
    header_len: usize,
    len: usize,
    dir: Direction,
) -> RequestPlan {
    let mut h = requests::request_header(sl, tag, op, len, header_len, dir);
    // What the header takes of the message: itself, or its segment list when it is too large
    // for a slot.
    let header_room = if caps.fits_slot(header_len) { header_len } else { msg::segments_len(1) };
    let chosen = mechanism(policy, caps, len, sl, header_room);
    let mut inline_len = 0;
    let mut register = None;
    if dir == Direction::Out && chosen != Mechanism::ServerRdma {
        h.flags |= FLAG_INLINE_DATA;
        inline_len = len;
    } else if dir != Direction::None && chosen == Mechanism::ServerRdma {
        h.flags |= FLAG_SEGMENTS;
        register = Some(if dir == Direction::Out { For::PeerRead } else { For::PeerWrite });
    }
    RequestPlan { header: h, chosen, mech: (dir != Direction::None).then_some(chosen), inline_len, register }
}

impl RequestPlan {
    /// Whether the header goes by rendezvous (the server reads it and answers FIN): when
    /// header, inline data and segment list (`segs_len` bytes) would not fit a ring slot.
    pub fn header_by_rdv(&self, caps: MsgCaps, header_len: usize, segs_len: usize) -> bool {
        !caps.fits_slot(header_len + self.inline_len + segs_len)
    }

    /// How the message of `payload` bytes travels: a SEND when it fits a receive buffer,
    /// unless it carries data fast RDMA was chosen for (that goes into a ring slot).
    pub fn via(&self, caps: MsgCaps, payload: usize) -> Via {
        let data_by_ring = self.header.flags & FLAG_INLINE_DATA != 0 && self.chosen == Mechanism::FastRdma;
        if data_by_ring { Via::Ring } else { caps.via(payload) }
    }
}

/// A PUSH message: the server's data for a client buffer that is not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PushPlan {
    pub mech: Mechanism,
    pub via: Via,
    pub header: Header,
    /// Where the pushed bytes end in the client's buffer once the message is queued: it goes
    /// before the reply on the connection, so its bytes count at once. None for an empty
    /// push: it pushed no byte, and the reply must not say bytes up to its offset arrived.
    pub pushed_to: Option<u64>,
}

/// Plans a push of `len` bytes at `offset` of request `req`'s buffer into a client buffer
/// that is not registered: there is no server-based RDMA to use, so it must fit one message.
pub(crate) fn plan_push_message(
    policy: &Policy,
    caps: MsgCaps,
    sl: ServiceLevel,
    req: u64,
    offset: u64,
    len: usize,
) -> Result<PushPlan> {
    let mech = match mechanism(policy, caps, len, sl, 0) {
        Mechanism::ServerRdma => Mechanism::FastRdma,
        m => m,
    };
    if len > caps.slot_payload_max() {
        return Err(Error::misuse("push larger than a message into an unregistered buffer"));
    }
    let mut h = Header::new(Kind::Push, sl);
    h.b = req;
    h.c = offset;
    h.len = len as u32;
    let pushed_to = (len > 0).then_some(offset + len as u64);
    Ok(PushPlan { mech, via: message_via(mech), header: h, pushed_to })
}

/// What a pull, a push into a registered buffer, a put or a get does by server-based RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// No byte to move: no work request is posted (a zero-length RDMA would still be a round
    /// trip to the peer's device for nothing), and no buffer is registered. The op completes
    /// at once with no bytes; a pull's or push's request counts its transfer as finished at
    /// once, so a reply deferred behind it may go.
    Nothing,
    /// `len` bytes to move; `end`: where a push's bytes end in the client's buffer once they
    /// have (0 for the others, which push nothing).
    Move { len: usize, end: u64 },
}

/// A pull of `len` bytes of a request's buffer into ours.
pub(crate) fn plan_pull(len: usize) -> Transfer {
    if len == 0 { Transfer::Nothing } else { Transfer::Move { len, end: 0 } }
}

/// A push of `len` bytes at `offset` of a request's buffer into the client's registered one.
/// An empty push does not move where the pushed bytes end: it pushed none.
pub(crate) fn plan_push_rdma(offset: u64, len: usize) -> Transfer {
    if len == 0 { Transfer::Nothing } else { Transfer::Move { len, end: offset + len as u64 } }
}

/// A put or a get of `len` bytes against the peer's exposure `remote`, on an endpoint whose
/// messages are at most `max_message` bytes. Refused (no op is made) when it overruns the
/// exposure or the limit; an empty one against any exposure moves nothing.
pub(crate) fn plan_one_sided(len: usize, remote: &MemHandle, max_message: usize) -> Result<Transfer> {
    if len as u64 > remote.len {
        return Err(Error::misuse(format!("{len} bytes against a {}-byte handle", remote.len)));
    }
    if len > max_message {
        return Err(Error::TooLarge { len: len as u64, max: max_message as u64 });
    }
    Ok(if len == 0 { Transfer::Nothing } else { Transfer::Move { len, end: 0 } })
}

/// The exposure `remote` as the one segment a put or get walks. A segment's length is 32
/// bits; an exposure larger than that is cut, which no transfer reaches (a transfer is at
/// most the largest message).
pub(crate) fn exposure_segment(remote: &MemHandle) -> Segment {
    Segment { addr: remote.addr, len: remote.len.min(u64::from(u32::MAX)) as u32, rkey: remote.rkey }
}

/// A reply: its wire header (the length still to fill), and whether its header goes by
/// rendezvous — too large for a ring slot, it is registered for the client to read, and the
/// message carries its segment list instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplyPlan {
    pub header: Header,
    pub header_by_rdv: bool,
}

/// Plans the reply to request `req` with `status` and a `header_len`-byte header; `pushed`
/// is where the bytes the server pushed end (the client's RDMA-written buffer cannot tell).
pub(crate) fn plan_reply(
    caps: MsgCaps,
    sl: ServiceLevel,
    req: u64,
    status: u32,
    pushed: u64,
    header_len: usize,
) -> ReplyPlan {
    let mut h = Header::new(Kind::Reply, sl);
    h.b = req;
    h.aux = status;
    h.a = pushed;
    ReplyPlan { header: h, header_by_rdv: !caps.fits_slot(header_len) }
}

/// A held post the engine can place now, or one that fails with its buffer given back.
pub(crate) enum Placement {
    Post(OpId, Cmd),
    Fail { op: OpId, kind: OpKind, peer: PeerId, tag: Tag, buf: OpBuf, err: Error },
}

/// Sends and requests posted on a connection before the peer's limits were known, in posting
/// order: their mechanism is chosen from the limits both sides can carry, once they are.
#[derive(Default)]
pub(crate) struct HeldPosts(VecDeque<(OpId, Cmd)>);

impl HeldPosts {
    pub fn hold(&mut self, op: OpId, cmd: Cmd) {
        self.0.push_back((op, cmd));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn ops(&self) -> impl Iterator<Item = OpId> + '_ {
        self.0.iter().map(|(op, _)| *op)
    }

    /// Takes `op` out (cancelled or failed before it was placed): what its completion needs,
    /// its buffer included. None when it is not held here.
    pub fn withdraw(&mut self, op: OpId) -> Option<(OpKind, PeerId, Tag, OpBuf)> {
        let i = self.0.iter().position(|(o, _)| *o == op)?;
        self.0.remove(i).map(|(_, cmd)| cmd.into_parts())
    }

    /// Everything held, in posting order, now that the connection's limits are `caps`. An
    /// unexpected send was checked against our own slots when posted; the peer's may be
    /// smaller, and then it fails here, with its buffer.
    pub fn place(&mut self, caps: MsgCaps) -> impl Iterator<Item = Placement> + use<> {
        std::mem::take(&mut self.0).into_iter().map(move |(op, cmd)| {
            let err = match &cmd {
                Cmd::Send(SendCmd { unexpected: true, buf, .. }) => {
                    check_unexpected(caps, buf.len(), true).err()
                }
                _ => None,
            };
            match err {
                Some(err) => {
                    let (kind, peer, tag, buf) = cmd.into_parts();
                    Placement::Fail { op, kind, peer, tag, buf, err }
                }
                None => Placement::Post(op, cmd),
            }
        })
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

//! The crate-private contract between the endpoint and a transport: the commands an
//! endpoint hands a backend and the [`Backend`] trait every transport implements. Backends
//! depend on this module and on [`crate::completions`], never on the endpoint itself.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use bytes::Bytes;

use crate::addr::{Address, Scheme};
use crate::buffers::buf::{OpBuf, RecvBuf, RegisteredBuf, SendBuf};
#[cfg(doc)]
use crate::completions::Completions;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::info::Info;
use crate::op::{OpKind, Payload};
use crate::types::{Access, OpId, PeerId, ServiceLevel, Tag};

/// A command handed to a backend, carrying its buffers.
#[derive(Debug)]
pub(crate) enum Cmd {
    Send(SendCmd),
    Recv(RecvCmd),
    Put(PutCmd),
    Get(GetCmd),
    Request(RequestCmd),
    Pull(PullCmd),
    Push(PushCmd),
    Reply(ReplyCmd),
}

/// [`Cmd::Send`]: a tagged message (`unexpected`: for `recv_unexpected`).
#[derive(Debug)]
pub(crate) struct SendCmd {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub buf: SendBuf,
    pub unexpected: bool,
}

/// [`Cmd::Recv`]: a receive matched by peer and tag.
#[derive(Debug)]
pub(crate) struct RecvCmd {
    pub peer: PeerId,
    pub tag: Tag,
    pub buf: RecvBuf,
}

/// [`Cmd::Put`]: `local` written into the peer's exposed memory.
#[derive(Debug)]
pub(crate) struct PutCmd {
    pub peer: PeerId,
    pub sl: ServiceLevel,
    pub local: SendBuf,
    pub remote: MemHandle,
}

/// [`Cmd::Get`]: the peer's exposed memory read into `local`.
#[derive(Debug)]
pub(crate) struct GetCmd {
    pub peer: PeerId,
    pub sl: ServiceLevel,
    pub local: RecvBuf,
    pub remote: MemHandle,
}

/// [`Cmd::Request`]: a request with its header and payload (client side).
#[derive(Debug)]
pub(crate) struct RequestCmd {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub header: Bytes,
    pub payload: Payload,
}

/// [`Cmd::Pull`]: part of request `req`'s OUT payload into `buf` (server side).
#[derive(Debug)]
pub(crate) struct PullCmd {
    pub peer: PeerId,
    pub req: u64,
    pub sl: ServiceLevel,
    pub offset: u64,
    pub buf: RecvBuf,
}

/// [`Cmd::Push`]: `buf` into request `req`'s IN payload at `offset` (server side).
#[derive(Debug)]
pub(crate) struct PushCmd {
    pub peer: PeerId,
    pub req: u64,
    pub sl: ServiceLevel,
    pub offset: u64,
    pub buf: SendBuf,
}

/// [`Cmd::Reply`]: the answer to request `req` (server side).
#[derive(Debug)]
pub(crate) struct ReplyCmd {
    pub peer: PeerId,
    pub req: u64,
    pub sl: ServiceLevel,
    pub header: Bytes,
    pub status: u32,
}

impl Cmd {
    /// The peer the command addresses.
    pub(crate) fn peer(&self) -> PeerId {
        match self {
            Cmd::Send(SendCmd { peer, .. })
            | Cmd::Recv(RecvCmd { peer, .. })
            | Cmd::Put(PutCmd { peer, .. })
            | Cmd::Get(GetCmd { peer, .. })
            | Cmd::Request(RequestCmd { peer, .. })
            | Cmd::Pull(PullCmd { peer, .. })
            | Cmd::Push(PushCmd { peer, .. })
            | Cmd::Reply(ReplyCmd { peer, .. }) => *peer,
        }
    }

    /// The class of service it goes in, if it sends anything (a receive does not).
    pub(crate) fn sl(&self) -> Option<ServiceLevel> {
        match self {
            Cmd::Recv(_) => None,
            Cmd::Send(SendCmd { sl, .. })
            | Cmd::Put(PutCmd { sl, .. })
            | Cmd::Get(GetCmd { sl, .. })
            | Cmd::Request(RequestCmd { sl, .. })
            | Cmd::Pull(PullCmd { sl, .. })
            | Cmd::Push(PushCmd { sl, .. })
            | Cmd::Reply(ReplyCmd { sl, .. }) => Some(*sl),
        }
    }

    /// What its completion needs if it fails as posted: its kind, peer, tag and buffer.
    pub(crate) fn into_parts(self) -> (OpKind, PeerId, Tag, OpBuf) {
        match self {
            Cmd::Send(SendCmd { peer, tag, buf, unexpected, .. }) => {
                (if unexpected { OpKind::SendUnexpected } else { OpKind::Send }, peer, tag, OpBuf::Send(buf))
            }
            Cmd::Recv(RecvCmd { peer, tag, buf }) => (OpKind::Recv, peer, tag, OpBuf::Recv(buf)),
            Cmd::Put(PutCmd { peer, local, .. }) => (OpKind::Put, peer, 0, OpBuf::Send(local)),
            Cmd::Get(GetCmd { peer, local, .. }) => (OpKind::Get, peer, 0, OpBuf::Recv(local)),
            Cmd::Request(RequestCmd { peer, tag, payload, .. }) => {
                (OpKind::Request, peer, tag, payload.split().0)
            }
            Cmd::Pull(PullCmd { peer, buf, .. }) => (OpKind::Pull, peer, 0, OpBuf::Recv(buf)),
            Cmd::Push(PushCmd { peer, buf, .. }) => (OpKind::Push, peer, 0, OpBuf::Send(buf)),
            Cmd::Reply(ReplyCmd { peer, .. }) => (OpKind::Reply, peer, 0, OpBuf::None),
        }
    }

    /// The error of an operation addressed to a peer the endpoint has forgotten: lost, like
    /// any operation on a peer that is gone.
    pub(crate) fn forgotten(peer: PeerId) -> Error {
        Error::PeerLost {
            peer,
            reason: "the peer disconnected and was forgotten; it gets a new id if it connects again".into(),
        }
    }
}

/// The contract every transport implements.
///
/// * `post` either returns `Err` (the op never existed; its buffers are dropped) or takes the
///   op and later calls [`Completions::complete`] for it exactly once — possibly before `post`
///   returns.
/// * `cancel` asks for an op to end with the given error; if it already completed, nothing
///   happens. An unmatched receive ends at once; an in-flight transfer is aborted cleanly or its
///   connection is failed.
/// * `progress` moves bytes, waiting at most `timeout` (zero = poll) for something to happen,
///   and says whether the round did work (moved bytes or completed something): an adaptive
///   waiter keeps spinning while rounds do. Only one thread calls it at a time. `wake` makes a
///   blocked `progress` return early.
/// * Instead of blocking in `progress`, a caller may sleep on `event_fd`: `arm` prepares that
///   (or says work is due), `poll_events` is the round it runs when the descriptor is readable.
/// * A lost peer fails every op addressed to it once with [`Error::PeerLost`] and frees its
///   buffers, credits, exposures' in-flight accesses and registrations.
pub(crate) trait Backend: Send + Sync {
    fn scheme(&self) -> Scheme;
    fn local_addr(&self) -> Option<Address>;
    fn connect(&self, addr: &Address) -> Result<PeerId>;
    fn peer_addr(&self, peer: PeerId) -> Option<Address>;
    fn post(&self, op: OpId, cmd: Cmd) -> Result<()>;
    fn cancel(&self, op: OpId, why: Error);
    /// Whether the client of open request `req` from `peer` has cancelled it (its notice has
    /// arrived); false for a request that is not open.
    fn request_cancelled(&self, peer: PeerId, req: u64) -> bool;
    fn progress(&self, timeout: Duration) -> Result<bool>;
    fn wake(&self);
    /// The descriptor that is readable while `progress` has events to collect: the backend's
    /// epoll instance (kqueue outside Linux), which lists its sockets, completion channel and
    /// `wake`'s waker.
    fn event_fd(&self) -> BorrowedFd<'_>;
    /// Prepares for a caller to sleep on [`Backend::event_fd`]: writes what is queued, asks
    /// for completion-channel events, and until the next round makes posts act as they do
    /// while a driver sleeps (write at once; wake). False: work is due already (run
    /// `poll_events` first). True: every later event makes the descriptor readable.
    fn arm(&self) -> Result<bool>;
    /// One non-blocking round that collects what the descriptor reported (no direct socket
    /// reads that bypass epoll, no giving up the CPU), ending an `arm`.
    fn poll_events(&self) -> Result<bool>;
    /// Whether a timer runs (a handshake, a stalled transmission, a transfer cancelled within
    /// its grace period): an armed caller must then run a round within the timer period even
    /// if nothing else happens.
    fn timers_pending(&self) -> bool;
    /// The application took an unexpected message of `bytes` from `peer` off the queue.
    fn unexpected_taken(&self, peer: PeerId, bytes: usize);
    fn alloc(&self, len: usize) -> Result<RegisteredBuf>;
    fn expose(&self, buf: RegisteredBuf, access: Access) -> Result<MemHandle>;
    fn revoke(&self, key: u64) -> Result<RegisteredBuf>;
    fn with_exposed(&self, key: u64, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    fn info(&self, info: &mut Info);
    /// Drops cached registrations overlapping `[addr, addr + len)`; how many.
    fn invalidate(&self, _addr: usize, _len: usize) -> usize {
        0
    }
    /// Closes the transport: every pending operation completes once with [`Error::Closed`],
    /// connections and the listener close, and later posts fail with [`Error::Closed`].
    fn shutdown(&self);
}

//! The [`Endpoint`]: operation table, completion queue, deadlines, cancellation, progress and
//! wait modes — everything that is the same whatever the transport.
//!
//! A backend (`tcp`, `ib`) implements the crate-private [`Backend`] contract: it accepts
//! commands, moves bytes, and reports every operation's completion exactly once to the shared
//! [`Core`]. The endpoint layer owns op ids, deadlines and waiting.
//!
//! # Progress
//!
//! Progress is explicit (BMI style): threads inside [`Endpoint::wait`], [`Endpoint::test`],
//! [`Endpoint::wait_any`], [`Endpoint::recv_unexpected`] and [`Endpoint::next_request`] drive
//! the transport. At most one thread drives at a time; the others wait on a condition variable
//! (or spin, in [`WaitMode::Spin`]) and are woken whenever a round of progress completes
//! anything. With [`Config::progress_thread`] a background thread drives instead.

use std::cell::Cell;
use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustc_hash::FxHashMap as HashMap;

use crate::addr::{Address, Scheme};
use crate::buf::{OpBuf, RecvBuf, RegisteredBuf, SendBuf};
use crate::comm::Mechanism;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::info::{Counters, Info};
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard};
use crate::types::{Access, OpId, PeerId, ServiceLevel, Tag, WaitMode};

/// Longest a driver blocks in one round, so deadlines and shutdown are noticed.
const MAX_BLOCK: Duration = Duration::from_millis(200);

/// What kind of operation completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Endpoint::send`].
    Send,
    /// [`Endpoint::send_unexpected`].
    SendUnexpected,
    /// [`Endpoint::recv`].
    Recv,
    /// [`Endpoint::put`].
    Put,
    /// [`Endpoint::get`].
    Get,
    /// [`Endpoint::request`] (client side).
    Request,
    /// [`Request::pull_into`] (server side).
    Pull,
    /// [`Request::push_from`] (server side).
    Push,
    /// [`Request::reply`] (server side).
    Reply,
}

/// The outcome of an operation, with its buffer handed back.
#[derive(Debug)]
pub struct Completion {
    /// The operation.
    pub op: OpId,
    /// What it was.
    pub kind: OpKind,
    /// The peer it addressed.
    pub peer: PeerId,
    /// Its tag (0 for one-sided operations).
    pub tag: Tag,
    /// The bytes moved (see [`Completion::len`]), or why it failed.
    pub result: Result<usize>,
    /// The buffer the operation carried (always returned, also on error).
    pub buf: OpBuf,
    /// For requests: the reply header sent by the server.
    pub reply: Option<Bytes>,
    /// The mechanism that moved the data, when there was data.
    pub mechanism: Option<Mechanism>,
}

impl Completion {
    pub(crate) fn new(op: OpId, kind: OpKind, peer: PeerId, tag: Tag) -> Self {
        Completion { op, kind, peer, tag, result: Ok(0), buf: OpBuf::None, reply: None, mechanism: None }
    }

    /// True when the operation succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    /// The byte count, or the error (the buffer is dropped on error; match on `result` to
    /// keep it).
    pub fn ok(self) -> Result<Completion> {
        match self.result {
            Ok(_) => Ok(self),
            Err(e) => Err(e),
        }
    }

    /// The bytes the operation moved (0 on error), the same on every transport, mechanism and
    /// buffer kind:
    ///
    /// - send, put, push: the bytes sent, written or pushed;
    /// - receive: the message's length (the buffer may be larger);
    /// - get: the requested length (the local buffer's);
    /// - pull: the bytes pulled (the buffer's length);
    /// - request with an IN payload: the end of the furthest byte the server pushed, so pushes
    ///   at 0..1000 and 5000..6000 count 6000 (the server may write in any order and leave
    ///   holes). Past the end the buffer is as the caller passed it, and so are the holes,
    ///   except where InfiniBand staged the read through its pool because it could not
    ///   register the buffer (scatter lists of many pieces): there the holes are unspecified,
    ///   since the server's RDMA writes are invisible to the client and keeping them would mean
    ///   copying the whole buffer in before every such read;
    /// - request with an OUT payload: its whole length, however much of it the server pulled
    ///   (small payloads travel whole with the request); the server's reply says what it used;
    /// - request without payload, reply: 0.
    pub fn len(&self) -> usize {
        *self.result.as_ref().unwrap_or(&0)
    }

    /// True when no bytes moved.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first [`len`](Completion::len) bytes of the receive buffer (a receive, get, pull or
    /// read request), as `Bytes`: exactly the bytes the operation brought, holes between a
    /// read's pushes included. Copies them; `None` for operations without a receive buffer.
    pub fn data(&self) -> Option<Bytes> {
        match &self.buf {
            OpBuf::Recv(RecvBuf::Mut(b)) => Some(Bytes::copy_from_slice(&b[..self.len().min(b.len())])),
            OpBuf::Recv(r) => Some(r.to_bytes(self.len())),
            _ => None,
        }
    }
}

/// An unexpected message (sent with [`Endpoint::send_unexpected`]).
#[derive(Debug, Clone)]
pub struct Unexpected {
    /// Sender.
    pub peer: PeerId,
    /// Tag.
    pub tag: Tag,
    /// Service level it travelled on.
    pub sl: ServiceLevel,
    /// Contents.
    pub data: Bytes,
}

/// A request's payload, chosen by the client.
#[derive(Debug)]
pub enum Payload {
    /// Header only.
    None,
    /// Data the server will pull (a write).
    Out(SendBuf),
    /// A buffer the server will push into (a read).
    In(RecvBuf),
}

/// Direction of a request's payload as seen by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// No payload.
    None,
    /// The client offers `len` bytes to pull.
    Out,
    /// The client has a `len`-byte buffer to push into.
    In,
}

/// Reply status codes on the wire.
pub(crate) mod status {
    pub const OK: u32 = 0;
    /// The server dropped the request without replying.
    pub const DROPPED: u32 = 1;
    /// The server replied with an error message as the header.
    pub const ERROR: u32 = 2;
}

/// What a backend knows about an incoming request.
#[derive(Debug)]
pub(crate) struct RequestMeta {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub id: u64,
    pub header: Bytes,
    pub dir: Direction,
    pub len: u64,
}

/// A command handed to a backend, carrying its buffers.
#[derive(Debug)]
pub(crate) enum Cmd {
    Send { peer: PeerId, tag: Tag, sl: ServiceLevel, buf: SendBuf, unexpected: bool },
    Recv { peer: PeerId, tag: Tag, buf: RecvBuf },
    Put { peer: PeerId, sl: ServiceLevel, local: SendBuf, remote: MemHandle },
    Get { peer: PeerId, sl: ServiceLevel, local: RecvBuf, remote: MemHandle },
    Request { peer: PeerId, tag: Tag, sl: ServiceLevel, header: Bytes, payload: Payload },
    Pull { peer: PeerId, req: u64, sl: ServiceLevel, offset: u64, buf: RecvBuf },
    Push { peer: PeerId, req: u64, sl: ServiceLevel, offset: u64, buf: SendBuf },
    Reply { peer: PeerId, req: u64, sl: ServiceLevel, header: Bytes, status: u32 },
}

impl Cmd {
    /// The peer the command addresses.
    pub(crate) fn peer(&self) -> PeerId {
        match self {
            Cmd::Send { peer, .. }
            | Cmd::Recv { peer, .. }
            | Cmd::Put { peer, .. }
            | Cmd::Get { peer, .. }
            | Cmd::Request { peer, .. }
            | Cmd::Pull { peer, .. }
            | Cmd::Push { peer, .. }
            | Cmd::Reply { peer, .. } => *peer,
        }
    }

    /// What its completion needs if it fails as posted: its kind, peer, tag and buffer.
    pub(crate) fn into_parts(self) -> (OpKind, PeerId, Tag, OpBuf) {
        match self {
            Cmd::Send { peer, tag, buf, unexpected, .. } => {
                (if unexpected { OpKind::SendUnexpected } else { OpKind::Send }, peer, tag, OpBuf::Send(buf))
            }
            Cmd::Recv { peer, tag, buf } => (OpKind::Recv, peer, tag, OpBuf::Recv(buf)),
            Cmd::Put { peer, local, .. } => (OpKind::Put, peer, 0, OpBuf::Send(local)),
            Cmd::Get { peer, local, .. } => (OpKind::Get, peer, 0, OpBuf::Recv(local)),
            Cmd::Request { peer, tag, payload, .. } => {
                let buf = match payload {
                    Payload::None => OpBuf::None,
                    Payload::Out(b) => OpBuf::Send(b),
                    Payload::In(b) => OpBuf::Recv(b),
                };
                (OpKind::Request, peer, tag, buf)
            }
            Cmd::Pull { peer, buf, .. } => (OpKind::Pull, peer, 0, OpBuf::Recv(buf)),
            Cmd::Push { peer, buf, .. } => (OpKind::Push, peer, 0, OpBuf::Send(buf)),
            Cmd::Reply { peer, .. } => (OpKind::Reply, peer, 0, OpBuf::None),
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
///   op and later calls [`Core::complete`] for it exactly once — possibly before `post`
///   returns.
/// * `cancel` asks for an op to end with the given error; if it already completed, nothing
///   happens. An unmatched receive ends at once; an in-flight transfer is aborted cleanly or its
///   connection is failed.
/// * `progress` moves bytes, waiting at most `timeout` (zero = poll) for something to happen,
///   and says whether the round did work (moved bytes or completed something): an adaptive
///   waiter keeps spinning while rounds do. Only one thread calls it at a time. `wake` makes a
///   blocked `progress` return early.
/// * A lost peer fails every op addressed to it once with [`Error::PeerLost`] and frees its
///   buffers, credits, exposures' in-flight accesses and registrations.
pub(crate) trait Backend: Send + Sync {
    fn scheme(&self) -> Scheme;
    fn local_addr(&self) -> Option<Address>;
    fn connect(&self, addr: &Address) -> Result<PeerId>;
    fn peer_addr(&self, peer: PeerId) -> Option<Address>;
    fn post(&self, op: OpId, cmd: Cmd) -> Result<()>;
    fn cancel(&self, op: OpId, why: Error);
    fn progress(&self, timeout: Duration) -> Result<bool>;
    fn wake(&self);
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
    fn shutdown(&self);
}

/// An operation between `post` and being reaped: one table entry for its whole life, so each
/// step is one hash lookup.
#[derive(Debug)]
enum Slot {
    /// Not completed yet. `detached`: nobody will reap it (its completion is dropped).
    Pending { deadline: Option<Instant>, detached: bool },
    /// Completed, waiting for `wait` / `test` / `wait_any`.
    Done(Completion),
}

#[derive(Debug, Default)]
struct CoreState {
    ops: HashMap<OpId, Slot>,
    deadlines: BTreeSet<(Instant, OpId)>,
    /// Completion order, for `wait_any`. Ops reaped by id stay listed until skipped or
    /// compacted away (see [`Core::complete_locked`]): at most twice `done` plus 1024.
    done_order: VecDeque<OpId>,
    /// `Done` slots in `ops`.
    done: usize,
    unexpected: VecDeque<Unexpected>,
    requests: VecDeque<RequestMeta>,
    driving: bool,
    /// Threads asleep while another drives, each on a condition variable of its own with what
    /// it waits for, so an event wakes only the thread it concerns: a wake-up costs a futex
    /// call and a context switch, and the thread woken for nothing pays both again to sleep.
    sleepers: Vec<Sleeper>,
}

/// What a waiting thread waits for (see [`CoreState::sleepers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// One operation's completion.
    Op(OpId),
    /// Any completion (`wait_any`).
    AnyOp,
    /// An unexpected message.
    Unexpected,
    /// A request.
    Request,
    /// Nothing in particular: only a timeout or a hand-over ends its sleep.
    Nothing,
}

#[derive(Debug)]
struct Sleeper {
    want: Want,
    cv: Arc<Condvar>,
}

impl CoreState {
    /// Wakes the sleepers waiting for `hit`.
    fn wake(&self, hit: impl Fn(Want) -> bool) {
        for s in self.sleepers.iter().filter(|s| hit(s.want)) {
            s.cv.notify_one();
        }
    }
}

/// Completion table shared between the endpoint and its backend.
#[derive(Debug, Default)]
pub(crate) struct Core {
    st: Mutex<CoreState>,
    next_op: AtomicU64,
    /// Something was queued by a thread other than the driver while the driver may be blocked
    /// in the backend: the endpoint call that caused it wakes the backend on its way out.
    kick: AtomicBool,
    pub(crate) counters: Counters,
    /// Called whenever a request is queued for `next_request` (see [`Endpoint::on_request`]).
    request_hook: OnceLock<RequestHook>,
}

/// The callback of [`Endpoint::on_request`].
struct RequestHook(Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for RequestHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestHook")
    }
}

// True on the thread inside `Backend::progress`: what it queues, it sees itself.
#[cfg(not(all(loom, test)))]
std::thread_local!(static DRIVING: Cell<bool> = const { Cell::new(false) });
#[cfg(all(loom, test))]
loom::thread_local!(static DRIVING: Cell<bool> = Cell::new(false));

impl Core {
    fn lock(&self) -> MutexGuard<'_, CoreState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, detached: bool) -> OpId {
        let op = OpId(self.next_op.fetch_add(1, Ordering::Relaxed) + 1);
        self.lock().ops.insert(op, Slot::Pending { deadline: None, detached });
        op
    }

    fn unregister(&self, op: OpId) {
        let mut st = self.lock();
        if let Some(Slot::Pending { deadline: Some(d), .. }) = st.ops.remove(&op) {
            st.deadlines.remove(&(d, op));
        }
    }

    /// Records a completion. A second completion for the same op is a backend bug: it is
    /// logged and dropped, so callers still see exactly one.
    #[allow(dead_code)] // used by the InfiniBand engine
    pub(crate) fn complete(&self, c: Completion) {
        let mut st = self.lock();
        self.complete_locked(&mut st, c);
    }

    /// Wakes every sleeper (a driver that panicked: someone must take over).
    fn wake_all(st: &CoreState) {
        st.wake(|_| true);
    }

    /// A waiter leaves the wait loop: if nobody drives and others sleep, wake one of them to
    /// take over. Whoever it wakes either drives or, its own wait being over, leaves and hands
    /// over in turn, so a sleeper is never left without a driver.
    fn hand_over(st: &CoreState) {
        if !st.driving
            && let Some(s) = st.sleepers.first()
        {
            s.cv.notify_one();
        }
    }

    /// Records several completions under one lock.
    pub(crate) fn complete_all(&self, cs: impl IntoIterator<Item = Completion>) {
        let mut st = self.lock();
        for c in cs {
            self.complete_locked(&mut st, c);
        }
    }

    fn complete_locked(&self, st: &mut CoreState, c: Completion) {
        let op = c.op;
        let Some(slot) = st.ops.get_mut(&op) else {
            tracing::error!(%op, kind = ?c.kind, "completion for an unknown operation dropped");
            debug_assert!(false, "operation {op} completed but never posted");
            return;
        };
        let Slot::Pending { deadline, detached } = *slot else {
            tracing::error!(%op, kind = ?c.kind, "second completion for an operation dropped");
            debug_assert!(false, "operation {op} completed twice");
            return;
        };
        Counters::add(&self.counters.ops_completed, 1);
        if matches!(c.result, Err(Error::Cancelled | Error::Timeout)) {
            Counters::add(&self.counters.ops_cancelled, 1);
        }
        if detached {
            if let Err(e) = &c.result {
                tracing::debug!(%op, error = %e, "detached operation failed");
            }
            st.ops.remove(&op);
        } else {
            *slot = Slot::Done(c);
            st.wake(|w| w == Want::Op(op) || w == Want::AnyOp);
            st.done += 1;
            st.done_order.push_back(op);
            if st.done_order.len() > 2 * st.done + 1024 {
                // Mostly ids already reaped by `wait(op)`: keep the order list bounded.
                let CoreState { ops, done_order, .. } = st;
                done_order.retain(|o| matches!(ops.get(o), Some(Slot::Done(_))));
            }
        }
        if let Some(d) = deadline {
            st.deadlines.remove(&(d, op));
        }
        if !detached {
            self.note_queued(st);
        }
    }

    /// A completion, message or request was queued: if a driver may be blocked in the backend
    /// and this is not it, ask for a wake-up (see [`Endpoint::kick_driver`]).
    fn note_queued(&self, st: &CoreState) {
        if st.driving && !DRIVING.with(Cell::get) {
            self.kick.store(true, Ordering::Release);
        }
    }

    /// Queues an unexpected message for [`Endpoint::recv_unexpected`].
    pub(crate) fn push_unexpected(&self, u: Unexpected) {
        let mut st = self.lock();
        st.unexpected.push_back(u);
        self.note_queued(&st);
        st.wake(|w| w == Want::Unexpected);
    }

    /// Queues an incoming request for [`Endpoint::next_request`].
    pub(crate) fn push_request(&self, r: RequestMeta) {
        {
            let mut st = self.lock();
            st.requests.push_back(r);
            self.note_queued(&st);
            st.wake(|w| w == Want::Request);
        }
        if let Some(h) = self.request_hook.get() {
            (h.0)();
        }
    }

    /// Drops queued requests of a lost peer: they can no longer be answered. Unexpected
    /// messages arrived whole and stay deliverable.
    pub(crate) fn forget_peer(&self, peer: PeerId) {
        self.lock().requests.retain(|r| r.peer != peer);
    }

    /// The completion of `op` if it is done (`Some(Ok)`), `None` while it is pending, or
    /// `Some(Err)` if no such operation exists (never posted, or already reaped).
    fn take(st: &mut CoreState, op: OpId) -> Option<Result<Completion>> {
        match st.ops.entry(op) {
            std::collections::hash_map::Entry::Occupied(e) => match e.get() {
                Slot::Pending { .. } => None,
                Slot::Done(_) => match e.remove() {
                    Slot::Done(c) => {
                        st.done -= 1;
                        // Usually the newest (or oldest) completion: unlist it at no cost.
                        if st.done_order.back() == Some(&op) {
                            st.done_order.pop_back();
                        } else if st.done_order.front() == Some(&op) {
                            st.done_order.pop_front();
                        }
                        Some(Ok(c))
                    }
                    Slot::Pending { .. } => unreachable!("checked above"),
                },
            },
            std::collections::hash_map::Entry::Vacant(_) => {
                Some(Err(Error::misuse(format!("{op} is not a pending operation (already reaped?)"))))
            }
        }
    }

    fn take_any(st: &mut CoreState) -> Option<Completion> {
        while let Some(op) = st.done_order.pop_front() {
            if let Some(Ok(c)) = Self::take(st, op) {
                return Some(c);
            }
        }
        None
    }

    /// Whether `op` is pending (`Some(true)`), done but not reaped (`Some(false)`), or unknown.
    fn is_pending(st: &CoreState, op: OpId) -> Option<bool> {
        st.ops.get(&op).map(|s| matches!(s, Slot::Pending { .. }))
    }

    fn next_deadline(st: &CoreState) -> Option<Instant> {
        st.deadlines.first().map(|(d, _)| *d)
    }

    fn expired(&self, now: Instant) -> Vec<OpId> {
        let st = self.lock();
        st.deadlines.iter().take_while(|(d, _)| *d <= now).map(|(_, op)| *op).collect()
    }
}

/// Anything that names an address: `&str`, `String`, `Address`.
pub trait ToAddress {
    /// Parses or clones into an [`Address`].
    fn to_address(&self) -> Result<Address>;
}
impl ToAddress for str {
    fn to_address(&self) -> Result<Address> {
        Ok(self.parse()?)
    }
}
impl ToAddress for String {
    fn to_address(&self) -> Result<Address> {
        Ok(self.parse()?)
    }
}
impl ToAddress for Address {
    fn to_address(&self) -> Result<Address> {
        Ok(self.clone())
    }
}
impl<T: ToAddress + ?Sized> ToAddress for &T {
    fn to_address(&self) -> Result<Address> {
        (**self).to_address()
    }
}

struct Inner {
    cfg: Config,
    core: Arc<Core>,
    backend: OnceLock<Box<dyn Backend>>,
    init: Mutex<()>,
    stop: Arc<AtomicBool>,
    progress: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(b) = self.backend.get() {
            b.shutdown();
        }
    }
}

/// A communication endpoint. Cheap to clone (shared); `Send + Sync`.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.inner.backend.get();
        f.debug_struct("Endpoint")
            .field("scheme", &b.map(|b| b.scheme()))
            .field("local_addr", &b.and_then(|b| b.local_addr()))
            .finish()
    }
}

impl Endpoint {
    /// A server endpoint listening on `addr` (port 0 picks a free port; see
    /// [`Endpoint::local_addr`]).
    ///
    /// # Errors
    /// Address errors, an invalid [`Config`], or the OS refusing the listening socket.
    pub fn bind(addr: impl ToAddress, cfg: Config) -> Result<Endpoint> {
        let addr = addr.to_address()?;
        cfg.validate()?;
        let ep = Endpoint::new(cfg);
        let backend = make_backend(&addr, Some(&addr), &ep.inner.cfg, ep.inner.core.clone())?;
        let _ = ep.inner.backend.set(backend);
        ep.start_progress_thread();
        Ok(ep)
    }

    /// A client-only endpoint: it does not listen; its transport is chosen by the first
    /// [`Endpoint::connect`].
    pub fn client(cfg: Config) -> Result<Endpoint> {
        cfg.validate()?;
        Ok(Endpoint::new(cfg))
    }

    fn new(cfg: Config) -> Endpoint {
        Endpoint {
            inner: Arc::new(Inner {
                cfg,
                core: Arc::new(Core::default()),
                backend: OnceLock::new(),
                init: Mutex::new(()),
                stop: Arc::new(AtomicBool::new(false)),
                progress: Mutex::new(None),
            }),
        }
    }

    fn start_progress_thread(&self) {
        if !self.inner.cfg.progress_thread {
            return;
        }
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let stop = self.inner.stop.clone();
        let h = std::thread::Builder::new()
            .name("ionet-progress".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(inner) = weak.upgrade() else { break };
                    let ep = Endpoint { inner };
                    // Wait for nothing in particular: drive until the round ends.
                    let _ = ep.wait_until(
                        Until::At(Instant::now() + MAX_BLOCK),
                        Want::Nothing,
                        |_| None::<()>,
                        true,
                    );
                }
            })
            .ok();
        *self.inner.progress.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    fn backend(&self) -> Result<&dyn Backend> {
        self.inner
            .backend
            .get()
            .map(|b| &**b)
            .ok_or_else(|| Error::misuse("client endpoint has no peer yet: call connect first"))
    }

    /// Looks up a peer and returns its id. Connections are opened lazily, one per service
    /// level, on first use; the address is resolved now.
    ///
    /// # Errors
    /// Address errors; [`Error::Unsupported`] for a transport other than this endpoint's.
    pub fn connect(&self, addr: impl ToAddress) -> Result<PeerId> {
        let addr = addr.to_address()?;
        if self.inner.backend.get().is_none() {
            let _g = self.inner.init.lock().unwrap_or_else(|p| p.into_inner());
            if self.inner.backend.get().is_none() {
                let b = make_backend(&addr, None, &self.inner.cfg, self.inner.core.clone())?;
                let _ = self.inner.backend.set(b);
                self.start_progress_thread();
            }
        }
        let b = self.backend()?;
        if b.scheme() != addr.scheme() {
            return Err(Error::Unsupported(format!(
                "this endpoint speaks {}; use another endpoint for {}",
                b.scheme(),
                addr.scheme()
            )));
        }
        b.connect(&addr)
    }

    /// The listening address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> Option<Address> {
        self.inner.backend.get().and_then(|b| b.local_addr())
    }

    /// The address a peer was connected to, when known.
    pub fn peer_addr(&self, peer: PeerId) -> Option<Address> {
        self.inner.backend.get().and_then(|b| b.peer_addr(peer))
    }

    fn post(&self, cmd: Cmd) -> Result<OpId> {
        self.post_detached(cmd, false)
    }

    fn post_detached(&self, cmd: Cmd, detached: bool) -> Result<OpId> {
        let b = self.backend()?;
        let op = self.inner.core.register(detached);
        let r = b.post(op, cmd);
        self.kick_driver(b);
        match r {
            Ok(()) => Ok(op),
            Err(e) => {
                self.inner.core.unregister(op);
                Err(e)
            }
        }
    }

    /// Sends a tagged message, matched by the peer's [`Endpoint::recv`] on (this endpoint,
    /// tag). `buf` is a `Bytes`, a `Vec<Bytes>` gather list, or a [`RegisteredBuf`].
    ///
    /// # Errors
    /// [`Error::TooLarge`] above `max_message`; unknown peer. On error the buffer is dropped.
    pub fn send(&self, peer: PeerId, tag: Tag, buf: impl Into<SendBuf>, sl: ServiceLevel) -> Result<OpId> {
        self.post(Cmd::Send { peer, tag, sl, buf: buf.into(), unexpected: false })
    }

    /// Sends a message no receive will be posted for; the peer gets it from
    /// [`Endpoint::recv_unexpected`]. At most the eager limit.
    pub fn send_unexpected(
        &self,
        peer: PeerId,
        tag: Tag,
        buf: impl Into<SendBuf>,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.post(Cmd::Send { peer, tag, sl, buf: buf.into(), unexpected: true })
    }

    /// Posts a receive for the next message from `peer` with `tag`. `buf` is a `BytesMut`
    /// (its current length is the capacity), a `Vec<BytesMut>` scatter list, or a
    /// [`RegisteredBuf`]. A larger message fails the receive with [`Error::Truncated`].
    pub fn recv(&self, peer: PeerId, tag: Tag, buf: impl Into<RecvBuf>) -> Result<OpId> {
        self.post(Cmd::Recv { peer, tag, buf: buf.into() })
    }

    /// Writes `local` into the peer's exposed memory `remote` (RDMA write; emulated and
    /// validated by the target on TCP). Completes when the target has the data.
    pub fn put(
        &self,
        peer: PeerId,
        local: impl Into<SendBuf>,
        remote: MemHandle,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.post(Cmd::Put { peer, sl, local: local.into(), remote })
    }

    /// Reads the peer's exposed memory `remote` into `local` (RDMA read).
    pub fn get(
        &self,
        peer: PeerId,
        local: impl Into<RecvBuf>,
        remote: MemHandle,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.post(Cmd::Get { peer, sl, local: local.into(), remote })
    }

    /// Sends a request with a header and an optional payload. The server sees it through
    /// [`Endpoint::next_request`] and moves the payload with [`Request::pull_into`] /
    /// [`Request::push_from`]; the communication manager picks the mechanism. Completes when the
    /// server replies, with the reply header in [`Completion::reply`].
    pub fn request(
        &self,
        peer: PeerId,
        tag: Tag,
        header: impl Into<Bytes>,
        payload: Payload,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.post(Cmd::Request { peer, tag, sl, header: header.into(), payload })
    }

    /// Sets or moves an operation's deadline: if it has not completed by `at`, it is cancelled
    /// with [`Error::Timeout`]. No effect on completed operations.
    pub fn set_deadline(&self, op: OpId, at: Instant) -> Result<()> {
        let mut guard = self.inner.core.lock();
        let st = &mut *guard;
        match st.ops.get_mut(&op) {
            Some(Slot::Pending { deadline, .. }) => {
                let old = deadline.replace(at);
                if let Some(old) = old {
                    st.deadlines.remove(&(old, op));
                }
                st.deadlines.insert((at, op));
                let driving = st.driving;
                drop(guard);
                if driving && let Some(b) = self.inner.backend.get() {
                    b.wake();
                }
                Ok(())
            }
            Some(Slot::Done(_)) => Ok(()),
            None => Err(Error::misuse(format!("{op} is not a pending operation"))),
        }
    }

    /// Asks for an operation to be cancelled. It then completes (once) with
    /// [`Error::Cancelled`] — or normally, if it finished first.
    pub fn cancel(&self, op: OpId) -> Result<()> {
        match Core::is_pending(&self.inner.core.lock(), op) {
            Some(true) => {}
            Some(false) => return Ok(()),
            None => return Err(Error::misuse(format!("{op} is not a pending operation"))),
        }
        let b = self.backend()?;
        b.cancel(op, Error::Cancelled);
        self.kick_driver(b);
        Ok(())
    }

    /// Wakes a driver blocked in the backend when this thread queued something for it to
    /// return (a send that completed inside `post`, a cancelled receive, data read after an
    /// unstall): without it, the waiter would notice only when its bounded block ends.
    /// (A TCP driver in a direct wait, one blocking `recv`, cannot be woken: it returns within
    /// the receive timeout, 5 ms, and the wake-up sends its next rounds through epoll.)
    fn kick_driver(&self, b: &dyn Backend) {
        let kick = &self.inner.core.kick;
        if kick.load(Ordering::Relaxed) && kick.swap(false, Ordering::AcqRel) {
            b.wake();
        }
    }

    /// Drives progress once without blocking and returns the completion if the operation is
    /// done.
    pub fn test(&self, op: OpId) -> Result<Option<Completion>> {
        self.wait_until(Until::Poll, Want::Op(op), |st| Core::take(st, op), false)?.transpose()
    }

    /// Waits until the operation completes.
    pub fn wait(&self, op: OpId) -> Result<Completion> {
        self.wait_until(Until::Never, Want::Op(op), |st| Core::take(st, op), false)?.ok_or(Error::Closed)?
    }

    /// Waits up to `timeout` for the operation; `None` if it is still pending (it is *not*
    /// cancelled — use [`Endpoint::set_deadline`] for that).
    pub fn wait_timeout(&self, op: OpId, timeout: Duration) -> Result<Option<Completion>> {
        self.wait_until(Until::Within(timeout), Want::Op(op), |st| Core::take(st, op), false)?.transpose()
    }

    /// Waits up to `timeout` (forever with `None`) for any operation to complete, oldest
    /// completion first.
    pub fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        self.wait_until(Until::after(timeout), Want::AnyOp, Core::take_any, false)
    }

    /// Waits up to `timeout` (forever with `None`) for an unexpected message.
    pub fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>> {
        let u =
            self.wait_until(Until::after(timeout), Want::Unexpected, |st| st.unexpected.pop_front(), false)?;
        if let Some(u) = &u {
            let b = self.backend()?;
            b.unexpected_taken(u.peer, u.data.len());
            self.kick_driver(b);
        }
        Ok(u)
    }

    /// Calls `f` each time a request is queued for [`Endpoint::next_request`], on whichever
    /// thread is driving progress at that moment — so keep it short, and do not call back into
    /// this endpoint from it. A server's own worker pool uses it to wake an idle worker when a
    /// request arrives while its other workers are busy serving (their progress queues it).
    /// One hook per endpoint: a second call is refused.
    pub fn on_request(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        self.inner
            .core
            .request_hook
            .set(RequestHook(Box::new(f)))
            .map_err(|_| Error::misuse("the endpoint already has a request hook"))
    }

    /// Waits up to `timeout` (forever with `None`) for the next incoming request. A zero
    /// timeout looks once without blocking (driving progress one round if no other thread is).
    pub fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>> {
        let meta =
            self.wait_until(Until::after(timeout), Want::Request, |st| st.requests.pop_front(), false)?;
        Ok(meta.map(|meta| Request { ep: self.clone(), meta, answered: false }))
    }

    /// The waiting loop shared by every blocking call: check, else drive progress (if nobody
    /// else is), else wait for whoever drives.
    ///
    /// The clock is read only when a bound needs it (a deadline, an adaptive spin budget): on
    /// the reference VM a clock read costs as much as a spin round's work.
    fn wait_until<T>(
        &self,
        until: Until,
        want: Want,
        mut check: impl FnMut(&mut CoreState) -> Option<T>,
        is_progress_thread: bool,
    ) -> Result<Option<T>> {
        let core = &self.inner.core;
        let Some(backend) = self.inner.backend.get() else {
            return Err(Error::misuse("client endpoint has no peer yet: call connect first"));
        };
        let mode = self.inner.cfg.wait_mode;
        let needs_clock = matches!(until, Until::At(_) | Until::Within(_)) || mode == WaitMode::Adaptive;
        // Set from the first clock reading, taken only once the condition is found unmet: an
        // operation that is already done (a send completed inside `post`) costs no clock read.
        let mut spin_until = None;
        let mut until = until;
        let has_thread = self.inner.cfg.progress_thread && !is_progress_thread;
        let mut polled = false;
        let mut st = core.lock();
        // Every way out of the loop after looking for ourselves hands the driving over.
        let out = loop {
            if let Some(x) = check(&mut st) {
                break Ok(Some(x));
            }
            let now = needs_clock.then(Instant::now);
            if let Some(now) = now
                && spin_until.is_none()
            {
                spin_until = Some(now + self.inner.cfg.spin_budget);
                if let Until::Within(d) = until {
                    until = Until::At(now + d);
                }
            }
            match (until, now) {
                (Until::Poll, _) if polled => break Ok(None),
                (Until::At(u), Some(now)) if now >= u => break Ok(None),
                _ => {}
            }
            let spinning = match mode {
                WaitMode::Spin => true,
                WaitMode::Block => false,
                WaitMode::Adaptive => now.zip(spin_until).is_some_and(|(n, s)| n < s),
            };
            if st.driving || has_thread {
                // Someone else drives: nothing to hand over.
                if until == Until::Poll {
                    return Ok(None);
                }
                if spinning {
                    drop(st);
                    // Yield rather than spin: only the driver can complete our operation, and
                    // where it shares our CPU (more waiting threads than cores, as in a
                    // server's worker pool) a busy loop here takes the CPU it needs.
                    std::thread::yield_now();
                    st = core.lock();
                    continue;
                }
                let limit = now.map_or(MAX_BLOCK, |n| until.remaining(n)).min(MAX_BLOCK);
                // A condition variable of our own, so only what we wait for wakes us.
                let cv = Arc::new(Condvar::new());
                st.sleepers.push(Sleeper { want, cv: cv.clone() });
                let (g, _) = cv.wait_timeout(st, limit).unwrap_or_else(|p| p.into_inner());
                st = g;
                if let Some(i) = st.sleepers.iter().position(|s| Arc::ptr_eq(&s.cv, &cv)) {
                    st.sleepers.swap_remove(i);
                }
                Counters::add(&core.counters.waiter_wakeups, 1);
                continue;
            }
            // Nobody drives: become the driver for one round.
            let block = if spinning || until == Until::Poll {
                Duration::ZERO
            } else {
                let deadline = Core::next_deadline(&st);
                if until == Until::Never && deadline.is_none() {
                    MAX_BLOCK
                } else {
                    let now = now.unwrap_or_else(Instant::now);
                    let mut t = until.remaining(now).min(MAX_BLOCK);
                    if let Some(d) = deadline {
                        t = t.min(d.saturating_duration_since(now));
                    }
                    t
                }
            };
            let deadlines = !st.deadlines.is_empty();
            st.driving = true;
            drop(st);
            let guard = DriveGuard::start(core);
            let r = backend.progress(block);
            if deadlines {
                self.expire(&**backend);
            }
            polled = true;
            st = guard.finish();
            match r {
                Err(e) => break Err(e),
                // Work was done, so more is likely on its way (a transfer streaming in, the
                // rest of a reply): the spin budget counts from the last round that did work,
                // so an adaptive waiter polls through a transfer and blocks once it goes quiet.
                Ok(true) if mode == WaitMode::Adaptive => spin_until = None,
                Ok(_) => {}
            }
        };
        Core::hand_over(&st);
        out
    }

    fn expire(&self, backend: &dyn Backend) {
        let now = Instant::now();
        for op in self.inner.core.expired(now) {
            backend.cancel(op, Error::Timeout);
        }
    }

    /// A buffer from the endpoint's registered pool (BMI_memalloc): pre-faulted, and
    /// registered once on InfiniBand so transfers from it are zero-copy. Buffers of 64 KiB and
    /// more are carved from 2 MiB-aligned chunks backed by transparent huge pages where the
    /// kernel allows (`madvise` mode is enough), which makes one-sided copies and registration
    /// several times cheaper; [`crate::buf::PoolStats::chunks`] counts them.
    pub fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        self.backend()?.alloc(len)
    }

    /// Exposes a buffer for one-sided access by peers. The exposure owns the buffer until
    /// revoked (or dropped, which revokes).
    pub fn expose(&self, buf: RegisteredBuf, access: Access) -> Result<Exposure> {
        if buf.is_empty() {
            return Err(Error::misuse("cannot expose an empty buffer"));
        }
        let handle = self.backend()?.expose(buf, access)?;
        Ok(Exposure { ep: Arc::downgrade(&self.inner), handle, revoked: false })
    }

    /// Revokes an exposure and returns its buffer. Later accesses by peers fail with
    /// [`crate::AccessError::BadKey`].
    pub fn revoke(&self, mut x: Exposure) -> Result<RegisteredBuf> {
        x.revoked = true;
        self.backend()?.revoke(x.handle.key)
    }

    /// Runs `f` on the exposed bytes (local access by the owner, e.g. to read what peers put).
    pub fn with_exposed<R>(&self, x: &Exposure, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.backend()?.with_exposed(x.handle.key, &mut |s| {
            if let Some(f) = f.take() {
                out = Some(f(s));
            }
        })?;
        out.ok_or_else(|| Error::misuse("exposure not found"))
    }

    /// Forgets every cached registration that overlaps `mem`; returns how many. Needed only
    /// with [`crate::IbConfig::cache_foreign`] on, before the application frees or remaps
    /// memory it has sent from or received into (a registration still used by an operation
    /// in flight stays valid for it and is dropped when it ends). A no-op over TCP and for
    /// memory that was never registered.
    pub fn invalidate_registrations(&self, mem: &[u8]) -> usize {
        match self.backend() {
            Ok(b) => b.invalidate(mem.as_ptr() as usize, mem.len()),
            Err(_) => 0,
        }
    }

    /// Negotiated limits, policy and counters.
    pub fn info(&self) -> Info {
        let core = &self.inner.core;
        let pending = {
            let st = core.lock();
            st.ops.len() - st.done
        };
        let mut info = Info {
            scheme: Scheme::Tcp,
            local_addr: None,
            endpoint_id: 0,
            wait_mode: self.inner.cfg.wait_mode,
            eager_limit: 0,
            max_message: self.inner.cfg.max_message,
            max_header: self.inner.cfg.max_header,
            policy: self
                .inner
                .cfg
                .policy
                .clone()
                .unwrap_or_else(|| crate::comm::Policy::for_scheme(Scheme::Tcp)),
            credits: None,
            fast_slots: None,
            regcache: None,
            pool: Default::default(),
            peers_connected: 0,
            exposures: 0,
            pending_ops: pending,
            counters: core.counters.snapshot(),
            rdma: None,
            gauges: Default::default(),
        };
        if let Some(b) = self.inner.backend.get() {
            b.info(&mut info);
        }
        info
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }
}

/// How long a wait may last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// One non-blocking round.
    Poll,
    /// Until an instant.
    At(Instant),
    /// This long from the first time the condition is found unmet (becomes `At` then).
    Within(Duration),
    /// Until the condition holds.
    Never,
}

impl Until {
    fn after(timeout: Option<Duration>) -> Until {
        match timeout {
            // A zero timeout is one look, progress included: a caller that polls in a loop
            // with it must see the network, not only what another thread queued.
            Some(t) if t.is_zero() => Until::Poll,
            Some(t) => Until::Within(t),
            None => Until::Never,
        }
    }

    fn remaining(self, now: Instant) -> Duration {
        match self {
            Until::Poll => Duration::ZERO,
            Until::At(u) => u.saturating_duration_since(now),
            Until::Within(d) => d,
            Until::Never => MAX_BLOCK,
        }
    }
}

/// Clears the driving flag even if progress panics.
struct DriveGuard<'a>(&'a Core);

impl<'a> DriveGuard<'a> {
    fn start(core: &'a Core) -> Self {
        DRIVING.with(|d| d.set(true));
        DriveGuard(core)
    }

    /// Ends the round and returns the core lock, already held, to the caller.
    fn finish(self) -> MutexGuard<'a, CoreState> {
        let core = self.0;
        std::mem::forget(self);
        DRIVING.with(|d| d.set(false));
        let mut st = core.lock();
        st.driving = false;
        // No wake-up here: the driver goes on to check its own condition with the lock held,
        // and either drives again or leaves, handing the driving over then (see
        // [`Core::hand_over`]). Waking every sleeper at the end of each round made them all
        // run, find nothing, and sleep again — a futex call and a context switch apiece.
        st
    }
}

impl Drop for DriveGuard<'_> {
    fn drop(&mut self) {
        DRIVING.with(|d| d.set(false));
        let mut st = self.0.lock();
        st.driving = false;
        Core::wake_all(&st);
    }
}

fn make_backend(
    addr: &Address,
    bind: Option<&Address>,
    cfg: &Config,
    core: Arc<Core>,
) -> Result<Box<dyn Backend>> {
    match addr.scheme() {
        Scheme::Tcp => Ok(Box::new(crate::tcp::TcpBackend::new(bind, cfg, core)?)),
        Scheme::SoftIb | Scheme::Ib => crate::ib::make_backend(addr.scheme(), bind, cfg, core),
    }
}

/// Exposed memory: give [`Exposure::handle`] to peers for [`Endpoint::put`] / [`Endpoint::get`].
/// Dropping it revokes the exposure (and drops the buffer); [`Endpoint::revoke`] gives the
/// buffer back.
#[derive(Debug)]
pub struct Exposure {
    ep: Weak<Inner>,
    handle: MemHandle,
    revoked: bool,
}

impl Exposure {
    /// The handle to send to peers.
    pub fn handle(&self) -> MemHandle {
        self.handle
    }
}

impl Drop for Exposure {
    fn drop(&mut self) {
        if !self.revoked
            && let Some(inner) = self.ep.upgrade()
            && let Some(b) = inner.backend.get()
        {
            let _ = b.revoke(self.handle.key);
        }
    }
}

/// An incoming request, server side. Move its payload with [`Request::pull_into`] /
/// [`Request::push_from`], then [`Request::reply`]. Dropping it unanswered sends an error reply
/// so the client never hangs.
#[derive(Debug)]
pub struct Request {
    ep: Endpoint,
    meta: RequestMeta,
    answered: bool,
}

impl Request {
    /// The client.
    pub fn peer(&self) -> PeerId {
        self.meta.peer
    }
    /// The request's tag.
    pub fn tag(&self) -> Tag {
        self.meta.tag
    }
    /// Service level it arrived on (replies and payload use it too).
    pub fn sl(&self) -> ServiceLevel {
        self.meta.sl
    }
    /// The request header.
    pub fn header(&self) -> &Bytes {
        &self.meta.header
    }
    /// Payload direction.
    pub fn direction(&self) -> Direction {
        self.meta.dir
    }
    /// Payload length (bytes the client offers, or room it has).
    pub fn payload_len(&self) -> u64 {
        self.meta.len
    }
    /// The endpoint the request arrived on.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Pulls `buf.capacity()` bytes of the client's OUT payload starting at `offset` into
    /// `buf`. Several pulls may be outstanding (pipelining).
    ///
    /// Over TCP a payload may be streamed behind its request ([`Config::stream_requests`]): its
    /// bytes then arrive in order and go into the pulls that cover them, so pulls may come in
    /// any order and size but may not overlap, nor go back over bytes an earlier pull (or the
    /// answer) has already consumed; and until a pull covers the next byte, later messages
    /// from this client on this service level wait behind the payload.
    pub fn pull_into(&self, buf: impl Into<RecvBuf>, offset: u64) -> Result<OpId> {
        let buf = buf.into();
        if self.meta.dir != Direction::Out {
            return Err(Error::misuse("pull_into on a request without an OUT payload"));
        }
        check_range(offset, buf.capacity() as u64, self.meta.len)?;
        self.ep.post(Cmd::Pull { peer: self.meta.peer, req: self.meta.id, sl: self.meta.sl, offset, buf })
    }

    /// Pushes `buf` into the client's IN buffer at `offset`.
    pub fn push_from(&self, buf: impl Into<SendBuf>, offset: u64) -> Result<OpId> {
        let buf = buf.into();
        if self.meta.dir != Direction::In {
            return Err(Error::misuse("push_from on a request without an IN payload"));
        }
        check_range(offset, buf.len() as u64, self.meta.len)?;
        self.ep.post(Cmd::Push { peer: self.meta.peer, req: self.meta.id, sl: self.meta.sl, offset, buf })
    }

    /// Ends the request with a reply header; the client's request op completes with it.
    pub fn reply(mut self, header: impl Into<Bytes>) -> Result<OpId> {
        self.answered = true;
        self.ep.post(Cmd::Reply {
            peer: self.meta.peer,
            req: self.meta.id,
            sl: self.meta.sl,
            header: header.into(),
            status: status::OK,
        })
    }

    /// Ends the request with a transport-level failure; the client's op fails with
    /// [`Error::Remote`] carrying `reason`.
    pub fn reply_error(mut self, reason: &str) -> Result<OpId> {
        self.answered = true;
        self.ep.post(Cmd::Reply {
            peer: self.meta.peer,
            req: self.meta.id,
            sl: self.meta.sl,
            header: Bytes::copy_from_slice(reason.as_bytes()),
            status: status::ERROR,
        })
    }
}

fn check_range(offset: u64, len: u64, total: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(Error::misuse(format!("range {offset}+{len} outside the {total}-byte payload"))),
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.ep.post_detached(
                Cmd::Reply {
                    peer: self.meta.peer,
                    req: self.meta.id,
                    sl: self.meta.sl,
                    header: Bytes::new(),
                    status: status::DROPPED,
                },
                true,
            );
        }
    }
}

/// The `Backend` methods the endpoint's test stand-ins do not model (memory, counters,
/// shutdown), shared by the loom model and the unit tests.
#[cfg(test)]
macro_rules! unmodelled_backend_methods {
    () => {
        fn unexpected_taken(&self, _: PeerId, _: usize) {}
        fn alloc(&self, _: usize) -> Result<RegisteredBuf> {
            Err(Error::misuse("not modelled"))
        }
        fn expose(&self, _: RegisteredBuf, _: Access) -> Result<MemHandle> {
            Err(Error::misuse("not modelled"))
        }
        fn revoke(&self, _: u64) -> Result<RegisteredBuf> {
            Err(Error::misuse("not modelled"))
        }
        fn with_exposed(&self, _: u64, _: &mut dyn FnMut(&mut [u8])) -> Result<()> {
            Err(Error::misuse("not modelled"))
        }
        fn info(&self, _: &mut Info) {}
        fn shutdown(&self) {}
    };
}

#[cfg(all(loom, test))]
#[path = "loom/endpoint.rs"]
mod loom_model;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn completion(op: OpId) -> Completion {
        Completion::new(op, OpKind::Send, PeerId(0), 0)
    }

    /// A backend whose progress rounds find nothing: each lasts until its timeout (at most
    /// 1 ms), as an epoll wait or a direct `recv` with a timeout does on a quiet network. With
    /// `busy` set, its first `busy` rounds instead each take `busy_round` and do work (a
    /// transfer streaming in). It records every round's timeout.
    #[derive(Debug, Default)]
    struct Quiet {
        rounds: std::sync::atomic::AtomicUsize,
        busy: usize,
        busy_round: Duration,
        timeouts: Mutex<Vec<Duration>>,
    }

    impl Backend for Arc<Quiet> {
        fn scheme(&self) -> Scheme {
            Scheme::Tcp
        }
        fn local_addr(&self) -> Option<Address> {
            None
        }
        fn connect(&self, _: &Address) -> Result<PeerId> {
            Ok(PeerId(0))
        }
        fn peer_addr(&self, _: PeerId) -> Option<Address> {
            None
        }
        fn post(&self, _: OpId, _: Cmd) -> Result<()> {
            Ok(())
        }
        fn cancel(&self, _: OpId, _: Error) {}
        fn progress(&self, timeout: Duration) -> Result<bool> {
            let mut t = self.timeouts.lock().unwrap();
            t.push(timeout);
            let busy = t.len() <= self.busy;
            drop(t);
            std::thread::sleep(if busy { self.busy_round } else { timeout.min(Duration::from_millis(1)) });
            self.rounds.fetch_add(1, Ordering::Relaxed);
            Ok(busy)
        }
        fn wake(&self) {}
        unmodelled_backend_methods!();
    }

    /// An adaptive waiter keeps polling while the rounds do work, even when that lasts longer
    /// than its spin budget, and blocks once a budget has passed without any.
    #[test]
    fn an_adaptive_waiter_spins_while_rounds_do_work() {
        let cfg = Config::default().wait_mode(WaitMode::Adaptive).spin_budget(Duration::from_millis(1));
        let ep = Endpoint::new(cfg);
        // Each busy round alone outlasts the budget.
        let b = Arc::new(Quiet { busy: 5, busy_round: Duration::from_millis(3), ..Quiet::default() });
        assert!(ep.inner.backend.set(Box::new(b.clone())).is_ok());
        let op = ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
        assert!(ep.wait_timeout(op, Duration::from_millis(40)).unwrap().is_none());
        let t = b.timeouts.lock().unwrap();
        // The five busy rounds, and the first round after them, poll.
        assert!(t.len() > 6, "{} rounds", t.len());
        assert!(t[..6].iter().all(Duration::is_zero), "a round during the transfer blocked: {:?}", &t[..6]);
        // Once quiet, the waiter blocks.
        assert!(t[6..].iter().any(|d| !d.is_zero()), "the waiter never blocked");
    }

    /// Three threads wait on their own receives: one drives, two sleep. A completion wakes only
    /// the sleeper that waits for it; the other sleeps on, untouched.
    #[test]
    fn a_completion_wakes_only_the_thread_waiting_for_it() {
        let ep = Endpoint::new(Config::default().wait_mode(WaitMode::Block));
        assert!(ep.inner.backend.set(Box::new(Arc::new(Quiet::default()))).is_ok());
        let recv = || ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
        let ops = [recv(), recv(), recv()];
        let started = Instant::now();
        let ep = &ep;
        std::thread::scope(|s| {
            let waiters: Vec<_> = ops.iter().map(|&op| (op, s.spawn(move || ep.wait(op).unwrap()))).collect();
            let asleep = || -> Vec<(OpId, Arc<Condvar>)> {
                let st = ep.inner.core.lock();
                st.sleepers
                    .iter()
                    .filter_map(|z| match z.want {
                        Want::Op(op) => Some((op, z.cv.clone())),
                        _ => None,
                    })
                    .collect()
            };
            while asleep().len() < 2 {
                std::thread::yield_now();
            }
            let sleepers = asleep();
            let (target, (other, other_cv)) = (sleepers[0].0, sleepers[1].clone());
            ep.inner.core.complete(Completion::new(target, OpKind::Recv, PeerId(0), 1));
            let mut waiters = waiters;
            let i = waiters.iter().position(|w| w.0 == target).unwrap();
            assert_eq!(waiters.remove(i).1.join().unwrap().op, target);
            // A sleeper that woke (for nothing) would have gone back to sleep on a new
            // condition variable. Its own MAX_BLOCK re-check cannot have come yet.
            let still = asleep().into_iter().find(|z| z.0 == other).map(|z| z.1);
            let untouched = still.is_some_and(|cv| Arc::ptr_eq(&cv, &other_cv));
            let in_time = started.elapsed() < MAX_BLOCK;
            // Let the others go before asserting: a failed assertion in the scope would wait
            // for them forever.
            for op in ops.iter().filter(|&&op| op != target) {
                ep.inner.core.complete(Completion::new(*op, OpKind::Recv, PeerId(0), 1));
            }
            for (op, w) in waiters {
                assert_eq!(w.join().unwrap().op, op);
            }
            assert!(untouched || !in_time, "the other sleeper was woken");
        });
    }

    /// Two threads wait on their own receives: one drives, the other sleeps. The driver's
    /// empty rounds must not wake the sleeper (each wake-up is a futex call and a context
    /// switch for nothing); only the completions and the driver's hand-over when it leaves do.
    #[test]
    fn a_sleeping_waiter_is_not_woken_by_empty_progress_rounds() {
        let ep = Endpoint::new(Config::default().wait_mode(WaitMode::Block));
        let quiet = Arc::new(Quiet::default());
        assert!(ep.inner.backend.set(Box::new(quiet.clone())).is_ok());
        let recv = || ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
        let (a, b) = (recv(), recv());
        let elapsed = std::thread::scope(|s| {
            let ta = s.spawn(|| ep.wait(a).unwrap());
            let tb = s.spawn(|| ep.wait(b).unwrap());
            // Both waiting (one asleep), then many empty rounds by the driver.
            while ep.inner.core.lock().sleepers.is_empty() {
                std::thread::yield_now();
            }
            let t0 = Instant::now();
            let start = quiet.rounds.load(Ordering::Relaxed);
            while quiet.rounds.load(Ordering::Relaxed) < start + 100 {
                std::thread::yield_now();
            }
            ep.inner.core.complete(Completion::new(a, OpKind::Recv, PeerId(0), 1));
            ep.inner.core.complete(Completion::new(b, OpKind::Recv, PeerId(0), 1));
            assert_eq!((ta.join().unwrap().op, tb.join().unwrap().op), (a, b));
            t0.elapsed()
        });
        // At most: woken by each completion, by one hand-over, and by its own re-check every
        // MAX_BLOCK (a slow machine may stretch 100 rounds past one).
        let rechecks = (elapsed.as_millis() / MAX_BLOCK.as_millis()) as u64 + 1;
        let woken = ep.inner.core.counters.waiter_wakeups.load(Ordering::Relaxed);
        assert!(woken <= 3 + rechecks, "the sleeping waiter was woken {woken} times over 100 empty rounds");
    }

    #[test]
    fn reaping_by_id_keeps_the_completion_order_bounded() {
        let core = Core::default();
        // One completion stays unreaped at the front; each round reaps an id from the middle
        // of the list, which only compaction removes.
        let first = core.register(false);
        core.complete(completion(first));
        for _ in 0..10_000 {
            let (x, y) = (core.register(false), core.register(false));
            core.complete(completion(x));
            core.complete(completion(y));
            let mut st = core.lock();
            assert!(matches!(Core::take(&mut st, x), Some(Ok(c)) if c.op == x));
            assert!(matches!(Core::take(&mut st, y), Some(Ok(c)) if c.op == y));
            // Without compaction this list would hold every id ever completed.
            assert!(st.done_order.len() <= 2 * st.done + 1024 + 2, "{} ids listed", st.done_order.len());
        }
        let mut st = core.lock();
        assert_eq!(Core::take_any(&mut st).map(|c| c.op), Some(first));
        assert!(Core::take_any(&mut st).is_none());
        assert!(st.ops.is_empty());
    }

    #[test]
    fn wait_any_order_survives_reaping_by_id_and_compaction() {
        let core = Core::default();
        let mut kept = Vec::new();
        // Most completions are reaped by id at once (so the order list is compacted several
        // times); every 100th is left for wait_any.
        for i in 0..5000 {
            let op = core.register(false);
            core.complete(completion(op));
            if i % 100 == 0 {
                kept.push(op);
            } else {
                assert!(matches!(Core::take(&mut core.lock(), op), Some(Ok(_))));
            }
        }
        let mut st = core.lock();
        for op in &kept {
            assert_eq!(Core::take_any(&mut st).map(|c| c.op), Some(*op), "oldest first");
        }
        assert!(Core::take_any(&mut st).is_none());
        assert!(matches!(Core::take(&mut st, kept[0]), Some(Err(Error::Misuse(_)))), "reaped twice");
    }

    #[test]
    fn detached_ops_leave_nothing_behind() {
        let core = Core::default();
        let op = core.register(true);
        core.complete(completion(op));
        let st = core.lock();
        assert!(st.ops.is_empty() && st.done_order.is_empty() && st.done == 0);
    }

    /// Found by the stripefs load test (the io servers' private memory grew 16 bytes per
    /// request): completions taken by id left their ids in the `wait_any` queue forever.
    #[test]
    fn completions_taken_by_id_leave_nothing_behind() {
        let core = Core::default();
        for _ in 0..10_000 {
            let op = core.register(false);
            core.complete(completion(op));
            assert!(matches!(Core::take(&mut core.lock(), op), Some(Ok(c)) if c.op == op));
        }
        {
            let st = core.lock();
            assert!(st.done_order.is_empty(), "{} stale ids", st.done_order.len());
            assert!(st.ops.is_empty() && st.done == 0);
        }
        // wait_any still sees completions in order.
        let (a, b) = (core.register(false), core.register(false));
        core.complete(completion(b));
        core.complete(completion(a));
        let mut st = core.lock();
        assert_eq!(Core::take_any(&mut st).map(|c| c.op), Some(b));
        assert_eq!(Core::take_any(&mut st).map(|c| c.op), Some(a));
        assert!(Core::take_any(&mut st).is_none());
    }
}

//! The [`Endpoint`]: the public face of a transport — posting operations, deadlines,
//! cancellation, progress and wait modes — everything that is the same whatever the transport.
//!
//! A backend (`tcp`, `ib`) implements the crate-private [`Backend`] contract: it accepts
//! commands, moves bytes, and reports every operation's completion exactly once to the shared
//! [`Completions`] queue. The endpoint layer owns op ids, deadlines and waiting.
//!
//! # Progress
//!
//! Progress is explicit (BMI style): threads inside [`Endpoint::wait`], [`Endpoint::test`],
//! [`Endpoint::wait_any`], [`Endpoint::recv_unexpected`] and [`Endpoint::next_request`] drive
//! the transport. At most one thread drives at a time; the others wait on a condition variable
//! (or spin, in [`WaitMode::Spin`]) and are woken whenever a round of progress completes
//! anything. With [`Config::progress_thread`] a background thread drives instead.
//!
//! # Event loops
//!
//! An application with its own event loop waits on the endpoint's descriptor ([`AsFd`])
//! instead, with [`Endpoint::try_progress`] and [`Endpoint::arm`] — see [`Endpoint::arm`] for
//! the protocol. The `tokio` feature builds an async API on it.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::addr::{Address, Scheme};
use crate::backend::{Backend, Cmd, GetCmd, PutCmd, RecvCmd, RequestCmd, SendCmd};
use crate::buffers::buf::{RecvBuf, RegisteredBuf, SendBuf};
use crate::completions::{CompletionState, Completions, DRIVING, RequestHook, Sleeper, Slot, Want};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::info::{Counters, Info};
#[cfg(test)]
use crate::op::OpKind;
use crate::op::{Completion, Payload, Unexpected};
use crate::readiness::WaitSet;
use crate::spin_learn::{Stretch, WaitKind};
use crate::sync::{AtomicBool, Condvar, Mutex, MutexGuard};
use crate::types::{Access, OpId, PeerId, ServiceLevel, Tag, WaitMode};

/// Longest a driver blocks in one round, so deadlines and shutdown are noticed.
const MAX_BLOCK: Duration = Duration::from_millis(200);
/// How soon an armed descriptor becomes readable while the transport runs timers (handshakes,
/// stalled transmissions, cancelled transfers): the period at which they are checked.
const TIMER_TICK: Duration = Duration::from_millis(50);

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
    completions: Arc<Completions>,
    backend: OnceLock<Box<dyn Backend>>,
    init: Mutex<()>,
    stop: Arc<AtomicBool>,
    progress: Mutex<Option<JoinHandle<()>>>,
    /// [`Endpoint::arm`] was called: a transport made later is added to the wait set at once.
    fd_used: AtomicBool,
    /// The transport's descriptor is in the wait set.
    fd_registered: AtomicBool,
}

impl Inner {
    /// What [`Endpoint::shutdown`] does; a second call does nothing more.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.completions.close();
        let _g = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = self.backend.get() {
            b.shutdown();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Shuts the endpoint down when the application's last handle goes. The progress thread
/// holds the endpoint too, for a whole round of up to [`MAX_BLOCK`]; without this the
/// listener and the connections would outlive the last handle until that round ends, and a
/// server that drops its endpoint and binds the same address again would find it in use.
struct Owner(Weak<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.shut_down();
        }
    }
}

/// A communication endpoint. Cheap to clone (shared); `Send + Sync`. Dropping the last clone
/// (requests taken from it count as clones) shuts it down as [`Endpoint::shutdown`] does, at
/// once: its address can be bound again.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
    /// Every handle of the application has it; the progress thread's has not.
    _owner: Option<Arc<Owner>>,
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

/// The endpoint's event descriptor, for an application's own event loop: see
/// [`Endpoint::arm`]. Readable when progress is due; never read from or written to it.
impl AsFd for Endpoint {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self.inner.completions.waitset.get() {
            Some(ws) => ws.as_fd(),
            None => unreachable!("every public constructor makes the wait set"),
        }
    }
}

/// What [`Endpoint::arm`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Arm {
    /// Nothing is due: sleep until the descriptor is readable.
    Armed,
    /// Progress is due already: run [`Endpoint::try_progress`] instead of sleeping.
    Busy,
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
        ep.make_wait_set()?;
        let backend = make_backend(&addr, Some(&addr), &ep.inner.cfg, ep.inner.completions.clone())?;
        let _ = ep.inner.backend.set(backend);
        ep.start_progress_thread();
        Ok(ep)
    }

    /// A client-only endpoint: it does not listen; its transport is chosen by the first
    /// [`Endpoint::connect`].
    pub fn client(cfg: Config) -> Result<Endpoint> {
        cfg.validate()?;
        let ep = Endpoint::new(cfg);
        ep.make_wait_set()?;
        Ok(ep)
    }

    fn make_wait_set(&self) -> Result<()> {
        let _ = self.inner.completions.waitset.set(WaitSet::new()?);
        Ok(())
    }

    fn new(cfg: Config) -> Endpoint {
        let inner = Arc::new(Inner {
            cfg,
            completions: Arc::new(Completions::default()),
            backend: OnceLock::new(),
            init: Mutex::new(()),
            stop: Arc::new(AtomicBool::new(false)),
            progress: Mutex::new(None),
            fd_used: AtomicBool::new(false),
            fd_registered: AtomicBool::new(false),
        });
        let owner = Some(Arc::new(Owner(Arc::downgrade(&inner))));
        Endpoint { inner, _owner: owner }
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
                    let ep = Endpoint { inner, _owner: None };
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
    /// level, on first use; the address is resolved now. A peer that refuses the connection,
    /// or does not answer within [`Config::connect_timeout`], fails the first
    /// operation (and every other one queued for it) with [`Error::PeerLost`], its reason
    /// naming the address and the cause ("connection refused").
    ///
    /// # Errors
    /// Address errors; [`Error::Unsupported`] for a transport other than this endpoint's.
    pub fn connect(&self, addr: impl ToAddress) -> Result<PeerId> {
        let addr = addr.to_address()?;
        self.check_open()?;
        if self.inner.backend.get().is_none() {
            let _g = self.inner.init.lock().unwrap_or_else(|p| p.into_inner());
            if self.inner.backend.get().is_none() {
                // Under the lock `shutdown` takes: no transport is made after it.
                self.check_open()?;
                let b = make_backend(&addr, None, &self.inner.cfg, self.inner.completions.clone())?;
                let _ = self.inner.backend.set(b);
                self.start_progress_thread();
            }
        }
        let b = self.backend()?;
        // After the transport is set, so that this or a concurrent `arm` adds it (see there).
        if self.inner.fd_used.load(Ordering::SeqCst) {
            self.register_event_fd(b)?;
        }
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
        let op = self.inner.completions.register(detached);
        let r = b.post(op, cmd);
        self.kick_driver(b);
        match r {
            Ok(()) => Ok(op),
            Err(e) => {
                self.inner.completions.unregister(op);
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
        self.post(Cmd::Send(SendCmd { peer, tag, sl, buf: buf.into(), unexpected: false }))
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
        self.post(Cmd::Send(SendCmd { peer, tag, sl, buf: buf.into(), unexpected: true }))
    }

    /// Posts a receive for the next message from `peer` with `tag`. `buf` is a `BytesMut`
    /// (its current length is the capacity), a `Vec<BytesMut>` scatter list, or a
    /// [`RegisteredBuf`]. A larger message fails the receive with [`Error::Truncated`].
    pub fn recv(&self, peer: PeerId, tag: Tag, buf: impl Into<RecvBuf>) -> Result<OpId> {
        self.post(Cmd::Recv(RecvCmd { peer, tag, buf: buf.into() }))
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
        self.post(Cmd::Put(PutCmd { peer, sl, local: local.into(), remote }))
    }

    /// Reads the peer's exposed memory `remote` into `local` (RDMA read).
    pub fn get(
        &self,
        peer: PeerId,
        local: impl Into<RecvBuf>,
        remote: MemHandle,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.post(Cmd::Get(GetCmd { peer, sl, local: local.into(), remote }))
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
        self.post(Cmd::Request(RequestCmd { peer, tag, sl, header: header.into(), payload }))
    }

    /// Sets or moves an operation's deadline: if it has not completed by `at`, it is cancelled
    /// with [`Error::Timeout`]. No effect on completed operations.
    pub fn set_deadline(&self, op: OpId, at: Instant) -> Result<()> {
        let mut guard = self.inner.completions.lock();
        let st = &mut *guard;
        match st.ops.get_mut(&op) {
            Some(Slot::Pending { deadline, .. }) => {
                let old = deadline.replace(at);
                if let Some(old) = old {
                    st.deadlines.remove(&(old, op));
                }
                st.deadlines.insert((at, op));
                // An armed caller's timer was set for the deadlines known then.
                self.inner.completions.notify_armed(st);
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
    ///
    /// Cancellation ends this endpoint's operation and gives its buffer back; the peer is not
    /// asked to undo anything. A cancelled request may already have been served (a write may
    /// be on the server's disk); its late reply is dropped. If the request had been sent, a
    /// cancel notice follows it to the server: there [`Request::is_cancelled`] turns true,
    /// and the request's later pulls, pushes and reply fail with [`Error::PeerCancelled`]
    /// without moving bytes, so a server can stop work nobody waits for. The notice is
    /// advisory: the client's operation has completed already, whatever the server does. A receive not
    /// yet matched ends at once. A transfer under way ends cleanly: on TCP at once, what the
    /// peer still sends of it being discarded (a send whose bytes are being written completes
    /// when they are, normally); on InfiniBand the peer
    /// may still be reading or writing the buffer by RDMA, so the buffer is held until the
    /// peer finishes, for at most [`IbConfig::cancel_grace`](crate::IbConfig::cancel_grace),
    /// after which the connection to that peer is torn down (its other operations fail with
    /// [`Error::PeerLost`]). A deadline ([`Endpoint::set_deadline`]) cancels the same way,
    /// with [`Error::Timeout`].
    pub fn cancel(&self, op: OpId) -> Result<()> {
        match Completions::is_pending(&self.inner.completions.lock(), op) {
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
        let kick = &self.inner.completions.kick;
        if kick.load(Ordering::Relaxed) && kick.swap(false, Ordering::AcqRel) {
            b.wake();
        }
    }

    /// Stops tracking an operation nobody will collect: its completion, now or later, is
    /// dropped with its buffers. The operation is not cancelled (see [`Endpoint::cancel`]) and
    /// still completes exactly once inside the endpoint; a detached reply or send finishes in
    /// the background.
    ///
    /// # Errors
    /// [`Error::Misuse`] if `op` is not pending or unreaped.
    pub fn detach(&self, op: OpId) -> Result<()> {
        if self.inner.completions.detach(op) {
            Ok(())
        } else {
            Err(Error::misuse(format!("{op} is not a pending operation (already reaped?)")))
        }
    }

    /// One round of progress that never blocks, for an application that waits on the
    /// endpoint's descriptor ([`AsFd`]) in its own event loop: it collects what made the
    /// descriptor readable, moves bytes, expires deadlines, and returns whether it moved or
    /// completed anything. If another thread is driving progress at that moment, it returns
    /// `false` at once (that thread does the work). See [`Endpoint::arm`].
    pub fn try_progress(&self) -> Result<bool> {
        let completions = &self.inner.completions;
        if let Some(ws) = completions.waitset.get() {
            // First, so that whatever happens from now on makes the descriptor readable again.
            ws.clear()?;
        }
        let mut st = completions.lock();
        st.armed = false;
        let Some(backend) = self.inner.backend.get() else {
            st.seen = st.queued;
            return Ok(false);
        };
        if st.driving {
            st.seen = st.queued;
            return Ok(false);
        }
        let deadlines = !st.deadlines.is_empty();
        st.driving = true;
        drop(st);
        let guard = DriveGuard::start(completions);
        let r = backend.poll_events();
        if deadlines {
            self.expire(&**backend);
        }
        let mut st = guard.finish();
        st.seen = st.queued;
        Completions::hand_over(&st);
        r
    }

    /// Prepares the endpoint's descriptor ([`AsFd`]) for the caller to sleep on it: with
    /// [`Arm::Armed`], the descriptor becomes readable as soon as progress is due — bytes or a
    /// connection arrived, a socket became writable, a completion, request or unexpected
    /// message was queued by another thread, a deadline passed, a transport timer is due. With
    /// [`Arm::Busy`], something is due already: call [`Endpoint::try_progress`] and look at
    /// completions again instead of sleeping.
    ///
    /// The protocol, as with UCX's `ucp_worker_arm`:
    ///
    /// ```no_run
    /// # use std::os::fd::AsFd;
    /// # fn run(ep: &ionet::Endpoint, op: ionet::OpId) -> ionet::Result<()> {
    /// use ionet::Arm;
    /// loop {
    ///     ep.try_progress()?;
    ///     if let Some(c) = ep.test(op)? {
    ///         // ... use the completion
    ///         break;
    ///     }
    ///     if ep.arm()? == Arm::Armed {
    ///         // Sleep until the descriptor is readable: poll(2), epoll, mio, tokio's AsyncFd.
    ///         # let _ = ep.as_fd();
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// No wake-up is lost: anything queued after the last [`Endpoint::try_progress`] makes
    /// `arm` answer [`Arm::Busy`] or, once armed, makes the descriptor readable. The
    /// descriptor is level-triggered in the sense that it stays readable until the next
    /// `try_progress`; it is an epoll instance (a kqueue outside Linux), so edge-triggered
    /// registration works too. An idle endpoint with no deadlines and no connection being set
    /// up never wakes its loop.
    ///
    /// # Errors
    /// An error from the transport or the descriptor's system calls.
    pub fn arm(&self) -> Result<Arm> {
        let completions = &self.inner.completions;
        let Some(ws) = completions.waitset.get() else {
            return Err(Error::misuse("this endpoint has no event descriptor"));
        };
        // Before looking for the transport: a concurrent `connect` that makes it either is
        // seen here or sees this flag and adds the transport itself.
        self.inner.fd_used.store(true, Ordering::SeqCst);
        {
            let st = completions.lock();
            if st.queued != st.seen {
                return Ok(Arm::Busy);
            }
        }
        let mut timer = None;
        if let Some(b) = self.inner.backend.get() {
            self.register_event_fd(&**b)?;
            if !b.arm()? {
                return Ok(Arm::Busy);
            }
            // After the round that collected the transport's events: a kqueue may still list
            // them, and would then stay readable and hide the next ones.
            if !ws.settle()? {
                return Ok(Arm::Busy);
            }
            if b.timers_pending() {
                timer = Some(TIMER_TICK);
            }
        }
        let mut st = completions.lock();
        if st.queued != st.seen {
            return Ok(Arm::Busy);
        }
        if let Some(d) = Completions::next_deadline(&st) {
            let left = d.saturating_duration_since(Instant::now());
            timer = Some(timer.map_or(left, |t: Duration| t.min(left)));
        }
        // Under the lock, so a deadline set meanwhile either is in this timer or finds the
        // endpoint armed and notifies.
        ws.set_timer(timer)?;
        st.armed = true;
        Ok(Arm::Armed)
    }

    fn register_event_fd(&self, b: &dyn Backend) -> Result<()> {
        if self.inner.fd_registered.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(ws) = self.inner.completions.waitset.get() else { return Ok(()) };
        let _g = self.inner.init.lock().unwrap_or_else(|p| p.into_inner());
        if !self.inner.fd_registered.load(Ordering::Acquire) {
            ws.add_transport(b.event_fd())?;
            self.inner.fd_registered.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Drives progress once without blocking and returns the completion if the operation is
    /// done.
    pub fn test(&self, op: OpId) -> Result<Option<Completion>> {
        self.wait_until(Until::Poll, Want::Op(op), |st| Completions::take(st, op), false)?.transpose()
    }

    /// Waits until the operation completes.
    pub fn wait(&self, op: OpId) -> Result<Completion> {
        self.wait_until(Until::Never, Want::Op(op), |st| Completions::take(st, op), false)?
            .ok_or(Error::Closed)?
    }

    /// Waits up to `timeout` for the operation; `None` if it is still pending (it is *not*
    /// cancelled — use [`Endpoint::set_deadline`] for that).
    pub fn wait_timeout(&self, op: OpId, timeout: Duration) -> Result<Option<Completion>> {
        self.wait_until(Until::Within(timeout), Want::Op(op), |st| Completions::take(st, op), false)?
            .transpose()
    }

    /// Waits up to `timeout` (forever with `None`) for any operation to complete, oldest
    /// completion first.
    pub fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        self.wait_until(Until::after(timeout), Want::AnyOp, Completions::take_any, false)
    }

    /// Waits up to `timeout` (forever with `None`) for an unexpected message.
    pub fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>> {
        let u = self
            .wait_until(
                Until::after(timeout),
                Want::Unexpected,
                |st| closed_or(st, |st| st.unexpected.pop_front()),
                false,
            )?
            .transpose()?;
        u.map(|u| self.took_unexpected(u)).transpose()
    }

    /// Tells the transport the application took `u` off the queue (its bytes no longer count
    /// against the peer's budget), and wakes a driver if that let a stalled peer go on.
    fn took_unexpected(&self, u: Unexpected) -> Result<Unexpected> {
        let b = self.backend()?;
        b.unexpected_taken(u.peer, u.data.len());
        self.kick_driver(b);
        Ok(u)
    }

    /// Calls `f` each time a request is queued for [`Endpoint::next_request`], on whichever
    /// thread is driving progress at that moment — so keep it short, and do not call back into
    /// this endpoint from it. A server's own worker pool uses it to wake an idle worker when a
    /// request arrives while its other workers are busy serving (their progress queues it).
    /// One hook per endpoint: a second call is refused.
    pub fn on_request(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        self.inner
            .completions
            .request_hook
            .set(RequestHook(Box::new(f)))
            .map_err(|_| Error::misuse("the endpoint already has a request hook"))
    }

    /// The completion of `op` if it is done; otherwise `cx`'s waker is woken when it is.
    /// For the async layer: it never drives progress (its driver task does).
    #[cfg(feature = "tokio")]
    pub(crate) fn poll_op(
        &self,
        op: OpId,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Completion>> {
        let mut st = self.inner.completions.lock();
        match Completions::take(&mut st, op) {
            Some(r) => {
                st.wakers.remove(&op);
                std::task::Poll::Ready(r)
            }
            None => {
                match st.wakers.get_mut(&op) {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    Some(w) => w.clone_from(cx.waker()),
                    None => {
                        st.wakers.insert(op, cx.waker().clone());
                    }
                }
                std::task::Poll::Pending
            }
        }
    }

    /// The next queued request ([`Error::Closed`] after a shutdown), or `cx`'s waker is
    /// woken when one is queued.
    #[cfg(feature = "tokio")]
    pub(crate) fn poll_request(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<Request>> {
        let mut st = self.inner.completions.lock();
        match closed_or(&mut st, |st| st.requests.pop_front()) {
            Some(r) => std::task::Poll::Ready(r.map(|meta| Request::new(self.clone(), meta))),
            None => {
                register_waker(&mut st.request_wakers, cx);
                std::task::Poll::Pending
            }
        }
    }

    /// The next queued unexpected message ([`Error::Closed`] after a shutdown), or `cx`'s
    /// waker is woken when one is queued.
    #[cfg(feature = "tokio")]
    pub(crate) fn poll_unexpected(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Unexpected>> {
        let mut st = self.inner.completions.lock();
        let Some(r) = closed_or(&mut st, |st| st.unexpected.pop_front()) else {
            register_waker(&mut st.unexpected_wakers, cx);
            return std::task::Poll::Pending;
        };
        drop(st);
        std::task::Poll::Ready(r.and_then(|u| self.took_unexpected(u)))
    }

    /// Calls `f` each time an operation's completion is queued for [`Endpoint::wait`],
    /// [`Endpoint::test`] or [`Endpoint::wait_any`] (not for detached operations), on whichever
    /// thread queued it — the one driving progress, or one whose post completed at once — and
    /// outside the endpoint's locks; keep it short and do not wait on this endpoint from it.
    /// For handing completions to another scheduler; an event loop can instead wait on the
    /// endpoint's descriptor (see [`Endpoint::arm`]). One hook per endpoint: a second call is
    /// refused.
    pub fn on_complete(&self, f: impl Fn() + Send + Sync + 'static) -> Result<()> {
        self.inner
            .completions
            .completion_hook
            .set(RequestHook(Box::new(f)))
            .map_err(|_| Error::misuse("the endpoint already has a completion hook"))
    }

    /// Waits up to `timeout` (forever with `None`) for the next incoming request. A zero
    /// timeout looks once without blocking (driving progress one round if no other thread is).
    pub fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>> {
        let meta = self
            .wait_until(
                Until::after(timeout),
                Want::Request,
                |st| closed_or(st, |st| st.requests.pop_front()),
                false,
            )?
            .transpose()?;
        Ok(meta.map(|meta| Request::new(self.clone(), meta)))
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
        mut check: impl FnMut(&mut CompletionState) -> Option<T>,
        is_progress_thread: bool,
    ) -> Result<Option<T>> {
        let completions = &self.inner.completions;
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
        let max_spin = self.inner.cfg.spin_budget;
        // Which learnt spin an adaptive wait of a caller uses (a poll never waits; the progress
        // thread waits for nothing in particular and keeps the whole budget).
        let kind = match want {
            _ if mode != WaitMode::Adaptive || is_progress_thread || until == Until::Poll => None,
            Want::Op(_) | Want::AnyOp => Some(WaitKind::Ops),
            Want::Unexpected | Want::Request => Some(WaitKind::Arrivals),
            Want::Nothing => None,
        };
        // The stretch since the wait began or a round last did work. A new one starts whenever
        // the spin deadline is unset: at the first look, and after every round that did work,
        // which is where the previous one ended.
        let mut stretch: Option<Stretch> = None;
        let mut last_now = None;
        let mut polled = false;
        let mut st = completions.lock();
        // Every way out of the loop after looking for ourselves hands the driving over.
        let out = loop {
            if let Some(x) = check(&mut st) {
                break Ok(Some(x));
            }
            let now = needs_clock.then(Instant::now);
            last_now = now.or(last_now);
            if let Some(now) = now
                && spin_until.is_none()
            {
                let mut budget = max_spin;
                if let Some(k) = kind {
                    let learnt = st.spins.get_mut(k);
                    if let Some(s) = stretch.take() {
                        s.end(now, learnt, max_spin);
                    }
                    budget = learnt.budget(max_spin);
                    stretch = Some(Stretch::new(now, budget));
                }
                spin_until = Some(now + budget);
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
                    st = completions.lock();
                    continue;
                }
                let limit = now.map_or(MAX_BLOCK, |n| until.remaining(n)).min(MAX_BLOCK);
                // A condition variable of our own, so only what we wait for wakes us.
                let cv = Arc::new(Condvar::new());
                self.sleeping(&mut stretch, max_spin);
                st.sleepers.push(Sleeper { want, cv: cv.clone() });
                let (g, _) = cv.wait_timeout(st, limit).unwrap_or_else(|p| p.into_inner());
                st = g;
                if let Some(i) = st.sleepers.iter().position(|s| Arc::ptr_eq(&s.cv, &cv)) {
                    st.sleepers.swap_remove(i);
                }
                Counters::add(&completions.counters.waiter_wakeups, 1);
                continue;
            }
            // Nobody drives: become the driver for one round.
            let block = if spinning || until == Until::Poll {
                Duration::ZERO
            } else {
                let deadline = Completions::next_deadline(&st);
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
            if !block.is_zero() {
                self.sleeping(&mut stretch, max_spin);
            }
            let deadlines = !st.deadlines.is_empty();
            st.driving = true;
            drop(st);
            let guard = DriveGuard::start(completions);
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
        if let (Some(k), Some(s), Ok(Some(_)), Some(last)) = (kind, stretch, &out, last_now) {
            // A stretch that did not sleep ended about when the clock was last read (a round
            // ago, which is close enough and spares a clock read on the fast path).
            let end = if s.slept { Instant::now() } else { last };
            s.end(end, st.spins.get_mut(k), max_spin);
        }
        Completions::hand_over(&st);
        out
    }

    /// Notes that a stretch of an adaptive wait goes to sleep (counting it if its learnt spin
    /// was shorter than the configured budget).
    pub(crate) fn sleeping(&self, stretch: &mut Option<Stretch>, max_spin: Duration) {
        if let Some(s) = stretch
            && !s.slept
        {
            s.slept = true;
            if s.budget < max_spin {
                Counters::add(&self.inner.completions.counters.spins_cut_short, 1);
            }
        }
    }

    fn expire(&self, backend: &dyn Backend) {
        let now = Instant::now();
        for op in self.inner.completions.expired(now) {
            backend.cancel(op, Error::Timeout);
        }
    }

    /// A buffer from the endpoint's registered pool (BMI_memalloc): pre-faulted, and
    /// registered once on InfiniBand so transfers from it are zero-copy. Buffers of 64 KiB and
    /// more are carved from 2 MiB-aligned chunks backed by transparent huge pages where the
    /// kernel allows (`madvise` mode is enough), which makes one-sided copies and registration
    /// several times cheaper; [`crate::buffers::buf::PoolStats::chunks`] counts them.
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
    /// with [`crate::IbConfig::cache_foreign`] set to `true` (registrations kept without the
    /// memory monitor), before the application frees or remaps
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
        let completions = &self.inner.completions;
        let pending = {
            let st = completions.lock();
            st.ops.len() - st.done
        };
        let policy =
            self.inner.cfg.policy.clone().unwrap_or_else(|| crate::comm::Policy::for_scheme(Scheme::Tcp));
        let mut info = Info::unreported(Scheme::Tcp, self.inner.cfg.wait_mode, policy);
        info.max_message = self.inner.cfg.max_message;
        info.max_header = self.inner.cfg.max_header;
        info.pending_ops = pending;
        info.counters = completions.counters.snapshot();
        if let Some(b) = self.inner.backend.get() {
            b.info(&mut info);
        }
        info
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Shuts the endpoint down, for every clone: each pending operation completes once with
    /// [`Error::Closed`] (collect them as usual), connections and the listener close, posts
    /// and connects fail with [`Error::Closed`], and [`Endpoint::next_request`] and
    /// [`Endpoint::recv_unexpected`] return what is queued, then [`Error::Closed`]. Requests
    /// that arrived but were not answered are answered with an error as they are dropped.
    /// A second call does nothing.
    pub fn shutdown(&self) {
        self.inner.shut_down();
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.completions.lock().closed { Err(Error::Closed) } else { Ok(()) }
    }
}

/// Keeps `cx`'s waker among `wakers`, once.
#[cfg(feature = "tokio")]
fn register_waker(wakers: &mut Vec<std::task::Waker>, cx: &std::task::Context<'_>) {
    if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
        wakers.push(cx.waker().clone());
    }
}

/// What a wait for the queue `take` reads finds: an item, else [`Error::Closed`] once the
/// endpoint is shut down, else nothing yet.
fn closed_or<T>(
    st: &mut CompletionState,
    take: impl FnOnce(&mut CompletionState) -> Option<T>,
) -> Option<Result<T>> {
    match take(st) {
        Some(x) => Some(Ok(x)),
        None if st.closed => Some(Err(Error::Closed)),
        None => None,
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
struct DriveGuard<'a>(&'a Completions);

impl<'a> DriveGuard<'a> {
    fn start(completions: &'a Completions) -> Self {
        DRIVING.with(|d| d.set(true));
        DriveGuard(completions)
    }

    /// Ends the round and returns the completion queue's lock, already held, to the caller.
    fn finish(self) -> MutexGuard<'a, CompletionState> {
        let completions = self.0;
        std::mem::forget(self);
        DRIVING.with(|d| d.set(false));
        let mut st = completions.lock();
        st.driving = false;
        // No wake-up here: the driver goes on to check its own condition with the lock held,
        // and either drives again or leaves, handing the driving over then (see
        // [`Completions::hand_over`]). Waking every sleeper at the end of each round made them
        // all run, find nothing, and sleep again — a futex call and a context switch apiece.
        st
    }
}

impl Drop for DriveGuard<'_> {
    fn drop(&mut self) {
        DRIVING.with(|d| d.set(false));
        let mut st = self.0.lock();
        st.driving = false;
        Completions::wake_all(&st);
    }
}

/// Opens the backend of `addr`'s scheme. The endpoint picks its transport, so the transports
/// depend on their contract ([`crate::backend`]) and never the other way round.
fn make_backend(
    addr: &Address,
    bind: Option<&Address>,
    cfg: &Config,
    completions: Arc<Completions>,
) -> Result<Box<dyn Backend>> {
    match addr.scheme() {
        Scheme::Tcp => Ok(Box::new(crate::tcp::TcpBackend::new(bind, cfg, completions)?)),
        #[cfg(target_os = "linux")]
        Scheme::SoftIb | Scheme::Ib => crate::ib::make_backend(addr.scheme(), bind, cfg, completions),
        #[cfg(not(target_os = "linux"))]
        Scheme::SoftIb | Scheme::Ib => Err(crate::error::Error::Unsupported(format!(
            "{}:// endpoints need Linux (the InfiniBand providers stand on Linux interfaces); \
             this build for {} has TCP only",
            addr.scheme(),
            std::env::consts::OS
        ))),
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

mod request;
pub use request::Request;

/// The `Backend` methods the endpoint's test stand-ins do not model (memory, counters,
/// shutdown), shared by the loom model and the unit tests.
#[cfg(test)]
macro_rules! unmodelled_backend_methods {
    () => {
        fn unexpected_taken(&self, _: PeerId, _: usize) {}
        fn request_cancelled(&self, _: PeerId, _: u64) -> bool {
            false
        }
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
        fn event_fd(&self) -> BorrowedFd<'_> {
            unreachable!("not modelled")
        }
        fn arm(&self) -> Result<bool> {
            Err(Error::misuse("not modelled"))
        }
        fn poll_events(&self) -> Result<bool> {
            self.progress(Duration::ZERO)
        }
        fn timers_pending(&self) -> bool {
            false
        }
    };
}

#[cfg(all(loom, test))]
#[path = "loom/endpoint.rs"]
mod loom_model;

#[cfg(all(test, not(loom)))]
mod tests;

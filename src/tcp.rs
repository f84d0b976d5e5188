//! The TCP backend (mio + socket2): a driver of the sans-IO protocol in
//! [`crate::core::stream`], which owns epoll, the sockets, accepting and dialling, socket
//! tuning and direct (blocking-`recv`) waits, and moves the bytes the protocol asks for.
//!
//! * One connection per (peer, service level), opened lazily on first use, each marked with
//!   its class's DSCP and `SO_PRIORITY`, `TCP_NODELAY` on.
//! * A handshake ([`handshake`]) exchanges endpoint ids and limits and, with a cluster key,
//!   authenticates both sides before any message is delivered.
//! * Eager messages (≤ the eager limit) go whole in one `writev` of header + payload. Larger ones
//!   use rendezvous: `RTS`, then the body flows only after the receiver posted a matching receive
//!   and answered `CTS`, and it is read straight into the receiver's buffer.
//! * Early eager data and unexpected messages are buffered per peer up to a byte budget; past
//!   it we stop reading that peer's socket (back-pressure) instead of buffering more.
//! * Request payloads: small OUT payloads travel inline with the request; larger ones stream
//!   right behind it (`STREAM` frames, to peers that announce they read them) and wait in the
//!   server's socket until it posts a pull that covers them, which they are read straight into;
//!   towards other peers (or with [`Config::stream_requests`] off) the server pulls them
//!   (`PULL` / `PULL_DATA`). IN payloads are pushed (`PUSH`) straight into the client's buffer.
//! * `put`/`get` are emulated with frames the target validates against its exposure table.
//! * On connection loss every operation on the peer fails once with `PeerLost`; the next use
//!   reconnects.

mod direct;
mod sock;

use std::collections::{HashSet, VecDeque};
use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use socket2::SockRef;

use crate::addr::{Address, Scheme};
use crate::backend::{Backend, Cmd};
use crate::buffers::buf::{BufPool, RegisteredBuf};
use crate::completions::Completions;
use crate::config::Config;
use crate::core::stream::{Action, EagerNow, IoVec, LinkId, RecvInto, Session, Settings, Slab};
use crate::error::{Error, Result};
use crate::expose::MemHandle;
use crate::info::{Counters, Info};
use crate::sockets;
use crate::types::{Access, OpId, PeerId};

use sock::{
    Sock, moved, payload_wake_mark, recv_now, recv_vec_now, send_now, send_one_now, send_pair_now, tune,
};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
/// Link `n` is registered as token `FIRST_LINK + n`.
const FIRST_LINK: usize = 2;

/// Bytes read from one connection per round before others get a turn.
const READ_QUANTUM: usize = 4 << 20;
/// Busy-poll rounds between epoll checks when reading sockets directly.
const SPIN_EPOLL_EVERY: u32 = 16;
/// Busy-poll rounds per `progress` call when nothing happens.
const SPIN_ROUNDS_PER_CALL: u32 = 8;
/// Busy-poll calls that moved nothing before the driver starts yielding its CPU.
const SPIN_CALLS_BEFORE_YIELD: u32 = 2;
/// Direct socket polling only pays with few connections.
const SPIN_DIRECT_MAX_CONNS: usize = 4;
/// How often the clock is read while busy-polling (in timer calls): reading it each round
/// costs as much as the round itself.
const SPIN_TIMER_EVERY: u32 = 64;

fn token(link: LinkId) -> Token {
    Token(FIRST_LINK + link.0 as usize)
}

fn link_of(t: Token) -> LinkId {
    LinkId((t.0 - FIRST_LINK) as u64)
}

/// The TCP backend.
pub(crate) struct TcpBackend {
    core: Arc<Completions>,
    poller: Mutex<Poller>,
    registry: Registry,
    waker: Waker,
    st: Mutex<State>,
    pool: BufPool,
    endpoint_id: u64,
    local: Option<Address>,
    /// A driver is asleep (in epoll or a direct wait): posts must write themselves.
    blocked: AtomicBool,
    /// `wake` was called: a direct wait could not have seen it, so the next rounds use epoll.
    woken: AtomicBool,
    /// The epoll instance of `poller` (a duplicate descriptor), for event loops to wait on.
    event_fd: OwnedFd,
}

struct Poller {
    poll: Poll,
    events: Events,
}

/// The driver's state: the protocol session and the sockets under it.
struct State {
    session: Session,
    listener: Option<TcpListener>,
    socks: Slab<LinkId, Sock>,
    read_ready: VecDeque<LinkId>,
    spin_rounds: u32,
    /// Busy-poll `progress` calls in a row that moved nothing.
    idle_calls: u32,
    timer_rounds: u32,
    /// Reused to avoid an allocation per flush.
    turn: Vec<LinkId>,
    /// A driver is blocked in a direct wait (its link's staging buffer is lent out).
    in_direct: bool,
    /// The listener may hold connections not accepted yet (see [`crate::admission::ACCEPTS_PER_ROUND`]).
    accept_more: bool,
    /// The last direct wait timed out: epoll until a socket event shows the connection busy.
    direct_idle: bool,
    /// Progress rounds left without direct waits (see [`direct::DIRECT_HOLDOFF`]).
    direct_holdoff: u32,
    /// Direct waits since the last epoll round.
    direct_rounds: u32,
    closed: bool,
    cfg: Config,
}

impl TcpBackend {
    pub(crate) fn new(bind: Option<&Address>, cfg: &Config, core: Arc<Completions>) -> Result<TcpBackend> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(&registry, WAKER)?;
        let event_fd = sockets::epoll_fd(&poll)?;
        let mut listener = None;
        let mut local = None;
        if let Some(addr) = bind {
            let sa = *addr.resolve()?.first().ok_or_else(|| Error::misuse("no address to bind"))?;
            let mut l = TcpListener::from_std(sockets::listener_socket(sa, cfg)?.into());
            registry.register(&mut l, LISTENER, Interest::READABLE)?;
            let real = l.local_addr()?;
            local = Some(Address::new(Scheme::Tcp, addr.host().clone(), real.port()));
            listener = Some(l);
        }
        let endpoint_id = crate::util::random_u64();
        let settings = Settings::new(cfg, endpoint_id, local.as_ref().map_or(0, |a| a.port()));
        let st = State {
            session: Session::new(Instant::now(), settings, core.clone()),
            listener,
            socks: Slab::default(),
            read_ready: VecDeque::new(),
            spin_rounds: 0,
            idle_calls: 0,
            timer_rounds: 0,
            turn: Vec::new(),
            in_direct: false,
            accept_more: false,
            direct_idle: false,
            direct_holdoff: 0,
            direct_rounds: 0,
            closed: false,
            cfg: cfg.clone(),
        };
        tracing::debug!(endpoint_id, local = ?local, "tcp endpoint up");
        Ok(TcpBackend {
            core,
            poller: Mutex::new(Poller { poll, events: Events::with_capacity(256) }),
            registry,
            waker,
            st: Mutex::new(st),
            pool: BufPool::new(cfg.pool_max_bytes, cfg.pool_cached_bytes),
            endpoint_id,
            local,
            blocked: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            event_fd,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands what the session gathered under the state lock to the core, and unlocks.
    // Inlined into every caller: usually it finds nothing to hand over, and a call costs more
    // than the checks.
    #[inline(always)]
    fn deliver(&self, mut st: MutexGuard<'_, State>) {
        // Lock order is backend state, then core; the core never calls back into a backend.
        st.session.hand_over(&self.core);
    }
}

impl Backend for TcpBackend {
    fn scheme(&self) -> Scheme {
        Scheme::Tcp
    }

    fn local_addr(&self) -> Option<Address> {
        self.local.clone()
    }

    fn connect(&self, addr: &Address) -> Result<PeerId> {
        let sa = *addr.resolve()?.first().ok_or_else(|| Error::misuse("address resolves to nothing"))?;
        self.lock().session.connect(sa)
    }

    fn peer_addr(&self, peer: PeerId) -> Option<Address> {
        let st = self.lock();
        let p = st.session.peers.get(peer)?;
        p.addr().map(|sa| Address::from_socket(Scheme::Tcp, sa))
    }

    fn post(&self, op: OpId, cmd: Cmd) -> Result<()> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::Closed);
        }
        st.check_if_idle(&cmd, &self.registry);
        let r = match st.session.eager_now(&cmd) {
            Some(e) => {
                // The command stays here rather than moving through the write: it is large,
                // and each move is a copy on the 8-byte round trip.
                let n = st.write_eager(&cmd, &e);
                st.session.eager_written(op, cmd, e, n);
                Ok(())
            }
            None => st.session.post(op, cmd),
        };
        st.apply_actions(&self.registry);
        let was_direct = st.in_direct;
        if !st.read_ready.is_empty() && !was_direct {
            // A pull or an answer let a connection that waited inside a stream go on: its bytes
            // are in the socket already, so read them now rather than wait for a driver, who
            // may be asleep in epoll with no new edge coming. (A direct wait reads only a lone
            // connection that is not inside a stream, so it is never this one.)
            st.run_reads(&self.registry);
        }
        // Write at once (BMI's "completed immediately" path) unless batching: then frames go
        // out at the next progress round, so back-to-back posts share one writev and one
        // wake-up of the receiver — except when a driver sleeps in epoll and would not run that
        // round soon.
        if !st.cfg.batch_sends || self.blocked.load(Ordering::Acquire) {
            if let Some(link) = st.session.lone_transmit() {
                // The common case, one connection with data: skip the scheduler.
                st.write_link(link, usize::MAX);
                st.apply_actions(&self.registry);
            } else {
                st.flush_ready(&self.registry);
            }
        }
        if was_direct {
            st.after_foreign_call();
        }
        self.deliver(st);
        r
    }

    fn cancel(&self, op: OpId, why: Error) {
        let mut st = self.lock();
        st.session.cancel(op, why);
        st.apply_actions(&self.registry);
        st.flush_ready(&self.registry);
        if st.in_direct {
            st.after_foreign_call();
        }
        self.deliver(st);
    }

    fn request_cancelled(&self, peer: PeerId, req: u64) -> bool {
        self.lock().session.request_cancelled(peer, req)
    }

    fn progress(&self, timeout: Duration) -> Result<bool> {
        self.round(timeout, false)
    }

    fn wake(&self) {
        self.woken.store(true, Ordering::Relaxed);
        let _ = self.waker.wake();
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.event_fd.as_fd()
    }

    fn arm(&self) -> Result<bool> {
        let mut st = self.lock();
        // Set first, under the state lock: a post from now on writes itself rather than leave
        // its frames for a round that nobody runs.
        self.blocked.store(true, Ordering::Release);
        st.flush_ready(&self.registry);
        st.apply_actions(&self.registry);
        // What keeps a blocking round from sleeping, and a direct wait or frames for a
        // writable socket, which only a round finishes.
        let due = st.round_due() || st.in_direct || st.session.wants_transmit();
        self.deliver(st);
        if due {
            self.blocked.store(false, Ordering::Release);
        }
        Ok(!due)
    }

    fn poll_events(&self) -> Result<bool> {
        self.blocked.store(false, Ordering::Release);
        self.round(Duration::ZERO, true)
    }

    fn timers_pending(&self) -> bool {
        self.lock().session.timers_pending()
    }

    fn unexpected_taken(&self, peer: PeerId, bytes: usize) {
        let mut st = self.lock();
        st.session.unexpected_taken(peer, bytes);
        st.apply_actions(&self.registry);
        st.flush_ready(&self.registry);
        self.deliver(st);
    }

    fn alloc(&self, len: usize) -> Result<RegisteredBuf> {
        self.pool.alloc(len)
    }

    fn expose(&self, buf: RegisteredBuf, access: Access) -> Result<MemHandle> {
        Ok(self.lock().session.exposures.insert(buf, access, 0))
    }

    fn revoke(&self, key: u64) -> Result<RegisteredBuf> {
        self.lock()
            .session
            .exposures
            .remove(key)
            .ok_or_else(|| Error::misuse("unknown or already revoked exposure"))
    }

    fn with_exposed(&self, key: u64, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let mut st = self.lock();
        let b =
            st.session.exposures.get_mut(key).ok_or_else(|| Error::misuse("unknown or revoked exposure"))?;
        f(b);
        Ok(())
    }

    fn info(&self, info: &mut Info) {
        let st = self.lock();
        let s = &st.session;
        info.scheme = Scheme::Tcp;
        info.local_addr = self.local.clone();
        info.endpoint_id = self.endpoint_id;
        info.eager_limit = s.s.eager_limit;
        info.eager_origin = s.s.eager_origin;
        info.max_message = s.s.limits.message as usize;
        info.policy = s.s.policy.clone();
        info.pool = self.pool.stats();
        info.exposures = s.exposures.len();
        info.peers_connected = s.peers.iter().filter(|(_, p)| p.conns.iter().any(Option::is_some)).count();
        info.gauges.peers = s.peers.len();
        info.gauges.handshakes = s.admission.len();
        info.gauges.buffered_bytes = s.peers.buffered();
        info.gauges.transmit_bytes = s.peers.iter().map(|(_, p)| p.d.tx_bytes).sum();
        info.gauges.peers_paused = s.tx_paused.len();
    }

    fn shutdown(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.session.close_all();
        st.apply_actions(&self.registry);
        for s in st.socks.drain() {
            let _ = self.registry.deregister(&mut SourceFd(&s.stream.as_raw_fd()));
        }
        if let Some(mut l) = st.listener.take() {
            let _ = self.registry.deregister(&mut l);
        }
        st.read_ready.clear();
        self.deliver(st);
    }
}

impl TcpBackend {
    /// One round of progress, blocking up to `timeout`. `events_only`: the round an armed
    /// caller runs when the event descriptor is readable, which must collect epoll's events
    /// (a direct socket read would leave them listed, keeping the descriptor readable) and
    /// must not give up the CPU (its event loop has other work). Inlined into both callers:
    /// as a call of its own it made the compiler stop inlining the flush into the round trip's
    /// path (about 120 more instructions per 8 B round trip under callgrind).
    #[inline(always)]
    fn round(&self, timeout: Duration, events_only: bool) -> Result<bool> {
        let before = moved();
        if timeout.is_zero() && !events_only && self.spin_without_epoll() {
            let worked = moved() != before;
            self.after_spin(worked);
            return Ok(worked);
        }
        let mut guard = self.poller.lock().unwrap_or_else(|p| p.into_inner());
        let mut timeout = timeout;
        let direct = {
            // Write what posts queued; if that completed something, do not sleep.
            let mut st = self.lock();
            st.flush_ready(&self.registry);
            // Connections queued for reading outside a round (one unstalled by a post) are
            // read now: epoll has no new edge for them.
            if st.round_due() {
                timeout = Duration::ZERO;
            }
            if self.woken.load(Ordering::Relaxed) && self.woken.swap(false, Ordering::Relaxed) {
                st.direct_holdoff = direct::DIRECT_HOLDOFF;
            }
            let direct = if timeout >= direct::DIRECT_MIN_WAIT { st.direct_candidate() } else { None };
            if direct.is_some() {
                // Set under the state lock: every later post sees it and writes itself.
                self.blocked.store(true, Ordering::Release);
            }
            self.deliver(st);
            direct
        };
        if let Some(d) = direct {
            return self.direct_wait(d).map(|()| moved() != before);
        }
        let poller = &mut *guard;
        // A post may have queued frames between our flush and the flag: the wait looks once more.
        sockets::wait(&mut poller.poll, &mut poller.events, timeout, &self.blocked, || {
            self.lock().session.wants_transmit()
        })?;
        let mut guard_st = self.lock();
        let st = &mut *guard_st;
        st.direct_rounds = 0;
        if !poller.events.is_empty() {
            // Sockets are busy again: direct waits may pay.
            st.direct_idle = false;
        }
        if st.accept_more {
            st.accept(&self.registry);
        }
        for ev in poller.events.iter() {
            match ev.token() {
                LISTENER => st.accept(&self.registry),
                WAKER => {}
                t => {
                    let link = link_of(t);
                    let Some(s) = st.socks.get_mut(link) else { continue };
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        s.readable = true;
                        s.hup |= ev.is_read_closed() || ev.is_error();
                        st.read_ready.push_back(link);
                    }
                    if ev.is_writable() || ev.is_error() {
                        st.on_writable(link);
                    }
                }
            }
        }
        drop(guard);
        let mut st = guard_st;
        st.apply_actions(&self.registry);
        st.run_reads(&self.registry);
        st.flush_ready(&self.registry);
        st.timers(timeout.is_zero(), &self.registry);
        self.deliver(st);
        let worked = moved() != before;
        if timeout.is_zero() && !events_only {
            self.after_spin(worked);
        }
        Ok(worked)
    }

    /// After a busy-poll call: one that moved nothing after [`SPIN_CALLS_BEFORE_YIELD`] others
    /// like it gives up the CPU, so a thread that shares it (another client, the peer on an
    /// oversubscribed host) can run, as the InfiniBand engine does.
    fn after_spin(&self, worked: bool) {
        let yield_cpu = {
            let mut st = self.lock();
            if worked {
                st.idle_calls = 0;
                false
            } else {
                st.idle_calls = st.idle_calls.saturating_add(1);
                st.idle_calls >= SPIN_CALLS_BEFORE_YIELD
            }
        };
        if yield_cpu {
            Counters::add(&self.core.counters.spin_yields, 1);
            std::thread::yield_now();
        }
    }

    /// Busy-polling with few connections: try their sockets directly instead of asking epoll,
    /// which saves a syscall per arrival. Every `SPIN_EPOLL_EVERY`-th round still polls epoll
    /// for accepts, connects and writability. Returns false when epoll should be used.
    fn spin_without_epoll(&self) -> bool {
        // Several rounds per call, so the endpoint's per-round bookkeeping is amortised; the
        // lock is released between rounds so other threads can post.
        for _ in 0..SPIN_ROUNDS_PER_CALL {
            let mut guard = self.lock();
            let st = &mut *guard;
            st.spin_rounds = st.spin_rounds.wrapping_add(1);
            if st.spin_rounds.is_multiple_of(SPIN_EPOLL_EVERY)
                || st.socks.len() > SPIN_DIRECT_MAX_CONNS
                || st.accept_more
            {
                return false;
            }
            let before = st.session.events;
            for (link, s) in st.socks.iter_mut() {
                // A connection in a stream waits for a pull, which resumes it explicitly.
                if st.session.may_read(link) {
                    s.readable = true;
                    st.read_ready.push_back(link);
                }
            }
            st.run_reads(&self.registry);
            st.flush_ready(&self.registry);
            let progressed = st.session.done_len() > 0 || st.session.events != before;
            self.deliver(guard);
            if progressed {
                break;
            }
        }
        true
    }
}

impl State {
    /// Work a round must do now, with no socket event to announce it: completions to hand
    /// over, connections queued for reading past their share of the last round (or unstalled
    /// by a post), connections left in the listener's queue.
    fn round_due(&self) -> bool {
        self.session.done_len() > 0 || !self.read_ready.is_empty() || self.accept_more
    }

    /// Does what the session asked.
    #[inline]
    fn apply_actions(&mut self, registry: &Registry) {
        while let Some(a) = self.session.poll_action() {
            self.apply(a, registry);
        }
    }

    fn apply(&mut self, a: Action, registry: &Registry) {
        match a {
            Action::Dial { link, addr, sl } => {
                let cfg = &self.cfg;
                let r = sockets::dial(addr, |s| tune(&SockRef::from(s), cfg, sl, addr.is_ipv4())).and_then(
                    |mut stream| {
                        registry.register(
                            &mut stream,
                            token(link),
                            Interest::READABLE | Interest::WRITABLE,
                        )?;
                        Ok(stream)
                    },
                );
                match r {
                    Ok(stream) => {
                        self.socks.insert(link, Sock::new(stream, addr, true));
                        self.session.dial_started(Instant::now(), link);
                    }
                    Err(e) => self.session.link_failed(link, format!("connect to {addr}: {e}")),
                }
            }
            Action::Classify { link, sl } => {
                if let Some(s) = self.socks.get(link) {
                    tune(&SockRef::from(&*s.stream), &self.cfg, sl, s.remote.is_ipv4());
                }
            }
            Action::Resume { link } => {
                if let Some(s) = self.socks.get_mut(link) {
                    s.readable = true;
                    s.drained = false;
                    self.read_ready.push_back(link);
                }
            }
            Action::Close { link, farewell } => {
                let Some(s) = self.socks.remove(link) else { return };
                if let Some(f) = farewell {
                    let _ = send_one_now(&s.stream, &f);
                }
                if self.in_direct {
                    // A driver may be blocked reading it: end that read now (the socket itself
                    // closes when the driver lets go of it).
                    let _ = s.stream.shutdown(std::net::Shutdown::Read);
                }
            }
        }
    }

    fn accept(&mut self, registry: &Registry) {
        let Some(l) = &self.listener else { return };
        let (accepted, more) = sockets::accept_round(l);
        self.accept_more = more;
        for (mut stream, remote) in accepted {
            if self.closed {
                continue;
            }
            let link = self.session.new_link_id();
            if registry.register(&mut stream, token(link), Interest::READABLE | Interest::WRITABLE).is_err() {
                continue;
            }
            let s = Sock::new(stream, remote, false);
            self.session.accepted(link, remote);
            // A client sends its hello as soon as it is connected, so it is usually here
            // already: read it now, so that shedding tells this connection from the silent ones.
            let first = match self.session.recv_buffers(link) {
                RecvInto::Staging(buf) => recv_now(&s.stream, buf),
                _ => Err(io::ErrorKind::WouldBlock.into()),
            };
            match first {
                Ok(0) => {
                    // Closed already; dropping `s` closes our side.
                    self.session.link_failed(link, "connection closed by peer".into());
                    self.apply_actions(registry);
                    continue;
                }
                Ok(n) => self.session.received(link, n),
                Err(_) => self.session.received(link, 0),
            }
            self.socks.insert(link, s);
            self.session.admit(Instant::now(), link);
            self.apply_actions(registry);
            self.read_ready.push_back(link);
        }
    }

    fn on_writable(&mut self, link: LinkId) {
        let Some(s) = self.socks.get_mut(link) else { return };
        if s.connecting {
            match s.stream.take_error() {
                Ok(None) if s.stream.peer_addr().is_ok() => {}
                Ok(None) => return, // spurious: not connected yet
                Ok(Some(e)) | Err(e) => {
                    let reason = format!("connect to {}: {e}", s.remote);
                    self.session.link_failed(link, reason);
                    return;
                }
            }
            s.connecting = false;
            let _ = SockRef::from(&*s.stream).set_tcp_nodelay(true);
            self.session.link_up(Instant::now(), link);
        }
        self.session.link_writable(link);
    }

    fn timers(&mut self, polling: bool, registry: &Registry) {
        // While busy-polling, checked every few rounds only: reading the clock each round
        // costs as much as the round itself.
        self.timer_rounds = self.timer_rounds.wrapping_add(1);
        if polling && !self.timer_rounds.is_multiple_of(SPIN_TIMER_EVERY) {
            return;
        }
        self.session.handle_timeout(Instant::now());
        self.apply_actions(registry);
    }

    // ----------------------------------------------------------------------------------------
    // Writing
    // ----------------------------------------------------------------------------------------

    /// Writes queued frames on writable connections, classes served by the weighted scheduler.
    // The check inline at every caller, the work out of line: a round trip with nothing queued
    // pays a load and a branch. (Left to the compiler, the work was inlined into the check and
    // the whole call kept out of line, 90 instructions per 8 B round trip under callgrind.)
    #[inline(always)]
    fn flush_ready(&mut self, registry: &Registry) {
        if self.session.wants_transmit() {
            self.flush_ready_slow(registry);
        }
    }

    #[inline(never)]
    fn flush_ready_slow(&mut self, registry: &Registry) {
        let mut turn = mem::take(&mut self.turn);
        while let Some(quantum) = self.session.transmit_turn(&mut turn) {
            for &link in &turn {
                self.write_link(link, quantum);
            }
            self.apply_actions(registry);
        }
        turn.clear();
        self.turn = turn;
    }

    /// Before `cmd` goes on a connection this endpoint dialled that had no command for a
    /// while: if the peer closed it meanwhile, gives it up now, so that `cmd` dials afresh
    /// instead of failing in the closed connection (see [`crate::core::peers::IDLE_BEFORE_CHECK`]).
    fn check_if_idle(&mut self, cmd: &Cmd, registry: &Registry) {
        let Some(link) = cmd.sl().and_then(|sl| self.session.dialled_link(cmd.peer(), sl)) else { return };
        let Some(s) = self.socks.get_mut(link) else { return };
        if !s.last_command.idle_until(Instant::now()) {
            return;
        }
        if let Some(why) = sock::closed_while_idle(s) {
            self.session.link_failed(link, why);
            self.apply_actions(registry);
        }
    }

    /// Writes a fast-path eager send (see [`EagerNow`]) in one system call; returns the bytes
    /// written. What did not go (nothing, on a refusal or an error) the session queues for the
    /// ordinary write path ([`Session::eager_written`]).
    fn write_eager(&self, cmd: &Cmd, e: &EagerNow) -> usize {
        match self.socks.get(e.link) {
            Some(s) => {
                let r = if let Some(payload) = e.contiguous(cmd) {
                    send_pair_now(&s.stream, e.header(), payload)
                } else {
                    let mut iov = IoVec::default();
                    e.slices(cmd, &mut iov);
                    send_now(&s.stream, &iov)
                };
                r.unwrap_or(0)
            }
            None => 0,
        }
    }

    /// Writes up to `quantum` bytes from one connection.
    fn write_link(&mut self, link: LinkId, quantum: usize) {
        let mut written_total = 0;
        loop {
            let Some(s) = self.socks.get(link) else {
                // Not dialled yet, or closing: nothing can go.
                self.session.transmit_blocked(link);
                return;
            };
            if written_total >= quantum {
                return;
            }
            let mut iov = IoVec::default();
            if !self.session.transmit(link, &mut iov) {
                return;
            }
            let r = send_now(&s.stream, &iov);
            drop(iov);
            match r {
                Ok(0) => {
                    self.session.link_failed(link, "connection closed while writing".into());
                    return;
                }
                Ok(n) => {
                    written_total += n;
                    if !self.session.transmitted(link, n) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.session.transmit_blocked(link);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.session.link_failed(link, format!("write: {e}"));
                    return;
                }
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Reading
    // ----------------------------------------------------------------------------------------

    fn run_reads(&mut self, registry: &Registry) {
        let mut rounds = self.read_ready.len();
        while let Some(link) = self.read_ready.pop_front() {
            let again = self.read_link(link);
            if self.session.has_actions() {
                self.apply_actions(registry);
            }
            if again {
                self.read_ready.push_back(link);
            }
            rounds = rounds.saturating_sub(1);
            if rounds == 0 && !self.read_ready.is_empty() {
                // Fresh work queued by this round (unstalled peers) is served next round.
                rounds = self.read_ready.len();
            }
            if self.read_ready.len() > 4 * self.socks.len() + 16 {
                // Duplicates from repeated events: keep the queue bounded.
                let mut seen = HashSet::new();
                self.read_ready.retain(|l| seen.insert(*l));
            }
        }
    }

    /// Reads from one connection until it would block, pauses, or used its quantum. Returns
    /// true when it should get another turn.
    fn read_link(&mut self, link: LinkId) -> bool {
        let mut budget = READ_QUANTUM;
        let State { socks, session, .. } = self;
        let Some(s) = socks.get_mut(link) else { return false };
        // `drained` describes the last read of this turn only: whatever raised this turn may
        // have brought new bytes — unless the turn was raised by a direct wait's read, which
        // is this turn's read.
        if !mem::take(&mut s.drained_fresh) {
            s.drained = false;
        }
        loop {
            if !s.readable {
                return false;
            }
            if budget == 0 {
                return true;
            }
            let r = {
                let into = session.recv_buffers(link);
                // The mark is set before the read and before waiting for readiness: mid-payload,
                // a reader that drained the socket waits for a good part of what is still due;
                // a header may be as short as a frame, so every arrival counts again.
                let (room, mark) = match &into {
                    RecvInto::Paused => return false,
                    RecvInto::Staging(buf) => (buf.len(), 1),
                    RecvInto::Direct(dst) => {
                        let due = dst.iter().map(|d| d.len()).sum();
                        (due, payload_wake_mark(due))
                    }
                };
                s.set_wake_mark(mark);
                // A short read drained the socket: anything arriving later raises a new edge,
                // so skip the read that would only say EAGAIN — unless epoll already reported
                // the FIN, which no later edge repeats: then the read that returns EOF must
                // happen now.
                if s.drained && !s.hup {
                    s.drained = false;
                    s.readable = false;
                    return false;
                }
                match into {
                    RecvInto::Staging(buf) => recv_now(&s.stream, buf),
                    RecvInto::Direct(mut dst) => recv_vec_now(&s.stream, &mut dst),
                    RecvInto::Paused => return false,
                }
                .map(|n| (n, room))
            };
            match r {
                Ok((0, _)) => {
                    session.link_failed(link, "connection closed by peer".into());
                    return false;
                }
                Ok((n, room)) => {
                    budget = budget.saturating_sub(n);
                    s.drained = n < room;
                    session.received(link, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    session.received(link, 0);
                    s.readable = false;
                    return false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => session.received(link, 0),
                Err(e) => {
                    session.link_failed(link, format!("read: {e}"));
                    return false;
                }
            }
        }
    }
}

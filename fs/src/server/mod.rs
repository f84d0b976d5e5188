//! The servers: [`meta::MetaServer`] (namespace, layouts, capabilities) and [`io::IoServer`]
//! (object data). Both are a pool of worker threads over one bound ionet endpoint without a
//! progress thread (`spawn_workers`): a leader waits in `next_request`, driving the transport
//! itself, and serves the request it receives start to end (pipelined transfers included),
//! keeping the lead; requests that arrive meanwhile wake helpers. Several requests — from one
//! client or many — are therefore served at once, up to the number of workers, a request
//! reaches the thread that serves it without a hand-off, and a lone client's next request
//! meets a thread that is still polling for it.
//!
//! Nothing a peer sends panics a worker: headers go through [`proto::decode`] (bounded, typed
//! errors answered with an error reply), every io request's capability is checked before the
//! store is touched, and data moves through a bounded number of transfer-unit buffers.

pub mod io;
mod liveness;
pub mod meta;
mod precreate;
mod upstream;

use crate::proto::{
    self, BoundedString, DiskSpace, Envelope, ErrorReply, FsStats, Reply, ServerStats, ServerStatus,
};
use bytes::Bytes;
use ionet::{Endpoint, PeerId, Request};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{Span, debug, debug_span, warn};

/// How long a worker waits in `next_request` before checking for shutdown.
const POLL: Duration = Duration::from_millis(200);

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The transport refused (transport not available, …).
    #[error("transport: {0}")]
    Net(ionet::Error),
    /// The server could not listen on its address (in use, not this host's, …).
    #[error("{role} listening on {addr}: {error}")]
    Listen {
        /// "io server" or "meta server".
        role: &'static str,
        /// The address it was to listen on.
        addr: String,
        /// Why it could not.
        error: ionet::Error,
    },
    /// The metadata store.
    #[error(transparent)]
    Meta(#[from] crate::meta::MetaError),
    /// The object store or another local resource.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The cluster key.
    #[error(transparent)]
    Key(#[from] crate::capability::CapError),
    /// The cluster file.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A setting that does not make sense.
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl From<ionet::Error> for ServerError {
    fn from(e: ionet::Error) -> Self {
        ServerError::Net(e)
    }
}

/// Encodes `body` as the reply to request `id` and sends it; an unencodable reply becomes an
/// error reply. Waits until the reply is on its way, so its completion is reaped.
pub(crate) fn send_reply<R: Reply>(ep: &Endpoint, req: Request, id: u64, body: R) {
    let bytes = match proto::encode(&Envelope::new(id, body)) {
        Ok(b) => b,
        Err(e) => {
            warn!(error = %e, "reply does not encode; sending an error instead");
            let err = R::from_error(ErrorReply::new(e.errno(), &e));
            match proto::encode(&Envelope::new(id, err)) {
                Ok(b) => b,
                Err(_) => return, // dropping the request sends a transport-level error
            }
        }
    };
    match req.reply(Bytes::from(bytes)) {
        Ok(op) => {
            if let Err(e) = ep.wait(op).and_then(|c| c.result) {
                debug!(error = %e, "reply not delivered");
            }
        }
        Err(e) => debug!(error = %e, "reply not posted"),
    }
}

/// `statvfs` of `dir` in bytes; zeros (and a warning) if it fails, so the counters still reach
/// `stripefs servers` and `stripefs status`.
pub(crate) fn disk_space(dir: &std::path::Path) -> DiskSpace {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(v) => {
            let unit = v.fragment_size();
            let bytes = |blocks: u64| blocks.saturating_mul(unit);
            DiskSpace {
                total: bytes(v.blocks()),
                free: bytes(v.blocks_free()),
                avail: bytes(v.blocks_available()),
                fs_id: fs_id(dir),
            }
        }
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "statvfs of the data directory failed");
            DiskSpace::default()
        }
    }
}

/// The [`DiskSpace::fs_id`] of the file system holding `dir`: its device number under this
/// boot of this kernel (the boot id is random per boot, so it differs between hosts), so
/// servers on one host that share a file system report the same value and no others do,
/// whatever their data directories are called. 0 where either is unknown.
fn fs_id(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let boot = BOOT_ID.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok());
    let (Some(boot), Ok(meta)) = (boot, std::fs::metadata(dir)) else { return 0 };
    // FNV-1a: stable across builds and Rust versions, so servers of different builds agree.
    let fnv =
        |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let h = fnv(fnv(0xcbf2_9ce4_8422_2325, boot.trim().as_bytes()), &meta.dev().to_le_bytes());
    h.max(1)
}

/// What a server reports about its load in [`ServerStatus`]: when it started and the requests
/// it received, is serving and failed. Counting costs two atomic additions per request.
#[derive(Debug)]
pub(crate) struct Load {
    started: Instant,
    requests: AtomicU64,
    in_flight: AtomicU64,
    errors: AtomicU64,
}

/// A request being served: counted in flight until dropped.
pub(crate) struct Serving<'a>(&'a Load);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Load {
    pub(crate) fn new() -> Self {
        Load {
            started: Instant::now(),
            requests: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// A request arrived; it is in flight until the guard goes.
    pub(crate) fn begin(&self) -> Serving<'_> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Serving(self)
    }

    /// A request counted by [`Load::begin`], whose guard went when it was handed to another
    /// thread, is served there: in flight again until this guard goes.
    pub(crate) fn resume(&self) -> Serving<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Serving(self)
    }

    /// A request was answered with an error.
    pub(crate) fn failed(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests answered with an error so far.
    pub(crate) fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The status of a server keeping its data in `dir`, answered from inside a request (which
    /// is not counted in flight).
    pub(crate) fn status(&self, dir: &std::path::Path) -> ServerStatus {
        let mut s = self.status_outside(dir);
        s.in_flight = s.in_flight.saturating_sub(1);
        s
    }

    /// The status as seen from outside any request (a metrics scrape): every request being
    /// served counts in flight.
    pub(crate) fn status_outside(&self, dir: &std::path::Path) -> ServerStatus {
        ServerStatus {
            version: BoundedString::truncating(env!("CARGO_PKG_VERSION")),
            uptime_ns: u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX),
            requests: self.requests.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            errors: self.errors(),
            disk: disk_space(dir),
        }
    }
}

/// A server's own figures at one instant, read in-process (see [`ServerHandle::report`]):
/// what `stripefs serve --metrics` exports next to the endpoint's counters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerReport {
    /// Requests received, in flight (all of them: nothing is asking from inside a request),
    /// failed; uptime and the space of the data directory.
    pub status: ServerStatus,
    /// An io server's data-path counters.
    pub io: Option<ServerStats>,
    /// The meta server's namespace counts (`None` for an io server, or if the database could
    /// not be read).
    pub meta: Option<FsStats>,
    /// The meta server's commits awaiting a flush and its files made ahead (`None` for an io
    /// server).
    pub meta_state: Option<MetaState>,
}

/// What the meta server holds beside its namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetaState {
    /// Commits acknowledged but not yet flushed to disk (changes of times, mode bits added;
    /// flushed within about a second): what a crash of the server or its machine would lose now.
    pub unflushed: u64,
    /// Files whose objects are made ahead on every io server, ready for creates.
    pub made_ahead: u64,
}

/// Reads a server's [`ServerReport`] (see [`ServerHandle::reporter`]).
#[derive(Debug, Clone)]
pub struct Reporter(Arc<dyn Reporting>);

impl Reporter {
    /// The server's own counters now.
    pub fn report(&self) -> ServerReport {
        self.0.report()
    }
}

/// What a server's shared state reports (see [`ServerHandle::report`]).
pub(crate) trait Reporting: Send + Sync + std::fmt::Debug {
    fn report(&self) -> ServerReport;
}

/// Most peers whose `connection` spans a server keeps; past it they are started afresh (a
/// server that has seen very many clients would otherwise hold a span for each forever).
const MAX_PEER_SPANS: usize = 4096;

/// A `connection` span (peer id and address) per peer a server has had requests from, so the
/// debug log tells each peer's requests apart; the request spans are its children. Kept only
/// while debug logging is on: otherwise a lookup is one level check.
#[derive(Debug, Default)]
pub(crate) struct PeerSpans(Mutex<HashMap<PeerId, Span>>);

impl PeerSpans {
    /// `peer`'s span on `ep` (made, with a debug line, at its first request).
    pub(crate) fn span(&self, ep: &Endpoint, peer: PeerId) -> Span {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return Span::none();
        }
        let mut spans = crate::lock(&self.0);
        if let Some(s) = spans.get(&peer) {
            return s.clone();
        }
        if spans.len() >= MAX_PEER_SPANS {
            spans.clear();
        }
        let addr = ep.peer_addr(peer).map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        let span = debug_span!("connection", %peer, %addr);
        span.in_scope(|| debug!("first request from this peer"));
        spans.insert(peer, span.clone());
        span
    }
}

/// Running server threads. Dropping the handle stops them.
#[derive(Debug)]
pub struct ServerHandle {
    ep: Endpoint,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// A directory on the file system holding the server's data, synced by [`ServerHandle::drain`].
    data_dir: Option<std::path::PathBuf>,
    /// The server's own counters, for [`ServerHandle::report`].
    reporting: Option<Arc<dyn Reporting>>,
    /// The endpoint the server reaches other servers through (the meta server's to the io
    /// servers), for its counters.
    upstream: Option<Endpoint>,
}

/// How a [`ServerHandle::drain`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Worker threads still serving a request when the drain timeout ran out; their requests
    /// failed when the endpoint shut down.
    pub busy_workers: usize,
}

impl ServerHandle {
    pub(crate) fn new(ep: Endpoint, stop: Arc<AtomicBool>, threads: Vec<JoinHandle<()>>) -> Self {
        ServerHandle { ep, stop, threads, data_dir: None, reporting: None, upstream: None }
    }

    /// [`ServerHandle::upstream`] is `ep`.
    pub(crate) fn with_upstream(mut self, ep: Endpoint) -> Self {
        self.upstream = Some(ep);
        self
    }

    /// The endpoint the server reaches other servers through, if it has one of its own (the
    /// meta server's to the io servers), for its counters.
    pub fn upstream(&self) -> Option<&Endpoint> {
        self.upstream.as_ref()
    }

    /// [`ServerHandle::report`] asks `r`.
    pub(crate) fn reporting(mut self, r: Arc<dyn Reporting>) -> Self {
        self.reporting = Some(r);
        self
    }

    /// The server's own counters now (requests, errors, in flight, space; an io server's data
    /// paths, the meta server's file counts), without a request over the network; `None` for
    /// a bare worker pool.
    pub fn report(&self) -> Option<ServerReport> {
        self.reporting.as_ref().map(|r| r.report())
    }

    /// What reads [`ServerHandle::report`] from another thread (a metrics responder), for as
    /// long as the server's state lives.
    pub fn reporter(&self) -> Option<Reporter> {
        self.reporting.clone().map(Reporter)
    }

    /// [`ServerHandle::drain`] syncs the file system holding `dir`.
    pub(crate) fn syncing(mut self, dir: std::path::PathBuf) -> Self {
        self.data_dir = Some(dir);
        self
    }

    /// Stops the server gracefully: workers take no new requests and finish the ones they
    /// serve, for at most `timeout`; then the endpoint shuts down (requests still queued or
    /// being served fail, and clients see the server's connection close) and the file system
    /// holding the server's data is synced (`syncfs`), so every write it acknowledged is on
    /// disk. Fails only if the sync does.
    pub fn drain(mut self, timeout: Duration) -> std::io::Result<Drained> {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let busy_workers = self.threads.iter().filter(|t| !t.is_finished()).count();
        self.ep.shutdown();
        // Finished threads are joined; the busy ones are left to fail on the closed endpoint.
        for t in std::mem::take(&mut self.threads) {
            if t.is_finished() {
                let _ = t.join();
            }
        }
        if let Some(dir) = &self.data_dir {
            let d = std::fs::File::open(dir)?;
            nix::unistd::syncfs(&d).map_err(std::io::Error::from)?;
        }
        Ok(Drained { busy_workers })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> Option<ionet::Address> {
        self.ep.local_addr()
    }

    /// The server's endpoint (for its counters).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Blocks until the server stops (it only stops when told to).
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops the workers (each finishes its current request) and waits for them.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// How often a standing-by worker looks for requests while the leader serves one: the bound on
/// how long a new request waits when the busy leader is not driving the transport (a long disk
/// operation) and so does not queue it.
const STANDBY: Duration = Duration::from_millis(1);

/// Who does what in a worker pool. One worker at a time *leads*: it waits in `next_request` and
/// serves what it receives itself, keeping the lead. A client's next request, which usually
/// follows the reply within microseconds, then meets a thread that is already polling for it,
/// as in a single-threaded server — not one that went to sleep in the transport while the
/// previous request was served (over InfiniBand the client pays for waking it). The other
/// workers (*helpers*) sleep here, not on the endpoint. While the leader serves, every request
/// the transport queues wakes one helper to serve it (through [`Endpoint::on_request`]), and one
/// helper stands by, looking every [`STANDBY`] for requests nobody has queued.
#[derive(Debug, Default)]
struct Pool {
    st: Mutex<PoolState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    /// A worker leads.
    led: bool,
    /// The leader is serving a request (not waiting in `next_request`).
    serving: bool,
    /// Requests queued while the leader serves that no woken helper has looked for yet.
    queued: usize,
    /// A helper stands by.
    standby: bool,
    /// Workers asleep on `cv` (a notify costs a futex call, so it is skipped when none).
    sleeping: usize,
}

/// What [`Pool::role`] gives a worker to do.
#[derive(Debug, PartialEq, Eq)]
enum Role {
    /// Lead: wait for requests and serve them, until stopping.
    Lead,
    /// Take a request that is there, without waiting, and serve it.
    Help,
    /// The pool is stopping.
    Stop,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for something to do.
    fn role(&self, stop: &AtomicBool) -> Role {
        let mut st = self.lock();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Role::Stop;
            }
            if !st.led {
                st.led = true;
                return Role::Lead;
            }
            if st.queued > 0 {
                st.queued -= 1;
                return Role::Help;
            }
            let standby = st.serving && !st.standby;
            st.standby |= standby;
            st.sleeping += 1;
            let nap = if standby { STANDBY } else { POLL };
            let (g, r) = self.cv.wait_timeout(st, nap).unwrap_or_else(|p| p.into_inner());
            st = g;
            st.sleeping -= 1;
            if standby {
                st.standby = false;
                if r.timed_out() && st.serving {
                    return Role::Help;
                }
            }
        }
    }

    /// The leader took a request (`true`) or finished serving it (`false`: it takes whatever
    /// is queued itself from now on).
    fn serving(&self, on: bool) {
        let mut st = self.lock();
        st.serving = on;
        if !on {
            st.queued = 0;
        }
    }

    /// The leader gives up the lead: the pool is stopping, or its handler panicked.
    fn step_down(&self) {
        let mut st = self.lock();
        st.led = false;
        st.serving = false;
        if st.sleeping > 0 {
            self.cv.notify_all();
        }
    }

    /// The transport queued a request: if the leader is busy serving, wake a helper for it.
    fn request_queued(&self) {
        let mut st = self.lock();
        if st.serving {
            st.queued += 1;
            if st.sleeping > 0 {
                self.cv.notify_one();
            }
        }
    }
}

/// Runs `handle` for every request on `ep` in `workers` threads until `stop`: a leader that
/// serves what it receives and keeps the lead, and helpers for requests that arrive while it
/// is busy (see [`Pool`]). With no progress thread, whoever waits drives the transport, so a
/// request reaches the thread that serves it without a hand-off.
pub(crate) fn spawn_workers<F>(
    name: &str,
    ep: &Endpoint,
    workers: usize,
    stop: &Arc<AtomicBool>,
    handle: F,
) -> std::io::Result<Vec<JoinHandle<()>>>
where
    F: Fn(Request) + Send + Sync + 'static,
{
    let handle = Arc::new(handle);
    let pool = Arc::new(Pool::default());
    let p = pool.clone();
    if let Err(e) = ep.on_request(move || p.request_queued()) {
        return Err(std::io::Error::other(e.to_string()));
    }
    // At error level, so that warnings and errors from any worker name the server (its role
    // and address) whatever the log level; entered once per thread, not per request.
    let addr = ep.local_addr().map_or_else(String::new, |a| a.to_string());
    let span = tracing::error_span!("server", role = name, %addr);
    (0..workers.max(1))
        .map(|i| {
            let (ep, stop, handle, pool) = (ep.clone(), stop.clone(), handle.clone(), pool.clone());
            let span = span.clone();
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                let _server = span.enter();
                loop {
                    match pool.role(&stop) {
                        Role::Stop => break,
                        Role::Help => match ep.next_request(Some(Duration::ZERO)) {
                            Ok(Some(req)) => handle(req),
                            Ok(None) => {}
                            Err(e) => debug!(error = %e, "next_request failed"),
                        },
                        Role::Lead => {
                            // Steps down however the lead ends, a panicking handler included:
                            // another worker must be able to lead.
                            let _lead = StepDown(&pool);
                            while let Some(req) = lead_wait(&ep, &stop) {
                                pool.serving(true);
                                handle(req);
                                pool.serving(false);
                            }
                            break;
                        }
                    }
                }
            })
        })
        .collect()
}

/// Gives up the lead when dropped.
struct StepDown<'a>(&'a Pool);

impl Drop for StepDown<'_> {
    fn drop(&mut self) {
        self.0.step_down();
    }
}

/// The leader's wait for the next request; `None` once stopping.
fn lead_wait(ep: &Endpoint, stop: &AtomicBool) -> Option<Request> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        match ep.next_request(Some(POLL)) {
            Ok(Some(req)) => return Some(req),
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, "next_request failed");
                std::thread::sleep(POLL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ionet::{Config, Payload, ServiceLevel};
    use std::time::Instant;

    /// Waits until `n` threads arrived, or 10 s; true if all arrived.
    fn meet(m: &(Mutex<usize>, Condvar), n: usize) -> bool {
        let mut k = m.0.lock().unwrap();
        *k += 1;
        m.1.notify_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        while *k < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            k = m.1.wait_timeout(k, left).unwrap().0;
        }
        true
    }

    /// A bound endpoint, a client connected to it, and `workers` pool threads running `handle`.
    fn pool(
        workers: usize,
        handle: impl Fn(Request) + Send + Sync + 'static,
    ) -> (Endpoint, ionet::PeerId, ServerHandle) {
        let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = spawn_workers("t", &ep, workers, &stop, handle).unwrap();
        let addr = ep.local_addr().unwrap();
        let client = Endpoint::client(Config::default()).unwrap();
        let peer = client.connect(&addr).unwrap();
        (client, peer, ServerHandle::new(ep, stop, threads))
    }

    fn ask(c: &Endpoint, peer: ionet::PeerId) -> ionet::OpId {
        let op = c.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        c.set_deadline(op, Instant::now() + Duration::from_secs(20)).unwrap();
        op
    }

    /// Two requests in flight are served at the same time by two workers: each handler waits
    /// for the other, which a pool serving one request at a time never gets past (it answers
    /// "alone" after 10 s instead).
    #[test]
    fn requests_are_served_concurrently_up_to_the_worker_count() {
        let m = Arc::new((Mutex::new(0usize), Condvar::new()));
        let (c, peer, server) = pool(2, move |req| {
            let answer: &'static [u8] = if meet(&m, 2) { b"together" } else { b"alone" };
            let _ = req.reply(Bytes::from_static(answer));
        });
        let ops = [ask(&c, peer), ask(&c, peer)];
        for op in ops {
            let done = c.wait(op).unwrap();
            assert!(done.result.is_ok(), "{:?}", done.result);
            assert_eq!(done.reply.as_deref(), Some(&b"together"[..]));
        }
        server.shutdown();
    }

    /// With one worker every request is still answered, one after the other, and the lead
    /// passes back to the same thread each time.
    #[test]
    fn a_single_worker_serves_requests_in_turn() {
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s = served.clone();
        let (c, peer, server) = pool(1, move |req| {
            s.fetch_add(1, Ordering::Relaxed);
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        let ops: Vec<_> = (0..20).map(|_| ask(&c, peer)).collect();
        for op in ops {
            assert!(c.wait(op).unwrap().result.is_ok());
        }
        assert_eq!(served.load(Ordering::Relaxed), 20);
        server.shutdown();
    }

    /// One client asking one request at a time is served by the leader every time: it keeps
    /// the lead instead of handing it to a helper that would have to be woken for the next one.
    #[test]
    fn a_lone_client_is_served_by_the_leader_every_time() {
        let threads = Arc::new(Mutex::new(Vec::new()));
        let t = threads.clone();
        let (c, peer, server) = pool(4, move |req| {
            t.lock().unwrap().push(std::thread::current().id());
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        for _ in 0..20 {
            assert!(c.wait(ask(&c, peer)).unwrap().result.is_ok());
        }
        let seen = threads.lock().unwrap().clone();
        assert_eq!(seen.len(), 20);
        assert!(seen.iter().all(|id| *id == seen[0]), "served by {seen:?}");
        server.shutdown();
    }

    /// A handler that panics ends its thread, not the pool's leadership: the next request is
    /// served by a worker that took the lead (the one left).
    #[test]
    fn a_panicking_handler_gives_up_the_lead() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = calls.clone();
        let (c, peer, server) = pool(2, move |req| {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("handler bug (expected by the test)");
            }
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        // The first request's reply is the transport's "dropped" error.
        assert!(c.wait(ask(&c, peer)).unwrap().result.is_err());
        for _ in 0..5 {
            assert!(c.wait(ask(&c, peer)).unwrap().result.is_ok());
        }
        server.shutdown();
    }

    /// A handler that serves its request only once `go` says so; tells `started` first.
    fn gated(started: std::sync::mpsc::Sender<()>, go: std::sync::mpsc::Receiver<()>) -> impl Fn(Request) {
        let (started, go) = (Mutex::new(started), Mutex::new(go));
        move |req: Request| {
            let _ = started.lock().unwrap().send(());
            let _ = go.lock().unwrap().recv();
            let _ = req.reply(Bytes::from_static(b"ok"));
        }
    }

    /// Draining lets the request being served finish (its reply arrives), then the endpoint
    /// is shut: a later request fails instead of being served.
    #[test]
    fn drain_finishes_the_request_being_served_then_refuses_more() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let (c, peer, server) = pool(2, gated(started_tx, go_rx));
        // The client's wait drives its side of the transport, so it runs meanwhile.
        let op = ask(&c, peer);
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.wait(op));
        started.recv().unwrap();
        let drain = std::thread::spawn(move || server.drain(Duration::from_secs(60)));
        go.send(()).unwrap();
        let drained = drain.join().unwrap().unwrap();
        assert_eq!(drained.busy_workers, 0);
        let done = waiter.join().unwrap().unwrap();
        assert!(done.result.is_ok(), "{:?}", done.result);
        assert_eq!(done.reply.as_deref(), Some(&b"ok"[..]));
        let later = c.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal);
        let failed = match later {
            Err(_) => true,
            Ok(op) => {
                c.set_deadline(op, Instant::now() + Duration::from_secs(20)).unwrap();
                c.wait(op).map_or(true, |d| d.result.is_err())
            }
        };
        assert!(failed, "a request after the drain was served");
    }

    /// A request still being served when the drain timeout runs out fails: its worker is
    /// reported busy and the client gets an error, not a hang.
    #[test]
    fn drain_fails_a_request_that_outlasts_the_timeout() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let (c, peer, server) = pool(1, gated(started_tx, go_rx));
        let op = ask(&c, peer);
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.wait(op));
        started.recv().unwrap();
        let drained = server.drain(Duration::from_millis(50)).unwrap();
        assert_eq!(drained.busy_workers, 1);
        let done = waiter.join().unwrap().unwrap();
        assert!(done.result.is_err(), "the request outlasting the drain succeeded");
        go.send(()).unwrap();
    }

    #[test]
    fn step_down_runs_on_unwind() {
        let p = Arc::new(Pool::default());
        let stop = AtomicBool::new(false);
        let p2 = p.clone();
        let r = std::thread::spawn(move || {
            let stop = AtomicBool::new(false);
            assert_eq!(p2.role(&stop), Role::Lead);
            let _lead = StepDown(&p2);
            p2.serving(true);
            panic!("handler bug (expected by the test)");
        })
        .join();
        assert!(r.is_err());
        assert!(!p.lock().led && !p.lock().serving);
        assert_eq!(p.role(&stop), Role::Lead, "the lead is free again");
    }

    #[test]
    fn roles_lead_help_and_stop() {
        let p = Arc::new(Pool::default());
        let stop = Arc::new(AtomicBool::new(false));
        assert_eq!(p.role(&stop), Role::Lead);
        // Not serving: the leader takes queued requests itself, nobody is woken.
        p.request_queued();
        assert_eq!(p.lock().queued, 0);
        // Serving: a queued request wakes a sleeping helper. Another worker stands by already,
        // so this one sleeps until woken (a stand-by would get up on its own after a
        // millisecond, which a busy machine may let pass unseen).
        p.serving(true);
        p.lock().standby = true;
        let (p2, s2) = (p.clone(), stop.clone());
        let helper = std::thread::spawn(move || p2.role(&s2));
        let t = Instant::now();
        while p.lock().sleeping == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "the helper never slept");
            std::thread::yield_now();
        }
        p.request_queued();
        assert_eq!(helper.join().unwrap(), Role::Help);
        // The stand-by helper looks on its own while the leader serves.
        p.lock().standby = false;
        assert_eq!(p.role(&stop), Role::Help);
        // Done serving: leftovers are the leader's.
        p.request_queued();
        p.serving(false);
        assert_eq!(p.lock().queued, 0);
        stop.store(true, Ordering::Relaxed);
        assert_eq!(p.role(&stop), Role::Stop);
        p.step_down();
        assert!(!p.lock().led);
    }
}

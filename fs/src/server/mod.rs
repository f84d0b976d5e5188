//! The servers: [`meta::MetaServer`] (namespace, layouts, capabilities) and [`io::IoServer`]
//! (object data). Both are a pool of worker threads over one bound ionet endpoint without a
//! progress thread (`spawn_workers`): a leader waits in `next_request`, driving the transport
//! itself, and serves the request it receives start to end (pipelined transfers included),
//! keeping the lead; requests that arrive meanwhile wake helpers. Several requests — from one
//! client or many — are therefore served at once, up to the number of workers, a request
//! reaches the thread that serves it without a hand-off, and a lone client's next request
//! meets a thread that is still polling for it. A request that waits on its client (a
//! transfer or an answer to a client that stopped reading) leaves the pool for a thread of its
//! own, so clients that stop hold no worker (`pool`).
//!
//! Nothing a peer sends panics a worker: headers go through [`proto::decode`] (bounded, typed
//! errors answered with an error reply), every io request's capability is checked before the
//! store is touched, and data moves through a bounded number of transfer-unit buffers.

pub mod io;
mod liveness;
pub mod meta;
mod pool;
pub(crate) use pool::{Threads, Worker, spawn_workers};
mod precreate;
mod upstream;

use crate::proto::{
    self, BoundedString, DiskSpace, Envelope, ErrorReply, FsStats, Reply, ServerStats, ServerStatus,
};
use bytes::Bytes;
use ionet::{Endpoint, PeerId, Request};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{Span, debug, debug_span, warn};

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
/// error reply. Waits until the reply is on its way, so its completion is reaped; on a pool
/// worker (`w`), out of the pool once the client is slow to take it.
pub(crate) fn send_reply<R: Reply>(ep: &Endpoint, w: Option<&Worker>, req: Request, id: u64, body: R) {
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
            let done = match w {
                Some(w) => w.wait_on_client(op),
                None => ep.wait(op),
            };
            if let Err(e) = done.and_then(|c| c.result) {
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
    threads: Threads,
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
    pub(crate) fn new(ep: Endpoint, stop: Arc<AtomicBool>, threads: Threads) -> Self {
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
    pub fn drain(self, timeout: Duration) -> std::io::Result<Drained> {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        while self.threads.running() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let busy_workers = self.threads.running();
        self.ep.shutdown();
        // Finished threads are joined; the busy ones are left to fail on the closed endpoint.
        self.threads.join_finished();
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
    pub fn join(self) {
        self.threads.join_all();
    }

    /// Stops the workers (each finishes its current request) and waits for them.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.join_all();
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

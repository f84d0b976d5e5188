//! An io server: object data on local disk, moved in pipelined transfer units.
//!
//! # Data path
//! * **Write**: the client's request carries a descriptor (this server's local pieces, in
//!   stream order) and offers the data as an OUT payload of exactly the stream's length. The
//!   server pulls it in transfer units into buffers from `Endpoint::alloc` (pre-faulted; the
//!   registered zone buffers on InfiniBand) with up to [`IoServerConfig::pipeline_depth`] pulls
//!   outstanding, and `pwrite`s each unit as it lands while the next ones are on the wire.
//! * **Read**: the server `pread`s a unit and pushes it into the client's IN buffer, keeping up
//!   to `pipeline_depth` pushes in flight, so disk reads overlap the network.
//! * **Mapped** (the default, [`IoServerConfig::mapped`]): the same pipelines move units straight
//!   between the network and the object file's pages ([`ionet::FileMap`]): writes reserve the
//!   descriptor's space first (`fallocate` keeping the size, so a full disk fails the request
//!   before a byte moves), lengthen the file just ahead of each unit they pull into the file's
//!   regions, and count a unit into the object's size only once it landed (a failed write is
//!   cut back to what landed); reads push from them, with zeros past the local end. The
//!   transport's copy is the only one. Descriptors whose pieces are out of order, offsets past
//!   the mapping limit and file systems without `fallocate` fall back to the copying path.
//!   Writes map only on file systems known to rewrite allocated blocks in place
//!   ([`FileSystem::rewrites_in_place`]: ext4, tmpfs), checked once at start; on others (btrfs,
//!   XFS, ZFS, …) a store into a full disk would fault however much was reserved, so every
//!   write is copied there (and reads stay mapped).
//!   [`ServerStats`] counts the requests each path took and the fallbacks by reason, so tests
//!   and benchmarks can tell which one ran.
//! * On a disk error (`ENOSPC`, `EIO`, …) the server stops pulling, lets the outstanding pulls
//!   finish and replies with the error: ionet discards what was never pulled, so the
//!   connection stays in step (the equivalent of PVFS1's drain-and-discard).

use super::{
    Load, PeerSpans, Reporting, ServerError, ServerHandle, ServerReport, Worker, disk_space, send_reply,
    spawn_workers,
};
use crate::capability::{CapabilityKey, Rights, unix_now};
use crate::errno::Errno;
use crate::layout::Piece;
use crate::net::Traced;
use crate::proto::{
    self, BoundedVec, Descriptor, ErrorReply, Fallbacks, Handle, IoReply, IoRequest, PathStats, ServerStats,
};
use crate::store::{FileSystem, Object, ObjectStore, PieceCursor, StoreConfig, StoreError, Writing};
use bytes::Bytes;
use ionet::{
    Address, Direction, Endpoint, FileMapError, OpBuf, OpId, RecvBuf, RegisteredBuf, Request, SendBuf, Turn,
    WaitMode,
};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, debug_span, info, warn};

/// io server settings.
#[derive(Debug, Clone)]
pub struct IoServerConfig {
    /// Where to listen (`tcp://host:port`, port 0 = any).
    pub listen: Address,
    /// The object directory.
    pub data_dir: PathBuf,
    /// The cluster key (authenticates connections and verifies capabilities).
    pub key: Vec<u8>,
    /// Bytes per pipelined transfer (default 1 MiB).
    pub transfer_unit: usize,
    /// Transfers in flight per request (default 4; at least 2).
    pub pipeline_depth: usize,
    /// Requests served at once (default 4).
    pub workers: usize,
    /// How threads wait for the transport.
    pub wait_mode: WaitMode,
    /// How long adaptive waiters keep polling after the last work before they block (default
    /// [`DEFAULT_SPIN_BUDGET`]).
    pub spin_budget: Duration,
    /// Open files kept in the descriptor cache (0 = reopen for every request).
    pub max_open: usize,
    /// Longest a single pull or push may take before the request is abandoned.
    pub transfer_timeout: Duration,
    /// Threads serving clients slow to take or give their data, beside the workers (default
    /// [`DEFAULT_SLOW_CLIENT_THREADS`]). A request whose pull, push or reply has waited
    /// [`CLIENT_STALL`] goes on waiting out of the worker pool, a new worker taking its place,
    /// and that client's later requests queue for it rather than take workers. Past this many,
    /// such requests wait in their workers. Each holds up to `pipeline_depth` transfer units
    /// of buffers on the copying path.
    pub slow_client_threads: usize,
    /// InfiniBand engine settings of the server's endpoint (default: ionet's).
    pub ib: Option<ionet::IbConfig>,
    /// Move data straight between the network and mapped object files (default true); off,
    /// every unit is staged in a buffer and `pread`/`pwrite`. Writes map only into memory
    /// file systems (tmpfs) unless [`map_disk_writes`](Self::map_disk_writes) is set.
    pub mapped: bool,
    /// Also write through mappings on disk file systems known to rewrite in place (ext4;
    /// default false). There every store into a mapped page takes a fault that first brings the
    /// page in, and pages under writeback stall the next store, so `pwrite` from a buffer is
    /// faster even with its extra copy; set this to keep the transport's copy the only one.
    pub map_disk_writes: bool,
    /// Dirty bytes an object gathers before the server starts their writeback (default
    /// [`DEFAULT_WRITE_BEHIND`]; 0: leave it to the kernel and the client's fsync).
    pub write_behind: u64,
    /// Congestion control of the server's TCP connections, which carry reads' data; `None`
    /// keeps the kernel's (default: [`crate::net::tcp_congestion`], reno unless
    /// `STRIPEFS_TCP_CONGESTION` says otherwise).
    pub tcp_congestion: Option<String>,
}

/// Default transfer unit of the io servers: 1 MiB.
pub const DEFAULT_TRANSFER_UNIT: usize = crate::config::DEFAULT_TRANSFER_UNIT as usize;

/// Default pipeline depth.
pub const DEFAULT_PIPELINE_DEPTH: usize = 4;

/// Default [`IoServerConfig::slow_client_threads`].
pub const DEFAULT_SLOW_CLIENT_THREADS: usize = 64;

pub use super::pool::CLIENT_STALL;

pub use crate::store::DEFAULT_WRITE_BEHIND;

/// How often a mapped transfer looks again at an object range another request holds: often,
/// since the holder usually lets go within a transfer unit's time.
const RANGE_POLL: Duration = Duration::from_micros(50);

/// The same once the range has been held for [`CLIENT_STALL`]: its holder likely waits on a
/// client that stopped, for as long as that lasts, and polling every 50 µs for it would cost a
/// CPU's wake-ups.
const RANGE_POLL_STALLED: Duration = Duration::from_millis(5);

/// Default adaptive spin budget of an io server: 2 ms, against ionet's 100 µs. A client's call
/// visits its servers one after another, so with N servers each waits (N − 1) × a request's
/// transfer between its requests, 0.4–1.1 ms here. With 100 µs it is asleep when the next
/// request arrives: the request waits for a wake-up, and meanwhile the sender's CPU also runs
/// the receive side of the stream (a reader inside `recvmsg` would take that over). E1 with
/// 2 ms against 100 µs (`benchmarks/journal/e1-io-servers-poll-for-2-ms-after-their-last-work.md`):
/// over softib 7–16 % more bandwidth, over tcp the
/// same within this machine's noise (geometric-mean ratios +0.03 writing, +0.02 reading).
pub const DEFAULT_SPIN_BUDGET: Duration = Duration::from_millis(2);

impl IoServerConfig {
    /// Defaults for a server on `listen` storing in `data_dir`.
    pub fn new(listen: Address, data_dir: impl Into<PathBuf>, key: &[u8]) -> Self {
        IoServerConfig {
            listen,
            data_dir: data_dir.into(),
            key: key.to_vec(),
            transfer_unit: DEFAULT_TRANSFER_UNIT,
            pipeline_depth: DEFAULT_PIPELINE_DEPTH,
            workers: 4,
            wait_mode: WaitMode::Adaptive,
            spin_budget: DEFAULT_SPIN_BUDGET,
            max_open: StoreConfig::default().max_open,
            transfer_timeout: Duration::from_secs(60),
            slow_client_threads: DEFAULT_SLOW_CLIENT_THREADS,
            ib: None,
            mapped: true,
            map_disk_writes: false,
            write_behind: DEFAULT_WRITE_BEHIND,
            tcp_congestion: crate::net::tcp_congestion(),
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    syncs: AtomicU64,
    mapped: PathCounters,
    copied: PathCounters,
    unordered: AtomicU64,
    beyond_map: AtomicU64,
    no_fallocate: AtomicU64,
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The requests one data path took (see [`PathStats`]).
#[derive(Debug, Default)]
struct PathCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes: AtomicU64,
}

impl PathCounters {
    /// Counts a request of `total` bytes that this path took, and passes its result on.
    fn took(&self, dir: Direction, total: u64, r: Result<(), Fail>) -> Result<(), Fail> {
        let requests = if dir == Direction::Out { &self.writes } else { &self.reads };
        requests.fetch_add(1, Ordering::Relaxed);
        if r.is_ok() {
            self.bytes.fetch_add(total, Ordering::Relaxed);
        }
        r
    }

    fn snapshot(&self) -> PathStats {
        PathStats { reads: load(&self.reads), writes: load(&self.writes), bytes: load(&self.bytes) }
    }
}

/// What the mapped path did with a request.
enum Mapped {
    /// It ran; the request's result.
    Ran(Result<(), Fail>),
    /// It declined before moving a byte: the request needs the copying path.
    Declined(Fallback),
}

/// Why the mapped path declined a request (counted in [`Fallbacks`]).
#[derive(Debug, Clone, Copy)]
enum Fallback {
    Unordered,
    BeyondMap,
    NoFallocate,
}

#[derive(Debug)]
struct Shared {
    ep: Endpoint,
    store: ObjectStore,
    key: CapabilityKey,
    cfg: IoServerConfig,
    /// Writes may take the mapped path (mapping on, and the data directory's file system
    /// rewrites in place).
    mapped_writes: bool,
    stats: Stats,
    /// Requests received, in flight and failed, and the start time.
    load: Load,
    /// The debug log's span per peer.
    peers: PeerSpans,
}

/// Whether a mapping io server writes through mappings into `dir` (always into memory, into a
/// disk only if `disk` allows it and the file system is safe for it); says why not if not.
fn mapped_writes_wanted(dir: &std::path::Path, disk: bool) -> bool {
    match FileSystem::of(dir) {
        Ok(fs) if fs.in_memory() => true,
        Ok(fs) if disk && fs.rewrites_in_place() => true,
        Ok(fs) if !disk => {
            info!(
                dir = %dir.display(), fs = fs.name,
                "writes are copied: pwrite from a buffer beats stores through a mapping on a disk \
                 file system"
            );
            false
        }
        Ok(fs) => {
            info!(
                dir = %dir.display(), fs = fs.name, magic = format_args!("{:#x}", fs.magic),
                "not a file system known to rewrite in place (ext4, tmpfs): writes are copied, \
                 since a store through a mapping could fault on a full disk"
            );
            false
        }
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "statfs of the data directory failed: writes are copied");
            false
        }
    }
}

/// An io server.
#[derive(Debug)]
pub struct IoServer;

impl IoServer {
    /// Binds, opens the object store and starts the workers.
    pub fn start(cfg: IoServerConfig) -> Result<ServerHandle, ServerError> {
        if cfg.transfer_unit < 4096 || cfg.transfer_unit > crate::config::MAX_TRANSFER_UNIT as usize {
            return Err(ServerError::Invalid(format!("transfer unit {} bytes", cfg.transfer_unit)));
        }
        let key = CapabilityKey::new(&cfg.key)?;
        let store = ObjectStore::open(
            &cfg.data_dir,
            StoreConfig { max_open: cfg.max_open, write_behind: cfg.write_behind },
        )?;
        let mut ep_cfg =
            crate::net::endpoint_config(&cfg.key, cfg.wait_mode, false, cfg.tcp_congestion.as_deref())
                .spin_budget(cfg.spin_budget);
        if let Some(ib) = &cfg.ib {
            ep_cfg = ep_cfg.ib(ib.clone());
        }
        let ep = Endpoint::bind(&cfg.listen, ep_cfg).map_err(|error| ServerError::Listen {
            role: "io server",
            addr: cfg.listen.to_string(),
            error,
        })?;
        info!(addr = ?ep.local_addr(), dir = %cfg.data_dir.display(), tu = cfg.transfer_unit, "io server listening");
        let stop = Arc::new(AtomicBool::new(false));
        let workers = cfg.workers;
        let mapped_writes = cfg.mapped && mapped_writes_wanted(&cfg.data_dir, cfg.map_disk_writes);
        let shared = Arc::new(Shared {
            ep: ep.clone(),
            store,
            key,
            cfg,
            mapped_writes,
            stats: Stats::default(),
            load: Load::new(),
            peers: PeerSpans::default(),
        });
        let data_dir = shared.store.root().to_owned();
        let reporting: Arc<dyn Reporting> = shared.clone();
        let slow = shared.cfg.slow_client_threads;
        let threads = spawn_workers("io", &ep, workers, slow, &stop, move |req, w| shared.handle(req, w))?;
        Ok(ServerHandle::new(ep, stop, threads).syncing(data_dir).reporting(reporting))
    }
}

impl Reporting for Shared {
    fn report(&self) -> ServerReport {
        ServerReport {
            status: self.load.status_outside(&self.cfg.data_dir),
            io: Some(self.snapshot()),
            meta: None,
            meta_state: None,
        }
    }
}

/// A request failure: the code and text for the error reply.
struct Fail(Errno, String);

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail(e.errno(), e.to_string())
    }
}

impl From<ionet::Error> for Fail {
    fn from(e: ionet::Error) -> Self {
        Fail(crate::net::net_errno(&e), e.to_string())
    }
}

impl Shared {
    fn handle(&self, req: Request, w: &Worker) {
        let _serving = self.load.begin();
        let env = match proto::decode::<IoRequest>(req.header()) {
            Ok(env) => env,
            Err(e) => {
                debug!(error = %e, peer = %req.peer(), "undecodable io request");
                self.load.failed();
                let reply: proto::Envelope<IoReply> = proto::error_reply(&e);
                send_reply(&self.ep, Some(w), req, reply.id, reply.body);
                return;
            }
        };
        let id = env.id;
        let body = env.body;
        let conn = self.peers.span(&self.ep, req.peer());
        let traced = Traced::new(debug_span!(
            parent: &conn,
            "request",
            id,
            op = body.kind(),
            handle = tracing::field::Empty,
            off = tracing::field::Empty,
            len = tracing::field::Empty,
            result = tracing::field::Empty,
            elapsed_us = tracing::field::Empty,
        ));
        if !traced.span.is_disabled() {
            if let Some(cap) = body.cap() {
                traced.span.record("handle", tracing::field::display(cap.handle));
            }
            if let Some((off, len)) = body.extent() {
                traced.span.record("off", off).record("len", len);
            }
        }
        let _in_request = traced.span.enter();
        let reply = match self.serve(&req, w, body) {
            Ok(r) => {
                traced.done("ok");
                r
            }
            Err(Fail(code, msg)) => {
                self.load.failed();
                traced.done(format_args!("{code}: {msg}"));
                IoReply::Error(ErrorReply::new(code, msg))
            }
        };
        send_reply(&self.ep, Some(w), req, id, reply);
    }

    fn serve(&self, req: &Request, w: &Worker, body: IoRequest) -> Result<IoReply, Fail> {
        if let Some(cap) = body.cap() {
            self.key
                .verify(cap, cap.handle, body.needed_rights(), unix_now())
                .map_err(|e| Fail(e.errno(), e.to_string()))?;
        }
        if !matches!(body, IoRequest::Read { .. } | IoRequest::Write { .. }) && req.payload_len() > 0 {
            return Err(Fail(Errno::EINVAL, "unexpected payload".into()));
        }
        let s = &self.store;
        Ok(match body {
            IoRequest::Ping => IoReply::Pong,
            IoRequest::Stats => IoReply::Stats(self.snapshot()),
            IoRequest::Status => IoReply::Status(self.load.status(&self.cfg.data_dir)),
            IoRequest::CreateObject { cap } => {
                s.create(cap.handle)?;
                IoReply::Done
            }
            IoRequest::RemoveObject { cap } => {
                s.remove(cap.handle)?;
                IoReply::Done
            }
            IoRequest::TruncateObject { cap, size } => {
                s.truncate(cap.handle, size)?;
                IoReply::Done
            }
            IoRequest::GetSize { cap } => IoReply::Size(s.space(cap.handle)?),
            IoRequest::CreateObjects { caps } => {
                let now = unix_now();
                for cap in caps.iter() {
                    self.key
                        .verify(cap, cap.handle, Rights::ADMIN, now)
                        .map_err(|e| Fail(e.errno(), e.to_string()))?;
                }
                let handles: Vec<Handle> = caps.iter().map(|c| c.handle).collect();
                s.create_many(&handles)?;
                IoReply::Done
            }
            IoRequest::GetSizes { caps } => {
                let now = unix_now();
                let sizes = caps
                    .iter()
                    .map(|cap| {
                        let allowed = self.key.verify(cap, cap.handle, Rights::NONE, now).is_ok();
                        allowed.then(|| s.peek_space(cap.handle).ok()).flatten()
                    })
                    .collect();
                IoReply::Sizes(BoundedVec::new(sizes).map_err(|e| Fail(Errno::EINVAL, e.to_string()))?)
            }
            IoRequest::Punch { cap, off, len } => {
                s.punch(cap.handle, off, len)?;
                IoReply::Done
            }
            IoRequest::Seek { cap, off, hole } => {
                let (at, local_size) = s.seek(cap.handle, off, hole)?;
                IoReply::Seek { at, local_size }
            }
            IoRequest::Allocate { cap, off, len } => {
                s.allocate(cap.handle, off, len)?;
                IoReply::Done
            }
            IoRequest::Sync { cap } => {
                s.sync(cap.handle)?;
                self.stats.syncs.fetch_add(1, Ordering::Relaxed);
                IoReply::Done
            }
            IoRequest::Read { cap, desc } => {
                let total = stream_len(req, &desc, Direction::In)?;
                let local_size = s.size(cap.handle)?;
                // What lies past the object's end goes back as nothing rather than zeros: the
                // client zeroes it, so a large read of a small file moves only its bytes.
                let sent = desc.stream_below(local_size).min(total);
                self.read(req, w, cap.handle, &desc, sent)?;
                self.stats.reads.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_read.fetch_add(sent, Ordering::Relaxed);
                IoReply::Read { bytes: sent, local_size }
            }
            IoRequest::Write { cap, desc } => {
                let total = stream_len(req, &desc, Direction::Out)?;
                self.write(req, w, cap.handle, &desc, total)?;
                self.stats.writes.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_written.fetch_add(total, Ordering::Relaxed);
                IoReply::Written { bytes: total }
            }
        })
    }

    fn snapshot(&self) -> ServerStats {
        let s = &self.stats;
        ServerStats {
            reads: load(&s.reads),
            writes: load(&s.writes),
            bytes_read: load(&s.bytes_read),
            bytes_written: load(&s.bytes_written),
            syncs: load(&s.syncs),
            errors: self.load.errors(),
            open_files: self.store.open_files() as u64,
            mapped: s.mapped.snapshot(),
            copied: s.copied.snapshot(),
            fallbacks: Fallbacks {
                unordered: load(&s.unordered),
                beyond_map: load(&s.beyond_map),
                no_fallocate: load(&s.no_fallocate),
            },
            disk: disk_space(&self.cfg.data_dir),
            written_behind: self.store.written_behind(),
        }
    }

    /// Sends a request with data down the mapped path if this server maps (writes only where
    /// the file system allows) and the request allows it, else down the copying one; counts
    /// which path took it (and why it fell back). A request without data takes neither.
    fn route(
        &self,
        dir: Direction,
        total: u64,
        mapped: impl FnOnce() -> Result<Mapped, Fail>,
        copying: impl FnOnce() -> Result<(), Fail>,
    ) -> Result<(), Fail> {
        if total == 0 {
            return Ok(());
        }
        if self.cfg.mapped && (dir == Direction::In || self.mapped_writes) {
            match mapped()? {
                Mapped::Ran(r) => return self.stats.mapped.took(dir, total, r),
                Mapped::Declined(why) => {
                    debug!(?why, "mapped path declined; copying");
                    let n = match why {
                        Fallback::Unordered => &self.stats.unordered,
                        Fallback::BeyondMap => &self.stats.beyond_map,
                        Fallback::NoFallocate => &self.stats.no_fallocate,
                    };
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.stats.copied.took(dir, total, copying())
    }

    fn unit_bufs(&self, total: u64) -> Result<Vec<RegisteredBuf>, Fail> {
        let tu = self.cfg.transfer_unit as u64;
        let units = total.div_ceil(tu).max(1);
        let n = (self.cfg.pipeline_depth.max(2) as u64).min(units) as usize;
        let len = tu.min(total.max(1)) as usize;
        (0..n).map(|_| self.ep.alloc(len).map_err(Fail::from)).collect()
    }

    fn deadline(&self, op: OpId) {
        let _ = self.ep.set_deadline(op, Instant::now() + self.cfg.transfer_timeout);
    }

    /// Streams the descriptor's bytes into the client's IN buffer.
    fn read(
        &self,
        req: &Request,
        w: &Worker,
        h: crate::Handle,
        desc: &Descriptor,
        total: u64,
    ) -> Result<(), Fail> {
        self.route(
            Direction::In,
            total,
            || Ok(self.read_mapped(req, w, &*self.store.object(h)?, desc, total)),
            || self.read_copying(req, w, h, desc, total),
        )
    }

    /// Pulls the client's OUT payload into the object.
    fn write(
        &self,
        req: &Request,
        w: &Worker,
        h: crate::Handle,
        desc: &Descriptor,
        total: u64,
    ) -> Result<(), Fail> {
        self.route(
            Direction::Out,
            total,
            || Ok(self.write_mapped(req, w, &*self.store.object(h)?, desc, total)),
            || self.write_copying(req, w, h, desc, total),
        )
    }

    /// The copying read: `pread`s a unit into a buffer and pushes it, `pipeline_depth` pushes
    /// deep.
    fn read_copying(
        &self,
        req: &Request,
        w: &Worker,
        h: crate::Handle,
        desc: &Descriptor,
        total: u64,
    ) -> Result<(), Fail> {
        let tu = self.cfg.transfer_unit as u64;
        let mut free = self.unit_bufs(total)?;
        let mut cursor = PieceCursor::new(desc.pieces());
        let mut inflight: VecDeque<OpId> = VecDeque::new();
        let mut off = 0u64;
        let mut fail: Option<Fail> = None;
        loop {
            if fail.is_none() && off < total && !free.is_empty() {
                let mut buf = free.pop().unwrap_or_else(|| RegisteredBuf::unpooled(0));
                let n = tu.min(total - off) as usize;
                buf.set_len(n)?;
                match self.store.read_stream(h, &mut cursor, &mut buf) {
                    Ok(got) if got == n => match req.push_from(buf, off) {
                        Ok(op) => {
                            self.deadline(op);
                            inflight.push_back(op);
                            off += n as u64;
                        }
                        Err(e) => fail = Some(e.into()),
                    },
                    Ok(got) => {
                        fail = Some(Fail(Errno::EIO, format!("stream ended after {got} of {n} bytes")))
                    }
                    Err(e) => fail = Some(e.into()),
                }
                continue;
            }
            let Some(op) = inflight.pop_front() else { break };
            let c = w.wait_on_client(op)?;
            match c.result {
                Ok(_) => {
                    if let OpBuf::Send(SendBuf::Registered(b)) = c.buf {
                        free.push(b);
                    }
                }
                Err(e) => {
                    fail.get_or_insert(e.into());
                }
            }
        }
        match fail {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// The copying write: pulls the client's OUT payload unit by unit into buffers and
    /// `pwrite`s each as it lands.
    fn write_copying(
        &self,
        req: &Request,
        w: &Worker,
        h: crate::Handle,
        desc: &Descriptor,
        total: u64,
    ) -> Result<(), Fail> {
        let tu = self.cfg.transfer_unit as u64;
        let mut free = self.unit_bufs(total)?;
        let mut cursor = PieceCursor::new(desc.pieces());
        let mut inflight: VecDeque<(OpId, usize)> = VecDeque::new();
        let mut posted = 0u64;
        let mut fail: Option<Fail> = None;
        loop {
            if fail.is_none() && posted < total && !free.is_empty() {
                let mut buf = free.pop().unwrap_or_else(|| RegisteredBuf::unpooled(0));
                let n = tu.min(total - posted) as usize;
                buf.set_len(n)?;
                match req.pull_into(buf, posted) {
                    Ok(op) => {
                        self.deadline(op);
                        inflight.push_back((op, n));
                        posted += n as u64;
                    }
                    Err(e) => fail = Some(e.into()),
                }
                continue;
            }
            let Some((op, n)) = inflight.pop_front() else { break };
            let c = w.wait_on_client(op)?;
            match (c.result, c.buf) {
                (Ok(_), OpBuf::Recv(RecvBuf::Registered(b))) => {
                    if fail.is_none() {
                        match self.store.write_stream(h, &mut cursor, &b[..n.min(b.len())]) {
                            Ok(w) if w == n => free.push(b),
                            Ok(w) => {
                                fail = Some(Fail(Errno::EIO, format!("stream ended after {w} of {n} bytes")))
                            }
                            Err(e) => {
                                warn!(handle = %h, error = %e, "write failed; discarding the rest of the stream");
                                fail = Some(e.into());
                            }
                        }
                    }
                }
                (Ok(_), _) => fail = Some(Fail(Errno::EIO, "pull returned no buffer".into())),
                (Err(e), _) => {
                    fail.get_or_insert(e.into());
                }
            }
        }
        match fail {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

impl Shared {
    /// The write pipeline over the object's mapping; declined when the request needs the
    /// copying path (pieces out of order, past the mapping limit, no `fallocate`).
    fn write_mapped(&self, req: &Request, w: &Worker, obj: &Object, desc: &Descriptor, total: u64) -> Mapped {
        let mut end = 0u64;
        for p in desc.pieces().filter(|p| p.len > 0) {
            if p.off < end {
                return Mapped::Declined(Fallback::Unordered);
            }
            match p.end() {
                Some(e) => end = e,
                None => return Mapped::Declined(Fallback::BeyondMap),
            }
        }
        let _transfer = obj.transfer();
        // Ends (cutting the file back to what landed, unless finished complete) before the
        // transfer guard is released.
        let writing = obj.begin_write(end);
        // Reserve every piece first: a full disk fails the request before any byte moves.
        for p in desc.pieces() {
            match obj.allocate(p.off, p.len) {
                Ok(()) => {}
                // No fallocate here (a file system without it, or not a regular file).
                Err(StoreError::Io { error, .. })
                    if matches!(error.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENODEV)) =>
                {
                    writing.finish(true);
                    return Mapped::Declined(Fallback::NoFallocate);
                }
                Err(e) => return Mapped::Ran(Err(e.into())),
            }
        }
        let map = match obj.map_covering(end) {
            Ok(Some(m)) => m,
            Ok(None) => return Mapped::Declined(Fallback::BeyondMap),
            Err(e) => return Mapped::Ran(Err(e.into())),
        };
        let r = self.mapped_pipeline(&map, w, Some(&writing), desc, total, |pieces, off, turn| {
            let regions = map.regions_mut_in(pieces.iter().copied(), turn)?;
            Ok(req.pull_into(regions, off))
        });
        writing.finish(r.is_ok());
        Mapped::Ran(r)
    }

    /// The read pipeline over the object's mapping: bytes past the local end go out as zeros.
    fn read_mapped(&self, req: &Request, w: &Worker, obj: &Object, desc: &Descriptor, total: u64) -> Mapped {
        let _transfer = obj.transfer();
        // Inside the transfer the file only grows, so bytes below `size` stay mapped.
        let size = match obj.size() {
            Ok(s) => s,
            Err(e) => return Mapped::Ran(Err(e.into())),
        };
        let map = match obj.map_covering(size.max(1)) {
            Ok(Some(m)) => m,
            Ok(None) => return Mapped::Declined(Fallback::BeyondMap),
            Err(e) => return Mapped::Ran(Err(e.into())),
        };
        Mapped::Ran(self.mapped_pipeline(&map, w, None, desc, total, |pieces, off, turn| {
            let inside: Vec<(u64, usize)> =
                pieces.iter().filter(|p| p.0 < size).map(|&(o, n)| (o, n.min((size - o) as usize))).collect();
            let mut regions = map.regions_in(inside, turn)?.into_iter();
            let mut list = Vec::with_capacity(pieces.len());
            for &(o, n) in pieces {
                let mapped = if o < size { n.min((size - o) as usize) } else { 0 };
                if mapped > 0 {
                    list.push(regions.next().expect("one region per inside piece").into_bytes());
                }
                push_zeros(&mut list, n - mapped);
            }
            Ok(req.push_from(SendBuf::List(list), off))
        }))
    }

    /// Runs one request's units through `start` (which leases the unit's regions of `map`,
    /// through the turn when given, and posts its pull or push), `pipeline_depth` deep. A unit
    /// whose bytes another request has leased waits for it, up to the transfer timeout: first
    /// for this request's own units in flight, then, holding nothing, in a turn on the map, so
    /// requests that arrive later over the same bytes do not overtake it. A write (`writing`)
    /// makes sure the file covers each unit before its pull (the first lengthens it to the
    /// write's end) and records each unit that landed, in order, until one fails.
    fn mapped_pipeline(
        &self,
        map: &Arc<ionet::FileMap>,
        w: &Worker,
        writing: Option<&Writing<'_>>,
        desc: &Descriptor,
        total: u64,
        mut start: impl FnMut(&[(u64, usize)], u64, Option<&Turn>) -> Result<ionet::Result<OpId>, FileMapError>,
    ) -> Result<(), Fail> {
        let tu = self.cfg.transfer_unit as u64;
        let depth = self.cfg.pipeline_depth.max(2);
        let mut cursor = PieceCursor::new(desc.pieces());
        // (op, end of its unit's pieces)
        let mut inflight: VecDeque<(OpId, u64, u64)> = VecDeque::new();
        let mut unit: Vec<(u64, usize)> = Vec::new();
        let mut off = 0u64;
        let mut fail: Option<Fail> = None;
        // No unit of this request failed in transit yet: every unit waited for so far landed.
        let mut intact = true;
        let mut busy_since: Option<Instant> = None;
        let mut tried_leaving = false;
        let mut turn: Option<Turn> = None;
        loop {
            if fail.is_none() && off < total && inflight.len() < depth {
                let n = tu.min(total - off);
                if unit.is_empty() {
                    unit_pieces(&mut cursor, n, &mut unit);
                }
                let unit_start = unit.iter().map(|&(o, _)| o).min().unwrap_or(0);
                let unit_end = unit.iter().map(|&(o, len)| o + len as u64).max().unwrap_or(0);
                if let Some(w) = writing
                    && let Err(e) = w.extend(unit_end)
                {
                    fail = Some(e.into());
                    continue;
                }
                match start(&unit, off, turn.as_ref()) {
                    Ok(Ok(op)) => {
                        self.deadline(op);
                        inflight.push_back((op, unit_start, unit_end));
                        off += n;
                        unit.clear();
                        busy_since = None;
                        turn = None;
                        continue;
                    }
                    Ok(Err(e)) => fail = Some(e.into()),
                    Err(FileMapError::Busy { .. }) if inflight.is_empty() => {
                        // Nothing of ours is leased now, so queueing cannot wait on ourselves.
                        turn.get_or_insert_with(|| map.take_turn(&unit, writing.is_some()));
                        let since = *busy_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > self.cfg.transfer_timeout {
                            fail = Some(Fail(Errno::EIO, "object range stayed busy".into()));
                        } else {
                            // The request holding the range may wait on a client that stopped:
                            // wait out of the pool, and look less often. Not in a lane of this
                            // client's: it is not the one that stalled, and its other requests
                            // (a mount's, for every process on its host) need not wait.
                            let stalled = since.elapsed() > CLIENT_STALL;
                            if stalled && !tried_leaving {
                                tried_leaving = true;
                                w.leave_alone();
                            }
                            std::thread::sleep(if stalled { RANGE_POLL_STALLED } else { RANGE_POLL });
                        }
                        continue;
                    }
                    // Our own units finishing may be all it takes; wait for one below.
                    Err(FileMapError::Busy { .. }) => {}
                    Err(e) => fail = Some(Fail(Errno::EIO, e.to_string())),
                }
            }
            let Some((op, unit_start, unit_end)) = inflight.pop_front() else { break };
            match w.wait_on_client(op) {
                Ok(c) => match c.result {
                    // Waited for in order: every earlier unit of this request landed too.
                    Ok(_) if intact => {
                        if let Some(w) = writing {
                            w.landed(unit_start, unit_end);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        intact = false;
                        fail.get_or_insert(e.into());
                    }
                },
                Err(e) => {
                    // The regions must not outlive the transfer guard: end every op first.
                    for &(op, ..) in &inflight {
                        let _ = self.ep.cancel(op);
                    }
                    for (op, ..) in inflight.drain(..) {
                        let _ = self.ep.wait(op);
                    }
                    return Err(e.into());
                }
            }
        }
        match fail {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// The next `n` bytes of the stream as `(offset, len)` pieces.
fn unit_pieces<I: Iterator<Item = Piece>>(cursor: &mut PieceCursor<I>, n: u64, out: &mut Vec<(u64, usize)>) {
    let mut got = 0u64;
    while got < n {
        let Some(p) = cursor.next_piece(n - got) else { break };
        out.push((p.off, p.len as usize));
        got += p.len;
    }
}

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Appends `n` zero bytes to a gather list, without allocating them.
fn push_zeros(list: &mut Vec<Bytes>, mut n: usize) {
    while n > 0 {
        let k = n.min(ZEROS.len());
        list.push(Bytes::from_static(&ZEROS[..k]));
        n -= k;
    }
}

/// Checks that the payload matches the descriptor: direction and exact length.
fn stream_len(req: &Request, desc: &Descriptor, want: Direction) -> Result<u64, Fail> {
    let total = desc.total();
    let dir = req.direction();
    let ok = if total == 0 { dir == Direction::None || req.payload_len() == 0 } else { dir == want };
    if !ok || req.payload_len() != total {
        return Err(Fail(
            Errno::EINVAL,
            format!("payload {:?} of {} bytes does not match a {total}-byte stream", dir, req.payload_len()),
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(cfg: impl FnOnce(&mut IoServerConfig)) -> (ServerHandle, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut c = IoServerConfig::new("tcp://127.0.0.1:0".parse().unwrap(), dir.path(), &[7u8; 32]);
        cfg(&mut c);
        (IoServer::start(c).unwrap(), dir)
    }

    #[test]
    fn an_address_in_use_is_named_with_the_role() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("tcp://{}", taken.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let c = IoServerConfig::new(addr.parse().unwrap(), dir.path(), &[7u8; 32]);
        let e = IoServer::start(c).expect_err("the address is taken").to_string();
        assert!(e.contains("io server") && e.contains(&addr) && e.contains("in use"), "{e}");
    }

    #[test]
    fn an_io_servers_adaptive_waiters_keep_polling_for_its_own_spin_budget() {
        let (h, _d) = start(|_| {});
        let ionet_default = ionet::Config::default().get_spin_budget();
        assert_eq!(h.endpoint().config().get_spin_budget(), DEFAULT_SPIN_BUDGET);
        assert!(DEFAULT_SPIN_BUDGET > ionet_default, "longer than the transport's default");
        let (h, _d) = start(|c| c.spin_budget = Duration::from_micros(300));
        assert_eq!(h.endpoint().config().get_spin_budget(), Duration::from_micros(300));
    }
}

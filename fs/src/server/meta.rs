//! The meta server: namespace, attributes, layouts and capabilities over [`MetaStore`], with the
//! operations that touch file objects fanned out to the io servers.
//!
//! * **create**: the store records a *pending* entry; `CreateObject` goes to every server of the
//!   layout at once; if all succeed the entry is committed and the client gets its capability,
//!   otherwise the objects that were made are removed and the create is aborted. While every
//!   io server is up, a thread keeps a number of files' objects made ahead (see `precreate`);
//!   a create whose layout spans every server takes one and is committed at once. That thread
//!   also pings the io servers every janitor pass, so a dead one is known before many creates
//!   take objects made on it.
//! * **unlink / rename over a file** (a symbolic link has no objects; only its record goes): the
//!   store moves the file to its orphan table in the same transaction that removes the name, and
//!   the client has its answer; then `RemoveObject` goes to every server; when all are gone (or
//!   already missing) the orphan is forgotten, otherwise a janitor thread retries.
//! * **truncate** (`Setattr` with a size): the store records the size; each server gets
//!   `TruncateObject` with its [`Layout::local_size`](crate::layout::Layout::local_size).
//! * At start-up, creates left pending by a crash and orphans are handed to the janitor, which
//!   retries until the io servers answer; handles reserved for objects made ahead become orphans.
//! * **io servers that are down** (see `liveness`): every request's outcome tells whether its
//!   server answered. New files are placed on servers that are up while the stripe count leaves
//!   a choice (a create that meets a newly dead server is placed once more without it), removals
//!   leave a down server's objects to the janitor instead of waiting for it, and the janitor pings
//!   down servers every pass. Namespace requests never touch an io server, and the work that
//!   does (creates, truncates, removals) runs on threads of its own (see `upstream`), so an io
//!   server that hangs holds up that work, never the namespace.
//!
//! The meta server's requests to io servers carry an `ADMIN` capability it mints itself; clients
//! are never granted `ADMIN`.

use super::liveness::{Change, Liveness};
use super::precreate::Precreated;
use super::upstream::{self, Upstream};
use super::{
    Load, MetaState, PeerSpans, Reporting, ServerError, ServerHandle, ServerReport, Worker, send_reply,
    spawn_workers,
};
use crate::capability::{Capability, CapabilityKey, Rights, expiry_after, unix_now};
use crate::config::ClusterConfig;
use crate::errno::Errno;
use crate::health::{Admit, Health, Sent};
use crate::layout::Layout;
use crate::meta::{MetaConfig, MetaError, MetaStore, Objects, Perm, Placement};
use crate::net::{FsError, TAG_IO, Traced};
use crate::proto::{
    self, AttrOf, Cred, Envelope, ErrorReply, Handle, IoReply, IoRequest, MetaCall, MetaReply, MetaRequest,
};
use bytes::Bytes;
use ionet::{Address, Endpoint, Payload, PeerId, Request, ServiceLevel, WaitMode};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, debug_span, info, warn};

/// Meta server settings.
#[derive(Debug, Clone)]
pub struct MetaServerConfig {
    /// Where to listen.
    pub listen: Address,
    /// The database file.
    pub db_path: PathBuf,
    /// The cluster (io server addresses in layout order, key, layout defaults).
    pub cluster: ClusterConfig,
    /// The cluster key.
    pub key: Vec<u8>,
    /// How long a capability is valid at least (whole seconds, rounded up; default 1 hour).
    pub cap_lifetime: Duration,
    /// Requests served at once (default 4).
    pub workers: usize,
    /// Threads serving clients slow to take their answers, beside the workers (default
    /// [`super::io::DEFAULT_SLOW_CLIENT_THREADS`]): a request whose reply has waited
    /// [`super::io::CLIENT_STALL`] goes on waiting out of the worker pool, a new worker taking
    /// its place, and that client's later requests queue for it rather than take workers.
    /// Past this many, such replies wait in their workers.
    pub slow_client_threads: usize,
    /// How threads wait for the transport.
    pub wait_mode: WaitMode,
    /// Deadline of each request to an io server.
    pub io_timeout: Duration,
    /// Pause between janitor passes over orphans and stale creates.
    pub janitor_interval: Duration,
    /// Congestion control of the server's TCP connections (to clients and to io servers);
    /// `None` keeps the kernel's (default: [`crate::net::tcp_congestion`]).
    pub tcp_congestion: Option<String>,
    /// Files whose objects are kept made ahead on every io server, so a create need not wait
    /// for them (default [`DEFAULT_PRECREATE`]; 0: every create makes its own).
    pub precreate: usize,
    /// Longest a change committed without a flush (of times, mode bits added) waits for one
    /// (default 1 s).
    pub flush_interval: Duration,
}

/// Files whose objects the meta server keeps made ahead, by default: a burst of creates (an
/// archive unpacked) takes them while the next batch is made.
pub const DEFAULT_PRECREATE: usize = 128;

impl MetaServerConfig {
    /// Defaults for the cluster described by `cluster`.
    pub fn new(cluster: ClusterConfig, key: &[u8]) -> Self {
        MetaServerConfig {
            listen: cluster.meta.clone(),
            db_path: cluster.meta_db_path(),
            cluster,
            key: key.to_vec(),
            cap_lifetime: Duration::from_secs(3600),
            workers: 4,
            slow_client_threads: super::io::DEFAULT_SLOW_CLIENT_THREADS,
            wait_mode: WaitMode::Adaptive,
            io_timeout: Duration::from_secs(20),
            janitor_interval: Duration::from_secs(1),
            tcp_congestion: crate::net::tcp_congestion(),
            precreate: DEFAULT_PRECREATE,
            flush_interval: Duration::from_secs(1),
        }
    }
}

/// Clean-up work the janitor retries until it succeeds.
#[derive(Debug, Default)]
struct Janitor {
    /// Creates found pending at start-up: remove their objects, then abort them.
    stale_creates: Vec<Objects>,
}

#[derive(Debug)]
struct Shared {
    ep: Endpoint,
    store: MetaStore,
    key: CapabilityKey,
    io_ep: Endpoint,
    io: Vec<PeerId>,
    cfg: MetaServerConfig,
    nonce: AtomicU64,
    next_id: AtomicU64,
    janitor: Mutex<Janitor>,
    /// Which io servers answer (see [`Liveness`]).
    live: Mutex<Liveness>,
    /// Per io server: whether requests may go to it at all, or fail at once while it is
    /// silent (see `crate::health`).
    io_health: Vec<Health>,
    /// Requests received, in flight and failed, and the start time.
    load: Load,
    /// The debug log's span per peer.
    peers: PeerSpans,
    /// Files' handles whose objects are made on every io server.
    precreated: Precreated,
    /// Threads for the requests and removals that wait for io servers.
    upstream: Upstream<Deferred>,
}

/// Work that waits for io servers, done on the upstream threads rather than by a worker.
struct Deferred {
    shared: Arc<Shared>,
    what: Waits,
}

enum Waits {
    /// A request whose answer depends on io servers (a create, a truncate).
    Serve(Request, Box<Envelope<MetaCall>>),
    /// A removed file's objects, its name gone already.
    Remove(Objects),
}

impl Deferred {
    fn run(self) {
        let s = &self.shared;
        match self.what {
            Waits::Serve(req, env) => {
                let _serving = s.load.resume();
                s.answer(req, *env, true, None);
            }
            Waits::Remove(objs) => s.remove_objects(objs),
        }
    }
}

/// Sleeps for `d`, or until `stop` is set, whichever comes first.
fn pause(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Orphans the janitor lists at a time.
const ORPHAN_PAGE: usize = 256;

/// A request posted to an io server (and when), or why it was not.
type Posted = Result<(ionet::OpId, Sent), FsError>;

/// A create whose objects could not all be made.
#[derive(Debug)]
struct CreateFailed {
    /// The first failure (a transport failure names the io server).
    error: ErrorReply,
    /// The create was aborted: its name is free again.
    aborted: bool,
}

/// The meta server.
#[derive(Debug)]
pub struct MetaServer;

impl MetaServer {
    /// Opens the database, binds, and starts the workers and the janitor.
    pub fn start(cfg: MetaServerConfig) -> Result<ServerHandle, ServerError> {
        let key = CapabilityKey::new(&cfg.key)?;
        let db_dir = match cfg.db_path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        if let Some(dir) = cfg.db_path.parent() {
            crate::private::create_dir_all(dir)?;
        }
        let store = MetaStore::open(&cfg.db_path, MetaConfig::from_cluster(&cfg.cluster))?;
        let stale_creates = store.pending_creates()?;
        // Which reserved handles have all their objects was known only to the last run.
        store.recycle_precreated()?;
        // The serving endpoint is progressed by its workers (see `spawn_workers`).
        let cc = cfg.tcp_congestion.as_deref();
        let ep_cfg = crate::net::endpoint_config(&cfg.key, cfg.wait_mode, false, cc);
        // Its own progress thread: a connection to an io server that dies while idle is noticed
        // then, so the next fan-out after a restart redials instead of failing on a dead socket.
        let io_ep = Endpoint::client(crate::net::endpoint_config(&cfg.key, cfg.wait_mode, true, cc))?;
        let io = cfg.cluster.io_servers.iter().map(|a| io_ep.connect(a)).collect::<Result<Vec<_>, _>>()?;
        let ep = Endpoint::bind(&cfg.listen, ep_cfg).map_err(|error| ServerError::Listen {
            role: "meta server",
            addr: cfg.listen.to_string(),
            error,
        })?;
        info!(addr = ?ep.local_addr(), db = %cfg.db_path.display(), io_servers = io.len(), "meta server listening");
        let seed = crate::net::random_bytes(8)?;
        let nonce = u64::from_le_bytes(seed.try_into().unwrap_or([0; 8]));
        let stop = Arc::new(AtomicBool::new(false));
        let (workers, slow) = (cfg.workers, cfg.slow_client_threads);
        let cfg_precreate = cfg.precreate;
        let addr = ep.local_addr().map_or_else(String::new, |a| a.to_string());
        let span = tracing::error_span!("server", role = "meta-upstream", %addr);
        let (upstream, upstream_threads) = Upstream::start(&span, &stop, Deferred::run)?;
        let live = Mutex::new(Liveness::new(io.len()));
        let io_health = (0..io.len()).map(|_| Health::default()).collect();
        let shared = Arc::new(Shared {
            ep: ep.clone(),
            store,
            key,
            io_ep,
            io,
            cfg,
            nonce: AtomicU64::new(nonce),
            next_id: AtomicU64::new(1),
            janitor: Mutex::new(Janitor { stale_creates }),
            live,
            io_health,
            load: Load::new(),
            peers: PeerSpans::default(),
            precreated: Precreated::new(cfg_precreate),
            upstream,
        });
        let s2 = shared.clone();
        let threads = spawn_workers("meta", &ep, workers, slow, &stop, move |req, w| s2.handle(req, w))?;
        threads.extend(upstream_threads);
        let (s3, stop3) = (shared.clone(), stop.clone());
        // Its warnings name the server as the workers' do.
        let span = tracing::error_span!("server", role = "meta-janitor", %addr);
        threads.push(std::thread::Builder::new().name("meta-janitor".into()).spawn(move || {
            let _server = span.enter();
            while !stop3.load(Ordering::Relaxed) {
                s3.janitor_pass();
                pause(&stop3, s3.cfg.janitor_interval);
            }
        })?);
        let (s5, stop5) = (shared.clone(), stop.clone());
        let span = tracing::error_span!("server", role = "meta-flush", %addr);
        threads.push(std::thread::Builder::new().name("meta-flush".into()).spawn(move || {
            let _server = span.enter();
            // Changes of times are committed without a flush; this bounds how long they wait
            // for one (a local file system's journal commits every few seconds), and flushes
            // what is left when the server stops.
            loop {
                let stopping = stop5.load(Ordering::Relaxed);
                if let Err(e) = s5.store.flush() {
                    warn!(error = %e, "flushing the meta database failed");
                }
                if stopping {
                    break;
                }
                pause(&stop5, s5.cfg.flush_interval);
            }
        })?);
        if shared.cfg.precreate > 0 {
            let (s4, stop4) = (shared.clone(), stop.clone());
            let span = tracing::error_span!("server", role = "meta-precreate", %addr);
            threads.push(std::thread::Builder::new().name("meta-precreate".into()).spawn(move || {
                let _server = span.enter();
                let (mut not_before, mut next_ping) = (Instant::now(), Instant::now());
                while !stop4.load(Ordering::Relaxed) {
                    if Instant::now() >= not_before && !s4.precreate_batch() {
                        // A server down or failing: the janitor cleans up what a failed batch
                        // left; try again after its pause.
                        not_before = Instant::now() + s4.cfg.janitor_interval;
                    }
                    if Instant::now() >= next_ping {
                        s4.ping_up();
                        next_ping = Instant::now() + s4.cfg.janitor_interval;
                    }
                    let now = Instant::now();
                    if now < not_before {
                        // Files are wanted that cannot be made yet: waiting for creates to
                        // take some would return at once, and go round again for as long as
                        // the server stays down.
                        pause(&stop4, not_before.min(next_ping).saturating_duration_since(now));
                    } else {
                        s4.precreated.wait_low(Duration::from_millis(100));
                    }
                }
            })?);
        }
        // redb makes each commit durable itself; the drain's sync covers the rest of the directory.
        let upstream = shared.io_ep.clone();
        Ok(ServerHandle::new(ep, stop, threads).syncing(db_dir).reporting(shared).with_upstream(upstream))
    }
}

impl Reporting for Shared {
    fn report(&self) -> ServerReport {
        let meta = match self.store.statfs() {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "reading the file counts for a report failed");
                None
            }
        };
        let state =
            MetaState { unflushed: self.store.unflushed(), made_ahead: self.precreated.ready() as u64 };
        ServerReport {
            status: self.load.status_outside(self.db_dir()),
            io: None,
            meta,
            meta_state: Some(state),
        }
    }
}

impl Shared {
    /// The database's directory: where the meta server's data grows.
    fn db_dir(&self) -> &std::path::Path {
        self.cfg.db_path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."))
    }
}

fn meta_err(e: MetaError) -> MetaReply {
    MetaReply::Error(ErrorReply::new(e.errno(), &e))
}

fn fs_err(e: &FsError) -> ErrorReply {
    ErrorReply::new(e.errno(), e)
}

impl Shared {
    fn handle(self: &Arc<Self>, req: Request, w: &Worker) {
        let _serving = self.load.begin();
        let env = match proto::decode::<MetaCall>(req.header()) {
            Ok(env) => env,
            Err(e) => {
                debug!(error = %e, peer = %req.peer(), "undecodable meta request");
                self.load.failed();
                let reply: Envelope<MetaReply> = proto::error_reply(&e);
                send_reply(&self.ep, Some(w), req, reply.id, reply.body);
                return;
            }
        };
        // The requests whose answer may wait for io servers go to the upstream threads: a
        // create that needs the file's objects made (one that takes a file made ahead needs
        // none, and the worker tries that first) and a size set, which truncates them.
        let deferred = match &env.body.req {
            MetaRequest::Create { .. } => {
                let again = env.clone();
                self.answer(req, env, false, Some(w)).map(|req| (req, again))
            }
            MetaRequest::Setattr { set, .. } if set.size.is_some() => Some((req, env)),
            _ => {
                self.answer(req, env, true, Some(w));
                None
            }
        };
        let Some((req, env)) = deferred else { return };
        let work = Deferred { shared: self.clone(), what: Waits::Serve(req, Box::new(env)) };
        if let Err(Deferred { what: Waits::Serve(req, env), .. }) = self.upstream.submit(work) {
            self.load.failed();
            let busy = ErrorReply::new(
                Errno::EAGAIN,
                format!("busy: {} requests wait for io servers already", upstream::QUEUED),
            );
            send_reply(&self.ep, Some(w), req, env.id, MetaReply::Error(busy));
        }
    }

    /// Serves a decoded request and sends the answer (on worker `w`, or an upstream thread).
    /// Unless it `may_wait` for io servers, a request that would is given back unanswered.
    fn answer(
        self: &Arc<Self>,
        req: Request,
        env: Envelope<MetaCall>,
        may_wait: bool,
        w: Option<&Worker>,
    ) -> Option<Request> {
        let conn = self.peers.span(&self.ep, req.peer());
        let body = env.body.req;
        let traced = Traced::new(debug_span!(
            parent: &conn,
            "request",
            id = env.id,
            op = body.kind(),
            handle = tracing::field::Empty,
            uid = env.body.cred.uid,
            result = tracing::field::Empty,
            elapsed_us = tracing::field::Empty,
        ));
        if !traced.span.is_disabled()
            && let Some(h) = body.subject()
        {
            traced.span.record("handle", tracing::field::display(h));
        }
        let _in_request = traced.span.enter();
        let reply = if req.payload_len() > 0 {
            MetaReply::Error(ErrorReply::new(Errno::EINVAL, "meta requests carry no payload"))
        } else {
            match self.serve(&env.body.cred, body, may_wait) {
                Some(reply) => reply,
                None => return Some(req),
            }
        };
        match &reply {
            MetaReply::Error(e) => {
                self.load.failed();
                traced.done(format_args!("{}: {}", e.code, e.message));
            }
            _ => traced.done("ok"),
        }
        send_reply(&self.ep, w, req, env.id, reply);
        None
    }

    fn mint(&self, h: Handle, rights: Rights) -> Capability {
        let expiry = expiry_after(unix_now(), self.cfg.cap_lifetime);
        let nonce = self.nonce.fetch_add(1, Ordering::Relaxed);
        self.key.mint(h, rights, expiry, nonce)
    }

    /// Rights a client may hold: never `ADMIN`.
    fn client_rights(r: Rights) -> Rights {
        Rights::from_bits(r.bits() & Rights::READ_WRITE.bits())
    }

    /// The answer to `body`; `None` if it would wait for io servers and may not.
    fn serve(self: &Arc<Self>, cred: &Cred, body: MetaRequest, may_wait: bool) -> Option<MetaReply> {
        let s = &self.store;
        let r = match body {
            MetaRequest::Statfs => s.statfs().map(MetaReply::Statfs),
            MetaRequest::Sync => s.flush().map(|()| MetaReply::Done),
            MetaRequest::Status => Ok(MetaReply::Status(self.load.status(self.db_dir()))),
            MetaRequest::Lookup { parent, name } => {
                s.lookup(cred, parent, &name).map(|(handle, attr)| MetaReply::Entry { handle, attr })
            }
            MetaRequest::Getattr { handle } => s.getattr(handle).map(MetaReply::Attr),
            MetaRequest::GetattrMany { handles } => s.getattr_many(&handles).and_then(|all| {
                let attrs = handles
                    .iter()
                    .zip(all)
                    .map(|(&h, r)| match r {
                        Ok((attr, layout)) => AttrOf::Found {
                            // Asking a size needs no right on the file: whoever may stat it may.
                            file: layout.map(|l| (l, self.mint(h, Rights::NONE))),
                            attr,
                        },
                        Err(e) => AttrOf::Failed(e.errno()),
                    })
                    .collect();
                let attrs = proto::BoundedVec::new(attrs).map_err(|_| MetaError::Invalid("batch size"))?;
                Ok(MetaReply::Attrs(attrs))
            }),
            MetaRequest::Setattr { handle, set } => match s.setattr(cred, handle, &set) {
                Ok(out) => {
                    if let Some((layout, size)) = out.truncate {
                        let failed = self.fanout(handle, layout, |p| IoRequest::TruncateObject {
                            cap: self.mint(handle, Rights::ADMIN),
                            size: layout.local_size(p, size),
                        });
                        if let Some(Err(e)) = failed.iter().find(|r| r.is_err()) {
                            return Some(MetaReply::Error(fs_err(e)));
                        }
                    }
                    Ok(MetaReply::Attr(out.attr))
                }
                Err(e) => Err(e),
            },
            MetaRequest::Create { parent, name, mode, uid, gid, layout, rights } => {
                let perm = Perm { mode, uid, gid };
                return self.create(cred, parent, &name, perm, layout, rights, may_wait);
            }
            MetaRequest::Open { handle, rights } => {
                s.open_file(cred, handle, rights).map(|f| MetaReply::Opened {
                    handle,
                    attr: f.attr,
                    layout: f.layout,
                    cap: self.mint(handle, Self::client_rights(rights)),
                })
            }
            MetaRequest::Mkdir { parent, name, mode, uid, gid } => s
                .mkdir(cred, parent, &name, Perm { mode, uid, gid })
                .map(|(handle, attr)| MetaReply::Entry { handle, attr }),
            MetaRequest::Rmdir { parent, name } => s.rmdir(cred, parent, &name).map(|()| MetaReply::Done),
            MetaRequest::Unlink { parent, name } => s.unlink(cred, parent, &name).map(|objs| {
                if let Some(objs) = objs {
                    self.remove_later(objs);
                }
                MetaReply::Done
            }),
            MetaRequest::Rename { src_parent, src_name, dst_parent, dst_name } => {
                s.rename(cred, src_parent, &src_name, dst_parent, &dst_name).map(|replaced| {
                    if let Some(objs) = replaced {
                        self.remove_later(objs);
                    }
                    MetaReply::Done
                })
            }
            MetaRequest::Readdir { dir, after, max } => {
                s.readdir(cred, dir, after.as_deref(), max as usize).and_then(|(entries, more)| {
                    let entries = proto::BoundedVec::new(entries).map_err(|_| MetaError::Corrupt(dir.0))?;
                    Ok(MetaReply::Dir { entries, more })
                })
            }
            MetaRequest::GetStripe { handle } => {
                s.getstripe(handle).map(|st| MetaReply::Stripe { layout: st.layout, default: st.default })
            }
            MetaRequest::SetStripe { dir, spec } => s.setstripe(cred, dir, spec).map(|()| MetaReply::Done),
            MetaRequest::Symlink { parent, name, target, uid, gid } => s
                .symlink(cred, parent, &name, &target, Perm { mode: 0o777, uid, gid })
                .map(|(handle, attr)| MetaReply::Entry { handle, attr }),
            MetaRequest::Readlink { handle } => s.readlink(handle).and_then(|t| {
                // Stored targets passed the same bound on the way in.
                Ok(MetaReply::Link(proto::LinkTarget::new(t).map_err(|_| MetaError::Corrupt(handle.0))?))
            }),
            MetaRequest::Link { handle, parent, name } => {
                s.link(cred, handle, parent, &name).map(|attr| MetaReply::Entry { handle, attr })
            }
            MetaRequest::Mknod { parent, name, kind, mode, uid, gid } => s
                .mknod(cred, parent, &name, kind, Perm { mode, uid, gid })
                .map(|(handle, attr)| MetaReply::Entry { handle, attr }),
        };
        Some(r.unwrap_or_else(meta_err))
    }

    /// Creates a file: the store records it pending and picks its layout (on io servers known
    /// to be up, while the stripe count leaves a choice), its objects are made on every server
    /// of the layout, then it is committed. A create that fails because a server it was placed
    /// on turned out to be down is placed once more without it; if no placement avoids the
    /// servers that are down, the first failure (naming the server) is the answer. Unless it
    /// `may_wait` for io servers, only a create that takes a file made ahead is made; `None`
    /// for any other, with nothing written.
    #[allow(clippy::too_many_arguments)]
    fn create(
        &self,
        cred: &Cred,
        parent: Handle,
        name: &str,
        perm: Perm,
        spec: Option<proto::LayoutSpec>,
        rights: Rights,
        may_wait: bool,
    ) -> Option<MetaReply> {
        let mut first_err = None;
        for _ in 0..2 {
            let down = self.lock_live().down();
            // With a server down a file made ahead could not be written there; the ordinary
            // create places it elsewhere or names the server.
            let precreated = if down.is_empty() { self.precreated.take() } else { None };
            if precreated.is_none() && !may_wait {
                return None;
            }
            let place = Placement { avoid: &down, precreated, made_ahead_only: !may_wait };
            let made = self.store.create_placed(cred, parent, name, perm, spec, place);
            if let Some(h) = precreated.filter(|&h| !matches!(&made, Ok(c) if c.handle == h)) {
                self.precreated.put_back(h);
            }
            let c = match made {
                Ok(c) if c.committed => return Some(self.opened(c, rights)),
                Ok(c) => c,
                Err(MetaError::NeedsObjects) => return None,
                Err(e) => return Some(first_err.map_or_else(|| meta_err(e), MetaReply::Error)),
            };
            let servers: Vec<u32> = c.layout.servers(self.io.len() as u32).collect();
            if first_err.is_some() && servers.iter().any(|s| down.contains(s)) {
                // Placed again on a server that just failed: no placement avoids it.
                if let Err(e) = self.store.abort_create(c.handle) {
                    warn!(handle = %c.handle, error = %e, "abort_create failed");
                }
                break;
            }
            let failed = match self.make_objects(&c) {
                Ok(()) => return Some(self.commit(c, rights)),
                Err(f) => f,
            };
            // Worth another placement only if a server of this one is down now and was not
            // known to be before, and the failed create left its name free.
            let live = self.lock_live();
            let newly_down = servers.iter().any(|&s| !down.contains(&s) && live.is_down(s as usize));
            drop(live);
            first_err.get_or_insert(failed.error);
            if !(newly_down && failed.aborted) {
                break;
            }
        }
        Some(MetaReply::Error(first_err.unwrap_or_else(|| ErrorReply::new(Errno::EIO, "create failed"))))
    }

    /// Makes a created file visible and opens it for the client.
    fn commit(&self, c: crate::meta::Created, rights: Rights) -> MetaReply {
        if let Err(e) = self.store.commit_create(c.handle) {
            return meta_err(e);
        }
        self.opened(c, rights)
    }

    /// Opens a committed new file for the client.
    fn opened(&self, c: crate::meta::Created, rights: Rights) -> MetaReply {
        MetaReply::Opened {
            handle: c.handle,
            attr: c.attr,
            layout: c.layout,
            cap: self.mint(c.handle, Self::client_rights(rights)),
        }
    }

    /// `CreateObject` on every server of a pending create's layout. On failure, removes what
    /// was made and aborts the create, or leaves both to the janitor.
    fn make_objects(&self, c: &crate::meta::Created) -> Result<(), CreateFailed> {
        let h = c.handle;
        let results =
            self.fanout(h, c.layout, |_| IoRequest::CreateObject { cap: self.mint(h, Rights::ADMIN) });
        let Some(error) = results.iter().find_map(|r| r.as_ref().err().map(fs_err)) else {
            return Ok(());
        };
        warn!(handle = %h, error = %error.message, "create failed on an io server; cleaning up");
        // Remove what was made; whatever cannot be removed now is left to the janitor.
        let made: Vec<u32> =
            results.iter().enumerate().filter(|(_, r)| r.is_ok()).map(|(p, _)| p as u32).collect();
        let left = self.remove_on(h, c.layout, &made);
        if left.is_empty() {
            match self.store.abort_create(h) {
                Ok(_) => return Err(CreateFailed { error, aborted: true }),
                Err(e) => warn!(handle = %h, error = %e, "abort_create failed"),
            }
        } else {
            self.lock_janitor().stale_creates.push(Objects { handle: h, layout: c.layout });
        }
        Err(CreateFailed { error, aborted: false })
    }

    /// Makes the objects of up to one batch of files ahead, if fewer than half the wanted are
    /// left and every io server is up. False if some are wanted and it could not: a server is
    /// down, or failed (what was reserved then goes to the orphans, for the janitor to remove
    /// whatever was made).
    fn precreate_batch(&self) -> bool {
        let want = self.precreated.wanted().min(proto::MAX_BATCH);
        if want == 0 {
            return true;
        }
        if !self.lock_live().down().is_empty() {
            return false;
        }
        let hs = match self.store.reserve_precreated(want) {
            Ok(hs) => hs,
            Err(e) => {
                warn!(error = %e, "reserving handles to make objects ahead failed");
                return false;
            }
        };
        let caps = proto::BoundedVec::new(hs.iter().map(|&h| self.mint(h, Rights::ADMIN)).collect());
        let error = match caps {
            Ok(caps) => {
                let make = |s| (s, IoRequest::CreateObjects { caps: caps.clone() });
                let results = self.call((0..self.io.len()).map(make).collect());
                match results.into_iter().find_map(Result::err) {
                    None => {
                        self.precreated.add(hs);
                        return true;
                    }
                    Some(e) => e.to_string(),
                }
            }
            // Not reached: at most `MAX_BATCH` are reserved at once.
            Err(e) => e.to_string(),
        };
        warn!(files = hs.len(), cause = %error, "making objects ahead failed; creates make their own");
        if let Err(e) = self.store.release_precreated(&hs) {
            warn!(error = %e, "giving up handles reserved ahead failed; a restart does it");
        }
        false
    }

    fn lock_live(&self) -> std::sync::MutexGuard<'_, Liveness> {
        crate::lock(&self.live)
    }

    /// How errors name io server `server`.
    fn io_name(&self, server: usize) -> String {
        match self.cfg.cluster.io_servers.get(server) {
            Some(a) => crate::net::io_server_name(server, a),
            None => format!("io server {server}"),
        }
    }

    fn lock_janitor(&self) -> std::sync::MutexGuard<'_, Janitor> {
        self.janitor.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Has a removed file's objects removed on an upstream thread, without waiting; with
    /// every thread busy and the queue full they are left to the janitor, as the store keeps
    /// the file among its orphans until they are gone.
    fn remove_later(self: &Arc<Self>, objs: Objects) {
        let work = Deferred { shared: self.clone(), what: Waits::Remove(objs) };
        if self.upstream.submit(work).is_err() {
            debug!("orphan left for the janitor: the upstream threads are busy");
        }
    }

    /// Removes an orphan's objects now; forgets it if all are gone, else the janitor retries.
    fn remove_objects(&self, objs: Objects) {
        let all: Vec<u32> = (0..objs.layout.pcount).collect();
        if self.remove_on(objs.handle, objs.layout, &all).is_empty() {
            if let Err(e) = self.store.forget_orphan(objs.handle) {
                warn!(handle = %objs.handle, error = %e, "forget_orphan failed");
            }
        } else {
            debug!(handle = %objs.handle, "orphan left for the janitor");
        }
    }

    /// `RemoveObject` on relative servers `pnums`; returns those where it failed (a missing
    /// object counts as removed). Servers known to be down are not waited for: theirs are
    /// returned as failed at once, for the janitor.
    fn remove_on(&self, h: Handle, layout: Layout, pnums: &[u32]) -> Vec<u32> {
        let n = self.io.len() as u32;
        let (skip, ask): (Vec<u32>, Vec<u32>) = {
            let live = self.lock_live();
            pnums.iter().partition(|&&p| live.is_down(layout.server(p, n) as usize))
        };
        let results = self
            .fanout_some(h, layout, &ask, |_| IoRequest::RemoveObject { cap: self.mint(h, Rights::ADMIN) });
        ask.iter()
            .zip(results)
            .filter(|(_, r)| !matches!(r, Ok(_) | Err(FsError::Remote { code: Errno::ENOENT, .. })))
            .map(|(p, _)| *p)
            .chain(skip)
            .collect()
    }

    /// Pings every io server taken to be up, so one that died is known down before creates
    /// take objects made ahead on it (they would otherwise until its next request).
    fn ping_up(&self) {
        let up: Vec<usize> = {
            let live = self.lock_live();
            (0..self.io.len()).filter(|&s| !live.is_down(s)).collect()
        };
        if !up.is_empty() {
            self.call(up.into_iter().map(|s| (s, IoRequest::Ping)).collect());
        }
    }

    /// Pings every io server known to be down, so one that is back is known up again.
    fn probe_down(&self) {
        let down = self.lock_live().down();
        if !down.is_empty() {
            self.call(down.into_iter().map(|s| (s as usize, IoRequest::Ping)).collect());
        }
    }

    fn janitor_pass(&self) {
        self.probe_down();
        let stale = std::mem::take(&mut self.lock_janitor().stale_creates);
        for objs in stale {
            let all: Vec<u32> = (0..objs.layout.pcount).collect();
            if self.remove_on(objs.handle, objs.layout, &all).is_empty() {
                match self.store.abort_create(objs.handle) {
                    Ok(_) => info!(handle = %objs.handle, "stale create cleaned up"),
                    Err(e) => warn!(handle = %objs.handle, error = %e, "abort_create failed"),
                }
            } else {
                self.lock_janitor().stale_creates.push(objs);
            }
        }
        // A page at a time: removals while a server is down leave an orphan each.
        let mut after = None;
        loop {
            let page = match self.store.orphans_after(after, ORPHAN_PAGE) {
                Ok(page) => page,
                Err(e) => return warn!(error = %e, "listing orphans failed"),
            };
            after = page.last().map(|o| o.handle);
            let whole = page.len() == ORPHAN_PAGE;
            for objs in page {
                let all: Vec<u32> = (0..objs.layout.pcount).collect();
                if self.remove_on(objs.handle, objs.layout, &all).is_empty() {
                    let _ = self.store.forget_orphan(objs.handle);
                    info!(handle = %objs.handle, "orphan removed");
                }
            }
            if !whole {
                break;
            }
        }
    }

    /// Sends `make(pnum)` to every server of the layout at once; one result per `pnum`.
    fn fanout(
        &self,
        h: Handle,
        layout: Layout,
        make: impl Fn(u32) -> IoRequest,
    ) -> Vec<Result<IoReply, FsError>> {
        let all: Vec<u32> = (0..layout.pcount).collect();
        self.fanout_some(h, layout, &all, make)
    }

    fn fanout_some(
        &self,
        h: Handle,
        layout: Layout,
        pnums: &[u32],
        make: impl Fn(u32) -> IoRequest,
    ) -> Vec<Result<IoReply, FsError>> {
        let n = self.io.len() as u32;
        let results = self.call(pnums.iter().map(|&p| (layout.server(p, n) as usize, make(p))).collect());
        for e in results.iter().filter_map(|r| r.as_ref().err()) {
            debug!(handle = %h, error = %e, "io server request failed");
        }
        results
    }

    /// Sends each request to its (absolute) io server at once; one result per request, in
    /// order. Records which servers answered (see [`Liveness`]); a transport failure names
    /// the server.
    fn call(&self, reqs: Vec<(usize, IoRequest)>) -> Vec<Result<IoReply, FsError>> {
        let deadline = Instant::now() + self.cfg.io_timeout;
        let posted: Vec<(usize, Instant, Posted)> = reqs
            .into_iter()
            .map(|(server, req)| {
                let at = Instant::now();
                let op = (|| {
                    // A silent server is not sent to until its hold-off is over; then this
                    // small request is the check.
                    let probe = match self.io_health.get(server).map(|h| h.admit(Instant::now())) {
                        Some(Admit::Refuse { silent }) => {
                            return Err(FsError::Silent { server: self.io_name(server), silent });
                        }
                        Some(Admit::Probe) => true,
                        _ => false,
                    };
                    let sent = Sent { at, probe };
                    let peer = *self.io.get(server).ok_or_else(|| FsError::Invalid("server index".into()))?;
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let bytes = proto::encode(&Envelope::new(id, req))?;
                    let op = self.io_ep.request(
                        peer,
                        TAG_IO,
                        Bytes::from(bytes),
                        Payload::None,
                        ServiceLevel::Control,
                    )?;
                    self.io_ep.set_deadline(op, deadline)?;
                    Ok((op, sent))
                })();
                (server, at, op)
            })
            .collect();
        posted
            .into_iter()
            .map(|(server, at, posted)| {
                let r = posted.and_then(|(op, sent)| {
                    let r = (|| {
                        let c = self.io_ep.wait(op)?;
                        c.result?;
                        let reply =
                            c.reply.ok_or_else(|| FsError::UnexpectedReply("no reply header".into()))?;
                        match proto::decode::<IoReply>(&reply)?.body {
                            IoReply::Error(e) => {
                                Err(FsError::Remote { code: e.code, message: e.message.into_string() })
                            }
                            r => Ok(r),
                        }
                    })();
                    if let Some(h) = self.io_health.get(server) {
                        h.finish(sent, r.as_ref().err());
                    }
                    r
                });
                let r = r.map_err(|e| e.at(|| self.io_name(server)));
                self.note(server, at, &r);
                r
            })
            .collect()
    }

    /// Records whether `server` answered a request sent at `sent`, logging a change once.
    fn note(&self, server: usize, sent: Instant, r: &Result<IoReply, FsError>) {
        let answered = !matches!(r, Err(FsError::Server { .. } | FsError::Silent { .. }));
        match self.lock_live().record(server, answered, sent) {
            Some(Change::Down) => {
                let cause = r.as_ref().err().map(ToString::to_string).unwrap_or_default();
                warn!(%cause, "io server down: new files avoid it, its removals wait for it");
            }
            Some(Change::Up) => info!(server = %self.io_name(server), "io server answers again"),
            None => {}
        }
    }
}

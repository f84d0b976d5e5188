//! The client library.
//!
//! A [`Client`] talks to the meta server for names, attributes and layouts, and straight to the
//! io servers for data. An open [`File`] holds its layout and a capability; its I/O calls never
//! touch the meta server.
//!
//! # The I/O path
//! A read or write is turned into logical extents (contiguous, a [`View`], or a [`ListIo`] file
//! list), and [`Layout::plan`] gives one [`ServerPieces`] per involved server: the server-local
//! pieces (sent as the request's [`Descriptor`]) and the matching segments of the caller's buffer,
//! in stream order. Each server gets **one request** (split only where it would exceed the
//! transport's `max_message`, [`proto::MAX_PIECES`] or [`proto::MAX_IO_BYTES`]) whose payload is
//! those segments with no per-piece headers: for a write a gather list of zero-copy `Bytes`
//! slices of the caller's buffer (`Payload::Out(SendBuf::List)`), for a read a scatter list of
//! disjoint `BytesMut` views of the caller's buffer (`Payload::In(RecvBuf::List)`), rejoined
//! afterwards without copying. Every server's request is posted before the client waits for
//! any, each with a deadline, so a dead server yields an error, never a hang.
//!
//! There is no client data cache: every call goes to the io servers, and disjoint concurrent
//! writes from any number of clients are always correct (PVFS semantics).

use crate::capability::{Capability, Rights};
use crate::config::ClusterConfig;
use crate::errno::Errno;
use crate::layout::{Extent, Layout, ListIo, ServerPieces, View};
use crate::lock;
use crate::net::{FsError, FsResult, TAG_IO, TAG_META, Traced};
use crate::proto::{
    self, Attr, Descriptor, DirEntry, Envelope, FileKind, FsStats, Handle, IoReply, IoRequest, LayoutSpec,
    MetaReply, MetaRequest, Name, ObjectSize, ProtoError, SetAttr, SetTime,
};
use bytes::{Bytes, BytesMut};
use ionet::{Completion, Endpoint, OpBuf, OpId, Payload, PeerId, RecvBuf, SendBuf, ServiceLevel, WaitMode};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::field::{Empty, display};
use tracing::{Span, debug, debug_span};

/// Default cap on the data of one read request to one server over `tcp://`. A read with more
/// for one server goes as several requests, all posted at once. Over tcp this raised E1's
/// reading cells by about 0.05 of the reference (`benchmarks/journal/e1-readings.md`); over
/// softib, where a
/// read is one RDMA write per request, it lowered them by 0.05–0.14, so there a read stays one
/// request per server. Writes stay whole on every transport: split, each server gets several
/// write streams per client at once and serves them one by one while their data waits in its
/// sockets, which cost E1's writing cells about 0.06.
pub const DEFAULT_READ_REQUEST_BYTES: u64 = 1 << 20;

/// How long a client's adaptive waits poll before they sleep, over softib and ib (over tcp
/// the transport's default, 100 µs). During a call over RDMA the client's CPU has nothing to
/// do (the io servers move the data), and a call takes longer than 100 µs from a few hundred
/// KiB on, so the client slept through each call and paid a wake-up (about 50 µs here) for
/// its reply. E1 over softib, three alternated pairs of full grids: geometric-mean bandwidth
/// +3 to +14 % (`benchmarks/journal/e1-clients-poll-for-2-ms-over-softib-and-ib.md`). Over tcp the client's CPU is busy sending or receiving
/// the data, and polling longer gained nothing there.
pub const DEFAULT_RDMA_SPIN_BUDGET: Duration = Duration::from_millis(2);

/// Most symbolic links one path walk follows before it fails with `ELOOP` (Linux's limit).
pub const MAX_SYMLINK_FOLLOWS: usize = 40;

/// The largest data payload of one request to one server, by direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Any request (writes, and reads through a view).
    pub max: u64,
    /// Reads by offset or list.
    pub read: u64,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Base deadline of every request (plus time for its data at 10 MB/s).
    pub timeout: Duration,
    /// Largest data payload of one request to one server (default and cap: the transport's
    /// `max_message`).
    pub max_request_bytes: Option<u64>,
    /// Largest data of one read request to one server (default: [`DEFAULT_READ_REQUEST_BYTES`]
    /// over tcp, else as `max_request_bytes`; never more than that).
    pub read_request_bytes: Option<u64>,
    /// How the client waits for the transport.
    pub wait_mode: WaitMode,
    /// How long adaptive waits poll before sleeping (default: [`DEFAULT_RDMA_SPIN_BUDGET`]
    /// over softib and ib, the transport's default over tcp).
    pub spin_budget: Option<Duration>,
    /// Owner of new files, directories and links (default: this process's effective uid, as
    /// a local file system would record).
    pub uid: u32,
    /// Their group (default: this process's effective gid).
    pub gid: u32,
    /// Supplementary groups the meta server's permission checks count, with `uid` and `gid`
    /// (default: this process's).
    pub groups: Vec<u32>,
    /// The communication manager's table for this client's endpoint (default: the
    /// transport's, with `IONET_INLINE_MAX` / `IONET_FAST_MAX` applied); benchmarks force a
    /// mechanism here.
    pub policy: Option<ionet::Policy>,
    /// InfiniBand engine settings of this client's endpoint (default: ionet's with
    /// `list_alloc_hint(true)`, see [`default_ib_config`]).
    pub ib: Option<ionet::IbConfig>,
    /// Congestion control of this client's TCP connections; `None` keeps the kernel's
    /// (default: [`crate::net::tcp_congestion`], reno unless `STRIPEFS_TCP_CONGESTION` says
    /// otherwise).
    pub tcp_congestion: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: crate::net::DEFAULT_TIMEOUT,
            max_request_bytes: None,
            read_request_bytes: None,
            wait_mode: WaitMode::Adaptive,
            spin_budget: None,
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
            groups: nix::unistd::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
            policy: None,
            ib: None,
            tcp_congestion: crate::net::tcp_congestion(),
        }
    }
}

impl ClientOptions {
    /// What a client with these options puts in one request at most, on a `scheme` transport
    /// whose largest message is `max_msg` bytes.
    pub fn request_limits(&self, scheme: ionet::Scheme, max_msg: u64) -> RequestLimits {
        let max = self.max_request_bytes.unwrap_or(max_msg).min(max_msg).clamp(1, proto::MAX_IO_BYTES);
        let default_read = if scheme == ionet::Scheme::Tcp { DEFAULT_READ_REQUEST_BYTES } else { max };
        let read = self.read_request_bytes.unwrap_or(default_read).clamp(1, max);
        RequestLimits { max, read }
    }

    /// How long this client's adaptive waits poll on a `scheme` transport before sleeping.
    pub fn spin_budget_for(&self, scheme: ionet::Scheme) -> Duration {
        self.spin_budget.unwrap_or(if scheme == ionet::Scheme::Tcp {
            ionet::Config::default().get_spin_budget()
        } else {
            DEFAULT_RDMA_SPIN_BUDGET
        })
    }
}

/// The client's InfiniBand settings unless [`ClientOptions::ib`] says otherwise: ionet's, with
/// the list allocation hint on. Every list payload the client builds is cut from one caller
/// buffer (a striped request's pieces for one server are every N-th stripe of it), so one
/// registration spanning the pieces replaces one per piece: on softib, an 8 MiB write over 4
/// io servers (32 pieces each) cost the client 10-12 ms of CPU per write+read pair in pinning
/// without the hint and 3.4-4 ms with it. The span's gaps belong to the same caller buffer and
/// are only reachable by the cluster's own (key-authenticated) io servers.
pub fn default_ib_config() -> ionet::IbConfig {
    ionet::IbConfig::default().list_alloc_hint(true)
}

#[derive(Debug)]
struct Inner {
    ep: Endpoint,
    meta: PeerId,
    io: Vec<PeerId>,
    /// How errors name the meta server and each io server (role and address).
    meta_name: String,
    io_names: Vec<String>,
    /// The debug log's `connection` span of the meta server and of each io server (role,
    /// index, address); each request's span is a child of its server's.
    meta_span: Span,
    io_spans: Vec<Span>,
    /// Whether the meta server and each io server are answering.
    meta_health: Health,
    io_health: Vec<Health>,
    next_id: AtomicU64,
    opts: ClientOptions,
    limits: RequestLimits,
    /// Temporaries of `read_into` and the mount's reads, kept between calls.
    scratch: crate::buf::Scratch,
    /// Capabilities of files opened lately, to ask their sizes with.
    size_caps: Mutex<sizes::SizeCaps>,
}

impl Inner {
    /// Keeps a buffer taken from `scratch` (rejoined with `tail`) for later calls; a buffer
    /// it no longer keeps loses its cached registrations before the memory goes back.
    fn keep(&self, buf: BytesMut, tail: BytesMut) {
        for b in self.scratch.put(buf, tail) {
            self.ep.invalidate_registrations(&b);
        }
    }

    /// Keeps a kept buffer that was frozen to be sent, once the transport has let go of it.
    /// It has when the write returned, unless it gave up on a server that may still read it:
    /// then the buffer is freed when that ends.
    fn keep_sent(&self, whole: Bytes) {
        if let Ok(whole) = whole.try_into_mut() {
            self.keep(whole, BytesMut::new());
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // With `cache_foreign`, a kept buffer may have a cached registration: forget it before
        // the memory goes back to the allocator.
        for b in self.scratch.drain() {
            self.ep.invalidate_registrations(&b);
        }
    }
}

mod admit;
mod file;
mod sizes;
use crate::health::Health;
use admit::Target;
pub use file::File;
use sizes::FileSpace;

/// A connection to a stripefs cluster. Cheap to clone; usable from many threads.
///
/// Its requests carry credentials (from [`ClientOptions`], or [`Client::as_caller`]'s): the
/// meta server applies the POSIX permission rules to them, and what the client creates is
/// owned by their user and group.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
    cred: Arc<proto::Cred>,
}

/// A caller's layout with an impossible field is the caller's error ([`FsError::Layout`],
/// `EINVAL`), found before anything is sent, not a protocol error of the message it would make.
fn check_spec(spec: Option<&LayoutSpec>) -> FsResult<()> {
    match spec.map(LayoutSpec::validate) {
        Some(Err(ProtoError::Layout(e))) => Err(FsError::Layout(e)),
        Some(Err(e)) => Err(FsError::Proto(e)),
        _ => Ok(()),
    }
}

/// What `create` makes.
#[derive(Debug, Clone, Copy)]
pub struct CreateOptions {
    /// Permission bits.
    pub mode: u32,
    /// Requested layout (unset fields inherited from the directory, then the defaults).
    pub layout: Option<LayoutSpec>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions { mode: 0o644, layout: None }
    }
}

/// `stat` of a path: attributes with the real logical size, and the layout of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The handle.
    pub handle: Handle,
    /// Attributes; for files `size` is the logical size (max over io servers), for symbolic
    /// links the target's length.
    pub attr: Attr,
    /// A file's layout.
    pub layout: Option<Layout>,
    /// Bytes of disk space a file's objects hold on the io servers together (0 for anything
    /// but a file): less than its size where it has holes, as `st_blocks` × 512 shows locally.
    pub allocated: u64,
}

/// A file whose logical size could not be learnt (see [`Client::stat_entry`]).
#[derive(Debug)]
pub struct SizeUnknown {
    /// What the meta server knows. `attr.size` is the size it records (the last truncate),
    /// not the logical size.
    pub stat: Stat,
    /// Why the size is unknown (an io server that did not answer is named in it).
    pub error: FsError,
}

/// The cluster's space as [`Client::disk_space`] adds it up.
#[derive(Debug)]
#[non_exhaustive]
pub struct ClusterSpace {
    /// The io servers' file systems added up, of those that answered.
    pub space: proto::DiskSpace,
    /// Why each io server left out did not answer (the error names it).
    pub missing: Vec<FsError>,
}

/// What [`Client::status`] learnt of one server.
#[derive(Debug)]
pub enum ServerState {
    /// It answered with its status.
    Up(proto::ServerStatus),
    /// It answered, but not with a status: a server of another protocol version (the error
    /// says which it speaks) or one that refused the request. It is reachable; its figures are
    /// unknown.
    Unknown(FsError),
    /// It could not be reached, was lost, or did not answer in time (the error names it).
    Down(FsError),
}

impl ServerState {
    /// Sorts a status request's outcome: only a transport failure means the server is down.
    pub fn of(r: FsResult<proto::ServerStatus>) -> ServerState {
        match r {
            Ok(s) => ServerState::Up(s),
            Err(e @ (FsError::Server { .. } | FsError::Net(_))) => ServerState::Down(e),
            Err(e) => ServerState::Unknown(e),
        }
    }

    /// Whether the server could not be reached.
    pub fn is_down(&self) -> bool {
        matches!(self, ServerState::Down(_))
    }
}

/// The status of every server of the cluster ([`Client::status`]).
#[derive(Debug)]
pub struct ClusterStatus {
    /// The meta server.
    pub meta: ServerState,
    /// The io servers, in the cluster file's order.
    pub io: Vec<ServerState>,
}

/// A request posted (its op, request id and when it was sent), or why it was not.
type Posted = FsResult<(OpId, u64, Instant)>;

/// Requests on their way to io servers: each one's server, span and op.
type IoPosted = Vec<(usize, Traced, Posted)>;

/// A file's layout and logical size and space (or why they are not known), asked with a kept
/// capability.
type KeptSize = Option<(Layout, FsResult<FileSpace>)>;

/// A request's outcome in the debug log: `ok`, or the error.
struct Outcome<'a, T>(&'a FsResult<T>);

impl<T> std::fmt::Display for Outcome<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ok(_) => f.write_str("ok"),
            Err(e) => write!(f, "{e}"),
        }
    }
}

/// One request to one io server, ready to post.
#[derive(Debug)]
struct Batch {
    pnum: u32,
    server: usize,
    desc: Descriptor,
    segments: Vec<Extent>,
    bytes: u64,
}

impl Client {
    /// Connects to the cluster in `cfg` (nothing is sent until the first call).
    pub fn connect(cfg: &ClusterConfig) -> FsResult<Client> {
        Self::connect_with(cfg, ClientOptions::default())
    }

    /// Connects with explicit options.
    pub fn connect_with(cfg: &ClusterConfig, opts: ClientOptions) -> FsResult<Client> {
        let key = cfg.cluster_key()?;
        let mut ep_cfg =
            crate::net::endpoint_config(&key, opts.wait_mode, false, opts.tcp_congestion.as_deref())
                .spin_budget(opts.spin_budget_for(cfg.transport));
        if let Some(p) = &opts.policy {
            ep_cfg = ep_cfg.policy(p.clone());
        }
        ep_cfg = ep_cfg.ib(opts.ib.clone().unwrap_or_else(default_ib_config));
        let ep = Endpoint::client(ep_cfg)?;
        let meta = ep.connect(&cfg.meta)?;
        let io = cfg.io_servers.iter().map(|a| ep.connect(a)).collect::<Result<Vec<_>, _>>()?;
        let info = ep.info();
        let limits = opts.request_limits(info.scheme, info.max_message as u64);
        let io_names = cfg.io_servers.iter().enumerate().map(|(i, a)| crate::net::io_server_name(i, a));
        let meta_span = debug_span!(parent: None, "connection", role = "meta", addr = %cfg.meta);
        let io_spans: Vec<Span> = cfg
            .io_servers
            .iter()
            .enumerate()
            .map(|(i, a)| debug_span!(parent: None, "connection", role = "io", index = i, addr = %a))
            .collect();
        for s in std::iter::once(&meta_span).chain(&io_spans) {
            debug!(parent: s, "connecting");
        }
        let cred = Arc::new(proto::Cred::new(opts.uid, opts.gid, opts.groups.clone()));
        Ok(Client {
            cred,
            inner: Arc::new(Inner {
                ep,
                meta,
                io,
                meta_name: crate::net::meta_server_name(&cfg.meta),
                io_names: io_names.collect(),
                meta_span,
                io_spans,
                meta_health: Health::default(),
                io_health: cfg.io_servers.iter().map(|_| Health::default()).collect(),
                next_id: AtomicU64::new(1),
                opts,
                limits,
                scratch: Default::default(),
                size_caps: Default::default(),
            }),
        })
    }

    /// This client's connection acting for another caller: its requests carry `cred`, and
    /// what it creates is owned by `cred`'s user and group (the FUSE mount serves each
    /// request as the process that made it).
    pub fn as_caller(&self, cred: proto::Cred) -> Client {
        Client { inner: self.inner.clone(), cred: Arc::new(cred) }
    }

    /// The credentials this client's requests carry.
    pub fn cred(&self) -> &proto::Cred {
        &self.cred
    }

    /// The client's endpoint (for its counters: mechanisms used, registration cache).
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.ep
    }

    /// Number of io servers in the cluster.
    pub fn io_servers(&self) -> u32 {
        self.inner.io.len() as u32
    }

    fn id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn deadline(&self, bytes: u64) -> Instant {
        Instant::now() + crate::net::io_timeout(self.inner.opts.timeout, bytes)
    }

    /// Posts one request; the deadline covers `bytes` of payload.
    fn post(
        &self,
        peer: PeerId,
        tag: u64,
        header: Vec<u8>,
        payload: Payload,
        sl: ServiceLevel,
        bytes: u64,
    ) -> FsResult<OpId> {
        let ep = &self.inner.ep;
        let op = ep.request(peer, tag, Bytes::from(header), payload, sl)?;
        ep.set_deadline(op, self.deadline(bytes))?;
        Ok(op)
    }

    /// Waits for a request to an io server (its deadline bounds the wait).
    fn wait_io(&self, op: OpId) -> FsResult<Completion> {
        Ok(self.inner.ep.wait(op)?)
    }

    /// Decodes a completed request's reply; server error replies become [`FsError::Remote`].
    fn reply<R: proto::Reply + ErrorOf>(c: &Completion, id: u64) -> FsResult<R> {
        if let Err(e) = &c.result {
            return Err(FsError::Net(e.duplicate()));
        }
        let bytes = c.reply.as_ref().ok_or_else(|| FsError::UnexpectedReply("no reply header".into()))?;
        let env = proto::decode::<R>(bytes)?;
        if env.id != id && env.id != 0 {
            return Err(FsError::UnexpectedReply(format!("reply id {} for request {id}", env.id)));
        }
        match env.body.error() {
            Some(e) => Err(FsError::Remote { code: e.code, message: e.message.to_string() }),
            None => Ok(env.body),
        }
    }

    fn meta_call(&self, req: MetaRequest) -> FsResult<MetaReply> {
        let id = self.id();
        let traced = Traced::new(debug_span!(
            parent: &self.inner.meta_span,
            "request",
            id,
            op = req.kind(),
            handle = Empty,
            result = Empty,
            elapsed_us = Empty,
        ));
        if !traced.span.is_disabled()
            && let Some(h) = req.subject()
        {
            traced.span.record("handle", display(h));
        }
        let bytes = proto::encode(&Envelope::new(id, proto::MetaCall { cred: (*self.cred).clone(), req }))?;
        let r = self.admit(Target::Meta).and_then(|sent| {
            let r = (|| {
                let op =
                    self.post(self.inner.meta, TAG_META, bytes, Payload::None, ServiceLevel::Control, 0)?;
                let c = self.inner.ep.wait(op)?;
                Self::reply::<MetaReply>(&c, id)
            })();
            self.finish(Target::Meta, sent, r.as_ref().err());
            r.map_err(|e| e.at(|| self.inner.meta_name.clone()))
        });
        traced.done(Outcome(&r));
        r
    }

    /// The span of a request to io server `server` (a child of its connection span): `op`, and
    /// where the request is about an object, its handle and the extent it moves.
    fn io_span(&self, server: usize, id: u64, req: &IoRequest) -> Traced {
        let none = Span::none();
        let parent = self.inner.io_spans.get(server).unwrap_or(&none);
        let traced = Traced::new(debug_span!(
            parent: parent,
            "request",
            id,
            op = req.kind(),
            handle = Empty,
            off = Empty,
            len = Empty,
            result = Empty,
            elapsed_us = Empty,
        ));
        if !traced.span.is_disabled() {
            if let Some(cap) = req.cap() {
                traced.span.record("handle", display(cap.handle));
            }
            if let Some((off, len)) = req.extent() {
                traced.span.record("off", off).record("len", len);
            }
        }
        traced
    }

    /// Names io server `server` in a transport failure of a request to it.
    fn at_io(&self, server: usize) -> impl FnOnce(FsError) -> FsError + '_ {
        move |e| {
            e.at(|| self.inner.io_names.get(server).cloned().unwrap_or_else(|| format!("io server {server}")))
        }
    }

    fn name(s: &str) -> FsResult<Name> {
        Name::new(s).map_err(|_| FsError::code(Errno::ENAMETOOLONG, "name too long"))
    }

    fn unexpected<T>(r: MetaReply) -> FsResult<T> {
        Err(FsError::UnexpectedReply(format!("{r:?}")))
    }

    // ---------------------------------------------------------------------------------------
    // Handle-level namespace calls
    // ---------------------------------------------------------------------------------------

    /// Namespace counters.
    pub fn statfs(&self) -> FsResult<FsStats> {
        match self.meta_call(MetaRequest::Statfs)? {
            MetaReply::Statfs(s) => Ok(s),
            r => Self::unexpected(r),
        }
    }

    /// `name` in directory `parent`.
    pub fn lookup(&self, parent: Handle, name: &str) -> FsResult<(Handle, Attr)> {
        self.entry(MetaRequest::Lookup { parent, name: Self::name(name)? })
    }

    /// Attributes as the meta server records them (a file's `size` is the last truncate; use
    /// [`Client::stat_handle`] or [`File::size`] for the logical size).
    pub fn getattr(&self, h: Handle) -> FsResult<Attr> {
        match self.meta_call(MetaRequest::Getattr { handle: h })? {
            MetaReply::Attr(a) => Ok(a),
            r => Self::unexpected(r),
        }
    }

    /// Attributes with a file's logical size, and its layout (of a symbolic link itself).
    pub fn stat_handle(&self, h: Handle) -> FsResult<Stat> {
        self.stat_entry(h)?.map_err(|u| u.error)
    }

    /// As [`Client::stat_handle`], for listings: when the meta server answers but an io server
    /// of a file's layout does not (or fails), the file's size cannot be known, and the inner
    /// `Err` has what the meta server knows ([`SizeUnknown`]) instead of failing the entry.
    pub fn stat_entry(&self, h: Handle) -> FsResult<Result<Stat, SizeUnknown>> {
        let (attr, sized) = self.meta_call_sized(h, MetaRequest::Getattr { handle: h })?;
        let attr = match attr {
            MetaReply::Attr(a) => a,
            r => return Self::unexpected(r),
        };
        self.stat_of(h, attr, sized)
    }

    /// The stat of `h` whose attributes are `attr`: with the logical size of `sized` (see
    /// [`Client::meta_call_sized`]), else from sizes asked now.
    fn stat_of(&self, h: Handle, attr: Attr, sized: KeptSize) -> FsResult<Result<Stat, SizeUnknown>> {
        if attr.kind != FileKind::File {
            return Ok(Ok(Stat { handle: h, attr, layout: None, allocated: 0 }));
        }
        let (stat, space) = match sized {
            Some((layout, space)) => (Stat { handle: h, attr, layout: Some(layout), allocated: 0 }, space),
            None => {
                // No rights: a size is an attribute, which needs no permission on the file.
                let f = self.open_handle(h, Rights::NONE)?;
                (Stat { handle: h, attr: f.attr.clone(), layout: Some(f.layout), allocated: 0 }, f.space())
            }
        };
        Ok(match space {
            Ok(space) => Ok(space.stat(stat)),
            Err(error) => Err(SizeUnknown { stat, error }),
        })
    }

    /// Makes every change the meta server has acknowledged durable: changes of times and mode
    /// bits added (see [`SetAttr::sync`]) are otherwise flushed within about a second. [`File::sync`]
    /// does this for its file; this is for the rest (a directory's times).
    pub fn sync_metadata(&self) -> FsResult<()> {
        match self.meta_call(MetaRequest::Sync)? {
            MetaReply::Done => Ok(()),
            r => Self::unexpected(r),
        }
    }

    /// Changes attributes; a size truncates (or extends with a hole).
    pub fn setattr(&self, h: Handle, set: SetAttr) -> FsResult<Attr> {
        match self.meta_call(MetaRequest::Setattr { handle: h, set })? {
            MetaReply::Attr(a) => Ok(a),
            r => Self::unexpected(r),
        }
    }

    /// Creates and opens (read-write) a file in `parent`.
    pub fn create_in(&self, parent: Handle, name: &str, opts: CreateOptions) -> FsResult<File> {
        check_spec(opts.layout.as_ref())?;
        let req = MetaRequest::Create {
            parent,
            name: Self::name(name)?,
            mode: opts.mode & 0o7777,
            uid: self.cred.uid,
            gid: self.cred.gid,
            layout: opts.layout,
            rights: Rights::READ_WRITE,
        };
        self.opened(self.meta_call(req)?, Rights::READ_WRITE)
    }

    /// Opens a file by handle.
    pub fn open_handle(&self, h: Handle, rights: Rights) -> FsResult<File> {
        self.opened(self.meta_call(MetaRequest::Open { handle: h, rights })?, rights)
    }

    fn opened(&self, r: MetaReply, rights: Rights) -> FsResult<File> {
        match r {
            MetaReply::Opened { handle, attr, layout, cap } => {
                layout.validate(self.io_servers())?;
                if cap.handle == handle {
                    lock(&self.inner.size_caps).keep(layout, &cap);
                }
                Ok(File {
                    client: self.clone(),
                    handle,
                    attr,
                    layout,
                    rights,
                    cap: Mutex::new(cap),
                    view: Mutex::new(None),
                    written: AtomicBool::new(false),
                })
            }
            r => Self::unexpected(r),
        }
    }

    /// Creates a directory in `parent`.
    pub fn mkdir_in(&self, parent: Handle, name: &str, mode: u32) -> FsResult<(Handle, Attr)> {
        let req = MetaRequest::Mkdir {
            parent,
            name: Self::name(name)?,
            mode: mode & 0o7777,
            uid: self.cred.uid,
            gid: self.cred.gid,
        };
        self.entry(req)
    }

    /// Removes an empty directory.
    pub fn rmdir_in(&self, parent: Handle, name: &str) -> FsResult<()> {
        self.done(MetaRequest::Rmdir { parent, name: Self::name(name)? })
    }

    /// Creates a symbolic link `name` in `parent` pointing at `target` (stored as given: it
    /// need not exist, and it may be relative to `parent`).
    pub fn symlink_in(&self, parent: Handle, name: &str, target: &str) -> FsResult<(Handle, Attr)> {
        let target = proto::LinkTarget::new(target)
            .map_err(|_| FsError::code(Errno::ENAMETOOLONG, "symbolic link target too long"))?;
        let req = MetaRequest::Symlink {
            parent,
            name: Self::name(name)?,
            target,
            uid: self.cred.uid,
            gid: self.cred.gid,
        };
        self.entry(req)
    }

    /// A symbolic link's target (`EINVAL` for anything else).
    pub fn readlink_handle(&self, h: Handle) -> FsResult<String> {
        match self.meta_call(MetaRequest::Readlink { handle: h })? {
            MetaReply::Link(t) => Ok(t.into_string()),
            r => Self::unexpected(r),
        }
    }

    /// Gives file `h` (not a directory) the further name `name` in `parent`: a hard link.
    /// Returns its attributes with the raised link count.
    pub fn link_in(&self, h: Handle, parent: Handle, name: &str) -> FsResult<Attr> {
        match self.meta_call(MetaRequest::Link { handle: h, parent, name: Self::name(name)? })? {
            MetaReply::Entry { attr, .. } => Ok(attr),
            r => Self::unexpected(r),
        }
    }

    /// Creates a FIFO, socket or device node (`kind` says which, and a device's number) in
    /// `parent`: a record on the meta server without objects.
    pub fn mknod_in(
        &self,
        parent: Handle,
        name: &str,
        kind: FileKind,
        mode: u32,
    ) -> FsResult<(Handle, Attr)> {
        if !kind.is_special() {
            return Err(FsError::code(Errno::EINVAL, "mknod makes FIFOs, sockets and device nodes"));
        }
        let req = MetaRequest::Mknod {
            parent,
            name: Self::name(name)?,
            kind,
            mode: mode & 0o7777,
            uid: self.cred.uid,
            gid: self.cred.gid,
        };
        self.entry(req)
    }

    /// Removes a name of a file (with the last, its objects on the io servers), a symbolic
    /// link or a special file.
    pub fn unlink_in(&self, parent: Handle, name: &str) -> FsResult<()> {
        self.done(MetaRequest::Unlink { parent, name: Self::name(name)? })
    }

    /// POSIX rename.
    pub fn rename_in(&self, sp: Handle, sn: &str, dp: Handle, dn: &str) -> FsResult<()> {
        self.done(MetaRequest::Rename {
            src_parent: sp,
            src_name: Self::name(sn)?,
            dst_parent: dp,
            dst_name: Self::name(dn)?,
        })
    }

    /// A meta request answered with the entry it made or found.
    fn entry(&self, req: MetaRequest) -> FsResult<(Handle, Attr)> {
        match self.meta_call(req)? {
            MetaReply::Entry { handle, attr } => Ok((handle, attr)),
            r => Self::unexpected(r),
        }
    }

    fn done(&self, req: MetaRequest) -> FsResult<()> {
        match self.meta_call(req)? {
            MetaReply::Done => Ok(()),
            r => Self::unexpected(r),
        }
    }

    /// One page of a directory: up to `max` entries after `after`, and whether more follow.
    pub fn readdir_page(
        &self,
        dir: Handle,
        after: Option<&str>,
        max: u32,
    ) -> FsResult<(Vec<DirEntry>, bool)> {
        let after = after.map(Self::name).transpose()?;
        let cursor = after.clone();
        match self.meta_call(MetaRequest::Readdir { dir, after, max: max.max(1) })? {
            // The decoder checked the page's own names and order; a page must also start past
            // its cursor, or pages could repeat a name (or never end).
            MetaReply::Dir { entries, .. }
                if cursor.zip(entries.first()).is_some_and(|(c, e)| e.name.as_str() <= c.as_str()) =>
            {
                Err(ProtoError::Invalid(proto::DIR_ENTRY_ORDER).into())
            }
            MetaReply::Dir { entries, more } => Ok((entries.into_inner(), more)),
            r => Self::unexpected(r),
        }
    }

    /// Every entry of a directory, in name order.
    pub fn readdir_handle(&self, dir: Handle) -> FsResult<Vec<DirEntry>> {
        let mut out: Vec<DirEntry> = Vec::new();
        loop {
            let after = out.last().map(|e| e.name.to_string());
            let (page, more) = self.readdir_page(dir, after.as_deref(), proto::MAX_READDIR as u32)?;
            let empty = page.is_empty();
            out.extend(page);
            if !more || empty {
                return Ok(out);
            }
        }
    }

    /// A file's layout or a directory's default layout.
    pub fn getstripe_handle(&self, h: Handle) -> FsResult<(Option<Layout>, Option<LayoutSpec>)> {
        match self.meta_call(MetaRequest::GetStripe { handle: h })? {
            MetaReply::Stripe { layout, default } => Ok((layout, default)),
            r => Self::unexpected(r),
        }
    }

    /// Sets (or clears) a directory's default layout.
    pub fn setstripe_handle(&self, dir: Handle, spec: Option<LayoutSpec>) -> FsResult<()> {
        check_spec(spec.as_ref())?;
        self.done(MetaRequest::SetStripe { dir, spec })
    }

    // ---------------------------------------------------------------------------------------
    // Path-level calls. Paths are absolute or root-relative. Symbolic links are followed in
    // every component but the last of a path that names an entry to create, remove, rename or
    // read as a link; an absolute target starts again at the stripefs root (a link made through
    // a FUSE mount that points outside it cannot be followed here). `..` is the directory the
    // walk came from, never above the root.
    // ---------------------------------------------------------------------------------------

    fn components(path: &str) -> VecDeque<String> {
        path.split('/').filter(|c| !c.is_empty() && *c != ".").map(str::to_owned).collect()
    }

    /// Walks the components `todo` from the root, following symbolic links (the last
    /// component's too when `follow_last`); returns the handle reached. `stack` holds the
    /// directories walked through, so `..` goes back the way the walk came.
    fn walk(&self, mut todo: VecDeque<String>, follow_last: bool) -> FsResult<Handle> {
        let mut stack = vec![Handle::ROOT];
        let mut follows = 0;
        while let Some(c) = todo.pop_front() {
            let dir = *stack.last().unwrap_or(&Handle::ROOT);
            if c == ".." {
                if stack.len() > 1 {
                    stack.pop();
                }
                continue;
            }
            let (h, attr) = self.lookup(dir, &c)?;
            let last = todo.is_empty();
            match attr.kind {
                FileKind::Symlink if follow_last || !last => {
                    follows += 1;
                    if follows > MAX_SYMLINK_FOLLOWS {
                        return Err(FsError::code(
                            Errno::ELOOP,
                            format!("more than {MAX_SYMLINK_FOLLOWS} symbolic links"),
                        ));
                    }
                    let target = self.readlink_handle(h)?;
                    if target.starts_with('/') {
                        stack.truncate(1);
                    }
                    for t in Self::components(&target).into_iter().rev() {
                        todo.push_front(t);
                    }
                }
                k if k != FileKind::Dir && !last => {
                    return Err(FsError::code(Errno::ENOTDIR, format!("{c} is not a directory")));
                }
                _ => stack.push(h),
            }
        }
        Ok(*stack.last().unwrap_or(&Handle::ROOT))
    }

    /// The handle a path names, following symbolic links.
    pub fn resolve(&self, path: &str) -> FsResult<Handle> {
        self.walk(Self::components(path), true)
    }

    /// The handle a path names; a symbolic link in the last component is not followed.
    pub fn resolve_nofollow(&self, path: &str) -> FsResult<Handle> {
        self.walk(Self::components(path), false)
    }

    /// The parent directory of a path and the last component.
    fn parent_of(&self, path: &str) -> FsResult<(Handle, String)> {
        let mut comps = Self::components(path);
        let last = comps.pop_back().ok_or_else(|| FsError::code(Errno::EINVAL, "the root has no name"))?;
        Ok((self.walk(comps, true)?, last))
    }

    /// `stat`: attributes, logical size, layout (of what a symbolic link points at).
    pub fn stat(&self, path: &str) -> FsResult<Stat> {
        self.stat_handle(self.resolve(path)?)
    }

    /// `lstat`: as [`Client::stat`], but of a symbolic link itself.
    pub fn lstat(&self, path: &str) -> FsResult<Stat> {
        self.stat_handle(self.resolve_nofollow(path)?)
    }

    /// The handle and attributes of what a path names, from the meta server alone: no io
    /// server is asked, so a file's `size` is the one the meta server records (the last
    /// truncate), not its logical size. For name-only work (`rm`, `mv`, is it a directory?),
    /// which must not fail because an io server is down.
    pub fn attr(&self, path: &str) -> FsResult<(Handle, Attr)> {
        let h = self.resolve(path)?;
        Ok((h, self.getattr(h)?))
    }

    /// As [`Client::attr`], of a symbolic link itself.
    pub fn lattr(&self, path: &str) -> FsResult<(Handle, Attr)> {
        let h = self.resolve_nofollow(path)?;
        Ok((h, self.getattr(h)?))
    }

    /// Creates a symbolic link at `link` pointing at `target` (the order of `ln -s` and
    /// `std::os::unix::fs::symlink`).
    pub fn symlink(&self, target: &str, link: &str) -> FsResult<Handle> {
        let (p, name) = self.parent_of(link)?;
        Ok(self.symlink_in(p, &name, target)?.0)
    }

    /// `link(2)`: a further name `new` for what `existing` names (a symbolic link itself,
    /// not what it points at, as Linux does). Returns the new link count.
    pub fn link(&self, existing: &str, new: &str) -> FsResult<u32> {
        let h = self.resolve_nofollow(existing)?;
        let (p, name) = self.parent_of(new)?;
        Ok(self.link_in(h, p, &name)?.nlink)
    }

    /// The target of the symbolic link at `path`.
    pub fn readlink(&self, path: &str) -> FsResult<String> {
        self.readlink_handle(self.resolve_nofollow(path)?)
    }

    /// Creates and opens a file.
    pub fn create(&self, path: &str, opts: CreateOptions) -> FsResult<File> {
        let (p, name) = self.parent_of(path)?;
        self.create_in(p, &name, opts)
    }

    /// Opens a file.
    pub fn open(&self, path: &str, rights: Rights) -> FsResult<File> {
        self.open_handle(self.resolve(path)?, rights)
    }

    /// Creates a directory.
    pub fn mkdir(&self, path: &str, mode: u32) -> FsResult<Handle> {
        let (p, name) = self.parent_of(path)?;
        Ok(self.mkdir_in(p, &name, mode)?.0)
    }

    /// Creates a FIFO, socket or device node at `path` (see [`Client::mknod_in`]).
    pub fn mknod(&self, path: &str, kind: FileKind, mode: u32) -> FsResult<Handle> {
        let (p, name) = self.parent_of(path)?;
        Ok(self.mknod_in(p, &name, kind, mode)?.0)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, path: &str) -> FsResult<()> {
        let (p, name) = self.parent_of(path)?;
        self.rmdir_in(p, &name)
    }

    /// Removes a file.
    pub fn unlink(&self, path: &str) -> FsResult<()> {
        let (p, name) = self.parent_of(path)?;
        self.unlink_in(p, &name)
    }

    /// Renames `from` to `to`.
    pub fn rename(&self, from: &str, to: &str) -> FsResult<()> {
        let (sp, sn) = self.parent_of(from)?;
        let (dp, dn) = self.parent_of(to)?;
        self.rename_in(sp, &sn, dp, &dn)
    }

    /// The entries of a directory.
    pub fn readdir(&self, path: &str) -> FsResult<Vec<DirEntry>> {
        self.readdir_handle(self.resolve(path)?)
    }

    /// Truncates (or extends) a file to `size` bytes.
    pub fn truncate(&self, path: &str, size: u64) -> FsResult<()> {
        self.setattr(self.resolve(path)?, SetAttr { size: Some(size), ..Default::default() }).map(|_| ())
    }

    /// A file's layout or a directory's default layout.
    pub fn getstripe(&self, path: &str) -> FsResult<(Option<Layout>, Option<LayoutSpec>)> {
        self.getstripe_handle(self.resolve(path)?)
    }

    /// Sets a directory's default layout.
    pub fn setstripe(&self, path: &str, spec: Option<LayoutSpec>) -> FsResult<()> {
        self.setstripe_handle(self.resolve(path)?, spec)
    }

    // ---------------------------------------------------------------------------------------
    // io server calls
    // ---------------------------------------------------------------------------------------

    /// Sends a small request (no payload) to each listed absolute server at once.
    fn io_small(&self, reqs: Vec<(usize, IoRequest)>) -> Vec<FsResult<IoReply>> {
        let posted = self.io_post(reqs);
        self.io_wait(posted)
    }

    /// Sends [`Client::io_small`]'s requests; [`Client::io_wait`] takes their replies.
    fn io_post(&self, reqs: Vec<(usize, IoRequest)>) -> IoPosted {
        reqs.into_iter()
            .map(|(server, req)| {
                let id = self.id();
                let traced = self.io_span(server, id, &req);
                let r = self.admit(Target::Io(server)).and_then(|sent| {
                    let peer =
                        *self.inner.io.get(server).ok_or_else(|| FsError::Invalid("server index".into()))?;
                    let bytes = proto::encode(&Envelope::new(id, req))?;
                    Ok((self.post(peer, TAG_IO, bytes, Payload::None, ServiceLevel::Control, 0)?, id, sent))
                });
                (server, traced, r)
            })
            .collect()
    }

    /// The replies to requests [`Client::io_post`] sent, in their order.
    fn io_wait(&self, posted: IoPosted) -> Vec<FsResult<IoReply>> {
        posted
            .into_iter()
            .map(|(server, traced, p)| {
                let r = p
                    .and_then(|(op, id, sent)| {
                        let r = (|| {
                            let c = self.inner.ep.wait(op)?;
                            Self::reply::<IoReply>(&c, id)
                        })();
                        self.finish(Target::Io(server), sent, r.as_ref().err());
                        r
                    })
                    .map_err(self.at_io(server));
                traced.done(Outcome(&r));
                r
            })
            .collect()
    }

    /// Pings every io server; the round-trip time of each.
    pub fn ping_all(&self) -> Vec<FsResult<Duration>> {
        let t = Instant::now();
        let reqs = (0..self.inner.io.len()).map(|s| (s, IoRequest::Ping)).collect();
        self.io_small(reqs).into_iter().map(|r| r.map(|_| t.elapsed())).collect()
    }

    /// Counters of every io server.
    pub fn server_stats(&self) -> Vec<FsResult<proto::ServerStats>> {
        let reqs = (0..self.inner.io.len()).map(|s| (s, IoRequest::Stats)).collect();
        self.io_small(reqs)
            .into_iter()
            .map(|r| match r? {
                IoReply::Stats(s) => Ok(s),
                r => Err(FsError::UnexpectedReply(format!("{r:?}"))),
            })
            .collect()
    }

    /// Every server's version, uptime, load and space: the io servers' requests are posted
    /// together, then the meta server is asked. A server that is down, or answers without a
    /// status (another protocol version), is reported as such; this never fails.
    pub fn status(&self) -> ClusterStatus {
        let reqs = (0..self.inner.io.len()).map(|s| (s, IoRequest::Status)).collect();
        let io = self
            .io_small(reqs)
            .into_iter()
            .map(|r| {
                ServerState::of(r.and_then(|r| match r {
                    IoReply::Status(s) => Ok(s),
                    r => Err(FsError::UnexpectedReply(format!("{r:?}"))),
                }))
            })
            .collect();
        let meta = ServerState::of(self.meta_call(MetaRequest::Status).and_then(|r| match r {
            MetaReply::Status(s) => Ok(s),
            r => Self::unexpected(r),
        }));
        ClusterStatus { meta, io }
    }

    /// The cluster's space: the sum over io servers of the file systems holding their objects
    /// (as `statfs` on a PVFS or Lustre mount adds up its servers), one that several servers
    /// share (as a local cluster's do) counted once. A server that does not answer is left
    /// out of the sum, as Lustre leaves out targets it cannot reach (the file system looks
    /// smaller while it is down), and listed in [`ClusterSpace::missing`]; fails only when no
    /// server answers.
    pub fn disk_space(&self) -> FsResult<ClusterSpace> {
        let (mut answered, mut missing) = (Vec::new(), Vec::new());
        for s in self.server_stats() {
            match s {
                Ok(s) => answered.push(s.disk),
                Err(e) => missing.push(e),
            }
        }
        if answered.is_empty() && !missing.is_empty() {
            return Err(missing.swap_remove(0));
        }
        Ok(ClusterSpace { space: proto::DiskSpace::sum(answered), missing })
    }
}

/// Reply types that carry an error variant.
trait ErrorOf {
    fn error(&self) -> Option<&proto::ErrorReply>;
}

impl ErrorOf for MetaReply {
    fn error(&self) -> Option<&proto::ErrorReply> {
        match self {
            MetaReply::Error(e) => Some(e),
            _ => None,
        }
    }
}

impl ErrorOf for IoReply {
    fn error(&self) -> Option<&proto::ErrorReply> {
        match self {
            IoReply::Error(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ionet::Scheme;

    #[test]
    fn over_tcp_reads_are_capped_at_the_read_limit_and_writes_only_by_the_transport() {
        let l = ClientOptions::default().request_limits(Scheme::Tcp, 64 << 20);
        assert_eq!(l, RequestLimits { max: 64 << 20, read: DEFAULT_READ_REQUEST_BYTES });
        let o = ClientOptions { read_request_bytes: Some(256 << 10), ..Default::default() };
        assert_eq!(o.request_limits(Scheme::Tcp, 64 << 20).read, 256 << 10);
    }

    #[test]
    fn over_rdma_a_read_is_one_request_unless_told_otherwise() {
        for s in [Scheme::SoftIb, Scheme::Ib] {
            let l = ClientOptions::default().request_limits(s, 64 << 20);
            assert_eq!(l, RequestLimits { max: 64 << 20, read: 64 << 20 }, "{s}");
            let o = ClientOptions { read_request_bytes: Some(256 << 10), ..Default::default() };
            assert_eq!(o.request_limits(s, 64 << 20).read, 256 << 10, "{s}");
        }
    }

    #[test]
    fn adaptive_waits_poll_longer_over_rdma_than_over_tcp_unless_told() {
        let o = ClientOptions::default();
        assert_eq!(o.spin_budget_for(Scheme::Tcp), ionet::Config::default().get_spin_budget());
        for s in [Scheme::SoftIb, Scheme::Ib] {
            assert_eq!(o.spin_budget_for(s), DEFAULT_RDMA_SPIN_BUDGET, "{s}");
        }
        assert!(DEFAULT_RDMA_SPIN_BUDGET > ionet::Config::default().get_spin_budget());
        let o = ClientOptions { spin_budget: Some(Duration::from_micros(300)), ..Default::default() };
        for s in [Scheme::Tcp, Scheme::SoftIb, Scheme::Ib] {
            assert_eq!(o.spin_budget_for(s), Duration::from_micros(300), "{s}");
        }
    }

    #[test]
    fn the_read_limit_never_exceeds_the_request_limit() {
        let o = ClientOptions { max_request_bytes: Some(300_000), ..Default::default() };
        assert_eq!(o.request_limits(Scheme::Tcp, 64 << 20), RequestLimits { max: 300_000, read: 300_000 });
        // A transport with small messages caps both.
        let o = ClientOptions { read_request_bytes: Some(8 << 20), ..Default::default() };
        assert_eq!(
            o.request_limits(Scheme::Tcp, 512 << 10),
            RequestLimits { max: 512 << 10, read: 512 << 10 }
        );
        assert_eq!(ClientOptions::default().request_limits(Scheme::Tcp, u64::MAX).max, proto::MAX_IO_BYTES);
    }
}

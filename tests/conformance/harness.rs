//! The Endpoint API as the behaviour suite sees it: one suite, whichever process the endpoint
//! lives in.
//!
//! An [`Ep`] is an endpoint in this process ([`Local`], a thin adapter over
//! [`ionet::Endpoint`]) or in an agent process ([`super::agent`]), behind the object-safe
//! [`Api`] trait. The suite's types mirror ionet's — [`OpId`], [`PeerId`], [`Completion`],
//! [`Request`], [`Exposure`], [`Error`], [`Config`] — as plain data, because an endpoint in
//! another process can only answer with data; both implementations convert through the same
//! functions, so assertions see one representation whatever the placement.
//!
//! [`Net`] says where endpoints live: all here, servers (bound endpoints) in an agent, or
//! clients in an agent. Each test gets its own `Net` and, when needed, its own agent process,
//! killed when the test ends.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::{
    AccessError, Address, Direction, Info, Mechanism, MemHandle, OpBuf, OpKind, RecvBuf, RegisteredBuf,
    SendBuf, ServiceLevel, Tag, ToAddress, WaitMode,
};
use serde::{Deserialize, Serialize};

use super::agent::Agent;

// ---------------------------------------------------------------------------------------------
// Plain-data mirrors of ionet's types

/// An operation (ionet's ids cannot be made outside the crate, so the suite has its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId(pub u64);

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "op#{}", self.0)
    }
}

/// A peer of one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PeerId(pub u64);

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "peer#{}", self.0)
    }
}

impl From<ionet::OpId> for OpId {
    fn from(o: ionet::OpId) -> Self {
        OpId(o.as_u64())
    }
}

impl From<ionet::PeerId> for PeerId {
    fn from(p: ionet::PeerId) -> Self {
        PeerId(p.as_u64())
    }
}

/// ionet's [`ionet::Error`] as data (nested errors become their messages).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Error {
    #[error("API misuse: {0}")]
    Misuse(String),
    #[error("{len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    #[error("message of {len} bytes does not fit the {capacity}-byte receive buffer")]
    Truncated { len: u64, capacity: u64 },
    #[error("address: {0}")]
    Addr(String),
    #[error("peer {peer:?} violated the protocol: {reason}")]
    Protocol { peer: Option<PeerId>, reason: String },
    #[error("operation timed out")]
    Timeout,
    #[error("operation cancelled")]
    Cancelled,
    #[error("the peer cancelled the transfer")]
    PeerCancelled,
    #[error("peer {peer:?} lost: {reason}")]
    PeerLost { peer: PeerId, reason: String },
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("remote access denied: {0}")]
    RemoteAccess(#[serde(with = "access_code")] AccessError),
    #[error("peer reported failure: {0}")]
    Remote(String),
    #[error("resource limit reached: {0}")]
    Exhausted(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("endpoint closed")]
    Closed,
    #[error("I/O error: {0}")]
    Io(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ionet::Error> for Error {
    fn from(e: ionet::Error) -> Self {
        use ionet::Error as E;
        match e {
            E::Misuse(m) => Error::Misuse(m),
            E::TooLarge { len, max } => Error::TooLarge { len, max },
            E::Truncated { len, capacity } => Error::Truncated { len, capacity },
            E::Addr(a) => Error::Addr(a.to_string()),
            E::Protocol { peer, reason } => {
                Error::Protocol { peer: peer.map(PeerId::from), reason: reason.to_string() }
            }
            E::Timeout => Error::Timeout,
            E::Cancelled => Error::Cancelled,
            E::PeerCancelled => Error::PeerCancelled,
            E::PeerLost { peer, reason } => Error::PeerLost { peer: peer.into(), reason },
            E::Auth(m) => Error::Auth(m),
            E::RemoteAccess(a) => Error::RemoteAccess(a),
            E::Remote(m) => Error::Remote(m),
            E::Exhausted(m) => Error::Exhausted(m),
            E::Unsupported(m) => Error::Unsupported(m),
            E::Closed => Error::Closed,
            E::Io(e) => Error::Io(e.to_string()),
            other => Error::Other(other.to_string()),
        }
    }
}

mod access_code {
    use ionet::AccessError;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(a: &AccessError, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(a.code())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<AccessError, D::Error> {
        let c = u8::deserialize(d)?;
        AccessError::from_code(c).ok_or_else(|| serde::de::Error::custom("access error code"))
    }
}

/// A send buffer: bytes, a gather list, or bytes placed in the endpoint's registered pool
/// (`ep.alloc` + copy, so the engine sees a [`RegisteredBuf`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SBuf {
    Bytes(Bytes),
    List(Vec<Bytes>),
    Pool(Bytes),
}

impl SBuf {
    /// `data` in a registered pool buffer of the sending endpoint.
    pub fn pool(data: impl Into<Bytes>) -> SBuf {
        SBuf::Pool(data.into())
    }

    pub fn len(&self) -> usize {
        match self {
            SBuf::Bytes(b) | SBuf::Pool(b) => b.len(),
            SBuf::List(l) => l.iter().map(Bytes::len).sum(),
        }
    }
}

impl From<Bytes> for SBuf {
    fn from(b: Bytes) -> Self {
        SBuf::Bytes(b)
    }
}
impl From<Vec<u8>> for SBuf {
    fn from(v: Vec<u8>) -> Self {
        SBuf::Bytes(v.into())
    }
}
impl From<&'static [u8]> for SBuf {
    fn from(v: &'static [u8]) -> Self {
        SBuf::Bytes(Bytes::from_static(v))
    }
}
impl From<Vec<Bytes>> for SBuf {
    fn from(v: Vec<Bytes>) -> Self {
        SBuf::List(v)
    }
}

/// A receive buffer: a `BytesMut` (its length is the capacity), a scatter list, or a
/// registered pool buffer of the receiving endpoint (`Pool(contents)`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RBuf {
    Mut(BytesMut),
    List(Vec<BytesMut>),
    Pool(BytesMut),
}

impl RBuf {
    /// A zeroed registered pool buffer of `len` bytes of the receiving endpoint.
    pub fn pool(len: usize) -> RBuf {
        RBuf::Pool(BytesMut::zeroed(len))
    }
}

impl From<BytesMut> for RBuf {
    fn from(b: BytesMut) -> Self {
        RBuf::Mut(b)
    }
}
impl From<Vec<BytesMut>> for RBuf {
    fn from(v: Vec<BytesMut>) -> Self {
        RBuf::List(v)
    }
}

/// A request's payload.
#[derive(Debug, Serialize, Deserialize)]
pub enum Payload {
    None,
    Out(SBuf),
    In(RBuf),
}

/// An operation's outcome, with its buffer handed back (ionet's [`ionet::Completion`]).
#[derive(Debug)]
pub struct Completion {
    pub op: OpId,
    pub kind: OpKind,
    pub peer: PeerId,
    pub tag: Tag,
    pub result: Result<usize>,
    pub buf: OpBuf,
    pub reply: Option<Bytes>,
    pub mechanism: Option<Mechanism>,
}

impl Completion {
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    pub fn len(&self) -> usize {
        *self.result.as_ref().unwrap_or(&0)
    }

    /// The received bytes (`len()` of them).
    pub fn data(&self) -> Option<Bytes> {
        match &self.buf {
            OpBuf::Recv(r) => Some(r.to_bytes(self.len())),
            _ => None,
        }
    }

    pub(crate) fn from_ionet(c: ionet::Completion) -> Self {
        Completion {
            op: c.op.into(),
            kind: c.kind,
            peer: c.peer.into(),
            tag: c.tag,
            result: c.result.map_err(Error::from),
            buf: c.buf,
            reply: c.reply,
            mechanism: c.mechanism,
        }
    }
}

/// An unexpected message.
#[derive(Debug, Clone)]
pub struct Unexpected {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub data: Bytes,
}

/// What a server learns of a request.
#[derive(Debug, Clone)]
pub struct ReqMeta {
    pub peer: PeerId,
    pub tag: Tag,
    pub sl: ServiceLevel,
    pub header: Bytes,
    pub dir: Direction,
    pub len: u64,
}

// ---------------------------------------------------------------------------------------------
// Configuration

/// The policy part of a [`Config`]: thresholds per service level and a forced mechanism.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// (inline_max, fast_max) per service level index; `None` keeps the transport's.
    pub thresholds: [Option<(usize, usize)>; 3],
    pub forced: Option<u8>,
}

/// The [`ionet::FaultPlan`] of every queue pair (softib only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpec {
    pub rnr_attempts: u32,
    pub remote_access_errors: u32,
    pub qp_error_after: Option<u64>,
    pub read_delay_ms: Option<u64>,
    pub reorder_read_completions: bool,
    pub vanish_after: Option<u64>,
}

/// [`ionet::Config`] as data, with the setters the suite uses.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Config {
    wait_mode: Option<u8>,
    progress_thread: bool,
    batch_sends: bool,
    max_message: Option<usize>,
    max_header: Option<usize>,
    early_bytes_per_peer: Option<usize>,
    unexpected_per_peer: Option<usize>,
    cluster_key: Option<Vec<u8>>,
    policy: Option<PolicySpec>,
    recv_buffers: Option<u16>,
    ring_slots: Option<u16>,
    transfer_unit: Option<usize>,
    rdma_caps: Option<(usize, usize)>,
    zone_bytes_per_class: Option<usize>,
    cancel_grace_ms: Option<u64>,
    faults: Option<FaultSpec>,
    stream_requests: Option<bool>,
    cache_foreign: Option<bool>,
}

fn wait_mode_code(m: WaitMode) -> u8 {
    match m {
        WaitMode::Spin => 0,
        WaitMode::Block => 1,
        WaitMode::Adaptive => 2,
    }
}

pub(crate) fn wait_mode_from(c: u8) -> WaitMode {
    match c {
        0 => WaitMode::Spin,
        1 => WaitMode::Block,
        _ => WaitMode::Adaptive,
    }
}

pub(crate) fn mech_code(m: Mechanism) -> u8 {
    m.index() as u8
}

pub(crate) fn mech_from(c: u8) -> Mechanism {
    Mechanism::ALL[usize::from(c).min(2)]
}

impl Config {
    pub fn wait_mode(mut self, m: WaitMode) -> Self {
        self.wait_mode = Some(wait_mode_code(m));
        self
    }
    pub fn progress_thread(mut self, on: bool) -> Self {
        self.progress_thread = on;
        self
    }
    pub fn batch_sends(mut self, on: bool) -> Self {
        self.batch_sends = on;
        self
    }
    pub fn max_message(mut self, n: usize) -> Self {
        self.max_message = Some(n);
        self
    }
    pub fn max_header(mut self, n: usize) -> Self {
        self.max_header = Some(n);
        self
    }
    pub fn early_bytes_per_peer(mut self, n: usize) -> Self {
        self.early_bytes_per_peer = Some(n);
        self
    }
    pub fn unexpected_per_peer(mut self, n: usize) -> Self {
        self.unexpected_per_peer = Some(n);
        self
    }
    pub fn cluster_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.cluster_key = Some(key.into());
        self
    }
    /// Forces one mechanism for every transfer (where it can carry it).
    pub fn force(mut self, m: Option<Mechanism>) -> Self {
        self.policy.get_or_insert_with(Default::default).forced = m.map(mech_code);
        self
    }
    /// Thresholds of one service level.
    pub fn thresholds(mut self, sl: ServiceLevel, inline_max: usize, fast_max: usize) -> Self {
        self.policy.get_or_insert_with(Default::default).thresholds[sl.index()] =
            Some((inline_max, fast_max));
        self
    }
    pub fn recv_buffers(mut self, n: u16) -> Self {
        self.recv_buffers = Some(n);
        self
    }
    pub fn ring_slots(mut self, n: u16) -> Self {
        self.ring_slots = Some(n);
        self
    }
    pub fn transfer_unit(mut self, n: usize) -> Self {
        self.transfer_unit = Some(n);
        self
    }
    pub fn rdma_caps(mut self, per_peer: usize, per_endpoint: usize) -> Self {
        self.rdma_caps = Some((per_peer, per_endpoint));
        self
    }
    pub fn zone_bytes_per_class(mut self, n: usize) -> Self {
        self.zone_bytes_per_class = Some(n);
        self
    }
    pub fn cancel_grace(mut self, d: Duration) -> Self {
        self.cancel_grace_ms = Some(d.as_millis() as u64);
        self
    }
    pub fn faults(mut self, f: FaultSpec) -> Self {
        self.faults = Some(f);
        self
    }
    /// TCP: OUT payloads stream behind their requests (on) or wait for the server's pulls.
    pub fn stream_requests(mut self, on: bool) -> Self {
        self.stream_requests = Some(on);
        self
    }
    /// IB: keep registrations of lent memory (`IbConfig::cache_foreign`).
    pub fn cache_foreign(mut self, on: bool) -> Self {
        self.cache_foreign = Some(on);
        self
    }

    /// The ionet configuration this describes, for `scheme`.
    pub fn to_ionet(&self, scheme: ionet::Scheme) -> ionet::Config {
        let mut c =
            ionet::Config::default().progress_thread(self.progress_thread).batch_sends(self.batch_sends);
        if let Some(m) = self.wait_mode {
            c = c.wait_mode(wait_mode_from(m));
        }
        if let Some(n) = self.max_message {
            c = c.max_message(n);
        }
        if let Some(n) = self.max_header {
            c = c.max_header(n);
        }
        if let Some(n) = self.early_bytes_per_peer {
            c = c.early_bytes_per_peer(n);
        }
        if let Some(n) = self.unexpected_per_peer {
            c = c.unexpected_per_peer(n);
        }
        if let Some(k) = &self.cluster_key {
            c = c.cluster_key(k.clone());
        }
        if let Some(on) = self.stream_requests {
            c = c.stream_requests(on);
        }
        if let Some(p) = &self.policy {
            let mut pol = ionet::Policy::for_scheme(scheme);
            for sl in ServiceLevel::ALL {
                if let Some((inline_max, fast_max)) = p.thresholds[sl.index()] {
                    pol.set(sl, ionet::Thresholds { inline_max, fast_max });
                }
            }
            pol.force(p.forced.map(mech_from));
            c = c.policy(pol);
        }
        let mut ib = ionet::IbConfig::default();
        if let Some(on) = self.cache_foreign {
            ib = ib.cache_foreign(on);
        }
        if let Some(n) = self.recv_buffers {
            ib = ib.recv_buffers(n);
        }
        if let Some(n) = self.ring_slots {
            ib = ib.ring_slots(n);
        }
        if let Some(n) = self.transfer_unit {
            ib = ib.transfer_unit(n);
        }
        if let Some((p, e)) = self.rdma_caps {
            ib = ib.rdma_caps(p, e);
        }
        if let Some(n) = self.zone_bytes_per_class {
            ib = ib.zone_bytes_per_class(n);
        }
        if let Some(ms) = self.cancel_grace_ms {
            ib = ib.cancel_grace(Duration::from_millis(ms));
        }
        if let Some(f) = &self.faults {
            ib = ib.soft_faults(ionet::internals::ib::soft::FaultPlan {
                rnr_attempts: f.rnr_attempts,
                remote_access_errors: f.remote_access_errors,
                qp_error_after: f.qp_error_after,
                read_delay: f.read_delay_ms.map(Duration::from_millis),
                reorder_read_completions: f.reorder_read_completions,
                vanish_after: f.vanish_after,
            });
        }
        c.ib(ib)
    }
}

// ---------------------------------------------------------------------------------------------
// The object-safe endpoint interface

/// A posted command.
#[derive(Debug, Serialize, Deserialize)]
pub enum Post {
    Send { peer: PeerId, tag: Tag, sl: u8, buf: SBuf, unexpected: bool },
    Recv { peer: PeerId, tag: Tag, buf: RBuf },
    Put { peer: PeerId, sl: u8, buf: SBuf, remote: Vec<u8> },
    Get { peer: PeerId, sl: u8, buf: RBuf, remote: Vec<u8> },
    Request { peer: PeerId, tag: Tag, sl: u8, header: Bytes, payload: Payload },
}

/// What an endpoint does, wherever it lives.
pub trait Api: Send + Sync {
    fn connect(&self, addr: &Address) -> Result<PeerId>;
    fn local_addr(&self) -> Option<Address>;
    fn post(&self, p: Post) -> Result<OpId>;
    /// Deadline `after` from now.
    fn set_deadline(&self, op: OpId, after: Duration) -> Result<()>;
    fn cancel(&self, op: OpId) -> Result<()>;
    fn test(&self, op: OpId) -> Result<Option<Completion>>;
    /// Waits for `op` (`None`: without bound).
    fn wait(&self, op: OpId, timeout: Option<Duration>) -> Result<Option<Completion>>;
    fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>>;
    fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>>;
    fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>>;
    /// A pool buffer holding `data`, exposed with `access`.
    fn expose(&self, data: Bytes, access: ionet::Access) -> Result<Exposure>;
    fn info(&self) -> Info;
    /// True for an endpoint in an agent process.
    fn remote(&self) -> bool;
}

/// A request's server-side operations.
pub trait ReqApi: Send {
    fn pull(&self, buf: RBuf, offset: u64) -> Result<OpId>;
    fn push(&self, buf: SBuf, offset: u64) -> Result<OpId>;
    fn is_cancelled(&self) -> Result<bool>;
    fn reply(self: Box<Self>, header: Bytes, error: bool) -> Result<OpId>;
}

/// An exposure's owner-side operations.
pub trait XpoApi: Send + Sync {
    /// Runs `f` on the exposed bytes.
    fn with(&self, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// Revokes; returns the buffer's length.
    fn revoke(self: Box<Self>) -> Result<usize>;
}

/// An incoming request (server side). Dropping it unanswered makes the endpoint answer
/// "dropped", as ionet's does.
pub struct Request {
    meta: ReqMeta,
    inner: Box<dyn ReqApi>,
}

impl Request {
    pub(crate) fn new(meta: ReqMeta, inner: Box<dyn ReqApi>) -> Self {
        Request { meta, inner }
    }
    pub fn peer(&self) -> PeerId {
        self.meta.peer
    }
    pub fn tag(&self) -> Tag {
        self.meta.tag
    }
    pub fn sl(&self) -> ServiceLevel {
        self.meta.sl
    }
    pub fn header(&self) -> &Bytes {
        &self.meta.header
    }
    pub fn direction(&self) -> Direction {
        self.meta.dir
    }
    pub fn payload_len(&self) -> u64 {
        self.meta.len
    }
    pub fn pull_into(&self, buf: impl Into<RBuf>, offset: u64) -> Result<OpId> {
        self.inner.pull(buf.into(), offset)
    }
    pub fn push_from(&self, buf: impl Into<SBuf>, offset: u64) -> Result<OpId> {
        self.inner.push(buf.into(), offset)
    }
    pub fn is_cancelled(&self) -> bool {
        self.inner.is_cancelled().expect("is_cancelled")
    }
    pub fn reply(self, header: impl Into<Bytes>) -> Result<OpId> {
        self.inner.reply(header.into(), false)
    }
    pub fn reply_error(self, reason: &str) -> Result<OpId> {
        self.inner.reply(Bytes::copy_from_slice(reason.as_bytes()), true)
    }
}

/// Exposed memory (revoked when dropped).
pub struct Exposure {
    handle: MemHandle,
    inner: Box<dyn XpoApi>,
}

impl Exposure {
    pub(crate) fn new(handle: MemHandle, inner: Box<dyn XpoApi>) -> Self {
        Exposure { handle, inner }
    }
    pub fn handle(&self) -> MemHandle {
        self.handle
    }
}

/// An endpoint of the suite. Cheap to clone (shared), like ionet's.
#[derive(Clone)]
pub struct Ep(pub(crate) Arc<dyn Api>);

fn sl_code(sl: ServiceLevel) -> u8 {
    sl.index() as u8
}

pub(crate) fn sl_from(c: u8) -> ServiceLevel {
    ServiceLevel::ALL[usize::from(c).min(ServiceLevel::COUNT - 1)]
}

impl Ep {
    pub fn connect(&self, addr: impl ToAddress) -> Result<PeerId> {
        self.0.connect(&addr.to_address()?)
    }
    pub fn local_addr(&self) -> Option<Address> {
        self.0.local_addr()
    }
    pub fn send(&self, peer: PeerId, tag: Tag, buf: impl Into<SBuf>, sl: ServiceLevel) -> Result<OpId> {
        self.0.post(Post::Send { peer, tag, sl: sl_code(sl), buf: buf.into(), unexpected: false })
    }
    pub fn send_unexpected(
        &self,
        peer: PeerId,
        tag: Tag,
        buf: impl Into<SBuf>,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.0.post(Post::Send { peer, tag, sl: sl_code(sl), buf: buf.into(), unexpected: true })
    }
    pub fn recv(&self, peer: PeerId, tag: Tag, buf: impl Into<RBuf>) -> Result<OpId> {
        self.0.post(Post::Recv { peer, tag, buf: buf.into() })
    }
    pub fn put(
        &self,
        peer: PeerId,
        local: impl Into<SBuf>,
        remote: MemHandle,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.0.post(Post::Put {
            peer,
            sl: sl_code(sl),
            buf: local.into(),
            remote: remote.to_bytes().to_vec(),
        })
    }
    pub fn get(
        &self,
        peer: PeerId,
        local: impl Into<RBuf>,
        remote: MemHandle,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.0.post(Post::Get {
            peer,
            sl: sl_code(sl),
            buf: local.into(),
            remote: remote.to_bytes().to_vec(),
        })
    }
    pub fn request(
        &self,
        peer: PeerId,
        tag: Tag,
        header: impl Into<Bytes>,
        payload: Payload,
        sl: ServiceLevel,
    ) -> Result<OpId> {
        self.0.post(Post::Request { peer, tag, sl: sl_code(sl), header: header.into(), payload })
    }
    pub fn set_deadline(&self, op: OpId, at: Instant) -> Result<()> {
        self.0.set_deadline(op, at.saturating_duration_since(Instant::now()))
    }
    pub fn cancel(&self, op: OpId) -> Result<()> {
        self.0.cancel(op)
    }
    pub fn test(&self, op: OpId) -> Result<Option<Completion>> {
        self.0.test(op)
    }
    pub fn wait(&self, op: OpId) -> Result<Completion> {
        self.0.wait(op, None)?.ok_or(Error::Closed)
    }
    pub fn wait_timeout(&self, op: OpId, timeout: Duration) -> Result<Option<Completion>> {
        self.0.wait(op, Some(timeout))
    }
    pub fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        self.0.wait_any(timeout)
    }
    pub fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>> {
        self.0.recv_unexpected(timeout)
    }
    pub fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>> {
        self.0.next_request(timeout)
    }
    /// Allocates a pool buffer holding `data` and exposes it (ionet: `alloc`, fill, `expose`).
    pub fn expose(&self, data: impl Into<Bytes>, access: ionet::Access) -> Result<Exposure> {
        self.0.expose(data.into(), access)
    }
    pub fn with_exposed<R>(&self, x: &Exposure, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        x.inner.with(&mut |b| {
            if let Some(f) = f.take() {
                out = Some(f(b));
            }
        })?;
        out.ok_or_else(|| Error::Misuse("exposure not found".into()))
    }
    /// Revokes an exposure; returns its buffer's length.
    pub fn revoke(&self, x: Exposure) -> Result<usize> {
        x.inner.revoke()
    }
    pub fn info(&self) -> Info {
        self.0.info()
    }
    pub fn is_remote(&self) -> bool {
        self.0.remote()
    }
}

// ---------------------------------------------------------------------------------------------
// In this process

/// An endpoint in this process.
pub struct Local(pub ionet::Endpoint);

/// ionet's send buffer for `b`, allocating pool memory from `ep` where asked.
pub(crate) fn to_send_buf(ep: &ionet::Endpoint, b: SBuf) -> Result<SendBuf> {
    Ok(match b {
        SBuf::Bytes(b) => SendBuf::Bytes(b),
        SBuf::List(l) => SendBuf::List(l),
        SBuf::Pool(b) => {
            let mut r = ep.alloc(b.len())?;
            r.copy_from_slice(&b);
            SendBuf::Registered(r)
        }
    })
}

pub(crate) fn to_recv_buf(ep: &ionet::Endpoint, b: RBuf) -> Result<RecvBuf> {
    Ok(match b {
        RBuf::Mut(b) => RecvBuf::Mut(b),
        RBuf::List(l) => RecvBuf::List(l),
        RBuf::Pool(b) => {
            let mut r = ep.alloc(b.len())?;
            r.copy_from_slice(&b);
            RecvBuf::Registered(r)
        }
    })
}

/// A registered-looking buffer holding `data` (pool buffers coming back from an agent).
pub(crate) fn unpooled(data: &[u8]) -> RegisteredBuf {
    let mut r = RegisteredBuf::unpooled(data.len());
    r.copy_from_slice(data);
    r
}

pub(crate) fn local_post(ep: &ionet::Endpoint, p: Post) -> Result<OpId> {
    let peer = ids::ionet_peer;
    let op = match p {
        Post::Send { peer: p, tag, sl, buf, unexpected } => {
            let buf = to_send_buf(ep, buf)?;
            if unexpected {
                ep.send_unexpected(peer(p)?, tag, buf, sl_from(sl))?
            } else {
                ep.send(peer(p)?, tag, buf, sl_from(sl))?
            }
        }
        Post::Recv { peer: p, tag, buf } => ep.recv(peer(p)?, tag, to_recv_buf(ep, buf)?)?,
        Post::Put { peer: p, sl, buf, remote } => {
            let h = MemHandle::from_bytes(&remote).map_err(|e| Error::Misuse(e.to_string()))?;
            ep.put(peer(p)?, to_send_buf(ep, buf)?, h, sl_from(sl))?
        }
        Post::Get { peer: p, sl, buf, remote } => {
            let h = MemHandle::from_bytes(&remote).map_err(|e| Error::Misuse(e.to_string()))?;
            ep.get(peer(p)?, to_recv_buf(ep, buf)?, h, sl_from(sl))?
        }
        Post::Request { peer: p, tag, sl, header, payload } => {
            let payload = match payload {
                Payload::None => ionet::Payload::None,
                Payload::Out(b) => ionet::Payload::Out(to_send_buf(ep, b)?),
                Payload::In(b) => ionet::Payload::In(to_recv_buf(ep, b)?),
            };
            ep.request(peer(p)?, tag, header, payload, sl_from(sl))?
        }
    };
    Ok(ids::op(op))
}

/// ionet's ids cannot be built from numbers, but ids with the same number are equal: each
/// process keeps one of every id its endpoints handed out, to turn numbers back into ids.
pub(crate) mod ids {
    use std::collections::HashMap;
    use std::sync::Mutex;

    static OPS: Mutex<Option<HashMap<u64, ionet::OpId>>> = Mutex::new(None);
    static PEERS: Mutex<Option<HashMap<u64, ionet::PeerId>>> = Mutex::new(None);

    pub fn op(o: ionet::OpId) -> super::OpId {
        OPS.lock().unwrap().get_or_insert_with(HashMap::new).insert(o.as_u64(), o);
        o.into()
    }

    pub fn peer(p: ionet::PeerId) -> super::PeerId {
        PEERS.lock().unwrap().get_or_insert_with(HashMap::new).insert(p.as_u64(), p);
        p.into()
    }

    pub fn ionet_op(o: super::OpId) -> super::Result<ionet::OpId> {
        OPS.lock()
            .unwrap()
            .as_ref()
            .and_then(|m| m.get(&o.0).copied())
            .ok_or_else(|| super::Error::Misuse(format!("{o} is not a pending operation")))
    }

    pub fn ionet_peer(p: super::PeerId) -> super::Result<ionet::PeerId> {
        PEERS
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|m| m.get(&p.0).copied())
            .ok_or_else(|| super::Error::Misuse(format!("unknown {p}")))
    }
}

pub(crate) fn local_unexpected(u: ionet::Unexpected) -> Unexpected {
    Unexpected { peer: ids::peer(u.peer), tag: u.tag, sl: u.sl, data: u.data }
}

pub(crate) fn local_meta(r: &ionet::Request) -> ReqMeta {
    ReqMeta {
        peer: ids::peer(r.peer()),
        tag: r.tag(),
        sl: r.sl(),
        header: r.header().clone(),
        dir: r.direction(),
        len: r.payload_len(),
    }
}

impl Api for Local {
    fn connect(&self, addr: &Address) -> Result<PeerId> {
        let p = self.0.connect(addr)?;
        Ok(ids::peer(p))
    }
    fn local_addr(&self) -> Option<Address> {
        self.0.local_addr()
    }
    fn post(&self, p: Post) -> Result<OpId> {
        local_post(&self.0, p)
    }
    fn set_deadline(&self, op: OpId, after: Duration) -> Result<()> {
        Ok(self.0.set_deadline(ids::ionet_op(op)?, Instant::now() + after)?)
    }
    fn cancel(&self, op: OpId) -> Result<()> {
        Ok(self.0.cancel(ids::ionet_op(op)?)?)
    }
    fn test(&self, op: OpId) -> Result<Option<Completion>> {
        Ok(self.0.test(ids::ionet_op(op)?)?.map(Completion::from_ionet))
    }
    fn wait(&self, op: OpId, timeout: Option<Duration>) -> Result<Option<Completion>> {
        let id = ids::ionet_op(op)?;
        let c = match timeout {
            Some(t) => self.0.wait_timeout(id, t)?,
            None => Some(self.0.wait(id)?),
        };
        Ok(c.map(Completion::from_ionet))
    }
    fn wait_any(&self, timeout: Option<Duration>) -> Result<Option<Completion>> {
        Ok(self.0.wait_any(timeout)?.map(Completion::from_ionet))
    }
    fn recv_unexpected(&self, timeout: Option<Duration>) -> Result<Option<Unexpected>> {
        Ok(self.0.recv_unexpected(timeout)?.map(local_unexpected))
    }
    fn next_request(&self, timeout: Option<Duration>) -> Result<Option<Request>> {
        Ok(self.0.next_request(timeout)?.map(|r| {
            let meta = local_meta(&r);
            Request::new(meta, Box::new(LocalReq(r)))
        }))
    }
    fn expose(&self, data: Bytes, access: ionet::Access) -> Result<Exposure> {
        let mut b = self.0.alloc(data.len())?;
        b.copy_from_slice(&data);
        let x = self.0.expose(b, access)?;
        Ok(Exposure::new(x.handle(), Box::new(LocalXpo { ep: self.0.clone(), x: Some(x) })))
    }
    fn info(&self) -> Info {
        self.0.info()
    }
    fn remote(&self) -> bool {
        false
    }
}

struct LocalReq(ionet::Request);

impl ReqApi for LocalReq {
    fn pull(&self, buf: RBuf, offset: u64) -> Result<OpId> {
        let ep = self.0.endpoint();
        Ok(ids::op(self.0.pull_into(to_recv_buf(ep, buf)?, offset)?))
    }
    fn push(&self, buf: SBuf, offset: u64) -> Result<OpId> {
        let ep = self.0.endpoint();
        Ok(ids::op(self.0.push_from(to_send_buf(ep, buf)?, offset)?))
    }
    fn is_cancelled(&self) -> Result<bool> {
        Ok(self.0.is_cancelled())
    }
    fn reply(self: Box<Self>, header: Bytes, error: bool) -> Result<OpId> {
        let op = if error {
            self.0.reply_error(&String::from_utf8_lossy(&header))?
        } else {
            self.0.reply(header)?
        };
        Ok(ids::op(op))
    }
}

struct LocalXpo {
    ep: ionet::Endpoint,
    x: Option<ionet::Exposure>,
}

impl XpoApi for LocalXpo {
    fn with(&self, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let x = self.x.as_ref().ok_or(Error::Closed)?;
        Ok(self.ep.with_exposed(x, |b| f(b))?)
    }
    fn revoke(mut self: Box<Self>) -> Result<usize> {
        let x = self.x.take().ok_or(Error::Closed)?;
        Ok(self.ep.revoke(x)?.len())
    }
}

// ---------------------------------------------------------------------------------------------
// Placement

/// Where a test's endpoints live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// All in the test process.
    Local,
    /// Bound endpoints (servers) in an agent process, clients here.
    RemoteServers,
    /// Client endpoints in an agent process, servers here.
    RemoteClients,
}

struct NetInner {
    scheme: &'static str,
    place: Place,
    agent: Mutex<Option<Arc<Agent>>>,
}

/// A transport and a placement: how a test makes its endpoints.
#[derive(Clone)]
pub struct Net(Arc<NetInner>);

impl Net {
    pub fn new(scheme: &'static str, place: Place) -> Net {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        Net(Arc::new(NetInner { scheme, place, agent: Mutex::new(None) }))
    }

    pub fn scheme(&self) -> &'static str {
        self.0.scheme
    }

    pub fn place(&self) -> Place {
        self.0.place
    }

    /// True when the transport is InfiniBand (software or hardware).
    pub fn is_ib(&self) -> bool {
        self.0.scheme != "tcp"
    }

    /// The test's agent process, started on first use.
    pub fn agent(&self) -> Arc<Agent> {
        let mut a = self.0.agent.lock().unwrap();
        a.get_or_insert_with(|| Arc::new(Agent::spawn())).clone()
    }

    fn ionet_scheme(&self) -> ionet::Scheme {
        self.address(0).scheme()
    }

    fn address(&self, port: u16) -> Address {
        format!("{}://127.0.0.1:{port}", self.0.scheme).parse().expect("address")
    }

    /// A server endpoint on a free port.
    pub fn bind(&self, cfg: Config) -> Ep {
        self.bind_at(0, cfg).expect("bind")
    }

    /// A server endpoint on `port`.
    pub fn bind_at(&self, port: u16, cfg: Config) -> Result<Ep> {
        let addr = self.address(port);
        if self.0.place == Place::RemoteServers {
            return Agent::bind(&self.agent(), &addr, cfg);
        }
        let ep = ionet::Endpoint::bind(addr, cfg.to_ionet(self.ionet_scheme()))?;
        Ok(Ep(Arc::new(Local(ep))))
    }

    /// A client endpoint.
    pub fn client(&self, cfg: Config) -> Ep {
        if self.0.place == Place::RemoteClients {
            return Agent::client(&self.agent(), self.0.scheme, cfg).expect("client");
        }
        Ep(Arc::new(Local(ionet::Endpoint::client(cfg.to_ionet(self.ionet_scheme())).expect("client"))))
    }

    /// A client endpoint in this process whatever the placement.
    pub fn local_client(&self, cfg: Config) -> Ep {
        Ep(Arc::new(Local(ionet::Endpoint::client(cfg.to_ionet(self.ionet_scheme())).expect("client"))))
    }

    /// A server endpoint in this process whatever the placement.
    pub fn local_bind(&self, cfg: Config) -> Ep {
        let ep = ionet::Endpoint::bind(self.address(0), cfg.to_ionet(self.ionet_scheme())).expect("bind");
        Ep(Arc::new(Local(ep)))
    }
}

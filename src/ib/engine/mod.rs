//! The InfiniBand engine: the `Endpoint` contract over any [`Verbs`] provider.
//!
//! # Connections
//!
//! One RC queue pair per (peer, service-level class), opened lazily; its service level is the
//! class's IB SL. A TCP side channel ([`side`]) carries the authenticated handshake and the
//! queue-pair exchange, then stays open so a dead peer is noticed promptly.
//! The device, port and source GID come from the selection [`route`] checks when the endpoint
//! opens; a queue pair on a RoCE port routes with a GRH to the GID its peer sent, marked with
//! the class's DSCP, at the smaller of the two ports' MTUs.
//!
//! # Memory per connection
//!
//! One registered [`DmaRegion`] holds `N + S` receive buffers (N for SENDs — the credits the
//! peer gets — and S consumed by ring writes), bounce buffers for sends, and the fast-RDMA ring
//! of S slots the peer writes into. Flow control is [`crate::flowctl`]: credits piggyback on
//! every message prefix, an explicit CREDIT goes out at the watermark on the reserved credit,
//! ring slots are returned the same way. No send is ever posted without a credit or a free
//! slot, so the peer never sees an RNR.
//!
//! # Mechanisms ([`crate::comm`])
//!
//! - **inline**: the message is copied into a bounce buffer and SENT (device-inline when tiny);
//! - **fast RDMA**: RDMA_WRITE_WITH_IMM of header + data into the peer's ring slot, straight
//!   from a registered pool buffer (header and data as two SGEs) or from a bounce copy;
//! - **server-based RDMA**: the data owner registers its buffer through the pin-down cache and
//!   sends a segment list; the server moves the bytes with RDMA_READ (client writes,
//!   rendezvous receives) or RDMA_WRITE (client reads) in transfer units scheduled by
//!   [`crate::comm::BulkScheduler`], straight into or out of registered buffers, or through
//!   zone buffers ([`crate::flowctl::BufferZones`]) otherwise. Only the last work request of a
//!   unit is signaled; a SEND that follows an outstanding RDMA_READ carries FENCE; a reply waits
//!   until every unit of its request is done.
//!
//! A mechanism forced by the policy ([`crate::comm::Policy::force`]) applies where it can carry
//! the message — inline needs a receive buffer, fast RDMA a ring slot — and the next one up
//! moves what does not fit; an empty payload always goes inline. Completions report the
//! mechanism used, and `host_copies` / `host_copy_bytes` count every CPU copy of payload
//! bytes the engine makes, at the copy site.
//!
//! Send-queue slots are reclaimed by count: every signaled completion retires all earlier work
//! requests of its queue pair.
//!
//! # Protocol and device
//!
//! The rules of a connection's message path — credits, ring slots, bounce buffers, send-queue
//! room, retirement in posting order, the flow-control prefix of every message — live in
//! [`link::Link`], which knows no queue pair: it returns the work request to post and takes
//! completions and arrivals as events. [`transmit`] and [`recv`] carry them out on the queue
//! pair and its memory. The decisions of posting and cancelling are made the same way, apart
//! from the device: [`plan`] picks a send's, request's, push's or reply's mechanism, message
//! and registration from the connection's [`MsgCaps`] and the policy; [`cancel`] says what
//! cancelling an op does in its state; [`rx`] matches arrivals; [`request_in`] admits and
//! lays out an arrived request; [`reply`] matches a reply to its request and completes it;
//! [`lose`] picks what a lost peer takes down and settles its transfers; [`sreq`] holds a
//! reply back behind its request's transfers; [`units`] cuts server-based RDMA transfers into
//! units and settles them; [`exchange`] says what a side-channel frame asks for in the
//! channel's phase. `post`, `recv` and `xfer` carry their answers out with verbs, `setup` the
//! exchange's. The engine reads no clock: the driver loop ([`backend`]) passes `now` to every
//! entry point that starts or checks a deadline.

mod backend;
mod cancel;
mod exchange;
mod inbound;
mod link;
#[cfg(test)]
mod link_pair;
mod lose;
mod msg;
#[cfg(test)]
mod pair;
mod plan;
mod post;
mod recv;
mod reg;
mod reply;
mod request_in;
mod route;
mod rx;
#[cfg(test)]
mod scripted;
mod setup;
mod side;
mod sreq;
mod stretches;
#[cfg(test)]
mod tests;
mod transmit;
mod units;
mod xfer;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::net::TcpListener;
use mio::{Events, Poll, Registry, Token, Waker};
use rustc_hash::FxHashMap;

use crate::addr::{Address, Scheme};
use crate::admission::{self, Admission};
use crate::backend::Backend;
use crate::buffers::buf::{BufPool, OpBuf, RegisteredBuf};
use crate::comm::{Mechanism, Policy};
use crate::completions::Completions;
use crate::config::Config;
use crate::core::loss::Loss;
use crate::core::ops::{OpExtra, OpState, OpTable};
use crate::core::peers::{LastCommand, Peers};
use crate::core::requests::Requests;
use crate::error::{Error, Result};
use crate::ib::verbs::*;
use crate::info::Counters;
use crate::matching::Matcher;
use crate::regcache::RegRef;
use crate::types::{OpId, PeerId, ServiceLevel};

use exchange::SidePhase;
use link::{Held, Link, Via};
use plan::HeldPosts;
pub(crate) use plan::MsgCaps;
use reg::{Cache, DmaRegion};
use side::{Framed, IbInfo};
pub(crate) use sreq::IbReq;
pub(crate) use units::{Local, Xfer, XferThen};

pub(crate) use msg::MSG_HDR;

/// Every decoder of peer bytes in the engine, for the fuzz target.
pub(crate) fn fuzz_decoders(data: &[u8]) {
    if let Ok((_, h, payload)) = msg::decode(data) {
        let _ = msg::decode_segments(payload, h.c);
        let _ = msg::decode_segments(payload, u64::from(h.aux));
        // A reply header's list: its total is its length.
        let _ = msg::decode_segments_within(payload, h.a);
        inbound::fuzz(&h, payload);
    }
    let _ = side::IbInfo::decode(data);
    let _ = QpEndpointInfo::decode(data);
}

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const CHANNEL: Token = Token(2);
const FIRST_SIDE: usize = 3;

/// Completions polled per batch.
const CQ_BATCH: usize = 32;
/// Busy-poll rounds between looks at the side channels.
const SPIN_SIDE_EVERY: u32 = 32;
/// Empty busy-poll rounds in a row before a spinning driver yields its CPU (then after every
/// further empty round). The peer process may be waiting for this very CPU: a driver that never
/// yields holds it for its whole scheduler slice (4 ms at HZ=250), once per protocol hand-off,
/// whenever the two ends share a CPU (an oversubscribed host, or `taskset` onto one core).
/// A few rounds of pure spinning first keep the common case — the answer is microseconds
/// away — free of system calls.
const SPIN_ROUNDS_BEFORE_YIELD: u32 = 8;
/// Handshakes in progress, at most.
/// What an unmatched rendezvous announcement costs against the peer's early-data budget.
const RDV_COST: usize = 64;

/// FIN status: the receiver read the whole body.
pub(crate) const FIN_OK: u32 = 0;
/// FIN status: the receive buffer was too small (`c` = its capacity).
pub(crate) const FIN_TRUNCATED: u32 = 1;
/// FIN status: the receiver cancelled, or the sender withdrew the message.
pub(crate) const FIN_CANCELLED: u32 = 2;
/// CTS status (InfiniBand): the sender withdraws rendezvous message `b` (it was cancelled).
pub(crate) const RDV_WITHDRAW: u32 = 1;

// wr_id layout: 4 bits kind | 20 bits connection | 8 bits generation | 32 bits index.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;

fn wr_id(kind: u64, conn: u32, gen_: u8, idx: u32) -> u64 {
    (kind << 60) | (u64::from(conn & 0xF_FFFF) << 40) | (u64::from(gen_) << 32) | u64::from(idx)
}

fn wr_parts(id: u64) -> (u64, u32, u8, u32) {
    (id >> 60, ((id >> 40) & 0xF_FFFF) as u32, (id >> 32) as u8, id as u32)
}

/// An opened device with the objects every connection shares.
pub(crate) struct Dev<V: Verbs> {
    pub(crate) ctx: V,
    pub(crate) pd: V::Pd,
    ch: V::Channel,
    cq: V::Cq,
    port: route::PortRoute,
}

/// Builds the engine for `softib://` or `ib://`.
pub(crate) fn make_backend(
    scheme: Scheme,
    bind: Option<&Address>,
    cfg: &Config,
    core: Arc<Completions>,
) -> Result<Box<dyn Backend>> {
    match scheme {
        Scheme::SoftIb => {
            let sel = route::select(bind.and_then(Address::device_select), &cfg.ib, None)?;
            let mut sc = crate::ib::soft::SoftConfig { max_qp: 1024, ..Default::default() };
            sc.max_pinned_bytes = cfg.ib.soft_pin_budget;
            sc.faults = cfg.ib.soft_faults.clone();
            if let Some(ports) = &cfg.ib.soft_ports {
                sc.ports = ports.clone();
            }
            let ctx = crate::ib::soft::SoftProvider::new(sc).open(sel.device.as_deref())?;
            if let Some(h) = &cfg.ib.soft_hook {
                h.attach(&ctx);
            }
            Ok(Box::new(IbBackend::new(scheme, ctx, &sel, bind, cfg, core)?))
        }
        Scheme::Ib => {
            let env = std::env::var(route::ENV_DEVICE).ok();
            let sel = route::select(bind.and_then(Address::device_select), &cfg.ib, env.as_deref())?;
            open_hw(&sel, bind, cfg, core)
        }
        Scheme::Tcp => Err(Error::misuse("not an InfiniBand address")),
    }
}

#[cfg(feature = "verbs")]
fn open_hw(
    sel: &route::Selection,
    bind: Option<&Address>,
    cfg: &Config,
    core: Arc<Completions>,
) -> Result<Box<dyn Backend>> {
    let ctx = crate::ib::hw::HwProvider.open(sel.device.as_deref())?;
    Ok(Box::new(IbBackend::new(Scheme::Ib, ctx, sel, bind, cfg, core)?))
}

#[cfg(not(feature = "verbs"))]
fn open_hw(
    _sel: &route::Selection,
    _bind: Option<&Address>,
    _cfg: &Config,
    _core: Arc<Completions>,
) -> Result<Box<dyn Backend>> {
    Err(Error::Unsupported(
        "ib:// needs the hardware provider: build with `--features verbs` (or use softib://, the software \
         provider)"
            .into(),
    ))
}

struct Poller {
    poll: Poll,
    events: Events,
}

/// The engine.
pub(crate) struct IbBackend<V: Verbs> {
    scheme: Scheme,
    core: Arc<Completions>,
    dev: Arc<Dev<V>>,
    cache: Cache<V>,
    poller: Mutex<Poller>,
    waker: Waker,
    st: Mutex<State<V>>,
    pool: BufPool,
    local: Option<Address>,
    endpoint_id: u64,
    /// A driver is asleep in epoll: posts and completions need a wake-up.
    blocked: AtomicBool,
    /// The epoll instance of `poller` (a duplicate descriptor), for event loops to wait on.
    event_fd: std::os::fd::OwnedFd,
}

/// Derived settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub cfg: Config,
    pub policy: Policy,
    pub endpoint_id: u64,
    pub listen_port: u16,
    /// Largest unexpected (eager) message: what fits a ring slot.
    pub eager_limit: usize,
    pub max_message: usize,
    pub slot_size: u32,
    pub recv_size: u32,
    pub n_recv: u16,
    pub n_ring: u16,
    pub max_inline_device: u32,
    pub max_sge: u32,
}

/// Early arrivals, kept until a receive is posted.
#[derive(Debug)]
pub(crate) enum Early {
    Eager { data: Bytes, sl: ServiceLevel, mech: Mechanism },
    Rdv { msg: u64, total: u64, segs: Vec<msg::Segment>, conn: u32, withdrawn: bool },
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpSt {
    /// A receive in the matcher.
    Posted,
    /// Waiting for its messages or work requests to be posted and complete.
    Sending,
    /// A rendezvous send waiting for the receiver's FIN.
    WaitFin { msg: u64 },
    /// A matched receive (or pull, get…) whose data is moving.
    Moving,
    /// A client request waiting for its reply.
    WaitReply,
    /// Cancelled while the peer may still access its memory: waits for the reply or the grace.
    Cancelling { until: Instant },
    /// Outcome known; waiting for work requests that still reference its buffer.
    Finishing,
}

impl OpState for OpSt {
    const FINISHING: Self = OpSt::Finishing;
    const AWAITING_REPLY: Self = OpSt::WaitReply;

    /// A cancelled operation whose memory the peer may still access is delivered only when
    /// the peer lets go (its reply or FIN) or the grace ends.
    fn holds(self) -> bool {
        matches!(self, OpSt::Cancelling { .. })
    }
}

/// The engine's part of an operation.
#[derive(Default)]
pub(crate) struct IbOp {
    /// Registrations held for the peer's RDMA into or out of `buf` (or the request header).
    pub regs: Vec<RegRef>,
    /// The connection the op's data moves on.
    pub conn: Option<u32>,
    /// Pool buffers that must live as long as the op (a staged copy the peer reads, a large
    /// header).
    pub keep: Vec<RegisteredBuf>,
    /// A read's staging buffer the peer writes into (the caller's memory could not be
    /// registered): copied into the caller's buffer when the reply arrives.
    pub stage_in: Option<RegisteredBuf>,
    /// Stretches of `buf` in file mappings, registered for server-side units to use directly.
    pub direct: Vec<xfer::DirectRun>,
}

impl OpExtra for IbOp {
    /// Registrations end before the buffer goes back: after that no peer touches it.
    fn must_retire(&self) -> bool {
        !self.regs.is_empty() || !self.direct.is_empty()
    }
}

impl IbOp {
    /// Gives a delivered op's registrations back to the cache, then drops the pool buffers it
    /// kept.
    fn retire<V: Verbs>(self, cache: &Cache<V>) {
        let IbOp { regs, direct, keep, stage_in, .. } = self;
        if !regs.is_empty() || !direct.is_empty() {
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            for r in regs.into_iter().chain(direct.into_iter().map(|d| d.reg)) {
                let _ = c.release(r);
            }
        }
        drop(keep);
        drop(stage_in);
    }
}

/// The engine's operation table.
pub(crate) type Ops = OpTable<OpSt, IbOp>;

/// A message waiting to be transmitted on a connection.
pub(crate) struct OutMsg {
    pub via: Via,
    pub header: crate::wire::Header,
    pub payload: Payload,
    pub then: Then,
    /// Must wait for earlier RDMA_READs of the queue pair (a reply after pulls).
    pub fence: bool,
}

/// Payload bytes of a message.
#[derive(Clone)]
pub(crate) enum Payload {
    None,
    Bytes(Bytes),
    /// `[off, off+len)` of an operation's send buffer, read when the message is built.
    Op {
        op: OpId,
        off: usize,
        len: usize,
    },
    /// Several parts in order (request header, then inline data or a segment list).
    Parts(Vec<Payload>),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Bytes(b) => b.len(),
            Payload::Op { len, .. } => *len,
            Payload::Parts(p) => p.iter().map(Payload::len).sum(),
        }
    }
}

/// What happens when a message has gone out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Then {
    Nothing,
    /// The op's data was copied: it completes now.
    CompleteAtPost(OpId),
    /// Zero copy from the op's buffer: it completes when the work request does.
    CompleteAtWc(OpId),
    /// The op's buffer is referenced until the work request completes; the op completes
    /// otherwise (a reply, a FIN).
    Release(OpId),
}

#[derive(Debug)]
pub(crate) enum SqDone {
    Then(Then),
    /// The last work request of a transfer unit.
    Unit {
        xfer: u64,
        offset: usize,
        len: usize,
        zone: Option<crate::flowctl::ZoneBuf>,
        read: bool,
    },
}

/// One RC queue pair with its memory and flow control.
pub(crate) struct Conn<V: Verbs> {
    // Field order is drop order: the queue pair goes before the registration, the
    // registration before the memory.
    pub qp: V::Qp,
    pub mr: V::Mr,
    pub mem: DmaRegion,
    pub id: u32,
    pub gen_: u8,
    pub peer: PeerId,
    pub sl: ServiceLevel,
    /// Both queue pairs are in RTS and the peer can receive.
    pub ready: bool,
    pub psn: u32,
    pub remote: Option<IbInfo>,
    /// Flow control, bounce buffers and the send queue's accounting.
    pub link: Link<SqDone>,
    pub out: VecDeque<OutMsg>,
    /// Sends and requests posted before the peer's limits were known: their mechanism is
    /// chosen, in order, once they are (see [`State::caps`]).
    pub waiting_posts: HeldPosts,
    /// When the application last posted a command to go on this connection (or it was made):
    /// see [`crate::core::peers::IDLE_BEFORE_CHECK`].
    pub last_command: LastCommand,
}

pub(crate) struct Side {
    pub framed: Framed,
    pub phase: SidePhase,
    pub peer: Option<PeerId>,
    pub sl: ServiceLevel,
    pub conn: Option<u32>,
    pub remote: SocketAddr,
    pub since: Instant,
}

pub(crate) struct State<V: Verbs> {
    pub s: Settings,
    pub dev: Arc<Dev<V>>,
    pub cache: Cache<V>,
    pub core: Arc<Completions>,
    pub listener: Option<TcpListener>,
    pub sides: HashMap<Token, Side>,
    /// Accepted side channels still in their handshake.
    pub admission: Admission<Token>,
    pub next_token: usize,
    pub conns: Vec<Option<Conn<V>>>,
    pub conn_gen: Vec<u8>,
    pub free_conns: Vec<u32>,
    /// The peers, each with its connections by class.
    pub peers: Peers<u32, ()>,
    pub matcher: Matcher<(), Early>,
    pub ops: Ops,
    pub exposures: HashMap<u64, Exposed<V>>,
    pub sreqs: Requests<IbReq>,
    /// Rendezvous sends and fetched headers waiting for the peer's FIN, by message id.
    pub fin_wait: FxHashMap<u64, FinWait>,
    /// Transfers, their units and the bulk scheduler.
    pub units: units::Units,
    pub zones: Option<xfer::Zones<V>>,
    pub pool: BufPool,
    pub next_msg: u64,
    pub events: u64,
    pub rounds: u32,
    /// Busy-poll rounds in a row that found nothing to do.
    pub idle_rounds: u32,
    pub last_timers: Instant,
    pub closed: bool,
    /// The listener may hold side channels not accepted yet (see
    /// [`admission::ACCEPTS_PER_ROUND`]).
    pub accept_more: bool,
    pub registry: Registry,
    pub wcs: Vec<WorkCompletion>,
    /// Invalidates this endpoint's cached registrations of a file mapping before it is unmapped
    /// (held here; the process-wide list only has a weak reference).
    pub _unmap_hook: crate::buffers::filemap::UnmapHook,
    /// File-map stretches staged once (registered when they come back).
    pub mapped_seen: stretches::SeenOnce,
}

/// Waiting for a FIN.
pub(crate) enum FinWait {
    /// A rendezvous send op.
    Send(OpId),
    /// Registrations and memory of a header we sent `peer` by rendezvous.
    Header { peer: PeerId, regs: Vec<RegRef>, keep: Vec<RegisteredBuf> },
}

/// An exposure: a buffer with its own registration, revoked by dropping it.
pub(crate) struct Exposed<V: Verbs> {
    pub mr: V::Mr,
    pub buf: RegisteredBuf,
}

impl<V: Verbs> State<V> {
    /// Forgets a peer that connected to us once nothing of it is left (see
    /// [`Peers::forget_if_gone`]); a side channel still in its handshake, or a queue pair still
    /// being set up, keeps it.
    pub(crate) fn forget_if_gone(&mut self, peer: PeerId) {
        let (sides, conns) = (&self.sides, &self.conns);
        self.peers.forget_if_gone(peer, || {
            sides.values().any(|s| s.peer == Some(peer)) || conns.iter().flatten().any(|c| c.peer == peer)
        });
    }

    pub(crate) fn conn(&self, id: u32) -> Option<&Conn<V>> {
        self.conns.get(id as usize).and_then(Option::as_ref)
    }

    pub(crate) fn conn_mut(&mut self, id: u32) -> Option<&mut Conn<V>> {
        self.conns.get_mut(id as usize).and_then(Option::as_mut)
    }

    // ----------------------------------------------------------------------------------------
    // Completions
    // ----------------------------------------------------------------------------------------

    fn poll_cq(&mut self) {
        let mut wcs = std::mem::take(&mut self.wcs);
        loop {
            let n = match self.dev.cq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "completion queue failed");
                    0
                }
            };
            for wc in &wcs[..n] {
                self.on_wc(wc);
            }
            if n < wcs.len() {
                break;
            }
        }
        self.wcs = wcs;
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let (kind, cid, gen_, idx) = wr_parts(wc.wr_id);
        // Completions of a connection already torn down are stale.
        if self.conn_gen.get(cid as usize) != Some(&gen_) || self.conn(cid).is_none() {
            return;
        }
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                tracing::debug!(status = ?wc.status, conn = cid, "work request failed");
                let c = &self.core.counters;
                Counters::add(&c.wc_errors, 1);
                match wc.status {
                    WcStatus::RnrRetryExcErr => Counters::add(&c.wc_rnr_retry_exceeded, 1),
                    WcStatus::RetryExcErr => Counters::add(&c.wc_retry_exceeded, 1),
                    _ => {}
                }
            }
            self.on_wc_error(cid, kind, idx, wc.status);
            return;
        }
        match kind {
            WR_RECV => self.on_recv(cid, idx, wc),
            WR_SEND => self.on_send_done(cid, idx),
            _ => {}
        }
    }

    /// A failed work request: the queue pair is in ERR and every later one flushes. The op it
    /// belonged to gets the precise error; the peer is lost.
    fn on_wc_error(&mut self, cid: u32, kind: u64, idx: u32, status: WcStatus) {
        let Some(peer) = self.conn(cid).map(|c| c.peer) else { return };
        if kind == WR_SEND {
            // Precise error for a one-sided op hitting a bad key or range.
            // The failing work request's unit, or the last unit posted before it.
            let target = self
                .conn(cid)
                .and_then(|c| {
                    c.link.outstanding().skip_while(|e| e.seq != idx).find_map(|e| match e.done {
                        Some(SqDone::Unit { xfer, .. }) => Some(xfer),
                        _ => None,
                    })
                })
                .and_then(|xfer| self.units.xfers.get(&xfer))
                .and_then(|x| match x.local {
                    Local::Op { op, .. } => Some(op),
                    Local::Vec(_) => None,
                });
            if let Some(op) = target {
                if matches!(status, WcStatus::RemAccessErr | WcStatus::RemInvReqErr) {
                    Counters::add(&self.core.counters.access_denied, 1);
                }
                let e = match status {
                    WcStatus::RemAccessErr => Error::RemoteAccess(crate::error::AccessError::BadKey),
                    WcStatus::RemInvReqErr => Error::RemoteAccess(crate::error::AccessError::OutOfBounds),
                    _ => Error::PeerLost { peer, reason: format!("work request failed: {status:?}") },
                };
                if let Some(o) = self.ops.get_mut(&op)
                    && o.outcome.is_none()
                {
                    o.outcome = Some(Err(e));
                }
            }
        }
        let reason = format!("queue pair error: {status:?}");
        self.fail_peer(peer, Loss::Lost(reason));
    }

    /// A signaled send completion: what it retires (see [`Link::send_done`]) takes effect.
    fn on_send_done(&mut self, cid: u32, seq: u32) {
        let Some(c) = self.conn_mut(cid) else { return };
        let Some(retired) = c.link.send_done(seq) else {
            tracing::warn!(conn = cid, seq, "completion of a work request not outstanding");
            return;
        };
        for e in retired {
            match e.done {
                None => {}
                Some(SqDone::Then(t)) => self.then_at_wc(t),
                Some(SqDone::Unit { xfer, offset, len, zone, read }) => {
                    self.unit_done(xfer, offset, len, zone, read)
                }
            }
        }
    }

    fn then_at_wc(&mut self, t: Then) {
        match t {
            Then::CompleteAtWc(op) => {
                let n = self.ops.get(&op).map_or(0, |o| match &o.buf {
                    OpBuf::Send(s) => s.len(),
                    _ => 0,
                });
                self.ops.release_ref(op);
                self.ops.complete(op, Ok(n));
            }
            Then::Release(op) => self.ops.release_ref(op),
            Then::CompleteAtPost(_) | Then::Nothing => {}
        }
    }

    // ----------------------------------------------------------------------------------------
    // Peer loss
    // ----------------------------------------------------------------------------------------

    pub(crate) fn fail_peer(&mut self, peer: PeerId, why: Loss) {
        // Only a known peer is lost (and counted); the error names its address.
        let Some(p) = self.peers.get(peer) else { return };
        let (err, reason) = why.into_error(peer, p.addr(), &self.core.counters);
        tracing::debug!(%peer, %reason, "peer lost");
        // What the application's queue still holds of this peer stays counted against it.
        let held = self.peers.lose(peer, &reason);
        // Its side channels (also those still in their handshake), its connections and the
        // posts waiting for their limits (see [`lose::teardown`]).
        let lose::Teardown { sides, conns: all_conns, waiting } = lose::teardown(
            peer,
            self.sides.iter().map(|(t, s)| (*t, s.peer)),
            self.conns.iter().flatten().map(|c| (c.id, c.peer, c.waiting_posts.ops())),
            held,
        );
        for t in sides {
            self.admission.finished(t);
            if let Some(mut s) = self.sides.remove(&t) {
                let _ = self.registry.deregister(&mut s.framed.sock);
            }
        }
        // Sends and requests still waiting for a connection's limits fail like posted ops.
        for op in waiting {
            self.fail_waiting_post(op, err.duplicate());
        }
        // Bytes of this peer's units in the send queues about to go (see
        // [`units::Units::lose_peer`]).
        let mut unit_bytes = 0;
        for cid in &all_conns {
            if let Some(c) = self.conn_mut(*cid) {
                for e in c.link.flush() {
                    if let Some(SqDone::Unit { len, .. }) = e.done {
                        unit_bytes += len;
                    }
                }
            }
        }
        // Destroying the queue pairs first guarantees no more DMA into memory about to be
        // released (buffers returned to users, registrations dropped).
        for cid in &all_conns {
            if let Some(c) = self.conns.get_mut(*cid as usize).and_then(Option::take) {
                drop(c);
                self.free_conns.push(*cid);
            }
        }
        self.sreqs.drop_peer(peer);
        self.core.forget_peer(peer);
        let grants = self.units.lose_peer(peer, unit_bytes, self.zones.as_mut().map(|z| &mut z.zones));
        // Its receives, early arrivals, FIN waits and operations ([`rx::Rx::lose_peer`]); the
        // reply headers it was to fetch come back to the cache.
        let (mut rx, _) = self.rx();
        let released = rx.lose_peer(peer, &err);
        for rx::Released { regs, keep } in released {
            // The registrations go back before the memory they cover.
            let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            for r in regs {
                let _ = c.release(r);
            }
            drop(c);
            drop(keep);
        }
        for g in grants {
            self.zone_granted(g);
        }
        self.forget_if_gone(peer);
    }

    /// Counts a busy-poll round (`timeout` zero) that found nothing; true when the driver
    /// should now yield its CPU (see [`SPIN_ROUNDS_BEFORE_YIELD`]).
    fn idle_spin(&mut self, timeout: Duration, progressed: bool) -> bool {
        if progressed || !timeout.is_zero() {
            self.idle_rounds = 0;
            return false;
        }
        self.idle_rounds = self.idle_rounds.saturating_add(1);
        self.idle_rounds >= SPIN_ROUNDS_BEFORE_YIELD
    }

    /// Whether [`State::timers`] has anything to check: a side channel in its handshake or
    /// connect, a transfer cancelled within its grace period, or messages waiting for what
    /// their peer gives back.
    fn timers_pending(&self) -> bool {
        self.admission.len() > 0
            || self.sides.values().any(|s| s.phase.dialled().is_some())
            || self.ops.iter().any(|(_, o)| matches!(o.st, OpSt::Cancelling { .. }))
            || self.conns.iter().flatten().any(Conn::messages_wait)
    }

    fn timers(&mut self, polling: bool, now: Instant) {
        if polling && !self.rounds.is_multiple_of(64) {
            return;
        }
        if now.duration_since(self.last_timers) < Duration::from_millis(50) {
            return;
        }
        self.last_timers = now;
        for t in self.admission.expired(now) {
            self.side_failed(t, Loss::Lost("connection handshake timed out".into()));
        }
        let dials = self.sides.iter().map(|(t, s)| (*t, s.phase.dialled(), Some(s.since)));
        let expired = admission::overdue_dials(dials, now, &self.s.cfg);
        for (t, why) in expired {
            self.side_failed(t, Loss::Lost(why.into()));
        }
        // Cancelled transfers the peer did not finish within the grace period: tear down.
        let overdue: Vec<PeerId> =
            self.ops.iter().filter(|(_, o)| cancel::grace_over(o.st, now)).map(|(_, o)| o.peer).collect();
        for p in overdue {
            self.fail_peer(p, Loss::Lost("cancelled transfer not released by the peer in time".into()));
        }
        // Peers that gave back nothing for the stall timeout while messages waited for them:
        // no kernel drops such a connection over verbs, so the transport does.
        let stall = self.s.cfg.stall_timeout;
        let stalled: Vec<(PeerId, usize)> = self
            .conns
            .iter_mut()
            .flatten()
            .filter_map(|c| {
                let wait = c.messages_wait();
                let waited = c.link.waiting_for(wait, now);
                (wait && waited >= stall).then_some((c.peer, c.out.len()))
            })
            .collect();
        for (p, n) in stalled {
            let why = format!(
                "it gave back no credits or ring slots for {stall:?} while {n} messages waited for them (stall_timeout)"
            );
            self.fail_peer(p, Loss::Lost(why));
        }
    }
}

impl<V: Verbs> Conn<V> {
    /// Messages wait on this connection for what the peer gives back (the pump sends all it
    /// may at once, so a message still queued after it is one that cannot go yet).
    fn messages_wait(&self) -> bool {
        self.ready && !self.out.is_empty()
    }
}

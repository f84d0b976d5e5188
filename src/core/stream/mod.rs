//! The message protocol over byte streams, sans-IO: one [`Session`] per endpoint keeps every
//! peer's links (one byte stream per peer and service level), their framing, the handshake, and
//! the protocol on top (eager and rendezvous messages, requests and their payloads, emulated
//! put and get), and is driven by events only:
//!
//! * bytes received on a link ([`Session::recv_buffers`] says where the next bytes go,
//!   [`Session::received`] how many landed there);
//! * bytes a link took for sending ([`Session::transmit`] lends the next bytes,
//!   [`Session::transmitted`] says how many went);
//! * the application's commands ([`Session::post`], [`Session::cancel`], …);
//! * the time, passed in ([`Session::handle_timeout`]).
//!
//! What the driver must do in turn is queued as [`Action`]s (dial, close, read a link again).
//! No socket, poller or clock is touched here, so two sessions joined by in-memory byte queues
//! on a virtual clock run the whole protocol (see the `pair` tests).
//!
//! * [`link`] — one link's framing state (receive state machine, staging buffer, frame queues).
//! * [`post`] — the application's operations, turned into frames.
//! * [`recv`] — frames arriving, matched, buffered or routed straight into their buffers.
//! * [`stream_in`] — streamed request payloads on their way into the server's pulls.
//! * [`cancel`] — cancellation.
//! * [`handshake`] — the connection handshake, on links we dial and links we accept.
//! * [`transmit`] — frames leaving, classes served by the weighted scheduler.
//! * [`teardown`] — links failing, peers lost, deadlines.

mod cancel;
mod handshake;
pub(crate) mod link;
mod post;
mod recv;
mod stream_in;
mod teardown;
mod transmit;

#[cfg(test)]
mod pair;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
// Keys we generate ourselves (links, op and message ids) hash with Fx; maps keyed by values a
// peer chooses (tags, request ids) keep the DoS-resistant default hasher.
use rustc_hash::{FxHashMap, FxHashSet};

use crate::addr::Scheme;
use crate::admission::{self, Admission};
use crate::buffers::buf::OpBuf;
use crate::comm::{Origin, Policy};
use crate::completions::Completions;
use crate::config::Config;
use crate::core::ops::{self, OpState, OpTable};
use crate::core::peers::{self, Peers};
use crate::core::requests::Requests;
pub(crate) use crate::core::slab::Slab;
use crate::core::slab::{SlabId, pack, unpack};
use crate::error::{Error, Result};
use crate::expose::ExposureTable;
use crate::matching::Matcher;
use crate::op::{OpKind, RequestMeta, Unexpected};
use crate::sched::SendScheduler;
use crate::types::{OpId, PeerId, ServiceLevel, Tag};
use crate::wire::{HEADER_LEN, Limits};

#[cfg(test)]
pub(crate) use link::RecvIov;
pub(crate) use link::{IoVec, Link, MAX_IOV, RecvInto};
pub(crate) use post::EagerNow;
use stream_in::StreamIn;

/// Eager messages at the advertised limit that fit one peer's early-data budget: the default
/// eager limit is at most the budget divided by this.
const EAGER_MESSAGES_IN_BUDGET: usize = 8;
/// Receive staging buffer per link: small frames are parsed from it with one read.
pub(crate) const RX_BUF: usize = 64 * 1024;
/// Payload remainders at least this large are read straight into the destination buffer.
pub(crate) const DIRECT_READ_MIN: usize = 16 * 1024;
/// Largest STREAM frame: a cancelled request's partly written frame is copied out, at most
/// this much, so the caller gets its buffer back at once.
const STREAM_CHUNK: usize = 1 << 20;
/// What an unmatched rendezvous announcement costs against the peer's early-data budget.
const RTS_COST: usize = 64;
/// What a queued frame costs beyond the bytes it carries (the frame and its queue slot),
/// charged against the transmit bound of the peer it answers.
const FRAME_COST: usize = 128;
/// How often handshake, connect and stall deadlines are checked.
const TIMER_PERIOD: Duration = Duration::from_millis(50);
/// CTS status: the receive buffer is too small (`c` = its capacity).
const CTS_TRUNCATED: u32 = 1;

/// A link: one byte stream to a peer (a TCP connection, for the TCP driver). The session
/// numbers links; a driver maps each to its own handle one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LinkId(pub(crate) u64);

/// A link id is a slot of the session's link table and the slot's generation (see
/// [`crate::core::slab`]).
impl SlabId for LinkId {
    fn from_parts(index: u32, generation: u32) -> Self {
        LinkId(pack(index, generation))
    }
    fn index(self) -> usize {
        unpack(self.0).0
    }
    fn generation(self) -> u32 {
        unpack(self.0).1
    }
}

/// What the driver must do for the session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Open a byte stream to `addr` for class `sl`; answer with [`Session::dial_started`], then
    /// [`Session::link_up`] or [`Session::link_failed`].
    Dial { link: LinkId, addr: SocketAddr, sl: ServiceLevel },
    /// An accepted link turned out to carry class `sl` (its hello said so): give the stream
    /// the class's settings.
    Classify { link: LinkId, sl: ServiceLevel },
    /// Read the link again: it was paused (a peer's budget, the transmit bound, a stream
    /// waiting for a pull), and bytes may wait on it that no new readiness event will report.
    Resume { link: LinkId },
    /// Close the link. `farewell`, when given, is one frame to send first, best effort, that
    /// tells the peer why.
    Close { link: LinkId, farewell: Option<[u8; HEADER_LEN]> },
}

/// What arrived for the application besides completions, in the order it arrived.
#[derive(Debug)]
pub(crate) enum Delivery {
    Unexpected(Unexpected),
    Request(RequestMeta),
    /// A lost peer's queued requests can no longer be answered.
    PeerGone(PeerId),
}

/// What the session is configured with.
pub(crate) struct Settings {
    pub cfg: Config,
    pub policy: Policy,
    pub limits: Limits,
    pub eager_limit: usize,
    pub eager_origin: Origin,
    pub endpoint_id: u64,
    pub listen_port: u16,
}

impl Settings {
    /// Settings from the configuration; `listen_port` 0 when the endpoint does not listen.
    pub(crate) fn new(cfg: &Config, endpoint_id: u64, listen_port: u16) -> Settings {
        let mut policy = cfg.policy.clone().unwrap_or_else(|| Policy::for_scheme(Scheme::Tcp));
        let (eager_limit, eager_origin) = match cfg.eager_limit {
            Some(n) => (n, Origin::Application),
            None => {
                let table =
                    ServiceLevel::ALL.iter().map(|&sl| policy.thresholds(sl).inline_max).max().unwrap_or(0);
                // What this end advertises, and so what peers may send it unasked: small
                // enough that several eager messages fit the per-peer early-data budget
                // before its reading stops, so eager traffic flows rather than stalls.
                let affordable = cfg.early_bytes_per_peer / EAGER_MESSAGES_IN_BUDGET;
                if affordable < table {
                    (affordable, Origin::ReceiveBudget)
                } else {
                    (table, policy.origin())
                }
            }
        };
        // The table can never choose eager above what the receiver buffers.
        for sl in ServiceLevel::ALL {
            let mut t = policy.thresholds(sl);
            t.inline_max = t.inline_max.min(eager_limit);
            policy.cap(sl, t);
        }
        let max_message = cfg.max_message.min(u32::MAX as usize);
        let limits = Limits {
            eager: eager_limit as u32,
            chunk: max_message as u32,
            header: cfg.max_header as u32,
            message: max_message as u64,
        };
        Settings { cfg: cfg.clone(), policy, limits, eager_limit, eager_origin, endpoint_id, listen_port }
    }
}

#[derive(Debug)]
enum Early {
    Eager { data: Bytes, sl: ServiceLevel },
    Rts { msg: u64, total: u64, link: LinkId },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpSt {
    /// A receive waiting in the matcher.
    Posted,
    /// A matched receive whose payload is being read.
    Receiving,
    /// Frames being written; completes when written.
    Writing,
    /// Rendezvous sender waiting for CTS.
    WaitCts { msg: u64 },
    /// Rendezvous receiver waiting for DATA.
    WaitData { msg: u64 },
    /// Put waiting for its acknowledgement.
    WaitAck,
    /// Get waiting for its response.
    WaitResp,
    /// Client request waiting for its reply.
    WaitReply,
    /// Server pull waiting for PULL_DATA.
    WaitPullData,
    /// Server pull of a streamed payload, filled as the stream reaches it.
    WaitStream,
    /// Outcome known; waiting for frames that still reference the buffer.
    Finishing,
}

impl OpState for OpSt {
    const FINISHING: Self = OpSt::Finishing;
    const AWAITING_REPLY: Self = OpSt::WaitReply;
}

type Op = ops::Op<OpSt, ()>;

/// What the session keeps of an open request beyond the shared record.
#[derive(Debug, Default)]
struct StreamReq {
    /// The OUT payload streams behind the request (see [`StreamIn`]).
    streamed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RndvIn {
    Op(OpId),
    Discard,
}

/// What the session keeps of a peer beyond the shared record.
pub(crate) struct PeerExt {
    /// Negotiated: the peer's eager limit and largest message.
    eager_limit: usize,
    max_message: u64,
    /// The peer reads STREAM frames (announced in its hello).
    streams: bool,
    /// Bytes queued in answer to this peer (see [`link::Frame::charge`]).
    pub tx_bytes: usize,
    /// At the transmit bound: its links are not read.
    tx_paused: bool,
    /// When its backlog last moved while paused; `None`: it moved since the last clock
    /// reading, which stamps it (so the hot paths that move bytes never read a clock).
    tx_moved_at: Option<Instant>,
}

type Peer = peers::Peer<LinkId, PeerExt>;

/// The protocol state of one endpoint.
pub(crate) struct Session {
    pub(crate) s: Settings,
    links: Slab<LinkId, Link>,

    /// Accepted links still in their handshake.
    pub(crate) admission: Admission<LinkId>,
    pub(crate) peers: Peers<LinkId, PeerExt>,
    matcher: Matcher<(), Early>,
    ops: OpTable<OpSt, ()>,
    pub(crate) exposures: ExposureTable,
    sreqs: Requests<StreamReq>,
    /// Streamed payloads still arriving, by (peer, request id).
    streams: HashMap<(PeerId, u64), StreamIn>,
    rndv_in: HashMap<(PeerId, u64), RndvIn>,
    rndv_out: FxHashMap<u64, OpId>,
    /// Links with frames to send that take bytes.
    write_ready: FxHashSet<LinkId>,
    sched: SendScheduler,
    next_msg: u64,
    last_timers: Instant,
    /// Peers whose links are not read for their transmit backlog.
    pub(crate) tx_paused: Vec<PeerId>,
    /// Unexpected messages and requests delivered (progress made).
    pub(crate) events: u64,
    actions: VecDeque<Action>,
    delivered: Vec<Delivery>,
    core: Arc<Completions>,
}

impl Session {
    /// A session with no links; `core` counts what it does.
    pub(crate) fn new(now: Instant, s: Settings, core: Arc<Completions>) -> Session {
        let cfg = &s.cfg;
        Session {
            sched: SendScheduler::new(cfg.sched_weights),
            admission: Admission::new(admission::Limits {
                deadline: cfg.handshake_timeout,
                total: cfg.max_handshaking,
                per_source: cfg.handshakes_per_source,
            }),
            s,
            links: Slab::default(),
            peers: Peers::default(),
            matcher: Matcher::new(),
            ops: OpTable::default(),
            exposures: ExposureTable::default(),
            sreqs: Requests::default(),
            streams: HashMap::new(),
            rndv_in: HashMap::new(),
            rndv_out: FxHashMap::default(),
            write_ready: FxHashSet::default(),
            next_msg: 1,
            last_timers: now,
            tx_paused: Vec::new(),
            events: 0,
            actions: VecDeque::new(),
            delivered: Vec::new(),
            core,
        }
    }

    // ----------------------------------------------------------------------------------------
    // What the driver asks
    // ----------------------------------------------------------------------------------------

    /// A new link id, for a link the driver accepted.
    pub(crate) fn new_link_id(&mut self) -> LinkId {
        if self.actions.is_empty() {
            // The driver has carried out every close: their slots may take new links.
            self.links.release();
        }
        self.links.allocate()
    }

    /// The peer the application names by `addr`.
    pub(crate) fn connect(&mut self, addr: SocketAddr) -> Result<PeerId> {
        let d = self.new_peer_ext();
        self.peers.dialled(addr, self.s.cfg.max_peers, || d)
    }

    /// Links open (in any phase).
    pub(crate) fn link_count(&self) -> usize {
        self.links.len()
    }

    /// Whether busy-polling may read `link` on its own initiative: it is established and not
    /// waiting for a pull or the peer's budget (those say when to read it again).
    pub(crate) fn may_read(&self, link: LinkId) -> bool {
        self.links.get(link).is_some_and(|c| c.is_ready() && c.rx.may_read())
    }

    /// Whether only one link is open, established, with nothing to send: what a driver blocked
    /// reading that link alone can serve.
    pub(crate) fn lone_quiet_link(&self) -> bool {
        self.links.len() == 1 && self.links.values().all(|c| c.is_ready() && !c.has_frames())
    }

    /// The application took an unexpected message of `bytes` from `peer`: its budget may let
    /// stalled links go on.
    pub(crate) fn unexpected_taken(&mut self, peer: PeerId, bytes: usize) {
        self.peers.unexpected_taken(peer, bytes);
        self.forget_if_gone(peer);
        self.unstall(peer);
    }

    /// Completions waiting to leave.
    pub(crate) fn done_len(&self) -> usize {
        self.ops.done_len()
    }

    /// The next thing the driver must do.
    #[inline]
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether actions wait.
    #[inline]
    pub(crate) fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Hands what arrived to the endpoint: messages and requests first, then this round's
    /// completions.
    #[inline]
    pub(crate) fn hand_over(&mut self, core: &Completions) {
        if !self.delivered.is_empty() {
            self.hand_over_deliveries(core);
        }
        self.ops.hand_over(core, |()| {});
    }

    fn hand_over_deliveries(&mut self, core: &Completions) {
        for d in self.delivered.drain(..) {
            match d {
                Delivery::Unexpected(u) => core.push_unexpected(u),
                Delivery::Request(r) => core.push_request(r),
                Delivery::PeerGone(p) => core.forget_peer(p),
            }
        }
    }

    // ----------------------------------------------------------------------------------------
    // Shared helpers
    // ----------------------------------------------------------------------------------------

    fn new_peer_ext(&self) -> PeerExt {
        PeerExt {
            eager_limit: self.s.eager_limit,
            max_message: self.s.limits.message,
            streams: false,
            tx_bytes: 0,
            tx_paused: false,
            tx_moved_at: None,
        }
    }

    fn peer(&self, peer: PeerId) -> Result<&Peer> {
        self.peers.require(peer)
    }

    /// Forgets a peer that connected to us once nothing of it is left (see
    /// [`Peers::forget_if_gone`]); a link still in its handshake counts.
    fn forget_if_gone(&mut self, peer: PeerId) {
        let links = &self.links;
        self.peers.forget_if_gone(peer, || links.values().any(|c| c.peer == Some(peer)));
    }

    /// The STREAM frame size for request payloads to `p`, if they stream to it at all (it
    /// reads streams and [`Config::stream_requests`] is on).
    fn stream_chunk(&self, p: &Peer) -> Option<usize> {
        (self.s.cfg.stream_requests && p.d.streams)
            .then(|| (p.d.max_message.min(STREAM_CHUNK as u64) as usize).max(1))
    }

    fn complete(&mut self, op: OpId, result: Result<usize>) {
        self.ops.complete(op, result);
    }

    fn release_frame(&mut self, op: OpId) {
        self.ops.release_ref(op);
    }

    /// Completes a new op at once with an error (it was taken by `post`, so it must complete).
    fn fail_new(&mut self, op: OpId, kind: OpKind, peer: PeerId, tag: Tag, buf: OpBuf, e: Error) {
        self.ops.fail_new(op, kind, peer, tag, buf, e);
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_op(
        &mut self,
        op: OpId,
        kind: OpKind,
        peer: PeerId,
        tag: Tag,
        sl: ServiceLevel,
        buf: OpBuf,
        st: OpSt,
    ) -> &mut Op {
        self.ops.insert(op, kind, peer, tag, sl, buf, st)
    }

    fn act(&mut self, a: Action) {
        self.actions.push_back(a);
    }
}

fn unexpected(what: String) -> crate::error::ProtocolError {
    crate::error::ProtocolError::Unexpected { what }
}

impl OpBuf {
    fn send_len(&self) -> usize {
        match self {
            OpBuf::Send(s) => s.len(),
            _ => 0,
        }
    }
}

//! What an endpoint tells upper layers about itself: negotiated limits and counters (the DAFS
//! "session attributes" idea), so a storage protocol can size its requests from them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::addr::{Address, Scheme};
use crate::buffers::buf::PoolStats;
use crate::comm::{Mechanism, Origin, Policy};
pub use crate::ib::verbs::{PortCounters, VerbsCounters};
use crate::types::WaitMode;

/// Limits, policy and counters of an endpoint.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Info {
    /// Transport.
    pub scheme: Scheme,
    /// Listening address (bound endpoints).
    pub local_addr: Option<Address>,
    /// This endpoint's random 64-bit identity (sent in handshakes).
    pub endpoint_id: u64,
    /// How `wait` waits.
    pub wait_mode: WaitMode,
    /// Largest eager (inline) message and largest unexpected message this endpoint accepts,
    /// as it advertises to peers; a connection uses the smaller of its two ends' limits.
    pub eager_limit: usize,
    /// Where [`Info::eager_limit`] came from.
    pub eager_origin: Origin,
    /// Largest message or request payload.
    pub max_message: usize,
    /// Largest request / reply header.
    pub max_header: usize,
    /// The mechanism table in force.
    pub policy: Policy,
    /// Credits per connection (pre-posted receive buffers at the peer), where the transport
    /// uses credits.
    pub credits: Option<u32>,
    /// Fast-RDMA ring slots per connection and their size, where available.
    pub fast_slots: Option<(u32, usize)>,
    /// Registration cache capacity (entries, bytes) and hit/miss counters, where available.
    pub regcache: Option<RegcacheInfo>,
    /// Registered-buffer pool statistics.
    pub pool: PoolStats,
    /// Peers currently known and connected.
    pub peers_connected: usize,
    /// Exposures currently registered.
    pub exposures: usize,
    /// Operations posted and not yet completed.
    pub pending_ops: usize,
    /// Monotonic counters.
    pub counters: CounterSnapshot,
    /// The InfiniBand engine's resources in use right now, where the transport has them.
    pub rdma: Option<RdmaInfo>,
    /// What the endpoint holds for its peers right now.
    pub gauges: Gauges,
}

impl Info {
    /// An `Info` with nothing reported yet: the endpoint fills it in. Public (hidden) for the
    /// conformance suite, which rebuilds another process's `Info` from its fields.
    #[doc(hidden)]
    pub fn unreported(scheme: Scheme, wait_mode: WaitMode, policy: Policy) -> Info {
        Info {
            scheme,
            local_addr: None,
            endpoint_id: 0,
            wait_mode,
            eager_limit: 0,
            eager_origin: Origin::TransportDefault,
            max_message: 0,
            max_header: 0,
            policy,
            credits: None,
            fast_slots: None,
            regcache: None,
            pool: Default::default(),
            peers_connected: 0,
            exposures: 0,
            pending_ops: 0,
            counters: Default::default(),
            rdma: None,
            gauges: Default::default(),
        }
    }
}

/// What an endpoint holds for its peers at one instant. Each is bounded by a [`Config`]
/// setting, so operators and tests read here that a hostile or careless peer cannot grow them.
///
/// [`Config`]: crate::Config
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gauges {
    /// Peer records held, connected or not.
    pub peers: usize,
    /// Accepted connections still in their handshake.
    pub handshakes: usize,
    /// Bytes queued towards peers that the transport allocated for what they asked (get
    /// responses, acknowledgements, the frames that carry pull data), all peers together.
    pub transmit_bytes: usize,
    /// Early eager, unexpected and request bytes buffered from peers, all peers together.
    pub buffered_bytes: usize,
    /// Peers whose connections are not being read because their transmit backlog is at its
    /// bound.
    pub peers_paused: usize,
}

/// Resources of the InfiniBand engine in use at one instant (gauges), and the provider's
/// counters. What a lost peer held — queue pairs with their credits and ring slots, transfers,
/// zone buffers, registrations — must be back once its operations have failed, so tests and
/// operators read it here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaInfo {
    /// Queue pairs open (each with its receive buffers, credits and fast-RDMA ring).
    pub queue_pairs: usize,
    /// Messages queued on connections, waiting for a credit, a ring slot or send-queue room.
    pub queued_msgs: usize,
    /// Send work requests posted and not yet retired.
    pub sends_outstanding: usize,
    /// Server-based RDMA transfers in progress.
    pub transfers: usize,
    /// Bytes of transfer units in flight or waiting for a zone buffer (the bulk scheduler's
    /// count, bounded by the per-peer and per-endpoint caps).
    pub rdma_bytes_in_flight: usize,
    /// Bytes of zone buffers held by transfers.
    pub zone_bytes_held: u64,
    /// Transfer units waiting for a zone buffer.
    pub zone_waiting: usize,
    /// Rendezvous sends and rendezvous-sent headers waiting for the peer's FIN.
    pub fin_waits: usize,
    /// Incoming requests open (delivered or being fetched, not yet replied to).
    pub open_requests: usize,
    /// The verbs provider's counters for this endpoint's device context (registrations,
    /// one-sided bytes, RNR retries where measurable...).
    pub provider: VerbsCounters,
    /// The error and retry counters of the endpoint's port (device-wide; `None` where the
    /// device does not expose one).
    pub port: PortCounters,
}

/// Registration-cache figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegcacheInfo {
    /// Entry limit.
    pub max_entries: usize,
    /// Pinned-byte limit.
    pub max_bytes: u64,
    /// Entries now.
    pub entries: usize,
    /// Pinned bytes now.
    pub pinned_bytes: u64,
    /// Lookups that found a registration.
    pub hits: u64,
    /// Lookups that had to register.
    pub misses: u64,
    /// Entries referenced right now (by transfers, staged copies, zero-copy sends; pool
    /// buffers hold one reference each while they exist).
    pub in_use: u64,
}

impl RegcacheInfo {
    /// Hits / (hits + misses), or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }
}

impl CounterSnapshot {
    /// The transfers moved by `m`: [`mech_inline`](Self::mech_inline),
    /// [`mech_fast_rdma`](Self::mech_fast_rdma) or [`mech_server_rdma`](Self::mech_server_rdma).
    pub fn by_mechanism(&self, m: Mechanism) -> u64 {
        match m {
            Mechanism::Inline => self.mech_inline,
            Mechanism::FastRdma => self.mech_fast_rdma,
            Mechanism::ServerRdma => self.mech_server_rdma,
        }
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated with relaxed atomics.
        #[derive(Debug, Default)]
        pub struct Counters { $($(#[$doc])* pub $name: AtomicU64,)* }

        /// A copy of [`Counters`] at one instant.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct CounterSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl Counters {
            /// Reads every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl CounterSnapshot {
            /// What each counter added since `earlier` (a snapshot of the same endpoint).
            pub fn since(&self, earlier: &CounterSnapshot) -> CounterSnapshot {
                CounterSnapshot { $($name: self.$name.saturating_sub(earlier.$name),)* }
            }

            /// Every counter by name, in declaration order (for reports and for carrying a
            /// snapshot across a process boundary).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }

            /// Sets the counter called `name`; false when there is none.
            pub fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $(stringify!($name) => { self.$name = value; true })*
                    _ => false,
                }
            }
        }
    };
}

counters! {
    /// Messages sent (send, send_unexpected, request, reply).
    msgs_sent,
    /// Messages received.
    msgs_received,
    /// Payload bytes sent.
    bytes_sent,
    /// Payload bytes received.
    bytes_received,
    /// Transfers moved inline / eager.
    mech_inline,
    /// Transfers moved by fast RDMA.
    mech_fast_rdma,
    /// Transfers moved by server-based RDMA / rendezvous.
    mech_server_rdma,
    /// Payload bytes the engine copied with the CPU: into or out of bounce buffers, receive
    /// buffers and ring slots, early-data buffers, staging and zone buffers. Headers and
    /// flow-control words are not payload. Zero-copy paths (RDMA straight to or from a
    /// registered buffer) add nothing.
    host_copy_bytes,
    /// Copies counted in `host_copy_bytes` (one per copy site visited: a message copied into a
    /// bounce buffer is one, a transfer unit staged through a zone buffer is one).
    host_copies,
    /// Connections established (both directions).
    connections,
    /// Connections lost (error or peer death).
    peers_lost,
    /// Protocol violations by peers.
    protocol_errors,
    /// Handshakes refused for authentication.
    auth_failures,
    /// Times a peer's connection was paused for back-pressure.
    backpressure_pauses,
    /// Bytes of streamed request payloads read aside because their pull came late (the
    /// connection had waited for it through two timer looks), so that later requests could
    /// pass: a server whose handlers often post their pulls late shows here.
    stream_bytes_parked,
    /// One-sided accesses refused (bad key, bounds, access).
    access_denied,
    /// Operations completed.
    ops_completed,
    /// Operations cancelled (locally or by deadline).
    ops_cancelled,
    /// Explicit credit messages sent.
    credit_msgs,
    /// InfiniBand work requests that failed because the peer kept answering receiver-not-ready
    /// past the RNR retry count (`RnrRetryExcErr`), counted by the engine from completions.
    /// Credits keep it at 0; retries that succeeded are in [`RdmaInfo::provider`] and
    /// [`RdmaInfo::port`] where the provider can count them.
    wc_rnr_retry_exceeded,
    /// InfiniBand work requests that failed after the transport retry count (`RetryExcErr`):
    /// the peer or the path stopped acknowledging.
    wc_retry_exceeded,
    /// InfiniBand work requests that completed with any error status other than a flush
    /// (those above included); flushes follow a queue pair's first error and are not counted.
    wc_errors,
    /// Times a busy-polling driver (wait mode `Spin`, or `Adaptive` while spinning) gave up its
    /// CPU with `sched_yield` after rounds that found nothing to do.
    spin_yields,
    /// Times a thread that waited while another drove progress was woken (by a completion, a
    /// queued message or request, a driver handing over, or its own timeout): each costs a
    /// futex call and usually a context switch.
    waiter_wakeups,
    /// Times an adaptive wait went to sleep before its spin budget had passed, because the
    /// same kind of wait on this endpoint had recently been caught by shorter spins (see
    /// [`WaitMode::Adaptive`]).
    spins_cut_short,
}

impl Counters {
    /// Adds to a counter.
    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one CPU copy of `n` payload bytes by a transport (none for zero bytes).
    #[inline]
    pub(crate) fn copied(&self, n: usize) {
        if n > 0 {
            Self::add(&self.host_copies, 1);
            Self::add(&self.host_copy_bytes, n as u64);
        }
    }

    /// Counts one transfer by mechanism.
    pub fn mechanism(&self, m: Mechanism) {
        let c = match m {
            Mechanism::Inline => &self.mech_inline,
            Mechanism::FastRdma => &self.mech_fast_rdma,
            Mechanism::ServerRdma => &self.mech_server_rdma,
        };
        Self::add(c, 1);
    }
}

//! What an endpoint tells upper layers about itself: negotiated limits and counters (the DAFS
//! "session attributes" idea), so a storage protocol can size its requests from them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::addr::{Address, Scheme};
use crate::buf::PoolStats;
use crate::comm::{Mechanism, Policy};
use crate::types::WaitMode;

/// Limits, policy and counters of an endpoint.
#[derive(Debug, Clone)]
pub struct Info {
    /// Transport.
    pub scheme: Scheme,
    /// Listening address (bound endpoints).
    pub local_addr: Option<Address>,
    /// This endpoint's random 64-bit identity (sent in handshakes).
    pub endpoint_id: u64,
    /// How `wait` waits.
    pub wait_mode: WaitMode,
    /// Largest eager (inline) message and largest unexpected message.
    pub eager_limit: usize,
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
}

/// Registration-cache figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

impl RegcacheInfo {
    /// Hits / (hits + misses), or 0 with no lookups.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }
}

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Live counters, updated with relaxed atomics.
        #[derive(Debug, Default)]
        pub struct Counters { $($(#[$doc])* pub $name: AtomicU64,)* }

        /// A copy of [`Counters`] at one instant.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct CounterSnapshot { $($(#[$doc])* pub $name: u64,)* }

        impl Counters {
            /// Reads every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
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
    /// Bytes the engine copied through its own buffers (bounce buffers, early-data buffers).
    host_copy_bytes,
    /// Copies the engine made (count).
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
    /// One-sided accesses refused (bad key, bounds, access).
    access_denied,
    /// Operations completed.
    ops_completed,
    /// Operations cancelled (locally or by deadline).
    ops_cancelled,
    /// Explicit credit messages sent.
    credit_msgs,
    /// RNR retries observed.
    rnr_retries,
}

impl Counters {
    /// Adds to a counter.
    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
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

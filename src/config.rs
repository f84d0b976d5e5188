//! Endpoint configuration: a builder with documented defaults and a `validate` step.
//!
//! Every limit here bounds memory a peer can make us use; the defaults and what they imply are
//! stated on each setter.

use std::time::Duration;

use crate::comm::Policy;
use crate::error::{Error, Result};
#[cfg(target_os = "linux")]
use crate::ib::soft::{FaultPlan, SoftHook, SoftPort};
use crate::types::{ServiceLevel, WaitMode};

/// Largest eager limit accepted: one eager message is buffered whole when it arrives early.
pub const MAX_EAGER_LIMIT: usize = 1 << 20;
/// Smallest cluster key accepted (bytes): shorter keys are guessable.
pub const MIN_CLUSTER_KEY_LEN: usize = 16;

/// Endpoint configuration. Build with chained setters:
///
/// ```
/// use ionet::{Config, WaitMode};
/// let cfg = Config::default().wait_mode(WaitMode::Spin).eager_limit(32 * 1024);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Clone)]
pub struct Config {
    pub(crate) wait_mode: WaitMode,
    pub(crate) spin_budget: Duration,
    pub(crate) progress_thread: bool,
    pub(crate) batch_sends: bool,
    pub(crate) eager_limit: Option<usize>,
    pub(crate) max_message: usize,
    pub(crate) max_header: usize,
    pub(crate) early_bytes_per_peer: usize,
    pub(crate) unexpected_per_peer: usize,
    pub(crate) requests_per_peer: usize,
    pub(crate) max_peers: usize,
    pub(crate) cluster_key: Option<Vec<u8>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) max_handshaking: usize,
    pub(crate) handshakes_per_source: usize,
    pub(crate) transmit_bytes_per_peer: usize,
    pub(crate) stall_timeout: Duration,
    pub(crate) socket_buffer: Option<usize>,
    pub(crate) tcp_notsent_lowat: Option<usize>,
    /// `None`: the stall timeout; `Some(None)`: the kernel's (none).
    pub(crate) tcp_user_timeout: Option<Option<Duration>>,
    pub(crate) tcp_congestion: Option<String>,
    pub(crate) stream_requests: bool,
    pub(crate) dscp: [u8; ServiceLevel::COUNT],
    pub(crate) so_priority: [u8; ServiceLevel::COUNT],
    pub(crate) sched_weights: [u32; ServiceLevel::COUNT],
    pub(crate) pool_max_bytes: u64,
    pub(crate) pool_cached_bytes: u64,
    pub(crate) policy: Option<Policy>,
    pub(crate) ib: IbConfig,
}

/// InfiniBand engine settings (credits, ring, queue sizes, bulk scheduling). Defaults follow
/// BMI-IB and PVFS over InfiniBand, scaled so that a server with many clients keeps its pinned memory
/// bounded: per connection ≈ 16 × 8 KiB receive buffers + 8 × 68 KiB ring slots + bounce
/// buffers ≈ 1.4 MiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbConfig {
    pub(crate) recv_buffers: u16,
    pub(crate) recv_size: u32,
    pub(crate) ring_slots: u16,
    pub(crate) max_send_wr: u32,
    pub(crate) sl: [u8; ServiceLevel::COUNT],
    pub(crate) transfer_unit: usize,
    pub(crate) min_transfer_unit: usize,
    pub(crate) peer_rdma_cap: usize,
    pub(crate) endpoint_rdma_cap: usize,
    pub(crate) zone_bytes_per_class: usize,
    pub(crate) regcache_entries: usize,
    pub(crate) regcache_bytes: usize,
    pub(crate) cancel_grace: Duration,
    // The software provider's test hooks, like the provider itself, exist on Linux only.
    #[cfg(target_os = "linux")]
    pub(crate) soft_pin_budget: Option<u64>,
    #[cfg(target_os = "linux")]
    pub(crate) soft_faults: FaultPlan,
    #[cfg(target_os = "linux")]
    pub(crate) soft_hook: Option<SoftHook>,
    #[cfg(target_os = "linux")]
    pub(crate) soft_ports: Option<Vec<SoftPort>>,
    pub(crate) list_alloc_hint: bool,
    pub(crate) cache_foreign: Option<bool>,
    pub(crate) device: Option<String>,
    pub(crate) port: Option<u8>,
    pub(crate) gid_index: Option<u8>,
    pub(crate) ack_timeout: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
}

impl Default for IbConfig {
    fn default() -> Self {
        IbConfig {
            recv_buffers: 16,
            recv_size: 8 * 1024,
            ring_slots: 8,
            max_send_wr: 256,
            sl: [2, 0, 1],
            transfer_unit: crate::comm::DEFAULT_TRANSFER_UNIT,
            min_transfer_unit: 64 * 1024,
            peer_rdma_cap: crate::comm::DEFAULT_PEER_RDMA_CAP,
            endpoint_rdma_cap: crate::comm::DEFAULT_ENDPOINT_RDMA_CAP,
            zone_bytes_per_class: 4 << 20,
            regcache_entries: crate::regcache::DEFAULT_MAX_ENTRIES,
            regcache_bytes: crate::regcache::DEFAULT_MAX_PINNED_BYTES,
            cancel_grace: Duration::from_secs(5),
            #[cfg(target_os = "linux")]
            soft_pin_budget: None,
            #[cfg(target_os = "linux")]
            soft_faults: FaultPlan::none(),
            #[cfg(target_os = "linux")]
            soft_hook: None,
            #[cfg(target_os = "linux")]
            soft_ports: None,
            list_alloc_hint: false,
            cache_foreign: None,
            device: None,
            port: None,
            gid_index: None,
            ack_timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl IbConfig {
    /// Pre-posted receive buffers per connection = credits the peer gets (default 16; BMI-IB
    /// uses 20).
    pub fn recv_buffers(mut self, n: u16) -> Self {
        self.recv_buffers = n;
        self
    }

    /// Size of each receive buffer (default 8 KiB: the inline limit plus headers).
    pub fn recv_size(mut self, n: u32) -> Self {
        self.recv_size = n;
        self
    }

    /// Fast-RDMA ring slots per connection (default 8; each holds one fast-RDMA message).
    pub fn ring_slots(mut self, n: u16) -> Self {
        self.ring_slots = n;
        self
    }

    /// Send-queue depth per queue pair (default 256).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.max_send_wr = n;
        self
    }

    /// InfiniBand service level (0..=15) of each class's queue pairs (default control 2,
    /// normal 0, bulk 1).
    pub fn service_level(mut self, class: ServiceLevel, sl: u8) -> Self {
        self.sl[class.index()] = sl;
        self
    }

    /// Largest transfer unit of server-based RDMA (default 2 MiB; a transfer is cut into units
    /// of min(this, max(total / 2, 64 KiB)) so two are in flight). On `softib://`, whose
    /// copies the host's CPU makes one after the other, units are this size: two would not
    /// overlap.
    pub fn transfer_unit(mut self, n: usize) -> Self {
        self.transfer_unit = n;
        self
    }

    /// Caps on RDMA bytes in flight per peer (default 8 MiB) and per endpoint (32 MiB).
    pub fn rdma_caps(mut self, per_peer: usize, per_endpoint: usize) -> Self {
        self.peer_rdma_cap = per_peer;
        self.endpoint_rdma_cap = per_endpoint;
        self
    }

    /// Bytes of zone buffers per size class, 64 KiB … 2 MiB (default 4 MiB each, 24 MiB in
    /// all): the server's staging memory for transfers into or out of unregistered buffers.
    pub fn zone_bytes_per_class(mut self, n: usize) -> Self {
        self.zone_bytes_per_class = n;
        self
    }

    /// Pin-down cache limits (default 1000 entries, 256 MiB).
    pub fn regcache(mut self, entries: usize, bytes: usize) -> Self {
        self.regcache_entries = entries;
        self.regcache_bytes = bytes;
        self
    }

    /// How long a cancelled transfer the peer may still be reading or writing is given to
    /// finish before its connection is torn down (default 5 s).
    pub fn cancel_grace(mut self, d: Duration) -> Self {
        self.cancel_grace = d;
        self
    }

    /// Software provider only: a pin budget in bytes, to exercise registration failures.
    #[cfg(all(feature = "soft-faults", target_os = "linux"))]
    #[doc(hidden)]
    pub fn soft_pin_budget(mut self, bytes: Option<u64>) -> Self {
        self.soft_pin_budget = bytes;
        self
    }

    /// Software provider, tests only: faults every queue pair of the endpoint starts with
    /// ([`SoftConfig::faults`](crate::ib::soft::SoftConfig::faults); default none).
    #[cfg(all(feature = "soft-faults", target_os = "linux"))]
    #[doc(hidden)]
    pub fn soft_faults(mut self, plan: FaultPlan) -> Self {
        self.soft_faults = plan;
        self
    }

    /// Software provider, tests only: a hook that receives the endpoint's device context, to
    /// inject faults into its live queue pairs and read the provider's counters.
    #[cfg(all(feature = "soft-faults", target_os = "linux"))]
    #[doc(hidden)]
    pub fn soft_hook(mut self, hook: SoftHook) -> Self {
        self.soft_hook = Some(hook);
        self
    }

    /// Software provider, tests only: the ports the endpoint's device presents (default one,
    /// [`SoftPort::from_env`]) — an Ethernet port runs the engine's RoCE path.
    #[cfg(all(feature = "soft-faults", target_os = "linux"))]
    #[doc(hidden)]
    pub fn soft_ports(mut self, ports: Vec<SoftPort>) -> Self {
        self.soft_ports = Some(ports);
        self
    }

    /// Treat the pieces of one gather / scatter list as parts of one allocation (default off):
    /// a list buffer that must be registered for the peer's RDMA is then registered as one
    /// region spanning its pieces, so the rows of one array cost one registration instead of
    /// one each (the allocation hint of PVFS over InfiniBand). The span includes the gaps between the
    /// pieces, which the peer can then reach too: enable it only for lists cut from one
    /// allocation whose gaps the peer may see.
    pub fn list_alloc_hint(mut self, on: bool) -> Self {
        self.list_alloc_hint = on;
        self
    }

    /// Whether registrations of memory the application lends (`Bytes`, `BytesMut`, lists of
    /// them) stay in the pin-down cache after the operation that registered it ends, so
    /// repeated transfers from and into the same buffers skip registration as pool buffers
    /// do, and server-based RDMA moves them directly instead of through zone buffers.
    ///
    /// By default they stay while the process's memory monitor watches their pages: it learns
    /// from the kernel (userfaultfd events) when the memory is unmapped, remapped or given
    /// back, and the cache forgets the registration before any later lookup, so a new buffer
    /// at an old address never meets an old registration. Nothing is asked of the
    /// application. Where the process may not use userfaultfd (it needs `CAP_SYS_PTRACE`,
    /// `vm.unprivileged_userfaultfd = 1` or access to `/dev/userfaultfd`), or for memory it
    /// cannot watch (file mappings are handled by the file-mapping path instead), lent memory
    /// is deregistered as soon as its operation ends.
    ///
    /// `true` keeps them without the monitor (MPI's `leave_pinned`): the application must then
    /// call [`crate::Endpoint::invalidate_registrations`] before such memory is freed or
    /// remapped, or a later buffer at the same address could be served from the old pages.
    /// `false` never keeps them.
    pub fn cache_foreign(mut self, on: bool) -> Self {
        self.cache_foreign = Some(on);
        self
    }

    /// The RDMA device to open, by name (`mlx5_0`; default: `IONET_IB_DEVICE`, else the first
    /// device). An `ib://` address's `?dev=` overrides it. `IONET_IB_DEVICE` is `name` or
    /// `name:port`, like `UCX_NET_DEVICES`, and applies to `ib://` only (`softib://` has one
    /// device).
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }

    /// The port, from 1 (default: the port of `IONET_IB_DEVICE`, else 1). Opening an endpoint
    /// fails with [`FabricError::PortNotActive`](crate::error::FabricError::PortNotActive) when it does not carry
    /// traffic. An address's `?port=` overrides it.
    pub fn port(mut self, port: u8) -> Self {
        self.port = Some(port);
        self
    }

    /// The source GID index of every route (default: none — InfiniBand ports route by LID,
    /// Ethernet (RoCE) ports pick a RoCE v2 GID of the side channel's IP family, then one of
    /// the other family, then a RoCE v1 GID, as `rdma_cm` and UCX do). Opening an endpoint
    /// fails with [`FabricError::NoSuchGid`](crate::error::FabricError::NoSuchGid) when the entry does not exist.
    /// An address's `?gid=` overrides it.
    pub fn gid_index(mut self, index: u8) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// Local ACK timeout of every queue pair, encoded as the HCA takes it: 4.096 µs · 2^n
    /// (0..=31; default 14 ≈ 67 ms; 0 = wait forever on hardware). With `retry_count` it
    /// bounds how long a dead peer goes unnoticed by the fabric.
    pub fn ack_timeout(mut self, n: u8) -> Self {
        self.ack_timeout = n;
        self
    }

    /// Transport retries before a work request fails with `RetryExcErr` (0..=7; default 7).
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    /// Retries after a receiver-not-ready NAK before `RnrRetryExcErr` (0..=7; default 7 =
    /// forever). Credit flow control means the engine never causes an RNR; a peer that does
    /// is counted in [`crate::info::CounterSnapshot::wc_rnr_retry_exceeded`] when the retries
    /// run out.
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// The RNR NAK timer this end advertises, IB encoding (0..=31; default 12 = 0.64 ms;
    /// 1 = 0.01 ms, 31 = 491.52 ms, 0 = 655.36 ms).
    pub fn min_rnr_timer(mut self, n: u8) -> Self {
        self.min_rnr_timer = n;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.port == Some(0) {
            return Err(Error::misuse("ib port numbers start at 1"));
        }
        if self.device.as_deref() == Some("") {
            return Err(Error::misuse("ib device name is empty"));
        }
        if self.ack_timeout > 31 || self.min_rnr_timer > 31 {
            return Err(Error::misuse("ib ack_timeout and min_rnr_timer are 5-bit codes (0..=31)"));
        }
        if self.retry_count > 7 || self.rnr_retry > 7 {
            return Err(Error::misuse("ib retry_count and rnr_retry are 3-bit counts (0..=7)"));
        }
        if !(2..=1024).contains(&self.recv_buffers) {
            return Err(Error::misuse("ib recv_buffers must be in 2..=1024"));
        }
        if !(4096..=1 << 20).contains(&self.recv_size) {
            return Err(Error::misuse("ib recv_size must be in 4 KiB..=1 MiB"));
        }
        if !(1..=256).contains(&self.ring_slots) {
            return Err(Error::misuse("ib ring_slots must be in 1..=256"));
        }
        if self.max_send_wr < 16 {
            return Err(Error::misuse("ib max_send_wr must be at least 16"));
        }
        if self.sl.iter().any(|&s| s > 15) {
            return Err(Error::misuse("InfiniBand service levels are 0..=15"));
        }
        if self.transfer_unit < 4096 || self.min_transfer_unit == 0 {
            return Err(Error::misuse("ib transfer units must be at least 4 KiB"));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Config")
            .field("wait_mode", &self.wait_mode)
            .field("spin_budget", &self.spin_budget)
            .field("progress_thread", &self.progress_thread)
            .field("eager_limit", &self.eager_limit)
            .field("max_message", &self.max_message)
            .field("early_bytes_per_peer", &self.early_bytes_per_peer)
            .field("unexpected_per_peer", &self.unexpected_per_peer)
            .field("requests_per_peer", &self.requests_per_peer)
            .field("max_peers", &self.max_peers)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("handshake_limits", &(self.max_handshaking, self.handshakes_per_source))
            .field("transmit_bytes_per_peer", &self.transmit_bytes_per_peer)
            .field("stall_timeout", &self.stall_timeout)
            .field("cluster_key", &self.cluster_key.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            wait_mode: WaitMode::Adaptive,
            spin_budget: Duration::from_micros(100),
            progress_thread: false,
            batch_sends: false,
            eager_limit: None,
            max_message: 64 << 20,
            max_header: 64 * 1024,
            early_bytes_per_peer: 4 << 20,
            unexpected_per_peer: 64,
            requests_per_peer: 256,
            max_peers: 1024,
            cluster_key: None,
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(5),
            max_handshaking: 128,
            handshakes_per_source: 32,
            transmit_bytes_per_peer: 4 << 20,
            stall_timeout: Duration::from_secs(30),
            socket_buffer: None,
            tcp_notsent_lowat: Some(64 << 10),
            tcp_user_timeout: None,
            tcp_congestion: None,
            stream_requests: true,
            // AF41 for control, best effort for normal, CS1 ("lower effort") for bulk.
            dscp: [34, 0, 8],
            so_priority: [6, 0, 1],
            sched_weights: [8, 4, 1],
            pool_max_bytes: 1 << 30,
            pool_cached_bytes: 256 << 20,
            policy: None,
            ib: IbConfig::default(),
        }
    }
}

impl Config {
    /// How `wait` waits (default [`WaitMode::Adaptive`]).
    pub fn wait_mode(mut self, m: WaitMode) -> Self {
        self.wait_mode = m;
        self
    }

    /// The longest `Adaptive` spins without progress before blocking (default 100 µs: twice
    /// the cost of a cross-CPU wake-up on the reference machine). The budget restarts after
    /// every progress round that did work; a wait spins less when the same kind of wait was
    /// recently caught by shorter spins, never less than a quarter of it (see
    /// [`WaitMode::Adaptive`]).
    pub fn spin_budget(mut self, d: Duration) -> Self {
        self.spin_budget = d;
        self
    }

    /// Run a background progress thread (default off: progress happens inside
    /// `test`/`wait`, BMI style). With it, posted operations advance even when no thread
    /// waits.
    pub fn progress_thread(mut self, on: bool) -> Self {
        self.progress_thread = on;
        self
    }

    /// Batch sends (default off). Off, a post writes to the socket at once, as BMI does. On,
    /// frames are written at the next progress round, so a burst of posts followed by a wait
    /// leaves in one `writev` and wakes the receiver once — several times the small-message
    /// rate, at the price that nothing moves until some thread waits, tests or runs a progress
    /// thread.
    pub fn batch_sends(mut self, on: bool) -> Self {
        self.batch_sends = on;
        self
    }

    /// Largest message sent eagerly, and the largest this end accepts unasked (eager or
    /// unexpected), advertised to peers in the handshake: a connection uses the smaller of its
    /// two ends' limits. Default on TCP: the transport's table (64 KiB, or the largest
    /// threshold of a measured table or `IONET_INLINE_MAX`), lowered to an eighth of
    /// [`Config::early_bytes_per_peer`] when that is smaller. On InfiniBand the ring slots and
    /// receive buffers set it.
    pub fn eager_limit(mut self, n: usize) -> Self {
        self.eager_limit = Some(n);
        self
    }

    /// Largest message or request payload (default 64 MiB). Larger posts fail with
    /// [`Error::TooLarge`]; a peer announcing more is a protocol violation.
    pub fn max_message(mut self, n: usize) -> Self {
        self.max_message = n;
        self
    }

    /// Largest request or reply header (default 64 KiB).
    pub fn max_header(mut self, n: usize) -> Self {
        self.max_header = n;
        self
    }

    /// Bytes of early eager and unexpected data buffered per peer before we stop reading its
    /// connections (default 4 MiB; worst-case memory is this times `max_peers`).
    pub fn early_bytes_per_peer(mut self, n: usize) -> Self {
        self.early_bytes_per_peer = n;
        self
    }

    /// Unexpected messages queued per peer before back-pressure (default 64).
    pub fn unexpected_per_peer(mut self, n: usize) -> Self {
        self.unexpected_per_peer = n;
        self
    }

    /// Incoming requests queued per peer before back-pressure (default 256).
    pub fn requests_per_peer(mut self, n: usize) -> Self {
        self.requests_per_peer = n;
        self
    }

    /// Most peers an endpoint keeps at once (default 1024); further connections are refused.
    pub fn max_peers(mut self, n: usize) -> Self {
        self.max_peers = n;
        self
    }

    /// A pre-shared cluster key (≥ 16 bytes). When set, every connection must prove it holds
    /// the same key (HMAC-SHA256 challenge-response, both directions) before any message is
    /// delivered. Default: none (no authentication).
    pub fn cluster_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.cluster_key = Some(key.into());
        self
    }

    /// Time a dialled connection may take to be established by the kernel (TCP's three-way
    /// handshake; default 10 s). The handshake that follows has [`Config::handshake_timeout`].
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Time a connection may take to complete the ionet handshake (hello, authentication),
    /// counted from when it was accepted or, when dialled, from when it was established
    /// (default 5 s). It is the one deadline for unauthenticated connections on a listener:
    /// a socket that sends nothing, or trickles, holds its slot this long at most.
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }

    /// Accepted connections in their handshake at once, in all (default 128), and silent ones
    /// from one IP address (default 32). At a limit a new connection is still admitted and an
    /// older one shed instead: at the per-address limit that address's oldest connection that
    /// has sent nothing; at the total one that has sent nothing, oldest first, else the oldest.
    /// A client sends its hello at once, so a flood of idle sockets sheds its own sockets and
    /// cannot lock clients out, while a host opening many connections at once that all talk is
    /// held to the total only. The client of a shed connection fails with
    /// [`Error::PeerLost`], saying the server refused it during the
    /// handshake.
    pub fn handshake_limits(mut self, total: usize, per_source: usize) -> Self {
        self.max_handshaking = total;
        self.handshakes_per_source = per_source;
        self
    }

    /// Bytes the transport may hold queued towards one peer for what that peer asked of it
    /// (default 4 MiB): `get` responses, acknowledgements, pull data and the frames that
    /// carry them. At the bound the endpoint stops reading that peer's connections, so a peer
    /// that sends requests but does not read the answers makes it allocate nothing more; it
    /// reads again once the backlog is written below the bound. Data of the application's own
    /// sends is the application's memory and is not counted.
    pub fn transmit_bytes_per_peer(mut self, n: usize) -> Self {
        self.transmit_bytes_per_peer = n;
        self
    }

    /// How long a peer may take nothing of what waits for it (default 30 s). Then it is
    /// dropped: its operations fail with [`Error::PeerLost`] naming the cause, and what it
    /// held is freed. Other peers are not affected. It covers the transmit backlog the
    /// transport queues itself at its bound ([`Config::transmit_bytes_per_peer`]); on `tcp://`
    /// it is also each connection's TCP user timeout unless [`Config::tcp_user_timeout`] says
    /// otherwise; over verbs (`softib://`, `ib://`) it is how long messages may wait for
    /// credits or ring slots the peer gives back none of, as a peer whose process is stopped
    /// gives none. A peer that is merely slow is not dropped: anything it takes or gives
    /// back starts the count again.
    pub fn stall_timeout(mut self, d: Duration) -> Self {
        self.stall_timeout = d;
        self
    }

    /// Kernel socket send and receive buffer size. Default: unset, so the kernel sizes them
    /// itself (receive autotuning up to `net.ipv4.tcp_rmem`'s maximum, 32 MiB on stock
    /// kernels), as iperf3 does; on loopback that streamed 1 MiB messages ~15 % faster than
    /// fixed 4 MiB buffers. Setting a size fixes both buffers (the kernel doubles it, within
    /// `net.core.{r,w}mem_max`) and turns autotuning off, e.g. to bound memory per connection.
    pub fn socket_buffer(mut self, n: usize) -> Self {
        self.socket_buffer = Some(n);
        self
    }

    /// Most bytes a TCP connection holds written but not yet sent (`TCP_NOTSENT_LOWAT`): a
    /// sender waits for the socket to become writable rather than queueing more. Default:
    /// 64 KiB; `None` leaves the kernel's setting (`net.ipv4.tcp_notsent_lowat`, no limit on
    /// stock kernels). Without a limit a large message is copied into the socket as far as the
    /// send buffer allows (`net.ipv4.tcp_wmem`'s maximum, 4 MiB on stock kernels), well ahead
    /// of the wire: the data has left the caches by the time it is sent and read, and on
    /// loopback the queued segments arrive out of order and are retransmitted.
    ///
    /// The limit does not bound the bytes in flight, which autotuning still sizes to the path;
    /// it only asks the sender to come back sooner. Raise it where a sending thread cannot be
    /// woken within the time the link takes to send it (64 KiB lasts 5 µs at 100 Gbit/s,
    /// though a NIC's queue below the socket usually covers that). Linux only; elsewhere no
    /// effect.
    pub fn tcp_notsent_lowat(mut self, bytes: Option<usize>) -> Self {
        self.tcp_notsent_lowat = bytes;
        self
    }

    /// The limit set by [`Config::tcp_notsent_lowat`], if any.
    pub fn get_tcp_notsent_lowat(&self) -> Option<usize> {
        self.tcp_notsent_lowat
    }

    /// How long a TCP connection may hold bytes its peer takes none of (`TCP_USER_TIMEOUT`)
    /// before the kernel drops it: a stopped process's full receive buffer, a host gone quiet.
    /// Its operations then fail with [`Error::PeerLost`]. Default: the stall timeout
    /// ([`Config::stall_timeout`]), so that replies, sends and pushes to a peer stopped with
    /// Ctrl-Z fail rather than wait for as long as it stays stopped, and their waiters with
    /// them; the transport's own stall rule covers only the answers it queues itself. `None`
    /// leaves the kernel's behaviour (no limit: retransmissions and zero-window probes go on
    /// for many minutes). Linux only; elsewhere no effect.
    pub fn tcp_user_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.tcp_user_timeout = Some(timeout);
        self
    }

    /// The TCP user timeout connections get ([`Config::tcp_user_timeout`]), if any.
    pub fn get_tcp_user_timeout(&self) -> Option<Duration> {
        self.tcp_user_timeout.unwrap_or(Some(self.stall_timeout)).filter(|d| !d.is_zero())
    }

    /// TCP congestion control of every connection (`TCP_CONGESTION`, e.g. `"cubic"` or
    /// `"reno"`). Default: unset, the kernel's (`net.ipv4.tcp_congestion_control`). A storage
    /// protocol's traffic is request and reply, idle between calls, and BBR paces each burst
    /// at its estimate of the path's rate: on this project's loopback test machine, whose
    /// default is BBR, a stripefs client's synchronous 2 MiB writes ran 25–50 % slower under
    /// it than under reno or cubic. A name the kernel refuses (not built, or not in
    /// `net.ipv4.tcp_allowed_congestion_control` for an unprivileged process; reno always
    /// is) leaves the kernel's choice in place and logs a warning, as does any name on macOS,
    /// which has no per-socket congestion control.
    pub fn tcp_congestion(mut self, name: impl Into<String>) -> Self {
        self.tcp_congestion = Some(name.into());
        self
    }

    /// The congestion control set by [`Config::tcp_congestion`], if any.
    pub fn get_tcp_congestion(&self) -> Option<&str> {
        self.tcp_congestion.as_deref()
    }

    /// TCP: stream a request's OUT payload right behind the request (default on), as BMI-TCP
    /// does, instead of waiting for the server's `PULL`s: a write saves a round trip, and the
    /// bytes wait in the server's socket until it posts its pulls, then are read straight
    /// into them (nothing is buffered in user space). Only towards peers that announce they
    /// read streams, and only above the inline limit. The price is head-of-line blocking: later
    /// messages of the same service level to that peer arrive after the server has pulled (or
    /// answered) the request, so a server must not wait for them before pulling. Off: every
    /// payload above the inline limit is pulled. No effect on InfiniBand.
    pub fn stream_requests(mut self, on: bool) -> Self {
        self.stream_requests = on;
        self
    }

    /// DSCP code point for a class (default control = AF41 (34), normal = 0, bulk = CS1 (8)).
    pub fn dscp(mut self, sl: ServiceLevel, dscp: u8) -> Self {
        self.dscp[sl.index()] = dscp;
        self
    }

    /// `SO_PRIORITY` for a class (default control 6, normal 0, bulk 1).
    pub fn so_priority(mut self, sl: ServiceLevel, prio: u8) -> Self {
        self.so_priority[sl.index()] = prio;
        self
    }

    /// Send-scheduler weights (default 8 : 4 : 1). Every class with a non-zero weight is served
    /// in every round, so none starves.
    pub fn scheduler_weights(mut self, w: [u32; ServiceLevel::COUNT]) -> Self {
        self.sched_weights = w;
        self
    }

    /// Limit on registered pool memory held at once, handed out or cached (default 1 GiB), and
    /// on memory kept cached for reuse (default 256 MiB). Buffers of 64 KiB and more live in
    /// 2 MiB huge-page chunks, which count whole against the first limit and go back whole (when
    /// none of their buffers is out) to honour the second.
    pub fn pool_limits(mut self, max_bytes: u64, cached_bytes: u64) -> Self {
        self.pool_max_bytes = max_bytes;
        self.pool_cached_bytes = cached_bytes;
        self
    }

    /// The mechanism table (default: [`Policy::for_scheme`]: the transport's, with the
    /// measured table `IONET_POLICY` names and `IONET_INLINE_MAX` / `IONET_FAST_MAX` applied).
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = Some(p);
        self
    }

    /// InfiniBand engine settings.
    pub fn ib(mut self, ib: IbConfig) -> Self {
        self.ib = ib;
        self
    }

    /// The wait mode in force.
    pub fn get_wait_mode(&self) -> WaitMode {
        self.wait_mode
    }

    /// The adaptive spin budget in force.
    pub fn get_spin_budget(&self) -> Duration {
        self.spin_budget
    }

    /// Checks cross-field rules; each failure names the rule.
    pub fn validate(&self) -> Result<()> {
        if let Some(e) = self.eager_limit {
            if e > MAX_EAGER_LIMIT {
                return Err(Error::misuse(format!("eager_limit {e} exceeds {MAX_EAGER_LIMIT}")));
            }
            if e > self.early_bytes_per_peer {
                return Err(Error::misuse("eager_limit must not exceed early_bytes_per_peer"));
            }
        }
        if self.max_message == 0 || self.max_message > (1 << 40) {
            return Err(Error::misuse("max_message must be in 1..=2^40"));
        }
        if self.max_header == 0 || self.max_header > (16 << 20) {
            return Err(Error::misuse("max_header must be in 1..=16 MiB"));
        }
        if self.unexpected_per_peer == 0 || self.requests_per_peer == 0 || self.max_peers == 0 {
            return Err(Error::misuse("per-peer queue limits and max_peers must be at least 1"));
        }
        if self.max_handshaking == 0 || self.handshakes_per_source == 0 {
            return Err(Error::misuse("handshake limits must be at least 1"));
        }
        if self.transmit_bytes_per_peer == 0 {
            return Err(Error::misuse("transmit_bytes_per_peer must be at least 1"));
        }
        if let Some(k) = &self.cluster_key
            && k.len() < MIN_CLUSTER_KEY_LEN
        {
            return Err(Error::misuse(format!("cluster key must be at least {MIN_CLUSTER_KEY_LEN} bytes")));
        }
        if self.dscp.iter().any(|&d| d > 63) {
            return Err(Error::misuse("DSCP values are 6 bits (0..=63)"));
        }
        self.ib.validate()?;
        if self.sched_weights.contains(&0) {
            return Err(Error::misuse("scheduler weights must be at least 1 so no class starves"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_validates_and_rules_reject() {
        assert!(Config::default().validate().is_ok());
        assert!(Config::default().eager_limit(MAX_EAGER_LIMIT + 1).validate().is_err());
        assert!(Config::default().cluster_key(b"short".to_vec()).validate().is_err());
        assert!(Config::default().cluster_key(vec![7u8; 32]).validate().is_ok());
        assert!(Config::default().dscp(ServiceLevel::Bulk, 64).validate().is_err());
        assert!(Config::default().scheduler_weights([1, 0, 1]).validate().is_err());
        assert!(Config::default().max_message(0).validate().is_err());
        for bad in [
            IbConfig::default().port(0),
            IbConfig::default().ack_timeout(32),
            IbConfig::default().min_rnr_timer(32),
            IbConfig::default().retry_count(8),
            IbConfig::default().rnr_retry(8),
            IbConfig::default().device(""),
        ] {
            assert!(Config::default().ib(bad.clone()).validate().is_err(), "{bad:?}");
        }
        let ok = IbConfig::default().device("mlx5_0").port(2).gid_index(3).ack_timeout(31).rnr_retry(7);
        assert!(Config::default().ib(ok).validate().is_ok());
    }

    #[test]
    fn debug_never_prints_the_key() {
        let s = format!("{:?}", Config::default().cluster_key(b"supersecretclusterkey".to_vec()));
        assert!(!s.contains("supersecret"));
    }
}

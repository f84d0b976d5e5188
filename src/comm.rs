//! The communication manager: which mechanism moves a transfer.
//!
//! Three mechanisms, after "PVFS over InfiniBand" (Wu, Wyckoff, Panda):
//!
//! | mechanism | InfiniBand | TCP |
//! |---|---|---|
//! | [`Mechanism::Inline`] | copy into a pre-registered buffer, SEND (device inline when tiny) | eager: header and data in one `writev` |
//! | [`Mechanism::FastRdma`] | RDMA_WRITE_WITH_IMM into the peer's per-connection ring | (not available; treated as inline) |
//! | [`Mechanism::ServerRdma`] | the server moves data with RDMA_READ / RDMA_WRITE through zone buffers | rendezvous: the body flows only when the receiver asks, straight into its buffer |
//!
//! The choice depends on the size, the service level (each has its own thresholds), and on
//! InfiniBand also on free credits / ring slots and whether the buffer is already registered.
//! This module is sans-IO: [`Policy::choose`] is a pure function of its inputs.

use std::fmt;

use crate::addr::Scheme;
use crate::types::ServiceLevel;

/// How a transfer's bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mechanism {
    /// Data travels with the message header (IB: SEND from a bounce buffer; TCP: eager).
    Inline,
    /// IB only: RDMA_WRITE_WITH_IMM into the peer's fast-RDMA ring.
    FastRdma,
    /// The receiver (the server, for request payloads) pulls or pushes the data when it is
    /// ready: RDMA_READ / RDMA_WRITE on IB, rendezvous on TCP.
    ServerRdma,
}

impl Mechanism {
    /// All mechanisms, cheapest first.
    pub const ALL: [Mechanism; 3] = [Mechanism::Inline, Mechanism::FastRdma, Mechanism::ServerRdma];

    /// Dense index for counters.
    pub fn index(self) -> usize {
        match self {
            Mechanism::Inline => 0,
            Mechanism::FastRdma => 1,
            Mechanism::ServerRdma => 2,
        }
    }

    /// Name, as the paper uses it.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Inline => "inline",
            Mechanism::FastRdma => "fast-rdma",
            Mechanism::ServerRdma => "server-rdma",
        }
    }

    /// Name on a given transport (TCP calls them eager and rendezvous).
    pub fn name_on(self, scheme: Scheme) -> &'static str {
        match (scheme, self) {
            (Scheme::Tcp, Mechanism::Inline | Mechanism::FastRdma) => "eager",
            (Scheme::Tcp, Mechanism::ServerRdma) => "rendezvous",
            _ => self.name(),
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mechanism {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "inline" | "eager" => Ok(Mechanism::Inline),
            "fast" | "fast-rdma" => Ok(Mechanism::FastRdma),
            "server" | "server-rdma" | "rendezvous" => Ok(Mechanism::ServerRdma),
            _ => Err(format!("unknown mechanism {s:?} (inline, fast-rdma, server-rdma)")),
        }
    }
}

/// Size thresholds for one service level: `len <= inline_max` → inline,
/// `len <= fast_max` → fast RDMA, above → server-based RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Largest transfer sent inline.
    pub inline_max: usize,
    /// Largest transfer sent by fast RDMA (ignored where fast RDMA does not exist).
    pub fast_max: usize,
}

/// What the engine knows about the transfer besides its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Conditions {
    /// A send credit (pre-posted receive buffer at the peer) is available.
    pub credit_available: bool,
    /// A fast-RDMA ring slot at the peer is free.
    pub fast_slot_available: bool,
    /// The fast-RDMA path exists on this connection (IB only).
    pub fast_path: bool,
}

impl Conditions {
    /// Everything available (TCP, or an idle IB connection).
    pub fn idle(fast_path: bool) -> Self {
        Conditions { credit_available: true, fast_slot_available: true, fast_path }
    }
}

/// The decision table: thresholds per service level, and an optional forced mechanism for
/// experiments (`ionet-perf --mechanism`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    per_sl: [Thresholds; ServiceLevel::COUNT],
    forced: Option<Mechanism>,
    origin: Origin,
}

/// Where a threshold in force came from (`ionet-perf --show-policy` prints it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// The transport's default table.
    TransportDefault,
    /// `IONET_INLINE_MAX` / `IONET_FAST_MAX` (what `ionet-perf calibrate` recommends for a host).
    Environment,
    /// The measured table in the file `IONET_POLICY` names (`ionet-perf calibrate
    /// --write-policy`): thresholds per transport and service level, measured on the host.
    MeasuredTable,
    /// The application: [`Policy::set`], or [`crate::Config::eager_limit`].
    Application,
    /// Lowered to what the receiver buffers: on TCP a fraction of
    /// [`crate::Config::early_bytes_per_peer`], on InfiniBand the receive buffers and ring
    /// slots.
    ReceiveBudget,
}

impl Origin {
    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            Origin::TransportDefault => "the transport's default",
            Origin::Environment => "IONET_INLINE_MAX / IONET_FAST_MAX",
            Origin::MeasuredTable => "the measured table IONET_POLICY names",
            Origin::Application => "set by the application",
            Origin::ReceiveBudget => "what the receiver buffers",
        }
    }
}

/// Default inline limit on InfiniBand: a SEND from a pre-registered buffer (device-inline when
/// tiny) is the cheapest way to move a few KiB, and every byte of it costs a receive buffer.
pub const IB_INLINE_MAX: usize = 4 * 1024;
/// Default fast-RDMA limit on InfiniBand: the ring slots every connection pins are this large.
pub const IB_FAST_MAX: usize = 64 * 1024;
/// Default eager limit on TCP. Rendezvous costs the sender a round trip before the body
/// moves, while an eager body costs the receiver one copy out of its early buffers; a 64 KiB
/// copy takes a few microseconds, less than a round trip even on loopback (where each extra
/// message also costs a wake-up), so below this eager wins. Above it the copy grows while the
/// round trip does not, and eager bodies would crowd the receiver's early-data budget.
pub const TCP_EAGER_MAX: usize = 64 * 1024;

/// The environment variable naming a measured table (see [`Policy::apply_table`]).
pub const POLICY_FILE_ENV: &str = "IONET_POLICY";

impl Policy {
    /// The defaults for a transport; then the measured table of the file `IONET_POLICY` names,
    /// when set ([`Policy::apply_table`]); then `IONET_INLINE_MAX` / `IONET_FAST_MAX` when set
    /// (applied to every service level). A table that cannot be read is ignored with a warning.
    pub fn for_scheme(scheme: Scheme) -> Self {
        let mut p = Self::defaults(scheme);
        if let Some(path) = std::env::var_os(POLICY_FILE_ENV) {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    p.apply_table(scheme, &text);
                }
                Err(e) => {
                    tracing::warn!(path = %std::path::Path::new(&path).display(), error = %e, "ignoring the measured table")
                }
            }
        }
        p.apply_env(|k| std::env::var(k).ok());
        p
    }

    /// The transport's default table, whatever the environment says.
    fn defaults(scheme: Scheme) -> Self {
        let t = match scheme {
            Scheme::Tcp => Thresholds { inline_max: TCP_EAGER_MAX, fast_max: TCP_EAGER_MAX },
            Scheme::SoftIb | Scheme::Ib => Thresholds { inline_max: IB_INLINE_MAX, fast_max: IB_FAST_MAX },
        };
        Policy { per_sl: [t; ServiceLevel::COUNT], forced: None, origin: Origin::TransportDefault }
    }

    /// Applies the lines of a measured table that are for `scheme`, and returns how many
    /// service levels they set. One line per transport and service level:
    ///
    /// ```text
    /// # comments and blank lines are skipped
    /// softib control inline_max=4k fast_max=64k
    /// softib bulk    inline_max=1k fast_max=16k
    /// tcp    normal  inline_max=64k
    /// ```
    ///
    /// `fast_max` may be left out (it is then `inline_max`; TCP has no fast path). Lines for
    /// other transports are skipped; malformed lines are ignored with a warning, so a table
    /// from a newer release does not stop an endpoint from starting.
    pub fn apply_table(&mut self, scheme: Scheme, text: &str) -> usize {
        let mut set = 0;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            match parse_table_line(line) {
                Some((s, sl, t)) if s == scheme => {
                    self.per_sl[sl.index()] = t;
                    self.origin = Origin::MeasuredTable;
                    set += 1;
                }
                Some(_) => {}
                None => tracing::warn!(
                    line = n + 1,
                    text = line,
                    "ignoring a malformed line of the measured table"
                ),
            }
        }
        set
    }

    /// Where the thresholds came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Applies `IONET_INLINE_MAX` / `IONET_FAST_MAX` read through `get` (sizes accept `k`/`m`
    /// suffixes: `8k`, `1m`). Malformed values are ignored with a warning.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) {
        for (var, is_inline) in [("IONET_INLINE_MAX", true), ("IONET_FAST_MAX", false)] {
            let Some(v) = get(var) else { continue };
            match parse_size(&v) {
                Some(n) => {
                    self.origin = Origin::Environment;
                    for t in &mut self.per_sl {
                        if is_inline {
                            t.inline_max = n;
                            t.fast_max = t.fast_max.max(n);
                        } else {
                            t.fast_max = n.max(t.inline_max);
                        }
                    }
                }
                None => tracing::warn!(var, value = %v, "ignoring malformed size"),
            }
        }
    }

    /// Overrides the thresholds of one service level.
    pub fn set(&mut self, sl: ServiceLevel, t: Thresholds) -> &mut Self {
        self.origin = Origin::Application;
        self.per_sl[sl.index()] =
            Thresholds { inline_max: t.inline_max, fast_max: t.fast_max.max(t.inline_max) };
        self
    }

    /// Lowers one service level's thresholds to what the transport can carry, keeping their
    /// origin (the application did not choose the cap).
    pub(crate) fn cap(&mut self, sl: ServiceLevel, t: Thresholds) {
        let origin = self.origin;
        self.set(sl, t);
        self.origin = origin;
    }

    /// Thresholds of one service level.
    pub fn thresholds(&self, sl: ServiceLevel) -> Thresholds {
        self.per_sl[sl.index()]
    }

    /// Forces one mechanism (experiments); `None` restores the table. It applies to every
    /// transfer the mechanism can carry: an empty transfer, a fast-RDMA transfer without a
    /// fast path to the peer, or one too large for the peer's receive buffers or ring slots
    /// still goes by a mechanism that can carry it. [`crate::Completion::mechanism`] and the
    /// `mech_*` counters of [`crate::Info`] say which one was used.
    pub fn force(&mut self, m: Option<Mechanism>) -> &mut Self {
        self.forced = m;
        self
    }

    /// The forced mechanism, if any.
    pub fn forced(&self) -> Option<Mechanism> {
        self.forced
    }

    /// Chooses the mechanism for a transfer of `len` bytes.
    ///
    /// Fast RDMA needs a free ring slot; when none is free a transfer that would have used it
    /// goes by server-based RDMA instead of waiting (it is large enough for the extra round
    /// trip not to dominate). Inline waits for a credit instead: it is the only mechanism
    /// small messages can use cheaply.
    pub fn choose(&self, len: usize, sl: ServiceLevel, c: Conditions) -> Mechanism {
        // A forced mechanism moves data; an empty transfer has none to move (server-based RDMA
        // of nothing would announce an empty segment list, which peers rightly refuse).
        if let Some(m) = self.forced
            && len > 0
        {
            return if m == Mechanism::FastRdma && !c.fast_path { Mechanism::Inline } else { m };
        }
        let t = self.per_sl[sl.index()];
        if len <= t.inline_max {
            Mechanism::Inline
        } else if c.fast_path && len <= t.fast_max && c.fast_slot_available {
            Mechanism::FastRdma
        } else {
            Mechanism::ServerRdma
        }
    }

    /// The table as text (`ionet-perf --show-policy`).
    pub fn table(&self, scheme: Scheme) -> String {
        let mut s =
            format!("{:<8} {:>12} {:>12}  mechanisms ({scheme})\n", "class", "inline_max", "fast_max");
        for sl in ServiceLevel::ALL {
            let t = self.thresholds(sl);
            let fast = if scheme == Scheme::Tcp { "-".to_string() } else { t.fast_max.to_string() };
            s.push_str(&format!(
                "{:<8} {:>12} {:>12}  {} / {} / {}\n",
                sl.name(),
                t.inline_max,
                fast,
                Mechanism::Inline.name_on(scheme),
                if scheme == Scheme::Tcp { "-" } else { Mechanism::FastRdma.name() },
                Mechanism::ServerRdma.name_on(scheme)
            ));
        }
        if let Some(m) = self.forced {
            s.push_str(&format!("forced: {}\n", m.name_on(scheme)));
        }
        s
    }
}

/// One line of a measured table: `<transport> <service level> inline_max=<size> [fast_max=<size>]`.
fn parse_table_line(line: &str) -> Option<(Scheme, ServiceLevel, Thresholds)> {
    let mut words = line.split_whitespace();
    let scheme: Scheme = words.next()?.parse().ok()?;
    let sl_name = words.next()?;
    let sl = ServiceLevel::ALL.into_iter().find(|sl| sl.name().eq_ignore_ascii_case(sl_name))?;
    let (mut inline_max, mut fast_max) = (None, None);
    for w in words {
        let (key, value) = w.split_once('=')?;
        let slot = match key {
            "inline_max" => &mut inline_max,
            "fast_max" => &mut fast_max,
            _ => return None,
        };
        if slot.replace(parse_size(value)?).is_some() {
            return None;
        }
    }
    let inline_max = inline_max?;
    Some((scheme, sl, Thresholds { inline_max, fast_max: fast_max.unwrap_or(inline_max).max(inline_max) }))
}

/// Parses `4096`, `4k`, `64K`, `1m`, `2MiB`.
pub(crate) fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.strip_suffix("ib").or_else(|| s.strip_suffix('b')).unwrap_or(&s);
    let (num, mult) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1usize << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The InfiniBand defaults, whatever the environment of the test run says.
    fn ib() -> Policy {
        Policy::defaults(Scheme::Ib)
    }

    #[test]
    fn thresholds_pick_each_mechanism_at_the_boundaries() {
        let p = ib();
        let c = Conditions::idle(true);
        let sl = ServiceLevel::Normal;
        assert_eq!(p.choose(0, sl, c), Mechanism::Inline);
        assert_eq!(p.choose(IB_INLINE_MAX, sl, c), Mechanism::Inline);
        assert_eq!(p.choose(IB_INLINE_MAX + 1, sl, c), Mechanism::FastRdma);
        assert_eq!(p.choose(IB_FAST_MAX, sl, c), Mechanism::FastRdma);
        assert_eq!(p.choose(IB_FAST_MAX + 1, sl, c), Mechanism::ServerRdma);
    }

    #[test]
    fn no_fast_slot_or_no_fast_path_falls_back_to_server_rdma() {
        let p = ib();
        let busy = Conditions { credit_available: true, fast_slot_available: false, fast_path: true };
        assert_eq!(p.choose(8192, ServiceLevel::Normal, busy), Mechanism::ServerRdma);
        assert_eq!(p.choose(8192, ServiceLevel::Normal, Conditions::idle(false)), Mechanism::ServerRdma);
    }

    #[test]
    fn per_service_level_overrides_apply_only_to_their_level() {
        let mut p = ib();
        p.set(ServiceLevel::Control, Thresholds { inline_max: 16 * 1024, fast_max: 0 });
        let c = Conditions::idle(true);
        assert_eq!(p.choose(10_000, ServiceLevel::Control, c), Mechanism::Inline);
        assert_eq!(p.choose(10_000, ServiceLevel::Bulk, c), Mechanism::FastRdma);
    }

    #[test]
    fn the_policy_says_where_its_thresholds_came_from() {
        let mut p = ib();
        assert_eq!(p.origin(), Origin::TransportDefault);
        p.apply_env(|k| (k == "IONET_FAST_MAX").then(|| "garbage".into()));
        assert_eq!(p.origin(), Origin::TransportDefault, "a malformed value changes nothing");
        p.cap(ServiceLevel::Bulk, Thresholds { inline_max: 1024, fast_max: 1024 });
        assert_eq!(p.origin(), Origin::TransportDefault, "a transport's cap is not a choice");
        p.apply_env(|k| (k == "IONET_INLINE_MAX").then(|| "8k".into()));
        assert_eq!(p.origin(), Origin::Environment);
        p.set(ServiceLevel::Bulk, Thresholds { inline_max: 1024, fast_max: 1024 });
        assert_eq!(p.origin(), Origin::Application);
    }

    #[test]
    fn env_overrides_and_forcing() {
        let mut p = ib();
        p.apply_env(|k| match k {
            "IONET_INLINE_MAX" => Some("8k".into()),
            "IONET_FAST_MAX" => Some("1m".into()),
            _ => None,
        });
        assert_eq!(p.thresholds(ServiceLevel::Bulk), Thresholds { inline_max: 8192, fast_max: 1 << 20 });
        p.apply_env(|k| (k == "IONET_FAST_MAX").then(|| "garbage".into()));
        assert_eq!(p.thresholds(ServiceLevel::Bulk).fast_max, 1 << 20);
        p.force(Some(Mechanism::ServerRdma));
        assert_eq!(p.choose(1, ServiceLevel::Normal, Conditions::idle(true)), Mechanism::ServerRdma);
        p.force(Some(Mechanism::FastRdma));
        assert_eq!(p.choose(1, ServiceLevel::Normal, Conditions::idle(false)), Mechanism::Inline);
    }

    #[test]
    fn forcing_leaves_empty_transfers_inline() {
        let mut p = ib();
        for m in Mechanism::ALL {
            p.force(Some(m));
            assert_eq!(p.choose(0, ServiceLevel::Normal, Conditions::idle(true)), Mechanism::Inline);
            assert_eq!(p.choose(1, ServiceLevel::Normal, Conditions::idle(true)), m);
        }
    }

    #[test]
    fn tcp_has_no_fast_path() {
        let mut p = Policy::for_scheme(Scheme::Tcp);
        p.apply_env(|_| None);
        let c = Conditions::idle(false);
        assert_eq!(p.choose(TCP_EAGER_MAX, ServiceLevel::Normal, c), Mechanism::Inline);
        assert_eq!(p.choose(TCP_EAGER_MAX + 1, ServiceLevel::Normal, c), Mechanism::ServerRdma);
        assert!(p.table(Scheme::Tcp).contains("rendezvous"));
    }

    #[test]
    fn a_measured_table_sets_its_transports_service_levels() {
        let table = "\
# measured on a test host
softib control inline_max=2k fast_max=32k
softib bulk inline_max=1k fast_max=128k  # streaming
tcp normal inline_max=256k
softib normal inline_max=8k fast_max=4k
softib normal inline_max=1k fast_max=2k extra=1
softib normal inline_max=1k inline_max=2k
softib nobody inline_max=1k
quic control inline_max=1k
";
        let mut p = ib();
        assert_eq!(p.apply_table(Scheme::SoftIb, table), 3);
        assert_eq!(p.origin(), Origin::MeasuredTable);
        assert_eq!(p.thresholds(ServiceLevel::Control), Thresholds { inline_max: 2048, fast_max: 32 << 10 });
        assert_eq!(p.thresholds(ServiceLevel::Bulk), Thresholds { inline_max: 1024, fast_max: 128 << 10 });
        // fast_max is never below inline_max; malformed lines after it change nothing.
        assert_eq!(p.thresholds(ServiceLevel::Normal), Thresholds { inline_max: 8192, fast_max: 8192 });
        let mut t = Policy::defaults(Scheme::Tcp);
        assert_eq!(t.apply_table(Scheme::Tcp, table), 1);
        assert_eq!(t.thresholds(ServiceLevel::Normal).inline_max, 256 << 10);
        assert_eq!(t.thresholds(ServiceLevel::Bulk).inline_max, TCP_EAGER_MAX, "not in the table");
        // A table with nothing for the transport leaves the defaults and their origin.
        let mut i = Policy::defaults(Scheme::Ib);
        assert_eq!(i.apply_table(Scheme::Ib, table), 0);
        assert_eq!(i.origin(), Origin::TransportDefault);
        assert_eq!(i, Policy::defaults(Scheme::Ib));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}

/// Default largest transfer unit of server-based RDMA (2 MiB, as PVFS over InfiniBand found best).
pub const DEFAULT_TRANSFER_UNIT: usize = 2 << 20;
/// Default cap on RDMA bytes outstanding per peer (hot-spot control).
pub const DEFAULT_PEER_RDMA_CAP: usize = 8 << 20;
/// Default cap on RDMA bytes outstanding per endpoint.
pub const DEFAULT_ENDPOINT_RDMA_CAP: usize = 32 << 20;

/// Bulk-transfer scheduling for server-based RDMA (sans-IO), for the InfiniBand engine (built
/// on Linux only).
///
/// Every large transfer is cut into units of `min(max_unit, max(total / 2, min_unit))` — at
/// least two per transfer, so one unit moves while the next is set up (double buffering) —
/// and units go out round-robin among the active transfers, while the bytes in flight stay
/// under a cap per peer and a cap for the endpoint. A client that issues huge transfers thus
/// cannot monopolise the server's RDMA engine or a peer's link (hot-spot control).
#[derive(Debug)]
#[cfg(any(target_os = "linux", test))]
pub(crate) struct BulkScheduler<K> {
    max_unit: usize,
    min_unit: usize,
    peer_cap: usize,
    total_cap: usize,
    active: std::collections::VecDeque<Transfer<K>>,
    in_flight_total: usize,
    in_flight: std::collections::HashMap<crate::types::PeerId, usize>,
}

#[derive(Debug)]
#[cfg(any(target_os = "linux", test))]
struct Transfer<K> {
    key: K,
    peer: crate::types::PeerId,
    next: usize,
    total: usize,
    unit: usize,
}

/// A unit the engine should post now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg(any(target_os = "linux", test))]
pub(crate) struct Unit<K> {
    /// The transfer it belongs to.
    pub key: K,
    /// Offset within the transfer.
    pub offset: usize,
    /// Length.
    pub len: usize,
    /// True for the transfer's last unit.
    pub last: bool,
}

#[cfg(any(target_os = "linux", test))]
impl<K: Clone + PartialEq> BulkScheduler<K> {
    /// A scheduler with the given unit limit and caps (`min_unit` ≤ `max_unit`).
    pub fn new(max_unit: usize, min_unit: usize, peer_cap: usize, total_cap: usize) -> Self {
        let max_unit = max_unit.max(1);
        BulkScheduler {
            max_unit,
            min_unit: min_unit.clamp(1, max_unit),
            peer_cap: peer_cap.max(max_unit),
            total_cap: total_cap.max(max_unit),
            active: std::collections::VecDeque::new(),
            in_flight_total: 0,
            in_flight: std::collections::HashMap::new(),
        }
    }

    /// The unit size used for a transfer of `total` bytes.
    pub fn unit_for(&self, total: usize) -> usize {
        (total / 2).max(self.min_unit).min(self.max_unit).max(1)
    }

    /// Adds a transfer of `total` bytes for `peer`.
    pub fn add(&mut self, key: K, peer: crate::types::PeerId, total: usize) {
        if total == 0 {
            return;
        }
        let unit = self.unit_for(total);
        self.active.push_back(Transfer { key, peer, next: 0, total, unit });
    }

    /// The next unit allowed out, round-robin among transfers, within the caps.
    pub fn next_unit(&mut self) -> Option<Unit<K>> {
        for _ in 0..self.active.len() {
            let mut t = self.active.pop_front()?;
            let len = t.unit.min(t.total - t.next);
            let peer_now = self.in_flight.get(&t.peer).copied().unwrap_or(0);
            // A transfer may always have one unit out when nothing else of its peer is.
            let fits = (peer_now == 0 || peer_now + len <= self.peer_cap)
                && (self.in_flight_total == 0 || self.in_flight_total + len <= self.total_cap);
            if !fits {
                self.active.push_back(t);
                continue;
            }
            let unit = Unit { key: t.key.clone(), offset: t.next, len, last: t.next + len == t.total };
            t.next += len;
            *self.in_flight.entry(t.peer).or_default() += len;
            self.in_flight_total += len;
            if t.next < t.total {
                self.active.push_back(t);
            }
            return Some(unit);
        }
        None
    }

    /// A unit of `len` bytes for `peer` finished (or failed).
    pub fn unit_done(&mut self, peer: crate::types::PeerId, len: usize) {
        self.in_flight_total = self.in_flight_total.saturating_sub(len);
        if let Some(v) = self.in_flight.get_mut(&peer) {
            *v = v.saturating_sub(len);
            if *v == 0 {
                self.in_flight.remove(&peer);
            }
        }
    }

    /// Drops a transfer's remaining units (cancelled or its peer lost).
    #[cfg(target_os = "linux")]
    pub fn remove(&mut self, key: &K) {
        self.active.retain(|t| &t.key != key);
    }

    /// Bytes in flight for a peer.
    #[cfg(test)]
    pub fn in_flight(&self, peer: crate::types::PeerId) -> usize {
        self.in_flight.get(&peer).copied().unwrap_or(0)
    }

    /// Bytes in flight in total.
    pub fn in_flight_total(&self) -> usize {
        self.in_flight_total
    }
}

#[cfg(test)]
mod bulk_tests {
    use super::*;
    use crate::types::PeerId;

    #[test]
    fn units_are_half_the_transfer_up_to_the_limit() {
        let s: BulkScheduler<u32> = BulkScheduler::new(2 << 20, 64 << 10, 8 << 20, 32 << 20);
        assert_eq!(s.unit_for(32 << 20), 2 << 20);
        assert_eq!(s.unit_for(1 << 20), 512 << 10);
        assert_eq!(s.unit_for(100 << 10), 64 << 10);
    }

    #[test]
    fn units_cover_the_transfer_exactly_and_the_last_is_marked() {
        let mut s = BulkScheduler::new(1000, 100, 1 << 30, 1 << 30);
        s.add(1u32, PeerId(0), 2500);
        let mut got = Vec::new();
        while let Some(u) = s.next_unit() {
            s.unit_done(PeerId(0), u.len);
            got.push((u.offset, u.len, u.last));
        }
        assert_eq!(got, vec![(0, 1000, false), (1000, 1000, false), (2000, 500, true)]);
    }

    #[test]
    fn round_robin_between_transfers() {
        let mut s = BulkScheduler::new(100, 100, 1 << 30, 1 << 30);
        s.add('a', PeerId(0), 300);
        s.add('b', PeerId(1), 300);
        let order: Vec<char> = std::iter::from_fn(|| s.next_unit().map(|u| u.key)).collect();
        assert_eq!(order, vec!['a', 'b', 'a', 'b', 'a', 'b']);
    }

    #[test]
    fn caps_bound_bytes_in_flight_per_peer_and_in_total() {
        let mut s = BulkScheduler::new(100, 100, 200, 300);
        s.add(1, PeerId(0), 1000);
        s.add(2, PeerId(0), 1000);
        s.add(3, PeerId(1), 1000);
        let mut out = Vec::new();
        while let Some(u) = s.next_unit() {
            out.push(u);
        }
        assert_eq!(s.in_flight(PeerId(0)), 200, "peer cap");
        assert!(s.in_flight_total() <= 300, "endpoint cap");
        assert_eq!(out.len(), 3);
        // Completing a unit lets the next one out.
        s.unit_done(PeerId(0), 100);
        assert!(s.next_unit().is_some());
    }

    #[test]
    fn a_unit_larger_than_the_cap_still_goes_alone() {
        let mut s = BulkScheduler::new(1000, 1000, 10, 10);
        s.add(1, PeerId(0), 3000);
        let u = s.next_unit().expect("one unit may always go");
        assert!(s.next_unit().is_none());
        s.unit_done(PeerId(0), u.len);
        assert!(s.next_unit().is_some());
    }
}

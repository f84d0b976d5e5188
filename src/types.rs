//! Small value types shared by every module: service levels, tags, peer and operation ids,
//! wait modes and access rights.

use std::fmt;

/// A message tag. Receives match on (peer, tag); tags are opaque to the transport.
pub type Tag = u64;

/// A priority class carried by every message.
///
/// Each class gets its own connection (TCP) or queue pair (InfiniBand), marked with its own
/// DSCP / `SO_PRIORITY` or IB service level, and the send scheduler drains higher classes
/// first without starving lower ones. Matching is FIFO per (peer, class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u8)]
pub enum ServiceLevel {
    /// Small latency-critical messages: requests, acknowledgements, metadata.
    Control = 0,
    /// Everything else (the default).
    #[default]
    Normal = 1,
    /// Bulk data that should yield to the other classes.
    Bulk = 2,
}

impl ServiceLevel {
    /// Number of classes.
    pub const COUNT: usize = 3;
    /// All classes, highest priority first.
    pub const ALL: [ServiceLevel; Self::COUNT] =
        [ServiceLevel::Control, ServiceLevel::Normal, ServiceLevel::Bulk];

    /// Dense index 0..COUNT (0 = highest priority).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The class for a wire value.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(ServiceLevel::Control),
            1 => Some(ServiceLevel::Normal),
            2 => Some(ServiceLevel::Bulk),
            _ => None,
        }
    }

    /// Lower-case name, as used in configuration and reports.
    pub fn name(self) -> &'static str {
        match self {
            ServiceLevel::Control => "control",
            ServiceLevel::Normal => "normal",
            ServiceLevel::Bulk => "bulk",
        }
    }
}

impl fmt::Display for ServiceLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A peer known to an endpoint. A peer the application connected to keeps its id for the
/// endpoint's lifetime, across reconnections. A peer that connected to us keeps its id while
/// it is connected (a reconnection that overlaps the old connection keeps it too); once its
/// connections are gone and none of its unexpected messages wait to be read, it is forgotten,
/// operations naming the old id fail with [`crate::Error::PeerLost`], and if it connects again
/// it gets a new id. Ids are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub(crate) u64);

impl PeerId {
    /// The raw value (for logs and tables).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer#{}", self.0)
    }
}

/// An operation posted on an endpoint. Completes exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub(crate) u64);

impl OpId {
    /// The raw id.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op#{}", self.0)
    }
}

/// How a thread waits for progress.
///
/// On this project's reference machine a blocking cross-CPU wake-up costs about 50 µs, so
/// `Spin` gives the lowest latency at the price of a busy core; `Adaptive` spins while the
/// transport is making progress and blocks once a budget passes without any.
///
/// `Adaptive` spins through gaps that recent waits of the same kind (waits for the caller's
/// own operations, or for what peers send next) needed: twice the longest gap spinning caught
/// in the last 20 to 40 ms, between a quarter of the budget and the whole budget. A TCP
/// receiver gains from that (it keeps draining its socket through a stream), and so does a
/// synchronous request of up to the budget. A sender that keeps many messages in flight over
/// RDMA, which finds most completions at once and then waits long for the receiver's next
/// batch, sleeps soon into each long wait instead of spinning the whole budget first. A
/// program that would rather never spin waits with `Block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitMode {
    /// Busy-poll the transport until the operation completes.
    Spin,
    /// Sleep in the kernel (epoll / completion channel) until something happens.
    Block,
    /// Spin, then block once the learnt spin (at most [`crate::Config::spin_budget`]) has
    /// passed since the last progress round that did work (moved bytes or completed
    /// something): a thread polls through a transfer that is streaming in and sleeps when its
    /// peers go quiet.
    #[default]
    Adaptive,
}

impl WaitMode {
    /// Lower-case name for reports.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Spin => "spin",
            WaitMode::Block => "block",
            WaitMode::Adaptive => "adaptive",
        }
    }
}

/// Wait mode names on a command line (`--wait spin`), for tools built on clap (feature `clap`).
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
impl clap::ValueEnum for WaitMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[WaitMode::Spin, WaitMode::Block, WaitMode::Adaptive]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl std::str::FromStr for WaitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spin" => Ok(WaitMode::Spin),
            "block" => Ok(WaitMode::Block),
            "adaptive" => Ok(WaitMode::Adaptive),
            _ => Err(format!("unknown wait mode {s:?} (spin, block, adaptive)")),
        }
    }
}

/// Access rights granted by an exposure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// Peers may read (`get`, RDMA_READ).
    pub const READ: Access = Access(1);
    /// Peers may write (`put`, RDMA_WRITE).
    pub const WRITE: Access = Access(2);
    /// Both.
    pub const READ_WRITE: Access = Access(3);

    /// True when every right in `other` is granted.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Raw bits (wire form).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; unknown bits are rejected.
    pub fn from_bits(b: u8) -> Option<Self> {
        (b & !3 == 0 && b != 0).then_some(Access(b))
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_levels_round_trip_and_order() {
        for sl in ServiceLevel::ALL {
            assert_eq!(ServiceLevel::from_u8(sl as u8), Some(sl));
        }
        assert_eq!(ServiceLevel::from_u8(3), None);
        assert!(ServiceLevel::Control < ServiceLevel::Bulk);
    }

    #[test]
    fn access_rights() {
        let rw = Access::READ | Access::WRITE;
        assert!(rw.contains(Access::READ) && rw.contains(Access::WRITE));
        assert!(!Access::READ.contains(Access::WRITE));
        assert_eq!(Access::from_bits(0), None);
        assert_eq!(Access::from_bits(4), None);
        assert_eq!(Access::from_bits(3), Some(Access::READ_WRITE));
    }
}

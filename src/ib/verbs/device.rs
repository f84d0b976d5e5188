//! What a provider reports about its devices and ports: names, limits, port state, link layer
//! and global identifiers.

use std::fmt;

use super::Mtu;
#[cfg(doc)]
use super::{QueuePair, RtrAttr};

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// Native InfiniBand: LID routing, GRH optional.
    InfiniBand,
    /// RoCE: addressing by GID (a `gid_index` is required in [`RtrAttr`]).
    Ethernet,
    /// Unknown / software.
    Unspecified,
}

/// A 128-bit global identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID: what an empty table entry reads as.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), the form a RoCE v2 GID of
    /// an IPv4 interface takes.
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.0).to_ipv4_mapped()
    }

    /// Whether a peer may name this GID as the destination of a global route: not zero (an
    /// empty table entry) and not multicast (`ff00::/8`; RC traffic is unicast).
    pub fn is_unicast(&self) -> bool {
        !self.is_zero() && self.0[0] != 0xff
    }
}

/// What a GID table entry addresses (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// An InfiniBand GID (native IB ports).
    Ib,
    /// RoCE v1: Ethernet frames, not routable beyond the L2 domain.
    RoceV1,
    /// RoCE v2: UDP/IP packets (port 4791), routable; the GID is the interface's IP address.
    RoceV2,
}

/// One entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// Its index in the table (the `sgid_index` of a global route).
    pub index: u8,
    /// The GID.
    pub gid: Gid,
    /// What it addresses.
    pub gid_type: GidType,
}

/// The IP family of the network a RoCE v2 GID belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// IPv4 (an IPv4-mapped GID).
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// The family of an IP address.
    pub fn of(ip: std::net::IpAddr) -> IpFamily {
        match ip {
            std::net::IpAddr::V4(_) => IpFamily::V4,
            std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => IpFamily::V4,
            std::net::IpAddr::V6(_) => IpFamily::V6,
        }
    }
}

impl GidEntry {
    /// The IP family of the entry's address (RoCE GIDs are IP addresses).
    pub fn family(&self) -> IpFamily {
        if self.gid.ipv4().is_some() { IpFamily::V4 } else { IpFamily::V6 }
    }
}

/// Picks the source GID of a RoCE connection whose side channel runs over `family`, as
/// `rdma_cm` and UCX do: a RoCE v2 entry of that family first (it is routable and matches the
/// network both ends reach each other on), then a RoCE v2 entry of the other family, then a
/// RoCE v1 entry (one L2 domain only). Within a rank the lowest index wins, so two ends with
/// the same table and family pick alike. Empty (zero) and multicast entries are skipped.
/// `None` when the table has no usable RoCE entry.
pub fn choose_roce_gid(table: &[GidEntry], family: IpFamily) -> Option<GidEntry> {
    let rank = |e: &GidEntry| match (e.gid_type, e.family() == family) {
        (GidType::RoceV2, true) => Some(0),
        (GidType::RoceV2, false) => Some(1),
        (GidType::RoceV1, _) => Some(2),
        (GidType::Ib, _) => None,
    };
    table
        .iter()
        .filter(|e| e.gid.is_unicast())
        .filter_map(|e| rank(e).map(|r| (r, e.index, *e)))
        .min_by_key(|&(r, i, _)| (r, i))
        .map(|(_, _, e)| e)
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

/// A device the provider can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`mlx5_0`, `softib0`).
    pub name: String,
    /// Node GUID (0 when unknown).
    pub guid: u64,
}

/// Device limits (`struct ibv_device_attr`, plus the provider's inline limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Largest registration.
    pub max_mr_size: u64,
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum outstanding work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum number of registrations.
    pub max_mr: u32,
    /// Maximum number of protection domains.
    pub max_pd: u32,
    /// Maximum outstanding RDMA_READs a QP can be the target of.
    pub max_qp_rd_atom: u32,
    /// Maximum number of SRQs (0: none).
    pub max_srq: u32,
    /// Maximum outstanding receives per SRQ.
    pub max_srq_wr: u32,
    /// Maximum scatter/gather entries per SRQ receive.
    pub max_srq_sge: u32,
    /// Largest inline send the provider accepts. Hardware reports no device-wide value; the
    /// hardware provider reports what a probe QP was granted, and each QP's
    /// [`QueuePair::cap`] has the authoritative figure.
    pub max_inline_data: u32,
    /// Number of physical ports (ports are numbered from 1).
    pub phys_port_cnt: u8,
    /// The host's CPU moves the data of RDMA work requests, as it posts them (a software
    /// provider), rather than an adapter's DMA engine beside it. Not an `ibv_device_attr`
    /// field: false for hardware.
    pub cpu_moves_data: bool,
}

/// Port attributes (`struct ibv_port_attr`) and the GID at index 0.
///
/// Every entry of the GID table is read with [`Verbs::gid_entry`](super::Verbs::gid_entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state; only `Active` ports carry traffic.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently in force.
    pub active_mtu: Mtu,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID at index 0.
    pub gid: Gid,
    /// Largest message.
    pub max_msg_sz: u32,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// Entries in the port's GID table (indices `0..gid_tbl_len`; some may be empty).
    pub gid_tbl_len: u32,
}

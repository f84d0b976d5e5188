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
}

/// Port attributes (`struct ibv_port_attr`) and the GID at index 0.
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
}

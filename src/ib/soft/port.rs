//! Ports of the software device: what differs between an InfiniBand and an Ethernet (RoCE)
//! fabric, emulated so that the engine's RoCE path runs without an HCA.
//!
//! A port presents a link layer, a logical state, an active MTU and a GID table. The checks an
//! HCA makes when a queue pair is connected through a port are made on them the same way
//! ([`check_route`](crate::ib::verbs::check_route)): a port that does not exist, a GID index
//! past the table or naming an empty entry, a route without a global route header on an
//! Ethernet port (RoCE has no LIDs) and a path MTU above the port's active MTU are refused by
//! `modify` with a [`FabricError`]. A sender whose path MTU exceeds the receiving QP's port MTU
//! gets no acknowledgement, as on a fabric that drops the packets: it retries and fails with
//! `RetryExcErr`.
//!
//! Every non-empty GID table entry holds the context's software GID: it is what names the
//! context to its peers, so whichever index a route uses, packets reach the same context — as
//! on a RoCE port whose v1 and v2 entries carry the same address. The entries differ in type
//! only; all of them are of the IPv6 family (a software GID cannot be an IPv4-mapped address).

use crate::ib::verbs::{
    FabricError, Gid, GidEntry, GidType, LinkLayer, Mtu, PortAttr, PortState, VerbsResult,
};

/// One port of a software device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SoftPort {
    /// InfiniBand (LID routing, GRH optional) or Ethernet (RoCE: GRH required, LID 0).
    pub link_layer: LinkLayer,
    /// Logical state; contexts report it, the engine refuses ports that are not `Active`.
    pub state: PortState,
    /// Active MTU: the largest path MTU a queue pair on this port accepts.
    pub active_mtu: Mtu,
    /// The GID table: the type of each entry, `None` for an empty one.
    pub gid_types: Vec<Option<GidType>>,
}

impl SoftPort {
    /// An active InfiniBand port, MTU 4096, one IB GID.
    pub fn infiniband() -> SoftPort {
        SoftPort {
            link_layer: LinkLayer::InfiniBand,
            state: PortState::Active,
            active_mtu: Mtu::Mtu4096,
            gid_types: vec![Some(GidType::Ib)],
        }
    }

    /// An active Ethernet (RoCE) port as a NIC on a 1500-byte Ethernet presents it: active
    /// MTU 1024, a RoCE v1 entry at index 0 and a RoCE v2 entry at index 1.
    pub fn ethernet() -> SoftPort {
        SoftPort {
            link_layer: LinkLayer::Ethernet,
            state: PortState::Active,
            active_mtu: Mtu::Mtu1024,
            gid_types: vec![Some(GidType::RoceV1), Some(GidType::RoceV2)],
        }
    }

    /// The same port in another logical state.
    pub fn with_state(mut self, state: PortState) -> SoftPort {
        self.state = state;
        self
    }

    /// The same port with another active MTU.
    pub fn with_active_mtu(mut self, mtu: Mtu) -> SoftPort {
        self.active_mtu = mtu;
        self
    }

    /// The same port with another GID table.
    pub fn with_gid_types(mut self, types: Vec<Option<GidType>>) -> SoftPort {
        self.gid_types = types;
        self
    }

    /// The port named by `IONET_SOFTIB_LINK_LAYER` (`infiniband`, the default, or `ethernet`):
    /// runs any program or test suite over an emulated RoCE port unchanged. An unknown value
    /// is logged and ignored.
    pub fn from_env() -> SoftPort {
        match std::env::var("IONET_SOFTIB_LINK_LAYER").as_deref() {
            Ok("ethernet" | "roce") => SoftPort::ethernet(),
            Ok("infiniband" | "ib") | Err(_) => SoftPort::infiniband(),
            Ok(v) => {
                tracing::warn!(value = %v, "IONET_SOFTIB_LINK_LAYER: expected infiniband or ethernet");
                SoftPort::infiniband()
            }
        }
    }
}

/// The ports of one context, with the context's GID and LID.
#[derive(Debug)]
pub(crate) struct Ports<'a> {
    pub device: &'a str,
    pub ports: &'a [SoftPort],
    pub gid: Gid,
    pub lid: u16,
}

impl Ports<'_> {
    pub(crate) fn port(&self, num: u8) -> VerbsResult<&SoftPort> {
        usize::from(num).checked_sub(1).and_then(|i| self.ports.get(i)).ok_or_else(|| {
            FabricError::NoSuchPort {
                device: self.device.into(),
                port: num,
                ports: self.ports.len().min(255) as u8,
            }
            .into()
        })
    }

    pub(crate) fn attr(&self, num: u8) -> VerbsResult<PortAttr> {
        let p = self.port(num)?;
        let gid0 = p.gid_types.first().copied().flatten().map_or(Gid::default(), |_| self.gid);
        Ok(PortAttr {
            state: p.state,
            max_mtu: Mtu::Mtu4096,
            active_mtu: p.active_mtu,
            lid: if p.link_layer == LinkLayer::Ethernet { 0 } else { self.lid },
            gid: gid0,
            max_msg_sz: 1 << 31,
            link_layer: p.link_layer,
            gid_tbl_len: p.gid_types.len() as u32,
        })
    }

    pub(crate) fn gid_entry(&self, num: u8, index: u32) -> VerbsResult<GidEntry> {
        let p = self.port(num)?;
        let missing =
            |reason: String| FabricError::NoSuchGid { device: self.device.into(), port: num, index, reason };
        let slot = usize::try_from(index).ok().and_then(|i| p.gid_types.get(i));
        match slot {
            None => Err(missing(format!("the table has {} entries", p.gid_types.len())).into()),
            Some(None) => Err(missing("the entry is empty".into()).into()),
            Some(Some(t)) => Ok(GidEntry { index: index as u8, gid: self.gid, gid_type: *t }),
        }
    }
}

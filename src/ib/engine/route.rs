//! Which device, port and source GID an endpoint uses, and the route each queue pair gets.
//!
//! Selection, most specific first: the bound address's `?dev=&port=&gid=`, then
//! [`IbConfig`](crate::IbConfig), then `IONET_IB_DEVICE` (`name[:port]`, hardware only), then
//! the first device, port 1, and an automatic GID. The port must be active; a GID index given
//! must name a non-empty entry. All of it is checked when the endpoint opens, so a wrong
//! selection fails there with a [`FabricError`] naming the device, port and GID, not later on
//! the first connection.
//!
//! Routes: an InfiniBand port routes by LID (a GRH only when a GID index was given); an
//! Ethernet (RoCE) port always uses a GRH, from the configured GID or the one
//! [`choose_roce_gid`] picks for the IP family of the connection's side channel, with the
//! class's DSCP as the traffic class. The path MTU is the smaller of both ports' active MTUs.

use std::net::SocketAddr;

use crate::addr::DeviceSelect;
use crate::config::IbConfig;
use crate::error::{Error, Result};
use crate::ib::verbs::*;

/// The environment variable naming the hardware device (and port) to use.
pub(crate) const ENV_DEVICE: &str = "IONET_IB_DEVICE";

/// What to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selection {
    pub device: Option<String>,
    pub port: u8,
    pub gid_index: Option<u8>,
}

/// Merges the address's selection, the configuration and the environment (`env`: the value of
/// [`ENV_DEVICE`], when it applies).
pub(crate) fn select(addr: Option<&DeviceSelect>, cfg: &IbConfig, env: Option<&str>) -> Result<Selection> {
    let (env_dev, env_port) = match env.map(str::trim).filter(|v| !v.is_empty()) {
        None => (None, None),
        Some(v) => {
            let (name, port) = match v.split_once(':') {
                Some((n, p)) => {
                    let port = p.parse::<u8>().ok().filter(|&p| p >= 1).ok_or_else(|| {
                        Error::misuse(format!("{ENV_DEVICE}={v:?}: the port after ':' must be 1..=255"))
                    })?;
                    (n, Some(port))
                }
                None => (v, None),
            };
            if name.is_empty() || name.contains([',', ' ']) {
                return Err(Error::misuse(format!(
                    "{ENV_DEVICE}={v:?}: expected one device as name or name:port (e.g. mlx5_0:1)"
                )));
            }
            (Some(name.to_string()), port)
        }
    };
    let a = addr.cloned().unwrap_or_default();
    Ok(Selection {
        device: a.device.or_else(|| cfg.device.clone()).or(env_dev),
        port: a.port.or(cfg.port).or(env_port).unwrap_or(1),
        gid_index: a.gid_index.or(cfg.gid_index),
    })
}

/// The port an endpoint uses and what its routes are built from.
#[derive(Debug, Clone)]
pub(crate) struct PortRoute {
    pub num: u8,
    pub attr: PortAttr,
    /// The GID index the selection named.
    fixed: Option<GidEntry>,
    /// Usable RoCE entries of the table (Ethernet ports without a fixed index).
    roce: Vec<GidEntry>,
}

/// The route of one queue pair: the source GID index (None: LID routing) and the GID that
/// goes to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub gid_index: Option<u8>,
    pub gid: Gid,
}

impl PortRoute {
    /// Checks the selected port and GID of an opened device.
    pub(crate) fn open<V: Verbs>(ctx: &V, sel: &Selection) -> Result<PortRoute> {
        let device = ctx.device().name.clone();
        let attr = ctx.port_attr(sel.port)?;
        if attr.state != PortState::Active {
            return Err(Error::Fabric(FabricError::PortNotActive {
                device,
                port: sel.port,
                state: attr.state,
            }));
        }
        let fixed = sel.gid_index.map(|i| ctx.gid_entry(sel.port, u32::from(i))).transpose()?;
        let mut roce = Vec::new();
        if attr.link_layer == LinkLayer::Ethernet && fixed.is_none() {
            // Empty entries read as errors: skip them, keep what can route.
            roce = (0..attr.gid_tbl_len.min(256))
                .filter_map(|i| ctx.gid_entry(sel.port, i).ok())
                .filter(|e| e.gid_type != GidType::Ib && e.gid.is_unicast())
                .collect();
            if roce.is_empty() {
                return Err(Error::Fabric(FabricError::NoRoceGid { device, port: sel.port }));
            }
        }
        if let Some(e) = &fixed
            && !e.gid.is_unicast()
        {
            return Err(Error::Fabric(FabricError::NoSuchGid {
                device,
                port: sel.port,
                index: u32::from(e.index),
                reason: format!("entry {} is not a unicast GID", e.gid),
            }));
        }
        tracing::debug!(port = sel.port, link_layer = ?attr.link_layer, ?fixed, roce = roce.len(), "port selected");
        Ok(PortRoute { num: sel.port, attr, fixed, roce })
    }

    /// The route of a queue pair whose side channel connects to `peer`.
    pub(crate) fn route(&self, peer: SocketAddr) -> Route {
        if let Some(e) = self.fixed {
            return Route { gid_index: Some(e.index), gid: e.gid };
        }
        match choose_roce_gid(&self.roce, IpFamily::of(peer.ip())) {
            Some(e) => Route { gid_index: Some(e.index), gid: e.gid },
            None => Route { gid_index: None, gid: self.attr.gid },
        }
    }

    /// Checks what the peer said about its port against ours; the path MTU both can carry.
    pub(crate) fn agree(
        &self,
        route: &Route,
        remote_ll: LinkLayer,
        remote_mtu: Mtu,
        remote_gid: &Gid,
    ) -> Result<Mtu> {
        if remote_ll != self.attr.link_layer {
            return Err(Error::Fabric(FabricError::LinkLayerMismatch {
                local: self.attr.link_layer,
                remote: remote_ll,
            }));
        }
        if route.gid_index.is_some() && !remote_gid.is_unicast() {
            return Err(Error::Protocol {
                peer: None,
                reason: crate::error::ProtocolError::Handshake(format!(
                    "the peer's GID {remote_gid} cannot be a route's destination"
                )),
            });
        }
        Ok(remote_mtu.min(self.attr.active_mtu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u8, gid: &str, gid_type: GidType) -> GidEntry {
        let ip: std::net::Ipv6Addr = gid.parse().unwrap();
        GidEntry { index, gid: Gid(ip.octets()), gid_type }
    }

    #[test]
    fn selection_prefers_the_address_then_the_config_then_the_environment() {
        let cfg = IbConfig::default();
        let s = select(None, &cfg, None).unwrap();
        assert_eq!(s, Selection { device: None, port: 1, gid_index: None });
        let s = select(None, &cfg, Some("mlx5_1:2")).unwrap();
        assert_eq!((s.device.as_deref(), s.port), (Some("mlx5_1"), 2));
        let s = select(None, &cfg, Some("rxe0")).unwrap();
        assert_eq!((s.device.as_deref(), s.port), (Some("rxe0"), 1));
        let cfg = IbConfig::default().device("mlx5_0").port(3).gid_index(1);
        let s = select(None, &cfg, Some("mlx5_1:2")).unwrap();
        assert_eq!(s, Selection { device: Some("mlx5_0".into()), port: 3, gid_index: Some(1) });
        let a: crate::Address = "ib://h:1?dev=mlx5_4&gid=7".parse().unwrap();
        let s = select(a.device_select(), &cfg, Some("mlx5_1:2")).unwrap();
        assert_eq!(s, Selection { device: Some("mlx5_4".into()), port: 3, gid_index: Some(7) });
    }

    #[test]
    fn a_malformed_environment_value_is_a_misuse_naming_the_variable() {
        for v in ["mlx5_0:0", "mlx5_0:x", ":1", "mlx5_0,mlx5_1", "mlx5_0:1:2"] {
            match select(None, &IbConfig::default(), Some(v)) {
                Err(Error::Misuse(m)) => assert!(m.contains(ENV_DEVICE), "{v}: {m}"),
                other => panic!("{v}: {other:?}"),
            }
        }
    }

    fn soft(ports: Vec<crate::ib::soft::SoftPort>) -> crate::ib::soft::SoftContext {
        let cfg = crate::ib::soft::SoftConfig { ports, ..Default::default() };
        crate::ib::soft::SoftProvider::new(cfg).open(None).unwrap()
    }

    #[test]
    fn routes_per_port_and_peer() {
        use crate::ib::soft::SoftPort;
        let v4: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::2]:7000".parse().unwrap();
        let sel = |port, gid_index| Selection { device: None, port, gid_index };
        let ctx = soft(vec![SoftPort::infiniband(), SoftPort::ethernet()]);
        // InfiniBand: LID routing, the port's GID 0 goes to the peer.
        let ib = PortRoute::open(&ctx, &sel(1, None)).unwrap();
        let r = ib.route(v4);
        assert_eq!((r.gid_index, r.gid), (None, ib.attr.gid));
        // Ethernet: the RoCE v2 entry (index 1) for either family (software GIDs are IPv6).
        let eth = PortRoute::open(&ctx, &sel(2, None)).unwrap();
        assert_eq!(eth.route(v4).gid_index, Some(1));
        assert_eq!(eth.route(v6).gid_index, Some(1));
        // A configured index wins.
        let fixed = PortRoute::open(&ctx, &sel(2, Some(0))).unwrap();
        assert_eq!(fixed.route(v4).gid_index, Some(0));
        // What the peer said about its port: same link layer, the smaller MTU; a GID that
        // cannot be a destination is the peer's protocol error.
        let r = eth.route(v4);
        let peer_gid = eth.attr.gid;
        assert_eq!(eth.agree(&r, LinkLayer::Ethernet, Mtu::Mtu4096, &peer_gid).unwrap(), Mtu::Mtu1024);
        assert_eq!(eth.agree(&r, LinkLayer::Ethernet, Mtu::Mtu512, &peer_gid).unwrap(), Mtu::Mtu512);
        assert!(matches!(
            eth.agree(&r, LinkLayer::InfiniBand, Mtu::Mtu1024, &peer_gid),
            Err(Error::Fabric(FabricError::LinkLayerMismatch { .. }))
        ));
        assert!(matches!(
            eth.agree(&r, LinkLayer::Ethernet, Mtu::Mtu1024, &Gid::default()),
            Err(Error::Protocol { .. })
        ));
        // On InfiniBand without a GRH the GID is not a destination: a zero one is harmless.
        assert!(ib.agree(&ib.route(v4), LinkLayer::InfiniBand, Mtu::Mtu4096, &Gid::default()).is_ok());
    }

    #[test]
    fn roce_gid_choice_follows_the_side_channel_family() {
        let table = [
            entry(0, "fe80::1", GidType::RoceV1),
            entry(1, "fe80::1", GidType::RoceV2),
            entry(2, "::ffff:10.0.0.5", GidType::RoceV1),
            entry(3, "::ffff:10.0.0.5", GidType::RoceV2),
            entry(4, "2001:db8::5", GidType::RoceV2),
        ];
        assert_eq!(choose_roce_gid(&table, IpFamily::V4).unwrap().index, 3);
        assert_eq!(choose_roce_gid(&table, IpFamily::V6).unwrap().index, 1);
        // No IPv4 address on the interface: a RoCE v2 GID of the other family.
        assert_eq!(choose_roce_gid(&table[..2], IpFamily::V4).unwrap().index, 1);
        // RoCE v1 only: still a route, within one L2 domain.
        assert_eq!(choose_roce_gid(&table[..1], IpFamily::V4).unwrap().index, 0);
        // Empty, multicast and IB entries never route.
        let unusable = [
            entry(0, "::", GidType::RoceV2),
            entry(1, "ff02::1", GidType::RoceV2),
            entry(2, "fe80::2", GidType::Ib),
        ];
        assert_eq!(choose_roce_gid(&unusable, IpFamily::V6), None);
        assert_eq!(IpFamily::of("::ffff:1.2.3.4".parse().unwrap()), IpFamily::V4);
    }
}

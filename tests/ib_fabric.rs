//! Device, port and GID selection, and the RoCE path of the InfiniBand engine, on the software
//! provider: its ports can present an Ethernet link layer with a GID table and refuse what an
//! HCA refuses (no GRH on RoCE, a GID index that does not exist, a path MTU above the port's).
//!
//! Each selection error is typed ([`Error::Fabric`]) and names the device, port or GID; a
//! connection between Ethernet-link-layer ports succeeds only because each end routes with a
//! GRH to the GID the other sent over the side channel.

use std::io::Write;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::internals::ib::soft::SoftPort;
use ionet::internals::ib::verbs::{FabricError, Gid, GidType, Mtu, PortState, QpEndpointInfo};
use ionet::*;

mod common;
use common::{pattern, raw_hello, read_until_closed};

const T: Duration = Duration::from_secs(20);

fn cfg(ports: Vec<SoftPort>) -> Config {
    Config::default().progress_thread(true).ib(IbConfig::default().soft_ports(ports))
}

fn bind(addr: &str, ports: Vec<SoftPort>) -> Result<Endpoint> {
    Endpoint::bind(addr, cfg(ports))
}

fn fabric_error(r: Result<Endpoint>) -> FabricError {
    match r {
        Err(Error::Fabric(f)) => f,
        Err(e) => panic!("expected a fabric error, got {e:?}"),
        Ok(_) => panic!("expected a fabric error, the endpoint opened"),
    }
}

/// An introduction, then `len` bytes each way (tagged) between a client and a server.
fn round_trip(cli: &Endpoint, srv: &Endpoint, len: usize) {
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let s = cli.send_unexpected(p, 1, Bytes::from_static(b"hello"), ServiceLevel::Normal).unwrap();
    let u = srv.recv_unexpected(Some(T)).unwrap().expect("a message from the client");
    assert_eq!(&u.data[..], b"hello");
    assert!(cli.wait_timeout(s, T).unwrap().expect("send completes").result.is_ok());
    for (from, to, pf, pt, tag) in [(cli, srv, p, u.peer, 2), (srv, cli, u.peer, p, 3)] {
        let data = pattern(len, tag);
        let r = to.recv(pt, tag, BytesMut::zeroed(len)).unwrap();
        let s = from.send(pf, tag, Bytes::from(data.clone()), ServiceLevel::Bulk).unwrap();
        let c = to.wait_timeout(r, T).unwrap().expect("receive completes");
        assert!(c.result.is_ok(), "{len} B: {:?}", c.result);
        assert!(c.data().unwrap() == data, "{len} B: bytes");
        assert!(from.wait_timeout(s, T).unwrap().expect("send completes").result.is_ok());
    }
}

#[test]
fn roce_ports_connect_with_gids_exchanged_and_the_smaller_mtu() {
    // Different active MTUs: each end's path MTU must be the smaller one, or the 1024-byte
    // port refuses the route (MtuAbovePort).
    let srv = bind("softib://127.0.0.1:0", vec![SoftPort::ethernet()]).unwrap();
    let cli = Endpoint::client(cfg(vec![SoftPort::ethernet().with_active_mtu(Mtu::Mtu4096)])).unwrap();
    // Inline, fast RDMA and server-based RDMA all cross the RoCE route.
    for len in [100, 40 << 10, 3 << 20] {
        round_trip(&cli, &srv, len);
    }
    assert!(srv.info().counters.connections >= 1);
    assert_eq!(srv.info().counters.protocol_errors, 0);
}

#[test]
fn roce_with_a_configured_gid_index() {
    // Index 0 is empty, 1 RoCE v1, 2 RoCE v2: either usable index routes.
    let table = vec![None, Some(GidType::RoceV1), Some(GidType::RoceV2)];
    let port = SoftPort::ethernet().with_gid_types(table);
    let srv = bind("softib://127.0.0.1:0?gid=1", vec![port.clone()]).unwrap();
    let cli = Endpoint::client(
        Config::default().progress_thread(true).ib(IbConfig::default().soft_ports(vec![port]).gid_index(2)),
    )
    .unwrap();
    round_trip(&cli, &srv, 1000);
}

#[test]
fn an_infiniband_port_with_a_grh() {
    let srv = bind("softib://127.0.0.1:0?gid=0", vec![SoftPort::infiniband()]).unwrap();
    let cli = Endpoint::client(cfg(vec![SoftPort::infiniband()])).unwrap();
    round_trip(&cli, &srv, 1000);
}

#[test]
fn a_missing_device_is_named_with_the_ones_present() {
    match fabric_error(bind("softib://127.0.0.1:0?dev=mlx5_9", vec![SoftPort::infiniband()])) {
        FabricError::NoSuchDevice { name, available } => {
            assert_eq!(name, "mlx5_9");
            assert_eq!(available, vec!["softib0".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    // The same from the configuration.
    let c = Config::default().ib(IbConfig::default().device("mlx5_9"));
    assert!(matches!(
        fabric_error(Endpoint::bind("softib://127.0.0.1:0", c)),
        FabricError::NoSuchDevice { .. }
    ));
}

#[test]
fn a_port_that_does_not_exist() {
    let e =
        fabric_error(bind("softib://127.0.0.1:0?port=3", vec![SoftPort::infiniband(), SoftPort::ethernet()]));
    assert_eq!(e, FabricError::NoSuchPort { device: "softib0".into(), port: 3, ports: 2 });
    assert!(e.to_string().contains("softib0 has no port 3"), "{e}");
}

#[test]
fn an_inactive_port() {
    let ports = vec![SoftPort::infiniband(), SoftPort::ethernet().with_state(PortState::Down)];
    let e = fabric_error(bind("softib://127.0.0.1:0?port=2", ports.clone()));
    assert_eq!(e, FabricError::PortNotActive { device: "softib0".into(), port: 2, state: PortState::Down });
    // Port 1 of the same device is fine.
    bind("softib://127.0.0.1:0?port=1", ports).unwrap();
}

#[test]
fn a_gid_that_does_not_exist() {
    match fabric_error(bind("softib://127.0.0.1:0?gid=5", vec![SoftPort::ethernet()])) {
        FabricError::NoSuchGid { device, port, index, reason } => {
            assert_eq!((device.as_str(), port, index), ("softib0", 1, 5));
            assert!(reason.contains("2 entries"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let port = SoftPort::ethernet().with_gid_types(vec![None, Some(GidType::RoceV2)]);
    match fabric_error(bind("softib://127.0.0.1:0?gid=0", vec![port])) {
        FabricError::NoSuchGid { index: 0, reason, .. } => assert!(reason.contains("empty"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_ethernet_port_without_a_roce_gid() {
    for table in [vec![], vec![None], vec![Some(GidType::Ib)]] {
        let port = SoftPort::ethernet().with_gid_types(table.clone());
        let e = fabric_error(bind("softib://127.0.0.1:0", vec![port]));
        assert_eq!(e, FabricError::NoRoceGid { device: "softib0".into(), port: 1 }, "{table:?}");
    }
}

/// The server, on an Ethernet port, refuses a client on an InfiniBand port when it reads the
/// client's port description (it logs `link layers differ`); the client's operation fails with
/// the peer lost during the handshake, and the server keeps serving.
#[test]
fn link_layers_that_differ_fail_the_connection() {
    let srv = bind("softib://127.0.0.1:0", vec![SoftPort::ethernet()]).unwrap();
    let cli = Endpoint::client(cfg(vec![SoftPort::infiniband()])).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let s = cli.send_unexpected(p, 1, Bytes::from_static(b"x"), ServiceLevel::Normal).unwrap();
    let c = cli.wait_timeout(s, T).unwrap().expect("the send fails");
    match c.result {
        Err(Error::PeerLost { reason, .. }) => assert!(reason.contains("handshake"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(srv.info().counters.connections, 0);
    assert_eq!(srv.info().rdma.unwrap().queue_pairs, 0, "the refused client's queue pair is gone");
    let ok = Endpoint::client(cfg(vec![SoftPort::ethernet()])).unwrap();
    round_trip(&ok, &srv, 100);
}

/// The body of an `IB_INFO` frame as a peer sends it, version 2.
fn ib_info(gid: Gid, link_layer: u8, mtu: u8) -> Vec<u8> {
    let mut v = QpEndpointInfo { qpn: 5, psn: 6, lid: 0, gid }.encode().to_vec();
    v.extend_from_slice(&16u16.to_le_bytes()); // receive buffers
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&8192u32.to_le_bytes()); // receive size
    v.extend_from_slice(&0x7f00_0000_0000u64.to_le_bytes()); // ring address
    v.extend_from_slice(&1u32.to_le_bytes()); // ring key
    v.extend_from_slice(&8u16.to_le_bytes()); // ring slots
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&69632u32.to_le_bytes()); // slot size
    v.extend_from_slice(&[2, link_layer, mtu, 0]);
    v
}

/// A hostile or outdated client's `IB_INFO` ends its side channel as a protocol error; the
/// server keeps serving.
#[test]
fn bad_port_descriptions_from_a_peer_are_protocol_errors() {
    use ionet::internals::wire::{Header, Kind};
    let srv = bind("softib://127.0.0.1:0", vec![SoftPort::ethernet()]).unwrap();
    let sa = match srv.local_addr().unwrap().resolve().unwrap()[..] {
        [sa, ..] => sa,
        [] => unreachable!(),
    };
    let good = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let mut v1 = ib_info(good, 2, 3);
    v1.truncate(60);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("version 1 (no port description)", v1),
        ("zero GID on RoCE", ib_info(Gid::default(), 2, 3)),
        ("multicast GID on RoCE", ib_info(Gid([0xff; 16]), 2, 3)),
        ("MTU code 0", ib_info(good, 2, 0)),
        ("MTU code 9", ib_info(good, 2, 9)),
        ("unknown link layer", ib_info(good, 7, 3)),
    ];
    for (i, (what, body)) in cases.iter().enumerate() {
        let mut s = std::net::TcpStream::connect(sa).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        raw_hello(&mut s);
        let mut h = Header::new(Kind::IbInfo, ServiceLevel::Normal);
        h.len = body.len() as u32;
        s.write_all(&h.encode()).unwrap();
        s.write_all(body).unwrap();
        read_until_closed(&mut s, T, what);
        let errors = srv.info().counters.protocol_errors;
        assert!(errors > i as u64, "{what}: not counted as a protocol error ({errors})");
    }
    // Nothing of a refused client stays behind: no queue pair, no registered memory.
    let rdma = srv.info().rdma.unwrap();
    assert_eq!(rdma.queue_pairs, 0, "a refused client's queue pair was left behind");
    assert_eq!(srv.info().counters.connections, 0);
    // The server still serves a well-behaved client.
    let cli = Endpoint::client(cfg(vec![SoftPort::ethernet()])).unwrap();
    round_trip(&cli, &srv, 100);
}

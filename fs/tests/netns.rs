//! A cluster whose io servers each run in their own network namespace with their own address,
//! reached over veth pairs, so nothing in the client, the meta server or the cluster launcher
//! can be assuming loopback. The namespaces are made by the test (`ip netns` + veth) and removed
//! afterwards. Needs root, so it is ignored unless asked for (`cargo test -- --ignored`, as CI
//! does as root), and then fails where namespaces cannot be made.

mod common;

use bytes::BytesMut;
use common::netns::Net;
use common::{TestCluster, pattern};
use stripefs::CreateOptions;
use stripefs::proto::LayoutSpec;

const SERVERS: u32 = 3;

#[test]
#[ignore = "needs root: creates network namespaces (ip netns)"]
fn io_servers_in_their_own_network_namespaces() {
    let net_guard = Net::new(SERVERS as usize).expect("cannot create network namespaces");
    let addrs = net_guard.addrs.clone();
    let tc = TestCluster::start_with("tcp", SERVERS, |o| {
        o.io_listen = Some(addrs.iter().map(|a| format!("tcp://{a}:7000").parse().unwrap()).collect());
        o.io_prefix = Some((0..SERVERS as usize).map(|i| net_guard.exec_prefix(i)).collect());
    });
    for (i, a) in tc.cluster.config().io_servers.iter().enumerate() {
        assert_eq!(a.to_string(), format!("tcp://{}:7000", addrs[i]));
    }
    let c = tc.client();
    let spec = LayoutSpec { base: Some(0), pcount: Some(SERVERS), ssize: Some(65536) };
    let f = c.create("/across", CreateOptions { mode: 0o644, layout: Some(spec) }).unwrap();
    let data = pattern(3 << 20, 11);
    f.write_at(0, &data).unwrap();
    f.sync().unwrap();
    let (back, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    assert_eq!(n, data.len());
    assert_eq!(&back[..], &data[..]);
    assert_eq!(c.stat("/across").unwrap().attr.size, data.len() as u64);
    // Every server took its share, each over its own veth.
    for (i, s) in c.server_stats().into_iter().enumerate() {
        let s = s.unwrap();
        assert_eq!(s.bytes_written, data.len() as u64 / u64::from(SERVERS), "server {i}");
    }
    // The io servers really run in namespaces of their own, apart from ours and each other's.
    let netns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    let ours = netns(std::process::id());
    let io_pids = &tc.cluster.pids()[1..];
    let mut seen: Vec<_> = io_pids.iter().map(|&p| netns(p)).collect();
    assert!(seen.iter().all(|n| *n != ours));
    seen.dedup();
    assert_eq!(seen.len(), SERVERS as usize);
    c.unlink("/across").unwrap();
    drop(c);
    drop(tc);
    drop(net_guard);
}

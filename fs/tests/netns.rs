//! A cluster whose io servers each run in their own network namespace with their own address,
//! reached over veth pairs, so nothing in the client, the meta server or the cluster launcher
//! can be assuming loopback. The namespaces are made by the test (`ip netns` + veth) and removed
//! afterwards; the test is skipped, with the reason printed, only where that is not permitted.

mod common;

use bytes::BytesMut;
use common::{TestCluster, pattern};
use std::process::Command;
use stripefs::CreateOptions;
use stripefs::proto::LayoutSpec;

const SERVERS: u32 = 3;

/// Namespaces and veth pairs, removed on drop.
struct Net {
    namespaces: Vec<String>,
    host_links: Vec<String>,
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for l in &self.host_links {
            let _ = Command::new("ip").args(["link", "del", l]).stderr(std::process::Stdio::null()).status();
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// One namespace per io server: `10.<net>.<i>.2` inside, `10.<net>.<i>.1` on the host side.
fn setup(net: u8) -> Result<(Net, Vec<String>), String> {
    let tag = std::process::id() % 100_000;
    let mut n = Net { namespaces: Vec::new(), host_links: Vec::new() };
    let mut addrs = Vec::new();
    for i in 0..SERVERS {
        let ns = format!("sfs{tag}n{i}");
        let (host, inner) = (format!("sf{tag}h{i}"), format!("sf{tag}n{i}"));
        ip(&["netns", "add", &ns])?;
        n.namespaces.push(ns.clone());
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &inner])?;
        n.host_links.push(host.clone());
        ip(&["link", "set", &inner, "netns", &ns])?;
        ip(&["addr", "add", &format!("10.{net}.{i}.1/24"), "dev", &host])?;
        ip(&["link", "set", &host, "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("10.{net}.{i}.2/24"), "dev", &inner])?;
        ip(&["-n", &ns, "link", "set", &inner, "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        addrs.push(format!("10.{net}.{i}.2"));
    }
    Ok((n, addrs))
}

#[test]
fn io_servers_in_their_own_network_namespaces() {
    // A /16 per test process keeps parallel runs on one machine apart.
    let net = 100 + (std::process::id() % 100) as u8;
    let (net_guard, addrs) = match setup(net) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("skipped: cannot create network namespaces here: {e}");
            return;
        }
    };
    let namespaces = net_guard.namespaces.clone();
    let tc = TestCluster::start_with("tcp", SERVERS, |o| {
        o.io_listen = Some(addrs.iter().map(|a| format!("tcp://{a}:7000").parse().unwrap()).collect());
        o.io_prefix = Some(
            namespaces
                .iter()
                .map(|ns| vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()])
                .collect(),
        );
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

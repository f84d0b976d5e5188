//! Network namespaces standing in for hosts: each has its own address on one subnet, joined by
//! a bridge to each other and to the test's own namespace, so servers in them reach each
//! other and the test reaches them all, without forwarding or firewall rules on the machine.
//! Needs root (`ip netns`); everything is removed on drop.

use std::process::{Command, Stdio};

/// `n` namespaces, `10.X.Y.<10+i>/24` inside, `10.X.Y.1` on the test's side.
pub struct Net {
    /// The namespaces' names (`ip netns exec NAME …`).
    pub namespaces: Vec<String>,
    /// Each namespace's address.
    pub addrs: Vec<String>,
    /// The bridge's namespace: a namespace of its own, so the machine's firewall rules (which
    /// may drop bridged traffic) do not apply to it.
    switch: String,
    /// The test's end of its veth pair to the bridge.
    host_link: String,
}

impl Drop for Net {
    fn drop(&mut self) {
        // Removing a namespace removes the veth ends in it, and with them their peers.
        for ns in self.namespaces.iter().chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.host_link]).stderr(Stdio::null()).status();
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Net {
    /// Makes `n` namespaces; why not, where that is not permitted.
    pub fn new(n: usize) -> Result<Net, String> {
        // The subnet and names come from the process id, so concurrent test processes on one
        // machine stay apart.
        let pid = std::process::id();
        let subnet = format!("10.{}.{}", 100 + (pid >> 8) % 100, pid & 0xff);
        let mut net = Net {
            namespaces: Vec::new(),
            addrs: Vec::new(),
            switch: format!("sfs{pid}sw"),
            host_link: format!("sfs{pid}h"),
        };
        let sw = net.switch.clone();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        ip(&["link", "add", &net.host_link, "type", "veth", "peer", "name", "up0", "netns", &sw])?;
        ip(&["-n", &sw, "link", "set", "up0", "master", "br0", "up"])?;
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &net.host_link])?;
        ip(&["link", "set", &net.host_link, "up"])?;
        for i in 0..n {
            let ns = format!("sfs{pid}n{i}");
            ip(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            let port = format!("p{i}");
            ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{subnet}.{}", 10 + i);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            net.addrs.push(addr);
        }
        Ok(net)
    }

    /// The command prefix that runs a program in namespace `i`.
    pub fn exec_prefix(&self, i: usize) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), self.namespaces[i].clone()]
    }

    /// Every namespace this made, the bridge's too.
    pub fn all_namespaces(&self) -> Vec<String> {
        self.namespaces.iter().cloned().chain([self.switch.clone()]).collect()
    }
}

/// The network namespaces `ip netns` lists.
pub fn listed_namespaces() -> String {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

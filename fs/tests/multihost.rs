//! A cluster of several hosts as an operator sets one up: `stripefs init` writes the cluster
//! file and key, and each server runs in a network namespace of its own (its own address, as
//! on its own host) with `stripefs serve --meta|--io I --cluster FILE`; the client commands
//! run from the test's namespace. An io server stopped by SIGTERM in the middle of a write
//! fails that write with an error naming it, and started again from the same cluster file it
//! serves what was synced before.
//!
//! Needs root (network namespaces), so it is ignored unless asked for (`cargo test --
//! --ignored`, as CI does as root), and then fails where namespaces cannot be made.

mod common;

use bytes::BytesMut;
use common::netns::{Net, listed_namespaces};
use common::pattern;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::config::ClusterConfig;
use stripefs::proto::LayoutSpec;
use stripefs::{Client, ClientOptions, CreateOptions, Errno};

const IO_SERVERS: usize = 3;

/// Only so that a server or write that never ends fails the test instead of hanging it.
const HANG: Duration = Duration::from_secs(60);

/// A server process in its namespace, killed on drop if still running.
struct Server {
    child: Child,
    // Kept open: the server's standard output.
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `ip netns exec NS stripefs serve ROLE… --cluster FILE`, once it listens at `addr`.
fn serve(net: &Net, ns: usize, role: &[&str], cluster: &Path, addr: &str) -> Server {
    let prefix = net.exec_prefix(ns);
    let mut child = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(env!("CARGO_BIN_EXE_stripefs"))
        .arg("serve")
        .args(role)
        .arg("--cluster")
        .arg(cluster)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning a server");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("LISTEN {addr}"), "{role:?} in {}", net.namespaces[ns]);
    Server { child, _stdout: out }
}

/// SIGTERM to `s`; its exit status once it ended.
fn terminate(s: &mut Server) -> std::process::ExitStatus {
    let pid = Pid::from_raw(i32::try_from(s.child.id()).unwrap());
    kill(pid, Signal::SIGTERM).expect("kill -TERM");
    let t = Instant::now();
    loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            return status;
        }
        assert!(t.elapsed() < HANG, "the server did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stripefs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripefs")).args(args).output().expect("running stripefs")
}

/// `stripefs --cluster FILE ARGS…`, which must succeed; its standard output.
fn ok(cluster: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(cluster)
        .args(args)
        .output()
        .expect("running stripefs");
    assert!(
        out.status.success(),
        "stripefs {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn striped_over_all() -> CreateOptions {
    let n = IO_SERVERS as u32;
    CreateOptions {
        mode: 0o644,
        layout: Some(LayoutSpec { base: Some(0), pcount: Some(n), ssize: Some(65536) }),
    }
}

#[test]
#[ignore = "needs root: creates network namespaces (ip netns)"]
fn a_cluster_of_several_hosts_from_stripefs_init() {
    // Namespace 0 is the meta server's host, namespace 1 + I io server I's.
    let net = Net::new(1 + IO_SERVERS).expect("cannot create network namespaces");
    let dir = tempfile::tempdir().unwrap();
    let cluster: PathBuf = dir.path().join("cluster.toml");
    let meta_addr = format!("{}:3000", net.addrs[0]);
    let io_addrs: Vec<String> = net.addrs[1..].iter().map(|a| format!("{a}:7000")).collect();

    // The operator's first step: the cluster file and the key.
    let data = dir.path().join("data");
    let out = stripefs(&[
        "init",
        "--meta",
        &meta_addr,
        "--io",
        &io_addrs.join(","),
        "--data-dir",
        data.to_str().unwrap(),
        "-o",
        cluster.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "init: {}\n{said}", String::from_utf8_lossy(&out.stderr));
    let key = dir.path().join("cluster.key");
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let file = cluster.display();
    assert!(said.contains(&format!("on {}: stripefs serve --meta --cluster {file}", net.addrs[0])), "{said}");
    for (i, a) in net.addrs[1..].iter().enumerate() {
        assert!(said.contains(&format!("on {a}: stripefs serve --io {i} --cluster {file}")), "{said}");
    }
    let cfg = ClusterConfig::load(&cluster).unwrap();
    assert_eq!(cfg.meta.to_string(), format!("tcp://{meta_addr}"));

    // Each host runs its own server from the same file.
    let mut io: Vec<Server> = (0..IO_SERVERS)
        .map(|i| serve(&net, 1 + i, &["--io", &i.to_string()], &cluster, &format!("tcp://{}", io_addrs[i])))
        .collect();
    let _meta = serve(&net, 0, &["--meta"], &cluster, &format!("tcp://{meta_addr}"));
    let status = ok(&cluster, &["status"]);
    assert_eq!(status.lines().filter(|l| l.contains(" up ")).count(), 1 + IO_SERVERS, "{status}");

    // The client commands, from the test's own namespace.
    let original = pattern(5 << 20, 3);
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &original).unwrap();
    ok(&cluster, &["cp", src.to_str().unwrap(), "sfs:/in.bin"]);
    let back = dir.path().join("back.bin");
    ok(&cluster, &["cp", "sfs:/in.bin", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == original[..], "cp out read back different bytes");
    let ls = ok(&cluster, &["ls", "-l", "--bytes", "sfs:/"]);
    assert!(ls.contains(&format!("{} in.bin", original.len())), "{ls}");
    let stat = ok(&cluster, &["stat", "--json", "sfs:/in.bin"]);
    let stat: serde_json::Value = serde_json::from_str(&stat).unwrap();
    assert_eq!(stat["size"], original.len() as u64);
    assert_eq!(stat["layout"]["servers"], serde_json::json!([0, 1, 2]), "striped over every host");

    // A library client writes on past a synced prefix while io server 1 is stopped.
    let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
    let c = Client::connect_with(&cfg, opts.clone()).unwrap();
    let synced = pattern(3 << 20, 11);
    let f = c.create("/busy", striped_over_all()).unwrap();
    f.write_all_at(0, &synced).unwrap();
    f.sync().unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let more = pattern(1 << 20, 12);
        for i in 3u64.. {
            if i == 5 {
                started_tx.send(()).unwrap();
            }
            if let Err(e) = f.write_at(i << 20, &more) {
                let _ = done_tx.send(e);
                return;
            }
        }
    });
    started_rx.recv_timeout(HANG).expect("the writes started");
    let stopped = terminate(&mut io[1]);
    assert!(stopped.success(), "io server 1 ended with {stopped}");
    let e = done_rx.recv_timeout(HANG).expect("the write in progress failed rather than hung");
    eprintln!("the write in progress failed: {e}");
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
    let named = format!("io server 1 (tcp://{})", io_addrs[1]);
    assert!(e.to_string().contains(&named), "the error does not name {named}: {e}");

    // `status` says which server is down, by role and address, and fails.
    let down =
        Command::new(env!("CARGO_BIN_EXE_stripefs")).arg("--cluster").arg(&cluster).arg("status").output();
    let down = down.unwrap();
    assert_eq!(down.status.code(), Some(1));
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(err.contains(&named), "{err}");
    eprintln!("status with io server 1 stopped: {err}");

    // Started again from the same cluster file, it serves what was synced before the SIGTERM.
    io[1] = serve(&net, 2, &["--io", "1"], &cluster, &format!("tcp://{}", io_addrs[1]));
    let again = dir.path().join("again.bin");
    ok(&cluster, &["cp", "sfs:/in.bin", again.to_str().unwrap()]);
    assert!(std::fs::read(&again).unwrap() == original[..], "a copied-in file read back different bytes");
    let c = Client::connect_with(&cfg, opts).unwrap();
    let f = c.open("/busy", Rights::READ).unwrap();
    let (got, n) = f.read_at(0, BytesMut::zeroed(synced.len())).unwrap();
    assert_eq!(n, synced.len());
    assert!(got[..] == synced[..], "data synced before the SIGTERM read back different");
    drop((f, c, _meta, io));

    let names = net.all_namespaces();
    drop(net);
    let left = listed_namespaces();
    for ns in names {
        assert!(!left.split_whitespace().any(|w| w == ns), "namespace {ns} left behind: {left}");
    }
}

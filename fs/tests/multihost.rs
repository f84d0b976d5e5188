//! A cluster of several hosts as an operator sets one up: `stripefs init` writes the cluster
//! file and key, and each server runs in a network namespace of its own (its own address, as
//! on its own host) with `stripefs serve --meta|--io I --cluster FILE`; the client commands
//! run from the test's namespace. An io server stopped by SIGTERM in the middle of writes (a
//! `stripefs cp` and a library client's) fails them with an error naming it, never a hang or
//! a panic, and started again from the same cluster file it serves what was synced before.
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

    // While io server 1 is stopped, `stripefs cp` is copying a stream (a FIFO the test feeds,
    // so it is still running whatever the speeds), and a library client writes on past a
    // synced prefix.
    let fifo = dir.path().join("stream");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
    let mut cp = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(&cluster)
        .args(["cp", fifo.to_str().unwrap(), "sfs:/stream.bin"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (fed_tx, fed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        let chunk = pattern(1 << 20, 13);
        // cp reads 16 MiB before each write to stripefs: once 33 MiB went in, it has written
        // to every io server at least once and is at its second write.
        for mib in 1u64.. {
            if std::io::Write::write_all(&mut w, &chunk).is_err() {
                return; // cp ended: the pipe is closed
            }
            if mib == 33 {
                fed_tx.send(()).unwrap();
            }
        }
    });

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
    fed_rx.recv_timeout(HANG).expect("cp copies the stream");
    started_rx.recv_timeout(HANG).expect("the writes started");
    let stopped = terminate(&mut io[1]);
    assert!(stopped.success(), "io server 1 ended with {stopped}");
    let named = format!("io server 1 (tcp://{})", io_addrs[1]);

    let e = done_rx.recv_timeout(HANG).expect("the write in progress failed rather than hung");
    eprintln!("the library write in progress failed: {e}");
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
    assert!(e.to_string().contains(&named), "the error does not name {named}: {e}");

    let t = Instant::now();
    let cp_status = loop {
        if let Some(s) = cp.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > HANG {
            let _ = cp.kill();
            panic!("stripefs cp still runs after io server 1 stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut cp_err = String::new();
    std::io::Read::read_to_string(&mut cp.stderr.take().unwrap(), &mut cp_err).unwrap();
    eprintln!("cp in progress: {cp_status}: {cp_err}");
    // Exit status 1 with a message, not a panic (101) or a signal.
    assert_eq!(cp_status.code(), Some(1), "{cp_err}");
    assert!(cp_err.starts_with("stripefs: ") && cp_err.contains(&named), "{cp_err}");
    assert!(!cp_err.contains("panicked"), "{cp_err}");

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

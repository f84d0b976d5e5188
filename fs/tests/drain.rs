//! Graceful stop of the servers: SIGTERM makes `stripefs serve` stop taking requests, finish
//! or fail the ones it serves, sync its data and exit with status 0 — an io server alone, and
//! a local cluster, which passes the signal on to its servers. Data acknowledged by a `sync`
//! before the signal reads back after the server is started again on the same directory.

mod common;

use bytes::BytesMut;
use common::{TestCluster, pattern};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use stripefs::cluster::{LocalCluster, ServerId};
use stripefs::proto::LayoutSpec;
use stripefs::{CreateOptions, Errno};

/// Only so that a server that never exits fails the test instead of hanging it.
const HANG: Duration = Duration::from_secs(60);

fn sigterm(pid: u32) {
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGTERM).expect("kill -TERM");
}

/// SIGTERM to a server of `c`; waits for it to exit and returns how it did.
fn terminate(c: &mut LocalCluster, id: ServerId) -> ExitStatus {
    sigterm(c.pid(id).expect("the server runs"));
    let t = Instant::now();
    loop {
        if let Some((_, s)) = c.reap_exited().into_iter().find(|(i, _)| *i == id) {
            return s;
        }
        assert!(t.elapsed() < HANG, "{id} did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn striped() -> CreateOptions {
    CreateOptions {
        mode: 0o644,
        layout: Some(LayoutSpec { base: Some(0), pcount: Some(2), ssize: Some(65536) }),
    }
}

#[test]
fn an_io_server_stopped_by_sigterm_exits_0_and_keeps_synced_data() {
    let mut tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    let data = pattern(3 << 20, 7);
    let f = c.create("/kept", striped()).unwrap();
    f.write_all_at(0, &data).unwrap();
    f.sync().unwrap();

    let status = terminate(&mut tc.cluster, ServerId::Io(0));
    assert!(status.success(), "io server 0 ended with {status}");

    // The client's connection to it is gone: a read fails with a clear error, no hang.
    let e = f.read_at(0, BytesMut::zeroed(data.len())).expect_err("read from a stopped server");
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");

    tc.cluster.restart(ServerId::Io(0)).unwrap();
    let c = tc.client();
    let f = c.open("/kept", stripefs::capability::Rights::READ).unwrap();
    let (got, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    assert_eq!(n, data.len());
    assert!(got[..] == data[..], "data synced before SIGTERM read back different");
}

#[test]
fn sigterm_during_a_write_fails_it_cleanly_and_keeps_what_was_synced() {
    let mut tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    let synced = pattern(1 << 20, 11);
    let f = c.create("/busy", striped()).unwrap();
    f.write_all_at(0, &synced).unwrap();
    f.sync().unwrap();

    // Writes after the synced prefix until one fails; the server is stopped meanwhile.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let writer = std::thread::spawn(move || {
        let more = pattern(1 << 20, 12);
        for i in 1u64.. {
            if i == 2 {
                started_tx.send(()).unwrap();
            }
            if let Err(e) = f.write_at(i << 20, &more) {
                return e;
            }
        }
        unreachable!()
    });
    started_rx.recv().unwrap();
    let status = terminate(&mut tc.cluster, ServerId::Io(1));
    assert!(status.success(), "io server 1 ended with {status}");
    let e = writer.join().unwrap();
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e}");
    let addr = tc.cluster.config().io_servers[1].to_string();
    assert!(e.to_string().contains(&addr), "the error does not name the server ({addr}): {e}");

    tc.cluster.restart(ServerId::Io(1)).unwrap();
    let c = tc.client();
    let f = c.open("/busy", stripefs::capability::Rights::READ).unwrap();
    let (got, n) = f.read_at(0, BytesMut::zeroed(synced.len())).unwrap();
    assert_eq!(n, synced.len());
    assert!(got[..] == synced[..], "data synced before SIGTERM read back different");
}

/// Under systemd (`Type=notify`) a server says READY=1 once it listens and STOPPING=1 when
/// the stop signal comes, and exits 0.
#[test]
fn a_server_notifies_systemd_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let key = stripefs::cluster::ensure_key(dir.path()).unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(HANG)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["serve", "--io", "0", "--listen", "tcp://127.0.0.1:0", "--drain-timeout", "2s"])
        .arg("--data-dir")
        .arg(dir.path().join("io0"))
        .arg("--key-file")
        .arg(&key)
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("LISTEN "), "{line:?}");
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).expect("READY=1 from the server");
    assert_eq!(&buf[..n], b"READY=1");
    sigterm(child.id());
    let n = sock.recv(&mut buf).expect("STOPPING=1 from the server");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = child.wait().unwrap();
    assert!(status.success(), "the io server ended with {status}");
}

/// `stripefs serve` running a local cluster passes SIGTERM on to its servers, which all
/// exit 0, and then exits 0 itself.
#[test]
fn a_local_cluster_passes_sigterm_on_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["serve", "--io-servers", "2", "--listen", "127.0.0.1", "--drain-timeout", "2s"])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("use it with") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the launcher ended before the cluster ran");
    }
    let cfg = stripefs::config::ClusterConfig::load(&dir.path().join("cluster.toml")).unwrap();
    let c = stripefs::Client::connect(&cfg).unwrap();
    let f = c.create("/x", CreateOptions { mode: 0o644, layout: None }).unwrap();
    f.write_all_at(0, &pattern(100_000, 3)).unwrap();
    f.sync().unwrap();
    sigterm(child.id());
    let status = child.wait().unwrap();
    assert!(status.success(), "the launcher ended with {status}");
}

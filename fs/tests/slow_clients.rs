//! Clients that stop taking what they asked for — a download suspended with Ctrl-Z, a hung
//! process — hold nothing other clients need: the io server keeps serving everyone else, and
//! what the stopped clients held is given back once they go.
//!
//! The clients are `stripefs cp` processes, stopped with `SIGSTOP` as a shell's job control
//! does, and killed at the end.

mod common;

use common::{TestCluster, pattern};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::{Client, ClientOptions, CreateOptions, ServerState};

/// `stripefs` child processes, killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls the io server's status through `c` until it answers with requests in flight for
/// which `done` holds, or `limit` passes: the count, or how the last status failed.
fn wait_in_flight(c: &Client, limit: Duration, done: impl Fn(u64) -> bool) -> Result<u64, String> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match &c.status().io[0] {
            ServerState::Up(s) => Ok(s.in_flight),
            other => Err(format!("{other:?}")),
        };
        if last.as_ref().is_ok_and(|&n| done(n)) || Instant::now() >= deadline {
            return last;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// More stopped downloads than the io server has workers: another client still writes and
/// reads a file on the same server, within a deadline far shorter than the transport's stall
/// timeout; once the stopped clients are killed the server holds none of their requests.
#[test]
fn downloads_stopped_mid_read_leave_the_io_server_serving_others() {
    const STOPPED: usize = 8;
    const WORKERS: u64 = 4;
    const BIG: usize = 512 << 20;
    let tc = TestCluster::start("tcp", 1);
    let c = tc.client();
    let f = c.create("/big", CreateOptions::default()).unwrap();
    let chunk = pattern(8 << 20, 1);
    for i in 0..BIG / chunk.len() {
        f.write_at((i * chunk.len()) as u64, &chunk).unwrap();
    }
    drop((f, c));

    let mut children = Children(Vec::new());
    for _ in 0..STOPPED {
        let child = Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .arg("--cluster")
            .arg(tc.cluster.config_path())
            .args(["cp", "sfs:/big", "/dev/null"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        children.0.push(child);
    }
    std::thread::sleep(Duration::from_secs(1));
    for child in &children.0 {
        kill(Pid::from_raw(child.id() as i32), Signal::SIGSTOP).unwrap();
    }

    // A client that gives up long before the transport would drop the stopped ones, so that a
    // server whose workers all wait on them shows here as a failed call.
    let opts = ClientOptions { timeout: Duration::from_secs(3), ..Default::default() };
    let other = Client::connect_with(tc.cluster.config(), opts).unwrap();
    // The stopped downloads hold at least as many reads at the server as it has workers (or
    // the test would prove nothing; a status does not count itself).
    let held = wait_in_flight(&other, Duration::from_secs(30), |n| n >= WORKERS);
    assert!(held.as_ref().is_ok_and(|&n| n >= WORKERS), "the io server's status: {held:?}");

    let data = pattern(4 << 20, 2);
    for round in 0..3 {
        let path = format!("/small{round}");
        let f = other.create(&path, CreateOptions::default()).unwrap();
        f.write_at(0, &data).unwrap_or_else(|e| panic!("write {path}: {e}"));
        drop(f);
        let f = other.open(&path, Rights::READ).unwrap();
        let (got, n) =
            f.read_at(0, bytes::BytesMut::zeroed(data.len())).unwrap_or_else(|e| panic!("read {path}: {e}"));
        assert!(n == data.len() && got[..] == data[..], "{path} read back different bytes");
    }

    drop(children);
    // Nothing is left once the killed clients' connections are gone.
    let left = wait_in_flight(&other, Duration::from_secs(60), |n| n == 0);
    assert_eq!(left, Ok(0), "requests in flight after the stopped clients were killed");
}

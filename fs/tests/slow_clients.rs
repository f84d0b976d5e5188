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
use stripefs::net::{TAG_META, endpoint_config};
use stripefs::proto::{self, Envelope, MetaCall, MetaRequest};
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
    // A client that gives up long before the transport would drop the stopped ones (a third
    // of its stall timeout), so that a server whose workers all wait on them shows here as a
    // failed call. The server needs a second per stopped client and worker to tell them slow.
    let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
    let other = Client::connect_with(tc.cluster.config(), opts).unwrap();
    // The stopped downloads must hold at least as many reads at the server as it has workers,
    // or the test would prove nothing (a status does not count itself). On a loaded machine a
    // download may not have started, or may be between reads, when it is stopped: then they
    // are let go on and stopped again.
    let mut held = Err(String::from("never stopped"));
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        for child in &mut children.0 {
            let st = child.try_wait();
            assert!(matches!(st, Ok(None)), "a download ended before it was stopped: {st:?}");
            kill(Pid::from_raw(child.id() as i32), Signal::SIGSTOP).unwrap();
        }
        held = wait_in_flight(&other, Duration::from_secs(15), |n| n >= WORKERS);
        // An unanswered status is the lockout itself: no second try hides it.
        if !matches!(held, Ok(n) if n < WORKERS) {
            break;
        }
        for child in &children.0 {
            kill(Pid::from_raw(child.id() as i32), Signal::SIGCONT).unwrap();
        }
    }
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

/// A client that asks for many directory pages at once and then reads none of its answers
/// (its process stopped, or hostile) holds no meta server worker: the answers that cannot go
/// out wait apart from the workers, and another client goes on making, listing and looking up
/// names, within a deadline far shorter than the transport's stall timeout.
#[test]
fn a_client_that_stops_reading_answers_leaves_the_meta_server_serving_others() {
    const PAGES: u64 = 256;
    let tc = TestCluster::start("tcp", 1);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    // Full pages: 256 names of 200 bytes, about 60 KiB an answer, 15 MiB for them all.
    for i in 0..256 {
        let name = format!("/d/{i:0>200}");
        drop(c.create(&name, CreateOptions::default()).unwrap());
    }
    let dir = c.stat("/d").unwrap().handle;
    // No progress thread: once this test stops calling it, nothing reads its socket.
    let ep =
        ionet::Endpoint::client(endpoint_config(&tc.key(), ionet::WaitMode::Block, false, None)).unwrap();
    let meta = ep.connect(&tc.cluster.config().meta).unwrap();
    let ops: Vec<_> = (0..PAGES)
        .map(|id| {
            let call =
                MetaCall { cred: c.cred().clone(), req: MetaRequest::Readdir { dir, after: None, max: 256 } };
            let header = proto::encode(&Envelope::new(id, call)).unwrap();
            ep.request(
                meta,
                TAG_META,
                bytes::Bytes::from(header),
                ionet::Payload::None,
                ionet::ServiceLevel::Normal,
            )
            .unwrap()
        })
        .collect();
    // Sends the requests; the first answer shows they reached the server.
    let first = ep.wait_timeout(ops[0], Duration::from_secs(30)).unwrap().expect("the first page");
    assert!(first.result.is_ok(), "{:?}", first.result);

    // Gives up long before the transport would drop the silent client (a third of its stall
    // timeout).
    let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
    let other = Client::connect_with(tc.cluster.config(), opts).unwrap();
    for round in 0..3 {
        let name = format!("/e{round}");
        other.mkdir(&name, 0o755).unwrap_or_else(|e| panic!("mkdir {name}: {e}"));
        let names = other.readdir("/").unwrap_or_else(|e| panic!("readdir /: {e}"));
        assert!(names.iter().any(|e| *e.name == name[1..]), "{name} not listed");
        other.stat(&name).unwrap_or_else(|e| panic!("stat {name}: {e}"));
    }
    drop(ep);
}

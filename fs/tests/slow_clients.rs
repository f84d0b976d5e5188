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

/// A write that waits for bytes another client's stopped read holds waits apart from the
/// workers, and its own client is not made to wait behind it: that client (a mount serves a
/// whole host through one connection) goes on reading other files while the write waits.
#[test]
fn a_write_behind_a_stopped_read_leaves_its_client_served() {
    use stripefs::capability::CapabilityKey;
    use stripefs::layout::Extent;
    use stripefs::net::TAG_IO;
    use stripefs::proto::{Descriptor, IoReply, IoRequest};
    const BIG: usize = 64 << 20;
    // Writes go through mappings on the disk too, as reads do: the mapped path is the one where
    // a write waits for a range a read holds.
    let tc = TestCluster::start_with("tcp", 1, |o| o.io_args.push("--map-disk-writes".into()));
    let c = tc.client();
    let f = c.create("/big", CreateOptions::default()).unwrap();
    let chunk = pattern(8 << 20, 1);
    for i in 0..BIG / chunk.len() {
        f.write_at((i * chunk.len()) as u64, &chunk).unwrap();
    }
    let h = f.handle();
    drop(f);
    let data = pattern(1 << 20, 2);
    let f = c.create("/other", CreateOptions::default()).unwrap();
    f.write_at(0, &data).unwrap();
    drop((f, c));

    // The stopped reader: asks for all of /big and never runs its endpoint again, with a
    // small socket so that little of the answer leaves the server.
    let key = tc.key();
    let cfg = endpoint_config(&key, ionet::WaitMode::Block, false, None).socket_buffer(64 << 10);
    let ep = ionet::Endpoint::client(cfg).unwrap();
    let io = ep.connect(&tc.cluster.config().io_servers[0]).unwrap();
    let ask = |req: IoRequest, payload| {
        let header = proto::encode(&Envelope::new(1, req)).unwrap();
        ep.request(io, TAG_IO, bytes::Bytes::from(header), payload, ionet::ServiceLevel::Normal).unwrap()
    };
    let ping = ep.wait(ask(IoRequest::Ping, ionet::Payload::None)).unwrap();
    let pong = proto::decode::<IoReply>(&ping.reply.expect("a reply")).unwrap().body;
    assert!(matches!(pong, IoReply::Pong), "{pong:?}");
    let cap =
        CapabilityKey::new(&key).unwrap().mint(h, Rights::READ, stripefs::capability::unix_now() + 600, 1);
    let desc = Descriptor::list(vec![Extent::new(0, BIG as u64)]).unwrap();
    let _read = ask(IoRequest::Read { cap, desc }, ionet::Payload::In(bytes::BytesMut::zeroed(BIG).into()));

    let opts = ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
    let other = std::sync::Arc::new(Client::connect_with(tc.cluster.config(), opts).unwrap());
    let held = wait_in_flight(&other, Duration::from_secs(15), |n| n >= 1);
    assert_eq!(held, Ok(1), "the stopped read never reached the server");

    // A write of 1 MiB (what a mount sends at a time) over the start of /big meets the range
    // the stopped read holds, and waits.
    let writer = {
        let other = other.clone();
        std::thread::spawn(move || {
            let f = other.open("/big", Rights::READ_WRITE).unwrap();
            f.write_at(0, &pattern(1 << 20, 3))
        })
    };
    let waiting = wait_in_flight(&other, Duration::from_secs(15), |n| n >= 2);
    assert_eq!(waiting, Ok(2), "the write never reached the server");
    // Meanwhile the same client reads another file, again and again, well past the second
    // after which the write waits out of the pool.
    let f = other.open("/other", Rights::READ).unwrap();
    for round in 0..6 {
        let (got, n) = f
            .read_at(0, bytes::BytesMut::zeroed(data.len()))
            .unwrap_or_else(|e| panic!("read {round} of /other while the write waits: {e}"));
        assert!(n == data.len() && got[..] == data[..], "/other read back different bytes");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The reads came while the write waited, not after it had ended (had they queued behind
    // it, they would have waited until the client gave it up).
    assert!(!writer.is_finished(), "the write ended before the reads did");
    let still = wait_in_flight(&other, Duration::ZERO, |_| true);
    assert_eq!(still, Ok(2), "the write did not wait for the stopped read throughout");
    // Once the stopped reader is gone, the write goes through.
    drop(ep);
    writer.join().unwrap().expect("the write once the reader is gone");
}

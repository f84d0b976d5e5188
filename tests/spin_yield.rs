//! Regression: a busy-polling (`WaitMode::Spin`) endpoint must let the peer it waits for run
//! when both share a CPU, over `softib://` and over `tcp://`; and a thread that waits by
//! spinning while another thread of its endpoint drives progress must let that driver run.
//!
//! The bug (first in the InfiniBand engine, then found in the TCP backend, where spinning
//! clients that share a CPU held it from each other): the spin loop never gave up its CPU, so whenever client and server shared
//! one (an oversubscribed host, or both pinned to one core) every protocol hand-off waited for
//! the spinner's scheduler slice to run out: ~8 ms per round trip at any size with the two on
//! one core, ~16 ms for server-based RDMA on a loaded two-core host (four hand-offs: RDV, FIN,
//! RDV, FIN) — a timer, not work.
//!
//! The test makes the scheduler's patience zero instead of measuring time: both endpoints'
//! driving threads run under `SCHED_FIFO` at the same priority on the same CPU, where a thread
//! runs until it blocks or yields — no slice, no tick preemption. A spinner that never yields
//! then starves its peer outright, the bounded wait runs out and the test fails; one that
//! yields when idle hands the CPU over at every hand-off and every round trip completes. The
//! same holds for two waiters of one endpoint (a server's worker pool with more workers than
//! cores): the one that is not driving can only watch for its completion, and if it watches
//! without yielding, the driver never reads the messages both wait for. The tests need
//! `CAP_SYS_NICE` (root) and two CPUs, so they are ignored unless asked for (`cargo test --
//! --ignored`, as CI does as root), and then fail where they cannot run their threads so.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::*;

/// Bound on every wait: a starved peer fails the test instead of hanging it.
const T: Duration = Duration::from_secs(10);
const ROUNDS: usize = 4;
const TAG: u64 = 7;
const SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];

/// Puts the calling thread on CPU 0 under `SCHED_FIFO` priority 1. Err: not permitted here.
fn realtime_on_cpu0() -> std::io::Result<()> {
    on_cpu(0)?;
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; `p` is live for the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Back to the default policy, so a failing test does not leave a real-time spinner behind.
fn normal_again() {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `p` is live for the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
}

fn wait_ok(ep: &Endpoint, op: OpId, what: &str) -> std::result::Result<Completion, String> {
    match ep.wait_timeout(op, T) {
        Ok(Some(c)) if c.result.is_ok() => Ok(c),
        Ok(Some(c)) => Err(format!("{what} failed: {:?}", c.result)),
        Ok(None) => Err(format!("{what}: no completion within {T:?} (peer starved?)")),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

#[test]
#[ignore = "needs root: runs threads under SCHED_FIFO (CAP_SYS_NICE)"]
fn spinning_softib_endpoints_sharing_a_cpu_hand_it_over() {
    hand_over("softib");
}

#[test]
#[ignore = "needs root: runs threads under SCHED_FIFO (CAP_SYS_NICE)"]
fn spinning_tcp_endpoints_sharing_a_cpu_hand_it_over() {
    hand_over("tcp");
}

/// Introduces the client to the server under normal scheduling (connection set-up is not
/// under test), driving both endpoints from this thread; returns the client's id on the server.
fn introduce(srv: &Endpoint, cli: &Endpoint, p: PeerId) -> PeerId {
    let hello = cli.send_unexpected(p, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    let deadline = Instant::now() + T;
    let mut sent = false;
    let sp = loop {
        assert!(Instant::now() < deadline, "introduction");
        sent = sent || cli.test(hello).unwrap().is_some();
        if let Some(u) = srv.recv_unexpected(Some(Duration::from_millis(1))).unwrap() {
            break u.peer;
        }
    };
    if !sent {
        wait_ok(cli, hello, "introduction").unwrap();
    }
    sp
}

fn hand_over(scheme: &str) {
    let cfg = || Config::default().wait_mode(WaitMode::Spin).max_message(4 << 20);
    let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), cfg()).unwrap();
    let cli = Endpoint::client(cfg()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let sp = introduce(&srv, &cli, p);

    let (ready_tx, ready_rx) = mpsc::channel();
    let server = std::thread::spawn(move || -> std::result::Result<(), String> {
        if let Err(e) = realtime_on_cpu0() {
            ready_tx.send(Err(e.to_string())).ok();
            return Ok(());
        }
        ready_tx.send(Ok(())).ok();
        let r = (|| {
            for &len in &SIZES {
                for _ in 0..ROUNDS {
                    let c = wait_ok(&srv, srv.recv(sp, TAG, BytesMut::zeroed(len)).unwrap(), "server recv")?;
                    let data = c.data().unwrap_or_default();
                    wait_ok(&srv, srv.send(sp, TAG, data, ServiceLevel::Normal).unwrap(), "server send")?;
                }
            }
            Ok(())
        })();
        normal_again();
        r
    });
    if let Err(e) = ready_rx.recv().unwrap() {
        server.join().unwrap().unwrap();
        panic!("cannot run threads under SCHED_FIFO here ({e}); needs CAP_SYS_NICE");
    }
    realtime_on_cpu0().unwrap();
    let before = cli.info().counters.spin_yields;
    let r = (|| {
        for &len in &SIZES {
            for i in 0..ROUNDS {
                let data = Bytes::from(vec![i as u8 ^ len as u8; len]);
                let recv = cli.recv(p, TAG, BytesMut::zeroed(len)).unwrap();
                wait_ok(&cli, cli.send(p, TAG, data.clone(), ServiceLevel::Normal).unwrap(), "client send")?;
                let c = wait_ok(&cli, recv, &format!("round trip {i} of {len} B"))?;
                if c.data().unwrap_or_default() != data {
                    return Err(format!("echo of {len} B differs"));
                }
            }
        }
        Ok(())
    })();
    normal_again();
    let yields = cli.info().counters.spin_yields - before;
    r.unwrap();
    server.join().unwrap().unwrap();
    assert!(yields > 0, "the client waited by spinning and handed the CPU over");
}

/// Puts the calling thread on `cpu` (normal scheduling). Err: not permitted or no such CPU.
fn on_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO / CPU_SET write inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above, `set` is a live cpu_set_t.
    unsafe {
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
    }
    // SAFETY: pid 0 is the calling thread; `set` is live for the call.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
#[ignore = "needs root: runs threads under SCHED_FIFO (CAP_SYS_NICE)"]
fn an_adaptive_waiter_that_does_not_drive_lets_the_driver_run() {
    waiter_hands_over("tcp");
}

#[test]
#[ignore = "needs root: runs threads under SCHED_FIFO (CAP_SYS_NICE)"]
fn an_adaptive_softib_waiter_that_does_not_drive_lets_the_driver_run() {
    waiter_hands_over("softib");
}

/// Two threads of one endpoint wait, spinning (`Adaptive` with a budget longer than the test),
/// on one CPU under `SCHED_FIFO`: one drives progress, the other can only watch for its
/// completion. A watcher that spins without yielding holds the CPU the driver needs (a
/// server's worker pool with more workers than cores); then neither message is ever read and
/// both waits run out.
fn waiter_hands_over(scheme: &str) {
    assert!(
        std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2,
        "needs two CPUs (the sender runs beside the two waiters' CPU)"
    );
    // The sender and this thread stay off CPU 0, where real-time spinners would starve them.
    if let Err(e) = on_cpu(1) {
        panic!("cannot pin threads here ({e})");
    }
    let cfg = Config::default().wait_mode(WaitMode::Adaptive).spin_budget(Duration::from_secs(60));
    let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), cfg).unwrap();
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(srv.local_addr().unwrap()).unwrap();
    let sp = introduce(&srv, &cli, p);
    let ops = [1u64, 2].map(|tag| (tag, srv.recv(sp, tag, BytesMut::zeroed(64 << 10)).unwrap()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let waiters: Vec<_> = ops
        .iter()
        .map(|&(tag, op)| {
            let (srv, ready) = (srv.clone(), ready_tx.clone());
            std::thread::spawn(move || -> std::result::Result<Option<Bytes>, String> {
                if let Err(e) = realtime_on_cpu0() {
                    ready.send(Err(e.to_string())).ok();
                    return Ok(None);
                }
                ready.send(Ok(())).ok();
                let r = wait_ok(&srv, op, &format!("receive of tag {tag}"));
                normal_again();
                r.map(|c| c.data())
            })
        })
        .collect();
    for _ in 0..2 {
        if let Err(e) = ready_rx.recv().unwrap() {
            for w in waiters {
                let _ = w.join();
            }
            panic!("cannot run threads under SCHED_FIFO here ({e}); needs CAP_SYS_NICE");
        }
    }
    // Both waiters are on CPU 0 now: one drives, the other watches. Only then do the
    // messages go out, so reading them needs the driver to get the CPU.
    std::thread::sleep(Duration::from_millis(50));
    for (tag, _) in ops {
        let data = Bytes::from(vec![tag as u8; 64 << 10]);
        wait_ok(&cli, cli.send(p, tag, data, ServiceLevel::Normal).unwrap(), "send").unwrap();
    }
    for ((tag, _), w) in ops.iter().zip(waiters) {
        let got = w.join().unwrap().unwrap().unwrap_or_default();
        assert!(got.len() == 64 << 10 && got.iter().all(|&b| b == *tag as u8), "tag {tag}: wrong bytes");
    }
}

//! Adaptive waits learn how long to spin: a client whose replies mostly come at once spins
//! only about as long as they need, and sleeps through a slow reply soon after it begins
//! instead of spinning the whole budget first.
//!
//! The budget is set far above what an in-process loopback reply needs, so the outcome does
//! not depend on the machine's speed: quick replies are caught within a small part of it, and
//! the slow ones take several budgets. The quick exchanges go on for longer than the learnt
//! spin remembers (two periods of 20 ms), so what it learnt comes from them alone.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::*;

const T: Duration = Duration::from_secs(20);
const BUDGET: Duration = Duration::from_millis(40);
const SLOW_MS: u8 = 150;
/// How long the quick exchanges go on.
const QUICK: Duration = Duration::from_millis(100);
const SLOW_EXCHANGES: u64 = 5;
const TAG: Tag = 9;

/// Serves echo requests until told to stop (a message of two bytes); a request's first byte
/// is how many milliseconds to wait before answering.
fn serve(srv: &Endpoint) {
    loop {
        let m = srv.recv_unexpected(Some(T)).unwrap().expect("a request");
        if m.data.len() == 2 {
            return;
        }
        std::thread::sleep(Duration::from_millis(m.data[0].into()));
        let op = srv.send(m.peer, TAG, m.data, ServiceLevel::Normal).unwrap();
        assert!(srv.wait_timeout(op, T).unwrap().is_some_and(|c| c.result.is_ok()));
    }
}

fn exchange(cli: &Endpoint, peer: PeerId, delay_ms: u8) {
    let r = cli.recv(peer, TAG, BytesMut::zeroed(1)).unwrap();
    let s = cli.send_unexpected(peer, 0, Bytes::from(vec![delay_ms]), ServiceLevel::Normal).unwrap();
    assert!(cli.wait_timeout(s, T).unwrap().is_some_and(|c| c.result.is_ok()));
    assert!(cli.wait_timeout(r, T).unwrap().is_some_and(|c| c.result.is_ok()));
}

#[test]
fn a_wait_that_outlasts_what_recent_waits_needed_sleeps_before_the_budget() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let addr = srv.local_addr().unwrap();
    let cli = Endpoint::client(Config::default().wait_mode(WaitMode::Adaptive).spin_budget(BUDGET)).unwrap();
    let peer = cli.connect(addr).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| serve(&srv));
        let t0 = Instant::now();
        while t0.elapsed() < QUICK {
            exchange(&cli, peer, 0);
        }
        let before = cli.info().counters.spins_cut_short;
        for _ in 0..SLOW_EXCHANGES {
            exchange(&cli, peer, SLOW_MS);
        }
        let cut = cli.info().counters.spins_cut_short - before;
        let stop = cli.send_unexpected(peer, 0, Bytes::from_static(b"ok"), ServiceLevel::Normal).unwrap();
        assert!(cli.wait_timeout(stop, T).unwrap().is_some());
        // Every slow reply was slept through before the configured budget had passed.
        assert!(cut >= SLOW_EXCHANGES, "{cut} of {SLOW_EXCHANGES} slow waits slept before the budget");
    });
}

#[test]
fn waits_the_whole_budget_would_catch_keep_it() {
    // Replies that each take a few milliseconds, well within the budget: spinning catches
    // them every time, so the wait never cuts its spin short (a wake-up each time otherwise).
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let addr = srv.local_addr().unwrap();
    let cli = Endpoint::client(
        Config::default().wait_mode(WaitMode::Adaptive).spin_budget(Duration::from_millis(80)),
    )
    .unwrap();
    let peer = cli.connect(addr).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| serve(&srv));
        for _ in 0..REPEATS {
            exchange(&cli, peer, 5);
        }
        let stop = cli.send_unexpected(peer, 0, Bytes::from_static(b"ok"), ServiceLevel::Normal).unwrap();
        assert!(cli.wait_timeout(stop, T).unwrap().is_some());
    });
    assert_eq!(cli.info().counters.spins_cut_short, 0);
}

const REPEATS: usize = 20;

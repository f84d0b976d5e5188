use super::*;

/// A backend whose progress rounds find nothing: each lasts until its timeout (at most
/// 1 ms), as an epoll wait or a direct `recv` with a timeout does on a quiet network. With
/// `busy` set, its first `busy` rounds instead each take `busy_round` and do work (a
/// transfer streaming in). It records every round's timeout.
#[derive(Debug, Default)]
struct Quiet {
    rounds: std::sync::atomic::AtomicUsize,
    busy: usize,
    busy_round: Duration,
    timeouts: Mutex<Vec<Duration>>,
}

impl Backend for Arc<Quiet> {
    fn scheme(&self) -> Scheme {
        Scheme::Tcp
    }
    fn local_addr(&self) -> Option<Address> {
        None
    }
    fn connect(&self, _: &Address) -> Result<PeerId> {
        Ok(PeerId(0))
    }
    fn peer_addr(&self, _: PeerId) -> Option<Address> {
        None
    }
    fn post(&self, _: OpId, _: Cmd) -> Result<()> {
        Ok(())
    }
    fn cancel(&self, _: OpId, _: Error) {}
    fn progress(&self, timeout: Duration) -> Result<bool> {
        let mut t = self.timeouts.lock().unwrap();
        t.push(timeout);
        let busy = t.len() <= self.busy;
        drop(t);
        std::thread::sleep(if busy { self.busy_round } else { timeout.min(Duration::from_millis(1)) });
        self.rounds.fetch_add(1, Ordering::Relaxed);
        Ok(busy)
    }
    fn wake(&self) {}
    unmodelled_backend_methods!();
}

/// An adaptive waiter keeps polling while the rounds do work, even when that lasts longer
/// than its spin budget, and blocks once a budget has passed without any.
#[test]
fn an_adaptive_waiter_spins_while_rounds_do_work() {
    let cfg = Config::default().wait_mode(WaitMode::Adaptive).spin_budget(Duration::from_millis(1));
    let ep = Endpoint::new(cfg);
    // Each busy round alone outlasts the budget.
    let b = Arc::new(Quiet { busy: 5, busy_round: Duration::from_millis(3), ..Quiet::default() });
    assert!(ep.inner.backend.set(Box::new(b.clone())).is_ok());
    let op = ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
    // The op completes once the waiter has blocked after the busy rounds (or, if it never
    // does, after far longer than the budget), however slowly a loaded machine runs the rounds.
    std::thread::scope(|s| {
        s.spawn(|| {
            let give_up = Instant::now() + Duration::from_secs(5);
            loop {
                let t = b.timeouts.lock().unwrap().clone();
                if Instant::now() > give_up || (t.len() > 6 && t[6..].iter().any(|d| !d.is_zero())) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            ep.inner.completions.complete(Completion::new(op, OpKind::Recv, PeerId(0), 1));
        });
        assert!(ep.wait_timeout(op, Duration::from_secs(30)).unwrap().is_some());
    });
    let t = b.timeouts.lock().unwrap();
    // The five busy rounds, and the first round after them, poll.
    assert!(t.len() > 6, "{} rounds", t.len());
    assert!(t[..6].iter().all(Duration::is_zero), "a round during the transfer blocked: {:?}", &t[..6]);
    // Once quiet, the waiter blocks.
    assert!(t[6..].iter().any(|d| !d.is_zero()), "the waiter never blocked");
}

/// Three threads wait on their own receives: one drives, two sleep. A completion wakes only
/// the sleeper that waits for it; the other sleeps on, untouched.
#[test]
fn a_completion_wakes_only_the_thread_waiting_for_it() {
    let ep = Endpoint::new(Config::default().wait_mode(WaitMode::Block));
    assert!(ep.inner.backend.set(Box::new(Arc::new(Quiet::default()))).is_ok());
    let recv = || ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
    let ops = [recv(), recv(), recv()];
    let started = Instant::now();
    let ep = &ep;
    std::thread::scope(|s| {
        let waiters: Vec<_> = ops.iter().map(|&op| (op, s.spawn(move || ep.wait(op).unwrap()))).collect();
        let asleep = || -> Vec<(OpId, Arc<Condvar>)> {
            let st = ep.inner.completions.lock();
            st.sleepers
                .iter()
                .filter_map(|z| match z.want {
                    Want::Op(op) => Some((op, z.cv.clone())),
                    _ => None,
                })
                .collect()
        };
        while asleep().len() < 2 {
            std::thread::yield_now();
        }
        let sleepers = asleep();
        let (target, (other, other_cv)) = (sleepers[0].0, sleepers[1].clone());
        ep.inner.completions.complete(Completion::new(target, OpKind::Recv, PeerId(0), 1));
        let mut waiters = waiters;
        let i = waiters.iter().position(|w| w.0 == target).unwrap();
        assert_eq!(waiters.remove(i).1.join().unwrap().op, target);
        // A sleeper that woke (for nothing) would have gone back to sleep on a new
        // condition variable. Its own MAX_BLOCK re-check cannot have come yet.
        let still = asleep().into_iter().find(|z| z.0 == other).map(|z| z.1);
        let untouched = still.is_some_and(|cv| Arc::ptr_eq(&cv, &other_cv));
        let in_time = started.elapsed() < MAX_BLOCK;
        // Let the others go before asserting: a failed assertion in the scope would wait
        // for them forever.
        for op in ops.iter().filter(|&&op| op != target) {
            ep.inner.completions.complete(Completion::new(*op, OpKind::Recv, PeerId(0), 1));
        }
        for (op, w) in waiters {
            assert_eq!(w.join().unwrap().op, op);
        }
        assert!(untouched || !in_time, "the other sleeper was woken");
    });
}

/// Two threads wait on their own receives: one drives, the other sleeps. The driver's
/// empty rounds must not wake the sleeper (each wake-up is a futex call and a context
/// switch for nothing); only the completions and the driver's hand-over when it leaves do.
#[test]
fn a_sleeping_waiter_is_not_woken_by_empty_progress_rounds() {
    let ep = Endpoint::new(Config::default().wait_mode(WaitMode::Block));
    let quiet = Arc::new(Quiet::default());
    assert!(ep.inner.backend.set(Box::new(quiet.clone())).is_ok());
    let recv = || ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap();
    let (a, b) = (recv(), recv());
    let elapsed = std::thread::scope(|s| {
        let ta = s.spawn(|| ep.wait(a).unwrap());
        let tb = s.spawn(|| ep.wait(b).unwrap());
        // Both waiting (one asleep), then many empty rounds by the driver.
        while ep.inner.completions.lock().sleepers.is_empty() {
            std::thread::yield_now();
        }
        let t0 = Instant::now();
        let start = quiet.rounds.load(Ordering::Relaxed);
        while quiet.rounds.load(Ordering::Relaxed) < start + 100 {
            std::thread::yield_now();
        }
        ep.inner.completions.complete(Completion::new(a, OpKind::Recv, PeerId(0), 1));
        ep.inner.completions.complete(Completion::new(b, OpKind::Recv, PeerId(0), 1));
        assert_eq!((ta.join().unwrap().op, tb.join().unwrap().op), (a, b));
        t0.elapsed()
    });
    // At most: woken by each completion, by one hand-over, and by its own re-check every
    // MAX_BLOCK (a slow machine may stretch 100 rounds past one).
    let rechecks = (elapsed.as_millis() / MAX_BLOCK.as_millis()) as u64 + 1;
    let woken = ep.inner.completions.counters.waiter_wakeups.load(Ordering::Relaxed);
    assert!(woken <= 3 + rechecks, "the sleeping waiter was woken {woken} times over 100 empty rounds");
}

//! loom models of the endpoint's completion queue: the completion table, the one-driver rule,
//! the sleepers who wait for the driver, and the wake-ups between them — the real
//! [`Endpoint::wait_until`] loop over a stand-in backend.
//!
//! The stand-in behaves as the real backends do where it matters: `progress` blocks (as epoll
//! does) until the network delivers something or [`Backend::wake`] is called; it records
//! completions under its own lock, which it takes before the queue's; a send completes inside
//! `post` (TCP's write-at-once path) and `cancel` completes an unmatched receive at once.
//!
//! loom does not model time: `Condvar::wait_timeout` waits for a notification, and the
//! stand-in's `progress` ignores its timeout. So a model passes only if no waiter relies on
//! the 200 ms re-check (`MAX_BLOCK`) to notice a completion — a lost wake-up is a deadlock
//! here, where in production it would be a 200 ms stall.

use std::sync::Arc;

use loom::sync::atomic::AtomicUsize;

use super::*;
use crate::backend::{RecvCmd, SendCmd};
use crate::error::Error;

/// What the stand-in network knows.
#[derive(Debug, Default)]
struct NetState {
    /// Receives posted and not yet matched by the network.
    posted: Vec<(OpId, PeerId, Tag)>,
    /// Receives whose message arrived: the next progress round completes them.
    arrived: Vec<(OpId, PeerId, Tag)>,
    /// `wake` was called since the last round.
    woken: bool,
}

#[derive(Debug)]
struct Net {
    completions: Arc<Completions>,
    st: Mutex<NetState>,
    cv: Condvar,
    /// Threads inside `progress` (the endpoint promises at most one).
    driving: AtomicUsize,
}

impl Net {
    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.st.lock().unwrap()
    }

    /// A message for a posted receive arrives (what makes epoll return in a real backend).
    fn arrive(&self, op: OpId) {
        let mut st = self.lock();
        if let Some(i) = st.posted.iter().position(|p| p.0 == op) {
            let p = st.posted.remove(i);
            st.arrived.push(p);
            self.cv.notify_all();
        }
    }
}

#[derive(Debug)]
struct Stand(Arc<Net>);

impl Backend for Stand {
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
    fn post(&self, op: OpId, cmd: Cmd) -> Result<()> {
        let mut st = self.0.lock();
        match cmd {
            Cmd::Recv(RecvCmd { peer, tag, .. }) => st.posted.push((op, peer, tag)),
            Cmd::Send(SendCmd { peer, tag, buf, .. }) => {
                // Written at once: completes before `post` returns, recorded under our lock.
                let mut c = Completion::new(op, OpKind::Send, peer, tag);
                c.result = Ok(buf.len());
                self.0.completions.complete(c);
            }
            _ => return Err(Error::misuse("not modelled")),
        }
        Ok(())
    }
    fn cancel(&self, op: OpId, why: Error) {
        let mut st = self.0.lock();
        if let Some(i) = st.posted.iter().position(|p| p.0 == op) {
            let (op, peer, tag) = st.posted.remove(i);
            let mut c = Completion::new(op, OpKind::Recv, peer, tag);
            c.result = Err(why);
            self.0.completions.complete(c);
        }
    }
    fn progress(&self, timeout: Duration) -> Result<bool> {
        let others = self.0.driving.fetch_add(1, Ordering::SeqCst);
        assert_eq!(others, 0, "two threads drive progress at once");
        let mut st = self.0.lock();
        let mut worked = false;
        loop {
            if !st.arrived.is_empty() {
                let mut done: Vec<Completion> = st
                    .arrived
                    .drain(..)
                    .map(|(op, peer, tag)| {
                        let mut c = Completion::new(op, OpKind::Recv, peer, tag);
                        c.result = Ok(1);
                        c
                    })
                    .collect();
                self.0.completions.complete_all(&mut done);
                worked = true;
                break;
            }
            if std::mem::take(&mut st.woken) || timeout.is_zero() {
                break;
            }
            st = self.0.cv.wait(st).unwrap();
        }
        drop(st);
        self.0.driving.fetch_sub(1, Ordering::SeqCst);
        Ok(worked)
    }
    fn wake(&self) {
        let mut st = self.0.lock();
        st.woken = true;
        self.0.cv.notify_all();
    }
    unmodelled_backend_methods!();
}

/// An endpoint over the stand-in, with blocking waits (spinning would only make loom explore
/// longer schedules of the same states).
fn endpoint() -> (Endpoint, Arc<Net>) {
    let ep = Endpoint::new(Config::default().wait_mode(WaitMode::Block));
    let net = Arc::new(Net {
        completions: ep.inner.completions.clone(),
        st: Mutex::new(NetState::default()),
        cv: Condvar::new(),
        driving: AtomicUsize::new(0),
    });
    assert!(ep.inner.backend.set(Box::new(Stand(net.clone()))).is_ok());
    (ep, net)
}

fn recv(ep: &Endpoint) -> OpId {
    ep.recv(PeerId(0), 1, bytes::BytesMut::zeroed(1)).unwrap()
}

/// Nothing left behind: every op was completed and taken exactly once.
fn assert_drained(ep: &Endpoint) {
    let st = ep.inner.completions.lock();
    assert!(st.ops.is_empty(), "ops never completed or never taken: {:?}", st.ops);
    assert_eq!(st.done, 0, "completions counted but not in the table");
    assert!(!st.driving);
}

/// Two threads wait on their own receives; the network completes them in either order. One
/// drives, the other sleeps; whichever op completes, its owner returns, and the sleeper takes
/// over driving when the driver leaves.
#[test]
fn loom_two_waiters_one_driver() {
    loom::model(|| {
        let (ep, net) = endpoint();
        let (a, b) = (recv(&ep), recv(&ep));
        let n = net.clone();
        let network = loom::thread::spawn(move || {
            n.arrive(b);
            n.arrive(a);
        });
        let ep2 = ep.clone();
        let other = loom::thread::spawn(move || ep2.wait(b).unwrap());
        let ca = ep.wait(a).unwrap();
        let cb = other.join().unwrap();
        network.join().unwrap();
        assert_eq!((ca.op, cb.op), (a, b));
        assert!(ca.is_ok() && cb.is_ok());
        assert_drained(&ep);
    });
}

/// A receive cancelled by another thread while its owner waits (and may be the driver,
/// blocked in the backend) ends with `Cancelled`, once.
#[test]
fn loom_cancel_from_another_thread_ends_the_wait() {
    loom::model(|| {
        let (ep, _net) = endpoint();
        let a = recv(&ep);
        let ep2 = ep.clone();
        let canceller = loom::thread::spawn(move || ep2.cancel(a).unwrap());
        let c = ep.wait(a).unwrap();
        canceller.join().unwrap();
        assert!(matches!(c.result, Err(Error::Cancelled)), "{:?}", c.result);
        assert_drained(&ep);
    });
}

/// `wait_any` returns a completion that another thread's `post` made inline (a send written
/// at once), even while the waiter is the driver blocked in the backend.
#[test]
fn loom_wait_any_sees_a_completion_made_by_another_thread() {
    loom::model(|| {
        let (ep, _net) = endpoint();
        let ep2 = ep.clone();
        let poster = loom::thread::spawn(move || {
            ep2.send(PeerId(0), 7, bytes::Bytes::from_static(b"x"), ServiceLevel::Normal).unwrap()
        });
        let c = ep.wait_any(None).unwrap().expect("a completion");
        let op = poster.join().unwrap();
        assert_eq!((c.op, c.kind, c.len()), (op, OpKind::Send, 1));
        assert_drained(&ep);
    });
}

/// An op completing while its owner has not started waiting yet, with a second waiter driving:
/// the owner finds it without driving, and the driver is not left blocked forever.
#[test]
fn loom_completion_before_wait_and_a_concurrent_driver() {
    loom::model(|| {
        let (ep, net) = endpoint();
        let (a, b) = (recv(&ep), recv(&ep));
        let ep2 = ep.clone();
        let n = net.clone();
        let driver = loom::thread::spawn(move || ep2.wait(b).unwrap());
        n.arrive(a);
        let ca = ep.wait(a).unwrap();
        net.arrive(b);
        let cb = driver.join().unwrap();
        assert!(ca.is_ok() && cb.is_ok());
        assert_drained(&ep);
    });
}

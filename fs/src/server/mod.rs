//! The servers: [`meta::MetaServer`] (namespace, layouts, capabilities) and [`io::IoServer`]
//! (object data). Both are a leader/followers pool of worker threads over one bound ionet
//! endpoint without a progress thread ([`spawn_workers`]): one worker at a time waits in
//! `next_request`, driving the transport itself, and serves the request it receives start to end
//! (pipelined transfers included) after handing the lead to an idle worker. Several requests —
//! from one client or many — are therefore served at once, up to the number of workers, and a
//! request reaches the thread that serves it without a hand-off.
//!
//! Nothing a peer sends panics a worker: headers go through [`proto::decode`] (bounded, typed
//! errors answered with an error reply), every io request's capability is checked before the
//! store is touched, and data moves through a bounded number of transfer-unit buffers.

pub mod io;
pub mod meta;

use crate::proto::{self, Envelope, ErrorReply, Reply};
use bytes::Bytes;
use ionet::{Endpoint, Request};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, warn};

/// How long a worker waits in `next_request` before checking for shutdown.
const POLL: Duration = Duration::from_millis(200);

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The transport refused (bind failed, transport not available, …).
    #[error("transport: {0}")]
    Net(#[from] ionet::Error),
    /// The metadata store.
    #[error(transparent)]
    Meta(#[from] crate::meta::MetaError),
    /// The object store or another local resource.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The cluster key.
    #[error(transparent)]
    Key(#[from] crate::capability::CapError),
    /// The cluster file.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A setting that does not make sense.
    #[error("invalid setting: {0}")]
    Invalid(String),
}

/// Encodes `body` as the reply to request `id` and sends it; an unencodable reply becomes an
/// error reply. Waits until the reply is on its way, so its completion is reaped.
pub(crate) fn send_reply<R: Reply>(ep: &Endpoint, req: Request, id: u64, body: R) {
    let bytes = match proto::encode(&Envelope::new(id, body)) {
        Ok(b) => b,
        Err(e) => {
            warn!(error = %e, "reply does not encode; sending an error instead");
            let err = R::from_error(ErrorReply::new(e.errno(), &e));
            match proto::encode(&Envelope::new(id, err)) {
                Ok(b) => b,
                Err(_) => return, // dropping the request sends a transport-level error
            }
        }
    };
    match req.reply(Bytes::from(bytes)) {
        Ok(op) => {
            if let Err(e) = ep.wait(op).and_then(|c| c.result) {
                debug!(error = %e, "reply not delivered");
            }
        }
        Err(e) => debug!(error = %e, "reply not posted"),
    }
}

/// Running server threads. Dropping the handle stops them.
#[derive(Debug)]
pub struct ServerHandle {
    ep: Endpoint,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl ServerHandle {
    pub(crate) fn new(ep: Endpoint, stop: Arc<AtomicBool>, threads: Vec<JoinHandle<()>>) -> Self {
        ServerHandle { ep, stop, threads }
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> Option<ionet::Address> {
        self.ep.local_addr()
    }

    /// The server's endpoint (for its counters).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Blocks until the server stops (it only stops when told to).
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops the workers (each finishes its current request) and waits for them.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Which worker waits for the next request: at most one at a time (the *leader*); the others
/// (*followers*) sleep here, not on the endpoint.
#[derive(Debug, Default)]
struct Leadership {
    st: Mutex<LeaderState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct LeaderState {
    /// A worker is waiting in `next_request`.
    taken: bool,
    /// Followers asleep on `cv` (a notify costs a futex call, so it is skipped when none).
    sleeping: usize,
}

impl Leadership {
    fn lock(&self) -> MutexGuard<'_, LeaderState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no other worker leads, then leads. `false` when stopping.
    fn acquire(&self, stop: &AtomicBool) -> bool {
        let mut st = self.lock();
        while st.taken {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            st.sleeping += 1;
            st = self.cv.wait_timeout(st, POLL).unwrap_or_else(|p| p.into_inner()).0;
            st.sleeping -= 1;
        }
        st.taken = true;
        true
    }

    /// Gives up the lead and wakes one follower to take it.
    fn release(&self) {
        let mut st = self.lock();
        st.taken = false;
        if st.sleeping > 0 {
            self.cv.notify_one();
        }
    }
}

/// Runs `handle` for every request on `ep` in `workers` threads until `stop`, as a
/// leader/followers pool: one worker waits in `next_request` (with no progress thread it drives
/// the transport itself, so the request it gets needs no hand-off between threads); when a
/// request arrives it wakes one follower to lead and serves the request itself. Idle workers
/// sleep on the pool's own condition variable, so the transport's completions wake only the
/// threads that wait for them — not every idle worker.
pub(crate) fn spawn_workers<F>(
    name: &str,
    ep: &Endpoint,
    workers: usize,
    stop: &Arc<AtomicBool>,
    handle: F,
) -> std::io::Result<Vec<JoinHandle<()>>>
where
    F: Fn(Request) + Send + Sync + 'static,
{
    let handle = Arc::new(handle);
    let lead = Arc::new(Leadership::default());
    (0..workers.max(1))
        .map(|i| {
            let (ep, stop, handle, lead) = (ep.clone(), stop.clone(), handle.clone(), lead.clone());
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                while lead.acquire(&stop) {
                    let req = loop {
                        if stop.load(Ordering::Relaxed) {
                            break None;
                        }
                        match ep.next_request(Some(POLL)) {
                            Ok(Some(req)) => break Some(req),
                            Ok(None) => {}
                            Err(e) => {
                                warn!(error = %e, "next_request failed");
                                std::thread::sleep(POLL);
                            }
                        }
                    };
                    lead.release();
                    match req {
                        Some(req) => handle(req),
                        None => break,
                    }
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ionet::{Config, Payload, ServiceLevel};
    use std::time::Instant;

    /// Waits until `n` threads arrived, or 10 s; true if all arrived.
    fn meet(m: &(Mutex<usize>, Condvar), n: usize) -> bool {
        let mut k = m.0.lock().unwrap();
        *k += 1;
        m.1.notify_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        while *k < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            k = m.1.wait_timeout(k, left).unwrap().0;
        }
        true
    }

    /// A bound endpoint, a client connected to it, and `workers` pool threads running `handle`.
    fn pool(
        workers: usize,
        handle: impl Fn(Request) + Send + Sync + 'static,
    ) -> (Endpoint, ionet::PeerId, ServerHandle) {
        let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = spawn_workers("t", &ep, workers, &stop, handle).unwrap();
        let addr = ep.local_addr().unwrap();
        let client = Endpoint::client(Config::default()).unwrap();
        let peer = client.connect(&addr).unwrap();
        (client, peer, ServerHandle::new(ep, stop, threads))
    }

    fn ask(c: &Endpoint, peer: ionet::PeerId) -> ionet::OpId {
        let op = c.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        c.set_deadline(op, Instant::now() + Duration::from_secs(20)).unwrap();
        op
    }

    /// Two requests in flight are served at the same time by two workers: each handler waits
    /// for the other, which a pool serving one request at a time never gets past (it answers
    /// "alone" after 10 s instead).
    #[test]
    fn requests_are_served_concurrently_up_to_the_worker_count() {
        let m = Arc::new((Mutex::new(0usize), Condvar::new()));
        let (c, peer, server) = pool(2, move |req| {
            let answer: &'static [u8] = if meet(&m, 2) { b"together" } else { b"alone" };
            let _ = req.reply(Bytes::from_static(answer));
        });
        let ops = [ask(&c, peer), ask(&c, peer)];
        for op in ops {
            let done = c.wait(op).unwrap();
            assert!(done.result.is_ok(), "{:?}", done.result);
            assert_eq!(done.reply.as_deref(), Some(&b"together"[..]));
        }
        server.shutdown();
    }

    /// With one worker every request is still answered, one after the other, and the lead
    /// passes back to the same thread each time.
    #[test]
    fn a_single_worker_serves_requests_in_turn() {
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let s = served.clone();
        let (c, peer, server) = pool(1, move |req| {
            s.fetch_add(1, Ordering::Relaxed);
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        let ops: Vec<_> = (0..20).map(|_| ask(&c, peer)).collect();
        for op in ops {
            assert!(c.wait(op).unwrap().result.is_ok());
        }
        assert_eq!(served.load(Ordering::Relaxed), 20);
        server.shutdown();
    }

    #[test]
    fn leadership_is_exclusive_and_passes_on() {
        let l = Arc::new(Leadership::default());
        let stop = AtomicBool::new(false);
        assert!(l.acquire(&stop));
        let l2 = l.clone();
        let follower = std::thread::spawn(move || {
            let stop = AtomicBool::new(false);
            l2.acquire(&stop)
        });
        // The follower sleeps until the lead is released.
        let t = Instant::now();
        while l.lock().sleeping == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "follower never waited");
            std::thread::yield_now();
        }
        assert!(!follower.is_finished());
        l.release();
        assert!(follower.join().unwrap(), "the follower takes the lead");
        assert!(l.lock().taken);
        // A stopping pool does not wait for a lead that is never released.
        stop.store(true, Ordering::Relaxed);
        assert!(!l.acquire(&stop));
    }
}

//! The servers' worker pool: threads over one bound endpoint without a progress thread,
//! one of which leads (waits in `next_request`, driving the transport) while the others help.

use ionet::{Completion, Endpoint, OpId, PeerId, Request};
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, warn};

/// How long a push, pull or reply may wait before its client counts as slow. A transfer unit
/// or an answer takes milliseconds on any working link; a client that has taken none of it for
/// a second is stopped, hung or overwhelmed, and may stay so until the transport gives up on
/// it.
pub const CLIENT_STALL: Duration = Duration::from_secs(1);

/// How long a worker waits in `next_request` before checking for shutdown.
const POLL: Duration = Duration::from_millis(200);

/// How often a standing-by worker looks for requests while the leader serves one: the bound on
/// how long a new request waits when the busy leader is not driving the transport (a long disk
/// operation) and so does not queue it.
const STANDBY: Duration = Duration::from_millis(1);

/// Who does what in a worker pool. One worker at a time *leads*: it waits in `next_request` and
/// serves what it receives itself, keeping the lead. A client's next request, which usually
/// follows the reply within microseconds, then meets a thread that is already polling for it,
/// as in a single-threaded server — not one that went to sleep in the transport while the
/// previous request was served (over InfiniBand the client pays for waking it). The other
/// workers (*helpers*) sleep here, not on the endpoint. While the leader serves, every request
/// the transport queues wakes one helper to serve it (through [`Endpoint::on_request`]), and one
/// helper stands by, looking every [`STANDBY`] for requests nobody has queued.
#[derive(Debug, Default)]
struct Pool {
    st: Mutex<PoolState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    /// A worker leads.
    led: bool,
    /// The leader is serving a request (not waiting in `next_request`).
    serving: bool,
    /// Requests queued while the leader serves that no woken helper has looked for yet.
    queued: usize,
    /// A helper stands by.
    standby: bool,
    /// Workers asleep on `cv` (a notify costs a futex call, so it is skipped when none).
    sleeping: usize,
}

/// What [`Pool::role`] gives a worker to do.
#[derive(Debug, PartialEq, Eq)]
enum Role {
    /// Lead: wait for requests and serve them, until stopping.
    Lead,
    /// Take a request that is there, without waiting, and serve it.
    Help,
    /// The pool is stopping.
    Stop,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for something to do.
    fn role(&self, stop: &AtomicBool) -> Role {
        let mut st = self.lock();
        loop {
            if stop.load(Ordering::Relaxed) {
                return Role::Stop;
            }
            if !st.led {
                st.led = true;
                return Role::Lead;
            }
            if st.queued > 0 {
                st.queued -= 1;
                return Role::Help;
            }
            let standby = st.serving && !st.standby;
            st.standby |= standby;
            st.sleeping += 1;
            let nap = if standby { STANDBY } else { POLL };
            let (g, r) = self.cv.wait_timeout(st, nap).unwrap_or_else(|p| p.into_inner());
            st = g;
            st.sleeping -= 1;
            if standby {
                st.standby = false;
                if r.timed_out() && st.serving {
                    return Role::Help;
                }
            }
        }
    }

    /// The leader took a request (`true`) or finished serving it (`false`: it takes whatever
    /// is queued itself from now on).
    fn serving(&self, on: bool) {
        let mut st = self.lock();
        st.serving = on;
        if !on {
            st.queued = 0;
        }
    }

    /// The leader gives up the lead: the pool is stopping, or its handler panicked.
    fn step_down(&self) {
        let mut st = self.lock();
        st.led = false;
        st.serving = false;
        if st.sleeping > 0 {
            self.cv.notify_all();
        }
    }

    /// The transport queued a request: if the leader is busy serving, wake a helper for it.
    fn request_queued(&self) {
        let mut st = self.lock();
        if st.serving {
            st.queued += 1;
            if st.sleeping > 0 {
                self.cv.notify_one();
            }
        }
    }
}

/// Runs `handle` for every request on `ep` in `workers` threads until `stop`: a leader that
/// serves what it receives and keeps the lead, and helpers for requests that arrive while it
/// is busy (see [`Pool`]). With no progress thread, whoever waits drives the transport, so a
/// request reaches the thread that serves it without a hand-off.
///
/// A handler whose request waits on its client (one that stopped taking its data: a process
/// suspended with Ctrl-Z, a hung host) can take its thread out of the pool ([`Worker::leave`]):
/// a new worker takes its place at once, and from then on that client's requests queue for the
/// threads that left for it (its *lane*) instead of taking workers, until its lane is empty
/// or the client keeps up again. So clients that stop taking their data hold no worker others
/// need, and the requests of each are served in turn. At most `max_left` threads are out of
/// the pool at a time.
pub(crate) fn spawn_workers<F>(
    name: &str,
    ep: &Endpoint,
    workers: usize,
    max_left: usize,
    stop: &Arc<AtomicBool>,
    handle: F,
) -> std::io::Result<Threads>
where
    F: Fn(Request, &Worker) + Send + Sync + 'static,
{
    let pool = Arc::new(Pool::default());
    let p = pool.clone();
    if let Err(e) = ep.on_request(move || p.request_queued()) {
        return Err(std::io::Error::other(e.to_string()));
    }
    // At error level, so that warnings and errors from any worker name the server (its role
    // and address) whatever the log level; entered once per thread, not per request.
    let addr = ep.local_addr().map_or_else(String::new, |a| a.to_string());
    let crew = Arc::new(Crew {
        name: name.to_owned(),
        span: tracing::error_span!("server", role = name, %addr),
        ep: ep.clone(),
        stop: stop.clone(),
        pool,
        handle: Box::new(handle),
        threads: Threads::default(),
        lanes: Mutex::default(),
        next: AtomicUsize::new(0),
        left: AtomicUsize::new(0),
        max_left,
    });
    for _ in 0..workers.max(1) {
        if let Err(e) = crew.spawn() {
            // The server does not start, so the workers already running stop: left alone they
            // would go on serving its endpoint with nobody to stop them.
            stop.store(true, Ordering::Relaxed);
            crew.threads.join_all();
            return Err(e);
        }
    }
    Ok(crew.threads.clone())
}

/// What a pool's workers run for each request.
type Handler = dyn Fn(Request, &Worker) + Send + Sync;

/// What every worker of a pool shares.
struct Crew {
    name: String,
    span: tracing::Span,
    ep: Endpoint,
    stop: Arc<AtomicBool>,
    pool: Arc<Pool>,
    handle: Box<Handler>,
    threads: Threads,
    /// The clients served by threads out of the pool.
    lanes: Mutex<HashMap<PeerId, Lane>>,
    /// The next thread's number, for its name.
    next: AtomicUsize,
    /// Threads out of the pool, still serving.
    left: AtomicUsize,
    max_left: usize,
}

impl Crew {
    fn spawn(self: &Arc<Self>) -> std::io::Result<()> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        if tests::SPAWN_FAILS_AT.with(|at| at.get() == Some(i)) {
            return Err(std::io::Error::other("thread limit (injected)"));
        }
        let crew = self.clone();
        let t = std::thread::Builder::new().name(format!("{}-{i}", self.name)).spawn(move || crew.run())?;
        self.threads.push(t);
        Ok(())
    }

    fn run(self: Arc<Self>) {
        let _server = self.span.enter();
        let me = Worker {
            crew: &self,
            left: Cell::new(false),
            leading: Cell::new(false),
            stalled: Cell::new(false),
            client: Cell::new(None),
            in_lane: Cell::new(false),
        };
        let (ep, pool) = (&self.ep, &*self.pool);
        while !me.has_left() {
            match pool.role(&self.stop) {
                Role::Stop => break,
                Role::Help => match ep.next_request(Some(Duration::ZERO)) {
                    Ok(Some(req)) => self.serve(req, &me),
                    Ok(None) => {}
                    Err(e) => debug!(error = %e, "next_request failed"),
                },
                Role::Lead => {
                    // Steps down however the lead ends, a panicking handler included: another
                    // worker must be able to lead. A leader that leaves the pool steps down as
                    // it leaves (`Worker::leave`), not once its client's lane is served.
                    me.leading.set(true);
                    let _lead = StepDown(pool, &me.leading);
                    while me.leading.get()
                        && let Some(req) = lead_wait(ep, &self.stop)
                    {
                        pool.serving(true);
                        self.serve(req, &me);
                        if me.leading.get() {
                            pool.serving(false);
                        }
                    }
                    break;
                }
            }
        }
    }

    fn lanes(&self) -> MutexGuard<'_, HashMap<PeerId, Lane>> {
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `req`, unless its client has a lane (it queues there); a thread that left the
    /// pool meanwhile then serves its client's lane until it is empty.
    fn serve(&self, req: Request, me: &Worker) {
        let client = req.peer();
        {
            let mut lanes = self.lanes();
            if let Some(lane) = lanes.get_mut(&client) {
                lane.waiting.push_back(req);
                return;
            }
        }
        me.client.set(Some(client));
        (self.handle)(req, me);
        if me.in_lane.get() {
            self.serve_lane(client, me);
            me.in_lane.set(false);
        }
    }

    /// Serves `client`'s lane on a thread that left the pool for it, until the lane is empty,
    /// or until the client took all of a request's data and answer without a stall while
    /// this is the lane's only thread: then the client is slow no more, its lane closes (its
    /// next requests go to the pool again, served several at once) and this thread serves
    /// what had queued in it. Otherwise a client that kept one request queued would be served
    /// one request at a time for good after a single stall.
    fn serve_lane(&self, client: PeerId, me: &Worker) {
        while let Some(req) = self.next_in_lane(client) {
            me.stalled.set(false);
            (self.handle)(req, me);
            if !me.stalled.get()
                && let Some(queued) = self.close_lane(client)
            {
                me.in_lane.set(false);
                for req in queued {
                    if self.stop.load(Ordering::Relaxed) {
                        break; // dropping the rest fails them
                    }
                    (self.handle)(req, me);
                }
                return;
            }
        }
    }

    /// Takes `client`'s lane out, with what waits in it, if the calling thread is its only
    /// one.
    fn close_lane(&self, client: PeerId) -> Option<VecDeque<Request>> {
        let mut lanes = self.lanes();
        if lanes.get(&client)?.threads != 1 {
            return None;
        }
        lanes.remove(&client).map(|lane| lane.waiting)
    }

    /// The next request of `client`'s lane for a thread that left for it; `None` when the lane
    /// is empty (or the server stops): the thread is done with the lane, and the lane closes
    /// once no thread is left on it. A stopping server drops what is queued, which fails it.
    fn next_in_lane(&self, client: PeerId) -> Option<Request> {
        let mut lanes = self.lanes();
        let lane = lanes.get_mut(&client)?;
        if !self.stop.load(Ordering::Relaxed)
            && let Some(req) = lane.waiting.pop_front()
        {
            return Some(req);
        }
        Self::release_lane(lanes, client);
        None
    }

    /// A thread that left for `client` ends without emptying its lane (its handler panicked):
    /// the last such thread takes the lane down, failing what waits in it, rather than leave
    /// the client's requests queued for nobody.
    fn abandon_lane(&self, client: PeerId) {
        Self::release_lane(self.lanes(), client);
    }

    /// A thread is done with `client`'s lane (under the lanes' lock, so that no request can
    /// queue between its last look and this): the last one takes the lane down.
    fn release_lane(mut lanes: MutexGuard<'_, HashMap<PeerId, Lane>>, client: PeerId) {
        let Some(lane) = lanes.get_mut(&client) else { return };
        lane.threads -= 1;
        let closed = if lane.threads == 0 { lanes.remove(&client) } else { None };
        // Dropped (each failing its request through the transport) after the lock.
        drop(lanes);
        drop(closed);
    }
}

/// A client whose requests wait for the threads that left the pool for it.
#[derive(Debug, Default)]
struct Lane {
    /// Threads out of the pool serving it.
    threads: usize,
    waiting: VecDeque<Request>,
}

/// The worker thread a handler runs on.
pub(crate) struct Worker<'a> {
    crew: &'a Arc<Crew>,
    left: Cell<bool>,
    /// It leads the pool (see [`Pool`]).
    leading: Cell<bool>,
    /// A wait on the client of the request being served outlasted [`CLIENT_STALL`].
    stalled: Cell<bool>,
    /// The client of the request being served.
    client: Cell<Option<PeerId>>,
    /// It left, and its client's lane is still open for it (not emptied, not closed).
    in_lane: Cell<bool>,
}

impl Worker<'_> {
    /// Takes this thread out of the pool for the client of the request it serves, and starts a
    /// worker in its place now, so that the pool serves as many requests at once as before
    /// while this one waits. The client's requests queue for this thread (and any other that
    /// left for it) from now on, until they are served or the client takes a request's data
    /// and answer without a stall again; then the thread ends. A leader gives up the lead as
    /// it leaves. False (and the thread stays) when as many threads as allowed are out already
    /// or a thread cannot be started; true if it had left before (it then joins the client's
    /// lane if it left without one).
    pub(crate) fn leave(&self) -> bool {
        if !self.go() {
            return false;
        }
        if !self.in_lane.replace(true)
            && let Some(client) = self.client.get()
        {
            self.crew.lanes().entry(client).or_default().threads += 1;
        }
        true
    }

    /// Takes this thread out of the pool as [`Worker::leave`] does, but not for its client:
    /// the request waits on something else (bytes another client's request holds), so the
    /// client's other requests go on to the pool, and the thread ends with this request.
    pub(crate) fn leave_alone(&self) -> bool {
        self.go()
    }

    /// Out of the pool, a worker started in this one's place; see [`Worker::leave`].
    fn go(&self) -> bool {
        if self.left.get() {
            return true;
        }
        let crew = self.crew;
        let out = crew.left.fetch_add(1, Ordering::Relaxed);
        if out >= crew.max_left || crew.stop.load(Ordering::Relaxed) {
            crew.left.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if self.client.get().is_none() {
            crew.left.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if let Err(e) = crew.spawn() {
            warn!(error = %e, "could not start a worker in place of one that waits");
            crew.left.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        self.left.set(true);
        // The pool needs a leader polling for requests while this thread waits.
        if self.leading.replace(false) {
            crew.pool.step_down();
        }
        true
    }

    /// Waits for `op`, which its client must take part in: a push, a pull or the reply of the
    /// request being served. One still pending after [`CLIENT_STALL`] waits on a client that
    /// stopped, which may last until the transport gives up on it, so the rest of the wait is
    /// spent out of the pool ([`Worker::leave`]).
    pub(crate) fn wait_on_client(&self, op: OpId) -> ionet::Result<Completion> {
        let ep = &self.crew.ep;
        if let Some(c) = ep.wait_timeout(op, CLIENT_STALL)? {
            return Ok(c);
        }
        self.stalled.set(true);
        self.leave();
        ep.wait(op)
    }

    /// [`Worker::leave`] took this thread out of the pool.
    pub(crate) fn has_left(&self) -> bool {
        self.left.get()
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        // Also when its handler panicked.
        if self.left.get() {
            self.crew.left.fetch_sub(1, Ordering::Relaxed);
        }
        if self.in_lane.get()
            && let Some(client) = self.client.get()
        {
            self.crew.abandon_lane(client);
        }
    }
}

/// A server's threads, including those started after it (workers in place of ones that left).
#[derive(Debug, Clone, Default)]
pub(crate) struct Threads(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl Threads {
    fn lock(&self) -> MutexGuard<'_, Vec<JoinHandle<()>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a thread, first joining those that ended (threads that left the pool end when
    /// their clients' lanes are served, so a long-lived server would otherwise keep their
    /// handles, and their stacks, for ever).
    pub(crate) fn push(&self, t: JoinHandle<()>) {
        let ended = {
            let mut all = self.lock();
            let (ended, running): (Vec<_>, Vec<_>) =
                std::mem::take(&mut *all).into_iter().partition(|t| t.is_finished());
            *all = running;
            all.push(t);
            ended
        };
        for t in ended {
            let _ = t.join();
        }
    }

    pub(crate) fn extend(&self, ts: impl IntoIterator<Item = JoinHandle<()>>) {
        self.lock().extend(ts);
    }

    /// Threads still running.
    pub(crate) fn running(&self) -> usize {
        self.lock().iter().filter(|t| !t.is_finished()).count()
    }

    /// Joins the threads that finished and lets go of the others, to end on their own.
    pub(crate) fn join_finished(&self) {
        let all = std::mem::take(&mut *self.lock());
        for t in all.into_iter().filter(|t| t.is_finished()) {
            let _ = t.join();
        }
    }

    /// Joins every thread, those started meanwhile included.
    pub(crate) fn join_all(&self) {
        loop {
            let all = std::mem::take(&mut *self.lock());
            if all.is_empty() {
                return;
            }
            for t in all {
                let _ = t.join();
            }
        }
    }
}

/// Gives up the lead when dropped, unless its worker gave it up before (the flag).
struct StepDown<'a>(&'a Pool, &'a Cell<bool>);

impl Drop for StepDown<'_> {
    fn drop(&mut self) {
        if self.1.replace(false) {
            self.0.step_down();
        }
    }
}

fn lead_wait(ep: &Endpoint, stop: &AtomicBool) -> Option<Request> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        match ep.next_request(Some(POLL)) {
            Ok(Some(req)) => return Some(req),
            Ok(None) => {}
            Err(e) => {
                warn!(error = %e, "next_request failed");
                std::thread::sleep(POLL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ServerHandle;
    use super::*;
    use bytes::Bytes;
    use ionet::{Config, Payload, ServiceLevel};
    use std::time::Instant;

    thread_local! {
        /// The number of the thread whose start fails, in pools the test thread starts.
        pub(super) static SPAWN_FAILS_AT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// A pool that cannot start all its workers fails, and the workers it did start stop
    /// rather than serve on with nobody owning them.
    #[test]
    fn a_pool_that_fails_to_start_stops_the_workers_it_started() {
        let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let token = Arc::new(());
        let held = token.clone();
        SPAWN_FAILS_AT.with(|at| at.set(Some(2)));
        let r = spawn_workers("t", &ep, 4, 0, &stop, move |_req, _w| drop(held.clone()));
        SPAWN_FAILS_AT.with(|at| at.set(None));
        assert!(r.is_err(), "the third worker's start failed");
        // The handler (with what it holds) went with the last worker that could run it.
        assert_eq!(Arc::strong_count(&token), 1, "workers still run");
        assert!(stop.load(Ordering::Relaxed));
    }

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
        let (server, client, peer) = leaving_pool(workers, 0, move |req, _| handle(req));
        (client, peer, server)
    }

    /// [`pool`] with handlers that may leave it, up to `max_left` at a time.
    fn leaving_pool(
        workers: usize,
        max_left: usize,
        handle: impl Fn(Request, &Worker) + Send + Sync + 'static,
    ) -> (ServerHandle, Endpoint, ionet::PeerId) {
        let ep = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let threads = spawn_workers("t", &ep, workers, max_left, &stop, handle).unwrap();
        let addr = ep.local_addr().unwrap();
        let client = Endpoint::client(Config::default()).unwrap();
        let peer = client.connect(&addr).unwrap();
        (ServerHandle::new(ep, stop, threads), client, peer)
    }

    /// Asks `header` of the pool; the op, with a deadline.
    fn ask_with(c: &Endpoint, peer: ionet::PeerId, header: &'static [u8]) -> ionet::OpId {
        let op = c.request(peer, 1, Bytes::from_static(header), Payload::None, ServiceLevel::Normal).unwrap();
        c.set_deadline(op, Instant::now() + Duration::from_secs(30)).unwrap();
        op
    }

    /// The reply to `op` (the name of the thread that served it), or why there is none
    /// within 10 s.
    fn answer(c: &Endpoint, op: ionet::OpId) -> String {
        match c.wait_timeout(op, Duration::from_secs(10)) {
            Ok(Some(d)) => match (d.result, d.reply) {
                (Ok(_), Some(r)) => String::from_utf8_lossy(&r).into_owned(),
                (r, _) => format!("failed: {r:?}"),
            },
            Ok(None) => "no answer in 10 s".into(),
            Err(e) => format!("failed: {e}"),
        }
    }

    /// A handler that holds its request until `go` says so takes its thread out of the pool:
    /// with one worker, another client is still served (by the worker started in its place),
    /// while the holding client's next request waits for the thread that left, which serves
    /// it once released and then ends.
    #[test]
    fn a_worker_that_leaves_is_replaced_and_its_client_waits_for_it() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, go_rx) = (Mutex::new(started_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(1, 4, move |req, w| {
            if &req.header()[..] == b"hold" {
                let left = w.leave();
                let _ = started_tx.lock().unwrap().send(left);
                let _ = go_rx.lock().unwrap().recv();
            }
            let name = std::thread::current().name().unwrap_or_default().to_owned();
            let _ = req.reply(Bytes::from(name));
        });
        let b = Endpoint::client(Config::default()).unwrap();
        let b_peer = b.connect(server.local_addr().unwrap()).unwrap();
        let held = ask_with(&a, a_peer, b"hold");
        let a_held = a.clone();
        let held = std::thread::spawn(move || answer(&a_held, held));
        assert!(started.recv().unwrap(), "the worker could not leave");
        // Another client is served meanwhile, by the new worker.
        assert_eq!(answer(&b, ask_with(&b, b_peer, b"q")), "t-1");
        // The holding client's next request queues for the thread that left: a request asked
        // after it, of the one worker in the pool, is answered first.
        let next = ask_with(&a, a_peer, b"q");
        let other = answer(&b, ask_with(&b, b_peer, b"q"));
        let queued = a.test(next).unwrap().is_none();
        // Checked once the held request is let go: a failure must not leave its handler
        // waiting while the server is shut down.
        go.send(()).unwrap();
        assert_eq!(other, "t-1");
        assert!(queued, "the held client's next request was served by the pool");
        assert_eq!(held.join().unwrap(), "t-0");
        assert_eq!(answer(&a, next), "t-0");
        // Its lane empty, the thread that left ends; the pool has its one worker.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.threads.running() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.threads.running(), 1);
        assert_eq!(answer(&a, ask_with(&a, a_peer, b"q")), "t-1");
        server.shutdown();
    }

    /// A thread that left and whose handler then panicked does not strand its client: what
    /// queued in its lane fails (not waits forever), and the client's next request is served
    /// by the pool.
    /// A worker that leaves alone (its request waits on another client, not on its own) opens
    /// no lane: its client's next request is served by the pool meanwhile, and the thread ends
    /// with its request.
    #[test]
    fn a_worker_that_leaves_alone_leaves_its_client_to_the_pool() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, go_rx) = (Mutex::new(started_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(1, 4, move |req, w| {
            if &req.header()[..] == b"hold" {
                let left = w.leave_alone();
                let _ = started_tx.lock().unwrap().send(left);
                let _ = go_rx.lock().unwrap().recv();
            }
            let name = std::thread::current().name().unwrap_or_default().to_owned();
            let _ = req.reply(Bytes::from(name));
        });
        let held = ask_with(&a, a_peer, b"hold");
        let a_held = a.clone();
        let held = std::thread::spawn(move || answer(&a_held, held));
        assert!(started.recv().unwrap(), "the worker could not leave");
        // The same client's next request: served by the new worker while the other waits.
        // (Its answer is checked once the held one is let go: a failure must not leave the
        // handler waiting while the server is shut down.)
        let next = answer(&a, ask_with(&a, a_peer, b"q"));
        go.send(()).unwrap();
        assert_eq!(next, "t-1", "the client's next request waited for the one that left");
        assert_eq!(held.join().unwrap(), "t-0");
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.threads.running() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.threads.running(), 1, "the thread that left ended with its request");
        server.shutdown();
    }

    #[test]
    fn a_thread_that_left_and_panicked_leaves_its_client_served() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, go_rx) = (Mutex::new(started_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(1, 4, move |req, w| {
            if &req.header()[..] == b"hold" {
                let _ = started_tx.lock().unwrap().send(w.leave());
                let _ = go_rx.lock().unwrap().recv();
                panic!("handler bug (expected by the test)");
            }
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        let held = ask_with(&a, a_peer, b"hold");
        let a2 = a.clone();
        let held = std::thread::spawn(move || answer(&a2, held));
        assert!(started.recv().unwrap());
        let queued = ask_with(&a, a_peer, b"q");
        // Served by the pool's worker, after the queued one reached the lane.
        let b = Endpoint::client(Config::default()).unwrap();
        let b_peer = b.connect(server.local_addr().unwrap()).unwrap();
        assert_eq!(answer(&b, ask_with(&b, b_peer, b"q")), "ok");
        go.send(()).unwrap();
        assert!(held.join().unwrap().starts_with("failed"));
        // Failed with the lane, or served by the pool if it had not reached the lane yet.
        let queued = answer(&a, queued);
        assert!(queued.starts_with("failed") || queued == "ok", "{queued}");
        assert_eq!(answer(&a, ask_with(&a, a_peer, b"q")), "ok");
        server.shutdown();
    }

    /// The leader that leaves gives the lead up as it leaves: the worker started in its place
    /// leads (polls the transport for requests, serving none), rather than stand by beside a
    /// leader that is away for as long as its client stays slow.
    #[test]
    fn a_leader_that_leaves_hands_the_lead_on() {
        let (pool_tx, pool_rx) = std::sync::mpsc::channel::<Arc<Pool>>();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (pool_tx, go_rx) = (Mutex::new(pool_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(1, 4, move |req, w| {
            if &req.header()[..] == b"hold" {
                assert!(w.leave(), "the worker could not leave");
                let _ = pool_tx.lock().unwrap().send(w.crew.pool.clone());
                let _ = go_rx.lock().unwrap().recv();
            }
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        // Dropped before the server should the test fail, so that held handlers end.
        let go = go;
        // Waited for on a thread of its own, which drives the client's transport meanwhile.
        let (held, a2) = (ask_with(&a, a_peer, b"hold"), a.clone());
        let held = std::thread::spawn(move || answer(&a2, held));
        let pool = pool_rx.recv_timeout(Duration::from_secs(10)).expect("the held request was served");
        let deadline = Instant::now() + Duration::from_secs(10);
        let leads = || {
            let st = pool.lock();
            st.led && !st.serving
        };
        while !leads() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let st = pool.lock();
        assert!(st.led && !st.serving, "no worker leads while the one that left is away: {st:?}");
        drop(st);
        go.send(()).unwrap();
        assert_eq!(held.join().unwrap(), "ok");
        server.shutdown();
    }

    /// A client whose lane served a request without a stall keeps up again: its lane closes,
    /// and its next request goes to the pool while the thread that left still serves what
    /// had queued for it.
    #[test]
    fn a_lane_closes_once_its_client_keeps_up() {
        let (note_tx, notes) = std::sync::mpsc::channel::<&'static str>();
        let (crew_tx, crew) = std::sync::mpsc::channel::<Arc<Crew>>();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (note_tx, crew_tx, go_rx) = (Mutex::new(note_tx), Mutex::new(crew_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(1, 4, move |req, w| {
            match &req.header()[..] {
                b"hold" => {
                    assert!(w.leave(), "the worker could not leave");
                    let _ = crew_tx.lock().unwrap().send(w.crew.clone());
                    let _ = go_rx.lock().unwrap().recv();
                }
                b"gate" => {
                    let _ = note_tx.lock().unwrap().send("gate");
                    let _ = go_rx.lock().unwrap().recv();
                }
                _ => {}
            }
            let name = std::thread::current().name().unwrap_or_default().to_owned();
            let _ = req.reply(Bytes::from(name));
        });
        let next = |what| notes.recv_timeout(Duration::from_secs(10)).ok() == Some(what);
        // Dropped before the server should the test fail, so that held handlers end.
        let go = go;
        // Waited for on a thread of its own, which drives the client's transport meanwhile.
        let (held, a2) = (ask_with(&a, a_peer, b"hold"), a.clone());
        let held = std::thread::spawn(move || answer(&a2, held));
        let crew = crew.recv_timeout(Duration::from_secs(10)).expect("the held request was served");
        // Both queue in the lane of the thread that left.
        let (quick, gate) = (ask_with(&a, a_peer, b"q"), ask_with(&a, a_peer, b"gate"));
        let deadline = Instant::now() + Duration::from_secs(10);
        let queued = || crew.lanes().values().map(|l| l.waiting.len()).sum::<usize>();
        while queued() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(queued(), 2, "the held client's requests did not queue in its lane");
        go.send(()).unwrap();
        assert_eq!(held.join().unwrap(), "t-0");
        assert_eq!(answer(&a, quick), "t-0");
        // The quick request took no wait on the client: the lane closed behind it, and the
        // thread that left serves the gate it had queued.
        assert!(next("gate"));
        assert_eq!(answer(&a, ask_with(&a, a_peer, b"q")), "t-1", "served by the pool while the gate holds");
        go.send(()).unwrap();
        assert_eq!(answer(&a, gate), "t-0");
        server.shutdown();
    }

    /// Threads that ended are joined when another is added, so a long-lived server does not
    /// keep one handle per thread that ever left the pool.
    #[test]
    fn threads_that_ended_are_joined_as_others_start() {
        let threads = Threads::default();
        for _ in 0..8 {
            let ended = std::thread::spawn(|| {});
            while !ended.is_finished() {
                std::thread::yield_now();
            }
            threads.push(ended);
        }
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        threads.push(std::thread::spawn(move || {
            let _ = done_rx.recv();
        }));
        assert_eq!(threads.lock().len(), 1, "handles of ended threads kept");
        assert_eq!(threads.running(), 1);
        drop(done);
        threads.join_all();
    }

    /// No more threads leave than the pool allows; the others stay and serve in it.
    #[test]
    fn workers_leave_up_to_the_limit() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, go_rx) = (Mutex::new(started_tx), Mutex::new(go_rx));
        let (server, a, a_peer) = leaving_pool(2, 1, move |req, w| {
            let _ = started_tx.lock().unwrap().send(w.leave());
            let _ = go_rx.lock().unwrap().recv();
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        let b = Endpoint::client(Config::default()).unwrap();
        let b_peer = b.connect(server.local_addr().unwrap()).unwrap();
        // Waited for on threads of their own, which drive the clients' sides meanwhile.
        let waits: Vec<_> =
            [(a.clone(), ask_with(&a, a_peer, b"1")), (b.clone(), ask_with(&b, b_peer, b"2"))]
                .into_iter()
                .map(|(c, op)| std::thread::spawn(move || answer(&c, op)))
                .collect();
        let mut left = vec![started.recv().unwrap(), started.recv().unwrap()];
        left.sort();
        assert_eq!(left, [false, true]);
        go.send(()).unwrap();
        go.send(()).unwrap();
        for w in waits {
            assert_eq!(w.join().unwrap(), "ok");
        }
        server.shutdown();
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

    /// One client asking one request at a time is served by the leader every time: it keeps
    /// the lead instead of handing it to a helper that would have to be woken for the next one.
    #[test]
    fn a_lone_client_is_served_by_the_leader_every_time() {
        let threads = Arc::new(Mutex::new(Vec::new()));
        let t = threads.clone();
        let (c, peer, server) = pool(4, move |req| {
            t.lock().unwrap().push(std::thread::current().id());
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        for _ in 0..20 {
            assert!(c.wait(ask(&c, peer)).unwrap().result.is_ok());
        }
        let seen = threads.lock().unwrap().clone();
        assert_eq!(seen.len(), 20);
        assert!(seen.iter().all(|id| *id == seen[0]), "served by {seen:?}");
        server.shutdown();
    }

    /// A handler that panics ends its thread, not the pool's leadership: the next request is
    /// served by a worker that took the lead (the one left).
    #[test]
    fn a_panicking_handler_gives_up_the_lead() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = calls.clone();
        let (c, peer, server) = pool(2, move |req| {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                panic!("handler bug (expected by the test)");
            }
            let _ = req.reply(Bytes::from_static(b"ok"));
        });
        // The first request's reply is the transport's "dropped" error.
        assert!(c.wait(ask(&c, peer)).unwrap().result.is_err());
        for _ in 0..5 {
            assert!(c.wait(ask(&c, peer)).unwrap().result.is_ok());
        }
        server.shutdown();
    }

    /// A handler that serves its request only once `go` says so; tells `started` first.
    fn gated(started: std::sync::mpsc::Sender<()>, go: std::sync::mpsc::Receiver<()>) -> impl Fn(Request) {
        let (started, go) = (Mutex::new(started), Mutex::new(go));
        move |req: Request| {
            let _ = started.lock().unwrap().send(());
            let _ = go.lock().unwrap().recv();
            let _ = req.reply(Bytes::from_static(b"ok"));
        }
    }

    /// Draining lets the request being served finish (its reply arrives), then the endpoint
    /// is shut: a later request fails instead of being served.
    #[test]
    fn drain_finishes_the_request_being_served_then_refuses_more() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let (c, peer, server) = pool(2, gated(started_tx, go_rx));
        // The client's wait drives its side of the transport, so it runs meanwhile.
        let op = ask(&c, peer);
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.wait(op));
        started.recv().unwrap();
        let drain = std::thread::spawn(move || server.drain(Duration::from_secs(60)));
        go.send(()).unwrap();
        let drained = drain.join().unwrap().unwrap();
        assert_eq!(drained.busy_workers, 0);
        let done = waiter.join().unwrap().unwrap();
        assert!(done.result.is_ok(), "{:?}", done.result);
        assert_eq!(done.reply.as_deref(), Some(&b"ok"[..]));
        let later = c.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal);
        let failed = match later {
            Err(_) => true,
            Ok(op) => {
                c.set_deadline(op, Instant::now() + Duration::from_secs(20)).unwrap();
                c.wait(op).map_or(true, |d| d.result.is_err())
            }
        };
        assert!(failed, "a request after the drain was served");
    }

    /// A request still being served when the drain timeout runs out fails: its worker is
    /// reported busy and the client gets an error, not a hang.
    #[test]
    fn drain_fails_a_request_that_outlasts_the_timeout() {
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let (c, peer, server) = pool(1, gated(started_tx, go_rx));
        let op = ask(&c, peer);
        let c2 = c.clone();
        let waiter = std::thread::spawn(move || c2.wait(op));
        started.recv().unwrap();
        let drained = server.drain(Duration::from_millis(50)).unwrap();
        assert_eq!(drained.busy_workers, 1);
        let done = waiter.join().unwrap().unwrap();
        assert!(done.result.is_err(), "the request outlasting the drain succeeded");
        go.send(()).unwrap();
    }

    #[test]
    fn step_down_runs_on_unwind() {
        let p = Arc::new(Pool::default());
        let stop = AtomicBool::new(false);
        let p2 = p.clone();
        let r = std::thread::spawn(move || {
            let stop = AtomicBool::new(false);
            assert_eq!(p2.role(&stop), Role::Lead);
            let leading = Cell::new(true);
            let _lead = StepDown(&p2, &leading);
            p2.serving(true);
            panic!("handler bug (expected by the test)");
        })
        .join();
        assert!(r.is_err());
        assert!(!p.lock().led && !p.lock().serving);
        assert_eq!(p.role(&stop), Role::Lead, "the lead is free again");
    }

    #[test]
    fn roles_lead_help_and_stop() {
        let p = Arc::new(Pool::default());
        let stop = Arc::new(AtomicBool::new(false));
        assert_eq!(p.role(&stop), Role::Lead);
        // Not serving: the leader takes queued requests itself, nobody is woken.
        p.request_queued();
        assert_eq!(p.lock().queued, 0);
        // Serving: a queued request wakes a sleeping helper. Another worker stands by already,
        // so this one sleeps until woken (a stand-by would get up on its own after a
        // millisecond, which a busy machine may let pass unseen).
        p.serving(true);
        p.lock().standby = true;
        let (p2, s2) = (p.clone(), stop.clone());
        let helper = std::thread::spawn(move || p2.role(&s2));
        let t = Instant::now();
        while p.lock().sleeping == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "the helper never slept");
            std::thread::yield_now();
        }
        p.request_queued();
        assert_eq!(helper.join().unwrap(), Role::Help);
        // The stand-by helper looks on its own while the leader serves.
        p.lock().standby = false;
        assert_eq!(p.role(&stop), Role::Help);
        // Done serving: leftovers are the leader's.
        p.request_queued();
        p.serving(false);
        assert_eq!(p.lock().queued, 0);
        stop.store(true, Ordering::Relaxed);
        assert_eq!(p.role(&stop), Role::Stop);
        p.step_down();
        assert!(!p.lock().led);
    }
}

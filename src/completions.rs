//! The completion queue an endpoint shares with its backend: the operation table, deadlines,
//! queued unexpected messages and requests, and the bookkeeping of the threads that wait on
//! them (the one-driver rule, per-waiter wake-ups). Backends report into it; the endpoint's
//! waiting loop reads it.

use std::cell::Cell;
use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::task::Waker;
use std::time::Instant;

use rustc_hash::FxHashMap as HashMap;

use crate::error::{Error, Result};
use crate::info::Counters;
use crate::op::{Completion, RequestMeta, Unexpected};
use crate::readiness::WaitSet;
use crate::spin_learn::LearntSpins;
use crate::sync::{AtomicBool, AtomicU64, Condvar, Mutex, MutexGuard};
use crate::types::{OpId, PeerId};

/// An operation between `post` and being reaped: one table entry for its whole life, so each
/// step is one hash lookup.
#[derive(Debug)]
pub(crate) enum Slot {
    /// Not completed yet. `detached`: nobody will reap it (its completion is dropped).
    Pending { deadline: Option<Instant>, detached: bool },
    /// Completed, waiting for `wait` / `test` / `wait_any`.
    Done(Completion),
}

#[derive(Debug, Default)]
pub(crate) struct CompletionState {
    pub(crate) ops: HashMap<OpId, Slot>,
    pub(crate) deadlines: BTreeSet<(Instant, OpId)>,
    /// Completion order, for `wait_any`. Ops reaped by id stay listed until skipped or
    /// compacted away (see [`Completions::complete_locked`]): at most twice `done` plus 1024.
    pub(crate) done_order: VecDeque<OpId>,
    /// `Done` slots in `ops`.
    pub(crate) done: usize,
    pub(crate) unexpected: VecDeque<Unexpected>,
    pub(crate) requests: VecDeque<RequestMeta>,
    pub(crate) driving: bool,
    /// A caller armed the endpoint's file descriptor and may be asleep on it: whatever is
    /// queued now must make the descriptor readable (see [`Completions::note_queued`]).
    pub(crate) armed: bool,
    /// Completions, messages and requests queued so far, and how many of them had been when
    /// the last non-blocking round ended: `arm` refuses to arm while they differ, as the
    /// caller may not have looked at what came since.
    pub(crate) queued: u64,
    pub(crate) seen: u64,
    /// [`Endpoint::shutdown`](crate::Endpoint::shutdown) was called: waits for requests and
    /// messages end with [`Error::Closed`] once the queues are empty.
    pub(crate) closed: bool,
    /// Tasks waiting for one operation's completion (the async API), woken when it completes.
    pub(crate) wakers: HashMap<OpId, Waker>,
    /// Tasks waiting for a request, all woken when one is queued (a woken task that finds the
    /// queue empty registers again; waking one only would lose the request if it was dropped).
    pub(crate) request_wakers: Vec<Waker>,
    /// Tasks waiting for an unexpected message, likewise.
    pub(crate) unexpected_wakers: Vec<Waker>,
    /// Threads asleep while another drives, each on a condition variable of its own with what
    /// it waits for, so an event wakes only the thread it concerns: a wake-up costs a futex
    /// call and a context switch, and the thread woken for nothing pays both again to sleep.
    pub(crate) sleepers: Vec<Sleeper>,
    /// How long adaptive waits spin before they sleep, learnt per kind of wait.
    pub(crate) spins: LearntSpins,
}

/// What a waiting thread waits for (see [`CompletionState::sleepers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// One operation's completion.
    Op(OpId),
    /// Any completion (`wait_any`).
    AnyOp,
    /// An unexpected message.
    Unexpected,
    /// A request.
    Request,
    /// Nothing in particular: only a timeout or a hand-over ends its sleep.
    Nothing,
}

#[derive(Debug)]
pub(crate) struct Sleeper {
    pub(crate) want: Want,
    pub(crate) cv: Arc<Condvar>,
}

impl CompletionState {
    /// Wakes the sleepers waiting for `hit`.
    fn wake(&self, hit: impl Fn(Want) -> bool) {
        for s in self.sleepers.iter().filter(|s| hit(s.want)) {
            s.cv.notify_one();
        }
    }
}

/// Completion table shared between the endpoint and its backend.
#[derive(Debug, Default)]
pub(crate) struct Completions {
    st: Mutex<CompletionState>,
    next_op: AtomicU64,
    /// Something was queued by a thread other than the driver while the driver may be blocked
    /// in the backend: the endpoint call that caused it wakes the backend on its way out.
    pub(crate) kick: AtomicBool,
    pub(crate) counters: Counters,
    /// Called whenever a request is queued for `next_request` (see
    /// [`Endpoint::on_request`](crate::Endpoint::on_request)).
    pub(crate) request_hook: OnceLock<RequestHook>,
    /// Called whenever a completion is queued (see
    /// [`Endpoint::on_complete`](crate::Endpoint::on_complete)).
    pub(crate) completion_hook: OnceLock<RequestHook>,
    /// The descriptor event loops wait on (set by the endpoint when it is made).
    pub(crate) waitset: OnceLock<WaitSet>,
}

/// The callback of [`Endpoint::on_request`](crate::Endpoint::on_request).
pub(crate) struct RequestHook(pub(crate) Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for RequestHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestHook")
    }
}

// True on the thread inside `Backend::progress`: what it queues, it sees itself.
#[cfg(not(all(loom, test)))]
std::thread_local!(pub(crate) static DRIVING: Cell<bool> = const { Cell::new(false) });
#[cfg(all(loom, test))]
loom::thread_local!(pub(crate) static DRIVING: Cell<bool> = Cell::new(false));

impl Completions {
    pub(crate) fn lock(&self) -> MutexGuard<'_, CompletionState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(&self, detached: bool) -> OpId {
        let op = OpId(self.next_op.fetch_add(1, Ordering::Relaxed) + 1);
        self.lock().ops.insert(op, Slot::Pending { deadline: None, detached });
        op
    }

    pub(crate) fn unregister(&self, op: OpId) {
        let mut st = self.lock();
        if let Some(Slot::Pending { deadline: Some(d), .. }) = st.ops.remove(&op) {
            st.deadlines.remove(&(d, op));
        }
    }

    /// Records a completion. A second completion for the same op is a backend bug: it is
    /// logged and dropped, so callers still see exactly one.
    #[allow(dead_code)] // used by the InfiniBand engine
    pub(crate) fn complete(&self, c: Completion) {
        let mut st = self.lock();
        let queued = self.complete_locked(&mut st, c);
        drop(st);
        self.run_completion_hook(queued);
    }

    /// Calls the [`Endpoint::on_complete`](crate::Endpoint::on_complete) hook `n` times,
    /// outside the queue's lock.
    fn run_completion_hook(&self, n: usize) {
        if let Some(h) = self.completion_hook.get() {
            for _ in 0..n {
                (h.0)();
            }
        }
    }

    /// Wakes every sleeper (a driver that panicked: someone must take over).
    pub(crate) fn wake_all(st: &CompletionState) {
        st.wake(|_| true);
    }

    /// A waiter leaves the wait loop: if nobody drives and others sleep, wake one of them to
    /// take over. Whoever it wakes either drives or, its own wait being over, leaves and hands
    /// over in turn, so a sleeper is never left without a driver.
    pub(crate) fn hand_over(st: &CompletionState) {
        if !st.driving
            && let Some(s) = st.sleepers.first()
        {
            s.cv.notify_one();
        }
    }

    /// Records every completion in `cs` under one lock, oldest first, and leaves `cs` empty
    /// (its capacity kept for the next round).
    pub(crate) fn complete_all(&self, cs: &mut Vec<Completion>) {
        let mut st = self.lock();
        let mut queued = 0;
        if cs.len() == 1 {
            // Most rounds hand over one completion: popping it costs less than a drain's
            // set-up and drop, which on an 8-byte round trip are a measurable share.
            if let Some(c) = cs.pop() {
                queued += self.complete_locked(&mut st, c);
            }
        } else {
            for c in cs.drain(..) {
                queued += self.complete_locked(&mut st, c);
            }
        }
        drop(st);
        self.run_completion_hook(queued);
    }

    /// Records `c`; 1 if it was queued for the application (0: detached, or a backend bug).
    fn complete_locked(&self, st: &mut CompletionState, c: Completion) -> usize {
        let op = c.op;
        let Some(slot) = st.ops.get_mut(&op) else {
            tracing::error!(%op, kind = ?c.kind, "completion for an unknown operation dropped");
            debug_assert!(false, "operation {op} completed but never posted");
            return 0;
        };
        let Slot::Pending { deadline, detached } = *slot else {
            tracing::error!(%op, kind = ?c.kind, "second completion for an operation dropped");
            debug_assert!(false, "operation {op} completed twice");
            return 0;
        };
        Counters::add(&self.counters.ops_completed, 1);
        if matches!(c.result, Err(Error::Cancelled | Error::Timeout)) {
            Counters::add(&self.counters.ops_cancelled, 1);
        }
        if detached {
            if let Err(e) = &c.result {
                tracing::debug!(%op, error = %e, "detached operation failed");
            }
            st.ops.remove(&op);
        } else {
            *slot = Slot::Done(c);
            st.wake(|w| w == Want::Op(op) || w == Want::AnyOp);
            st.done += 1;
            st.done_order.push_back(op);
            if st.done_order.len() > 2 * st.done + 1024 {
                // Mostly ids already reaped by `wait(op)`: keep the order list bounded.
                let CompletionState { ops, done_order, .. } = st;
                done_order.retain(|o| matches!(ops.get(o), Some(Slot::Done(_))));
            }
        }
        if let Some(d) = deadline {
            st.deadlines.remove(&(d, op));
        }
        // Only async callers register wakers: skip the lookup on the blocking path.
        if !st.wakers.is_empty()
            && let Some(w) = st.wakers.remove(&op)
        {
            w.wake();
        }
        if detached {
            return 0;
        }
        self.note_queued(st);
        1
    }

    /// A completion, message or request was queued: if a driver may be blocked in the backend
    /// and this is not it, ask for a wake-up (see [`Endpoint::kick_driver`](crate::Endpoint::kick_driver));
    /// if a caller sleeps on the armed descriptor, make it readable.
    fn note_queued(&self, st: &mut CompletionState) {
        st.queued = st.queued.wrapping_add(1);
        if st.driving && !DRIVING.with(Cell::get) {
            self.kick.store(true, Ordering::Release);
        }
        self.notify_armed(st);
    }

    /// Marks the queue closed and wakes everyone who waits on it.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        Self::wake_all(&st);
        st.request_wakers.drain(..).for_each(Waker::wake);
        st.unexpected_wakers.drain(..).for_each(Waker::wake);
        self.notify_armed(&mut st);
    }

    /// Makes the armed descriptor readable (once per arming).
    pub(crate) fn notify_armed(&self, st: &mut CompletionState) {
        if st.armed {
            st.armed = false;
            if let Some(w) = self.waitset.get() {
                w.notify();
            }
        }
    }

    /// Stops tracking `op`: its completion, now or later, is dropped (its buffers with it). The
    /// operation still completes exactly once inside the endpoint; nobody reaps it. Returns
    /// false if `op` is unknown (never posted, or already reaped).
    pub(crate) fn detach(&self, op: OpId) -> bool {
        let mut st = self.lock();
        st.wakers.remove(&op);
        match st.ops.get_mut(&op) {
            Some(Slot::Pending { detached, .. }) => {
                *detached = true;
                true
            }
            Some(Slot::Done(_)) => {
                let _ = Self::take(&mut st, op);
                true
            }
            None => false,
        }
    }

    /// Queues an unexpected message for [`Endpoint::recv_unexpected`](crate::Endpoint::recv_unexpected).
    pub(crate) fn push_unexpected(&self, u: Unexpected) {
        let mut st = self.lock();
        st.unexpected.push_back(u);
        self.note_queued(&mut st);
        st.wake(|w| w == Want::Unexpected);
        st.unexpected_wakers.drain(..).for_each(Waker::wake);
    }

    /// Queues an incoming request for [`Endpoint::next_request`](crate::Endpoint::next_request).
    pub(crate) fn push_request(&self, r: RequestMeta) {
        {
            let mut st = self.lock();
            st.requests.push_back(r);
            self.note_queued(&mut st);
            st.wake(|w| w == Want::Request);
            st.request_wakers.drain(..).for_each(Waker::wake);
        }
        if let Some(h) = self.request_hook.get() {
            (h.0)();
        }
    }

    /// Drops queued requests of a lost peer: they can no longer be answered. Unexpected
    /// messages arrived whole and stay deliverable.
    pub(crate) fn forget_peer(&self, peer: PeerId) {
        self.lock().requests.retain(|r| r.peer != peer);
    }

    /// The completion of `op` if it is done (`Some(Ok)`), `None` while it is pending, or
    /// `Some(Err)` if no such operation exists (never posted, or already reaped).
    pub(crate) fn take(st: &mut CompletionState, op: OpId) -> Option<Result<Completion>> {
        match st.ops.entry(op) {
            std::collections::hash_map::Entry::Occupied(e) => match e.get() {
                Slot::Pending { .. } => None,
                Slot::Done(_) => match e.remove() {
                    Slot::Done(c) => {
                        st.done -= 1;
                        // Usually the newest (or oldest) completion: unlist it at no cost.
                        if st.done_order.back() == Some(&op) {
                            st.done_order.pop_back();
                        } else if st.done_order.front() == Some(&op) {
                            st.done_order.pop_front();
                        }
                        Some(Ok(c))
                    }
                    Slot::Pending { .. } => unreachable!("checked above"),
                },
            },
            std::collections::hash_map::Entry::Vacant(_) => {
                Some(Err(Error::misuse(format!("{op} is not a pending operation (already reaped?)"))))
            }
        }
    }

    pub(crate) fn take_any(st: &mut CompletionState) -> Option<Completion> {
        while let Some(op) = st.done_order.pop_front() {
            if let Some(Ok(c)) = Self::take(st, op) {
                return Some(c);
            }
        }
        None
    }

    /// Whether `op` is pending (`Some(true)`), done but not reaped (`Some(false)`), or unknown.
    pub(crate) fn is_pending(st: &CompletionState, op: OpId) -> Option<bool> {
        st.ops.get(&op).map(|s| matches!(s, Slot::Pending { .. }))
    }

    pub(crate) fn next_deadline(st: &CompletionState) -> Option<Instant> {
        st.deadlines.first().map(|(d, _)| *d)
    }

    pub(crate) fn expired(&self, now: Instant) -> Vec<OpId> {
        let st = self.lock();
        st.deadlines.iter().take_while(|(d, _)| *d <= now).map(|(_, op)| *op).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::OpKind;

    fn completion(op: OpId) -> Completion {
        Completion::new(op, OpKind::Send, PeerId(0), 0)
    }

    #[test]
    fn reaping_by_id_keeps_the_completion_order_bounded() {
        let completions = Completions::default();
        // One completion stays unreaped at the front; each round reaps an id from the middle
        // of the list, which only compaction removes.
        let first = completions.register(false);
        completions.complete(completion(first));
        for _ in 0..10_000 {
            let (x, y) = (completions.register(false), completions.register(false));
            completions.complete(completion(x));
            completions.complete(completion(y));
            let mut st = completions.lock();
            assert!(matches!(Completions::take(&mut st, x), Some(Ok(c)) if c.op == x));
            assert!(matches!(Completions::take(&mut st, y), Some(Ok(c)) if c.op == y));
            // Without compaction this list would hold every id ever completed.
            assert!(st.done_order.len() <= 2 * st.done + 1024 + 2, "{} ids listed", st.done_order.len());
        }
        let mut st = completions.lock();
        assert_eq!(Completions::take_any(&mut st).map(|c| c.op), Some(first));
        assert!(Completions::take_any(&mut st).is_none());
        assert!(st.ops.is_empty());
    }

    #[test]
    fn wait_any_order_survives_reaping_by_id_and_compaction() {
        let completions = Completions::default();
        let mut kept = Vec::new();
        // Most completions are reaped by id at once (so the order list is compacted several
        // times); every 100th is left for wait_any.
        for i in 0..5000 {
            let op = completions.register(false);
            completions.complete(completion(op));
            if i % 100 == 0 {
                kept.push(op);
            } else {
                assert!(matches!(Completions::take(&mut completions.lock(), op), Some(Ok(_))));
            }
        }
        let mut st = completions.lock();
        for op in &kept {
            assert_eq!(Completions::take_any(&mut st).map(|c| c.op), Some(*op), "oldest first");
        }
        assert!(Completions::take_any(&mut st).is_none());
        assert!(matches!(Completions::take(&mut st, kept[0]), Some(Err(Error::Misuse(_)))), "reaped twice");
    }

    #[test]
    fn detached_ops_leave_nothing_behind() {
        let completions = Completions::default();
        let op = completions.register(true);
        completions.complete(completion(op));
        let st = completions.lock();
        assert!(st.ops.is_empty() && st.done_order.is_empty() && st.done == 0);
    }

    /// Found by the stripefs load test (the io servers' private memory grew 16 bytes per
    /// request): completions taken by id left their ids in the `wait_any` queue forever.
    #[test]
    fn completions_taken_by_id_leave_nothing_behind() {
        let completions = Completions::default();
        for _ in 0..10_000 {
            let op = completions.register(false);
            completions.complete(completion(op));
            assert!(matches!(Completions::take(&mut completions.lock(), op), Some(Ok(c)) if c.op == op));
        }
        {
            let st = completions.lock();
            assert!(st.done_order.is_empty(), "{} stale ids", st.done_order.len());
            assert!(st.ops.is_empty() && st.done == 0);
        }
        // wait_any still sees completions in order.
        let (a, b) = (completions.register(false), completions.register(false));
        completions.complete(completion(b));
        completions.complete(completion(a));
        let mut st = completions.lock();
        assert_eq!(Completions::take_any(&mut st).map(|c| c.op), Some(b));
        assert_eq!(Completions::take_any(&mut st).map(|c| c.op), Some(a));
        assert!(Completions::take_any(&mut st).is_none());
    }
}

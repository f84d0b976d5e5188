//! Threads of the meta server for the work that waits for io servers (creates, truncates, the
//! removal of a file's objects), apart from its workers.
//!
//! An io server that hangs answers nothing, so each request to it waits out its deadline. Were
//! that wait a worker's, a few creates placed on the hung server would take every worker, and
//! no client could look a name up or list a directory until the deadlines passed. Here such
//! work takes at most [`THREADS`] threads (they only wait, so more of them cost little),
//! queues behind them up to [`QUEUED`] jobs, and beyond that is refused, so its memory stays
//! bounded whatever the clients send.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Threads that run jobs.
pub(crate) const THREADS: usize = 16;

/// Jobs that wait for a thread, at most.
pub(crate) const QUEUED: usize = 256;

/// How often an idle thread looks whether the server stops.
const LOOK_FOR_STOP: Duration = Duration::from_millis(100);

/// Where jobs of type `J` are handed to the threads.
pub(crate) struct Upstream<J> {
    tx: SyncSender<J>,
}

impl<J> std::fmt::Debug for Upstream<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("threads", &THREADS).field("queued", &QUEUED).finish()
    }
}

impl<J: Send + 'static> Upstream<J> {
    /// Starts the threads, which `run` each job (entering `span`, which names the server);
    /// they run until `stop` is set and nothing is queued, so a server that stops finishes
    /// what it took.
    pub(crate) fn start(
        span: &tracing::Span,
        stop: &Arc<AtomicBool>,
        run: fn(J),
    ) -> std::io::Result<(Upstream<J>, Vec<JoinHandle<()>>)> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<J>(QUEUED);
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..THREADS)
            .map(|i| {
                let (rx, stop, span) = (rx.clone(), stop.clone(), span.clone());
                std::thread::Builder::new().name(format!("meta-upstream-{i}")).spawn(move || {
                    let _server = span.enter();
                    while let Some(job) = next(&rx, &stop) {
                        run(job);
                    }
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok((Upstream { tx }, threads))
    }

    /// Runs `job` on a thread as soon as one is free; gives it back if [`QUEUED`] jobs are
    /// waiting already (or the threads are gone).
    pub(crate) fn submit(&self, job: J) -> Result<(), J> {
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
        })
    }
}

/// The next job; `None` once stopping with nothing queued.
fn next<J>(rx: &Mutex<Receiver<J>>, stop: &AtomicBool) -> Option<J> {
    loop {
        let r = rx.lock().unwrap_or_else(|p| p.into_inner()).recv_timeout(LOOK_FOR_STOP);
        match r {
            Ok(job) => return Some(job),
            Err(RecvTimeoutError::Timeout) if !stop.load(Ordering::Relaxed) => {}
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    type Job = Box<dyn FnOnce() + Send>;

    #[test]
    fn jobs_beyond_the_threads_and_the_queue_are_given_back() {
        let stop = Arc::new(AtomicBool::new(false));
        let (up, threads) = Upstream::start(&tracing::Span::none(), &stop, |j: Job| j()).unwrap();
        // Every thread held by a job that waits, as for a hung server.
        let gate = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
        let started = Arc::new(AtomicUsize::new(0));
        let blocking = || {
            let (gate, started) = (gate.clone(), started.clone());
            Box::new(move || {
                started.fetch_add(1, Ordering::SeqCst);
                let (m, cv) = &*gate;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
            }) as Job
        };
        let ran = Arc::new(AtomicUsize::new(0));
        let counting = || {
            let ran = ran.clone();
            Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            }) as Job
        };
        for _ in 0..THREADS {
            assert!(up.submit(blocking()).is_ok());
        }
        while started.load(Ordering::SeqCst) < THREADS {
            std::thread::yield_now();
        }
        for _ in 0..QUEUED {
            assert!(up.submit(counting()).is_ok(), "queued behind busy threads");
        }
        assert!(up.submit(counting()).is_err(), "one past the queue's bound is given back");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        // Stopping finishes what was queued.
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), QUEUED);
    }
}

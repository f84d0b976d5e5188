//! An async API on a tokio runtime (cargo feature `tokio`).
//!
//! [`AsyncEndpoint`] wraps an [`Endpoint`]: one driver task per endpoint runs its progress
//! rounds, sleeping on the endpoint's descriptor through tokio's [`AsyncFd`] (see
//! [`Endpoint::arm`]), and wakes the tasks whose operations completed. Posting is unchanged
//! (posts never block); what becomes async is waiting:
//!
//! ```no_run
//! # async fn run() -> ionet::Result<()> {
//! use bytes::Bytes;
//! use ionet::tokio::AsyncEndpoint;
//! use ionet::{Config, Endpoint, Payload, ServiceLevel};
//!
//! let ep = AsyncEndpoint::new(Endpoint::client(Config::default())?)?;
//! let peer = ep.endpoint().connect("tcp://127.0.0.1:7000")?;
//! let op = ep.endpoint().request(peer, 1, Bytes::from_static(b"hello"), Payload::None, ServiceLevel::Normal)?;
//! let reply = ep.completion(op).await?.ok()?;
//! # Ok(()) }
//! ```
//!
//! # Cancellation
//!
//! Dropping an [`OpFuture`] before it resolves cancels the operation ([`Endpoint::cancel`])
//! and detaches it ([`Endpoint::detach`]): it still completes exactly once inside the endpoint
//! — with [`Error::Cancelled`](crate::Error::Cancelled), or normally if it finished first —
//! its buffers are released then, and nobody sees the completion. As with any cancel, the
//! peer may already have acted on a request.
//!
//! # Waiting
//!
//! The driver follows the endpoint's [`WaitMode`]: in `Adaptive` (the default) it keeps
//! polling, yielding to the runtime between rounds, after the last round that did work for as
//! long as recent gaps between such rounds needed (at most the spin budget), then sleeps on
//! the descriptor; in `Block` it sleeps at once; in `Spin` it never sleeps. With
//! [`Config::progress_thread`](crate::Config::progress_thread) set, the endpoint's own thread
//! drives and no task is spawned.

use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use ::tokio::io::unix::AsyncFd;
use ::tokio::task::JoinHandle;

use crate::endpoint::{Arm, Endpoint, Request};
use crate::error::Result;
use crate::op::{Completion, Unexpected};
use crate::spin_learn::{LearntSpin, Stretch};
use crate::types::{OpId, WaitMode};

/// An [`Endpoint`] whose waits are futures, driven by a task on the current tokio runtime.
/// Cheap to clone; the driver task ends when the last clone (and the last future from it) is
/// dropped.
#[derive(Debug, Clone)]
pub struct AsyncEndpoint {
    ep: Endpoint,
    driver: Arc<Driver>,
}

/// Aborts the driver task with the last handle.
#[derive(Debug)]
struct Driver(Option<JoinHandle<()>>);

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// The endpoint's descriptor, for `AsyncFd`.
struct Fd(Endpoint);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

impl AsyncEndpoint {
    /// Wraps `ep` and spawns its driver task on the current runtime.
    ///
    /// # Errors
    /// Registering the endpoint's descriptor with the runtime's reactor failed.
    ///
    /// # Panics
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn new(ep: Endpoint) -> Result<AsyncEndpoint> {
        let task = if ep.config().progress_thread {
            None
        } else {
            // SAFETY: `Fd` holds the endpoint, which owns the descriptor and neither closes
            // nor replaces it while alive: the descriptor stays valid as long as the `AsyncFd`.
            let fd =
                unsafe { AsyncFd::register_with_interest(Fd(ep.clone()), ::tokio::io::Interest::READABLE) }
                    .map_err(std::io::Error::from)?;
            Some(::tokio::spawn(drive(fd)))
        };
        Ok(AsyncEndpoint { ep, driver: Arc::new(Driver(task)) })
    }

    /// The endpoint: post operations on it as usual, then await them with
    /// [`AsyncEndpoint::completion`].
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The completion of `op`, as a future that cancels the operation if dropped first.
    pub fn completion(&self, op: OpId) -> OpFuture {
        OpFuture { ep: self.ep.clone(), op, done: false, _driver: self.driver.clone() }
    }

    /// The next incoming request (servers); [`Error::Closed`](crate::Error::Closed) once the
    /// endpoint is shut down and the queued requests are taken.
    pub async fn next_request(&self) -> Result<Request> {
        let _driver = self.driver.clone();
        std::future::poll_fn(|cx| self.ep.poll_request(cx)).await
    }

    /// Incoming requests as a stream (servers), which ends when the endpoint is shut down.
    pub fn requests(&self) -> Requests {
        Requests { ep: self.ep.clone(), _driver: self.driver.clone() }
    }

    /// The next unexpected message (see [`Endpoint::recv_unexpected`]).
    pub async fn recv_unexpected(&self) -> Result<Unexpected> {
        let _driver = self.driver.clone();
        std::future::poll_fn(|cx| self.ep.poll_unexpected(cx)).await
    }
}

/// Runs the endpoint's progress: rounds while there is work (or within the spin budget),
/// then sleeps on the descriptor.
async fn drive(fd: AsyncFd<Fd>) {
    let ep = &fd.get_ref().0;
    let mode = ep.config().wait_mode;
    let budget = ep.config().spin_budget;
    let mut spin_until: Option<Instant> = None;
    // The driver's own learnt spin: its stretches run from one round that did work to the next.
    let mut learnt = LearntSpin::default();
    let mut stretch: Option<Stretch> = None;
    loop {
        let worked = match ep.try_progress() {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "ionet driver task stopped: progress failed");
                return;
            }
        };
        let spin = match mode {
            WaitMode::Spin => true,
            WaitMode::Block => false,
            WaitMode::Adaptive => {
                let now = Instant::now();
                if worked {
                    if let Some(s) = stretch.take() {
                        s.end(now, &mut learnt, budget);
                    }
                    let spin = learnt.budget(budget);
                    spin_until = Some(now + spin);
                    stretch = Some(Stretch::new(now, spin));
                }
                spin_until.is_some_and(|u| now < u)
            }
        };
        if spin {
            ::tokio::task::yield_now().await;
            continue;
        }
        match ep.arm() {
            Ok(Arm::Busy) => ::tokio::task::yield_now().await,
            Ok(Arm::Armed) => {
                spin_until = None;
                ep.sleeping(&mut stretch, budget);
                match fd.readable().await {
                    // Cleared before the next round: whatever arrives during it sets it again.
                    Ok(mut g) => g.clear_ready(),
                    Err(e) => {
                        tracing::error!(error = %e, "ionet driver task stopped: the reactor failed");
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "ionet driver task stopped: arming failed");
                return;
            }
        }
    }
}

/// The completion of one operation; cancels it if dropped before it resolves (see the
/// [module documentation](self)).
#[derive(Debug)]
#[must_use = "dropping the future cancels the operation"]
pub struct OpFuture {
    ep: Endpoint,
    op: OpId,
    done: bool,
    _driver: Arc<Driver>,
}

impl OpFuture {
    /// The operation this future waits for.
    pub fn op(&self) -> OpId {
        self.op
    }
}

impl Future for OpFuture {
    type Output = Result<Completion>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = self.ep.poll_op(self.op, cx);
        if r.is_ready() {
            self.done = true;
        }
        r
    }
}

impl Drop for OpFuture {
    fn drop(&mut self) {
        if !self.done {
            // Detach first: the cancellation may complete it at once, and nobody reaps it.
            let _ = self.ep.detach(self.op);
            let _ = self.ep.cancel(self.op);
        }
    }
}

/// Incoming requests ([`AsyncEndpoint::requests`]): a [`futures_core::Stream`] that ends when
/// the endpoint is shut down, or call [`Requests::next`].
#[derive(Debug)]
pub struct Requests {
    ep: Endpoint,
    _driver: Arc<Driver>,
}

impl Requests {
    /// The next request; `None` once the endpoint is shut down.
    pub async fn next(&mut self) -> Option<Request> {
        std::future::poll_fn(|cx| self.ep.poll_request(cx).map(Result::ok)).await
    }
}

impl futures_core::Stream for Requests {
    type Item = Request;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        self.ep.poll_request(cx).map(Result::ok)
    }
}

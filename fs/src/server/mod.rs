//! The servers: [`meta::MetaServer`] (namespace, layouts, capabilities) and [`io::IoServer`]
//! (object data). Both are a pool of worker threads over one bound ionet endpoint with a
//! progress thread: every worker waits in `next_request`, handles one request start to end
//! (pipelined transfers included) and waits for its reply to go out. Several requests — from one
//! client or many — are therefore served at once, up to the number of workers.
//!
//! Nothing a peer sends panics a worker: headers go through [`proto::decode`] (bounded, typed
//! errors answered with an error reply), every io request's capability is checked before the
//! store is touched, and data moves through a bounded number of transfer-unit buffers.

pub mod io;
pub mod meta;

use crate::proto::{self, Envelope, ErrorReply, Reply};
use bytes::Bytes;
use ionet::{Endpoint, Request};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Runs `handle` for every request on `ep` in `workers` threads until `stop`.
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
    (0..workers.max(1))
        .map(|i| {
            let (ep, stop, handle) = (ep.clone(), stop.clone(), handle.clone());
            std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match ep.next_request(Some(POLL)) {
                        Ok(Some(req)) => handle(req),
                        Ok(None) => {}
                        Err(e) => {
                            warn!(error = %e, "next_request failed");
                            std::thread::sleep(POLL);
                        }
                    }
                }
            })
        })
        .collect()
}

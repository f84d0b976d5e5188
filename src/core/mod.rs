//! The transport core: the tables and rules every backend applies the same way, kept apart
//! from sockets, queue pairs and clocks so that each guarantee is written once.
//!
//! * [`ops`]: the operation table. An operation completes exactly once, and only when nothing
//!   the transport queued still references its buffer; completions leave in one batch per
//!   round, counted by mechanism and bytes on the way out.
//! * [`peers`]: the peer table (generation-checked ids) and each peer's buffering budget:
//!   what a peer can make this endpoint hold for it (early data, unexpected messages, open
//!   requests) is bounded, and released only by what consumes it.
//! * [`requests`]: the server side of requests: each open request a client sent, its budget,
//!   and the checks every pull, push and reply passes before a driver moves a byte.
//! * [`loss`]: what the application sees when a peer is lost — one error, naming the peer's
//!   address and the cause, for every operation on that peer.
//!
//! Drivers (the TCP backend, the InfiniBand engine) own the connections and decide how bytes
//! move; they call in here for every decision these tables make.

pub(crate) mod loss;
pub(crate) mod ops;
pub(crate) mod peers;
pub(crate) mod requests;
pub(crate) mod slab;
pub(crate) mod stream;

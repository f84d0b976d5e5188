//! # ionet
//!
//! A transport abstraction for storage protocols in the spirit of PVFS2's BMI: a protocol
//! written once against [`Endpoint`] runs over TCP (`tcp://`) or InfiniBand verbs (`ib://`, or
//! `softib://` through the software verbs provider), and the transport does the hard parts —
//! credit-based flow control over pre-posted buffers, a pin-down (registration) cache, and a
//! communication manager that picks **inline**, **fast RDMA** or **server-based RDMA** for each
//! transfer ([`comm`]).
//!
//! # Model
//!
//! * **Endpoints and peers.** [`Endpoint::bind`] listens; [`Endpoint::client`] does not.
//!   [`Endpoint::connect`] names a peer; connections open lazily, one per [`ServiceLevel`].
//! * **Operations.** Every call that moves data posts an operation and returns an [`OpId`]. The
//!   buffer is *owned* by the operation and comes back in its [`Completion`], so no transfer can
//!   outlive its memory. Every operation completes **exactly once**: success, a typed
//!   [`Error`], or cancelled — also when its peer dies ([`Error::PeerLost`]).
//! * **Messaging (BMI level).** Tag-matched [`Endpoint::send`] / [`Endpoint::recv`], FIFO per
//!   (peer, service level), gather and scatter lists; [`Endpoint::send_unexpected`] /
//!   [`Endpoint::recv_unexpected`] for the first message of a conversation.
//! * **Request + payload.** What storage protocols use: [`Endpoint::request`] carries a header
//!   and an OUT payload (a write) or an IN buffer (a read); the server's [`Request`] moves the
//!   payload with [`Request::pull_into`] / [`Request::push_from`] — pipelined, into its own
//!   buffers — and ends it with [`Request::reply`]. The communication manager picks the
//!   mechanism.
//! * **One-sided.** [`Endpoint::expose`] gives a [`MemHandle`] peers use with
//!   [`Endpoint::put`] / [`Endpoint::get`]; the target validates key, bounds and access.
//! * **Progress** is explicit, as in BMI: it happens inside `wait`/`test`/`next_request`/…,
//!   or in a background thread ([`Config::progress_thread`]). Waiting spins, blocks or adapts
//!   ([`WaitMode`]); on the reference machine a blocking cross-CPU wake-up costs ~50 µs.
//! * **Limits** a peer could abuse are bounded by [`Config`]; [`Endpoint::info`] reports the
//!   negotiated ones and counters.
//!
//! # Example
//!
//! A request carrying a 1 MiB payload that the server pulls:
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use ionet::{Config, Endpoint, Payload, ServiceLevel};
//!
//! # fn main() -> ionet::Result<()> {
//! let server = Endpoint::bind("tcp://127.0.0.1:0", Config::default())?;
//! let addr = server.local_addr().unwrap();
//! let t = std::thread::spawn(move || -> ionet::Result<()> {
//!     let req = server.next_request(None)?.unwrap();
//!     let len = req.payload_len() as usize;
//!     let c = server.wait(req.pull_into(BytesMut::zeroed(len), 0)?)?.ok()?;
//!     let sum: u64 = c.data().unwrap().iter().map(|&b| b as u64).sum();
//!     server.wait(req.reply(sum.to_string())?)?.ok()?;
//!     Ok(())
//! });
//!
//! let client = Endpoint::client(Config::default())?;
//! let peer = client.connect(&addr)?;
//! let data = Bytes::from(vec![1u8; 1 << 20]);
//! let op = client.request(peer, 7, "write", Payload::Out(data.into()), ServiceLevel::Bulk)?;
//! let done = client.wait(op)?.ok()?;
//! assert_eq!(done.reply.as_deref(), Some(&b"1048576"[..]));
//! t.join().unwrap()?;
//! # Ok(())
//! # }
//! ```
//!
//! See `examples/pingpong.rs` and `examples/kv.rs` for complete programs, and the
//! `ionet-perf` tool for measurements.
//!
//! # Platforms
//!
//! * **Linux**: everything — `tcp://`, `softib://`, `ib://` (cargo feature `verbs`), the
//!   event descriptor ([`AsFd`](std::os::fd::AsFd) on [`Endpoint`]), the async API (cargo
//!   feature `tokio`) and the memory monitor of the registration cache.
//! * **macOS and FreeBSD**: TCP only. `tcp://` endpoints, their event descriptor (a kqueue
//!   there, with the same [`Endpoint::arm`] / [`Endpoint::try_progress`] protocol) and the
//!   async API work as on Linux. Missing, because they stand on Linux interfaces:
//!   - `softib://` and `ib://`: opening such an endpoint fails with [`Error::Unsupported`]
//!     naming the platform (the software provider uses memfd, pidfd, `process_vm_readv` and
//!     io_uring page pinning; the hardware one libibverbs, and cargo feature `verbs` adds
//!     nothing there);
//!   - the software provider's test hooks (`IbConfig::soft_*`, cargo feature `soft-faults`)
//!     and `internals::ib::soft`;
//!   - the memory monitor (userfaultfd): a registration cache never keeps lent memory
//!     registered ([`regcache`](internals::regcache)'s `cache_foreign_watched` has no effect);
//!   - socket options without an equivalent: `SO_PRIORITY` and `TCP_DEFER_ACCEPT` are not
//!     set, and [`Config::tcp_congestion`] is refused on macOS (with a warning: the system
//!     has no per-socket congestion control), while DSCP marking, `TCP_NODELAY`, buffer sizes
//!     and the direct waits of a lone connection work.
//!
//!   CI checks both (`cargo check` and `clippy` for `x86_64-apple-darwin` and
//!   `x86_64-unknown-freebsd`); neither runs the tests there.
//! * Anything else (Windows, other Unix systems) fails to compile with a message saying so.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

// The TCP transport needs a readiness multiplexer the endpoint's event descriptor can nest:
// epoll on Linux, a kqueue with `EVFILT_USER` (the wake-up) elsewhere. Say so at once rather
// than with a page of unresolved imports.
#[cfg(not(any(target_os = "linux", target_vendor = "apple", target_os = "freebsd")))]
compile_error!(
    "ionet builds on Linux (every transport) and on macOS and FreeBSD (TCP only); this platform has \
     neither epoll nor a kqueue with EVFILT_USER for the endpoint's event descriptor"
);

pub mod addr;
mod admission;
mod backend;
mod buffers;
pub mod comm;
mod completions;
pub mod config;
mod core;
mod endpoint;
pub mod error;
pub mod expose;
mod flowctl;
mod fuzzing;
pub(crate) mod handshake;
mod ib;
pub mod info;
pub mod key_file;
#[cfg(all(loom, test))]
mod loom;
mod matching;
mod op;
// The endpoint's event descriptor: an epoll instance on Linux, a kqueue elsewhere.
#[cfg_attr(not(target_os = "linux"), path = "readiness/kqueue.rs")]
mod readiness;
mod regcache;
mod sched;
mod sockets;
mod spin_learn;
mod sync;
mod tcp;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod tokio;
pub mod types;
mod util;
mod wire;

pub use buffers::{buf, copy, filemap};

/// The building blocks under the endpoint — frame codec, tag matching, flow control,
/// registration cache, send scheduler — and the fuzzing entry points, for this repository's
/// benchmarks, fuzz targets and tests.
///
/// Not part of the supported API: anything here may change or go away in any release.
#[doc(hidden)]
pub mod internals {
    /// Credit-based flow control over pre-posted buffers and the fast-RDMA ring.
    pub mod flowctl {
        pub use crate::flowctl::*;
    }
    /// Entry points of the fuzz targets.
    pub mod fuzzing {
        pub use crate::fuzzing::*;
    }
    /// Tag matching with early arrivals.
    pub mod matching {
        pub use crate::matching::*;
    }
    /// The pin-down (registration) cache.
    pub mod regcache {
        pub use crate::regcache::*;
    }
    /// The weighted send scheduler between service levels.
    pub mod sched {
        pub use crate::sched::*;
    }
    /// The frame header codec and its validation.
    pub mod wire {
        pub use crate::wire::*;
    }
    /// InfiniBand below the engine: the `Verbs` seam the engine runs on, the software provider
    /// behind `softib://` (with its fault injection) and, with feature `verbs`, the libibverbs
    /// provider — for the verbs conformance tests, the fault tests and `verbs-perf`.
    pub mod ib {
        #[cfg(all(feature = "verbs", target_os = "linux"))]
        pub use crate::ib::hw;
        #[cfg(target_os = "linux")]
        pub use crate::ib::soft;
        pub use crate::ib::verbs;
    }
}

pub use addr::{Address, DeviceSelect, Scheme};
pub use buf::{BUF_ALIGN, BufPool, MemKeys, OpBuf, RecvBuf, RegisteredBuf, SendBuf};
pub use comm::{Mechanism, Origin, POLICY_FILE_ENV, Policy, Thresholds};
pub use config::{Config, IbConfig};
pub use endpoint::{Arm, Endpoint, Exposure, Request, ToAddress};
pub use error::{AccessError, Error, ProtocolError, Result};
pub use expose::MemHandle;
pub use filemap::{FileMap, FileMapError, FileRegion, FileRegionMut, Turn};
pub use info::{CounterSnapshot, Gauges, Info, RegcacheInfo};
pub use op::{Completion, Direction, OpKind, Payload, Unexpected};
pub use types::{Access, OpId, PeerId, ServiceLevel, Tag, WaitMode};

//! # ionet
//!
//! A transport abstraction for storage protocols in the spirit of PVFS2's BMI: a protocol
//! written once against [`Endpoint`] runs over TCP (`tcp://`) or InfiniBand verbs (`ib://`, or
//! `softib://` through the software verbs provider), and the transport does the hard parts —
//! credit-based flow control over pre-posted buffers, a pin-down (registration) cache, and a
//! communication manager that picks **inline**, **fast RDMA** or **server-based RDMA** for each
//! transfer.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod addr;
pub mod buf;
pub mod comm;
pub mod config;
mod endpoint;
pub mod error;
pub mod expose;
pub mod flowctl;
pub mod ib;
pub mod info;
pub mod matching;
pub mod regcache;
pub mod sched;
mod tcp;
pub mod types;
mod util;
pub mod wire;

pub use addr::{Address, Scheme};
pub use buf::{BufPool, MemKeys, OpBuf, RecvBuf, RegisteredBuf, SendBuf};
pub use comm::{Mechanism, Policy, Thresholds};
pub use config::Config;
pub use endpoint::{
    Completion, Direction, Endpoint, Exposure, OpKind, Payload, Request, ToAddress, Unexpected,
};
pub use error::{AccessError, Error, ProtocolError, Result};
pub use expose::MemHandle;
pub use info::{CounterSnapshot, Info, RegcacheInfo};
pub use types::{Access, OpId, PeerId, ServiceLevel, Tag, WaitMode};

//! InfiniBand: the `Verbs` seam, the software and hardware providers, and the engine.
//!
//! Only the seam's types are built outside Linux (errors and counters of the public API name
//! them): both providers and so the engine stand on Linux interfaces — the software one on
//! memfd, pidfd, `process_vm_*` and io_uring, the hardware one on libibverbs.

#[cfg(all(feature = "verbs", target_os = "linux"))]
#[cfg_attr(docsrs, doc(cfg(feature = "verbs")))]
pub mod hw;
#[cfg(target_os = "linux")]
pub mod soft;
pub mod verbs;

#[cfg(target_os = "linux")]
pub(crate) mod engine;

#[cfg(target_os = "linux")]
pub(crate) use engine::make_backend;

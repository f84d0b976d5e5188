//! The synchronisation primitives of structures shared between threads, from `std` — or from
//! `loom` under `--cfg loom`, so the model checks in `src/loom/` explore every interleaving of
//! the real code (`RUSTFLAGS="--cfg loom" cargo test -p ionet --lib loom`).

#[cfg(all(loom, test))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(all(loom, test))]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(all(loom, test)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(not(all(loom, test)))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

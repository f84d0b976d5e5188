//! loom model checks (`RUSTFLAGS="--cfg loom" cargo test -p ionet --lib loom`) of
//! the structures threads share, run on the real code through the primitives of
//! `crate::sync`. The endpoint's completion queue ([`crate::completions`]) and its waiting loop are
//! modelled next to the endpoint (`src/loom/endpoint.rs`, a child of `endpoint` for its private
//! items).
//!
//! Credit counters and the regcache's reference counts are not here on purpose: they are
//! sans-IO structs owned by one backend state under one mutex, never touched by two threads
//! at once, and are checked by their unit and property tests.

mod pool;

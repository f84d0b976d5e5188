//! The Endpoint behaviour suite over `ib://`, on a real RDMA device (an HCA, a RoCE NIC, or
//! SoftRoCE). Compiled only with `--cfg ionet_hw` and the `verbs` feature, since every test
//! needs a device; `tests/hw/README.md` says how to run it:
//!
//! ```text
//! RUSTFLAGS="--cfg ionet_hw" IONET_IB_DEVICE=rxe0:1 \
//!     cargo test -p ionet --features verbs --test conformance_ib
//! ```
#![cfg(all(feature = "verbs", ionet_hw))]
mod conformance;

agent_entry!();
transport_suite!("ib");

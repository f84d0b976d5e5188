//! Fault injection for the software provider.
//!
//! A [`FaultPlan`] is given globally in [`super::SoftConfig::faults`] (every QP created by the
//! context starts with a copy) or per QP with [`super::SoftContext::set_qp_faults`]. Counts are
//! consumed as the QP processes work requests, so a plan describes a deterministic script
//! ("the next 3 SENDs find no receive"), never a probability: tests stay reproducible.

use std::time::Duration;

/// Faults a QP injects into its own send queue (it is the requester in each case).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// The next `n` delivery attempts of receive-consuming operations (SEND, SEND_WITH_IMM,
    /// RDMA_WRITE_WITH_IMM) behave as if the responder had no receive posted: each attempt is
    /// an RNR NAK, retried per `rnr_retry`.
    pub rnr_attempts: u32,
    /// The next `n` one-sided operations (RDMA_WRITE*, RDMA_READ) are refused by the responder
    /// with `RemAccessErr`, touching no memory.
    pub remote_access_errors: u32,
    /// After this many work requests have been processed, the QP fails: it moves to ERR and
    /// the rest (including the one that would have been next) flush with `WrFlushErr`.
    pub qp_error_after: Option<u64>,
    /// RDMA_READs complete this long after they are posted (the data lands then, the remote
    /// memory is sampled then). Later work requests proceed meanwhile unless they carry
    /// `FENCE`, so a later SEND overtakes the READ.
    pub read_delay: Option<Duration>,
    /// With `read_delay`: deliver the completions of later work requests before the delayed
    /// READ's (beyond-spec reordering on the requester's CQ, to test engines that must not
    /// rely on completion order). Without it, completions stay in posting order.
    pub reorder_read_completions: bool,
    /// After this many work requests, behave as if the peer vanished: that work request fails
    /// with `RetryExcErr`, the QP moves to ERR and the rest flush.
    pub vanish_after: Option<u64>,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> Self {
        FaultPlan::default()
    }

    /// `n` RNR attempts.
    pub fn rnr(n: u32) -> Self {
        FaultPlan { rnr_attempts: n, ..Self::default() }
    }

    /// `n` remote access errors.
    pub fn remote_access(n: u32) -> Self {
        FaultPlan { remote_access_errors: n, ..Self::default() }
    }

    /// QP error after `n` work requests.
    pub fn qp_error_after(n: u64) -> Self {
        FaultPlan { qp_error_after: Some(n), ..Self::default() }
    }

    /// Delayed RDMA_READ completions (in order unless `reorder`).
    pub fn delayed_reads(delay: Duration, reorder: bool) -> Self {
        FaultPlan { read_delay: Some(delay), reorder_read_completions: reorder, ..Self::default() }
    }

    /// Peer vanishes after `n` work requests.
    pub fn vanish_after(n: u64) -> Self {
        FaultPlan { vanish_after: Some(n), ..Self::default() }
    }
}

//! Fault injection for the software provider.
//!
//! A [`FaultPlan`] is given globally in [`super::SoftConfig::faults`] (every QP created by the
//! context starts with a copy) or per QP with [`super::SoftContext::set_qp_faults`]. Counts are
//! consumed as the QP processes work requests, so a plan describes a deterministic script
//! ("the next 3 SENDs find no receive"), never a probability: tests stay reproducible.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::SoftContext;

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

/// Test hook: hands a test the software device context an endpoint opens, so it can inject
/// faults into the queue pairs that endpoint creates ([`SoftContext::set_qp_faults`]) and read
/// the provider's view of them. Given to an endpoint with
/// `IbConfig::soft_hook` (cargo feature `soft-faults`); for tests only.
#[derive(Clone, Default)]
pub struct SoftHook {
    ctx: Arc<Mutex<Option<SoftContext>>>,
}

impl SoftHook {
    /// An empty hook; it is filled when an endpoint configured with it opens its device.
    pub fn new() -> Self {
        SoftHook::default()
    }

    pub(crate) fn attach(&self, ctx: &SoftContext) {
        *self.ctx.lock().unwrap_or_else(|p| p.into_inner()) = Some(ctx.clone());
    }

    /// The endpoint's device context, once it has opened one.
    pub fn context(&self) -> Option<SoftContext> {
        self.ctx.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Numbers of the endpoint's live queue pairs, ascending (empty before it opened a device).
    pub fn qps(&self) -> Vec<u32> {
        self.context().map(|c| c.qp_nums()).unwrap_or_default()
    }

    /// Replaces the fault plan of every live queue pair of the endpoint; returns how many.
    pub fn set_all(&self, plan: &FaultPlan) -> usize {
        let Some(ctx) = self.context() else { return 0 };
        ctx.qp_nums().into_iter().filter(|&q| ctx.set_qp_faults(q, plan.clone()).is_ok()).count()
    }
}

impl fmt::Debug for SoftHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftHook").field("attached", &self.context().is_some()).finish()
    }
}

/// Hooks are equal when they are the same hook.
impl PartialEq for SoftHook {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.ctx, &other.ctx)
    }
}

impl Eq for SoftHook {}

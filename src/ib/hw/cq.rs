//! Completion channels and completion queues of the hardware provider.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use ibverbs_sys as ffi;

use super::{CtxInner, errno_ret};
use crate::ib::verbs::*;

pub(super) struct ChanInner {
    pub(super) _ctx: Arc<CtxInner>,
    pub(super) ch: *mut ffi::ibv_comp_channel,
}

// SAFETY: see `CtxInner`.
unsafe impl Send for ChanInner {}
// SAFETY: see `CtxInner`.
unsafe impl Sync for ChanInner {}

impl Drop for ChanInner {
    fn drop(&mut self) {
        // SAFETY: CQs bound to the channel hold an Arc to it, so none is alive.
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.ch) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion channel (its fd is set non-blocking).
pub struct HwChannel {
    pub(super) inner: Arc<ChanInner>,
}

impl fmt::Debug for HwChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwChannel").field("fd", &self.as_raw_fd()).finish()
    }
}

impl AsRawFd for HwChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: `ch` is live while `self` is.
        unsafe { (*self.inner.ch).fd }
    }
}

impl AsFd for HwChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open until the channel is destroyed, which cannot
        // happen while `self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl CompletionChannel for HwChannel {
    fn get_event(&self) -> VerbsResult<Option<u64>> {
        let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
        let mut cookie: *mut std::ffi::c_void = ptr::null_mut();
        // SAFETY: live channel with a non-blocking fd; valid out-pointers.
        let rc = unsafe { ffi::ibv_get_cq_event(self.inner.ch, &mut cq, &mut cookie) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e.into()) };
        }
        // SAFETY: `cq` was just returned by ibv_get_cq_event and cannot be destroyed before
        // its events are acknowledged; we acknowledge this one at once.
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        Ok(Some(cookie as usize as u64))
    }
}

pub(super) struct CqInner {
    pub(super) ctx: Arc<CtxInner>,
    pub(super) _ch: Option<Arc<ChanInner>>,
    pub(super) cq: *mut ffi::ibv_cq,
    pub(super) cookie: u64,
    pub(super) cap: u32,
}

// SAFETY: see `CtxInner`.
unsafe impl Send for CqInner {}
// SAFETY: see `CtxInner` (poll_cq and req_notify_cq are thread-safe).
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold an Arc to it; events were acknowledged in get_event.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue.
pub struct HwCq {
    pub(super) inner: Arc<CqInner>,
}

impl fmt::Debug for HwCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwCq").field("cap", &self.inner.cap).finish()
    }
}

fn wc_opcode(op: ffi::ibv_wc_opcode::Type) -> WcOpcode {
    use ffi::ibv_wc_opcode::*;
    match op {
        IBV_WC_SEND => WcOpcode::Send,
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_RECV => WcOpcode::Recv,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => WcOpcode::Other(other),
    }
}

impl CompletionQueue for HwCq {
    fn capacity(&self) -> u32 {
        self.inner.cap
    }

    fn cookie(&self) -> u64 {
        self.inner.cookie
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let Some(poll_cq) = self.inner.ctx.ops().poll_cq else {
            return Err(VerbsError::Unsupported("driver has no poll_cq".into()));
        };
        let mut raw = [ffi::ibv_wc::default(); 32];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(raw.len()) as i32;
            // SAFETY: live CQ; `raw` has room for `want` entries.
            let n = unsafe { poll_cq(self.inner.cq, want, raw.as_mut_ptr()) };
            if n < 0 {
                return Err(VerbsError::Io(io::Error::other(format!("poll_cq returned {n}"))));
            }
            for (w, o) in raw[..n as usize].iter().zip(&mut out[done..]) {
                let (status, vendor_err) =
                    w.error().map_or((WcStatus::Success, 0), |(s, v)| (WcStatus::from_raw(s), v));
                // ibv_poll_cq(3): a failed completion has a valid wr_id, status, qp_num and
                // vendor_err only; the other fields are left as a failure reports them here
                // (zero) instead of whatever the driver left in them.
                let ok = status == WcStatus::Success;
                *o = WorkCompletion {
                    wr_id: w.wr_id(),
                    status,
                    opcode: wc_opcode(w.opcode()),
                    byte_len: if ok { w.len() as u32 } else { 0 },
                    imm_data: w.imm_data().map(u32::from_be),
                    qp_num: w.qp_num,
                    src_qp: if ok { w.src_qp } else { 0 },
                    vendor_err,
                };
            }
            done += n as usize;
            if n < want {
                break;
            }
        }
        self.inner.ctx.completions.fetch_add(done as u64, Relaxed);
        Ok(done)
    }

    fn req_notify(&self, solicited_only: bool) -> VerbsResult<()> {
        if self.inner._ch.is_none() {
            return Err(VerbsError::InvalidArgument("req_notify on a CQ without a channel".into()));
        }
        let Some(f) = self.inner.ctx.ops().req_notify_cq else {
            return Err(VerbsError::Unsupported("driver has no req_notify_cq".into()));
        };
        // SAFETY: live CQ.
        let rc = unsafe { f(self.inner.cq, i32::from(solicited_only)) };
        errno_ret("ibv_req_notify_cq", rc)
    }
}

//! Hardware verbs provider on `libibverbs` through `ibverbs-sys` (cargo feature `verbs`).
//!
//! A thin owner layer: every `ibv_*` object is wrapped as soon as it is created, dropping
//! destroys it, and objects hold `Arc`s to what they depend on (QP → CQs, SRQ, PD; CQ →
//! channel; everything → the device context), so no destroy can fail with `EBUSY` or leave a
//! dangling pointer. The data-path verbs (`post_send`, `post_recv`, `post_srq_recv`, `poll_cq`,
//! `req_notify_cq`) are `static inline` in `verbs.h`; like the `ibverbs` crate we call them
//! through the context's ops table.
//!
//! Before posting, work requests are checked the way the software provider checks them (SGE
//! count, inline size) and inline SGEs must lie inside the registration their `lkey` names:
//! the driver copies inline data with `memcpy` at post time without consulting any key, so this
//! check is what keeps `post_send` a safe function. Everything else (lkeys, rkeys, bounds) is
//! enforced by the HCA and reported in completions.
//!
//! With no RDMA device (`ibv_get_device_list` returns NULL/`ENOSYS` when the kernel has no RDMA
//! support, or an empty list) every entry point returns [`VerbsError::NoDevice`], which names
//! the software provider (`softib://`).
//!
//! # Review against rdma-core's documentation
//!
//! Every call this provider makes, checked against its man page (rdma-core's
//! `libibverbs/man/`) and, where the page is silent, `verbs.h`: which attributes it sets or
//! reads, how the call reports failure, and what is done with that.
//!
//! Return conventions differ by call, and each is handled as its page says: **pointer**
//! returners give NULL and set `errno` (read with `io::Error::last_os_error`); **errno-value**
//! returners give 0 or a positive errno value and leave `errno` alone (`errno_ret`; the ops of
//! a missing driver entry are answered with a negative errno value, read the same way);
//! `ibv_query_gid` and `ibv_close_device` give -1, which is *not* an errno value.
//!
//! | call | attributes | failure | here |
//! |---|---|---|---|
//! | `ibv_get_device_list` | out: count | NULL, `errno` (`ENOSYS`: no kernel support) | [`VerbsError::NoDevice`]; an empty list too |
//! | `ibv_get_device_name`, `ibv_get_device_guid` | GUID is big-endian | none | name copied before the list is freed; GUID byte-swapped |
//! | `ibv_free_device_list` | — | none | once, in `Drop` |
//! | `ibv_open_device` | — | NULL, `errno` | `VerbsError::Io` naming the call; unknown names are [`FabricError::NoSuchDevice`] listing those present |
//! | `ibv_query_device` | `max_qp`, `max_qp_wr`, `max_sge`, `max_cq(e)`, `max_mr(_size)`, `max_pd`, `max_qp_rd_atom`, `max_srq(_wr, _sge)`, `phys_port_cnt` | errno value | no device attribute gives the inline limit: a probe QP measures it |
//! | `ibv_query_port` | `state`, `max_mtu`, `active_mtu`, `gid_tbl_len`, `max_msg_sz`, `lid`, `link_layer` | errno value (`EINVAL` for a bad port) | the exported symbol fills the compatible leading part of `ibv_port_attr`, which holds every field read; ports outside `1..=phys_port_cnt` are refused first with [`FabricError::NoSuchPort`] |
//! | `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`) | `gid`, `gid_type`, flags 0 | errno value: `ENODATA` an empty entry; `EINVAL` past the table (and any failure of the sysfs fallback on kernels without the ioctl) | the index is checked against `gid_tbl_len` first; [`FabricError::NoSuchGid`] naming the cause; also used for the port's GID 0 in place of `ibv_query_gid`, whose -1 says nothing |
//! | `ibv_alloc_pd` / `ibv_dealloc_pd` | — | NULL + `errno` / errno value (`EBUSY` while in use) | dealloc only after every MR, QP and SRQ of the PD (they hold it) |
//! | `ibv_reg_mr` / `ibv_dereg_mr` | `access` = `ibv_access_flags` bits; `REMOTE_WRITE` needs `LOCAL_WRITE` (else `EINVAL`) | NULL + `errno` (`ENOMEM`, `EPERM`, `EAGAIN` when memory cannot be pinned) / errno value | pinning failures are [`VerbsError::PinLimit`] so the cache can release and retry; flags checked first |
//! | `ibv_create_comp_channel` / `ibv_destroy_comp_channel` | `fd` made `O_NONBLOCK` (the documented way to poll it) | NULL + `errno` / errno value (`EBUSY` with CQs attached) | CQs hold their channel |
//! | `ibv_create_cq` / `ibv_destroy_cq` | `cqe` (granted size read back), `cq_context` = cookie, `comp_vector` 0 | NULL + `errno` / errno value | events are acknowledged as they are taken, so destroy never waits |
//! | `ibv_get_cq_event` / `ibv_ack_cq_events` | out: CQ, context | -1 + `errno` (`EAGAIN` on a non-blocking channel with nothing pending) | `EAGAIN` is "no event"; each event acknowledged at once |
//! | `req_notify_cq` (ops) | `solicited_only` | errno value | refused on a CQ without a channel |
//! | `poll_cq` (ops) | `wr_id`, `status`, `opcode`, `byte_len`, `imm_data` (network order), `qp_num`, `src_qp`, `vendor_err` | negative on error | `imm_data` byte-swapped (and only with `IBV_WC_WITH_IMM`); a failed completion has valid `wr_id`, `status`, `qp_num` and `vendor_err` only, so its `byte_len` and `src_qp` are reported as 0 and its `opcode` is documented as meaningless |
//! | `ibv_create_srq` / `ibv_destroy_srq` | `max_wr`, `max_sge` | NULL + `errno` / errno value | — |
//! | `ibv_create_qp` / `ibv_destroy_qp` | `IBV_QPT_RC`, `send_cq`, `recv_cq`, `srq`, `cap`, `sq_sig_all`; granted `cap` written back | NULL + `errno` / errno value | granted sizes are what [`QueuePair::cap`] reports |
//! | `ibv_modify_qp` RESET→INIT | `qp_state`, `pkey_index`, `port_num`, `qp_access_flags` with their mask bits | errno value (`EINVAL` for a wrong mask or value) | the RC state machine is checked first ([`VerbsError::InvalidTransition`]) |
//! | `ibv_modify_qp` INIT→RTR | `path_mtu`, `dest_qp_num`, `rq_psn`, `max_dest_rd_atomic`, `min_rnr_timer`, `ah_attr` (`dlid`, `sl`, `port_num`; with a GID index `is_global`, `grh.dgid`, `grh.sgid_index`, `grh.hop_limit` 64, `grh.traffic_class`) | errno value | [`check_route`] first: the port exists, the GID index names an entry, an Ethernet port gets a GRH (RoCE has no LIDs), the path MTU is at most the port's active MTU — typed errors where the HCA says only `EINVAL` |
//! | `ibv_modify_qp` RTR→RTS | `sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic` | errno value | — |
//! | `ibv_query_qp` | `qp_state` only | errno value | a QP whose state cannot be read is reported as `Err` |
//! | `post_send` / `post_recv` / `post_srq_recv` (ops) | `wr_id`, `sg_list`, `num_sge`, `opcode`, `send_flags`, `imm_data`, `wr.rdma` | errno value + `bad_wr` | `bad_wr`'s index becomes [`PostError::index`]; SGE counts and inline sizes checked first |
//! | `ibv_close_device` | — | -1 | logged only (in `Drop`, after every object of the context) |
//!
//! Counters (`counters`): what this process counts around these calls, plus the port counters
//! the kernel publishes in the device's sysfs directory (`ibv_device::ibdev_path`); verbs has
//! no call for a context's RNR retries or the HCA's busy time, so those are `None`.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use ibverbs_sys as ffi;

use crate::ib::verbs::*;

mod counters;
mod cq;

use cq::{ChanInner, CqInner};
pub use cq::{HwChannel, HwCq};

const PROVIDER: &str = "ib";

fn no_device(reason: String) -> VerbsError {
    VerbsError::NoDevice { provider: PROVIDER, reason }
}

/// `ibv_modify_qp` and friends return an errno value instead of setting `errno`.
fn errno_ret(what: &str, rc: i32) -> VerbsResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::from_raw_os_error(rc.abs());
        Err(VerbsError::Io(io::Error::new(e.kind(), format!("{what}: {e}"))))
    }
}

fn os_err(what: &str) -> VerbsError {
    let e = io::Error::last_os_error();
    VerbsError::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// The hardware provider.
#[derive(Debug, Clone, Copy, Default)]
pub struct HwProvider;

impl HwProvider {
    /// The provider.
    pub fn new() -> Self {
        HwProvider
    }
}

/// The device list, freed on drop.
struct DeviceList {
    list: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> VerbsResult<DeviceList> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the returned list is owned by us until freed.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = io::Error::last_os_error();
            return Err(no_device(format!("ibv_get_device_list: {e} (no kernel RDMA support?)")));
        }
        let len = usize::try_from(n).unwrap_or(0);
        let dl = DeviceList { list, len };
        if len == 0 {
            return Err(no_device("ibv_get_device_list returned no devices".into()));
        }
        Ok(dl)
    }

    fn devices(&self) -> impl Iterator<Item = *mut ffi::ibv_device> + '_ {
        // SAFETY: `list` holds `len` valid device pointers while the list is alive.
        (0..self.len).map(move |i| unsafe { *self.list.add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed exactly once.
        unsafe { ffi::ibv_free_device_list(self.list) };
    }
}

/// The device's sysfs directory (`/sys/class/infiniband/<name>`), as libibverbs found it.
fn ibdev_path(dev: *mut ffi::ibv_device) -> std::path::PathBuf {
    // SAFETY: `dev` is a live entry of a device list; `ibdev_path` is a NUL-terminated array
    // inside it (copied out before the list is freed).
    let raw = unsafe { &(*dev).ibdev_path };
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    std::path::PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes))
}

fn device_info(dev: *mut ffi::ibv_device) -> DeviceInfo {
    // SAFETY: `dev` is a live entry of a device list; the name is a NUL-terminated string
    // owned by the library (copied out before the list is freed).
    let name = unsafe {
        let p = ffi::ibv_get_device_name(dev);
        if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
    };
    // SAFETY: `dev` is a live device.
    let guid = u64::from_be(unsafe { ffi::ibv_get_device_guid(dev) });
    DeviceInfo { name, guid }
}

impl Provider for HwProvider {
    type Context = HwContext;

    fn scheme(&self) -> &'static str {
        PROVIDER
    }

    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>> {
        Ok(DeviceList::get()?.devices().map(device_info).collect())
    }

    fn open(&self, device: Option<&str>) -> VerbsResult<HwContext> {
        let list = DeviceList::get()?;
        let dev =
            list.devices().find(|&d| device.is_none_or(|n| device_info(d).name == n)).ok_or_else(|| {
                FabricError::NoSuchDevice {
                    name: device.unwrap_or_default().to_string(),
                    available: list.devices().map(|d| device_info(d).name).collect(),
                }
            })?;
        let info = device_info(dev);
        // SAFETY: `dev` is a live entry of `list`; the context outlives the list.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        if ctx.is_null() {
            return Err(os_err("ibv_open_device"));
        }
        let mut c = CtxInner::empty();
        c.ctx = ctx;
        c.device = info;
        c.sysfs = ibdev_path(dev);
        c.attr = query_device(&c)?;
        let mut inner = Arc::new(c);
        let probe = probe_inline(&inner);
        if let Some(i) = Arc::get_mut(&mut inner) {
            i.attr.max_inline_data = probe;
        }
        Ok(HwContext { inner })
    }
}

struct CtxInner {
    ctx: *mut ffi::ibv_context,
    device: DeviceInfo,
    attr: DeviceAttr,
    /// The device's sysfs directory, where the kernel publishes its port counters.
    sysfs: std::path::PathBuf,
    /// lkey → (addr, len) of live registrations, to validate inline SGEs.
    mrs: RwLock<HashMap<u32, (u64, u64)>>,
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    registered_bytes: AtomicU64,
    pinned_bytes: AtomicU64,
    reg_ns: AtomicU64,
    dereg_ns: AtomicU64,
    send_wrs: AtomicU64,
    recv_wrs: AtomicU64,
    completions: AtomicU64,
    write_bytes: AtomicU64,
    read_bytes: AtomicU64,
    send_bytes: AtomicU64,
}

impl CtxInner {
    fn empty() -> Self {
        CtxInner {
            ctx: ptr::null_mut(),
            device: DeviceInfo { name: String::new(), guid: 0 },
            attr: DeviceAttr::default(),
            sysfs: std::path::PathBuf::new(),
            mrs: RwLock::new(HashMap::new()),
            registrations: AtomicU64::new(0),
            deregistrations: AtomicU64::new(0),
            registered_bytes: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            reg_ns: AtomicU64::new(0),
            dereg_ns: AtomicU64::new(0),
            send_wrs: AtomicU64::new(0),
            recv_wrs: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            send_bytes: AtomicU64::new(0),
        }
    }

    fn ops(&self) -> &ffi::ibv_context_ops {
        // SAFETY: `ctx` is a live context for our lifetime; its ops table is immutable after open.
        unsafe { &(*self.ctx).ops }
    }
}

// SAFETY: libibverbs contexts and the objects created from them may be used from any thread
// ("all verbs are thread safe", ibv_open_device(3)); the raw pointer is only freed in Drop.
unsafe impl Send for CtxInner {}
// SAFETY: as above; shared access only calls thread-safe verbs.
unsafe impl Sync for CtxInner {}

impl Drop for CtxInner {
    fn drop(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        // SAFETY: every object created from the context holds an Arc to it, so none is alive.
        let rc = unsafe { ffi::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_close_device failed");
        }
    }
}

fn query_device(c: &CtxInner) -> VerbsResult<DeviceAttr> {
    // SAFETY: an all-zero ibv_device_attr is a valid value (plain integers and arrays).
    let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: live context, valid out-pointer.
    let rc = unsafe { ffi::ibv_query_device(c.ctx, &mut a) };
    errno_ret("ibv_query_device", rc)?;
    let u = |v: i32| u32::try_from(v).unwrap_or(0);
    Ok(DeviceAttr {
        max_mr_size: a.max_mr_size,
        max_qp: u(a.max_qp),
        max_qp_wr: u(a.max_qp_wr),
        max_sge: u(a.max_sge),
        max_cq: u(a.max_cq),
        max_cqe: u(a.max_cqe),
        max_mr: u(a.max_mr),
        max_pd: u(a.max_pd),
        max_qp_rd_atom: u(a.max_qp_rd_atom),
        max_srq: u(a.max_srq),
        max_srq_wr: u(a.max_srq_wr),
        max_srq_sge: u(a.max_srq_sge),
        max_inline_data: 0,
        phys_port_cnt: a.phys_port_cnt,
        cpu_moves_data: false,
    })
}

/// Largest inline size a QP is granted: verbs has no device attribute for it, so create a
/// throw-away QP asking for progressively less.
fn probe_inline(c: &Arc<CtxInner>) -> u32 {
    let ctx = HwContext { inner: Arc::clone(c) };
    let (Ok(pd), Ok(cq)) = (ctx.alloc_pd(), ctx.create_cq(1, None, 0)) else { return 0 };
    for want in [512u32, 256, 128, 64, 32, 0] {
        let cap =
            QpCap { max_send_wr: 1, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: want };
        let init = QpInit { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false };
        if let Ok(qp) = ctx.create_qp(&pd, &init) {
            return qp.cap().max_inline_data;
        }
    }
    0
}

/// An opened RDMA device.
#[derive(Clone)]
pub struct HwContext {
    inner: Arc<CtxInner>,
}

impl fmt::Debug for HwContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwContext").field("device", &self.inner.device).finish()
    }
}

struct PdInner {
    ctx: Arc<CtxInner>,
    pd: *mut ffi::ibv_pd,
}

// SAFETY: see `CtxInner`: verbs objects are thread-safe; the pointer is freed only in Drop.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: MRs, QPs and SRQs of this PD hold an Arc to it, so none is alive.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain.
pub struct HwPd {
    inner: Arc<PdInner>,
}

impl fmt::Debug for HwPd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HwPd")
    }
}

/// A memory registration.
pub struct HwMr {
    pd: Arc<PdInner>,
    mr: *mut ffi::ibv_mr,
    addr: u64,
    len: usize,
    access: AccessFlags,
    lkey: u32,
    rkey: u32,
}

// SAFETY: see `CtxInner`.
unsafe impl Send for HwMr {}
// SAFETY: see `CtxInner`; shared access only reads copied fields.
unsafe impl Sync for HwMr {}

impl fmt::Debug for HwMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwMr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .finish()
    }
}

impl HwMr {
    fn release(&mut self) -> VerbsResult<()> {
        if self.mr.is_null() {
            return Ok(());
        }
        let t0 = Instant::now();
        let c = &self.pd.ctx;
        c.mrs.write().unwrap_or_else(|p| p.into_inner()).remove(&self.lkey);
        // SAFETY: `mr` came from ibv_reg_mr and is deregistered exactly once (nulled below).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr) };
        self.mr = ptr::null_mut();
        c.deregistrations.fetch_add(1, Relaxed);
        c.pinned_bytes.fetch_sub(self.len as u64, Relaxed);
        c.dereg_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        errno_ret("ibv_dereg_mr", rc)
    }
}

impl Drop for HwMr {
    fn drop(&mut self) {
        if let Err(err) = self.release() {
            tracing::warn!(%err, "deregistration failed");
        }
    }
}

impl MemoryRegion for HwMr {
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> AccessFlags {
        self.access
    }
    fn deregister(mut self) -> VerbsResult<()> {
        self.release()
    }
}

struct SrqInner {
    pd: Arc<PdInner>,
    srq: *mut ffi::ibv_srq,
    max_sge: u32,
}

// SAFETY: see `CtxInner`.
unsafe impl Send for SrqInner {}
// SAFETY: see `CtxInner`.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: QPs using the SRQ hold an Arc to it, so none is alive.
        let rc = unsafe { ffi::ibv_destroy_srq(self.srq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_srq failed");
        }
    }
}

/// A shared receive queue.
pub struct HwSrq {
    inner: Arc<SrqInner>,
}

impl fmt::Debug for HwSrq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HwSrq")
    }
}

/// Builds a chain of `ibv_recv_wr` over `sges` (which must outlive the call that posts it).
fn recv_chain(wrs: &[RecvWr<'_>], sges: &mut Vec<ffi::ibv_sge>) -> Vec<ffi::ibv_recv_wr> {
    sges.clear();
    for wr in wrs {
        sges.extend(wr.sges.iter().map(|s| ffi::ibv_sge { addr: s.addr, length: s.len, lkey: s.lkey }));
    }
    let mut chain = Vec::with_capacity(wrs.len());
    let mut at = 0;
    for wr in wrs {
        chain.push(ffi::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: if wr.sges.is_empty() { ptr::null_mut() } else { sges[at..].as_mut_ptr() },
            num_sge: wr.sges.len() as i32,
        });
        at += wr.sges.len();
    }
    link(&mut chain, |w, next| w.next = next);
    chain
}

/// Links each element to the next through `set`.
fn link<T>(chain: &mut [T], set: impl Fn(&mut T, *mut T)) {
    let base = chain.as_mut_ptr();
    for i in 0..chain.len().saturating_sub(1) {
        // SAFETY: `i + 1 < len`, so the pointer stays inside the slice.
        let next = unsafe { base.add(i + 1) };
        set(&mut chain[i], next);
    }
}

/// Index of `bad` in `chain` (what the driver reported as the first failed request).
fn bad_index<T>(chain: &[T], bad: *const T) -> usize {
    let base = chain.as_ptr() as usize;
    (bad as usize).checked_sub(base).map_or(0, |d| d / std::mem::size_of::<T>().max(1)).min(chain.len())
}

impl SharedReceiveQueue for HwSrq {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let s = &self.inner;
        let n = wrs.iter().position(|w| w.sges.len() > s.max_sge as usize).unwrap_or(wrs.len());
        post_recv_chain(&s.pd.ctx, &wrs[..n], |chain, bad| {
            let Some(f) = s.pd.ctx.ops().post_srq_recv else { return -libc::EOPNOTSUPP };
            // SAFETY: live SRQ; `chain` is a valid linked list whose SGE arrays outlive the call.
            unsafe { f(s.srq, chain, bad) }
        })?;
        if n < wrs.len() {
            let error = VerbsError::TooManySge { given: wrs[n].sges.len(), max: s.max_sge };
            return Err(PostError { index: n, error });
        }
        Ok(())
    }
}

fn post_recv_chain(
    ctx: &CtxInner,
    wrs: &[RecvWr<'_>],
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> i32,
) -> Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut sges = Vec::new();
    let mut chain = recv_chain(wrs, &mut sges);
    let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
    let rc = post(chain.as_mut_ptr(), &mut bad);
    if rc != 0 {
        let index = bad_index(&chain, bad);
        ctx.recv_wrs.fetch_add(index as u64, Relaxed);
        let e = io::Error::from_raw_os_error(rc.abs());
        return Err(PostError { index, error: VerbsError::Io(e) });
    }
    ctx.recv_wrs.fetch_add(wrs.len() as u64, Relaxed);
    Ok(())
}

struct QpInner {
    pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    qp: *mut ffi::ibv_qp,
    cap: QpCap,
}

// SAFETY: see `CtxInner`.
unsafe impl Send for QpInner {}
// SAFETY: see `CtxInner` (posting and modify are thread-safe verbs).
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        // SAFETY: `qp` came from ibv_create_qp and is destroyed once; its CQs/SRQ/PD are still
        // alive (we hold them).
        let rc = unsafe { ffi::ibv_destroy_qp(self.qp) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_qp failed");
        }
    }
}

/// An RC queue pair.
pub struct HwQp {
    inner: Arc<QpInner>,
}

impl fmt::Debug for HwQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HwQp").field("qpn", &self.qp_num()).finish()
    }
}

fn qp_state(s: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

impl HwQp {
    /// Checks a send work request before it reaches the driver (see the module docs).
    fn check(&self, wr: &SendWr<'_>) -> VerbsResult<()> {
        check_send_wr(wr, &self.inner.cap)?;
        if wr.flags.contains(SendFlags::INLINE) {
            let mrs = self.inner.pd.ctx.mrs.read().unwrap_or_else(|p| p.into_inner());
            for s in wr.sges {
                let ok = mrs.get(&s.lkey).is_some_and(|&(a, l)| {
                    s.addr >= a && s.addr.checked_add(u64::from(s.len)).is_some_and(|e| e <= a + l)
                });
                if !ok {
                    return Err(VerbsError::InvalidArgument(format!(
                        "inline SGE {s:?} is not covered by its lkey"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl QueuePair for HwQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: live QP; qp_num never changes.
        unsafe { (*self.inner.qp).qp_num }
    }

    fn state(&self) -> QpState {
        // SAFETY: all-zero attribute structs are valid values (integers, nullable pointers).
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) = unsafe { std::mem::zeroed() };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32;
        // SAFETY: live QP, valid out-pointers.
        let rc = unsafe { ffi::ibv_query_qp(self.inner.qp, &mut attr, mask, &mut init) };
        if rc != 0 { QpState::Err } else { qp_state(attr.qp_state) }
    }

    fn cap(&self) -> QpCap {
        self.inner.cap
    }

    fn modify(&self, t: &QpTransition) -> VerbsResult<()> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: an all-zero ibv_qp_attr is a valid value.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        let mut mask = M::IBV_QP_STATE;
        match *t {
            QpTransition::Init(i) => {
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
                a.pkey_index = i.pkey_index;
                a.port_num = i.port_num;
                a.qp_access_flags = i.access.bits();
                mask = mask | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS;
            }
            QpTransition::Rtr(r) => {
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
                a.path_mtu = r.path_mtu.as_raw();
                a.dest_qp_num = r.remote.qpn;
                a.rq_psn = r.remote.psn & MAX_24BIT;
                a.max_dest_rd_atomic = r.max_dest_rd_atomic;
                a.min_rnr_timer = r.min_rnr_timer;
                a.ah_attr.dlid = r.remote.lid;
                a.ah_attr.sl = r.sl;
                a.ah_attr.port_num = r.port_num;
                if let Some(gid_index) = r.gid_index {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid.raw = r.remote.gid.0;
                    a.ah_attr.grh.sgid_index = gid_index;
                    a.ah_attr.grh.hop_limit = 64;
                    a.ah_attr.grh.traffic_class = r.traffic_class;
                }
                mask = mask
                    | M::IBV_QP_AV
                    | M::IBV_QP_PATH_MTU
                    | M::IBV_QP_DEST_QPN
                    | M::IBV_QP_RQ_PSN
                    | M::IBV_QP_MAX_DEST_RD_ATOMIC
                    | M::IBV_QP_MIN_RNR_TIMER;
            }
            QpTransition::Rts(r) => {
                a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
                a.sq_psn = r.sq_psn & MAX_24BIT;
                a.timeout = r.timeout;
                a.retry_cnt = r.retry_cnt;
                a.rnr_retry = r.rnr_retry;
                a.max_rd_atomic = r.max_rd_atomic;
                mask = mask
                    | M::IBV_QP_SQ_PSN
                    | M::IBV_QP_TIMEOUT
                    | M::IBV_QP_RETRY_CNT
                    | M::IBV_QP_RNR_RETRY
                    | M::IBV_QP_MAX_QP_RD_ATOMIC;
            }
            QpTransition::Err => a.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR,
            QpTransition::Reset => a.qp_state = ffi::ibv_qp_state::IBV_QPS_RESET,
        }
        let from = self.state();
        if !t.allowed_from(from) {
            return Err(VerbsError::InvalidTransition { from, to: t.target() });
        }
        if let QpTransition::Rtr(r) = t {
            check_route(&HwContext { inner: Arc::clone(&self.inner.pd.ctx) }, r)?;
        }
        // SAFETY: live QP; `a` is fully initialised for the fields `mask` selects.
        let rc = unsafe { ffi::ibv_modify_qp(self.inner.qp, &mut a, mask.0 as i32) };
        errno_ret("ibv_modify_qp", rc)
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let mut checked = wrs.len();
        let mut first_err = None;
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.check(wr) {
                checked = i;
                first_err = Some(PostError { index: i, error: e });
                break;
            }
        }
        let wrs_ok = &wrs[..checked];
        if !wrs_ok.is_empty() {
            let mut sges: Vec<ffi::ibv_sge> = Vec::new();
            for wr in wrs_ok {
                sges.extend(wr.sges.iter().map(|s| ffi::ibv_sge {
                    addr: s.addr,
                    length: s.len,
                    lkey: s.lkey,
                }));
            }
            let mut chain: Vec<ffi::ibv_send_wr> = Vec::with_capacity(wrs_ok.len());
            let mut at = 0;
            let c = &self.inner.pd.ctx;
            for wr in wrs_ok {
                let mut w = ffi::ibv_send_wr {
                    wr_id: wr.wr_id,
                    num_sge: wr.sges.len() as i32,
                    sg_list: if wr.sges.is_empty() { ptr::null_mut() } else { sges[at..].as_mut_ptr() },
                    send_flags: wr.flags.bits(),
                    ..Default::default()
                };
                at += wr.sges.len();
                let len: u64 = wr.sges.iter().map(|s| u64::from(s.len)).sum();
                use ffi::ibv_wr_opcode::*;
                let (opcode, counter) = match wr.op {
                    SendOp::Send => (IBV_WR_SEND, &c.send_bytes),
                    SendOp::SendWithImm { imm } => {
                        w.__bindgen_anon_1.imm_data = imm.to_be();
                        (IBV_WR_SEND_WITH_IMM, &c.send_bytes)
                    }
                    SendOp::RdmaWrite { remote_addr, rkey } => {
                        w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                        (IBV_WR_RDMA_WRITE, &c.write_bytes)
                    }
                    SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
                        w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                        w.__bindgen_anon_1.imm_data = imm.to_be();
                        (IBV_WR_RDMA_WRITE_WITH_IMM, &c.write_bytes)
                    }
                    SendOp::RdmaRead { remote_addr, rkey } => {
                        w.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                        (IBV_WR_RDMA_READ, &c.read_bytes)
                    }
                };
                w.opcode = opcode;
                counter.fetch_add(len, Relaxed);
                chain.push(w);
            }
            link(&mut chain, |w, next| w.next = next);
            let Some(f) = c.ops().post_send else {
                let error = VerbsError::Unsupported("driver has no post_send".into());
                return Err(PostError { index: 0, error });
            };
            let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
            // SAFETY: live QP; `chain` is a valid linked list whose SGE array (`sges`) outlives
            // the call. Non-inline SGEs are checked by the HCA against their lkeys; inline ones
            // were checked above against live registrations (the driver copies them now).
            let rc = unsafe { f(self.inner.qp, chain.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                let index = bad_index(&chain, bad);
                c.send_wrs.fetch_add(index as u64, Relaxed);
                return Err(PostError {
                    index,
                    error: VerbsError::Io(io::Error::from_raw_os_error(rc.abs())),
                });
            }
            c.send_wrs.fetch_add(wrs_ok.len() as u64, Relaxed);
        }
        first_err.map_or(Ok(()), Err)
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let q = &self.inner;
        if q._srq.is_some() {
            let error = VerbsError::InvalidArgument("QP uses an SRQ: post to the SRQ".into());
            return Err(PostError { index: 0, error });
        }
        let n = wrs.iter().position(|w| w.sges.len() > q.cap.max_recv_sge as usize).unwrap_or(wrs.len());
        post_recv_chain(&q.pd.ctx, &wrs[..n], |chain, bad| {
            let Some(f) = q.pd.ctx.ops().post_recv else { return -libc::EOPNOTSUPP };
            // SAFETY: live QP; `chain` is a valid linked list whose SGE arrays outlive the call.
            unsafe { f(q.qp, chain, bad) }
        })?;
        if n < wrs.len() {
            let error = VerbsError::TooManySge { given: wrs[n].sges.len(), max: q.cap.max_recv_sge };
            return Err(PostError { index: n, error });
        }
        Ok(())
    }
}

/// Why a GID table entry could not be read.
#[derive(Debug)]
enum GidQuery {
    /// `ENODATA`: the entry exists but holds no GID.
    Empty,
    /// `EINVAL`: the index is past the port's table.
    PastTable,
    /// Anything else.
    Failed(VerbsError),
}

/// What `_ibv_query_gid_ex`'s return value means (ibv_query_gid_ex(3): 0 or an errno value).
fn gid_outcome(rc: i32) -> Result<(), GidQuery> {
    match rc {
        0 => Ok(()),
        libc::ENODATA => Err(GidQuery::Empty),
        libc::EINVAL => Err(GidQuery::PastTable),
        rc => Err(GidQuery::Failed(errno_ret("ibv_query_gid_ex", rc).expect_err("non-zero"))),
    }
}

/// Reads GID table entry `index` of `port`, with its type.
fn query_gid_ex(ctx: *mut ffi::ibv_context, port: u8, index: u32) -> Result<ffi::ibv_gid_entry, GidQuery> {
    // SAFETY: an all-zero entry is a valid value (a union of byte arrays and integers).
    let mut e: ffi::ibv_gid_entry = unsafe { std::mem::zeroed() };
    // SAFETY: live context; `e` is a valid out-pointer of the size passed (the extensible
    // entry point the static inline ibv_query_gid_ex of verbs.h calls the same way).
    let rc = unsafe {
        ffi::_ibv_query_gid_ex(ctx, u32::from(port), index, &mut e, 0, size_of::<ffi::ibv_gid_entry>())
    };
    gid_outcome(rc).map(|()| e)
}

impl HwContext {
    /// Ports are numbered 1..=phys_port_cnt; ibv_query_port(3) only says EINVAL otherwise.
    fn check_port(&self, port: u8) -> VerbsResult<()> {
        let ports = self.inner.attr.phys_port_cnt;
        if port == 0 || port > ports {
            return Err(
                FabricError::NoSuchPort { device: self.inner.device.name.clone(), port, ports }.into()
            );
        }
        Ok(())
    }
}

impl Verbs for HwContext {
    type Pd = HwPd;
    type Mr = HwMr;
    type Channel = HwChannel;
    type Cq = HwCq;
    type Qp = HwQp;
    type Srq = HwSrq;

    fn device(&self) -> &DeviceInfo {
        &self.inner.device
    }

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn port_attr(&self, port: u8) -> VerbsResult<PortAttr> {
        self.check_port(port)?;
        // SAFETY: an all-zero ibv_port_attr is a valid value.
        let mut a: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the exported ibv_query_port fills the leading, compatible part
        // of `ibv_port_attr` (its argument type is the opaque compat struct).
        let rc = unsafe { ffi::ibv_query_port(self.inner.ctx, port, (&raw mut a).cast()) };
        errno_ret("ibv_query_port", rc)?;
        // ibv_query_gid would say -1 (not an errno value) on failure; the _ex form says why,
        // and an empty entry 0 is a zero GID, as ibv_query_gid reports it.
        let gid = match query_gid_ex(self.inner.ctx, port, 0) {
            Ok(e) => {
                // SAFETY: every bit pattern of the union is a valid `raw` array.
                Gid(unsafe { e.gid.raw })
            }
            Err(GidQuery::Empty | GidQuery::PastTable) => Gid::default(),
            Err(GidQuery::Failed(e)) => return Err(e),
        };
        use ffi::ibv_port_state::*;
        let state = match a.state {
            IBV_PORT_DOWN => PortState::Down,
            IBV_PORT_INIT => PortState::Init,
            IBV_PORT_ARMED => PortState::Armed,
            IBV_PORT_ACTIVE => PortState::Active,
            IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            _ => PortState::Nop,
        };
        let link_layer = match u32::from(a.link_layer) {
            ffi::IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
            ffi::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
            _ => LinkLayer::Unspecified,
        };
        Ok(PortAttr {
            state,
            max_mtu: Mtu::from_raw(a.max_mtu).unwrap_or_default(),
            active_mtu: Mtu::from_raw(a.active_mtu).unwrap_or_default(),
            lid: a.lid,
            gid,
            max_msg_sz: a.max_msg_sz,
            link_layer,
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
        })
    }

    fn gid_entry(&self, port: u8, index: u32) -> VerbsResult<GidEntry> {
        self.check_port(port)?;
        let missing = |reason: String| FabricError::NoSuchGid {
            device: self.inner.device.name.clone(),
            port,
            index,
            reason,
        };
        // Checked here so the answer does not depend on the kernel: its ioctl says EINVAL past
        // the table, the sysfs fallback of older kernels EINVAL for any failure.
        let len = self.port_attr(port)?.gid_tbl_len;
        if index >= len {
            return Err(missing(format!("the table has {len} entries")).into());
        }
        let Ok(index8) = u8::try_from(index) else {
            return Err(missing("GID indices of a route are 8 bits".into()).into());
        };
        let e = match query_gid_ex(self.inner.ctx, port, index) {
            Ok(e) => e,
            Err(GidQuery::Empty) => return Err(missing("the entry is empty".into()).into()),
            Err(GidQuery::PastTable) => return Err(missing("past the port's GID table".into()).into()),
            Err(GidQuery::Failed(e)) => return Err(e),
        };
        // enum ibv_gid_type: IB 0, RoCE v1 1, RoCE v2 2.
        let gid_type = match e.gid_type {
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            _ => GidType::Ib,
        };
        // SAFETY: every bit pattern of the union is a valid `raw` array.
        Ok(GidEntry { index: index8, gid: Gid(unsafe { e.gid.raw }), gid_type })
    }

    fn alloc_pd(&self) -> VerbsResult<HwPd> {
        // SAFETY: live context.
        let pd = unsafe { ffi::ibv_alloc_pd(self.inner.ctx) };
        if pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        Ok(HwPd { inner: Arc::new(PdInner { ctx: Arc::clone(&self.inner), pd }) })
    }

    unsafe fn reg_mr(&self, pd: &HwPd, addr: *mut u8, len: usize, access: AccessFlags) -> VerbsResult<HwMr> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument("zero-length registration".into()));
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument("REMOTE_WRITE requires LOCAL_WRITE".into()));
        }
        let t0 = Instant::now();
        // SAFETY: live PD; the caller guarantees `[addr, addr + len)` stays valid until
        // deregistration (this function's contract).
        let mr = unsafe { ffi::ibv_reg_mr(pd.inner.pd, addr.cast(), len, access.bits() as i32) };
        if mr.is_null() {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN) => VerbsError::PinLimit {
                    len: len as u64,
                    reason: format!("ibv_reg_mr: {e} (RLIMIT_MEMLOCK?)"),
                },
                _ => VerbsError::Io(e),
            });
        }
        // SAFETY: `mr` was just returned non-null by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let c = &self.inner;
        c.mrs.write().unwrap_or_else(|p| p.into_inner()).insert(lkey, (addr as u64, len as u64));
        c.registrations.fetch_add(1, Relaxed);
        c.registered_bytes.fetch_add(len as u64, Relaxed);
        c.pinned_bytes.fetch_add(len as u64, Relaxed);
        c.reg_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        Ok(HwMr { pd: Arc::clone(&pd.inner), mr, addr: addr as u64, len, access, lkey, rkey })
    }

    fn create_comp_channel(&self) -> VerbsResult<HwChannel> {
        // SAFETY: live context.
        let ch = unsafe { ffi::ibv_create_comp_channel(self.inner.ctx) };
        if ch.is_null() {
            return Err(os_err("ibv_create_comp_channel"));
        }
        let chan = HwChannel { inner: Arc::new(ChanInner { _ctx: Arc::clone(&self.inner), ch }) };
        let fd = chan.as_raw_fd();
        // SAFETY: fcntl on a descriptor the channel owns; no pointers.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(os_err("fcntl(O_NONBLOCK) on the completion channel"));
        }
        Ok(chan)
    }

    fn create_cq(&self, min_cqe: u32, channel: Option<&HwChannel>, cookie: u64) -> VerbsResult<HwCq> {
        let n = i32::try_from(min_cqe).map_err(|_| VerbsError::InvalidArgument("CQ size".into()))?;
        let ch = channel.map_or(ptr::null_mut(), |c| c.inner.ch);
        // SAFETY: live context and channel; the cookie is stored as an opaque pointer-sized
        // value and never dereferenced.
        let cq = unsafe { ffi::ibv_create_cq(self.inner.ctx, n, cookie as usize as *mut _, ch, 0) };
        if cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        // SAFETY: `cq` is live; `cqe` is the granted size.
        let cap = u32::try_from(unsafe { (*cq).cqe }).unwrap_or(min_cqe);
        Ok(HwCq {
            inner: Arc::new(CqInner {
                ctx: Arc::clone(&self.inner),
                _ch: channel.map(|c| Arc::clone(&c.inner)),
                cq,
                cookie,
                cap,
            }),
        })
    }

    fn create_srq(&self, pd: &HwPd, attr: &SrqAttr) -> VerbsResult<HwSrq> {
        // SAFETY: an all-zero init attr is valid.
        let mut init: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = attr.max_wr;
        init.attr.max_sge = attr.max_sge;
        // SAFETY: live PD, valid attributes.
        let srq = unsafe { ffi::ibv_create_srq(pd.inner.pd, &mut init) };
        if srq.is_null() {
            return Err(os_err("ibv_create_srq"));
        }
        Ok(HwSrq { inner: Arc::new(SrqInner { pd: Arc::clone(&pd.inner), srq, max_sge: attr.max_sge }) })
    }

    fn create_qp(&self, pd: &HwPd, init: &QpInit<'_, Self>) -> VerbsResult<HwQp> {
        // SAFETY: an all-zero init attr is valid.
        let mut a: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        a.send_cq = init.send_cq.inner.cq;
        a.recv_cq = init.recv_cq.inner.cq;
        a.srq = init.srq.map_or(ptr::null_mut(), |s| s.inner.srq);
        a.cap = ffi::ibv_qp_cap {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        a.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        a.sq_sig_all = i32::from(init.sq_sig_all);
        // SAFETY: live PD and CQs (kept alive by the QP below); valid attributes.
        let qp = unsafe { ffi::ibv_create_qp(pd.inner.pd, &mut a) };
        if qp.is_null() {
            return Err(os_err("ibv_create_qp"));
        }
        // ibv_create_qp wrote the granted capacities back into `a.cap`.
        let cap = QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
        Ok(HwQp {
            inner: Arc::new(QpInner {
                pd: Arc::clone(&pd.inner),
                _send_cq: Arc::clone(&init.send_cq.inner),
                _recv_cq: Arc::clone(&init.recv_cq.inner),
                _srq: init.srq.map(|s| Arc::clone(&s.inner)),
                qp,
                cap,
            }),
        })
    }

    fn counters(&self) -> VerbsCounters {
        counters::snapshot(&self.inner)
    }

    fn port_counters(&self, port: u8) -> VerbsResult<PortCounters> {
        self.check_port(port)?;
        Ok(counters::read_port(&counters::port_dir(&self.inner.sysfs, port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_is_a_clear_error() {
        match HwProvider::new().devices() {
            Ok(d) => eprintln!("RDMA devices present: {d:?}"),
            Err(e) => {
                assert!(matches!(e, VerbsError::NoDevice { .. }), "{e}");
                assert!(e.to_string().contains("softib://"), "{e}");
                assert!(HwProvider::new().open(None).is_err());
            }
        }
    }

    /// A failed GID read says why: ibv_query_gid's -1 read as an errno value was EPERM.
    #[test]
    fn gid_query_results_name_the_cause() {
        assert!(gid_outcome(0).is_ok());
        assert!(matches!(gid_outcome(libc::ENODATA), Err(GidQuery::Empty)));
        assert!(matches!(gid_outcome(libc::EINVAL), Err(GidQuery::PastTable)));
        match gid_outcome(libc::EIO) {
            Err(GidQuery::Failed(VerbsError::Io(e))) => {
                assert_eq!(e.kind(), io::Error::from_raw_os_error(libc::EIO).kind());
                assert!(e.to_string().contains("ibv_query_gid_ex"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn links_and_bad_index() {
        let mut v = [ffi::ibv_recv_wr::default(); 3];
        link(&mut v, |w, n| w.next = n);
        let second = &raw mut v[1];
        assert_eq!(v[0].next, second);
        assert!(v[2].next.is_null());
        assert_eq!(bad_index(&v, &raw const v[2]), 2);
        assert_eq!(bad_index(&v, ptr::null()), 0);
    }
}

//! Software verbs provider (`softib://`).
//!
//! Runs the verbs model on any Linux host, within one process and across processes, so the IB
//! engine can be tested and benchmarked where no HCA exists. It follows verbs semantics closely
//! enough that the engine cannot tell it from hardware:
//!
//! - **One-sided operations** (RDMA_WRITE, RDMA_READ) are performed by the *initiator* with
//!   `process_vm_writev` / `process_vm_readv` — one copy, no CPU on the target — after checking
//!   the rkey, range, access rights, protection domain and liveness of the target's registration
//!   in the target's MR table, which lives in shared memory. Keys carry a generation, so a
//!   deregistered or re-registered MR is never used through a stale key, and deregistration
//!   waits for in-flight accesses (an epoch handshake per attached QP, in the private `shm` module).
//! - **SEND** consumes a receive the target posted to a ring in its shared image; without one
//!   the initiator retries per `rnr_retry` after the target's `min_rnr_timer`, then fails the
//!   work request with `RnrRetryExcErr` and moves its QP to ERR (every outstanding work request
//!   then flushes exactly once). A receive that is too small gives `LocLenErr` at the target and
//!   `RemInvReqErr` at the initiator, and both QPs go to ERR.
//! - **Completions** land in the target's CQ ring; the target is woken (its completion channel's
//!   eventfd is signalled) only when it armed the CQ.
//! - **Connection bring-up** uses exactly the QPN, PSN, LID and GID a real HCA needs; the GID
//!   names the target context (pid, memfd, random token) and PSNs are checked. Ports
//!   ([`SoftPort`]) present InfiniBand or Ethernet (RoCE: no LID, a GRH required) with a GID
//!   table and an active MTU, and refuse the routes an HCA refuses.
//! - **Registration pins memory** as `ibv_reg_mr` does, with a long-term page pin
//!   (`pin_user_pages(FOLL_LONGTERM)`, reached through an io_uring fixed-buffer slot and
//!   counted in `VmPin`), or with `mlock` (reference-counted per page, counted in `VmLck`) where
//!   io_uring is unavailable or refuses the memory; see [`PinMethod`]. Either way its cost is
//!   real. Failures caused by `RLIMIT_MEMLOCK` (or the configured pin budget) are
//!   [`VerbsError::PinLimit`].
//! - **Peer death** is detected with a pidfd: work requests to a dead peer fail with
//!   `RetryExcErr` instead of hanging.
//! - **Faults** can be injected per context or per QP ([`FaultPlan`]).
//!
//! # Processes and permissions
//!
//! A context's image is a sealed memfd (nothing to clean up in `/dev/shm`, even after
//! `SIGKILL`); peers duplicate it and the channels' eventfds with `pidfd_getfd`. Both that and
//! `process_vm_*` need ptrace access to the peer: same user, and the context calls
//! `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)` so Yama's `ptrace_scope = 1` does not get in the
//! way — which also means any process of the same user may inspect a process that opened a
//! software device. It is a test and benchmark provider.
//!
//! # Work processing
//!
//! `post_send` processes work requests synchronously in the caller's thread while nothing
//! blocks the send queue. Work that must wait (an RNR or transport retry, a delayed RDMA_READ,
//! a FENCE behind one) is finished by a per-context progress thread, like an HCA would, so
//! completions arrive whether or not the application polls.
//!
//! # Notes for engines
//!
//! - Limits come from [`SoftConfig`]; defaults: 16 SGEs, 256 B inline, 4096 work requests per
//!   queue, 65536 CQ entries, 16384 MRs, 256 QPs, 16 SRQs. A CQ that overflows is unusable
//!   ([`VerbsError::CqOverrun`]): size CQs for every work request that can be outstanding.
//! - Send-queue slots are freed when a work request completes (not when its completion is
//!   polled, as on hardware); count-based reclaim on polled completions is correct for both.
//! - One-sided cost is dominated by the kernel pinning target pages per call: registered pools
//!   on transparent huge pages (2 MiB-aligned, `MADV_HUGEPAGE`) move data 3× faster.
//! - The completion channel is an eventfd: readable while any event is pending; drain it with
//!   `get_event` until `None` (mio is edge-triggered).
//! - Pinning refusals (`RLIMIT_MEMLOCK` without `CAP_IPC_LOCK`) and the optional
//!   [`SoftConfig::max_pinned_bytes`] budget are [`VerbsError::PinLimit`]; pages shared by
//!   overlapping registrations stay pinned until the last one goes.
//! - [`VerbsCounters::device_ns`] is the time this process's threads spent doing the device's
//!   work (executing work requests), so host CPU can be told from emulated-HCA CPU.
//! - Faults for tests: [`SoftConfig::faults`] (every QP) or [`SoftContext::set_qp_faults`] by
//!   QP number, so a test can break a QP the engine created.
//! - A software GID names a process and context, not a host: peers must run on the same host
//!   (same user, or root).
#![deny(clippy::undocumented_unsafe_blocks)]

mod fault;
mod peer;
mod pin;
mod port;
mod qp;
mod ring;
mod shm;
mod sys;
mod uring;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

pub use fault::{FaultPlan, SoftHook};
use peer::{Peer, SoftGid, lid_for};
pub use port::SoftPort;
use qp::QpInner;
pub use qp::SoftQp;
use ring::{CqRing, RecvRing, recv_ring_bytes};
use shm::{CQE_WORDS, Caps, Shm};

use crate::ib::verbs::*;

/// Configuration of the software provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftConfig {
    /// Faults every new QP starts with (default: none).
    pub faults: FaultPlan,
    /// Pin budget in bytes per context, on top of the kernel's `RLIMIT_MEMLOCK` (default:
    /// none). Lets tests exercise [`VerbsError::PinLimit`] handling deterministically.
    pub max_pinned_bytes: Option<u64>,
    /// MR table size (≤ 65536).
    pub max_mr: u32,
    /// QP table size (≤ 1024).
    pub max_qp: u32,
    /// CQ table size.
    pub max_cq: u32,
    /// SRQ table size.
    pub max_srq: u32,
    /// Largest work queue.
    pub max_qp_wr: u32,
    /// Largest CQ.
    pub max_cqe: u32,
    /// Scatter/gather entries per work request (≤ 64).
    pub max_sge: u32,
    /// Largest inline send.
    pub max_inline_data: u32,
    /// Bytes of shared memory for rings (virtual; pages are used as rings are touched).
    pub arena_bytes: u64,
    /// How registrations pin memory (default: [`PinMethod::Auto`], or `IONET_SOFTIB_PIN` =
    /// `auto` | `io_uring` | `mlock`).
    pub pin: PinMethod,
    /// The device's ports, numbered from 1 (default: one port, [`SoftPort::from_env`]).
    pub ports: Vec<SoftPort>,
}

/// How the software provider pins registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PinMethod {
    /// [`PinMethod::IoUring`] where the kernel allows it, else [`PinMethod::Mlock`].
    #[default]
    Auto,
    /// A long-term pin per registration, as `ibv_reg_mr` takes (`pin_user_pages` with
    /// `FOLL_LONGTERM`, through an io_uring fixed-buffer slot): pins nest, pages show in
    /// `VmPin`, shared writable mappings of disk files are refused (then `mlock` is used).
    IoUring,
    /// `mlock`, counted per page so overlapping registrations do not unlock each other;
    /// pages show in `VmLck`. Six times dearer per page here: `mlock` moves every page to the
    /// unevictable LRU and back.
    Mlock,
}

impl PinMethod {
    /// Parses `auto`, `io_uring` or `mlock`.
    pub fn parse(s: &str) -> Option<PinMethod> {
        match s {
            "auto" => Some(PinMethod::Auto),
            "io_uring" | "uring" => Some(PinMethod::IoUring),
            "mlock" => Some(PinMethod::Mlock),
            _ => None,
        }
    }

    /// The method named by `IONET_SOFTIB_PIN`, else `Auto`; an unknown name is logged.
    pub fn from_env() -> PinMethod {
        match std::env::var("IONET_SOFTIB_PIN") {
            Ok(v) => PinMethod::parse(&v).unwrap_or_else(|| {
                tracing::warn!(value = %v, "IONET_SOFTIB_PIN: expected auto, io_uring or mlock");
                PinMethod::Auto
            }),
            Err(_) => PinMethod::Auto,
        }
    }

    /// What `Auto` means in this process (probed once), or the method itself.
    pub fn resolved(self) -> PinMethod {
        pin::resolve(self)
    }

    /// Its name, as `IONET_SOFTIB_PIN` spells it.
    pub fn name(self) -> &'static str {
        match self {
            PinMethod::Auto => "auto",
            PinMethod::IoUring => "io_uring",
            PinMethod::Mlock => "mlock",
        }
    }
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            faults: FaultPlan::none(),
            max_pinned_bytes: None,
            max_mr: 16384,
            max_qp: 256,
            max_cq: 64,
            max_srq: 16,
            max_qp_wr: 4096,
            max_cqe: 65536,
            max_sge: 16,
            max_inline_data: 256,
            arena_bytes: 256 << 20,
            pin: PinMethod::from_env(),
            ports: vec![SoftPort::from_env()],
        }
    }
}

/// The software provider: one device, `softib0`.
#[derive(Debug, Clone, Default)]
pub struct SoftProvider {
    cfg: SoftConfig,
}

impl SoftProvider {
    /// A provider whose contexts use `cfg`.
    pub fn new(cfg: SoftConfig) -> Self {
        SoftProvider { cfg }
    }
}

/// Name of the software device.
pub const DEVICE_NAME: &str = "softib0";

impl Provider for SoftProvider {
    type Context = SoftContext;

    fn scheme(&self) -> &'static str {
        "softib"
    }

    fn devices(&self) -> VerbsResult<Vec<DeviceInfo>> {
        Ok(vec![DeviceInfo { name: DEVICE_NAME.into(), guid: 0 }])
    }

    fn open(&self, device: Option<&str>) -> VerbsResult<SoftContext> {
        match device {
            None | Some(DEVICE_NAME) => SoftContext::open(self.cfg.clone()),
            Some(other) => {
                Err(FabricError::NoSuchDevice { name: other.into(), available: vec![DEVICE_NAME.into()] }
                    .into())
            }
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    registered_bytes: AtomicU64,
    pinned_bytes: AtomicU64,
    reg_ns: AtomicU64,
    dereg_ns: AtomicU64,
    device_ns: AtomicU64,
    send_wrs_posted: AtomicU64,
    recv_wrs_posted: AtomicU64,
    completions: AtomicU64,
    rdma_write_bytes: AtomicU64,
    rdma_read_bytes: AtomicU64,
    send_bytes: AtomicU64,
    rnr_retries: AtomicU64,
    transport_retries: AtomicU64,
}

/// Owner-side bookkeeping of table slots and the ring arena.
#[derive(Debug)]
struct Alloc {
    mr_free: VecDeque<u32>,
    mr_gen: Vec<u32>,
    qp_free: VecDeque<u32>,
    qp_gen: Vec<u32>,
    cq_free: VecDeque<u32>,
    srq_free: VecDeque<u32>,
    /// Free arena ranges (offset → length), coalesced.
    arena: std::collections::BTreeMap<u64, u64>,
    next_pd: u32,
}

impl Alloc {
    fn arena_alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.next_multiple_of(64);
        let (&off, &have) = self.arena.iter().find(|(_, l)| **l >= len)?;
        self.arena.remove(&off);
        if have > len {
            self.arena.insert(off + len, have - len);
        }
        Some(off)
    }

    fn arena_free(&mut self, off: u64, len: u64) {
        let mut len = len.next_multiple_of(64);
        let mut off = off;
        if let Some((&p, &pl)) = self.arena.range(..off).next_back()
            && p + pl == off
        {
            self.arena.remove(&p);
            off = p;
            len += pl;
        }
        if let Some(&nl) = self.arena.get(&(off + len)) {
            self.arena.remove(&(off + len));
            len += nl;
        }
        self.arena.insert(off, len);
    }
}

/// Timed work for QPs (RNR retries, delayed reads), run on one thread per context.
#[derive(Debug, Default)]
struct Scheduler {
    state: Mutex<SchedState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct SchedState {
    items: Vec<(Instant, Weak<QpInner>)>,
    shutdown: bool,
    thread: Option<JoinHandle<()>>,
}

impl Scheduler {
    fn schedule(self: &Arc<Self>, at: Instant, qp: Weak<QpInner>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.items.push((at, qp));
        if st.thread.is_none() && !st.shutdown {
            let me = Arc::clone(self);
            match std::thread::Builder::new().name("softib-progress".into()).spawn(move || me.run()) {
                Ok(h) => st.thread = Some(h),
                Err(err) => tracing::error!(%err, "cannot start the softib progress thread"),
            }
        }
        drop(st);
        self.cv.notify_one();
    }

    fn run(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if st.shutdown {
                return;
            }
            let now = Instant::now();
            let next = st.items.iter().enumerate().min_by_key(|(_, (t, _))| *t).map(|(i, (t, _))| (i, *t));
            match next {
                None => st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some((_, t)) if t > now => {
                    st = self.cv.wait_timeout(st, t - now).unwrap_or_else(|p| p.into_inner()).0;
                }
                Some((i, _)) => {
                    let (_, weak) = st.items.swap_remove(i);
                    drop(st);
                    if let Some(qp) = weak.upgrade() {
                        qp.progress();
                    }
                    st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                }
            }
        }
    }

    fn shutdown(&self) {
        let handle = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.shutdown = true;
            st.items.clear();
            st.thread.take()
        };
        self.cv.notify_all();
        if let Some(h) = handle {
            // The last reference to a context can be dropped on the progress thread itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

struct CtxInner {
    shm: Shm,
    /// Kept open: its descriptor number is part of our GID (peers `pidfd_getfd` it).
    _memfd: File,
    pid: u32,
    start_time: u64,
    token: u32,
    lid: u16,
    gid: Gid,
    cfg: SoftConfig,
    device: DeviceInfo,
    attr: DeviceAttr,
    counters: Counters,
    alloc: Mutex<Alloc>,
    peers: Mutex<HashMap<Gid, Arc<Peer>>>,
    qps: Mutex<HashMap<u32, Weak<QpInner>>>,
    sched: Arc<Scheduler>,
}

impl fmt::Debug for CtxInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftContext").field("pid", &self.pid).field("gid", &self.gid).finish()
    }
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        self.sched.shutdown();
    }
}

impl CtxInner {
    /// The attached peer a GID names (cached; re-attached if the cached one died).
    fn peer(&self, gid: &Gid) -> Result<Arc<Peer>, String> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = peers.get(gid) {
            if p.alive_now() {
                return Ok(Arc::clone(p));
            }
            peers.remove(gid);
        }
        let p = Arc::new(Peer::attach(gid)?);
        peers.insert(*gid, Arc::clone(&p));
        Ok(p)
    }

    fn bump(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    fn ports(&self) -> port::Ports<'_> {
        port::Ports { device: &self.device.name, ports: &self.cfg.ports, gid: self.gid, lid: self.lid }
    }
}

static NEXT_CTX: AtomicU32 = AtomicU32::new(0);

/// A random 32-bit token: names must not collide across processes and contexts.
fn random_token() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(sys::getpid());
    h.write_u32(NEXT_CTX.fetch_add(1, Relaxed));
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() as u32).max(1)
}

/// An open software device.
#[derive(Debug, Clone)]
pub struct SoftContext {
    inner: Arc<CtxInner>,
}

impl SoftContext {
    /// Opens a software device context.
    ///
    /// # Errors
    /// Invalid configuration, or the OS refused the shared memory.
    pub fn open(cfg: SoftConfig) -> VerbsResult<SoftContext> {
        if cfg.max_qp == 0 || cfg.max_qp > 1024 || cfg.max_mr == 0 || cfg.max_mr > 65536 || cfg.max_sge > 64 {
            return Err(VerbsError::InvalidArgument(
                "softib: max_qp must be 1..=1024, max_mr 1..=65536, max_sge <= 64".into(),
            ));
        }
        if cfg.ports.is_empty() || cfg.ports.len() > 255 || cfg.ports.iter().any(|p| p.gid_types.len() > 256)
        {
            return Err(VerbsError::InvalidArgument(
                "softib: 1..=255 ports, each with at most 256 GID table entries".into(),
            ));
        }
        sys::allow_ptrace_by_any();
        let pid = sys::getpid();
        let start_time = sys::process_start_time(pid)?;
        let token = random_token();
        let caps = Caps {
            mr: u64::from(cfg.max_mr),
            // Each QP takes one slot here and one in its peer's image: room for every local QP
            // and as many remote ones.
            attach: u64::from(cfg.max_qp).max(256) * 4,
            qp: u64::from(cfg.max_qp),
            cq: u64::from(cfg.max_cq),
            srq: u64::from(cfg.max_srq),
            arena: cfg.arena_bytes,
        };
        let (shm, memfd) = Shm::create(caps, &format!("ionet-softib-{pid}-{token:08x}"))?;
        let lid = lid_for(token);
        let fd = u32::try_from(memfd.as_raw_fd()).map_err(|_| VerbsError::InvalidArgument("fd".into()))?;
        let gid = SoftGid { pid, fd, token }.to_gid();
        let h = shm.header();
        h.pid.store(u64::from(pid), Relaxed);
        h.token.store(u64::from(token), Relaxed);
        h.start_time.store(start_time, Relaxed);
        h.lid.store(u64::from(lid), Relaxed);
        h.file_len.store(shm.layout.total, Relaxed);
        h.mr_cap.store(caps.mr, Relaxed);
        h.attach_cap.store(caps.attach, Relaxed);
        h.qp_cap.store(caps.qp, Relaxed);
        h.cq_cap.store(caps.cq, Relaxed);
        h.srq_cap.store(caps.srq, Relaxed);
        h.arena_len.store(caps.arena, Relaxed);
        h.version.store(shm::VERSION, Relaxed);
        h.magic.store(shm::MAGIC, Release);
        let attr = DeviceAttr {
            max_mr_size: 1 << 40,
            max_qp: cfg.max_qp,
            max_qp_wr: cfg.max_qp_wr,
            max_sge: cfg.max_sge,
            max_cq: cfg.max_cq,
            max_cqe: cfg.max_cqe,
            max_mr: cfg.max_mr,
            max_pd: 1 << 20,
            max_qp_rd_atom: 16,
            max_srq: cfg.max_srq,
            max_srq_wr: cfg.max_qp_wr,
            max_srq_sge: cfg.max_sge,
            max_inline_data: cfg.max_inline_data,
            phys_port_cnt: cfg.ports.len() as u8,
            cpu_moves_data: true,
        };
        let mut arena = std::collections::BTreeMap::new();
        arena.insert(0, caps.arena);
        let alloc = Alloc {
            mr_free: (0..cfg.max_mr).collect(),
            mr_gen: vec![0; cfg.max_mr as usize],
            qp_free: (0..cfg.max_qp).collect(),
            qp_gen: vec![0; cfg.max_qp as usize],
            cq_free: (0..cfg.max_cq).collect(),
            srq_free: (0..cfg.max_srq).collect(),
            arena,
            next_pd: 1,
        };
        tracing::debug!(pid, token, lid, %gid, "softib context opened");
        Ok(SoftContext {
            inner: Arc::new(CtxInner {
                shm,
                _memfd: memfd,
                pid,
                start_time,
                token,
                lid,
                gid,
                device: DeviceInfo { name: DEVICE_NAME.into(), guid: u64::from(token) },
                attr,
                cfg,
                counters: Counters::default(),
                alloc: Mutex::new(alloc),
                peers: Mutex::new(HashMap::new()),
                qps: Mutex::new(HashMap::new()),
                sched: Arc::new(Scheduler::default()),
            }),
        })
    }

    /// This context's GID (what peers put in their RTR attributes).
    pub fn gid(&self) -> Gid {
        self.inner.gid
    }

    /// Replaces the fault plan of the QP with number `qpn` (created by this context).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] when no such QP exists.
    pub fn set_qp_faults(&self, qpn: u32, plan: FaultPlan) -> VerbsResult<()> {
        let qp = self.inner.qps.lock().unwrap_or_else(|p| p.into_inner()).get(&qpn).and_then(Weak::upgrade);
        match qp {
            Some(qp) => {
                qp.set_faults(plan);
                Ok(())
            }
            None => Err(VerbsError::InvalidArgument(format!("no QP {qpn}"))),
        }
    }

    /// Numbers of this context's live QPs, ascending.
    pub fn qp_nums(&self) -> Vec<u32> {
        let qps = self.inner.qps.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<u32> = qps.iter().filter(|(_, w)| w.strong_count() > 0).map(|(n, _)| *n).collect();
        v.sort_unstable();
        v
    }

    /// Bytes this context currently has pinned.
    pub fn pinned_bytes(&self) -> u64 {
        self.inner.counters.pinned_bytes.load(Relaxed)
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct SoftPd {
    ctx: Arc<CtxInner>,
    id: u32,
}

/// A registration of the software provider.
#[derive(Debug)]
pub struct SoftMr {
    ctx: Arc<CtxInner>,
    idx: u32,
    generation: u32,
    key: u32,
    addr: u64,
    len: usize,
    access: AccessFlags,
    /// The pages it holds; taken at deregistration (`None`: no longer live).
    pinned: Option<pin::Pinned>,
}

/// `state` word of an MR entry.
fn mr_state(generation: u32, alive: bool, access: AccessFlags, pd: u32) -> u64 {
    u64::from(generation) << 32
        | u64::from(alive) << 31
        | u64::from(access.bits()) << 24
        | u64::from(pd & 0xff_ffff)
}

/// Checks `[addr, addr + len)` against the MR that `key` names in `shm`: alive, same
/// generation, rights ⊇ `need`, same PD, in bounds. Must be called inside a critical section
/// (see [`shm`]) for the answer to stay true while the memory is accessed.
fn check_mr(shm: &Shm, key: u32, addr: u64, len: u64, need: AccessFlags, pd: u64) -> bool {
    let Some(e) = shm.mr(u64::from(key >> 16)) else { return false };
    let st = e.state.load(SeqCst);
    let alive = st >> 31 & 1 == 1;
    let gen_ok = (st >> 32) & 0xffff == u64::from(key & 0xffff);
    let rights = AccessFlags::from_bits(((st >> 24) & 7) as u32).unwrap_or(AccessFlags::NONE);
    if !alive || !gen_ok || !rights.contains(need) || st & 0xff_ffff != pd {
        return false;
    }
    let (a, l) = (e.addr.load(Acquire), e.len.load(Acquire));
    match (addr.checked_add(len), a.checked_add(l)) {
        (Some(end), Some(mend)) => addr >= a && end <= mend,
        _ => false,
    }
}

impl SoftMr {
    fn release(&mut self) {
        let Some(pinned) = self.pinned.take() else { return };
        let t0 = Instant::now();
        let ctx = &self.ctx;
        if let Some(e) = ctx.shm.mr(u64::from(self.idx)) {
            e.state.store(mr_state(self.generation, false, AccessFlags::NONE, 0), SeqCst);
        }
        // Nobody may be inside an access validated against the old state when we unpin.
        ctx.shm.synchronize();
        pin::release(pinned);
        ctx.alloc.lock().unwrap_or_else(|p| p.into_inner()).mr_free.push_back(self.idx);
        let c = &ctx.counters;
        c.pinned_bytes.fetch_sub(self.len as u64, Relaxed);
        c.deregistrations.fetch_add(1, Relaxed);
        c.dereg_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        tracing::trace!(key = self.key, len = self.len, "deregistered");
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.release();
    }
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
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
        self.release();
        Ok(())
    }
}

/// A completion channel: an eventfd signalled (by whichever process produced the completion)
/// when an armed CQ bound to it receives one.
pub struct SoftChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    ctx: Arc<CtxInner>,
    efd: OwnedFd,
    cqs: Mutex<Vec<(u64, u64)>>,
    pending: Mutex<Events>,
}

/// Events collected from the doorbell but not yet returned.
#[derive(Default)]
struct Events {
    cookies: VecDeque<u64>,
    /// The doorbell was reset since the last `None`: the caller's drain loop can end without
    /// reading it again (a ring after the reset leaves it readable, so the next wait sees it).
    swept: bool,
}

impl fmt::Debug for SoftChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftChannel").field("fd", &self.inner.efd.as_raw_fd()).finish()
    }
}

impl AsRawFd for SoftChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.efd.as_raw_fd()
    }
}

impl AsFd for SoftChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.efd.as_fd()
    }
}

impl CompletionChannel for SoftChannel {
    fn get_event(&self) -> VerbsResult<Option<u64>> {
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = pending.cookies.pop_front() {
            return Ok(Some(c));
        }
        if std::mem::take(&mut pending.swept) {
            // End of a drain loop: save the read(2) that would only say EAGAIN.
            return Ok(None);
        }
        // Reset the doorbell first, then collect: a producer sets `fired` before ringing, so a
        // ring we consume here belongs to a flag we are about to see.
        if !sys::eventfd_drain(self.inner.efd.as_raw_fd())? {
            return Ok(None);
        }
        for &(idx, cookie) in self.inner.cqs.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Some(e) = self.inner.ctx.shm.cq(idx)
                && e.fired.swap(0, SeqCst) != 0
            {
                pending.cookies.push_back(cookie);
            }
        }
        pending.swept = true;
        Ok(pending.cookies.pop_front())
    }
}

/// A completion queue: a ring in the context image.
pub struct SoftCq {
    inner: Arc<CqInner>,
}

struct CqInner {
    ctx: Arc<CtxInner>,
    idx: u64,
    cap: u32,
    ring_off: u64,
    cookie: u64,
    channel: Option<Arc<ChannelInner>>,
    poll_lock: Mutex<()>,
}

impl fmt::Debug for SoftCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftCq").field("idx", &self.inner.idx).field("cap", &self.inner.cap).finish()
    }
}

impl CqInner {
    fn ring(&self) -> Option<CqRing<'_>> {
        CqRing::owned(&self.ctx.shm, self.idx, self.ring_off, u64::from(self.cap))
    }

    /// Adds a completion produced locally (our own send queue or flushes).
    fn push_local(&self, wc: &WorkCompletion) {
        let r = match self.ring() {
            Some(r) => r.push(wc, false),
            None => ring::Pushed::Gone,
        };
        match r {
            ring::Pushed::Wake(_) => {
                if let Some(ch) = &self.channel
                    && let Err(err) = sys::eventfd_signal(ch.efd.as_raw_fd())
                {
                    tracing::debug!(%err, "channel wake failed");
                }
            }
            ring::Pushed::Overrun => tracing::warn!(cq = self.idx, "CQ overrun: completion lost"),
            ring::Pushed::Gone | ring::Pushed::Stored => {}
        }
    }
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if let Some(e) = self.ctx.shm.cq(self.idx) {
            e.life.fetch_and(!1, SeqCst);
        }
        if let Some(ch) = &self.channel {
            ch.cqs.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != self.idx);
        }
        self.ctx.shm.synchronize();
        let mut a = self.ctx.alloc.lock().unwrap_or_else(|p| p.into_inner());
        a.arena_free(self.ring_off, u64::from(self.cap) * CQE_WORDS * 8);
        a.cq_free.push_back(self.idx as u32);
    }
}

impl CompletionQueue for SoftCq {
    fn capacity(&self) -> u32 {
        self.inner.cap
    }

    fn cookie(&self) -> u64 {
        self.inner.cookie
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> VerbsResult<usize> {
        let _g = self.inner.poll_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Explicit branches: an eagerly built error would be constructed and dropped on every
        // (hot, spin-polled) call.
        let Some(ring) = self.inner.ring() else { return Err(VerbsError::CqOverrun) };
        let Some(n) = ring.poll(out) else { return Err(VerbsError::CqOverrun) };
        if n > 0 {
            self.inner.ctx.bump(&self.inner.ctx.counters.completions, n as u64);
        }
        Ok(n)
    }

    fn req_notify(&self, solicited_only: bool) -> VerbsResult<()> {
        if self.inner.channel.is_none() {
            return Err(VerbsError::InvalidArgument("req_notify on a CQ without a channel".into()));
        }
        self.inner.ring().ok_or(VerbsError::CqOverrun)?.arm(solicited_only);
        Ok(())
    }
}

/// A shared receive queue: a receive ring any of its QPs' peers consume from.
#[derive(Debug)]
pub struct SoftSrq {
    inner: Arc<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    ctx: Arc<CtxInner>,
    idx: u64,
    ring_off: u64,
    ring_bytes: u64,
    max_sge: u32,
    post_lock: Mutex<()>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if let Some(e) = self.ctx.shm.srq(self.idx) {
            e.life.fetch_and(!1, SeqCst);
        }
        self.ctx.shm.synchronize();
        let mut a = self.ctx.alloc.lock().unwrap_or_else(|p| p.into_inner());
        a.arena_free(self.ring_off, self.ring_bytes);
        a.srq_free.push_back(self.idx as u32);
    }
}

impl SharedReceiveQueue for SoftSrq {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let s = &self.inner;
        let _g = s.post_lock.lock().unwrap_or_else(|p| p.into_inner());
        let ring = RecvRing::open(&s.ctx.shm, s.ring_off)
            .ok_or(PostError { index: 0, error: VerbsError::InvalidArgument("SRQ ring is gone".into()) })?;
        for (index, wr) in wrs.iter().enumerate() {
            if wr.sges.len() > s.max_sge as usize {
                let error = VerbsError::TooManySge { given: wr.sges.len(), max: s.max_sge };
                return Err(PostError { index, error });
            }
            if !ring.push(wr.wr_id, wr.sges) {
                let error = VerbsError::QueueFull { queue: "SRQ", capacity: ring.cap() as u32 };
                return Err(PostError { index, error });
            }
            s.ctx.bump(&s.ctx.counters.recv_wrs_posted, 1);
        }
        Ok(())
    }
}

impl Verbs for SoftContext {
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Channel = SoftChannel;
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Srq = SoftSrq;

    fn device(&self) -> &DeviceInfo {
        &self.inner.device
    }

    fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    fn port_attr(&self, port: u8) -> VerbsResult<PortAttr> {
        self.inner.ports().attr(port)
    }

    fn gid_entry(&self, port: u8, index: u32) -> VerbsResult<GidEntry> {
        self.inner.ports().gid_entry(port, index)
    }

    fn alloc_pd(&self) -> VerbsResult<SoftPd> {
        let mut a = self.inner.alloc.lock().unwrap_or_else(|p| p.into_inner());
        let id = a.next_pd;
        if id > 0xff_ffff {
            return Err(VerbsError::Exhausted("protection domains".into()));
        }
        a.next_pd += 1;
        Ok(SoftPd { ctx: Arc::clone(&self.inner), id })
    }

    unsafe fn reg_mr(
        &self,
        pd: &SoftPd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> VerbsResult<SoftMr> {
        let t0 = Instant::now();
        let ctx = &self.inner;
        if !Arc::ptr_eq(&pd.ctx, ctx) {
            return Err(VerbsError::InvalidArgument("PD of another context".into()));
        }
        if len == 0 || (addr as u64).checked_add(len as u64).is_none() {
            return Err(VerbsError::InvalidArgument(format!("bad registration range {addr:p}+{len}")));
        }
        if access.contains(AccessFlags::REMOTE_WRITE) && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument("REMOTE_WRITE requires LOCAL_WRITE".into()));
        }
        if len as u64 > ctx.attr.max_mr_size {
            return Err(VerbsError::InvalidArgument(format!("{len} bytes exceeds max_mr_size")));
        }
        let pinned = ctx.counters.pinned_bytes.load(Relaxed);
        if let Some(max) = ctx.cfg.max_pinned_bytes
            && pinned + len as u64 > max
        {
            return Err(VerbsError::PinLimit {
                len: len as u64,
                reason: format!("softib pin budget: {pinned} of {max} bytes already pinned"),
            });
        }
        let pinned = match pin::pin_range(addr as u64, len as u64, ctx.cfg.pin) {
            Ok(p) => p,
            Err(e) => {
                return Err(match e.raw_os_error() {
                    Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN) => VerbsError::PinLimit {
                        len: len as u64,
                        reason: format!(
                            "mlock: {e} (RLIMIT_MEMLOCK {})",
                            sys::memlock_limit().map_or("unlimited".to_string(), |l| format!("{l} bytes"))
                        ),
                    },
                    _ => VerbsError::Io(e),
                });
            }
        };
        let slot = {
            let mut a = ctx.alloc.lock().unwrap_or_else(|p| p.into_inner());
            a.mr_free.pop_front().map(|idx| {
                let g = &mut a.mr_gen[idx as usize];
                *g = g.wrapping_add(1);
                if *g & 0xffff == 0 {
                    *g = g.wrapping_add(1);
                }
                (idx, *g)
            })
        };
        let Some((idx, generation)) = slot else {
            pin::release(pinned);
            return Err(VerbsError::Exhausted(format!("MR table ({} entries)", ctx.attr.max_mr)));
        };
        let Some(e) = ctx.shm.mr(u64::from(idx)) else {
            pin::release(pinned);
            ctx.alloc.lock().unwrap_or_else(|p| p.into_inner()).mr_free.push_back(idx);
            return Err(VerbsError::Exhausted("MR table".into()));
        };
        e.addr.store(addr as u64, Relaxed);
        e.len.store(len as u64, Relaxed);
        e.state.store(mr_state(generation, true, access, pd.id), SeqCst);
        let key = idx << 16 | (generation & 0xffff);
        let c = &ctx.counters;
        c.registrations.fetch_add(1, Relaxed);
        c.registered_bytes.fetch_add(len as u64, Relaxed);
        c.pinned_bytes.fetch_add(len as u64, Relaxed);
        c.reg_ns.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
        tracing::trace!(key, len, ?access, "registered");
        Ok(SoftMr {
            ctx: Arc::clone(ctx),
            idx,
            generation,
            key,
            addr: addr as u64,
            len,
            access,
            pinned: Some(pinned),
        })
    }

    fn create_comp_channel(&self) -> VerbsResult<SoftChannel> {
        Ok(SoftChannel {
            inner: Arc::new(ChannelInner {
                ctx: Arc::clone(&self.inner),
                efd: sys::eventfd()?,
                cqs: Mutex::new(Vec::new()),
                pending: Mutex::new(Events::default()),
            }),
        })
    }

    fn create_cq(&self, min_cqe: u32, channel: Option<&SoftChannel>, cookie: u64) -> VerbsResult<SoftCq> {
        let ctx = &self.inner;
        if min_cqe == 0 || min_cqe > ctx.attr.max_cqe {
            return Err(VerbsError::InvalidArgument(format!("CQ size {min_cqe} (max {})", ctx.attr.max_cqe)));
        }
        if let Some(ch) = channel
            && !Arc::ptr_eq(&ch.inner.ctx, ctx)
        {
            return Err(VerbsError::InvalidArgument("channel of another context".into()));
        }
        let cap = min_cqe.next_power_of_two();
        let bytes = u64::from(cap) * CQE_WORDS * 8;
        let (idx, ring_off) = {
            let mut a = ctx.alloc.lock().unwrap_or_else(|p| p.into_inner());
            let idx = a.cq_free.pop_front().ok_or_else(|| VerbsError::Exhausted("CQ table".into()))?;
            match a.arena_alloc(bytes) {
                Some(off) => (u64::from(idx), off),
                None => {
                    a.cq_free.push_front(idx);
                    return Err(VerbsError::Exhausted("softib arena (raise SoftConfig::arena_bytes)".into()));
                }
            }
        };
        let e = ctx.shm.cq(idx).ok_or_else(|| VerbsError::Exhausted("CQ table".into()))?;
        for w in [&e.lock, &e.head, &e.tail, &e.armed, &e.fired, &e.overrun] {
            w.store(0, Relaxed);
        }
        e.cap.store(u64::from(cap), Relaxed);
        e.ring_off.store(ring_off, Relaxed);
        e.channel_fd.store(channel.map_or(u64::MAX, |c| c.as_raw_fd() as u64), Relaxed);
        // Allocated up front like an HCA's CQ buffer, not a page at a time by peers' pushes.
        if let Some(off) = ctx.shm.arena(ring_off, bytes) {
            ctx.shm.prefault(off, bytes);
        }
        let generation = e.life.load(Relaxed) >> 1;
        e.life.store((generation + 1) << 1 | 1, SeqCst);
        if let Some(ch) = channel {
            ch.inner.cqs.lock().unwrap_or_else(|p| p.into_inner()).push((idx, cookie));
        }
        Ok(SoftCq {
            inner: Arc::new(CqInner {
                ctx: Arc::clone(ctx),
                idx,
                cap,
                ring_off,
                cookie,
                channel: channel.map(|c| Arc::clone(&c.inner)),
                poll_lock: Mutex::new(()),
            }),
        })
    }

    fn create_srq(&self, pd: &SoftPd, attr: &SrqAttr) -> VerbsResult<SoftSrq> {
        let ctx = &self.inner;
        if attr.max_wr == 0 || attr.max_wr > ctx.attr.max_srq_wr || attr.max_sge > ctx.attr.max_srq_sge {
            return Err(VerbsError::InvalidArgument(format!("SRQ sizes {attr:?} exceed the device limits")));
        }
        let cap = u64::from(attr.max_wr.next_power_of_two());
        let bytes = recv_ring_bytes(cap, u64::from(attr.max_sge));
        let (idx, off) = {
            let mut a = ctx.alloc.lock().unwrap_or_else(|p| p.into_inner());
            let idx = a.srq_free.pop_front().ok_or_else(|| VerbsError::Exhausted("SRQ table".into()))?;
            match a.arena_alloc(bytes) {
                Some(off) => (u64::from(idx), off),
                None => {
                    a.srq_free.push_front(idx);
                    return Err(VerbsError::Exhausted("softib arena".into()));
                }
            }
        };
        RecvRing::init(&ctx.shm, off, cap, u64::from(attr.max_sge))
            .ok_or_else(|| VerbsError::Exhausted("softib arena".into()))?;
        let e = ctx.shm.srq(idx).ok_or_else(|| VerbsError::Exhausted("SRQ table".into()))?;
        e.rq_off.store(off, Relaxed);
        e.pd.store(u64::from(pd.id), Relaxed);
        let generation = e.life.load(Relaxed) >> 1;
        e.life.store((generation + 1) << 1 | 1, SeqCst);
        Ok(SoftSrq {
            inner: Arc::new(SrqInner {
                ctx: Arc::clone(ctx),
                idx,
                ring_off: off,
                ring_bytes: bytes,
                max_sge: attr.max_sge,
                post_lock: Mutex::new(()),
            }),
        })
    }

    fn create_qp(&self, pd: &SoftPd, init: &QpInit<'_, Self>) -> VerbsResult<SoftQp> {
        qp::create(&self.inner, pd, init)
    }

    fn counters(&self) -> VerbsCounters {
        let c = &self.inner.counters;
        VerbsCounters {
            registrations: c.registrations.load(Relaxed),
            deregistrations: c.deregistrations.load(Relaxed),
            registered_bytes: c.registered_bytes.load(Relaxed),
            pinned_bytes: c.pinned_bytes.load(Relaxed),
            reg_ns: c.reg_ns.load(Relaxed),
            dereg_ns: c.dereg_ns.load(Relaxed),
            device_ns: Some(c.device_ns.load(Relaxed)),
            send_wrs_posted: c.send_wrs_posted.load(Relaxed),
            recv_wrs_posted: c.recv_wrs_posted.load(Relaxed),
            completions: c.completions.load(Relaxed),
            rdma_write_bytes: c.rdma_write_bytes.load(Relaxed),
            rdma_read_bytes: c.rdma_read_bytes.load(Relaxed),
            send_bytes: c.send_bytes.load(Relaxed),
            rnr_retries: Some(c.rnr_retries.load(Relaxed)),
        }
    }

    /// A software port carries this context's queue pairs only: its RNR and transport retries
    /// are the context's. Nothing is ever received out of sequence, in error or discarded, but
    /// no counter is kept for it, so those are `None`.
    fn port_counters(&self, port: u8) -> VerbsResult<PortCounters> {
        self.inner.ports().port(port)?;
        let c = &self.inner.counters;
        Ok(PortCounters {
            rnr_nak_retries: Some(c.rnr_retries.load(Relaxed)),
            ack_timeouts: Some(c.transport_retries.load(Relaxed)),
            ..PortCounters::default()
        })
    }
}

#[cfg(test)]
mod prefault_tests {
    use super::*;

    /// Resident kB of every mapping of context `ctx`'s image in this process (its own, and
    /// those of contexts attached to it as a peer).
    fn image_rss_kb(ctx: &SoftContext) -> Vec<u64> {
        let name = format!("ionet-softib-{}-{:08x}", ctx.inner.pid, ctx.inner.token);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut out = Vec::new();
        let mut ours = false;
        for line in smaps.lines() {
            if line.split_whitespace().next().is_some_and(|f| f.contains('-') && !f.ends_with(':')) {
                ours = line.contains(&name);
            } else if ours && let Some(kb) = line.strip_prefix("Rss:") {
                out.push(kb.trim().trim_end_matches(" kB").trim().parse().unwrap());
            }
        }
        out
    }

    const CQE: u32 = 65536;
    const RING_KB: u64 = CQE as u64 * CQE_WORDS * 8 / 1024;

    #[test]
    fn cq_rings_are_mapped_at_creation_and_at_connection() {
        let open = || SoftProvider::new(SoftConfig::default()).open(None).unwrap();
        let (a, b) = (open(), open());
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(CQE, None, 0).unwrap(), b.create_cq(CQE, None, 0).unwrap());
        // The owner's mapping holds the whole ring before any completion was pushed.
        assert!(image_rss_kb(&b).iter().all(|&kb| kb >= RING_KB), "{:?}", image_rss_kb(&b));
        let init =
            |cq| QpInit { send_cq: cq, recv_cq: cq, srq: None, cap: QpCap::default(), sq_sig_all: false };
        let (qa, qb) = (a.create_qp(&pa, &init(&ca)).unwrap(), b.create_qp(&pb, &init(&cb)).unwrap());
        let info = |ctx: &SoftContext, qp: &SoftQp| QpEndpointInfo::local(qp, &ctx.port_attr(1).unwrap(), 1);
        let (ia, ib) = (info(&a, &qa), info(&b, &qb));
        bring_up(&qb, &ib, &ia, &ConnParams::default()).unwrap();
        bring_up(&qa, &ia, &ib, &ConnParams::default()).unwrap();
        // Each side now maps the other's image, with the ring it pushes receive completions
        // into already in its page tables: no fault per page on the data path.
        for ctx in [&a, &b] {
            let rss = image_rss_kb(ctx);
            assert_eq!(rss.len(), 2, "the owner's mapping and the peer's: {rss:?}");
            assert!(rss.iter().all(|&kb| kb >= RING_KB), "{rss:?}");
        }
    }
}

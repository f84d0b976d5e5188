//! RC queue pairs of the software provider: the state machine, the send-queue processor (the
//! "HCA" of the initiator) and the receive queue.
//!
//! The send queue is processed in posting order under the QP's send lock: synchronously in
//! `post_send` while nothing blocks, then by the context's progress thread (RNR and transport
//! retries, delayed RDMA_READs, FENCEs behind them). Each work request leaves the queue exactly
//! once — completed, or flushed when the QP enters ERR — so each produces at most one
//! completion, and exactly one when signaled or failed.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::peer::{Peer, SoftGid};
use super::ring::{CqRing, Pushed, RecvRing, recv_ring_bytes};
use super::shm::{QpEntry, qps};
use super::sys::{self, CopyError, Dir, Span};
use super::{CqInner, CtxInner, FaultPlan, SoftPd, SoftSrq, SrqInner, check_mr};
use crate::ib::verbs::*;

/// Bits of the slot index in a QPN (QPN = generation << 10 | index).
const QPN_IDX_BITS: u32 = 10;

/// A queue pair of the software provider.
pub struct SoftQp {
    inner: Arc<QpInner>,
}

impl fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftQp").field("qpn", &self.inner.qpn).field("state", &self.state()).finish()
    }
}

impl SoftQp {
    /// Replaces this QP's fault plan (see [`FaultPlan`]).
    pub fn set_faults(&self, plan: FaultPlan) {
        self.inner.set_faults(plan);
    }
}

pub(crate) struct QpInner {
    ctx: Arc<CtxInner>,
    me: Weak<QpInner>,
    idx: u64,
    generation: u64,
    qpn: u32,
    pd: u32,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    cap: QpCap,
    sq_sig_all: bool,
    /// Own receive ring (arena offset, bytes); `None` with an SRQ.
    rq: Option<(u64, u64)>,
    own_slot: u64,
    sq: Mutex<SendSide>,
    rq_lock: Mutex<()>,
}

/// Where the QP sends to (set at RTR).
#[derive(Debug, Clone)]
struct Conn {
    remote: QpEndpointInfo,
    path_mtu: Mtu,
    /// `None`: the GID/LID named no reachable context; sends fail with `RetryExcErr`.
    peer: Option<(Arc<Peer>, u64)>,
}

#[derive(Debug)]
struct PendingWr {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    sges: Vec<Sge>,
    /// The payload of an INLINE send, captured at post time.
    inline: Option<Vec<u8>>,
}

#[derive(Debug)]
struct DelayedRead {
    wr: PendingWr,
    due: Instant,
    seq: u64,
}

/// An entry of the in-order completion queue kept while delayed reads are outstanding.
#[derive(Debug)]
enum Held {
    /// A delayed read still in flight.
    Read(u64),
    /// A finished work request (its completion, if it produces one).
    Ready(Option<WorkCompletion>),
}

#[derive(Debug, Default)]
struct SendSide {
    conn: Option<Conn>,
    rts: Option<RtsAttr>,
    next_psn: u32,
    pending: VecDeque<PendingWr>,
    blocked_until: Option<Instant>,
    head_rnr: u32,
    head_retry: u32,
    reads: VecDeque<DelayedRead>,
    held: VecDeque<Held>,
    next_seq: u64,
    processed: u64,
    faults: FaultPlan,
    scheduled: Option<Instant>,
}

enum Outcome {
    /// Finished with this status and byte count.
    Done(WcStatus, u32),
    /// An RDMA_READ that completes at the given time.
    Deferred(Instant),
    /// Blocked (RNR or transport retry) until the given time.
    Retry(Instant),
}

use Outcome::*;

fn state_from_raw(v: u64) -> QpState {
    match v {
        qps::RESET => QpState::Reset,
        qps::INIT => QpState::Init,
        qps::RTR => QpState::Rtr,
        qps::RTS => QpState::Rts,
        _ => QpState::Err,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn create(
    ctx: &Arc<CtxInner>,
    pd: &SoftPd,
    init: &QpInit<'_, super::SoftContext>,
) -> VerbsResult<SoftQp> {
    let a = &ctx.attr;
    let c = init.cap;
    let bad =
        |what: &str| Err(VerbsError::InvalidArgument(format!("QP {what} exceeds the device limit ({c:?})")));
    if c.max_send_wr == 0 || c.max_send_wr > a.max_qp_wr {
        return bad("max_send_wr");
    }
    if init.srq.is_none() && (c.max_recv_wr == 0 || c.max_recv_wr > a.max_qp_wr) {
        return bad("max_recv_wr");
    }
    if c.max_send_sge > a.max_sge || c.max_recv_sge > a.max_sge {
        return bad("SGE count");
    }
    if c.max_inline_data > a.max_inline_data {
        return bad("max_inline_data");
    }
    let same = |o: &Arc<CtxInner>| Arc::ptr_eq(o, ctx);
    if !same(&pd.ctx)
        || !same(&init.send_cq.inner.ctx)
        || !same(&init.recv_cq.inner.ctx)
        || init.srq.is_some_and(|s: &SoftSrq| !same(&s.inner.ctx))
    {
        return Err(VerbsError::InvalidArgument("objects of another context".into()));
    }
    let mut cap = c;
    let rq_cap = u64::from(c.max_recv_wr.max(1).next_power_of_two());
    let rq_bytes = recv_ring_bytes(rq_cap, u64::from(c.max_recv_sge));
    let (idx, generation, rq) = {
        let mut al = lock(&ctx.alloc);
        let idx = al.qp_free.pop_front().ok_or_else(|| VerbsError::Exhausted("QP table".into()))?;
        let g = &mut al.qp_gen[idx as usize];
        *g = (*g % ((1 << (24 - QPN_IDX_BITS)) - 1)) + 1;
        let generation = u64::from(*g);
        let rq = if init.srq.is_none() {
            match al.arena_alloc(rq_bytes) {
                Some(off) => Some((off, rq_bytes)),
                None => {
                    al.qp_free.push_front(idx);
                    return Err(VerbsError::Exhausted("softib arena (raise SoftConfig::arena_bytes)".into()));
                }
            }
        } else {
            None
        };
        (u64::from(idx), generation, rq)
    };
    if let Some((off, _)) = rq {
        RecvRing::init(&ctx.shm, off, rq_cap, u64::from(c.max_recv_sge))
            .ok_or_else(|| VerbsError::Exhausted("softib arena".into()))?;
        cap.max_recv_wr = rq_cap as u32;
    }
    let Some(own_slot) = ctx.shm.claim_slot(ctx.pid, ctx.start_time) else {
        let mut al = lock(&ctx.alloc);
        if let Some((off, len)) = rq {
            al.arena_free(off, len);
        }
        al.qp_free.push_front(idx as u32);
        return Err(VerbsError::Exhausted("softib attach slots".into()));
    };
    let qpn = (generation << QPN_IDX_BITS | idx) as u32;
    let e = ctx.shm.qp(idx).ok_or_else(|| VerbsError::Exhausted("QP table".into()))?;
    e.qp_state.store(qps::RESET, Relaxed);
    e.pd.store(u64::from(pd.id), Relaxed);
    e.recv_cq.store(init.recv_cq.inner.idx, Relaxed);
    e.srq.store(init.srq.map_or(0, |s| s.inner.idx + 1), Relaxed);
    e.rq_off.store(rq.map_or(0, |r| r.0), Relaxed);
    for w in [&e.remote_qpn, &e.remote_token, &e.expected_psn, &e.min_rnr_timer, &e.access] {
        w.store(0, Relaxed);
    }
    e.life.store(generation << 1 | 1, SeqCst);
    let inner = Arc::new_cyclic(|me| QpInner {
        ctx: Arc::clone(ctx),
        me: me.clone(),
        idx,
        generation,
        qpn,
        pd: pd.id,
        send_cq: Arc::clone(&init.send_cq.inner),
        recv_cq: Arc::clone(&init.recv_cq.inner),
        _srq: init.srq.map(|s| Arc::clone(&s.inner)),
        cap,
        sq_sig_all: init.sq_sig_all,
        rq,
        own_slot,
        sq: Mutex::new(SendSide { faults: ctx.cfg.faults.clone(), ..SendSide::default() }),
        rq_lock: Mutex::new(()),
    });
    lock(&ctx.qps).insert(qpn, Arc::downgrade(&inner));
    tracing::debug!(qpn, "softib QP created");
    Ok(SoftQp { inner })
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let shm = &self.ctx.shm;
        if let Some(e) = shm.qp(self.idx) {
            e.qp_state.store(qps::RESET, SeqCst);
            e.life.store(self.generation << 1, SeqCst);
        }
        // Peers that validated this QP before it died may still be in its ring.
        shm.synchronize();
        shm.release_slot(self.own_slot);
        let ss = self.sq.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(Conn { peer: Some((p, slot)), .. }) = ss.conn.take() {
            p.shm.release_slot(slot);
        }
        let mut al = lock(&self.ctx.alloc);
        if let Some((off, len)) = self.rq {
            al.arena_free(off, len);
        }
        al.qp_free.push_back(self.idx as u32);
        drop(al);
        lock(&self.ctx.qps).remove(&self.qpn);
    }
}

impl QpInner {
    fn entry(&self) -> &QpEntry {
        // The entry exists for the QP's whole life (index validated at creation).
        self.ctx.shm.qp(self.idx).expect("own QP entry")
    }

    fn state_raw(&self) -> u64 {
        self.entry().qp_state.load(SeqCst)
    }

    pub(crate) fn set_faults(&self, plan: FaultPlan) {
        lock(&self.sq).faults = plan;
    }

    /// Moves to ERR and flushes the receive queue (the send queue is flushed by `run`).
    fn enter_err(&self) {
        self.entry().qp_state.store(qps::ERR, SeqCst);
        self.flush_rq();
    }

    fn flush_rq(&self) {
        let Some((off, _)) = self.rq else { return };
        if let Some(ring) = RecvRing::open(&self.ctx.shm, off) {
            ring.drain(|wr_id| {
                self.recv_cq.push_local(&WorkCompletion {
                    wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.qpn,
                    ..WorkCompletion::default()
                });
            });
        }
    }

    /// Timer callback from the progress thread.
    pub(crate) fn progress(&self) {
        let mut ss = lock(&self.sq);
        ss.scheduled = None;
        let next = self.run(&mut ss);
        self.schedule(&mut ss, next);
    }

    fn schedule(&self, ss: &mut SendSide, next: Option<Instant>) {
        if let Some(t) = next
            && ss.scheduled.is_none_or(|s| t < s)
        {
            ss.scheduled = Some(t);
            self.ctx.sched.schedule(t, self.me.clone());
        }
    }

    /// Processes the send queue as far as it can go; returns when to look again. This is the
    /// device's work (an HCA's, done here by whichever thread posted or the progress thread),
    /// timed into `device_ns` so host CPU can be told from emulated-device CPU.
    fn run(&self, ss: &mut SendSide) -> Option<Instant> {
        let t0 = Instant::now();
        let next = self.run_queue(ss, t0);
        self.ctx.bump(&self.ctx.counters.device_ns, t0.elapsed().as_nanos() as u64);
        next
    }

    fn run_queue(&self, ss: &mut SendSide, now: Instant) -> Option<Instant> {
        // One clock reading for the whole run (`run` takes it anyway for `device_ns`): a vDSO
        // call per work request costs as much as a small one's bookkeeping.
        while ss.reads.front().is_some_and(|r| r.due <= now) {
            let Some(r) = ss.reads.pop_front() else { break };
            let (st, n) = if self.state_raw() == qps::ERR {
                (WcStatus::WrFlushErr, 0)
            } else {
                match self.exec(ss, &r.wr, now, true) {
                    Done(st, n) => (st, n),
                    Deferred(_) | Retry(_) => (WcStatus::GeneralErr, 0),
                }
            };
            self.read_done(ss, r.seq, &r.wr, st, n);
            if !st.is_success() {
                self.enter_err();
            }
        }
        loop {
            if self.state_raw() == qps::ERR {
                self.flush_send(ss);
                return None;
            }
            let Some(wr) = ss.pending.pop_front() else { break };
            if wr.flags.contains(SendFlags::FENCE) && !ss.reads.is_empty() {
                ss.pending.push_front(wr);
                return ss.reads.front().map(|r| r.due);
            }
            if let Some(t) = ss.blocked_until {
                if t > now {
                    ss.pending.push_front(wr);
                    return Some(t);
                }
                ss.blocked_until = None;
            }
            match self.exec(ss, &wr, now, false) {
                Done(st, n) => {
                    ss.head_rnr = 0;
                    ss.head_retry = 0;
                    ss.processed += 1;
                    self.complete(ss, &wr, st, n);
                    if !st.is_success() {
                        tracing::debug!(
                            qpn = self.qpn,
                            wr_id = wr.wr_id,
                            ?st,
                            "work request failed; QP -> ERR"
                        );
                        self.enter_err();
                    }
                }
                Deferred(due) => {
                    ss.head_rnr = 0;
                    ss.head_retry = 0;
                    ss.processed += 1;
                    let seq = ss.next_seq;
                    ss.next_seq += 1;
                    if !ss.faults.reorder_read_completions {
                        ss.held.push_back(Held::Read(seq));
                    }
                    ss.reads.push_back(DelayedRead { wr, due, seq });
                }
                Retry(at) => {
                    ss.blocked_until = Some(at);
                    ss.pending.push_front(wr);
                    return Some(at);
                }
            }
        }
        ss.reads.front().map(|r| r.due)
    }

    /// Flushes every outstanding send work request (in order: in-flight reads are older).
    fn flush_send(&self, ss: &mut SendSide) {
        while let Some(r) = ss.reads.pop_front() {
            self.read_done(ss, r.seq, &r.wr, WcStatus::WrFlushErr, 0);
        }
        while let Some(wr) = ss.pending.pop_front() {
            self.complete(ss, &wr, WcStatus::WrFlushErr, 0);
        }
        ss.blocked_until = None;
        ss.head_rnr = 0;
        ss.head_retry = 0;
    }

    fn send_wc(&self, wr: &PendingWr, status: WcStatus, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id: wr.wr_id,
            status,
            opcode: wr.op.wc_opcode(),
            byte_len,
            qp_num: self.qpn,
            ..WorkCompletion::default()
        }
    }

    fn signaled(&self, wr: &PendingWr) -> bool {
        self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED)
    }

    /// Emits the completion of a finished work request (none for an unsignaled success),
    /// behind any delayed read that must complete first.
    fn complete(&self, ss: &mut SendSide, wr: &PendingWr, st: WcStatus, n: u32) {
        if st.is_success() && !self.signaled(wr) {
            return;
        }
        let wc = self.send_wc(wr, st, n);
        if ss.held.is_empty() {
            self.send_cq.push_local(&wc);
        } else {
            ss.held.push_back(Held::Ready(Some(wc)));
        }
    }

    fn read_done(&self, ss: &mut SendSide, seq: u64, wr: &PendingWr, st: WcStatus, n: u32) {
        let wc = (!st.is_success() || self.signaled(wr)).then(|| self.send_wc(wr, st, n));
        match ss.held.iter().position(|h| matches!(h, Held::Read(s) if *s == seq)) {
            Some(pos) => {
                ss.held[pos] = Held::Ready(wc);
                while matches!(ss.held.front(), Some(Held::Ready(_))) {
                    if let Some(Held::Ready(Some(wc))) = ss.held.pop_front() {
                        self.send_cq.push_local(&wc);
                    }
                }
            }
            None => {
                if let Some(wc) = wc {
                    self.send_cq.push_local(&wc);
                }
            }
        }
    }

    fn transport_retry(&self, ss: &mut SendSide, now: Instant) -> Outcome {
        let Some(rts) = ss.rts else { return Done(WcStatus::RetryExcErr, 0) };
        if ss.head_retry < u32::from(rts.retry_cnt) {
            ss.head_retry += 1;
            self.ctx.bump(&self.ctx.counters.transport_retries, 1);
            Retry(now + ack_timeout(rts.timeout).max(Duration::from_micros(100)))
        } else {
            Done(WcStatus::RetryExcErr, 0)
        }
    }

    fn rnr(&self, ss: &mut SendSide, e: &QpEntry, now: Instant) -> Outcome {
        let Some(rts) = ss.rts else { return Done(WcStatus::RnrRetryExcErr, 0) };
        // rnr_retry = 7 means "retry forever" in verbs.
        if rts.rnr_retry >= 7 || ss.head_rnr < u32::from(rts.rnr_retry) {
            ss.head_rnr += 1;
            self.ctx.bump(&self.ctx.counters.rnr_retries, 1);
            // The responder's RNR NAK carries its own min_rnr_timer.
            let code = (e.min_rnr_timer.load(Relaxed) & 31) as u8;
            Retry(now + rnr_timer_delay(code))
        } else {
            Done(WcStatus::RnrRetryExcErr, 0)
        }
    }

    /// Local scatter/gather spans of `wr`, validated against our MR table. Inside a critical
    /// section of our own image.
    fn local_spans(&self, wr: &PendingWr) -> Option<Vec<Span>> {
        if let Some(data) = &wr.inline {
            return Some(vec![Span { addr: data.as_ptr() as u64, len: data.len() as u64 }]);
        }
        let need = match wr.op {
            SendOp::RdmaRead { .. } => AccessFlags::LOCAL_WRITE,
            _ => AccessFlags::NONE,
        };
        wr.sges
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| {
                check_mr(&self.ctx.shm, s.lkey, s.addr, u64::from(s.len), need, u64::from(self.pd))
                    .then_some(Span { addr: s.addr, len: u64::from(s.len) })
            })
            .collect()
    }

    /// The peer QP entry, if it is alive, receiving, and connected to us.
    fn target<'p>(&self, peer: &'p Peer, remote_qpn: u32) -> Option<&'p QpEntry> {
        let e = live_qp(peer, remote_qpn)?;
        let st = e.qp_state.load(SeqCst);
        let ok = (st == qps::RTR || st == qps::RTS)
            && e.remote_qpn.load(Acquire) == u64::from(self.qpn)
            && e.remote_token.load(Acquire) == u64::from(self.ctx.token);
        ok.then_some(e)
    }

    /// Executes one work request. `completing_read`: finish a delayed RDMA_READ (no faults,
    /// no PSN, no retries).
    fn exec(&self, ss: &mut SendSide, wr: &PendingWr, now: Instant, completing_read: bool) -> Outcome {
        if !completing_read {
            if ss.faults.qp_error_after.is_some_and(|n| ss.processed >= n) {
                tracing::debug!(qpn = self.qpn, "fault: QP error");
                self.enter_err();
                return Done(WcStatus::WrFlushErr, 0);
            }
            if ss.faults.vanish_after.is_some_and(|n| ss.processed >= n) {
                tracing::debug!(qpn = self.qpn, "fault: peer vanished");
                return Done(WcStatus::RetryExcErr, 0);
            }
        }
        let Some(conn) = ss.conn.clone() else { return Done(WcStatus::RetryExcErr, 0) };
        let Some((peer, pslot)) = conn.peer else {
            return if completing_read {
                Done(WcStatus::RetryExcErr, 0)
            } else {
                self.transport_retry(ss, now)
            };
        };
        // Retries ask the kernel every time; the fast path reuses a recent answer.
        let retrying = ss.head_rnr > 0 || ss.head_retry > 0 || completing_read;
        if !(if retrying { peer.alive_now() } else { peer.alive(now) }) {
            tracing::debug!(qpn = self.qpn, pid = peer.pid(), "peer process is gone");
            return Done(WcStatus::RetryExcErr, 0);
        }
        // Everything validated below stays valid until these sections close (see `shm`).
        let Some(_own) = self.ctx.shm.enter(self.own_slot) else { return Done(WcStatus::GeneralErr, 0) };
        let Some(_theirs) = peer.shm.enter(pslot) else { return Done(WcStatus::GeneralErr, 0) };
        let Some(local) = self.local_spans(wr) else { return Done(WcStatus::LocProtErr, 0) };
        let len: u64 = local.iter().map(|s| s.len).sum();
        let Ok(len32) = u32::try_from(len) else { return Done(WcStatus::LocLenErr, 0) };
        let Some(t) = self.target(&peer, conn.remote.qpn) else {
            return if completing_read {
                Done(WcStatus::RetryExcErr, 0)
            } else {
                self.transport_retry(ss, now)
            };
        };
        // Packets larger than the receiving port's MTU are dropped on a fabric: the sender
        // sees no ACK, retries, and fails with RetryExcErr.
        let peer_mtu = t.port_mtu.load(Acquire);
        if peer_mtu != 0 && u64::from(conn.path_mtu.bytes()) > peer_mtu {
            tracing::debug!(
                qpn = self.qpn,
                path_mtu = conn.path_mtu.bytes(),
                peer_mtu,
                "path MTU above the peer port's"
            );
            return if completing_read {
                Done(WcStatus::RetryExcErr, 0)
            } else {
                self.transport_retry(ss, now)
            };
        }
        let psn = ss.next_psn;
        if !completing_read && t.expected_psn.load(Acquire) != u64::from(psn) {
            tracing::debug!(qpn = self.qpn, psn, expected = t.expected_psn.load(Relaxed), "PSN mismatch");
            return Done(WcStatus::RetryExcErr, 0);
        }
        let advance_psn = |ss: &mut SendSide| {
            let next = (psn + 1) & MAX_24BIT;
            t.expected_psn.store(u64::from(next), Release);
            ss.next_psn = next;
        };
        let tpd = t.pd.load(Acquire);
        let tqpn = conn.remote.qpn;
        let qp_rights =
            AccessFlags::from_bits((t.access.load(Acquire) & 7) as u32).unwrap_or(AccessFlags::NONE);
        let one_sided = |remote_addr: u64, rkey: u32, need: AccessFlags| -> bool {
            len == 0 || (qp_rights.contains(need) && check_mr(&peer.shm, rkey, remote_addr, len, need, tpd))
        };
        let copy = |dir: Dir, remote: &[Span]| -> Result<(), WcStatus> {
            match sys::copy_spans(dir, peer.pid(), peer.same_process, &local, remote) {
                Ok(n) if n == len => Ok(()),
                Ok(_) | Err(CopyError::Fault) => Err(WcStatus::RemAccessErr),
                Err(CopyError::PeerGone) => Err(WcStatus::RetryExcErr),
                Err(CopyError::Other(err)) => {
                    tracing::warn!(%err, "softib copy failed (ptrace permission?)");
                    Err(WcStatus::GeneralErr)
                }
            }
        };
        let c = &self.ctx.counters;
        match wr.op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                if !completing_read {
                    if ss.faults.remote_access_errors > 0 {
                        ss.faults.remote_access_errors -= 1;
                        return Done(WcStatus::RemAccessErr, 0);
                    }
                    if let Some(d) = ss.faults.read_delay {
                        advance_psn(ss);
                        return Deferred(now + d);
                    }
                }
                if !one_sided(remote_addr, rkey, AccessFlags::REMOTE_READ) {
                    return Done(WcStatus::RemAccessErr, 0);
                }
                if let Err(st) = copy(Dir::Read, &[Span { addr: remote_addr, len }]) {
                    return Done(st, 0);
                }
                if !completing_read {
                    advance_psn(ss);
                }
                self.ctx.bump(&c.rdma_read_bytes, len);
                Done(WcStatus::Success, len32)
            }
            SendOp::RdmaWrite { remote_addr, rkey } | SendOp::RdmaWriteWithImm { remote_addr, rkey, .. } => {
                if ss.faults.remote_access_errors > 0 {
                    ss.faults.remote_access_errors -= 1;
                    return Done(WcStatus::RemAccessErr, 0);
                }
                if !one_sided(remote_addr, rkey, AccessFlags::REMOTE_WRITE) {
                    return Done(WcStatus::RemAccessErr, 0);
                }
                let imm = match wr.op {
                    SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let wqe = match imm {
                    Some(_) => match self.take_recv(ss, &peer, t) {
                        Ok(Some(w)) => Some(w),
                        Ok(None) => return self.rnr(ss, t, now),
                        Err(st) => return Done(st, 0),
                    },
                    None => None,
                };
                if let Err(st) = copy(Dir::Write, &[Span { addr: remote_addr, len }]) {
                    return Done(st, 0);
                }
                if let Some(w) = wqe {
                    let wc = WorkCompletion {
                        wr_id: w.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: len32,
                        imm_data: imm,
                        qp_num: tqpn,
                        src_qp: self.qpn,
                        vendor_err: 0,
                    };
                    push_remote(&peer, t, &wc, wr.flags.contains(SendFlags::SOLICITED));
                }
                advance_psn(ss);
                self.ctx.bump(&c.rdma_write_bytes, len);
                Done(WcStatus::Success, len32)
            }
            SendOp::Send | SendOp::SendWithImm { .. } => {
                let w = match self.take_recv(ss, &peer, t) {
                    Ok(Some(w)) => w,
                    Ok(None) => return self.rnr(ss, t, now),
                    Err(st) => return Done(st, 0),
                };
                let room: u64 = w.sges.iter().map(|s| u64::from(s.len)).sum();
                let fail_target = |status: WcStatus| {
                    let wc = WorkCompletion {
                        wr_id: w.wr_id,
                        status,
                        opcode: WcOpcode::Recv,
                        qp_num: tqpn,
                        ..Default::default()
                    };
                    push_remote(&peer, t, &wc, false);
                    fail_remote_qp(&peer, t, tqpn);
                };
                if room < len {
                    fail_target(WcStatus::LocLenErr);
                    return Done(WcStatus::RemInvReqErr, 0);
                }
                // Scatter into the receive's buffers, checked against the target's MR table.
                let mut remote = Vec::with_capacity(w.sges.len());
                let mut left = len;
                for s in &w.sges {
                    if left == 0 {
                        break;
                    }
                    let take = u64::from(s.len).min(left);
                    if take > 0 {
                        if !check_mr(&peer.shm, s.lkey, s.addr, take, AccessFlags::LOCAL_WRITE, tpd) {
                            fail_target(WcStatus::LocProtErr);
                            return Done(WcStatus::RemOpErr, 0);
                        }
                        remote.push(Span { addr: s.addr, len: take });
                    }
                    left -= take;
                }
                if let Err(st) = copy(Dir::Write, &remote) {
                    // The receive was taken: complete it with an error too (unless the target
                    // process is gone and nobody will poll it).
                    if st != WcStatus::RetryExcErr {
                        fail_target(WcStatus::LocProtErr);
                    }
                    return Done(if st == WcStatus::RemAccessErr { WcStatus::RemOpErr } else { st }, 0);
                }
                let imm = match wr.op {
                    SendOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                let wc = WorkCompletion {
                    wr_id: w.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: len32,
                    imm_data: imm,
                    qp_num: tqpn,
                    src_qp: self.qpn,
                    vendor_err: 0,
                };
                push_remote(&peer, t, &wc, wr.flags.contains(SendFlags::SOLICITED));
                advance_psn(ss);
                self.ctx.bump(&c.send_bytes, len);
                Done(WcStatus::Success, len32)
            }
        }
    }

    /// Takes a receive from the target's queue (its own or its SRQ). `Ok(None)`: none posted
    /// (or an injected RNR).
    fn take_recv(
        &self,
        ss: &mut SendSide,
        peer: &Peer,
        t: &QpEntry,
    ) -> Result<Option<super::ring::Wqe>, WcStatus> {
        if ss.faults.rnr_attempts > 0 {
            ss.faults.rnr_attempts -= 1;
            return Ok(None);
        }
        let srq = t.srq.load(Acquire);
        let off = if srq != 0 {
            let s = peer.shm.srq(srq - 1).ok_or(WcStatus::RemOpErr)?;
            if s.life.load(SeqCst) & 1 == 0 {
                return Err(WcStatus::RemOpErr);
            }
            s.rq_off.load(Acquire)
        } else {
            t.rq_off.load(Acquire)
        };
        let ring = RecvRing::open(&peer.shm, off).ok_or(WcStatus::RemOpErr)?;
        Ok(ring.pop())
    }
}

/// Prefaults, in our mapping of the peer's image, the receive CQ ring of its QP `qpn`: every
/// receive completion of this connection is pushed there, and a page first written on the data
/// path costs a fault (see [`Shm::prefault`](super::shm::Shm::prefault)).
fn prefault_remote_cq(peer: &Peer, qpn: u32) {
    if let Some(e) = live_qp(peer, qpn) {
        CqRing::prefault(&peer.shm, e.recv_cq.load(Acquire));
    }
}

/// The peer's QP entry that QP number `qpn` names, if that QP (this generation of its slot)
/// is alive.
fn live_qp(peer: &Peer, qpn: u32) -> Option<&QpEntry> {
    let idx = u64::from(qpn) & ((1 << QPN_IDX_BITS) - 1);
    let generation = u64::from(qpn) >> QPN_IDX_BITS;
    let e = peer.shm.qp(idx)?;
    (e.life.load(SeqCst) == generation << 1 | 1).then_some(e)
}

/// Adds a completion to the receive CQ of a peer QP and wakes its owner if it armed the CQ.
fn push_remote(peer: &Peer, t: &QpEntry, wc: &WorkCompletion, solicited: bool) {
    let r = match CqRing::open(&peer.shm, t.recv_cq.load(Acquire)) {
        Some(ring) => ring.push(wc, solicited),
        None => Pushed::Gone,
    };
    match r {
        Pushed::Wake(fd) => peer.wake(fd),
        Pushed::Overrun => tracing::debug!(pid = peer.pid(), "peer CQ overrun"),
        Pushed::Gone => tracing::debug!(pid = peer.pid(), "peer CQ is gone"),
        Pushed::Stored => {}
    }
}

/// A responder-side error: the peer QP moves to ERR and its receive queue is flushed.
fn fail_remote_qp(peer: &Peer, t: &QpEntry, tqpn: u32) {
    t.qp_state.store(qps::ERR, SeqCst);
    if t.srq.load(Acquire) != 0 {
        return;
    }
    if let Some(ring) = RecvRing::open(&peer.shm, t.rq_off.load(Acquire)) {
        ring.drain(|wr_id| {
            let wc = WorkCompletion {
                wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: tqpn,
                ..WorkCompletion::default()
            };
            push_remote(peer, t, &wc, false);
        });
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    fn state(&self) -> QpState {
        state_from_raw(self.inner.state_raw())
    }

    fn cap(&self) -> QpCap {
        self.inner.cap
    }

    fn modify(&self, t: &QpTransition) -> VerbsResult<()> {
        let q = &self.inner;
        let mut ss = lock(&q.sq);
        let e = q.entry();
        let from = state_from_raw(e.qp_state.load(SeqCst));
        if !t.allowed_from(from) {
            return Err(VerbsError::InvalidTransition { from, to: t.target() });
        }
        let bad = |m: String| Err(VerbsError::InvalidArgument(m));
        match *t {
            QpTransition::Init(a) => {
                let port = q.ctx.ports().port(a.port_num)?.active_mtu;
                e.port_mtu.store(u64::from(port.bytes()), Release);
                e.access.store(u64::from(a.access.bits()), Release);
                e.qp_state.store(qps::INIT, SeqCst);
            }
            QpTransition::Rtr(a) => {
                if a.sl > 15 || a.min_rnr_timer > 31 || a.remote.qpn > MAX_24BIT {
                    return bad(format!("RTR attributes {a:?}"));
                }
                check_route(&super::SoftContext { inner: Arc::clone(&q.ctx) }, &a)?;
                if let Some(Conn { peer: Some((p, slot)), .. }) = ss.conn.take() {
                    p.shm.release_slot(slot);
                }
                let peer = match q.ctx.peer(&a.remote.gid) {
                    // A global route addresses the peer by GID alone (RoCE has no LIDs).
                    Ok(p) if a.gid_index.is_some() || p.lid == a.remote.lid => {
                        match p.shm.claim_slot(q.ctx.pid, q.ctx.start_time) {
                            Some(slot) => Some((p, slot)),
                            None => {
                                tracing::warn!("peer has no free attach slot; sends will fail");
                                None
                            }
                        }
                    }
                    Ok(p) => {
                        tracing::debug!(lid = a.remote.lid, actual = p.lid, "LID does not match the GID");
                        None
                    }
                    Err(err) => {
                        // Like an HCA: RTR succeeds, sends time out (RetryExcErr).
                        tracing::debug!(%err, gid = %a.remote.gid, "peer unreachable");
                        None
                    }
                };
                if let Some((p, _)) = &peer {
                    prefault_remote_cq(p, a.remote.qpn);
                }
                ss.conn = Some(Conn { remote: a.remote, path_mtu: a.path_mtu, peer });
                let token = SoftGid::parse(&a.remote.gid).map_or(0, |g| g.token);
                e.remote_qpn.store(u64::from(a.remote.qpn), Release);
                e.remote_token.store(u64::from(token), Release);
                e.expected_psn.store(u64::from(a.remote.psn & MAX_24BIT), Release);
                e.min_rnr_timer.store(u64::from(a.min_rnr_timer), Release);
                e.qp_state.store(qps::RTR, SeqCst);
            }
            QpTransition::Rts(a) => {
                if a.retry_cnt > 7 || a.rnr_retry > 7 || a.timeout > 31 {
                    return bad(format!("RTS attributes {a:?}"));
                }
                ss.rts = Some(a);
                ss.next_psn = a.sq_psn & MAX_24BIT;
                e.qp_state.store(qps::RTS, SeqCst);
            }
            QpTransition::Err => {
                q.enter_err();
                q.flush_send(&mut ss);
            }
            QpTransition::Reset => {
                e.qp_state.store(qps::RESET, SeqCst);
                ss.pending.clear();
                ss.reads.clear();
                ss.held.clear();
                ss.blocked_until = None;
                ss.rts = None;
                if let Some(Conn { peer: Some((p, slot)), .. }) = ss.conn.take() {
                    p.shm.release_slot(slot);
                }
                if let Some((off, _)) = q.rq
                    && let Some(ring) = RecvRing::open(&q.ctx.shm, off)
                {
                    ring.drain(|_| {});
                }
            }
        }
        tracing::debug!(qpn = q.qpn, ?from, to = ?t.target(), "QP transition");
        Ok(())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let q = &self.inner;
        let mut ss = lock(&q.sq);
        let state = q.state_raw();
        let mut failed = None;
        for (index, wr) in wrs.iter().enumerate() {
            if let Err(error) = self.accept_send(&mut ss, wr, state) {
                failed = Some(PostError { index, error });
                break;
            }
        }
        let next = q.run(&mut ss);
        q.schedule(&mut ss, next);
        failed.map_or(Ok(()), Err)
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let q = &self.inner;
        let Some((off, _)) = q.rq else {
            let error = VerbsError::InvalidArgument("QP uses an SRQ: post to the SRQ".into());
            return Err(PostError { index: 0, error });
        };
        let _g = lock(&q.rq_lock);
        let state = q.state_raw();
        let ring = RecvRing::open(&q.ctx.shm, off).ok_or(PostError {
            index: 0,
            error: VerbsError::InvalidArgument("receive ring is gone".into()),
        })?;
        for (index, wr) in wrs.iter().enumerate() {
            if state == qps::RESET {
                return Err(PostError { index, error: VerbsError::InvalidState(QpState::Reset) });
            }
            if wr.sges.len() > q.cap.max_recv_sge as usize {
                let error = VerbsError::TooManySge { given: wr.sges.len(), max: q.cap.max_recv_sge };
                return Err(PostError { index, error });
            }
            if !ring.push(wr.wr_id, wr.sges) {
                let error = VerbsError::QueueFull { queue: "receive queue", capacity: q.cap.max_recv_wr };
                return Err(PostError { index, error });
            }
            q.ctx.bump(&q.ctx.counters.recv_wrs_posted, 1);
        }
        // A QP in ERR (or one a peer just moved there) flushes what was posted.
        if q.state_raw() == qps::ERR {
            q.flush_rq();
        }
        Ok(())
    }
}

impl SoftQp {
    fn accept_send(&self, ss: &mut SendSide, wr: &SendWr<'_>, state: u64) -> VerbsResult<()> {
        let q = &self.inner;
        if state != qps::RTS && state != qps::ERR {
            return Err(VerbsError::InvalidState(state_from_raw(state)));
        }
        check_send_wr(wr, &q.cap)?;
        if ss.pending.len() + ss.reads.len() >= q.cap.max_send_wr as usize {
            return Err(VerbsError::QueueFull { queue: "send queue", capacity: q.cap.max_send_wr });
        }
        let inline = if wr.flags.contains(SendFlags::INLINE) {
            let Some(_cs) = q.ctx.shm.enter(q.own_slot) else {
                return Err(VerbsError::InvalidArgument("attach slot".into()));
            };
            let mut data = Vec::new();
            for s in wr.sges {
                if !check_mr(&q.ctx.shm, s.lkey, s.addr, u64::from(s.len), AccessFlags::NONE, u64::from(q.pd))
                {
                    return Err(VerbsError::InvalidArgument(format!(
                        "inline SGE {s:?} is not covered by its lkey"
                    )));
                }
                let start = data.len();
                data.resize(start + s.len as usize, 0);
                let dst = [Span { addr: data[start..].as_mut_ptr() as u64, len: u64::from(s.len) }];
                let _ = sys::copy_spans(
                    Dir::Read,
                    q.ctx.pid,
                    true,
                    &dst,
                    &[Span { addr: s.addr, len: u64::from(s.len) }],
                );
            }
            Some(data)
        } else {
            None
        };
        ss.pending.push_back(PendingWr {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            sges: wr.sges.to_vec(),
            inline,
        });
        q.ctx.bump(&q.ctx.counters.send_wrs_posted, 1);
        Ok(())
    }
}

impl fmt::Debug for QpInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpInner").field("qpn", &self.qpn).finish()
    }
}

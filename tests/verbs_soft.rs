//! Behaviour specific to the software provider: shared receive queues, the pin budget, stale
//! keys after re-registration, PSN checks, unreachable peers, every fault of a `FaultPlan`,
//! counters and CQ overrun. Both sides live in this process (two contexts); the cross-process
//! paths are covered by `verbs_conformance`.

use std::time::{Duration, Instant};

use ionet::internals::ib::soft::{FaultPlan, SoftConfig, SoftContext, SoftProvider};
use ionet::internals::ib::verbs::*;

const TIMEOUT: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(50);

type Cq = <SoftContext as Verbs>::Cq;
type Qp = <SoftContext as Verbs>::Qp;
type Mr = <SoftContext as Verbs>::Mr;
type Pd = <SoftContext as Verbs>::Pd;

struct End {
    ctx: SoftContext,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: Vec<u8>,
}

fn open(cfg: SoftConfig) -> SoftContext {
    SoftProvider::new(cfg).open(None).expect("open softib")
}

fn reg(
    ctx: &SoftContext,
    pd: &Pd,
    buf: &mut [u8],
    access: AccessFlags,
) -> ionet::internals::ib::verbs::VerbsResult<Mr> {
    // SAFETY: every caller keeps `buf` alive (and untouched by Rust while work is outstanding)
    // until the returned MR is dropped.
    unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), buf.len(), access) }
}

fn qp(ctx: &SoftContext, pd: &Pd, cq: &Cq, cqe_cap: QpCap) -> Qp {
    ctx.create_qp(pd, &QpInit { send_cq: cq, recv_cq: cq, srq: None, cap: cqe_cap, sq_sig_all: false })
        .expect("qp")
}

impl End {
    fn new(cfg: SoftConfig) -> End {
        let ctx = open(cfg);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None, 0).unwrap();
        let qp = qp(&ctx, &pd, &cq, QpCap::default());
        let mut buf = vec![0u8; 1 << 16];
        let mr = reg(&ctx, &pd, &mut buf, AccessFlags::ALL).unwrap();
        End { ctx, pd, cq, qp, mr, buf }
    }

    fn info(&self, psn: u32) -> QpEndpointInfo {
        QpEndpointInfo::local(&self.qp, &self.ctx.port_attr(1).unwrap(), psn)
    }

    fn sge(&self, off: usize, len: u32) -> Sge {
        Sge::new(self.buf.as_ptr() as u64 + off as u64, len, self.mr.lkey())
    }

    fn poll(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        poll_cq(&self.cq, n, timeout)
    }
}

fn poll_cq(cq: &Cq, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut wcs = [WorkCompletion::default(); 8];
    while out.len() < n && Instant::now() < deadline {
        let k = cq.poll(&mut wcs).unwrap();
        out.extend_from_slice(&wcs[..k]);
        if k == 0 {
            std::thread::yield_now();
        }
    }
    out
}

fn fast() -> ConnParams {
    ConnParams { min_rnr_timer: 1, timeout: 8, retry_cnt: 2, ..ConnParams::default() }
}

fn connect(a: &End, b: &End, pa: &ConnParams, pb: &ConnParams) {
    let (ia, ib) = (a.info(10), b.info(20));
    bring_up(&b.qp, &ib, &ia, pb).unwrap();
    bring_up(&a.qp, &ia, &ib, pa).unwrap();
}

fn pair() -> (End, End) {
    let (a, b) = (End::new(SoftConfig::default()), End::new(SoftConfig::default()));
    connect(&a, &b, &fast(), &fast());
    (a, b)
}

fn st(w: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

fn send(e: &End, wr_id: u64, op: SendOp, len: u32, flags: SendFlags) {
    e.qp.post_send(&[SendWr { wr_id, op, sges: &[e.sge(0, len)], flags }]).unwrap();
}

#[test]
fn srq_is_shared_by_qps() {
    let b = End::new(SoftConfig::default());
    let srq = b.ctx.create_srq(&b.pd, &SrqAttr { max_wr: 16, max_sge: 2 }).unwrap();
    let init = |srq| QpInit { send_cq: &b.cq, recv_cq: &b.cq, srq, cap: QpCap::default(), sq_sig_all: false };
    let b1 = b.ctx.create_qp(&b.pd, &init(Some(&srq))).unwrap();
    let b2 = b.ctx.create_qp(&b.pd, &init(Some(&srq))).unwrap();
    assert!(b1.post_recv(&[RecvWr { wr_id: 1, sges: &[] }]).is_err(), "receives go to the SRQ");
    let (a1, a2) = (End::new(SoftConfig::default()), End::new(SoftConfig::default()));
    let port = b.ctx.port_attr(1).unwrap();
    for (a, bq) in [(&a1, &b1), (&a2, &b2)] {
        let ib = QpEndpointInfo::local(bq, &port, 5);
        bring_up(bq, &ib, &a.info(6), &fast()).unwrap();
        bring_up(&a.qp, &a.info(6), &ib, &fast()).unwrap();
    }
    for i in 0..4u64 {
        srq.post_recv(&[RecvWr { wr_id: i, sges: &[b.sge(i as usize * 64, 64)] }]).unwrap();
    }
    send(&a1, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    send(&a2, 2, SendOp::SendWithImm { imm: 9 }, 8, SendFlags::SIGNALED);
    send(&a1, 3, SendOp::Send, 8, SendFlags::SIGNALED);
    let w = b.poll(3, TIMEOUT);
    assert_eq!(st(&w), [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::Success)]);
    let by: Vec<u32> = w.iter().map(|w| w.qp_num).collect();
    assert_eq!(by, [b1.qp_num(), b2.qp_num(), b1.qp_num()], "qp_num names the consuming QP");
    assert_eq!(w[1].imm_data, Some(9));
}

#[test]
fn pin_budget_gives_a_typed_error() {
    let ctx = open(SoftConfig { max_pinned_bytes: Some(1 << 20), ..SoftConfig::default() });
    let pd = ctx.alloc_pd().unwrap();
    let (mut x, mut y) = (vec![0u8; 768 << 10], vec![0u8; 512 << 10]);
    let mx = reg(&ctx, &pd, &mut x, AccessFlags::LOCAL_WRITE).unwrap();
    let e = reg(&ctx, &pd, &mut y, AccessFlags::LOCAL_WRITE).unwrap_err();
    assert!(matches!(e, VerbsError::PinLimit { len, .. } if len == 512 << 10), "{e}");
    assert!(matches!(ionet::Error::from(e), ionet::Error::Exhausted(_)));
    assert_eq!(ctx.pinned_bytes(), 768 << 10);
    // What a registration cache does: release unused registrations, retry.
    drop(mx);
    let my = reg(&ctx, &pd, &mut y, AccessFlags::LOCAL_WRITE).unwrap();
    assert_eq!(ctx.pinned_bytes(), 512 << 10);
    let c = ctx.counters();
    assert_eq!((c.registrations, c.deregistrations, c.registered_bytes), (2, 1, (768 + 512) << 10));
    drop(my);
}

#[test]
fn registration_arguments_are_checked() {
    let ctx = open(SoftConfig::default());
    let pd = ctx.alloc_pd().unwrap();
    let mut b = vec![0u8; 64];
    assert!(matches!(reg(&ctx, &pd, &mut b[..0], AccessFlags::NONE), Err(VerbsError::InvalidArgument(_))));
    assert!(matches!(reg(&ctx, &pd, &mut b, AccessFlags::REMOTE_WRITE), Err(VerbsError::InvalidArgument(_))));
}

#[test]
fn stale_key_of_a_reregistered_slot_is_refused() {
    // One MR slot: the second registration reuses it with a new generation.
    let cfg = SoftConfig { max_mr: 2, ..SoftConfig::default() };
    let a = End::new(SoftConfig::default());
    let mut b = End::new(cfg);
    let mut region = vec![0x11u8; 4096];
    let old = reg(&b.ctx, &b.pd, &mut region, AccessFlags::ALL).unwrap();
    let old_key = old.rkey();
    assert!(reg(&b.ctx, &b.pd, &mut [0u8; 8], AccessFlags::ALL).is_err(), "table full");
    drop(old);
    let new = reg(&b.ctx, &b.pd, &mut region, AccessFlags::ALL).unwrap();
    assert_ne!(new.rkey(), old_key);
    assert_eq!(new.rkey() >> 16, old_key >> 16, "same slot");
    connect(&a, &b, &fast(), &fast());
    let addr = region.as_ptr() as u64;
    send(&a, 1, SendOp::RdmaWrite { remote_addr: addr, rkey: old_key }, 16, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::RemAccessErr)]);
    assert!(region.iter().all(|&x| x == 0x11), "stale key wrote nothing");
    // A fresh QP pair and the current key work.
    b.qp = qp(&b.ctx, &b.pd, &b.cq, QpCap::default());
    let mut a = a;
    a.qp = qp(&a.ctx, &a.pd, &a.cq, QpCap::default());
    connect(&a, &b, &fast(), &fast());
    send(&a, 2, SendOp::RdmaWrite { remote_addr: addr, rkey: new.rkey() }, 16, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(2, WcStatus::Success)]);
    assert_eq!(&region[..16], &[0u8; 16]);
    drop(new);
}

#[test]
fn wrong_psn_is_a_transport_error() {
    let (a, b) = (End::new(SoftConfig::default()), End::new(SoftConfig::default()));
    let (ia, ib) = (a.info(100), b.info(200));
    // B expects PSN 101 but A starts at 100 (a botched exchange).
    bring_up(&b.qp, &ib, &QpEndpointInfo { psn: 101, ..ia }, &fast()).unwrap();
    bring_up(&a.qp, &ia, &ib, &fast()).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    send(&a, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::RetryExcErr)]);
    assert!(b.poll(1, QUIET).is_empty(), "nothing delivered");
}

#[test]
fn unreachable_peer_fails_after_retries() {
    let a = End::new(SoftConfig::default());
    let bogus = QpEndpointInfo { qpn: 77, psn: 1, lid: 3, gid: Gid([0x42; 16]) };
    bring_up(&a.qp, &a.info(1), &bogus, &fast()).unwrap();
    send(&a, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    send(&a, 2, SendOp::Send, 8, SendFlags::NONE);
    assert_eq!(st(&a.poll(2, TIMEOUT)), [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn injected_rnr_is_retried_then_succeeds() {
    let (a, b) = pair();
    a.ctx.set_qp_faults(a.qp.qp_num(), FaultPlan::rnr(3)).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    send(&a, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
    assert_eq!(a.ctx.counters().rnr_retries, Some(3));
    assert_eq!(st(&b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
}

#[test]
fn injected_qp_error_flushes_the_rest() {
    let (a, b) = pair();
    a.ctx.set_qp_faults(a.qp.qp_num(), FaultPlan::qp_error_after(2)).unwrap();
    let (addr, rkey) = (b.buf.as_ptr() as u64, b.mr.rkey());
    for i in 0..4 {
        send(&a, i, SendOp::RdmaWrite { remote_addr: addr, rkey }, 8, SendFlags::SIGNALED);
    }
    let w = a.poll(4, TIMEOUT);
    assert_eq!(
        st(&w),
        [
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn injected_remote_access_error_touches_nothing() {
    let (a, mut b) = pair();
    b.buf[..64].fill(0x33);
    a.ctx.set_qp_faults(a.qp.qp_num(), FaultPlan::remote_access(1)).unwrap();
    send(
        &a,
        1,
        SendOp::RdmaWrite { remote_addr: b.buf.as_ptr() as u64, rkey: b.mr.rkey() },
        64,
        SendFlags::SIGNALED,
    );
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::RemAccessErr)]);
    assert!(b.buf[..64].iter().all(|&x| x == 0x33));
}

#[test]
fn vanishing_peer_fails_outstanding_work() {
    let (a, b) = pair();
    a.ctx.set_qp_faults(a.qp.qp_num(), FaultPlan::vanish_after(1)).unwrap();
    let (addr, rkey) = (b.buf.as_ptr() as u64, b.mr.rkey());
    for i in 0..3 {
        send(&a, i, SendOp::RdmaWrite { remote_addr: addr, rkey }, 8, SendFlags::SIGNALED);
    }
    assert_eq!(
        st(&a.poll(3, TIMEOUT)),
        [(0, WcStatus::Success), (1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn reordered_read_completions_come_after_later_work() {
    let (a, b) = pair();
    a.ctx.set_qp_faults(a.qp.qp_num(), FaultPlan::delayed_reads(Duration::from_millis(20), true)).unwrap();
    let (addr, rkey) = (b.buf.as_ptr() as u64, b.mr.rkey());
    let s = [a.sge(0, 64)];
    // One post, so the WRITE is processed before the READ's delay can expire.
    a.qp.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead { remote_addr: addr, rkey },
            sges: &s,
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite { remote_addr: addr + 4096, rkey },
            sges: &s,
            flags: SendFlags::SIGNALED,
        },
    ])
    .unwrap();
    let ids: Vec<u64> = a.poll(2, TIMEOUT).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [2, 1], "the delayed READ completes after the later WRITE");
}

#[test]
fn counters_track_traffic() {
    let (a, b) = pair();
    let (addr, rkey) = (b.buf.as_ptr() as u64, b.mr.rkey());
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 256)] }]).unwrap();
    send(&a, 1, SendOp::RdmaWrite { remote_addr: addr, rkey }, 1000, SendFlags::NONE);
    send(&a, 2, SendOp::RdmaRead { remote_addr: addr, rkey }, 300, SendFlags::NONE);
    send(&a, 3, SendOp::Send, 100, SendFlags::SIGNALED);
    assert_eq!(a.poll(1, TIMEOUT).len(), 1);
    assert_eq!(b.poll(1, TIMEOUT).len(), 1);
    let c = a.ctx.counters();
    assert_eq!((c.rdma_write_bytes, c.rdma_read_bytes, c.send_bytes), (1000, 300, 100));
    assert_eq!((c.send_wrs_posted, c.completions), (3, 1));
    assert!(c.reg_ns > 0 && c.registrations == 1);
    // The initiator's threads did the device's work; the target, which only posted a
    // receive and polled, did none.
    assert!(c.device_ns.is_some_and(|ns| ns > 0), "device time of the initiator");
    assert_eq!(b.ctx.counters().device_ns, Some(0), "no device time at the target");
    assert_eq!(b.ctx.counters().recv_wrs_posted, 1);
}

#[test]
fn cq_overrun_is_reported() {
    let (a, b) = pair();
    let small = a.ctx.create_cq(2, None, 0).unwrap();
    let q = a
        .ctx
        .create_qp(
            &a.pd,
            &QpInit { send_cq: &small, recv_cq: &a.cq, srq: None, cap: QpCap::default(), sq_sig_all: true },
        )
        .unwrap();
    let bq = qp(&b.ctx, &b.pd, &b.cq, QpCap::default());
    let port = a.ctx.port_attr(1).unwrap();
    let (ia, ib) = (QpEndpointInfo::local(&q, &port, 1), b.info(2));
    let ib = QpEndpointInfo { qpn: bq.qp_num(), ..ib };
    bring_up(&bq, &ib, &ia, &fast()).unwrap();
    bring_up(&q, &ia, &ib, &fast()).unwrap();
    let (addr, rkey) = (b.buf.as_ptr() as u64, b.mr.rkey());
    for i in 0..3 {
        let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
        q.post_send(&[SendWr { wr_id: i, op, sges: &[a.sge(0, 8)], flags: SendFlags::NONE }]).unwrap();
    }
    let mut wcs = [WorkCompletion::default(); 4];
    assert!(matches!(small.poll(&mut wcs), Err(VerbsError::CqOverrun)));
}

#[test]
fn objects_may_be_dropped_in_any_order() {
    let (a, b) = pair();
    let End { ctx, pd, cq, qp, mr, buf } = a;
    drop(ctx);
    drop(pd);
    drop(cq);
    // The QP still works: it keeps its CQ and context alive.
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sges: &[Sge::new(buf.as_ptr() as u64, 8, mr.lkey())],
        flags: SendFlags::NONE,
    }])
    .unwrap();
    assert_eq!(st(&b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
    drop(qp);
    drop(mr);
    drop(buf);
}

#[test]
fn bad_local_key_is_a_local_protection_error() {
    let (a, b) = pair();
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    let bad = Sge::new(a.buf.as_ptr() as u64, 8, a.mr.lkey() ^ 0x40);
    a.qp.post_send(&[SendWr { wr_id: 1, op: SendOp::Send, sges: &[bad], flags: SendFlags::NONE }]).unwrap();
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::LocProtErr)]);
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(b.poll(1, QUIET).is_empty(), "nothing was sent");
}

#[test]
fn unregistered_receive_buffer_fails_both_sides() {
    let (a, b) = pair();
    let bad = Sge::new(b.buf.as_ptr() as u64, 64, b.mr.lkey() ^ 0x40);
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[bad] }, RecvWr { wr_id: 2, sges: &[b.sge(0, 64)] }]).unwrap();
    send(&a, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::RemOpErr)]);
    assert_eq!(st(&b.poll(2, TIMEOUT)), [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(b.qp.state(), QpState::Err);
    // A receive posted on a QP in ERR completes at once with a flush.
    b.qp.post_recv(&[RecvWr { wr_id: 3, sges: &[b.sge(0, 64)] }]).unwrap();
    assert_eq!(st(&b.poll(1, TIMEOUT)), [(3, WcStatus::WrFlushErr)]);
}

#[test]
fn channel_events_name_the_cq_that_fired() {
    let b = End::new(SoftConfig::default());
    let ch = b.ctx.create_comp_channel().unwrap();
    let (cq1, cq2) = (b.ctx.create_cq(16, Some(&ch), 1).unwrap(), b.ctx.create_cq(16, Some(&ch), 2).unwrap());
    let bq = b
        .ctx
        .create_qp(
            &b.pd,
            &QpInit { send_cq: &cq1, recv_cq: &cq2, srq: None, cap: QpCap::default(), sq_sig_all: false },
        )
        .unwrap();
    let a = End::new(SoftConfig::default());
    let ib = QpEndpointInfo::local(&bq, &b.ctx.port_attr(1).unwrap(), 3);
    bring_up(&bq, &ib, &a.info(4), &fast()).unwrap();
    bring_up(&a.qp, &a.info(4), &ib, &fast()).unwrap();
    bq.post_recv(&[RecvWr { wr_id: 9, sges: &[b.sge(0, 64)] }]).unwrap();
    cq1.req_notify(false).unwrap();
    cq2.req_notify(false).unwrap();
    assert_eq!(ch.get_event().unwrap(), None);
    send(&a, 1, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
    assert_eq!(ch.get_event().unwrap(), Some(2), "the receive CQ fired");
    assert_eq!(ch.get_event().unwrap(), None, "one event per arm, none from the idle CQ");
    assert_eq!(st(&poll_cq(&cq2, 1, TIMEOUT)), [(9, WcStatus::Success)]);
    // The drain loop above ended without reading the doorbell again; an event after it must
    // still be seen by the next drain (it is not answered from the previous sweep).
    bq.post_recv(&[RecvWr { wr_id: 10, sges: &[b.sge(0, 64)] }]).unwrap();
    cq2.req_notify(false).unwrap();
    send(&a, 2, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(2, WcStatus::Success)]);
    assert_eq!(ch.get_event().unwrap(), Some(2), "the second arm's event");
    assert_eq!(ch.get_event().unwrap(), None);
    assert_eq!(ch.get_event().unwrap(), None, "nothing pending: the doorbell is read and empty");
    assert!(b.ctx.create_cq(16, None, 0).unwrap().req_notify(false).is_err(), "no channel to notify");
}

/// A path MTU above the receiving port's active MTU: the receiver's port drops the packets, so
/// the sender sees no acknowledgement, retries and fails with `RetryExcErr` — while the path
/// MTU both ports take carries the same send. Ethernet ports, so both routes use a GRH.
#[test]
fn a_path_mtu_above_the_receivers_port_is_never_acknowledged() {
    use ionet::internals::ib::soft::SoftPort;
    let port =
        |mtu| SoftConfig { ports: vec![SoftPort::ethernet().with_active_mtu(mtu)], ..SoftConfig::default() };
    let (a, b) = (End::new(port(Mtu::Mtu4096)), End::new(port(Mtu::Mtu1024)));
    let route = |e: &End| default_route(&e.ctx, 1, IpFamily::V6).unwrap().expect("a RoCE GID");
    let (ra, rb) = (route(&a), route(&b));
    let (mut ia, mut ib) = (a.info(10), b.info(20));
    (ia.gid, ib.gid) = (ra.gid, rb.gid);
    assert_eq!(ia.lid, 0, "RoCE ports have no LID");
    let params = |r: GidEntry, path_mtu| ConnParams { gid_index: Some(r.index), path_mtu, ..fast() };
    bring_up(&b.qp, &ib, &ia, &params(rb, Mtu::Mtu1024)).unwrap();
    bring_up(&a.qp, &ia, &ib, &params(ra, Mtu::Mtu4096)).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    send(&a, 7, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(7, WcStatus::RetryExcErr)]);
    assert_eq!(a.ctx.port_counters(1).unwrap().ack_timeouts, Some(2), "retry_cnt = 2 retries");
    assert!(b.poll(1, QUIET).is_empty(), "nothing arrived");

    // The same ends at the smaller MTU.
    let (a, b) = (End::new(port(Mtu::Mtu4096)), End::new(port(Mtu::Mtu1024)));
    let (mut ia, mut ib) = (a.info(10), b.info(20));
    (ia.gid, ib.gid) = (route(&a).gid, route(&b).gid);
    bring_up(&b.qp, &ib, &ia, &params(route(&b), Mtu::Mtu1024)).unwrap();
    bring_up(&a.qp, &ia, &ib, &params(route(&a), Mtu::Mtu1024)).unwrap();
    b.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[b.sge(0, 64)] }]).unwrap();
    send(&a, 8, SendOp::Send, 8, SendFlags::SIGNALED);
    assert_eq!(st(&a.poll(1, TIMEOUT)), [(8, WcStatus::Success)]);
    assert_eq!(st(&b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
}

//! Verbs conformance suite, generic over providers.
//!
//! Every test drives side **A** directly and side **B** through the [`Remote`] interface, which is
//! implemented three ways:
//! - `soft_inproc::*`: B is a second software context in this process;
//! - `soft_xproc::*`: B lives in a child process (this test binary re-executed as the ignored
//!   `agent_main` test) and the two processes move data with `process_vm_*`;
//! - `soft_roce_inproc::*` / `soft_roce_xproc::*`: the same with the software ports presenting
//!   an Ethernet link layer and a RoCE GID table, so every test also runs over global routes;
//! - `hw_conformance`: both sides on the hardware provider when an RDMA device exists; otherwise
//!   it prints why it was skipped.
//!
//! Tests assert behaviour only; waits are bounded by [`TIMEOUT`] so a broken provider fails
//! instead of hanging, and no test asserts how long anything took.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ionet::internals::ib::soft::{FaultPlan, SoftConfig, SoftContext, SoftPort, SoftProvider};
use ionet::internals::ib::verbs::*;

/// Upper bound on any wait: only reached when something is broken.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long we watch for completions that must *not* appear.
const QUIET: Duration = Duration::from_millis(50);
const BUF: usize = 256 << 10;
const COOKIE: u64 = 0xC0FFEE;

// ---------------------------------------------------------------------------------------------
// Providers under test

/// What the suite needs beyond the `Verbs` trait: fault injection where the provider has it.
trait TestProvider: Verbs {
    const NAME: &'static str;
    /// Injects `plan` into QP `qpn`; false when the provider cannot inject faults.
    fn inject(&self, qpn: u32, plan: FaultPlan) -> bool;
    /// Opens a context for a test side.
    fn open_ctx() -> Self;
    /// The port the tests connect through.
    fn port() -> u8 {
        1
    }
}

thread_local! {
    /// This test's software contexts present an Ethernet (RoCE) port.
    static ROCE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's software contexts (and its agents') on RoCE ports.
fn over_roce(f: impl FnOnce()) {
    ROCE.set(true);
    f();
    ROCE.set(false);
}

impl TestProvider for SoftContext {
    const NAME: &'static str = "soft";
    fn inject(&self, qpn: u32, plan: FaultPlan) -> bool {
        self.set_qp_faults(qpn, plan).is_ok()
    }
    fn open_ctx() -> Self {
        let mut cfg = SoftConfig::default();
        if ROCE.get() {
            cfg.ports = vec![SoftPort::ethernet()];
        }
        SoftProvider::new(cfg).open(None).expect("open softib")
    }
}

#[cfg(feature = "verbs")]
impl TestProvider for ionet::internals::ib::hw::HwContext {
    const NAME: &'static str = "hw";
    fn inject(&self, _: u32, _: FaultPlan) -> bool {
        false
    }
    /// The device `IONET_IB_DEVICE` (`name[:port]`) names, else the first.
    fn open_ctx() -> Self {
        let dev = std::env::var("IONET_IB_DEVICE").ok().filter(|v| !v.is_empty());
        let name = dev.as_deref().map(|v| v.split(':').next().unwrap_or(v));
        ionet::internals::ib::hw::HwProvider::new().open(name).expect("open RDMA device")
    }
    /// The port `IONET_IB_DEVICE` names, else 1.
    fn port() -> u8 {
        let dev = std::env::var("IONET_IB_DEVICE").unwrap_or_default();
        dev.split_once(':').map_or(1, |(_, p)| p.parse().expect("IONET_IB_DEVICE=name:port"))
    }
}

// ---------------------------------------------------------------------------------------------
// One side: context, PD, channel, one CQ for everything, one RC QP and a registered buffer

/// Connection knobs a test varies.
#[derive(Debug, Clone, Copy)]
struct Params {
    rnr_retry: u8,
    min_rnr_timer: u8,
    retry_cnt: u8,
    timeout: u8,
}

impl Default for Params {
    fn default() -> Self {
        // 10 µs RNR timer, 4 ms transport timeout: failures surface quickly.
        Params { rnr_retry: 7, min_rnr_timer: 1, retry_cnt: 3, timeout: 10 }
    }
}

struct Side<V: Verbs> {
    ctx: V,
    pd: V::Pd,
    ch: V::Channel,
    cq: V::Cq,
    qp: V::Qp,
    mr: V::Mr,
    extra: Vec<V::Mr>,
    psn: u32,
    /// The source GID of routes through port 1 (RoCE ports), as the engine picks it.
    route: Option<GidEntry>,
    // Last: the registrations above are dropped (deregistered) before the memory is freed.
    buf: Vec<u8>,
}

fn cap_for(attr: &DeviceAttr) -> QpCap {
    QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: attr.max_sge.min(16),
        max_recv_sge: attr.max_sge.min(16),
        max_inline_data: attr.max_inline_data.min(64),
    }
}

/// Registers `len` bytes of `buf` at `off`.
fn register<V: Verbs>(
    ctx: &V,
    pd: &V::Pd,
    buf: &mut [u8],
    off: usize,
    len: usize,
    access: AccessFlags,
) -> V::Mr {
    let region = &mut buf[off..off + len];
    // SAFETY: the memory belongs to a `Side`'s buffer, which is freed only after every MR of
    // the side has been dropped (field order), and the test touches it only while no work
    // request that could access it is outstanding.
    unsafe { ctx.reg_mr(pd, region.as_mut_ptr(), region.len(), access) }.expect("reg_mr")
}

impl<V: TestProvider> Side<V> {
    fn new() -> Self {
        let ctx = V::open_ctx();
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let ch = ctx.create_comp_channel().expect("channel");
        let cq = ctx.create_cq(1024, Some(&ch), COOKIE).expect("cq");
        let qp = ctx
            .create_qp(
                &pd,
                &QpInit {
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    cap: cap_for(ctx.attr()),
                    sq_sig_all: false,
                },
            )
            .expect("qp");
        let mut buf = vec![0u8; BUF];
        let mr = register(&ctx, &pd, &mut buf, 0, BUF, AccessFlags::ALL);
        let psn = 0x1234 + qp.qp_num() % 1000;
        let route = default_route(&ctx, V::port(), IpFamily::V4).expect("a route through the port");
        Side { ctx, pd, ch, cq, qp, mr, extra: Vec::new(), psn, route, buf }
    }

    fn new_qp(&mut self) {
        let init = QpInit {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: None,
            cap: cap_for(self.ctx.attr()),
            sq_sig_all: false,
        };
        self.qp = self.ctx.create_qp(&self.pd, &init).expect("qp");
        self.psn = (self.psn * 7 + 13) & MAX_24BIT;
    }

    fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge::new(self.addr(off), len as u32, self.mr.lkey())
    }

    fn local_info(&self) -> QpEndpointInfo {
        let mut info =
            QpEndpointInfo::local(&self.qp, &self.ctx.port_attr(V::port()).expect("port"), self.psn);
        if let Some(e) = self.route {
            info.gid = e.gid;
        }
        info
    }

    fn bring_up(&mut self, remote: QpEndpointInfo, p: Params) {
        let cp = ConnParams {
            rnr_retry: p.rnr_retry,
            min_rnr_timer: p.min_rnr_timer,
            retry_cnt: p.retry_cnt,
            timeout: p.timeout,
            gid_index: self.route.map(|e| e.index),
            port_num: V::port(),
            ..ConnParams::default()
        };
        bring_up(&self.qp, &self.local_info(), &remote, &cp).expect("bring_up");
    }

    fn post(&self, wr_id: u64, op: SendOp, sges: &[Sge], flags: SendFlags) -> Result<(), PostError> {
        self.qp.post_send(&[SendWr { wr_id, op, sges, flags }])
    }

    /// Polls until `n` completions arrived or `timeout` passed.
    fn poll_n(&self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        while got.len() < n && Instant::now() < deadline {
            let k = self.cq.poll(&mut wcs).expect("poll");
            got.extend_from_slice(&wcs[..k]);
            if k == 0 {
                std::thread::yield_now();
            }
        }
        got
    }
}

// ---------------------------------------------------------------------------------------------
// The remote side

/// What a test asks of side B.
trait Remote {
    fn info(&mut self) -> QpEndpointInfo;
    fn connect(&mut self, peer: QpEndpointInfo, p: Params);
    fn new_qp(&mut self);
    /// (address, rkey, length) of B's buffer.
    fn buf(&mut self) -> (u64, u32, u64);
    fn post_recv(&mut self, wr_id: u64, sges: &[(usize, usize)]) -> Result<(), String>;
    /// B posts a signaled SEND of `len` bytes from its buffer at `off`.
    fn send(&mut self, wr_id: u64, off: usize, len: usize) -> Result<(), String>;
    /// B posts a signaled RDMA_WRITE of `len` bytes at `off` to (addr, rkey).
    fn write(&mut self, wr_id: u64, off: usize, len: usize, addr: u64, rkey: u32) -> Result<(), String>;
    fn poll(&mut self, n: usize, timeout: Duration) -> Vec<WorkCompletion>;
    fn fill(&mut self, off: usize, len: usize, byte: u8);
    fn read(&mut self, off: usize, len: usize) -> Vec<u8>;
    /// Registers a sub-range with `access`; returns its rkey.
    fn reg(&mut self, off: usize, len: usize, access: AccessFlags) -> u32;
    /// Deregisters a registration made with `reg`.
    fn dereg(&mut self, rkey: u32);
    fn state(&mut self) -> QpState;
    /// Makes B vanish: SIGKILL for a process, dropping everything in-process.
    fn kill(&mut self);
}

impl<V: TestProvider> Remote for Side<V> {
    fn info(&mut self) -> QpEndpointInfo {
        self.local_info()
    }
    fn connect(&mut self, peer: QpEndpointInfo, p: Params) {
        self.bring_up(peer, p);
    }
    fn new_qp(&mut self) {
        Side::new_qp(self);
    }
    fn buf(&mut self) -> (u64, u32, u64) {
        (self.addr(0), self.mr.rkey(), BUF as u64)
    }
    fn post_recv(&mut self, wr_id: u64, sges: &[(usize, usize)]) -> Result<(), String> {
        let sges: Vec<Sge> = sges.iter().map(|&(o, l)| self.sge(o, l)).collect();
        self.qp.post_recv(&[RecvWr { wr_id, sges: &sges }]).map_err(|e| e.to_string())
    }
    fn send(&mut self, wr_id: u64, off: usize, len: usize) -> Result<(), String> {
        self.post(wr_id, SendOp::Send, &[self.sge(off, len)], SendFlags::SIGNALED).map_err(|e| e.to_string())
    }
    fn write(&mut self, wr_id: u64, off: usize, len: usize, addr: u64, rkey: u32) -> Result<(), String> {
        let op = SendOp::RdmaWrite { remote_addr: addr, rkey };
        self.post(wr_id, op, &[self.sge(off, len)], SendFlags::SIGNALED).map_err(|e| e.to_string())
    }
    fn poll(&mut self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        self.poll_n(n, timeout)
    }
    fn fill(&mut self, off: usize, len: usize, byte: u8) {
        self.buf[off..off + len].fill(byte);
    }
    fn read(&mut self, off: usize, len: usize) -> Vec<u8> {
        self.buf[off..off + len].to_vec()
    }
    fn reg(&mut self, off: usize, len: usize, access: AccessFlags) -> u32 {
        let mr = register(&self.ctx, &self.pd, &mut self.buf, off, len, access);
        let k = mr.rkey();
        self.extra.push(mr);
        k
    }
    fn dereg(&mut self, rkey: u32) {
        let i = self.extra.iter().position(|m| m.rkey() == rkey).expect("known rkey");
        self.extra.swap_remove(i).deregister().expect("dereg");
    }
    fn state(&mut self) -> QpState {
        self.qp.state()
    }
    fn kill(&mut self) {
        // Destroying the QP makes every later request to it go unanswered.
        Side::new_qp(self);
    }
}

/// Side B in a child process: this test binary re-executed as `agent_main`.
struct Agent {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

impl Agent {
    fn spawn(provider: &str) -> Agent {
        let exe = std::env::current_exe().expect("current_exe");
        let mut child = Command::new(exe)
            .args(["agent_main", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
            .env("IONET_VERBS_AGENT", provider)
            .env("IONET_SOFTIB_LINK_LAYER", if ROCE.get() { "ethernet" } else { "infiniband" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn agent");
        let tx = child.stdin.take().expect("stdin");
        let rx = BufReader::new(child.stdout.take().expect("stdout"));
        Agent { child, tx, rx }
    }

    /// Sends a command; returns the agent's answer (after "@@ ").
    fn cmd(&mut self, line: &str) -> String {
        writeln!(self.tx, "{line}").expect("agent stdin");
        let mut s = String::new();
        loop {
            s.clear();
            let n = self.rx.read_line(&mut s).expect("agent stdout");
            assert!(n > 0, "agent exited while answering {line:?}");
            // libtest may print "test agent_main ... " on the same line before the first reply.
            if let Some(i) = s.find("@@ ") {
                return s[i + 3..].trim_end().to_string();
            }
        }
    }

    fn ok(&mut self, line: &str) -> Result<String, String> {
        let r = self.cmd(line);
        match r.strip_prefix("err ") {
            Some(e) => Err(e.to_string()),
            None => Ok(r),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}

fn wc_to_str(w: &WorkCompletion) -> String {
    let op = match w.opcode {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::Recv => 3,
        WcOpcode::RecvRdmaWithImm => 4,
        _ => 9,
    };
    let imm = w.imm_data.map_or("-".to_string(), |i| i.to_string());
    format!("{},{},{},{},{},{},{}", w.wr_id, w.status.as_raw(), op, w.byte_len, imm, w.qp_num, w.src_qp)
}

fn wc_from_str(s: &str) -> WorkCompletion {
    let f: Vec<&str> = s.split(',').collect();
    let n = |i: usize| f[i].parse::<u64>().expect("wc field");
    WorkCompletion {
        wr_id: n(0),
        status: WcStatus::from_raw(n(1) as u32),
        opcode: match n(2) {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            3 => WcOpcode::Recv,
            4 => WcOpcode::RecvRdmaWithImm,
            v => WcOpcode::Other(v as u32),
        },
        byte_len: n(3) as u32,
        imm_data: (f[4] != "-").then(|| n(4) as u32),
        qp_num: n(5) as u32,
        src_qp: n(6) as u32,
        vendor_err: 0,
    }
}

impl Remote for Agent {
    fn info(&mut self) -> QpEndpointInfo {
        QpEndpointInfo::decode(&unhex(&self.cmd("info"))).expect("endpoint info")
    }
    fn connect(&mut self, peer: QpEndpointInfo, p: Params) {
        let line = format!(
            "connect {} {} {} {} {}",
            hex(&peer.encode()),
            p.rnr_retry,
            p.min_rnr_timer,
            p.retry_cnt,
            p.timeout
        );
        self.ok(&line).expect("agent connect");
    }
    fn new_qp(&mut self) {
        self.ok("newqp").expect("agent newqp");
    }
    fn buf(&mut self) -> (u64, u32, u64) {
        let r = self.cmd("buf");
        let v: Vec<u64> = r.split(' ').map(|x| x.parse().expect("buf")).collect();
        (v[0], v[1] as u32, v[2])
    }
    fn post_recv(&mut self, wr_id: u64, sges: &[(usize, usize)]) -> Result<(), String> {
        let list: Vec<String> = sges.iter().map(|(o, l)| format!("{o}:{l}")).collect();
        self.ok(&format!("recv {wr_id} {}", list.join(","))).map(drop)
    }
    fn send(&mut self, wr_id: u64, off: usize, len: usize) -> Result<(), String> {
        self.ok(&format!("send {wr_id} {off} {len}")).map(drop)
    }
    fn write(&mut self, wr_id: u64, off: usize, len: usize, addr: u64, rkey: u32) -> Result<(), String> {
        self.ok(&format!("write {wr_id} {off} {len} {addr} {rkey}")).map(drop)
    }
    fn poll(&mut self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        let r = self.cmd(&format!("poll {n} {}", timeout.as_millis()));
        r.split(';').filter(|s| !s.is_empty()).map(wc_from_str).collect()
    }
    fn fill(&mut self, off: usize, len: usize, byte: u8) {
        self.ok(&format!("fill {off} {len} {byte}")).expect("fill");
    }
    fn read(&mut self, off: usize, len: usize) -> Vec<u8> {
        unhex(&self.cmd(&format!("read {off} {len}")))
    }
    fn reg(&mut self, off: usize, len: usize, access: AccessFlags) -> u32 {
        self.ok(&format!("reg {off} {len} {}", access.bits())).expect("reg").parse().expect("rkey")
    }
    fn dereg(&mut self, rkey: u32) {
        self.ok(&format!("dereg {rkey}")).expect("dereg");
    }
    fn state(&mut self) -> QpState {
        match self.cmd("state").as_str() {
            "Reset" => QpState::Reset,
            "Init" => QpState::Init,
            "Rtr" => QpState::Rtr,
            "Rts" => QpState::Rts,
            _ => QpState::Err,
        }
    }
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL agent");
        self.child.wait().expect("reap agent");
    }
}

/// Serves one side's commands on stdin/stdout (the child half of `Agent`).
fn serve<V: TestProvider>() {
    let mut side = Side::<V>::new();
    let out = std::io::stdout();
    for line in std::io::stdin().lines() {
        let Ok(line) = line else { break };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let reply: Result<String, String> = match f.first().copied() {
            Some("info") => Ok(hex(&side.local_info().encode())),
            Some("connect") => {
                let peer = QpEndpointInfo::decode(&unhex(f[1])).map_err(|e| e.to_string());
                peer.map(|peer| {
                    let p = Params {
                        rnr_retry: num(2) as u8,
                        min_rnr_timer: num(3) as u8,
                        retry_cnt: num(4) as u8,
                        timeout: num(5) as u8,
                    };
                    side.bring_up(peer, p);
                    "ok".into()
                })
            }
            Some("newqp") => {
                side.new_qp();
                Ok("ok".into())
            }
            Some("buf") => Ok(format!("{} {} {}", side.addr(0), side.mr.rkey(), BUF)),
            Some("recv") => {
                let sges: Vec<(usize, usize)> = f
                    .get(2)
                    .map(|l| {
                        l.split(',')
                            .filter_map(|p| p.split_once(':'))
                            .map(|(o, l)| (o.parse().unwrap_or(0), l.parse().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default();
                Remote::post_recv(&mut side, num(1), &sges).map(|_| "ok".into())
            }
            Some("send") => side.send(num(1), num(2) as usize, num(3) as usize).map(|_| "ok".into()),
            Some("write") => side
                .write(num(1), num(2) as usize, num(3) as usize, num(4), num(5) as u32)
                .map(|_| "ok".into()),
            Some("poll") => {
                let wcs = side.poll_n(num(1) as usize, Duration::from_millis(num(2)));
                Ok(wcs.iter().map(wc_to_str).collect::<Vec<_>>().join(";"))
            }
            Some("fill") => {
                side.fill(num(1) as usize, num(2) as usize, num(3) as u8);
                Ok("ok".into())
            }
            Some("read") => Ok(hex(&side.read(num(1) as usize, num(2) as usize))),
            Some("reg") => {
                let access = AccessFlags::from_bits(num(3) as u32).unwrap_or(AccessFlags::NONE);
                Ok(side.reg(num(1) as usize, num(2) as usize, access).to_string())
            }
            Some("dereg") => {
                side.dereg(num(1) as u32);
                Ok("ok".into())
            }
            Some("state") => Ok(format!("{:?}", side.qp.state())),
            Some("exit") | None => break,
            Some(other) => Err(format!("unknown command {other}")),
        };
        let mut o = out.lock();
        match reply {
            Ok(r) => writeln!(o, "@@ {r}"),
            Err(e) => writeln!(o, "@@ err {e}"),
        }
        .expect("stdout");
        o.flush().expect("flush");
    }
}

/// The child half of the cross-process tests. Run by `Agent::spawn`, never on its own.
#[test]
#[ignore = "helper: re-executed by the cross-process tests as the peer process"]
fn agent_main() {
    match std::env::var("IONET_VERBS_AGENT").as_deref() {
        Ok("soft") => serve::<SoftContext>(),
        #[cfg(feature = "verbs")]
        Ok("hw") => serve::<ionet::internals::ib::hw::HwContext>(),
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Pairs

struct Pair<V: TestProvider> {
    a: Side<V>,
    b: Box<dyn Remote>,
    /// B is another process.
    xproc: bool,
}

impl<V: TestProvider> Pair<V> {
    fn inproc() -> Self {
        Pair { a: Side::new(), b: Box::new(Side::<V>::new()), xproc: false }
    }

    fn xproc() -> Self {
        Pair { a: Side::new(), b: Box::new(Agent::spawn(V::NAME)), xproc: true }
    }

    fn connect(&mut self, pa: Params, pb: Params) {
        let ia = self.a.local_info();
        let ib = self.b.info();
        self.b.connect(ia, pb);
        self.a.bring_up(ib, pa);
    }

    /// Fresh QPs on both sides, connected.
    fn reconnect(&mut self, pa: Params, pb: Params) {
        self.a.new_qp();
        self.b.new_qp();
        self.connect(pa, pb);
    }
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

// ---------------------------------------------------------------------------------------------
// The tests, generic over providers

/// SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM and RDMA_READ move the right bytes and
/// report the right completion fields.
fn data_paths<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let (baddr, brkey, _) = p.b.buf();
    p.b.fill(0, 4096, 0x11);
    p.b.post_recv(1, &[(8192, 128)]).unwrap();
    p.b.post_recv(2, &[(9000, 16)]).unwrap();

    // RDMA_READ B[0..4096] → A[0..4096].
    let a = &p.a;
    a.post(10, SendOp::RdmaRead { remote_addr: baddr, rkey: brkey }, &[a.sge(0, 4096)], SendFlags::SIGNALED)
        .unwrap();
    let w = a.poll_n(1, TIMEOUT);
    assert_eq!(statuses(&w), [(10, WcStatus::Success)]);
    assert_eq!(w[0].opcode, WcOpcode::RdmaRead);
    assert!(p.a.buf[..4096].iter().all(|&b| b == 0x11));

    // RDMA_WRITE A[4096..6144] → B[4096..6144].
    p.a.buf[4096..6144].fill(0x22);
    let a = &p.a;
    let op = SendOp::RdmaWrite { remote_addr: baddr + 4096, rkey: brkey };
    a.post(11, op, &[a.sge(4096, 2048)], SendFlags::SIGNALED).unwrap();
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(11, WcStatus::Success)]);
    assert_eq!(p.b.read(4096, 2048), vec![0x22; 2048]);

    // SEND_WITH_IMM 100 bytes → B's first receive.
    p.a.buf[0..100].fill(0x33);
    let a = &p.a;
    a.post(12, SendOp::SendWithImm { imm: 0xABCD }, &[a.sge(0, 100)], SendFlags::SIGNALED).unwrap();
    let w = p.b.poll(1, TIMEOUT);
    assert_eq!(statuses(&w), [(1, WcStatus::Success)]);
    assert_eq!((w[0].opcode, w[0].byte_len, w[0].imm_data), (WcOpcode::Recv, 100, Some(0xABCD)));
    assert_eq!(w[0].src_qp, p.a.qp.qp_num());
    assert_eq!(p.b.read(8192, 100), vec![0x33; 100]);
    assert_eq!(statuses(&p.a.poll_n(1, TIMEOUT)), [(12, WcStatus::Success)]);

    // RDMA_WRITE_WITH_IMM: data lands, the receive's own buffer is untouched.
    p.a.buf[0..10].fill(0x44);
    p.b.fill(9000, 16, 0x55);
    let a = &p.a;
    let op = SendOp::RdmaWriteWithImm { remote_addr: baddr + 20000, rkey: brkey, imm: 7 };
    a.post(13, op, &[a.sge(0, 10)], SendFlags::SIGNALED).unwrap();
    let w = p.b.poll(1, TIMEOUT);
    assert_eq!(statuses(&w), [(2, WcStatus::Success)]);
    assert_eq!((w[0].opcode, w[0].byte_len, w[0].imm_data), (WcOpcode::RecvRdmaWithImm, 10, Some(7)));
    assert_eq!(p.b.read(20000, 10), vec![0x44; 10]);
    assert_eq!(p.b.read(9000, 16), vec![0x55; 16]);
    assert_eq!(statuses(&p.a.poll_n(1, TIMEOUT)), [(13, WcStatus::Success)]);

    // Inline SEND: the source may change right after posting.
    p.b.post_recv(3, &[(10000, 64)]).unwrap();
    p.a.buf[0..32].fill(0x66);
    let a = &p.a;
    a.post(14, SendOp::Send, &[a.sge(0, 32)], SendFlags::SIGNALED | SendFlags::INLINE).unwrap();
    p.a.buf[0..32].fill(0x77);
    assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(3, WcStatus::Success)]);
    assert_eq!(p.b.read(10000, 32), vec![0x66; 32]);
    assert_eq!(statuses(&p.a.poll_n(1, TIMEOUT)), [(14, WcStatus::Success)]);
}

/// SENDs and RDMA_WRITE_WITH_IMMs consume receives and complete at the target in post order.
fn rc_ordering<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let (baddr, brkey, _) = p.b.buf();
    const N: usize = 64;
    for i in 0..N {
        p.b.post_recv(i as u64, &[(i * 64, 64)]).unwrap();
    }
    for i in 0..N {
        p.a.buf[i * 8..i * 8 + 8].fill(i as u8 + 1);
    }
    let sges: Vec<[Sge; 1]> = (0..N).map(|i| [p.a.sge(i * 8, 8)]).collect();
    let wrs: Vec<SendWr<'_>> = (0..N)
        .map(|i| SendWr {
            wr_id: 1000 + i as u64,
            op: if i % 2 == 0 {
                SendOp::Send
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: baddr + 65536 + i as u64 * 8,
                    rkey: brkey,
                    imm: i as u32,
                }
            },
            sges: &sges[i],
            flags: SendFlags::SIGNALED,
        })
        .collect();
    p.a.qp.post_send(&wrs).unwrap();
    let wb = p.b.poll(N, TIMEOUT);
    assert_eq!(wb.len(), N);
    for (i, w) in wb.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success), "receive {i}");
        if i % 2 == 0 {
            assert_eq!(w.opcode, WcOpcode::Recv);
            assert_eq!(p.b.read(i * 64, 8), vec![i as u8 + 1; 8]);
        } else {
            assert_eq!((w.opcode, w.imm_data), (WcOpcode::RecvRdmaWithImm, Some(i as u32)));
            assert_eq!(p.b.read(65536 + i * 8, 8), vec![i as u8 + 1; 8]);
        }
    }
    let wa = p.a.poll_n(N, TIMEOUT);
    let ids: Vec<u64> = wa.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (1000..1000 + N as u64).collect::<Vec<_>>(), "requester completions in order");
}

/// No receive posted: RNR retries, then RNR_RETRY_EXC_ERR; the QP goes to ERR and every other
/// outstanding work request (signaled or not) flushes exactly once.
fn rnr_then_flush<V: TestProvider>(p: &mut Pair<V>) {
    let pa = Params { rnr_retry: 2, ..Params::default() };
    p.connect(pa, Params { min_rnr_timer: 1, ..Params::default() });
    let (baddr, brkey, _) = p.b.buf();
    let rnr_before = p.a.ctx.counters().rnr_retries;
    let a = &p.a;
    let s = [a.sge(0, 64)];
    a.post(1, SendOp::Send, &s, SendFlags::SIGNALED).unwrap();
    a.post(2, SendOp::RdmaWrite { remote_addr: baddr, rkey: brkey }, &s, SendFlags::NONE).unwrap();
    a.post(3, SendOp::Send, &s, SendFlags::SIGNALED).unwrap();
    a.post(4, SendOp::RdmaRead { remote_addr: baddr, rkey: brkey }, &s, SendFlags::SIGNALED).unwrap();
    let w = a.poll_n(4, TIMEOUT);
    assert_eq!(
        statuses(&w),
        [
            (1, WcStatus::RnrRetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert!(a.poll_n(1, QUIET).is_empty(), "each work request completes exactly once");
    assert_eq!(a.qp.state(), QpState::Err);
    if V::NAME == "soft" {
        // Providers that count RNR retries per context count these; others say None.
        if let (Some(after), Some(before)) = (a.ctx.counters().rnr_retries, rnr_before) {
            assert_eq!(after - before, 2, "rnr_retry = 2 retries");
        }
    }
    // Posting on a QP in ERR completes at once with a flush.
    a.post(5, SendOp::Send, &s, SendFlags::NONE).unwrap();
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(5, WcStatus::WrFlushErr)]);
}

/// Wrong rkey, out-of-bounds range, missing access right and a deregistered MR are all refused
/// with REM_ACCESS_ERR, and not one byte of the target's memory changes.
fn remote_access_errors<V: TestProvider>(p: &mut Pair<V>) {
    const PAT: u8 = 0xAB;
    p.b.fill(0, BUF, PAT);
    let (baddr, brkey, blen) = p.b.buf();
    let ro = p.b.reg(4096, 4096, AccessFlags::REMOTE_READ);
    let wo = p.b.reg(8192, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let gone =
        p.b.reg(16384, 4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
    p.b.dereg(gone);
    p.a.buf[..8192].fill(0x01);
    let cases: [(&str, SendOp, usize); 6] = [
        ("wrong rkey", SendOp::RdmaWrite { remote_addr: baddr, rkey: brkey ^ 0x5a5a }, 64),
        ("out of bounds", SendOp::RdmaWrite { remote_addr: baddr + blen - 16, rkey: brkey }, 64),
        ("no REMOTE_WRITE", SendOp::RdmaWrite { remote_addr: baddr + 4096, rkey: ro }, 64),
        ("no REMOTE_READ", SendOp::RdmaRead { remote_addr: baddr + 8192, rkey: wo }, 64),
        ("deregistered", SendOp::RdmaWrite { remote_addr: baddr + 16384, rkey: gone }, 64),
        ("deregistered read", SendOp::RdmaRead { remote_addr: baddr + 16384, rkey: gone }, 64),
    ];
    for (what, op, len) in cases {
        p.reconnect(Params::default(), Params::default());
        let a = &p.a;
        a.post(7, op, &[a.sge(0, len)], SendFlags::SIGNALED).unwrap();
        assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(7, WcStatus::RemAccessErr)], "{what}");
        assert_eq!(a.qp.state(), QpState::Err, "{what}");
    }
    assert!(p.b.read(0, BUF).iter().all(|&b| b == PAT), "target memory must be untouched");
    assert!(p.a.buf[..8192].iter().all(|&b| b == 0x01), "failed reads must not write locally");
}

/// A receive too small for the SEND: LOC_LEN_ERR at the target (its QP to ERR, other receives
/// flushed) and REM_INV_REQ_ERR at the initiator.
fn loc_len_err<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    p.b.post_recv(10, &[(0, 16)]).unwrap();
    p.b.post_recv(11, &[(4096, 4096)]).unwrap();
    let a = &p.a;
    a.post(1, SendOp::Send, &[a.sge(0, 64)], SendFlags::SIGNALED).unwrap();
    assert_eq!(statuses(&p.b.poll(2, TIMEOUT)), [(10, WcStatus::LocLenErr), (11, WcStatus::WrFlushErr)]);
    assert_eq!(statuses(&p.a.poll_n(1, TIMEOUT)), [(1, WcStatus::RemInvReqErr)]);
    assert_eq!(p.b.state(), QpState::Err);
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// Unsignaled work requests complete silently on success and loudly on error.
fn unsignaled_completions<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let (baddr, brkey, _) = p.b.buf();
    p.b.post_recv(1, &[(0, 64)]).unwrap();
    p.a.buf[..64].fill(0x42);
    let a = &p.a;
    let s = [a.sge(0, 64)];
    for i in 0..3u64 {
        let op = SendOp::RdmaWrite { remote_addr: baddr + 4096 + i * 64, rkey: brkey };
        a.post(100 + i, op, &s, SendFlags::NONE).unwrap();
    }
    a.post(200, SendOp::Send, &s, SendFlags::SIGNALED).unwrap();
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(200, WcStatus::Success)]);
    assert!(a.poll_n(1, QUIET).is_empty(), "unsignaled successes produce nothing");
    assert_eq!(p.b.read(4096, 192), vec![0x42; 192]);
    assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
    let a = &p.a;
    a.post(300, SendOp::RdmaWrite { remote_addr: baddr, rkey: brkey ^ 0x77 }, &s, SendFlags::NONE).unwrap();
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(300, WcStatus::RemAccessErr)], "errors always complete");
}

/// A gather list of max_sge entries lands in a scatter list of max_sge entries in order; one
/// entry more is refused at post time and produces no completion.
fn sge_limits<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let n = p.a.qp.cap().max_send_sge as usize;
    let nr = p.a.qp.cap().max_recv_sge as usize;
    assert!(n >= 2 && nr >= n);
    for i in 0..n {
        p.a.buf[i * 100..i * 100 + 3].fill(i as u8 + 1);
    }
    let rs: Vec<(usize, usize)> = (0..n).map(|i| (5000 + i * 10, 3)).collect();
    p.b.post_recv(1, &rs).unwrap();
    let too_many: Vec<(usize, usize)> = (0..nr + 1).map(|i| (i * 10, 1)).collect();
    assert!(p.b.post_recv(2, &too_many).is_err(), "max_recv_sge + 1 receive must be refused");
    let a = &p.a;
    let sges: Vec<Sge> = (0..n).map(|i| a.sge(i * 100, 3)).collect();
    a.post(1, SendOp::Send, &sges, SendFlags::SIGNALED).unwrap();
    let w = p.b.poll(1, TIMEOUT);
    assert_eq!(statuses(&w), [(1, WcStatus::Success)]);
    assert_eq!(w[0].byte_len as usize, 3 * n);
    for i in 0..n {
        assert_eq!(p.b.read(5000 + i * 10, 3), vec![i as u8 + 1; 3], "SGE {i}");
    }
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(1, WcStatus::Success)]);
    let mut more = sges.clone();
    more.push(a.sge(4000, 1));
    let err = a.post(2, SendOp::Send, &more, SendFlags::SIGNALED).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(err.error, VerbsError::TooManySge { .. }), "{err}");
    assert!(a.poll_n(1, QUIET).is_empty(), "a refused work request never completes");
    assert_eq!(a.qp.state(), QpState::Rts, "an immediate error does not break the QP");
}

/// A SEND posted after an RDMA_READ may overtake it (modelled by the software provider with a
/// delayed read): forwarding the read buffer sends stale data. With FENCE it waits and sends
/// the data read.
fn fence_orders_read<V: TestProvider>(p: &mut Pair<V>) {
    let (baddr, brkey, _) = p.b.buf();
    p.b.fill(0, 4096, 0x5A);
    let run = |fence: bool, faults: bool, p: &mut Pair<V>| -> Option<Vec<u8>> {
        p.reconnect(Params::default(), Params::default());
        if faults
            && !p.a.ctx.inject(p.a.qp.qp_num(), FaultPlan::delayed_reads(Duration::from_millis(30), false))
        {
            return None;
        }
        p.a.buf[..4096].fill(0);
        p.b.post_recv(1, &[(8192, 4096)]).unwrap();
        let a = &p.a;
        let l = [a.sge(0, 4096)];
        let flags = if fence { SendFlags::SIGNALED | SendFlags::FENCE } else { SendFlags::SIGNALED };
        // One post: the SEND is processed right behind the READ, however loaded the machine.
        let read = SendWr {
            wr_id: 1,
            op: SendOp::RdmaRead { remote_addr: baddr, rkey: brkey },
            sges: &l,
            flags: SendFlags::SIGNALED,
        };
        a.qp.post_send(&[read, SendWr { wr_id: 2, op: SendOp::Send, sges: &l, flags }]).unwrap();
        assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
        let got = p.b.read(8192, 4096);
        // Requester completions stay in posting order either way.
        assert_eq!(statuses(&p.a.poll_n(2, TIMEOUT)), [(1, WcStatus::Success), (2, WcStatus::Success)]);
        assert!(p.a.buf[..4096].iter().all(|&b| b == 0x5A), "the read landed");
        Some(got)
    };
    // FENCE must always forward the data that was read.
    assert_eq!(run(true, false, p), Some(vec![0x5A; 4096]));
    if let Some(got) = run(true, true, p) {
        assert_eq!(got, vec![0x5A; 4096], "FENCE waits for the delayed read");
        let stale = run(false, true, p).expect("faults injectable");
        assert_eq!(stale, vec![0; 4096], "without FENCE the SEND overtakes the delayed read");
    }
}

/// The peer vanishes (process SIGKILLed, or its QP destroyed in-process) while work requests
/// wait on it: they fail (RETRY_EXC_ERR, then flushes) instead of hanging.
fn peer_vanishes<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let (baddr, brkey, _) = p.b.buf();
    let a = &p.a;
    let s = [a.sge(0, 64)];
    // No receive posted and rnr_retry = 7 (forever): these wait on the peer.
    a.post(1, SendOp::Send, &s, SendFlags::SIGNALED).unwrap();
    a.post(2, SendOp::RdmaWrite { remote_addr: baddr, rkey: brkey }, &s, SendFlags::NONE).unwrap();
    a.post(3, SendOp::Send, &s, SendFlags::SIGNALED).unwrap();
    assert!(a.poll_n(1, QUIET).is_empty(), "RNR with rnr_retry = 7 waits");
    p.b.kill();
    let w = p.a.poll_n(3, TIMEOUT);
    assert_eq!(
        statuses(&w),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)],
        "xproc={}",
        p.xproc
    );
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// The completion channel becomes readable exactly when a completion lands in an armed CQ: not
/// on arming, not on one-sided traffic that produces no completion, and once per arm.
fn channel_wakeup<V: TestProvider>(p: &mut Pair<V>) {
    p.connect(Params::default(), Params::default());
    let a = &p.a;
    a.qp.post_recv(&[RecvWr { wr_id: 100, sges: &[a.sge(0, 64)] }]).unwrap();
    a.cq.req_notify(false).unwrap();
    assert!(a.poll_n(1, Duration::ZERO).is_empty());
    let fd = a.ch.as_raw_fd();
    let woke = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let w2 = Arc::clone(&woke);
    let waiter = std::thread::spawn(move || {
        let mut poll = mio::Poll::new().expect("mio");
        poll.registry()
            .register(&mut mio::unix::SourceFd(&fd), mio::Token(1), mio::Interest::READABLE)
            .expect("register channel fd");
        let mut events = mio::Events::with_capacity(4);
        poll.poll(&mut events, Some(TIMEOUT)).expect("mio poll");
        w2.store(true, Ordering::SeqCst);
        let _ = tx.send(events.iter().any(|e| e.token() == mio::Token(1)));
    });
    // One-sided traffic into A produces no completion at A, so it must not wake the waiter.
    let (aaddr, arkey) = (p.a.addr(4096), p.a.mr.rkey());
    p.b.fill(0, 64, 9);
    p.b.write(1, 0, 64, aaddr, arkey).unwrap();
    assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(1, WcStatus::Success)]);
    std::thread::sleep(QUIET);
    assert!(!woke.load(Ordering::SeqCst), "woken before any completion arrived");
    // A SEND lands in A's armed CQ: the waiter wakes.
    p.b.send(2, 0, 8).unwrap();
    assert_eq!(rx.recv_timeout(TIMEOUT), Ok(true), "the waiter must wake when the CQE lands");
    waiter.join().unwrap();
    let a = &p.a;
    assert_eq!(a.ch.get_event().unwrap(), Some(COOKIE));
    assert_eq!(a.ch.get_event().unwrap(), None);
    assert_eq!(statuses(&a.poll_n(1, TIMEOUT)), [(100, WcStatus::Success)]);
    assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(2, WcStatus::Success)]);
    // Not re-armed: the next completion does not make the channel readable.
    a.qp.post_recv(&[RecvWr { wr_id: 101, sges: &[a.sge(0, 64)] }]).unwrap();
    p.b.send(3, 0, 8).unwrap();
    assert_eq!(statuses(&p.b.poll(1, TIMEOUT)), [(3, WcStatus::Success)]);
    assert_eq!(statuses(&p.a.poll_n(1, TIMEOUT)), [(101, WcStatus::Success)]);
    let mut pfd = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
    // SAFETY: `pfd` is a valid array of one pollfd for the duration of the call.
    let n = unsafe { libc::poll(pfd.as_mut_ptr(), 1, 0) };
    assert_eq!(n, 0, "an unarmed CQ must not signal its channel");
    assert_eq!(p.a.ch.get_event().unwrap(), None);
}

/// Posting and transitions outside the RC state machine fail at once with typed errors.
fn state_machine<V: TestProvider>(p: &mut Pair<V>) {
    let a = &p.a;
    assert_eq!(a.qp.state(), QpState::Reset);
    let e = a.post(1, SendOp::Send, &[], SendFlags::SIGNALED).unwrap_err();
    assert!(matches!(e.error, VerbsError::InvalidState(QpState::Reset)), "{e}");
    assert!(a.qp.post_recv(&[RecvWr { wr_id: 1, sges: &[] }]).is_err(), "no receives in RESET");
    let rts =
        QpTransition::Rts(RtsAttr { sq_psn: 0, timeout: 10, retry_cnt: 1, rnr_retry: 1, max_rd_atomic: 1 });
    assert!(matches!(a.qp.modify(&rts), Err(VerbsError::InvalidTransition { from: QpState::Reset, .. })));
    p.connect(Params::default(), Params::default());
    assert_eq!(p.a.qp.state(), QpState::Rts);
    assert_eq!(p.b.state(), QpState::Rts);
    p.a.qp.modify(&QpTransition::Err).unwrap();
    assert_eq!(p.a.qp.state(), QpState::Err);
}

/// Routes a port refuses, each with a typed error naming the cause, before the QP leaves
/// INIT: a GID index past the table, a port that does not exist, no GRH on an Ethernet (RoCE)
/// port, a path MTU above the port's active MTU. A valid route then connects.
fn route_checks<V: TestProvider>(p: &mut Pair<V>) {
    let a = &p.a;
    let pn = V::port();
    let port = a.ctx.port_attr(pn).expect("the test port");
    if ROCE.get() {
        assert_eq!(port.link_layer, LinkLayer::Ethernet, "the RoCE variant runs on an Ethernet port");
    }
    let remote = p.b.info();
    let init = InitAttr {
        port_num: pn,
        pkey_index: 0,
        access: AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
    };
    a.qp.modify(&QpTransition::Init(init)).expect("INIT");
    let rtr = |port_num, gid_index, path_mtu| {
        QpTransition::Rtr(RtrAttr {
            remote,
            path_mtu,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            sl: 0,
            port_num,
            gid_index,
            traffic_class: 0,
        })
    };
    let ok_gid = a.route.map(|e| e.index);
    if let Ok(past) = u8::try_from(port.gid_tbl_len) {
        match a.qp.modify(&rtr(pn, Some(past), Mtu::Mtu256)) {
            Err(VerbsError::Fabric(FabricError::NoSuchGid { port, index, .. })) => {
                assert_eq!((port, index), (pn, u32::from(past)))
            }
            other => panic!("GID index {past} past a table of {}: {other:?}", port.gid_tbl_len),
        }
    }
    let ports = a.ctx.attr().phys_port_cnt;
    match a.qp.modify(&rtr(ports + 1, ok_gid, Mtu::Mtu256)) {
        Err(VerbsError::Fabric(FabricError::NoSuchPort { port, .. })) => assert_eq!(port, ports + 1),
        other => panic!("port {}: {other:?}", ports + 1),
    }
    if port.link_layer == LinkLayer::Ethernet {
        match a.qp.modify(&rtr(pn, None, Mtu::Mtu256)) {
            Err(e @ VerbsError::Fabric(FabricError::GrhRequired { .. })) => {
                assert!(e.to_string().contains("GRH"), "{e}")
            }
            other => panic!("RoCE without a GRH: {other:?}"),
        }
    }
    if port.active_mtu < Mtu::Mtu4096 {
        match a.qp.modify(&rtr(pn, ok_gid, Mtu::Mtu4096)) {
            Err(VerbsError::Fabric(FabricError::MtuAbovePort { requested: 4096, active, .. })) => {
                assert_eq!(active, port.active_mtu.bytes())
            }
            other => panic!("path MTU 4096 on a port of {:?}: {other:?}", port.active_mtu),
        }
    }
    assert_eq!(a.qp.state(), QpState::Init, "refused transitions leave the QP where it was");
    // The same QP then connects on a valid route and carries data.
    data_paths(p);
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod soft_inproc {
            $(#[test] fn $name() { super::$name(&mut super::Pair::<ionet::internals::ib::soft::SoftContext>::inproc()); })*
        }
        mod soft_xproc {
            $(#[test] fn $name() { super::$name(&mut super::Pair::<ionet::internals::ib::soft::SoftContext>::xproc()); })*
        }
        mod soft_roce_inproc {
            $(#[test] fn $name() {
                super::over_roce(|| super::$name(&mut super::Pair::<ionet::internals::ib::soft::SoftContext>::inproc()));
            })*
        }
        mod soft_roce_xproc {
            $(#[test] fn $name() {
                super::over_roce(|| super::$name(&mut super::Pair::<ionet::internals::ib::soft::SoftContext>::xproc()));
            })*
        }
        /// The whole suite on the hardware provider, or a printed reason why not.
        #[test]
        fn hw_conformance() {
            hw::run(&[$((stringify!($name), hw::$name as fn()),)*]);
        }
        #[cfg(feature = "verbs")]
        mod hw {
            use ionet::internals::ib::hw::{HwContext, HwProvider};
            use ionet::internals::ib::verbs::Provider;
            $(pub(super) fn $name() { super::$name(&mut super::Pair::<HwContext>::xproc()); })*
            pub(super) fn run(tests: &[(&str, fn())]) {
                match HwProvider::new().devices() {
                    Ok(d) if !d.is_empty() => {
                        for (name, t) in tests {
                            eprintln!("hw conformance: {name}");
                            t();
                        }
                    }
                    Ok(_) => super::skipped("the hardware provider lists no RDMA device"),
                    Err(e) => super::skipped(&e.to_string()),
                }
            }
        }
        #[cfg(not(feature = "verbs"))]
        mod hw {
            $(pub(super) fn $name() {})*
            pub(super) fn run(_: &[(&str, fn())]) {
                super::skipped("cargo feature `verbs` is off, so the hardware provider is not built");
            }
        }
    };
}

/// Reports a skipped hardware run where `cargo test` shows it (bypassing output capture).
fn skipped(why: &str) {
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED hw_conformance: {why}");
}

suite!(
    data_paths,
    rc_ordering,
    rnr_then_flush,
    remote_access_errors,
    loc_len_err,
    unsignaled_completions,
    sge_limits,
    fence_orders_read,
    peer_vanishes,
    channel_wakeup,
    state_machine,
    route_checks,
);

//! `verbs-perf`: micro-benchmarks of a verbs provider, in one run.
//!
//! ```text
//! verbs-perf [--runs N] [--quick] [--no-thp] [--hw]
//! ```
//!
//! By default the software provider (`softib`) is measured. `--hw` (build with
//! `--features verbs`) measures the hardware provider instead, like perftest's `ib_write_bw`,
//! `ib_read_bw` and `ib_send_lat` run against a peer on the same host: both processes open the
//! device `IONET_IB_DEVICE` names (`name[:port]`; default the first device, port 1) and
//! connect through the HCA, with a GRH to a RoCE v2 GID on an Ethernet port. The registration
//! table (the software provider's pinning methods) is skipped then.
//!
//! Measures, with a peer in a second process (this binary re-executed with `--peer`):
//! - RDMA_WRITE and RDMA_READ bandwidth at 64 KiB, 1 MiB and 16 MiB against a single-thread
//!   `memcpy` of the same sizes measured in the same run (ratio = RDMA / memcpy);
//! - the initiator's CPU cost of one 64 B SEND;
//! - the 64 B SEND/RECV round trip with spin polling (pure, and yielding after an empty poll)
//!   and with the completion channel (block);
//! - the cost of registering + deregistering 4 KiB … 64 MiB (`mlock`/`munlock`), on 4 KiB
//!   pages and on transparent huge pages.
//!
//! `--quick` divides the work by 8 (smoke test); `--no-thp` keeps the bandwidth buffers on
//! 4 KiB pages; `--rt` (needs root) adds round-trip rows measured with the two processes pinned
//! to CPUs 0 and 1 under SCHED_FIFO, for machines whose CPUs are shared with other busy
//! processes (only those rows run real-time, about 2 s). `--only-write SIZE`, `--only-send`,
//! `--only-pp` and `--only-pp-inproc` run one loop (profiling aids).
//!
//! Every figure is the median of `--runs` (default 5) repetitions with the min–max spread.
//! Buffers are pre-faulted and reused (first touch costs ~2.5 s/GiB on the reference VM).
//! Prints Markdown tables.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ionet::internals::ib::soft::{PinMethod, SoftConfig, SoftContext, SoftProvider};
use ionet::internals::ib::verbs::*;

/// A provider this tool can open a context of.
trait Open: Verbs {
    /// Its name in the report.
    const NAME: &'static str;
    /// Opens the device to measure; the port to use.
    fn open_dev() -> Res<(Self, u8)>;
}

impl Open for SoftContext {
    const NAME: &'static str = "software provider, `softib`";
    fn open_dev() -> Res<(Self, u8)> {
        Ok((SoftProvider::new(SoftConfig::default()).open(None)?, 1))
    }
}

#[cfg(feature = "verbs")]
impl Open for ionet::internals::ib::hw::HwContext {
    const NAME: &'static str = "hardware provider";
    fn open_dev() -> Res<(Self, u8)> {
        // `name[:port]`, as the engine reads it.
        let sel = std::env::var("IONET_IB_DEVICE").ok().filter(|v| !v.is_empty());
        let (dev, port) = match sel.as_deref().map(|v| v.split_once(':').unwrap_or((v, "1"))) {
            Some((d, p)) => {
                (Some(d.to_string()), p.parse::<u8>().map_err(|_| format!("IONET_IB_DEVICE port {p:?}"))?)
            }
            None => (None, 1),
        };
        Ok((ionet::internals::ib::hw::HwProvider::new().open(dev.as_deref())?, port))
    }
}

const MAX_BW: usize = 16 << 20;
const PP_LEN: usize = 64;
const PP_RECVS: u64 = 64;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One side: a context with one CQ (on a channel), one RC QP and one registered buffer.
struct Side<V: Verbs> {
    ctx: V,
    ch: V::Channel,
    cq: V::Cq,
    qp: V::Qp,
    mr: V::Mr,
    _pd: V::Pd,
    psn: u32,
    port: u8,
    /// The source GID of the route (Ethernet ports), as the engine picks it.
    route: Option<GidEntry>,
    buf: memmap2::MmapMut,
}

impl<V: Open> Side<V> {
    fn new(len: usize, psn: u32) -> Res<Side<V>> {
        let (ctx, port) = V::open_dev()?;
        let route = default_route(&ctx, port, IpFamily::V4)?;
        let pd = ctx.alloc_pd()?;
        let ch = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(4096, Some(&ch), 1)?;
        let cap = QpCap { max_send_wr: 1024, max_recv_wr: 1024, ..QpCap::default() };
        let qp =
            ctx.create_qp(&pd, &QpInit { send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })?;
        let mut buf = prefaulted(len);
        // SAFETY: `buf` lives in the same `Side` and is dropped after `mr` (field order), and
        // this program only reads or writes it while no work request on it is outstanding.
        let mr = unsafe { ctx.reg_mr(&pd, buf.as_mut_ptr(), buf.len(), AccessFlags::ALL)? };
        Ok(Side { ctx, ch, cq, qp, mr, _pd: pd, psn, port, route, buf })
    }
}

impl<V: Verbs> Side<V> {
    fn info(&self) -> Res<QpEndpointInfo> {
        let mut info = QpEndpointInfo::local(&self.qp, &self.ctx.port_attr(self.port)?, self.psn);
        if let Some(e) = self.route {
            info.gid = e.gid;
        }
        Ok(info)
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge::new(self.buf.as_ptr() as u64 + off as u64, len as u32, self.mr.lkey())
    }

    fn post_recv(&self, wr_id: u64) -> Res<()> {
        self.qp.post_recv(&[RecvWr { wr_id, sges: &[self.sge(0, PP_LEN)] }])?;
        Ok(())
    }

    /// Waits for one completion, spinning or blocking on the channel.
    fn wait_one(&self, wait: Wait) -> Res<WorkCompletion> {
        let block = wait == Wait::Block;
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            if self.cq.poll(&mut wc)? == 1 {
                if !wc[0].status.is_success() {
                    return Err(format!("work completion failed: {:?}", wc[0]).into());
                }
                return Ok(wc[0]);
            }
            if wait == Wait::SpinYield {
                std::thread::yield_now();
            }
            if block {
                self.cq.req_notify(false)?;
                if self.cq.poll(&mut wc)? == 1 {
                    return Ok(wc[0]);
                }
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&self.ch),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: `pfd` is a valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
                while self.ch.get_event()?.is_some() {}
            }
        }
    }
}

/// How a side waits for a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Busy-poll the CQ.
    Spin,
    /// Busy-poll, calling `sched_yield` after an empty poll: never sleeps, but lets the peer
    /// run when the CPUs are oversubscribed.
    SpinYield,
    /// Arm the CQ and sleep in `poll(2)` on the completion channel.
    Block,
}

impl Wait {
    fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::SpinYield => "yield",
            Wait::Block => "block",
        }
    }

    fn parse(s: &str) -> Wait {
        match s {
            "block" => Wait::Block,
            "yield" => Wait::SpinYield,
            _ => Wait::Spin,
        }
    }
}

/// Whether buffers ask for transparent huge pages (`--no-thp` turns it off).
static THP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Anonymous memory with every page written (pre-faulted), on transparent huge pages unless
/// `--no-thp`: fewer pages for the kernel to pin per `process_vm_*` call, and for `mlock`.
fn prefaulted(len: usize) -> memmap2::MmapMut {
    prefaulted_pages(len, THP.load(std::sync::atomic::Ordering::Relaxed))
}

fn prefaulted_pages(len: usize, thp: bool) -> memmap2::MmapMut {
    let mut m = memmap2::MmapMut::map_anon(len).expect("mmap");
    if thp {
        let _ = m.advise(memmap2::Advice::HugePage);
    }
    for i in (0..len).step_by(4096) {
        m[i] = 1;
    }
    m
}

fn bring_up_with<V: Verbs>(side: &Side<V>, remote: &QpEndpointInfo) -> Res<()> {
    let active = side.ctx.port_attr(side.port)?.active_mtu;
    let p = ConnParams {
        min_rnr_timer: 1,
        port_num: side.port,
        gid_index: side.route.map(|e| e.index),
        // Both ends are on this host's port: its active MTU is the path's.
        path_mtu: active,
        ..ConnParams::default()
    };
    bring_up(&side.qp, &side.info()?, remote, &p)?;
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()).collect()
}

// ---------------------------------------------------------------------------------------------
// Peer process

fn peer_main<V: Open>() -> Res<()> {
    let side = Side::<V>::new(MAX_BW, 0x2222)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{} {} {}", hex(&side.info()?.encode()), side.buf.as_ptr() as u64, side.mr.rkey())?;
    out.flush()?;
    let mut lines = std::io::stdin().lock().lines();
    let first = lines.next().ok_or("no peer info")??;
    let remote = QpEndpointInfo::decode(&unhex(first.trim()))?;
    bring_up_with(&side, &remote)?;
    for i in 0..PP_RECVS {
        side.post_recv(i)?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    for line in lines {
        let line = line?;
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["pp", mode, n] => {
                let n: u64 = n.parse()?;
                let wait = Wait::parse(mode);
                let mut sent = 0;
                while sent < n {
                    let wc = side.wait_one(wait)?;
                    if wc.opcode.is_recv() {
                        side.post_recv(wc.wr_id)?;
                        let flags = SendFlags::SIGNALED | SendFlags::INLINE;
                        side.qp.post_send(&[SendWr {
                            wr_id: sent,
                            op: SendOp::Send,
                            sges: &[side.sge(4096, PP_LEN)],
                            flags,
                        }])?;
                        sent += 1;
                    }
                }
                // Drain the remaining send completions so the next round starts clean.
                let mut wcs = [WorkCompletion::default(); 64];
                let deadline = Instant::now() + Duration::from_millis(50);
                while Instant::now() < deadline {
                    side.cq.poll(&mut wcs)?;
                }
                writeln!(out, "done")?;
                out.flush()?;
            }
            ["recvs", n] => {
                for i in 0..n.parse::<u64>()? {
                    side.post_recv(1000 + i)?;
                }
                writeln!(out, "ok")?;
                out.flush()?;
            }
            ["drain", n] => {
                let n: u64 = n.parse()?;
                let mut got = 0;
                let mut wcs = [WorkCompletion::default(); 64];
                while got < n {
                    got += side.cq.poll(&mut wcs)? as u64;
                }
                writeln!(out, "ok")?;
                out.flush()?;
            }
            ["rt", v] => {
                pin_cpu((*v == "1").then_some(1));
                set_fifo(*v == "1");
                writeln!(out, "ok")?;
                out.flush()?;
            }
            ["exit"] => break,
            _ => return Err(format!("bad command {line:?}").into()),
        }
    }
    Ok(())
}

struct Peer {
    child: Child,
    tx: ChildStdin,
    rx: BufReader<ChildStdout>,
}

impl Peer {
    fn line(&mut self) -> Res<String> {
        let mut s = String::new();
        if self.rx.read_line(&mut s)? == 0 {
            return Err("peer exited".into());
        }
        Ok(s.trim().to_string())
    }

    fn cmd(&mut self, c: &str) -> Res<()> {
        writeln!(self.tx, "{c}")?;
        self.tx.flush()?;
        Ok(())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.cmd("exit");
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements

/// Median, min, max.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s[s.len() / 2], s[0], s[s.len() - 1])
}

fn gib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / (1u64 << 30) as f64
}

fn memcpy_bw(src: &[u8], dst: &mut [u8], size: usize, iters: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..iters {
        dst[..size].copy_from_slice(&src[..size]);
        std::hint::black_box(&mut dst[..size]);
    }
    gib_s((size * iters) as u64, t0.elapsed())
}

fn rdma_bw<V: Verbs>(side: &Side<V>, op: SendOp, size: usize, iters: usize) -> Res<f64> {
    const SIGNAL_EVERY: usize = 16;
    let mut outstanding = 0usize;
    let mut wcs = [WorkCompletion::default(); 16];
    let t0 = Instant::now();
    for i in 0..iters {
        let signaled = (i + 1) % SIGNAL_EVERY == 0 || i + 1 == iters;
        let flags = if signaled { SendFlags::SIGNALED } else { SendFlags::NONE };
        side.qp.post_send(&[SendWr { wr_id: i as u64, op, sges: &[side.sge(0, size)], flags }])?;
        if signaled {
            outstanding += 1;
        }
        while outstanding > 4 || (i + 1 == iters && outstanding > 0) {
            let n = side.cq.poll(&mut wcs)?;
            for w in &wcs[..n] {
                if !w.status.is_success() {
                    return Err(format!("RDMA failed: {w:?}").into());
                }
            }
            outstanding -= n;
        }
    }
    Ok(gib_s((size * iters) as u64, t0.elapsed()))
}

/// Round trips between two contexts of this process (threads): the provider's own cost, with
/// no `process_vm_*` system call (same-process copies are `memmove`).
fn pingpong_inproc(wait: Wait, n: u64) -> Res<f64> {
    let a = Side::<SoftContext>::new(1 << 20, 0x3333)?;
    let (tx_info, rx_info) = std::sync::mpsc::channel::<QpEndpointInfo>();
    let (tx_b, rx_b) = std::sync::mpsc::channel::<QpEndpointInfo>();
    let (tx_ready, rx_ready) = std::sync::mpsc::channel::<()>();
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let e = |x: Box<dyn std::error::Error>| x.to_string();
        let b = Side::<SoftContext>::new(1 << 20, 0x4444).map_err(e)?;
        tx_b.send(b.info().map_err(e)?).map_err(|x| x.to_string())?;
        let ra = rx_info.recv().map_err(|x| x.to_string())?;
        bring_up_with(&b, &ra).map_err(e)?;
        for i in 0..PP_RECVS {
            b.post_recv(i).map_err(e)?;
        }
        tx_ready.send(()).map_err(|x| x.to_string())?;
        let mut sent = 0;
        while sent < n {
            let wc = b.wait_one(wait).map_err(e)?;
            if wc.opcode.is_recv() {
                b.post_recv(wc.wr_id).map_err(e)?;
                let flags = SendFlags::SIGNALED | SendFlags::INLINE;
                b.qp.post_send(&[SendWr {
                    wr_id: sent,
                    op: SendOp::Send,
                    sges: &[b.sge(4096, PP_LEN)],
                    flags,
                }])
                .map_err(|x| x.to_string())?;
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    });
    let rb = rx_b.recv()?;
    tx_info.send(a.info()?)?;
    bring_up_with(&a, &rb)?;
    for i in 0..PP_RECVS {
        a.post_recv(i)?;
    }
    rx_ready.recv()?;
    let t0 = Instant::now();
    let flags = SendFlags::SIGNALED | SendFlags::INLINE;
    let (mut got, mut sent) = (0, 0u64);
    a.qp.post_send(&[SendWr { wr_id: 0, op: SendOp::Send, sges: &[a.sge(4096, PP_LEN)], flags }])?;
    sent += 1;
    while got < n {
        let wc = a.wait_one(wait)?;
        if wc.opcode.is_recv() {
            got += 1;
            a.post_recv(wc.wr_id)?;
            if sent < n {
                a.qp.post_send(&[SendWr {
                    wr_id: sent,
                    op: SendOp::Send,
                    sges: &[a.sge(4096, PP_LEN)],
                    flags,
                }])?;
                sent += 1;
            }
        }
    }
    let rtt = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    echo.join().map_err(|_| "echo thread panicked")??;
    Ok(rtt)
}

fn pingpong<V: Verbs>(side: &Side<V>, peer: &mut Peer, wait: Wait, n: u64) -> Res<f64> {
    peer.cmd(&format!("pp {} {n}", wait.name()))?;
    let t0 = Instant::now();
    let mut got = 0;
    let mut sent = 0u64;
    let flags = SendFlags::SIGNALED | SendFlags::INLINE;
    side.qp.post_send(&[SendWr { wr_id: sent, op: SendOp::Send, sges: &[side.sge(4096, PP_LEN)], flags }])?;
    sent += 1;
    while got < n {
        let wc = side.wait_one(wait)?;
        if wc.opcode.is_recv() {
            got += 1;
            side.post_recv(wc.wr_id)?;
            if sent < n {
                side.qp.post_send(&[SendWr {
                    wr_id: sent,
                    op: SendOp::Send,
                    sges: &[side.sge(4096, PP_LEN)],
                    flags,
                }])?;
                sent += 1;
            }
        }
    }
    let rtt_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    if peer.line()? != "done" {
        return Err("peer did not finish the ping-pong".into());
    }
    let mut wcs = [WorkCompletion::default(); 64];
    while side.cq.poll(&mut wcs)? > 0 {}
    Ok(rtt_us)
}

/// Pins this process to one CPU, or (`None`) lets it run on all (best effort).
fn pin_cpu(cpu: Option<usize>) {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: `set` is a plain bitmask we initialise before passing its address and size.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        match cpu {
            Some(c) => libc::CPU_SET(c, &mut set),
            None => (0..all.min(libc::CPU_SETSIZE as usize)).for_each(|c| libc::CPU_SET(c, &mut set)),
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        eprintln!("sched_setaffinity({cpu:?}): {}", std::io::Error::last_os_error());
    }
}

/// Switches this process between SCHED_FIFO priority 1 and SCHED_OTHER (needs root or
/// CAP_SYS_NICE; best effort). The kernel's RT throttling still leaves other tasks 5 %.
fn set_fifo(on: bool) {
    let param = libc::sched_param { sched_priority: i32::from(on) };
    let policy = if on { libc::SCHED_FIFO } else { libc::SCHED_OTHER };
    // SAFETY: sched_setscheduler on our own process with a valid, initialised parameter.
    let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if rc != 0 {
        eprintln!("sched_setscheduler(FIFO={on}): {}", std::io::Error::last_os_error());
    }
}

/// Initiator CPU time per 64 B inline SEND, the peer idle (its receives pre-posted).
fn send_cost<V: Verbs>(side: &Side<V>, peer: &mut Peer, n: u64, peer_polls: bool) -> Res<f64> {
    peer.cmd(&format!("recvs {n}"))?;
    if peer.line()? != "ok" {
        return Err("peer recvs".into());
    }
    if peer_polls {
        // The peer busy-polls its CQ while we send (shared cache lines bounce).
        peer.cmd(&format!("drain {n}"))?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut wcs = [WorkCompletion::default(); 64];
    let t0 = Instant::now();
    for i in 0..n {
        let signaled = (i + 1) % 16 == 0;
        let flags = if signaled { SendFlags::SIGNALED | SendFlags::INLINE } else { SendFlags::INLINE };
        side.qp.post_send(&[SendWr {
            wr_id: i,
            op: SendOp::Send,
            sges: &[side.sge(4096, PP_LEN)],
            flags,
        }])?;
        if signaled {
            while side.cq.poll(&mut wcs)? == 0 {}
        }
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    if !peer_polls {
        peer.cmd(&format!("drain {n}"))?;
    }
    if peer.line()? != "ok" {
        return Err("peer drain".into());
    }
    Ok(us)
}

fn reg_cost(ctx: &SoftContext, buf: &mut [u8], size: usize, reps: usize) -> Res<(f64, f64)> {
    let pd = ctx.alloc_pd()?;
    let (mut reg, mut dereg) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let t0 = Instant::now();
        // SAFETY: `buf` outlives the registration, which is dropped within this iteration.
        let mr = unsafe { ctx.reg_mr(&pd, buf.as_mut_ptr(), size, AccessFlags::ALL)? };
        let t1 = Instant::now();
        mr.deregister()?;
        dereg.push((Instant::now() - t1).as_secs_f64() * 1e6);
        reg.push((t1 - t0).as_secs_f64() * 1e6);
    }
    Ok((stats(&reg).0, stats(&dereg).0))
}

/// Registration + deregistration cost by pinning method and page size, as a table.
fn reg_table(runs: usize, scale: usize) -> Res<()> {
    println!("Registration + deregistration of pre-faulted memory, per operation, µs, by pinning method");
    println!(
        "(`io_uring`: a long-term page pin, the kernel call `ibv_reg_mr` makes; `mlock`: the fallback)."
    );
    println!();
    println!("| size | method | 4 KiB pages: register | deregister | THP: register | deregister |");
    println!("|---|---|---|---|---|---|");
    let mut methods = vec![PinMethod::Mlock];
    if PinMethod::Auto.resolved() == PinMethod::IoUring {
        methods.insert(0, PinMethod::IoUring);
    }
    let ctxs: Vec<(PinMethod, SoftContext)> = methods
        .iter()
        .map(|&m| Ok((m, SoftProvider::new(SoftConfig { pin: m, ..SoftConfig::default() }).open(None)?)))
        .collect::<Res<_>>()?;
    let mut small_pages = prefaulted_pages(64 << 20, false);
    let mut huge_pages = prefaulted_pages(64 << 20, true);
    let mut size = 4 << 10;
    while size <= 64 << 20 {
        let reps = ((256usize << 20) / size).clamp(5, 200) / scale.min(4);
        for (m, ctx) in &ctxs {
            let mut cells = Vec::new();
            for buf in [&mut small_pages, &mut huge_pages] {
                let (mut r, mut d) = (Vec::new(), Vec::new());
                for _ in 0..runs {
                    let (a, b) = reg_cost(ctx, buf, size, reps.max(3))?;
                    r.push(a);
                    d.push(b);
                }
                let ((rm, rlo, rhi), (dm, dlo, dhi)) = (stats(&r), stats(&d));
                cells.push(format!("{rm:.1} ({rlo:.1}–{rhi:.1}) | {dm:.1} ({dlo:.1}–{dhi:.1})"));
            }
            println!("| {} | {} | {} | {} |", fmt_size(size), m.name(), cells[0], cells[1]);
        }
        size *= 4;
    }
    Ok(())
}

fn fmt_size(s: usize) -> String {
    if s >= 1 << 20 { format!("{} MiB", s >> 20) } else { format!("{} KiB", s >> 10) }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let r = if args.iter().any(|a| a == "--hw") {
        #[cfg(feature = "verbs")]
        let r = run::<ionet::internals::ib::hw::HwContext>(&args);
        #[cfg(not(feature = "verbs"))]
        let r: Res<()> = Err("--hw needs the hardware provider: build with `--features verbs`".into());
        r
    } else {
        run::<SoftContext>(&args)
    };
    if let Err(e) = r {
        eprintln!("verbs-perf: {e}");
        std::process::exit(1);
    }
}

fn run<V: Open>(args: &[String]) -> Res<()> {
    let hw = args.iter().any(|a| a == "--hw");
    if args.iter().any(|a| a == "--peer") {
        THP.store(!args.iter().any(|a| a == "--no-thp"), std::sync::atomic::Ordering::Relaxed);
        return peer_main::<V>();
    }
    let quick = args.iter().any(|a| a == "--quick");
    let thp = !args.iter().any(|a| a == "--no-thp");
    let rt = args.iter().any(|a| a == "--rt");
    if args.iter().any(|a| a == "--only-reg") {
        let runs =
            args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(5);
        return reg_table(runs, if quick { 4 } else { 1 });
    }
    THP.store(thp, std::sync::atomic::Ordering::Relaxed);
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let scale = if quick { 8 } else { 1 };

    let mut child = Command::new(std::env::current_exe()?)
        .arg("--peer")
        .args(if thp { None } else { Some("--no-thp") })
        .args(if hw { Some("--hw") } else { None })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let tx = child.stdin.take().ok_or("stdin")?;
    let rx = BufReader::new(child.stdout.take().ok_or("stdout")?);
    let mut peer = Peer { child, tx, rx };
    let side = Side::<V>::new(MAX_BW, 0x1111)?;
    let hello = peer.line()?;
    let f: Vec<&str> = hello.split(' ').collect();
    let [info, addr, rkey] = f.as_slice() else { return Err("bad peer hello".into()) };
    let remote = QpEndpointInfo::decode(&unhex(info))?;
    let (raddr, rkey): (u64, u32) = (addr.parse()?, rkey.parse()?);
    bring_up_with(&side, &remote)?;
    for i in 0..PP_RECVS {
        side.post_recv(i)?;
    }
    peer.cmd(&hex(&side.info()?.encode()))?;
    if peer.line()? != "ready" {
        return Err("peer not ready".into());
    }

    if args.iter().any(|a| a == "--only-send") {
        // Profiling aid: only one-way SENDs.
        let mut v = Vec::new();
        let polls = args.iter().any(|a| a == "--peer-polls");
        for _ in 0..2000 {
            v.push(send_cost(&side, &mut peer, 512, polls)?);
        }
        println!("one-way SEND {:.2} µs", stats(&v).0);
        return Ok(());
    }
    if args.iter().any(|a| a == "--only-pp-inproc") {
        println!("in-process spin RTT {:.2} µs", pingpong_inproc(Wait::Spin, 50_000)?);
        println!("in-process spin+yield RTT {:.2} µs", pingpong_inproc(Wait::SpinYield, 50_000)?);
        return Ok(());
    }
    if args.iter().any(|a| a == "--only-pp") {
        // Profiling aid: only the spin ping-pong.
        let rtt = pingpong(&side, &mut peer, Wait::Spin, 50_000)?;
        println!("spin RTT {rtt:.2} µs");
        return Ok(());
    }
    if let Some(i) = args.iter().position(|a| a == "--only-write") {
        // Profiling aid: only the RDMA_WRITE loop at one size.
        let size: usize = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(65536);
        let bw = rdma_bw(&side, SendOp::RdmaWrite { remote_addr: raddr, rkey }, size, (8usize << 30) / size)?;
        println!("RDMA_WRITE {size} B: {bw:.2} GiB/s");
        return Ok(());
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("## verbs-perf ({}), {runs} runs per figure, THP {}", V::NAME, if thp { "on" } else { "off" });
    if let Ok(port) = side.ctx.port_attr(side.port) {
        println!();
        println!(
            "Device {}, port {}: {:?} link layer, active MTU {} B, route {}.",
            side.ctx.device().name,
            side.port,
            port.link_layer,
            port.active_mtu.bytes(),
            side.route.map_or("by LID".to_string(), |e| format!(
                "GRH from GID {} ({}, {:?})",
                e.index, e.gid, e.gid_type
            ))
        );
    }
    println!();
    println!("Cross-process bandwidth, single thread, peer CPU idle (one-sided); buffers pre-faulted.");
    println!();
    // Bandwidth: memcpy, RDMA_WRITE, RDMA_READ interleaved per run, so noise hits all alike.
    let sizes = [64 << 10, 1 << 20, 16 << 20];
    let src = prefaulted(MAX_BW);
    let mut dst = prefaulted(MAX_BW);
    let mut samples = vec![[Vec::new(), Vec::new(), Vec::new()]; sizes.len()];
    for _ in 0..runs {
        for (k, &size) in sizes.iter().enumerate() {
            let iters = ((512usize << 20) / size / scale).max(4);
            samples[k][0].push(memcpy_bw(&src, &mut dst, size, iters));
            samples[k][1].push(rdma_bw(&side, SendOp::RdmaWrite { remote_addr: raddr, rkey }, size, iters)?);
            samples[k][2].push(rdma_bw(&side, SendOp::RdmaRead { remote_addr: raddr, rkey }, size, iters)?);
        }
    }
    println!("| size | memcpy GiB/s | RDMA_WRITE GiB/s | write / memcpy | RDMA_READ GiB/s | read / memcpy |");
    println!("|---|---|---|---|---|---|");
    for (k, &size) in sizes.iter().enumerate() {
        let (m, mlo, mhi) = stats(&samples[k][0]);
        let (w, wlo, whi) = stats(&samples[k][1]);
        let (r, rlo, rhi) = stats(&samples[k][2]);
        println!(
            "| {} | {m:.2} ({mlo:.2}–{mhi:.2}) | {w:.2} ({wlo:.2}–{whi:.2}) | {:.2} | {r:.2} ({rlo:.2}–{rhi:.2}) | {:.2} |",
            fmt_size(size),
            w / m,
            r / m
        );
    }

    println!();
    let mut v = Vec::new();
    for _ in 0..runs {
        v.push(send_cost(&side, &mut peer, 512, false)?);
    }
    let (m, lo, hi) = stats(&v);
    println!(
        "One-way 64 B inline SEND, initiator CPU per SEND (peer idle, receives pre-posted): {m:.2} µs ({lo:.2}–{hi:.2})."
    );
    println!();
    println!("64 B SEND/RECV round trip (inline sends), cross-process; mean RTT per run.");
    println!();
    println!("| wait mode | iterations/run | RTT µs median (min–max) |");
    println!("|---|---|---|");
    let mut modes = vec![
        ("spin (busy poll)", Wait::Spin, false, 20_000u64),
        ("spin (busy poll, sched_yield after an empty poll)", Wait::SpinYield, false, 20_000),
        ("block (completion channel, poll(2))", Wait::Block, false, 2_000),
    ];
    if rt {
        modes.push(("spin, SCHED_FIFO, one CPU per process", Wait::Spin, true, 20_000));
        modes.push(("block, SCHED_FIFO, one CPU per process", Wait::Block, true, 2_000));
    }
    for (label, wait, fifo, n) in modes {
        if fifo {
            // Both processes, for these rows only: the CPUs are shared with other busy
            // processes, which otherwise make a round trip measure the scheduler.
            pin_cpu(Some(0));
            set_fifo(true);
            peer.cmd("rt 1")?;
            if peer.line()? != "ok" {
                return Err("peer rt".into());
            }
        }
        let n = n / scale as u64;
        pingpong(&side, &mut peer, wait, n / 10)?; // warm-up
        let mut v = Vec::new();
        for _ in 0..runs {
            v.push(pingpong(&side, &mut peer, wait, n)?);
        }
        if fifo {
            set_fifo(false);
            pin_cpu(None);
            peer.cmd("rt 0")?;
            if peer.line()? != "ok" {
                return Err("peer rt".into());
            }
        }
        let (m, lo, hi) = stats(&v);
        println!("| {label} | {n} | {m:.2} ({lo:.2}–{hi:.2}) |");
    }

    println!();
    if hw {
        println!("Registration table: software provider only (it compares the provider's pinning methods).");
    } else {
        reg_table(runs, scale)?;
    }
    println!();
    println!(
        "Load average at start: {}; at end: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let c = side.ctx.counters();
    let port = side.ctx.port_counters(side.port).unwrap_or_default();
    let shown = |v: Option<u64>| v.map_or("not exposed".to_string(), |n| n.to_string());
    println!();
    println!(
        "Port counters (device-wide, since the driver loaded): RNR NAK retries {}, ACK timeouts {}, out of sequence {}.",
        shown(port.rnr_nak_retries),
        shown(port.ack_timeouts),
        shown(port.out_of_sequence)
    );
    println!(
        "Counters (initiator): {} registrations ({} ms registering), {:.1} GiB written, {:.1} GiB read one-sided, {} send WRs, {} completions.",
        c.registrations,
        c.reg_ns / 1_000_000,
        c.rdma_write_bytes as f64 / (1u64 << 30) as f64,
        c.rdma_read_bytes as f64 / (1u64 << 30) as f64,
        c.send_wrs_posted,
        c.completions
    );
    Ok(())
}

//! The perf server and client over ionet's Endpoint API.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::{
    Direction, Endpoint, Error, OpId, Payload, PeerId, RecvBuf, RegisteredBuf, Request, Result, SendBuf,
};

use crate::params::{Params, Test, pattern};
use crate::run::RunResult;
use crate::stats;

const TAG_PARAMS: u64 = 1;
const TAG_READY: u64 = 2;
const TAG_DATA: u64 = 3;
const TAG_BACK: u64 = 4;
const TAG_ACK: u64 = 5;

/// Longest any one operation of a run may take: a stuck transport fails the run (and the
/// suite says which) instead of hanging it.
const OP_TIMEOUT: Duration = Duration::from_secs(60);

fn wait_ok(ep: &Endpoint, op: OpId) -> Result<ionet::Completion> {
    match ep.wait_timeout(op, OP_TIMEOUT)? {
        Some(c) => c.ok(),
        None => {
            let _ = ep.cancel(op);
            Err(Error::misuse(format!("no completion within {OP_TIMEOUT:?}: the transport is stuck")))
        }
    }
}

fn take_recv(c: ionet::Completion) -> RecvBuf {
    c.buf.into_recv().unwrap_or_else(|| RecvBuf::Mut(BytesMut::new()))
}

/// A pool buffer of `len` bytes holding `data` (when given).
fn pool_buf(ep: &Endpoint, len: usize, data: Option<&[u8]>) -> Result<RegisteredBuf> {
    let mut b = ep.alloc(len)?;
    b.set_len(len)?;
    if let Some(d) = data {
        b.copy_from_slice(d);
    }
    Ok(b)
}

/// A receive buffer for `p`: from the endpoint's pool, or pre-faulted heap memory kept in
/// `cache` across runs.
fn recv_buf(ep: &Endpoint, p: &Params, cache: &mut BufCache) -> Result<RecvBuf> {
    Ok(if p.pool {
        RecvBuf::Registered(pool_buf(ep, p.size, None)?)
    } else {
        RecvBuf::Mut(cache.take(p.size))
    })
}

/// The payloads a side sends, taken in turn: clones of shared `Bytes` (as many distinct ones
/// as the run's footprint asks for), or pool buffers (not shareable) lent to the sends in
/// flight and given back by their completions.
enum Sends {
    Shared { payloads: Vec<Bytes>, next: usize },
    Pool(VecDeque<RegisteredBuf>),
}

impl Sends {
    fn new(ep: &Endpoint, p: &Params, seed: u64) -> Result<Sends> {
        if !p.pool {
            // Without a footprint every send is a clone of one payload, as the transport's
            // peak is measured; with one, as many distinct payloads as it holds.
            let payloads = if p.verify {
                vec![Bytes::from(pattern(p.size, seed))]
            } else {
                let n = if p.footprint == 0 { 1 } else { p.slots() };
                SEND_PAYLOADS.with_borrow_mut(|c| c.get(p.size, n))
            };
            return Ok(Sends::Shared { payloads, next: 0 });
        }
        let data = if p.verify { pattern(p.size, seed) } else { vec![0u8; p.size] };
        let bufs = (0..p.slots()).map(|_| pool_buf(ep, p.size, Some(&data))).collect::<Result<_>>()?;
        Ok(Sends::Pool(bufs))
    }

    fn take(&mut self) -> SendBuf {
        match self {
            Sends::Shared { payloads, next } => {
                let b = payloads[*next].clone();
                *next = (*next + 1) % payloads.len();
                SendBuf::Bytes(b)
            }
            Sends::Pool(v) => SendBuf::Registered(v.pop_front().expect("one buffer per send in flight")),
        }
    }

    /// Waits for a send and takes its buffer back (to the end of the line).
    fn wait(&mut self, ep: &Endpoint, op: OpId) -> Result<()> {
        let c = wait_ok(ep, op)?;
        if let (Sends::Pool(v), Some(SendBuf::Registered(b))) = (self, c.buf.into_send()) {
            v.push_back(b);
        }
        Ok(())
    }
}

thread_local! {
    /// Send payloads kept across runs, so a draw with a large footprint does not pay the first
    /// touch of fresh memory for it every time.
    static SEND_PAYLOADS: std::cell::RefCell<PayloadCache> = std::cell::RefCell::default();
}

/// Pre-faulted payloads of one size (another size replaces them).
#[derive(Default)]
struct PayloadCache {
    size: usize,
    payloads: Vec<Bytes>,
}

impl PayloadCache {
    /// `n` distinct payloads of `size` bytes.
    fn get(&mut self, size: usize, n: usize) -> Vec<Bytes> {
        if self.size != size {
            *self = PayloadCache { size, payloads: Vec::new() };
        }
        while self.payloads.len() < n {
            self.payloads.push(Bytes::from(Vec::from(prefaulted(size))));
        }
        self.payloads[..n].to_vec()
    }
}

/// A pre-faulted buffer: first touch of fresh memory costs ~2.5 s/GiB on the reference VM, so
/// measurements must never pay it.
fn prefaulted(len: usize) -> BytesMut {
    let mut b = BytesMut::zeroed(len);
    for i in (0..len).step_by(4096) {
        b[i] = 1;
    }
    b
}

/// Receive buffers kept across runs, by size.
#[derive(Default)]
struct BufCache(Vec<BytesMut>);

impl BufCache {
    fn take(&mut self, len: usize) -> BytesMut {
        match self.0.iter().position(|b| b.len() == len) {
            Some(i) => self.0.swap_remove(i),
            None => prefaulted(len),
        }
    }
    fn give(&mut self, b: RecvBuf) {
        let RecvBuf::Mut(b) = b else { return };
        // Bound what is kept: the largest window or footprint of the largest size is enough.
        if self.0.len() < 1024 {
            self.0.push(b);
        }
    }
}

/// Serves perf tests until the process is killed.
pub fn serve(ep: &Endpoint) -> Result<()> {
    let mut cache = BufCache::default();
    loop {
        let Some(u) = ep.recv_unexpected(None)? else { continue };
        if u.tag != TAG_PARAMS {
            continue;
        }
        let p = match Params::decode(&u.data) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("ionet-perf server: bad parameters from {}: {e}", u.peer);
                continue;
            }
        };
        if let Err(e) = serve_one(ep, u.peer, &p, &mut cache) {
            eprintln!("ionet-perf server: run failed: {e}");
        }
    }
}

/// How a test other than a read moves its messages: one at a time there and back, a window
/// at a time one way (both ways for bibw) with an ack per window, or a window kept in flight
/// one way with an ack at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    PingPong,
    Stream,
    Rolling,
}

fn serve_one(ep: &Endpoint, peer: PeerId, p: &Params, cache: &mut BufCache) -> Result<()> {
    let mut sends = Sends::new(ep, p, 2)?;
    let flow = match p.test {
        Test::Read => {
            wait_ok(ep, ep.send(peer, TAG_READY, Bytes::new(), p.sl)?)?;
            return serve_reads(ep, peer, p, &mut sends);
        }
        Test::Lat => Flow::PingPong,
        Test::Bw | Test::Msgrate | Test::Bibw => Flow::Stream,
        Test::Stream => Flow::Rolling,
    };
    let n = match flow {
        Flow::PingPong => 1,
        Flow::Stream => p.window,
        Flow::Rolling => p.window.min(p.iters),
    };
    // Receive buffers in line: the `n` at the front are posted, each completed one goes to
    // the back, so a footprint of more than `n` buffers is cycled through.
    let mut free: VecDeque<RecvBuf> =
        (0..p.slots()).map(|_| recv_buf(ep, p, cache)).collect::<Result<_>>()?;
    let mut rbufs: Vec<RecvBuf> = free.drain(..n).collect();
    let expect = p.verify.then(|| pattern(p.size, 1));
    // Post the first receives before saying ready, so nothing arrives early.
    let mut pending: Vec<OpId> = Vec::new();
    for b in rbufs.drain(..) {
        pending.push(ep.recv(peer, TAG_DATA, b)?);
    }
    wait_ok(ep, ep.send(peer, TAG_READY, Bytes::new(), p.sl)?)?;
    let check = |c: &ionet::Completion| -> Result<()> {
        if let Some(want) = &expect {
            let got = c.data().unwrap_or_default();
            if got[..] != want[..] {
                return Err(Error::misuse("payload verification failed"));
            }
        }
        Ok(())
    };
    match flow {
        Flow::PingPong => {
            for i in 0..p.iters {
                let c = wait_ok(ep, pending.pop().expect("posted"))?;
                check(&c)?;
                if i + 1 < p.iters {
                    pending.push(ep.recv(peer, TAG_DATA, take_recv(c))?);
                } else {
                    cache.give(take_recv(c));
                }
                let op = ep.send(peer, TAG_BACK, sends.take(), p.sl)?;
                sends.wait(ep, op)?;
            }
        }
        Flow::Stream => {
            let windows = p.iters / p.window;
            for w in 0..windows {
                let sent: Vec<OpId> = if p.test == Test::Bibw {
                    (0..p.window)
                        .map(|_| ep.send(peer, TAG_BACK, sends.take(), p.sl))
                        .collect::<Result<_>>()?
                } else {
                    Vec::new()
                };
                let mut next = Vec::with_capacity(p.window);
                for op in pending.drain(..) {
                    let c = wait_ok(ep, op)?;
                    check(&c)?;
                    next.push(take_recv(c));
                }
                for op in sent {
                    sends.wait(ep, op)?;
                }
                free.extend(next);
                if w + 1 < windows {
                    for _ in 0..p.window {
                        let b = free.pop_front().expect("at least a window of buffers");
                        pending.push(ep.recv(peer, TAG_DATA, b)?);
                    }
                }
                wait_ok(ep, ep.send(peer, TAG_ACK, Bytes::from_static(b"a"), p.sl)?)?;
            }
        }
        Flow::Rolling => {
            // Messages match receives in posting order; each buffer goes to the back of the
            // line and the front one is posted, so a footprint beyond the window is cycled.
            let mut pending = VecDeque::from(pending);
            let mut posted = pending.len();
            while let Some(op) = pending.pop_front() {
                let c = wait_ok(ep, op)?;
                check(&c)?;
                free.push_back(take_recv(c));
                if posted < p.iters {
                    let b = free.pop_front().expect("the buffer just given back");
                    pending.push_back(ep.recv(peer, TAG_DATA, b)?);
                    posted += 1;
                }
            }
            wait_ok(ep, ep.send(peer, TAG_ACK, Bytes::from_static(b"a"), p.sl)?)?;
        }
    }
    rbufs.into_iter().chain(free).for_each(|b| cache.give(b));
    Ok(())
}

/// The server's side of a read run: each request is answered with a push of one message into
/// its IN buffer and then a reply, up to `window` pushes in flight (as a file server pipelines
/// its transfer units).
fn serve_reads(ep: &Endpoint, peer: PeerId, p: &Params, sends: &mut Sends) -> Result<()> {
    let mut inflight: VecDeque<(Request, OpId)> = VecDeque::with_capacity(p.window);
    let finish = |sends: &mut Sends, (req, op): (Request, OpId)| -> Result<()> {
        sends.wait(ep, op)?;
        wait_ok(ep, req.reply(Bytes::new())?).map(drop)
    };
    for _ in 0..p.iters {
        let req = ep
            .next_request(Some(OP_TIMEOUT))?
            .ok_or_else(|| Error::misuse(format!("no read request within {OP_TIMEOUT:?}")))?;
        if req.peer() != peer || req.direction() != Direction::In || req.payload_len() != p.size as u64 {
            let why = format!(
                "expected a read of {} B, got {:?} of {} B",
                p.size,
                req.direction(),
                req.payload_len()
            );
            req.reply_error(&why)?;
            return Err(Error::misuse(why));
        }
        let op = req.push_from(sends.take(), 0)?;
        inflight.push_back((req, op));
        if inflight.len() >= p.window {
            finish(sends, inflight.pop_front().expect("a full window"))?;
        }
    }
    inflight.into_iter().try_for_each(|x| finish(sends, x))
}

/// Sends a run's parameters to a server and posts the receive of its READY (which it sends
/// once its receives are posted): the returned op completes when the server is ready.
fn announce(ep: &Endpoint, peer: PeerId, p: &Params) -> Result<OpId> {
    let ready = ep.recv(peer, TAG_READY, BytesMut::zeroed(0))?;
    wait_ok(ep, ep.send_unexpected(peer, TAG_PARAMS, Bytes::copy_from_slice(&p.encode()), p.sl)?)?;
    Ok(ready)
}

/// A run's clock: wall time, this process's CPU and (when its pid is known) the server's.
struct Clock {
    t0: Instant,
    cpu0: Duration,
    server: Option<(u32, Duration)>,
}

impl Clock {
    fn start(server_pid: Option<u32>) -> Clock {
        let server = server_pid.and_then(|pid| stats::proc_cpu(pid).map(|c| (pid, c)));
        Clock { cpu0: stats::self_cpu(), server, t0: Instant::now() }
    }

    /// The run of `p` that took until now.
    fn stop(self, p: &Params, rtts: Vec<f64>) -> RunResult {
        let secs = self.t0.elapsed().as_secs_f64();
        let client_cpu = (stats::self_cpu() - self.cpu0).as_secs_f64();
        let server_cpu =
            self.server.and_then(|(pid, c0)| stats::proc_cpu(pid).map(|c| (c - c0).as_secs_f64()));
        RunResult::new(p, secs, rtts, client_cpu, server_cpu)
    }
}

/// Runs one test against a perf server.
pub fn run(ep: &Endpoint, peer: PeerId, p: &Params, server_pid: Option<u32>) -> Result<RunResult> {
    let (flow, p) = match p.test {
        Test::Read => return run_reads(ep, &[peer], p, server_pid),
        Test::Lat => (Flow::PingPong, *p),
        Test::Bw | Test::Msgrate | Test::Bibw => {
            (Flow::Stream, Params { iters: (p.iters / p.window).max(1) * p.window, ..*p })
        }
        Test::Stream => (Flow::Rolling, *p),
    };
    let mut sends = Sends::new(ep, &p, 1)?;
    let expect = p.verify.then(|| pattern(p.size, 2));
    // Receive buffers (ping-pong and bibw), made before the clock starts.
    let mut heap = BufCache::default();
    let n_recv = match p.test {
        Test::Lat => 1,
        Test::Bibw => p.slots(),
        _ => 0,
    };
    let mut rbufs: VecDeque<RecvBuf> =
        (0..n_recv).map(|_| recv_buf(ep, &p, &mut heap)).collect::<Result<_>>()?;
    wait_ok(ep, announce(ep, peer, &p)?)?;
    let clock = Clock::start(server_pid);
    let mut rtts = Vec::new();
    match flow {
        Flow::PingPong => {
            rtts.reserve(p.iters);
            let mut rbuf = rbufs.pop_front().expect("one receive buffer");
            for _ in 0..p.iters {
                let t = Instant::now();
                let r = ep.recv(peer, TAG_BACK, rbuf)?;
                let s = ep.send(peer, TAG_DATA, sends.take(), p.sl)?;
                sends.wait(ep, s)?;
                let c = wait_ok(ep, r)?;
                rtts.push(t.elapsed().as_secs_f64() * 1e6);
                if let Some(want) = &expect
                    && c.data().unwrap_or_default()[..] != want[..]
                {
                    return Err(Error::misuse("echo verification failed"));
                }
                rbuf = take_recv(c);
            }
        }
        Flow::Stream => {
            let mut ack_buf = RecvBuf::Mut(BytesMut::zeroed(1));
            for _ in 0..p.iters / p.window {
                let ack = ep.recv(peer, TAG_ACK, ack_buf)?;
                let posted = rbufs.len().min(p.window);
                let recvs: Vec<OpId> =
                    rbufs.drain(..posted).map(|b| ep.recv(peer, TAG_BACK, b)).collect::<Result<_>>()?;
                let sent: Vec<OpId> = (0..p.window)
                    .map(|_| ep.send(peer, TAG_DATA, sends.take(), p.sl))
                    .collect::<Result<_>>()?;
                for op in sent {
                    sends.wait(ep, op)?;
                }
                for op in recvs {
                    rbufs.push_back(take_recv(wait_ok(ep, op)?));
                }
                ack_buf = take_recv(wait_ok(ep, ack)?);
            }
        }
        Flow::Rolling => {
            // The ack says the receiver has every message: the clock covers the whole trip.
            let ack = ep.recv(peer, TAG_ACK, RecvBuf::Mut(BytesMut::zeroed(1)))?;
            let mut in_flight = VecDeque::with_capacity(p.window);
            for _ in 0..p.iters {
                if in_flight.len() == p.window {
                    sends.wait(ep, in_flight.pop_front().expect("a full window"))?;
                }
                in_flight.push_back(ep.send(peer, TAG_DATA, sends.take(), p.sl)?);
            }
            for op in in_flight {
                sends.wait(ep, op)?;
            }
            wait_ok(ep, ack)?;
        }
    }
    Ok(clock.stop(&p, rtts))
}

/// A read run against one or more perf servers at once (a file system's read fans in from its
/// io servers): `p.iters` reads of `p.size` from each, `p.window` outstanding at each server
/// and a server's next request posted as one of its reads completes, the client's buffers
/// spread over `p.footprint` and each server's payloads over its share of it. Bandwidth counts
/// every server's bytes. The client's endpoint must have no other operations in flight.
pub fn run_reads(ep: &Endpoint, peers: &[PeerId], p: &Params, server_pid: Option<u32>) -> Result<RunResult> {
    let n = peers.len();
    if n == 0 {
        return Err(Error::misuse("a read run needs a server"));
    }
    let each = Params { footprint: p.footprint / n, ..*p };
    let expect = p.verify.then(|| pattern(p.size, 2));
    let mut heap = BufCache::default();
    let slots = (p.window * n).max(p.footprint.div_ceil(p.size.max(1)));
    let mut rbufs: VecDeque<RecvBuf> =
        (0..slots).map(|_| recv_buf(ep, p, &mut heap)).collect::<Result<_>>()?;
    let ready = peers.iter().map(|&peer| announce(ep, peer, &each)).collect::<Result<Vec<_>>>()?;
    for op in ready {
        wait_ok(ep, op)?;
    }
    let clock = Clock::start(server_pid);
    // Each server is refilled as its own reads complete (whichever completes first), as a
    // file system client keeps a stream per io server: one slow server does not hold up the
    // others' next requests.
    let mut left = vec![p.iters; n];
    let mut outstanding = 0usize;
    let post = |s: usize, rbufs: &mut VecDeque<RecvBuf>, left: &mut [usize]| -> Result<()> {
        let buf = rbufs.pop_front().expect("a buffer per request in flight");
        ep.request(peers[s], TAG_DATA, Bytes::new(), Payload::In(buf), p.sl)?;
        left[s] -= 1;
        Ok(())
    };
    for s in 0..n {
        for _ in 0..p.window.min(p.iters) {
            post(s, &mut rbufs, &mut left)?;
            outstanding += 1;
        }
    }
    while outstanding > 0 {
        let c = ep
            .wait_any(Some(OP_TIMEOUT))?
            .ok_or_else(|| {
                Error::misuse(format!("no read completed within {OP_TIMEOUT:?}: the transport is stuck"))
            })?
            .ok()?;
        outstanding -= 1;
        let wrong = c.len() != p.size
            || expect.as_ref().is_some_and(|want| c.data().unwrap_or_default()[..] != want[..]);
        let s = peers.iter().position(|&x| x == c.peer);
        let Some(s) = s.filter(|_| !wrong) else {
            return Err(Error::misuse("read verification failed"));
        };
        rbufs.push_back(take_recv(c));
        if left[s] > 0 {
            post(s, &mut rbufs, &mut left)?;
            outstanding += 1;
        }
    }
    Ok(clock.stop(&Params { iters: p.iters * n, ..*p }, Vec::new()))
}

/// One run of `p`: a read against all of `peers` at once, any other test against the first.
pub fn run_on(ep: &Endpoint, peers: &[PeerId], p: &Params) -> Result<RunResult> {
    match (p.test, peers.first()) {
        (Test::Read, _) => run_reads(ep, peers, p, None),
        (_, Some(&peer)) => run(ep, peer, p, None),
        (_, None) => Err(Error::misuse("a run needs a server")),
    }
}

/// Time budget helper: iterations so a run of `size` lasts roughly `target`.
pub fn iters_for(test: Test, size: usize, target: Duration) -> usize {
    let per = match test {
        Test::Lat => 25e-6 + size as f64 / 2e9,
        _ => 2e-6 + size as f64 / 3e9,
    };
    ((target.as_secs_f64() / per) as usize).clamp(64, 2_000_000)
}

/// Iterations so a run of `p` takes about `target`, measured with a short probe run (which is
/// also the warm-up): slow paths get fewer iterations instead of stretching the suite.
pub fn fit(per_iter: Duration, p: &Params, target: Duration) -> Params {
    let n = (target.as_secs_f64() / per_iter.as_secs_f64().max(1e-9)) as usize;
    match p.test {
        Test::Lat => Params { iters: n.clamp(20, 2_000_000), ..*p },
        _ => Params { iters: (n / p.window).clamp(2, 100_000) * p.window, ..*p },
    }
}

/// The probe of [`fit`]: a few iterations of `p`.
pub fn probe(p: &Params) -> Params {
    match p.test {
        Test::Lat => Params { iters: 20, ..*p },
        _ => Params { iters: 2 * p.window, ..*p },
    }
}

/// [`fit`] for an ionet pair.
pub fn sized(ep: &Endpoint, peer: PeerId, p: &Params, target: Duration) -> Result<Params> {
    let q = probe(p);
    let t = Instant::now();
    run(ep, peer, &q, None)?;
    Ok(fit(t.elapsed() / q.iters as u32, p, target))
}

/// `client --on-demand`: one untimed run of each of `ps`, then `READY` on `output`; then, for
/// every line of `input`, one run of each, reported to `row` and as `RUN <size> <GB/s>`, until
/// `input` ends. A line `footprint <bytes>` runs them with that [`Params::footprint`] instead
/// of their own. Reads run against all of `peers` at once, the other tests against the first.
/// A benchmark that draws a run between its own keeps a warm endpoint and pays
/// no process start per draw.
pub fn on_demand(
    ep: &Endpoint,
    peers: &[PeerId],
    ps: &[Params],
    input: impl std::io::BufRead,
    mut output: impl std::io::Write,
    mut row: impl FnMut(usize, &RunResult) -> std::result::Result<(), crate::BoxErr>,
) -> std::result::Result<(), crate::BoxErr> {
    let one = |p: &Params| run_on(ep, peers, p);
    for p in ps {
        one(p)?;
    }
    writeln!(output, "READY")?;
    output.flush()?;
    for (r, line) in input.lines().enumerate() {
        let footprint = draw_footprint(&line?)?;
        for p in ps {
            let p = Params { footprint: footprint.unwrap_or(p.footprint), ..*p };
            let res = one(&p)?;
            row(r, &res)?;
            writeln!(output, "RUN {} {}", p.size, res.gbps())?;
        }
        output.flush()?;
    }
    Ok(())
}

/// An on-demand request line: empty for the runs as given, `footprint <bytes>` for another
/// footprint.
fn draw_footprint(line: &str) -> std::result::Result<Option<usize>, crate::BoxErr> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["footprint", n] => match n.parse::<usize>() {
            Ok(n) if n <= crate::params::MAX_FOOTPRINT => Ok(Some(n)),
            _ => Err(format!("bad footprint in {line:?}").into()),
        },
        _ => Err(format!("unknown request {line:?} (an empty line or `footprint <bytes>`)").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ionet::{Config, ServiceLevel};

    /// A server endpoint on `scheme` (its own progress thread) and a client connected to it.
    fn pair(scheme: &str) -> (Endpoint, Endpoint, PeerId) {
        let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default().progress_thread(true))
            .unwrap();
        let cli = Endpoint::client(Config::default()).unwrap();
        let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
        (srv, cli, peer)
    }

    /// A verified run of `test` on the bulk class, heap buffers, no footprint.
    fn params(test: Test, size: usize, iters: usize, window: usize) -> Params {
        Params {
            test,
            size,
            iters,
            window,
            sl: ServiceLevel::Bulk,
            verify: true,
            spin: false,
            pool: false,
            footprint: 0,
        }
    }

    /// Serves the next `runs` perf runs on `ep` (bounded waits), returning the server's engine
    /// host copies per run.
    fn serve_runs(ep: Endpoint, runs: usize) -> std::thread::JoinHandle<Vec<u64>> {
        std::thread::spawn(move || serve_counting(&ep, runs).into_iter().map(|(c, _)| c).collect())
    }

    /// Serves `runs` runs; per run, the host copies and the distinct receive buffers the server
    /// holds afterwards.
    fn serve_counting(ep: &Endpoint, runs: usize) -> Vec<(u64, usize)> {
        let mut cache = BufCache::default();
        let mut out = Vec::new();
        for _ in 0..runs {
            let u = ep.recv_unexpected(Some(OP_TIMEOUT)).unwrap().expect("parameters");
            let p = Params::decode(&u.data).unwrap();
            let before = ep.info().counters.host_copy_bytes;
            serve_one(ep, u.peer, &p, &mut cache).unwrap();
            out.push((ep.info().counters.host_copy_bytes - before, cache.0.len()));
        }
        out
    }

    /// A footprint larger than the window spreads the stream over that many distinct buffers:
    /// the server keeps one receive buffer per slot and the client sends from as many distinct
    /// payloads, kept for the next run.
    #[test]
    fn a_footprint_spreads_the_stream_over_distinct_buffers() {
        let (srv, cli, peer) = pair("tcp");
        let server = std::thread::spawn(move || serve_counting(&srv, 2));
        let p = Params { verify: false, ..params(Test::Bw, 64 << 10, 32, 2) };
        run(&cli, peer, &p, None).unwrap();
        let kept = || SEND_PAYLOADS.with_borrow(|c| c.payloads.len());
        assert_eq!(kept(), 1, "without a footprint every send is from one payload");
        run(&cli, peer, &Params { footprint: 512 << 10, ..p }, None).unwrap();
        assert_eq!(kept(), 8);
        let held: Vec<usize> = server.join().unwrap().into_iter().map(|(_, n)| n).collect();
        assert_eq!(held, [2, 8], "a window's worth of receive buffers, then 512 KiB of them");
        let sent = SEND_PAYLOADS.with_borrow_mut(|c| c.get(64 << 10, 8));
        let mut at: Vec<*const u8> = sent.iter().map(|b| b.as_ptr()).collect();
        at.sort();
        at.dedup();
        assert_eq!(at.len(), 8, "distinct send payloads");
        let again = SEND_PAYLOADS.with_borrow_mut(|c| c.get(64 << 10, 8));
        assert!(again.iter().zip(&sent).all(|(a, b)| a.as_ptr() == b.as_ptr()), "kept across runs");
    }

    /// A rolling stream delivers every message, byte for byte (the server verifies each), in
    /// any count (not a multiple of the window, fewer than the window, small eager messages
    /// the sender may post faster than they are received), through the window's or the
    /// footprint's buffers, each posted again as its message arrives.
    #[test]
    fn a_rolling_stream_delivers_every_message_through_a_window_of_buffers() {
        let (srv, cli, peer) = pair("tcp");
        let server = std::thread::spawn(move || serve_counting(&srv, 4));
        let p = params(Test::Stream, 256 << 10, 37, 4);
        let r = run(&cli, peer, &p, None).unwrap();
        assert_eq!(r.bytes, 37 * (256 << 10), "every message counted");
        run(&cli, peer, &Params { iters: 3, ..p }, None).unwrap();
        run(&cli, peer, &Params { size: 512, iters: 500, ..p }, None).unwrap();
        run(&cli, peer, &Params { footprint: 2 << 20, ..p }, None).unwrap();
        let held: Vec<usize> = server.join().unwrap().into_iter().map(|(_, n)| n).collect();
        // The cache keeps buffers of every size seen: 4 of 256 KiB, then 4 of 512 B, then the
        // footprint's 8 of 256 KiB (the first four reused).
        assert_eq!(held, [4, 4, 8, 12], "the window's receive buffers, then the footprint's");
    }

    /// With pool buffers on both sides, 1 MiB messages over `softib://` move straight between
    /// the two applications' buffers (server-based RDMA into the registered receive buffer);
    /// a heap buffer goes through the receiver's zone buffers and is copied once at least the
    /// first time the engine sees it (later ones go direct while the memory monitor keeps its
    /// registration).
    #[test]
    fn pool_buffers_make_no_copy_at_the_receiver() {
        let (srv, cli, peer) = pair("softib");
        let server = serve_runs(srv.clone(), 2);
        let base = Params { sl: ServiceLevel::Normal, ..params(Test::Bw, 1 << 20, 8, 4) };
        run(&cli, peer, &base, None).unwrap();
        run(&cli, peer, &Params { pool: true, ..base }, None).unwrap();
        let copies = server.join().unwrap();
        assert!(copies[0] >= 1 << 20, "heap receive buffers are staged through zones: {copies:?}");
        // Only the 1-byte acknowledgements (one per window) are copied, as inline messages.
        assert!(copies[1] <= 2, "pool receive buffers are written directly: {copies:?}");
    }

    /// A read run fans in from every server at once: each serves its `iters` pushes (checked
    /// byte for byte by the client), and the run counts all of their bytes.
    #[test]
    fn a_read_run_fans_in_verified_pushes_from_every_server() {
        let servers: Vec<Endpoint> = (0..2)
            .map(|_| Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap())
            .collect();
        let cli = Endpoint::client(Config::default()).unwrap();
        let peers: Vec<PeerId> =
            servers.iter().map(|s| cli.connect(s.local_addr().unwrap()).unwrap()).collect();
        // The first server serves two runs (the fan-in and one of its own), the second one.
        let pushed: Vec<_> = servers
            .into_iter()
            .zip([2, 1])
            .map(|(ep, runs)| {
                std::thread::spawn(move || {
                    serve_counting(&ep, runs);
                    ep.info().counters.bytes_sent
                })
            })
            .collect();
        let p = params(Test::Read, 64 << 10, 6, 2);
        let both = run_on(&cli, &peers, &p).unwrap();
        assert_eq!(both.bytes, 2 * 6 * (64 << 10), "both servers' reads");
        let one = run_reads(&cli, &peers[..1], &p, None).unwrap();
        assert_eq!(one.bytes, 6 * (64 << 10), "one server's reads");
        let sent: Vec<u64> = pushed.into_iter().map(|h| h.join().unwrap()).collect();
        let run = 6 * (64 << 10);
        assert!(sent[0] >= 2 * run, "the first server pushed two runs' worth: {sent:?}");
        assert!((run..2 * run).contains(&sent[1]), "the second one run's worth: {sent:?}");
    }

    /// A server that lags does not hold up the others: here the second server serves its
    /// reads only once the first has served all of its own, which works only if the client
    /// keeps refilling the first server as its reads complete.
    #[test]
    fn a_lagging_server_does_not_hold_up_the_others_reads() {
        let bind = || Endpoint::bind("tcp://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
        let (a, b) = (bind(), bind());
        let cli = Endpoint::client(Config::default()).unwrap();
        let peers =
            [cli.connect(a.local_addr().unwrap()).unwrap(), cli.connect(b.local_addr().unwrap()).unwrap()];
        let (first_done, go) = std::sync::mpsc::channel::<()>();
        let first = std::thread::spawn(move || {
            serve_counting(&a, 1);
            first_done.send(()).unwrap();
        });
        let second = std::thread::spawn(move || {
            let u = b.recv_unexpected(Some(OP_TIMEOUT)).unwrap().expect("parameters");
            let p = Params::decode(&u.data).unwrap();
            let mut sends = Sends::new(&b, &p, 2).unwrap();
            wait_ok(&b, b.send(u.peer, TAG_READY, Bytes::new(), p.sl).unwrap()).unwrap();
            go.recv_timeout(OP_TIMEOUT).expect("the first server finished first");
            serve_reads(&b, u.peer, &p, &mut sends).unwrap();
        });
        let r = run_reads(&cli, &peers, &params(Test::Read, 64 << 10, 8, 1), None).unwrap();
        assert_eq!(r.bytes, 2 * 8 * (64 << 10));
        first.join().unwrap();
        second.join().unwrap();
    }

    /// A read request of another size than the run's is answered with an error, not served.
    #[test]
    fn a_read_server_refuses_a_request_of_the_wrong_size() {
        let (srv, cli, peer) = pair("tcp");
        let server = std::thread::spawn(move || {
            let u = srv.recv_unexpected(Some(OP_TIMEOUT)).unwrap().expect("parameters");
            let p = Params::decode(&u.data).unwrap();
            serve_one(&srv, u.peer, &p, &mut BufCache::default())
        });
        let p = params(Test::Read, 64 << 10, 4, 1);
        let ready = cli.recv(peer, TAG_READY, BytesMut::zeroed(0)).unwrap();
        wait_ok(
            &cli,
            cli.send_unexpected(peer, TAG_PARAMS, Bytes::copy_from_slice(&p.encode()), p.sl).unwrap(),
        )
        .unwrap();
        wait_ok(&cli, ready).unwrap();
        let small = RecvBuf::Mut(BytesMut::zeroed(4096));
        let op = cli.request(peer, TAG_DATA, Bytes::new(), Payload::In(small), p.sl).unwrap();
        let c = cli.wait_timeout(op, OP_TIMEOUT).unwrap().expect("answered");
        assert!(c.result.is_err(), "the wrong-size read is refused: {:?}", c.result);
        assert!(server.join().unwrap().is_err(), "and the server gives the run up");
    }

    /// On demand: a warm-up run, `READY`, then exactly one run per input line, each reported
    /// with its size and a bandwidth, and each a real run the server served; a `footprint`
    /// line's run spreads over that many bytes of buffers.
    #[test]
    fn on_demand_runs_once_per_input_line() {
        let (srv, cli, peer) = pair("tcp");
        // The warm-up and three draws.
        let server = std::thread::spawn(move || serve_counting(&srv, 4));
        let p = params(Test::Bw, 64 << 10, 8, 4);
        let mut out = Vec::new();
        let mut rows = Vec::new();
        on_demand(&cli, &[peer], &[p], &b"\nfootprint 1048576\n\n"[..], &mut out, |r, res| {
            rows.push((r, res.bytes));
            Ok(())
        })
        .unwrap();
        let held: Vec<usize> = server.join().unwrap().into_iter().map(|(_, n)| n).collect();
        assert_eq!(held, [4, 4, 16, 16], "the warm-up and three draws, the second over 1 MiB");
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0], "READY");
        for l in &lines[1..] {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(&f[..2], ["RUN", "65536"], "{l}");
            assert!(f[2].parse::<f64>().unwrap() > 0.0, "{l}");
        }
        assert_eq!(rows, [(0, 8 << 16), (1, 8 << 16), (2, 8 << 16)]);
        assert_eq!(draw_footprint("footprint 33554432").unwrap(), Some(32 << 20));
        assert!(draw_footprint("footprint 4294967296").is_err(), "over the limit");
        assert!(draw_footprint("go").is_err());
    }
}

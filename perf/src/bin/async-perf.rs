//! `async-perf`: the async API (`ionet::tokio`) against the blocking API, in one run.
//!
//! ```text
//! async-perf [--transport tcp|softib] [--runs N] [--rtt-iters N] [--bw-requests N] [--window N]
//!            [--wait spin|adaptive|block]
//! ```
//!
//! A server thread with a blocking endpoint answers 8 B requests by echoing their header and
//! 1 MiB OUT-payload requests by pulling the payload. Two client endpoints with the default
//! configuration (adaptive waiting unless `--wait` says otherwise, nothing pinned, plain heap
//! buffers) take turns, run by run:
//! one waits with `Endpoint::wait`, the other awaits `AsyncEndpoint::completion` on a
//! current-thread tokio runtime in the same thread. Figures: the 8 B request round trip and
//! the 1 MiB request bandwidth with `--window` requests in flight; the median of `--runs`
//! runs with the min–max spread, and async / blocking.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ionet::tokio::AsyncEndpoint;
use ionet::{Config, Endpoint, OpId, Payload, PeerId, RecvBuf, ServiceLevel, WaitMode};

const ECHO: u64 = 1;
const PULL: u64 = 2;
const MIB: usize = 1 << 20;

struct Args {
    transport: String,
    runs: usize,
    rtt_iters: usize,
    bw_requests: usize,
    window: usize,
    wait: WaitMode,
}

fn args() -> Args {
    let mut a = Args {
        transport: "tcp".into(),
        runs: 5,
        rtt_iters: 20_000,
        bw_requests: 512,
        window: 16,
        wait: WaitMode::Adaptive,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--transport" => a.transport = v(),
            "--runs" => a.runs = v().parse().expect("--runs N"),
            "--rtt-iters" => a.rtt_iters = v().parse().expect("--rtt-iters N"),
            "--bw-requests" => a.bw_requests = v().parse().expect("--bw-requests N"),
            "--window" => a.window = v().parse().expect("--window N"),
            "--wait" => {
                a.wait = match v().as_str() {
                    "spin" => WaitMode::Spin,
                    "adaptive" => WaitMode::Adaptive,
                    "block" => WaitMode::Block,
                    w => panic!("--wait spin|adaptive|block, not {w}"),
                }
            }
            "-h" | "--help" => {
                println!(
                    "async-perf [--transport tcp|softib] [--runs N] [--rtt-iters N] [--bw-requests N] [--window N]"
                );
                std::process::exit(0);
            }
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

fn serve(ep: Endpoint) {
    let mut buf = Some(BytesMut::zeroed(MIB));
    loop {
        let Ok(Some(req)) = ep.next_request(Some(Duration::from_secs(1))) else { continue };
        match req.tag() {
            ECHO => {
                let h = req.header().clone();
                if let Ok(op) = req.reply(h) {
                    let _ = ep.detach(op);
                }
            }
            PULL => {
                let b = buf.take().unwrap_or_else(|| BytesMut::zeroed(MIB));
                let Ok(op) = req.pull_into(b, 0) else { continue };
                if let Ok(c) = ep.wait(op)
                    && let Some(RecvBuf::Mut(b)) = c.buf.into_recv()
                {
                    buf = Some(b);
                }
                if let Ok(op) = req.reply(Bytes::new()) {
                    let _ = ep.detach(op);
                }
            }
            _ => {}
        }
    }
}

fn echo(ep: &Endpoint, peer: PeerId) -> OpId {
    ep.request(peer, ECHO, Bytes::from_static(b"8 bytes!"), Payload::None, ServiceLevel::Normal).unwrap()
}

fn pull(ep: &Endpoint, peer: PeerId, payload: &Bytes) -> OpId {
    ep.request(peer, PULL, Bytes::new(), Payload::Out(payload.clone().into()), ServiceLevel::Bulk).unwrap()
}

/// Mean round trip in µs.
fn rtt_blocking(ep: &Endpoint, peer: PeerId, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        ep.wait(echo(ep, peer)).unwrap().ok().unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

async fn rtt_async(ep: &AsyncEndpoint, peer: PeerId, iters: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        ep.completion(echo(ep.endpoint(), peer)).await.unwrap().ok().unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// GB/s of OUT payload with `window` requests in flight.
fn bw_blocking(ep: &Endpoint, peer: PeerId, payload: &Bytes, n: usize, window: usize) -> f64 {
    let t = Instant::now();
    let mut q = VecDeque::new();
    for _ in 0..n {
        if q.len() == window {
            ep.wait(q.pop_front().unwrap()).unwrap().ok().unwrap();
        }
        q.push_back(pull(ep, peer, payload));
    }
    for op in q {
        ep.wait(op).unwrap().ok().unwrap();
    }
    (n * payload.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}

async fn bw_async(ep: &AsyncEndpoint, peer: PeerId, payload: &Bytes, n: usize, window: usize) -> f64 {
    let t = Instant::now();
    let mut q = VecDeque::new();
    for _ in 0..n {
        if q.len() == window {
            let f: ionet::tokio::OpFuture = q.pop_front().unwrap();
            f.await.unwrap().ok().unwrap();
        }
        q.push_back(ep.completion(pull(ep.endpoint(), peer, payload)));
    }
    for f in q {
        f.await.unwrap().ok().unwrap();
    }
    (n * payload.len()) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn median_spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let a = args();
    let srv = Endpoint::bind(format!("{}://127.0.0.1:0", a.transport), Config::default()).expect("bind");
    let addr = srv.local_addr().expect("bound");
    std::thread::spawn(move || serve(srv));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let cfg = Config::default().wait_mode(a.wait);
    let blocking = Endpoint::client(cfg.clone()).expect("client");
    let bpeer = blocking.connect(&addr).expect("connect");
    let (asynce, apeer) = rt.block_on(async {
        let ep = AsyncEndpoint::new(Endpoint::client(cfg.clone()).expect("client")).expect("async");
        let peer = ep.endpoint().connect(&addr).expect("connect");
        (ep, peer)
    });
    // Plain heap payload, pre-faulted.
    let payload = Bytes::from(vec![7u8; MIB]);

    // Warm-up: connections, pools, page faults.
    rtt_blocking(&blocking, bpeer, 1000);
    rt.block_on(rtt_async(&asynce, apeer, 1000));
    bw_blocking(&blocking, bpeer, &payload, 32, a.window);
    rt.block_on(bw_async(&asynce, apeer, &payload, 32, a.window));

    let (mut rb, mut ra, mut bb, mut ba) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.runs {
        rb.push(rtt_blocking(&blocking, bpeer, a.rtt_iters));
        ra.push(rt.block_on(rtt_async(&asynce, apeer, a.rtt_iters)));
        bb.push(bw_blocking(&blocking, bpeer, &payload, a.bw_requests, a.window));
        ba.push(rt.block_on(bw_async(&asynce, apeer, &payload, a.bw_requests, a.window)));
    }
    let (rb, ra, bb, ba) = (median_spread(rb), median_spread(ra), median_spread(bb), median_spread(ba));
    println!(
        "transport {}, {} runs (median, min–max), clients' wait mode {:?}, otherwise the default configuration, nothing pinned",
        a.transport, a.runs, a.wait
    );
    println!();
    println!("| figure | blocking | async (tokio) | async / blocking |");
    println!("|---|---|---|---|");
    println!(
        "| 8 B request round trip (µs) | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | {:.2}× |",
        rb.0,
        rb.1,
        rb.2,
        ra.0,
        ra.1,
        ra.2,
        ra.0 / rb.0
    );
    println!(
        "| 1 MiB request bandwidth, {} in flight (GB/s) | {:.2} ({:.2}–{:.2}) | {:.2} ({:.2}–{:.2}) | {:.2}× |",
        a.window,
        bb.0,
        bb.1,
        bb.2,
        ba.0,
        ba.1,
        ba.2,
        ba.0 / bb.0
    );
}

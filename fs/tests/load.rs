//! Load: many clients, each with its own endpoint, run a mixed read / write / metadata workload
//! against a cluster for a bounded time. Every byte read is checked against the client's model
//! of its files, and at the end every byte of every file; the io servers' resident memory must
//! stay within a budget computed from their configuration; per-client fairness is reported as
//! Jain's index over operations completed (reported, not asserted: it is a timing figure).
//!
//! Memory is measured as private (`RssAnon`, bounded by the budget) and shared (`RssShmem`: the
//! softib context images, own and peers', whose size is fixed when they are created and whose
//! resident part grows only as ring pages are first touched).
//!
//! `cargo test -p stripefs --test load` runs a CI-sized version on `tcp://` and `softib://`.
//! The full run (64 clients × 4 io servers, figures in RELIABILITY.md):
//!
//! ```text
//! LOAD_SECS=60 cargo test --release -p stripefs --test load -- --ignored --nocapture
//! ```
//! (`LOAD_CLIENTS`, `LOAD_IO`, `LOAD_SCHEMES=tcp,softib` override the shape.)

mod common;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, pattern};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use stripefs::proto::LayoutSpec;
use stripefs::{Client, ClientOptions, CreateOptions};

/// Each client's private file.
const FILE: usize = 1 << 20;
/// Each client's region of the shared file (disjoint concurrent writes to one file).
const SHARED: usize = 64 << 10;
/// The io servers' transfer unit (`common::options`) and their defaults.
const TRANSFER_UNIT: u64 = 64 << 10;
const WORKERS: u64 = 4;
const PIPELINE_DEPTH: u64 = 4;
/// Allowance over the measured connected baseline for allocator slack and thread stacks.
const SLACK: u64 = 32 << 20;

#[derive(Debug, Clone, Copy)]
struct Shape {
    clients: usize,
    io: u32,
    secs: f64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    writes: u64,
    reads: u64,
    meta: u64,
    bytes_written: u64,
    bytes_read: u64,
}

impl Tally {
    fn ops(&self) -> u64 {
        self.writes + self.reads + self.meta
    }
}

/// xorshift64*: a deterministic workload per client.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let q: f64 = xs.iter().map(|x| x * x).sum();
    if q == 0.0 { 0.0 } else { s * s / (xs.len() as f64 * q) }
}

/// Memory of a server process, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    /// Private resident memory (`RssAnon`): what the server's code allocates.
    anon: u64,
    /// Resident shared memory (`RssShmem`): softib context images, its own and its peers'.
    shmem: u64,
    /// Peak resident set (`VmHWM`, private and shared).
    hwm: u64,
    /// Total size of the shared images mapped (what `shmem` can grow to as pages are touched).
    shm_mapped: u64,
}

fn mem(pid: u32) -> Mem {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut shm_mapped = 0;
    let mut in_memfd = false;
    for l in smaps.lines() {
        if l.contains("/memfd:") {
            in_memfd = true;
        } else if in_memfd && let Some(v) = l.strip_prefix("Size:") {
            shm_mapped += v.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
            in_memfd = false;
        }
    }
    Mem { anon: kib("RssAnon:"), shmem: kib("RssShmem:"), hwm: kib("VmHWM:"), shm_mapped }
}

fn client(tc: &TestCluster) -> Client {
    let opts = ClientOptions {
        timeout: Duration::from_secs(60),
        wait_mode: ionet::WaitMode::Block,
        ..Default::default()
    };
    Client::connect_with(tc.cluster.config(), opts).expect("client connects")
}

/// One client's run: returns its tally; panics on any wrong byte.
fn run_client(i: usize, c: Client, until: Instant, start: Arc<Barrier>) -> Tally {
    let dir = format!("/load/c{i}");
    let f = c.open(&format!("{dir}/data"), stripefs::capability::Rights::READ_WRITE).unwrap();
    let shared = c.open("/load/shared", stripefs::capability::Rights::READ_WRITE).unwrap();
    let mut model = pattern(FILE, i as u64).to_vec();
    let mut shared_model = pattern(SHARED, 1_000 + i as u64).to_vec();
    let base = (i * SHARED) as u64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
    let mut t = Tally::default();
    start.wait();
    let mut seq = 0u64;
    while Instant::now() < until {
        seq += 1;
        match rng.below(10) {
            // Write a random range of the private file (up to 256 KiB) or of our shared region.
            0..=3 => {
                let (file, m, off0) =
                    if rng.below(4) == 0 { (&shared, &mut shared_model, base) } else { (&f, &mut model, 0) };
                let len = 1 + rng.below((m.len() as u64).min(256 << 10)) as usize;
                let off = rng.below((m.len() - len) as u64 + 1) as usize;
                let data = pattern(len, seq ^ (i as u64) << 32);
                file.write_at(off0 + off as u64, &data).unwrap();
                m[off..off + len].copy_from_slice(&data);
                t.writes += 1;
                t.bytes_written += len as u64;
            }
            // Read back and check against the model.
            4..=7 => {
                let (file, m, off0) =
                    if rng.below(4) == 0 { (&shared, &shared_model, base) } else { (&f, &model, 0) };
                let len = 1 + rng.below((m.len() as u64).min(256 << 10)) as usize;
                let off = rng.below((m.len() - len) as u64 + 1) as usize;
                let (b, n) = file.read_at(off0 + off as u64, BytesMut::zeroed(len)).unwrap();
                assert_eq!(n, len, "client {i}: short read");
                assert!(b[..] == m[off..off + len], "client {i}: wrong bytes at {off}+{len}");
                t.reads += 1;
                t.bytes_read += len as u64;
            }
            // Metadata: create, stat, rename, list, unlink a scratch file.
            _ => {
                let a = format!("{dir}/tmp{seq}");
                let b = format!("{dir}/tmp{seq}.renamed");
                let g = c.create(&a, CreateOptions::default()).unwrap();
                g.write_all_at(0, b"scratch").unwrap();
                assert_eq!(c.stat(&a).unwrap().attr.size, 7);
                c.rename(&a, &b).unwrap();
                let names: Vec<String> =
                    c.readdir(&dir).unwrap().into_iter().map(|e| e.name.to_string()).collect();
                assert!(names.contains(&format!("tmp{seq}.renamed")), "client {i}: {names:?}");
                c.unlink(&b).unwrap();
                t.meta += 5;
            }
        }
    }
    // Every byte, once more, at the end.
    let (b, n) = f.read_at(0, BytesMut::zeroed(FILE)).unwrap();
    assert!(n == FILE && b[..] == model[..], "client {i}: private file differs at the end");
    let (b, n) = shared.read_at(base, BytesMut::zeroed(SHARED)).unwrap();
    assert!(n == SHARED && b[..] == shared_model[..], "client {i}: shared region differs at the end");
    t
}

fn run(scheme: &str, shape: Shape) {
    let mut tc = TestCluster::start_with(scheme, shape.io, |o| {
        o.io_args = vec!["--wait".into(), "block".into()];
        o.meta_args = vec!["--wait".into(), "block".into()];
    });
    let layout = Some(LayoutSpec { base: Some(0), pcount: Some(shape.io), ssize: Some(64 << 10) });
    let setup = client(&tc);
    setup.mkdir("/load", 0o755).unwrap();
    let shared = setup.create("/load/shared", CreateOptions { mode: 0o644, layout }).unwrap();
    shared.truncate((shape.clients * SHARED) as u64).unwrap();
    for i in 0..shape.clients {
        setup.mkdir(&format!("/load/c{i}"), 0o755).unwrap();
        let f = setup.create(&format!("/load/c{i}/data"), CreateOptions { mode: 0o644, layout }).unwrap();
        f.write_at(0, &pattern(FILE, i as u64)).unwrap();
        shared.write_at((i * SHARED) as u64, &pattern(SHARED, 1_000 + i as u64)).unwrap();
    }
    // Connect every client and make every kind of request once, so every connection (one per
    // service level used: control and bulk), its buffers and registrations exist; then take
    // the baseline the budget is measured from. What grows after it is the data path.
    let clients: Vec<Client> = (0..shape.clients).map(|_| client(&tc)).collect();
    for (i, c) in clients.iter().enumerate() {
        let f = c.open(&format!("/load/c{i}/data"), stripefs::capability::Rights::READ_WRITE).unwrap();
        let (b, _) = f.read_at(0, BytesMut::zeroed(FILE)).unwrap();
        f.write_at(0, &Bytes::copy_from_slice(&b[..])).unwrap();
        assert_eq!(f.size().unwrap(), FILE as u64);
        f.sync().unwrap();
        c.stat(&format!("/load/c{i}/data")).unwrap();
    }
    let pids = tc.cluster.pids();
    let io_pids = &pids[1..];
    // Private memory must stay within what the configuration allows over this baseline. Shared
    // memory is the softib images, fixed in size when a context or connection is created: it
    // grows only as their rings' pages are first touched, up to `shm_mapped`.
    let baseline: Vec<Mem> = io_pids.iter().map(|&p| mem(p)).collect();
    let budget: Vec<u64> =
        baseline.iter().map(|b| b.anon + 2 * WORKERS * PIPELINE_DEPTH * TRANSFER_UNIT + SLACK).collect();

    let start = Arc::new(Barrier::new(shape.clients + 1));
    let until = Instant::now() + Duration::from_secs_f64(shape.secs) + Duration::from_millis(500);
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let start = start.clone();
            std::thread::Builder::new()
                .name(format!("load-{i}"))
                .stack_size(1 << 20)
                .spawn(move || run_client(i, c, until, start))
                .unwrap()
        })
        .collect();
    // Sample the io servers' memory while the load runs.
    let peak = Arc::new(Mutex::new(vec![Mem::default(); io_pids.len()]));
    start.wait();
    let began = Instant::now();
    // io server 0's RSS at each tenth of the run: a leak climbs, a working set levels off.
    let mut timeline = Vec::new();
    while Instant::now() < until {
        let mut p = peak.lock().unwrap();
        for (k, &pid) in io_pids.iter().enumerate() {
            let m = mem(pid);
            p[k].anon = p[k].anon.max(m.anon);
            p[k].shmem = p[k].shmem.max(m.shmem);
            p[k].shm_mapped = p[k].shm_mapped.max(m.shm_mapped);
        }
        drop(p);
        if began.elapsed().as_secs_f64() >= shape.secs * timeline.len() as f64 / 10.0 {
            timeline.push(mem(io_pids[0]).anon);
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(tc.cluster.exited().is_none(), "{:?}", tc.cluster.exited());
    }
    let tallies: Vec<Tally> = handles.into_iter().map(|h| h.join().expect("a client failed")).collect();
    let elapsed = began.elapsed().as_secs_f64();
    let end: Vec<Mem> = io_pids.iter().map(|&p| mem(p)).collect();
    let peak: Vec<Mem> = peak
        .lock()
        .unwrap()
        .iter()
        .zip(&end)
        .map(|(p, e)| Mem {
            anon: p.anon.max(e.anon),
            shmem: p.shmem.max(e.shmem),
            hwm: e.hwm,
            shm_mapped: p.shm_mapped.max(e.shm_mapped),
        })
        .collect();
    let meta_mem = mem(pids[0]);

    let ops: Vec<f64> = tallies.iter().map(|t| t.ops() as f64).collect();
    let total = tallies.iter().fold(Tally::default(), |a, t| Tally {
        writes: a.writes + t.writes,
        reads: a.reads + t.reads,
        meta: a.meta + t.meta,
        bytes_written: a.bytes_written + t.bytes_written,
        bytes_read: a.bytes_read + t.bytes_read,
    });
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "load {scheme}: {} clients x {} io servers, {elapsed:.1} s: {} ops ({} writes, {} reads, {} metadata), \
         {:.1} MiB written, {:.1} MiB read, {:.0} ops/s; Jain's index over per-client ops {:.3} \
         (min {} max {} ops)",
        shape.clients,
        shape.io,
        total.ops(),
        total.writes,
        total.reads,
        total.meta,
        mib(total.bytes_written),
        mib(total.bytes_read),
        total.ops() as f64 / elapsed,
        jain(&ops),
        tallies.iter().map(Tally::ops).min().unwrap(),
        tallies.iter().map(Tally::ops).max().unwrap(),
    );
    for k in 0..io_pids.len() {
        println!(
            "  io{k}: private {:.1} MiB at baseline, {:.1} MiB peak, budget {:.1} MiB; shared {:.1} → {:.1} MiB \
             of {:.1} MiB mapped; VmHWM {:.1} MiB",
            mib(baseline[k].anon),
            mib(peak[k].anon),
            mib(budget[k]),
            mib(baseline[k].shmem),
            mib(peak[k].shmem),
            mib(peak[k].shm_mapped),
            mib(peak[k].hwm),
        );
    }
    println!(
        "  meta: private {:.1} MiB, shared {:.1} MiB, VmHWM {:.1} MiB",
        mib(meta_mem.anon),
        mib(meta_mem.shmem),
        mib(meta_mem.hwm)
    );
    let tl: Vec<String> = timeline.iter().map(|&b| format!("{:.0}", mib(b))).collect();
    println!("  io0 private memory by tenths of the run, MiB: {}", tl.join(" "));
    assert!(tallies.iter().all(|t| t.ops() > 0), "a client never completed an operation");
    for k in 0..io_pids.len() {
        assert!(
            peak[k].anon <= budget[k],
            "io server {k} used {:.1} MiB of private memory, over its budget of {:.1} MiB",
            mib(peak[k].anon),
            mib(budget[k])
        );
        assert!(peak[k].shmem <= peak[k].shm_mapped, "shared memory beyond the images mapped");
    }
}

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn load_ci_tcp() {
    run("tcp", Shape { clients: 8, io: 2, secs: 2.0 });
}

#[test]
fn load_ci_softib() {
    run("softib", Shape { clients: 8, io: 2, secs: 2.0 });
}

/// The full run: 64 clients × 4 io servers (see the module docs for the command).
#[test]
#[ignore]
fn load_full() {
    let shape =
        Shape { clients: env("LOAD_CLIENTS", 64), io: env("LOAD_IO", 4), secs: env("LOAD_SECS", 30.0) };
    for scheme in env("LOAD_SCHEMES", "tcp,softib".to_string()).split(',') {
        run(scheme, shape);
    }
}

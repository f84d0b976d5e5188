//! A profiling driver: repeated `write_at` / `read_at` of one region against a running cluster,
//! so an io server can be watched with `perf`, `strace -c` or callgrind while this loops.
//!
//! ```text
//! stripefs serve --io-servers 1 --transport tcp --data-dir /dev/shm/x &
//! cargo run --release -p stripefs --example ioloop -- /dev/shm/x/cluster.toml 2m 200 rw
//! ```
//! Arguments: cluster file, bytes per call (k/m suffixes), calls, `w`, `r` or `rw`, and
//! optionally `reg` to read into registered buffers from `Endpoint::alloc`. With
//! `PIDS="<pid> …"` set, the CPU time those processes (the servers) used during the loop is
//! printed per call beside this process's own; `WAIT=block|spin` sets the client's wait mode,
//! `REG=1` writes from a registered pool buffer, `CACHE=1` caches the
//! read buffer's registration, `HINT=1` turns on the list allocation hint,
//! `MAXREQ=n` caps the bytes per io-server request, `READREQ=n` per read request, `INTO=1`
//! reads through `read_into`, `PAGEOFF=k` starts the read buffer k bytes past a page
//! boundary, `MISALIGN=k` starts the read buffer k bytes past a 64-byte boundary and
//! `DMISALIGN=k` the written data.

use bytes::{Bytes, BytesMut};
use std::time::Instant;
use stripefs::config::ClusterConfig;
use stripefs::{Client, CreateOptions};

fn size(s: &str) -> usize {
    let (n, m) = match s.as_bytes().last() {
        Some(b'k') => (&s[..s.len() - 1], 1 << 10),
        Some(b'm') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<usize>().expect("size") * m
}

/// User + system CPU seconds of a process, from `/proc/<pid>/stat`.
fn proc_cpu(pid: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

fn self_cpu() -> f64 {
    proc_cpu("self")
}

/// A pool buffer seen as `Bytes`.
struct Pooled(ionet::RegisteredBuf);
impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let cfg = ClusterConfig::load(std::path::Path::new(&a[1]))?;
    let len = size(&a[2]);
    let iters: usize = a[3].parse()?;
    let ops = a.get(4).map_or("rw", |s| s.as_str());
    let mut opts = stripefs::ClientOptions::default();
    match std::env::var("WAIT").as_deref() {
        Ok("block") => opts.wait_mode = ionet::WaitMode::Block,
        Ok("spin") => opts.wait_mode = ionet::WaitMode::Spin,
        _ => {}
    }
    // MAXREQ=n caps the bytes per io-server request (k/m suffixes).
    if let Ok(m) = std::env::var("MAXREQ") {
        opts.max_request_bytes = Some(size(&m) as u64);
    }
    // READREQ=n caps the bytes per io-server read request.
    if let Ok(m) = std::env::var("READREQ") {
        opts.read_request_bytes = Some(size(&m) as u64);
    }
    if std::env::var_os("HINT").is_some() {
        opts.ib = Some(ionet::IbConfig::default().list_alloc_hint(true));
    }
    // CACHE=1 keeps the read buffer's registration across calls (leave_pinned; the buffer
    // lives until exit, so nothing needs invalidating).
    if std::env::var_os("CACHE").is_some() {
        opts.ib =
            Some(opts.ib.take().unwrap_or_else(stripefs::client::default_ib_config).cache_foreign(true));
    }
    let client = Client::connect_with(&cfg, opts)?;
    let name = format!("/ioloop-{}", std::process::id());
    let f = client.create(&name, CreateOptions::default())?;
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let data = if std::env::var_os("REG").is_some() {
        // Written from the endpoint's registered pool (zero-copy, registration-cache hits).
        let mut b = client.endpoint().alloc(len)?;
        b.copy_from_slice(&pattern);
        Bytes::from_owner(Pooled(b))
    } else if let Some(skew) = std::env::var("DMISALIGN").ok().and_then(|v| v.parse::<usize>().ok()) {
        let mut b = BytesMut::zeroed(len + ionet::BUF_ALIGN + skew);
        let head = (ionet::BUF_ALIGN - b.as_ptr() as usize % ionet::BUF_ALIGN) % ionet::BUF_ALIGN + skew;
        drop(b.split_to(head));
        b.truncate(len);
        b.copy_from_slice(&pattern);
        b.freeze()
    } else {
        Bytes::from(pattern)
    };
    f.write_at(0, &data)?;
    let mut buf = BytesMut::zeroed(len + ionet::BUF_ALIGN);
    // MISALIGN=k starts the read buffer k bytes past a BUF_ALIGN boundary (default: wherever
    // malloc put it).
    if let Some(skew) = std::env::var("MISALIGN").ok().and_then(|v| v.parse::<usize>().ok()) {
        let head = (ionet::BUF_ALIGN - buf.as_ptr() as usize % ionet::BUF_ALIGN) % ionet::BUF_ALIGN + skew;
        drop(buf.split_to(head));
    }
    // PAGEOFF=k starts it k bytes past a page boundary (a large malloc'd buffer sits at 16).
    if let Some(skew) = std::env::var("PAGEOFF").ok().and_then(|v| v.parse::<usize>().ok()) {
        buf = BytesMut::zeroed(len + 4096 + skew);
        let head = (4096 - buf.as_ptr() as usize % 4096) % 4096 + skew;
        drop(buf.split_to(head));
    }
    buf.truncate(len);
    let (mut tw, mut tr) = (0f64, 0f64);
    let (mut cw, mut cr) = (Vec::with_capacity(iters), Vec::with_capacity(iters));
    let pids: Vec<String> =
        std::env::var("PIDS").unwrap_or_default().split_whitespace().map(str::to_owned).collect();
    let srv0: f64 = pids.iter().map(|p| proc_cpu(p)).sum();
    let cli0 = self_cpu();
    // GAP_US=n idles n microseconds before every call (E1 times single calls between barriers).
    let gap = std::env::var("GAP_US").ok().and_then(|v| v.parse().ok()).map(std::time::Duration::from_micros);
    // GAP_SPIN=1 busy-waits the gap instead of sleeping (keeps this CPU out of idle).
    let spin_gap = std::env::var_os("GAP_SPIN").is_some();
    let verify = std::env::var_os("VERIFY").is_some();
    // INTO=1 reads through `File::read_into` into a caller's slice (a pre-faulted `Vec`).
    let mut into = std::env::var_os("INTO").is_some().then(|| vec![1u8; len]);
    let pause = |g: std::time::Duration| {
        if spin_gap {
            let t = Instant::now();
            while t.elapsed() < g {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(g);
        }
    };
    for _ in 0..iters {
        if let Some(g) = gap {
            pause(g);
        }
        if ops.contains('w') {
            let t = Instant::now();
            f.write_at(0, &data)?;
            cw.push(t.elapsed().as_secs_f64());
            tw += cw[cw.len() - 1];
        }
        if ops.contains('r') {
            if let Some(g) = gap {
                pause(g);
            }
            let t = Instant::now();
            if let Some(dst) = into.as_mut() {
                let n = f.read_into(0, dst)?;
                cr.push(t.elapsed().as_secs_f64());
                assert_eq!(n, len);
                buf.copy_from_slice(dst);
            } else {
                let (b, n) = f.read_at(0, buf)?;
                cr.push(t.elapsed().as_secs_f64());
                assert_eq!(n, len);
                buf = b;
            }
            tr += cr[cr.len() - 1];
            // VERIFY=1 compares every read with the data, as E1 does between its calls.
            if verify {
                assert!(buf[..] == data[..], "read back different data");
            }
        }
    }
    let srv = pids.iter().map(|p| proc_cpu(p)).sum::<f64>() - srv0;
    let cli = self_cpu() - cli0;
    assert!(buf[..] == data[..] || !ops.contains('r'), "read back different data");
    let mbs = |t: f64| (len * iters) as f64 / 1e6 / t;
    // Per-call spread: p10 / p50 / p90 in microseconds.
    let pct = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v.get(((v.len() as f64 - 1.0) * q) as usize).map_or(0.0, |x| x * 1e6);
        format!("p10/p50/p90 {:.0}/{:.0}/{:.0} us", at(0.1), at(0.5), at(0.9))
    };
    if ops.contains('w') {
        let p = pct(&mut cw);
        println!(
            "write {} B x {iters}: {:.0} MB/s ({:.1} us/call; {p})",
            len,
            mbs(tw),
            tw * 1e6 / iters as f64
        );
    }
    if ops.contains('r') {
        let p = pct(&mut cr);
        println!(
            "read  {} B x {iters}: {:.0} MB/s ({:.1} us/call; {p})",
            len,
            mbs(tr),
            tr * 1e6 / iters as f64
        );
    }
    println!(
        "cpu per call: client {:.1} us, servers {:.1} us",
        cli * 1e6 / iters as f64,
        srv * 1e6 / iters as f64
    );
    if let Some(r) = client.endpoint().info().regcache {
        println!(
            "regcache: {} hits, {} misses, {} entries, {} MiB pinned (limits {} entries, {} MiB)",
            r.hits,
            r.misses,
            r.entries,
            r.pinned_bytes >> 20,
            r.max_entries,
            r.max_bytes >> 20
        );
    }
    if std::env::var_os("KEEP").is_none() {
        client.unlink(&name)?;
    }
    Ok(())
}

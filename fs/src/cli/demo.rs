//! `stripefs demo`: the one-command tour. Starts 1 meta + 4 io servers as child processes on
//! loopback in a temporary directory, writes a 256 MiB file and reads it back (checksummed) over
//! each transport, prints a side-by-side table, stops the servers and removes the directory —
//! also on Ctrl-C or failure.
//!
//! The checksum is xxh3-64 (`xxhash-rust`): a non-cryptographic hash is enough to catch
//! corruption in our own pipeline, and at well over 10 GB/s it costs a few milliseconds, outside
//! the timed section. The client buffers are allocated and pre-faulted once, before timing, and
//! reused by every transport (first-touch faults cost ~2.5 s/GiB on the reference VM).

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use ionet::{Config, CounterSnapshot, Endpoint, Scheme};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::{Client, CreateOptions};

/// `demo` options.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// File size in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Transports to compare.
    #[arg(long, value_delimiter = ',', default_value = "tcp,softib")]
    transports: Vec<Scheme>,
    /// Number of io servers.
    #[arg(long, default_value_t = 4)]
    io_servers: u32,
    /// Write/read rounds per transport (the table shows the median; the first round also
    /// pays for the servers' page cache being filled for the first time).
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

/// What to clean up if the user presses Ctrl-C.
#[derive(Default)]
struct Cleanup {
    pids: Vec<u32>,
    dir: Option<PathBuf>,
}

fn kill_all(c: &Mutex<Cleanup>) {
    let c = c.lock().unwrap_or_else(|p| p.into_inner());
    for &pid in &c.pids {
        if let Ok(pid) = i32::try_from(pid) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    if let Some(d) = &c.dir {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// One transport's column.
enum Column {
    Ran(Box<Measured>),
    Unavailable(String),
    Failed(String),
}

struct Measured {
    write_mbs: f64,
    read_mbs: f64,
    fsync_s: f64,
    cpu_write: f64,
    cpu_read: f64,
    checksum_ok: bool,
    mechs: CounterSnapshot,
    regcache: Option<f64>,
}

fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Fills a buffer with a cheap pseudo-random pattern (and so pre-faults it).
fn pattern(len: usize, seed: u64) -> Bytes {
    let mut v = stripefs::buf::aligned_zeroed(len);
    let mut x = seed | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
    Bytes::from(v)
}

fn prefaulted(len: usize) -> BytesMut {
    let mut b = stripefs::buf::aligned_zeroed(len);
    for i in (0..len).step_by(4096) {
        b[i] = 1;
    }
    b
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let size = usize::try_from(a.size_mib << 20)?;
    let tmp = tempfile::Builder::new().prefix("stripefs-demo-").tempdir()?;
    let cleanup = Arc::new(Mutex::new(Cleanup { pids: Vec::new(), dir: Some(tmp.path().to_owned()) }));
    {
        let c = cleanup.clone();
        let _ = ctrlc::set_handler(move || {
            eprintln!("\nstripefs demo: interrupted; stopping servers and removing the data directory");
            kill_all(&c);
            std::process::exit(130);
        });
    }
    println!(
        "stripefs demo: 1 meta + {} io servers as child processes on loopback, a {} MiB file \
         written and read {} times (median shown), data in {}",
        a.io_servers,
        a.size_mib,
        a.runs.max(1),
        tmp.path().display()
    );
    let data = pattern(size, 0x5eed_f00d);
    let want = xxhash_rust::xxh3::xxh3_64(&data);
    let mut rbuf = Some(prefaulted(size));
    let mut cols = Vec::new();
    for &scheme in &a.transports {
        let col = match probe(scheme) {
            Err(reason) => Column::Unavailable(reason),
            Ok(()) => {
                let dir = tmp.path().join(scheme.as_str());
                match run_one(scheme, &a, &dir, &data, want, &mut rbuf, &cleanup) {
                    Ok(m) => Column::Ran(Box::new(m)),
                    Err(e) => Column::Failed(super::error_line(&e)),
                }
            }
        };
        cols.push((format!("{scheme}://"), col));
    }
    print_table(&cols, a.size_mib);
    drop(tmp);
    cleanup.lock().unwrap_or_else(|p| p.into_inner()).dir = None;
    println!("done in {:.1} s; servers stopped, data directory removed", started.elapsed().as_secs_f64());
    if cols.iter().any(|(_, c)| match c {
        Column::Failed(_) => true,
        Column::Ran(m) => !m.checksum_ok,
        Column::Unavailable(_) => false,
    }) {
        bail!("the demo failed on at least one transport");
    }
    Ok(())
}

/// Can this build bind the transport at all?
fn probe(scheme: Scheme) -> std::result::Result<(), String> {
    match Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()) {
        Ok(_) => Ok(()),
        Err(ionet::Error::Unsupported(r)) => Err(format!("not available in this build: {r}")),
        Err(e) => Err(format!("not available: {e}")),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn run_one(
    scheme: Scheme,
    a: &DemoArgs,
    dir: &Path,
    data: &Bytes,
    want: u64,
    rbuf: &mut Option<BytesMut>,
    cleanup: &Mutex<Cleanup>,
) -> Result<Measured> {
    let exe = std::env::current_exe()?;
    let cluster = LocalCluster::start(LocalClusterOptions::new(exe, scheme, a.io_servers, dir))?;
    cleanup.lock().unwrap_or_else(|p| p.into_inner()).pids.extend(cluster.pids());
    let client = Client::connect(cluster.config())?;
    for r in client.ping_all() {
        r.context("pinging the io servers")?;
    }
    let f = client.create("/demo.bin", CreateOptions::default())?;
    let size = data.len() as f64;
    let gb = size / 1e9;
    let ep = client.endpoint();
    let c0 = ep.info().counters;
    let (mut w, mut r, mut cw, mut cr, mut fs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut ok = true;
    for _ in 0..a.runs.max(1) {
        let (cpu, t) = (cpu_time(), Instant::now());
        f.write_at(0, data)?;
        w.push(size / 1e6 / t.elapsed().as_secs_f64());
        cw.push((cpu_time() - cpu).as_secs_f64() / gb);
        let t = Instant::now();
        f.sync()?;
        fs.push(t.elapsed().as_secs_f64());
        let buf = rbuf.take().context("read buffer lost")?;
        let (cpu, t) = (cpu_time(), Instant::now());
        let (buf, n) = f.read_at(0, buf)?;
        r.push(size / 1e6 / t.elapsed().as_secs_f64());
        cr.push((cpu_time() - cpu).as_secs_f64() / gb);
        ok &= n == data.len() && xxhash_rust::xxh3::xxh3_64(&buf) == want;
        *rbuf = Some(buf);
    }
    let info = ep.info();
    let c1 = info.counters;
    let mechs = c1.since(&c0);
    let stats: u64 = client.server_stats().into_iter().filter_map(|s| s.ok()).map(|s| s.bytes_written).sum();
    if stats < data.len() as u64 {
        bail!("io servers report {stats} bytes written, expected at least {}", data.len());
    }
    drop(f);
    drop(client);
    cluster.stop();
    Ok(Measured {
        write_mbs: median(w),
        read_mbs: median(r),
        fsync_s: median(fs),
        cpu_write: median(cw),
        cpu_read: median(cr),
        checksum_ok: ok,
        mechs,
        regcache: info.regcache.map(|r| r.hit_rate()),
    })
}

fn print_table(cols: &[(String, Column)], size_mib: u64) {
    let mut rows: Vec<(String, Vec<String>)> = vec![
        (format!("write {size_mib} MiB (MB/s)"), vec![]),
        (format!("read {size_mib} MiB (MB/s)"), vec![]),
        ("fsync after write (s)".into(), vec![]),
        ("client CPU, write (s/GB)".into(), vec![]),
        ("client CPU, read (s/GB)".into(), vec![]),
        ("checksum (xxh3-64)".into(), vec![]),
        ("mechanisms (inline/fast/rdma)".into(), vec![]),
        ("regcache hit rate".into(), vec![]),
    ];
    for (_, col) in cols {
        let vals: Vec<String> = match col {
            Column::Ran(m) => vec![
                format!("{:.0}", m.write_mbs),
                format!("{:.0}", m.read_mbs),
                format!("{:.2}", m.fsync_s),
                format!("{:.2}", m.cpu_write),
                format!("{:.2}", m.cpu_read),
                if m.checksum_ok { "ok".into() } else { "MISMATCH".into() },
                format!("{}/{}/{}", m.mechs.mech_inline, m.mechs.mech_fast_rdma, m.mechs.mech_server_rdma),
                m.regcache.map_or("n/a (no registration)".into(), |h| format!("{:.1}%", h * 100.0)),
            ],
            Column::Unavailable(why) => {
                let mut v = vec![String::new(); rows.len()];
                v[0] = why.clone();
                v
            }
            Column::Failed(why) => {
                let mut v = vec![String::new(); rows.len()];
                v[0] = format!("FAILED: {why}");
                v
            }
        };
        for (row, v) in rows.iter_mut().zip(vals) {
            row.1.push(v);
        }
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols.len())
        .map(|i| rows.iter().map(|r| r.1[i].len()).chain([cols[i].0.len()]).max().unwrap_or(0))
        .collect();
    println!();
    let mut line = format!("{:w0$}", "");
    for (i, (name, _)) in cols.iter().enumerate() {
        line += &format!("  {:>w$}", name, w = widths[i]);
    }
    println!("{}", line.trim_end());
    for (label, vals) in &rows {
        let mut line = format!("{label:w0$}");
        for (i, v) in vals.iter().enumerate() {
            line += &format!("  {:>w$}", v, w = widths[i]);
        }
        println!("{}", line.trim_end());
    }
    println!();
}

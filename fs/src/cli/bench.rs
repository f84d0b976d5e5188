//! `stripefs bench`: concurrent read/write bandwidth as in the PVFS paper (003, §1.12 of
//! `reference/pfs.md`): every client writes, then reads back, one contiguous region of 2N MiB
//! (N = io servers) of one shared file; clients start together (a barrier) and the bandwidth is
//! total bytes over the slowest client's time. A first version: clients are threads of this
//! process, each with its own `Client` (own endpoint and connections); servers are child
//! processes.

use anyhow::{Context, Result, bail};
use bytes::{Bytes, BytesMut};
use clap::Args;
use ionet::Scheme;
use std::sync::{Arc, Barrier};
use std::time::Instant;
use stripefs::capability::Rights;
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::proto::LayoutSpec;
use stripefs::{Client, CreateOptions};

/// `bench` options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// io server counts to run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    io_servers: Vec<u32>,
    /// Client counts to run.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    clients: Vec<u32>,
    /// Transport.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "softib", "ib"])]
    transport: String,
    /// MiB per client per io server (the paper: 2).
    #[arg(long, default_value_t = 2)]
    mib_per_server: u64,
    /// Repetitions; with 5 or more the best and worst are dropped and the rest averaged (the
    /// paper's method), otherwise the median is shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Stripe size (default: the filesystem default, 64 KiB).
    #[arg(long)]
    stripe_size: Option<u64>,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
}

fn summarize(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.len() >= 5 {
        let mid = &v[1..v.len() - 1];
        mid.iter().sum::<f64>() / mid.len() as f64
    } else {
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// Runs the benchmark matrix.
pub fn run(a: BenchArgs) -> Result<()> {
    let scheme = match a.transport.as_str() {
        "softib" => Scheme::SoftIb,
        "ib" => Scheme::Ib,
        _ => Scheme::Tcp,
    };
    let tmp = tempfile::Builder::new().prefix("stripefs-bench-").tempdir()?;
    if a.csv {
        println!("transport,io_servers,clients,region_mib,write_mbs,read_mbs");
    } else {
        println!(
            "stripefs bench over {scheme}://, each client a {}N MiB region of one shared file",
            a.mib_per_server
        );
        println!(
            "{:>10} {:>8} {:>11} {:>12} {:>12}",
            "io servers", "clients", "region MiB", "write MB/s", "read MB/s"
        );
    }
    for &n in &a.io_servers {
        let exe = std::env::current_exe()?;
        let dir = tmp.path().join(format!("n{n}"));
        let mut opts = LocalClusterOptions::new(exe, scheme, n, &dir);
        opts.stripe_size = a.stripe_size;
        let cluster = LocalCluster::start(opts).with_context(|| format!("starting {n} io servers"))?;
        for &c in &a.clients {
            let region = (a.mib_per_server * u64::from(n)) << 20;
            let (w, r) = one(&cluster, n, c, region, a.runs)?;
            if a.csv {
                println!("{scheme},{n},{c},{},{w:.1},{r:.1}", region >> 20);
            } else {
                println!("{n:>10} {c:>8} {:>11} {w:>12.1} {r:>12.1}", region >> 20);
            }
        }
        cluster.stop();
    }
    Ok(())
}

fn one(cluster: &LocalCluster, n: u32, clients: u32, region: u64, runs: usize) -> Result<(f64, f64)> {
    let setup = Client::connect(cluster.config())?;
    let name = format!("/bench-{n}-{clients}");
    let spec = LayoutSpec { base: Some(0), pcount: Some(n), ssize: None };
    drop(setup.create(&name, CreateOptions { mode: 0o644, layout: Some(spec) })?);
    let barrier = Arc::new(Barrier::new(clients as usize));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let (cfg, name, barrier) = (cluster.config().clone(), name.clone(), barrier.clone());
            std::thread::spawn(move || -> Result<Vec<(f64, f64)>> {
                let client = Client::connect(&cfg)?;
                let f = client.open(&name, Rights::READ_WRITE)?;
                let data = Bytes::from(vec![i as u8 ^ 0x5a; region as usize]);
                let mut buf = BytesMut::zeroed(region as usize);
                buf.fill(1); // pre-fault
                let off = u64::from(i) * region;
                let mut times = Vec::new();
                for _ in 0..runs.max(1) {
                    barrier.wait();
                    let t = Instant::now();
                    f.write_at(off, &data)?;
                    let tw = t.elapsed().as_secs_f64();
                    barrier.wait();
                    let t = Instant::now();
                    let (b, got) = f.read_at(off, buf)?;
                    let tr = t.elapsed().as_secs_f64();
                    buf = b;
                    if got != region as usize || buf[..] != data[..] {
                        bail!("client {i} read back different data");
                    }
                    times.push((tw, tr));
                }
                Ok(times)
            })
        })
        .collect();
    let mut per_run: Vec<(f64, f64)> = vec![(0.0, 0.0); runs.max(1)];
    for h in handles {
        let times = h.join().map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        for (slot, (tw, tr)) in per_run.iter_mut().zip(times) {
            slot.0 = slot.0.max(tw);
            slot.1 = slot.1.max(tr);
        }
    }
    let total = (region * u64::from(clients)) as f64 / 1e6;
    let w = summarize(per_run.iter().map(|t| total / t.0).collect());
    let r = summarize(per_run.iter().map(|t| total / t.1).collect());
    setup.unlink(&name)?;
    Ok((w, r))
}

//! CPU: client and io-server CPU seconds per GB moved, per transport and mechanism (each at the
//! request size it exists for: inline / eager small, fast RDMA medium, server-based RDMA /
//! rendezvous large), per client wait mode. PVFS over InfiniBand saw 1.5 % client CPU over VAPI
//! against 91 % over TCP; the target here is server-based RDMA costing the client at most 10 %
//! of what TCP costs it. The client is one thread of this process (whose CPU time is the client's);
//! the io server's comes from `/proc` (10 ms ticks, hence runs of a second or so).

use super::util::{mbs, pattern};
use super::{Ctx, Report, image};
use anyhow::{Result, bail};
use benchkit::plot::BarChart;
use benchkit::{Sample, Samples, Summary, Table, units};
use bytes::BytesMut;
use clap::Args;
use ionet::{Mechanism, Policy, Scheme, WaitMode};
use std::time::Instant;
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "cpu";
/// The file region the writes cycle over.
const REGION: u64 = 64 << 20;

/// CPU options.
#[derive(Args, Debug, Clone)]
pub struct CpuArgs {
    /// Client wait modes to compare.
    #[arg(long, value_delimiter = ',', default_value = "block,adaptive")]
    pub waits: Vec<WaitMode>,
    /// MiB moved per run by server-based RDMA / rendezvous (the small-request mechanisms move
    /// less: a 16th and a quarter).
    #[arg(long, default_value_t = 1024)]
    pub mib: u64,
}

/// One measured configuration.
#[derive(Debug, Clone, Copy)]
struct Case {
    mech: Mechanism,
    /// Request size.
    size: u64,
    /// The case moves `mib / share`.
    share: u64,
    /// Writes from a buffer of the endpoint's registered pool (registration-cache hits) rather
    /// than from plain memory registered per request. Reads always land in plain memory:
    /// `read_at` fills a caller's `BytesMut`.
    pooled: bool,
    /// Plain memory with its registrations kept cached between requests
    /// (`IbConfig::cache_foreign`, MPI's `leave_pinned`): both writes and reads.
    cached: bool,
}

fn cases(scheme: Scheme) -> Vec<Case> {
    let c = |mech, size, share, pooled| Case { mech, size, share, pooled, cached: false };
    match scheme {
        Scheme::Tcp => {
            vec![c(Mechanism::Inline, 16 << 10, 16, false), c(Mechanism::ServerRdma, 1 << 20, 1, false)]
        }
        _ => vec![
            c(Mechanism::Inline, 4 << 10, 64, false),
            c(Mechanism::FastRdma, 64 << 10, 16, false),
            c(Mechanism::ServerRdma, 1 << 20, 1, false),
            c(Mechanism::ServerRdma, 1 << 20, 1, true),
            Case { cached: true, ..c(Mechanism::ServerRdma, 1 << 20, 1, false) },
        ],
    }
}

fn series(scheme: Scheme, k: &Case, op: &str) -> String {
    let kind = match (k.pooled, k.cached) {
        (true, _) => " (registered buffer)",
        (false, true) => " (cached registration)",
        (false, false) => "",
    };
    format!("{} {op}{kind}", k.mech.name_on(scheme))
}

/// A pool buffer seen as `Bytes`.
struct Pooled(ionet::RegisteredBuf);
impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Runs the CPU experiment.
pub fn run(ctx: &Ctx, a: &CpuArgs) -> Result<Report> {
    let mut s = Samples::new();
    let mib = if ctx.c.quick { (a.mib / 8).max(8) } else { a.mib };
    for &scheme in &ctx.c.transports {
        let cluster = ctx.cluster(scheme, 1, |_| {})?;
        let io_pids: Vec<u32> = cluster.pids().into_iter().skip(1).collect();
        let setup = ctx.client(&cluster, ClientOptions::default())?;
        let spec = LayoutSpec { base: Some(0), pcount: Some(1), ssize: None };
        drop(setup.create("/cpu", CreateOptions { mode: 0o644, layout: Some(spec) })?);
        for &wait in &a.waits {
            for k in cases(scheme) {
                let Case { mech, size, share, pooled, cached } = k;
                let bytes = ((mib << 20) / share).max(size);
                let ops = bytes / size;
                eprintln!(
                    "cpu {scheme}: {} {} B requests, client wait {}",
                    mech.name_on(scheme),
                    size,
                    wait.name()
                );
                let mut policy = Policy::for_scheme(scheme);
                policy.force(Some(mech));
                // The client's buffers live as long as the client: nothing to invalidate.
                let ib = cached.then(|| stripefs::client::default_ib_config().cache_foreign(true));
                let client = ctx.client(
                    &cluster,
                    ClientOptions { wait_mode: wait, policy: Some(policy), ib, ..Default::default() },
                )?;
                let f = client.open("/cpu", Rights::READ_WRITE)?;
                let data = if pooled {
                    let mut b = client.endpoint().alloc(size as usize)?;
                    b.set_len(size as usize)?;
                    b.copy_from_slice(&pattern(size as usize, size));
                    bytes::Bytes::from_owner(Pooled(b))
                } else {
                    pattern(size as usize, size)
                };
                let mut buf = Some(super::util::prefaulted(size as usize));
                let slots = (REGION / size).max(1);
                let write = |n: u64| -> Result<()> {
                    for i in 0..n {
                        f.write_at((i % slots) * size, &data)?;
                    }
                    Ok(())
                };
                write(slots.min(ops))?; // fill the region once, untimed
                let mut read = |n: u64| -> Result<()> {
                    for i in 0..n {
                        let b: BytesMut = buf.take().unwrap_or_default();
                        let (b, got) = f.read_at((i % slots) * size, b)?;
                        if got != size as usize {
                            bail!("short read");
                        }
                        buf = Some(b);
                    }
                    Ok(())
                };
                let ep = client.endpoint().clone();
                for r in 0..ctx.c.runs() {
                    for op in ["write", "read"] {
                        if pooled && op == "read" {
                            continue;
                        }
                        let i0 = ep.info();
                        let (c0, d0) = (i0.counters, device_ns(&i0));
                        let (cc, sc, t) =
                            (benchkit::cpu::self_cpu(), benchkit::cpu::procs_cpu(&io_pids), Instant::now());
                        if op == "write" {
                            write(ops)?;
                        } else {
                            read(ops)?;
                        }
                        let secs = t.elapsed().as_secs_f64();
                        let client_cpu = (benchkit::cpu::self_cpu() - cc).as_secs_f64();
                        let server_cpu = (benchkit::cpu::procs_cpu(&io_pids) - sc).as_secs_f64();
                        let i1 = ep.info();
                        let (c1, device) = (i1.counters, (device_ns(&i1) - d0) as f64 / 1e9);
                        let forced = c1.by_mechanism(mech) - c0.by_mechanism(mech);
                        if forced < ops {
                            bail!("cpu {scheme}: only {forced} of {ops} {op}s took {}", mech.name_on(scheme));
                        }
                        let gb = (ops * size) as f64 / 1e9;
                        let name = series(scheme, &k, op);
                        let sample = |m: &str, u: &str, v: f64| {
                            Sample::new(EXP, scheme.as_str(), &name, size as f64)
                                .metric(m, u)
                                .run(r as u32, v)
                                .wait(wait.name())
                                .note(format!("bytes={};server_wait=adaptive", ops * size))
                        };
                        s.push(sample("bandwidth", "MB/s", mbs(ops * size, secs)));
                        s.push(sample("client_cpu_per_gb", "s/GB", client_cpu / gb));
                        if scheme != Scheme::Tcp {
                            s.push(sample(
                                "client_host_cpu_per_gb",
                                "s/GB",
                                (client_cpu - device).max(0.0) / gb,
                            ));
                        }
                        s.push(sample("server_cpu_per_gb", "s/GB", server_cpu / gb));
                    }
                }
                drop(f);
            }
        }
        cluster.stop();
    }
    render(&s, &ctx.link_prefix)
}

/// Nanoseconds the software provider spent on the device's work in this process (0 on TCP
/// and on hardware).
fn device_ns(info: &ionet::Info) -> u64 {
    info.rdma.as_ref().and_then(|r| r.provider.device_ns).unwrap_or(0)
}

/// Table and plot.
pub fn render(s: &Samples, prefix: &str) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let waits = e.distinct(|r| r.wait.clone());
    let mut tab = Table::new([
        "transport",
        "mechanism, operation",
        "request",
        "client wait",
        "MB/s",
        "client CPU s/GB",
        "client CPU less emulated HCA s/GB",
        "io server CPU s/GB",
    ]);
    let keys: Vec<(String, String, f64)> = {
        let mut v = Vec::new();
        for r in e.rows() {
            let k = (r.transport.clone(), r.series.clone(), r.x);
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    };
    let get = |t: &str, se: &str, x: f64, w: &str, m: &str| -> Option<Summary> {
        let v: Vec<f64> = e
            .rows()
            .iter()
            .filter(|r| r.transport == t && r.series == se && r.x == x && r.wait == w && r.metric == m)
            .map(|r| r.value)
            .collect();
        Summary::of(&v)
    };
    let cell = |v: Option<Summary>| v.map_or("–".into(), |v| v.to_string());
    for (t, se, x) in &keys {
        for w in &waits {
            if get(t, se, *x, w, "bandwidth").is_none() {
                continue;
            }
            tab.row([
                format!("{t}://"),
                se.clone(),
                units::size(*x),
                w.clone(),
                cell(get(t, se, *x, w, "bandwidth")),
                cell(get(t, se, *x, w, "client_cpu_per_gb")),
                cell(get(t, se, *x, w, "client_host_cpu_per_gb")),
                cell(get(t, se, *x, w, "server_cpu_per_gb")),
            ]);
        }
    }
    let mut md = String::from(
        "CPU seconds per GB (10⁹ B) moved, one client thread and one io server (adaptive waits), each \
         mechanism forced at its request size; the client's figure is this process's CPU time. Plain user \
         memory is registered and deregistered per request (by default ionet does not keep foreign \
         registrations, so freed memory can never be hit stale); \"registered buffer\" writes come from \
         the endpoint's registered pool and hit the registration cache; \"cached registration\" is plain \
         memory with `IbConfig::cache_foreign` on (MPI's leave_pinned: the application invalidates \
         before freeing), so the same buffers hit the cache on every request after the first. The \
         software provider does an HCA's work (the copies, the peer's receive ring and CQ, its wake-up) \
         on the posting thread; \"less emulated HCA\" subtracts the time it reports for that \
         (`VerbsCounters::device_ns`), an estimate of the client's CPU on hardware.\n\n",
    );
    md.push_str(&tab.render());
    // The target: server-based RDMA costs the client at most a tenth of TCP's CPU.
    let mut cmp = Table::new([
        "operation",
        "client wait",
        "tcp rendezvous s/GB",
        "softib server-rdma s/GB",
        "softib / tcp",
        "less emulated HCA / tcp",
    ]);
    let big = (1u64 << 20) as f64;
    for op in ["write", "read"] {
        for w in &waits {
            let a = get("tcp", &format!("rendezvous {op}"), big, w, "client_cpu_per_gb");
            for pooled in ["", " (registered buffer)", " (cached registration)"] {
                let series = format!("server-rdma {op}{pooled}");
                let b = get("softib", &series, big, w, "client_cpu_per_gb");
                let host = get("softib", &series, big, w, "client_host_cpu_per_gb");
                if b.is_none() {
                    continue;
                }
                let pct = |b: Option<Summary>| match (a, b) {
                    (Some(a), Some(b)) => format!("{:.1} %", 100.0 * b.ratio_to(&a)),
                    _ => "–".into(),
                };
                cmp.row([format!("{op}{pooled}"), w.clone(), cell(a), cell(b), pct(b), pct(host)]);
            }
        }
    }
    if !cmp.is_empty() {
        md.push_str(
            "\nClient CPU of large (1 MiB) requests, server-based RDMA against TCP (target: ≤ 10 %):\n\n",
        );
        md.push_str(&cmp.render());
    }
    let mut plots = Vec::new();
    let groups: Vec<(String, String, f64)> = keys.clone();
    if !groups.is_empty() {
        let chart = BarChart {
            title: "Client CPU seconds per GB by transport and mechanism".into(),
            y_desc: "client CPU s/GB".into(),
            groups: groups
                .iter()
                .map(|(t, se, _)| {
                    format!("{t} {se}")
                        .replace("registered buffer", "reg. buffer")
                        .replace("cached registration", "cached reg.")
                })
                .collect(),
            series: waits
                .iter()
                .map(|w| {
                    (
                        format!("wait {w}"),
                        groups.iter().map(|(t, se, x)| get(t, se, *x, w, "client_cpu_per_gb")).collect(),
                    )
                })
                .collect(),
            log_y: true,
        };
        md.push('\n');
        md.push_str(&image(prefix, "cpu.svg"));
        plots.push(("cpu.svg".to_string(), chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

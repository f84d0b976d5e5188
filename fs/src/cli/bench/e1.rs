//! E1: concurrent read/write bandwidth (paper 003's method, repeated in 000 §6.3). Every client
//! writes, then reads back, one contiguous 2N MiB region (N = io servers) of one shared file
//! striped over all N servers; clients start each phase together and the bandwidth is total
//! bytes over the slowest client's time. The same run measures `ionet-perf` streaming
//! bandwidth on each transport (same machine state, no CPU pinning, like the clients here) so
//! every figure has its "fraction of what the transport moves" beside it.

use super::util::{self, mbs, parallel, pattern, prefaulted};
use super::{Ctx, Report, image};
use anyhow::{Context, Result, bail};
use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table};
use clap::Args;
use ionet::{Scheme, WaitMode};
use std::process::Command;
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e1";
/// The reference: ionet-perf streaming bandwidth at this message size.
pub const REF_SIZE: u64 = 1 << 20;

/// E1 options.
#[derive(Args, Debug, Clone)]
pub struct E1Args {
    /// io server counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub io_servers: Vec<u32>,
    /// Client counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub clients: Vec<u32>,
    /// MiB per client per io server (the papers: 2).
    #[arg(long, default_value_t = 2)]
    pub mib_per_server: u64,
    /// Stripe size in bytes (default: the file system's, 64 KiB; paper 003 used 16 KiB).
    #[arg(long)]
    pub stripe_size: Option<u64>,
    /// Skip the same-run ionet-perf reference.
    #[arg(long)]
    pub no_reference: bool,
    /// How clients and io servers wait for the transport (block, like the ionet-perf
    /// reference; spinning threads on a 2-core machine steal the CPU that moves the data).
    #[arg(long, default_value = "block")]
    pub wait: WaitMode,
    /// Clients keep their buffers' InfiniBand registrations cached across calls
    /// (`IbConfig::cache_foreign`, MPI's leave_pinned) and invalidate them before freeing.
    #[arg(long)]
    pub cache_registrations: bool,
    /// Give each side a CPU of its own, as if clients and servers were separate nodes (paper
    /// 003's setup): client threads on CPU 0, io and meta servers on CPU 1, and the ionet-perf
    /// reference pinned the same way (its client on 0, its server on 1). Default: no pinning,
    /// the scheduler places everything.
    #[arg(long)]
    pub pin: bool,
}

/// The CPUs of [`E1Args::pin`]: clients, servers (ionet-perf's own split).
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;

/// Runs E1.
pub fn run(ctx: &Ctx, a: &E1Args) -> Result<Report> {
    let mut s = Samples::new();
    if a.pin {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            bail!("--pin needs 2 CPUs, this machine has {cpus}");
        }
    }
    let (io, clients) = if ctx.c.quick && a.io_servers == [1, 2, 3, 4] && a.clients == [1, 2, 3, 4] {
        (vec![1, 4], vec![1, 4])
    } else {
        (a.io_servers.clone(), a.clients.clone())
    };
    for &scheme in &ctx.c.transports {
        if !a.no_reference {
            s.extend(reference(ctx, scheme, a.pin)?.rows().iter().cloned());
        }
        for &n in &io {
            eprintln!("e1 {scheme}: {n} io servers");
            let cluster = ctx.cluster(scheme, n, |o| {
                o.stripe_size = a.stripe_size;
                o.io_args.extend(["--wait".into(), a.wait.name().into()]);
                if a.pin {
                    let cpu = ["--cpus".to_string(), SERVER_CPU.to_string()];
                    o.io_args.extend(cpu.clone());
                    o.meta_args.extend(cpu);
                }
            })?;
            for &c in &clients {
                cell(ctx, &cluster, scheme, n, c, a, &mut s)
                    .with_context(|| format!("E1 over {scheme}://, {n} io servers, {c} clients"))?;
            }
            cluster.stop();
        }
    }
    render(&s, &ctx.link_prefix, a.mib_per_server)
}

/// `ionet-perf ab` bandwidth at [`REF_SIZE`] on `scheme` in a child process, pinned like the
/// cell (`pin`) or not.
fn reference(ctx: &Ctx, scheme: Scheme, pin: bool) -> Result<Samples> {
    let perf = ctx.c.ionet_perf()?;
    let dir = ctx.data_dir().join(format!("e1-ref-{scheme}"));
    let mut cmd = Command::new(perf);
    cmd.args(["ab", "--transports", scheme.as_str(), "--bw-only", "--bw-sizes", "1m"])
        .args(if pin { &[][..] } else { &["--no-pin"][..] })
        .args(["--runs", &ctx.c.runs().to_string(), "--out"])
        .arg(&dir);
    if ctx.c.quick {
        cmd.arg("--quick");
    }
    eprintln!("e1 {scheme}: ionet-perf reference");
    util::run_bounded(&mut cmd, Duration::from_secs(600))?;
    Ok(reference_rows(&Samples::read_csv(&dir.join("ab.csv"))?, scheme))
}

/// The E1 reference from an `ab` run: `scheme`'s bandwidth from plain heap buffers, as the E1
/// clients use (not the `ionet-pool` series), in MB/s.
fn reference_rows(ab: &Samples, scheme: Scheme) -> Samples {
    ab.rows()
        .iter()
        .filter(|r| r.transport == scheme.as_str() && r.series == "ionet" && r.metric == "bandwidth")
        .map(|r| {
            let mut r = r.clone();
            r.experiment = "e1-ref".into();
            r.series = "ionet-perf".into();
            r.metric = "bandwidth".into();
            r.unit = "MB/s".into();
            r.value *= 1000.0; // GB/s → MB/s
            r
        })
        .collect()
}

fn cell(
    ctx: &Ctx,
    cluster: &stripefs::cluster::LocalCluster,
    scheme: Scheme,
    n: u32,
    c: u32,
    a: &E1Args,
    s: &mut Samples,
) -> Result<()> {
    let region = (a.mib_per_server * u64::from(n)) << 20;
    let ib = a.cache_registrations.then(|| stripefs::client::default_ib_config().cache_foreign(true));
    let opts = ClientOptions { wait_mode: a.wait, ib, ..ClientOptions::default() };
    let setup = ctx.client(cluster, opts.clone())?;
    let name = format!("/e1-{n}-{c}");
    let spec = LayoutSpec { base: Some(0), pcount: Some(n), ssize: None };
    drop(setup.create(&name, CreateOptions { mode: 0o644, layout: Some(spec) })?);
    let runs = ctx.c.runs();
    let before = path_totals(&setup)?;
    let per_client = parallel(c as usize, ctx.step_timeout(), |i, gate| -> Result<Vec<(f64, f64)>> {
        if a.pin {
            crate::cli::pin_to_cpus(&[CLIENT_CPU])?;
        }
        let client = ctx.client(cluster, opts.clone())?;
        let f = client.open(&name, Rights::READ_WRITE)?;
        let data = pattern(region as usize, 0xe1 + i as u64);
        let mut buf = prefaulted(region as usize);
        let off = u64::from(i as u32) * region;
        let mut times = Vec::new();
        // One untimed round first: the servers' first write of a region allocates its pages.
        for r in 0..=runs {
            gate.wait()?;
            let t = Instant::now();
            f.write_at(off, &data)?;
            let tw = t.elapsed().as_secs_f64();
            gate.wait()?;
            let t = Instant::now();
            let (b, got) = f.read_at(off, buf)?;
            let tr = t.elapsed().as_secs_f64();
            buf = b;
            if got != region as usize || buf[..] != data[..] {
                bail!("client {i} read back different data");
            }
            if r > 0 {
                times.push((tw, tr));
            }
        }
        // Cached registrations must not outlive the memory they cover.
        client.endpoint().invalidate_registrations(&data);
        client.endpoint().invalidate_registrations(&buf);
        Ok(times)
    })?;
    // The figures are for io servers that move data straight to and from their mapped objects:
    // a silent fallback to the copying path would make them describe something else.
    let (mapped, copied) = path_totals(&setup)?;
    let moved = 2 * (runs as u64 + 1) * region * u64::from(c);
    if copied != before.1 || mapped - before.0 != moved {
        bail!(
            "io servers moved {} B on the mapped path and {} B by copying, expected {moved} B mapped",
            mapped - before.0,
            copied - before.1
        );
    }
    let total = region * u64::from(c);
    let t = scheme.as_str();
    for r in 0..runs {
        let tw = per_client.iter().map(|v| v[r].0).fold(0.0, f64::max);
        let tr = per_client.iter().map(|v| v[r].1).fold(0.0, f64::max);
        let sample = |op: &str, v: f64| {
            Sample::new(EXP, t, &format!("{op} N={n}"), f64::from(c))
                .metric("bandwidth", "MB/s")
                .run(r as u32, v)
                .wait(a.wait.name())
                .note(format!(
                    "region_bytes={region}{}{}",
                    if a.cache_registrations { " cached_registrations" } else { "" },
                    if a.pin { " pinned" } else { "" }
                ))
        };
        s.push(sample("write", mbs(total, tw)));
        s.push(sample("read", mbs(total, tr)));
    }
    setup.unlink(&name)?;
    Ok(())
}

/// Bytes the cluster's io servers have moved on the mapped and on the copying path.
fn path_totals(client: &stripefs::Client) -> Result<(u64, u64)> {
    let mut t = (0, 0);
    for st in client.server_stats() {
        let st = st.context("io server statistics")?;
        t.0 += st.mapped.bytes;
        t.1 += st.copied.bytes;
    }
    Ok(t)
}

fn cell_text(v: Option<Summary>) -> String {
    v.map_or("–".into(), |v| v.to_string())
}

/// Tables and plots of E1.
pub fn render(s: &Samples, prefix: &str, mib_per_server: u64) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts: Vec<String> = e.distinct(|r| r.transport.clone());
    let ns: Vec<u32> = {
        let mut v: Vec<u32> = e
            .rows()
            .iter()
            .filter_map(|r| r.series.split("N=").nth(1).and_then(|x| x.parse().ok()))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let cs = e.xs();
    let waits = e.distinct(|r| r.wait.clone()).join("/");
    let cached = if e.rows().iter().any(|r| r.note.contains("cached_registrations")) {
        " Clients keep their buffers' registrations cached across calls (`--cache-registrations`)."
    } else {
        ""
    };
    let placement = if e.rows().iter().any(|r| r.note.contains("pinned")) {
        " Pinned (`--pin`): client threads on CPU 0, io and meta servers on CPU 1, the ionet-perf reference \
         pinned the same way."
    } else {
        " No CPU pinning, for the clients, the servers and the ionet-perf reference."
    };
    let reference = |t: &str| s.get("e1-ref", t, "ionet-perf", "bandwidth", REF_SIZE as f64);
    let mut md = format!(
        "Each client writes, then reads back, one contiguous {mib_per_server}N MiB region (N = io servers) of one \
         shared file striped over the N servers (64 KiB stripes unless stated); bandwidth = total bytes / slowest \
         client's time, MB/s = 10⁶ B/s. One untimed round first, then the runs. Clients: threads of the bench \
         process, one `Client` each, {waits} waits; io servers: child processes, {waits} waits, data on tmpfs, every byte moved \
         on their mapped path (checked against their counters).{cached}{placement}\n\n"
    );
    for t in &ts {
        let rf = reference(t);
        md.push_str(&format!(
            "**{t}://** — ionet-perf streaming bandwidth, 1 MiB messages, same run: {} MB/s.\n\n",
            cell_text(rf)
        ));
        let mut tab = Table::new([
            "io servers",
            "clients",
            "write MB/s",
            "read MB/s",
            "write / ionet-perf",
            "read / ionet-perf",
        ]);
        for &n in &ns {
            for &c in &cs {
                let w = e.get(EXP, t, &format!("write N={n}"), "bandwidth", c);
                let r = e.get(EXP, t, &format!("read N={n}"), "bandwidth", c);
                if w.is_none() && r.is_none() {
                    continue;
                }
                let ratio = |x: Option<Summary>| match (x, rf) {
                    (Some(x), Some(b)) => format!("{:.2}×", x.ratio_to(&b)),
                    _ => "–".into(),
                };
                tab.row([n.to_string(), format!("{c:.0}"), cell_text(w), cell_text(r), ratio(w), ratio(r)]);
            }
        }
        md.push_str(&tab.render());
        md.push('\n');
    }
    if ts.len() == 2 {
        let (a, b) = (&ts[0], &ts[1]);
        let mut tab =
            Table::new(["io servers", "clients", &format!("write {b} / {a}"), &format!("read {b} / {a}")]);
        for &n in &ns {
            for &c in &cs {
                let r = |op: &str| match (
                    e.get(EXP, b, &format!("{op} N={n}"), "bandwidth", c),
                    e.get(EXP, a, &format!("{op} N={n}"), "bandwidth", c),
                ) {
                    (Some(x), Some(y)) => format!("{:.2}×", x.ratio_to(&y)),
                    _ => "–".into(),
                };
                tab.row([n.to_string(), format!("{c:.0}"), r("write"), r("read")]);
            }
        }
        md.push_str(&format!("Ratio of medians, {b}:// over {a}:// (same run):\n\n"));
        md.push_str(&tab.render());
        md.push('\n');
    }
    let mut plots = Vec::new();
    for op in ["write", "read"] {
        let mut series = Vec::new();
        for t in &ts {
            for &n in &ns {
                let pts: Vec<(f64, Summary)> = cs
                    .iter()
                    .filter_map(|&c| e.get(EXP, t, &format!("{op} N={n}"), "bandwidth", c).map(|v| (c, v)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                let name = format!("{t} N={n}");
                series.push(if t == "tcp" { Series::baseline(name, pts) } else { Series::new(name, pts) });
            }
        }
        if series.is_empty() {
            continue;
        }
        let chart = LineChart {
            title: format!("E1 concurrent {op}: each client {mib_per_server}N MiB of one file"),
            x_desc: "clients".into(),
            y_desc: "aggregate MB/s".into(),
            x_scale: Scale::Count,
            y_scale: Scale::Linear,
            series,
        };
        let name = format!("e1-{op}.svg");
        md.push_str(&image(prefix, &name));
        plots.push((name, chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchkit::Sample;

    #[test]
    fn reference_is_the_heap_buffer_stream_of_its_transport_in_mb_per_s() {
        let mut ab = Samples::new();
        let mib = REF_SIZE as f64;
        ab.push(Sample::new("ab", "softib", "ionet", mib).metric("bandwidth", "GB/s").run(0, 4.0));
        ab.push(Sample::new("ab", "softib", "ionet-pool", mib).metric("bandwidth", "GB/s").run(0, 10.0));
        ab.push(Sample::new("ab", "tcp", "ionet", mib).metric("bandwidth", "GB/s").run(0, 5.0));
        ab.push(Sample::new("ab", "softib", "ionet", mib).metric("client_cpu_per_gb", "s/GB").run(0, 0.1));
        let r = reference_rows(&ab, Scheme::SoftIb);
        let got = r.get("e1-ref", "softib", "ionet-perf", "bandwidth", mib).expect("a reference");
        assert_eq!(r.rows().len(), 1, "only softib's heap-buffer bandwidth");
        assert_eq!(got.to_string(), Summary::of(&[4000.0]).unwrap().to_string());
    }

    #[test]
    fn the_report_says_whether_clients_and_servers_were_pinned() {
        let cell = |note: &str| {
            let mut s = Samples::new();
            for op in ["write", "read"] {
                s.push(
                    Sample::new(EXP, "tcp", &format!("{op} N=1"), 1.0)
                        .metric("bandwidth", "MB/s")
                        .run(0, 5000.0)
                        .wait("block")
                        .note(note.to_string()),
                );
            }
            render(&s, "", 2).unwrap().md
        };
        assert!(cell("region_bytes=2097152 pinned").contains("Pinned (`--pin`)"));
        assert!(cell("region_bytes=2097152").contains("No CPU pinning"));
    }
}

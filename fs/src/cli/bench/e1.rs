//! E1: concurrent read/write bandwidth (paper 003's method, repeated in 000 §6.3). Every client
//! writes, then reads back, one contiguous 2N MiB region (N = io servers) of one shared file
//! striped over all N servers; clients start each phase together and the bandwidth is total
//! bytes over the slowest client's time, counted from their common start. Just before and just
//! after each cell, `ionet-perf` streaming runs on the same transport are drawn
//! ([`PairedReference`]; placed like the clients and servers), so every cell has its "fraction
//! of what the transport moves" against the machine state it ran in.

use super::reference::{PairedReference, Placement, Waits};
use super::util::{mbs, parallel, pattern, prefaulted};
use super::{Ctx, Report, image};
use anyhow::{Context, Result, bail};
use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table};
use clap::Args;
use ionet::{Scheme, WaitMode};
use std::sync::Mutex;
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e1";
/// The experiment name of the reference draws.
const REF_EXP: &str = "e1-ref";
/// The target: every cell at least this fraction of its reference.
pub const TARGET: f64 = 0.8;

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
    /// Skip the ionet-perf reference drawn beside every cell.
    #[arg(long)]
    pub no_reference: bool,
    /// How clients wait for the transport, and the ionet-perf reference's client (block:
    /// spinning threads on a 2-core machine steal the CPU that moves the data).
    #[arg(long, default_value = "block")]
    pub wait: WaitMode,
    /// How io servers wait, and the reference's server (default: as `--wait`). Up to four io
    /// servers share one CPU here, where each would have a node of its own, so servers that
    /// spin take it from each other.
    #[arg(long)]
    pub server_wait: Option<WaitMode>,
    /// Clients keep their buffers' InfiniBand registrations cached across calls
    /// (`IbConfig::cache_foreign`, MPI's leave_pinned) and invalidate them before freeing.
    #[arg(long)]
    pub cache_registrations: bool,
    /// Let the scheduler place everything. By default (on 2 CPUs or more) each side gets a CPU
    /// of its own, as if clients and servers were separate nodes (paper 003's setup): client
    /// threads on CPU 0, io and meta servers on CPU 1, and the ionet-perf reference pinned the
    /// same way (its client on 0, its server on 1, as `ionet-perf ab` pins by default).
    /// Unpinned, the figures also measure where the scheduler happened to put each thread.
    #[arg(long)]
    pub no_pin: bool,
}

impl E1Args {
    fn waits(&self) -> Waits {
        Waits { client: self.wait, server: self.server_wait.unwrap_or(self.wait) }
    }
}

/// The CPUs of pinned runs: clients, servers (ionet-perf's own split).
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;

/// Runs E1.
pub fn run(ctx: &Ctx, a: &E1Args) -> Result<Report> {
    let mut s = Samples::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = !a.no_pin && cpus >= 2;
    if !a.no_pin && !pin {
        eprintln!("e1: {cpus} CPU, so clients and servers are not pinned apart");
    }
    let (io, clients) = if ctx.c.quick && a.io_servers == [1, 2, 3, 4] && a.clients == [1, 2, 3, 4] {
        (vec![1, 4], vec![1, 4])
    } else {
        (a.io_servers.clone(), a.clients.clone())
    };
    let place =
        if pin { Placement::Pinned { client: CLIENT_CPU, server: SERVER_CPU } } else { Placement::Unpinned };
    for &scheme in &ctx.c.transports {
        let reference = if a.no_reference {
            None
        } else {
            eprintln!("e1 {scheme}: starting the ionet-perf reference");
            let r =
                PairedReference::start(&ctx.c.ionet_perf()?, scheme, place, a.waits(), ctx.step_timeout())
                    .with_context(|| format!("the ionet-perf reference on {scheme}://"))?;
            Some(Mutex::new(r))
        };
        for &n in &io {
            eprintln!("e1 {scheme}: {n} io servers");
            let cluster = ctx.cluster(scheme, n, |o| {
                o.stripe_size = a.stripe_size;
                o.io_args.extend(["--wait".into(), a.waits().server.name().into()]);
                if pin {
                    let cpu = ["--cpus".to_string(), SERVER_CPU.to_string()];
                    o.io_args.extend(cpu.clone());
                    o.meta_args.extend(cpu);
                }
            })?;
            for &c in &clients {
                let at = CellAt { cluster: &cluster, scheme, n, c, pin };
                cell(ctx, at, a, reference.as_ref(), &mut s)
                    .with_context(|| format!("E1 over {scheme}://, {n} io servers, {c} clients"))?;
            }
            cluster.stop();
        }
    }
    render(&s, &ctx.link_prefix, a.mib_per_server)
}

/// One cell of the grid: `c` clients of a cluster of `n` io servers on `scheme`.
#[derive(Clone, Copy)]
struct CellAt<'a> {
    cluster: &'a stripefs::cluster::LocalCluster,
    scheme: Scheme,
    n: u32,
    c: u32,
    /// Client threads on [`CLIENT_CPU`] (the servers were started on [`SERVER_CPU`]).
    pin: bool,
}

fn cell(
    ctx: &Ctx,
    at: CellAt<'_>,
    a: &E1Args,
    reference: Option<&Mutex<PairedReference>>,
    s: &mut Samples,
) -> Result<()> {
    let CellAt { cluster, scheme, n, c, pin } = at;
    let region = (a.mib_per_server * u64::from(n)) << 20;
    let ib = a.cache_registrations.then(|| stripefs::client::default_ib_config().cache_foreign(true));
    let opts = ClientOptions { wait_mode: a.wait, ib, ..ClientOptions::default() };
    let setup = ctx.client(cluster, opts.clone())?;
    let name = format!("/e1-{n}-{c}");
    let spec = LayoutSpec { base: Some(0), pcount: Some(n), ssize: None };
    drop(setup.create(&name, CreateOptions { mode: 0o644, layout: Some(spec) })?);
    let runs = ctx.c.runs();
    let before = path_totals(&setup)?;
    // Each client's (write, read) times per run. Client 0 also draws the reference: half the
    // draws just before the cell's untimed round (the others wait at the gate), half just after
    // its last run. Not between runs: a cell's runs take milliseconds and follow each other as
    // a client's calls do; a 0.1 s pause before each would make every run start from idle
    // servers (that costs 1×1 writes half their bandwidth here).
    type Timed = (Vec<(f64, f64)>, Vec<f64>);
    let per_client = parallel(c as usize, ctx.step_timeout(), |i, gate| -> Result<Timed> {
        if pin {
            crate::cli::pin_to_cpus(&[CLIENT_CPU])?;
        }
        let client = ctx.client(cluster, opts.clone())?;
        let f = client.open(&name, Rights::READ_WRITE)?;
        let data = pattern(region as usize, 0xe1 + i as u64);
        let mut buf = prefaulted(region as usize);
        let off = u64::from(i as u32) * region;
        let mut times = Vec::new();
        let mut draws = Vec::new();
        let mut draw = |k: usize| -> Result<()> {
            if let (0, Some(rf)) = (i, reference) {
                let mut rf = rf.lock().unwrap_or_else(|p| p.into_inner());
                for _ in 0..k {
                    draws.push(rf.draw()?);
                }
            }
            Ok(())
        };
        draw(runs.div_ceil(2))?;
        // One untimed round first: the servers' first write of a region allocates its pages.
        for r in 0..=runs {
            // Timed from the gate's release, not from when this thread got the CPU.
            let t = gate.wait()?;
            f.write_at(off, &data)?;
            let tw = t.elapsed().as_secs_f64();
            let t = gate.wait()?;
            let (b, got) = f.read_at(off, buf)?;
            let tr = t.elapsed().as_secs_f64();
            buf = b;
            // Check the bytes once every client has read: a check run while the others still
            // read takes their CPU (an 8 MiB compare is about a millisecond here) and stretches
            // the slowest client's time, which is what E1 measures.
            gate.wait()?;
            if got != region as usize || buf[..] != data[..] {
                bail!("client {i} read back different data");
            }
            if r > 0 {
                times.push((tw, tr));
            }
        }
        draw(runs / 2)?;
        // Cached registrations must not outlive the memory they cover.
        client.endpoint().invalidate_registrations(&data);
        client.endpoint().invalidate_registrations(&buf);
        Ok((times, draws))
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
    let server_wait = a.waits().server;
    let note = format!(
        "region_bytes={region}{}{}{}",
        if a.cache_registrations { " cached_registrations" } else { "" },
        if pin { " pinned" } else { "" },
        if server_wait != a.wait { format!(" server_wait={}", server_wait.name()) } else { String::new() }
    );
    for r in 0..runs {
        let tw = per_client.iter().map(|v| v.0[r].0).fold(0.0, f64::max);
        let tr = per_client.iter().map(|v| v.0[r].1).fold(0.0, f64::max);
        let sample = |op: &str, v: f64| {
            Sample::new(EXP, t, &format!("{op} N={n}"), f64::from(c))
                .metric("bandwidth", "MB/s")
                .run(r as u32, v)
                .wait(a.wait.name())
                .note(note.clone())
        };
        s.push(sample("write", mbs(total, tw)));
        s.push(sample("read", mbs(total, tr)));
    }
    for (r, &v) in per_client[0].1.iter().enumerate() {
        s.push(
            Sample::new(REF_EXP, t, &ref_series(n), f64::from(c))
                .metric("bandwidth", "MB/s")
                .run(r as u32, v)
                .wait(a.wait.name())
                .note(note.clone()),
        );
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

/// The series of the reference draws beside the cells with `n` io servers.
fn ref_series(n: u32) -> String {
    format!("ionet-perf N={n}")
}

/// The io server counts in E1's rows.
fn server_counts(e: &Samples) -> Vec<u32> {
    let mut v: Vec<u32> = e
        .rows()
        .iter()
        .filter(|r| r.experiment == EXP)
        .filter_map(|r| r.series.split("N=").nth(1).and_then(|x| x.parse().ok()))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The reference drawn beside the runs of the cell with `n` io servers and `c` clients on `t`.
pub fn paired_reference(s: &Samples, t: &str, n: u32, c: f64) -> Option<Summary> {
    s.get(REF_EXP, t, &ref_series(n), "bandwidth", c)
}

/// Every reference draw on `t` in this run.
pub fn all_draws(s: &Samples, t: &str) -> Option<Summary> {
    let v: Vec<f64> = s
        .rows()
        .iter()
        .filter(|r| r.experiment == REF_EXP && r.transport == t && r.metric == "bandwidth")
        .map(|r| r.value)
        .collect();
    Summary::of(&v)
}

/// One cell against its reference.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRatio {
    pub io_servers: u32,
    pub clients: u32,
    pub op: &'static str,
    /// The cell's median over the median of the reference drawn beside it.
    pub ratio: f64,
}

/// Every cell on `t` that has a reference, against it.
pub fn cell_ratios(s: &Samples, t: &str) -> Vec<CellRatio> {
    let mut out = Vec::new();
    let clients = s.filter(|r| r.experiment == EXP && r.transport == t).xs();
    for n in server_counts(s) {
        for &c in &clients {
            let Some(rf) = paired_reference(s, t, n, c) else { continue };
            for op in ["write", "read"] {
                if let Some(v) = s.get(EXP, t, &format!("{op} N={n}"), "bandwidth", c) {
                    out.push(CellRatio { io_servers: n, clients: c as u32, op, ratio: v.ratio_to(&rf) });
                }
            }
        }
    }
    out
}

/// Tables and plots of E1.
pub fn render(s: &Samples, prefix: &str, mib_per_server: u64) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts: Vec<String> = e.distinct(|r| r.transport.clone());
    let ns = server_counts(&e);
    let cs = e.xs();
    let waits = e.distinct(|r| r.wait.clone()).join("/");
    // Servers wait as the clients do unless a run's note says otherwise.
    let server_waits = e
        .distinct(|r| {
            r.note
                .split(' ')
                .find_map(|w| w.strip_prefix("server_wait="))
                .map_or(r.wait.clone(), str::to_string)
        })
        .join("/");
    let cached = if e.rows().iter().any(|r| r.note.contains("cached_registrations")) {
        " Clients keep their buffers' registrations cached across calls (`--cache-registrations`)."
    } else {
        ""
    };
    let placement = if e.rows().iter().any(|r| r.note.contains("pinned")) {
        " Pinned, as two nodes: client threads on CPU 0, io and meta servers on CPU 1, the ionet-perf \
         reference pinned the same way."
    } else {
        " No CPU pinning (`--no-pin`), for the clients, the servers and the ionet-perf reference."
    };
    let mut md = format!(
        "Each client writes, then reads back, one contiguous {mib_per_server}N MiB region (N = io servers) of one \
         shared file striped over the N servers (64 KiB stripes unless stated); bandwidth = total bytes / the slowest \
         client's time from the clients' common start, MB/s = 10⁶ B/s. One untimed round first, then the runs. Clients: threads of the bench \
         process, one `Client` each, {waits} waits; io servers: child processes, {server_waits} waits, data on tmpfs, every byte moved \
         on their mapped path (checked against their counters).{cached}{placement}\n\n"
    );
    for t in &ts {
        md.push_str(&format!("**{t}://**"));
        if let Some(all) = all_draws(s, t) {
            let ratios = cell_ratios(s, t);
            let met = ratios.iter().filter(|r| r.ratio >= TARGET).count();
            md.push_str(&format!(
                " — ionet-perf streaming bandwidth (1 MiB messages, 16 in flight, its client and server waiting as the clients and io servers do), as many runs as the cell \
                 has, drawn just before and just after it: {} MB/s over all {} draws. Cells at ≥ {TARGET}× of the reference beside \
                 them: {met} of {}.",
                cell_text(Some(all)),
                all.n,
                ratios.len()
            ));
        }
        md.push_str("\n\n");
        let mut tab = Table::new([
            "io servers",
            "clients",
            "write MB/s",
            "read MB/s",
            "ionet-perf beside, MB/s",
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
                let rf = paired_reference(s, t, n, c);
                let ratio = |x: Option<Summary>| match (x, rf) {
                    (Some(x), Some(b)) => format!("{:.2}×", x.ratio_to(&b)),
                    _ => "–".into(),
                };
                tab.row([
                    n.to_string(),
                    format!("{c:.0}"),
                    cell_text(w),
                    cell_text(r),
                    cell_text(rf),
                    ratio(w),
                    ratio(r),
                ]);
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

    fn bw(exp: &str, series: &str, clients: f64, run: u32, v: f64) -> Sample {
        Sample::new(exp, "tcp", series, clients).metric("bandwidth", "MB/s").run(run, v).wait("block")
    }

    /// Each cell is judged against the draws beside its own runs, not against the transport's
    /// draws as a whole: here the two cells have the same bandwidth, but the machine ran twice
    /// as fast beside the second.
    #[test]
    fn each_cell_is_compared_with_the_reference_drawn_beside_it() {
        let mut s = Samples::new();
        for r in 0..3 {
            for (c, beside) in [(1.0, 5000.0), (4.0, 10_000.0)] {
                s.push(bw(EXP, "write N=1", c, r, 4500.0));
                s.push(bw(EXP, "read N=1", c, r, 4500.0));
                s.push(bw(REF_EXP, &ref_series(1), c, r, beside + f64::from(r)));
            }
        }
        let got = cell_ratios(&s, "tcp");
        let ratio = |c: u32, op: &str| {
            got.iter().find(|x| x.clients == c && x.op == op).map(|x| (x.ratio * 100.0).round() / 100.0)
        };
        assert_eq!(got.len(), 4);
        assert_eq!(ratio(1, "write"), Some(0.9));
        assert_eq!(ratio(1, "read"), Some(0.9));
        assert_eq!(ratio(4, "write"), Some(0.45));
        let md = render(&s, "", 2).unwrap().md;
        assert!(
            md.contains("| 1 | 1 | 4500 (4500–4500) | 4500 (4500–4500) | 5001 (5000–5002) | 0.90× | 0.90× |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| 1 | 4 | 4500 (4500–4500) | 4500 (4500–4500) | 10001 (10000–10002) | 0.45× | 0.45× |"
            ),
            "{md}"
        );
        assert!(
            md.contains("over all 6 draws. Cells at ≥ 0.8× of the reference beside them: 2 of 4."),
            "{md}"
        );
    }

    #[test]
    fn without_a_reference_the_cells_have_no_ratio() {
        let mut s = Samples::new();
        s.push(bw(EXP, "write N=1", 1.0, 0, 4500.0));
        s.push(bw(EXP, "read N=1", 1.0, 0, 4500.0));
        assert!(cell_ratios(&s, "tcp").is_empty());
        let md = render(&s, "", 2).unwrap().md;
        assert!(md.contains("| 1 | 1 | 4500 | 4500 | – | – | – |"), "{md}");
        assert!(!md.contains("draws"), "{md}");
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
        assert!(cell("region_bytes=2097152 pinned").contains("Pinned, as two nodes"));
        assert!(cell("region_bytes=2097152").contains("No CPU pinning"));
    }
}

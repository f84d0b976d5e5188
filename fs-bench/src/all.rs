//! `stripefs-bench all`: every experiment in one run — `ionet-perf ab`, `calibrate` and `qos`
//! (transport-only, in child processes) and E1–E5 and CPU (here) — then a report: each
//! experiment's CSV, Markdown and plots in the output directory, `REPORT.md` with all of them,
//! and with `--update FILE` the summary of `BENCHMARKS.md` replaced in place (between
//! `<!-- BEGIN GENERATED: bench-summary -->` markers; the text around them is kept): the machine,
//! the targets, the headline plots and where every table is. The tables themselves go to
//! `REPORT.md` and one Markdown file per step beside the CSVs, so the user's page stays short.

use super::{Common, Ctx, Report, cpu, e1, e2, e3, e5, tiles, util};
use anyhow::{Context, Result, bail};
use benchkit::{Machine, Samples, Summary, Table, doc};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `all` options.
#[derive(Args, Debug, Clone)]
pub struct AllArgs {
    /// Regenerate the summary of this Markdown file (BENCHMARKS.md). Refused with
    /// --quick: quick figures are not for publication.
    #[arg(long)]
    pub update: Option<PathBuf>,
    /// Run only these steps (ab, calibrate, qos, e1, e2, e3, e4, e5, cpu).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip these steps.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// A criterion output directory (`$CARGO_TARGET_DIR/criterion`) to report as the
    /// micro-benchmark section.
    #[arg(long)]
    pub criterion: Option<PathBuf>,
    /// The command that produced the criterion results (shown beside them).
    #[arg(long, default_value = "cargo bench")]
    pub criterion_cmd: String,
}

/// The steps, in order, with their section titles.
pub const STEPS: [(&str, &str); 9] = [
    ("ab", "ionet-perf: tcp:// and softib:// side by side, with raw-socket, memcpy and iperf3 baselines"),
    ("calibrate", "ionet-perf calibrate: each mechanism across sizes, recommended thresholds"),
    ("qos", "QoS: Control-class round trips under a Bulk stream"),
    ("e1", "E1: concurrent read/write, 1–4 io servers × 1–4 clients"),
    ("e2", "E2: small-write access time by mechanism and registration-cache hit rate"),
    ("e3", "E3: 32 MiB transfer against the transfer unit"),
    ("e4", "E4: tiled access with and without list I/O"),
    ("e5", "E5: list-I/O registrations with and without allocation hints"),
    ("cpu", "CPU seconds per GB by transport, mechanism and wait mode"),
];

/// Plot links in Markdown placed in `doc_dir` pointing into `out/plots/`.
pub fn link_prefix(doc_dir: &Path, out: &Path) -> String {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (d, o) = (canon(doc_dir), canon(out));
    match o.strip_prefix(&d) {
        Ok(rel) if rel.as_os_str().is_empty() => "plots/".into(),
        Ok(rel) => format!("{}/plots/", rel.display()),
        Err(_) => format!("{}/plots/", o.display()),
    }
}

fn run_perf(c: &Common, mode: &str, extra: &[&str], out: &Path, prefix: &str) -> Result<Report> {
    let perf = c.ionet_perf()?;
    let transports: Vec<&str> = c.transports.iter().map(|t| t.as_str()).collect();
    let mut cmd = Command::new(perf);
    cmd.arg(mode)
        .args(["--transports", &transports.join(",")])
        .args(["--runs", &c.runs().to_string(), "--link-prefix", prefix, "--out"])
        .arg(out)
        .args(extra);
    if c.quick {
        cmd.arg("--quick");
    }
    util::run_bounded(&mut cmd, Duration::from_secs(20 * 60))?;
    // ionet-perf writes its plots beside its CSV: move them under plots/.
    std::fs::create_dir_all(out.join("plots"))?;
    let mut plots = Vec::new();
    for e in std::fs::read_dir(out)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "svg") {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            std::fs::rename(&p, out.join("plots").join(&name))?;
            plots.push(name);
        }
    }
    let samples = Samples::read_csv(&out.join(format!("{mode}.csv")))?;
    let md = std::fs::read_to_string(out.join(format!("{mode}.md")))?;
    Ok(Report { samples, md, plots: Vec::new() })
}

/// The headline figures the project set targets for, from everything measured.
pub fn targets(all: &Samples) -> String {
    let mut t = Table::new(["target", "measured (median of runs, min–max)", "met?"]);
    let mib = (1u64 << 20) as f64;
    let ratio = |a: Option<Summary>, b: Option<Summary>| match (a, b) {
        (Some(a), Some(b)) => Some(a.ratio_to(&b)),
        _ => None,
    };
    // "measured / baseline unit = ratio", with "–" for what is missing.
    let shown = |a: Option<Summary>, b: Option<Summary>, unit: &str, r: Option<String>| {
        let cell = |v: Option<Summary>| v.map_or("–".to_string(), |v| v.to_string());
        format!("{} / {} {unit} = {}", cell(a), cell(b), r.unwrap_or_else(|| "–".into()))
    };
    let times = |r: Option<f64>| r.map(|r| format!("{r:.2}×"));
    // Targets whose figures were not measured in this run are left out.
    let mut row = |what: &str, r: Option<f64>, ok: &dyn Fn(f64) -> bool, shown: String| {
        if r.is_none() {
            return;
        }
        t.row([
            what.to_string(),
            shown,
            r.map_or("–".into(), |r| if ok(r) { "yes".into() } else { "no".into() }),
        ]);
    };
    // 1 MiB bandwidth softib ≥ 1.5 × tcp, from registered pool buffers on both sides
    // (how RDMA bandwidth is measured: `Endpoint::alloc`, BMI_memalloc) and from plain heap memory,
    // with blocking waits and with the library's default ones (which give tcp a fifth more); and
    // the heap sender's CPU per GB, softib's ≤ 10 % of tcp's.
    let streams = [
        ("ionet-pool", "pool buffers, blocking waits"),
        ("ionet", "heap buffers, blocking waits"),
        ("ionet-default-waits", "heap buffers, default waits"),
    ];
    for (series, what) in streams {
        let sb = all.get("ab", "softib", series, "bandwidth", mib);
        let tb = all.get("ab", "tcp", series, "bandwidth", mib);
        let r = ratio(sb, tb);
        row(
            &format!("ionet-perf 1 MiB bandwidth ({what}), softib:// ≥ 1.5 × tcp://"),
            r,
            &|r| r >= 1.5,
            shown(sb, tb, "GB/s", times(r)),
        );
    }
    for (series, what) in &streams[1..] {
        let sc = all.get("ab", "softib", series, "client_cpu_per_gb", mib);
        let tc = all.get("ab", "tcp", series, "client_cpu_per_gb", mib);
        let r = ratio(sc, tc);
        row(
            &format!("ionet-perf 1 MiB streaming, sender CPU per GB ({what}), softib:// ≤ 10 % of tcp://"),
            r,
            &|r| r <= 0.10,
            shown(sc, tc, "s/GB", r.map(|r| format!("{:.1} %", r * 100.0))),
        );
    }
    // Every E1 cell ≥ 0.8 × the ionet-perf run beside it, on the same transport; and,
    // to tell stripefs's cost from its workload's and its transport's, against the same stream
    // over the cell's footprint, (read cells) against ionet-perf's reads from N servers, and
    // each cell against the one of those two that moves its bytes its way.
    for t_ in ["tcp", "softib"] {
        for (cells, cell, against) in [
            (e1::cell_ratios(all, e1::Reference::Peak, t_), "cell", "the ionet-perf run beside it"),
            (
                e1::cell_ratios(all, e1::Reference::Footprint, t_),
                "cell",
                "ionet-perf over the cell's footprint, beside it,",
            ),
            (
                e1::cell_ratios(all, e1::Reference::Reads, t_),
                "read cell",
                "ionet-perf's reads from as many servers, beside it,",
            ),
            (
                e1::same_transfer_ratios(all, t_),
                "cell",
                "ionet-perf moving its bytes the way it does (writes: over the footprint; reads: from as many servers), beside it,",
            ),
        ] {
            let Some(low) = cells.iter().min_by(|a, b| a.ratio.total_cmp(&b.ratio)) else { continue };
            let met = cells.iter().filter(|c| c.ratio >= e1::TARGET).count();
            row(
                &format!("stripefs E1, every {cell} ≥ {} × {against} on {t_}://", e1::TARGET),
                Some(low.ratio),
                &|r| r >= e1::TARGET,
                format!(
                    "{met} of {} cells; lowest {:.2}× ({} io servers × {} clients, {})",
                    cells.len(),
                    low.ratio,
                    low.io_servers,
                    low.clients,
                    low.op
                ),
            );
        }
    }
    // Client CPU of server-based RDMA ≤ 10 % of TCP's.
    for op in ["write", "read"] {
        for w in ["block", "adaptive"] {
            let pick = |t_: &str, se: &str| {
                let v: Vec<f64> = all
                    .rows()
                    .iter()
                    .filter(|r| {
                        r.experiment == "cpu"
                            && r.transport == t_
                            && r.series == se
                            && r.wait == w
                            && r.metric == "client_cpu_per_gb"
                            && r.x == mib
                    })
                    .map(|r| r.value)
                    .collect();
                Summary::of(&v)
            };
            let b = pick("tcp", &format!("rendezvous {op}"));
            for pooled in ["", " (registered buffer)", " (cached registration)"] {
                let a = pick("softib", &format!("server-rdma {op}{pooled}"));
                if a.is_none() {
                    continue;
                }
                let r = ratio(a, b);
                row(
                    &format!(
                        "client CPU per GB, 1 MiB {op}s{pooled}, server-based RDMA ≤ 10 % of TCP's, client wait {w}"
                    ),
                    r,
                    &|r| r <= 0.10,
                    shown(a, b, "s/GB", r.map(|r| format!("{:.1} %", r * 100.0))),
                );
            }
        }
    }
    t.render()
}

/// Runs everything.
pub fn run(c: Common, a: &AllArgs) -> Result<()> {
    if c.quick && a.update.is_some() {
        bail!("--update is refused with --quick: quick runs are smoke checks, not figures for BENCHMARKS.md");
    }
    let started = Instant::now();
    let machine = Machine::detect();
    let out = c.out_dir();
    std::fs::create_dir_all(out.join("plots"))?;
    let prefix = match &a.update {
        Some(f) => {
            link_prefix(f.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")), &out)
        }
        None => "plots/".into(),
    };
    let wanted =
        |id: &str| (a.only.is_empty() || a.only.iter().any(|o| o == id)) && !a.skip.iter().any(|s| s == id);
    // Fail early, before anything long runs.
    if ["ab", "calibrate", "qos", "e1"].iter().any(|id| wanted(id)) {
        c.ionet_perf()?;
    }
    if ["e1", "e2", "e3", "e4", "e5", "cpu"].iter().any(|id| wanted(id)) {
        c.stripefs()?;
    }
    if let Some(f) = &a.update {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        doc::splice(&text, "bench-summary", "")?;
    }
    let mut ctx = Ctx::new(c.clone())?;
    ctx.link_prefix = prefix.clone();
    let quote = |a: String| if a.contains(' ') { format!("'{a}'") } else { a };
    let command = std::iter::once("stripefs-bench".to_string())
        .chain(std::env::args().skip(1).map(quote))
        .collect::<Vec<_>>()
        .join(" ");
    let mut sections: Vec<(String, String)> = Vec::new();
    let mut all = Samples::new();
    let mut failed: Vec<String> = Vec::new();
    let mut durations: Vec<(String, f64)> = Vec::new();
    let mut plots: Vec<String> = Vec::new();
    for (id, title) in STEPS {
        if !wanted(id) {
            continue;
        }
        eprintln!("\n=== stripefs-bench all: {id} ({:.0} s elapsed)", started.elapsed().as_secs_f64());
        let t = Instant::now();
        let r: Result<Report> = match id {
            "ab" => run_perf(&c, "ab", &[], &out, &prefix),
            "calibrate" => run_perf(&c, "calibrate", &[], &out, &prefix),
            "qos" => run_perf(&c, "qos", &[], &out, &prefix),
            "e1" => e1::run(&ctx, &default_args::<e1::E1Args>()),
            "e2" => e2::run(&ctx, &default_args::<e2::E2Args>()),
            "e3" => e3::run(&ctx, &default_args::<e3::E3Args>()),
            "e4" => tiles::run_e4(&ctx, &default_args::<tiles::TileArgs>()),
            "e5" => e5::run(&ctx, &default_args::<e5::E5Args>()),
            "cpu" => cpu::run(&ctx, &default_args::<cpu::CpuArgs>()),
            _ => unreachable!("every step is handled"),
        };
        let secs = t.elapsed().as_secs_f64();
        durations.push((id.to_string(), secs));
        match r {
            Ok(rep) => {
                if !matches!(id, "ab" | "calibrate" | "qos") {
                    ctx.emit(id, &rep)?;
                }
                all.extend(rep.samples.rows().iter().cloned());
                plots.extend(rep.plots.iter().map(|p| p.0.clone()));
                let alone = match id {
                    "ab" | "calibrate" | "qos" => format!("ionet-perf {id} --transports {}", transports(&c)),
                    _ => format!("stripefs-bench {id} --transports {}", transports(&c)),
                };
                let body = format!(
                    "### {title}\n\nCommand: `{command}` (this step alone: `{alone} --runs {}`), {:.0} s.\n\n{}",
                    c.runs(),
                    secs,
                    rep.md.trim_start_matches("**QUICK RUN (smoke check, not for publication).**\n\n")
                );
                sections.push((format!("bench-{id}"), body));
            }
            Err(e) => {
                eprintln!("stripefs-bench all: {id} FAILED: {}", crate::error_line(&e));
                failed.push(format!("{id}: {}", crate::error_line(&e)));
            }
        }
    }
    if let Some(dir) = &a.criterion {
        let m = benchkit::criterion::read(dir);
        if m.is_empty() {
            failed.push(format!("micro: no criterion results under {}", dir.display()));
        } else {
            sections.push((
                "bench-micro".into(),
                format!(
                    "### Micro-benchmarks (criterion)\n\nCommand: `{}`. Median time per iteration with the 95 % \
                     confidence interval of the median (criterion's bootstrap).\n\n{}",
                    a.criterion_cmd,
                    benchkit::criterion::table(&m)
                ),
            ));
        }
    }
    all.write_csv(&out.join("all.csv"))?;
    let total = started.elapsed().as_secs_f64();
    let mut summary = format!(
        "### Summary\n\n{}\n\nLoad average at the end: {}. Total {:.1} min. Command: `{command}`.\n\n\
         Every figure is the median of {} runs (an E1 cell: of its blocks, see E1) with the min–max spread in brackets; ratios are of medians \
         measured in the same run. Buffers are pre-faulted and reused; io servers keep their data under \
         `{}`; servers are child processes on loopback. Raw samples: `{}/all.csv` and one CSV per step.\n\n",
        machine.describe(),
        benchkit::machine::load_average(),
        total / 60.0,
        c.runs(),
        ctx.data_dir().parent().unwrap_or(ctx.data_dir()).display(),
        out.display()
    );
    if c.quick {
        summary = summary.replacen(
            "### Summary\n\n",
            "### Summary\n\n**QUICK RUN (smoke check of the suite, not figures to publish).**\n\n",
            1,
        );
    }
    let mut d = Table::new(["step", "seconds"]);
    for (id, s) in &durations {
        d.row([id.clone(), format!("{s:.0}")]);
    }
    let tt = targets(&all);
    if tt.lines().count() > 2 {
        summary.push_str("Targets:\n\n");
        summary.push_str(&tt);
    }
    // The headline plots drawn here; every other plot and every table is in the report.
    let headline = |p: &&String| p.starts_with("ab-") || p.starts_with("e1-") || p.as_str() == "cpu.svg";
    if plots.iter().any(|p| headline(&p)) {
        summary.push('\n');
        for p in plots.iter().filter(headline) {
            summary.push_str(&super::image(&prefix, p));
        }
    }
    let report_link = format!("{}REPORT.md", prefix.trim_end_matches("plots/"));
    summary.push_str(&format!(
        "\nEvery step's tables, plots and the command for it alone: [{report_link}]({report_link}); \
         raw samples beside it.\n"
    ));
    summary.push_str("\nTime per step:\n\n");
    summary.push_str(&d.render());
    let mut report = format!("## Transport A/B benchmark suite\n\n{summary}\n");
    for (_, body) in &sections {
        report.push_str(body);
        report.push('\n');
    }
    std::fs::write(out.join("REPORT.md"), &report)?;
    println!("{report}");
    if !failed.is_empty() {
        bail!("{} step(s) failed (BENCHMARKS.md left as it was):\n  {}", failed.len(), failed.join("\n  "));
    }
    if let Some(f) = &a.update {
        let mut text = std::fs::read_to_string(f)?;
        text = doc::splice(&text, "bench-summary", &summary)?;
        let tmp = f.with_extension("md.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, f)?;
        println!("updated {}", f.display());
    }
    println!("done in {:.1} min; results in {}", total / 60.0, out.display());
    Ok(())
}

fn transports(c: &Common) -> String {
    c.transports.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(",")
}

/// An experiment's options at their defaults (as its subcommand would parse them).
fn default_args<T: clap::Args>() -> T {
    #[derive(clap::Parser)]
    struct Wrap<A: clap::Args> {
        #[command(flatten)]
        a: A,
    }
    <Wrap<T> as clap::Parser>::parse_from(["x"]).a
}

#[cfg(test)]
mod tests {
    use super::*;
    use benchkit::Sample;

    #[test]
    fn link_prefixes_are_relative_to_the_document() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("benchmarks");
        std::fs::create_dir_all(&out).unwrap();
        assert_eq!(link_prefix(d.path(), &out), "benchmarks/plots/");
        assert_eq!(link_prefix(&out, &out), "plots/");
        let elsewhere = tempfile::tempdir().unwrap();
        assert!(link_prefix(elsewhere.path(), &out).starts_with('/'));
    }

    #[test]
    fn defaults_parse_for_every_experiment() {
        let e1: e1::E1Args = default_args();
        assert_eq!(e1.io_servers, vec![1, 2, 3, 4]);
        assert_eq!(e1.mib_per_server, 2);
        let t: tiles::TileArgs = default_args();
        assert_eq!((t.elem, t.tile_cols, t.tile_rows), (24, 1024, 768));
        let e5: e5::E5Args = default_args();
        assert_eq!((e5.elem, e5.rows_per_request), (64, 128));
        let c: cpu::CpuArgs = default_args();
        assert_eq!(c.waits.len(), 2);
    }

    #[test]
    fn targets_table_reads_the_right_samples() {
        let mut s = Samples::new();
        let mib = (1u64 << 20) as f64;
        s.push(Sample::new("ab", "softib", "ionet", mib).metric("bandwidth", "GB/s").run(0, 3.0));
        s.push(Sample::new("ab", "tcp", "ionet", mib).metric("bandwidth", "GB/s").run(0, 1.0));
        s.push(Sample::new("ab", "softib", "ionet-pool", mib).metric("bandwidth", "GB/s").run(0, 4.0));
        s.push(Sample::new("ab", "tcp", "ionet-pool", mib).metric("bandwidth", "GB/s").run(0, 2.0));
        for (exp, series, v) in [
            ("e1-ref", "ionet-perf N=1", 1000.0),
            ("e1-ref-footprint", "ionet-perf N=1", 750.0),
            ("e1", "write N=1", 700.0),
            ("e1", "read N=1", 900.0),
        ] {
            s.push(Sample::new(exp, "tcp", series, 1.0).metric("bandwidth", "MB/s").run(0, v));
        }
        s.push(
            Sample::new("e1-ref-reads", "tcp", "ionet-perf N=1", 1.0)
                .metric("bandwidth", "MB/s")
                .run(0, 1000.0),
        );
        s.push(
            Sample::new("cpu", "softib", "server-rdma write", mib)
                .metric("client_cpu_per_gb", "s/GB")
                .run(0, 0.01)
                .wait("block"),
        );
        s.push(
            Sample::new("cpu", "tcp", "rendezvous write", mib)
                .metric("client_cpu_per_gb", "s/GB")
                .run(0, 0.2)
                .wait("block"),
        );
        for (t, gbps, cpu) in [("softib", 2.7, 0.02), ("tcp", 2.0, 0.1)] {
            s.push(Sample::new("ab", t, "ionet-default-waits", mib).metric("bandwidth", "GB/s").run(0, gbps));
            s.push(
                Sample::new("ab", t, "ionet-default-waits", mib)
                    .metric("client_cpu_per_gb", "s/GB")
                    .run(0, cpu),
            );
        }
        let t = targets(&s);
        assert!(t.contains("| ionet-perf 1 MiB bandwidth (heap buffers, blocking waits), softib:// ≥ 1.5 × tcp:// | 3.00 / 1.00 GB/s = 3.00× | yes |"), "{t}");
        assert!(t.contains("| ionet-perf 1 MiB bandwidth (heap buffers, default waits), softib:// ≥ 1.5 × tcp:// | 2.70 / 2.00 GB/s = 1.35× | no |"), "{t}");
        assert!(t.contains("| ionet-perf 1 MiB streaming, sender CPU per GB (heap buffers, default waits), softib:// ≤ 10 % of tcp:// | 0.0200 / 0.100 s/GB = 20.0 % | no |"), "{t}");
        assert!(
            !t.contains("sender CPU per GB (heap buffers, blocking waits)"),
            "not measured in this run: left out\n{t}"
        );
        assert!(t.contains("| ionet-perf 1 MiB bandwidth (pool buffers, blocking waits), softib:// ≥ 1.5 × tcp:// | 4.00 / 2.00 GB/s = 2.00× | yes |"), "{t}");
        assert!(
            t.contains("| stripefs E1, every cell ≥ 0.8 × the ionet-perf run beside it on tcp:// | 1 of 2 cells; lowest 0.70× (1 io servers × 1 clients, write) | no |"),
            "{t}"
        );
        assert!(
            t.contains("| stripefs E1, every read cell ≥ 0.8 × ionet-perf's reads from as many servers, beside it, on tcp:// | 1 of 1 cells; lowest 0.90× (1 io servers × 1 clients, read) | yes |"),
            "{t}"
        );
        assert!(
            t.contains("| stripefs E1, every cell ≥ 0.8 × ionet-perf moving its bytes the way it does (writes: over the footprint; reads: from as many servers), beside it, on tcp:// | 2 of 2 cells; lowest 0.90× (1 io servers × 1 clients, read) | yes |"),
            "{t}"
        );
        assert!(t.contains("= 5.0 % | yes |"), "{t}");
    }
}

//! E3: one client moves 32 MiB to and from one io server (data on tmpfs, like the paper's
//! ramfs) while the server's transfer unit — the size of each pipelined pull / push and
//! file write / read — goes from 64 KiB to 32 MiB (PVFS over InfiniBand, Figure 12: below about
//! 2 MiB the transfer overlaps the file I/O completely; very small units pay start-up costs).

use super::util::{mbs, pattern, prefaulted};
use super::{Ctx, Report, image};
use anyhow::{Result, bail};
use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table, units};
use clap::Args;
use std::time::Instant;
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e3";

/// E3 options.
#[derive(Args, Debug, Clone)]
pub struct E3Args {
    /// Bytes moved per operation (binary units allowed: 32M).
    #[arg(long, default_value = "32M", value_parser = stripefs::units::parse_size)]
    pub bytes: u64,
    /// Transfer units (bytes or binary units: 64k,1M; default powers of two 64 KiB – 32 MiB).
    #[arg(long, value_delimiter = ',', value_parser = stripefs::units::parse_size)]
    pub units: Vec<u64>,
}

fn units_of(a: &E3Args, quick: bool) -> Vec<u64> {
    if !a.units.is_empty() {
        return a.units.clone();
    }
    let mut v = Vec::new();
    let mut u = 64u64 << 10;
    while u <= (32 << 20) {
        v.push(u);
        u *= if quick { 8 } else { 2 };
    }
    if v.last() != Some(&(32 << 20)) {
        v.push(32 << 20);
    }
    v
}

/// Runs E3.
pub fn run(ctx: &Ctx, a: &E3Args) -> Result<Report> {
    let mut s = Samples::new();
    let len = a.bytes as usize;
    let data = pattern(len, 0xe3);
    let mut buf = Some(prefaulted(len));
    for &scheme in &ctx.c.transports {
        for tu in units_of(a, ctx.c.quick) {
            eprintln!("e3 {scheme}: transfer unit {}", units::size(tu as f64));
            let cluster = ctx.cluster(scheme, 1, |o| o.transfer_unit = Some(tu))?;
            let client = ctx.client(&cluster, ClientOptions::default())?;
            let spec = LayoutSpec { base: Some(0), pcount: Some(1), ssize: None };
            let f = client.create("/e3", CreateOptions { mode: 0o644, layout: Some(spec) })?;
            drop(f);
            let f = client.open("/e3", Rights::READ_WRITE)?;
            for r in 0..=ctx.c.runs() {
                let t = Instant::now();
                f.write_at(0, &data)?;
                let tw = t.elapsed().as_secs_f64();
                let b = buf.take().unwrap_or_default();
                let t = Instant::now();
                let (b, got) = f.read_at(0, b)?;
                let tr = t.elapsed().as_secs_f64();
                if got != len || b[..] != data[..] {
                    bail!("E3 over {scheme}://: read back different data");
                }
                buf = Some(b);
                // Round 0 is a warm-up (first write allocates the server's pages).
                if r > 0 {
                    for (op, secs) in [("write", tw), ("read", tr)] {
                        s.push(
                            Sample::new(EXP, scheme.as_str(), op, tu as f64)
                                .metric("bandwidth", "MB/s")
                                .run(r as u32 - 1, mbs(a.bytes, secs))
                                .wait("adaptive"),
                        );
                    }
                }
            }
            drop(f);
            drop(client);
            cluster.stop();
        }
    }
    render(&s, &ctx.link_prefix, a.bytes)
}

/// Table and plot of E3.
pub fn render(s: &Samples, prefix: &str, bytes: u64) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let ts = e.distinct(|r| r.transport.clone());
    let mut head = vec!["transfer unit".to_string()];
    for t in &ts {
        head.push(format!("{t} write MB/s"));
        head.push(format!("{t} read MB/s"));
    }
    let mut tab = Table::new(head);
    for x in e.xs() {
        let mut row = vec![units::size(x)];
        for t in &ts {
            for op in ["write", "read"] {
                row.push(e.get(EXP, t, op, "bandwidth", x).map_or("–".into(), |v| v.to_string()));
            }
        }
        tab.row(row);
    }
    let mut md = format!(
        "One client, one io server (data on tmpfs), {} per `write_at` / `read_at`, against the io server's \
         transfer unit (each pipelined pull / push and file write / read; 4 in flight). MB/s = 10⁶ B/s; a warm-up \
         round first.\n\n",
        units::size(bytes as f64)
    );
    md.push_str(&tab.render());
    let mut series = Vec::new();
    for t in &ts {
        for op in ["write", "read"] {
            let pts: Vec<(f64, Summary)> = e
                .xs()
                .into_iter()
                .filter_map(|x| e.get(EXP, t, op, "bandwidth", x).map(|v| (x, v)))
                .collect();
            if !pts.is_empty() {
                let n = format!("{t} {op}");
                series.push(if t == "tcp" { Series::baseline(n, pts) } else { Series::new(n, pts) });
            }
        }
    }
    let mut plots = Vec::new();
    if !series.is_empty() {
        let chart = LineChart {
            title: format!("E3 pipelined bulk transfer, {} per operation", units::size(bytes as f64)),
            x_desc: "io server transfer unit".into(),
            y_desc: "MB/s".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Linear,
            series,
        };
        md.push('\n');
        md.push_str(&image(prefix, "e3.svg"));
        plots.push(("e3.svg".to_string(), chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

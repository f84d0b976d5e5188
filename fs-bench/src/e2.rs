//! E2: small-write access time, 128 B – 64 KiB, for each mechanism forced in turn (PVFS over
//! InfiniBand, Figure 11): inline, fast RDMA and server-based RDMA, the latter with the client's
//! buffer registered already (100 % registration-cache hits: a buffer from the endpoint's
//! registered pool) or not (0 %: plain memory, registered and deregistered per write). On TCP
//! the two mechanisms are eager and rendezvous. One client, one io server, the same 4 KiB…64 KiB
//! thresholds lifted on both sides so every mechanism can carry every size (IB receive buffers
//! of 72 KiB so inline fits). The client's counters confirm the path each point took.

use super::{Ctx, Report, image};
use anyhow::{Context, Result, bail};
use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table, units};
use bytes::Bytes;
use clap::Args;
use ionet::{IbConfig, Mechanism, Policy, RegisteredBuf, Scheme, ServiceLevel, Thresholds, WaitMode};
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::proto::LayoutSpec;
use stripefs::{ClientOptions, CreateOptions};

const EXP: &str = "e2";
/// Largest size of the sweep: thresholds and buffers are sized for it.
const MAX: usize = 64 * 1024;
/// IB receive buffers big enough for an inline 64 KiB write plus its request header.
pub const RECV_SIZE: u32 = 72 * 1024;

/// E2 options.
#[derive(Args, Debug, Clone)]
pub struct E2Args {
    /// Write sizes (bytes or binary units: 128,4k; default powers of two 128 B – 64 KiB).
    #[arg(long, value_delimiter = ',', value_parser = stripefs::units::parse_size_usize)]
    pub sizes: Vec<usize>,
    /// How the client waits.
    #[arg(long, default_value = "adaptive")]
    pub wait: WaitMode,
}

/// One line of the figure.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    pub mech: Mechanism,
    /// `Some(true)`: the buffer is registered (100 % hits); `Some(false)`: it is not (0 %);
    /// `None`: registration plays no part (TCP, or a copying mechanism).
    pub registered: Option<bool>,
}

impl Variant {
    /// The series name.
    pub fn name(&self, scheme: Scheme) -> String {
        let m = self.mech.name_on(scheme);
        match self.registered {
            Some(true) => format!("{m}, 100% hit"),
            Some(false) => format!("{m}, 0% hit"),
            None => m.to_string(),
        }
    }
}

/// The variants measured on a transport.
pub fn variants(scheme: Scheme) -> Vec<Variant> {
    let v = |mech, registered| Variant { mech, registered };
    match scheme {
        Scheme::Tcp => vec![v(Mechanism::Inline, None), v(Mechanism::ServerRdma, None)],
        _ => vec![
            v(Mechanism::Inline, Some(false)),
            v(Mechanism::Inline, Some(true)),
            v(Mechanism::FastRdma, Some(false)),
            v(Mechanism::FastRdma, Some(true)),
            v(Mechanism::ServerRdma, Some(false)),
            v(Mechanism::ServerRdma, Some(true)),
        ],
    }
}

/// The sizes of the sweep.
fn sizes(a: &E2Args, quick: bool) -> Vec<usize> {
    if !a.sizes.is_empty() {
        return a.sizes.clone();
    }
    let mut v = Vec::new();
    let mut s = 128;
    while s <= MAX {
        v.push(s);
        s *= if quick { 8 } else { 2 };
    }
    if v.last() != Some(&MAX) {
        v.push(MAX);
    }
    v
}

/// A pool buffer seen as `Bytes` (it stays registered while alive).
struct Pooled(RegisteredBuf);
impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn counter(c: &ionet::CounterSnapshot, m: Mechanism) -> u64 {
    c.by_mechanism(m)
}

/// Runs E2.
pub fn run(ctx: &Ctx, a: &E2Args) -> Result<Report> {
    let mut s = Samples::new();
    let sizes = sizes(a, ctx.c.quick);
    let target = if ctx.c.quick { Duration::from_millis(15) } else { Duration::from_millis(100) };
    for &scheme in &ctx.c.transports {
        let cluster = ctx.cluster(scheme, 1, |o| {
            // The server must accept what the client sends inline / eagerly.
            o.io_env = vec![
                ("IONET_INLINE_MAX".into(), MAX.to_string()),
                ("IONET_FAST_MAX".into(), MAX.to_string()),
            ];
            if scheme != Scheme::Tcp {
                o.io_args.extend(["--ib-recv-size".into(), RECV_SIZE.to_string()]);
            }
        })?;
        let setup = ctx.client(&cluster, ClientOptions::default())?;
        let spec = LayoutSpec { base: Some(0), pcount: Some(1), ssize: None };
        drop(setup.create("/e2", CreateOptions { mode: 0o644, layout: Some(spec) })?);
        for v in variants(scheme) {
            let name = v.name(scheme);
            eprintln!("e2 {scheme}: {name}");
            // Forcing picks the mechanism of sends; for request payloads the engine also
            // follows the thresholds (inline up to inline_max, else fast RDMA), so they are set
            // to match.
            let inline_max = if v.mech == Mechanism::FastRdma { 0 } else { MAX };
            let mut policy = Policy::for_scheme(scheme);
            for sl in ServiceLevel::ALL {
                policy.set(sl, Thresholds { inline_max, fast_max: MAX });
            }
            policy.force(Some(v.mech));
            let opts = ClientOptions {
                wait_mode: a.wait,
                policy: Some(policy),
                ib: (scheme != Scheme::Tcp).then(|| IbConfig::default().recv_size(RECV_SIZE)),
                ..Default::default()
            };
            let client = ctx.client(&cluster, opts)?;
            let f = client.open("/e2", Rights::READ_WRITE)?;
            let ep = client.endpoint().clone();
            for &size in &sizes {
                let buf = if v.registered == Some(true) {
                    let mut b = ep.alloc(size)?;
                    b.set_len(size)?;
                    b.fill(0x2e);
                    Bytes::from_owner(Pooled(b))
                } else {
                    super::util::pattern(size, size as u64)
                };
                // Warm up, and size the runs from it.
                let t = Instant::now();
                let warm = 20;
                for _ in 0..warm {
                    f.write_at(0, &buf)?;
                }
                let per = t.elapsed().as_secs_f64() / f64::from(warm);
                let iters = ((target.as_secs_f64() / per.max(1e-7)) as u64).clamp(20, 200_000);
                for r in 0..ctx.c.runs() {
                    let (c0, h0) = (ep.info().counters, ep.info().regcache);
                    let t = Instant::now();
                    for _ in 0..iters {
                        f.write_at(0, &buf).with_context(|| format!("{name}, {size} B"))?;
                    }
                    let us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
                    let (c1, h1) = (ep.info().counters, ep.info().regcache);
                    let forced = counter(&c1, v.mech) - counter(&c0, v.mech);
                    let (hits, misses) = match (h0, h1) {
                        (Some(a), Some(b)) => (b.hits - a.hits, b.misses - a.misses),
                        _ => (0, 0),
                    };
                    if forced < iters {
                        bail!(
                            "{name} at {size} B: only {forced} of {iters} writes took the forced mechanism"
                        );
                    }
                    s.push(
                        Sample::new(EXP, scheme.as_str(), &name, size as f64)
                            .metric("access_us", "µs")
                            .run(r as u32, us)
                            .wait(a.wait.name())
                            .note(format!(
                                "writes={iters};forced={forced};reg_hits={hits};reg_misses={misses}"
                            )),
                    );
                }
            }
        }
        cluster.stop();
    }
    render(&s, &ctx.link_prefix)
}

/// Registration-cache hit rate of a series (from the runs' notes), if it looked anything up.
fn hit_rate(s: &Samples, t: &str, series: &str) -> Option<f64> {
    let (mut h, mut m) = (0u64, 0u64);
    for r in s.rows().iter().filter(|r| r.transport == t && r.series == series) {
        for kv in r.note.split(';') {
            match kv.split_once('=') {
                Some(("reg_hits", v)) => h += v.parse::<u64>().unwrap_or(0),
                Some(("reg_misses", v)) => m += v.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (h + m > 0).then(|| h as f64 / (h + m) as f64)
}

/// Table and plots of E2.
pub fn render(s: &Samples, prefix: &str) -> Result<Report> {
    let e = s.filter(|r| r.experiment == EXP);
    let mut cols: Vec<(String, String)> = Vec::new();
    for t in e.distinct(|r| r.transport.clone()) {
        for series in e.filter(|r| r.transport == t).distinct(|r| r.series.clone()) {
            cols.push((t.clone(), series));
        }
    }
    let mut head = vec!["size".to_string()];
    head.extend(cols.iter().map(|(t, se)| format!("{t}: {se}")));
    let mut tab = Table::new(head);
    for x in e.xs() {
        let mut row = vec![units::size(x)];
        row.extend(
            cols.iter()
                .map(|(t, se)| e.get(EXP, t, se, "access_us", x).map_or("–".into(), |v| v.to_string())),
        );
        tab.row(row);
    }
    let mut md = String::from(
        "Access time of one `write_at` (µs, lower is better): one client, one io server, each mechanism forced \
         on both sides with the thresholds lifted to 64 KiB; TCP's two mechanisms are eager and rendezvous.\n\n",
    );
    md.push_str(&tab.render());
    let mut hits = Table::new(["transport: series", "registration-cache hit rate over the runs"]);
    for (t, se) in &cols {
        hits.row([
            format!("{t}: {se}"),
            hit_rate(&e, t, se)
                .map_or("no lookups (copied or TCP)".into(), |h| format!("{:.1} %", h * 100.0)),
        ]);
    }
    md.push('\n');
    md.push_str(&hits.render());
    md.push('\n');
    let mut plots = Vec::new();
    for (tag, want) in [("0% hit", "0% hit"), ("100% hit", "100% hit")] {
        let series: Vec<Series> = cols
            .iter()
            .filter(|(t, se)| t == "tcp" || se.ends_with(want))
            .filter_map(|(t, se)| {
                let pts: Vec<(f64, Summary)> = e
                    .xs()
                    .into_iter()
                    .filter_map(|x| e.get(EXP, t, se, "access_us", x).map(|v| (x, v)))
                    .collect();
                if pts.is_empty() {
                    return None;
                }
                let label = format!("{t}: {se}");
                Some(if t == "tcp" { Series::baseline(label, pts) } else { Series::new(label, pts) })
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let chart = LineChart {
            title: format!("E2 small-write access time, registration cache {tag}"),
            x_desc: "write size".into(),
            y_desc: "µs per write".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Log10,
            series,
        };
        let name = format!("e2-{}.svg", tag.replace("% hit", "pct"));
        md.push_str(&image(prefix, &name));
        plots.push((name, chart.render_svg()?));
    }
    Ok(Report { samples: s.clone(), md, plots })
}

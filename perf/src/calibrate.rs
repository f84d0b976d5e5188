//! `ionet-perf calibrate`: measures each mechanism across sizes on the actual transport and
//! recommends the communication manager's thresholds (PVFS over InfiniBand
//! picked its thresholds from such a sweep).
//!
//! Every mechanism is forced in turn on both sides, with receive buffers and ring slots large
//! enough for it to carry every size of the sweep; the client's mechanism counters confirm
//! which path each point really took, and a point whose transfers went another way is
//! dropped rather than mislabelled.

use std::time::Duration;

use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table, units};
use ionet::{Mechanism, Scheme, ServiceLevel, Thresholds, WaitMode};

use crate::params::{Params, Test};
use crate::session::{self, Pair};
use crate::tuning::Tuning;
use crate::{BoxErr, over_ionet};

const EXP: &str = "calibrate";

/// Largest size of the sweep; receive buffers and ring slots are sized for it.
pub const CAL_MAX: usize = 256 * 1024;

/// Sweep settings.
#[derive(Debug, Clone)]
pub struct CalOpts {
    pub scheme: Scheme,
    pub runs: usize,
    pub quick: bool,
    pub pin: bool,
    pub sizes: Vec<usize>,
    pub wait: WaitMode,
    /// A mechanism is "as good" when within this fraction of the best.
    pub tolerance: f64,
}

impl CalOpts {
    /// Powers of two from 64 B to [`CAL_MAX`] (every other one when quick).
    pub fn new(scheme: Scheme, runs: usize, quick: bool) -> CalOpts {
        let step = if quick { 4 } else { 2 };
        let mut sizes = Vec::new();
        let mut s = 64;
        while s <= CAL_MAX {
            sizes.push(s);
            s *= step;
        }
        if sizes.last() != Some(&CAL_MAX) {
            sizes.push(CAL_MAX);
        }
        CalOpts { scheme, runs, quick, pin: true, sizes, wait: WaitMode::Block, tolerance: 0.05 }
    }
}

/// The mechanisms a transport has.
pub fn mechanisms(scheme: Scheme) -> Vec<Mechanism> {
    match scheme {
        Scheme::Tcp => vec![Mechanism::Inline, Mechanism::ServerRdma],
        _ => Mechanism::ALL.to_vec(),
    }
}

/// Control messages per pair of runs that may use another mechanism (parameters sent
/// unexpected, empty READY messages), with room to spare.
const CONTROL_MESSAGES: u64 = 8;

fn mechanisms_all() -> impl Iterator<Item = Mechanism> {
    Mechanism::ALL.into_iter()
}

fn counter(c: &ionet::CounterSnapshot, m: Mechanism) -> u64 {
    c.by_mechanism(m)
}

/// Runs the sweep.
pub fn run(o: &CalOpts) -> Result<Samples, BoxErr> {
    session::pin_client(o.pin)?;
    let mut out = Samples::new();
    let target = if o.quick { Duration::from_millis(20) } else { Duration::from_millis(150) };
    let t = o.scheme.as_str();
    for m in mechanisms(o.scheme) {
        let tuning = Tuning {
            wait: o.wait,
            mechanism: Some(m),
            thresholds: Some(Thresholds { inline_max: CAL_MAX, fast_max: CAL_MAX }),
            recv_size: Some((CAL_MAX + 4096) as u32),
            eager_limit: None,
        };
        let pr = Pair::start(o.scheme, tuning, o.pin)?;
        let series = m.name_on(o.scheme);
        eprintln!("calibrate {t}: {series} forced, {} sizes", o.sizes.len());
        for &size in &o.sizes {
            let lat = Params {
                test: Test::Lat,
                size,
                iters: over_ionet::iters_for(Test::Lat, size, target),
                window: 1,
                sl: ServiceLevel::Normal,
                verify: false,
                spin: false,
                pool: false,
                footprint: 0,
            };
            let window = 16;
            let bw = Params {
                test: Test::Bw,
                iters: (over_ionet::iters_for(Test::Bw, size, target) / window).max(2) * window,
                window,
                sl: ServiceLevel::Bulk,
                ..lat
            };
            let lat = over_ionet::sized(&pr.ep, pr.peer, &lat, target)?;
            let bw = over_ionet::sized(&pr.ep, pr.peer, &bw, target)?;
            for r in 0..o.runs.max(1) {
                let c0 = pr.ep.info().counters;
                let l = over_ionet::run(&pr.ep, pr.peer, &lat, None)?;
                let b = over_ionet::run(&pr.ep, pr.peer, &bw, Some(pr.server_pid()))?;
                let c1 = pr.ep.info().counters;
                // Every data message of both runs (sent and received: the server is forced
                // too) must have taken the forced path; only the runs' few empty or
                // unexpected control messages may go another way.
                let want = (lat.iters + bw.iters) as u64;
                let took = counter(&c1, m) - counter(&c0, m);
                let other: u64 =
                    mechanisms_all().filter(|&x| x != m).map(|x| counter(&c1, x) - counter(&c0, x)).sum();
                let note = format!("forced={took};other={other};data_messages={want}");
                let ok = took >= want && other <= CONTROL_MESSAGES;
                let v = |x: f64| if ok { x } else { f64::NAN };
                let s = |metric: &str, unit: &str, x: f64| {
                    Sample::new(EXP, t, series, size as f64)
                        .metric(metric, unit)
                        .run(r as u32, v(x))
                        .wait(o.wait.name())
                        .note(note.clone())
                };
                out.push(s("one_way_us", "µs", l.rtt_p50.unwrap_or(f64::NAN) / 2.0));
                out.push(s("bandwidth", "GB/s", b.gbps()));
                out.push(s("client_cpu_per_gb", "s/GB", b.client_cpu_per_gb()));
                out.push(s("server_cpu_per_gb", "s/GB", b.server_cpu_per_gb().unwrap_or(f64::NAN)));
            }
        }
    }
    Ok(out)
}

/// Recommended thresholds from one-way times per size, `[inline, fast, server]` (`None` where
/// a mechanism was not measured). Inline is kept up to the largest size below which it was
/// never worse than the best alternative by more than `tol`; fast RDMA likewise against
/// server-based RDMA from there on.
pub fn recommend(points: &[(usize, [Option<f64>; 3])], tol: f64) -> Thresholds {
    let mut pts = points.to_vec();
    pts.sort_by_key(|p| p.0);
    let within = |a: Option<f64>, others: &[Option<f64>]| match a {
        Some(a) => others.iter().flatten().all(|&b| a <= b * (1.0 + tol)),
        None => false,
    };
    let mut inline_max = 0;
    for (size, v) in &pts {
        if within(v[0], &[v[1], v[2]]) {
            inline_max = *size;
        } else {
            break;
        }
    }
    let mut fast_max = inline_max;
    for (size, v) in pts.iter().filter(|p| p.0 > inline_max) {
        if within(v[1], &[v[2]]) {
            fast_max = *size;
        } else {
            break;
        }
    }
    Thresholds { inline_max, fast_max }
}

fn idx(m: Mechanism) -> usize {
    m.index()
}

/// What a recommendation optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// One-way time of a lone message (the paper's access time).
    AccessTime,
    /// Time per message when streaming (size / bandwidth).
    Streaming,
}

/// The recommendation from a sweep's samples.
pub fn recommend_from(s: &Samples, scheme: Scheme, tol: f64, basis: Basis) -> Option<Thresholds> {
    let t = scheme.as_str();
    let metric = match basis {
        Basis::AccessTime => "one_way_us",
        Basis::Streaming => "bandwidth",
    };
    let s = s.filter(|r| r.experiment == EXP && r.transport == t && r.metric == metric);
    if s.is_empty() {
        return None;
    }
    let pts: Vec<(usize, [Option<f64>; 3])> = s
        .xs()
        .into_iter()
        .map(|x| {
            let mut v = [None; 3];
            for m in mechanisms(scheme) {
                v[idx(m)] = s.get(EXP, t, m.name_on(scheme), metric, x).map(|v| match basis {
                    Basis::AccessTime => v.median,
                    Basis::Streaming => x / v.median,
                });
            }
            (x as usize, v)
        })
        .collect();
    Some(recommend(&pts, tol))
}

/// The measured table's lines for `scheme` from a sweep (for `IONET_POLICY`, see
/// `ionet::Policy::apply_table`): the control and normal classes by access time, since their
/// messages are waited for one at a time; the bulk class by streaming bandwidth. `None` if the
/// sweep has no figures for the transport.
pub fn policy_lines(s: &Samples, scheme: Scheme, tol: f64, note: &str) -> Option<String> {
    let access = recommend_from(s, scheme, tol, Basis::AccessTime)?;
    let streaming = recommend_from(s, scheme, tol, Basis::Streaming).unwrap_or(access);
    let t = scheme.as_str();
    let mut out = format!(
        "# {t}: {note}; control, normal by access time, bulk by streaming bandwidth
"
    );
    for sl in ServiceLevel::ALL {
        let r = if sl == ServiceLevel::Bulk { streaming } else { access };
        out.push_str(&format!("{t} {} inline_max={}", sl.name(), fmt_size_env(r.inline_max)));
        if scheme != Scheme::Tcp {
            out.push_str(&format!(" fast_max={}", fmt_size_env(r.fast_max)));
        }
        out.push('\n');
    }
    Some(out)
}

/// `existing` table text with `scheme`'s lines (and its comment lines) replaced by `lines`.
pub fn merge_policy(existing: &str, scheme: Scheme, lines: &str) -> String {
    let t = scheme.as_str();
    let mine = |l: &str| {
        let l = l.trim_start().trim_start_matches('#').trim_start();
        l.split(|c: char| c.is_whitespace() || c == ':').next() == Some(t)
    };
    let mut out: String = existing.lines().filter(|l| !mine(l)).map(|l| format!("{l}\n")).collect();
    out.push_str(lines);
    out
}

fn fmt_size_env(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}m", n >> 20)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}k", n >> 10)
    } else {
        n.to_string()
    }
}

/// Markdown table, recommendation and plot of a sweep.
pub fn render(
    s: &Samples,
    scheme: Scheme,
    tol: f64,
    link_prefix: &str,
) -> Result<(String, Vec<(String, String)>), BoxErr> {
    let t = scheme.as_str();
    let s = s.filter(|r| r.experiment == EXP && r.transport == t);
    let mechs = mechanisms(scheme);
    let mut head = vec!["size".to_string()];
    head.extend(mechs.iter().map(|m| format!("{} one-way µs", m.name_on(scheme))));
    head.extend(mechs.iter().map(|m| format!("{} GB/s", m.name_on(scheme))));
    head.push("fastest".into());
    let mut table = Table::new(head);
    let get = |m: Mechanism, metric: &str, x: f64| s.get(EXP, t, m.name_on(scheme), metric, x);
    for x in s.xs() {
        let lat: Vec<Option<Summary>> = mechs.iter().map(|&m| get(m, "one_way_us", x)).collect();
        let bw: Vec<Option<Summary>> = mechs.iter().map(|&m| get(m, "bandwidth", x)).collect();
        let best = mechs
            .iter()
            .zip(&lat)
            .filter_map(|(m, l)| l.map(|l| (m, l.median)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or("–".to_string(), |(m, _)| m.name_on(scheme).to_string());
        let mut row = vec![units::size(x)];
        row.extend(lat.iter().map(|v| v.map_or("n/a".into(), |v| v.to_string())));
        row.extend(bw.iter().map(|v| v.map_or("n/a".into(), |v| v.to_string())));
        row.push(best);
        table.row(row);
    }
    let mut md = table.render();
    let current = ionet::Policy::for_scheme(scheme).thresholds(ServiceLevel::Normal);
    let describe = |r: Thresholds| {
        if scheme == Scheme::Tcp {
            format!("eager up to {}", units::size(r.inline_max as f64))
        } else {
            format!(
                "inline up to {}, fast RDMA up to {}",
                units::size(r.inline_max as f64),
                units::size(r.fast_max as f64)
            )
        }
    };
    if let Some(r) = recommend_from(&s, scheme, tol, Basis::AccessTime) {
        md.push_str(&format!(
            "\nRecommended on {t}:// by access time (the paper's criterion; a mechanism is kept while \
             within {:.0} % of the fastest): {}",
            tol * 100.0,
            describe(r)
        ));
        if let Some(b) = recommend_from(&s, scheme, tol, Basis::Streaming) {
            md.push_str(&format!("; by streaming bandwidth: {}", describe(b)));
        }
        md.push_str(&format!(
            "; in force now: {}.\n\n`IONET_INLINE_MAX={} IONET_FAST_MAX={}`\n",
            describe(current),
            fmt_size_env(r.inline_max),
            fmt_size_env(r.fast_max),
        ));
    }
    let series: Vec<Series> = mechs
        .iter()
        .filter_map(|&m| {
            let pts: Vec<(f64, Summary)> =
                s.xs().into_iter().filter_map(|x| get(m, "one_way_us", x).map(|v| (x, v))).collect();
            (!pts.is_empty()).then(|| Series::new(m.name_on(scheme), pts))
        })
        .collect();
    let mut plots = Vec::new();
    if !series.is_empty() {
        let c = LineChart {
            title: format!("Mechanisms on {t}:// (forced), one-way time"),
            x_desc: "message size".into(),
            y_desc: "one-way time = RTT/2 (µs)".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Log10,
            series,
        };
        let name = format!("calibrate-{t}.svg");
        md.push_str(&format!("\n![{name}]({link_prefix}{name})\n"));
        plots.push((name, c.render_svg()?));
    }
    Ok((md, plots))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_lines_merge_into_a_table_per_transport() {
        let old = "# softib: old run\nsoftib control inline_max=1k fast_max=2k\n# tcp: kept\ntcp normal inline_max=64k\n";
        let new = "# softib: new run\nsoftib bulk inline_max=4k fast_max=64k\n";
        let merged = merge_policy(old, Scheme::SoftIb, new);
        assert_eq!(
            merged,
            "# tcp: kept\ntcp normal inline_max=64k\n# softib: new run\nsoftib bulk inline_max=4k fast_max=64k\n"
        );
        let mut p = ionet::Policy::for_scheme(Scheme::SoftIb);
        assert_eq!(p.apply_table(Scheme::SoftIb, &merged), 1);
        assert_eq!(p.thresholds(ServiceLevel::Bulk), Thresholds { inline_max: 4096, fast_max: 65536 });
    }

    #[test]
    fn recommendation_follows_the_crossovers() {
        // inline wins to 4 KiB, fast to 64 KiB, server above.
        let pts = vec![
            (1024, [Some(5.0), Some(6.0), Some(20.0)]),
            (4096, [Some(7.0), Some(7.2), Some(21.0)]),
            (16384, [Some(15.0), Some(10.0), Some(22.0)]),
            (65536, [Some(40.0), Some(30.0), Some(31.0)]),
            (262144, [Some(150.0), Some(120.0), Some(60.0)]),
        ];
        assert_eq!(recommend(&pts, 0.05), Thresholds { inline_max: 4096, fast_max: 65536 });
        // Without a fast path (TCP): eager against rendezvous only.
        let tcp = vec![(1024, [Some(5.0), None, Some(9.0)]), (65536, [Some(50.0), None, Some(30.0)])];
        assert_eq!(recommend(&tcp, 0.05), Thresholds { inline_max: 1024, fast_max: 1024 });
        // Inline never best: zero; missing points stop the run.
        let none = vec![(64, [Some(9.0), Some(5.0), Some(5.0)]), (128, [None, Some(5.0), Some(6.0)])];
        assert_eq!(recommend(&none, 0.0), Thresholds { inline_max: 0, fast_max: 128 });
    }

    #[test]
    fn render_builds_table_recommendation_and_plot() {
        let mut s = Samples::new();
        for (size, vals) in
            [(1024usize, [5.0, 6.0, 20.0]), (65536, [40.0, 30.0, 31.0]), (262144, [150.0, 120.0, 60.0])]
        {
            for m in Mechanism::ALL {
                s.push(
                    Sample::new(EXP, "softib", m.name(), size as f64)
                        .metric("one_way_us", "µs")
                        .run(0, vals[m.index()]),
                );
            }
        }
        let (md, plots) = render(&s, Scheme::SoftIb, 0.05, "").unwrap();
        assert!(md.contains("| 1 KiB | 5.00 | 6.00 | 20.0 | n/a | n/a | n/a | inline |"), "{md}");
        assert!(md.contains("`IONET_INLINE_MAX=1k IONET_FAST_MAX=64k`"), "{md}");
        assert!(md.contains("by access time"), "{md}");
        assert_eq!(plots[0].0, "calibrate-softib.svg");
        assert_eq!(fmt_size_env(3000), "3000");
        assert_eq!(fmt_size_env(2 << 20), "2m");
    }
}

//! `ionet-perf ab`: latency and bandwidth of several transports side by side in one run, with
//! the raw-socket ping-pong (busy-poll and blocking), the raw TCP streamer, single-thread
//! `memcpy` and iperf3 (when installed) measured in the same run, interleaved run by run so
//! that noise hits every column alike.

use std::time::Duration;

use benchkit::plot::{LineChart, Scale, Series};
use benchkit::{Sample, Samples, Summary, Table, units};
use ionet::{Scheme, ServiceLevel, WaitMode};

use crate::memcpy::MemcpyBench;
use crate::params::{Params, Test};
use crate::procs::{self, ServerProc};
use crate::raw::RawClient;
use crate::session::{self, Pair, SERVER_CPU};
use crate::tuning::Tuning;
use crate::{BoxErr, over_ionet};

/// What to measure.
#[derive(Debug, Clone)]
pub struct AbOpts {
    pub transports: Vec<Scheme>,
    pub runs: usize,
    pub quick: bool,
    pub pin: bool,
    pub lat_sizes: Vec<usize>,
    pub bw_sizes: Vec<usize>,
    /// Message sizes of the busy-poll round trips (none: skip them).
    pub spin_sizes: Vec<usize>,
    /// Messages in flight in bandwidth runs.
    pub window: usize,
}

impl AbOpts {
    /// The default sweep.
    pub fn new(transports: Vec<Scheme>, runs: usize, quick: bool) -> AbOpts {
        AbOpts {
            transports,
            runs,
            quick,
            pin: true,
            lat_sizes: vec![8, 256, 4096, 65536, 1 << 20],
            bw_sizes: vec![4096, 65536, 1 << 20, 4 << 20],
            spin_sizes: vec![8],
            window: 16,
        }
    }

    fn target(&self) -> Duration {
        if self.quick { Duration::from_millis(30) } else { Duration::from_millis(250) }
    }
}

const EXP: &str = "ab";
/// Series of the bandwidth runs from registered pool buffers (`ionet` is plain heap memory).
pub const POOL_SERIES: &str = "ionet-pool";
/// Series of the bandwidth runs from heap memory with the library's default (adaptive) waits on
/// both sides, what a program gets without tuning; the other series wait blocking.
pub const DEFAULT_WAITS_SERIES: &str = "ionet-default-waits";
/// The ionet bandwidth series as the report shows them: series, buffers (the bandwidth table's
/// label), what the CPU table adds to the transport's name, and the wait mode they ran with.
const BW_SERIES: [(&str, &str, &str, &str); 3] = [
    ("ionet", "heap", "", "block"),
    (POOL_SERIES, "pool", " (pool)", "block"),
    (DEFAULT_WAITS_SERIES, "heap, default waits", " (default waits)", "adaptive"),
];

fn lat_sample(t: &str, series: &str, wait: WaitMode, size: usize, run: usize, rtt: Option<f64>) -> Sample {
    Sample::new(EXP, t, series, size as f64)
        .metric("rtt_p50", "µs")
        .run(run as u32, rtt.unwrap_or(f64::NAN))
        .wait(wait.name())
}

/// Runs the comparison.
pub fn run(o: &AbOpts) -> Result<Samples, BoxErr> {
    let mut out = Samples::new();
    session::pin_client(o.pin)?;
    let cpu_arg = SERVER_CPU.to_string();
    let raw_args: Vec<&str> = if o.pin { vec!["raw-server", "--cpu", &cpu_arg] } else { vec!["raw-server"] };
    let raw_srv = ServerProc::spawn(&raw_args)?;
    let mut raw = RawClient::connect(&raw_srv.addr)?;
    let target = o.target();
    let runs = o.runs.max(1);

    // Round trips, blocking waits everywhere (the raw baseline blocks in read(2)).
    let start = |wait: WaitMode| -> Result<Vec<Pair>, BoxErr> {
        o.transports.iter().map(|&s| Pair::start(s, Tuning::wait(wait), o.pin)).collect()
    };
    let mut lat = |pairs: &[Pair], wait: WaitMode, size: usize, with_raw: bool| -> Result<(), BoxErr> {
        eprintln!("ab: round trips, {} wait, {size} B", wait.name());
        let p = Params {
            test: Test::Lat,
            size,
            iters: over_ionet::iters_for(Test::Lat, size, target),
            window: 1,
            sl: ServiceLevel::Normal,
            verify: false,
            spin: wait == WaitMode::Spin,
            pool: false,
            footprint: 0,
        };
        // Each implementation gets the iterations that fill `target` (the probe warms it up).
        let rp = raw.sized(&p, target)?;
        let ps: Vec<Params> = pairs
            .iter()
            .map(|pr| over_ionet::sized(&pr.ep, pr.peer, &p, target))
            .collect::<Result<_, _>>()?;
        for r in 0..runs {
            if with_raw {
                let x = raw.run(&rp, None)?;
                out.push(lat_sample("raw-tcp", "raw", wait, size, r, x.rtt_p50));
            }
            for (pr, p) in pairs.iter().zip(&ps) {
                let y = over_ionet::run(&pr.ep, pr.peer, p, None)?;
                let t = pr.scheme.as_str();
                out.push(lat_sample(t, "ionet", wait, size, r, y.rtt_p50));
                out.push(
                    Sample::new(EXP, t, "ionet", size as f64)
                        .metric("rtt_p99", "µs")
                        .run(r as u32, y.rtt_p99.unwrap_or(f64::NAN))
                        .wait(wait.name()),
                );
            }
        }
        Ok(())
    };
    // Busy-polling servers burn their CPU even when idle, so each runs alone (all of them on
    // the server CPU at once, a server that yields its CPU would hand it to another transport's
    // spinning server for a whole scheduler slice), then goes.
    if !o.spin_sizes.is_empty() {
        for (i, &s) in o.transports.iter().enumerate() {
            let spin = [Pair::start(s, Tuning::wait(WaitMode::Spin), o.pin)?];
            for &size in &o.spin_sizes {
                lat(&spin, WaitMode::Spin, size, i == 0)?;
            }
        }
    }
    let block = start(WaitMode::Block)?;
    for &size in &o.lat_sizes {
        lat(&block, WaitMode::Block, size, true)?;
    }

    // Streaming bandwidth with CPU per GB on both sides; heap buffers also with the library's
    // default waits, which differ from blocking ones by a fifth on tcp://.
    let adaptive = if o.bw_sizes.is_empty() { Vec::new() } else { start(WaitMode::Adaptive)? };
    let max_bw = o.bw_sizes.iter().copied().max().unwrap_or(0);
    let mut mem = MemcpyBench::new(max_bw);
    for &size in &o.bw_sizes {
        eprintln!("ab: bandwidth, {size} B messages");
        let window = o.window.max(1);
        let iters = (over_ionet::iters_for(Test::Bw, size, target) / window).max(2) * window;
        let p = Params {
            test: Test::Bw,
            size,
            iters,
            window,
            sl: ServiceLevel::Bulk,
            verify: false,
            spin: false,
            pool: false,
            footprint: 0,
        };
        let rp = raw.sized(&p, target)?;
        let ps: Vec<Params> = block
            .iter()
            .map(|pr| over_ionet::sized(&pr.ep, pr.peer, &p, target))
            .collect::<Result<_, _>>()?;
        let pa: Vec<Params> = adaptive
            .iter()
            .map(|pr| over_ionet::sized(&pr.ep, pr.peer, &p, target))
            .collect::<Result<_, _>>()?;
        for r in 0..runs {
            let g = mem.run(size, target);
            out.push(
                Sample::new(EXP, "memcpy", "memcpy", size as f64)
                    .metric("bandwidth", "GB/s")
                    .run(r as u32, g),
            );
            let x = raw.run(&rp, Some(raw_srv.pid()))?;
            push_bw(&mut out, "raw-tcp", "raw", WaitMode::Block, size, r, &x);
            for (pr, p) in block.iter().zip(&ps) {
                let y = over_ionet::run(&pr.ep, pr.peer, p, Some(pr.server_pid()))?;
                push_bw(&mut out, pr.scheme.as_str(), "ionet", WaitMode::Block, size, r, &y);
                // The same from the endpoints' registered pools (`Endpoint::alloc` on both
                // sides), as a storage server that owns its buffers would send.
                let pooled = Params { pool: true, ..*p };
                let y = over_ionet::run(&pr.ep, pr.peer, &pooled, Some(pr.server_pid()))?;
                push_bw(&mut out, pr.scheme.as_str(), POOL_SERIES, WaitMode::Block, size, r, &y);
            }
            for (pr, p) in adaptive.iter().zip(&pa) {
                let y = over_ionet::run(&pr.ep, pr.peer, p, Some(pr.server_pid()))?;
                let t = pr.scheme.as_str();
                push_bw(&mut out, t, DEFAULT_WAITS_SERIES, WaitMode::Adaptive, size, r, &y);
            }
        }
    }
    if procs::have("iperf3") && o.bw_sizes.contains(&(1 << 20)) {
        for r in 0..runs.min(5) {
            if let Some(gbit) = procs::iperf3("1M", if o.quick { 1 } else { 2 }) {
                out.push(
                    Sample::new(EXP, "iperf3", "iperf3", (1 << 20) as f64)
                        .metric("bandwidth", "GB/s")
                        .run(r as u32, gbit / 8.0),
                );
            }
        }
    }
    Ok(out)
}

fn push_bw(
    out: &mut Samples,
    t: &str,
    series: &str,
    wait: WaitMode,
    size: usize,
    r: usize,
    x: &crate::run::RunResult,
) {
    let s = |m: &str, u: &str, v: f64| {
        Sample::new(EXP, t, series, size as f64).metric(m, u).run(r as u32, v).wait(wait.name())
    };
    out.push(s("bandwidth", "GB/s", x.gbps()));
    out.push(s("client_cpu_per_gb", "s/GB", x.client_cpu_per_gb()));
    out.push(s("server_cpu_per_gb", "s/GB", x.server_cpu_per_gb().unwrap_or(f64::NAN)));
}

fn cell(s: Option<Summary>) -> String {
    s.map_or_else(|| "–".into(), |s| s.to_string())
}

fn ratio(a: Option<Summary>, b: Option<Summary>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}×", a.ratio_to(&b)),
        _ => "–".into(),
    }
}

/// Transports present in the samples (not the baselines), in order.
fn transports(s: &Samples) -> Vec<String> {
    s.distinct(|r| r.transport.clone())
        .into_iter()
        .filter(|t| !matches!(t.as_str(), "raw-tcp" | "memcpy" | "iperf3"))
        .collect()
}

/// Markdown tables and plots of an `ab` run.
pub fn render(s: &Samples, link_prefix: &str) -> Result<(String, Vec<(String, String)>), BoxErr> {
    let s = s.filter(|r| r.experiment == EXP);
    let ts = transports(&s);
    let mut md = String::new();
    let get = |t: &str, series: &str, metric: &str, wait: &str, x: f64| {
        let v: Vec<f64> = s
            .rows()
            .iter()
            .filter(|r| {
                r.transport == t && r.series == series && r.metric == metric && r.wait == wait && r.x == x
            })
            .map(|r| r.value)
            .collect();
        Summary::of(&v)
    };
    // Latency.
    let lat = s.filter(|r| r.metric == "rtt_p50");
    if !lat.is_empty() {
        let mut head = vec!["size".to_string(), "wait".into(), "raw TCP ping-pong".into()];
        head.extend(ts.iter().map(|t| format!("ionet {t}://")));
        head.extend(ts.iter().map(|t| format!("{t} / raw")));
        if ts.len() == 2 {
            head.push(format!("{} / {}", ts[1], ts[0]));
        }
        let mut t = Table::new(head);
        for wait in ["spin", "block"] {
            for x in lat.filter(|r| r.wait == wait).xs() {
                let base = get("raw-tcp", "raw", "rtt_p50", wait, x);
                let vals: Vec<Option<Summary>> =
                    ts.iter().map(|tr| get(tr, "ionet", "rtt_p50", wait, x)).collect();
                let mut row = vec![units::size(x), wait.to_string(), cell(base)];
                row.extend(vals.iter().map(|v| cell(*v)));
                row.extend(vals.iter().map(|v| ratio(*v, base)));
                if vals.len() == 2 {
                    row.push(ratio(vals[1], vals[0]));
                }
                t.row(row);
            }
        }
        md.push_str("Round-trip time p50 (µs, lower is better): ping-pong of `size` bytes each way.\n\n");
        md.push_str(&t.render());
        md.push('\n');
    }
    // Bandwidth.
    let bw = s.filter(|r| r.metric == "bandwidth");
    if !bw.is_empty() {
        let mut head = vec!["size".to_string(), "buffers".into(), "memcpy".into(), "raw TCP streamer".into()];
        head.extend(ts.iter().map(|t| format!("ionet {t}://")));
        head.extend(ts.iter().map(|t| format!("{t} / raw")));
        if ts.len() == 2 {
            head.push(format!("{} / {}", ts[1], ts[0]));
        }
        let mut t = Table::new(head);
        for x in bw.filter(|r| r.series != "iperf3").xs() {
            let base = get("raw-tcp", "raw", "bandwidth", "block", x);
            for (series, buffers, _, wait) in BW_SERIES {
                let vals: Vec<Option<Summary>> =
                    ts.iter().map(|tr| get(tr, series, "bandwidth", wait, x)).collect();
                if vals.iter().all(Option::is_none) {
                    continue;
                }
                let mut row = vec![
                    units::size(x),
                    buffers.to_string(),
                    cell(get("memcpy", "memcpy", "bandwidth", "-", x)),
                    cell(base),
                ];
                row.extend(vals.iter().map(|v| cell(*v)));
                row.extend(vals.iter().map(|v| ratio(*v, base)));
                if vals.len() == 2 {
                    row.push(ratio(vals[1], vals[0]));
                }
                t.row(row);
            }
        }
        md.push_str(
            "Streaming bandwidth (GB/s = 10⁹ B/s, higher is better), blocking waits but for the \
             `default waits` rows: the library's default (adaptive) waits on both sides, what a \
             program gets without tuning (the raw streamer blocks in every row). Buffers: `heap` \
             sends and receives plain heap memory (on InfiniBand registered per message, and \
             received through the engine's zone buffers), `pool` uses the endpoints' registered \
             pools (`Endpoint::alloc`) on both sides (`ionet-perf client --pool`). The `heap` \
             sender sends one payload over and over, which stays in its caches; a pool buffer \
             cannot be shared, so the `pool` sender cycles through one per message in flight, a \
             window's worth of memory (`--footprint` gives `heap` the same).\n\n",
        );
        md.push_str(&t.render());
        if let Some(ip) = get("iperf3", "iperf3", "bandwidth", "-", (1 << 20) as f64) {
            md.push_str(&format!("\niperf3 `-l 1M` single stream on loopback (reference): {ip} GB/s.\n"));
        }
        md.push('\n');
        // CPU per GB.
        let mut t =
            Table::new(["size", "implementation", "sender (client) CPU s/GB", "receiver (server) CPU s/GB"]);
        for x in bw.xs().into_iter().filter(|&x| x >= (1 << 20) as f64) {
            let ionet = BW_SERIES.iter().flat_map(|&(series, _, suffix, wait)| {
                ts.iter().map(move |t| (t.clone(), series, format!("ionet {t}://{suffix}"), wait))
            });
            for (tr, series, name, wait) in
                std::iter::once(("raw-tcp".to_string(), "raw", "raw TCP streamer".to_string(), "block"))
                    .chain(ionet)
            {
                let c = get(&tr, series, "client_cpu_per_gb", wait, x);
                let sv = get(&tr, series, "server_cpu_per_gb", wait, x);
                if c.is_some() || sv.is_some() {
                    t.row([units::size(x), name, cell(c), cell(sv)]);
                }
            }
        }
        if !t.is_empty() {
            md.push_str("CPU seconds per GB moved during the bandwidth runs (blocking waits but for the default-waits rows; server CPU from /proc, 10 ms ticks).\n\n");
            md.push_str(&t.render());
            md.push('\n');
        }
    }
    let mut plots = Vec::new();
    let series_of = |metric: &str, wait: &str| -> Vec<Series> {
        let mut v = Vec::new();
        let mut add = |name: String, tr: &str, series: &str, baseline: bool, w: &str| {
            let pts: Vec<(f64, Summary)> = s
                .filter(|r| r.transport == tr && r.series == series && r.metric == metric && r.wait == w)
                .xs()
                .into_iter()
                .filter_map(|x| get(tr, series, metric, w, x).map(|m| (x, m)))
                .collect();
            if !pts.is_empty() {
                v.push(if baseline { Series::baseline(name, pts) } else { Series::new(name, pts) });
            }
        };
        for t in &ts {
            add(format!("ionet {t}://"), t, "ionet", false, wait);
            add(format!("ionet {t}:// (pool)"), t, POOL_SERIES, false, wait);
        }
        add("raw TCP".into(), "raw-tcp", "raw", true, wait);
        add("memcpy".into(), "memcpy", "memcpy", true, "-");
        v
    };
    let lat_series = series_of("rtt_p50", "block");
    if !lat_series.is_empty() {
        let c = LineChart {
            title: "Round trip vs size (blocking waits)".into(),
            x_desc: "message size".into(),
            y_desc: "RTT p50 (µs)".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Log10,
            series: lat_series,
        };
        plots.push(("ab-latency.svg".to_string(), c.render_svg()?));
    }
    let bw_series = series_of("bandwidth", "block");
    if !bw_series.is_empty() {
        let c = LineChart {
            title: "Streaming bandwidth vs message size".into(),
            x_desc: "message size".into(),
            y_desc: "GB/s".into(),
            x_scale: Scale::Log2Bytes,
            y_scale: Scale::Log10,
            series: bw_series,
        };
        plots.push(("ab-bandwidth.svg".to_string(), c.render_svg()?));
    }
    for (name, _) in &plots {
        md.push_str(&format!("![{name}]({link_prefix}{name})\n"));
    }
    Ok((md, plots))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake() -> Samples {
        let mut s = Samples::new();
        for r in 0..3u32 {
            for (t, series, v) in
                [("raw-tcp", "raw", 20.0), ("tcp", "ionet", 25.0), ("softib", "ionet", 15.0)]
            {
                s.push(lat_sample(t, series, WaitMode::Block, 8, r as usize, Some(v + r as f64)));
            }
            for (t, series, v) in [
                ("raw-tcp", "raw", 2.0),
                ("tcp", "ionet", 1.8),
                ("softib", "ionet", 3.6),
                ("tcp", POOL_SERIES, 2.0),
                ("softib", POOL_SERIES, 5.0),
            ] {
                let x = (1 << 20) as f64;
                s.push(Sample::new(EXP, t, series, x).metric("bandwidth", "GB/s").run(r, v).wait("block"));
                s.push(
                    Sample::new(EXP, t, series, x)
                        .metric("client_cpu_per_gb", "s/GB")
                        .run(r, 0.1)
                        .wait("block"),
                );
            }
            for (t, v) in [("tcp", 2.4), ("softib", 3.6)] {
                let x = (1 << 20) as f64;
                s.push(
                    Sample::new(EXP, t, DEFAULT_WAITS_SERIES, x)
                        .metric("bandwidth", "GB/s")
                        .run(r, v)
                        .wait("adaptive"),
                );
                s.push(
                    Sample::new(EXP, t, DEFAULT_WAITS_SERIES, x)
                        .metric("client_cpu_per_gb", "s/GB")
                        .run(r, 0.05)
                        .wait("adaptive"),
                );
            }
            s.push(
                Sample::new(EXP, "memcpy", "memcpy", (1 << 20) as f64)
                    .metric("bandwidth", "GB/s")
                    .run(r, 20.0),
            );
        }
        s
    }

    #[test]
    fn tables_show_baselines_and_ratios() {
        let (md, plots) = render(&fake(), "plots/").unwrap();
        // Latency row: raw 21, tcp 26, softib 16 (medians), ratios to raw and softib/tcp.
        assert!(md.contains("| 8 B | block | 21.0 (20.0–22.0) | 26.0 (25.0–27.0) | 16.0 (15.0–17.0) | 1.24× | 0.76× | 0.62× |"), "{md}");
        // Bandwidth rows, heap and pool buffers: softib / tcp = 2.0× and 2.5×.
        assert!(md.contains("| 1 MiB | heap | 20.0 (20.0–20.0) | 2.00 (2.00–2.00) | 1.80 (1.80–1.80) | 3.60 (3.60–3.60) | 0.90× | 1.80× | 2.00× |"), "{md}");
        assert!(md.contains("| 1 MiB | pool | 20.0 (20.0–20.0) | 2.00 (2.00–2.00) | 2.00 (2.00–2.00) | 5.00 (5.00–5.00) | 1.00× | 2.50× | 2.50× |"), "{md}");
        assert!(md.contains("| 1 MiB | ionet softib:// (pool) |"), "{md}");
        // With the library's default waits, beside the same raw streamer: 1.2× and 1.5×.
        assert!(md.contains("| 1 MiB | heap, default waits | 20.0 (20.0–20.0) | 2.00 (2.00–2.00) | 2.40 (2.40–2.40) | 3.60 (3.60–3.60) | 1.20× | 1.80× | 1.50× |"), "{md}");
        assert!(md.contains("| 1 MiB | ionet tcp:// (default waits) | 0.0500 (0.0500–0.0500) |"), "{md}");
        assert!(md.contains("CPU seconds per GB"));
        assert_eq!(plots.len(), 2);
        assert!(md.contains("![ab-latency.svg](plots/ab-latency.svg)"));
    }
}

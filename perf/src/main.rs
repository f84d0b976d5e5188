//! `ionet-perf`: latency, bandwidth and message rate over ionet, like `ucx_perftest`, with the
//! raw-socket baselines (busy-poll and blocking ping-pong, a streamer, and iperf3 when
//! installed) measured in the same run so every figure is a ratio.

mod ab;
mod calibrate;
mod memcpy;
mod over_ionet;
mod params;
mod procs;
mod qos;
mod raw;
mod run;
mod session;
mod stats;
mod tuning;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use ionet::{Config, Endpoint, Mechanism, Policy, Scheme, ServiceLevel, WaitMode};
use tuning::Tuning;

use params::{Params, Test};
use procs::ServerProc;
use run::RunResult;
use stats::Summary;

#[derive(Parser, Debug)]
#[command(
    name = "ionet-perf",
    version,
    about = "ionet latency / bandwidth / message-rate tool with same-run baselines"
)]
struct Cli {
    /// Print the mechanism table an endpoint on --transport actually uses (thresholds per
    /// service level after the measured table IONET_POLICY names, IONET_INLINE_MAX /
    /// IONET_FAST_MAX and the transport's limits), its negotiated limits, and exit.
    #[arg(long)]
    show_policy: bool,
    /// Transport for --show-policy.
    #[arg(long, default_value = "tcp")]
    transport: Scheme,
    /// Pin this process to one CPU (the comparison pins client and server to different CPUs
    /// so blocking wake-ups always cross CPUs, as between two hosts).
    #[arg(long, global = true)]
    cpu: Option<usize>,
    /// TCP congestion control of `server` and `client` connections (ionet's
    /// `Config::tcp_congestion`; default: the kernel's).
    #[arg(long, global = true)]
    tcp_congestion: Option<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

fn pin(cpu: Option<usize>) -> Result<(), BoxErr> {
    if let Some(c) = cpu {
        let mut set = nix::sched::CpuSet::new();
        set.set(c)?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)?;
    }
    Ok(())
}

/// What a `client` or `raw-client` runs: the server, the test and its sweep.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The server's address (`ionet-perf server` or `raw-server` prints it). `--test read`
    /// takes several, comma-separated, and reads from all of them at once (the fan-in of a
    /// file system's read from its io servers).
    #[arg(long)]
    connect: String,
    #[arg(long, value_enum, default_value = "lat")]
    test: Test,
    /// Sizes: a list (`8,4k,1m`) or a power-of-two sweep (`1:16m`).
    #[arg(long, default_value = "8")]
    sizes: String,
    /// Iterations per run (default: about half a second's worth).
    #[arg(long)]
    iters: Option<usize>,
    /// Messages in flight for bw / bibw / msgrate, requests outstanding per server for read
    /// (the raw streamer needs no window, but its receiver cycles through this many messages'
    /// worth of memory, as ionet's does).
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Memory each side cycles its streamed messages through (binary units: `64k`, `32m`; ionet only):
    /// by default a window's worth, the cache-resident peak; an application's working set
    /// (say a file system's regions and files) shows what its cache misses cost the stream.
    #[arg(long, value_parser = parse_one_size, default_value = "0")]
    footprint: usize,
    /// Repeated runs per size (the median and spread are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Print the results as one JSON document instead of the table: per size, each figure's
    /// median, min and max with its unit (not with `--on-demand`, which has its own lines).
    #[arg(long)]
    json: bool,
}

impl RunArgs {
    /// Parameters of one size of the sweep (normal service level, heap buffers, no checks,
    /// blocking raw sockets; callers override the rest).
    fn params(&self, size: usize) -> Params {
        Params {
            test: self.test,
            size,
            iters: self
                .iters
                .unwrap_or_else(|| over_ionet::iters_for(self.test, size, Duration::from_millis(500))),
            window: if self.test == Test::Lat { 1 } else { self.window },
            sl: ServiceLevel::Normal,
            verify: false,
            spin: false,
            pool: false,
            footprint: self.footprint,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve perf tests on an ionet address (prints `LISTEN <addr>`).
    Server {
        #[arg(long, default_value = "tcp://127.0.0.1:0")]
        listen: String,
        /// How the server waits; by default as a program's endpoint does (`Config::default()`).
        #[arg(long, default_value = "adaptive")]
        wait: WaitMode,
        #[command(flatten)]
        knobs: Knobs,
        /// File holding the cluster key in hex (stripefs's format and rules): only clients with
        /// the same key connect.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Serve `qos` sessions on an ionet address (prints `LISTEN <addr>`).
    QosServer {
        #[arg(long, default_value = "tcp://127.0.0.1:0")]
        listen: String,
        #[arg(long, default_value = "block")]
        wait: WaitMode,
    },
    /// Serve the raw-socket baselines on host:port (prints `LISTEN <addr>`).
    RawServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Run the raw-socket baseline against a `raw-server` (the same patterns as `client`,
    /// for profiling the baseline with the same tools, e.g. callgrind or `strace -c`).
    RawClient {
        #[command(flatten)]
        run: RunArgs,
        /// Busy-poll non-blocking sockets instead of blocking reads and writes.
        #[arg(long)]
        spin: bool,
    },
    /// Run tests against a server.
    Client {
        #[command(flatten)]
        run: RunArgs,
        /// How the client waits; by default as a program's endpoint does (`Config::default()`).
        #[arg(long, default_value = "adaptive")]
        wait: WaitMode,
        /// Check every payload byte.
        #[arg(long)]
        verify: bool,
        /// Send and receive from the endpoints' registered pools (`Endpoint::alloc`, both
        /// sides) instead of plain heap buffers: on InfiniBand the data then moves straight
        /// between the two applications' buffers, with no zone-buffer copy at the receiver.
        #[arg(long)]
        pool: bool,
        #[arg(long, default_value = "normal", value_parser = parse_sl)]
        sl: ServiceLevel,
        #[command(flatten)]
        knobs: Knobs,
        /// File holding the cluster key in hex, as the server's `--key-file`.
        #[arg(long)]
        key_file: Option<PathBuf>,
        /// Append per-run rows to this CSV file.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Runs on demand, for a benchmark that interleaves them with its own measurements (a
        /// reference drawn right next to a measurement sees the same machine state): one untimed
        /// run per size, then `READY`; then one run per size for every line read from stdin,
        /// each printed as `RUN <size> <GB/s>`, until stdin closes. `--runs` does not apply.
        #[arg(long)]
        on_demand: bool,
    },
    /// Loopback self-test: starts its own server, checks data integrity, prints a table.
    Selftest {
        #[arg(long, default_value = "tcp")]
        transport: Scheme,
    },
    /// Side-by-side comparison against raw-socket baselines (and iperf3 when installed).
    Compare {
        #[arg(long, default_value = "tcp")]
        transport: Scheme,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Shorter runs (a smoke check, not for BENCHMARKS.md).
        #[arg(long)]
        quick: bool,
        /// Per-run rows.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// Markdown summary.
        #[arg(long)]
        markdown: Option<PathBuf>,
    },
    /// Latency and bandwidth of several transports side by side in one run, with the raw-socket
    /// ping-pong (spin and blocking), the raw TCP streamer, memcpy and iperf3 (when installed).
    Ab {
        #[arg(long, value_delimiter = ',', default_value = "tcp,softib")]
        transports: Vec<Scheme>,
        /// Message sizes of the round-trip sweep.
        #[arg(long, default_value = "8,256,4k,64k,1m")]
        lat_sizes: String,
        /// Message sizes of the bandwidth sweep.
        #[arg(long, default_value = "4k,64k,1m,4m")]
        bw_sizes: String,
        /// Message sizes of the busy-poll round trips.
        #[arg(long, default_value = "8")]
        spin_sizes: String,
        /// Skip the busy-poll round trips.
        #[arg(long)]
        no_spin: bool,
        /// Bandwidth only (no round trips).
        #[arg(long)]
        bw_only: bool,
        /// Messages in flight in bandwidth runs.
        #[arg(long, default_value_t = 16)]
        window: usize,
        #[command(flatten)]
        common: Common,
    },
    /// Measure every mechanism across sizes on a transport and print recommended thresholds.
    Calibrate {
        #[arg(long, value_delimiter = ',', default_value = "softib")]
        transports: Vec<Scheme>,
        /// A mechanism is kept while within this fraction of the fastest.
        #[arg(long, default_value_t = 0.05)]
        tolerance: f64,
        /// Write the recommended thresholds per service level into this measured table (other
        /// transports' lines are kept); endpoints use it when `IONET_POLICY` names the file.
        #[arg(long, value_name = "FILE")]
        write_policy: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Control-class round trips under a bulk stream, service levels on against off.
    Qos {
        #[arg(long, value_delimiter = ',', default_value = "tcp,softib")]
        transports: Vec<Scheme>,
        #[arg(long, default_value = "block")]
        wait: WaitMode,
        #[command(flatten)]
        common: Common,
    },
}

/// Endpoint knobs shared by client and server (both sides of a run must agree).
#[derive(clap::Args, Debug, Clone, Copy)]
struct Knobs {
    /// Force one mechanism instead of the communication manager's choice.
    #[arg(long)]
    mechanism: Option<Mechanism>,
    /// Inline limit for every service level (bytes, or binary units: `4k`).
    #[arg(long, value_parser = parse_one_size)]
    inline_max: Option<usize>,
    /// Fast-RDMA limit for every service level.
    #[arg(long, value_parser = parse_one_size)]
    fast_max: Option<usize>,
    /// Size of each pre-posted InfiniBand receive buffer (inline sends must fit one).
    #[arg(long, value_parser = parse_one_size)]
    recv_size: Option<usize>,
    /// Largest message sent eagerly and accepted unasked (`Config::eager_limit`; at most 1 MiB
    /// and the early-data budget). On TCP a message goes eagerly when it is within both this
    /// and `--inline-max`.
    #[arg(long, value_parser = parse_one_size)]
    eager_limit: Option<usize>,
}

impl Knobs {
    fn tuning(&self, wait: WaitMode) -> Tuning {
        Tuning::from_parts(
            wait,
            self.mechanism,
            self.inline_max,
            self.fast_max,
            self.recv_size.map(|n| n as u32),
            self.eager_limit,
        )
    }
}

/// Options of the report-producing modes.
#[derive(clap::Args, Debug, Clone)]
struct Common {
    /// Repeated runs per point (the median and min–max are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Short runs: a smoke check, not for BENCHMARKS.md.
    #[arg(long)]
    quick: bool,
    /// Do not pin client and server to different CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Directory for `<mode>.csv`, `<mode>.md` and the SVG plots.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prefix of plot links in the Markdown (their path relative to the document).
    #[arg(long, default_value = "")]
    link_prefix: String,
}

fn parse_sl(s: &str) -> Result<ServiceLevel, String> {
    ServiceLevel::ALL
        .into_iter()
        .find(|sl| sl.name() == s)
        .ok_or_else(|| format!("unknown service level {s}"))
}

/// A size on the command line, in the syntax `stripefs` takes too.
fn parse_one_size(s: &str) -> Result<usize, String> {
    stripefs::units::parse_size_usize(s)
}

/// `8,4k,1m` or `1:16m` (powers of two).
fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let size = parse_one_size;
    if let Some((a, b)) = s.split_once(':') {
        let (mut x, hi) = (size(a)?.max(1), size(b)?);
        let mut v = Vec::new();
        while x <= hi {
            v.push(x);
            x *= 2;
        }
        Ok(v)
    } else {
        s.split(',').map(size).collect()
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run_cli(cli) {
        eprintln!("ionet-perf: {e}");
        std::process::exit(1);
    }
}

type BoxErr = Box<dyn std::error::Error>;

/// `cfg` with the congestion control of `--tcp-congestion`, if given.
fn with_congestion(cfg: Config, cc: Option<&str>) -> Config {
    match cc {
        Some(name) => cfg.tcp_congestion(name),
        None => cfg,
    }
}

/// The cluster key in `path` by ionet's key-file rules (a file others could read is tightened,
/// with a warning).
fn load_key(path: Option<&Path>) -> Result<Option<Vec<u8>>, BoxErr> {
    let Some(p) = path else { return Ok(None) };
    let k = ionet::key_file::read_key_file(p)?;
    if let Some(mode) = k.loose_mode {
        eprintln!(
            "ionet-perf: warning: key file {} was mode {mode:o}, readable beyond its owner; set to \
             owner-only (the key may have leaked: consider a new one)",
            p.display()
        );
    }
    Ok(Some(k.key))
}

/// `cfg` with the cluster key, if there is one.
fn with_key(cfg: Config, key: Option<Vec<u8>>) -> Config {
    match key {
        Some(k) => cfg.cluster_key(k),
        None => cfg,
    }
}

/// What to say about a server listening at `addr`: nothing with a key or on loopback only;
/// otherwise that anyone who reaches it is served.
fn exposure_warning(addr: &ionet::Address, keyed: bool) -> Option<String> {
    let loopback = addr.resolve().is_ok_and(|v| !v.is_empty() && v.iter().all(|a| a.ip().is_loopback()));
    (!keyed && !loopback).then(|| {
        format!(
            "ionet-perf: warning: listening on {addr} without a cluster key: anyone who can reach \
             this port can connect, send and receive messages, and read and write the memory the \
             server exposes; pass --key-file, or listen on a loopback address"
        )
    })
}

/// Binds a server endpoint, warning on stderr if it is reachable without a key.
fn bind_server(listen: &str, cfg: Config, keyed: bool) -> Result<Endpoint, BoxErr> {
    let ep = Endpoint::bind(listen, cfg)?;
    let addr = ep.local_addr().ok_or("no local address")?;
    if let Some(w) = exposure_warning(&addr, keyed) {
        eprintln!("{w}");
    }
    Ok(ep)
}

fn run_cli(cli: Cli) -> Result<(), BoxErr> {
    pin(cli.cpu)?;
    let cc = cli.tcp_congestion.as_deref();
    if cli.show_policy {
        return show_policy(cli.transport);
    }
    match cli.cmd {
        None => {
            eprintln!("nothing to do: try `ionet-perf selftest` or `ionet-perf --help`");
            Ok(())
        }
        Some(Cmd::Server { listen, wait, knobs, key_file }) => {
            procs::exit_with_parent();
            let scheme = listen.parse::<ionet::Address>()?.scheme();
            let key = load_key(key_file.as_deref())?;
            let keyed = key.is_some();
            let cfg = with_key(with_congestion(knobs.tuning(wait).config(scheme), cc), key);
            let ep = bind_server(listen.as_str(), cfg, keyed)?;
            println!("LISTEN {}", ep.local_addr().ok_or("no local address")?);
            std::io::stdout().flush()?;
            over_ionet::serve(&ep)?;
            Ok(())
        }
        Some(Cmd::QosServer { listen, wait }) => {
            procs::exit_with_parent();
            let ep = bind_server(listen.as_str(), Config::default().wait_mode(wait), false)?;
            println!("LISTEN {}", ep.local_addr().ok_or("no local address")?);
            std::io::stdout().flush()?;
            qos::serve(&ep)?;
            Ok(())
        }
        Some(Cmd::RawServer { listen }) => {
            procs::exit_with_parent();
            let l = std::net::TcpListener::bind(&listen)?;
            println!("LISTEN {}", l.local_addr()?);
            std::io::stdout().flush()?;
            raw::serve(l)?;
            Ok(())
        }
        Some(Cmd::RawClient { run, spin }) => {
            let mut c = raw::RawClient::connect(&run.connect)?;
            if !run.json {
                println!("# raw {} {:?} spin={spin} runs={}", run.connect, run.test, run.runs);
            }
            let mut results = Vec::new();
            for size in parse_sizes(&run.sizes)? {
                let p = Params { spin, ..run.params(size) };
                let rs = (0..run.runs).map(|_| c.run(&p, None)).collect::<Result<Vec<_>, _>>()?;
                report(&run, size, &rs, &mut results);
            }
            if run.json {
                let extra = serde_json::json!({ "implementation": "raw", "spin": spin });
                print_results(&run, extra, results)?;
            }
            Ok(())
        }
        Some(Cmd::Client { run, wait, verify, pool, sl, knobs, key_file, csv, on_demand }) => {
            let connect = &run.connect;
            let addrs: Vec<&str> = connect.split(',').map(str::trim).collect();
            if addrs.len() > 1 && run.test != Test::Read {
                return Err("several servers only with --test read".into());
            }
            let scheme = addrs[0].parse::<ionet::Address>()?.scheme();
            let key = load_key(key_file.as_deref())?;
            let ep = Endpoint::client(with_key(with_congestion(knobs.tuning(wait).config(scheme), cc), key))?;
            let peers = addrs.iter().map(|a| ep.connect(*a)).collect::<Result<Vec<_>, _>>()?;
            let mut w = csv_writer(csv.as_ref())?;
            let bufs = if pool { "pool" } else { "heap" };
            if !run.json || on_demand {
                println!(
                    "# {} {:?} wait={} sl={} buffers={bufs} runs={}",
                    connect,
                    run.test,
                    wait.name(),
                    sl,
                    run.runs
                );
            }
            let sizes = parse_sizes(&run.sizes)?;
            if on_demand {
                let ps: Vec<Params> =
                    sizes.iter().map(|&size| Params { sl, verify, pool, ..run.params(size) }).collect();
                let (input, output) = (std::io::stdin().lock(), std::io::stdout().lock());
                return over_ionet::on_demand(&ep, &peers, &ps, input, output, |r, res| {
                    write_row(&mut w, "client", "ionet", wait.name(), res, r)
                });
            }
            let mut results = Vec::new();
            for size in sizes {
                let p = Params { sl, verify, pool, ..run.params(size) };
                let mut rs = Vec::new();
                for r in 0..run.runs {
                    let res = over_ionet::run_on(&ep, &peers, &p)?;
                    write_row(&mut w, "client", "ionet", wait.name(), &res, r)?;
                    rs.push(res);
                }
                report(&run, size, &rs, &mut results);
            }
            if run.json {
                let extra = serde_json::json!({
                    "implementation": "ionet",
                    "wait": wait.name(),
                    "service_level": sl.to_string(),
                    "buffers": bufs,
                });
                print_results(&run, extra, results)?;
            }
            Ok(())
        }
        Some(Cmd::Selftest { transport }) => selftest(transport),
        Some(Cmd::Compare { transport, runs, quick, csv, markdown }) => {
            compare(transport, runs.max(1), quick, csv, markdown)
        }
        Some(Cmd::Ab { transports, lat_sizes, bw_sizes, spin_sizes, no_spin, bw_only, window, common }) => {
            let mut o = ab::AbOpts::new(transports, common.runs, common.quick);
            o.pin = !common.no_pin;
            o.lat_sizes = if bw_only { Vec::new() } else { parse_sizes(&lat_sizes)? };
            o.bw_sizes = parse_sizes(&bw_sizes)?;
            o.spin_sizes = if no_spin || bw_only { Vec::new() } else { parse_sizes(&spin_sizes)? };
            o.window = window;
            let s = ab::run(&o)?;
            let (md, plots) = ab::render(&s, &common.link_prefix)?;
            emit(&common, "ab", &s, &md, &plots)
        }
        Some(Cmd::Calibrate { transports, tolerance, write_policy, common }) => {
            let mut all = benchkit::Samples::new();
            let mut md = String::new();
            let mut plots = Vec::new();
            for scheme in transports {
                let mut o = calibrate::CalOpts::new(scheme, common.runs, common.quick);
                o.pin = !common.no_pin;
                o.tolerance = tolerance;
                let s = calibrate::run(&o)?;
                let (m, p) = calibrate::render(&s, scheme, tolerance, &common.link_prefix)?;
                md.push_str(&format!(
                    "Mechanisms forced in turn on {scheme}:// (wait mode {}), one-way time = RTT/2 of a \
                     ping-pong and streaming bandwidth (window 16):\n\n",
                    o.wait.name()
                ));
                md.push_str(&m);
                md.push('\n');
                plots.extend(p);
                if let Some(path) = &write_policy {
                    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                    let note = format!(
                        "ionet-perf calibrate on {} ({} wait), tolerance {:.0} %",
                        host.trim(),
                        o.wait.name(),
                        tolerance * 100.0
                    );
                    match calibrate::policy_lines(&s, scheme, tolerance, &note) {
                        Some(lines) => {
                            let old = std::fs::read_to_string(path).unwrap_or_default();
                            std::fs::write(path, calibrate::merge_policy(&old, scheme, &lines))?;
                            eprintln!("calibrate {scheme}: thresholds written to {}", path.display());
                        }
                        None => eprintln!("calibrate {scheme}: no figures, nothing written"),
                    }
                }
                all.extend(s.rows().iter().cloned());
            }
            emit(&common, "calibrate", &all, &md, &plots)
        }
        Some(Cmd::Qos { transports, wait, common }) => {
            let s = qos::run(&transports, common.runs, common.quick, wait)?;
            let (md, plots) = qos::render(&s, &common.link_prefix)?;
            let md = format!("Wait mode {} on both sides.\n\n{md}", wait.name());
            emit(&common, "qos", &s, &md, &plots)
        }
    }
}

/// Prints the Markdown and writes `<name>.csv`, `<name>.md` and the plots into `--out`.
fn emit(
    c: &Common,
    name: &str,
    s: &benchkit::Samples,
    md: &str,
    plots: &[(String, String)],
) -> Result<(), BoxErr> {
    let md = if c.quick {
        format!("**QUICK RUN (smoke check, not for publication).**\n\n{md}")
    } else {
        md.to_string()
    };
    println!("{md}");
    if let Some(dir) = &c.out {
        std::fs::create_dir_all(dir)?;
        s.write_csv(&dir.join(format!("{name}.csv")))?;
        std::fs::write(dir.join(format!("{name}.md")), &md)?;
        for (file, svg) in plots {
            std::fs::write(dir.join(file), svg)?;
        }
    }
    Ok(())
}

/// The table an endpoint of `scheme` really uses: bound on loopback, so the transport's own
/// limits (an inline limit capped by the receive buffers, say) are applied.
fn show_policy(scheme: Scheme) -> Result<(), BoxErr> {
    match Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()) {
        Ok(ep) => {
            let info = ep.info();
            println!(
                "active mechanism table of a {scheme}:// endpoint (thresholds from {}, capped by the transport's limits):",
                info.policy.origin().describe()
            );
            print!("{}", info.policy.table(scheme));
            println!(
                "eager / largest unexpected message this end accepts: {} B (from {}; advertised in the handshake, each connection uses the smaller of its two ends' limits)",
                info.eager_limit,
                info.eager_origin.describe()
            );
            println!("largest message or payload: {} B", info.max_message);
            if let Some(c) = info.credits {
                println!("credits per connection: {c}");
            }
            if let Some((n, size)) = info.fast_slots {
                println!("fast-RDMA ring: {n} slots of {size} B");
            }
            if let Some(r) = info.regcache {
                println!("registration cache: {} entries, {} B pinned at most", r.max_entries, r.max_bytes);
            }
            println!("wait mode: {}", info.wait_mode.name());
        }
        Err(e) => {
            println!("({scheme}:// unavailable here: {e}; showing the configured defaults)");
            print!("{}", Policy::for_scheme(scheme).table(scheme));
        }
    }
    Ok(())
}

fn csv_writer(path: Option<&PathBuf>) -> Result<Option<csv::Writer<std::fs::File>>, BoxErr> {
    let Some(path) = path else { return Ok(None) };
    let fresh = !path.exists();
    let f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(f);
    if fresh {
        w.write_record([
            "experiment",
            "impl",
            "wait",
            "test",
            "size",
            "run",
            "secs",
            "gbytes_per_s",
            "msgs_per_s",
            "rtt_p50_us",
            "rtt_p99_us",
            "client_cpu_s_per_gb",
            "server_cpu_s_per_gb",
        ])?;
    }
    Ok(Some(w))
}

fn write_row(
    w: &mut Option<csv::Writer<std::fs::File>>,
    experiment: &str,
    imp: &str,
    wait: &str,
    r: &RunResult,
    run: usize,
) -> Result<(), BoxErr> {
    if let Some(w) = w {
        let opt = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
        w.write_record([
            experiment.to_string(),
            imp.to_string(),
            wait.to_string(),
            format!("{:?}", r.test).to_lowercase(),
            r.size.to_string(),
            run.to_string(),
            format!("{:.6}", r.secs),
            format!("{:.4}", r.gbps()),
            format!("{:.0}", r.msg_rate()),
            opt(r.rtt_p50),
            opt(r.rtt_p99),
            format!("{:.4}", r.client_cpu_per_gb()),
            opt(r.server_cpu_per_gb()),
        ])?;
        w.flush()?;
    }
    Ok(())
}

/// One figure measured at one size, over the runs.
struct Figure {
    /// Its name in JSON.
    key: &'static str,
    /// What precedes it in the table.
    label: &'static str,
    unit: &'static str,
    /// Decimals in the table.
    decimals: usize,
    summary: Summary,
}

/// What a test measures at one size: the figures the table and the JSON both show.
fn figures(test: Test, rs: &[RunResult]) -> Vec<Figure> {
    let of = |key, label, unit, decimals, xs: Vec<f64>| Figure {
        key,
        label,
        unit,
        decimals,
        summary: Summary::of(&xs),
    };
    match test {
        Test::Lat => vec![of("rtt_p50", "RTT p50 ", "µs", 2, rs.iter().filter_map(|r| r.rtt_p50).collect())],
        Test::Msgrate => {
            vec![of("message_rate", "", "Mmsg/s", 3, rs.iter().map(|r| r.msg_rate() / 1e6).collect())]
        }
        _ => vec![
            of("bandwidth", "", "GB/s", 3, rs.iter().map(|r| r.gbps()).collect()),
            of("client_cpu", "client CPU ", "s/GB", 3, rs.iter().map(|r| r.client_cpu_per_gb()).collect()),
        ],
    }
}

/// A size's line in the table.
fn describe(test: Test, size: usize, rs: &[RunResult]) -> String {
    let parts: Vec<String> = figures(test, rs)
        .iter()
        .map(|f| format!("{}{}", f.label, f.summary.show(f.unit, f.decimals)))
        .collect();
    format!("{size:>10} B  {}", parts.join("  "))
}

/// A size's object in `--json`: `{"size": 4096, "bandwidth": {"unit": "GB/s", "median": …,
/// "min": …, "max": …}, …}`.
fn size_json(test: Test, size: usize, rs: &[RunResult]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("size".into(), size.into());
    for f in figures(test, rs) {
        let s = f.summary;
        let v = serde_json::json!({ "unit": f.unit, "median": s.median, "min": s.min, "max": s.max });
        m.insert(f.key.into(), v);
    }
    m.into()
}

/// Prints a size's line, or keeps its JSON object for the end.
fn report(run: &RunArgs, size: usize, rs: &[RunResult], results: &mut Vec<serde_json::Value>) {
    if run.json {
        results.push(size_json(run.test, size, rs));
    } else {
        println!("{}", describe(run.test, size, rs));
    }
}

/// The one JSON document of a `client` or `raw-client` run with `--json`.
fn print_results(
    run: &RunArgs,
    extra: serde_json::Value,
    results: Vec<serde_json::Value>,
) -> Result<(), BoxErr> {
    let mut doc = serde_json::json!({
        "test": format!("{:?}", run.test).to_lowercase(),
        "connect": run.connect,
        "runs": run.runs,
    });
    if let (Some(d), serde_json::Value::Object(e)) = (doc.as_object_mut(), extra) {
        d.extend(e);
        d.insert("results".into(), results.into());
    }
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// CPUs for the comparison: client and server apart, as on two hosts.
const CLIENT_CPU: usize = 0;
const SERVER_CPU: &str = "1";

fn ionet_server(scheme: Scheme, wait: WaitMode) -> Result<ServerProc, BoxErr> {
    let listen = format!("{scheme}://127.0.0.1:0");
    Ok(ServerProc::spawn(&["server", "--listen", &listen, "--wait", wait.name(), "--cpu", SERVER_CPU])?)
}

fn selftest(scheme: Scheme) -> Result<(), BoxErr> {
    println!("ionet-perf self-test over {scheme}:// (server in a child process, every byte verified)");
    let srv = ionet_server(scheme, WaitMode::Block)?;
    let ep = Endpoint::client(Config::default().wait_mode(WaitMode::Block))?;
    let peer = ep.connect(srv.addr.as_str())?;
    let info = ep.info();
    println!("policy (eager/inline limit {} B, max message {} B):", info.eager_limit, info.max_message);
    print!("{}", info.policy.table(scheme));
    println!("{:>10}  {:>22}  {:>22}", "size", "RTT p50 (wait=block)", "bandwidth (window 16)");
    for size in [8usize, 4096, 65536, 1 << 20, 4 << 20] {
        let lat = Params {
            test: Test::Lat,
            size,
            iters: 200,
            window: 1,
            sl: ServiceLevel::Normal,
            verify: true,
            spin: false,
            pool: false,
            footprint: 0,
        };
        let l = over_ionet::run(&ep, peer, &lat, Some(srv.pid()))?;
        let iters = ((256 << 20) / size).clamp(32, 20_000) / 16 * 16;
        let bw = Params {
            test: Test::Bw,
            size,
            iters,
            window: 16,
            sl: ServiceLevel::Bulk,
            verify: true,
            spin: false,
            pool: false,
            footprint: 0,
        };
        let b = over_ionet::run(&ep, peer, &bw, Some(srv.pid()))?;
        println!("{:>10}  {:>19.1} µs  {:>17.3} GB/s", size, l.rtt_p50.unwrap_or(0.0), b.gbps());
    }
    let info = ep.info();
    let c = info.counters;
    if let Some(r) = &info.rdma {
        let shown = |v: Option<u64>| v.map_or("not measured".to_string(), |n| n.to_string());
        println!(
            "verbs: RNR retries {}, failed work requests {} (RNR exceeded {}, retries exceeded {}); port: RNR NAK retries {}, ACK timeouts {}, out of sequence {}",
            shown(r.provider.rnr_retries),
            c.wc_errors,
            c.wc_rnr_retry_exceeded,
            c.wc_retry_exceeded,
            shown(r.port.rnr_nak_retries),
            shown(r.port.ack_timeouts),
            shown(r.port.out_of_sequence),
        );
    }
    if c.wc_errors > 0 || c.peers_lost > 0 || c.protocol_errors > 0 {
        return Err(format!(
            "{} failed work requests, {} peers lost, {} protocol errors",
            c.wc_errors, c.peers_lost, c.protocol_errors
        )
        .into());
    }
    println!(
        "ok: {} messages sent, {} received; mechanisms: {} inline, {} fast RDMA, {} rendezvous; no errors",
        c.msgs_sent, c.msgs_received, c.mech_inline, c.mech_fast_rdma, c.mech_server_rdma
    );
    Ok(())
}

struct Row {
    what: String,
    baseline: String,
    base: Summary,
    ours: Summary,
    unit: &'static str,
    lower_is_better: bool,
}

fn compare(
    scheme: Scheme,
    runs: usize,
    quick: bool,
    csv: Option<PathBuf>,
    markdown: Option<PathBuf>,
) -> Result<(), BoxErr> {
    let mut w = csv_writer(csv.as_ref())?;
    let scale = if quick { 0.1 } else { 1.0 };
    let n = |x: f64| ((x * scale) as usize).max(64);
    let mut rows: Vec<Row> = Vec::new();
    pin(Some(CLIENT_CPU))?;
    let raw_srv = ServerProc::spawn(&["raw-server", "--cpu", SERVER_CPU])?;
    let mut raw_cli = raw::RawClient::connect(&raw_srv.addr)?;

    // Latency, spin and block: raw and ionet interleaved run by run.
    for (wait, iters) in [(WaitMode::Spin, n(20_000.0)), (WaitMode::Block, n(5_000.0))] {
        let srv = ionet_server(scheme, wait)?;
        let ep = Endpoint::client(Config::default().wait_mode(wait))?;
        let peer = ep.connect(srv.addr.as_str())?;
        let p = Params {
            test: Test::Lat,
            size: 8,
            iters,
            window: 1,
            sl: ServiceLevel::Normal,
            verify: false,
            spin: wait == WaitMode::Spin,
            pool: false,
            footprint: 0,
        };
        // Warm up both paths.
        raw_cli.run(&Params { iters: 1000, ..p }, None)?;
        over_ionet::run(&ep, peer, &Params { iters: 1000, ..p }, None)?;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for r in 0..runs {
            let x = raw_cli.run(&p, Some(raw_srv.pid()))?;
            write_row(&mut w, "lat8", "raw", wait.name(), &x, r)?;
            a.push(x.rtt_p50.unwrap_or(f64::NAN));
            let y = over_ionet::run(&ep, peer, &p, Some(srv.pid()))?;
            write_row(&mut w, "lat8", "ionet", wait.name(), &y, r)?;
            b.push(y.rtt_p50.unwrap_or(f64::NAN));
        }
        rows.push(Row {
            what: format!("8 B ping-pong RTT p50, {} mode", wait.name()),
            baseline: format!(
                "raw {} TCP ping-pong",
                if wait == WaitMode::Spin { "busy-poll" } else { "blocking" }
            ),
            base: Summary::of(&a),
            ours: Summary::of(&b),
            unit: "µs",
            lower_is_better: true,
        });
    }

    // Streaming bandwidth and CPU per GB, blocking waits on both sides.
    let srv = ionet_server(scheme, WaitMode::Block)?;
    let ep = Endpoint::client(Config::default().wait_mode(WaitMode::Block))?;
    let peer = ep.connect(srv.addr.as_str())?;
    for size in [1usize << 20, 4 << 20] {
        let iters = n((2048usize << 20) as f64 / size as f64) / 64 * 64;
        let p = Params {
            test: Test::Bw,
            size,
            iters: iters.max(64),
            window: 64,
            sl: ServiceLevel::Bulk,
            verify: false,
            spin: false,
            pool: false,
            footprint: 0,
        };
        raw_cli.run(&Params { iters: 64, ..p }, None)?;
        over_ionet::run(&ep, peer, &Params { iters: 64, ..p }, None)?;
        let (mut a, mut b, mut ca, mut cb, mut sa, mut sb) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        for r in 0..runs {
            let x = raw_cli.run(&p, Some(raw_srv.pid()))?;
            write_row(&mut w, "bw", "raw", "block", &x, r)?;
            a.push(x.gbps());
            ca.push(x.client_cpu_per_gb());
            sa.push(x.server_cpu_per_gb().unwrap_or(f64::NAN));
            let y = over_ionet::run(&ep, peer, &p, Some(srv.pid()))?;
            write_row(&mut w, "bw", "ionet", "block", &y, r)?;
            b.push(y.gbps());
            cb.push(y.client_cpu_per_gb());
            sb.push(y.server_cpu_per_gb().unwrap_or(f64::NAN));
        }
        let mib = size >> 20;
        rows.push(Row {
            what: format!("streaming bandwidth, {mib} MiB messages, window 64"),
            baseline: format!("raw TCP streamer, {mib} MiB writes"),
            base: Summary::of(&a),
            ours: Summary::of(&b),
            unit: "GB/s",
            lower_is_better: false,
        });
        rows.push(Row {
            what: format!("sender CPU per GB, {mib} MiB"),
            baseline: "raw streamer sender".into(),
            base: Summary::of(&ca),
            ours: Summary::of(&cb),
            unit: "s/GB",
            lower_is_better: true,
        });
        rows.push(Row {
            what: format!("receiver CPU per GB, {mib} MiB"),
            baseline: "raw streamer receiver".into(),
            base: Summary::of(&sa),
            ours: Summary::of(&sb),
            unit: "s/GB",
            lower_is_better: true,
        });
    }
    // iperf3, when installed, as the reference for single-stream loopback TCP.
    if procs::have("iperf3") && scheme == Scheme::Tcp {
        let mut v = Vec::new();
        for _ in 0..runs.min(5) {
            if let Some(gbit) = procs::iperf3("1M", if quick { 1 } else { 3 }) {
                v.push(gbit / 8.0);
            }
        }
        if !v.is_empty() {
            let s = Summary::of(&v);
            println!("iperf3 -l 1M (single stream): {}", s.show("GB/s", 3));
            rows.push(Row {
                what: "iperf3 -l 1M single stream (reference)".into(),
                baseline: "iperf3 itself".into(),
                base: s,
                ours: s,
                unit: "GB/s",
                lower_is_better: false,
            });
        }
    }
    // Message rate: 64 B, window 64, against raw 64 B writes.
    let iters = n(400_000.0) / 64 * 64;
    let p = Params {
        test: Test::Msgrate,
        size: 64,
        iters,
        window: 64,
        sl: ServiceLevel::Normal,
        verify: false,
        spin: false,
        pool: false,
        footprint: 0,
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let x = raw_cli.run(&Params { test: Test::Bw, ..p }, Some(raw_srv.pid()))?;
        write_row(&mut w, "msgrate", "raw", "block", &x, r)?;
        a.push(x.msg_rate() / 1e6);
        let y = over_ionet::run(&ep, peer, &p, Some(srv.pid()))?;
        write_row(&mut w, "msgrate", "ionet", "block", &y, r)?;
        b.push(y.msg_rate() / 1e6);
    }
    rows.push(Row {
        what: "64 B message rate, window 64, immediate sends".into(),
        baseline: "raw 64 B writes (no framing, no matching)".into(),
        base: Summary::of(&a),
        ours: Summary::of(&b),
        unit: "Mmsg/s",
        lower_is_better: false,
    });

    // The same with batched sends: a window's posts leave in one writev.
    let bep = Endpoint::client(Config::default().wait_mode(WaitMode::Block).batch_sends(true))?;
    let bpeer = bep.connect(srv.addr.as_str())?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let x = raw_cli.run(&Params { test: Test::Bw, ..p }, Some(raw_srv.pid()))?;
        a.push(x.msg_rate() / 1e6);
        let y = over_ionet::run(&bep, bpeer, &p, Some(srv.pid()))?;
        write_row(&mut w, "msgrate-batched", "ionet", "block", &y, r)?;
        b.push(y.msg_rate() / 1e6);
    }
    rows.push(Row {
        what: "64 B message rate, window 64, `batch_sends(true)`".into(),
        baseline: "raw 64 B writes (no framing, no matching)".into(),
        base: Summary::of(&a),
        ours: Summary::of(&b),
        unit: "Mmsg/s",
        lower_is_better: false,
    });

    let md = render(scheme, runs, &rows);
    println!("{md}");
    if let Some(path) = markdown {
        std::fs::write(path, md)?;
    }
    Ok(())
}

fn render(scheme: Scheme, runs: usize, rows: &[Row]) -> String {
    let mut s = format!(
        "| measurement ({scheme}) | baseline | baseline median (min–max) | ionet median (min–max) | ionet / baseline |\n|---|---|---|---|---|\n"
    );
    for r in rows {
        let ratio = r.ours.median / r.base.median;
        let better = if r.lower_is_better { "lower is better" } else { "higher is better" };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.2}× ({better}) |\n",
            r.what,
            r.baseline,
            r.base.show(r.unit, 3),
            r.ours.show(r.unit, 3),
            ratio
        ));
    }
    s.push_str(&format!(
        "\nMedians of {runs} runs (min–max in brackets), raw and ionet interleaved run by run; servers in child \
         processes pinned to CPU {SERVER_CPU}, clients on CPU {CLIENT_CPU}.\n"
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lists_and_sweeps_parse() {
        assert_eq!(parse_sizes("8,4k,1m").unwrap(), vec![8, 4096, 1 << 20]);
        assert_eq!(parse_sizes("1:8").unwrap(), vec![1, 2, 4, 8]);
        assert_eq!(parse_sizes("16:64").unwrap(), vec![16, 32, 64]);
        assert!(parse_sizes("x").is_err());
    }

    /// Scheme and wait-mode names come from ionet's own `ValueEnum`s.
    #[test]
    fn transports_and_wait_modes_parse_by_their_names() {
        let cli = Cli::try_parse_from(["ionet-perf", "selftest", "--transport", "softib"]).unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Selftest { transport: Scheme::SoftIb })));
        assert!(Cli::try_parse_from(["ionet-perf", "selftest", "--transport", "udp"]).is_err());
        let cli = Cli::try_parse_from(["ionet-perf", "--show-policy", "--transport", "ib"]).unwrap();
        assert_eq!(cli.transport, Scheme::Ib);
        let cli = Cli::try_parse_from(["ionet-perf", "server", "--wait", "spin"]).unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Server { wait: WaitMode::Spin, .. })));
        assert!(Cli::try_parse_from(["ionet-perf", "server", "--wait", "sometimes"]).is_err());
    }

    /// Without `--wait`, client and server wait as the library's default configuration does:
    /// a figure measured without options is what a program gets without tuning.
    #[test]
    fn client_and_server_wait_as_the_library_does_by_default() {
        let default = ionet::Config::default().get_wait_mode();
        let cli = Cli::try_parse_from(["ionet-perf", "server"]).unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Server { wait, .. }) if wait == default));
        let cli = Cli::try_parse_from(["ionet-perf", "client", "--connect", "tcp://127.0.0.1:1"]).unwrap();
        assert!(matches!(cli.cmd, Some(Cmd::Client { wait, .. }) if wait == default));
    }
}

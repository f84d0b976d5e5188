//! `stripefs-bench`: the transport A/B suite of stripefs and ionet — the experiments of "PVFS
//! over InfiniBand" and "PVFS: A Parallel File System for Linux Clusters" over `tcp://` and
//! `softib://` side by side, each a median of repeated runs with its min–max spread, beside
//! baselines measured in the same run.
//!
//! | command | what |
//! |---|---|
//! | `e1` | concurrent read/write: 1–4 io servers × 1–4 clients, each client a 2N MiB region of one shared file; ratio to `ionet-perf` bandwidth on the same transport |
//! | `e2` | small-write access time 128 B – 64 KiB per mechanism (inline / fast RDMA / server-based RDMA), registration cache at 0 % and 100 % hits |
//! | `e3` | a 32 MiB transfer against the io servers' transfer unit, 64 KiB – 32 MiB |
//! | `e4` | tiled access (4 clients, 2×2 tiles of 1024×768 24-byte elements, 4 io servers) with and without list I/O: bandwidth and request counts |
//! | `e5` | list I/O of 64-byte elements in a 2048×1536 array: registrations and bandwidth with and without allocation hints |
//! | `cpu` | client and io-server CPU seconds per GB per transport, mechanism and client wait mode |
//! | `all` | everything above plus `ionet-perf ab`, `calibrate` and `qos`, then the report |
//!
//! Servers are child processes of the `stripefs` binary (`stripefs serve`, found beside this
//! one; they exit with this process); clients are threads of this process, each with its own
//! `Client` (endpoint and connections). Data lives on tmpfs when available. Every experiment
//! writes `<out>/<id>.csv` (every run), `<out>/<id>.md` and SVG plots under `<out>/plots/`.
//!
//! The suite is its own unpublished crate, not a subcommand of `stripefs`: its report plumbing
//! (benchkit) is not on crates.io, and the published `stripefs` binary should not need it.
#![forbid(unsafe_code)]

mod all;
mod cpu;
mod e1;
mod e2;
mod e3;
mod e5;
mod reference;
mod tiles;
mod util;

use anyhow::{Context, Result, bail};
use benchkit::Samples;
use clap::{Args, Parser, Subcommand};
use ionet::Scheme;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::{Client, ClientOptions};

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "stripefs-bench",
    version,
    about = "The transport A/B benchmark suite: E1–E5, CPU, and `all` (with ionet-perf's ab, calibrate \
             and qos) writing CSV, Markdown, SVG plots and the BENCHMARKS.md summary"
)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// E1: concurrent read/write bandwidth, 1–4 io servers × 1–4 clients (as in both papers).
    E1 {
        #[command(flatten)]
        o: e1::E1Args,
        #[command(flatten)]
        c: Common,
    },
    /// E2: small-write access time per mechanism and registration-cache hit rate (PVFS over InfiniBand, Fig. 11).
    E2 {
        #[command(flatten)]
        o: e2::E2Args,
        #[command(flatten)]
        c: Common,
    },
    /// E3: a 32 MiB transfer against the transfer-unit size (PVFS over InfiniBand, Fig. 12).
    E3 {
        #[command(flatten)]
        o: e3::E3Args,
        #[command(flatten)]
        c: Common,
    },
    /// E4: tiled access with and without list I/O (PVFS over InfiniBand, Fig. 13).
    E4 {
        #[command(flatten)]
        o: tiles::TileArgs,
        #[command(flatten)]
        c: Common,
    },
    /// E5: list-I/O registrations with and without allocation hints (PVFS over InfiniBand, Fig. 14).
    E5 {
        #[command(flatten)]
        o: e5::E5Args,
        #[command(flatten)]
        c: Common,
    },
    /// CPU seconds per GB, client and io server, per transport, mechanism and wait mode.
    Cpu {
        #[command(flatten)]
        o: cpu::CpuArgs,
        #[command(flatten)]
        c: Common,
    },
    /// Everything, with ionet-perf's ab / calibrate / qos, then the report (and BENCHMARKS.md
    /// with --update).
    All {
        #[command(flatten)]
        o: all::AllArgs,
        #[command(flatten)]
        c: Common,
    },
}

/// Options every experiment takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Transports to compare.
    #[arg(long, value_delimiter = ',', default_value = "tcp,softib", value_parser = clap::value_parser!(Scheme))]
    pub transports: Vec<Scheme>,
    /// Repeated runs per point (median and min–max are reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Short runs and sparse sweeps: a smoke check of the suite, not figures to publish.
    #[arg(long)]
    pub quick: bool,
    /// Output directory (CSV, Markdown, plots/). Default: `benchmarks`, or
    /// `target/bench-quick` with --quick.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where servers keep their data (default: /dev/shm when present, else the temp dir); a
    /// fresh subdirectory is made and removed.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Give up (and clean up) after this many minutes.
    #[arg(long, default_value_t = 40)]
    pub timeout_min: u64,
    /// The ionet-perf binary (default: next to this one).
    #[arg(long)]
    pub ionet_perf: Option<PathBuf>,
    /// The stripefs binary the servers run as (default: next to this one).
    #[arg(long, env = "STRIPEFS_BIN")]
    pub stripefs: Option<PathBuf>,
}

impl Common {
    /// The output directory.
    pub fn out_dir(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| PathBuf::from(if self.quick { "target/bench-quick" } else { "benchmarks" }))
    }

    /// Runs per point (at least 1).
    pub fn runs(&self) -> usize {
        self.runs.max(1)
    }

    /// The ionet-perf binary, which must exist.
    pub fn ionet_perf(&self) -> Result<PathBuf> {
        let p = match &self.ionet_perf {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("ionet-perf"),
        };
        if !p.is_file() {
            bail!("ionet-perf not found at {} (build it: {BUILD}, or pass --ionet-perf)", p.display());
        }
        Ok(p)
    }

    /// The stripefs binary, which must exist: the servers of every experiment run as
    /// `stripefs serve` children. Cargo builds it into the same directory as this binary, but
    /// only when asked to, so its absence is the likely mistake and is said as such.
    pub fn stripefs(&self) -> Result<PathBuf> {
        let p = self.stripefs_path()?;
        if !p.is_file() {
            bail!(
                "the stripefs binary (which runs the servers) is not at {} (build it: {BUILD}, or \
                 pass --stripefs / set STRIPEFS_BIN)",
                p.display()
            );
        }
        Ok(p)
    }

    /// Where the stripefs binary should be: `--stripefs`, else beside this binary.
    fn stripefs_path(&self) -> Result<PathBuf> {
        Ok(match &self.stripefs {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("stripefs"),
        })
    }
}

/// What builds every binary the suite runs, beside each other.
const BUILD: &str = "cargo build --release -p stripefs -p ionet-perf -p stripefs-bench";

/// A finished experiment: its samples, Markdown and plots.
#[derive(Debug, Default)]
pub struct Report {
    pub samples: Samples,
    pub md: String,
    pub plots: Vec<(String, String)>,
}

/// The running suite: options, the binary, the data directory.
pub struct Ctx {
    pub c: Common,
    /// The `stripefs` binary the servers run as.
    pub exe: PathBuf,
    data: tempfile::TempDir,
    next: std::sync::atomic::AtomicU32,
    /// Prefix of plot links in generated Markdown.
    pub link_prefix: String,
}

/// What a Ctrl-C or the watchdog removes before exiting.
static CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn cleanup_and_exit(code: i32, why: &str) -> ! {
    eprintln!("\nstripefs-bench: {why}; stopping servers and removing data");
    for d in CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let _ = std::fs::remove_dir_all(d);
    }
    // Servers exit when their stdin (a pipe from this process) closes.
    std::process::exit(code);
}

impl Ctx {
    /// Sets up the data directory, the Ctrl-C handler and the watchdog.
    pub fn new(c: Common) -> Result<Ctx> {
        // Checked by whoever starts a cluster: `all` runs ionet-perf steps without one.
        let exe = c.stripefs_path()?;
        let root = c.data_dir.clone().unwrap_or_else(util::default_data_root);
        stripefs::private::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let data = tempfile::Builder::new().prefix("stripefs-bench-").tempdir_in(&root)?;
        CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).push(data.path().to_owned());
        let _ = ctrlc::set_handler(|| cleanup_and_exit(130, "interrupted"));
        let limit = Duration::from_secs(c.timeout_min.max(1) * 60);
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            cleanup_and_exit(2, &format!("gave up after {} min (--timeout-min)", limit.as_secs() / 60));
        });
        Ok(Ctx { c, exe, data, next: 0.into(), link_prefix: "plots/".into() })
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// Starts a local cluster of `n` io servers over `scheme` in a fresh directory.
    pub fn cluster(
        &self,
        scheme: Scheme,
        n: u32,
        f: impl FnOnce(&mut LocalClusterOptions),
    ) -> Result<LocalCluster> {
        let k = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.data.path().join(format!("c{k}-{scheme}-{n}"));
        self.c.stripefs()?;
        let mut o = LocalClusterOptions::new(&self.exe, scheme, n, &dir);
        f(&mut o);
        let cl =
            LocalCluster::start(o).with_context(|| format!("starting {n} io servers over {scheme}://"))?;
        Ok(cl)
    }

    /// A client of `cluster` with `opts` (deadlines as for any client).
    pub fn client(&self, cluster: &LocalCluster, opts: ClientOptions) -> Result<Client> {
        Ok(Client::connect_with(cluster.config(), opts)?)
    }

    /// Time allowed for one barrier of lock-step clients.
    pub fn step_timeout(&self) -> Duration {
        Duration::from_secs(300)
    }

    /// Writes a report's CSV, Markdown and plots into the output directory.
    pub fn emit(&self, id: &str, r: &Report) -> Result<()> {
        let dir = self.c.out_dir();
        std::fs::create_dir_all(dir.join("plots"))?;
        r.samples.write_csv(&dir.join(format!("{id}.csv")))?;
        std::fs::write(dir.join(format!("{id}.md")), quick_banner(self.c.quick, &r.md))?;
        for (name, svg) in &r.plots {
            std::fs::write(dir.join("plots").join(name), svg)?;
        }
        println!("{}", quick_banner(self.c.quick, &r.md));
        println!("({id}: results in {})", dir.display());
        Ok(())
    }
}

fn quick_banner(quick: bool, md: &str) -> String {
    if quick {
        format!("**QUICK RUN (smoke check of the suite, not figures to publish).**\n\n{md}")
    } else {
        md.to_string()
    }
}

/// The figure of a plot as a Markdown image line.
pub fn image(prefix: &str, name: &str) -> String {
    format!("![{name}]({prefix}{name})\n")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stripefs-bench: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings), as the `stripefs` binary does.
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// An error and its contexts on one line, `outer: cause: …`, as the `stripefs` binary prints
/// them (stripefs' errors say their cause in their own message, so nothing is said twice).
pub fn error_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// Runs the requested experiment.
fn run(a: Cli) -> Result<()> {
    match a.cmd {
        BenchCmd::E1 { o, c } => one(c, "e1", |ctx| e1::run(ctx, &o)),
        BenchCmd::E2 { o, c } => one(c, "e2", |ctx| e2::run(ctx, &o)),
        BenchCmd::E3 { o, c } => one(c, "e3", |ctx| e3::run(ctx, &o)),
        BenchCmd::E4 { o, c } => one(c, "e4", |ctx| tiles::run_e4(ctx, &o)),
        BenchCmd::E5 { o, c } => one(c, "e5", |ctx| e5::run(ctx, &o)),
        BenchCmd::Cpu { o, c } => one(c, "cpu", |ctx| cpu::run(ctx, &o)),
        BenchCmd::All { o, c } => all::run(c, &o),
    }
}

fn one(c: Common, id: &str, f: impl FnOnce(&Ctx) -> Result<Report>) -> Result<()> {
    // Every experiment here starts servers: fail before anything else is set up.
    c.stripefs()?;
    let ctx = Ctx::new(c)?;
    let r = f(&ctx)?;
    ctx.emit(id, &r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own consistency checks (duplicate short flags, conflicting names, …).
    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Without the stripefs binary nothing can run: the error says where it looked and how to
    /// build it.
    #[test]
    fn a_missing_stripefs_binary_is_named_with_how_to_build_it() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("stripefs");
        let c = Cli::parse_from(["stripefs-bench", "e3", "--stripefs", missing.to_str().unwrap()]);
        let BenchCmd::E3 { c, .. } = c.cmd else { panic!("parsed as {:?}", c.cmd) };
        let e = error_line(&c.stripefs().unwrap_err());
        assert!(e.contains(&missing.display().to_string()), "{e}");
        assert!(e.contains("cargo build --release -p stripefs"), "{e}");
    }
}

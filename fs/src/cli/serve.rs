//! `stripefs serve`.

use anyhow::{Context, Result, bail};
use clap::Args;
use ionet::{Address, Scheme, WaitMode};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use stripefs::cluster::{LocalCluster, LocalClusterOptions, ServerId};
use stripefs::config::{ClusterConfig, KeySource, MAX_IO_SERVERS, read_key_file};
use stripefs::server::ServerHandle;
use stripefs::server::io::{IoServer, IoServerConfig};
use stripefs::server::meta::{MetaServer, MetaServerConfig};

/// `serve` options.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Run only the meta server, on the cluster file's meta address (needs --cluster; on a
    /// cluster of several hosts, what the meta server's host runs).
    #[arg(long, conflicts_with = "io")]
    meta: bool,
    /// Run only io server INDEX: with --cluster, on the INDEX-th address of the file's
    /// io_servers (counting from 0), keeping its objects in <data_dir>/ioINDEX.
    #[arg(long, value_name = "INDEX")]
    io: Option<u32>,
    /// Number of io servers of a local cluster started without a cluster file.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=MAX_IO_SERVERS as i64))]
    io_servers: u32,
    /// Data directory (default: the cluster file's, or ./stripefs-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Transport of a local cluster started without a cluster file.
    #[arg(long, default_value = "tcp")]
    transport: Scheme,
    /// Address to listen on: a full address for one server, a host for a local cluster.
    #[arg(long)]
    listen: Option<String>,
    /// File holding the cluster key in hex (io servers started without a cluster file).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Bytes per pipelined transfer on the io servers (binary units allowed: 256k, 1M).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    transfer_unit: Option<u64>,
    /// Transfers in flight per request on the io servers.
    #[arg(long, default_value_t = stripefs::server::io::DEFAULT_PIPELINE_DEPTH)]
    pipeline_depth: usize,
    /// Worker threads (requests served at once).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Open files an io server keeps cached (0: reopen for every request).
    #[arg(long)]
    max_open: Option<usize>,
    /// io servers stage every unit in a buffer and pread/pwrite it, instead of moving data
    /// straight between the network and the mapped object files.
    #[arg(long)]
    copy_io: bool,
    /// io servers also write through mappings when their data directory is on a disk file
    /// system (ext4); by default they map writes only into memory (tmpfs) and pwrite to disks,
    /// which is faster there.
    #[arg(long, conflicts_with = "copy_io")]
    map_disk_writes: bool,
    /// Dirty bytes an io server lets an object gather before it starts writing them back,
    /// without waiting (binary units allowed: 8M; 0: leave writeback to the kernel and fsync).
    #[arg(long, value_parser = stripefs::units::parse_size, default_value = "8M")]
    write_behind: u64,
    /// Size of each pre-posted InfiniBand receive buffer of the io servers (bytes; default
    /// ionet's 8 KiB; binary units allowed: 16k). Inline sends must fit one, so raising the inline
    /// limit needs this too.
    #[arg(long, value_parser = stripefs::units::parse_size_u32)]
    ib_recv_size: Option<u32>,
    /// Capability lifetime in seconds (meta server).
    #[arg(long, default_value_t = 3600)]
    cap_lifetime: u64,
    /// Files whose objects the meta server keeps made ahead on every io server, so creates
    /// need not wait for the io servers (0: each create makes its own).
    #[arg(long, default_value_t = stripefs::server::meta::DEFAULT_PRECREATE)]
    precreate: usize,
    /// Longest the meta server lets a change of times (a closed file's modification time,
    /// `touch`) or one that only adds mode bits wait for a flush to its disk; a sync asks for
    /// one at once. Longer: fewer flushes, and more such changes lost to a crash.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    flush_interval: Duration,
    /// How server threads wait for the network: spin, block or adaptive (default: adaptive;
    /// block for the servers of a local cluster that outnumber this host's CPUs, where a
    /// polling server takes the CPU its neighbours and clients need).
    #[arg(long)]
    wait: Option<WaitMode>,
    /// How long adaptive io server threads poll after their last work before they sleep
    /// (e.g. 2ms, 100us; default 2ms).
    #[arg(long, value_parser = humantime::parse_duration)]
    spin_budget: Option<Duration>,
    /// Run only on these CPUs (comma-separated ids, like `taskset -c`); default: all.
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// On SIGTERM or SIGINT, how long requests being served may take to finish before the
    /// server fails them and exits (e.g. 5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// Serve Prometheus metrics (text format 0.0.4) on `http://HOST:PORT/metrics` (port 0: any;
    /// the bound address is printed as `METRICS <addr>` before `LISTEN`). A local cluster gives
    /// the meta server PORT and io server I PORT+1+I (with port 0, each any port).
    #[arg(long, value_name = "HOST:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// Exit when standard input closes (used by launchers so servers never outlive them).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

fn announce(addr: Option<Address>) -> Result<()> {
    let addr = addr.context("server has no address")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTEN {addr}")?;
    out.flush()?;
    Ok(())
}

/// The channel that tells the servers to stop: SIGTERM, SIGINT or SIGHUP (the `ctrlc` crate's
/// "termination" handler), or, with `exit_with_parent`, the end of standard input.
fn stop_requests(exit_with_parent: bool) -> Result<mpsc::Receiver<()>> {
    let (tx, rx) = mpsc::channel();
    let on_signal = tx.clone();
    ctrlc::set_handler(move || {
        let _ = on_signal.send(());
    })
    .context("installing the signal handler")?;
    if exit_with_parent {
        std::thread::spawn(move || {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            let _ = tx.send(());
        });
    }
    Ok(rx)
}

/// Tells systemd (a `Type=notify` unit) the service's state, e.g. `READY=1`: one datagram to
/// the unix socket in `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). Does
/// nothing when the variable is unset (not started by systemd).
fn sd_notify(state: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let sent = UnixDatagram::unbound().and_then(|sock| {
        let addr = match path.as_bytes().strip_prefix(b"@") {
            Some(name) => SocketAddr::from_abstract_name(name)?,
            None => SocketAddr::from_pathname(&path)?,
        };
        sock.send_to_addr(state.as_bytes(), &addr)
    });
    if let Err(e) = sent {
        tracing::warn!(state, error = %e, "notifying systemd failed");
    }
}

/// Starts the metrics responder for `h` if asked to, and prints its address (before `LISTEN`,
/// which tells launchers the server is ready).
fn start_metrics(a: &ServeArgs, server: ServerId, h: &ServerHandle) -> Result<()> {
    let Some(addr) = a.metrics else { return Ok(()) };
    let reporter = h.reporter();
    let report = move || reporter.as_ref().map(|r| r.report());
    let upstream = h.upstream().cloned();
    let bound = super::metrics::start(addr, server, h.endpoint().clone(), upstream, report)?;
    tracing::info!(%bound, "serving metrics");
    let mut out = std::io::stdout().lock();
    writeln!(out, "METRICS {bound}")?;
    out.flush()?;
    Ok(())
}

/// Serves until told to stop (see [`stop_requests`]), then drains `h`: no new requests,
/// those being served finish within `timeout` or fail, the data is synced. Returns normally
/// (exit status 0) unless the sync failed.
fn serve_until_stopped(
    a: &ServeArgs,
    server: ServerId,
    h: ServerHandle,
    stop: &mpsc::Receiver<()>,
    timeout: Duration,
) -> Result<()> {
    start_metrics(a, server, &h)?;
    announce(h.local_addr())?;
    sd_notify("READY=1");
    let _ = stop.recv();
    sd_notify("STOPPING=1");
    tracing::info!(addr = ?h.local_addr(), ?timeout, "stopping: draining requests");
    let drained = h.drain(timeout).context("syncing the server's data")?;
    if drained.busy_workers > 0 {
        tracing::warn!(
            busy = drained.busy_workers,
            "requests still being served after the drain timeout were failed"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// Runs the requested servers until SIGTERM or SIGINT, then stops them gracefully.
pub fn run(a: ServeArgs, cluster: Option<PathBuf>) -> Result<()> {
    // Before any server thread starts, so they all inherit the CPU set.
    if !a.cpus.is_empty() {
        super::pin_to_cpus(&a.cpus)?;
    }
    let stop = stop_requests(a.exit_with_parent)?;
    let cfg = match &cluster {
        Some(p) => Some(ClusterConfig::load(p).with_context(|| format!("loading {}", p.display()))?),
        None => None,
    };
    if let Some(i) = a.io {
        return run_io(&a, i, cfg.as_ref(), &stop);
    }
    if a.meta {
        let cfg = cfg.context("--meta needs a cluster file (--cluster)")?;
        let key = cfg.cluster_key()?;
        let mut m = MetaServerConfig::new(cfg, &key);
        if let Some(l) = &a.listen {
            m.listen = l.parse().context("--listen")?;
        }
        if let Some(d) = &a.data_dir {
            m.db_path = d.join("meta").join("meta.redb");
        }
        m.cap_lifetime = Duration::from_secs(a.cap_lifetime);
        m.precreate = a.precreate;
        m.flush_interval = a.flush_interval;
        m.workers = a.workers;
        m.wait_mode = a.wait.unwrap_or(WaitMode::Adaptive);
        let h = MetaServer::start(m)?;
        return serve_until_stopped(&a, ServerId::Meta, h, &stop, a.drain_timeout);
    }
    run_local_cluster(&a, cfg, &stop)
}

fn run_io(a: &ServeArgs, i: u32, cfg: Option<&ClusterConfig>, stop: &mpsc::Receiver<()>) -> Result<()> {
    let listen: Address = match (&a.listen, cfg) {
        (Some(l), _) => l.parse().context("--listen")?,
        (None, Some(c)) => {
            c.io_servers.get(i as usize).cloned().context("no such io server in the cluster file")?
        }
        (None, None) => bail!("--io needs --listen or a cluster file"),
    };
    let data_dir = match (&a.data_dir, cfg) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => c.io_data_dir(i),
        (None, None) => bail!("--io needs --data-dir or a cluster file"),
    };
    let key = match (&a.key_file, cfg) {
        (Some(k), _) => read_key_file(k)?,
        (None, Some(c)) => c.cluster_key()?,
        (None, None) => bail!("--io needs --key-file or a cluster file"),
    };
    let mut s = IoServerConfig::new(listen, data_dir, &key);
    if let Some(tu) = a.transfer_unit.or(cfg.map(|c| c.transfer_unit)) {
        s.transfer_unit = usize::try_from(tu)?;
    }
    s.pipeline_depth = a.pipeline_depth;
    s.workers = a.workers;
    s.wait_mode = a.wait.unwrap_or(WaitMode::Adaptive);
    if let Some(b) = a.spin_budget {
        s.spin_budget = b;
    }
    if let Some(m) = a.max_open {
        s.max_open = m;
    }
    s.mapped = !a.copy_io;
    s.map_disk_writes = a.map_disk_writes;
    s.write_behind = a.write_behind;
    if let Some(n) = a.ib_recv_size {
        s.ib = Some(ionet::IbConfig::default().recv_size(n));
    }
    let h = IoServer::start(s)?;
    serve_until_stopped(a, ServerId::Io(i as usize), h, stop, a.drain_timeout)
}

/// How the servers of a local cluster wait by default: adaptively (polling for a while after
/// their last work) when this host has a CPU for each of them and one for a client, else by
/// blocking. A polling server holds a CPU through its whole spin budget, and where servers and
/// clients share too few CPUs that is the CPU the next request's sender or another server
/// needed: writes through a FUSE mount of a four-server cluster on two CPUs were far slower
/// with polling servers than with blocking ones.
fn local_cluster_wait(io_servers: u32, cpus: usize) -> WaitMode {
    // The io servers, the meta server, and a client.
    if io_servers as usize + 2 <= cpus { WaitMode::Adaptive } else { WaitMode::Block }
}

fn run_local_cluster(a: &ServeArgs, cfg: Option<ClusterConfig>, stop: &mpsc::Receiver<()>) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut opts = match &cfg {
        Some(c) => {
            let dir =
                a.data_dir.clone().or(c.data_dir.clone()).unwrap_or_else(|| PathBuf::from("stripefs-data"));
            stripefs::private::create_dir_all(&dir)?;
            let key = match &c.key {
                KeySource::Inline(k) => k.clone(),
                KeySource::File(_) => c.cluster_key()?,
            };
            stripefs::cluster::write_key(&dir.join("cluster.key"), &key)?;
            let mut o = LocalClusterOptions::new(exe, c.transport, c.n_io_servers(), dir);
            o.io_listen = Some(c.io_servers.clone());
            o.meta_listen = Some(c.meta.clone());
            o.transfer_unit = Some(c.transfer_unit);
            o.stripe_size = Some(c.layout.ssize);
            o
        }
        None => {
            let dir = a.data_dir.clone().unwrap_or_else(|| PathBuf::from("stripefs-data"));
            let mut o = LocalClusterOptions::new(exe, a.transport, a.io_servers, dir);
            if let Some(h) = &a.listen {
                o.host = h.clone();
            }
            o.transfer_unit = a.transfer_unit;
            o
        }
    };
    let drain = humantime::format_duration(a.drain_timeout).to_string();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let wait = a.wait.unwrap_or_else(|| local_cluster_wait(opts.io_servers, cpus));
    opts.io_args = vec!["--workers".into(), a.workers.to_string(), "--wait".into(), wait.name().into()];
    opts.io_args.extend(["--drain-timeout".into(), drain.clone()]);
    opts.io_args.extend(["--pipeline-depth".into(), a.pipeline_depth.to_string()]);
    if let Some(b) = a.spin_budget {
        opts.io_args.extend(["--spin-budget".into(), humantime::format_duration(b).to_string()]);
    }
    if let Some(m) = a.max_open {
        opts.io_args.extend(["--max-open".into(), m.to_string()]);
    }
    if let Some(n) = a.ib_recv_size {
        opts.io_args.extend(["--ib-recv-size".into(), n.to_string()]);
    }
    if a.copy_io {
        opts.io_args.push("--copy-io".into());
    }
    if a.map_disk_writes {
        opts.io_args.push("--map-disk-writes".into());
    }
    opts.io_args.extend(["--write-behind".into(), a.write_behind.to_string()]);
    opts.meta_args =
        vec!["--cap-lifetime".into(), a.cap_lifetime.to_string(), "--wait".into(), wait.name().into()];
    opts.meta_args.extend(["--drain-timeout".into(), drain, "--precreate".into(), a.precreate.to_string()]);
    let flush = humantime::format_duration(a.flush_interval).to_string();
    opts.meta_args.extend(["--flush-interval".into(), flush]);
    opts.metrics = a.metrics;
    let mut c = LocalCluster::start(opts)?;
    let path = std::fs::canonicalize(c.config_path()).unwrap_or_else(|_| c.config_path().to_owned());
    println!(
        "stripefs cluster running: meta {} + {} io servers",
        c.config().meta,
        c.config().io_servers.len()
    );
    if a.metrics.is_some() {
        let ids = std::iter::once(ServerId::Meta).chain((0..c.config().io_servers.len()).map(ServerId::Io));
        for id in ids {
            if let Some(m) = c.metrics_addr(id) {
                println!("metrics of the {id}: http://{m}/metrics");
            }
        }
    }
    println!("cluster file: {}", path.display());
    println!("use it with: export STRIPEFS_CLUSTER={}", path.display());
    println!("Ctrl-C stops it (SIGTERM too); a server that dies is started again.");
    sd_notify("READY=1");
    let mut restarts = Restarts::new(Instant::now());
    loop {
        if stop.recv_timeout(Duration::from_millis(300)).is_ok() {
            break;
        }
        let now = Instant::now();
        for (id, status) in c.reap_exited() {
            let delay = restarts.failed(id, now, restarts.ran(id, now));
            eprintln!("stripefs: {id} exited ({status}); starting it again in {delay:.1?}");
        }
        for id in restarts.due(Instant::now()) {
            match c.restart(id) {
                Ok(()) => {
                    restarts.started(id, Instant::now());
                    eprintln!("stripefs: {id} started again");
                }
                Err(e) => {
                    let delay = restarts.failed(id, Instant::now(), Duration::ZERO);
                    eprintln!("stripefs: starting {id} again failed: {e}; next try in {delay:.1?}");
                }
            }
        }
    }
    sd_notify("STOPPING=1");
    // The servers drain like a server run alone; a grace period past their drain timeout
    // covers the sync before one that hangs is killed.
    let mut failed = 0;
    for (id, status) in c.terminate(a.drain_timeout + TERMINATE_GRACE) {
        match status {
            Some(s) if s.success() => {}
            Some(s) => {
                failed += 1;
                eprintln!("stripefs: {id} stopped with {s}");
            }
            None => {
                failed += 1;
                eprintln!("stripefs: {id} did not stop in time and was killed");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} server(s) did not stop cleanly");
    }
    Ok(())
}

/// How much longer than its drain timeout a child server may take to stop (syncing its data)
/// before the launcher kills it.
const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// Delay before the first restart of a server that died.
const RESTART_DELAY: Duration = Duration::from_millis(500);

/// Longest delay between restarts of a server that keeps dying.
const RESTART_MAX_DELAY: Duration = Duration::from_secs(30);

/// A server that ran this long before it died is not in a crash loop: its next restart is
/// again after [`RESTART_DELAY`].
const STABLE_RUN: Duration = Duration::from_secs(60);

/// When the launcher starts a dead server again (sans-IO: times are passed in). The first
/// restart comes after [`RESTART_DELAY`]; each further death after a short run (or a start
/// that failed) doubles the delay, up to [`RESTART_MAX_DELAY`], so a server that cannot start
/// (its port taken, its disk gone) is retried without spinning; a run of [`STABLE_RUN`] resets
/// it. The rest of the cluster serves meanwhile.
#[derive(Debug)]
struct Restarts {
    /// When the cluster started: every server's start until it is restarted.
    start: Instant,
    servers: HashMap<ServerId, Track>,
}

#[derive(Debug)]
struct Track {
    /// Its last successful start.
    since: Instant,
    /// Deaths after short runs in a row.
    streak: u32,
    /// When to start it again, while it is dead.
    due: Option<Instant>,
}

impl Restarts {
    fn new(start: Instant) -> Self {
        Restarts { start, servers: HashMap::new() }
    }

    fn track(&mut self, id: ServerId) -> &mut Track {
        let since = self.start;
        self.servers.entry(id).or_insert(Track { since, streak: 0, due: None })
    }

    /// How long `id` has run since its last start.
    fn ran(&self, id: ServerId, now: Instant) -> Duration {
        now.saturating_duration_since(self.servers.get(&id).map_or(self.start, |t| t.since))
    }

    /// `id` died after running `ran` (zero: it failed to start); returns the delay before it
    /// is started again.
    fn failed(&mut self, id: ServerId, now: Instant, ran: Duration) -> Duration {
        let t = self.track(id);
        if ran >= STABLE_RUN {
            t.streak = 0;
        }
        let delay = RESTART_DELAY.saturating_mul(1 << t.streak.min(16)).min(RESTART_MAX_DELAY);
        t.streak = t.streak.saturating_add(1);
        t.due = Some(now + delay);
        delay
    }

    /// `id` was started again at `now`.
    fn started(&mut self, id: ServerId, now: Instant) {
        let t = self.track(id);
        t.since = now;
        t.due = None;
    }

    /// The dead servers whose restart is due at `now`, in order.
    fn due(&self, now: Instant) -> Vec<ServerId> {
        let mut v: Vec<ServerId> =
            self.servers.iter().filter(|(_, t)| t.due.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_servers_poll_only_with_a_cpu_each_and_one_to_spare() {
        assert_eq!(local_cluster_wait(4, 2), WaitMode::Block);
        assert_eq!(local_cluster_wait(4, 5), WaitMode::Block);
        assert_eq!(local_cluster_wait(4, 6), WaitMode::Adaptive);
        assert_eq!(local_cluster_wait(1, 2), WaitMode::Block);
        assert_eq!(local_cluster_wait(1, 3), WaitMode::Adaptive);
    }

    #[test]
    fn a_dead_server_is_restarted_with_a_delay_that_doubles_while_it_keeps_dying() {
        let t0 = Instant::now();
        let mut r = Restarts::new(t0);
        let io1 = ServerId::Io(1);
        assert!(r.due(t0 + Duration::from_secs(3600)).is_empty(), "nothing is due while all run");
        // Dies 10 s after the cluster started: restarted after the first delay.
        let died = t0 + Duration::from_secs(10);
        assert_eq!(r.failed(io1, died, r.ran(io1, died)), RESTART_DELAY);
        assert!(r.due(died).is_empty());
        assert_eq!(r.due(died + RESTART_DELAY), [io1]);
        // A crash loop: each short run doubles the delay, up to the cap.
        let mut now = died + RESTART_DELAY;
        let mut delays = Vec::new();
        for _ in 0..8 {
            r.started(io1, now);
            assert!(r.due(now + Duration::from_secs(3600)).is_empty(), "running again");
            now += Duration::from_secs(1);
            delays.push(r.failed(io1, now, r.ran(io1, now)).as_millis());
        }
        assert_eq!(delays, [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        // A start that fails counts as a short run.
        assert_eq!(r.failed(io1, now, Duration::ZERO), RESTART_MAX_DELAY);
        // After a long run the next death starts over.
        r.started(io1, now);
        now += STABLE_RUN;
        assert_eq!(r.failed(io1, now, r.ran(io1, now)), RESTART_DELAY);
        // Servers are tracked apart.
        assert_eq!(r.failed(ServerId::Meta, now, r.ran(ServerId::Meta, now)), RESTART_DELAY);
        assert_eq!(r.due(now + RESTART_DELAY), [ServerId::Meta, io1]);
    }
}

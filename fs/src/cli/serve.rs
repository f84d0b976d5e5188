//! `stripefs serve`.

use anyhow::{Context, Result, bail};
use clap::Args;
use ionet::{Address, Scheme, WaitMode};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;
use stripefs::cluster::{LocalCluster, LocalClusterOptions};
use stripefs::config::{ClusterConfig, KeySource, read_key_file};
use stripefs::server::io::{IoServer, IoServerConfig};
use stripefs::server::meta::{MetaServer, MetaServerConfig};

/// `serve` options.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Run only the meta server (needs a cluster file).
    #[arg(long, conflicts_with = "io")]
    meta: bool,
    /// Run only io server INDEX.
    #[arg(long, value_name = "INDEX")]
    io: Option<u32>,
    /// Number of io servers of a local cluster started without a cluster file.
    #[arg(long, default_value_t = 4)]
    io_servers: u32,
    /// Data directory (default: the cluster file's, or ./stripefs-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Transport of a local cluster started without a cluster file.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "softib", "ib"])]
    transport: String,
    /// Address to listen on: a full address for one server, a host for a local cluster.
    #[arg(long)]
    listen: Option<String>,
    /// File holding the cluster key in hex (io servers started without a cluster file).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Bytes per pipelined transfer on the io servers.
    #[arg(long)]
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
    /// Size of each pre-posted InfiniBand receive buffer of the io servers (bytes; default
    /// ionet's 8 KiB). Inline sends must fit one, so raising the inline limit needs this too.
    #[arg(long)]
    ib_recv_size: Option<u32>,
    /// Capability lifetime in seconds (meta server).
    #[arg(long, default_value_t = 3600)]
    cap_lifetime: u64,
    /// How server threads wait for the network: spin, block or adaptive.
    #[arg(long, default_value = "adaptive", value_parser = ["spin", "block", "adaptive"])]
    wait: String,
    /// Run only on these CPUs (comma-separated ids, like `taskset -c`); default: all.
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Exit when standard input closes (used by launchers so servers never outlive them).
    #[arg(long, hide = true)]
    exit_with_parent: bool,
}

fn wait_mode(s: &str) -> WaitMode {
    match s {
        "spin" => WaitMode::Spin,
        "block" => WaitMode::Block,
        _ => WaitMode::Adaptive,
    }
}

fn scheme(s: &str) -> Result<Scheme> {
    Ok(match s {
        "tcp" => Scheme::Tcp,
        "softib" => Scheme::SoftIb,
        "ib" => Scheme::Ib,
        _ => bail!("unknown transport {s}"),
    })
}

fn announce(addr: Option<Address>) -> Result<()> {
    let addr = addr.context("server has no address")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "LISTEN {addr}")?;
    out.flush()?;
    Ok(())
}

fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
}

/// Runs the requested servers until killed.
pub fn run(a: ServeArgs, cluster: Option<PathBuf>) -> Result<()> {
    // Before any server thread starts, so they all inherit the CPU set.
    if !a.cpus.is_empty() {
        super::pin_to_cpus(&a.cpus)?;
    }
    if a.exit_with_parent {
        exit_with_parent();
    }
    let cfg = match &cluster {
        Some(p) => Some(ClusterConfig::load(p).with_context(|| format!("loading {}", p.display()))?),
        None => None,
    };
    if let Some(i) = a.io {
        return run_io(&a, i, cfg.as_ref());
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
        m.workers = a.workers;
        m.wait_mode = wait_mode(&a.wait);
        let h = MetaServer::start(m)?;
        announce(h.local_addr())?;
        h.join();
        return Ok(());
    }
    run_local_cluster(&a, cfg)
}

fn run_io(a: &ServeArgs, i: u32, cfg: Option<&ClusterConfig>) -> Result<()> {
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
    s.wait_mode = wait_mode(&a.wait);
    if let Some(m) = a.max_open {
        s.max_open = m;
    }
    s.mapped = !a.copy_io;
    if let Some(n) = a.ib_recv_size {
        s.ib = Some(ionet::IbConfig::default().recv_size(n));
    }
    let h = IoServer::start(s)?;
    announce(h.local_addr())?;
    h.join();
    Ok(())
}

fn run_local_cluster(a: &ServeArgs, cfg: Option<ClusterConfig>) -> Result<()> {
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
            let mut o = LocalClusterOptions::new(exe, scheme(&a.transport)?, a.io_servers, dir);
            if let Some(h) = &a.listen {
                o.host = h.clone();
            }
            o.transfer_unit = a.transfer_unit;
            o
        }
    };
    opts.io_args = vec!["--workers".into(), a.workers.to_string(), "--wait".into(), a.wait.clone()];
    opts.io_args.extend(["--pipeline-depth".into(), a.pipeline_depth.to_string()]);
    if let Some(m) = a.max_open {
        opts.io_args.extend(["--max-open".into(), m.to_string()]);
    }
    if let Some(n) = a.ib_recv_size {
        opts.io_args.extend(["--ib-recv-size".into(), n.to_string()]);
    }
    if a.copy_io {
        opts.io_args.push("--copy-io".into());
    }
    opts.meta_args =
        vec!["--cap-lifetime".into(), a.cap_lifetime.to_string(), "--wait".into(), a.wait.clone()];
    let mut c = LocalCluster::start(opts)?;
    let path = std::fs::canonicalize(c.config_path()).unwrap_or_else(|_| c.config_path().to_owned());
    println!(
        "stripefs cluster running: meta {} + {} io servers",
        c.config().meta,
        c.config().io_servers.len()
    );
    println!("cluster file: {}", path.display());
    println!("use it with: export STRIPEFS_CLUSTER={}", path.display());
    println!("Ctrl-C stops it.");
    let (tx, rx) = mpsc::channel();
    let _ = ctrlc::set_handler(move || {
        let _ = tx.send(());
    });
    loop {
        if rx.recv_timeout(Duration::from_millis(300)).is_ok() {
            break;
        }
        if let Some(msg) = c.exited() {
            eprintln!("stripefs: {msg}; stopping the cluster");
            break;
        }
    }
    c.stop();
    Ok(())
}

//! A whole cluster on one machine, as child processes of the `stripefs` binary: what
//! `stripefs serve` (without a role), `stripefs demo`, the benchmark suite (`stripefs-bench`)
//! and the integration tests start.
//!
//! Each server is `stripefs serve --io I …` or `stripefs serve --meta …` with
//! `--exit-with-parent` (the child exits when its stdin — a pipe from the launcher — closes, so
//! servers never outlive a launcher that died) and prints `LISTEN <address>` once it is bound
//! (after `METRICS <address>` when it serves metrics, see [`LocalClusterOptions::metrics`]).
//! The io servers start first on their own ports (port 0 = any), then the meta server with a
//! cluster file naming them; the launcher then writes `<data_dir>/cluster.toml` with every real
//! address, which is what clients load. The cluster key is generated once and kept in
//! `<data_dir>/cluster.key`, so a restart on the same directory is the same cluster.

use crate::config::{ClusterConfig, ConfigError, KeySource, LayoutDefaults};
// Also `cluster::ServerId`: the local cluster names its processes with it.
pub use crate::config::ServerId;
use ionet::{Address, Scheme};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// How to start a local cluster.
#[derive(Debug, Clone)]
pub struct LocalClusterOptions {
    /// The `stripefs` binary.
    pub exe: PathBuf,
    /// Transport.
    pub scheme: Scheme,
    /// Number of io servers.
    pub io_servers: u32,
    /// Where everything lives: `cluster.toml`, `cluster.key`, `meta/`, `io<i>/`.
    pub data_dir: PathBuf,
    /// Host the meta server listens on (and io servers, unless `io_listen` is given).
    pub host: String,
    /// Explicit io server addresses (e.g. one per network namespace).
    pub io_listen: Option<Vec<Address>>,
    /// A command prefix per io server (e.g. `ip netns exec ns0`).
    pub io_prefix: Option<Vec<Vec<String>>>,
    /// Transfer unit of the io servers.
    pub transfer_unit: Option<u64>,
    /// Default stripe size.
    pub stripe_size: Option<u64>,
    /// Extra arguments for every io server (e.g. `--max-open 0`).
    pub io_args: Vec<String>,
    /// Extra arguments for the meta server.
    pub meta_args: Vec<String>,
    /// Explicit meta server address (default: `host`, any port).
    pub meta_listen: Option<Address>,
    /// Extra environment of the io servers (e.g. `IONET_INLINE_MAX` for an experiment).
    pub io_env: Vec<(String, String)>,
    /// Serve Prometheus metrics (`serve --metrics`): the meta server on this address, io
    /// server `i` on its port + 1 + `i` (port 0: each on any free port; see
    /// [`LocalCluster::metrics_addr`]).
    pub metrics: Option<std::net::SocketAddr>,
}

impl LocalClusterOptions {
    /// `n` io servers on loopback over `scheme`, data in `data_dir`.
    pub fn new(exe: impl Into<PathBuf>, scheme: Scheme, n: u32, data_dir: impl Into<PathBuf>) -> Self {
        LocalClusterOptions {
            exe: exe.into(),
            scheme,
            io_servers: n,
            data_dir: data_dir.into(),
            host: "127.0.0.1".into(),
            io_listen: None,
            io_prefix: None,
            transfer_unit: None,
            stripe_size: None,
            io_args: Vec::new(),
            meta_args: Vec::new(),
            meta_listen: None,
            io_env: Vec::new(),
            metrics: None,
        }
    }
}

/// Why a local cluster did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Spawning or talking to a child failed.
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        error: std::io::Error,
    },
    /// A server exited or printed something else instead of its address.
    #[error("{what} did not start: {detail}")]
    Start {
        /// Which server.
        what: String,
        /// What it printed.
        detail: String,
    },
    /// The cluster file.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |error| ClusterError::Io { what, error }
}

/// One running server process.
#[derive(Debug)]
struct Proc {
    child: Child,
    // Kept open: closing it tells the child to exit.
    _stdin: Option<ChildStdin>,
    _stdout: BufReader<ChildStdout>,
    /// Where it serves metrics, if it does.
    metrics: Option<std::net::SocketAddr>,
}

impl Proc {
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running local cluster. Dropping it kills every server.
#[derive(Debug)]
pub struct LocalCluster {
    /// One local cluster per data directory: a second would start servers on the first's
    /// directories and rewrite its cluster file.
    _lock: crate::private::DirLock,
    opts: LocalClusterOptions,
    cfg: ClusterConfig,
    config_path: PathBuf,
    meta: Option<Proc>,
    io: Vec<Option<Proc>>,
}

/// The key's file name in a local cluster's data directory.
const KEY_FILE: &str = "cluster.key";

/// Reads (or creates) the cluster key in `dir/cluster.key`.
pub fn ensure_key(dir: &Path) -> Result<PathBuf, ClusterError> {
    let path = dir.join(KEY_FILE);
    ensure_key_file(&path)?;
    Ok(path)
}

/// Creates the key file `path` with a new random key (32 bytes, in hex, owner-only) unless it
/// exists; whether it made one. An existing file is left as it is: it may be the key of a
/// running cluster.
pub fn ensure_key_file(path: &Path) -> Result<bool, ClusterError> {
    if path.exists() {
        return Ok(false);
    }
    let key = crate::net::random_bytes(32).map_err(io_err("generating a key"))?;
    write_key(path, &key)?;
    Ok(true)
}

/// Writes a cluster key file, in hex, readable by its owner only — from the first byte, and
/// also when the file existed with looser permissions: anyone who reads the key is a member
/// of the cluster.
pub fn write_key(path: &Path, key: &[u8]) -> Result<(), ClusterError> {
    crate::private::write_file(path, (crate::config::encode_key_hex(key) + "\n").as_bytes())
        .map_err(io_err(format!("writing {}", path.display())))
}

impl LocalCluster {
    /// Starts the io servers, then the meta server, and writes the cluster file.
    pub fn start(opts: LocalClusterOptions) -> Result<LocalCluster, ClusterError> {
        let dir = &opts.data_dir;
        crate::private::create_dir_all(dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let lock = crate::private::lock_dir(dir, "serve.lock", "another local cluster")
            .map_err(io_err("taking the data directory"))?;
        let key_path = ensure_key(dir)?;
        let any = |host: &str| -> Result<Address, ClusterError> {
            let s = format!("{}://{}:0", opts.scheme, host);
            s.parse().map_err(|e| ClusterError::Start { what: "address".into(), detail: format!("{s}: {e}") })
        };
        let mut cfg = ClusterConfig {
            transport: opts.scheme,
            meta: match &opts.meta_listen {
                Some(a) => a.clone(),
                None => any(&opts.host)?,
            },
            io_servers: Vec::new(),
            data_dir: Some(dir.clone()),
            key: KeySource::File(key_path),
            transfer_unit: opts.transfer_unit.unwrap_or(crate::server::io::DEFAULT_TRANSFER_UNIT as u64),
            layout: LayoutDefaults {
                ssize: opts.stripe_size.unwrap_or(crate::config::DEFAULT_SSIZE),
                pcount: None,
            },
        };
        let mut cluster = LocalCluster {
            _lock: lock,
            config_path: dir.join("cluster.toml"),
            opts: opts.clone(),
            cfg: cfg.clone(),
            meta: None,
            io: Vec::new(),
        };
        for i in 0..opts.io_servers {
            let listen = match &opts.io_listen {
                Some(v) => v.get(i as usize).cloned().ok_or_else(|| ClusterError::Start {
                    what: format!("io server {i}"),
                    detail: "no listen address given".into(),
                })?,
                None => any(&opts.host)?,
            };
            let (p, addr) = cluster.spawn_io(i, &listen)?;
            cluster.io.push(Some(p));
            cfg.io_servers.push(addr);
        }
        cluster.cfg = cfg;
        cluster.write_config()?;
        let meta_listen = cluster.cfg.meta.clone();
        let (p, addr) = cluster.spawn_meta(&meta_listen)?;
        cluster.meta = Some(p);
        cluster.cfg.meta = addr;
        cluster.write_config()?;
        Ok(cluster)
    }

    /// Writes the cluster file into the data directory. Paths in a cluster file are read
    /// relative to the file, not to where it was written from, so it names the data directory
    /// and the key beside it as such: it works from any directory, and copied with its key.
    fn write_config(&self) -> Result<(), ClusterError> {
        let mut file = self.cfg.clone();
        file.data_dir = Some(PathBuf::from("."));
        file.key = KeySource::File(PathBuf::from(KEY_FILE));
        file.save(&self.config_path, true).map_err(io_err("writing the cluster file"))
    }

    fn spawn(
        &self,
        what: String,
        prefix: Option<&Vec<String>>,
        args: Vec<String>,
        env: &[(String, String)],
    ) -> Result<(Proc, Address), ClusterError> {
        let mut cmd = match prefix {
            Some(p) if !p.is_empty() => {
                let mut c = Command::new(&p[0]);
                c.args(&p[1..]).arg(&self.opts.exe);
                c
            }
            _ => Command::new(&self.opts.exe),
        };
        cmd.arg("serve").args(&args).arg("--exit-with-parent");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(io_err(format!("spawning {what}")))?;
        let stdin = child.stdin.take();
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            return Err(ClusterError::Start { what, detail: "no stdout".into() });
        };
        let mut out = BufReader::new(out);
        let mut line = String::new();
        // A server serving metrics says where first; `LISTEN` comes last, once it is ready.
        let mut metrics = None;
        let read = loop {
            line.clear();
            let r = out.read_line(&mut line);
            match line.trim().strip_prefix("METRICS ").map(str::parse) {
                Some(Ok(m)) if metrics.is_none() => metrics = Some(m),
                _ => break r,
            }
        };
        let addr = match read {
            Ok(_) => line.trim().strip_prefix("LISTEN ").and_then(|a| a.parse::<Address>().ok()),
            Err(_) => None,
        };
        match addr {
            Some(addr) => Ok((Proc { child, _stdin: stdin, _stdout: out, metrics }, addr)),
            None => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                Err(ClusterError::Start { what, detail: format!("printed {line:?}, {status}") })
            }
        }
    }

    fn spawn_io(&self, i: u32, listen: &Address) -> Result<(Proc, Address), ClusterError> {
        let mut args = vec![
            "--io".to_string(),
            i.to_string(),
            "--listen".into(),
            listen.to_string(),
            "--data-dir".into(),
            self.cfg.io_data_dir(i).display().to_string(),
            "--key-file".into(),
            self.opts.data_dir.join(KEY_FILE).display().to_string(),
            "--transfer-unit".into(),
            self.cfg.transfer_unit.to_string(),
        ];
        args.extend(self.opts.io_args.iter().cloned());
        if let Some(m) = self.opts.metrics {
            let port = if m.port() == 0 { 0 } else { m.port().saturating_add(1).saturating_add(i as u16) };
            args.extend(["--metrics".into(), std::net::SocketAddr::new(m.ip(), port).to_string()]);
        }
        let prefix = self.opts.io_prefix.as_ref().and_then(|v| v.get(i as usize));
        self.spawn(format!("io server {i}"), prefix, args, &self.opts.io_env)
    }

    fn spawn_meta(&self, listen: &Address) -> Result<(Proc, Address), ClusterError> {
        let mut args = vec![
            "--meta".to_string(),
            "--cluster".into(),
            self.config_path.display().to_string(),
            "--listen".into(),
            listen.to_string(),
        ];
        args.extend(self.opts.meta_args.iter().cloned());
        if let Some(m) = self.opts.metrics {
            args.extend(["--metrics".into(), m.to_string()]);
        }
        self.spawn("meta server".into(), None, args, &[])
    }

    /// Where server `id` serves metrics (see [`LocalClusterOptions::metrics`]); `None` if it
    /// does not, or is not running.
    pub fn metrics_addr(&self, id: ServerId) -> Option<std::net::SocketAddr> {
        match id {
            ServerId::Meta => self.meta.as_ref()?.metrics,
            ServerId::Io(i) => self.io.get(i)?.as_ref()?.metrics,
        }
    }

    /// The cluster as clients see it.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// `<data_dir>/cluster.toml`.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Process ids of the running servers (meta first).
    pub fn pids(&self) -> Vec<u32> {
        self.meta.iter().chain(self.io.iter().flatten()).map(|p| p.child.id()).collect()
    }

    /// The process id of a running server.
    pub fn pid(&self, id: ServerId) -> Option<u32> {
        let p = match id {
            ServerId::Meta => self.meta.as_ref(),
            ServerId::Io(i) => self.io.get(i).and_then(Option::as_ref),
        };
        p.map(|p| p.child.id())
    }

    /// Kills io server `i` (SIGKILL: no chance to clean up, like a crash).
    pub fn kill_io(&mut self, i: usize) {
        if let Some(p) = self.io.get_mut(i).and_then(Option::take) {
            p.kill();
        }
    }

    /// Kills the meta server (SIGKILL).
    pub fn kill_meta(&mut self) {
        if let Some(p) = self.meta.take() {
            p.kill();
        }
    }

    /// Starts io server `i` again on its address and data directory.
    pub fn restart_io(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill_io(i);
        let listen = self.cfg.io_servers[i].clone();
        let (p, _) = retry_bind(|| self.spawn_io(i as u32, &listen))?;
        self.io[i] = Some(p);
        Ok(())
    }

    /// Starts the meta server again on its address and database.
    pub fn restart_meta(&mut self) -> Result<(), ClusterError> {
        self.kill_meta();
        let listen = self.cfg.meta.clone();
        let (p, _) = retry_bind(|| self.spawn_meta(&listen))?;
        self.meta = Some(p);
        Ok(())
    }

    /// A server that has exited, if any (without waiting).
    pub fn exited(&mut self) -> Option<String> {
        if let Some(p) = &mut self.meta
            && let Ok(Some(s)) = p.child.try_wait()
        {
            return Some(format!("meta server exited: {s}"));
        }
        for (i, p) in self.io.iter_mut().enumerate() {
            if let Some(p) = p
                && let Ok(Some(s)) = p.child.try_wait()
            {
                return Some(format!("io server {i} exited: {s}"));
            }
        }
        None
    }

    /// The servers that have exited since they were started, with how they ended (without
    /// waiting). Each is reported once: from then on it counts as stopped until
    /// [`LocalCluster::restart`].
    pub fn reap_exited(&mut self) -> Vec<(ServerId, std::process::ExitStatus)> {
        let mut out = Vec::new();
        let procs = std::iter::once((ServerId::Meta, &mut self.meta))
            .chain(self.io.iter_mut().enumerate().map(|(i, p)| (ServerId::Io(i), p)));
        for (id, slot) in procs {
            if let Some(p) = slot
                && let Ok(Some(status)) = p.child.try_wait()
            {
                *slot = None;
                out.push((id, status));
            }
        }
        out
    }

    /// Starts a server again on its address and data (killing it first if it runs).
    pub fn restart(&mut self, id: ServerId) -> Result<(), ClusterError> {
        match id {
            ServerId::Meta => self.restart_meta(),
            ServerId::Io(i) if i < self.io.len() => self.restart_io(i),
            ServerId::Io(_) => {
                let detail = format!("the cluster has {} io servers", self.io.len());
                Err(ClusterError::Start { what: id.to_string(), detail })
            }
        }
    }

    /// Stops every server gracefully: sends each SIGTERM (they drain their requests and sync
    /// their data) and waits up to `grace` for all of them, killing those still running then.
    /// Returns how each ended (`None`: killed after `grace`); servers that had already exited
    /// (and been reaped) are not listed.
    pub fn terminate(mut self, grace: Duration) -> Vec<(ServerId, Option<std::process::ExitStatus>)> {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let mut procs: Vec<(ServerId, Proc)> = std::iter::once((ServerId::Meta, self.meta.take()))
            .chain(self.io.iter_mut().enumerate().map(|(i, p)| (ServerId::Io(i), p.take())))
            .filter_map(|(id, p)| Some((id, p?)))
            .collect();
        for (_, p) in &procs {
            if let Ok(pid) = i32::try_from(p.child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let deadline = std::time::Instant::now() + grace;
        let mut out = Vec::new();
        for (id, p) in &mut procs {
            let status = loop {
                match p.child.try_wait() {
                    Ok(Some(s)) => break Some(s),
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    _ => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break None;
                    }
                }
            };
            out.push((*id, status));
        }
        out
    }

    /// Kills every server.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.kill_meta();
        for i in 0..self.io.len() {
            self.kill_io(i);
        }
    }
}

/// Restricts the calling thread (and the threads it starts afterwards) to `cpus`, like
/// `taskset`: on one machine, giving the clients and each server process CPUs of their own
/// makes a local cluster behave more like one of separate nodes (`stripefs serve --cpus`
/// does this for a server, before it starts its threads).
///
/// An empty list or a CPU past what the kernel's CPU set can name is refused
/// ([`std::io::ErrorKind::InvalidInput`]); the kernel refuses a set of CPUs none of which is
/// online.
pub fn pin_to_cpus(cpus: &[usize]) -> std::io::Result<()> {
    use nix::sched::{CpuSet, sched_setaffinity};
    use std::io::{Error, ErrorKind};
    if cpus.is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, "no CPUs to pin to"));
    }
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|_| Error::new(ErrorKind::InvalidInput, format!("CPU {c} is out of range")))?;
    }
    // Pid 0: the calling thread.
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(Error::from)
}

/// A port just released by a killed server can take a moment to be bindable again.
fn retry_bind<T>(mut f: impl FnMut() -> Result<T, ClusterError>) -> Result<T, ClusterError> {
    let mut last = None;
    for _ in 0..20 {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.unwrap_or(ClusterError::Start { what: "server".into(), detail: "no attempt".into() }))
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sched::sched_getaffinity;
    use nix::unistd::Pid;

    #[test]
    fn pinning_restricts_the_calling_thread_to_its_cpus() {
        std::thread::spawn(|| {
            pin_to_cpus(&[0]).unwrap();
            let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
            let on: Vec<usize> =
                (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect();
            assert_eq!(on, [0]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_to_no_cpu_or_one_out_of_range_is_refused() {
        std::thread::spawn(|| {
            assert!(pin_to_cpus(&[]).is_err());
            assert!(pin_to_cpus(&[1 << 20]).is_err());
        })
        .join()
        .unwrap();
    }
}

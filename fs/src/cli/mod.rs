//! The `stripefs` command-line tool's commands.

pub mod cmds;
pub mod cp;
pub mod demo;
mod dest;
pub mod init;
pub mod listing;
pub mod metrics;
pub mod mount;
pub mod serve;
pub mod status;

use anyhow::{Context, Result};
use std::path::PathBuf;
use stripefs::Client;
use stripefs::config::ClusterConfig;

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings); colours only on a terminal, so
/// a log file or the journal gets plain text.
pub fn init_tracing() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // A log line that cannot be written (stderr a pipe nobody reads any more) is lost
        // rather than reported on that same stderr, which panics the thread that logged.
        .log_internal_errors(false)
        .try_init();
}

/// How a command prints: for people, with sizes in binary units (`1.5 MiB`); with `--bytes`,
/// sizes as exact byte counts; with `--json`, one JSON document (sizes always in bytes).
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct Output {
    /// Print one JSON document instead of text (sizes in bytes, times as RFC 3339 strings,
    /// durations in nanoseconds; see the README's Scripting section).
    #[arg(long)]
    pub json: bool,
    /// Print sizes as exact byte counts instead of binary units (1.5 MiB = 1572864 bytes).
    #[arg(long)]
    pub bytes: bool,
}

impl Output {
    /// A size as this output writes it: `1.5 MiB`, or `1572864` with `--bytes`.
    pub fn size(&self, bytes: u64) -> String {
        if self.bytes { bytes.to_string() } else { stripefs::units::human(bytes) }
    }
}

/// Prints `v` as one JSON document on standard output.
pub fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v).context("writing JSON")?;
    std::io::Write::write_all(&mut out, b"\n")?;
    Ok(())
}

/// The cluster file to use.
pub fn cluster_path(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| PathBuf::from("stripefs-data").join("cluster.toml"))
}

/// Loads the cluster file.
pub fn load_cluster(arg: Option<PathBuf>) -> Result<ClusterConfig> {
    let path = cluster_path(arg);
    ClusterConfig::load(&path).with_context(|| {
        format!(
            "loading cluster file {} (start a local cluster with `stripefs serve --io-servers 4`, or write \
             the file of one on several hosts with `stripefs init`)",
            path.display()
        )
    })
}

fn client(cluster: Option<PathBuf>) -> Result<Client> {
    Ok(Client::connect(&load_cluster(cluster)?)?)
}

/// The cluster file and a client of it (for commands that name servers by address).
fn cluster_and_client(cluster: Option<PathBuf>) -> Result<(ClusterConfig, Client)> {
    let cfg = load_cluster(cluster)?;
    let c = Client::connect(&cfg)?;
    Ok((cfg, c))
}

/// An error and its contexts on one line, `outer: cause: …`. Each library error says its
/// cause in its own message and does not hand it on as `source()`, so nothing is said twice.
pub fn error_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// A stripefs path from `sfs:/x` or `/x`; `None` for anything else.
pub fn sfs_path(s: &str) -> Option<&str> {
    if let Some(rest) = s.strip_prefix("sfs:") {
        return Some(if rest.is_empty() { "/" } else { rest });
    }
    None
}

/// A stripefs path where only stripefs paths make sense (`sfs:/x`, `/x` or `x`).
pub fn any_path(s: &str) -> &str {
    sfs_path(s).unwrap_or(s)
}

fn base_name(p: &str) -> &str {
    p.trim_end_matches('/').rsplit('/').next().unwrap_or(p)
}

/// `name` inside stripefs directory `dir`.
fn sfs_join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// [`stripefs::cluster::pin_to_cpus`], for `serve --cpus`: the error names the CPUs.
pub fn pin_to_cpus(cpus: &[usize]) -> Result<()> {
    stripefs::cluster::pin_to_cpus(cpus).with_context(|| format!("pinning to CPUs {cpus:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_names_each_cause_once() {
        let proto = stripefs::proto::ProtoError::Malformed("stripe size 0".into());
        let e = anyhow::Error::new(stripefs::FsError::Proto(proto)).context("/d/z");
        assert_eq!(error_line(&e), "/d/z: protocol: malformed body: stripe size 0");
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = anyhow::Error::new(io).context("reading /x").context("cp");
        assert_eq!(error_line(&e), "cp: reading /x: gone");
    }
}

//! The `stripefs` command-line tool's commands.

pub mod bench;
pub mod cmds;
pub mod demo;
pub mod serve;

use anyhow::{Context, Result};
use std::path::PathBuf;
use stripefs::config::ClusterConfig;

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// The cluster file to use.
pub fn cluster_path(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| PathBuf::from("stripefs-data").join("cluster.toml"))
}

/// Loads the cluster file.
pub fn load_cluster(arg: Option<PathBuf>) -> Result<ClusterConfig> {
    let path = cluster_path(arg);
    ClusterConfig::load(&path).with_context(|| {
        format!("loading cluster file {} (start one with `stripefs serve --io-servers 4`)", path.display())
    })
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

//! `stripefs status`: is every server of the cluster up, and how is it doing.

use super::{Output, load_cluster, print_json};
use anyhow::{Result, bail};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;
use stripefs::proto::ServerStatus;
use stripefs::{Client, ServerState};

/// One server in `status --json`.
#[derive(Debug, Serialize)]
pub struct ServerReport {
    /// `meta` or `io`.
    pub role: &'static str,
    /// An io server's index in the cluster file (`null` for the meta server).
    pub index: Option<usize>,
    /// Its address.
    pub address: String,
    /// `up`, `down` (unreachable), or `unknown` (it answered, but not with a status: another
    /// protocol version).
    pub state: &'static str,
    /// Why it is down or unknown.
    pub error: Option<String>,
    /// The rest is `null` unless it is up.
    pub version: Option<String>,
    pub uptime_ns: Option<u64>,
    pub requests: Option<u64>,
    pub in_flight: Option<u64>,
    pub errors: Option<u64>,
    pub disk: Option<Disk>,
}

/// Space of the file system holding a server's data directory, in bytes.
#[derive(Debug, Serialize)]
pub struct Disk {
    pub total: u64,
    pub free: u64,
    pub avail: u64,
}

/// The whole of `status --json`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// No server is down.
    pub healthy: bool,
    /// The meta server, then the io servers in the cluster file's order.
    pub servers: Vec<ServerReport>,
}

impl ServerReport {
    fn new(role: &'static str, index: Option<usize>, address: String, st: ServerState) -> Self {
        let (state, error, s): (_, _, Option<ServerStatus>) = match st {
            ServerState::Up(s) => ("up", None, Some(s)),
            ServerState::Down(e) => ("down", Some(e.to_string()), None),
            ServerState::Unknown(e) => ("unknown", Some(e.to_string()), None),
        };
        ServerReport {
            role,
            index,
            address,
            state,
            error,
            version: s.as_ref().map(|s| s.version.to_string()),
            uptime_ns: s.as_ref().map(|s| s.uptime_ns),
            requests: s.as_ref().map(|s| s.requests),
            in_flight: s.as_ref().map(|s| s.in_flight),
            errors: s.as_ref().map(|s| s.errors),
            disk: s.map(|s| Disk { total: s.disk.total, free: s.disk.free, avail: s.disk.avail }),
        }
    }

    /// `meta`, `io 2`.
    fn label(&self) -> String {
        match self.index {
            Some(i) => format!("{} {i}", self.role),
            None => self.role.to_string(),
        }
    }

    /// How errors name it: `io server 2 (tcp://10.0.0.3:7000)`.
    fn name(&self) -> String {
        match self.index {
            Some(i) => format!("io server {i} ({})", self.address),
            None => format!("meta server ({})", self.address),
        }
    }
}

/// Asks every server for its status.
pub fn report(cluster: Option<PathBuf>) -> Result<StatusReport> {
    let cfg = load_cluster(cluster)?;
    let st = Client::connect(&cfg)?.status();
    let mut servers = vec![ServerReport::new("meta", None, cfg.meta.to_string(), st.meta)];
    for (i, (addr, s)) in cfg.io_servers.iter().zip(st.io).enumerate() {
        servers.push(ServerReport::new("io", Some(i), addr.to_string(), s));
    }
    Ok(StatusReport { healthy: servers.iter().all(|s| s.state != "down"), servers })
}

/// An uptime to the second: `2h 3m 12s`.
fn uptime(ns: u64) -> String {
    humantime::format_duration(Duration::from_secs(ns / 1_000_000_000)).to_string()
}

/// The table `stripefs status` prints.
pub fn table(r: &StatusReport, out: Output) -> String {
    let aw = r.servers.iter().map(|s| s.address.len()).max().unwrap_or(0).max("address".len());
    let mut t = format!(
        "{:<6} {:<aw$} {:<7} {:<8} {:>14} {:>10} {:>10} {:>7} {:>10} {:>10}\n",
        "role", "address", "state", "version", "uptime", "requests", "in flight", "errors", "avail", "total"
    );
    for s in &r.servers {
        t.push_str(&format!("{:<6} {:<aw$} {:<7} ", s.label(), s.address, s.state));
        match (&s.version, &s.disk) {
            (Some(v), Some(d)) => t.push_str(&format!(
                "{v:<8} {:>14} {:>10} {:>10} {:>7} {:>10} {:>10}\n",
                uptime(s.uptime_ns.unwrap_or(0)),
                s.requests.unwrap_or(0),
                s.in_flight.unwrap_or(0),
                s.errors.unwrap_or(0),
                out.size(d.avail),
                out.size(d.total)
            )),
            _ => t.push_str(&format!("{}\n", s.error.as_deref().unwrap_or(""))),
        }
    }
    t
}

/// `stripefs status`: fails (after printing everything) if any server is down, naming each.
pub fn status(cluster: Option<PathBuf>, out: Output) -> Result<()> {
    let r = report(cluster)?;
    if out.json {
        print_json(&r)?;
    } else {
        print!("{}", table(&r, out));
    }
    let down: Vec<String> = r.servers.iter().filter(|s| s.state == "down").map(ServerReport::name).collect();
    if !down.is_empty() {
        bail!("{} of {} servers down: {}", down.len(), r.servers.len(), down.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stripefs::FsError;
    use stripefs::proto::{BoundedString, DiskSpace, ProtoError};

    fn up() -> ServerState {
        ServerState::Up(ServerStatus {
            version: BoundedString::truncating("0.1.0"),
            uptime_ns: 3_723_500_000_000,
            requests: 12,
            in_flight: 1,
            errors: 0,
            disk: DiskSpace { total: 4 << 30, free: 3 << 30, avail: 3 << 29, fs_id: 1 },
        })
    }

    #[test]
    fn an_old_server_is_unknown_and_a_lost_one_down() {
        let old = ServerState::of(Err(FsError::Proto(ProtoError::UnknownVersion { got: 3 })));
        assert!(matches!(old, ServerState::Unknown(_)) && !old.is_down());
        let refused =
            ServerState::of(Err(FsError::Remote { code: stripefs::Errno::EPROTO, message: "?".into() }));
        assert!(matches!(refused, ServerState::Unknown(_)));
        let lost = ionet::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let down =
            ServerState::of(Err(FsError::Server { server: "io server 1 (tcp://h:1)".into(), error: lost }));
        assert!(down.is_down());
        let r = ServerReport::new("io", Some(1), "tcp://h:1".into(), down);
        assert_eq!((r.state, r.name()), ("down", "io server 1 (tcp://h:1)".to_string()));
        assert!(r.error.unwrap().starts_with("io server 1 (tcp://h:1): "));
    }

    #[test]
    fn the_table_shows_human_sizes_or_bytes() {
        let r = StatusReport {
            healthy: true,
            servers: vec![
                ServerReport::new("meta", None, "tcp://h:1".into(), up()),
                ServerReport::new(
                    "io",
                    Some(0),
                    "tcp://h:2".into(),
                    ServerState::of(Err(FsError::Proto(ProtoError::UnknownVersion { got: 3 }))),
                ),
            ],
        };
        let t = table(&r, Output::default());
        let rows: Vec<&str> = t.lines().collect();
        assert!(rows[1].starts_with("meta   tcp://h:1 up      0.1.0"), "{t}");
        assert!(rows[1].contains("1h 2m 3s") && rows[1].ends_with("1.5 GiB    4.0 GiB"), "{t}");
        assert!(
            rows[2].starts_with("io 0   tcp://h:2 unknown protocol: unsupported protocol version 3"),
            "{t}"
        );
        let t = table(&r, Output { bytes: true, ..Default::default() });
        assert!(t.lines().nth(1).unwrap().ends_with(" 1610612736 4294967296"), "{t}");
    }
}

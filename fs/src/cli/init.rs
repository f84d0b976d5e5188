//! `stripefs init`: the cluster file (and key) of a cluster of several hosts, and what to do
//! with them on each host.

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use ionet::addr::Host;
use ionet::{Address, Scheme};
use std::path::{Path, PathBuf};
use stripefs::cluster::{ServerId, ensure_key_file};
use stripefs::config::{ClusterConfig, ConfigError, KeySource, LayoutDefaults, parse_addr, read_key_file};

/// `init` options.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// The meta server's address as clients and io servers reach it: HOST:PORT (the host's
    /// own address or name; the server listens there).
    #[arg(long, value_name = "HOST:PORT")]
    meta: String,
    /// The io servers' addresses, comma-separated, io server 0 first: HOST:PORT,HOST:PORT,…
    /// (a host may run several, on different ports). Every file's layout refers to this
    /// order, so it must never change once files exist.
    #[arg(long, value_name = "HOST:PORT,…", value_delimiter = ',', required = true)]
    io: Vec<String>,
    /// The transport every server and client uses: tcp, or ib on an RDMA fabric (softib
    /// connects the processes of one machine only).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "softib", "ib"])]
    transport: String,
    /// The cluster key file (hex; the cluster's shared secret). Created, mode 0600, with a
    /// new random key if it does not exist; an existing one is kept. Default: cluster.key
    /// beside the cluster file.
    #[arg(long, value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// Where each server host keeps its data: the meta database in DIR/meta, io server I's
    /// objects in DIR/ioI (the systemd units' state directory by default). A relative path is
    /// taken relative to the cluster file.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/stripefs")]
    data_dir: PathBuf,
    /// Default stripe size of new files (binary units allowed: 64k, 1M; default 64 KiB).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    stripe_size: Option<u64>,
    /// Default number of io servers a new file is striped over (default: all; all that are up
    /// while one is down).
    #[arg(long)]
    stripe_count: Option<u32>,
    /// Bytes per pipelined transfer on the io servers (binary units allowed; default 1 MiB).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    transfer_unit: Option<u64>,
    /// The cluster file to write.
    #[arg(short, long, value_name = "FILE", default_value = "cluster.toml")]
    output: PathBuf,
    /// Replace an existing cluster file (the key file is never replaced).
    #[arg(long)]
    force: bool,
}

/// The argument an error of the cluster file's rules is about.
fn argument_of(e: &ConfigError) -> &'static str {
    match e {
        ConfigError::Value { field: "transfer_unit", .. } => "--transfer-unit",
        ConfigError::Value { field: "layout.stripe_size", .. } => "--stripe-size",
        ConfigError::Value { field: "layout.stripe_count", .. } => "--stripe-count",
        ConfigError::Value { field: "io_servers (count)", .. } => "--io",
        _ => "the cluster file",
    }
}

/// A server's address as `init` takes it: the cluster file's rules, and a fixed port and a
/// host clients can connect to, since every host and client finds the server there.
fn server_address(arg: &str, id: ServerId, s: &str, transport: Scheme) -> Result<Address> {
    let a = parse_addr(format!("{arg} ({id})"), s.trim(), transport)?;
    if a.port() == 0 {
        bail!("{arg} ({id}): {s}: port 0 means any port; give the port the server is to listen on");
    }
    if let Host::Ip(ip) = a.host()
        && ip.is_unspecified()
    {
        bail!("{arg} ({id}): {s}: {ip} is not an address others can connect to; give the host's own");
    }
    Ok(a)
}

/// The host part of an address, as people write it.
fn host_of(a: &Address) -> String {
    match a.host() {
        Host::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        Host::Ip(ip) => ip.to_string(),
        Host::Name(n) => n.clone(),
    }
}

/// An absolute form of `p` (made from the working directory), without resolving links.
fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("{}: resolving the path", p.display()))
}

/// Writes the cluster file and, if needed, the key file, then says what goes where.
pub fn run(a: InitArgs) -> Result<()> {
    let transport: Scheme = a.transport.parse().map_err(|e| anyhow!("--transport: {e}"))?;
    let meta = server_address("--meta", ServerId::Meta, &a.meta, transport)?;
    let io_servers =
        a.io.iter()
            .enumerate()
            .map(|(i, s)| server_address("--io", ServerId::Io(i), s, transport))
            .collect::<Result<Vec<_>>>()?;

    let output = absolute(&a.output)?;
    let dir = output.parent().context("-o: the cluster file needs a directory")?.to_owned();
    let key_path = match &a.key_file {
        Some(k) => absolute(k)?,
        None => dir.join("cluster.key"),
    };
    // Beside the cluster file, the key is named relative to it, so both files can be copied
    // to any one directory on each host.
    let key_in_file = match key_path.strip_prefix(&dir) {
        Ok(rel) if rel.components().count() == 1 => rel.to_owned(),
        _ => key_path.clone(),
    };
    let cfg = ClusterConfig {
        transport,
        meta,
        io_servers,
        data_dir: Some(a.data_dir.clone()),
        key: KeySource::File(key_in_file),
        transfer_unit: a.transfer_unit.unwrap_or(stripefs::config::DEFAULT_TRANSFER_UNIT),
        layout: LayoutDefaults {
            ssize: a.stripe_size.unwrap_or(stripefs::config::DEFAULT_SSIZE),
            pcount: a.stripe_count,
        },
    };
    // The file's own rules (ranges, counts), so `init` never writes what `load` refuses.
    ClusterConfig::parse(&cfg.to_toml()).map_err(|e| anyhow!("{}: {e}", argument_of(&e)))?;
    if let Some((first, second, addr)) = cfg.shared_address() {
        let arg = if first == ServerId::Meta { "--meta and --io" } else { "--io" };
        bail!("{arg}: {first} and {second} both have address {addr}; every server needs one of its own");
    }
    if output.exists() && !a.force {
        bail!("-o: {} exists; pass --force to replace it", output.display());
    }
    if !dir.is_dir() {
        bail!("-o: {}: no such directory", dir.display());
    }

    let created = ensure_key_file(&key_path).map_err(|e| anyhow!("--key-file: {e}"))?;
    // An existing key must be one the servers will accept, before any host is told to use it.
    read_key_file(&key_path).map_err(|e| anyhow!("--key-file: {e}"))?;
    let header = "# A stripefs cluster, written by `stripefs init`. Every server host and every client needs\n\
                  # this file and the key file it names. The order of io_servers is the file system's:\n\
                  # never reorder it once files exist.\n";
    cfg.save_with_header(&output, a.force, header)
        .with_context(|| format!("-o: writing {}", output.display()))?;

    print!("{}", instructions(&cfg, &output, &key_path, created));
    Ok(())
}

/// A host and the servers it runs.
type HostServers<'a> = (String, Vec<(ServerId, &'a Address)>);

/// What to copy where and which command each host runs.
fn instructions(cfg: &ClusterConfig, output: &Path, key: &Path, created: bool) -> String {
    use std::fmt::Write;
    let (file, keyf) = (output.display(), key.display());
    let mut s = String::new();
    let data = cfg.data_dir.as_deref().unwrap_or(Path::new("stripefs-data")).display();
    let _ = writeln!(
        s,
        "wrote {file}: meta server and {} io server(s) over {}, data in {data} on each server host",
        cfg.io_servers.len(),
        cfg.transport
    );
    if cfg.transport == Scheme::SoftIb {
        // softib moves data with process_vm_writev and shared memory: peers on one machine.
        let _ = writeln!(
            s,
            "note: softib:// connects processes of one machine only; separate hosts need tcp:// or ib://"
        );
    }
    if created {
        let _ = writeln!(s, "created the cluster key {keyf} (mode 0600)");
    } else {
        let _ = writeln!(s, "kept the existing cluster key {keyf}");
    }
    // Hosts in the order their first server appears, with their servers.
    let mut hosts: Vec<HostServers> = Vec::new();
    let servers = std::iter::once((ServerId::Meta, &cfg.meta))
        .chain(cfg.io_servers.iter().enumerate().map(|(i, a)| (ServerId::Io(i), a)));
    for (id, a) in servers {
        let h = host_of(a);
        match hosts.iter_mut().find(|(name, _)| *name == h) {
            Some((_, list)) => list.push((id, a)),
            None => hosts.push((h, vec![(id, a)])),
        }
    }
    let _ = writeln!(
        s,
        "\n1. Copy both files, at these same paths, to every host below and to every client, over a\n   \
         secure channel (scp, rsync over ssh). The key is the cluster's shared secret: whoever\n   \
         reads it is a member. Keep it mode 0600, owned by the user the servers run as:\n     \
         {file}\n     {keyf}"
    );
    let _ = writeln!(s, "\n2. Let clients and the other hosts connect to each server's port:");
    for (h, list) in &hosts {
        let ports: Vec<String> = list.iter().map(|(id, a)| format!("{} ({id})", a.port())).collect();
        let _ = writeln!(s, "     {h}: {}", ports.join(", "));
    }
    let _ = writeln!(
        s,
        "\n3. Start each server on its host (or enable the systemd units in fs/deploy/,\n   \
         stripefs-meta and stripefs-io@I, which read /etc/stripefs/cluster.toml):"
    );
    for (h, list) in &hosts {
        for (id, _) in list {
            let role = match id {
                ServerId::Meta => "--meta".to_string(),
                ServerId::Io(i) => format!("--io {i}"),
            };
            let _ = writeln!(s, "     on {h}: stripefs serve {role} --cluster {file}");
        }
    }
    let _ = writeln!(s, "\n4. Check from any host with both files:\n     stripefs --cluster {file} status");
    s
}

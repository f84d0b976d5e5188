//! Client commands: ln, readlink, rm, mv, mkdir, getstripe, setstripe, servers, df (`cp`,
//! `ls` and `stat`, and `mount` have modules of their own).

use super::listing::LayoutJson;
use super::{Output, any_path, base_name, client, cluster_and_client, print_json, sfs_join};
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use stripefs::config::ClusterConfig;
use stripefs::proto::{DiskSpace, FileKind, Handle, LayoutSpec, ServerStats};
use stripefs::{Client, CreateOptions, Errno, FsError};

/// `stripefs ln -s`.
pub fn ln(cluster: Option<PathBuf>, symbolic: bool, target: &str, link: &str) -> Result<()> {
    let c = client(cluster)?;
    let link = any_path(link);
    if symbolic {
        c.symlink(target, link).with_context(|| link.to_string())?;
    } else {
        c.link(any_path(target), link).with_context(|| link.to_string())?;
    }
    Ok(())
}

/// `stripefs readlink`.
pub fn readlink(cluster: Option<PathBuf>, path: &str) -> Result<()> {
    let c = client(cluster)?;
    let p = any_path(path);
    println!("{}", c.readlink(p).with_context(|| p.to_string())?);
    Ok(())
}

/// `stripefs rm`: a symbolic link is removed itself, never followed (`rm -r` of a link to a
/// directory leaves the directory alone).
pub fn rm(cluster: Option<PathBuf>, recursive: bool, paths: &[String]) -> Result<()> {
    let c = client(cluster)?;
    for p in paths {
        let p = any_path(p);
        // Names only: removing a file never waits for its io servers.
        let (handle, attr) = c.lattr(p).with_context(|| p.to_string())?;
        if recursive && attr.kind == FileKind::Dir {
            if handle == Handle::ROOT {
                bail!("{p}: refusing to remove the root");
            }
            remove_below(&c, handle, p)?;
        }
        match attr.kind {
            FileKind::Dir => c.rmdir(p),
            _ => c.unlink(p),
        }
        .with_context(|| p.to_string())?;
    }
    Ok(())
}

/// Removes everything below directory `dir` (at `path`), depth first with an explicit stack,
/// so a deep tree cannot overflow ours.
fn remove_below(c: &Client, dir: Handle, path: &str) -> Result<()> {
    /// A directory to empty, and (once emptied) to remove from its parent.
    struct Todo {
        dir: Handle,
        path: String,
        /// Parent and name; `None` for the top, which the caller removes.
        entry: Option<(Handle, String)>,
        emptied: bool,
    }
    let mut stack =
        vec![Todo { dir, path: path.trim_end_matches('/').to_string(), entry: None, emptied: false }];
    while let Some(mut t) = stack.pop() {
        if t.emptied {
            if let Some((parent, name)) = &t.entry {
                c.rmdir_in(*parent, name).with_context(|| t.path.clone())?;
            }
            continue;
        }
        let entries = c.readdir_handle(t.dir).with_context(|| t.path.clone())?;
        let (dir, path) = (t.dir, t.path.clone());
        t.emptied = true;
        stack.push(t);
        for e in entries {
            let name = e.name.to_string();
            let child = format!("{path}/{name}");
            match e.kind {
                FileKind::Dir => {
                    stack.push(Todo { dir: e.handle, path: child, entry: Some((dir, name)), emptied: false })
                }
                _ => c.unlink_in(dir, &name).with_context(|| child)?,
            }
        }
    }
    Ok(())
}

/// `stripefs mv`: a rename on the meta server (no data moves); into an existing directory the
/// entry keeps its name, as `mv` does.
pub fn mv(cluster: Option<PathBuf>, src: &str, dst: &str) -> Result<()> {
    let c = client(cluster)?;
    let (src, mut dst) = (any_path(src), any_path(dst).to_string());
    if let Ok((_, attr)) = c.attr(&dst)
        && attr.kind == FileKind::Dir
    {
        dst = sfs_join(&dst, base_name(src));
    }
    c.rename(src, &dst).with_context(|| format!("{src} → {dst}"))?;
    Ok(())
}

/// `stripefs mkdir`.
pub fn mkdir(cluster: Option<PathBuf>, parents: bool, paths: &[String]) -> Result<()> {
    let c = client(cluster)?;
    for p in paths {
        let p = any_path(p);
        if parents {
            let mut cur = String::new();
            for comp in p.split('/').filter(|s| !s.is_empty()) {
                cur.push('/');
                cur.push_str(comp);
                match c.mkdir(&cur, 0o755) {
                    Ok(_) | Err(FsError::Remote { code: Errno::EEXIST, .. }) => {}
                    Err(e) => return Err(e).context(cur),
                }
            }
        } else {
            c.mkdir(p, 0o755).with_context(|| p.to_string())?;
        }
    }
    Ok(())
}

fn show_spec(s: &LayoutSpec, out: Output) -> String {
    let f = |v: Option<String>| v.unwrap_or_else(|| "default".into());
    format!(
        "base {} pcount {} ssize {}",
        f(s.base.map(|b| b.to_string())),
        f(s.pcount.map(|b| b.to_string())),
        f(s.ssize.map(|b| out.size(b)))
    )
}

/// A directory's default layout in JSON: `null` fields are inherited.
#[derive(Debug, Serialize)]
struct SpecJson {
    base: Option<u32>,
    pcount: Option<u32>,
    stripe_size: Option<u64>,
}

/// `getstripe --json`: a file has a `layout`, a directory may have a `default`.
#[derive(Debug, Serialize)]
struct GetstripeJson {
    path: String,
    layout: Option<LayoutJson>,
    default: Option<SpecJson>,
}

/// `stripefs getstripe`.
pub fn getstripe(cluster: Option<PathBuf>, path: &str, out: Output) -> Result<()> {
    let c = client(cluster)?;
    let (layout, default) = c.getstripe(any_path(path)).with_context(|| any_path(path).to_string())?;
    if out.json {
        return print_json(&GetstripeJson {
            path: any_path(path).to_string(),
            layout: layout.as_ref().map(|l| LayoutJson::of(l, c.io_servers())),
            default: default.map(|s| SpecJson { base: s.base, pcount: s.pcount, stripe_size: s.ssize }),
        });
    }
    if let Some(l) = layout {
        let servers: Vec<_> = l.servers(c.io_servers()).collect();
        println!("base {} pcount {} ssize {} servers {servers:?}", l.base, l.pcount, out.size(l.ssize));
    } else {
        match default {
            Some(s) => println!("default: {}", show_spec(&s, out)),
            None => println!("default: inherited (filesystem defaults)"),
        }
    }
    Ok(())
}

/// An io server in `servers --json` and `df --json`: who it is and whether it answered.
#[derive(Debug, Serialize)]
struct IoServerJson<T> {
    index: usize,
    address: String,
    /// `up`, or `down` (did not answer; `error` says why and the figures are absent).
    state: &'static str,
    error: Option<String>,
    #[serde(flatten)]
    figures: Option<T>,
}

impl<T> IoServerJson<T> {
    fn of(index: usize, cfg: &ClusterConfig, r: Result<T, FsError>) -> Self {
        let address = cfg.io_servers.get(index).map(|a| a.to_string()).unwrap_or_default();
        match r {
            Ok(figures) => IoServerJson { index, address, state: "up", error: None, figures: Some(figures) },
            Err(e) => {
                IoServerJson { index, address, state: "down", error: Some(e.to_string()), figures: None }
            }
        }
    }
}

/// `servers --json`.
#[derive(Debug, Serialize)]
struct ServersJson {
    io_servers: Vec<IoServerJson<ServerStats>>,
}

/// `stripefs servers`: one block per io server. An unreachable server is reported and makes
/// the command fail after the others are shown.
pub fn servers(cluster: Option<PathBuf>, json: bool) -> Result<()> {
    let (cfg, c) = cluster_and_client(cluster)?;
    let stats = c.server_stats();
    let failed = stats.iter().filter(|s| s.is_err()).count();
    if json {
        let io_servers = stats.into_iter().enumerate().map(|(i, s)| IoServerJson::of(i, &cfg, s)).collect();
        print_json(&ServersJson { io_servers })?;
    } else {
        for (i, st) in stats.into_iter().enumerate() {
            let s = match st {
                Ok(s) => s,
                Err(e) => {
                    println!("io server {i}: unreachable: {e}");
                    continue;
                }
            };
            let f = s.fallbacks;
            println!("io server {i}:");
            println!(
                "  requests: {} reads, {} writes, {} syncs, {} errors",
                s.reads, s.writes, s.syncs, s.errors
            );
            println!(
                "  bytes: {} read, {} written ({} written behind); open files: {}",
                s.bytes_read, s.bytes_written, s.written_behind, s.open_files
            );
            for (name, p) in [("mapped", s.mapped), ("copied", s.copied)] {
                println!("  {name}: {} reads, {} writes, {} bytes", p.reads, p.writes, p.bytes);
            }
            println!(
                "  copied instead of mapped: {} unordered, {} beyond the map, {} without fallocate",
                f.unordered, f.beyond_map, f.no_fallocate
            );
        }
    }
    if failed > 0 {
        bail!("{failed} io server(s) did not answer");
    }
    Ok(())
}

/// What `df` shows of a file system, in bytes: its size, used, available and use%.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct DfFigures {
    total: u64,
    used: u64,
    avail: u64,
    /// Used over what a writer could have (used + available), in percent, rounded up.
    use_percent: u64,
}

impl DfFigures {
    fn of(d: DiskSpace) -> Self {
        // A server's figures as the sum takes them (avail <= free <= total), whatever it sent.
        let d = DiskSpace::default().plus(d);
        let used = d.total - d.free;
        let pct = (used as f64 * 100.0 / used.saturating_add(d.avail).max(1) as f64).ceil();
        DfFigures { total: d.total, used, avail: d.avail, use_percent: pct as u64 }
    }
}

/// `df --json`. `total` and the counts are `null` unless every io server answered.
#[derive(Debug, Serialize)]
struct DfJson {
    io_servers: Vec<IoServerJson<DfFigures>>,
    total: Option<DfFigures>,
    files: Option<u64>,
    directories: Option<u64>,
}

/// `stripefs df`: each io server's file system (size, used, available) and the sum, as a
/// mount's `statfs` reports it, then the meta server's counts. An unreachable server is
/// reported and makes the command fail after the others are shown.
pub fn df(cluster: Option<PathBuf>, o: Output) -> Result<()> {
    let (cfg, c) = cluster_and_client(cluster)?;
    let stats = c.server_stats();
    let failed = stats.iter().filter(|s| s.is_err()).count();
    let total = DiskSpace::sum(stats.iter().flatten().map(|s| s.disk));
    let fs = if failed == 0 { Some(c.statfs()?) } else { None };
    if o.json {
        let io_servers = stats
            .into_iter()
            .enumerate()
            .map(|(i, s)| IoServerJson::of(i, &cfg, s.map(|s| DfFigures::of(s.disk))))
            .collect();
        print_json(&DfJson {
            io_servers,
            total: fs.map(|_| DfFigures::of(total)),
            files: fs.map(|f| f.files),
            directories: fs.map(|f| f.dirs),
        })?;
    } else {
        let shared = sharing(&stats);
        let mut out = std::io::stdout().lock();
        writeln!(out, "{:<10} {:>12} {:>12} {:>12} {:>5}", "io server", "size", "used", "avail", "use%")?;
        for (i, st) in stats.into_iter().enumerate() {
            match st {
                Ok(s) => writeln!(out, "{}", df_row(&i.to_string(), s.disk, o))?,
                Err(e) => writeln!(out, "{i:<10} unreachable: {e}")?,
            }
        }
        if let Some(fs) = fs {
            writeln!(out, "{}", df_row("total", total, o))?;
            for group in shared {
                writeln!(out, "io servers {group} share a file system: the total counts it once")?;
            }
            writeln!(out, "files: {}, directories: {}, io servers: {}", fs.files, fs.dirs, fs.io_servers)?;
        }
    }
    if failed > 0 {
        bail!("{failed} io server(s) did not answer");
    }
    Ok(())
}

/// The io servers (by index) that keep their data on one file system, for each file system
/// more than one does: `0, 1, 2`.
fn sharing(stats: &[stripefs::FsResult<ServerStats>]) -> Vec<String> {
    let mut by_fs: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, s) in stats.iter().enumerate() {
        let Ok(s) = s else { continue };
        if s.disk.fs_id == 0 {
            continue;
        }
        match by_fs.iter_mut().find(|(id, _)| *id == s.disk.fs_id) {
            Some((_, servers)) => servers.push(i),
            None => by_fs.push((s.disk.fs_id, vec![i])),
        }
    }
    by_fs
        .into_iter()
        .filter(|(_, servers)| servers.len() > 1)
        .map(|(_, servers)| servers.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        .collect()
}

/// One line of `df`: size, used, available and use% of `d`.
fn df_row(name: &str, d: DiskSpace, o: Output) -> String {
    let f = DfFigures::of(d);
    format!(
        "{name:<10} {:>12} {:>12} {:>12} {:>4}%",
        o.size(f.total),
        o.size(f.used),
        o.size(f.avail),
        f.use_percent
    )
}

/// `setstripe` options.
#[derive(Args, Debug)]
pub struct SetstripeArgs {
    /// A directory, or a file to create.
    path: String,
    /// Stripe size (bytes, or with a binary unit: 64k, 1M; at least 4k).
    #[arg(short = 'S', long, value_parser = stripefs::units::parse_size)]
    stripe_size: Option<u64>,
    /// Number of io servers.
    #[arg(short = 'c', long)]
    stripe_count: Option<u32>,
    /// First io server.
    #[arg(short = 'i', long)]
    base: Option<u32>,
    /// Remove a directory's default.
    #[arg(long)]
    clear: bool,
}

/// `stripefs setstripe`.
pub fn setstripe(cluster: Option<PathBuf>, a: SetstripeArgs) -> Result<()> {
    let c = client(cluster)?;
    let path = any_path(&a.path);
    let spec = LayoutSpec { base: a.base, pcount: a.stripe_count, ssize: a.stripe_size };
    match c.attr(path) {
        Ok((handle, attr)) if attr.kind == FileKind::Dir => {
            c.setstripe_handle(handle, if a.clear { None } else { Some(spec) })
                .with_context(|| path.to_string())?;
        }
        Ok(_) => bail!("{path} exists: a file's layout is fixed at creation"),
        Err(FsError::Remote { code: Errno::ENOENT, .. }) => {
            c.create(path, CreateOptions { mode: 0o644, layout: Some(spec) })
                .with_context(|| path.to_string())?;
        }
        Err(e) => return Err(e).with_context(|| path.to_string()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_df_row_is_consistent_whatever_a_server_sent() {
        let gib = 1 << 30;
        let o = Output::default();
        let row = df_row("0", DiskSpace { total: 4 * gib, free: 3 * gib, avail: 2 * gib, fs_id: 1 }, o);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["0", "4.0", "GiB", "1.0", "GiB", "2.0", "GiB", "34%"]
        );
        let exact = Output { bytes: true, ..o };
        let row = df_row("0", DiskSpace { total: 4 * gib, free: 3 * gib, avail: 2 * gib, fs_id: 1 }, exact);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["0", "4294967296", "1073741824", "2147483648", "34%"]
        );
        // Nonsense (free and avail over the size, sums that would overflow) prints, clamped.
        let row = df_row("1", DiskSpace { total: u64::MAX, free: 0, avail: u64::MAX, fs_id: 2 }, o);
        assert!(row.ends_with(" 100%"), "{row}");
        let row = df_row("2", DiskSpace { total: 10, free: 20, avail: 30, fs_id: 3 }, o);
        assert!(row.ends_with("   0%"), "{row}");
        assert!(df_row("3", DiskSpace::default(), o).ends_with("   0%"));
    }

    /// `servers --json` carries the io server's counters under their wire names: a renamed
    /// counter would change what scripts read, so the names are pinned here (and documented
    /// in the README).
    #[test]
    fn servers_json_fields_are_the_documented_ones() {
        let up = IoServerJson {
            index: 0,
            address: "tcp://h:1".into(),
            state: "up",
            error: None,
            figures: Some(ServerStats::default()),
        };
        let v = serde_json::to_value(up).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "address",
                "bytes_read",
                "bytes_written",
                "copied",
                "disk",
                "error",
                "errors",
                "fallbacks",
                "index",
                "mapped",
                "open_files",
                "reads",
                "state",
                "syncs",
                "writes",
                "written_behind"
            ]
        );
        let inner = |k: &str| -> Vec<String> { v[k].as_object().unwrap().keys().cloned().collect() };
        assert_eq!(inner("mapped"), ["bytes", "reads", "writes"]);
        assert_eq!(inner("fallbacks"), ["beyond_map", "no_fallocate", "unordered"]);
        assert_eq!(inner("disk"), ["avail", "free", "fs_id", "total"]);
        let down: IoServerJson<ServerStats> = IoServerJson {
            index: 1,
            address: "a".into(),
            state: "down",
            error: Some("e".into()),
            figures: None,
        };
        let v = serde_json::to_value(down).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 4, "a down server: who, and why: {v}");
    }
}

//! `stripefs ls` and `stripefs stat`: their JSON shapes and how they write modes and times.

use super::{Output, any_path, base_name, client, print_json, sfs_join};
use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use stripefs::Stat;
use stripefs::layout::Layout;
use stripefs::proto::{FileKind, Handle, Timestamp};

/// `ls` options.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// The directory (default /).
    #[arg(default_value = "/")]
    path: String,
    /// Long listing: kind, mode, size, layout.
    #[arg(short, long)]
    long: bool,
    #[command(flatten)]
    out: Output,
}

/// A file's layout in JSON.
#[derive(Debug, Serialize)]
pub(super) struct LayoutJson {
    base: u32,
    pcount: u32,
    stripe_size: u64,
    /// The io servers holding its stripes, in stripe order.
    servers: Vec<u32>,
}

impl LayoutJson {
    pub(super) fn of(l: &Layout, io_servers: u32) -> Self {
        LayoutJson {
            base: l.base,
            pcount: l.pcount,
            stripe_size: l.ssize,
            servers: l.servers(io_servers).collect(),
        }
    }
}

/// What `stat` and `ls -l` know of an entry, in JSON.
#[derive(Debug, Serialize)]
struct NodeJson {
    handle: u64,
    /// `file`, `dir` or `symlink`.
    kind: &'static str,
    /// Permission bits (with setuid, setgid, sticky), as an integer: 0o644 is 420.
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    /// Logical size in bytes; `null` if it could not be learnt (`size_error` says why).
    size: Option<u64>,
    size_error: Option<String>,
    /// Bytes of disk a file's objects hold on the io servers (less than its size where it has
    /// holes); `null` for anything else, or where the size is unknown.
    allocated: Option<u64>,
    atime: Option<String>,
    mtime: Option<String>,
    ctime: Option<String>,
    /// A symbolic link's target.
    target: Option<String>,
    /// A file's layout.
    layout: Option<LayoutJson>,
}

pub(super) fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev(_) => "char",
        FileKind::BlockDev(_) => "block",
    }
}

impl NodeJson {
    fn of(s: &Stat, size: Result<u64, String>, target: Option<String>, io_servers: u32) -> Self {
        let a = &s.attr;
        NodeJson {
            handle: s.handle.0,
            kind: kind_name(a.kind),
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            allocated: (size.is_ok() && a.kind == FileKind::File).then_some(s.allocated),
            size: size.as_ref().ok().copied(),
            size_error: size.err(),
            atime: rfc3339(a.atime),
            mtime: rfc3339(a.mtime),
            ctime: rfc3339(a.ctime),
            target,
            layout: s.layout.as_ref().map(|l| LayoutJson::of(l, io_servers)),
        }
    }
}

/// One entry of `ls --json`.
#[derive(Debug, Serialize)]
struct LsEntryJson {
    name: String,
    #[serde(flatten)]
    node: NodeJson,
}

/// `ls --json`.
#[derive(Debug, Serialize)]
struct LsJson {
    path: String,
    entries: Vec<LsEntryJson>,
}

/// `stripefs ls`. Names come from the meta server alone. With `-l`, a file whose size cannot
/// be known (an io server of its layout is down) is listed with `?` for its size and the reason
/// on standard error, and the exit status is 1 once everything is listed, as `ls` does for an
/// entry it cannot read. `--json` lists what `-l` does, as one document.
pub fn ls(cluster: Option<PathBuf>, a: LsArgs) -> Result<()> {
    let c = client(cluster)?;
    let path = any_path(&a.path);
    let (handle, attr) = c.attr(path).with_context(|| path.to_string())?;
    let entries = if attr.kind == FileKind::Dir {
        c.readdir_handle(handle)
            .with_context(|| path.to_string())?
            .into_iter()
            .map(|e| (e.name.to_string(), e.handle))
            .collect()
    } else {
        // A link to a file is listed as the link, as `ls -l` does.
        vec![(base_name(path).to_string(), c.resolve_nofollow(path).with_context(|| path.to_string())?)]
    };
    let long = a.long || a.out.json;
    // Asked for all at once: a batch of entries is a request to the meta server and one to
    // each io server, where one entry at a time made each a round of its own.
    let handles: Vec<Handle> = entries.iter().map(|e| e.1).collect();
    let mut stats = if long { c.stat_many(&handles) } else { Vec::new() }.into_iter();
    let mut out = std::io::stdout().lock();
    let mut unknown = 0;
    let mut json = Vec::new();
    for (name, h) in entries {
        if let Some(stat) = stats.next() {
            let (s, size) = match stat.with_context(|| sfs_join(path, &name))? {
                Ok(s) => {
                    let size = s.attr.size;
                    (s, Ok(size))
                }
                Err(u) => {
                    if !a.out.json {
                        out.flush()?;
                        eprintln!("stripefs: {}: size unknown: {}", sfs_join(path, &name), u.error);
                    }
                    unknown += 1;
                    (u.stat, Err(u.error.to_string()))
                }
            };
            let target = match s.attr.kind {
                FileKind::Symlink => Some(c.readlink_handle(h).with_context(|| sfs_join(path, &name))?),
                _ => None,
            };
            if a.out.json {
                json.push(LsEntryJson { name, node: NodeJson::of(&s, size, target, c.io_servers()) });
                continue;
            }
            let layout = s
                .layout
                .map(|l| format!("  [{}x{}@{}]", l.pcount, a.out.size(l.ssize).replace(' ', ""), l.base))
                .unwrap_or_default();
            let target = target.map(|t| format!(" -> {t}")).unwrap_or_default();
            let size = size.map(|n| a.out.size(n)).unwrap_or_else(|_| "?".into());
            writeln!(
                out,
                "{} {:>5} {:>5} {:>14} {name}{target}{layout}",
                mode_string(s.attr.kind, s.attr.mode),
                s.attr.uid,
                s.attr.gid,
                size
            )?;
        } else {
            writeln!(out, "{name}")?;
        }
    }
    if a.out.json {
        drop(out);
        print_json(&LsJson { path: path.to_string(), entries: json })?;
    }
    if unknown > 0 {
        bail!("{path}: {unknown} size(s) unknown");
    }
    Ok(())
}

/// `ls -l`'s mode column: `drwxr-xr-x`, `-rw-r--r--`, `lrwxrwxrwx` (with setuid, setgid and
/// sticky bits).
fn mode_string(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDev(_) => 'c',
        FileKind::BlockDev(_) => 'b',
    });
    // (read, write, execute, special bit, its letter) for user, group and other.
    for (shift, special, letter) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// The first second RFC 3339 cannot write (year 10000); `humantime` fails from there on, and
/// panics before 1970.
const RFC3339_END: i64 = 253_402_300_800;

/// A timestamp as an RFC 3339 UTC date with nanoseconds; `None` where it cannot be written
/// that way here (before 1970, from year 10000, nanoseconds out of range: the server sends the
/// value, so it may be anything).
fn rfc3339(t: Timestamp) -> Option<String> {
    match u64::try_from(t.secs) {
        Ok(secs) if t.secs < RFC3339_END && t.nsecs < 1_000_000_000 => {
            let at = std::time::UNIX_EPOCH + std::time::Duration::new(secs, t.nsecs);
            Some(humantime::format_rfc3339_nanos(at).to_string())
        }
        _ => None,
    }
}

/// A timestamp as an RFC 3339 UTC date with nanoseconds, the epoch seconds beside it; only the
/// seconds where no date can be written.
fn time(t: Timestamp) -> String {
    let raw = format!("{}.{:09}", t.secs, t.nsecs);
    match rfc3339(t) {
        Some(date) => format!("{date}  ({raw})"),
        None => raw,
    }
}

/// `stat --json`.
#[derive(Debug, Serialize)]
struct StatJson {
    path: String,
    #[serde(flatten)]
    node: NodeJson,
}

/// `stripefs stat`: of a symbolic link itself unless `dereference`, as coreutils' `stat`.
pub fn stat(cluster: Option<PathBuf>, path: &str, dereference: bool, out: Output) -> Result<()> {
    let c = client(cluster)?;
    let p = any_path(path);
    let s = if dereference { c.stat(p) } else { c.lstat(p) }.with_context(|| p.to_string())?;
    let target = match s.attr.kind {
        FileKind::Symlink => Some(c.readlink_handle(s.handle).with_context(|| p.to_string())?),
        _ => None,
    };
    if out.json {
        let node = NodeJson::of(&s, Ok(s.attr.size), target, c.io_servers());
        return print_json(&StatJson { path: p.to_string(), node });
    }
    println!("  path: {path}");
    println!("handle: {}", s.handle);
    println!("  kind: {:?}", s.attr.kind);
    if let Some(t) = target {
        println!("target: {t}");
    }
    println!("  mode: {:04o}  uid {}  gid {}  nlink {}", s.attr.mode, s.attr.uid, s.attr.gid, s.attr.nlink);
    match s.attr.kind {
        FileKind::File => {
            println!("  size: {}  (allocated {})", out.size(s.attr.size), out.size(s.allocated))
        }
        _ => println!("  size: {}", out.size(s.attr.size)),
    }
    println!(
        " atime: {}\n mtime: {}\n ctime: {}",
        time(s.attr.atime),
        time(s.attr.mtime),
        time(s.attr.ctime)
    );
    if let Some(l) = s.layout {
        let servers: Vec<_> = l.servers(c.io_servers()).collect();
        println!(
            "layout: base {} pcount {} ssize {} servers {servers:?}",
            l.base,
            l.pcount,
            out.size(l.ssize)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_dates() {
        let t = Timestamp { secs: 1_795_826_762, nsecs: 5 };
        assert_eq!(time(t), "2026-11-28T00:46:02.000000005Z  (1795826762.000000005)");
        for (secs, nsecs) in [(i64::MAX, 0), (RFC3339_END, 0), (-1, 0), (0, 1_000_000_000)] {
            let t = Timestamp { secs, nsecs };
            assert_eq!(time(t), format!("{secs}.{nsecs:09}"), "no date can say it: seconds only");
        }
        let last = Timestamp { secs: RFC3339_END - 1, nsecs: 0 };
        assert!(time(last).starts_with("9999-12-31T23:59:59"), "{}", time(last));
    }

    #[test]
    fn times_are_rfc3339_or_null() {
        let t = Timestamp { secs: 1_795_826_762, nsecs: 5 };
        assert_eq!(rfc3339(t).as_deref(), Some("2026-11-28T00:46:02.000000005Z"));
        assert_eq!(rfc3339(Timestamp { secs: -1, nsecs: 0 }), None);
    }

    #[test]
    fn modes_read_as_ls_writes_them() {
        assert_eq!(mode_string(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(FileKind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(FileKind::File, 0o2640), "-rw-r-S---");
        assert_eq!(mode_string(FileKind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(FileKind::File, 0), "----------");
    }
}

//! Client commands: cp, ls, stat, ln, readlink, rm, mv, mkdir, getstripe, setstripe, servers, df,
//! mount.

use super::dest::LocalDir;
use super::{Output, any_path, load_cluster, print_json, sfs_path};
use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use stripefs::capability::Rights;
use stripefs::config::ClusterConfig;
use stripefs::layout::Layout;
use stripefs::proto::{DiskSpace, FileKind, Handle, LayoutSpec, ServerStats, Timestamp};
use stripefs::{Client, CreateOptions, Errno, FsError, Stat};

/// Bytes moved per call by `cp`: 16 MiB, i.e. 4 MiB per server of a 4-server file.
const CP_CHUNK: usize = 16 << 20;

fn client(cluster: Option<PathBuf>) -> Result<Client> {
    Ok(Client::connect(&load_cluster(cluster)?)?)
}

/// The cluster file and a client of it (for commands that name servers by address).
fn cluster_and_client(cluster: Option<PathBuf>) -> Result<(ClusterConfig, Client)> {
    let cfg = load_cluster(cluster)?;
    let c = Client::connect(&cfg)?;
    Ok((cfg, c))
}

/// `cp` options.
#[derive(Args, Debug)]
pub struct CpArgs {
    /// Source: a local path or sfs:/path.
    src: String,
    /// Destination: a local path or sfs:/path (a directory keeps the source's name). At least
    /// one side is a stripefs path.
    dst: String,
    /// Stripe size of a new stripefs file (bytes, or with a binary unit: 64k, 1M).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    stripe_size: Option<u64>,
    /// Stripe count of a new stripefs file.
    #[arg(long)]
    stripe_count: Option<u32>,
    /// Copy a directory and everything below it (links inside it as links).
    #[arg(short, long)]
    recursive: bool,
}

fn bar(len: u64) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
    {
        pb.set_style(style);
    }
    pb
}

fn base_name(p: &str) -> &str {
    p.trim_end_matches('/').rsplit('/').next().unwrap_or(p)
}

/// `name` inside stripefs directory `dir`.
fn sfs_join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// A path on either side of a copy: local, or in stripefs (`sfs:/…`).
#[derive(Debug, Clone)]
enum Loc {
    Local(PathBuf),
    Sfs(String),
}

/// What a copy finds at a path (a symbolic link itself, not what it points at).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(u64),
    Dir,
    Link(String),
}

impl Loc {
    fn parse(arg: &str) -> Loc {
        match sfs_path(arg) {
            Some(p) => Loc::Sfs(p.to_string()),
            None => Loc::Local(PathBuf::from(arg)),
        }
    }

    fn join(&self, name: &str) -> Loc {
        match self {
            Loc::Local(p) => Loc::Local(p.join(name)),
            Loc::Sfs(p) => Loc::Sfs(sfs_join(p, name)),
        }
    }

    fn name(&self) -> String {
        match self {
            Loc::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            Loc::Sfs(p) => base_name(p).to_string(),
        }
    }

    fn show(&self) -> String {
        match self {
            Loc::Local(p) => p.display().to_string(),
            Loc::Sfs(p) => p.clone(),
        }
    }

    /// What is at this path, following a link in the last component when `follow`; `None`
    /// when nothing is.
    fn node(&self, c: &Client, follow: bool) -> Result<Option<Node>> {
        match self {
            Loc::Local(p) => {
                let m = if follow { std::fs::metadata(p) } else { std::fs::symlink_metadata(p) };
                let m = match m {
                    Ok(m) => m,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e).context(self.show()),
                };
                Ok(Some(if m.is_dir() {
                    Node::Dir
                } else if m.file_type().is_symlink() {
                    let t = std::fs::read_link(p).with_context(|| self.show())?;
                    let t =
                        t.to_str().with_context(|| format!("{}: link target is not UTF-8", self.show()))?;
                    Node::Link(t.to_string())
                } else {
                    Node::File(m.len())
                }))
            }
            Loc::Sfs(p) => {
                let st = match if follow { c.stat(p) } else { c.lstat(p) } {
                    Ok(st) => st,
                    Err(e) if e.errno() == Errno::ENOENT => return Ok(None),
                    Err(e) => return Err(e).context(p.clone()),
                };
                Ok(Some(match st.attr.kind {
                    FileKind::Dir => Node::Dir,
                    FileKind::File => Node::File(st.attr.size),
                    FileKind::Symlink => Node::Link(c.readlink_handle(st.handle).with_context(|| p.clone())?),
                    k => bail!("{p}: a {} has no data to copy", kind_name(k)),
                }))
            }
        }
    }

    /// The names in a directory, sorted.
    fn list(&self, c: &Client) -> Result<Vec<String>> {
        let mut names: Vec<String> = match self {
            Loc::Local(p) => std::fs::read_dir(p)
                .and_then(|rd| rd.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())).collect())
                .with_context(|| self.show())?,
            Loc::Sfs(p) => {
                c.readdir(p).with_context(|| p.clone())?.into_iter().map(|e| e.name.into_string()).collect()
            }
        };
        names.sort();
        Ok(names)
    }

    /// Makes this directory; one already there is fine, as `cp -r` into an existing tree.
    fn mkdir(&self, c: &Client) -> Result<()> {
        if let Some(Node::Dir) = self.node(c, true)? {
            return Ok(());
        }
        match self {
            Loc::Local(p) => std::fs::create_dir(p).with_context(|| self.show()),
            Loc::Sfs(p) => c.mkdir(p, 0o755).map(|_| ()).with_context(|| p.clone()),
        }
    }

    fn symlink(&self, c: &Client, target: &str) -> Result<()> {
        match self {
            Loc::Local(p) => std::os::unix::fs::symlink(target, p).with_context(|| self.show()),
            Loc::Sfs(p) => c.symlink(target, p).map(|_| ()).with_context(|| p.clone()),
        }
    }
}

/// Where `cp` reads from.
enum Source {
    Local(std::fs::File),
    Sfs(Box<stripefs::File>),
}

impl Source {
    /// Opens the file at `loc` (following links).
    fn open(c: &Client, loc: &Loc) -> Result<Source> {
        Ok(match loc {
            Loc::Sfs(p) => Source::Sfs(Box::new(c.open(p, Rights::READ).with_context(|| p.clone())?)),
            Loc::Local(p) => Source::Local(std::fs::File::open(p).with_context(|| loc.show())?),
        })
    }

    /// Reads the next chunk at `off` (at most [`CP_CHUNK`] bytes) into `buf`; 0 at the end.
    fn read(&mut self, off: u64, size: u64, mut buf: BytesMut) -> Result<(BytesMut, usize)> {
        buf.resize(CP_CHUNK, 0);
        match self {
            Source::Local(f) => {
                let n = read_full(f, &mut buf)?;
                Ok((buf, n))
            }
            Source::Sfs(f) => {
                if off >= size {
                    return Ok((buf, 0));
                }
                buf.truncate((size - off).min(CP_CHUNK as u64) as usize);
                Ok(f.read_at(off, buf)?)
            }
        }
    }
}

/// Where `cp` writes to.
enum Sink {
    Local(std::fs::File),
    Sfs(Box<stripefs::File>),
}

impl Sink {
    /// Creates (or truncates) the file at `dst`; a local one never through a symbolic link.
    /// Refuses to copy a stripefs file onto itself, which would truncate it first.
    fn create(c: &Client, dst: &Loc, src: &Loc, spec: LayoutSpec) -> Result<Sink> {
        let dst = match dst {
            Loc::Local(p) => return Ok(Sink::Local(create_local(p)?)),
            Loc::Sfs(p) => p,
        };
        if let (Ok(d), Loc::Sfs(sp)) = (c.stat(dst), src)
            && c.stat(sp).is_ok_and(|s| s.handle == d.handle)
        {
            bail!("{sp} and {dst} are the same file");
        }
        let f = match c.create(dst, CreateOptions { mode: 0o644, layout: Some(spec) }) {
            Ok(f) => f,
            Err(FsError::Remote { code: Errno::EEXIST, .. }) => {
                let f = c.open(dst, Rights::READ_WRITE).with_context(|| dst.clone())?;
                f.truncate(0).with_context(|| dst.clone())?;
                f
            }
            Err(e) => return Err(e).context(dst.clone()),
        };
        Ok(Sink::Sfs(Box::new(f)))
    }

    /// Writes `buf[..n]` at `off` and gives the buffer back for the next chunk.
    fn write(&mut self, off: u64, mut buf: BytesMut, n: usize) -> Result<BytesMut> {
        match self {
            Sink::Local(f) => {
                f.write_all(&buf[..n])?;
                Ok(buf)
            }
            Sink::Sfs(f) => {
                let rest = buf.split_off(n);
                let data = buf.freeze();
                f.write_at(off, &data)?;
                // The servers hold no reference once the write completed: reuse the memory.
                let mut back = data.try_into_mut().unwrap_or_else(|_| BytesMut::zeroed(n));
                back.unsplit(rest);
                Ok(back)
            }
        }
    }

    fn sync(&mut self) -> Result<()> {
        match self {
            Sink::Local(f) => f.sync_all()?,
            Sink::Sfs(f) => f.sync()?,
        }
        Ok(())
    }
}

/// A local file for `cp` to write: in the directory as named, the file itself never through
/// a symbolic link.
fn create_local(p: &Path) -> Result<std::fs::File> {
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a file name", p.display()))?;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok(LocalDir::open(dir)?.create_file(name)?)
}

/// One file's bytes from `src` to the sink `create` makes (once `src` opened), through `buf`,
/// advancing `pb`.
fn copy_file(
    c: &Client,
    src: &Loc,
    size: u64,
    dst: &Loc,
    create: impl FnOnce() -> Result<Sink>,
    mut buf: BytesMut,
    pb: &ProgressBar,
) -> Result<BytesMut> {
    let mut from = Source::open(c, src)?;
    let mut sink = create()?;
    let mut off = 0u64;
    loop {
        let (b, n) = from.read(off, size, buf).with_context(|| format!("reading {}", src.show()))?;
        if n == 0 {
            buf = b;
            break;
        }
        buf = sink.write(off, b, n).with_context(|| format!("writing {}", dst.show()))?;
        off += n as u64;
        pb.inc(n as u64);
    }
    sink.sync().with_context(|| format!("syncing {}", dst.show()))?;
    Ok(buf)
}

/// A source tree, parents before their entries: paths relative to its top, and what each is.
fn walk_tree(c: &Client, top: &Loc) -> Result<Vec<(Vec<String>, Node)>> {
    let mut out = Vec::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(rel) = todo.pop() {
        let dir = rel.iter().fold(top.clone(), |l, n| l.join(n));
        for name in dir.list(c)? {
            let at = dir.join(&name);
            let node = at.node(c, false)?.with_context(|| format!("{}: removed while copying", at.show()))?;
            let mut path = rel.clone();
            path.push(name);
            if node == Node::Dir {
                todo.push(path.clone());
            }
            out.push((path, node));
        }
    }
    // Sorted by path, every directory comes before what is in it.
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// `stripefs cp`: local → stripefs, stripefs → local, or stripefs → stripefs, through one
/// reused buffer of [`CP_CHUNK`] bytes. With `-r`, a directory and everything below it: links
/// inside the tree are copied as links (links named on the command line are followed).
pub fn cp(cluster: Option<PathBuf>, a: CpArgs) -> Result<()> {
    if sfs_path(&a.src).is_none() && sfs_path(&a.dst).is_none() {
        bail!("one side of cp must be a stripefs path (sfs:/…)");
    }
    let c = client(cluster)?;
    let (src, mut dst) = (Loc::parse(&a.src), Loc::parse(&a.dst));
    let spec = LayoutSpec { base: None, pcount: a.stripe_count, ssize: a.stripe_size };
    let Some(top) = src.node(&c, true)? else {
        let missing = match src {
            Loc::Sfs(_) => Errno::ENOENT.to_string(),
            Loc::Local(_) => std::io::Error::from_raw_os_error(libc::ENOENT).to_string(),
        };
        bail!("{}: {missing}", src.show());
    };
    // Into an existing directory: keep the source's name.
    if let Some(Node::Dir) = dst.node(&c, true)? {
        dst = dst.join(&src.name());
    }
    let buf = stripefs::buf::aligned_zeroed(CP_CHUNK);
    match top {
        Node::File(size) => {
            let pb = bar(size);
            copy_file(&c, &src, size, &dst, || Sink::create(&c, &dst, &src, spec), buf, &pb)?;
            pb.finish_and_clear();
        }
        Node::Dir if !a.recursive => bail!("{}: is a directory (cp -r copies a tree)", src.show()),
        Node::Dir => {
            let tree = walk_tree(&c, &src)?;
            let total = tree.iter().map(|(_, n)| if let Node::File(s) = n { *s } else { 0 }).sum();
            let pb = bar(total);
            dst.mkdir(&c)?;
            let mut buf = buf;
            for (rel, node) in tree {
                let (from, to) =
                    rel.iter().fold((src.clone(), dst.clone()), |(f, t), n| (f.join(n), t.join(n)));
                let Loc::Local(top) = &dst else {
                    match node {
                        Node::Dir => to.mkdir(&c)?,
                        Node::Link(target) => to.symlink(&c, &target)?,
                        Node::File(size) => {
                            let create = || Sink::create(&c, &to, &from, spec);
                            buf = copy_file(&c, &from, size, &to, create, buf, &pb)?;
                        }
                    }
                    continue;
                };
                // Locally, each entry is made in its directory opened component by component
                // from the top, following no link: not one the copy made (a link's target is
                // the source's to choose), not one that was there.
                let (name, parents) = rel.split_last().context("an entry without a name")?;
                let dir = LocalDir::open(top)?.below(parents)?;
                match node {
                    Node::Dir => dir.mkdir(name)?,
                    Node::Link(target) => dir.symlink(&target, name)?,
                    Node::File(size) => {
                        let create = || Ok(Sink::Local(dir.create_file(name)?));
                        buf = copy_file(&c, &from, size, &to, create, buf, &pb)?;
                    }
                }
            }
            pb.finish_and_clear();
        }
        Node::Link(_) => bail!("{}: a link that was not followed", src.show()),
    }
    Ok(())
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

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
struct LayoutJson {
    base: u32,
    pcount: u32,
    stripe_size: u64,
    /// The io servers holding its stripes, in stripe order.
    servers: Vec<u32>,
}

impl LayoutJson {
    fn of(l: &Layout, io_servers: u32) -> Self {
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
    atime: Option<String>,
    mtime: Option<String>,
    ctime: Option<String>,
    /// A symbolic link's target.
    target: Option<String>,
    /// A file's layout.
    layout: Option<LayoutJson>,
}

fn kind_name(k: FileKind) -> &'static str {
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
    let mut out = std::io::stdout().lock();
    let mut unknown = 0;
    let mut json = Vec::new();
    for (name, h) in entries {
        if a.long || a.out.json {
            let (s, size) = match c.stat_entry(h).with_context(|| sfs_join(path, &name))? {
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
    println!("  size: {}", out.size(s.attr.size));
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
    let total = stats.iter().flatten().fold(DiskSpace::default(), |t, s| t.plus(s.disk));
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
            writeln!(out, "files: {}, directories: {}, io servers: {}", fs.files, fs.dirs, fs.io_servers)?;
        }
    }
    if failed > 0 {
        bail!("{failed} io server(s) did not answer");
    }
    Ok(())
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
    /// Stripe size (bytes, or with a binary unit: 64k, 1M).
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

/// `mount` options.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// Where to mount.
    mountpoint: PathBuf,
    /// FUSE worker threads (requests served at once).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Mount options, comma-separated: `allow_other` lets every user reach the mount (each
    /// with their own permissions), not only the one who mounted it; `ro` mounts read-only
    /// (changes fail with EROFS); `rw` and `default_permissions` are the defaults.
    #[arg(short = 'o', value_delimiter = ',')]
    options: Vec<String>,
    /// Kernel-cached mode: serve files through the kernel's page cache with write-back instead
    /// of direct I/O to the io servers (the default, PVFS semantics). Data written reaches the
    /// io servers at close, fsync or msync at the latest; an open sees what other clients
    /// closed before it (close-to-open, as NFS), but not writes they still cache. For
    /// single-writer files, build trees and files read again; not for files written by
    /// several clients at once.
    #[arg(long)]
    cache: bool,
    /// Return once the mount is live, leaving it served by a process in the background
    /// (default: serve in the foreground until unmounted or Ctrl-C). Unmount with `umount` or
    /// `fusermount3 -u`.
    #[arg(short, long)]
    background: bool,
    /// Internal: the process `--background` starts; says `MOUNTED` on stdout once live.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

/// What mount options `opts` ask for; anything unknown is refused by name.
#[derive(Debug, Default, PartialEq, Eq)]
struct MountOpts {
    allow_other: bool,
    read_only: bool,
}

fn mount_opts(opts: &[String]) -> Result<MountOpts> {
    let mut m = MountOpts::default();
    for o in opts {
        match o.as_str() {
            "allow_other" => m.allow_other = true,
            "ro" => m.read_only = true,
            "rw" => m.read_only = false,
            // Always on: accepted so that fstab-style option lists work.
            "default_permissions" => {}
            other => {
                bail!("unknown mount option {other:?} (known: allow_other, ro, rw, default_permissions)")
            }
        }
    }
    Ok(m)
}

/// `stripefs mount`: serves the mount until it is unmounted (or Ctrl-C), or with
/// `--background` returns once it is live.
#[cfg(feature = "fuse")]
pub fn mount(cluster: Option<PathBuf>, a: MountArgs) -> Result<()> {
    let m = mount_opts(&a.options)?;
    if a.background {
        return mount_in_background(cluster, &a);
    }
    let mut opts = stripefs::fuse::MountOptions::default();
    opts.threads = a.threads;
    opts.allow_other = m.allow_other;
    opts.read_only = m.read_only;
    opts.kernel_cache = a.cache;
    if a.daemon_child {
        // Out of the caller's session: its terminal closing or its Ctrl-C leave the mount be.
        let _ = nix::unistd::setsid();
    }
    let c = client(cluster)?;
    let daemon_child = a.daemon_child;
    let mountpoint = a.mountpoint.display().to_string();
    stripefs::fuse::mount_notify(c, &a.mountpoint, opts, move || {
        tracing::info!(mountpoint, "mounted");
        if daemon_child {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "MOUNTED");
            let _ = out.flush();
        }
    })
    .with_context(|| format!("mounting on {}", a.mountpoint.display()))?;
    Ok(())
}

/// `mount --background`: starts this binary again as the mount's server (in a session of its
/// own) and returns once it says the mount is live, so the next command of a script finds it;
/// if it fails first, its error is this command's.
#[cfg(feature = "fuse")]
fn mount_in_background(cluster: Option<PathBuf>, a: &MountArgs) -> Result<()> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().context("finding the stripefs binary")?;
    let cluster = super::cluster_path(cluster);
    let cluster = std::fs::canonicalize(&cluster).unwrap_or(cluster);
    let mountpoint = std::fs::canonicalize(&a.mountpoint)
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("--cluster").arg(&cluster).arg("mount").arg(&mountpoint).arg("--daemon-child");
    cmd.arg("--threads").arg(a.threads.to_string());
    if a.cache {
        cmd.arg("--cache");
    }
    if !a.options.is_empty() {
        cmd.arg("-o").arg(a.options.join(","));
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting the background mount")?;
    // Drained meanwhile, so a chatty log cannot fill the pipe and stall the child before it
    // mounts; only the end is kept, to report a failure.
    let errors = child.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut tail = std::collections::VecDeque::new();
            for line in std::io::BufReader::new(e).lines().map_while(Result::ok) {
                tail.push_back(line);
                if tail.len() > 20 {
                    tail.pop_front();
                }
            }
            tail.into_iter().collect::<Vec<_>>().join("\n")
        })
    });
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "MOUNTED" {
        // The child keeps serving; its pipes close with this process.
        println!("mounted on {} (pid {})", mountpoint.display(), child.id());
        return Ok(());
    }
    let status = child.wait()?;
    let said = errors.and_then(|t| t.join().ok()).unwrap_or_default();
    let said = said.trim().trim_start_matches("stripefs: ");
    bail!("the background mount exited ({status}) before it was live: {said}")
}

/// `stripefs mount` without the `fuse` feature.
#[cfg(not(feature = "fuse"))]
pub fn mount(_cluster: Option<PathBuf>, a: MountArgs) -> Result<()> {
    let _ = (a.mountpoint, a.threads, a.background, a.daemon_child, a.cache, mount_opts(&a.options)?);
    bail!("this stripefs was built without FUSE support; rebuild with `--features fuse`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_are_read_and_unknown_ones_refused() {
        let o = |v: &[&str]| mount_opts(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(o(&[]).unwrap(), MountOpts::default());
        assert_eq!(o(&["ro", "allow_other"]).unwrap(), MountOpts { allow_other: true, read_only: true });
        assert_eq!(o(&["ro", "rw", "default_permissions"]).unwrap(), MountOpts::default(), "the last wins");
        let e = o(&["ro", "noexec"]).unwrap_err().to_string();
        assert!(e.contains("\"noexec\"") && e.contains("known: allow_other, ro"), "{e}");
    }

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
    fn a_df_row_is_consistent_whatever_a_server_sent() {
        let gib = 1 << 30;
        let o = Output::default();
        let row = df_row("0", DiskSpace { total: 4 * gib, free: 3 * gib, avail: 2 * gib }, o);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["0", "4.0", "GiB", "1.0", "GiB", "2.0", "GiB", "34%"]
        );
        let exact = Output { bytes: true, ..o };
        let row = df_row("0", DiskSpace { total: 4 * gib, free: 3 * gib, avail: 2 * gib }, exact);
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["0", "4294967296", "1073741824", "2147483648", "34%"]
        );
        // Nonsense (free and avail over the size, sums that would overflow) prints, clamped.
        let row = df_row("1", DiskSpace { total: u64::MAX, free: 0, avail: u64::MAX }, o);
        assert!(row.ends_with(" 100%"), "{row}");
        let row = df_row("2", DiskSpace { total: 10, free: 20, avail: 30 }, o);
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
        assert_eq!(inner("disk"), ["avail", "free", "total"]);
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

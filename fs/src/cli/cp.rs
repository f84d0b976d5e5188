//! `stripefs cp`: copying a file or a tree between the local file system and stripefs, either
//! way or within stripefs, through one reused buffer, with a progress bar.

use super::dest::{LocalDir, encode_dev};
use super::listing::kind_name;
use super::{base_name, client, sfs_join, sfs_path};
use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use stripefs::capability::Rights;
use stripefs::proto::{FileKind, LayoutSpec};
use stripefs::{Client, CreateOptions, Errno, FsError};

/// Bytes moved per call by `cp`: 16 MiB, i.e. 4 MiB per server of a 4-server file.
const CP_CHUNK: usize = 16 << 20;

/// The least run of zeros a copy of a file that may have holes leaves out: each is written as
/// a request of its own otherwise, so shorter ones are written as data.
const HOLE: usize = 64 << 10;

/// Files `cp -r` copies at once: a small file is a few round trips and a sync, which several
/// in flight overlap.
const FILES_AT_ONCE: usize = 4;

/// `cp` options.
#[derive(Args, Debug)]
pub struct CpArgs {
    /// Source: a local path or sfs:/path.
    src: std::ffi::OsString,
    /// Destination: a local path or sfs:/path (a directory keeps the source's name). At least
    /// one side is a stripefs path.
    dst: std::ffi::OsString,
    /// Stripe size of a new stripefs file (bytes, or with a binary unit: 64k, 1M; at least 4k).
    #[arg(long, value_parser = stripefs::units::parse_size)]
    stripe_size: Option<u64>,
    /// Stripe count of a new stripefs file.
    #[arg(long)]
    stripe_count: Option<u32>,
    /// Copy a directory and everything below it (links inside it as links; FIFOs, sockets and
    /// device nodes made again, not read).
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
/// A path on either side of a copy: local, or in stripefs (`sfs:/…`).
#[derive(Debug, Clone)]
enum Loc {
    Local(PathBuf),
    Sfs(String),
}

/// A file's size, and whether it may have holes: it holds less space than its size. Only such a
/// file is asked where its data lies (as `cp` does), which for a stripefs file takes round
/// trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileSize {
    size: u64,
    holes: bool,
}

/// What a copy finds at a path (a symbolic link itself, not what it points at).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(FileSize),
    Dir,
    Link(String),
    /// A FIFO, socket or device node, with its permission bits: in a tree it is made again,
    /// never opened (a FIFO's open would wait for a writer).
    Special(FileKind, u32),
}

impl Loc {
    /// A stripefs path (`sfs:/…`), or any local path, UTF-8 or not.
    fn parse(arg: &std::ffi::OsStr) -> Loc {
        match arg.to_str().and_then(sfs_path) {
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

    fn name(&self) -> Result<String> {
        Ok(match self {
            Loc::Local(p) => p.file_name().map(|n| utf8_name(p, n)).transpose()?.unwrap_or_default(),
            Loc::Sfs(p) => base_name(p).to_string(),
        })
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
                use std::os::unix::fs::{FileTypeExt, MetadataExt};
                let t = m.file_type();
                let special = |kind| Node::Special(kind, m.mode() & 0o7777);
                Ok(Some(if m.is_dir() {
                    Node::Dir
                } else if t.is_symlink() {
                    let t = std::fs::read_link(p).with_context(|| self.show())?;
                    let t =
                        t.to_str().with_context(|| format!("{}: link target is not UTF-8", self.show()))?;
                    Node::Link(t.to_string())
                } else if t.is_fifo() {
                    special(FileKind::Fifo)
                } else if t.is_socket() {
                    special(FileKind::Socket)
                } else if t.is_char_device() {
                    special(FileKind::CharDev(encode_dev(m.rdev())))
                } else if t.is_block_device() {
                    special(FileKind::BlockDev(encode_dev(m.rdev())))
                } else {
                    Node::File(FileSize { size: m.len(), holes: m.blocks().saturating_mul(512) < m.len() })
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
                    FileKind::File => {
                        Node::File(FileSize { size: st.attr.size, holes: st.allocated < st.attr.size })
                    }
                    FileKind::Symlink => Node::Link(c.readlink_handle(st.handle).with_context(|| p.clone())?),
                    k => Node::Special(k, st.attr.mode & 0o7777),
                }))
            }
        }
    }

    /// The names in a directory, sorted.
    fn list(&self, c: &Client) -> Result<Vec<String>> {
        let mut names: Vec<String> = match self {
            Loc::Local(p) => {
                let entries = std::fs::read_dir(p).and_then(Iterator::collect::<std::io::Result<Vec<_>>>);
                let entries = entries.with_context(|| self.show())?;
                entries.iter().map(|e| utf8_name(&e.path(), &e.file_name())).collect::<Result<_>>()?
            }
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

    /// Makes this stripefs path a FIFO, socket or device node (local ones are made through
    /// [`LocalDir::mknod`]).
    fn mknod(&self, c: &Client, kind: FileKind, mode: u32) -> Result<()> {
        match self {
            Loc::Local(_) => bail!("{}: a local special file is made in its directory", self.show()),
            Loc::Sfs(p) => c.mknod(p, kind, mode).map(|_| ()).with_context(|| p.clone()),
        }
    }
}

/// Where `cp` reads from.
enum Source {
    Local(std::fs::File),
    /// A FIFO or device the user named (a pipe from `<(…)`, a disk): read in order, no holes.
    Stream(std::fs::File),
    Sfs(Box<stripefs::File>),
}

impl Source {
    /// Opens the file at `loc` (following links).
    fn open(c: &Client, loc: &Loc) -> Result<Source> {
        Ok(match loc {
            Loc::Sfs(p) => Source::Sfs(Box::new(c.open(p, Rights::READ).with_context(|| p.clone())?)),
            Loc::Local(p) => {
                let f = std::fs::File::open(p).with_context(|| loc.show())?;
                match f.metadata().with_context(|| loc.show())?.is_file() {
                    true => Source::Local(f),
                    false => Source::Stream(f),
                }
            }
        })
    }

    /// Where the next data at or after `off` starts, as the source's file system reports its
    /// holes (`SEEK_DATA`), for a file that may have holes; `None` past the last. Without holes
    /// (a stream too) the data goes on from `off` to the end.
    fn next_data(&mut self, off: u64, file: FileSize) -> Result<Option<u64>> {
        match self {
            Source::Sfs(_) if !file.holes => Ok((off < file.size).then_some(off)),
            Source::Stream(_) => Ok(Some(off)),
            Source::Local(_) if !file.holes => Ok(Some(off)),
            Source::Sfs(f) => Ok(f.next_data(off)?.filter(|&s| s < file.size)),
            Source::Local(f) => {
                use nix::unistd::{Whence, lseek};
                let Ok(at) = i64::try_from(off) else { return Ok(None) };
                match lseek(&*f, at, Whence::SeekData) {
                    Ok(s) => Ok(Some(s as u64)),
                    Err(nix::errno::Errno::ENXIO) => Ok(None),
                    Err(e) => Err(std::io::Error::from(e).into()),
                }
            }
        }
    }

    /// Reads up to [`CP_CHUNK`] bytes at `off` into `buf` (of a stripefs file, not past its size
    /// when the copy began); 0 at the end.
    fn read(&mut self, off: u64, file: FileSize, mut buf: BytesMut) -> Result<(BytesMut, usize)> {
        buf.resize(CP_CHUNK, 0);
        match self {
            // A stream cannot seek: it is read in order.
            Source::Stream(f) => {
                let n = read_full(f, &mut buf)?;
                Ok((buf, n))
            }
            Source::Local(f) => {
                let n = read_full_at(f, &mut buf, off)?;
                Ok((buf, n))
            }
            Source::Sfs(f) => {
                if off >= file.size {
                    return Ok((buf, 0));
                }
                buf.truncate((file.size - off).min(CP_CHUNK as u64) as usize);
                Ok(f.read_at(off, buf)?)
            }
        }
    }

    /// The length the copy is to have once the data is in, up to `off`: a file's may end in a
    /// hole.
    fn end(&self, off: u64, size: u64) -> Result<u64> {
        Ok(match self {
            Source::Sfs(_) => size,
            Source::Local(f) => f.metadata()?.len().max(off),
            Source::Stream(_) => off,
        })
    }
}

/// Where `cp` writes to.
enum Sink {
    Local(std::fs::File),
    /// A device or FIFO the user named (`/dev/null`, a pipe): written in order, never synced.
    Stream(std::fs::File),
    Sfs(Box<stripefs::File>),
}

impl Sink {
    /// Creates (or truncates) the file at `dst`; a local one never through a symbolic link.
    /// Refuses to copy a stripefs file onto itself, which would truncate it first.
    fn create(c: &Client, dst: &Loc, src: &Loc, spec: LayoutSpec) -> Result<Sink> {
        let dst = match dst {
            Loc::Local(p) => {
                return Ok(match open_stream(p)? {
                    Some(f) => Sink::Stream(f),
                    None => Sink::Local(create_local(p)?),
                });
            }
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

    /// The source has a hole `[from, to)`: a file's copy leaves one too; a stream, which has
    /// no holes, gets the zeros a reader of the hole would.
    fn hole(&mut self, from: u64, to: u64) -> Result<()> {
        if let Sink::Stream(f) = self {
            let zeros = vec![0u8; (to - from).min(1 << 20) as usize];
            let mut left = to - from;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                f.write_all(&zeros[..n])?;
                left -= n as u64;
            }
        }
        Ok(())
    }

    /// Writes `buf[..n]` at `off` and gives the buffer back for the next chunk.
    fn write(&mut self, off: u64, mut buf: BytesMut, n: usize) -> Result<BytesMut> {
        match self {
            Sink::Local(f) => {
                use std::os::unix::fs::FileExt;
                f.write_all_at(&buf[..n], off)?;
                Ok(buf)
            }
            Sink::Stream(f) => {
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

    /// As [`Sink::write`], for a source that may have holes: a file's copy leaves out each
    /// [`HOLE`] of zeros in `buf[..n]`, which then reads as zeros from a hole.
    fn write_sparse(&mut self, off: u64, mut buf: BytesMut, n: usize) -> Result<BytesMut> {
        if let Sink::Stream(_) = self {
            return self.write(off, buf, n);
        }
        let mut at = 0;
        while at < n {
            let zeros = |i: usize| buf[i..n.min(i + HOLE)].iter().all(|&b| b == 0);
            let mut start = at;
            while start < n && zeros(start) {
                start += HOLE;
            }
            let mut end = start;
            while end < n && !zeros(end) {
                end += HOLE;
            }
            let end = end.min(n);
            if start < end {
                let rest = buf.split_off(end);
                let mut run = buf.split_off(start);
                run = self.write(off + start as u64, run, end - start)?;
                buf.unsplit(run);
                buf.unsplit(rest);
            }
            at = end.max(start);
        }
        Ok(buf)
    }

    /// Makes a file's copy `len` long: it may end in a hole, or in zeros left out.
    fn set_len(&mut self, len: u64) -> Result<()> {
        match self {
            Sink::Local(f) => f.set_len(len)?,
            Sink::Sfs(f) => f.truncate(len)?,
            Sink::Stream(_) => {}
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        match self {
            Sink::Local(f) => f.sync_all()?,
            // Nothing to make durable (and fsync of a device or pipe fails).
            Sink::Stream(_) => {}
            Sink::Sfs(f) => f.sync()?,
        }
        Ok(())
    }
}

/// The destination the user named, opened for writing if it is a character device or a FIFO
/// (followed through links: the user chose it); `None` for anything else, which
/// [`create_local`] makes a regular file or refuses. A FIFO's open waits for its reader.
fn open_stream(p: &Path) -> Result<Option<std::fs::File>> {
    use std::os::unix::fs::FileTypeExt;
    let is_stream = |t: std::fs::FileType| t.is_char_device() || t.is_fifo();
    if !std::fs::metadata(p).is_ok_and(|m| is_stream(m.file_type())) {
        return Ok(None);
    }
    let f = std::fs::OpenOptions::new().write(true).open(p).with_context(|| p.display().to_string())?;
    // Replaced between the look and the open: not what the user pointed at.
    if !is_stream(f.metadata()?.file_type()) {
        bail!("{}: changed while being opened", p.display());
    }
    Ok(Some(f))
}

/// A local file's name `n` (of the file at `path`), which a stripefs name must be: UTF-8. A
/// name changed on the way would not be the file's name.
fn utf8_name(path: &Path, n: &std::ffi::OsStr) -> Result<String> {
    n.to_str()
        .map(str::to_owned)
        .with_context(|| format!("{}: name not UTF-8, as stripefs names must be", path.display()))
}

/// A local file for `cp` to write: in the directory as named, the file itself never through
/// a symbolic link.
fn create_local(p: &Path) -> Result<std::fs::File> {
    let name = p.file_name().with_context(|| format!("{}: not a file name", p.display()))?;
    let name = utf8_name(p, name)?;
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok(LocalDir::open(dir)?.create_file(&name)?)
}

/// One file's bytes from `src` to the sink `create` makes (once `src` opened), through `buf`,
/// advancing `pb`.
fn copy_file(
    c: &Client,
    src: &Loc,
    file: FileSize,
    dst: &Loc,
    create: impl FnOnce() -> Result<Sink>,
    mut buf: BytesMut,
    pb: &ProgressBar,
) -> Result<BytesMut> {
    let mut from = Source::open(c, src)?;
    let mut sink = create()?;
    let reading = || format!("reading {}", src.show());
    let writing = || format!("writing {}", dst.show());
    // Leaving the source's holes out of the copy (as `cp --sparse=auto`): past each to the next
    // data, and past zeros read.
    let mut off = 0u64;
    while let Some(start) = from.next_data(off, file).with_context(reading)? {
        sink.hole(off, start).with_context(writing)?;
        pb.inc(start - off);
        off = start;
        let (b, n) = from.read(off, file, buf).with_context(reading)?;
        if n == 0 {
            buf = b;
            break;
        }
        buf = match file.holes {
            true => sink.write_sparse(off, b, n),
            false => sink.write(off, b, n),
        }
        .with_context(writing)?;
        off += n as u64;
        pb.inc(n as u64);
    }
    let len = from.end(off, file.size).with_context(reading)?;
    sink.hole(off, len).with_context(writing)?;
    pb.inc(len.saturating_sub(off));
    // Written whole, a copy is as long as what was written; one with zeros left out may not be.
    if file.holes || len > off {
        sink.set_len(len).with_context(writing)?;
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
/// inside the tree are copied as links (links named on the command line are followed), and
/// FIFOs, sockets and device nodes are made again.
pub fn cp(cluster: Option<PathBuf>, a: CpArgs) -> Result<()> {
    let (src, mut dst) = (Loc::parse(&a.src), Loc::parse(&a.dst));
    if let (Loc::Local(_), Loc::Local(_)) = (&src, &dst) {
        bail!("one side of cp must be a stripefs path (sfs:/…)");
    }
    let c = client(cluster)?;
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
        dst = dst.join(&src.name()?);
    }
    let buf = stripefs::buf::aligned_zeroed(CP_CHUNK);
    match top {
        // A local FIFO or device named on the command line (a pipe from `<(…)`, a disk) is
        // read as a stream, as `cp` does.
        Node::Special(_, _) if matches!(src, Loc::Local(_)) => {
            let pb = bar(0);
            let stream = FileSize { size: 0, holes: false };
            copy_file(&c, &src, stream, &dst, || Sink::create(&c, &dst, &src, spec), buf, &pb)?;
            pb.finish_and_clear();
        }
        Node::Special(k, _) => bail!("{}: a {} has no data to copy", src.show(), kind_name(k)),
        Node::File(file) => {
            let pb = bar(file.size);
            copy_file(&c, &src, file, &dst, || Sink::create(&c, &dst, &src, spec), buf, &pb)?;
            pb.finish_and_clear();
        }
        Node::Dir if !a.recursive => bail!("{}: is a directory (cp -r copies a tree)", src.show()),
        Node::Dir => {
            let tree = walk_tree(&c, &src)?;
            let total = tree.iter().map(|(_, n)| if let Node::File(f) = n { f.size } else { 0 }).sum();
            let pb = bar(total);
            dst.mkdir(&c)?;
            // Directories and links first, parents before what is in them; then the files.
            let mut files = Vec::new();
            for (rel, node) in tree {
                match node {
                    Node::File(file) => files.push((rel, file)),
                    Node::Dir => make_entry(&dst, &rel, |dir, name, to| match dir {
                        Some(dir) => Ok(dir.mkdir(name)?),
                        None => to.mkdir(&c),
                    })?,
                    Node::Link(target) => make_entry(&dst, &rel, |dir, name, to| match dir {
                        Some(dir) => Ok(dir.symlink(&target, name)?),
                        None => to.symlink(&c, &target),
                    })?,
                    Node::Special(kind, mode) => make_entry(&dst, &rel, |dir, name, to| match dir {
                        Some(dir) => Ok(dir.mknod(name, kind, mode)?),
                        None => to.mknod(&c, kind, mode),
                    })?,
                }
            }
            copy_files(&c, &src, &dst, spec, &files, buf, &pb)?;
            pb.finish_and_clear();
        }
        Node::Link(_) => bail!("{}: a link that was not followed", src.show()),
    }
    Ok(())
}

/// Makes the entry `rel` of the copy under `dst` with `make`, given (for a local copy) its
/// directory opened component by component from the top, following no link: not one the copy
/// made (a link's target is the source's to choose), not one that was there.
fn make_entry(
    dst: &Loc,
    rel: &[String],
    make: impl FnOnce(Option<LocalDir>, &str, &Loc) -> Result<()>,
) -> Result<()> {
    let to = rel.iter().fold(dst.clone(), |t, n| t.join(n));
    let (name, parents) = rel.split_last().context("an entry without a name")?;
    match dst {
        Loc::Local(top) => make(Some(LocalDir::open(top)?.below(parents)?), name, &to),
        Loc::Sfs(_) => make(None, name, &to),
    }
}

/// Copies `files` (paths under `src`, and their sizes) to the same paths under `dst`, whose
/// directories exist, [`FILES_AT_ONCE`] at a time; the first failure stops the copy.
fn copy_files(
    c: &Client,
    src: &Loc,
    dst: &Loc,
    spec: LayoutSpec,
    files: &[(Vec<String>, FileSize)],
    buf: BytesMut,
    pb: &ProgressBar,
) -> Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(None::<anyhow::Error>);
    let worker = |mut buf: BytesMut| {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((rel, file)) = files.get(i) else { return };
            if failed.lock().map_or(true, |f| f.is_some()) {
                return;
            }
            let from = rel.iter().fold(src.clone(), |f, n| f.join(n));
            let to = rel.iter().fold(dst.clone(), |t, n| t.join(n));
            let r = match dst {
                // As `make_entry` does.
                Loc::Local(top) => (|| {
                    let (name, parents) = rel.split_last().context("an entry without a name")?;
                    let dir = LocalDir::open(top)?.below(parents)?;
                    copy_file(c, &from, *file, &to, || Ok(Sink::Local(dir.create_file(name)?)), buf, pb)
                })(),
                Loc::Sfs(_) => copy_file(c, &from, *file, &to, || Sink::create(c, &to, &from, spec), buf, pb),
            };
            match r {
                Ok(b) => buf = b,
                Err(e) => {
                    if let Ok(mut f) = failed.lock() {
                        f.get_or_insert(e);
                    }
                    return;
                }
            }
        }
    };
    let workers = FILES_AT_ONCE.min(files.len());
    std::thread::scope(|s| {
        for _ in 1..workers {
            s.spawn(|| worker(stripefs::buf::aligned_zeroed(CP_CHUNK)));
        }
        worker(buf);
    });
    match failed.into_inner() {
        Ok(Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Reads at `off` until `buf` is full or the file ends.
fn read_full_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    fill(buf, |b, n| f.read_at(b, off + n as u64))
}

/// Reads on from where the stream is until `buf` is full or the stream ends.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    fill(buf, |b, _| f.read(b))
}

/// Fills `buf` by calls of `read` (given the rest of the buffer and the bytes read so far)
/// until it is full or a call reads nothing.
fn fill(
    buf: &mut [u8],
    mut read: impl FnMut(&mut [u8], usize) -> std::io::Result<usize>,
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match read(&mut buf[n..], n) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

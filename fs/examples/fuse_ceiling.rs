//! The most a FUSE mount can read on this host: a file system of one file, `f`, whose reads are
//! answered from memory with the options the stripefs mount uses (direct I/O, four threads). A
//! mount that fetches its data from io servers reads no faster than this; `cp` of the same file
//! out of the cluster does not pay the kernel's copy into the reader's pages, so it may.
//!
//! ```text
//! cargo run --release -p stripefs --example fuse_ceiling -- /mnt/ceiling [SIZE_MIB] &
//! dd if=/mnt/ceiling/f of=/dev/null bs=1M
//! umount /mnt/ceiling
//! ```
//! `SIZE_MIB` is the file's size (default 1024). Mounting needs root (or `fusermount3`).

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request, Session,
};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

const TTL: Duration = Duration::from_secs(60);
const FILE: INodeNo = INodeNo(2);

struct Ceiling {
    size: u64,
    /// What every read returns a prefix of: as large as the largest request the kernel sends.
    data: Vec<u8>,
}

impl Ceiling {
    fn attr(&self, ino: INodeNo) -> FileAttr {
        let dir = ino == INodeNo::ROOT;
        FileAttr {
            ino,
            size: if dir { 0 } else { self.size },
            blocks: 0,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: if dir { FileType::Directory } else { FileType::RegularFile },
            perm: if dir { 0o755 } else { 0o444 },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }
}

impl Filesystem for Ceiling {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == "f" {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &self.attr(ino));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(1), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let left = usize::try_from(self.size.saturating_sub(offset)).unwrap_or(usize::MAX);
        let n = (size as usize).min(left).min(self.data.len());
        reply.data(&self.data[..n]);
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(mountpoint) = args.next().map(PathBuf::from) else {
        eprintln!("usage: fuse_ceiling MOUNTPOINT [SIZE_MIB]");
        std::process::exit(2);
    };
    let mib: u64 = args.next().map_or(Ok(1024), |s| s.parse()).map_err(std::io::Error::other)?;
    let mut cfg = Config::default();
    cfg.mount_options = vec![MountOption::FSName("fuse-ceiling".into()), MountOption::RO];
    cfg.n_threads = Some(4);
    let fs = Ceiling { size: mib << 20, data: vec![0x5a; 4 << 20] };
    Session::new(fs, &mountpoint, &cfg)?.run()
}

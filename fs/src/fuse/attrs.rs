//! What the kernel is told of a file (its attributes: times, type, size for I/O) and the
//! times and kinds it asks for.

use crate::FsError;
use crate::FsResult;
use crate::proto::{Attr, FileKind, Handle, SetTime, Timestamp};
use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The kernel's time of `t`.
fn time(t: Timestamp) -> SystemTime {
    // Whole seconds either side of 1970, then the nanoseconds forward, as `timespec` counts;
    // the epoch only where the platform's time cannot hold the value.
    let secs = Duration::from_secs(t.secs.unsigned_abs());
    let whole = if t.secs >= 0 { UNIX_EPOCH.checked_add(secs) } else { UNIX_EPOCH.checked_sub(secs) };
    whole.and_then(|w| w.checked_add(Duration::from_nanos(t.nsecs.into()))).unwrap_or(UNIX_EPOCH)
}

/// The time an attribute change asks for, as the meta server takes it.
pub(super) fn stamp(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => SetTime::At(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp { secs: d.as_secs() as i64, nsecs: d.subsec_nanos() },
            // fuser 0.18 makes a `timespec` (secs, nsecs) before 1970 into the epoch less -secs
            // seconds *and* nsecs nanoseconds, where the time meant is nsecs after secs; taken
            // apart the same way, it gives back the caller's `timespec`. (`-secs` of i64::MIN
            // wraps there as here.) The mount's test of times before 1970 sets a fraction of a
            // second and fails if fuser ever makes these times the other way.
            Err(e) => Timestamp {
                secs: (e.duration().as_secs() as i64).wrapping_neg(),
                nsecs: e.duration().subsec_nanos(),
            },
        }),
    }
}

/// The size the mount names for I/O (`st_blksize`) of a file of `size` bytes: the largest
/// request the kernel sends by default. `cp`, `cat` and other tools size their buffers by it
/// (128 KiB at the least), and in the direct mode each of their reads and writes waits for a
/// round trip to the io servers, so the fewer the better; NFS names its transfer size the same
/// way. A file smaller than that names its own size rounded up to a power of two, 64 KiB at
/// the least: a tool that allocates a buffer of that size for each file it reads (`cat` does)
/// would otherwise fault in and free a whole MiB for a few bytes. An empty file is most likely
/// about to be written, so it names the largest.
fn io_size(size: u64) -> u32 {
    const LARGEST: u64 = 1 << 20;
    const SMALLEST: u64 = 64 << 10;
    let s = if size == 0 { LARGEST } else { size.clamp(SMALLEST, LARGEST).next_power_of_two() };
    s.min(LARGEST) as u32
}

/// The kernel's attributes of `h`, a file whose objects hold `allocated` bytes of disk if
/// known (`du` counts them, and `cp` and `tar` look for holes only in a file holding less than
/// its size); anything else counts its size.
pub(super) fn file_attr(h: Handle, a: &Attr, allocated: Option<u64>) -> FileAttr {
    let space = allocated.filter(|_| a.kind == FileKind::File).unwrap_or(a.size);
    FileAttr {
        ino: INodeNo(h.0),
        size: a.size,
        blocks: space.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.kind.rdev(),
        blksize: io_size(a.size),
        flags: 0,
    }
}

pub(super) fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev(_) => FileType::CharDevice,
        FileKind::BlockDev(_) => FileType::BlockDevice,
    }
}

/// The special kind `mknod` makes for `mode` (its type bits) and `rdev`; `None` for a regular
/// file (made as by `create`), `EINVAL` for a type `mknod` cannot make.
pub(super) fn mknod_kind(mode: u32, rdev: u32) -> FsResult<Option<FileKind>> {
    Ok(Some(match mode & libc::S_IFMT {
        libc::S_IFREG | 0 => return Ok(None),
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev(rdev),
        libc::S_IFBLK => FileKind::BlockDev(rdev),
        _ => return Err(FsError::code(crate::Errno::EINVAL, "mknod of that file type")),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_io_size_is_the_largest_request_unless_the_file_is_smaller() {
        assert_eq!(io_size(0), 1 << 20, "an empty file, about to be written");
        assert_eq!(io_size(1), 64 << 10);
        assert_eq!(io_size(4096), 64 << 10);
        assert_eq!(io_size(100 << 10), 128 << 10);
        assert_eq!(io_size((512 << 10) + 1), 1 << 20);
        assert_eq!(io_size(3 << 20), 1 << 20);
        assert_eq!(io_size(u64::MAX), 1 << 20);
    }
}

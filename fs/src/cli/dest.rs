//! Local destinations of `cp`: every file, directory and link a copy makes is created by one
//! name relative to a directory it holds open, and no symbolic link on the way or at the
//! destination is followed. The tree being copied comes from a server; a link it made earlier
//! in the copy, or one already in the destination, must not carry a write elsewhere.

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat, mknodat};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use stripefs::proto::FileKind;

/// A local directory held open.
pub struct LocalDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl LocalDir {
    /// The directory at `path`, as the user named it (links in it are followed: the user chose
    /// them).
    pub fn open(path: &Path) -> io::Result<LocalDir> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = openat(AT_FDCWD, path, flags, Mode::empty()).map_err(|e| err(path, e))?;
        Ok(LocalDir { fd, path: path.to_owned() })
    }

    /// The directory `rel` below this one, each component a directory and not a link.
    pub fn below(self, rel: &[String]) -> io::Result<LocalDir> {
        rel.iter().try_fold(self, |d, name| d.subdir(name))
    }

    fn subdir(&self, name: &str) -> io::Result<LocalDir> {
        let at = self.at(name)?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => Ok(LocalDir { fd, path: at }),
            Err(e) => Err(self.refuse_link(name, e)),
        }
    }

    /// Makes directory `name`; an existing directory (not a link to one) is fine, as when
    /// copying into an existing tree.
    pub fn mkdir(&self, name: &str) -> io::Result<()> {
        let at = self.at(name)?;
        match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o777)) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST) => self.subdir(name).map(drop),
            Err(e) => Err(err(&at, e)),
        }
    }

    /// Opens file `name` for writing, empty: created, or an existing regular file truncated.
    /// A link there is refused, not followed; so is anything but a regular file (opening a
    /// FIFO does not block: the open is non-blocking, the type checked before any write).
    pub fn create_file(&self, name: &str) -> io::Result<File> {
        let at = self.at(name)?;
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::from_bits_truncate(0o666))
            .map_err(|e| self.refuse_link(name, e))?;
        let f = File::from(fd);
        if !f.metadata()?.file_type().is_file() {
            return Err(io::Error::other(format!("{}: not a regular file", at.display())));
        }
        f.set_len(0).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", at.display())))?;
        Ok(f)
    }

    /// Makes link `name` pointing at `target` (which is stored, never followed here).
    pub fn symlink(&self, target: &str, name: &str) -> io::Result<()> {
        let at = self.at(name)?;
        nix::unistd::symlinkat(target, &self.fd, name).map_err(|e| err(&at, e))
    }

    /// Makes `name` a FIFO, socket or device node (`kind`) with permission bits `mode`, less
    /// the umask; a device needs root.
    pub fn mknod(&self, name: &str, kind: FileKind, mode: u32) -> io::Result<()> {
        let at = self.at(name)?;
        let (flag, dev) = match kind {
            FileKind::Fifo => (SFlag::S_IFIFO, 0),
            FileKind::Socket => (SFlag::S_IFSOCK, 0),
            FileKind::CharDev(d) => (SFlag::S_IFCHR, decode_dev(d)),
            FileKind::BlockDev(d) => (SFlag::S_IFBLK, decode_dev(d)),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not special", at.display()),
                ));
            }
        };
        mknodat(&self.fd, name, flag, Mode::from_bits_truncate(mode), dev).map_err(|e| err(&at, e))
    }

    /// The path of `name` here, for messages; `name` must be one component.
    fn at(&self, name: &str) -> io::Result<PathBuf> {
        stripefs::proto::validate_name(name).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {name:?}: {e}", self.path.display()))
        })?;
        Ok(self.path.join(name))
    }

    /// The error for a failed open of `name`: one that is a link says so.
    fn refuse_link(&self, name: &str, e: Errno) -> io::Error {
        let at = self.path.join(name);
        let is_link = fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK);
        if is_link {
            io::Error::other(format!(
                "{}: is a symbolic link; cp does not write through links in its destination",
                at.display()
            ))
        } else {
            err(&at, e)
        }
    }
}

fn err(path: &Path, e: Errno) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// A local device number (`st_rdev`) as stripefs keeps it: the kernel's 32-bit encoding, which
/// FUSE requests carry (12 bits of major, 20 of minor).
pub(super) fn encode_dev(dev: u64) -> u32 {
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    ((minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)) as u32
}

/// The local device number of one stripefs keeps ([`encode_dev`]).
fn decode_dev(d: u32) -> u64 {
    let d = u64::from(d);
    nix::sys::stat::makedev((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    #[test]
    fn device_numbers_keep_their_major_and_minor() {
        for (major, minor) in [(1, 3), (8, 0), (259, 70_000), (4095, 0xfffff)] {
            let dev = nix::sys::stat::makedev(major, minor);
            assert_eq!(decode_dev(encode_dev(dev)), dev, "{major}:{minor}");
        }
        // The kernel's own encoding of 1:3 (/dev/null), as a FUSE request carries it.
        assert_eq!(encode_dev(nix::sys::stat::makedev(1, 3)), 0x103);
    }

    #[test]
    fn links_are_never_followed_below_the_top() {
        let tmp = tempfile::tempdir().unwrap();
        let (top, victim) = (tmp.path().join("top"), tmp.path().join("victim"));
        std::fs::create_dir_all(&top).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::os::unix::fs::symlink(&victim, top.join("ld")).unwrap();
        std::os::unix::fs::symlink(victim.join("f"), top.join("lf")).unwrap();
        let d = LocalDir::open(&top).unwrap();
        assert!(d.mkdir("ld").unwrap_err().to_string().contains("symbolic link"));
        assert!(d.create_file("lf").unwrap_err().to_string().contains("symbolic link"));
        assert!(LocalDir::open(&top).unwrap().below(&["ld".into()]).is_err());
        for bad in ["..", ".", "", "a/b", "/abs", "a\0b"] {
            assert_eq!(d.create_file(bad).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(!victim.join("f").exists());
        // A FIFO is refused without blocking: no reader (ENXIO), or a reader and not a file.
        nix::unistd::mkfifo(&top.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(d.create_file("fifo").is_err());
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(top.join("fifo"))
            .unwrap();
        assert!(d.create_file("fifo").unwrap_err().to_string().contains("not a regular file"));
        // Directories nest; a file there is truncated.
        d.mkdir("sub").unwrap();
        d.mkdir("sub").unwrap();
        std::fs::write(top.join("sub/f"), b"old").unwrap();
        LocalDir::open(&top).unwrap().below(&["sub".into()]).unwrap().create_file("f").unwrap();
        assert_eq!(std::fs::read(top.join("sub/f")).unwrap(), b"");
    }
}

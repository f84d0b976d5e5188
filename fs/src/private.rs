//! What stripefs keeps on disk is private to the user that runs it, whatever the umask: a
//! file's bytes are readable in an io server's object files and the whole namespace in the
//! meta database, and the cluster file names the key. Directories are made mode 0700 and
//! files 0600; a server's own data directory or database found open to group or others is
//! tightened, with a warning naming it and the mode it had.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use tracing::warn;

/// Mode of every directory stripefs makes.
pub const DIR_MODE: u32 = 0o700;

/// Mode of every file stripefs makes.
pub const FILE_MODE: u32 = 0o600;

/// `create_dir_all`, each directory it makes mode [`DIR_MODE`]; existing ones are left as they
/// are (a data directory's parent is the user's, not ours).
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    match DirBuilder::new().recursive(true).mode(DIR_MODE).create(path) {
        // "File exists" would not say what is wrong with what exists.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(io::Error::from_raw_os_error(libc::ENOTDIR))
        }
        r => r,
    }
}

/// A directory a server keeps to itself (an io server's objects): made mode [`DIR_MODE`], or
/// tightened if it exists with group or other bits.
pub fn own_dir(path: &Path) -> io::Result<()> {
    create_dir_all(path)?;
    tighten(path, "data directory")
}

/// Clears the group and other bits of `path` if any are set, with a warning: it held data
/// another user could read.
pub fn tighten(path: &Path, what: &str) -> io::Result<()> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        let new = mode & !0o077;
        warn!("{what} {} was mode {mode:o}, readable beyond its owner; set to {new:o}", path.display());
        std::fs::set_permissions(path, Permissions::from_mode(new))?;
    }
    Ok(())
}

/// Options that create a file mode [`FILE_MODE`].
pub fn options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Writes `bytes` to `path`, mode [`FILE_MODE`] from the first byte, also over an existing
/// file with looser permissions.
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f: File = options().write(true).create(true).truncate(true).open(path)?;
    f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    f.write_all(bytes)
}

/// A directory held by one process: see [`lock_dir`]. Dropping it (or the process ending,
/// however it ends) lets it go.
#[derive(Debug)]
pub struct DirLock {
    _file: nix::fcntl::Flock<File>,
}

/// Holds `dir` (which exists) for this process by an exclusive lock on its file `name`, so a
/// second server or local cluster started on the same directory fails at once instead of
/// writing the same files as the first. The error names the directory and who holds it:
/// `what` ("another io server") and the pid the holder wrote into the file.
pub fn lock_dir(dir: &Path, name: &str, what: &str) -> io::Result<DirLock> {
    use nix::fcntl::{Flock, FlockArg};
    use std::io::{Read, Seek};
    let path = dir.join(name);
    let file = options().read(true).write(true).create(true).truncate(false).open(&path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut held) => {
            held.set_len(0)?;
            held.rewind()?;
            writeln!(held, "{}", std::process::id())?;
            Ok(DirLock { _file: held })
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = (&mut file).take(20).read_to_string(&mut pid);
            let pid = pid.trim();
            let known = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
            let by = if known { format!(" (pid {pid})") } else { String::new() };
            Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{} is in use by {what}{by}", dir.display()),
            ))
        }
        Err((_, e)) => {
            Err(io::Error::new(io::Error::from(e).kind(), format!("locking {}: {e}", path.display())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_file_where_a_directory_goes_is_named_for_what_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        for p in [file.clone(), file.join("below")] {
            let e = create_dir_all(&p).unwrap_err();
            assert!(e.to_string().to_lowercase().contains("not a directory"), "{}: {e}", p.display());
        }
        create_dir_all(&tmp.path().join("a/b")).unwrap();
        create_dir_all(&tmp.path().join("a/b")).unwrap();
    }

    #[test]
    fn made_private_and_loose_ones_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b");
        create_dir_all(&deep).unwrap();
        assert_eq!((mode(&tmp.path().join("a")), mode(&deep)), (0o700, 0o700));
        // An existing data directory left open by an older version or by hand.
        std::fs::set_permissions(&deep, Permissions::from_mode(0o755)).unwrap();
        own_dir(&deep).unwrap();
        assert_eq!(mode(&deep), 0o700);
        let f = deep.join("f");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
        write_file(&f, b"secret").unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, Permissions::from_mode(0o640)).unwrap();
        tighten(&f, "file").unwrap();
        assert_eq!(mode(&f), 0o600);
    }
}

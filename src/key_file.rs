//! Cluster key files, as stripefs and `ionet-perf` read them: the key in hex (whitespace
//! around it ignored), [`MIN_CLUSTER_KEY_LEN`] to [`MAX_CLUSTER_KEY_LEN`] bytes, in a file
//! only its owner can read.
//!
//! The key admits a peer to a cluster ([`Config::cluster_key`](crate::Config::cluster_key)).
//! A file group or others can read is tightened to owner-only and reported
//! ([`KeyFile::loose_mode`]) so the caller can warn that the key may have leaked. A file group
//! or others can write is refused: anyone could have chosen the key. The owner is not checked:
//! whoever owns the file can read the key, so is a member already (root hands a key to a
//! service user this way).

use crate::config::MIN_CLUSTER_KEY_LEN;
use std::fmt;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Longest key, in bytes.
pub const MAX_CLUSTER_KEY_LEN: usize = 1024;

/// Largest key file read (the longest key in hex, with room for whitespace).
pub const MAX_KEY_FILE_BYTES: u64 = 4096;

/// A key read from a file.
pub struct KeyFile {
    /// The key.
    pub key: Vec<u8>,
    /// The file's permission bits before they were tightened, when group or others could
    /// read it.
    pub loose_mode: Option<u32>,
}

impl fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyFile").field("key", &"<set>").field("loose_mode", &self.loose_mode).finish()
    }
}

/// Why a key file was not used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// Opening, reading or tightening it failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: io::Error,
    },
    /// Group or others may write it.
    #[error("{}: mode {mode:o} lets group or others write it; refusing a key anyone could have replaced", path.display())]
    Writable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Longer than [`MAX_KEY_FILE_BYTES`].
    #[error("{}: larger than {MAX_KEY_FILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Not a key in hex of an accepted length.
    #[error("{}: cluster key: {reason}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Decodes a key in hex (whitespace around it ignored) and checks its length.
pub fn parse_key_hex(text: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    if !t.len().is_multiple_of(2) {
        return Err("odd number of hex digits".into());
    }
    let key = (0..t.len())
        .step_by(2)
        .map(|i| {
            t.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("not hex at character {i}"))
        })
        .collect::<Result<Vec<u8>, _>>()?;
    if !(MIN_CLUSTER_KEY_LEN..=MAX_CLUSTER_KEY_LEN).contains(&key.len()) {
        return Err(format!("{} bytes, need {MIN_CLUSTER_KEY_LEN}..={MAX_CLUSTER_KEY_LEN}", key.len()));
    }
    Ok(key)
}

/// Reads the key in `path`, tightening the file to owner-only if group or others can read it
/// (failing if this process may not); refuses a file group or others can write.
pub fn read_key_file(path: &Path) -> Result<KeyFile, KeyFileError> {
    let io = |error| KeyFileError::Io { path: path.to_owned(), error };
    let f = std::fs::File::open(path).map_err(io)?;
    // Checked and changed through the open file: what is read is what was checked.
    let meta = f.metadata().map_err(io)?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(KeyFileError::Writable { path: path.to_owned(), mode });
    }
    let loose_mode = (mode & 0o077 != 0).then_some(mode);
    if loose_mode.is_some() {
        f.set_permissions(std::fs::Permissions::from_mode(mode & !0o077)).map_err(io)?;
    }
    let mut raw = Vec::new();
    f.take(MAX_KEY_FILE_BYTES + 1).read_to_end(&mut raw).map_err(io)?;
    if raw.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(KeyFileError::TooLarge { path: path.to_owned() });
    }
    let key = std::str::from_utf8(&raw)
        .map_err(|_| "not hex text".to_string())
        .and_then(parse_key_hex)
        .map_err(|reason| KeyFileError::Key { path: path.to_owned(), reason })?;
    Ok(KeyFile { key, loose_mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff";

    fn file(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let p = dir.join("k");
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn modes_and_contents() {
        let dir = tempfile_dir();
        let p = file(&dir, &format!("{KEY}\n"), 0o600);
        let k = read_key_file(&p).unwrap();
        assert_eq!((k.key.len(), k.loose_mode), (16, None));
        let p = file(&dir, KEY, 0o644);
        assert_eq!(read_key_file(&p).unwrap().loose_mode, Some(0o644));
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let p = file(&dir, KEY, 0o620);
        assert!(matches!(read_key_file(&p), Err(KeyFileError::Writable { mode: 0o620, .. })));
        let p = file(&dir, "0011", 0o600);
        assert!(matches!(read_key_file(&p), Err(KeyFileError::Key { .. })));
        let p = file(&dir, &"0".repeat(5000), 0o600);
        assert!(matches!(read_key_file(&p), Err(KeyFileError::TooLarge { .. })));
        assert!(matches!(read_key_file(&dir.join("missing")), Err(KeyFileError::Io { .. })));
        assert!(parse_key_hex("zz112233445566778899aabbccddeeff").is_err());
        assert!(format!("{:?}", read_key_file(&file(&dir, KEY, 0o600)).unwrap()).contains("<set>"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("ionet-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

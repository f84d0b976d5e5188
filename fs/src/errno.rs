//! Errno-like codes carried in error replies.
//!
//! The wire value is the Linux errno number, so a FUSE layer or a CLI can hand it straight to the
//! kernel or to `strerror`. [`Errno`] is an open newtype rather than an enum: a code this build
//! does not know still decodes (and prints as a number) instead of failing the whole reply.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io;

/// An errno-like error code (Linux numbering).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Errno(pub i32);

macro_rules! codes {
    ($($name:ident = $val:expr, $text:expr;)*) => {
        impl Errno {
            $(
                #[doc = $text]
                pub const $name: Errno = Errno($val);
            )*

            /// The symbolic name (`"ENOENT"`), if this build knows the code.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($val => Some(stringify!($name)),)*
                    _ => None,
                }
            }

            /// A short description, if this build knows the code.
            pub fn description(self) -> Option<&'static str> {
                match self.0 {
                    $($val => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    EPERM = 1, "operation not permitted";
    ENOENT = 2, "no such file or directory";
    EIO = 5, "input/output error";
    EBADF = 9, "bad file descriptor";
    EAGAIN = 11, "resource temporarily unavailable";
    ENOMEM = 12, "out of memory";
    EACCES = 13, "permission denied";
    EBUSY = 16, "device or resource busy";
    EEXIST = 17, "file exists";
    EXDEV = 18, "invalid cross-device link";
    ENOTDIR = 20, "not a directory";
    EISDIR = 21, "is a directory";
    EINVAL = 22, "invalid argument";
    EFBIG = 27, "file too large";
    ENOSPC = 28, "no space left on device";
    EROFS = 30, "read-only file system";
    EMLINK = 31, "too many links";
    ENAMETOOLONG = 36, "file name too long";
    ENOSYS = 38, "function not implemented";
    ENOTEMPTY = 39, "directory not empty";
    ELOOP = 40, "too many levels of symbolic links";
    EPROTO = 71, "protocol error";
    EOVERFLOW = 75, "value too large for defined data type";
    EMSGSIZE = 90, "message too long";
    EPROTONOSUPPORT = 93, "protocol not supported";
    EOPNOTSUPP = 95, "operation not supported";
    ENOTCONN = 107, "transport endpoint is not connected";
    ETIMEDOUT = 110, "connection timed out";
    ESTALE = 116, "stale file handle";
    EDQUOT = 122, "disk quota exceeded";
    EKEYEXPIRED = 127, "key has expired";
}

impl Errno {
    /// Maps a local OS error to the code sent to a peer. Out-of-space conditions (including
    /// quota) become [`Errno::ENOSPC`] so clients see one "disk full" code; anything without a
    /// precise counterpart becomes [`Errno::EIO`].
    pub fn from_io(e: &io::Error) -> Errno {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Errno::ENOSPC,
            Some(libc::ENOENT) => Errno::ENOENT,
            Some(libc::EEXIST) => Errno::EEXIST,
            Some(libc::EACCES) => Errno::EACCES,
            Some(libc::EPERM) => Errno::EPERM,
            Some(libc::EROFS) => Errno::EROFS,
            Some(libc::EFBIG) => Errno::EFBIG,
            Some(libc::ENOTDIR) => Errno::ENOTDIR,
            Some(libc::EISDIR) => Errno::EISDIR,
            Some(libc::ENAMETOOLONG) => Errno::ENAMETOOLONG,
            Some(libc::ENOMEM) => Errno::ENOMEM,
            Some(libc::EINVAL) => Errno::EINVAL,
            Some(_) => Errno::EIO,
            None => match e.kind() {
                io::ErrorKind::NotFound => Errno::ENOENT,
                io::ErrorKind::AlreadyExists => Errno::EEXIST,
                io::ErrorKind::PermissionDenied => Errno::EACCES,
                io::ErrorKind::InvalidInput => Errno::EINVAL,
                io::ErrorKind::OutOfMemory => Errno::ENOMEM,
                _ => Errno::EIO,
            },
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.name(), self.description()) {
            (Some(n), Some(d)) => write!(f, "{n} ({d})"),
            _ => write!(f, "errno {}", self.0),
        }
    }
}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_are_linux_errnos() {
        assert_eq!(Errno::ENOENT.0, libc::ENOENT);
        assert_eq!(Errno::ENOSPC.0, libc::ENOSPC);
        assert_eq!(Errno::ENOTEMPTY.0, libc::ENOTEMPTY);
        assert_eq!(Errno::ESTALE.0, libc::ESTALE);
        assert_eq!(Errno::ENAMETOOLONG.0, libc::ENAMETOOLONG);
        assert_eq!(Errno::EKEYEXPIRED.0, libc::EKEYEXPIRED);
        assert_eq!(Errno::EPROTONOSUPPORT.0, libc::EPROTONOSUPPORT);
    }

    #[test]
    fn io_errors_map_to_codes() {
        assert_eq!(Errno::from_io(&io::Error::from_raw_os_error(libc::ENOSPC)), Errno::ENOSPC);
        assert_eq!(Errno::from_io(&io::Error::from_raw_os_error(libc::EDQUOT)), Errno::ENOSPC);
        assert_eq!(Errno::from_io(&io::Error::from_raw_os_error(libc::EIO)), Errno::EIO);
        assert_eq!(Errno::from_io(&io::Error::from_raw_os_error(libc::EBADMSG)), Errno::EIO);
        assert_eq!(Errno::from_io(&io::Error::other("disk on fire")), Errno::EIO);
        assert_eq!(Errno::from_io(&io::Error::from(io::ErrorKind::NotFound)), Errno::ENOENT);
    }

    #[test]
    fn unknown_codes_still_print() {
        assert_eq!(format!("{:?}", Errno(4242)), "Errno(4242)");
        assert_eq!(Errno::ENOENT.to_string(), "ENOENT (no such file or directory)");
    }
}

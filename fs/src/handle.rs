//! The handle that names a file or directory everywhere: in messages, capabilities and the io
//! servers' object files.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A file or directory handle: allocated by the meta server, never reused.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Handle(pub u64);

impl Handle {
    /// The root directory.
    pub const ROOT: Handle = Handle(1);
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle({:#x})", self.0)
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

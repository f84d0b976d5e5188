//! Names and symbolic link targets on the wire, and the rules they must meet.

use super::bounded::BoundedString;
use super::error::ProtoError;
use super::limits::{MAX_LINK_TARGET, MAX_NAME_WIRE};

/// A name as carried on the wire (bounded at [`MAX_NAME_WIRE`]; the meta server applies the
/// file-name rules).
pub type Name = BoundedString<MAX_NAME_WIRE>;

/// Longest file name, in bytes.
pub const NAME_MAX: usize = 255;

/// Why a name is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty string.
    #[error("empty name")]
    Empty,
    /// `.` or `..`.
    #[error("'.' and '..' are not names")]
    Dot,
    /// Contains `/`.
    #[error("name contains '/'")]
    Slash,
    /// Contains NUL.
    #[error("name contains NUL")]
    Nul,
    /// Longer than [`NAME_MAX`] bytes.
    #[error("name longer than {NAME_MAX} bytes")]
    TooLong,
}

/// Checks a single path component: the meta server applies it to every name it stores, and a
/// client's decoder to every name a server lists.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    match name {
        "" => Err(NameError::Empty),
        "." | ".." => Err(NameError::Dot),
        _ if name.len() > NAME_MAX => Err(NameError::TooLong),
        _ if name.contains('/') => Err(NameError::Slash),
        _ if name.contains('\0') => Err(NameError::Nul),
        _ => Ok(()),
    }
}

/// A symbolic link's target as carried on the wire and stored: any path text of 1 to
/// [`MAX_LINK_TARGET`] bytes without NUL; nothing is checked against the namespace.
pub type LinkTarget = BoundedString<MAX_LINK_TARGET>;

/// The rule for a link target beyond its length (which [`LinkTarget`] bounds): not empty, no NUL.
/// The meta server applies it to what it stores, decoding to what a peer sends.
pub fn link_target_ok(t: &str) -> bool {
    !t.is_empty() && !t.contains('\0')
}

pub(super) fn target_ok(t: &LinkTarget) -> Result<(), ProtoError> {
    if !link_target_ok(t) {
        return Err(ProtoError::Invalid("link target"));
    }
    Ok(())
}

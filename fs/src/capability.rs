//! Per-open capability tokens.
//!
//! On open the meta server mints a [`Capability`]: an HMAC-SHA256, under the cluster key, over the
//! handle, the rights granted, an expiry time and a nonce. Clients present it on every io-server
//! request and the io server checks it with [`CapabilityKey::verify`] before touching the object,
//! so knowing a handle is not enough to read or write it (PVFS1's `cap`, OrangeFS capabilities).
//! The io servers need no per-open state and never talk to the meta server to check a token.
//!
//! Time is passed in (`now`, seconds since the Unix epoch) so the checks are deterministic; the
//! network layer uses [`unix_now`].

use crate::errno::Errno;
use crate::handle::Handle;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// Shortest cluster key accepted, in bytes (matches ionet's `MIN_CLUSTER_KEY_LEN`).
pub const MIN_KEY_LEN: usize = 16;

/// Longest cluster key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Domain separation: a MAC made for anything else under the same key never verifies here.
const DOMAIN: &[u8] = b"stripefs capability v1\0";

/// What a capability allows, as a small bit set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rights(u8);

impl Rights {
    /// No rights.
    pub const NONE: Rights = Rights(0);
    /// Read data and local sizes.
    pub const READ: Rights = Rights(1);
    /// Write data, sync.
    pub const WRITE: Rights = Rights(2);
    /// Create, remove and truncate objects: only the meta server mints this.
    pub const ADMIN: Rights = Rights(4);
    /// Read and write.
    pub const READ_WRITE: Rights = Rights(1 | 2);
    /// Every right.
    pub const ALL: Rights = Rights(1 | 2 | 4);

    /// The raw bits (unknown bits are kept: they only ever reduce what a token can be used for,
    /// since [`Rights::contains`] is checked against the rights a request needs).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Rights from raw bits.
    pub const fn from_bits(bits: u8) -> Rights {
        Rights(bits)
    }

    /// True if every right in `other` is in `self`.
    pub const fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union.
    pub const fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
}

impl fmt::Debug for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        for (bit, c) in [(Rights::READ, 'r'), (Rights::WRITE, 'w'), (Rights::ADMIN, 'a')] {
            s.push(if self.contains(bit) { c } else { '-' });
        }
        write!(f, "Rights({s})")
    }
}

/// A signed grant of `rights` on `handle` until `expiry`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The object this grants access to.
    pub handle: Handle,
    /// What it allows.
    pub rights: Rights,
    /// Seconds since the Unix epoch after which it is refused.
    pub expiry: u64,
    /// Makes every token distinct (e.g. per open), so a leaked token can be told apart in logs.
    pub nonce: u64,
    /// HMAC-SHA256 over the fields above.
    pub mac: [u8; 32],
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The MAC is a bearer secret: keep it out of logs.
        f.debug_struct("Capability")
            .field("handle", &self.handle)
            .field("rights", &self.rights)
            .field("expiry", &self.expiry)
            .field("nonce", &self.nonce)
            .finish_non_exhaustive()
    }
}

/// Why a capability was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapError {
    /// The MAC does not match: forged or altered.
    #[error("capability signature does not verify")]
    BadSignature,
    /// Valid, but for a different handle.
    #[error("capability is for handle {got}, not {want}")]
    WrongHandle {
        /// The token's handle.
        got: Handle,
        /// The handle of the request.
        want: Handle,
    },
    /// Valid, but lacks a right the request needs.
    #[error("capability grants {granted:?}, request needs {needed:?}")]
    InsufficientRights {
        /// What the token grants.
        granted: Rights,
        /// What the request needs.
        needed: Rights,
    },
    /// Valid, but past its expiry.
    #[error("capability expired at {expiry}, now {now}")]
    Expired {
        /// The token's expiry.
        expiry: u64,
        /// The checking time.
        now: u64,
    },
    /// The cluster key is too short or too long.
    #[error("cluster key must be {MIN_KEY_LEN}..={MAX_KEY_LEN} bytes, got {0}")]
    BadKey(usize),
}

impl CapError {
    /// The code an io server replies with. Expiry gets its own code so a client can re-open
    /// and retry instead of failing the operation.
    pub fn errno(&self) -> Errno {
        match self {
            CapError::Expired { .. } => Errno::EKEYEXPIRED,
            CapError::BadKey(_) => Errno::EINVAL,
            _ => Errno::EACCES,
        }
    }
}

/// The cluster key, held by the meta server (to mint) and every io server (to verify).
#[derive(Clone)]
pub struct CapabilityKey {
    mac: HmacSha256,
}

impl fmt::Debug for CapabilityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapabilityKey(<redacted>)")
    }
}

impl CapabilityKey {
    /// A key of [`MIN_KEY_LEN`]..=[`MAX_KEY_LEN`] bytes.
    pub fn new(key: &[u8]) -> Result<Self, CapError> {
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(CapError::BadKey(key.len()));
        }
        // HMAC takes keys of any length; the range check above is our policy.
        let mac = HmacSha256::new_from_slice(key).map_err(|_| CapError::BadKey(key.len()))?;
        Ok(CapabilityKey { mac })
    }

    fn tag(&self, handle: Handle, rights: Rights, expiry: u64, nonce: u64) -> HmacSha256 {
        let mut m = self.mac.clone();
        m.update(DOMAIN);
        m.update(&handle.0.to_le_bytes());
        m.update(&[rights.bits()]);
        m.update(&expiry.to_le_bytes());
        m.update(&nonce.to_le_bytes());
        m
    }

    /// Signs a grant of `rights` on `handle` valid until `expiry`.
    pub fn mint(&self, handle: Handle, rights: Rights, expiry: u64, nonce: u64) -> Capability {
        let mac = self.tag(handle, rights, expiry, nonce).finalize().into_bytes();
        let mut out = [0u8; 32];
        out.copy_from_slice(&mac);
        Capability { handle, rights, expiry, nonce, mac: out }
    }

    /// Checks that `cap` is genuine, names `handle`, grants at least `needed`, and has not
    /// expired at `now`. The MAC comparison is constant-time; the signature is checked first so
    /// nothing about a forged token is acted on.
    pub fn verify(&self, cap: &Capability, handle: Handle, needed: Rights, now: u64) -> Result<(), CapError> {
        self.tag(cap.handle, cap.rights, cap.expiry, cap.nonce)
            .verify_slice(&cap.mac)
            .map_err(|_| CapError::BadSignature)?;
        if cap.handle != handle {
            return Err(CapError::WrongHandle { got: cap.handle, want: handle });
        }
        if !cap.rights.contains(needed) {
            return Err(CapError::InsufficientRights { granted: cap.rights, needed });
        }
        if now >= cap.expiry {
            return Err(CapError::Expired { expiry: cap.expiry, now });
        }
        Ok(())
    }
}

/// The expiry to give a token minted at whole second `now` that must stay valid for at least
/// `lifetime`. Times are whole seconds and a token is refused from its expiry second on, so
/// `now + lifetime` would leave a 1 s token minted at x.999 s only a millisecond to live; one
/// extra second makes the lifetime a lower bound (it may last up to a second longer).
pub fn expiry_after(now: u64, lifetime: std::time::Duration) -> u64 {
    let secs = lifetime.as_secs() + u64::from(lifetime.subsec_nanos() > 0);
    now.saturating_add(secs.max(1)).saturating_add(1)
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CapabilityKey {
        CapabilityKey::new(b"0123456789abcdef-cluster").unwrap()
    }

    const H: Handle = Handle(42);

    #[test]
    fn genuine_token_verifies() {
        let cap = key().mint(H, Rights::READ_WRITE, 1000, 7);
        assert_eq!(key().verify(&cap, H, Rights::READ, 999), Ok(()));
        assert_eq!(key().verify(&cap, H, Rights::READ_WRITE, 0), Ok(()));
    }

    #[test]
    fn every_flipped_mac_bit_is_refused() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        for bit in 0..256 {
            let mut c = cap.clone();
            c.mac[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(key().verify(&c, H, Rights::READ, 0), Err(CapError::BadSignature), "bit {bit}");
        }
    }

    #[test]
    fn altered_fields_are_refused() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        let more_rights = Capability { rights: Rights::READ_WRITE, ..cap.clone() };
        assert_eq!(key().verify(&more_rights, H, Rights::READ, 0), Err(CapError::BadSignature));
        let later = Capability { expiry: u64::MAX, ..cap.clone() };
        assert_eq!(key().verify(&later, H, Rights::READ, 0), Err(CapError::BadSignature));
        let other = Capability { handle: Handle(43), ..cap.clone() };
        assert_eq!(key().verify(&other, Handle(43), Rights::READ, 0), Err(CapError::BadSignature));
        let nonce = Capability { nonce: 8, ..cap };
        assert_eq!(key().verify(&nonce, H, Rights::READ, 0), Err(CapError::BadSignature));
    }

    #[test]
    fn another_key_is_refused() {
        let cap = CapabilityKey::new(b"some-other-cluster-key").unwrap().mint(H, Rights::ALL, 1000, 1);
        assert_eq!(key().verify(&cap, H, Rights::READ, 0), Err(CapError::BadSignature));
    }

    #[test]
    fn token_for_another_handle_is_refused() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        let e = key().verify(&cap, Handle(43), Rights::READ, 0).unwrap_err();
        assert_eq!(e, CapError::WrongHandle { got: H, want: Handle(43) });
        assert_eq!(e.errno(), Errno::EACCES);
    }

    #[test]
    fn token_without_the_needed_right_is_refused() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        let e = key().verify(&cap, H, Rights::WRITE, 0).unwrap_err();
        assert_eq!(e, CapError::InsufficientRights { granted: Rights::READ, needed: Rights::WRITE });
        assert_eq!(e.errno(), Errno::EACCES);
        let rw = key().mint(H, Rights::READ_WRITE, 1000, 7);
        assert!(matches!(key().verify(&rw, H, Rights::ADMIN, 0), Err(CapError::InsufficientRights { .. })));
    }

    #[test]
    fn expired_token_is_refused() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        let e = key().verify(&cap, H, Rights::READ, 1000).unwrap_err();
        assert_eq!(e, CapError::Expired { expiry: 1000, now: 1000 });
        assert_eq!(e.errno(), Errno::EKEYEXPIRED);
    }

    #[test]
    fn a_token_lives_at_least_its_lifetime() {
        // Minted in second 1000 (anywhere in [1000.0, 1001.0)), a 1 s token must still verify at
        // any instant up to a full second later, i.e. throughout whole second 1001.
        let cap = key().mint(H, Rights::READ, expiry_after(1000, std::time::Duration::from_secs(1)), 7);
        assert!(key().verify(&cap, H, Rights::READ, 1001).is_ok());
        assert!(key().verify(&cap, H, Rights::READ, 1002).is_err());
        // Fractional lifetimes round up; a zero lifetime still gives a usable token.
        assert_eq!(expiry_after(1000, std::time::Duration::from_millis(1500)), 1003);
        assert_eq!(expiry_after(1000, std::time::Duration::ZERO), 1002);
        assert_eq!(expiry_after(u64::MAX - 1, std::time::Duration::from_secs(60)), u64::MAX);
    }

    #[test]
    fn short_keys_are_refused() {
        assert_eq!(CapabilityKey::new(b"short").unwrap_err(), CapError::BadKey(5));
        assert!(CapabilityKey::new(&[0u8; MAX_KEY_LEN + 1]).is_err());
    }

    #[test]
    fn debug_hides_secrets() {
        let cap = key().mint(H, Rights::READ, 1000, 7);
        assert!(!format!("{cap:?}").contains("mac"));
        assert_eq!(format!("{:?}", key()), "CapabilityKey(<redacted>)");
        assert_eq!(format!("{:?}", Rights::READ_WRITE), "Rights(rw-)");
    }
}

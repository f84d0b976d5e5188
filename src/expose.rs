//! Exposed memory: handles peers use for one-sided `put`/`get`, and the target-side table that
//! validates every access (key, bounds, access right) before a byte is touched.

use std::collections::HashMap;

use crate::buffers::buf::RegisteredBuf;
use crate::error::AccessError;
use crate::types::Access;

/// Encoded size of a [`MemHandle`].
pub const MEM_HANDLE_LEN: usize = 32;
const HANDLE_VERSION: u8 = 1;

/// A small serializable description of exposed memory, to put in a request: the target's
/// address range, an unguessable 64-bit key and (InfiniBand) the device's remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemHandle {
    /// Address of the first exposed byte in the target's address space.
    pub addr: u64,
    /// Exposed length.
    pub len: u64,
    /// Random 64-bit key chosen by the target; required on every access.
    pub key: u64,
    /// Device remote key (InfiniBand); 0 elsewhere.
    pub rkey: u32,
    /// Rights granted.
    pub access: Access,
}

/// Why a handle failed to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// Wrong size.
    #[error("memory handle must be {MEM_HANDLE_LEN} bytes, got {0}")]
    Length(usize),
    /// Unknown version.
    #[error("unknown memory handle version {0}")]
    Version(u8),
    /// Invalid access bits.
    #[error("invalid access bits {0:#x}")]
    Access(u8),
    /// Range wraps the address space.
    #[error("handle range overflows")]
    Overflow,
}

impl MemHandle {
    /// A handle for the sub-range `[offset, offset + len)` of this one.
    pub fn slice(&self, offset: u64, len: u64) -> Option<MemHandle> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| MemHandle { addr: self.addr + offset, len, ..*self })
    }

    /// Fixed 32-byte encoding.
    pub fn to_bytes(&self) -> [u8; MEM_HANDLE_LEN] {
        let mut b = [0u8; MEM_HANDLE_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        b[28] = HANDLE_VERSION;
        b[29] = self.access.bits();
        b
    }

    /// Decodes [`MemHandle::to_bytes`]; total over any input.
    pub fn from_bytes(b: &[u8]) -> Result<MemHandle, HandleError> {
        let b: &[u8; MEM_HANDLE_LEN] = b.try_into().map_err(|_| HandleError::Length(b.len()))?;
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        if b[28] != HANDLE_VERSION {
            return Err(HandleError::Version(b[28]));
        }
        let access = Access::from_bits(b[29]).ok_or(HandleError::Access(b[29]))?;
        if b[30] != 0 || b[31] != 0 {
            return Err(HandleError::Version(b[28]));
        }
        let h = MemHandle {
            addr: u64_at(0),
            len: u64_at(8),
            key: u64_at(16),
            rkey: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
            access,
        };
        h.addr.checked_add(h.len).ok_or(HandleError::Overflow)?;
        Ok(h)
    }
}

/// One exposed region, owned by the table until revoked.
#[derive(Debug)]
pub(crate) struct Exposed {
    pub(crate) buf: RegisteredBuf,
    pub(crate) access: Access,
}

/// Target-side table of exposures, keyed by their random key.
#[derive(Debug, Default)]
pub(crate) struct ExposureTable {
    by_key: HashMap<u64, Exposed>,
}

impl ExposureTable {
    /// Adds an exposure under a fresh random key and returns its handle.
    pub(crate) fn insert(&mut self, buf: RegisteredBuf, access: Access, rkey: u32) -> MemHandle {
        let key = loop {
            let k = crate::util::random_u64();
            if k != 0 && !self.by_key.contains_key(&k) {
                break k;
            }
        };
        let h = MemHandle { addr: buf.addr() as u64, len: buf.len() as u64, key, rkey, access };
        self.by_key.insert(key, Exposed { buf, access });
        h
    }

    /// Removes an exposure, giving its buffer back.
    pub(crate) fn remove(&mut self, key: u64) -> Option<RegisteredBuf> {
        self.by_key.remove(&key).map(|e| e.buf)
    }

    /// Number of live exposures.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Validates an access of `len` bytes at absolute address `addr` and returns the exposed
    /// slice, or why it is refused. Nothing is touched on refusal.
    pub(crate) fn validate(
        &mut self,
        key: u64,
        addr: u64,
        len: u64,
        want: Access,
    ) -> Result<&mut [u8], AccessError> {
        let e = self.by_key.get_mut(&key).ok_or(AccessError::BadKey)?;
        if !e.access.contains(want) {
            return Err(AccessError::NoPermission);
        }
        let base = e.buf.addr() as u64;
        let off = addr.checked_sub(base).ok_or(AccessError::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        if end > e.buf.len() as u64 {
            return Err(AccessError::OutOfBounds);
        }
        Ok(&mut e.buf[off as usize..end as usize])
    }

    /// The exposed bytes of a key (local access by the owner).
    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut RegisteredBuf> {
        self.by_key.get_mut(&key).map(|e| &mut e.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_garbage() {
        let h =
            MemHandle { addr: 0x1000, len: 4096, key: 0xdead_beef_cafe_f00d, rkey: 7, access: Access::READ };
        assert_eq!(MemHandle::from_bytes(&h.to_bytes()), Ok(h));
        assert_eq!(MemHandle::from_bytes(&[0u8; 31]), Err(HandleError::Length(31)));
        let mut b = h.to_bytes();
        b[28] = 9;
        assert_eq!(MemHandle::from_bytes(&b), Err(HandleError::Version(9)));
        let mut b = h.to_bytes();
        b[29] = 0;
        assert_eq!(MemHandle::from_bytes(&b), Err(HandleError::Access(0)));
        let mut b = MemHandle { addr: u64::MAX, ..h }.to_bytes();
        b[8] = 2;
        assert_eq!(MemHandle::from_bytes(&b), Err(HandleError::Overflow));
        assert_eq!(h.slice(4000, 96).unwrap().addr, 0x1000 + 4000);
        assert!(h.slice(4000, 97).is_none());
        assert!(h.slice(u64::MAX, 2).is_none());
    }

    #[test]
    fn table_validates_key_bounds_and_access_before_touching() {
        let mut t = ExposureTable::default();
        let mut buf = RegisteredBuf::unpooled(100);
        buf.fill(0xAA);
        let h = t.insert(buf, Access::READ, 0);
        assert_eq!(t.validate(h.key ^ 1, h.addr, 1, Access::READ).unwrap_err(), AccessError::BadKey);
        assert_eq!(t.validate(h.key, h.addr, 1, Access::WRITE).unwrap_err(), AccessError::NoPermission);
        assert_eq!(t.validate(h.key, h.addr + 50, 51, Access::READ).unwrap_err(), AccessError::OutOfBounds);
        assert_eq!(t.validate(h.key, h.addr - 1, 1, Access::READ).unwrap_err(), AccessError::OutOfBounds);
        assert_eq!(t.validate(h.key, h.addr, u64::MAX, Access::READ).unwrap_err(), AccessError::OutOfBounds);
        assert_eq!(t.validate(h.key, h.addr + 50, 50, Access::READ).unwrap().len(), 50);
        let back = t.remove(h.key).unwrap();
        assert!(back.iter().all(|&b| b == 0xAA));
        assert_eq!(t.validate(h.key, h.addr, 1, Access::READ).unwrap_err(), AccessError::BadKey);
    }
}

//! Files' sizes this mount told the kernel lately, so an attribute change that leaves the size
//! alone (`chmod`, `chown`, `utimensat`: three of them for each file `tar -x` unpacks) need not
//! ask every io server of the file for it again.
//!
//! The kernel keeps the attributes of each reply for the attribute time-to-live and answers
//! `stat` from them meanwhile, so a size as old as that is what a caller may see anyway. A size
//! learnt from the servers (a look-up, `getattr`, a change that asked them, a create) is kept
//! that long, raised by this mount's own writes past it; anything else this mount does that
//! changes a size forgets it. An answer made with it is given to the kernel for what is left of
//! that time only, so what a caller sees is never older than the time-to-live. The direct mode
//! only: the kernel-cached mode keeps its own sizes.

use crate::lock;
use crate::proto::Handle;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many files' sizes are kept: those learnt within the time-to-live of a busy
/// mount's replies, beyond which an entry is of no use.
const KEPT: usize = 4096;

/// The block the space of written bytes is rounded to.
const BLOCK: u64 = 4096;

#[derive(Debug, Clone, Copy)]
struct Known {
    size: u64,
    /// The disk space the file's objects hold, raised by this mount's writes since.
    allocated: u64,
    /// When the servers said it.
    at: Instant,
}

/// A size and space known within the time-to-live ([`KnownSizes::fresh`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fresh {
    pub(super) size: u64,
    pub(super) allocated: u64,
    /// How much of the time-to-live is left.
    pub(super) left: Duration,
}

/// Sizes learnt from the servers within `fresh_for`.
#[derive(Debug)]
pub(super) struct KnownSizes {
    fresh_for: Duration,
    by_handle: Mutex<HashMap<Handle, Known>>,
}

impl KnownSizes {
    pub(super) fn new(fresh_for: Duration) -> Self {
        KnownSizes { fresh_for, by_handle: Mutex::new(HashMap::new()) }
    }

    /// The servers have just said file `h` is `size` bytes long, holding `allocated` bytes of
    /// disk.
    pub(super) fn learnt(&self, h: Handle, size: u64, allocated: u64) {
        let now = Instant::now();
        let mut m = lock(&self.by_handle);
        if m.len() >= KEPT && !m.contains_key(&h) {
            m.retain(|_, k| now.duration_since(k.at) < self.fresh_for);
            if m.len() >= KEPT {
                return;
            }
        }
        m.insert(h, Known { size, allocated, at: now });
    }

    /// This mount wrote `len` bytes of file `h` up to byte `end`. They are counted as space
    /// taken (a file written in order, as most are, takes that much), up to the size rounded
    /// to the block: an overwrite or a write into a hole cannot be told apart from here.
    pub(super) fn wrote(&self, h: Handle, end: u64, len: u64) {
        if let Some(k) = lock(&self.by_handle).get_mut(&h) {
            k.size = k.size.max(end);
            let bound = k.allocated.max(k.size.next_multiple_of(BLOCK));
            k.allocated = k.allocated.saturating_add(len).min(bound);
        }
    }

    /// File `h`'s size changed some other way.
    pub(super) fn forget(&self, h: Handle) {
        lock(&self.by_handle).remove(&h);
    }

    /// File `h`'s size and space, if learnt within the time-to-live, and how much of that is
    /// left: the kernel may hold an answer made with it no longer, or what it shows would be
    /// older.
    pub(super) fn fresh(&self, h: Handle) -> Option<Fresh> {
        let m = lock(&self.by_handle);
        let k = m.get(&h)?;
        let left = self.fresh_for.checked_sub(k.at.elapsed()).filter(|l| !l.is_zero())?;
        Some(Fresh { size: k.size, allocated: k.allocated, left })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_is_raised_by_writes_dropped_by_other_changes_and_ages() {
        let s = KnownSizes::new(Duration::from_secs(3600));
        let h = Handle(7);
        assert_eq!(s.fresh(h), None);
        s.wrote(h, 100, 100);
        assert_eq!(s.fresh(h), None, "a write alone tells nothing of the rest of the file");
        s.learnt(h, 10, 4096);
        s.wrote(h, 4096, 4086);
        s.wrote(h, 50, 40);
        let f = s.fresh(h).unwrap();
        assert_eq!((f.size, f.allocated), (4096, 4096), "the rewrites take no more than a block");
        assert!(f.left <= Duration::from_secs(3600));
        s.wrote(h, 1 << 20, 8192);
        assert_eq!(s.fresh(h).unwrap().allocated, 4096 + 8192, "a write far out leaves a hole");
        s.forget(h);
        assert_eq!(s.fresh(h), None);
        let stale = KnownSizes::new(Duration::ZERO);
        stale.learnt(h, 10, 0);
        assert_eq!(stale.fresh(h), None);
    }

    #[test]
    fn at_most_kept_files_past_the_stale_ones() {
        let s = KnownSizes::new(Duration::from_secs(3600));
        for h in 0..KEPT as u64 + 10 {
            s.learnt(Handle(h), h, 0);
        }
        assert_eq!(lock(&s.by_handle).len(), KEPT);
        assert_eq!(s.fresh(Handle(3)).map(|k| k.size), Some(3), "fresh ones are not pushed out");
        let aged = KnownSizes::new(Duration::ZERO);
        for h in 0..KEPT as u64 + 10 {
            aged.learnt(Handle(h), h, 0);
        }
        assert!(lock(&aged.by_handle).len() <= KEPT);
        assert!(lock(&aged.by_handle).contains_key(&Handle(KEPT as u64 + 9)), "stale ones make room");
    }
}

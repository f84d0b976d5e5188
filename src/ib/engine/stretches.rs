//! Which stretches of an op's buffer a server-side transfer moves without a copy: the rules
//! over addresses and what has been seen, apart from the cache and the device. The engine
//! (`xfer.rs`) walks the buffer's slices into [`Stretches`], asks [`origin`] which of them to
//! open, and registers those the cache has or [`SeenOnce`] admits; units inside a registered
//! stretch go straight from it, the others through a zone buffer.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::regcache::Origin;

/// An address-contiguous stretch of an op's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stretch {
    /// Offset in the op's buffer.
    pub off: usize,
    pub addr: usize,
    pub len: usize,
}

/// The address-contiguous stretches of a buffer, built from its slices in order: a slice that
/// starts where the last one ended extends it (one registration, one lookup for a unit that
/// crosses the seam).
#[derive(Debug, Default)]
pub(crate) struct Stretches {
    list: Vec<Stretch>,
    /// Offset in the buffer of the next slice.
    at: usize,
}

impl Stretches {
    /// The next slice of the buffer: `len` bytes at `addr`.
    pub fn add(&mut self, addr: usize, len: usize) {
        match self.list.last_mut() {
            Some(s) if s.addr + s.len == addr => s.len += len,
            _ => self.list.push(Stretch { off: self.at, addr, len }),
        }
        self.at += len;
    }

    /// The stretches, in buffer order.
    pub fn into_vec(self) -> Vec<Stretch> {
        self.list
    }
}

/// Whether stretch `s` is opened for units to move it without a copy, and as whose memory.
/// A file mapping (`is_mapped`) always, as the crate's: the file-mapping path invalidates its
/// registrations when it unmaps it, so they may stay cached past the op. Other lent memory
/// only when the cache keeps it (`keeps_foreign`: watched by the memory monitor, or at the
/// application's word), as lent, so the monitor watches it. An empty stretch never (and
/// `is_mapped` is not asked for it).
pub(crate) fn origin(
    s: Stretch,
    keeps_foreign: bool,
    is_mapped: impl FnOnce(usize, usize) -> bool,
) -> Option<Origin> {
    if s.len == 0 {
        None
    } else if is_mapped(s.addr, s.len) {
        Some(Origin::Owned)
    } else if keeps_foreign {
        Some(Origin::Foreign)
    } else {
        None
    }
}

/// Stretches staged once, by `(address, length)`. Registering a stretch pins its pages (and,
/// on first touch of a fresh file region, faults them in), which costs more than the one copy
/// it saves unless the stretch moves again: a stretch the cache does not have yet is staged
/// the first time it is seen and registered the second, like an admission filter's ghost
/// list. Bounded; the oldest are forgotten.
#[derive(Debug, Default)]
pub(crate) struct SeenOnce {
    /// Stretch → when it was noted.
    seen: FxHashMap<(usize, usize), u64>,
    /// Notes in order (some already admitted: their stamp no longer matches).
    order: VecDeque<((usize, usize), u64)>,
    next: u64,
}

impl SeenOnce {
    /// Stretches remembered at most.
    const CAP: usize = 4096;

    /// True if `k` was seen before (and forgets it: it is about to be registered); otherwise
    /// remembers it and says false.
    pub(crate) fn seen_before(&mut self, k: (usize, usize)) -> bool {
        if self.seen.remove(&k).is_some() {
            return true;
        }
        while self.order.len() >= Self::CAP {
            if let Some((old, stamp)) = self.order.pop_front()
                && self.seen.get(&old) == Some(&stamp)
            {
                self.seen.remove(&old);
            }
        }
        self.next += 1;
        self.seen.insert(k, self.next);
        self.order.push_back((k, self.next));
        false
    }
}

#[cfg(test)]
#[path = "stretches_tests.rs"]
mod tests;

//! The layouts and capabilities of files a client opened lately, kept to ask the files' io
//! servers for their sizes.
//!
//! A file's size is the io servers' to tell, and asking them takes a capability, which the
//! meta server grants. Without one at hand a `stat` is three round trips in a row: the
//! attributes, a capability, the sizes. With one kept from the file's last open (a `tar` or
//! `cp -p` sets times, owner and mode on a file it has just created), the attributes and the
//! sizes are asked at once.
//!
//! A kept capability is only ever used to ask a size, which any capability for the file allows
//! (sizes are attributes, shown to whoever may stat the file), so keeping them per client
//! rather than per caller gives no caller more than it could get. Handles are never reused and
//! a file's layout never changes, so what is kept cannot describe another file; a capability
//! close to its expiry is not used, and one the io servers refuse is dropped.

use crate::capability::{Capability, unix_now};
use crate::handle::Handle;
use crate::layout::Layout;
use std::collections::{HashMap, VecDeque};

/// Files kept at most, so that a client that opens many files holds a bounded record.
pub(super) const KEPT: usize = 4096;

/// Seconds before its expiry from which a capability is no longer used: a request sent with
/// it could arrive after it.
const EXPIRY_MARGIN_S: u64 = 30;

#[derive(Debug, Default)]
pub(super) struct SizeCaps {
    by_handle: HashMap<Handle, Kept>,
    /// Handles in the order they were first kept, with the tick they were kept at: the oldest
    /// goes first when the record is full. An entry whose tick no longer matches was dropped.
    order: VecDeque<(Handle, u64)>,
    tick: u64,
}

#[derive(Debug)]
struct Kept {
    layout: Layout,
    cap: Capability,
    tick: u64,
}

impl SizeCaps {
    /// Keeps `cap` (for `layout`'s file), replacing what was kept for the file.
    pub(super) fn keep(&mut self, layout: Layout, cap: &Capability) {
        let h = cap.handle;
        if let Some(k) = self.by_handle.get_mut(&h) {
            k.layout = layout;
            k.cap = cap.clone();
            return;
        }
        self.tick += 1;
        self.by_handle.insert(h, Kept { layout, cap: cap.clone(), tick: self.tick });
        self.order.push_back((h, self.tick));
        while self.order.len() > KEPT {
            if let Some((old, tick)) = self.order.pop_front()
                && self.by_handle.get(&old).is_some_and(|k| k.tick == tick)
            {
                self.by_handle.remove(&old);
            }
        }
    }

    /// `h`'s layout and a capability to ask its sizes with, if one is kept and not about to
    /// expire.
    pub(super) fn get(&self, h: Handle) -> Option<(Layout, Capability)> {
        let k = self.by_handle.get(&h)?;
        (unix_now().saturating_add(EXPIRY_MARGIN_S) < k.cap.expiry).then(|| (k.layout, k.cap.clone()))
    }

    /// Drops what is kept for `h` (its capability was refused, or the file is gone).
    pub(super) fn forget(&mut self, h: Handle) {
        self.by_handle.remove(&h);
    }

    /// Files kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_handle.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::Rights;

    fn cap(h: u64, expiry: u64) -> Capability {
        Capability { handle: Handle(h), rights: Rights::NONE, expiry, nonce: h, mac: [0; 32] }
    }

    const LAYOUT: Layout = Layout { base: 0, pcount: 4, ssize: 65536 };

    #[test]
    fn the_record_holds_at_most_kept_files_dropping_the_oldest() {
        let mut s = SizeCaps::default();
        let later = unix_now() + 3600;
        for h in 0..(KEPT as u64 + 100) {
            s.keep(LAYOUT, &cap(h, later));
        }
        assert_eq!(s.len(), KEPT);
        assert!(s.order.len() <= KEPT);
        assert!(s.get(Handle(0)).is_none(), "the oldest went first");
        assert!(s.get(Handle(KEPT as u64 + 99)).is_some());
    }

    #[test]
    fn forgotten_and_kept_again_a_file_is_not_dropped_by_its_old_place() {
        let mut s = SizeCaps::default();
        let later = unix_now() + 3600;
        s.keep(LAYOUT, &cap(7, later));
        s.forget(Handle(7));
        assert!(s.get(Handle(7)).is_none());
        s.keep(LAYOUT, &cap(7, later));
        for h in 100..(100 + KEPT as u64 - 1) {
            s.keep(LAYOUT, &cap(h, later));
        }
        // The first place of handle 7 left the line; its second place has not.
        assert!(s.get(Handle(7)).is_some());
        assert!(s.order.len() <= KEPT);
    }

    #[test]
    fn a_capability_about_to_expire_is_not_used() {
        let mut s = SizeCaps::default();
        s.keep(LAYOUT, &cap(1, unix_now() + 5));
        assert!(s.get(Handle(1)).is_none());
        s.keep(LAYOUT, &cap(1, unix_now() + 3600));
        assert!(s.get(Handle(1)).is_some(), "a fresh capability replaces it");
    }
}

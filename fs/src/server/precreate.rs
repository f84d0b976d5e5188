//! The meta server's files made ahead: handles whose objects exist on every io server, for
//! creates to take (see `meta::pool` for how the store keeps them, and `server::meta` for
//! the thread that makes them).
//!
//! Only the meta server's memory knows which reserved handles have all their objects: a
//! handle enters [`Precreated`] after every io server has made its object durably, and leaves
//! it for one create.

use crate::proto::Handle;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Handles ready to be taken, and the wish for more.
#[derive(Debug)]
pub(super) struct Precreated {
    /// How many to keep ready (0: none; every create makes its own objects).
    target: usize,
    ready: Mutex<Vec<Handle>>,
    /// Signalled when the ready count falls to the refill mark.
    low: Condvar,
}

impl Precreated {
    pub(super) fn new(target: usize) -> Self {
        Precreated { target, ready: Mutex::new(Vec::new()), low: Condvar::new() }
    }

    /// One ready handle, if any.
    pub(super) fn take(&self) -> Option<Handle> {
        let mut ready = crate::lock(&self.ready);
        let h = ready.pop();
        if h.is_some() && ready.len() == self.refill_mark() {
            self.low.notify_one();
        }
        h
    }

    /// Returns a handle a create took but did not use.
    pub(super) fn put_back(&self, h: Handle) {
        crate::lock(&self.ready).push(h);
    }

    /// Handles whose objects every io server has made.
    pub(super) fn add(&self, hs: impl IntoIterator<Item = Handle>) {
        crate::lock(&self.ready).extend(hs);
    }

    /// How many are ready.
    pub(super) fn ready(&self) -> usize {
        crate::lock(&self.ready).len()
    }

    /// How many to make now: enough to fill up once at most half are left, else none.
    pub(super) fn wanted(&self) -> usize {
        let n = crate::lock(&self.ready).len();
        if n > self.refill_mark() { 0 } else { self.target - n }
    }

    /// Waits until creates have taken enough to want a refill, or `timeout` passes.
    pub(super) fn wait_low(&self, timeout: Duration) {
        let ready = crate::lock(&self.ready);
        let mark = self.refill_mark();
        let _unused = self.low.wait_timeout_while(ready, timeout, |r| r.len() > mark);
    }

    fn refill_mark(&self) -> usize {
        self.target / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_from_half_empty_to_full() {
        let p = Precreated::new(4);
        assert_eq!(p.wanted(), 4);
        p.add((1..=4).map(Handle));
        assert_eq!((p.wanted(), crate::lock(&p.ready).len()), (0, 4));
        assert_eq!(p.take(), Some(Handle(4)));
        assert_eq!(p.wanted(), 0);
        assert_eq!(p.take(), Some(Handle(3)));
        assert_eq!(p.wanted(), 2);
        p.put_back(Handle(3));
        assert_eq!(p.wanted(), 0);
        // Waiting while above the mark times out; at the mark it returns at once.
        p.wait_low(Duration::from_millis(1));
        p.take();
        p.wait_low(Duration::from_secs(3600));
        assert_eq!(p.take(), Some(Handle(2)));
        assert_eq!(p.take(), Some(Handle(1)));
        assert_eq!(p.take(), None);
    }

    #[test]
    fn none_kept_when_the_target_is_zero() {
        let p = Precreated::new(0);
        assert_eq!(p.wanted(), 0);
        assert_eq!(p.take(), None);
    }
}

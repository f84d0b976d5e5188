//! Page pinning for registrations: long-term pins through io_uring (the kernel call
//! `ibv_reg_mr` makes, see [`super::uring`]) where the kernel allows, else `mlock`.
//!
//! `mlock` does not nest: one `munlock` unlocks a page however many times it was locked. Two
//! registrations that share a page (overlapping regcache entries, or neighbours that meet inside
//! a page) must therefore be counted, or deregistering one would silently unpin the other.
//! This process-wide table keeps disjoint page intervals with a count each, `mlock`s only
//! intervals going from 0 to 1 and `munlock`s only those going back to 0.

use std::collections::BTreeMap;
use std::io;
use std::sync::Mutex;

use super::{PinMethod, sys, uring};

/// Pages held for one registration.
#[derive(Debug)]
pub(crate) enum Pinned {
    /// Locked with `mlock`: the page-aligned `[start, end)` in the counted table.
    Locked(u64, u64),
    /// Pinned through io_uring fixed-buffer slots.
    Fixed(uring::FixedPin),
}

/// Resolves [`PinMethod::Auto`] to what this process can use.
pub(crate) fn resolve(method: PinMethod) -> PinMethod {
    match method {
        PinMethod::Auto if uring::available().is_ok() => PinMethod::IoUring,
        PinMethod::Auto => PinMethod::Mlock,
        m => m,
    }
}

/// Pins the pages under `[addr, addr + len)` with `method`. io_uring refusals (a kernel that
/// cannot, or memory it will not pin long-term such as a disk file's writable shared
/// mapping) fall back to `mlock`, which reports limits as before.
pub(crate) fn pin_range(addr: u64, len: u64, method: PinMethod) -> io::Result<Pinned> {
    if resolve(method) == PinMethod::IoUring {
        match uring::pin(addr, len) {
            Ok(p) => return Ok(Pinned::Fixed(p)),
            Err(err) => tracing::debug!(%err, addr, len, "softib: io_uring pin refused, using mlock"),
        }
    }
    let (start, end) = page_span(addr, len)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "registration range overflows"))?;
    pin(start, end).map(|()| Pinned::Locked(start, end))
}

/// Releases what [`pin_range`] pinned.
pub(crate) fn release(p: Pinned) {
    match p {
        Pinned::Locked(start, end) => unpin(start, end),
        Pinned::Fixed(f) => uring::unpin(f),
    }
}

/// Disjoint `[start, end)` page-aligned intervals → pin count (≥ 1).
#[derive(Debug, Default)]
struct PinTable {
    map: BTreeMap<u64, (u64, u32)>,
}

static PINS: Mutex<PinTable> = Mutex::new(PinTable { map: BTreeMap::new() });

/// Page-aligned cover of `[addr, addr + len)`.
fn page_span(addr: u64, len: u64) -> Option<(u64, u64)> {
    let page = sys::page_size() as u64;
    let start = addr - addr % page;
    let end = addr.checked_add(len)?.checked_next_multiple_of(page)?;
    Some((start, end))
}

/// `mlock`s `[start, end)` (page-aligned), counted. On failure nothing stays pinned by this call.
fn pin(start: u64, end: u64) -> io::Result<()> {
    let mut t = PINS.lock().unwrap_or_else(|p| p.into_inner());
    t.split_at(start);
    t.split_at(end);
    // Lock the gaps first (the only step that can fail), then bump the counts.
    let gaps = t.gaps(start, end);
    let mut locked = Vec::with_capacity(gaps.len());
    for &(s, e) in &gaps {
        if let Err(err) = sys::mlock(s as usize, (e - s) as usize) {
            for &(s, e) in &locked {
                let _ = sys::munlock(s as usize, (e - s) as usize);
            }
            t.merge_all();
            return Err(err);
        }
        locked.push((s, e));
    }
    for (_, v) in t.map.range_mut(start..end) {
        v.1 += 1;
    }
    for (s, e) in gaps {
        t.map.insert(s, (e, 1));
    }
    t.merge_all();
    Ok(())
}

/// Unlocks `[start, end)` locked earlier with [`pin`].
fn unpin(start: u64, end: u64) {
    let mut t = PINS.lock().unwrap_or_else(|p| p.into_inner());
    t.split_at(start);
    t.split_at(end);
    let mut zero = Vec::new();
    for (&s, v) in t.map.range_mut(start..end) {
        v.1 = v.1.saturating_sub(1);
        if v.1 == 0 {
            zero.push((s, v.0));
        }
    }
    for (s, e) in zero {
        t.map.remove(&s);
        if let Err(err) = sys::munlock(s as usize, (e - s) as usize) {
            tracing::debug!(%err, "munlock failed");
        }
    }
    t.merge_all();
}

/// Pin count of the page at `addr` (tests).
#[cfg(test)]
pub(crate) fn count_at(addr: u64) -> u32 {
    let t = PINS.lock().unwrap_or_else(|p| p.into_inner());
    t.map.range(..=addr).next_back().filter(|(_, (e, _))| addr < *e).map_or(0, |(_, (_, c))| *c)
}

impl PinTable {
    /// Splits the interval containing `at` (if any) so that `at` is an interval boundary.
    fn split_at(&mut self, at: u64) {
        let found = self.map.range(..at).next_back().map(|(&s, &(e, c))| (s, e, c));
        if let Some((s, e, c)) = found
            && s < at
            && at < e
        {
            self.map.insert(s, (at, c));
            self.map.insert(at, (e, c));
        }
    }

    /// Sub-ranges of `[start, end)` not covered by any interval.
    fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut cur = start;
        for (&s, &(e, _)) in self.map.range(start..end) {
            if s > cur {
                gaps.push((cur, s));
            }
            cur = cur.max(e);
        }
        if cur < end {
            gaps.push((cur, end));
        }
        gaps
    }

    /// Joins adjacent intervals with equal counts, keeping the map small.
    fn merge_all(&mut self) {
        let mut out: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut last: Option<(u64, u64, u32)> = None;
        for (&s, &(e, c)) in &self.map {
            match last {
                Some((ls, le, lc)) if le == s && lc == c => last = Some((ls, e, c)),
                Some((ls, le, lc)) => {
                    out.insert(ls, (le, lc));
                    last = Some((s, e, c));
                }
                None => last = Some((s, e, c)),
            }
        }
        if let Some((s, e, c)) = last {
            out.insert(s, (e, c));
        }
        self.map = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_pins_are_counted() {
        let page = sys::page_size();
        let buf = vec![0u8; page * 8];
        let base = (buf.as_ptr() as u64).next_multiple_of(page as u64);
        let p = page as u64;
        pin(base, base + 4 * p).unwrap();
        pin(base + 2 * p, base + 6 * p).unwrap();
        let counts: Vec<u32> = (0..7).map(|i| count_at(base + i * p)).collect();
        assert_eq!(counts, [1, 1, 2, 2, 1, 1, 0]);
        unpin(base, base + 4 * p);
        // Pages 2..6 are still held by the second registration.
        let counts: Vec<u32> = (0..7).map(|i| count_at(base + i * p)).collect();
        assert_eq!(counts, [0, 0, 1, 1, 1, 1, 0]);
        unpin(base + 2 * p, base + 6 * p);
        assert_eq!(count_at(base + 3 * p), 0);
        drop(buf);
    }

    #[test]
    fn gaps_and_splits() {
        let mut t = PinTable::default();
        t.map.insert(10, (20, 1));
        t.map.insert(30, (40, 2));
        assert_eq!(t.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        t.split_at(15);
        assert_eq!(t.map.get(&10), Some(&(15, 1)));
        assert_eq!(t.map.get(&15), Some(&(20, 1)));
        t.merge_all();
        assert_eq!(t.map.get(&10), Some(&(20, 1)));
    }
}

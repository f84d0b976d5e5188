//! The cache proper: slab of entries, start-ordered index, intrusive LRU.

use std::collections::BTreeMap;
use std::fmt;

use super::watch::{Monitor, Reader, Unmapped};
use super::{Origin, RegCacheConfig, RegCacheError, RegError, RegRef, RegStats, Registrar, Span};
use crate::buffers::buf::MemKeys;
use crate::error::Result;
use crate::types::Access;

/// "No slot" in the intrusive LRU links.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the index; lookups may return it.
    Live,
    /// Out of the index (invalidated, or superseded by a larger registration) but still
    /// registered for its current users; deregistered at its last release.
    Retired,
}

struct Entry<H> {
    start: usize,
    end: usize,
    keys: MemKeys,
    handle: H,
    refs: u32,
    state: State,
    /// Stays registered after its last release (owned memory, or foreign memory when the
    /// configuration opts in).
    retain: bool,
    /// Lent memory ([`Origin::Foreign`]).
    foreign: bool,
    /// LRU links; meaningful only while `in_lru`.
    prev: u32,
    next: u32,
    in_lru: bool,
}

struct Slot<H> {
    generation: u32,
    entry: Option<Entry<H>>,
}

/// The pin-down cache. See the [module documentation](crate::internals::regcache) for the policy.
///
/// # Examples
///
/// ```
/// use ionet::MemKeys;
/// use ionet::internals::regcache::{Origin, RegCache, RegCacheConfig, RegError, Registrar};
/// use ionet::types::Access;
///
/// /// A registrar that pretends to register (a verbs provider in the engine).
/// struct Noop(u32);
/// impl Registrar for Noop {
///     type Handle = u32;
///     fn register(&mut self, _a: usize, _l: usize, _x: Access) -> Result<(u32, MemKeys), RegError> {
///         self.0 += 1;
///         Ok((self.0, MemKeys { lkey: self.0, rkey: self.0 }))
///     }
///     fn deregister(&mut self, _h: u32) {}
/// }
///
/// let mut cache = RegCache::new(Noop(0), RegCacheConfig::default()).unwrap();
/// let r = cache.acquire(0x10000, 8192, Access::READ, Origin::Owned).unwrap();
/// cache.release(r).unwrap();
/// // Still registered (lazy deregistration): a sub-range hits without registering.
/// assert!(cache.check_if_registered(0x10100, 100).is_some());
/// let r = cache.acquire(0x10100, 100, Access::READ, Origin::Owned).unwrap();
/// assert_eq!(cache.stats().registrations, 1);
/// cache.release(r).unwrap();
/// ```
pub struct RegCache<R: Registrar> {
    registrar: R,
    cfg: RegCacheConfig,
    slots: Vec<Slot<R::Handle>>,
    free_slots: Vec<u32>,
    /// Live entries by start address. No entry contains another (module docs).
    index: BTreeMap<usize, u32>,
    /// Least recently used unused entry (evicted first).
    lru_head: u32,
    /// Most recently released unused entry.
    lru_tail: u32,
    stats: RegStats,
    /// The memory monitor and this cache's queue of unmapped ranges, when lent memory is
    /// kept registered only while watched.
    watch: Option<(std::sync::Arc<Monitor>, Reader)>,
}

impl<R: Registrar> fmt::Debug for RegCache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache").field("cfg", &self.cfg).field("stats", &self.stats).finish_non_exhaustive()
    }
}

impl<R: Registrar> RegCache<R> {
    /// A cache that registers through `registrar` under the limits of `cfg`.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Misuse`] when `cfg` fails [`RegCacheConfig::validate`].
    pub fn new(registrar: R, cfg: RegCacheConfig) -> Result<Self> {
        cfg.validate()?;
        let watch = if cfg.watched {
            Monitor::get().map(|m| {
                let r = m.reader();
                (m, r)
            })
        } else {
            None
        };
        Ok(RegCache {
            watch,
            registrar,
            cfg,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: BTreeMap::new(),
            lru_head: NIL,
            lru_tail: NIL,
            stats: RegStats::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &RegCacheConfig {
        &self.cfg
    }

    /// Current counters.
    pub fn stats(&self) -> RegStats {
        self.stats
    }

    /// The registrar (for its own counters).
    pub fn registrar(&self) -> &R {
        &self.registrar
    }

    /// The registrar, mutably (e.g. to inject faults in tests).
    pub fn registrar_mut(&mut self) -> &mut R {
        &mut self.registrar
    }

    /// A reference to a registration covering `[addr, addr + len)`, registering it if no
    /// cached entry covers it.
    ///
    /// # Errors
    ///
    /// - [`RegCacheError::Misuse`]: `len == 0`, the range wraps, or `access` asks for rights
    ///   outside [`RegCacheConfig::access`].
    /// - [`RegCacheError::TooLarge`]: the range alone exceeds the pinned-bytes limit.
    /// - [`RegCacheError::Limit`]: no room under the limits and nothing unused to evict.
    /// - [`RegCacheError::OutOfMemory`]: `ENOMEM` persisted after flushing unused entries.
    /// - [`RegCacheError::Registrar`]: any other registrar failure.
    pub fn acquire(
        &mut self,
        addr: usize,
        len: usize,
        access: Access,
        origin: Origin,
    ) -> Result<RegRef, RegCacheError> {
        let end = self.check_request(addr, len, access)?;
        self.forget_unmapped();
        if let Some(r) = self.hit(addr, end)? {
            self.stats.hits += 1;
            return Ok(r);
        }
        self.stats.misses += 1;
        self.register_new(addr, end, origin)
    }

    /// Whether lent memory stays registered after its operation (watched, or at the
    /// application's risk).
    pub fn keeps_foreign(&self) -> bool {
        if self.cfg.watched { self.watch.is_some() } else { self.cfg.cache_foreign }
    }

    /// Invalidates what the memory monitor saw unmapped, remapped or discarded; before every
    /// lookup, so no lookup after such an event returns the old registration.
    fn forget_unmapped(&mut self) {
        let Some((m, reader)) = &mut self.watch else { return };
        match m.read(reader) {
            Unmapped::Ranges([]) => {}
            Unmapped::Ranges(gone) => {
                let gone = gone.to_vec();
                for (start, end) in gone {
                    self.invalidate(start, end.saturating_sub(start));
                }
            }
            Unmapped::Overrun => {
                tracing::debug!("memory monitor log overrun: forgetting every lent registration");
                self.invalidate_foreign();
            }
        }
    }

    /// Kills every live entry of lent memory.
    fn invalidate_foreign(&mut self) {
        let foreign: Vec<(usize, usize)> = self
            .index
            .values()
            .map(|&slot| self.entry(slot))
            .filter(|e| e.foreign)
            .map(|e| (e.start, e.end))
            .collect();
        for (start, end) in foreign {
            self.invalidate(start, end - start);
        }
    }

    /// Like [`RegCache::acquire`], but on a miss registers (up to) `parent` — the allocation the
    /// buffer belongs to — instead of only the buffer, so later pieces of the same allocation
    /// hit. List I/O passes the whole array as the parent of each row (as in PVFS over InfiniBand).
    ///
    /// The hint is advisory: when `parent` alone exceeds the pinned-bytes limit, only the
    /// buffer is registered.
    ///
    /// # Errors
    ///
    /// As [`RegCache::acquire`]; also [`RegCacheError::Misuse`] when `parent` does not contain
    /// `[addr, addr + len)`.
    pub fn acquire_hinted(
        &mut self,
        addr: usize,
        len: usize,
        parent: Span,
        access: Access,
        origin: Origin,
    ) -> Result<RegRef, RegCacheError> {
        let end = self.check_request(addr, len, access)?;
        let pend = parent.end().ok_or(RegCacheError::Misuse("hint wraps the address space"))?;
        if parent.addr > addr || pend < end {
            return Err(RegCacheError::Misuse("hint does not contain the buffer"));
        }
        self.forget_unmapped();
        if let Some(r) = self.hit(addr, end)? {
            self.stats.hits += 1;
            return Ok(r);
        }
        self.stats.misses += 1;
        if parent.len <= self.cfg.max_pinned_bytes {
            match self.register_new(parent.addr, pend, origin) {
                Err(RegCacheError::TooLarge { .. } | RegCacheError::Limit { .. }) => {}
                other => return other,
            }
        }
        // The parent does not fit (alone, or next to what is in use): the buffer alone may.
        self.register_new(addr, end, origin)
    }

    /// A reference to a cached registration covering the range, or `None`; **never
    /// registers**. The fast-RDMA path uses it to send straight from a registered user buffer
    /// and holds the reference until the send completes.
    pub fn acquire_if_registered(&mut self, addr: usize, len: usize, access: Access) -> Option<RegRef> {
        let end = self.check_request(addr, len, access).ok()?;
        self.forget_unmapped();
        match self.hit(addr, end) {
            Ok(Some(r)) => {
                self.stats.probe_hits += 1;
                Some(r)
            }
            _ => {
                self.stats.probe_misses += 1;
                None
            }
        }
    }

    /// The keys of a cached registration covering `[addr, addr + len)`, or `None`; **never
    /// registers** and changes nothing (PVFS over InfiniBand's `check_if_registered`).
    ///
    /// The keys are only guaranteed valid until the next `&mut` call on the cache, which may
    /// evict the entry; to use them for a transfer take a reference with
    /// [`RegCache::acquire_if_registered`] instead.
    pub fn check_if_registered(&self, addr: usize, len: usize) -> Option<MemKeys> {
        let end = addr.checked_add(len).filter(|_| len > 0)?;
        let slot = self.covering(addr, end)?;
        Some(self.entry(slot).keys)
    }

    /// Gives back a reference. At the last release an entry becomes the most recently used
    /// unused entry — or is deregistered at once if it was invalidated, superseded, or is
    /// foreign memory that is not cached.
    ///
    /// # Errors
    ///
    /// [`RegCacheError::Misuse`] when the token does not name a live reference of this cache.
    pub fn release(&mut self, r: RegRef) -> Result<(), RegCacheError> {
        let slot = r.slot;
        let valid = self
            .slots
            .get(slot as usize)
            .is_some_and(|s| s.generation == r.generation && s.entry.as_ref().is_some_and(|e| e.refs > 0));
        if !valid {
            return Err(RegCacheError::Misuse("release of a RegRef this cache does not hold"));
        }
        let e = self.entry_mut(slot);
        e.refs -= 1;
        if e.refs > 0 {
            return Ok(());
        }
        let (state, retain, start) = (e.state, e.retain, e.start);
        self.stats.in_use -= 1;
        if state == State::Live && retain {
            self.lru_push_back(slot);
        } else {
            if state == State::Live {
                self.index.remove(&start);
            }
            self.deregister(slot);
        }
        Ok(())
    }

    /// Kills every live entry overlapping `[addr, addr + len)`: such entries are never returned
    /// by a lookup again, and are deregistered now if unused, else at their last release.
    /// Returns how many entries were killed.
    ///
    /// Call it before memory that may be cached is freed, unmapped or remapped. Overlapping any
    /// byte of an entry kills all of it (a partial `munmap` invalidates the whole region).
    pub fn invalidate(&mut self, addr: usize, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let end = addr.saturating_add(len);
        let victims = self.overlapping(addr, end, false);
        for &slot in &victims {
            let e = self.entry_mut(slot);
            let (start, refs) = (e.start, e.refs);
            self.index.remove(&start);
            if refs == 0 {
                self.lru_unlink(slot);
                self.deregister(slot);
            } else {
                self.entry_mut(slot).state = State::Retired;
            }
        }
        if !victims.is_empty() {
            tracing::debug!(addr, len, killed = victims.len(), "regcache invalidate");
        }
        self.stats.invalidations += victims.len() as u64;
        victims.len()
    }

    /// Deregisters every unused entry; returns how many. Entries in use are untouched.
    pub fn flush(&mut self) -> usize {
        self.stats.flushes += 1;
        let mut n = 0;
        while self.lru_head != NIL {
            self.evict(self.lru_head);
            n += 1;
        }
        n
    }

    // ---- internals ------------------------------------------------------------------------

    fn check_request(&self, addr: usize, len: usize, access: Access) -> Result<usize, RegCacheError> {
        if len == 0 {
            return Err(RegCacheError::Misuse("zero-length registration"));
        }
        if !self.cfg.access.contains(access) {
            return Err(RegCacheError::Misuse("access rights outside the cache's configured access"));
        }
        addr.checked_add(len).ok_or(RegCacheError::Misuse("range wraps the address space"))
    }

    /// The live entry covering `[start, end)`, if any. O(log n): see the module's
    /// implementation notes for why checking one candidate is enough.
    fn covering(&self, start: usize, end: usize) -> Option<u32> {
        let (_, &slot) = self.index.range(..=start).next_back()?;
        (self.entry(slot).end >= end).then_some(slot)
    }

    /// Takes a reference on the entry covering the range, if any.
    fn hit(&mut self, start: usize, end: usize) -> Result<Option<RegRef>, RegCacheError> {
        let Some(slot) = self.covering(start, end) else { return Ok(None) };
        let e = self.entry_mut(slot);
        e.refs = e.refs.checked_add(1).ok_or(RegCacheError::Misuse("2^32 references to one entry"))?;
        if e.refs == 1 {
            self.stats.in_use += 1;
            self.lru_unlink(slot);
        }
        Ok(Some(self.token(slot)))
    }

    /// Registers `[start, end)` (rounded to the alignment and merged with unused neighbours)
    /// and returns a reference to it.
    fn register_new(&mut self, start: usize, end: usize, origin: Origin) -> Result<RegRef, RegCacheError> {
        let (s, e) = self.aligned(start, end)?;
        let max = self.cfg.max_pinned_bytes;
        if e - s > max {
            return Err(RegCacheError::TooLarge { len: e - s, max });
        }
        let retain = origin == Origin::Owned || self.keeps_foreign();
        // An entry that will not be kept does not merge: it would take its cached neighbours
        // down with it at its last release.
        let merge = self.cfg.merge && retain;
        let (ms, me) = if merge { self.merged_range(s, e) } else { (s, e) };
        let (s, e) = if me - ms <= max { (ms, me) } else { (s, e) };
        // Absorb the unused entries inside the new range: merged ones, and ones the new range
        // contains (which would break the no-containment invariant if kept).
        for slot in self.overlapping(s, e, merge) {
            let en = self.entry(slot);
            if en.refs == 0 && en.start >= s && en.end <= e {
                self.stats.merges += 1;
                self.evict_quiet(slot);
            }
        }
        let len = e - s;
        self.make_room(len)?;
        // Watched before it is registered, so an unmap between the two cannot be missed.
        let retain = retain
            && (origin == Origin::Owned
                || !self.cfg.watched
                || self.watch.as_ref().is_some_and(|(m, _)| m.watch(s, len)));
        let access = self.cfg.access;
        let (handle, keys) = match self.registrar.register(s, len, access) {
            Ok(ok) => ok,
            Err(RegError::OutOfMemory) if self.lru_head != NIL => {
                tracing::debug!(
                    addr = s,
                    len,
                    "registration hit ENOMEM; flushing unused entries and retrying"
                );
                self.flush();
                match self.registrar.register(s, len, access) {
                    Ok(ok) => ok,
                    Err(RegError::OutOfMemory) => return Err(RegCacheError::OutOfMemory),
                    Err(err) => return Err(RegCacheError::Registrar(err)),
                }
            }
            Err(RegError::OutOfMemory) => return Err(RegCacheError::OutOfMemory),
            Err(err) => return Err(RegCacheError::Registrar(err)),
        };
        self.stats.registrations += 1;
        self.stats.entries += 1;
        self.stats.bytes_pinned += len as u64;
        self.stats.in_use += 1;
        // In-use entries inside the new range are retired, not deregistered: their users keep
        // their keys, and the new entry serves every later lookup.
        for slot in self.overlapping(s, e, false) {
            let en = self.entry(slot);
            if en.start >= s && en.end <= e {
                let key = en.start;
                self.index.remove(&key);
                self.entry_mut(slot).state = State::Retired;
            }
        }
        let entry = Entry {
            start: s,
            end: e,
            keys,
            handle,
            refs: 1,
            state: State::Live,
            retain,
            foreign: origin == Origin::Foreign,
            prev: NIL,
            next: NIL,
            in_lru: false,
        };
        let slot = self.alloc_slot(entry);
        let displaced = self.index.insert(s, slot);
        debug_assert!(displaced.is_none(), "an entry with the same start was contained in the new one");
        Ok(self.token(slot))
    }

    fn aligned(&self, start: usize, end: usize) -> Result<(usize, usize), RegCacheError> {
        let mask = self.cfg.align - 1;
        let s = start & !mask;
        let e = end.checked_add(mask).ok_or(RegCacheError::Misuse("range wraps the address space"))? & !mask;
        Ok((s, e))
    }

    /// `[s, e)` grown over every unused entry it overlaps or touches, transitively.
    fn merged_range(&self, mut s: usize, mut e: usize) -> (usize, usize) {
        loop {
            let mut grown = false;
            for slot in self.overlapping(s, e, true) {
                let en = self.entry(slot);
                if en.refs == 0 && (en.start < s || en.end > e) {
                    s = s.min(en.start);
                    e = e.max(en.end);
                    grown = true;
                }
            }
            if !grown {
                return (s, e);
            }
        }
    }

    /// Live entries overlapping `[s, e)` (or touching it, with `adjacent`), in address order.
    /// O(log n + k): ends increase with starts, so the overlapping entries are contiguous in
    /// the index.
    fn overlapping(&self, s: usize, e: usize, adjacent: bool) -> Vec<u32> {
        let mut before: Vec<u32> = Vec::new();
        for (_, &slot) in self.index.range(..s).rev() {
            let end = self.entry(slot).end;
            if end > s || (adjacent && end == s) {
                before.push(slot);
            } else {
                break;
            }
        }
        before.reverse();
        let upper = if adjacent { std::ops::Bound::Included(e) } else { std::ops::Bound::Excluded(e) };
        before.extend(self.index.range((std::ops::Bound::Included(s), upper)).map(|(_, &slot)| slot));
        before
    }

    /// Evicts least recently used unused entries until one more entry of `len` bytes fits.
    fn make_room(&mut self, len: usize) -> Result<(), RegCacheError> {
        loop {
            let entries = self.stats.entries as usize;
            let pinned = self.stats.bytes_pinned as usize;
            if entries < self.cfg.max_entries && pinned.saturating_add(len) <= self.cfg.max_pinned_bytes {
                return Ok(());
            }
            if self.lru_head == NIL {
                return Err(RegCacheError::Limit { entries, pinned });
            }
            self.evict(self.lru_head);
        }
    }

    /// Deregisters an unused live entry, counting an eviction.
    fn evict(&mut self, slot: u32) {
        self.stats.evictions += 1;
        self.evict_quiet(slot);
    }

    fn evict_quiet(&mut self, slot: u32) {
        let start = self.entry(slot).start;
        self.index.remove(&start);
        self.lru_unlink(slot);
        self.deregister(slot);
    }

    /// Deregisters the entry in `slot` (already out of the index and the LRU) and frees the slot.
    fn deregister(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        // Local invariant: callers pass occupied slots only.
        let e = s.entry.take().expect("deregister of an empty slot");
        s.generation = s.generation.wrapping_add(1);
        self.free_slots.push(slot);
        self.stats.entries -= 1;
        self.stats.bytes_pinned -= (e.end - e.start) as u64;
        self.stats.deregistrations += 1;
        self.registrar.deregister(e.handle);
    }

    fn alloc_slot(&mut self, entry: Entry<R::Handle>) -> u32 {
        if let Some(slot) = self.free_slots.pop() {
            self.slots[slot as usize].entry = Some(entry);
            slot
        } else {
            // `max_entries` ≤ 2^24 bounds the slab well below `NIL`.
            let slot = self.slots.len() as u32;
            self.slots.push(Slot { generation: 0, entry: Some(entry) });
            slot
        }
    }

    fn token(&self, slot: u32) -> RegRef {
        let s = &self.slots[slot as usize];
        let e = self.entry(slot);
        RegRef { slot, generation: s.generation, keys: e.keys, start: e.start, end: e.end }
    }

    fn entry(&self, slot: u32) -> &Entry<R::Handle> {
        // Local invariant: the index, the LRU and live tokens only name occupied slots.
        self.slots[slot as usize].entry.as_ref().expect("empty regcache slot")
    }

    fn entry_mut(&mut self, slot: u32) -> &mut Entry<R::Handle> {
        self.slots[slot as usize].entry.as_mut().expect("empty regcache slot")
    }

    fn lru_push_back(&mut self, slot: u32) {
        let tail = self.lru_tail;
        let e = self.entry_mut(slot);
        debug_assert!(!e.in_lru);
        e.in_lru = true;
        e.prev = tail;
        e.next = NIL;
        if tail == NIL {
            self.lru_head = slot;
        } else {
            self.entry_mut(tail).next = slot;
        }
        self.lru_tail = slot;
    }

    fn lru_unlink(&mut self, slot: u32) {
        let e = self.entry_mut(slot);
        if !e.in_lru {
            return;
        }
        e.in_lru = false;
        let (prev, next) = (e.prev, e.next);
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.entry_mut(prev).next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.entry_mut(next).prev = prev;
        }
    }

    /// Checks every structural invariant; used by the tests after each step.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        // Index: starts and ends strictly increasing (no containment), all live.
        let mut last: Option<(usize, usize)> = None;
        for (&start, &slot) in &self.index {
            let e = self.entry(slot);
            assert_eq!(e.start, start);
            assert_eq!(e.state, State::Live);
            assert!(e.start < e.end);
            if let Some((ls, le)) = last {
                assert!(ls < e.start && le < e.end, "entry [{ls},{le}) and [{},{}) nest", e.start, e.end);
            }
            last = Some((e.start, e.end));
        }
        // LRU: exactly the live, retained, unused entries, linked consistently.
        let mut n_lru = 0;
        let mut prev = NIL;
        let mut cur = self.lru_head;
        while cur != NIL {
            let e = self.entry(cur);
            assert!(e.in_lru && e.refs == 0 && e.state == State::Live && e.retain);
            assert_eq!(e.prev, prev);
            n_lru += 1;
            prev = cur;
            cur = e.next;
        }
        assert_eq!(self.lru_tail, prev);
        let (mut entries, mut bytes, mut in_use, mut unused) = (0u64, 0u64, 0u64, 0);
        for s in &self.slots {
            if let Some(e) = &s.entry {
                entries += 1;
                bytes += (e.end - e.start) as u64;
                if e.refs > 0 {
                    in_use += 1;
                    assert!(!e.in_lru);
                } else {
                    unused += 1;
                    assert!(e.state == State::Live && e.retain, "an unused entry must be cached");
                }
            }
        }
        assert_eq!(unused, n_lru);
        assert_eq!(entries, self.stats.entries);
        assert_eq!(bytes, self.stats.bytes_pinned);
        assert_eq!(in_use, self.stats.in_use);
        assert!(entries as usize <= self.cfg.max_entries);
        assert!(bytes as usize <= self.cfg.max_pinned_bytes);
    }
}

impl<R: Registrar> Drop for RegCache<R> {
    /// Deregisters everything, in use or not: outstanding [`RegRef`]s become meaningless.
    fn drop(&mut self) {
        for s in &mut self.slots {
            if let Some(e) = s.entry.take() {
                self.registrar.deregister(e.handle);
            }
        }
    }
}

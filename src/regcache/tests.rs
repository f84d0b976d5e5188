//! Behaviour tests for the pin-down cache with a counting fake registrar, and a proptest
//! model.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use proptest::prelude::*;

use super::*;

/// What the fake registrar has seen. Shared with the test through an `Rc` so it can be read
/// after the cache (which owns the registrar) is dropped.
#[derive(Debug, Default)]
struct FakeState {
    next: u32,
    /// Live registrations: handle → (addr, len, registration sequence number).
    live: BTreeMap<u32, (usize, usize, u64)>,
    registered: u64,
    deregistered: u64,
    /// Every `register` call, successful or not.
    calls: u64,
    /// The next this-many `register` calls fail with ENOMEM.
    oom: u32,
    /// The next `register` call fails with a hard error.
    hard_fail: bool,
}

#[derive(Debug, Clone, Default)]
struct Fake(Rc<RefCell<FakeState>>);

impl Fake {
    fn st(&self) -> std::cell::Ref<'_, FakeState> {
        self.0.borrow()
    }
}

impl Registrar for Fake {
    type Handle = u32;

    fn register(&mut self, addr: usize, len: usize, _access: Access) -> Result<(u32, MemKeys), RegError> {
        let mut st = self.0.borrow_mut();
        st.calls += 1;
        assert!(len > 0, "registrar asked for zero bytes");
        if st.oom > 0 {
            st.oom -= 1;
            return Err(RegError::OutOfMemory);
        }
        if std::mem::take(&mut st.hard_fail) {
            return Err(RegError::Failed(Error::misuse("fake hard failure")));
        }
        st.next += 1;
        let h = st.next;
        let seq = st.registered;
        st.live.insert(h, (addr, len, seq));
        st.registered += 1;
        Ok((h, MemKeys { lkey: h, rkey: h | 0x8000_0000 }))
    }

    fn deregister(&mut self, h: u32) {
        let mut st = self.0.borrow_mut();
        assert!(st.live.remove(&h).is_some(), "handle {h} deregistered twice or never registered");
        st.deregistered += 1;
    }
}

fn cache(cfg: RegCacheConfig) -> (RegCache<Fake>, Fake) {
    let fake = Fake::default();
    (RegCache::new(fake.clone(), cfg).unwrap(), fake)
}

const RW: Access = Access::READ_WRITE;
const OWN: Origin = Origin::Owned;

#[test]
fn hit_reuses_the_registration() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    let a = c.acquire(0x1000, 4096, RW, OWN).unwrap();
    let keys = a.keys();
    c.release(a).unwrap();
    assert_eq!(fake.st().live.len(), 1, "lazy deregistration keeps it");
    let b = c.acquire(0x1000, 4096, RW, OWN).unwrap();
    assert_eq!(b.keys(), keys);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.registrations), (1, 1, 1));
    assert_eq!(fake.st().calls, 1);
    c.release(b).unwrap();
    c.check_invariants();
}

#[test]
fn miss_registers_disjoint_ranges_separately() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    let a = c.acquire(0x1000, 100, RW, OWN).unwrap();
    let b = c.acquire(0x9000, 100, RW, OWN).unwrap();
    assert_ne!(a.keys(), b.keys());
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.registrations, s.entries), (0, 2, 2, 2));
    assert_eq!(fake.st().live.len(), 2);
    c.release(a).unwrap();
    c.release(b).unwrap();
    c.check_invariants();
}

#[test]
fn covering_lookup_hits_sub_ranges_only() {
    let (mut c, _fake) = cache(RegCacheConfig::default());
    let a = c.acquire(0x1000, 0x2000, RW, OWN).unwrap();
    // Fully inside, touching either end: hits.
    for (addr, len) in [(0x1800, 0x100), (0x1000, 1), (0x2fff, 1), (0x1000, 0x2000)] {
        let r = c.acquire(addr, len, RW, OWN).unwrap();
        assert_eq!(r.keys(), a.keys(), "[{addr:#x}+{len:#x}) is covered");
        c.release(r).unwrap();
    }
    assert_eq!(c.stats().hits, 4);
    // Sticking out on either side: not covered.
    assert!(c.check_if_registered(0x2fff, 2).is_none());
    assert!(c.check_if_registered(0xfff, 2).is_none());
    c.release(a).unwrap();
    c.check_invariants();
}

#[test]
fn new_registration_merges_unused_neighbours() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    let a = c.acquire(0, 100, RW, OWN).unwrap();
    c.release(a).unwrap();
    let b = c.acquire(300, 100, RW, OWN).unwrap();
    c.release(b).unwrap();
    // Touches [0,100) and overlaps [300,400): one merged registration [0,400).
    let m = c.acquire(100, 250, RW, OWN).unwrap();
    assert_eq!(m.region(), Span::new(0, 400));
    let s = c.stats();
    assert_eq!((s.entries, s.merges, s.registrations), (1, 2, 3));
    assert_eq!(fake.st().live.len(), 1);
    assert_eq!(c.check_if_registered(50, 300), Some(m.keys()));
    c.release(m).unwrap();
    c.check_invariants();
}

#[test]
fn merge_never_deregisters_entries_in_use() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    let inner = c.acquire(200, 100, RW, OWN).unwrap();
    let partial = c.acquire(900, 200, RW, OWN).unwrap();
    // Contains `inner` and overlaps `partial`, both in use.
    let big = c.acquire(100, 900, RW, OWN).unwrap();
    assert_eq!(big.region(), Span::new(100, 900), "in-use entries are not merged in");
    let (h_inner, h_partial) = (inner.keys().lkey, partial.keys().lkey);
    assert!(fake.st().live.contains_key(&h_inner) && fake.st().live.contains_key(&h_partial));
    // `inner` is retired: lookups now find `big`; `partial` still serves its own range.
    assert_eq!(c.check_if_registered(200, 100), Some(big.keys()));
    assert_eq!(c.check_if_registered(1000, 100), Some(partial.keys()));
    c.check_invariants();
    c.release(inner).unwrap();
    assert!(!fake.st().live.contains_key(&h_inner), "retired entry deregistered at its last release");
    c.release(partial).unwrap();
    c.release(big).unwrap();
    assert!(fake.st().live.contains_key(&h_partial), "partial overlap stays cached");
    c.check_invariants();
}

#[test]
fn merging_can_be_disabled() {
    let (mut c, _fake) = cache(RegCacheConfig::default().merge(false));
    let a = c.acquire(0, 100, RW, OWN).unwrap();
    c.release(a).unwrap();
    let b = c.acquire(100, 100, RW, OWN).unwrap();
    assert_eq!(b.region(), Span::new(100, 100));
    assert_eq!(c.stats().entries, 2);
    c.release(b).unwrap();
    c.check_invariants();
}

#[test]
fn lru_evicts_least_recently_released_under_entry_limit() {
    let (mut c, fake) = cache(RegCacheConfig::default().max_entries(3).merge(false));
    for i in 0..3 {
        let r = c.acquire(i * 0x1000, 100, RW, OWN).unwrap();
        c.release(r).unwrap();
    }
    // Touch the oldest so entry 1 becomes the least recently used.
    let r = c.acquire(0, 100, RW, OWN).unwrap();
    c.release(r).unwrap();
    let r = c.acquire(0x9000, 100, RW, OWN).unwrap();
    assert_eq!(c.stats().evictions, 1);
    assert!(c.check_if_registered(0x1000, 100).is_none(), "LRU entry evicted");
    assert!(c.check_if_registered(0, 100).is_some());
    assert!(c.check_if_registered(0x2000, 100).is_some());
    assert_eq!(fake.st().live.len(), 3);
    c.release(r).unwrap();
    c.check_invariants();
}

#[test]
fn lru_evicts_under_byte_limit() {
    let (mut c, fake) = cache(RegCacheConfig::default().max_pinned_bytes(1000).merge(false));
    for i in 0..4 {
        let r = c.acquire(i * 0x1000, 250, RW, OWN).unwrap();
        c.release(r).unwrap();
    }
    assert_eq!(c.stats().bytes_pinned, 1000);
    // 600 more bytes: the three oldest entries (750 bytes) go, in LRU order.
    let r = c.acquire(0x9000, 600, RW, OWN).unwrap();
    assert_eq!(c.stats().evictions, 3);
    assert_eq!(c.stats().bytes_pinned, 850);
    assert!(c.check_if_registered(0x3000, 250).is_some(), "most recently used survives");
    assert!(c.check_if_registered(0x2000, 250).is_none());
    assert_eq!(fake.st().live.len(), 2);
    c.release(r).unwrap();
    c.check_invariants();
}

#[test]
fn entries_in_use_are_never_evicted() {
    let (mut c, fake) = cache(RegCacheConfig::default().max_entries(2).max_pinned_bytes(10_000));
    let a = c.acquire(0, 100, RW, OWN).unwrap();
    let b = c.acquire(0x1000, 100, RW, OWN).unwrap();
    let calls = fake.st().calls;
    // Over the entry limit with everything in use: fails cleanly, registers nothing.
    let err = c.acquire(0x2000, 100, RW, OWN).unwrap_err();
    assert!(matches!(err, RegCacheError::Limit { entries: 2, pinned: 200 }), "{err:?}");
    assert_eq!(fake.st().calls, calls);
    assert_eq!(fake.st().live.len(), 2);
    // Same under the byte limit.
    c.release(b).unwrap();
    let err = c.acquire(0x4000, 9_950, RW, OWN).unwrap_err();
    assert!(matches!(err, RegCacheError::Limit { .. }), "{err:?}");
    assert!(c.check_if_registered(0, 100).is_some(), "in-use entry kept");
    // Releasing `b` made it evictable: the failed attempt above evicted it (it still could not
    // make room for 9 950 bytes next to `a`), so a small registration now fits.
    assert_eq!(c.stats().evictions, 1);
    assert!(c.check_if_registered(0x1000, 100).is_none());
    let d = c.acquire(0x2000, 100, RW, OWN).unwrap();
    c.release(a).unwrap();
    c.release(d).unwrap();
    c.check_invariants();
}

#[test]
fn registration_larger_than_the_byte_limit_is_refused() {
    let (mut c, fake) = cache(RegCacheConfig::default().max_pinned_bytes(1000));
    let err = c.acquire(0, 1001, RW, OWN).unwrap_err();
    assert!(matches!(err, RegCacheError::TooLarge { len: 1001, max: 1000 }));
    assert_eq!(fake.st().calls, 0);
}

#[test]
fn enomem_flushes_unused_entries_and_retries_once() {
    let (mut c, fake) = cache(RegCacheConfig::default().merge(false));
    for i in 0..3 {
        let r = c.acquire(i * 0x1000, 100, RW, OWN).unwrap();
        c.release(r).unwrap();
    }
    let held = c.acquire(0x8000, 100, RW, OWN).unwrap();
    fake.0.borrow_mut().oom = 1;
    let r = c.acquire(0x9000, 100, RW, OWN).unwrap();
    let s = c.stats();
    assert_eq!(s.flushes, 1);
    assert_eq!(s.entries, 2, "unused entries flushed, the held one kept");
    assert!(fake.st().live.contains_key(&held.keys().lkey));
    assert_eq!(fake.st().calls, 4 + 2, "exactly one retry");
    c.release(r).unwrap();
    // ENOMEM twice in a row: one retry only, then a typed error.
    fake.0.borrow_mut().oom = 2;
    let err = c.acquire(0xa000, 100, RW, OWN).unwrap_err();
    assert!(matches!(err, RegCacheError::OutOfMemory));
    // ENOMEM with nothing to flush: no retry.
    let calls = fake.st().calls;
    c.flush();
    fake.0.borrow_mut().oom = 1;
    assert!(matches!(c.acquire(0xb000, 100, RW, OWN), Err(RegCacheError::OutOfMemory)));
    assert_eq!(fake.st().calls, calls + 1);
    // Hard failures are reported as such and not retried.
    fake.0.borrow_mut().hard_fail = true;
    assert!(matches!(c.acquire(0xb000, 100, RW, OWN), Err(RegCacheError::Registrar(RegError::Failed(_)))));
    c.release(held).unwrap();
    c.check_invariants();
}

#[test]
fn check_if_registered_never_registers() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    assert_eq!(c.check_if_registered(0x1000, 100), None);
    assert!(c.acquire_if_registered(0x1000, 100, RW).is_none());
    assert_eq!(fake.st().calls, 0, "no registration on a miss");
    assert_eq!(c.stats().probe_misses, 1);
    let a = c.acquire(0x1000, 100, RW, OWN).unwrap();
    assert_eq!(c.check_if_registered(0x1010, 10), Some(a.keys()));
    let p = c.acquire_if_registered(0x1010, 10, RW).unwrap();
    assert_eq!(p.keys(), a.keys());
    assert_eq!(fake.st().calls, 1);
    c.release(a).unwrap();
    c.release(p).unwrap();
    assert_eq!(c.stats().in_use, 0);
    c.check_invariants();
}

/// The list-I/O example of PVFS over InfiniBand (Wu, Wyckoff, Panda): the upper-left 1024 × 768 sub-array of a 2048 × 1536 byte array
/// is 768 non-contiguous rows. With the allocation hint they cost one registration; without it
/// (and with foreign memory not cached) 768.
#[test]
fn allocation_hint_turns_768_row_registrations_into_one() {
    const COLS: usize = 2048;
    const ROWS: usize = 1536;
    let base = 0x4000_0000;
    let parent = Span::new(base, COLS * ROWS);
    let rows = |r: usize| (base + r * COLS, 1024);

    let (mut c, fake) = cache(RegCacheConfig::default());
    let refs: Vec<_> = (0..768)
        .map(|r| {
            let (addr, len) = rows(r);
            c.acquire_hinted(addr, len, parent, RW, Origin::Foreign).unwrap()
        })
        .collect();
    assert_eq!(fake.st().registered, 1);
    assert_eq!(c.stats().hits, 767);
    for r in refs {
        c.release(r).unwrap();
    }
    assert_eq!(fake.st().deregistered, 1, "foreign memory is not kept after the list I/O");

    let (mut c, fake) = cache(RegCacheConfig::default());
    let refs: Vec<_> = (0..768)
        .map(|r| {
            let (addr, len) = rows(r);
            c.acquire(addr, len, RW, Origin::Foreign).unwrap()
        })
        .collect();
    assert_eq!(fake.st().registered, 768, "without hints every row is its own registration");
    for r in refs {
        c.release(r).unwrap();
    }
}

#[test]
fn oversized_hint_falls_back_to_the_buffer() {
    let (mut c, fake) = cache(RegCacheConfig::default().max_pinned_bytes(1 << 20));
    let r = c.acquire_hinted(0x10_0000, 4096, Span::new(0, 64 << 20), RW, OWN).unwrap();
    assert_eq!(r.region(), Span::new(0x10_0000, 4096));
    assert_eq!(fake.st().registered, 1);
    c.release(r).unwrap();
    let err = c.acquire_hinted(0x1000, 100, Span::new(0x1010, 10), RW, OWN).unwrap_err();
    assert!(matches!(err, RegCacheError::Misuse(_)), "hint must contain the buffer");
}

#[test]
fn invalidation_kills_whole_entries() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    // Unused entry: a one-byte overlap at its end invalidates and deregisters all of it.
    let a = c.acquire(0x1000, 0x1000, RW, OWN).unwrap();
    let ha = a.keys().lkey;
    c.release(a).unwrap();
    assert_eq!(c.invalidate(0x1fff, 1), 1);
    assert!(c.check_if_registered(0x1000, 16).is_none());
    assert!(!fake.st().live.contains_key(&ha));
    // In-use entry: dead for lookups at once, deregistered only at its last release.
    let b = c.acquire(0x4000, 0x1000, RW, OWN).unwrap();
    let hb = b.keys().lkey;
    assert_eq!(c.invalidate(0x4800, 0x10000), 1);
    assert!(c.check_if_registered(0x4000, 16).is_none());
    assert!(c.acquire_if_registered(0x4000, 16, RW).is_none());
    assert!(fake.st().live.contains_key(&hb), "never deregistered under its user");
    let fresh = c.acquire(0x4000, 16, RW, OWN).unwrap();
    assert_ne!(fresh.keys().lkey, hb, "a dead entry is never handed out again");
    c.release(b).unwrap();
    assert!(!fake.st().live.contains_key(&hb));
    c.release(fresh).unwrap();
    assert_eq!(c.stats().invalidations, 2);
    assert_eq!(c.invalidate(0x100_0000, 10), 0, "nothing there");
    c.check_invariants();
}

#[test]
fn foreign_memory_is_shared_in_use_but_not_cached_by_default() {
    let (mut c, fake) = cache(RegCacheConfig::default());
    let a = c.acquire(0x1000, 100, RW, Origin::Foreign).unwrap();
    let b = c.acquire(0x1000, 50, RW, Origin::Foreign).unwrap();
    assert_eq!(fake.st().registered, 1, "concurrent users share the registration");
    c.release(a).unwrap();
    assert_eq!(fake.st().live.len(), 1);
    c.release(b).unwrap();
    assert_eq!(fake.st().live.len(), 0, "deregistered at the last release");
    assert!(c.check_if_registered(0x1000, 100).is_none());
    c.check_invariants();

    // An uncached foreign registration does not absorb a cached neighbour (it would drop it).
    let (mut c, _fake) = cache(RegCacheConfig::default());
    let owned = c.acquire(0x1000, 100, RW, OWN).unwrap();
    c.release(owned).unwrap();
    let f = c.acquire(0x1064, 100, RW, Origin::Foreign).unwrap();
    assert_eq!(f.region(), Span::new(0x1064, 100));
    c.release(f).unwrap();
    assert!(c.check_if_registered(0x1000, 100).is_some(), "owned neighbour still cached");
    c.check_invariants();

    let (mut c, fake) = cache(RegCacheConfig::default().cache_foreign(true));
    let a = c.acquire(0x1000, 100, RW, Origin::Foreign).unwrap();
    c.release(a).unwrap();
    assert_eq!(fake.st().live.len(), 1, "opted in: cached");
    assert_eq!(c.invalidate(0x1000, 100), 1);
    assert_eq!(fake.st().live.len(), 0);
}

#[test]
fn alignment_rounds_registrations_out() {
    let (mut c, _fake) = cache(RegCacheConfig::default().align(4096));
    let a = c.acquire(0x1001, 0x10, RW, OWN).unwrap();
    assert_eq!(a.region(), Span::new(0x1000, 0x1000));
    assert!(c.check_if_registered(0x1f00, 0x100).is_some());
    c.release(a).unwrap();
    assert!(RegCacheConfig::default().align(3).validate().is_err());
}

#[test]
fn misuse_is_reported_not_registered() {
    let (mut c, fake) = cache(RegCacheConfig::default().access(Access::READ));
    assert!(matches!(c.acquire(0x1000, 0, Access::READ, OWN), Err(RegCacheError::Misuse(_))));
    assert!(matches!(c.acquire(usize::MAX, 2, Access::READ, OWN), Err(RegCacheError::Misuse(_))));
    assert!(matches!(c.acquire(0x1000, 1, Access::WRITE, OWN), Err(RegCacheError::Misuse(_))));
    assert_eq!(fake.st().calls, 0);
    // A token whose entry is gone (forged here; real ones cannot be duplicated).
    let r = c.acquire(0x1000, 1, Access::READ, OWN).unwrap();
    let forged = RegRef { slot: r.slot, generation: r.generation, keys: r.keys, start: r.start, end: r.end };
    c.release(r).unwrap();
    assert!(matches!(c.release(forged), Err(RegCacheError::Misuse(_))), "double release refused");
    assert!(RegCacheConfig::default().max_entries(0).validate().is_err());
    assert!(RegCacheConfig::default().max_pinned_bytes(0).validate().is_err());
}

#[test]
fn drop_deregisters_every_handle_exactly_once() {
    let (mut c, fake) = cache(RegCacheConfig::default().merge(false));
    let held = c.acquire(0, 100, RW, OWN).unwrap();
    let cached = c.acquire(0x1000, 100, RW, OWN).unwrap();
    c.release(cached).unwrap();
    let dead = c.acquire(0x2000, 100, RW, OWN).unwrap();
    c.invalidate(0x2000, 1);
    drop((held, dead)); // leaked references: the cache still owns the registrations
    drop(c);
    let st = fake.st();
    assert!(st.live.is_empty());
    assert_eq!(st.registered, st.deregistered);
}

// ---- proptest model ---------------------------------------------------------------------------

/// Address space of the model: 16 blocks of 100 bytes.
const BLOCK: usize = 100;

#[derive(Debug, Clone)]
enum Op {
    Acquire { block: usize, blocks: usize, foreign: bool, hint: Option<(usize, usize)> },
    Probe { block: usize, blocks: usize },
    Release(usize),
    Invalidate { block: usize, blocks: usize },
    Flush,
    OomNext,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..16usize, 1..4usize, any::<bool>(), proptest::option::of((0..3usize, 0..4usize))).prop_map(
            |(block, blocks, foreign, hint)| Op::Acquire { block, blocks, foreign, hint }
        ),
        1 => (0..16usize, 1..3usize).prop_map(|(block, blocks)| Op::Probe { block, blocks }),
        4 => any::<usize>().prop_map(Op::Release),
        1 => (0..16usize, 1..3usize).prop_map(|(block, blocks)| Op::Invalidate { block, blocks }),
        1 => Just(Op::Flush),
        1 => Just(Op::OomNext),
    ]
}

/// An outstanding reference as the model sees it.
struct Held {
    r: RegRef,
    addr: usize,
    end: usize,
    /// Model time of the acquire.
    at: u64,
}

fn run_model(cfg: RegCacheConfig, ops: Vec<Op>) -> std::result::Result<(), TestCaseError> {
    let max_pinned = cfg.max_pinned_bytes;
    let (mut c, fake) = cache(cfg);
    let mut held: Vec<Held> = Vec::new();
    // (fake registration count when invalidated, model time, start, end): a registration made
    // before an invalidation that overlaps its region must never be handed out again.
    let mut invalidations: Vec<(u64, u64, usize, usize)> = Vec::new();
    // (model time, start, end) of every region handed out.
    let mut returned: Vec<(u64, usize, usize)> = Vec::new();
    let not_stale = |fake: &Fake, invs: &[(u64, u64, usize, usize)], h: u32| -> bool {
        let st = fake.st();
        let Some(&(a, l, seq)) = st.live.get(&h) else { return false };
        invs.iter().all(|&(at, _, s, e)| seq >= at || a + l <= s || e <= a)
    };
    for (now, op) in ops.into_iter().enumerate() {
        let now = now as u64 + 1;
        match op {
            Op::Acquire { block, blocks, foreign, hint } => {
                let (addr, len) = (block * BLOCK + 10, blocks * BLOCK - 20);
                let end = addr + len;
                let origin = if foreign { Origin::Foreign } else { Origin::Owned };
                // An outstanding reference covering the request guarantees a hit, unless its
                // memory was invalidated or a larger registration superseded it (the larger
                // one serves lookups while it lasts; once it is gone, the cache misses rather
                // than re-index the smaller one: a missed hit, never a stale one).
                let must_hit = held.iter().any(|h| {
                    h.r.start <= addr
                        && h.r.end >= end
                        && !invalidations.iter().any(|&(_, _, s, e)| h.r.end > s && e > h.r.start)
                        && !returned.iter().any(|&(t, s, e)| {
                            t > h.at && s <= h.r.start && e >= h.r.end && (s, e) != (h.r.start, h.r.end)
                        })
                });
                let before = fake.st().registered;
                let res = match hint {
                    Some((below, above)) => {
                        let p = Span::new(
                            addr - 10 - below.min(block) * BLOCK,
                            len + 20 + (below.min(block) + above) * BLOCK,
                        );
                        c.acquire_hinted(addr, len, p, RW, origin)
                    }
                    None => c.acquire(addr, len, RW, origin),
                };
                match res {
                    Ok(r) => {
                        prop_assert!(r.start <= addr && r.end >= end, "region covers the request");
                        let st = fake.st();
                        let &(ra, rl, _) = st.live.get(&r.keys().lkey).expect("keys of a live registration");
                        prop_assert_eq!((ra, ra + rl), (r.start, r.end));
                        drop(st);
                        prop_assert!(not_stale(&fake, &invalidations, r.keys().lkey), "stale entry returned");
                        if must_hit {
                            prop_assert_eq!(fake.st().registered, before, "covered request registered again");
                        }
                        returned.push((now, r.start, r.end));
                        held.push(Held { r, addr, end, at: now });
                    }
                    Err(RegCacheError::Limit { .. } | RegCacheError::OutOfMemory) => {
                        prop_assert!(!must_hit, "covered request failed");
                    }
                    Err(e) => prop_assert!(false, "unexpected error {e:?}"),
                }
            }
            Op::Probe { block, blocks } => {
                let (addr, len) = (block * BLOCK + 10, blocks * BLOCK - 20);
                let calls = fake.st().calls;
                let keys = c.check_if_registered(addr, len);
                if let Some(k) = keys {
                    prop_assert!(not_stale(&fake, &invalidations, k.lkey));
                }
                if let Some(r) = c.acquire_if_registered(addr, len, RW) {
                    prop_assert_eq!(Some(r.keys()), keys);
                    held.push(Held { r, addr, end: addr + len, at: now });
                } else {
                    prop_assert!(keys.is_none());
                }
                prop_assert_eq!(fake.st().calls, calls, "probes never register");
            }
            Op::Release(i) => {
                if !held.is_empty() {
                    let h = held.swap_remove(i % held.len());
                    prop_assert!(h.addr >= h.r.start && h.end <= h.r.end);
                    c.release(h.r).unwrap();
                }
            }
            Op::Invalidate { block, blocks } => {
                let (s, len) = (block * BLOCK, blocks * BLOCK);
                invalidations.push((fake.st().registered, now, s, s + len));
                c.invalidate(s, len);
            }
            Op::Flush => {
                c.flush();
            }
            Op::OomNext => fake.0.borrow_mut().oom = 1,
        }
        c.check_invariants();
        // Never deregistered while referenced.
        for h in &held {
            prop_assert!(fake.st().live.contains_key(&h.r.keys().lkey), "in-use registration dropped");
        }
        prop_assert!(c.stats().bytes_pinned as usize <= max_pinned);
    }
    // Release everything: only cached (retained) entries stay; flushing drops them all.
    for h in held.drain(..) {
        c.release(h.r).unwrap();
    }
    c.flush();
    prop_assert!(fake.st().live.is_empty(), "flush after releasing everything leaves nothing pinned");
    prop_assert_eq!(c.stats().entries, 0);
    drop(c);
    let st = fake.st();
    prop_assert_eq!(st.registered, st.deregistered, "every handle deregistered exactly once");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn model_random_sequences_keep_invariants(
        max_entries in 1..8usize,
        max_pinned in 300..1600usize,
        cache_foreign in any::<bool>(),
        merge in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let cfg = RegCacheConfig::default()
            .max_entries(max_entries)
            .max_pinned_bytes(max_pinned)
            .cache_foreign(cache_foreign)
            .merge(merge);
        run_model(cfg, ops)?;
    }
}

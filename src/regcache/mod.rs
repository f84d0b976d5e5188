//! Pin-down (memory registration) cache over a [`Registrar`].
//!
//! Registering memory with an HCA pins its pages and costs tens of microseconds; a transport
//! that registers and deregisters every user buffer per message spends more time in the kernel
//! than on the wire. [`RegCache`] keeps registrations alive after their last user is done with
//! them (lazy deregistration, after Tezuka et al.'s pin-down cache) and hands them out again
//! when a later transfer falls inside an already registered range.
//!
//! # What it does
//!
//! - **Covering lookup in O(log n).** A request hits when one cached entry covers the whole
//!   `[addr, addr + len)`; see *Implementation notes* for why a plain `BTreeMap` suffices.
//! - **Refcounted entries.** [`RegCache::acquire`] returns a [`RegRef`] token; the entry stays
//!   registered at least until that token is given back with [`RegCache::release`]. Entries in
//!   use are never evicted, merged away or deregistered underneath their users.
//! - **LRU of unused entries** under a limit on the entry count and on pinned bytes
//!   ([`RegCacheConfig`]). The byte limit is never exceeded: when everything registered is in
//!   use and a new registration would not fit, the acquire fails with
//!   [`RegCacheError::Limit`] and nothing is registered.
//! - **Merging** (BMI / MVAPICH style): a new registration absorbs the unused cached entries it
//!   overlaps or touches, so a buffer registered in pieces ends up as one region.
//! - **ENOMEM:** when the registrar reports [`RegError::OutOfMemory`], every unused entry is
//!   deregistered and the registration is retried once.
//! - **[`RegCache::check_if_registered`]** answers "is this already registered?" without ever
//!   registering (the fast-RDMA path uses it to choose zero-copy or copy).
//! - **Allocation hints** ([`RegCache::acquire_hinted`]): list I/O names the parent allocation
//!   of its pieces, so 768 row buffers of one array cost one registration of the array, not
//!   768.
//! - **Statistics** ([`RegStats`]).
//!
//! # Stale registrations
//!
//! A cached registration of memory that the application has since `free`d or `munmap`ped pins
//! pages that no longer back that address: a later buffer at the same address hits the cache
//! and the HCA moves data to or from the old pages. That is the bug that made OrangeFS give up
//! caching user memory. So memory the crate owns ([`Origin::Owned`]: pool buffers, zone
//! buffers, fast-RDMA rings) stays cached after its last release, and memory the caller merely
//! lends ([`Origin::Foreign`]) is shared while in use but stays after its last release only
//! - while the process's memory monitor watches it
//!   ([`RegCacheConfig::cache_foreign_watched`]; the kernel reports its unmapping, remapping
//!   and discarding, and the cache applies those reports before every lookup), or
//! - when [`RegCacheConfig::cache_foreign`] opts in without the monitor, and the owner then
//!   calls [`RegCache::invalidate`] before the memory is freed or remapped.
//!
//! Otherwise it is deregistered as soon as its last reference is released.
//! Invalidating any part of an entry kills the whole entry: it is never returned by a lookup
//! again and is deregistered once its last user releases it.
//!
//! # Threads
//!
//! The cache is a plain single-threaded structure (`&mut self` everywhere); the engine keeps it
//! behind its own lock and calls [`RegCache::release`] from its completion path. `release`
//! never registers, never fails on a valid token, and deregisters at most one region.
//!
//! # Implementation notes
//!
//! Entries live in a slab; live entries are indexed by start address in a `BTreeMap`, and
//! unused entries are threaded on an intrusive LRU list through the slab (O(1) touch and
//! unlink). The index keeps one invariant: **no indexed entry contains another** (equal ranges
//! count as containing). Then sorting by start also sorts by end, and the only candidate that
//! can cover `[a, b)` is the entry with the greatest start ≤ `a`: if its end is < `b`, every
//! earlier entry ends even sooner. A new registration keeps the invariant by absorbing the
//! unused entries it overlaps (merge) and by *retiring* in-use entries it contains: a retired
//! entry leaves the index but stays registered for its current users, and is deregistered at
//! its last release. A range that an indexed entry contains is, by definition, a hit, so a new
//! entry is never contained in an old one. This is simpler than an augmented interval tree and
//! keeps the hit path to one `BTreeMap` probe. A retired entry is never re-indexed: if the entry
//! that superseded it leaves the cache while the retired one is still in use, lookups of its
//! range miss until something registers it again — a missed hit, never a stale one.

mod cache;
#[cfg(test)]
mod tests;
pub(crate) mod watch;

pub use cache::RegCache;

use crate::buffers::buf::MemKeys;
use crate::error::{Error, Result};
use crate::types::Access;

/// Default limit on registered entries: MVAPICH2's `MV2_NDREG_ENTRIES` (1000). Each entry is
/// one MR on the HCA, and HCAs cache MR translations in a small on-chip table.
pub const DEFAULT_MAX_ENTRIES: usize = 1000;
/// Default limit on pinned bytes (256 MiB). Pinned pages count against `RLIMIT_MEMLOCK` and
/// cannot be reclaimed by the kernel, so the cache of *lazily kept* registrations must be
/// bounded; 256 MiB holds 128 full 2 MiB transfer units, far more than one client keeps busy.
pub const DEFAULT_MAX_PINNED_BYTES: usize = 256 << 20;
/// Largest entry count accepted by [`RegCacheConfig::validate`] (HCAs support about 2^24 MRs;
/// the slab index is a `u32`).
pub const MAX_ENTRIES_LIMIT: usize = 1 << 24;

/// A region of virtual memory: `len` bytes from `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Span {
    /// `len` bytes starting at `addr`.
    pub fn new(addr: usize, len: usize) -> Self {
        Span { addr, len }
    }

    /// One past the last byte, or `None` when the span wraps the address space.
    pub fn end(&self) -> Option<usize> {
        self.addr.checked_add(self.len)
    }
}

/// Who owns the memory being registered, which decides whether it may stay cached after its
/// last release. See the module docs, *Stale registrations*.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Memory the crate allocated and keeps (pool, zone and ring buffers): it cannot be freed
    /// behind the cache's back, so it stays cached until evicted.
    Owned,
    /// Memory the caller lends for the duration of an operation. Deregistered at its last
    /// release unless [`RegCacheConfig::cache_foreign`] is set.
    Foreign,
}

/// Why a registration failed, as reported by a [`Registrar`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegError {
    /// The device or the kernel is out of pinnable memory or MR resources (`ENOMEM`,
    /// `RLIMIT_MEMLOCK`). The cache reacts by deregistering unused entries and retrying once.
    #[error("out of registrable memory")]
    OutOfMemory,
    /// Any other failure (bad address, device error). Not retried.
    #[error("registration failed: {0}")]
    Failed(Error),
}

/// The device side of the cache: something that can register and deregister memory.
///
/// The InfiniBand engine implements it over its verbs provider (`ibv_reg_mr` /
/// `ibv_dereg_mr`); tests use a counting fake.
pub trait Registrar {
    /// The provider's handle for one registration (an MR).
    type Handle;

    /// Registers `len > 0` bytes at `addr` for local access plus the remote rights in `access`.
    ///
    /// # Errors
    ///
    /// [`RegError::OutOfMemory`] when pinnable memory or MR resources are exhausted (the cache
    /// will free unused registrations and call again once); [`RegError::Failed`] otherwise.
    fn register(
        &mut self,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<(Self::Handle, MemKeys), RegError>;

    /// Drops a registration made by [`Registrar::register`]. Called exactly once per handle.
    fn deregister(&mut self, handle: Self::Handle);
}

/// Errors from [`RegCache`] operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegCacheError {
    /// The caller used the cache wrongly (zero length, wrapping range, hint not containing the
    /// buffer, a token that is not live). Never caused by peer data.
    #[error("regcache misuse: {0}")]
    Misuse(&'static str),
    /// A single registration larger than [`RegCacheConfig::max_pinned_bytes`].
    #[error("{len} bytes exceeds the pinned-bytes limit of {max}")]
    TooLarge {
        /// Bytes requested.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The registration does not fit under the entry or byte limit and every registered entry is
    /// in use, so nothing can be evicted. Retry after releasing references (or copy instead).
    #[error("registration limit reached: {entries} entries / {pinned} bytes pinned, all in use")]
    Limit {
        /// Registered entries.
        entries: usize,
        /// Pinned bytes.
        pinned: usize,
    },
    /// The registrar ran out of memory even after the cache flushed its unused entries.
    #[error("out of registrable memory (after flushing unused entries)")]
    OutOfMemory,
    /// The registrar failed for another reason.
    #[error(transparent)]
    Registrar(RegError),
}

impl From<RegCacheError> for Error {
    fn from(e: RegCacheError) -> Error {
        match e {
            RegCacheError::Misuse(m) => Error::Misuse(m.to_string()),
            RegCacheError::TooLarge { len, max } => Error::TooLarge { len: len as u64, max: max as u64 },
            RegCacheError::Registrar(RegError::Failed(inner)) => inner,
            other => Error::Exhausted(other.to_string()),
        }
    }
}

/// Limits and policy of a [`RegCache`]. Chained setters, then [`RegCacheConfig::validate`]:
///
/// ```
/// use ionet::internals::regcache::RegCacheConfig;
/// let cfg = RegCacheConfig::default().max_entries(64).max_pinned_bytes(64 << 20);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct RegCacheConfig {
    pub(crate) max_entries: usize,
    pub(crate) max_pinned_bytes: usize,
    pub(crate) access: Access,
    pub(crate) cache_foreign: bool,
    pub(crate) watched: bool,
    pub(crate) merge: bool,
    pub(crate) align: usize,
}

impl Default for RegCacheConfig {
    fn default() -> Self {
        RegCacheConfig {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_pinned_bytes: DEFAULT_MAX_PINNED_BYTES,
            access: Access::READ_WRITE,
            cache_foreign: false,
            watched: false,
            merge: true,
            align: 1,
        }
    }
}

impl RegCacheConfig {
    /// Most registered entries, in use or not (default [`DEFAULT_MAX_ENTRIES`]).
    pub fn max_entries(mut self, n: usize) -> Self {
        self.max_entries = n;
        self
    }

    /// Most bytes pinned at once, in use or not (default [`DEFAULT_MAX_PINNED_BYTES`]). Never
    /// exceeded: a registration that would exceed it evicts unused entries or fails.
    pub fn max_pinned_bytes(mut self, n: usize) -> Self {
        self.max_pinned_bytes = n;
        self
    }

    /// Remote rights every registration gets (default read and write). One access for all
    /// entries keeps every cached entry usable by every request; requests asking for rights
    /// outside this set are refused as misuse.
    pub fn access(mut self, a: Access) -> Self {
        self.access = a;
        self
    }

    /// Keep [`Origin::Foreign`] registrations cached after their last release (default
    /// `false`). Opting in makes the owner of that memory responsible for calling
    /// [`RegCache::invalidate`] before freeing or remapping it.
    pub fn cache_foreign(mut self, yes: bool) -> Self {
        self.cache_foreign = yes;
        self
    }

    /// Keep [`Origin::Foreign`] registrations cached after their last release only while the
    /// process's memory monitor watches their pages, so that unmapping, remapping or
    /// discarding them invalidates the entry before any later lookup (default `false`). A
    /// range the monitor cannot watch, or a process without one, is deregistered at its last
    /// release as without caching. Takes precedence over [`RegCacheConfig::cache_foreign`].
    pub fn cache_foreign_watched(mut self, yes: bool) -> Self {
        self.watched = yes;
        self
    }

    /// Merge a new registration with the unused entries it overlaps or touches (default
    /// `true`).
    pub fn merge(mut self, yes: bool) -> Self {
        self.merge = yes;
        self
    }

    /// Round registrations out to multiples of `align` bytes (a power of two; default 1, no
    /// rounding). Page alignment (4096) makes more requests hit, at the price of giving a peer
    /// holding the rkey access to the rest of the first and last page.
    pub fn align(mut self, align: usize) -> Self {
        self.align = align;
        self
    }

    /// Checks the cross-field rules.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] naming the first rule broken.
    pub fn validate(&self) -> Result<()> {
        if self.max_entries == 0 || self.max_entries > MAX_ENTRIES_LIMIT {
            return Err(Error::misuse(format!("regcache max_entries must be in 1..={MAX_ENTRIES_LIMIT}")));
        }
        if self.max_pinned_bytes == 0 {
            return Err(Error::misuse("regcache max_pinned_bytes must be at least 1"));
        }
        if !self.align.is_power_of_two() {
            return Err(Error::misuse("regcache align must be a power of two"));
        }
        Ok(())
    }
}

/// Counters of a [`RegCache`]. `bytes_pinned`, `entries` and `in_use` are current values;
/// the rest count events since creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegStats {
    /// `acquire*` calls served by an existing entry.
    pub hits: u64,
    /// `acquire*` calls that had to register.
    pub misses: u64,
    /// [`RegCache::acquire_if_registered`] calls that found an entry.
    pub probe_hits: u64,
    /// [`RegCache::acquire_if_registered`] calls that found none (and registered nothing).
    pub probe_misses: u64,
    /// Calls to [`Registrar::register`] that succeeded.
    pub registrations: u64,
    /// Calls to [`Registrar::deregister`].
    pub deregistrations: u64,
    /// Unused entries deregistered to make room under the limits.
    pub evictions: u64,
    /// Unused entries deregistered because a new registration absorbed them.
    pub merges: u64,
    /// Flushes of all unused entries (explicit, or after `ENOMEM`).
    pub flushes: u64,
    /// Entries killed by [`RegCache::invalidate`].
    pub invalidations: u64,
    /// Bytes currently registered (in use, unused and retired entries).
    pub bytes_pinned: u64,
    /// Entries currently registered.
    pub entries: u64,
    /// Entries currently referenced by at least one [`RegRef`].
    pub in_use: u64,
}

/// A reference to a registered region, returned by [`RegCache::acquire`]. The region stays
/// registered, with these keys, until the token is given back with [`RegCache::release`].
///
/// The token is deliberately neither `Clone` nor `Copy`: each one is released exactly once.
/// A token that is dropped instead leaks its reference, so the region stays pinned until the
/// cache is dropped.
#[must_use = "a RegRef must be given back with RegCache::release"]
#[derive(Debug, PartialEq, Eq)]
pub struct RegRef {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
    pub(crate) keys: MemKeys,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl RegRef {
    /// Keys of the registered region.
    pub fn keys(&self) -> MemKeys {
        self.keys
    }

    /// The whole registered region (it covers the requested range and may be larger).
    pub fn region(&self) -> Span {
        Span { addr: self.start, len: self.end - self.start }
    }
}

//! The shared-memory image of a software device context, and the synchronisation built on it.
//!
//! Each open context owns one sealed memfd (see [`super::sys::sealed_memfd`]); peers obtain it
//! with `pidfd_getfd` and map it. Layout (every table at a page-aligned offset):
//!
//! ```text
//!  0           Header       magic, version, pid, token, start time, LID, table sizes
//!  mr_off      MrEntry[mr_cap]          the MR table peers validate rkeys against
//!  attach_off  AttachSlot[attach_cap]   one per QP that touches this context's memory
//!  qp_off      QpEntry[qp_cap]          state, PD, receive ring, peer identity, PSN, RNR timer
//!  cq_off      CqEntry[cq_cap]          ring, lock, head/tail, armed flag, channel eventfd
//!  srq_off     SrqEntry[srq_cap]        shared receive rings
//!  arena_off   rings (receive queues and CQ entries), allocated by the owner
//! ```
//!
//! Every field is an atomic, so any bit pattern a buggy peer leaves is a valid value, and every
//! offset or index read from the image is bounds-checked before use: a peer can make *its own*
//! operations fail, never make us read or write outside the mapping.
//!
//! **Reclamation.** Before the owner reuses or unpins anything a peer may be touching (an MR,
//! a QP's ring), it marks the entry dead and calls [`Shm::synchronize`], which waits until every
//! attach slot that was inside a critical section ([`Critical`]) has left it. An initiator
//! enters the critical section *before* validating an entry and leaves it after its last access,
//! so a validated entry stays valid for the whole access (sequentially consistent Dekker-style
//! handshake: either the initiator sees the entry dead, or the owner sees the odd epoch). Slots
//! of processes that died inside a critical section are detected by pid and start time.

use std::fs::File;
use std::mem::{align_of, size_of};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use memmap2::{Advice, MmapOptions, MmapRaw};

use super::sys;

/// "IONETSIB".
pub(crate) const MAGIC: u64 = 0x494f_4e45_5453_4942;
/// Layout version.
pub(crate) const VERSION: u64 = 1;
const PAGE: u64 = 4096;

/// Marker for `#[repr(C)]` structs made only of `AtomicU64`s: valid for every bit pattern and
/// safe to share between processes.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only `AtomicU64` fields, and have no padding.
pub(crate) unsafe trait ShmSafe: Sized {}

// SAFETY: a single atomic word.
unsafe impl ShmSafe for AtomicU64 {}

macro_rules! shm_struct {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug)]
        pub(crate) struct $name { $($(#[$fm])* pub(crate) $f: AtomicU64,)* }
        // SAFETY: generated as `#[repr(C)]` with only `AtomicU64` fields, hence no padding.
        unsafe impl ShmSafe for $name {}
    };
}

shm_struct!(
    /// The first bytes of a context image.
    Header {
        magic, version, pid, token, start_time, lid, file_len,
        mr_cap, attach_cap, qp_cap, cq_cap, srq_cap, arena_len,
        /// One past the highest attach slot ever claimed (bounds `synchronize` scans).
        attach_hwm,
    }
);

shm_struct!(
    /// A registration. `state` = generation << 32 | alive << 31 | access << 24 | pd (24 bits).
    MrEntry { state, addr, len, _pad }
);

shm_struct!(
    /// A QP or thread of work that accesses this context's memory. `state`: 0 free, 1 claimed.
    /// `epoch` is odd while inside a critical section. One cache line: slots of different
    /// processes must not share one.
    AttachSlot { state, pid, start_time, epoch, _p0, _p1, _p2, _p3 }
);

shm_struct!(
    /// A queue pair. `life` = generation << 1 | alive. `srq` = SRQ index + 1 (0: own ring at
    /// `rq_off`). `remote_token`/`remote_qpn`: the peer it is connected to (set at RTR).
    /// `port_mtu`: active MTU in bytes of the port it was initialised on (0: not yet), which
    /// bounds the path MTU of the QPs sending to it.
    QpEntry {
        life, qp_state, pd, recv_cq, srq, rq_off, remote_qpn, remote_token,
        expected_psn, min_rnr_timer, access, port_mtu, _p1, _p2, _p3, _p4,
    }
);

shm_struct!(
    /// A completion queue. `lock` holds the pid of the producer inside (0: free).
    /// `armed`: 0 no, 1 any completion, 2 solicited or error only. `channel_fd`: the owner's
    /// eventfd number, `u64::MAX` without a channel. One cache line per writer group (read-
    /// mostly, producers, consumer, notification) so they do not bounce one another's lines.
    CqEntry {
        life, ring_off, cap, channel_fd, overrun, _a0, _a1, _a2,
        lock, tail, _b0, _b1, _b2, _b3, _b4, _b5,
        head, _c0, _c1, _c2, _c3, _c4, _c5, _c6,
        armed, fired, _d0, _d1, _d2, _d3, _d4, _d5,
    }
);

shm_struct!(
    /// A shared receive queue.
    SrqEntry { life, rq_off, pd, _p0, _p1, _p2, _p3, _p4 }
);

shm_struct!(
    /// Header of a receive ring; followed by `cap` entries of `2 + 2·max_sge` words:
    /// wr_id, num_sge, then (addr, len | lkey << 32) per SGE. Read-only sizes, the producer's
    /// `tail` and the consumers' `lock`/`head` each have a cache line.
    RingHeader {
        cap, max_sge, _a0, _a1, _a2, _a3, _a4, _a5,
        tail, _b0, _b1, _b2, _b3, _b4, _b5, _b6,
        lock, head, _c0, _c1, _c2, _c3, _c4, _c5,
    }
);

/// QP states as stored in [`QpEntry::qp_state`].
pub(crate) mod qps {
    pub(crate) const RESET: u64 = 0;
    pub(crate) const INIT: u64 = 1;
    pub(crate) const RTR: u64 = 2;
    pub(crate) const RTS: u64 = 3;
    pub(crate) const ERR: u64 = 6;
}

/// Words per CQ entry.
pub(crate) const CQE_WORDS: u64 = 8;

/// Table sizes of a context image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub(crate) mr: u64,
    pub(crate) attach: u64,
    pub(crate) qp: u64,
    pub(crate) cq: u64,
    pub(crate) srq: u64,
    pub(crate) arena: u64,
}

/// Offsets derived from [`Caps`] (checked arithmetic: a peer's header can't make us overflow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) caps: Caps,
    pub(crate) mr_off: u64,
    pub(crate) attach_off: u64,
    pub(crate) qp_off: u64,
    pub(crate) cq_off: u64,
    pub(crate) srq_off: u64,
    pub(crate) arena_off: u64,
    pub(crate) total: u64,
}

fn table(off: u64, n: u64, size: usize) -> Option<u64> {
    let end = off.checked_add(n.checked_mul(size as u64)?)?;
    end.checked_next_multiple_of(PAGE)
}

impl Layout {
    pub(crate) fn new(caps: Caps) -> Option<Layout> {
        let mr_off = PAGE;
        let attach_off = table(mr_off, caps.mr, size_of::<MrEntry>())?;
        let qp_off = table(attach_off, caps.attach, size_of::<AttachSlot>())?;
        let cq_off = table(qp_off, caps.qp, size_of::<QpEntry>())?;
        let srq_off = table(cq_off, caps.cq, size_of::<CqEntry>())?;
        let arena_off = table(srq_off, caps.srq, size_of::<SrqEntry>())?;
        let total = arena_off.checked_add(caps.arena)?.checked_next_multiple_of(PAGE)?;
        Some(Layout { caps, mr_off, attach_off, qp_off, cq_off, srq_off, arena_off, total })
    }
}

/// A mapped context image (ours or a peer's).
#[derive(Debug)]
pub(crate) struct Shm {
    map: MmapRaw,
    len: u64,
    pub(crate) layout: Layout,
    _file: File,
}

impl Shm {
    /// Creates our own image.
    pub(crate) fn create(caps: Caps, name: &str) -> std::io::Result<(Shm, File)> {
        let layout = Layout::new(caps).ok_or_else(|| std::io::Error::other("softib layout overflows"))?;
        let file = sys::sealed_memfd(name, layout.total)?;
        let map = MmapOptions::new().len(layout.total as usize).map_raw(&file)?;
        let shm = Shm { map, len: layout.total, layout, _file: file.try_clone()? };
        Ok((shm, file))
    }

    /// Maps a peer's image, validating everything the layout depends on.
    pub(crate) fn open_peer(file: File) -> Result<Shm, String> {
        if !sys::is_shrink_sealed(&file) {
            return Err("peer image is not sealed against shrinking".into());
        }
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        if len < PAGE || len > isize::MAX as u64 {
            return Err(format!("peer image has bad length {len}"));
        }
        let map = MmapOptions::new().len(len as usize).map_raw(&file).map_err(|e| e.to_string())?;
        let mut shm = Shm {
            map,
            len,
            layout: Layout::new(Caps { mr: 0, attach: 0, qp: 0, cq: 0, srq: 0, arena: 0 })
                .ok_or("empty layout")?,
            _file: file,
        };
        let h = shm.header();
        if h.magic.load(Acquire) != MAGIC || h.version.load(Acquire) != VERSION {
            return Err("peer image has bad magic or version".into());
        }
        let caps = Caps {
            mr: h.mr_cap.load(Acquire),
            attach: h.attach_cap.load(Acquire),
            qp: h.qp_cap.load(Acquire),
            cq: h.cq_cap.load(Acquire),
            srq: h.srq_cap.load(Acquire),
            arena: h.arena_len.load(Acquire),
        };
        let layout = Layout::new(caps).ok_or("peer layout overflows")?;
        if layout.total > len {
            return Err("peer layout exceeds its image".into());
        }
        shm.layout = layout;
        Ok(shm)
    }

    /// A shared struct at byte offset `off`, if it lies inside the mapping and is aligned.
    pub(crate) fn at<T: ShmSafe>(&self, off: u64) -> Option<&T> {
        let end = off.checked_add(size_of::<T>() as u64)?;
        if end > self.len || !off.is_multiple_of(align_of::<T>() as u64) {
            return None;
        }
        // SAFETY: `[off, end)` is inside the mapping, which lives as long as `self` and cannot
        // shrink (the memfd is sealed), the base is page-aligned and `off` is aligned for `T`.
        // `T: ShmSafe` is made of atomics only, so every bit pattern is valid and concurrent
        // mutation by other processes through shared references is allowed.
        Some(unsafe { &*self.map.as_ptr().add(off as usize).cast::<T>() })
    }

    /// `n` consecutive words at `off`.
    pub(crate) fn words(&self, off: u64, n: u64) -> Option<&[AtomicU64]> {
        let end = off.checked_add(n.checked_mul(8)?)?;
        if end > self.len || !off.is_multiple_of(8) {
            return None;
        }
        // SAFETY: as in `at`: in bounds, aligned, atomics only, mapping outlives the borrow.
        Some(unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(off as usize).cast::<AtomicU64>(), n as usize)
        })
    }

    pub(crate) fn header(&self) -> &Header {
        // The mapping is at least one page (checked at creation / open), and offset 0 is aligned.
        self.at::<Header>(0).expect("image shorter than its header")
    }

    fn entry<T: ShmSafe>(&self, base: u64, cap: u64, idx: u64) -> Option<&T> {
        if idx >= cap {
            return None;
        }
        self.at(base.checked_add(idx.checked_mul(size_of::<T>() as u64)?)?)
    }

    pub(crate) fn mr(&self, idx: u64) -> Option<&MrEntry> {
        self.entry(self.layout.mr_off, self.layout.caps.mr, idx)
    }

    pub(crate) fn slot(&self, idx: u64) -> Option<&AttachSlot> {
        self.entry(self.layout.attach_off, self.layout.caps.attach, idx)
    }

    pub(crate) fn qp(&self, idx: u64) -> Option<&QpEntry> {
        self.entry(self.layout.qp_off, self.layout.caps.qp, idx)
    }

    pub(crate) fn cq(&self, idx: u64) -> Option<&CqEntry> {
        self.entry(self.layout.cq_off, self.layout.caps.cq, idx)
    }

    pub(crate) fn srq(&self, idx: u64) -> Option<&SrqEntry> {
        self.entry(self.layout.srq_off, self.layout.caps.srq, idx)
    }

    /// Maps the pages of `[off, off + len)` into this process's page tables now, allocating
    /// any the image does not have yet. An HCA's queues are allocated and pinned when they are
    /// created; without this, a 4 MiB completion ring is faulted in a page at a time by
    /// whichever process first writes each page, on the data path (~10 µs per fault on a VM).
    /// Best effort: kernels before 5.14 lack `MADV_POPULATE_WRITE`, and the faults then
    /// happen as before.
    pub(crate) fn prefault(&self, off: u64, len: u64) {
        let start = off - off % PAGE;
        let Some(end) = off.checked_add(len).map(|e| e.min(self.len)) else { return };
        if end <= start {
            return;
        }
        if let Err(err) = self.map.advise_range(Advice::PopulateWrite, start as usize, (end - start) as usize)
        {
            tracing::debug!(%err, off, len, "softib: prefaulting a ring failed");
        }
    }

    /// An arena offset (as stored in an entry) as an image offset, if the range fits the arena.
    pub(crate) fn arena(&self, off: u64, len: u64) -> Option<u64> {
        let end = off.checked_add(len)?;
        (end <= self.layout.caps.arena).then_some(self.layout.arena_off + off)
    }

    /// Claims a free attach slot for pid `pid` (with its start time).
    pub(crate) fn claim_slot(&self, pid: u32, start_time: u64) -> Option<u64> {
        for pass in 0..2 {
            for i in 0..self.layout.caps.attach {
                let s = self.slot(i)?;
                if pass == 1 && s.state.load(Acquire) == 1 {
                    // Second pass: reclaim slots of dead processes.
                    let (p, t) = (s.pid.load(Acquire), s.start_time.load(Acquire));
                    if p != 0
                        && s.epoch.load(SeqCst) % 2 == 0
                        && !sys::process_alive(p as u32, t)
                        && s.state.compare_exchange(1, 0, AcqRel, Relaxed).is_ok()
                    {
                        tracing::debug!(slot = i, pid = p, "reclaimed attach slot of a dead process");
                    }
                }
                if s.state.compare_exchange(0, 1, AcqRel, Relaxed).is_ok() {
                    s.pid.store(u64::from(pid), Release);
                    s.start_time.store(start_time, Release);
                    if s.epoch.load(SeqCst) % 2 == 1 {
                        // A process died inside its critical section; make the epoch even.
                        s.epoch.fetch_add(1, SeqCst);
                    }
                    self.header().attach_hwm.fetch_max(i + 1, AcqRel);
                    return Some(i);
                }
            }
        }
        None
    }

    /// Releases a slot claimed with [`claim_slot`](Self::claim_slot).
    pub(crate) fn release_slot(&self, idx: u64) {
        if let Some(s) = self.slot(idx) {
            s.pid.store(0, Release);
            s.state.store(0, Release);
        }
    }

    /// Enters a critical section on slot `idx` (see the module docs).
    pub(crate) fn enter(&self, idx: u64) -> Option<Critical<'_>> {
        let s = self.slot(idx)?;
        s.epoch.fetch_add(1, SeqCst);
        Some(Critical { slot: s })
    }

    /// Waits until no attach slot is inside a critical section that began before this call.
    pub(crate) fn synchronize(&self) {
        let hwm = self.header().attach_hwm.load(SeqCst).min(self.layout.caps.attach);
        for i in 0..hwm {
            let Some(s) = self.slot(i) else { break };
            if s.state.load(SeqCst) == 0 {
                continue;
            }
            let e = s.epoch.load(SeqCst);
            if e % 2 == 0 {
                continue;
            }
            let start = Instant::now();
            let mut last_check = start;
            let mut spins = 0u32;
            while s.epoch.load(SeqCst) == e {
                spins += 1;
                if spins < 200 {
                    std::hint::spin_loop();
                } else if spins < 400 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
                if last_check.elapsed() > Duration::from_millis(10) {
                    last_check = Instant::now();
                    let (p, t) = (s.pid.load(Acquire), s.start_time.load(Acquire));
                    if p != u64::from(sys::getpid()) && !sys::process_alive(p as u32, t) {
                        tracing::debug!(slot = i, pid = p, "attach slot owner died in a critical section");
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(5) {
                        tracing::warn!(
                            slot = i,
                            pid = p,
                            "waiting long for a peer to leave a critical section"
                        );
                    }
                }
            }
        }
    }
}

/// An open critical section: entries validated inside it stay valid until it drops.
#[derive(Debug)]
pub(crate) struct Critical<'a> {
    slot: &'a AttachSlot,
}

impl Drop for Critical<'_> {
    fn drop(&mut self) {
        self.slot.epoch.fetch_add(1, SeqCst);
    }
}

/// Acquires a lock word that holds the pid of its holder (0: free). A holder that died is
/// detected and the lock taken over; data under these locks is kept consistent at every
/// store (publish by bumping an index last), so a takeover is safe.
pub(crate) fn lock_word(word: &AtomicU64) -> LockGuard<'_> {
    let me = u64::from(sys::getpid());
    let mut spins = 0u32;
    // Read the clock only once the lock is found taken: the uncontended path is per CQ entry.
    let mut since = None;
    loop {
        match word.compare_exchange_weak(0, me, Acquire, Relaxed) {
            Ok(_) => return LockGuard { word },
            Err(holder) => {
                spins += 1;
                if spins < 100 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
                let waited = since.get_or_insert_with(Instant::now).elapsed();
                if holder != 0 && holder != me && waited > Duration::from_millis(5) {
                    since = Some(Instant::now());
                    if !pid_exists(holder as u32)
                        && word.compare_exchange(holder, me, Acquire, Relaxed).is_ok()
                    {
                        tracing::warn!(pid = holder, "took over a ring lock from a dead process");
                        return LockGuard { word };
                    }
                }
            }
        }
    }
}

fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Releases a lock taken with [`lock_word`].
#[derive(Debug)]
pub(crate) struct LockGuard<'a> {
    word: &'a AtomicU64,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.word.store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps { mr: 16, attach: 8, qp: 4, cq: 4, srq: 2, arena: 1 << 16 }
    }

    #[test]
    fn layout_is_page_aligned_and_checked() {
        let l = Layout::new(caps()).unwrap();
        for off in [l.mr_off, l.attach_off, l.qp_off, l.cq_off, l.srq_off, l.arena_off, l.total] {
            assert_eq!(off % PAGE, 0);
        }
        assert!(Layout::new(Caps { mr: u64::MAX, ..caps() }).is_none());
    }

    #[test]
    fn bounds_are_enforced() {
        let (shm, _f) = Shm::create(caps(), "ionet-shm-test").unwrap();
        assert!(shm.mr(15).is_some());
        assert!(shm.mr(16).is_none());
        assert!(shm.at::<AtomicU64>(shm.layout.total).is_none());
        assert!(shm.at::<AtomicU64>(3).is_none());
        assert!(shm.words(shm.layout.total - 8, 2).is_none());
        assert!(shm.arena(0, 1 << 16).is_some());
        assert!(shm.arena(1, 1 << 16).is_none());
    }

    #[test]
    fn synchronize_waits_for_open_critical_sections() {
        let (shm, _f) = Shm::create(caps(), "ionet-shm-test").unwrap();
        let shm = std::sync::Arc::new(shm);
        let me = sys::getpid();
        let t = sys::process_start_time(me).unwrap();
        let slot = shm.claim_slot(me, t).unwrap();
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cs = shm.enter(slot).unwrap();
        let (s2, f2) = (shm.clone(), flag.clone());
        let h = std::thread::spawn(move || {
            s2.synchronize();
            f2.load(SeqCst)
        });
        std::thread::sleep(Duration::from_millis(20));
        flag.store(true, SeqCst);
        drop(cs);
        // The waiter can only have returned after the section closed, so it saw the flag.
        assert!(h.join().unwrap());
        shm.release_slot(slot);
    }
}

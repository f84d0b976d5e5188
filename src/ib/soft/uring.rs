//! Long-term page pins through io_uring fixed buffers.
//!
//! `ibv_reg_mr` pins with `pin_user_pages(FOLL_LONGTERM)` and accounts the pages in the
//! process's `pinned_vm` (`VmPin`). User space reaches the same kernel call by registering a
//! fixed buffer with an io_uring (`IORING_REGISTER_BUFFERS_UPDATE` on a sparse table): the
//! pages are pinned, counted in `VmPin` (and against `RLIMIT_MEMLOCK` without
//! `CAP_IPC_LOCK`), refused for shared writable file mappings that need dirty tracking (as an
//! HCA's are), and unpinned when the slot is cleared. Pins nest in the kernel, so overlapping
//! registrations need no bookkeeping here. On this machine it costs a sixth of
//! `mlock` + `munlock` (25 against 140 µs per MiB of 4 KiB pages, `verbs-perf --only-reg`):
//! `mlock` moves every page to the unevictable LRU and back, which pinning does not.
//!
//! Rings are only a slot table here: nothing is ever submitted. They are process-wide, in a few
//! shards that threads are dealt to (the kernel holds a ring's lock for the whole pin), grow
//! by [`SLOTS`] slots at a time and live as long as the process.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, OnceLock};

use smallvec::SmallVec;

/// Slots per ring (the kernel allows up to 16384).
const SLOTS: u32 = 4096;
/// Largest buffer one slot may hold (the kernel's limit).
const MAX_SLOT_BYTES: u64 = 1 << 30;

const IORING_REGISTER_BUFFERS2: libc::c_uint = 15;
const IORING_REGISTER_BUFFERS_UPDATE: libc::c_uint = 16;
const IORING_RSRC_REGISTER_SPARSE: u32 = 1;

/// `struct io_uring_rsrc_register`.
#[repr(C)]
#[derive(Default)]
struct RsrcRegister {
    nr: u32,
    flags: u32,
    resv2: u64,
    data: u64,
    tags: u64,
}

/// `struct io_uring_rsrc_update2`.
#[repr(C)]
#[derive(Default)]
struct RsrcUpdate2 {
    offset: u32,
    resv: u32,
    data: u64,
    tags: u64,
    nr: u32,
    resv2: u32,
}

/// Pages pinned by [`pin`]: the (ring, slot) of every ≤ 1 GiB piece.
#[derive(Debug)]
pub(crate) struct FixedPin {
    /// The process that pinned (its rings hold the slots).
    pid: u32,
    shard: usize,
    slots: SmallVec<[(RawFd, u32); 1]>,
}

struct Ring {
    fd: RawFd,
    free: Vec<u32>,
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: the ring's descriptor, owned by this `Ring` alone.
            drop(unsafe { OwnedFd::from_raw_fd(self.fd) });
        }
    }
}

#[derive(Default)]
struct Rings {
    /// The process that created the rings: a forked child must not pin through its parent's
    /// (the pages would be the child's, the accounting the parent's).
    pid: u32,
    rings: Vec<Ring>,
}

/// Ring sets, one per group of threads: the kernel holds a ring's lock for the whole pin, so
/// threads registering at once (several clients in one process) would queue on one ring.
static SHARDS: [Mutex<Rings>; 4] = [const { Mutex::new(Rings { pid: 0, rings: Vec::new() }) }; 4];

/// This thread's shard (threads are dealt round-robin).
fn my_shard() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Relaxed) % SHARDS.len();
    }
    SHARD.with(|s| *s)
}

static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();

/// Whether this kernel lets the process pin through io_uring (probed once: io_uring may be
/// disabled by `kernel.io_uring_disabled`, a seccomp filter or an old kernel).
pub(crate) fn available() -> Result<(), &'static str> {
    AVAILABLE
        .get_or_init(|| {
            let probe = vec![0u8; 2 * crate::ib::soft::sys::page_size()];
            let r = pin(probe.as_ptr() as u64, probe.len() as u64).map(unpin);
            drop(probe);
            r.map_err(|e| {
                tracing::info!(%e, "softib: io_uring pinning unavailable, registrations use mlock");
                e.to_string()
            })
        })
        .as_ref()
        .map(drop)
        .map_err(String::as_str)
}

fn new_ring() -> io::Result<Ring> {
    // `struct io_uring_params` is 120 bytes; all zero asks for defaults.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes the 120-byte params block we own.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = fd as RawFd;
    let reg = RsrcRegister { nr: SLOTS, flags: IORING_RSRC_REGISTER_SPARSE, ..Default::default() };
    // SAFETY: registers an empty (sparse) buffer table; the kernel reads `reg`, which we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd,
            IORING_REGISTER_BUFFERS2,
            &raw const reg,
            size_of::<RsrcRegister>() as libc::c_uint,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        drop(Ring { fd, free: Vec::new() });
        return Err(e);
    }
    Ok(Ring { fd, free: (0..SLOTS).rev().collect() })
}

/// Takes a free slot, creating a ring when all are used.
fn take_slot(rings: &Mutex<Rings>) -> io::Result<(RawFd, u32)> {
    let mut r = rings.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if r.pid != pid {
        // Fresh state in a forked child; the parent's rings stay the parent's.
        *r = Rings { pid, rings: Vec::new() };
    }
    if let Some((fd, slot)) = r.rings.iter_mut().find_map(|g| g.free.pop().map(|s| (g.fd, s))) {
        return Ok((fd, slot));
    }
    let mut ring = new_ring()?;
    let slot = ring.free.pop().expect("a new ring has free slots");
    let fd = ring.fd;
    r.rings.push(ring);
    Ok((fd, slot))
}

fn give_back(rings: &Mutex<Rings>, fd: RawFd, slot: u32) {
    let mut r = rings.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = r.rings.iter_mut().find(|g| g.fd == fd) {
        g.free.push(slot);
    }
}

/// Points `slot` at `[addr, addr + len)` (pinning it), or clears it (`len` 0, unpinning).
fn update(fd: RawFd, slot: u32, addr: u64, len: u64) -> io::Result<()> {
    let iov = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len as usize };
    let up = RsrcUpdate2 { offset: slot, data: &raw const iov as u64, nr: 1, ..Default::default() };
    // SAFETY: the kernel reads `up` and the one iovec it points to, both ours and live for the
    // call. It pins (or unpins) the user pages the iovec names after validating that they are
    // mapped; nothing here dereferences them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd,
            IORING_REGISTER_BUFFERS_UPDATE,
            &raw const up,
            size_of::<RsrcUpdate2>() as libc::c_uint,
        )
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Pins `[addr, addr + len)`. On failure nothing stays pinned by this call.
pub(crate) fn pin(addr: u64, len: u64) -> io::Result<FixedPin> {
    let shard = my_shard();
    pin_in(&SHARDS[shard], shard, addr, len)
}

/// Unpins what [`pin`] pinned.
pub(crate) fn unpin(p: FixedPin) {
    unpin_in(&SHARDS[p.shard], p);
}

/// Pins through `rings`, shard number `shard` (recorded for the unpin).
fn pin_in(rings: &Mutex<Rings>, shard: usize, addr: u64, len: u64) -> io::Result<FixedPin> {
    let mut done = FixedPin { pid: std::process::id(), shard, slots: SmallVec::new() };
    let mut off = 0;
    while off < len {
        let piece = (len - off).min(MAX_SLOT_BYTES);
        let step = take_slot(rings).and_then(|(fd, slot)| {
            update(fd, slot, addr + off, piece)
                .map(|()| (fd, slot))
                .inspect_err(|_| give_back(rings, fd, slot))
        });
        match step {
            Ok(s) => done.slots.push(s),
            Err(e) => {
                unpin_in(rings, done);
                return Err(e);
            }
        }
        off += piece;
    }
    Ok(done)
}

fn unpin_in(rings: &Mutex<Rings>, p: FixedPin) {
    if p.pid != std::process::id() {
        // A forked child dropping its copy of the parent's registration: the ring is the
        // parent's, so clearing the slot would unpin the parent's pages.
        return;
    }
    for (fd, slot) in p.slots {
        match update(fd, slot, 0, 0) {
            Ok(()) => give_back(rings, fd, slot),
            // The slot stays taken: reusing it could not be worse than leaking it.
            Err(err) => tracing::warn!(%err, slot, "softib: io_uring unpin failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_slots(rings: &Mutex<Rings>) -> usize {
        rings.lock().unwrap().rings.iter().map(|g| g.free.len()).sum()
    }

    #[test]
    fn pins_nest_and_slots_are_reused() {
        if let Err(why) = available() {
            eprintln!("skipped: io_uring pinning unavailable here ({why})");
            return;
        }
        let rings = Mutex::new(Rings::default());
        let buf = vec![7u8; 64 << 10];
        let (a, n) = (buf.as_ptr() as u64, buf.len() as u64);
        let one = pin_in(&rings, 0, a, n).unwrap();
        let two = pin_in(&rings, 0, a + 4096, n / 2).unwrap();
        assert_ne!(one.slots[0], two.slots[0], "each registration has its own slot");
        assert_eq!(free_slots(&rings), SLOTS as usize - 2);
        let slot = two.slots[0];
        unpin_in(&rings, two);
        let three = pin_in(&rings, 0, a, 4096).unwrap();
        assert_eq!(three.slots[0], slot, "a freed slot is handed out again before a new one");
        unpin_in(&rings, three);
        unpin_in(&rings, one);
        assert_eq!(free_slots(&rings), SLOTS as usize);
        assert_eq!(rings.lock().unwrap().rings.len(), 1);
    }

    #[test]
    fn unmapped_memory_is_refused_and_leaves_no_slot_taken() {
        if available().is_err() {
            return;
        }
        let rings = Mutex::new(Rings::default());
        let page = crate::ib::soft::sys::page_size();
        // SAFETY: a fresh anonymous reservation with no access; unmapped again below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(pin_in(&rings, 0, p as u64, page as u64).is_err(), "PROT_NONE memory cannot be pinned");
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, page) };
        assert_eq!(free_slots(&rings), SLOTS as usize, "the refused pin gave its slot back");
    }

    #[test]
    fn a_forked_child_gets_rings_of_its_own() {
        let rings = Mutex::new(Rings { pid: 1, rings: vec![Ring { fd: -1, free: vec![0] }] });
        if available().is_err() {
            return;
        }
        // State left by "another process" (pid 1) is not used: a fresh ring is made.
        let (fd, _) = take_slot(&rings).unwrap();
        assert_ne!(fd, -1);
        assert_eq!(rings.lock().unwrap().pid, std::process::id());
    }

    #[test]
    fn threads_are_dealt_across_shards() {
        // Threads created one after another take consecutive deals; other tests' threads may
        // take some in between, but eight never all land on one shard unless dealing is broken.
        let shards: std::collections::BTreeSet<usize> =
            (0..8).map(|_| std::thread::spawn(my_shard).join().unwrap()).collect();
        assert!(shards.len() > 1, "every thread on shard {shards:?}");
        assert!(shards.iter().all(|&s| s < SHARDS.len()));
    }

    #[test]
    fn a_pin_inherited_from_another_process_is_left_alone() {
        if available().is_err() {
            return;
        }
        let rings = Mutex::new(Rings::default());
        let buf = vec![1u8; 4096];
        let mut p = pin_in(&rings, 0, buf.as_ptr() as u64, 4096).unwrap();
        let slot = p.slots[0];
        // As if a forked child dropped it: nothing is cleared or handed back.
        p.pid = std::process::id() + 1;
        unpin_in(&rings, p);
        assert_eq!(free_slots(&rings), SLOTS as usize - 1);
        // Clean up as the owner would: the slot is still taken.
        update(slot.0, slot.1, 0, 0).unwrap();
    }
}

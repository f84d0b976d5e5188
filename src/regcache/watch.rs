//! Memory events for the pin-down cache: which lent memory was unmapped, remapped or given
//! back to the kernel, so a cached registration of it is never used again.
//!
//! A registration pins the pages that were mapped when it was made. If the application frees
//! a buffer and the allocator unmaps it (`munmap`, a heap shrink) or discards its pages
//! (`madvise(MADV_DONTNEED)`), a later buffer at the same address is backed by other pages,
//! and a cached registration would move the old ones: the classic stale-registration hazard.
//! UCX avoids it by intercepting the allocator's calls in-process; this module uses the
//! kernel's userfaultfd events instead, as libfabric's memory monitor does, so nothing is
//! patched: a cached range of lent memory is registered with one process-wide userfaultfd
//! (missing-page mode), and the kernel reports `UNMAP`, `REMOVE` and `REMAP` events for it.
//!
//! Ordering is what makes it safe. The kernel holds the thread that unmaps until the event is
//! read; the monitor thread reads events only while holding the log of unmapped ranges, and
//! writes each range into it before letting go; and a cache applies the log (under that same
//! lock) before every lookup. So once `munmap` has returned, any lookup that follows sees the
//! range invalidated — there is no window in which a new buffer at the old address finds the
//! old registration.
//!
//! Nothing allocates or frees memory while holding the log: a `free` can give heap pages back
//! to the kernel, which for a watched range is itself an event, and the thread freeing would
//! wait for a monitor that waits for the lock. So the log is a fixed ring with a sequence
//! number; a cache remembers how far it has read and copies new entries into a buffer it
//! reserved beforehand, and one that fell a whole ring behind forgets every lent registration.
//!
//! Pages of a watched range that are discarded and touched again fault as "missing" (the
//! registration no longer pins them): the monitor stops watching them and wakes the faulting
//! thread, which then faults normally. Discarded ranges are unwatched as soon as their event
//! is read, so that is rare.
//!
//! Where userfaultfd is not available to the process (it needs `CAP_SYS_PTRACE`,
//! `vm.unprivileged_userfaultfd = 1` or read access to `/dev/userfaultfd`; the user-mode-only
//! flag is not used because it would turn kernel accesses to such pages into `EFAULT`),
//! [`Monitor::get`] is `None` and lent memory is not kept registered. That is always the case
//! outside Linux, which has no userfaultfd (nor an InfiniBand provider to register with).

// Outside Linux no monitor is ever started, so its event handling is unused there; it is
// still compiled so the cache above it has one shape everywhere.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

#[cfg(target_os = "linux")]
use std::os::fd::FromRawFd;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffd_msg`: the event, then 24 bytes whose meaning depends on it.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    _reserved: [u8; 7],
    arg: [u64; 3],
}

/// A range `[start, end)` no longer backed by the pages it was registered with.
pub(crate) type Gone = (usize, usize);

/// Ranges the ring keeps for caches that have not read them yet.
pub(crate) const LOG_LEN: usize = 4096;

/// The log of unmapped ranges: entry `seq % LOG_LEN` is the `seq`-th range ever logged.
#[derive(Debug)]
struct Log {
    ranges: Box<[Gone; LOG_LEN]>,
    /// Ranges logged so far.
    seq: u64,
}

/// What a cache has read of the log.
#[derive(Debug)]
pub(crate) struct Reader {
    seen: u64,
    /// Reserved before the log is taken, so copying out of it allocates nothing.
    buf: Vec<Gone>,
}

/// `madvise` advice that faults pages in as reads would (Linux 5.14); libc has no name for it
/// in every version this crate accepts.
#[cfg(target_os = "linux")]
const MADV_POPULATE_READ: libc::c_int = 22;

/// Faults in the pages of `[start, end)` not there yet, as reads would, before the range is
/// watched. Memory never touched (a large allocation fresh from the allocator) has no pages
/// yet: the registration that follows would fault them in, and the monitor would take each of
/// those faults for a discarded page touched again and drop the registration at once. Nothing
/// is written (untouched anonymous memory maps the shared zero page, which the registration's
/// write pinning then replaces without a missing-page fault). Best effort: an older kernel
/// refuses the advice, and such memory is then registered again on its next use.
fn populate(start: usize, end: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the advice only faults pages in as a read of them would, leaving contents
        // and mappings as they are; a range that cannot be read fails with an error, not a
        // signal.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_READ) };
        if r != 0 {
            tracing::debug!(start, end, error = %std::io::Error::last_os_error(), "cannot fault in lent memory");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, end);
}

/// New ranges for one cache.
pub(crate) enum Unmapped<'a> {
    /// These, in the order they were logged.
    Ranges(&'a [Gone]),
    /// More than the ring holds: everything lent may be gone.
    Overrun,
}

/// The process's memory monitor.
#[derive(Debug)]
pub(crate) struct Monitor {
    uffd: OwnedFd,
    /// Held while events are read and logged (see the module docs).
    log: Mutex<Log>,
}

static MONITOR: OnceLock<Option<Arc<Monitor>>> = OnceLock::new();

fn page() -> usize {
    // SAFETY: sysconf has no memory effects; _SC_PAGESIZE is always answered on Linux.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096)
}

impl Monitor {
    /// The process's monitor, started on first use; `None` where userfaultfd is not available.
    pub(crate) fn get() -> Option<Arc<Monitor>> {
        MONITOR
            .get_or_init(|| match Monitor::start() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::debug!(error = %e, "no memory monitor: lent memory will not stay registered");
                    None
                }
            })
            .clone()
    }

    #[cfg(not(target_os = "linux"))]
    fn start() -> std::io::Result<Arc<Monitor>> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "userfaultfd exists on Linux only"))
    }

    #[cfg(target_os = "linux")]
    fn start() -> std::io::Result<Arc<Monitor>> {
        // SAFETY: the userfaultfd system call takes only flags and returns a new descriptor.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the descriptor was just created and is owned by nothing else.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let want = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
        let mut api = UffdioApi { api: UFFD_API, features: want, ioctls: 0 };
        // SAFETY: UFFDIO_API reads and writes one `struct uffdio_api`, which `api` is.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if api.features & want != want {
            return Err(std::io::Error::other("the kernel does not report unmap, remove and remap events"));
        }
        let log = Log { ranges: Box::new([(0, 0); LOG_LEN]), seq: 0 };
        let m = Arc::new(Monitor { uffd, log: Mutex::new(log) });
        let run = m.clone();
        std::thread::Builder::new().name("ionet-memwatch".into()).spawn(move || run.run())?;
        Ok(m)
    }

    /// A reader for one cache, from now on.
    pub(crate) fn reader(&self) -> Reader {
        let seen = self.log.lock().unwrap_or_else(|p| p.into_inner()).seq;
        Reader { seen, buf: Vec::with_capacity(LOG_LEN) }
    }

    /// Starts watching the pages of `[addr, addr + len)`; `false` when they cannot be watched
    /// (not anonymous private memory, say), in which case their registration must not be kept.
    pub(crate) fn watch(&self, addr: usize, len: usize) -> bool {
        let p = page();
        let start = addr & !(p - 1);
        let Some(end) = addr.checked_add(len).and_then(|e| e.checked_add(p - 1)).map(|e| e & !(p - 1)) else {
            return false;
        };
        populate(start, end);
        let mut reg = UffdioRegister {
            range: UffdioRange { start: start as u64, len: (end - start) as u64 },
            mode: UFFDIO_REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`; it changes
        // only how the kernel reports events and missing-page faults for the range.
        let ok = unsafe { libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } == 0;
        if !ok {
            tracing::debug!(addr, len, error = %std::io::Error::last_os_error(), "cannot watch lent memory");
        }
        ok
    }

    /// What was unmapped since `r` last read, in order with every `munmap` that has returned
    /// (the log is taken as the monitor takes it while reading events).
    pub(crate) fn read<'a>(&self, r: &'a mut Reader) -> Unmapped<'a> {
        r.buf.clear();
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.seq - r.seen > LOG_LEN as u64 {
            r.seen = log.seq;
            return Unmapped::Overrun;
        }
        for seq in r.seen..log.seq {
            r.buf.push(log.ranges[(seq % LOG_LEN as u64) as usize]);
        }
        r.seen = log.seq;
        drop(log);
        Unmapped::Ranges(&r.buf)
    }

    fn unwatch(&self, start: u64, end: u64) {
        let r = UffdioRange { start, len: end.saturating_sub(start) };
        if r.len == 0 {
            return;
        }
        // SAFETY: UFFDIO_UNREGISTER and UFFDIO_WAKE read one `struct uffdio_range`. Waking
        // lets a thread that faulted on a discarded page of the range fault again, normally.
        unsafe {
            libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_UNREGISTER, &r);
            libc::ioctl(self.uffd.as_raw_fd(), UFFDIO_WAKE, &r);
        }
    }

    fn run(&self) {
        let p = page() as u64;
        // Everything this loop uses is here or on the stack: it allocates nothing (see the
        // module docs).
        let mut buf = [UffdMsg { event: 0, _reserved: [0; 7], arg: [0; 3] }; 64];
        loop {
            let mut pfd = libc::pollfd { fd: self.uffd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
                continue;
            }
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                let size = std::mem::size_of_val(&buf);
                // SAFETY: reads at most `size` bytes into `buf`, an array of `struct uffd_msg`.
                let n = unsafe { libc::read(self.uffd.as_raw_fd(), buf.as_mut_ptr().cast(), size) };
                if n <= 0 {
                    break;
                }
                for m in &buf[..n as usize / std::mem::size_of::<UffdMsg>()] {
                    let gone = match m.event {
                        UFFD_EVENT_UNMAP | UFFD_EVENT_REMOVE => {
                            let (start, end) = (m.arg[0], m.arg[1]);
                            if m.event == UFFD_EVENT_REMOVE {
                                self.unwatch(start, end);
                            }
                            (start, end)
                        }
                        UFFD_EVENT_REMAP => {
                            let (from, to, len) = (m.arg[0], m.arg[1], m.arg[2]);
                            self.unwatch(to, to.saturating_add(len));
                            (from, from.saturating_add(len))
                        }
                        UFFD_EVENT_PAGEFAULT => {
                            // A discarded page touched again before its range was unwatched.
                            let at = m.arg[1] & !(p - 1);
                            self.unwatch(at, at + p);
                            (at, at + p)
                        }
                        _ => continue,
                    };
                    let at = (log.seq % LOG_LEN as u64) as usize;
                    log.ranges[at] = (gone.0 as usize, gone.1 as usize);
                    log.seq += 1;
                }
            }
            drop(log);
        }
    }
}

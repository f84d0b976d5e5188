//! Thin, checked wrappers over the Linux calls the software provider needs: memfd, pidfd,
//! eventfd, `process_vm_readv`/`writev`, `mlock`. Every `unsafe` block of the provider that talks
//! to the kernel lives here.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Returns `Err(last_os_error)` when a libc call returned -1.
fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Takes ownership of a file descriptor returned by a successful system call.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: `fd` was just returned by a successful system call that creates a new descriptor,
    // and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// A sealed anonymous shared-memory file of exactly `len` bytes: it can neither shrink nor grow,
/// so a peer that maps it can never fault (SIGBUS) on a truncated page.
pub(crate) fn sealed_memfd(name: &str, len: u64) -> io::Result<File> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::Error::other("memfd name contains NUL"))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) }
        as libc::c_long)?;
    let file = File::from(owned(fd)?);
    file.set_len(len)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own; no pointers involved.
    cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } as libc::c_long)?;
    Ok(file)
}

/// True when `file` is sealed against shrinking (so mapping all of it is fault-free).
pub(crate) fn is_shrink_sealed(file: &File) -> bool {
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor we own; no pointers involved.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// A process handle that cannot be confused with a later process reusing the pid.
#[derive(Debug)]
pub(crate) struct PidFd {
    fd: OwnedFd,
    pid: u32,
}

impl PidFd {
    /// Opens a pidfd for `pid`.
    pub(crate) fn open(pid: u32) -> io::Result<PidFd> {
        let p = libc::pid_t::try_from(pid).map_err(|_| io::Error::other("pid out of range"))?;
        // SAFETY: pidfd_open takes plain integers.
        let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, p, 0) })?;
        Ok(PidFd { fd: owned(fd)?, pid })
    }

    /// The pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// False once the process has exited (a pidfd becomes readable on exit).
    pub(crate) fn is_alive(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is a valid pollfd for the duration of the call; nfds is 1.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 0
    }

    /// Duplicates descriptor `fd` of the process into ours (needs ptrace access, which
    /// `process_vm_*` needs too).
    pub(crate) fn get_fd(&self, fd: i32) -> io::Result<OwnedFd> {
        // SAFETY: pidfd_getfd takes plain integers; it returns a new descriptor or -1.
        let r = cvt(unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.fd.as_raw_fd(), fd, 0) })?;
        owned(r)
    }
}

/// True when a process with this pid exists and started at `start_time` (clock ticks since
/// boot, field 22 of `/proc/<pid>/stat`); guards against pid reuse.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    process_start_time(pid).is_ok_and(|t| t == start_time)
}

/// Start time of a process (field 22 of `/proc/<pid>/stat`).
pub(crate) fn process_start_time(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).ok_or_else(|| io::Error::other("bad stat"))?;
    // After ')' come field 3 (state) onwards; start time is field 22 → index 19.
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("bad /proc/pid/stat"))
}

/// Our pid, cached: `getpid` is a real system call and lock words ask for it on every take.
/// A forked child must not inherit the cache: it would tag its own contexts and lock words with
/// its parent's pid (peers would then copy from the parent's memory, and a dead child's locks
/// would look held by a live process), so a `fork` handler clears it in the child. Using a
/// parent's contexts across `fork` stays unsupported.
pub(crate) fn getpid() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    match PID.load(Relaxed) {
        0 => {
            FORGET_IN_CHILD.call_once(|| {
                // SAFETY: the handler only stores to an atomic, which is async-signal-safe, as
                // code run in a child of a multi-threaded process must be.
                let r = unsafe { libc::pthread_atfork(None, None, Some(forget_pid)) };
                if r != 0 {
                    tracing::warn!(
                        err = r,
                        "pthread_atfork failed: a forked child would report its parent's pid"
                    );
                }
            });
            let p = std::process::id();
            PID.store(p, Relaxed);
            p
        }
        p => p,
    }
}

static PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
static FORGET_IN_CHILD: std::sync::Once = std::sync::Once::new();

extern "C" fn forget_pid() {
    PID.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// Lets processes of the same user that are not our ancestors use `process_vm_*` and
/// `pidfd_getfd` on us when Yama's `ptrace_scope` is 1. Harmless where Yama is absent.
pub(crate) fn allow_ptrace_by_any() {
    // SAFETY: prctl(PR_SET_PTRACER) takes integers only.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    if r != 0 {
        // EINVAL means Yama is not built in: nothing to relax.
        tracing::trace!(err = %io::Error::last_os_error(), "PR_SET_PTRACER not applied");
    }
}

/// A non-blocking eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes integers only.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) } as libc::c_long)?;
    owned(fd)
}

/// Adds 1 to an eventfd (a wake-up). A full counter (EAGAIN) means a wake-up is pending anyway.
pub(crate) fn eventfd_signal(fd: RawFd) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    let r = unsafe { libc::write(fd, (&raw const one).cast(), 8) };
    if r == 8 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock { Ok(()) } else { Err(e) }
}

/// Resets an eventfd; returns false when it was not signalled.
pub(crate) fn eventfd_drain(fd: RawFd) -> io::Result<bool> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    let r = unsafe { libc::read(fd, (&raw mut v).cast(), 8) };
    if r == 8 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock { Ok(false) } else { Err(e) }
}

/// True when `fd` (ours) is an eventfd: a peer-supplied descriptor number must name one before
/// we write wake-ups to it.
pub(crate) fn is_eventfd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

/// Locks `[addr, addr + len)` in RAM.
pub(crate) fn mlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: mlock only changes page residency of our own mappings; it validates the range
    // itself (ENOMEM for unmapped pages) and never dereferences it in user space.
    cvt(unsafe { libc::mlock(addr as *const libc::c_void, len) } as libc::c_long).map(drop)
}

/// Undoes [`mlock`].
pub(crate) fn munlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: as for `mlock`.
    cvt(unsafe { libc::munlock(addr as *const libc::c_void, len) } as libc::c_long).map(drop)
}

/// `RLIMIT_MEMLOCK` soft limit in bytes (None: unlimited).
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into a live rlimit.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// A contiguous byte range in some address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// Start address.
    pub(crate) addr: u64,
    /// Length.
    pub(crate) len: u64,
}

/// Direction of a copy between local and remote spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Local → remote.
    Write,
    /// Remote → local.
    Read,
}

/// Why a copy failed.
#[derive(Debug)]
pub(crate) enum CopyError {
    /// The remote process is gone.
    PeerGone,
    /// A local or remote address is not mapped (a registration contract was broken).
    Fault,
    /// Anything else (permissions, ...).
    Other(io::Error),
}

/// Copies between `local` spans (ours) and `remote` spans (in process `pid`; ours when
/// `same_process`), in order, up to the shorter total. Returns bytes copied.
///
/// Callers have validated every span against a live registration and hold the registrations'
/// epoch (see `shm::Critical`), so the memory stays mapped for the duration of the call.
pub(crate) fn copy_spans(
    dir: Dir,
    pid: u32,
    same_process: bool,
    local: &[Span],
    remote: &[Span],
) -> Result<u64, CopyError> {
    if same_process {
        return Ok(copy_in_process(dir, local, remote));
    }
    let p = libc::pid_t::try_from(pid).map_err(|_| CopyError::PeerGone)?;
    if !Pieces::new(local, remote).any(|(l, r, n)| needs_staging(dir, l, r, n)) {
        let total = local.iter().map(|s| s.len).sum::<u64>().min(remote.iter().map(|s| s.len).sum());
        return copy_direct(dir, p, local, remote, total);
    }
    let mut done = 0u64;
    for (l, r, n) in Pieces::new(local, remote) {
        if needs_staging(dir, l, r, n) {
            copy_staged(dir, p, l, r, n)?;
        } else {
            copy_direct(dir, p, &[Span { addr: l, len: n }], &[Span { addr: r, len: n }], n)?;
        }
        done += n;
    }
    Ok(done)
}

/// `total` bytes between the spans with `process_vm_writev` / `process_vm_readv`.
fn copy_direct(
    dir: Dir,
    p: libc::pid_t,
    local: &[Span],
    remote: &[Span],
    total: u64,
) -> Result<u64, CopyError> {
    let mut done = 0u64;
    // Scatter/gather lists are short (≤ 64 entries): build the iovecs on the stack.
    const N: usize = 64;
    let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
    let (mut liov, mut riov) = ([empty; N], [empty; N]);
    while done < total {
        let lim = iovecs_from(local, done, total - done, &mut liov) as libc::c_ulong;
        let rim = iovecs_from(remote, done, total - done, &mut riov) as libc::c_ulong;
        // SAFETY: the iovec arrays are live for the call. The local iovecs describe memory of
        // this process that the caller validated against live registrations (the contract of
        // `reg_mr` keeps it mapped); the kernel checks the remote ones against the target's
        // address space and never touches ours outside the local iovecs.
        let n = unsafe {
            match dir {
                Dir::Write => libc::process_vm_writev(p, liov.as_ptr(), lim, riov.as_ptr(), rim, 0),
                Dir::Read => libc::process_vm_readv(p, liov.as_ptr(), lim, riov.as_ptr(), rim, 0),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => CopyError::PeerGone,
                Some(libc::EFAULT) => CopyError::Fault,
                _ => CopyError::Other(e),
            });
        }
        if n == 0 {
            return Err(CopyError::Fault);
        }
        done += n as u64;
    }
    Ok(done)
}

/// Pieces shorter than this are copied directly: staging would cost more than it saves.
const STAGE_MIN: u64 = 8 << 10;

/// Bounce chunk for staged copies; small enough to stay in the L2 cache between the two copies.
const STAGE_CHUNK: usize = 256 << 10;

/// Whether the kernel copy of one piece (`local` ↔ `remote`, `len` bytes) would hit the
/// aliasing penalty and is long enough to be worth staging. The kernel's `process_vm_writev` /
/// `readv` copies run `rep movsb`, with the same trap as user-space copies (see
/// [`crate::buffers::copy`]): measured here, 512 KiB at 2.3 GB/s for distances 1–31 against 10 GB/s
/// otherwise. Page-aligned data pushed into a `malloc`ed buffer (an RDMA write from a zone
/// buffer or a mapped file into a client's heap buffer) lands exactly there; an HCA's DMA
/// engine has no such cost, so the provider routes those copies around it.
fn needs_staging(dir: Dir, local: u64, remote: u64, len: u64) -> bool {
    let (dst, src) = match dir {
        Dir::Write => (remote, local),
        Dir::Read => (local, remote),
    };
    len >= STAGE_MIN && crate::buffers::copy::aliases(dst as usize, src as usize, len as usize)
}

thread_local! {
    /// Per-thread bounce buffer for staged copies (`STAGE_CHUNK` plus a page of slack to place
    /// the chunk at any page offset); allocated on a thread's first staged copy.
    static STAGE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One piece through a bounce buffer placed half a page away from the remote address, so
/// neither the kernel copy nor our `memcpy` sees a distance inside the aliasing window.
fn copy_staged(dir: Dir, p: libc::pid_t, local: u64, remote: u64, len: u64) -> Result<(), CopyError> {
    STAGE.with(|stage| {
        let mut stage = stage.borrow_mut();
        if stage.is_empty() {
            stage.resize(STAGE_CHUNK + 4096, 0);
        }
        let base = stage.as_mut_ptr() as u64;
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(STAGE_CHUNK as u64);
            let (l, r) = (local + off, remote + off);
            // The bounce copy sits 2 KiB (mod 4 KiB) past the remote bytes: the kernel copy's
            // distance is ±2048, ours is the original skew ± 2048 — both outside the window.
            let s = base + ((r + 2048).wrapping_sub(base) & 4095);
            let bounce = [Span { addr: s, len: n }];
            let remote_piece = [Span { addr: r, len: n }];
            match dir {
                Dir::Write => {
                    // SAFETY: `l..l+n` lies inside a local registration the caller validated and
                    // holds the epoch of (mapped for the call); `s..s+n` lies inside `stage`
                    // (offset < 4096, n ≤ STAGE_CHUNK), which nothing else borrows.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            l as usize as *const u8,
                            s as usize as *mut u8,
                            n as usize,
                        )
                    };
                    copy_direct(Dir::Write, p, &bounce, &remote_piece, n)?;
                }
                Dir::Read => {
                    copy_direct(Dir::Read, p, &bounce, &remote_piece, n)?;
                    // SAFETY: as above, with the roles of the two ranges swapped.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            s as usize as *const u8,
                            l as usize as *mut u8,
                            n as usize,
                        )
                    };
                }
            }
            off += n;
        }
        Ok(())
    })
}

/// Walks two span lists in step: yields `(local addr, remote addr, len)` for each stretch that
/// is contiguous on both sides, up to the shorter total.
struct Pieces<'a> {
    a: &'a [Span],
    b: &'a [Span],
    ai: usize,
    ao: u64,
    bi: usize,
    bo: u64,
}

impl<'a> Pieces<'a> {
    fn new(a: &'a [Span], b: &'a [Span]) -> Self {
        Pieces { a, b, ai: 0, ao: 0, bi: 0, bo: 0 }
    }
}

impl Iterator for Pieces<'_> {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (a, b) = (self.a.get(self.ai)?, self.b.get(self.bi)?);
            let n = (a.len - self.ao).min(b.len - self.bo);
            let item = (a.addr + self.ao, b.addr + self.bo, n);
            self.ao += n;
            self.bo += n;
            if self.ao == a.len {
                self.ai += 1;
                self.ao = 0;
            }
            if self.bo == b.len {
                self.bi += 1;
                self.bo = 0;
            }
            if n > 0 {
                return Some(item);
            }
        }
    }
}

/// Fills `out` with iovecs for the byte range `[skip, skip + len)` of the concatenated spans;
/// returns how many (at most `out.len()`; the caller loops for the rest).
fn iovecs_from(spans: &[Span], mut skip: u64, mut len: u64, out: &mut [libc::iovec]) -> usize {
    let mut n = 0;
    for s in spans {
        if len == 0 || n == out.len() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let take = (s.len - skip).min(len);
        out[n] =
            libc::iovec { iov_base: (s.addr + skip) as usize as *mut libc::c_void, iov_len: take as usize };
        n += 1;
        len -= take;
        skip = 0;
    }
    n
}

/// The same-process copy: `memmove` piecewise, overlap-safe.
fn copy_in_process(dir: Dir, local: &[Span], remote: &[Span]) -> u64 {
    let (src, dst) = match dir {
        Dir::Write => (local, remote),
        Dir::Read => (remote, local),
    };
    let mut done = 0;
    for (s, d, n) in Pieces::new(src, dst) {
        // SAFETY: both ranges lie inside registrations the caller validated and holds the
        // epoch of, so they are mapped for the duration of the copy (`reg_mr`'s contract).
        // `ptr::copy` is memmove: overlapping ranges (loopback to the same buffer) are fine.
        unsafe { std::ptr::copy(s as usize as *const u8, d as usize as *mut u8, n as usize) };
        done += n;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_copy_scatters_and_gathers() {
        let src = [1u8, 2, 3, 4, 5, 6, 7];
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        let local = [Span { addr: src.as_ptr() as u64, len: 7 }];
        let remote =
            [Span { addr: a.as_mut_ptr() as u64, len: 3 }, Span { addr: b.as_mut_ptr() as u64, len: 5 }];
        let n = copy_spans(Dir::Write, getpid(), true, &local, &remote).map_err(|_| ()).unwrap();
        assert_eq!(n, 7);
        assert_eq!(a, [1, 2, 3]);
        assert_eq!(b, [4, 5, 6, 7, 0]);
    }

    #[test]
    fn cross_process_path_works_on_self() {
        let src = [9u8; 100];
        let mut dst = [0u8; 100];
        let local = [Span { addr: dst.as_mut_ptr() as u64, len: 100 }];
        let remote =
            [Span { addr: src.as_ptr() as u64, len: 60 }, Span { addr: src.as_ptr() as u64, len: 40 }];
        let n = copy_spans(Dir::Read, getpid(), false, &local, &remote).map_err(|_| ()).unwrap();
        assert_eq!(n, 100);
        assert_eq!(dst, [9u8; 100]);
    }

    #[test]
    fn staging_is_chosen_only_for_long_copies_just_behind_their_destination() {
        let page = 1u64 << 20;
        // A page-aligned source pushed 16 bytes into a page: the malloc'd-buffer case.
        assert!(needs_staging(Dir::Write, page, page + 4096 * 3 + 16, 64 << 10));
        // Reads copy remote → local, so the skew is measured the other way round.
        assert!(needs_staging(Dir::Read, page + 16, page, 64 << 10));
        assert!(!needs_staging(Dir::Read, page, page + 16, 64 << 10));
        assert!(!needs_staging(Dir::Write, page + 16, page, 64 << 10));
        // Equal page offsets, far-apart offsets and short pieces go direct.
        assert!(!needs_staging(Dir::Write, page + 16, page + 8192 + 16, 64 << 10));
        assert!(!needs_staging(Dir::Write, page, page + 2048, 64 << 10));
        assert!(!needs_staging(Dir::Write, page, page + crate::buffers::copy::ALIAS_WINDOW as u64, 64 << 10));
        assert!(!needs_staging(Dir::Write, page, page + 16, STAGE_MIN - 1));
        assert!(needs_staging(Dir::Write, page, page + 1, STAGE_MIN));
    }

    /// A buffer whose bytes start `skew` bytes past a page boundary.
    fn skewed(len: usize, skew: usize, fill: impl Fn(usize) -> u8) -> (Vec<u8>, usize) {
        let mut v = vec![0u8; len + 8192];
        let head = (4096 - v.as_ptr() as usize % 4096) % 4096 + skew;
        for (i, b) in v[head..head + len].iter_mut().enumerate() {
            *b = fill(i);
        }
        (v, head)
    }

    #[test]
    fn staged_copies_move_every_byte_in_both_directions() {
        // Long enough for several bounce chunks, with an odd tail.
        let len = 2 * STAGE_CHUNK + 12_345;
        let pat = |i: usize| (i * 31 % 251) as u8;
        for (dir, src_skew, dst_skew) in
            [(Dir::Write, 0, 16), (Dir::Write, 4000, 4040), (Dir::Read, 0, 8), (Dir::Read, 100, 131)]
        {
            let (src, sh) = skewed(len, src_skew, pat);
            let (mut dst, dh) = skewed(len, dst_skew, |_| 0);
            let s = Span { addr: src[sh..].as_ptr() as u64, len: len as u64 };
            let d = Span { addr: dst[dh..].as_mut_ptr() as u64, len: len as u64 };
            let (local, remote) = match dir {
                Dir::Write => (s, d),
                Dir::Read => (d, s),
            };
            assert!(needs_staging(dir, local.addr, remote.addr, local.len), "{dir:?} case is not staged");
            let n = copy_spans(dir, getpid(), false, &[local], &[remote]).map_err(|_| ()).unwrap();
            assert_eq!(n, len as u64);
            assert!(dst[dh..dh + len].iter().enumerate().all(|(i, &b)| b == pat(i)), "{dir:?} copy differs");
            assert!(dst[..dh].iter().chain(&dst[dh + len..]).all(|&b| b == 0), "{dir:?} wrote outside");
        }
    }

    #[test]
    fn lists_mix_staged_and_direct_pieces() {
        // Remote: one buffer 16 bytes into a page. Local: three pieces, the first and last 8 and
        // 16 bytes ahead of their remote bytes mod 4 KiB (staged), the middle one short (direct).
        let pat = |i: usize| (i * 7 % 253) as u8;
        let (remote_buf, rh) = skewed(100_000, 16, pat);
        let (mut a, ah) = skewed(40_000, 16 + 8, |_| 0);
        let (mut b, bh) = skewed(1_000, 700, |_| 0);
        let (mut c, ch) = skewed(59_000, (16 + 41_000) % 4096 + 16, |_| 0);
        let local = [
            Span { addr: a[ah..].as_mut_ptr() as u64, len: 40_000 },
            Span { addr: b[bh..].as_mut_ptr() as u64, len: 1_000 },
            Span { addr: c[ch..].as_mut_ptr() as u64, len: 59_000 },
        ];
        let remote = [Span { addr: remote_buf[rh..].as_ptr() as u64, len: 100_000 }];
        let pieces: Vec<_> = Pieces::new(&local, &remote).collect();
        assert_eq!(pieces.len(), 3);
        let staged: Vec<bool> = pieces.iter().map(|&(l, r, n)| needs_staging(Dir::Read, l, r, n)).collect();
        assert_eq!(staged, [true, false, true]);
        let n = copy_spans(Dir::Read, getpid(), false, &local, &remote).map_err(|_| ()).unwrap();
        assert_eq!(n, 100_000);
        let got: Vec<u8> =
            a[ah..ah + 40_000].iter().chain(&b[bh..bh + 1_000]).chain(&c[ch..ch + 59_000]).copied().collect();
        assert!(got.iter().enumerate().all(|(i, &x)| x == pat(i)));
    }

    #[test]
    fn start_time_identifies_us() {
        let t = process_start_time(getpid()).unwrap();
        assert!(process_alive(getpid(), t));
        assert!(!process_alive(getpid(), t + 1));
    }

    #[test]
    fn a_forked_child_reports_its_own_pid() {
        let parent = getpid(); // fills the cache
        // SAFETY: the child only runs async-signal-safe code (an atomic, getpid, _exit) before
        // it exits, as a child of a multi-threaded process must.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: getpid has no preconditions.
            let ok = getpid() == unsafe { libc::getpid() } as u32 && getpid() != parent;
            // SAFETY: _exit has no preconditions; the child must not run the harness's exit code.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(r, child);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the child saw its parent's pid");
        assert_eq!(getpid(), parent);
    }

    #[test]
    fn memfd_is_sealed() {
        let f = sealed_memfd("ionet-test", 8192).unwrap();
        assert!(is_shrink_sealed(&f));
        assert!(f.set_len(4096).is_err());
    }
}

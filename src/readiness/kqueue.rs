//! The descriptor an external event loop waits on instead of a thread blocked in `progress`,
//! outside Linux: a kqueue of the endpoint's own watching the transport's kqueue (mio's poller,
//! where the sockets and the transport's waker are registered), a timer for the endpoint's
//! deadlines and the transport's timers, and a user event that says "something was queued for
//! you" when a completion arrives outside the caller's own rounds. It is the Linux epoll set
//! (`readiness.rs`) with kqueue filters in place of its descriptors:
//!
//! | Linux                          | here                                      |
//! |--------------------------------|-------------------------------------------|
//! | the transport's epoll instance | `EVFILT_READ` on the transport's kqueue   |
//! | a timerfd                      | a one-shot `EVFILT_TIMER` (nanoseconds)   |
//! | an eventfd                     | `EVFILT_USER`, fired with `NOTE_TRIGGER`  |
//!
//! A kqueue is readable while it has pending events, and `EVFILT_READ` on another kqueue is
//! pending exactly while that one has pending events: once a progress round has collected the
//! transport's events (mio registers its sources edge-triggered, `EV_CLEAR`), the descriptor
//! goes quiet again, for level-triggered and edge-triggered waiters alike.
//!
//! The wake-up protocol is the Linux one, call for call: [`WaitSet::notify`] leaves a pending
//! event behind until [`WaitSet::clear`] consumes it, and the timer's expiry stays pending
//! until `clear` (or the next [`WaitSet::set_timer`]) takes it back. Nothing here ever collects
//! events from the endpoint's own kqueue — that would consume them — so "consuming" a pending
//! timer or notice is deleting its event (which drops a pending activation with it) and, for
//! the notice, adding it back at once, armed and untriggered. The endpoint's kqueue exists from
//! the start, so the descriptor is stable even for a client endpoint whose transport is chosen
//! by its first `connect`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[cfg(test)]
use rustix::event::{PollFd, PollFlags};
#[cfg(test)]
use rustix::time::Timespec;

/// The identifier of the timer and of the user event (each filter has its own name space).
const IDENT: usize = 0;

/// The endpoint's kqueue and what it watches.
#[derive(Debug)]
pub(crate) struct WaitSet {
    kq: OwnedFd,
    /// The timer may be set or have expired unread; the notice may be unread. Each is raised
    /// after its system call, so a flag found down means nothing is left to clear: a round
    /// of an event loop then costs no system call here (it runs thousands of times a second
    /// while the loop polls).
    timer_set: AtomicBool,
    notified: AtomicBool,
}

impl WaitSet {
    pub(crate) fn new() -> io::Result<WaitSet> {
        let kq = rustix::event::kqueue::kqueue()?;
        // A kqueue is not inherited by a forked child, but a descriptor number left open
        // across `exec` would still leak into the new program.
        rustix::io::fcntl_setfd(&kq, rustix::io::FdFlags::CLOEXEC)?;
        let w = WaitSet { kq, timer_set: AtomicBool::new(false), notified: AtomicBool::new(false) };
        // `EV_CLEAR` only resets the event when an event loop collects it, which never happens
        // here; `clear` re-adds it instead. Level behaviour comes from that: the set stays
        // readable while a notice is unread.
        w.apply(&mut [change(IDENT, libc::EVFILT_USER, libc::EV_ADD | libc::EV_CLEAR, 0, 0)])?;
        Ok(w)
    }

    /// Makes the set readable until [`WaitSet::clear`].
    pub(crate) fn notify(&self) {
        // The user event is always registered, so nothing can fail it but a closed kqueue,
        // and then there is nobody to wake.
        let _ = self.apply(&mut [change(IDENT, libc::EVFILT_USER, 0, libc::NOTE_TRIGGER, 0)]);
        self.notified.store(true, Ordering::Release);
    }

    /// Adds the transport's descriptor (level-triggered: readable while it has events).
    pub(crate) fn add_transport(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        let ident =
            usize::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        self.apply(&mut [change(ident, libc::EVFILT_READ, libc::EV_ADD, 0, 0)])
    }

    /// Fires the timer after `after` (`None`: never). A zero duration means "at once", which
    /// becomes one nanosecond, as on Linux.
    pub(crate) fn set_timer(&self, after: Option<Duration>) -> io::Result<()> {
        if after.is_none() && !self.timer_set.load(Ordering::Acquire) {
            return Ok(());
        }
        self.settime(after)?;
        if after.is_some() {
            self.timer_set.store(true, Ordering::Release);
        }
        Ok(())
    }

    fn settime(&self, after: Option<Duration>) -> io::Result<()> {
        match after {
            // Deleting the timer also drops an expiry not consumed yet, as disarming a
            // timerfd and reading it does.
            None => self.apply(&mut [change(IDENT, libc::EVFILT_TIMER, libc::EV_DELETE, 0, 0)]),
            Some(d) => {
                let ns = d.max(Duration::from_nanos(1)).as_nanos();
                let data = isize::try_from(ns).unwrap_or(isize::MAX);
                // Re-adding a timer restarts it and throws away an expiry not consumed yet,
                // like `timerfd_settime`.
                let flags = libc::EV_ADD | libc::EV_ONESHOT;
                self.apply(&mut [change(IDENT, libc::EVFILT_TIMER, flags, libc::NOTE_NSECONDS, data)])
            }
        }
    }

    /// Disarms the timer and consumes an expiry or notice not read yet, so the set is readable
    /// again only for what happens next.
    pub(crate) fn clear(&self) -> io::Result<()> {
        if self.timer_set.load(Ordering::Acquire) && self.timer_set.swap(false, Ordering::AcqRel) {
            self.settime(None)?;
        }
        if self.notified.load(Ordering::Acquire) && self.notified.swap(false, Ordering::AcqRel) {
            // One call: delete (with any pending trigger) and add back, untriggered. A notice
            // racing with it is consumed or kept, as a notice written to an eventfd being
            // drained is on Linux; `try_progress`, which clears first, looks at the queues
            // after either way.
            self.apply(&mut [
                change(IDENT, libc::EVFILT_USER, libc::EV_DELETE, 0, 0),
                change(IDENT, libc::EVFILT_USER, libc::EV_ADD | libc::EV_CLEAR, 0, 0),
            ])?;
        }
        Ok(())
    }

    /// Whether nothing is pending, after dropping what only looks pending. A kqueue keeps a
    /// level-triggered event queued until someone collects from it, even once its source went
    /// quiet: after a progress round has drained the transport's kqueue, its `EVFILT_READ`
    /// here would linger, keeping this descriptor readable for a poller that waits on it, and —
    /// worse — swallowing the next activation, so an edge-triggered waiter (tokio) would never
    /// hear of the transport's next event. Collecting re-checks each event: stale ones leave
    /// the queue, live ones are returned (a level-triggered one stays queued). Called by `arm`
    /// after the transport is armed and before the timer is set or anyone may notify, so what
    /// it collects is the transport's events, or an expiry or notice of an earlier arming that
    /// `try_progress` has not consumed; either way `false` sends the caller to a round instead
    /// of to sleep, and the round does what they asked for.
    pub(crate) fn settle(&self) -> io::Result<bool> {
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let mut got = [change(0, 0, 0, 0, 0); 4];
        let cap = libc::c_int::try_from(got.len()).unwrap_or(1);
        // SAFETY: no changes; a live array of `cap` kevent structs for the kernel to fill and a
        // live zero timeout, none of which the kernel keeps.
        let n =
            unsafe { libc::kevent(self.kq.as_raw_fd(), std::ptr::null(), 0, got.as_mut_ptr(), cap, &zero) };
        match n {
            0 => Ok(true),
            n if n > 0 => Ok(false),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => Ok(false),
                e => Err(e),
            },
        }
    }

    /// Applies `changes` without collecting a pending event: `EV_RECEIPT` makes the kernel
    /// answer every change with its own result instead. Deleting an event that is not there
    /// (a timer never set) is not an error.
    fn apply(&self, changes: &mut [libc::kevent]) -> io::Result<()> {
        // Receipts on the stack: `notify` runs on the path that queues a completion.
        let mut out = [change(0, 0, 0, 0, 0); 2];
        let Some(out) = out.get_mut(..changes.len()) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        for c in changes.iter_mut() {
            c.flags |= libc::EV_RECEIPT;
        }
        let n = out.len() as libc::c_int;
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: the change list and the receipt list are live arrays of `n` kevent structs
        // each, and the timeout a live timespec; the kernel reads the first, writes at most
        // `n` entries into the second and keeps no pointer to any of them. No change names a
        // descriptor the kqueue could outlive to harm: a watched descriptor that is closed
        // simply leaves the kqueue.
        let r = unsafe { libc::kevent(self.kq.as_raw_fd(), changes.as_ptr(), n, out.as_mut_ptr(), n, &zero) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = usize::try_from(r).unwrap_or(0).min(out.len());
        // One receipt per change, in order: `EV_ERROR`, and the error (or 0) in `data`. Some
        // kernels (FreeBSD) overwrite the change's own flags there, so those are read from the
        // change.
        for (e, c) in out[..got].iter().zip(changes.iter()) {
            if e.flags & libc::EV_ERROR != 0 && e.data != 0 {
                let errno = i32::try_from(e.data).unwrap_or(libc::EINVAL);
                if errno == libc::ENOENT && c.flags & libc::EV_DELETE != 0 {
                    continue;
                }
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        Ok(())
    }

    /// Whether the set is readable now.
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        let mut fds = [PollFd::new(&self.kq, PollFlags::IN)];
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }
}

/// One change for `kevent`, with no user data.
fn change(ident: usize, filter: i16, flags: u16, fflags: u32, data: isize) -> libc::kevent {
    // SAFETY: `struct kevent` is integers and one pointer (or integer) of user data, for which
    // all zeroes is a valid value (a null pointer); the fields this module uses are set below.
    let mut k: libc::kevent = unsafe { std::mem::zeroed() };
    k.ident = ident;
    k.filter = filter;
    k.flags = flags;
    k.fflags = fflags;
    k.data = data as _;
    k
}

impl AsFd for WaitSet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.kq.as_fd()
    }
}

#[cfg(test)]
#[path = "contract_tests.rs"]
mod contract_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// A wait set holding a transport's kqueue in which one end of a socket pair is registered
    /// edge-triggered, as mio registers its sources; returns the set, the inner kqueue and both
    /// ends (the receiving end must outlive its registration).
    fn nested() -> (WaitSet, OwnedFd, UnixStream, UnixStream) {
        let w = WaitSet::new().unwrap();
        let inner = rustix::event::kqueue::kqueue().unwrap();
        let (rx, tx) = UnixStream::pair().unwrap();
        let ident = usize::try_from(rx.as_raw_fd()).unwrap();
        let mut reg = [change(ident, libc::EVFILT_READ, libc::EV_ADD | libc::EV_CLEAR, 0, 0)];
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: one live change, no receipt list; the caller keeps `rx` past its registration.
        let r =
            unsafe { libc::kevent(inner.as_raw_fd(), reg.as_mut_ptr(), 1, std::ptr::null_mut(), 0, &zero) };
        assert_eq!(r, 0);
        w.add_transport(inner.as_fd()).unwrap();
        (w, inner, rx, tx)
    }

    /// Collects the inner kqueue's pending events, as a progress round does; how many.
    fn collect(inner: &OwnedFd) -> i32 {
        let mut got = [change(0, 0, 0, 0, 0); 4];
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a live array of four kevent structs to fill, no changes.
        unsafe { libc::kevent(inner.as_raw_fd(), std::ptr::null(), 0, got.as_mut_ptr(), 4, &zero) }
    }

    #[test]
    fn a_nested_instance_is_readable_only_while_its_items_are() {
        let (w, inner, _rx, tx) = nested();
        assert!(!w.is_ready());
        (&tx).write_all(b"x").unwrap();
        assert!(w.is_ready());
        // Collecting the inner event (what a progress round does) quiets the outer set,
        // although the socket itself is still readable.
        assert_eq!(collect(&inner), 1);
        assert!(!w.is_ready());
        // A new edge wakes it again.
        (&tx).write_all(b"x").unwrap();
        assert!(w.is_ready());
    }

    #[test]
    fn settling_drops_a_transport_event_gone_stale_so_the_next_one_is_heard() {
        let (w, inner, _rx, tx) = nested();
        assert!(w.settle().unwrap());
        (&tx).write_all(b"x").unwrap();
        assert!(!w.settle().unwrap(), "the transport has an event to collect");
        assert_eq!(collect(&inner), 1);
        assert!(w.settle().unwrap(), "collected inside: nothing is pending any more");
        assert!(!w.is_ready());
        w.notify();
        assert!(!w.settle().unwrap(), "a notice is pending");
    }
}

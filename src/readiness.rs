//! The descriptor an external event loop waits on instead of a thread blocked in `progress`:
//! an epoll instance of the endpoint's own holding the transport's epoll instance (sockets,
//! completion channels and the wake-up eventfd are registered there), a timer for the
//! endpoint's deadlines and the transport's timers, and an eventfd that says "something was
//! queued for you" when a completion arrives outside the caller's own rounds.
//!
//! A nested epoll instance is readable exactly while one of its ready items is: polling it
//! polls the items it lists, so once a progress round has collected the transport's events
//! the descriptor goes quiet again, for level-triggered and edge-triggered waiters alike.
//! The endpoint's own instance exists from the start, so the descriptor is stable even for a
//! client endpoint whose transport is chosen by its first `connect`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{EventfdFlags, eventfd};
#[cfg(test)]
use rustix::event::{PollFd, PollFlags};
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, timerfd_create, timerfd_settime,
};

/// The endpoint's epoll instance and its timer.
#[derive(Debug)]
pub(crate) struct WaitSet {
    epoll: OwnedFd,
    timer: OwnedFd,
    notify: OwnedFd,
    /// The timer may be set or have expired unread; the notice may be unread. Each is raised
    /// after its system call, so a flag found down means nothing is left to clear: a round
    /// of an event loop then costs no system call here (it runs thousands of times a second
    /// while the loop polls).
    timer_set: AtomicBool,
    notified: AtomicBool,
}

impl WaitSet {
    pub(crate) fn new() -> io::Result<WaitSet> {
        let epoll = epoll::create(CreateFlags::CLOEXEC)?;
        let timer =
            timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        let notify = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        // Level-triggered: the set stays readable while an expiry or a notice is unread.
        epoll::add(&epoll, &timer, EventData::new_u64(0), EventFlags::IN)?;
        epoll::add(&epoll, &notify, EventData::new_u64(2), EventFlags::IN)?;
        Ok(WaitSet {
            epoll,
            timer,
            notify,
            timer_set: AtomicBool::new(false),
            notified: AtomicBool::new(false),
        })
    }

    /// Makes the set readable until [`WaitSet::clear`].
    pub(crate) fn notify(&self) {
        // Only EAGAIN can fail it (a counter at its maximum), and that is readable anyway.
        let _ = rustix::io::write(&self.notify, &1u64.to_ne_bytes());
        self.notified.store(true, Ordering::Release);
    }

    /// Adds the transport's descriptor (level-triggered: readable while it has events).
    pub(crate) fn add_transport(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        Ok(epoll::add(&self.epoll, fd, EventData::new_u64(1), EventFlags::IN)?)
    }

    /// Fires the timer after `after` (`None`: never). A zero duration means "at once", which
    /// `timerfd_settime` would read as "disarm", so it becomes one nanosecond.
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
        let it_value = match after {
            None => Timespec { tv_sec: 0, tv_nsec: 0 },
            Some(d) => {
                let d = d.max(Duration::from_nanos(1));
                Timespec {
                    tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX),
                    tv_nsec: d.subsec_nanos().into(),
                }
            }
        };
        let spec = Itimerspec { it_interval: Timespec { tv_sec: 0, tv_nsec: 0 }, it_value };
        timerfd_settime(&self.timer, TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Whether nothing is pending that a caller about to sleep would miss: always, here. epoll
    /// works out a nested instance's readiness when it is polled, so nothing stale lingers
    /// (the kqueue version, outside Linux, has to look).
    pub(crate) fn settle(&self) -> io::Result<bool> {
        Ok(true)
    }

    /// Disarms the timer and consumes an expiry or notice not read yet, so the set is readable
    /// again only for what happens next.
    pub(crate) fn clear(&self) -> io::Result<()> {
        if self.timer_set.load(Ordering::Acquire) && self.timer_set.swap(false, Ordering::AcqRel) {
            self.settime(None)?;
            drain(&self.timer)?;
        }
        if self.notified.load(Ordering::Acquire) && self.notified.swap(false, Ordering::AcqRel) {
            drain(&self.notify)?;
        }
        Ok(())
    }

    /// Whether the set is readable now.
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        let mut fds = [PollFd::new(&self.epoll, PollFlags::IN)];
        let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }
}

/// Reads a timerfd's or eventfd's count, if any.
fn drain(fd: &OwnedFd) -> io::Result<()> {
    let mut buf = [0u8; 8];
    match rustix::io::read(fd, &mut buf) {
        Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl AsFd for WaitSet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.epoll.as_fd()
    }
}

#[cfg(test)]
#[path = "readiness/contract_tests.rs"]
mod contract_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_instance_is_readable_only_while_its_items_are() {
        let w = WaitSet::new().unwrap();
        let inner = epoll::create(CreateFlags::CLOEXEC).unwrap();
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap();
        // Edge-triggered inside, as mio registers its sources.
        epoll::add(&inner, &ev, EventData::new_u64(7), EventFlags::IN | EventFlags::ET).unwrap();
        w.add_transport(inner.as_fd()).unwrap();
        assert!(!w.is_ready());
        rustix::io::write(&ev, &1u64.to_ne_bytes()).unwrap();
        assert!(w.is_ready());
        // Collecting the inner event (what a progress round does) quiets the outer set,
        // although the eventfd itself is still readable.
        let mut events = Vec::with_capacity(4);
        epoll::wait(&inner, spare(&mut events), Some(&Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap();
        assert_eq!(events.len(), 1);
        assert!(!w.is_ready());
        // A new edge wakes it again.
        rustix::io::write(&ev, &1u64.to_ne_bytes()).unwrap();
        assert!(w.is_ready());
    }

    fn spare(v: &mut Vec<epoll::Event>) -> rustix::buffer::SpareCapacity<'_, epoll::Event> {
        rustix::buffer::spare_capacity(v)
    }
}

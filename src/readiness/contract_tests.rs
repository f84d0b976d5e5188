//! The wait set's contract, tested once for whichever implementation the platform builds (epoll,
//! timerfd and eventfd on Linux; a kqueue elsewhere): what makes the set readable, and what
//! quiets it again.

use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::time::Timespec;

use super::WaitSet;

#[test]
fn the_timer_makes_the_set_readable_and_clearing_quiets_it() {
    let w = WaitSet::new().unwrap();
    assert!(!w.is_ready());
    w.set_timer(Some(Duration::ZERO)).unwrap();
    let mut fds = [PollFd::new(&w, PollFlags::IN)];
    let ten_s = Timespec { tv_sec: 10, tv_nsec: 0 };
    assert_eq!(rustix::event::poll(&mut fds, Some(&ten_s)).unwrap(), 1);
    assert!(w.is_ready(), "an unread expiry keeps the set readable");
    w.clear().unwrap();
    assert!(!w.is_ready());
}

#[test]
fn a_notice_makes_the_set_readable_until_cleared() {
    let w = WaitSet::new().unwrap();
    w.notify();
    w.notify();
    assert!(w.is_ready());
    w.clear().unwrap();
    assert!(!w.is_ready());
    w.notify();
    assert!(w.is_ready(), "a notice after a clear is heard again");
}

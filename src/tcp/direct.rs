//! Direct waits: with a single quiet connection, a driver allowed to block does one blocking
//! `recv` on its socket, straight into the link's staging buffer, instead of `epoll_wait` +
//! `recv` — the same single system call per message as a plain blocking socket, and the
//! kernel's direct wake-up of a reader.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mio::net::TcpStream;
use rustix::net::RecvFlags;
use socket2::SockRef;

use crate::core::stream::LinkId;
use crate::error::Result;

use super::sock::note_moved;
use super::{State, TcpBackend};

/// Longest one blocking `recv` of a direct wait lasts (`SO_RCVTIMEO`; the kernel rounds it up to
/// whole ticks, so a little more): what bounds the delay of anything a direct wait cannot see.
const DIRECT_RECV_TIMEOUT: Duration = Duration::from_millis(5);
/// Direct waits only for progress calls allowed to block at least this long, so the rounded-up
/// receive timeout never outlasts the caller's bound.
pub(super) const DIRECT_MIN_WAIT: Duration = Duration::from_millis(50);
/// Every this many direct waits, one epoll round instead (accepts, the waker, stray events).
const DIRECT_EPOLL_EVERY: u32 = 32;
/// Progress rounds without direct waits after another thread needed the driver during one.
pub(super) const DIRECT_HOLDOFF: u32 = 256;

/// What a direct wait needs, taken under the state lock.
pub(super) struct DirectWait {
    link: LinkId,
    sock: Arc<TcpStream>,
    /// The link's (empty) staging buffer, lent to the waiting driver.
    buf: Box<[u8]>,
    /// Bytes to read at most.
    want: usize,
}

impl TcpBackend {
    /// One direct wait (see the module). What this `recv` cannot see (a new connection on the
    /// listener, `wake`, frames another thread queued) waits at most [`DIRECT_RECV_TIMEOUT`]; a
    /// quiet connection goes back to epoll after one timeout, and epoll is polled every
    /// [`DIRECT_EPOLL_EVERY`] direct waits.
    pub(super) fn direct_wait(&self, d: DirectWait) -> Result<()> {
        let DirectWait { link, sock, mut buf, want } = d;
        let r = rustix::net::recv(&*sock, &mut buf[..want], RecvFlags::empty());
        self.blocked.store(false, Ordering::Release);
        let mut guard = self.lock();
        let st = &mut *guard;
        st.in_direct = false;
        let n = match r {
            Ok((n, _)) => n,
            Err(_) => 0,
        };
        let returned = st.session.return_staging(link, buf, n);
        let Some(s) = st.socks.get_mut(link).filter(|_| returned) else {
            // Closed meanwhile (by another thread): the bytes go with it.
            self.deliver(guard);
            return Ok(());
        };
        match r {
            Ok((0, _)) => st.session.link_failed(link, "connection closed by peer".into()),
            Ok((n, _)) => {
                note_moved(n);
                // A FIN behind these bytes is not lost to the `drained` shortcut: this `recv`
                // consumed no epoll edge, so the next epoll round reports it (setting `hup`),
                // and the next direct wait, if any, reads the EOF itself.
                s.drained = n < want;
                s.drained_fresh = true;
                s.readable = true;
                st.read_ready.push_back(link);
                st.run_reads(&self.registry);
            }
            // The receive timeout: this connection went quiet.
            Err(rustix::io::Errno::AGAIN) => st.direct_idle = true,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => st.session.link_failed(link, format!("read: {e}")),
        }
        st.apply_actions(&self.registry);
        st.flush_ready(&self.registry);
        self.deliver(guard);
        Ok(())
    }
}

impl State {
    /// The lone connection, if a direct wait may be used on it now; lends out its staging
    /// buffer (it is empty) and marks the driver as in a direct wait.
    pub(super) fn direct_candidate(&mut self) -> Option<DirectWait> {
        if self.direct_holdoff > 0 {
            self.direct_holdoff -= 1;
            return None;
        }
        if self.direct_idle
            || !self.session.tx_paused.is_empty()
            || self.socks.len() != 1
            || self.session.link_count() != 1
            || self.session.wants_transmit()
            || !self.read_ready.is_empty()
            || self.session.done_len() > 0
        {
            return None;
        }
        self.direct_rounds += 1;
        if self.direct_rounds > DIRECT_EPOLL_EVERY {
            return None;
        }
        let (link, s) = self.socks.iter_mut().next()?;
        if s.direct.is_none() {
            // Once per connection: blocking mode with a receive timeout. Every other read and
            // write on it passes MSG_DONTWAIT, so nothing else ever blocks.
            let r = SockRef::from(&*s.stream);
            let ok =
                r.set_read_timeout(Some(DIRECT_RECV_TIMEOUT)).is_ok() && r.set_nonblocking(false).is_ok();
            s.direct = Some(ok);
        }
        if s.direct != Some(true) {
            return None;
        }
        let (buf, want) = self.session.lend_for_direct_read(link)?;
        // A blocking `recv` waits for the mark, not for the first bytes: a header is short.
        s.set_wake_mark(1);
        self.in_direct = true;
        Some(DirectWait { link, sock: s.stream.clone(), buf, want })
    }

    /// Another thread called in while a driver was in a direct wait: if it left work only an
    /// epoll round sees (unwritten frames, a new connection), stop direct waits for a while.
    pub(super) fn after_foreign_call(&mut self) {
        if !self.session.lone_quiet_link() {
            self.direct_holdoff = DIRECT_HOLDOFF;
        }
    }
}

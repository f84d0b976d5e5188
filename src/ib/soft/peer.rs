//! A peer context as seen by an initiator: its mapped image, a pidfd for liveness, and the
//! eventfds of its completion channels.
//!
//! A software GID names a context completely: `fe80:5349:<pid>:<memfd fd>:<token>` (the
//! "SI" word marks software GIDs). Attaching duplicates the peer's sealed memfd with
//! `pidfd_getfd`, maps it and checks that its header carries the same pid and token, so a
//! recycled pid or a stale GID can never reach the wrong process's memory.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::shm::Shm;
use super::sys::{self, PidFd};
use crate::ib::verbs::Gid;

/// The parts of a software GID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SoftGid {
    pub(crate) pid: u32,
    pub(crate) fd: u32,
    pub(crate) token: u32,
}

const PREFIX: [u8; 4] = [0xfe, 0x80, 0x53, 0x49];

impl SoftGid {
    pub(crate) fn to_gid(self) -> Gid {
        let mut g = [0u8; 16];
        g[0..4].copy_from_slice(&PREFIX);
        g[4..8].copy_from_slice(&self.pid.to_be_bytes());
        g[8..12].copy_from_slice(&self.fd.to_be_bytes());
        g[12..16].copy_from_slice(&self.token.to_be_bytes());
        Gid(g)
    }

    pub(crate) fn parse(gid: &Gid) -> Option<SoftGid> {
        let g = &gid.0;
        if g[0..4] != PREFIX {
            return None;
        }
        let w = |i: usize| u32::from_be_bytes([g[i], g[i + 1], g[i + 2], g[i + 3]]);
        Some(SoftGid { pid: w(4), fd: w(8), token: w(12) })
    }
}

/// LID of a context with this token (unicast range 1..0xC000).
pub(crate) fn lid_for(token: u32) -> u16 {
    (token % 0xBFFE) as u16 + 1
}

/// An attached peer context.
#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) shm: Shm,
    pidfd: PidFd,
    pub(crate) lid: u16,
    /// The peer is this process: copy with `memmove` instead of `process_vm_*`.
    pub(crate) same_process: bool,
    eventfds: Mutex<HashMap<u64, Option<Arc<OwnedFd>>>>,
    /// When the pidfd was last seen alive (ns since `attached`); checking costs a syscall.
    checked_ns: AtomicU64,
    attached: Instant,
}

/// How long a liveness answer is reused. A dead peer is noticed within this time (or at once
/// when a copy into it fails with ESRCH).
const LIVENESS_TTL_NS: u64 = 1_000_000;

impl Peer {
    /// Attaches to the context a GID names.
    pub(crate) fn attach(gid: &Gid) -> Result<Peer, String> {
        let id = SoftGid::parse(gid).ok_or_else(|| format!("{gid} is not a softib GID"))?;
        let pidfd = PidFd::open(id.pid).map_err(|e| format!("pid {}: {e}", id.pid))?;
        let fd = i32::try_from(id.fd).map_err(|_| "bad fd in GID".to_string())?;
        let file = File::from(pidfd.get_fd(fd).map_err(|e| format!("pidfd_getfd({}, {fd}): {e}", id.pid))?);
        let shm = Shm::open_peer(file)?;
        let h = shm.header();
        if h.pid.load(Acquire) != u64::from(id.pid) || h.token.load(Acquire) != u64::from(id.token) {
            return Err("GID does not match the peer image (stale GID or recycled pid)".into());
        }
        let lid = lid_for(id.token);
        Ok(Peer {
            shm,
            same_process: id.pid == sys::getpid(),
            pidfd,
            lid,
            eventfds: Mutex::new(HashMap::new()),
            checked_ns: AtomicU64::new(0),
            attached: Instant::now(),
        })
    }

    /// False once the peer process has exited.
    pub(crate) fn alive(&self, now: Instant) -> bool {
        if self.same_process {
            return true;
        }
        let now = now.saturating_duration_since(self.attached).as_nanos() as u64 + 1;
        let last = self.checked_ns.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < LIVENESS_TTL_NS {
            return true;
        }
        let alive = self.pidfd.is_alive();
        if alive {
            self.checked_ns.store(now, Relaxed);
        }
        alive
    }

    /// Like [`alive`](Self::alive) but always asks the kernel.
    pub(crate) fn alive_now(&self) -> bool {
        self.same_process || self.pidfd.is_alive()
    }

    /// The peer's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pidfd.pid()
    }

    /// Signals the peer's eventfd number `fd` (a completion channel), duplicating it on first
    /// use. A number that does not name an eventfd is remembered as unusable.
    pub(crate) fn wake(&self, fd: u64) {
        let efd = {
            let mut map = self.eventfds.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(fd)
                .or_insert_with(|| {
                    let n = i32::try_from(fd).ok()?;
                    let dup = self.pidfd.get_fd(n).ok()?;
                    if sys::is_eventfd(dup.as_raw_fd()) {
                        Some(Arc::new(dup))
                    } else {
                        tracing::debug!(fd, "peer channel descriptor is not an eventfd; wake-ups dropped");
                        None
                    }
                })
                .clone()
        };
        if let Some(efd) = efd
            && let Err(err) = sys::eventfd_signal(efd.as_raw_fd())
        {
            tracing::debug!(%err, "waking a peer channel failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_round_trip() {
        let g = SoftGid { pid: 1234, fd: 7, token: 0xdead_beef };
        assert_eq!(SoftGid::parse(&g.to_gid()), Some(g));
        assert_eq!(SoftGid::parse(&Gid([0; 16])), None);
        assert!(Peer::attach(&Gid([0; 16])).is_err());
    }
}

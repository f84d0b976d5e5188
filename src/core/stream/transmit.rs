//! Frames leaving: which links have something to send and take bytes, the weighted scheduler
//! between service levels, the bytes lent to the driver and what writing them finishes.

use crate::types::ServiceLevel;

use super::link::{IoVec, OnDone};
use super::{LinkId, Session};

/// Bytes one link may write per turn while several classes compete.
const CONTENDED_QUANTUM: usize = 256 * 1024;

impl Session {
    /// Whether any link has frames to send and takes bytes.
    #[inline]
    pub(crate) fn wants_transmit(&self) -> bool {
        !self.write_ready.is_empty()
    }

    /// The one link that wants to transmit, if exactly one does (the common case, which needs
    /// no scheduling).
    #[inline]
    pub(crate) fn lone_transmit(&self) -> Option<LinkId> {
        match self.write_ready.len() {
            1 => self.write_ready.iter().next().copied(),
            _ => None,
        }
    }

    /// The next turn of writing: fills `turn` with the links of the class the scheduler picks
    /// and returns how many bytes each may write, or `None` when nothing is left to write.
    pub(crate) fn transmit_turn(&mut self, turn: &mut Vec<LinkId>) -> Option<usize> {
        turn.clear();
        // One pass: which classes have a link that takes bytes with something to send.
        let mut backlog = [false; ServiceLevel::COUNT];
        let Session { write_ready, links, .. } = self;
        write_ready.retain(|l| match links.get(*l) {
            Some(c) if c.writable && c.has_frames() => {
                backlog[c.sl.index()] = true;
                true
            }
            _ => false,
        });
        let sl = self.sched.next(backlog)?;
        // Several classes compete: each turn writes a quantum. Alone, a class may write all.
        let quantum = if backlog.iter().filter(|b| **b).count() > 1 { CONTENDED_QUANTUM } else { usize::MAX };
        turn.extend(self.write_ready.iter().filter(|l| self.links.get(**l).is_some_and(|c| c.sl == sl)));
        Some(quantum)
    }

    /// Lends the bytes `link` sends next (at most [`super::MAX_IOV`] pieces): false when it has
    /// nothing to send or does not take bytes. Answer with [`Session::transmitted`] or
    /// [`Session::transmit_blocked`].
    #[inline]
    pub(crate) fn transmit<'a>(&'a self, link: LinkId, iov: &mut IoVec<'a>) -> bool {
        let Some(c) = self.links.get(link) else { return false };
        if !c.writable {
            return false;
        }
        let q = if !c.hs_tx.is_empty() {
            &c.hs_tx
        } else if c.is_ready() {
            &c.tx
        } else {
            return false;
        };
        for f in q.iter() {
            if iov.len() + 3 > super::MAX_IOV {
                break;
            }
            f.unsent(&self.ops, iov);
        }
        !iov.is_empty()
    }

    /// The link took `n` of the bytes [`Session::transmit`] lent. Returns whether it has more
    /// to send.
    #[inline]
    pub(crate) fn transmitted(&mut self, link: LinkId, n: usize) -> bool {
        self.advance_tx(link, n);
        match self.links.get(link) {
            Some(c) if c.has_frames() => true,
            _ => {
                self.write_ready.remove(&link);
                false
            }
        }
    }

    /// The link takes no bytes now; [`Session::link_writable`] says when it does again.
    pub(crate) fn transmit_blocked(&mut self, link: LinkId) {
        if let Some(c) = self.links.get_mut(link) {
            c.writable = false;
        }
        self.write_ready.remove(&link);
    }

    /// The link takes bytes again (or for the first time).
    pub(crate) fn link_writable(&mut self, link: LinkId) {
        let Some(c) = self.links.get_mut(link) else { return };
        c.writable = true;
        if c.has_frames() {
            self.write_ready.insert(link);
        }
    }

    fn advance_tx(&mut self, link: LinkId, mut n: usize) {
        let mut finished = Vec::new();
        let mut charged = 0;
        let peer = {
            let Some(c) = self.links.get_mut(link) else { return };
            let hs = !c.hs_tx.is_empty();
            let q = if hs { &mut c.hs_tx } else { &mut c.tx };
            while n > 0 {
                let Some(f) = q.front_mut() else { break };
                let left = f.total() - f.sent;
                if n >= left {
                    n -= left;
                    if let Some(f) = q.pop_front() {
                        charged += f.charge;
                        finished.push(f.done);
                    }
                } else {
                    f.sent += n;
                    n = 0;
                }
            }
            c.peer
        };
        if let Some(p) = peer
            && (charged > 0 || !self.tx_paused.is_empty())
        {
            self.uncharge(p, charged);
        }
        for d in finished {
            match d {
                OnDone::Nothing => {}
                OnDone::Complete(op) => {
                    if let Some(o) = self.ops.get_mut(&op) {
                        o.refs = o.refs.saturating_sub(1);
                        let len = o.buf.send_len();
                        self.complete(op, Ok(len));
                    }
                }
                OnDone::Release(op) => self.release_frame(op),
                OnDone::Close => self.close_link(link, None),
            }
        }
    }
}

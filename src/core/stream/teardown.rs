//! Links failing and closing, peers lost, and the deadlines that fail them.

use std::time::Instant;

use crate::admission;
use crate::core::loss::Loss;
use crate::error::ProtocolError;
use crate::handshake;
use crate::info::Counters;
use crate::types::PeerId;

use super::link::Phase;
use super::{Action, Delivery, LinkId, Session, TIMER_PERIOD};

impl Session {
    /// The driver lost `link` (it broke, closed, or could not be opened): for an established
    /// or dialled link the whole peer is lost, every op on it failing once with `reason`.
    pub(crate) fn link_failed(&mut self, link: LinkId, reason: String) {
        self.fail_link(link, Loss::Lost(reason));
    }

    pub(super) fn fail_link(&mut self, link: LinkId, why: Loss) {
        let Some(c) = self.links.get(link) else { return };
        let peer = c.peer;
        let dialling = matches!(&c.phase, Phase::Handshake(hs) if hs.is_client());
        let why = handshake::lost_in_handshake(why, dialling);
        match peer {
            Some(p) => self.fail_peer(p, why),
            None => self.close_link(link, None),
        }
    }

    pub(super) fn protocol_error(&mut self, link: LinkId, e: ProtocolError) {
        tracing::debug!(link = link.0, error = %e, "protocol violation; closing connection");
        if self.links.get(link).and_then(|c| c.peer).is_some() {
            self.fail_link(link, Loss::Protocol(e));
        } else {
            Counters::add(&self.core.counters.protocol_errors, 1);
            self.close_link(link, None);
        }
    }

    /// Closes a link (the driver closes its stream, sending `farewell` first when given) and
    /// releases the buffers its queued frames referenced.
    pub(super) fn close_link(&mut self, link: LinkId, farewell: Option<[u8; crate::wire::HEADER_LEN]>) {
        self.write_ready.remove(&link);
        self.admission.finished(link);
        let Some(c) = self.links.remove(link) else { return };
        self.act(Action::Close { link, farewell });
        let mut charged = 0;
        for f in c.hs_tx.into_iter().chain(c.tx) {
            charged += f.charge;
            if let Some((op, _, _)) = f.op_part {
                self.release_frame(op);
            }
        }
        if let Some(p) = c.peer
            && charged > 0
        {
            self.uncharge(p, charged);
        }
    }

    /// Fails every operation on a peer once, frees what it held, closes its links.
    pub(super) fn fail_peer(&mut self, peer: PeerId, why: Loss) {
        let Some(p) = self.peers.get_mut(peer) else { return };
        let (err, reason) = why.into_error(peer, p.addr(), &self.core.counters);
        tracing::debug!(%peer, %reason, "peer lost");
        // Its links and their queues go below.
        p.d.tx_bytes = 0;
        p.d.tx_paused = false;
        p.d.tx_moved_at = None;
        let links = self.peers.lose(peer, &reason);
        self.tx_paused.retain(|q| *q != peer);
        // Links of this peer that are not (yet) in its table: handshakes in progress.
        let mut all: Vec<LinkId> =
            self.links.iter().filter(|(_, c)| c.peer == Some(peer)).map(|(link, _)| link).collect();
        all.extend(links);
        all.sort();
        all.dedup();
        for link in all {
            if self.links.remove(link).is_some() {
                self.act(Action::Close { link, farewell: None });
            }
            self.write_ready.remove(&link);
            self.admission.finished(link);
        }
        let (posted, _early) = self.matcher.drop_peer(peer);
        drop(posted);
        self.rndv_in.retain(|(p, _), _| *p != peer);
        let ops = self.ops.of_peer(peer);
        self.rndv_out.retain(|_, op| ops.binary_search(op).is_err());
        self.sreqs.drop_peer(peer);
        self.streams.retain(|(p, _), _| *p != peer);
        self.delivered.push(Delivery::PeerGone(peer));
        self.ops.fail_peer(peer, &err);
        self.forget_if_gone(peer);
    }

    /// The endpoint shuts down: every peer's operations fail once with [`Error::Closed`]
    /// (unmatched receives, requests waiting for replies, transfers under way), and every link
    /// closes, those still in their handshake too.
    pub(crate) fn close_all(&mut self) {
        for p in self.peers.ids() {
            self.fail_peer(p, Loss::Closed);
        }
        let links: Vec<LinkId> = self.links.iter().map(|(link, _)| link).collect();
        for link in links {
            self.close_link(link, None);
        }
    }

    /// Whether [`Session::handle_timeout`] has anything to check: a peer paused at the
    /// transmit bound, a link waiting in a streamed payload, or a link in its handshake or
    /// connect.
    pub(crate) fn timers_pending(&self) -> bool {
        !self.tx_paused.is_empty()
            || self.streams_wait()
            || self.admission.len() > 0
            || self.links.values().any(|c| {
                matches!(&c.phase, Phase::Connecting)
                    || matches!(&c.phase, Phase::Handshake(hs) if hs.is_client())
            })
    }

    /// The time is `now`: stamps what moved since the last reading, and every
    /// [`TIMER_PERIOD`] looks at links waiting in streamed payloads, fails peers stalled at the
    /// transmit bound and links past their handshake or connect deadline.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        for &p in &self.tx_paused {
            if let Some(p) = self.peers.get_mut(p)
                && p.d.tx_moved_at.is_none()
            {
                p.d.tx_moved_at = Some(now);
            }
        }
        if now.saturating_duration_since(self.last_timers) < TIMER_PERIOD {
            return;
        }
        self.last_timers = now;
        self.stream_timers();
        for c in self.links.values_mut() {
            // A dial the driver never dated is dated now.
            c.since.get_or_insert(now);
        }
        let stall = self.s.cfg.stall_timeout;
        let stalled: Vec<PeerId> = self
            .tx_paused
            .iter()
            .copied()
            .filter(|p| {
                self.peers
                    .get(*p)
                    .and_then(|p| p.d.tx_moved_at)
                    .is_some_and(|at| now.saturating_duration_since(at) >= stall)
            })
            .collect();
        for p in stalled {
            let bytes = self.peers.get(p).map_or(0, |p| p.d.tx_bytes);
            let why = format!(
                "it read none of the {bytes} bytes answering it that were queued at the transmit bound for {stall:?} (transmit_bytes_per_peer, stall_timeout)"
            );
            self.fail_peer(p, Loss::Lost(why));
        }
        for link in self.admission.expired(now) {
            tracing::debug!(link = link.0, "handshake timed out");
            self.fail_link(link, Loss::Lost("connection handshake timed out".into()));
        }
        let dials = self.links.iter().map(|(link, c)| (link, c.phase.dialled(), c.since));
        let expired = admission::overdue_dials(dials, now, &self.s.cfg);
        for (link, why) in expired {
            self.fail_link(link, Loss::Lost(why.into()));
        }
    }
}

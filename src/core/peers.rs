//! The peers both transports keep: records by [`PeerId`], looked up in constant time,
//! removed when a peer is forgotten, their slots reused under new ids; each peer's buffering
//! budget; and the rules for finding, losing and forgetting a peer.
//!
//! A [`PeerId`] is a slot index and the slot's generation. Removing a record bumps its slot's
//! generation, so an id the application still holds for a forgotten peer never reaches the
//! record of a later peer in the same slot: it finds nothing and the operation fails.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::ops::{Index, IndexMut};

use crate::backend::Cmd;
use crate::core::slab::{Slab, SlabId, pack, unpack};
use crate::error::{Error, Result};
use crate::types::{PeerId, ServiceLevel};

/// Peer records by id.
pub(crate) type PeerTable<P> = Slab<PeerId, P>;

impl SlabId for PeerId {
    fn from_parts(index: u32, generation: u32) -> Self {
        PeerId(pack(index, generation))
    }
    fn index(self) -> usize {
        unpack(self.0).0
    }
    fn generation(self) -> u32 {
        unpack(self.0).1
    }
}

/// What a peer can make this endpoint hold for it. Every byte and count here is taken when
/// something of the peer is buffered and given back only when it is consumed, so a peer that
/// sends faster than the application takes is held to the configured bounds.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    /// Early eager bytes, unexpected bytes and request bytes held for this peer.
    pub buffered: usize,
    /// Unexpected messages held (received, not yet taken by the application).
    pub unexpected: usize,
    /// Requests open (received, not yet answered).
    pub requests: usize,
    /// Of those, unexpected messages handed to the application's queue and not yet taken, and
    /// their bytes: they outlive the connection, so they stay counted when it is lost.
    pub queued_unexpected: usize,
    pub queued_bytes: usize,
}

impl Budget {
    /// Takes `cost` bytes of at most `limit`; the first item always fits, so one message
    /// larger than the limit still goes through alone.
    pub(crate) fn reserve(&mut self, cost: usize, limit: usize) -> bool {
        if self.buffered + cost > limit && self.buffered > 0 {
            return false;
        }
        self.buffered += cost;
        true
    }

    /// Gives back bytes taken by [`Budget::reserve`].
    pub(crate) fn release(&mut self, bytes: usize) {
        self.buffered = self.buffered.saturating_sub(bytes);
    }

    /// Admits an unexpected message of `len` bytes within `max` held and `limit` bytes.
    pub(crate) fn admit_unexpected(&mut self, len: usize, max: usize, limit: usize) -> bool {
        if self.unexpected >= max || !self.reserve(len, limit) {
            return false;
        }
        self.unexpected += 1;
        true
    }

    /// Admits a request costing `cost` bytes within `max` open and `limit` bytes.
    pub(crate) fn admit_request(&mut self, cost: usize, max: usize, limit: usize) -> bool {
        if self.requests >= max || !self.reserve(cost, limit) {
            return false;
        }
        self.requests += 1;
        true
    }

    /// An admitted unexpected message went to the application's queue.
    pub(crate) fn queued(&mut self, bytes: usize) {
        self.queued_unexpected += 1;
        self.queued_bytes += bytes;
    }

    /// The application took a queued unexpected message of `bytes`.
    pub(crate) fn unexpected_taken(&mut self, bytes: usize) {
        self.buffered = self.buffered.saturating_sub(bytes);
        self.unexpected = self.unexpected.saturating_sub(1);
        self.queued_bytes = self.queued_bytes.saturating_sub(bytes);
        self.queued_unexpected = self.queued_unexpected.saturating_sub(1);
    }

    /// A request costing `cost` was answered (or dropped).
    pub(crate) fn request_done(&mut self, cost: usize) {
        self.buffered = self.buffered.saturating_sub(cost);
        self.requests = self.requests.saturating_sub(1);
    }

    /// The peer was lost: what the application's queue still holds stays counted, the rest
    /// went with the connections.
    pub(crate) fn lost(&mut self) {
        self.buffered = self.queued_bytes;
        self.unexpected = self.queued_unexpected;
        self.requests = 0;
    }
}

/// How long a connection this endpoint dialled goes without a command before the next is
/// preceded by a check that the peer has not closed it meanwhile; one found closed is given up
/// so that the command dials afresh.
///
/// A client that sits idle reads nothing, so a server's close waits unread on its side; a
/// request sent after it would reach no one and fail, with the server maybe long back up (a
/// restart). HTTP clients check a pooled connection the same way before reusing it. The
/// spell is far shorter than any restart, so a connection the old server closed is always
/// checked, and long enough that a busy connection never is; a request in flight when its
/// server dies is lost either way.
pub(crate) const IDLE_BEFORE_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// When a connection this endpoint dialled last took a command: a driver keeps one per
/// connection and asks it at each command whether to look at the connection first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastCommand(std::time::Instant);

impl LastCommand {
    /// A connection made at `now`.
    pub(crate) fn new(now: std::time::Instant) -> LastCommand {
        LastCommand(now)
    }

    /// A command goes on the connection at `now`: whether it had none for
    /// [`IDLE_BEFORE_CHECK`], so that the driver is to check the peer has not closed it.
    pub(crate) fn idle_until(&mut self, now: std::time::Instant) -> bool {
        now.saturating_duration_since(std::mem::replace(&mut self.0, now)) >= IDLE_BEFORE_CHECK
    }
}

/// A peer: what both transports keep of it, with the connection handle `C` of the driver and
/// the driver's own extra `D`.
#[derive(Debug)]
pub(crate) struct Peer<C, D> {
    /// The endpoint id it announced, for a peer that connected to us: such a record is
    /// forgotten once its connections are gone and nothing of it is queued for the application.
    /// `None` for a peer the application connected to, whose record lives with the endpoint.
    pub eid: Option<u64>,
    /// Where to connect to it (the application's address, or the port it announced).
    pub dial: Option<SocketAddr>,
    /// Where its last connection came from.
    pub remote: Option<SocketAddr>,
    /// One connection per service level, opened lazily.
    pub conns: [Option<C>; ServiceLevel::COUNT],
    pub budget: Budget,
    /// Lost and not dialable: operations fail at once until it reconnects.
    pub lost: Option<String>,
    /// Requests this side cancelled: late frames for them are discarded.
    pub cancelled_reqs: HashSet<u64>,
    /// Connections whose input waits for this peer's budget.
    pub stalled: Vec<C>,
    pub d: D,
}

impl<C: Copy + PartialEq, D> Peer<C, D> {
    /// The address errors name and `peer_addr` reports.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        self.dial.or(self.remote)
    }

    /// Marks a connection as waiting for this peer's budget (once).
    pub(crate) fn stall(&mut self, c: C) {
        if !self.stalled.contains(&c) {
            self.stalled.push(c);
        }
    }
}

/// The peer table and its indexes: peers the application connected to by address, peers that
/// connected to us by the endpoint id they announced.
pub(crate) struct Peers<C, D> {
    table: PeerTable<Peer<C, D>>,
    by_eid: HashMap<u64, PeerId>,
    by_dial: HashMap<SocketAddr, PeerId>,
}

impl<C, D> Default for Peers<C, D> {
    fn default() -> Self {
        Peers { table: PeerTable::default(), by_eid: HashMap::new(), by_dial: HashMap::new() }
    }
}

impl<C: Copy + PartialEq, D> Peers<C, D> {
    fn insert(
        &mut self,
        eid: Option<u64>,
        dial: Option<SocketAddr>,
        remote: Option<SocketAddr>,
        d: D,
    ) -> PeerId {
        self.table.insert_new(Peer {
            eid,
            dial,
            remote,
            conns: [None; ServiceLevel::COUNT],
            budget: Budget::default(),
            lost: None,
            cancelled_reqs: HashSet::new(),
            stalled: Vec::new(),
            d,
        })
    }

    /// The peer the application names by `addr`: the same record for the same address, a new
    /// one (within `max_peers`) otherwise.
    pub(crate) fn dialled(
        &mut self,
        addr: SocketAddr,
        max_peers: usize,
        d: impl FnOnce() -> D,
    ) -> Result<PeerId> {
        if let Some(&p) = self.by_dial.get(&addr) {
            return Ok(p);
        }
        if self.table.len() >= max_peers {
            return Err(Error::Exhausted(format!("max_peers ({max_peers}) reached")));
        }
        let p = self.insert(None, Some(addr), Some(addr), d());
        self.by_dial.insert(addr, p);
        Ok(p)
    }

    /// The connection of class `sl` to `peer` if this endpoint dialled it (so can dial it
    /// again): the one to check before a command goes on it after an idle spell (see
    /// [`IDLE_BEFORE_CHECK`]).
    pub(crate) fn dialled_conn(&self, peer: PeerId, sl: ServiceLevel) -> Option<C> {
        let p = self.table.get(peer)?;
        p.conns[sl.index()].filter(|_| p.dial.is_some() && p.lost.is_none())
    }

    /// Whether a peer announcing endpoint id `eid` may connect: it has a record already, or
    /// there is room for one within `max_peers`. Records of peers that left are forgotten, so
    /// the records held are the peers that are here (or whose messages still wait to be read).
    pub(crate) fn admits(&self, eid: u64, max_peers: usize) -> bool {
        self.by_eid.contains_key(&eid) || self.table.len() < max_peers
    }

    /// The peer whose older connection of class `sl` a new connection from endpoint `eid`
    /// replaces (the old peer is to be failed; its record may go with it).
    pub(crate) fn superseded(&self, eid: u64, sl: ServiceLevel, new: C) -> Option<PeerId> {
        let &p = self.by_eid.get(&eid)?;
        self.table.get(p)?.conns[sl.index()].is_some_and(|old| old != new).then_some(p)
    }

    /// The peer behind an authenticated connection from endpoint `eid` at `remote`, which
    /// listens on `listen_port` (0: it does not): its record, made anew if it has none.
    pub(crate) fn accepted(
        &mut self,
        eid: u64,
        remote: SocketAddr,
        listen_port: u16,
        d: impl FnOnce() -> D,
    ) -> PeerId {
        let peer = match self.by_eid.get(&eid) {
            Some(&p) => p,
            None => {
                let dial = (listen_port != 0).then(|| SocketAddr::new(remote.ip(), listen_port));
                let p = self.insert(Some(eid), dial, Some(remote), d());
                self.by_eid.insert(eid, p);
                p
            }
        };
        let p = &mut self.table[peer];
        p.lost = None;
        p.remote = Some(remote);
        peer
    }

    /// A lost peer: its connections are taken (the driver closes them), its budget keeps only
    /// what the application's queue holds, and one that cannot be dialled is marked lost with
    /// `reason` so that operations on it fail at once.
    pub(crate) fn lose(&mut self, peer: PeerId, reason: &str) -> Vec<C> {
        let Some(p) = self.table.get_mut(peer) else { return Vec::new() };
        let conns = p.conns.iter_mut().filter_map(Option::take).collect();
        p.lost = p.dial.is_none().then(|| reason.to_owned());
        p.budget.lost();
        p.stalled.clear();
        p.cancelled_reqs.clear();
        conns
    }

    /// Forgets a peer that connected to us once nothing of it is left: no connection (its
    /// record would be made anew by a reconnect anyway; `connected` says whether the driver
    /// still has one in a handshake) and no unexpected message queued for the application.
    /// Otherwise records of peers that come and go, each with a fresh endpoint id, would pile
    /// up forever.
    pub(crate) fn forget_if_gone(&mut self, peer: PeerId, connected: impl FnOnce() -> bool) {
        let Some(p) = self.table.get(peer) else { return };
        let Some(eid) = p.eid else { return };
        if p.conns.iter().any(Option::is_some) || p.budget.queued_unexpected > 0 || connected() {
            return;
        }
        self.table.remove(peer);
        // Peer ids never reach a driver's own tables: the slot may take a new peer at once.
        self.table.release();
        if self.by_eid.get(&eid) == Some(&peer) {
            self.by_eid.remove(&eid);
        }
    }

    /// The application took an unexpected message of `bytes` from `peer`.
    pub(crate) fn unexpected_taken(&mut self, peer: PeerId, bytes: usize) {
        if let Some(p) = self.table.get_mut(peer) {
            p.budget.unexpected_taken(bytes);
        }
    }

    pub(crate) fn get(&self, peer: PeerId) -> Option<&Peer<C, D>> {
        self.table.get(peer)
    }

    pub(crate) fn get_mut(&mut self, peer: PeerId) -> Option<&mut Peer<C, D>> {
        self.table.get_mut(peer)
    }

    /// The peer, or the error an operation on a forgotten peer fails with.
    pub(crate) fn require(&self, peer: PeerId) -> Result<&Peer<C, D>> {
        self.table.get(peer).ok_or_else(|| Cmd::forgotten(peer))
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (PeerId, &Peer<C, D>)> {
        self.table.iter()
    }

    pub(crate) fn ids(&self) -> Vec<PeerId> {
        self.table.ids()
    }

    /// Bytes buffered for all peers.
    pub(crate) fn buffered(&self) -> usize {
        self.table.iter().map(|(_, p)| p.budget.buffered).sum()
    }
}

impl<C, D> Index<PeerId> for Peers<C, D> {
    type Output = Peer<C, D>;
    fn index(&self, peer: PeerId) -> &Peer<C, D> {
        &self.table[peer]
    }
}

impl<C, D> IndexMut<PeerId> for Peers<C, D> {
    fn index_mut(&mut self, peer: PeerId) -> &mut Peer<C, D> {
        &mut self.table[peer]
    }
}

//! The peer table both transports keep: records by [`PeerId`], looked up in constant time,
//! removed when a peer is forgotten, their slots reused under new ids.
//!
//! A [`PeerId`] is a slot index and the slot's generation. Removing a record bumps its slot's
//! generation, so an id the application still holds for a forgotten peer never reaches the
//! record of a later peer in the same slot: it finds nothing and the operation fails.

use std::net::SocketAddr;
use std::ops::{Index, IndexMut};

use crate::types::PeerId;

struct Slot<P> {
    generation: u32,
    record: Option<P>,
}

/// Peer records by id.
pub(crate) struct PeerTable<P> {
    slots: Vec<Slot<P>>,
    free: Vec<u32>,
    len: usize,
}

impl<P> Default for PeerTable<P> {
    fn default() -> Self {
        PeerTable { slots: Vec::new(), free: Vec::new(), len: 0 }
    }
}

fn id(index: u32, generation: u32) -> PeerId {
    PeerId(u64::from(generation) << 32 | u64::from(index))
}

fn split(peer: PeerId) -> (usize, u32) {
    ((peer.0 & u64::from(u32::MAX)) as usize, (peer.0 >> 32) as u32)
}

impl<P> PeerTable<P> {
    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Stores the record `make` builds for its new id; returns the id.
    pub(crate) fn insert(&mut self, make: impl FnOnce(PeerId) -> P) -> PeerId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, record: None });
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        let peer = id(index, slot.generation);
        slot.record = Some(make(peer));
        self.len += 1;
        peer
    }

    pub(crate) fn get(&self, peer: PeerId) -> Option<&P> {
        let (i, generation) = split(peer);
        self.slots.get(i).filter(|s| s.generation == generation).and_then(|s| s.record.as_ref())
    }

    pub(crate) fn get_mut(&mut self, peer: PeerId) -> Option<&mut P> {
        let (i, generation) = split(peer);
        self.slots.get_mut(i).filter(|s| s.generation == generation).and_then(|s| s.record.as_mut())
    }

    /// Forgets a record; its id never finds anything again.
    pub(crate) fn remove(&mut self, peer: PeerId) -> Option<P> {
        let (i, generation) = split(peer);
        let slot = self.slots.get_mut(i).filter(|s| s.generation == generation)?;
        let record = slot.record.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(i as u32);
        self.len -= 1;
        Some(record)
    }

    /// Every record with its id.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (PeerId, &P)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.record.as_ref().map(|r| (id(i as u32, s.generation), r)))
    }

    /// The ids of every record.
    pub(crate) fn ids(&self) -> Vec<PeerId> {
        self.iter().map(|(p, _)| p).collect()
    }
}

/// A lost peer's reason as the application sees it: the peer's address first, unless the
/// reason names it already.
pub(crate) fn addressed(addr: Option<SocketAddr>, reason: String) -> String {
    match addr.map(|a| a.to_string()) {
        Some(a) if !reason.contains(&a) => format!("{a}: {reason}"),
        _ => reason,
    }
}

/// For ids taken from the transport's own tables (connections, operations), which never
/// outlive their peer's record. Ids from the application go through [`PeerTable::get`].
impl<P> Index<PeerId> for PeerTable<P> {
    type Output = P;
    fn index(&self, peer: PeerId) -> &P {
        self.get(peer).unwrap_or_else(|| panic!("{peer} has no record"))
    }
}

impl<P> IndexMut<PeerId> for PeerTable<P> {
    fn index_mut(&mut self, peer: PeerId) -> &mut P {
        self.get_mut(peer).unwrap_or_else(|| panic!("{peer} has no record"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_peers_id_never_reaches_the_record_that_reuses_its_slot() {
        let mut t = PeerTable::default();
        let a = t.insert(|_| "a");
        let b = t.insert(|_| "b");
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        let c = t.insert(|_| "c");
        assert_ne!(c, a, "a reused slot must not reuse the id");
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!((t[b], t[c], t.len()), ("b", "c", 2));
        let mut ids = t.ids();
        ids.sort();
        assert_eq!(ids, {
            let mut v = vec![b, c];
            v.sort();
            v
        });
    }

    #[test]
    fn a_reason_names_the_peer_once() {
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert_eq!(addressed(Some(a), "closed".into()), "10.0.0.1:7000: closed");
        assert_eq!(
            addressed(Some(a), "connect to 10.0.0.1:7000: refused".into()),
            "connect to 10.0.0.1:7000: refused"
        );
        assert_eq!(addressed(None, "closed".into()), "closed");
    }

    #[test]
    fn churn_keeps_the_table_at_its_live_size() {
        let mut t = PeerTable::default();
        let keep = t.insert(|_| 0u32);
        for i in 0..10_000u32 {
            let p = t.insert(|_| i);
            assert_eq!(t[p], i);
            t.remove(p);
        }
        assert_eq!(t.len(), 1);
        assert!(t.slots.len() <= 2, "slots grew to {} under churn", t.slots.len());
        assert_eq!(t[keep], 0);
    }
}

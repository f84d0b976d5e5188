//! Expected-message matching (sans-IO).
//!
//! Receives are posted for a (peer, tag); messages arrive for a (peer, tag). Both sides queue
//! in FIFO order, so on one (peer, service level) stream messages match receives in the order
//! they were sent and posted. An arrival with no posted receive is kept as *early* (the
//! backend decides what that costs: buffered eager bytes, or just a rendezvous announcement);
//! a later post takes the oldest early arrival first.
//!
//! The matcher owns no I/O and no buffers' bytes: `R` is whatever the backend keeps for a
//! posted receive, `M` whatever it keeps for an early arrival.

use std::collections::VecDeque;
use std::mem;

// Tags are chosen by peers: a per-process random seed keeps colliding keys from being
// forced, at a fraction of SipHash's cost.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use crate::types::{OpId, PeerId, Tag};

type Key = (PeerId, Tag);

/// Emptied queues kept (with their allocation) for reuse, at most this many of each kind.
const SPARE_QUEUES: usize = 16;
/// Only queues this small are kept: a burst must not pin a large allocation.
const SPARE_MAX_CAPACITY: usize = 64;

/// FIFO matching of posted receives against arrivals.
#[derive(Debug)]
pub struct Matcher<R, M> {
    posted: HashMap<Key, VecDeque<(OpId, R)>>,
    early: HashMap<Key, VecDeque<M>>,
    /// Receives in `posted` (no per-op index: a cancel names its key, see
    /// [`Matcher::cancel_posted`], so posting and matching touch one map entry each).
    posted_count: usize,
    /// Emptied queues still in `posted`: one receive at a time per key is the common pattern,
    /// so a key's queue stays while few are empty (no map insert + remove per message); they
    /// are swept out before they outnumber the live ones (keys are unbounded).
    posted_empty: usize,
    /// Queues that left a map, kept for reuse: without them every first post on a key
    /// allocated a queue and every last match freed it.
    spare_posted: Vec<VecDeque<(OpId, R)>>,
    spare_early: Vec<VecDeque<M>>,
}

impl<R, M> Default for Matcher<R, M> {
    fn default() -> Self {
        Matcher {
            posted: HashMap::default(),
            early: HashMap::default(),
            posted_count: 0,
            posted_empty: 0,
            spare_posted: Vec::new(),
            spare_early: Vec::new(),
        }
    }
}

/// Keeps an emptied queue for reuse if there is room and it is small.
fn recycle<T>(spare: &mut Vec<VecDeque<T>>, q: Option<VecDeque<T>>) {
    if let Some(q) = q
        && spare.len() < SPARE_QUEUES
        && q.capacity() <= SPARE_MAX_CAPACITY
    {
        debug_assert!(q.is_empty());
        spare.push(q);
    }
}

/// Result of an arrival.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<R, M> {
    /// A posted receive matched (the oldest for this key); it is no longer posted.
    Matched(OpId, R),
    /// Nothing was posted; the arrival was queued as early.
    Queued,
    /// Returned unchanged (see [`Matcher::arrive_or_return`]).
    Unmatched(M),
}

impl<R, M> Matcher<R, M> {
    /// An empty matcher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Posts a receive. If an early arrival is waiting for this key, the oldest is returned and
    /// the receive is *not* queued (the caller completes it from the arrival).
    pub fn post(&mut self, peer: PeerId, tag: Tag, op: OpId, r: R) -> Result<(), (OpId, R, M)> {
        let key = (peer, tag);
        // Usually nothing arrived early: skip hashing the key into an empty map.
        if !self.early.is_empty()
            && let Some(q) = self.early.get_mut(&key)
            && let Some(m) = q.pop_front()
        {
            if q.is_empty() {
                recycle(&mut self.spare_early, self.early.remove(&key));
            }
            return Err((op, r, m));
        }
        let q = match self.posted.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let q = e.into_mut();
                if q.is_empty() {
                    self.posted_empty -= 1;
                }
                q
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.spare_posted.pop().unwrap_or_default())
            }
        };
        q.push_back((op, r));
        self.posted_count += 1;
        Ok(())
    }

    /// A posted queue just emptied: it stays in the map unless the empty ones now outnumber
    /// the live ones, then they are all swept out (amortised O(1) per emptied queue).
    fn posted_emptied(&mut self) {
        self.posted_empty += 1;
        if self.posted_empty > SPARE_QUEUES.max(self.posted.len() / 2) {
            let Matcher { posted, spare_posted, .. } = self;
            posted.retain(|_, q| {
                if q.is_empty() {
                    recycle(spare_posted, Some(mem::take(q)));
                    false
                } else {
                    true
                }
            });
            self.posted_empty = 0;
        }
    }

    /// Records an arrival: matches the oldest posted receive, or queues the arrival as early.
    pub fn arrive(&mut self, peer: PeerId, tag: Tag, m: M) -> Arrival<R, M> {
        match self.arrive_or_return(peer, tag, m) {
            Arrival::Unmatched(m) => {
                self.queue_early(peer, tag, m);
                Arrival::Queued
            }
            other => other,
        }
    }

    /// Like [`Matcher::arrive`] but hands the arrival back instead of queueing it, so the caller
    /// can first check it has room to keep it.
    pub fn arrive_or_return(&mut self, peer: PeerId, tag: Tag, m: M) -> Arrival<R, M> {
        let key = (peer, tag);
        if let Some(q) = self.posted.get_mut(&key)
            && let Some((op, r)) = q.pop_front()
        {
            if q.is_empty() {
                self.posted_emptied();
            }
            self.posted_count -= 1;
            return Arrival::Matched(op, r);
        }
        Arrival::Unmatched(m)
    }

    /// Takes the oldest receive posted for the key, if any (the caller handles the arrival).
    pub fn take_posted(&mut self, peer: PeerId, tag: Tag) -> Option<(OpId, R)> {
        let key = (peer, tag);
        let q = self.posted.get_mut(&key)?;
        let (op, r) = q.pop_front()?;
        if q.is_empty() {
            self.posted_emptied();
        }
        self.posted_count -= 1;
        Some((op, r))
    }

    /// Queues an early arrival without looking for a posted receive (after
    /// [`Matcher::arrive_or_return`] said there was none).
    pub fn queue_early(&mut self, peer: PeerId, tag: Tag, m: M) {
        let Matcher { early, spare_early, .. } = self;
        early.entry((peer, tag)).or_insert_with(|| spare_early.pop().unwrap_or_default()).push_back(m);
    }

    /// Applies `f` to the early arrivals of `peer` until it returns true; true if one did.
    pub fn find_early_mut(&mut self, peer: PeerId, mut f: impl FnMut(&mut M) -> bool) -> bool {
        self.early.iter_mut().filter(|(k, _)| k.0 == peer).any(|(_, q)| q.iter_mut().any(&mut f))
    }

    /// True when a receive is posted for the key.
    pub fn has_posted(&self, peer: PeerId, tag: Tag) -> bool {
        self.posted.get(&(peer, tag)).is_some_and(|q| !q.is_empty())
    }

    /// Removes a posted (unmatched) receive whose (peer, tag) is not known: searches every
    /// posted queue. `None` if it already matched or never existed. Prefer
    /// [`Matcher::cancel_posted`].
    pub fn cancel(&mut self, op: OpId) -> Option<R> {
        let key = self.posted.iter().find(|(_, q)| q.iter().any(|(o, _)| *o == op)).map(|(k, _)| *k)?;
        self.cancel_posted(key.0, key.1, op)
    }

    /// Removes a posted (unmatched) receive of (peer, tag). `None` if it already matched or
    /// never existed.
    pub fn cancel_posted(&mut self, peer: PeerId, tag: Tag, op: OpId) -> Option<R> {
        let q = self.posted.get_mut(&(peer, tag))?;
        let pos = q.iter().position(|(o, _)| *o == op)?;
        let (_, r) = q.remove(pos)?;
        if q.is_empty() {
            self.posted_emptied();
        }
        self.posted_count -= 1;
        Some(r)
    }

    /// Removes everything belonging to a peer: its posted receives and its early arrivals.
    pub fn drop_peer(&mut self, peer: PeerId) -> (Vec<(OpId, R)>, Vec<M>) {
        let mut posted = Vec::new();
        let keys: Vec<Key> = self.posted.keys().filter(|k| k.0 == peer).copied().collect();
        for k in keys {
            if let Some(q) = self.posted.remove(&k) {
                if q.is_empty() {
                    self.posted_empty -= 1;
                }
                self.posted_count -= q.len();
                posted.extend(q);
            }
        }
        posted.sort_by_key(|(op, _)| *op);
        let mut early = Vec::new();
        let keys: Vec<Key> = self.early.keys().filter(|k| k.0 == peer).copied().collect();
        for k in keys {
            if let Some(q) = self.early.remove(&k) {
                early.extend(q);
            }
        }
        (posted, early)
    }

    /// Posted receives not yet matched.
    pub fn posted_len(&self) -> usize {
        self.posted_count
    }

    /// Early arrivals not yet matched.
    pub fn early_len(&self) -> usize {
        self.early.values().map(|q| q.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: PeerId = PeerId(1);
    const Q: PeerId = PeerId(2);

    #[test]
    fn receives_match_in_post_order_and_tags_are_isolated() {
        let mut m: Matcher<&str, &str> = Matcher::new();
        m.post(P, 7, OpId(1), "r1").unwrap();
        m.post(P, 7, OpId(2), "r2").unwrap();
        m.post(P, 8, OpId(3), "r3").unwrap();
        assert_eq!(m.arrive(P, 8, "m-tag8"), Arrival::Matched(OpId(3), "r3"));
        assert_eq!(m.arrive(P, 7, "a"), Arrival::Matched(OpId(1), "r1"));
        assert_eq!(m.arrive(P, 7, "b"), Arrival::Matched(OpId(2), "r2"));
        // Same tag from another peer does not match P's receives.
        m.post(P, 9, OpId(4), "r4").unwrap();
        assert_eq!(m.arrive(Q, 9, "q"), Arrival::Queued);
        assert_eq!(m.posted_len(), 1);
        assert_eq!(m.early_len(), 1);
    }

    #[test]
    fn early_arrivals_are_taken_oldest_first() {
        let mut m: Matcher<u32, &str> = Matcher::new();
        assert_eq!(m.arrive(P, 1, "first"), Arrival::Queued);
        assert_eq!(m.arrive(P, 1, "second"), Arrival::Queued);
        assert_eq!(m.post(P, 1, OpId(1), 0), Err((OpId(1), 0, "first")));
        assert_eq!(m.post(P, 1, OpId(2), 0), Err((OpId(2), 0, "second")));
        assert!(m.post(P, 1, OpId(3), 0).is_ok());
    }

    #[test]
    fn cancel_before_match_removes_and_after_match_is_none() {
        let mut m: Matcher<u32, u32> = Matcher::new();
        m.post(P, 1, OpId(1), 10).unwrap();
        m.post(P, 1, OpId(2), 20).unwrap();
        assert_eq!(m.cancel(OpId(1)), Some(10));
        assert_eq!(m.cancel(OpId(1)), None);
        assert_eq!(m.arrive(P, 1, 99), Arrival::Matched(OpId(2), 20));
        assert_eq!(m.cancel(OpId(2)), None, "matched receives cannot be cancelled here");
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn cancel_posted_removes_only_that_receive_of_that_key() {
        let mut m: Matcher<u32, u32> = Matcher::new();
        m.post(P, 1, OpId(1), 10).unwrap();
        m.post(P, 1, OpId(2), 20).unwrap();
        m.post(P, 2, OpId(3), 30).unwrap();
        // The wrong key finds nothing and changes nothing.
        assert_eq!(m.cancel_posted(P, 2, OpId(2)), None);
        assert_eq!(m.cancel_posted(Q, 1, OpId(2)), None);
        assert_eq!(m.posted_len(), 3);
        assert_eq!(m.cancel_posted(P, 1, OpId(2)), Some(20));
        assert_eq!(m.cancel_posted(P, 1, OpId(2)), None);
        assert_eq!(m.posted_len(), 2);
        assert_eq!(m.arrive(P, 1, 99), Arrival::Matched(OpId(1), 10));
        assert_eq!(m.arrive(P, 1, 98), Arrival::Queued);
        assert_eq!(m.arrive(P, 2, 97), Arrival::Matched(OpId(3), 30));
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn drop_peer_returns_everything_of_that_peer_only() {
        let mut m: Matcher<u32, u32> = Matcher::new();
        m.post(P, 1, OpId(5), 1).unwrap();
        m.post(P, 2, OpId(3), 2).unwrap();
        m.post(Q, 1, OpId(4), 3).unwrap();
        m.arrive(P, 9, 100);
        let (posted, early) = m.drop_peer(P);
        assert_eq!(posted, vec![(OpId(3), 2), (OpId(5), 1)]);
        assert_eq!(early, vec![100]);
        assert_eq!(m.posted_len(), 1);
        assert_eq!(m.arrive(Q, 1, 0), Arrival::Matched(OpId(4), 3));
    }

    #[test]
    fn emptied_queues_are_reused_and_the_spares_stay_bounded() {
        let mut m: Matcher<u32, u32> = Matcher::new();
        // One receive at a time on one key: its queue stays, emptied, and is reused.
        for i in 0..100 {
            m.post(P, 1, OpId(i), 0).unwrap();
            assert!(m.has_posted(P, 1));
            assert_eq!(m.take_posted(P, 1), Some((OpId(i), 0)));
            assert!(!m.has_posted(P, 1));
        }
        assert_eq!((m.posted.len(), m.posted_empty), (1, 1));
        // Many keys emptied at once: at most SPARE_QUEUES are kept.
        for t in 0..100 {
            m.post(P, t, OpId(1000 + t), 0).unwrap();
            m.arrive(Q, t, 7);
        }
        for t in 0..100 {
            assert!(matches!(m.arrive(P, t, 0), Arrival::Matched(..)));
            assert_eq!(m.post(Q, t, OpId(2000 + t), 1), Err((OpId(2000 + t), 1, 7)));
        }
        // Emptied posted queues were swept out of the map as they piled up.
        assert!(m.posted.len() <= SPARE_QUEUES + 1, "{} posted queues kept", m.posted.len());
        assert_eq!(m.posted_empty, m.posted.values().filter(|q| q.is_empty()).count());
        assert_eq!(m.spare_posted.len(), SPARE_QUEUES);
        assert_eq!(m.spare_early.len(), SPARE_QUEUES);
        assert!(
            m.spare_posted.iter().all(VecDeque::is_empty) && m.spare_early.iter().all(VecDeque::is_empty)
        );
        assert_eq!((m.posted_len(), m.early_len()), (0, 0));
    }

    proptest! {
        /// Against a model: for each key, the k-th arrival pairs with the k-th post.
        #[test]
        fn fifo_pairing_matches_model(events in proptest::collection::vec((any::<bool>(), 0u64..3), 0..200)) {
            let mut m: Matcher<usize, usize> = Matcher::new();
            let mut posts = [0usize; 3];
            let mut arrivals = [0usize; 3];
            let mut op = 0u64;
            for (is_post, tag) in events {
                let t = tag as usize;
                if is_post {
                    op += 1;
                    let k = posts[t];
                    posts[t] += 1;
                    match m.post(P, tag, OpId(op), k) {
                        Ok(()) => {}
                        Err((_, r, a)) => prop_assert_eq!(r, a),
                    }
                } else {
                    let k = arrivals[t];
                    arrivals[t] += 1;
                    match m.arrive(P, tag, k) {
                        Arrival::Matched(_, r) => prop_assert_eq!(r, k),
                        Arrival::Queued => {}
                        Arrival::Unmatched(_) => prop_assert!(false),
                    }
                }
                prop_assert_eq!(m.posted_empty, m.posted.values().filter(|q| q.is_empty()).count());
                prop_assert_eq!(m.posted_len(), m.posted.values().map(VecDeque::len).sum::<usize>());
            }
        }
    }
}

//! Links by id, in a slab: a lookup is an index and a generation check, where a hash map cost
//! a hash and a probe on every byte event of the hot path.
//!
//! A [`LinkId`] is a slot index and the slot's generation. The driver derives its poller token
//! from the id, so an event still queued for a closed link carries the old generation and finds
//! nothing, even once the slot holds a newer link. A freed slot is reused only after the driver
//! has taken every action queued so far (see [`Slots::release`]): the `Close` of the link that
//! held it comes first, so the driver never holds the old link's socket under a reused index.

use super::LinkId;

fn id(index: u32, generation: u32) -> LinkId {
    LinkId(u64::from(generation) << 32 | u64::from(index))
}

fn split(link: LinkId) -> (usize, u32) {
    ((link.0 & u64::from(u32::MAX)) as usize, (link.0 >> 32) as u32)
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Values by [`LinkId`]. The session allocates ids ([`Slots::allocate`]); a driver keeps its
/// own values under the session's ids ([`Slots::insert`] places a value at its id's slot).
#[derive(Debug)]
pub(crate) struct Slots<T> {
    slots: Vec<Slot<T>>,
    /// Slots free for new ids.
    free: Vec<u32>,
    /// Slots freed since the driver last took every action: not reused yet.
    quarantined: Vec<u32>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots { slots: Vec::new(), free: Vec::new(), quarantined: Vec::new(), len: 0 }
    }
}

impl<T> Slots<T> {
    /// A fresh id, in a slot that holds nothing.
    pub(crate) fn allocate(&mut self) -> LinkId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                (self.slots.len() - 1) as u32
            }
        };
        id(index, self.slots[index as usize].generation)
    }

    /// The driver has taken every action queued so far: quarantined slots may be reused.
    pub(crate) fn release(&mut self) {
        self.free.append(&mut self.quarantined);
    }

    /// Stores `value` under `link`, replacing whatever its slot held (a driver's value of an
    /// older generation whose close it never saw is dropped).
    pub(crate) fn insert(&mut self, link: LinkId, value: T) {
        let (i, generation) = split(link);
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || Slot { generation: 0, value: None });
        }
        let slot = &mut self.slots[i];
        if slot.value.is_none() {
            self.len += 1;
        }
        slot.generation = generation;
        slot.value = Some(value);
    }

    #[inline]
    pub(crate) fn get(&self, link: &LinkId) -> Option<&T> {
        let (i, generation) = split(*link);
        self.slots.get(i).filter(|s| s.generation == generation).and_then(|s| s.value.as_ref())
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, link: &LinkId) -> Option<&mut T> {
        let (i, generation) = split(*link);
        self.slots.get_mut(i).filter(|s| s.generation == generation).and_then(|s| s.value.as_mut())
    }

    pub(crate) fn contains_key(&self, link: &LinkId) -> bool {
        self.get(link).is_some()
    }

    /// Takes the value out; its slot's next id has a new generation, reused after
    /// [`Slots::release`].
    pub(crate) fn remove(&mut self, link: &LinkId) -> Option<T> {
        let (i, generation) = split(*link);
        let slot = self.slots.get_mut(i).filter(|s| s.generation == generation)?;
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.quarantined.push(i as u32);
        self.len -= 1;
        Some(value)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (LinkId, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (id(i as u32, s.generation), v)))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (LinkId, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_mut().map(|v| (id(i as u32, s.generation), v)))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.value.as_ref())
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }

    /// Takes every value out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.len = 0;
        self.slots.iter_mut().filter_map(|s| s.value.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_links_id_never_reaches_the_link_that_reuses_its_slot() {
        let mut s = Slots::default();
        let a = s.allocate();
        s.insert(a, "a");
        assert_eq!(s.remove(&a), Some("a"));
        // Quarantined until the driver has taken its actions: a new id takes a new slot.
        let b = s.allocate();
        assert_ne!(split(b).0, split(a).0);
        s.insert(b, "b");
        s.release();
        let c = s.allocate();
        assert_eq!(split(c).0, split(a).0, "the slot is reused once released");
        assert_ne!(c, a);
        s.insert(c, "c");
        assert_eq!(s.get(&a), None);
        assert_eq!(s.remove(&a), None);
        assert_eq!((s.get(&b), s.get(&c), s.len()), (Some(&"b"), Some(&"c"), 2));
        let mut ids: Vec<LinkId> = s.iter().map(|(l, _)| l).collect();
        ids.sort();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&b) && ids.contains(&c));
    }

    #[test]
    fn a_drivers_table_follows_the_sessions_ids() {
        let mut session = Slots::default();
        let mut driver = Slots::default();
        let a = session.allocate();
        session.insert(a, ());
        driver.insert(a, "sock a");
        session.remove(&a);
        session.release();
        let b = session.allocate();
        // The driver missed a's close: b's value replaces it, and a finds nothing.
        driver.insert(b, "sock b");
        assert_eq!((driver.get(&a), driver.get(&b), driver.len()), (None, Some(&"sock b"), 1));
    }

    #[test]
    fn churn_keeps_the_slab_at_its_live_size() {
        let mut s = Slots::default();
        let keep = s.allocate();
        s.insert(keep, 0u32);
        for i in 0..10_000u32 {
            let l = s.allocate();
            s.insert(l, i);
            s.remove(&l);
            s.release();
        }
        assert_eq!(s.len(), 1);
        assert!(s.slots.len() <= 2, "slots grew to {} under churn", s.slots.len());
    }
}

//! Records by generation-checked id: a lookup is an index and a compare, and a removed
//! record's id never reaches the record that later takes its slot.
//!
//! An id is a slot index and the slot's generation; removing a record bumps the generation.
//! Peers are kept this way so that an id the application still holds for a forgotten peer
//! finds nothing; links so that a poller event still queued for a closed link finds nothing.
//! A removed slot is quarantined until [`Slab::release`]: the stream session releases only
//! once the driver has taken every queued action (the link's `Close` among them), so a driver
//! keeping its own values under the same ids never holds an old one under a reused index.

use std::ops::{Index, IndexMut};

/// An id made of a slot index and the slot's generation.
pub(crate) trait SlabId: Copy {
    fn from_parts(index: u32, generation: u32) -> Self;
    fn index(self) -> usize;
    fn generation(self) -> u32;
}

/// Packs index and generation into a `u64`, the generation in the high half.
pub(crate) fn pack(index: u32, generation: u32) -> u64 {
    u64::from(generation) << 32 | u64::from(index)
}

/// The (index, generation) of a packed id.
pub(crate) fn unpack(id: u64) -> (usize, u32) {
    ((id & u64::from(u32::MAX)) as usize, (id >> 32) as u32)
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Values by [`SlabId`].
#[derive(Debug)]
pub(crate) struct Slab<K, T> {
    slots: Vec<Slot<T>>,
    /// Slots free for new ids.
    free: Vec<u32>,
    /// Slots removed since the last [`Slab::release`]: not reused yet.
    quarantined: Vec<u32>,
    len: usize,
    _id: std::marker::PhantomData<K>,
}

impl<K, T> Default for Slab<K, T> {
    fn default() -> Self {
        Slab { slots: Vec::new(), free: Vec::new(), quarantined: Vec::new(), len: 0, _id: Default::default() }
    }
}

impl<K: SlabId, T> Slab<K, T> {
    /// A fresh id, in a slot that holds nothing; [`Slab::insert`] places its value.
    pub(crate) fn allocate(&mut self) -> K {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                (self.slots.len() - 1) as u32
            }
        };
        K::from_parts(index, self.slots[index as usize].generation)
    }

    /// Stores `value` under a fresh id.
    pub(crate) fn insert_new(&mut self, value: T) -> K {
        let id = self.allocate();
        self.insert(id, value);
        id
    }

    /// Quarantined slots may take new ids.
    pub(crate) fn release(&mut self) {
        self.free.append(&mut self.quarantined);
    }

    /// Stores `value` under `id`, replacing whatever its slot held (a driver's value of an
    /// older generation whose removal it never saw is dropped).
    pub(crate) fn insert(&mut self, id: K, value: T) {
        let i = id.index();
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || Slot { generation: 0, value: None });
        }
        let slot = &mut self.slots[i];
        if slot.value.is_none() {
            self.len += 1;
        }
        slot.generation = id.generation();
        slot.value = Some(value);
    }

    #[inline]
    pub(crate) fn get(&self, id: K) -> Option<&T> {
        self.slots.get(id.index()).filter(|s| s.generation == id.generation()).and_then(|s| s.value.as_ref())
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: K) -> Option<&mut T> {
        self.slots
            .get_mut(id.index())
            .filter(|s| s.generation == id.generation())
            .and_then(|s| s.value.as_mut())
    }

    pub(crate) fn contains_key(&self, id: K) -> bool {
        self.get(id).is_some()
    }

    /// Takes the value out; the slot's next id has a new generation, reused after
    /// [`Slab::release`].
    pub(crate) fn remove(&mut self, id: K) -> Option<T> {
        let slot = self.slots.get_mut(id.index()).filter(|s| s.generation == id.generation())?;
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.quarantined.push(id.index() as u32);
        self.len -= 1;
        Some(value)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (K, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (K::from_parts(i as u32, s.generation), v)))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (K, &mut T)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_mut().map(|v| (K::from_parts(i as u32, s.generation), v)))
    }

    /// The ids of every value.
    pub(crate) fn ids(&self) -> Vec<K> {
        self.iter().map(|(id, _)| id).collect()
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

/// For ids taken from the transport's own tables (connections, operations), which never
/// outlive their record. Ids from the application go through [`Slab::get`].
impl<K: SlabId + std::fmt::Debug, T> Index<K> for Slab<K, T> {
    type Output = T;
    fn index(&self, id: K) -> &T {
        self.get(id).unwrap_or_else(|| panic!("{id:?} has no record"))
    }
}

impl<K: SlabId + std::fmt::Debug, T> IndexMut<K> for Slab<K, T> {
    fn index_mut(&mut self, id: K) -> &mut T {
        self.get_mut(id).unwrap_or_else(|| panic!("{id:?} has no record"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    struct Id(u64);

    impl SlabId for Id {
        fn from_parts(index: u32, generation: u32) -> Self {
            Id(pack(index, generation))
        }
        fn index(self) -> usize {
            unpack(self.0).0
        }
        fn generation(self) -> u32 {
            unpack(self.0).1
        }
    }

    #[test]
    fn a_removed_id_never_reaches_the_record_that_reuses_its_slot() {
        let mut t: Slab<Id, &str> = Slab::default();
        let a = t.insert_new("a");
        let b = t.insert_new("b");
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get(a), None);
        // Quarantined until released: a new id takes a new slot.
        let c = t.insert_new("c");
        assert_ne!(c.index(), a.index());
        t.release();
        let d = t.insert_new("d");
        assert_eq!(d.index(), a.index(), "the slot is reused once released");
        assert_ne!(d, a, "a reused slot must not reuse the id");
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!((t[b], t[c], t[d], t.len()), ("b", "c", "d", 3));
        let mut ids = t.ids();
        ids.sort();
        let mut want = vec![b, c, d];
        want.sort();
        assert_eq!(ids, want);
    }

    #[test]
    fn a_drivers_table_follows_the_allocators_ids() {
        let mut session: Slab<Id, ()> = Slab::default();
        let mut driver: Slab<Id, &str> = Slab::default();
        let a = session.insert_new(());
        driver.insert(a, "sock a");
        session.remove(a);
        session.release();
        let b = session.allocate();
        // The driver missed a's removal: b's value replaces it, and a finds nothing.
        driver.insert(b, "sock b");
        assert_eq!((driver.get(a), driver.get(b), driver.len()), (None, Some(&"sock b"), 1));
    }

    #[test]
    fn churn_keeps_the_slab_at_its_live_size() {
        let mut t: Slab<Id, u32> = Slab::default();
        let keep = t.insert_new(0);
        for i in 0..10_000u32 {
            let id = t.insert_new(i);
            assert_eq!(t[id], i);
            t.remove(id);
            t.release();
        }
        assert_eq!(t.len(), 1);
        assert!(t.slots.len() <= 2, "slots grew to {} under churn", t.slots.len());
        assert_eq!(t[keep], 0);
    }
}

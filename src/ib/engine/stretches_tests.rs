//! The stretch rules of [`super`] on made-up addresses: no cache, no mapping.

use super::*;

fn stretches(slices: &[(usize, usize)]) -> Vec<Stretch> {
    let mut s = Stretches::default();
    for &(addr, len) in slices {
        s.add(addr, len);
    }
    s.into_vec()
}

#[test]
fn slices_that_follow_each_other_in_memory_make_one_stretch() {
    assert_eq!(stretches(&[]), []);
    assert_eq!(stretches(&[(0x1000, 100)]), [Stretch { off: 0, addr: 0x1000, len: 100 }]);
    // Three slices, the second right after the first: two stretches, offsets in the buffer.
    assert_eq!(
        stretches(&[(0x1000, 100), (0x1064, 28), (0x8000, 50)]),
        [Stretch { off: 0, addr: 0x1000, len: 128 }, Stretch { off: 128, addr: 0x8000, len: 50 }]
    );
    // A slice before the last one in memory, or past its end, starts a new stretch.
    assert_eq!(
        stretches(&[(0x2000, 16), (0x1ff0, 16), (0x2001, 4)]),
        [
            Stretch { off: 0, addr: 0x2000, len: 16 },
            Stretch { off: 16, addr: 0x1ff0, len: 16 },
            Stretch { off: 32, addr: 0x2001, len: 4 },
        ]
    );
    // An empty slice elsewhere is a stretch of its own (left alone by `origin`), and moves no
    // offset.
    assert_eq!(
        stretches(&[(0x1000, 8), (0x5000, 0), (0x1008, 8)]),
        [
            Stretch { off: 0, addr: 0x1000, len: 8 },
            Stretch { off: 8, addr: 0x5000, len: 0 },
            Stretch { off: 8, addr: 0x1008, len: 8 },
        ]
    );
}

#[test]
fn file_mappings_are_opened_as_ours_and_lent_memory_only_when_the_cache_keeps_it() {
    let s = Stretch { off: 0, addr: 0x4000, len: 64 };
    let mapped = |addr, len| addr == 0x4000 && len == 64;
    let not_mapped = |_, _| false;
    assert_eq!(origin(s, false, mapped), Some(Origin::Owned));
    assert_eq!(origin(s, true, mapped), Some(Origin::Owned), "a mapping stays the crate's");
    assert_eq!(origin(s, true, not_mapped), Some(Origin::Foreign));
    assert_eq!(origin(s, false, not_mapped), None, "staged: its registration would not outlive the op");
    // An empty stretch: nothing to open, and the mappings are not looked up for it.
    let empty = Stretch { len: 0, ..s };
    assert_eq!(origin(empty, true, |_, _| panic!("looked up")), None);
}

#[test]
fn a_stretch_is_admitted_on_its_second_sighting_and_memory_is_bounded() {
    let mut s = SeenOnce::default();
    assert!(!s.seen_before((4096, 100)), "first sighting");
    assert!(!s.seen_before((8192, 100)), "a different stretch");
    assert!(!s.seen_before((4096, 200)), "same start, other length");
    assert!(s.seen_before((4096, 100)), "second sighting");
    assert!(!s.seen_before((4096, 100)), "admitted stretches are forgotten");
    // The oldest are forgotten past the bound.
    let mut s = SeenOnce::default();
    for i in 0..=SeenOnce::CAP {
        assert!(!s.seen_before((i * 4096, 1)));
    }
    assert!(!s.seen_before((0, 1)), "the oldest was dropped");
    assert!(s.seen_before((SeenOnce::CAP * 4096, 1)), "the newest is kept");
    assert!(s.order.len() <= SeenOnce::CAP && s.seen.len() <= s.order.len());
    // A stretch admitted, then noted again, is not forgotten by its stale first note.
    let mut s = SeenOnce::default();
    assert!(!s.seen_before((0, 1)));
    assert!(s.seen_before((0, 1)));
    assert!(!s.seen_before((0, 1)));
    for i in 1..SeenOnce::CAP {
        assert!(!s.seen_before((i * 4096, 1)));
    }
    assert!(s.seen_before((0, 1)), "the newer note of (0, 1) survived the stale one's eviction");
}

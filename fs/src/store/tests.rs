//! The object store against a real file system (a temporary directory).

use super::*;
use crate::layout::{Extent, Layout, View};
use std::process::Command;

fn store() -> (tempfile::TempDir, ObjectStore) {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path().join("data"), StoreConfig::default()).unwrap();
    (d, s)
}

const H: Handle = Handle(0x1234);

#[test]
fn hashed_layout() {
    let (_d, s) = store();
    let p = s.path_of(H);
    let rel = p.strip_prefix(s.root()).unwrap();
    let parts: Vec<_> = rel.iter().map(|c| c.to_str().unwrap().to_owned()).collect();
    assert_eq!(parts.len(), 3);
    assert!(parts[..2].iter().all(|c| c.len() == 2 && c.chars().all(|ch| ch.is_ascii_hexdigit())));
    assert_eq!(parts[2], "0000000000001234");
    let top: std::collections::HashSet<_> =
        (1..1001).map(|h| s.path_of(Handle(h)).parent().unwrap().to_owned()).collect();
    assert!(top.len() > 900, "sequential handles spread out: {} directories", top.len());
    assert!(s.create(H).unwrap());
    assert!(p.is_file());
}

#[test]
fn create_is_idempotent_and_remove_reports_missing() {
    let (_d, s) = store();
    assert!(!s.exists(H));
    assert!(s.create(H).unwrap());
    s.write(H, &[Extent::new(0, 3)], b"abc").unwrap();
    assert!(!s.create(H).unwrap(), "second create keeps the data");
    assert_eq!(s.size(H).unwrap(), 3);
    s.remove(H).unwrap();
    assert!(!s.exists(H));
    let e = s.remove(H).unwrap_err();
    assert!(matches!(e, StoreError::NotFound(H)));
    assert_eq!(e.errno(), Errno::ENOENT);
    assert!(matches!(s.size(H), Err(StoreError::NotFound(H))), "removal evicts the cached fd");
    let mut b = [0u8; 1];
    assert!(matches!(s.read(H, &[Extent::new(0, 1)], &mut b), Err(StoreError::NotFound(H))));
}

#[test]
fn a_batch_of_creates_makes_the_new_and_keeps_the_rest() {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path(), StoreConfig { max_open: 4, ..Default::default() }).unwrap();
    for h in 1..=2u64 {
        s.create(Handle(h)).unwrap();
        s.write(Handle(h), &[Extent::new(0, 3)], b"old").unwrap();
    }
    // Far apart handles land in directories of their own.
    let batch: Vec<Handle> = [1, 2, 3, 4, 1 << 20, 1 << 40].map(Handle).to_vec();
    assert_eq!(s.create_many(&batch).unwrap(), 4);
    assert!(batch.iter().all(|&h| s.exists(h)));
    assert_eq!((s.size(Handle(1)).unwrap(), s.size(Handle(3)).unwrap()), (3, 0), "data kept");
    assert_eq!(s.create_many(&batch).unwrap(), 0, "again: nothing new");
    // The new ones not used since took no place in the cache of open objects.
    let cached = |h: u64| s.cache().files.contains_key(&Handle(h));
    assert!(!cached(4) && !cached(1 << 20) && !cached(1 << 40));
    // A batch large enough to be synced as one, spread over directories.
    let large: Vec<Handle> = (0..SYNC_FS_FROM as u64 * 2).map(|i| Handle((i << 12) + 7)).collect();
    assert_eq!(s.create_many(&large).unwrap(), large.len());
    assert!(large.iter().all(|&h| s.exists(h) && s.size(h).unwrap() == 0));
}

#[test]
fn peeking_at_sizes_opens_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path(), StoreConfig { max_open: 4, ..Default::default() }).unwrap();
    for h in 1..=8u64 {
        s.create(Handle(h)).unwrap();
        s.write(Handle(h), &[Extent::new(0, h)], &vec![7; h as usize]).unwrap();
    }
    let cached =
        || -> Vec<Handle> { (1..=8).map(Handle).filter(|&h| s.cache().files.contains_key(&h)).collect() };
    let open = cached();
    assert_eq!(open.len(), 4, "the cache holds its four");
    let closed: Vec<Handle> = (1..=8).map(Handle).filter(|h| !open.contains(h)).collect();
    for h in &closed {
        assert_eq!(s.peek_space(*h).unwrap().size, h.0);
    }
    assert_eq!(cached(), open, "no object opened, none pushed out");
    for h in &open {
        assert_eq!(s.peek_space(*h).unwrap().size, h.0, "an open one's size");
    }
    assert!(matches!(s.peek_space(Handle(99)), Err(StoreError::NotFound(Handle(99)))));
}

/// A sparse object holds the space of its data, not of its size; open or not.
#[test]
fn an_object_s_space_leaves_out_its_holes() {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path(), StoreConfig { max_open: 1, ..Default::default() }).unwrap();
    let (sparse, other) = (Handle(1), Handle(2));
    s.create(sparse).unwrap();
    let data = vec![7u8; 64 << 10];
    s.write(sparse, &[Extent::new(0, data.len() as u64)], &data).unwrap();
    s.write(sparse, &[Extent::new(64 << 20, data.len() as u64)], &data).unwrap();
    let open = s.space(sparse).unwrap();
    assert_eq!(open.size, (64 << 20) + (64 << 10));
    assert!(open.allocated >= 128 << 10 && open.allocated < 4 << 20, "{open:?}");
    s.create(other).unwrap();
    s.size(other).unwrap(); // pushes the sparse one out of the cache
    assert!(!s.cache().files.contains_key(&sparse));
    let peeked = s.peek_space(sparse).unwrap();
    assert_eq!(peeked.size, open.size);
    assert!(peeked.allocated >= 128 << 10 && peeked.allocated < 4 << 20, "{peeked:?}");
}

/// A punched range reads as zeros, holds no space and is a hole to seeks; the size stays,
/// and what was reserved there is reserved again by the next write into it.
#[test]
fn a_punched_range_is_a_hole_of_the_same_size() {
    let (_d, s) = store();
    s.create(H).unwrap();
    let mib = 1u64 << 20;
    s.allocate(H, 0, 2 * mib).unwrap();
    let data = vec![7u8; 2 * mib as usize];
    s.write(H, &[Extent::new(0, 2 * mib)], &data).unwrap();
    let before = s.space(H).unwrap();
    s.punch(H, mib / 4, mib).unwrap();
    let after = s.space(H).unwrap();
    assert_eq!(after.size, 2 * mib);
    assert!(after.allocated + mib <= before.allocated, "{before:?} then {after:?}");
    assert_eq!(s.seek(H, 0, true).unwrap().0, Some(mib / 4));
    assert_eq!(s.seek(H, mib / 4, false).unwrap().0, Some(mib / 4 + mib));
    let mut back = vec![1u8; 2 * mib as usize];
    let mut cursor = PieceCursor::new([Piece { off: 0, len: 2 * mib }]);
    s.read_stream(H, &mut cursor, &mut back).unwrap();
    assert!(back[..mib as usize / 4].iter().all(|&b| b == 7));
    assert!(
        back[mib as usize / 4..(mib + mib / 4) as usize].iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    let o = s.object(H).unwrap();
    assert!(!covered(&lock(&o.allocated), mib / 4, mib), "the punched range is no longer reserved");
    assert!(covered(&lock(&o.allocated), 0, mib / 4) && covered(&lock(&o.allocated), mib + mib / 4, 2 * mib));
}

/// Seeks find data and holes below the size, and take everything past it for a hole.
#[test]
fn seeks_find_data_and_holes_up_to_the_size() {
    let (_d, s) = store();
    s.create(H).unwrap();
    let data = vec![7u8; 64 << 10];
    s.write(H, &[Extent::new(0, data.len() as u64)], &data).unwrap();
    s.write(H, &[Extent::new(4 << 20, 100)], &data[..100]).unwrap();
    let size = (4 << 20) + 100;
    assert_eq!(s.seek(H, 0, false).unwrap(), (Some(0), size));
    assert_eq!(s.seek(H, 0, true).unwrap(), (Some(64 << 10), size));
    assert_eq!(s.seek(H, 64 << 10, false).unwrap(), (Some(4 << 20), size));
    assert_eq!(s.seek(H, 4 << 20, true).unwrap(), (Some(size), size), "the end is a hole");
    assert_eq!(s.seek(H, size, false).unwrap(), (None, size), "no data past the end");
    assert_eq!(s.seek(H, size + 5, true).unwrap(), (Some(size + 5), size));
}

#[test]
fn holes_and_past_eof_read_as_zeros() {
    let (_d, s) = store();
    s.create(H).unwrap();
    s.write(H, &[Extent::new(100, 4)], b"data").unwrap();
    assert_eq!(s.size(H).unwrap(), 104);
    let mut buf = vec![0xffu8; 20];
    // A hole, the data, then past the local end.
    let n = s.read(H, &[Extent::new(90, 10), Extent::new(100, 4), Extent::new(200, 6)], &mut buf).unwrap();
    assert_eq!(n, 20);
    assert_eq!(&buf[..10], &[0; 10]);
    assert_eq!(&buf[10..14], b"data");
    assert_eq!(&buf[14..], &[0; 6]);
}

#[test]
fn allocation_reserves_space_and_only_grows() {
    use std::os::unix::fs::MetadataExt;
    let (_d, s) = store();
    s.create(H).unwrap();
    s.write(H, &[Extent::new(0, 10)], b"0123456789").unwrap();
    let blocks = || std::fs::metadata(s.path_of(H)).unwrap().blocks() * 512;
    let before = blocks();
    s.allocate(H, 4096, 1 << 20).unwrap();
    assert_eq!(s.size(H).unwrap(), 4096 + (1 << 20));
    assert!(blocks() >= before + (1 << 20), "{} -> {}", before, blocks());
    // Inside the file: nothing shrinks, the data stays.
    s.allocate(H, 0, 100).unwrap();
    assert_eq!(s.size(H).unwrap(), 4096 + (1 << 20));
    let mut buf = [0u8; 10];
    s.read(H, &[Extent::new(0, 10)], &mut buf).unwrap();
    assert_eq!(&buf, b"0123456789");
    assert!(matches!(s.allocate(H, u64::MAX - 1, 10), Err(StoreError::TooLarge)));
    assert!(s.allocate(Handle(999), 0, 1).is_err(), "no such object");
}

#[test]
fn truncate_down_and_up() {
    let (_d, s) = store();
    s.create(H).unwrap();
    s.write(H, &[Extent::new(0, 10)], b"0123456789").unwrap();
    s.truncate(H, 4).unwrap();
    assert_eq!(s.size(H).unwrap(), 4);
    s.truncate(H, 8).unwrap();
    let mut buf = [0xffu8; 8];
    s.read(H, &[Extent::new(0, 8)], &mut buf).unwrap();
    assert_eq!(&buf, b"0123\0\0\0\0");
    assert!(matches!(s.truncate(H, u64::MAX), Err(StoreError::TooLarge)));
    s.sync(H).unwrap();
}

#[test]
fn streams_in_transfer_units_match_one_shot() {
    let (_d, s) = store();
    s.create(H).unwrap();
    let layout = Layout { base: 0, pcount: 3, ssize: 7 };
    let view = View::new(5, 11, 29).unwrap();
    let pieces: Vec<_> = layout.server_pieces(1, view.extents(0, 500).unwrap()).collect();
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
    // Write in 13-byte transfer units through one cursor.
    let mut cur = PieceCursor::new(pieces.iter().copied());
    for chunk in data.chunks(13) {
        assert_eq!(s.write_stream(H, &mut cur, chunk).unwrap(), chunk.len());
    }
    assert_eq!(s.write_stream(H, &mut cur, b"extra").unwrap(), 0, "cursor exhausted");
    let mut back = vec![0u8; data.len()];
    assert_eq!(s.read(H, &pieces, &mut back).unwrap(), data.len());
    assert_eq!(back, data);
    // And read back in 5-byte units.
    let mut cur = PieceCursor::new(pieces.iter().copied());
    let mut again = Vec::new();
    let mut unit = [0u8; 5];
    loop {
        let n = s.read_stream(H, &mut cur, &mut unit).unwrap();
        if n == 0 {
            break;
        }
        again.extend_from_slice(&unit[..n]);
    }
    assert_eq!(again, data);
}

#[test]
fn write_past_max_size_is_efbig() {
    let (_d, s) = store();
    s.create(H).unwrap();
    let e = s.write(H, &[Extent::new(MAX_OBJECT_SIZE, 1)], b"x").unwrap_err();
    assert_eq!(e.errno(), Errno::EFBIG);
}

#[test]
fn open_file_cache_is_bounded() {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path(), StoreConfig { max_open: 4, ..Default::default() }).unwrap();
    for h in 1..=10 {
        s.create(Handle(h)).unwrap();
        s.write(Handle(h), &[Extent::new(0, 1)], &[h as u8]).unwrap();
        assert!(s.open_files() <= 4);
    }
    assert_eq!(s.open_files(), 4);
    // Evicted objects reopen transparently.
    for h in 1..=10 {
        let mut b = [0u8];
        s.read(Handle(h), &[Extent::new(0, 1)], &mut b).unwrap();
        assert_eq!(b[0], h as u8);
    }
    drop(s);
    let s0 = ObjectStore::open(d.path(), StoreConfig { max_open: 0, ..Default::default() }).unwrap();
    assert_eq!(s0.size(Handle(3)).unwrap(), 1);
    assert_eq!(s0.open_files(), 0);
}

#[test]
fn a_data_directory_has_one_store_at_a_time() {
    let d = tempfile::tempdir().unwrap();
    let s = ObjectStore::open(d.path(), StoreConfig::default()).unwrap();
    let e = ObjectStore::open(d.path(), StoreConfig::default()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
    let msg = e.to_string();
    assert!(msg.contains(&d.path().display().to_string()), "{msg}");
    assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
    drop(s);
    ObjectStore::open(d.path(), StoreConfig::default()).expect("free again once the first is gone");
}

#[test]
fn only_file_systems_known_to_rewrite_in_place_are_trusted_with_mapped_writes() {
    let proc = FileSystem::of(Path::new("/proc")).unwrap();
    assert_eq!(proc.name, "unknown");
    assert!(!proc.rewrites_in_place());
    let named = |magic: u64| FileSystem { name: "", magic };
    assert!(named(0xef53).rewrites_in_place(), "ext4");
    assert!(named(0x0102_1994).rewrites_in_place(), "tmpfs");
    for (fs, magic) in
        [("btrfs", 0x9123_683e), ("xfs", 0x5846_5342), ("zfs", 0x2fc1_2fc1), ("ramfs", 0x8584_58f6)]
    {
        assert!(!named(magic).rewrites_in_place(), "{fs}");
    }
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(FileSystem::of(Path::new("/dev/shm")).unwrap().name, "tmpfs");
    }
    assert!(FileSystem::of(Path::new("/no/such/dir")).is_err());
}

#[test]
fn enospc_maps_to_its_code() {
    let e = StoreError::Io { op: "write", handle: H, error: io::Error::from_raw_os_error(libc::ENOSPC) };
    assert_eq!(e.errno(), Errno::ENOSPC);
    let e = StoreError::Io { op: "write", handle: H, error: io::Error::from_raw_os_error(libc::EIO) };
    assert_eq!(e.errno(), Errno::EIO);
}

/// A real full disk: a 64 KiB tmpfs. Needs mount privileges; skipped (with the reason
/// printed) without them.
#[test]
fn full_disk_returns_enospc_and_store_stays_usable() {
    struct Mount(tempfile::TempDir);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0.path()).status();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(dir.path()).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!("skipping: cannot mount tmpfs: {}", String::from_utf8_lossy(&o.stderr).trim());
            return;
        }
        Err(e) => {
            eprintln!("skipping: cannot run mount: {e}");
            return;
        }
    }
    let m = Mount(dir);
    let s = ObjectStore::open(m.0.path().join("data"), StoreConfig::default()).unwrap();
    s.create(H).unwrap();
    let big = vec![7u8; 1 << 20];
    let e = s.write(H, &[Extent::new(0, big.len() as u64)], &big).unwrap_err();
    assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
    // Freeing space makes the object writable again.
    s.truncate(H, 0).unwrap();
    s.write(H, &[Extent::new(0, 4)], b"ok!!").unwrap();
    let mut b = [0u8; 4];
    s.read(H, &[Extent::new(0, 4)], &mut b).unwrap();
    assert_eq!(&b, b"ok!!");
    drop(s);
}

/// An object opened by one request while another removes it is not kept open past the
/// removal: were it cached, later requests would read the removed file and its space would
/// stay taken until the cache let it go.
#[test]
fn an_object_opened_while_it_is_removed_is_not_kept_open() {
    use std::sync::atomic::{AtomicBool, Ordering};
    // On a tmpfs where there is one: a round is mostly fsyncs, and many rounds are needed to
    // hit the moment between the two.
    let shm = Path::new("/dev/shm");
    let d = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let s = ObjectStore::open(d.path().join("data"), StoreConfig::default()).unwrap();
    for round in 0..10_000u64 {
        let h = Handle(0x10_0000 + round);
        s.create(h).unwrap();
        s.cache().files.remove(&h);
        let done = AtomicBool::new(false);
        std::thread::scope(|t| {
            t.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    let _ = s.object(h);
                }
            });
            s.remove(h).unwrap();
            done.store(true, Ordering::Relaxed);
        });
        assert!(
            matches!(s.object(h), Err(StoreError::NotFound(_))),
            "round {round}: the removed object is still open"
        );
    }
}

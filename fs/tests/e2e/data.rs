//! What reads and writes leave in files: holes, lists, strides, racing writers, allocation.

use super::*;

pub fn sparse_files_and_holes(scheme: &str) {
    let tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    let f = c.create("/sparse", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    let far = 10 << 20;
    f.write_at(far, &Bytes::from_static(b"0123456789")).unwrap();
    assert_eq!(f.size().unwrap(), far + 10);
    let (got, n) = read_all(&f, 0, 200_000);
    assert_eq!(n, 200_000);
    assert!(got.iter().all(|&b| b == 0), "a hole reads as zeros");
    let (got, n) = read_all(&f, far - 5, 20);
    assert_eq!(n, 15);
    assert_eq!(&got[..15], b"\x00\x00\x00\x00\x000123456789");
    assert_eq!(read_all(&f, far + 10, 10).1, 0, "nothing past the end");
    // Data on one server only: a short read at the start must still see the file size that
    // another server defines.
    let g = c.create("/one", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    g.write_at(65536 + 7, &Bytes::from_static(b"x")).unwrap();
    let (got, n) = read_all(&g, 0, 10);
    assert_eq!((n, &got[..]), (10, &[0u8; 10][..]));
    assert_eq!(g.size().unwrap(), 65536 + 8);
    assert_eq!(c.stat("/one").unwrap().attr.size, 65536 + 8);
    // The space a file holds is that of its data, not of its holes: ten bytes 10 MiB out
    // take a block or so; a dense file takes its size. Alike by itself and in a listing.
    let dense = c.create("/dense", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    dense.write_at(0, &pattern(1 << 20, 1)).unwrap();
    let (sparse, dense) = (c.stat("/sparse").unwrap(), c.stat("/dense").unwrap());
    assert!(sparse.allocated > 0 && sparse.allocated <= 64 << 10, "{}", sparse.allocated);
    assert!(dense.allocated >= 1 << 20, "{}", dense.allocated);
    let listed = c.stat_many(&[sparse.handle, dense.handle]);
    let listed: Vec<u64> = listed.into_iter().map(|r| r.unwrap().unwrap().allocated).collect();
    assert_eq!(listed, [sparse.allocated, dense.allocated]);
    assert_eq!(c.stat("/").unwrap().allocated, 0, "a directory holds nothing on the io servers");
    // Seeks for data and holes (`SEEK_DATA`, `SEEK_HOLE`) find the ten bytes, the hole before
    // them and the end after them.
    assert_eq!((f.next_data(0).unwrap(), f.next_hole(0).unwrap()), (Some(far), Some(0)));
    assert_eq!((f.next_data(far + 5).unwrap(), f.next_hole(far).unwrap()), (Some(far + 5), Some(far + 10)));
    assert_eq!((f.next_data(far + 10).unwrap(), f.next_hole(far + 10).unwrap()), (None, None), "the end");
    // Data on two servers with a hole between them, and a dense file.
    let two = c.create("/two", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    two.write_at(0, &pattern(65536, 2)).unwrap();
    two.write_at(1 << 20, &pattern(65536 + 100, 3)).unwrap();
    assert_eq!(two.next_hole(0).unwrap(), Some(65536));
    assert_eq!(two.next_data(65536).unwrap(), Some(1 << 20));
    assert_eq!(two.next_hole(1 << 20).unwrap(), Some((1 << 20) + 65536 + 100), "the end, across servers");
    let dense = c.open("/dense", Rights::READ_WRITE).unwrap();
    assert_eq!((dense.next_data(0).unwrap(), dense.next_hole(0).unwrap()), (Some(0), Some(1 << 20)));
    // A hole punched across every server: zeros, no space, a hole to seeks; the size stays.
    let held = c.stat("/dense").unwrap().allocated;
    dense.punch_hole(128 << 10, 512 << 10).unwrap();
    let st = c.stat("/dense").unwrap();
    assert_eq!(st.attr.size, 1 << 20);
    assert!(st.allocated + (512 << 10) <= held, "{held} then {}", st.allocated);
    assert_eq!(
        (dense.next_hole(0).unwrap(), dense.next_data(128 << 10).unwrap()),
        (Some(128 << 10), Some(640 << 10))
    );
    let (back, n) = read_all(&dense, 0, 1 << 20);
    assert_eq!(n, 1 << 20);
    let want = pattern(1 << 20, 1);
    assert!(back[..128 << 10] == want[..128 << 10] && back[640 << 10..] == want[640 << 10..]);
    assert!(back[128 << 10..640 << 10].iter().all(|&b| b == 0), "the hole reads as zeros");
    let reader = c.open("/dense", Rights::READ).unwrap();
    assert_eq!(code(reader.punch_hole(0, 1)), Errno::EBADF, "punching needs a file opened for writing");
}

/// `read_into` lands each read in a buffer the client keeps between calls: a later read of
/// holes and of bytes past the end must not show what an earlier read left there.
pub fn a_writers_sync_records_the_modification_time(scheme: &str) {
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    let f = c.create("/f", CreateOptions::default()).unwrap();
    let created = c.stat("/f").unwrap().attr.mtime;
    let past = Timestamp { secs: 1_000_000, nsecs: 7 };
    let set_past = || {
        c.setattr(
            f.handle(),
            SetAttr { mtime: Some(stripefs::proto::SetTime::At(past)), ..Default::default() },
        )
        .unwrap()
    };
    set_past();
    // Nothing written: sync and record_mtime leave an explicit time alone.
    f.sync().unwrap();
    f.record_mtime().unwrap();
    assert_eq!(c.stat("/f").unwrap().attr.mtime, past);
    // Written: not at each write, but at the writer's sync or record_mtime, then once.
    f.write_at(0, &Bytes::from_static(b"data")).unwrap();
    assert_eq!(c.stat("/f").unwrap().attr.mtime, past);
    f.sync().unwrap();
    let synced = c.stat("/f").unwrap().attr;
    assert!(synced.mtime > created && synced.ctime >= synced.mtime, "{synced:?}");
    set_past();
    f.record_mtime().unwrap();
    assert_eq!(c.stat("/f").unwrap().attr.mtime, past, "recorded once per batch of writes");
    f.write_list(&[Extent::new(0, 2)], &[Extent::new(100, 2)], &Bytes::from_static(b"xy")).unwrap();
    f.record_mtime().unwrap();
    assert!(c.stat("/f").unwrap().attr.mtime > synced.mtime);
    // A reader never changes it.
    set_past();
    let r = c.open("/f", Rights::READ).unwrap();
    read_all(&r, 0, 10);
    r.record_mtime().unwrap();
    // A reader may sync, as a descriptor opened for reading may be synced on Linux (`sync
    // FILE` opens it so).
    r.sync().unwrap();
    assert_eq!(c.stat("/f").unwrap().attr.mtime, past);
}

pub fn read_into_shows_no_earlier_bytes(scheme: &str) {
    let tc = TestCluster::start(scheme, 3);
    let c = tc.client();
    let mib = 1usize << 20;
    let full = c.create("/full", CreateOptions { mode: 0o644, layout: spec(3, 65536) }).unwrap();
    let data = pattern(3 * mib, 9);
    full.write_at(0, &data).unwrap();
    // One MiB, a one-MiB hole, then 100 bytes: 2 MiB + 100 long.
    let holey = c.create("/holey", CreateOptions { mode: 0o644, layout: spec(3, 65536) }).unwrap();
    let head = pattern(mib, 10);
    holey.write_at(0, &head).unwrap();
    holey.write_at(2 * mib as u64, &Bytes::from_static(&[7u8; 100])).unwrap();
    for round in 0..3 {
        let mut dst = vec![0xaau8; 3 * mib];
        assert_eq!(full.read_into(0, &mut dst).unwrap(), 3 * mib);
        assert!(dst == data, "round {round}: the whole file");
        let mut dst = vec![0xaau8; 3 * mib];
        assert_eq!(holey.read_into(0, &mut dst).unwrap(), 2 * mib + 100);
        assert!(dst[..mib] == head[..], "round {round}: data before the hole");
        assert!(dst[mib..2 * mib].iter().all(|&b| b == 0), "round {round}: the hole reads as zeros");
        assert!(dst[2 * mib..2 * mib + 100].iter().all(|&b| b == 7), "round {round}: data after the hole");
        assert!(dst[2 * mib + 100..].iter().all(|&b| b == 0), "round {round}: past the end is zeroed");
        // A shorter read, cut from the kept buffer.
        let mut dst = vec![0xaau8; 1000];
        assert_eq!(full.read_into(5, &mut dst).unwrap(), 1000);
        assert!(dst[..] == data[5..1005], "round {round}: a short read");
    }
}

pub fn list_io_matches_contiguous(scheme: &str) {
    let tc = TestCluster::start(scheme, 3);
    let c = tc.client();
    let f = c.create("/list", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    let len = 200_000usize;
    // Reference: the same bytes written by contiguous calls.
    let r = c.create("/ref", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    let mem_buf = pattern(2 * len, 3);
    // File list: 100 extents of varying size, out of order; memory list: scattered, different cuts.
    let mut file = Vec::new();
    let mut at = 0u64;
    for i in 0..100u64 {
        let l = 1000 + (i * 37) % 1000;
        file.push(Extent::new((i * 7919) % 97 * 5000 + at % 3, l));
        at += l;
    }
    // Make file extents disjoint: place each in its own 5000-byte slot by index.
    for (i, e) in file.iter_mut().enumerate() {
        e.off = i as u64 * 5003 + (i as u64 % 3);
    }
    file.reverse();
    let total: u64 = file.iter().map(|e| e.len).sum();
    let mut mem = Vec::new();
    let mut m = 0u64;
    let mut left = total;
    while left > 0 {
        let l = left.min(777);
        mem.push(Extent::new(m, l));
        m += l + 13;
        left -= l;
    }
    assert!(m as usize <= mem_buf.len());
    assert_eq!(f.write_list(&mem, &file, &mem_buf).unwrap(), total);
    // The equivalent contiguous calls: the stream is the memory list's bytes, in order.
    let stream: Vec<u8> =
        mem.iter().flat_map(|e| mem_buf[e.off as usize..(e.off + e.len) as usize].to_vec()).collect();
    let mut s = 0usize;
    for e in &file {
        r.write_all_at(e.off, &stream[s..s + e.len as usize]).unwrap();
        s += e.len as usize;
    }
    let size = r.size().unwrap();
    assert_eq!(f.size().unwrap(), size);
    assert_eq!(read_all(&f, 0, size as usize).0, read_all(&r, 0, size as usize).0, "same bytes in the file");
    // Reading the list back scatters into the same memory positions.
    let back = f.read_list(&mem, &file, BytesMut::zeroed(mem_buf.len())).unwrap();
    for e in &mem {
        let (a, b) = (e.off as usize, (e.off + e.len) as usize);
        assert_eq!(&back[a..b], &mem_buf[a..b]);
    }
    // A strided view gives the same bytes as the contiguous blocks it stands for.
    let v = c.create("/view", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    v.set_view(100, 3000, 7000).unwrap();
    let vdata = pattern(40_000, 4);
    v.write_view(0, &vdata).unwrap();
    v.clear_view();
    for blk in 0..(40_000 / 3000 + 1) {
        let start = blk * 3000;
        let end = (start + 3000).min(40_000);
        let (got, _) = read_all(&v, 100 + (blk * 7000) as u64, end - start);
        assert_eq!(&got[..], &vdata[start..end], "block {blk}");
    }
    v.set_view(100, 3000, 7000).unwrap();
    let back = v.read_view(1234, BytesMut::zeroed(20_000)).unwrap();
    assert_eq!(&back[..], &vdata[1234..21_234]);
}

pub fn eight_clients_interleaved_strided(scheme: &str) {
    let tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    drop(c.create("/shared", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap());
    let (clients, g, blocks) = (8u64, 10_007u64, 40u64);
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let client = tc.client();
            std::thread::spawn(move || {
                let f = client.open("/shared", Rights::READ_WRITE).unwrap();
                f.set_view(i * g, g, clients * g).unwrap();
                let mine = pattern((g * blocks) as usize, 100 + i);
                // Half the clients write in one call, half block by block.
                if i % 2 == 0 {
                    f.write_view(0, &mine).unwrap();
                } else {
                    for b in 0..blocks {
                        f.write_view(b * g, &mine.slice((b * g) as usize..((b + 1) * g) as usize)).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let total = (clients * g * blocks) as usize;
    let f = c.open("/shared", Rights::READ).unwrap();
    assert_eq!(f.size().unwrap(), total as u64);
    let (all, n) = read_all(&f, 0, total);
    assert_eq!(n, total);
    let mines: Vec<Bytes> = (0..clients).map(|i| pattern((g * blocks) as usize, 100 + i)).collect();
    for (off, &byte) in all.iter().enumerate() {
        let off = off as u64;
        let (blk, within) = (off / g, off % g);
        let (client, round) = (blk % clients, blk / clients);
        assert_eq!(byte, mines[client as usize][(round * g + within) as usize], "byte {off}");
    }
}

/// Writers racing over the same range: the io server leases each transfer unit whole while it
/// pulls into it, so every transfer unit ends up wholly one writer's bytes, and nobody hangs.
/// Nothing larger is promised: overlapping requests take turns unit by unit and one may pass
/// another between units, so a stripe unit of several transfer units can end up mixed (this
/// test once checked 1 MiB stripe units on a 64 KiB-unit cluster and failed about 1 run in 10).
pub fn overlapping_writers_each_win_whole_units(scheme: &str) {
    // Transfer units smaller than the stripe unit (32 per request: many turns to take), and
    // equal to it.
    for tu in [64 << 10, 1 << 20] {
        let tc = TestCluster::start_with(scheme, 1, |o| {
            o.transfer_unit = Some(tu as u64);
            o.io_args = vec!["--map-disk-writes".into()];
        });
        let c = tc.client();
        let f = c.create("/race", CreateOptions { mode: 0o644, layout: spec(1, 1 << 20) }).unwrap();
        let (len, writers, rounds) = (2 << 20, 4u8, 10);
        let datas: Vec<Bytes> = (1..=writers).map(|i| Bytes::from(vec![i; len])).collect();
        std::thread::scope(|s| {
            for d in &datas {
                let c = tc.client();
                s.spawn(move || {
                    let f = c.open("/race", Rights::READ_WRITE).unwrap();
                    for _ in 0..rounds {
                        f.write_at(0, d).unwrap();
                    }
                });
            }
        });
        // The premise: every write_at was one request, and each went down the leased path.
        let st = io_stats(&c);
        let requests = u64::from(writers) * rounds;
        assert_eq!((st.writes, st.mapped.writes, st.copied.writes), (requests, requests, 0), "{st:?}");
        let (back, n) = read_all(&f, 0, len);
        assert_eq!(n, len);
        // One server, so the object's transfer units are the file's.
        for (i, u) in back.chunks(tu).enumerate() {
            let mut runs: Vec<(usize, u8)> = Vec::new();
            for (j, &b) in u.iter().enumerate() {
                if runs.last().is_none_or(|r| r.1 != b) {
                    runs.push((j, b));
                }
            }
            assert!(
                runs.len() == 1 && u[0] >= 1,
                "{tu}-byte transfer unit {i} mixes writers: (offset, byte) runs {runs:?}; io server {:?}",
                io_stats(&c)
            );
        }
    }
}

/// A writer whose bytes are being read without pause still gets its turn. Four clients read
/// one 1 MiB unit over and over, so at almost every instant some read holds the unit's lease;
/// a writer that only retried would wait until the clients' timeout. Queued behind the reads in
/// flight, with newer reads held back, every write goes through.
pub fn a_writer_is_not_starved_by_readers_of_the_same_bytes(scheme: &str) {
    let tu = 1usize << 20;
    let tc = TestCluster::start_with(scheme, 1, |o| o.transfer_unit = Some(tu as u64));
    let c = tc.client();
    let f = c.create("/hot", CreateOptions { mode: 0o644, layout: spec(1, tu as u64) }).unwrap();
    f.write_at(0, &Bytes::from(vec![0u8; tu])).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let reading = std::sync::atomic::AtomicUsize::new(0);
    let rounds = 5u8;
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (c, stop, reading) = (tc.client(), &stop, &reading);
                s.spawn(move || {
                    let f = c.open("/hot", Rights::READ).unwrap();
                    let mut reads = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (_, n) = read_all(&f, 0, tu);
                        assert_eq!(n, tu);
                        if reads == 0 {
                            reading.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writer = tc.client();
        let w = writer.open("/hot", Rights::READ_WRITE).unwrap();
        // The writes start once every reader is reading (a fast writer could otherwise be done
        // before the readers have opened the file).
        let t0 = std::time::Instant::now();
        while reading.load(std::sync::atomic::Ordering::Relaxed) < 4 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the readers never got going");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let written: Vec<_> = (1..=rounds).map(|i| w.write_at(0, &Bytes::from(vec![i; tu]))).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        for (i, r) in written.iter().enumerate() {
            assert!(r.is_ok(), "write {i} with {reads} reads going on: {r:?}");
        }
    });
    let (back, _) = read_all(&f, 0, tu);
    assert!(back.iter().all(|&b| b == rounds), "the last write is what the file holds");
}

/// `posix_fallocate` through the library: the file grows to the range's end (never shrinks),
/// every io server holding part of the range reserves its share, the times move.
#[test]
fn allocation_reserves_the_range_and_only_grows() {
    use std::os::unix::fs::MetadataExt;
    let tc = TestCluster::start("tcp", 3);
    let c = tc.client();
    let f = c.create("/f", CreateOptions { mode: 0o644, layout: spec(3, 65536) }).unwrap();
    f.write_all_at(0, b"head").unwrap();
    let blocks = || -> u64 {
        fn walk(d: &std::path::Path) -> u64 {
            std::fs::read_dir(d)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| {
                            if e.path().is_dir() {
                                walk(&e.path())
                            } else {
                                e.metadata().unwrap().blocks() * 512
                            }
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(tc.dir.path())
    };
    let before = (blocks(), c.getattr(f.handle()).unwrap().ctime);
    f.allocate(100_000, 1_000_000).unwrap();
    assert_eq!(f.size().unwrap(), 1_100_000);
    assert!(blocks() >= before.0 + 1_000_000, "{} -> {}", before.0, blocks());
    assert!(c.getattr(f.handle()).unwrap().ctime > before.1);
    // A range inside the file changes no size; the data stays.
    f.allocate(0, 10).unwrap();
    assert_eq!(f.size().unwrap(), 1_100_000);
    assert_eq!(read_all(&f, 0, 4).0, b"head");
    assert_eq!(code(f.allocate(0, 0)), Errno::EINVAL);
    // Writing needs the right to: a file opened for reading may not allocate.
    let ro = c.open("/f", Rights::READ).unwrap();
    assert_eq!(code(ro.allocate(0, 1)), Errno::EBADF);
}

//! End-to-end behaviour of a stripefs cluster (1 meta + io servers as child processes) through
//! the client library. Every test is written against a transport scheme; `transports!` at the
//! bottom instantiates them per scheme (add `softib` there once its engine lands).

mod common;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, no_objects_ahead, pattern, requests_during};
use std::time::Duration;
use stripefs::capability::Rights;
use stripefs::layout::Extent;
use stripefs::proto::{self, FileKind, Handle, LayoutSpec, ServerStats, SetAttr, Timestamp};
use stripefs::{CreateOptions, Errno, FsError};

fn code<T: std::fmt::Debug>(r: Result<T, FsError>) -> Errno {
    match r {
        Err(e) => e.errno(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn read_all(f: &stripefs::File, off: u64, len: usize) -> (Vec<u8>, usize) {
    let (b, n) = f.read_at(off, BytesMut::zeroed(len)).expect("read");
    (b.to_vec(), n)
}

fn spec(pcount: u32, ssize: u64) -> Option<LayoutSpec> {
    Some(LayoutSpec { base: None, pcount: Some(pcount), ssize: Some(ssize) })
}

pub fn namespace_and_data(scheme: &str) {
    let tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    // create + write + read
    let data = pattern(3 * 65536 + 12345, 1);
    let f = c.create("/a", CreateOptions { mode: 0o640, layout: None }).unwrap();
    assert_eq!(f.layout().pcount, 4, "default: striped over every server");
    assert_eq!(f.write_at(0, &data).unwrap(), data.len());
    let (got, n) = read_all(&f, 0, data.len() + 100);
    assert_eq!(n, data.len(), "a read past the end stops at the end of file");
    assert_eq!(&got[..n], &data[..]);
    let (mid, n) = read_all(&f, 65530, 20);
    assert_eq!((n, &mid[..]), (20, &data[65530..65550]));
    // stat: logical size from the io servers, attributes from the meta server
    let st = c.stat("/a").unwrap();
    assert_eq!((st.attr.size, st.attr.mode, st.attr.kind), (data.len() as u64, 0o640, FileKind::File));
    assert_eq!(st.layout, Some(f.layout()));
    // directories, readdir, rename
    c.mkdir("/d", 0o755).unwrap();
    assert_eq!(code(c.mkdir("/d", 0o755)), Errno::EEXIST);
    let names: Vec<String> = c.readdir("/").unwrap().into_iter().map(|e| e.name.to_string()).collect();
    assert_eq!(names, ["a", "d"]);
    c.rename("/a", "/d/b").unwrap();
    assert_eq!(code(c.stat("/a")), Errno::ENOENT);
    let f2 = c.open("/d/b", Rights::READ_WRITE).unwrap();
    assert_eq!(f2.handle(), f.handle(), "rename keeps the file");
    assert_eq!(read_all(&f2, 0, data.len()).0, &data[..]);
    assert_eq!(code(c.rmdir("/d")), Errno::ENOTEMPTY);
    // truncate down, then up (a hole at the end)
    c.truncate("/d/b", 1000).unwrap();
    assert_eq!(c.stat("/d/b").unwrap().attr.size, 1000);
    let (got, n) = read_all(&f2, 0, 5000);
    assert_eq!((n, &got[..1000]), (1000, &data[..1000]));
    f2.truncate(300_000).unwrap();
    assert_eq!(f2.size().unwrap(), 300_000);
    let (got, n) = read_all(&f2, 0, 300_000);
    assert_eq!(n, 300_000);
    assert_eq!(&got[..1000], &data[..1000]);
    assert!(got[1000..].iter().all(|&b| b == 0), "bytes cut by the truncate come back as zeros");
    // a layout with an impossible field is the caller's error, refused before it is sent
    // A stripe below a page (`1` for a MiB) would cost every reader a piece per few bytes.
    for bad in [spec(2, 0), spec(0, 4096), spec(2, 1), spec(2, 4095)] {
        let e = c.create("/d/bad", CreateOptions { mode: 0o644, layout: bad }).unwrap_err();
        assert!(matches!(e, FsError::Layout(_)), "{e:?}");
        assert_eq!(e.errno(), Errno::EINVAL);
        assert!(matches!(c.setstripe("/d", bad), Err(FsError::Layout(_))));
    }
    assert_eq!(code(c.stat("/d/bad")), Errno::ENOENT, "nothing was created");
    // per-directory default layouts
    c.setstripe("/d", spec(2, 4096)).unwrap();
    let g = c.create("/d/small", CreateOptions::default()).unwrap();
    assert_eq!((g.layout().pcount, g.layout().ssize), (2, 4096));
    assert_eq!(c.getstripe("/d").unwrap().1, spec(2, 4096));
    let small = pattern(50_000, 2);
    g.write_at(0, &small).unwrap();
    g.sync().unwrap();
    assert_eq!(read_all(&g, 0, 50_000).0, &small[..]);
    // unlink removes the file and its objects
    c.unlink("/d/b").unwrap();
    assert_eq!(code(c.open("/d/b", Rights::READ)), Errno::ENOENT);
    // The objects go right after the answer.
    let t = std::time::Instant::now();
    while f2.read_at(0, BytesMut::zeroed(10)).is_ok() {
        assert!(t.elapsed() < Duration::from_secs(30), "the objects were never removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(code(f2.read_at(0, BytesMut::zeroed(10))), Errno::ENOENT, "objects are gone");
    c.unlink("/d/small").unwrap();
    c.rmdir("/d").unwrap();
    assert!(c.readdir("/").unwrap().is_empty());
    let fs = c.statfs().unwrap();
    assert_eq!((fs.files, fs.dirs, fs.io_servers), (0, 1, 4));
}

pub fn symbolic_links(scheme: &str) {
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    c.mkdir("/d/e", 0o755).unwrap();
    let data = pattern(100_000, 3);
    let f = c.create("/d/e/f", CreateOptions::default()).unwrap();
    f.write_at(0, &data).unwrap();
    // Relative (to the link's directory, `..` included), absolute, and in the middle of a path.
    c.symlink("e/f", "/d/rel").unwrap();
    c.symlink("/d/e", "/abs").unwrap();
    c.symlink("../e/./f", "/d/e/up").unwrap();
    for p in ["/d/rel", "/abs/f", "/d/e/up", "/abs/up", "/d/e/../rel", "/../d/rel"] {
        let g = c.open(p, Rights::READ).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(g.handle(), f.handle(), "{p}");
        assert_eq!(read_all(&g, 0, data.len()).0, &data[..], "{p}");
        assert_eq!(c.stat(p).unwrap().attr.size, data.len() as u64, "{p}: stat follows");
    }
    let l = c.lstat("/d/rel").unwrap();
    assert_eq!((l.attr.kind, l.attr.size, l.attr.mode, l.layout), (FileKind::Symlink, 3, 0o777, None));
    assert_eq!(c.readlink("/d/rel").unwrap(), "e/f");
    assert_eq!(c.readlink("/abs").unwrap(), "/d/e");
    assert_eq!(code(c.readlink("/d/e/f")), Errno::EINVAL);
    assert_eq!(code(c.open_handle(l.handle, Rights::READ)), Errno::ELOOP, "a link is not opened itself");
    let names = |p: &str| -> Vec<(String, FileKind)> {
        c.readdir(p).unwrap().into_iter().map(|e| (e.name.to_string(), e.kind)).collect()
    };
    assert_eq!(names("/abs"), [("f".into(), FileKind::File), ("up".into(), FileKind::Symlink)]);
    // Creating, truncating and renaming through links act on what they point at.
    c.create("/abs/new", CreateOptions::default()).unwrap();
    assert_eq!(names("/d/e").len(), 3);
    c.truncate("/d/rel", 10).unwrap();
    assert_eq!(f.size().unwrap(), 10);
    c.rename("/abs/new", "/abs/newer").unwrap();
    assert_eq!(c.stat("/d/e/newer").unwrap().attr.kind, FileKind::File);
    // Dangling links, loops, files in the middle of a path.
    c.symlink("nowhere", "/dangling").unwrap();
    assert_eq!(code(c.stat("/dangling")), Errno::ENOENT);
    assert_eq!(c.lstat("/dangling").unwrap().attr.kind, FileKind::Symlink);
    c.symlink("/loop2", "/loop1").unwrap();
    c.symlink("loop1", "/loop2").unwrap();
    assert_eq!(code(c.open("/loop1", Rights::READ)), Errno::ELOOP);
    assert_eq!(code(c.stat("/loop2/x")), Errno::ELOOP);
    assert_eq!(code(c.stat("/d/e/f/x")), Errno::ENOTDIR);
    assert_eq!(code(c.symlink("x", "/d/rel")), Errno::EEXIST);
    assert_eq!(code(c.symlink(&"t".repeat(5000), "/long")), Errno::ENAMETOOLONG);
    // A link is renamed and removed itself; what it points at stays.
    c.rename("/d/rel", "/d/rel2").unwrap();
    assert_eq!(c.readlink("/d/rel2").unwrap(), "e/f");
    for l in ["/abs", "/d/rel2", "/dangling", "/loop1", "/loop2", "/d/e/up"] {
        c.unlink(l).unwrap();
    }
    assert_eq!(names("/d/e"), [("f".into(), FileKind::File), ("newer".into(), FileKind::File)]);
    assert_eq!(read_all(&f, 0, 10).0, &data[..10]);
    let fs = c.statfs().unwrap();
    assert_eq!((fs.files, fs.dirs), (2, 3));
}

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

/// A read that reaches every server of the layout learns the file's size from their replies:
/// reading past the end of a small file asks no server for its size afterwards.
pub fn a_read_from_every_server_needs_no_size_round(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    let f = c.create("/small", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    f.write_at(0, &pattern(4096, 3)).unwrap();
    // Another server's share reaching further than the data the read found.
    let g = c.create("/far", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    g.write_at(0, &pattern(100, 4)).unwrap();
    g.write_at(3 * 65536 + 10, &pattern(5, 5)).unwrap();
    let requests = |c: &stripefs::Client| -> u64 {
        c.status()
            .io
            .iter()
            .map(|s| match s {
                stripefs::ServerState::Up(st) => st.requests,
                s => panic!("{s:?}"),
            })
            .sum()
    };
    let bytes_read =
        |c: &stripefs::Client| -> u64 { c.server_stats().into_iter().map(|s| s.unwrap().bytes_read).sum() };
    for (file, len, want) in [(&f, 1 << 20, pattern(4096, 3)), (&g, 1 << 20, Bytes::new())] {
        let before = requests(&c);
        let moved = bytes_read(&c);
        // A buffer holding other bytes, as a reused one does: holes and the rest read as zeros.
        let mut stale = BytesMut::zeroed(len);
        stale.fill(0xaa);
        let (buf, n) = file.read_at(0, stale).unwrap();
        // One read per server and one status request per server to count them.
        assert_eq!(requests(&c) - before - 4, 2 * 4, "one read per server, no size requests");
        if want.is_empty() {
            assert_eq!(n, 3 * 65536 + 15);
            assert_eq!(&buf[..100], &pattern(100, 4)[..]);
            assert!(buf[100..3 * 65536 + 10].iter().all(|&b| b == 0), "holes read as zeros");
            assert_eq!(&buf[3 * 65536 + 10..n], &pattern(5, 5)[..]);
        } else {
            assert_eq!((n, &buf[..n]), (want.len(), &want[..]));
        }
        assert!(buf[n..].iter().all(|&b| b == 0), "past the end reads as zeros");
        // The servers sent the bytes up to each one's end of the object, not the zeros past it.
        assert_eq!(bytes_read(&c) - moved, if want.is_empty() { 100 + 15 } else { 4096 });
    }
    // A read that leaves servers out still asks them where the file ends.
    let before = requests(&c);
    let (_, n) = g.read_at(0, BytesMut::zeroed(1000)).unwrap();
    assert_eq!(n, 1000);
    let (_, n) = g.read_at(65536 * 2, BytesMut::zeroed(65536 * 2)).unwrap();
    assert_eq!(n, 65536 + 15);
    assert_eq!(requests(&c) - before, 1 + 4 + 2 + 4 + 4);
}

/// A client that opened a file lately asks the meta server only for its attributes when it
/// stats the file, and the file's io servers for their sizes at the same time; the size is
/// current whoever changed it, and a client that never opened the file asks for a capability
/// first.
pub fn a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    let f = c.create("/f", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    f.write_at(0, &pattern(3 * 65536 + 7, 1)).unwrap();
    let h = f.handle();
    let stat = |c: &stripefs::Client| {
        let ((meta, io), size) = requests_during(c, || c.stat_handle(h).unwrap().attr.size);
        (size, meta, io)
    };
    assert_eq!(stat(&c), (3 * 65536 + 7, 1, 4), "the attributes, and each server's size");
    let other = tc.client();
    other.truncate("/f", 100).unwrap();
    assert_eq!(stat(&c), (100, 1, 4), "another client's truncate is seen");
    assert_eq!(stat(&other), (100, 2, 4), "the attributes, a capability, each server's size");
    assert_eq!(stat(&other), (100, 1, 4), "the capability was kept");
    // Gone, the file is not found, however it was stat'ed before.
    c.unlink("/f").unwrap();
    assert_eq!(c.stat_handle(h).map_err(|e| e.errno()).unwrap_err(), Errno::ENOENT);
}

/// A listing's stats come in batches: the meta server's attributes of up to a batch of
/// entries in one request, and each io server's sizes of those files in one; each entry's stat
/// is the one it would have on its own, and an entry removed since it was listed fails alone.
pub fn a_listings_stats_take_one_request_per_server_a_batch(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let files = proto::MAX_BATCH + 2;
    for i in 0..files {
        // Stripe counts of 1 to 4 at every base, and sizes that end on each server.
        let layout = Some(LayoutSpec {
            base: Some((i % 4) as u32),
            pcount: Some((i % 4 + 1) as u32),
            ssize: Some(4096),
        });
        let f = c.create(&format!("/d/f{i:03}"), CreateOptions { mode: 0o644, layout }).unwrap();
        f.write_all_at(0, &pattern(i * 1500, i as u64)).unwrap();
    }
    c.mkdir("/d/sub", 0o700).unwrap();
    c.symlink("/d/f000", "/d/link").unwrap();
    let d = c.resolve("/d").unwrap();
    let entries = c.readdir_handle(d).unwrap();
    let handles: Vec<Handle> = entries.iter().map(|e| e.handle).collect();
    // Another client, with no capability kept from opening the files.
    let lister = tc.client();
    let (asked, stats) = requests_during(&lister, || lister.stat_many(&handles));
    // Two batches: in the first every io server holds some file; the second's files (f128 on
    // server 0, f129 on servers 1 and 2) need three.
    assert_eq!(asked, (2, 4 + 3));
    for (st, h) in stats.iter().zip(&handles) {
        let one = c.stat_handle(*h).unwrap();
        let st = st.as_ref().unwrap().as_ref().unwrap();
        assert_eq!((st.handle, &st.attr, st.layout), (one.handle, &one.attr, one.layout));
    }
    let sizes: Vec<u64> =
        stats.iter().take(files).map(|s| s.as_ref().unwrap().as_ref().unwrap().attr.size).collect();
    assert_eq!(sizes, (0..files as u64).map(|i| i * 1500).collect::<Vec<_>>());
    // Removed since it was listed: that entry fails, the others do not.
    c.unlink("/d/f005").unwrap();
    let stats = lister.stat_many(&handles[..10]);
    assert_eq!(stats[5].as_ref().map(|_| ()).unwrap_err().errno(), Errno::ENOENT);
    assert!(stats.iter().enumerate().all(|(i, s)| i == 5 || matches!(s, Ok(Ok(_)))));
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

pub fn io_server_killed_mid_write_is_an_error(scheme: &str) {
    let mut tc = TestCluster::start(scheme, 4);
    let c = tc.client();
    let f = c.create("/victim", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    let data = pattern(8 << 20, 5);
    let writer = std::thread::spawn(move || {
        for i in 0..10_000u64 {
            if let Err(e) = f.write_at((i % 8) * data.len() as u64, &data) {
                return Some(e);
            }
        }
        None
    });
    std::thread::sleep(Duration::from_millis(300));
    tc.cluster.kill_io(2);
    let err = writer.join().unwrap().expect("the write fails once a server is gone");
    let code = err.errno();
    assert!(
        [Errno::ENOTCONN, Errno::EIO, Errno::ETIMEDOUT].contains(&code),
        "a clear error, got {code:?}: {err}"
    );
    // The namespace still answers, and files on the surviving servers still work.
    let g = c
        .create(
            "/survivor",
            CreateOptions {
                mode: 0o644,
                layout: Some(LayoutSpec { base: Some(0), pcount: Some(2), ssize: None }),
            },
        )
        .unwrap();
    g.write_all_at(0, b"still here").unwrap();
    assert_eq!(&read_all(&g, 0, 10).0, b"still here");
    // A file on the dead server fails cleanly too.
    let v = c.open("/victim", Rights::READ).unwrap();
    assert!(v.read_at(0, BytesMut::zeroed(1 << 20)).is_err());
}

pub fn restart_serves_synced_files_and_namespace(scheme: &str) {
    let mut tc = TestCluster::start(scheme, 3);
    let c = tc.client();
    c.mkdir("/x", 0o755).unwrap();
    c.mkdir("/x/y", 0o700).unwrap();
    let mut files = Vec::new();
    for (i, path) in ["/top", "/x/a", "/x/y/b", "/x/y/c"].iter().enumerate() {
        let f =
            c.create(path, CreateOptions { mode: 0o600, layout: spec(1 + (i as u32 % 3), 8192) }).unwrap();
        let d = pattern(30_000 * (i + 1), 10 + i as u64);
        f.write_at(0, &d).unwrap();
        f.sync().unwrap();
        files.push((path.to_string(), d, f.handle()));
    }
    c.setstripe("/x", spec(2, 16384)).unwrap();
    drop(c);
    tc.cluster.kill_meta();
    for i in 0..3 {
        tc.cluster.kill_io(i);
    }
    tc.cluster.restart_meta().unwrap();
    for i in 0..3 {
        tc.cluster.restart_io(i).unwrap();
    }
    let c = tc.client();
    let names =
        |p: &str| -> Vec<String> { c.readdir(p).unwrap().into_iter().map(|e| e.name.to_string()).collect() };
    assert_eq!(names("/"), ["top", "x"]);
    assert_eq!(names("/x"), ["a", "y"]);
    assert_eq!(names("/x/y"), ["b", "c"]);
    assert_eq!(c.stat("/x/y").unwrap().attr.mode, 0o700);
    assert_eq!(c.getstripe("/x").unwrap().1, spec(2, 16384));
    let mut max_handle = Handle(0);
    for (path, d, h) in &files {
        let f = c.open(path, Rights::READ).unwrap();
        assert_eq!(f.handle(), *h);
        assert_eq!(f.size().unwrap(), d.len() as u64, "{path}");
        assert_eq!(read_all(&f, 0, d.len()).0, &d[..], "{path}");
        max_handle = max_handle.max(*h);
    }
    let n = c.create("/new", CreateOptions::default()).unwrap();
    assert!(n.handle() > max_handle, "handles are never reused");
}

pub fn forged_and_expired_capabilities_are_refused(scheme: &str) {
    use stripefs::capability::CapabilityKey;
    use stripefs::net::{TAG_IO, endpoint_config};
    use stripefs::proto::{self, Envelope, IoReply, IoRequest};
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    let f = c.create("/secret", CreateOptions { mode: 0o600, layout: spec(2, 4096) }).unwrap();
    f.write_all_at(0, b"top secret").unwrap();
    let h = f.handle();
    let key = tc.key();
    let ep = ionet::Endpoint::client(endpoint_config(&key, ionet::WaitMode::Block, false, None)).unwrap();
    let peer = ep.connect(&tc.cluster.config().io_servers[0]).unwrap();
    let call = |header: Vec<u8>| -> IoReply {
        let op = ep
            .request(peer, TAG_IO, Bytes::from(header), ionet::Payload::None, ionet::ServiceLevel::Control)
            .unwrap();
        let comp = ep.wait(op).unwrap();
        proto::decode::<IoReply>(&comp.reply.expect("a typed reply")).unwrap().body
    };
    let err_code = |r: IoReply| match r {
        IoReply::Error(e) => e.code,
        r => panic!("expected an error reply, got {r:?}"),
    };
    let send = |req: IoRequest| call(proto::encode(&Envelope::new(7, req)).unwrap());
    let ck = CapabilityKey::new(&key).unwrap();
    let now = stripefs::capability::unix_now();
    // A genuine capability works.
    let good = ck.mint(h, Rights::READ, now + 60, 1);
    assert!(matches!(send(IoRequest::GetSize { cap: good.clone() }), IoReply::Size(_)));
    // Forged: one flipped bit of the MAC, or rights raised without re-signing.
    let mut forged = good.clone();
    forged.mac[0] ^= 1;
    assert_eq!(err_code(send(IoRequest::GetSize { cap: forged })), Errno::EACCES);
    let mut raised = good.clone();
    raised.rights = Rights::ALL;
    assert_eq!(err_code(send(IoRequest::RemoveObject { cap: raised })), Errno::EACCES);
    // Signed with another key.
    let other = CapabilityKey::new(b"not-the-cluster-key!").unwrap().mint(h, Rights::ALL, now + 60, 1);
    assert_eq!(err_code(send(IoRequest::GetSize { cap: other })), Errno::EACCES);
    // Expired.
    let old = ck.mint(h, Rights::READ, now.saturating_sub(5), 1);
    assert_eq!(err_code(send(IoRequest::GetSize { cap: old })), Errno::EKEYEXPIRED);
    // Genuine but not enough rights: a client's read-write token cannot remove objects.
    let opened = c.open_handle(h, Rights::ALL).unwrap();
    drop(opened);
    let rw = ck.mint(h, Rights::READ_WRITE, now + 60, 2);
    assert_eq!(err_code(send(IoRequest::RemoveObject { cap: rw })), Errno::EACCES);
    // A write whose payload does not match its descriptor is refused, not half-applied.
    let desc = proto::Descriptor::list(vec![Extent::new(0, 100)]).unwrap();
    let rw = ck.mint(h, Rights::READ_WRITE, now + 60, 3);
    assert_eq!(err_code(send(IoRequest::Write { cap: rw.clone(), desc: desc.clone() })), Errno::EINVAL);
    let short = proto::encode(&Envelope::new(8, IoRequest::Write { cap: rw, desc })).unwrap();
    let op = ep
        .request(
            peer,
            TAG_IO,
            Bytes::from(short),
            ionet::Payload::Out(vec![9u8; 50].into()),
            ionet::ServiceLevel::Bulk,
        )
        .unwrap();
    let comp = ep.wait(op).unwrap();
    assert_eq!(err_code(proto::decode::<IoReply>(&comp.reply.unwrap()).unwrap().body), Errno::EINVAL);
    // Garbage instead of a message: a typed error, and the connection still works.
    assert_eq!(err_code(call(b"definitely not a stripefs message".to_vec())), Errno::EPROTO);
    assert!(matches!(send(IoRequest::Ping), IoReply::Pong));
    // The file is untouched.
    assert_eq!(&read_all(&f, 0, 10).0, b"top secret");
}

pub fn bad_names_are_refused(scheme: &str) {
    let tc = TestCluster::start(scheme, 1);
    let c = tc.client();
    let root = Handle::ROOT;
    let long = "n".repeat(256);
    for (name, want) in [
        ("..", Errno::EINVAL),
        (".", Errno::EINVAL),
        ("a/b", Errno::EINVAL),
        ("a\0b", Errno::EINVAL),
        ("", Errno::EINVAL),
        (long.as_str(), Errno::ENAMETOOLONG),
    ] {
        assert_eq!(code(c.create_in(root, name, CreateOptions::default())), want, "create {name:?}");
        assert_eq!(code(c.mkdir_in(root, name, 0o755)), want, "mkdir {name:?}");
        assert_eq!(code(c.lookup(root, name)), want, "lookup {name:?}");
        assert_eq!(code(c.symlink_in(root, name, "t")), want, "symlink {name:?}");
    }
    c.mkdir("/ok", 0o755).unwrap();
    assert_eq!(code(c.rename_in(root, "ok", root, "..")), Errno::EINVAL);
    assert_eq!(code(c.rename_in(root, "ok", root, "x/y")), Errno::EINVAL);
    // In a path, `..` is a step back along the walk, not a name: it never leaves the root.
    assert_eq!(code(c.stat("/ok/../etc")), Errno::ENOENT);
    assert_eq!(c.resolve("/ok/../../ok").unwrap(), c.resolve("/ok").unwrap());
    assert_eq!(code(c.create_in(root, &"n".repeat(2000), CreateOptions::default())), Errno::ENAMETOOLONG);
    // The meta server answers garbage with a typed error and keeps serving the connection.
    let key = tc.key();
    let ep =
        ionet::Endpoint::client(stripefs::net::endpoint_config(&key, ionet::WaitMode::Block, false, None))
            .unwrap();
    let meta = ep.connect(&tc.cluster.config().meta).unwrap();
    let op = ep
        .request(
            meta,
            stripefs::net::TAG_META,
            Bytes::from_static(b"\x00garbage"),
            ionet::Payload::None,
            ionet::ServiceLevel::Control,
        )
        .unwrap();
    let reply = ep.wait(op).unwrap().reply.expect("a typed reply");
    match stripefs::proto::decode::<stripefs::proto::MetaReply>(&reply).unwrap().body {
        stripefs::proto::MetaReply::Error(e) => assert_eq!(e.code, Errno::EPROTO),
        r => panic!("expected an error reply, got {r:?}"),
    }
    let ok = "n".repeat(255);
    c.create_in(root, &ok, CreateOptions::default()).unwrap();
    assert_eq!(c.readdir("/").unwrap().len(), 2);
}

pub fn disk_error_does_not_desynchronise_the_connection(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 1, |o| {
        o.io_args = vec!["--max-open".into(), "0".into(), "--map-disk-writes".into()]
    });
    let c = tc.client();
    let bad = c.create("/full", CreateOptions::default()).unwrap();
    let good = c.create("/fine", CreateOptions::default()).unwrap();
    // Swap the object for /dev/full: every write to it fails with ENOSPC.
    let path = stripefs::store::ObjectStore::object_path(&tc.cluster.config().io_data_dir(0), bad.handle());
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/full", &path).unwrap();
    let data = pattern(1 << 20, 6);
    let s0 = io_stats(&c);
    assert_eq!(code(bad.write_at(0, &data)), Errno::ENOSPC);
    // A character device has no fallocate: the mapping server copies instead, and the copy's
    // pwrite meets the full "disk".
    let s1 = io_stats(&c);
    assert_eq!(s1.fallbacks.no_fallocate - s0.fallbacks.no_fallocate, 1);
    assert_eq!((s1.copied.writes - s0.copied.writes, s1.copied.bytes - s0.copied.bytes), (1, 0));
    assert_eq!(s1.mapped, s0.mapped);
    assert_eq!(s1.errors - s0.errors, 1);
    // The same connection carries the next request and its data correctly.
    good.write_at(0, &data).unwrap();
    assert_eq!(read_all(&good, 0, data.len()).0, &data[..]);
    assert_eq!(code(bad.write_at(4096, &data.slice(..100_000))), Errno::ENOSPC);
    good.write_at(7, &data.slice(..100)).unwrap();
    assert_eq!(&read_all(&good, 7, 100).0, &data[..100]);
    let s2 = io_stats(&c);
    assert_eq!(s2.fallbacks.no_fallocate - s1.fallbacks.no_fallocate, 1, "only the /dev/full write");
    assert_eq!((s2.mapped.writes - s1.mapped.writes, s2.mapped.reads - s1.mapped.reads), (2, 2));
}

pub fn expired_capability_is_renewed(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 2, |o| o.meta_args = vec!["--cap-lifetime".into(), "1".into()]);
    let c = tc.client();
    let f = c.create("/short-lived", CreateOptions::default()).unwrap();
    f.write_all_at(0, b"before").unwrap();
    // Capabilities carry whole seconds: after 2 s this one has certainly expired.
    std::thread::sleep(Duration::from_millis(2100));
    f.write_all_at(6, b" and after").unwrap();
    assert_eq!(&read_all(&f, 0, 16).0, b"before and after");
}

pub fn failed_fan_outs_are_cleaned_up(scheme: &str) {
    let mut tc = TestCluster::start_with(scheme, 3, no_objects_ahead);
    let c = tc.client();
    let cfg = tc.cluster.config().clone();
    let on = |i: u32, h| stripefs::store::ObjectStore::object_path(&cfg.io_data_dir(i), h).exists();
    let f = c.create("/doomed", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    f.write_at(0, &pattern(50_000, 7)).unwrap();
    let h = f.handle();
    assert!((0..3).all(|i| on(i, h)));
    tc.cluster.kill_io(1);
    // Unlink succeeds in the namespace; the objects go after its answer, but the one on the
    // dead server is left as an orphan…
    c.unlink("/doomed").unwrap();
    assert_eq!(code(c.stat("/doomed")), Errno::ENOENT);
    let t = std::time::Instant::now();
    while on(0, h) || on(2, h) {
        assert!(t.elapsed() < Duration::from_secs(30), "the live servers' objects never removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(on(1, h), "the dead server's object is still there");
    // …and a create that cannot reach every server fails and leaves nothing behind.
    let e = c.create("/half", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap_err();
    assert!([Errno::ENOTCONN, Errno::EIO, Errno::ETIMEDOUT].contains(&e.errno()), "{e}");
    assert_eq!(code(c.stat("/half")), Errno::ENOENT);
    // Once the server is back, the meta server's janitor removes the orphan.
    tc.cluster.restart_io(1).unwrap();
    let t = std::time::Instant::now();
    while on(1, h) {
        assert!(t.elapsed() < Duration::from_secs(30), "orphan never removed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let g = c.create("/half", CreateOptions { mode: 0o644, layout: spec(3, 4096) }).unwrap();
    g.write_all_at(0, b"whole again").unwrap();
    assert_eq!(&read_all(&g, 0, 11).0, b"whole again");
    let objects = |i: u32| walk(&cfg.io_data_dir(i));
    assert_eq!((0..3).map(objects).sum::<usize>(), 3, "exactly the new file's three objects remain");
}

/// A default client registers a striped request's pieces for one server as one span (the
/// list allocation hint), not one registration per stripe: the pinning cost per piece was most
/// of the client's CPU on softib.
#[test]
fn striped_requests_register_one_span_per_server() {
    let tc = TestCluster::start("softib", 2);
    let c = tc.client();
    let f = c.create("/spans", CreateOptions { mode: 0o644, layout: spec(2, 4096) }).unwrap();
    // Fresh buffers: every registration is a cache miss.
    let registrations = || c.endpoint().info().regcache.expect("softib has a registration cache").misses;
    // 512 KiB in 4 KiB stripes: 64 pieces for each of the 2 servers, 256 KiB each (RDMA).
    let data = pattern(512 << 10, 11);
    let before = registrations();
    f.write_at(0, &data).unwrap();
    let w = registrations() - before;
    let before = registrations();
    let (buf, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    let r = registrations() - before;
    assert_eq!((n, &buf[..]), (data.len(), &data[..]));
    assert!(w <= 2 && r <= 2, "registrations: {w} for the write, {r} for the read (one per server expected)");
}

/// With `cache_foreign`, a read that fails (an io server gone) frees the caller's buffer, so
/// the registrations its segments left in the cache on the live servers' behalf must go first:
/// a cached registration of freed memory would steer a later transfer into stale pages.
#[test]
fn a_failed_read_leaves_no_cached_registration_of_its_buffer() {
    let mut tc = TestCluster::start("softib", 3);
    let opts = stripefs::ClientOptions {
        timeout: Duration::from_secs(10),
        ib: Some(stripefs::client::default_ib_config().cache_foreign(true)),
        ..Default::default()
    };
    let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    let f = c.create("/cached", CreateOptions { mode: 0o644, layout: spec(3, 65536) }).unwrap();
    let data = pattern(3 << 20, 12);
    f.write_at(0, &data).unwrap();
    let entries = || c.endpoint().info().regcache.expect("softib has a registration cache").entries;
    // A read that succeeds keeps its registrations cached: what the option is for.
    let base = entries();
    let (buf, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    assert_eq!((n, &buf[..]), (data.len(), &data[..]));
    assert!(entries() > base, "a successful read's registrations stay cached");
    c.endpoint().invalidate_registrations(&buf);
    drop(buf);
    assert_eq!(entries(), base);
    tc.cluster.kill_io(1);
    assert!(f.read_at(0, BytesMut::zeroed(data.len())).is_err(), "a server is gone");
    assert_eq!(entries(), base, "the failed read's buffer left registrations behind");
}

/// A cluster of `io` servers that copy (`--copy-io`) when `copy`, else map their objects,
/// writes included wherever the test's data directory is.
fn cluster_copying(scheme: &str, io: u32, copy: bool) -> TestCluster {
    TestCluster::start_with(scheme, io, |o| {
        o.io_args = vec![if copy { "--copy-io" } else { "--map-disk-writes" }.into()];
    })
}

/// io servers that stage and pread/pwrite (`--copy-io`) and ones that map their objects (the
/// default) leave the same bytes in the objects, holes included.
pub fn copying_and_mapped_io_servers_agree(scheme: &str) {
    let mut objects = Vec::new();
    for copy in [true, false] {
        let tc = cluster_copying(scheme, 2, copy);
        let c = tc.client();
        let f = c.create("/same", CreateOptions { mode: 0o644, layout: spec(2, 65536) }).unwrap();
        let data = pattern(3 << 20, 11);
        f.write_at(0, &data).unwrap();
        // A hole, then a strided overwrite, then a write past the end.
        f.write_at(5 << 20, &data.slice(..70_000)).unwrap();
        f.set_view(4096, 1000, 3000).unwrap();
        f.write_view(0, &data.slice(..100_000)).unwrap();
        f.clear_view();
        let size = f.size().unwrap();
        assert_eq!(size, (5 << 20) + 70_000);
        let (back, n) = read_all(&f, 0, size as usize);
        assert_eq!(n as u64, size);
        assert!(back[3 << 20..5 << 20].iter().all(|&b| b == 0), "the hole reads as zeros");
        let object =
            |i| stripefs::store::ObjectStore::object_path(&tc.cluster.config().io_data_dir(i), f.handle());
        let on_disk: Vec<Vec<u8>> = (0..2).map(|i| std::fs::read(object(i)).unwrap()).collect();
        objects.push((back, on_disk));
    }
    assert!(objects[0] == objects[1], "both data paths store and return the same bytes");
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

/// The counters of the cluster's only io server.
fn io_stats(c: &stripefs::Client) -> ServerStats {
    let mut all = c.server_stats();
    assert_eq!(all.len(), 1, "a one-server cluster");
    all.remove(0).expect("io server stats")
}

/// Every read and write request is counted by the data path that moved it: the mapped path on
/// a default io server (never the copying one), the copying path on a `--copy-io` server
/// (never the mapped one), and no fallbacks for contiguous, in-order, strided or list I/O.
pub fn io_requests_count_the_data_path_they_took(scheme: &str) {
    for copy in [false, true] {
        let tc = cluster_copying(scheme, 1, copy);
        let c = tc.client();
        let f = c.create("/paths", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
        let data = pattern(1 << 20, 21);
        let s0 = io_stats(&c);
        assert_eq!((s0.mapped, s0.copied, s0.fallbacks), Default::default());
        // One request each: a contiguous write, an in-order list write, a strided write.
        f.write_at(0, &data).unwrap();
        let file = [Extent::new(2 << 20, 5000), Extent::new(3 << 20, 7000)];
        f.write_list(&[Extent::new(0, 12_000)], &file, &data).unwrap();
        f.set_view(4 << 20, 1000, 3000).unwrap();
        f.write_view(0, &data.slice(..100_000)).unwrap();
        f.clear_view();
        let s1 = io_stats(&c);
        let written = (1 << 20) + 12_000 + 100_000;
        assert_eq!((s1.writes, s1.bytes_written), (3, written));
        // Reads: the whole file (holes and all), over tcp in requests of at most the client's
        // read limit, and one list.
        let size = f.size().unwrap();
        let whole =
            if scheme == "tcp" { size.div_ceil(stripefs::client::DEFAULT_READ_REQUEST_BYTES) } else { 1 };
        let (back, n) = read_all(&f, 0, size as usize);
        assert_eq!((n as u64, &back[..data.len()]), (size, &data[..]));
        let got = f.read_list(&[Extent::new(0, 12_000)], &file, BytesMut::zeroed(12_000)).unwrap();
        assert_eq!(&got[..], &data[..12_000]);
        let s2 = io_stats(&c);
        assert_eq!((s2.reads, s2.bytes_read), (whole + 1, size + 12_000));
        let (took, idle) = if copy { (s2.copied, s2.mapped) } else { (s2.mapped, s2.copied) };
        let path = if copy { "copying" } else { "mapped" };
        assert_eq!((took.writes, took.reads), (3, whole + 1), "every request on the {path} path");
        assert_eq!(took.bytes, written + size + 12_000, "{path} path bytes");
        assert_eq!(idle, Default::default(), "nothing on the other path");
        assert_eq!(s2.fallbacks, Default::default(), "no fallbacks");
    }
}

/// Over tcp a read with more for one server than the client's read limit goes as several
/// requests (posted together, the bytes landing in order); over softib it stays one request
/// per server, and a write of the same size is one request per server on both. An explicit
/// read limit splits reads on either transport.
pub fn large_reads_go_as_several_requests_over_tcp_and_writes_as_one(scheme: &str) {
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    // Two servers, 64 KiB stripes: 5 MiB puts 2.5 MiB on each.
    let f = c.create("/split", CreateOptions { mode: 0o644, layout: spec(2, 65536) }).unwrap();
    let data = pattern(5 << 20, 23);
    let count = |c: &stripefs::Client| {
        c.server_stats().into_iter().map(|s| s.unwrap()).fold((0, 0), |a, s| (a.0 + s.writes, a.1 + s.reads))
    };
    let per_server = (5u64 << 20) / 2;
    let s0 = count(&c);
    f.write_at(0, &data).unwrap();
    let s1 = count(&c);
    assert_eq!(s1.0 - s0.0, 2, "one write request per server");
    let (back, n) = read_all(&f, 0, data.len());
    assert_eq!((n, &back[..]), (data.len(), &data[..]));
    let s2 = count(&c);
    let want = if scheme == "tcp" {
        2 * per_server.div_ceil(stripefs::client::DEFAULT_READ_REQUEST_BYTES)
    } else {
        2
    };
    assert_eq!(s2.1 - s1.1, want, "read requests for 2.5 MiB per server");
    if scheme == "tcp" {
        assert!(want > 2, "the default limit splits this read");
    }
    // A limit of 512 KiB: five requests per server, the same bytes.
    let opts = stripefs::ClientOptions {
        timeout: Duration::from_secs(10),
        read_request_bytes: Some(512 << 10),
        ..Default::default()
    };
    let c2 = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    let f2 = c2.open("/split", Rights::READ).unwrap();
    let (back, _) = read_all(&f2, 0, data.len());
    assert_eq!(&back[..], &data[..]);
    assert_eq!(count(&c).1 - s2.1, 2 * per_server.div_ceil(512 << 10), "read requests of 512 KiB");
}

/// A mapping io server copies what it cannot map, and counts why: a list write whose pieces
/// run backwards, and an object past the 1 TiB mapping limit (both ways). Each fallback is one
/// request's: the next plain request is mapped again.
pub fn mapping_io_servers_count_their_fallbacks(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 1, |o| o.io_args = vec!["--map-disk-writes".into()]);
    let c = tc.client();
    let f = c.create("/backwards", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
    let data = pattern(200_000, 22);
    // Out of order: the stream fills 300 KiB.. first, then 100 KiB...
    let file = [Extent::new(300 << 10, 100_000), Extent::new(100 << 10, 100_000)];
    let mem = [Extent::new(0, 200_000)];
    let s0 = io_stats(&c);
    f.write_list(&mem, &file, &data).unwrap();
    let s1 = io_stats(&c);
    assert_eq!(s1.fallbacks.unordered - s0.fallbacks.unordered, 1);
    assert_eq!((s1.copied.writes - s0.copied.writes, s1.copied.bytes - s0.copied.bytes), (1, 200_000));
    assert_eq!(s1.mapped.writes, s0.mapped.writes);
    // Reads need no order: the same list comes back through the mapping.
    let back = f.read_list(&mem, &file, BytesMut::zeroed(200_000)).unwrap();
    assert_eq!(&back[..], &data[..]);
    assert_eq!(read_all(&f, 300 << 10, 100_000).0, &data[..100_000]);
    let s2 = io_stats(&c);
    assert_eq!(s2.mapped.reads - s1.mapped.reads, 2);
    assert_eq!((s2.copied, s2.fallbacks), (s1.copied, s1.fallbacks));
    // Past the mapping limit (the whole stripe on one server: local offset = file offset).
    let far = c.create("/far", CreateOptions { mode: 0o644, layout: spec(1, 65536) }).unwrap();
    let at = 2 * stripefs::store::MAX_MAPPED;
    far.write_at(at, &data.slice(..5000)).unwrap();
    assert_eq!(read_all(&far, at, 5000).0, &data[..5000]);
    let s3 = io_stats(&c);
    assert_eq!(s3.fallbacks.beyond_map - s2.fallbacks.beyond_map, 2, "the write and the read");
    assert_eq!((s3.copied.writes - s2.copied.writes, s3.copied.reads - s2.copied.reads), (1, 1));
    assert_eq!(s3.mapped, s2.mapped);
    // An ordinary request after them takes the mapped path again.
    f.write_at(0, &data.slice(..4096)).unwrap();
    let s4 = io_stats(&c);
    assert_eq!(s4.mapped.writes - s3.mapped.writes, 1);
    assert_eq!((s4.copied, s4.fallbacks), (s3.copied, s3.fallbacks));
}

pub fn a_clients_adaptive_waits_poll_for_its_transports_budget(scheme: &str) {
    let tc = TestCluster::start(scheme, 1);
    let c = tc.client();
    let want = if scheme == "tcp" {
        ionet::Config::default().get_spin_budget()
    } else {
        stripefs::client::DEFAULT_RDMA_SPIN_BUDGET
    };
    assert_eq!(c.endpoint().config().get_spin_budget(), want);
    let opts =
        stripefs::ClientOptions { spin_budget: Some(Duration::from_micros(700)), ..Default::default() };
    let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    assert_eq!(c.endpoint().config().get_spin_budget(), Duration::from_micros(700));
    // A client's connections ask for the congestion control its options name: by default the
    // environment's, else reno; `None` keeps the kernel's. It only matters over tcp, but the
    // setting is the endpoint's.
    let want = stripefs::net::tcp_congestion();
    if std::env::var_os(stripefs::net::TCP_CONGESTION_ENV).is_none() {
        assert_eq!(want.as_deref(), Some(stripefs::net::DEFAULT_TCP_CONGESTION));
    }
    assert_eq!(c.endpoint().config().get_tcp_congestion(), want.as_deref());
    for cc in [None, Some("cubic".to_string())] {
        let opts = stripefs::ClientOptions { tcp_congestion: cc.clone(), ..Default::default() };
        let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
        assert_eq!(c.endpoint().config().get_tcp_congestion(), cc.as_deref());
    }
}

/// io servers send reads' data, so their connections take the same congestion control as the
/// clients': reno by default, `STRIPEFS_TCP_CONGESTION` when set. Checked on the sockets
/// themselves with `ss`, the server side of each connection to the io server's port.
#[test]
fn io_servers_use_the_configured_congestion_control() {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control");
    if std::process::Command::new("ss").arg("-V").output().is_err()
        || !available.is_ok_and(|a| a.split_whitespace().any(|c| c == "cubic"))
    {
        eprintln!("skipped: needs ss and the cubic congestion control");
        return;
    }
    let server_side = |tc: &TestCluster| -> String {
        let c = tc.client();
        let f = c.create("/f", CreateOptions::default()).unwrap();
        f.write_at(0, &pattern(1 << 20, 1)).unwrap();
        let port = tc.cluster.config().io_servers[0].to_string().rsplit(':').next().unwrap().to_string();
        let out = std::process::Command::new("ss")
            .args(["-tinH", "state", "established", &format!("( sport = :{port} )")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cubic = TestCluster::start_with("tcp", 1, |o| {
        o.io_env.push((stripefs::net::TCP_CONGESTION_ENV.into(), "cubic".into()))
    });
    let ss = server_side(&cubic);
    assert!(ss.contains("cubic") && !ss.contains("bbr") && !ss.contains("reno"), "{ss}");
    if std::env::var_os(stripefs::net::TCP_CONGESTION_ENV).is_none() {
        let ss = server_side(&TestCluster::start("tcp", 1));
        assert!(ss.contains(" reno ") || ss.trim_start().starts_with("reno"), "{ss}");
        assert!(!ss.contains("bbr") && !ss.contains("cubic"), "{ss}");
    }
}

/// `disk_space` adds up the file systems the io servers keep their objects on, each once: here
/// all four share the test's, so the sum is its size, not four times it.
#[test]
fn disk_space_adds_up_the_io_servers_file_systems() {
    let tc = TestCluster::start("tcp", 4);
    let c = tc.client();
    let fs = nix::sys::statvfs::statvfs(tc.dir.path()).unwrap();
    let size = fs.blocks() * fs.fragment_size();
    for s in c.server_stats() {
        let d = s.unwrap().disk;
        assert_eq!(d.total, size, "each server reports its data directory's file system");
        assert!(0 < d.avail && d.avail <= d.free && d.free <= d.total, "{d:?}");
    }
    let sum = c.disk_space().unwrap().space;
    assert_eq!(sum.total, size, "one file system under four servers");
    assert!(sum.avail <= sum.free && sum.free <= sum.total, "{sum:?}");
}

/// Objects under an io server's data directory `dir` (every file but the server's lock).
fn walk(dir: &std::path::Path) -> usize {
    files(dir) - usize::from(dir.join("lock").exists())
}

fn files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| if e.path().is_dir() { files(&e.path()) } else { 1 }).sum())
        .unwrap_or(0)
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            const S: &str = stringify!($scheme);
            #[test] fn namespace_and_data() { super::namespace_and_data(S) }
            #[test] fn sparse_files_and_holes() { super::sparse_files_and_holes(S) }
            #[test] fn symbolic_links() { super::symbolic_links(S) }
            #[test] fn a_writers_sync_records_the_modification_time() { super::a_writers_sync_records_the_modification_time(S) }
            #[test] fn read_into_shows_no_earlier_bytes() { super::read_into_shows_no_earlier_bytes(S) }
            #[test] fn a_read_from_every_server_needs_no_size_round() { super::a_read_from_every_server_needs_no_size_round(S) }
            #[test] fn a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once() { super::a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once(S) }
            #[test] fn a_listings_stats_take_one_request_per_server_a_batch() { super::a_listings_stats_take_one_request_per_server_a_batch(S) }
            #[test] fn list_io_matches_contiguous() { super::list_io_matches_contiguous(S) }
            #[test] fn eight_clients_interleaved_strided() { super::eight_clients_interleaved_strided(S) }
            #[test] fn io_server_killed_mid_write_is_an_error() { super::io_server_killed_mid_write_is_an_error(S) }
            #[test] fn restart_serves_synced_files_and_namespace() { super::restart_serves_synced_files_and_namespace(S) }
            #[test] fn forged_and_expired_capabilities_are_refused() { super::forged_and_expired_capabilities_are_refused(S) }
            #[test] fn bad_names_are_refused() { super::bad_names_are_refused(S) }
            #[test] fn disk_error_does_not_desynchronise_the_connection() { super::disk_error_does_not_desynchronise_the_connection(S) }
            #[test] fn expired_capability_is_renewed() { super::expired_capability_is_renewed(S) }
            #[test] fn failed_fan_outs_are_cleaned_up() { super::failed_fan_outs_are_cleaned_up(S) }
            #[test] fn copying_and_mapped_io_servers_agree() { super::copying_and_mapped_io_servers_agree(S) }
            #[test] fn overlapping_writers_each_win_whole_units() { super::overlapping_writers_each_win_whole_units(S) }
            #[test] fn a_writer_is_not_starved_by_readers_of_the_same_bytes() { super::a_writer_is_not_starved_by_readers_of_the_same_bytes(S) }
            #[test] fn io_requests_count_the_data_path_they_took() { super::io_requests_count_the_data_path_they_took(S) }
            #[test] fn mapping_io_servers_count_their_fallbacks() { super::mapping_io_servers_count_their_fallbacks(S) }
            #[test] fn large_reads_go_as_several_requests_over_tcp_and_writes_as_one() { super::large_reads_go_as_several_requests_over_tcp_and_writes_as_one(S) }
            #[test] fn a_clients_adaptive_waits_poll_for_its_transports_budget() { super::a_clients_adaptive_waits_poll_for_its_transports_budget(S) }
        }
    )*};
}

// Every test runs on each transport.
transports!(tcp, softib);

/// A default io server maps writes into memory (tmpfs) and copies them to a disk, and writes
/// behind on a disk only: once 8 MiB of an object landed it has started their writeback, and
/// with `--write-behind 0` it never does. Reads are mapped everywhere.
#[test]
fn writes_are_mapped_into_memory_copied_to_disks_and_written_behind() {
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let memory = tempfile::tempdir_in("/dev/shm").unwrap();
    for (dir, args) in [(&disk, vec![]), (&disk, vec!["--write-behind", "0"]), (&memory, vec![])] {
        let in_memory = stripefs::store::FileSystem::of(dir.path()).unwrap().in_memory();
        let mut o = common::options("tcp", 1, &dir.path().join(format!("c{}", args.len())));
        o.io_args = args.iter().map(|a| a.to_string()).collect();
        let tc = stripefs::cluster::LocalCluster::start(o).expect("cluster starts");
        let opts = stripefs::ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
        let c = stripefs::Client::connect_with(tc.config(), opts).unwrap();
        let f = c.create("/f", CreateOptions { mode: 0o644, layout: spec(1, 1 << 20) }).unwrap();
        let data = pattern(24 << 20, 31);
        for (i, chunk) in data.chunks(4 << 20).enumerate() {
            f.write_at((i as u64) << 22, &data.slice_ref(chunk)).unwrap();
        }
        assert_eq!(read_all(&f, 0, data.len()).0, &data[..]);
        let s = io_stats(&c);
        let what = format!("{} with {args:?}: {s:?}", if in_memory { "memory" } else { "disk" });
        let (mapped, copied) = if in_memory { (6, 0) } else { (0, 6) };
        assert_eq!((s.mapped.writes, s.copied.writes), (mapped, copied), "{what}");
        assert_eq!(s.copied.reads, 0, "{what}");
        if in_memory || !args.is_empty() {
            assert_eq!(s.written_behind, 0, "{what}");
        } else {
            // Whole 8 MiB batches of the 24 MiB; the last may still be gathering.
            assert!(s.written_behind >= 16 << 20 && s.written_behind.is_multiple_of(8 << 20), "{what}");
        }
    }
}

/// The POSIX rules over the wire: each client's credentials reach the meta server, hard links
/// share one file until the last name goes (then its objects do), special files are records,
/// and `stat` needs no permission on the file (its size through a capability without rights).
#[test]
fn permissions_links_and_special_files_over_the_wire() {
    use stripefs::proto::{Cred, SetTime};
    let tc = TestCluster::start_with("tcp", 2, no_objects_ahead);
    let base = tc.client();
    let root = base.as_caller(Cred::root());
    let alice = base.as_caller(Cred::new(1000, 1000, vec![]));
    let bob = base.as_caller(Cred::new(1001, 1001, vec![]));
    assert_eq!(code(alice.mkdir("/a", 0o755)), Errno::EACCES, "the root is root's, 0755");
    root.mkdir("/shared", 0o1777).unwrap();
    let f = alice.create("/shared/f", CreateOptions { mode: 0o600, layout: spec(2, 4096) }).unwrap();
    f.write_all_at(0, &pattern(10_000, 4)).unwrap();
    assert_eq!((f.attr().uid, f.attr().gid), (1000, 1000));
    // Hard links: one file, two names, the data through either.
    assert_eq!(alice.link("/shared/f", "/shared/g").unwrap(), 2);
    assert_eq!(read_all(&alice.open("/shared/g", Rights::READ).unwrap(), 0, 10_000).0, pattern(10_000, 4));
    assert_eq!(code(alice.link("/shared", "/shared/d")), Errno::EPERM);
    // Bob: no read permission, but stat (with the size from the io servers) works; the sticky
    // directory keeps him from removing her names; times only to now, and only with write
    // permission.
    assert_eq!(code(bob.open("/shared/f", Rights::READ)), Errno::EACCES);
    assert_eq!(bob.stat("/shared/g").unwrap().attr.size, 10_000);
    assert_eq!(code(bob.unlink("/shared/f")), Errno::EPERM);
    assert_eq!(code(bob.rename("/shared/f", "/shared/x")), Errno::EPERM);
    let now = SetAttr { mtime: Some(SetTime::Now), ..Default::default() };
    assert_eq!(code(bob.setattr(f.handle(), now.clone())), Errno::EACCES);
    alice.setattr(f.handle(), SetAttr { mode: Some(0o666), ..Default::default() }).unwrap();
    bob.setattr(f.handle(), now).unwrap();
    let given = SetAttr { mtime: Some(SetTime::At(Timestamp { secs: 1, nsecs: 0 })), ..Default::default() };
    assert_eq!(code(bob.setattr(f.handle(), given)), Errno::EPERM);
    assert_eq!(
        code(bob.setattr(f.handle(), SetAttr { uid: Some(1001), ..Default::default() })),
        Errno::EPERM
    );
    // Created read-only and written at once: the descriptor's writes and truncates are its own.
    let ro = alice.create("/shared/ro", CreateOptions { mode: 0o444, layout: None }).unwrap();
    ro.write_all_at(0, b"written").unwrap();
    ro.truncate(3).unwrap();
    ro.sync().unwrap();
    let (back, n) = read_all(&ro, 0, 10);
    assert_eq!(&back[..n], b"wri");
    assert_eq!(code(alice.truncate("/shared/ro", 0)), Errno::EACCES, "by name it needs write permission");
    alice.unlink("/shared/ro").unwrap();
    // Special files: records with their kind and device number, not opened as files.
    let (p, a) =
        alice.mknod_in(alice.resolve("/shared").unwrap(), "p", FileKind::CharDev(0x0103), 0o600).unwrap();
    assert_eq!((a.kind, a.mode, a.uid), (FileKind::CharDev(0x0103), 0o600, 1000));
    assert_eq!(code(alice.open_handle(p, Rights::READ)), Errno::EINVAL);
    assert_eq!(bob.lstat("/shared/p").unwrap().attr.kind.rdev(), 0x0103);
    // One name gone, the other keeps the data; the last gone, the objects go too.
    let objects = || walk(tc.dir.path());
    let with_file = objects();
    alice.unlink("/shared/f").unwrap();
    assert_eq!(alice.stat("/shared/g").unwrap().attr.nlink, 1);
    assert_eq!(read_all(&alice.open("/shared/g", Rights::READ).unwrap(), 0, 10_000).0, pattern(10_000, 4));
    assert_eq!(objects(), with_file);
    alice.unlink("/shared/g").unwrap();
    alice.unlink("/shared/p").unwrap();
    // Removed right after the answer.
    let t = std::time::Instant::now();
    while objects() > with_file - 2 {
        assert!(t.elapsed() < Duration::from_secs(30), "the last name's objects never removed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(objects(), with_file - 2, "its two objects are removed with the last name");
    assert_eq!(root.statfs().unwrap().files, 0);
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

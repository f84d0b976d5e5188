//! Names, links, special files, permissions and capabilities over the wire.

use super::*;

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

//! stripefs security properties not covered in `e2e/namespace.rs` (which has forged, expired and
//! under-privileged capabilities and bad names): the cluster key file is private, a local
//! cluster listens on loopback only, a capability is bound to its handle and to the rights the
//! file was opened with, and a client without the key gets nothing from any server.

mod common;

use bytes::{Bytes, BytesMut};
use common::{TestCluster, pattern};
use std::os::unix::fs::PermissionsExt;
use stripefs::capability::{CapabilityKey, Rights, unix_now};
use stripefs::net::{TAG_IO, TAG_META, endpoint_config};
use stripefs::proto::{self, Cred, Envelope, IoReply, IoRequest, MetaCall, MetaReply, MetaRequest};
use stripefs::{CreateOptions, Errno};

/// The generated cluster key is readable by its owner only (it admits anyone who reads it).
#[test]
fn cluster_key_file_is_owner_only() {
    let tc = TestCluster::start("tcp", 1);
    let key_file = tc.dir.path().join("cluster.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "cluster.key is mode {mode:o}: group or others can read it");
}

/// `stripefs serve` from a cluster file with an inline key writes the key for its servers
/// owner-only too, also over an existing world-readable file.
#[test]
fn serve_from_a_cluster_file_writes_the_key_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let key_file = data.join("cluster.key");
    std::fs::write(&key_file, "stale").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        format!(
            "transport = \"tcp\"\nmeta = \"tcp://127.0.0.1:0\"\nio_servers = [\"127.0.0.1:0\"]\n\
             data_dir = \"{}\"\ncluster_key = \"00112233445566778899aabbccddeeff\"\n",
            data.display()
        ),
    )
    .unwrap();
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(&cluster)
        .arg("serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&key_file).is_ok_and(|s| s == "stale") {
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "serve never wrote the key");
        assert!(serve.try_wait().unwrap().is_none(), "serve exited");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    serve.kill().unwrap();
    serve.wait().unwrap();
    assert_eq!(mode & 0o077, 0, "serve left the key mode {mode:o}");
}

/// A local cluster started with defaults listens on loopback only: being on the network is
/// something to ask for (`--listen`), not a default.
#[test]
fn local_cluster_listens_on_loopback_by_default() {
    let tc = TestCluster::start("tcp", 2);
    let cfg = tc.cluster.config();
    for a in std::iter::once(&cfg.meta).chain(&cfg.io_servers) {
        for sa in a.resolve().unwrap() {
            assert!(sa.ip().is_loopback(), "{a} is not a loopback address");
        }
    }
}

fn io_call(ep: &ionet::Endpoint, peer: ionet::PeerId, req: IoRequest) -> IoReply {
    let header = proto::encode(&Envelope::new(9, req)).unwrap();
    let op = ep
        .request(peer, TAG_IO, Bytes::from(header), ionet::Payload::None, ionet::ServiceLevel::Control)
        .unwrap();
    let c = ep.wait(op).unwrap();
    proto::decode::<IoReply>(&c.reply.expect("a reply")).unwrap().body
}

fn code(r: IoReply) -> Errno {
    match r {
        IoReply::Error(e) => e.code,
        r => panic!("expected an error reply, got {r:?}"),
    }
}

/// A capability names one handle and the rights the file was opened with: a genuine token
/// re-pointed at another file is refused, and a file opened read-only cannot be written.
fn capabilities_are_bound_to_handle_and_rights(scheme: &str) {
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    let mine = c.create("/mine", CreateOptions::default()).unwrap();
    let theirs = c.create("/theirs", CreateOptions::default()).unwrap();
    theirs.write_all_at(0, b"their data").unwrap();
    let key = CapabilityKey::new(&tc.key()).unwrap();
    let ep =
        ionet::Endpoint::client(endpoint_config(&tc.key(), ionet::WaitMode::Block, false, None)).unwrap();
    let peer = ep.connect(&tc.cluster.config().io_servers[0]).unwrap();
    let good = key.mint(mine.handle(), Rights::READ, unix_now() + 60, 1);
    assert!(matches!(io_call(&ep, peer, IoRequest::GetSize { cap: good.clone() }), IoReply::Size(_)));
    // The same genuine token with the other file's handle: the MAC covers the handle.
    let mut moved = good;
    moved.handle = theirs.handle();
    assert_eq!(code(io_call(&ep, peer, IoRequest::GetSize { cap: moved })), Errno::EACCES);
    // Opened for reading: the client refuses to write through it, and the token the meta
    // server handed out for it does not let a raw request write either.
    let ro = c.open("/theirs", Rights::READ).unwrap();
    let e = ro.write_at(0, &Bytes::from_static(b"overwrite")).unwrap_err();
    assert_eq!(e.errno(), Errno::EBADF, "{e}");
    let meta = ep.connect(&tc.cluster.config().meta).unwrap();
    let open = proto::encode(&Envelope::new(
        10,
        MetaCall {
            cred: c.cred().clone(),
            req: MetaRequest::Open { handle: theirs.handle(), rights: Rights::READ },
        },
    ))
    .unwrap();
    let op = ep
        .request(meta, TAG_META, Bytes::from(open), ionet::Payload::None, ionet::ServiceLevel::Control)
        .unwrap();
    let reply = ep.wait(op).unwrap().reply.expect("a reply");
    let MetaReply::Opened { cap, .. } = proto::decode::<MetaReply>(&reply).unwrap().body else {
        panic!("open failed")
    };
    assert_eq!(cap.rights, Rights::READ, "more rights than asked for");
    let peer = ep.connect(&tc.cluster.config().io_servers[0]).unwrap();
    // It may sync (as Linux lets a reader fsync), which changes nothing it could not read.
    assert!(matches!(io_call(&ep, peer, IoRequest::Sync { cap: cap.clone() }), IoReply::Done));
    assert_eq!(code(io_call(&ep, peer, IoRequest::TruncateObject { cap, size: 0 })), Errno::EACCES);
    let (b, n) = theirs.read_at(0, BytesMut::zeroed(10)).unwrap();
    assert_eq!(&b[..n], b"their data");
    // A batch of sizes checks each capability: a re-pointed one gets no size, the rest theirs
    // (from the server holding the file's first bytes).
    let first = theirs.layout().server(0, 2) as usize;
    let peer = ep.connect(&tc.cluster.config().io_servers[first]).unwrap();
    let good = key.mint(theirs.handle(), Rights::NONE, unix_now() + 60, 2);
    let mut moved = key.mint(mine.handle(), Rights::NONE, unix_now() + 60, 3);
    moved.handle = theirs.handle();
    let caps = proto::BoundedVec::new(vec![good.clone(), moved, good]).unwrap();
    let IoReply::Sizes(sizes) = io_call(&ep, peer, IoRequest::GetSizes { caps }) else { panic!("no sizes") };
    let sizes: Vec<Option<u64>> = sizes.iter().map(|s| s.map(|s| s.size)).collect();
    assert_eq!(sizes, [Some(10), None, Some(10)]);
    // A batch of creates needs `ADMIN` in every capability: one without refuses it all.
    let free = |n| proto::Handle(theirs.handle().0 + (1 << 30) + n);
    let admin = |n| key.mint(free(n), Rights::ADMIN, unix_now() + 60, 10 + n);
    let weak = key.mint(free(1), Rights::READ_WRITE, unix_now() + 60, 20);
    let data_dir = tc.cluster.config().io_data_dir(first as u32);
    let made = |n| stripefs::store::ObjectStore::object_path(&data_dir, free(n)).exists();
    let caps = proto::BoundedVec::new(vec![admin(0), weak, admin(2)]).unwrap();
    assert_eq!(code(io_call(&ep, peer, IoRequest::CreateObjects { caps })), Errno::EACCES);
    assert!(!made(0) && !made(1) && !made(2), "a refused batch made objects");
    let caps = proto::BoundedVec::new(vec![admin(0), admin(1)]).unwrap();
    assert!(matches!(io_call(&ep, peer, IoRequest::CreateObjects { caps }), IoReply::Done));
    assert!(made(0) && made(1));
}

/// A client that does not hold the cluster key gets no answer from the meta server or an io
/// server: its requests fail with an authentication error and the data is untouched.
fn no_key_no_service(scheme: &str) {
    let tc = TestCluster::start(scheme, 1);
    let c = tc.client();
    let f = c.create("/guarded", CreateOptions::default()).unwrap();
    let data = pattern(10_000, 3);
    f.write_at(0, &data).unwrap();
    let wrong = ionet::Endpoint::client(endpoint_config(
        b"not-the-cluster-key-at-all!",
        ionet::WaitMode::Block,
        false,
        None,
    ))
    .unwrap();
    let cfg = tc.cluster.config();
    for (addr, tag, header) in [
        (
            &cfg.meta,
            TAG_META,
            proto::encode(&Envelope::new(1, MetaCall { cred: Cred::root(), req: MetaRequest::Statfs }))
                .unwrap(),
        ),
        (&cfg.io_servers[0], TAG_IO, proto::encode(&Envelope::new(2, IoRequest::Ping)).unwrap()),
    ] {
        let peer = wrong.connect(addr).unwrap();
        let op = wrong
            .request(peer, tag, Bytes::from(header), ionet::Payload::None, ionet::ServiceLevel::Control)
            .unwrap();
        let done = wrong.wait(op).unwrap();
        assert!(matches!(done.result, Err(ionet::Error::Auth(_))), "{addr}: {:?}", done.result);
        assert!(done.reply.is_none(), "{addr} answered a client without the key");
    }
    let (b, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    assert!(n == data.len() && b[..] == data[..]);
}

/// Idle sockets that never send a byte, 200 at every server, each replaced as soon as the
/// server drops it, do not lock users out: `ls`, `cp` in and out, and `stat` all work while
/// they are held.
fn idle_sockets_do_not_lock_users_out(scheme: &str) {
    use std::io::{ErrorKind, Read};
    use std::net::TcpStream;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let tc = TestCluster::start(scheme, 2);
    let cfg = tc.cluster.config().clone();
    let cl = tc.cluster.config_path().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let floods: Vec<_> = std::iter::once(&cfg.meta)
        .chain(&cfg.io_servers)
        .map(|addr| {
            let sa = addr.resolve().unwrap()[0];
            let stop = stop.clone();
            std::thread::spawn(move || {
                let open = || {
                    let s = TcpStream::connect(sa).ok()?;
                    s.set_nonblocking(true).ok()?;
                    Some(s)
                };
                let mut socks: Vec<TcpStream> = (0..200).filter_map(|_| open()).collect();
                assert_eq!(socks.len(), 200, "{sa} refused idle connections");
                let mut b = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    for s in socks.iter_mut() {
                        if !matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock)
                            && let Some(fresh) = open()
                        {
                            *s = fresh;
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })
        })
        .collect();
    // Long enough for the servers to take the silent sockets in (they are handed over once
    // the kernel gives up waiting for their first bytes) and shed them for newer ones.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let sfs = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .arg("--cluster")
            .arg(&cl)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "stripefs {args:?} failed under the flood: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(300_000, 7)).unwrap();
    for i in 0..5 {
        let name = format!("sfs:/f{i}");
        sfs(&["cp", src.to_str().unwrap(), &name]);
        assert!(sfs(&["ls", "sfs:/"]).contains(&format!("f{i}")));
        assert!(sfs(&["stat", "--bytes", &name]).contains("size: 300000"));
        let back = tc.dir.path().join("out.bin");
        sfs(&["cp", &name, back.to_str().unwrap()]);
        assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&src).unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    for f in floods {
        f.join().unwrap();
    }
}

/// A server that closes connections during the handshake (as one does that sheds them) gives
/// the user an error naming the server by role and address and saying where it failed.
fn a_refused_handshake_names_the_server(scheme: &str) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fake = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            // Take the hello, then hang up without an answer.
            let mut b = [0u8; 86];
            let _ = s.read_exact(&mut b);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = stripefs::config::ClusterConfig::parse(&format!(
        "transport = \"{scheme}\"\nmeta = \"{scheme}://{fake}\"\nio_servers = [\"{scheme}://{fake}\"]\ncluster_key = \"{}\"\n",
        "ab".repeat(32)
    ))
    .unwrap();
    cfg.data_dir = Some(dir.path().to_owned());
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, cfg.to_toml()).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .arg("--cluster")
        .arg(&file)
        .args(["ls", "sfs:/"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("meta server ({scheme}://{fake})")), "{err}");
    assert!(err.contains("during the handshake"), "{err}");
    assert!(!err.contains("PeerId"), "{err}");
}

macro_rules! transports {
    ($($scheme:ident),*) => {$(
        mod $scheme {
            #[test] fn capabilities_are_bound_to_handle_and_rights() { super::capabilities_are_bound_to_handle_and_rights(stringify!($scheme)) }
            #[test] fn no_key_no_service() { super::no_key_no_service(stringify!($scheme)) }
            #[test] fn idle_sockets_do_not_lock_users_out() { super::idle_sockets_do_not_lock_users_out(stringify!($scheme)) }
            #[test] fn a_refused_handshake_names_the_server() { super::a_refused_handshake_names_the_server(stringify!($scheme)) }
        }
    )*};
}

transports!(tcp, softib);

/// Every directory and file under `root` (not following links), with its permission bits.
fn modes_under(root: &std::path::Path) -> Vec<(std::path::PathBuf, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.push((p, m.permissions().mode() & 0o7777));
        }
    }
    out
}

/// Under the usual umask (022) everything the servers and the launcher create — data
/// directories, object files, the meta database, the cluster file and key — is private to the
/// user that runs them: a file's bytes are in an io server's object, the namespace in the
/// meta database.
#[test]
fn data_directories_and_files_are_private_under_umask_022() {
    // Process-wide, inherited by the servers this test starts; 022 is what most systems give.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let tc = TestCluster::start_with("tcp", 2, |o| o.data_dir = o.data_dir.join("data"));
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let f = c.create("/d/secret", CreateOptions::default()).unwrap();
    f.write_all_at(0, &pattern(200_000, 9)).unwrap();
    f.sync().unwrap();
    let data = tc.dir.path().join("data");
    let mut all = vec![(data.clone(), std::fs::metadata(&data).unwrap().permissions().mode() & 0o7777)];
    all.extend(modes_under(&data));
    let objects =
        all.iter().filter(|(p, _)| p.starts_with(data.join("io0")) || p.starts_with(data.join("io1")));
    assert!(objects.count() >= 3, "no object files found: {all:?}");
    assert!(all.iter().any(|(p, _)| p.ends_with("meta.redb")), "{all:?}");
    assert!(all.iter().any(|(p, _)| p.ends_with("cluster.toml")), "{all:?}");
    let open: Vec<String> =
        all.iter().filter(|(_, m)| m & 0o077 != 0).map(|(p, m)| format!("{} {m:o}", p.display())).collect();
    assert!(open.is_empty(), "readable by group or others: {open:?}");
}

/// A key file that group or others can read is tightened to owner-only when stripefs reads
/// it, with a warning naming the file and its old mode (the key may have leaked); one they
/// can write (anyone could have replaced the key) is refused and left as it is.
#[test]
fn a_loose_key_file_is_tightened_and_a_writable_one_refused() {
    let tc = TestCluster::start("tcp", 1);
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("loose.key");
    let cluster = tc.copy_cluster_file(dir.path(), "loose.key");
    let ls = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"))
            .arg("--cluster")
            .arg(&cluster)
            .args(["ls", "sfs:/"])
            .output()
            .unwrap()
    };
    let mode = || std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o7777;

    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = ls();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(mode(), 0o600, "the key file was left readable by others");
    assert!(err.contains(&key_file.display().to_string()) && err.contains("644"), "no warning: {err}");

    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = ls();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a world-writable key file was used: {err}");
    assert!(err.contains(&key_file.display().to_string()) && err.contains("write"), "{err}");
    assert_eq!(mode(), 0o666);
}

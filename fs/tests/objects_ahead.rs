//! Files' objects made ahead of their creates: a create that takes one asks no io server, its
//! file works on every server, and what was made ahead for a meta server that stopped is
//! removed once it is back.

mod common;

use common::{TestCluster, pattern, requests_during};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stripefs::CreateOptions;
use stripefs::proto::LayoutSpec;
use stripefs::store::ObjectStore;

/// Every file under `root` (the objects, and an io server's lock file).
fn files_under(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p);
            }
        }
    }
    out
}

#[test]
fn a_create_asks_no_io_server_once_objects_are_made_ahead() {
    let tc = TestCluster::start("tcp", 4);
    let cfg = tc.cluster.config().clone();
    let c = tc.client();
    // The meta server makes the first batch as it starts; until it has, creates make their own.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (i, f) = (0..)
        .find_map(|i| {
            let ((meta, io), f) =
                requests_during(&c, || c.create(&format!("/f{i}"), CreateOptions::default()).unwrap());
            assert_eq!(meta, 1, "one meta request per create");
            assert!(Instant::now() < deadline, "every create asked the io servers ({io} requests each)");
            if io == 0 {
                return Some((i, f));
            }
            std::thread::sleep(Duration::from_millis(20));
            None
        })
        .unwrap();
    // Its objects exist on every server, and the file is written and read across all of them.
    assert_eq!(f.layout().pcount, 4);
    for i in 0..4 {
        let object = ObjectStore::object_path(&cfg.io_data_dir(i), f.handle());
        assert!(object.exists(), "no object on io server {i}: {}", object.display());
    }
    let data = pattern(4 * 65536 + 100, 9);
    f.write_all_at(0, &data).unwrap();
    f.sync().unwrap();
    let g = c.open(&format!("/f{i}"), stripefs::capability::Rights::READ).unwrap();
    let (back, n) = g.read_at(0, bytes::BytesMut::zeroed(data.len())).unwrap();
    assert_eq!((n, &back[..n]), (data.len(), &data[..]));
}

/// A dead io server is soon known down, and creates no longer take objects made ahead on it:
/// long before a batch is used up, a file striped over every server by default goes over the
/// live one, and a create that needs the dead one fails naming it.
#[test]
fn creates_stop_taking_objects_made_ahead_once_a_server_is_dead() {
    let mut tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        let ((_, io), _) =
            requests_during(&c, || c.create(&format!("/f{i}"), CreateOptions::default()).unwrap());
        if io == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no objects made ahead");
        std::thread::sleep(Duration::from_millis(20));
    }
    tc.cluster.kill_io(1);
    let dead = tc.cluster.config().io_servers[1].to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut took = 0;
    loop {
        let f = c.create(&format!("/g{took}"), CreateOptions::default()).unwrap();
        if (f.layout().base, f.layout().pcount) == (0, 1) {
            break;
        }
        took += 1;
        assert!(Instant::now() < deadline, "creates never left the dead server out");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(took < 40, "{took} creates took objects made ahead on a dead server");
    let both = LayoutSpec { pcount: Some(2), ..Default::default() };
    let e = c.create("/both", CreateOptions { mode: 0o644, layout: Some(both) }).unwrap_err();
    assert!(e.to_string().contains(&format!("io server 1 ({dead})")), "{e}");
}

#[test]
fn objects_made_ahead_for_a_stopped_meta_server_are_removed_when_it_is_back() {
    let mut tc = TestCluster::start("tcp", 2);
    let cfg = tc.cluster.config().clone();
    let c = tc.client();
    let f = c.create("/kept", CreateOptions::default()).unwrap();
    f.write_all_at(0, b"kept").unwrap();
    f.sync().unwrap();
    let kept: Vec<PathBuf> =
        (0..2).map(|i| ObjectStore::object_path(&cfg.io_data_dir(i), f.handle())).collect();
    // Wait for a batch made ahead on both servers: objects no file owns.
    let ahead = |i: u32| -> BTreeSet<PathBuf> {
        let mut objects = files_under(&cfg.io_data_dir(i));
        objects.retain(|p| !kept.contains(p) && p.file_name().is_some_and(|n| n != "lock"));
        objects
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while ahead(0).len() < 8 || ahead(1).len() < 8 {
        assert!(Instant::now() < deadline, "no objects made ahead: {:?} {:?}", ahead(0), ahead(1));
        std::thread::sleep(Duration::from_millis(20));
    }
    let before: BTreeSet<PathBuf> = ahead(0).union(&ahead(1)).cloned().collect();
    drop(c);
    // A crash: which of them were whole is lost with it.
    tc.cluster.restart_meta().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<&PathBuf> = before.iter().filter(|p| p.exists()).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} objects made ahead left behind",
            left.len(),
            before.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The file is untouched, and creates go on.
    let c = tc.client();
    let (back, n) = c
        .open("/kept", stripefs::capability::Rights::READ)
        .unwrap()
        .read_at(0, bytes::BytesMut::zeroed(16))
        .unwrap();
    assert_eq!(&back[..n], b"kept");
    assert!(kept.iter().all(|p| p.exists()));
    c.create("/after", CreateOptions::default()).unwrap().write_all_at(0, b"after").unwrap();
}

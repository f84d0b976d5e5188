//! A cluster with a dead io server degrades instead of stopping: namespace operations never
//! need an io server, an operation that needs the dead one fails with an error naming it (role,
//! address, cause), new files go to live servers, and `stripefs serve` restarts a dead child.
//!
//! Every server is a separate process (`LocalCluster`), killed with SIGKILL like a crash; the
//! client side is the `stripefs` command line, as a user meets it.

mod common;

use common::{TestCluster, pattern};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use stripefs::proto::LayoutSpec;
use stripefs::{Client, CreateOptions};

fn sfs(cluster: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripefs")).arg("--cluster").arg(cluster).args(args).output().unwrap()
}

/// `stripefs args` fails; its standard error.
fn fails(cluster: &Path, args: &[&str]) -> String {
    let out = sfs(cluster, args);
    assert!(!out.status.success(), "stripefs {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The data every file of the tests holds.
const LEN: usize = 300_000;

/// A file of `LEN` bytes at `path` on `pcount` io servers from `base`.
fn put(c: &Client, path: &str, base: u32, pcount: u32) {
    let layout = LayoutSpec { base: Some(base), pcount: Some(pcount), ssize: Some(16384) };
    let f = c.create(path, CreateOptions { mode: 0o644, layout: Some(layout) }).unwrap();
    f.write_at(0, &pattern(LEN, u64::from(base))).unwrap();
    f.sync().unwrap();
}

/// Three io servers with files striped over all (`/wide`), over 0 and 1 (`/pair`), and one on
/// each (`/on0`, `/on1`, `/on2`); then io server 2 is killed. Returns the cluster, its cluster
/// file and the dead server's address.
fn cluster_without_io_2() -> (TestCluster, PathBuf, String) {
    let mut tc = TestCluster::start("tcp", 3);
    let c = tc.client();
    put(&c, "/wide", 0, 3);
    put(&c, "/pair", 0, 2);
    for i in 0..3 {
        put(&c, &format!("/on{i}"), i, 1);
    }
    drop(c);
    tc.cluster.kill_io(2);
    let path = tc.cluster.config_path().to_owned();
    let dead = tc.cluster.config().io_servers[2].to_string();
    (tc, path, dead)
}

/// An operation that needs the dead server fails with an error that names it: its role, its
/// address and the cause — from the command line and from the library.
#[test]
fn errors_name_the_dead_io_server() {
    let (tc, cl, dead) = cluster_without_io_2();
    let err = fails(&cl, &["stat", "sfs:/on2"]);
    assert!(err.contains(&format!("io server 2 ({dead})")) && err.contains("refused"), "{err}");
    assert!(!err.contains("PeerId"), "{err}");
    let c = tc.client();
    let f = c.open("/wide", stripefs::capability::Rights::READ).unwrap();
    let e = f.read_at(0, bytes::BytesMut::zeroed(LEN)).unwrap_err();
    assert!(e.to_string().starts_with(&format!("io server 2 ({dead}): ")), "{e}");
    assert_eq!(e.errno(), stripefs::Errno::ENOTCONN, "{e}");
    // Through the meta server: a create and a truncate that need the dead server.
    let wide = LayoutSpec { pcount: Some(3), ..Default::default() };
    let e = c.create("/new", CreateOptions { mode: 0o644, layout: Some(wide) }).unwrap_err();
    assert!(e.to_string().contains(&format!("io server 2 ({dead}): ")), "{e}");
    assert_eq!(e.errno(), stripefs::Errno::ENOTCONN, "{e}");
    let e = c.truncate("/wide", 10).unwrap_err();
    assert!(e.to_string().contains(&format!("io server 2 ({dead}): ")), "{e}");
}

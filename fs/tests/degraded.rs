//! A cluster with a dead io server degrades instead of stopping: namespace operations never
//! need an io server, an operation that needs the dead one fails with an error naming it (role,
//! address, cause), new files go to live servers, and `stripefs serve` restarts a dead child.
//!
//! Every server is a separate process (`LocalCluster`), killed with SIGKILL like a crash; the
//! client side is the `stripefs` command line, as a user meets it.

mod common;

use common::{TestCluster, pattern};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use stripefs::proto::LayoutSpec;
use stripefs::{Client, CreateOptions};

fn sfs(cluster: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stripefs")).arg("--cluster").arg(cluster).args(args).output().unwrap()
}

fn ok(cluster: &Path, args: &[&str]) -> String {
    let out = sfs(cluster, args);
    assert!(out.status.success(), "stripefs {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    // Through the meta server: a truncate and a create that need the dead server. (The
    // create fails once the meta server knows the server is down, here from the truncate;
    // before that it may take a file whose objects were made ahead, whose writes then fail.)
    let e = c.truncate("/wide", 10).unwrap_err();
    assert!(e.to_string().contains(&format!("io server 2 ({dead}): ")), "{e}");
    let wide = LayoutSpec { pcount: Some(3), ..Default::default() };
    let e = c.create("/new", CreateOptions { mode: 0o644, layout: Some(wide) }).unwrap_err();
    assert!(e.to_string().contains(&format!("io server 2 ({dead}): ")), "{e}");
    assert_eq!(e.errno(), stripefs::Errno::ENOTCONN, "{e}");
}

/// Name-only operations never need an io server: with one dead, `ls`, `mkdir`, `mv` and `rm`
/// (of any file: the objects on the dead server are removed once it is back) keep working,
/// `stat` of a file on live servers too, and `ls -l` lists every entry, with `?` for a size
/// that cannot be known.
#[test]
fn names_and_live_files_keep_working() {
    let (mut tc, cl, dead) = cluster_without_io_2();
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "on0\non1\non2\npair\nwide\n");
    let out = sfs(&cl, &["ls", "-l", "--bytes", "sfs:/"]);
    let (long, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let sizes: Vec<(String, String)> = long
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[4].to_string(), f[3].to_string())
        })
        .collect();
    let want = [("on0", "300000"), ("on1", "300000"), ("on2", "?"), ("pair", "300000"), ("wide", "?")];
    assert_eq!(sizes, want.map(|(n, s)| (n.to_string(), s.to_string())), "{long}{err}");
    assert!(err.contains("/on2") && err.contains("/wide"), "{err}");
    assert!(err.contains(&format!("io server 2 ({dead})")), "{err}");
    assert!(!out.status.success(), "as ls, an entry it could not fully read makes the status 1");
    for f in ["on0", "on1", "pair"] {
        let st = ok(&cl, &["stat", "--bytes", &format!("sfs:/{f}")]);
        assert!(st.contains(&format!("size: {LEN}")), "{st}");
    }
    ok(&cl, &["mkdir", "sfs:/d"]);
    ok(&cl, &["mkdir", "-p", "sfs:/d/e/f"]);
    ok(&cl, &["mv", "sfs:/on1", "sfs:/d"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/d"]), "e\non1\n");
    // rm: the names go at once, whichever servers hold the data.
    let c = tc.client();
    let handles: Vec<_> = ["on2", "wide"].map(|n| c.lookup(stripefs::Handle::ROOT, n).unwrap().0).into();
    ok(&cl, &["rm", "sfs:/on0", "sfs:/on2", "sfs:/wide"]);
    assert_eq!(ok(&cl, &["ls", "sfs:/"]), "d\npair\n");
    // The dead server's objects of the removed files wait for it; once it is back, the meta
    // server removes them.
    let cfg = tc.cluster.config().clone();
    let on2 = |h| stripefs::store::ObjectStore::object_path(&cfg.io_data_dir(2), h).exists();
    assert!(handles.iter().all(|h| on2(*h)), "removed later, not lost");
    tc.cluster.restart_io(2).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while handles.iter().any(|h| on2(*h)) {
        assert!(Instant::now() < deadline, "the dead server's orphans were never removed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The io servers of `path`'s layout, from `stripefs getstripe`.
fn servers_of(cl: &Path, path: &str) -> Vec<u32> {
    let out = ok(cl, &["getstripe", path]);
    let list = out.split("servers [").nth(1).and_then(|l| l.split(']').next()).expect("a server list");
    list.split(", ").map(|s| s.parse().unwrap()).collect()
}

/// New files go to live io servers: the first create that meets the dead server is placed again
/// on live ones, and so is every later one; a file striped over every server by default goes
/// over the live ones; a layout that cannot avoid it (a count of every server asked for, or an
/// explicit base on it) fails naming it. Once it is back, new files use it again.
#[test]
fn new_files_go_to_live_io_servers() {
    let (mut tc, cl, dead) = cluster_without_io_2();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(LEN, 9)).unwrap();
    let src = src.to_str().unwrap();
    // Round robin would put one of three single-server files on io server 2.
    for k in 0..3 {
        let to = format!("sfs:/n{k}");
        ok(&cl, &["cp", "--stripe-count", "1", src, &to]);
        let on = servers_of(&cl, &to);
        assert!(on.len() == 1 && on[0] != 2, "{to} on {on:?}");
        let back = tc.dir.path().join(format!("n{k}.bin"));
        ok(&cl, &["cp", &to, back.to_str().unwrap()]);
        assert_eq!(std::fs::read(&back).unwrap(), &pattern(LEN, 9)[..]);
    }
    ok(&cl, &["cp", "--stripe-count", "2", src, "sfs:/p"]);
    assert_eq!(servers_of(&cl, "sfs:/p"), [0, 1]);
    // Striped over every server by default: over every one up.
    ok(&cl, &["cp", src, "sfs:/all"]);
    assert_eq!(servers_of(&cl, "sfs:/all"), [0, 1]);
    let back = tc.dir.path().join("all.bin");
    ok(&cl, &["cp", "sfs:/all", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), &pattern(LEN, 9)[..]);
    for args in [
        &["cp", "--stripe-count", "3", src, "sfs:/three"][..],
        &["setstripe", "-c", "1", "-i", "2", "sfs:/forced"],
    ] {
        let err = fails(&cl, args);
        assert!(err.contains(&format!("io server 2 ({dead}): ")), "{args:?}: {err}");
    }
    assert_eq!(
        ok(&cl, &["ls", "sfs:/"]),
        "all\nn0\nn1\nn2\non0\non1\non2\np\npair\nwide\n",
        "no trace of failed creates"
    );
    tc.cluster.restart_io(2).unwrap();
    // A copy over every server once the meta server has seen the restarted one answer: one
    // whose failure it noticed only late (a loaded host) counts as silent, and creates on it
    // fail at once until its hold-off ends and a check finds it back.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = sfs(&cl, &["cp", "--stripe-count", "3", src, "sfs:/three"]);
        if out.status.success() {
            break;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not answering") && Instant::now() < deadline, "a copy over all three: {err}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for k in 0.. {
        let to = format!("sfs:/back{k}");
        ok(&cl, &["cp", "--stripe-count", "1", src, &to]);
        if servers_of(&cl, &to) == [2] {
            break;
        }
        assert!(Instant::now() < deadline, "new files never went to the restarted server again");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The CPU time, in clock ticks, process `pid` has used (user and system).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime are the 14th and 15th.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after.split_whitespace().skip(11).take(2).map(|v| v.parse().unwrap()).collect();
    f[0] + f[1]
}

/// An idle meta server with an io server down waits for it: it does not spin trying to make
/// files' objects ahead, which it cannot while one is down (a whole CPU for as long as the
/// server stayed down). Started with one down, it has none made ahead, so it wants them.
#[test]
fn an_idle_meta_server_with_an_io_server_down_does_not_spin() {
    let (mut tc, cl, _dead) = cluster_without_io_2();
    tc.cluster.restart_meta().unwrap();
    // A create meets the dead server, so the meta server knows it down from here on.
    let _ = sfs(&cl, &["cp", "--stripe-count", "3", "/dev/null", "sfs:/known"]);
    let meta = tc.cluster.pid(stripefs::cluster::ServerId::Meta).unwrap();
    let before = cpu_ticks(meta);
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(meta) - before;
    // Its janitor's pings and its threads' wake-ups cost a few ticks; a spinning thread, all
    // 300 of the three seconds (at 100 ticks a second).
    assert!(used < 60, "the idle meta server used {used} ticks of CPU in 3 s");
}

/// A client that sat idle while its servers were restarted (killed, then started again on
/// their addresses) is served at its next calls, the first too: a restart must not cost every
/// client one failed call on a connection the old server closed.
#[test]
fn an_idle_client_is_served_at_once_by_restarted_servers() {
    let mut tc = TestCluster::start("tcp", 2);
    let c = tc.client();
    put(&c, "/f", 0, 2);
    tc.cluster.restart_meta().unwrap();
    tc.cluster.restart_io(0).unwrap();
    tc.cluster.restart_io(1).unwrap();
    // Whatever the servers' new processes take to listen, then a moment for the old ones'
    // closes to reach the client's sockets, as they do for an idle client.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client_of(tc.cluster.config()).ping_all().iter().all(Result::is_ok) {
        assert!(Instant::now() < deadline, "the servers did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(100));
    let st = c.stat("/f").unwrap_or_else(|e| panic!("the first call after the restart: {e}"));
    assert_eq!(st.attr.size, LEN as u64);
    let f = c.open("/f", stripefs::capability::Rights::READ).unwrap();
    let (back, n) = f.read_at(0, bytes::BytesMut::zeroed(LEN)).unwrap();
    assert_eq!((n, &back[..n]), (LEN, &pattern(LEN, 0)[..]));
}

/// A `stripefs serve` launcher, killed (with its servers, which exit with it) when dropped.
struct Launcher(Child);

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pids of `parent`'s child processes whose command line has `arg` then `value`.
fn children_with(parent: u32, arg: &str, value: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{parent}/task")).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    pids.retain(|p| {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        args.windows(2).any(|w| w[0] == arg.as_bytes() && w[1] == value.as_bytes())
    });
    pids
}

/// `stripefs serve --io-servers 3`: an io server killed with SIGKILL is started again, and the
/// cluster serves as before (files striped over every server are written and read back).
#[test]
fn the_launcher_restarts_a_dead_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let err = std::fs::File::create(dir.path().join("launcher.err")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_stripefs"))
        .args(["serve", "--io-servers", "3", "--workers", "2", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap();
    let mut launcher = Launcher(child);
    let stdout = launcher.0.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.starts_with("Ctrl-C stops it"))), "the cluster did not start");
    let cfg = stripefs::config::ClusterConfig::load(&data.join("cluster.toml")).unwrap();
    let pid = launcher.0.id();
    let before = children_with(pid, "--io", "1");
    assert_eq!(before.len(), 1, "one io server 1");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(before[0] as i32), nix::sys::signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = launcher.0.try_wait() {
            let log = std::fs::read_to_string(dir.path().join("launcher.err")).unwrap_or_default();
            panic!("the launcher exited ({status}): {log}");
        }
        let now = children_with(pid, "--io", "1");
        let replaced = now.len() == 1 && now[0] != before[0];
        if replaced && client_of(&cfg).ping_all().iter().all(Result::is_ok) {
            break;
        }
        assert!(Instant::now() < deadline, "io server 1 never came back");
        std::thread::sleep(Duration::from_millis(200));
    }
    let c = client_of(&cfg);
    let layout = LayoutSpec { base: Some(0), pcount: Some(3), ssize: Some(16384) };
    let f = c.create("/after", CreateOptions { mode: 0o644, layout: Some(layout) }).unwrap();
    let d = pattern(LEN, 3);
    f.write_at(0, &d).unwrap();
    let (back, n) = f.read_at(0, bytes::BytesMut::zeroed(LEN)).unwrap();
    assert_eq!((n, &back[..]), (LEN, &d[..]));
    // Ctrl-C still stops the whole cluster.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while launcher.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "Ctrl-C did not stop the launcher");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client_of(cfg: &stripefs::config::ClusterConfig) -> Client {
    let opts = stripefs::ClientOptions { timeout: Duration::from_secs(10), ..Default::default() };
    Client::connect_with(cfg, opts).unwrap()
}

/// Stops a server process (SIGSTOP: it hangs, as one whose host is cut off does) until
/// dropped, when it continues.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Self {
        common::stop_process(pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0 as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// The cluster's space leaves the dead server out, naming it, instead of failing: `df` on a
/// mount goes on working.
#[test]
fn the_cluster_space_leaves_out_a_dead_io_server() {
    let (tc, _, dead) = cluster_without_io_2();
    let space = tc.client().disk_space().unwrap();
    assert!(space.space.total > 0, "{space:?}");
    assert_eq!(space.missing.len(), 1, "{space:?}");
    let e = space.missing[0].to_string();
    assert!(e.starts_with(&format!("io server 2 ({dead}): ")), "{e}");
}

/// An io server that hangs costs a client one deadline, not one per request: once a request
/// to it goes unanswered, the next ones fail at once (ETIMEDOUT, naming it) while files on the
/// other server work; when it answers again (a ping after the hold-off) it is used again.
#[test]
fn a_hung_io_server_costs_one_deadline_not_one_per_request() {
    let tc = TestCluster::start("tcp", 2);
    let opts = stripefs::ClientOptions { timeout: Duration::from_secs(1), ..Default::default() };
    let c = Client::connect_with(tc.cluster.config(), opts).unwrap();
    for i in 0..5 {
        put(&c, &format!("/on1-{i}"), 1, 1);
    }
    put(&c, "/on0", 0, 1);
    let stopped = Stopped::new(tc.cluster.pid(stripefs::cluster::ServerId::Io(1)).unwrap());
    let first = c.stat("/on1-0").unwrap_err();
    assert_eq!(first.errno(), stripefs::Errno::ETIMEDOUT, "{first}");
    assert!(matches!(first, stripefs::FsError::Server { .. }), "the one that waited: {first:?}");
    for i in 1..5 {
        let e = c.stat(&format!("/on1-{i}")).unwrap_err();
        assert!(matches!(e, stripefs::FsError::Silent { .. }), "not sent, failed at once: {e:?}");
        assert_eq!(e.errno(), stripefs::Errno::ETIMEDOUT);
        assert!(e.to_string().starts_with("io server 1 (tcp://"), "{e}");
    }
    assert_eq!(c.stat("/on0").unwrap().attr.size, LEN as u64, "the other server still serves");
    drop(stopped);
    let t = Instant::now();
    while c.stat("/on1-1").is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "never used again");
        std::thread::sleep(Duration::from_millis(100));
    }
    for i in 0..5 {
        assert_eq!(c.stat(&format!("/on1-{i}")).unwrap().attr.size, LEN as u64);
    }
}

/// The meta server holds off a hung io server too: a create that needs it fails once after
/// the wait, then at once, naming the server, while files placed on the others are made (and
/// files striped over every server by default go over the others).
///
/// (Without files' objects made ahead: a create could take those while the meta server has not
/// yet met the hung server.)
#[test]
fn creates_that_need_a_hung_io_server_fail_at_once_after_the_first() {
    let tc = TestCluster::start_with("tcp", 2, common::no_objects_ahead);
    let c = tc.client();
    let _stopped = Stopped::new(tc.cluster.pid(stripefs::cluster::ServerId::Io(1)).unwrap());
    let both = LayoutSpec { pcount: Some(2), ..Default::default() };
    let everywhere = || CreateOptions { mode: 0o644, layout: Some(both) };
    let first = c.create("/a", everywhere()).unwrap_err();
    assert!(first.to_string().contains("io server 1 (tcp://"), "{first}");
    for name in ["/b", "/c"] {
        let e = c.create(name, everywhere()).unwrap_err();
        let said = e.to_string();
        assert!(said.contains("io server 1 (tcp://") && said.contains("not answering"), "{said}");
        assert_eq!(e.errno(), stripefs::Errno::ETIMEDOUT, "{said}");
    }
    put(&c, "/on0", 0, 1);
    assert_eq!(c.stat("/on0").unwrap().attr.size, LEN as u64);
    // A file striped over every server by default goes over the one that answers.
    let f = c.create("/d", CreateOptions { mode: 0o644, layout: None }).unwrap();
    assert_eq!((f.layout().base, f.layout().pcount), (0, 1));
}

/// Creates that wait for a hung io server leave the meta server serving everyone else: with
/// twice as many of them waiting as it has workers, another client still learns its status,
/// makes a directory, lists and looks it up; the creates end once the server continues.
///
/// (Without files' objects made ahead, so that every create asks the io server.)
#[test]
fn creates_waiting_for_a_hung_io_server_leave_the_namespace_served() {
    const WAITING: u64 = 8;
    let tc = TestCluster::start_with("tcp", 2, common::no_objects_ahead);
    let stopped = Stopped::new(tc.cluster.pid(stripefs::cluster::ServerId::Io(1)).unwrap());
    let on1 = LayoutSpec { base: Some(1), pcount: Some(1), ..Default::default() };
    let creates: Vec<_> = (0..WAITING)
        .map(|i| {
            let c = tc.client();
            std::thread::spawn(move || {
                c.create(&format!("/w{i}"), CreateOptions { mode: 0o644, layout: Some(on1) })
            })
        })
        .collect();
    // A client that gives up soon, so that a meta server with every worker waiting shows here
    // as failed calls rather than slow ones.
    let opts = stripefs::ClientOptions { timeout: Duration::from_secs(2), ..Default::default() };
    let other = Client::connect_with(tc.cluster.config(), opts).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let stripefs::ServerState::Up(s) = other.status().meta
            && s.in_flight >= WAITING
        {
            break;
        }
        assert!(Instant::now() < deadline, "the meta server did not answer with the creates in hand");
        std::thread::sleep(Duration::from_millis(50));
    }
    other.mkdir("/elsewhere", 0o755).unwrap();
    assert!(other.readdir("/").unwrap().iter().any(|e| &*e.name == "elsewhere"));
    other.stat("/elsewhere").unwrap();
    drop(stopped);
    for (i, t) in creates.into_iter().enumerate() {
        if let Err(e) = t.join().unwrap() {
            assert!(e.to_string().contains("io server 1 (tcp://"), "/w{i}: {e}");
        }
    }
}

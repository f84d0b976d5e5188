//! A member that turned hostile: a fake meta server (and io server) holding the cluster key
//! answers a client's `readdir` with names that are not single path components, repeats names,
//! or serves a tree into a destination that already holds symbolic links. `stripefs cp -r`
//! must write nothing outside its destination and follow no local link below it; `ls` must
//! refuse what is not a name.

mod common;

use bytes::Bytes;
use std::collections::HashMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stripefs::Errno;
use stripefs::capability::{CapabilityKey, unix_now};
use stripefs::layout::Layout;
use stripefs::net::{TAG_IO, TAG_META, endpoint_config};
use stripefs::proto::{
    self, Attr, BoundedVec, DirEntry, Envelope, ErrorReply, FileKind, Handle, IoReply, IoRequest, MetaCall,
    MetaReply, MetaRequest, Name, ObjectSize, Timestamp,
};

const KEY: [u8; 32] = [0x5a; 32];

/// What a fake handle is.
#[derive(Clone)]
enum Kind {
    /// A directory: its pages (name, handle) as sent, whatever they contain, and whether more
    /// follow each. Lookups find a name in `names`.
    Dir {
        pages: Vec<Vec<(String, u64)>>,
        names: HashMap<String, Vec<u64>>,
    },
    File,
    Link(String),
}

/// Handles every unknown name resolves to: names starting with `f` are empty files, others
/// empty directories, so any path a client builds from a hostile name resolves.
const ANY_DIR: u64 = 100;
const ANY_FILE: u64 = 101;

struct Fake {
    nodes: HashMap<u64, Kind>,
    /// Times each (directory, name) was looked up, so a name can answer differently each time.
    lookups: HashMap<(u64, String), usize>,
    /// Page to send next per directory.
    next_page: HashMap<u64, usize>,
}

impl Fake {
    fn attr(&self, h: u64) -> Attr {
        let kind = match self.nodes.get(&h) {
            Some(Kind::Dir { .. }) | None => FileKind::Dir,
            Some(Kind::File) => FileKind::File,
            Some(Kind::Link(_)) => FileKind::Symlink,
        };
        let t = Timestamp::now();
        Attr { kind, mode: 0o755, uid: 0, gid: 0, size: 0, nlink: 1, atime: t, mtime: t, ctime: t }
    }

    fn lookup(&mut self, parent: u64, name: &str) -> Option<u64> {
        let n = self.lookups.entry((parent, name.to_string())).or_default();
        *n += 1;
        let seen = *n;
        if let Some(Kind::Dir { names, .. }) = self.nodes.get(&parent)
            && let Some(hs) = names.get(name)
        {
            // The n-th lookup gets the n-th answer, the last one from then on.
            return hs.get(seen - 1).or(hs.last()).copied();
        }
        Some(if name.starts_with('f') { ANY_FILE } else { ANY_DIR })
    }

    fn answer(&mut self, req: MetaRequest) -> Answer {
        let cap_key = CapabilityKey::new(&KEY).unwrap();
        Answer::Reply(match req {
            MetaRequest::Lookup { parent, name } => match self.lookup(parent.0, &name) {
                Some(h) => MetaReply::Entry { handle: Handle(h), attr: self.attr(h) },
                None => MetaReply::Error(ErrorReply::new(Errno::ENOENT, "")),
            },
            MetaRequest::Getattr { handle } => MetaReply::Attr(self.attr(handle.0)),
            MetaRequest::Open { handle, rights } => MetaReply::Opened {
                handle,
                attr: self.attr(handle.0),
                layout: Layout::new(0, 1, 65536).unwrap(),
                cap: cap_key.mint(handle, rights, unix_now() + 600, 1),
            },
            MetaRequest::Readlink { handle } => match self.nodes.get(&handle.0) {
                Some(Kind::Link(t)) => MetaReply::Link(proto::LinkTarget::new(t.clone()).unwrap()),
                _ => MetaReply::Error(ErrorReply::new(Errno::EINVAL, "")),
            },
            MetaRequest::Readdir { dir, after, .. } => {
                let Some(Kind::Dir { pages, .. }) = self.nodes.get(&dir.0) else {
                    return Answer::Reply(MetaReply::Dir {
                        entries: BoundedVec::new(vec![]).unwrap(),
                        more: false,
                    });
                };
                let i = if after.is_none() { 0 } else { self.next_page.get(&dir.0).copied().unwrap_or(0) };
                self.next_page.insert(dir.0, i + 1);
                let page = pages.get(i).cloned().unwrap_or_default();
                let more = i + 1 < pages.len();
                let kinds: Vec<(String, u64, FileKind)> =
                    page.into_iter().map(|(n, h)| (n, h, self.attr(h).kind)).collect();
                return Answer::Raw(hostile_dir_reply(&kinds, more));
            }
            r => MetaReply::Error(ErrorReply::new(Errno::EOPNOTSUPP, format!("fake: {r:?}"))),
        })
    }
}

/// What the fake meta server sends: a reply, or bytes no honest encoder would produce.
enum Answer {
    Reply(MetaReply),
    Raw(Vec<u8>),
}

/// A `Dir` reply carrying `entries` byte for byte, also names an honest encoder refuses: it
/// encodes unique placeholders and swaps each (length prefix and bytes) for the real name.
fn hostile_dir_reply(entries: &[(String, u64, FileKind)], more: bool) -> Vec<u8> {
    let placeholder = |i: usize| format!("\u{1}{i:04}\u{1}");
    let honest = entries
        .iter()
        .enumerate()
        .map(|(i, (_, h, kind))| DirEntry {
            name: Name::new(placeholder(i)).unwrap(),
            handle: Handle(*h),
            kind: *kind,
        })
        .collect();
    let mut bytes =
        proto::encode(&Envelope::new(0, MetaReply::Dir { entries: BoundedVec::new(honest).unwrap(), more }))
            .unwrap();
    for (i, (name, _, _)) in entries.iter().enumerate() {
        let mut from = vec![6u8];
        from.extend_from_slice(placeholder(i).as_bytes());
        let at = bytes.windows(from.len()).position(|w| w == from).expect("placeholder in the encoding");
        let mut to = varint(name.len());
        to.extend_from_slice(name.as_bytes());
        bytes.splice(at..at + from.len(), to);
    }
    bytes
}

fn varint(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// The fake meta and io servers, answering until dropped.
struct FakeCluster {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    cluster_file: PathBuf,
}

impl FakeCluster {
    fn start(dir: &Path, nodes: HashMap<u64, Kind>) -> FakeCluster {
        let stop = Arc::new(AtomicBool::new(false));
        let fake = Arc::new(Mutex::new(Fake { nodes, lookups: HashMap::new(), next_page: HashMap::new() }));
        let bind = || {
            ionet::Endpoint::bind(
                "tcp://127.0.0.1:0",
                endpoint_config(&KEY, ionet::WaitMode::Block, false, None),
            )
            .unwrap()
        };
        let (meta, io) = (bind(), bind());
        let cluster_file = dir.join("cluster.toml");
        std::fs::write(
            &cluster_file,
            format!(
                "transport = \"tcp\"\nmeta = \"{}\"\nio_servers = [\"{}\"]\ncluster_key = \"{}\"\n",
                meta.local_addr().unwrap(),
                io.local_addr().unwrap(),
                stripefs::config::encode_key_hex(&KEY)
            ),
        )
        .unwrap();
        let mut threads = Vec::new();
        for (ep, tag) in [(meta, TAG_META), (io, TAG_IO)] {
            let (stop, fake) = (stop.clone(), fake.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(Some(req)) = ep.next_request(Some(Duration::from_millis(50))) else { continue };
                    let bytes = if tag == TAG_META {
                        let env = proto::decode::<MetaCall>(req.header()).unwrap();
                        match fake.lock().unwrap().answer(env.body.req) {
                            Answer::Raw(raw) => with_id(raw, env.id),
                            Answer::Reply(r) => proto::encode(&Envelope::new(env.id, r)).unwrap(),
                        }
                    } else {
                        let env = proto::decode::<IoRequest>(req.header()).unwrap();
                        let r = match env.body {
                            IoRequest::GetSize { cap } if cap.handle.0 == UNSENT => {
                                IoReply::Size(ObjectSize { size: 4096, allocated: 4096 })
                            }
                            // Says it sent the whole read, sends nothing.
                            IoRequest::Read { cap, desc } if cap.handle.0 == UNSENT => {
                                IoReply::Read { bytes: desc.total(), local_size: 4096 }
                            }
                            IoRequest::GetSize { .. } => IoReply::Size(ObjectSize::default()),
                            r => IoReply::Error(ErrorReply::new(Errno::EOPNOTSUPP, format!("fake: {r:?}"))),
                        };
                        proto::encode(&Envelope::new(env.id, r)).unwrap()
                    };
                    if let Ok(op) = req.reply(Bytes::from(bytes)) {
                        let _ = ep.wait(op);
                    }
                }
            }));
        }
        FakeCluster { stop, threads, cluster_file }
    }

    /// Runs `stripefs` against the fake cluster; a run that does not end within a minute (a
    /// client walking a loop the server made up) is killed and counts as failed.
    fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stripefs"));
        cmd.arg("--cluster").arg(&self.cluster_file).args(args);
        common::output_within(&mut cmd, Duration::from_secs(60)).0
    }
}

/// Reply bytes encoded with id 0, re-addressed to request `id`.
fn with_id(mut raw: Vec<u8>, id: u64) -> Vec<u8> {
    raw[7..15].copy_from_slice(&id.to_le_bytes());
    raw
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn dir(pages: Vec<Vec<(&str, u64)>>, names: &[(&str, &[u64])]) -> Kind {
    Kind::Dir {
        pages: pages.into_iter().map(|p| p.into_iter().map(|(n, h)| (n.to_string(), h)).collect()).collect(),
        names: names.iter().map(|(n, hs)| (n.to_string(), hs.to_vec())).collect(),
    }
}

/// Every path under `root`, as `root`-relative strings, not following links.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The scene every case plays in: a temporary directory holding the cluster file, a victim
/// directory with a precious file, and the copy's destination `out`.
struct Scene {
    tmp: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("victim")).unwrap();
        std::fs::write(tmp.path().join("victim/precious"), b"precious").unwrap();
        Scene { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn s(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    /// Nothing outside `out` changed: the victim holds its one file with its bytes, and the
    /// scene holds nothing but the victim, the cluster file and `out` (if the copy got as far
    /// as making it).
    fn assert_contained(&self, what: &str, out: &Output) {
        let why = format!("{what}: stderr {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(tree(&self.path("victim")), ["precious"], "{why}");
        assert_eq!(std::fs::read(self.path("victim/precious")).unwrap(), b"precious", "{why}");
        let top: Vec<String> = tree(self.tmp.path())
            .into_iter()
            .filter(|p| !p.starts_with("out") && !p.starts_with("victim/"))
            .collect();
        assert_eq!(top, ["cluster.toml", "victim"], "{why}");
    }
}

const ROOT: u64 = Handle::ROOT.0;

/// A 4 KiB file whose reads the fake io server claims in full and never sends.
const UNSENT: u64 = 102;

/// An io server that says it sent a read's bytes without sending them: the client fails the
/// read rather than hand out what its buffer held before.
#[test]
fn a_read_the_server_claims_but_never_sent_fails() {
    let sc = Scene::new();
    let mut nodes = HashMap::new();
    nodes.insert(UNSENT, Kind::File);
    nodes.insert(ROOT, dir(vec![], &[("unsent", &[UNSENT])]));
    let fake = FakeCluster::start(sc.tmp.path(), nodes);
    let out = fake.run(&["cp", "sfs:/unsent", &sc.s("out")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("0 bytes arrived"), "cp succeeded or said: {err}");
}

/// `readdir` names that are not single components are refused by the client: `cp -r` fails
/// and writes nothing outside its destination, `ls` fails instead of printing them.
#[test]
fn cp_refuses_names_that_are_not_components() {
    let sc = Scene::new();
    let abs = sc.s("abs");
    let fabs = sc.s("fabs");
    let cases: Vec<(&str, Vec<(&str, u64)>)> = vec![
        ("dotdot_slash", vec![("../x", ANY_DIR)]),
        ("dotdot_file", vec![("../fx", ANY_FILE)]),
        ("absolute", vec![(abs.as_str(), ANY_DIR)]),
        ("absolute_file", vec![(fabs.as_str(), ANY_FILE)]),
        // A link named `a`, then `a/b` below it: written through the link.
        ("slash_under_link", vec![("a", 3), ("a/b", ANY_DIR), ("a/fc", ANY_FILE)]),
        ("dot", vec![(".", ANY_DIR)]),
        ("dotdot", vec![("..", ANY_DIR)]),
        ("empty", vec![("", ANY_FILE)]),
        ("nul", vec![("f\0x", ANY_FILE)]),
    ];
    let mut nodes = HashMap::new();
    nodes.insert(3, Kind::Link(sc.s("victim")));
    nodes.insert(ANY_FILE, Kind::File);
    let root_names: Vec<(String, Vec<u64>)> =
        cases.iter().enumerate().map(|(i, (n, _))| (n.to_string(), vec![1000 + i as u64])).collect();
    for (i, (_, entries)) in cases.iter().enumerate() {
        let names: Vec<(&str, &[u64])> = vec![("a", &[3])];
        nodes.insert(1000 + i as u64, dir(vec![entries.clone()], &names));
    }
    let rn: Vec<(&str, &[u64])> = root_names.iter().map(|(n, h)| (n.as_str(), h.as_slice())).collect();
    nodes.insert(ROOT, dir(vec![], &rn));
    let fake = FakeCluster::start(sc.tmp.path(), nodes);
    for (case, entries) in &cases {
        let out_dir = sc.path("out");
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = fake.run(&["cp", "-r", &format!("sfs:/{case}"), out_dir.to_str().unwrap()]);
        sc.assert_contained(case, &out);
        assert!(!out.status.success(), "{case}: cp -r copied {entries:?}");
        let ls = fake.run(&["ls", &format!("sfs:/{case}")]);
        assert!(!ls.status.success(), "{case}: ls printed {:?}", String::from_utf8_lossy(&ls.stdout));
        let err = String::from_utf8_lossy(&ls.stderr);
        assert!(err.contains("directory entry"), "{case}: {err}");
    }
}

/// A name the server lists twice — in one page, or again on the next page — first as a link
/// out of the destination and then as a directory holding a file: the repeat is refused and
/// nothing lands behind the link.
#[test]
fn cp_refuses_repeated_names() {
    let sc = Scene::new();
    let mut nodes = HashMap::new();
    nodes.insert(3, Kind::Link(sc.s("victim")));
    nodes.insert(4, dir(vec![vec![("fz", ANY_FILE)]], &[]));
    nodes.insert(ANY_FILE, Kind::File);
    // Each lookup of `a` answers: the link first, the directory from then on.
    nodes.insert(10, dir(vec![vec![("a", 3), ("a", 4)]], &[("a", &[3, 4])]));
    nodes.insert(11, dir(vec![vec![("a", 3)], vec![("a", 4)]], &[("a", &[3, 4])]));
    nodes.insert(ROOT, dir(vec![], &[("one_page", &[10]), ("two_pages", &[11])]));
    let fake = FakeCluster::start(sc.tmp.path(), nodes);
    for case in ["one_page", "two_pages"] {
        let out_dir = sc.path("out");
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = fake.run(&["cp", "-r", &format!("sfs:/{case}"), out_dir.to_str().unwrap()]);
        sc.assert_contained(case, &out);
        assert!(!out.status.success(), "{case}: cp -r copied a repeated name");
    }
}

/// A destination that already holds links (a previous copy from the same server, or put there
/// by anyone): `cp -r` never writes or creates through them, and says why. An honest tree
/// copies, over an existing regular file too.
#[test]
fn cp_follows_no_link_in_the_destination() {
    let sc = Scene::new();
    let mut nodes = HashMap::new();
    nodes.insert(ANY_FILE, Kind::File);
    nodes.insert(5, Kind::Link("fa".into()));
    nodes.insert(6, dir(vec![vec![("fw", ANY_FILE)]], &[]));
    nodes
        .insert(20, dir(vec![vec![("fa", ANY_FILE), ("ln", 5), ("sub", 6)]], &[("ln", &[5]), ("sub", &[6])]));
    nodes.insert(ROOT, dir(vec![], &[("tree", &[20])]));
    let fake = FakeCluster::start(sc.tmp.path(), nodes);
    // `out` exists, so the copy goes to `out/tree`, the run before it or not.
    let out_dir = sc.path("out");
    let top = out_dir.join("tree");
    std::fs::create_dir(&out_dir).unwrap();
    let cp = || fake.run(&["cp", "-r", "sfs:/tree", out_dir.to_str().unwrap()]);
    let fresh = || {
        std::fs::remove_dir_all(&out_dir).unwrap();
        std::fs::create_dir_all(&top).unwrap();
    };
    let refused = |what: &str, out: &Output| {
        sc.assert_contained(what, out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("symbolic link"), "{what}: {err}");
    };

    // The honest copy works (and the fake serves what `cp` needs).
    let out = cp();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tree(&top), ["fa", "ln", "sub", "sub/fw"]);
    assert_eq!(std::fs::read_link(top.join("ln")).unwrap(), Path::new("fa"));
    // Again over the copy: an existing regular file is rewritten in place.
    std::fs::write(top.join("fa"), b"old").unwrap();
    std::fs::remove_file(top.join("ln")).unwrap();
    let out = cp();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(top.join("fa")).unwrap(), b"", "truncated to the source's size");
    sc.assert_contained("honest", &out);

    // A link where a file goes.
    fresh();
    symlink(sc.path("victim/precious"), top.join("fa")).unwrap();
    refused("link for a file", &cp());

    // A link where a directory goes.
    fresh();
    symlink(sc.path("victim"), top.join("sub")).unwrap();
    refused("link for a directory", &cp());

    // One file onto a link: not followed either.
    fresh();
    symlink(sc.path("victim/precious"), top.join("f1")).unwrap();
    refused("one file onto a link", &fake.run(&["cp", "sfs:/tree/fa", top.join("f1").to_str().unwrap()]));
}

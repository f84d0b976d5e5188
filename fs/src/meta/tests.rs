//! The store's unit tests: namespace operations, their refusals, crash recovery.

use super::*;
use crate::errno::Errno;
use crate::layout::LayoutError;

const P: Perm = Perm { mode: 0o644, uid: 10, gid: 20 };
const R: Handle = Handle::ROOT;
const ROOT: Cred = Cred { uid: 0, gid: 0, groups: crate::proto::BoundedVec::empty() };

fn store(dir: &tempfile::TempDir) -> MetaStore {
    MetaStore::open(&dir.path().join("meta.redb"), MetaConfig::new(4)).unwrap()
}

fn mkfile(m: &MetaStore, parent: Handle, name: &str) -> Created {
    let c = m.create(&ROOT, parent, name, P, None).unwrap();
    m.commit_create(c.handle).unwrap();
    c
}

fn names(m: &MetaStore, dir: Handle) -> Vec<String> {
    m.readdir(&ROOT, dir, None, 1000).unwrap().0.into_iter().map(|e| e.name.into_string()).collect()
}

#[test]
fn root_exists_on_first_open() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let a = m.getattr(R).unwrap();
    assert_eq!((a.kind, a.mode, a.nlink), (FileKind::Dir, 0o755, 2));
    assert_eq!(m.statfs().unwrap(), FsStats { files: 0, dirs: 1, io_servers: 4, name_max: 255 });
    assert_eq!(m.resolve("/").unwrap(), R);
}

#[test]
fn create_lookup_getattr_open() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let c = mkfile(&m, R, "a.txt");
    assert!(c.handle.0 > R.0);
    let (h, a) = m.lookup(&ROOT, R, "a.txt").unwrap();
    assert_eq!(h, c.handle);
    assert_eq!((a.kind, a.mode, a.uid, a.gid, a.size), (FileKind::File, 0o644, 10, 20, 0));
    assert_eq!(m.getattr(h).unwrap(), a);
    assert_eq!(m.open_file(&ROOT, h, Rights::READ_WRITE).unwrap().layout, c.layout);
    assert!(matches!(m.open_file(&ROOT, R, Rights::READ_WRITE), Err(MetaError::IsDir)));
    assert!(matches!(m.create(&ROOT, R, "a.txt", P, None), Err(MetaError::Exists)));
    assert_eq!(m.create(&ROOT, R, "a.txt", P, None).unwrap_err().errno(), Errno::EEXIST);
    assert!(matches!(m.lookup(&ROOT, R, "nope"), Err(MetaError::NotFound)));
    // A name looked up in a directory that is not there: the directory's handle is stale.
    assert_eq!(m.lookup(&ROOT, Handle(999), "a.txt").unwrap_err().errno(), Errno::ESTALE);
    assert!(matches!(m.create(&ROOT, h, "x", P, None), Err(MetaError::NotDir)));
    assert!(matches!(m.create(&ROOT, Handle(999), "x", P, None), Err(MetaError::NotFound)));
    assert_eq!(m.statfs().unwrap().files, 1);
}

#[test]
fn bad_names_are_refused_with_typed_errors() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let long = "x".repeat(NAME_MAX + 1);
    let cases: [(&str, NameError); 6] = [
        ("", NameError::Empty),
        (".", NameError::Dot),
        ("..", NameError::Dot),
        ("a/b", NameError::Slash),
        ("a\0b", NameError::Nul),
        (&long, NameError::TooLong),
    ];
    for (name, want) in cases {
        assert!(
            matches!(m.create(&ROOT, R, name, P, None), Err(MetaError::Name(e)) if e == want),
            "{name:?}"
        );
        assert!(matches!(m.mkdir(&ROOT, R, name, P), Err(MetaError::Name(_))));
        assert!(matches!(m.lookup(&ROOT, R, name), Err(MetaError::Name(_))));
        assert!(matches!(m.rename(&ROOT, R, "a", R, name), Err(MetaError::Name(_))));
    }
    assert_eq!(MetaError::Name(NameError::TooLong).errno(), Errno::ENAMETOOLONG);
    assert_eq!(MetaError::Name(NameError::Slash).errno(), Errno::EINVAL);
    mkfile(&m, R, &"x".repeat(NAME_MAX));
    assert_eq!(m.inode_count().unwrap(), 2);
}

#[test]
fn pending_create_is_invisible_until_committed() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let c = m.create(&ROOT, R, "p", P, None).unwrap();
    assert!(matches!(m.lookup(&ROOT, R, "p"), Err(MetaError::NotFound)));
    assert!(matches!(m.getattr(c.handle), Err(MetaError::NotFound)));
    assert!(names(&m, R).is_empty());
    assert!(matches!(m.create(&ROOT, R, "p", P, None), Err(MetaError::Exists)), "name is taken");
    assert!(matches!(m.unlink(&ROOT, R, "p"), Err(MetaError::NotFound)));
    assert_eq!(m.statfs().unwrap().files, 0);
    m.commit_create(c.handle).unwrap();
    assert_eq!(m.lookup(&ROOT, R, "p").unwrap().0, c.handle);
    assert_eq!(names(&m, R), ["p"]);
    assert!(matches!(m.abort_create(c.handle), Err(MetaError::Invalid(_))), "committed files stay");
}

#[test]
fn aborted_create_leaves_nothing() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let c = m.create(&ROOT, R, "p", P, None).unwrap();
    assert_eq!(m.abort_create(c.handle).unwrap(), c.layout);
    assert_eq!(m.inode_count().unwrap(), 1);
    assert!(m.orphans().unwrap().is_empty());
    // The name is free again, and the handle is never reused.
    let c2 = m.create(&ROOT, R, "p", P, None).unwrap();
    assert!(c2.handle.0 > c.handle.0);
}

#[test]
fn pending_creates_survive_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let c = {
        let m = store(&d);
        mkfile(&m, R, "done");
        m.create(&ROOT, R, "half", P, None).unwrap()
    };
    let m = store(&d);
    assert_eq!(m.pending_creates().unwrap(), vec![Objects { handle: c.handle, layout: c.layout }]);
    m.abort_create(c.handle).unwrap();
    assert!(m.pending_creates().unwrap().is_empty());
    assert_eq!(names(&m, R), ["done"]);
}

fn create_with(m: &MetaStore, name: &str, spec: Option<LayoutSpec>, h: Handle) -> Created {
    let place = Placement { avoid: &[], precreated: Some(h), made_ahead_only: false };
    m.create_placed(&ROOT, R, name, P, spec, place).unwrap()
}

#[test]
fn changes_of_times_alone_wait_for_a_flush() {
    // Whether a commit reached the disk shows only after a crash (see the meta server's
    // tests); here, what the store counts as not yet flushed.
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let old = Timestamp { secs: 1000, nsecs: 0 };
    let times = SetAttr { mtime: Some(SetTime::At(old)), atime: Some(SetTime::Now), ..Default::default() };
    let f = mkfile(&m, R, "f").handle;
    assert_eq!(m.unflushed(), 0);
    assert_eq!(m.setattr(&ROOT, f, &times).unwrap().attr.mtime, old);
    assert_eq!(m.getattr(f).unwrap().mtime, old);
    assert_eq!(m.unflushed(), 1);
    // Setting the mode or owner to what it already is changes the change time alone.
    let a = m.getattr(f).unwrap();
    let same =
        SetAttr { mode: Some(a.mode & 0o7777), uid: Some(a.uid), gid: Some(a.gid), ..Default::default() };
    m.setattr(&ROOT, f, &same).unwrap();
    assert_eq!(m.unflushed(), 2);
    // So does adding mode bits (a lost change leaves the file as closed as it was).
    m.setattr(&ROOT, f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    m.flush().unwrap();
    assert_eq!(
        m.setattr(&ROOT, f, &SetAttr { mode: Some(0o6755), ..Default::default() }).unwrap().attr.mode
            & 0o7777,
        0o6755
    );
    assert_eq!(m.unflushed(), 1);
    m.flush().unwrap();
    assert_eq!(m.unflushed(), 0);
    m.flush().unwrap();
    // A change of what decides access is durable, with every change before it.
    let durable = |set: SetAttr, cred: &Cred| {
        m.setattr(&ROOT, f, &times).unwrap();
        assert_eq!(m.unflushed(), 1);
        let a = m.setattr(cred, f, &set).unwrap().attr;
        assert_eq!(m.unflushed(), 0, "{set:?}");
        a
    };
    let setuid = || {
        m.setattr(&ROOT, f, &SetAttr { mode: Some(0o4755), ..Default::default() }).unwrap();
        m.flush().unwrap();
    };
    setuid();
    let writer = Cred { uid: 10, gid: 20, groups: crate::proto::BoundedVec::empty() };
    let wrote = SetAttr { wrote: true, opened_for_write: true, ..times.clone() };
    assert_eq!(durable(wrote, &writer).mode & 0o7777, 0o755, "the set-user-ID bit cleared");
    setuid();
    assert_eq!(
        durable(SetAttr { uid: Some(0), ..Default::default() }, &ROOT).mode & 0o7777,
        0o755,
        "by a chown"
    );
    assert_eq!(durable(SetAttr { mode: Some(0o6700), ..times.clone() }, &ROOT).mode & 0o7777, 0o6700);
    assert_eq!(durable(SetAttr { mode: Some(0o600), ..times.clone() }, &ROOT).mode & 0o7777, 0o600);
    assert_eq!(durable(SetAttr { uid: Some(7), ..Default::default() }, &ROOT).uid, 7);
    assert_eq!(durable(SetAttr { gid: Some(8), ..Default::default() }, &ROOT).gid, 8);
    assert_eq!(durable(SetAttr { size: Some(0), ..Default::default() }, &ROOT).size, 0);
    assert_eq!(durable(SetAttr { sync: true, ..times.clone() }, &ROOT).mtime, old);
}

#[test]
fn orphans_are_listed_a_page_at_a_time() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let hs: Vec<Handle> = (0..5).map(|i| mkfile(&m, R, &format!("f{i}")).handle).collect();
    for i in 0..5 {
        m.unlink(&ROOT, R, &format!("f{i}")).unwrap();
    }
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page: Vec<Handle> = m.orphans_after(after, 2).unwrap().into_iter().map(|o| o.handle).collect();
        after = page.last().copied();
        if page.is_empty() {
            break;
        }
        pages.push(page);
    }
    assert_eq!(pages, [hs[0..2].to_vec(), hs[2..4].to_vec(), hs[4..].to_vec()]);
    assert!(m.orphans_after(Some(Handle(u64::MAX)), 2).unwrap().is_empty());
}

#[test]
fn a_create_given_a_precreated_handle_is_committed_under_it() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let hs = m.reserve_precreated(2).unwrap();
    let c = create_with(&m, "f", None, hs[0]);
    assert_eq!((c.handle, c.committed, c.layout.pcount), (hs[0], true, 4));
    // Visible at once, counted, and nothing pending to clean up.
    assert_eq!(m.lookup(&ROOT, R, "f").unwrap().0, hs[0]);
    assert_eq!(m.statfs().unwrap().files, 1);
    assert!(m.pending_creates().unwrap().is_empty());
    assert_eq!(m.precreated().unwrap(), [hs[1]]);
    // Taken once only: the same handle again makes an ordinary pending create.
    let again = create_with(&m, "g", None, hs[0]);
    assert!(!again.committed && again.handle.0 > hs[1].0);
    assert_eq!(m.pending_creates().unwrap().len(), 1);
    // Its removal sends its objects (on every server) through the orphans, as any file's.
    m.unlink(&ROOT, R, "f").unwrap();
    assert_eq!(m.orphans().unwrap(), vec![Objects { handle: hs[0], layout: c.layout }]);
}

#[test]
fn a_layout_narrower_than_every_server_leaves_the_precreated_handle() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let hs = m.reserve_precreated(1).unwrap();
    let two = LayoutSpec { pcount: Some(2), ..Default::default() };
    let c = create_with(&m, "f", Some(two), hs[0]);
    assert!(!c.committed);
    assert_ne!(c.handle, hs[0]);
    assert_eq!(m.precreated().unwrap(), hs);
    // A refused create leaves it too.
    let place = Placement { avoid: &[], precreated: Some(hs[0]), made_ahead_only: false };
    assert!(matches!(m.create_placed(&ROOT, R, "f", P, None, place), Err(MetaError::Exists)));
    assert_eq!(m.precreated().unwrap(), hs);
}

#[test]
fn a_create_made_ahead_only_writes_nothing_when_it_needs_objects() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let hs = m.reserve_precreated(1).unwrap();
    let only = |precreated| Placement { avoid: &[], precreated, made_ahead_only: true };
    let two = LayoutSpec { pcount: Some(2), ..Default::default() };
    for (spec, h) in [(Some(two), Some(hs[0])), (None, None)] {
        let r = m.create_placed(&ROOT, R, "f", P, spec, only(h));
        assert!(matches!(r, Err(MetaError::NeedsObjects)), "{r:?}");
        assert!(names(&m, R).is_empty() && m.pending_creates().unwrap().is_empty());
        assert_eq!(m.precreated().unwrap(), hs);
    }
    let c = m.create_placed(&ROOT, R, "f", P, None, only(Some(hs[0]))).unwrap();
    assert!(c.committed && c.handle == hs[0]);
}

#[test]
fn reserved_handles_outlive_a_restart_and_are_then_given_up_as_orphans() {
    let d = tempfile::tempdir().unwrap();
    let hs = {
        let m = store(&d);
        let hs = m.reserve_precreated(3).unwrap();
        create_with(&m, "f", None, hs[1]);
        hs
    };
    let m = store(&d);
    assert_eq!(m.precreated().unwrap(), [hs[0], hs[2]]);
    assert_eq!(m.recycle_precreated().unwrap(), 2);
    assert!(m.precreated().unwrap().is_empty());
    let all = Layout { base: 0, pcount: 4, ssize: 64 * 1024 };
    let orphans = vec![Objects { handle: hs[0], layout: all }, Objects { handle: hs[2], layout: all }];
    assert_eq!(m.orphans().unwrap(), orphans);
    // A given-up handle is not taken, and handles are never reused.
    let c = create_with(&m, "g", None, hs[0]);
    assert!(!c.committed && c.handle.0 > hs[2].0);
    assert_eq!(m.release_precreated(&hs).unwrap(), []);
}

#[test]
fn default_layout_and_round_robin_base() {
    let d = tempfile::tempdir().unwrap();
    let bases: Vec<u32> = {
        let m = store(&d);
        (0..5)
            .map(|i| {
                let c = mkfile(&m, R, &format!("f{i}"));
                assert_eq!((c.layout.pcount, c.layout.ssize), (4, 64 * 1024));
                c.layout.base
            })
            .collect()
    };
    assert_eq!(bases, [0, 1, 2, 3, 0]);
    // The counter is persisted: the next create after reopening continues the rotation.
    let m = store(&d);
    assert_eq!(mkfile(&m, R, "g").layout.base, 1);
    // An explicit base does not advance the rotation.
    let spec = LayoutSpec { base: Some(3), pcount: Some(2), ssize: Some(4096) };
    assert_eq!(mkfile_spec(&m, R, "h", spec).layout, Layout { base: 3, pcount: 2, ssize: 4096 });
    assert_eq!(mkfile(&m, R, "i").layout.base, 2);
}

#[test]
fn new_layouts_avoid_servers_known_down_while_the_stripe_count_allows() {
    // No server down: the plain rotation.
    assert_eq!(pick_base(5, 4, 2, &[]), (1, 0));
    // Server 2 down, 4 servers: single-server files skip it…
    assert_eq!(pick_base(2, 4, 1, &[2]), (3, 1));
    assert_eq!(pick_base(6, 4, 1, &[2]), (3, 1));
    // …two-server files need a window without it: 3,0 or 0,1.
    assert_eq!(pick_base(1, 4, 2, &[2]), (3, 2));
    assert_eq!(pick_base(0, 4, 2, &[2]), (0, 0));
    assert_eq!(pick_base(0, 4, 3, &[2]), (3, 3));
    // Every server, or more than are up: the rotation's base, to be tried.
    assert_eq!(pick_base(1, 4, 4, &[2]), (1, 0));
    assert_eq!(pick_base(1, 4, 2, &[0, 2]), (1, 0));
    // Nonsense counts are for `validate` to refuse, not a panic here.
    assert_eq!(pick_base(1, 4, 9, &[2]), (1, 0));
    assert_eq!(pick_base(1, 0, 1, &[0]), (0, 0));

    // In the store: the rotation goes on after the base chosen.
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let one = LayoutSpec { pcount: Some(1), ..Default::default() };
    let avoid_1 = Placement { avoid: &[1], precreated: None, made_ahead_only: false };
    let bases: Vec<u32> = (0..6)
        .map(|i| {
            let c = m.create_placed(&ROOT, R, &format!("f{i}"), P, Some(one), avoid_1).unwrap();
            c.layout.base
        })
        .collect();
    assert_eq!(bases, [0, 2, 3, 0, 2, 3]);
    // An explicit base is kept even on a server to avoid (the create then fails there).
    let forced = LayoutSpec { base: Some(1), ..one };
    assert_eq!(m.create_placed(&ROOT, R, "g", P, Some(forced), avoid_1).unwrap().layout.base, 1);
}

#[test]
fn files_striped_over_every_server_by_default_go_over_those_up() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let place = |avoid: &'static [u32]| Placement { avoid, precreated: None, made_ahead_only: false };
    let servers = |c: &Created| c.layout.servers(4).collect::<Vec<u32>>();
    // Server 2 of 4 down: a file of the default count goes over the other three, whichever
    // base the rotation is at.
    for i in 0..4 {
        let c = m.create_placed(&ROOT, R, &format!("f{i}"), P, None, place(&[2])).unwrap();
        assert_eq!(servers(&c), [3, 0, 1], "f{i}");
    }
    // Two down apart: the widest run of servers up.
    let c = m.create_placed(&ROOT, R, "g", P, None, place(&[0, 2])).unwrap();
    assert_eq!(c.layout.pcount, 1);
    let c = m.create_placed(&ROOT, R, "h", P, None, place(&[0, 1])).unwrap();
    assert_eq!(servers(&c), [2, 3]);
    // Every server down: over every one, to be tried (and fail naming one).
    let c = m.create_placed(&ROOT, R, "i", P, None, place(&[0, 1, 2, 3])).unwrap();
    assert_eq!(c.layout.pcount, 4);
    // A count asked for is kept, from the create, the directory or the cluster's defaults.
    let four = LayoutSpec { pcount: Some(4), ..Default::default() };
    assert_eq!(m.create_placed(&ROOT, R, "j", P, Some(four), place(&[2])).unwrap().layout.pcount, 4);
    let (dir, _) = m.mkdir(&ROOT, R, "d", P).unwrap();
    m.setstripe(&ROOT, dir, Some(four)).unwrap();
    assert_eq!(m.create_placed(&ROOT, dir, "k", P, None, place(&[2])).unwrap().layout.pcount, 4);
    let d = tempfile::tempdir().unwrap();
    let cfg = MetaConfig { default_pcount: Some(4), ..MetaConfig::new(4) };
    let m = MetaStore::open(&d.path().join("m.redb"), cfg).unwrap();
    assert_eq!(m.create_placed(&ROOT, R, "l", P, None, place(&[2])).unwrap().layout.pcount, 4);
}

fn mkfile_spec(m: &MetaStore, parent: Handle, name: &str, spec: LayoutSpec) -> Created {
    let c = m.create(&ROOT, parent, name, P, Some(spec)).unwrap();
    m.commit_create(c.handle).unwrap();
    c
}

#[test]
fn configured_defaults_apply() {
    let d = tempfile::tempdir().unwrap();
    let cfg = MetaConfig { n_servers: 4, default_ssize: 1 << 20, default_pcount: Some(2) };
    let m = MetaStore::open(&d.path().join("m.redb"), cfg).unwrap();
    let c = mkfile(&m, R, "f");
    assert_eq!((c.layout.pcount, c.layout.ssize), (2, 1 << 20));
}

#[test]
fn invalid_explicit_layout_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let too_many = LayoutSpec { pcount: Some(5), ..Default::default() };
    let e = m.create(&ROOT, R, "f", P, Some(too_many)).unwrap_err();
    assert!(matches!(e, MetaError::Layout(LayoutError::BadStripeCount { .. })));
    assert_eq!(e.errno(), Errno::EINVAL);
    let bad_base = LayoutSpec { base: Some(4), ..Default::default() };
    assert!(matches!(m.create(&ROOT, R, "f", P, Some(bad_base)), Err(MetaError::Layout(_))));
    assert!(matches!(m.lookup(&ROOT, R, "f"), Err(MetaError::NotFound)), "failed create leaves no entry");
}

#[test]
fn directory_default_layouts_are_inherited() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let (dir, _) = m.mkdir(&ROOT, R, "d", P).unwrap();
    let spec = LayoutSpec { base: None, pcount: Some(2), ssize: Some(1 << 20) };
    m.setstripe(&ROOT, dir, Some(spec)).unwrap();
    assert_eq!(m.getstripe(dir).unwrap(), Stripe { layout: None, default: Some(spec) });
    let c = mkfile(&m, dir, "f");
    assert_eq!((c.layout.pcount, c.layout.ssize), (2, 1 << 20));
    assert_eq!(m.getstripe(c.handle).unwrap(), Stripe { layout: Some(c.layout), default: None });
    // Per-create fields override the directory's, field by field.
    let c = mkfile_spec(&m, dir, "g", LayoutSpec { ssize: Some(4096), ..Default::default() });
    assert_eq!((c.layout.pcount, c.layout.ssize), (2, 4096));
    // Subdirectories inherit the default; the root is untouched.
    let (sub, _) = m.mkdir(&ROOT, dir, "sub", P).unwrap();
    assert_eq!(m.getstripe(sub).unwrap().default, Some(spec));
    assert_eq!(mkfile(&m, R, "top").layout.pcount, 4);
    // Clearing it restores the filesystem defaults.
    m.setstripe(&ROOT, dir, None).unwrap();
    assert_eq!(mkfile(&m, dir, "h").layout.pcount, 4);
    assert!(matches!(m.setstripe(&ROOT, c.handle, Some(spec)), Err(MetaError::NotDir)));
    let bad = LayoutSpec { pcount: Some(9), ..Default::default() };
    assert!(matches!(m.setstripe(&ROOT, dir, Some(bad)), Err(MetaError::Layout(_))));
}

#[test]
fn mkdir_rmdir_and_unlink() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let (dir, a) = m.mkdir(&ROOT, R, "d", Perm { mode: 0o40755, ..P }).unwrap();
    assert_eq!((a.kind, a.mode), (FileKind::Dir, 0o755));
    assert!(matches!(m.mkdir(&ROOT, R, "d", P), Err(MetaError::Exists)));
    let f = mkfile(&m, dir, "f");
    assert_eq!(m.rmdir(&ROOT, R, "d").unwrap_err().errno(), Errno::ENOTEMPTY);
    assert!(matches!(m.rmdir(&ROOT, dir, "f"), Err(MetaError::NotDir)));
    assert_eq!(m.unlink(&ROOT, R, "d").unwrap_err().errno(), Errno::EISDIR);
    let objs = m.unlink(&ROOT, dir, "f").unwrap();
    assert_eq!(objs, Some(Objects { handle: f.handle, layout: f.layout }));
    assert!(matches!(m.unlink(&ROOT, dir, "f"), Err(MetaError::NotFound)));
    assert!(matches!(m.getattr(f.handle), Err(MetaError::NotFound)));
    m.rmdir(&ROOT, R, "d").unwrap();
    assert!(matches!(m.rmdir(&ROOT, R, "d"), Err(MetaError::NotFound)));
    assert_eq!(m.statfs().unwrap(), FsStats { files: 0, dirs: 1, io_servers: 4, name_max: 255 });
}

#[test]
fn unlinked_objects_stay_orphans_until_forgotten() {
    let d = tempfile::tempdir().unwrap();
    let f = {
        let m = store(&d);
        let f = mkfile(&m, R, "f");
        m.unlink(&ROOT, R, "f").unwrap();
        f
    };
    let m = store(&d);
    assert_eq!(m.orphans().unwrap(), vec![Objects { handle: f.handle, layout: f.layout }]);
    m.forget_orphan(f.handle).unwrap();
    assert!(m.orphans().unwrap().is_empty());
}

#[test]
fn readdir_pages_in_stable_name_order() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    for n in ["e", "b", "a", "d", "c", "g", "f"] {
        mkfile(&m, R, n);
    }
    m.mkdir(&ROOT, R, "dir", P).unwrap();
    let (p1, more) = m.readdir(&ROOT, R, None, 3).unwrap();
    assert!(more);
    let n1: Vec<_> = p1.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(n1, ["a", "b", "c"]);
    // Removing the resume point and adding an earlier name does not disturb the next page.
    m.unlink(&ROOT, R, "c").unwrap();
    mkfile(&m, R, "a0");
    let (p2, more) = m.readdir(&ROOT, R, Some("c"), 3).unwrap();
    assert!(more);
    let n2: Vec<_> = p2.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(n2, ["d", "dir", "e"]);
    assert_eq!(p2[1].kind, FileKind::Dir);
    let (p3, more) = m.readdir(&ROOT, R, Some("e"), 3).unwrap();
    assert!(!more);
    assert_eq!(p3.len(), 2);
    let (p4, more) = m.readdir(&ROOT, R, Some("g"), 3).unwrap();
    assert!(p4.is_empty() && !more);
    // Exactly a full page at the end says no more.
    assert!(!m.readdir(&ROOT, R, Some("e"), 2).unwrap().1);
    assert!(matches!(m.readdir(&ROOT, p1[0].handle, None, 3), Err(MetaError::NotDir)));
}

#[test]
fn readdir_pages_are_capped_at_the_wire_limit() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    for i in 0..MAX_READDIR + 1 {
        m.mkdir(&ROOT, R, &format!("{i:04}"), P).unwrap();
    }
    let (page, more) = m.readdir(&ROOT, R, None, usize::MAX).unwrap();
    assert_eq!((page.len(), more), (MAX_READDIR, true));
}

#[test]
fn rename_within_and_across_directories() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let f = mkfile(&m, R, "a");
    assert_eq!(m.rename(&ROOT, R, "a", R, "b").unwrap(), None);
    assert_eq!(names(&m, R), ["b"]);
    let (dir, _) = m.mkdir(&ROOT, R, "d", P).unwrap();
    m.rename(&ROOT, R, "b", dir, "c").unwrap();
    assert_eq!(m.resolve("/d/c").unwrap(), f.handle);
    assert_eq!(names(&m, R), ["d"]);
    // Directories move with their contents.
    let (e, _) = m.mkdir(&ROOT, R, "e", P).unwrap();
    m.rename(&ROOT, R, "d", e, "d2").unwrap();
    assert_eq!(m.resolve("e/d2/c").unwrap(), f.handle);
    assert_eq!(m.resolve("/e/d2/..").unwrap(), e);
    // Same entry: nothing happens.
    assert_eq!(m.rename(&ROOT, dir, "c", dir, "c").unwrap(), None);
    assert!(matches!(m.rename(&ROOT, R, "missing", R, "x"), Err(MetaError::NotFound)));
}

#[test]
fn rename_replaces_a_file_target() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let a = mkfile(&m, R, "a");
    let b = mkfile(&m, R, "b");
    let replaced = m.rename(&ROOT, R, "a", R, "b").unwrap();
    assert_eq!(replaced, Some(Objects { handle: b.handle, layout: b.layout }));
    assert_eq!(m.lookup(&ROOT, R, "b").unwrap().0, a.handle);
    assert_eq!(names(&m, R), ["b"]);
    assert_eq!(m.orphans().unwrap().len(), 1);
    assert_eq!(m.statfs().unwrap().files, 1);
}

#[test]
fn rename_refusals() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    mkfile(&m, R, "f");
    let (dir, _) = m.mkdir(&ROOT, R, "d", P).unwrap();
    let (full, _) = m.mkdir(&ROOT, R, "full", P).unwrap();
    mkfile(&m, full, "x");
    m.mkdir(&ROOT, R, "empty", P).unwrap();
    assert_eq!(m.rename(&ROOT, R, "d", R, "f").unwrap_err().errno(), Errno::ENOTDIR);
    assert_eq!(m.rename(&ROOT, R, "f", R, "d").unwrap_err().errno(), Errno::EISDIR);
    assert_eq!(m.rename(&ROOT, R, "d", R, "full").unwrap_err().errno(), Errno::ENOTEMPTY);
    let (sub, _) = m.mkdir(&ROOT, dir, "sub", P).unwrap();
    assert_eq!(m.rename(&ROOT, R, "d", sub, "loop").unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.rename(&ROOT, R, "d", dir, "self").unwrap_err().errno(), Errno::EINVAL);
    assert!(matches!(m.rename(&ROOT, R, "f", Handle(12345), "x"), Err(MetaError::NotFound)));
    // Nothing changed, then a directory replaces an empty one.
    assert_eq!(names(&m, R), ["d", "empty", "f", "full"]);
    assert_eq!(m.rename(&ROOT, R, "d", R, "empty").unwrap(), None);
    assert_eq!(names(&m, R), ["empty", "f", "full"]);
    assert_eq!(m.resolve("/empty/sub").unwrap(), sub);
    assert_eq!(m.statfs().unwrap().dirs, 4);
}

#[test]
fn symbolic_links_are_records_without_objects() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let (dir, _) = m.mkdir(&ROOT, R, "dir", P).unwrap();
    let f = mkfile(&m, dir, "f");
    let (l, a) = m.symlink(&ROOT, R, "l", "dir/f", P).unwrap();
    assert_eq!((a.kind, a.mode, a.size, a.nlink, a.uid, a.gid), (FileKind::Symlink, 0o777, 5, 1, 10, 20));
    assert_eq!(m.lookup(&ROOT, R, "l").unwrap(), (l, a.clone()));
    assert_eq!(m.readlink(l).unwrap(), "dir/f");
    let kinds: Vec<_> = m
        .readdir(&ROOT, R, None, 10)
        .unwrap()
        .0
        .into_iter()
        .map(|e| (e.name.into_string(), e.kind))
        .collect();
    assert_eq!(kinds, [("dir".to_string(), FileKind::Dir), ("l".to_string(), FileKind::Symlink)]);
    assert_eq!((m.statfs().unwrap().files, m.statfs().unwrap().dirs), (2, 2));
    // What a link is not.
    assert_eq!(m.open_file(&ROOT, l, Rights::READ_WRITE).unwrap_err().errno(), Errno::ELOOP);
    assert_eq!(m.readlink(f.handle).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.readlink(dir).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(
        m.setattr(&ROOT, l, &SetAttr { size: Some(0), ..Default::default() }).unwrap_err().errno(),
        Errno::EINVAL
    );
    assert_eq!(
        m.setattr(&ROOT, l, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap_err().errno(),
        Errno::EINVAL
    );
    assert_eq!(m.getattr(l).unwrap(), a);
    let t = Timestamp { secs: 5, nsecs: 6 };
    assert_eq!(
        m.setattr(&ROOT, l, &SetAttr { mtime: Some(SetTime::At(t)), ..Default::default() })
            .unwrap()
            .attr
            .mtime,
        t
    );
    assert_eq!(m.rmdir(&ROOT, R, "l").unwrap_err().errno(), Errno::ENOTDIR);
    // Bad links are refused and leave nothing.
    assert_eq!(m.symlink(&ROOT, R, "l", "x", P).unwrap_err().errno(), Errno::EEXIST);
    assert_eq!(m.symlink(&ROOT, R, "e", "", P).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.symlink(&ROOT, R, "n", "a\0b", P).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.symlink(&ROOT, R, "..", "x", P).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.symlink(&ROOT, f.handle, "x", "x", P).unwrap_err().errno(), Errno::ENOTDIR);
    let long = "t".repeat(MAX_LINK_TARGET + 1);
    assert_eq!(m.symlink(&ROOT, R, "long", &long, P).unwrap_err().errno(), Errno::ENAMETOOLONG);
    let (longest, _) = m.symlink(&ROOT, R, "longest", &long[1..], P).unwrap();
    assert_eq!(m.readlink(longest).unwrap(), long[1..]);
    assert_eq!(names(&m, R), ["dir", "l", "longest"]);
    // Renamed, it keeps its target; replaced or unlinked, it leaves no orphan and no target.
    assert_eq!(m.rename(&ROOT, R, "l", dir, "l2").unwrap(), None);
    assert_eq!(m.readlink(l).unwrap(), "dir/f");
    let g = mkfile(&m, R, "g");
    assert_eq!(m.rename(&ROOT, R, "g", dir, "l2").unwrap(), None);
    assert_eq!(m.lookup(&ROOT, dir, "l2").unwrap().0, g.handle);
    assert!(matches!(m.readlink(l), Err(MetaError::NotFound)));
    assert_eq!(m.unlink(&ROOT, R, "longest").unwrap(), None);
    assert!(matches!(m.readlink(longest), Err(MetaError::NotFound)));
    assert!(m.orphans().unwrap().is_empty());
    let r = m.db.begin_read().unwrap();
    assert!(r.open_table(SYMLINKS).unwrap().is_empty().unwrap(), "no target outlives its link");
    assert_eq!(m.statfs().unwrap().files, 2);
}

#[test]
fn symbolic_links_survive_reopen() {
    let d = tempfile::tempdir().unwrap();
    let l = store(&d).symlink(&ROOT, R, "l", "/some/where", P).unwrap().0;
    let m = store(&d);
    assert_eq!(m.readlink(l).unwrap(), "/some/where");
    assert_eq!(m.lookup(&ROOT, R, "l").unwrap().1.kind, FileKind::Symlink);
}

#[test]
fn setattr_and_truncate() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let f = mkfile(&m, R, "f");
    let set = SetAttr { mode: Some(0o600), uid: Some(7), size: Some(1_000_000), ..Default::default() };
    let out = m.setattr(&ROOT, f.handle, &set).unwrap();
    assert_eq!((out.attr.mode, out.attr.uid, out.attr.gid, out.attr.size), (0o600, 7, 20, 1_000_000));
    assert_eq!(out.truncate, Some((f.layout, 1_000_000)));
    assert_eq!(m.getattr(f.handle).unwrap(), out.attr);
    let t = Timestamp { secs: 5, nsecs: 6 };
    let out =
        m.setattr(&ROOT, f.handle, &SetAttr { mtime: Some(SetTime::At(t)), ..Default::default() }).unwrap();
    assert_eq!((out.attr.mtime, out.truncate), (t, None));
    let e = m.setattr(&ROOT, R, &SetAttr { size: Some(0), ..Default::default() }).unwrap_err();
    assert_eq!(e.errno(), Errno::EISDIR);
    assert!(matches!(m.setattr(&ROOT, Handle(999), &SetAttr::default()), Err(MetaError::NotFound)));
}

#[test]
fn namespace_survives_reopen() {
    let d = tempfile::tempdir().unwrap();
    let (f, dir, last) = {
        let m = store(&d);
        let (dir, _) = m.mkdir(&ROOT, R, "dir", P).unwrap();
        m.setstripe(&ROOT, dir, Some(LayoutSpec { pcount: Some(1), ..Default::default() })).unwrap();
        let f = mkfile(&m, dir, "file");
        m.setattr(&ROOT, f.handle, &SetAttr { size: Some(42), ..Default::default() }).unwrap();
        let (last, _) = m.mkdir(&ROOT, dir, "sub", P).unwrap();
        (f, dir, last)
    };
    let m = store(&d);
    assert_eq!(m.resolve("/dir/file").unwrap(), f.handle);
    assert_eq!(m.getattr(f.handle).unwrap().size, 42);
    assert_eq!(m.open_file(&ROOT, f.handle, Rights::READ_WRITE).unwrap().layout, f.layout);
    assert_eq!(names(&m, dir), ["file", "sub"]);
    assert_eq!(m.getstripe(dir).unwrap().default.unwrap().pcount, Some(1));
    assert_eq!(m.statfs().unwrap(), FsStats { files: 1, dirs: 3, io_servers: 4, name_max: 255 });
    let (next, _) = m.mkdir(&ROOT, R, "new", P).unwrap();
    assert!(next.0 > last.0, "handles are never reused");
}

#[test]
fn server_count_change_is_refused() {
    let d = tempfile::tempdir().unwrap();
    drop(store(&d));
    let e = MetaStore::open(&d.path().join("meta.redb"), MetaConfig::new(5)).unwrap_err();
    assert!(matches!(e, MetaError::ServerCountChanged { stored: 4, configured: 5 }));
    assert!(matches!(
        MetaStore::open(&d.path().join("x.redb"), MetaConfig::new(0)),
        Err(MetaError::Invalid(_))
    ));
}

fn user(uid: u32, gid: u32) -> Cred {
    Cred::new(uid, gid, vec![])
}

#[test]
fn hard_links_share_one_record_until_the_last_name_goes() {
    let d = tempfile::tempdir().unwrap();
    let f = {
        let m = store(&d);
        let f = mkfile(&m, R, "a");
        let (dir, _) = m.mkdir(&ROOT, R, "d", P).unwrap();
        let before = m.getattr(f.handle).unwrap();
        let a = m.link(&ROOT, f.handle, dir, "b").unwrap();
        assert_eq!(a.nlink, 2);
        assert!(a.ctime >= before.ctime);
        assert_eq!(m.resolve("/d/b").unwrap(), f.handle);
        assert_eq!(m.statfs().unwrap().files, 1, "one file, two names");
        // Refusals: an existing name, a directory, a missing file or directory.
        assert_eq!(m.link(&ROOT, f.handle, R, "a").unwrap_err().errno(), Errno::EEXIST);
        assert_eq!(m.link(&ROOT, dir, R, "dlink").unwrap_err().errno(), Errno::EPERM);
        assert_eq!(m.link(&ROOT, Handle(999), R, "x").unwrap_err().errno(), Errno::ENOENT);
        assert_eq!(m.link(&ROOT, f.handle, f.handle, "x").unwrap_err().errno(), Errno::ENOTDIR);
        // Renaming one name over the other: nothing happens.
        assert_eq!(m.rename(&ROOT, R, "a", dir, "b").unwrap(), None);
        assert_eq!(names(&m, R), ["a", "d"]);
        // Unlinking one name keeps the file and its objects.
        assert_eq!(m.unlink(&ROOT, R, "a").unwrap(), None);
        assert_eq!(m.getattr(f.handle).unwrap().nlink, 1);
        assert!(m.orphans().unwrap().is_empty());
        assert_eq!(m.open_file(&ROOT, f.handle, Rights::READ_WRITE).unwrap().layout, f.layout);
        // A rename over the last name replaces it: the objects become an orphan.
        let g = mkfile(&m, R, "g");
        m.link(&ROOT, g.handle, R, "g2").unwrap();
        assert_eq!(
            m.rename(&ROOT, R, "g", dir, "b").unwrap(),
            Some(Objects { handle: f.handle, layout: f.layout })
        );
        assert_eq!(m.getattr(g.handle).unwrap().nlink, 2);
        f
    };
    // The orphan outlives a crash (reopen), for the janitor.
    let m = store(&d);
    assert_eq!(m.orphans().unwrap(), vec![Objects { handle: f.handle, layout: f.layout }]);
    assert!(matches!(m.getattr(f.handle), Err(MetaError::NotFound)));
    assert_eq!(m.statfs().unwrap().files, 1);
}

#[test]
fn directories_count_their_subdirectories() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let (a, _) = m.mkdir(&ROOT, R, "a", P).unwrap();
    let (b, _) = m.mkdir(&ROOT, R, "b", P).unwrap();
    m.mkdir(&ROOT, a, "sub", P).unwrap();
    mkfile(&m, a, "f");
    let nlink = |h| m.getattr(h).unwrap().nlink;
    assert_eq!((nlink(R), nlink(a), nlink(b)), (4, 3, 2));
    m.rename(&ROOT, a, "sub", b, "sub").unwrap();
    assert_eq!((nlink(R), nlink(a), nlink(b)), (4, 2, 3));
    m.mkdir(&ROOT, R, "c", P).unwrap();
    m.rename(&ROOT, R, "c", b, "sub").unwrap();
    assert_eq!((nlink(R), nlink(b)), (4, 3), "a replaced directory's link goes");
    m.rmdir(&ROOT, b, "sub").unwrap();
    assert_eq!(nlink(b), 2);
}

#[test]
fn special_files_are_records_without_objects() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    for (name, kind) in [
        ("fifo", FileKind::Fifo),
        ("sock", FileKind::Socket),
        ("chr", FileKind::CharDev(0x0103)),
        ("blk", FileKind::BlockDev(0x0801)),
    ] {
        let (h, a) = m.mknod(&ROOT, R, name, kind, Perm { mode: 0o640, ..P }).unwrap();
        assert_eq!((a.kind, a.mode, a.nlink, a.uid, a.gid, a.size), (kind, 0o640, 1, 10, 20, 0));
        assert_eq!(m.lookup(&ROOT, R, name).unwrap(), (h, a));
        assert_eq!(m.open_file(&ROOT, h, Rights::READ).unwrap_err().errno(), Errno::EINVAL);
        let trunc = SetAttr { size: Some(0), ..Default::default() };
        assert_eq!(m.setattr(&ROOT, h, &trunc).unwrap_err().errno(), Errno::EINVAL);
        assert_eq!(
            m.setattr(&ROOT, h, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap().attr.mode,
            0o600
        );
    }
    assert_eq!(m.mknod(&ROOT, R, "f", FileKind::File, P).unwrap_err().errno(), Errno::EINVAL);
    assert_eq!(m.mknod(&ROOT, R, "fifo", FileKind::Fifo, P).unwrap_err().errno(), Errno::EEXIST);
    assert_eq!(m.statfs().unwrap().files, 4);
    let (l, _) = m.lookup(&ROOT, R, "chr").unwrap();
    m.link(&ROOT, l, R, "chr2").unwrap();
    for name in ["fifo", "sock", "chr", "chr2", "blk"] {
        assert_eq!(m.unlink(&ROOT, R, name).unwrap(), None);
    }
    assert!(m.orphans().unwrap().is_empty());
    assert_eq!((m.statfs().unwrap().files, m.inode_count().unwrap()), (0, 1));
}

#[test]
fn namespace_changes_follow_the_callers_permissions() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let alice = user(1000, 1000);
    let bob = user(1001, 1001);
    let eacces = Errno::EACCES;
    // Root's 0755 directory: only root makes names in it.
    let (home, _) = m.mkdir(&ROOT, R, "home", Perm { mode: 0o755, uid: 0, gid: 0 }).unwrap();
    assert_eq!(m.create(&alice, home, "f", P, None).unwrap_err().errno(), eacces);
    assert_eq!(m.mkdir(&alice, home, "d", P).unwrap_err().errno(), eacces);
    assert_eq!(m.symlink(&alice, home, "l", "x", P).unwrap_err().errno(), eacces);
    assert_eq!(m.mknod(&alice, home, "p", FileKind::Fifo, P).unwrap_err().errno(), eacces);
    // Her own directory.
    let own = Perm { mode: 0o700, uid: 1000, gid: 1000 };
    let (mine, _) = m.mkdir(&ROOT, home, "alice", own).unwrap();
    let c = m.create(&alice, mine, "f", own, None).unwrap();
    m.commit_create(c.handle).unwrap();
    assert_eq!(m.lookup(&bob, mine, "f").unwrap_err().errno(), eacces, "no search permission");
    assert_eq!(m.readdir(&bob, mine, None, 10).unwrap_err().errno(), eacces);
    assert_eq!(m.unlink(&bob, mine, "f").unwrap_err().errno(), eacces);
    assert_eq!(m.rename(&bob, mine, "f", R, "stolen").unwrap_err().errno(), eacces);
    assert_eq!(m.link(&bob, c.handle, R, "l").unwrap_err().errno(), eacces, "root's directory");
    assert_eq!(m.open_file(&bob, c.handle, Rights::READ).unwrap_err().errno(), eacces);
    assert!(m.open_file(&bob, c.handle, Rights::NONE).is_ok(), "stat needs no permission on the file");
    assert!(m.open_file(&alice, c.handle, Rights::READ_WRITE).is_ok());
    // Attributes: only the owner changes the mode, only root the owner.
    let chmod = SetAttr { mode: Some(0o644), ..Default::default() };
    assert_eq!(m.setattr(&bob, c.handle, &chmod).unwrap_err().errno(), Errno::EPERM);
    assert_eq!(m.setattr(&alice, c.handle, &chmod).unwrap().attr.mode, 0o644);
    let chown = SetAttr { uid: Some(1001), ..Default::default() };
    assert_eq!(m.setattr(&alice, c.handle, &chown).unwrap_err().errno(), Errno::EPERM);
    assert_eq!(m.setattr(&ROOT, c.handle, &chown).unwrap().attr.uid, 1001);
    // A sticky, world-writable directory: each removes only their own.
    let (tmp, _) = m.mkdir(&ROOT, R, "tmp", Perm { mode: 0o1777, uid: 0, gid: 0 }).unwrap();
    let c = m.create(&alice, tmp, "hers", Perm { mode: 0o666, ..own }, None).unwrap();
    m.commit_create(c.handle).unwrap();
    assert_eq!(m.unlink(&bob, tmp, "hers").unwrap_err().errno(), Errno::EPERM);
    assert_eq!(m.rename(&bob, tmp, "hers", tmp, "his").unwrap_err().errno(), Errno::EPERM);
    let (theirs, _) = m.mkdir(&bob, tmp, "bobdir", Perm { mode: 0o777, uid: 1001, gid: 1001 }).unwrap();
    assert_eq!(m.rename(&alice, tmp, "hers", tmp, "bobdir").unwrap_err().errno(), Errno::EISDIR);
    assert_eq!(m.rmdir(&alice, tmp, "bobdir").unwrap_err().errno(), Errno::EPERM);
    // Moving a directory to another parent needs write permission on it (its `..` changes).
    let (ro, _) = m.mkdir(&alice, tmp, "ro", Perm { mode: 0o555, uid: 1000, gid: 1000 }).unwrap();
    assert_eq!(m.rename(&alice, tmp, "ro", theirs, "ro").unwrap_err().errno(), eacces);
    assert!(m.rename(&alice, tmp, "ro", tmp, "ro2").is_ok(), "within one directory it may");
    assert_eq!(m.resolve("/tmp/ro2").unwrap(), ro);
    assert!(m.unlink(&alice, tmp, "hers").is_ok());
    assert!(m.rmdir(&bob, tmp, "bobdir").is_ok());
}

#[test]
fn new_entries_in_set_group_id_directories_take_its_group() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let (shared, _) = m.mkdir(&ROOT, R, "shared", Perm { mode: 0o2777, uid: 0, gid: 50 }).unwrap();
    let alice = user(1000, 1000);
    let own = Perm { mode: 0o755, uid: 1000, gid: 1000 };
    let (sub, a) = m.mkdir(&alice, shared, "sub", own).unwrap();
    assert_eq!((a.gid, a.mode), (50, 0o2755));
    assert_eq!(m.getattr(sub).unwrap().gid, 50);
    let c = m.create(&alice, shared, "f", own, None).unwrap();
    assert_eq!((c.attr.gid, c.attr.mode), (50, 0o755));
}

#[test]
fn times_to_now_come_from_the_servers_clock_and_changes_set_ctime() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    let f = mkfile(&m, R, "f");
    let old = Timestamp { secs: 5, nsecs: 6 };
    let set = SetAttr { atime: Some(SetTime::At(old)), mtime: Some(SetTime::At(old)), ..Default::default() };
    let a = m.setattr(&ROOT, f.handle, &set).unwrap().attr;
    assert_eq!((a.atime, a.mtime), (old, old));
    assert!(a.ctime > old);
    // UTIME_OMIT for atime (None), UTIME_NOW for mtime.
    let b = m
        .setattr(&ROOT, f.handle, &SetAttr { mtime: Some(SetTime::Now), ..Default::default() })
        .unwrap()
        .attr;
    assert_eq!(b.atime, old);
    assert!(b.mtime >= a.ctime && b.ctime >= a.ctime);
    // Whoever may write may set now; only the owner sets other times.
    let other = user(1001, 1001);
    let rw = SetAttr { mode: Some(0o666), ..Default::default() };
    m.setattr(&ROOT, f.handle, &rw).unwrap();
    assert!(
        m.setattr(&other, f.handle, &SetAttr { atime: Some(SetTime::Now), ..Default::default() }).is_ok()
    );
    let given = SetAttr { atime: Some(SetTime::At(old)), ..Default::default() };
    assert_eq!(m.setattr(&other, f.handle, &given).unwrap_err().errno(), Errno::EPERM);
    // A name change sets the file's change time (link, unlink of another name, rename).
    let c0 = m.getattr(f.handle).unwrap().ctime;
    m.link(&ROOT, f.handle, R, "g").unwrap();
    let c1 = m.getattr(f.handle).unwrap().ctime;
    m.unlink(&ROOT, R, "g").unwrap();
    let c2 = m.getattr(f.handle).unwrap().ctime;
    m.rename(&ROOT, R, "f", R, "h").unwrap();
    let c3 = m.getattr(f.handle).unwrap().ctime;
    assert!(c0 <= c1 && c1 <= c2 && c2 <= c3 && c0 < c3);
}

#[test]
fn a_caller_other_than_root_cannot_create_entries_for_someone_else() {
    let d = tempfile::tempdir().unwrap();
    let m = store(&d);
    m.setattr(&ROOT, R, &SetAttr { mode: Some(0o777), ..Default::default() }).unwrap();
    let alice = Cred::new(1000, 1000, vec![50]);
    let roots = Perm { mode: 0o4755, uid: 0, gid: 0 };
    let c = m.create(&alice, R, "f", roots, None).unwrap();
    assert_eq!((c.attr.uid, c.attr.gid), (1000, 1000), "owned by the caller, in its group");
    let (_, a) = m.mkdir(&alice, R, "d", Perm { gid: 50, ..roots }).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 50), "a supplementary group may be asked for");
    let (_, a) = m.symlink(&alice, R, "l", "f", roots).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000));
    let (_, a) = m.mknod(&alice, R, "p", FileKind::Fifo, roots).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000));
    // Root makes entries for anyone.
    let (_, a) = m.mkdir(&ROOT, R, "theirs", Perm { mode: 0o755, uid: 7, gid: 8 }).unwrap();
    assert_eq!((a.uid, a.gid), (7, 8));
}

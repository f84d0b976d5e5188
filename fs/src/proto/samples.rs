//! The fuzz target's entry point and one sample of every message shape (the seeds of the
//! committed corpus).

use super::attr::{Attr, Cred, DirEntry, FileKind, LayoutSpec, SetAttr, SetTime, Timestamp};
use super::bounded::{BoundedString, BoundedVec};
use super::envelope::{Envelope, ErrorReply, Message, Reply, decode, encode, error_reply};
use super::error::ProtoError;
use super::io::{Descriptor, IoReply, IoRequest, ObjectSize};
use super::limits::MAX_IO_BYTES;
use super::meta::{AttrOf, MetaCall, MetaReply, MetaRequest};
use super::name::{LinkTarget, Name};
use super::stats::{DiskSpace, Fallbacks, FsStats, PathStats, ServerStats, ServerStatus};
use crate::capability::Rights;
use crate::errno::Errno;
use crate::handle::Handle;
use crate::layout::{Extent, Layout, View};

/// Entry point of the `fs_proto` fuzz target and the corpus replay test: decodes `data` as every
/// message kind; whatever decodes must re-encode and decode to the same message, and whatever
/// does not must yield an encodable error reply. Panics only if one of those invariants breaks.
pub fn fuzz_one(data: &[u8]) {
    fn check<T: Message + PartialEq + 'static, R: Reply>(data: &[u8]) {
        match decode::<T>(data) {
            Ok(env) => {
                let bytes = encode(&env).expect("a decoded message re-encodes");
                assert!(bytes.len() <= data.len(), "re-encoding grew the message");
                let again = decode::<T>(&bytes).expect("a re-encoded message decodes");
                assert_eq!(env, again);
                if let Some(IoRequest::Read { desc, .. } | IoRequest::Write { desc, .. }) =
                    (&env.body as &dyn std::any::Any).downcast_ref::<IoRequest>()
                {
                    // Expanding a validated descriptor is bounded and does not panic.
                    assert!(desc.total() <= MAX_IO_BYTES);
                }
            }
            Err(e) => {
                let reply = error_reply::<R>(&e);
                encode(&reply).expect("an error reply encodes");
            }
        }
    }
    check::<MetaCall, MetaReply>(data);
    check::<MetaReply, MetaReply>(data);
    check::<IoRequest, IoReply>(data);
    check::<IoReply, IoReply>(data);
}

/// Seed messages: one of every request and reply shape (the committed fuzz corpus is made from
/// these; see `fs/tests/fuzz_corpus.rs`).
pub fn sample_messages() -> Vec<(&'static str, Vec<u8>)> {
    let key = crate::capability::CapabilityKey::new(b"sample-cluster-key-0123").expect("valid key");
    let cap = key.mint(Handle(0x1234), Rights::READ_WRITE, 2_000_000_000, 9);
    let name = |s: &str| Name::new(s).expect("short name");
    let link = |s: &str| LinkTarget::new(s).expect("short target");
    let t = Timestamp { secs: 1_700_000_000, nsecs: 5 };
    let attr = Attr {
        kind: FileKind::File,
        mode: 0o644,
        uid: 1,
        gid: 2,
        size: 3,
        nlink: 1,
        atime: t,
        mtime: t,
        ctime: t,
    };
    let layout = Layout { base: 1, pcount: 4, ssize: 65536 };
    let spec = LayoutSpec { base: None, pcount: Some(2), ssize: Some(1 << 20) };
    let status = ServerStatus {
        version: BoundedString::truncating("0.1.0"),
        uptime_ns: 3_600_000_000_000,
        requests: 42,
        in_flight: 1,
        errors: 2,
        disk: DiskSpace { total: 1 << 40, free: 1 << 39, avail: 1 << 38, fs_id: 0x5eed_f00d },
    };
    let meta_req = vec![
        ("meta_statfs", MetaRequest::Statfs),
        ("meta_lookup", MetaRequest::Lookup { parent: Handle::ROOT, name: name("a.txt") }),
        ("meta_getattr", MetaRequest::Getattr { handle: Handle(7) }),
        (
            "meta_setattr",
            MetaRequest::Setattr {
                handle: Handle(7),
                set: SetAttr { mode: Some(0o600), size: Some(10), ..Default::default() },
            },
        ),
        (
            "meta_setattr_times",
            MetaRequest::Setattr {
                handle: Handle(7),
                set: SetAttr {
                    atime: Some(SetTime::Now),
                    mtime: Some(SetTime::At(t)),
                    opened_for_write: true,
                    wrote: true,
                    sync: true,
                    ..Default::default()
                },
            },
        ),
        (
            "meta_create",
            MetaRequest::Create {
                parent: Handle::ROOT,
                name: name("f"),
                mode: 0o644,
                uid: 0,
                gid: 0,
                layout: Some(spec),
                rights: Rights::READ_WRITE,
            },
        ),
        ("meta_open", MetaRequest::Open { handle: Handle(7), rights: Rights::READ }),
        (
            "meta_mkdir",
            MetaRequest::Mkdir { parent: Handle::ROOT, name: name("d"), mode: 0o755, uid: 0, gid: 0 },
        ),
        ("meta_rmdir", MetaRequest::Rmdir { parent: Handle::ROOT, name: name("d") }),
        ("meta_unlink", MetaRequest::Unlink { parent: Handle::ROOT, name: name("f") }),
        (
            "meta_rename",
            MetaRequest::Rename {
                src_parent: Handle::ROOT,
                src_name: name("a"),
                dst_parent: Handle(9),
                dst_name: name("b"),
            },
        ),
        ("meta_readdir", MetaRequest::Readdir { dir: Handle::ROOT, after: Some(name("m")), max: 100 }),
        ("meta_getstripe", MetaRequest::GetStripe { handle: Handle(7) }),
        ("meta_setstripe", MetaRequest::SetStripe { dir: Handle::ROOT, spec: Some(spec) }),
        (
            "meta_symlink",
            MetaRequest::Symlink {
                parent: Handle::ROOT,
                name: name("l"),
                target: link("../d/f"),
                uid: 0,
                gid: 0,
            },
        ),
        ("meta_readlink", MetaRequest::Readlink { handle: Handle(7) }),
        ("meta_status", MetaRequest::Status),
        ("meta_sync", MetaRequest::Sync),
        ("meta_link", MetaRequest::Link { handle: Handle(7), parent: Handle(9), name: name("l2") }),
        (
            "meta_mknod_fifo",
            MetaRequest::Mknod {
                parent: Handle::ROOT,
                name: name("p"),
                kind: FileKind::Fifo,
                mode: 0o644,
                uid: 1,
                gid: 2,
            },
        ),
        (
            "meta_mknod_chr",
            MetaRequest::Mknod {
                parent: Handle::ROOT,
                name: name("c"),
                kind: FileKind::CharDev(0x0103),
                mode: 0o600,
                uid: 0,
                gid: 0,
            },
        ),
        (
            "meta_getattr_many",
            MetaRequest::GetattrMany { handles: BoundedVec::new(vec![Handle(7), Handle(9)]).expect("two") },
        ),
    ];
    let cred = Cred::new(1000, 100, vec![4, 24, 27]);
    let entries = BoundedVec::new(vec![DirEntry { name: name("x"), handle: Handle(3), kind: FileKind::Dir }])
        .expect("one entry");
    let meta_rep = vec![
        ("metarep_statfs", MetaReply::Statfs(FsStats { files: 1, dirs: 2, io_servers: 4, name_max: 255 })),
        ("metarep_entry", MetaReply::Entry { handle: Handle(7), attr: attr.clone() }),
        ("metarep_attr", MetaReply::Attr(attr.clone())),
        (
            "metarep_opened",
            MetaReply::Opened { handle: Handle(0x1234), attr: attr.clone(), layout, cap: cap.clone() },
        ),
        ("metarep_done", MetaReply::Done),
        ("metarep_dir", MetaReply::Dir { entries, more: true }),
        ("metarep_stripe", MetaReply::Stripe { layout: Some(layout), default: Some(spec) }),
        ("metarep_link", MetaReply::Link(link("/d/f"))),
        ("metarep_error", MetaReply::Error(ErrorReply::new(Errno::ENOENT, "no such entry"))),
        ("metarep_status", MetaReply::Status(status.clone())),
        (
            "metarep_attrs",
            MetaReply::Attrs(
                BoundedVec::new(vec![
                    AttrOf::Found { attr, file: Some((layout, cap.clone())) },
                    AttrOf::Failed(Errno::ENOENT),
                ])
                .expect("two"),
            ),
        ),
    ];
    let list = Descriptor::list(vec![Extent::new(0, 4096), Extent::new(65536, 100)]).expect("two pieces");
    let strided = Descriptor::Strided {
        layout,
        pnum: 2,
        view: View { offset: 10, gsize: 100, stride: 1000 },
        pos: 5,
        len: 5000,
    };
    let io_req = vec![
        ("io_ping", IoRequest::Ping),
        ("io_create", IoRequest::CreateObject { cap: cap.clone() }),
        ("io_remove", IoRequest::RemoveObject { cap: cap.clone() }),
        ("io_truncate", IoRequest::TruncateObject { cap: cap.clone(), size: 12345 }),
        ("io_getsize", IoRequest::GetSize { cap: cap.clone() }),
        ("io_read_list", IoRequest::Read { cap: cap.clone(), desc: list.clone() }),
        ("io_write_list", IoRequest::Write { cap: cap.clone(), desc: list }),
        ("io_read_strided", IoRequest::Read { cap: cap.clone(), desc: strided.clone() }),
        ("io_write_strided", IoRequest::Write { cap: cap.clone(), desc: strided }),
        ("io_sync", IoRequest::Sync { cap: cap.clone() }),
        ("io_stats", IoRequest::Stats),
        ("io_status", IoRequest::Status),
        ("io_allocate", IoRequest::Allocate { cap: cap.clone(), off: 65536, len: 1 << 20 }),
        ("io_seek", IoRequest::Seek { cap: cap.clone(), off: 1 << 20, hole: true }),
        ("io_punch", IoRequest::Punch { cap: cap.clone(), off: 4096, len: 1 << 20 }),
        (
            "io_getsizes",
            IoRequest::GetSizes { caps: BoundedVec::new(vec![cap.clone(), cap.clone()]).expect("two") },
        ),
        (
            "io_createmany",
            IoRequest::CreateObjects { caps: BoundedVec::new(vec![cap.clone(), cap]).expect("two") },
        ),
    ];
    let io_rep = vec![
        ("iorep_pong", IoReply::Pong),
        ("iorep_done", IoReply::Done),
        ("iorep_size", IoReply::Size(ObjectSize { size: 99, allocated: 4096 })),
        ("iorep_seek", IoReply::Seek { at: Some(3 << 20), local_size: 4 << 20 }),
        ("iorep_read", IoReply::Read { bytes: 4196, local_size: 70000 }),
        ("iorep_written", IoReply::Written { bytes: 4196 }),
        (
            "iorep_stats",
            IoReply::Stats(ServerStats {
                reads: 1,
                writes: 2,
                mapped: PathStats { reads: 1, writes: 1, bytes: 1 << 20 },
                copied: PathStats { reads: 0, writes: 1, bytes: 4096 },
                fallbacks: Fallbacks { unordered: 1, beyond_map: 0, no_fallocate: 0 },
                disk: DiskSpace { total: 1 << 40, free: 1 << 39, avail: 1 << 38, fs_id: 0x5eed_f00d },
                ..Default::default()
            }),
        ),
        ("iorep_error", IoReply::Error(ErrorReply::new(Errno::ENOSPC, "disk full"))),
        ("iorep_status", IoReply::Status(status)),
        (
            "iorep_sizes",
            IoReply::Sizes(
                BoundedVec::new(vec![Some(ObjectSize { size: 70000, allocated: 73728 }), None]).expect("two"),
            ),
        ),
    ];
    let mut out = Vec::new();
    let mut id = 0u64;
    let mut push = |name, bytes: Result<Vec<u8>, ProtoError>| {
        out.push((name, bytes.expect("samples encode")));
    };
    for (n, req) in meta_req {
        id += 1;
        push(n, encode(&Envelope::new(id, MetaCall { cred: cred.clone(), req })));
    }
    for (n, m) in meta_rep {
        id += 1;
        push(n, encode(&Envelope::new(id, m)));
    }
    for (n, m) in io_req {
        id += 1;
        push(n, encode(&Envelope::new(id, m)));
    }
    for (n, m) in io_rep {
        id += 1;
        push(n, encode(&Envelope::new(id, m)));
    }
    out
}

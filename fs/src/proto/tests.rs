//! Round trips, limits and validation of every message.

use super::*;
use crate::capability::{Capability, Rights};
use crate::errno::Errno;
use crate::layout::{Extent, Layout, View};

fn cap() -> Capability {
    crate::capability::CapabilityKey::new(b"test-cluster-key-0123").unwrap().mint(
        Handle(5),
        Rights::ALL,
        10,
        1,
    )
}

fn root(req: MetaRequest) -> MetaCall {
    MetaCall { cred: Cred::root(), req }
}

#[test]
fn every_sample_round_trips() {
    let samples = sample_messages();
    assert!(samples.len() >= 39);
    for (name, bytes) in &samples {
        assert_eq!(&bytes[0..4], &MAGIC, "{name}");
        let ok = decode::<MetaCall>(bytes).is_ok() as u8
            + decode::<MetaReply>(bytes).is_ok() as u8
            + decode::<IoRequest>(bytes).is_ok() as u8
            + decode::<IoReply>(bytes).is_ok() as u8;
        assert_eq!(ok, 1, "{name} decodes as exactly one kind");
        fuzz_one(bytes);
    }
}

#[test]
fn unknown_version_is_a_typed_error_with_the_id() {
    let mut b = encode(&Envelope::new(77, root(MetaRequest::Statfs))).unwrap();
    let next = PROTO_VERSION + 1;
    b[4..6].copy_from_slice(&next.to_le_bytes());
    let e = decode::<MetaCall>(&b).unwrap_err();
    assert_eq!(e, DecodeError { id: Some(77), error: ProtoError::UnknownVersion { got: next } });
    assert_eq!(e.error.errno(), Errno::EPROTONOSUPPORT);
    let reply: Envelope<MetaReply> = error_reply(&e);
    assert_eq!(reply.id, 77);
    assert!(matches!(reply.body, MetaReply::Error(ErrorReply { code: Errno::EPROTONOSUPPORT, .. })));
    encode(&reply).unwrap();
}

#[test]
fn wrong_magic_kind_truncation_and_trailing_bytes_are_refused() {
    let b = encode(&Envelope::new(1, IoRequest::Ping)).unwrap();
    assert_eq!(decode::<IoRequest>(&b[..3]).unwrap_err().error, ProtoError::Truncated(3));
    let mut bad = b.clone();
    bad[0] = b'X';
    assert!(matches!(decode::<IoRequest>(&bad).unwrap_err().error, ProtoError::BadMagic(_)));
    assert_eq!(decode::<IoReply>(&b).unwrap_err().error, ProtoError::WrongKind { got: 3, want: 4 });
    let mut long = b.clone();
    long.push(0);
    assert_eq!(decode::<IoRequest>(&long).unwrap_err().error, ProtoError::TrailingBytes(1));
    // A header with no body at all.
    assert!(matches!(decode::<IoRequest>(&b[..HEADER_LEN]).unwrap_err().error, ProtoError::Malformed(_)));
}

#[test]
fn oversize_input_is_refused_before_decoding() {
    let mut b = encode(&Envelope::new(5, IoRequest::Ping)).unwrap();
    b.resize(MAX_MESSAGE + 1, 0);
    let e = decode::<IoRequest>(&b).unwrap_err();
    assert_eq!(e.id, Some(5));
    assert_eq!(e.error.errno(), Errno::EMSGSIZE);
}

/// A hand-built body whose piece-list length prefix claims 2^32 entries: refused without
/// reserving room for them (postcard withholds a size hint larger than the input, and
/// `BoundedVec` reserves at most the hint).
#[test]
fn huge_list_prefix_is_refused_before_allocating() {
    let mut b =
        encode(&Envelope::new(1, IoRequest::Read { cap: cap(), desc: Descriptor::list(vec![]).unwrap() }))
            .unwrap();
    // The body ends with: variant(Read)… cap… variant(List)=0, len=0. Replace len with a huge varint.
    assert_eq!(b.pop(), Some(0));
    b.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x10]);
    let e = decode::<IoRequest>(&b).unwrap_err();
    assert_eq!(e.id, Some(1));
    assert!(matches!(e.error, ProtoError::Malformed(_)), "{e:?}");
}

#[test]
fn list_limits_are_enforced_both_ways() {
    assert!(Descriptor::list(vec![Extent::new(0, 1); MAX_PIECES + 1]).is_err());
    // A peer that encodes more than MAX_PIECES pieces anyway (bypassing BoundedVec::new).
    let over = Descriptor::List(BoundedVec(vec![Extent::new(0, 1); MAX_PIECES + 1]));
    let body = IoRequest::Write { cap: cap(), desc: over };
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
    b.push(IoRequest::KIND);
    b.extend_from_slice(&3u64.to_le_bytes());
    let b = postcard::to_extend(&body, b).unwrap();
    assert!(b.len() < MAX_MESSAGE);
    // postcard keeps no text for serde's custom errors, so this is a plain Malformed.
    assert!(matches!(decode::<IoRequest>(&b).unwrap_err().error, ProtoError::Malformed(_)));
    let exact = Descriptor::list(vec![Extent::new(0, 1); MAX_PIECES]).unwrap();
    let b = encode(&Envelope::new(4, IoRequest::Write { cap: cap(), desc: exact })).unwrap();
    assert!(decode::<IoRequest>(&b).is_ok());
}

#[test]
fn long_strings_are_refused() {
    let ok = Name::new("n".repeat(MAX_NAME_WIRE)).unwrap();
    assert!(encode(&Envelope::new(1, root(MetaRequest::Lookup { parent: Handle::ROOT, name: ok }))).is_ok());
    assert!(Name::new("n".repeat(MAX_NAME_WIRE + 1)).is_err());
    let over =
        MetaRequest::Lookup { parent: Handle::ROOT, name: BoundedString("n".repeat(MAX_NAME_WIRE + 1)) };
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
    b.push(MetaCall::KIND);
    b.extend_from_slice(&3u64.to_le_bytes());
    let b = postcard::to_extend(&root(over), b).unwrap();
    assert!(matches!(decode::<MetaCall>(&b).unwrap_err().error, ProtoError::Malformed(_)));
    let e = ErrorReply::new(Errno::EIO, "é".repeat(MAX_ERROR_TEXT));
    assert!(e.message.len() <= MAX_ERROR_TEXT);
}

#[test]
fn largest_replies_fit_in_a_message() {
    // Names of the longest length, distinct and in order as a page must be.
    let entry = |i: usize| DirEntry {
        name: Name::new(format!("{i:0>width$}", width = NAME_MAX)).unwrap(),
        handle: Handle(u64::MAX),
        kind: FileKind::File,
    };
    let entries = BoundedVec::new((0..MAX_READDIR).map(entry).collect()).unwrap();
    let b = encode(&Envelope::new(u64::MAX, MetaReply::Dir { entries, more: true })).unwrap();
    assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
    let pieces = vec![Extent::new(u64::MAX / 2, 1); MAX_PIECES];
    let b =
        encode(&Envelope::new(1, IoRequest::Write { cap: cap(), desc: Descriptor::list(pieces).unwrap() }))
            .unwrap();
    assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
    // A batch's attributes, each a file's with the largest numbers.
    let attr = Attr {
        kind: FileKind::File,
        mode: 0o7777,
        uid: u32::MAX,
        gid: u32::MAX,
        size: u64::MAX,
        nlink: u32::MAX,
        atime: Timestamp { secs: i64::MIN, nsecs: 999_999_999 },
        mtime: Timestamp { secs: i64::MIN, nsecs: 999_999_999 },
        ctime: Timestamp { secs: i64::MIN, nsecs: 999_999_999 },
    };
    let layout = Layout { base: u32::MAX, pcount: 65536, ssize: 1 << 30 };
    let found = AttrOf::Found { attr, file: Some((layout, cap())) };
    let b =
        encode(&Envelope::new(u64::MAX, MetaReply::Attrs(BoundedVec::new(vec![found; MAX_BATCH]).unwrap())))
            .unwrap();
    assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
    let caps = BoundedVec::new(vec![cap(); MAX_BATCH]).unwrap();
    let b = encode(&Envelope::new(u64::MAX, IoRequest::GetSizes { caps })).unwrap();
    assert!(b.len() <= MAX_MESSAGE, "{}", b.len());
}

#[test]
fn semantic_validation() {
    let bad_layout = Layout { base: 0, pcount: 0, ssize: 1 };
    let d = Descriptor::Strided { layout: bad_layout, pnum: 0, view: View::contiguous(), pos: 0, len: 1 };
    assert!(encode(&Envelope::new(1, IoRequest::Read { cap: cap(), desc: d })).is_err());
    let l = Layout { base: 0, pcount: 2, ssize: 1 };
    let d = Descriptor::Strided { layout: l, pnum: 2, view: View::contiguous(), pos: 0, len: 1 };
    assert_eq!(
        encode(&Envelope::new(1, IoRequest::Read { cap: cap(), desc: d })).unwrap_err(),
        ProtoError::Invalid("pnum")
    );
    let tiny = View { offset: 0, gsize: 1, stride: 2 };
    let d = Descriptor::Strided { layout: l, pnum: 0, view: tiny, pos: 0, len: MAX_VIEW_BLOCKS + 1 };
    assert!(matches!(
        encode(&Envelope::new(1, IoRequest::Read { cap: cap(), desc: d })).unwrap_err(),
        ProtoError::Limit { what: "view blocks", .. }
    ));
    let d = Descriptor::list(vec![Extent::new(u64::MAX, 1)]).unwrap();
    assert!(encode(&Envelope::new(1, IoRequest::Write { cap: cap(), desc: d })).is_err());
    let d = Descriptor::list(vec![Extent::new(0, MAX_IO_BYTES), Extent::new(0, 1)]).unwrap();
    assert!(encode(&Envelope::new(1, IoRequest::Write { cap: cap(), desc: d })).is_err());
    let bad_time = SetTime::At(Timestamp { secs: 0, nsecs: 1_000_000_000 });
    let set = SetAttr { atime: Some(bad_time), ..Default::default() };
    assert!(encode(&Envelope::new(1, root(MetaRequest::Setattr { handle: Handle(2), set }))).is_err());
    let r = root(MetaRequest::Readdir { dir: Handle::ROOT, after: None, max: 0 });
    assert_eq!(encode(&Envelope::new(1, r)).unwrap_err().errno(), Errno::EINVAL);
    // A new layout's stripes are at least a page, whoever asks (the meta server decodes this);
    // layouts already made may have smaller ones.
    let create = |ssize| {
        let layout = Some(LayoutSpec { base: None, pcount: Some(2), ssize: Some(ssize) });
        let req = MetaRequest::Create {
            parent: Handle::ROOT,
            name: Name::new("f".to_string()).unwrap(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            layout,
            rights: Rights::READ_WRITE,
        };
        encode(&Envelope::new(1, root(req)))
    };
    assert_eq!(create(4095).unwrap_err().errno(), Errno::EINVAL);
    assert!(create(crate::layout::MIN_SSIZE).is_ok());
    let d = Descriptor::Strided { layout: l, pnum: 0, view: View::contiguous(), pos: 0, len: 1 };
    assert!(
        encode(&Envelope::new(1, IoRequest::Read { cap: cap(), desc: d })).is_ok(),
        "a made layout of 1 B"
    );
    // Replies' attributes too: a time past a second's nanoseconds, a mode with type bits.
    let attr_with = |f: &dyn Fn(&mut Attr)| {
        let t = Timestamp { secs: 1_700_000_000, nsecs: 5 };
        let mut a = Attr {
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
        };
        f(&mut a);
        a
    };
    let t = Timestamp { secs: i64::MAX, nsecs: 1_000_000_000 };
    let bad = [
        (attr_with(&|a| a.mtime = t), "timestamp nanoseconds"),
        (attr_with(&|a| a.ctime = t), "timestamp nanoseconds"),
        (attr_with(&|a| a.mode = 0o100644), "mode"),
    ];
    for (a, what) in bad {
        let r = MetaReply::Entry { handle: Handle(2), attr: a.clone() };
        assert_eq!(encode(&Envelope::new(1, r)).unwrap_err(), ProtoError::Invalid(what));
        assert!(encode(&Envelope::new(1, MetaReply::Attr(a))).is_err());
    }
    assert!(encode(&Envelope::new(1, MetaReply::Attr(attr_with(&|_| {})))).is_ok());
    // A link target is non-empty and has no NUL, in a request and in a reply.
    for t in ["", "a\0b"] {
        let target = LinkTarget::new(t).unwrap();
        let r = root(MetaRequest::Symlink {
            parent: Handle::ROOT,
            name: Name::new("l").unwrap(),
            target: target.clone(),
            uid: 0,
            gid: 0,
        });
        assert_eq!(encode(&Envelope::new(1, r)).unwrap_err(), ProtoError::Invalid("link target"));
        assert_eq!(
            encode(&Envelope::new(1, MetaReply::Link(target))).unwrap_err(),
            ProtoError::Invalid("link target")
        );
    }
    assert!(LinkTarget::new("t".repeat(MAX_LINK_TARGET + 1)).is_err());
    let longest = MetaReply::Link(LinkTarget::new("t".repeat(MAX_LINK_TARGET)).unwrap());
    assert!(encode(&Envelope::new(1, longest)).is_ok());
}

#[test]
fn credentials_and_new_requests_are_bounded_and_checked() {
    // A mknod of a kind that is not special is refused on both ends.
    for kind in [FileKind::File, FileKind::Dir, FileKind::Symlink] {
        let r = MetaRequest::Mknod {
            parent: Handle::ROOT,
            name: Name::new("n").unwrap(),
            kind,
            mode: 0,
            uid: 0,
            gid: 0,
        };
        assert_eq!(encode(&Envelope::new(1, root(r))).unwrap_err().errno(), Errno::EINVAL);
    }
    let r = MetaRequest::Mknod {
        parent: Handle::ROOT,
        name: Name::new("n").unwrap(),
        kind: FileKind::Fifo,
        mode: 0o10000,
        uid: 0,
        gid: 0,
    };
    assert_eq!(encode(&Envelope::new(1, root(r))).unwrap_err(), ProtoError::Invalid("mode"));
    // Groups past the bound are dropped when made, refused when decoded.
    assert_eq!(Cred::new(1, 2, (0..MAX_GROUPS as u32 + 5).collect()).groups.len(), MAX_GROUPS);
    let over = MetaCall {
        cred: Cred { uid: 1, gid: 2, groups: BoundedVec((0..MAX_GROUPS as u32 + 1).collect()) },
        req: MetaRequest::Statfs,
    };
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
    b.push(MetaCall::KIND);
    b.extend_from_slice(&3u64.to_le_bytes());
    let b = postcard::to_extend(&over, b).unwrap();
    assert!(matches!(decode::<MetaCall>(&b).unwrap_err().error, ProtoError::Malformed(_)));
    let c = Cred::new(7, 8, vec![9]);
    assert!(c.in_group(8) && c.in_group(9) && !c.in_group(7) && !c.is_root() && Cred::root().is_root());
    // An allocation is a non-empty range that does not wrap.
    for (off, len) in [(0, 0), (u64::MAX, 1)] {
        let r = IoRequest::Allocate { cap: cap(), off, len };
        assert_eq!(encode(&Envelope::new(1, r)).unwrap_err(), ProtoError::Invalid("allocation range"));
    }
    assert_eq!(IoRequest::Allocate { cap: cap(), off: 0, len: 1 }.needed_rights(), Rights::WRITE);
    for (off, len) in [(0, 0), (u64::MAX, 1)] {
        let r = IoRequest::Punch { cap: cap(), off, len };
        assert_eq!(encode(&Envelope::new(1, r)).unwrap_err(), ProtoError::Invalid("allocation range"));
    }
    assert_eq!(IoRequest::Punch { cap: cap(), off: 0, len: 1 }.needed_rights(), Rights::WRITE);
    // A seek looks from an offset `lseek` can take, and needs the right to read.
    let r = IoRequest::Seek { cap: cap(), off: 1 << 63, hole: false };
    assert_eq!(encode(&Envelope::new(1, r)).unwrap_err(), ProtoError::Invalid("seek offset"));
    assert_eq!(IoRequest::Seek { cap: cap(), off: 0, hole: true }.needed_rights(), Rights::READ);
    // Device numbers travel with their kind.
    assert_eq!((FileKind::BlockDev(5).rdev(), FileKind::Fifo.rdev()), (5, 0));
    assert!(FileKind::Socket.is_special() && !FileKind::File.is_special());
}

#[test]
fn disk_space_adds_up_consistently_and_saturates() {
    let a = DiskSpace { total: 100, free: 40, avail: 30, fs_id: 1 };
    let b = DiskSpace { total: 50, free: 80, avail: 90, fs_id: 2 }; // nonsense from a server
    let sum = DiskSpace::default().plus(a).plus(b);
    assert_eq!(sum, DiskSpace { total: 150, free: 90, avail: 80, fs_id: 0 });
    assert_eq!(DiskSpace::sum([a, b]), sum);
    let big = DiskSpace { total: u64::MAX, free: u64::MAX, avail: u64::MAX, fs_id: 0 };
    assert_eq!(big.plus(big), big);
}

#[test]
fn a_sum_counts_a_shared_file_system_once_and_an_unknown_one_every_time() {
    let shared = DiskSpace { total: 100, free: 40, avail: 30, fs_id: 7 };
    let other = DiskSpace { total: 50, free: 20, avail: 10, fs_id: 8 };
    let unknown = DiskSpace { total: 10, free: 5, avail: 5, fs_id: 0 };
    let sum = DiskSpace::sum([shared, other, shared, unknown, unknown, shared]);
    assert_eq!((sum.total, sum.free, sum.avail), (170, 70, 50));
    assert_eq!(DiskSpace::sum([]), DiskSpace::default());
}

#[test]
fn strided_descriptor_matches_the_client_plan() {
    let layout = Layout { base: 1, pcount: 3, ssize: 64 };
    let view = View { offset: 7, gsize: 50, stride: 130 };
    let plan = layout.plan(view.extents(3, 2000).unwrap());
    for sp in plan {
        let d = Descriptor::Strided { layout, pnum: sp.pnum, view, pos: 3, len: 2000 };
        assert_eq!(d.pieces().collect::<Vec<_>>(), sp.pieces);
        assert_eq!(d.total(), sp.bytes);
    }
}

proptest::proptest! {
    /// Random bodies behind a valid header reach the body decoder of every kind.
    #[test]
    fn random_bodies_never_panic(kind in 1u8..=4, body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)) {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        b.push(kind);
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&body);
        fuzz_one(&b);
    }
}

#[test]
fn truncated_prefixes_never_panic() {
    for (_, bytes) in sample_messages() {
        for n in 0..bytes.len() {
            fuzz_one(&bytes[..n]);
        }
        for i in HEADER_LEN..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            fuzz_one(&b);
        }
    }
}

#[test]
fn a_reads_stream_below_an_end_is_the_part_up_to_its_last_byte_there() {
    let list =
        |p: &[(u64, u64)]| Descriptor::list(p.iter().map(|&(o, l)| Extent::new(o, l)).collect()).unwrap();
    let d = list(&[(0, 100), (200, 100), (1000, 50)]);
    assert_eq!(d.stream_below(0), 0, "an empty object: nothing");
    assert_eq!(d.stream_below(40), 40, "into the first piece");
    assert_eq!(d.stream_below(150), 100, "between pieces: the first one whole");
    assert_eq!(d.stream_below(250), 150, "into the second");
    assert_eq!(d.stream_below(1010), 210, "into the last");
    assert_eq!(d.stream_below(u64::MAX), 250, "all of it");
    // Out of order: a later piece below the end takes the stream to it, holes and all.
    let d = list(&[(1000, 50), (0, 100)]);
    assert_eq!(d.stream_below(100), 150);
    assert_eq!(d.stream_below(1020), 150);
    assert_eq!(list(&[]).stream_below(10), 0);
}

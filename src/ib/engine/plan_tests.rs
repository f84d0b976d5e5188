//! The posting rules of [`super`] on chosen limits and policies: no device, no connection.

use bytes::Bytes;

use super::*;
use crate::backend::RequestCmd;
use crate::buffers::buf::{RecvBuf, SendBuf};
use crate::comm::Thresholds;
use crate::op::Payload as UserPayload;

const PEER: PeerId = PeerId(3);
const SL: ServiceLevel = ServiceLevel::Normal;
/// The connection's limits: messages (header included) of 1 KiB by SEND, 8 KiB by ring.
const CAPS: MsgCaps = MsgCaps { recv: 1024, slot: 8192 };
/// Largest payload of an inline message, of a ring message.
const INLINE_ROOM: usize = 1024 - MSG_HDR;
const SLOT_ROOM: usize = 8192 - MSG_HDR;
const INLINE_MAX: usize = 512;
const FAST_MAX: usize = 4096;

/// The table: inline up to 512 bytes, fast RDMA up to 4 KiB, at every service level.
fn policy(forced: Option<Mechanism>) -> Policy {
    let mut p = Policy::for_scheme(crate::addr::Scheme::SoftIb);
    for sl in ServiceLevel::ALL {
        p.set(sl, Thresholds { inline_max: INLINE_MAX, fast_max: FAST_MAX });
    }
    p.force(forced);
    p
}

fn mech(forced: Option<Mechanism>, caps: MsgCaps, len: usize, extra: usize) -> Mechanism {
    mechanism(&policy(forced), caps, len, SL, extra)
}

fn send(forced: Option<Mechanism>, caps: MsgCaps, len: usize, unexpected: bool) -> Result<SendPlan> {
    plan_send(&policy(forced), caps, 9, SL, len, unexpected)
}

fn request(
    forced: Option<Mechanism>,
    caps: MsgCaps,
    header_len: usize,
    len: usize,
    dir: Direction,
) -> RequestPlan {
    plan_request(&policy(forced), caps, OpId(77), 9, SL, header_len, len, dir)
}

const ALL: [Option<Mechanism>; 4] =
    [None, Some(Mechanism::Inline), Some(Mechanism::FastRdma), Some(Mechanism::ServerRdma)];

#[test]
fn empty_payload_always_goes_inline() {
    for forced in ALL {
        for caps in [CAPS, MsgCaps { recv: MSG_HDR, slot: MSG_HDR }] {
            assert_eq!(mech(forced, caps, 0, 0), Mechanism::Inline, "forced {forced:?}, {caps:?}");
            let Ok(SendPlan::Message { mech, via, header }) = send(forced, caps, 0, false) else {
                panic!("an empty send is one message (forced {forced:?})")
            };
            assert_eq!((mech, via, header.len), (Mechanism::Inline, Via::Send, 0));
        }
    }
}

#[test]
fn the_table_decides_at_its_thresholds() {
    let cases = [
        (1, Mechanism::Inline),
        (INLINE_MAX, Mechanism::Inline),
        (INLINE_MAX + 1, Mechanism::FastRdma),
        (FAST_MAX, Mechanism::FastRdma),
        (FAST_MAX + 1, Mechanism::ServerRdma),
    ];
    for (len, want) in cases {
        assert_eq!(mech(None, CAPS, len, 0), want, "{len} bytes");
    }
}

#[test]
fn a_forced_mechanism_falls_to_the_next_one_up_when_the_message_does_not_fit() {
    let inline = Some(Mechanism::Inline);
    let fast = Some(Mechanism::FastRdma);
    let cases = [
        (inline, INLINE_ROOM, Mechanism::Inline),
        (inline, INLINE_ROOM + 1, Mechanism::FastRdma),
        (inline, SLOT_ROOM, Mechanism::FastRdma),
        (inline, SLOT_ROOM + 1, Mechanism::ServerRdma),
        (fast, 1, Mechanism::FastRdma),
        (fast, SLOT_ROOM, Mechanism::FastRdma),
        (fast, SLOT_ROOM + 1, Mechanism::ServerRdma),
        (Some(Mechanism::ServerRdma), 1, Mechanism::ServerRdma),
    ];
    for (forced, len, want) in cases {
        assert_eq!(mech(forced, CAPS, len, 0), want, "forced {forced:?}, {len} bytes");
    }
}

#[test]
fn the_peers_smaller_buffers_move_the_choice_up() {
    let peer = MsgCaps { recv: 256, slot: 2048 };
    let caps = CAPS.with_peer(Some(peer));
    assert_eq!(caps, peer);
    assert_eq!(CAPS.with_peer(None), CAPS, "our own until the peer's are known");
    assert_eq!(CAPS.with_peer(Some(MsgCaps { recv: 4096, slot: 4096 })), MsgCaps { recv: 1024, slot: 4096 });
    // The table says inline, the peer's receive buffers are too small: its ring takes it.
    assert_eq!(mech(None, caps, 256 - MSG_HDR, 0), Mechanism::Inline);
    assert_eq!(mech(None, caps, 256 - MSG_HDR + 1, 0), Mechanism::FastRdma);
    // The table says fast RDMA, the peer's slots are too small: server-based RDMA.
    assert_eq!(mech(None, caps, 2048 - MSG_HDR, 0), Mechanism::FastRdma);
    assert_eq!(mech(None, caps, 2048 - MSG_HDR + 1, 0), Mechanism::ServerRdma);
}

#[test]
fn other_payload_takes_room_from_the_data() {
    let extra = 100;
    let forced = Some(Mechanism::Inline);
    assert_eq!(mech(forced, CAPS, INLINE_ROOM - extra, extra), Mechanism::Inline);
    assert_eq!(mech(forced, CAPS, INLINE_ROOM - extra + 1, extra), Mechanism::FastRdma);
    assert_eq!(mech(forced, CAPS, SLOT_ROOM - extra, extra), Mechanism::FastRdma);
    assert_eq!(mech(forced, CAPS, SLOT_ROOM - extra + 1, extra), Mechanism::ServerRdma);
}

#[test]
fn a_send_message_carries_its_data_and_tag() {
    for (len, unexpected, kind, m, via) in [
        (8, false, Kind::Eager, Mechanism::Inline, Via::Send),
        (8, true, Kind::Unexpected, Mechanism::Inline, Via::Send),
        (INLINE_MAX + 1, false, Kind::Eager, Mechanism::FastRdma, Via::Ring),
    ] {
        let Ok(SendPlan::Message { mech, via: v, header }) = send(None, CAPS, len, unexpected) else {
            panic!("{len} bytes go in one message")
        };
        assert_eq!((mech, v), (m, via), "{len} bytes");
        assert_eq!((header.kind, header.sl, header.a, header.len), (kind, SL, 9, len as u32));
    }
}

#[test]
fn a_large_send_is_announced_for_the_receiver_to_read() {
    let len = FAST_MAX + 1;
    let Ok(SendPlan::Rendezvous { header }) = send(None, CAPS, len, false) else {
        panic!("{len} bytes go by rendezvous")
    };
    assert_eq!((header.kind, header.a, header.c), (Kind::Rdv, 9, len as u64));
    // Forced, even a byte goes that way.
    assert!(matches!(send(Some(Mechanism::ServerRdma), CAPS, 1, false), Ok(SendPlan::Rendezvous { .. })));
}

#[test]
fn an_unexpected_send_fits_a_ring_slot_or_fails() {
    // Nobody posts a receive to read it: what would be announced goes into a slot.
    for forced in [None, Some(Mechanism::ServerRdma)] {
        let Ok(SendPlan::Message { mech, via, header }) = send(forced, CAPS, SLOT_ROOM, true) else {
            panic!("an unexpected send at the eager limit is one message (forced {forced:?})")
        };
        assert_eq!((mech, via, header.len), (Mechanism::FastRdma, Via::Ring, SLOT_ROOM as u32));
        match send(forced, CAPS, SLOT_ROOM + 1, true) {
            Err(Error::TooLarge { len, max }) => {
                assert_eq!((len, max), (SLOT_ROOM as u64 + 1, SLOT_ROOM as u64))
            }
            other => panic!("one byte over the eager limit: {other:?}"),
        }
    }
    // An expected send of that size is announced instead.
    assert!(matches!(send(None, CAPS, SLOT_ROOM + 1, false), Ok(SendPlan::Rendezvous { .. })));
}

#[test]
fn messages_without_data_go_by_send_while_they_fit_a_receive_buffer() {
    assert_eq!(CAPS.via(INLINE_ROOM), Via::Send);
    assert_eq!(CAPS.via(INLINE_ROOM + 1), Via::Ring);
    assert!(CAPS.fits_slot(SLOT_ROOM));
    assert!(!CAPS.fits_slot(SLOT_ROOM + 1));
}

#[test]
fn a_request_without_payload_reports_no_mechanism() {
    let p = request(None, CAPS, 10, 0, Direction::None);
    assert_eq!((p.mech, p.inline_len, p.register), (None, 0, None));
    assert_eq!(p.header.flags & (FLAG_INLINE_DATA | FLAG_SEGMENTS), 0);
    assert_eq!((p.header.kind, p.header.a, p.header.b, p.header.aux), (Kind::Request, 9, 77, 10));
    assert!(!p.header_by_rdv(CAPS, 10, 0));
    assert_eq!(p.via(CAPS, 10), Via::Send);
}

#[test]
fn a_requests_payload_rides_along_or_is_registered() {
    // A small write's data follows the header.
    let p = request(None, CAPS, 10, 100, Direction::Out);
    assert_eq!(
        (p.chosen, p.mech, p.inline_len, p.register),
        (Mechanism::Inline, Some(Mechanism::Inline), 100, None)
    );
    assert_eq!(p.header.flags & (FLAG_INLINE_DATA | FLAG_SEGMENTS), FLAG_INLINE_DATA);
    assert_eq!(p.via(CAPS, 110), Via::Send);
    // A large write is registered for the server to read.
    let p = request(None, CAPS, 10, FAST_MAX + 1, Direction::Out);
    assert_eq!((p.chosen, p.inline_len, p.register), (Mechanism::ServerRdma, 0, Some(For::PeerRead)));
    assert_eq!(p.header.flags & (FLAG_INLINE_DATA | FLAG_SEGMENTS), FLAG_SEGMENTS);
    // A large read is registered for the server to write.
    let p = request(None, CAPS, 10, FAST_MAX + 1, Direction::In);
    assert_eq!((p.chosen, p.inline_len, p.register), (Mechanism::ServerRdma, 0, Some(For::PeerWrite)));
    assert_eq!(p.header.flags & (FLAG_INLINE_DATA | FLAG_SEGMENTS), FLAG_SEGMENTS);
    // A small read registers nothing: the server pushes its data in messages.
    let p = request(None, CAPS, 10, 100, Direction::In);
    assert_eq!((p.mech, p.inline_len, p.register), (Some(Mechanism::Inline), 0, None));
    assert_eq!(p.header.flags & (FLAG_INLINE_DATA | FLAG_SEGMENTS), 0);
}

#[test]
fn a_requests_header_takes_room_from_its_data() {
    let header = 300;
    let forced = Some(Mechanism::Inline);
    let p = request(forced, CAPS, header, INLINE_ROOM - header, Direction::Out);
    assert_eq!(p.chosen, Mechanism::Inline);
    assert_eq!(p.via(CAPS, INLINE_ROOM), Via::Send);
    let p = request(forced, CAPS, header, INLINE_ROOM - header + 1, Direction::Out);
    assert_eq!(p.chosen, Mechanism::FastRdma);
    assert!(!p.header_by_rdv(CAPS, header, 0));
    let p = request(forced, CAPS, header, SLOT_ROOM - header + 1, Direction::Out);
    assert_eq!((p.chosen, p.register), (Mechanism::ServerRdma, Some(For::PeerRead)));
}

#[test]
fn data_chosen_for_fast_rdma_goes_into_a_ring_slot_even_when_small() {
    let p = request(Some(Mechanism::FastRdma), CAPS, 10, 8, Direction::Out);
    assert_eq!((p.chosen, p.inline_len), (Mechanism::FastRdma, 8));
    assert_eq!(p.via(CAPS, 18), Via::Ring);
    // Without data, the same message goes by SEND.
    let p = request(Some(Mechanism::FastRdma), CAPS, 10, 8, Direction::In);
    assert_eq!(p.via(CAPS, 18), Via::Send);
}

#[test]
fn a_request_header_too_large_for_a_slot_goes_by_rendezvous() {
    // At the slot's size the header rides in the message; one byte more and it is registered,
    // leaving the message its segment list.
    let p = request(None, CAPS, SLOT_ROOM, 0, Direction::None);
    assert!(!p.header_by_rdv(CAPS, SLOT_ROOM, 0));
    let p = request(None, CAPS, SLOT_ROOM + 1, 0, Direction::None);
    assert!(p.header_by_rdv(CAPS, SLOT_ROOM + 1, 0));
    // The room the data gets is what the segment list leaves.
    let room = SLOT_ROOM - msg::segments_len(1);
    let fast = Some(Mechanism::FastRdma);
    assert_eq!(request(fast, CAPS, SLOT_ROOM + 1, room, Direction::Out).chosen, Mechanism::FastRdma);
    assert_eq!(request(fast, CAPS, SLOT_ROOM + 1, room + 1, Direction::Out).chosen, Mechanism::ServerRdma);
    // Header and data that fit a slot together both ride in the message.
    let p = request(fast, CAPS, 4000, 4000, Direction::Out);
    assert_eq!((p.chosen, p.inline_len), (Mechanism::FastRdma, 4000));
    assert!(!p.header_by_rdv(CAPS, 4000, 0));
    // A segment list for registered data counts too.
    let p = request(None, CAPS, SLOT_ROOM - 16, FAST_MAX + 1, Direction::In);
    assert!(!p.header_by_rdv(CAPS, SLOT_ROOM - 16, 16));
    assert!(p.header_by_rdv(CAPS, SLOT_ROOM - 16, 17));
}

#[test]
fn a_push_into_an_unregistered_buffer_must_fit_one_message() {
    let push =
        |forced, len| plan_push_message(&policy(forced), CAPS, SL, 5, 40, len).map(|p| (p.mech, p.via));
    assert_eq!(push(None, 8).ok(), Some((Mechanism::Inline, Via::Send)));
    assert_eq!(push(None, INLINE_MAX + 1).ok(), Some((Mechanism::FastRdma, Via::Ring)));
    // The table would announce it; nobody can read it, so the ring takes it.
    assert_eq!(push(None, SLOT_ROOM).ok(), Some((Mechanism::FastRdma, Via::Ring)));
    assert!(matches!(push(None, SLOT_ROOM + 1), Err(Error::Misuse(_))));
    assert_eq!(push(Some(Mechanism::ServerRdma), 0).ok(), Some((Mechanism::Inline, Via::Send)));
    let Ok(PushPlan { header: h, .. }) = plan_push_message(&policy(None), CAPS, SL, 5, 40, 8) else {
        panic!("8 bytes fit a message")
    };
    assert_eq!((h.kind, h.sl, h.b, h.c, h.len), (Kind::Push, SL, 5, 40, 8));
}

#[test]
fn a_push_message_counts_its_bytes_as_pushed_unless_it_is_empty() {
    let pushed = |len| plan_push_message(&policy(None), CAPS, SL, 5, 40, len).map(|p| p.pushed_to).ok();
    assert_eq!(pushed(8), Some(Some(48)), "bytes 40..48 reach the client before the reply");
    assert_eq!(pushed(1), Some(Some(41)));
    // It still goes (an empty PUSH message), but says nothing about bytes before offset 40.
    assert_eq!(pushed(0), Some(None));
}

#[test]
fn empty_pulls_and_pushes_move_nothing() {
    assert_eq!(plan_pull(0), Transfer::Nothing);
    assert_eq!(plan_push_rdma(0, 0), Transfer::Nothing);
    assert_eq!(plan_push_rdma(4096, 0), Transfer::Nothing, "an empty push at an offset pushes nothing");
    assert_eq!(plan_pull(1), Transfer::Move { len: 1, end: 0 });
    assert_eq!(plan_pull(1 << 20), Transfer::Move { len: 1 << 20, end: 0 }, "a pull pushes nothing");
    assert_eq!(plan_push_rdma(4096, 100), Transfer::Move { len: 100, end: 4196 });
    assert_eq!(plan_push_rdma(0, 1), Transfer::Move { len: 1, end: 1 });
}

fn handle(len: u64) -> MemHandle {
    MemHandle { addr: 0x7000_0000, len, key: 11, rkey: 22, access: crate::types::Access::READ_WRITE }
}

#[test]
fn puts_and_gets_fit_the_exposure_and_the_message_limit_and_empty_ones_move_nothing() {
    const MAX: usize = 1 << 20;
    assert_eq!(plan_one_sided(0, &handle(0), MAX).ok(), Some(Transfer::Nothing));
    assert_eq!(plan_one_sided(0, &handle(64), MAX).ok(), Some(Transfer::Nothing));
    assert_eq!(plan_one_sided(64, &handle(64), MAX).ok(), Some(Transfer::Move { len: 64, end: 0 }));
    assert_eq!(plan_one_sided(1, &handle(64), MAX).ok(), Some(Transfer::Move { len: 1, end: 0 }));
    assert!(matches!(plan_one_sided(65, &handle(64), MAX), Err(Error::Misuse(_))), "overruns the exposure");
    assert!(matches!(plan_one_sided(1, &handle(0), MAX), Err(Error::Misuse(_))));
    let big = handle(1 << 40);
    assert_eq!(plan_one_sided(MAX, &big, MAX).ok(), Some(Transfer::Move { len: MAX, end: 0 }));
    // The exposure is checked first, as the engine always did.
    assert!(matches!(plan_one_sided(MAX + 1, &big, MAX), Err(Error::TooLarge { .. })));
    assert!(matches!(plan_one_sided(MAX + 1, &handle(64), MAX), Err(Error::Misuse(_))));
}

#[test]
fn an_exposure_is_one_segment_cut_to_32_bits() {
    let seg = |len| exposure_segment(&handle(len));
    assert_eq!(seg(64), Segment { addr: 0x7000_0000, len: 64, rkey: 22 });
    assert_eq!(seg(u64::from(u32::MAX)).len, u32::MAX);
    assert_eq!(seg(1 << 40).len, u32::MAX, "cut, not wrapped");
}

#[test]
fn a_reply_header_too_large_for_a_slot_goes_by_rendezvous() {
    let p = plan_reply(CAPS, SL, 5, 7, 300, SLOT_ROOM);
    assert!(!p.header_by_rdv, "at the slot's size the header rides in the message");
    assert_eq!(
        (p.header.kind, p.header.sl, p.header.b, p.header.aux, p.header.a),
        (Kind::Reply, SL, 5, 7, 300)
    );
    assert!(plan_reply(CAPS, SL, 5, 7, 300, SLOT_ROOM + 1).header_by_rdv);
    // The peer's smaller slots decide.
    let caps = CAPS.with_peer(Some(MsgCaps { recv: 256, slot: 2048 }));
    assert!(plan_reply(caps, SL, 5, 7, 0, 2048 - MSG_HDR + 1).header_by_rdv);
    assert_eq!(plan_reply(CAPS, SL, 5, 7, 0, 0).header.flags, 0);
}

fn send_cmd(len: usize, unexpected: bool) -> Cmd {
    let buf = SendBuf::Bytes(Bytes::from(vec![7u8; len]));
    Cmd::Send(SendCmd { peer: PEER, tag: len as Tag, sl: SL, buf, unexpected })
}

fn request_cmd(tag: Tag) -> Cmd {
    let payload = UserPayload::In(RecvBuf::Mut(bytes::BytesMut::zeroed(64)));
    Cmd::Request(RequestCmd { peer: PEER, tag, sl: SL, header: Bytes::from_static(b"h"), payload })
}

/// A placement as the tests compare it: the op, and its kind and tag for a post or its error
/// and buffer's length for a failure.
type Placed = (OpId, Result<(OpKind, Tag), (String, usize)>);

fn describe(p: Placement) -> Placed {
    match p {
        Placement::Post(op, cmd) => {
            let (kind, _, tag, _) = cmd.into_parts();
            (op, Ok((kind, tag)))
        }
        Placement::Fail { op, peer, buf, err, .. } => {
            assert_eq!(peer, PEER);
            let n = match buf {
                OpBuf::Send(b) => b.len(),
                _ => panic!("a failed send gets its send buffer back"),
            };
            (op, Err((format!("{err:?}"), n)))
        }
    }
}

#[test]
fn held_posts_are_placed_in_posting_order() {
    let mut held = HeldPosts::default();
    held.hold(OpId(1), send_cmd(8, false));
    held.hold(OpId(2), request_cmd(2));
    // Fit our own slots when posted; not the peer's smaller ones.
    held.hold(OpId(3), send_cmd(600, true));
    held.hold(OpId(4), send_cmd(100, true));
    held.hold(OpId(5), send_cmd(SLOT_ROOM, false));
    assert_eq!(held.len(), 5);
    assert_eq!(held.ops().collect::<Vec<_>>(), [1, 2, 3, 4, 5].map(OpId));
    let peer = MsgCaps { recv: 256, slot: 512 + MSG_HDR };
    let placed: Vec<_> = held.place(CAPS.with_peer(Some(peer))).map(describe).collect();
    let too_large = format!("{:?}", Error::TooLarge { len: 600, max: 512 });
    assert_eq!(
        placed,
        [
            (OpId(1), Ok((OpKind::Send, 8))),
            (OpId(2), Ok((OpKind::Request, 2))),
            (OpId(3), Err((too_large, 600))),
            (OpId(4), Ok((OpKind::SendUnexpected, 100))),
            (OpId(5), Ok((OpKind::Send, SLOT_ROOM as Tag))),
        ]
    );
    assert_eq!(held.len(), 0, "placing takes them all");
}

#[test]
fn a_held_post_withdrawn_gets_its_buffer_back_and_the_rest_keep_their_order() {
    let mut held = HeldPosts::default();
    for (op, len) in [(1, 10), (2, 20), (3, 30)] {
        held.hold(OpId(op), send_cmd(len, false));
    }
    let Some((kind, peer, tag, OpBuf::Send(buf))) = held.withdraw(OpId(2)) else { panic!("op 2 is held") };
    assert_eq!((kind, peer, tag, buf.len()), (OpKind::Send, PEER, 20, 20));
    assert!(held.withdraw(OpId(2)).is_none(), "withdrawn once");
    assert!(held.withdraw(OpId(9)).is_none());
    let placed: Vec<_> = held.place(CAPS).map(|p| describe(p).0).collect();
    assert_eq!(placed, [OpId(1), OpId(3)]);
}

#[test]
fn a_buffers_pieces_are_its_non_empty_slices() {
    let a = Bytes::from_static(b"abcd");
    let b = Bytes::from_static(b"efghij");
    let list = OpBuf::Send(SendBuf::List(vec![a.clone(), Bytes::new(), b.clone()]));
    let (pieces, owned) = buffer_pieces(&list);
    assert!(!owned);
    assert_eq!(pieces, [(a.as_ptr() as usize, 4), (b.as_ptr() as usize, 6)]);
    let one = bytes::BytesMut::zeroed(32);
    let at = one.as_ptr() as usize;
    assert_eq!(buffer_pieces(&OpBuf::Recv(RecvBuf::Mut(one))), (vec![(at, 32)], false));
    assert_eq!(buffer_pieces(&OpBuf::None), (Vec::new(), false));
}

#[test]
fn long_lists_are_staged_and_hinted_lists_register_their_span() {
    let pieces: Vec<(usize, usize)> = (0..msg::MAX_SEGMENTS / 2).map(|i| (0x10_000 + i * 100, 50)).collect();
    assert_eq!(registration(true, &pieces, true), Registration::Owned);
    assert_eq!(registration(false, &pieces, false), Registration::Foreign { parent: None });
    // With the hint, the span from the lowest piece to the end of the highest.
    let span = Span::new(0x10_000, (pieces.len() - 1) * 100 + 50);
    assert_eq!(registration(false, &pieces, true), Registration::Foreign { parent: Some(span) });
    let mut longer = pieces.clone();
    longer.push((0x90_000, 8));
    assert_eq!(registration(false, &longer, true), Registration::Stage);
    assert_eq!(registration(true, &longer, true), Registration::Owned, "a pool buffer is one registration");
    // A single piece is its own span: nothing wider is registered for it.
    assert_eq!(registration(false, &pieces[..1], true), Registration::Foreign { parent: None });
    assert_eq!(registration(false, &[], true), Registration::Foreign { parent: None });
}

#[test]
fn pool_memory_is_only_found_and_the_callers_is_registered_or_staged() {
    let span = Span::new(0x10_000, 4096);
    assert_eq!(Registration::Owned.acquire(), Some(Acquire::Find));
    assert_eq!(Registration::Foreign { parent: None }.acquire(), Some(Acquire::Register));
    assert_eq!(Registration::Foreign { parent: Some(span) }.acquire(), Some(Acquire::RegisterParent(span)));
    assert_eq!(Registration::Stage.acquire(), None, "staged without asking the cache");
    // Only the caller's memory refused is worth a note.
    assert!(!note_refusal(Acquire::Find));
    assert!(note_refusal(Acquire::Register));
    assert!(note_refusal(Acquire::RegisterParent(span)));
}

#[test]
fn a_staged_buffer_holds_the_pieces_and_is_filled_only_for_the_peer_to_read() {
    let pieces = [(0x1000, 100), (0x9000, 28)];
    assert_eq!(staging(For::PeerRead, &pieces), Staging { alloc: 128, len: 128, fill: true });
    assert_eq!(staging(For::PeerWrite, &pieces), Staging { alloc: 128, len: 128, fill: false });
    // An empty buffer still takes a (one-byte) pool buffer: the pool has no empty ones.
    assert_eq!(staging(For::PeerRead, &[]), Staging { alloc: 1, len: 0, fill: true });
    assert_eq!(staging(For::PeerWrite, &[(0x1000, 0)]), Staging { alloc: 1, len: 0, fill: false });
}

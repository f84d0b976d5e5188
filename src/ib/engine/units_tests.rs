//! The transfer rules of [`super::Units`] on tables the test owns: no device, no memory.

use super::*;
use crate::flowctl::ZoneConfig;

const A: PeerId = PeerId(1);
const B: PeerId = PeerId(2);

fn seg(addr: u64, len: u32, rkey: u32) -> Segment {
    Segment { addr, len, rkey }
}

fn xfer(peer: PeerId, op: u64, remote: Vec<Segment>, remote_off: u64, total: usize) -> Xfer {
    Xfer {
        peer,
        conn: 7,
        read: true,
        remote,
        remote_off,
        local: Local::Op { op: OpId(op), base: 0 },
        total,
        done_bytes: 0,
        units_out: 0,
        failed: None,
        then: XferThen::CompleteOp(OpId(op)),
    }
}

/// Units of `unit` bytes (at least two per transfer unless capped) under the given caps.
fn units(unit: usize, peer_cap: usize) -> Units {
    Units::new(BulkScheduler::new(unit, unit, peer_cap, 1 << 30))
}

fn zones(size: usize, n: u32, max_waiting: usize) -> BufferZones<ZoneToken> {
    BufferZones::new(&ZoneConfig::default().classes(&[(size, n)]).max_waiting(max_waiting)).expect("zones")
}

/// A connection with room for anything.
fn room(_: u32, _: u32) -> Option<bool> {
    Some(true)
}

/// Stages every unit the scheduler lets out straight from registered memory and posts it;
/// returns them in order.
fn post_all(u: &mut Units) -> Vec<Unit> {
    let mut out = Vec::new();
    while let Some((x, off, len)) = u.next_unit() {
        let (Step::Post(unit), None) = u.stage(x, off, len, Room::Direct) else { panic!("direct unit") };
        let (unit, conn, read) = u.ready_to_post(unit, room, None).expect("room");
        assert_eq!((conn, read), (7, true));
        u.posted(unit.xfer);
        out.push(unit);
    }
    out
}

fn error_of(s: Step, u: &mut Units) -> Error {
    let Step::Finish(x) = s else { panic!("finished expected, got {s:?}") };
    let mut xf = u.finish(x).expect("the transfer");
    xf.outcome().expect_err("failed")
}

#[test]
fn pieces_walk_the_segments_from_an_offset_inside_one() {
    let segs = vec![seg(0x1000, 100, 1), seg(0x9000, 50, 2)];
    let x = xfer(A, 1, segs.clone(), 0, 150);
    assert_eq!(x.pieces(90, 20).collect::<Vec<_>>(), [(0x1000 + 90, 10, 1), (0x9000, 10, 2)]);
    assert_eq!(x.pieces(100, 50).collect::<Vec<_>>(), [(0x9000, 50, 2)]);
    assert_eq!(x.pieces(0, 0).count(), 0);
    // The transfer's own start inside the first segment shifts every unit.
    let x = xfer(A, 1, segs, 95, 55);
    assert_eq!(x.pieces(0, 55).collect::<Vec<_>>(), [(0x1000 + 95, 5, 1), (0x9000, 50, 2)]);
    assert_eq!(x.pieces(5, 10).collect::<Vec<_>>(), [(0x9000, 10, 2)]);
    // Past the list: nothing more (the peer's list was shorter than announced).
    assert_eq!(x.pieces(50, 20).collect::<Vec<_>>(), [(0x9000 + 45, 5, 2)]);
}

#[test]
fn units_cut_across_segments_with_a_short_last_unit() {
    // Remote: 700 + 1300 + 600 bytes; the transfer starts 150 bytes in and moves 2300.
    let segs = vec![seg(0x10_000, 700, 1), seg(0x20_000, 1300, 2), seg(0x30_000, 600, 3)];
    let mut u = units(1000, 1 << 20);
    let (x, done) = u.start(xfer(A, 1, segs, 150, 2300));
    assert!(!done);
    let posted = post_all(&mut u);
    let cuts: Vec<_> = posted.iter().map(|p| (p.off, p.len)).collect();
    assert_eq!(cuts, [(0, 1000), (1000, 1000), (2000, 300)], "whole units, the last short");
    let xf = &u.xfers[&x];
    let pieces: Vec<Vec<_>> = posted.iter().map(|p| xf.pieces(p.off, p.len).collect()).collect();
    assert_eq!(pieces[0], [(0x10_000 + 150, 550, 1), (0x20_000, 450, 2)]);
    assert_eq!(pieces[1], [(0x20_000 + 450, 850, 2), (0x30_000, 150, 3)]);
    assert_eq!(pieces[2], [(0x30_000 + 150, 300, 3)]);
    assert_eq!(u.bulk.in_flight(A), 2300);
    // Completion once, when the last byte is back, whatever the order.
    for (i, p) in [&posted[2], &posted[0], &posted[1]].into_iter().enumerate() {
        let r = u.unit_done(x, p.len, false, true);
        assert_eq!(r, Returned { copy_in: false, finish: i == 2 });
    }
    let mut xf = u.finish(x).expect("finished");
    assert_eq!(xf.outcome().expect("ok"), 2300);
    assert_eq!(u.bulk.in_flight_total(), 0);
    assert!(u.finish(x).is_none(), "finished once");
}

#[test]
fn an_empty_transfer_is_finished_at_start() {
    let mut u = units(1000, 1 << 20);
    let (x, done) = u.start(xfer(A, 1, Vec::new(), 0, 0));
    assert!(done);
    assert!(u.next_unit().is_none());
    assert_eq!(u.finish(x).expect("entered").outcome().expect("ok"), 0);
}

#[test]
fn a_failure_mid_transfer_stops_it_and_it_finishes_once_its_units_are_back() {
    // 5000 bytes in units of 1000; the peer's cap lets three out at a time.
    let mut u = units(1000, 3000);
    let (x, _) = u.start(xfer(A, 1, vec![seg(0x1000, 5000, 9)], 0, 5000));
    let mut out = Vec::new();
    while let Some((x, off, len)) = u.next_unit() {
        let (Step::Post(unit), _) = u.stage(x, off, len, Room::Direct) else { panic!("direct") };
        out.push(unit);
    }
    assert_eq!(out.len(), 3, "the cap holds the rest back");
    let third = out.pop().expect("three");
    let (second, _, _) = u.ready_to_post(out.pop().expect("two"), room, None).expect("room");
    u.posted(x);
    let (first, _, _) = u.ready_to_post(out.pop().expect("one"), room, None).expect("room");
    u.posted(x);
    // The third cannot be posted: the transfer fails, with two units still out.
    let s = u.post_failed(third, Error::misuse("not registered"), None);
    assert!(matches!(s, Step::Idle), "units are out: not finished yet");
    assert_eq!(u.bulk.in_flight(A), 2000, "the dropped unit's bytes came back");
    // A later failure does not replace the first.
    assert!(matches!(u.fail(x, Error::Cancelled), Step::Idle));
    // Nothing more is handed out, even with room under the cap.
    let r = u.unit_done(x, second.len, true, true);
    assert_eq!(r, Returned { copy_in: false, finish: false }, "a failed read is not copied in");
    assert!(u.next_unit().is_none(), "no unit after the failure");
    let r = u.unit_done(x, first.len, false, true);
    assert!(r.finish, "the last unit out finishes it");
    let mut xf = u.finish(x).expect("once");
    assert!(matches!(xf.outcome(), Err(Error::Misuse(_))), "the first error is kept");
    assert_eq!(u.bulk.in_flight_total(), 0);
}

#[test]
fn units_wait_for_zone_buffers_and_are_granted_in_order() {
    // Two 1000-byte zone buffers; A's transfer has four units of 1000, B's 1000 and 200.
    let mut z = zones(1000, 2, 16);
    let mut u = units(1000, 1 << 20);
    let (xa, _) = u.start(xfer(A, 1, vec![seg(0x1000, 4000, 1)], 0, 4000));
    let (xb, _) = u.start(xfer(B, 2, vec![seg(0x9000, 1200, 2)], 0, 1200));
    let mut posted = VecDeque::new();
    while let Some((x, off, len)) = u.next_unit() {
        match u.stage(x, off, len, Room::Zones(&mut z)) {
            (Step::Post(p), None) => posted.push_back(p),
            (Step::Idle, None) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // Round-robin: A0 and B0 take the two buffers; A1, B1, A2, A3 wait.
    let got: Vec<_> = posted.iter().map(|p| (p.xfer, p.off)).collect();
    assert_eq!(got, [(xa, 0), (xb, 0)]);
    assert!(posted.iter().all(|p| p.zone.is_some()));
    assert_eq!(z.waiting(), 4);
    // Units return in the order posted; each buffer that comes back goes to a waiting unit:
    // the peers take turns, each peer's units in order.
    let mut order = Vec::new();
    while let Some(p) = posted.pop_front() {
        let r = u.unit_done(p.xfer, p.len, true, true);
        assert!(r.copy_in, "a live read is copied in from its zone buffer");
        z.free(p.zone.expect("zoned")).expect("held");
        while let Some(g) = z.poll_grant() {
            let (Step::Post(p), None) = u.granted(g, &mut z) else { panic!("a granted unit is posted") };
            order.push((p.xfer, p.off));
            posted.push_back(p);
        }
    }
    assert_eq!(order, [(xa, 1000), (xb, 1000), (xa, 2000), (xa, 3000)]);
    assert_eq!(u.bulk.in_flight_total(), 0);
    assert!(u.xfers.values().all(|x| x.done_bytes == x.total));
}

#[test]
fn a_unit_bigger_than_the_zone_buffer_is_chopped() {
    let mut z = zones(1000, 4, 16);
    let mut u = units(2500, 1 << 20);
    let (x, _) = u.start(xfer(A, 1, vec![seg(0x1000, 2500, 1)], 0, 2500));
    let (x0, off, len) = u.next_unit().expect("one unit");
    assert_eq!((x0, off, len), (x, 0, 2500));
    let (Step::Post(p), Some(rest)) = u.stage(x, off, len, Room::Zones(&mut z)) else { panic!("chopped") };
    assert_eq!(((p.off, p.len), (rest.peer, rest.off, rest.len)), ((0, 1000), (A, 1000, 1500)));
    let (Step::Post(p), Some(rest)) = u.stage_rest(x, rest, Room::Zones(&mut z)) else { panic!("again") };
    assert_eq!(((p.off, p.len), (rest.off, rest.len)), ((1000, 1000), (2000, 500)));
    let (Step::Post(p), None) = u.stage_rest(x, rest, Room::Zones(&mut z)) else { panic!("the tail") };
    assert_eq!((p.off, p.len), (2000, 500));
}

/// A unit chopped by a small zone buffer whose first part ends its transfer (the connection
/// is gone when it is posted): the rest, staged after the transfer is gone, gives its bytes
/// back to the scheduler, which would otherwise count them against the peer for good.
#[test]
fn the_rest_of_a_chopped_unit_is_given_back_when_its_transfer_ended() {
    let mut z = zones(1000, 4, 16);
    let mut u = units(2500, 1 << 20);
    let (x, _) = u.start(xfer(A, 1, vec![seg(0x1000, 2500, 1)], 0, 2500));
    let (_, off, len) = u.next_unit().expect("one unit");
    assert_eq!(u.bulk.in_flight(A), 2500);
    let (Step::Post(p), Some(rest)) = u.stage(x, off, len, Room::Zones(&mut z)) else { panic!("chopped") };
    let s = u.ready_to_post(p, |_, _| None, Some(&mut z)).expect_err("no connection");
    let e = error_of(s, &mut u);
    assert!(matches!(e, Error::PeerLost { .. }), "{e:?}");
    assert!(matches!(u.stage_rest(x, rest, Room::Zones(&mut z)), (Step::Idle, None)));
    assert_eq!(u.bulk.in_flight(A), 0, "the rest's bytes came back");
    assert_eq!(z.held_by(A), 0, "no zone buffer kept for it");
}

#[test]
fn too_many_waiting_units_fail_the_transfer_and_late_grants_are_given_back() {
    let mut z = zones(1000, 1, 1);
    let mut u = units(1000, 1 << 20);
    let (x, _) = u.start(xfer(A, 1, vec![seg(0x1000, 3000, 1)], 0, 3000));
    let mut steps = Vec::new();
    while let Some((x, off, len)) = u.next_unit() {
        steps.push(u.stage(x, off, len, Room::Zones(&mut z)));
    }
    assert_eq!(steps.len(), 3);
    let (Step::Post(first), None) = steps.remove(0) else { panic!("the only buffer") };
    assert!(matches!(steps[0], (Step::Idle, None)), "the second waits");
    // The third finds the waiting list full: the transfer fails, nothing out yet.
    let e = match steps.remove(1) {
        (s, None) => error_of(s, &mut u),
        other => panic!("unexpected {other:?}"),
    };
    assert!(matches!(e, Error::Exhausted(_)), "{e:?}");
    assert_eq!(u.bulk.in_flight(A), 2000, "the refused unit's bytes came back");
    // The first unit returns after the transfer is gone; its buffer goes to the waiting unit,
    // whose grant is given back.
    let r = u.unit_done(x, first.len, true, true);
    assert_eq!(r, Returned { copy_in: false, finish: false });
    z.free(first.zone.expect("zoned")).expect("held");
    let g = z.poll_grant().expect("the waiting unit is granted");
    assert!(matches!(u.granted(g, &mut z), (Step::Idle, None)));
    assert_eq!(z.held_by(A), 0, "the late grant went back");
}

#[test]
fn a_unit_without_send_queue_room_is_deferred_and_a_lost_connection_fails_the_transfer() {
    let mut u = units(1000, 1 << 20);
    let (x, _) = u.start(xfer(A, 1, vec![seg(0x1000, 600, 1), seg(0x2000, 1400, 2)], 0, 2000));
    let (_, off, len) = u.next_unit().expect("first");
    let (Step::Post(p), None) = u.stage(x, off, len, Room::Direct) else { panic!("direct") };
    // The unit spans both segments: it needs room for two work requests.
    let mut asked = None;
    let full = |cid: u32, n: u32| {
        asked = Some((cid, n));
        Some(false)
    };
    assert!(matches!(u.ready_to_post(p, full, None), Err(Step::Idle)));
    assert_eq!(asked, Some((7, 2)));
    assert_eq!(u.deferred.len(), 1, "waits for room");
    let d = u.deferred.pop_front().expect("deferred");
    let s = u.ready_to_post(d, |_, _| None, None).expect_err("no connection");
    let e = error_of(s, &mut u);
    assert!(matches!(e, Error::PeerLost { peer, .. } if peer == A), "{e:?}");
    assert_eq!(u.bulk.in_flight(A), 0, "the dropped unit's bytes came back; no other was handed out");
    assert!(u.next_unit().is_none(), "the failed transfer hands out no more units");
}

#[test]
fn aborting_an_op_stops_its_transfers_only() {
    let mut u = units(1000, 1 << 20);
    let seg1 = || vec![seg(0x1000, 4000, 1)];
    let (busy, _) = u.start(xfer(A, 1, seg1(), 0, 2000));
    let (idle, _) = u.start(xfer(B, 1, seg1(), 2000, 2000));
    let (other, _) = u.start(xfer(A, 2, seg1(), 0, 2000));
    // One unit of `busy` is out; nothing of `idle` yet.
    let (x, off, len) = u.next_unit().expect("a unit");
    assert_eq!(x, busy);
    let (Step::Post(p), None) = u.stage(x, off, len, Room::Direct) else { panic!("direct") };
    let (p, _, _) = u.ready_to_post(p, room, None).expect("room");
    u.posted(busy);
    let mut over = u.abort_op(OpId(1));
    over.sort();
    assert_eq!(over, [idle], "finished at once: nothing of it is out");
    assert!(matches!(u.finish(idle).expect("idle").outcome(), Err(Error::Cancelled)));
    // Only the other op's units are handed out now.
    let rest: Vec<_> = std::iter::from_fn(|| u.next_unit()).map(|(x, _, _)| x).collect();
    assert_eq!(rest, [other, other]);
    assert!(u.unit_done(busy, p.len, false, true).finish, "finishes when its unit is back");
    assert!(matches!(u.finish(busy).expect("busy").outcome(), Err(Error::Cancelled)));
    assert!(u.xfers[&other].live());
}

#[test]
fn a_finished_transfer_completes_its_op_and_answers_the_sender() {
    use super::super::{FIN_CANCELLED, FIN_OK};
    let mut recv = xfer(A, 3, Vec::new(), 0, 500);
    recv.then = XferThen::RecvDone { op: OpId(3), msg: 40 };
    let f = recv.finished();
    assert_eq!((f.release, f.fin), (Some(OpId(3)), Some((7, 40, FIN_OK))));
    assert!(matches!(f.then, Outcome::Complete(OpId(3), Ok(500))));
    // A rendezvous receive that failed tells the sender so, and the op gets the error.
    let mut recv = xfer(A, 3, Vec::new(), 0, 500);
    recv.then = XferThen::RecvDone { op: OpId(3), msg: 40 };
    recv.failed = Some(Error::Cancelled);
    let f = recv.finished();
    assert_eq!(f.fin, Some((7, 40, FIN_CANCELLED)));
    assert!(matches!(f.then, Outcome::Complete(OpId(3), Err(Error::Cancelled))));
    // A push that failed moved nothing the reply may announce.
    let mut push = xfer(B, 4, Vec::new(), 0, 100);
    push.then = XferThen::ReqOp { op: OpId(4), peer: B, req: 9, end: 700 };
    let f = push.finished();
    assert!(matches!(f.then, Outcome::ReqOp { pushed: Some(700), result: Ok(100), req: 9, .. }));
    let mut push = xfer(B, 4, Vec::new(), 0, 100);
    push.then = XferThen::ReqOp { op: OpId(4), peer: B, req: 9, end: 700 };
    push.failed = Some(Error::Cancelled);
    let f = push.finished();
    assert!(f.fin.is_none());
    assert!(matches!(f.then, Outcome::ReqOp { pushed: None, result: Err(Error::Cancelled), .. }));
}

#[test]
fn a_fetched_reply_header_releases_the_client_s_buffer_either_way() {
    use super::super::FIN_OK;
    let header = |failed: Option<Error>| {
        let mut x = xfer(A, 5, Vec::new(), 0, 3);
        x.local = Local::Vec(b"hdr".to_vec());
        x.then = XferThen::ReplyHeader { op: OpId(5), status: 1, msg: 77, pushed: 30 };
        x.failed = failed;
        x.finished()
    };
    let f = header(None);
    assert_eq!((f.release, f.fin), (None, Some((7, 77, FIN_OK))), "no op buffer was referenced");
    let Outcome::Reply { op, status, header: h, pushed } = f.then else { panic!("the reply") };
    assert_eq!((op, status, h.as_slice(), pushed), (OpId(5), 1, &b"hdr"[..], 30));
    let f = header(Some(Error::Cancelled));
    assert_eq!(f.fin, Some((7, 77, FIN_OK)));
    assert!(matches!(f.then, Outcome::Complete(OpId(5), Err(Error::Remote(_)))));
}

//! Streamed request payloads the server does not pull at once: the connection waits a moment,
//! then parks their bytes within the peer's budget and serves the requests behind them.

use super::*;
use proptest::prelude::*;

use crate::core::stream::TIMER_PERIOD;

/// A request with a streamed payload that its server takes but does not pull yet (its handler
/// waits for something else: bytes another client's request holds, a disk) and a request
/// behind it on the same connection.
fn payload_nobody_pulls(cfg: Config, len: usize) -> (Pair, PeerId, OpId, RequestMeta, OpId, Vec<u8>) {
    payload_nobody_pulls_in(cfg, len, 64 << 10, 256 << 10)
}

/// The same, its bytes moving at most `chunk` at a time, `capacity` of them at most on their
/// way.
fn payload_nobody_pulls_in(
    cfg: Config,
    len: usize,
    chunk: usize,
    capacity: usize,
) -> (Pair, PeerId, OpId, RequestMeta, OpId, Vec<u8>) {
    let mut p = Pair::new(cfg);
    p.chunk = chunk;
    p.capacity = capacity;
    let srv = p.connect();
    let data = pattern(len, 5);
    let req = p
        .post(true, request(srv, 1, ServiceLevel::Bulk, b"write", Payload::Out(SendBuf::from(data.clone()))));
    p.drive();
    let meta = p.server.requests.pop_front().expect("the request arrived");
    let next = p.post(true, request(srv, 1, ServiceLevel::Bulk, b"next", Payload::None));
    p.drive();
    assert!(p.server.requests.is_empty(), "at first the connection waits for a pull");
    (p, srv, req, meta, next, data)
}

/// `n` looks of the server's timer, everything moving in between.
fn looks_of_the_timer(p: &mut Pair, n: usize) {
    for _ in 0..n {
        p.advance(TIMER_PERIOD);
        p.drive();
    }
}

/// Answers the request with the payload (`meta`, the client's `req`, `len` bytes) and the one
/// behind it (`m2`, the client's `next`); both complete at the client.
fn answer_both(p: &mut Pair, meta: &RequestMeta, req: OpId, m2: &RequestMeta, next: OpId, len: usize) {
    p.post(false, reply(m2));
    p.post(false, reply(meta));
    p.drive();
    assert!(p.take(true, next).result.is_ok());
    assert_eq!(p.take(true, req).result.ok(), Some(len));
}

/// Bytes the server has parked.
fn parked_count(p: &Pair) -> u64 {
    p.server.s.core.counters.stream_bytes_parked.load(std::sync::atomic::Ordering::Relaxed)
}

/// The pulls of a payload posted late, in two halves; its bytes.
fn pull_late(p: &mut Pair, meta: &RequestMeta, len: usize) -> Vec<u8> {
    let half = len / 2;
    let pulls: Vec<OpId> = [(0, half), (half, len - half)]
        .into_iter()
        .map(|(off, n)| p.post(false, pull(meta, off as u64, n)))
        .collect();
    p.drive();
    pulls.into_iter().flat_map(|op| bytes_of(&p.take(false, op))).collect()
}

/// The connection goes on past a payload nobody pulls for a while: its bytes are parked
/// within the peer's early-data budget, the request behind it is served, and the late pulls
/// get every byte.
#[test]
fn requests_behind_a_payload_nobody_pulls_yet_are_served_and_the_payload_stays_whole() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(Config::default(), len);
    // What the open request itself holds of the budget (its header).
    let open = p.server.s.peers.buffered();
    looks_of_the_timer(&mut p, 3);
    let m2 = p.server.requests.pop_front().expect("the next request got past the unpulled payload");
    p.post(false, reply(&m2));
    p.drive();
    assert!(p.take(true, next).result.is_ok());
    assert_eq!(p.server.s.peers.buffered(), open + len, "the parked payload counts against the budget");
    let parked = parked_count(&p);
    assert_eq!(parked, len as u64, "counted");
    assert_eq!(pull_late(&mut p, &meta, len), data);
    assert_eq!(p.server.s.peers.buffered(), open, "the budget is back");
    p.post(false, reply(&meta));
    p.drive();
    assert_eq!(p.take(true, req).result.ok(), Some(len));
    assert_eq!(p.server.s.streams.len(), 0, "the stream is forgotten");
}

/// Parking stops at the budget: a payload larger than the peer's early-data budget keeps the
/// connection waiting once the budget is full, and still arrives whole.
#[test]
fn a_payload_nobody_pulls_is_parked_only_up_to_the_peers_budget() {
    let len = 3 << 20;
    let budget = 1 << 20;
    let cfg = Config { early_bytes_per_peer: budget, ..Config::default() };
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(cfg, len);
    let open = p.server.s.peers.buffered();
    looks_of_the_timer(&mut p, 5);
    let parked = p.server.s.peers.buffered() - open;
    assert!(parked > 0 && open + parked <= budget, "{parked} bytes parked against a budget of {budget}");
    assert!(p.server.requests.is_empty(), "the request behind the rest of the payload waits");
    assert_eq!(pull_late(&mut p, &meta, len), data);
    let m2 = p.server.requests.pop_front().expect("the next request, once the payload is pulled");
    assert_eq!(p.server.s.peers.buffered(), open + m2.header.len(), "nothing parked is left counted");
    answer_both(&mut p, &meta, req, &m2, next, len);
}

/// Parked bytes of a request answered without pulling them (it failed) are dropped and their
/// budget given back.
#[test]
fn parked_bytes_of_a_request_answered_unpulled_are_dropped() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, _data) = payload_nobody_pulls(Config::default(), len);
    looks_of_the_timer(&mut p, 3);
    assert!(p.server.s.peers.buffered() > 0);
    p.post(false, reply(&meta));
    p.drive();
    assert_eq!(p.server.s.streams.len(), 0, "the stream is forgotten");
    assert!(p.take(true, req).result.is_ok());
    let m2 = p.server.requests.pop_front().expect("the next request");
    assert_eq!(p.server.s.peers.buffered(), m2.header.len(), "the parked bytes' budget is back");
    p.post(false, reply(&m2));
    p.drive();
    assert!(p.take(true, next).result.is_ok());
}

/// A long payload whose pulls come one after another, its connection waiting a moment before
/// each (a pipeline's pace) and the timer looking in at every wait, is not parked: its bytes
/// go straight into the pulls.
#[test]
fn a_payload_pulled_piece_by_piece_is_not_parked() {
    let (len, piece) = (2 << 20, 256 << 10);
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(Config::default(), len);
    let mut got = Vec::new();
    for off in (0..len).step_by(piece) {
        p.advance(TIMER_PERIOD);
        p.drive();
        let pu = p.post(false, pull(&meta, off as u64, piece));
        p.drive();
        got.extend(bytes_of(&p.take(false, pu)));
    }
    assert_eq!(got, data);
    let parked = parked_count(&p);
    assert_eq!(parked, 0, "bytes were parked");
    let m2 = p.server.requests.pop_front().expect("the next request");
    answer_both(&mut p, &meta, req, &m2, next, len);
}

/// A pull posted ahead of where the stream stands (a later unit first) gets its bytes when the
/// stream parks around it: parking stops where the pull begins and goes on after it.
#[test]
fn a_pull_posted_ahead_of_a_parking_stream_gets_its_bytes() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(Config::default(), len);
    // Not at a piece boundary of the parking.
    let (ahead, n) = ((1 << 20) + 100, 64 << 10);
    let early = p.post(false, pull(&meta, ahead as u64, n));
    looks_of_the_timer(&mut p, 3);
    let got = p.take(false, early);
    assert_eq!(bytes_of(&got), &data[ahead..ahead + n], "the pull ahead got other bytes");
    assert_eq!(parked_count(&p), (len - n) as u64, "all but the pull's bytes parked");
    let rest: Vec<OpId> = [(0, ahead), (ahead + n, len - ahead - n)]
        .iter()
        .map(|&(o, l)| p.post(false, pull(&meta, o as u64, l)))
        .collect();
    p.drive();
    assert_eq!(bytes_of(&p.take(false, rest[0])), &data[..ahead]);
    assert_eq!(bytes_of(&p.take(false, rest[1])), &data[ahead + n..]);
    let m2 = p.server.requests.pop_front().expect("the next request");
    answer_both(&mut p, &meta, req, &m2, next, len);
    assert_eq!(p.server.s.streams.len(), 0);
}

/// A pull posted ahead of where the stream stands, then the request answered before the
/// stream reaches it (its handler did not wait for it): the bytes before the pull go into the
/// void, the pull still gets its own, and the stream is forgotten.
#[test]
fn a_pull_posted_ahead_then_answered_gets_its_bytes() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(Config::default(), len);
    // Within the bytes on their way already: the client's stop comes after them.
    let (ahead, n) = (100_000, 64 << 10);
    let early = p.post(false, pull(&meta, ahead as u64, n));
    p.drive();
    p.post(false, reply(&meta));
    p.drive();
    assert!(!p.pending(false, early), "the pull never completed");
    assert_eq!(bytes_of(&p.take(false, early)), &data[ahead..ahead + n]);
    assert!(p.take(true, req).result.is_ok());
    let m2 = p.server.requests.pop_front().expect("the next request");
    p.post(false, reply(&m2));
    p.drive();
    assert!(p.take(true, next).result.is_ok());
    assert_eq!(p.server.s.streams.len(), 0, "the stream is forgotten");
    assert_eq!(p.server.s.peers.buffered(), 0, "nothing counted");
}

/// Runs the pair of [`payload_nobody_pulls`] until the stream parks and a piece is on its way
/// to the parked bytes: reserved against the budget, not yet in.
fn until_a_piece_is_being_parked(p: &mut Pair) {
    let open = p.server.s.peers.buffered();
    p.advance(TIMER_PERIOD);
    p.drive();
    p.advance(TIMER_PERIOD);
    let mut steps = 0;
    while p.server.s.peers.buffered() - open <= parked_count(p) as usize {
        steps += 1;
        assert!(steps < 1000, "no piece was ever being parked");
        p.step();
    }
}

/// A pull posted while a piece of its payload is on its way to the parked bytes (the server
/// got to the request just then) gets that piece's bytes too once it is in.
#[test]
fn a_pull_posted_while_a_piece_is_being_parked_gets_every_byte() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls(Config::default(), len);
    until_a_piece_is_being_parked(&mut p);
    let all = p.post(false, pull(&meta, 0, len));
    p.drive();
    assert_eq!(bytes_of(&p.take(false, all)), data);
    let m2 = p.server.requests.pop_front().expect("the next request");
    answer_both(&mut p, &meta, req, &m2, next, len);
    assert_eq!(p.server.s.streams.len(), 0);
}

/// A request answered while a piece of its payload is on its way to the parked bytes (its
/// handler failed just then), the whole payload sent already (no stop from the client comes
/// after it): the piece is dropped once it is in, its budget comes back and the stream is
/// forgotten.
#[test]
fn a_piece_being_parked_when_its_request_is_answered_is_dropped() {
    let len = 3 << 20;
    let (mut p, _srv, req, meta, next, _data) =
        payload_nobody_pulls_in(Config::default(), len, 64 << 10, 8 << 20);
    until_a_piece_is_being_parked(&mut p);
    p.post(false, reply(&meta));
    p.drive();
    assert_eq!(p.take(true, req).result.ok(), Some(len));
    let m2 = p.server.requests.pop_front().expect("the next request");
    assert_eq!(p.server.s.peers.buffered(), m2.header.len(), "the piece's budget is back");
    assert_eq!(p.server.s.streams.len(), 0, "the stream is forgotten");
    p.post(false, reply(&m2));
    p.drive();
    assert!(p.take(true, next).result.is_ok());
}

/// How a handler takes a streamed payload: the pieces it pulls, in the order it posts them,
/// each after a number of the timer's looks (its handler waits for something else); or it
/// answers after posting the first `answer_after` of them, leaving the rest unpulled.
#[derive(Debug, Clone)]
struct Handler {
    len: usize,
    chunk: usize,
    capacity: usize,
    budget: usize,
    pulls: Vec<(usize, usize)>,
    looks: Vec<usize>,
    answer_after: Option<usize>,
}

fn handler() -> impl Strategy<Value = Handler> {
    let sizes = (
        (256usize << 10)..(3 << 20),
        prop::sample::select(vec![4usize << 10, 16 << 10, 64 << 10, 256 << 10]),
        prop::sample::select(vec![256usize << 10, 8 << 20]),
        prop::sample::select(vec![256usize << 10, 1 << 20, 4 << 20]),
    );
    sizes.prop_flat_map(|(len, chunk, capacity, budget)| {
        pieces(len).prop_flat_map(move |pulls| {
            let n = pulls.len();
            (Just(pulls), prop::collection::vec(0usize..3, n), prop::option::weighted(0.3, 0..n)).prop_map(
                move |(pulls, looks, answer_after)| Handler {
                    len,
                    chunk,
                    capacity,
                    budget,
                    pulls,
                    looks,
                    answer_after,
                },
            )
        })
    })
}

/// `[0, len)` cut into up to six pieces, in any order: (offset, length).
fn pieces(len: usize) -> impl Strategy<Value = Vec<(usize, usize)>> {
    prop::collection::vec(1..len, 0..6).prop_flat_map(move |mut cuts| {
        cuts.sort_unstable();
        cuts.dedup();
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain(std::iter::once(len)).collect();
        Just(bounds.windows(2).map(|w| (w[0], w[1] - w[0])).collect::<Vec<_>>()).prop_shuffle()
    })
}

/// Two requests with streamed payloads one behind the other on one connection, and how their
/// handlers take them: the pieces each pulls in the order it posts them, whose handler posts
/// next at each turn (the other's if that one has none left, or has not its request yet), and
/// the timer's looks before each.
#[derive(Debug, Clone)]
struct TwoHandlers {
    lens: [usize; 2],
    chunk: usize,
    budget: usize,
    pulls: [Vec<(usize, usize)>; 2],
    turns: Vec<bool>,
    looks: Vec<usize>,
}

fn two_handlers() -> impl Strategy<Value = TwoHandlers> {
    let sizes = (
        (64usize << 10)..(2 << 20),
        (64usize << 10)..(2 << 20),
        prop::sample::select(vec![4usize << 10, 64 << 10, 256 << 10]),
        prop::sample::select(vec![512usize << 10, 1 << 20, 4 << 20]),
    );
    sizes.prop_flat_map(|(a, b, chunk, budget)| {
        (pieces(a), pieces(b), prop::collection::vec(any::<bool>(), 12), prop::collection::vec(0usize..3, 12))
            .prop_map(move |(pa, pb, turns, looks)| TwoHandlers {
                lens: [a, b],
                chunk,
                budget,
                pulls: [pa, pb],
                turns,
                looks,
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the pulls' order and timing, the socket's pace and the peer's budget, every pull
    /// gets exactly its bytes, the request behind the payload is served, and once both are
    /// answered nothing is left parked, counted or remembered.
    #[test]
    fn pulls_in_any_order_and_timing_get_their_bytes_and_leave_nothing_behind(h in handler()) {
        let cfg = Config { early_bytes_per_peer: h.budget, ..Config::default() };
        let (mut p, _srv, req, meta, next, data) = payload_nobody_pulls_in(cfg, h.len, h.chunk, h.capacity);
        let posted = h.answer_after.unwrap_or(h.pulls.len());
        let mut ops = Vec::new();
        for (&(off, n), &looks) in h.pulls.iter().zip(&h.looks).take(posted) {
            looks_of_the_timer(&mut p, looks);
            ops.push((p.post(false, pull(&meta, off as u64, n)), off, n));
            p.drive();
        }
        if h.answer_after.is_some() {
            p.post(false, reply(&meta));
        }
        looks_of_the_timer(&mut p, 3);
        for (op, off, n) in ops {
            prop_assert!(!p.pending(false, op), "the pull of {n} bytes at {off} never completed");
            let done = p.take(false, op);
            if h.answer_after.is_some() && matches!(done.result, Err(Error::PeerCancelled)) {
                // Answered first: the client stopped the stream before these bytes.
                continue;
            }
            let got = bytes_of(&done);
            prop_assert!(got == data[off..off + n], "the pull of {n} bytes at {off} got other bytes");
        }
        let m2 = p.server.requests.pop_front().expect("the request behind the payload arrived");
        if h.answer_after.is_some() {
            p.post(false, reply(&m2));
            p.drive();
            prop_assert!(p.take(true, req).result.is_ok());
            prop_assert!(p.take(true, next).result.is_ok());
        } else {
            answer_both(&mut p, &meta, req, &m2, next, h.len);
        }
        prop_assert_eq!(p.server.s.peers.buffered(), 0, "budget still counted");
        prop_assert_eq!(p.server.s.streams.len(), 0, "a stream is remembered");
    }

    /// Two streamed payloads on one connection, their pulls interleaved in any order and
    /// timing: every pull gets its bytes, the request behind them is served, and nothing is
    /// left parked, counted or remembered.
    #[test]
    fn two_payloads_on_one_connection_pulled_in_any_order_get_their_bytes(h in two_handlers()) {
        let cfg = Config { early_bytes_per_peer: h.budget, ..Config::default() };
        let mut p = Pair::new(cfg);
        p.chunk = h.chunk;
        p.capacity = 256 << 10;
        let srv = p.connect();
        let data = [pattern(h.lens[0], 7), pattern(h.lens[1], 9)];
        let heads: [&'static [u8]; 2] = [b"a", b"b"];
        let reqs: Vec<OpId> = (0..2)
            .map(|i| {
                let out = Payload::Out(SendBuf::from(data[i].clone()));
                p.post(true, request(srv, 1, ServiceLevel::Bulk, heads[i], out))
            })
            .collect();
        let next = p.post(true, request(srv, 1, ServiceLevel::Bulk, b"next", Payload::None));
        p.drive();
        let mut metas: [Option<RequestMeta>; 2] = [None, None];
        let mut behind = None;
        let mut left = h.pulls.clone().map(std::collections::VecDeque::from);
        let mut ops = Vec::new();
        let mut turn = 0;
        let mut idle = 0;
        while left.iter().any(|q| !q.is_empty()) {
            while let Some(m) = p.server.requests.pop_front() {
                match heads.iter().position(|hd| m.header[..] == hd[..]) {
                    Some(i) => metas[i] = Some(m),
                    None => behind = Some(m),
                }
            }
            let first = usize::from(h.turns[turn % h.turns.len()]);
            let Some(i) = [first, 1 - first].into_iter().find(|&i| metas[i].is_some() && !left[i].is_empty())
            else {
                idle += 1;
                prop_assert!(idle < 100, "no request to pull arrived");
                looks_of_the_timer(&mut p, 1);
                continue;
            };
            looks_of_the_timer(&mut p, h.looks[turn % h.looks.len()]);
            turn += 1;
            let (off, n) = left[i].pop_front().expect("a piece left");
            let meta = metas[i].as_ref().expect("arrived");
            ops.push((p.post(false, pull(meta, off as u64, n)), i, off, n));
            p.drive();
        }
        looks_of_the_timer(&mut p, 3);
        for (op, i, off, n) in ops {
            prop_assert!(!p.pending(false, op), "the pull of {n} bytes at {off} of {i} never completed");
            let got = bytes_of(&p.take(false, op));
            prop_assert!(got == data[i][off..off + n], "the pull of {n} bytes at {off} of {i} got other bytes");
        }
        if behind.is_none() {
            behind = p.server.requests.pop_front();
        }
        let behind = behind.expect("the request behind the payloads arrived");
        for m in metas.iter().flatten().chain([&behind]) {
            p.post(false, reply(m));
        }
        p.drive();
        for (i, req) in reqs.into_iter().enumerate() {
            prop_assert_eq!(p.take(true, req).result.ok(), Some(h.lens[i]));
        }
        prop_assert!(p.take(true, next).result.is_ok());
        prop_assert_eq!(p.server.s.peers.buffered(), 0, "budget still counted");
        prop_assert_eq!(p.server.s.streams.len(), 0, "a stream is remembered");
    }
}

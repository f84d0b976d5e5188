//! The meta server killed with SIGKILL keeps every change it made durable before answering:
//! those it may make durable later (changes of times alone) are the only ones a crash can
//! take, and only until a sync or the next flush; never a set-id bit a write cleared.

mod common;

use bytes::Bytes;
use common::{TestCluster, no_flushes, no_objects_ahead};
use std::time::{Duration, Instant};
use stripefs::capability::Rights;
use stripefs::cluster::ServerId;
use stripefs::proto::{self, Cred, Envelope, MetaCall, MetaReply, MetaRequest, SetAttr, SetTime, Timestamp};
use stripefs::{CreateOptions, net::TAG_META};

fn meta_call(tc: &TestCluster, cred: Cred, req: MetaRequest) -> MetaReply {
    let cfg = stripefs::net::endpoint_config(&tc.key(), ionet::WaitMode::Block, false, None);
    let ep = ionet::Endpoint::client(cfg).unwrap();
    let meta = ep.connect(&tc.cluster.config().meta).unwrap();
    let body = proto::encode(&Envelope::new(1, MetaCall { cred, req })).unwrap();
    let op = ep
        .request(meta, TAG_META, Bytes::from(body), ionet::Payload::None, ionet::ServiceLevel::Control)
        .unwrap();
    proto::decode::<MetaReply>(&ep.wait(op).unwrap().reply.expect("a reply")).unwrap().body
}

/// A write's time recorded lazily by another user still clears the set-user-ID bit durably.
#[test]
fn a_set_id_bit_cleared_by_a_lazy_record_survives_a_crash() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let c = tc.client();
    let f = c.create("/suid", CreateOptions { mode: 0o4777, layout: None }).unwrap();
    f.write_all_at(0, b"data").unwrap();
    f.sync().unwrap();
    let h = f.handle();
    assert_eq!(c.getattr(h).unwrap().mode & 0o7777, 0o4777);
    let writer = Cred { uid: 1000, gid: 1000, groups: proto::BoundedVec::empty() };
    let set =
        SetAttr { mtime: Some(SetTime::Now), wrote: true, opened_for_write: true, ..Default::default() };
    match meta_call(&tc, writer, MetaRequest::Setattr { handle: h, set }) {
        MetaReply::Attr(a) => assert_eq!(a.mode & 0o7777, 0o777),
        r => panic!("{r:?}"),
    }
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    let c = tc.client();
    assert_eq!(c.getattr(h).unwrap().mode & 0o7777, 0o777, "the set-user-ID bit came back");
}

const PAST: Timestamp = Timestamp { secs: 1_000_000, nsecs: 7 };

fn set_past(c: &stripefs::Client, h: proto::Handle) {
    let set = SetAttr { mtime: Some(SetTime::At(PAST)), ..Default::default() };
    assert_eq!(c.setattr(h, set).unwrap().mtime, PAST);
}

/// Changes of times alone, committed without a flush, are durable once a sync asks: a file's
/// sync (here a reader's, of a time another client set) or the client's `sync_metadata`.
#[test]
fn a_sync_makes_changes_of_times_durable() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let c = tc.client();
    let f = c.create("/f", CreateOptions::default()).unwrap().handle();
    let d = c.mkdir("/d", 0o755).unwrap();
    set_past(&c, f);
    tc.client().open("/f", Rights::READ).unwrap().sync().unwrap();
    set_past(&c, d);
    c.sync_metadata().unwrap();
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    let c = tc.client();
    assert_eq!(c.getattr(f).unwrap().mtime, PAST, "the file's time was lost though it was synced");
    assert_eq!(c.getattr(d).unwrap().mtime, PAST, "the directory's time was lost though it was synced");
}

/// The value of the meta server's `stripefs_meta_unflushed_commits` gauge at `addr`.
fn unflushed(addr: std::net::SocketAddr) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let line = out.lines().find(|l| l.starts_with("stripefs_meta_unflushed_commits{")).expect("the gauge");
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

/// Without a sync, a change of times alone is flushed within the meta server's interval (a
/// second by default), which its metrics show; a crash after that keeps it.
#[test]
fn a_change_of_times_is_flushed_within_the_interval() {
    let mut tc = TestCluster::start_with("tcp", 2, |o| {
        no_objects_ahead(o);
        o.metrics = Some("127.0.0.1:0".parse().unwrap());
    });
    let c = tc.client();
    let f = c.create("/f", CreateOptions::default()).unwrap().handle();
    set_past(&c, f);
    let metrics = tc.cluster.metrics_addr(ServerId::Meta).expect("the meta server serves metrics");
    let deadline = Instant::now() + Duration::from_secs(30);
    while unflushed(metrics) > 0 {
        assert!(Instant::now() < deadline, "the change was never flushed");
        std::thread::sleep(Duration::from_millis(50));
    }
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    assert_eq!(tc.client().getattr(f).unwrap().mtime, PAST, "the flushed time was lost");
}

/// A mode change that takes bits away, and a change of owner, are durable when answered: a
/// crash never opens a file up again. (One that only adds bits may wait for the flush.)
#[test]
fn a_mode_taken_away_and_an_owner_changed_survive_a_crash() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let c = tc.client();
    let f = c.create("/f", CreateOptions { mode: 0o644, layout: None }).unwrap().handle();
    let g = c.create("/g", CreateOptions { mode: 0o644, layout: None }).unwrap().handle();
    c.setattr(f, SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    c.setattr(g, SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() }).unwrap();
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    let c = tc.client();
    assert_eq!(c.getattr(f).unwrap().mode & 0o7777, 0o600, "the file was opened up again");
    let a = c.getattr(g).unwrap();
    assert_eq!((a.uid, a.gid), (1000, 1000), "the owner came back");
}

/// Creates from several clients at once, which share the meta server's flushes, are each
/// durable when answered.
#[test]
fn concurrent_creates_are_durable_when_answered() {
    let mut tc = TestCluster::start_with("tcp", 2, no_flushes);
    let (clients, each) = (4, 50);
    std::thread::scope(|s| {
        for t in 0..clients {
            let c = tc.client();
            s.spawn(move || {
                for i in 0..each {
                    c.create(&format!("/t{t}-{i}"), CreateOptions::default()).unwrap();
                }
            });
        }
    });
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    let c = tc.client();
    let lost: Vec<String> = (0..clients)
        .flat_map(|t| (0..each).map(move |i| format!("/t{t}-{i}")))
        .filter(|p| c.stat(p).is_err())
        .collect();
    assert!(lost.is_empty(), "{} answered creates lost: {lost:?}", lost.len());
}

//! The meta server killed with SIGKILL keeps every change it made durable before answering:
//! those it may make durable later (a write's time recorded at close) are the only ones a crash
//! can take, and never a set-id bit a write cleared.

mod common;

use bytes::Bytes;
use common::{TestCluster, no_objects_ahead};
use stripefs::proto::{self, Cred, Envelope, MetaCall, MetaReply, MetaRequest, SetAttr, SetTime};
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
    let mut tc = TestCluster::start_with("tcp", 2, no_objects_ahead);
    let c = tc.client();
    let f = c.create("/suid", CreateOptions { mode: 0o4777, layout: None }).unwrap();
    f.write_all_at(0, b"data").unwrap();
    f.sync().unwrap();
    let h = f.handle();
    assert_eq!(c.getattr(h).unwrap().mode & 0o7777, 0o4777);
    let writer = Cred { uid: 1000, gid: 1000, groups: proto::BoundedVec::empty() };
    let set = SetAttr {
        mtime: Some(SetTime::Now),
        wrote: true,
        opened_for_write: true,
        lazy: true,
        ..Default::default()
    };
    match meta_call(&tc, writer, MetaRequest::Setattr { handle: h, set }) {
        MetaReply::Attr(a) => assert_eq!(a.mode & 0o7777, 0o777),
        r => panic!("{r:?}"),
    }
    tc.cluster.kill_meta();
    tc.cluster.restart_meta().unwrap();
    let c = tc.client();
    assert_eq!(c.getattr(h).unwrap().mode & 0o7777, 0o777, "the set-user-ID bit came back");
}

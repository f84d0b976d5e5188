use bytes::{Bytes, BytesMut};
use ionet::*;
use std::time::Duration;

#[test]
fn eager_and_rendezvous_round_trip() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let addr = srv.local_addr().unwrap();
    let cli = Endpoint::client(Config::default()).unwrap();
    let p = cli.connect(&addr).unwrap();
    let t = std::thread::spawn(move || {
        let u = srv.recv_unexpected(Some(Duration::from_secs(5))).unwrap().unwrap();
        assert_eq!(&u.data[..], b"hello");
        let peer = u.peer;
        let op = srv.recv(peer, 7, BytesMut::zeroed(1 << 20)).unwrap();
        let c = srv.wait(op).unwrap();
        assert_eq!(c.len(), 1 << 20);
        let op = srv.send(peer, 8, Bytes::from_static(b"pong"), ServiceLevel::Normal).unwrap();
        srv.wait(op).unwrap().ok().unwrap();
    });
    let op = cli.send_unexpected(p, 1, Bytes::from_static(b"hello"), ServiceLevel::Control).unwrap();
    cli.wait(op).unwrap().ok().unwrap();
    let big = Bytes::from(vec![7u8; 1 << 20]);
    let op = cli.send(p, 7, big, ServiceLevel::Bulk).unwrap();
    let r = cli.recv(p, 8, BytesMut::zeroed(16)).unwrap();
    cli.wait(op).unwrap().ok().unwrap();
    let c = cli.wait(r).unwrap();
    assert_eq!(c.len(), 4);
    t.join().unwrap();
}

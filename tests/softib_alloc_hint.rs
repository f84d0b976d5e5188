//! The allocation hint for list buffers (`IbConfig::list_alloc_hint`, as in PVFS over InfiniBand): the rows
//! of one array sent as a gather list cost one registration with the hint, one per row
//! without, and the bytes arrive the same either way.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::{Config, Endpoint, IbConfig, Payload, SendBuf, ServiceLevel};

const T: Duration = Duration::from_secs(20);
const ROWS: usize = 64;
const ROW: usize = 8 * 1024;
const STRIDE: usize = 2 * ROW;

/// Sends every other 8 KiB row of a 1 MiB array as one request payload (pulled by the server
/// with RDMA_READ); returns the client's registration-cache misses and the bytes received.
fn rows_through(hint: bool) -> (u64, Vec<u8>) {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cfg = Config::default().ib(IbConfig::default().list_alloc_hint(hint));
    let cli = Endpoint::client(cfg).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    let array = Bytes::from((0..ROWS * STRIDE).map(|i| (i / 7) as u8).collect::<Vec<u8>>());
    let rows: Vec<Bytes> = (0..ROWS).map(|r| array.slice(r * STRIDE..r * STRIDE + ROW)).collect();
    let server = std::thread::spawn(move || {
        let req = srv.next_request(Some(T)).unwrap().expect("request arrives");
        let len = req.payload_len() as usize;
        let c = srv.wait_timeout(req.pull_into(BytesMut::zeroed(len), 0).unwrap(), T).unwrap().unwrap();
        let data = c.ok().unwrap().data().unwrap().to_vec();
        srv.wait_timeout(req.reply(Bytes::from_static(b"ok")).unwrap(), T).unwrap().unwrap().ok().unwrap();
        data
    });
    let op = cli
        .request(peer, 1, Bytes::from_static(b"w"), Payload::Out(SendBuf::List(rows)), ServiceLevel::Bulk)
        .unwrap();
    let c = cli.wait_timeout(op, T).unwrap().expect("request completes").ok().unwrap();
    assert_eq!(c.mechanism, Some(ionet::Mechanism::ServerRdma));
    let got = server.join().unwrap();
    let rc = cli.info().regcache.expect("softib has a registration cache");
    (rc.misses, got)
}

#[test]
fn hinted_rows_register_once_unhinted_once_each() {
    let want: Vec<u8> =
        (0..ROWS).flat_map(|r| (r * STRIDE..r * STRIDE + ROW).map(|i| (i / 7) as u8)).collect();
    let (without, a) = rows_through(false);
    let (with, b) = rows_through(true);
    assert_eq!(a, want, "bytes without the hint");
    assert_eq!(b, want, "bytes with the hint");
    assert_eq!(without, ROWS as u64, "one registration per row without the hint");
    assert_eq!(with, 1, "one registration of the rows' span with the hint");
}

//! Taking a completion's bytes: `into_data` hands back the receive buffer itself, cut to the
//! bytes that arrived, so a server-sized read (an IN payload larger than the answer) costs no
//! copy on the client.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::{Config, Endpoint, Payload, ServiceLevel};

const LONG: Duration = Duration::from_secs(10);

#[test]
fn into_data_takes_the_received_bytes_without_a_copy() {
    for scheme in ["tcp", "softib"] {
        let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()).unwrap();
        let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
        let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
        // The client does not know the answer's size: it offers 1 MiB, the server pushes 1000 B.
        let buf = BytesMut::zeroed(1 << 20);
        let at = buf.as_ptr();
        let op = cli
            .request(peer, 1, Bytes::from_static(b"get"), Payload::In(buf.into()), ServiceLevel::Normal)
            .unwrap();
        let req = srv.next_request(Some(LONG)).unwrap().expect("the request");
        let answer: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        srv.wait(req.push_from(Bytes::from(answer.clone()), 0).unwrap()).unwrap().ok().unwrap();
        srv.wait(req.reply(Bytes::from_static(b"1000")).unwrap()).unwrap().ok().unwrap();
        let c = cli.wait_timeout(op, LONG).unwrap().expect("answered").ok().unwrap();
        assert_eq!(c.len(), 1000, "{scheme}");
        assert_eq!(c.data().unwrap()[..], answer[..], "{scheme}");
        let data = c.into_data().unwrap();
        assert_eq!(data[..], answer[..], "{scheme}");
        assert_eq!(data.as_ptr(), at, "{scheme}: the bytes were copied");
    }
}

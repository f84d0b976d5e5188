//! A connection nobody accepts: the first operation fails with an error that names the address
//! and says the connection was refused, on both transports.

use std::time::Duration;

use bytes::Bytes;
use ionet::{Config, Endpoint, Error, Payload, ServiceLevel};

#[test]
fn a_refused_connection_fails_the_first_operation_clearly() {
    for scheme in ["tcp", "softib"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cli = Endpoint::client(Config::default()).unwrap();
        let peer = cli.connect(format!("{scheme}://127.0.0.1:{port}")).unwrap();
        let op = cli.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap();
        let c =
            cli.wait_timeout(op, Duration::from_secs(10)).unwrap().expect("the first operation never failed");
        match c.result {
            Err(Error::PeerLost { reason, .. }) => {
                assert!(reason.contains(&format!("127.0.0.1:{port}")), "{scheme}: {reason}");
                assert!(reason.to_lowercase().contains("refused"), "{scheme}: {reason}");
            }
            other => panic!("{scheme}: {other:?}"),
        }
    }
}

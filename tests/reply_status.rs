//! Error replies with an application status reach the client as a number, on both transports.

use std::time::Duration;

use bytes::Bytes;
use ionet::{Config, Endpoint, Error, Payload, ServiceLevel};

const LONG: Duration = Duration::from_secs(10);

#[test]
fn an_application_status_reaches_the_client() {
    for scheme in ["tcp", "softib"] {
        // Progress is explicit: the server answers and then takes no more requests, so a thread
        // of its own must move the answers (and the dropped request's) out.
        let srv_cfg = Config::default().progress_thread(true);
        let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), srv_cfg).unwrap();
        let cli = Endpoint::client(Config::default().progress_thread(true)).unwrap();
        let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
        let ask = |s: &'static [u8]| {
            cli.request(peer, 1, Bytes::from_static(s), Payload::None, ServiceLevel::Normal).unwrap()
        };
        let ops = [ask(b"status"), ask(b"max"), ask(b"text"), ask(b"drop")];
        for _ in 0..ops.len() {
            let req = srv.next_request(Some(LONG)).unwrap().expect("a request");
            match &req.header()[..] {
                b"status" => drop(req.reply_status(2, "no such file").unwrap()),
                b"max" => drop(req.reply_status(u16::MAX, "the last code").unwrap()),
                b"text" => drop(req.reply_error("plain").unwrap()),
                _ => drop(req),
            }
        }
        let results: Vec<_> =
            ops.iter().map(|&op| cli.wait_timeout(op, LONG).unwrap().expect("answered").result).collect();
        assert!(
            matches!(&results[0], Err(Error::RemoteStatus { status: 2, reason }) if reason == "no such file"),
            "{scheme}: {:?}",
            results[0]
        );
        assert!(
            matches!(&results[1], Err(Error::RemoteStatus { status: u16::MAX, .. })),
            "{scheme}: {:?}",
            results[1]
        );
        assert!(matches!(&results[2], Err(Error::Remote(m)) if m == "plain"), "{scheme}: {:?}", results[2]);
        assert!(
            matches!(&results[3], Err(Error::Remote(m)) if m.contains("dropped")),
            "{scheme}: {:?}",
            results[3]
        );
    }
}

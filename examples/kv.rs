//! A minimal key-value store on the request + payload API — the shape of a storage protocol.
//!
//! ```sh
//! cargo run --release --example kv
//! ```
//!
//! * `PUT key` carries the value as an OUT payload: the server pulls it (inline when small,
//!   rendezvous / server-based RDMA when large — the communication manager decides).
//! * `GET key` offers an IN buffer as large as any value may be: the server pushes the value
//!   into it, and the client's completion says how many bytes came (`Completion::len`), so the
//!   client need not know the value's size.
//!
//! The request header is a tiny text command; the reply header carries a status. Nothing in
//! this file depends on the transport: change `tcp://` to `softib://` and it runs over the
//! InfiniBand engine.

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::{Config, Direction, Endpoint, Payload, RecvBuf, ServiceLevel};

const PUT: u64 = 1;
const GET: u64 = 2;
const QUIT: u64 = 3;
/// The largest value; a GET offers this much room.
const MAX_VALUE: usize = 8 << 20;

/// Serves requests until QUIT.
fn serve(ep: Endpoint) -> ionet::Result<()> {
    let mut store: HashMap<Vec<u8>, Bytes> = HashMap::new();
    loop {
        let Some(req) = ep.next_request(Some(Duration::from_secs(30)))? else { continue };
        let key = req.header().to_vec();
        match req.tag() {
            PUT if req.direction() == Direction::Out => {
                // Pull the value into a buffer of its size. Big values could be pulled in
                // pieces with several pulls in flight; one is enough here.
                let len = req.payload_len() as usize;
                let c = ep.wait(req.pull_into(BytesMut::zeroed(len), 0)?)?.ok()?;
                let value = match c.buf.into_recv() {
                    Some(RecvBuf::Mut(b)) => b.freeze(),
                    _ => Bytes::new(),
                };
                store.insert(key, value);
                ep.wait(req.reply(Bytes::from_static(b"stored"))?)?.ok()?;
            }
            GET if req.direction() == Direction::In => match store.get(&key) {
                Some(v) if v.len() as u64 <= req.payload_len() => {
                    // The client learns the value's length from the bytes pushed.
                    ep.wait(req.push_from(v.clone(), 0)?)?.ok()?;
                    ep.wait(req.reply(Bytes::new())?)?.ok()?;
                }
                Some(_) => {
                    ep.wait(req.reply_error("buffer too small")?)?.ok()?;
                }
                None => {
                    ep.wait(req.reply_error("no such key")?)?.ok()?;
                }
            },
            QUIT => {
                ep.wait(req.reply(Bytes::new())?)?.ok()?;
                return Ok(());
            }
            _ => {
                ep.wait(req.reply_error("bad request")?)?.ok()?;
            }
        }
    }
}

fn main() -> ionet::Result<()> {
    let server = Endpoint::bind("tcp://127.0.0.1:0", Config::default())?;
    let addr = server.local_addr().expect("bound");
    let t = std::thread::spawn(move || serve(server));

    let client = Endpoint::client(Config::default())?;
    let peer = client.connect(&addr)?;
    for (key, len) in [("small", 100usize), ("large", MAX_VALUE)] {
        let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let op = client.request(
            peer,
            PUT,
            key,
            Payload::Out(Bytes::from(value.clone()).into()),
            ServiceLevel::Bulk,
        )?;
        let c = client.wait(op)?.ok()?;
        println!(
            "PUT {key} ({len} B): {:?} via {:?}",
            c.reply.as_deref().map(String::from_utf8_lossy),
            c.mechanism
        );

        let room = Payload::In(BytesMut::zeroed(MAX_VALUE).into());
        let c = client.wait(client.request(peer, GET, key, room, ServiceLevel::Bulk)?)?.ok()?;
        println!("GET {key}: {} B back, via {:?}", c.len(), c.mechanism);
        let got = c.into_data().expect("a receive buffer");
        assert_eq!(got[..], value[..], "value round trip");
    }
    let op = client.request(
        peer,
        GET,
        "missing",
        Payload::In(BytesMut::zeroed(16).into()),
        ServiceLevel::Control,
    )?;
    println!("GET missing: {}", client.wait(op)?.result.unwrap_err());
    client.wait(client.request(peer, QUIT, Bytes::new(), Payload::None, ServiceLevel::Control)?)?.ok()?;
    t.join().expect("server thread")?;
    Ok(())
}

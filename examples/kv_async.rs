//! The key-value store of `kv.rs` on tokio: the server handles each request in a task of its
//! own, the client keeps many requests in flight from one task — no thread per operation.
//!
//! ```sh
//! cargo run --release --features tokio --example kv_async
//! ```
//!
//! * `PUT key` carries the value as an OUT payload the server pulls.
//! * `GET key` offers an IN buffer the server pushes the value into.
//!
//! Change `tcp://` to `softib://` and it runs over the InfiniBand engine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use ionet::tokio::AsyncEndpoint;
use ionet::{Config, Direction, Endpoint, Payload, RecvBuf, Request, ServiceLevel};

const PUT: u64 = 1;
const GET: u64 = 2;

type Store = Arc<Mutex<HashMap<Vec<u8>, Bytes>>>;

/// Answers one request.
async fn handle(ep: AsyncEndpoint, store: Store, req: Request) -> ionet::Result<()> {
    let key = req.header().to_vec();
    match req.tag() {
        PUT if req.direction() == Direction::Out => {
            let len = req.payload_len() as usize;
            let c = ep.completion(req.pull_into(BytesMut::zeroed(len), 0)?).await?.ok()?;
            let value = match c.buf.into_recv() {
                Some(RecvBuf::Mut(b)) => b.freeze(),
                _ => Bytes::new(),
            };
            store.lock().unwrap().insert(key, value);
            ep.completion(req.reply(Bytes::from_static(b"stored"))?).await?.ok()?;
        }
        GET if req.direction() == Direction::In => {
            let value = store.lock().unwrap().get(&key).cloned();
            match value {
                Some(v) if v.len() as u64 <= req.payload_len() => {
                    ep.completion(req.push_from(v.clone(), 0)?).await?.ok()?;
                    ep.completion(req.reply(Bytes::from(v.len().to_string()))?).await?.ok()?;
                }
                Some(_) => drop(ep.completion(req.reply_error("buffer too small")?).await?),
                None => drop(ep.completion(req.reply_error("no such key")?).await?),
            }
        }
        _ => drop(ep.completion(req.reply_error("bad request")?).await?),
    }
    Ok(())
}

/// Serves until the endpoint shuts down: one task per request.
async fn serve(ep: AsyncEndpoint) {
    let store = Store::default();
    while let Ok(req) = ep.next_request().await {
        let (ep, store) = (ep.clone(), store.clone());
        tokio::spawn(async move {
            if let Err(e) = handle(ep, store, req).await {
                eprintln!("request failed: {e}");
            }
        });
    }
}

#[tokio::main]
async fn main() -> ionet::Result<()> {
    let server = AsyncEndpoint::new(Endpoint::bind("tcp://127.0.0.1:0", Config::default())?)?;
    let addr = server.endpoint().local_addr().expect("bound");
    let served = tokio::spawn(serve(server.clone()));

    let client = AsyncEndpoint::new(Endpoint::client(Config::default())?)?;
    let peer = client.endpoint().connect(&addr)?;

    // 32 PUTs in flight at once, from 1 B to 8 MiB.
    let values: Vec<(String, Bytes)> = (0..32)
        .map(|i| {
            let len = 1usize << (i % 24);
            let v: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
            (format!("key{i}"), Bytes::from(v))
        })
        .collect();
    let puts: Vec<_> = values
        .iter()
        .map(|(k, v)| {
            let op = client.endpoint().request(
                peer,
                PUT,
                Bytes::from(k.clone()),
                Payload::Out(v.clone().into()),
                ServiceLevel::Bulk,
            )?;
            Ok(client.completion(op))
        })
        .collect::<ionet::Result<_>>()?;
    for f in puts {
        f.await?.ok()?;
    }
    println!("{} values stored", values.len());

    // And every value back, also all in flight.
    let gets: Vec<_> = values
        .iter()
        .map(|(k, v)| {
            let buf = BytesMut::zeroed(v.len());
            let op = client.endpoint().request(
                peer,
                GET,
                Bytes::from(k.clone()),
                Payload::In(buf.into()),
                ServiceLevel::Bulk,
            )?;
            Ok(client.completion(op))
        })
        .collect::<ionet::Result<_>>()?;
    let mut bytes = 0;
    for (f, (k, v)) in gets.into_iter().zip(&values) {
        let c = f.await?.ok()?;
        assert_eq!(c.data().expect("one buffer")[..], v[..], "{k} round trip");
        bytes += v.len();
    }
    println!("{} values read back and verified ({bytes} B)", values.len());

    let op = client.endpoint().request(
        peer,
        GET,
        Bytes::from_static(b"missing"),
        Payload::In(BytesMut::zeroed(16).into()),
        ServiceLevel::Control,
    )?;
    println!("GET missing: {}", client.completion(op).await?.result.unwrap_err());
    server.endpoint().shutdown();
    served.await.expect("server task");
    Ok(())
}

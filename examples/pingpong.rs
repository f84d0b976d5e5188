//! Ping-pong over ionet: the smallest complete program.
//!
//! ```sh
//! cargo run --release --example pingpong -- tcp            # server and client in one process
//! cargo run --release --example pingpong -- tcp spin 20000 # busy-poll waits, 20 000 round trips
//! ```
//!
//! The server echoes every message back; the client reports the median round-trip time.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use ionet::{Config, Endpoint, ServiceLevel, WaitMode};

const TAG: u64 = 1;

fn main() -> ionet::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let scheme = args.get(1).map_or("tcp", String::as_str);
    let mode: WaitMode = args.get(2).map_or("block", String::as_str).parse().map_err(ionet::Error::misuse)?;
    let iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10_000);

    // The server: it learns who the client is from an unexpected "hello", then echoes.
    let server = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default().wait_mode(mode))?;
    let addr = server.local_addr().expect("bound");
    let echo = std::thread::spawn(move || -> ionet::Result<()> {
        let hello = server.recv_unexpected(None)?.expect("hello");
        let mut buf = BytesMut::zeroed(64);
        for _ in 0..iters {
            let c = server.wait(server.recv(hello.peer, TAG, buf)?)?.ok()?;
            let n = c.len();
            let data = c.data().expect("single buffer");
            buf = match c.buf.into_recv() {
                Some(ionet::RecvBuf::Mut(b)) => b,
                _ => BytesMut::zeroed(64),
            };
            server.wait(server.send(hello.peer, TAG, data.slice(..n), ServiceLevel::Control)?)?.ok()?;
        }
        Ok(())
    });

    // The client.
    let client = Endpoint::client(Config::default().wait_mode(mode))?;
    let peer = client.connect(&addr)?;
    client
        .wait(client.send_unexpected(peer, 0, Bytes::from_static(b"hello"), ServiceLevel::Control)?)?
        .ok()?;
    let msg = Bytes::from_static(b"ping1234");
    let mut rtts = Vec::with_capacity(iters);
    let mut buf = BytesMut::zeroed(64);
    for _ in 0..iters {
        let t = Instant::now();
        let r = client.recv(peer, TAG, buf)?;
        client.wait(client.send(peer, TAG, msg.clone(), ServiceLevel::Control)?)?.ok()?;
        let c = client.wait(r)?.ok()?;
        rtts.push(t.elapsed());
        assert_eq!(c.data().expect("single buffer")[..c.len()], msg[..]);
        buf = match c.buf.into_recv() {
            Some(ionet::RecvBuf::Mut(b)) => b,
            _ => BytesMut::zeroed(64),
        };
    }
    echo.join().expect("server thread")?;
    rtts.sort();
    println!(
        "{scheme}://, wait={}, {iters} round trips of 8 B: median RTT {:.2} µs, p99 {:.2} µs",
        mode.name(),
        rtts[iters / 2].as_secs_f64() * 1e6,
        rtts[iters * 99 / 100].as_secs_f64() * 1e6
    );
    Ok(())
}

//! The async API on tokio runtimes over `tcp://` and `softib://`: round trips, many requests in
//! flight, servers answering from tasks, and cancellation by dropping a future.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ionet::tokio::AsyncEndpoint;
use ionet::{Config, Endpoint, Error, Payload, PeerId, ServiceLevel, WaitMode};

/// An async echo server: every request answered from a task of its own with its header.
fn serve_echo(srv: AsyncEndpoint) {
    tokio::spawn(async move {
        while let Ok(req) = srv.next_request().await {
            let srv = srv.clone();
            tokio::spawn(async move {
                let h = req.header().clone();
                if let Ok(op) = req.reply(h) {
                    let _ = srv.completion(op).await;
                }
            });
        }
    });
}

async fn pair(scheme: &str, cfg: Config) -> (AsyncEndpoint, AsyncEndpoint, PeerId) {
    let srv =
        AsyncEndpoint::new(Endpoint::bind(format!("{scheme}://127.0.0.1:0"), cfg.clone()).unwrap()).unwrap();
    let cli = AsyncEndpoint::new(Endpoint::client(cfg).unwrap()).unwrap();
    let peer = cli.endpoint().connect(srv.endpoint().local_addr().unwrap()).unwrap();
    (srv, cli, peer)
}

async fn ask(cli: &AsyncEndpoint, peer: PeerId, body: Vec<u8>) -> ionet::Result<Bytes> {
    let op = cli.endpoint().request(peer, 1, Bytes::from(body), Payload::None, ServiceLevel::Normal)?;
    Ok(cli.completion(op).await?.ok()?.reply.unwrap_or_default())
}

async fn sequential_round_trips(scheme: &str, mode: WaitMode) {
    let (srv, cli, peer) = pair(scheme, Config::default().wait_mode(mode)).await;
    serve_echo(srv);
    for i in 0..500u32 {
        let body = i.to_le_bytes().to_vec();
        assert_eq!(ask(&cli, peer, body.clone()).await.unwrap()[..], body[..]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_over_tcp() {
    sequential_round_trips("tcp", WaitMode::Adaptive).await;
    sequential_round_trips("tcp", WaitMode::Block).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_over_softib() {
    sequential_round_trips("softib", WaitMode::Adaptive).await;
    sequential_round_trips("softib", WaitMode::Block).await;
}

/// One runtime thread: the driver tasks and the test share it, so nothing may block it.
#[tokio::test(flavor = "current_thread")]
async fn round_trips_on_a_current_thread_runtime() {
    for scheme in ["tcp", "softib"] {
        sequential_round_trips(scheme, WaitMode::Block).await;
    }
}

async fn many_in_flight(scheme: &str) {
    let (srv, cli, peer) = pair(scheme, Config::default()).await;
    serve_echo(srv);
    let tasks: Vec<_> = (0..1000u32)
        .map(|i| {
            let cli = cli.clone();
            tokio::spawn(async move {
                let body = i.to_le_bytes().to_vec();
                let got = ask(&cli, peer, body.clone()).await.unwrap();
                assert_eq!(got[..], body[..]);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(cli.endpoint().info().counters.ops_cancelled, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_in_flight_over_tcp() {
    many_in_flight("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_in_flight_over_softib() {
    many_in_flight("softib").await;
}

/// Length and a position-weighted sum: what a reply header can carry of a large payload.
fn digest(data: &[u8]) -> Vec<u8> {
    let sum =
        data.iter().enumerate().fold(0u64, |a, (i, &b)| a.wrapping_mul(31).wrapping_add(b as u64 ^ i as u64));
    [data.len() as u64, sum].iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// OUT payloads of every size class, pulled by a server in tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_move_both_ways() {
    for scheme in ["tcp", "softib"] {
        let (srv, cli, peer) = pair(scheme, Config::default()).await;
        tokio::spawn(async move {
            let mut reqs = srv.requests();
            while let Some(req) = reqs.next().await {
                let srv = srv.clone();
                tokio::spawn(async move {
                    let len = req.payload_len() as usize;
                    let c = srv.completion(req.pull_into(BytesMut::zeroed(len), 0).unwrap()).await.unwrap();
                    let _ = srv.completion(req.reply(Bytes::from(digest(&c.data().unwrap()))).unwrap()).await;
                });
            }
        });
        let ops: Vec<_> = [1usize, 4096, 1 << 20, 3 << 20]
            .into_iter()
            .map(|len| {
                let v: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                let op = cli
                    .endpoint()
                    .request(
                        peer,
                        2,
                        Bytes::new(),
                        Payload::Out(Bytes::from(v.clone()).into()),
                        ServiceLevel::Bulk,
                    )
                    .unwrap();
                (v, cli.completion(op))
            })
            .collect();
        for (v, f) in ops {
            let c = f.await.unwrap().ok().unwrap();
            assert_eq!(c.reply.as_deref(), Some(&digest(&v)[..]), "{scheme}: {} B", v.len());
        }
    }
}

/// A dropped future cancels its operation, which completes once, unseen; the next message
/// with that tag goes to the next receive.
async fn drop_cancels(scheme: &str) {
    let (srv, cli, peer) = pair(scheme, Config::default()).await;
    let srv_peer = {
        // The server learns the client's peer id from a first message.
        let op =
            cli.endpoint().send_unexpected(peer, 1, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
        cli.completion(op).await.unwrap().ok().unwrap();
        srv.recv_unexpected().await.unwrap().peer
    };
    let before = cli.endpoint().info().counters.ops_cancelled;
    for round in 0..50u64 {
        let op = cli.endpoint().recv(peer, 100 + round, BytesMut::zeroed(8)).unwrap();
        let f = cli.completion(op);
        // A timeout drops the future.
        assert!(tokio::time::timeout(Duration::from_millis(1), f).await.is_err());
        assert!(cli.endpoint().test(op).is_err(), "round {round}: the dropped operation is still tracked");
        // The message arrives after the cancel: a new receive gets it.
        let s = srv.endpoint().send(
            srv_peer,
            100 + round,
            Bytes::from(round.to_le_bytes().to_vec()),
            ServiceLevel::Normal,
        );
        let again = cli.endpoint().recv(peer, 100 + round, BytesMut::zeroed(8)).unwrap();
        let c = tokio::time::timeout(Duration::from_secs(10), cli.completion(again))
            .await
            .expect("the message went to the dropped receive")
            .unwrap()
            .ok()
            .unwrap();
        assert_eq!(c.data().unwrap()[..], round.to_le_bytes()[..]);
        srv.completion(s.unwrap()).await.unwrap().ok().unwrap();
    }
    // Each cancelled receive completed exactly once (with Cancelled), and nobody saw it.
    assert_eq!(cli.endpoint().info().counters.ops_cancelled - before, 50);
    assert!(cli.endpoint().wait_any(Some(Duration::ZERO)).unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_future_cancels_over_tcp() {
    drop_cancels("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_future_cancels_over_softib() {
    drop_cancels("softib").await;
}

/// A request the server never answers: dropping its future cancels it on the client; the
/// server's late reply finds nothing and harms nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_request_leaves_the_connection_usable() {
    for scheme in ["tcp", "softib"] {
        let (srv, cli, peer) = pair(scheme, Config::default()).await;
        let op =
            cli.endpoint().request(peer, 1, Bytes::from_static(b"slow"), Payload::None, ServiceLevel::Normal);
        let f = cli.completion(op.unwrap());
        let req = srv.next_request().await.unwrap();
        drop(f);
        // Answer anyway, then serve normally.
        let late = req.reply(Bytes::from_static(b"late")).unwrap();
        let _ = srv.completion(late).await;
        serve_echo(srv);
        assert_eq!(&ask(&cli, peer, b"next".to_vec()).await.unwrap()[..], b"next", "{scheme}");
        assert!(cli.endpoint().wait_any(Some(Duration::ZERO)).unwrap().is_none());
    }
}

/// Deadlines fire for futures too: the driver's timer covers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_a_pending_future() {
    let (_srv, cli, peer) = pair("tcp", Config::default().wait_mode(WaitMode::Block)).await;
    let op = cli.endpoint().recv(peer, 7, BytesMut::zeroed(4)).unwrap();
    cli.endpoint().set_deadline(op, std::time::Instant::now() + Duration::from_millis(20)).unwrap();
    let c = tokio::time::timeout(Duration::from_secs(10), cli.completion(op)).await.expect("deadline missed");
    assert!(matches!(c.unwrap().result, Err(Error::Timeout)));
}

/// Shutting an endpoint down ends its request stream and fails what is pending with Closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_request_stream_and_pending_futures() {
    for scheme in ["tcp", "softib"] {
        let (srv, cli, peer) = pair(scheme, Config::default()).await;
        let s2 = srv.clone();
        let server = tokio::spawn(async move {
            let mut reqs = s2.requests();
            let mut n = 0;
            while let Some(req) = reqs.next().await {
                n += 1;
                drop(req);
            }
            n
        });
        let op =
            cli.endpoint().request(peer, 1, Bytes::from_static(b"x"), Payload::None, ServiceLevel::Normal);
        let c = cli.completion(op.unwrap()).await.unwrap();
        assert!(matches!(c.result, Err(Error::Remote(_))), "{scheme}: an unanswered request: {:?}", c.result);
        let pending = cli.endpoint().recv(peer, 9, BytesMut::zeroed(4)).unwrap();
        let pending = cli.completion(pending);
        // The client first: shut down second, it could learn of the server's closed
        // connection before its own shutdown and fail the receive with PeerLost instead.
        cli.endpoint().shutdown();
        srv.endpoint().shutdown();
        assert_eq!(server.await.unwrap(), 1, "{scheme}");
        let c =
            tokio::time::timeout(Duration::from_secs(10), pending).await.expect("never completed").unwrap();
        assert!(matches!(c.result, Err(Error::Closed)), "{scheme}: {:?}", c.result);
    }
}

/// The driver task learns how long to spin as blocking waits do: after many quick replies, it
/// sleeps through a slow one before the configured budget has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_sleeps_early_through_a_wait_longer_than_recent_ones() {
    const BUDGET: Duration = Duration::from_millis(40);
    const SLOW_MS: u8 = 150;
    const SLOW: u64 = 5;
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().wait_mode(WaitMode::Block)).unwrap();
    let addr = srv.local_addr().unwrap();
    // A blocking server: each request's first byte is how many milliseconds to wait before
    // answering; an empty request stops it.
    let server = std::thread::spawn(move || {
        while let Ok(Some(req)) = srv.next_request(Some(Duration::from_secs(20))) {
            let h = req.header().clone();
            let Some(&ms) = h.first() else { return };
            std::thread::sleep(Duration::from_millis(ms.into()));
            let op = req.reply(h).unwrap();
            assert!(srv.wait_timeout(op, Duration::from_secs(20)).unwrap().is_some());
        }
    });
    let cfg = Config::default().wait_mode(WaitMode::Adaptive).spin_budget(BUDGET);
    let cli = AsyncEndpoint::new(Endpoint::client(cfg).unwrap()).unwrap();
    let peer = cli.endpoint().connect(addr).unwrap();
    // Quick requests for longer than the learnt spin remembers (two periods of 20 ms).
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        ask(&cli, peer, vec![0]).await.unwrap();
    }
    let before = cli.endpoint().info().counters.spins_cut_short;
    for _ in 0..SLOW {
        ask(&cli, peer, vec![SLOW_MS]).await.unwrap();
    }
    let cut = cli.endpoint().info().counters.spins_cut_short - before;
    let _ = ask(&cli, peer, Vec::new()).await;
    server.join().unwrap();
    assert!(cut >= SLOW, "{cut} of {SLOW} slow waits slept before the budget");
}

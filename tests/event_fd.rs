//! The endpoint's event descriptor driven as an application's event loop would drive it:
//! `try_progress`, look at completions, `arm`, sleep in `poll(2)` until readable. A lost
//! wake-up shows as a poll that times out while an operation is pending; an idle endpoint
//! must not wake its loop at all.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ionet::{Arm, Completion, Config, Endpoint, Error, OpId, Payload, PeerId, ServiceLevel};
use rustix::event::{PollFd, PollFlags, poll};

/// Far longer than any wake-up takes: a poll that lasts this long missed one.
const LOST: Duration = Duration::from_secs(10);

fn readable_within(ep: &Endpoint, t: Duration) -> bool {
    let ts = rustix::time::Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos().into() };
    let mut fds = [PollFd::new(ep, PollFlags::IN)];
    poll(&mut fds, Some(&ts)).unwrap() > 0
}

/// Waits for `op` the event-loop way; counts the sleeps.
fn wait_on_fd(ep: &Endpoint, op: OpId, sleeps: &mut u64) -> Completion {
    loop {
        ep.try_progress().unwrap();
        if let Some(c) = ep.test(op).unwrap() {
            return c;
        }
        if ep.arm().unwrap() == Arm::Armed {
            assert!(
                readable_within(ep, LOST),
                "armed descriptor never became readable while {op} was pending"
            );
            *sleeps += 1;
        }
    }
}

/// An echo server driven by blocking calls on its own thread, until the guard is dropped:
/// then the endpoint shuts down, which ends the thread's wait for requests.
fn echo_server(scheme: &str) -> (Endpoint, Echo) {
    let srv = Endpoint::bind(format!("{scheme}://127.0.0.1:0"), Config::default()).unwrap();
    let s = srv.clone();
    let h = std::thread::spawn(move || {
        while let Ok(Some(req)) = s.next_request(None) {
            let h = req.header().clone();
            let _ = req.reply(h);
        }
    });
    (srv.clone(), Echo(srv, Some(h)))
}

struct Echo(Endpoint, Option<std::thread::JoinHandle<()>>);

impl Drop for Echo {
    fn drop(&mut self) {
        self.0.shutdown();
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

fn client_of(srv: &Endpoint, cfg: Config) -> (Endpoint, PeerId) {
    let cli = Endpoint::client(cfg).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    (cli, peer)
}

fn round_trips_on_the_descriptor(scheme: &str) {
    let (srv, _echo) = echo_server(scheme);
    let (cli, peer) = client_of(&srv, Config::default());
    let mut sleeps = 0;
    for i in 0..2000u32 {
        let op =
            cli.request(peer, 1, Bytes::from(i.to_le_bytes().to_vec()), Payload::None, ServiceLevel::Normal);
        let c = wait_on_fd(&cli, op.unwrap(), &mut sleeps);
        assert_eq!(c.reply.as_deref(), Some(&i.to_le_bytes()[..]));
    }
    // Most round trips sleep on the descriptor rather than spin: the loop really waited.
    assert!(sleeps > 0);
}

#[test]
fn round_trips_wait_on_the_descriptor_over_tcp() {
    round_trips_on_the_descriptor("tcp");
}

#[test]
fn round_trips_wait_on_the_descriptor_over_softib() {
    round_trips_on_the_descriptor("softib");
}

/// Completions queued by other threads (their sends complete inside `post`, their waits
/// drive the transport) must wake the loop that sleeps on the descriptor.
fn other_threads_wake_the_loop(scheme: &str) {
    let (srv, _echo) = echo_server(scheme);
    let (cli, peer) = client_of(&srv, Config::default());
    let mut sleeps = 0;
    for round in 0..200u32 {
        // The loop's own operation, answered only after another thread's request.
        let mine = cli.recv(peer, 9, bytes::BytesMut::zeroed(8)).unwrap();
        let other = {
            let cli = cli.clone();
            std::thread::spawn(move || {
                let op = cli
                    .request(
                        peer,
                        1,
                        Bytes::from(round.to_le_bytes().to_vec()),
                        Payload::None,
                        ServiceLevel::Normal,
                    )
                    .unwrap();
                cli.wait(op).unwrap();
                // Completes inside `post` or in this thread's wait: either way not in the
                // loop's rounds.
                cli.cancel(mine).unwrap();
            })
        };
        let c = wait_on_fd(&cli, mine, &mut sleeps);
        assert!(matches!(c.result, Err(Error::Cancelled)), "round {round}: {:?}", c.result);
        other.join().unwrap();
    }
}

#[test]
fn other_threads_wake_the_loop_over_tcp() {
    other_threads_wake_the_loop("tcp");
}

#[test]
fn other_threads_wake_the_loop_over_softib() {
    other_threads_wake_the_loop("softib");
}

#[test]
fn a_deadline_makes_the_descriptor_readable() {
    let (srv, _echo) = echo_server("tcp");
    let (cli, peer) = client_of(&srv, Config::default());
    let op = cli.recv(peer, 5, bytes::BytesMut::zeroed(8)).unwrap();
    cli.set_deadline(op, Instant::now() + Duration::from_millis(30)).unwrap();
    let mut sleeps = 0;
    let c = wait_on_fd(&cli, op, &mut sleeps);
    assert!(matches!(c.result, Err(Error::Timeout)), "{:?}", c.result);
}

#[test]
fn a_deadline_set_while_armed_rearms_the_timer() {
    let (srv, _echo) = echo_server("tcp");
    let (cli, peer) = client_of(&srv, Config::default());
    let op = cli.recv(peer, 5, bytes::BytesMut::zeroed(8)).unwrap();
    // Settle: connection set-up done, nothing due.
    while cli.try_progress().unwrap() || cli.arm().unwrap() == Arm::Busy {}
    // Armed with no deadline, so no timer: the new deadline must reach the sleeper.
    cli.set_deadline(op, Instant::now() + Duration::from_millis(30)).unwrap();
    assert!(readable_within(&cli, LOST), "a deadline set while armed never woke the loop");
    let mut sleeps = 0;
    let c = wait_on_fd(&cli, op, &mut sleeps);
    assert!(matches!(c.result, Err(Error::Timeout)), "{:?}", c.result);
}

#[test]
fn an_idle_armed_endpoint_stays_quiet() {
    for scheme in ["tcp", "softib"] {
        let (srv, _echo) = echo_server(scheme);
        let (cli, peer) = client_of(&srv, Config::default());
        // Connected and idle: one finished round trip, then nothing.
        let op = cli.request(peer, 1, Bytes::from_static(b"x"), Payload::None, ServiceLevel::Normal).unwrap();
        let mut sleeps = 0;
        wait_on_fd(&cli, op, &mut sleeps);
        let mut wakeups = 0;
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(600) {
            cli.try_progress().unwrap();
            if cli.arm().unwrap() == Arm::Armed && readable_within(&cli, Duration::from_millis(300)) {
                wakeups += 1;
            }
        }
        assert!(wakeups <= 1, "{scheme}: an idle endpoint woke its loop {wakeups} times");
    }
}

#[test]
fn arm_is_busy_until_the_caller_has_looked() {
    let (srv, _echo) = echo_server("tcp");
    let (cli, peer) = client_of(&srv, Config::default());
    let op = cli.request(peer, 1, Bytes::from_static(b"x"), Payload::None, ServiceLevel::Normal).unwrap();
    let mut sleeps = 0;
    wait_on_fd(&cli, op, &mut sleeps);
    while cli.try_progress().unwrap() || cli.arm().unwrap() == Arm::Busy {}
    // Another thread's completion after the last round: the caller has not seen it.
    let c2 = cli.clone();
    let other = std::thread::spawn(move || {
        let op = c2.recv(peer, 3, bytes::BytesMut::zeroed(4)).unwrap();
        c2.cancel(op).unwrap();
        op
    })
    .join()
    .unwrap();
    // Already armed before the cancel: the descriptor must be readable now.
    assert!(readable_within(&cli, LOST));
    cli.try_progress().unwrap();
    assert!(cli.test(other).unwrap().is_some());
    // And a completion queued between a round and `arm` makes `arm` busy.
    let op = cli.recv(peer, 3, bytes::BytesMut::zeroed(4)).unwrap();
    cli.cancel(op).unwrap();
    assert_eq!(cli.arm().unwrap(), Arm::Busy);
}

#[test]
fn a_client_armed_before_connecting_hears_its_transport() {
    let (srv, _echo) = echo_server("tcp");
    let cli = Endpoint::client(Config::default()).unwrap();
    cli.try_progress().unwrap();
    assert_eq!(cli.arm().unwrap(), Arm::Armed);
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    let op = cli.request(peer, 1, Bytes::from_static(b"late"), Payload::None, ServiceLevel::Normal).unwrap();
    // Still armed from before the transport existed, not armed again: its events (the
    // connection, the reply) must reach the descriptor.
    assert!(readable_within(&cli, LOST), "the transport made after arming never woke the loop");
    let mut sleeps = 0;
    let c = wait_on_fd(&cli, op, &mut sleeps);
    assert_eq!(c.reply.as_deref(), Some(&b"late"[..]));
}

#[test]
fn detached_operations_leave_nothing_to_collect() {
    let (srv, _echo) = echo_server("tcp");
    let (cli, peer) = client_of(&srv, Config::default());
    let ops: Vec<OpId> = (0..50)
        .map(|_| cli.request(peer, 1, Bytes::from_static(b"d"), Payload::None, ServiceLevel::Normal).unwrap())
        .collect();
    for &op in &ops {
        cli.detach(op).unwrap();
    }
    // A request after them, answered in order: by then the detached ones completed too.
    let last = cli.request(peer, 1, Bytes::from_static(b"z"), Payload::None, ServiceLevel::Normal).unwrap();
    cli.wait(last).unwrap();
    assert!(cli.wait_any(Some(Duration::ZERO)).unwrap().is_none(), "a detached completion was delivered");
    for op in ops {
        assert!(cli.test(op).is_err(), "{op} is still tracked");
        assert!(cli.detach(op).is_err());
    }
}

#[test]
fn the_descriptor_is_stable_and_usable_with_epoll() {
    use rustix::event::epoll;
    let (srv, _echo) = echo_server("tcp");
    let cli = Endpoint::client(Config::default()).unwrap();
    let before = cli.as_fd().try_clone_to_owned().unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    // Edge-triggered, as tokio registers descriptors.
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    epoll::add(&ep, &cli, epoll::EventData::new_u64(1), epoll::EventFlags::IN | epoll::EventFlags::ET)
        .unwrap();
    for i in 0..200u8 {
        let op = cli.request(peer, 1, Bytes::from(vec![i]), Payload::None, ServiceLevel::Normal).unwrap();
        let c = loop {
            cli.try_progress().unwrap();
            if let Some(c) = cli.test(op).unwrap() {
                break c;
            }
            if cli.arm().unwrap() == Arm::Armed {
                let mut evs = Vec::with_capacity(4);
                let ts = rustix::time::Timespec { tv_sec: LOST.as_secs() as i64, tv_nsec: 0 };
                epoll::wait(&ep, rustix::buffer::spare_capacity(&mut evs), Some(&ts)).unwrap();
                assert!(!evs.is_empty(), "edge-triggered wait missed a wake-up for request {i}");
            }
        };
        assert_eq!(c.reply.as_deref(), Some(&[i][..]));
    }
    // The same epoll instance before and after the transport was chosen.
    use std::os::unix::fs::MetadataExt;
    let ino = |fd: std::os::fd::OwnedFd| std::fs::File::from(fd).metadata().unwrap().ino();
    assert_eq!(ino(before), ino(cli.as_fd().try_clone_to_owned().unwrap()));
}

/// A pull that finds its whole payload in the socket already, more than one round reads: the
/// rest needs another round, and no socket event will come for it (the sender is done).
#[test]
fn a_pull_of_a_payload_already_received_finishes_on_the_descriptor() {
    let len = 5 << 20;
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let cli = Endpoint::client(Config::default()).unwrap();
    let peer = cli.connect(srv.local_addr().unwrap()).unwrap();
    let payload: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let expect = payload.clone();
    let client = std::thread::spawn(move || {
        let op =
            cli.request(peer, 1, Bytes::new(), Payload::Out(Bytes::from(payload).into()), ServiceLevel::Bulk);
        cli.wait(op.unwrap()).unwrap().ok().unwrap();
    });
    let mut sleeps = 0;
    let req = loop {
        srv.try_progress().unwrap();
        if let Some(r) = srv.next_request(Some(Duration::ZERO)).unwrap() {
            break r;
        }
        if srv.arm().unwrap() == Arm::Armed {
            assert!(readable_within(&srv, LOST));
        }
    };
    // Let the whole payload arrive in the socket before pulling it.
    std::thread::sleep(Duration::from_millis(300));
    let op = req.pull_into(bytes::BytesMut::zeroed(len), 0).unwrap();
    let c = wait_on_fd(&srv, op, &mut sleeps);
    assert_eq!(c.data().unwrap()[..], expect[..]);
    let reply = req.reply(Bytes::from_static(b"ok")).unwrap();
    wait_on_fd(&srv, reply, &mut sleeps);
    client.join().unwrap();
}

/// More connections at once than one round accepts: the rest wait in the listener's queue,
/// with no new event to say so, and arming must answer that progress is due.
#[test]
fn a_burst_of_connections_is_accepted_by_a_server_on_the_descriptor() {
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default()).unwrap();
    let addr = srv.local_addr().unwrap();
    let n = 80;
    let clients: Vec<_> = (0..n)
        .map(|i: u32| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let cli = Endpoint::client(Config::default()).unwrap();
                let peer = cli.connect(&addr).unwrap();
                let op = cli.request(
                    peer,
                    1,
                    Bytes::from(i.to_le_bytes().to_vec()),
                    Payload::None,
                    ServiceLevel::Normal,
                );
                cli.wait_timeout(op.unwrap(), LOST).unwrap().expect("no answer").ok().unwrap();
            })
        })
        .collect();
    // Let every connection reach the listener's queue before the server's first round.
    std::thread::sleep(Duration::from_millis(500));
    let mut answered = 0;
    while answered < n {
        srv.try_progress().unwrap();
        while let Some(req) = srv.next_request(Some(Duration::ZERO)).unwrap() {
            let h = req.header().clone();
            srv.detach(req.reply(h).unwrap()).unwrap();
            answered += 1;
        }
        if answered < n && srv.arm().unwrap() == Arm::Armed {
            assert!(readable_within(&srv, LOST), "{answered} of {n} answered, then the loop slept");
        }
    }
    for c in clients {
        c.join().unwrap();
    }
}

/// Unexpected messages past the per-peer budget stay in the socket, the connection unread,
/// its epoll edge spent. Taking one off the queue lets the connection be read again — by the
/// next round, which only `arm` can ask for: no socket event will come (the client sent
/// everything long ago and waits).
#[test]
fn messages_held_back_by_the_budget_are_read_once_taken_on_the_descriptor() {
    let n = 12;
    let srv = Endpoint::bind("tcp://127.0.0.1:0", Config::default().unexpected_per_peer(1)).unwrap();
    let (cli, peer) = client_of(&srv, Config::default().progress_thread(true));
    let sends: Vec<OpId> = (0..n)
        .map(|i| cli.send_unexpected(peer, i, Bytes::from(vec![i as u8; 100]), ServiceLevel::Normal).unwrap())
        .collect();
    // Accept and complete the handshake until every send is written; the budget stops the
    // reading at one message queued, so after one is taken the queue is empty and only the
    // transport knows there is more.
    let deadline = Instant::now() + LOST;
    // A send's completion is taken once: testing it again would ask about an op that is gone.
    let mut written = vec![false; sends.len()];
    while written.contains(&false) {
        assert!(Instant::now() < deadline, "the client's sends were never written");
        srv.try_progress().unwrap();
        for (done, &op) in written.iter_mut().zip(&sends) {
            if !*done {
                *done = cli.test(op).unwrap().is_some();
            }
        }
        if srv.arm().unwrap() == Arm::Armed {
            readable_within(&srv, Duration::from_millis(10));
        }
    }
    // One message at a time, the event-loop way.
    let mut tags = Vec::new();
    while tags.len() < n as usize {
        srv.try_progress().unwrap();
        if let Some(u) = srv.recv_unexpected(Some(Duration::ZERO)).unwrap() {
            tags.push(u.tag);
        }
        if tags.len() < n as usize && srv.arm().unwrap() == Arm::Armed {
            assert!(readable_within(&srv, LOST), "{} of {n} messages taken, then the loop slept", tags.len());
        }
    }
    assert_eq!(tags, (0..n).collect::<Vec<_>>());
    drop(cli);
}

/// A peer whose listener accepts the connection and then says nothing: the handshake deadline
/// is a transport timer, with no socket event to announce it, so an armed client must be woken
/// to run the round that fails the peer — its operation fails, rather than the loop sleeping
/// forever.
fn a_silent_peer_fails_a_client_sleeping_on_the_descriptor(scheme: &str) {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("{scheme}://{}", silent.local_addr().unwrap());
    let cfg = Config::default().handshake_timeout(Duration::from_millis(300));
    let cli = Endpoint::client(cfg).unwrap();
    let peer = cli.connect(addr.as_str()).unwrap();
    let op = cli.send(peer, 1, Bytes::from_static(b"hello?"), ServiceLevel::Normal).unwrap();
    let mut sleeps = 0;
    let c = wait_on_fd(&cli, op, &mut sleeps);
    assert!(matches!(c.result, Err(Error::PeerLost { .. })), "{:?}", c.result);
    drop(silent);
}

#[test]
fn a_silent_peer_fails_a_client_sleeping_on_the_descriptor_over_tcp() {
    a_silent_peer_fails_a_client_sleeping_on_the_descriptor("tcp");
}

#[test]
fn a_silent_peer_fails_a_client_sleeping_on_the_descriptor_over_softib() {
    a_silent_peer_fails_a_client_sleeping_on_the_descriptor("softib");
}

/// Over InfiniBand a cancelled read whose buffer the server may still write holds it until the
/// server lets go, for at most the cancel grace period: a timer, so a client sleeping on the
/// descriptor must be woken to end the wait when the server never answers.
#[test]
fn a_cancel_grace_ends_for_a_client_sleeping_on_the_descriptor() {
    let srv = Endpoint::bind("softib://127.0.0.1:0", Config::default().progress_thread(true)).unwrap();
    let cfg = Config::default().ib(ionet::IbConfig::default().cancel_grace(Duration::from_millis(300)));
    let (cli, peer) = client_of(&srv, cfg);
    // Large enough that the server writes it by RDMA: the client's buffer is registered.
    let room = Payload::In(bytes::BytesMut::zeroed(4 << 20).into());
    let op = cli.request(peer, 1, Bytes::new(), room, ServiceLevel::Bulk).unwrap();
    let deadline = Instant::now() + LOST;
    let _held = loop {
        assert!(Instant::now() < deadline, "the request never reached the server");
        cli.try_progress().unwrap();
        if let Some(r) = srv.next_request(Some(Duration::ZERO)).unwrap() {
            break r;
        }
        if cli.arm().unwrap() == Arm::Armed {
            readable_within(&cli, Duration::from_millis(10));
        }
    };
    cli.cancel(op).unwrap();
    let mut sleeps = 0;
    let c = wait_on_fd(&cli, op, &mut sleeps);
    assert!(matches!(c.result, Err(Error::Cancelled)), "{:?}", c.result);
}

/// Drives `srv` the event-loop way until it has dropped a peer; a sleep on the armed
/// descriptor that never ends fails.
fn sleep_on_the_descriptor_until_a_peer_is_dropped(srv: &Endpoint) {
    let deadline = Instant::now() + LOST;
    loop {
        srv.try_progress().unwrap();
        if srv.info().counters.peers_lost >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the stalled peer was never dropped");
        if srv.arm().unwrap() == Arm::Armed {
            assert!(readable_within(srv, LOST), "armed descriptor never became readable with a peer stalled");
        }
    }
}

/// A client that asks for far more than it reads: the server's answers pile up to its transmit
/// bound, and the stall deadline that drops such a peer is a transport timer with no socket
/// event to announce it (the socket never becomes writable again). A server sleeping on the
/// descriptor must still drop the peer rather than sleep forever.
#[test]
fn a_stalled_peer_is_dropped_by_a_server_sleeping_on_the_descriptor() {
    // The kernel's deadline for the same stall off: it would announce itself on the socket.
    let cfg = Config::default()
        .stall_timeout(Duration::from_millis(300))
        .tcp_user_timeout(None)
        .transmit_bytes_per_peer(64 << 10);
    let srv = Endpoint::bind("tcp://127.0.0.1:0", cfg).unwrap();
    let x = srv.expose(srv.alloc(1 << 20).unwrap(), ionet::Access::READ).unwrap();
    let (cli, peer) = client_of(&srv, Config::default());
    // Connect (the server's rounds answer the handshake), then ask for far more than the
    // sockets' buffers hold, and never run the client's progress again.
    let hello = cli.send_unexpected(peer, 0, Bytes::from_static(b"hi"), ServiceLevel::Normal).unwrap();
    let deadline = Instant::now() + LOST;
    while srv.recv_unexpected(Some(Duration::ZERO)).unwrap().is_none() {
        assert!(Instant::now() < deadline, "the client never connected");
        let _ = cli.test(hello);
    }
    let gets: Vec<OpId> = (0..64)
        .map(|_| cli.get(peer, bytes::BytesMut::zeroed(1 << 20), x.handle(), ServiceLevel::Normal).unwrap())
        .collect();
    sleep_on_the_descriptor_until_a_peer_is_dropped(&srv);
    drop((gets, cli));
}

/// The same over verbs, where the stall is the peer giving back no credits: replies queue for
/// a client that stopped running, and nothing on the descriptor announces the deadline that
/// drops it. A server sleeping on the descriptor must still drop the peer.
#[test]
fn a_softib_peer_that_gives_no_credits_back_is_dropped_by_a_server_sleeping_on_the_descriptor() {
    // More than the client's receive buffers and ring slots together (16 and 8).
    const REQUESTS: usize = 48;
    let srv =
        Endpoint::bind("softib://127.0.0.1:0", Config::default().stall_timeout(Duration::from_millis(300)))
            .unwrap();
    let (cli, peer) = client_of(&srv, Config::default());
    let reqs: Vec<OpId> = (0..REQUESTS)
        .map(|_| cli.request(peer, 1, Bytes::from_static(b"q"), Payload::None, ServiceLevel::Normal).unwrap())
        .collect();
    // Both driven until the server holds every request; then the client never runs again.
    let mut held = Vec::new();
    let deadline = Instant::now() + LOST;
    while held.len() < REQUESTS {
        assert!(Instant::now() < deadline, "the requests never arrived");
        cli.try_progress().unwrap();
        if let Some(r) = srv.next_request(Some(Duration::ZERO)).unwrap() {
            held.push(r);
        }
    }
    let replies: Vec<OpId> = held.into_iter().map(|r| r.reply(Bytes::from_static(b"a")).unwrap()).collect();
    sleep_on_the_descriptor_until_a_peer_is_dropped(&srv);
    drop((replies, reqs, cli));
}

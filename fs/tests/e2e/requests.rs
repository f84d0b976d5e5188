//! How many requests an operation takes, and to which servers.

use super::*;

/// A read that reaches every server of the layout learns the file's size from their replies:
/// reading past the end of a small file asks no server for its size afterwards.
pub fn a_read_from_every_server_needs_no_size_round(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    let f = c.create("/small", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    f.write_at(0, &pattern(4096, 3)).unwrap();
    // Another server's share reaching further than the data the read found.
    let g = c.create("/far", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    g.write_at(0, &pattern(100, 4)).unwrap();
    g.write_at(3 * 65536 + 10, &pattern(5, 5)).unwrap();
    let requests = |c: &stripefs::Client| -> u64 {
        c.status()
            .io
            .iter()
            .map(|s| match s {
                stripefs::ServerState::Up(st) => st.requests,
                s => panic!("{s:?}"),
            })
            .sum()
    };
    let bytes_read =
        |c: &stripefs::Client| -> u64 { c.server_stats().into_iter().map(|s| s.unwrap().bytes_read).sum() };
    for (file, len, want) in [(&f, 1 << 20, pattern(4096, 3)), (&g, 1 << 20, Bytes::new())] {
        let before = requests(&c);
        let moved = bytes_read(&c);
        // A buffer holding other bytes, as a reused one does: holes and the rest read as zeros.
        let mut stale = BytesMut::zeroed(len);
        stale.fill(0xaa);
        let (buf, n) = file.read_at(0, stale).unwrap();
        // One read per server and one status request per server to count them.
        assert_eq!(requests(&c) - before - 4, 2 * 4, "one read per server, no size requests");
        if want.is_empty() {
            assert_eq!(n, 3 * 65536 + 15);
            assert_eq!(&buf[..100], &pattern(100, 4)[..]);
            assert!(buf[100..3 * 65536 + 10].iter().all(|&b| b == 0), "holes read as zeros");
            assert_eq!(&buf[3 * 65536 + 10..n], &pattern(5, 5)[..]);
        } else {
            assert_eq!((n, &buf[..n]), (want.len(), &want[..]));
        }
        assert!(buf[n..].iter().all(|&b| b == 0), "past the end reads as zeros");
        // The servers sent the bytes up to each one's end of the object, not the zeros past it.
        assert_eq!(bytes_read(&c) - moved, if want.is_empty() { 100 + 15 } else { 4096 });
    }
    // A read that leaves servers out still asks them where the file ends.
    let before = requests(&c);
    let (_, n) = g.read_at(0, BytesMut::zeroed(1000)).unwrap();
    assert_eq!(n, 1000);
    let (_, n) = g.read_at(65536 * 2, BytesMut::zeroed(65536 * 2)).unwrap();
    assert_eq!(n, 65536 + 15);
    assert_eq!(requests(&c) - before, 1 + 4 + 2 + 4 + 4);
}

/// A client that opened a file lately asks the meta server only for its attributes when it
/// stats the file, and the file's io servers for their sizes at the same time; the size is
/// current whoever changed it, and a client that never opened the file asks for a capability
/// first.
pub fn a_stat_of_an_opened_file_asks_attributes_and_sizes_at_once(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    let f = c.create("/f", CreateOptions { mode: 0o644, layout: spec(4, 65536) }).unwrap();
    f.write_at(0, &pattern(3 * 65536 + 7, 1)).unwrap();
    let h = f.handle();
    let stat = |c: &stripefs::Client| {
        let ((meta, io), size) = requests_during(c, || c.stat_handle(h).unwrap().attr.size);
        (size, meta, io)
    };
    assert_eq!(stat(&c), (3 * 65536 + 7, 1, 4), "the attributes, and each server's size");
    let other = tc.client();
    other.truncate("/f", 100).unwrap();
    assert_eq!(stat(&c), (100, 1, 4), "another client's truncate is seen");
    assert_eq!(stat(&other), (100, 2, 4), "the attributes, a capability, each server's size");
    assert_eq!(stat(&other), (100, 1, 4), "the capability was kept");
    // Gone, the file is not found, however it was stat'ed before.
    c.unlink("/f").unwrap();
    assert_eq!(c.stat_handle(h).map_err(|e| e.errno()).unwrap_err(), Errno::ENOENT);
}

/// A listing's stats come in batches: the meta server's attributes of up to a batch of
/// entries in one request, and each io server's sizes of those files in one; each entry's stat
/// is the one it would have on its own, and an entry removed since it was listed fails alone.
pub fn a_listings_stats_take_one_request_per_server_a_batch(scheme: &str) {
    let tc = TestCluster::start_with(scheme, 4, no_objects_ahead);
    let c = tc.client();
    c.mkdir("/d", 0o755).unwrap();
    let files = proto::MAX_BATCH + 2;
    for i in 0..files {
        // Stripe counts of 1 to 4 at every base, and sizes that end on each server.
        let layout = Some(LayoutSpec {
            base: Some((i % 4) as u32),
            pcount: Some((i % 4 + 1) as u32),
            ssize: Some(4096),
        });
        let f = c.create(&format!("/d/f{i:03}"), CreateOptions { mode: 0o644, layout }).unwrap();
        f.write_all_at(0, &pattern(i * 1500, i as u64)).unwrap();
    }
    c.mkdir("/d/sub", 0o700).unwrap();
    c.symlink("/d/f000", "/d/link").unwrap();
    let d = c.resolve("/d").unwrap();
    let entries = c.readdir_handle(d).unwrap();
    let handles: Vec<Handle> = entries.iter().map(|e| e.handle).collect();
    // Another client, with no capability kept from opening the files.
    let lister = tc.client();
    let (asked, stats) = requests_during(&lister, || lister.stat_many(&handles));
    // Two batches: in the first every io server holds some file; the second's files (f128 on
    // server 0, f129 on servers 1 and 2) need three.
    assert_eq!(asked, (2, 4 + 3));
    for (st, h) in stats.iter().zip(&handles) {
        let one = c.stat_handle(*h).unwrap();
        let st = st.as_ref().unwrap().as_ref().unwrap();
        assert_eq!((st.handle, &st.attr, st.layout), (one.handle, &one.attr, one.layout));
    }
    let sizes: Vec<u64> =
        stats.iter().take(files).map(|s| s.as_ref().unwrap().as_ref().unwrap().attr.size).collect();
    assert_eq!(sizes, (0..files as u64).map(|i| i * 1500).collect::<Vec<_>>());
    // Removed since it was listed: that entry fails, the others do not.
    c.unlink("/d/f005").unwrap();
    let stats = lister.stat_many(&handles[..10]);
    assert_eq!(stats[5].as_ref().map(|_| ()).unwrap_err().errno(), Errno::ENOENT);
    assert!(stats.iter().enumerate().all(|(i, s)| i == 5 || matches!(s, Ok(Ok(_)))));
}

/// A default client registers a striped request's pieces for one server as one span (the
/// list allocation hint), not one registration per stripe: the pinning cost per piece was most
/// of the client's CPU on softib.
#[test]
fn striped_requests_register_one_span_per_server() {
    let tc = TestCluster::start("softib", 2);
    let c = tc.client();
    let f = c.create("/spans", CreateOptions { mode: 0o644, layout: spec(2, 4096) }).unwrap();
    // Fresh buffers: every registration is a cache miss.
    let registrations = || c.endpoint().info().regcache.expect("softib has a registration cache").misses;
    // 512 KiB in 4 KiB stripes: 64 pieces for each of the 2 servers, 256 KiB each (RDMA).
    let data = pattern(512 << 10, 11);
    let before = registrations();
    f.write_at(0, &data).unwrap();
    let w = registrations() - before;
    let before = registrations();
    let (buf, n) = f.read_at(0, BytesMut::zeroed(data.len())).unwrap();
    let r = registrations() - before;
    assert_eq!((n, &buf[..]), (data.len(), &data[..]));
    assert!(w <= 2 && r <= 2, "registrations: {w} for the write, {r} for the read (one per server expected)");
}

/// Over tcp a read with more for one server than the client's read limit goes as several
/// requests (posted together, the bytes landing in order); over softib it stays one request
/// per server, and a write of the same size is one request per server on both. An explicit
/// read limit splits reads on either transport.
pub fn large_reads_go_as_several_requests_over_tcp_and_writes_as_one(scheme: &str) {
    let tc = TestCluster::start(scheme, 2);
    let c = tc.client();
    // Two servers, 64 KiB stripes: 5 MiB puts 2.5 MiB on each.
    let f = c.create("/split", CreateOptions { mode: 0o644, layout: spec(2, 65536) }).unwrap();
    let data = pattern(5 << 20, 23);
    let count = |c: &stripefs::Client| {
        c.server_stats().into_iter().map(|s| s.unwrap()).fold((0, 0), |a, s| (a.0 + s.writes, a.1 + s.reads))
    };
    let per_server = (5u64 << 20) / 2;
    let s0 = count(&c);
    f.write_at(0, &data).unwrap();
    let s1 = count(&c);
    assert_eq!(s1.0 - s0.0, 2, "one write request per server");
    let (back, n) = read_all(&f, 0, data.len());
    assert_eq!((n, &back[..]), (data.len(), &data[..]));
    let s2 = count(&c);
    let want = if scheme == "tcp" {
        2 * per_server.div_ceil(stripefs::client::DEFAULT_READ_REQUEST_BYTES)
    } else {
        2
    };
    assert_eq!(s2.1 - s1.1, want, "read requests for 2.5 MiB per server");
    if scheme == "tcp" {
        assert!(want > 2, "the default limit splits this read");
    }
    // A limit of 512 KiB: five requests per server, the same bytes.
    let opts = stripefs::ClientOptions {
        timeout: Duration::from_secs(10),
        read_request_bytes: Some(512 << 10),
        ..Default::default()
    };
    let c2 = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    let f2 = c2.open("/split", Rights::READ).unwrap();
    let (back, _) = read_all(&f2, 0, data.len());
    assert_eq!(&back[..], &data[..]);
    assert_eq!(count(&c).1 - s2.1, 2 * per_server.div_ceil(512 << 10), "read requests of 512 KiB");
}

pub fn a_clients_adaptive_waits_poll_for_its_transports_budget(scheme: &str) {
    let tc = TestCluster::start(scheme, 1);
    let c = tc.client();
    let want = if scheme == "tcp" {
        ionet::Config::default().get_spin_budget()
    } else {
        stripefs::client::DEFAULT_RDMA_SPIN_BUDGET
    };
    assert_eq!(c.endpoint().config().get_spin_budget(), want);
    let opts =
        stripefs::ClientOptions { spin_budget: Some(Duration::from_micros(700)), ..Default::default() };
    let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
    assert_eq!(c.endpoint().config().get_spin_budget(), Duration::from_micros(700));
    // A client's connections ask for the congestion control its options name: by default the
    // environment's, else reno; `None` keeps the kernel's. It only matters over tcp, but the
    // setting is the endpoint's.
    let want = stripefs::net::tcp_congestion();
    if std::env::var_os(stripefs::net::TCP_CONGESTION_ENV).is_none() {
        assert_eq!(want.as_deref(), Some(stripefs::net::DEFAULT_TCP_CONGESTION));
    }
    assert_eq!(c.endpoint().config().get_tcp_congestion(), want.as_deref());
    for cc in [None, Some("cubic".to_string())] {
        let opts = stripefs::ClientOptions { tcp_congestion: cc.clone(), ..Default::default() };
        let c = stripefs::Client::connect_with(tc.cluster.config(), opts).unwrap();
        assert_eq!(c.endpoint().config().get_tcp_congestion(), cc.as_deref());
    }
}

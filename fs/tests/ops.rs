//! Operator tooling: the Prometheus metrics of `serve --metrics` (counters move by what a
//! client did; hostile scrapers do not break the next scrape) and the debug log's story of
//! connections and requests.

mod common;

use common::{TestCluster, no_objects_ahead, pattern};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;
use stripefs::CreateOptions;
use stripefs::cluster::ServerId;
use stripefs::proto::LayoutSpec;

/// One scrape: every sample, keyed by `name{labels}`.
type Samples = HashMap<String, f64>;

/// Sends `request` to `addr` and returns the whole response.
fn http(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8(out).unwrap()
}

/// `GET /metrics` at `addr`, parsed; checks the response and the format on the way.
fn scrape(addr: SocketAddr) -> Samples {
    let resp = http(addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    let (head, body) = resp.split_once("\r\n\r\n").expect("a head and a body");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let mut samples = Samples::new();
    let mut typed = std::collections::HashSet::new();
    for line in body.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            typed.insert(t.split(' ').next().unwrap().to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        let name = key.split('{').next().unwrap();
        assert!(typed.contains(name), "{name} has no # TYPE line before it");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("not a number: {line}"));
        assert!(samples.insert(key.to_owned(), v).is_none(), "{key} twice");
    }
    samples
}

/// The value of the one sample of `name` whose labels contain every one of `labels`.
fn get(s: &Samples, name: &str, labels: &[&str]) -> f64 {
    let hits: Vec<f64> = s
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name) && labels.iter().all(|l| k.contains(l)))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(hits.len(), 1, "{name} {labels:?}: {hits:?}");
    hits[0]
}

/// A client writes and reads a file striped over both io servers; each server's metrics say
/// what it served (requests, bytes written and read, the transport's bytes), the meta server's
/// count the file; then a too-large, a malformed and a stalled request are refused and the
/// next scrape still answers.
#[test]
fn metrics_count_what_clients_did_and_survive_hostile_scrapers() {
    let tc = TestCluster::start_with("tcp", 2, |o| {
        no_objects_ahead(o);
        o.metrics = Some("127.0.0.1:0".parse().unwrap());
    });
    let meta = tc.cluster.metrics_addr(ServerId::Meta).expect("the meta server serves metrics");
    let io: Vec<SocketAddr> =
        (0..2).map(|i| tc.cluster.metrics_addr(ServerId::Io(i)).expect("io server metrics")).collect();
    assert_ne!(io[0], io[1]);
    let io_before: Vec<Samples> = io.iter().map(|&a| scrape(a)).collect();
    let meta_before = scrape(meta);
    assert_eq!(get(&meta_before, "stripefs_meta_files", &[r#"role="meta""#]), 0.0);

    let c = tc.client();
    // Two stripes of 64 KiB on each server: 4 × 64 KiB, written and read once.
    let len = 4 * 64 * 1024;
    let layout = LayoutSpec { base: None, pcount: Some(2), ssize: Some(64 * 1024) };
    let f = c.create("/m.bin", CreateOptions { mode: 0o644, layout: Some(layout) }).unwrap();
    let data = pattern(len, 3);
    assert_eq!(f.write_at(0, &data).unwrap(), len);
    let (back, n) = f.read_at(0, bytes::BytesMut::zeroed(len)).unwrap();
    assert_eq!((n, &back[..]), (len, &data[..]));

    let mut written = 0.0;
    for (i, (&addr, before)) in io.iter().zip(&io_before).enumerate() {
        let after = scrape(addr);
        let labels = [r#"role="io""#, &*format!(r#"index="{i}""#)];
        let d = |name: &str| get(&after, name, &labels) - get(before, name, &labels);
        let w = d("stripefs_io_written_bytes_total");
        assert_eq!(w, (len / 2) as f64, "io server {i} holds half the file");
        assert_eq!(d("stripefs_io_read_bytes_total"), (len / 2) as f64);
        assert_eq!((d("stripefs_io_writes_total"), d("stripefs_io_reads_total")), (1.0, 1.0));
        // The object's create, the write and the read at least.
        assert!(d("stripefs_requests_total") >= 3.0, "{}", d("stripefs_requests_total"));
        assert_eq!(d("stripefs_request_errors_total"), 0.0);
        assert_eq!(get(&after, "stripefs_requests_in_flight", &labels), 0.0);
        assert!(get(&after, "stripefs_disk_total_bytes", &labels) > 0.0);
        // The transport moved at least the data, each way.
        assert!(d("ionet_bytes_received_total") >= w, "{} < {w}", d("ionet_bytes_received_total"));
        assert!(d("ionet_bytes_sent_total") >= (len / 2) as f64);
        assert!(d("ionet_messages_received_total") >= 3.0);
        assert!(get(&after, "ionet_peers_connected", &labels) >= 1.0);
        assert!(
            !after.keys().any(|k| k.contains(r#"endpoint="io_servers""#)),
            "an io server has one endpoint"
        );
        written += w;
    }
    assert_eq!(written, len as f64);
    let meta_after = scrape(meta);
    let m = [r#"role="meta""#];
    assert_eq!(get(&meta_after, "stripefs_meta_files", &m), 1.0);
    assert_eq!(get(&meta_after, "stripefs_meta_directories", &m), 1.0, "the root");
    // This cluster makes no objects ahead; what awaits a flush depends on the flush's timing.
    assert_eq!(get(&meta_after, "stripefs_meta_files_made_ahead", &m), 0.0);
    assert!(get(&meta_after, "stripefs_meta_unflushed_commits", &m) >= 0.0);
    let meta_requests = get(&meta_after, "stripefs_requests_total", &m);
    assert!(meta_requests > get(&meta_before, "stripefs_requests_total", &m));
    // Its endpoint for clients received their requests; the one to the io servers connected
    // to both and sent each its object's create.
    let serve = [r#"role="meta""#, r#"endpoint="serve""#];
    let delta =
        |name: &str, labels: &[&str]| get(&meta_after, name, labels) - get(&meta_before, name, labels);
    assert!(
        delta("ionet_messages_received_total", &serve)
            >= meta_requests - get(&meta_before, "stripefs_requests_total", &m)
    );
    let up = [r#"role="meta""#, r#"endpoint="io_servers""#];
    assert!(get(&meta_after, "ionet_connections_total", &up) >= 2.0);
    assert!(delta("ionet_messages_sent_total", &up) >= 2.0);

    // Hostile scrapers: a request head past the limit, garbage, a wrong path and method, and
    // one that never finishes its head; each is answered or cut off, and then a scrape works.
    let big = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(64 * 1024));
    let resp = http(meta, big.as_bytes());
    assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 431 "), "{resp:.80}");
    assert!(http(meta, b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
    assert!(http(meta, b"GET /secrets HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
    assert!(http(meta, b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
    let mut stalled = TcpStream::connect(meta).unwrap();
    stalled.write_all(b"GET /metr").unwrap();
    // Answered once the responder gave up on the stalled one (which stays open meanwhile).
    let again = scrape(meta);
    assert_eq!(get(&again, "stripefs_meta_files", &m), 1.0);
    let mut rest = String::new();
    stalled.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = stalled.read_to_string(&mut rest);
    assert!(rest.is_empty() || rest.starts_with("HTTP/1.1 408 "), "{rest}");
    // Scrapes are not requests to the server.
    assert_eq!(get(&again, "stripefs_requests_total", &m), meta_requests);
}

fn sfs_logged(cluster: &std::path::Path, log: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stripefs"));
    cmd.arg("--cluster").arg(cluster).args(args);
    match log {
        Some(l) => cmd.env("RUST_LOG", l),
        None => cmd.env_remove("RUST_LOG"),
    };
    cmd.output().unwrap()
}

/// With `RUST_LOG=debug` the client's log names each server connection (role, index, address)
/// and each request under it (kind, handle, extent, outcome), and the io server's log names
/// itself, the peer and each request it served, failures with their cause; at the default
/// level neither says anything about requests.
#[test]
fn the_debug_log_tells_each_request_under_its_server_and_peer() {
    let dir = tempfile::tempdir().unwrap();
    let io_log = dir.path().join("io.log");
    // The io servers' standard error, appended to one file (the launcher lets it through).
    let script = format!(r#"exec "$0" "$@" 2>>'{}'"#, io_log.display());
    let tc = TestCluster::start_with("tcp", 2, |o| {
        no_objects_ahead(o);
        o.io_prefix = Some(vec![vec!["sh".into(), "-c".into(), script.clone()]; 2]);
        o.io_env = vec![("RUST_LOG".into(), "stripefs=debug".into())];
    });
    let cl = tc.cluster.config_path().to_owned();
    let io0 = tc.cluster.config().io_servers[0].to_string();
    let src = tc.dir.path().join("in.bin");
    std::fs::write(&src, pattern(200_000, 5)).unwrap();
    let out = sfs_logged(&cl, Some("stripefs=debug"), &["cp", src.to_str().unwrap(), "sfs:/in.bin"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let client = String::from_utf8_lossy(&out.stderr);
    assert!(!client.contains('\x1b'), "no colours when not on a terminal");
    let lines = |log: &str, all: &[&str]| -> usize {
        log.lines().filter(|l| all.iter().all(|s| l.contains(s))).count()
    };
    let io0_conn = format!(r#"connection{{role="io" index=0 addr={io0}}}"#);
    assert!(lines(&client, &[&io0_conn, "connecting"]) == 1, "{client}");
    assert!(lines(&client, &[r#"connection{role="meta""#, r#"op="create""#, "result=ok"]) == 1, "{client}");
    // Each io server gets one write of its share, logged with handle, extent and outcome.
    assert_eq!(lines(&client, &[r#"op="write""#, "handle=", "off=", "len=", "result=ok", "elapsed_us="]), 2);
    assert!(lines(&client, &[&io0_conn, r#"op="write""#]) == 1, "{client}");

    // A failed request: its outcome is the error.
    let out = sfs_logged(&cl, Some("stripefs=debug"), &["stat", "sfs:/missing"]);
    assert!(!out.status.success());
    let failed = String::from_utf8_lossy(&out.stderr);
    assert!(lines(&failed, &[r#"op="lookup""#, "result=ENOENT"]) == 1, "{failed}");

    // The io server: itself (role and address), the peer's connection, each request served.
    let served = std::fs::read_to_string(&io_log).unwrap();
    let me = format!(r#"server{{role="io" addr={io0}}}"#);
    assert!(lines(&served, &[&me, "connection{peer=peer#", "addr=tcp://127.0.0.1:", "first request"]) >= 1);
    assert_eq!(lines(&served, &[&me, r#"op="write""#, "len=", "result=ok"]), 1, "{served}");
    assert_eq!(lines(&served, &[&me, r#"op="create_object""#, "result=ok"]), 1, "{served}");

    // At the default level (warnings), nothing about requests.
    let out = sfs_logged(&cl, None, &["cp", src.to_str().unwrap(), "sfs:/again.bin"]);
    assert!(out.status.success());
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A local cluster given a metrics port puts the meta server on it and io server I on the
/// port + 1 + I, each labelled with its role and index.
#[test]
fn a_local_cluster_takes_consecutive_metrics_ports() {
    // Three consecutive free ports (checked just before; another process could still take
    // one, which fails the cluster's start loudly rather than passing wrongly). Below the
    // kernel's ephemeral range (32768 and up by default), so the outgoing connections of tests
    // running meanwhile do not take them; where to start depends on the process id, so runs at
    // the same time look in different places.
    let start = 20_000 + (std::process::id() % 4_000) as u16 * 3;
    let base = (0..1_000u16)
        .map(|k| 20_000 + (start - 20_000 + 3 * k) % 12_000)
        .find_map(|p| {
            let held: Vec<_> = (0..3)
                .map(|k| std::net::TcpListener::bind(("127.0.0.1", p + k)).ok())
                .collect::<Option<_>>()?;
            drop(held);
            Some(p)
        })
        .expect("three consecutive free ports");
    let tc =
        TestCluster::start_with("tcp", 2, |o| o.metrics = Some(SocketAddr::from(([127, 0, 0, 1], base))));
    let ports: Vec<u16> = [ServerId::Meta, ServerId::Io(0), ServerId::Io(1)]
        .iter()
        .map(|&id| tc.cluster.metrics_addr(id).expect("serves metrics").port())
        .collect();
    assert_eq!(ports, [base, base + 1, base + 2]);
    let meta = scrape(SocketAddr::from(([127, 0, 0, 1], base)));
    assert_eq!(get(&meta, "stripefs_build_info", &[r#"role="meta""#]), 1.0);
    for i in 0..2u16 {
        let io = scrape(SocketAddr::from(([127, 0, 0, 1], base + 1 + i)));
        let labels = [r#"role="io""#, &*format!(r#"index="{i}""#)];
        assert_eq!(get(&io, "stripefs_io_writes_total", &labels), 0.0);
    }
}

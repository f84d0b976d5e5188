//! `ionet-perf server` and `client` with a cluster key file, and the warning a server gives
//! when it listens beyond loopback without one.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const PERF: &str = env!("CARGO_BIN_EXE_ionet-perf");

/// A server started with `args`; it exits when dropped (its stdin closes).
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(PERF)
            .arg("server")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("LISTEN ")
            .unwrap_or_else(|| panic!("no LISTEN line: {line:?}"))
            .to_string();
        Server { child, addr }
    }

    /// Stops the server and returns what it wrote to stderr.
    fn stop(mut self) -> String {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        err
    }
}

fn write_key(path: &Path, hex: &str) {
    std::fs::write(path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn client(addr: &str, key: Option<&Path>) -> Output {
    let mut c = Command::new(PERF);
    c.args(["client", "--connect", addr, "--test", "lat", "--sizes", "8", "--iters", "10", "--runs", "1"]);
    if let Some(k) = key {
        c.arg("--key-file").arg(k);
    }
    c.stdin(Stdio::null()).output().unwrap()
}

/// Listening on every interface without a key warns, naming the risk; on loopback, or with a
/// key, it does not.
#[test]
fn server_warns_when_listening_beyond_loopback_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k");
    write_key(&key, "00112233445566778899aabbccddeeff");
    let open = Server::start(&["--listen", "tcp://0.0.0.0:0"]).stop();
    assert!(open.contains("without a cluster key") && open.contains("anyone"), "no warning: {open:?}");
    assert!(open.contains("0.0.0.0"), "the warning names the address: {open:?}");
    let lo = Server::start(&["--listen", "tcp://127.0.0.1:0"]).stop();
    assert!(!lo.contains("warning"), "{lo:?}");
    let keyed = Server::start(&["--listen", "tcp://0.0.0.0:0", "--key-file", key.to_str().unwrap()]).stop();
    assert!(!keyed.contains("warning"), "{keyed:?}");
}

/// A client with the server's key file runs; one with another key, or none, fails to
/// authenticate.
#[test]
fn client_and_server_share_a_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (dir.path().join("k1"), dir.path().join("k2"));
    write_key(&k1, "00112233445566778899aabbccddeeff");
    write_key(&k2, "ffeeddccbbaa99887766554433221100");
    let s = Server::start(&["--listen", "tcp://127.0.0.1:0", "--key-file", k1.to_str().unwrap()]);
    let same = client(&s.addr, Some(&k1));
    assert!(same.status.success(), "{}", String::from_utf8_lossy(&same.stderr));
    for (what, key) in [("another key", Some(k2.as_path())), ("no key", None)] {
        let out = client(&s.addr, key);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: the client ran");
        assert!(err.contains("authentication failed"), "{what}: {err}");
    }
    s.stop();
}

/// `client --json`: one document, an object per size with each figure's median, min and max
/// and its unit, instead of the table; sizes take binary units, junk is refused.
#[test]
fn client_json_prints_one_object_per_size() {
    let s = Server::start(&["--listen", "tcp://127.0.0.1:0"]);
    let run = |test: &str, sizes: &str| {
        Command::new(PERF)
            .args(["client", "--connect", &s.addr, "--test", test, "--sizes", sizes])
            .args(["--iters", "20", "--runs", "3", "--json"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run("lat", "8,1k");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!((j["test"].as_str(), j["runs"].as_u64()), (Some("lat"), Some(3)), "{j}");
    assert_eq!(j["implementation"], "ionet");
    let results = j["results"].as_array().unwrap();
    let sizes: Vec<u64> = results.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [8, 1024]);
    for r in results {
        let f = &r["rtt_p50"];
        assert_eq!(f["unit"], "µs");
        let (min, median, max) =
            (f["min"].as_f64().unwrap(), f["median"].as_f64().unwrap(), f["max"].as_f64().unwrap());
        assert!(0.0 < min && min <= median && median <= max, "{r}");
    }
    let out = run("bw", "64k");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let r = &j["results"][0];
    assert_eq!((r["size"].as_u64(), r["bandwidth"]["unit"].as_str()), (Some(65536), Some("GB/s")), "{j}");
    assert_eq!(r["client_cpu"]["unit"], "s/GB");
    let out = run("lat", "8,12q");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("invalid size \"12q\""), "{err}");
    s.stop();
}

/// A measured table named by `IONET_POLICY` (as `calibrate --write-policy` writes it) sets the
/// thresholds of an endpoint's service levels, and `--show-policy` says so; the environment's
/// IONET_INLINE_MAX still overrides it.
#[test]
fn a_measured_table_sets_the_thresholds_an_endpoint_uses() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("policy");
    std::fs::write(
        &table,
        "# tcp: a test\ntcp control inline_max=4k\ntcp normal inline_max=16k\ntcp bulk inline_max=8k\n\
         softib bulk inline_max=1k fast_max=16k\n",
    )
    .unwrap();
    let show = |transport: &str, env: &[(&str, &str)]| {
        let mut c = Command::new(PERF);
        c.args(["--show-policy", "--transport", transport]).env_remove("IONET_INLINE_MAX");
        c.env_remove("IONET_FAST_MAX").env("IONET_POLICY", &table).envs(env.iter().copied());
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let row = |out: &str, class: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.starts_with(class)).unwrap_or_else(|| panic!("{class} in {out}"));
        line.split_whitespace().skip(1).take(2).map(String::from).collect()
    };
    let tcp = show("tcp", &[]);
    assert!(tcp.contains("thresholds from the measured table IONET_POLICY names"), "{tcp}");
    assert_eq!(
        (row(&tcp, "control"), row(&tcp, "normal"), row(&tcp, "bulk")),
        (vec!["4096".into(), "-".into()], vec!["16384".into(), "-".into()], vec!["8192".into(), "-".into()])
    );
    assert!(tcp.contains("this end accepts: 16384 B"), "the largest eager threshold: {tcp}");
    let softib = show("softib", &[]);
    assert_eq!(row(&softib, "bulk"), ["1024", "16384"], "{softib}");
    assert_eq!(row(&softib, "normal"), ["4096", "65536"], "not in the table: the default: {softib}");
    let env = show("tcp", &[("IONET_INLINE_MAX", "2k")]);
    assert!(env.contains("IONET_INLINE_MAX / IONET_FAST_MAX"), "{env}");
    assert_eq!(row(&env, "normal")[0], "2048", "{env}");
}

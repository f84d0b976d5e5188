//! The benchmark suite's own correctness (no timing assertions): `stripefs-bench` runs on tiny
//! geometries and its CSV output is checked against counts derived by hand from the layout.

use benchkit::Samples;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `stripefs` binary the suite's servers run as. Cargo builds only this package's binaries
/// for its tests, so it is built here (once per test process) with the same profile into the
/// same target directory, where the suite looks for it beside its own binary; a no-op when it
/// is up to date. `STRIPEFS_BIN` names a prebuilt one instead.
fn stripefs_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        if let Some(p) = std::env::var_os("STRIPEFS_BIN") {
            return p.into();
        }
        let bench = Path::new(env!("CARGO_BIN_EXE_stripefs-bench"));
        let profile_dir = bench.parent().expect("the binary is in a profile directory");
        let target_dir = profile_dir.parent().expect("the profile directory is in a target directory");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(p) => p,
            None => panic!("no profile directory in {}", bench.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let st = Command::new(cargo)
            .args(["build", "--quiet", "-p", "stripefs", "--bin", "stripefs", "--profile", profile])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(st.success(), "building the stripefs binary failed: {st}");
        profile_dir.join("stripefs")
    })
}

fn suite() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stripefs-bench"));
    c.env("STRIPEFS_BIN", stripefs_exe());
    c
}

fn bench(out: &Path, args: &[&str]) -> std::process::Output {
    suite()
        .args(args)
        .arg("--out")
        .arg(out)
        .args(["--data-dir"])
        .arg(out.join("data"))
        .args(["--timeout-min", "5"])
        .output()
        .expect("stripefs-bench runs")
}

fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "stripefs-bench failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn value(s: &Samples, exp: &str, t: &str, series: &str, metric: &str) -> f64 {
    s.get(exp, t, series, metric, 0.0)
        .unwrap_or_else(|| panic!("no {exp}/{t}/{series}/{metric} in the CSV"))
        .median
}

/// Tiles of 16×8 elements of 256 B: tile rows of 4 KiB = one 4 KiB stripe (the least a file may
/// have), two stripes per global row, 4 io servers. Client k's row i is stripe 2(8·ky + i) + kx,
/// so its rows alternate between servers kx and kx + 2.
const TINY: [&str; 8] = ["--elem", "256", "--tile-cols", "16", "--tile-rows", "8", "--stripe-size", "4096"];

#[test]
fn e4_request_counts_match_the_layout() {
    let d = tempfile::tempdir().unwrap();
    let mut args = vec!["e4", "--transports", "tcp", "--runs", "1", "--quick"];
    args.extend(TINY);
    let o = bench(d.path(), &args);
    ok(&o);
    let s = Samples::read_csv(&d.path().join("e4.csv")).unwrap();
    for op in ["write", "read"] {
        // One request per tile row: 4 clients × 8 rows.
        assert_eq!(value(&s, "e4", "tcp", &format!("{op}, no list I/O"), "requests"), 32.0, "{op}");
        // One list request per server a tile touches: 4 clients × 2 servers.
        assert_eq!(value(&s, "e4", "tcp", &format!("{op}, list I/O"), "requests"), 8.0, "{op}");
        assert!(value(&s, "e4", "tcp", &format!("{op}, list I/O"), "bandwidth") > 0.0);
    }
    let md = std::fs::read_to_string(d.path().join("e4.md")).unwrap();
    assert!(md.contains("| tcp:// | write |"), "{md}");
    assert!(md.contains("![e4.svg](plots/e4.svg)"));
    assert!(std::fs::read_to_string(d.path().join("plots/e4.svg")).unwrap().starts_with("<svg"));
    // The data directory is gone.
    let left: Vec<_> = std::fs::read_dir(d.path().join("data")).unwrap().collect();
    assert!(left.is_empty(), "bench left data behind: {left:?}");
}

#[test]
fn e5_registrations_with_and_without_allocation_hints() {
    let d = tempfile::tempdir().unwrap();
    // Rows of 64 KiB (one stripe each, as in the paper) so that a 2-row request is above the
    // fast-RDMA limit and the client must register its memory for the server's RDMA.
    let args = [
        "e5",
        "--transports",
        "softib",
        "--runs",
        "2",
        "--quick",
        "--rows-per-request",
        "2",
        "--elem",
        "64",
        "--tile-cols",
        "1024",
        "--tile-rows",
        "8",
    ];
    let o = bench(d.path(), &args);
    ok(&o);
    let s = Samples::read_csv(&d.path().join("e5.csv")).unwrap();
    for op in ["write", "read"] {
        let hints = format!("{op}, allocation hints");
        let none = format!("{op}, no hints");
        // 4 clients × 2 servers × (4 rows / 2 rows per request).
        assert_eq!(value(&s, "e5", "softib", &hints, "requests"), 16.0);
        // Without hints every tile row is registered on its own: 4 × 8 per pass.
        assert_eq!(value(&s, "e5", "softib", &none, "registrations"), 32.0, "{op}");
        // With them one span per request.
        assert_eq!(value(&s, "e5", "softib", &hints, "registrations"), 16.0, "{op}");
    }
}

#[test]
fn all_writes_report_and_splices_benchmarks_md() {
    let d = tempfile::tempdir().unwrap();
    let doc = d.path().join("BENCHMARKS.md");
    std::fs::write(&doc, "# Benchmarks\n\nHand-written intro.\n\n<!-- BEGIN GENERATED: bench-summary -->\nold\n<!-- END GENERATED: bench-summary -->\nReading kept.\n").unwrap();
    // Quick runs never touch BENCHMARKS.md.
    let out = d.path().join("benchmarks");
    let o = suite()
        .args(["all", "--quick", "--only", "e4", "--update"])
        .arg(&doc)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("refused with --quick"));
    // A (tiny, single-run) real run updates the summary, keeping the rest; the E4 tables go
    // to the report, not to the user's page.
    let mut args = vec!["all", "--only", "e4", "--transports", "tcp", "--runs", "1", "--update"];
    let docs = doc.to_string_lossy().into_owned();
    args.push(&docs);
    let o = suite().args(&args).arg("--out").arg(&out).arg("--data-dir").arg(d.path()).output().unwrap();
    ok(&o);
    let text = std::fs::read_to_string(&doc).unwrap();
    assert!(text.starts_with("# Benchmarks\n\nHand-written intro.\n"));
    assert!(text.contains("<!-- END GENERATED: bench-summary -->\nReading kept.\n"));
    assert!(!text.contains("\nold\n"));
    assert!(!text.contains("### E4: tiled access"), "the page carries the summary only");
    assert!(text.contains("[benchmarks/REPORT.md](benchmarks/REPORT.md)"), "links relative to the document");
    let report = std::fs::read_to_string(out.join("REPORT.md")).unwrap();
    assert!(report.contains("### E4: tiled access with and without list I/O"));
    assert!(report.contains("![e4.svg](benchmarks/plots/e4.svg)"), "plot links relative to the document");
    assert!(text.contains("Machine: "));
    assert!(text.contains("Command: `stripefs-bench all --only e4"));
    assert!(
        out.join("REPORT.md").is_file()
            && out.join("all.csv").is_file()
            && out.join("plots/e4.svg").is_file()
    );
    let all = Samples::read_csv(&out.join("all.csv")).unwrap();
    assert!(all.rows().iter().all(|r| r.experiment == "e4"));
}

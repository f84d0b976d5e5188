//! A paired ionet-perf reference: an `ionet-perf server` and an `ionet-perf client
//! --on-demand` kept running beside an experiment, so the experiment can draw streaming runs
//! right next to its own measurements (E1 draws just before and just after each cell). This
//! machine drifts by a quarter within seconds (a neighbour's load, the host's scheduling); a
//! reference drawn once at the start of an experiment compares every later figure with a
//! different machine, while draws next to a measurement see the state it saw. The draws are
//! ionet-perf's own `bw` test (1 MiB messages, [`WINDOW`] in flight, Bulk service level, plain
//! heap buffers) in the experiment's wait mode, so an experiment's figures read as a share of
//! the transport's streaming peak (the PVFS paper's "% of transport peak"), over TCP with the
//! congestion control the experiment's clients use. A [`Pattern::Reads`] reference instead runs
//! ionet-perf's `read` test against several servers at once: a file system's read, requests
//! whose buffers the servers push into, fanning in from N of them.

use anyhow::{Context, Result, anyhow, bail};
use ionet::{Scheme, WaitMode};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

/// Message size of every draw.
pub const REF_SIZE: u64 = 1 << 20;
/// Messages in flight: where ionet-perf's streaming peaks on this machine, over tcp and softib
/// alike (4 MiB in flight). With more the stream gets slower and its speed follows the cache:
/// at 16 (`ionet-perf ab`'s window) its receiver cycles through 16 MiB of buffers and its
/// sender through as much, about the 32 MiB L3 that the host shares with its other tenants, and
/// draws ran at 3.7–4.4 GB/s in minutes when 4 in flight streamed 5.0–6.1
/// (`benchmarks/journal/e1-a-read-fans-in.md`).
pub const WINDOW: usize = 4;
/// Requests outstanding at each server in a [`Pattern::Reads`] draw: where reads from N servers
/// run fastest here. From two servers, five alternations: 6.5–7.1 GB/s with one outstanding
/// at each, 4.3–7.2 with two, 4.5–5.2 with four (`benchmarks/journal/e1-a-read-fans-in.md`).
pub const READ_WINDOW: usize = 1;
/// Messages per draw: 512 MiB, about 0.1 s at this machine's 5 GB/s.
const ITERS: usize = 512;

/// What the reference's draws run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// `bw` from the client to one server.
    Stream,
    /// `read` from `servers` servers at once into the client ([`READ_WINDOW`] requests
    /// outstanding at each), each draw moving as many bytes as a stream's.
    Reads { servers: usize },
}

/// Where the ionet-perf processes run: unpinned, or as two nodes (the client's CPU, the
/// server's CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Unpinned,
    Pinned { client: usize, server: usize },
}

/// How the reference's client and server wait (an experiment's own modes for its clients and
/// servers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    pub client: WaitMode,
    pub server: WaitMode,
}

/// The running client and server(s). Dropping it stops them all.
#[derive(Debug)]
pub struct PairedReference {
    /// Held for its `Drop`: the processes live as long as the reference.
    _procs: Procs,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
    timeout: Duration,
}

impl PairedReference {
    /// Starts the server(s) and the on-demand client on `scheme` for `pattern` and waits for
    /// the client's warm-up run; every wait for the processes is bounded by `timeout`. Every
    /// connection uses `congestion` (`None`: the kernel's), the experiment's clients' choice.
    pub fn start(
        perf: &Path,
        scheme: Scheme,
        pattern: Pattern,
        place: Placement,
        wait: Waits,
        congestion: Option<&str>,
        timeout: Duration,
    ) -> Result<Self> {
        let args = |c: Option<usize>| {
            let mut a = c.map(|c| vec!["--cpu".to_string(), c.to_string()]).unwrap_or_default();
            if let Some(cc) = congestion {
                a.extend(["--tcp-congestion".to_string(), cc.to_string()]);
            }
            a
        };
        let (client_cpu, server_cpu) = match place {
            Placement::Unpinned => (None, None),
            Placement::Pinned { client, server } => (Some(client), Some(server)),
        };
        let (test, n, window) = match pattern {
            Pattern::Stream => ("bw", 1, WINDOW),
            Pattern::Reads { servers } => ("read", servers.max(1), READ_WINDOW),
        };
        // Every process started so far is stopped on any way out.
        let mut procs = Procs(Vec::with_capacity(n + 1));
        let mut addrs = Vec::with_capacity(n);
        for _ in 0..n {
            let mut cmd = Command::new(perf);
            cmd.args([
                "server",
                "--listen",
                &format!("{scheme}://127.0.0.1:0"),
                "--wait",
                wait.server.name(),
            ])
            .args(args(server_cpu))
            .stdin(Stdio::null());
            let mut server = spawn_reporting(&mut cmd, perf, "server")?;
            let addr = match server.stdout.take().map(|o| first_line(BufReader::new(o), timeout)) {
                Some(Ok(Some(line))) => line.strip_prefix("LISTEN ").map(|a| a.trim().to_string()),
                _ => None,
            };
            procs.0.push(server);
            addrs.push(addr.ok_or_else(|| anyhow!("the ionet-perf server did not print its address"))?);
        }
        let mut cmd = Command::new(perf);
        cmd.args(["client", "--connect", &addrs.join(","), "--test", test, "--sizes", &REF_SIZE.to_string()])
            .args(["--window", &window.to_string(), "--iters", &(ITERS / n).max(1).to_string()])
            .args(["--sl", "bulk", "--wait", wait.client.name(), "--on-demand"])
            .args(args(client_cpu))
            .stdin(Stdio::piped());
        let mut client = spawn_reporting(&mut cmd, perf, "client")?;
        let pipes = (client.stdin.take(), client.stdout.take());
        procs.0.push(client);
        let (Some(stdin), Some(out)) = pipes else { bail!("no pipes to the ionet-perf client") };
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let me = PairedReference { _procs: procs, stdin, lines, timeout };
        // The client prints a `#` header, runs its warm-up, then says READY.
        loop {
            let line = me.next_line().context("waiting for the ionet-perf client's warm-up")?;
            if line == "READY" {
                return Ok(me);
            }
            if !line.starts_with('#') {
                bail!("the ionet-perf client printed {line:?} before READY");
            }
        }
    }

    /// One run now, in MB/s (10⁶ B/s).
    pub fn draw(&mut self) -> Result<f64> {
        self.request("\n")
    }

    /// One run now whose messages cycle through `footprint` bytes of buffers on each side
    /// (`ionet-perf --footprint`; with several servers, the client's buffers over all of it and
    /// each server's over its share) instead of a window's worth, in MB/s.
    pub fn draw_with_footprint(&mut self, footprint: u64) -> Result<f64> {
        self.request(&format!("footprint {footprint}\n"))
    }

    fn request(&mut self, line: &str) -> Result<f64> {
        let stdin = &mut self.stdin;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .context("asking ionet-perf for a run")?;
        let line = self.next_line().context("waiting for an ionet-perf run")?;
        parse_run(&line).map(|gbps| gbps * 1000.0)
    }

    fn next_line(&self) -> Result<String> {
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(l)) => Ok(l),
            Ok(Err(e)) => Err(e.into()),
            Err(RecvTimeoutError::Timeout) => bail!("no answer within {:?}", self.timeout),
            Err(RecvTimeoutError::Disconnected) => bail!("the ionet-perf client exited"),
        }
    }
}

/// Starts an ionet-perf process whose stdout the caller reads (its stderr goes to ours).
fn spawn_reporting(cmd: &mut Command, perf: &Path, role: &str) -> Result<Child> {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {} {role}", perf.display()))
}

/// Child processes, stopped when dropped, the last started first.
#[derive(Debug)]
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        // Killed rather than asked to stop: a client in the middle of a run is not waited for.
        for p in self.0.iter_mut().rev() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

/// The first line `r` gives within `timeout` (`None` at end of file).
fn first_line(mut r: impl BufRead + Send + 'static, timeout: Duration) -> Result<Option<String>> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let got = r.read_line(&mut line).map(|n| (n > 0).then_some(line));
        let _ = tx.send(got);
    });
    Ok(rx.recv_timeout(timeout).map_err(|_| anyhow!("no line within {timeout:?}"))??)
}

/// `RUN <size> <GB/s>` of [`REF_SIZE`] → GB/s.
fn parse_run(line: &str) -> Result<f64> {
    let f: Vec<&str> = line.split_whitespace().collect();
    match f.as_slice() {
        ["RUN", size, gbps] if size.parse::<u64>().ok() == Some(REF_SIZE) => {
            let v: f64 = gbps.parse().with_context(|| format!("bandwidth in {line:?}"))?;
            if v.is_finite() && v > 0.0 { Ok(v) } else { bail!("bandwidth {v} in {line:?}") }
        }
        _ => bail!("unexpected line from the ionet-perf client: {line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_line_of_the_reference_size_gives_its_bandwidth() {
        assert_eq!(parse_run("RUN 1048576 5.25").unwrap(), 5.25);
        assert!(parse_run("RUN 65536 5.25").is_err(), "another size");
        assert!(parse_run("RUN 1048576 NaN").is_err());
        assert!(parse_run("RUN 1048576 0").is_err());
        assert!(parse_run("READY").is_err());
    }

    /// A reference that cannot start stops what it started: here the first of two servers
    /// never prints its address, and the start fails with no process left behind.
    #[test]
    fn a_failed_start_leaves_no_process_behind() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let pids = d.path().join("pids");
        let fake = d.path().join("ionet-perf");
        std::fs::write(&fake, format!("#!/bin/sh\necho $$ >> {}\nexec sleep 60\n", pids.display())).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let waits = Waits { client: WaitMode::Block, server: WaitMode::Block };
        let err = PairedReference::start(
            &fake,
            Scheme::Tcp,
            Pattern::Reads { servers: 2 },
            Placement::Unpinned,
            waits,
            None,
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(err.to_string().contains("did not print its address"), "{err}");
        let started = std::fs::read_to_string(&pids).unwrap();
        assert_eq!(started.lines().count(), 1, "it gave up at the first server: {started}");
        for pid in started.lines() {
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "process {pid} left running");
        }
    }

    #[test]
    fn a_missing_first_line_times_out_instead_of_hanging() {
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        let err = first_line(BufReader::new(r), Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("no line"), "{err}");
    }
}

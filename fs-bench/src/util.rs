//! What every experiment needs: buffers, a barrier that cannot hang, lock-step client threads,
//! bounded child processes.

use anyhow::{Result, anyhow, bail};
use bytes::{Bytes, BytesMut};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A pre-faulted, zeroed buffer (first touch costs ~2.5 s/GiB on the reference VM), aligned
/// like ionet's pool buffers (see [`stripefs::buf`]).
pub fn prefaulted(len: usize) -> BytesMut {
    let mut b = stripefs::buf::aligned_zeroed(len);
    benchkit::prefault(&mut b);
    b
}

/// Deterministic pseudo-random bytes (which also pre-faults them).
pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut v = stripefs::buf::aligned_zeroed(len);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    Bytes::from(v)
}

/// A reusable barrier whose waits fail instead of hanging: when any party aborts (its work
/// failed) or a wait exceeds the timeout, every waiter gets an error.
///
/// Every party of one round gets the same release instant, so a timed phase that follows is
/// measured from when all of them could start. Clients that share a CPU (E1 simulates client
/// nodes as threads on one core) do not start together: a thread's own clock would start only
/// once the scheduler ran it, leaving out the time it waited while the others worked, and
/// "the slowest client's time" would undercount the phase.
#[derive(Debug)]
pub struct Gate {
    n: usize,
    timeout: Duration,
    st: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    arrived: usize,
    generation: u64,
    /// When the latest round was released.
    released: Option<Instant>,
    aborted: Option<String>,
}

impl Gate {
    /// A gate for `n` parties.
    pub fn new(n: usize, timeout: Duration) -> Gate {
        Gate { n: n.max(1), timeout, st: Mutex::new(GateState::default()), cv: Condvar::new() }
    }

    /// Waits until all `n` parties arrived; returns the instant the round was released, the
    /// same for every party.
    pub fn wait(&self) -> Result<Instant> {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &st.aborted {
            bail!("another client failed: {why}");
        }
        st.arrived += 1;
        if st.arrived == self.n {
            let now = Instant::now();
            st.arrived = 0;
            st.generation += 1;
            st.released = Some(now);
            self.cv.notify_all();
            return Ok(now);
        }
        let gen_ = st.generation;
        let deadline = Instant::now() + self.timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                st.aborted.get_or_insert_with(|| "barrier timed out".into());
                self.cv.notify_all();
                bail!("barrier timed out after {:?}", self.timeout);
            }
            let (g, _) = self.cv.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner());
            st = g;
            if let Some(why) = &st.aborted {
                bail!("another client failed: {why}");
            }
            // The next round cannot be released before this party arrives at it, so
            // `released` is still this round's.
            if st.generation != gen_ {
                return st.released.ok_or_else(|| anyhow!("a released round without its instant"));
            }
        }
    }

    /// Fails every current and future wait.
    pub fn abort(&self, why: &str) {
        let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
        st.aborted.get_or_insert_with(|| why.to_string());
        self.cv.notify_all();
    }
}

/// Runs `f(i, gate)` on `n` scoped threads; a thread that fails aborts the gate so the others
/// stop at their next wait. Returns every thread's result, or the first error.
pub fn parallel<T: Send>(
    n: usize,
    timeout: Duration,
    f: impl Fn(usize, &Gate) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let gate = Gate::new(n, timeout);
    let results: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (f, gate) = (&f, &gate);
                s.spawn(move || {
                    let r = f(i, gate);
                    if let Err(e) = &r {
                        gate.abort(&format!("client {i}: {}", crate::error_line(e)));
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a client thread panicked"))))
            .collect()
    });
    // Report the root cause, not the "another client failed" echoes.
    let mut first: Option<anyhow::Error> = None;
    let mut out = Vec::with_capacity(n);
    for r in results {
        match r {
            Ok(v) => out.push(v),
            Err(e) => {
                let echo = format!("{e}").starts_with("another client failed");
                if first.is_none()
                    || (!echo && first.as_ref().is_some_and(|f| format!("{f}").starts_with("another")))
                {
                    first = Some(e);
                }
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Runs a command with a time limit, its stderr shown as it goes; kills it on expiry.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<()> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| anyhow!("starting {shown}: {e}"))?;
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            if st.success() {
                return Ok(());
            }
            bail!("{shown} failed: {st}");
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{shown} did not finish within {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where experiment data lives: tmpfs (`/dev/shm`) when there is one — memory-resident like the
/// paper's ramfs, so the figures measure the network and server path, not a disk — else the
/// temporary directory.
pub fn default_data_root() -> std::path::PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile::Builder::new().prefix(".stripefs-probe-").tempdir_in(shm).is_ok() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// MB/s (10^6 bytes per second).
pub fn mbs(bytes: u64, secs: f64) -> f64 {
    if secs <= 0.0 { f64::NAN } else { bytes as f64 / 1e6 / secs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_releases_all_parties_repeatedly() {
        let out = parallel(3, Duration::from_secs(10), |i, g| {
            for _ in 0..5 {
                g.wait()?;
            }
            Ok(i)
        })
        .unwrap();
        assert_eq!(out, vec![0, 1, 2]);
    }

    /// Every party of a round gets the same release instant, taken once the last one arrived:
    /// a party that arrived early (and one that the scheduler runs late) times its phase from
    /// when everyone could start.
    #[test]
    fn every_party_gets_the_rounds_release_instant() {
        let rounds = parallel(3, Duration::from_secs(10), |i, g| {
            let mut v = Vec::new();
            for _ in 0..4 {
                if i == 2 {
                    // The last to arrive, by a wide margin.
                    std::thread::sleep(Duration::from_millis(5));
                }
                let arrived = Instant::now();
                v.push((arrived, g.wait()?));
            }
            Ok(v)
        })
        .unwrap();
        for r in 0..4 {
            let released = rounds[0][r].1;
            assert!(rounds.iter().all(|p| p[r].1 == released), "round {r}: parties got different instants");
            assert!(rounds.iter().all(|p| p[r].0 <= released), "round {r} released before a party arrived");
            if r > 0 {
                assert!(released > rounds[0][r - 1].1);
            }
        }
    }

    #[test]
    fn one_failure_stops_the_others_instead_of_hanging() {
        let t = Instant::now();
        let r = parallel(3, Duration::from_secs(30), |i, g| {
            if i == 1 {
                bail!("boom");
            }
            g.wait()?;
            Ok(())
        });
        let e = r.unwrap_err();
        assert!(format!("{e:#}").contains("boom"), "{e:#}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_lone_waiter_times_out() {
        let g = Gate::new(2, Duration::from_millis(50));
        assert!(g.wait().is_err());
    }

    #[test]
    fn bounded_commands_are_killed() {
        let e = run_bounded(Command::new("sleep").arg("5"), Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("killed"));
        run_bounded(&mut Command::new("true"), Duration::from_secs(5)).unwrap();
        assert!(run_bounded(&mut Command::new("false"), Duration::from_secs(5)).is_err());
    }

    #[test]
    fn patterns_are_deterministic() {
        assert_eq!(pattern(100, 7), pattern(100, 7));
        assert_ne!(pattern(100, 7), pattern(100, 8));
        assert_eq!(mbs(2_000_000, 2.0), 1.0);
    }
}

//! Medians, spreads and CPU accounting.

use std::time::Duration;

/// Median and spread of repeated measurements.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(xs: &[f64]) -> Summary {
        assert!(!xs.is_empty(), "no samples");
        let mut v = xs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Summary { median, min: v[0], max: v[n - 1] }
    }

    /// "median (min–max)" with a unit.
    pub fn show(&self, unit: &str, decimals: usize) -> String {
        format!("{:.d$} {unit} ({:.d$}–{:.d$})", self.median, self.min, self.max, d = decimals)
    }
}

/// Percentile of a sample (nearest rank).
pub fn percentile(xs: &mut [f64], p: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    let i = ((p / 100.0) * (xs.len() as f64 - 1.0)).round() as usize;
    xs[i.min(xs.len() - 1)]
}

/// User + system CPU time of this process (all threads).
pub fn self_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => tv(u.user_time()) + tv(u.system_time()),
        Err(_) => Duration::ZERO,
    }
}

fn tv(t: nix::sys::time::TimeVal) -> Duration {
    Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
}

/// User + system CPU time of another process (all threads), from /proc/<pid>/stat.
pub fn proc_cpu(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    Some(Duration::from_secs_f64((utime + stime) as f64 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        let s = Summary::of(&[5.0, 1.0, 3.0]);
        assert_eq!(s.median, 3.0);
        let mut v = vec![1.0, 2.0, 3.0, 4.0, 100.0];
        assert_eq!(percentile(&mut v, 50.0), 3.0);
        assert_eq!(percentile(&mut v, 100.0), 100.0);
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let a = self_cpu();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(self_cpu() > a);
        assert!(proc_cpu(std::process::id()).is_some());
    }
}

//! CPU time of this process and of child servers, for CPU-seconds-per-GB figures.

use std::time::Duration;

/// User + system CPU time of this process (all threads).
pub fn self_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => tv(u.user_time()) + tv(u.system_time()),
        Err(_) => Duration::ZERO,
    }
}

/// User + system CPU time of the calling thread only.
pub fn thread_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => tv(u.user_time()) + tv(u.system_time()),
        Err(_) => Duration::ZERO,
    }
}

fn tv(t: nix::sys::time::TimeVal) -> Duration {
    Duration::from_secs(t.tv_sec().max(0) as u64) + Duration::from_micros(t.tv_usec().max(0) as u64)
}

/// User + system CPU time of another process (all its threads), from `/proc/<pid>/stat`, in
/// clock ticks (10 ms on most kernels: measure over long enough runs).
pub fn proc_cpu(pid: u32) -> Option<Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&s, clock_ticks())
}

/// Ticks per second of `/proc` CPU times.
pub fn clock_ticks() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
fn parse_stat_cpu(s: &str, hz: f64) -> Option<Duration> {
    // The command name is in parentheses and may contain spaces: split after the last ')'.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(Duration::from_secs_f64((utime + stime) as f64 / hz))
}

/// The summed CPU time of several processes (those that have exited count as missing).
pub fn procs_cpu(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|&p| proc_cpu(p)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_parse_even_with_odd_command_names() {
        let line = "42 (my (odd) cmd) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu(line, 100.0), Some(Duration::from_secs(2)));
        assert_eq!(parse_stat_cpu("garbage", 100.0), None);
    }

    #[test]
    fn cpu_time_advances_with_work() {
        let (a, t0) = (self_cpu(), thread_cpu());
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(self_cpu() > a);
        assert!(thread_cpu() > t0);
        assert!(proc_cpu(std::process::id()).is_some());
        assert!(proc_cpu(u32::MAX).is_none());
    }
}

//! What a benchmark ran on: printed beside every set of figures.

use std::process::Command;

/// The machine, toolchain and source a run used.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// CPUs available to this process.
    pub cpus: usize,
    /// Total memory in GiB.
    pub mem_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// `rustc --version`.
    pub rustc: String,
    /// Source commit (with `-dirty` when the tree has changes).
    pub commit: String,
    /// UTC date and time.
    pub date: String,
    /// Load averages (1, 5, 15 min) now.
    pub load: String,
}

fn first_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.lines().next().map(|l| l.trim().to_string())
}

/// `model name` of `/proc/cpuinfo`.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// `MemTotal` of `/proc/meminfo` in GiB.
fn mem_total_gib(meminfo: &str) -> Option<f64> {
    let l = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

/// The current load averages, `"1.23 0.98 0.50"`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".into())
}

impl Machine {
    /// Describes this machine (anything unavailable reads `unknown`).
    pub fn detect() -> Machine {
        let unknown = || "unknown".to_string();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let commit = first_line("git", &["rev-parse", "--short", "HEAD"]).map(|c| {
            let dirty = Command::new("git")
                .args(["status", "--porcelain", "--untracked-files=no"])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(false);
            if dirty { format!("{c}-dirty") } else { c }
        });
        Machine {
            cpu: cpu_model(&cpuinfo).unwrap_or_else(unknown),
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            mem_gib: mem_total_gib(&meminfo).unwrap_or(0.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| unknown()),
            rustc: first_line("rustc", &["--version"]).unwrap_or_else(unknown),
            commit: commit.unwrap_or_else(unknown),
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(unknown),
            load: load_average(),
        }
    }

    /// One Markdown paragraph.
    pub fn describe(&self) -> String {
        format!(
            "Machine: {} × {} ({:.0} GiB), Linux {}, {}; commit `{}`, {}; load average at start {}.",
            self.cpus, self.cpu, self.mem_gib, self.kernel, self.rustc, self.commit, self.date, self.load
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let ci = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: x\n";
        assert_eq!(cpu_model(ci).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model(""), None);
        let mi = "MemTotal:       25165824 kB\nMemFree: 1 kB\n";
        assert_eq!(mem_total_gib(mi), Some(24.0));
        assert_eq!(mem_total_gib("nothing"), None);
    }

    #[test]
    fn description_names_everything() {
        let m = Machine::detect();
        assert!(m.cpus >= 1);
        let d = m.describe();
        assert!(d.starts_with("Machine: "));
        assert!(d.contains("commit `"));
        assert!(d.contains("load average"));
    }
}

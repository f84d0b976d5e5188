//! Server child processes: every figure is measured across two processes, ionet and the raw
//! baselines alike.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A server running in a child process; killed on drop.
pub struct ServerProc {
    child: Child,
    pub addr: String,
}

impl ServerProc {
    /// Re-executes this binary with `args` and reads the `LISTEN <addr>` line it prints.
    pub fn spawn(args: &[&str]) -> std::io::Result<ServerProc> {
        let exe = std::env::current_exe()?;
        let mut child =
            Command::new(exe).args(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?;
        let out = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        let addr = line
            .strip_prefix("LISTEN ")
            .map(|a| a.trim().to_string())
            .ok_or_else(|| std::io::Error::other(format!("server printed {line:?}")))?;
        Ok(ServerProc { child, addr })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a server child: die with the parent, so a killed or crashed client never leaves servers
/// behind (Linux `PR_SET_PDEATHSIG`; elsewhere a no-op).
pub fn exit_with_parent() {
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getppid();
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
        // The parent may have died before the call.
        if nix::unistd::getppid() != parent {
            std::process::exit(1);
        }
    }
}

/// True when `prog` is on PATH.
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// Runs `iperf3 -c` against a one-shot `iperf3 -s` on loopback; returns receiver Gbit/s.
pub fn iperf3(len: &str, secs: u32) -> Option<f64> {
    let port = "5399";
    let mut srv = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", port, "-l", len, "-t", &secs.to_string(), "-J"])
        .output()
        .ok();
    let _ = srv.kill();
    let _ = srv.wait();
    let v: serde_json::Value = serde_json::from_slice(&out?.stdout).ok()?;
    v["end"]["sum_received"]["bits_per_second"].as_f64().map(|b| b / 1e9)
}

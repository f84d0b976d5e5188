//! Servers and client endpoints for a measurement session: one server child process per
//! (transport, settings), one client endpoint and peer for each, reused by every run.

use ionet::{Endpoint, PeerId, Scheme};

use crate::BoxErr;
use crate::procs::ServerProc;
use crate::tuning::Tuning;

/// CPUs used when pinning: client and server apart, as on two hosts.
pub const CLIENT_CPU: usize = 0;
/// See [`CLIENT_CPU`].
pub const SERVER_CPU: usize = 1;

/// A connected pair: the server child and this process's endpoint talking to it.
pub struct Pair {
    pub scheme: Scheme,
    pub ep: Endpoint,
    pub peer: PeerId,
    // Declared last: the endpoint goes before its server.
    pub srv: ServerProc,
}

impl Pair {
    /// Starts an ionet perf server over `scheme` with `tuning` (pinned to [`SERVER_CPU`] when
    /// `pin`) and connects to it with the same settings.
    pub fn start(scheme: Scheme, tuning: Tuning, pin: bool) -> Result<Pair, BoxErr> {
        let listen = format!("{scheme}://127.0.0.1:0");
        let mut args: Vec<String> = vec!["server".into(), "--listen".into(), listen];
        args.extend(tuning.server_args());
        if pin {
            args.extend(["--cpu".into(), SERVER_CPU.to_string()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let srv = ServerProc::spawn(&refs)?;
        let ep = Endpoint::client(tuning.config(scheme))?;
        let peer = ep.connect(srv.addr.as_str())?;
        Ok(Pair { scheme, ep, peer, srv })
    }

    /// The server's process id (for its CPU time).
    pub fn server_pid(&self) -> u32 {
        self.srv.pid()
    }
}

/// Pins this process to [`CLIENT_CPU`] when `pin`.
pub fn pin_client(pin: bool) -> Result<(), BoxErr> {
    if pin {
        crate::pin(Some(CLIENT_CPU))?;
    }
    Ok(())
}

//! Raw-socket baselines: the same ping-pong and streaming patterns on plain `std::net`
//! sockets (with ionet's socket-buffer sizes), busy-polling or blocking, so every ionet figure
//! has a ratio against a baseline measured in the same run.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use crate::params::{PARAMS_LEN, Params, Test};
use crate::run::RunResult;
use crate::stats;

/// Kernel socket buffers of the raw baseline: ionet's default (`Config::socket_buffer`), so the
/// baseline and ionet get the same kernel queueing.
const SOCKET_BUFFER: usize = 4 << 20;

fn tune(s: &TcpStream) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    s.set_nodelay(true)?;
    setsockopt(s, sockopt::SndBuf, &SOCKET_BUFFER).map_err(io::Error::from)?;
    setsockopt(s, sockopt::RcvBuf, &SOCKET_BUFFER).map_err(io::Error::from)?;
    Ok(())
}

/// Serves raw-socket tests, one connection at a time, until the listener fails.
pub fn serve(listener: TcpListener) -> io::Result<()> {
    loop {
        let (mut s, _) = listener.accept()?;
        tune(&s)?;
        loop {
            let mut pb = [0u8; PARAMS_LEN];
            if s.read_exact(&mut pb).is_err() {
                break;
            }
            let p = Params::decode(&pb).map_err(io::Error::other)?;
            s.set_nonblocking(p.spin)?;
            let mut buf = vec![1u8; p.size.max(1)];
            match p.test {
                Test::Lat => {
                    for _ in 0..p.iters {
                        read_full(&mut s, &mut buf[..p.size], p.spin)?;
                        write_full(&mut s, &buf[..p.size], p.spin)?;
                    }
                }
                Test::Bw | Test::Msgrate => {
                    let total = p.size * p.iters;
                    let mut got = 0;
                    while got < total {
                        let want = (total - got).min(buf.len());
                        got += read_some(&mut s, &mut buf[..want], p.spin)?;
                    }
                    write_full(&mut s, &[1], p.spin)?;
                }
                Test::Bibw => return Err(io::Error::other("raw bibw not provided")),
            }
            s.set_nonblocking(false)?;
        }
    }
}

/// Longest a read or write may wait: a stuck peer fails the run instead of hanging it.
const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Spin-wait bookkeeping: checks the clock only every 4096 empty polls.
struct SpinDeadline {
    polls: u32,
    since: Option<Instant>,
}

impl SpinDeadline {
    fn new() -> Self {
        SpinDeadline { polls: 0, since: None }
    }

    fn tick(&mut self) -> io::Result<()> {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(4096) {
            let t = *self.since.get_or_insert_with(Instant::now);
            if t.elapsed() > IO_TIMEOUT {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "raw peer silent too long"));
            }
        }
        std::hint::spin_loop();
        Ok(())
    }
}

fn read_some(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> io::Result<usize> {
    let mut d = SpinDeadline::new();
    loop {
        match s.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => return Ok(n),
            Err(e) if spin && e.kind() == io::ErrorKind::WouldBlock => d.tick()?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn read_full(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        got += read_some(s, &mut buf[got..], spin)?;
    }
    Ok(())
}

fn write_full(s: &mut TcpStream, buf: &[u8], spin: bool) -> io::Result<()> {
    let mut done = 0;
    let mut d = SpinDeadline::new();
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(n) => done += n,
            Err(e) if spin && e.kind() == io::ErrorKind::WouldBlock => d.tick()?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A connected raw client.
pub struct RawClient {
    s: TcpStream,
}

impl RawClient {
    pub fn connect(addr: &str) -> io::Result<RawClient> {
        let s = TcpStream::connect(addr)?;
        tune(&s)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(RawClient { s })
    }

    /// Runs one test; the server process's CPU is sampled around it when `server_pid` is known.
    pub fn run(&mut self, p: &Params, server_pid: Option<u32>) -> io::Result<RunResult> {
        self.s.set_nonblocking(false)?;
        self.s.write_all(&p.encode())?;
        self.s.set_nonblocking(p.spin)?;
        let buf = vec![7u8; p.size.max(1)];
        let mut rbuf = vec![1u8; p.size.max(1)];
        let cpu0 = stats::self_cpu();
        let scpu0 = server_pid.and_then(stats::proc_cpu);
        let t0 = Instant::now();
        let mut rtts = Vec::new();
        match p.test {
            Test::Lat => {
                rtts.reserve(p.iters);
                for _ in 0..p.iters {
                    let t = Instant::now();
                    write_full(&mut self.s, &buf[..p.size], p.spin)?;
                    read_full(&mut self.s, &mut rbuf[..p.size], p.spin)?;
                    rtts.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            Test::Bw | Test::Msgrate => {
                for _ in 0..p.iters {
                    write_full(&mut self.s, &buf[..p.size], p.spin)?;
                }
                read_full(&mut self.s, &mut rbuf[..1], p.spin)?;
            }
            Test::Bibw => return Err(io::Error::other("raw bibw not provided")),
        }
        let secs = t0.elapsed().as_secs_f64();
        let client_cpu = (stats::self_cpu() - cpu0).as_secs_f64();
        let server_cpu = match (scpu0, server_pid.and_then(stats::proc_cpu)) {
            (Some(a), Some(b)) => Some((b - a).as_secs_f64()),
            _ => None,
        };
        self.s.set_nonblocking(false)?;
        Ok(RunResult::new(p, secs, rtts, client_cpu, server_cpu))
    }

    /// [`crate::over_ionet::fit`] for the raw baseline.
    pub fn sized(&mut self, p: &Params, target: std::time::Duration) -> io::Result<Params> {
        let q = crate::over_ionet::probe(p);
        let t = Instant::now();
        self.run(&q, None)?;
        Ok(crate::over_ionet::fit(t.elapsed() / q.iters as u32, p, target))
    }
}

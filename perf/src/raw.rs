//! Raw-socket baselines: the same ping-pong and streaming patterns on plain `std::net`
//! sockets (with ionet's default socket options and, when streaming, as much distinct receive
//! memory as ionet's window of posted buffers), busy-polling or blocking, so every ionet figure
//! has a ratio against a baseline measured in the same run.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use crate::params::{PARAMS_LEN, Params, Test};
use crate::run::RunResult;
use crate::stats;

fn tune(s: &TcpStream) -> io::Result<()> {
    // Socket options as ionet's default sets them: buffers sized by the kernel's autotuning,
    // and the same limit on bytes written but not yet sent, so a ratio to this baseline
    // measures ionet rather than a socket option.
    #[cfg(target_os = "linux")]
    if let Some(n) = ionet::Config::default().get_tcp_notsent_lowat() {
        socket2::SockRef::from(s).set_tcp_notsent_lowat(u32::try_from(n).unwrap_or(u32::MAX))?;
    }
    s.set_nodelay(true)
}

/// Most memory the streaming receiver cycles through (it is kept between tests).
const MAX_SLAB: usize = 1 << 30;

/// How many bytes of receive memory a streaming test cycles through: `window` messages' worth,
/// as ionet's receiver posts `window` distinct buffers. Receiving everything into one
/// cache-hot buffer would flatter the baseline at large sizes (a 4 MiB message stays in
/// cache; 64 distinct 4 MiB buffers do not).
fn slab_len(p: &Params) -> usize {
    let size = p.size.max(1);
    size.saturating_mul(p.window).min(MAX_SLAB.max(size))
}

/// Serves raw-socket tests, one connection at a time, until the listener fails.
pub fn serve(listener: TcpListener) -> io::Result<()> {
    // Pre-faulted once and reused: first touch costs ~2.5 s/GiB here.
    let mut slab: Vec<u8> = Vec::new();
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
                Test::Bw | Test::Msgrate | Test::Stream => {
                    let len = slab_len(&p);
                    if slab.len() < len {
                        slab = vec![1u8; len];
                    }
                    // Message i lands at (i * size) mod len: distinct memory per message in a
                    // window, while small messages still arrive many per read.
                    let total = p.size * p.iters;
                    let (mut got, mut at) = (0, 0);
                    while got < total {
                        let want = (total - got).min(len - at);
                        let n = read_some(&mut s, &mut slab[at..at + want], p.spin)?;
                        got += n;
                        at = (at + n) % len;
                    }
                    write_full(&mut s, &[1], p.spin)?;
                }
                Test::Bibw => return Err(io::Error::other("raw bibw not provided")),
                Test::Read => return Err(io::Error::other("raw read not provided")),
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
            Test::Bw | Test::Msgrate | Test::Stream => {
                for _ in 0..p.iters {
                    write_full(&mut self.s, &buf[..p.size], p.spin)?;
                }
                read_full(&mut self.s, &mut rbuf[..1], p.spin)?;
            }
            Test::Bibw => return Err(io::Error::other("raw bibw not provided")),
            Test::Read => return Err(io::Error::other("raw read not provided")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(test: Test, size: usize, window: usize, iters: usize) -> Params {
        Params {
            test,
            size,
            iters,
            window,
            sl: ionet::ServiceLevel::Normal,
            verify: false,
            spin: false,
            pool: false,
            footprint: 0,
        }
    }

    #[test]
    fn streaming_receiver_cycles_through_a_window_of_messages() {
        assert_eq!(slab_len(&params(Test::Bw, 4 << 20, 64, 1)), 256 << 20);
        assert_eq!(slab_len(&params(Test::Bw, 8, 64, 1)), 512);
        // Capped, but never below one message.
        assert_eq!(slab_len(&params(Test::Bw, 64 << 20, 64, 1)), MAX_SLAB);
        assert_eq!(slab_len(&params(Test::Bw, 0, 4, 1)), 4);
    }

    #[test]
    fn streams_whose_messages_straddle_the_slab_end_complete() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || serve(l));
        let mut c = RawClient::connect(&addr).unwrap();
        // 1000-byte messages, a 3000-byte slab: reads wrap mid-stream; then a larger test grows it.
        for p in
            [params(Test::Bw, 1000, 3, 10), params(Test::Msgrate, 8, 7, 1001), params(Test::Bw, 70_000, 2, 5)]
        {
            let r = c.run(&p, None).unwrap();
            assert_eq!(r.bytes, (p.size * p.iters) as u64);
        }
        let r = c.run(&params(Test::Lat, 100, 1, 3), None).unwrap();
        assert!(r.rtt_p50.is_some());
    }
}

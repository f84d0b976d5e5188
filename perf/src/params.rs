//! The test descriptor a client sends to a server before each run.

use ionet::ServiceLevel;

/// Which measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Test {
    /// Ping-pong round trips.
    Lat,
    /// One-way streaming a window at a time (as OSU's `osu_bw`): the sender posts `window`
    /// messages and waits for the receiver's acknowledgement of the whole window, while the
    /// receiver posts its next window of receives; the pipeline drains once a window.
    Bw,
    /// One-way streaming without pauses, as a socket stream runs (iperf3): the sender keeps
    /// `window` messages in flight, posting the next as each completes, and the receiver
    /// posts each buffer again as soon as its message has arrived.
    Stream,
    /// Streaming in both directions at once.
    Bibw,
    /// Small-message rate (a `bw` with small messages).
    Msgrate,
    /// Request-driven streaming, a file system's read: the client keeps `window` requests
    /// outstanding, each offering its receive buffer as an IN payload; the server pushes a
    /// message into each and replies. The data flows server to client.
    Read,
}

/// Parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub test: Test,
    pub size: usize,
    pub iters: usize,
    pub window: usize,
    pub sl: ServiceLevel,
    pub verify: bool,
    /// Raw baselines: busy-poll instead of blocking reads.
    pub spin: bool,
    /// Send and receive from the endpoint's registered pool (`Endpoint::alloc`, BMI's
    /// `BMI_memalloc`) instead of plain heap buffers.
    pub pool: bool,
    /// Bytes of memory each side cycles its streamed messages through (bw, bibw, msgrate),
    /// at least a window's worth: a run can carry an application's working set (a file
    /// system's regions and files) and the cache misses that come with it. 0 measures the
    /// transport's cache-resident peak: `window` receive buffers, every send from one payload
    /// (pool buffers: `window` of them).
    pub footprint: usize,
}

/// Largest footprint a server accepts (it allocates that much).
pub const MAX_FOOTPRINT: usize = 1 << 30;

pub const PARAMS_LEN: usize = 32;

impl Params {
    pub fn encode(&self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        b[0] = match self.test {
            Test::Lat => 1,
            Test::Bw => 2,
            Test::Bibw => 3,
            Test::Msgrate => 4,
            Test::Read => 5,
            Test::Stream => 6,
        };
        b[1] = self.sl as u8;
        b[2] = u8::from(self.verify) | (u8::from(self.spin) << 1) | (u8::from(self.pool) << 2);
        b[8..16].copy_from_slice(&(self.size as u64).to_le_bytes());
        b[16..24].copy_from_slice(&(self.iters as u64).to_le_bytes());
        b[24..28].copy_from_slice(&(self.window as u32).to_le_bytes());
        b[28..32].copy_from_slice(&(self.footprint.min(u32::MAX as usize) as u32).to_le_bytes());
        b
    }

    /// Distinct buffers each side cycles through: `window` (one for ping-pong), or as many as
    /// [`Params::footprint`] holds.
    pub fn slots(&self) -> usize {
        match self.test {
            Test::Lat => 1,
            _ => self.window.max(self.footprint.div_ceil(self.size.max(1))),
        }
    }

    pub fn decode(b: &[u8]) -> Result<Params, String> {
        if b.len() != PARAMS_LEN {
            return Err(format!("params of {} bytes", b.len()));
        }
        let test = match b[0] {
            1 => Test::Lat,
            2 => Test::Bw,
            3 => Test::Bibw,
            4 => Test::Msgrate,
            5 => Test::Read,
            6 => Test::Stream,
            x => return Err(format!("unknown test {x}")),
        };
        let sl = ServiceLevel::from_u8(b[1]).ok_or("bad service level")?;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let size = u64_at(8) as usize;
        let iters = u64_at(16) as usize;
        let window = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")) as usize;
        let footprint = u32::from_le_bytes(b[28..32].try_into().expect("4 bytes")) as usize;
        // A server takes these from the network: keep them sane.
        if size > (256 << 20)
            || iters == 0
            || iters > 100_000_000
            || window == 0
            || window > 4096
            || footprint > MAX_FOOTPRINT
        {
            return Err("parameters out of range".into());
        }
        Ok(Params {
            test,
            size,
            iters,
            window,
            sl,
            verify: b[2] & 1 != 0,
            spin: b[2] & 2 != 0,
            pool: b[2] & 4 != 0,
            footprint,
        })
    }
}

/// Deterministic bytes for verification.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_and_reject_nonsense() {
        let p = Params {
            test: Test::Bibw,
            size: 4096,
            iters: 10,
            window: 64,
            sl: ServiceLevel::Bulk,
            verify: true,
            spin: false,
            pool: true,
            footprint: 0,
        };
        assert_eq!(Params::decode(&p.encode()), Ok(p));
        let spread = Params { test: Test::Bw, footprint: 1 << 20, ..p };
        assert_eq!(Params::decode(&spread.encode()), Ok(spread));
        let read = Params { test: Test::Read, ..spread };
        assert_eq!(Params::decode(&read.encode()), Ok(read));
        let stream = Params { test: Test::Stream, ..spread };
        assert_eq!(Params::decode(&stream.encode()), Ok(stream));
        assert_eq!(read.slots(), 256, "a read cycles its footprint like a stream");
        assert_eq!(spread.slots(), 256, "1 MiB of 4 KiB messages");
        assert_eq!(Params { footprint: 4096, ..spread }.slots(), 64, "never fewer than the window");
        assert_eq!(Params { test: Test::Lat, ..spread }.slots(), 1);
        assert!(Params::decode(&Params { footprint: 2 << 30, ..spread }.encode()).is_err());
        let mut b = p.encode();
        b[0] = 9;
        assert!(Params::decode(&b).is_err());
        let huge = Params { size: 1 << 40, ..p };
        assert!(Params::decode(&huge.encode()).is_err());
        assert!(Params::decode(&[0u8; 3]).is_err());
    }
}

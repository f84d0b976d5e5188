//! The TCP side channel that sets up each queue pair, as BMI-IB does: the same authenticated
//! handshake as the TCP backend (`HELLO` → `HELLO_ACK` → `AUTH` → `READY`), then each side
//! sends an `IB_INFO` frame with its queue-pair address (QPN, PSN, LID, GID), its port (link
//! layer and active MTU) and its receive geometry (credits, fast-RDMA ring address, key and
//! slots), and the client confirms with
//! `IB_READY` once its queue pair can receive. The socket then stays open: its closing is how
//! a dead peer is noticed even when no work request is outstanding.

use std::io::{self, Read, Write};

use mio::net::TcpStream;

use crate::ib::verbs::{LinkLayer, Mtu, QpEndpointInfo};
use crate::wire::{HEADER_LEN, Header, Limits, MAX_HANDSHAKE_PAYLOAD};

/// What one side tells the other about its queue pair and receive memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IbInfo {
    pub qp: QpEndpointInfo,
    /// Receive buffers posted for SENDs: the credits the peer starts with.
    pub recv_buffers: u16,
    /// Size of each receive buffer.
    pub recv_size: u32,
    /// The fast-RDMA ring: address, remote key, slots, slot size.
    pub ring_addr: u64,
    pub ring_rkey: u32,
    pub ring_slots: u16,
    pub slot_size: u32,
    /// The link layer of the sender's port: both ends must agree.
    pub link_layer: LinkLayer,
    /// The active MTU of the sender's port: the path MTU is the smaller of the two.
    pub mtu: Mtu,
}

/// Version of the `IB_INFO` body. Version 1 (60 bytes) carried no port description; a peer
/// that sends it cannot agree on a RoCE route or an MTU, and is refused with a message that
/// says so rather than a bare length error.
pub(crate) const IB_INFO_VERSION: u8 = 2;
const IB_INFO_V1_LEN: usize = QpEndpointInfo::WIRE_LEN + 28;
pub(crate) const IB_INFO_LEN: usize = IB_INFO_V1_LEN + 4;

fn link_layer_code(l: LinkLayer) -> u8 {
    match l {
        LinkLayer::Unspecified => 0,
        LinkLayer::InfiniBand => 1,
        LinkLayer::Ethernet => 2,
    }
}

impl IbInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(IB_INFO_LEN);
        v.extend_from_slice(&self.qp.encode());
        v.extend_from_slice(&self.recv_buffers.to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&self.recv_size.to_le_bytes());
        v.extend_from_slice(&self.ring_addr.to_le_bytes());
        v.extend_from_slice(&self.ring_rkey.to_le_bytes());
        v.extend_from_slice(&self.ring_slots.to_le_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&self.slot_size.to_le_bytes());
        v.extend_from_slice(&[IB_INFO_VERSION, link_layer_code(self.link_layer), self.mtu.as_raw() as u8, 0]);
        v
    }

    /// Decodes and range-checks a peer's info. Total: any bytes give a value or an error.
    pub(crate) fn decode(b: &[u8]) -> Result<IbInfo, String> {
        if b.len() == IB_INFO_V1_LEN {
            return Err(format!(
                "the peer sent IB info version 1; this endpoint speaks version {IB_INFO_VERSION} \
                 (port link layer and MTU): upgrade both ends"
            ));
        }
        if b.len() != IB_INFO_LEN {
            return Err(format!("IB info of {} bytes", b.len()));
        }
        let tail = &b[IB_INFO_V1_LEN..];
        if tail[0] != IB_INFO_VERSION {
            return Err(format!(
                "the peer sent IB info version {}; this endpoint speaks version {IB_INFO_VERSION}",
                tail[0]
            ));
        }
        let link_layer = match tail[1] {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            n => return Err(format!("unknown link layer {n} in the peer's IB info")),
        };
        let mtu = Mtu::from_raw(u32::from(tail[2]))
            .ok_or_else(|| format!("invalid MTU code {} in IB info", tail[2]))?;
        if tail[3] != 0 {
            return Err("reserved IB info bits set".into());
        }
        let qp = QpEndpointInfo::decode(&b[..32]).map_err(|e| e.to_string())?;
        let r = &b[32..];
        let u16_at = |i: usize| u16::from_le_bytes([r[i], r[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
        if u16_at(2) != 0 || u16_at(22) != 0 {
            return Err("reserved IB info bits set".into());
        }
        let info = IbInfo {
            qp,
            recv_buffers: u16_at(0),
            recv_size: u32_at(4),
            ring_addr: u64::from_le_bytes(r[8..16].try_into().expect("8 bytes")),
            ring_rkey: u32_at(16),
            ring_slots: u16_at(20),
            slot_size: u32_at(24),
            link_layer,
            mtu,
        };
        if !(2..=1024).contains(&info.recv_buffers) || !(4096..=1 << 20).contains(&info.recv_size) {
            return Err("peer receive geometry out of range".into());
        }
        if !(1..=256).contains(&info.ring_slots)
            || !(4096..=crate::flowctl::MAX_RING_SLOT_SIZE).contains(&info.slot_size)
        {
            return Err("peer ring geometry out of range".into());
        }
        info.ring_addr
            .checked_add(u64::from(info.ring_slots) * u64::from(info.slot_size))
            .ok_or("peer ring wraps the address space")?;
        Ok(info)
    }
}

/// A non-blocking framed socket for the side channel: whole frames in, whole frames out.
#[derive(Debug)]
pub(crate) struct Framed {
    pub sock: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
}

/// A side-channel frame never exceeds this.
const MAX_FRAME: usize = HEADER_LEN + MAX_HANDSHAKE_PAYLOAD;

impl Framed {
    pub(crate) fn new(sock: TcpStream) -> Framed {
        Framed { sock, rbuf: Vec::with_capacity(MAX_FRAME), wbuf: Vec::new() }
    }

    /// Queues a frame and tries to write it.
    pub(crate) fn send(&mut self, h: &Header, body: &[u8]) -> io::Result<()> {
        self.wbuf.extend_from_slice(&h.encode());
        self.wbuf.extend_from_slice(body);
        self.flush()
    }

    /// Writes what is queued; `Ok` also when the socket is full (the rest waits for writable).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        while !self.wbuf.is_empty() {
            match (&self.sock).write(&self.wbuf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// True when everything queued has been written.
    pub(crate) fn flushed(&self) -> bool {
        self.wbuf.is_empty()
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed; an error on EOF, a
    /// socket error or a malformed frame. Reads at most one frame's worth of bytes, so what a
    /// peer sends after the handshake cannot pile up here.
    pub(crate) fn recv(&mut self) -> io::Result<Option<(Header, Vec<u8>)>> {
        loop {
            if self.rbuf.len() >= HEADER_LEN {
                let h = Header::decode(&self.rbuf[..HEADER_LEN])
                    .and_then(|h| {
                        h.check_limits(&Limits { eager: 0, chunk: 0, header: 0, message: 0 }).map(|_| h)
                    })
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                if !h.kind.is_handshake() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "non-handshake frame on the side channel",
                    ));
                }
                let total = HEADER_LEN + h.len as usize;
                if self.rbuf.len() >= total {
                    let body = self.rbuf[HEADER_LEN..total].to_vec();
                    self.rbuf.drain(..total);
                    return Ok(Some((h, body)));
                }
            }
            let want = if self.rbuf.len() < HEADER_LEN {
                HEADER_LEN - self.rbuf.len()
            } else {
                let h = Header::decode(&self.rbuf[..HEADER_LEN])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                HEADER_LEN + h.len as usize - self.rbuf.len()
            };
            let mut tmp = [0u8; MAX_FRAME];
            match (&self.sock).read(&mut tmp[..want.min(MAX_FRAME)]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.rbuf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// After setup: any byte or EOF means the connection is over. `Ok(true)` while idle.
    pub(crate) fn still_open(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match (&self.sock).read(&mut b) {
                // Nothing is expected on an established side channel.
                Ok(_) => return false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// A queue pair's details as a test's peer would send them.
#[cfg(test)]
pub(crate) fn sample_info(qpn: u32) -> IbInfo {
    IbInfo {
        qp: QpEndpointInfo { qpn, psn: 1234, lid: 3, gid: crate::ib::verbs::Gid([9; 16]) },
        recv_buffers: 16,
        recv_size: 8192,
        ring_addr: 0x7f00_0000_0000,
        ring_rkey: 0xabcd,
        ring_slots: 8,
        slot_size: 69632,
        link_layer: LinkLayer::InfiniBand,
        mtu: Mtu::Mtu4096,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> IbInfo {
        IbInfo { link_layer: LinkLayer::Ethernet, mtu: Mtu::Mtu1024, ..sample_info(77) }
    }

    #[test]
    fn info_round_trips_and_rejects_bad_geometry() {
        let i = info();
        assert_eq!(IbInfo::decode(&i.encode()), Ok(i));
        assert!(IbInfo::decode(&i.encode()[..59]).is_err());
        let v1 = IbInfo::decode(&i.encode()[..60]).unwrap_err();
        assert!(v1.contains("version 1"), "{v1}");
        for (at, byte, why) in
            [(60, 3, "version 3"), (61, 9, "link layer"), (62, 0, "MTU"), (62, 6, "MTU"), (63, 1, "reserved")]
        {
            let mut raw = i.encode();
            raw[at] = byte;
            let e = IbInfo::decode(&raw).unwrap_err();
            assert!(e.contains(why), "{at}={byte}: {e}");
        }
        for bad in [
            IbInfo { recv_buffers: 0, ..i },
            IbInfo { recv_size: 100, ..i },
            IbInfo { ring_slots: 0, ..i },
            IbInfo { slot_size: u32::MAX, ..i },
            IbInfo { ring_addr: u64::MAX - 10, ..i },
        ] {
            assert!(IbInfo::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut raw = i.encode();
        raw[34] = 1;
        assert!(IbInfo::decode(&raw).is_err(), "reserved bits");
    }

    proptest::proptest! {
        #[test]
        fn info_decode_is_total(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = IbInfo::decode(&b);
        }
    }
}

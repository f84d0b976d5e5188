//! A lost peer's transfers, on the tables that schedule them: no device, no connection. Its
//! transfers go, and every byte of its units the bulk scheduler counts as in flight comes
//! back — posted (in the flushed send queues), deferred for send-queue room, waiting for or
//! granted a zone buffer. Left counted, those bytes would eat the per-peer and per-endpoint
//! RDMA caps for good.

use crate::flowctl::{BufferZones, Grant};
use crate::types::PeerId;

use super::units::{Units, ZoneToken};

impl Units {
    /// `peer` is lost and its send queues flushed, which held `flushed` bytes of its units.
    /// Returns the zone grants made meanwhile to other peers, for the engine to serve (after
    /// the lost peer's memory is released: its buffers are free by then).
    pub fn lose_peer(
        &mut self,
        peer: PeerId,
        flushed: usize,
        zones: Option<&mut BufferZones<ZoneToken>>,
    ) -> Vec<Grant<ZoneToken>> {
        let mut unit_bytes = flushed;
        let gone: Vec<u64> = self.xfers.iter().filter(|(_, x)| x.peer == peer).map(|(k, _)| *k).collect();
        for x in gone {
            self.bulk.remove(&x);
            self.xfers.remove(&x);
        }
        unit_bytes += self.deferred.iter().filter(|d| d.peer == peer).map(|d| d.len).sum::<usize>();
        self.deferred.retain(|d| d.peer != peer);
        // Zone buffers of this peer (held by its units, deferred or granted) all come back with
        // release_client; grants it frees for other peers stay queued for the engine's pump.
        let mut grants = Vec::new();
        if let Some(z) = zones {
            while let Some(g) = z.poll_grant() {
                if g.client == peer {
                    unit_bytes += g.token.2;
                } else {
                    grants.push(g);
                }
            }
            unit_bytes += z.release_client(peer).iter().map(|t| t.2).sum::<usize>();
        }
        self.bulk.unit_done(peer, unit_bytes);
        grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::BulkScheduler;
    use crate::flowctl::{Alloc, ZoneConfig};
    use crate::types::OpId;

    use super::super::units::Deferred;
    use super::super::{Local, Xfer, XferThen};

    const A: PeerId = PeerId(1);
    const B: PeerId = PeerId(2);

    fn xfer(peer: PeerId, total: usize) -> Xfer {
        Xfer {
            peer,
            conn: 0,
            read: true,
            remote: Vec::new(),
            remote_off: 0,
            local: Local::Vec(Vec::new()),
            total,
            done_bytes: 0,
            units_out: 0,
            failed: None,
            then: XferThen::CompleteOp(OpId(1)),
        }
    }

    /// The tables, with a 4000-byte transfer per peer whose units the scheduler has all
    /// handed out; the test says where each unit went.
    struct T {
        units: Units,
        zones: BufferZones<ZoneToken>,
    }

    impl T {
        /// Also returns the units: (peer, transfer, offset, length) in order.
        fn new(zone_bufs: u32) -> (T, Vec<(PeerId, u64, usize, usize)>) {
            // Units of 1000 bytes; caps high enough to hand out all of them.
            let mut t = Units::new(BulkScheduler::new(1000, 1000, 1 << 20, 1 << 20));
            for (id, peer) in [(10, A), (20, B)] {
                t.xfers.insert(id, xfer(peer, 4000));
                t.bulk.add(id, peer, 4000);
            }
            let mut units = Vec::new();
            while let Some((x, off, len)) = t.next_unit() {
                units.push((t.xfers[&x].peer, x, off, len));
            }
            let cfg = ZoneConfig::default().classes(&[(4096, zone_bufs)]);
            let zones = BufferZones::new(&cfg).expect("zones");
            (T { units: t, zones }, units)
        }

        fn lose(&mut self, peer: PeerId, flushed: usize) -> Vec<Grant<ZoneToken>> {
            self.units.lose_peer(peer, flushed, Some(&mut self.zones))
        }
    }

    #[test]
    fn every_in_flight_byte_of_the_lost_peer_comes_back() {
        let (mut t, units) = T::new(2);
        assert_eq!(t.units.bulk.in_flight(A), 4000);
        assert_eq!(t.units.bulk.in_flight(B), 4000);
        let of = |p: PeerId| units.iter().filter(move |u| u.0 == p).copied();
        let a: Vec<_> = of(A).collect();
        // A's units: one posted (flushed), one deferred, one deferred with a zone buffer, one
        // waiting for a zone buffer behind B's.
        let (_, x, off, len) = a[1];
        t.units.deferred.push_back(Deferred { xfer: x, peer: A, off, len, zone: None });
        let Ok(Alloc::Granted(g)) = t.zones.alloc(A, a[2].3, (a[2].1, a[2].2, a[2].3)) else {
            panic!("a free zone buffer")
        };
        let (_, x, off, len) = a[2];
        t.units.deferred.push_back(Deferred { xfer: x, peer: A, off, len, zone: Some(g.buf) });
        let b: Vec<_> = of(B).collect();
        let Ok(Alloc::Granted(b_zone)) = t.zones.alloc(B, b[0].3, (b[0].1, b[0].2, b[0].3)) else {
            panic!("the second zone buffer")
        };
        assert!(matches!(t.zones.alloc(A, a[3].3, (a[3].1, a[3].2, a[3].3)), Ok(Alloc::Wait)));
        // B's unit waiting for a zone buffer too, and one of B's deferred.
        assert!(matches!(t.zones.alloc(B, b[1].3, (b[1].1, b[1].2, b[1].3)), Ok(Alloc::Wait)));
        t.units.deferred.push_back(Deferred { xfer: b[2].1, peer: B, off: b[2].2, len: b[2].3, zone: None });

        let grants = t.lose(A, a[0].3);
        assert_eq!(t.units.bulk.in_flight(A), 0, "posted, deferred, zoned and waiting bytes all back");
        assert_eq!(t.units.bulk.in_flight(B), 4000, "the other peer's stay counted");
        assert_eq!(t.units.bulk.in_flight_total(), 4000);
        assert!(!t.units.xfers.contains_key(&10) && t.units.xfers.contains_key(&20));
        assert_eq!(t.units.deferred.iter().map(|d| d.peer).collect::<Vec<_>>(), [B]);
        assert_eq!(t.zones.held_by(A), 0);
        // A's buffer went to B's waiting unit: a grant left for the engine's pump.
        assert!(grants.is_empty(), "no grant was ready before the loss");
        let g = t.zones.poll_grant().expect("B's waiting unit gets the freed buffer");
        assert_eq!((g.client, g.token), (B, (b[1].1, b[1].2, b[1].3)));
        assert!(t.zones.free(b_zone.buf).is_ok(), "B keeps its own buffer");
    }

    #[test]
    fn grants_ready_for_other_peers_are_handed_back() {
        let (mut t, units) = T::new(1);
        let a = units.iter().find(|u| u.0 == A).copied().expect("a unit of A");
        let b: Vec<_> = units.iter().filter(|u| u.0 == B).copied().collect();
        let Ok(Alloc::Granted(held)) = t.zones.alloc(B, b[0].3, (b[0].1, b[0].2, b[0].3)) else {
            panic!("the only zone buffer")
        };
        assert!(matches!(t.zones.alloc(A, a.3, (a.1, a.2, a.3)), Ok(Alloc::Wait)));
        assert!(matches!(t.zones.alloc(B, b[1].3, (b[1].1, b[1].2, b[1].3)), Ok(Alloc::Wait)));
        // B's buffer comes back: A, first in line, is granted it (not yet polled).
        t.zones.free(held.buf).expect("held");
        let grants = t.lose(A, 0);
        assert!(grants.is_empty(), "A's own grant is counted back, not served");
        assert_eq!(t.units.bulk.in_flight(A), 4000 - a.3, "the granted unit's bytes came back");
        let g = t.zones.poll_grant().expect("the buffer A held goes to B");
        assert_eq!(g.client, B);

        // A grant ready for another peer when A is lost is handed back to be served.
        let (mut t, units) = T::new(1);
        let a = units.iter().find(|u| u.0 == A).copied().expect("a unit of A");
        let b = units.iter().find(|u| u.0 == B).copied().expect("a unit of B");
        let Ok(Alloc::Granted(held)) = t.zones.alloc(A, a.3, (a.1, a.2, a.3)) else { panic!("free") };
        assert!(matches!(t.zones.alloc(B, b.3, (b.1, b.2, b.3)), Ok(Alloc::Wait)));
        t.zones.free(held.buf).expect("held");
        let grants = t.lose(A, 0);
        assert_eq!(grants.len(), 1, "B's grant is the engine's to serve");
        assert_eq!((grants[0].client, grants[0].token), (B, (b.1, b.2, b.3)));
        assert_eq!(t.units.bulk.in_flight(B), 4000);
    }

    #[test]
    fn without_zones_the_scheduler_is_still_settled() {
        let (mut t, units) = T::new(1);
        let a: Vec<_> = units.iter().filter(|u| u.0 == A).copied().collect();
        t.units.deferred.push_back(Deferred { xfer: a[0].1, peer: A, off: a[0].2, len: a[0].3, zone: None });
        let grants = t.units.lose_peer(A, 4000 - a[0].3, None);
        assert!(grants.is_empty());
        assert_eq!(t.units.bulk.in_flight(A), 0);
        assert!(t.units.deferred.is_empty());
    }
}

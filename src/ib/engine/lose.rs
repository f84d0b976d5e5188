//! What losing a peer takes down, decided on plain tables: no device, no connection.
//!
//! Its side channels, connections and the posts waiting for those connections' limits are
//! picked from what the engine's tables say of them ([`teardown`]). Its transfers go, and
//! every byte of its units the bulk scheduler counts as in flight comes back — posted (in the
//! flushed send queues), deferred for send-queue room, waiting for or granted a zone buffer.
//! Left counted, those bytes would eat the per-peer and per-endpoint RDMA caps for good.

use crate::flowctl::{BufferZones, Grant};
use crate::types::{OpId, PeerId};

use super::units::{Units, ZoneToken};

/// What losing a peer tears down besides its transfers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Teardown<T> {
    /// Its side channels, those still in their handshake too.
    pub sides: Vec<T>,
    /// Its connections, ascending, each once.
    pub conns: Vec<u32>,
    /// Sends and requests waiting for one of those connections' limits: they fail like
    /// posted ops. By connection, in posting order.
    pub waiting: Vec<OpId>,
}

/// What losing `peer` tears down. `sides` are the side channels with the peer each serves;
/// `table` the connections with their peer and the posts waiting for their limits; `held`
/// what the peer's record held (taken from it as it is lost). A connection counts when either
/// names it for the peer: one being set up is in the table before the record holds it, and
/// the record's are the peer's whatever the table says.
pub(crate) fn teardown<T, W>(
    peer: PeerId,
    sides: impl IntoIterator<Item = (T, Option<PeerId>)>,
    table: impl IntoIterator<Item = (u32, PeerId, W)>,
    held: Vec<u32>,
) -> Teardown<T>
where
    W: IntoIterator<Item = OpId>,
{
    let sides = sides.into_iter().filter(|(_, p)| *p == Some(peer)).map(|(t, _)| t).collect();
    let mut found: Vec<(u32, W)> = table
        .into_iter()
        .filter(|(id, p, _)| *p == peer || held.contains(id))
        .map(|(id, _, waiting)| (id, waiting))
        .collect();
    found.sort_by_key(|(id, _)| *id);
    let mut conns: Vec<u32> = found.iter().map(|(id, _)| *id).chain(held).collect();
    conns.sort_unstable();
    conns.dedup();
    let waiting = found.into_iter().flat_map(|(_, waiting)| waiting).collect();
    Teardown { sides, conns, waiting }
}

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

    /// A connection table: (id, peer, waiting posts).
    fn table(rows: &[(u32, PeerId, &[u64])]) -> Vec<(u32, PeerId, Vec<OpId>)> {
        rows.iter().map(|(id, p, w)| (*id, *p, w.iter().map(|o| OpId(*o)).collect())).collect()
    }

    #[test]
    fn teardown_takes_the_peers_side_channels_only() {
        let sides = [("a-setup", None), ("a1", Some(A)), ("b1", Some(B)), ("a2", Some(A))];
        let t = teardown(A, sides, table(&[]), Vec::new());
        assert_eq!(t.sides, ["a1", "a2"], "its own, also one in its handshake; not one with no peer yet");
        assert!(t.conns.is_empty() && t.waiting.is_empty());
    }

    #[test]
    fn teardown_takes_connections_the_table_or_the_record_names() {
        // The table lists by id; 5 of A's is still being set up (not in the record), 2 is
        // in the record only (gone from the table), 3 in both.
        let rows = table(&[(1, B, &[10]), (3, A, &[30, 31]), (5, A, &[50]), (7, B, &[70])]);
        let t = teardown(A, Vec::<((), _)>::new(), rows, vec![3, 2]);
        assert_eq!(t.conns, [2, 3, 5], "both sources, ascending, once each");
        assert_eq!(t.waiting, [OpId(30), OpId(31), OpId(50)], "waiting posts of those, in order");
    }

    #[test]
    fn teardown_takes_what_the_record_held_whatever_the_table_says() {
        // The record names 4, which the table lists under another peer; the table's rows come
        // in any order.
        let rows = table(&[(9, A, &[90]), (4, B, &[40, 41]), (1, B, &[10])]);
        let t = teardown(A, Vec::<((), _)>::new(), rows, vec![4]);
        assert_eq!(t.conns, [4, 9]);
        assert_eq!(t.waiting, [OpId(40), OpId(41), OpId(90)], "by connection");
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

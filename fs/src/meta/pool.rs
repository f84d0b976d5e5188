//! Handles reserved for files whose objects the meta server makes ahead of their creates.
//!
//! A create otherwise waits for a durable pending record, then for every io server to make
//! its object durably, then for the commit. The meta server instead reserves a batch of handles
//! here (one durable transaction), has their objects made on every io server in the
//! background, and gives each to a create whose layout spans every server, which then commits
//! in one transaction ([`Placement::precreated`](super::Placement)).
//!
//! The table holds every reserved handle not yet taken, whether its objects are made yet or
//! not: which are is the meta server's knowledge, lost with it. So at start-up every reserved
//! handle is moved to `orphans` ([`MetaStore::recycle_precreated`]), whose clean-up removes
//! whatever objects it has, made or not; a batch that failed goes the same way. Nothing made
//! ahead is ever left on an io server without a record that leads to its removal.

use super::{MetaError, MetaStore, Objects, PRECREATED, encode_rec};
use crate::layout::Layout;
use crate::proto::Handle;
use redb::ReadableTable;
use tracing::info;

impl MetaStore {
    /// Reserves `n` new handles for files whose objects are to be made ahead (durably, before
    /// any object is made, so none can be left without a record).
    pub fn reserve_precreated(&self, n: usize) -> Result<Vec<Handle>, MetaError> {
        self.write(|tx| {
            (0..n)
                .map(|_| {
                    let h = tx.next_handle()?;
                    tx.precreated.insert(h, ())?;
                    Ok(Handle(h))
                })
                .collect()
        })
    }

    /// Gives up reserved handles (their objects failed, or are not wanted): they become orphans
    /// over every io server, for the janitor to remove whatever was made. Handles already taken
    /// by a create are left alone.
    pub fn release_precreated(&self, hs: &[Handle]) -> Result<Vec<Objects>, MetaError> {
        let all = self.all_servers();
        self.write(|tx| {
            let mut out = Vec::new();
            for &h in hs {
                if tx.precreated.remove(h.0)?.is_some() {
                    tx.orphans.insert(h.0, encode_rec(&all).as_slice())?;
                    out.push(Objects { handle: h, layout: all });
                }
            }
            Ok(out)
        })
    }

    /// Gives up every reserved handle (at start-up, when which of them have their objects is
    /// no longer known): see [`MetaStore::release_precreated`]. Returns how many there were.
    pub fn recycle_precreated(&self) -> Result<usize, MetaError> {
        let hs = self.precreated()?;
        let n = self.release_precreated(&hs)?.len();
        if n > 0 {
            info!(handles = n, "handles reserved for precreated objects given up");
        }
        Ok(n)
    }

    /// The handles reserved and not yet taken, in order.
    pub fn precreated(&self) -> Result<Vec<Handle>, MetaError> {
        let r = self.db.begin_read()?;
        let t = match r.open_table(PRECREATED) {
            Ok(t) => t,
            // A database no write has touched since the table was added.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        t.iter()?.map(|row| Ok(Handle(row?.0.value()))).collect()
    }

    /// The layout whose servers are all the io servers: where a precreated handle has objects.
    fn all_servers(&self) -> Layout {
        Layout { base: 0, pcount: self.cfg.n_servers, ssize: self.cfg.default_ssize }
    }
}

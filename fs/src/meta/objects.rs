//! Files' objects on the io servers, as the namespace records them: a create's pending entry
//! until the meta server has made its objects (or taken objects made ahead, see `pool`), then
//! committed or aborted; and the orphans, files removed from the namespace whose objects the
//! meta server has still to remove. See the module docs of `meta` for the protocol.

use super::{
    Created, INODES, Inode, K_FILES, MetaError, MetaStore, ORPHANS, Objects, Perm, Placement, State, Tx,
    get_inode, new_attr, new_entry_dir, owned_perm, validate_name,
};
use crate::layout::Layout;
use crate::proto::{Cred, FileKind, Handle, LayoutSpec, Timestamp};
use redb::ReadableTable;
use tracing::{debug, warn};

impl MetaStore {
    /// Creates a regular file as a *pending* entry: see the module docs for the
    /// commit/abort protocol. The layout is `spec`, then the parent's default, then the
    /// filesystem defaults, field by field.
    pub fn create(
        &self,
        cred: &Cred,
        parent: Handle,
        name: &str,
        perm: Perm,
        spec: Option<LayoutSpec>,
    ) -> Result<Created, MetaError> {
        self.create_placed(cred, parent, name, perm, spec, Placement::default())
    }

    /// As [`MetaStore::create`], placed by `place`: a layout whose base is not given avoids the
    /// servers to avoid while the stripe count leaves a choice, and with a precreated handle it
    /// can take, the file is committed at once.
    pub fn create_placed(
        &self,
        cred: &Cred,
        parent: Handle,
        name: &str,
        perm: Perm,
        spec: Option<LayoutSpec>,
        place: Placement<'_>,
    ) -> Result<Created, MetaError> {
        validate_name(name)?;
        let out = self.write(|tx| {
            let dir = new_entry_dir(tx, cred, parent.0, name)?;
            let merged = spec.unwrap_or_default().or(dir.default.unwrap_or_default());
            let layout = self.resolve_layout(tx, merged, place.avoid)?;
            let now = Timestamp::now();
            let attr = new_attr(FileKind::File, owned_perm(&dir, FileKind::File, perm, cred), now);
            // A precreated handle has an object on every server, so only a layout over all of
            // them can use it; a narrower one would leave objects no file owns.
            let taken = match place.precreated {
                Some(h) if layout.pcount == self.cfg.n_servers => tx.precreated.remove(h.0)?.is_some(),
                _ => false,
            };
            if place.made_ahead_only && !taken {
                return Err(MetaError::NeedsObjects);
            }
            let mut ino = Inode {
                attr: attr.clone(),
                parent: parent.0,
                layout: Some(layout),
                default: None,
                state: State::Pending,
            };
            let h = match place.precreated {
                Some(h) if taken => {
                    ino.state = State::Committed;
                    tx.add_entry_as(h.0, name, &ino)?;
                    tx.bump(K_FILES, 1)?;
                    tx.touch_dir(parent.0, now)?;
                    h.0
                }
                _ => tx.add_entry(name, &ino)?,
            };
            Ok(Created { handle: Handle(h), attr, layout, committed: taken })
        })?;
        debug!(handle = %out.handle, ?out.layout, committed = out.committed, "create");
        Ok(out)
    }

    /// Makes a pending create visible (its objects exist on every io server).
    pub fn commit_create(&self, h: Handle) -> Result<(), MetaError> {
        self.write(|tx| {
            let mut i = get_inode(&tx.inodes, h.0)?.ok_or(MetaError::NotFound)?;
            if i.state == State::Committed {
                return Ok(());
            }
            i.state = State::Committed;
            tx.put_inode(h.0, &i)?;
            tx.bump(K_FILES, 1)?;
            tx.touch_dir(i.parent, i.attr.ctime)
        })
    }

    /// Undoes a pending create: removes the entry and the record. Returns its layout (the
    /// caller removes whatever objects it created). Refuses committed files.
    pub fn abort_create(&self, h: Handle) -> Result<Layout, MetaError> {
        self.write(|tx| {
            let i = get_inode(&tx.inodes, h.0)?.ok_or(MetaError::NotFound)?;
            if i.state != State::Pending {
                return Err(MetaError::Invalid("not a pending create"));
            }
            remove_entry_of(tx, h.0, i.parent)?;
            tx.inodes.remove(h.0)?;
            i.layout.ok_or(MetaError::Corrupt(h.0))
        })
        .inspect(|_| warn!(handle = %h, "create aborted"))
    }

    /// Creates left pending by a crash: clean each up (remove objects, [`abort_create`]).
    ///
    /// [`abort_create`]: MetaStore::abort_create
    pub fn pending_creates(&self) -> Result<Vec<Objects>, MetaError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(INODES)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            let i: Inode = postcard::from_bytes(v.value()).map_err(|_| MetaError::Corrupt(k.value()))?;
            if let (State::Pending, Some(layout)) = (i.state, i.layout) {
                out.push(Objects { handle: Handle(k.value()), layout });
            }
        }
        Ok(out)
    }

    /// Files removed from the namespace whose objects may still exist on the io servers.
    pub fn orphans(&self) -> Result<Vec<Objects>, MetaError> {
        self.orphans_after(None, usize::MAX)
    }

    /// At most `max` of [`MetaStore::orphans`], in handle order, after handle `after`: a page,
    /// so a long backlog is never all in memory.
    pub fn orphans_after(&self, after: Option<Handle>, max: usize) -> Result<Vec<Objects>, MetaError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(ORPHANS)?;
        let mut out = Vec::new();
        let rows = match after {
            Some(h) if h.0 == u64::MAX => return Ok(Vec::new()),
            Some(h) => t.range((h.0 + 1)..)?,
            None => t.range(0..)?,
        };
        for row in rows.take(max) {
            let (k, v) = row?;
            let layout = postcard::from_bytes(v.value()).map_err(|_| MetaError::Corrupt(k.value()))?;
            out.push(Objects { handle: Handle(k.value()), layout });
        }
        Ok(out)
    }

    /// Forgets an orphan once its objects are gone from every io server.
    pub fn forget_orphan(&self, h: Handle) -> Result<(), MetaError> {
        // Not synced: after a crash that loses it, the janitor finds the orphan again, and its
        // objects already gone (removing them again finds nothing), and forgets it then.
        self.write_with(redb::Durability::None, |tx| {
            tx.orphans.remove(h.0)?;
            Ok(())
        })
    }
}

/// Removes the directory entry naming `h` in `parent` (used to abort a create).
fn remove_entry_of(tx: &mut Tx<'_>, h: u64, parent: u64) -> Result<(), MetaError> {
    let mut name = None;
    for row in tx.dirents.range((parent, "")..(parent + 1, ""))? {
        let (k, v) = row?;
        if v.value() == h {
            name = Some(k.value().1.to_owned());
            break;
        }
    }
    match name {
        Some(n) => {
            tx.dirents.remove((parent, n.as_str()))?;
            Ok(())
        }
        None => Err(MetaError::Corrupt(h)),
    }
}

//! Files' sizes: asked of their io servers with capabilities kept from the files' last opens,
//! and a listing's, many files at once.
//!
//! A file's size is the io servers' to tell, and asking them takes a capability, which the
//! meta server grants. Without one at hand a `stat` is three round trips in a row: the
//! attributes, a capability, the sizes. With one kept from the file's last open (a `tar` or
//! `cp -p` sets times, owner and mode on a file it has just created), the attributes and the
//! sizes are asked at once. A listing (`ls -l`) asks the meta server for a page of entries'
//! attributes and capabilities in one request, and each io server for all their sizes in one.
//!
//! A kept capability is only ever used to ask a size, which any capability for the file allows
//! (sizes are attributes, shown to whoever may stat the file), so keeping them per client
//! rather than per caller gives no caller more than it could get. Handles are never reused and
//! a file's layout never changes, so what is kept cannot describe another file; a capability
//! close to its expiry is not used, and one the io servers refuse is dropped.

use super::{Client, IoPosted, KeptSize, SizeUnknown, Stat};
use crate::capability::{Capability, unix_now};
use crate::handle::Handle;
use crate::layout::Layout;
use crate::lock;
use crate::net::{FsError, FsResult};
use crate::proto::{
    self, Attr, AttrOf, FileKind, IoReply, IoRequest, MetaReply, MetaRequest, ObjectSize, SetAttr,
};
use std::collections::{HashMap, VecDeque};
use tracing::debug;

/// Files kept at most, so that a client that opens many files holds a bounded record.
pub(super) const KEPT: usize = 4096;

/// Seconds before its expiry from which a capability is no longer used: a request sent with
/// it could arrive after it.
const EXPIRY_MARGIN_S: u64 = 30;

/// A file's logical size and the disk space its objects hold, from its objects' sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileSpace {
    size: u64,
    allocated: u64,
}

impl FileSpace {
    /// From the sizes of `layout`'s objects, by `pnum`.
    pub(super) fn of(layout: &Layout, objects: &[ObjectSize]) -> Self {
        let sizes: Vec<u64> = objects.iter().map(|o| o.size).collect();
        let allocated = objects.iter().fold(0u64, |a, o| a.saturating_add(o.allocated));
        FileSpace { size: layout.logical_size(&sizes), allocated }
    }

    /// The logical size.
    pub(super) fn size(self) -> u64 {
        self.size
    }

    /// `stat` (of the file) with this size and space.
    pub(super) fn stat(self, stat: Stat) -> Stat {
        Stat { attr: Attr { size: self.size, ..stat.attr }, allocated: self.allocated, ..stat }
    }
}

#[derive(Debug, Default)]
pub(super) struct SizeCaps {
    by_handle: HashMap<Handle, Kept>,
    /// Handles in the order they were first kept, with the tick they were kept at: the oldest
    /// goes first when the record is full. An entry whose tick no longer matches was dropped.
    order: VecDeque<(Handle, u64)>,
    tick: u64,
}

#[derive(Debug)]
struct Kept {
    layout: Layout,
    cap: Capability,
    tick: u64,
}

impl SizeCaps {
    /// Keeps `cap` (for `layout`'s file), replacing what was kept for the file.
    pub(super) fn keep(&mut self, layout: Layout, cap: &Capability) {
        let h = cap.handle;
        if let Some(k) = self.by_handle.get_mut(&h) {
            k.layout = layout;
            k.cap = cap.clone();
            return;
        }
        self.tick += 1;
        self.by_handle.insert(h, Kept { layout, cap: cap.clone(), tick: self.tick });
        self.order.push_back((h, self.tick));
        while self.order.len() > KEPT {
            if let Some((old, tick)) = self.order.pop_front()
                && self.by_handle.get(&old).is_some_and(|k| k.tick == tick)
            {
                self.by_handle.remove(&old);
            }
        }
    }

    /// `h`'s layout and a capability to ask its sizes with, if one is kept and not about to
    /// expire.
    pub(super) fn get(&self, h: Handle) -> Option<(Layout, Capability)> {
        let k = self.by_handle.get(&h)?;
        (unix_now().saturating_add(EXPIRY_MARGIN_S) < k.cap.expiry).then(|| (k.layout, k.cap.clone()))
    }

    /// Drops what is kept for `h` (its capability was refused, or the file is gone).
    pub(super) fn forget(&mut self, h: Handle) {
        self.by_handle.remove(&h);
    }

    /// Files kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_handle.len()
    }
}

impl Client {
    /// The stats of `handles` (a listing's entries), in their order, as
    /// [`Client::stat_entry`] gives each: the meta server is asked for the attributes of up to
    /// [`proto::MAX_BATCH`] at once, and each io server for the sizes of those files in one
    /// request. A file whose size a server did not tell is stat'ed on its own, for the error.
    pub fn stat_many(&self, handles: &[Handle]) -> Vec<FsResult<Result<Stat, SizeUnknown>>> {
        handles.chunks(proto::MAX_BATCH).flat_map(|batch| self.stat_batch(batch)).collect()
    }

    fn stat_batch(&self, handles: &[Handle]) -> Vec<FsResult<Result<Stat, SizeUnknown>>> {
        let attrs = proto::BoundedVec::new(handles.to_vec())
            .map_err(FsError::from)
            .and_then(|handles| self.meta_call(MetaRequest::GetattrMany { handles }))
            .and_then(|r| match r {
                MetaReply::Attrs(a) if a.len() == handles.len() => Ok(a.into_inner()),
                r => Self::unexpected(r),
            });
        let attrs = match attrs {
            Ok(a) => a,
            // The batch as a whole failed: each entry on its own, for its own outcome.
            Err(_) => return handles.iter().map(|&h| self.stat_entry(h)).collect(),
        };
        // Each file's place in each of its servers' requests.
        let servers = self.io_servers();
        let mut asks: Vec<Vec<Capability>> = vec![Vec::new(); servers as usize];
        let mut places: Vec<Vec<(usize, usize)>> = vec![Vec::new(); handles.len()];
        for (i, (a, &h)) in attrs.iter().zip(handles).enumerate() {
            if let AttrOf::Found { file: Some((layout, cap)), .. } = a
                && cap.handle == h
                && layout.validate(servers).is_ok()
            {
                lock(&self.inner.size_caps).keep(*layout, cap);
                for p in 0..layout.pcount {
                    let s = layout.server(p, servers) as usize;
                    places[i].push((s, asks[s].len()));
                    asks[s].push(cap.clone());
                }
            }
        }
        // (A server is in a file's layout once, so it never gets more than a batch.)
        let reqs: Vec<(usize, IoRequest)> = asks
            .into_iter()
            .enumerate()
            .filter(|(_, caps)| !caps.is_empty())
            .filter_map(|(s, caps)| {
                Some((s, IoRequest::GetSizes { caps: proto::BoundedVec::new(caps).ok()? }))
            })
            .collect();
        let asked: Vec<usize> = reqs.iter().map(|&(s, _)| s).collect();
        let mut told: Vec<Option<Vec<Option<ObjectSize>>>> = vec![None; servers as usize];
        for (&s, r) in asked.iter().zip(self.io_wait(self.io_post(reqs))) {
            if let Ok(IoReply::Sizes(sizes)) = r {
                told[s] = Some(sizes.into_inner());
            }
        }
        attrs
            .into_iter()
            .zip(handles)
            .zip(places)
            .map(|((a, &h), places)| match a {
                AttrOf::Failed(code) => {
                    Err(FsError::code(code, "the meta server could not give its attributes"))
                }
                AttrOf::Found { attr, file: None } if attr.kind != FileKind::File => {
                    Ok(Ok(Stat { handle: h, attr, layout: None, allocated: 0 }))
                }
                AttrOf::Found { attr, file: Some((layout, _)) } if !places.is_empty() => {
                    let sizes: Option<Vec<ObjectSize>> = places
                        .iter()
                        .map(|&(s, at)| told[s].as_ref().and_then(|t| t.get(at).copied().flatten()))
                        .collect();
                    match sizes {
                        Some(sizes) => Ok(Ok(FileSpace::of(&layout, &sizes).stat(Stat {
                            handle: h,
                            attr,
                            layout: Some(layout),
                            allocated: 0,
                        }))),
                        None => self.stat_entry(h),
                    }
                }
                AttrOf::Found { .. } => self.stat_entry(h),
            })
            .collect()
    }

    /// `req` (about file `h`, and leaving its size alone) to the meta server and, with a
    /// capability kept for `h`, the sizes of `h`'s objects from its io servers at the same
    /// time. The reply, and `h`'s layout and logical size (or why a server could not tell its
    /// size); a capability a server refused is no longer kept, and gives no size.
    pub(super) fn meta_call_sized(&self, h: Handle, req: MetaRequest) -> FsResult<(MetaReply, KeptSize)> {
        let asked = self.ask_sizes(h);
        let reply = self.meta_call(req);
        // Every posted request is waited for, whatever the meta server said.
        let sized = self.take_sizes(h, asked);
        Ok((reply?, sized))
    }

    /// With a capability kept for file `h`, asks its io servers for their sizes (for
    /// [`Client::take_sizes`]).
    fn ask_sizes(&self, h: Handle) -> Option<(Layout, IoPosted)> {
        let (layout, cap) = lock(&self.inner.size_caps).get(h)?;
        let servers = self.io_servers();
        let reqs = (0..layout.pcount)
            .map(|p| (layout.server(p, servers) as usize, IoRequest::GetSize { cap: cap.clone() }))
            .collect();
        Some((layout, self.io_post(reqs)))
    }

    /// The logical size from the sizes [`Client::ask_sizes`] asked for (see [`KeptSize`]).
    fn take_sizes(&self, h: Handle, asked: Option<(Layout, IoPosted)>) -> KeptSize {
        let (layout, posted) = asked?;
        let sizes: FsResult<Vec<ObjectSize>> = self
            .io_wait(posted)
            .into_iter()
            .map(|r| match r? {
                IoReply::Size(s) => Ok(s),
                r => Err(FsError::UnexpectedReply(format!("{r:?}"))),
            })
            .collect();
        match sizes {
            Ok(sizes) => Some((layout, Ok(FileSpace::of(&layout, &sizes)))),
            Err(e @ FsError::Remote { .. }) => {
                // Refused (an expired capability, a file gone): the meta server knows more.
                debug!(handle = %h, error = %e, "a kept capability did not give the sizes");
                lock(&self.inner.size_caps).forget(h);
                None
            }
            // A server down or not answering: as it would be with a fresh capability.
            Err(e) => Some((layout, Err(e))),
        }
    }

    /// The stat of `h`, whose attributes the meta server has just given as `attr` (in a
    /// lookup's reply): only a file's size is asked for. As [`Client::stat_entry`], the inner
    /// `Err` says why the size could not be learnt, with what the meta server knows.
    pub fn stat_with(&self, h: Handle, attr: Attr) -> FsResult<Result<Stat, SizeUnknown>> {
        if attr.kind != FileKind::File {
            return Ok(Ok(Stat { handle: h, attr, layout: None, allocated: 0 }));
        }
        let sized = self.take_sizes(h, self.ask_sizes(h));
        self.stat_of(h, attr, sized)
    }

    /// [`Client::setattr`], answered with what [`Client::stat_handle`] would give after it
    /// (a file's logical size): with a capability kept for the file, the sizes are asked at
    /// the same time as the change.
    #[cfg_attr(not(feature = "fuse"), expect(dead_code, reason = "the mount's attribute changes"))]
    pub(crate) fn setattr_stat(&self, h: Handle, set: SetAttr) -> FsResult<Stat> {
        if set.size.is_some() {
            // The sizes change with it.
            self.setattr(h, set)?;
            return self.stat_handle(h);
        }
        let (attr, sized) = self.meta_call_sized(h, MetaRequest::Setattr { handle: h, set })?;
        let attr = match attr {
            MetaReply::Attr(a) => a,
            r => return Self::unexpected(r),
        };
        self.stat_of(h, attr, sized)?.map_err(|u| u.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::Rights;

    fn cap(h: u64, expiry: u64) -> Capability {
        Capability { handle: Handle(h), rights: Rights::NONE, expiry, nonce: h, mac: [0; 32] }
    }

    const LAYOUT: Layout = Layout { base: 0, pcount: 4, ssize: 65536 };

    #[test]
    fn the_record_holds_at_most_kept_files_dropping_the_oldest() {
        let mut s = SizeCaps::default();
        let later = unix_now() + 3600;
        for h in 0..(KEPT as u64 + 100) {
            s.keep(LAYOUT, &cap(h, later));
        }
        assert_eq!(s.len(), KEPT);
        assert!(s.order.len() <= KEPT);
        assert!(s.get(Handle(0)).is_none(), "the oldest went first");
        assert!(s.get(Handle(KEPT as u64 + 99)).is_some());
    }

    #[test]
    fn forgotten_and_kept_again_a_file_is_not_dropped_by_its_old_place() {
        let mut s = SizeCaps::default();
        let later = unix_now() + 3600;
        s.keep(LAYOUT, &cap(7, later));
        s.forget(Handle(7));
        assert!(s.get(Handle(7)).is_none());
        s.keep(LAYOUT, &cap(7, later));
        for h in 100..(100 + KEPT as u64 - 1) {
            s.keep(LAYOUT, &cap(h, later));
        }
        // The first place of handle 7 left the line; its second place has not.
        assert!(s.get(Handle(7)).is_some());
        assert!(s.order.len() <= KEPT);
    }

    #[test]
    fn a_capability_about_to_expire_is_not_used() {
        let mut s = SizeCaps::default();
        s.keep(LAYOUT, &cap(1, unix_now() + 5));
        assert!(s.get(Handle(1)).is_none());
        s.keep(LAYOUT, &cap(1, unix_now() + 3600));
        assert!(s.get(Handle(1)).is_some(), "a fresh capability replaces it");
    }
}

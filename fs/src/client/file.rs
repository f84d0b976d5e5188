//! An open file: reads and writes straight to the io servers (contiguous, list I/O, views),
//! its capability renewed as it expires, syncs, truncation and space allocation.

use super::*;

/// An open file: handle, layout, capability, and an optional view.
///
/// Data goes straight to the io servers, which keep no times; the file's modification time is
/// the meta server's. A `File` that wrote records the time on the meta server at its next
/// [`File::sync`] or [`File::record_mtime`] (the FUSE mount calls it when a written file is
/// closed, as NFS clients do), so `stat` shows the write without a meta server round trip per
/// write.
#[derive(Debug)]
pub struct File {
    pub(super) client: Client,
    pub(super) handle: Handle,
    pub(super) attr: Attr,
    pub(super) layout: Layout,
    pub(super) rights: Rights,
    pub(super) cap: Mutex<Capability>,
    pub(super) view: Mutex<Option<View>>,
    /// Written since the modification time was last recorded.
    pub(super) written: AtomicBool,
}

impl File {
    /// The file's handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Attributes at open time.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }

    /// The client this file belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn cap(&self) -> Capability {
        self.cap.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Gets a fresh capability from the meta server (after one expired).
    fn reopen(&self) -> FsResult<()> {
        let f = self.client.open_handle(self.handle, self.rights)?;
        *self.cap.lock().unwrap_or_else(|p| p.into_inner()) = f.cap();
        Ok(())
    }

    /// Runs `f`, and once more with a fresh capability if the first failed on an expired one.
    fn with_cap<T>(&self, mut f: impl FnMut(Capability) -> FsResult<T>) -> FsResult<T> {
        match f(self.cap()) {
            Err(FsError::Remote { code: Errno::EKEYEXPIRED, .. }) => {
                debug!(handle = %self.handle, "capability expired; reopening");
                self.reopen()?;
                f(self.cap())
            }
            r => r,
        }
    }

    fn server(&self, pnum: u32) -> usize {
        self.layout.server(pnum, self.client.io_servers()) as usize
    }

    /// Local sizes and space of every server of the layout, by `pnum`.
    fn local_sizes(&self) -> FsResult<Vec<ObjectSize>> {
        self.with_cap(|cap| {
            let reqs = (0..self.layout.pcount)
                .map(|p| (self.server(p), IoRequest::GetSize { cap: cap.clone() }))
                .collect();
            self.client
                .io_small(reqs)
                .into_iter()
                .map(|r| match r? {
                    IoReply::Size(s) => Ok(s),
                    r => Err(FsError::UnexpectedReply(format!("{r:?}"))),
                })
                .collect()
        })
    }

    /// The logical size: the max over servers of the end implied by each local size.
    pub fn size(&self) -> FsResult<u64> {
        Ok(self.space()?.size())
    }

    /// The first byte at or after `off` that holds data (`lseek`'s `SEEK_DATA`): `None` where
    /// only holes follow, or `off` is at or past the end. Holes are what the io servers' file
    /// systems report (blocks never written, and the parts of a stripe past its object's end).
    pub fn next_data(&self, off: u64) -> FsResult<Option<u64>> {
        self.seek(off, false)
    }

    /// The first byte at or after `off` in a hole (`lseek`'s `SEEK_HOLE`): the end of the file
    /// where data goes on to it, `None` where `off` is at or past the end.
    pub fn next_hole(&self, off: u64) -> FsResult<Option<u64>> {
        self.seek(off, true)
    }

    /// Asks each server from its first byte at or after `off`; the nearest answer, in logical
    /// offsets, is the file's, as every logical byte is one server's. The servers' sizes in
    /// the same replies give the end, which bounds it.
    fn seek(&self, off: u64, hole: bool) -> FsResult<Option<u64>> {
        if i64::try_from(off).is_err() {
            return Ok(None); // Past any end.
        }
        let found = self.with_cap(|cap| {
            let reqs = (0..self.layout.pcount)
                .map(|p| {
                    let off = self.layout.local_size(p, off);
                    (self.server(p), IoRequest::Seek { cap: cap.clone(), off, hole })
                })
                .collect();
            self.client
                .io_small(reqs)
                .into_iter()
                .map(|r| match r? {
                    IoReply::Seek { at, local_size } => Ok((at, local_size)),
                    r => Err(FsError::UnexpectedReply(format!("{r:?}"))),
                })
                .collect::<FsResult<Vec<_>>>()
        })?;
        let sizes: Vec<u64> = found.iter().map(|&(_, size)| size).collect();
        let size = self.layout.logical_size(&sizes);
        if off >= size {
            return Ok(None);
        }
        let nearest = (0..self.layout.pcount)
            .zip(&found)
            .filter_map(|(p, &(at, _))| at.and_then(|at| self.layout.logical_offset(p, at)))
            // A server's answer before where it was asked from is not one.
            .filter(|&at| at >= off)
            .min();
        Ok(match hole {
            true => Some(nearest.unwrap_or(size).min(size)),
            false => nearest.filter(|&at| at < size),
        })
    }

    /// The logical size and the disk space the file's objects hold.
    pub(super) fn space(&self) -> FsResult<FileSpace> {
        Ok(FileSpace::of(&self.layout, &self.local_sizes()?))
    }

    /// Makes everything written so far durable on every server (fsync), records the writes'
    /// modification time ([`File::record_mtime`]), and makes the file's attributes durable
    /// at the meta server, whoever changed them.
    pub fn sync(&self) -> FsResult<()> {
        self.sync_pnums(&(0..self.layout.pcount).collect::<Vec<_>>())?;
        // The file's times, whoever changed them last, are durable with the record (or the
        // flush) at the meta server.
        if !self.record_mtime_with(true)? {
            self.client.sync_metadata()?;
        }
        Ok(())
    }

    /// Makes everything written so far, and the file's attributes, durable like
    /// [`File::sync`], but records no time: for a caller that keeps the modification time
    /// itself (the FUSE mount's kernel-cached mode, whose kernel sends its own times and must
    /// not have them overwritten).
    pub fn sync_data(&self) -> FsResult<()> {
        self.sync_pnums(&(0..self.layout.pcount).collect::<Vec<_>>())?;
        self.client.sync_metadata()
    }

    /// Makes the bytes written to `[off, off + len)` durable: syncs the servers holding them
    /// and no others (what an `O_DSYNC` write through the FUSE mount needs). Records no time.
    pub fn sync_range(&self, off: u64, len: u64) -> FsResult<()> {
        let end = off.saturating_add(len);
        let mut pnums = Vec::new();
        let mut at = off;
        // Consecutive stripe units cycle through the servers, so this takes at most `pcount`
        // steps.
        while at < end && pnums.len() < self.layout.pcount as usize {
            let m = self.layout.map(at);
            if !pnums.contains(&m.pnum) {
                pnums.push(m.pnum);
            }
            at = at.saturating_add(m.run_len);
        }
        self.sync_pnums(&pnums)
    }

    /// fsync of this file's object on the servers of relative numbers `pnums`, all at once.
    fn sync_pnums(&self, pnums: &[u32]) -> FsResult<()> {
        self.with_cap(|cap| {
            let reqs =
                pnums.iter().map(|&p| (self.server(p), IoRequest::Sync { cap: cap.clone() })).collect();
            self.client.io_small(reqs).into_iter().try_for_each(|r| r.map(|_| ()))
        })
    }

    /// If this `File` wrote since the last call, sets the file's modification (and change)
    /// time on the meta server to now; otherwise does nothing. As any change of times,
    /// the record is durable with the meta server's next flush (within about a second) or
    /// this file's [`File::sync`], as a local file system's times are once its journal commits
    /// (a set-id bit the write clears is durable at once).
    pub fn record_mtime(&self) -> FsResult<()> {
        self.record_mtime_with(false).map(|_| ())
    }

    /// Forgets the write time this `File` would record, for a time set since, which supersedes
    /// it as on a local file system; whether there was one (give it back with
    /// [`File::keep_write_time`] if setting the time fails).
    #[cfg(feature = "fuse")]
    pub(crate) fn forget_write_time(&self) -> bool {
        self.written.swap(false, Ordering::AcqRel)
    }

    /// Records the write time at the next [`File::record_mtime`] or sync after all.
    #[cfg(feature = "fuse")]
    pub(crate) fn keep_write_time(&self) {
        self.written.store(true, Ordering::Release);
    }

    /// Records the write's time if this `File` wrote (durably with everything before it if
    /// `sync`); whether it did.
    fn record_mtime_with(&self, sync: bool) -> FsResult<bool> {
        if !self.written.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        let set = SetAttr {
            mtime: Some(SetTime::Now),
            wrote: true,
            opened_for_write: true,
            sync,
            ..Default::default()
        };
        match self.client.setattr(self.handle, set) {
            Ok(_) => Ok(true),
            Err(e) => {
                // Still unrecorded: the next call tries again.
                self.written.store(true, Ordering::Release);
                Err(e)
            }
        }
    }

    /// `posix_fallocate`: reserves disk space for the bytes `[off, off + len)` on the io
    /// servers holding them and makes the file at least `off + len` bytes long (never
    /// shorter, so a concurrent writer past that end keeps its data); sets the modification
    /// and change times. Writes into the range then find their space; a file system that
    /// cannot reserve answers `EOPNOTSUPP`.
    pub fn allocate(&self, off: u64, len: u64) -> FsResult<()> {
        self.on_range(off, len, |cap, off, len| IoRequest::Allocate { cap, off, len })
    }

    /// Frees the disk space of the bytes `[off, off + len)`, which then read as zeros, keeping
    /// the size (`fallocate` with `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`); sets the
    /// modification and change times. A file system that cannot punch answers `EOPNOTSUPP`.
    pub fn punch_hole(&self, off: u64, len: u64) -> FsResult<()> {
        self.on_range(off, len, |cap, off, len| IoRequest::Punch { cap, off, len })
    }

    /// Sends each io server the request `make` makes for its local part of the bytes
    /// `[off, off + len)` (an allocation, a hole), then sets the modification time.
    fn on_range(&self, off: u64, len: u64, make: impl Fn(Capability, u64, u64) -> IoRequest) -> FsResult<()> {
        self.check(Rights::WRITE)?;
        if len == 0 || off.checked_add(len).is_none() {
            return Err(FsError::code(Errno::EINVAL, "empty or overflowing range"));
        }
        let end = off + len;
        self.with_cap(|cap| {
            // A contiguous logical range is one contiguous local range on each server.
            let reqs = (0..self.layout.pcount)
                .filter_map(|p| {
                    let (lo, hi) = (self.layout.local_size(p, off), self.layout.local_size(p, end));
                    (hi > lo).then(|| (self.server(p), make(cap.clone(), lo, hi - lo)))
                })
                .collect();
            self.client.io_small(reqs).into_iter().try_for_each(|r| r.map(|_| ()))
        })?;
        let set = SetAttr { mtime: Some(SetTime::Now), opened_for_write: true, ..Default::default() };
        self.client.setattr(self.handle, set).map(|_| ())
    }

    /// Truncates (or extends with a hole) to `size` bytes. Opened for writing, this needs no
    /// permission beyond the open's (`ftruncate`: the mode may have changed since).
    pub fn truncate(&self, size: u64) -> FsResult<()> {
        let opened_for_write = self.rights.contains(Rights::WRITE);
        self.client
            .setattr(self.handle, SetAttr { size: Some(size), opened_for_write, ..Default::default() })
            .map(|_| ())
    }

    /// Sets a partitioned view (PVFS1 `SETPART`): the file appears as the concatenation of
    /// `gsize`-byte blocks every `stride` bytes from `offset`; [`File::read_view`] and
    /// [`File::write_view`] address that concatenation.
    pub fn set_view(&self, offset: u64, gsize: u64, stride: u64) -> FsResult<()> {
        let v = View::new(offset, gsize, stride)?;
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        Ok(())
    }

    /// Drops the view: view positions are file offsets again.
    pub fn clear_view(&self) {
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn current_view(&self) -> View {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or(View::contiguous())
    }

    /// The requests for `plan`: one per server unless its share is over `max_req` bytes or
    /// [`proto::MAX_PIECES`] pieces.
    fn batches(
        &self,
        plan: Vec<ServerPieces>,
        strided: Option<(View, u64, u64)>,
        max_req: u64,
    ) -> FsResult<Vec<Batch>> {
        let mut out = Vec::new();
        for sp in plan {
            let server = self.server(sp.pnum);
            // A view request that fits in one message goes as the O(1) strided descriptor.
            if let Some((view, pos, len)) = strided
                && sp.bytes <= max_req
                && view.blocks_spanned(pos, len) <= proto::MAX_VIEW_BLOCKS
            {
                let desc = Descriptor::Strided { layout: self.layout, pnum: sp.pnum, view, pos, len };
                out.push(Batch { pnum: sp.pnum, server, desc, segments: sp.segments, bytes: sp.bytes });
                continue;
            }
            let parts = if sp.pieces.len() <= proto::MAX_PIECES && sp.bytes <= max_req {
                vec![sp]
            } else {
                sp.split(proto::MAX_PIECES, max_req)
            };
            for b in parts {
                out.push(Batch {
                    pnum: b.pnum,
                    server,
                    desc: Descriptor::list(b.pieces)?,
                    segments: b.segments,
                    bytes: b.bytes,
                });
            }
        }
        Ok(out)
    }

    /// Writes every batch's segments of `data`, all servers at once.
    fn write_batches(&self, batches: &[Batch], data: &Bytes) -> FsResult<u64> {
        // Before anything is sent: a write that fails part way may still have changed bytes.
        self.written.store(true, Ordering::Release);
        self.with_cap(|cap| {
            let c = &self.client;
            let mut spans = Vec::with_capacity(batches.len());
            let posted: Vec<FsResult<(OpId, u64, Instant)>> = batches
                .iter()
                .map(|b| {
                    let id = c.id();
                    let req = IoRequest::Write { cap: cap.clone(), desc: b.desc.clone() };
                    spans.push(c.io_span(b.server, id, &req));
                    let sent = c.admit(Target::Io(b.server))?;
                    let peer =
                        *c.inner.io.get(b.server).ok_or_else(|| FsError::Invalid("server index".into()))?;
                    let header = proto::encode(&Envelope::new(id, req))?;
                    let list: Vec<Bytes> = b
                        .segments
                        .iter()
                        .map(|s| data.slice(s.off as usize..(s.off + s.len) as usize))
                        .collect();
                    let op = c
                        .post(
                            peer,
                            TAG_IO,
                            header,
                            Payload::Out(SendBuf::List(list)),
                            ServiceLevel::Bulk,
                            b.bytes,
                        )
                        .map_err(c.at_io(b.server))?;
                    Ok((op, id, sent))
                })
                .collect();
            let mut first_err = None;
            let mut total = 0u64;
            for ((b, p), traced) in batches.iter().zip(posted).zip(&spans) {
                let want = b.bytes;
                let r = p.and_then(|(op, id, sent)| {
                    let r = c.wait_io(op).and_then(|comp| Client::reply::<IoReply>(&comp, id));
                    c.finish(Target::Io(b.server), sent, r.as_ref().err());
                    match r.map_err(c.at_io(b.server))? {
                        IoReply::Written { bytes } if bytes == want => Ok(bytes),
                        r => Err(FsError::UnexpectedReply(format!("{r:?} for a {want}-byte write"))),
                    }
                });
                traced.done(super::Outcome(&r));
                match r {
                    Ok(n) => total += n,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            match first_err {
                Some(e) => Err(e),
                None => Ok(total),
            }
        })
    }

    /// Reads every batch's stream into its segments of `buf`, all servers at once. Returns the
    /// buffer (rejoined) and each batch's server-local size.
    fn read_batches(&self, batches: &[Batch], buf: BytesMut) -> FsResult<(BytesMut, Vec<(usize, u64)>)> {
        let mut buf = Some(buf);
        let r = self.with_cap(|cap| {
            let b = buf
                .take()
                .ok_or_else(|| FsError::Invalid("read buffer lost after a failed attempt".into()))?;
            let (back, r) = self.read_once(batches, b, &cap);
            buf = back;
            r
        });
        match r {
            Ok(sizes) => Ok((buf.take().unwrap_or_default(), sizes)),
            Err(e) => {
                // The caller's buffer is freed with the error. With `cache_foreign`, the
                // segments that reached live servers left cached registrations: forget them
                // first, as the engine requires before memory is freed.
                if let Some(b) = buf.take() {
                    self.client.inner.ep.invalidate_registrations(&b);
                }
                Err(e)
            }
        }
    }

    fn read_once(
        &self,
        batches: &[Batch],
        buf: BytesMut,
        cap: &Capability,
    ) -> (Option<BytesMut>, FsResult<Vec<(usize, u64)>>) {
        let c = &self.client;
        // Cut the buffer into the segments every batch needs (plus the gaps between them) as
        // disjoint views of the one allocation, to rejoin afterwards without copying.
        let mut split = match Scatter::new(buf, batches) {
            Ok(s) => s,
            Err(e) => return (None, Err(e)),
        };
        let mut posted = Vec::with_capacity(batches.len());
        let mut spans = Vec::with_capacity(batches.len());
        for (i, b) in batches.iter().enumerate() {
            let id = c.id();
            let req = IoRequest::Read { cap: cap.clone(), desc: b.desc.clone() };
            spans.push(c.io_span(b.server, id, &req));
            let r = (|| {
                let sent = c.admit(Target::Io(b.server))?;
                let header = proto::encode(&Envelope::new(id, req))?;
                let peer =
                    *c.inner.io.get(b.server).ok_or_else(|| FsError::Invalid("server index".into()))?;
                let list = split.take(i);
                let op = c
                    .post(peer, TAG_IO, header, Payload::In(RecvBuf::List(list)), ServiceLevel::Bulk, b.bytes)
                    .map_err(c.at_io(b.server))?;
                Ok((op, id, sent))
            })();
            posted.push(r);
        }
        let mut first_err = None;
        let mut sizes = Vec::with_capacity(batches.len());
        for (i, p) in posted.into_iter().enumerate() {
            let server = batches[i].server;
            let r = p.and_then(|(op, id, sent)| {
                let waited = c.wait_io(op);
                if let Err(e) = &waited {
                    c.finish(Target::Io(server), sent, Some(e));
                }
                let mut comp = waited.map_err(c.at_io(server))?;
                let r = Client::reply::<IoReply>(&comp, id);
                c.finish(Target::Io(server), sent, r.as_ref().err());
                // The server says how much of the stream it pushed; the transport, how much
                // arrived. Fewer would leave bytes of the file unread.
                let arrived = comp.len() as u64;
                let r = match r.map_err(c.at_io(server)) {
                    Ok(IoReply::Read { bytes, local_size })
                        if bytes <= batches[i].bytes && bytes <= arrived =>
                    {
                        Ok((bytes, local_size))
                    }
                    Ok(r) => Err(FsError::UnexpectedReply(format!(
                        "{r:?} for a {}-byte read of which {arrived} bytes arrived",
                        batches[i].bytes
                    ))),
                    Err(e) => Err(e),
                };
                if let OpBuf::Recv(RecvBuf::List(mut v)) = std::mem::take(&mut comp.buf) {
                    if let Ok((bytes, _)) = r {
                        // The rest of the stream lies past the server's end of the object;
                        // the buffer may hold an earlier read's bytes there.
                        zero_after(&mut v, bytes);
                    }
                    split.put_back(i, v);
                }
                r.map(|(_, local_size)| local_size)
            });
            spans[i].done(super::Outcome(&r));
            match r {
                Ok(ls) => sizes.push((i, ls)),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let buf = split.join();
        match first_err {
            Some(e) => (buf, Err(e)),
            None => (buf, Ok(sizes)),
        }
    }

    /// Writes `data` at `off`. Zero-copy: the payload is slices of `data`.
    pub fn write_at(&self, off: u64, data: &Bytes) -> FsResult<usize> {
        self.check(Rights::WRITE)?;
        if data.is_empty() {
            return Ok(0);
        }
        off.checked_add(data.len() as u64).ok_or(crate::layout::LayoutError::Overflow)?;
        let batches = self.batches(
            self.layout.plan([Extent::new(off, data.len() as u64)]),
            None,
            self.client.inner.limits.max,
        )?;
        self.write_batches(&batches, data).map(|n| n as usize)
    }

    /// Writes a borrowed slice at `off` (copies it once, into one of the buffers the client
    /// keeps between calls).
    pub fn write_all_at(&self, off: u64, data: &[u8]) -> FsResult<usize> {
        let inner = &self.client.inner;
        let (mut buf, tail) = inner.scratch.take(data.len());
        // See `read_into`: the caller's slice may start anywhere in a page.
        ionet::copy::copy_bytes(&mut buf, data);
        buf.unsplit(tail);
        let whole = buf.freeze();
        let r = self.write_at(off, &whole.slice(..data.len()));
        inner.keep_sent(whole);
        r
    }

    /// Reads `buf.len()` bytes at `off` into `buf` (zero-copy scatter into its memory) and
    /// returns it with the number of bytes before end of file. Holes read as zeros.
    pub fn read_at(&self, off: u64, buf: BytesMut) -> FsResult<(BytesMut, usize)> {
        self.check(Rights::READ)?;
        let len = buf.len() as u64;
        if len == 0 {
            return Ok((buf, 0));
        }
        let end = off.checked_add(len).ok_or(crate::layout::LayoutError::Overflow)?;
        let batches =
            self.batches(self.layout.plan([Extent::new(off, len)]), None, self.client.inner.limits.read)?;
        let (buf, sizes) = self.read_batches(&batches, buf)?;
        // The involved servers' local sizes show whether the range reaches end of file; only
        // when it may not, and some server was left out, does the client ask every server.
        let seen =
            sizes.iter().map(|&(i, ls)| self.layout.logical_end(batches[i].pnum, ls)).max().unwrap_or(0);
        let every_server = (0..self.layout.pcount).all(|p| batches.iter().any(|b| b.pnum == p));
        let size = if seen >= end || every_server { seen } else { self.size()? };
        Ok((buf, size.saturating_sub(off).min(len) as usize))
    }

    /// Reads into a borrowed slice (the data lands in a temporary buffer and is copied once;
    /// the client keeps a few such buffers between calls). Bytes past the returned count (past
    /// the end of the file) are zeroed.
    pub fn read_into(&self, off: u64, dst: &mut [u8]) -> FsResult<usize> {
        let data = self.read_kept(off, dst.len())?;
        let n = data.len();
        // A caller's `Vec` starts 16 bytes into a page and the buffer on one: the slow case
        // of `memcpy` on AMD Zen (see `ionet::copy`).
        ionet::copy::copy_bytes(&mut dst[..n], &data);
        dst[n..].fill(0);
        Ok(n)
    }

    /// Reads `len` bytes at `off` into one of the client's kept buffers: the bytes before end
    /// of file, borrowed until the result is dropped, when the buffer is kept again. A fresh
    /// buffer per read would cost page faults and zeroing each time, and a kept one stays in
    /// the cache between reads of the same size.
    pub(crate) fn read_kept(&self, off: u64, len: usize) -> FsResult<KeptRead<'_>> {
        let inner = &self.client.inner;
        let (buf, tail) = inner.scratch.take(len);
        match self.read_at(off, buf) {
            Ok((buf, n)) => Ok(KeptRead { inner, kept: Some((buf, tail)), n }),
            Err(e) => {
                // The read freed its part of the allocation (forgetting its registrations);
                // the rest goes with this, and may have cached registrations of its own.
                inner.ep.invalidate_registrations(&tail);
                Err(e)
            }
        }
    }

    /// Copies up to `len` bytes of this file at `off` to `dst` at `dst_off`, stopping at this
    /// file's end, and returns how many it copied. The bytes pass through this client in pieces
    /// of a few MiB, a read and a write each, in buffers it keeps. An error after some pieces
    /// were copied ends the copy there (the count says how far it got); one on the first is
    /// returned.
    #[cfg_attr(not(feature = "fuse"), expect(dead_code, reason = "the mount's copy_file_range"))]
    pub(crate) fn copy_range(&self, off: u64, dst: &File, dst_off: u64, len: u64) -> FsResult<u64> {
        const PIECE: u64 = 8 << 20;
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(PIECE) as usize;
            let step = (|| {
                let at = off.checked_add(done).ok_or(crate::layout::LayoutError::Overflow)?;
                let to = dst_off.checked_add(done).ok_or(crate::layout::LayoutError::Overflow)?;
                let data = self.read_kept(at, want)?;
                let n = data.len();
                let (inner, whole) = data.freeze();
                let w = if n > 0 { dst.write_at(to, &whole.slice(..n)) } else { Ok(0) };
                inner.keep_sent(whole);
                w.map(|_| n)
            })();
            match step {
                Ok(n) => {
                    done += n as u64;
                    if n < want {
                        break;
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    /// Writes `data` through the view at view position `pos` (see [`File::set_view`]). Each
    /// server gets one strided descriptor it expands itself.
    pub fn write_view(&self, pos: u64, data: &Bytes) -> FsResult<usize> {
        self.check(Rights::WRITE)?;
        if data.is_empty() {
            return Ok(0);
        }
        let view = self.current_view();
        let len = data.len() as u64;
        let plan = self.layout.plan(view.extents(pos, len)?);
        let batches = self.batches(plan, Some((view, pos, len)), self.client.inner.limits.max)?;
        self.write_batches(&batches, data).map(|n| n as usize)
    }

    /// Reads `buf.len()` bytes through the view at view position `pos`. Holes and bytes past
    /// the end read as zeros.
    pub fn read_view(&self, pos: u64, buf: BytesMut) -> FsResult<BytesMut> {
        self.check(Rights::READ)?;
        if buf.is_empty() {
            return Ok(buf);
        }
        let view = self.current_view();
        let len = buf.len() as u64;
        let plan = self.layout.plan(view.extents(pos, len)?);
        // Whole shares: a share within the limit goes as one O(1) strided descriptor, which
        // splitting would turn into piece lists.
        let batches = self.batches(plan, Some((view, pos, len)), self.client.inner.limits.max)?;
        Ok(self.read_batches(&batches, buf)?.0)
    }

    /// List I/O write: bytes are taken from `data` at the memory list's extents (in order) and
    /// stored at the file list's extents (in order). Every segment is a slice of `data` — the
    /// parent allocation — so one registration covers the whole list.
    pub fn write_list(&self, mem: &[Extent], file: &[Extent], data: &Bytes) -> FsResult<u64> {
        self.check(Rights::WRITE)?;
        let list = ListIo::new(mem.to_vec(), file.to_vec())?;
        if mem.iter().any(|e| e.end().is_none_or(|end| end > data.len() as u64)) {
            return Err(FsError::Invalid("memory list outside the buffer".into()));
        }
        if list.total() == 0 {
            return Ok(0);
        }
        let batches = self.batches(list.plan(&self.layout), None, self.client.inner.limits.max)?;
        self.write_batches(&batches, data)
    }

    /// List I/O read into `buf` at the memory list's extents (which must not overlap).
    pub fn read_list(&self, mem: &[Extent], file: &[Extent], buf: BytesMut) -> FsResult<BytesMut> {
        self.check(Rights::READ)?;
        let list = ListIo::new(mem.to_vec(), file.to_vec())?;
        if mem.iter().any(|e| e.end().is_none_or(|end| end > buf.len() as u64)) {
            return Err(FsError::Invalid("memory list outside the buffer".into()));
        }
        if list.total() == 0 {
            return Ok(buf);
        }
        let batches = self.batches(list.plan(&self.layout), None, self.client.inner.limits.read)?;
        Ok(self.read_batches(&batches, buf)?.0)
    }

    fn check(&self, need: Rights) -> FsResult<()> {
        if self.rights.contains(need) {
            Ok(())
        } else {
            Err(FsError::code(Errno::EBADF, "file not open for this access"))
        }
    }
}

/// Zeroes the segments (in stream order) past their first `filled` bytes.
fn zero_after(segments: &mut [BytesMut], filled: u64) {
    let mut skip = filled;
    for seg in segments {
        let keep = skip.min(seg.len() as u64) as usize;
        seg[keep..].fill(0);
        skip -= keep as u64;
    }
}

/// A read buffer cut into disjoint views: every batch's segments (in its stream order) and the
/// gaps between them, rejoined with `unsplit` (O(1) for adjacent views of one allocation).
struct Scatter {
    /// Pieces in buffer order: `Ok(view)` for gaps, `Err((batch, index))` for a segment.
    order: Vec<Result<BytesMut, (usize, usize)>>,
    /// Each batch's segment views, in stream order (taken while the request is in flight).
    slots: Vec<Vec<Option<BytesMut>>>,
    tail: BytesMut,
}

impl Scatter {
    fn new(mut buf: BytesMut, batches: &[Batch]) -> FsResult<Scatter> {
        let mut all: Vec<(u64, u64, usize, usize)> = Vec::new();
        for (bi, b) in batches.iter().enumerate() {
            for (si, s) in b.segments.iter().enumerate() {
                all.push((s.off, s.len, bi, si));
            }
        }
        all.sort_unstable();
        let mut slots: Vec<Vec<Option<BytesMut>>> =
            batches.iter().map(|b| (0..b.segments.len()).map(|_| None).collect()).collect();
        let mut order = Vec::with_capacity(all.len() * 2);
        let mut pos = 0u64;
        for (off, len, bi, si) in all {
            if off < pos {
                return Err(FsError::Invalid("overlapping read segments".into()));
            }
            let end = off.checked_add(len).filter(|&e| e - pos <= buf.len() as u64);
            if end.is_none() {
                return Err(FsError::Invalid("read segment outside the buffer".into()));
            }
            if off > pos {
                order.push(Ok(buf.split_to((off - pos) as usize)));
            }
            slots[bi][si] = Some(buf.split_to(len as usize));
            order.push(Err((bi, si)));
            pos = off + len;
        }
        Ok(Scatter { order, slots, tail: buf })
    }

    fn take(&mut self, batch: usize) -> Vec<BytesMut> {
        self.slots[batch].iter_mut().map(|s| s.take().unwrap_or_default()).collect()
    }

    fn put_back(&mut self, batch: usize, v: Vec<BytesMut>) {
        for (slot, b) in self.slots[batch].iter_mut().zip(v) {
            *slot = Some(b);
        }
    }

    /// Rejoins the views; `None` if a view never came back (its request failed to post).
    fn join(mut self) -> Option<BytesMut> {
        let mut out: Option<BytesMut> = None;
        for part in self.order {
            let piece = match part {
                Ok(gap) => gap,
                Err((bi, si)) => self.slots[bi][si].take()?,
            };
            match &mut out {
                None => out = Some(piece),
                Some(o) => o.unsplit(piece),
            }
        }
        match &mut out {
            None => Some(self.tail),
            Some(o) => {
                o.unsplit(self.tail);
                out
            }
        }
    }
}

/// The bytes of a [`File::read_kept`], in a buffer the client keeps again once this is dropped.
pub(crate) struct KeptRead<'a> {
    inner: &'a Inner,
    /// The buffer read into and the unused rest of the kept buffer it was cut from; `None`
    /// once [`KeptRead::freeze`] has handed them on.
    kept: Option<(BytesMut, BytesMut)>,
    n: usize,
}

impl<'a> KeptRead<'a> {
    /// The whole kept buffer, the bytes read at its start, to send on: hand it back to
    /// `Inner::keep_sent` after.
    fn freeze(mut self) -> (&'a Inner, Bytes) {
        let (mut buf, tail) = self.kept.take().unwrap_or_default();
        buf.unsplit(tail);
        (self.inner, buf.freeze())
    }
}

impl std::ops::Deref for KeptRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.kept.as_ref().map_or(&[], |(buf, _)| &buf[..self.n])
    }
}

impl Drop for KeptRead<'_> {
    fn drop(&mut self) {
        if let Some((buf, tail)) = self.kept.take() {
            self.inner.keep(buf, tail);
        }
    }
}

//! An object's size as its data lands (sans-IO: the caller passes the call that sets the file's
//! length).
//!
//! A mapped write cannot store past the end of the file (the page would fault with `SIGBUS`), so
//! before its first store past the end it lengthens the file to the write's end, once: growing
//! it a transfer unit at a time made the `fsync` that follows the write markedly slower on
//! ext4. The bytes past what arrived have not landed: if the write fails (the client
//! died, a pull timed out, the disk filled), the file must not keep them. So the ledger keeps two
//! sizes: `len`, the file's length as last set, and `landed`, the end of the data that arrived,
//! which is the size the io server reports. When a write ends, the file is cut back to what the
//! data and the writes still running need.

use std::io;

/// One object's sizes and the mapped writes in flight on it.
#[derive(Debug)]
pub(crate) struct Ledger {
    /// End of the landed data: the size reported to clients. At most `len`.
    landed: u64,
    /// The file's length as last set.
    len: u64,
    /// Mapped writes in flight: (id, end of the space it reserved).
    writes: Vec<(u64, u64)>,
    next_id: u64,
    /// A write failed while others ran, so space it reserved past the end may still be allocated;
    /// freed when the last write ends.
    leaked: bool,
}

impl Ledger {
    /// The ledger of a file `len` bytes long, all of them landed.
    pub(crate) fn new(len: u64) -> Self {
        Ledger { landed: len, len, writes: Vec::new(), next_id: 0, leaked: false }
    }

    /// The size the data justifies.
    pub(crate) fn landed(&self) -> u64 {
        self.landed
    }

    /// A mapped write that reserved space up to `end` begins; its id.
    pub(crate) fn begin(&mut self, end: u64) -> u64 {
        self.next_id += 1;
        self.writes.push((self.next_id, end));
        self.next_id
    }

    /// Makes the file at least `end` long (before data is stored up to `end` through a mapping):
    /// as long as the longest write in flight, so one length change serves a whole write.
    pub(crate) fn extend(&mut self, end: u64, set_len: impl FnOnce(u64) -> io::Result<()>) -> io::Result<()> {
        if end > self.len {
            let to = self.writes.iter().map(|w| w.1).fold(end, u64::max);
            set_len(to)?;
            self.len = to;
        }
        Ok(())
    }

    /// Data up to `end` landed (every byte of the write before `end` is in the file).
    pub(crate) fn land(&mut self, end: u64) {
        debug_assert!(end <= self.len, "landed past the file's end");
        self.landed = self.landed.max(end.min(self.len));
    }

    /// Data was written up to `end` with `pwrite`, which set the length itself.
    pub(crate) fn written(&mut self, end: u64) {
        self.len = self.len.max(end);
        self.landed = self.landed.max(end);
    }

    /// The file is `len` bytes long, all of them data (after a truncate, or read back from the
    /// file after a failed `pwrite`).
    pub(crate) fn reset(&mut self, len: u64) {
        self.len = len;
        self.landed = len;
        self.leaked = false;
    }

    /// Write `id` ended (`failed` if it stopped before all its data landed). Cuts the file back
    /// to what the landed data and the writes still running need. When this was the last write
    /// and a write failed, the length is set even if it does not change: that frees space
    /// reserved past the end (`fallocate` with `FALLOC_FL_KEEP_SIZE`), which a truncate does.
    /// Returns the length set, if any: space past it is no longer allocated.
    pub(crate) fn end(
        &mut self,
        id: u64,
        failed: bool,
        set_len: impl FnOnce(u64) -> io::Result<()>,
    ) -> io::Result<Option<u64>> {
        self.writes.retain(|w| w.0 != id);
        // Space the other writes reserved stays: they store there through the mapping.
        let keep = self.writes.iter().map(|w| w.1).fold(self.landed, u64::max);
        let last = self.writes.is_empty();
        self.leaked |= failed;
        if self.len > keep || (last && self.leaked) {
            let to = self.len.min(keep);
            set_len(to)?;
            self.len = to;
            if last {
                self.leaked = false;
            }
            return Ok(Some(to));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `set_len` that records the lengths set.
    fn rec(calls: &mut Vec<u64>) -> impl FnOnce(u64) -> io::Result<()> + '_ {
        |n| {
            calls.push(n);
            Ok(())
        }
    }

    #[test]
    fn a_write_extends_to_its_end_once_and_reports_only_what_landed() {
        let mut l = Ledger::new(100);
        let mut calls = Vec::new();
        let w = l.begin(400);
        l.extend(200, rec(&mut calls)).unwrap();
        l.extend(300, rec(&mut calls)).unwrap();
        l.extend(150, rec(&mut calls)).unwrap();
        assert_eq!(calls, [400], "one length change for the whole write");
        assert_eq!(l.landed(), 100, "nothing landed yet");
        l.land(200);
        assert_eq!(l.landed(), 200);
        l.extend(400, rec(&mut calls)).unwrap();
        l.land(300);
        l.land(400);
        assert_eq!(l.end(w, false, rec(&mut calls)).unwrap(), None, "a whole write keeps its length");
        assert_eq!((l.landed(), calls.len()), (400, 1));
    }

    #[test]
    fn a_failed_write_is_cut_back_to_its_landed_data() {
        let mut l = Ledger::new(0);
        let mut calls = Vec::new();
        let w = l.begin(1000);
        l.extend(100, rec(&mut calls)).unwrap();
        l.extend(200, rec(&mut calls)).unwrap();
        l.land(100);
        assert_eq!(l.end(w, true, rec(&mut calls)).unwrap(), Some(100));
        assert_eq!((calls.last(), l.landed()), (Some(&100), 100));
        // Failed before anything was extended: the length is set anyway, freeing what the
        // write had reserved past the end.
        let w = l.begin(1000);
        assert_eq!(l.end(w, true, rec(&mut calls)).unwrap(), Some(100));
    }

    #[test]
    fn a_failing_write_leaves_what_other_writes_reserved() {
        let mut l = Ledger::new(0);
        let mut calls = Vec::new();
        let a = l.begin(1000);
        let b = l.begin(3000);
        l.extend(2100, rec(&mut calls)).unwrap(); // b's first unit, at 2000..2100
        l.extend(2200, rec(&mut calls)).unwrap();
        assert_eq!(calls, [3000], "as long as the longest write in flight");
        l.land(2100);
        // a fails having landed nothing: b's reservation and landed data stay.
        assert_eq!(l.end(a, true, rec(&mut calls)).unwrap(), None);
        assert_eq!((l.landed(), calls.len()), (2100, 1));
        // b fails too, as the last write: cut to the landed data, the reservations freed.
        assert_eq!(l.end(b, true, rec(&mut calls)).unwrap(), Some(2100));
        assert_eq!(calls.last(), Some(&2100));
    }

    #[test]
    fn a_longer_failed_extension_is_cut_to_what_the_others_need() {
        let mut l = Ledger::new(0);
        let mut calls = Vec::new();
        let a = l.begin(500);
        let b = l.begin(5000);
        l.extend(5000, rec(&mut calls)).unwrap();
        l.land(300);
        assert_eq!(l.end(b, true, rec(&mut calls)).unwrap(), Some(500), "a still needs its 500");
        l.extend(500, rec(&mut calls)).unwrap();
        l.land(500);
        // The last write ends well, but a failed one ran beside it: the length is set again to
        // free what that one reserved past the end.
        let c = l.begin(600);
        assert_eq!(l.end(a, false, rec(&mut calls)).unwrap(), None);
        let d = l.begin(700);
        assert_eq!(l.end(d, true, rec(&mut calls)).unwrap(), None, "c still runs: leaked, kept");
        assert_eq!(l.end(c, false, rec(&mut calls)).unwrap(), Some(500), "the last write frees it");
        assert_eq!(l.landed(), 500);
    }

    #[test]
    fn pwrite_and_truncate_set_both_sizes() {
        let mut l = Ledger::new(10);
        l.written(50);
        assert_eq!(l.landed(), 50);
        l.written(20);
        assert_eq!(l.landed(), 50, "a write inside the file does not shrink it");
        l.reset(5);
        assert_eq!(l.landed(), 5);
        let mut calls = Vec::new();
        l.extend(50, rec(&mut calls)).unwrap();
        assert_eq!(calls, [50], "the truncated length is the one extended from");
    }

    #[test]
    fn a_failed_set_len_leaves_the_ledger_as_it_was() {
        let mut l = Ledger::new(0);
        let w = l.begin(100);
        assert!(l.extend(100, |_| Err(io::Error::from_raw_os_error(libc::EFBIG))).is_err());
        let mut calls = Vec::new();
        l.extend(100, rec(&mut calls)).unwrap();
        assert_eq!(calls, [100], "not taken as extended");
        assert_eq!(l.end(w, true, rec(&mut calls)).unwrap(), Some(0));
    }
}

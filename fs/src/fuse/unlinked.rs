//! Files whose last name is removed while the mount holds them open. POSIX keeps such a file
//! until its last close, and programs rely on it (a temporary file unlinked at once, a log
//! rotated under its writer); the meta server does not know which files clients hold open, and
//! would send the objects to the orphan table with the last name.
//!
//! So before the mount removes (or renames over) the last name of a file it holds open, it gives
//! the file a hidden name, `<host>-<pid>-<handle>` in [`DIR`] at the root (a directory only
//! the mounting user may enter), and removes that name at the last close, when the objects go
//! through the orphan table as for any unlink. The file's link count through the mount leaves
//! the hidden name out, as the kernel expects of an unlinked open file. A mount that dies with
//! such files open leaves their hidden names; the next mount on the same host removes those of
//! mounts that are no longer running.

use crate::lock;
use crate::proto::Handle;
use std::collections::HashMap;
use std::sync::Mutex;

/// The directory at the root that holds hidden names.
pub const DIR: &str = ".stripefs-open";

/// How many times the mount holds each file open, and the hidden name of those that lost their
/// last name meanwhile.
#[derive(Debug, Default)]
pub struct Opened(Mutex<HashMap<u64, Held>>);

#[derive(Debug, Default)]
struct Held {
    opens: usize,
    hidden: Option<String>,
}

impl Opened {
    /// `h` was opened once more.
    pub fn opened(&self, h: Handle) {
        lock(&self.0).entry(h.0).or_default().opens += 1;
    }

    /// One open of `h` was closed; with the last, returns its hidden name to remove.
    pub fn closed(&self, h: Handle) -> Option<String> {
        let mut map = lock(&self.0);
        let held = map.get_mut(&h.0)?;
        held.opens = held.opens.saturating_sub(1);
        if held.opens > 0 {
            return None;
        }
        map.remove(&h.0).and_then(|held| held.hidden)
    }

    /// Whether `h` is open here and has no hidden name yet.
    pub fn needs_hiding(&self, h: Handle) -> bool {
        lock(&self.0).get(&h.0).is_some_and(|held| held.opens > 0 && held.hidden.is_none())
    }

    /// Whether anything is open (so a removal may need a lookup first).
    pub fn any(&self) -> bool {
        !lock(&self.0).is_empty()
    }

    /// Records `h`'s hidden name, if `h` is still open here: a last close may have come while
    /// the name was being made (the kernel sends it without waiting), and then nothing will
    /// remove the name but its maker (false).
    #[must_use]
    pub fn hide(&self, h: Handle, name: String) -> bool {
        // A file is here only while it is open: the last close takes it out.
        let mut map = lock(&self.0);
        let Some(held) = map.get_mut(&h.0) else { return false };
        held.hidden = Some(name);
        true
    }

    /// Forgets `h`'s hidden name (the removal it was made for failed), returning it.
    pub fn unhide(&self, h: Handle) -> Option<String> {
        lock(&self.0).get_mut(&h.0).and_then(|held| held.hidden.take())
    }

    /// Whether `h` has a hidden name (its link count through the mount leaves it out).
    pub fn is_hidden(&self, h: Handle) -> bool {
        lock(&self.0).get(&h.0).is_some_and(|held| held.hidden.is_some())
    }
}

/// This host's name, as hidden names carry it.
pub fn host() -> String {
    // The UTS namespace's name, as gethostname(2) gives it.
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// The hidden name of `h` for the mount process `pid` on `host`.
pub fn hidden_name(host: &str, pid: u32, h: Handle) -> String {
    format!("{host}-{pid}-{}", h.0)
}

/// Of the hidden names `names`, those left by mounts on `host` whose process `alive` says is
/// gone.
pub fn stale<'a>(names: &'a [String], host: &str, alive: impl Fn(u32) -> bool) -> Vec<&'a str> {
    names
        .iter()
        .filter_map(|n| {
            let rest = n.strip_prefix(host)?.strip_prefix('-')?;
            let (pid, handle) = rest.split_once('-')?;
            handle.parse::<u64>().ok()?;
            let pid = pid.parse::<u32>().ok()?;
            (!alive(pid)).then_some(n.as_str())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hidden_name_goes_with_the_last_close() {
        let o = Opened::default();
        let h = Handle(7);
        assert!(!o.any() && !o.needs_hiding(h));
        o.opened(h);
        o.opened(h);
        assert!(o.any() && o.needs_hiding(h));
        assert!(o.hide(h, "n".into()));
        assert!(!o.needs_hiding(h) && o.is_hidden(h));
        assert_eq!(o.closed(h), None, "still open once");
        assert_eq!(o.closed(h), Some("n".into()));
        assert!(!o.any() && !o.is_hidden(h));
        assert_eq!(o.closed(h), None, "a close without an open changes nothing");
        o.opened(h);
        assert!(o.hide(h, "m".into()));
        assert_eq!(o.unhide(h), Some("m".into()));
        assert_eq!(o.closed(h), None, "unhidden: nothing to remove");
    }

    #[test]
    fn a_name_made_after_the_last_close_is_left_to_its_maker() {
        let o = Opened::default();
        let h = Handle(7);
        o.opened(h);
        assert!(o.needs_hiding(h));
        // The last close comes while the hidden name is being made.
        assert_eq!(o.closed(h), None);
        assert!(!o.hide(h, "n".into()), "nothing is open to keep");
        assert!(!o.is_hidden(h) && !o.any());
        assert_eq!(o.closed(h), None);
    }

    #[test]
    fn stale_names_are_this_hosts_dead_mounts() {
        let names: Vec<String> = ["a-1-5", "a-2-6", "b-1-7", "a-x-8", "a-3-", "ab-1-9", "a-1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(stale(&names, "a", |pid| pid == 2), ["a-1-5"]);
        assert_eq!(hidden_name("a", 1, Handle(5)), "a-1-5");
    }
}

//! The POSIX permission rules of the namespace, applied by the store to the credentials each
//! request carries: who may look up, create, remove and rename names, open files, and change
//! which attributes. Root may do anything the rules let root do on a local file system.
//!
//! These are the namespace's rules; the io servers check capabilities, which the meta server
//! mints only for an open these rules allowed.

use super::MetaError;
use crate::proto::{Attr, Cred, FileKind, SetAttr, SetTime};

/// Read permission.
pub const READ: u32 = 4;
/// Write permission.
pub const WRITE: u32 = 2;
/// Execute permission; search on a directory.
pub const EXEC: u32 = 1;

const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;

/// Whether `cred` may access `a` for every permission in `want`: the owner's bits if it owns
/// it, else the group's if it is in the group, else the others'. Root may read and write
/// anything and search any directory, and execute what anyone may execute.
pub fn may(a: &Attr, cred: &Cred, want: u32) -> bool {
    if cred.is_root() {
        return want & EXEC == 0 || a.kind == FileKind::Dir || a.mode & 0o111 != 0;
    }
    let bits = if cred.uid == a.uid {
        a.mode >> 6
    } else if cred.in_group(a.gid) {
        a.mode >> 3
    } else {
        a.mode
    };
    bits & want == want
}

/// [`may`], or `EACCES`.
pub fn check(a: &Attr, cred: &Cred, want: u32) -> Result<(), MetaError> {
    if may(a, cred, want) { Ok(()) } else { Err(MetaError::Access) }
}

/// Whether `cred` owns `a` or is root: who may change its mode and set its times.
pub fn owns(a: &Attr, cred: &Cred) -> bool {
    cred.is_root() || cred.uid == a.uid
}

/// May `cred` remove (or rename away, or replace) the entry for `victim` in directory `dir`?
/// It needs write and search permission on the directory, and in a sticky directory (`/tmp`)
/// it must own the directory or the entry, or be root (`EPERM` otherwise).
pub fn may_remove(dir: &Attr, victim: &Attr, cred: &Cred) -> Result<(), MetaError> {
    check(dir, cred, WRITE | EXEC)?;
    if dir.mode & S_ISVTX != 0 && !owns(dir, cred) && !owns(victim, cred) {
        return Err(MetaError::NotPermitted("sticky directory: not the owner of the entry or the directory"));
    }
    Ok(())
}

/// The mode, owner and group of a new entry of `kind` asked for with `mode`, `uid` and `gid`
/// in directory `dir` by `cred`. Only root makes entries for someone else: anyone else's are
/// their own, in the group asked for if they are in it, else in their own. As on Linux: in a
/// set-group-ID directory the entry takes the directory's group and a new directory keeps the
/// bit; a caller that is not root and not in the new file's group does not get a set-group-ID
/// bit on it.
pub fn new_owner(dir: &Attr, kind: FileKind, mode: u32, uid: u32, gid: u32, cred: &Cred) -> (u32, u32, u32) {
    let mut mode = mode & 0o7777;
    let (uid, gid) = match cred.is_root() {
        true => (uid, gid),
        false => (cred.uid, if cred.in_group(gid) { gid } else { cred.gid }),
    };
    let gid = if dir.mode & S_ISGID != 0 { dir.gid } else { gid };
    if dir.mode & S_ISGID != 0 && kind == FileKind::Dir {
        mode |= S_ISGID;
    } else if kind != FileKind::Dir && !cred.is_root() && !cred.in_group(gid) {
        mode &= !S_ISGID;
    }
    (mode, uid, gid)
}

/// Checks an attribute change of `a` by `cred` against the POSIX rules and returns the mode
/// the file ends up with (set-id bits cleared where a change or a write clears them):
/// * mode: the owner or root (`EPERM`); a caller that is not root and not in the file's
///   group cannot set set-group-ID (the bit is dropped, as `chmod` does);
/// * owner: root only, or the owner "changing" it to itself (`EPERM`);
/// * group: root, or the owner to a group it is in (`EPERM`);
/// * times: to given times the owner or root (`EPERM`); to now also whoever may write it
///   (`EACCES`) or writes through a descriptor opened for writing;
/// * size: write permission, unless the caller truncates through a descriptor it opened for
///   writing (`EACCES`);
/// * a change of owner or group clears the set-user-ID bit of a non-directory and its
///   set-group-ID bit if group execute is set (as Linux does, for root too); a write by
///   anyone but root clears them the same way.
pub fn setattr(a: &Attr, cred: &Cred, set: &SetAttr) -> Result<u32, MetaError> {
    let mut mode = a.mode;
    let gid = set.gid.unwrap_or(a.gid);
    if let Some(m) = set.mode {
        if !owns(a, cred) {
            return Err(MetaError::NotPermitted("only the owner or root changes the mode"));
        }
        mode = m & 0o7777;
        if !cred.is_root() && !cred.in_group(gid) {
            mode &= !S_ISGID;
        }
    }
    if let Some(u) = set.uid
        && !cred.is_root()
        && !(cred.uid == a.uid && u == a.uid)
    {
        return Err(MetaError::NotPermitted("only root changes the owner"));
    }
    if let Some(g) = set.gid
        && !cred.is_root()
        && !(cred.uid == a.uid && (g == a.gid || cred.in_group(g)))
    {
        return Err(MetaError::NotPermitted("only the owner changes the group, to one of its groups"));
    }
    let times = [set.atime, set.mtime];
    if times.iter().any(|t| matches!(t, Some(SetTime::At(_)))) && !owns(a, cred) {
        return Err(MetaError::NotPermitted("only the owner or root sets times other than now"));
    }
    // Through a descriptor opened for writing the open was the check (a write's time, an
    // ftruncate), whatever the mode became since.
    if times.iter().any(|t| matches!(t, Some(SetTime::Now))) && !owns(a, cred) && !set.opened_for_write {
        check(a, cred, WRITE)?;
    }
    if set.size.is_some() && !set.opened_for_write {
        check(a, cred, WRITE)?;
    }
    let chown = set.uid.is_some() || set.gid.is_some();
    if a.kind != FileKind::Dir && (chown || (set.wrote && !cred.is_root())) {
        mode &= !S_ISUID;
        if mode & S_IXGRP != 0 {
            mode &= !S_ISGID;
        }
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Timestamp;

    fn attr(kind: FileKind, mode: u32, uid: u32, gid: u32) -> Attr {
        let t = Timestamp::default();
        Attr { kind, mode, uid, gid, size: 0, nlink: 1, atime: t, mtime: t, ctime: t }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    #[test]
    fn owner_group_other_and_root() {
        let f = attr(FileKind::File, 0o640, 10, 20);
        assert!(may(&f, &user(10, 99, &[]), READ | WRITE));
        assert!(!may(&f, &user(10, 99, &[]), EXEC));
        assert!(may(&f, &user(11, 20, &[]), READ));
        assert!(!may(&f, &user(11, 20, &[]), WRITE));
        assert!(may(&f, &user(11, 5, &[7, 20]), READ), "a supplementary group counts");
        assert!(!may(&f, &user(11, 5, &[7]), READ));
        // The owner's bits apply to the owner even when the group's would allow more.
        let g = attr(FileKind::File, 0o070, 10, 20);
        assert!(!may(&g, &user(10, 20, &[]), READ));
        let root = Cred::root();
        assert!(may(&attr(FileKind::File, 0, 10, 20), &root, READ | WRITE));
        assert!(!may(&attr(FileKind::File, 0o644, 10, 20), &root, EXEC));
        assert!(may(&attr(FileKind::File, 0o100, 10, 20), &root, EXEC));
        assert!(may(&attr(FileKind::Dir, 0, 10, 20), &root, EXEC));
        assert_eq!(check(&f, &user(12, 12, &[]), READ).unwrap_err().errno(), crate::Errno::EACCES);
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let tmp = attr(FileKind::Dir, 0o1777, 0, 0);
        let mine = attr(FileKind::File, 0o644, 10, 10);
        assert!(may_remove(&tmp, &mine, &user(10, 10, &[])).is_ok());
        assert_eq!(may_remove(&tmp, &mine, &user(11, 11, &[])).unwrap_err().errno(), crate::Errno::EPERM);
        assert!(may_remove(&tmp, &mine, &Cred::root()).is_ok());
        let owned = attr(FileKind::Dir, 0o1777, 11, 11);
        assert!(may_remove(&owned, &mine, &user(11, 11, &[])).is_ok(), "the directory's owner may");
        let plain = attr(FileKind::Dir, 0o755, 0, 0);
        assert_eq!(may_remove(&plain, &mine, &user(10, 10, &[])).unwrap_err().errno(), crate::Errno::EACCES);
    }

    #[test]
    fn set_group_id_directories_pass_their_group_on() {
        let sgid = attr(FileKind::Dir, 0o2775, 0, 50);
        let me = user(10, 10, &[]);
        assert_eq!(new_owner(&sgid, FileKind::File, 0o644, 10, 10, &me), (0o644, 10, 50));
        assert_eq!(new_owner(&sgid, FileKind::Dir, 0o755, 10, 10, &me), (0o2755, 10, 50));
        let plain = attr(FileKind::Dir, 0o777, 0, 50);
        assert_eq!(new_owner(&plain, FileKind::File, 0o2755, 10, 10, &me), (0o2755, 10, 10));
        assert_eq!(new_owner(&plain, FileKind::File, 0o2755, 10, 30, &me), (0o2755, 10, 10), "not its group");
        let sgid_other = attr(FileKind::Dir, 0o2777, 0, 30);
        assert_eq!(
            new_owner(&sgid_other, FileKind::File, 0o2755, 10, 10, &me),
            (0o755, 10, 30),
            "not in the group"
        );
        assert_eq!(new_owner(&plain, FileKind::File, 0o2755, 7, 30, &Cred::root()), (0o2755, 7, 30));
    }

    #[test]
    fn attribute_changes_follow_the_posix_rules() {
        let f = attr(FileKind::File, 0o6755, 10, 20);
        let owner = user(10, 20, &[30]);
        let other = user(11, 11, &[]);
        let set = |f: &dyn Fn(&mut SetAttr)| {
            let mut s = SetAttr::default();
            f(&mut s);
            s
        };
        let eperm = |r: Result<u32, MetaError>| r.unwrap_err().errno() == crate::Errno::EPERM;
        // Mode: owner or root; set-group-ID dropped for a group the caller is not in.
        assert_eq!(setattr(&f, &owner, &set(&|s| s.mode = Some(0o2644))).unwrap(), 0o2644);
        assert!(eperm(setattr(&f, &other, &set(&|s| s.mode = Some(0o644)))));
        let g40 = attr(FileKind::File, 0o644, 10, 40);
        assert_eq!(setattr(&g40, &owner, &set(&|s| s.mode = Some(0o2644))).unwrap(), 0o644);
        // Owner: root only. Group: the owner, to one of its groups.
        assert!(eperm(setattr(&f, &owner, &set(&|s| s.uid = Some(11)))));
        assert!(setattr(&f, &owner, &set(&|s| s.uid = Some(10))).is_ok());
        assert!(setattr(&f, &owner, &set(&|s| s.gid = Some(30))).is_ok());
        assert!(eperm(setattr(&f, &owner, &set(&|s| s.gid = Some(31)))));
        assert!(eperm(setattr(&f, &other, &set(&|s| s.gid = Some(20)))));
        // A change of owner or group clears set-id bits, for root too; of a directory not.
        assert_eq!(setattr(&f, &Cred::root(), &set(&|s| s.uid = Some(5))).unwrap(), 0o755);
        let no_gx = attr(FileKind::File, 0o6745, 10, 20);
        assert_eq!(setattr(&no_gx, &owner, &set(&|s| s.gid = Some(30))).unwrap(), 0o2745);
        let d = attr(FileKind::Dir, 0o2775, 10, 20);
        assert_eq!(setattr(&d, &owner, &set(&|s| s.gid = Some(30))).unwrap(), 0o2775);
        // A write clears them unless root wrote.
        assert_eq!(setattr(&f, &owner, &set(&|s| s.wrote = true)).unwrap(), 0o755);
        assert_eq!(setattr(&f, &Cred::root(), &set(&|s| s.wrote = true)).unwrap(), 0o6755);
        // Times: given ones the owner; now whoever may write.
        let t = SetTime::At(Timestamp::default());
        let rw = attr(FileKind::File, 0o666, 10, 20);
        assert!(eperm(setattr(&rw, &other, &set(&|s| s.mtime = Some(t)))));
        assert!(setattr(&rw, &other, &set(&|s| s.mtime = Some(SetTime::Now))).is_ok());
        let e = setattr(&f, &other, &set(&|s| s.atime = Some(SetTime::Now))).unwrap_err();
        assert_eq!(e.errno(), crate::Errno::EACCES);
        // Size: write permission, unless through a descriptor opened for writing.
        let ro = attr(FileKind::File, 0o444, 10, 20);
        assert_eq!(
            setattr(&ro, &owner, &set(&|s| s.size = Some(0))).unwrap_err().errno(),
            crate::Errno::EACCES
        );
        assert!(setattr(&ro, &owner, &set(&|s| (s.size, s.opened_for_write) = (Some(0), true))).is_ok());
    }

    #[test]
    fn a_writer_records_its_write_whatever_the_mode_became() {
        // Opened for writing while the mode allowed it, written, then the owner made the file
        // read-only: the writer's close still records the modification time.
        let ro = attr(FileKind::File, 0o444, 10, 20);
        let writer = user(11, 11, &[]);
        let close =
            SetAttr { mtime: Some(SetTime::Now), wrote: true, opened_for_write: true, ..Default::default() };
        assert_eq!(setattr(&ro, &writer, &close).unwrap(), 0o444);
        // Without a descriptor open for writing, setting times to now needs write permission.
        let touch = SetAttr { mtime: Some(SetTime::Now), ..Default::default() };
        assert_eq!(setattr(&ro, &writer, &touch).unwrap_err().errno(), crate::Errno::EACCES);
    }
}

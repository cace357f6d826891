//! The files the shim writes for the user (`SOMA_TRACE`, `SOMA_STATS`), and
//! its warnings to the user.
//!
//! The shim runs inside someone else's program, often with more rights than
//! the person who set the variable expected, in directories (`/tmp`) where
//! other users may have planted names first. So no component of a path is
//! followed through a symbolic link, and only a regular file of the process's
//! own (effective) user with no other hard link is written: anything else may
//! be another user's file, or readable by them. A FIFO must not block the
//! program and a device is not ours to fill; a file the shim creates is
//! readable by its owner alone.

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{File, Metadata};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::absolute;

/// `path`, created (mode 0600) or truncated, for writing; refused (an error
/// saying why, nothing truncated) unless it is a regular file of this user's
/// with one link, reached through no symbolic link.
pub fn create(path: &str) -> io::Result<File> {
    let (dir, name) = match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some(split) => split,
        None => (".", path),
    };
    let dir = directory(dir)?;
    let name = c_string(name)?;
    // An existing file is judged before it is opened for writing: opening a
    // device may act on it (a tape rewinds), and the reasons given are then
    // the shim's, not those of kernel settings (fs.protected_regular).
    match open_at(dir.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
        Ok(fd) => writable(&File::from(fd).metadata()?)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // O_NOFOLLOW: a symbolic link put there since fails (ELOOP). O_NONBLOCK:
    // a FIFO put there since does not wait for a reader. O_NOCTTY: nor does
    // a terminal become the program's.
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let file = File::from(open_at(dir.as_raw_fd(), &name, flags, 0o600).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => symbolic_link(),
        _ => e,
    })?);
    // Judged again on what was opened, which may have replaced what was looked at.
    writable(&file.metadata()?)?;
    // Truncated only now: no O_TRUNC, which would empty a refused file.
    file.set_len(0)?;
    Ok(file)
}

/// Why a file at the end of the path may not be written, if it may not.
fn writable(file: &Metadata) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if file.file_type().is_symlink() {
        Err(symbolic_link())
    } else if !file.is_file() {
        Err(io::Error::other("it is not a regular file"))
    } else if file.uid() != user {
        Err(io::Error::other(format!("it belongs to another user (uid {})", file.uid())))
    } else if file.nlink() > 1 {
        Err(io::Error::other(format!("it has {} hard links, and another name may be another user's", file.nlink())))
    } else {
        Ok(())
    }
}

fn symbolic_link() -> io::Error {
    io::Error::other("it is a symbolic link, which is not followed")
}

fn directory_link() -> io::Error {
    io::Error::other("a directory on its path is a symbolic link, which is not followed")
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// The directory `dir` (`O_PATH`: searching it needs no read permission),
/// resolved through no symbolic link: by `openat2` where the kernel has it
/// (Linux 5.6), else `walk`.
fn directory(dir: &str) -> io::Result<OwnedFd> {
    let path = c_string(dir)?;
    // SAFETY: open_how is three integers; all-zero asks for nothing.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    let size = size_of::<libc::open_how>();
    // SAFETY: `path` is NUL-terminated and `how` is an open_how of `size` bytes.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, path.as_ptr(), &raw const how, size) };
    match owned(fd) {
        // ENOSYS: an older kernel; EPERM: a seccomp filter that does not know
        // it; E2BIG: a kernel that does not know this open_how.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::E2BIG)) => walk(dir),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(directory_link()),
        result => result,
    }
}

/// `directory` without openat2: one component at a time, each opened in the
/// one before it and looked at before it is used, so that no link is followed.
fn walk(dir: &str) -> io::Result<OwnedFd> {
    let start = if dir.starts_with('/') { c"/" } else { c"." };
    let mut fd = open_at(libc::AT_FDCWD, start, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
    for name in dir.split('/').filter(|name| !name.is_empty() && *name != ".") {
        let name = c_string(name)?;
        // Without O_DIRECTORY, which would fail a link as "not a directory"
        // and hide the reason.
        let next = File::from(open_at(fd.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0)?);
        let kind = next.metadata()?.file_type();
        if kind.is_symlink() {
            return Err(directory_link());
        }
        if !kind.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        fd = next.into();
    }
    Ok(fd)
}

/// `openat(dir, name, flags, mode)`.
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; `dir` is AT_FDCWD or a descriptor the
    // caller holds open; mode is read only with O_CREAT.
    owned(unsafe { libc::openat(dir, name.as_ptr(), flags, mode) }.into())
}

/// The descriptor an open call returned, or its error.
fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by the kernel is open, and owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether paths `a` and `b` name one file: the same path once made absolute
/// (`./out` and `$PWD//out`), or one existing file (a hard link, a directory
/// reached through a link).
pub fn same_file(a: &str, b: &str) -> bool {
    if absolute(a).is_ok_and(|a| absolute(b).is_ok_and(|b| a == b)) {
        return true;
    }
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// A warning to the user on stderr, under the shim's name as its
/// configuration errors are, whatever `SOMA_LOG` says: the user asked for
/// what it is about. A failed write is ignored (`eprintln!` would panic).
pub fn warn(message: fmt::Arguments) {
    let _ = writeln!(io::stderr(), "somashim: {message}");
}

/// `path` as a forked child writes it: `<path>.<pid>`, so that parent and
/// child never share a file.
pub fn in_child(path: &str, pid: u32) -> String {
    format!("{path}.{pid}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::path::{Path, PathBuf};

    /// A fresh directory of this test's own, its path free of symbolic links
    /// (`TMPDIR` may have one).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().canonicalize().unwrap();
        let dir = dir.join(format!("somashim-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    fn text(path: &Path) -> &str {
        path.to_str().unwrap()
    }

    #[test]
    fn a_new_file_is_private_and_an_old_one_is_truncated() {
        let dir = scratch("new");
        let path = dir.join("out.csv");
        drop(create(text(&path)).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "old").unwrap();
        drop(create(text(&path)).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn one_file_under_two_paths_is_the_same_file() {
        let dir = scratch("same");
        let path = dir.join("out");
        let text = path.to_str().unwrap();
        assert!(same_file(text, text));
        assert!(same_file(text, &format!("{}//./out", dir.display())), "absent yet, told by the path alone");
        let cwd = std::env::current_dir().unwrap();
        assert!(same_file("./somashim-absent/out", &format!("{}/somashim-absent/out", cwd.display())));
        assert!(!same_file(text, &format!("{text}2")));
        std::fs::write(&path, "").unwrap();
        let link = dir.join("hard");
        std::fs::hard_link(&path, &link).unwrap();
        assert!(same_file(text, link.to_str().unwrap()), "a hard link");
        std::fs::write(dir.join("other"), "").unwrap();
        assert!(!same_file(text, dir.join("other").to_str().unwrap()));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn symbolic_links_are_not_followed() {
        let dir = scratch("links");
        let target = dir.join("target");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create(text(&link)).unwrap_err();
        assert_eq!(e.to_string(), "it is a symbolic link, which is not followed");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep", "the target is not truncated");
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("absent"), &dangling).unwrap();
        let e = create(text(&dangling)).unwrap_err();
        assert_eq!(e.to_string(), "it is a symbolic link, which is not followed");
        assert!(!dir.join("absent").exists(), "a dangling link's target is not created");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_directory_on_the_path_is_not_followed_through_a_symbolic_link() {
        let dir = scratch("dirlink");
        let real = dir.join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::fs::write(real.join("sub/victim"), "keep").unwrap();
        std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
        let refused = "a directory on its path is a symbolic link, which is not followed";
        for path in ["link/sub/victim", "link/sub/new", "link/new"] {
            let e = create(text(&dir.join(path))).unwrap_err();
            assert_eq!(e.to_string(), refused, "{path}");
        }
        assert_eq!(std::fs::read(real.join("sub/victim")).unwrap(), b"keep", "the file beyond is not truncated");
        assert!(!real.join("sub/new").exists() && !real.join("new").exists(), "nothing is created beyond the link");
        drop(create(text(&real.join("sub/new"))).unwrap());
        // The walk, for kernels without openat2, refuses the same paths.
        assert_eq!(walk(text(&dir.join("link/sub"))).unwrap_err().to_string(), refused);
        assert_eq!(walk(text(&dir.join("link"))).unwrap_err().to_string(), refused);
        let e = walk(text(&real.join("sub/victim"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        let walked = File::from(walk(&format!("{}/./real//sub/../sub", dir.display())).unwrap()).metadata().unwrap();
        assert_eq!(walked.ino(), std::fs::metadata(real.join("sub")).unwrap().ino());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_with_another_hard_link_is_refused_untouched() {
        let dir = scratch("hardlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = dir.join("link");
        std::fs::hard_link(&victim, &link).unwrap();
        let e = create(text(&link)).unwrap_err();
        assert_eq!(e.to_string(), "it has 2 hard links, and another name may be another user's");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_of_another_user_is_refused_untouched() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: giving a file to another user needs root");
            return;
        }
        let dir = scratch("owner");
        let path = dir.join("planted");
        std::fs::write(&path, "keep").unwrap();
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let e = create(text(&path)).unwrap_err();
        assert_eq!(e.to_string(), "it belongs to another user (uid 65534)");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_regular_files_are_written() {
        let dir = scratch("special");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // No reader: opening it for writing would block forever.
        let e = create(text(&fifo)).unwrap_err();
        assert_eq!(e.to_string(), "it is not a regular file");
        let e = create("/dev/null").unwrap_err();
        assert_eq!(e.to_string(), "it is not a regular file");
        let e = create(text(&dir)).unwrap_err();
        assert_eq!(e.to_string(), "it is not a regular file", "a directory");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Whether `path` was opened for writing during `action` (inotify).
    fn opened_for_writing(path: &Path, action: impl FnOnce()) -> bool {
        // SAFETY: inotify_init1 takes flags only.
        let watch = owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) }.into()).unwrap();
        let name = c_string(text(path)).unwrap();
        // SAFETY: `watch` is an inotify descriptor and `name` is NUL-terminated.
        let added = unsafe { libc::inotify_add_watch(watch.as_raw_fd(), name.as_ptr(), libc::IN_CLOSE_WRITE) };
        assert!(added >= 0, "{}", io::Error::last_os_error());
        action();
        let e = File::from(watch).read(&mut [0; 4096]).err();
        !e.is_some_and(|e| e.kind() == io::ErrorKind::WouldBlock)
    }

    #[test]
    fn what_is_not_a_regular_file_is_never_opened_for_writing() {
        let dir = scratch("unopened");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // With a reader, opening it for writing would succeed.
        let _reader = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
        let mut nodes = vec![fifo];
        let device = dir.join("null");
        match std::process::Command::new("mknod").arg(&device).args(["c", "1", "3"]).status() {
            Ok(status) if status.success() => nodes.push(device),
            _ => eprintln!("skipped for a device: making one (mknod) needs root"),
        }
        for node in nodes {
            let write = || drop(OpenOptions::new().write(true).open(&node).unwrap());
            assert!(opened_for_writing(&node, write), "the watch sees it");
            let refused = || assert_eq!(create(text(&node)).unwrap_err().to_string(), "it is not a regular file");
            assert!(!opened_for_writing(&node, refused), "{} was opened for writing", node.display());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! The files the shim writes for the user (`SOMA_TRACE`, `SOMA_STATS`), and
//! its warnings to the user.
//!
//! The shim runs inside someone else's program, often with more rights than
//! the person who set the variable expected, in directories (`/tmp`) where
//! other users may have planted names first. So a directory on the path is
//! reached through a symbolic link only where no other user could have put
//! the link there, the last component never is, and only a regular file of
//! the process's own (effective) user with no other hard link is written:
//! anything else may be another user's file, or readable by them. A FIFO
//! must not block the program and a device is not ours to fill; a file the
//! shim creates is readable by its owner alone. `/dev/stdout`, `/dev/stderr`
//! and `/dev/fd/N` name the program's own streams, written as they are.

use std::ffi::{CStr, CString};
use std::fmt;
use std::fs::{File, Metadata};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::absolute;

/// Symbolic links followed on one path at most, as the kernel allows.
const MAX_LINKS: usize = 40;

/// Looks at the last component at most, while names keep appearing there
/// between a look that found none and the creation.
const MAX_LOOKS: usize = 8;

/// How the file is opened for writing. O_NOFOLLOW: a symbolic link put there
/// since fails (ELOOP). O_NONBLOCK: a FIFO does not wait for a reader.
/// O_NOCTTY: nor does a terminal become the program's. No O_TRUNC, which
/// would empty a refused file.
const WRITE: libc::c_int = libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// A file opened by `create`.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    /// The directory it was opened in and its name there, to remove that
    /// file and no other; `None` for a stream of the program's.
    place: Option<(OwnedFd, CString)>,
}

impl Opened {
    /// An inherited descriptor (`/dev/stderr`): written in order, never
    /// truncated, positioned or removed.
    pub fn stream(&self) -> bool {
        self.place.is_none()
    }

    /// Removes the file's name, if it still names this file: resolving the
    /// path again could reach another (a name or a directory replaced since).
    pub fn remove(&self) -> io::Result<()> {
        let Some((dir, name)) = &self.place else { return Ok(()) };
        let mut now = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `dir` is open, `name` NUL-terminated, and `now` a stat to fill.
        if unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), now.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatat succeeded, so it filled `now`.
        let now = unsafe { now.assume_init() };
        let file = self.file.metadata()?;
        if (now.st_dev, now.st_ino) != (file.dev(), file.ino()) {
            return Err(io::Error::other("its name now names another file, which is left"));
        }
        // SAFETY: as for fstatat; flags 0 removes a file, not a directory.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// `path`, created (mode 0600) or truncated, for writing; refused (an error
/// saying why, nothing truncated) unless it is a regular file of this user's
/// with one link, reached through no symbolic link another user could have
/// planted. A stream of the program's (`/dev/stderr`) is a copy of its descriptor.
pub fn create(path: &str) -> io::Result<Opened> {
    if let Some(fd) = inherited(path) {
        // SAFETY: fcntl with F_DUPFD_CLOEXEC reads no memory; a closed `fd` gives EBADF.
        let copy = owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }.into())
            .map_err(|e| io::Error::other(format!("the program's descriptor {fd} is not open ({e})")))?;
        return Ok(Opened { file: File::from(copy), place: None });
    }
    if path.ends_with('/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path names a directory (it ends in '/'), not a file"));
    }
    let (dir, name) = match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some(split) => split,
        None => (".", path),
    };
    let dir = directory(dir)?;
    let name = c_string(name)?;
    // An existing file is judged before it is opened for writing: opening a
    // device may act on it (a tape rewinds), and the reasons given are then
    // the shim's, not those of kernel settings (fs.protected_regular). What
    // is opened is then what was judged, or a file made anew.
    let mut looks = 0;
    let file = loop {
        looks += 1;
        match open_at(dir.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
            Ok(fd) => {
                let looked = File::from(fd);
                writable(&looked.metadata()?)?;
                break reopen(&looked).or_else(|e| match e.kind() {
                    // No /proc (a container, a chroot): by name, the checks after
                    // the open stand between the look and a file put there since.
                    io::ErrorKind::NotFound => match open_at(dir.as_raw_fd(), &name, WRITE | libc::O_CREAT, 0o600) {
                        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(symbolic_link()),
                        opened => opened.map(File::from),
                    },
                    _ => Err(e),
                })?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match fresh(&dir, &name) {
                // Something was put there since the look: look at it.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && looks < MAX_LOOKS => {}
                made => break made?,
            },
            Err(e) => return Err(e),
        }
    };
    // Judged again on what was opened, where it was opened by name.
    writable(&file.metadata()?)?;
    file.set_len(0)?;
    Ok(Opened { file, place: Some((dir, name)) })
}

/// The file `looked` (an `O_PATH` descriptor) opened for writing through
/// `/proc/self/fd`: the inode judged, whatever its name names now.
fn reopen(looked: &File) -> io::Result<File> {
    let path = c_string(&format!("/proc/self/fd/{}", looked.as_raw_fd()))?;
    // Without O_NOFOLLOW: the /proc name is the link to follow.
    open_at(libc::AT_FDCWD, &path, WRITE & !libc::O_NOFOLLOW, 0).map(File::from)
}

/// `name` in `dir`, made for writing (mode 0600) if no name is there:
/// anything put there since the look (a FIFO) fails with EEXIST, unopened.
fn fresh(dir: &OwnedFd, name: &CStr) -> io::Result<File> {
    open_at(dir.as_raw_fd(), name, WRITE | libc::O_CREAT | libc::O_EXCL, 0o600).map(File::from)
}

/// The descriptor `path` names when it is one of the program's own:
/// `/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`.
pub fn inherited(path: &str) -> Option<RawFd> {
    let number = match path {
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => path.strip_prefix("/dev/fd/").or_else(|| path.strip_prefix("/proc/self/fd/"))?,
    };
    // Digits only: `parse` would also take `+1`.
    number.bytes().all(|b| b.is_ascii_digit()).then(|| number.parse().ok()).flatten()
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

fn planted_link(why: &str) -> io::Error {
    io::Error::other(format!("a directory on its path is a symbolic link {why}, which is not followed"))
}

fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path contains a NUL byte"))
}

/// The directory `dir` (`O_PATH`: searching it needs no read permission):
/// by `openat2` where the kernel has it (Linux 5.6) and no link is on the
/// way, else by `walk`, which follows only links no other user could have made.
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
        // it; E2BIG: a kernel that does not know this open_how; ELOOP and
        // EXDEV: a symbolic link on the way, for `walk` to judge.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::E2BIG | libc::ELOOP | libc::EXDEV)) => {
            walk(dir)
        }
        result => result,
    }
}

/// `directory` one component at a time, each opened in the one before it and
/// looked at before it is used. A symbolic link is followed only if `trusted`.
fn walk(dir: &str) -> io::Result<OwnedFd> {
    let start = |at: &CStr| open_at(libc::AT_FDCWD, at, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, 0);
    let root = || start(c"/");
    let mut fd = if dir.starts_with('/') { root()? } else { start(c".")? };
    // The components still to resolve, the next one last.
    let mut left: Vec<String> = dir.split('/').rev().map(String::from).collect();
    let mut links = 0;
    while let Some(name) = left.pop() {
        if name.is_empty() || name == "." {
            continue;
        }
        let name = c_string(&name)?;
        // Without O_DIRECTORY, which would fail a link as "not a directory".
        let next = File::from(open_at(fd.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0)?);
        let meta = next.metadata()?;
        if meta.file_type().is_symlink() {
            trusted(&meta, &File::from(fd.try_clone()?).metadata()?)?;
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = link_target(next.as_fd())?;
            if target.starts_with('/') {
                fd = root()?;
            }
            left.extend(target.split('/').rev().map(String::from));
            continue;
        }
        if !meta.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        fd = next.into();
    }
    Ok(fd)
}

/// Whether the symbolic link `link`, in the directory `holder`, may be
/// followed: as the kernel's fs.protected_symlinks judges, it must be root's
/// or this user's, in a directory others cannot write or that is sticky (where
/// they cannot replace it).
fn trusted(link: &Metadata, holder: &Metadata) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let user = unsafe { libc::geteuid() };
    if link.uid() != 0 && link.uid() != user {
        return Err(planted_link(&format!("of another user (uid {})", link.uid())));
    }
    let mode = holder.mode();
    if mode & libc::S_IWOTH != 0 && mode & libc::S_ISVTX == 0 {
        return Err(planted_link("in a directory that others may write"));
    }
    Ok(())
}

/// What the symbolic link open (`O_PATH | O_NOFOLLOW`) at `link` points to:
/// read from the descriptor, the very link that was judged.
fn link_target(link: BorrowedFd) -> io::Result<String> {
    let mut buffer = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `link` is open, "" is NUL-terminated (the descriptor itself is
    // read), and `buffer` has the length passed.
    let length = unsafe { libc::readlinkat(link.as_raw_fd(), c"".as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if length < 0 {
        return Err(io::Error::last_os_error());
    }
    buffer.truncate(length as usize);
    String::from_utf8(buffer).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a symbolic link on the path is not UTF-8"))
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
    // A stream is written in order: one shared with the other file interleaves, replaces nothing.
    if inherited(a).is_some() || inherited(b).is_some() {
        return inherited(a) == inherited(b);
    }
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
/// child never share a file; a stream they share already stays as it is.
pub fn in_child(path: &str, pid: u32) -> String {
    match inherited(path) {
        Some(_) => path.to_string(),
        None => format!("{path}.{pid}"),
    }
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
    fn only_the_file_opened_is_removed() {
        let dir = scratch("remove");
        let path = dir.join("out");
        create(text(&path)).unwrap().remove().unwrap();
        assert!(!path.exists());
        let opened = create(text(&path)).unwrap();
        std::fs::write(dir.join("other"), "keep").unwrap();
        std::fs::rename(dir.join("other"), &path).unwrap();
        let e = opened.remove().unwrap_err();
        assert_eq!(e.to_string(), "its name now names another file, which is left");
        assert_eq!(std::fs::read(&path).unwrap(), b"keep");
        // The directory renamed and another put at its path: the file is found where it was opened.
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let opened = create(text(&sub.join("out"))).unwrap();
        std::fs::rename(&sub, dir.join("moved")).unwrap();
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("out"), "keep").unwrap();
        opened.remove().unwrap();
        assert!(!dir.join("moved/out").exists());
        assert_eq!(std::fs::read(sub.join("out")).unwrap(), b"keep");
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
    fn a_directory_link_of_this_user_is_followed() {
        let dir = scratch("dirlink");
        let real = dir.join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        std::os::unix::fs::symlink(&real, dir.join("link")).unwrap();
        std::os::unix::fs::symlink("real/sub", dir.join("relative")).unwrap();
        std::os::unix::fs::symlink("link", dir.join("chained")).unwrap();
        for (path, made) in [("link/sub/a", "sub/a"), ("link/b", "b"), ("relative/c", "sub/c"), ("chained/sub/../d", "d")] {
            drop(create(text(&dir.join(path))).unwrap_or_else(|e| panic!("{path}: {e}")));
            assert!(real.join(made).is_file(), "{path} made {made}");
        }
        // The walk, which openat2 leaves links to, resolves the same way.
        let walked = File::from(walk(&format!("{}/./chained//sub/../sub", dir.display())).unwrap()).metadata().unwrap();
        assert_eq!(walked.ino(), std::fs::metadata(real.join("sub")).unwrap().ino());
        let e = walk(text(&real.join("sub/a"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        assert_eq!(walk(text(&dir.join("loop"))).unwrap_err().raw_os_error(), Some(libc::ELOOP));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_directory_link_others_could_have_planted_is_refused() {
        let dir = scratch("planted");
        let real = dir.join("real");
        std::fs::create_dir(&real).unwrap();
        let shared = dir.join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::os::unix::fs::symlink(&real, shared.join("link")).unwrap();
        let e = create(text(&shared.join("link/new"))).unwrap_err();
        let refused = "a directory on its path is a symbolic link in a directory that others may write, which is not followed";
        assert_eq!(e.to_string(), refused, "not sticky: anyone may have replaced it");
        assert!(!real.join("new").exists());
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped for a link of another user: giving one to uid 65534 needs root");
        } else {
            let tmp = dir.join("tmp");
            std::fs::create_dir(&tmp).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
            std::os::unix::fs::symlink(&real, tmp.join("link")).unwrap();
            std::os::unix::fs::lchown(tmp.join("link"), Some(65534), None).unwrap();
            let e = create(text(&tmp.join("link/new"))).unwrap_err();
            let refused = "a directory on its path is a symbolic link of another user (uid 65534), which is not followed";
            assert_eq!(e.to_string(), refused);
            assert!(!real.join("new").exists());
            std::os::unix::fs::lchown(tmp.join("link"), Some(0), None).unwrap();
            drop(create(text(&tmp.join("link/new"))).unwrap());
            assert!(real.join("new").is_file(), "root's link in a sticky directory is followed");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_programs_streams_are_written_as_they_are() {
        assert_eq!(inherited("/dev/stdout"), Some(1));
        assert_eq!(inherited("/dev/stderr"), Some(2));
        assert_eq!(inherited("/dev/fd/17"), Some(17));
        assert_eq!(inherited("/proc/self/fd/3"), Some(3));
        for other in ["/dev/fd/", "/dev/fd/+1", "/dev/fd/1/x", "/dev/stdout2", "/proc/1/fd/1", "./dev/stdout"] {
            assert_eq!(inherited(other), None, "{other}");
        }
        let opened = create("/dev/stderr").unwrap();
        assert!(opened.stream());
        opened.remove().unwrap();
        assert_ne!(opened.file.as_raw_fd(), 2, "a copy, so the program's stays open");
        assert_eq!(in_child("/dev/stdout", 42), "/dev/stdout");
        assert!(same_file("/dev/stdout", "/dev/fd/1") && !same_file("/dev/stdout", "/dev/stderr"));
        assert_eq!(in_child("/tmp/s", 42), "/tmp/s.42");
        let e = create("/dev/fd/999999").unwrap_err();
        assert!(e.to_string().starts_with("the program's descriptor 999999 is not open"), "{e}");
    }

    #[test]
    fn a_path_ending_in_a_slash_names_a_directory() {
        let dir = scratch("slash");
        let e = create(&format!("{}/", dir.display())).unwrap_err();
        assert_eq!(e.to_string(), "the path names a directory (it ends in '/'), not a file");
        assert!(create(&format!("{}/absent/", dir.display())).unwrap_err().to_string().contains("names a directory"));
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
    fn what_appears_after_the_look_is_not_opened() {
        let dir = scratch("race");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let _reader = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
        let at = File::from(walk(text(&dir)).unwrap());
        let name = c_string("fifo").unwrap();
        // A look that found nothing is followed by this: a FIFO put there since fails.
        let made = || assert_eq!(fresh(&at.try_clone().unwrap().into(), &name).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(!opened_for_writing(&fifo, made), "the FIFO was opened for writing");
        // A look that found a file opens that file, whatever its name names since.
        let path = dir.join("out");
        std::fs::write(&path, "old").unwrap();
        let looked = File::open(&path).unwrap();
        std::fs::rename(&fifo, &path).unwrap();
        let reopened = reopen(&looked).unwrap();
        assert_eq!(reopened.metadata().unwrap().ino(), looked.metadata().unwrap().ino());
        assert!(reopened.metadata().unwrap().is_file());
        std::fs::remove_dir_all(dir).unwrap();
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

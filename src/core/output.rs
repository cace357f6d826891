//! The files the shim writes for the user (`SOMA_TRACE`, `SOMA_STATS`), and
//! its warnings to the user.
//!
//! The shim runs inside someone else's program, often with more rights than
//! the person who set the variable expected, so a path is never followed
//! through a symbolic link, only a regular file is written (a FIFO must not
//! block the program, a device is not ours to fill), and a file it creates is
//! readable by its owner alone.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::absolute;

/// `path`, created (mode 0600) or truncated, for writing.
pub fn create(path: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .mode(0o600)
        // O_NOFOLLOW: a symbolic link at `path` fails (ELOOP) instead of being
        // followed. O_NONBLOCK: opening a FIFO returns at once instead of
        // waiting for a reader; regular files ignore it.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => io::Error::other("it is a symbolic link, which is not followed"),
            Some(libc::ENXIO) => not_a_regular_file(),
            _ => e,
        })?;
    if !file.metadata()?.is_file() {
        return Err(not_a_regular_file());
    }
    // Truncated only now, once it is known to be a regular file.
    file.set_len(0)?;
    Ok(file)
}

fn not_a_regular_file() -> io::Error {
    io::Error::other("it is not a regular file")
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
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A fresh directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("somashim-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn a_new_file_is_private_and_an_old_one_is_truncated() {
        let dir = scratch("new");
        let path = dir.join("out.csv");
        drop(create(path.to_str().unwrap()).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "old").unwrap();
        drop(create(path.to_str().unwrap()).unwrap());
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
        let e = create(link.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep", "the target is not truncated");
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink(dir.join("absent"), &dangling).unwrap();
        assert!(create(dangling.to_str().unwrap()).is_err());
        assert!(!dir.join("absent").exists(), "a dangling link's target is not created");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_regular_files_are_written() {
        let dir = scratch("special");
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // No reader: this would block forever without O_NONBLOCK.
        let e = create(fifo.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = create("/dev/null").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}

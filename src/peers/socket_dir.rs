//! The directory of the shim's sockets (`SOMA_SOCKET_DIR`): each process's
//! server listens there (`server.rs`), and the files in it are the list
//! of the user's shim processes (`neighbours.rs`, `somarun --ps`).

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::PathBuf;

use crate::core::config::settings::Config;

/// The directory of the sockets (`SOMA_SOCKET_DIR`, by default this
/// user's in /tmp): made with mode 0700, and used only if it is a real
/// directory this user owns that no one else may enter.
pub(super) fn socket_dir(config: &Config) -> Result<PathBuf, String> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let dir = match &config.socket_dir {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(format!("/tmp/somashim-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!("{} is not a directory of this user's that only it may enter", dir.display()));
    }
    Ok(dir)
}

pub(super) fn socket_path(dir: &std::path::Path, pid: u32, endpoint: u64) -> PathBuf {
    dir.join(format!("{pid}-{endpoint:016x}"))
}

/// Removes `path`, the socket file of a server that is gone (no process
/// listens there): only a socket of this user's (in the shim's directory,
/// which only this user may enter).
pub(super) fn remove_stale_socket(path: &std::path::Path) {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket() && meta.uid() == uid) {
        let _ = std::fs::remove_file(path);
    }
}


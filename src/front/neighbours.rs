//! The other shim processes of this user on the node: asked, when an
//! allocation finds the device out of memory, to give back what their pools
//! hold unused, before the allocation fails. No daemon: each process's IPC
//! server (`ipc_server.rs`), started with its first pool, answers; the
//! sockets in the user's directory are the list of processes.
//!
//! Every peer is asked at once and waited for `ASK_WAIT` at most, so a
//! stalled or stopped peer costs that much; a dead one's socket refuses at
//! once (no process listens there: the file is removed).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::ipc_server::socket_dir;
use super::ipc_wire::{connect, encode_give_back, send_all, Reply, REPLY_LEN};

/// The longest an allocation waits for its neighbours' answers.
pub const ASK_WAIT: Duration = Duration::from_millis(200);

/// What the neighbours answered.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub asked: usize,
    pub answered: usize,
    /// Bytes they gave back to the driver.
    pub given: u64,
}

/// Asks every other shim process of this user to give back what the pools
/// of the device `uuid` hold unused, and waits for their answers
/// (`ASK_WAIT` at most).
pub fn ask_to_give_back(uuid: [u8; 16]) -> Answers {
    let deadline = Instant::now() + ASK_WAIT;
    let request = encode_give_back(Some(uuid));
    let mut waiting: Vec<(UnixStream, [u8; REPLY_LEN], usize)> = Vec::new();
    for (pid, path) in peers() {
        match connect(&path, deadline) {
            Ok(connection) => {
                // A request fits an empty socket buffer: the send does not wait.
                if send_all(&connection, &request).is_ok() && connection.set_nonblocking(true).is_ok() {
                    waiting.push((connection, [0; REPLY_LEN], 0));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => log::debug!("neighbour {pid}: {e}"),
        }
    }
    let mut answers = Answers { asked: waiting.len(), ..Answers::default() };
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut polled: Vec<libc::pollfd> =
            waiting.iter().map(|(c, _, _)| libc::pollfd { fd: c.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: `polled` is a valid array of its length.
        let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, left.as_millis().max(1) as libc::c_int) };
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
        let mut still = Vec::new();
        for ((mut connection, mut bytes, mut got), polled) in waiting.into_iter().zip(&polled) {
            if polled.revents == 0 {
                still.push((connection, bytes, got));
                continue;
            }
            match connection.read(&mut bytes[got..]) {
                Ok(0) => {}
                Ok(n) => {
                    got += n;
                    if got == REPLY_LEN {
                        let reply = Reply::decode(&bytes);
                        answers.answered += 1;
                        answers.given += if reply.status == 0 { reply.pool } else { 0 };
                    } else {
                        still.push((connection, bytes, got));
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                    still.push((connection, bytes, got))
                }
                Err(_) => {}
            }
        }
        waiting = still;
    }
    answers
}

/// The other processes' sockets in this user's directory, by pid.
fn peers() -> Vec<(u32, PathBuf)> {
    let Ok(dir) = socket_dir() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let me = std::process::id();
    entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let pid: u32 = path.file_name()?.to_str()?.split_once('-')?.0.parse().ok()?;
            (pid != me).then_some((pid, path))
        })
        .collect()
}

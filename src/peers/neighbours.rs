//! The other shim processes of this user on the node: asked, when an
//! allocation finds the device out of memory, to give back what their pools
//! hold unused, before the allocation fails. No daemon: each process's IPC
//! server (`server.rs`), started with its first pool, answers; the
//! sockets in the user's directory are the list of processes.
//!
//! Every peer is asked at once, and the answers are waited for until they
//! gave what the allocation needs, `ASK_WAIT` at most: a stalled or stopped
//! peer costs at most that, and one whose queue of connections is full is
//! not asked; a dead one's socket refuses at once (no process listens
//! there: the file is removed).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::socket_dir::{remove_stale_socket, socket_dir};
use super::wire::{connect_at_once, decode_usage, encode_give_back, encode_usage_request, send_all, Reply, REPLY_LEN, REQUEST_LEN};
use crate::core::config::settings::Config;

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
/// of the device `uuid` hold unused, and waits for their answers until they
/// gave `wanted` bytes or all answered (`ASK_WAIT` at most).
pub fn ask_to_give_back(config: &Config, uuid: [u8; 16], wanted: u64) -> Answers {
    let deadline = Instant::now() + ASK_WAIT;
    let request = encode_give_back(Some(uuid));
    let mut waiting: Vec<(UnixStream, [u8; REPLY_LEN], usize)> = Vec::new();
    for (pid, path) in peers(config) {
        // A request fits an empty socket buffer: the send does not wait.
        if let Some(connection) = connect_to(pid, &path) {
            if send_all(&connection, &request).is_ok() {
                waiting.push((connection, [0; REPLY_LEN], 0));
            }
        }
    }
    let mut answers = Answers { asked: waiting.len(), ..Answers::default() };
    while !waiting.is_empty() && answers.given < wanted {
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

/// What every other shim process of this user holds on the device `uuid`:
/// its pid and its pool's figures (`PoolUsage::figures`). All of them are
/// asked within `ASK_WAIT`, one request at a time; one that does not answer
/// by then is left out, and a dead one's socket is removed.
pub fn usage_on(config: &Config, uuid: [u8; 16]) -> Vec<(u32, [u64; 6])> {
    let deadline = Instant::now() + ASK_WAIT;
    let mut found = Vec::new();
    for (pid, path) in peers(config) {
        // The device pools come first, a pinned host pool after them: at most one a device.
        for index in 0..64 {
            let Some(reply) = ask_once(pid, &path, &encode_usage_request(index), deadline) else { break };
            if reply.status != 0 || reply.pool >> 32 != 0 {
                break;
            }
            let (device, figures) = decode_usage(&reply.data);
            if device == uuid {
                found.push((pid, figures));
            }
        }
    }
    found
}

/// One request over a connection of its own, and its reply, if it came
/// before `deadline`.
fn ask_once(pid: u32, path: &Path, request: &[u8; REQUEST_LEN], deadline: Instant) -> Option<Reply> {
    let left = deadline.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())?;
    let mut connection = connect_to(pid, path)?;
    connection.set_nonblocking(false).ok()?;
    connection.set_read_timeout(Some(left)).ok()?;
    send_all(&connection, request).ok()?;
    let mut bytes = [0u8; REPLY_LEN];
    connection.read_exact(&mut bytes).ok()?;
    Some(Reply::decode(&bytes))
}

/// A connection to process `pid`'s socket `path`, made at once: a peer
/// whose backlog is full (stopped, with asks queued) is skipped, and the
/// socket of one no process listens on is removed (its process is gone: a
/// live one's socket is listening before it gets its name).
fn connect_to(pid: u32, path: &Path) -> Option<UnixStream> {
    match connect_at_once(path) {
        Ok(connection) => Some(connection),
        Err(e) => {
            if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                remove_stale_socket(path);
            } else {
                log::debug!("neighbour {pid}: {e}");
            }
            None
        }
    }
}

/// The other processes' sockets in this user's directory, by pid.
fn peers(config: &Config) -> Vec<(u32, PathBuf)> {
    let Ok(dir) = socket_dir(config) else { return Vec::new() };
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

//! The messages of the shim's IPC protocol, and the socket calls both sides
//! send and receive them with. An importer holds one connection per exporter
//! and device; over it, one request at a time, each answered before the next:
//!
//! - request, 68 bytes: op (u32: 1 open a lease, 2 close one), the handle (64 bytes);
//! - reply, 76 bytes: status (u32: 0 done, 1 refused), the pool's id (u64), the
//!   block's export data (64 bytes; zeros for a close). A granted open whose pool
//!   the connection has not had yet carries the pool's descriptor (`SCM_RIGHTS`).
//!
//! Any shim process of the user may also ask another, over a connection of
//! its own that ends with the answer (`neighbours.rs`):
//!
//! - op 3, give back: the 64 bytes are a flag (u8: 1 the device whose UUID
//!   follows, 0 every pool, pinned host pools too) and the UUID (16 bytes);
//!   the reply's second field is the bytes given back to the driver;
//! - op 4, usage: the 64 bytes begin with a pool's index (u32: the devices'
//!   pools, then the pinned host pools, in the order set up); the reply,
//!   refused past the last, has the pool's device (u64: its ordinal, plus
//!   2^32 for a pinned host pool) and its figures: the UUID (16 bytes), then
//!   six u64s: in use, cached, freed and not yet reusable, reserved, the
//!   peak in use, given back so far (`encode_usage`);
//! - op 5, a library: the 64 bytes begin with an index (u32) into the
//!   libraries that allocated device memory, in the order the process first
//!   saw them (a list that only grows); the
//!   reply, refused past the last, has the bytes in use (u64), then the peak
//!   and the allocations (two u64s) and the library's name (`core/libraries.rs`; 48 bytes,
//!   NUL-padded, cut to fit) (`encode_library`);
//! - op 6, a snapshot: the process writes its snapshot now (`snapshot.rs`)
//!   to `<pid>.snapshot.json` in the socket directory; the status says
//!   whether it did.
//!
//! All integers little-endian. scripts/somactl.py speaks ops 3 to 6 too.

use std::io::{ErrorKind, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Instant;

use crate::core::shared_blocks::IpcHandle;
use crate::cuda::driver::PointerExport;

pub(super) const REQUEST_LEN: usize = 4 + 64;
pub(super) const REPLY_LEN: usize = 4 + 8 + 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// A lease on the handle's block: the reply names its pool and carries its export data.
    Open = 1,
    /// The end of this connection's lease on the handle's block.
    Close = 2,
}

/// A request, as the server reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Request {
    Lease(Op, IpcHandle),
    /// Give back what the pools of this device (by UUID; None: every pool,
    /// pinned host pools too) hold unused.
    GiveBack(Option<[u8; 16]>),
    /// What the pool of this index holds.
    Usage(u32),
    /// The figures of the library of this index (`core/libraries.rs`).
    Library(u32),
    /// Write the snapshot now.
    Snapshot,
}

const GIVE_BACK: u32 = 3;
const USAGE: u32 = 4;
const LIBRARY: u32 = 5;
const SNAPSHOT: u32 = 6;


pub(super) fn encode_request(op: Op, handle: &IpcHandle) -> [u8; REQUEST_LEN] {
    let mut bytes = [0u8; REQUEST_LEN];
    bytes[..4].copy_from_slice(&(op as u32).to_le_bytes());
    bytes[4..].copy_from_slice(&handle.encode());
    bytes
}

/// A usage request for the pool at `index` (op 4).
pub(super) fn encode_usage_request(index: u32) -> [u8; REQUEST_LEN] {
    let mut bytes = [0u8; REQUEST_LEN];
    bytes[..4].copy_from_slice(&USAGE.to_le_bytes());
    bytes[4..8].copy_from_slice(&index.to_le_bytes());
    bytes
}

/// A give-back request for the device `uuid` (None: every pool).
pub(super) fn encode_give_back(uuid: Option<[u8; 16]>) -> [u8; REQUEST_LEN] {
    let mut bytes = [0u8; REQUEST_LEN];
    bytes[..4].copy_from_slice(&GIVE_BACK.to_le_bytes());
    if let Some(uuid) = uuid {
        bytes[4] = 1;
        bytes[5..21].copy_from_slice(&uuid);
    }
    bytes
}

/// The request, if `bytes` are one (anything else breaks the protocol).
pub(super) fn decode_request(bytes: &[u8; REQUEST_LEN]) -> Option<Request> {
    let op = match u32::from_le_bytes(bytes[..4].try_into().ok()?) {
        1 => Op::Open,
        2 => Op::Close,
        GIVE_BACK => {
            return match bytes[4] {
                0 => Some(Request::GiveBack(None)),
                1 => Some(Request::GiveBack(Some(bytes[5..21].try_into().ok()?))),
                _ => None,
            }
        }
        USAGE => return Some(Request::Usage(u32::from_le_bytes(bytes[4..8].try_into().ok()?))),
        LIBRARY => return Some(Request::Library(u32::from_le_bytes(bytes[4..8].try_into().ok()?))),
        SNAPSHOT => return Some(Request::Snapshot),
        _ => return None,
    };
    Some(Request::Lease(op, IpcHandle::decode(bytes[4..].try_into().ok()?)?))
}

/// A usage reply's data: the UUID, then the six figures.
pub(super) fn encode_usage(uuid: [u8; 16], figures: [u64; 6]) -> PointerExport {
    let mut data = [0u8; 64];
    data[..16].copy_from_slice(&uuid);
    for (slot, figure) in data[16..].chunks_exact_mut(8).zip(figures) {
        slot.copy_from_slice(&figure.to_le_bytes());
    }
    data
}

/// A usage reply's UUID and figures (`encode_usage`).
pub(super) fn decode_usage(data: &PointerExport) -> ([u8; 16], [u64; 6]) {
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&data[..16]);
    let mut figures = [0u64; 6];
    for (figure, bytes) in figures.iter_mut().zip(data[16..].chunks_exact(8)) {
        *figure = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    }
    (uuid, figures)
}

/// A library reply's data: the peak, the allocations, and the name.
pub(super) fn encode_library(peak: u64, allocations: u64, name: &str) -> PointerExport {
    let mut data = [0u8; 64];
    data[..8].copy_from_slice(&peak.to_le_bytes());
    data[8..16].copy_from_slice(&allocations.to_le_bytes());
    let name = name.as_bytes();
    let kept = name.len().min(48);
    data[16..16 + kept].copy_from_slice(&name[..kept]);
    data
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reply {
    /// 0: granted (open) or ended (close); otherwise refused.
    pub status: u32,
    /// The exporter's id of the block's pool: the importer imports each pool once per connection.
    pub pool: u64,
    pub data: PointerExport,
}

impl Reply {
    pub(super) const REFUSED: Reply = Reply { status: 1, pool: 0, data: [0; 64] };
    pub(super) const DONE: Reply = Reply { status: 0, pool: 0, data: [0; 64] };

    pub(super) fn encode(&self) -> [u8; REPLY_LEN] {
        let mut bytes = [0u8; REPLY_LEN];
        bytes[..4].copy_from_slice(&self.status.to_le_bytes());
        bytes[4..12].copy_from_slice(&self.pool.to_le_bytes());
        bytes[12..].copy_from_slice(&self.data);
        bytes
    }

    pub(super) fn decode(bytes: &[u8; REPLY_LEN]) -> Reply {
        let mut status = [0u8; 4];
        let mut pool = [0u8; 8];
        let mut data = [0u8; 64];
        status.copy_from_slice(&bytes[..4]);
        pool.copy_from_slice(&bytes[4..12]);
        data.copy_from_slice(&bytes[12..]);
        Reply { status: u32::from_le_bytes(status), pool: u64::from_le_bytes(pool), data }
    }
}

/// Writes all of `bytes` without the SIGPIPE a write to a closed socket
/// raises (which would end the program: the shim runs inside it).
pub(super) fn send_all(connection: &UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    send_all_by(connection, bytes, None)
}

/// `send_all` on a blocking socket, each send bounded by what is left
/// until `deadline` (a signal's interruption resumes it).
pub(super) fn send_all_by(connection: &UnixStream, mut bytes: &[u8], deadline: Option<Instant>) -> std::io::Result<()> {
    while !bytes.is_empty() {
        if let Some(deadline) = deadline {
            set_timeout(connection.as_raw_fd(), libc::SO_SNDTIMEO, deadline)?;
        }
        // SAFETY: sends from a live slice on a live socket.
        let n = unsafe { libc::send(connection.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Bounds the socket's blocking sends (`SO_SNDTIMEO`) or receives
/// (`SO_RCVTIMEO`) by what is left until `deadline`; an error once it has passed.
fn set_timeout(fd: RawFd, option: libc::c_int, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    // At least a microsecond: a zero timeout would wait for ever.
    let time = libc::timeval { tv_sec: left.as_secs() as libc::time_t, tv_usec: left.subsec_micros().max(1) as libc::suseconds_t };
    // SAFETY: passes a timeval of the length given.
    let rc = unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, option, (&time as *const libc::timeval).cast(), std::mem::size_of::<libc::timeval>() as libc::socklen_t)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A blocking connection to the socket at `path`, made by `deadline`: a
/// listener whose backlog is full (its process stopped, say) is waited
/// for no longer. Close-on-exec from the start.
pub(super) fn connect(path: &Path, deadline: Instant) -> std::io::Result<UnixStream> {
    // A unix socket's connect waits for room in the backlog as a send waits (`SO_SNDTIMEO`).
    connect_with(path, 0, |fd| set_timeout(fd, libc::SO_SNDTIMEO, deadline))
}

/// A non-blocking connection to the socket at `path`, made at once: a
/// listener whose backlog is full refuses with `WouldBlock`.
pub(super) fn connect_at_once(path: &Path) -> std::io::Result<UnixStream> {
    connect_with(path, libc::SOCK_NONBLOCK, |_| Ok(()))
}

/// A close-on-exec unix socket of `flags`, connected to `path`, with
/// `before` run on it before each try.
fn connect_with(path: &Path, flags: libc::c_int, before: impl Fn(RawFd) -> std::io::Result<()>) -> std::io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain data, for which zeros are valid.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = path.as_os_str().as_bytes();
    if path.len() >= address.sun_path.len() {
        return Err(ErrorKind::InvalidInput.into());
    }
    for (to, &from) in address.sun_path.iter_mut().zip(path) {
        *to = from as libc::c_char;
    }
    // SAFETY: socket takes no pointer.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | flags, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    loop {
        before(socket.as_raw_fd())?;
        // SAFETY: `address` is a sockaddr_un of the length given.
        let rc = unsafe {
            libc::connect(socket.as_raw_fd(), (&address as *const libc::sockaddr_un).cast(), std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t)
        };
        if rc == 0 {
            return Ok(UnixStream::from(socket));
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// Sends `bytes` in one message, with `fd` alongside if given.
pub(super) fn send_with_fd(connection: &UnixStream, bytes: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
    let Some(fd) = fd else { return send_all(connection, bytes) };
    let iov = [IoSlice::new(bytes)];
    let mut control = [0u64; 4]; // CMSG_SPACE(sizeof(int)), aligned
    // SAFETY: msghdr is plain data; the control buffer holds one int's cmsg.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = iov.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let header = libc::CMSG_FIRSTHDR(&message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd);
        if libc::sendmsg(connection.as_raw_fd(), &message, libc::MSG_NOSIGNAL) != bytes.len() as isize {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives a reply and the descriptor sent with it (if any) by `deadline`,
/// resuming after a signal; the count of bytes is short if the connection
/// closed first. A descriptor cut off (`MSG_CTRUNC`) is an error.
pub(super) fn receive_with_fd(connection: &UnixStream, bytes: &mut [u8; REPLY_LEN], deadline: Instant) -> std::io::Result<(usize, Option<OwnedFd>)> {
    let mut received = 0;
    let mut fd = None;
    while received < REPLY_LEN {
        set_timeout(connection.as_raw_fd(), libc::SO_RCVTIMEO, deadline)?;
        let mut iov = [IoSliceMut::new(&mut bytes[received..])];
        let mut control = [0u64; 4];
        // SAFETY: msghdr is plain data; the kernel writes at most the buffers' lengths.
        let (n, flags, passed) = unsafe {
            let mut message: libc::msghdr = std::mem::zeroed();
            message.msg_iov = iov.as_mut_ptr().cast();
            message.msg_iovlen = 1;
            message.msg_control = control.as_mut_ptr().cast();
            message.msg_controllen = std::mem::size_of_val(&control);
            let n = libc::recvmsg(connection.as_raw_fd(), &mut message, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL);
            let header = libc::CMSG_FIRSTHDR(&message);
            let passed = (n >= 0 && !header.is_null() && (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS)
                .then(|| OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>())));
            (n, message.msg_flags, passed)
        };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if flags & libc::MSG_CTRUNC != 0 {
            return Err(std::io::Error::other("a descriptor cut off"));
        }
        // One message carries it; any other would break the protocol (and closes here).
        fd = fd.or(passed);
        if n == 0 {
            break;
        }
        received += n as usize;
    }
    Ok((received, fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_their_bytes_and_other_bytes_are_no_request() {
        let handle = IpcHandle { pid: 7, endpoint: 0xfeed, base: 0x7f00_0000_1000, secret: [3; 32] };
        for op in [Op::Open, Op::Close] {
            assert_eq!(decode_request(&encode_request(op, &handle)), Some(Request::Lease(op, handle)));
        }
        let uuid = [0xab; 16];
        assert_eq!(decode_request(&encode_give_back(Some(uuid))), Some(Request::GiveBack(Some(uuid))));
        assert_eq!(decode_request(&encode_give_back(None)), Some(Request::GiveBack(None)));
        let usage = encode_usage_request(2);
        assert_eq!(decode_request(&usage), Some(Request::Usage(2)));
        let mut library = usage;
        library[0] = 5;
        assert_eq!(decode_request(&library), Some(Request::Library(2)));
        let mut snapshot = [0u8; REQUEST_LEN];
        snapshot[0] = 6;
        assert_eq!(decode_request(&snapshot), Some(Request::Snapshot));
        let mut unknown = encode_request(Op::Open, &handle);
        unknown[0] = 7;
        assert_eq!(decode_request(&unknown), None);
        let mut bad_flag = encode_give_back(None);
        bad_flag[4] = 2;
        assert_eq!(decode_request(&bad_flag), None);
        let data = encode_usage(uuid, [1, 2, 3, 4, 5, 6]);
        assert_eq!((&data[..16], u64::from_le_bytes(data[56..].try_into().unwrap())), (&uuid[..], 6));
        assert_eq!(decode_usage(&data), (uuid, [1, 2, 3, 4, 5, 6]));
        let data = encode_library(7, 8, &"x".repeat(60));
        assert_eq!((data[0], data[8], &data[16..]), (7, 8, &[b'x'; 48][..]), "the name cut to fit");
        assert_eq!(decode_request(&[0; REQUEST_LEN]), None);
        let reply = Reply { status: 0, pool: 0x0102_0304_0506_0708, data: [9; 64] };
        assert_eq!(Reply::decode(&reply.encode()), reply);
    }
}

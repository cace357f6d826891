//! `fork` and the talking to other processes: the forking thread waits for an
//! import or close in progress and for the server's current step, so that the
//! child inherits no lock held by a thread it will not have, and the child
//! closes its copies of the parent's sockets and descriptors.

use super::{import, server};

/// The importer's lock, the first a fork takes.
pub struct ImportsPause(import::Held);

/// The IPC locks, held by the forking thread across `fork`.
pub struct ForkPause {
    server: server::Held,
    imports: import::Held,
}

/// Before `fork`, first: no exchange of an import or close in progress (one
/// holds the importer's lock across it, seconds at worst), so the child
/// inherits no link in the middle of an exchange. Taken before any other of
/// the shim's locks, so that while the fork waits here it holds none that the
/// server thread, the reclaimer or a free needs.
pub fn before_fork() -> ImportsPause {
    ImportsPause(import::hold())
}

impl ImportsPause {
    /// Then, after the reclaimer's: no server starting and no server step
    /// under way, so the child inherits no IPC lock held by a thread it will
    /// not have.
    pub fn and_server(self) -> ForkPause {
        ForkPause { server: server::hold(), imports: self.0 }
    }
}

impl ForkPause {
    /// In a forked child: the parent's server is not the child's to run (its
    /// sockets and pool descriptors close), nor are the parent's links as
    /// importer.
    pub fn in_child(self) {
        self.server.in_child();
        self.imports.in_child();
    }
}

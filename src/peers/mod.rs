//! What talks to other processes: CUDA IPC on pool memory (the exporter's
//! handles, the importer's leases), the process's server that answers them
//! and its neighbours' asks, the neighbours asked in turn, the snapshot, and
//! the socket directory where they all meet. The front doors call into it,
//! handing it the process's allocator; it calls the allocator core.

pub mod export;
pub mod fork;
pub mod import;
pub mod neighbours;
pub mod server;
pub mod snapshot;
mod socket_dir;
mod wire;

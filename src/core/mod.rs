//! The allocator core: configuration, the pointer map, one pool per device
//! and the ordering that makes its reuse safe, statistics and the trace.
//! No FFI: the GPU is reached only through `cuda::gpu::Gpu`, so `cargo test`
//! runs all of it on a simulated GPU (`model`).

pub mod allocator;
pub mod config;
pub mod decay;
pub mod device;
pub mod edit_distance;
pub mod events;
pub mod libraries;
pub mod locks;
#[cfg(test)]
mod model;
#[cfg(test)]
mod model_tests;
pub mod output;
pub mod passthrough;
pub mod pending;
pub mod pool_slots;
pub mod ptrmap;
pub mod reclaimer;
pub mod shared_blocks;
pub mod stats;
pub mod streams;
pub mod trace;
pub mod turns;

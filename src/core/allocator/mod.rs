//! The allocator core: one per process, shared by every front door.
//!
//! It owns the pointer map, the per-device pools, the registry of
//! non-blocking streams (every free is ordered after them), the set of stream
//! captures in progress, and the peer-access grants. Front doors (the runtime
//! exports) decide *whether* a call is the pool's; the core does the pooling.
//!
//! One `Allocator` (`state`: its fields, construction and shared lookups),
//! its methods in one room per program event: `alloc`, `free` (and the
//! deferred frees, the reclaimer's steps), `streams` (and captures),
//! `device_life` (set-up, reset, peer access, fork), `ipc`, `give_back`
//! (memory back to the driver, for other processes), `report`.

pub mod alloc;
pub mod device_life;
pub mod free;
pub mod give_back;
pub mod ipc;
pub mod report;
pub mod state;
pub mod streams;

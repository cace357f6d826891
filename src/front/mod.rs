//! The front doors: what each exported function does with a call, and how
//! programs that link the runtime statically are handed the shim's driver
//! entry points (`dlsym`, `cuGetProcAddress`). They decide *whether* a call
//! is the pool's; `core` does the pooling.

pub mod caller;
pub mod dlsym;
pub mod driver_door;
pub mod guard;
pub mod hooks;
pub mod ipc;
pub mod ipc_server;
mod ipc_wire;
pub mod neighbours;
pub mod pointer_queries;
pub mod process;
pub mod runtime_door;
pub mod snapshot;
mod sockets;
pub mod work;

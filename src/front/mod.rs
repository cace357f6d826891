//! The front doors: what each exported function does with a call, and how
//! programs that link the runtime statically are handed the shim's driver
//! entry points (`dlsym`, `cuGetProcAddress`). They decide *whether* a call
//! is the pool's; `core` does the pooling, `peers` the talking to other
//! processes.

pub mod caller;
pub mod dlsym;
pub mod driver_door;
pub mod guard;
pub mod hooks;
pub mod pointer_queries;
pub mod process;
pub mod runtime_door;
pub mod work;

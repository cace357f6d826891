//! Access to the real CUDA libraries: the functions behind the hooks, found
//! in the libraries the program loaded (never loaded by the shim), and the
//! driver behind the core's `Gpu` interface.

pub mod driver;
pub mod gpu;
pub mod real;

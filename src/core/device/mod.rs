//! One device's pool (`pool`: set-up, allocation, teardown), the ordering
//! that makes its reuse safe (`ordering`), and what it gives back to the
//! driver unused (`release`).

pub mod ordering;
pub mod pool;
pub mod release;

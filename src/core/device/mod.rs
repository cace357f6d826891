//! One device's pool (`pool`: set-up, allocation, teardown), the ordering
//! that makes its reuse safe (`ordering`), what it gives back to the driver
//! unused (`release`), and how much it may hold (`budget`).

pub mod budget;
pub mod ordering;
pub mod pool;
pub mod release;

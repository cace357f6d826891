//! One device's pool (`pool`: set-up, allocation, teardown) and the
//! ordering that makes its reuse safe (`ordering`).

pub mod ordering;
pub mod pool;

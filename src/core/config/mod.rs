//! The `SOMA_*` configuration: one table, one parser. No FFI here.

pub mod parse;
pub mod settings;
pub mod variables;

//! The real NCCL: finding it, binding its symbols, its C types, and the typed calls the
//! library itself makes into it (marked so that NCCL's re-entry into our exports passes
//! straight through).
//!
//! This room owns every `dlopen`/`dlsym` the library makes; nothing else calls the dynamic
//! loader.

pub mod loader;
pub mod nonblocking;
pub mod real;
pub mod reentry;
pub mod symbol;
pub mod types;

pub use loader::{binding, BindError, RealNccl};
pub use symbol::Symbol;

//! The real NCCL: finding it, binding its symbols, and its C types.
//!
//! This room owns every `dlopen`/`dlsym` the library makes; nothing else calls the dynamic
//! loader.

pub mod loader;
pub mod symbol;
pub mod types;

pub use loader::{binding, BindError, RealNccl};
pub use symbol::Symbol;

//! The exported C functions: the whole NCCL API (2.18 through 2.32, every `ncclX` and its
//! `pncclX` twin), plus our own `stragglar*` extensions.
//!
//! Every export: a panic guard, NULL checks on its outputs, C enums carried as integers, our
//! outputs written only on success, forwarded results passed through bit for bit. The entry
//! points take raw pointers from C; each dereference carries its own `SAFETY:` argument.

#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod allreduce;
pub mod device_api;
pub mod device_twins;
pub mod errors;
pub mod extensions;
pub mod forward;
pub mod groups;
pub mod guard;
pub mod lifecycle;
pub mod passthrough;
pub mod redops;
pub mod result_text;
pub mod twins;

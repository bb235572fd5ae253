//! Reading `ncclConfig_t` the way NCCL does: only within the caller's `size` and `version`.

use std::os::raw::{c_int, c_uint};

use crate::nccl::types::{ncclConfig_t, NCCL_CONFIG_UNDEF_INT};

/// Byte offset of `blocking` in every `ncclConfig_t` layout since 2.14.
const BLOCKING_OFFSET: usize = 16;
/// The first NCCL version whose config has `blocking` (2.14.0).
const BLOCKING_SINCE: c_uint = 21400;

/// The `blocking` value a config asks for: `Some(true|false)`, or `None` when the config is NULL,
/// too short or too old to carry it, or leaves it unset (NCCL then uses its default, or the
/// parent's for split and shrink).
///
/// # Safety
/// `config` is NULL or points to at least `config->size` readable bytes (what NCCL requires).
pub unsafe fn requested_blocking(config: *const ncclConfig_t) -> Option<bool> {
    if config.is_null() {
        return None;
    }
    let base = config as *const u8;
    // SAFETY: `size` is the first field of every layout, so it is always readable.
    let size = unsafe { std::ptr::read_unaligned(base as *const usize) };
    if size < BLOCKING_OFFSET + std::mem::size_of::<c_int>() {
        return None;
    }
    // SAFETY: `version` (offset 12) and `blocking` (offset 16) lie within `size`, checked above.
    let (version, blocking) = unsafe {
        (
            std::ptr::read_unaligned(base.add(12) as *const c_uint),
            std::ptr::read_unaligned(base.add(BLOCKING_OFFSET) as *const c_int),
        )
    };
    if version < BLOCKING_SINCE || blocking == NCCL_CONFIG_UNDEF_INT {
        return None;
    }
    Some(blocking != 0)
}

/// The blocking mode NCCL gives a new communicator: `NCCL_COMM_BLOCKING` (`0` or `1`)
/// overrides everything; then the config's explicit value; then, for a split, shrink or grow
/// with a NULL config, the parent's mode; else blocking.
pub fn effective_blocking(
    nccl_comm_blocking: Option<&str>,
    requested: Option<bool>,
    config_is_null: bool,
    parent: Option<bool>,
) -> bool {
    match nccl_comm_blocking.map(str::trim) {
        Some("0") => return false,
        Some("1") => return true,
        _ => {}
    }
    match (requested, config_is_null, parent) {
        (Some(explicit), _, _) => explicit,
        (None, true, Some(inherited)) => inherited,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::types::NCCL_API_MAGIC;

    fn config(size: usize, version: c_uint, blocking: c_int) -> ncclConfig_t {
        // SAFETY: ncclConfig_t is plain data for which all-zero is a valid value.
        let mut c: ncclConfig_t = unsafe { std::mem::zeroed() };
        c.size = size;
        c.magic = NCCL_API_MAGIC;
        c.version = version;
        c.blocking = blocking;
        c
    }

    #[test]
    fn layout_matches_nccl() {
        assert_eq!(std::mem::size_of::<ncclConfig_t>(), 120);
        assert_eq!(
            std::mem::offset_of!(ncclConfig_t, blocking),
            BLOCKING_OFFSET
        );
        assert_eq!(std::mem::offset_of!(ncclConfig_t, version), 12);
    }

    #[test]
    fn reads_blocking_within_size_and_version() {
        let full = std::mem::size_of::<ncclConfig_t>();
        // SAFETY: every pointer below is NULL or points to a whole ncclConfig_t.
        unsafe {
            assert_eq!(requested_blocking(std::ptr::null()), None);
            assert_eq!(requested_blocking(&config(full, 23203, 0)), Some(false));
            assert_eq!(requested_blocking(&config(full, 23203, 1)), Some(true));
            assert_eq!(
                requested_blocking(&config(full, 23203, NCCL_CONFIG_UNDEF_INT)),
                None
            );
            assert_eq!(
                requested_blocking(&config(48, 21700, 0)),
                Some(false),
                "2.17 layout"
            );
            assert_eq!(
                requested_blocking(&config(full, 21300, 0)),
                None,
                "before 2.14"
            );
            assert_eq!(requested_blocking(&config(16, 23203, 0)), None, "too short");
        }
    }

    #[test]
    fn precedence_is_environment_config_parent_default() {
        assert!(effective_blocking(None, None, true, None));
        assert!(!effective_blocking(None, Some(false), false, Some(true)));
        assert!(
            !effective_blocking(None, None, true, Some(false)),
            "NULL config inherits"
        );
        assert!(
            effective_blocking(None, None, false, Some(false)),
            "an unset field takes the default"
        );
        assert!(
            !effective_blocking(Some("0"), Some(true), false, None),
            "the environment wins"
        );
        assert!(effective_blocking(Some("1"), Some(false), false, None));
        assert!(
            !effective_blocking(Some("x"), Some(false), false, None),
            "an invalid value is ignored"
        );
    }
}

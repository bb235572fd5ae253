//! Whether NCCL would run its NVLink SHARP (NVLS) AllReduce on this rank: the fact the policy's
//! model needs to price NCCL before the engine has measured it (`Policy::with_nvls_baseline`).
//! Each rank states it in its setup record, and a communicator's model prices NVLS only where
//! every rank does, so every rank's prior is the same.

use super::driver::Device;

/// Whether NCCL would run NVLS for AllReduce on `device` in this process: a Hopper or later
/// GPU that supports multicast (which NVLS needs, and which only NVSwitch systems give), with
/// `NCCL_NVLS_ENABLE` and `NCCL_ALGO` allowing it. A driver that cannot say counts as no.
pub fn nccl_would_run_nvls(device: &Device) -> bool {
    use cudarc::driver::sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
    };
    let hopper = device
        .attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .is_ok_and(|major| major >= 9);
    let multicast = device
        .attribute(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)
        .is_ok_and(|v| v == 1);
    hopper
        && multicast
        && nvls_enabled(std::env::var("NCCL_NVLS_ENABLE").ok().as_deref())
        && algo_allows_nvls(std::env::var("NCCL_ALGO").ok().as_deref())
}

/// `NCCL_NVLS_ENABLE`: NVLS is on unless it is `0` (NCCL's default is 2, on where supported).
pub fn nvls_enabled(value: Option<&str>) -> bool {
    value.is_none_or(|v| v.trim() != "0")
}

/// Whether `NCCL_ALGO` leaves NVLS to AllReduce. The value is a list of algorithms (`Ring,Tree`),
/// or the algorithms to leave out behind a `^` (`^NVLS`, which PyTorch sets in deterministic
/// mode), or such lists per collective (`allreduce:tree,ring;broadcast:ring`); names are
/// matched without case, and `NVLSTree` is another algorithm. Unset, or naming nothing for
/// AllReduce: allowed.
pub fn algo_allows_nvls(value: Option<&str>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let mut allowed = true;
    for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let list = match part.split_once(':') {
            Some((collective, list)) if collective.trim().eq_ignore_ascii_case("allreduce") => list,
            Some(_) => continue,
            None => part,
        };
        let (excluding, list) = match list.trim().strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, list),
        };
        let names_nvls = list
            .split(',')
            .any(|name| name.trim().eq_ignore_ascii_case("nvls"));
        allowed = names_nvls != excluding;
    }
    allowed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_algo_is_read_as_nccl_reads_it() {
        for (value, allowed) in [
            (None, true),
            (Some(""), true),
            (Some("^NVLS"), false),
            (Some("^nvls,tree"), false),
            (Some("^NVLSTree"), true),
            (Some("Ring,Tree"), false),
            (Some("NVLS,Ring"), true),
            (Some("NVLSTree"), false),
            (Some("allreduce:tree,ring;broadcast:ring"), false),
            (Some("broadcast:ring"), true),
            (Some("AllReduce:^ring ; broadcast:nvls"), true),
            (Some("allreduce:^nvls"), false),
        ] {
            assert_eq!(algo_allows_nvls(value), allowed, "{value:?}");
        }
    }

    #[test]
    fn nvls_enable_zero_turns_it_off() {
        assert!(nvls_enabled(None));
        assert!(nvls_enabled(Some("2")));
        assert!(nvls_enabled(Some("1")));
        assert!(!nvls_enabled(Some("0")));
    }
}

//! The per-device cap on staging memory (`STRAGGLAR_STAGING_CAP`): the GPU engine allocates
//! staging only for communicators that make eligible calls, and never more than the cap on one
//! device, so a job with many communicators cannot exhaust a GPU behind the user's back. A rank
//! over the cap fails its setup locally, which the setup turns into the same refusal on every
//! rank.

use std::collections::HashMap;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

/// Staging bytes in use per CUDA device ordinal, against one cap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StagingBudget {
    used: HashMap<i32, u64>,
}

/// A reservation the cap refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap {
    pub device: i32,
    /// Bytes asked for.
    pub bytes: u64,
    /// Bytes already in use on the device.
    pub used: u64,
    pub cap: u64,
}

impl std::fmt::Display for OverCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} MiB of staging on device {} would exceed STRAGGLAR_STAGING_CAP ({} of {} MiB in use)",
            self.bytes >> 20,
            self.device,
            self.used >> 20,
            self.cap >> 20
        )
    }
}

impl StagingBudget {
    /// Reserves `bytes` on `device` if they fit under `cap` with what is in use; returns the
    /// bytes in use after it.
    pub fn reserve(&mut self, device: i32, bytes: u64, cap: u64) -> Result<u64, OverCap> {
        let used = self.used.entry(device).or_default();
        match used.checked_add(bytes) {
            Some(total) if total <= cap => {
                *used = total;
                Ok(total)
            }
            _ => Err(OverCap {
                device,
                bytes,
                used: *used,
                cap,
            }),
        }
    }

    /// Returns `bytes` reserved earlier on `device`.
    pub fn release(&mut self, device: i32, bytes: u64) {
        if let Some(used) = self.used.get_mut(&device) {
            *used = used.saturating_sub(bytes);
        }
    }

    /// Bytes in use on `device`.
    pub fn used(&self, device: i32) -> u64 {
        self.used.get(&device).copied().unwrap_or(0)
    }
}

/// Staging in use per device, against `STRAGGLAR_STAGING_CAP`.
static BUDGET: Lazy<Mutex<StagingBudget>> = Lazy::new(Default::default);

/// Staging bytes in use on `device`.
pub fn used(device: i32) -> u64 {
    BUDGET.lock().used(device)
}

/// Staging bytes counted against a device's cap until dropped (with the staging it counts:
/// an aborted communicator's once every peer released it).
pub struct Reservation {
    device: i32,
    bytes: u64,
}

impl Reservation {
    /// Reserves `bytes` on `device`, or says why not (at WARN, for each communicator refused).
    pub fn take(device: i32, bytes: u64) -> Option<Reservation> {
        match Self::try_take(device, bytes) {
            Ok(reservation) => Some(reservation),
            Err(over) => {
                log::warn!("{over}: this communicator stays on NCCL");
                None
            }
        }
    }

    /// Reserves `bytes` on `device`, or returns why not (the caller says it).
    pub fn try_take(device: i32, bytes: u64) -> Result<Reservation, OverCap> {
        let cap = crate::config::get().staging_cap;
        BUDGET
            .lock()
            .reserve(device, bytes, cap)
            .map(|_| Reservation { device, bytes })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        BUDGET.lock().release(self.device, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_under_the_cap_per_device() {
        let mut b = StagingBudget::default();
        assert_eq!(b.reserve(0, 600, 1000), Ok(600));
        assert_eq!(b.reserve(1, 600, 1000), Ok(600), "devices are apart");
        let refused = b.reserve(0, 600, 1000).unwrap_err();
        assert_eq!((refused.used, refused.cap), (600, 1000));
        assert!(refused.to_string().contains("STRAGGLAR_STAGING_CAP"));
        assert_eq!(b.used(0), 600, "a refusal reserves nothing");
        b.release(0, 600);
        assert_eq!(b.reserve(0, 1000, 1000), Ok(1000), "exactly the cap fits");
        assert!(b.reserve(0, u64::MAX, u64::MAX).is_err(), "no overflow");
        b.release(7, 5);
        assert_eq!(b.used(7), 0);
    }
}

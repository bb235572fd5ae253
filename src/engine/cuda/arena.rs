//! A pair of arenas grown apart from a rank's staging (`super::growth`): its device memory,
//! exported to the peers, and its bytes counted against the device's `STRAGGLAR_STAGING_CAP`
//! while it lives.

use std::sync::Arc;

use super::budget::Reservation;
use super::driver::{Device, DeviceMemory};
use super::staging::ArenaLayout;

/// A pair of arenas grown apart from the staging, counted against the device's cap while it
/// lives.
pub struct GrownArena {
    memory: DeviceMemory,
    _reservation: Reservation,
}

impl GrownArena {
    /// Reserves and allocates (zeroed) an allocation of `arenas`.
    pub fn allocate(device: &Arc<Device>, arenas: ArenaLayout) -> Result<GrownArena, String> {
        let bytes = arenas.allocation_bytes();
        let reservation =
            Reservation::try_take(device.ordinal, bytes).map_err(|o| o.to_string())?;
        let memory = DeviceMemory::zeroed(device, bytes as usize).map_err(|e| e.to_string())?;
        Ok(GrownArena {
            memory,
            _reservation: reservation,
        })
    }

    /// The IPC handle a peer opens it with.
    pub fn ipc_handle(&self) -> Result<[u8; 64], String> {
        self.memory.ipc_handle().map_err(|e| e.to_string())
    }

    /// The allocation's device address in this process.
    pub fn ptr(&self) -> u64 {
        self.memory.ptr
    }
}

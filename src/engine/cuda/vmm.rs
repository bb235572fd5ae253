//! Memory of the driver's virtual memory API and NVLink multicast objects, wrapped with
//! ownership as `driver` wraps the rest: a [`Physical`] allocation or [`MulticastObject`] is
//! released on drop, a [`VirtualMapping`] unmapped and its addresses freed, each with its device's
//! context current.
//!
//! Such memory is shared between processes as POSIX file descriptors (`cuIpcGetMemHandle`
//! cannot export it); `multicast::fds` passes them. Sizes are multiples of the granularities the
//! driver gives ([`allocation_granularity`], [`multicast_granularity`]).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{check, Device, GpuError};

/// The handle type every allocation and object here is made shareable as.
const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Pinned device memory of `device`, shareable as a POSIX fd.
fn device_memory(device: &Device) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: POSIX_FD,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device.device_handle(),
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn multicast_prop(devices: u32, bytes: usize) -> sys::CUmulticastObjectProp {
    sys::CUmulticastObjectProp {
        numDevices: devices,
        size: bytes,
        handleTypes: POSIX_FD.0 as u64,
        flags: 0,
    }
}

/// The minimum granularity of `device`'s shareable allocations, bytes.
pub fn allocation_granularity(device: &Device) -> Result<usize, GpuError> {
    let _current = device.current()?;
    let prop = device_memory(device);
    let mut granularity = 0usize;
    // SAFETY: valid property and output pointers for the duration of the call.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(granularity)
}

/// The minimum granularity of a multicast object for `devices` devices, bytes.
pub fn multicast_granularity(device: &Device, devices: u32) -> Result<usize, GpuError> {
    let _current = device.current()?;
    let prop = multicast_prop(devices, 0);
    let mut granularity = 0usize;
    // SAFETY: valid property and output pointers for the duration of the call.
    check("cuMulticastGetGranularity", unsafe {
        sys::cuMulticastGetGranularity(
            &mut granularity,
            &prop,
            sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(granularity)
}

/// Exports a handle as a POSIX fd, which the caller owns.
fn export_fd(device: &Device, handle: u64) -> Result<OwnedFd, GpuError> {
    let _current = device.current()?;
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: the driver writes one int (the fd) through the pointer.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut std::ffi::c_int).cast(),
            handle,
            POSIX_FD,
            0,
        )
    })?;
    // SAFETY: a successful export returns a new fd this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Imports a handle from a POSIX fd (which stays the caller's).
fn import_fd(device: &Device, fd: BorrowedFd<'_>) -> Result<u64, GpuError> {
    let _current = device.current()?;
    let mut handle = 0u64;
    // SAFETY: the fd is open for the duration of the call; the driver dups what it keeps.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut handle,
            fd.as_raw_fd() as isize as *mut std::ffi::c_void,
            POSIX_FD,
        )
    })?;
    Ok(handle)
}

fn release(device: &Device, handle: u64) {
    if let Ok(_current) = device.current() {
        // SAFETY: `handle` came from cuMemCreate, cuMulticastCreate or an import, and is
        // released once, by its owner's drop.
        let _ = unsafe { sys::cuMemRelease(handle) };
    }
}

/// A physical allocation of `bytes` on one device (`cuMemCreate`), shareable as a POSIX fd.
pub struct Physical {
    device: Arc<Device>,
    handle: u64,
    pub bytes: usize,
}

impl Physical {
    /// Allocates `bytes` (a multiple of [`allocation_granularity`]) on `device`.
    pub fn create(device: &Arc<Device>, bytes: usize) -> Result<Physical, GpuError> {
        let _current = device.current()?;
        let prop = device_memory(device);
        let mut handle = 0u64;
        // SAFETY: valid property and output pointers for the duration of the call.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, bytes, &prop, 0)
        })?;
        Ok(Physical {
            device: device.clone(),
            handle,
            bytes,
        })
    }

    /// Maps it at addresses of its own, readable and writable by this device.
    pub fn map(&self) -> Result<VirtualMapping, GpuError> {
        VirtualMapping::new(&self.device, self.handle, self.bytes)
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        release(&self.device, self.handle);
    }
}

/// A multicast object: one range of addresses whose stores (`multimem.st`) reach the memory
/// every member device bound to it. Created by one rank for `devices` devices and imported by
/// the others; every member adds its own device before anyone binds (binds and maps block
/// until the team is complete). Dropped: this device's binding is undone and the handle
/// released.
pub struct MulticastObject {
    device: Arc<Device>,
    handle: u64,
    pub bytes: usize,
    /// The bytes this device bound, from offset 0, once bound.
    bound: Option<usize>,
}

impl MulticastObject {
    /// Creates an object for `devices` devices of `bytes` each (a multiple of
    /// [`multicast_granularity`]), shareable as a POSIX fd.
    pub fn create(
        device: &Arc<Device>,
        devices: u32,
        bytes: usize,
    ) -> Result<MulticastObject, GpuError> {
        let _current = device.current()?;
        let prop = multicast_prop(devices, bytes);
        let mut handle = 0u64;
        // SAFETY: valid property and output pointers for the duration of the call.
        check("cuMulticastCreate", unsafe {
            sys::cuMulticastCreate(&mut handle, &prop)
        })?;
        Ok(Self::owning(device, handle, bytes))
    }

    /// Imports the object another rank exported as `fd`, of `bytes` per device.
    pub fn import(
        device: &Arc<Device>,
        fd: BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<MulticastObject, GpuError> {
        let handle = import_fd(device, fd)?;
        Ok(Self::owning(device, handle, bytes))
    }

    fn owning(device: &Arc<Device>, handle: u64, bytes: usize) -> MulticastObject {
        MulticastObject {
            device: device.clone(),
            handle,
            bytes,
            bound: None,
        }
    }

    /// A POSIX fd for the object, for a peer to import.
    pub fn export(&self) -> Result<OwnedFd, GpuError> {
        export_fd(&self.device, self.handle)
    }

    /// Adds this device to the team.
    pub fn add_device(&self) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: a live multicast handle and this process's device handle.
        check("cuMulticastAddDevice", unsafe {
            sys::cuMulticastAddDevice(self.handle, self.device.device_handle())
        })
    }

    /// Binds all of `memory` (this device's, as large as the object) at offset 0. Blocks until
    /// every device of the team was added: call it only once every member said it added its own.
    pub fn bind(&mut self, memory: &Physical) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: live handles; offsets 0 and the size are within both (checked by the driver).
        check("cuMulticastBindMem", unsafe {
            sys::cuMulticastBindMem(self.handle, 0, memory.handle, 0, memory.bytes, 0)
        })?;
        self.bound = Some(memory.bytes);
        Ok(())
    }

    /// Maps the object at addresses of its own, for this device. Blocks as [`bind`] does.
    ///
    /// [`bind`]: MulticastObject::bind
    pub fn map(&self) -> Result<VirtualMapping, GpuError> {
        VirtualMapping::new(&self.device, self.handle, self.bytes)
    }
}

impl Drop for MulticastObject {
    fn drop(&mut self) {
        if let (Some(bytes), Ok(_current)) = (self.bound, self.device.current()) {
            // SAFETY: undoes this device's own binding, made by `bind`, once.
            let _ = unsafe {
                sys::cuMulticastUnbind(self.handle, self.device.device_handle(), 0, bytes)
            };
        }
        release(&self.device, self.handle);
    }
}

/// A handle mapped at a range of reserved addresses with read-write access for its device;
/// unmapped and the addresses freed on drop. The handle's owner must outlive it.
pub struct VirtualMapping {
    device: Arc<Device>,
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl VirtualMapping {
    fn new(device: &Arc<Device>, handle: u64, bytes: usize) -> Result<VirtualMapping, GpuError> {
        let _current = device.current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: an output pointer; the driver picks the addresses.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0)
        })?;
        let free = |ptr| {
            // SAFETY: frees the range reserved just above, once.
            let _ = unsafe { sys::cuMemAddressFree(ptr, bytes) };
        };
        // SAFETY: maps the live handle over the whole reserved range.
        if let Err(e) = check("cuMemMap", unsafe {
            sys::cuMemMap(ptr, bytes, 0, handle, 0)
        }) {
            free(ptr);
            return Err(e);
        }
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device.device_handle(),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor.
        if let Err(e) = check("cuMemSetAccess", unsafe {
            sys::cuMemSetAccess(ptr, bytes, &access, 1)
        }) {
            // SAFETY: undoes the map above.
            let _ = unsafe { sys::cuMemUnmap(ptr, bytes) };
            free(ptr);
            return Err(e);
        }
        Ok(VirtualMapping {
            device: device.clone(),
            ptr,
            bytes,
        })
    }
}

impl VirtualMapping {
    /// Copies the first `out.len()` bytes of the mapping to the host (synchronously, with the
    /// device's work queued before it done); never for a multicast mapping, whose addresses
    /// take multimem operations only.
    pub fn read(&self, out: &mut [u8]) -> Result<(), GpuError> {
        if out.len() > self.bytes {
            return Err(GpuError {
                call: "cuMemcpyDtoH",
                detail: format!("{} bytes from a mapping of {}", out.len(), self.bytes),
            });
        }
        let _current = self.device.current()?;
        // SAFETY: `out` is writable for its length, which lies within the mapped range.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, out.len())
        })
    }
}

impl Drop for VirtualMapping {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: unmaps and frees the range `new` mapped, once.
            let _ = unsafe { sys::cuMemUnmap(self.ptr, self.bytes) };
            // SAFETY: as above.
            let _ = unsafe { sys::cuMemAddressFree(self.ptr, self.bytes) };
        }
    }
}

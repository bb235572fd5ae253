//! The few CUDA driver calls the GPU engine makes, wrapped with ownership (every allocation,
//! module, stream and IPC mapping is released on drop with its context current) and errors as
//! values. The driver is reached through cudarc's dynamically loaded bindings, and only after
//! `crate::gpu::probe` said it loads, so a machine without CUDA never aborts here.
//!
//! Every call runs with the device's primary context pushed for the duration of a
//! [`Current`] guard and popped afterwards, so the caller's current context is restored.

use std::ffi::{c_uint, c_void};
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{result, sys};

/// A failed driver call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuError {
    /// What was being done.
    pub call: &'static str,
    /// The driver's error name, or why the call could not be made.
    pub detail: String,
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.detail)
    }
}

impl std::error::Error for GpuError {}

pub(super) fn check(call: &'static str, code: sys::CUresult) -> Result<(), GpuError> {
    wrap(call, code.result())
}

fn wrap<T>(call: &'static str, r: Result<T, result::DriverError>) -> Result<T, GpuError> {
    r.map_err(|e| GpuError {
        call,
        detail: format!("{e:?}"),
    })
}

/// One GPU, through its primary context (shared with the CUDA runtime, PyTorch included).
pub struct Device {
    pub ordinal: i32,
    device: sys::CUdevice,
    context: sys::CUcontext,
    /// A non-blocking stream of our own for every copy, fill and word the host makes (setup's
    /// zeroing and uploads, a failure mark, the drain at teardown): never ordered after the
    /// caller's streams, so a kernel of ours that spins on the caller's stream, even a blocking
    /// one or the legacy stream, cannot hold it, and no capture in progress sees it.
    /// Created at first use: a failure to create it fails that use (a local failure of the
    /// setup, which its peers still learn of), never the opening of the device.
    side: once_cell::sync::OnceCell<sys::CUstream>,
    /// Peers' mappings this process could not close (`cuIpcCloseMemHandle` failed, or the
    /// context could not be made current: it is lost). Never decreases.
    unclosed: std::sync::atomic::AtomicUsize,
}

// SAFETY: a CUcontext, CUdevice and CUstream are process-wide handles the driver lets any
// thread use.
unsafe impl Send for Device {}
// SAFETY: as above; every use pushes the context on the calling thread.
unsafe impl Sync for Device {}

impl Device {
    /// Initialises the driver (it must be loadable: see `crate::gpu::probe`) and retains the
    /// primary context of GPU `ordinal`.
    pub fn open(ordinal: i32) -> Result<Arc<Device>, GpuError> {
        wrap("cuInit", result::init())?;
        let device = wrap("cuDeviceGet", result::device::get(ordinal))?;
        // SAFETY: `device` is a valid device handle from cuDeviceGet; released in Drop.
        let context = wrap("cuDevicePrimaryCtxRetain", unsafe {
            result::primary_ctx::retain(device)
        })?;
        Ok(Arc::new(Device {
            ordinal,
            device,
            context,
            side: once_cell::sync::OnceCell::new(),
            unclosed: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    /// The side stream, created on first use.
    fn side(&self) -> Result<sys::CUstream, GpuError> {
        self.side
            .get_or_try_init(|| {
                let _current = self.current()?;
                wrap(
                    "cuStreamCreate",
                    result::stream::create(result::stream::StreamKind::NonBlocking),
                )
            })
            .copied()
    }

    /// The side stream, for a launch of our own that must not follow the caller's work (the
    /// setup's peer probe).
    pub fn side_stream(&self) -> Result<sys::CUstream, GpuError> {
        self.side()
    }

    /// Waits for what the host queued on the side stream (nothing of the caller's).
    pub fn synchronize_side(&self) -> Result<(), GpuError> {
        let side = self.side()?;
        let _current = self.current()?;
        // SAFETY: the side stream lives as long as `self`.
        wrap("cuStreamSynchronize", unsafe {
            result::stream::synchronize(side)
        })
    }

    /// Whether this device's context is lost: a kernel's fault (an illegal address or
    /// instruction, a failed launch, a device-side assert) is sticky, and every later call of
    /// the context returns it, which a query of the side stream shows without waiting.
    pub fn context_lost(&self) -> bool {
        use sys::CUresult as R;
        let Ok(side) = self.side() else {
            return false;
        };
        let Ok(_current) = self.current() else {
            return true;
        };
        // SAFETY: the side stream lives as long as `self`.
        let r = unsafe { sys::cuStreamQuery(side) };
        matches!(
            r,
            R::CUDA_ERROR_ILLEGAL_ADDRESS
                | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | R::CUDA_ERROR_MISALIGNED_ADDRESS
                | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
                | R::CUDA_ERROR_INVALID_PC
                | R::CUDA_ERROR_HARDWARE_STACK_ERROR
                | R::CUDA_ERROR_LAUNCH_FAILED
                | R::CUDA_ERROR_ASSERT
        )
    }

    /// Whether every peer's mapping this process opened on this device and dropped was
    /// closed: only then may it tell a peer that it let go of the peer's memory (freeing
    /// exported memory that a process still maps is undefined behaviour; a lost context keeps
    /// its mappings until the process ends).
    pub fn closed_every_mapping(&self) -> bool {
        self.unclosed.load(std::sync::atomic::Ordering::Acquire) == 0
    }

    /// Makes this device current on the calling thread until the guard drops.
    pub fn current(&self) -> Result<Current<'_>, GpuError> {
        // SAFETY: the context is retained for the life of `self`.
        check("cuCtxPushCurrent", unsafe {
            sys::cuCtxPushCurrent_v2(self.context)
        })?;
        Ok(Current { _device: self })
    }

    /// The driver's handle of this device (its ordinal among the visible devices).
    pub fn device_handle(&self) -> sys::CUdevice {
        self.device
    }

    /// The device's primary context, for the driver calls that name one.
    pub fn context(&self) -> sys::CUcontext {
        self.context
    }

    /// A device attribute.
    pub fn attribute(&self, attribute: sys::CUdevice_attribute) -> Result<i32, GpuError> {
        // SAFETY: a valid device handle and attribute enum.
        wrap("cuDeviceGetAttribute", unsafe {
            result::device::get_attribute(self.device, attribute)
        })
    }

    /// `sm_XY` of this device.
    pub fn arch(&self) -> Result<String, GpuError> {
        use sys::CUdevice_attribute::*;
        let major = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Ok(format!("sm_{major}{minor}"))
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> Result<i32, GpuError> {
        self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }

    /// The device's name.
    pub fn name(&self) -> Result<String, GpuError> {
        wrap("cuDeviceGetName", result::device::get_name(self.device))
    }

    /// The device's UUID.
    pub fn uuid(&self) -> Result<[u8; 16], GpuError> {
        let uuid = wrap("cuDeviceGetUuid", result::device::get_uuid(self.device))?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// The device's PCI bus id (`domain:bus:device.function`, as `nvidia-smi` prints it).
    pub fn pci_bus_id(&self) -> Result<String, GpuError> {
        let mut id = [0 as std::ffi::c_char; 32];
        // SAFETY: `id` is writable for the length given; the driver writes a NUL-terminated
        // string into it.
        check("cuDeviceGetPCIBusId", unsafe {
            sys::cuDeviceGetPCIBusId(id.as_mut_ptr(), id.len() as i32, self.device)
        })?;
        let bytes: Vec<u8> = id
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Whether this GPU's atomics on the memory of the GPU with `peer_uuid` are native (the
    /// arrival tickets are system-scope atomics on rank 0's staging): `Some(true)` for this
    /// GPU itself, `None` when that GPU is not visible to this process.
    pub fn native_atomics_with(&self, peer_uuid: &[u8; 16]) -> Result<Option<bool>, GpuError> {
        if &self.uuid()? == peer_uuid {
            return Ok(Some(true));
        }
        for ordinal in 0..wrap("cuDeviceGetCount", result::device::get_count())? {
            let peer = wrap("cuDeviceGet", result::device::get(ordinal))?;
            let uuid = wrap("cuDeviceGetUuid", result::device::get_uuid(peer))?;
            if uuid.bytes.map(|b| b as u8) != *peer_uuid {
                continue;
            }
            let mut value = 0;
            // SAFETY: two valid device handles and a writable output.
            check("cuDeviceGetP2PAttribute", unsafe {
                sys::cuDeviceGetP2PAttribute(
                    &mut value,
                    sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                    self.device,
                    peer,
                )
            })?;
            return Ok(Some(value != 0));
        }
        Ok(None)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let (Some(&side), Ok(_current)) = (self.side.get(), self.current()) {
            // SAFETY: created in `side`, destroyed once here, before the context goes.
            let _ = unsafe { result::stream::destroy(side) };
        }
        // SAFETY: retained in `open`, released once here.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// The device's context, current on this thread while alive.
pub struct Current<'a> {
    _device: &'a Device,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context this guard pushed, restoring the caller's.
        let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    }
}

/// Device memory from `cuMemAlloc`, zeroed at allocation.
pub struct DeviceMemory {
    device: Arc<Device>,
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DeviceMemory {
    /// Whether this memory is `device`'s.
    pub fn is_on(&self, device: &Arc<Device>) -> bool {
        Arc::ptr_eq(&self.device, device)
    }

    /// Allocates `bytes` (at least 1) and zeroes them, synchronously: the memory is ready for
    /// peers (and for IPC export) when this returns.
    pub fn zeroed(device: &Arc<Device>, bytes: usize) -> Result<DeviceMemory, GpuError> {
        let memory = Self::for_upload(device, bytes)?;
        let _current = device.current()?;
        let ptr = memory.ptr;
        let side = device.side()?;
        // SAFETY: `ptr` is a live allocation of `memory.bytes` bytes; the side stream is live.
        wrap("cuMemsetD8Async", unsafe {
            result::memset_d8_async(ptr, 0, memory.bytes, side)
        })?;
        device.synchronize_side()?;
        Ok(memory)
    }

    /// Allocates `bytes` (at least 1) without writing them: for memory that [`upload`] fills
    /// whole before anything reads it (one copy and one wait, where `zeroed` then `upload`
    /// would take two of each).
    ///
    /// [`upload`]: DeviceMemory::upload
    pub fn for_upload(device: &Arc<Device>, bytes: usize) -> Result<DeviceMemory, GpuError> {
        let _current = device.current()?;
        // SAFETY: the device's context is current.
        let ptr = wrap("cuMemAlloc", unsafe { result::malloc_sync(bytes.max(1)) })?;
        Ok(DeviceMemory {
            device: device.clone(),
            ptr,
            bytes: bytes.max(1),
        })
    }

    /// Copies `data` to the start of this memory and waits for the copy.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<(), GpuError> {
        assert!(
            std::mem::size_of_val(data) <= self.bytes,
            "upload larger than the allocation"
        );
        if data.is_empty() {
            return Ok(());
        }
        let _current = self.device.current()?;
        let side = self.device.side()?;
        // SAFETY: the destination holds at least `size_of_val(data)` bytes (asserted); `data`
        // outlives the copy, which is waited for below (a copy from pageable memory may return
        // before its DMA lands).
        wrap("cuMemcpyHtoDAsync", unsafe {
            result::memcpy_htod_async(self.ptr, data, side)
        })?;
        self.device.synchronize_side()
    }

    /// Writes `value` at byte `offset` (4-byte aligned) on the device's side stream, without
    /// waiting for it to land (a signal to peers: nothing the caller queued delays it).
    pub fn post_u32(&self, offset: u64, value: u32) -> Result<(), GpuError> {
        assert!(
            offset % 4 == 0 && offset + 4 <= self.bytes as u64,
            "a word inside the allocation"
        );
        let _current = self.device.current()?;
        let side = self.device.side()?;
        // SAFETY: the word lies inside this live allocation (asserted); the device's side
        // stream lives as long as the device, which this memory holds.
        let r = unsafe { sys::cuMemsetD32Async(self.ptr + offset, value, 1, side) };
        wrap("cuMemsetD32Async", r.result())
    }

    /// Reads the `u32` at byte `offset` (4-byte aligned).
    pub fn read_u32(&self, offset: u64) -> Result<u32, GpuError> {
        assert!(
            offset % 4 == 0 && offset + 4 <= self.bytes as u64,
            "a word inside the allocation"
        );
        // SAFETY: the word lies inside this live allocation (asserted).
        unsafe { read_word(&self.device, self.ptr + offset) }
    }

    /// Copies the start of this memory into `out` and waits for the copy.
    pub fn download<T: Copy>(&self, out: &mut [T]) -> Result<(), GpuError> {
        assert!(
            std::mem::size_of_val(out) <= self.bytes,
            "download larger than the allocation"
        );
        if out.is_empty() {
            return Ok(());
        }
        let _current = self.device.current()?;
        let side = self.device.side()?;
        // SAFETY: the source holds at least `size_of_val(out)` bytes (asserted); `out` outlives
        // the copy, which is waited for below.
        wrap("cuMemcpyDtoHAsync", unsafe {
            result::memcpy_dtoh_async(out, self.ptr, side)
        })?;
        self.device.synchronize_side()
    }

    /// The IPC handle another process opens with [`PeerMapping::open`].
    pub fn ipc_handle(&self) -> Result<[u8; 64], GpuError> {
        let _current = self.device.current()?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `handle` is writable; `ptr` is the base of a plain cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(&mut handle, self.ptr)
        })?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: allocated by cuMemAlloc in `zeroed`, freed once here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A peer's staging as this rank reaches it: another process's allocation opened through its
/// IPC handle (closed on drop), or an allocation of this same process addressed as it is
/// (ranks as threads of one process: a process cannot open its own IPC handles).
pub struct PeerMapping {
    device: Arc<Device>,
    pub ptr: sys::CUdeviceptr,
    /// Opened through IPC here, so closed on drop.
    opened: bool,
}

impl PeerMapping {
    /// Opens `handle` (from [`DeviceMemory::ipc_handle`] in another process) on `device`.
    pub fn open(device: &Arc<Device>, handle: &[u8; 64]) -> Result<PeerMapping, GpuError> {
        let _current = device.current()?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is writable; the handle's bytes came from cuIpcGetMemHandle.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                handle,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint,
            )
        })?;
        Ok(PeerMapping {
            device: device.clone(),
            ptr,
            opened: true,
        })
    }

    /// The allocation at `ptr` of this process on `device`, reached as a peer's staging; it
    /// must outlive the mapping's last use (dropping the mapping frees nothing).
    pub fn same_process(device: &Arc<Device>, ptr: sys::CUdeviceptr) -> PeerMapping {
        PeerMapping {
            device: device.clone(),
            ptr,
            opened: false,
        }
    }
}

impl PeerMapping {
    /// Writes `value` to the `u32` at `offset` (4-byte aligned) in the mapped allocation, on
    /// the device's side stream: a later [`read_u32`](PeerMapping::read_u32), on the same
    /// stream, sees it.
    pub fn write_u32(&self, offset: u64, value: u32) -> Result<(), GpuError> {
        assert!(offset % 4 == 0, "an aligned word");
        let _current = self.device.current()?;
        let side = self.device.side()?;
        // SAFETY: the mapping is open; the caller's offset lies inside the peer's staging,
        // whose layout every rank shares; the side stream lives as long as the device.
        let r = unsafe { sys::cuMemsetD32Async(self.ptr + offset, value, 1, side) };
        wrap("cuMemsetD32Async", r.result())
    }

    /// Reads the `u32` at `offset` in the mapped allocation (a synchronous round trip to the
    /// peer's memory).
    pub fn read_u32(&self, offset: u64) -> Result<u32, GpuError> {
        // SAFETY: the mapping is open; the caller's offset lies inside the peer's staging,
        // whose layout every rank shares.
        unsafe { read_word(&self.device, self.ptr + offset) }
    }
}

impl Drop for PeerMapping {
    /// Closes the mapping once the side stream's writes into it have landed (a write still
    /// queued would otherwise hit a closed mapping: an illegal address on a GPU).
    fn drop(&mut self) {
        let _ = self.device.synchronize_side();
        if !self.opened {
            return;
        }
        let closed = self.device.current().is_ok_and(|_current| {
            // SAFETY: opened by cuIpcOpenMemHandle in `open`, closed once here.
            unsafe { sys::cuIpcCloseMemHandle(self.ptr) }
                .result()
                .is_ok()
        });
        if !closed {
            self.device
                .unclosed
                .fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }
}

/// `u32` words in pinned host memory that kernels read and write through a device address:
/// the abort word (host writes, kernels poll) and the status word (kernels write, host reads).
pub struct HostWords {
    device: Arc<Device>,
    host: *mut u32,
    device_ptr: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the words are plain memory accessed only through atomics (see `word`).
unsafe impl Send for HostWords {}
// SAFETY: as above.
unsafe impl Sync for HostWords {}

impl HostWords {
    /// `len` zeroed words, mapped into the device's address space.
    pub fn new(device: &Arc<Device>, len: usize) -> Result<HostWords, GpuError> {
        let _current = device.current()?;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        let bytes = len.max(1) * 4;
        // SAFETY: a fresh pinned allocation; freed in Drop.
        let host = wrap("cuMemHostAlloc", unsafe {
            result::malloc_host(bytes, flags)
        })?;
        // SAFETY: `host` holds `bytes` writable bytes.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a DEVICEMAP allocation of this context.
        let mapped = check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host, 0)
        });
        let words = HostWords {
            device: device.clone(),
            host: host.cast(),
            device_ptr,
            len: len.max(1),
        };
        mapped.map(|()| words)
    }

    /// Word `i`, for atomic access from the host.
    pub fn word(&self, i: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(i < self.len);
        // SAFETY: in bounds, 4-byte aligned (pinned allocations are page aligned), and alive
        // as long as `self`; the GPU accesses it only with volatile or atomic operations.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.host.add(i)) }
    }

    /// The 64-bit word made of words `2 * i` and `2 * i + 1`, for atomic access from the host.
    pub fn word64(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(2 * i + 1 < self.len);
        // SAFETY: in bounds, 8-byte aligned (page-aligned base, even word index), alive as
        // long as `self`; the GPU accesses it only with atomic or release/acquire operations.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.host.add(2 * i).cast()) }
    }

    /// The device address of word `i`.
    pub fn device_address(&self, i: usize) -> u64 {
        assert!(i < self.len);
        self.device_ptr + 4 * i as u64
    }
}

impl Drop for HostWords {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: allocated by cuMemHostAlloc in `new`, freed once here.
            let _ = unsafe { result::free_host(self.host.cast::<c_void>()) };
        }
    }
}

/// Host memory the caller mapped (shared memory, say), page-locked and mapped into the
/// device's address space (`cuMemHostRegister`, DEVICEMAP and PORTABLE); unregistered on drop.
pub struct HostRegistration {
    device: Arc<Device>,
    host: *mut c_void,
    /// Where the device addresses the memory.
    pub device_ptr: sys::CUdeviceptr,
}

// SAFETY: the registration is a handle to memory the owner keeps mapped; the driver calls it
// makes are thread-safe.
unsafe impl Send for HostRegistration {}
// SAFETY: as above.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers the `bytes` (a whole number of pages) at `host`.
    ///
    /// # Safety
    /// `host` must be page-aligned memory of `bytes` bytes that stays mapped until this
    /// registration is dropped.
    pub unsafe fn new(
        device: &Arc<Device>,
        host: *mut c_void,
        bytes: usize,
    ) -> Result<HostRegistration, GpuError> {
        let _current = device.current()?;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller vouches for the range.
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(host, bytes, flags)
        })?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` is registered with DEVICEMAP in this context.
        let mapped = check("cuMemHostGetDevicePointer", unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host, 0)
        });
        let registration = HostRegistration {
            device: device.clone(),
            host,
            device_ptr,
        };
        mapped.map(|()| registration)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: registered in `new`, unregistered once here.
            let _ = unsafe { sys::cuMemHostUnregister(self.host) };
        }
    }
}

/// The kernels one rank launches, from one CUBIN loaded once.
pub struct Kernels {
    /// `ncclStragglarAllReduce`.
    pub all_reduce: Kernel,
    /// `ncclStragglarTicket`.
    pub ticket: Kernel,
    /// `ncclStragglarTicketEnd`.
    pub ticket_end: Kernel,
    /// `ncclStragglarGraphArrival`.
    pub graph_arrival: Kernel,
    /// `ncclStragglarGraphEnd`.
    pub graph_end: Kernel,
    /// `ncclStragglarPeerProbe`.
    pub peer_probe: Kernel,
    /// `ncclStragglarMulticastProbe`.
    pub multicast_probe: Kernel,
}

impl Kernels {
    /// Loads `cubin` on `device` once and finds each kernel in it.
    pub fn load(device: &Arc<Device>, cubin: &[u8]) -> Result<Kernels, GpuError> {
        use crate::gpu::kernels::{
            ALL_REDUCE_KERNEL, GRAPH_ARRIVAL_KERNEL, GRAPH_END_KERNEL, MULTICAST_PROBE_KERNEL,
            PEER_PROBE_KERNEL, TICKET_END_KERNEL, TICKET_KERNEL,
        };
        let module = Arc::new(Module::load(device, cubin)?);
        let kernel = |name| Kernel::find(&module, name);
        Ok(Kernels {
            all_reduce: kernel(ALL_REDUCE_KERNEL)?,
            ticket: kernel(TICKET_KERNEL)?,
            ticket_end: kernel(TICKET_END_KERNEL)?,
            graph_arrival: kernel(GRAPH_ARRIVAL_KERNEL)?,
            graph_end: kernel(GRAPH_END_KERNEL)?,
            peer_probe: kernel(PEER_PROBE_KERNEL)?,
            multicast_probe: kernel(MULTICAST_PROBE_KERNEL)?,
        })
    }
}

/// A loaded CUBIN image, unloaded when the last of its kernels goes.
struct Module {
    device: Arc<Device>,
    raw: sys::CUmodule,
}

// SAFETY: a module handle may be used from any thread of the process.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads `image` on `device`.
    fn load(device: &Arc<Device>, image: &[u8]) -> Result<Module, GpuError> {
        let _current = device.current()?;
        // SAFETY: `image` is a complete CUBIN that outlives the call.
        let raw = wrap("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        Ok(Module {
            device: device.clone(),
            raw,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: loaded in `load`, unloaded once here, when no kernel of it is left.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// One kernel of a loaded image (which it keeps loaded).
pub struct Kernel {
    device: Arc<Device>,
    _module: Arc<Module>,
    function: sys::CUfunction,
}

// SAFETY: module and function handles may be used from any thread of the process.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Loads `image` (a CUBIN) on `device` and finds `name` in it.
    pub fn load(device: &Arc<Device>, image: &[u8], name: &str) -> Result<Kernel, GpuError> {
        Kernel::find(&Arc::new(Module::load(device, image)?), name)
    }

    /// Finds `name` in `module`.
    fn find(module: &Arc<Module>, name: &str) -> Result<Kernel, GpuError> {
        let _current = module.device.current()?;
        let c_name = std::ffi::CString::new(name).expect("kernel names have no NUL");
        // SAFETY: `module` is loaded for as long as it lives.
        let function = wrap("cuModuleGetFunction", unsafe {
            result::module::get_function(module.raw, c_name)
        })?;
        Ok(Kernel {
            device: module.device.clone(),
            _module: module.clone(),
            function,
        })
    }

    /// Launches the kernel on `stream` with `blocks` x `threads` and its one by-value
    /// argument `args` (a `RawLaunch` or a `RawApply`).
    ///
    /// # Safety
    /// `T` must be the kernel's parameter type; every device address in `args` must stay valid
    /// for what the kernel does with it until it finishes; `stream` must be a live stream of
    /// this device's context.
    pub unsafe fn launch<T: Copy>(
        &self,
        stream: sys::CUstream,
        blocks: u32,
        threads: u32,
        args: &T,
    ) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        let mut copy = *args;
        let mut params = [(&mut copy as *mut T).cast::<c_void>()];
        // SAFETY: the driver copies the parameter at launch; the caller guarantees the rest.
        wrap("cuLaunchKernel", unsafe {
            result::launch_kernel(
                self.function,
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                stream,
                &mut params,
            )
        })
    }
}

/// A stream of our own (benchmarks and the self-check; the library launches on the caller's).
pub struct Stream {
    device: Arc<Device>,
    pub raw: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream on `device`.
    pub fn new(device: &Arc<Device>) -> Result<Stream, GpuError> {
        let _current = device.current()?;
        let raw = wrap(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(Stream {
            device: device.clone(),
            raw,
        })
    }

    /// Waits for everything queued on the stream.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: a live stream.
        wrap("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: created in `new`, destroyed once here.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
    }
}

/// A timing event.
pub struct Event {
    device: Arc<Device>,
    raw: sys::CUevent,
}

// SAFETY: an event handle may be used from any thread of the process; every method makes the
// event's context current on the calling thread first.
unsafe impl Send for Event {}

impl Event {
    /// A new event that records time.
    pub fn new(device: &Arc<Device>) -> Result<Event, GpuError> {
        let _current = device.current()?;
        let raw = wrap(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )?;
        Ok(Event {
            device: device.clone(),
            raw,
        })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: live event and stream of the same context.
        wrap("cuEventRecord", unsafe {
            result::event::record(self.raw, stream.raw)
        })
    }

    /// A new event for ordering work only (no timing: cheaper to record and wait on).
    pub fn ordering(device: &Arc<Device>) -> Result<Event, GpuError> {
        let _current = device.current()?;
        let raw = wrap(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
        )?;
        Ok(Event {
            device: device.clone(),
            raw,
        })
    }

    /// Records the event on a raw stream (the caller's, in the library).
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context.
    pub unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: live event; the caller vouches for the stream.
        wrap("cuEventRecord", unsafe {
            result::event::record(self.raw, stream)
        })
    }

    /// Makes later work on `stream` wait for this event (capturable).
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context.
    pub unsafe fn wait_on(&self, stream: sys::CUstream) -> Result<(), GpuError> {
        // SAFETY: as the caller vouches.
        unsafe { self.wait_with(stream, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
    }

    /// Inside a capture on `stream`: an event wait node, so that each launch of the graph
    /// waits for the event's latest record as of that launch (work queued before it, on any
    /// stream: eager launches, other replays). Outside a capture: an ordinary wait.
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context.
    pub unsafe fn wait_external(&self, stream: sys::CUstream) -> Result<(), GpuError> {
        // SAFETY: as the caller vouches.
        unsafe { self.wait_with(stream, sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL) }
    }

    /// # Safety
    /// As [`Event::wait_on`].
    unsafe fn wait_with(
        &self,
        stream: sys::CUstream,
        flags: sys::CUevent_wait_flags,
    ) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: live event; the caller vouches for the stream.
        wrap("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(stream, self.raw, flags)
        })
    }

    /// Inside a capture on `stream`: an event record node, so that each launch of the graph
    /// records the event (later eager work waiting on it follows the replay). Outside a
    /// capture: an ordinary record.
    ///
    /// # Safety
    /// `stream` must be a live stream of this event's context.
    pub unsafe fn record_external(&self, stream: sys::CUstream) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: live event; the caller vouches for the stream.
        let r = unsafe { sys::cuEventRecordWithFlags(self.raw, stream, flags) };
        wrap("cuEventRecordWithFlags", r.result())
    }

    /// Waits on the host until the work before the event's last record has completed.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: a live event.
        wrap("cuEventSynchronize", unsafe {
            result::event::synchronize(self.raw)
        })
    }

    /// Whether the work before the event's last record has completed (true when it was never
    /// recorded; false when the driver cannot say). Never waits.
    pub fn is_complete(&self) -> bool {
        let Ok(_current) = self.device.current() else {
            return false;
        };
        // SAFETY: a live event.
        unsafe { result::event::query(self.raw) }.is_ok()
    }

    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, GpuError> {
        let _current = self.device.current()?;
        // SAFETY: both events are live.
        wrap("cuEventSynchronize", unsafe {
            result::event::synchronize(end.raw)
        })?;
        let mut ms = 0f32;
        // SAFETY: both events are live and complete; `ms` is a valid output.
        let r = unsafe { event_elapsed()(&mut ms, self.raw, end.raw) };
        wrap("cuEventElapsedTime", r.result())?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: created in `new`, destroyed once here.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

/// Waits for everything queued on a raw stream (the caller's).
///
/// # Safety
/// `stream` must be a live stream of `device`'s context.
pub unsafe fn synchronize_raw(device: &Device, stream: sys::CUstream) -> Result<(), GpuError> {
    let _current = device.current()?;
    // SAFETY: the caller vouches for the stream.
    wrap("cuStreamSynchronize", unsafe {
        result::stream::synchronize(stream)
    })
}

/// Reads one `u32` of device memory, on the device's side stream: the read waits for nothing
/// the caller queued (a kernel of ours spinning on the caller's stream does not hold it).
///
/// # Safety
/// `address` must be 4 readable bytes of `device`'s address space.
pub unsafe fn read_word(device: &Device, address: sys::CUdeviceptr) -> Result<u32, GpuError> {
    let _current = device.current()?;
    let mut value = [0u32; 1];
    let side = device.side()?;
    // SAFETY: the caller vouches for the address; the side stream is live, and the copy is
    // waited for below, before `value` is read or goes out of scope.
    wrap("cuMemcpyDtoHAsync", unsafe {
        result::memcpy_dtoh_async(&mut value, address, side)
    })?;
    device.synchronize_side()?;
    Ok(value[0])
}

/// Whether `stream` is capturing a CUDA graph (no allocation or synchronisation may happen).
///
/// # Safety
/// `stream` must be a live stream of `device`'s context.
pub unsafe fn is_capturing(device: &Device, stream: sys::CUstream) -> Result<bool, GpuError> {
    let _current = device.current()?;
    // SAFETY: the caller's live stream of this context.
    let status = wrap("cuStreamIsCapturing", unsafe {
        result::stream::is_capturing(stream)
    })?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Runs `f` with this thread's stream-capture mode relaxed, restored after: an event query is
/// then allowed while another thread captures in the global mode (PyTorch's default), where
/// it would fail and invalidate that capture. A driver that refuses the exchange (or lacks it)
/// runs `f` as it is.
pub fn relaxed_capture_mode<R>(f: impl FnOnce() -> R) -> R {
    let exchange = |mode: &mut sys::CUstreamCaptureMode| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: `mode` is a valid in/out value; the call only swaps the thread's mode.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(mode) }
        }))
        .is_ok_and(|r| r == sys::CUresult::CUDA_SUCCESS)
    };
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    if !exchange(&mut mode) {
        return f();
    }
    let result = f();
    exchange(&mut mode);
    result
}

/// `cuEventElapsedTime` and its `_v2` (CUDA 12.8 on): milliseconds between two events.
type EventElapsed = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// The driver's `cuEventElapsedTime`: `_v2` where the driver has it, the original otherwise
/// (cudarc built for CUDA 13 asks for `_v2` alone and panics on older drivers).
fn event_elapsed() -> EventElapsed {
    static ENTRY: std::sync::OnceLock<EventElapsed> = std::sync::OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: the driver library is loaded (events exist); both names have this signature.
        unsafe {
            let lib = sys::culib();
            lib.get::<EventElapsed>(b"cuEventElapsedTime_v2\0")
                .or_else(|_| lib.get::<EventElapsed>(b"cuEventElapsedTime\0"))
                .map(|f| *f)
                .unwrap_or(elapsed_unavailable)
        }
    })
}

/// Stands in for an absent `cuEventElapsedTime`: every timing fails with an error.
unsafe extern "C" fn elapsed_unavailable(
    _ms: *mut f32,
    _start: sys::CUevent,
    _end: sys::CUevent,
) -> sys::CUresult {
    sys::CUresult::CUDA_ERROR_NOT_FOUND
}

/// What [`capture_of`] says of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capture {
    /// Not capturing.
    None,
    /// Capturing, in the capture with this id (unique within the process).
    Id(u64),
    /// Capturing; the driver did not name the capture.
    Unnamed,
}

/// `cuStreamGetCaptureInfo_v2` (CUDA 11.3 on): stream, status, id, graph, dependencies, count.
type CaptureInfoV2 = unsafe extern "C" fn(
    sys::CUstream,
    *mut sys::CUstreamCaptureStatus,
    *mut sys::cuuint64_t,
    *mut c_void,
    *mut c_void,
    *mut usize,
) -> sys::CUresult;

/// `cuStreamGetCaptureInfo_v3` (CUDA 12.3 on): as v2, with edge data before the count.
type CaptureInfoV3 = unsafe extern "C" fn(
    sys::CUstream,
    *mut sys::CUstreamCaptureStatus,
    *mut sys::cuuint64_t,
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *mut usize,
) -> sys::CUresult;

/// The driver's entry point that names a stream's capture, looked up once (cudarc would panic
/// on a missing one).
#[derive(Clone, Copy)]
enum CaptureInfo {
    V3(CaptureInfoV3),
    V2(CaptureInfoV2),
    Missing,
}

fn capture_info() -> CaptureInfo {
    static ENTRY: std::sync::OnceLock<CaptureInfo> = std::sync::OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: the driver library is loaded (the caller just called into it); each symbol
        // is read with the signature the CUDA headers give that versioned name.
        unsafe {
            let lib = sys::culib();
            if let Ok(f) = lib.get::<CaptureInfoV3>(b"cuStreamGetCaptureInfo_v3\0") {
                return CaptureInfo::V3(*f);
            }
            if let Ok(f) = lib.get::<CaptureInfoV2>(b"cuStreamGetCaptureInfo_v2\0") {
                return CaptureInfo::V2(*f);
            }
            CaptureInfo::Missing
        }
    })
}

/// Whether `stream` is capturing a CUDA graph, and in which capture (calls captured on two
/// streams of one capture may be ordered by an event; calls of different captures may not).
///
/// # Safety
/// `stream` must be a live stream of `device`'s context.
pub unsafe fn capture_of(device: &Device, stream: sys::CUstream) -> Result<Capture, GpuError> {
    // SAFETY: as the caller vouches.
    if !unsafe { is_capturing(device, stream) }? {
        return Ok(Capture::None);
    }
    let _current = device.current()?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    let (null, no_count) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the caller's live stream; the optional outputs are null, which the driver allows.
    let r = unsafe {
        match capture_info() {
            CaptureInfo::V3(f) => f(stream, &mut status, &mut id, null, null, null, no_count),
            CaptureInfo::V2(f) => f(stream, &mut status, &mut id, null, null, no_count),
            CaptureInfo::Missing => return Ok(Capture::Unnamed),
        }
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        // It is capturing: the call is captured, only not ordered across streams.
        return Ok(Capture::Unnamed);
    }
    Ok(match status {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Capture::None,
        _ => Capture::Id(id),
    })
}

/// The graph of `stream`'s capture and the nodes its next captured work would depend on
/// (`_v3` where the driver has it: `_v2` refuses to describe dependencies whose edges carry
/// data, e.g. programmatic ones; that data is not kept, and nodes added after them depend on
/// them fully, which orders no less).
///
/// # Safety
/// `stream` must be a capturing stream of `device`'s context.
pub unsafe fn capture_point(
    device: &Device,
    stream: sys::CUstream,
) -> Result<(sys::CUgraph, Vec<sys::CUgraphNode>), GpuError> {
    let _current = device.current()?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut nodes: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut count = 0usize;
    let (graph_out, nodes_out) = (
        (&mut graph as *mut sys::CUgraph).cast::<c_void>(),
        (&mut nodes as *mut *const sys::CUgraphNode).cast::<c_void>(),
    );
    let edges_out = (&mut edges as *mut *const sys::CUgraphEdgeData).cast::<c_void>();
    let none = std::ptr::null_mut();
    // SAFETY: as the caller vouches; every output points at a local of the type the versioned
    // name writes.
    let r = unsafe {
        match capture_info() {
            CaptureInfo::V3(f) => f(
                stream,
                &mut status,
                none,
                graph_out,
                nodes_out,
                edges_out,
                &mut count,
            ),
            CaptureInfo::V2(f) => f(stream, &mut status, none, graph_out, nodes_out, &mut count),
            CaptureInfo::Missing => sys::CUresult::CUDA_ERROR_NOT_FOUND,
        }
    };
    check("cuStreamGetCaptureInfo", r)?;
    let tail = if nodes.is_null() || count == 0 {
        Vec::new()
    } else {
        // SAFETY: the driver gives out `count` handles at `nodes`, valid until the next call.
        unsafe { std::slice::from_raw_parts(nodes, count) }.to_vec()
    };
    Ok((graph, tail))
}

/// Copies `bytes` from `src` to `dst` on `stream` (device to device), asynchronously.
///
/// # Safety
/// Both ranges must be live device memory of at least `bytes` bytes until the copy ends.
pub unsafe fn copy_async(
    stream: &Stream,
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
) -> Result<(), GpuError> {
    let _current = stream.device.current()?;
    // SAFETY: the caller guarantees both ranges.
    wrap("cuMemcpyDtoDAsync", unsafe {
        result::memcpy_dtod_async(dst, src, bytes, stream.raw)
    })
}

/// A CUDA graph captured from a stream, instantiated and ready to launch.
pub struct Graph {
    device: Arc<Device>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread (one at a time, which `&mut`/ownership
// of the launching code ensures).
unsafe impl Send for Graph {}

impl Graph {
    /// Captures what `work` enqueues on `stream` (thread-local capture mode: other threads
    /// may keep using the driver) and instantiates it.
    ///
    /// # Safety
    /// `stream` must be a live stream of `device`'s context for the whole capture.
    pub unsafe fn capture(
        device: &Arc<Device>,
        stream: sys::CUstream,
        work: impl FnOnce() -> Result<(), GpuError>,
    ) -> Result<Graph, GpuError> {
        let _current = device.current()?;
        // SAFETY: a live stream of this context (the caller's promise).
        wrap("cuStreamBeginCapture", unsafe {
            result::stream::begin_capture(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        })?;
        let worked = work();
        // SAFETY: capture began on this stream above; ending it is required whatever `work` did.
        let graph = wrap("cuStreamEndCapture", unsafe {
            result::stream::end_capture(stream)
        })?;
        if let Err(e) = worked {
            // SAFETY: the graph just captured, destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(e);
        }
        // SAFETY: a valid captured graph.
        match wrap("cuGraphInstantiate", unsafe {
            result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0))
        }) {
            Ok(exec) => Ok(Graph {
                device: device.clone(),
                graph,
                exec,
            }),
            Err(e) => {
                // SAFETY: as above.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(e)
            }
        }
    }

    /// Launches (replays) the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<(), GpuError> {
        let _current = self.device.current()?;
        // SAFETY: an instantiated graph and a live stream of the same context.
        wrap("cuGraphLaunch", unsafe {
            result::graph::launch(self.exec, stream.raw)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if let Ok(_current) = self.device.current() {
            // SAFETY: created in `capture`, destroyed once here.
            unsafe {
                let _ = result::graph::exec_destroy(self.exec);
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

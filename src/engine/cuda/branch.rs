//! NCCL's own captured work as the baseline of graph replays (CUDA 12.3 on). A captured
//! `ncclAllReduce` becomes, in the caller's graph: the turn kernel (`cuda/stragglar_graph_turn.cu`,
//! a module of its own), which at every replay makes the device's choice (and on NCCL's turn
//! takes this rank's ticket, waiting for nothing) and sets three conditional handles from it;
//! then three IF nodes. StragglAR's and NCCL's both follow the turn kernel, and exactly one of
//! them runs its body: StragglAR's holds our AllReduce kernel, NCCL's holds NCCL's work for the
//! call (captured apart on a stream of our own) and, beside it with no edge between them, the
//! arrival kernel that finishes the call's arrival record. The third follows NCCL's and holds
//! the end kernel, which notes when NCCL's work finished, and runs on NCCL's turns in the
//! sample only (one in [`MEASURE_ONE_IN`], by the graph call's number, and the calls a
//! measuring rule needs timed). So a replay on NCCL's turn runs one one-thread kernel before
//! NCCL's work, which never waits, and nothing after it but on the sample. The choice is the
//! device's, from records every rank shares, so every rank takes the same branch.
//!
//! [`MEASURE_ONE_IN`]: crate::gpu::arrival::MEASURE_ONE_IN
//!
//! A body holds only kernel, empty, child graph, memset, memcpy and conditional nodes (memsets
//! and memcpys of device memory only); NCCL's work qualifies with kernel and empty nodes. NCCL
//! brackets its captured kernels with a wait on an event of its own and a record of it (its
//! graph-mixing support, on by default), which a body may not hold: a wait that depends on
//! nothing is moved before the turn kernel, and a record nothing depends on after the IF nodes
//! (both then happen at every replay, NCCL's turn or not, which only adds order). Work with any
//! other node (a network proxy's host node, an event in the middle, a child graph, a copy) does
//! not [qualify](NcclWork::qualified): it is added as it is, and that call's replays run NCCL.
//! So is every rank's work where one rank's does not qualify (or its driver refused the node):
//! the ranks vote on each capture (`super::rank`).

use std::ffi::c_uint;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{capture_point, check, Device, GpuError, Kernel, Stream};
use crate::gpu::launch::{RawGraphTurn, RawLaunch};
use crate::nccl::types::{cudaStream_t, ResultCode};

/// The first driver with conditional nodes: CUDA 12.3.
const FIRST_DRIVER: i32 = 12030;

type HandleCreate =
    unsafe extern "C" fn(*mut u64, sys::CUgraph, sys::CUcontext, c_uint, c_uint) -> sys::CUresult;
type AddNode = unsafe extern "C" fn(
    *mut sys::CUgraphNode,
    sys::CUgraph,
    *const sys::CUgraphNode,
    usize,
    *mut sys::CUgraphNodeParams,
) -> sys::CUresult;
type AddChild = unsafe extern "C" fn(
    *mut sys::CUgraphNode,
    sys::CUgraph,
    *const sys::CUgraphNode,
    usize,
    sys::CUgraph,
) -> sys::CUresult;
type GetNodes =
    unsafe extern "C" fn(sys::CUgraph, *mut sys::CUgraphNode, *mut usize) -> sys::CUresult;
/// The node's type as a plain number: a newer driver may name types this build does not know.
type NodeType = unsafe extern "C" fn(sys::CUgraphNode, *mut c_uint) -> sys::CUresult;
type NodeEdges =
    unsafe extern "C" fn(sys::CUgraphNode, *mut sys::CUgraphNode, *mut usize) -> sys::CUresult;
type NodeEvent = unsafe extern "C" fn(sys::CUgraphNode, *mut sys::CUevent) -> sys::CUresult;
type DestroyNode = unsafe extern "C" fn(sys::CUgraphNode) -> sys::CUresult;
type AddEdges = unsafe extern "C" fn(
    sys::CUgraph,
    *const sys::CUgraphNode,
    *const sys::CUgraphNode,
    usize,
) -> sys::CUresult;
type UpdateDeps =
    unsafe extern "C" fn(sys::CUstream, *mut sys::CUgraphNode, usize, c_uint) -> sys::CUresult;
type GraphDestroy = unsafe extern "C" fn(sys::CUgraph) -> sys::CUresult;
type BeginCapture = unsafe extern "C" fn(sys::CUstream, c_uint) -> sys::CUresult;
type EndCapture = unsafe extern "C" fn(sys::CUstream, *mut sys::CUgraph) -> sys::CUresult;
type WaitEvent = unsafe extern "C" fn(sys::CUstream, sys::CUevent, c_uint) -> sys::CUresult;
type RecordEvent = unsafe extern "C" fn(sys::CUevent, sys::CUstream, c_uint) -> sys::CUresult;
/// The driver's entry points for graphs built by hand, looked up once by their names of
/// CUDA 12.x (later drivers keep exporting them); `None` where one is missing.
struct Api {
    handle_create: HandleCreate,
    add_node: AddNode,
    add_child: AddChild,
    get_nodes: GetNodes,
    node_type: NodeType,
    dependencies: NodeEdges,
    dependents: NodeEdges,
    waited_event: NodeEvent,
    recorded_event: NodeEvent,
    destroy_node: DestroyNode,
    add_dependencies: AddEdges,
    update_dependencies: UpdateDeps,
    graph_destroy: GraphDestroy,
    begin_capture: BeginCapture,
    end_capture: EndCapture,
    wait_event: WaitEvent,
    record_event: RecordEvent,
}

fn api() -> Option<&'static Api> {
    static API: std::sync::OnceLock<Option<Api>> = std::sync::OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: the driver library is loaded (a device was opened); each symbol is read with
        // the signature the CUDA 12 headers give that name.
        unsafe {
            let lib = sys::culib();
            macro_rules! entry {
                ($name:literal) => {
                    *lib.get(concat!($name, "\0").as_bytes()).ok()?
                };
            }
            Some(Api {
                handle_create: entry!("cuGraphConditionalHandleCreate"),
                add_node: entry!("cuGraphAddNode"),
                add_child: entry!("cuGraphAddChildGraphNode"),
                get_nodes: entry!("cuGraphGetNodes"),
                node_type: entry!("cuGraphNodeGetType"),
                dependencies: entry!("cuGraphNodeGetDependencies"),
                dependents: entry!("cuGraphNodeGetDependentNodes"),
                waited_event: entry!("cuGraphEventWaitNodeGetEvent"),
                recorded_event: entry!("cuGraphEventRecordNodeGetEvent"),
                destroy_node: entry!("cuGraphDestroyNode"),
                add_dependencies: entry!("cuGraphAddDependencies"),
                update_dependencies: entry!("cuStreamUpdateCaptureDependencies"),
                graph_destroy: entry!("cuGraphDestroy"),
                begin_capture: entry!("cuStreamBeginCapture_v2"),
                end_capture: entry!("cuStreamEndCapture"),
                wait_event: entry!("cuStreamWaitEvent"),
                record_event: entry!("cuEventRecordWithFlags"),
            })
        }
    })
    .as_ref()
}

/// What a rank needs to put NCCL's work behind a conditional node: the driver's entry points,
/// the turn kernel, and a stream of its own to capture NCCL's work on.
pub struct Branch {
    api: &'static Api,
    /// The turn kernel, loaded once per GPU (`super::gpus::turn_kernel`).
    turn: Arc<Kernel>,
    stream: Stream,
}

impl Branch {
    /// Readies `device` for conditional nodes where the driver has them: the turn kernel (its
    /// module compiled with NVRTC or taken from the kernel cache, loaded once per GPU) and a
    /// stream to capture NCCL's work on; `Err` says why not (a driver before CUDA 12.3, R535's
    /// included, a missing entry point, no NVRTC and no cached module, a module the driver
    /// refuses, a panic while loading).
    pub fn load(device: &Arc<Device>) -> Result<Branch, String> {
        let (major, minor) = crate::gpu::probe::driver_cuda_version()
            .ok_or("the driver does not say its CUDA version")?;
        if major * 1000 + minor * 10 < FIRST_DRIVER {
            return Err(format!(
                "the driver is CUDA {major}.{minor}; conditional graph nodes need 12.3"
            ));
        }
        let api = api().ok_or("the driver lacks an entry point of conditional graph nodes")?;
        let turn = super::gpus::turn_kernel(device)?;
        let stream = super::gpus::without_panics("making a stream", || {
            Stream::new(device).map_err(|e| e.to_string())
        })?;
        Ok(Branch { api, turn, stream })
    }

    /// Captures what `nccl` queues on this rank's own stream into a graph of its own, in the
    /// relaxed capture mode (the caller's capture, in any mode, is left as it is).
    ///
    /// # Safety
    /// `nccl` must queue only work of this device's context on the stream it is given.
    pub unsafe fn capture_apart(
        &self,
        device: &Arc<Device>,
        nccl: &dyn Fn(cudaStream_t) -> ResultCode,
    ) -> Result<NcclWork, BranchError> {
        let _current = device.current()?;
        let mut code = ResultCode::SUCCESS;
        // SAFETY: as the caller vouches.
        let graph = unsafe {
            self.captured(|stream| {
                code = nccl(stream.cast());
                Ok(())
            })
        };
        let work = NcclWork {
            api: self.api,
            device: device.clone(),
            graph: graph?,
        };
        if code != ResultCode::SUCCESS {
            return Err(BranchError::Nccl(code));
        }
        Ok(work)
    }

    /// What `queue` queues on this rank's own stream, captured into a graph, the caller's to
    /// destroy: `Ok` only when `queue` and the end of the capture both succeeded (where
    /// `queue` failed, the graph captured is destroyed and its error returned).
    ///
    /// # Safety
    /// The device's context is current; `queue` queues only work of it.
    unsafe fn captured(
        &self,
        queue: impl FnOnce(sys::CUstream) -> Result<(), GpuError>,
    ) -> Result<sys::CUgraph, GpuError> {
        let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as c_uint;
        // SAFETY: our own live stream, not capturing.
        check("cuStreamBeginCapture", unsafe {
            (self.api.begin_capture)(self.stream.raw, relaxed)
        })?;
        let queued = queue(self.stream.raw);
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the capture begun above, ended once whatever was queued.
        let ended = check("cuStreamEndCapture", unsafe {
            (self.api.end_capture)(self.stream.raw, &mut graph)
        });
        match (queued, ended) {
            (Ok(()), Ok(())) => Ok(graph),
            // The first failure is the one to tell.
            (Err(e), ended) => {
                if ended.is_ok() {
                    // SAFETY: the graph just captured, destroyed once.
                    let _ = unsafe { (self.api.graph_destroy)(graph) };
                }
                Err(e)
            }
            (Ok(()), Err(e)) => Err(e),
        }
    }

    /// Adds what `queue` queues (captured apart) to `graph` as a child graph node with no
    /// dependency.
    ///
    /// # Safety
    /// As [`Branch::captured`]; `graph` is a graph of this context that nodes may be added to.
    unsafe fn add_captured(
        &self,
        graph: sys::CUgraph,
        queue: &dyn Fn(sys::CUstream) -> Result<(), GpuError>,
    ) -> Result<sys::CUgraphNode, GpuError> {
        // SAFETY: as the caller vouches.
        let captured = unsafe { self.captured(queue) }?;
        let mut child: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `captured` is of this context; a child graph node copies it.
        let added = check("cuGraphAddChildGraphNode", unsafe {
            (self.api.add_child)(&mut child, graph, std::ptr::null(), 0, captured)
        });
        // SAFETY: our graph, destroyed once (the node holds its own copy).
        let _ = unsafe { (self.api.graph_destroy)(captured) };
        added.map(|()| child)
    }

    /// This rank's part of putting `work` behind a conditional node on `stream`'s capture,
    /// before anything else of the call is captured: a wait on each of `hoisted`'s waits, then
    /// the call's three IF nodes (with no dependency yet) and their handles: StragglAR's, whose
    /// body holds the AllReduce kernel `ours.all_reduce` queues; NCCL's, whose body holds
    /// `work` and, beside it, the arrival kernel `ours.arrival` queues; the sample's, whose body
    /// holds the end kernel `ours.end` queues. `Ok(Err)`: the driver refused a node or a body,
    /// and nothing of them is left.
    ///
    /// # Safety
    /// `stream` is the caller's capturing stream of `device`; each of `ours` queues only work
    /// of its context.
    pub unsafe fn begin(
        &self,
        device: &Device,
        stream: sys::CUstream,
        work: &NcclWork,
        hoisted: &Hoisted,
        ours: &OurKernels<'_>,
    ) -> Result<Result<Branches, GpuError>, GpuError> {
        let _current = device.current()?;
        let external_wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as c_uint;
        for &event in &hoisted.waits {
            // SAFETY: the caller's capturing stream; NCCL's live event.
            check("cuStreamWaitEvent", unsafe {
                (self.api.wait_event)(stream, event, external_wait)
            })?;
        }
        // SAFETY: the caller's capturing stream.
        let (graph, _) = unsafe { capture_point(device, stream) }?;
        // SAFETY: the capture's own graph and this device's context; the kernels as the
        // caller vouches.
        Ok(unsafe { self.branches(device, graph, work, ours) })
    }

    /// The three IF nodes of [`Branch::begin`] on `graph`, their bodies filled; nothing is
    /// left in `graph` on failure.
    ///
    /// # Safety
    /// As [`Branch::begin`], for `graph`, the graph of the capture in progress.
    unsafe fn branches(
        &self,
        device: &Device,
        graph: sys::CUgraph,
        work: &NcclWork,
        ours: &OurKernels<'_>,
    ) -> Result<Branches, GpuError> {
        let mut nodes = Vec::with_capacity(3);
        for _ in 0..3 {
            // SAFETY: as the caller vouches.
            match unsafe { self.if_node(device, graph) } {
                Ok(node) => nodes.push(node),
                Err(e) => {
                    for made in nodes {
                        // SAFETY: made above, destroyed once (its body with it).
                        let _ = unsafe { (self.api.destroy_node)(made.node) };
                    }
                    return Err(e);
                }
            }
        }
        let (measured, nccl, stragglar) = (nodes.remove(2), nodes.remove(1), nodes.remove(0));
        let made = Branches {
            stragglar,
            nccl,
            measured,
        };
        let mut child: sys::CUgraphNode = std::ptr::null_mut();
        // NCCL's work and the arrival kernel share a body with no edge between them; the
        // arrival kernel is made first, so that a GPU that runs the body's nodes one at a time
        // in the order they were made (one hardware queue) measures the lead as it comes, not
        // after NCCL's work (whose kernels wait for the last rank anyway).
        // SAFETY: the body the driver just made; the kernel as the caller vouches.
        let filled = unsafe { self.add_captured(made.nccl.body, ours.arrival) }
            .and_then(|_| {
                // SAFETY: as above; `work.graph` is a graph of this context.
                check("cuGraphAddChildGraphNode", unsafe {
                    (self.api.add_child)(
                        &mut child,
                        made.nccl.body,
                        std::ptr::null(),
                        0,
                        work.graph,
                    )
                })
            })
            // SAFETY: as above.
            .and_then(|()| unsafe { self.add_captured(made.stragglar.body, ours.all_reduce) })
            // SAFETY: as above.
            .and_then(|_| unsafe { self.add_captured(made.measured.body, ours.end) });
        if let Err(e) = filled {
            // SAFETY: made above, in a capture still in progress.
            let _ = unsafe { self.remove_nodes(&made) };
            return Err(e);
        }
        Ok(made)
    }

    /// Completes what [`Branch::begin`] began, once every rank made its part: the turn kernel
    /// of `call` (which sets the three handles) after what the capture holds, StragglAR's and
    /// NCCL's IF nodes after it (side by side: one of them runs), the sample's after NCCL's,
    /// then a record of each of `hoisted`'s records. Later work captured on `stream` follows
    /// StragglAR's and the sample's IF nodes. A failure here leaves the capture half made on
    /// this rank alone: its caller gives the rank up, so its peers' replays do not wait for
    /// it.
    ///
    /// # Safety
    /// As [`Branch::begin`], with its `branches`; every device address in `call` stays valid
    /// for as long as the graph may be replayed.
    pub unsafe fn complete(
        &self,
        device: &Device,
        stream: sys::CUstream,
        branches: Branches,
        hoisted: &Hoisted,
        call: &RawLaunch,
    ) -> Result<(), GpuError> {
        let _current = device.current()?;
        let args = RawGraphTurn {
            call: *call,
            stragglar_body: branches.stragglar.handle,
            nccl_body: branches.nccl.handle,
            sample_body: branches.measured.handle,
        };
        // SAFETY: the handles were made on this capture's graph; `call` as the caller vouches.
        unsafe { self.turn.launch(stream, 1, 32, &args) }?;
        // SAFETY: as the caller vouches.
        let (graph, tail) = unsafe { capture_point(device, stream) }?;
        let mut from: Vec<sys::CUgraphNode> = tail.iter().chain(&tail).copied().collect();
        let mut to = vec![branches.stragglar.node; tail.len()];
        to.extend(std::iter::repeat_n(branches.nccl.node, tail.len()));
        from.push(branches.nccl.node);
        to.push(branches.measured.node);
        // SAFETY: nodes of the capture's graph, `from.len()` edges.
        check("cuGraphAddDependencies", unsafe {
            (self.api.add_dependencies)(graph, from.as_ptr(), to.as_ptr(), from.len())
        })?;
        let mut last = [branches.stragglar.node, branches.measured.node];
        let set = sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES;
        // SAFETY: the caller's capturing stream; the nodes are of its capture's graph.
        check("cuStreamUpdateCaptureDependencies", unsafe {
            (self.api.update_dependencies)(stream, last.as_mut_ptr(), last.len(), set as c_uint)
        })?;
        // SAFETY: as above.
        unsafe { self.record_all(stream, hoisted) }
    }

    /// Removes what [`Branch::begin`] made when a peer could not make its part (its IF nodes
    /// and bodies; the waits stay, in front of the work added as it is instead).
    ///
    /// # Safety
    /// `device`'s context made `branches`, in a capture still in progress.
    pub unsafe fn remove(&self, device: &Device, branches: Branches) -> Result<(), GpuError> {
        let _current = device.current()?;
        // SAFETY: as the caller vouches.
        unsafe { self.remove_nodes(&branches) }
    }

    /// Destroys the IF nodes of `branches` (their bodies with them).
    ///
    /// # Safety
    /// As [`Branch::remove`], the context current.
    unsafe fn remove_nodes(&self, branches: &Branches) -> Result<(), GpuError> {
        let mut first = Ok(());
        for node in [
            branches.stragglar.node,
            branches.nccl.node,
            branches.measured.node,
        ] {
            // SAFETY: a node made by `branches`, destroyed once.
            let destroyed = check("cuGraphDestroyNode", unsafe {
                (self.api.destroy_node)(node)
            });
            first = first.and(destroyed);
        }
        first
    }

    /// A conditional handle made on `graph` (reset to 0 at each launch) and an IF node of it,
    /// with no dependency and an empty body.
    ///
    /// # Safety
    /// `graph` is the graph of a capture in progress on this context, which is current.
    unsafe fn if_node(
        &self,
        device: &Device,
        graph: sys::CUgraph,
    ) -> Result<Conditional, GpuError> {
        let mut handle = 0u64;
        let assign_default = sys::CU_GRAPH_COND_ASSIGN_DEFAULT;
        // SAFETY: as the caller vouches.
        check("cuGraphConditionalHandleCreate", unsafe {
            (self.api.handle_create)(&mut handle, graph, device.context(), 0, assign_default)
        })?;
        // SAFETY: an all-zero parameter block is valid; the fields read are set below.
        let mut params: sys::CUgraphNodeParams = unsafe { std::mem::zeroed() };
        params.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        let mut body: sys::CUgraph = std::ptr::null_mut();
        params.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle,
            type_: sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
            size: 1,
            phGraph_out: &mut body,
            ctx: device.context(),
        };
        let mut node: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: as the caller vouches; `params` and `body` outlive the call.
        check("cuGraphAddNode", unsafe {
            (self.api.add_node)(&mut node, graph, std::ptr::null(), 0, &mut params)
        })?;
        Ok(Conditional { handle, node, body })
    }

    /// Records each of `hoisted`'s records on `stream` (external: at every replay).
    ///
    /// # Safety
    /// `stream` is a capturing stream of the current context.
    pub unsafe fn record_all(
        &self,
        stream: sys::CUstream,
        hoisted: &Hoisted,
    ) -> Result<(), GpuError> {
        let external_record = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as c_uint;
        for &event in &hoisted.records {
            // SAFETY: as the caller vouches; NCCL's live event.
            check("cuEventRecordWithFlags", unsafe {
                (self.api.record_event)(event, stream, external_record)
            })?;
        }
        Ok(())
    }

    /// Adds `work` to `stream`'s capture as it is (a child graph node after what the capture
    /// holds), for work that does not qualify for a body.
    ///
    /// # Safety
    /// `stream` is the caller's capturing stream of `device`.
    pub unsafe fn capture_plain(
        &self,
        device: &Device,
        stream: sys::CUstream,
        work: &NcclWork,
    ) -> Result<(), GpuError> {
        let _current = device.current()?;
        // SAFETY: the caller's capturing stream.
        let (graph, tail) = unsafe { capture_point(device, stream) }?;
        let mut child: sys::CUgraphNode = std::ptr::null_mut();
        // SAFETY: the capture's graph and dependencies; `work.graph` is of this context.
        check("cuGraphAddChildGraphNode", unsafe {
            (self.api.add_child)(&mut child, graph, tail.as_ptr(), tail.len(), work.graph)
        })?;
        let set = sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES;
        // SAFETY: as above.
        check("cuStreamUpdateCaptureDependencies", unsafe {
            (self.api.update_dependencies)(stream, &mut child, 1, set as c_uint)
        })
    }
}

/// Why NCCL's work could not be captured apart.
#[derive(Debug)]
pub enum BranchError {
    /// The driver refused a step of the capture.
    Gpu(GpuError),
    /// NCCL's own call failed (its code, which the caller returns).
    Nccl(ResultCode),
}

impl From<GpuError> for BranchError {
    fn from(e: GpuError) -> Self {
        BranchError::Gpu(e)
    }
}

/// NCCL's work for one call, captured apart: a graph of this rank's, destroyed with it. Kept
/// as long as the communicator (see `CudaComm`): a child graph node is a copy, but what NCCL
/// attached to the graph it captured is kept with that graph.
pub struct NcclWork {
    api: &'static Api,
    device: Arc<Device>,
    graph: sys::CUgraph,
}

// SAFETY: a CUgraph may be used from any thread, one at a time (the owner's `&mut`).
unsafe impl Send for NcclWork {}

/// The three IF nodes of a call (see [`Branch::begin`]), made on a capture's graph.
pub struct Branches {
    stragglar: Conditional,
    nccl: Conditional,
    measured: Conditional,
}

/// An IF node made on a capture's graph, with no dependency yet, its handle and its body.
struct Conditional {
    handle: u64,
    node: sys::CUgraphNode,
    body: sys::CUgraph,
}

/// Our kernels in the bodies of a captured call whose baseline is NCCL's work, each queued by
/// its closure on the stream it is given (captured apart into its body): the AllReduce,
/// arrival and end kernels.
pub struct OurKernels<'a> {
    pub all_reduce: &'a dyn Fn(sys::CUstream) -> Result<(), GpuError>,
    pub arrival: &'a dyn Fn(sys::CUstream) -> Result<(), GpuError>,
    pub end: &'a dyn Fn(sys::CUstream) -> Result<(), GpuError>,
}

/// The event nodes moved out of NCCL's work: waits to put before our kernel, records after the
/// IF node.
#[derive(Debug, Default)]
pub struct Hoisted {
    waits: Vec<sys::CUevent>,
    records: Vec<sys::CUevent>,
}

impl NcclWork {
    /// Readies the work for a conditional body: moves its edge event nodes out (see the module
    /// doc) and returns them, or says which node keeps it out of a body (the work is then left
    /// as captured).
    pub fn qualified(&mut self) -> Result<Hoisted, String> {
        let api = self.api;
        let _current = self.device.current().map_err(|e| e.to_string())?;
        // SAFETY: our own graph; the counts bound every read.
        let nodes = unsafe { self.nodes() }.map_err(|e| e.to_string())?;
        let mut hoisted = Hoisted::default();
        let mut moved = Vec::new();
        for &node in &nodes {
            let mut kind: c_uint = 0;
            // SAFETY: a node of our graph.
            check("cuGraphNodeGetType", unsafe {
                (api.node_type)(node, &mut kind)
            })
            .map_err(|e| e.to_string())?;
            let edges = |f: NodeEdges| -> Result<usize, String> {
                let mut count = 0usize;
                // SAFETY: a null list asks for the count only.
                check("cuGraphNodeGet{Dependencies,DependentNodes}", unsafe {
                    f(node, std::ptr::null_mut(), &mut count)
                })
                .map_err(|e| e.to_string())?;
                Ok(count)
            };
            use sys::CUgraphNodeType as T;
            let event = |f: NodeEvent| -> Result<sys::CUevent, String> {
                let mut event: sys::CUevent = std::ptr::null_mut();
                // SAFETY: an event node of our graph.
                check("cuGraphEvent*NodeGetEvent", unsafe { f(node, &mut event) })
                    .map_err(|e| e.to_string())?;
                Ok(event)
            };
            match kind {
                // (Memsets and memcpys are left out too: a body takes them only on device
                // or device-mapped memory, which a refusal at instantiation would tell.)
                k if k == T::CU_GRAPH_NODE_TYPE_KERNEL as c_uint
                    || k == T::CU_GRAPH_NODE_TYPE_EMPTY as c_uint => {}
                k if k == T::CU_GRAPH_NODE_TYPE_WAIT_EVENT as c_uint
                    && edges(api.dependencies)? == 0 =>
                {
                    hoisted.waits.push(event(api.waited_event)?);
                    moved.push(node);
                }
                k if k == T::CU_GRAPH_NODE_TYPE_EVENT_RECORD as c_uint
                    && edges(api.dependents)? == 0 =>
                {
                    hoisted.records.push(event(api.recorded_event)?);
                    moved.push(node);
                }
                k => {
                    return Err(format!(
                        "NCCL's captured work holds {}, which a conditional body cannot",
                        node_kind(k)
                    ))
                }
            }
        }
        for node in moved {
            // SAFETY: a node of our graph, destroyed once.
            check("cuGraphDestroyNode", unsafe { (api.destroy_node)(node) })
                .map_err(|e| e.to_string())?;
        }
        Ok(hoisted)
    }

    /// The graph's nodes.
    ///
    /// # Safety
    /// The work's context must be current.
    unsafe fn nodes(&self) -> Result<Vec<sys::CUgraphNode>, GpuError> {
        let mut count = 0usize;
        // SAFETY: a null list asks for the count.
        check("cuGraphGetNodes", unsafe {
            (self.api.get_nodes)(self.graph, std::ptr::null_mut(), &mut count)
        })?;
        let mut nodes = vec![std::ptr::null_mut(); count];
        // SAFETY: room for `count` handles.
        check("cuGraphGetNodes", unsafe {
            (self.api.get_nodes)(self.graph, nodes.as_mut_ptr(), &mut count)
        })?;
        nodes.truncate(count);
        Ok(nodes)
    }
}

/// A node type as the CUDA documentation names it, for the log.
fn node_kind(kind: c_uint) -> String {
    let name = match kind {
        0 => "a kernel node",
        1 => "a memcpy node",
        2 => "a memset node",
        3 => "a host node",
        4 => "a child graph node",
        5 => "an empty node",
        6 => "an event wait node with dependencies",
        7 => "an event record node with dependents",
        8 => "an external semaphore signal node",
        9 => "an external semaphore wait node",
        10 => "a memory allocation node",
        11 => "a memory free node",
        12 => "a batched memory operation node",
        13 => "a conditional node",
        _ => return format!("a node of type {kind}"),
    };
    name.into()
}

impl Drop for NcclWork {
    fn drop(&mut self) {
        if self.graph.is_null() {
            return;
        }
        if let Ok(_current) = self.device.current() {
            // SAFETY: our graph, destroyed once.
            let _ = unsafe { (self.api.graph_destroy)(self.graph) };
        }
    }
}

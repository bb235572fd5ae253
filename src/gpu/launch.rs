//! The `#[repr(C)]` arguments of the AllReduce kernel, shared with `cuda/` through the generated
//! header `cuda/stragglar_launch.h` (tests/headers.rs), so kernel and host agree on the layout.
//!
//! Device addresses travel as `u64` (a `CUdeviceptr`); the kernel casts them. Every rank of a
//! communicator launches with the same `blocks` and `threads` for the communicator's lifetime:
//! block `b` always covers the same bytes of every chunk, which the per-block flags rely on.

use super::arrival::RawArrival;
use super::choice::RawRule;

/// `RawLaunch::op` of a sum (the codes follow `crate::reduce::ReduceOp` order).
pub const OP_SUM: u32 = 0;
/// `RawLaunch::op` of a product.
pub const OP_PROD: u32 = 1;
/// `RawLaunch::op` of a maximum.
pub const OP_MAX: u32 = 2;
/// `RawLaunch::op` of a minimum.
pub const OP_MIN: u32 = 3;
/// `RawLaunch::op` of an average (floats prescaled by `1/n`, integers divided at the end).
pub const OP_AVG: u32 = 4;
/// `RawLaunch::op` of a premultiplied sum (each rank's input scaled by its own scalar).
pub const OP_PREMULSUM: u32 = 5;

/// The most threads per block the kernels are built for (`__launch_bounds__(512, 1)`: one
/// block per SM with up to 128 registers per thread, as NCCL's kernels; ranks sharing a GPU
/// are sized to one block per SM each, see `shared_gpu_blocks`).
pub const MAX_THREADS: u32 = 512;

/// The threads of a GPU warp. A launch that records its arrival gives the protocol the last
/// warp of plan block 0 (one working thread; the first block each GPU starts), not a block of
/// its own, so plan block 0 runs on the block's other warps: a GPU launch has a multiple of
/// `WARP_THREADS` threads, at least two warps of them.
pub const WARP_THREADS: u32 = 32;

/// `RawLaunch::status` values a kernel writes when it gives up (0 means no error).
pub const STATUS_OK: u32 = 0;
/// The host raised the abort word.
pub const STATUS_ABORTED: u32 = 1;
/// A wait outlived `timeout_ns`.
pub const STATUS_TIMEOUT: u32 = 2;
/// A peer reported its own failure.
pub const STATUS_PEER_FAILED: u32 = 3;
/// The plan blob failed its sanity checks (magic, version, ranks).
pub const STATUS_BAD_PLAN: u32 = 4;

/// One rank's memory as this rank sees it (its own, or a peer's opened through IPC).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawPeer {
    /// The arena of each call parity: `arena_bytes` each, 16-byte aligned.
    pub arena: [u64; 2],
    /// The flags of each parity, an inbox: `uint32_t[values][blocks]` over the values of all
    /// ranks (the plan's value table). `flags[g * blocks + b]` holds the epoch of the call whose
    /// value `g` (its index in the value table) has its slice `b` written, and is written only
    /// by that value's owner, into the staging of each of its readers; a reader waits on its
    /// own memory.
    pub flags: [u64; 2],
    /// `uint32_t`: nonzero once the owner failed a call (the owner's status); peers' waits on
    /// this rank give up when they see it.
    pub failed: u64,
    /// The turn words of each parity, an inbox like `flags`: `uint64_t[ranks][blocks]`. Word
    /// `s * blocks + b` says how many of rank `s`'s sends in the current call (plan turns,
    /// `RawStep::turn`) have been read by their readers' blocks `b`, beside the call's flag in
    /// the high 32 bits (`sg_served` in cuda/stragglar_allreduce.cu): this rank's block `b` may
    /// read send `k` of `s` once it says `k`. Written by the reader of `s`'s send `k - 1`
    /// (`RawStep::next_reader`), so the readers of one source write it in turn order; polled by
    /// this rank in its own memory.
    pub served: [u64; 2],
}

/// Everything one launch needs. All ranks launch with identical `blocks`, `threads`, `op`
/// and plan shape; `plan`, `input`, `output`, `scale` and the own words differ per rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawLaunch {
    /// `const RawPlanHeader*`: this rank's plan blob, in device memory.
    pub plan: u64,
    /// `const RawPeer[ranks]`, in device memory, indexed by rank.
    pub peers: u64,
    /// The caller's buffers (`count` elements each; may be the same buffer).
    pub input: u64,
    pub output: u64,
    /// Elements in the call: with the type, it sets every chunk's range and arena slot
    /// (`plan::chunk_range`, `plan::slot_bytes`); identical on every rank.
    pub count: u64,
    /// `uint64_t`: this rank's call counter. Every block reads it at start; the block that
    /// finishes last stores the call's number, so graph replays advance it with no host help.
    pub epoch: u64,
    /// `uint32_t[2]`: blocks of the current call that have finished, then blocks that have
    /// started (each claims its plan block from it); both reset by the last to finish.
    pub finished_blocks: u64,
    /// `uint32_t`, host-mapped: nonzero makes every wait give up (our Abort/Destroy wrappers).
    pub abort: u64,
    /// `uint32_t`, host-mapped: the kernel writes a `STATUS_*` here when it gives up.
    pub status: u64,
    /// A wait gives up after this many nanoseconds of `%globaltimer`; 0 waits forever.
    pub timeout_ns: u64,
    /// The copy-in scalar (`1/n` for float avg, the rank's PreMulSum scalar), in the element
    /// type's little-endian bytes; used only when `has_scale` is 1.
    pub scale: [u8; 8],
    pub has_scale: u32,
    /// `OP_*`.
    pub op: u32,
    /// This rank.
    pub rank: u32,
    /// Blocks in the grid and threads per block (identical on every rank).
    pub blocks: u32,
    pub threads: u32,
    /// The `ncclDataType_t` of the elements (identical on every rank).
    pub datatype: i32,
    /// 1: a remote read with a turn waits until its source has served the sends before it (the
    /// schedule's round order on every send port, as the host engine keeps it); 0: reads go as
    /// soon as their value is published. Identical on every rank.
    pub ordered_reads: u32,
    /// The arrival record of this call: `board` nonzero has the last warp of plan block 0 run
    /// `RawTicket`'s protocol alongside the plan (the grid stays `blocks`); 0 takes none.
    /// Identical on every rank (the protocol needs every rank's ticket). A graph launch always
    /// records its arrival, and reads only `board` (rank 0's graph board) and `ranks` here.
    pub arrival: RawArrival,
    /// `RawGraphState*`, this rank's, in device memory: nonzero makes this a graph launch, whose
    /// call number, arrival record and plan come from device memory (see `super::choice`); 0
    /// for an eager launch, which runs `plan`.
    pub graph: u64,
    /// Graph launches: `const uint64_t[ranks + 1]`, this rank's plan blobs by choice (the
    /// StragglAR plan with straggler `s` at `s`, the baseline at `ranks`: Ring, or StragglAR
    /// with the last rank where Ring does not fit the staging).
    pub plans: u64,
    /// Graph launches: the policy that picks among `plans`.
    pub rule: RawRule,
    /// The multicast region of each call parity: memory of every rank bound to one multicast
    /// object, `multicast_bytes` each, that holds the values a plan pushes to several readers
    /// (slot `k` at `k - RawPlanHeader::multicast_slots_from` slots from its start) in place of
    /// the arenas. Here this rank's multicast address of it (a `multimem.st` at offset `o`
    /// writes offset `o` of every rank's region); 0: no region, and such a value goes to each
    /// reader's arena through `peers`, one store each.
    pub multicast_arena: [u64; 2],
    /// This rank's own address of its memory in each parity's multicast region (plain loads
    /// read what the multicast stores wrote there).
    pub multicast_own: [u64; 2],
    /// Bytes of each parity's multicast region, the same on every rank. A value whose slot
    /// would end past it is kept in the arenas instead, alike on every rank.
    pub multicast_bytes: u64,
}

/// Operands the bandwidth probe folds at most (the length of `RawApply::operands`).
pub const APPLY_MAX_OPERANDS: u32 = 8;

/// The bandwidth probe (`ncclStragglarApplyProbe`): `output = operands[0] op operands[1] ...`
/// over `bytes`, with the AllReduce kernel's own element-wise code and slicing, to measure it
/// against the device's copy rate. One operand is a copy.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawApply {
    /// Device addresses, 16-byte aligned for the vector path; the first `operand_count` used.
    pub operands: [u64; 8],
    pub output: u64,
    /// Bytes of each operand and of the output (a whole number of elements).
    pub bytes: u64,
    pub operand_count: u32,
    /// `OP_*` (avg and premulsum fold as sums here).
    pub op: u32,
    /// The `ncclDataType_t` of the elements.
    pub datatype: i32,
    pub reserved: u32,
}

/// `RawPeerProbe::result` once every peer passed.
pub const PEER_PROBE_PASSED: u32 = 0x5347_0001;
/// `RawPeerProbe::result` of a peer that failed: this plus its rank.
pub const PEER_PROBE_FAILED: u32 = 0x5348_0000;

/// The peer probe (`ncclStragglarPeerProbe`, one thread), launched once by every rank during
/// the setup, after its copy-engine round trip left its token in its own probe word of every
/// peer's staging: this GPU's own acquire load of each such word must read the token, a
/// system-scope atomic add on it must return the token, and a load after it must read the
/// token plus one. The copy engine can reach memory that the multiprocessors cannot, or not
/// correctly (some virtual machines and PCIe systems); the kernels use the multiprocessors.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawPeerProbe {
    /// `const RawPeer[ranks]`: every rank's memory as this rank addresses it.
    pub peers: u64,
    /// Bytes from a peer's `flags[0]` to this rank's probe word in its staging, modulo 2^64
    /// (the word lies before the flags or after them).
    pub probe_from_flags: u64,
    /// `uint32_t`, host-mapped: [`PEER_PROBE_PASSED`], or [`PEER_PROBE_FAILED`] plus the first
    /// peer that failed (0 until the kernel is done).
    pub result: u64,
    /// What the copy engine wrote into each probe word.
    pub token: u32,
    pub rank: u32,
    pub ranks: u32,
    pub reserved: u32,
}

/// The multicast probe (`ncclStragglarMulticastProbe`, one thread), launched once by every rank
/// of a multicast team: it stores `{token, rank, !token, !rank}` (16 bytes) through the
/// multicast address into slot `rank` of every member's memory. Once every rank's probe
/// finished, each rank finds every rank's pattern in its own memory, or multicast does not work
/// here (or not bit for bit: two of the lanes are NaN patterns as f32).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawMulticastProbe {
    /// The multicast object's address on this GPU (16-byte aligned; `ranks` slots of 16 bytes).
    pub multicast: u64,
    pub token: u32,
    pub rank: u32,
}

/// The pointer chase (`ncclStragglarChase`, one thread of one block): `hops` dependent loads
/// through a ring of byte offsets, each the system-scope relaxed load the kernels poll flags
/// with, so each waits for the one before it: its time over `hops` is one load's latency. It
/// starts at the offset in `at` and leaves there the offset it ended at, so that launches one
/// after the other go on around the ring (a fresh word each time, on a ring larger than the
/// L2), and the host checks it against its own walk of the ring.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawChase {
    /// The ring: 8-byte words, each the byte offset (from `ring`) of the next word to load.
    pub ring: u64,
    /// `uint64_t`, device memory: the offset of the first word to load (8-byte aligned), then
    /// the offset the chase ended at.
    pub at: u64,
    /// Loads to make, one after the other.
    pub hops: u64,
}

/// The turn kernel's one parameter (`ncclStragglarGraphTurn`, in a module of its own:
/// `cuda/stragglar_graph_turn.cu`), first kernel of a captured call whose baseline is NCCL's
/// own work: the call's launch, as its other kernels get it, and the conditional handles of
/// the call's three IF nodes, which the kernel sets at every replay (1: the body runs).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawGraphTurn {
    pub call: RawLaunch,
    /// `cudaGraphConditionalHandle` of the body holding our AllReduce kernel: 1 on
    /// StragglAR's turn.
    pub stragglar_body: u64,
    /// Of the body holding NCCL's work and the arrival kernel: 1 on NCCL's turn.
    pub nccl_body: u64,
    /// Of the body holding the end kernel, after NCCL's: 1 on NCCL's turn in the sample
    /// (`super::arrival::measures` of the graph call's number, and the calls a measuring rule
    /// needs timed: `sg_graph_measures`).
    pub sample_body: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(std::mem::size_of::<RawPeer>(), 56);
        assert_eq!(std::mem::size_of::<RawLaunch>(), 264);
        assert_eq!(std::mem::size_of::<RawGraphTurn>(), 264 + 24);
        assert_eq!(std::mem::size_of::<RawApply>(), 96);
        assert_eq!(std::mem::size_of::<RawPeerProbe>(), 40);
        assert_eq!(std::mem::size_of::<RawMulticastProbe>(), 16);
        assert_eq!(std::mem::size_of::<RawChase>(), 24);
    }
}

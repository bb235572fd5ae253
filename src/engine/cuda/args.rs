//! The kernels' launch arguments (`RawLaunch`, `RawTicket`), built in one place from where one
//! rank's memory lies: `CudaRank`'s launches use it, and so does the kernel emulation
//! (tests/kernel_emulation.rs), which runs the kernel source on the host over a staging laid
//! out by the same `StagingLayout`. No device access here: addresses in, arguments out.

use super::staging::StagingLayout;
use crate::gpu::arrival::{RawArrival, RawTicket};
use crate::gpu::choice::RawRule;
use crate::gpu::kernels::op_code;
use crate::gpu::launch::RawLaunch;
use crate::reduce::{DataType, ReduceOp, Scale};

/// What one AllReduce launch reduces, besides its plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Operands {
    /// Elements in each buffer, and their type.
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    /// The copy-in scaling (`Scale::for_op`).
    pub scale: Scale,
    /// Device addresses of the caller's buffers, `count` elements each (equal in place).
    pub input: u64,
    pub output: u64,
}

/// Where one rank's launches point (device addresses) and how its grid runs. Everything but
/// the addresses and `rank` is identical on every rank of a communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchSite {
    /// Base of the rank's staging allocation, laid out by `layout`.
    pub staging: u64,
    pub layout: StagingLayout,
    /// `RawPeer[ranks]`: every rank's staging as this rank addresses it.
    pub peer_table: u64,
    /// The rank's abort and status words (`uint32_t` each).
    pub abort: u64,
    pub status: u64,
    pub rank: u32,
    pub ranks: u32,
    /// The plan's blocks (the whole grid) and threads per block (plan block 0's last warp records
    /// the arrival of a call that takes a ticket).
    pub blocks: u32,
    pub threads: u32,
    /// How long a kernel waits for a peer before it gives up; 0: never.
    pub timeout_ns: u64,
    /// `RawLaunch::ordered_reads`.
    pub ordered_reads: bool,
    /// The multicast region (`RawLaunch::multicast_arena`), if any.
    pub multicast: Option<MulticastRegion>,
}

/// Where a rank's multicast region lies (see `RawLaunch::multicast_arena`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MulticastRegion {
    /// The multicast address of each parity's region.
    pub multicast: [u64; 2],
    /// This rank's own address of its memory in each parity's region.
    pub own: [u64; 2],
    /// Bytes of one parity's region.
    pub bytes: u64,
}

impl LaunchSite {
    /// An eager launch of the plan blob at `plan` on `operands`, recording its arrival as
    /// `arrival` says (`RawArrival::default()`: none).
    pub fn eager(&self, plan: u64, arrival: RawArrival, operands: &Operands) -> RawLaunch {
        RawLaunch {
            plan,
            arrival,
            ..self.common(operands)
        }
    }

    /// A graph launch on `operands` that picks its plan from the table at `plans` by `rule`,
    /// recording its arrival on rank 0's graph board, at `graph_board` as this rank sees it
    /// (a table whose baseline entry is empty takes NCCL's captured work as the baseline: the
    /// turn kernel's, see `super::branch`).
    pub fn graph(
        &self,
        plans: u64,
        graph_board: u64,
        rule: RawRule,
        operands: &Operands,
    ) -> RawLaunch {
        RawLaunch {
            arrival: RawArrival {
                board: graph_board,
                ranks: self.ranks,
                ..RawArrival::default()
            },
            graph: self.staging + self.layout.graph(),
            plans,
            rule,
            ..self.common(operands)
        }
    }

    /// The ticket kernel's arguments: the arrival record `arrival` of a call, its end kernel's
    /// collection waiting at most `timeout_ns` for each record (0: as long as NCCL would).
    pub fn ticket(&self, arrival: RawArrival, timeout_ns: u64) -> RawTicket {
        RawTicket {
            arrival,
            abort: self.abort,
            status: self.status,
            peers: self.peer_table,
            timeout_ns,
            rank: self.rank,
            end: 0,
        }
    }

    /// What every AllReduce launch of this rank shares, for `operands`; the plan, arrival and
    /// graph fields are the caller's.
    fn common(&self, operands: &Operands) -> RawLaunch {
        let (scale, has_scale) = match operands.scale {
            Scale::None => ([0u8; 8], 0),
            Scale::By(bytes) => (bytes, 1),
        };
        RawLaunch {
            peers: self.peer_table,
            input: operands.input,
            output: operands.output,
            count: operands.count as u64,
            datatype: operands.dtype.nccl_code(),
            epoch: self.staging + self.layout.epoch(),
            finished_blocks: self.staging + self.layout.finished_blocks(),
            abort: self.abort,
            status: self.status,
            timeout_ns: self.timeout_ns,
            scale,
            has_scale,
            op: op_code(operands.op),
            rank: self.rank,
            blocks: self.blocks,
            threads: self.threads,
            ordered_reads: u32::from(self.ordered_reads),
            multicast_arena: self.multicast.map_or([0; 2], |m| m.multicast),
            multicast_own: self.multicast.map_or([0; 2], |m| m.own),
            multicast_bytes: self.multicast.map_or(0, |m| m.bytes),
            ..RawLaunch::default()
        }
    }
}

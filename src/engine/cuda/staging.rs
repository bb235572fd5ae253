//! Where one rank's staging allocation keeps what: both arena parities, both flag parities, both
//! parities of turn words, the setup's probe words, the epoch, the finished-blocks counter, the notes of its ticketed calls (two, by call parity), the arrival board (used on rank 0
//! only) and the graph state (`RawGraphState`: graph launches' call numbers, records and
//! device detectors). One plain allocation per rank,
//! rounded up to 2 MiB (the granularity CUDA IPC maps), identical in layout on every rank, so
//! a peer's `RawPeer` follows from its base address, and its failure word (in host memory:
//! `super::failure`). A job's communicator starts with arenas of no size and grows them at the
//! calls that need more (`super::growth`): each grown pair of arenas is an allocation of its
//! own ([`ArenaLayout`]), and the rest of the staging never moves.

use crate::gpu::arrival::{RawBoardSlot, BOARD_SLOTS};
use crate::gpu::choice::RawGraphState;
use crate::gpu::launch::RawPeer;

/// Alignment of every region: a 256-byte boundary keeps vector loads and cache lines apart.
const REGION_ALIGN: u64 = 256;
/// CUDA IPC maps whole 2 MiB granules.
pub const ALLOCATION_GRANULE: u64 = 2 << 20;
/// Probe words of a staging: one per writing rank, for the ranks the kernels take (256).
pub const PROBE_WORDS: u64 = 256;

fn align(bytes: u64, to: u64) -> u64 {
    bytes.div_ceil(to) * to
}

/// The layout of one rank's staging allocation. All offsets in bytes from its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingLayout {
    /// Bytes of one arena parity (the largest arena of any plan it will run).
    pub arena_bytes: u64,
    /// Values whose flags fit: of all ranks together, for the largest plan (`ArenaNeed::values`).
    pub values: u64,
    /// Blocks of the communicator's fixed grid.
    pub blocks: u64,
    /// Ranks of the communicator (each has a turn word per block in every rank's staging).
    pub ranks: u64,
}

impl StagingLayout {
    fn arena_stride(&self) -> u64 {
        self.arenas().stride()
    }

    /// The arenas this staging holds itself (both parities of `arena_bytes`).
    pub fn arenas(&self) -> ArenaLayout {
        ArenaLayout {
            arena_bytes: self.arena_bytes,
        }
    }

    fn flags_stride(&self) -> u64 {
        align(self.values.max(1) * self.blocks.max(1) * 4, REGION_ALIGN)
    }

    /// Offset of the arena of `parity`.
    pub fn arena(&self, parity: usize) -> u64 {
        parity as u64 * self.arena_stride()
    }

    /// Offset of the flags of `parity` (`uint32_t[values][blocks]`).
    pub fn flags(&self, parity: usize) -> u64 {
        2 * self.arena_stride() + parity as u64 * self.flags_stride()
    }

    fn served_stride(&self) -> u64 {
        align(self.ranks.max(1) * self.blocks.max(1) * 8, REGION_ALIGN)
    }

    /// Offset of the turn words of `parity` (`uint64_t[ranks][blocks]`, see `RawPeer::served`).
    pub fn served(&self, parity: usize) -> u64 {
        2 * self.arena_stride() + 2 * self.flags_stride() + parity as u64 * self.served_stride()
    }

    /// Offset of rank `writer`'s probe word (`uint32_t`, `writer < PROBE_WORDS`): the setup's
    /// round trip writes it through the mapping and reads it back; nothing else touches it.
    pub fn probe_word(&self, writer: usize) -> u64 {
        assert!((writer as u64) < PROBE_WORDS, "a rank with a probe word");
        self.served(0) + 2 * self.served_stride() + 4 * writer as u64
    }

    /// Offset of the epoch (`uint64_t`), which only the owner's kernels touch.
    pub fn epoch(&self) -> u64 {
        self.served(0) + 2 * self.served_stride() + align(4 * PROBE_WORDS, REGION_ALIGN)
    }

    /// Offset of the finished-blocks and started-blocks counters (`uint32_t[2]`).
    pub fn finished_blocks(&self) -> u64 {
        self.epoch() + REGION_ALIGN
    }

    /// Offset of this rank's notes of its eager ticketed calls (`RawArrivalNote[2]`, by call
    /// parity), which only its own kernels touch.
    pub fn arrival_note(&self) -> u64 {
        self.finished_blocks() + REGION_ALIGN
    }

    /// Offset of the arrival board (`RawBoardSlot[BOARD_SLOTS]`): every rank's tickets go to
    /// rank 0's.
    pub fn board(&self) -> u64 {
        self.arrival_note() + REGION_ALIGN
    }

    fn board_bytes() -> u64 {
        BOARD_SLOTS as u64 * std::mem::size_of::<RawBoardSlot>() as u64
    }

    /// Offset of the graph state (`RawGraphState`); its `board` is used on rank 0 only.
    pub fn graph(&self) -> u64 {
        self.board() + align(Self::board_bytes(), REGION_ALIGN)
    }

    /// Offset of the graph launches' arrival board (`RawBoardSlot[BOARD_SLOTS]`).
    pub fn graph_board(&self) -> u64 {
        self.graph() + std::mem::offset_of!(RawGraphState, board) as u64
    }

    fn graph_bytes() -> u64 {
        std::mem::size_of::<RawGraphState>() as u64
    }

    /// Bytes to allocate: everything, rounded up to the IPC granule.
    pub fn allocation_bytes(&self) -> u64 {
        align(
            self.graph() + align(Self::graph_bytes(), REGION_ALIGN),
            ALLOCATION_GRANULE,
        )
    }

    /// The base address of the allocation `peer` describes (from its flags, which never move).
    pub fn base_of(&self, peer: &RawPeer) -> u64 {
        peer.flags[0] - self.flags(0)
    }

    /// The `RawPeer` of the rank whose allocation is mapped at `base` in this process and
    /// whose failure word (in host memory, `super::failure`) this process's GPU addresses at
    /// `failed`.
    pub fn peer(&self, base: u64, failed: u64) -> RawPeer {
        RawPeer {
            arena: [base + self.arena(0), base + self.arena(1)],
            flags: [base + self.flags(0), base + self.flags(1)],
            failed,
            served: [base + self.served(0), base + self.served(1)],
        }
    }
}

/// Both parities of arenas of `arena_bytes` each, at the start of an allocation: a staging's
/// own, or one grown apart from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaLayout {
    /// Bytes of one arena parity.
    pub arena_bytes: u64,
}

impl ArenaLayout {
    fn stride(&self) -> u64 {
        align(self.arena_bytes.max(1), REGION_ALIGN)
    }

    /// Offset of the arena of `parity`.
    pub fn arena(&self, parity: usize) -> u64 {
        parity as u64 * self.stride()
    }

    /// Bytes of an allocation holding both arenas alone, rounded up to the IPC granule.
    pub fn allocation_bytes(&self) -> u64 {
        align(2 * self.stride(), ALLOCATION_GRANULE)
    }

    /// `peer` with its arenas in the allocation at `base` (mapped in this process).
    pub fn moved(&self, peer: RawPeer, base: u64) -> RawPeer {
        RawPeer {
            arena: [base + self.arena(0), base + self.arena(1)],
            ..peer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_disjoint_aligned_and_fit_the_granule() {
        for (arena_bytes, values, blocks, ranks) in [
            (0, 0, 1, 1),
            (1, 1, 1, 2),
            (3 << 20, 40, 16, 8),
            (64, 900, 24, 3),
        ] {
            let l = StagingLayout {
                arena_bytes,
                values,
                blocks,
                ranks,
            };
            let regions = [
                (l.arena(0), arena_bytes),
                (l.arena(1), arena_bytes),
                (l.flags(0), values * blocks * 4),
                (l.flags(1), values * blocks * 4),
                (l.served(0), ranks * blocks * 8),
                (l.served(1), ranks * blocks * 8),
                (l.probe_word(0), 4 * PROBE_WORDS),
                (l.epoch(), 8),
                (l.finished_blocks(), 8),
                (l.arrival_note(), 96),
                (l.board(), StagingLayout::board_bytes()),
                (l.graph(), StagingLayout::graph_bytes()),
            ];
            for (i, &(at, len)) in regions.iter().enumerate() {
                assert_eq!(at % REGION_ALIGN, 0);
                assert!(at + len <= l.allocation_bytes());
                for &(other, other_len) in &regions[i + 1..] {
                    assert!(at + len <= other || other + other_len <= at, "{l:?}");
                }
            }
            assert_eq!(l.allocation_bytes() % ALLOCATION_GRANULE, 0);
            assert!(l.graph() < l.graph_board() && l.graph_board() < l.allocation_bytes());
            let p = l.peer(1 << 40, 1 << 41);
            assert_eq!(p.flags[1], (1 << 40) + l.flags(1));
            assert_eq!(l.base_of(&p), 1 << 40);
            // Arenas grown apart leave everything else where it was.
            let grown = ArenaLayout {
                arena_bytes: 3 << 20,
            };
            let moved = grown.moved(p, 1 << 42);
            assert_eq!(moved.arena, [1 << 42, (1 << 42) + (3 << 20)]);
            assert_eq!(
                (moved.flags, moved.served, moved.failed),
                (p.flags, p.served, p.failed)
            );
            assert_eq!(l.base_of(&moved), 1 << 40);
            assert!(grown.arena(1) + grown.arena_bytes <= grown.allocation_bytes());
            assert_eq!(grown.allocation_bytes() % ALLOCATION_GRANULE, 0);
        }
    }
}

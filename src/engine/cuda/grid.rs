//! The fixed grid of a communicator's kernels: how many plan blocks each rank runs, chosen once
//! per communicator (block `b` always covers the same bytes of every chunk, which the per-block
//! flags rely on), the same on every rank of a homogeneous server.

/// Threads per plan block: the most the kernel takes.
pub const THREADS: u32 = crate::gpu::launch::MAX_THREADS;

/// The fewest plan blocks a rank's grid takes.
pub const MIN_BLOCKS: u32 = 8;
/// The most plan blocks a rank's grid takes (and what `doctor` sizes the staging for).
pub const MAX_BLOCKS: u32 = 32;

/// Bytes of one chunk a plan block should have at the largest message the staging takes: one
/// batch of loads in flight for each of its threads (8 x 16 B x 512 threads).
pub const BLOCK_MIN_BYTES: usize = 64 << 10;

/// The plan blocks of each rank of a `ranks`-rank communicator, one rank per GPU of `sms`
/// multiprocessors, whose staging takes messages of up to `buffer_bytes`: a quarter of the
/// multiprocessors (one 512-thread block each; the rest stay with the job's kernels that
/// overlap the collective), no more than give each block [`BLOCK_MIN_BYTES`] of a chunk of
/// the largest message (`buffer_bytes / ranks`, the smaller pieces of pipelined plans
/// included), within [`MIN_BLOCKS`, `MAX_BLOCKS`]. 32 on an H100/H200 (132 multiprocessors)
/// and 27 on an A100 (108) with the default buffer: about 2 MiB of loads in flight, where a
/// link of about 450 GB/s and a few microseconds of latency needs 1-2 MiB. Not measured on a
/// GPU.
pub fn blocks_for(sms: u32, buffer_bytes: usize, ranks: usize) -> u32 {
    let by_buffer = buffer_bytes / ranks.max(1) / BLOCK_MIN_BYTES;
    (sms / 4)
        .min(u32::try_from(by_buffer).unwrap_or(u32::MAX))
        .clamp(MIN_BLOCKS, MAX_BLOCKS)
}

/// The plan blocks of each rank when `ranks` ranks share one GPU of `sms` multiprocessors
/// (the bench): every rank's blocks must be resident at once (they wait on each other's
/// flags), one per multiprocessor (the AllReduce kernel's registers fill one; each rank's
/// arrival protocol runs in a warp of its plan block 0), with one delay kernel (`--delay-us`)
/// beside them. Too many ranks for the GPU is an error: a grid that cannot be resident would
/// wait forever.
pub fn shared_gpu_blocks(sms: u32, ranks: usize) -> Result<u32, String> {
    let ranks = ranks.max(1) as u32;
    let blocks = sms.saturating_sub(1) / ranks;
    if blocks == 0 {
        return Err(format!(
            "{ranks} ranks sharing one GPU need {} multiprocessors (one block each, one per multiprocessor, and one for the delay kernel); this GPU has {sms}",
            ranks + 1
        ));
    }
    Ok(blocks.min(MAX_BLOCKS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_follows_the_multiprocessors_within_bounds() {
        let buffer = crate::config::DEFAULT_BUFFER_BYTES;
        assert_eq!(blocks_for(132, buffer, 8), 32, "H100/H200");
        assert_eq!(blocks_for(108, buffer, 8), 27, "A100");
        assert_eq!(blocks_for(32, buffer, 8), MIN_BLOCKS);
        assert_eq!(blocks_for(0, buffer, 8), MIN_BLOCKS, "an unknown count");
        assert_eq!(blocks_for(1000, buffer, 8), MAX_BLOCKS);
        // A small buffer: each block keeps a batch of loads' worth of the largest chunk.
        assert_eq!(blocks_for(132, 16 << 20, 8), 32);
        assert_eq!(blocks_for(132, 12 << 20, 8), 24);
        assert_eq!(blocks_for(132, 12 << 20, 4), 32);
        assert_eq!(blocks_for(132, 1 << 20, 8), MIN_BLOCKS);
        assert_eq!(blocks_for(132, usize::MAX, 8), 32, "no overflow");
    }

    #[test]
    fn shared_gpu_grids_stay_resident() {
        assert_eq!(shared_gpu_blocks(132, 8), Ok(16));
        assert_eq!(shared_gpu_blocks(132, 2), Ok(MAX_BLOCKS));
        assert!(shared_gpu_blocks(8, 8).is_err());
        for sms in [58, 72, 108, 114, 132] {
            for ranks in 1..=64 {
                // Every rank's plan blocks (its arrival warp in plan block 0) and one delay kernel,
                // one block per multiprocessor; or an error when even one block cannot fit.
                match shared_gpu_blocks(sms, ranks) {
                    Ok(b) => assert!(b >= 1 && ranks as u32 * b < sms, "{ranks} on {sms}"),
                    Err(_) => assert!(ranks as u32 + 1 > sms, "{ranks} on {sms}"),
                }
            }
        }
    }
}

//! `--latency`: how long one load takes on the bench's GPU (a pointer chase, through a ring
//! that stays in the L2 and through one that does not), and the kernels' element-wise code
//! against the blocks it runs on, with the reads it keeps in flight estimated by Little's law:
//! reads per second times one unloaded load's latency (a loaded memory answers later, so this
//! is an estimate, and says so). On one GPU these are the L2 and HBM, not NVLink, and the
//! output says so.

use super::bandwidth::apply_args;
use super::timing::Timer;
use super::{GpuKernels, THREADS};
use crate::cli::bench::options::BenchOptions;
use crate::cli::rng::Rng;
use crate::engine::cuda::driver::{DeviceMemory, GpuError};
use crate::engine::cuda::grid::blocks_for;
use crate::gpu::launch::RawChase;
use cudarc::driver::sys::CUdevice_attribute;
use std::cell::Cell;

/// The largest ring chased in the L2 (a quarter of the L2 at most).
const L2_RING_MAX_BYTES: usize = 1 << 20;
/// The smallest ring chased in memory (at least four times the L2).
const MEMORY_RING_MIN_BYTES: usize = 16 << 20;
/// Dependent loads in the shorter of the two timed chases (the longer makes twice as many;
/// their difference cancels the launch).
const HOPS: u64 = 20_000;
/// Timed launches of each chase.
const CHASE_RUNS: usize = 3;
/// Of the sweep's best rate, the share the fewest blocks reaching it are named for.
const NEAR_BEST: f64 = 0.9;

/// The ring sizes for a GPU of `l2_bytes` of L2: one of at most a quarter of it (warmed, its
/// loads hit the L2) and one of at least four times it, powers of two.
fn ring_bytes(l2_bytes: usize) -> (usize, usize) {
    let quarter = (l2_bytes / 4).max(4096);
    let in_l2 = L2_RING_MAX_BYTES.min(1 << quarter.ilog2());
    let in_memory = (4 * l2_bytes)
        .max(MEMORY_RING_MIN_BYTES)
        .next_power_of_two();
    (in_l2, in_memory)
}

/// A ring of 8-byte words on the GPU, each the byte offset of the next, in one cycle through
/// every word in a seeded random order, and the host's copy to walk it.
struct Ring {
    /// The host's copy: word i holds the byte offset of word i's successor.
    words: Vec<u64>,
    /// The GPU's copy.
    memory: DeviceMemory,
    /// `uint64_t` on the GPU: where the chase stands (`RawChase::at`).
    at: DeviceMemory,
    /// Where the chase stands by the host's walk of the same loads.
    expected: u64,
}

impl Ring {
    /// A ring of `bytes / 8` words, one random cycle (Sattolo's shuffle) seeded by `seed`.
    fn new(gpu: &GpuKernels, bytes: usize, seed: u64) -> Result<Ring, GpuError> {
        let n = bytes / 8;
        let mut words: Vec<u64> = (0..n as u64).collect();
        let mut rng = Rng::new(seed);
        for i in (1..n).rev() {
            let j = rng.below(i as u64) as usize;
            words.swap(i, j);
        }
        // Sattolo's shuffle leaves one cycle: word i's successor is words[i]; as a byte offset:
        for next in &mut words {
            *next *= 8;
        }
        let memory = DeviceMemory::for_upload(&gpu.device, bytes)?;
        memory.upload(&words)?;
        let at = DeviceMemory::zeroed(&gpu.device, 8)?;
        Ok(Ring {
            words,
            memory,
            at,
            expected: 0,
        })
    }

    /// Queues a chase of `hops` loads on `timer`'s stream from where the last one ended, and
    /// counts them in `queued`.
    fn chase(
        &self,
        gpu: &GpuKernels,
        timer: &Timer,
        hops: u64,
        queued: &Cell<u64>,
    ) -> Result<(), GpuError> {
        let args = RawChase {
            ring: self.memory.ptr,
            at: self.at.ptr,
            hops,
        };
        // SAFETY: the ring and the word `at` live as long as `self`, which outlives the
        // synchronised timing; every offset in the ring lies inside it.
        unsafe { gpu.chase.launch(timer.stream.raw, 1, 32, &args) }?;
        queued.set(queued.get() + hops);
        Ok(())
    }

    /// Walks `hops` loads on the host, as the GPU did.
    fn walk(&mut self, hops: u64) {
        for _ in 0..hops {
            self.expected = self.words[(self.expected / 8) as usize];
        }
    }

    /// Nanoseconds per dependent load: `CHASE_RUNS` chases of `HOPS` and of `2 x HOPS` loads
    /// (each after an untimed one), the difference over `HOPS`; the GPU's walk checked
    /// against the host's.
    fn latency_ns(&mut self, gpu: &GpuKernels, timer: &Timer) -> Result<f64, String> {
        let err = |e: GpuError| e.to_string();
        let queued = Cell::new(0);
        let short = timer
            .per_run(CHASE_RUNS, &|| self.chase(gpu, timer, HOPS, &queued))
            .map_err(err)?;
        let long = timer
            .per_run(CHASE_RUNS, &|| self.chase(gpu, timer, 2 * HOPS, &queued))
            .map_err(err)?;
        self.walk(queued.get());
        self.check(timer)?;
        Ok((long - short).max(0.0) / HOPS as f64 * 1e9)
    }

    /// Runs once around the whole ring and half way round again (it is then in whatever
    /// cache holds it; the half turn makes the check tell a chase from none: one whole turn of
    /// the one cycle ends where it began).
    fn warm(&mut self, gpu: &GpuKernels, timer: &Timer) -> Result<(), String> {
        let queued = Cell::new(0);
        let hops = self.words.len() as u64 * 3 / 2;
        self.chase(gpu, timer, hops, &queued)
            .map_err(|e| e.to_string())?;
        self.walk(queued.get());
        self.check(timer)
    }

    /// Fails unless the GPU's chase ended where the host's walk did.
    fn check(&self, timer: &Timer) -> Result<(), String> {
        timer.stream.synchronize().map_err(|e| e.to_string())?;
        let mut at = [0u64];
        self.at.download(&mut at).map_err(|e| e.to_string())?;
        if at[0] != self.expected {
            return Err(format!(
                "the pointer chase ended at offset {} of its ring, where the host's walk of the same loads ends at {}",
                at[0], self.expected
            ));
        }
        Ok(())
    }
}

/// Prints one load's latency in the L2 and in memory (the rings sized from the GPU's L2, the
/// memory ring's upload flushed from it first), then the copy's and the reduce of 2's rate at
/// each grid from 1 block to two per SM (the library's AllReduce grid among them) on
/// `max_bytes`, with the reads each keeps in flight by Little's law (an estimate: the unloaded
/// latency). Ends with one `# latency summary:` line, which `scripts/gpu-check.sh` puts in its
/// table.
pub fn table(options: &BenchOptions, gpu: &GpuKernels, sms: u32) -> Result<(), String> {
    let err = |e: GpuError| e.to_string();
    let l2_bytes = gpu
        .device
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(err)?
        .max(0) as usize;
    let (l2_ring_bytes, memory_ring_bytes) = ring_bytes(l2_bytes);
    let timer = Timer::new(gpu).map_err(err)?;
    let mut l2_ring = Ring::new(gpu, l2_ring_bytes, 0x5eed_0001).map_err(err)?;
    l2_ring.warm(gpu, &timer)?;
    let l2_ns = l2_ring.latency_ns(gpu, &timer)?;
    drop(l2_ring);
    let mut memory_ring = Ring::new(gpu, memory_ring_bytes, 0x5eed_0002).map_err(err)?;
    // The upload went through the L2 and may sit there still: write twice the L2 over it.
    drop(DeviceMemory::zeroed(&gpu.device, 2 * l2_bytes).map_err(err)?);
    let memory_ns = memory_ring.latency_ns(gpu, &timer)?;
    drop(memory_ring);
    println!(
        "#\n# one load's latency, unloaded (ld.relaxed.sys, each waiting for the last; an L2 of {} KiB; one GPU: its L2 and HBM, not NVLink)",
        l2_bytes >> 10
    );
    println!(
        "#   {:>7} KiB ring (in the L2)                  {l2_ns:>8.0} ns",
        l2_ring_bytes >> 10
    );
    println!(
        "#   {:>7} KiB ring (random loads from memory)   {memory_ns:>8.0} ns",
        memory_ring_bytes >> 10
    );

    let bytes = (options.max_bytes.max(1 << 20) as usize) / 16 * 16;
    let dtype = options.dtypes[0];
    let buffers = (0..3)
        .map(|_| DeviceMemory::zeroed(&gpu.device, bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let all_reduce_grid = blocks_for(sms, options.buffer_bytes, options.ranks);
    let mut grids: Vec<u32> = std::iter::successors(Some(1u32), |b| b.checked_mul(2))
        .take_while(|&b| b < 2 * sms)
        .chain([2 * sms, all_reduce_grid])
        .collect();
    grids.sort_unstable();
    grids.dedup();
    let from = if 3 * bytes < 4 * l2_bytes {
        "much of it from the L2: give -e at least 4/3 of the L2 for HBM"
    } else {
        "one GPU: HBM, not NVLink"
    };
    println!(
        "#\n# rate against the grid on {bytes} B of {} ({THREADS}-thread blocks; GB/s of memory traffic, bytes read + written; {from})",
        dtype.name()
    );
    println!("#   blocks      copy   reduce of 2   reduce of 2's reads in flight (~ rate x {memory_ns:.0} ns)");
    let iters = options.iters.max(5);
    let mut reduce_rates = Vec::with_capacity(grids.len());
    for &blocks in &grids {
        let mut rates = [0.0f64; 2];
        for (rate, operands) in rates.iter_mut().zip([1usize, 2]) {
            let args = apply_args(&buffers, operands, dtype, bytes);
            // SAFETY: every operand and the output hold `bytes` bytes and outlive the timing.
            let t = timer
                .per_run(iters, &|| unsafe {
                    gpu.probe.launch(timer.stream.raw, blocks, THREADS, &args)
                })
                .map_err(err)?;
            *rate = (operands + 1) as f64 * bytes as f64 / t / 1e9;
        }
        let in_flight = in_flight_kib(rates[1], 2, memory_ns);
        let mark = if blocks == all_reduce_grid {
            "  (the AllReduce grid)"
        } else {
            ""
        };
        println!(
            "#   {blocks:>6} {:>9.1} {:>13.1} {in_flight:>12.0} KiB{mark}",
            rates[0], rates[1]
        );
        reduce_rates.push(rates[1]);
    }
    let best = reduce_rates.iter().cloned().fold(0.0, f64::max);
    let near_best = grids
        .iter()
        .zip(&reduce_rates)
        .find(|(_, &r)| r >= NEAR_BEST * best)
        .map_or(0, |(&b, _)| b);
    let at_grid = grids
        .iter()
        .position(|&b| b == all_reduce_grid)
        .map_or(0.0, |i| reduce_rates[i]);
    println!(
        "# latency summary: L2 {l2_ns:.0} ns, memory {memory_ns:.0} ns per dependent load (unloaded); reduce of 2 at the AllReduce grid ({all_reduce_grid} blocks) {at_grid:.0} GB/s, ~{:.0} KiB of reads in flight, {:.0}% of its best; {:.0}% of the best from {near_best} blocks ({from})",
        in_flight_kib(at_grid, 2, memory_ns),
        100.0 * at_grid / best.max(f64::MIN_POSITIVE),
        100.0 * NEAR_BEST,
    );
    Ok(())
}

/// KiB of reads in flight by Little's law: the read share of `rate` (GB/s of memory traffic
/// by `operands` reads and one write per element) times `latency_ns`.
fn in_flight_kib(rate: f64, operands: usize, latency_ns: f64) -> f64 {
    let reads_per_s = rate * 1e9 * operands as f64 / (operands + 1) as f64;
    reads_per_s * latency_ns * 1e-9 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::{in_flight_kib, ring_bytes};

    #[test]
    fn rings_fit_in_the_l2_and_exceed_it_fourfold() {
        // H100 and H200: 50 MiB of L2.
        assert_eq!(ring_bytes(50 << 20), (1 << 20, 256 << 20));
        // The emulated GPU's 4 MiB: the memory ring at its floor, the L2 ring a quarter.
        assert_eq!(ring_bytes(4 << 20), (1 << 20, 16 << 20));
        // A GPU that reports no L2: the smallest ring in it, the floor beyond it.
        assert_eq!(ring_bytes(0), (4096, 16 << 20));
    }

    #[test]
    fn littles_law_counts_the_reads_only() {
        // 300 GB/s of traffic by 2 reads and 1 write: 200 GB/s of reads, x 1 us = 200 KB.
        let kib = in_flight_kib(300.0, 2, 1000.0);
        assert!((kib - 200e3 / 1024.0).abs() < 1e-6, "{kib}");
    }
}

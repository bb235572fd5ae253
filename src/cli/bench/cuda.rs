//! `stragglar bench --backend cuda`: the GPU engine with every rank a thread of this process
//! on one GPU, each on its own stream, peers' staging addressed as plain device pointers
//! (the kernels and the protocol are those of the library; only the setup differs: no NCCL
//! communicator, no IPC). Every element of every rank is checked, and ranks must agree bit
//! for bit. `--bandwidth` first measures the kernels' element-wise code against the device's
//! own device-to-device copy rate.

use std::sync::Arc;

use super::data;
use super::options::{BenchAlgo, BenchOptions};
use crate::engine::cuda::driver::{
    copy_async, Device, DeviceMemory, Event, GpuError, Kernel, Stream,
};
use crate::engine::cuda::rank::{CudaRank, RankConfig};
use crate::engine::cuda::staging::StagingLayout;
use crate::engine::host::runner::{PlanCache, Shape};
use crate::gpu::kernels::{op_code, ALL_REDUCE_KERNEL, APPLY_PROBE_KERNEL};
use crate::gpu::launch::RawApply;
use crate::gpu::nvrtc;
use crate::gpu::probe::{probe, Driver};
use crate::plan::Plan;
use crate::reduce::{DataType, ReduceOp, Scale};
use crate::schedule::Algorithm;

/// Threads per block of the AllReduce kernel.
const THREADS: u32 = 512;
/// The most blocks one rank's grid takes.
const MAX_BLOCKS: u32 = 32;

/// The loaded kernels of one GPU.
pub struct GpuKernels {
    pub device: Arc<Device>,
    pub all_reduce: Arc<Kernel>,
    pub probe: Kernel,
    pub arch: String,
}

/// Opens GPU 0 and loads the kernels (compiled with NVRTC, or from the cache); the reason as
/// text when anything is missing.
pub fn open_gpu() -> Result<GpuKernels, String> {
    match probe().driver {
        Driver::Devices(n) if n > 0 => {}
        Driver::Devices(_) => return Err("the CUDA driver sees no GPU".into()),
        Driver::Missing => return Err("no CUDA driver (libcuda.so) on this machine".into()),
        Driver::Unusable(why) => return Err(why),
    }
    let gpu = |e: GpuError| e.to_string();
    let device = Device::open(0).map_err(gpu)?;
    let arch = device.arch().map_err(gpu)?;
    let cache = nvrtc::default_cache_dir(crate::config::get().cache_dir.as_deref());
    let (cubin, _) = nvrtc::cubin_cached(&arch, cache.as_deref()).map_err(|e| e.to_string())?;
    let all_reduce = Arc::new(Kernel::load(&device, &cubin, ALL_REDUCE_KERNEL).map_err(gpu)?);
    let probe = Kernel::load(&device, &cubin, APPLY_PROBE_KERNEL).map_err(gpu)?;
    Ok(GpuKernels {
        device,
        all_reduce,
        probe,
        arch,
    })
}

/// The grid of each rank when `ranks` ranks share one GPU of `sms` multiprocessors: every
/// rank's blocks must be resident at once (they wait on each other's flags).
pub fn shared_gpu_blocks(sms: u32, ranks: usize) -> u32 {
    (sms / ranks.max(1) as u32).clamp(1, MAX_BLOCKS)
}

/// One size's result.
struct Row {
    bytes: u64,
    count: usize,
    /// Microseconds per call, out of place and in place.
    time_us: [f64; 2],
    wrong: [u64; 2],
    /// Rank outputs that differ from rank 0's.
    disagreements: u64,
}

/// Runs `stragglar bench --backend cuda`; exit status 1 on any wrong element or failure.
pub fn run(options: &BenchOptions) -> i32 {
    let gpu = match open_gpu() {
        Ok(g) => g,
        Err(why) => {
            eprintln!("stragglar bench --backend cuda: {why}");
            return 1;
        }
    };
    match run_on(options, &gpu) {
        Ok(0) => 0,
        Ok(wrong) => {
            eprintln!("stragglar bench: {wrong} wrong element(s) or disagreement(s)");
            1
        }
        Err(e) => {
            eprintln!("stragglar bench --backend cuda: {e}");
            1
        }
    }
}

fn run_on(options: &BenchOptions, gpu: &GpuKernels) -> Result<u64, String> {
    let err = |e: GpuError| e.to_string();
    let sms = gpu.device.sm_count().map_err(err)? as u32;
    let blocks = shared_gpu_blocks(sms, options.ranks);
    println!(
        "# stragglar bench --backend cuda: {} ranks as threads on one {} ({}, {sms} SMs), {blocks} x {THREADS} threads per rank",
        options.ranks,
        gpu.device.name().map_err(err)?,
        gpu.arch
    );
    if options.bandwidth {
        bandwidth_table(options, gpu, sms)?;
    }
    let algorithm = match options.algo {
        BenchAlgo::Ring => Algorithm::Ring,
        _ => Algorithm::Stragglar,
    };
    let shape = |dtype| Shape {
        algorithm,
        ranks: options.ranks,
        straggler: options.straggler,
        dtype,
    };
    let sizes = options.sizes();
    let mut cache = PlanCache::default();
    let mut layout = StagingLayout {
        arena_bytes: 64,
        values: 1,
        blocks: blocks as u64,
    };
    for &dtype in &options.dtypes {
        for &bytes in &sizes {
            let plan = cache.get(shape(dtype), bytes as usize / dtype.size())?;
            layout.arena_bytes = layout.arena_bytes.max(plan.max_arena_bytes() as u64);
            layout.values = layout.values.max(plan.max_values() as u64);
        }
    }
    if layout.arena_bytes > options.buffer_bytes as u64 {
        return Err(format!(
            "the largest size needs {} B of staging per rank and parity; --buffer-bytes allows {} (lower -e)",
            layout.arena_bytes, options.buffer_bytes
        ));
    }
    let mut ranks = Vec::with_capacity(options.ranks);
    for rank in 0..options.ranks {
        let config = RankConfig {
            rank,
            ranks: options.ranks,
            layout,
            blocks,
            threads: THREADS,
            timeout: options.timeout_ms.map(std::time::Duration::from_millis),
        };
        ranks.push(CudaRank::new(&gpu.device, &gpu.all_reduce, config).map_err(err)?);
    }
    let peers: Vec<_> = ranks.iter().map(CudaRank::own_peer).collect();
    for rank in &mut ranks {
        rank.connect(&peers).map_err(|e| e.to_string())?;
    }
    let streams = (0..options.ranks)
        .map(|_| Stream::new(&gpu.device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    println!(
        "#\n# {:>12} {:>12} {:>8} {:>9} {:>4} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
        "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
    );
    println!(
        "# {:>12} {:>12} {:>8} {:>9} {:>4} | {:>10} {:>8} {:>8} {:>6} | {:>10} {:>8} {:>8} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    let mut bad = 0;
    let mut seed = 0;
    for &dtype in &options.dtypes {
        for &op in &options.ops {
            for &bytes in &sizes {
                seed += 1;
                let count = bytes as usize / dtype.size();
                let plan = cache.get(shape(dtype), count)?.clone();
                let row = run_size(options, gpu, &mut ranks, &streams, &plan, op, seed)
                    .map_err(|e| e.to_string())?;
                bad += row.wrong[0] + row.wrong[1] + row.disagreements;
                print_row(options, &row, dtype, op, algorithm);
            }
        }
    }
    for rank in &ranks {
        if rank.status() != 0 {
            return Err(format!(
                "a kernel gave up: {}",
                crate::engine::cuda::rank::status_text(rank.status())
            ));
        }
    }
    println!("# wrong elements and rank disagreements: {bad}");
    Ok(bad)
}

/// Prints one nccl-tests style line.
fn print_row(
    options: &BenchOptions,
    row: &Row,
    dtype: DataType,
    op: ReduceOp,
    algorithm: Algorithm,
) {
    let bw = |t: f64| {
        let alg = if t > 0.0 {
            row.bytes as f64 / t / 1e3
        } else {
            0.0
        };
        let n = options.ranks as f64;
        (alg, alg * 2.0 * (n - 1.0) / n)
    };
    let (a0, b0) = bw(row.time_us[0]);
    let (a1, b1) = bw(row.time_us[1]);
    println!(
        "  {:>12} {:>12} {:>8} {:>9} {:>4} | {:>10.1} {:>8.2} {:>8.2} {:>6} | {:>10.1} {:>8.2} {:>8.2} {:>6}",
        row.bytes,
        row.count,
        dtype.name(),
        op.name(),
        if algorithm == Algorithm::Ring { "ring" } else { "sg" },
        row.time_us[0],
        a0,
        b0,
        row.wrong[0] + row.disagreements,
        row.time_us[1],
        a1,
        b1,
        row.wrong[1]
    );
}

/// The copy-in scaling of `rank` for the check data.
fn scale_of(dtype: DataType, op: ReduceOp, ranks: usize, rank: usize) -> Scale {
    let encoded = data::encode(dtype, data::premul_scalar(rank) as f64);
    let mut scalar = [0u8; 8];
    scalar[..encoded.len()].copy_from_slice(&encoded);
    Scale::for_op(op, dtype, ranks, Some(scalar)).expect("a host scalar")
}

fn run_size(
    options: &BenchOptions,
    gpu: &GpuKernels,
    ranks: &mut [CudaRank],
    streams: &[Stream],
    plan: &Plan,
    op: ReduceOp,
    seed: usize,
) -> Result<Row, Box<dyn std::error::Error>> {
    let n = options.ranks;
    let dtype = plan.dtype;
    let bytes = plan.count * dtype.size();
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| data::input(dtype, op, r, plan.count, seed))
        .collect();
    let device_inputs = inputs
        .iter()
        .map(|d| {
            let m = DeviceMemory::zeroed(&gpu.device, bytes)?;
            m.upload(d)?;
            Ok(m)
        })
        .collect::<Result<Vec<_>, GpuError>>()?;
    let outputs = (0..n)
        .map(|_| DeviceMemory::zeroed(&gpu.device, bytes))
        .collect::<Result<Vec<_>, GpuError>>()?;
    let mut row = Row {
        bytes: bytes as u64,
        count: plan.count,
        time_us: [0.0; 2],
        wrong: [0; 2],
        disagreements: 0,
    };
    for (placement, in_place) in [false, true].into_iter().enumerate() {
        let buffers = |r: usize| {
            if in_place {
                (outputs[r].ptr, outputs[r].ptr)
            } else {
                (device_inputs[r].ptr, outputs[r].ptr)
            }
        };
        // The checked call: in place, the output buffer starts as the input.
        for r in 0..n {
            if in_place {
                outputs[r].upload(&inputs[r])?;
            }
            ranks[r].prepare(plan)?;
        }
        for r in 0..n {
            let (input, output) = buffers(r);
            // SAFETY: input and output hold `plan.count` elements on this device and live
            // until the streams are synchronised below.
            unsafe {
                ranks[r].all_reduce(
                    plan,
                    op,
                    scale_of(dtype, op, n, r),
                    input,
                    output,
                    streams[r].raw,
                )
            }?;
        }
        for s in streams {
            s.synchronize()?;
        }
        let mut first = None;
        for output in &outputs {
            let mut out = vec![0u8; bytes];
            output.download(&mut out)?;
            if options.check > 0 {
                row.wrong[placement] += data::count_wrong(dtype, op, n, &out, seed);
            }
            let digest = data::digest(&out);
            row.disagreements += (*first.get_or_insert(digest) != digest) as u64;
        }
        // Timing: warm-up, then `iters` calls queued back to back on every rank's stream.
        let call = |ranks: &mut [CudaRank]| -> Result<(), Box<dyn std::error::Error>> {
            for r in 0..n {
                let (input, output) = buffers(r);
                // SAFETY: as above; synchronised before the buffers drop.
                unsafe {
                    ranks[r].all_reduce(
                        plan,
                        op,
                        scale_of(dtype, op, n, r),
                        input,
                        output,
                        streams[r].raw,
                    )
                }?;
            }
            Ok(())
        };
        for _ in 0..options.warmup {
            call(ranks)?;
        }
        let starts = (0..n)
            .map(|_| Event::new(&gpu.device))
            .collect::<Result<Vec<_>, _>>()?;
        let ends = (0..n)
            .map(|_| Event::new(&gpu.device))
            .collect::<Result<Vec<_>, _>>()?;
        for r in 0..n {
            starts[r].record(&streams[r])?;
        }
        for _ in 0..options.iters {
            call(ranks)?;
        }
        for r in 0..n {
            ends[r].record(&streams[r])?;
        }
        let mut slowest = 0f64;
        for r in 0..n {
            slowest = slowest.max(starts[r].elapsed_ms(&ends[r])? as f64);
        }
        row.time_us[placement] = slowest * 1e3 / options.iters as f64;
    }
    Ok(row)
}

/// Prints the bandwidth of the kernels' element-wise code (1, 2 and `ranks - 1` operands)
/// against `cuMemcpyDtoD` on the same bytes, all as memory traffic (bytes read + written).
fn bandwidth_table(options: &BenchOptions, gpu: &GpuKernels, sms: u32) -> Result<(), String> {
    let err = |e: GpuError| e.to_string();
    let bytes = (options.max_bytes.max(1 << 20) as usize) / 16 * 16;
    let operands = (options.ranks - 1).clamp(2, 8);
    let buffers = (0..=operands)
        .map(|_| DeviceMemory::zeroed(&gpu.device, bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let stream = Stream::new(&gpu.device).map_err(err)?;
    let (start, end) = (
        Event::new(&gpu.device).map_err(err)?,
        Event::new(&gpu.device).map_err(err)?,
    );
    let iters = options.iters.max(5);
    let time = |work: &dyn Fn() -> Result<(), GpuError>| -> Result<f64, GpuError> {
        work()?;
        start.record(&stream)?;
        for _ in 0..iters {
            work()?;
        }
        end.record(&stream)?;
        Ok(start.elapsed_ms(&end)? as f64 * 1e-3 / iters as f64)
    };
    let copy_rate = {
        // SAFETY: both buffers hold `bytes` bytes and outlive the synchronised timing.
        let t = time(&|| unsafe { copy_async(&stream, buffers[0].ptr, buffers[1].ptr, bytes) })
            .map_err(err)?;
        2.0 * bytes as f64 / t / 1e9
    };
    println!(
        "#\n# kernel bandwidth on {bytes} B of {} (memory traffic: bytes read + written)",
        options.dtypes[0].name()
    );
    println!("#   cuMemcpyDtoD                    {copy_rate:>8.1} GB/s  (the reference)");
    for k in [1usize, 2, operands] {
        let mut args = RawApply {
            output: buffers[0].ptr,
            bytes: bytes as u64,
            operand_count: k as u32,
            op: op_code(ReduceOp::Sum),
            datatype: options.dtypes[0].nccl_code(),
            ..Default::default()
        };
        for (slot, b) in args.operands.iter_mut().zip(&buffers[1..]) {
            *slot = b.ptr;
        }
        // SAFETY: every operand and the output hold `bytes` bytes and outlive the timing.
        let t = time(&|| unsafe { gpu.probe.launch(stream.raw, sms * 2, THREADS, &args) })
            .map_err(err)?;
        let rate = (k + 1) as f64 * bytes as f64 / t / 1e9;
        let what = if k == 1 {
            "copy".to_string()
        } else {
            format!("reduce of {k}")
        };
        println!(
            "#   {APPLY_PROBE_KERNEL} {what:<10} {rate:>8.1} GB/s  {:>5.1}% of the copy rate",
            100.0 * rate / copy_rate
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_gpu_grids_stay_resident() {
        assert_eq!(shared_gpu_blocks(132, 8), 16);
        assert_eq!(shared_gpu_blocks(132, 2), MAX_BLOCKS);
        assert_eq!(shared_gpu_blocks(4, 8), 1);
        for ranks in 1..=64 {
            let b = shared_gpu_blocks(132, ranks);
            assert!(b >= 1 && (b as usize * ranks <= 132 || b == 1));
        }
    }

    #[test]
    fn without_a_driver_the_backend_says_why() {
        if let Driver::Devices(n) = probe().driver {
            if n > 0 {
                return;
            }
        }
        let why = open_gpu().err().expect("no GPU here");
        assert!(!why.is_empty());
    }
}

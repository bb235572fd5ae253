//! `--bandwidth`: the kernels' element-wise code (the bandwidth probe kernel) against the
//! device's own `cuMemcpyDtoD` on the same bytes.

use super::timing::Timer;
use super::{GpuKernels, THREADS};
use crate::cli::bench::options::BenchOptions;
use crate::engine::cuda::driver::{copy_async, DeviceMemory, GpuError};
use crate::engine::cuda::grid::blocks_for;
use crate::gpu::kernels::{op_code, APPLY_PROBE_KERNEL};
use crate::gpu::launch::RawApply;
use crate::reduce::{DataType, ReduceOp};

/// Prints the bandwidth of the kernels' element-wise code (1, 2 and `ranks - 1` operands)
/// against `cuMemcpyDtoD` on the same bytes, all as memory traffic (bytes read + written), at
/// two grids of `THREADS`-thread blocks: two per SM (the device's rate) and the library's
/// AllReduce grid (`blocks_for` the device, what one call on a GPU of its own gets). Ends with one
/// `# bandwidth summary:` line, which `scripts/gpu-check.sh` puts in its table. With fp16 or
/// bf16, the device's conversions are first checked against `src/reduce` (an error if they
/// differ), on a `# conversions:` line.
pub fn table(options: &BenchOptions, gpu: &GpuKernels, sms: u32) -> Result<(), String> {
    let err = |e: GpuError| e.to_string();
    let bytes = (options.max_bytes.max(1 << 20) as usize) / 16 * 16;
    let operands = (options.ranks - 1).clamp(2, 8);
    let buffers = (0..=operands)
        .map(|_| DeviceMemory::zeroed(&gpu.device, bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let timer = Timer::new(gpu).map_err(err)?;
    let iters = options.iters.max(5);
    let time = |work: &dyn Fn() -> Result<(), GpuError>| timer.per_run(iters, work);
    if let dtype @ (DataType::F16 | DataType::Bf16) = options.dtypes[0] {
        let checked = super::conversions::check(
            gpu,
            dtype,
            blocks_for(sms, options.buffer_bytes, options.ranks),
        )?;
        println!(
            "# conversions: {checked} {} sums on the device match src/reduce bit for bit",
            dtype.name()
        );
    }
    let copy_rate = {
        // SAFETY: both buffers hold `bytes` bytes and outlive the synchronised timing.
        let t =
            time(&|| unsafe { copy_async(&timer.stream, buffers[0].ptr, buffers[1].ptr, bytes) })
                .map_err(err)?;
        2.0 * bytes as f64 / t / 1e9
    };
    println!(
        "#\n# kernel bandwidth on {bytes} B of {} (memory traffic: bytes read + written)",
        options.dtypes[0].name()
    );
    println!("#   cuMemcpyDtoD                    {copy_rate:>8.1} GB/s  (the reference)");
    let mut summary = Vec::new();
    for (grid, blocks) in [
        ("device grid", sms * 2),
        (
            "AllReduce grid",
            blocks_for(sms, options.buffer_bytes, options.ranks),
        ),
    ] {
        println!("#   {grid}: {blocks} x {THREADS} threads");
        let mut shares = Vec::new();
        for k in [1usize, 2, operands] {
            let args = apply_args(&buffers, k, options.dtypes[0], bytes);
            // SAFETY: every operand and the output hold `bytes` bytes and outlive the timing.
            let t = time(&|| unsafe { gpu.probe.launch(timer.stream.raw, blocks, THREADS, &args) })
                .map_err(err)?;
            let rate = (k + 1) as f64 * bytes as f64 / t / 1e9;
            let what = if k == 1 {
                "copy".to_string()
            } else {
                format!("reduce of {k}")
            };
            let share = 100.0 * rate / copy_rate;
            println!("#   {APPLY_PROBE_KERNEL} {what:<10} {rate:>8.1} GB/s  {share:>5.1}% of the copy rate");
            shares.push(format!("{what} {share:.0}%"));
        }
        summary.push(format!("{grid} ({blocks} blocks): {}", shares.join(", ")));
    }
    println!(
        "# bandwidth summary: of {copy_rate:.0} GB/s (cuMemcpyDtoD), {}",
        summary.join("; ")
    );
    Ok(())
}

/// The bandwidth probe's arguments: the sum into `buffers[0]` of the `operands` buffers after
/// it (one operand: a copy), over `bytes` of `dtype`.
pub(super) fn apply_args(
    buffers: &[DeviceMemory],
    operands: usize,
    dtype: DataType,
    bytes: usize,
) -> RawApply {
    let mut args = RawApply {
        output: buffers[0].ptr,
        bytes: bytes as u64,
        operand_count: operands as u32,
        op: op_code(ReduceOp::Sum),
        datatype: dtype.nccl_code(),
        ..Default::default()
    };
    for (slot, b) in args.operands.iter_mut().zip(&buffers[1..=operands]) {
        *slot = b.ptr;
    }
    args
}

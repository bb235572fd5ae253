//! `--bandwidth` with fp16 or bf16: the kernels' conversions on the device (hardware `cvt`, NaN
//! pinned to the canonical `0x7fff`) checked against `src/reduce` bit for bit, before any rate
//! of that type is reported.

use super::{GpuKernels, THREADS};
use crate::engine::cuda::driver::{DeviceMemory, GpuError, Stream};
use crate::gpu::kernels::op_code;
use crate::gpu::launch::RawApply;
use crate::reduce::{combine, DataType, ReduceOp};

/// Pseudo-random pairs summed after the bit patterns (rounding, overflow, subnormal results).
const RANDOM_PAIRS: usize = 3 << 16;

/// Sums two fp16 or bf16 operands with the bandwidth probe on `blocks` blocks and compares the
/// result with `reduce::combine`: first every bit pattern plus `-0` (each value widened and
/// narrowed back, which is exact but for NaN, the canonical one), then pseudo-random pairs.
/// Returns how many sums matched; an error names the first mismatch.
pub fn check(gpu: &GpuKernels, dtype: DataType, blocks: u32) -> Result<usize, String> {
    let err = |e: GpuError| e.to_string();
    let patterns = 1usize << 16;
    let count = patterns + RANDOM_PAIRS;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u16
    };
    let a: Vec<u16> = (0..count)
        .map(|i| if i < patterns { i as u16 } else { next() })
        .collect();
    let b: Vec<u16> = (0..count)
        .map(|i| if i < patterns { 0x8000 } else { next() })
        .collect();
    let bytes = count * 2;
    let upload = |data: &[u16]| -> Result<DeviceMemory, GpuError> {
        let memory = DeviceMemory::for_upload(&gpu.device, bytes)?;
        memory.upload(data)?;
        Ok(memory)
    };
    let (a_dev, b_dev) = (upload(&a).map_err(err)?, upload(&b).map_err(err)?);
    let out_dev = DeviceMemory::zeroed(&gpu.device, bytes).map_err(err)?;
    let stream = Stream::new(&gpu.device).map_err(err)?;
    let mut args = RawApply {
        output: out_dev.ptr,
        bytes: bytes as u64,
        operand_count: 2,
        op: op_code(ReduceOp::Sum),
        datatype: dtype.nccl_code(),
        ..Default::default()
    };
    args.operands[0] = a_dev.ptr;
    args.operands[1] = b_dev.ptr;
    // SAFETY: both operands and the output hold `bytes` bytes and outlive the launch, which the
    // stream's synchronisation waits for.
    unsafe { gpu.probe.launch(stream.raw, blocks, THREADS, &args) }.map_err(err)?;
    stream.synchronize().map_err(err)?;
    let mut got = vec![0u16; count];
    out_dev.download(&mut got).map_err(err)?;
    let le = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut want = vec![0u8; bytes];
    combine(dtype, ReduceOp::Sum, &[&le(&a), &le(&b)], &mut want);
    let want: Vec<u16> = want
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    match (0..count).find(|&i| got[i] != want[i]) {
        None => Ok(count),
        Some(i) => Err(format!(
            "{} conversions on the device differ from src/reduce: {:#06x} + {:#06x} gave {:#06x}, not {:#06x}",
            dtype.name(),
            a[i],
            b[i],
            got[i],
            want[i]
        )),
    }
}

//! The kernel sources in `cuda/`, embedded in the library and assembled into one translation
//! unit for NVRTC (which has no file system and no CUDA headers to lean on).

use crate::reduce::ReduceOp;

use super::launch::{OP_AVG, OP_MAX, OP_MIN, OP_PREMULSUM, OP_PROD, OP_SUM};

/// The AllReduce kernel's entry point (an `nccl` prefix: profilers classify by it).
pub const ALL_REDUCE_KERNEL: &str = "ncclStragglarAllReduce";
/// The ticket kernel's entry point: the arrival record of a call that goes to NCCL.
pub const TICKET_KERNEL: &str = "ncclStragglarTicket";
/// The end kernel of a call that went to NCCL, queued after NCCL's: it notes when the call
/// finished on this rank, for the post-arrival time.
pub const TICKET_END_KERNEL: &str = "ncclStragglarTicketEnd";
/// The turn kernel of a graph call whose baseline is NCCL's captured work: the device's
/// choice, and on NCCL's turn the ticket (it never waits), before either conditional body.
pub const GRAPH_TURN_KERNEL: &str = "ncclStragglarGraphTurn";
/// The rest of a graph call's arrival protocol on NCCL's turn, beside NCCL's work in its body.
pub const GRAPH_ARRIVAL_KERNEL: &str = "ncclStragglarGraphArrival";
/// The end kernel of a graph call on NCCL's turn in the sample, after NCCL's work in a body
/// of its own: notes when the call finished on this rank.
pub const GRAPH_END_KERNEL: &str = "ncclStragglarGraphEnd";
/// `stragglar bench`'s device-side delay of a late rank.
pub const DELAY_KERNEL: &str = "ncclStragglarDelay";
/// The bandwidth probe's entry point (the AllReduce kernel's element-wise code alone).
pub const APPLY_PROBE_KERNEL: &str = "ncclStragglarApplyProbe";
/// The peer probe's entry point (`RawPeerProbe`).
pub const PEER_PROBE_KERNEL: &str = "ncclStragglarPeerProbe";
/// The multicast probe's entry point (`RawMulticastProbe`).
pub const MULTICAST_PROBE_KERNEL: &str = "ncclStragglarMulticastProbe";
/// `stragglar bench --latency`'s pointer chase (`RawChase`).
pub const CHASE_KERNEL: &str = "ncclStragglarChase";

/// The sources, in include order: `(file name, text)`.
pub const SOURCES: [(&str, &str); 7] = [
    (
        "stragglar_plan.h",
        include_str!("../../cuda/stragglar_plan.h"),
    ),
    (
        "stragglar_launch.h",
        include_str!("../../cuda/stragglar_launch.h"),
    ),
    (
        "stragglar_device.h",
        include_str!("../../cuda/stragglar_device.h"),
    ),
    (
        "stragglar_choice.h",
        include_str!("../../cuda/stragglar_choice.h"),
    ),
    (
        "stragglar_arrival.h",
        include_str!("../../cuda/stragglar_arrival.h"),
    ),
    (
        "stragglar_reduce.h",
        include_str!("../../cuda/stragglar_reduce.h"),
    ),
    (
        "stragglar_allreduce.cu",
        include_str!("../../cuda/stragglar_allreduce.cu"),
    ),
];

/// Every source concatenated, with our own `#include "..."` lines removed (each header is
/// already above its user), under `#line` markers so NVRTC's messages name the real files.
pub fn translation_unit() -> String {
    assemble(SOURCES.iter().map(|&(name, text)| (name, text)))
}

/// The translation unit of the sources in `dir` (the files [`SOURCES`] names, e.g. another
/// revision's `cuda/`), to compare builds; the library itself only compiles its own.
pub fn translation_unit_from(dir: &std::path::Path) -> std::io::Result<String> {
    let texts = SOURCES
        .iter()
        .map(|(name, _)| std::fs::read_to_string(dir.join(name)).map(|text| (*name, text)))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(assemble(
        texts.iter().map(|(name, text)| (*name, text.as_str())),
    ))
}

fn assemble<'a>(sources: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut unit = String::new();
    for (name, text) in sources {
        unit.push_str(&format!("#line 1 \"{name}\"\n"));
        for line in text.lines() {
            if line.trim_start().starts_with("#include \"stragglar_") {
                unit.push('\n');
            } else {
                unit.push_str(line);
                unit.push('\n');
            }
        }
    }
    unit
}

/// The NVRTC options for `arch` (`sm_80`, `sm_90`, ...): a CUBIN for exactly that
/// architecture, and no fused multiply-add, so float results match the host's bit for bit.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--fmad=false".into(),
        "--std=c++17".into(),
    ]
}

/// The kernel's `OP_*` code of a reduction.
pub fn op_code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => OP_SUM,
        ReduceOp::Prod => OP_PROD,
        ReduceOp::Max => OP_MAX,
        ReduceOp::Min => OP_MIN,
        ReduceOp::Avg => OP_AVG,
        ReduceOp::PreMulSum => OP_PREMULSUM,
    }
}

/// Whether `arch` names a real architecture NVRTC can build a CUBIN for, and one our kernels
/// support (acquire/release and `__nanosleep` need sm_70 or later).
pub fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_")
        .and_then(|v| v.trim_end_matches(['a', 'f']).parse::<u32>().ok())
        .is_some_and(|v| v >= 70)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_holds_every_source_and_no_own_include() {
        let unit = translation_unit();
        assert!(!unit.contains("#include \"stragglar_"));
        assert!(unit.contains(ALL_REDUCE_KERNEL));
        assert!(unit.contains(APPLY_PROBE_KERNEL));
        assert!(unit.contains(TICKET_KERNEL));
        assert!(unit.contains(TICKET_END_KERNEL));
        assert!(unit.contains(GRAPH_TURN_KERNEL));
        assert!(unit.contains(GRAPH_ARRIVAL_KERNEL));
        assert!(unit.contains(GRAPH_END_KERNEL));
        assert!(unit.contains(DELAY_KERNEL));
        assert!(unit.contains(PEER_PROBE_KERNEL));
        for (name, _) in SOURCES {
            assert!(unit.contains(&format!("#line 1 \"{name}\"")), "{name}");
        }
    }

    #[test]
    fn op_codes_follow_reduce_op_order() {
        use super::super::launch::{OP_AVG, OP_MAX, OP_MIN, OP_PREMULSUM, OP_PROD, OP_SUM};
        let codes = [OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PREMULSUM];
        for (op, code) in crate::reduce::ReduceOp::ALL.iter().zip(codes) {
            assert_eq!(op_code(*op), code);
        }
    }

    #[test]
    fn architectures() {
        for good in ["sm_70", "sm_80", "sm_90", "sm_90a", "sm_100"] {
            assert!(valid_arch(good), "{good}");
        }
        for bad in ["sm_60", "compute_90", "90", "sm_", "sm_x"] {
            assert!(!valid_arch(bad), "{bad}");
        }
    }
}

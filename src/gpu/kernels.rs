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
/// The turn kernel of a graph call whose baseline is NCCL's captured work, in a module of its
/// own ([`turn_sources`]): the device's choice, and on NCCL's turn the ticket (it never
/// waits); it sets the conditional handles of the call's bodies.
pub const GRAPH_TURN_KERNEL: &str = "ncclStragglarGraphTurn";
/// The rest of a graph call's arrival protocol on NCCL's turn, beside NCCL's work in its body.
pub const GRAPH_ARRIVAL_KERNEL: &str = "ncclStragglarGraphArrival";
/// The end kernel of a graph call on NCCL's turn in the sample, after NCCL's work in a body
/// of its own: notes when the call finished on this rank.
pub const GRAPH_END_KERNEL: &str = "ncclStragglarGraphEnd";
/// The kernels a CUBIN of the AllReduce module must hold to be taken for one (a cache entry's
/// check: `super::cubin::check`).
pub const MODULE_KERNELS: [&str; 2] = [ALL_REDUCE_KERNEL, APPLY_PROBE_KERNEL];
/// The kernel a CUBIN of the turn kernel's module must hold.
pub const TURN_MODULE_KERNELS: [&str; 1] = [GRAPH_TURN_KERNEL];
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

/// A source file of `cuda/`: `(file name, text)`.
type Source = (&'static str, &'static str);

macro_rules! source {
    ($name:literal) => {
        ($name, include_str!(concat!("../../cuda/", $name)))
    };
}

/// The headers both modules include, in include order.
const SHARED_HEADERS: [Source; 6] = [
    source!("stragglar_plan.h"),
    source!("stragglar_launch.h"),
    source!("stragglar_device.h"),
    source!("stragglar_choice.h"),
    source!("stragglar_arrival.h"),
    source!("stragglar_graph.h"),
];

/// The AllReduce module's own files, after [`SHARED_HEADERS`]: every kernel but the turn kernel.
const ALL_REDUCE_FILES: [Source; 2] = [
    source!("stragglar_reduce.h"),
    source!("stragglar_allreduce.cu"),
];

/// The turn kernel's module's own file, after [`SHARED_HEADERS`]: loaded only where the driver
/// has conditional graph nodes, since its call to `cudaGraphSetConditional` is resolved by the
/// driver when it loads the module (see `cuda/stragglar_graph_turn.cu`).
const TURN_FILES: [Source; 1] = [source!("stragglar_graph_turn.cu")];

/// The AllReduce module's sources, in include order.
pub fn sources() -> impl Iterator<Item = Source> {
    SHARED_HEADERS.into_iter().chain(ALL_REDUCE_FILES)
}

/// The turn kernel's module's sources, in include order.
pub fn turn_sources() -> impl Iterator<Item = Source> {
    SHARED_HEADERS.into_iter().chain(TURN_FILES)
}

/// The AllReduce module's sources concatenated, with our own `#include "..."` lines removed
/// (each header is already above its user), under `#line` markers so NVRTC's messages name the
/// real files.
pub fn translation_unit() -> String {
    assemble(sources())
}

/// The turn kernel's module, as [`translation_unit`].
pub fn turn_translation_unit() -> String {
    assemble(turn_sources())
}

/// The translation unit of the AllReduce module's files as they are in `dir` (e.g. another
/// revision's `cuda/`), to compare builds; the library itself only compiles its own. A header
/// `dir` lacks is left out (an older revision had fewer); any other file missing is an error.
pub fn translation_unit_from(dir: &std::path::Path) -> std::io::Result<String> {
    let mut texts = Vec::new();
    for (name, _) in sources() {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(text) => texts.push((name, text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && name.ends_with(".h") => {}
            Err(e) => return Err(e),
        }
    }
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
        assert!(!unit.contains(&format!("void {GRAPH_TURN_KERNEL}(")));
        assert!(!unit.contains("cudaGraphSetConditional("));
        assert!(unit.contains(GRAPH_ARRIVAL_KERNEL));
        assert!(unit.contains(GRAPH_END_KERNEL));
        assert!(unit.contains(DELAY_KERNEL));
        assert!(unit.contains(PEER_PROBE_KERNEL));
        for (name, _) in sources() {
            assert!(unit.contains(&format!("#line 1 \"{name}\"")), "{name}");
        }
    }

    #[test]
    fn the_turn_unit_holds_the_turn_kernel_alone() {
        let unit = turn_translation_unit();
        assert!(!unit.contains("#include \"stragglar_"));
        assert!(unit.contains(&format!("void {GRAPH_TURN_KERNEL}(")));
        assert!(unit.contains("cudaGraphSetConditional("));
        assert!(!unit.contains("#line 1 \"stragglar_allreduce.cu\""));
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

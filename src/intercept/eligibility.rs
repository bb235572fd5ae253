//! Whether a valid AllReduce may run on StragglAR: a pure function of inputs that are the same
//! on every rank for the same call (the arguments, the communicator's size and kind, the
//! group depth the program is at, and the configuration, which setup checks agrees), so every
//! rank takes the same route. The one per-rank input, a nonblocking communicator's
//! asynchronous state, is `ncclSuccess` on every rank of a correct program at every call: NCCL
//! requires it before any call (see `super::nonblocking`). An asynchronous error may reach one
//! rank first; that rank then gives up its part of the GPU engine, which releases its peers
//! (`engine::cuda::library::nccl_state_seen`).

use crate::reduce::DataType;
use crate::registry::fallback::Fallback;

/// `ncclRedOp_t` values of the built-in ops the kernels reduce (sum, prod, max, min, avg).
const BUILTIN_OPS: std::ops::RangeInclusive<i32> = 0..=4;

/// What the route of one valid call depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFacts {
    /// Elements.
    pub count: usize,
    /// `ncclDataType_t`.
    pub datatype: i32,
    /// `ncclRedOp_t`.
    pub op: i32,
    /// Whether `op` is a PreMulSum made on this communicator with a host scalar.
    pub op_is_host_premulsum: bool,
    /// The communicator's size, if it was made through our init functions.
    pub nranks: Option<i32>,
    pub blocking: bool,
    /// For a nonblocking communicator: its asynchronous state is `ncclSuccess` (no operation
    /// in progress, no error). Ignored for a blocking one.
    pub async_ready: bool,
    /// Inside `ncclGroupStart`/`ncclGroupEnd`.
    pub in_group: bool,
    /// Every rank of the communicator lives in this process (`CommInfo::single_process`).
    pub single_process: bool,
}

/// The configuration the route depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub p2p_disabled: bool,
    /// `STRAGGLAR_ALGO=nccl`.
    pub forced_nccl: bool,
    /// `STRAGGLAR_STRAGGLER=off`.
    pub straggler_off: bool,
    /// `STRAGGLAR_MIN_BYTES`.
    pub min_bytes: usize,
    /// `STRAGGLAR_BUFFER_BYTES`.
    pub buffer_bytes: usize,
    /// `STRAGGLAR_GPU_ENGINE`: eligible calls go to the GPU engine.
    pub gpu_engine: bool,
}

/// The first reason, in [`Fallback::ALL`] order, that keeps the call on NCCL; `Ok` when
/// the GPU engine takes it.
pub fn check(facts: &CallFacts, limits: &Limits) -> Result<(), Fallback> {
    if limits.p2p_disabled {
        return Err(Fallback::P2pDisabled);
    }
    if limits.forced_nccl {
        return Err(Fallback::ForcedNccl);
    }
    if limits.straggler_off {
        return Err(Fallback::StragglerOff);
    }
    let Some(nranks) = facts.nranks else {
        return Err(Fallback::UnknownComm);
    };
    if nranks < 4 {
        return Err(Fallback::TooFewRanks);
    }
    if facts.single_process {
        return Err(Fallback::SingleProcess);
    }
    let Some(dtype) = DataType::from_nccl(facts.datatype) else {
        return Err(Fallback::UnsupportedType);
    };
    if !BUILTIN_OPS.contains(&facts.op) && !facts.op_is_host_premulsum {
        return Err(Fallback::UnsupportedOp);
    }
    if facts.count == 0 {
        return Err(Fallback::Empty);
    }
    let bytes = facts.count.saturating_mul(dtype.size());
    if bytes < limits.min_bytes {
        return Err(Fallback::BelowMinBytes);
    }
    if bytes > limits.buffer_bytes {
        return Err(Fallback::AboveBufferBytes);
    }
    if facts.in_group {
        return Err(Fallback::InGroup);
    }
    if !facts.blocking && !facts.async_ready {
        return Err(Fallback::NonblockingComm);
    }
    if !limits.gpu_engine {
        return Err(Fallback::NoGpuEngine);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> CallFacts {
        CallFacts {
            count: 1 << 20,
            datatype: 7,
            op: 0,
            op_is_host_premulsum: false,
            nranks: Some(8),
            blocking: true,
            async_ready: false,
            in_group: false,
            single_process: false,
        }
    }

    fn limits() -> Limits {
        Limits {
            p2p_disabled: false,
            forced_nccl: false,
            straggler_off: false,
            min_bytes: 64 << 10,
            buffer_bytes: 256 << 20,
            gpu_engine: true,
        }
    }

    #[test]
    fn an_ordinary_large_call_is_eligible() {
        assert_eq!(check(&facts(), &limits()), Ok(()));
    }

    #[test]
    fn each_cause_is_found_and_the_first_wins() {
        let l = limits();
        let cases: [(CallFacts, Limits, Fallback); 12] = [
            (
                facts(),
                Limits {
                    p2p_disabled: true,
                    ..l
                },
                Fallback::P2pDisabled,
            ),
            (
                CallFacts {
                    nranks: None,
                    ..facts()
                },
                l,
                Fallback::UnknownComm,
            ),
            (
                CallFacts {
                    nranks: Some(3),
                    ..facts()
                },
                l,
                Fallback::TooFewRanks,
            ),
            (
                CallFacts {
                    datatype: 10,
                    ..facts()
                },
                l,
                Fallback::UnsupportedType,
            ),
            (CallFacts { op: 5, ..facts() }, l, Fallback::UnsupportedOp),
            (
                CallFacts {
                    single_process: true,
                    datatype: 99,
                    ..facts()
                },
                l,
                Fallback::SingleProcess,
            ),
            (
                CallFacts {
                    count: 0,
                    ..facts()
                },
                l,
                Fallback::Empty,
            ),
            (
                CallFacts {
                    count: 100,
                    ..facts()
                },
                l,
                Fallback::BelowMinBytes,
            ),
            (
                CallFacts {
                    count: 1 << 27,
                    ..facts()
                },
                l,
                Fallback::AboveBufferBytes,
            ),
            (
                CallFacts {
                    in_group: true,
                    ..facts()
                },
                l,
                Fallback::InGroup,
            ),
            (
                CallFacts {
                    blocking: false,
                    ..facts()
                },
                l,
                Fallback::NonblockingComm,
            ),
            // Several causes: the earliest in order.
            (
                CallFacts {
                    nranks: Some(2),
                    count: 0,
                    ..facts()
                },
                Limits {
                    p2p_disabled: true,
                    ..l
                },
                Fallback::P2pDisabled,
            ),
        ];
        for (f, l, want) in cases {
            assert_eq!(check(&f, &l), Err(want), "{f:?} {l:?}");
        }
        let premul = CallFacts {
            op: 0x1234,
            op_is_host_premulsum: true,
            ..facts()
        };
        assert_eq!(check(&premul, &l), Ok(()));
    }

    #[test]
    fn a_nonblocking_communicator_is_eligible_once_its_state_is_success() {
        let nonblocking = |async_ready| CallFacts {
            blocking: false,
            async_ready,
            ..facts()
        };
        assert_eq!(
            check(&nonblocking(false), &limits()),
            Err(Fallback::NonblockingComm)
        );
        assert_eq!(check(&nonblocking(true), &limits()), Ok(()));
        // A blocking communicator's state is not asked.
        assert_eq!(check(&facts(), &limits()), Ok(()));
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        let f = CallFacts {
            count: usize::MAX,
            ..facts()
        };
        assert_eq!(check(&f, &limits()), Err(Fallback::AboveBufferBytes));
    }
}

//! Why an AllReduce goes to NCCL instead of StragglAR: one cause per call, counted per
//! communicator and logged once per communicator and cause. (With `STRAGGLAR_ENABLE=0` the
//! library is a pure forwarder and counts nothing.)

/// A reason to forward a valid AllReduce to NCCL. The order of [`Fallback::ALL`] is the order
/// in which `eligibility::check` tests them, and the index in `stragglarStats_t::fallbacks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// `NCCL_P2P_DISABLE` is set: the user forbids peer-to-peer transfers.
    P2pDisabled,
    /// `STRAGGLAR_ALGO=nccl`.
    ForcedNccl,
    /// `STRAGGLAR_STRAGGLER=off`: StragglAR needs a straggler.
    StragglerOff,
    /// The communicator was not made through our init functions (its size is unknown).
    UnknownComm,
    /// Fewer than 4 ranks: StragglAR never wins at n = 3 (the model), and needs a straggler.
    TooFewRanks,
    /// Every rank lives in this process (`ncclCommInitAll`, or split from such a communicator):
    /// the one thread that may drive them all cannot block in one rank's setup.
    SingleProcess,
    /// fp8 types (and any type the kernels do not reduce).
    UnsupportedType,
    /// A PreMulSum op made on another communicator, or whose scalar lives on the device.
    UnsupportedOp,
    /// Zero elements: nothing to run.
    Empty,
    /// Below `STRAGGLAR_MIN_BYTES`.
    BelowMinBytes,
    /// Above `STRAGGLAR_BUFFER_BYTES`.
    AboveBufferBytes,
    /// Inside `ncclGroupStart`/`ncclGroupEnd`.
    InGroup,
    /// A nonblocking communicator whose asynchronous state is not `ncclSuccess` (an operation
    /// still in progress, or an error).
    NonblockingComm,
    /// The GPU engine is off (`STRAGGLAR_GPU_ENGINE=0`, the default in this version).
    NoGpuEngine,
    /// No usable CUDA driver or device for the GPU engine here (kernels that cannot be built,
    /// NVRTC missing, make the setup refuse instead: every rank must agree).
    GpuUnavailable,
    /// The communicator's setup refused the GPU engine (the same verdict on every rank).
    SetupRefused,
    /// A call was captured into a graph before the communicator ran any call outside capture:
    /// setup and the plan upload cannot run while a stream captures. (Also the cause when the
    /// plans could not be built, which is logged once.)
    CapturingBeforeSetup,
    /// The straggler policy chose NCCL for this call: no straggler is designated for its size,
    /// or the designated one's lead does not pay for it (a ticket still records an eager
    /// call's arrivals; a captured call is NCCL's work in the graph).
    PolicyNccl,
    /// More than the communicator's arenas hold so far: a call captured into a graph (the
    /// arenas grow at eager calls only), or an eager call StragglAR would run after the arenas
    /// could not grow (`STRAGGLAR_STAGING_CAP`, or a rank could not allocate or reach them).
    AboveStaging,
}

impl Fallback {
    /// Every cause, in test order.
    pub const ALL: [Fallback; 19] = [
        Fallback::P2pDisabled,
        Fallback::ForcedNccl,
        Fallback::StragglerOff,
        Fallback::UnknownComm,
        Fallback::TooFewRanks,
        Fallback::SingleProcess,
        Fallback::UnsupportedType,
        Fallback::UnsupportedOp,
        Fallback::Empty,
        Fallback::BelowMinBytes,
        Fallback::AboveBufferBytes,
        Fallback::InGroup,
        Fallback::NonblockingComm,
        Fallback::NoGpuEngine,
        Fallback::GpuUnavailable,
        Fallback::SetupRefused,
        Fallback::CapturingBeforeSetup,
        Fallback::PolicyNccl,
        Fallback::AboveStaging,
    ];

    /// The index in [`Fallback::ALL`] and in `stragglarStats_t::fallbacks`.
    pub fn index(self) -> usize {
        Fallback::ALL
            .iter()
            .position(|&f| f == self)
            .expect("every cause is listed")
    }

    /// A short name (what `stragglarFallbackName` returns).
    pub fn name(self) -> &'static str {
        match self {
            Fallback::P2pDisabled => "p2p-disabled",
            Fallback::ForcedNccl => "algo-nccl",
            Fallback::StragglerOff => "straggler-off",
            Fallback::UnknownComm => "unknown-comm",
            Fallback::TooFewRanks => "too-few-ranks",
            Fallback::SingleProcess => "single-process",
            Fallback::UnsupportedType => "unsupported-type",
            Fallback::UnsupportedOp => "unsupported-op",
            Fallback::Empty => "empty",
            Fallback::BelowMinBytes => "below-min-bytes",
            Fallback::AboveBufferBytes => "above-buffer-bytes",
            Fallback::InGroup => "in-group",
            Fallback::NonblockingComm => "nonblocking-comm",
            Fallback::NoGpuEngine => "no-gpu-engine",
            Fallback::GpuUnavailable => "gpu-unavailable",
            Fallback::SetupRefused => "setup-refused",
            Fallback::CapturingBeforeSetup => "capturing-before-setup",
            Fallback::PolicyNccl => "policy-nccl",
            Fallback::AboveStaging => "above-staging",
        }
    }

    /// What a log line says.
    pub fn describe(self) -> &'static str {
        match self {
            Fallback::P2pDisabled => "NCCL_P2P_DISABLE is set",
            Fallback::ForcedNccl => "STRAGGLAR_ALGO=nccl",
            Fallback::StragglerOff => "STRAGGLAR_STRAGGLER=off",
            Fallback::UnknownComm => "the communicator was not made through this library",
            Fallback::TooFewRanks => "fewer than 4 ranks",
            Fallback::SingleProcess => {
                "every rank lives in this process (ncclCommInitAll or a split of it)"
            }
            Fallback::UnsupportedType => "a data type the kernels do not reduce (fp8)",
            Fallback::UnsupportedOp => {
                "a PreMulSum op with a device scalar or from another communicator"
            }
            Fallback::Empty => "zero elements",
            Fallback::BelowMinBytes => "smaller than STRAGGLAR_MIN_BYTES",
            Fallback::AboveBufferBytes => "larger than STRAGGLAR_BUFFER_BYTES",
            Fallback::InGroup => "inside ncclGroupStart/ncclGroupEnd",
            Fallback::NonblockingComm => {
                "a nonblocking communicator whose state is not ncclSuccess"
            }
            Fallback::NoGpuEngine => "the GPU engine is off (STRAGGLAR_GPU_ENGINE=0)",
            Fallback::GpuUnavailable => "no usable CUDA driver or device for the GPU engine",
            Fallback::SetupRefused => "the communicator's setup refused the GPU engine",
            Fallback::CapturingBeforeSetup => {
                "captured into a graph before the communicator ran a call outside capture"
            }
            Fallback::PolicyNccl => {
                "the straggler policy chose NCCL (no straggler designated for this size, or its lead does not pay)"
            }
            Fallback::AboveStaging => {
                "larger than the GPU engine's arenas hold so far (captured, or they could not grow)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for (i, f) in Fallback::ALL.iter().enumerate() {
            assert_eq!(f.index(), i);
            assert!(names.insert(f.name()));
            assert!(!f.describe().is_empty());
        }
    }
}

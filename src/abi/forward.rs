//! `forward!`: the one way an export calls the real NCCL.
//!
//! `forward!(ncclX(comm, t, b); live comm; team t; outputs b)` refuses a NULL communicator or
//! one that was already destroyed (`live`, see `guard::check_live`), a device-API team no
//! communicator could have produced (`team`: NCCL divides by its size and stride), arguments
//! that fail a stated requirement (`require cond => "why"`, e.g. counts NCCL divides by), and
//! a NULL output pointer (`ncclInvalidArgument` and one WARN each), then calls the real `pncclX` (or `ncclX`)
//! with the arguments unchanged and returns its result bit for bit, all inside the panic guard.
//! The function-pointer type is inferred from the export `ncclX` itself, so every signature is
//! written exactly once, in the export.

/// Expands to `_` for each argument, to spell a function-pointer type to be inferred.
#[macro_export]
#[doc(hidden)]
macro_rules! __placeholder_type {
    ($arg:ident) => {
        _
    };
}

/// See the module documentation.
#[macro_export]
#[doc(hidden)]
macro_rules! forward {
    ($export:ident ( $($arg:ident),* ) $(; live $live:ident)? $(; team $team:ident)? $(; require $cond:expr => $what:literal)? $(; outputs $($out:ident),+)?) => {{
        static SYMBOL: $crate::nccl::Symbol = $crate::nccl::Symbol::new(
            $crate::abi::guard::cstr(concat!("p", stringify!($export), "\0")),
            $crate::abi::guard::cstr(concat!(stringify!($export), "\0")),
        );
        $crate::abi::guard::guard(stringify!($export), || {
            $(
                if $live.is_null() {
                    static NULL_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    return $crate::abi::guard::FailureValue::from_code(
                        $crate::abi::guard::reject_null(&NULL_WARNED, stringify!($export), stringify!($live)),
                    );
                }
                static LIVE_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if let Err(code) = $crate::abi::guard::check_live($live, &LIVE_WARNED, stringify!($export)) {
                    return $crate::abi::guard::FailureValue::from_code(code);
                }
            )?
            $(
                if !$team.is_plausible() {
                    static TEAM_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    return $crate::abi::guard::FailureValue::from_code(
                        $crate::abi::guard::reject_team(&TEAM_WARNED, stringify!($export), stringify!($team)),
                    );
                }
            )?
            $(
                if !($cond) {
                    static REQUIRE_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    return $crate::abi::guard::FailureValue::from_code(
                        $crate::abi::guard::reject_value(&REQUIRE_WARNED, stringify!($export), $what),
                    );
                }
            )?
            $($(
                if $out.is_null() {
                    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                    return $crate::abi::guard::FailureValue::from_code(
                        $crate::abi::guard::reject_null(&WARNED, stringify!($export), stringify!($out)),
                    );
                }
            )+)?
            match SYMBOL.address() {
                Ok(addr) => {
                    // SAFETY: `addr` is the real NCCL's function of the same name, whose C
                    // signature the export `$export` mirrors exactly.
                    let real = unsafe {
                        $crate::nccl::symbol::cast_like(
                            $export as extern "C" fn($($crate::__placeholder_type!($arg)),*) -> _,
                            addr,
                        )
                    };
                    real($($arg),*)
                }
                Err(code) => $crate::abi::guard::FailureValue::from_code(code),
            }
        })
    }};
}

//! The per-communicator AllReduce counters behind `stragglarGetStats`, the route each valid
//! call takes, and the report at destroy.

use std::ffi::CStr;

use stragglar::abi::extensions::{
    stragglarArrivals_t, stragglarFallbackName, stragglarGetArrivals, stragglarGetSizeClass,
    stragglarGetStats, stragglarSizeClass_t, stragglarStats_t, STRAGGLAR_FALLBACK_COUNT,
};
use stragglar::intercept::{
    count_fallback, facts_of, limits, route_all_reduce, AllReduceCall, Route,
};
use stragglar::nccl::types::{ncclComm_t, DataTypeCode, RedOpCode, ResultCode};
use stragglar::registry::fallback::Fallback;
use stragglar::registry::{self, CommInfo, CommOrigin, CommState};

fn register(address: usize, nranks: i32) -> ncclComm_t {
    let comm = address as ncclComm_t;
    registry::comms().insert(
        comm,
        CommInfo {
            nranks: Some(nranks),
            rank: Some(1),
            cuda_device: Some(0),
            blocking: true,
            origin: CommOrigin::InitRank,
            state: CommState::Live,
            single_process: false,
        },
    );
    comm
}

fn call(comm: ncclComm_t, count: usize, datatype: i32) -> AllReduceCall {
    AllReduceCall {
        send: 0x1000,
        recv: 0x2000,
        count,
        datatype: DataTypeCode(datatype),
        op: RedOpCode(0),
        comm,
    }
}

fn route(c: &AllReduceCall) -> Route {
    route_all_reduce(c, &facts_of(c), &limits())
}

#[test]
fn valid_calls_are_routed_with_the_first_cause_that_applies() {
    let big = register(0x5100, 8);
    let small = register(0x5200, 2);
    assert_eq!(
        route(&call(big, 1 << 20, 7)),
        Route::Forward(Fallback::NoGpuEngine)
    );
    assert_eq!(
        route(&call(big, 16, 7)),
        Route::Forward(Fallback::BelowMinBytes)
    );
    assert_eq!(
        route(&call(big, 1 << 20, 10)),
        Route::Forward(Fallback::UnsupportedType)
    );
    assert_eq!(route(&call(big, 0, 7)), Route::Forward(Fallback::Empty));
    assert_eq!(
        route(&call(small, 1 << 20, 7)),
        Route::Forward(Fallback::TooFewRanks)
    );
    assert_eq!(
        route(&call(0x5300 as ncclComm_t, 1 << 20, 7)),
        Route::Forward(Fallback::UnknownComm)
    );
    assert_eq!(
        route(&call(big, 1 << 20, 99)),
        Route::Refuse(ResultCode::INVALID_ARGUMENT)
    );
}

#[test]
fn stragglar_get_stats_returns_the_counters_and_refuses_bad_arguments() {
    let comm = register(0x6100, 8);
    let mut stats = stragglarStats_t {
        allReduceCalls: 99,
        onStragglar: 99,
        onNccl: 99,
        fallbacks: [99; STRAGGLAR_FALLBACK_COUNT],
        designatedStraggler: 99,
        reserved: 0,
    };
    assert_eq!(stragglarGetStats(comm, &mut stats), ResultCode::SUCCESS);
    assert_eq!(
        (
            stats.allReduceCalls,
            stats.onNccl,
            stats.designatedStraggler
        ),
        (0, 0, -1)
    );
    for _ in 0..3 {
        count_fallback(comm, Fallback::BelowMinBytes);
    }
    count_fallback(comm, Fallback::InGroup);
    assert_eq!(stragglarGetStats(comm, &mut stats), ResultCode::SUCCESS);
    assert_eq!(
        (stats.allReduceCalls, stats.onStragglar, stats.onNccl),
        (4, 0, 4)
    );
    assert_eq!(stats.fallbacks[Fallback::BelowMinBytes.index()], 3);
    assert_eq!(stats.fallbacks[Fallback::InGroup.index()], 1);

    let before = stats;
    assert_eq!(
        stragglarGetStats(std::ptr::null_mut(), &mut stats),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(
        stragglarGetStats(comm, std::ptr::null_mut()),
        ResultCode::INVALID_ARGUMENT
    );
    registry::comms().set_state(comm, CommState::Destroyed);
    assert_eq!(
        stragglarGetStats(comm, &mut stats),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(stats, before, "no output written on failure");
}

#[test]
fn stragglar_get_arrivals_needs_the_gpu_engine_and_refuses_bad_arguments() {
    let comm = register(0x6300, 4);
    let untouched = stragglarArrivals_t {
        calls: 7,
        arrivedLast: 7,
        medianLeadUs: 7.0,
        p90LeadUs: 7.0,
    };
    let mut a = untouched;
    // No GPU engine serves it (none runs here): no records.
    assert_eq!(
        stragglarGetArrivals(comm, 1, &mut a),
        ResultCode::INVALID_USAGE
    );
    for rank in [-1, 4, i32::MAX] {
        assert_eq!(
            stragglarGetArrivals(comm, rank, &mut a),
            ResultCode::INVALID_ARGUMENT,
            "rank {rank}"
        );
    }
    assert_eq!(
        stragglarGetArrivals(std::ptr::null_mut(), 0, &mut a),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(
        stragglarGetArrivals(comm, 0, std::ptr::null_mut()),
        ResultCode::INVALID_ARGUMENT
    );
    registry::comms().set_state(comm, CommState::Destroyed);
    assert_eq!(
        stragglarGetArrivals(comm, 0, &mut a),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(a, untouched, "no output written on failure");
}

#[test]
fn stragglar_get_size_class_needs_the_gpu_engine_and_refuses_bad_arguments() {
    let comm = register(0x6400, 4);
    let untouched = stragglarSizeClass_t {
        calls: 7,
        onStragglar: 7,
        stragglarPostUs: 7.0,
        stragglarSamples: 7,
        ncclPostUs: 7.0,
        ncclSamples: 7,
    };
    let mut c = untouched;
    // No GPU engine serves it (none runs here): nothing measured.
    assert_eq!(
        stragglarGetSizeClass(comm, 20, &mut c),
        ResultCode::INVALID_USAGE
    );
    for class in [-1, 65, i32::MAX] {
        assert_eq!(
            stragglarGetSizeClass(comm, class, &mut c),
            ResultCode::INVALID_ARGUMENT,
            "class {class}"
        );
    }
    assert_eq!(
        stragglarGetSizeClass(std::ptr::null_mut(), 0, &mut c),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(
        stragglarGetSizeClass(comm, 0, std::ptr::null_mut()),
        ResultCode::INVALID_ARGUMENT
    );
    registry::comms().set_state(comm, CommState::Destroyed);
    assert_eq!(
        stragglarGetSizeClass(comm, 0, &mut c),
        ResultCode::INVALID_ARGUMENT
    );
    assert_eq!(c, untouched, "no output written on failure");
}

#[test]
fn fallback_names_match_the_causes() {
    for (i, f) in Fallback::ALL.iter().enumerate() {
        // SAFETY: stragglarFallbackName returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(stragglarFallbackName(i as i32)) };
        assert_eq!(name.to_str().unwrap(), f.name());
    }
    for bad in [-1, STRAGGLAR_FALLBACK_COUNT as i32, i32::MAX] {
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(stragglarFallbackName(bad)) };
        assert_eq!(name.to_str().unwrap(), "unknown");
    }
}

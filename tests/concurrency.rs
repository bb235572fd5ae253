//! The first NCCL calls of a process may come from many threads at once (PyTorch's watchdog
//! polls while the main thread initialises): binding and symbol resolution must be race-free.

mod support;

use std::sync::{Arc, Barrier};

use stragglar::abi::groups::{ncclGroupEnd, ncclGroupStart};
use stragglar::abi::passthrough::{ncclGetUniqueId, ncclGetVersion};
use stragglar::nccl::types::{ncclUniqueId, ResultCode};
use stragglar::registry::groups;

#[test]
fn concurrent_first_calls_all_succeed() {
    let Some(real) = support::real_nccl() else {
        return;
    };
    // This test binary binds once per process; nothing else in it reads the variable first.
    std::env::set_var("STRAGGLAR_NCCL_LIB", &real);
    let threads = 8;
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let mut versions = Vec::new();
                for _ in 0..200 {
                    let mut version = 0;
                    assert_eq!(ncclGetVersion(&mut version), ResultCode::SUCCESS);
                    versions.push(version);
                    let mut id = ncclUniqueId { internal: [0; 128] };
                    assert_eq!(ncclGetUniqueId(&mut id), ResultCode::SUCCESS);
                    assert_eq!(ncclGroupStart(), ResultCode::SUCCESS);
                    assert_eq!(groups::depth(), 1, "group depth is per thread");
                    assert_eq!(ncclGroupEnd(), ResultCode::SUCCESS);
                    assert_eq!(groups::depth(), 0);
                }
                versions
            })
        })
        .collect();
    let all: Vec<i32> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert!(
        all.iter().all(|&v| v == all[0] && v >= 21800),
        "{:?}",
        &all[..4]
    );
}

//! Every schedule of every algorithm replays as a valid AllReduce, and StragglAR's post-arrival
//! rounds meet the quality bar of docs/ALGORITHM.md section 3.

use stragglar::schedule::{
    ceil_log2, round_bound, verify, Algorithm, PhaseKind, PlanError, PlanRequest, Schedule,
};

/// Debug builds check the default straggler for every n and more stragglers on a sample;
/// release builds check them all.
fn stragglers(n: usize) -> Vec<usize> {
    let all = [n - 1, 0, n / 2];
    if cfg!(debug_assertions) && n > 64 && n % 16 != 0 {
        vec![n - 1]
    } else {
        all.to_vec()
    }
}

fn plan(algorithm: Algorithm, n: usize, straggler: usize) -> Schedule {
    let schedule = algorithm
        .schedule(&PlanRequest::new(n, straggler))
        .unwrap_or_else(|e| panic!("{} n={n}: {e}", algorithm.name()));
    if let Err(e) = verify(&schedule) {
        panic!("{} n={n} straggler={straggler}: {e}", algorithm.name());
    }
    schedule
}

/// The authors' heuristic (docs/ALGORITHM.md 3.2), lower end of each range.
const HEURISTIC: [(usize, usize); 16] = [
    (6, 7),
    (10, 12),
    (12, 15),
    (14, 17),
    (18, 21),
    (20, 24),
    (22, 26),
    (24, 27),
    (26, 31),
    (28, 33),
    (30, 36),
    (34, 40),
    (40, 47),
    (48, 55),
    (96, 106),
    (192, 208),
];

/// Checks StragglAR for `ns`: valid for every straggler of [`stragglers`], within one round
/// of the bound, and never below it.
fn check_stragglar(ns: impl Iterator<Item = usize>) {
    for n in ns {
        let base = Algorithm::Stragglar
            .schedule(&PlanRequest::new(n, n - 1))
            .unwrap();
        for s in stragglers(n) {
            let schedule = base.with_straggler(s).unwrap();
            if let Err(e) = verify(&schedule) {
                panic!("stragglar n={n} straggler={s}: {e}");
            }
            assert_eq!(schedule.straggler, Some(s));
            assert_eq!(schedule.chunks, n - 1);
            let rs = schedule.phase(PhaseKind::ReduceScatter).unwrap();
            assert_eq!(rs.rounds.len(), n - 2, "n={n}");
            let rounds = schedule.exposed_rounds();
            let bound = round_bound(n, 1);
            assert!(
                rounds >= bound,
                "n={n}: {rounds} rounds beat the lower bound {bound}"
            );
            assert!(rounds <= bound + 1, "n={n}: {rounds} rounds, bound {bound}");
        }
    }
}

// Split in four so that the test harness runs them in parallel.
#[test]
fn stragglar_is_valid_for_n_2_to_128() {
    check_stragglar(2..=128);
}

#[test]
fn stragglar_is_valid_for_n_129_to_192() {
    check_stragglar(129..=192);
}

#[test]
fn stragglar_is_valid_for_n_193_to_232() {
    check_stragglar(193..=232);
}

#[test]
fn stragglar_is_valid_for_n_233_to_256() {
    check_stragglar(233..=256);
}

#[test]
fn relabelling_matches_a_fresh_plan() {
    for n in [2, 5, 8, 13] {
        let base = plan(Algorithm::Stragglar, n, n - 1);
        for s in 0..n {
            assert_eq!(
                base.with_straggler(s).unwrap(),
                plan(Algorithm::Stragglar, n, s)
            );
        }
        assert!(base.with_straggler(n).is_none());
    }
    assert!(plan(Algorithm::Ring, 4, 0).with_straggler(1).is_none());
}

#[test]
fn the_straggler_exchanges_every_chunk_with_its_owner_in_order() {
    for n in [2, 3, 7, 8, 13] {
        let schedule = plan(Algorithm::Stragglar, n, 2 % n);
        let post = schedule.phase(PhaseKind::Stragglar).unwrap();
        let s = 2 % n;
        for (r, round) in post.rounds.iter().take(n - 1).enumerate() {
            let owner = if r < s { r } else { r + 1 };
            assert!(round
                .iter()
                .any(|t| t.src == s && t.dst == owner && t.chunk == r));
            assert!(round
                .iter()
                .any(|t| t.src == owner && t.dst == s && t.chunk == r));
        }
    }
}

#[test]
fn powers_of_two_meet_the_bound_exactly() {
    let top = if cfg!(debug_assertions) { 512 } else { 1024 };
    let mut n = 2;
    while n <= top {
        let schedule = plan(Algorithm::Stragglar, n, n / 2);
        assert_eq!(schedule.exposed_rounds(), n - 2 + ceil_log2(n), "n={n}");
        // Every post-arrival transfer is needed: n(n-1) in all, the minimum.
        let post = schedule.phase(PhaseKind::Stragglar).unwrap();
        assert_eq!(post.rounds.iter().map(Vec::len).sum::<usize>(), n * (n - 1));
        n *= 2;
    }
}

#[test]
fn never_more_rounds_than_the_authors_heuristic() {
    for (n, heuristic) in HEURISTIC {
        let rounds = plan(Algorithm::Stragglar, n, n - 1).exposed_rounds();
        assert!(rounds <= heuristic, "n={n}: {rounds} > {heuristic}");
    }
}

#[test]
fn small_n_meet_the_bound() {
    for n in 2..=30 {
        let rounds = plan(Algorithm::Stragglar, n, 0).exposed_rounds();
        assert_eq!(rounds, round_bound(n, 1), "n={n}");
    }
}

#[test]
fn ring_and_direct_are_valid_for_every_n_up_to_256() {
    let step = if cfg!(debug_assertions) { 3 } else { 1 };
    for n in (2..=256usize).filter(|&n| n % step == 0 || n <= 64 || n.is_power_of_two()) {
        let ring = plan(Algorithm::Ring, n, n - 1);
        assert_eq!(ring.straggler, None);
        assert_eq!(ring.exposed_rounds(), 2 * (n - 1));
        for s in stragglers(n) {
            let direct = plan(Algorithm::Direct, n, s);
            assert_eq!(direct.exposed_rounds(), ceil_log2(n), "n={n}");
        }
    }
}

#[test]
fn halving_doubling_is_valid_for_powers_of_two_and_refused_otherwise() {
    for l in 1..=8 {
        let n = 1 << l;
        let rhd = plan(Algorithm::HalvingDoubling, n, 0);
        assert_eq!(rhd.exposed_rounds(), 2 * (n - 1));
        assert_eq!(rhd.straggler, None);
    }
    for n in [3, 6, 12, 100] {
        assert_eq!(
            Algorithm::HalvingDoubling.schedule(&PlanRequest::new(n, 0)),
            Err(PlanError::NotPowerOfTwo(n))
        );
    }
}

#[test]
fn invalid_requests_are_errors() {
    let a = Algorithm::Stragglar;
    assert_eq!(
        a.schedule(&PlanRequest::new(1, 0)),
        Err(PlanError::RanksOutOfRange(1))
    );
    assert!(matches!(
        a.schedule(&PlanRequest::new(4, 4)),
        Err(PlanError::StragglerOutOfRange { .. })
    ));
    let piped = PlanRequest {
        pieces_per_chunk: 2,
        ..PlanRequest::new(4, 0)
    };
    assert_eq!(
        Algorithm::Ring.schedule(&piped),
        Err(PlanError::PipelineUnsupported(Algorithm::Ring))
    );
    let zero = PlanRequest {
        pieces_per_chunk: 0,
        ..PlanRequest::new(4, 0)
    };
    assert!(matches!(
        a.schedule(&zero),
        Err(PlanError::PiecesOutOfRange { .. })
    ));
}

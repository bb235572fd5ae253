//! Pipelining (docs/ALGORITHM.md section 5): each chunk cut into k pieces, the schedule run as a
//! pipeline; verified by replay and priced by the model.

use stragglar::schedule::model::{best_pipelining, stragglar_rounds, Link};
use stragglar::schedule::{
    ceil_log2, round_bound, verify, Algorithm, PhaseKind, PlanRequest, Schedule,
};

fn pipelined(n: usize, straggler: usize, k: usize) -> Schedule {
    let request = PlanRequest {
        ranks: n,
        straggler,
        pieces_per_chunk: k,
    };
    let schedule = Algorithm::Stragglar.schedule(&request).unwrap();
    if let Err(e) = verify(&schedule) {
        panic!("n={n} k={k}: {e}");
    }
    schedule
}

#[test]
fn pipelined_schedules_are_valid() {
    for n in 2..=20 {
        for k in 1..=4 {
            let s = pipelined(n, n / 3, k);
            assert_eq!(s.chunks, (n - 1) * k);
            assert_eq!(s.pieces_per_chunk, k);
            let rounds = s.exposed_rounds();
            let bound = round_bound(n, k);
            if n == 3 {
                // Every exchange keeps both ports of the straggler and of its partner busy,
                // so the third rank can receive nothing until the exchanges end: 2k rounds of
                // exchanges, then k rounds in which each early rank takes one piece per round.
                assert_eq!(rounds, 3 * k);
            } else {
                assert!(
                    rounds >= bound && rounds <= bound + 1,
                    "n={n} k={k}: {rounds} vs {bound}"
                );
            }
        }
    }
}

#[test]
fn powers_of_two_pipeline_at_the_bound() {
    for (n, k) in [(2, 5), (4, 7), (8, 2), (8, 16), (16, 3), (64, 2)] {
        let s = pipelined(n, 0, k);
        assert_eq!(
            s.exposed_rounds(),
            (n - 1) * k - 1 + ceil_log2(n),
            "n={n} k={k}"
        );
    }
}

#[test]
fn the_straggler_meets_the_owner_of_each_piece() {
    let (n, k) = (6, 3);
    let s = pipelined(n, n - 1, k);
    let post = s.phase(PhaseKind::Stragglar).unwrap();
    for (v, round) in post.rounds.iter().take((n - 1) * k).enumerate() {
        let (owner, piece) = (v % (n - 1), v / (n - 1));
        let chunk = owner * k + piece;
        assert!(round
            .iter()
            .any(|t| t.src == owner && t.dst == n - 1 && t.chunk == chunk));
    }
}

#[test]
fn the_model_picks_the_fastest_pipeline() {
    let link = Link {
        alpha: 3e-6,
        bandwidth: 483.183_820_8e9,
    };
    let n = 8;
    for (bytes, pays) in [
        (64.0 * 1024.0 * 1024.0, false),
        (1024.0 * 1024.0 * 1024.0, true),
    ] {
        let best = best_pipelining(n, bytes, link, 64, |k| stragglar_rounds(n, k));
        let time = |k: usize| {
            let r = stragglar_rounds(n, k);
            link.rounds(r, bytes / ((n - 1) * k) as f64)
        };
        assert_eq!(best.pieces > 1, pays, "{bytes} bytes: k = {}", best.pieces);
        for k in 1..=64 {
            assert!(
                best.time <= time(k) + 1e-15,
                "k={k} beats the chosen {}",
                best.pieces
            );
        }
        assert!(best.time > best.floor);
        assert_eq!(best.time < time(1), pays);
    }
    // Tiny messages: latency dominates and one piece is best.
    let tiny = best_pipelining(n, 1024.0, link, 64, |k| stragglar_rounds(n, k));
    assert_eq!(tiny.pieces, 1);
}

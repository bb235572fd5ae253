//! The replay verifier accepts valid schedules and rejects each kind of broken one.

use stragglar::schedule::{
    verify, Algorithm, Op, Phase, PhaseKind, PlanRequest, Schedule, Transfer, VerifyError,
};

fn stragglar(n: usize, s: usize) -> Schedule {
    Algorithm::Stragglar
        .schedule(&PlanRequest::new(n, s))
        .unwrap()
}

fn post(schedule: &mut Schedule) -> &mut Vec<Vec<Transfer>> {
    &mut schedule
        .phases
        .iter_mut()
        .find(|p| p.kind == PhaseKind::Stragglar)
        .unwrap()
        .rounds
}

/// A two-rank AllReduce written by hand: exchange the one chunk.
fn two_ranks(rounds: Vec<Vec<Transfer>>) -> Schedule {
    Schedule {
        ranks: 2,
        straggler: None,
        chunks: 1,
        pieces_per_chunk: 1,
        phases: vec![Phase {
            kind: PhaseKind::AllReduce,
            rounds,
        }],
        multicast: false,
    }
}

#[test]
fn accepts_a_hand_written_exchange() {
    let s = two_ranks(vec![vec![
        Transfer::reduce(0, 1, 0),
        Transfer::reduce(1, 0, 0),
    ]]);
    assert_eq!(verify(&s), Ok(()));
}

#[test]
fn reads_see_the_start_of_the_round() {
    // If rank 1 read rank 0's value after rank 0 had reduced, the second reduce would count
    // rank 1 twice; both read the start-of-round values, so it is valid.
    let s = two_ranks(vec![vec![
        Transfer::reduce(1, 0, 0),
        Transfer::reduce(0, 1, 0),
    ]]);
    assert_eq!(verify(&s), Ok(()));
    // Sequential in two rounds instead: the second reduce does count rank 1 twice.
    let s = two_ranks(vec![
        vec![Transfer::reduce(1, 0, 0)],
        vec![Transfer::reduce(0, 1, 0)],
    ]);
    assert!(matches!(verify(&s), Err(VerifyError::DoubleCount { .. })));
}

#[test]
fn copy_replaces_the_value() {
    // Rank 0 reduces, then copies the final value back: valid. Copying first loses data.
    let good = two_ranks(vec![
        vec![Transfer::reduce(1, 0, 0)],
        vec![Transfer::copy(0, 1, 0)],
    ]);
    assert_eq!(verify(&good), Ok(()));
    let bad = two_ranks(vec![
        vec![Transfer::copy(1, 0, 0)],
        vec![Transfer::reduce(1, 0, 0)],
    ]);
    assert!(matches!(verify(&bad), Err(VerifyError::DoubleCount { .. })));
}

#[test]
fn rejects_a_double_count() {
    let mut s = stragglar(8, 3);
    // Turn a copy into a reduce: the destination already holds some of the contributions.
    let rounds = post(&mut s);
    let t = rounds
        .iter_mut()
        .flatten()
        .find(|t| t.op == Op::Copy)
        .unwrap();
    t.op = Op::Reduce;
    assert!(
        matches!(verify(&s), Err(VerifyError::DoubleCount { .. })),
        "{:?}",
        verify(&s)
    );
}

#[test]
fn rejects_a_rank_sending_twice_in_a_round() {
    let mut s = stragglar(8, 7);
    let rounds = post(&mut s);
    let first = rounds[3][0];
    let victim = rounds[3]
        .iter()
        .position(|t| t.src != first.src && t.dst != first.src)
        .unwrap();
    rounds[3][victim].src = first.src;
    assert_eq!(
        verify(&s),
        Err(VerifyError::SendsTwice {
            phase: "stragglar",
            round: 3,
            rank: first.src
        })
    );
}

#[test]
fn rejects_a_rank_receiving_twice_in_a_round() {
    let mut s = stragglar(6, 0);
    let rounds = post(&mut s);
    let first = rounds[4][0];
    let victim = rounds[4]
        .iter()
        .position(|t| t.dst != first.dst && t.src != first.dst)
        .unwrap();
    rounds[4][victim].dst = first.dst;
    assert_eq!(
        verify(&s),
        Err(VerifyError::ReceivesTwice {
            phase: "stragglar",
            round: 4,
            rank: first.dst
        })
    );
}

#[test]
fn rejects_the_straggler_acting_before_arrival() {
    for straggler in [0, 2, 4] {
        let mut s = stragglar(5, straggler);
        let before = &mut s.phases[0];
        assert_eq!(before.kind, PhaseKind::ReduceScatter);
        let other = (straggler + 1) % 5;
        before
            .rounds
            .push(vec![Transfer::copy(straggler, other, 0)]);
        assert!(
            matches!(verify(&s), Err(VerifyError::StragglerBeforeArrival { .. })),
            "{:?}",
            verify(&s)
        );
    }
}

#[test]
fn rejects_a_chunk_left_incomplete() {
    let mut s = stragglar(12, 5);
    let rounds = post(&mut s);
    let last = rounds.last_mut().unwrap();
    let dropped = last.pop().unwrap();
    match verify(&s) {
        Err(VerifyError::Incomplete { rank, chunk, have }) => {
            assert_eq!((rank, chunk), (dropped.dst, dropped.chunk));
            assert!(have < 12);
        }
        other => panic!("expected Incomplete, got {other:?}"),
    }
}

#[test]
fn rejects_transfers_out_of_range_and_bad_shapes() {
    let s = two_ranks(vec![vec![Transfer::reduce(0, 2, 0)]]);
    assert!(matches!(verify(&s), Err(VerifyError::BadTransfer { .. })));
    let s = two_ranks(vec![vec![Transfer::reduce(0, 0, 0)]]);
    assert!(matches!(verify(&s), Err(VerifyError::BadTransfer { .. })));
    let s = two_ranks(vec![vec![Transfer::reduce(0, 1, 1)]]);
    assert!(matches!(verify(&s), Err(VerifyError::BadTransfer { .. })));
    let mut s = stragglar(4, 1);
    s.phases.swap(0, 1);
    assert!(matches!(verify(&s), Err(VerifyError::Shape(_))));
    let mut s = stragglar(4, 1);
    s.straggler = Some(4);
    assert!(matches!(verify(&s), Err(VerifyError::Shape(_))));
}

#[test]
fn errors_explain_themselves() {
    let e = VerifyError::SendsTwice {
        phase: "stragglar",
        round: 2,
        rank: 5,
    };
    assert_eq!(e.to_string(), "stragglar round 2: rank 5 sends twice");
}

fn multicast(n: usize, s: usize) -> Schedule {
    Algorithm::Multicast
        .schedule(&PlanRequest::new(n, s))
        .unwrap()
}

/// In a multicast schedule a rank may send one chunk to several ranks in a round, never two
/// chunks; a point-to-point schedule may not do even the first.
#[test]
fn one_chunk_to_many_only_in_a_multicast_schedule() {
    for n in 2..=12 {
        for s in 0..n {
            assert_eq!(verify(&multicast(n, s)), Ok(()), "n={n} s={s}");
        }
    }
    // A hand-written exchange whose rank 0 sends chunk 0 to ranks 1 and 2 in one round.
    let mut fan_out = Schedule {
        ranks: 3,
        straggler: None,
        chunks: 1,
        pieces_per_chunk: 1,
        phases: vec![Phase {
            kind: PhaseKind::AllReduce,
            rounds: vec![
                vec![Transfer::reduce(1, 0, 0)],
                vec![Transfer::reduce(2, 0, 0)],
                vec![Transfer::copy(0, 1, 0), Transfer::copy(0, 2, 0)],
            ],
        }],
        multicast: true,
    };
    assert_eq!(verify(&fan_out), Ok(()));
    fan_out.multicast = false;
    assert_eq!(
        verify(&fan_out),
        Err(VerifyError::SendsTwice {
            phase: "allreduce",
            round: 2,
            rank: 0
        })
    );
    let mut mc = multicast(5, 4);
    post(&mut mc)[0].push(Transfer::copy(4, 0, 1));
    assert!(matches!(
        verify(&mc),
        Err(VerifyError::SendsTwice { rank: 4, .. }) | Err(VerifyError::ReceivesTwice { .. })
    ));
}

/// The straggler receives in the gather but may not send before it arrives.
#[test]
fn rejects_the_straggler_sending_in_the_gather() {
    let mut mc = multicast(4, 3);
    let gather = mc
        .phases
        .iter_mut()
        .find(|p| p.kind == PhaseKind::Gather)
        .unwrap();
    gather.rounds.push(vec![Transfer::copy(3, 0, 0)]);
    let err = verify(&mc).unwrap_err();
    assert_eq!(
        err,
        VerifyError::StragglerSendsBeforeArrival {
            round: 3,
            transfer: Transfer::copy(3, 0, 0)
        }
    );
    assert!(err
        .to_string()
        .contains("gather round 3: the straggler sends before it arrives"));
}

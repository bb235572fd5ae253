//! The alpha-beta model reproduces the paper's numbers and prices our own schedules.

use stragglar::schedule::model::{best_pipelining, stragglar_rounds, Link, Multicast, Nvls, Times};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn prototype() -> Link {
    Link {
        alpha: 3e-6,
        bandwidth: 483.183_820_8e9,
    }
}

/// An 8-GPU H100/H200 NVSwitch server's links at what NCCL's Ring reaches: 370 GB/s, 3 us.
fn server_link() -> Link {
    Link {
        alpha: 3e-6,
        bandwidth: 370e9,
    }
}

fn times(n: usize, bytes: f64) -> Times {
    Times::new(n, stragglar_rounds(n, 1), bytes, prototype())
}

#[test]
fn reproduces_the_published_ring_over_stragglar_ratios() {
    let published = [
        (4, "1.127"),
        (8, "1.363"),
        (16, "1.565"),
        (32, "1.718"),
        (64, "1.826"),
        (128, "1.897"),
        (256, "1.941"),
    ];
    for (n, ratio) in published {
        let t = times(n, GIB);
        // A delay that covers the ReduceScatter.
        let c = t.with_delay(t.reduce_scatter * 2.0);
        assert_eq!(format!("{:.3}", c.speedup_post), ratio, "n={n}");
        assert_eq!(c.speedup_post, t.ring / t.stragglar_post);
    }
}

#[test]
fn fewer_rounds_than_the_authors_give_better_ratios() {
    // n = 12: the authors' heuristic needs 15 rounds, our schedule 14.
    let ours = times(12, GIB);
    let theirs = Times::new(12, 15, GIB, prototype());
    assert!(ours.stragglar_rounds < 15);
    assert!(ours.ring / ours.stragglar_post > theirs.ring / theirs.stragglar_post);
}

#[test]
fn formulas_of_section_4() {
    let link = prototype();
    let (n, m) = (8usize, GIB);
    let t = times(n, m);
    let mb = m / link.bandwidth;
    assert_eq!(t.stragglar_rounds, 9);
    assert!((t.stragglar_post - (9.0 * 3e-6 + 9.0 / 7.0 * mb)).abs() < 1e-12);
    assert!((t.reduce_scatter - (6.0 * 3e-6 + 6.0 / 7.0 * mb)).abs() < 1e-12);
    assert!((t.ring - (14.0 * 3e-6 + 14.0 / 8.0 * mb)).abs() < 1e-12);
    assert!((t.halving_doubling.unwrap() - (6.0 * 3e-6 + 14.0 / 8.0 * mb)).abs() < 1e-12);
    assert!((t.direct_post - 3.0 * (3e-6 + mb)).abs() < 1e-12);
    assert!(times(6, m).halving_doubling.is_none());
}

#[test]
fn completion_and_speedups() {
    let t = times(8, GIB);
    let covered = t.with_delay(0.01);
    assert_eq!(covered.stragglar, 0.01 + t.stragglar_post);
    assert_eq!(covered.ring, 0.01 + t.ring);
    assert_eq!(covered.speedup_call, covered.ring / covered.stragglar);
    assert!(covered.speedup_call > 1.0);
    // No delay: StragglAR pays the whole ReduceScatter and loses (2.14 vs 1.75 M beta).
    let none = t.with_delay(0.0);
    assert!(none.speedup_call < 1.0);
}

#[test]
fn the_break_even_delay_is_exact() {
    for n in [4, 5, 8, 12, 64] {
        let t = times(n, GIB);
        let d = t
            .with_delay(0.0)
            .break_even
            .expect("StragglAR wins for n >= 4");
        let at = t.with_delay(d);
        assert!((at.stragglar - at.ring).abs() < 1e-12, "n={n}");
        let before = t.with_delay(d * 0.99);
        assert!(before.stragglar > before.ring, "n={n}");
        let after = t.with_delay(d * 1.01);
        assert!(after.stragglar < after.ring, "n={n}");
    }
}

#[test]
fn no_break_even_at_three_ranks() {
    for bytes in [64.0 * 1024.0 * 1024.0, GIB, 16.0 * GIB] {
        let t = times(3, bytes);
        for delay in [0.0, 1e-3, 1.0] {
            let c = t.with_delay(delay);
            assert_eq!(c.break_even, None);
            assert!(c.stragglar > c.ring);
        }
    }
}

/// NCCL's NVLS on an 8-GPU H100/H200 server, with the links at what Ring reaches (370 GB/s):
/// plain StragglAR after arrival is nearly NVLS's time, pipelined StragglAR clearly shorter.
#[test]
fn nvls_is_nearly_plain_stragglar_and_pipelining_beats_it_at_eight_ranks() {
    let link = server_link();
    let nvls = Nvls {
        ratio: Nvls::PUBLISHED_RATIO,
    };
    let t_nvls = nvls.time(8, GIB, link).unwrap();
    let expected = 6e-6 + GIB / (480.0 * 8.0 / 14.0 * 1e9);
    assert!((t_nvls - expected).abs() < 1e-12, "{t_nvls} {expected}");
    let plain = Times::new(8, stragglar_rounds(8, 1), GIB, link).stragglar_post;
    let ratio = plain / t_nvls;
    assert!((0.9..1.1).contains(&ratio), "plain / NVLS = {ratio}");
    let pipelined = best_pipelining(8, GIB, link, 64, |k| stragglar_rounds(8, k));
    assert!(
        pipelined.time / t_nvls < 0.9,
        "pipelined {} / NVLS {t_nvls}",
        pipelined.time
    );
    assert_eq!(nvls.time(9, GIB, link), None, "one server at most");
    assert!(nvls.time(2, GIB, link).is_some());
}

/// Multicast StragglAR on the same 8-GPU server: after arrival one broadcast of `M` (the floor
/// plus a round), against plain and pipelined point-to-point StragglAR and NVLS; before
/// arrival the early ranks' ReduceScatter and one gather of `P`, so it needs a longer delay to
/// pay than point-to-point StragglAR does against Ring.
#[test]
fn multicast_reaches_the_floor_after_arrival_and_pays_its_gather_before() {
    let link = server_link();
    let mc = Multicast {
        ratio: Multicast::ASSUMED_RATIO,
    }
    .times(8, GIB, link);
    let floor = GIB / 370e9;
    assert!((mc.post - (3e-6 + floor)).abs() < 1e-12, "{}", mc.post);
    assert_eq!(
        mc.gather, mc.post,
        "the gather into the straggler moves M too"
    );
    let p2p = Times::new(8, stragglar_rounds(8, 1), GIB, link);
    assert_eq!(mc.reduce_scatter, p2p.reduce_scatter);
    assert!((mc.pre() - (p2p.reduce_scatter + mc.gather)).abs() < 1e-15);
    let pipelined = best_pipelining(8, GIB, link, 64, |k| stragglar_rounds(8, k));
    assert!(mc.post < pipelined.time && pipelined.time < p2p.stragglar_post);
    let t_nvls = Nvls {
        ratio: Nvls::PUBLISHED_RATIO,
    }
    .time(8, GIB, link)
    .unwrap();
    // max(D, T_pre) + T_post = D + T_nvls exactly at the break-even delay, not below it.
    let even = mc.break_even(t_nvls).unwrap();
    assert!((mc.completion(even) - (even + t_nvls)).abs() < 1e-12);
    assert!(mc.completion(0.9 * even) > 0.9 * even + t_nvls);
    assert!(
        even > p2p.with_delay(0.0).break_even.unwrap(),
        "a longer delay to pay"
    );
    // A slow multicast never pays: after arrival it is no shorter than NVLS.
    let slow = Multicast { ratio: 0.7 }.times(8, GIB, link);
    assert_eq!(slow.break_even(t_nvls), None);
    // Two ranks: no ReduceScatter, the one early rank's input is P.
    let two = Multicast { ratio: 1.0 }.times(2, GIB, link);
    assert_eq!(two.reduce_scatter, 0.0);
}

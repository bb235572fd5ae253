//! `stragglar demo`: StragglAR against Ring on the host engine, with the model beside each
//! measurement. Eight ranks as processes over shared memory, rank 7 late on every call,
//! links emulated at a rate far below memory bandwidth so that 2 cores do not distort the
//! ratios.

use super::args::{Args, UsageError};
use super::bench::{execute, fresh_comm_id, BenchOptions, Row};
use crate::schedule::model::{stragglar_rounds, Link, Times};

const RANKS: usize = 8;
/// Emulated link: 20 MB/s per direction, 20 us per transfer.
const LINK_GBS: f64 = 0.02;
const LATENCY_US: f64 = 20.0;
const SIZES: [u64; 3] = [64 << 10, 256 << 10, 1 << 20];

fn options(
    algo: &str,
    bytes: u64,
    delay_us: u64,
    iters: usize,
) -> Result<BenchOptions, UsageError> {
    let args = [
        "--ranks",
        "8",
        "--algo",
        algo,
        "-b",
        &bytes.to_string(),
        "-e",
        &bytes.to_string(),
        "-n",
        &iters.to_string(),
        "-w",
        "1",
        "-c",
        "1",
        "--delay-us",
        &delay_us.to_string(),
        "--link-gbs",
        &LINK_GBS.to_string(),
        "--link-latency-us",
        &LATENCY_US.to_string(),
    ];
    BenchOptions::parse(Args::new(args.iter().map(|s| s.to_string())))
}

/// One size of the demo: its row, and the lateness the host engine measured for it.
struct Measured {
    row: Row,
    lead_us: f64,
    post_us: f64,
}

fn measure(algo: &str, bytes: u64, delay_us: u64, iters: usize) -> Result<Measured, UsageError> {
    let outcome = execute(
        &options(algo, bytes, delay_us, iters)?,
        fresh_comm_id(),
        |_| {},
    )
    .map_err(UsageError)?;
    if outcome.rows.iter().any(|r| r.disagreements > 0) {
        return Err(UsageError(format!(
            "{algo} at {bytes} B: ranks disagreed on the algorithm"
        )));
    }
    if !outcome.failures.is_empty() || outcome.wrong() > 0 {
        return Err(UsageError(format!(
            "{algo} at {bytes} B failed: {:?}, {} wrong",
            outcome.failures,
            outcome.wrong()
        )));
    }
    let row = outcome
        .rows
        .into_iter()
        .next()
        .ok_or_else(|| UsageError("no result".into()))?;
    let (Some(lead_us), Some(post_us)) = (row.lead_us, row.post_us) else {
        return Err(UsageError("the host engine measured no lateness".into()));
    };
    Ok(Measured {
        row,
        lead_us,
        post_us,
    })
}

fn ms(us: f64) -> String {
    format!("{:.1}", us / 1000.0)
}

/// Runs the demo (about 15 seconds on 2 cores).
pub fn run(args: Args) -> Result<i32, UsageError> {
    args.finish()?;
    let link = Link {
        alpha: LATENCY_US * 1e-6,
        bandwidth: LINK_GBS * 1e9,
    };
    let rounds = stragglar_rounds(RANKS, 1);
    println!(
        "stragglar demo: {RANKS} ranks as processes on the host engine, rank 7 late on every call,"
    );
    println!(
        "links emulated at {} MB/s and {LATENCY_US} us per transfer; times in ms.",
        LINK_GBS * 1000.0
    );
    println!("'post' = from the straggler's arrival to the last rank's finish; 'lead' = how late it was.");
    println!();
    println!("    size   delay |  Ring lead    post  model |  StragglAR lead    post  model |  speedup after arrival  whole call");
    println!("                 |                          |                                |    measured    model    measured  model");
    let mut wins = 0;
    for bytes in SIZES {
        let times = Times::new(RANKS, rounds, bytes as f64, link);
        // Late enough to hide the ReduceScatter even after the previous call's tail.
        let delay_us = ((2.0 * times.reduce_scatter + times.stragglar_post) * 1e6) as u64;
        let ring = measure("ring", bytes, delay_us, 4)?;
        let strag = measure("stragglar", bytes, delay_us, 4)?;
        let model_ring = times.with_delay(ring.lead_us * 1e-6);
        let model_strag = times.with_delay(strag.lead_us * 1e-6);
        let post_speedup = ring.post_us / strag.post_us;
        let call_speedup = (ring.lead_us + ring.post_us) / (strag.lead_us + strag.post_us);
        wins += (call_speedup > 1.0) as usize;
        println!(
            "{:>8} {:>7} | {:>10} {:>7} {:>6} | {:>15} {:>7} {:>6} | {:>11.2} {:>8.2} {:>11.2} {:>6.2}",
            bytes,
            ms(delay_us as f64),
            ms(ring.lead_us),
            ms(ring.post_us),
            ms(times.ring * 1e6),
            ms(strag.lead_us),
            ms(strag.post_us),
            ms((model_strag.stragglar - strag.lead_us * 1e-6).max(times.stragglar_post) * 1e6),
            post_speedup,
            model_ring.speedup_post,
            call_speedup,
            (ring.lead_us * 1e-6 + times.ring) / model_strag.stragglar,
        );
    }
    println!();
    let bytes = SIZES[1];
    let times = Times::new(RANKS, rounds, bytes as f64, link);
    let delay_us = ((2.0 * times.reduce_scatter + times.stragglar_post) * 1e6) as u64;
    let auto = measure("auto", bytes, delay_us, 30)?;
    let designated = if auto.row.designated < 0 {
        "none".to_string()
    } else {
        format!("rank {}", auto.row.designated)
    };
    println!(
        "Policy (--algo auto at {bytes} B, no hint given): designated straggler {designated}; {:.0}% of timed calls",
        auto.row.stragglar_percent
    );
    println!("ran StragglAR (the first calls go to Ring while the detector fills its 32-call window), every rank");
    println!("choosing alike on every call.");
    println!();
    println!(
        "What this shows: while rank 7 is late, the other seven reduce-scatter among themselves;"
    );
    println!("when it arrives only {rounds} rounds of 1/7 of the buffer remain, against Ring's 14 rounds of 1/8.");
    println!(
        "The model (docs/ALGORITHM.md section 4) predicts the 'post' columns; every result was checked"
    );
    println!(
        "element by element on every rank. StragglAR finished first at {wins} of {} sizes.",
        SIZES.len()
    );
    Ok(0)
}

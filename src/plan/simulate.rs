//! A single-threaded interpreter of a plan, and the plain reference result: the semantics the
//! engines must reproduce, bit for bit for the interpreter.

use std::collections::HashMap;

use super::{Plan, Step, Turn, ValueRef};
use crate::reduce::{combine, finish, prescale, DataType, ReduceOp, Scale};

/// Runs `plan` on `inputs` (one buffer of `count` elements per rank, little-endian) and returns
/// each rank's output. `scales[r]` is rank `r`'s copy-in scaling (see [`Scale::for_op`]).
/// Steps run in any order their dependencies allow (round robin over the ranks), ordered reads
/// only in their turn on the source's send port; panics if the plan can deadlock, which the
/// tests rely on.
pub fn simulate(plan: &Plan, op: ReduceOp, inputs: &[Vec<u8>], scales: &[Scale]) -> Vec<Vec<u8>> {
    let n = plan.ranks;
    let size = plan.dtype.size();
    let mut outputs: Vec<Vec<u8>> = inputs.iter().map(|i| vec![0xa5; i.len()]).collect();
    let mut values: HashMap<ValueRef, Vec<u8>> = HashMap::new();
    let mut next = vec![0usize; n];
    // Sends each rank has served in turn order (see `plan::Turn`).
    let mut served = vec![0usize; n];
    // Whether a read of `source` by `rank` with `turn` may go now.
    let my_turn = |served: &[usize], rank: usize, source: &ValueRef, turn: &Turn| match turn {
        Some(k) if source.rank != rank => served[source.rank] == *k,
        _ => true,
    };
    loop {
        let mut progressed = false;
        for rank in 0..n {
            let Some(step) = plan.programs[rank].steps.get(next[rank]) else {
                continue;
            };
            match step {
                Step::CopyIn => {
                    let mut scaled = inputs[rank].clone();
                    prescale(plan.dtype, scales[rank], &mut scaled);
                    for chunk in 0..plan.chunks.len() {
                        values.insert(
                            ValueRef { rank, id: chunk },
                            scaled[plan.chunk_bytes(chunk)].to_vec(),
                        );
                    }
                }
                Step::Combine {
                    chunk,
                    sources,
                    out,
                    complete,
                    turn,
                } => {
                    if !sources
                        .iter()
                        .all(|s| values.contains_key(s) && my_turn(&served, rank, s, turn))
                    {
                        continue;
                    }
                    for s in sources.iter().filter(|s| s.rank != rank && turn.is_some()) {
                        served[s.rank] += 1;
                    }
                    let operands: Vec<&[u8]> =
                        sources.iter().map(|s| values[s].as_slice()).collect();
                    let mut result = vec![0u8; plan.chunks[*chunk].len() * size];
                    combine(plan.dtype, op, &operands, &mut result);
                    if *complete {
                        finish(plan.dtype, op, n, &mut result);
                        outputs[rank][plan.chunk_bytes(*chunk)].copy_from_slice(&result);
                    }
                    values.insert(ValueRef { rank, id: *out }, result);
                }
                Step::Copy {
                    chunk,
                    source,
                    out,
                    turn,
                } => {
                    let Some(value) = values.get(source).cloned() else {
                        continue;
                    };
                    if !my_turn(&served, rank, source, turn) {
                        continue;
                    }
                    if turn.is_some() && source.rank != rank {
                        served[source.rank] += 1;
                    }
                    outputs[rank][plan.chunk_bytes(*chunk)].copy_from_slice(&value);
                    values.insert(ValueRef { rank, id: *out }, value);
                }
            }
            next[rank] += 1;
            progressed = true;
        }
        if next
            .iter()
            .zip(&plan.programs)
            .all(|(&i, p)| i == p.steps.len())
        {
            return outputs;
        }
        assert!(progressed, "plan deadlocks: {next:?}");
    }
}

/// The plain AllReduce of `inputs`: each scaled, combined in rank order in one step, finished.
pub fn reference(dtype: DataType, op: ReduceOp, inputs: &[Vec<u8>], scales: &[Scale]) -> Vec<u8> {
    let scaled: Vec<Vec<u8>> = inputs
        .iter()
        .zip(scales)
        .map(|(input, &scale)| {
            let mut s = input.clone();
            prescale(dtype, scale, &mut s);
            s
        })
        .collect();
    let operands: Vec<&[u8]> = scaled.iter().map(Vec::as_slice).collect();
    let mut out = vec![0u8; inputs[0].len()];
    combine(dtype, op, &operands, &mut out);
    finish(dtype, op, inputs.len(), &mut out);
    out
}

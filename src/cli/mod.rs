//! The `stragglar` command-line tool: one module per subcommand.

pub mod args;
pub mod bench;
mod charts;
mod demo;
mod doctor;
mod kernels;
pub mod model;
pub mod plan;
mod report;
mod rng;
mod run;
mod soak;
mod team_check;

use args::{Args, UsageError};

/// What `stragglar help` prints: the commands, then the options of each.
pub const USAGE: &str = "\
stragglar - StragglAR AllReduce for NCCL jobs with a persistent straggler

usage: stragglar <command> [options]

commands:
  bench      nccl-tests all_reduce_perf on the host or GPU engine, with a late straggler
  demo       StragglAR against Ring on the host engine, with the model beside each result
  doctor     what the library would do on this machine
  help       this text
  kernels    compile the CUDA kernels with NVRTC into checked CUBINs
  run        run a command (torchrun, python, ...) with the library preloaded
  soak       a seeded stream of random AllReduce calls on the host engine, every element checked
  plan       print a StragglAR, Ring, halving-doubling or Direct schedule
  report     which rank is the persistent straggler, from observe mode's records
  model      modelled times of every algorithm, speedups, break-even delays
";

/// The options of `command`, for `stragglar COMMAND --help`; `None` for a command without
/// options of its own.
fn usage_of(command: &str) -> Option<&'static str> {
    match command {
        "bench" => Some(bench::USAGE),
        "plan" => Some(plan::USAGE),
        "model" => Some(model::USAGE),
        "kernels" => Some(kernels::USAGE),
        "report" => Some(report::USAGE),
        "doctor" => Some(doctor::USAGE),
        _ => None,
    }
}

/// Runs one subcommand; returns the process exit status.
pub fn run(argv: Vec<String>) -> i32 {
    let mut it = argv.into_iter().skip(1);
    let command = it.next().unwrap_or_else(|| "help".to_string());
    let rest: Vec<String> = it.collect();
    if command == bench::WORKER_COMMAND {
        return bench::worker_main(rest);
    }
    if command == bench::CUDA_WORKER_COMMAND {
        return bench::cuda_worker_main(rest);
    }
    if command == team_check::WORKER_COMMAND {
        return team_check::worker_main(rest);
    }
    if command == "run" {
        // Everything after the options belongs to the command: not parsed as our arguments.
        return match run::run(rest) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("stragglar: {e}");
                2
            }
        };
    }
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        if let Some(usage) = usage_of(&command) {
            print!("{}", usage.trim_start_matches('\n'));
            return 0;
        }
    }
    let args = Args::new(rest);
    let result: Result<i32, UsageError> = match command.as_str() {
        "help" | "--help" | "-h" => {
            print!(
                "{USAGE}{}{}{}{}{}{}",
                bench::USAGE,
                plan::USAGE,
                model::USAGE,
                kernels::USAGE,
                report::USAGE,
                run::USAGE
            );
            Ok(0)
        }
        "doctor" => doctor::run(args),
        "bench" => bench::run(args),
        "demo" => demo::run(args),
        "plan" => plan::run(args),
        "model" => model::run(args),
        "soak" => soak::run(args),
        "kernels" => kernels::run(args),
        "report" => report::run(args),
        other => Err(UsageError(format!(
            "unknown command '{other}'; try 'stragglar help'"
        ))),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stragglar: {e}");
            2
        }
    }
}

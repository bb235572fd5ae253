//! The `stragglar` command-line tool: one module per subcommand.

pub mod args;
pub mod model;
pub mod plan;

use args::{Args, UsageError};

/// What `stragglar help` prints: the commands, then the options of `plan` and `model`.
pub const USAGE: &str = "\
stragglar - StragglAR AllReduce for NCCL jobs with a persistent straggler

usage: stragglar <command> [options]

commands:
  doctor     what the library would do on this machine
  help       this text
  plan       print a StragglAR, Ring, halving-doubling or Direct schedule
  model      modelled times of every algorithm, speedups, break-even delays
";

/// Runs one subcommand; returns the process exit status.
pub fn run(argv: Vec<String>) -> i32 {
    let mut it = argv.into_iter().skip(1);
    let command = it.next().unwrap_or_else(|| "help".to_string());
    let args = Args::new(it);
    let result: Result<i32, UsageError> = match command.as_str() {
        "help" | "--help" | "-h" => {
            print!("{USAGE}{}{}", plan::USAGE, model::USAGE);
            Ok(0)
        }
        "plan" => plan::run(args),
        "model" => model::run(args),
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

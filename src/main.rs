//! The `stragglar` command-line tool; see `stragglar help`.

fn main() {
    std::process::exit(stragglar::cli::run(std::env::args().collect()));
}

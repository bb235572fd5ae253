//! The `stragglar` command-line tool; see `stragglar help`.

fn main() {
    // A closed output pipe (`stragglar doctor | head`) ends the tool quietly, as it ends other
    // command-line tools, rather than as a panic on the failed write (Rust ignores SIGPIPE).
    // SAFETY: restores the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    std::process::exit(stragglar::cli::run(std::env::args().collect()));
}

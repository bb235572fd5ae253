//! `stragglar bench`: nccl-tests' all_reduce_perf on the host engine, with a late straggler,
//! or on the GPU engine (`--backend cuda`).
//!
//! The parent runs the ranks (threads of itself, or worker processes of the same binary that
//! report one line per size on stdout), combines what they measured and prints the table.

mod cuda;
pub(crate) mod data;
mod ending;
mod options;
mod report;
mod worker;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use super::args::{Args, UsageError};
use ending::{Exit, RankEnd, RankFailure, Told};
pub use options::{BenchAlgo, BenchOptions, RanksAs, TimeStat, USAGE};
pub use report::Row;

/// What a rank tells the parent (a worker process, one line each on stdout).
#[derive(Debug, PartialEq)]
enum Said {
    Size(report::RankSize),
    /// A line of the rank's straggler report.
    Report(String),
    Failed(RankFailure),
    /// The rank finished its sweep after this many engine calls.
    Done(u64),
}

/// What reaches the parent from a rank.
enum Message {
    Said(usize, Said),
    /// The rank's thread or process output ended.
    Ended(usize),
}

/// After a first failure, how long the other ranks get to notice and report it themselves
/// before the remaining workers are killed (a late rank may be sleeping through its delay).
const FAILURE_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a single rank may stay silent after all the others have settled before it is taken
/// for stuck (a stopped process never reports).
const LONE_SILENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// What a run produced.
pub struct Outcome {
    /// One row per size, in order.
    pub rows: Vec<Row>,
    /// What went wrong on which rank.
    pub failures: Vec<String>,
    /// Rank 0's straggler report (every rank's is the same).
    pub straggler_report: String,
}

impl Outcome {
    /// Wrong elements and rank disagreements over every row.
    pub fn wrong(&self) -> u64 {
        self.rows.iter().map(Row::bad).sum()
    }
}

/// Runs the ranks of one sweep and combines what they measured; `on_row` sees each row as soon
/// as every rank has reported it.
pub fn execute(
    options: &BenchOptions,
    comm_id: u64,
    mut on_row: impl FnMut(&Row),
) -> Result<Outcome, String> {
    worker::layout(options).map_err(|e| format!("cannot plan this run: {e}"))?;
    let (tx, rx) = mpsc::channel();
    let mut handles = match options.ranks_as {
        RanksAs::Threads => spawn_threads(options, comm_id, tx),
        RanksAs::Processes => spawn_processes(options, comm_id, tx)
            .map_err(|e| format!("cannot start workers: {e}"))?,
    };
    let mut pending: BTreeMap<u64, Vec<Option<report::RankSize>>> = BTreeMap::new();
    let mut outcome = Outcome {
        rows: Vec::new(),
        failures: Vec::new(),
        straggler_report: String::new(),
    };
    let mut settled = vec![false; options.ranks];
    let mut told = vec![Told::default(); options.ranks];
    let mut stopped = vec![false; options.ranks];
    let mut first_failure: Option<std::time::Instant> = None;
    let mut last_settled = std::time::Instant::now();
    loop {
        let message = match rx.recv_timeout(std::time::Duration::from_millis(50)) {
            Ok(message) => Some(message),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        match message {
            Some(Message::Said(rank, Said::Size(result))) => {
                told[rank].sizes += 1;
                let slot = pending
                    .entry(result.bytes)
                    .or_insert_with(|| vec![None; options.ranks]);
                slot[rank] = Some(result);
                if slot.iter().all(Option::is_some) {
                    let all: Vec<report::RankSize> = pending
                        .remove(&result.bytes)
                        .unwrap()
                        .into_iter()
                        .flatten()
                        .collect();
                    let row = report::combine(options.ranks, options.time_stat, &all);
                    on_row(&row);
                    outcome.rows.push(row);
                }
            }
            Some(Message::Said(0, Said::Report(line))) => {
                outcome.straggler_report.push_str(&line);
                outcome.straggler_report.push('\n');
            }
            Some(Message::Said(_, Said::Report(_))) => {}
            Some(Message::Said(rank, Said::Failed(failure))) => {
                settled[rank] = true;
                last_settled = std::time::Instant::now();
                first_failure.get_or_insert_with(std::time::Instant::now);
                told[rank].failure.get_or_insert(failure);
            }
            Some(Message::Said(rank, Said::Done(calls))) => told[rank].finished = Some(calls),
            Some(Message::Ended(rank)) => {
                settled[rank] = true;
                last_settled = std::time::Instant::now();
            }
            None => {}
        }
        // Once a rank failed, every other rank should report its own failure promptly; a rank
        // still silent well after all others settled (or after the grace) is stuck: stop it.
        if let Some(since) = first_failure {
            let silent = settled.iter().filter(|&&s| !s).count();
            let lone_and_quiet = silent <= 1 && last_settled.elapsed() > LONE_SILENCE;
            if lone_and_quiet || since.elapsed() > FAILURE_GRACE {
                for (handle, stopped) in handles.iter_mut().zip(&mut stopped) {
                    *stopped |= handle.stop();
                }
            }
        }
    }
    let ends: Vec<RankEnd> = handles
        .into_iter()
        .zip(told)
        .zip(stopped)
        .map(|((handle, told), stopped)| RankEnd {
            told,
            stopped,
            exit: handle.join(),
        })
        .collect();
    outcome.failures = ending::explain(&ends, options.sizes().len());
    if outcome.rows.len() != options.sizes().len() && outcome.failures.is_empty() {
        outcome.failures.push("some sizes were not reported".into());
    }
    Ok(outcome)
}

/// Runs `stragglar bench`; exit status 1 if any element was wrong or a rank failed.
pub fn run(args: Args) -> Result<i32, UsageError> {
    let options = BenchOptions::parse(args)?;
    if options.backend == options::Backend::Cuda {
        return Ok(cuda::run(&options));
    }
    let comm_id = fresh_comm_id();
    worker::layout(&options).map_err(|e| UsageError(format!("cannot plan this run: {e}")))?;
    let mut report = report::Report::start(&options, comm_id, &host_links(&options));
    let outcome = execute(&options, comm_id, |row| report.add(row.clone())).map_err(UsageError)?;
    let written = report.finish();
    print!("{}", outcome.straggler_report);
    if let Err(e) = written {
        eprintln!("stragglar bench: {e}");
        return Ok(1);
    }
    for failure in &outcome.failures {
        eprintln!("stragglar bench: {failure}");
    }
    let wrong = outcome.wrong();
    if wrong > 0 {
        eprintln!("stragglar bench: {wrong} wrong element(s) or rank disagreement(s)");
    }
    Ok(if wrong > 0 || !outcome.failures.is_empty() {
        1
    } else {
        0
    })
}

/// The host engine's links, for the header.
fn host_links(options: &BenchOptions) -> String {
    let link = match (options.link_gbs, options.baseline_link_gbs) {
        (Some(g), None) => format!("{g} GB/s + {} us per transfer", options.link_latency_us),
        (Some(g), Some(b)) => format!(
            "{g} GB/s (the baseline's {b} GB/s) + {} us per transfer",
            options.link_latency_us
        ),
        (None, _) => "unlimited".into(),
    };
    format!("link {link}")
}

/// A communicator id that no concurrent run shares.
pub fn fresh_comm_id() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ ((std::process::id() as u64) << 40)
}

/// A running rank: a thread or a child process.
enum Handle {
    Thread(std::thread::JoinHandle<()>),
    Process(std::process::Child, std::thread::JoinHandle<()>),
}

impl Handle {
    /// Kills the worker process if it is still running, and says whether it did (threads are
    /// left to fail on their own: they watch the abort word of the failed rank).
    fn stop(&mut self) -> bool {
        match self {
            Handle::Process(child, _) => {
                matches!(child.try_wait(), Ok(None)) && child.kill().is_ok()
            }
            Handle::Thread(_) => false,
        }
    }

    /// Waits for the rank to end.
    fn join(self) -> Exit {
        match self {
            Handle::Thread(t) => Exit::Thread {
                panicked: t.join().is_err(),
            },
            Handle::Process(mut child, reader) => {
                let _ = reader.join();
                match child.wait() {
                    Ok(status) => Exit::Process(status),
                    Err(e) => Exit::Unknown(e.to_string()),
                }
            }
        }
    }
}

fn spawn_threads(options: &BenchOptions, comm_id: u64, tx: mpsc::Sender<Message>) -> Vec<Handle> {
    (0..options.ranks)
        .map(|rank| {
            let (options, tx) = (options.clone(), tx.clone());
            Handle::Thread(std::thread::spawn(move || {
                let say = |said| {
                    let _ = tx.send(Message::Said(rank, said));
                };
                let sized = |r: worker::SizeResult| say(Said::Size(r.for_report(&options)));
                match worker::run(&options, comm_id, rank, sized) {
                    Ok(finished) => {
                        for line in finished.report.lines() {
                            say(Said::Report(line.to_string()));
                        }
                        say(Said::Done(finished.calls));
                    }
                    Err(failure) => say(Said::Failed(failure)),
                }
                let _ = tx.send(Message::Ended(rank));
            }))
        })
        .collect()
}

fn spawn_processes(
    options: &BenchOptions,
    comm_id: u64,
    tx: mpsc::Sender<Message>,
) -> std::io::Result<Vec<Handle>> {
    let exe = std::env::current_exe()?;
    let mut handles = Vec::new();
    for rank in 0..options.ranks {
        let mut child = Command::new(&exe)
            .arg(WORKER_COMMAND)
            .arg(comm_id.to_string())
            .arg(rank.to_string())
            .args(options.to_args())
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(said) = parse_line(&line) {
                    let _ = tx.send(Message::Said(rank, said));
                }
            }
            let _ = tx.send(Message::Ended(rank));
        });
        handles.push(Handle::Process(child, reader));
    }
    Ok(handles)
}

/// The hidden subcommand a worker process runs.
pub const WORKER_COMMAND: &str = "__bench-worker";

/// The hidden subcommand of a CUDA-backend worker process.
pub const CUDA_WORKER_COMMAND: &str = cuda::ipc::WORKER_COMMAND;

/// Runs one CUDA-backend worker process (ranks as processes over CUDA IPC).
pub fn cuda_worker_main(argv: Vec<String>) -> i32 {
    cuda::ipc::worker_main(argv)
}

/// Entry point of a worker process: `__bench-worker COMM_ID RANK <bench options>`.
pub fn worker_main(mut argv: Vec<String>) -> i32 {
    if argv.len() < 2 {
        return 2;
    }
    let rest = argv.split_off(2);
    let (Ok(comm_id), Ok(rank)) = (argv[0].parse::<u64>(), argv[1].parse::<usize>()) else {
        return 2;
    };
    let options = match BenchOptions::parse(Args::new(rest)) {
        Ok(o) => o,
        Err(e) => {
            println!("{}", RankFailure::outside_calls(e.to_string()).to_line());
            return 2;
        }
    };
    let result = worker::run(&options, comm_id, rank, |r| {
        println!("{}", r.for_report(&options).worker_line())
    });
    match result {
        Ok(finished) => {
            for line in finished.report.lines() {
                println!("REPORT {line}");
            }
            println!("DONE {}", finished.calls);
            0
        }
        Err(failure) => {
            println!("{}", failure.to_line());
            1
        }
    }
}

/// What a worker's line says; `None` for anything but a worker line. An unreadable worker
/// line is a failure of that rank.
fn parse_line(line: &str) -> Option<Said> {
    let unreadable = || {
        Said::Failed(RankFailure::outside_calls(format!(
            "unreadable worker line: {line}"
        )))
    };
    if let Some(report) = line.strip_prefix("REPORT ") {
        return Some(Said::Report(report.to_string()));
    }
    if let Some(failure) = line.strip_prefix("FAILED ") {
        return Some(RankFailure::from_line(failure).map_or_else(unreadable, Said::Failed));
    }
    if let Some(calls) = line.strip_prefix("DONE ") {
        return Some(calls.parse().map_or_else(|_| unreadable(), Said::Done));
    }
    let size = report::RankSize::from_worker_line(line)?;
    Some(size.map_or_else(|_| unreadable(), Said::Size))
}

#[cfg(test)]
mod tests {
    use super::worker::{Half, SizeResult};
    use super::*;

    #[test]
    fn worker_lines_round_trip() {
        let r = SizeResult {
            bytes: 4096,
            halves: [
                Half {
                    time_us: 12.5,
                    wrong: 0,
                    lead_us: 100.25,
                    post_us: 3.5,
                    digest: 99,
                    stragglar_calls: 12,
                    choices: 0xfeed,
                    designated: 7,
                },
                Half {
                    time_us: 13.0,
                    wrong: 2,
                    lead_us: 0.0,
                    post_us: 1.0,
                    digest: 7,
                    stragglar_calls: 0,
                    choices: 1,
                    designated: -1,
                },
            ],
        };
        let options = BenchOptions::parse(Args::new(Vec::<String>::new())).unwrap();
        let size = r.for_report(&options);
        assert_eq!(parse_line(&size.worker_line()), Some(Said::Size(size)));
        let failure = RankFailure {
            call: 7,
            peer: Some(3),
            why: "rank 3 exited".into(),
        };
        assert_eq!(parse_line(&failure.to_line()), Some(Said::Failed(failure)));
        assert_eq!(parse_line("DONE 12"), Some(Said::Done(12)));
        assert_eq!(parse_line("REPORT x y"), Some(Said::Report("x y".into())));
        assert!(matches!(
            parse_line("SIZE 12 x"),
            Some(Said::Failed(RankFailure { call: 0, .. }))
        ));
        assert_eq!(parse_line("noise"), None);
    }
}

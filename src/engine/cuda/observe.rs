//! Observe mode (`STRAGGLAR_OBSERVE=1`): every `ncclAllReduce` forwarded to NCCL, and every
//! `ncclReduceScatter` and `ncclAllGather` (FSDP's collectives), is timed by two events on the
//! caller's stream around the real call, read later without waiting (each
//! call harvests the events that completed since), and each rank appends what it measured to
//! its record in `STRAGGLAR_REPORT_DIR` for `stragglar report`: every `STRAGGLAR_RECORD_EVERY`
//! seconds from a thread of its own (never on a caller's thread, so no call is held up by a
//! write), and at destroy (or at the process's exit, for a communicator never destroyed), with
//! the record's closing line. A killed process leaves the calls written so far, unclosed.
//!
//! A rank that arrives last at a collective finds the others waiting, so its call is the
//! shortest: the report compares durations of the same call across ranks, never clocks. Calls
//! are matched across ranks by their number on the communicator, counted in its record from
//! its first call whatever this rank could time (every rank makes the same calls, and routes
//! them alike). A communicator's collectives inside one group are one call, timed to the
//! group's end. Not timed, and counted as such: calls while the stream captures a graph (no
//! event is queried then either), calls NCCL did not answer `ncclSuccess`, calls beyond the
//! pending limit. A communicator whose GPU, rank or name is unknown is not observed.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::driver::{self, Device, Event};
use super::gpus;
use crate::nccl::types::{cudaStream_t, ncclComm_t, ResultCode};
use crate::registry::{self, names};

/// Calls whose events are kept pending at most: a host this far ahead of its GPU observes no
/// more calls until the GPU catches up (they are counted unobserved).
const MAX_PENDING: usize = 256;

/// Samples written per communicator at most (about 40 MiB of record file): later calls are
/// counted as dropped, so a long job's records stay bounded. In memory, only the samples not
/// yet written are kept.
pub const MAX_SAMPLES: u64 = 1 << 20;

/// How long a destroy waits for the last calls' events.
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// The first line of a record file, with the format's version.
pub const RECORD_MAGIC: &str = "stragglar-observe 2";

/// The keyword of a record's closing line (`end unobserved U dropped D calls C`), written once
/// its rank ended the communicator (destroy, abort or exit); a record without one was cut off
/// (its process killed, or still running).
pub const RECORD_END: &str = "end";

/// The collectives observe mode times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    /// The collectives of one communicator inside one `ncclGroupStart`/`End`, timed as one.
    Group,
}

impl Collective {
    pub const ALL: [Collective; 4] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Group,
    ];

    /// Its NCCL name, as records spell it.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "AllReduce",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::AllGather => "AllGather",
            Collective::Group => "Group",
        }
    }

    /// The collective a record names.
    pub fn parse(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// One observed call: its number on the communicator (all observed collectives are numbered
/// in one sequence), which collective, its size class and how long it took on this rank's
/// stream, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub call: u64,
    pub collective: Collective,
    pub class: u32,
    pub duration_ns: u64,
}

/// A call whose events are not yet read.
struct Pending {
    call: u64,
    collective: Collective,
    class: u32,
    start: Event,
    end: Event,
}

/// Where one communicator's record goes on this rank, and how far it is written. Its lock
/// orders the appends of the writing thread, of a destroy and of the process's exit.
struct RecordFile {
    /// Under `STRAGGLAR_REPORT_DIR`; `None` when it is not set (nothing is written).
    path: Option<PathBuf>,
    /// Whether the header is written (the first write starts the file afresh).
    begun: bool,
    /// Whether a write failed (said once at WARN; later writes are skipped).
    failed: bool,
}

impl RecordFile {
    /// Appends `text` to the file, after `header` if nothing is written yet.
    fn append(&mut self, header: &str, text: &str) {
        let Some(path) = self.path.as_ref().filter(|_| !self.failed) else {
            return;
        };
        let written = (|| -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(self.begun)
                .truncate(!self.begun)
                .open(path)?;
            if !self.begun {
                file.write_all(header.as_bytes())?;
            }
            file.write_all(text.as_bytes())
        })();
        match written {
            Ok(()) => self.begun = true,
            Err(e) => {
                self.failed = true;
                log::warn!(
                    "STRAGGLAR_REPORT_DIR: {}: {e}; this communicator's observations are lost",
                    path.display()
                );
            }
        }
    }
}

/// One communicator's observations on this rank.
struct Observer {
    device: Arc<Device>,
    /// The GPU's UUID in hex and its PCI bus id, read when the observer was made (never at
    /// exit).
    gpu: String,
    pci: String,
    name: u64,
    rank: i32,
    ranks: i32,
    pending: VecDeque<Pending>,
    spare: Vec<(Event, Event)>,
    /// The samples not yet handed to the record file.
    samples: Vec<Sample>,
    /// Samples kept since the first call (written or not), at most `MAX_SAMPLES`.
    kept: u64,
    unobserved: u64,
    dropped: u64,
    file: Arc<Mutex<RecordFile>>,
}

impl Observer {
    /// Reads the events of the calls that completed, oldest first; never waits.
    fn harvest(&mut self) {
        while self.pending.front().is_some_and(|p| p.end.is_complete()) {
            let done = self.pending.pop_front().expect("checked");
            self.keep(&done);
            self.spare.push((done.start, done.end));
        }
    }

    fn keep(&mut self, done: &Pending) {
        match done.start.elapsed_ms(&done.end) {
            Ok(ms) if self.kept < MAX_SAMPLES => {
                self.kept += 1;
                self.samples.push(Sample {
                    call: done.call,
                    collective: done.collective,
                    class: done.class,
                    duration_ns: (f64::from(ms) * 1e6).max(0.0) as u64,
                });
            }
            Ok(_) => self.dropped += 1,
            Err(_) => self.unobserved += 1,
        }
    }

    /// Two events for the next call, reused or new.
    fn events(&mut self) -> Option<(Event, Event)> {
        if let Some(pair) = self.spare.pop() {
            return Some(pair);
        }
        Some((
            Event::new(&self.device).ok()?,
            Event::new(&self.device).ok()?,
        ))
    }

    /// The record file's first lines.
    fn header(&self) -> String {
        format!(
            "{RECORD_MAGIC}\ncomm {:016x}\nrank {} of {}\nhost {}\npid {}\ngpu {}\npci {}\n",
            self.name,
            self.rank,
            self.ranks,
            crate::logging::short_hostname(),
            std::process::id(),
            self.gpu,
            self.pci,
        )
    }

    /// What the writing thread appends: the header (used if the file is not begun), the
    /// samples not yet handed over, and the file; the samples leave memory.
    fn hand_over(&mut self) -> (String, Vec<Sample>, Arc<Mutex<RecordFile>>) {
        (
            self.header(),
            std::mem::take(&mut self.samples),
            self.file.clone(),
        )
    }

    /// The closing line, counting the calls still pending as unobserved.
    fn closing(&self) -> String {
        format!(
            "{RECORD_END} unobserved {} dropped {} calls {}\n",
            self.unobserved + self.pending.len() as u64,
            self.dropped,
            self.kept
        )
    }
}

/// The record lines of `samples`: `CALL CLASS NANOSECONDS COLLECTIVE` each.
fn sample_lines(samples: &[Sample]) -> String {
    let mut text = String::with_capacity(samples.len() * 32);
    for s in samples {
        let _ = writeln!(
            text,
            "{} {} {} {}",
            s.call,
            s.class,
            s.duration_ns,
            s.collective.name()
        );
    }
    text
}

/// Appends what `observer` holds to its record: its samples not yet written and, with
/// `close`, its closing line.
fn write_out(observer: &mut Observer, close: bool) {
    let (header, samples, file) = observer.hand_over();
    let mut text = sample_lines(&samples);
    if close {
        text.push_str(&observer.closing());
    }
    file.lock().append(&header, &text);
}

/// The writing thread's round: every observed communicator's samples since the last round are
/// taken under its lock (no I/O) and appended outside it. The file's lock is taken before the
/// communicator's is let go, so a destroy that takes the observer next appends its rest and
/// closing line after this round's samples, never before them.
fn write_round() {
    for (_, record) in registry::comms().all() {
        let mut slot = record.observer.lock();
        let Some(observer) = slot.as_mut().and_then(|o| o.downcast_mut::<Observer>()) else {
            continue;
        };
        if observer.samples.is_empty() {
            continue;
        }
        let (header, samples, file) = observer.hand_over();
        let mut written = file.lock();
        drop(slot);
        written.append(&header, &sample_lines(&samples));
    }
}

/// Starts the thread that writes records every `STRAGGLAR_RECORD_EVERY` seconds (once per
/// process; not at all when no directory is set or the interval is 0).
fn start_writing() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    let config = crate::config::get();
    if config.report_dir.is_none() || config.record_every_s == 0 {
        return;
    }
    let every = Duration::from_secs(config.record_every_s);
    STARTED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("stragglar-records".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                write_round();
            });
        if let Err(e) = spawned {
            log::warn!("observe mode: no thread to write records every {every:?} ({e}): records are written at destroy and exit only");
        }
    });
}

/// This rank's record file of communicator `name` and rank `rank`, under
/// `STRAGGLAR_REPORT_DIR` (`None` when it is not set).
fn record_path(name: u64, rank: i32) -> Option<PathBuf> {
    let pattern = crate::config::get().report_dir.as_deref()?;
    let dir = crate::logging::expand_file_pattern(
        pattern,
        &crate::logging::short_hostname(),
        std::process::id(),
    );
    Some(std::path::Path::new(&dir).join(format!(
        "stragglar-{name:016x}-rank{rank}-{}.rec",
        std::process::id()
    )))
}

/// The slot's marker for a communicator that cannot be observed (its GPU cannot be opened, or
/// it has no name).
struct Unobservable;

/// The process that registered the exit hook (a forked child inherits the hook, not the job).
static HOOK_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// `comm`'s observer, made at its first observable call: `Ok(None)` while its rank, size or
/// device is not known yet (a nonblocking init still in progress: asked again next call),
/// `Err` when it can never be observed.
fn make_observer(comm: ncclComm_t) -> Result<Option<Observer>, Unobservable> {
    let Some(info) = registry::comms().get(comm) else {
        return Err(Unobservable);
    };
    let (Some(device), Some(rank), Some(ranks)) = (info.cuda_device, info.rank, info.nranks) else {
        return Ok(None);
    };
    let name = names::of(comm).ok_or(Unobservable)?;
    let device = gpus::device(device, |why| {
        log::warn!("observe mode: device {device}: {why}; its calls are not timed")
    })
    .map_err(|_| Unobservable)?;
    let gpu = device
        .uuid()
        .map(|u| u.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .unwrap_or_else(|_| "unknown".into());
    let pci = device.pci_bus_id().unwrap_or_else(|_| "unknown".into());
    // Records are written every STRAGGLAR_RECORD_EVERY seconds, and closed at destroy, or at
    // the process's exit for communicators never destroyed.
    start_writing();
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        HOOK_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: registers a plain function with no arguments, run once at exit.
        unsafe { libc::atexit(write_at_exit) };
    });
    Ok(Some(Observer {
        device,
        gpu,
        pci,
        name,
        rank,
        ranks,
        pending: VecDeque::new(),
        spare: Vec::new(),
        samples: Vec::new(),
        kept: 0,
        unobserved: 0,
        dropped: 0,
        file: Arc::new(Mutex::new(RecordFile {
            path: record_path(name, rank),
            begun: false,
            failed: false,
        })),
    }))
}

/// Runs `call` (the real NCCL's `collective` of `bytes` per rank on `comm` and `stream`),
/// timing it when observe mode is on. Never waits for the GPU, and holds no lock across NCCL's
/// call. A destroyed communicator is not observed (NCCL refuses the call).
pub fn observed(
    collective: Collective,
    comm: ncclComm_t,
    stream: cudaStream_t,
    bytes: usize,
    in_group: bool,
    call: impl FnOnce() -> ResultCode,
) -> ResultCode {
    if !crate::config::get().observe || registry::comms().is_destroyed(comm) {
        return call();
    }
    let Some(record) = registry::comms().record(comm) else {
        return call();
    };
    // Its number, counted whatever this rank can time; a group's later collectives on this
    // communicator share its first one's.
    let joins_group = in_group && GROUP.with(|g| g.borrow().iter().any(|o| o.comm == comm));
    let number = match joins_group {
        true => None,
        false => Some(
            record
                .calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ),
    };
    // Before the call: its start event on the stream.
    let started = {
        let mut slot = record.observer.lock();
        if slot.is_none() {
            match make_observer(comm) {
                Ok(Some(observer)) => *slot = Some(Box::new(observer)),
                Ok(None) => {}
                // Not tried again.
                Err(marker) => *slot = Some(Box::new(marker)),
            }
        }
        match (
            slot.as_mut().and_then(|o| o.downcast_mut::<Observer>()),
            number,
        ) {
            (Some(observer), Some(number)) if in_group => {
                // Timed as one with the rest of the group, from its first collective on this
                // communicator to the group's end.
                let events = start(observer, stream);
                GROUP.with(|g| {
                    g.borrow_mut().push(OpenGroup {
                        comm,
                        stream,
                        number,
                        bytes,
                        events,
                        failed: false,
                    })
                });
                None
            }
            (Some(observer), Some(number)) => start(observer, stream).map(|e| (number, e)),
            _ => {
                if joins_group {
                    GROUP.with(|g| {
                        if let Some(open) = g.borrow_mut().iter_mut().find(|o| o.comm == comm) {
                            open.bytes = open.bytes.saturating_add(bytes);
                        }
                    });
                }
                None
            }
        }
    };
    let code = call();
    if in_group && code != ResultCode::SUCCESS {
        GROUP.with(|g| {
            if let Some(open) = g.borrow_mut().iter_mut().find(|o| o.comm == comm) {
                open.failed = true;
            }
        });
    }
    let Some((number, (start, end))) = started else {
        return code;
    };
    let mut slot = record.observer.lock();
    let Some(observer) = slot.as_mut().and_then(|o| o.downcast_mut::<Observer>()) else {
        return code;
    };
    // SAFETY: as above; NCCL's call is queued before the end event.
    let ended = code == ResultCode::SUCCESS && unsafe { end.record_raw(stream.cast()) }.is_ok();
    if ended {
        observer.pending.push_back(Pending {
            call: number,
            collective,
            class: crate::detect::size_class(bytes),
            start,
            end,
        });
    } else {
        observer.unobserved += 1;
        observer.spare.push((start, end));
    }
    code
}

/// Records the start event of a call on `stream`; `None` (the call counted unobserved) while
/// the stream captures (and then no event is even queried: a query may not run during a
/// capture), with too many calls pending, or when the driver refuses.
fn start(observer: &mut Observer, stream: cudaStream_t) -> Option<(Event, Event)> {
    // SAFETY: the caller's live stream of this communicator's device.
    let capturing = unsafe { driver::is_capturing(&observer.device, stream.cast()) };
    if capturing != Ok(false) {
        observer.unobserved += 1;
        return None;
    }
    // Reading events is allowed beside another thread's capture only in relaxed mode.
    driver::relaxed_capture_mode(|| observer.harvest());
    let events = (observer.pending.len() < MAX_PENDING)
        .then(|| observer.events())
        .flatten();
    // SAFETY: as above.
    match events.filter(|(start, _)| unsafe { start.record_raw(stream.cast()) }.is_ok()) {
        Some(events) => Some(events),
        None => {
            observer.unobserved += 1;
            None
        }
    }
}

/// One communicator's collectives in the calling thread's open group: timed as one call, from
/// its first collective's stream position to the group's end (on that stream).
struct OpenGroup {
    comm: ncclComm_t,
    stream: cudaStream_t,
    number: u64,
    bytes: usize,
    /// `None`: not timed (capturing, too many pending, the driver refused, or no observer yet):
    /// counted unobserved already, where an observer exists.
    events: Option<(Event, Event)>,
    /// A collective of it that NCCL refused.
    failed: bool,
}

thread_local! {
    /// The calling thread's open group, by communicator.
    static GROUP: std::cell::RefCell<Vec<OpenGroup>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The calling thread's outermost `ncclGroupEnd` returned `code`: each communicator's group
/// call gets its end event (where NCCL accepted the group) and waits among the pending calls.
pub fn group_ended(code: ResultCode) {
    let open = GROUP.with(|g| std::mem::take(&mut *g.borrow_mut()));
    for group in open {
        let Some((start, end)) = group.events else {
            continue;
        };
        let Some(record) = registry::comms().record(group.comm) else {
            continue;
        };
        let mut slot = record.observer.lock();
        let Some(observer) = slot.as_mut().and_then(|o| o.downcast_mut::<Observer>()) else {
            continue;
        };
        let fine = code == ResultCode::SUCCESS && !group.failed;
        // SAFETY: the stream the group's first collective was given, live until the caller's
        // later calls (NCCL's contract); the group's work is queued before the end event.
        if fine && unsafe { end.record_raw(group.stream.cast()) }.is_ok() {
            observer.pending.push_back(Pending {
                call: group.number,
                collective: Collective::Group,
                class: crate::detect::size_class(group.bytes),
                start,
                end,
            });
        } else {
            observer.unobserved += 1;
            observer.spare.push((start, end));
        }
    }
}

/// At the process's exit: writes the record of every communicator still observed (never
/// destroyed) with what it had read. The driver is not called at all (it, or the libraries
/// beside it, may already be torn down): the events of the last calls still pending are
/// counted unobserved, and the events themselves are left to the process's end.
extern "C" fn write_at_exit() {
    // A forked child inherits the hook and the observers: the records are its parent's.
    if HOOK_PID.load(std::sync::atomic::Ordering::Relaxed) != std::process::id() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        for (comm, record) in registry::comms().all() {
            // A lock held by a thread that exit() will never resume is given up on.
            let Some(mut guard) = record.observer.try_lock_for(Duration::from_millis(100)) else {
                continue;
            };
            let Some(slot) = guard.take() else {
                continue;
            };
            if let Ok(mut observer) = slot.downcast::<Observer>() {
                // The writing thread may be inside an append that exit() never lets finish.
                let (header, samples, file) = observer.hand_over();
                if let Some(mut file) = file.try_lock_for(Duration::from_millis(100)) {
                    let mut text = sample_lines(&samples);
                    text.push_str(&observer.closing());
                    file.append(&header, &text);
                }
                log::info!("communicator {comm:p}: its record closed at exit");
                std::mem::forget(observer);
            }
        }
    });
}

/// Ends `comm`'s observations (its destroy, or with `abort` its abort): the last calls' events
/// are read (for a destroy, waiting up to 2 s for them), and the record's rest and closing line
/// are appended in `STRAGGLAR_REPORT_DIR` if it is set.
pub fn finish(comm: ncclComm_t, abort: bool) {
    let Some(record) = registry::comms().record(comm) else {
        return;
    };
    let Some(slot) = record.observer.lock().take() else {
        return;
    };
    let Ok(mut observer) = slot.downcast::<Observer>() else {
        return;
    };
    let deadline = Instant::now() + FINISH_WAIT;
    while !abort && !observer.pending.is_empty() && Instant::now() < deadline {
        observer.harvest();
        std::thread::sleep(Duration::from_millis(1));
    }
    observer.harvest();
    write_out(&mut observer, true);
    let path = observer.file.lock().path.clone();
    if let Some(path) = path {
        log::info!(
            "communicator {comm:p}: {} observed calls in {}",
            observer.kept,
            path.display()
        );
    }
}

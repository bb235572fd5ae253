//! Log lines shaped like NCCL's, with our tag: `host:pid:tid [dev] STRAGGLAR INFO message`.
//!
//! `env_logger` does the writing. The library links its own copy of `log`, so installing our
//! logger never disturbs another Rust library in the same process.

use std::cell::Cell;
use std::fs::File;
use std::io::Write;

/// `STRAGGLAR_DEBUG` levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Problems only (the default).
    Warn,
    /// Also decisions and one-time facts: the library bound, settings, fallbacks.
    Info,
    /// Also per-call detail.
    Trace,
}

impl Level {
    /// Parses `WARN`, `INFO` or `TRACE`, in any case.
    pub fn parse(text: &str) -> Option<Level> {
        match text.to_ascii_uppercase().as_str() {
            "WARN" => Some(Level::Warn),
            "INFO" => Some(Level::Info),
            "TRACE" => Some(Level::Trace),
            _ => None,
        }
    }

    /// The name as `STRAGGLAR_DEBUG` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Trace => "TRACE",
        }
    }

    fn filter(self) -> log::LevelFilter {
        match self {
            Level::Warn => log::LevelFilter::Warn,
            Level::Info => log::LevelFilter::Info,
            Level::Trace => log::LevelFilter::Trace,
        }
    }
}

thread_local! {
    /// The CUDA device the current thread's call concerns, shown as `[dev]`; -1 when unknown.
    static DEVICE: Cell<i32> = const { Cell::new(-1) };
}

/// Records which CUDA device this thread's current call concerns, for the `[dev]` field.
pub fn set_thread_device(device: i32) {
    DEVICE.with(|d| d.set(device));
}

/// Host name up to the first dot, as NCCL prints it.
pub fn short_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    name.split('.').next().unwrap_or("unknown").to_string()
}

/// Expands `%h` (host name) and `%p` (process id) in a `STRAGGLAR_DEBUG_FILE` pattern.
pub fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> String {
    pattern.replace("%h", host).replace("%p", &pid.to_string())
}

/// Installs the logger at `level`, writing to `file_pattern` when given and openable (else to
/// stderr, with a warning). Does nothing if a logger is already installed.
pub fn install(level: Level, file_pattern: Option<&str>) {
    let host = short_hostname();
    let mut builder = env_logger::Builder::new();
    builder.filter_level(level.filter());
    let mut file_problem = None;
    if let Some(pattern) = file_pattern {
        let path = expand_file_pattern(pattern, &host, std::process::id());
        match File::create(&path) {
            Ok(file) => {
                builder.target(env_logger::Target::Pipe(Box::new(file)));
            }
            Err(e) => {
                file_problem = Some(format!(
                    "cannot open STRAGGLAR_DEBUG_FILE {path}: {e}; logging to stderr"
                ))
            }
        }
    }
    builder.format(move |buf, record| {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let device = DEVICE.with(Cell::get);
        let level = match record.level() {
            log::Level::Error | log::Level::Warn => "WARN",
            log::Level::Info => "INFO",
            log::Level::Debug | log::Level::Trace => "TRACE",
        };
        let dev = if device >= 0 {
            device.to_string()
        } else {
            "-".to_string()
        };
        writeln!(
            buf,
            "{host}:{}:{tid} [{dev}] STRAGGLAR {level} {}",
            std::process::id(),
            record.args()
        )
    });
    if builder.try_init().is_ok() {
        if let Some(problem) = file_problem {
            log::warn!("{problem}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case() {
        assert_eq!(Level::parse("info"), Some(Level::Info));
        assert_eq!(Level::parse("TRACE"), Some(Level::Trace));
        assert_eq!(Level::parse("Warn"), Some(Level::Warn));
        assert_eq!(Level::parse("debug"), None);
    }

    #[test]
    fn file_patterns_expand() {
        assert_eq!(
            expand_file_pattern("/tmp/s.%h.%p.log", "node1", 42),
            "/tmp/s.node1.42.log"
        );
        assert_eq!(expand_file_pattern("/tmp/plain", "node1", 42), "/tmp/plain");
    }

    #[test]
    fn hostname_is_short() {
        let h = short_hostname();
        assert!(!h.is_empty() && !h.contains('.'), "{h}");
    }
}

//! `STRAGGLAR_*` settings: read once from the environment, echoed at INFO, bad values warned
//! about and replaced by their defaults.
//!
//! Every setting is declared once, in [`SETTINGS`]: how it is read and shown, its default and
//! meaning, which `stragglar doctor`, `stragglar run` and the README (checked by a test) follow.

use once_cell::sync::OnceCell;

use crate::detect::pipeline::Pipeline;
use crate::detect::policy::{AlgoMode, StragglerMode};
use crate::detect::MulticastMode;
use crate::logging::{self, Level};

/// One `STRAGGLAR_*` setting, declared once: its variable, its default and meaning (for
/// `stragglar doctor`, `stragglar run` and the README), how a value is read into a [`Config`],
/// and how the effective value shows.
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// The default, as a person would write it.
    pub default: &'static str,
    /// What it does, in one line.
    pub meaning: &'static str,
    /// Reads a (trimmed) value into the configuration; false for a value it cannot use (the
    /// configuration then keeps the default).
    pub parse: fn(&mut Config, &str) -> bool,
    /// The effective value, as `stragglar doctor` shows it.
    pub show: fn(&Config) -> String,
}

/// A non-empty text value.
fn text(slot: &mut Option<String>, value: &str) -> bool {
    *slot = (!value.is_empty()).then(|| value.to_string());
    !value.is_empty()
}

/// `0` or `1`.
fn switch(slot: &mut bool, value: &str) -> bool {
    match value {
        "0" | "1" => {
            *slot = value == "1";
            true
        }
        _ => false,
    }
}

fn shown(slot: &Option<String>, unset: &str) -> String {
    slot.clone().unwrap_or_else(|| unset.to_string())
}

/// Every `STRAGGLAR_*` variable the library reads, in the order `doctor` shows them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "STRAGGLAR_ENABLE",
        default: "1",
        meaning: "0 makes the library a pure forwarder to the real NCCL",
        parse: |c, v| switch(&mut c.enabled, v),
        show: |c| u8::from(c.enabled).to_string(),
    },
    Setting {
        name: "STRAGGLAR_NCCL_LIB",
        default: "(unset: search)",
        meaning: "absolute path of the real libnccl.so.2 to forward to",
        parse: |c, v| text(&mut c.nccl_lib, v),
        show: |c| shown(&c.nccl_lib, "(unset: search)"),
    },
    Setting {
        name: "STRAGGLAR_BUFFER_BYTES",
        default: "256M",
        meaning: "largest AllReduce StragglAR takes (K/M/G); larger ones stay on NCCL (the host engine and bench run them in segments)",
        parse: |c, v| match parse_bytes(v) {
            Some(bytes) if bytes >= 4096 && bytes <= usize::MAX as u64 => {
                c.buffer_bytes = bytes as usize;
                true
            }
            _ => false,
        },
        show: |c| c.buffer_bytes.to_string(),
    },
    Setting {
        name: "STRAGGLAR_MIN_BYTES",
        default: "64K",
        meaning: "smaller AllReduce calls stay on NCCL (provisional until measured on GPUs)",
        parse: |c, v| match parse_bytes(v) {
            Some(bytes) if bytes <= usize::MAX as u64 => {
                c.min_bytes = bytes as usize;
                true
            }
            _ => false,
        },
        show: |c| c.min_bytes.to_string(),
    },
    Setting {
        name: "STRAGGLAR_STAGING_CAP",
        default: "4G",
        meaning: "most GPU-engine staging per device, over all communicators (K/M/G); beyond it a setup refuses and arenas stop growing",
        parse: |c, v| match parse_bytes(v) {
            Some(bytes) => {
                c.staging_cap = bytes;
                true
            }
            None => false,
        },
        show: |c| c.staging_cap.to_string(),
    },
    Setting {
        name: "STRAGGLAR_TIMEOUT_MS",
        default: "(unset: no deadline)",
        meaning: "give up a wait on peers after this many ms (as NCCL, none by default)",
        parse: |c, v| match v.parse::<u64>() {
            Ok(ms) => {
                c.timeout_ms = (ms > 0).then_some(ms);
                true
            }
            Err(_) => false,
        },
        show: |c| {
            c.timeout_ms
                .map_or_else(|| "(unset: no deadline)".into(), |ms| ms.to_string())
        },
    },
    Setting {
        name: "STRAGGLAR_GPU_ENGINE",
        default: "0",
        meaning: "1 runs eligible AllReduce calls on the GPU engine (experimental: not yet run on several GPUs)",
        parse: |c, v| switch(&mut c.gpu_engine, v),
        show: |c| u8::from(c.gpu_engine).to_string(),
    },
    Setting {
        name: "STRAGGLAR_MULTICAST",
        default: "0",
        meaning: "1 lets the GPU engine finish StragglAR with one NVLink multicast where every GPU has it, chosen per size class against the point-to-point finish; always finishes every StragglAR call so (experimental: not yet run on an NVSwitch server)",
        parse: |c, v| match MulticastMode::parse(v) {
            Some(mode) => {
                c.multicast = mode;
                true
            }
            None => false,
        },
        show: |c| c.multicast.to_string(),
    },
    Setting {
        name: "STRAGGLAR_MULTICAST_OBJECTS",
        default: "16",
        meaning: "the most NVLink multicast objects the GPU engine holds at once on this host, over every process of this user (one per communicator with a multicast team; at most 1024); the switch's others stay NCCL's NVLS's (an HGX H100/H200 switch has 128, as NCCL's users report)",
        parse: |c, v| match v.parse::<usize>() {
            Ok(n) if n <= MAX_MULTICAST_OBJECTS => {
                c.multicast_objects = n;
                true
            }
            _ => false,
        },
        show: |c| c.multicast_objects.to_string(),
    },
    Setting {
        name: "STRAGGLAR_GRAPH_NCCL",
        default: "1",
        meaning: "1 lets CUDA graph replays of the GPU engine choose between StragglAR and NCCL's own captured work, behind a conditional node (CUDA 12.3 drivers on; such a graph cannot be nested as a child graph); 0 chooses between StragglAR and our Ring, as older drivers do",
        parse: |c, v| switch(&mut c.graph_nccl, v),
        show: |c| u8::from(c.graph_nccl).to_string(),
    },
    Setting {
        name: "STRAGGLAR_TEST_SHARED_GPU",
        default: "0",
        meaning: "for tests only: 1 lets the ranks of a communicator share one GPU on the GPU engine (its grid then sized so that every rank's blocks stay resident), as a one-GPU machine's checks need; a job's ranks need a GPU each; the same on every rank",
        parse: |c, v| switch(&mut c.shared_gpu, v),
        show: |c| u8::from(c.shared_gpu).to_string(),
    },
    Setting {
        name: "STRAGGLAR_ALGO",
        default: "auto",
        meaning: "auto (StragglAR when a straggler is designated and the model says it wins), stragglar, or nccl",
        parse: |c, v| {
            c.algo = match v {
                "auto" => AlgoMode::Auto,
                "stragglar" => AlgoMode::Stragglar,
                "nccl" => AlgoMode::Baseline,
                _ => return false,
            };
            true
        },
        show: |c| {
            match c.algo {
                AlgoMode::Auto => "auto",
                AlgoMode::Stragglar => "stragglar",
                AlgoMode::Baseline => "nccl",
            }
            .to_string()
        },
    },
    Setting {
        name: "STRAGGLAR_STRAGGLER",
        default: "auto",
        meaning: "auto (detected), off, or a rank of the communicator (fixes the summation order)",
        parse: |c, v| {
            c.straggler = match v {
                "auto" => StragglerMode::Auto,
                "off" => StragglerMode::Off,
                rank => match rank.parse::<usize>() {
                    Ok(r) => StragglerMode::Fixed(r),
                    Err(_) => return false,
                },
            };
            true
        },
        show: |c| match c.straggler {
            StragglerMode::Auto => "auto".to_string(),
            StragglerMode::Off => "off".to_string(),
            StragglerMode::Fixed(r) => r.to_string(),
        },
    },
    Setting {
        name: "STRAGGLAR_PIPELINE",
        default: "1",
        meaning: "pieces per chunk of StragglAR's calls on the GPU engine (1: the plain schedule, up to 64), or auto (per size class, the model's best, refined by measurement); the same on every rank",
        parse: |c, v| match Pipeline::parse(v) {
            Some(pipeline) => {
                c.pipeline = pipeline;
                true
            }
            None => false,
        },
        show: |c| c.pipeline.to_string(),
    },
    Setting {
        name: "STRAGGLAR_OBSERVE",
        default: "0",
        meaning: "1 times every ncclAllReduce forwarded to NCCL, ncclReduceScatter and ncclAllGather (two events on the caller's stream, read later; a group timed as one call) and writes each rank's durations into STRAGGLAR_REPORT_DIR, for `stragglar report`",
        parse: |c, v| switch(&mut c.observe, v),
        show: |c| u8::from(c.observe).to_string(),
    },
    Setting {
        name: "STRAGGLAR_REPORT_DIR",
        default: "(unset: no records)",
        meaning: "where observe mode writes each rank's records (every STRAGGLAR_RECORD_EVERY seconds, and at destroy, or at exit for a communicator never destroyed); %h becomes the host name, %p the process id",
        parse: |c, v| text(&mut c.report_dir, v),
        show: |c| shown(&c.report_dir, "(unset: no records)"),
    },
    Setting {
        name: "STRAGGLAR_RECORD_EVERY",
        default: "60",
        meaning: "seconds between observe mode's writes of each rank's calls so far into STRAGGLAR_REPORT_DIR, by a thread of its own (0: only at destroy or exit); a killed process keeps what was written",
        parse: |c, v| match v.parse::<u64>() {
            Ok(s) => {
                c.record_every_s = s;
                true
            }
            Err(_) => false,
        },
        show: |c| c.record_every_s.to_string(),
    },
    Setting {
        name: "STRAGGLAR_REPORT_INTERVAL",
        default: "600",
        meaning: "seconds between AllReduce reports per communicator at INFO (0: only at destroy)",
        parse: |c, v| match v.parse::<u64>() {
            Ok(s) => {
                c.report_interval_s = s;
                true
            }
            Err(_) => false,
        },
        show: |c| c.report_interval_s.to_string(),
    },
    Setting {
        name: "STRAGGLAR_TRACE_DIR",
        default: "(unset: no traces)",
        meaning: "write per-rank Chrome trace JSON (one event per AllReduce) into this directory",
        parse: |c, v| text(&mut c.trace_dir, v),
        show: |c| shown(&c.trace_dir, "(unset: no traces)"),
    },
    Setting {
        name: "STRAGGLAR_CACHE_DIR",
        default: "(unset: ~/.cache/stragglar)",
        meaning: "compiled kernels, keyed by source hash, GPU architecture and build, read without NVRTC",
        parse: |c, v| text(&mut c.cache_dir, v),
        show: |c| {
            c.cache_dir.clone().unwrap_or_else(|| {
                crate::gpu::nvrtc::default_cache_dir(None).map_or_else(
                    || "(unset: no cache)".into(),
                    |d| format!("(unset: {})", d.display()),
                )
            })
        },
    },
    Setting {
        name: "STRAGGLAR_DEBUG",
        default: "WARN",
        meaning: "log level: WARN, INFO or TRACE",
        parse: |c, v| match Level::parse(v) {
            Some(level) => {
                c.log_level = level;
                true
            }
            None => false,
        },
        show: |c| c.log_level.name().to_string(),
    },
    Setting {
        name: "STRAGGLAR_DEBUG_FILE",
        default: "(unset: stderr)",
        meaning: "log file; %h becomes the host name, %p the process id",
        parse: |c, v| text(&mut c.log_file, v),
        show: |c| shown(&c.log_file, "(unset: stderr)"),
    },
];

/// Default of `STRAGGLAR_BUFFER_BYTES`: 256 MiB, which holds a DDP bucket (25 MiB) or a
/// tensor-parallel activation (64-80 MiB) whole, twice over.
pub const DEFAULT_BUFFER_BYTES: usize = 256 << 20;

/// Default of `STRAGGLAR_MIN_BYTES`: 64 KiB. Not from the model, which predicts StragglAR
/// winning at every size once the straggler's lead passes the break-even (about 3 us at 8 ranks
/// on NVSwitch) because it leaves out the fixed costs of a call: our launches and flag
/// handshakes against NCCL's small-message protocol. Provisional: to be set from
/// `stragglar bench --backend cuda` on multi-GPU hardware.
pub const DEFAULT_MIN_BYTES: usize = 64 << 10;

/// Default of `STRAGGLAR_STAGING_CAP`: 4 GiB per device, room for the staging of four 8-rank
/// communicators at the default `STRAGGLAR_BUFFER_BYTES` (878 MiB each: a data-parallel group
/// and tensor-parallel ones), 5% of an 80 GB GPU.
pub const DEFAULT_STAGING_CAP: u64 = 4 << 30;

/// Default of `STRAGGLAR_MULTICAST_OBJECTS`: 16 on a host, one per communicator with a team (a
/// job's tensor-, data- and context-parallel groups of 8 GPUs need a handful), leaving 112 of an
/// HGX H100/H200 switch's 128 (as NCCL's users report) to NCCL's NVLS.
pub const DEFAULT_MULTICAST_OBJECTS: usize = 16;

/// The largest `STRAGGLAR_MULTICAST_OBJECTS` taken: a GB200 NVL72 rack's switches have about
/// 1024 (as reported), and every slot is a file the count visits.
pub const MAX_MULTICAST_OBJECTS: usize = 1024;

/// The effective configuration of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `STRAGGLAR_ENABLE`: false makes every export a pure forwarder.
    pub enabled: bool,
    /// `STRAGGLAR_NCCL_LIB`: the real library's absolute path, if given.
    pub nccl_lib: Option<String>,
    /// `STRAGGLAR_BUFFER_BYTES`: staging bytes per rank and call parity.
    pub buffer_bytes: usize,
    /// `STRAGGLAR_MIN_BYTES`: AllReduce calls below this many bytes stay on NCCL.
    pub min_bytes: usize,
    /// `STRAGGLAR_STAGING_CAP`: staging bytes the GPU engine may hold per device.
    pub staging_cap: u64,
    /// NCCL's own `NCCL_P2P_DISABLE` (set and not 0): peer-to-peer transfers are forbidden.
    pub p2p_disabled: bool,
    /// `STRAGGLAR_TIMEOUT_MS`: deadline of a wait on peers; `None` waits forever.
    pub timeout_ms: Option<u64>,
    /// `STRAGGLAR_GPU_ENGINE`: whether eligible calls run on the GPU engine.
    pub gpu_engine: bool,
    /// `STRAGGLAR_MULTICAST`: whether the GPU engine forms a multicast team at setup, and how
    /// its StragglAR calls choose to finish by multicast on it.
    pub multicast: MulticastMode,
    /// `STRAGGLAR_MULTICAST_OBJECTS`: multicast objects the GPU engine may hold at once on this
    /// host, over every process of the user.
    pub multicast_objects: usize,
    /// `STRAGGLAR_GRAPH_NCCL`: whether graph replays may take NCCL's own captured work as their
    /// baseline, behind a conditional node (where every rank's driver has them).
    pub graph_nccl: bool,
    /// `STRAGGLAR_TEST_SHARED_GPU` (tests only): the ranks of a communicator may share a GPU
    /// on the GPU engine.
    pub shared_gpu: bool,
    /// `STRAGGLAR_ALGO`.
    pub algo: AlgoMode,
    /// `STRAGGLAR_STRAGGLER`.
    pub straggler: StragglerMode,
    /// `STRAGGLAR_PIPELINE`: pieces per chunk of StragglAR's calls, or `auto`.
    pub pipeline: Pipeline,
    /// `STRAGGLAR_OBSERVE`: time forwarded AllReduce calls for the straggler report.
    pub observe: bool,
    /// `STRAGGLAR_REPORT_DIR`, with `%h` and `%p` still unexpanded.
    pub report_dir: Option<String>,
    /// `STRAGGLAR_RECORD_EVERY` in seconds; 0 writes records only at destroy or exit.
    pub record_every_s: u64,
    /// `STRAGGLAR_REPORT_INTERVAL` in seconds; 0 reports only at destroy.
    pub report_interval_s: u64,
    /// `STRAGGLAR_TRACE_DIR`, if given.
    pub trace_dir: Option<String>,
    /// `STRAGGLAR_CACHE_DIR`: where compiled kernels are kept, if given.
    pub cache_dir: Option<String>,
    /// `STRAGGLAR_DEBUG`.
    pub log_level: Level,
    /// `STRAGGLAR_DEBUG_FILE`, with `%h` and `%p` still unexpanded.
    pub log_file: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            enabled: true,
            nccl_lib: None,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            min_bytes: DEFAULT_MIN_BYTES,
            staging_cap: DEFAULT_STAGING_CAP,
            p2p_disabled: false,
            timeout_ms: None,
            gpu_engine: false,
            multicast: MulticastMode::Off,
            multicast_objects: DEFAULT_MULTICAST_OBJECTS,
            graph_nccl: true,
            shared_gpu: false,
            algo: AlgoMode::Auto,
            straggler: StragglerMode::Auto,
            pipeline: Pipeline::Pieces(1),
            observe: false,
            report_dir: None,
            record_every_s: 60,
            report_interval_s: 600,
            trace_dir: None,
            cache_dir: None,
            log_level: Level::Warn,
            log_file: None,
        }
    }
}

/// Something worth saying about the environment, logged once the logger exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A variable was set and accepted.
    Set { name: &'static str, value: String },
    /// A variable had a value we cannot use; the default applies.
    Invalid {
        name: &'static str,
        value: String,
        default: &'static str,
    },
}

impl Config {
    /// Reads every setting through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<Notice>) {
        let mut config = Config::default();
        let mut notices = Vec::new();
        for setting in SETTINGS {
            let Some(value) = lookup(setting.name) else {
                continue;
            };
            // A value it cannot use leaves the default in place.
            let mut read = config.clone();
            if (setting.parse)(&mut read, value.trim()) {
                config = read;
                notices.push(Notice::Set {
                    name: setting.name,
                    value,
                });
            } else {
                notices.push(Notice::Invalid {
                    name: setting.name,
                    value,
                    default: setting.default,
                });
            }
        }
        config.p2p_disabled =
            lookup("NCCL_P2P_DISABLE").is_some_and(|v| !matches!(v.trim(), "" | "0"));
        (config, notices)
    }

    /// `(variable, effective value)` for every setting, in [`SETTINGS`] order.
    pub fn effective(&self) -> Vec<(&'static str, String)> {
        SETTINGS.iter().map(|s| (s.name, (s.show)(self))).collect()
    }
}

static CONFIG: OnceCell<Config> = OnceCell::new();

/// The process configuration. The first call reads the environment, installs the logger and
/// logs one line per variable set (INFO) or rejected (WARN).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(|| {
        let (config, notices) = Config::from_lookup(|name| std::env::var(name).ok());
        logging::install(config.log_level, config.log_file.as_deref());
        for notice in notices {
            match notice {
                Notice::Set { name, value } => log::info!("{name} set by environment to {value}"),
                Notice::Invalid {
                    name,
                    value,
                    default,
                } => {
                    log::warn!("{name} has an invalid value '{value}'; using the default {default}")
                }
            }
        }
        config
    })
}

/// Parses a byte size with nccl-tests' suffixes: K, M, G, T (powers of 1024), an optional
/// `B`; `None` for anything else or a size beyond `u64`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(1u64 << shift))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> (Config, Vec<Notice>) {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let (config, notices) = parse(&[]);
        assert_eq!(config, Config::default());
        assert!(notices.is_empty());
    }

    #[test]
    fn values_are_read_and_echoed() {
        let (config, notices) = parse(&[
            ("STRAGGLAR_ENABLE", "0"),
            ("STRAGGLAR_DEBUG", "info"),
            ("STRAGGLAR_NCCL_LIB", "/x/libnccl.so.2"),
            ("STRAGGLAR_DEBUG_FILE", "/tmp/s.%h.%p"),
            ("STRAGGLAR_BUFFER_BYTES", "64M"),
            ("STRAGGLAR_TIMEOUT_MS", "1500"),
            ("STRAGGLAR_STAGING_CAP", "1G"),
        ]);
        assert_eq!(config.buffer_bytes, 64 << 20);
        assert_eq!(config.staging_cap, 1 << 30);
        assert_eq!(config.timeout_ms, Some(1500));
        assert!(!config.enabled);
        assert_eq!(config.log_level, Level::Info);
        assert_eq!(config.nccl_lib.as_deref(), Some("/x/libnccl.so.2"));
        assert_eq!(config.log_file.as_deref(), Some("/tmp/s.%h.%p"));
        assert_eq!(notices.len(), 7);
        assert!(notices.iter().all(|n| matches!(n, Notice::Set { .. })));
    }

    #[test]
    fn bad_values_fall_back_with_a_notice() {
        let (config, notices) = parse(&[
            ("STRAGGLAR_ENABLE", "yes"),
            ("STRAGGLAR_DEBUG", "LOUD"),
            ("STRAGGLAR_BUFFER_BYTES", "12"),
        ]);
        assert_eq!(config.buffer_bytes, DEFAULT_BUFFER_BYTES);
        assert!(config.enabled);
        assert_eq!(config.log_level, Level::Warn);
        assert_eq!(
            notices,
            vec![
                Notice::Invalid {
                    name: "STRAGGLAR_ENABLE",
                    value: "yes".into(),
                    default: "1"
                },
                Notice::Invalid {
                    name: "STRAGGLAR_BUFFER_BYTES",
                    value: "12".into(),
                    default: "256M"
                },
                Notice::Invalid {
                    name: "STRAGGLAR_DEBUG",
                    value: "LOUD".into(),
                    default: "WARN"
                },
            ]
        );
    }

    #[test]
    fn multicast_objects_above_the_largest_pool_fall_back() {
        let (config, notices) = parse(&[("STRAGGLAR_MULTICAST_OBJECTS", "1025")]);
        assert_eq!(config.multicast_objects, DEFAULT_MULTICAST_OBJECTS);
        assert_eq!(
            notices,
            vec![Notice::Invalid {
                name: "STRAGGLAR_MULTICAST_OBJECTS",
                value: "1025".into(),
                default: "16"
            }]
        );
        let (config, _) = parse(&[("STRAGGLAR_MULTICAST_OBJECTS", "1024")]);
        assert_eq!(config.multicast_objects, MAX_MULTICAST_OBJECTS);
    }

    #[test]
    fn every_shown_value_reads_back() {
        let (config, notices) = parse(&[
            ("STRAGGLAR_ENABLE", "0"),
            ("STRAGGLAR_NCCL_LIB", "/x/libnccl.so.2"),
            ("STRAGGLAR_BUFFER_BYTES", "64M"),
            ("STRAGGLAR_MIN_BYTES", "1K"),
            ("STRAGGLAR_STAGING_CAP", "1G"),
            ("STRAGGLAR_TIMEOUT_MS", "1500"),
            ("STRAGGLAR_GPU_ENGINE", "1"),
            ("STRAGGLAR_MULTICAST", "1"),
            ("STRAGGLAR_MULTICAST_OBJECTS", "3"),
            ("STRAGGLAR_GRAPH_NCCL", "0"),
            ("STRAGGLAR_TEST_SHARED_GPU", "1"),
            ("STRAGGLAR_ALGO", "nccl"),
            ("STRAGGLAR_STRAGGLER", "3"),
            ("STRAGGLAR_PIPELINE", "auto"),
            ("STRAGGLAR_OBSERVE", "1"),
            ("STRAGGLAR_REPORT_DIR", "/r/%h"),
            ("STRAGGLAR_RECORD_EVERY", "5"),
            ("STRAGGLAR_REPORT_INTERVAL", "0"),
            ("STRAGGLAR_TRACE_DIR", "/t"),
            ("STRAGGLAR_CACHE_DIR", "/c"),
            ("STRAGGLAR_DEBUG", "TRACE"),
            ("STRAGGLAR_DEBUG_FILE", "/l.%p"),
        ]);
        assert_eq!(
            notices.len(),
            SETTINGS.len(),
            "every setting set: {notices:?}"
        );
        assert!(notices.iter().all(|n| matches!(n, Notice::Set { .. })));
        for setting in SETTINGS {
            let shown = (setting.show)(&config);
            let mut again = Config::default();
            assert!(
                (setting.parse)(&mut again, &shown),
                "{}: {shown}",
                setting.name
            );
            assert_eq!((setting.show)(&again), shown, "{}", setting.name);
            assert_ne!(
                (setting.show)(&Config::default()),
                shown,
                "{}: the test sets a value other than the default",
                setting.name
            );
        }
        // A value it cannot use changes nothing.
        let mut unchanged = config.clone();
        assert!(!(SETTINGS[0].parse)(&mut unchanged, "maybe"));
        assert_eq!(unchanged, config);
        let (always, _) = parse(&[("STRAGGLAR_MULTICAST", "always")]);
        assert_eq!(always.multicast, MulticastMode::Always);
        let (bad, notices) = parse(&[("STRAGGLAR_MULTICAST", "yes")]);
        assert_eq!(bad.multicast, MulticastMode::Off);
        assert!(!notices.iter().any(|n| matches!(n, Notice::Set { .. })));
    }

    #[test]
    fn every_setting_is_documented_and_reported() {
        let names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        let reported: Vec<&str> = Config::default()
            .effective()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, reported);
    }
}

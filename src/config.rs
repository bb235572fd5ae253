//! `STRAGGLAR_*` settings: read once from the environment, echoed at INFO, bad values warned
//! about and replaced by their defaults.
//!
//! Every setting is listed in [`SETTINGS`], which `stragglar doctor` and the README follow.

use once_cell::sync::OnceCell;

use crate::detect::pipeline::Pipeline;
use crate::detect::policy::{AlgoMode, StragglerMode};
use crate::logging::{self, Level};

/// Documentation of one setting: its variable, default and meaning.
pub struct SettingDoc {
    /// The environment variable.
    pub name: &'static str,
    /// The default, as a person would write it.
    pub default: &'static str,
    /// What it does, in one line.
    pub meaning: &'static str,
}

/// Every `STRAGGLAR_*` variable the library reads.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        name: "STRAGGLAR_ENABLE",
        default: "1",
        meaning: "0 makes the library a pure forwarder to the real NCCL",
    },
    SettingDoc {
        name: "STRAGGLAR_NCCL_LIB",
        default: "(unset: search)",
        meaning: "absolute path of the real libnccl.so.2 to forward to",
    },
    SettingDoc {
        name: "STRAGGLAR_BUFFER_BYTES",
        default: "256M",
        meaning: "largest AllReduce StragglAR takes (K/M/G); larger ones stay on NCCL (the host engine and bench run them in segments)",
    },
    SettingDoc {
        name: "STRAGGLAR_MIN_BYTES",
        default: "64K",
        meaning: "smaller AllReduce calls stay on NCCL (provisional until measured on GPUs)",
    },
    SettingDoc {
        name: "STRAGGLAR_STAGING_CAP",
        default: "4G",
        meaning: "most GPU-engine staging per device, over all communicators (K/M/G); beyond it setup refuses",
    },
    SettingDoc {
        name: "STRAGGLAR_TIMEOUT_MS",
        default: "(unset: no deadline)",
        meaning: "give up a wait on peers after this many ms (as NCCL, none by default)",
    },
    SettingDoc {
        name: "STRAGGLAR_GPU_ENGINE",
        default: "0",
        meaning: "1 runs eligible AllReduce calls on the GPU engine (experimental: not yet run on several GPUs)",
    },
    SettingDoc {
        name: "STRAGGLAR_ALGO",
        default: "auto",
        meaning: "auto (StragglAR when a straggler is designated and the model says it wins), stragglar, or nccl",
    },
    SettingDoc {
        name: "STRAGGLAR_STRAGGLER",
        default: "auto",
        meaning: "auto (detected), off, or a rank of the communicator (fixes the summation order)",
    },
    SettingDoc {
        name: "STRAGGLAR_PIPELINE",
        default: "1",
        meaning: "pieces per chunk of StragglAR's calls on the GPU engine (1: the plain schedule, up to 64), or auto (per size class, the model's best, refined by measurement); the same on every rank",
    },
    SettingDoc {
        name: "STRAGGLAR_REPORT_INTERVAL",
        default: "600",
        meaning: "seconds between AllReduce reports per communicator at INFO (0: only at destroy)",
    },
    SettingDoc {
        name: "STRAGGLAR_TRACE_DIR",
        default: "(unset: no traces)",
        meaning: "write per-rank Chrome trace JSON (one event per AllReduce) into this directory",
    },
    SettingDoc {
        name: "STRAGGLAR_CACHE_DIR",
        default: "(unset: ~/.cache/stragglar)",
        meaning: "compiled kernels, keyed by source hash, GPU architecture and build, read without NVRTC",
    },
    SettingDoc {
        name: "STRAGGLAR_DEBUG",
        default: "WARN",
        meaning: "log level: WARN, INFO or TRACE",
    },
    SettingDoc {
        name: "STRAGGLAR_DEBUG_FILE",
        default: "(unset: stderr)",
        meaning: "log file; %h becomes the host name, %p the process id",
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
    /// `STRAGGLAR_ALGO`.
    pub algo: AlgoMode,
    /// `STRAGGLAR_STRAGGLER`.
    pub straggler: StragglerMode,
    /// `STRAGGLAR_PIPELINE`: pieces per chunk of StragglAR's calls, or `auto`.
    pub pipeline: Pipeline,
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
            algo: AlgoMode::Auto,
            straggler: StragglerMode::Auto,
            pipeline: Pipeline::Pieces(1),
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
        let mut read =
            |name: &'static str, default: &'static str, accept: &mut dyn FnMut(&str) -> bool| {
                if let Some(value) = lookup(name) {
                    if accept(value.trim()) {
                        notices.push(Notice::Set { name, value });
                    } else {
                        notices.push(Notice::Invalid {
                            name,
                            value,
                            default,
                        });
                    }
                }
            };
        read("STRAGGLAR_ENABLE", "1", &mut |v| match v {
            "0" => {
                config.enabled = false;
                true
            }
            "1" => true,
            _ => false,
        });
        read("STRAGGLAR_NCCL_LIB", "(unset)", &mut |v| {
            config.nccl_lib = (!v.is_empty()).then(|| v.to_string());
            !v.is_empty()
        });
        read(
            "STRAGGLAR_BUFFER_BYTES",
            "256M",
            &mut |v| match parse_bytes(v) {
                Some(bytes) if bytes >= 4096 && bytes <= usize::MAX as u64 => {
                    config.buffer_bytes = bytes as usize;
                    true
                }
                _ => false,
            },
        );
        read(
            "STRAGGLAR_MIN_BYTES",
            "64K",
            &mut |v| match parse_bytes(v) {
                Some(bytes) if bytes <= usize::MAX as u64 => {
                    config.min_bytes = bytes as usize;
                    true
                }
                _ => false,
            },
        );
        read(
            "STRAGGLAR_STAGING_CAP",
            "4G",
            &mut |v| match parse_bytes(v) {
                Some(bytes) => {
                    config.staging_cap = bytes;
                    true
                }
                None => false,
            },
        );
        config.p2p_disabled =
            lookup("NCCL_P2P_DISABLE").is_some_and(|v| !matches!(v.trim(), "" | "0"));
        read(
            "STRAGGLAR_TIMEOUT_MS",
            "(unset)",
            &mut |v| match v.parse::<u64>() {
                Ok(0) => {
                    config.timeout_ms = None;
                    true
                }
                Ok(ms) => {
                    config.timeout_ms = Some(ms);
                    true
                }
                Err(_) => false,
            },
        );
        read("STRAGGLAR_GPU_ENGINE", "0", &mut |v| match v {
            "0" => true,
            "1" => {
                config.gpu_engine = true;
                true
            }
            _ => false,
        });
        read("STRAGGLAR_ALGO", "auto", &mut |v| match v {
            "auto" => true,
            "stragglar" => {
                config.algo = AlgoMode::Stragglar;
                true
            }
            "nccl" => {
                config.algo = AlgoMode::Baseline;
                true
            }
            _ => false,
        });
        read("STRAGGLAR_STRAGGLER", "auto", &mut |v| match v {
            "auto" => true,
            "off" => {
                config.straggler = StragglerMode::Off;
                true
            }
            rank => match rank.parse::<usize>() {
                Ok(r) => {
                    config.straggler = StragglerMode::Fixed(r);
                    true
                }
                Err(_) => false,
            },
        });
        read(
            "STRAGGLAR_PIPELINE",
            "1",
            &mut |v| match Pipeline::parse(v) {
                Some(pipeline) => {
                    config.pipeline = pipeline;
                    true
                }
                None => false,
            },
        );
        read(
            "STRAGGLAR_REPORT_INTERVAL",
            "600",
            &mut |v| match v.parse::<u64>() {
                Ok(s) => {
                    config.report_interval_s = s;
                    true
                }
                Err(_) => false,
            },
        );
        read("STRAGGLAR_TRACE_DIR", "(unset)", &mut |v| {
            config.trace_dir = (!v.is_empty()).then(|| v.to_string());
            !v.is_empty()
        });
        read("STRAGGLAR_CACHE_DIR", "(unset)", &mut |v| {
            config.cache_dir = (!v.is_empty()).then(|| v.to_string());
            !v.is_empty()
        });
        read("STRAGGLAR_DEBUG", "WARN", &mut |v| match Level::parse(v) {
            Some(level) => {
                config.log_level = level;
                true
            }
            None => false,
        });
        read("STRAGGLAR_DEBUG_FILE", "(unset)", &mut |v| {
            config.log_file = (!v.is_empty()).then(|| v.to_string());
            !v.is_empty()
        });
        (config, notices)
    }

    /// `(variable, effective value)` for every setting, in [`SETTINGS`] order.
    pub fn effective(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "STRAGGLAR_ENABLE",
                if self.enabled { "1" } else { "0" }.to_string(),
            ),
            (
                "STRAGGLAR_NCCL_LIB",
                self.nccl_lib
                    .clone()
                    .unwrap_or_else(|| "(unset: search)".into()),
            ),
            ("STRAGGLAR_BUFFER_BYTES", self.buffer_bytes.to_string()),
            ("STRAGGLAR_MIN_BYTES", self.min_bytes.to_string()),
            ("STRAGGLAR_STAGING_CAP", self.staging_cap.to_string()),
            (
                "STRAGGLAR_TIMEOUT_MS",
                self.timeout_ms
                    .map_or_else(|| "(unset: no deadline)".into(), |ms| ms.to_string()),
            ),
            (
                "STRAGGLAR_GPU_ENGINE",
                if self.gpu_engine { "1" } else { "0" }.to_string(),
            ),
            (
                "STRAGGLAR_ALGO",
                match self.algo {
                    AlgoMode::Auto => "auto",
                    AlgoMode::Stragglar => "stragglar",
                    AlgoMode::Baseline => "nccl",
                }
                .to_string(),
            ),
            (
                "STRAGGLAR_STRAGGLER",
                match self.straggler {
                    StragglerMode::Auto => "auto".to_string(),
                    StragglerMode::Off => "off".to_string(),
                    StragglerMode::Fixed(r) => r.to_string(),
                },
            ),
            ("STRAGGLAR_PIPELINE", self.pipeline.to_string()),
            (
                "STRAGGLAR_REPORT_INTERVAL",
                self.report_interval_s.to_string(),
            ),
            (
                "STRAGGLAR_TRACE_DIR",
                self.trace_dir
                    .clone()
                    .unwrap_or_else(|| "(unset: no traces)".into()),
            ),
            (
                "STRAGGLAR_CACHE_DIR",
                self.cache_dir.clone().unwrap_or_else(|| {
                    crate::gpu::nvrtc::default_cache_dir(None).map_or_else(
                        || "(unset: no cache)".into(),
                        |d| format!("(unset: {})", d.display()),
                    )
                }),
            ),
            ("STRAGGLAR_DEBUG", self.log_level.name().to_string()),
            (
                "STRAGGLAR_DEBUG_FILE",
                self.log_file
                    .clone()
                    .unwrap_or_else(|| "(unset: stderr)".into()),
            ),
        ]
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

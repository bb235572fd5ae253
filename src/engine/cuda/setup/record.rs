//! The setup as data: what each rank contributes to the first all-gather (its record: host
//! identity, device, configuration, the staging's IPC handle and layout), and the verdict every
//! rank computes from the gathered records. The verdict depends only on them, which are
//! identical on every rank, so all ranks agree on whether StragglAR may run.

use crate::engine::cuda::staging::StagingLayout;

/// `SetupRecord::magic`: "SGSU".
pub const SETUP_MAGIC: u32 = 0x5347_5355;
/// `SetupRecord::version` of this layout.
pub const SETUP_VERSION: u32 = 6;

/// Bytes each rank contributes to the first all-gather: its record, zero-padded. Fixed across
/// versions (magic and version first), so ranks of builds whose records differ still gather
/// the same count and meet as `Verdict::Incompatible` instead of mismatching NCCL's counts.
pub const SETUP_RECORD_BYTES: usize = 512;

/// This build's identity (`SetupRecord::build`): the hash of its sources, which build.rs
/// computes. Two builds may lower different plans for one call, so their ranks must not meet.
pub fn build_id() -> u64 {
    u64::from_str_radix(env!("STRAGGLAR_SOURCE_HASH"), 16).unwrap_or(0)
}

/// The settings whose values must agree on every rank (a rank that disagrees would take
/// another path and hang the job), in the order of `SetupRecord::settings`.
pub const AGREED_SETTINGS: [&str; SETTINGS] = [
    "STRAGGLAR_ENABLE",
    "STRAGGLAR_BUFFER_BYTES",
    "STRAGGLAR_MIN_BYTES",
    "NCCL_P2P_DISABLE",
    "STRAGGLAR_ALGO",
    "STRAGGLAR_STRAGGLER",
    "STRAGGLAR_GPU_ENGINE",
    "STRAGGLAR_PIPELINE",
    "STRAGGLAR_MULTICAST",
    "STRAGGLAR_TEST_SHARED_GPU",
];

/// How many settings must agree (the length of `SetupRecord::settings`).
pub const SETTINGS: usize = 10;

/// Why a rank could not take part (0 in `SetupRecord::failure` means it could).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum LocalFailure {
    /// No usable CUDA driver or GPU.
    NoGpu = 1,
    /// NVRTC missing or the kernels did not compile.
    NoKernels = 2,
    /// The staging allocation failed or exceeds the per-device cap.
    NoMemory = 3,
    /// `cuIpcGetMemHandle` failed.
    NoIpc = 4,
    /// The driver could not say whether the caller's stream captures.
    NoStreamState = 5,
    /// The GPU has too few multiprocessors for every rank sharing it to keep its grid
    /// resident (`STRAGGLAR_TEST_SHARED_GPU`).
    TooFewMultiprocessors = 6,
}

impl LocalFailure {
    /// What a record's failure code says, for the log.
    pub fn describe(code: u32) -> &'static str {
        match code {
            1 => "no usable GPU",
            2 => "no kernels (NVRTC missing, or they did not compile)",
            3 => "no staging (the allocation failed or exceeds STRAGGLAR_STAGING_CAP)",
            4 => "cuIpcGetMemHandle failed",
            5 => "the driver could not say whether its stream captures",
            6 => "too few multiprocessors for the ranks sharing its GPU to stay resident",
            _ => "a failure this build does not know",
        }
    }
}

/// One rank's contribution to the first all-gather: plain bytes (gathered as `ncclUint8`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupRecord {
    pub magic: u32,
    pub version: u32,
    pub rank: u32,
    pub ranks: u32,
    /// 0, or a [`LocalFailure`].
    pub failure: u32,
    /// 1 when NCCL would run NVLS for AllReduce on this rank (`super::nvls`), else 0.
    pub nvls: u32,
    /// The host name (truncated, NUL-padded).
    pub host: [u8; 64],
    /// `/proc/sys/kernel/random/boot_id` (36 characters, NUL-padded): two containers on one
    /// host share it, two hosts never do.
    pub boot_id: [u8; 40],
    /// The GPU's UUID.
    pub device_uuid: [u8; 16],
    /// A hash of each of [`AGREED_SETTINGS`]' effective values.
    pub settings: [u64; SETTINGS],
    /// The staging allocation's IPC handle.
    pub staging_handle: [u8; 64],
    /// The staging layout: arena bytes, values, blocks.
    pub layout: [u64; 3],
    /// The writer's [`build_id`].
    pub build: u64,
    /// The name of the shared memory holding the writer's failure word (NUL-padded; empty in
    /// a failed record), which its peers map (`crate::engine::cuda::failure`).
    pub failure_word: [u8; 48],
    /// 1 when this rank can put NCCL's captured work behind a conditional node
    /// (`crate::engine::cuda::branch`), else 0: graph replays take NCCL as their baseline
    /// only where every rank can.
    pub branch: u32,
}

/// Why the communicator stays on NCCL, the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every rank is ready: StragglAR may run.
    Eligible,
    /// A record is not one this build wrote (another stragglar build on some rank).
    Incompatible { rank: usize },
    /// A rank could not take part.
    RankFailed { rank: usize, failure: u32 },
    /// Ranks on different hosts (CUDA IPC is within one host).
    SeveralHosts { first: usize, other: usize },
    /// Two ranks on the same GPU.
    SharedDevice { first: usize, other: usize },
    /// A setting differs between rank 0 and `rank`.
    SettingDiffers { rank: usize, setting: &'static str },
    /// The staging layouts differ (they follow from the settings and the world size).
    LayoutDiffers { rank: usize },
    /// A rank could not read or write some peer's staging through IPC.
    PeerAccessFailed { rank: usize },
}

impl Verdict {
    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Eligible => "every rank is ready".into(),
            Verdict::Incompatible { rank } => {
                format!("rank {rank} runs another build of stragglar")
            }
            Verdict::RankFailed { rank, failure } => {
                format!(
                    "rank {rank} could not set up: {} (failure {failure})",
                    LocalFailure::describe(*failure)
                )
            }
            Verdict::SeveralHosts { first, other } => {
                format!("ranks {first} and {other} are on different hosts")
            }
            Verdict::SharedDevice { first, other } => {
                format!("ranks {first} and {other} share one GPU (a job's ranks need a GPU each; STRAGGLAR_TEST_SHARED_GPU=1 lets tests share one)")
            }
            Verdict::SettingDiffers { rank, setting } => {
                format!("{setting} differs between rank 0 and rank {rank}")
            }
            Verdict::LayoutDiffers { rank } => {
                format!("rank {rank} sized its staging differently")
            }
            Verdict::PeerAccessFailed { rank } => {
                format!("rank {rank} could not reach every peer's staging through CUDA IPC, or its GPU's own loads and atomics did not")
            }
        }
    }
}

/// `text` truncated into a NUL-padded field.
pub fn field<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let bytes = text.as_bytes();
    let n = bytes.len().min(N);
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

/// FNV-1a of a setting's effective value.
pub fn setting_hash(value: &str) -> u64 {
    value.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Where a rank runs: its host and its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub host: String,
    pub boot_id: String,
    pub device_uuid: [u8; 16],
}

impl Identity {
    /// This host (from /proc, which every Linux has) and the GPU with `device_uuid`.
    pub fn this_host(device_uuid: [u8; 16]) -> Identity {
        let read = |path: &str| {
            std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        Identity {
            host: read("/proc/sys/kernel/hostname"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            device_uuid,
        }
    }
}

/// The hashes of [`AGREED_SETTINGS`]' effective values in `config`.
pub fn settings_of(config: &crate::config::Config) -> [u64; SETTINGS] {
    [
        setting_hash(if config.enabled { "1" } else { "0" }),
        setting_hash(&config.buffer_bytes.to_string()),
        setting_hash(&config.min_bytes.to_string()),
        setting_hash(if config.p2p_disabled { "1" } else { "0" }),
        setting_hash(&format!("{:?}", config.algo)),
        setting_hash(&format!("{:?}", config.straggler)),
        setting_hash(if config.gpu_engine { "1" } else { "0" }),
        setting_hash(&config.pipeline.to_string()),
        setting_hash(&config.multicast.to_string()),
        setting_hash(if config.shared_gpu { "1" } else { "0" }),
    ]
}

impl SetupRecord {
    /// Who this rank is, for reports: its host name and the first 8 hex digits of its GPU's
    /// UUID (as `nvidia-smi -L` prints them).
    pub fn member(&self) -> String {
        let end = self
            .host
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.host.len());
        let host = String::from_utf8_lossy(&self.host[..end]);
        let uuid: String = self.device_uuid[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("{host} GPU-{uuid}")
    }

    /// A ready rank's record.
    pub fn ready(
        rank: usize,
        ranks: usize,
        identity: &Identity,
        settings: [u64; SETTINGS],
        staging_handle: [u8; 64],
        layout: StagingLayout,
    ) -> SetupRecord {
        SetupRecord {
            magic: SETUP_MAGIC,
            version: SETUP_VERSION,
            rank: rank as u32,
            ranks: ranks as u32,
            failure: 0,
            nvls: 0,
            host: field(&identity.host),
            boot_id: field(&identity.boot_id),
            device_uuid: identity.device_uuid,
            settings,
            staging_handle,
            layout: [layout.arena_bytes, layout.values, layout.blocks],
            build: build_id(),
            failure_word: [0; 48],
            branch: 0,
        }
    }

    /// The record of a rank that cannot take part (it still joins the all-gather, so that
    /// every rank learns it).
    pub fn failed(rank: usize, ranks: usize, failure: LocalFailure) -> SetupRecord {
        SetupRecord {
            magic: SETUP_MAGIC,
            version: SETUP_VERSION,
            rank: rank as u32,
            ranks: ranks as u32,
            failure: failure as u32,
            nvls: 0,
            host: [0; 64],
            boot_id: [0; 40],
            device_uuid: [0; 16],
            settings: [0; SETTINGS],
            staging_handle: [0; 64],
            layout: [0; 3],
            build: build_id(),
            failure_word: [0; 48],
            branch: 0,
        }
    }

    /// The same record, naming the shared memory of this rank's failure word.
    pub fn with_failure_word(mut self, name: &str) -> SetupRecord {
        self.failure_word = field(name);
        self
    }

    /// The name of the shared memory of the writer's failure word ("" if none).
    pub fn failure_word_name(&self) -> String {
        let end = self.failure_word.iter().position(|&b| b == 0).unwrap_or(48);
        String::from_utf8_lossy(&self.failure_word[..end]).into_owned()
    }

    /// The same record, stating whether this rank can put NCCL's captured work behind a
    /// conditional node.
    pub fn with_branch(mut self, branch: bool) -> SetupRecord {
        self.branch = u32::from(branch);
        self
    }

    /// The same record, stating whether NCCL would run NVLS on this rank.
    pub fn with_nvls(mut self, nvls: bool) -> SetupRecord {
        self.nvls = u32::from(nvls);
        self
    }

    /// The staging layout this rank announced.
    pub fn staging_layout(&self) -> StagingLayout {
        StagingLayout {
            arena_bytes: self.layout[0],
            values: self.layout[1],
            blocks: self.layout[2],
            ranks: self.ranks as u64,
        }
    }
}

/// Whether ranks of one communicator may share a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    /// One GPU per rank, as NCCL requires (the library).
    OnePerRank,
    /// Several ranks on one GPU (`stragglar bench --ranks-as processes` on one GPU).
    MayShare,
}

/// The verdict of the first all-gather: whether every rank may map every other's staging.
pub fn verdict(records: &[SetupRecord], devices: Devices) -> Verdict {
    let n = records.len();
    for (rank, r) in records.iter().enumerate() {
        if r.magic != SETUP_MAGIC
            || r.version != SETUP_VERSION
            || r.build != build_id()
            || r.rank as usize != rank
            || r.ranks as usize != n
        {
            return Verdict::Incompatible { rank };
        }
    }
    if let Some((rank, r)) = records.iter().enumerate().find(|(_, r)| r.failure != 0) {
        return Verdict::RankFailed {
            rank,
            failure: r.failure,
        };
    }
    let first = &records[0];
    for (rank, r) in records.iter().enumerate().skip(1) {
        if r.host != first.host || r.boot_id != first.boot_id {
            return Verdict::SeveralHosts {
                first: 0,
                other: rank,
            };
        }
        if let Some(i) = (0..AGREED_SETTINGS.len()).find(|&i| r.settings[i] != first.settings[i]) {
            return Verdict::SettingDiffers {
                rank,
                setting: AGREED_SETTINGS[i],
            };
        }
        if r.layout != first.layout {
            return Verdict::LayoutDiffers { rank };
        }
    }
    for a in 0..n {
        for b in a + 1..n {
            if devices == Devices::OnePerRank && records[a].device_uuid == records[b].device_uuid {
                return Verdict::SharedDevice { first: a, other: b };
            }
        }
    }
    Verdict::Eligible
}

/// The verdict of the second step: `peer_access[r]` is 1 when rank `r` opened and read through
/// every peer's mapping and finished its local steps.
pub fn peer_verdict(peer_access: &[u32]) -> Verdict {
    match peer_access.iter().position(|&ok| ok != 1) {
        Some(rank) => Verdict::PeerAccessFailed { rank },
        None => Verdict::Eligible,
    }
}

/// The bytes of a record, as gathered.
pub(super) fn record_bytes(record: &SetupRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(SETUP_RECORD_BYTES);
    for w in [
        record.magic,
        record.version,
        record.rank,
        record.ranks,
        record.failure,
        record.nvls,
    ] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&record.host);
    out.extend_from_slice(&record.boot_id);
    out.extend_from_slice(&record.device_uuid);
    for w in record.settings {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&record.staging_handle);
    for w in record.layout {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&record.build.to_le_bytes());
    out.extend_from_slice(&record.failure_word);
    out.extend_from_slice(&record.branch.to_le_bytes());
    out.resize(SETUP_RECORD_BYTES, 0);
    out
}

/// A record from its gathered bytes (`record_bytes`' inverse; the padding is ignored).
pub(super) fn record_from(bytes: &[u8]) -> SetupRecord {
    let mut at = 0;
    let mut take = |n: usize| {
        let s = &bytes[at..at + n];
        at += n;
        s
    };
    let mut u32s = [0u32; 6];
    for w in &mut u32s {
        *w = u32::from_le_bytes(take(4).try_into().expect("4 bytes"));
    }
    let host = take(64).try_into().expect("64 bytes");
    let boot_id = take(40).try_into().expect("40 bytes");
    let device_uuid = take(16).try_into().expect("16 bytes");
    let mut settings = [0u64; SETTINGS];
    for w in &mut settings {
        *w = u64::from_le_bytes(take(8).try_into().expect("8 bytes"));
    }
    let staging_handle = take(64).try_into().expect("64 bytes");
    let mut layout = [0u64; 3];
    for w in &mut layout {
        *w = u64::from_le_bytes(take(8).try_into().expect("8 bytes"));
    }
    let build = u64::from_le_bytes(take(8).try_into().expect("8 bytes"));
    let failure_word = take(48).try_into().expect("48 bytes");
    let branch = u32::from_le_bytes(take(4).try_into().expect("4 bytes"));
    SetupRecord {
        magic: u32s[0],
        version: u32s[1],
        rank: u32s[2],
        ranks: u32s[3],
        failure: u32s[4],
        nvls: u32s[5],
        host,
        boot_id,
        device_uuid,
        settings,
        staging_handle,
        layout,
        build,
        failure_word,
        branch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> StagingLayout {
        StagingLayout {
            arena_bytes: 1 << 20,
            values: 40,
            blocks: 16,
            ranks: 8,
        }
    }

    fn records(n: usize) -> Vec<SetupRecord> {
        (0..n)
            .map(|r| {
                let identity = Identity {
                    host: "node7".into(),
                    boot_id: "0f6b1c9e-aaaa-bbbb-cccc-123456789abc".into(),
                    device_uuid: [r as u8; 16],
                };
                SetupRecord::ready(
                    r,
                    n,
                    &identity,
                    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                    [r as u8; 64],
                    layout(),
                )
            })
            .collect()
    }

    #[test]
    fn ready_ranks_on_one_host_with_distinct_gpus_are_eligible() {
        assert_eq!(verdict(&records(8), Devices::OnePerRank), Verdict::Eligible);
        assert_eq!(records(8)[3].staging_layout(), layout());
    }

    #[test]
    fn a_member_is_named_by_host_and_gpu() {
        assert_eq!(records(12)[11].member(), "node7 GPU-0b0b0b0b");
    }

    #[test]
    fn every_cause_is_found() {
        let mut r = records(4);
        r[2] = SetupRecord::failed(2, 4, LocalFailure::NoKernels);
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::RankFailed {
                rank: 2,
                failure: 2
            }
        );

        let mut r = records(4);
        r[3].host = field("node8");
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::SeveralHosts { first: 0, other: 3 }
        );

        let mut r = records(4);
        r[1].boot_id = field("another-boot");
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::SeveralHosts { first: 0, other: 1 }
        );

        let mut r = records(4);
        r[2].settings[2] = 99;
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::SettingDiffers {
                rank: 2,
                setting: "STRAGGLAR_MIN_BYTES"
            }
        );

        let mut r = records(4);
        r[1].layout[2] = 8;
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::LayoutDiffers { rank: 1 }
        );

        let mut r = records(4);
        r[3].device_uuid = r[1].device_uuid;
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::SharedDevice { first: 1, other: 3 }
        );
        assert_eq!(
            verdict(&r, Devices::MayShare),
            Verdict::Eligible,
            "the bench's processes share one GPU"
        );

        let mut r = records(4);
        r[1].version = 99;
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::Incompatible { rank: 1 }
        );

        let mut r = records(4);
        r[2].build ^= 1;
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::Incompatible { rank: 2 },
            "another build may lower other plans"
        );

        let mut r = records(4);
        r.swap(1, 2);
        assert_eq!(
            verdict(&r, Devices::OnePerRank),
            Verdict::Incompatible { rank: 1 }
        );
    }

    #[test]
    fn peer_access_must_work_everywhere() {
        assert_eq!(peer_verdict(&[1, 1, 1]), Verdict::Eligible);
        assert_eq!(
            peer_verdict(&[1, 0, 1]),
            Verdict::PeerAccessFailed { rank: 1 }
        );
        for v in [
            Verdict::Eligible,
            Verdict::PeerAccessFailed { rank: 1 },
            Verdict::SettingDiffers {
                rank: 1,
                setting: "STRAGGLAR_ENABLE",
            },
        ] {
            assert!(!v.describe().is_empty());
        }
    }

    #[test]
    fn this_host_and_the_settings_are_read() {
        let here = Identity::this_host([7; 16]);
        assert!(!here.boot_id.is_empty() && !here.host.is_empty());
        let config = crate::config::Config::default();
        let other = crate::config::Config {
            min_bytes: 1,
            ..config.clone()
        };
        let (a, b) = (settings_of(&config), settings_of(&other));
        assert_eq!(a[0], b[0]);
        assert_ne!(a[2], b[2]);
    }

    #[test]
    fn fields_truncate_and_pad() {
        assert_eq!(field::<4>("abcdef"), *b"abcd");
        assert_eq!(field::<4>("ab"), [b'a', b'b', 0, 0]);
        assert_ne!(setting_hash("256M"), setting_hash("128M"));
        assert_eq!(std::mem::size_of::<SetupRecord>(), 376);
        assert!(std::mem::size_of::<SetupRecord>() <= SETUP_RECORD_BYTES);
    }
}

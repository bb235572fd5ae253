//! Every exported function (each `ncclX`, its `pncclX` twin, the device-API forwarders and our
//! extensions) called with hostile arguments drawn per parameter type, from several threads
//! at once, against the real NCCL where the test environment names it: NULL and destroyed
//! communicators, NULL and garbage-filled pointers, values outside every enum, counts of 0, 1
//! and SIZE_MAX, NULL opaque handles. Expected: a valid NCCL result code (never a crash, a
//! panic escaping or a hang), a bounded number of log lines, and no memory growth.
//!
//! Without a GPU, NCCL fails every communicator creation early; with one, a random but valid
//! `ncclCommInitRank` would wait for peers, so the test does not run where a GPU is present.

mod support;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stragglar::abi::allreduce::*;
use stragglar::abi::device_api::*;
use stragglar::abi::device_twins::*;
use stragglar::abi::errors::*;
use stragglar::abi::extensions::*;
use stragglar::abi::groups::*;
use stragglar::abi::lifecycle::*;
use stragglar::abi::passthrough::*;
use stragglar::abi::redops::*;
use stragglar::abi::twins::*;
use stragglar::nccl::types::*;
use stragglar::registry::groups;

/// A communicator the registry knows as destroyed: every call on it must be refused.
const DEAD: usize = 0xdead_0000;
/// Bytes of each scratch buffer a hostile pointer may point to.
const SCRATCH: usize = 1 << 16;

/// Per-thread state: a generator and scratch buffers (garbage-filled, NUL-terminated).
struct Ctx {
    state: u64,
    scratch: Vec<Vec<u64>>,
    next: usize,
}

impl Ctx {
    fn new(seed: u64) -> Ctx {
        Ctx {
            state: seed | 1,
            scratch: (0..8).map(|_| vec![0u64; SCRATCH / 8]).collect(),
            next: 0,
        }
    }

    fn draw(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[(self.draw() % items.len() as u64) as usize]
    }

    /// A scratch buffer, refilled with garbage bytes (and zeros in its last 256 bytes, so any
    /// string read from it ends inside it).
    fn buffer(&mut self) -> *mut c_void {
        self.next = (self.next + 1) % self.scratch.len();
        let fill = self.draw();
        let buf = &mut self.scratch[self.next];
        let len = buf.len();
        for (i, w) in buf.iter_mut().enumerate() {
            *w = if i >= len - 32 {
                0
            } else {
                fill.rotate_left(i as u32)
            };
        }
        buf.as_mut_ptr().cast()
    }

    /// NULL or a scratch buffer.
    fn pointer<T>(&mut self) -> *mut T {
        if self.draw() % 3 == 0 {
            std::ptr::null_mut()
        } else {
            self.buffer().cast()
        }
    }
}

/// A hostile value of a parameter type.
trait Hostile {
    fn hostile(c: &mut Ctx) -> Self;
}

macro_rules! pointers {
    ($($t:ty),* $(,)?) => {$(
        impl Hostile for *mut $t {
            fn hostile(c: &mut Ctx) -> Self { c.pointer() }
        }
        impl Hostile for *const $t {
            fn hostile(c: &mut Ctx) -> Self { c.pointer::<$t>() as *const $t }
        }
    )*};
}

pointers!(
    c_void,
    c_int,
    c_char,
    u32,
    u64,
    usize,
    i16,
    i64,
    u8,
    u16,
    *mut c_void,
    *const c_char,
    *mut *const c_char,
    ncclComm_t,
    ncclUniqueId,
    ncclConfig_t,
    ncclCollConfig_t,
    ncclSimInfo_t,
    ncclWaitSignalDesc_t,
    ncclEncryptionConfig_t,
    ncclWindow_t,
    ncclParamHandle_t,
    ResultCode,
    RedOpCode,
    stragglarNcclBinding_t,
    stragglarStats_t,
    stragglarArrivals_t,
    stragglarSizeClass_t,
);

impl Hostile for ncclComm_t {
    fn hostile(c: &mut Ctx) -> Self {
        c.pick(&[std::ptr::null_mut(), DEAD as ncclComm_t])
    }
}

/// Opaque NCCL handles other than communicators cannot be validated by anyone but NCCL: the
/// hostile one is NULL.
impl Hostile for ncclWindow_t {
    fn hostile(_: &mut Ctx) -> Self {
        std::ptr::null_mut()
    }
}

impl Hostile for ncclParamHandle_t {
    fn hostile(_: &mut Ctx) -> Self {
        std::ptr::null_mut()
    }
}

impl Hostile for cudaStream_t {
    fn hostile(c: &mut Ctx) -> Self {
        c.pick(&[std::ptr::null_mut(), 0x10 as cudaStream_t])
    }
}

impl Hostile for c_int {
    fn hostile(c: &mut Ctx) -> Self {
        c.pick(&[-1, 0, 1, 2, 3, 7, 100, c_int::MIN])
    }
}

impl Hostile for c_uint {
    fn hostile(c: &mut Ctx) -> Self {
        c.pick(&[0, 1, 7, u32::MAX])
    }
}

impl Hostile for usize {
    fn hostile(c: &mut Ctx) -> Self {
        c.pick(&[0, 1, 3, 4096, usize::MAX, usize::MAX / 2])
    }
}

impl Hostile for DataTypeCode {
    fn hostile(c: &mut Ctx) -> Self {
        DataTypeCode(c.pick(&[-1, 0, 7, 9, 10, 12, 99, i32::MIN, i32::MAX]))
    }
}

impl Hostile for RedOpCode {
    fn hostile(c: &mut Ctx) -> Self {
        RedOpCode(c.pick(&[-1, 0, 4, 5, 6, 1234, i32::MIN, i32::MAX]))
    }
}

impl Hostile for ResultCode {
    fn hostile(c: &mut Ctx) -> Self {
        ResultCode(c.pick(&[-1, 0, 3, 7, 8, 1000, i32::MIN]))
    }
}

impl Hostile for ScalarResidenceCode {
    fn hostile(c: &mut Ctx) -> Self {
        ScalarResidenceCode(c.pick(&[-1, 0, 1, 2, 77]))
    }
}

impl Hostile for MemStatCode {
    fn hostile(c: &mut Ctx) -> Self {
        MemStatCode(c.pick(&[-1, 0, 1, 99]))
    }
}

impl Hostile for ncclUniqueId {
    fn hostile(c: &mut Ctx) -> Self {
        let mut id = ncclUniqueId { internal: [0; 128] };
        if c.draw() % 2 == 0 {
            for b in id.internal.iter_mut() {
                *b = c.draw() as c_char;
            }
        }
        id
    }
}

impl Hostile for ncclTeam_t {
    fn hostile(c: &mut Ctx) -> Self {
        ncclTeam_t {
            nRanks: c_int::hostile(c),
            rank: c_int::hostile(c),
            stride: c_int::hostile(c),
        }
    }
}

impl Hostile for ncclMultimemHandle_t {
    fn hostile(_: &mut Ctx) -> Self {
        ncclMultimemHandle_t {
            mcBasePtr: std::ptr::null_mut(),
        }
    }
}

/// What a call returned, judged.
trait Returned {
    /// `Err` with a description when the value is not something an NCCL caller can handle.
    fn judge(self) -> Result<(), String>;
}

impl Returned for ResultCode {
    fn judge(self) -> Result<(), String> {
        // ncclSuccess .. ncclInProgress (7), and ncclNumResults-style values never.
        if (0..=7).contains(&self.0) {
            Ok(())
        } else {
            Err(format!("returned {}", self.0))
        }
    }
}

impl Returned for *const c_char {
    fn judge(self) -> Result<(), String> {
        if self.is_null() {
            Err("returned a NULL string".into())
        } else {
            Ok(())
        }
    }
}

impl Returned for c_int {
    fn judge(self) -> Result<(), String> {
        Ok(())
    }
}

impl Returned for ncclTeam_t {
    fn judge(self) -> Result<(), String> {
        Ok(())
    }
}

impl Returned for () {
    fn judge(self) -> Result<(), String> {
        Ok(())
    }
}

/// A function pointer callable with hostile arguments (one implementation per arity; the
/// C ABI's function items do not implement `Fn`, so the table casts each to its pointer type).
trait Fuzz {
    fn fuzz(&self, c: &mut Ctx) -> Result<(), String>;
}

macro_rules! arity {
    ($($a:ident),*) => {
        impl<R: Returned, $($a: Hostile),*> Fuzz for extern "C" fn($($a),*) -> R {
            #[allow(non_snake_case, unused_variables)]
            fn fuzz(&self, c: &mut Ctx) -> Result<(), String> {
                $(let $a = $a::hostile(c);)*
                self($($a),*).judge()
            }
        }
    };
}

arity!();
arity!(A);
arity!(A, B);
arity!(A, B, C);
arity!(A, B, C, D);
arity!(A, B, C, D, E);
arity!(A, B, C, D, E, G);
arity!(A, B, C, D, E, G, H);
arity!(A, B, C, D, E, G, H, I);
arity!(A, B, C, D, E, G, H, I, J);
arity!(A, B, C, D, E, G, H, I, J, K);
arity!(A, B, C, D, E, G, H, I, J, K, L);

/// The pointer type of a C function of `n` parameters.
macro_rules! c_fn {
    (0) => { extern "C" fn() -> _ };
    (1) => { extern "C" fn(_) -> _ };
    (2) => { extern "C" fn(_, _) -> _ };
    (3) => { extern "C" fn(_, _, _) -> _ };
    (4) => { extern "C" fn(_, _, _, _) -> _ };
    (5) => { extern "C" fn(_, _, _, _, _) -> _ };
    (6) => { extern "C" fn(_, _, _, _, _, _) -> _ };
    (7) => { extern "C" fn(_, _, _, _, _, _, _) -> _ };
    (8) => { extern "C" fn(_, _, _, _, _, _, _, _) -> _ };
    (9) => { extern "C" fn(_, _, _, _, _, _, _, _, _) -> _ };
    (11) => { extern "C" fn(_, _, _, _, _, _, _, _, _, _, _) -> _ };
}

type Entry = (
    &'static str,
    Box<dyn Fn(&mut Ctx) -> Result<(), String> + Send + Sync>,
);

fn entry<F: Fuzz + Send + Sync + 'static>(name: &'static str, f: F) -> Entry {
    (name, Box::new(move |c: &mut Ctx| f.fuzz(c)))
}

/// `arity => [functions]` groups, each function cast to its pointer type.
macro_rules! entries {
    ($($n:tt => [$($f:ident),* $(,)?]),* $(,)?) => {
        vec![$($(entry(stringify!($f), $f as c_fn!($n))),*),*]
    };
}

/// Every export. `ncclGetUniqueId` takes only NULL here: each real call starts a bootstrap
/// listener in NCCL, which thousands of calls would pile up (it is called once, validly, below);
/// the parameter dumps run once each.
fn every_export() -> Vec<Entry> {
    let mut all = entries![
        0 => [
            ncclGroupStart, ncclGroupEnd, ncclResetDebugInit, pncclResetDebugInit, ncclResetDebugInitInternal,
            pncclGroupStart, pncclGroupEnd,
        ],
        1 => [
            ncclTeamWorld, pncclTeamWorld, ncclTeamLsa, pncclTeamLsa, ncclTeamCftMultimem,
            pncclTeamCftMultimem, ncclTeamRail, pncclTeamRail, ncclGetErrorString,
            ncclGetLastError, stragglarGetVersion, stragglarGetNcclBinding, ncclCommFinalize,
            ncclCommDestroy, stragglarFallbackName, ncclCommAbort, ncclMemFree, ncclGetVersion, ncclCommResume,
            ncclGroupSimulateEnd, ncclSetEncryption, pncclMemFree, pncclGetVersion,
            pncclCommFinalize, pncclCommDestroy, pncclCommAbort, pncclGetErrorString,
            pncclGetLastError, pncclCommResume, pncclGroupSimulateEnd, pncclSetEncryption,
        ],
        2 => [
            ncclCommQueryProperties, pncclCommQueryProperties, ncclDevCommDestroy,
            pncclDevCommDestroy, ncclTeamCft, pncclTeamCft, ncclLLA2ACalcSlots,
            pncclLLA2ACalcSlots, ncclCommRevoke, ncclMemAlloc, ncclCommGetUniqueId,
            ncclCommGetAsyncError, ncclCommCount, ncclCommCuDevice, ncclCommUserRank,
            ncclCommDeregister, ncclCommSuspend, ncclCommWindowDeregister, ncclParamBind,
            ncclParamGetI8, ncclParamGetI16, ncclParamGetI32, ncclParamGetI64, ncclParamGetU8,
            ncclParamGetU16, ncclParamGetU32, ncclParamGetU64, ncclParamGetStr,
            ncclParamGetAllParameterKeys, ncclRedOpDestroy, pncclMemAlloc, pncclCommRevoke,
            pncclCommGetUniqueId, stragglarGetStats, pncclCommGetAsyncError, pncclCommCount, pncclCommCuDevice,
            pncclCommUserRank, pncclCommDeregister, pncclCommSuspend, pncclCommWindowDeregister,
            pncclRedOpDestroy, pncclParamBind, pncclParamGetI8, pncclParamGetI16,
            pncclParamGetI32, pncclParamGetI64, pncclParamGetU8, pncclParamGetU16,
            pncclParamGetU32, pncclParamGetU64, pncclParamGetStr, pncclParamGetAllParameterKeys,
        ],
        3 => [
            ncclDevCommCreate, pncclDevCommCreate, ncclGetLsaMultimemDevicePointer,
            pncclGetLsaMultimemDevicePointer, ncclTeamRankToWorld, pncclTeamRankToWorld,
            ncclTeamRankToLsa, pncclTeamRankToLsa, ncclCommInitAll, ncclCommMemStats,
            ncclWinGetUserPtr, ncclParamGetParameter, pncclCommInitAll, pncclCommMemStats,
            pncclWinGetUserPtr, pncclParamGetParameter, stragglarGetArrivals,
            stragglarGetSizeClass,
        ],
        4 => [
            ncclGetMultimemDevicePointer, pncclGetMultimemDevicePointer, ncclGetLsaDevicePointer,
            pncclGetLsaDevicePointer, ncclGetPeerDevicePointer, pncclGetPeerDevicePointer,
            ncclGetMultimemDeviceLeInfo, pncclGetMultimemDeviceLeInfo,
            ncclLsaBarrierCreateRequirement, pncclLsaBarrierCreateRequirement,
            ncclLLA2ACreateRequirement, pncclLLA2ACreateRequirement,
            ncclGinOutboxCreateRequirement, pncclGinOutboxCreateRequirement, ncclCommInitRank,
            ncclCommRegister, ncclWaitSignal, ncclParamGet, pncclCommInitRank, pncclCommRegister,
            pncclWaitSignal, pncclParamGet,
        ],
        5 => [
            ncclGetPeerDeviceLeInfo, pncclGetPeerDeviceLeInfo, ncclGinBarrierCreateRequirement,
            pncclGinBarrierCreateRequirement, ncclGinInboxA2ACreateRequirement,
            pncclGinInboxA2ACreateRequirement, ncclCommInitRankConfig, ncclCommSplit,
            ncclCommWindowRegister, ncclRedOpCreatePreMulSum, pncclCommInitRankConfig,
            pncclCommSplit, pncclCommWindowRegister, pncclRedOpCreatePreMulSum,
        ],
        6 => [
            ncclGetCftDeviceLeInfo, pncclGetCftDeviceLeInfo, ncclCommInitRankScalable,
            ncclCommShrink, ncclCommGrow, ncclBcast, ncclAllGather, ncclAlltoAll, ncclSend,
            ncclRecv, ncclSignal, pncclCommShrink, pncclCommGrow, pncclCommInitRankScalable,
            pncclBcast, pncclAllGather, pncclAlltoAll, pncclSend, pncclRecv, pncclSignal,
        ],
        7 => [
            ncclAllReduce, ncclBroadcast, ncclReduceScatter, ncclGather, ncclScatter,
            ncclAllGatherConfig, ncclAlltoAllConfig, pncclBroadcast, pncclAllReduce,
            pncclReduceScatter, pncclGather, pncclScatter, pncclAllGatherConfig,
            pncclAlltoAllConfig,
        ],
        8 => [
            ncclReduce, ncclAllReduceConfig, ncclBroadcastConfig, ncclReduceScatterConfig,
            ncclGatherConfig, ncclScatterConfig, pncclReduce, pncclAllReduceConfig,
            pncclBroadcastConfig, pncclReduceScatterConfig, pncclGatherConfig,
            pncclScatterConfig,
        ],
        9 => [
            ncclReduceConfig, pncclReduceConfig,
        ],
        11 => [
            ncclPutSignal, pncclPutSignal,
        ],
    ];
    // The parameter dump prints NCCL's whole registry to stdout: once each is enough.
    static DUMPED: [std::sync::Once; 2] = [std::sync::Once::new(), std::sync::Once::new()];
    all.push((
        "ncclParamDumpAll",
        Box::new(|_: &mut Ctx| {
            DUMPED[0].call_once(|| ncclParamDumpAll());
            Ok(())
        }),
    ));
    all.push((
        "pncclParamDumpAll",
        Box::new(|_: &mut Ctx| {
            DUMPED[1].call_once(|| pncclParamDumpAll());
            Ok(())
        }),
    ));
    all.push((
        "ncclGetUniqueId",
        Box::new(|_: &mut Ctx| ncclGetUniqueId(std::ptr::null_mut()).judge()),
    ));
    all.push((
        "pncclGetUniqueId",
        Box::new(|_: &mut Ctx| pncclGetUniqueId(std::ptr::null_mut()).judge()),
    ));
    all
}

/// The names `nm -D` lists as defined functions of our library.
fn exported_names() -> Vec<String> {
    let lib = support::stragglar_so();
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then(|| name.to_string())
        })
        .collect()
}

/// Set (by the test below) to run the fuzzer with no real NCCL to forward to.
const WITHOUT_NCCL: &str = "STRAGGLAR_FUZZ_WITHOUT_NCCL";

#[test]
fn every_export_survives_hostile_arguments_when_no_nccl_could_be_loaded() {
    if std::env::var_os(WITHOUT_NCCL).is_some() {
        return;
    }
    // The configuration is read once per process: run the fuzzer again in a child.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "every_export_survives_hostile_arguments_from_many_threads",
            "--nocapture",
        ])
        .env(WITHOUT_NCCL, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("hostile calls"), "{stderr}");
}

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(0)
        * 4096
}

#[test]
fn every_export_survives_hostile_arguments_from_many_threads() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!(
            "a GPU is present: a random valid ncclCommInitRank would wait for peers; skipped"
        );
        return;
    }
    // This test binary reads the configuration once, here, before any call.
    let log = support::fuzz_setup(
        "fuzz-exports",
        std::env::var_os(WITHOUT_NCCL).is_some(),
        DEAD,
    );
    let mut id = ncclUniqueId { internal: [0; 128] };
    let _ = ncclGetUniqueId(&mut id);

    let entries = every_export();
    let covered: std::collections::HashSet<&str> = entries.iter().map(|(n, _)| *n).collect();
    let exported = exported_names();
    if !exported.is_empty() {
        let missing: Vec<&String> = exported
            .iter()
            .filter(|n| !covered.contains(n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "exports the fuzzer does not call: {missing:?}"
        );
    }

    // A first round, one thread, every export several times: a crash here names nothing, but
    // a wrong result does.
    let warm = resident_bytes();
    let mut c = Ctx::new(0x1234_5678);
    let trace = std::env::var_os("FUZZ_TRACE").is_some();
    for (name, call) in &entries {
        if trace {
            eprintln!("fuzzing {name}");
        }
        for _ in 0..8 {
            if let Err(e) = call(&mut c) {
                panic!("{name}: {e}");
            }
        }
    }
    while groups::depth() > 0 {
        let _ = ncclGroupEnd();
    }

    // Then four threads drawing exports at random.
    let entries = std::sync::Arc::new(entries);
    // A fixed seed in CI; FUZZ_SEED explores others by hand.
    let seed = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0x5eed_0000);
    let (tx, rx) = mpsc::channel();
    let calls_per_thread = 5000;
    for t in 0..4u64 {
        let entries = entries.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut c = Ctx::new(seed + t * 7919);
            let mut failures = Vec::new();
            for _ in 0..calls_per_thread {
                let (name, call) = &entries[(c.draw() % entries.len() as u64) as usize];
                if trace {
                    eprintln!("thread {t}: {name}");
                }
                if let Err(e) = call(&mut c) {
                    failures.push(format!("{name}: {e}"));
                }
            }
            while groups::depth() > 0 {
                let _ = ncclGroupEnd();
            }
            let _ = tx.send(failures);
        });
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut failures = Vec::new();
    for _ in 0..4 {
        let left = deadline.saturating_duration_since(Instant::now());
        failures.extend(
            rx.recv_timeout(left)
                .expect("a fuzzing thread hung or panicked"),
        );
    }
    assert!(
        failures.is_empty(),
        "{} bad results, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let grown = resident_bytes().saturating_sub(warm);
    assert!(grown < 64 << 20, "resident memory grew by {grown} bytes");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if std::env::var_os("FUZZ_KEEP_LOG").is_some() {
        eprintln!("log kept in {}", log.display());
    } else {
        let _ = std::fs::remove_file(&log);
    }
    let lines = text.lines().count();
    // One line per cause and entry point: the same message at most twice (from `ncclX` and
    // from its twin `pncclX`, which name the same NCCL function).
    let mut seen = std::collections::HashMap::new();
    for line in text.lines() {
        let message = line.splitn(3, ' ').nth(2).unwrap_or(line);
        *seen.entry(message.to_string()).or_insert(0) += 1;
    }
    if let Some((message, n)) = seen.iter().find(|(_, &n)| n > 2) {
        panic!("logged {n} times: {message}");
    }
    let total_calls = entries.len() * 8 + 4 * calls_per_thread;
    assert!(
        lines <= 2 * entries.len(),
        "{lines} log lines for {total_calls} calls: not about one per cause"
    );
    eprintln!(
        "{} exports, {total_calls} hostile calls, {lines} log lines, resident memory {grown} bytes larger",
        entries.len()
    );
}

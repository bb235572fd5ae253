//! Compiling the kernels with NVRTC (loaded at run time by cudarc) into CUBINs, cached on disk.
//!
//! Cache entries are keyed by a hash of the translation unit and options, the architecture and
//! this build's version, so a changed source, another build or another GPU never reuses a
//! stale binary, and an entry is found without loading NVRTC at all (a job can run on a cache
//! that `stragglar kernels --cache` filled). Each entry starts with the version of the NVRTC
//! that compiled it: an entry, or an NVRTC, of a newer major version than the driver's CUDA is
//! refused with a WARN naming both (the driver cannot load its CUBIN). An entry is written to a temporary name
//! and renamed into place, so concurrent ranks never read a torn file, and only one process
//! per host compiles at a time (a lock file beside the entry): the others wait, then read it.

use std::ffi::{c_int, CString};
use std::panic::catch_unwind;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

use super::kernels::{
    nvrtc_options, translation_unit, turn_translation_unit, valid_arch, MODULE_KERNELS,
    TURN_MODULE_KERNELS,
};

/// Why no CUBIN came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompileError {
    /// libnvrtc could not be loaded.
    NoNvrtc,
    /// Not an architecture we build for.
    BadArch(String),
    /// NVRTC refused the source; its log.
    Rejected(String),
    /// NVRTC failed otherwise.
    Failed(String),
    /// This NVRTC is newer than the driver: the driver could not load what it compiles.
    /// (A newer major version: see `newer_than_driver`.)
    NewerThanDriver {
        nvrtc: (i32, i32),
        driver: (i32, i32),
    },
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::NoNvrtc => write!(f, "libnvrtc is not available"),
            CompileError::BadArch(a) => {
                write!(f, "{a} is not a supported architecture (sm_70 or later)")
            }
            CompileError::Rejected(log) => write!(f, "NVRTC rejected the kernels:\n{log}"),
            CompileError::Failed(why) => write!(f, "NVRTC failed: {why}"),
            CompileError::NewerThanDriver { nvrtc, driver } => write!(
                f,
                "NVRTC {}.{} is newer than the driver's CUDA {}.{}: its CUBINs would not load",
                nvrtc.0, nvrtc.1, driver.0, driver.1
            ),
        }
    }
}

/// The loaded NVRTC's version, `(major, minor)`; `None` when it cannot be loaded (found by
/// name on the loader's path, or where a pip install keeps it: see `nvrtc_search`).
pub fn version() -> Option<(i32, i32)> {
    super::nvrtc_search::preload(super::probe::driver_cuda_version().map(|(major, _)| major));
    // SAFETY: is_culib_present only tries to dlopen the library.
    let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return None;
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid for writes; the library is present (checked above).
    let ok =
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) } == sys::nvrtcResult::NVRTC_SUCCESS;
    ok.then_some((major, minor))
}

/// What the kernel cache compiles: our kernels' translation unit, or another (the cache's own
/// tests use a tiny one). Its entries are keyed by a hash of the text.
pub struct Unit {
    text: String,
    /// What its CUBIN must hold (`super::cubin::check`).
    kernels: &'static [&'static str],
}

impl Unit {
    /// Our kernels: every source of `cuda/`, as one translation unit.
    pub fn ours() -> Unit {
        Unit {
            text: translation_unit(),
            kernels: &MODULE_KERNELS,
        }
    }

    /// The turn kernel's module (`kernels::turn_sources`), loaded apart from ours.
    pub fn turn() -> Unit {
        Unit {
            text: turn_translation_unit(),
            kernels: &TURN_MODULE_KERNELS,
        }
    }

    /// Any CUDA C++ translation unit without includes, standing in for ours: its CUBIN must
    /// hold `kernels::MODULE_KERNELS`.
    pub fn from_text(text: impl Into<String>) -> Unit {
        Unit {
            text: text.into(),
            kernels: &MODULE_KERNELS,
        }
    }

    /// Compiles the unit for `arch` into one CUBIN (no cache).
    pub fn compile(&self, arch: &str) -> Result<Vec<u8>, CompileError> {
        compile_with(arch, &nvrtc_options(arch), &self.text).map(|(cubin, _)| cubin)
    }

    /// What its CUBIN must hold.
    pub fn kernels(&self) -> &'static [&'static str] {
        self.kernels
    }

    /// As [`compile_reporting`], for this unit.
    pub fn compile_reporting(&self, arch: &str) -> Result<(Vec<u8>, String), CompileError> {
        compile_reporting(arch, &self.text)
    }

    /// The cache entry's name for this unit and build on `arch` (no NVRTC needed).
    pub fn cache_key(&self, arch: &str) -> String {
        unit_key(&self.text, arch)
    }

    /// As [`read_cached`], for this unit.
    pub fn read_cached(&self, arch: &str, dir: &Path) -> Option<(Vec<u8>, (i32, i32))> {
        read_entry(&self.cache_key(arch), arch, self.kernels, dir)
    }

    /// Stores `cubin`, compiled for `arch` by this NVRTC from this unit, as its cache entry in
    /// `dir` (atomically: written aside, then renamed). A cache that cannot be written only
    /// costs a recompilation next time: it is logged at INFO, not an error.
    pub fn store_cached(&self, arch: &str, dir: &Path, cubin: &[u8]) {
        store_entry(&self.cache_key(arch), dir, cubin)
    }

    /// As [`cubin_cached`], for this unit.
    pub fn cubin_cached(
        &self,
        arch: &str,
        cache_dir: Option<&Path>,
    ) -> Result<(Vec<u8>, Origin), CompileError> {
        cached_or_compiled(self, arch, cache_dir)
    }
}

/// Compiles `unit` (the library's own sources, or another revision's: see
/// `kernels::translation_unit_from`) as [`Unit::compile`] does, with ptxas reporting each function's
/// registers, stack, spills and shared memory; returns the CUBIN and NVRTC's log (ptxas's
/// `info` lines). `-v` only reports: the CUBIN is what the same sources compile to.
pub fn compile_reporting(arch: &str, unit: &str) -> Result<(Vec<u8>, String), CompileError> {
    let mut options = nvrtc_options(arch);
    options.push("--ptxas-options=-v".into());
    compile_with(arch, &options, unit)
}

fn compile_with(
    arch: &str,
    options: &[String],
    unit: &str,
) -> Result<(Vec<u8>, String), CompileError> {
    if !valid_arch(arch) {
        return Err(CompileError::BadArch(arch.into()));
    }
    version().ok_or(CompileError::NoNvrtc)?;
    let source = CString::new(unit)
        .map_err(|_| CompileError::Failed("the sources hold a NUL byte".into()))?;
    let name = CString::new("stragglar_allreduce.cu").expect("no NUL");
    let program = result::create_program(&source, Some(&name))
        .map_err(|e| CompileError::Failed(format!("{e:?}")))?;
    // SAFETY: `program` was just created and is destroyed exactly once, below; `source` and
    // `name` outlive it.
    let compiled = unsafe { compile_created(program, options) };
    // SAFETY: as above; nothing uses `program` afterwards.
    let _ = unsafe { result::destroy_program(program) };
    compiled
}

/// # Safety
/// `program` must be a live program from `create_program`.
unsafe fn compile_created(
    program: sys::nvrtcProgram,
    options: &[String],
) -> Result<(Vec<u8>, String), CompileError> {
    // SAFETY: the caller guarantees `program` is live.
    let compiled = unsafe { result::compile_program(program, options) };
    // SAFETY: as above.
    let log = unsafe { result::get_program_log(program) }.unwrap_or_default();
    let bytes: Vec<u8> = log
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    let log = String::from_utf8_lossy(&bytes).into_owned();
    if compiled.is_err() {
        return Err(CompileError::Rejected(log));
    }
    let mut size = 0usize;
    // SAFETY: `program` compiled successfully; `size` is valid for writes.
    if unsafe { sys::nvrtcGetCUBINSize(program, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CompileError::Failed("nvrtcGetCUBINSize".into()));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` holds exactly the `size` bytes NVRTC reported.
    if unsafe { sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast()) }
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return Err(CompileError::Failed("nvrtcGetCUBIN".into()));
    }
    Ok((cubin, log))
}

/// The cache entry's name for the current sources and build on `arch` (no NVRTC needed).
pub fn cache_key(arch: &str) -> String {
    Unit::ours().cache_key(arch)
}

fn unit_key(unit: &str, arch: &str) -> String {
    let text = format!("{unit}\0{:?}", nvrtc_options(arch));
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!(
        "stragglar-{hash:016x}-{arch}-v{}.cubin",
        env!("CARGO_PKG_VERSION")
    )
}

/// The kernel cache: `configured` (`STRAGGLAR_CACHE_DIR`), else `$XDG_CACHE_HOME/stragglar`,
/// else `~/.cache/stragglar`; `None` when there is no home to put it in.
pub fn default_cache_dir(configured: Option<&str>) -> Option<PathBuf> {
    let env = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    configured
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("stragglar")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("stragglar")))
}

/// The first line of every cache entry, before the CUBIN: `MAGIC major.minor\n`, the NVRTC
/// that compiled it.
const MAGIC: &str = "stragglar-cubin nvrtc";

/// An entry's bytes: the header naming NVRTC `version`, then `cubin`.
fn entry_bytes(version: (i32, i32), cubin: &[u8]) -> Vec<u8> {
    let mut bytes = format!("{MAGIC} {}.{}\n", version.0, version.1).into_bytes();
    bytes.extend_from_slice(cubin);
    bytes
}

/// Parses an entry: the NVRTC version that compiled it and its CUBIN; `None` when damaged.
fn parse_entry(bytes: &[u8]) -> Option<((i32, i32), &[u8])> {
    let end = bytes.iter().take(64).position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..end]).ok()?;
    let (major, minor) = header.strip_prefix(MAGIC)?.trim().split_once('.')?;
    Some((
        (major.parse().ok()?, minor.parse().ok()?),
        &bytes[end + 1..],
    ))
}

/// The cached CUBIN for `arch` in `dir` and the NVRTC that compiled it, when the entry exists
/// and holds a valid CUBIN for `arch`.
pub fn read_cached(arch: &str, dir: &Path) -> Option<(Vec<u8>, (i32, i32))> {
    Unit::ours().read_cached(arch, dir)
}

fn read_entry(
    key: &str,
    arch: &str,
    kernels: &[&str],
    dir: &Path,
) -> Option<(Vec<u8>, (i32, i32))> {
    let bytes = std::fs::read(dir.join(key)).ok()?;
    let (version, cubin) = parse_entry(&bytes)?;
    super::cubin::check(cubin, arch, kernels).ok()?;
    Some((cubin.to_vec(), version))
}

/// Whether NVRTC `nvrtc` is of a newer major version than the driver's CUDA `driver` (an
/// unknown driver is not held against it). Within a major version a CUBIN loads on an older
/// driver (CUDA's minor-version compatibility covers SASS; only PTX needs the newer driver).
fn newer_than_driver(nvrtc: (i32, i32), driver: Option<(i32, i32)>) -> bool {
    driver.is_some_and(|driver| nvrtc.0 > driver.0)
}

/// An exclusive lock on one cache entry, held while it is compiled and stored (released when
/// dropped, or when the process dies).
struct CompileLock {
    /// The locked lock file; closing it releases the lock.
    _file: std::fs::File,
}

impl CompileLock {
    /// Waits for the lock of `arch`'s entry in `dir`; `None` when the lock file cannot be made
    /// (a read-only cache: compiling without it only costs duplicate work).
    fn take(key: &str, dir: &Path) -> Option<CompileLock> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(dir).ok()?;
        let file = std::fs::File::create(dir.join(format!(".{key}.lock"))).ok()?;
        // SAFETY: `file` is an open descriptor for the call's duration; flock only locks it.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0;
        locked.then_some(CompileLock { _file: file })
    }
}

/// Where a CUBIN came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Compiled,
}

/// The CUBIN for `arch`: from `cache_dir` when an entry exists that the driver can load (read
/// without NVRTC), else compiled, by one process of the host at a time, and stored there (a
/// cache that cannot be written only costs a recompilation next time).
pub fn cubin_cached(
    arch: &str,
    cache_dir: Option<&Path>,
) -> Result<(Vec<u8>, Origin), CompileError> {
    Unit::ours().cubin_cached(arch, cache_dir)
}

fn cached_or_compiled(
    unit: &Unit,
    arch: &str,
    cache_dir: Option<&Path>,
) -> Result<(Vec<u8>, Origin), CompileError> {
    let key = unit.cache_key(arch);
    let driver = super::probe::driver_cuda_version();
    // An entry the driver can load, or the version of the NVRTC that made one it cannot.
    let loadable = |dir: &Path| {
        read_entry(&key, arch, unit.kernels, dir).map(|(cubin, built_by)| {
            match newer_than_driver(built_by, driver) {
                false => Ok(cubin),
                true => Err(built_by),
            }
        })
    };
    let first = cache_dir.and_then(|dir| loadable(dir).map(|entry| (dir, entry)));
    match first {
        Some((_, Ok(cubin))) => return Ok((cubin, Origin::Cache)),
        Some((dir, Err(n))) => {
            let d = driver.unwrap_or_default();
            log::warn!(
                "kernel cache entry {} was compiled by NVRTC {}.{}, newer than the driver's CUDA {}.{}: not used",
                dir.join(&key).display(),
                n.0,
                n.1,
                d.0,
                d.1
            );
        }
        None => {}
    }
    let version = version().ok_or(CompileError::NoNvrtc)?;
    if newer_than_driver(version, driver) {
        let error = CompileError::NewerThanDriver {
            nvrtc: version,
            driver: driver.unwrap_or_default(),
        };
        log::warn!("{error}");
        return Err(error);
    }
    let _lock = cache_dir.and_then(|dir| CompileLock::take(&key, dir));
    // Another process may have stored the entry while this one waited for the lock (one that
    // was there already was refused above, and is not looked at again).
    if let (Some(dir), None) = (cache_dir, &first) {
        if let Some(Ok(cubin)) = loadable(dir) {
            return Ok((cubin, Origin::Cache));
        }
    }
    let cubin = unit.compile(arch)?;
    if let Some(dir) = cache_dir {
        store_entry(&key, dir, &cubin);
    }
    Ok((cubin, Origin::Compiled))
}

fn store_entry(key: &str, dir: &Path, cubin: &[u8]) {
    let Some(version) = version() else {
        return;
    };
    let temporary = dir.join(format!(".{}.{key}", std::process::id()));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&temporary, entry_bytes(version, cubin)))
        .and_then(|()| std::fs::rename(&temporary, dir.join(key)));
    if let Err(e) = stored {
        let _ = std::fs::remove_file(&temporary);
        log::info!("kernel cache {} not written: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_carry_the_nvrtc_that_compiled_them() {
        let bytes = entry_bytes((12, 9), b"\x7fELF...");
        assert_eq!(parse_entry(&bytes), Some(((12, 9), &b"\x7fELF..."[..])));
        assert_eq!(parse_entry(b"\x7fELF without a header"), None);
        assert_eq!(parse_entry(b"stragglar-cubin nvrtc x.y\n"), None);
        assert!(!cache_key("sm_90").contains("nvrtc"), "found without NVRTC");
        assert_ne!(cache_key("sm_90"), cache_key("sm_80"));
    }

    #[test]
    fn only_an_nvrtc_of_a_newer_major_version_than_the_driver_is_refused() {
        assert!(newer_than_driver((13, 0), Some((12, 9))));
        assert!(newer_than_driver((12, 9), Some((11, 8))));
        assert!(
            !newer_than_driver((12, 9), Some((12, 4))),
            "minor-version compatibility"
        );
        assert!(!newer_than_driver((12, 4), Some((12, 9))));
        assert!(!newer_than_driver((12, 9), Some((12, 9))));
        assert!(!newer_than_driver((13, 0), None));
    }
}

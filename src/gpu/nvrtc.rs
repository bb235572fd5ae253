//! Compiling the kernels with NVRTC (loaded at run time by cudarc) into CUBINs, cached on disk.
//!
//! Cache entries are keyed by a hash of the translation unit and options, the architecture and
//! the NVRTC version, so a changed source, a new NVRTC or another GPU never reuses a stale
//! binary. An entry is written to a temporary name and renamed into place, so concurrent ranks
//! compiling at once never read a torn file.

use std::ffi::{c_int, CString};
use std::panic::catch_unwind;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};

use super::kernels::{nvrtc_options, translation_unit, valid_arch};

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
        }
    }
}

/// The loaded NVRTC's version, `(major, minor)`; `None` when it cannot be loaded.
pub fn version() -> Option<(i32, i32)> {
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

/// Compiles every kernel for `arch` into one CUBIN (no cache).
pub fn compile(arch: &str) -> Result<Vec<u8>, CompileError> {
    if !valid_arch(arch) {
        return Err(CompileError::BadArch(arch.into()));
    }
    version().ok_or(CompileError::NoNvrtc)?;
    let source = CString::new(translation_unit()).expect("sources have no NUL");
    let name = CString::new("stragglar_allreduce.cu").expect("no NUL");
    let program = result::create_program(&source, Some(&name))
        .map_err(|e| CompileError::Failed(format!("{e:?}")))?;
    // SAFETY: `program` was just created and is destroyed exactly once, below; `source` and
    // `name` outlive it.
    let compiled = unsafe { compile_created(program, arch) };
    // SAFETY: as above; nothing uses `program` afterwards.
    let _ = unsafe { result::destroy_program(program) };
    compiled
}

/// # Safety
/// `program` must be a live program from `create_program`.
unsafe fn compile_created(program: sys::nvrtcProgram, arch: &str) -> Result<Vec<u8>, CompileError> {
    // SAFETY: the caller guarantees `program` is live.
    if unsafe { result::compile_program(program, &nvrtc_options(arch)) }.is_err() {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(program) }.unwrap_or_default();
        let bytes: Vec<u8> = log
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        return Err(CompileError::Rejected(
            String::from_utf8_lossy(&bytes).into_owned(),
        ));
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
    Ok(cubin)
}

/// The cache key of the current sources for `arch` under NVRTC `version`.
pub fn cache_key(arch: &str, version: (i32, i32)) -> String {
    let text = format!("{}\0{:?}", translation_unit(), nvrtc_options(arch));
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!(
        "stragglar-{hash:016x}-{arch}-nvrtc{}.{}.cubin",
        version.0, version.1
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

/// Where a CUBIN came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Compiled,
}

/// The CUBIN for `arch`: from `cache_dir` when a matching entry exists, else compiled and
/// stored there (a cache that cannot be written only costs a recompilation next time).
pub fn cubin_cached(
    arch: &str,
    cache_dir: Option<&Path>,
) -> Result<(Vec<u8>, Origin), CompileError> {
    let version = version().ok_or(CompileError::NoNvrtc)?;
    let path = cache_dir.map(|d| d.join(cache_key(arch, version)));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if super::cubin::check(&bytes, arch).is_ok() {
            return Ok((bytes, Origin::Cache));
        }
    }
    let cubin = compile(arch)?;
    if let Some(dir) = cache_dir {
        store_cached(arch, dir, &cubin);
    }
    Ok((cubin, Origin::Compiled))
}

/// Stores `cubin`, compiled for `arch` by this NVRTC from the current sources, as the cache
/// entry in `dir` (atomically: written aside, then renamed). A cache that cannot be written
/// only costs a recompilation next time: it is logged at INFO, not an error.
pub fn store_cached(arch: &str, dir: &Path, cubin: &[u8]) {
    let Some(version) = version() else {
        return;
    };
    let key = cache_key(arch, version);
    let temporary = dir.join(format!(".{}.{key}", std::process::id()));
    let stored = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&temporary, cubin))
        .and_then(|()| std::fs::rename(&temporary, dir.join(&key)));
    if let Err(e) = stored {
        let _ = std::fs::remove_file(&temporary);
        log::info!("kernel cache {} not written: {e}", dir.display());
    }
}

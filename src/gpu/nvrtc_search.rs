//! Finding NVRTC where a pip-installed job keeps it.
//!
//! cudarc opens NVRTC by name (`libnvrtc.so`, ..., `libnvrtc.so.13`, `libnvrtc.so.12`), so only
//! the loader's search path is searched. Under a PyTorch pip install, NVRTC sits in
//! `site-packages/nvidia/cuda_nvrtc/lib`, beside `nvidia/nccl/lib` and `nvidia/cuda_runtime/lib`
//! whose libraries the job has already loaded, but off that path. So before cudarc first looks,
//! this module opens, by absolute path, the first NVRTC it finds there (`RTLD_GLOBAL`); the
//! loader then answers cudarc's `dlopen("libnvrtc.so.12")` with the library already loaded
//! under that SONAME.
//!
//! Where it looks, in order: the folders of the NCCL, CUDA runtime and NVRTC libraries this
//! process has mapped (read from `/proc/self/maps`) and of `STRAGGLAR_NCCL_LIB`, and for each
//! of them inside a pip `nvidia` tree (`.../nvidia/<package>/lib`), that tree's
//! `cuda_nvrtc/lib`. In each folder, the NVRTC of the driver's CUDA major version first.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use once_cell::sync::OnceCell;

/// The NVRTC opened by [`preload`], or `None` when none was needed or found; decided once.
static PRELOADED: OnceCell<Option<PathBuf>> = OnceCell::new();

/// Makes NVRTC loadable by cudarc if the loader cannot find it by name but a pip `nvidia` tree
/// or a loaded CUDA library's folder holds one. Returns the path opened, if any. Safe to call
/// any number of times; only the first call searches.
pub fn preload(driver_major: Option<i32>) -> Option<&'static Path> {
    PRELOADED
        .get_or_init(|| {
            if loadable_by_name() {
                return None;
            }
            let found = candidate_dirs(&mapped_files(), nccl_lib().as_deref())
                .into_iter()
                .flat_map(|dir| file_names(driver_major).map(move |name| dir.join(name)))
                .find(|path| path.is_file() && open_global(path))?;
            log::info!(
                "NVRTC found at {} (not on the loader's search path)",
                found.display()
            );
            Some(found)
        })
        .as_deref()
}

/// Whether the loader finds an NVRTC by one of the names cudarc asks for.
fn loadable_by_name() -> bool {
    ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
        .iter()
        .any(|name| open_global(Path::new(name)))
}

/// Opens `path` (a name or an absolute path) with `RTLD_NOW | RTLD_GLOBAL`, kept open for the
/// life of the process; whether it opened.
fn open_global(path: &Path) -> bool {
    let Some(text) = path.to_str().and_then(|p| CString::new(p).ok()) else {
        return false;
    };
    // SAFETY: `text` is a NUL-terminated path; the handle is deliberately never closed, so the
    // library stays loaded for cudarc, which opens it by the same SONAME.
    let handle = unsafe { libc::dlopen(text.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    !handle.is_null()
}

/// The NVRTC file names to try in a folder: the driver's major version first.
fn file_names(driver_major: Option<i32>) -> impl Iterator<Item = &'static str> {
    let order: [&'static str; 3] = match driver_major {
        Some(major) if major >= 13 => ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
        _ => ["libnvrtc.so.12", "libnvrtc.so.13", "libnvrtc.so"],
    };
    order.into_iter()
}

/// The files this process has mapped (from `/proc/self/maps`), in the order they appear.
fn mapped_files() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut files: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        if let Some(at) = line.find('/') {
            let path = PathBuf::from(&line[at..]);
            if !files.contains(&path) {
                files.push(path);
            }
        }
    }
    files
}

/// `STRAGGLAR_NCCL_LIB`, when set to an absolute path.
fn nccl_lib() -> Option<PathBuf> {
    std::env::var_os("STRAGGLAR_NCCL_LIB")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
}

/// Whether a mapped file is one of the CUDA libraries whose folder may hold NVRTC.
fn is_cuda_library(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    ["libnccl.so", "libcudart.so", "libnvrtc", "libcublas"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// The folders to search, in order, without repeats: for each CUDA library among `mapped`
/// (and `nccl`), its own folder, then its pip tree's `cuda_nvrtc/lib` when it lies in one
/// (`.../nvidia/<package>/lib/<file>`).
fn candidate_dirs(mapped: &[PathBuf], nccl: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let libraries = nccl.into_iter().chain(
        mapped
            .iter()
            .map(PathBuf::as_path)
            .filter(|p| is_cuda_library(p)),
    );
    for library in libraries {
        let Some(dir) = library.parent() else {
            continue;
        };
        let in_pip_tree = dir
            .parent()
            .and_then(Path::parent)
            .filter(|root| root.file_name().is_some_and(|n| n == "nvidia"))
            .map(|root| root.join("cuda_nvrtc").join("lib"));
        for candidate in [Some(dir.to_path_buf()), in_pip_tree].into_iter().flatten() {
            if !dirs.contains(&candidate) {
                dirs.push(candidate);
            }
        }
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_trees_and_library_folders_are_searched_in_order() {
        let site = "/venv/lib/python3.12/site-packages/nvidia";
        let mapped: Vec<PathBuf> = [
            "/usr/lib/x86_64-linux-gnu/libc.so.6".to_string(),
            format!("{site}/nccl/lib/libnccl.so.2"),
            format!("{site}/cuda_runtime/lib/libcudart.so.12"),
            "/opt/cuda/lib64/libcudart.so.12".to_string(),
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let dirs = candidate_dirs(
            &mapped,
            Some(Path::new("/elsewhere/nvidia/nccl/lib/libnccl.so.2")),
        );
        let expected: Vec<PathBuf> = [
            "/elsewhere/nvidia/nccl/lib".to_string(),
            "/elsewhere/nvidia/cuda_nvrtc/lib".to_string(),
            format!("{site}/nccl/lib"),
            format!("{site}/cuda_nvrtc/lib"),
            format!("{site}/cuda_runtime/lib"),
            "/opt/cuda/lib64".to_string(),
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(dirs, expected);
        assert!(
            candidate_dirs(&mapped[..1], None).is_empty(),
            "libc is not CUDA"
        );
    }

    #[test]
    fn the_drivers_major_version_is_tried_first() {
        assert_eq!(file_names(Some(12)).next(), Some("libnvrtc.so.12"));
        assert_eq!(file_names(None).next(), Some("libnvrtc.so.12"));
        assert_eq!(file_names(Some(13)).next(), Some("libnvrtc.so.13"));
    }
}

//! Finding the real NCCL, once, lazily and thread-safely.
//!
//! Order (first match wins):
//! 1. `STRAGGLAR_NCCL_LIB`, an absolute path, opened `RTLD_LOCAL | RTLD_DEEPBIND`. If it is set
//!    but cannot be used, binding fails: a wrong explicit path is reported, not papered over.
//! 2. An object already loaded in the process whose file name is `libnccl.so*`, that defines
//!    `pncclGetVersion` or `ncclGetVersion` itself, and that is not a stragglar library. This is
//!    how we find the copy PyTorch loaded into a local scope, where `RTLD_NEXT` sees nothing.
//! 3. `dlopen("libnccl.so.2", RTLD_LOCAL | RTLD_DEEPBIND)`, unless that returns a stragglar
//!    library (for example a copy of ours installed under that name).
//!
//! A stragglar library is any object that defines `stragglarGetVersion`: we never bind to
//! ourselves or to another copy of ourselves, so forwarding can never loop.

use std::ffi::{c_void, CStr, CString};
use std::os::raw::{c_char, c_int};

use once_cell::sync::OnceCell;

use crate::config;

/// The real NCCL this process forwards to. Lives for the whole process (never closed).
#[derive(Debug)]
pub struct RealNccl {
    handle: Handle,
    /// Path of the library file, as the loader knows it.
    pub path: String,
    /// `NCCL_VERSION_CODE` the library reports (e.g. 23203), if it answered.
    pub version: Option<c_int>,
    /// How it was found.
    pub found_by: FoundBy,
}

/// How the real NCCL was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// The path in `STRAGGLAR_NCCL_LIB`.
    Environment,
    /// An object already loaded in the process.
    AlreadyLoaded,
    /// `dlopen("libnccl.so.2")` through the normal search path.
    SearchPath,
}

/// Why no real NCCL could be bound. Every forwarded call then returns `ncclSystemError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindError {
    /// `STRAGGLAR_NCCL_LIB` is set but is not an absolute path to a usable NCCL.
    BadEnvironmentPath { path: String, reason: String },
    /// Nothing named libnccl.so.2 could be found.
    NotFound { reason: String },
    /// The only libnccl.so.2 found is a stragglar library.
    OnlyFoundSelf { path: String },
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BindError::BadEnvironmentPath { path, reason } => write!(
                f,
                "STRAGGLAR_NCCL_LIB={path} cannot be used ({reason}); set it to the absolute path of the real libnccl.so.2"
            ),
            BindError::NotFound { reason } => write!(
                f,
                "no real NCCL found ({reason}); set STRAGGLAR_NCCL_LIB to the absolute path of libnccl.so.2"
            ),
            BindError::OnlyFoundSelf { path } => write!(
                f,
                "libnccl.so.2 resolves to stragglar itself ({path}); set STRAGGLAR_NCCL_LIB to the absolute path of the real libnccl.so.2"
            ),
        }
    }
}

/// A `dlopen` handle. Never closed, so symbols resolved from it stay valid forever.
#[derive(Debug)]
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is an opaque token that glibc allows any thread to use with dlsym.
unsafe impl Send for Handle {}
// SAFETY: as above; we never mutate through it.
unsafe impl Sync for Handle {}

static BINDING: OnceCell<Result<RealNccl, BindError>> = OnceCell::new();

/// The bound real NCCL, found on first use. Logs the outcome once (INFO on success, one WARN on
/// failure).
pub fn binding() -> Result<&'static RealNccl, &'static BindError> {
    BINDING
        .get_or_init(|| {
            let result = bind(config::get().nccl_lib.as_deref());
            match &result {
                Ok(real) => log::info!(
                    "bound real NCCL {} at {} (found by {:?}); stragglar {}",
                    real.version
                        .map_or("(version unknown)".to_string(), version_string),
                    real.path,
                    real.found_by,
                    env!("CARGO_PKG_VERSION"),
                ),
                Err(e) => log::warn!("{e}"),
            }
            result
        })
        .as_ref()
}

/// Formats an NCCL version code as `major.minor.patch`.
pub fn version_string(code: c_int) -> String {
    let (major, rest) = if code >= 10000 {
        (code / 10000, code % 10000)
    } else {
        (code / 1000, code % 1000)
    };
    format!("{}.{}.{}", major, rest / 100, rest % 100)
}

impl RealNccl {
    /// Looks a name up in the real library only (not in the global scope).
    pub fn lookup(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: the handle is a live dlopen handle and `name` is NUL-terminated.
        let addr = unsafe { libc::dlsym(self.handle.0, name.as_ptr()) };
        (!addr.is_null()).then_some(addr)
    }
}

fn bind(env_path: Option<&str>) -> Result<RealNccl, BindError> {
    if let Some(path) = env_path {
        return open_env_path(path);
    }
    if let Some((handle, path)) = find_loaded() {
        return Ok(finish(handle, path, FoundBy::AlreadyLoaded));
    }
    let handle = dl_open(
        c"libnccl.so.2",
        libc::RTLD_LAZY | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
    )
    .map_err(|reason| BindError::NotFound { reason })?;
    let path = handle_path(handle).unwrap_or_else(|| "libnccl.so.2".to_string());
    if is_stragglar(handle) {
        return Err(BindError::OnlyFoundSelf { path });
    }
    Ok(finish(handle, path, FoundBy::SearchPath))
}

fn open_env_path(path: &str) -> Result<RealNccl, BindError> {
    let bad = |reason: String| BindError::BadEnvironmentPath {
        path: path.to_string(),
        reason,
    };
    if !path.starts_with('/') {
        return Err(bad("not an absolute path".into()));
    }
    let cpath = CString::new(path).map_err(|_| bad("contains a NUL byte".into()))?;
    let handle = dl_open(
        &cpath,
        libc::RTLD_LAZY | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND,
    )
    .map_err(bad)?;
    if is_stragglar(handle) {
        return Err(bad("it is a stragglar library, not NCCL".into()));
    }
    if defines_itself(handle, c"pncclGetVersion").is_none()
        && defines_itself(handle, c"ncclGetVersion").is_none()
    {
        return Err(bad("it does not define ncclGetVersion".into()));
    }
    Ok(finish(handle, path.to_string(), FoundBy::Environment))
}

fn finish(handle: *mut c_void, path: String, found_by: FoundBy) -> RealNccl {
    let real = RealNccl {
        handle: Handle(handle),
        path,
        version: None,
        found_by,
    };
    let version = query_version(&real);
    RealNccl { version, ..real }
}

fn query_version(real: &RealNccl) -> Option<c_int> {
    let addr = real
        .lookup(c"pncclGetVersion")
        .or_else(|| real.lookup(c"ncclGetVersion"))?;
    // SAFETY: ncclGetVersion has had this signature in every NCCL release.
    let get_version: unsafe extern "C" fn(*mut c_int) -> c_int =
        unsafe { std::mem::transmute(addr) };
    let mut version: c_int = 0;
    // SAFETY: the callee writes one int through a valid pointer.
    let rc = unsafe { get_version(&mut version) };
    (rc == 0).then_some(version)
}

fn dl_open(name: &CStr, flags: c_int) -> Result<*mut c_void, String> {
    // SAFETY: `name` is NUL-terminated; dlopen has no other preconditions.
    let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
    if handle.is_null() {
        Err(dl_error())
    } else {
        Ok(handle)
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the loader.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-NULL dlerror results are valid C strings until the next dl* call.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether the object behind `handle` defines `stragglarGetVersion`.
fn is_stragglar(handle: *mut c_void) -> bool {
    defines_itself(handle, c"stragglarGetVersion").is_some()
}

/// Resolves `name` on `handle` and returns the address only if the object of the handle defines
/// it (dlsym on a handle also searches the object's dependencies).
fn defines_itself(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: live handle, NUL-terminated name.
    let addr = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if addr.is_null() {
        return None;
    }
    let object = link_map(handle)?;
    (defining_link_map(addr)? == object).then_some(addr)
}

/// The `struct link_map` of the object behind a dlopen handle.
fn link_map(handle: *mut c_void) -> Option<*mut c_void> {
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map *` into `map`.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map) as *mut _ as *mut c_void,
        )
    };
    (rc == 0 && !map.is_null()).then_some(map)
}

/// glibc's `RTLD_DL_LINKMAP` flag of `dladdr1` (not exported by the libc crate).
const RTLD_DL_LINKMAP: libc::c_int = 2;

/// The `struct link_map` of the object that contains `addr`, per `dladdr1`: comparing link maps
/// identifies an object exactly, whatever its load bias or first segment's address.
fn defining_link_map(addr: *mut c_void) -> Option<*mut c_void> {
    // SAFETY: Dl_info is plain data; dladdr1 fills it or returns 0.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointers; RTLD_DL_LINKMAP makes `map` receive a `struct link_map *`.
    let rc = unsafe { libc::dladdr1(addr, &mut info, &mut map, RTLD_DL_LINKMAP) };
    (rc != 0 && !map.is_null()).then_some(map)
}

/// The first two fields of glibc's public `struct link_map`.
#[repr(C)]
struct LinkMapHead {
    /// Load bias (unused here; present for the layout).
    _l_addr: usize,
    l_name: *const c_char,
}

fn handle_path(handle: *mut c_void) -> Option<String> {
    let map = link_map(handle)?;
    // SAFETY: glibc's link_map begins with `ElfW(Addr) l_addr; char *l_name;`.
    let link = unsafe { &*(map as *const LinkMapHead) };
    if link.l_name.is_null() {
        return None;
    }
    // SAFETY: l_name is a NUL-terminated string owned by the loader (checked non-NULL).
    Some(
        unsafe { CStr::from_ptr(link.l_name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Walks the objects already loaded for a real NCCL (see the module docs, step 2).
fn find_loaded() -> Option<(*mut c_void, String)> {
    let mut paths: Vec<String> = Vec::new();
    // SAFETY: the callback only reads the entries it is given and pushes into `paths`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(collect_nccl_paths),
            (&mut paths) as *mut Vec<String> as *mut c_void,
        )
    };
    paths.into_iter().find_map(|path| {
        let cpath = CString::new(path.clone()).ok()?;
        let handle = dl_open(&cpath, libc::RTLD_LAZY | libc::RTLD_NOLOAD).ok()?;
        let is_real = !is_stragglar(handle)
            && (defines_itself(handle, c"pncclGetVersion").is_some()
                || defines_itself(handle, c"ncclGetVersion").is_some());
        is_real.then_some((handle, path))
    })
}

unsafe extern "C" fn collect_nccl_paths(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid entry and our `data` pointer.
    let (info, paths) = unsafe { (&*info, &mut *(data as *mut Vec<String>)) };
    if info.dlpi_name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
    let file = name.rsplit('/').next().unwrap_or("");
    if file.starts_with("libnccl.so") {
        paths.push(name.into_owned());
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_both_encodings() {
        assert_eq!(version_string(23203), "2.32.3");
        assert_eq!(version_string(22105), "2.21.5");
        assert_eq!(version_string(2804), "2.8.4");
    }

    #[test]
    fn relative_env_path_is_refused() {
        let e = bind(Some("libnccl.so.2")).unwrap_err();
        assert!(matches!(e, BindError::BadEnvironmentPath { .. }), "{e:?}");
        assert!(e.to_string().contains("STRAGGLAR_NCCL_LIB"));
    }

    #[test]
    fn missing_env_path_is_refused() {
        let e = bind(Some("/nonexistent/libnccl.so.2")).unwrap_err();
        assert!(matches!(e, BindError::BadEnvironmentPath { .. }), "{e:?}");
    }

    #[test]
    fn a_library_without_nccl_is_refused() {
        let e = bind(Some("/lib/x86_64-linux-gnu/libm.so.6")).unwrap_err();
        assert!(
            e.to_string().contains("does not define ncclGetVersion"),
            "{e}"
        );
    }

    /// Binds the wheel's libnccl when the test environment names it (scripts/test.sh does).
    #[test]
    fn binds_the_real_library_from_the_environment() {
        let Ok(path) = std::env::var("STRAGGLAR_TEST_REAL_NCCL") else {
            eprintln!("STRAGGLAR_TEST_REAL_NCCL unset: skipped");
            return;
        };
        let real = bind(Some(&path)).expect("the wheel's libnccl binds");
        assert_eq!(real.found_by, FoundBy::Environment);
        assert!(real.version.unwrap() >= 21800, "{:?}", real.version);
        assert!(real.lookup(c"pncclAllReduce").is_some());
    }
}

//! The C ABI from C programs, against the real libnccl of the nvidia-nccl-cu12 wheel, in every
//! way an application can reach us: linked (`-lstragglar`), preloaded, with no NCCL at all,
//! installed under the name libnccl.so.2, and opened by path like vLLM's `VLLM_NCCL_SO_PATH`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

const SMOKE: &str = "tests/c/abi_smoke.c";

fn real_version(real: &Path) -> String {
    // The wheel's version code, asked of the real library directly.
    let out = run(Command::new("python3").arg("-c").arg(format!(
        "import ctypes; l = ctypes.CDLL('{}'); v = ctypes.c_int(); l.ncclGetVersion(ctypes.byref(v)); print(v.value)",
        real.display()
    )));
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn linked_with_stragglar(dir: &Path) -> PathBuf {
    let exe = dir.join("abi_smoke_stragglar");
    let lib = lib_dir();
    compile_c(
        &root().join(SMOKE),
        &exe,
        &[
            format!("-L{}", lib.display()),
            "-lstragglar".into(),
            format!("-Wl,-rpath,{}", lib.display()),
        ],
    );
    exe
}

fn linked_with_real(dir: &Path, real: &Path) -> PathBuf {
    let exe = dir.join("abi_smoke_real");
    let real_dir = real.parent().unwrap();
    compile_c(
        &root().join(SMOKE),
        &exe,
        &[
            format!("-L{}", real_dir.display()),
            "-l:libnccl.so.2".into(),
            format!("-Wl,-rpath,{}", real_dir.display()),
        ],
    );
    exe
}

/// The lines both link modes must agree on.
fn observations(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn linked_and_preloaded_programs_see_the_real_nccl() {
    let Some(real) = real_nccl() else { return };
    let version = real_version(&real);
    let dir = scratch("c_abi_linked");

    // (a) linked with -lstragglar, the real library named by STRAGGLAR_NCCL_LIB.
    let a = run(clean_command(&linked_with_stragglar(&dir))
        .args(["bound", &version])
        .env("STRAGGLAR_NCCL_LIB", &real));
    assert!(a.status.success(), "(a) {}", describe(&a));

    // (b) linked with the real libnccl, our library preloaded; found without any variable.
    let b = run(clean_command(&linked_with_real(&dir, &real))
        .args(["bound", &version])
        .env("LD_PRELOAD", stragglar_so())
        .env("STRAGGLAR_DEBUG", "INFO"));
    assert!(b.status.success(), "(b) {}", describe(&b));
    let log = String::from_utf8_lossy(&b.stderr);
    assert!(
        log.contains("STRAGGLAR INFO bound real NCCL"),
        "(b) interception not visible:\n{log}"
    );
    assert!(
        log.contains("found by AlreadyLoaded"),
        "(b) should bind the already-loaded copy:\n{log}"
    );

    assert_eq!(
        observations(&a.stdout),
        observations(&b.stdout),
        "(a) and (b) disagree"
    );
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.contains(&format!("version: {version}")));
    assert!(text.contains("error string 8: timeout"), "{text}");
}

#[test]
fn no_real_nccl_gives_clean_errors() {
    let dir = scratch("c_abi_unbound");
    // (c) nothing named libnccl.so.2 anywhere the loader looks.
    let c = run(clean_command(&linked_with_stragglar(&dir)).arg("unbound"));
    assert!(c.status.success(), "(c) {}", describe(&c));
    let log = String::from_utf8_lossy(&c.stderr);
    assert_eq!(
        log.matches("set STRAGGLAR_NCCL_LIB").count(),
        1,
        "one WARN:\n{log}"
    );

    // A wrong explicit path is reported, not replaced by a search.
    let wrong = run(clean_command(&linked_with_stragglar(&dir))
        .arg("unbound")
        .env("STRAGGLAR_NCCL_LIB", "/nonexistent/libnccl.so.2"));
    assert!(wrong.status.success(), "{}", describe(&wrong));
    assert!(String::from_utf8_lossy(&wrong.stderr)
        .contains("STRAGGLAR_NCCL_LIB=/nonexistent/libnccl.so.2 cannot be used"));
}

#[test]
fn a_copy_named_libnccl_so_2_forwards_without_looping() {
    let Some(real) = real_nccl() else { return };
    let version = real_version(&real);
    let dir = scratch("c_abi_masquerade");
    let fake_dir = dir.join("fake");
    std::fs::create_dir_all(&fake_dir).unwrap();
    std::fs::copy(stragglar_so(), fake_dir.join("libnccl.so.2")).unwrap();
    let exe = linked_with_real(&dir, &real);

    // (d) our copy is found first; with the real path given, everything forwards.
    let d = run(clean_command(&exe)
        .args(["bound", &version])
        .env("LD_LIBRARY_PATH", &fake_dir)
        .env("STRAGGLAR_NCCL_LIB", &real));
    assert!(d.status.success(), "(d) {}", describe(&d));
}

#[test]
fn a_copy_named_libnccl_so_2_never_binds_to_itself() {
    let dir = scratch("c_abi_self");
    let fake_dir = dir.join("fake");
    std::fs::create_dir_all(&fake_dir).unwrap();
    std::fs::copy(stragglar_so(), fake_dir.join("libnccl.so.2")).unwrap();
    let exe = dir.join("abi_smoke_fake");
    compile_c(
        &root().join(SMOKE),
        &exe,
        &[
            format!("-L{}", fake_dir.display()),
            "-l:libnccl.so.2".into(),
        ],
    );
    let out = run(clean_command(&exe)
        .arg("unbound")
        .env("LD_LIBRARY_PATH", &fake_dir));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("resolves to stragglar itself"),
        "{}",
        describe(&out)
    );
}

#[test]
fn a_loader_that_opens_us_by_path_reaches_the_real_nccl() {
    let Some(real) = real_nccl() else { return };
    let version = real_version(&real);
    // (e) ctypes.CDLL(path) + attribute lookup, the way vLLM loads VLLM_NCCL_SO_PATH.
    let script = format!(
        r#"
import ctypes
lib = ctypes.CDLL('{so}')
v = ctypes.c_int()
assert lib.ncclGetVersion(ctypes.byref(v)) == 0, 'version'
assert v.value == {version}, v.value
uid = ctypes.create_string_buffer(128)
assert lib.ncclGetUniqueId(uid) == 0, 'unique id'
assert any(uid.raw), 'unique id is not all zeros'
lib.ncclGetErrorString.restype = ctypes.c_char_p
assert lib.ncclGetErrorString(4).startswith(b'invalid argument')
print('ok')
"#,
        so = stragglar_so().display()
    );
    let out = run(Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("STRAGGLAR_NCCL_LIB", &real)
        .env_remove("LD_PRELOAD"));
    assert!(out.status.success(), "(e) {}", describe(&out));
}

#[test]
fn every_name_the_wheel_exports_is_exported_by_us() {
    let Some(real) = real_nccl() else { return };
    let names = |path: &Path| -> Vec<String> {
        let out = run(Command::new("nm").args(["-D", "--defined-only"]).arg(path));
        assert!(out.status.success(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
            .filter(|n| n.starts_with("nccl") || n.starts_with("pnccl"))
            .collect()
    };
    let ours = names(&stragglar_so());
    let missing: Vec<String> = names(&real)
        .into_iter()
        .filter(|n| !ours.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "not exported by libstragglar.so: {missing:?}"
    );
    assert!(ours.len() >= 193, "{} names", ours.len());
}

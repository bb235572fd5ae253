//! Gives the crate a build identity: `STRAGGLAR_SOURCE_HASH`, an FNV-1a hash of every file under
//! `src/` and `cuda/` (paths and contents, in path order). Ranks of one communicator compare it
//! at setup, since two builds may lower different plans for the same call.

use std::path::{Path, PathBuf};

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(hash, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

fn main() {
    let mut files = Vec::new();
    for dir in ["src", "cuda"] {
        println!("cargo:rerun-if-changed={dir}");
        files_under(Path::new(dir), &mut files);
    }
    files.sort();
    let mut hash = 0xcbf2_9ce4_8422_2325;
    for file in &files {
        hash = fnv1a(hash, file.to_string_lossy().as_bytes());
        hash = fnv1a(hash, &std::fs::read(file).unwrap_or_default());
    }
    println!("cargo:rustc-env=STRAGGLAR_SOURCE_HASH={hash:016x}");
}

//! The shortened soak CI runs (scripts/soak.sh runs the full one): seeded random AllReduce
//! calls on the host engine, every element checked, every rank compared bit for bit.

mod support;

use std::path::Path;

use support::*;

#[test]
fn a_shortened_soak_finds_nothing_wrong() {
    let out = run(
        clean_command(Path::new(env!("CARGO_BIN_EXE_stragglar"))).args([
            "soak",
            "--calls",
            "500",
            "--max-bytes",
            "512K",
            "--seed",
            "2026",
            "--seconds",
            "300",
        ]),
    );
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("calls 0..500 (500 run)"), "{text}");
    assert!(
        text.contains("wrong elements 0  rank disagreements 0  failures 0"),
        "{text}"
    );
}

#[test]
fn a_soak_resumes_at_a_communicator_boundary() {
    let soak = |from: &str| {
        run(
            clean_command(Path::new(env!("CARGO_BIN_EXE_stragglar"))).args([
                "soak",
                "--calls",
                "120",
                "--from-call",
                from,
                "--max-bytes",
                "64K",
                "--seed",
                "7",
            ]),
        )
    };
    let out = soak("80");
    assert!(out.status.success(), "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("calls 80..120 (40 run)"), "{text}");
    assert!(text.contains("communicators 2 to 3"), "{text}");
    assert_eq!(
        soak("81").status.code(),
        Some(2),
        "not a communicator boundary"
    );
}

//! No export can forget to check an output pointer: every `*mut` parameter of every export in
//! `src/abi` goes through one of the two checks that refuse NULL with `ncclInvalidArgument`
//! and one WARN (`forward!`'s `outputs` clause, or `guard::reject_null` naming it), or is listed
//! below as something other than an output, with the reason.

mod support;

use std::path::Path;

use support::exports::{exports, Export};

/// `*mut` parameters that are not outputs this library writes or must check: (the function,
/// or `None` for any; the parameter; why).
const NOT_OUTPUTS: [(Option<&str>, &str, &str); 11] = [
    (
        None,
        "recvbuff",
        "a device buffer, which NCCL checks against the count",
    ),
    (
        None,
        "buff",
        "a device buffer NCCL registers or broadcasts in place",
    ),
    (
        None,
        "config",
        "an input NCCL's API declares mutable; NULL means the defaults",
    ),
    (
        Some("ncclMemFree"),
        "ptr",
        "the pointer to free (NULL is allowed, as for free)",
    ),
    (
        Some("ncclCommDeregister"),
        "handle",
        "the registration to release, an input",
    ),
    (
        Some("ncclCommInitRankScalable"),
        "commIds",
        "an input array of unique ids",
    ),
    (
        Some("ncclCommShrink"),
        "excludeRanksList",
        "an input array of ranks",
    ),
    (
        Some("ncclWaitSignal"),
        "signalDescs",
        "an input array of signal descriptors",
    ),
    (
        Some("ncclGroupSimulateEnd"),
        "simInfo",
        "in and out: NCCL reads its initialised size and version first",
    ),
    (
        Some("ncclParamGet"),
        "out",
        "a buffer of maxLen bytes (NULL with maxLen 0 asks for the length)",
    ),
    (
        Some("ncclRedOpCreatePreMulSum"),
        "scalar",
        "the op's scalar, an input in host or device memory",
    ),
];

/// Whether `name` of `function` is listed as no output.
fn not_an_output(function: &str, name: &str) -> bool {
    NOT_OUTPUTS
        .iter()
        .any(|&(f, n, _)| n == name && f.is_none_or(|f| f == function))
}

/// Whether `export` checks its parameter `name` through one of the two checks.
fn checked(export: &Export, name: &str) -> bool {
    let body = &export.body;
    let in_outputs = body.match_indices("outputs ").any(|(at, _)| {
        let clause = &body[at + "outputs ".len()..];
        let clause = &clause[..clause.find(')').unwrap_or(clause.len())];
        clause.split([',', ' ']).any(|w| w.trim() == name)
    });
    let refused = body.match_indices("reject_null(").any(|(at, _)| {
        let call = &body[at..];
        let call = &call[..call.find(')').unwrap_or(call.len())];
        call.contains(&format!("\"{name}\""))
    });
    in_outputs || refused
}

#[test]
fn every_output_pointer_is_checked_by_one_of_the_two_checks() {
    let abi = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/abi");
    let mut unchecked = Vec::new();
    let mut outputs = 0;
    for entry in std::fs::read_dir(&abi).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        // The twins are their functions under other names (tests/twins.rs).
        if file.ends_with("twins.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for export in exports(&source) {
            for (name, ty) in &export.params {
                if !ty.starts_with("*mut") || not_an_output(&export.name, name) {
                    continue;
                }
                outputs += 1;
                if !checked(&export, name) {
                    unchecked.push(format!("{file}: {}({name})", export.name));
                }
            }
        }
    }
    assert!(outputs > 40, "the scan finds the outputs ({outputs})");
    assert!(
        unchecked.is_empty(),
        "output pointers no check refuses when NULL:\n{}",
        unchecked.join("\n")
    );
}

#[test]
fn the_scan_tells_a_checked_output_from_a_forgotten_one() {
    let source = "#[no_mangle]\npub extern \"C\" fn a(c: ncclComm_t, n: *mut c_int) -> ResultCode {\n    forward!(a(c, n); live c; outputs n)\n}\n\n#[no_mangle]\npub extern \"C\" fn b(n: *mut c_int) -> ResultCode {\n    forward!(b(n))\n}\n\n#[no_mangle]\npub extern \"C\" fn d(n: *mut c_int) -> ResultCode {\n    if n.is_null() { return reject_null(&W, \"d\", \"n\"); }\n}\n";
    let found = exports(source);
    assert!(checked(&found[0], "n"));
    assert!(!checked(&found[1], "n"));
    assert!(checked(&found[2], "n"));
}

//! The profiling twins `pncclX` are generated from their `ncclX`, so that no twin can drift
//! from its function: each twin has the same signature and calls the same function. The files
//! are written by this test (`STRAGGLAR_BLESS=1 cargo test --test twins`) and compared with
//! what is committed otherwise.

use std::path::{Path, PathBuf};

/// `ncclX` exports NCCL ships without a `pncclX` twin.
const WITHOUT_TWIN: [&str; 1] = ["ncclResetDebugInitInternal"];

/// The modules whose `ncclX` exports get twins, and the generated file each group goes to:
/// `twins.rs` for the functions of `nccl.h`, `device_twins.rs` for the device API.
const GROUPS: [(&str, &str, &[&str]); 2] = [
    (
        "twins.rs",
        "the functions of `nccl.h`",
        &[
            "allreduce",
            "errors",
            "groups",
            "lifecycle",
            "passthrough",
            "redops",
        ],
    ),
    (
        "device_twins.rs",
        "the host functions of NCCL's device API",
        &["device_api"],
    ),
];

/// One exported function: its name, its parameters as written, and its return type.
#[derive(Debug, PartialEq)]
struct Export {
    name: String,
    params: Vec<(String, String)>,
    returns: Option<String>,
}

fn abi() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/abi")
}

/// Splits `text` at the commas outside brackets.
fn split_top_level(text: &str) -> Vec<String> {
    let (mut parts, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    let mut previous = ' ';
    for c in text.chars() {
        match c {
            '(' | '[' | '<' => depth += 1,
            // The `>` of a `->` closes nothing.
            '>' if previous == '-' => {}
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        previous = c;
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect()
}

/// Every `#[no_mangle] pub extern "C" fn ncclX(...)` of `source`, in order.
fn exports(source: &str) -> Vec<Export> {
    const START: &str = "#[no_mangle]\npub extern \"C\" fn ";
    let mut found = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find(START) {
        rest = &rest[at + START.len()..];
        let open = rest.find('(').expect("a parameter list");
        let name = rest[..open].trim().to_string();
        // The parameter list ends at its matching parenthesis.
        let mut depth = 0;
        let close = rest
            .char_indices()
            .skip(open)
            .find(|&(_, c)| {
                depth += match c {
                    '(' => 1,
                    ')' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .expect("a closed parameter list")
            .0;
        let body = rest[close..].find('{').expect("a body") + close;
        let returns = rest[close + 1..body]
            .trim()
            .strip_prefix("->")
            .map(|r| r.split_whitespace().collect::<Vec<_>>().join(" "));
        let params = split_top_level(&rest[open + 1..close])
            .into_iter()
            .map(|p| {
                let (n, t) = p.split_once(':').expect("name: type");
                (n.trim().to_string(), t.trim().to_string())
            })
            .collect();
        if name.starts_with("nccl") && !WITHOUT_TWIN.contains(&name.as_str()) {
            found.push(Export {
                name,
                params,
                returns,
            });
        }
    }
    found
}

/// The raw C types the generated signatures use, for the file's one `use` line.
fn raw_types(exports: &[(&str, Export)]) -> Vec<&'static str> {
    let text: String = exports
        .iter()
        .flat_map(|(_, e)| {
            e.params
                .iter()
                .map(|(_, t)| t.clone())
                .chain(e.returns.clone())
        })
        .collect::<Vec<_>>()
        .join(" ");
    ["c_char", "c_int", "c_uint", "c_void"]
        .into_iter()
        .filter(|t| {
            text.split(|c: char| !c.is_alphanumeric() && c != '_')
                .any(|w| w == *t)
        })
        .collect()
}

/// The generated file for `modules`.
fn generate(what: &str, modules: &[&str]) -> String {
    let mut all = Vec::new();
    for module in modules {
        let source = std::fs::read_to_string(abi().join(format!("{module}.rs"))).unwrap();
        all.extend(exports(&source).into_iter().map(|e| (*module, e)));
    }
    let mut out = format!(
        "//! The profiling twins `pncclX` of {what}: NCCL exports both names, and tools\n\
         //! that define `ncclX` themselves call `pncclX` to reach the library. Each twin is its\n\
         //! function under the other name: same signature, same checks, same route.\n\
         //!\n\
         //! Generated by tests/twins.rs (`STRAGGLAR_BLESS=1 cargo test --test twins`); do not edit.\n\
         \n\
         #![allow(non_snake_case)]\n\n"
    );
    let raw = raw_types(&all);
    if !raw.is_empty() {
        let list = raw.join(", ");
        out += &match raw.len() {
            1 => format!("use std::os::raw::{list};\n\n"),
            _ => format!("use std::os::raw::{{{list}}};\n\n"),
        };
    }
    out += "use crate::nccl::types::*;\n";
    for (module, e) in &all {
        let params: Vec<String> = e.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let args: Vec<&str> = e.params.iter().map(|(n, _)| n.as_str()).collect();
        let returns = e
            .returns
            .as_ref()
            .map_or(String::new(), |r| format!(" -> {r}"));
        out += &format!(
            "\n/// The profiling twin of `{name}`: the same function.\n\
             #[no_mangle]\n\
             pub extern \"C\" fn p{name}({params}){returns} {{\n    super::{module}::{name}({args})\n}}\n",
            name = e.name,
            params = params.join(", "),
            args = args.join(", "),
        );
    }
    out
}

/// `rustfmt` applied to `text`, as `cargo fmt` leaves the committed file.
fn formatted(text: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("rustfmt")
        .args(["--edition", "2021", "--emit", "stdout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("rustfmt runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "rustfmt failed on the generated twins"
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_twins_are_generated_from_their_functions() {
    let bless = std::env::var_os("STRAGGLAR_BLESS").is_some();
    for (file, what, modules) in GROUPS {
        let generated = formatted(&generate(what, modules));
        let path = abi().join(file);
        if bless {
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "src/abi/{file} differs from what its functions generate; run STRAGGLAR_BLESS=1 cargo test --test twins"
        );
    }
}

#[test]
fn no_hand_written_twin_is_left() {
    for entry in std::fs::read_dir(abi()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if GROUPS.iter().any(|(file, _, _)| *file == name) {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        assert!(
            !source.contains("pub extern \"C\" fn pnccl"),
            "src/abi/{name} defines a pncclX by hand"
        );
    }
}

#[test]
fn signatures_are_parsed_whole() {
    let source = "/// x\n#[no_mangle]\npub extern \"C\" fn ncclA(\n    comm: ncclComm_t,\n    f: Option<extern \"C\" fn(a: c_int) -> c_int>,\n) -> ResultCode {\n    body()\n}\n\n#[no_mangle]\npub extern \"C\" fn ncclB() {}\n";
    let found = exports(source);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].name, "ncclA");
    assert_eq!(
        found[0].params,
        vec![
            ("comm".to_string(), "ncclComm_t".to_string()),
            (
                "f".to_string(),
                "Option<extern \"C\" fn(a: c_int) -> c_int>".to_string()
            )
        ]
    );
    assert_eq!(found[0].returns.as_deref(), Some("ResultCode"));
    assert_eq!(found[1].returns, None);
}

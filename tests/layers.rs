//! The crate's rooms only point down: no cycle among the top-level modules of `src/`, nor
//! among the sibling modules of `engine::cuda` (the GPU engine's layers: driver, rank, setup,
//! comm, attach, library). A reference is any `crate::a` (or `$crate::a` in a macro) outside a
//! comment; within a room, `super::b` and `crate::room::b`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `path` (or `path` itself).
fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            files.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files
}

/// The code of `file` without its comments (line comments and doc comments).
fn code(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers that follow each occurrence of `prefix` in `text`.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    names
}

/// The modules of a room: each `.rs` file and each directory directly under `dir`.
fn modules(dir: &Path, skip: &[&str]) -> BTreeMap<String, PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            let module = p.is_dir() || p.extension().is_some_and(|e| e == "rs");
            (module && !skip.contains(&name.as_str())).then_some((name, p))
        })
        .collect()
}

/// A cycle of `graph`, if it has one, as the path around it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Fresh,
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in &graph[node] {
            match marks[next.as_str()] {
                Mark::Open => {
                    let from = path.iter().position(|n| n == next).unwrap();
                    let mut found = path[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Mark::Fresh => {
                    if let Some(found) = visit(next, graph, marks, path) {
                        return Some(found);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks: BTreeMap<String, Mark> =
        graph.keys().map(|k| (k.clone(), Mark::Fresh)).collect();
    for node in graph.keys() {
        if marks[node.as_str()] == Mark::Fresh {
            if let Some(found) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

/// The references among `rooms`, found by `references` in each one's code.
fn graph(
    rooms: &BTreeMap<String, PathBuf>,
    references: impl Fn(&str) -> BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    rooms
        .iter()
        .map(|(name, path)| {
            let mut to = BTreeSet::new();
            for file in sources(path) {
                to.extend(references(&code(&file)));
            }
            to.retain(|n| n != name && rooms.contains_key(n));
            (name.clone(), to)
        })
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_top_level_modules_have_no_cycle() {
    let rooms = modules(&src(), &["lib", "main"]);
    assert!(rooms.contains_key("engine") && rooms.contains_key("abi"));
    let graph = graph(&rooms, |code| names_after(code, "crate::"));
    assert!(
        graph["abi"].contains("engine"),
        "the scan sees references (abi calls the engine)"
    );
    if let Some(found) = cycle(&graph) {
        panic!("a module cycle in src/: {}", found.join(" -> "));
    }
}

#[test]
fn the_gpu_engine_layers_have_no_cycle() {
    let room = src().join("engine").join("cuda");
    let rooms = modules(&room, &["mod"]);
    assert!(rooms.contains_key("comm") && rooms.contains_key("library"));
    let graph = graph(&rooms, |code| {
        let mut names = names_after(code, "super::");
        names.extend(names_after(code, "crate::engine::cuda::"));
        names
    });
    assert!(
        graph["library"].contains("comm"),
        "the scan sees references"
    );
    if let Some(found) = cycle(&graph) {
        panic!("a module cycle in src/engine/cuda: {}", found.join(" -> "));
    }
}

#[test]
fn a_cycle_is_found() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")] {
        g.entry(a.into()).or_default().insert(b.into());
        g.entry(b.into()).or_default();
    }
    let found = cycle(&g).expect("a -> b -> c -> a");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
    g.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&g), None);
}

//! The crate's rooms only point down, in every folder of `src/`.
//!
//! Every path a source file names (`crate::a::b`, `super::b`, `self::b`, brace groups of them,
//! `$crate::` in macros; comments and string literals left out) is resolved to the module it
//! names, from the module the file (or its inline `mod x { .. }`) is. A reference from module
//! `p::a::..` to `p::b::..` is an edge `a -> b` among the children of folder `p`. Test code
//! (`#[cfg(test)] mod x { .. }`, and `tests.rs` files) may use any module and is left out. Every folder's
//! graph must be free of cycles, and the top-level rooms must keep the order [`TOP_LEVEL`]
//! declares: a room names only rooms after it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level rooms, from the ones nothing else may name (the entry points) to the ones
/// everything may (std-only leaves). A room refers only to rooms later in this list.
const TOP_LEVEL: &[&str] = &[
    "cli",
    "abi",
    "intercept",
    "engine",
    "registry",
    "nccl",
    "config",
    "trace",
    "gpu",
    "plan",
    "detect",
    "schedule",
    "reduce",
    "logging",
    "clock",
];

/// The rooms that are pure (no `unsafe`, no FFI, no global state): each forbids `unsafe`.
const PURE: &[&str] = &["schedule", "plan", "detect", "reduce"];

/// A module's path from the crate root (`["engine", "cuda", "rank"]`).
type ModPath = Vec<String>;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            files.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            files.push(p);
        }
    }
    files.sort();
    files
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module a file under `src/` is: `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and
/// `main.rs` the root.
fn module_of(file: &Path) -> ModPath {
    let relative = file.strip_prefix(src()).unwrap();
    let mut path: ModPath = relative
        .iter()
        .map(|c| c.to_str().unwrap().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// `text` without comments, string literals and character literals (each replaced by a space,
/// so that braces inside them do not count).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if c == 'r' && (next == Some('#') || next == Some('"')) && !ident_before(&chars, i) {
            // A raw string: r"..", r#".."#.
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let rest: String = chars[j..].iter().collect();
            let end = rest.find(&closing).map_or(chars.len(), |at| {
                j + rest[..at].chars().count() + closing.len()
            });
            i = end;
            out.push(' ');
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(' ');
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            out.push(' ');
        } else if c == '\'' && next == Some('\\') {
            // '\n', '\'', '\u{..}'
            let mut j = i + 2;
            while j < chars.len() && j < i + 12 && !(chars[j] == '\'' && j > i + 2) {
                j += 1;
            }
            i = j + 1;
            out.push(' ');
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_before(chars: &[char], at: usize) -> bool {
    at > 0 && is_ident(chars[at - 1])
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let end = text.find(|c: char| !is_ident(c)).unwrap_or(text.len());
    &text[..end]
}

/// Parses the path after `crate::` / `super::` / `self::` at `rest`: its segments, and each
/// item of a brace group as a path of its own (`{a, b::c}` -> `[a]`, `[b, c]`).
fn path_items(rest: &str) -> Vec<Vec<String>> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut end = group.len();
        for (at, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    end = at;
                    break;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        let mut items = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        let inner = &group[..end];
        for (at, c) in inner
            .char_indices()
            .chain(std::iter::once((inner.len(), ',')))
        {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.extend(path_items(&inner[start..at]));
                    start = at + 1;
                }
                _ => {}
            }
        }
        return items;
    }
    let head = ident(rest);
    if head.is_empty() {
        return Vec::new();
    }
    let after = &rest[head.len()..];
    let mut paths = match after.strip_prefix("::") {
        Some(tail) => path_items(tail),
        None => vec![Vec::new()],
    };
    if paths.is_empty() {
        paths.push(Vec::new());
    }
    for p in &mut paths {
        p.insert(0, head.to_string());
    }
    paths
}

/// Every module path `text` (the code of module `at`, inline modules included) refers to.
fn references(text: &str, at: &ModPath) -> Vec<(ModPath, ModPath)> {
    let chars: Vec<char> = text.chars().collect();
    // The inline modules open at each position: (name, brace depth it opened at, whether it is
    // `#[cfg(test)]`).
    let mut inline: Vec<(String, i32, bool)> = Vec::new();
    let mut depth = 0;
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
            if inline.last().is_some_and(|(_, d, _)| *d == depth) {
                inline.pop();
            }
        }
        let starts_word = !ident_before(&chars, i) && (i == 0 || chars[i - 1] != ':');
        if !starts_word || !(c.is_alphabetic() || c == '$') {
            i += 1;
            continue;
        }
        let rest: String = chars[i..chars.len().min(i + 4000)].iter().collect();
        let word = ident(rest.trim_start_matches('$'));
        let here: ModPath = at
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _, _)| n.clone()))
            .collect();
        let in_test = inline.iter().any(|(_, _, test)| *test);
        if word == "mod" {
            let tail = rest[3..].trim_start();
            let name = ident(tail);
            let opens = tail[name.len()..].trim_start().starts_with('{');
            if !name.is_empty() && opens {
                let before: String = chars[..i].iter().collect();
                let test_only = before.trim_end().ends_with("#[cfg(test)]");
                inline.push((name.to_string(), depth, test_only));
            }
        }
        let base: Option<(ModPath, usize)> = if rest.starts_with("crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with("$crate::") {
            Some((Vec::new(), "$crate::".len()))
        } else if rest.starts_with("self::") {
            Some((here.clone(), "self::".len()))
        } else if rest.starts_with("super::") {
            let mut base = here.clone();
            let mut skip = 0;
            while rest[skip..].starts_with("super::") {
                base.pop();
                skip += "super::".len();
            }
            Some((base, skip))
        } else {
            None
        };
        if let Some((base, skip)) = base {
            for item in path_items(&rest[skip..]).into_iter().filter(|_| !in_test) {
                let mut target = base.clone();
                target.extend(item.into_iter().filter(|s| s != "self"));
                found.push((here.clone(), target));
            }
            i += skip;
        } else {
            i += word.len().max(1);
        }
    }
    found
}

/// The child modules of each folder of `src/` (a folder's own `mod.rs` is the folder itself).
fn folders() -> BTreeMap<ModPath, BTreeSet<String>> {
    let mut folders: BTreeMap<ModPath, BTreeSet<String>> = BTreeMap::new();
    for file in sources(&src()) {
        let module = module_of(&file);
        if let Some((child, parent)) = module.split_last() {
            folders
                .entry(parent.to_vec())
                .or_default()
                .insert(child.clone());
        }
    }
    folders.retain(|_, children| children.len() > 1);
    folders
}

/// For each folder, the references among its children: `a -> b` when code in `p::a` (or below)
/// names `p::b` (or below).
fn graphs() -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let folders = folders();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = folders
        .iter()
        .map(|(folder, children)| {
            let empty = children.iter().map(|c| (c.clone(), BTreeSet::new()));
            (folder.clone(), empty.collect())
        })
        .collect();
    for file in sources(&src()) {
        let module = module_of(&file);
        if module.last().is_some_and(|m| m == "tests") {
            continue;
        }
        let text = code_only(&std::fs::read_to_string(&file).unwrap());
        for (from, to) in references(&text, &module) {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            let (Some(a), Some(b)) = (from.get(common), to.get(common)) else {
                continue;
            };
            let folder = from[..common].to_vec();
            if let Some(graph) = graphs.get_mut(&folder) {
                if graph.contains_key(b) {
                    if let Some(edges) = graph.get_mut(a) {
                        edges.insert(b.clone());
                    }
                }
            }
        }
    }
    graphs
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

/// The edges of `graph` that go against `order` (from a room to one before it).
fn upward(graph: &BTreeMap<String, BTreeSet<String>>, order: &[&str]) -> Vec<String> {
    let rank = |room: &str| order.iter().position(|r| *r == room);
    let mut found = Vec::new();
    for (from, to) in graph {
        for target in to {
            if rank(from) > rank(target) {
                found.push(format!("{from} -> {target}"));
            }
        }
    }
    found
}

#[test]
fn no_folder_has_a_cycle() {
    let graphs = graphs();
    // The scan sees references at every depth.
    assert!(graphs[&vec![]]["abi"].contains("intercept"));
    assert!(graphs[&vec!["engine".to_string(), "cuda".to_string()]]["library"].contains("comm"));
    assert!(graphs[&vec!["plan".to_string()]]["lower"].contains("layout"));
    let mut cycles = Vec::new();
    for (folder, graph) in &graphs {
        if let Some(found) = cycle(graph) {
            cycles.push(format!("src/{}: {}", folder.join("/"), found.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_top_level_rooms_only_point_down() {
    let graphs = graphs();
    let top = &graphs[&Vec::new()];
    let declared: BTreeSet<&str> = TOP_LEVEL.iter().copied().collect();
    let actual: BTreeSet<&str> = top.keys().map(String::as_str).collect();
    assert_eq!(declared, actual, "TOP_LEVEL lists every room of src/");
    // The exports reach the GPU engine through one door, `intercept::engine`.
    assert!(
        !top["abi"].contains("engine"),
        "abi names the engine: go through intercept::engine"
    );
    let against = upward(top, TOP_LEVEL);
    assert!(
        against.is_empty(),
        "imports against the layering {TOP_LEVEL:?}:\n{}",
        against.join("\n")
    );
}

#[test]
fn the_pure_rooms_forbid_unsafe() {
    for room in PURE {
        let text = std::fs::read_to_string(src().join(room).join("mod.rs")).unwrap();
        assert!(
            text.contains("#![forbid(unsafe_code)]"),
            "src/{room}/mod.rs forbids unsafe code"
        );
    }
}

#[test]
fn a_cycle_and_an_upward_import_are_found() {
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
    assert_eq!(upward(&g, &["d", "a", "b", "c"]), Vec::<String>::new());
    assert_eq!(
        upward(&g, &["a", "d", "b", "c"]),
        vec!["d -> a".to_string()]
    );
}

#[test]
fn paths_resolve_from_where_they_are_written() {
    let here: ModPath = vec!["detect".into(), "tracker".into()];
    let code = code_only(
        "use super::{policy::Choice, rule};\n\
         // crate::abi in a comment\n\
         let s = \"crate::cli in a string {\";\n\
         fn f() { crate::plan::Shape::new(); }\n\
         mod tests { use super::super::estimate::X; use self::inner::Y; }\n\
         #[cfg(test)]\n\
         mod checks { use crate::cli::Anything; }\n\
         use super::pipeline;",
    );
    let found: Vec<(String, String)> = references(&code, &here)
        .into_iter()
        .map(|(from, to)| (from.join("::"), to.join("::")))
        .collect();
    let expect = |from: &str, to: &str| (from.to_string(), to.to_string());
    assert_eq!(
        found,
        vec![
            expect("detect::tracker", "detect::policy::Choice"),
            expect("detect::tracker", "detect::rule"),
            expect("detect::tracker", "plan::Shape::new"),
            expect("detect::tracker::tests", "detect::estimate::X"),
            expect("detect::tracker::tests", "detect::tracker::tests::inner::Y"),
            expect("detect::tracker", "detect::pipeline"),
        ]
    );
}

//! Every document the project names exists in the repository: each `NAME.md` mentioned in the
//! README, the docs, the sources, the kernels, the headers, the scripts and the tests resolves
//! from the repository's root or from the mentioning file's folder, and nothing points outside
//! the repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files whose text is checked: everything under these paths but build outputs.
fn checked_files() -> Vec<PathBuf> {
    fn walk(path: &Path, out: &mut Vec<PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), out);
            }
        } else {
            out.push(path.to_path_buf());
        }
    }
    let mut files = Vec::new();
    for part in [
        "README.md",
        "Cargo.toml",
        "build.rs",
        "docs",
        "src",
        "cuda",
        "include",
        "scripts",
        "tests",
        ".ci",
    ] {
        let path = root().join(part);
        if path.exists() {
            walk(&path, &mut files);
        }
    }
    files
}

/// The `.md` names in `text`: each maximal run of path characters that ends in `.md`.
fn markdown_names(text: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    let bytes = text.as_bytes();
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(".md") {
        let end = from + at + 3;
        from = end;
        if bytes
            .get(end)
            .is_some_and(|&b| path_char(b as char) && b != b'.')
        {
            continue;
        }
        let start = text[..end - 3]
            .rfind(|c: char| !path_char(c))
            .map_or(0, |i| i + 1);
        let name = &text[start..end];
        if name.len() > 3 && !name.starts_with("//") {
            names.push(name.trim_start_matches("./").to_string());
        }
    }
    names
}

#[test]
fn every_mentioned_document_exists_in_the_repository() {
    let mut dangling = Vec::new();
    let mut checked = 0;
    for file in checked_files() {
        // This file's own examples name documents that do not exist.
        if file.ends_with("tests/doc_references.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let here = file.parent().unwrap();
        for name in markdown_names(&text) {
            checked += 1;
            let found = root().join(&name).exists() || here.join(&name).exists();
            let outside = name.contains("../");
            if !found || outside {
                dangling.push(format!(
                    "{}: {name}",
                    file.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(checked > 20, "the scan finds the documents' names");
    assert!(
        dangling.is_empty(),
        "dangling references:\n{}",
        dangling.join("\n")
    );
}

#[test]
fn names_are_found_in_prose_paths_and_links() {
    assert_eq!(
        markdown_names("see docs/ALGORITHM.md section 4, [it](SCHEDULES.md) and ../x/Y.md."),
        vec!["docs/ALGORITHM.md", "SCHEDULES.md", "../x/Y.md"]
    );
    assert!(markdown_names("a .mdx file, https://example.com/a.md, x.mdl").is_empty());
}

/// The README is for users: what they need fits on a few screens, and the design lives in docs/.
#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move design text to docs/"
    );
}

//! Reading the SVG pictures the CLI draws, with Python's XML parser (a real parser, so a
//! malformed file fails).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// `path`, parsed by Python's XML parser: the texts of its `<text>` elements, and how many
/// elements of each tag it holds (`tag:count` lines).
pub fn svg_contents(path: &Path) -> (Vec<String>, HashMap<String, usize>) {
    let script = r#"
import sys, collections, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
tags = collections.Counter(e.tag.split('}')[-1] for e in root.iter())
for tag, count in tags.items():
    print("tag", tag, count)
for e in root.iter():
    if e.tag.split('}')[-1] == 'text':
        print("text", (e.text or '').strip())
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "not XML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut texts, mut tags) = (Vec::new(), HashMap::new());
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        if let Some(text) = line.strip_prefix("text ") {
            texts.push(text.to_string());
        } else if let Some(rest) = line.strip_prefix("tag ") {
            let (tag, count) = rest.rsplit_once(' ').unwrap();
            tags.insert(tag.to_string(), count.parse().unwrap());
        }
    }
    (texts, tags)
}

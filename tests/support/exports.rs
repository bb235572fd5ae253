//! The exported C functions of `src/abi`, read from the source as text: what the tests that
//! check every export at once (generated twins, output pointers) walk over.

/// One exported function: its name, its parameters as written, and its return type.
#[derive(Debug, PartialEq)]
pub struct Export {
    pub name: String,
    pub params: Vec<(String, String)>,
    pub returns: Option<String>,
    /// The function's text after its signature, up to the next export.
    pub body: String,
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

/// Every `#[no_mangle] pub extern "C" fn` of `source`, in order.
pub fn exports(source: &str) -> Vec<Export> {
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
        let open_body = rest[close..].find('{').expect("a body") + close;
        let returns = rest[close + 1..open_body]
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
        let end = rest.find(START).unwrap_or(rest.len());
        let body = rest[open_body..end].to_string();
        found.push(Export {
            name,
            params,
            returns,
            body,
        });
    }
    found
}

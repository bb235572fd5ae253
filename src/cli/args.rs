//! A small command-line parser shared by every `stragglar` subcommand.
//!
//! Options are `--name value`, `--name=value`, `-x value` or bare flags. Every option a
//! subcommand reads is consumed; [`Args::finish`] then rejects anything left over, so a
//! mistyped flag is an error rather than silently ignored.

use std::fmt;
use std::str::FromStr;

/// A command-line error, printed to stderr by `main` with exit status 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The arguments of one subcommand, consumed option by option.
#[derive(Debug, Clone)]
pub struct Args {
    items: Vec<Option<String>>,
}

impl Args {
    /// Wraps the arguments that follow the subcommand name.
    pub fn new<I: IntoIterator<Item = String>>(items: I) -> Self {
        Args {
            items: items.into_iter().map(Some).collect(),
        }
    }

    /// Finds `names` (e.g. `["--ranks", "-n"]`) and removes it together with its value.
    /// Accepts `--name=value` for long names. Returns `Ok(None)` when absent.
    pub fn value(&mut self, names: &[&str]) -> Result<Option<String>, UsageError> {
        for i in 0..self.items.len() {
            let Some(item) = self.items[i].clone() else {
                continue;
            };
            for name in names {
                if item == *name {
                    self.items[i] = None;
                    let value = self.items.get_mut(i + 1).and_then(Option::take);
                    return match value {
                        Some(v) => Ok(Some(v)),
                        None => Err(UsageError(format!("{name} needs a value"))),
                    };
                }
                if let Some(v) = item
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('='))
                {
                    self.items[i] = None;
                    return Ok(Some(v.to_string()));
                }
            }
        }
        Ok(None)
    }

    /// Like [`Args::value`], parsed with `FromStr`; `what` names the expected form in errors.
    pub fn parsed<T: FromStr>(
        &mut self,
        names: &[&str],
        what: &str,
    ) -> Result<Option<T>, UsageError> {
        match self.value(names)? {
            None => Ok(None),
            Some(v) => v
                .parse::<T>()
                .map(Some)
                .map_err(|_| UsageError(format!("{}: expected {what}, got '{v}'", names[0]))),
        }
    }

    /// Removes a bare flag and says whether it was present.
    pub fn flag(&mut self, names: &[&str]) -> bool {
        for slot in self.items.iter_mut() {
            if slot.as_deref().is_some_and(|item| names.contains(&item)) {
                *slot = None;
                return true;
            }
        }
        false
    }

    /// Fails if any argument was not consumed.
    /// The arguments not taken yet (positional ones, after the options were taken); an
    /// option-like one among them is a usage error.
    pub fn rest(self) -> Result<Vec<String>, UsageError> {
        let left: Vec<String> = self.items.into_iter().flatten().collect();
        match left.iter().find(|a| a.starts_with('-')) {
            Some(option) => Err(UsageError(format!("unknown option '{option}'"))),
            None => Ok(left),
        }
    }

    pub fn finish(self) -> Result<(), UsageError> {
        let left: Vec<String> = self.items.into_iter().flatten().collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(UsageError(format!(
                "unexpected argument(s): {}",
                left.join(" ")
            )))
        }
    }
}

/// Parses a byte size with nccl-tests' suffixes (see `config::parse_bytes`).
pub fn parse_bytes(text: &str) -> Result<u64, UsageError> {
    crate::config::parse_bytes(text).ok_or_else(|| {
        UsageError(format!(
            "expected a size such as 64K, 8M or 1G, got '{text}'"
        ))
    })
}

/// Parses a comma-separated list, each item with `parse`.
pub fn parse_list<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, UsageError>,
) -> Result<Vec<T>, UsageError> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| parse(s.trim()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::new(s.split_whitespace().map(String::from))
    }

    #[test]
    fn values_flags_and_leftovers() {
        let mut a = args("--ranks 8 --json --bytes=1G -x");
        assert_eq!(a.value(&["--ranks"]).unwrap().as_deref(), Some("8"));
        assert_eq!(a.value(&["--bytes"]).unwrap().as_deref(), Some("1G"));
        assert!(a.flag(&["--json"]));
        assert!(!a.flag(&["--json"]));
        assert_eq!(a.finish().unwrap_err().0, "unexpected argument(s): -x");
    }

    #[test]
    fn missing_value_is_an_error() {
        let mut a = args("--ranks");
        assert!(a.value(&["--ranks"]).is_err());
    }

    #[test]
    fn parsed_reports_the_bad_value() {
        let mut a = args("--ranks eight");
        let e = a.parsed::<usize>(&["--ranks"], "an integer").unwrap_err();
        assert!(e.0.contains("eight"), "{e}");
    }

    #[test]
    fn sizes_use_powers_of_1024() {
        assert_eq!(parse_bytes("64").unwrap(), 64);
        assert_eq!(parse_bytes("8K").unwrap(), 8192);
        assert_eq!(parse_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("2GB").unwrap(), 2 << 30);
        assert!(parse_bytes("1Q").is_err());
        assert!(parse_bytes("").is_err());
        assert_eq!(parse_list("1K,2K", parse_bytes).unwrap(), vec![1024, 2048]);
    }
}

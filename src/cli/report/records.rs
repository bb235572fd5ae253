//! Reading the record files observe mode writes (`engine::cuda::observe`): one per rank and
//! communicator, named by the communicator's name, its rank and the writer's process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::engine::cuda::observe::{Collective, RECORD_END, RECORD_MAGIC};

/// The most ranks a record may name (a damaged size must not size the report's tables).
const MAX_RANKS: usize = 1 << 20;

/// What one rank measured on one communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct RankRecord {
    pub path: PathBuf,
    pub comm: u64,
    pub rank: usize,
    pub ranks: usize,
    pub host: String,
    pub pid: u32,
    pub gpu: String,
    /// The GPU's PCI bus id.
    pub pci: String,
    /// Calls numbered but not timed, and timed but not kept (0 in an unclosed record: not
    /// known).
    pub unobserved: u64,
    pub dropped: u64,
    /// Per call number: the collective, its size class and its duration on this rank, in
    /// nanoseconds.
    pub calls: BTreeMap<u64, (Collective, u32, u64)>,
    /// Whether the record has its closing line (its rank ended the communicator). An unclosed
    /// one stops where its writer last wrote: its process was killed, or still runs.
    pub closed: bool,
}

/// Parses one record file's text; the error names the line that does not read.
pub fn parse(path: &Path, text: &str) -> Result<RankRecord, String> {
    let bad = |line: usize, what: &str| format!("{}:{line}: {what}", path.display());
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let mut next = |key: &str| -> Result<(usize, String), String> {
        let (n, line) = lines
            .next()
            .ok_or_else(|| bad(0, &format!("ends before its {key} line")))?;
        let value = line
            .strip_prefix(key)
            .and_then(|v| v.strip_prefix(' '))
            .ok_or_else(|| bad(n, &format!("expected '{key} ...'")))?;
        Ok((n, value.to_string()))
    };
    let number = |n: usize, v: &str| -> Result<u64, String> {
        v.trim()
            .parse::<u64>()
            .map_err(|_| bad(n, &format!("'{v}' is not a number")))
    };
    match text.lines().next() {
        Some(RECORD_MAGIC) => {}
        _ => return Err(bad(1, &format!("not a record ('{RECORD_MAGIC}' expected)"))),
    }
    let _ = next("stragglar-observe");
    let (n, comm) = next("comm")?;
    let comm = u64::from_str_radix(comm.trim(), 16).map_err(|_| bad(n, "a bad name"))?;
    let (n, rank_of) = next("rank")?;
    let (rank, ranks) = rank_of
        .split_once(" of ")
        .ok_or_else(|| bad(n, "expected 'rank R of N'"))?;
    let (rank, ranks) = (number(n, rank)? as usize, number(n, ranks)? as usize);
    if ranks == 0 || rank >= ranks || ranks > MAX_RANKS {
        return Err(bad(n, "rank out of range"));
    }
    let host = next("host")?.1;
    let (n, pid) = next("pid")?;
    let pid = number(n, &pid)? as u32;
    let gpu = next("gpu")?.1;
    let pci = next("pci")?.1;
    let mut calls = BTreeMap::new();
    let mut closing = None;
    // A last line without its newline is an append its writer never finished (a killed
    // process): dropped, in an unclosed record.
    let torn = !text.ends_with('\n');
    let body: Vec<(usize, &str)> = lines.collect();
    for (i, &(n, line)) in body.iter().enumerate() {
        let last = i + 1 == body.len();
        if closing.is_some() {
            return Err(bad(n, "a line after the closing line"));
        }
        if let Some(end) = line
            .strip_prefix(RECORD_END)
            .and_then(|l| l.strip_prefix(' '))
        {
            let f: Vec<&str> = end.split_whitespace().collect();
            let ["unobserved", unobserved, "dropped", dropped, "calls", count] = f[..] else {
                return Err(bad(
                    n,
                    &format!("expected '{RECORD_END} unobserved U dropped D calls C'"),
                ));
            };
            closing = Some((
                n,
                number(n, unobserved)?,
                number(n, dropped)?,
                number(n, count)?,
            ));
            continue;
        }
        let sample = || -> Result<(u64, u32, u64, Collective), String> {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [call, class, ns, collective] = f[..] else {
                return Err(bad(n, "expected 'CALL CLASS NANOSECONDS COLLECTIVE'"));
            };
            let class = u32::try_from(number(n, class)?).map_err(|_| bad(n, "a bad class"))?;
            let collective = Collective::parse(collective)
                .ok_or_else(|| bad(n, &format!("'{collective}' is not a collective we observe")))?;
            Ok((number(n, call)?, class, number(n, ns)?, collective))
        };
        let (call, class, ns, collective) = match sample() {
            Ok(sample) => sample,
            Err(_) if last && torn => break,
            Err(e) => return Err(e),
        };
        if calls.insert(call, (collective, class, ns)).is_some() {
            return Err(bad(n, "a call listed twice"));
        }
    }
    let (unobserved, dropped) = match closing {
        Some((n, unobserved, dropped, count)) => {
            if calls.len() as u64 != count {
                return Err(bad(
                    n,
                    &format!("says {count} calls but lists {} (cut short?)", calls.len()),
                ));
            }
            (unobserved, dropped)
        }
        None => (0, 0),
    };
    Ok(RankRecord {
        path: path.to_path_buf(),
        comm,
        rank,
        ranks,
        host,
        pid,
        gpu,
        pci,
        unobserved,
        dropped,
        calls,
        closed: closing.is_some(),
    })
}

/// Every record file (`stragglar-*.rec`) in `dirs`, parsed, and an error for each directory or
/// file that does not read (the others are still read).
pub fn read_dirs(dirs: &[PathBuf]) -> (Vec<RankRecord>, Vec<String>) {
    let mut records = Vec::new();
    let mut errors = Vec::new();
    // A directory named twice (or through another path) is read once: its records are not
    // two jobs'.
    let mut read = std::collections::BTreeSet::new();
    for dir in dirs {
        if let Ok(canonical) = std::fs::canonicalize(dir) {
            if !read.insert(canonical) {
                continue;
            }
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                errors.push(format!("{}: {e}", dir.display()));
                continue;
            }
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| x == "rec")
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("stragglar-"))
            })
            .collect();
        paths.sort();
        for path in paths {
            let read = std::fs::read_to_string(&path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|text| parse(&path, &text));
            match read {
                Ok(record) => records.push(record),
                Err(e) => errors.push(e),
            }
        }
    }
    (records, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "stragglar-observe 2\ncomm 00000000000000ab\nrank 1 of 4\nhost h\npid 7\ngpu 0011\npci 0000:10:00.0\n0 13 1500 AllReduce\n1 13 1700 AllGather\nend unobserved 2 dropped 0 calls 2\n";

    #[test]
    fn a_bad_file_is_an_error_and_the_others_still_read() {
        let dir = std::env::temp_dir().join(format!("stragglar-records-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stragglar-a-rank0-1.rec"), GOOD).unwrap();
        std::fs::write(dir.join("stragglar-b-rank1-1.rec"), "garbage").unwrap();
        std::fs::write(dir.join("other.txt"), "not ours").unwrap();
        let (records, errors) = read_dirs(&[dir.clone(), dir.join("missing")]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.contains("stragglar-b-rank1-1.rec")));
        assert!(errors.iter().any(|e| e.contains("missing")));
    }

    #[test]
    fn a_record_reads_back_and_damage_is_named() {
        let r = parse(Path::new("x.rec"), GOOD).unwrap();
        assert_eq!((r.comm, r.rank, r.ranks, r.pid), (0xab, 1, 4, 7));
        assert_eq!(r.calls[&1], (Collective::AllGather, 13, 1700));
        assert_eq!(r.pci, "0000:10:00.0");
        assert_eq!(r.unobserved, 2);
        for (text, says) in [
            ("garbage", "not a record"),
            (
                &GOOD.replace("rank 1 of 4", "rank 4 of 4"),
                "rank out of range",
            ),
            (&GOOD.replace("1 13 1700 AllGather\n", ""), "cut short"),
            (
                &format!("{GOOD}2 13 1 AllReduce\n"),
                "after the closing line",
            ),
            (&GOOD.replace("dropped 0 calls", "calls"), "expected 'end"),
            (
                &GOOD.replace("AllGather\nend", "AllGather\n7 x\nend"),
                "expected 'CALL",
            ),
            (
                &GOOD.replace("1 13 1700 AllGather", "1 13"),
                "expected 'CALL",
            ),
            (&GOOD.replace("1 13 1700", "0 13 1700"), "twice"),
            (&GOOD.replace("AllGather", "Broadcast"), "not a collective"),
        ] {
            let e = parse(Path::new("x.rec"), text).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        assert!(r.closed);
    }

    #[test]
    fn an_unclosed_record_reads_up_to_its_last_whole_line() {
        // A process killed between two appends: the calls written so far, not closed.
        let unclosed = GOOD.replace("end unobserved 2 dropped 0 calls 2\n", "");
        let r = parse(Path::new("x.rec"), &unclosed).unwrap();
        assert!(!r.closed);
        assert_eq!(r.calls.len(), 2);
        assert_eq!((r.unobserved, r.dropped), (0, 0));
        // Killed inside an append: its torn last line is left out.
        for torn in ["2 13 17", "2 13", "2", "2 13 1700 AllRed"] {
            let r = parse(Path::new("x.rec"), &format!("{unclosed}{torn}")).unwrap();
            assert_eq!(r.calls.len(), 2, "{torn}");
        }
        // A whole line that does not read is still an error.
        let e = parse(Path::new("x.rec"), &format!("{unclosed}2 13\n")).unwrap_err();
        assert!(e.contains("expected 'CALL"), "{e}");
    }
}

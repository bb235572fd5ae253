//! Chrome trace JSON (`STRAGGLAR_TRACE_DIR`): one file per rank, one complete event per
//! AllReduce with its algorithm, size, lateness and straggler, which Perfetto and
//! chrome://tracing open. Written as calls complete; the file is closed (made valid JSON) when
//! the writer drops.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One AllReduce as the trace shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallEvent {
    /// When this rank entered the call, and how long it took, in microseconds.
    pub start_us: f64,
    pub duration_us: f64,
    pub bytes: u64,
    /// `"stragglar"`, `"ring"` or `"nccl"`.
    pub algorithm: &'static str,
    /// The straggler the call's schedule assumed, if any.
    pub straggler: Option<usize>,
    /// The rank that arrived last, and by how much it trailed the second-to-last (µs; `None`
    /// where not measured).
    pub last_rank: Option<usize>,
    pub lead_us: Option<f64>,
    /// The rank designated for later calls after this one, if any.
    pub designated: Option<usize>,
    /// The call's post-arrival time (µs): from the last rank's arrival to that rank's finish,
    /// as the policy measured it; `None` where it was not measured.
    pub post_us: Option<f64>,
}

/// A per-rank trace file.
pub struct TraceWriter {
    out: BufWriter<File>,
    path: PathBuf,
    rank: usize,
    events: u64,
}

impl TraceWriter {
    /// Creates `dir/stragglar-trace-rank<R>-pid<P>.json`.
    pub fn create(dir: &Path, rank: usize) -> std::io::Result<TraceWriter> {
        Self::create_labelled(dir, rank, "")
    }

    /// Creates `dir/stragglar-trace-rank<R>-pid<P><label>.json` (a label tells apart the
    /// communicators of one process).
    pub fn create_labelled(dir: &Path, rank: usize, label: &str) -> std::io::Result<TraceWriter> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!(
            "stragglar-trace-rank{rank}-pid{}{label}.json",
            std::process::id()
        ));
        let mut out = BufWriter::new(File::create(&path)?);
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        Ok(TraceWriter {
            out,
            path,
            rank,
            events: 0,
        })
    }

    /// Where the trace goes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one call.
    pub fn call(&mut self, e: &CallEvent) -> std::io::Result<()> {
        let opt = |v: Option<usize>| v.map_or("null".to_string(), |r| r.to_string());
        let separator = if self.events == 0 { "" } else { ",\n" };
        write!(
            self.out,
            "{separator}{{\"name\":\"AllReduce {}\",\"cat\":\"stragglar\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{},\"tid\":{},\"args\":{{\"algorithm\":\"{}\",\"bytes\":{},\"straggler\":{},\"last_rank\":{},\"lead_us\":{},\"designated\":{},\"post_arrival_us\":{}}}}}",
            e.algorithm,
            e.start_us,
            e.duration_us,
            std::process::id(),
            self.rank,
            e.algorithm,
            e.bytes,
            opt(e.straggler),
            opt(e.last_rank),
            e.lead_us.map_or("null".to_string(), |us| format!("{us:.3}")),
            opt(e.designated),
            e.post_us.map_or("null".to_string(), |us| format!("{us:.3}")),
        )?;
        self.events += 1;
        Ok(())
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = self.out.write_all(b"\n]}\n");
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_is_valid_json_with_one_event_per_call() {
        let dir = std::env::temp_dir().join(format!("stragglar-trace-test-{}", std::process::id()));
        let path = {
            let mut w = TraceWriter::create_labelled(&dir, 3, "-comm1").unwrap();
            assert!(w.path().to_str().unwrap().ends_with("-comm1.json"));
            for i in 0..3 {
                w.call(&CallEvent {
                    start_us: 10.0 * i as f64,
                    duration_us: 5.5,
                    bytes: 1024,
                    algorithm: if i == 1 { "ring" } else { "stragglar" },
                    straggler: (i != 1).then_some(7),
                    last_rank: Some(7),
                    lead_us: Some(120.0),
                    designated: None,
                    post_us: (i == 2).then_some(42.5),
                })
                .unwrap();
            }
            w.path().to_path_buf()
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(text.starts_with("{\"displayTimeUnit\""));
        assert!(text.trim_end().ends_with("]}"));
        assert_eq!(text.matches("\"ph\":\"X\"").count(), 3);
        assert!(text.contains("\"straggler\":null"));
        assert_eq!(text.matches("\"post_arrival_us\":null").count(), 2);
        assert!(text.contains("\"post_arrival_us\":42.500"));
        // Balanced braces and brackets: a structural check of the JSON.
        let depth = text.chars().fold(0i64, |d, c| match c {
            '{' | '[' => d + 1,
            '}' | ']' => d - 1,
            _ => d,
        });
        assert_eq!(depth, 0);
    }
}

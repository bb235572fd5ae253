//! `stragglar plan` and `stragglar model`, run as the built binary.

mod support;

use std::process::{Command, Output};

use support::svg::svg_contents;

use stragglar::schedule::{verify, Op, Phase, PhaseKind, Schedule, Transfer, VerifyError};

fn stragglar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stragglar"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn ok(args: &[&str]) -> String {
    let out = stragglar(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn usage_error(args: &[&str], needle: &str) {
    let out = stragglar(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
}

/// A minimal JSON reader, enough for the plan and model formats.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(f64),
    Text(String),
    List(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn parse(text: &str) -> Json {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.s.len(), "trailing text");
        v
    }

    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Object(items) => &items.iter().find(|(k, _)| k == key).unwrap().1,
            _ => panic!("not an object"),
        }
    }

    fn keys(&self) -> Vec<&str> {
        match self {
            Json::Object(items) => items.iter().map(|(k, _)| k.as_str()).collect(),
            _ => panic!("not an object"),
        }
    }

    fn list(&self) -> &[Json] {
        match self {
            Json::List(items) => items,
            _ => panic!("not a list"),
        }
    }

    fn num(&self) -> usize {
        match self {
            Json::Number(x) => *x as usize,
            _ => panic!("not a number: {self:?}"),
        }
    }

    fn num_f64(&self) -> f64 {
        match self {
            Json::Number(x) => *x,
            _ => panic!("not a number: {self:?}"),
        }
    }

    fn text(&self) -> &str {
        match self {
            Json::Text(s) => s,
            _ => panic!("not a string"),
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s[self.i] as char, c as char, "at byte {}", self.i);
        self.i += 1;
    }

    fn value(&mut self) -> Json {
        self.ws();
        match self.s[self.i] {
            b'{' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s[self.i] == b'}' {
                    self.i += 1;
                    return Json::Object(items);
                }
                loop {
                    self.ws();
                    let Json::Text(key) = self.value() else {
                        panic!("key")
                    };
                    self.eat(b':');
                    items.push((key, self.value()));
                    self.ws();
                    self.i += 1;
                    if self.s[self.i - 1] == b'}' {
                        return Json::Object(items);
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s[self.i] == b']' {
                    self.i += 1;
                    return Json::List(items);
                }
                loop {
                    items.push(self.value());
                    self.ws();
                    self.i += 1;
                    if self.s[self.i - 1] == b']' {
                        return Json::List(items);
                    }
                }
            }
            b'"' => {
                let start = self.i + 1;
                let end = start + self.s[start..].iter().position(|&c| c == b'"').unwrap();
                self.i = end + 1;
                Json::Text(String::from_utf8(self.s[start..end].to_vec()).unwrap())
            }
            b'n' => {
                assert_eq!(&self.s[self.i..self.i + 4], b"null");
                self.i += 4;
                Json::Null
            }
            b't' | b'f' => {
                let value = self.s[self.i] == b't';
                let word: &[u8] = if value { b"true" } else { b"false" };
                assert_eq!(&self.s[self.i..self.i + word.len()], word);
                self.i += word.len();
                Json::Bool(value)
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len() && b"+-.eE0123456789".contains(&self.s[self.i]) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                Json::Number(text.parse().unwrap())
            }
        }
    }
}

/// Rebuilds a schedule from `plan --json` output, knowing nothing but the format.
fn schedule_from_json(json: &Json) -> Schedule {
    let multicast = json.keys().contains(&"multicast");
    match multicast {
        true => {
            assert_eq!(
                json.keys(),
                ["ranks", "straggler", "chunks", "multicast", "phases"]
            );
            assert_eq!(json.get("multicast"), &Json::Bool(true));
        }
        false => assert_eq!(json.keys(), ["ranks", "straggler", "chunks", "phases"]),
    }
    let ranks = json.get("ranks").num();
    let chunks = json.get("chunks").num();
    let straggler = match json.get("straggler") {
        Json::Null => None,
        s => Some(s.num()),
    };
    let phases = json
        .get("phases")
        .list()
        .iter()
        .map(|phase| {
            assert_eq!(phase.keys(), ["name", "rounds"]);
            let kind = match phase.get("name").text() {
                "reduce_scatter" => PhaseKind::ReduceScatter,
                "gather" => PhaseKind::Gather,
                "stragglar" => PhaseKind::Stragglar,
                "allreduce" => PhaseKind::AllReduce,
                other => panic!("phase {other}"),
            };
            let rounds = phase
                .get("rounds")
                .list()
                .iter()
                .map(|round| {
                    round
                        .list()
                        .iter()
                        .map(|t| {
                            assert_eq!(t.keys(), ["src", "dst", "chunk", "op"]);
                            Transfer {
                                src: t.get("src").num(),
                                dst: t.get("dst").num(),
                                chunk: t.get("chunk").num(),
                                op: match t.get("op").text() {
                                    "reduce" => Op::Reduce,
                                    "copy" => Op::Copy,
                                    other => panic!("op {other}"),
                                },
                            }
                        })
                        .collect()
                })
                .collect();
            Phase { kind, rounds }
        })
        .collect();
    Schedule {
        ranks,
        straggler,
        chunks,
        pieces_per_chunk: (chunks / ranks.saturating_sub(1).max(1)).max(1),
        phases,
        multicast,
    }
}

#[test]
fn plan_json_is_the_documented_format_in_physical_ranks() {
    for (args, straggler) in [
        (vec!["--ranks", "8", "--straggler", "3"], Some(3)),
        (vec!["--ranks", "7"], Some(6)),
        (
            vec!["--ranks", "5", "--straggler", "0", "--pipeline", "3"],
            Some(0),
        ),
        (vec!["--ranks", "6", "--algo", "ring"], None),
        (vec!["--ranks", "8", "--algo", "rhd"], None),
        (
            vec!["--ranks", "9", "--algo", "direct", "--straggler", "4"],
            Some(4),
        ),
        (
            vec!["--ranks", "8", "--algo", "multicast", "--straggler", "2"],
            Some(2),
        ),
    ] {
        let mut argv = vec!["plan", "--json"];
        argv.extend(&args);
        let text = ok(&argv);
        let json = Json::parse(&text);
        let schedule = schedule_from_json(&json);
        assert_eq!(schedule.straggler, straggler, "{args:?}");
        assert_eq!(verify(&schedule), Ok(()), "{args:?}");
        if let Some(s) = straggler {
            // The straggler takes no part before it arrives.
            let before = &schedule.phases[0];
            assert_eq!(before.kind, PhaseKind::ReduceScatter);
            assert!(before
                .rounds
                .iter()
                .flatten()
                .all(|t| t.src != s && t.dst != s));
        }
    }
    let piped = Json::parse(&ok(&["plan", "--json", "--ranks", "5", "--pipeline", "3"]));
    assert_eq!(piped.get("chunks").num(), 12);
}

/// Multicast StragglAR: the gather into the straggler before it arrives (it only receives),
/// then one round per chunk in which the straggler sends that chunk to every early rank; the
/// verifier takes one chunk to many only in a multicast schedule.
#[test]
fn the_multicast_schedule_sends_each_chunk_once_to_every_early_rank() {
    let json = Json::parse(&ok(&[
        "plan",
        "--json",
        "--ranks",
        "6",
        "--algo",
        "multicast",
        "--straggler",
        "1",
    ]));
    let mut schedule = schedule_from_json(&json);
    assert!(schedule.multicast);
    let names: Vec<PhaseKind> = schedule.phases.iter().map(|p| p.kind).collect();
    assert_eq!(
        names,
        [
            PhaseKind::ReduceScatter,
            PhaseKind::Gather,
            PhaseKind::Stragglar
        ]
    );
    let gather = &schedule.phases[1];
    assert!(gather
        .rounds
        .iter()
        .flatten()
        .all(|t| t.dst == 1 && t.op == Op::Reduce));
    let after = &schedule.phases[2];
    assert_eq!(after.rounds.len(), 5, "one round per chunk");
    for (chunk, round) in after.rounds.iter().enumerate() {
        let mut dsts: Vec<usize> = round.iter().map(|t| t.dst).collect();
        dsts.sort();
        assert_eq!(dsts, [0, 2, 3, 4, 5]);
        assert!(round
            .iter()
            .all(|t| t.src == 1 && t.chunk == chunk && t.op == Op::Copy));
    }
    assert_eq!(verify(&schedule), Ok(()));
    schedule.multicast = false;
    assert!(matches!(
        verify(&schedule),
        Err(VerifyError::Shape(_)) | Err(VerifyError::SendsTwice { .. })
    ));
}

#[test]
fn plan_json_is_stable() {
    assert_eq!(
        ok(&["plan", "--ranks", "2", "--json"]),
        "{\n  \"ranks\": 2,\n  \"straggler\": 1,\n  \"chunks\": 1,\n  \"phases\": [\n    \
         {\"name\": \"reduce_scatter\", \"rounds\": []},\n    \
         {\"name\": \"stragglar\", \"rounds\": [\n      \
         [{\"src\": 0, \"dst\": 1, \"chunk\": 0, \"op\": \"reduce\"}, \
         {\"src\": 1, \"dst\": 0, \"chunk\": 0, \"op\": \"reduce\"}]\n    ]}\n  ]\n}\n"
    );
}

#[test]
fn plan_text_shows_rounds_transfers_and_holders() {
    let text = ok(&["plan", "--ranks", "8", "--straggler", "2"]);
    assert!(
        text.contains("post-arrival rounds 9 (bound n-2+ceil(log2 n) = 9)"),
        "{text}"
    );
    assert!(text.contains("phase reduce_scatter (before the straggler arrives): 6 rounds"));
    assert!(text.contains("phase stragglar (after the straggler arrives): 9 rounds"));
    // Round 0 after arrival: logical rank 0 (physical 0) exchanges chunk 0 with straggler 2.
    assert!(text.contains("  round   0: 0>2 c0 r, 2>0 c0 r\n"), "{text}");
    assert!(text.contains("holders: 2 0 0 0 0 0 0\n"), "{text}");
    assert!(text.contains("holders: 8 8 8 8 8 8 8\n"), "{text}");
    assert!(text.ends_with("valid: every rank holds every chunk with all contributions\n"));
    let piped = ok(&["plan", "--ranks", "4", "--pipeline", "2"]);
    assert!(piped.contains("6 chunks (2 piece(s) per chunk)"), "{piped}");
    assert!(
        piped.contains("post-arrival rounds 7 (bound n-2+ceil(log2 n) = 7)"),
        "{piped}"
    );
}

#[test]
fn plan_table_and_bench() {
    let table = ok(&["plan", "--table", "2..9"]);
    assert_eq!(table.lines().count(), 2 + 8);
    assert!(table.contains("| 6 | 7 | 7 | 0 | 7 |"), "{table}");
    let bench = ok(&["plan", "--bench", "--ranks", "8,12"]);
    assert_eq!(bench.lines().count(), 3);
    assert!(
        bench.lines().nth(1).unwrap().starts_with("8  9  "),
        "{bench}"
    );
}

#[test]
fn bad_plan_requests_exit_with_status_2() {
    usage_error(&["plan"], "--ranks");
    usage_error(&["plan", "--ranks", "1"], "between 2 and");
    usage_error(&["plan", "--ranks", "eight"], "expected a number of ranks");
    usage_error(&["plan", "--ranks", "8", "--straggler", "8"], "--straggler");
    usage_error(&["plan", "--ranks", "6", "--algo", "rhd"], "power-of-two");
    usage_error(&["plan", "--ranks", "6", "--algo", "tree"], "--algo");
    usage_error(&["plan", "--ranks", "6", "--pipeline", "0"], "--pipeline");
    usage_error(
        &["plan", "--ranks", "1024", "--pipeline", "5"],
        "between 1 and 4",
    );
    usage_error(&["plan", "--ranks", "4096"], "between 2 and 2048");
    usage_error(
        &["plan", "--ranks", "6", "--pipeline", "2", "--algo", "ring"],
        "stragglar only",
    );
    usage_error(
        &["plan", "--ranks", "6", "--frobnicate"],
        "unexpected argument",
    );
    usage_error(&["plan", "--table", "1..9"], "--table");
    usage_error(&["plan", "--table", "9"], "--table");
    usage_error(&["plan", "--bench", "--ranks", "1"], "between 2 and");
    usage_error(&["frobnicate"], "unknown command");
}

#[test]
fn model_reproduces_the_published_ratios() {
    let text = ok(&[
        "model",
        "--alpha-us",
        "3",
        "--bandwidth-gbs",
        "483.1838208",
        "--bytes",
        "1G",
        "--delay-us",
        "20000",
    ]);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let expected = [
        "1.127", "1.363", "1.565", "1.718", "1.826", "1.897", "1.941",
    ];
    assert_eq!(lines.len(), 1 + expected.len());
    for (line, ratio) in lines[1..].iter().zip(expected) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[col("speedup_post")], ratio, "{line}");
        assert_eq!(cells[col("rounds")], cells[col("bound")], "{line}");
    }
}

#[test]
fn model_json_and_lists() {
    let text = ok(&[
        "model",
        "--ranks",
        "3,8,12",
        "--bytes",
        "64M,1G",
        "--delay-us",
        "0,5000",
        "--json",
    ]);
    let json = Json::parse(&text);
    let rows = json.list();
    assert_eq!(rows.len(), 3 * 2 * 2);
    let first = &rows[0];
    assert_eq!(first.get("ranks").num(), 3);
    assert_eq!(first.get("bytes").num(), 64 << 20);
    assert_eq!(first.get("break_even_s"), &Json::Null);
    assert_eq!(first.get("rhd_s"), &Json::Null);
    let n8 = &rows[4];
    assert_eq!(n8.get("ranks").num(), 8);
    assert!(matches!(n8.get("break_even_s"), Json::Number(x) if *x > 0.0));
    assert_eq!(n8.get("rounds").num(), 9);
    // NCCL's NVLS is priced for one 8-GPU server, and left out above it.
    assert!(matches!(n8.get("nvls_s"), Json::Number(x) if *x > 0.0));
    let n8_1g = &rows[6];
    assert_eq!(n8_1g.get("bytes").num(), 1 << 30);
    assert!(matches!(n8_1g.get("speedup_pipelined_nvls"), Json::Number(x) if *x > 1.0));
    assert_eq!(rows[8].get("ranks").num(), 12);
    assert_eq!(rows[8].get("nvls_s"), &Json::Null);
    assert_eq!(rows[8].get("speedup_call_nvls"), &Json::Null);
    // Multicast StragglAR: priced at every size; over NVLS only where NVLS is.
    let post = n8_1g.get("multicast_post_s").num_f64();
    let floor = n8_1g.get("floor_s").num_f64();
    assert!(
        post > floor && post < floor * 1.01,
        "{post} against {floor}"
    );
    assert!(matches!(n8_1g.get("speedup_post_multicast_nvls"), Json::Number(x) if *x > 1.0));
    assert!(matches!(n8_1g.get("multicast_break_even_nvls_s"), Json::Number(x) if *x > 0.0));
    assert!(matches!(rows[8].get("multicast_s"), Json::Number(x) if *x > 0.0));
    assert_eq!(rows[8].get("multicast_break_even_nvls_s"), &Json::Null);
}

#[test]
fn model_leaves_multicast_out_at_ratio_zero() {
    let text = ok(&["model", "--ranks", "8", "--multicast-ratio", "0", "--json"]);
    let json = Json::parse(&text);
    let row = &json.list()[0];
    assert_eq!(row.get("multicast_post_s"), &Json::Null);
    assert_eq!(row.get("speedup_call_multicast_nvls"), &Json::Null);
    assert!(matches!(row.get("nvls_s"), Json::Number(_)));
}

/// The policy column: what the library's policy runs on the model as the straggler's lead
/// grows, at 8 ranks and 1 GiB on the NVSwitch defaults: NCCL's NVLS with no lead, pipelined
/// point-to-point StragglAR from a short lead, one multicast once the lead hides its gather too;
/// without multicast priced, point to point; without NVLS, Ring is the baseline.
#[test]
fn model_says_which_algorithm_and_finish_the_policy_runs() {
    let policies = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "model",
            "--ranks",
            "8",
            "--bytes",
            "1G",
            "--delay-us",
            "0,2000,5000",
        ];
        args.extend_from_slice(extra);
        args.push("--json");
        let json = Json::parse(&ok(&args));
        json.list()
            .iter()
            .map(|row| row.get("policy").text().to_string())
            .collect()
    };
    let weighed = policies(&[]);
    assert_eq!(weighed[0], "nvls");
    assert!(weighed[1].starts_with("stragglar/"), "{weighed:?}");
    assert_ne!(weighed[1], "stragglar/1", "pipelined at 1 GiB");
    assert_eq!(weighed[2], "multicast");
    let point_to_point = policies(&["--multicast-ratio", "0"]);
    assert!(
        point_to_point[2].starts_with("stragglar/"),
        "{point_to_point:?}"
    );
    assert_eq!(policies(&["--nvls-ratio", "0"])[0], "ring");
    let text = ok(&[
        "model",
        "--ranks",
        "8",
        "--bytes",
        "1G",
        "--delay-us",
        "5000",
    ]);
    assert!(text.lines().next().unwrap().ends_with("policy"), "{text}");
    assert!(
        text.lines().nth(1).unwrap().ends_with("multicast"),
        "{text}"
    );
}

#[test]
fn bad_model_requests_exit_with_status_2() {
    usage_error(&["model", "--ranks", "1"], "between 2 and");
    usage_error(&["model", "--bytes", "1Q"], "expected a size");
    usage_error(&["model", "--alpha-us", "-1"], "--alpha-us");
    usage_error(&["model", "--bandwidth-gbs", "0"], "--bandwidth-gbs");
    usage_error(&["model", "--delay-us", "x"], "--delay-us");
    usage_error(&["model", "--max-pipeline", "0"], "--max-pipeline");
    usage_error(&["model", "--nvls-ratio", "-0.5"], "--nvls-ratio");
    usage_error(&["model", "--multicast-ratio", "x"], "--multicast-ratio");
    usage_error(&["model", "--multicast-ratio", "-1"], "--multicast-ratio");
}

#[test]
fn plan_svg_draws_one_row_per_rank_and_one_cell_per_round() {
    let dir = std::env::temp_dir().join(format!("stragglar-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.svg");
    let text = ok(&[
        "plan",
        "--ranks",
        "6",
        "--straggler",
        "2",
        "--svg",
        path.to_str().unwrap(),
    ]);
    assert!(text.contains("rank"), "the text view is still printed");
    let (texts, tags) = svg_contents(&path);
    for rank in 0..6 {
        let label = match rank {
            2 => "rank 2 (straggler)".to_string(),
            r => format!("rank {r}"),
        };
        assert_eq!(
            texts.iter().filter(|t| **t == label).count(),
            1,
            "{label}: {texts:?}"
        );
    }
    // 4 ReduceScatter rounds among 5 ranks, then 6 + 3 - 1 = 7 after arrival: 11 columns.
    assert!(tags["rect"] >= 6 * 11, "{tags:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("after it arrives: 7 rounds")),
        "{texts:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn model_svg_draws_one_series_per_rank_count() {
    let dir = std::env::temp_dir().join(format!("stragglar-svg-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.svg");
    ok(&[
        "model",
        "--ranks",
        "4,8,16",
        "--svg",
        path.to_str().unwrap(),
    ]);
    let (texts, tags) = svg_contents(&path);
    // Two panels (against size, against delay), each with a line per rank count over Ring, one
    // over NVLS per rank count NVLS is priced for (n <= 8), and the baselines' line.
    let count = |label: &str| texts.iter().filter(|t| **t == label).count();
    for n in [4, 8, 16] {
        assert_eq!(count(&format!("n = {n}, over Ring")), 2, "{texts:?}");
        let nvls = if n <= 8 { 2 } else { 0 };
        assert_eq!(count(&format!("n = {n}, over NVLS")), nvls, "{texts:?}");
    }
    assert_eq!(count("baseline (1.0)"), 2, "{texts:?}");
    assert!(tags["polyline"] >= 2 * 4, "{tags:?}");
    ok(&[
        "model",
        "--ranks",
        "4",
        "--nvls-ratio",
        "0",
        "--svg",
        path.to_str().unwrap(),
    ]);
    let (texts, _) = svg_contents(&path);
    assert!(!texts.iter().any(|t| t.contains("NVLS")), "{texts:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    usage_error(&["model", "--svg"], "--svg");
}

/// The README's pictures are what `scripts/pictures.sh` draws now.
#[test]
fn the_committed_pictures_are_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("stragglar-pictures-{}", std::process::id()));
    let status = Command::new(root.join("scripts/pictures.sh"))
        .env("BIN", env!("CARGO_BIN_EXE_stragglar"))
        .env("OUT", &out)
        .status()
        .expect("the script runs");
    assert!(status.success());
    for name in ["schedule-8-ranks.svg", "speedup-model.svg"] {
        let drawn = std::fs::read(out.join(name)).unwrap();
        let committed = std::fs::read(root.join("docs/images").join(name)).unwrap_or_default();
        assert!(
            drawn == committed,
            "docs/images/{name} is not what scripts/pictures.sh draws now: run it"
        );
    }
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn bench_svg_draws_measured_times_and_the_model_when_links_are_emulated() {
    let dir = std::env::temp_dir().join(format!("stragglar-svg-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.svg");
    let svg = path.to_str().unwrap();
    let quick = [
        "bench", "--ranks", "4", "-b", "8K", "-e", "32K", "-f", "2", "-n", "2", "-w", "1",
    ];
    let json_path = dir.join("bench.json");
    let json = json_path.to_str().unwrap();
    let mut emulated = quick.to_vec();
    emulated.extend(["--link-gbs", "1", "--svg", svg, "-J", json, "-a", "2"]);
    ok(&emulated);
    // -J: one result per size, the time statistic named, the lateness measured.
    let doc = std::fs::read_to_string(&json_path).unwrap();
    assert!(
        doc.contains("\"backend\": \"host\"") && doc.contains("\"average\": 2"),
        "{doc}"
    );
    assert_eq!(doc.matches("\"type\": \"float\"").count(), 3, "{doc}");
    assert!(!doc.contains("\"lead_us\": null"), "{doc}");
    let (texts, tags) = svg_contents(&path);
    for label in [
        "time per call, float sum, out of place",
        "after the last arrival, measured",
        "after the last arrival, model (StragglAR)",
    ] {
        assert!(texts.iter().any(|t| t == label), "{label}: {texts:?}");
    }
    // One point per size on each of the three lines.
    assert!(tags["circle"] >= 3 * 3, "{tags:?}");
    let mut plain = quick.to_vec();
    plain.extend(["--svg", svg]);
    ok(&plain);
    let (texts, _) = svg_contents(&path);
    assert!(!texts.iter().any(|t| t.contains("model (")), "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("no model")), "{texts:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `stragglar COMMAND --help` prints that command's options (the same text `stragglar help`
/// lists), and every option the usage names is one the command accepts.
#[test]
fn each_command_with_options_answers_help() {
    let all = ok(&["help"]);
    for command in ["bench", "plan", "model", "kernels"] {
        for flag in ["--help", "-h"] {
            let text = ok(&[command, flag]);
            assert!(
                text.contains(&format!("stragglar {command}"))
                    || text.starts_with(&format!("{command} options:")),
                "{command} {flag}: {text}"
            );
            assert!(all.contains(text.trim_end()), "{command}: not in help");
        }
    }
    // Every long option of bench's usage parses (a wrong one would say "unexpected").
    let usage = ok(&["bench", "--help"]);
    for option in usage
        .split(|c: char| c.is_whitespace() || "[]|".contains(c))
        .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
        .filter(|w| w.starts_with("--") && w.len() > 2)
    {
        let out = stragglar(&["bench", option]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("unexpected"), "{option}: {stderr}");
    }
}

//! Fuzz targets for the places hostile input enters bench: the matrix parser and expander,
//! the filter language, baseline files, and the worker-event reader (with the sanitizer
//! behind it) of issue 13; the framework log parsers (with the physical bounds and the echo
//! of framework lines) and the history store's locations (credentials, schemes) of issue 25;
//! the log reader of `bench ingest` (every framework's step lines, rank prefixes, cut lines,
//! binary bytes) of issue 22; the results journal a killed run leaves beside results.json
//! (issue 23).
//!
//! Each target runs proptest batches with fresh seeds until its time budget is spent:
//! `BENCH_FUZZ_SECS` seconds per target (2 when unset, so a plain `cargo test` stays quick;
//! scripts/test.sh gives CI a fixed budget). proptest rather than cargo-fuzz: it is already a
//! dev-dependency, runs on stable Rust in the ordinary test run (cargo-fuzz needs nightly
//! and a sanitizer build of libtorch-linked code), and its strategies produce matrix-,
//! filter- and event-shaped input that reaches expansion and validation instead of stopping
//! at the first syntax error. A failing case is shrunk and kept in
//! `tests/fuzz.proptest-regressions`, replayed first on every later run; before each batch
//! its seed is written to `$CARGO_TARGET_TMPDIR/fuzz-<target>.seed`, so that a crash that
//! kills the process (an abort is not a panic proptest can catch) can be replayed with
//! `BENCH_FUZZ_SEED`. Crashes found are also kept as named regression tests below.

use std::fmt::Debug;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench::baseline::store::{self, Baselines};
use bench::cell::{Cell, CellId, Params, Value, Workload};
use bench::events::{Event, EventReader, LineSplitter, MAX_LINE_BYTES, MAX_TOKENS};
use bench::matrix::budget::Budget;
use bench::matrix::filter::{Filter, Vocabulary};
use bench::matrix::{self, parse::parse_str};
use bench::results::RunResults;
use bench::sanitize;
use indexmap::IndexMap;
use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestRng, TestRunner,
};

/// Seconds each target runs.
fn budget() -> Duration {
    let secs = std::env::var("BENCH_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Data memory a fuzz process may take. The targets' inputs are refused or expanded within
/// the budgets bench sets itself (the matrix's default is about 1.6 GB), so a case that asks
/// for more is a finding: with this limit its allocation fails and the process aborts naming
/// the size, where without it the kernel's OOM killer ended the CI run's test with a bare
/// SIGKILL (an empty axis beside a 57-flag `subsets_of`, 2^57 sets). RLIMIT_DATA rather
/// than RLIMIT_AS: it counts the heap and private writable mappings, not the address space
/// reserved by the libraries the binary links (libtorch's) or by idle malloc arenas, which
/// grow with a host's threads and could end a run that allocates nothing unusual.
const FUZZ_DATA_LIMIT: u64 = 8 << 30;

fn limit_memory() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_DATA) {
            let limit = FUZZ_DATA_LIMIT.min(soft).min(hard);
            if let Err(e) = setrlimit(Resource::RLIMIT_DATA, limit, hard) {
                eprintln!("fuzz: could not limit the data memory: {e}");
            }
        }
    });
}

/// Runs `test` on values of `strategy` in batches of fresh seeds until the budget is spent
/// (a fixed seed from `BENCH_FUZZ_SEED` runs one batch).
fn fuzz<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    limit_memory();
    let fixed = std::env::var("BENCH_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let started = Instant::now();
    let deadline = started + budget();
    let seed_file = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{name}.seed"));
    let mut cases = 0u64;
    for batch in 0u64.. {
        let seed = fixed.unwrap_or_else(|| {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            nanos ^ batch.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        });
        let _ = std::fs::write(&seed_file, seed.to_string());
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: 128,
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
                "proptest-regressions",
            ))),
            source_file: Some(file!()),
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        );
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("fuzz target {name}: {e}\nreplay the batch with BENCH_FUZZ_SEED={seed}");
        }
        cases += 128;
        if fixed.is_some() || Instant::now() >= deadline {
            break;
        }
    }
    eprintln!(
        "fuzz {name}: {cases} cases in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Fails a case that took longer than a bad input may take to be refused.
fn quick(started: Instant, what: &str) -> Result<(), TestCaseError> {
    let took = started.elapsed();
    prop_assert!(
        took < Duration::from_secs(2),
        "{what} took {took:?}; every input must be accepted or refused within about 1 s"
    );
    Ok(())
}

// ---------------------------------------------------------------- matrix parser + expander

/// Matrix-shaped text: the language's keys and values, and the hostile shapes of issue 13
/// (bombs, overflowing batch products, deep nesting), in random order and combination.
fn matrix_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("axes:\n".to_string()),
        Just("  model: [a, b, c]\n".to_string()),
        Just("  gpus: [1, 2, 8]\n".to_string()),
        Just("  gpus: [65536, 4294967296]\n".to_string()),
        Just("  gpus: [-1, 1.5, 1e300, .nan]\n".to_string()),
        Just("  parallel: [single, fsdp]\n".to_string()),
        Just("  features: {subsets_of: [compile, sac]}\n".to_string()),
        Just("  features: [[], [sac]]\n".to_string()),
        Just("  x: []\n".to_string()),
        Just("  dup: [1, 1.0]\n".to_string()),
        (2usize..64).prop_map(|n| {
            let flags: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
            format!("  many: {{subsets_of: [{}]}}\n", flags.join(", "))
        }),
        (1usize..120, 1usize..4).prop_map(|(n, k)| {
            let vals: Vec<String> = (0..k).map(|v| format!("v{v}")).collect();
            (0..n)
                .map(|i| format!("  ax{i}: [{}]\n", vals.join(", ")))
                .collect::<String>()
        }),
        (1usize..3000).prop_map(|n| {
            let vals: Vec<String> = (0..n).map(|v| v.to_string()).collect();
            format!("  long: [{}]\n", vals.join(", "))
        }),
        Just("zip: [[gpus, model]]\n".to_string()),
        Just("zip: [[many, ax0]]\n".to_string()),
        Just("defaults: {steps: 3, warmup: 1, global_batch: 8}\n".to_string()),
        Just("defaults: {micro_batch: 65536, grad_accum: 4294967295}\n".to_string()),
        Just("defaults: {micro_batch: 4294967296}\n".to_string()),
        Just("defaults: {steps: 0, warmup: 7}\n".to_string()),
        Just("rules:\n".to_string()),
        Just("  - exclude: {model: a}\n    reason: r\n".to_string()),
        Just("  - when: \"gpus>1 and (\"\n    reason: r\n".to_string()),
        Just("  - when: parallel=single and gpus>1\n    reason: r\n".to_string()),
        (1usize..6000).prop_map(|n| format!(
            "  - when: \"{}gpus>1{}\"\n    reason: r\n",
            "(".repeat(n),
            ")".repeat(n)
        )),
        (1usize..20000)
            .prop_map(|n| format!("  - when: \"{}model=a\"\n    reason: r\n", "!".repeat(n))),
        Just("  - incompatible: [compile, sac]\n    reason: r\n".to_string()),
        Just("  - requires: {if: has(sac), then: {parallel: fsdp}}\n    reason: r\n".to_string()),
        Just("include:\n  - model: d\n    npm: 6\n  - gpus: 2\n    seq_len: 64\n".to_string()),
        Just("include:\n  - gpus: 4294967296\n".to_string()),
        Just("overrides:\n  model:\n    a: {micro_batch: 3}\n".to_string()),
        Just("anchors: &a [x, y]\nmore: *a\n".to_string()),
        (1usize..3000).prop_map(|n| format!("  deep: {}{}\n", "[".repeat(n), "]".repeat(n))),
        (1usize..3000).prop_map(|n| format!("deep: {}\n", "{a: ".repeat(n) + &"}".repeat(n))),
        "[ -~]{0,12}\n".prop_map(|s| s),
        "[\\[\\]{}:,\\- a-z0-9&*!|>'\"#%@`\\t]{0,16}".prop_map(|s| s),
        "\\PC{0,16}".prop_map(|s| s),
    ];
    prop::collection::vec(token, 0..10).prop_map(|v| v.concat())
}

fn check_matrix(yaml: &str, filters: &[String]) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = parse_str(Path::new("p.yaml"), yaml.to_string())
        .and_then(|(spec, src)| matrix::from_spec_within(spec, &src, filters, Budget::default()));
    match result {
        Ok(exp) => {
            // Accepted input takes time in proportion to its cells; only a hang is a fault.
            prop_assert!(started.elapsed() < Duration::from_secs(60));
            prop_assert!(exp.cells.len() + exp.dropped.len() <= 100_000 + exp.spec.include.len());
            for c in &exp.cells {
                let p = &c.params;
                // The derived batch is exact, never wrapped.
                prop_assert_eq!(
                    u64::from(p.global_batch),
                    u64::from(c.gpus()) * u64::from(p.micro_batch) * u64::from(p.grad_accum)
                );
            }
        }
        Err(e) => {
            let shown = e.to_string();
            prop_assert!(
                shown.starts_with("p.yaml") || shown.starts_with("bad --filter"),
                "unlocated error: {shown}"
            );
            quick(started, "refusing this matrix")?;
        }
    }
    Ok(())
}

#[test]
fn fuzz_matrix_parser_and_expander() {
    let filters = prop_oneof![
        Just(vec![]),
        Just(vec!["gpus>1".to_string()]),
        filter_text().prop_map(|f| vec![f]),
    ];
    fuzz("matrix", (matrix_text(), filters), |(yaml, filters)| {
        check_matrix(&yaml, &filters)
    });
}

// ---------------------------------------------------------------------- filter language

fn filter_text() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("model".to_string()),
        Just("gpus".to_string()),
        Just("features".to_string()),
        Just("seq_len".to_string()),
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just(">=".to_string()),
        Just("<".to_string()),
        Just("~".to_string()),
        Just("a".to_string()),
        Just("8".to_string()),
        Just("1e400".to_string()),
        Just("compile+sac".to_string()),
        Just("/^a/".to_string()),
        Just("/(/".to_string()),
        Just("/a{99999}/".to_string()),
        Just(" and ".to_string()),
        Just(" or ".to_string()),
        Just(" && ".to_string()),
        Just(" || ".to_string()),
        Just("not ".to_string()),
        Just("!".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("has(".to_string()),
        Just("sac".to_string()),
        Just("\"".to_string()),
        (1usize..400).prop_map(|n| "(".repeat(n)),
        (1usize..400).prop_map(|n| ")".repeat(n)),
        (1usize..5000).prop_map(|n| "!".repeat(n)),
        (1usize..3000).prop_map(|n| vec!["a"; n].join(" || ")),
        "[ -~]{0,4}".prop_map(|s| s),
        "\\PC{0,3}".prop_map(|s| s),
    ];
    prop::collection::vec(token, 1..12).prop_map(|v| v.concat())
}

fn sample_cells() -> Vec<Cell> {
    let mut out = Vec::new();
    for (model, gpus, feats) in [
        ("a", 1i64, vec![]),
        ("b", 8, vec!["compile"]),
        ("c", 2, vec!["compile", "sac"]),
    ] {
        let mut v = IndexMap::new();
        v.insert("model".to_string(), Value::Str(model.into()));
        v.insert("gpus".to_string(), Value::Int(gpus));
        v.insert(
            "features".to_string(),
            Value::Set(feats.iter().map(|s| s.to_string()).collect()),
        );
        out.push(Cell {
            id: CellId::from_values(&v),
            values: v,
            params: Params::default(),
        });
    }
    out
}

fn check_filter(expr: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let cells = sample_cells();
    let vocab = Vocabulary::from_cells(cells.iter().map(|c| &c.values));
    for v in [&vocab, &Vocabulary::default()] {
        match Filter::parse(expr, v) {
            Ok(f) => {
                // Negation and grouping mean what they say on every cell.
                let not = Filter::parse(&format!("not ({expr})"), v);
                for c in &cells {
                    let m = f.matches(c);
                    if let Ok(n) = &not {
                        prop_assert_eq!(n.matches(c), !m, "not ({}) on {}", expr, c.id);
                    }
                }
            }
            Err(e) => {
                prop_assert!(e.offset <= expr.len(), "offset {} past the end", e.offset);
                let shown = e.to_string();
                prop_assert!(shown.contains('^'), "no caret: {shown}");
                // A window, not the whole (possibly huge) expression.
                prop_assert!(shown.len() < 1200, "{} bytes of message", shown.len());
            }
        }
    }
    quick(started, "this filter")
}

#[test]
fn fuzz_filter_language() {
    fuzz("filter", filter_text(), |f| check_filter(&f));
}

// --------------------------------------------------------------------------- baselines

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-0.0".to_string()),
        Just("-1".to_string()),
        Just(".nan".to_string()),
        Just(".inf".to_string()),
        Just("-.inf".to_string()),
        Just("1e308".to_string()),
        Just("1e309".to_string()),
        Just("5e-324".to_string()),
        Just("3.5".to_string()),
        Just("12000".to_string()),
        Just("0x10".to_string()),
        Just("fast".to_string()),
        Just("~".to_string()),
        Just("[1]".to_string()),
        Just("{a: 1}".to_string()),
        Just("\"7\"".to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        "[ -~]{0,6}".prop_map(|s| s),
    ]
}

fn baseline_text() -> impl Strategy<Value = String> {
    let metric = (
        prop_oneof![
            Just("tokens_per_s".to_string()),
            Just("peak_mem_bytes".to_string()),
            Just("mfu".to_string()),
            Just("custom".to_string()),
            "[a-z_]{1,8}".prop_map(|s| s),
        ],
        number_text(),
        prop::option::of(number_text()),
        prop::option::of(number_text()),
        prop::option::of(prop_oneof![
            Just("higher".to_string()),
            Just("lower".to_string()),
            Just("up".to_string())
        ]),
    )
        .prop_map(|(name, value, tol, floor, dir)| {
            let mut m = format!("      {name}:\n        value: {value}\n");
            if let Some(t) = tol {
                m.push_str(&format!("        tolerance: {t}\n"));
            }
            if let Some(f) = floor {
                m.push_str(&format!("        floor: {f}\n"));
            }
            if let Some(d) = dir {
                m.push_str(&format!("        direction: {d}\n"));
            }
            m
        });
    let cell = (
        prop_oneof![
            Just("gpt2.fp32.1gpu".to_string()),
            "[a-z0-9.+_-]{0,12}".prop_map(|s| s),
            "\\PC{1,6}".prop_map(|s| format!("\"{}\"", s.replace(['"', '\\'], ""))),
        ],
        prop::collection::vec(metric, 0..4),
    )
        .prop_map(|(id, metrics)| format!("  {id}:\n    metrics:\n{}", metrics.concat()));
    (
        prop_oneof![Just("1".to_string()), Just("2".to_string()), number_text()],
        prop_oneof![
            Just("cpu-x86_64".to_string()),
            Just("other".to_string()),
            Just("\"\"".to_string())
        ],
        prop::collection::vec(cell, 0..4),
        "\\PC{0,8}",
    )
        .prop_map(|(version, key, cells, junk)| {
            format!(
                "schema_version: {version}\nhardware_key: {key}\ncells:\n{}{junk}",
                cells.concat()
            )
        })
}

fn check_baseline(text: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let path = Path::new("baselines/cpu-x86_64.yaml");
    match store::parse(path, text) {
        Ok(doc) => {
            for cell in doc.cells.values() {
                for m in cell.metrics.values() {
                    prop_assert!(store::is_storable(m.value), "accepted value {}", m.value);
                    for v in [m.tolerance, m.floor, Some(m.spread)].into_iter().flatten() {
                        prop_assert!(v.is_finite() && v >= 0.0, "accepted {v}");
                    }
                }
            }
            // What is accepted is written and read back unchanged.
            let dir = tempfile::tempdir().unwrap();
            let b = Baselines {
                path: store::file_for(dir.path(), &doc.hardware_key),
                existed: false,
                doc: doc.clone(),
            };
            if b.save().is_ok() {
                let back = Baselines::load_file(&b.path);
                prop_assert!(back.is_ok(), "saved file does not load: {:?}", back.err());
                prop_assert_eq!(back.unwrap().doc, doc);
            }
        }
        Err(e) => {
            let shown = e.to_string();
            prop_assert!(
                shown.starts_with("baselines/cpu-x86_64.yaml:"),
                "unlocated: {shown}"
            );
        }
    }
    quick(started, "this baseline file")
}

#[test]
fn fuzz_baselines() {
    fuzz("baselines", baseline_text(), |t| check_baseline(&t));
}

// ------------------------------------------------------------------ worker-event reader

fn event_line() -> impl Strategy<Value = String> {
    let num = prop_oneof![
        Just("0".to_string()),
        Just("-0.0".to_string()),
        Just("-1.5".to_string()),
        Just("1e-320".to_string()),
        Just("1e999".to_string()),
        Just("NaN".to_string()),
        Just("null".to_string()),
        Just("\"1\"".to_string()),
        Just("9007199254740993".to_string()),
        Just("18446744073709551616".to_string()),
        Just("0.25".to_string()),
        Just("3".to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
    ];
    let text = prop_oneof![
        Just("\\u001b[31mred\\u001b[0m".to_string()),
        Just("nul\\u0000byte".to_string()),
        Just("bell\\u0007 osc \\u001b]0;title\\u0007".to_string()),
        Just("tab\\tnew\\nline".to_string()),
        "[ -~&&[^\"\\\\]]{0,10}".prop_map(|s| s),
    ];
    prop_oneof![
        (0u64..6, num.clone(), num.clone(), num.clone(), prop::option::of(0u32..3)).prop_map(
            |(step, t, tokens, loss, rank)| {
                let rank = rank.map(|r| format!(",\"rank\":{r}")).unwrap_or_default();
                format!(
                    "{{\"event\":\"step\",\"step\":{step},\"step_time_s\":{t},\"tokens\":{tokens},\"loss\":{loss}{rank}}}"
                )
            }
        ),
        (num.clone(), num.clone(), num, text.clone()).prop_map(|(a, b, c, d)| format!(
            "{{\"event\":\"summary\",\"tokens_per_s\":{a},\"step_time_s\":{b},\"mfu\":{c},\"device\":\"{d}\"}}"
        )),
        (
            prop_oneof![Just("oom"), Just("nan_loss"), Just("melted")],
            text.clone()
        )
            .prop_map(|(k, m)| format!("{{\"event\":\"error\",\"kind\":\"{k}\",\"message\":\"{m}\"}}")),
        text.clone().prop_map(|m| format!("{{\"event\":\"notice\",\"message\":\"{m}\"}}")),
        text.prop_map(|m| format!("{{\"event\":\"start\",\"model\":\"{m}\"}}")),
        Just("{\"event\":\"step\"".to_string()),
        Just("{\"event\":\"future_kind\"}".to_string()),
        "\\PC{0,30}".prop_map(|s| s),
        "[\\x00-\\x7f]{0,30}".prop_map(|s| s),
    ]
}

/// Worker output as bytes: event lines and raw bytes (invalid UTF-8, escapes, NUL), joined
/// by newlines, carriage returns or nothing.
fn worker_output() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
    let piece = prop_oneof![
        event_line().prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"\x1b[1;32mok\x1b[0m".to_vec()),
        Just(b"\xff\xfe\xe2\x9c".to_vec()),
    ];
    let sep = prop_oneof![Just(&b"\n"[..]), Just(&b"\r\n"[..]), Just(&b""[..])];
    (
        prop::collection::vec((piece, sep), 0..24).prop_map(|v| {
            v.into_iter()
                .flat_map(|(mut p, s)| {
                    p.extend_from_slice(s);
                    p
                })
                .collect::<Vec<u8>>()
        }),
        prop::collection::vec(1usize..64, 1..8),
    )
}

fn safe_text(s: &str) -> bool {
    !s.chars()
        .any(|c| (c.is_control() && c != '\n' && c != '\t') || c == '\u{FFFE}' || c == '\u{FFFF}')
}

fn check_events(bytes: &[u8], chunks: &[usize]) -> Result<(), TestCaseError> {
    // Lines are the same however the bytes are chunked, and each is bounded and safe.
    let mut whole = LineSplitter::default();
    let mut expected = Vec::new();
    whole.push(bytes, &mut |l| expected.push(l));
    expected.extend(whole.flush());
    let mut split = LineSplitter::default();
    let mut got = Vec::new();
    let mut rest = bytes;
    let mut sizes = chunks.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap()).min(rest.len());
        split.push(&rest[..n], &mut |l| got.push(l));
        rest = &rest[n..];
    }
    got.extend(split.flush());
    prop_assert_eq!(&got, &expected);
    let mut reader = EventReader::default();
    let mut last: std::collections::HashMap<(u32, u32), u64> = Default::default();
    for (i, line) in got.iter().enumerate() {
        prop_assert!(line.len() <= MAX_LINE_BYTES + 64);
        prop_assert!(safe_text(line), "unsafe line {:?}", line);
        prop_assert!(!line.contains('\n'));
        let rank = (i % 2) as u32;
        match reader.line(rank, line) {
            Some(Event::Step(s)) => {
                prop_assert!(s.step_time_s.is_finite() && s.step_time_s > 0.0);
                prop_assert!(s.tokens <= MAX_TOKENS && s.loss.is_finite());
                let key = (rank, s.rank.unwrap_or(rank));
                if let Some(prev) = last.insert(key, s.step) {
                    prop_assert!(s.step > prev, "step {} after {}", s.step, prev);
                }
            }
            Some(Event::Summary(s)) => {
                for v in [s.tokens_per_s, s.step_time_s].into_iter().flatten() {
                    prop_assert!(v.is_finite() && v > 0.0);
                }
                prop_assert!(s.device.as_deref().is_none_or(safe_text));
            }
            Some(Event::Error { message, .. }) | Some(Event::Notice { message }) => {
                prop_assert!(safe_text(&message), "unsafe message {:?}", message);
            }
            Some(Event::Start { model, .. }) => {
                prop_assert!(model.as_deref().is_none_or(safe_text));
            }
            None => {}
        }
    }
    if let Some(v) = reader.violation() {
        prop_assert!(safe_text(&v));
    }
    // Cleaning is idempotent and leaves nothing a terminal or XML would misread.
    let text = String::from_utf8_lossy(bytes);
    let once = sanitize::clean(&text);
    prop_assert!(safe_text(&once));
    prop_assert_eq!(sanitize::clean(&once), once.clone());
    prop_assert!(!sanitize::xml_chars(&once).contains('\0'));
    Ok(())
}

#[test]
fn fuzz_worker_event_reader() {
    fuzz("events", worker_output(), |(bytes, chunks)| {
        check_events(&bytes, &chunks)
    });
}

// ------------------------------------------------------- framework logs (issue 25)

/// A framework cell on bench's llama-tiny preset: 4 steps of 2 x 64 tokens on one device.
fn framework_cell(torchtitan: bool, dtype: &str) -> Cell {
    let mut v = IndexMap::new();
    v.insert("model".to_string(), Value::Str("llama-tiny".into()));
    v.insert("dtype".to_string(), Value::Str(dtype.into()));
    v.insert("gpus".to_string(), Value::Int(1));
    v.insert("parallel".to_string(), Value::Str("single".into()));
    v.insert("features".to_string(), Value::Set(Default::default()));
    Cell {
        id: CellId::from_values(&v),
        values: v,
        params: Params {
            steps: 4,
            warmup: 1,
            seq_len: 64,
            micro_batch: 2,
            global_batch: 2,
            grad_accum: 1,
            workload: Workload::framework(if torchtitan { "torchtitan" } else { "hf" }),
            ..Params::default()
        },
    }
}

/// Lines of either framework's log, real-shaped with any figures (absurd ones included),
/// bench's own events behind escape bytes, rank prefixes and noise.
fn framework_line() -> impl Strategy<Value = String> {
    let num = prop_oneof![
        Just("0.05".to_string()),
        Just("6.1".to_string()),
        Just("9.8e-301".to_string()),
        Just("1e-300".to_string()),
        Just("3.2e7".to_string()),
        Just("-1.5".to_string()),
        Just("0".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("353,169".to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        "[0-9]{1,4}\\.[0-9]{1,6}".prop_map(|s| s),
    ];
    let device = prop_oneof![
        Just("cpu"),
        Just("NVIDIA H100 80GB HBM3"),
        Just("AMD Instinct MI300X"),
        Just("<img src=x>"),
    ];
    let escape = prop_oneof![
        Just(""),
        Just("\x1b"),
        Just("\x07"),
        Just("  "),
        Just("\x1b[31m"),
        Just("\x1b]0;title\x07"),
        Just("\r"),
    ];
    let line = prop_oneof![
        (device, 0u32..3).prop_map(|(d, w)| format!(
            "bench-framework: {{\"name\": \"transformers\", \"version\": \"4.57.1\", \"libraries\": {{}}, \"device\": \"{d}\", \"world_size\": {w}}}"
        )),
        (1u64..6, num.clone(), prop_oneof![Just(128u64), any::<u64>()]).prop_map(
            |(i, t, k)| format!("[bench-hf] step: {i} time: {t} tokens: {k} memory: -1")
        ),
        num.clone()
            .prop_map(|l| format!("{{'loss': {l}, 'grad_norm': 1.0, 'learning_rate': 0.0003}}")),
        num.clone().prop_map(|n| format!(
            "{{'train_runtime': 1.0, 'train_samples_per_second': {n}, 'train_loss': 6.1}}"
        )),
        Just("[titan] 2026-11-22 10:00:00,000 - root - INFO - Trainer is initialized with local batch size 2, global batch size 2, gradient accumulation steps 1, sequence length 64, total steps 4".to_string()),
        (1u64..6, 0u32..60, 0u32..1000, num.clone(), num.clone(), num).prop_map(
            |(i, sec, ms, loss, tps, mfu)| format!(
                "[titan] 2026-11-22 10:00:{sec:02},{ms:03} - root - INFO - step: {i} loss: {loss} grad_norm: 1.0 memory: 1.0GiB(1.0%) tps: {tps} tflops: 1.0 mfu: {mfu}%"
            )
        ),
        (escape, event_line()).prop_map(|(e, l)| format!("{e}{l}")),
        "\\PC{0,40}".prop_map(|s| s),
    ];
    (
        prop_oneof![Just(""), Just("[rank0]:"), Just("[rank1]:")],
        line,
    )
        .prop_map(|(rank, l)| format!("{rank}{l}"))
}

fn check_framework_log(cell: &Cell, output: &[u8]) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = bench::external::run::read_log(cell, output, 60.0);
    quick(started, "reading a framework log")?;
    // Every step the adapter lets through is a measurement: finite, above zero, within the
    // run's 60 s, a cross-entropy not below zero, and far below any forged throughput.
    for (step, t, loss) in result.iter().flatten() {
        prop_assert!(
            t.is_finite() && *t > 0.0 && *t <= 61.0,
            "step {} took {} s",
            step,
            t
        );
        prop_assert!(
            loss.is_finite() && *loss >= 0.0,
            "step {} loss {}",
            step,
            loss
        );
        prop_assert!(128.0 / t < 1e12, "step {} at {} tokens/s", step, 128.0 / t);
    }
    // Whatever the framework printed, the runner reads no event and no broken contract in
    // what `bench adapt` echoes of it: only the adapter speaks for the cell.
    let mut lines = Vec::new();
    let mut split = LineSplitter::default();
    split.push(output, &mut |l| lines.push(l));
    lines.extend(split.flush());
    let mut runner = EventReader::default();
    for line in &lines {
        let echoed = format!("{}\n", bench::external::run::echo_line(line));
        let mut seen = LineSplitter::default();
        let mut read = Vec::new();
        seen.push(echoed.as_bytes(), &mut |l| read.push(l));
        for l in read {
            prop_assert!(
                runner.line(0, &l).is_none(),
                "the runner read an event in {:?}",
                l
            );
        }
    }
    prop_assert!(runner.violation().is_none(), "{:?}", runner.violation());
    Ok(())
}

#[test]
fn fuzz_framework_log_parsers() {
    let strategy = (
        any::<bool>(),
        prop_oneof![Just("bf16"), Just("fp32")],
        prop::collection::vec(framework_line(), 0..24),
    );
    fuzz("framework-logs", strategy, |(torchtitan, dtype, lines)| {
        let cell = framework_cell(torchtitan, dtype);
        check_framework_log(&cell, lines.join("\n").as_bytes())
    });
}

// ------------------------------------------------------------ bench ingest logs (issue 22)

/// Step lines of every framework `bench ingest` reads, with any figures (absurd ones
/// included), launcher prefixes, cut ends, progress-bar carriage returns and noise.
fn ingest_line() -> impl Strategy<Value = String> {
    let num = prop_oneof![
        Just("11.24".to_string()),
        Just("8500.0".to_string()),
        Just("1e-300".to_string()),
        Just("1e300".to_string()),
        Just("-1.5".to_string()),
        Just("0".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("1,234".to_string()),
        any::<f64>().prop_map(|f| f.to_string()),
        "[0-9]{1,4}\\.[0-9]{1,3}".prop_map(|s| s),
    ];
    let step = prop_oneof![0u64..4, Just(u64::MAX), Just(1u64 << 53)];
    let line = prop_oneof![
        (step.clone(), num.clone(), num.clone()).prop_map(|(i, t, l)| format!(
            "Training epoch 0, iteration {i}/9 | global_batch_size: 8 | reduced_train_loss: {l} | train_step_timing in s: {t} | consumed_samples: 8"
        )),
        (step.clone(), num.clone(), num.clone()).prop_map(|(i, t, l)| format!(
            "Epoch 0: : 10%|█ | {i}/9 [00:01<00:09, reduced_train_loss={l}, global_step={i}.00, train_step_timing in s={t}]"
        )),
        num.clone().prop_map(|t| format!(
            "I0411 15:03:26.866614 1407 programs.py:366] [PAX STATUS]: train_step() took {t} seconds."
        )),
        (step.clone(), num.clone(), num.clone()).prop_map(|(i, t, l)| format!(
            " [2025-03-01 10:00:00] iteration {i:8}/ 9 | elapsed time per iteration (ms): {t} | global batch size: 8 | lm loss: {l} | number of nan iterations: 0 |"
        )),
        (step.clone(), num.clone(), num.clone()).prop_map(|(i, t, l)| format!(
            "completed step: {i}, seconds: {t}, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, total_weights: 8, loss: {l}"
        )),
        (step.clone(), 0u32..60, num.clone(), num.clone()).prop_map(|(i, sec, l, tps)| format!(
            "[titan] 2026-11-22 10:00:{sec:02},000 - root - INFO - step: {i} loss: {l} memory: 1.0GiB(1.0%) tps: {tps} tflops: 1.0 mfu: 1.0%"
        )),
        (step.clone(), num.clone(), num.clone()).prop_map(|(i, t, l)| format!(
            "step {i}/9 | loss {l} | norm 1.0 | lr 1e-4 | {t} ms | 1000 tok/s"
        )),
        (step, num).prop_map(|(i, r)| format!(
            "epoch=0/micro_step={i}/global_step={i}, RunningAvgSamplesPerSec=1.0, CurrSamplesPerSec={r}, MemAllocated=1GB"
        )),
        "\\PC{0,40}".prop_map(|s| s),
    ];
    (
        prop_oneof![
            Just(""),
            Just("[rank0]:"),
            Just("[rank1]:"),
            Just(" 0: "),
            Just("\x1b[32m")
        ],
        line,
        prop_oneof![Just(0usize), 1usize..200],
        prop_oneof![Just("\n"), Just("\r"), Just("\0")],
    )
        .prop_map(|(rank, l, cut, end)| {
            let full = format!("{rank}{l}");
            // Sometimes cut the line short, as a truncated log does (on a char boundary).
            let mut at = if cut == 0 {
                full.len()
            } else {
                cut.min(full.len())
            };
            while !full.is_char_boundary(at) {
                at -= 1;
            }
            format!("{}{end}", &full[..at])
        })
}

fn check_ingest(bytes: &[u8]) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = bench::ingest::read_bytes(bytes, 8, 1);
    quick(started, "reading an ingested log")?;
    // Every step let through is a step bench believes: a finite time above 0 and at most a
    // day, and a finite loss of 0 or more when there is one.
    for (t, loss) in result.iter().flatten() {
        prop_assert!(
            t.is_finite() && *t > 0.0 && *t <= 86_400.0,
            "step time {}",
            t
        );
        if let Some(l) = loss {
            prop_assert!(l.is_finite() && *l >= 0.0, "loss {}", l);
        }
    }
    Ok(())
}

#[test]
fn fuzz_ingest_log_reader() {
    fuzz(
        "ingest-logs",
        prop::collection::vec(ingest_line(), 0..24),
        |lines| check_ingest(lines.concat().as_bytes()),
    );
}

// ------------------------------------------------------ history store locations (issue 25)

/// A `--history` value with credentials in every place one can be given, and those
/// credentials (as written, and decoded).
fn store_location() -> impl Strategy<Value = (String, Vec<String>)> {
    // Characters a password may hold without changing where the URL's parts end.
    let secret = "[A-Za-z0-9._~!$*+,;-]{4,12}".prop_map(|s| format!("S3c{s}"));
    let scheme = prop_oneof![
        Just("postgres://"),
        Just("postgresql://"),
        Just("POSTGRES://"),
        Just("PostgreSQL://"),
        Just("sqlite://"),
        Just("https://"),
        Just("file://"),
        Just(""),
    ];
    let key = prop_oneof![
        Just("password"),
        Just("PassWord"),
        Just("p%61ssword"),
        Just("sslpassword"),
    ];
    let url = (
        scheme,
        prop::option::of(secret.clone()),
        prop::collection::vec((key.clone(), secret.clone(), any::<bool>()), 0..3),
        any::<bool>(),
    )
        .prop_map(|(scheme, userinfo, params, encode)| {
            let mut secrets = Vec::new();
            let mut loc = scheme.to_string();
            if let Some(p) = userinfo {
                // Percent-encoding the first character keeps it a password and hides the
                // decoded form from a plain search: both forms are secrets.
                let given = if encode {
                    format!("%{:02X}{}", p.as_bytes()[0], &p[1..])
                } else {
                    p.clone()
                };
                loc.push_str(&format!("ci:{given}@"));
                // Without a scheme it is a file path, shown as given.
                if !scheme.is_empty() {
                    secrets.push(given);
                    secrets.push(p);
                }
            }
            loc.push_str("db.internal:5432/bench?sslmode=disable");
            for (k, v, _) in &params {
                loc.push_str(&format!("&{k}={v}"));
                secrets.push(v.clone());
            }
            (loc, secrets)
        });
    let keywords = (secret, any::<bool>()).prop_map(|(p, quoted)| {
        let v = if quoted {
            format!("'{p} x'")
        } else {
            p.clone()
        };
        (
            format!("host=db user=ci password={v} dbname=bench"),
            vec![p],
        )
    });
    prop_oneof![url, keywords, "\\PC{0,40}".prop_map(|s| (s, vec![]))]
}

fn check_store_location(location: &str, secrets: &[String]) -> Result<(), TestCaseError> {
    use bench::history::{parse_location, postgres::redact, Location};
    let shown = redact(location);
    let parsed = parse_location(location);
    let message = match &parsed {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    for s in secrets {
        prop_assert!(!shown.contains(s.as_str()), "{} shown as {}", s, shown);
        prop_assert!(!message.contains(s.as_str()), "{} in {}", s, message);
    }
    let scheme = location
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .filter(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        });
    match (scheme.as_deref(), &parsed) {
        (Some("postgres" | "postgresql"), Ok(Location::Postgres(url))) => {
            prop_assert!(url.starts_with("postgres://") || url.starts_with("postgresql://"));
        }
        (Some("postgres" | "postgresql"), other) => {
            prop_assert!(false, "{} read as {:?}", location, other)
        }
        // Any other `scheme://` is refused, never taken for a file name.
        (Some(_), other)
            if scheme
                .as_deref()
                .is_some_and(|s| s.starts_with(|c: char| c.is_ascii_alphabetic())) =>
        {
            prop_assert!(other.is_err(), "{} read as {:?}", location, other)
        }
        _ => {}
    }
    if location.contains("password=") && location.contains("host=") && !location.contains("://") {
        prop_assert!(parsed.is_err(), "{} read as {:?}", location, parsed);
    }
    Ok(())
}

#[test]
fn fuzz_store_locations() {
    fuzz(
        "store-locations",
        store_location(),
        |(location, secrets)| check_store_location(&location, &secrets),
    );
}

// ------------------------------------------------------------------ results journal

/// One line of a results journal as the fuzzer writes it.
#[derive(Debug, Clone)]
enum JournalPiece {
    /// A whole entry of run `r` for cell `c<id>` with reason `<reason>`.
    Entry(u8, u8),
    /// A whole entry of another run.
    Foreign(u8),
    /// The first `n` bytes (fewer than all) of an entry: a write cut short.
    Cut(u8, usize),
    /// Bytes that are no entry (never blank, never a newline).
    Garbage(Vec<u8>),
    /// Spaces, tabs or a carriage return only.
    Blank(String),
}

fn journal_entry(run: &str, id: u8, reason: u8) -> String {
    serde_json::json!({
        "run": run,
        "cell": {
            "id": format!("c{id}"), "values": {}, "params": Params::default(),
            "status": "failed", "reason": format!("r{reason}"), "duration_s": 1.0,
        },
    })
    .to_string()
}

fn journal_piece() -> impl Strategy<Value = JournalPiece> {
    prop_oneof![
        4 => (0u8..6, any::<u8>()).prop_map(|(i, r)| JournalPiece::Entry(i, r)),
        1 => (0u8..6).prop_map(JournalPiece::Foreign),
        1 => (0u8..6, 1usize..200).prop_map(|(i, n)| JournalPiece::Cut(i, n)),
        1 => prop::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..40)
            .prop_map(|mut g| {
                g.insert(0, b'x');
                JournalPiece::Garbage(g)
            }),
        1 => "[ \t\r]{0,3}".prop_map(JournalPiece::Blank),
    ]
}

/// A journal of these pieces beside a document of run `r` holding cell `c0`: `load` never
/// panics and answers at once; it leaves out a last line without its newline, and a last
/// line that does not read; it refuses exactly the journals with another bad line or a
/// whole entry of another run (naming the journal and the line), and otherwise holds each
/// cell once with its latest result.
fn check_journal(pieces: &[JournalPiece], newline_at_end: bool) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let doc = serde_json::json!({
        "schema_version": 1, "run_id": "r", "matrix": "m.yaml", "matrix_name": "m",
        "filters": [], "started_at": "t",
        "environment": bench::results::Environment::default(),
        "cells": [serde_json::from_str::<serde_json::Value>(&journal_entry("r", 0, 255)).unwrap()["cell"]],
    });
    std::fs::write(dir.path().join(RunResults::FILE), doc.to_string()).unwrap();
    let mut bytes = Vec::new();
    let mut lines = Vec::new();
    for (k, p) in pieces.iter().enumerate() {
        let line = match p {
            JournalPiece::Entry(i, r) => journal_entry("r", *i, *r).into_bytes(),
            JournalPiece::Foreign(i) => journal_entry("other", *i, 0).into_bytes(),
            JournalPiece::Cut(i, n) => {
                let e = journal_entry("r", *i, 0).into_bytes();
                e[..(*n).min(e.len() - 1)].to_vec()
            }
            JournalPiece::Garbage(g) => g.clone(),
            JournalPiece::Blank(b) => b.clone().into_bytes(),
        };
        bytes.extend_from_slice(&line);
        if k + 1 < pieces.len() || newline_at_end {
            bytes.push(b'\n');
        }
        lines.push((k + 1, p));
    }
    std::fs::write(dir.path().join(RunResults::JOURNAL), &bytes).unwrap();

    // The model: blank lines are skipped; the last non-blank line, if it is not a whole
    // entry, is left out; any other line that is not a whole entry of run `r` is an error.
    // The model. Blank lines are skipped. The last non-blank line is left out when it has no
    // newline (cut short, whatever it holds) or, with its newline, when it is not a whole
    // entry. Any other line that is not a whole entry of run `r`, or a whole entry of another
    // run, is an error: it was synced before the next line was written, so it is damage, not
    // a crash's cut.
    let torn = !newline_at_end && !matches!(pieces.last(), None | Some(JournalPiece::Blank(_)));
    let non_blank: Vec<_> = lines
        .iter()
        .filter(|(_, p)| !matches!(p, JournalPiece::Blank(_)))
        .collect();
    let mut want_error = None;
    let mut want: Vec<(String, String)> = vec![("c0".into(), "r255".into())];
    for (k, (line_no, p)) in non_blank.iter().enumerate() {
        let last = k + 1 == non_blank.len();
        match p {
            _ if last && torn => {}
            JournalPiece::Entry(i, r) => {
                let (id, reason) = (format!("c{i}"), format!("r{r}"));
                match want.iter_mut().find(|(w, _)| *w == id) {
                    Some(w) => w.1 = reason,
                    None => want.push((id, reason)),
                }
            }
            JournalPiece::Cut(..) | JournalPiece::Garbage(_) if last => {}
            _ => {
                want_error = Some(*line_no);
                break;
            }
        }
    }

    let started = Instant::now();
    let got = RunResults::load(dir.path());
    quick(started, "a results journal")?;
    match (got, want_error) {
        (Ok(r), None) => {
            let got: Vec<(String, String)> = r
                .cells
                .iter()
                .map(|c| {
                    let reason = match &c.outcome {
                        bench::results::Outcome::Failed { reason } => reason.clone(),
                        o => format!("{o:?}"),
                    };
                    (c.id.as_str().to_string(), reason)
                })
                .collect();
            prop_assert_eq!(got, want);
        }
        (Err(e), Some(line_no)) => {
            let e = e.to_string();
            prop_assert!(
                e.contains(&format!("results.journal:{line_no}:")),
                "the error names another line than {}: {}",
                line_no,
                e
            );
        }
        (got, want) => prop_assert!(
            false,
            "got {:?}, the model says error at {:?}",
            got.map(|r| r.cells.len()),
            want
        ),
    }
    Ok(())
}

#[test]
fn fuzz_results_journal() {
    fuzz(
        "results-journal",
        (prop::collection::vec(journal_piece(), 0..12), any::<bool>()),
        |(pieces, newline)| check_journal(&pieces, newline),
    );
}

// ----------------------------------------------------- crashes found, kept as regressions

/// The inputs issue 13 reported as crashes and silent wrong answers, through the fuzz checks.
#[test]
fn issue_13_inputs_stay_fixed() {
    limit_memory();
    let axes = |n: usize| {
        (0..n)
            .map(|i| format!("  a{i}: [x, y]\n"))
            .collect::<String>()
    };
    for yaml in [
        format!("axes:\n{}", axes(100)),
        format!("axes:\n{}", axes(30)),
        format!(
            "axes:\n  features: {{subsets_of: [{}]}}\n",
            (0..40)
                .map(|i| format!("f{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        "axes:\n  gpus: [65536]\ndefaults: {micro_batch: 65536}\n".to_string(),
        "axes:\n  gpus: [4294967296]\n".to_string(),
        format!(
            "axes:\n  m: [a]\nrules:\n  - when: \"{}m=a{}\"\n    reason: r\n",
            "(".repeat(4500),
            ")".repeat(4500)
        ),
    ] {
        check_matrix(&yaml, &[]).unwrap();
    }
    // Found by this fuzzer: an empty axis made the budget's product zero, so `subsets_of`
    // over 57 flags beside it asked for 2^57 sets (the CI machine's memory, SIGKILL); the
    // empty axis is now refused first, by name, whichever axis comes first.
    check_matrix(
        &format!(
            "axes:\n  many: {{subsets_of: [{}]}}\n  x: []\n",
            (0..57)
                .map(|i| format!("f{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        &[],
    )
    .unwrap();
    // Found by this fuzzer: YAML nested 64 deep (serde-saphyr's default limit) overflowed
    // the 2 MiB stack of a test thread in a debug build, in matrix and baseline files.
    for n in [24, 64, 3000] {
        let map = "{a: ".repeat(n) + "1" + &"}".repeat(n);
        let seq = "[".repeat(n) + &"]".repeat(n);
        check_matrix(&format!("axes:\n  m: [a]\ndeep: {map}\n"), &[]).unwrap();
        check_matrix(&format!("axes:\n  m: [a]\n  deep: {seq}\n"), &[]).unwrap();
        check_matrix(
            &format!("defaults:\n  extra: {{x: {seq}}}\naxes:\n  m: [a]\n"),
            &[],
        )
        .unwrap();
        check_baseline(&format!(
            "schema_version: 1\nhardware_key: cpu-x86_64\ncells: {map}\n"
        ))
        .unwrap();
    }
    for f in [
        format!("{}a", "!".repeat(100_000)),
        vec!["a"; 40_000].join(" || "),
        format!("{}a{}", "(".repeat(4500), ")".repeat(4500)),
    ] {
        check_filter(&f).unwrap();
    }
}

/// Inputs of issue 25, and what its fuzz targets found, through the fuzz checks.
#[test]
fn issue_25_inputs_stay_fixed() {
    limit_memory();
    // Found by this fuzzer: a quoted keyword value with a space was taken for a file path.
    check_store_location(
        "host=db user=ci password='S3cA0aa x' dbname=bench",
        &["S3cA0aa".to_string()],
    )
    .unwrap();
    for (location, secret) in [
        ("POSTGRES://user:S3cpass@host/db", "S3cpass"),
        ("postgres://db/bench?password=S3cquery", "S3cquery"),
        ("postgres://db/bench?p%61ssword=S3cenc", "S3cenc"),
    ] {
        check_store_location(location, &[secret.to_string()]).unwrap();
    }
    // Bench's own events in a framework's log, plain and behind an ESC or BEL byte, and
    // the issue's absurd figures.
    let hf = framework_cell(false, "fp32");
    let driver = r#"bench-framework: {"name": "transformers", "version": "4.57.1", "libraries": {}, "device": "cpu", "world_size": 1}"#;
    let forged =
        r#"{"event":"step","step":1,"step_time_s":0.000001,"tokens":128000000,"loss":1.0}"#;
    let log = format!("{driver}\n{forged}\n\x1b{forged}\n\x07{forged}\n");
    check_framework_log(&hf, log.as_bytes()).unwrap();
    for (time, loss) in [("9.8e-301", "6.1"), ("32000000", "6.1"), ("0.05", "-1.5")] {
        let log = format!(
            "{driver}\n[bench-hf] step: 1 time: {time} tokens: 128 memory: -1\n{{'loss': {loss}}}\n"
        );
        check_framework_log(&hf, log.as_bytes()).unwrap();
        assert!(bench::external::run::read_log(&hf, log.as_bytes(), 60.0).is_err());
    }
}

// --------------------------------------------- Chrome traces of one step (issue 30's triage)

/// Trace-shaped text: well-formed device and host events, the hostile values a trace can
/// hold (negative, infinite or missing durations, names of thousands of characters, events
/// that are not objects), cut anywhere.
fn trace_text() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("gemm".to_string()),
        Just("ncclDevKernel_AllReduce".to_string()),
        Just("master_adamw".to_string()),
        "[a-z_<>:,]{0,12}".prop_map(|s| s),
        Just("x".repeat(5000)),
        Just("\\u0000\\\"".to_string()),
    ];
    let number = prop_oneof![
        Just("0".to_string()),
        Just("-5".to_string()),
        Just("1e308".to_string()),
        Just("1e999".to_string()),
        Just("\"12\"".to_string()),
        Just("null".to_string()),
        (0u32..100_000).prop_map(|n| n.to_string()),
        (0.0f64..1e6).prop_map(|x| format!("{x}")),
    ];
    let cat = prop_oneof![
        Just("\"kernel\""),
        Just("\"cpu_op\""),
        Just("\"gpu_memcpy\""),
        Just("7"),
    ];
    let event = prop_oneof![
        (name, number.clone(), number, cat).prop_map(|(n, ts, d, c)| format!(
            r#"{{"ph":"X","cat":{c},"name":"{n}","ts":{ts},"dur":{d},"args":{{"a":[1,{{}}]}}}}"#
        )),
        Just("1".to_string()),
        Just("\"s\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
    ];
    (
        prop::collection::vec(event, 0..40),
        prop::bool::ANY,
        0usize..4000,
        prop::bool::ANY,
    )
        .prop_map(|(events, bare, cut, truncate)| {
            let list = events.join(",");
            let full = if bare {
                format!("[{list}]")
            } else {
                format!(r#"{{"schemaVersion":1,"traceEvents":[{list}],"x":{{"y":[]}}}}"#)
            };
            if truncate && cut < full.len() {
                let mut at = cut;
                while !full.is_char_boundary(at) {
                    at -= 1;
                }
                full[..at].to_string()
            } else {
                full
            }
        })
}

fn check_trace(text: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let result = bench::triage::kernels::parse_trace(text, "trace.json");
    quick(started, "reading a trace")?;
    match result {
        Ok(t) => {
            // Every kernel kept is a real duration, and the total is finite.
            for (name, (d, calls)) in &t.kernels {
                prop_assert!(d.is_finite() && *d >= 0.0, "{} {}", name, d);
                prop_assert!(*calls >= 1);
                prop_assert!(name.chars().count() <= 300);
            }
            prop_assert!(t.total_us().is_finite());
            prop_assert!(t.exposed_collective_us.is_finite() && t.exposed_collective_us >= 0.0);
        }
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("trace.json: "), "{}", msg);
        }
    }
    Ok(())
}

#[test]
fn fuzz_chrome_trace_reader() {
    fuzz("chrome-traces", trace_text(), |t| check_trace(&t));
}

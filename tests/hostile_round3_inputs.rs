//! Issue 34 ("Hostile input, round 3") through the built binary, the input classes: names
//! that leave their folder (4), made-up figures from logs and run folders (5), FIFOs and
//! endless files (7), unbounded work (10), and the smaller cases (11). Each case checks the
//! exit code, the message, a time limit, and that nothing was written outside the results
//! folder. Inputs live in tests/fixtures/hostile3/ or are written by the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest any case may take: each is refused before any work.
const LIMIT: Duration = Duration::from_secs(20);

fn bench(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.current_dir(dir)
        .env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_HISTORY")
        .env_remove("BENCH_MAX_CELLS")
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::null());
    c
}

/// Runs `bench ARGS` in `dir`, killed after [`LIMIT`] (a hang fails the test, not CI).
fn run(dir: &Path, args: &[&str]) -> Output {
    let mut child = bench(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bench");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("bench {args:?} still running after {LIMIT:?}: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn refused(o: &Output, want: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains(want), "want {want:?} in: {t}");
    assert!(!t.contains("panicked"), "{t}");
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every path under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
}

/// The megatron fixture's own parameters.
fn megatron_args(log: &Path) -> Vec<String> {
    [
        log.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
        "--global-batch",
        "128",
        "--seq-len",
        "4096",
        "--gpus",
        "8",
        "--gpu",
        "h100",
    ]
    .map(String::from)
    .to_vec()
}

fn nemo_args(log: &Path) -> Vec<String> {
    [
        log.to_str().unwrap(),
        "--model",
        "llama-3.1-405b",
        "--global-batch",
        "252",
        "--seq-len",
        "8192",
        "--gpus",
        "576",
        "--dtype",
        "fp8",
        "--skip-steps",
        "0",
    ]
    .map(String::from)
    .to_vec()
}

fn ingest(dir: &Path, args: &[String], extra: &[&str]) -> Output {
    let mut all: Vec<&str> = vec!["ingest"];
    all.extend(args.iter().map(String::as_str));
    all.extend(extra);
    run(dir, &all)
}

/// A copy of the cpu-ok run folder in `dir/name`, with `edit` applied to its document.
fn run_folder(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = fixture("runs/cpu-ok/results.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    edit(&mut doc);
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("results.json"), serde_json::to_vec(&doc).unwrap()).unwrap();
    d
}

// ---- 4: names that leave their folder -------------------------------------------------

#[test]
fn c4_ingest_run_ids_that_leave_the_results_dir_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("work");
    std::fs::create_dir_all(&dir).unwrap();
    let log = fixture("ingest/megatron-core-0.12-llama31-8b.log");
    for id in ["../../x", "", ".", "a/b", "x\ny", "/tmp/bench-hostile3-abs"] {
        let o = ingest(&dir, &megatron_args(&log), &["--run-id", id]);
        refused(&o, "--run-id");
        assert!(
            text(&o).contains("a run id names one folder"),
            "{}",
            text(&o)
        );
    }
    assert!(tree(&dir).is_empty(), "{:?}", tree(&dir));
    assert!(tree(tmp.path()) == vec!["work".to_string()]);
    assert!(!Path::new("/tmp/bench-hostile3-abs").exists());
}

#[test]
fn c4_ingest_hardware_key_outside_baselines_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("work");
    std::fs::create_dir_all(dir.join("baselines")).unwrap();
    std::fs::write(tmp.path().join("evil.yaml"), "not: [a baseline").unwrap();
    let log = fixture("ingest/megatron-core-0.12-llama31-8b.log");
    let o = ingest(&dir, &megatron_args(&log), &["--hardware-key", "../evil"]);
    refused(&o, "--hardware-key \"../evil\"");
    assert!(!dir.join("results").exists(), "{:?}", tree(&dir));
}

#[test]
fn c4_a_results_document_naming_a_key_outside_baselines_is_refused_by_report() {
    let tmp = tempfile::tempdir().unwrap();
    let d = run_folder(tmp.path(), "r", |doc| {
        doc["environment"]["hardware_key"] = "../evil".into();
    });
    let o = run(tmp.path(), &["report", d.to_str().unwrap()]);
    refused(&o, "environment.hardware_key");
    let d = run_folder(tmp.path(), "s", |doc| doc["run_id"] = "../../x".into());
    let o = run(
        tmp.path(),
        &[
            "history",
            "import",
            d.to_str().unwrap(),
            "--history",
            "h.sqlite",
        ],
    );
    refused(&o, ": run_id");
    assert!(!tmp.path().join("h.sqlite").exists());
}

#[test]
fn c4_history_and_accept_check_the_same_names() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        tmp.path(),
        &[
            "history",
            "c",
            "--history",
            "h.sqlite",
            "--hardware",
            "../x",
        ],
    );
    refused(&o, "--hardware \"../x\"");
    let o = run(
        tmp.path(),
        &[
            "baseline",
            "accept",
            "c",
            "--reason",
            "r",
            "--history",
            "h.sqlite",
            "--run",
            "a/b",
        ],
    );
    refused(&o, "--run \"a/b\"");
    let o = run(tmp.path(), &["matrix", "m.yaml", "--run-id", "../x"]);
    refused(&o, "--run-id \"../x\"");
    assert!(tree(tmp.path()).is_empty(), "{:?}", tree(tmp.path()));
}

// ---- 5: made-up figures -------------------------------------------------------------------

#[test]
fn c5_two_progress_bars_interleaved_are_refused_with_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fixture("hostile3/nemo-two-bars-interleaved.log");
    let o = ingest(tmp.path(), &nemo_args(&log), &[]);
    refused(&o, "nemo-two-bars-interleaved.log:3: epoch 0 after epoch 1");
    assert!(!tmp.path().join("results").exists());
}

#[test]
fn c5_a_decimal_comma_is_refused_not_misread() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fixture("hostile3/nemo-decimal-comma.log");
    let o = ingest(tmp.path(), &nemo_args(&log), &[]);
    refused(&o, "nemo-decimal-comma.log:1:");
    assert!(text(&o).contains("decimal comma"), "{}", text(&o));
    let log = fixture("hostile3/maxtext-decimal-comma.log");
    let args: Vec<String> = [
        log.to_str().unwrap(),
        "--model",
        "llama-3.1-8b",
        "--global-batch",
        "32",
        "--seq-len",
        "8192",
        "--gpus",
        "8",
    ]
    .map(String::from)
    .to_vec();
    let o = ingest(tmp.path(), &args, &[]);
    refused(&o, "maxtext-decimal-comma.log:1:");
    assert!(text(&o).contains("decimal comma"), "{}", text(&o));
    assert!(!tmp.path().join("results").exists());
}

/// `train_step_timing in s: 8.5%` was read as 8.5 s: every field's `%` was stripped. A
/// `%` is read only in a percentage field (an MFU); on a time it is refused at file:line.
#[test]
fn c5_a_percent_sign_on_a_time_is_refused_not_stripped() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fixture("hostile3/nemo-percent-time.log");
    let o = ingest(tmp.path(), &nemo_args(&log), &[]);
    refused(&o, "nemo-percent-time.log:3:");
    assert!(text(&o).contains("not a percentage"), "{}", text(&o));
    assert!(!tmp.path().join("results").exists());
    // The same log without the `%` reads.
    let o = ingest(
        tmp.path(),
        &nemo_args(&fixture("hostile3/nemo-ok.log")),
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn c5_the_same_log_given_twice_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fixture("hostile3/nemo-ok.log");
    let mut args = nemo_args(&log);
    args.insert(1, log.to_str().unwrap().to_string());
    let o = ingest(tmp.path(), &args, &[]);
    refused(&o, "given twice");
    let copy = tmp.path().join("copy.log");
    std::fs::copy(&log, &copy).unwrap();
    args[1] = copy.to_str().unwrap().to_string();
    let o = ingest(tmp.path(), &args, &[]);
    refused(&o, "the same content as");
    assert!(!tmp.path().join("results").exists());
}

#[test]
fn c5_absurd_ingest_arguments_are_refused_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fixture("ingest/megatron-core-0.12-llama31-8b.log");
    let base = |model: &[&str], gpus: &str, peak: &[&str]| {
        let mut a: Vec<String> = vec![log.to_str().unwrap().into()];
        a.extend(model.iter().map(|s| s.to_string()));
        a.extend(
            ["--global-batch", "128", "--seq-len", "4096", "--gpus", gpus]
                .iter()
                .map(|s| s.to_string()),
        );
        a.extend(peak.iter().map(|s| s.to_string()));
        a
    };
    let model = ["--model", "llama-3.1-8b"];
    for (args, want) in [
        (
            base(&["--params-billion", "1e-12"], "8", &["--gpu", "h100"]),
            "--params-billion 0.000000000001",
        ),
        (
            base(&model, "4294967295", &["--gpu", "h100"]),
            "--gpus 4294967295",
        ),
        (
            base(&model, "8", &["--peak-tflops", "1e300"]),
            "--peak-tflops",
        ),
        (
            base(&model, "8", &["--peak-tflops", "nan"]),
            "--peak-tflops",
        ),
    ] {
        let o = ingest(tmp.path(), &args, &[]);
        refused(&o, want);
    }
    assert!(!tmp.path().join("results").exists());
}

#[test]
fn c5_impossible_metric_values_are_refused_at_history_import() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, v) in [
        serde_json::json!(0.0),
        serde_json::json!(-5.0),
        serde_json::json!(1e308),
        serde_json::json!(5e-324),
    ]
    .into_iter()
    .enumerate()
    {
        let d = run_folder(tmp.path(), &format!("r{i}"), |doc| {
            doc["cells"][0]["metrics"]["tokens_per_s"]["value"] = v.clone();
        });
        let o = run(
            tmp.path(),
            &[
                "history",
                "import",
                d.to_str().unwrap(),
                "--history",
                "h.sqlite",
            ],
        );
        refused(
            &o,
            "cells[0] (gpt2-tiny.fp32.1gpu.single.base).metrics.tokens_per_s.value",
        );
        assert!(!tmp.path().join("h.sqlite").exists());
    }
    // The real run still imports.
    let o = run(
        tmp.path(),
        &[
            "history",
            "import",
            fixture("runs/cpu-ok").to_str().unwrap(),
            "--history",
            "h.sqlite",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A command-workload cell of `gpus` GPUs whose worker's summary reports `world_size`
/// ranks, run through `bench matrix`: (exit code, the cell's document).
fn world_size_run(dir: &Path, gpus: u32, world_size: u64) -> (Option<i32>, serde_json::Value) {
    let worker = dir.join("w.sh");
    std::fs::write(
        &worker,
        "printf '{\"event\":\"start\",\"model\":\"w\",\"world_size\":1}\\n'\n\
         for i in 0 1 2 3 4; do printf '{\"event\":\"step\",\"step\":%d,\"step_time_s\":0.5,\"tokens\":1024,\"loss\":2.5}\\n' $i; done\n\
         printf '{\"event\":\"summary\",\"world_size\":%s}\\n' \"$1\"\n",
    )
    .unwrap();
    let id = format!("w{gpus}-{world_size}");
    let m = dir.join(format!("{id}.yaml"));
    std::fs::write(
        &m,
        format!(
            "name: w\naxes:\n  model: [small]\n  gpus: [{gpus}]\ndefaults:\n  steps: 5\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, \"{}\", \"{world_size}\"]\n",
            worker.display()
        ),
    )
    .unwrap();
    let o = run(
        dir,
        &[
            "matrix",
            m.to_str().unwrap(),
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            &id,
        ],
    );
    let t = text(&o);
    assert!(!t.contains("panicked"), "{t}");
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("results").join(&id).join("results.json"))
            .unwrap_or_else(|e| panic!("{e}: {t}")),
    )
    .unwrap();
    (o.status.code(), doc["cells"][0].clone())
}

#[test]
fn c5_a_worker_world_size_other_than_the_cells_gpus_fails_the_cell() {
    let tmp = tempfile::tempdir().unwrap();
    for world in [1_048_576u64, 8] {
        let (rc, cell) = world_size_run(tmp.path(), 1, world);
        assert_eq!(rc, Some(1), "{cell}");
        assert_eq!(cell["status"], "failed", "{cell}");
        let reason = cell["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!("a world size of {world} on a cell of 1 GPU(s)")),
            "{cell}"
        );
        assert!(
            cell["metrics"].as_object().is_none_or(|m| m.is_empty()),
            "{cell}"
        );
    }
    // The cell's own world size passes, and a CPU cell's ranks are not GPUs.
    for (gpus, world) in [(1, 1), (0, 2)] {
        let (rc, cell) = world_size_run(tmp.path(), gpus, world);
        assert_eq!(rc, Some(0), "{cell}");
        assert_eq!(cell["status"], "passed", "{cell}");
    }
}

/// The metrics stored for `run_id`'s cell `cell` in the SQLite store at `db`.
fn stored_metrics(db: &Path, run_id: &str, cell: &str) -> Vec<String> {
    let db = rusqlite::Connection::open(db).unwrap();
    let mut st = db
        .prepare(
            "SELECT metric FROM bench_metrics WHERE run_id = ?1 AND cell_id = ?2 ORDER BY metric",
        )
        .unwrap();
    st.query_map([run_id, cell], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A worker's `"mfu":0,"tflops_per_gpu":0` is its "could not compute it": `bench matrix`
/// stores no such metric, and `bench history import` of a run folder holding a 0 (as
/// bench wrote it before) leaves it out the same way, where it used to refuse the run
/// ("above 0") that the matrix had recorded.
#[test]
fn c5_an_mfu_of_zero_is_not_computed_at_both_doors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let worker = dir.join("w.sh");
    std::fs::write(
        &worker,
        "printf '{\"event\":\"start\",\"model\":\"w\",\"world_size\":1}\\n'\n\
         for i in 0 1 2 3 4; do printf '{\"event\":\"step\",\"step\":%d,\"step_time_s\":0.5,\"tokens\":1024,\"loss\":2.5}\\n' $i; done\n\
         printf '{\"event\":\"summary\",\"mfu\":0,\"tflops_per_gpu\":0,\"world_size\":1}\\n'\n",
    )
    .unwrap();
    let m = dir.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "name: z\naxes:\n  model: [small]\ndefaults:\n  steps: 5\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, \"{}\"]\n",
            worker.display()
        ),
    )
    .unwrap();
    let o = run(
        dir,
        &[
            "matrix",
            m.to_str().unwrap(),
            "--gpus",
            "0",
            "--no-progress",
            "--run-id",
            "zero",
            "--history",
            "h.sqlite",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results/zero/results.json")).unwrap())
            .unwrap();
    let metrics = doc["cells"][0]["metrics"].as_object().unwrap();
    assert!(metrics.contains_key("tokens_per_s"), "{metrics:?}");
    for absent in ["mfu", "tflops_per_gpu"] {
        assert!(!metrics.contains_key(absent), "{absent}: {metrics:?}");
    }
    let matrix_stored = stored_metrics(
        &dir.join("h.sqlite"),
        "zero",
        doc["cells"][0]["id"].as_str().unwrap(),
    );
    assert!(matrix_stored.contains(&"tokens_per_s".to_string()));
    assert!(
        !matrix_stored.contains(&"mfu".to_string()),
        "{matrix_stored:?}"
    );
    // A run folder with an MFU and TFLOP/s of 0 imports, with neither stored.
    let folder = run_folder(dir, "old-zero", |doc| {
        doc["run_id"] = "old-zero".into();
        let m = &mut doc["cells"][0]["metrics"];
        m["mfu"] = serde_json::json!({"value": 0.0, "rel_spread": 0.0, "samples": [0.0]});
        m["tflops_per_gpu"] =
            serde_json::json!({"value": 0.0, "rel_spread": 0.0, "samples": [0.0]});
    });
    let o = run(
        dir,
        &[
            "history",
            "import",
            folder.to_str().unwrap(),
            "--history",
            "i.sqlite",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let imported = stored_metrics(
        &dir.join("i.sqlite"),
        "old-zero",
        "gpt2-tiny.fp32.1gpu.single.base",
    );
    assert!(
        imported.contains(&"tokens_per_s".to_string()),
        "{imported:?}"
    );
    for absent in ["mfu", "tflops_per_gpu"] {
        assert!(!imported.contains(&absent.to_string()), "{imported:?}");
    }
    // A throughput of 0 is still refused: 0 means "not computed" only for MFU and TFLOP/s.
    let folder = run_folder(dir, "tps-zero", |doc| {
        doc["cells"][0]["metrics"]["tokens_per_s"]["value"] = 0.0.into();
    });
    let o = run(
        dir,
        &[
            "history",
            "import",
            folder.to_str().unwrap(),
            "--history",
            "j.sqlite",
        ],
    );
    refused(&o, "metrics.tokens_per_s.value");
}

// ---- 7: FIFOs and endless files ------------------------------------------------------------

#[test]
fn c7_ingest_of_a_fifo_does_not_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("log.fifo");
    mkfifo(&fifo);
    let o = ingest(tmp.path(), &nemo_args(&fifo), &[]);
    refused(&o, "FIFO");
    assert!(!tmp.path().join("results").exists());
}

#[test]
fn c7_report_of_a_fifo_or_dev_zero_results_does_not_hang_or_fill_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("fifo-run");
    std::fs::create_dir_all(&d).unwrap();
    mkfifo(&d.join("results.json"));
    let o = run(tmp.path(), &["report", d.to_str().unwrap()]);
    refused(&o, "FIFO");
    let z = tmp.path().join("zero-run");
    std::fs::create_dir_all(&z).unwrap();
    std::os::unix::fs::symlink("/dev/zero", z.join("results.json")).unwrap();
    let o = run(tmp.path(), &["report", z.to_str().unwrap()]);
    refused(&o, "character device");
    // A FIFO at the journal of a good run folder is refused by the reader too.
    let j = run_folder(tmp.path(), "journal-run", |_| {});
    mkfifo(&j.join("results.journal"));
    let o = run(tmp.path(), &["report", j.to_str().unwrap()]);
    refused(&o, "FIFO");
}

// ---- 10: unbounded work and a panic --------------------------------------------------------

#[test]
fn c10_history_study_knobs_out_of_range_are_exit_2_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let runs = fixture("runs/cpu-ok");
    for (flag, value, want) in [
        (
            "--lookback",
            "18446744073709551615",
            "--lookback 18446744073709551615",
        ),
        ("--lookback", "0", "--lookback 0"),
        ("--repeats", "0", "--repeats 0"),
        ("--repeats", "1000000", "--repeats 1000000"),
        (
            "--alarm-trials",
            "1000000000000",
            "--alarm-trials 1000000000000",
        ),
        ("--detect-trials", "0", "--detect-trials 0"),
        ("--sigmas", "nan", "--sigmas NaN"),
        ("--floor", "-0.01", "--floor -0.01"),
    ] {
        let arg = format!("{flag}={value}");
        let o = run(
            tmp.path(),
            &["history", "study", runs.to_str().unwrap(), &arg],
        );
        refused(&o, want);
    }
}

/// `bench ingest ARGS` in `dir` with its data segment (heap and private mappings) limited
/// to `bytes`.
fn ingest_within(dir: &Path, args: &[String], bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = bench(dir);
    cmd.arg("ingest").args(args);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_DATA, bytes, bytes)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bench");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("bench ingest still running after 120 s: {}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// 200,000 steps under a 3,000-character path, with the memory a short log needs plus
/// 512 MiB: `ingest.json` wrote the path once per step (600 MB here, 6 GB for a million
/// steps), and bench aborted out of memory; it names each step's file by its index in
/// `logs` now. The limit is calibrated on a short log because what the binary needs to
/// start at all (libtorch's libraries) differs from host to host.
#[test]
fn c10_many_steps_under_a_long_path_ingest_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut deep = tmp.path().to_path_buf();
    while deep.as_os_str().len() < 3_000 {
        deep.push("d".repeat(200));
    }
    std::fs::create_dir_all(&deep).unwrap();
    let log = deep.join("nemo.log");
    let n = 200_000u64;
    let mut text_log = String::with_capacity(200 * n as usize);
    for i in 0..n {
        text_log += &format!(
            "Training epoch 0, iteration {i}/{} | lr: 2.699e-06 | global_batch_size: 252 | global_step: {i} | reduced_train_loss: 11.03 | train_step_timing in s: 8.5 | consumed_samples: {}\n",
            n - 1,
            i * 252
        );
    }
    std::fs::write(&log, text_log).unwrap();
    assert!(log.as_os_str().len() > 3_000);
    // The least a short log needs, in steps of 64 MiB.
    let short = nemo_args(&fixture("hostile3/nemo-ok.log"));
    let mut base = 256u64 << 20;
    loop {
        let o = ingest_within(tmp.path(), &short, base);
        if o.status.code() == Some(0) {
            break;
        }
        base += 64 << 20;
        assert!(base < 16 << 30, "a short log does not ingest: {}", text(&o));
    }
    let mut args = nemo_args(&log);
    args.extend(["--run-id".to_string(), "long".to_string()]);
    let o = ingest_within(tmp.path(), &args, base + (512 << 20));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("results/long/ingest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc["logs"][0], log.to_str().unwrap());
    let steps = doc["steps"].as_array().unwrap();
    assert_eq!(steps.len(), n as usize);
    assert_eq!(steps[n as usize - 1]["file"], 0);
    assert_eq!(steps[n as usize - 1]["line"], n);
}

// ---- 11: smaller ---------------------------------------------------------------------------

#[test]
fn c11_stored_escapes_are_shown_not_sent_to_the_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(
        tmp.path(),
        &[
            "history",
            "import",
            fixture("runs/cpu-ok").to_str().unwrap(),
            "--history",
            "h.sqlite",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let cell = "gpt2-tiny.fp32.1gpu.single.base";
    let o = run(
        tmp.path(),
        &[
            "baseline",
            "accept",
            cell,
            "--reason",
            "new kernels\u{1b}]0;pwned\u{7}\u{1b}[2J",
            "--history",
            "h.sqlite",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!o.stdout.contains(&0x1b), "{}", text(&o));
    let o = run(tmp.path(), &["history", cell, "--history", "h.sqlite"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!o.stdout.contains(&0x1b), "{}", text(&o));
    assert!(text(&o).contains("\\x1b]0;pwned"), "{}", text(&o));
    // An unknown hardware key is bad input, as an unknown cell is.
    let o = run(
        tmp.path(),
        &[
            "history",
            cell,
            "--history",
            "h.sqlite",
            "--hardware",
            "nope",
        ],
    );
    refused(&o, "--hardware nope");
}

#[test]
fn c11_history_on_an_empty_file_leaves_it_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("empty.sqlite");
    std::fs::write(&store, b"").unwrap();
    let o = run(
        tmp.path(),
        &["history", "c", "--history", store.to_str().unwrap()],
    );
    refused(&o, "an empty file");
    assert_eq!(std::fs::metadata(&store).unwrap().len(), 0);
}

#[test]
fn c11_dry_run_refuses_what_the_run_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    for (argv, want) in [
        ("[]", "argv is empty"),
        ("[sh, \"{nope}\"]", "unknown placeholder {nope}"),
    ] {
        let m = tmp.path().join("m.yaml");
        std::fs::write(
            &m,
            format!("name: d\naxes:\n  model: [small]\ndefaults:\n  steps: 5\n  warmup: 1\n  workload:\n    kind: command\n    argv: {argv}\n"),
        )
        .unwrap();
        let dry = run(tmp.path(), &["matrix", "m.yaml", "--dry-run"]);
        refused(&dry, want);
        let real = run(tmp.path(), &["matrix", "m.yaml", "--gpus", "0"]);
        refused(&real, want);
        assert!(
            !tmp.path().join("results").exists(),
            "{:?}",
            tree(tmp.path())
        );
    }
}

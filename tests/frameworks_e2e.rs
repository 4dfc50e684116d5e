//! Framework cells end to end through the built binary, on CPU: the Hugging Face Trainer
//! (transformers and accelerate from scripts/test-requirements.txt) and DeepSpeed's engine
//! (DeepSpeed 0.19.8 built with DS_BUILD_OPS=0 by scripts/test.sh), in the Python that
//! `BENCH_PYTHON` names, and MaxText 0.2.5 (JAX's CPU backend) in the Python 3.12 that
//! `BENCH_MAXTEXT_PYTHON` names, train bench's `llama-tiny` preset next to the built-in
//! workload, from `matrix/frameworks-cpu.yaml`. CI sets both, so the tests cannot silently
//! not run there.

use std::process::Command;

use bench::results::{Outcome, RunResults};
use sha2::{Digest, Sha256};

/// The Python with transformers and accelerate, or `None` (outside CI) when there is none.
fn hf_python() -> Option<String> {
    python_with("transformers, accelerate")
}

/// The Python (`BENCH_PYTHON`) that imports `modules`, or `None` outside CI when it does
/// not; under CI a missing framework fails the test instead of skipping it.
fn python_with(modules: &str) -> Option<String> {
    python_in("BENCH_PYTHON", modules)
}

/// The Python that the environment variable `var` names, if it imports `modules` (as
/// [`python_with`]).
fn python_in(var: &str, modules: &str) -> Option<String> {
    let py = std::env::var(var).ok();
    let ok = py.as_ref().is_some_and(|py| {
        Command::new(py)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{var} must name a python with {modules} when CI is set"
        );
        eprintln!("no {var} with {modules}: cell not run");
        return None;
    }
    py
}

fn bench(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn dry_run_lists_cells_per_framework_with_every_drop_reason() {
    let (code, text) = bench(&["matrix", "matrix/frameworks-h100.yaml", "--dry-run"]);
    assert_eq!(code, Some(0), "{text}");
    for want in [
        "builtin.llama-3.1-8b-proxy.bf16.1gpu.fsdp.compile+sac",
        "torchtitan.llama-3.1-8b-proxy.fp8.1gpu.fsdp.compile+sac",
        "hf.llama-3.1-8b-proxy.bf16.1gpu.fsdp.compile+sac",
        "workload hf",
        "no fp8 training of its own",
        "megatron.llama-3.1-8b-proxy.bf16.2gpu.fsdp.sac",
        "deepspeed.llama-3.1-8b-proxy.bf16.2gpu.fsdp.compile+sac",
        "maxtext.llama-3.1-8b-proxy.fp8.1gpu.fsdp.compile+sac",
        "workload megatron: Megatron-Core has no torch.compile",
        "llmc.gpt2-125m.bf16.1gpu.single",
        "llmc.gpt2-125m.bf16.2gpu.ddp",
        "builtin.gpt2-125m.bf16.1gpu.single",
        "workload llmc: llm.c builds GPT-2 of depth",
    ] {
        assert!(text.contains(want), "missing `{want}`:\n{text}");
    }
    // Megatron's `[sac]` cells and the built-in workload's twins run the proxy's own shape
    // (seq 8192, micro batch 1), which its local layer spec fits on one H100.
    for id in [
        "megatron.llama-3.1-8b-proxy.bf16.1gpu.fsdp.sac ",
        "builtin.llama-3.1-8b-proxy.bf16.1gpu.fsdp.sac ",
        "builtin.llama-3.1-8b-proxy.bf16.2gpu.fsdp.sac ",
    ] {
        let row = text.lines().find(|l| l.contains(id));
        let fields: Vec<&str> = row.unwrap_or_default().split_whitespace().collect();
        assert_eq!(fields.get(3..5), Some(&["8192", "1"][..]), "{id}:\n{text}");
    }
    // bench's plain loop beside torchtitan's one-GPU cells, which apply no FSDP.
    assert!(text.contains("builtin.llama-3.1-8b-proxy.bf16.1gpu.single.compile+sac"));
    let (code, text) = bench(&["matrix", "matrix/frameworks-cpu.yaml", "--dry-run"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("Llama-3-style models only; `gpt2-tiny` is not one"),
        "{text}"
    );
}

/// Runs the cells of `matrix/frameworks-cpu.yaml` that `filter` selects on CPU, with
/// `python` as the frameworks' interpreter, into run `run_id` under `dir`; asserts exit 0 and
/// returns the run folder, its results and the run's output (for failure messages).
fn run_cpu_cells(
    dir: &std::path::Path,
    filter: &str,
    run_id: &str,
    python: &str,
) -> (std::path::PathBuf, RunResults, String) {
    run_cpu_cells_with(dir, filter, run_id, python, None)
}

/// [`run_cpu_cells`] with `BENCH_PROFILE` set to `profile` (as triage's traced runs set it),
/// or removed.
fn run_cpu_cells_with(
    dir: &std::path::Path,
    filter: &str,
    run_id: &str,
    python: &str,
    profile: Option<&std::path::Path>,
) -> (std::path::PathBuf, RunResults, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
    cmd.args(["matrix", "matrix/frameworks-cpu.yaml", "--filter", filter])
        .args(["--gpus", "0", "--no-progress", "--run-id", run_id])
        .arg("--results-dir")
        .arg(dir)
        .args(["--gpu-hour-price", "2.5", "--baselines"])
        .arg(dir.join("no-baselines"))
        .env("BENCH_PYTHON", python)
        .env_remove("GITHUB_STEP_SUMMARY");
    match profile {
        Some(p) => cmd.env("BENCH_PROFILE", p),
        None => cmd.env_remove("BENCH_PROFILE"),
    };
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let run = dir.join(run_id);
    let results = RunResults::load(&run).unwrap();
    (run, results, text)
}

/// The cells of `results` (run folder `run`) whose id starts with `prefix`, each checked as
/// every CPU framework cell must read: passed, 8 steps of 128 tokens with a finite, positive
/// loss, and the framework's record, whose config file is in the run folder with the hash
/// it records. `text` is the run's output, for failure messages.
fn framework_cells<'r>(
    run: &std::path::Path,
    results: &'r RunResults,
    prefix: &str,
    text: &str,
) -> Vec<&'r bench::results::CellResult> {
    let cells: Vec<_> = results
        .cells
        .iter()
        .filter(|c| c.id.as_str().starts_with(prefix))
        .collect();
    for c in &cells {
        assert_eq!(c.outcome, Outcome::Passed, "{}: {text}", c.id);
        let r = &c.repeats[0];
        assert_eq!(r.steps.len(), 8, "{}: {text}", c.id);
        assert!(
            r.steps
                .iter()
                .all(|s| s.loss.is_finite() && s.loss > 0.0 && s.tokens == 128),
            "{}: {:?}",
            c.id,
            r.steps
        );
        let fw = r.summary.framework.as_ref().expect("framework record");
        let config = std::fs::read(run.join(&fw.config_file)).unwrap();
        let hash: String = Sha256::digest(&config)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hash, fw.config_sha256, "{}", c.id);
    }
    cells
}

#[test]
fn hf_trainer_cell_runs_on_cpu_beside_the_builtin_workload() {
    let Some(python) = hf_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (run, results, text) = run_cpu_cells(
        tmp.path(),
        "model=llama-tiny and (framework=hf or framework=builtin)",
        "fw",
        &python,
    );
    let hf = framework_cells(&run, &results, "hf.", &text);
    assert_eq!(hf.len(), 2, "{text}");
    for c in hf {
        let r = &c.repeats[0];
        assert_eq!(r.steps.iter().filter(|s| s.warmup == Some(true)).count(), 3);
        let tps = c.metrics["tokens_per_s"].value;
        assert!(tps.is_finite() && tps > 0.0);
        assert!(c.metrics.contains_key("tflops_per_gpu"));
        assert!(!c.metrics.contains_key("mfu"), "no MFU on CPU");
        let fw = r.summary.framework.as_ref().expect("framework record");
        assert_eq!(fw.name, "transformers");
        assert!(fw.libraries.contains_key("torch"));
        let config = std::fs::read(run.join(&fw.config_file)).unwrap();
        let cfg: serde_json::Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(cfg["training_args"]["max_steps"], 8);
        assert_eq!(
            cfg["training_args"]["gradient_checkpointing"],
            c.id.as_str().ends_with(".sac")
        );
        assert!(fw.tokens_per_s_per_gpu.is_some_and(|t| t > 0.0));
        // What ran, from the driver's reading of the Trainer's resolved arguments.
        let ran = r.summary.ran.as_deref().expect("a record of what ran");
        let sac = c.id.as_str().ends_with(".sac");
        assert_eq!(ran.execution.as_deref(), Some("eager"), "{ran:?}");
        assert_eq!(
            ran.checkpointing
                .as_deref()
                .unwrap()
                .starts_with("full: every decoder layer"),
            sac,
            "{ran:?}"
        );
        assert!(
            ran.attention
                .as_deref()
                .unwrap()
                .starts_with("transformers `"),
            "{ran:?}"
        );
        assert_eq!(ran.precision.as_deref(), Some("fp32 throughout"), "{ran:?}");
        assert!(
            ran.evidence
                .iter()
                .any(|e| e.contains("the driver's record")),
            "{ran:?}"
        );
    }
    // The built-in twin's record comes from its own settings and libtorch's SDPA choice.
    let builtin = results
        .cells
        .iter()
        .find(|c| {
            c.id.as_str()
                .starts_with("builtin.llama-tiny.fp32.1gpu.single.base")
        })
        .expect("the built-in twin");
    let ran = builtin.repeats[0]
        .summary
        .ran
        .as_deref()
        .expect("the worker's record");
    assert!(
        ran.attention.as_deref().unwrap().starts_with("SDPA: "),
        "{ran:?}"
    );
    assert_eq!(ran.execution.as_deref(), Some("eager"), "{ran:?}");
    let table = std::fs::read_to_string(run.join("frameworks.md")).unwrap();
    assert!(table.contains("### What ran"), "{table}");
    assert!(table.contains("range over repeats"), "{table}");
    // A framework's name and version are its own words: their Markdown specials are escaped
    // in the source (issue 42), so `hf \(transformers ...\)` renders as `hf (transformers ...)`.
    assert!(
        table.contains("| llama-tiny.fp32.1gpu.single.base | hf \\(transformers "),
        "{table}"
    );
    assert!(
        table.contains("| llama-tiny.fp32.1gpu.single.base | builtin |"),
        "{table}"
    );
    assert!(table.contains('$'), "cost at --gpu-hour-price: {table}");
}

#[test]
fn an_unknown_framework_kind_is_bad_input_with_the_known_names() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m.yaml");
    std::fs::write(
        &m,
        "axes:\n  framework: [nemo]\n  model: [llama-tiny]\noverrides:\n  framework:\n    nemo:\n      workload: {kind: nemo}\n",
    )
    .unwrap();
    let (code, text) = bench(&["matrix", m.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("overrides.framework.nemo.workload.kind"),
        "the key path: {text}"
    );
    assert!(
        text.contains("unknown workload kind `nemo`")
            && text.contains("torchtitan, hf, megatron, deepspeed, maxtext"),
        "{text}"
    );
}

#[test]
fn deepspeed_cells_run_on_cpu_with_zero_over_gloo() {
    let Some(python) = python_with("deepspeed, transformers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (run, results, text) = run_cpu_cells(
        tmp.path(),
        "model=llama-tiny and (framework=deepspeed or framework=builtin)",
        "ds",
        &python,
    );
    let ds = framework_cells(&run, &results, "deepspeed.", &text);
    assert_eq!(ds.len(), 2, "{text}");
    for c in ds {
        let r = &c.repeats[0];
        let fw = r.summary.framework.as_ref().expect("framework record");
        assert_eq!(fw.name, "deepspeed");
        assert!(fw.version.starts_with("0.19"), "{}", fw.version);
        // DeepSpeed's own ThroughputTimer figure (INFO lines from its third step on).
        assert!(fw.tokens_per_s_per_gpu.is_some_and(|t| t > 0.0), "{fw:?}");
        let config = std::fs::read(run.join(&fw.config_file)).unwrap();
        let cfg: serde_json::Value = serde_json::from_slice(&config).unwrap();
        assert_eq!(cfg["deepspeed"]["zero_optimization"]["stage"], 0);
        assert_eq!(
            cfg["gradient_checkpointing"],
            c.id.as_str().ends_with(".sac")
        );
        // What ran: the engine's ZeRO stage and optimizer, from the driver and DeepSpeed's
        // own "Final Optimizer" line.
        let ran = r.summary.ran.as_deref().expect("a record of what ran");
        assert!(
            ran.parallel
                .as_deref()
                .unwrap()
                .starts_with("ZeRO stage 0 over 1 rank"),
            "{ran:?}"
        );
        assert!(
            ran.optimizer
                .as_deref()
                .unwrap()
                .starts_with("DeepSpeed's final optimizer "),
            "{ran:?}"
        );
        assert_eq!(
            ran.checkpointing
                .as_deref()
                .unwrap()
                .starts_with("full: every decoder layer"),
            c.id.as_str().ends_with(".sac"),
            "{ran:?}"
        );
    }
    let table = std::fs::read_to_string(run.join("frameworks.md")).unwrap();
    assert!(
        table.contains("| llama-tiny.fp32.1gpu.single.base | deepspeed \\(deepspeed 0.19"),
        "{table}"
    );
}

/// MaxText's own trainer (`maxtext.trainers.pre_train.train`) on JAX's CPU backend: its
/// step lines timed between absl stamps, its version and libraries recorded.
#[test]
fn maxtext_cells_run_on_cpu() {
    let Some(python) = python_in("BENCH_MAXTEXT_PYTHON", "maxtext.trainers.pre_train.train") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (run, results, text) = run_cpu_cells(
        tmp.path(),
        "model=llama-tiny and (framework=maxtext or framework=builtin)",
        "mt",
        &python,
    );
    let mt = framework_cells(&run, &results, "maxtext.", &text);
    let ids: Vec<_> = mt.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "maxtext.llama-tiny.fp32.1gpu.single.compile",
            "maxtext.llama-tiny.fp32.1gpu.single.compile+sac"
        ],
        "{text}"
    );
    for c in mt {
        let r = &c.repeats[0];
        assert!(r.steps.iter().all(|s| s.step_time_s > 0.0), "{:?}", r.steps);
        let fw = r.summary.framework.as_ref().expect("framework record");
        assert_eq!(
            (fw.name.as_str(), fw.version.as_str()),
            ("maxtext", "0.2.5")
        );
        assert!(fw.libraries.contains_key("jax"), "{fw:?}");
        // What ran, from MaxText's own `Config param` lines.
        let ran = r.summary.ran.as_deref().expect("a record of what ran");
        assert!(
            ran.execution
                .as_deref()
                .unwrap()
                .starts_with("jax.jit of the whole step"),
            "{ran:?}"
        );
        assert_eq!(
            ran.attention.as_deref(),
            Some("MaxText `dot_product` attention"),
            "{ran:?}"
        );
        assert!(
            ran.checkpointing
                .as_deref()
                .unwrap()
                .starts_with("remat policy `"),
            "{ran:?}"
        );
        assert!(
            ran.evidence.iter().any(|e| e.contains("Config param")),
            "{ran:?}"
        );
    }
    let table = std::fs::read_to_string(run.join("frameworks.md")).unwrap();
    assert!(
        table.contains("| llama-tiny.fp32.1gpu.single.compile | maxtext \\(maxtext 0.2.5"),
        "{table}"
    );
}

/// Runs framework cell `id` of `matrix/frameworks-cpu.yaml` (warm-up 3 of 8 steps) as
/// triage's traced run does, with `BENCH_PROFILE` set, and returns the Chrome trace the
/// driver wrote there (parsed) and the cell's log. Asserts what every traced cell must do:
/// pass with its 8 steps, write the trace at the path itself (one rank: no `.rank1` file,
/// no temporary file left), an object with a `traceEvents` array, and say in the log which
/// step it traced.
fn traced_cell(python: &str, id: &str) -> (serde_json::Value, String) {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("triage/F1/good.trace.json");
    let (run, results, text) = run_cpu_cells_with(
        tmp.path(),
        &format!("id=\"{id}\""),
        "traced",
        python,
        Some(&trace),
    );
    let cells = framework_cells(&run, &results, id, &text);
    assert_eq!(cells.len(), 1, "{text}");
    let log = std::fs::read_to_string(run.join(format!("logs/{id}.r0.log"))).unwrap();
    assert!(trace.is_file(), "no trace at {}:\n{log}", trace.display());
    let folder: Vec<_> = std::fs::read_dir(trace.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(folder, ["good.trace.json"], "{log}");
    assert_eq!(
        bench::triage::kernels::rank_files(&trace),
        std::slice::from_ref(&trace),
        "one rank, one file"
    );
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(json["traceEvents"].is_array(), "{log}");
    assert!(!log.contains("bench-profile: warning"), "{log}");
    (json, log)
}

/// The names of a Chrome trace's complete (`ph` X) events of category `cat`.
fn events_of<'t>(trace: &'t serde_json::Value, cat: &str) -> Vec<&'t str> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == cat)
        .filter_map(|e| e["name"].as_str())
        .collect()
}

/// torch.profiler's record of one training step on CPU (no device kernels there, so the
/// host ops): the forward's matmuls, the backward's autograd functions and exactly one
/// optimizer step, so the trace holds one whole step and no more.
fn assert_one_torch_step(trace: &serde_json::Value, log: &str) {
    let ops = events_of(trace, "cpu_op");
    assert!(ops.contains(&"aten::mm"), "no forward matmul: {log}");
    assert!(
        ops.iter().any(|n| n.ends_with("Backward0")),
        "no backward: {log}"
    );
    // torch marks each optimizer step with a record_function range (a `user_annotation`).
    let steps = events_of(trace, "user_annotation")
        .iter()
        .filter(|n| n.starts_with("Optimizer.step#"))
        .count();
    assert_eq!(steps, 1, "one optimizer step traced");
    // The last of the 3 warm-up steps, so no measured step holds profiler work.
    assert!(log.contains("bench-profile: traced step 3 to "), "{log}");
}

/// With `BENCH_PROFILE` (triage's traced runs) the HF Trainer's driver traces its last
/// warm-up step with torch.profiler through a TrainerCallback.
#[test]
fn hf_trainer_cell_traces_its_last_warm_up_step_under_bench_profile() {
    let Some(python) = hf_python() else { return };
    let (trace, log) = traced_cell(&python, "hf.llama-tiny.fp32.1gpu.single.base");
    assert_one_torch_step(&trace, &log);
    // The trace is written before the step's clock stops: its line follows the note.
    let note = log.find("bench-profile: traced step 3").unwrap();
    let step3 = log.find("[bench-hf] step: 3 ").unwrap();
    assert!(note < step3, "{log}");
}

/// A trace that cannot be written never fails the cell: the driver prints one warning line
/// and trains on (triage then reports that the run wrote no trace).
#[test]
fn a_trace_that_cannot_be_written_leaves_the_cell_passing() {
    let Some(python) = hf_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // A folder that cannot be made: its parent is a file.
    std::fs::write(tmp.path().join("file"), "").unwrap();
    let trace = tmp.path().join("file/good.trace.json");
    let id = "hf.llama-tiny.fp32.1gpu.single.base";
    let (run, results, text) = run_cpu_cells_with(
        tmp.path(),
        &format!("id=\"{id}\""),
        "untraced",
        &python,
        Some(&trace),
    );
    assert_eq!(
        framework_cells(&run, &results, id, &text).len(),
        1,
        "{text}"
    );
    let log = std::fs::read_to_string(run.join(format!("logs/{id}.r0.log"))).unwrap();
    assert!(
        log.contains("bench-profile: warning: cannot write the trace of step 3 to ")
            && log.contains("the cell carries on untraced"),
        "{log}"
    );
    assert!(!trace.exists());
}

/// DeepSpeed's driver traces the last warm-up step of its engine loop with torch.profiler.
#[test]
fn deepspeed_cell_traces_its_last_warm_up_step_under_bench_profile() {
    let Some(python) = python_with("deepspeed, transformers") else {
        return;
    };
    let (trace, log) = traced_cell(&python, "deepspeed.llama-tiny.fp32.1gpu.single.base");
    assert_one_torch_step(&trace, &log);
    let note = log.find("bench-profile: traced step 3").unwrap();
    let step3 = log.find("[bench-ds] step: 3 ").unwrap();
    assert!(note < step3, "{log}");
}

/// MaxText's driver turns on MaxText's own profiler (jax.profiler) for the last warm-up step
/// (MaxText's step 2, counting from 0) and writes XLA's Chrome trace of it in triage's form.
#[test]
fn maxtext_cell_traces_its_last_warm_up_step_under_bench_profile() {
    let Some(python) = python_in("BENCH_MAXTEXT_PYTHON", "maxtext.trainers.pre_train.train") else {
        return;
    };
    let (trace, log) = traced_cell(&python, "maxtext.llama-tiny.fp32.1gpu.single.compile");
    let events = trace["traceEvents"].as_array().unwrap();
    // jax.profiler.StepTraceAnnotation("train", step_num=...) marks each of MaxText's steps:
    // the trace holds exactly one, the traced step, and its jitted train step ran in it.
    let steps: Vec<_> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"] == "train")
        .map(|e| e["args"]["step_num"].clone())
        .collect();
    assert_eq!(steps, [serde_json::json!("2")], "{log}");
    assert!(
        events
            .iter()
            .any(|e| e["name"].as_str().is_some_and(|n| n.contains("train_step"))),
        "{log}"
    );
    assert!(
        log.contains("bench-profile: MaxText's profiler traces its step 2 (bench's step 3)"),
        "{log}"
    );
}

/// XLA's Chrome trace of a GPU run (jax.profiler, as MaxText's driver finds it) gives each
/// GPU's stream events a category and one file per GPU (scripts/frameworks/step_trace.py),
/// which triage's reader (`rank_files`, `read_trace`) reads as ranks: kernels and copies
/// counted, the derived `XLA Ops` line and the host's events not. The input mimics what
/// XLA's CUPTI collector names (`/device:GPU:<n>`, `Stream #<id>(...)`, `MemcpyH2D`);
/// CI has no GPU to write a real one.
#[test]
fn an_xla_trace_becomes_one_file_per_gpu_that_triage_reads() {
    let Some(py) = python_with("json") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("host.trace.json.gz");
    let dest = tmp.path().join("good.trace.json");
    let mut events = vec![
        serde_json::json!({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}}),
        serde_json::json!({"ph": "X", "pid": 1, "tid": 1, "name": "PjitFunction(train_step)", "ts": 0.0, "dur": 900.0}),
    ];
    for (pid, gpu) in [(2, 0), (3, 1)] {
        events.extend([
            serde_json::json!({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": format!("/device:GPU:{gpu}")}}),
            serde_json::json!({"ph": "M", "pid": pid, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Kernel,MemcpyH2D)"}}),
            serde_json::json!({"ph": "M", "pid": pid, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}}),
            serde_json::json!({"ph": "X", "pid": pid, "tid": 7, "name": "gemm_fusion_dot", "ts": 10.0, "dur": 100.0 + f64::from(gpu)}),
            serde_json::json!({"ph": "X", "pid": pid, "tid": 7, "name": "MemcpyH2D", "ts": 200.0, "dur": 5.0}),
            serde_json::json!({"ph": "X", "pid": pid, "tid": 9, "name": "dot.1", "ts": 10.0, "dur": 100.0}),
        ]);
    }
    let trace = serde_json::json!({"displayTimeUnit": "ns", "traceEvents": events});
    let script = "import gzip, json, sys, step_trace\n\
        with gzip.open(sys.argv[1], 'wt') as f: json.dump(json.load(sys.stdin), f)\n\
        print(step_trace.from_xla(sys.argv[1], sys.argv[2]))";
    let mut child = Command::new(&py)
        .args(["-c", script])
        .arg(&src)
        .arg(&dest)
        .env("PYTHONPATH", "scripts/frameworks")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(trace.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let files = bench::triage::kernels::rank_files(&dest);
    assert_eq!(
        files,
        [dest.clone(), tmp.path().join("good.trace.rank1.json")],
        "{out:?}"
    );
    for (gpu, file) in files.iter().enumerate() {
        let step = bench::triage::kernels::read_trace(file).unwrap();
        let names: Vec<_> = step.kernels.keys().cloned().collect();
        assert_eq!(names, ["gemm_fusion_dot", "MemcpyH2D"], "GPU {gpu}");
        assert_eq!(step.total_us(), 105.0 + gpu as f64, "GPU {gpu}");
    }
    // The host's events stay with GPU 0, whose file triage asks for.
    let first: serde_json::Value = serde_json::from_slice(&std::fs::read(&dest).unwrap()).unwrap();
    assert!(first.to_string().contains("PjitFunction(train_step)"));
}

/// The drivers' record of a framework checkout's commit (scripts/frameworks/driver_info.py)
/// names only a folder that is the top of a git work tree of its own: a folder of copied
/// framework files inside another repository is recorded without a commit, not with that
/// repository's (as a Megatron-LM source folder inside bench's checkout once was).
#[test]
fn drivers_record_a_source_commit_only_for_a_checkout_of_its_own() {
    let Some(py) = python_with("json") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let copied = repo.join("copied-framework-files");
    std::fs::create_dir_all(&copied).unwrap();
    std::fs::write(copied.join("pretrain_gpt.py"), "# copied\n").unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "one"]);
    let head = git(&["rev-parse", "--short=12", "HEAD"]);
    let commit_of = |dir: &std::path::Path| {
        let out = Command::new(&py)
            .args([
                "-c",
                "import sys, driver_info; print(repr(driver_info.source_commit(sys.argv[1])))",
            ])
            .arg(dir)
            .env("PYTHONPATH", "scripts/frameworks")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(commit_of(&repo), format!("'{head}'"));
    assert_eq!(commit_of(&copied), "''");
    assert_eq!(commit_of(&tmp.path().join("missing")), "''");
}

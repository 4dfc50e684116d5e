//! Tokens per joule and kWh per 1T tokens end to end through the built binary, on a "GPU"
//! whose power the test sets (tests/fixtures/fake_nvidia_smi.sh as `nvidia-smi` on PATH,
//! streaming the line of `$FAKE_SMI/gpu` every 100 ms) and a command workload of a known
//! speed (tests/fixtures/speed_worker.sh: 4096 tokens per 0.08 s step, within 0.1%).
//!
//! At a constant 690 W on one GPU every repeat's tokens/J is exactly its tokens/s / 690, so
//! `results.json`, the history store, `bench history` and the reports can be checked to the
//! last bit. Then the energy is judged like the speed: by the baseline file with its
//! tolerance, and by the history's band with its confirmation, where 10% more power at the
//! same speed must come out regressed in energy while the speed stays unchanged. A GPU
//! whose tool reports no power gives no energy metric at all, never 0.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const CELL: &str = "tiny.1gpu";

/// The telemetry line of one H100 at `watts` (the fake's default is 690 W, SW power cap).
fn gpu_line(watts: &str) -> String {
    format!("0, GPU-fake-0000, 1755, 1980, {watts}, 700.00, 62, 100, 0x0000000000000004\n")
}

struct Lab {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    smi: PathBuf,
    matrix: PathBuf,
    /// A git repository of its own on branch `main` where bench runs, so the commit and
    /// the branch do not depend on the checkout the tests run in.
    repo: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(
            std::fs::canonicalize("tests/fixtures/fake_nvidia_smi.sh").unwrap(),
            bin.join("nvidia-smi"),
        )
        .unwrap();
        let smi = dir.join("smi");
        std::fs::create_dir_all(&smi).unwrap();
        let worker = std::fs::canonicalize("tests/fixtures/speed_worker.sh").unwrap();
        let matrix = dir.join("m.yaml");
        std::fs::write(
            &matrix,
            format!(
                "name: energy\naxes:\n  model: [tiny]\n  gpus: [1]\ndefaults:\n  steps: 8\n  warmup: 1\n  repeats: 3\n  timeout: 60s\n  workload:\n    kind: command\n    argv: [sh, \"{}\"]\n",
                worker.display()
            ),
        )
        .unwrap();
        let repo = dir.join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "main",
            ][..],
        ] {
            let o = Command::new("git")
                .args(args)
                .current_dir(&repo)
                .output()
                .unwrap();
            assert!(o.status.success(), "git {args:?}: {}", text(&o));
        }
        Lab {
            _tmp: tmp,
            dir,
            smi,
            matrix,
            repo,
        }
    }

    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.dir.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    fn store(&self) -> String {
        self.dir.join("h.sqlite").display().to_string()
    }

    /// `bench matrix` as run `id`, judged by the history when `history` is set (else by the
    /// baseline files alone).
    fn run(&self, id: &str, history: bool) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_bench"));
        cmd.current_dir(&self.repo)
            .args(["matrix", self.matrix.to_str().unwrap()])
            .args(["--results-dir", self.dir.join("results").to_str().unwrap()])
            .args(["--run-id", id])
            .args(["--baselines", self.dir.join("baselines").to_str().unwrap()])
            .arg("--no-progress")
            .env("PATH", self.path())
            .env("FAKE_SMI", &self.smi)
            .env("SPEED_COUNTER", self.dir.join("counter"))
            .env("GITHUB_REF_NAME", "main")
            .env_remove("GITHUB_BASE_REF")
            .env_remove("GITHUB_HEAD_REF")
            .env_remove("CI_MERGE_REQUEST_TARGET_BRANCH_NAME")
            .env_remove("GITHUB_STEP_SUMMARY")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("BENCH_FUSED_ADAMW")
            .env_remove("BENCH_TELEMETRY");
        if history {
            cmd.args(["--history", &self.store()]);
        }
        cmd.output().unwrap()
    }

    fn bench(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .current_dir(&self.repo)
            .args(args)
            .env("PATH", self.path())
            .output()
            .unwrap()
    }

    fn file(&self, id: &str, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("results").join(id).join(name))
            .unwrap_or_else(|e| panic!("{id}/{name}: {e}"))
    }

    fn json(&self, id: &str, name: &str) -> Value {
        serde_json::from_str(&self.file(id, name)).unwrap()
    }

    fn power(&self, watts: &str) {
        std::fs::write(self.smi.join("gpu"), gpu_line(watts)).unwrap();
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Equal but for the last bits: serde_json's default float parser may read a number one
/// unit in the last place off what was written.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 4.0 * f64::EPSILON * b.abs()
}

/// The median of three.
fn median3(xs: &[f64]) -> f64 {
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    s[1]
}

/// Checks the energy metrics of `id`'s cell against its tokens/s at `watts` on one GPU,
/// exactly: each repeat's tokens/J is its tokens/s / watts, its kWh per 1T tokens
/// 1e12 / tokens/J / 3.6e6, and each value is the median of its repeats. Returns tokens/J.
fn exact_energy(lab: &Lab, id: &str, watts: f64) -> f64 {
    let r = lab.json(id, "results.json");
    let cell = &r["cells"][0];
    let t = &cell["telemetry"];
    assert_eq!(t["power_w"], watts, "{t}");
    assert_eq!(t["gpus"], serde_json::json!([0]), "{t}");
    assert_eq!(floats(&t["repeat_power_w"]), vec![watts; 3], "{t}");
    let m = &cell["metrics"];
    let tps = floats(&m["tokens_per_s"]["samples"]);
    let tpj = floats(&m["tokens_per_joule"]["samples"]);
    let kwh = floats(&m["kwh_per_1t_tokens"]["samples"]);
    assert_eq!(tps.len(), 3, "{m}");
    for i in 0..3 {
        assert!(same(tpj[i], tps[i] / (watts * 1.0)), "repeat {i}: {m}");
        assert!(same(kwh[i], 1e12 / tpj[i] / 3.6e6), "repeat {i}: {m}");
    }
    let value = m["tokens_per_joule"]["value"].as_f64().unwrap();
    assert_eq!(value, median3(&tpj), "{m}");
    assert_eq!(
        m["kwh_per_1t_tokens"]["value"].as_f64().unwrap(),
        median3(&kwh),
        "{m}"
    );
    // By hand: 4096 tokens per 0.08 s step is 51,200 tokens/s (the worker's jitter is at
    // most 0.1%), and 51,200 / watts tokens per joule.
    let hand = 4096.0 / 0.08 / watts;
    assert!((value / hand - 1.0).abs() < 0.002, "{value} against {hand}");
    value
}

#[test]
fn constant_power_gives_exact_tokens_per_joule_in_results_history_and_reports() {
    let lab = Lab::new();
    lab.power("690.00");
    let o = lab.run("n1", true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let tpj = exact_energy(&lab, "n1", 690.0);

    // The history keeps it as every metric, with its repeats: `bench history` shows it.
    let mut store = bench::history::open(&lab.store()).unwrap();
    let r = lab.json("n1", "results.json");
    let key = r["environment"]["hardware_key"]
        .as_str()
        .unwrap()
        .to_string();
    let trend = store.trend(CELL, &key, "tokens_per_joule").unwrap();
    assert_eq!(trend.len(), 1);
    assert!(same(trend[0].value, tpj), "{} {tpj}", trend[0].value);
    let samples = floats(&r["cells"][0]["metrics"]["tokens_per_joule"]["samples"]);
    assert_eq!(trend[0].samples.len(), 3);
    for (a, b) in trend[0].samples.iter().zip(&samples) {
        assert!(same(*a, *b), "{:?} {samples:?}", trend[0].samples);
    }
    assert_eq!(
        store.trend(CELL, &key, "kwh_per_1t_tokens").unwrap().len(),
        1
    );
    drop(store);
    let o = lab.bench(&[
        "history",
        CELL,
        "--metric",
        "tokens_per_joule",
        "--history",
        &lab.store(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("tokens_per_joule, 1 runs"), "{out}");
    assert!(out.contains(&format!("{tpj:.2}")), "{out}");

    // The reports show it beside the throughput, with what it does not count.
    let summary = lab.file("n1", "summary.md");
    assert!(
        summary.contains("| cell | tokens/s/GPU | tokens/J | TFLOP/s/GPU |"),
        "{summary}"
    );
    assert!(summary.contains(&format!("| {tpj:.1} |")), "{summary}");
    assert!(
        summary.contains("not wall power at the PDU as MLPerf Power measures it"),
        "{summary}"
    );
    let terminal = lab.file("n1", "summary.txt");
    assert!(terminal.contains("tok/J"), "{terminal}");
    assert!(terminal.contains("GPU board power only"), "{terminal}");
    let page = lab.file("n1", "report.html");
    let data = bench::report::html::embedded_data(&page).unwrap();
    assert!(same(
        data["cells"][0]["metrics"]["tokens_per_joule"]["current"]
            .as_f64()
            .unwrap(),
        tpj
    ));
    assert!(data["cells"][0]["metrics"]["kwh_per_1t_tokens"]["current"].is_f64());
    assert!(
        data["runs"][0]["energy_note"]
            .as_str()
            .unwrap()
            .contains("MLPerf Power"),
        "{data}"
    );

    // A second night: the page draws the cell's tokens/J over the run history.
    let o = lab.run("n2", true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    exact_energy(&lab, "n2", 690.0);
    let data = bench::report::html::embedded_data(&lab.file("n2", "report.html")).unwrap();
    let series: Vec<&Value> = data["trends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["metric"] == "tokens_per_joule")
        .collect();
    assert_eq!(series.len(), 1, "{}", data["trends"]);
    assert_eq!(series[0]["points"].as_array().unwrap().len(), 2);
}

#[test]
fn more_power_at_the_same_speed_regresses_the_energy_in_the_history_and_the_baseline() {
    let lab = Lab::new();
    lab.power("690.00");
    // Five clean nights make the cell's band (the first is judged by nothing, the next
    // by the repeats' test).
    for n in 1..=5 {
        let id = format!("n{n}");
        let o = lab.run(&id, true);
        assert_eq!(o.status.code(), Some(0), "{id}: {}", text(&o));
        let h = lab.json(&id, "history.json");
        let energy = &h["cells"][0]["energy"]["judgement"]["verdict"];
        // A second night's 3 repeats against 3 cannot say "same": unknown, with no shift.
        assert!(
            ["unchanged", "insufficient_history", "unknown"].contains(&energy.as_str().unwrap()),
            "{id}: {h}"
        );
    }
    // The same speed at 759 W instead of 690 W: 10% more energy per token, 9.1% fewer
    // tokens per joule. The speed is unchanged; the energy regressed, confirmed by the
    // re-runs (which drew the same power), and fails the job.
    lab.power("759.00");
    let o = lab.run("hot", true);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    exact_energy(&lab, "hot", 759.0);
    let h = lab.json("hot", "history.json");
    let cell = &h["cells"][0];
    assert_eq!(cell["judgement"]["verdict"], "unchanged", "{h}");
    assert_eq!(cell["energy"]["judgement"]["verdict"], "regressed", "{h}");
    let rel = cell["energy"]["judgement"]["rel_change"].as_f64().unwrap();
    assert!((rel - (690.0 / 759.0 - 1.0)).abs() < 0.003, "{rel}");
    assert!(h["confirm_run_id"].as_str().is_some(), "{h}");
    let line = cell["line"].as_str().unwrap();
    assert!(
        line.contains("energy: tokens/J regressed -9.1%") && line.contains("at an unchanged speed"),
        "{line}"
    );
    let md = lab.file("hot", "summary.md");
    assert!(md.contains("1 regression"), "{md}");
    assert!(md.contains("regressed in tokens/J -9.1%"), "{md}");
    assert!(md.contains("in tokens/J 1 regressed, 0 improved"), "{md}");
    let junit = lab.file("hot", "junit.xml");
    assert!(junit.contains("<failure"), "{junit}");
    let report = lab.json("hot", "report.json");
    assert!(report.to_string().contains("\"regression\""), "{report}");

    // The baseline file judges it too, with its 8% tolerance: a baseline from a 690 W
    // night, a night at 759 W against it alone (no history) regresses in tokens/J and
    // kWh per 1T tokens, not in speed.
    let o = lab.bench(&[
        "baseline",
        "update",
        lab.dir.join("results/n5").to_str().unwrap(),
        "--baselines",
        lab.dir.join("baselines").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let file = std::fs::read_to_string(lab.dir.join("baselines").join(format!(
        "{}.yaml",
        lab.json("n5", "results.json")["environment"]["hardware_key"]
            .as_str()
            .unwrap()
    )))
    .unwrap();
    assert!(file.contains("tokens_per_joule:"), "{file}");
    assert!(file.contains("kwh_per_1t_tokens:"), "{file}");
    let o = lab.run("hot-baseline", false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report = lab.json("hot-baseline", "report.json");
    let metrics = report["cells"][0]["metrics"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    let verdict = |name: &str| {
        metrics
            .iter()
            .find(|m| m["metric"] == name)
            .map(|m| m["verdict"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("{name}: {report}"))
    };
    assert_eq!(verdict("tokens_per_joule"), "regression");
    assert_eq!(verdict("kwh_per_1t_tokens"), "regression");
    assert_eq!(verdict("tokens_per_s"), "unchanged");
    // Within the tolerance (4.2% more power): unchanged.
    lab.power("720.00");
    let o = lab.run("warm-baseline", false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_gpu_whose_tool_reports_no_power_has_no_energy_metric() {
    let lab = Lab::new();
    // nvidia-smi answers every field but power.draw ("[N/A]", as on boards without a
    // power sensor): the cell has telemetry, and no tokens/J, never 0.
    lab.power("[N/A]");
    let o = lab.run("nopower", false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = lab.json("nopower", "results.json");
    let cell = &r["cells"][0];
    assert_eq!(cell["telemetry"]["sm_clock_mhz"], 1755.0, "{cell}");
    assert!(cell["telemetry"]["power_w"].is_null(), "{cell}");
    let m = cell["metrics"].as_object().unwrap();
    assert!(m.contains_key("tokens_per_s"), "{cell}");
    assert!(!m.contains_key("tokens_per_joule"), "{cell}");
    assert!(!m.contains_key("kwh_per_1t_tokens"), "{cell}");
    // The reports keep the table they always had.
    let md = lab.file("nopower", "summary.md");
    assert!(!md.contains("tokens/J"), "{md}");
    assert!(!lab.file("nopower", "summary.txt").contains("tok/J"));
}

//! `bench matrix FILE --launcher slurm` records the environment of the compute nodes the
//! cells ran on, not that of the submitting host, and uses its hardware key for the
//! baselines and for `--resume` (docs/runner.md, "Environment").
//!
//! Against the real daemons (scripts/slurm-ci-setup.sh), only when `BENCH_SLURM_TESTS=1`.
//! The node and the submitting host are the same machine here, so the tests make them
//! differ the way a GPU node differs from a login node: the jobs (and only they) find an
//! `nvidia-smi` on their PATH, a stand-in that reports an H100 or an H200, while `bench`
//! itself finds none and is `cpu-<arch>`. The PATH reaches the jobs either through
//! sbatch's `--export` (every job of the run) or through a cell's own `env` (that cell's
//! jobs).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use bench::results::{CellResult, Environment, EnvironmentSource, Outcome, RunResults};

mod common;

const H100: &str = "NVIDIA H100 80GB HBM3, 81559, 550.54.15";
const H200: &str = "NVIDIA H200, 143771, 560.35.03";

fn worker() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/slurm_worker.sh")
        .display()
        .to_string()
}

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_SLURM_PARTITION")
        .env_remove("BENCH_SLURM_ACCOUNT")
        .env("BENCH_SLURM_POLL_S", "0.3");
    c
}

/// A folder holding an `nvidia-smi` that reports one GPU as `query_line`
/// (`name, MiB, driver`), for a PATH only the jobs see.
fn fake_gpu_bin(dir: &Path, query_line: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            "#!/bin/sh\ncase \"$*\" in\n  *--query-gpu*) echo '{query_line}' ;;\n  *) echo '| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |' ;;\nesac\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.to_path_buf()
}

/// `dir` first, then this process's PATH.
fn path_with(dir: &Path) -> String {
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap())
}

fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A command workload running `slurm_worker.sh ARGS...`, with `env` set for its tasks.
fn workload(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut v = vec![q("sh"), q(&worker())];
    v.extend(args.iter().map(|a| q(a)));
    let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}: {}", q(v))).collect();
    format!(
        "{{kind: command, argv: [{}], env: {{{}}}}}",
        v.join(", "),
        env.join(", ")
    )
}

/// A matrix of `case x gpus` cells on partition `debug`; each case has its own workload.
fn write_matrix(
    path: &Path,
    cases: &[(&str, String)],
    gpus: &[u32],
    sbatch_args: &[String],
) -> PathBuf {
    let mut text = format!(
        "name: slurm-env\naxes:\n  case: [{}]\n  gpus: [{}]\ndefaults:\n  steps: 3\n  warmup: 1\n  retries: 0\n  timeout: 120s\n  workload: {}\noverrides:\n  case:\n",
        cases.iter().map(|(c, _)| q(c)).collect::<Vec<_>>().join(", "),
        gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        workload(&["ok"], &[]),
    );
    for (case, w) in cases {
        text.push_str(&format!("    {}: {{workload: {w}}}\n", q(case)));
    }
    let mut args = vec!["--oversubscribe".to_string()];
    args.extend(sbatch_args.iter().cloned());
    text.push_str(&format!(
        "slurm:\n  partition: debug\n  sbatch_args: [{}]\n",
        args.iter().map(|a| q(a)).collect::<Vec<_>>().join(", ")
    ));
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

fn run(dir: &Path, matrix: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = bench()
        .arg("matrix")
        .arg(matrix)
        .args(["--launcher", "slurm", "--no-progress", "--kill-grace", "2"])
        .arg("--baselines")
        .arg(dir.join("baselines"))
        .arg("--results-dir")
        .arg(dir.join("results"))
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// This host's environment as `bench env` sees it (the submitting host's).
fn submit_host_env() -> Environment {
    let out = bench().args(["env", "--format", "json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cell<'a>(r: &'a RunResults, case: &str, gpus: u32) -> &'a CellResult {
    r.cells
        .iter()
        .find(|c| c.id.as_str() == format!("{case}.{gpus}gpu"))
        .unwrap_or_else(|| panic!("no cell {case}.{gpus}gpu in {:?}", r.cells))
}

#[test]
fn the_run_records_the_nodes_environment_and_compares_with_their_baselines() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let submit = submit_host_env();
    assert_ne!(
        submit.hardware_key, "h100-sxm-80gb",
        "this test needs a submitting host without H100s"
    );
    let tmp = tempfile::tempdir().unwrap();
    let gpu_bin = fake_gpu_bin(&tmp.path().join("h100-bin"), H100);
    let m = write_matrix(
        &tmp.path().join("matrix.yaml"),
        &[("ok", workload(&["ok"], &[]))],
        &[1, 2],
        &[format!("--export=ALL,PATH={}", path_with(&gpu_bin))],
    );
    // The H100 baseline expects far more than a CPU script does: compared with it, the
    // cell regresses (exit 1). Compared with the submitting host's (none), it would be new.
    let baselines = tmp.path().join("baselines");
    std::fs::create_dir_all(&baselines).unwrap();
    std::fs::write(
        baselines.join("h100-sxm-80gb.yaml"),
        "schema_version: 1\nhardware_key: h100-sxm-80gb\ncells:\n  ok.1gpu:\n    metrics:\n      tokens_per_s:\n        value: 1.0e12\n",
    )
    .unwrap();
    let (code, stderr) = run(tmp.path(), &m, &["--run-id", "r1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("ENV     hardware key h100-sxm-80gb, from node"),
        "{stderr}"
    );
    assert!(!stderr.contains("WARNING"), "{stderr}");

    let dir = tmp.path().join("results/r1");
    let r = RunResults::load(&dir).unwrap();
    let env = &r.environment;
    assert_eq!(env.hardware_key, "h100-sxm-80gb");
    assert_eq!(env.gpu_model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(env.gpu_memory_mib, Some(81559));
    assert_eq!(env.driver.as_deref(), Some("550.54.15"));
    assert_eq!(env.gpu_count, 1);
    // The code is the submitting host's checkout.
    assert_eq!(env.git_commit, submit.git_commit);
    // Which job's node it came from, and every attempt's own node key.
    let job_ids: Vec<String> = r
        .cells
        .iter()
        .flat_map(|c| c.attempts.iter())
        .filter_map(|a| a.slurm_job_id.clone())
        .collect();
    match &r.environment_source {
        Some(EnvironmentSource::SlurmNode { job_id, cell }) => {
            assert!(job_ids.contains(job_id), "{job_id} not in {job_ids:?}");
            assert!(cell == "ok.1gpu" || cell == "ok.2gpu", "{cell}");
            let file = std::fs::read_dir(dir.join("slurm"))
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.path().join(format!("node-env-{job_id}.json")))
                .find(|p| p.exists());
            assert!(file.is_some(), "no node-env-{job_id}.json under slurm/");
        }
        other => panic!("{other:?}"),
    }
    for gpus in [1, 2] {
        let c = cell(&r, "ok", gpus);
        assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
        for a in &c.attempts {
            assert_eq!(a.node_hardware_key.as_deref(), Some("h100-sxm-80gb"));
        }
    }
    // The reports used the nodes' key and baseline file.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["hardware_key"], "h100-sxm-80gb");
    assert!(
        report["baseline_file"]
            .as_str()
            .unwrap()
            .ends_with("h100-sxm-80gb.yaml"),
        "{report}"
    );
    let ok1 = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "ok.1gpu")
        .unwrap();
    assert_eq!(ok1["status"], "regression", "{ok1}");
    let junit = std::fs::read_to_string(dir.join("junit.xml")).unwrap();
    assert!(junit.contains("bench/h100-sxm-80gb"), "{junit}");
}

#[test]
fn cells_measured_on_other_hardware_fail_instead_of_being_compared() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    let h100 = fake_gpu_bin(&tmp.path().join("h100-bin"), H100);
    let h200 = fake_gpu_bin(&tmp.path().join("h200-bin"), H200);
    let h100_path = path_with(&h100);
    let h200_path = path_with(&h200);
    // Each cell's own PATH reaches its job script (and so its node's `bench env`).
    let m = write_matrix(
        &tmp.path().join("matrix.yaml"),
        &[
            ("first", workload(&["ok"], &[("PATH", &h100_path)])),
            ("other", workload(&["ok"], &[("PATH", &h200_path)])),
        ],
        &[1],
        &[],
    );
    // One job at a time, in matrix order: `first` reports first and decides.
    let (code, stderr) = run(tmp.path(), &m, &["--run-id", "r1", "--jobs", "1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("WARNING Slurm job") && stderr.contains("`h200-141gb`"),
        "{stderr}"
    );
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();
    assert_eq!(r.environment.hardware_key, "h100-sxm-80gb");
    assert_eq!(cell(&r, "first", 1).outcome, Outcome::Passed);
    let other = cell(&r, "other", 1);
    match &other.outcome {
        Outcome::Failed { reason } => {
            assert!(
                reason.contains("measured on hardware `h200-141gb`"),
                "{reason}"
            );
            assert!(reason.contains("`h100-sxm-80gb`"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    // Its figures are kept as raw repeats, but there is nothing to compare or file.
    assert!(other.metrics.is_empty());
    assert_eq!(other.repeats.len(), 1);
    assert_eq!(
        other.attempts[0].node_hardware_key.as_deref(),
        Some("h200-141gb")
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("results/r1/report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["hardware_key"], "h100-sxm-80gb");
}

#[test]
fn resume_checks_the_nodes_hardware_key_not_the_submitting_hosts() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    // A resume must use the matrix its run started from (issue 13: the same contents), so
    // what changes between sessions lives outside the matrix: the script `later` runs, and
    // the nodes' (stand-in) nvidia-smi.
    let gpu_bin = fake_gpu_bin(&tmp.path().join("gpu-bin"), H100);
    let export = vec![format!("--export=ALL,PATH={}", path_with(&gpu_bin))];
    let later_script = tmp.path().join("later.sh");
    // First sessions: `later` says it is unsupported here (skipped, so a resume runs it).
    std::fs::write(&later_script, "exit 3\n").unwrap();
    let cases = [
        ("done", workload(&["ok"], &[])),
        (
            "later",
            format!(
                "{{kind: command, argv: [{}, {}]}}",
                q("sh"),
                q(&later_script.display().to_string())
            ),
        ),
    ];
    let first = write_matrix(&tmp.path().join("m1.yaml"), &cases, &[1], &export);
    for id in ["r1", "r2"] {
        let (code, stderr) = run(tmp.path(), &first, &["--run-id", id]);
        assert_eq!(code, Some(0), "{stderr}");
        let r = RunResults::load(&tmp.path().join("results").join(id)).unwrap();
        assert_eq!(r.environment.hardware_key, "h100-sxm-80gb");
        assert!(matches!(
            cell(&r, "later", 1).outcome,
            Outcome::Skipped { .. }
        ));
    }

    // Resumed from the same (CPU) submitting host onto H100 nodes again: accepted, though
    // this host's own key is not the run's.
    std::fs::write(
        &later_script,
        format!("exec sh '{}' ok\n", worker().replace('\'', "'\\''")),
    )
    .unwrap();
    let r1 = tmp.path().join("results/r1");
    let (code, stderr) = run(tmp.path(), &first, &["--resume", r1.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stderr}");
    let r = RunResults::load(&r1).unwrap();
    assert_eq!(r.environment.hardware_key, "h100-sxm-80gb");
    assert!(matches!(
        r.environment_source,
        Some(EnvironmentSource::SlurmNode { .. })
    ));
    let later = cell(&r, "later", 1);
    assert_eq!(later.outcome, Outcome::Passed, "{later:#?}");
    assert_eq!(
        later.attempts[0].node_hardware_key.as_deref(),
        Some("h100-sxm-80gb")
    );

    // Resumed onto H200 nodes: refused as a local resume on other hardware is (exit 2),
    // and nothing measured there is kept.
    fake_gpu_bin(&gpu_bin, H200);
    let moved = first.clone();
    let r2 = tmp.path().join("results/r2");
    let (code, stderr) = run(tmp.path(), &moved, &["--resume", r2.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("measured on Slurm nodes of hardware `h100-sxm-80gb`")
            && stderr.contains("`h200-141gb`"),
        "{stderr}"
    );
    let r = RunResults::load(&r2).unwrap();
    assert_eq!(r.environment.hardware_key, "h100-sxm-80gb");
    assert_eq!(cell(&r, "done", 1).outcome, Outcome::Passed);
    let later = cell(&r, "later", 1);
    assert!(
        matches!(&later.outcome, Outcome::Skipped { .. }),
        "{later:#?}"
    );
    assert!(later.metrics.is_empty());
}

#[test]
fn without_any_node_report_the_submitting_hosts_environment_stays_with_a_warning() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let tmp = tempfile::tempdir().unwrap();
    // A feature no node has: sbatch refuses every job, none ever starts.
    let m = write_matrix(
        &tmp.path().join("matrix.yaml"),
        &[("ok", workload(&["ok"], &[]))],
        &[1],
        &["--constraint=no-such-feature".to_string()],
    );
    let (code, stderr) = run(tmp.path(), &m, &["--run-id", "r1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("WARNING no Slurm job reported its node's environment"),
        "{stderr}"
    );
    let r = RunResults::load(&tmp.path().join("results/r1")).unwrap();
    assert_eq!(r.environment_source, Some(EnvironmentSource::SubmitHost));
    assert_eq!(r.environment.hardware_key, submit_host_env().hardware_key);
    assert!(matches!(cell(&r, "ok", 1).outcome, Outcome::Failed { .. }));
}

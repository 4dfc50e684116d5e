//! Cells that span nodes, on a real multi-node Slurm cluster: `bench matrix --launcher
//! slurm` runs a two-rank command cell over nodes `node1` and `node2` of partition `multi`
//! (two slurmd daemons, each in a network namespace of its own with its own hostname and
//! address on a bridge, started by scripts/slurm-ci-setup.sh). The cell is a real PyTorch
//! trainer (tests/fixtures/gloo_ddp_trainer.py: a small GPT, DistributedDataParallel over
//! gloo on CPU) whose two ranks rendezvous at the allocation's first node.
//!
//! One test runs the cell to its end: both nodes named in the results, both ranks' step
//! events, the slowest rank's step time. The other loses a node mid-job (SIGKILL to
//! node2's slurmd only), checks that the attempt fails naming the node, restarts the
//! slurmd, and checks that the retry runs on both nodes and passes (the cell is flaky).
//! Whatever happens, a guard runs the set-up script again, so the cluster is left with
//! every node up for the tests after it.
//!
//! Like every Slurm test, these run only with `BENCH_SLURM_TESTS=1` (then fail loudly if
//! Slurm or `BENCH_PYTHON`'s torch does not work) and take turns through
//! `common::slurm_turn()`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use bench::results::{CellResult, Outcome, RunResults};

mod common;

/// The nodes of partition `multi`, as scripts/slurm-ci-setup.sh names them.
const NODES: [&str; 2] = ["node1", "node2"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `BENCH_PYTHON`, checked to import torch with its distributed package.
fn python() -> String {
    let py = std::env::var("BENCH_PYTHON")
        .unwrap_or_else(|_| panic!("BENCH_SLURM_TESTS=1 needs BENCH_PYTHON (a python with torch)"));
    let ok = Command::new(&py)
        .args([
            "-c",
            "import torch.distributed as d; assert d.is_gloo_available()",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "BENCH_PYTHON={py} cannot import torch with gloo");
    py
}

fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A matrix of one two-rank cell on partition `multi`, one rank per node (`gpus_per_node:
/// 1` on nodes without GPUs: one task per node), training for `seconds` (at most `steps`
/// steps) with `retries` retries.
fn write_matrix(dir: &Path, steps: u32, seconds: f64, retries: u32) -> PathBuf {
    let trainer = root().join("tests/fixtures/gloo_ddp_trainer.py");
    let argv = [
        python(),
        trainer.display().to_string(),
        "--steps".into(),
        "{steps}".into(),
        "--warmup".into(),
        "{warmup}".into(),
        "--seconds".into(),
        seconds.to_string(),
    ];
    let argv: Vec<String> = argv.iter().map(|a| q(a)).collect();
    let text = format!(
        "name: slurm-multinode\naxes:\n  gpus: [2]\ndefaults:\n  steps: {steps}\n  warmup: 2\n  retries: {retries}\n  timeout: 300s\n  workload: {{kind: command, argv: [{}]}}\nslurm:\n  partition: multi\n  gpus_per_node: 1\n",
        argv.join(", ")
    );
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn bench(dir: &Path, matrix: &Path, run_id: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_SLURM_PARTITION")
        .env_remove("BENCH_SLURM_ACCOUNT")
        .env("BENCH_SLURM_POLL_S", "0.5")
        .arg("matrix")
        .arg(matrix)
        .args(["--launcher", "slurm", "--no-progress", "--kill-grace", "2"])
        .arg("--baselines")
        .arg(dir.join("baselines"))
        .arg("--results-dir")
        .arg(dir.join("results"))
        .args(["--run-id", run_id]);
    c
}

/// Every log of a run, for the message of a failed assertion (the temporary folder is gone
/// after the test).
fn all_logs(run_dir: &Path) -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(run_dir.join("logs"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            format!("--- {} ---\n{text}", p.display())
        })
        .collect()
}

fn only_cell(r: &RunResults) -> &CellResult {
    assert_eq!(r.cells.len(), 1, "{:#?}", r.cells);
    &r.cells[0]
}

/// The step events of one rank in a repeat.
fn steps_of(c: &CellResult, repeat: usize, rank: u32) -> Vec<f64> {
    c.repeats[repeat]
        .steps
        .iter()
        .filter(|s| s.rank == Some(rank))
        .map(|s| s.step_time_s)
        .collect()
}

/// The Slurm state of `node` as `sinfo %T` writes it (`idle`, `down*`...).
fn node_state(node: &str) -> String {
    let o = Command::new("sinfo")
        .args(["-h", "-N", "-n", node, "-o", "%T"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .next()
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// Runs scripts/slurm-ci-setup.sh, which starts whatever slurmd is not running and waits
/// until every node is up; panics with its output when it fails.
fn set_up_cluster() {
    let out = Command::new(root().join("scripts/slurm-ci-setup.sh"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/slurm-ci-setup.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings every node back when dropped, so that a test that stops a slurmd never leaves the
/// cluster short of a node, even when it fails halfway.
struct ClusterGuard;

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        // A panic here during a test's own panic would abort the process: report instead.
        match Command::new(root().join("scripts/slurm-ci-setup.sh")).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "restoring the cluster failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("cannot run scripts/slurm-ci-setup.sh: {e}"),
        }
    }
}

/// The pid file of `node`'s slurmd, from the controller's configuration (`SlurmdPidFile`,
/// where `%n` stands for the node's name).
fn slurmd_pid_file(node: &str) -> PathBuf {
    let o = Command::new("scontrol")
        .args(["show", "config"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let pattern = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "SlurmdPidFile").then(|| v.trim().to_string())
        })
        .expect("SlurmdPidFile in scontrol show config");
    PathBuf::from(pattern.replace("%n", node))
}

/// Whether a rank's log holds at least one step event.
fn has_step(log: &Path) -> bool {
    let Ok(f) = std::fs::File::open(log) else {
        return false;
    };
    std::io::BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .any(|v| v["event"] == "step")
}

/// Waits (at most `limit`) for a line of `lines` that contains `want`, keeping every line
/// seen in `seen`; panics with them when none comes.
fn wait_for_line(lines: &Receiver<String>, seen: &mut Vec<String>, want: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok(l) => {
                let hit = l.contains(want);
                seen.push(l);
                if hit {
                    return;
                }
            }
            Err(_) if Instant::now() < deadline => {}
            Err(_) => panic!("no line with {want:?} within {limit:?}: {seen:#?}"),
        }
    }
}

#[test]
fn a_two_node_cell_trains_over_gloo_and_names_both_nodes() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    set_up_cluster();
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(tmp.path(), 12, 600.0, 0);
    let started = Instant::now();
    let out = bench(tmp.path(), &m, "pass").output().unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dir = tmp.path().join("results/pass");
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", all_logs(&dir));
    eprintln!(
        "two-node cell: bench matrix took {:.1}s",
        took.as_secs_f64()
    );
    // The progress names both nodes where it names the job.
    assert!(stderr.contains("on node1, node2"), "{stderr}");

    let r = RunResults::load(&dir).unwrap();
    let c = only_cell(&r);
    assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
    assert!(!c.flaky);
    let a = &c.attempts[0];
    assert_eq!(a.slurm_nodes.as_deref(), Some("node[1-2]"), "{a:#?}");
    assert_eq!(a.slurm_node_names, NODES, "{a:#?}");
    let job = a.slurm_job_id.clone().unwrap();
    assert_eq!(common::job_state(&job), "COMPLETED");

    // Every step from both ranks, each from its own node; the step time is the slowest
    // rank's per step (median over the measured ones).
    let (r0, r1) = (steps_of(c, 0, 0), steps_of(c, 0, 1));
    assert_eq!((r0.len(), r1.len()), (12, 12), "{:#?}", c.repeats[0].steps);
    let mut slowest: Vec<f64> = r0.iter().zip(&r1).skip(2).map(|(a, b)| a.max(*b)).collect();
    slowest.sort_by(f64::total_cmp);
    let median = (slowest[4] + slowest[5]) / 2.0;
    let st = c.metrics["step_time_s"].value;
    assert!(
        (st - median).abs() < 1e-9,
        "step time {st}, slowest-rank median {median}"
    );
    assert_eq!(c.repeats[0].summary.peak_mem_bytes.len(), 2);
    assert_eq!(c.repeats[0].summary.world_size, Some(2));
    for (rank, node) in NODES.iter().enumerate() {
        let log =
            std::fs::read_to_string(dir.join(format!("logs/{}.r0.rank{rank}.log", c.id))).unwrap();
        assert!(
            log.contains(&format!("rank {rank}: of 2 on node {node} (host {node}")),
            "rank {rank}: {log}"
        );
        assert!(log.contains("master node1:"), "rank {rank}: {log}");
        assert!(
            log.contains(&format!("job {job} runs on node1, node2")),
            "{log}"
        );
    }
}

#[test]
fn a_lost_node_fails_the_attempt_naming_it_and_the_retry_passes_on_both_nodes() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    set_up_cluster();
    let tmp = tempfile::tempdir().unwrap();
    // Each attempt trains for 40 s: the first must still run when the controller declares
    // node2 lost (SlurmdTimeout 4 s and one failed ping: about 16 s here).
    let m = write_matrix(tmp.path(), 100_000, 40.0, 1);
    let dir = tmp.path().join("results/lost");
    let started = Instant::now();
    let (mut child, lines) = common::spawn_bench(&mut bench(tmp.path(), &m, "lost"));
    let mut seen = Vec::new();
    let guard = ClusterGuard;

    // Both ranks are training (each has printed a step) before the node is lost.
    let logs = dir.join("logs");
    let deadline = Instant::now() + Duration::from_secs(120);
    let rank_logs = loop {
        seen.extend(lines.try_iter());
        let found: Vec<PathBuf> = std::fs::read_dir(&logs)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        let rank = |r: u32| {
            found
                .iter()
                .find(|p| p.to_string_lossy().ends_with(&format!(".r0.rank{r}.log")))
                .cloned()
        };
        if let (Some(a), Some(b)) = (rank(0), rank(1)) {
            if has_step(&a) && has_step(&b) {
                break (a, b);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no steps from both ranks: {seen:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let training_at = started.elapsed();

    // Lose node2: SIGKILL to its slurmd, and only to it (its ranks live on, as they do on a
    // node whose daemon died; the controller must notice that the node stopped answering).
    let pid_file = slurmd_pid_file("node2");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let killed_at = started.elapsed();

    // The first attempt fails naming the node, and is retried.
    wait_for_line(
        &lines,
        &mut seen,
        "node node2 was lost",
        Duration::from_secs(120),
    );
    let failed_at = started.elapsed();
    let retry = seen.last().unwrap().clone();
    assert!(retry.starts_with("RETRY"), "{retry}");
    assert_eq!(node_state("node2"), "down*");

    // node2 comes back (its slurmd restarted; ReturnToService brings the node back to
    // service), and the retry's job, pending until then, runs on both nodes.
    set_up_cluster();
    let back_at = started.elapsed();
    let status = child.wait().unwrap();
    seen.extend(lines.try_iter());
    let done_at = started.elapsed();
    assert_eq!(status.code(), Some(0), "{seen:#?}\n{}", all_logs(&dir));
    drop(guard);
    eprintln!(
        "lost node: both ranks training at {:.1}s, node2's slurmd killed at {:.1}s, attempt failed at {:.1}s ({:.1}s after the kill), node2 back at {:.1}s, run done at {:.1}s",
        training_at.as_secs_f64(),
        killed_at.as_secs_f64(),
        failed_at.as_secs_f64(),
        (failed_at - killed_at).as_secs_f64(),
        back_at.as_secs_f64(),
        done_at.as_secs_f64()
    );

    let r = RunResults::load(&dir).unwrap();
    let c = only_cell(&r);
    assert_eq!(c.outcome, Outcome::Passed, "{c:#?}");
    assert!(
        c.flaky,
        "a pass after a retried infrastructure failure is flaky"
    );
    assert_eq!(c.attempts.len(), 2, "{:#?}", c.attempts);
    let (first, second) = (&c.attempts[0], &c.attempts[1]);
    let why = first.error.as_deref().unwrap_or("");
    assert!(
        why.starts_with("node node2 was lost (Not responding): Slurm ended job")
            && why.contains("NODE_FAIL"),
        "{why}"
    );
    assert_eq!(first.slurm_node_names, NODES);
    assert_eq!(second.error, None);
    assert_eq!(second.slurm_node_names, NODES, "{second:#?}");
    assert_ne!(first.slurm_job_id, second.slurm_job_id);
    // Slurm did not requeue the lost job (bench retries, in a job of its own).
    assert_eq!(
        common::job_state(first.slurm_job_id.as_deref().unwrap()),
        "NODE_FAIL"
    );
    // The retry's measurements are the cell's: both ranks' steps.
    assert!(!steps_of(c, 0, 0).is_empty() && !steps_of(c, 0, 1).is_empty());
    // The first attempt's logs say which node was lost.
    let job_log = std::fs::read_to_string(rank_logs.0.with_extension("").with_extension("job.log"));
    let job_log = job_log.unwrap_or_default();
    assert!(
        job_log.contains("Slurm holds node node2 lost: state down*, reason: Not responding"),
        "{job_log}"
    );
    for n in NODES {
        assert_eq!(node_state(n), "idle", "{n} after the test");
    }
}

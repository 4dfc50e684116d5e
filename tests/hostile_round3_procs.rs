//! Issue 34 ("Hostile input, round 3"), the classes about processes, through the built
//! binary: a hung or flooding driver tool (a stand-in `nvidia-smi` on PATH), a flooding
//! telemetry stream, kill -9 of bench and of `bench bisect`, a `--setup` that ignores
//! signals or leaves children behind, and bisections opening a new store together. Each
//! case checks the exit code, a time limit, bounded memory where memory was the failure
//! (RLIMIT_DATA on bench), and that no process it started is left (the stand-ins write
//! their pids to files; each must be gone after bench is).
//!
//! The limits are docs/runner.md's "Limits on external tools": 10 s and 8 MiB for a driver
//! tool, the `-lms` stream's line and rate bounds, 3 s after a bisection's second signal.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A temporary folder with `bin/` (put first on PATH, for stand-ins) and `pids/` (where
/// the stand-ins and workloads append their pids).
struct Lab {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        for sub in ["bin", "pids", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        Lab { _tmp: tmp, dir }
    }

    /// Writes an executable script `bin/<name>` whose body follows a line appending its pid
    /// to `pids/<name>`.
    fn tool(&self, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.join("bin").join(name);
        std::fs::write(
            &p,
            format!("#!/bin/sh\necho $$ >> \"$PIDS/{name}\"\n{body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// `bench ARGS` in the lab, the stand-ins first on PATH, hermetic otherwise.
    fn bench(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
        c.current_dir(&self.dir)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.dir.join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("PIDS", self.dir.join("pids"))
            .env("TMPDIR", self.dir.join("tmp"))
            .env_remove("CI")
            .env_remove("GITHUB_STEP_SUMMARY")
            .env_remove("BENCH_HISTORY")
            .env_remove("BENCH_MAX_CELLS")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null());
        c
    }

    /// A matrix of one command cell on `gpus` GPUs running `work` (a shell script body)
    /// after the start event; it prints three steps when `work` returns.
    fn matrix(&self, gpus: u32, work: &str) -> PathBuf {
        let script = self.dir.join("work.sh");
        std::fs::write(
            &script,
            format!(
                "printf '{{\"event\":\"start\",\"model\":\"toy\",\"world_size\":1}}\\n'\n{work}\n\
                 for i in 0 1 2; do printf '{{\"event\":\"step\",\"step\":%d,\"step_time_s\":0.01,\"tokens\":1024,\"loss\":2.5,\"warmup\":false}}\\n' $i; done\n"
            ),
        )
        .unwrap();
        let m = self.dir.join("m.yaml");
        std::fs::write(
            &m,
            format!(
                "name: procs\naxes:\n  model: [toy]\n  gpus: [{gpus}]\ndefaults:\n  steps: 3\n  warmup: 0\n  repeats: 1\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, \"{}\"]\n",
                script.display()
            ),
        )
        .unwrap();
        m
    }

    /// `bench matrix M --results-dir results --baselines baselines --no-progress`.
    fn run_matrix(&self, m: &Path) -> Command {
        let mut c = self.bench();
        c.arg("matrix")
            .arg(m)
            .args(["--results-dir", "results", "--baselines", "baselines"])
            .args(["--run-id", "r1", "--no-progress"]);
        c
    }

    fn pids(&self, name: &str) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("pids").join(name))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The parent of `pid`.
fn parent(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Asserts that every pid in `pids` is gone within 3 s (a killed process's parent may take
/// a moment to reap it).
fn assert_gone(what: &str, pids: &[i32]) {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > until {
            for p in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("{what}: processes {left:?} outlived bench");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `child` at most `limit`; kills it and fails past that.
fn finish_within(mut child: Child, limit: Duration, what: &str) -> (Output, Duration) {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return (child.wait_with_output().unwrap(), t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: still running after {limit:?}; its output:\n{}",
                text(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_within(cmd: &mut Command, limit: Duration, what: &str) -> (Output, Duration) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish_within(child, limit, what)
}

/// Limits bench's data segment (heap and private mappings) to `bytes`: an unbounded read
/// fails there instead of taking the machine's memory (bench itself needs under 1 GiB).
fn limit_data(cmd: &mut Command, bytes: u64) {
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_DATA, bytes, bytes)
                .map_err(std::io::Error::from)
        });
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn wait_for_pids(lab: &Lab, name: &str, n: usize, limit: Duration) -> Vec<i32> {
    let until = Instant::now() + limit;
    loop {
        let p = lab.pids(name);
        if p.len() >= n {
            return p;
        }
        assert!(Instant::now() < until, "no {n} pids in pids/{name}: {p:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A driver tool that never answers, with a child of its own holding the pipe.
const HUNG: &str = "sleep 1000 &\necho $! >> \"$PIDS/nvidia-smi\"\nwait";

const GIB: u64 = 1 << 30;

#[test]
fn hung_nvidia_smi_is_not_called_by_a_cpu_only_run() {
    // `--gpus 0`: detection and telemetry are not needed, so the hung tool costs nothing.
    let lab = Lab::new();
    lab.tool("nvidia-smi", HUNG);
    let m = lab.matrix(0, "true");
    let (out, took) = run_within(
        lab.run_matrix(&m).arg("--gpus").arg("0"),
        Duration::from_secs(8),
        "bench matrix --gpus 0",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(lab.pids("nvidia-smi").is_empty(), "nvidia-smi was called");
}

#[test]
fn hung_nvidia_smi_costs_bench_env_its_time_limit_and_leaves_nothing() {
    let lab = Lab::new();
    lab.tool("nvidia-smi", HUNG);
    let (out, took) = run_within(lab.bench().arg("env"), Duration::from_secs(20), "bench env");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("`nvidia-smi` did not answer within 10 s"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("cpu-"), "{}", text(&out));
    // One call (the header is not asked after a hang), killed with its child.
    let pids = lab.pids("nvidia-smi");
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_gone("hung nvidia-smi", &pids);
    assert!(took < Duration::from_secs(16), "{took:?}");
}

#[test]
fn hung_nvidia_smi_costs_bench_matrix_its_time_limit() {
    let lab = Lab::new();
    lab.tool("nvidia-smi", HUNG);
    let m = lab.matrix(0, "true");
    let (out, took) = run_within(
        &mut lab.run_matrix(&m),
        Duration::from_secs(25),
        "bench matrix",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("did not answer within 10 s"),
        "{}",
        text(&out)
    );
    assert!(
        lab.dir.join("results/r1/results.json").is_file(),
        "{}",
        text(&out)
    );
    assert_gone("hung nvidia-smi", &lab.pids("nvidia-smi"));
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn flooding_nvidia_smi_is_cut_off_at_its_output_bound() {
    // Detection read everything the tool printed: 8 GB from `yes` aborted bench.
    let lab = Lab::new();
    lab.tool(
        "nvidia-smi",
        "exec yes 'NVIDIA H100 80GB HBM3, 81559, 580.159.04'",
    );
    let mut cmd = lab.bench();
    cmd.arg("env");
    limit_data(&mut cmd, GIB);
    let (out, took) = run_within(&mut cmd, Duration::from_secs(10), "bench env");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("printed more than 8388608 bytes"), "{t}");
    assert!(!t.contains("memory allocation"), "{t}");
    assert_gone("flooding nvidia-smi", &lab.pids("nvidia-smi"));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn flooding_telemetry_stream_is_cut_off_and_the_run_ends() {
    // One H100 to detect and query once; the `-lms` stream then floods valid readings.
    let lab = Lab::new();
    lab.tool(
        "nvidia-smi",
        r#"line="0, GPU-fake-0000, 1755, 1980, 690.00, 700.00, 62, 100, 0x0000000000000000"
case "$*" in
  *-lms*) exec yes "$line" ;;
  *--query-gpu=name*) echo "NVIDIA H100 80GB HBM3, 81559, 580.159.04" ;;
  *--query-gpu=*) echo "$line" ;;
  *--query-compute-apps*) ;;
  *) echo "| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |" ;;
esac"#,
    );
    let m = lab.matrix(1, "sleep 2");
    let mut cmd = lab.run_matrix(&m);
    limit_data(&mut cmd, 2 * GIB);
    let (out, took) = run_within(&mut cmd, Duration::from_secs(30), "bench matrix");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("lines in a second"), "{t}");
    assert!(!t.contains("memory allocation"), "{t}");
    assert!(lab.dir.join("results/r1/results.json").is_file(), "{t}");
    assert_gone("flooding nvidia-smi -lms", &lab.pids("nvidia-smi"));
    assert!(took < Duration::from_secs(30), "{took:?}");
}

#[test]
fn kill_9_of_bench_takes_the_workers_children_with_it() {
    // The worker starts a child in its own process group (as a launcher starts its ranks)
    // and waits; bench is killed with SIGKILL: the worker and its child must go too.
    let lab = Lab::new();
    let m = lab.matrix(
        0,
        "echo $$ >> \"$PIDS/worker\"\nsleep 1000 &\necho $! >> \"$PIDS/worker\"\nwait",
    );
    let mut bench = lab
        .run_matrix(&m)
        .arg("--gpus")
        .arg("0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pids = wait_for_pids(&lab, "worker", 2, Duration::from_secs(15));
    bench.kill().unwrap();
    bench.wait().unwrap();
    assert_gone("a worker and its child after kill -9 of bench", &pids);
}

// ---- bench bisect ----

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "commit.gpgsign=false",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository of two commits whose matrix runs `work.sh` (a shell body run by the
/// probe's worker, before its events) in one command cell.
fn repo(lab: &Lab, name: &str, work: &str) -> PathBuf {
    let dir = lab.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    git(&dir, &["init", "-q", "-b", "main"]);
    std::fs::write(
        dir.join("work.sh"),
        format!(
            "{work}\nprintf '{{\"event\":\"start\",\"model\":\"toy\",\"world_size\":1}}\\n'\n\
             for i in 0 1 2; do printf '{{\"event\":\"step\",\"step\":%d,\"step_time_s\":0.01,\"tokens\":1024,\"loss\":2.5,\"warmup\":false}}\\n' $i; done\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("matrix.yaml"),
        "name: procs\naxes:\n  model: [toy]\ndefaults:\n  steps: 3\n  warmup: 0\n  repeats: 3\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, work.sh]\n",
    )
    .unwrap();
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "initial"]);
    std::fs::write(dir.join("x.txt"), "1\n").unwrap();
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "second"]);
    dir
}

fn bisect(lab: &Lab, repo: &Path, history: &Path, setup: Option<&str>) -> Command {
    let mut c = lab.bench();
    c.current_dir(repo)
        .args(["bisect", "toy", "--good", "HEAD~1", "--bad", "HEAD"])
        .args(["--matrix", "matrix.yaml", "--history"])
        .arg(history)
        .env("CUDA_VISIBLE_DEVICES", "");
    if let Some(s) = setup {
        c.args(["--setup", s]);
    }
    c
}

/// The bisection's temporary folders (its worktree lives in one): none may be left.
fn leftovers(lab: &Lab) -> Vec<PathBuf> {
    std::fs::read_dir(lab.dir.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[test]
fn bisect_setup_that_ignores_signals_is_stopped_by_the_second_one() {
    use nix::sys::signal::Signal;
    let lab = Lab::new();
    let r = repo(&lab, "repo", "");
    let setup = "trap '' INT TERM; echo $$ >> \"$PIDS/setup\"; sleep 1000 & echo $! >> \"$PIDS/setup\"; while :; do sleep 0.2; done";
    let child = bisect(&lab, &r, &lab.dir.join("h.sqlite"), Some(setup))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = wait_for_pids(&lab, "setup", 2, Duration::from_secs(20));
    signal(&child, Signal::SIGINT);
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, Signal::SIGTERM);
    // STOP_GRACE (3 s) after the second signal, then the worktree's removal.
    let (out, _) = finish_within(child, Duration::from_secs(10), "bench bisect");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert_gone("a setup that ignores signals", &pids);
    assert_eq!(
        leftovers(&lab),
        Vec::<PathBuf>::new(),
        "the worktree was left"
    );
}

#[test]
fn bisect_setup_children_do_not_outlive_their_setup() {
    // In the setup's group, and one that left it (`setsid`): both go when the setup ends.
    let lab = Lab::new();
    let r = repo(&lab, "repo", "");
    let setup = "sleep 1000 & echo $! >> \"$PIDS/bg\"; setsid sleep 1000 & echo $! >> \"$PIDS/bg\"; sleep 0.2; exit 1";
    let (out, _) = run_within(
        &mut bisect(&lab, &r, &lab.dir.join("h.sqlite"), Some(setup)),
        Duration::from_secs(20),
        "bench bisect",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("setup command failed"),
        "{}",
        text(&out)
    );
    let pids = lab.pids("bg");
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_gone("the setup's background children", &pids);
    assert_eq!(leftovers(&lab), Vec::<PathBuf>::new());
}

#[test]
fn kill_9_of_bisect_takes_its_probe_with_it() {
    // The probe's worker waits; the bisection is killed with SIGKILL: the probe (`bench
    // matrix`), its worker and the worker's child must go, not keep writing into the
    // folder the next bisection recreates.
    let lab = Lab::new();
    let r = repo(
        &lab,
        "repo",
        "echo $$ >> \"$PIDS/work\"; sleep 1000 & echo $! >> \"$PIDS/work\"; wait",
    );
    let mut child = bisect(&lab, &r, &lab.dir.join("h.sqlite"), None)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pids = wait_for_pids(&lab, "work", 2, Duration::from_secs(20));
    let probe = parent(pids[0]).unwrap();
    assert_ne!(probe, child.id() as i32, "the worker's parent is the probe");
    pids.push(probe);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_gone("the probe after kill -9 of bench bisect", &pids);
}

#[test]
fn bisections_opening_a_new_store_together_all_get_it() {
    // Three bisections (three clones) start on one store that does not exist yet; each
    // stops at its failing setup, none at "database is locked".
    let lab = Lab::new();
    let store = lab.dir.join("new.sqlite");
    let children: Vec<Child> = (0..3)
        .map(|i| {
            let r = repo(&lab, &format!("repo{i}"), "");
            bisect(&lab, &r, &store, Some("exit 1"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let (out, _) = finish_within(c, Duration::from_secs(30), "bench bisect");
        let t = text(&out);
        assert!(!t.contains("locked"), "{t}");
        assert_eq!(out.status.code(), Some(1), "{t}");
        assert!(t.contains("setup command failed"), "{t}");
    }
}

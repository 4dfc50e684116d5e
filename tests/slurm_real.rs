//! `--launcher slurm` against real Slurm daemons (slurmctld + slurmd on this host).
//!
//! These run only when `BENCH_SLURM_TESTS=1`, which CI sets after
//! `scripts/slurm-ci-setup.sh` has started the cluster; with the variable set, a Slurm
//! that does not work fails the tests loudly. Cells are CPU cells running a command
//! workload, a small shell script printing worker events.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use bench::cell::{Cell, CellId, Params, Value, Workload};
use bench::dist::launch::Program;
use bench::events::Event;
use bench::slurm::{self, JobState, Outcome, Settings};
use indexmap::IndexMap;

mod common;

fn cell(name: &str, ranks: i64, argv: &[String], env: BTreeMap<String, String>) -> Cell {
    let mut values = IndexMap::new();
    values.insert("model".to_string(), Value::Str(name.into()));
    values.insert("gpus".to_string(), Value::Int(ranks));
    Cell {
        id: CellId::from_values(&values),
        values,
        params: Params {
            timeout_s: 300,
            workload: Workload::Command {
                argv: argv.to_vec(),
                env,
            },
            ..Params::default()
        },
    }
}

fn program(c: &Cell) -> Program {
    match &c.params.workload {
        Workload::Command { argv, env } => Program::Command {
            argv: argv.clone(),
            env: env.clone(),
        },
        _ => unreachable!("these tests use command cells"),
    }
}

fn settings() -> Settings {
    let mut s = Settings::resolve(None, None, None, |k| std::env::var(k).ok()).unwrap();
    // Let the test jobs share the CI host's few CPUs.
    s.sbatch_args.push("--oversubscribe".into());
    s
}

const WORKER: &str = r#"#!/bin/sh
# A command workload: records what it was given, prints worker events and a log line.
out="$2"
printf '%s' "$1" > "$out/arg-$RANK"
printf '%s' "$BENCH_TEST_NOTE" > "$out/env-$RANK"
printf '{"event":"notice","message":"rank=%s world=%s local=%s lws=%s nvls=%s port=%s"}\n' \
  "$RANK" "$WORLD_SIZE" "$LOCAL_RANK" "$LOCAL_WORLD_SIZE" "$NCCL_NVLS_ENABLE" "$MASTER_PORT"
i=0
while [ $i -lt 3 ]; do
  printf '{"event":"step","step":%d,"step_time_s":0.01,"tokens":64,"loss":%d.5,"rank":%s}\n' $i $((3 - i)) "$RANK"
  i=$((i + 1))
done
printf '{"event":"summary","tokens_per_s":6400,"world_size":%s}\n' "$WORLD_SIZE"
echo "log line from rank $RANK" >&2
if [ "$RANK" = "$FAIL_RANK" ]; then exit 6; fi
"#;

#[test]
fn a_two_rank_cpu_cell_runs_and_its_events_come_back() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.sh");
    std::fs::write(&script, WORKER).unwrap();
    let hostile = "a b 'q' \"d\" $(touch pwned) `id` ; rm -rf x\nline2 $HOME *";
    let argv = vec![
        "/bin/sh".to_string(),
        script.display().to_string(),
        hostile.to_string(),
        dir.path().display().to_string(),
    ];
    let env: BTreeMap<_, _> = [("BENCH_TEST_NOTE".to_string(), hostile.to_string())].into();
    let c = cell("slurm-ok", 2, &argv, env);
    let plan = slurm::plan(
        &c,
        &program(&c),
        &settings(),
        false,
        &dir.path().join("job"),
    )
    .unwrap();
    let job = slurm::submit(&plan).unwrap();
    let outcome = job
        .wait(
            Duration::from_secs(120),
            Duration::from_millis(500),
            &AtomicBool::new(false),
        )
        .unwrap();
    let out = job.collect().unwrap();
    match &outcome {
        Outcome::Finished(JobState::Finished {
            state, exit_code, ..
        }) => {
            assert_eq!(state, "COMPLETED", "{out:#?}");
            assert_eq!(*exit_code, Some(0));
        }
        other => panic!("job {}: {other:?}\n{out:#?}", job.id),
    }
    for rank in 0..2u32 {
        let ev = out.events_of(rank);
        let steps = ev.iter().filter(|e| matches!(e, Event::Step(_))).count();
        assert_eq!(steps, 3, "rank {rank}: {ev:?}");
        assert!(matches!(ev.last(), Some(Event::Summary(s)) if s.world_size == Some(2)));
        match ev.first() {
            Some(Event::Notice { message }) => {
                assert!(
                    message.starts_with(&format!(
                        "rank={rank} world=2 local={rank} lws=2 nvls=0 port="
                    )),
                    "{message}"
                );
            }
            other => panic!("rank {rank}: expected a notice, got {other:?}"),
        }
        assert!(out
            .log_of(rank)
            .contains(&format!("log line from rank {rank}")));
        // The hostile value arrived as one argument and one variable, byte for byte.
        let arg = std::fs::read_to_string(dir.path().join(format!("arg-{rank}"))).unwrap();
        assert_eq!(arg, hostile);
        let envv = std::fs::read_to_string(dir.path().join(format!("env-{rank}"))).unwrap();
        assert_eq!(envv, hostile);
    }
    assert_eq!(out.rank_exit_codes(), [(0, 0), (1, 0)].into());
    assert!(!dir.path().join("job/pwned").exists() && !Path::new("pwned").exists());
}

#[test]
fn a_failing_rank_fails_the_job_with_its_own_exit_code() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("worker.sh");
    std::fs::write(&script, WORKER).unwrap();
    let argv = vec![
        "/bin/sh".to_string(),
        script.display().to_string(),
        "x".to_string(),
        dir.path().display().to_string(),
    ];
    let env: BTreeMap<_, _> = [("FAIL_RANK".to_string(), "1".to_string())].into();
    let c = cell("slurm-fail", 2, &argv, env);
    let plan = slurm::plan(
        &c,
        &program(&c),
        &settings(),
        false,
        &dir.path().join("job"),
    )
    .unwrap();
    let job = slurm::submit(&plan).unwrap();
    let outcome = job
        .wait(
            Duration::from_secs(120),
            Duration::from_millis(500),
            &AtomicBool::new(false),
        )
        .unwrap();
    let out = job.collect().unwrap();
    match &outcome {
        Outcome::Finished(JobState::Finished { state, .. }) => {
            assert_eq!(state, "FAILED", "{out:#?}")
        }
        other => panic!("job {}: {other:?}\n{out:#?}", job.id),
    }
    assert_eq!(out.first_failure(), Some((1, 6)), "{out:#?}");
}

fn squeue_lists(id: &str) -> bool {
    let o = Command::new("squeue")
        .args(["-h", "-j", id, "-o", "%T"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&o.stdout);
    t.lines().any(|l| !l.trim().is_empty())
}

#[test]
fn sleeping_jobs_are_cancelled_on_timeout_and_on_the_cancel_flag() {
    if !common::slurm_enabled() {
        return;
    }
    let _turn = common::slurm_turn();
    let dir = tempfile::tempdir().unwrap();
    let argv = vec!["sleep".to_string(), "300".to_string()];

    // Timeout: wait gives up, scancels, and the job leaves the queue.
    let c = cell("slurm-sleep-a", 1, &argv, BTreeMap::new());
    let plan = slurm::plan(&c, &program(&c), &settings(), false, &dir.path().join("a")).unwrap();
    let job = slurm::submit(&plan).unwrap();
    let outcome = job
        .wait(
            Duration::from_secs(3),
            Duration::from_millis(200),
            &AtomicBool::new(false),
        )
        .unwrap();
    assert_eq!(outcome, Outcome::TimedOut);
    assert!(
        !squeue_lists(&job.id),
        "job {} still queued after cancel",
        job.id
    );

    // Ctrl-C: another thread raises the flag while wait polls.
    let c = cell("slurm-sleep-b", 1, &argv, BTreeMap::new());
    let plan = slurm::plan(&c, &program(&c), &settings(), false, &dir.path().join("b")).unwrap();
    let job = slurm::submit(&plan).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let f2 = Arc::clone(&flag);
    let raiser = thread::spawn(move || {
        thread::sleep(Duration::from_secs(1));
        f2.store(true, Ordering::SeqCst);
    });
    let outcome = job
        .wait(Duration::from_secs(120), Duration::from_millis(200), &flag)
        .unwrap();
    raiser.join().unwrap();
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(
        !squeue_lists(&job.id),
        "job {} still queued after cancel",
        job.id
    );
    match job.state().unwrap() {
        JobState::Finished { state, .. } => assert_eq!(state, "CANCELLED"),
        other => panic!("{other:?}"),
    }

    // An explicit cancel of a job that is running.
    let c = cell("slurm-sleep-c", 1, &argv, BTreeMap::new());
    let plan = slurm::plan(&c, &program(&c), &settings(), false, &dir.path().join("c")).unwrap();
    let job = slurm::submit(&plan).unwrap();
    job.cancel().unwrap();
    assert!(job.wait_gone(Duration::from_secs(30), Duration::from_millis(200)));
    assert!(!squeue_lists(&job.id));
}

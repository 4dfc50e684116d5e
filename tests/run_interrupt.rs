//! Ctrl-C and `--resume`: SIGINT reaches the runner mid-run (in its own test binary,
//! since it installs a SIGINT handler in this process), finished cells are kept in a
//! valid results.json, and resuming runs only the rest.

mod common;

use std::time::Duration;

use bench::results::{Outcome, RunResults};
use common::*;

#[test]
fn interrupt_keeps_finished_cells_and_resume_runs_only_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let record = tmp.path().join("record");
    let marker = tmp.path().join("slow-ran");
    let started = tmp.path().join("slow-started");
    let with_record = |mut c: bench::cell::Cell| {
        if let bench::cell::Workload::Command { env, .. } = &mut c.params.workload {
            env.insert("RECORD".into(), record.display().to_string());
        }
        c
    };
    let cells = vec![
        with_record(cell("first", &["ok"])),
        with_record(cell(
            "slow",
            &[
                "slow-once",
                marker.to_str().unwrap(),
                started.to_str().unwrap(),
            ],
        )),
        with_record(cell("last", &["ok"])),
    ];

    // Send SIGINT to this process once the slow cell is running.
    let watch = started.clone();
    let killer = std::thread::spawn(move || {
        for _ in 0..600 {
            if watch.exists() {
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGINT)
                    .unwrap();
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let cfg = config(tmp.path());
    let (res, lines) = run(&cfg, expansion(cells.clone()));
    assert!(killer.join().unwrap(), "the slow cell never started");
    let out = res.unwrap();
    assert!(out.interrupted, "{lines}");
    assert_eq!(out.exit_code(), 130);

    let saved = RunResults::load(&out.run_dir).unwrap();
    assert!(saved.interrupted);
    let by = |r: &RunResults, n: &str| {
        r.cells
            .iter()
            .find(|c| c.id.as_str() == n)
            .unwrap()
            .outcome
            .clone()
    };
    assert_eq!(by(&saved, "first"), Outcome::Passed);
    assert!(
        matches!(by(&saved, "slow"), Outcome::Skipped { reason } if reason.contains("interrupted"))
    );
    assert!(
        matches!(by(&saved, "last"), Outcome::Skipped { reason } if reason.contains("interrupted"))
    );

    // Resume the same run: only the unfinished cells run, into the same file.
    let mut cfg = config(tmp.path());
    cfg.run_id = None;
    cfg.resume = Some(out.run_dir.clone());
    let (res, lines) = run(&cfg, expansion(cells));
    let out2 = res.unwrap();
    assert_eq!(out2.run_dir, out.run_dir);
    assert!(!out2.interrupted);
    assert_eq!(out2.exit_code(), 0, "{lines}");
    let saved = RunResults::load(&out.run_dir).unwrap();
    for n in ["first", "slow", "last"] {
        assert_eq!(by(&saved, n), Outcome::Passed, "{n}");
    }
    assert!(!saved.interrupted);
    let runs = std::fs::read_to_string(&record).unwrap();
    let count = |n: &str| runs.lines().filter(|l| *l == n).count();
    assert_eq!(count("first"), 1, "{runs}");
    assert_eq!(count("slow"), 2, "{runs}");
    assert_eq!(count("last"), 1, "{runs}");
    assert!(lines.contains("kept from the resumed run"), "{lines}");
}

//! A second Ctrl-C kills running cells at once instead of waiting out the grace period
//! (its own test binary: it sends SIGINT to this process).

mod common;

use std::time::Duration;

use bench::results::Outcome;
use common::*;

#[test]
fn second_ctrl_c_kills_without_waiting_for_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pids");
    let c = cell("stubborn", &["hang", pidfile.to_str().unwrap()]);
    let mut cfg = config(tmp.path());
    // Far longer than the test may take: only the second SIGINT can end the cell in time.
    cfg.grace = Duration::from_secs(3600);
    let watch = pidfile.clone();
    let killer = std::thread::spawn(move || {
        let me = nix::unistd::Pid::this();
        for _ in 0..600 {
            if watch.exists() {
                nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGINT).unwrap();
                // The worker ignores SIGTERM; give the runner time to send it first.
                std::thread::sleep(Duration::from_millis(500));
                nix::sys::signal::kill(me, nix::sys::signal::Signal::SIGINT).unwrap();
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let (res, lines) = run(&cfg, expansion(vec![c]));
    assert!(killer.join().unwrap(), "the worker never started");
    let out = res.unwrap();
    assert!(out.interrupted, "{lines}");
    assert!(lines.contains("interrupted again"), "{lines}");
    assert!(matches!(
        &out.results.cells[0].outcome,
        Outcome::Skipped { reason } if reason.contains("interrupted")
    ));
    let pids = std::fs::read_to_string(&pidfile).unwrap();
    for pid in pids.split_whitespace().map(|p| p.parse::<i32>().unwrap()) {
        assert!(wait_gone(pid), "process {pid} survived");
    }
}

//! Issue 31's busy host end to end through the built binary: every CPU of the machine
//! loaded by processes that are not bench's during a slowed night makes the verdict
//! `environment`, naming them, and the job passes; the same slowdown on a quiet host is
//! regressed. It loads the machine itself, so it is a binary of its own (cargo test runs
//! binaries one after another) and nextest runs it alone (.config/nextest.toml).
//!
//! The lab is tests/common/sequence_lab.rs.

#[path = "common/sequence_lab.rs"]
mod lab;

use lab::{text, Lab};
use std::process::{Child, Command, Stdio};

/// Spinning shells, one per CPU: processes that are not bench's.
fn load_every_cpu() -> Vec<Child> {
    let n = std::thread::available_parallelism().map_or(2, |n| n.get());
    (0..n)
        .map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_busy_host_is_the_environment_naming_its_processes() {
    let mut lab = Lab::new();
    lab.host_sampling = true;
    lab.clean_nights(6);
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(lab.dir.join("results/c05/results.json")).unwrap(),
    )
    .unwrap();
    let host = &r["cells"][0]["telemetry"]["host"];
    assert!(host["samples"].as_u64().unwrap() >= 3, "{host}");
    // The night's cell is 8% slower while every CPU spins in another process.
    let mut spinners = load_every_cpu();
    let o = lab.night("busy", 1.08, &[]);
    for s in &mut spinners {
        let _ = s.kill();
        let _ = s.wait();
    }
    let out = text(&o);
    let h = lab.history("busy");
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(lab.dir.join("results/busy/results.json")).unwrap(),
    )
    .unwrap();
    let host = &r["cells"][0]["telemetry"]["host"];
    assert_eq!(lab.verdict("busy"), "environment", "{h}\n{host}");
    assert_eq!(o.status.code(), Some(0), "{out}");
    let line = h["cells"][0]["line"].as_str().unwrap();
    assert!(line.contains("the host was busy"), "{line}");
    assert!(line.contains("`sh` (pid"), "{line}");
    // The same slowdown on a quiet host is the code's.
    let o = lab.night("quiet-slow", 1.08, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(lab.verdict("quiet-slow"), "regressed");
}

//! Issue 31's busy host end to end through the built binary, as issue 40 settles it: every
//! CPU of the machine loaded by processes that are not bench's during a night that runs 8%
//! slower at clean code makes the verdict `environment`, naming them, and the job passes
//! (the pairs against the last good commit run under the same load and find the code the
//! same); a real 8% slowdown of the code on the same busy host is `regressed`, not excused
//! (the pairs still show it); on a quiet host too. It loads the machine itself, so it is a
//! binary of its own (cargo test runs binaries one after another) and nextest runs it alone
//! (.config/nextest.toml).
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
    // The night's cell is 8% slower, at clean code, while every CPU spins in another
    // process: the host's slowness reaches every process of the night, pairs included.
    let mut spinners = load_every_cpu();
    let o = lab.night("busy", 1.0, &[1.08; 64]);
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
    assert_eq!(h["cells"][0]["pairs"]["result"]["answer"], "same", "{h}");
    // A real 8% slowdown of the code on the same busy host: the pairs show it.
    std::fs::write(lab.seq.join("once"), "").unwrap();
    let mut spinners = load_every_cpu();
    let o = lab.night("busy-slow", 1.08, &[]);
    for s in &mut spinners {
        let _ = s.kill();
        let _ = s.wait();
    }
    let h = lab.history("busy-slow");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a busy host excuses no regression: {h}"
    );
    assert_eq!(lab.verdict("busy-slow"), "regressed", "{h}");
    assert_eq!(
        h["cells"][0]["pairs"]["result"]["answer"], "different",
        "{h}"
    );
    // And on a quiet host.
    let o = lab.night("quiet-slow", 1.08, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(lab.verdict("quiet-slow"), "regressed");
}

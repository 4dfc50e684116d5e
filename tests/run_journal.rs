//! The results journal end to end, through the built binary: a run whose document has
//! outgrown a whole rewrite per cell keeps its cells in `results.journal`; killed with
//! SIGKILL (no orderly stop, nothing flushed at the end), every cell reported saved is
//! still read back by `--resume`, which runs only the rest and leaves one complete
//! `results.json` and no journal.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bench::results::{Outcome, RunResults};
use common::fixture;

/// Cells before the one that hangs: enough for the document to pass the size below which
/// it is rewritten after every cell (64 KiB: each cell here is about 5 KB), and between two
/// of its rewrites (they come as the document grows by half), so the journal holds cells
/// when the run is killed.
const QUICK: usize = 150;

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.env_remove("CI").env_remove("GITHUB_STEP_SUMMARY");
    c
}

/// `QUICK` cells of 40 steps each, then `zz-slow`, which hangs the first time it runs.
fn write_matrix(dir: &Path) -> std::path::PathBuf {
    let models: Vec<String> = (0..QUICK).map(|i| format!("m{i:03}")).collect();
    let record = dir.join("record");
    let text = format!(
        "name: journal\naxes:\n  model: [{models}, zz-slow]\ndefaults:\n  steps: 41\n  warmup: 1\n  timeout: 60s\n  retries: 0\n  workload: {{kind: command, argv: [sh, '{w}', many, '40'], env: {{RECORD: '{r}'}}}}\noverrides:\n  model:\n    zz-slow: {{workload: {{kind: command, argv: [sh, '{w}', slow-once, '{m}', '{s}'], env: {{RECORD: '{r}'}}}}}}\n",
        models = models.join(", "),
        w = fixture().display(),
        r = record.display(),
        m = dir.join("slow-ran").display(),
        s = dir.join("slow-started").display(),
    );
    let path = dir.join("matrix.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_killed_run_keeps_its_journaled_cells_and_resume_folds_them_in() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_matrix(tmp.path());
    let results = tmp.path().join("results");
    let mut child = bench()
        .arg("matrix")
        .arg(&m)
        .arg("--baselines")
        .arg(tmp.path().join("baselines"))
        .args(["--gpus", "0", "--no-progress", "--run-id", "r1"])
        .arg("--results-dir")
        .arg(&results)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = tmp.path().join("slow-started");
    let mut waited = 0;
    while !started.exists() {
        assert!(waited < 2400, "the slow cell never started");
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    // No orderly stop: whatever is on disk now is all a reader gets.
    child.kill().unwrap();
    child.wait().unwrap();

    let dir = results.join("r1");
    let journal = std::fs::read_to_string(dir.join(RunResults::JOURNAL)).unwrap();
    let whole: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(RunResults::FILE)).unwrap()).unwrap();
    let in_document = whole["cells"].as_array().unwrap().len();
    let in_journal = journal.lines().count();
    assert!(
        in_document < QUICK && in_journal > 0,
        "the journal was not used: {in_document} cells in results.json, {in_journal} journaled"
    );
    assert_eq!(
        in_document + in_journal,
        QUICK,
        "every finished cell is on disk"
    );
    // Every reader goes through RunResults::load, which merges the journal.
    let r = RunResults::load(&dir).unwrap();
    assert_eq!(r.cells.len(), QUICK);
    assert!(r.cells.iter().all(|c| c.outcome == Outcome::Passed));

    common::resume_run(&m, &tmp.path().join("baselines"), &dir);
    assert!(
        !dir.join(RunResults::JOURNAL).exists(),
        "a finished run leaves no journal"
    );
    let text = std::fs::read(dir.join(RunResults::FILE)).unwrap();
    let r: RunResults = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        r.cells.len(),
        QUICK + 1,
        "results.json alone holds every cell"
    );
    assert!(r.cells.iter().all(|c| c.outcome == Outcome::Passed));
    // Only the hanging cell ran again.
    let record = std::fs::read_to_string(tmp.path().join("record")).unwrap();
    assert_eq!(record.lines().count(), QUICK + 2, "{record}");
    assert_eq!(record.lines().filter(|l| *l == "zz-slow").count(), 2);
}

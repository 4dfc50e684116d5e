//! A sharded night to merge: two shard folders of one run of five fast cells (a command
//! workload of no known model, so every cell has the same nominal cost and the shards
//! split them 3 + 2), and `bench report merge` of them, for the tests of the merge as a
//! reader of untrusted folders.

use std::path::{Path, PathBuf};
use std::process::Output;

use super::cli::{bench, text};

/// The matrix of five cells, each `repeats` repeats of five paced steps; returns its path.
pub fn matrix(dir: &Path, repeats: u32) -> String {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    let text = format!(
        "name: shards\naxes:\n  model: [a, b, c, d, e]\n  gpus: [1]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: {repeats}\n  timeout: 60s\n  tolerance: 0.1\n  extra: {{step_time: \"0.01\"}}\n  workload:\n    kind: command\n    argv: [sh, \"{}\", paced, \"{{step_time}}\"]\n",
        worker.display()
    );
    let p = dir.join("m.yaml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// Runs shard `n` (`1/2`) of run `id` into `dir/s1` (or `s2`), `repeats` repeats a cell,
/// with `extra` flags; returns the shard's run folder.
pub fn shard_repeated(dir: &Path, id: &str, n: &str, repeats: u32, extra: &[&str]) -> PathBuf {
    let m = matrix(dir, repeats);
    let results = dir.join(format!("s{}", &n[..1]));
    let baselines = dir.join("baselines");
    let mut a = vec![
        "matrix",
        m.as_str(),
        "--results-dir",
        results.to_str().unwrap(),
        "--run-id",
        id,
        "--baselines",
        baselines.to_str().unwrap(),
        "--no-progress",
        "--gpus",
        "0",
        "--shard",
        n,
    ];
    a.extend_from_slice(extra);
    let o = bench(&a);
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "shard {n}: {}",
        text(&o)
    );
    results.join(id)
}

/// [`shard_repeated`] with one repeat a cell.
pub fn shard(dir: &Path, id: &str, n: &str, extra: &[&str]) -> PathBuf {
    shard_repeated(dir, id, n, 1, extra)
}

/// Both shards of run `night`, `repeats` repeats a cell.
pub fn night_repeated(dir: &Path, repeats: u32) -> (PathBuf, PathBuf) {
    (
        shard_repeated(dir, "night", "1/2", repeats, &[]),
        shard_repeated(dir, "night", "2/2", repeats, &[]),
    )
}

/// Both shards of run `night`, one repeat a cell.
pub fn night(dir: &Path) -> (PathBuf, PathBuf) {
    night_repeated(dir, 1)
}

/// Both shards of run `night`, judged against one history store (`dir/h.sqlite`), so each
/// has its `history.json`.
pub fn judged_night(dir: &Path) -> (PathBuf, PathBuf) {
    let store = dir.join("h.sqlite");
    let store = store.to_str().unwrap();
    (
        shard(dir, "night", "1/2", &["--history", store]),
        shard(dir, "night", "2/2", &["--history", store]),
    )
}

/// A copy of the shard folder `from` under `dir/name/night` (results and plan).
pub fn copy_shard(from: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name).join("night");
    std::fs::create_dir_all(&to).unwrap();
    for f in ["results.json", "shard.json"] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    to
}

/// `bench report merge INPUTS -o OUT --baselines dir/baselines EXTRA`.
pub fn merge(dir: &Path, inputs: &[&Path], out: &Path, extra: &[&str]) -> Output {
    let mut a: Vec<String> = vec!["report".into(), "merge".into()];
    a.extend(inputs.iter().map(|p| p.display().to_string()));
    a.extend([
        "-o".into(),
        out.display().to_string(),
        "--baselines".into(),
        dir.join("baselines").display().to_string(),
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    bench(&a)
}

/// Exit 2 with each of `says` in the message, and no output written.
pub fn refused(o: &Output, out: &Path, says: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "{}", text(o));
    for s in says {
        assert!(text(o).contains(s), "{s:?} not in {}", text(o));
    }
    assert!(!out.exists(), "a refused merge wrote {}", out.display());
}

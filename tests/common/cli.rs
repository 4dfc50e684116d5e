//! Running the built `bench` as a user would, and reading what it printed or wrote: the
//! helpers every through-the-binary test of a hostile round had its own copy of.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// `bench ARGS`, hermetic: no GPU, no CI job summary to append to, no store named by the
/// environment (a test names its store, or has none).
pub fn bench_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    c.args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_HISTORY");
    c
}

/// [`bench_cmd`], run to its end.
pub fn bench(args: &[&str]) -> Output {
    bench_cmd(args).output().unwrap()
}

/// [`bench`] in the folder `dir`, for commands given paths relative to it.
pub fn bench_in(dir: &Path, args: &[&str]) -> Output {
    bench_cmd(args).current_dir(dir).output().unwrap()
}

/// Everything the command printed, stdout then stderr: what a test looks for a message in.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

pub fn write_json(p: &Path, v: &Value) {
    std::fs::write(p, v.to_string()).unwrap();
}

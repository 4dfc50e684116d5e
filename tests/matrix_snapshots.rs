//! Snapshot tests of the dry-run formats (human and JSON) on a fixture that uses every construct of the language.

use std::process::Command;

fn dry_run(format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args([
            "matrix",
            "tests/fixtures/matrix/showcase.yaml",
            "--dry-run",
            "--format",
            format,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn showcase_dry_run_human() {
    insta::assert_snapshot!(dry_run("human"));
}

#[test]
fn showcase_dry_run_json() {
    let doc: serde_json::Value = serde_json::from_str(&dry_run("json")).unwrap();
    insta::assert_json_snapshot!(doc);
}

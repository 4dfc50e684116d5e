//! The project's own module check (`scripts/module-graph.py`, run by scripts/test.sh) on
//! small crates written here: it sees an import made by an inline path in code (issue 42: a
//! cycle matrix -> run -> slurm -> matrix through `crate::run::launch::check(...)` passed as
//! "0 problems" while the check read `use` lines only), ignores what `#[cfg(test)]` items
//! import, and passes a crate whose stages import only earlier ones.

use std::path::Path;
use std::process::Command;

/// Writes `files` (path under src/, text) and runs the check on that src/.
fn check(files: &[(&str, &str)]) -> (i32, String) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for (path, text) in files {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/module-graph.py");
    let o = Command::new("python3")
        .arg(script)
        .arg(&src)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), said)
}

const LIB: &str = "pub mod matrix;\npub mod run;\npub mod slurm;\n";

#[test]
fn an_inline_path_that_closes_a_cycle_is_a_problem() {
    let (code, said) = check(&[
        ("lib.rs", LIB),
        (
            "matrix/mod.rs",
            "//! The matrix.\npub fn load() {\n    crate::run::launch::check(1);\n}\n",
        ),
        ("run/mod.rs", "//! The runner.\npub mod launch;\n"),
        (
            "run/launch.rs",
            "use crate::slurm::submit;\npub fn check(_: u8) { submit(); }\n",
        ),
        (
            "slurm.rs",
            "//! Slurm.\npub fn submit() {\n    let _ = crate::matrix::load;\n}\n",
        ),
    ]);
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("matrix") && said.contains("run"), "{said}");
    assert!(!said.contains("0 problem"), "{said}");
}

#[test]
fn test_items_and_comments_import_nothing_and_a_dag_passes() {
    let (code, said) = check(&[
        ("lib.rs", LIB),
        ("matrix/mod.rs", "//! The matrix.\npub fn load() {}\n"),
        (
            "run/mod.rs",
            "//! The runner: calls `crate::slurm` never.\npub fn go() {\n    crate::matrix::load();\n}\n\
             #[cfg(test)]\nmod tests {\n    #[test]\n    fn t() { crate::slurm::submit(); }\n}\n",
        ),
        (
            "slurm.rs",
            "//! Slurm.\npub fn submit() {\n    crate::run::go();\n}\n",
        ),
    ]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("0 problem"), "{said}");
}

//! Issue 42, hostile round 4, at `bench site`'s door: the output is written fresh (no page
//! of a cell or run the store no longer holds survives a rebuild), a folder bench did not
//! write is never replaced, `-o` naming a dangling link or a file is bad input (exit 2, not
//! exit 3's "File exists"), and one 50 MB text in the store cannot make a 100 MB page.

use std::path::Path;
use std::process::{Command, Output};

use bench::site::synthetic::{generate, Spec};

fn site(dir: &Path, store: &Path, out: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .current_dir(dir)
        .args(["site", "--history"])
        .arg(store)
        .args(["-o", out])
        .env_remove("BENCH_HISTORY")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn store(dir: &Path, name: &str, cells: usize, runs: usize) -> std::path::PathBuf {
    let p = dir.join(name);
    generate(
        p.to_str().unwrap(),
        &Spec {
            cells,
            runs,
            keys: 1,
            hostile: false,
        },
    )
    .unwrap();
    p
}

fn pages(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        total += if m.is_dir() { size(&e.path()) } else { m.len() };
    }
    total
}

#[test]
fn a_rebuilt_site_holds_only_the_pages_of_the_store_it_was_built_from() {
    let tmp = tempfile::tempdir().unwrap();
    let big = store(tmp.path(), "big.sqlite", 12, 10);
    let small = store(tmp.path(), "small.sqlite", 4, 6);
    let o = site(tmp.path(), &big, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = tmp.path().join("site");
    assert_eq!(pages(&out.join("cells")), 12);
    assert_eq!(pages(&out.join("runs")), 10);
    // A page bench never wrote, left in the site by hand, goes too: the site is replaced.
    std::fs::write(out.join("cells/stale.html"), "old").unwrap();
    let o = site(tmp.path(), &small, "site");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(pages(&out.join("cells")), 4, "stale cell pages stay");
    assert_eq!(pages(&out.join("runs")), 6, "stale run pages stay");
    assert!(out.join(".bench-site").is_file());
    // Nothing of the swap is left beside it.
    let beside: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".bench-site"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
    // Through a link to the site, the link stays and the site it names is rebuilt.
    std::os::unix::fs::symlink(&out, tmp.path().join("published")).unwrap();
    let o = site(tmp.path(), &big, "published");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(std::fs::symlink_metadata(tmp.path().join("published"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(pages(&out.join("cells")), 12);
}

#[test]
fn an_output_that_is_not_a_site_folder_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path(), "h.sqlite", 4, 6);
    // A folder of the user's own files: the site would replace them.
    std::fs::create_dir(tmp.path().join("docs")).unwrap();
    std::fs::write(tmp.path().join("docs/notes.md"), "mine").unwrap();
    let o = site(tmp.path(), &db, "docs");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("-o docs: a folder holding files bench site did not write"),
        "{}",
        text(&o)
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("docs/notes.md")).unwrap(),
        "mine"
    );
    assert_eq!(pages(&tmp.path().join("docs")), 1);
    // A dangling link: exit 2 naming it (it was exit 3, "File exists").
    std::os::unix::fs::symlink(tmp.path().join("gone"), tmp.path().join("dangling")).unwrap();
    let o = site(tmp.path(), &db, "dangling");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("-o dangling: a symbolic link to ")
            && text(&o).contains("does not exist"),
        "{}",
        text(&o)
    );
    // A file.
    std::fs::write(tmp.path().join("file"), "x").unwrap();
    let o = site(tmp.path(), &db, "file");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("-o file: not a folder"), "{}", text(&o));
    // An empty folder is taken.
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let o = site(tmp.path(), &db, "empty");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_50_mb_text_in_the_store_makes_no_50_mb_page() {
    let tmp = tempfile::tempdir().unwrap();
    let db = store(tmp.path(), "h.sqlite", 4, 6);
    let o = site(tmp.path(), &db, "clean");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let clean = size(&tmp.path().join("clean"));
    // A host name, a matrix name and an accepted shift's reason of 50 MB each, as a store
    // shared with another tool may hold.
    let c = rusqlite::Connection::open(&db).unwrap();
    let huge = "x".repeat(50 << 20);
    c.execute("UPDATE bench_runs SET host = ?1, matrix_name = ?1", [&huge])
        .unwrap();
    c.execute("UPDATE bench_segments SET reason = ?1", [&huge])
        .unwrap();
    drop(c);
    let o = site(tmp.path(), &db, "hostile");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let hostile = size(&tmp.path().join("hostile"));
    assert!(
        hostile < clean + 2_000_000,
        "the site grew from {clean} to {hostile} bytes"
    );
    let runs = std::fs::read_to_string(tmp.path().join("hostile/assets/runs.js")).unwrap();
    assert!(runs.contains("more characters)"), "the cut says so");
}

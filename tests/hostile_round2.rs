//! Issue 25 ("Hostile input, round 2") through the built binary, one test per class:
//! forged and absurd framework measurements, unbounded memory, credentials in what bench
//! writes, damaged history stores, hangs on a store that never answers, and text that
//! would act in what people read.
//!
//! The PostgreSQL cases need the real server of scripts/postgres-ci-setup.sh
//! (`BENCH_PG_TESTS=1` and `BENCH_PG_URL`, as tests/history_store.rs); the page and
//! Markdown cases need chromium (`BENCH_CHROMIUM`, and `npm ci`), as tests/report_browser.rs.
//! Without them those parts say so and are skipped, except under CI, where they fail.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bench::results::{Outcome, RunResults};

fn bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_bench"));
    // Hermetic: no CI job summary, no history or GPUs from the environment.
    c.env_remove("CI")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("BENCH_HISTORY")
        .env_remove("BENCH_MAX_CELLS")
        .env("CUDA_VISIBLE_DEVICES", "");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

/// An executable shell script.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = write(dir, name, &format!("#!/bin/sh\n{body}"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Whether `name` (BENCH_PG_TESTS=1, or BENCH_CHROMIUM) is set; outside CI a missing one
/// skips the part that needs it, under CI it fails the test.
fn have(what: &str, set: bool) -> bool {
    if !set {
        assert!(
            std::env::var_os("CI").is_none(),
            "{what} must be available when CI is set"
        );
        eprintln!("{what} not available: that part is not run");
    }
    set
}

fn pg_url() -> Option<String> {
    let on = std::env::var("BENCH_PG_TESTS").is_ok_and(|v| v == "1");
    if !have("BENCH_PG_TESTS=1 (scripts/postgres-ci-setup.sh)", on) {
        return None;
    }
    Some(std::env::var("BENCH_PG_URL").expect("BENCH_PG_TESTS=1 needs BENCH_PG_URL"))
}

/// A fresh schema `name` in the test database; returns an admin client and the store URL
/// whose tables live there.
fn pg_schema(url: &str, name: &str) -> (postgres::Client, String) {
    let mut admin = postgres::Client::connect(url, postgres::NoTls)
        .unwrap_or_else(|e| panic!("BENCH_PG_TESTS=1 but {url} does not answer: {e}"));
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name};"
        ))
        .unwrap();
    let sep = if url.contains('?') { '&' } else { '?' };
    (
        admin,
        format!("{url}{sep}options=-c%20search_path%3D{name}"),
    )
}

/// Every file under `dir`, as text.
fn all_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                out.push((p, String::from_utf8_lossy(&bytes).into_owned()));
            }
        }
    }
    out
}

/// A matrix of one command-workload cell (the deterministic fake worker), 2 repeats.
fn command_matrix(dir: &Path, extra: &str) -> PathBuf {
    let worker = std::fs::canonicalize("tests/fixtures/fake_worker.sh").unwrap();
    write(
        dir,
        "m.yaml",
        &format!(
            "name: r2\naxes:\n  model: [small]\ndefaults:\n  steps: 5\n  warmup: 1\n  repeats: 2\n  timeout: 60s\n  retries: 0\n  workload:\n    kind: command\n    argv: [sh, \"{}\", {extra}]\n",
            worker.display()
        ),
    )
}

fn matrix_cmd(matrix: &Path, dir: &Path, id: &str) -> Command {
    let mut c = bench();
    c.arg("matrix")
        .arg(matrix)
        .args(["--gpus", "0", "--no-progress", "--run-id", id])
        .arg("--results-dir")
        .arg(dir.join("results"))
        .arg("--baselines")
        .arg(dir.join("baselines"));
    c
}

// ------------------------------------------------------------- 1. forged measurements

/// A Hugging Face Trainer cell on bench's llama-tiny preset whose "python" is `fake`: the
/// driver's lines are whatever the fake prints.
fn hf_matrix(dir: &Path, fake: &Path) -> PathBuf {
    write(
        dir,
        "hf.yaml",
        &format!(
            "name: forged\naxes:\n  model: [llama-tiny]\n  dtype: [fp32]\n  gpus: [1]\n  parallel: [single]\ndefaults:\n  steps: 4\n  warmup: 1\n  seq_len: 64\n  micro_batch: 2\n  timeout: 60s\n  retries: 0\n  workload: {{kind: hf, python: \"{}\"}}\n",
            fake.display()
        ),
    )
}

const DRIVER: &str = r#"echo 'bench-framework: {"name": "transformers", "version": "4.57.1", "libraries": {}, "device": "cpu", "world_size": 1}'"#;

/// The fake driver's lines for step `i` taking `time` seconds with `loss`.
fn hf_step(i: u32, time: &str, loss: &str) -> String {
    format!(
        "echo '[bench-hf] step: {i} time: {time} tokens: 128 memory: -1'\necho \"{{'loss': {loss}, 'grad_norm': 1.0}}\"\n"
    )
}

#[test]
fn a_framework_log_cannot_forge_or_fake_a_measurement() {
    let tmp = tempfile::tempdir().unwrap();
    // Lines that read as bench's own events, plain and behind an ESC or a BEL byte, between
    // real steps of 0.05 s: only the adapter's parser may speak for the cell.
    let forged = r#"printf '{"event":"step","step":%d,"step_time_s":0.000001,"tokens":128000000,"loss":1.0}\n' 11
printf '\033{"event":"step","step":%d,"step_time_s":0.000001,"tokens":128000000,"loss":1.0}\n' 12
printf '\007{"event":"summary","tokens_per_s":128000000}\n'
printf '  \033[31m{"event":"error","kind":"oom","message":"forged"}\033[0m\n'
"#;
    let mut body = format!("{DRIVER}\n");
    for i in 1..=4 {
        body.push_str(&hf_step(i, "0.05", "6.1"));
        body.push_str(forged);
    }
    let fake = script(tmp.path(), "fake.sh", &body);
    let out = matrix_cmd(&hf_matrix(tmp.path(), &fake), tmp.path(), "f")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let r = RunResults::load(&tmp.path().join("results/f")).unwrap();
    let c = &r.cells[0];
    assert_eq!(c.outcome, Outcome::Passed, "{}", text(&out));
    assert_eq!(c.repeats[0].steps.len(), 4);
    assert!(c.repeats[0].steps.iter().all(|s| s.tokens == 128));
    let tps = c.metrics["tokens_per_s"].value;
    assert!((tps - 128.0 / 0.05).abs() < 1.0, "{tps} tokens/s");
    let log = std::fs::read_to_string(
        tmp.path()
            .join("results/f/logs")
            .join(format!("{}.r0.log", c.id)),
    )
    .unwrap();
    assert!(log.contains(r#"framework: {"event":"step""#), "{log}");
    assert!(log.contains(r#"framework: {"event":"summary""#), "{log}");

    // Figures no run can have measured fail the cell with the line.
    for (case, steps, why) in [
        (
            "1.3e302 tokens/s",
            [("0.05", "6.1"), ("9.8e-301", "6.1")],
            "step 2 took 9.8e-301 s",
        ),
        (
            "4e-6 tokens/s",
            [("0.05", "6.1"), ("32000000", "6.1")],
            "longer than the",
        ),
        (
            "a negative cross-entropy",
            [("0.05", "6.1"), ("0.05", "-1.5")],
            "cross-entropy loss of -1.5",
        ),
    ] {
        let dir = tmp.path().join(case.replace(' ', "-"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut body = format!("{DRIVER}\n");
        for (i, (t, l)) in steps.iter().enumerate() {
            body.push_str(&hf_step(i as u32 + 1, t, l));
        }
        body.push_str(&hf_step(3, "0.05", "6.1"));
        body.push_str(&hf_step(4, "0.05", "6.1"));
        let fake = script(&dir, "fake.sh", &body);
        let out = matrix_cmd(&hf_matrix(&dir, &fake), &dir, "x")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{case}: {}", text(&out));
        let r = RunResults::load(&dir.join("results/x")).unwrap();
        match &r.cells[0].outcome {
            Outcome::Failed { reason } => {
                assert!(reason.contains(why), "{case}: {reason}");
                // The log line that completed the step (its loss line), by number.
                assert!(reason.contains("hf log line 5:"), "{case}: {reason}");
            }
            other => panic!("{case}: {other:?}\n{}", text(&out)),
        }
        assert!(r.cells[0].metrics.is_empty(), "{case}");
    }
}

// ---------------------------------------------------------------- 2. unbounded memory

/// The anonymous resident memory (RssAnon: the heap, not the mapped libraries) in KiB of
/// the live process whose command line holds every one of `needles`, once there is one.
fn anon_rss_kib(needles: &[&str]) -> Option<u64> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        if !needles.iter().all(|n| cmd.contains(n)) {
            return None;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn a_gigantic_framework_line_and_a_device_for_a_matrix_cost_bounded_memory() {
    // A device, a FIFO-like endless file and a folder are refused at once, not read.
    for m in ["/dev/zero", "/dev/urandom", "/tmp"] {
        let t = Instant::now();
        let out = bench().args(["matrix", m, "--dry-run"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{m}: {}", text(&out));
        assert!(
            text(&out).contains(&format!("{m}: cannot read matrix file")),
            "{}",
            text(&out)
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{m}: {:?}",
            t.elapsed()
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big.yaml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(5 << 20).unwrap();
    let out = bench()
        .arg("matrix")
        .arg(&big)
        .arg("--dry-run")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("4 MiB"), "{}", text(&out));

    // A framework printing 256 MiB in one line (once told to), then staying alive while
    // we look.
    let go = tmp.path().join("go");
    let mut body = format!(
        "{DRIVER}\nwhile [ ! -e '{}' ]; do sleep 0.05; done\nhead -c 268435456 /dev/zero | tr '\\000' x\necho\nsleep 2\n",
        go.display()
    );
    for i in 1..=4 {
        body.push_str(&hf_step(i, "0.05", "6.1"));
    }
    let fake = script(tmp.path(), "fake-big.sh", &body);
    let mut child = matrix_cmd(&hf_matrix(tmp.path(), &fake), tmp.path(), "big")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log_path = tmp
        .path()
        .join("results/big/logs/llama-tiny.fp32.1gpu.single.r0.log");
    // Our cell's `bench adapt --cell {...}` (its cell names the fake's path), once it has
    // started the framework and echoed its first line.
    let fake_path = fake.display().to_string();
    let needles = ["adapt\0--cell\0", fake_path.as_str()];
    let deadline = Instant::now() + Duration::from_secs(120);
    let before = loop {
        let started =
            std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains("bench-framework:"));
        if let Some(kib) = anon_rss_kib(&needles).filter(|_| started) {
            break kib;
        }
        assert!(
            Instant::now() < deadline,
            "bench adapt never started the framework"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    std::fs::write(&go, "").unwrap();
    let mut peak = before;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        if let Some(kib) = anon_rss_kib(&needles) {
            peak = peak.max(kib);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    // Before, the line took 3.5 times its size (a 1 GB line, 3.5 GB); now a line costs at
    // most its 1 MiB cut and the pipe's buffers.
    assert!(
        peak - before < 32 * 1024,
        "bench adapt grew from {} to {} MiB",
        before / 1024,
        peak / 1024
    );
    let log = std::fs::read_to_string(
        tmp.path()
            .join("results/big/logs/llama-tiny.fp32.1gpu.single.r0.log"),
    )
    .unwrap();
    assert!(log.contains("[bench: line cut at 1048576 bytes]"));
    assert!(log.len() < 3 << 20, "{} bytes of log", log.len());
}

// --------------------------------------------------------------------------- 3. secrets

#[test]
fn credentials_never_reach_a_file_a_report_or_a_message() {
    let Some(url) = pg_url() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (_admin, store) = pg_schema(&url, "t_r2_secret");
    // The server trusts the test's connections, so any password connects: each must still
    // stay out of everything bench writes.
    let with_secrets = store.replacen(
        "postgres://postgres@",
        "postgres://postgres:Us3rInfoS3cret@",
        1,
    ) + "&password=Qu3ryS3cret";
    assert_ne!(
        with_secrets, store,
        "BENCH_PG_URL is postgres://postgres@..."
    );
    let upper = with_secrets.replacen("postgres://", "POSTGRES://", 1);
    let matrix = command_matrix(tmp.path(), "paced, \"0.5\"");
    let mut seen = String::new();
    for (id, location) in [("n1", &with_secrets), ("n2", &upper)] {
        let out = matrix_cmd(&matrix, tmp.path(), id)
            .current_dir(tmp.path())
            .args(["--history", location])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        seen.push_str(&text(&out));
    }
    let out = bench()
        .current_dir(tmp.path())
        .args(["history", "small", "--history", &upper])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("small on "), "{}", text(&out));
    seen.push_str(&text(&out));
    // Messages of the driver and of bench: a refused connection, an option the driver does
    // not know, another scheme.
    for (location, want) in [
        (
            "postgres://ci:Cl0sedS3cret@127.0.0.1:1/db?password=Cl0sedS3cret2".to_string(),
            "127.0.0.1:1/db?password=***",
        ),
        (
            format!("{with_secrets}&bogus_option=1"),
            "cannot open the history store",
        ),
        (
            "https://ci:HttpS3cret@example.invalid/h?password=HttpS3cret2".to_string(),
            "a URL of scheme `https`",
        ),
        (
            "host=db user=ci password=KwS3cret dbname=bench".to_string(),
            "keyword/value connection string",
        ),
    ] {
        let out = bench()
            .current_dir(tmp.path())
            .args(["history", "import", "results/n1", "--history", &location])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{location}: {}", text(&out));
        assert!(text(&out).contains(want), "{location}: {}", text(&out));
        seen.push_str(&text(&out));
    }
    for (path, body) in all_files(tmp.path()) {
        seen.push_str(&format!("\n{}:\n{body}", path.display()));
    }
    for secret in [
        "Us3rInfoS3cret",
        "Qu3ryS3cret",
        "Cl0sedS3cret",
        "HttpS3cret",
        "KwS3cret",
    ] {
        assert!(!seen.contains(secret), "{secret} in:\n{seen}");
    }
    // The upper-case scheme reached the server: no file was made of the URL.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for n in &names {
        assert!(
            ["baselines", "m.yaml", "results"].contains(&n.as_str()),
            "{names:?}"
        );
    }
    // Where the store is named, it is named without its secrets.
    let history = std::fs::read_to_string(tmp.path().join("results/n1/history.json")).unwrap();
    assert!(history.contains(":***@"), "{history}");
}

// ------------------------------------------------------------------------- 4. the store

/// `bench history import RUN --history LOCATION`, which must succeed.
fn import(run: &str, location: impl AsRef<std::ffi::OsStr>) {
    let out = bench()
        .args(["history", "import", run, "--history"])
        .arg(location)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// A SQLite store with one run, then its metrics table's first page damaged (its cell
/// count made nonsense) so that it still opens but SQLite's quick_check fails.
fn damaged_store(dir: &Path) -> PathBuf {
    let db = dir.join("damaged.sqlite");
    import("tests/fixtures/runs/cpu-ok", &db);
    let (page, root): (i64, i64) = {
        let c = rusqlite::Connection::open(&db).unwrap();
        let page = c.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        let root = c
            .query_row(
                "SELECT rootpage FROM sqlite_master WHERE name = 'bench_metrics'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (page, root)
    };
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    f.seek(SeekFrom::Start(((root - 1) * page + 3) as u64))
        .unwrap();
    f.write_all(&[0x00, 0x63]).unwrap();
    db
}

#[test]
fn a_store_bench_cannot_trust_is_refused_naming_it_and_never_made_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cell = "gpt2-tiny.fp32.1gpu.single.base";

    // A mistyped path for the commands that read: refused, and not created.
    for args in [
        vec!["history", cell],
        vec!["baseline", "accept", cell, "--reason", "x"],
    ] {
        let typo = dir.join("typo.sqlite");
        let out = bench()
            .args(&args)
            .arg("--history")
            .arg(&typo)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("typo.sqlite"), "{}", text(&out));
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
    }

    // Not SQLite, truncated, damaged, from a newer bench, a row that does not read.
    let not_sqlite = write(dir, "text.sqlite", "hello, not a database\n");
    let good = dir.join("good.sqlite");
    import("tests/fixtures/runs/cpu-ok", &good);
    let truncated = dir.join("truncated.sqlite");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let damaged = damaged_store(dir);
    let newer = dir.join("newer.sqlite");
    std::fs::copy(&good, &newer).unwrap();
    rusqlite::Connection::open(&newer)
        .unwrap()
        .execute_batch("INSERT INTO bench_schema_migrations VALUES (99, 'future', 'x')")
        .unwrap();
    let bad_row = dir.join("bad-row.sqlite");
    std::fs::copy(&good, &bad_row).unwrap();
    rusqlite::Connection::open(&bad_row)
        .unwrap()
        .execute_batch("UPDATE bench_metrics SET samples = '[1, oops'")
        .unwrap();
    for (store, why) in [
        (&not_sqlite, "file is not a database"),
        (&truncated, "malformed"),
        (&damaged, "the store is damaged (SQLite quick_check"),
        (&newer, "upgrade bench"),
        (&bad_row, "bench_metrics.samples"),
    ] {
        let location = store.to_str().unwrap();
        match bench::history::check(location) {
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(location) && msg.contains(why), "{msg}");
            }
            Ok(()) => panic!("{location} passed the check"),
        }
        let out = bench()
            .args(["history", cell, "--history", location])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{location}: {}", text(&out));
        assert!(text(&out).contains(location), "{}", text(&out));
    }
    assert!(bench::history::check(good.to_str().unwrap()).is_ok());

    // The same through the real PostgreSQL server: a row whose JSON does not read.
    let Some(url) = pg_url() else { return };
    let (mut admin, store) = pg_schema(&url, "t_r2_store");
    import("tests/fixtures/runs/cpu-ok", &store);
    assert!(bench::history::check(&store).is_ok());
    admin
        .batch_execute("UPDATE t_r2_store.bench_cells SET loss_curve = 'nope'")
        .unwrap();
    let e = bench::history::check(&store).unwrap_err().to_string();
    assert!(e.contains("bench_cells.loss_curve"), "{e}");
    let out = bench()
        .args(["history", cell, "--history", &store])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(
            "run 20261122T090000Z cell gpt2-tiny.fp32.1gpu.single.base: a row bench cannot read"
        ),
        "{}",
        text(&out)
    );
}

/// `bench matrix --history DAMAGED` exits 2 naming the store before the first cell runs.
/// This needs `bench matrix` to call `history::check` before the first cell (it opens the
/// store there, which finds a damaged file only when a migration fails on it).
#[test]
fn bench_matrix_refuses_a_damaged_store_before_the_first_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let damaged = damaged_store(dir);
    // The worker leaves a mark if it runs.
    let mark = dir.join("ran");
    let matrix = command_matrix(dir, &format!("args, \"{}\", x", mark.display()));
    let out = matrix_cmd(&matrix, dir, "m")
        .arg("--history")
        .arg(&damaged)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(damaged.to_str().unwrap()),
        "{}",
        text(&out)
    );
    assert!(!mark.exists(), "a cell ran before the store was checked");
}

// ---------------------------------------------------------------------------- 5. hangs

/// A server that accepts connections and never answers; the receiver says when one came.
fn silent_server() -> (String, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            let mut s2 = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(s2.read(&mut buf), Ok(n) if n > 0) {}
            });
            held.push(s);
            let _ = tx.send(());
        }
    });
    (format!("postgres://ci@{addr}/bench"), rx)
}

/// Sends `sig` to `child` once `ready` returns, and returns the exit code and how long the
/// child took to exit after the signal.
fn signal_when(
    mut child: Child,
    ready: impl FnOnce(),
    sig: nix::sys::signal::Signal,
) -> (Option<i32>, Duration) {
    ready();
    // Well inside the blocking call.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the signal"
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_store_that_never_answers_gives_up_and_ctrl_c_exits_130_at_once() {
    use nix::sys::signal::Signal;
    let tmp = tempfile::tempdir().unwrap();
    let matrix = command_matrix(tmp.path(), "paced, \"0.1\"");
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        let (url, accepted) = silent_server();
        let import = bench()
            .args([
                "history",
                "import",
                "tests/fixtures/runs/cpu-ok",
                "--history",
                &url,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (code, took) = signal_when(import, || accepted.recv().unwrap(), sig);
        assert_eq!(code, Some(130), "bench history import, {sig}");
        assert!(
            took < Duration::from_secs(1),
            "{sig}: exited {took:?} after it"
        );
        // bench matrix opens its store before the first cell.
        let (url, accepted) = silent_server();
        let run = matrix_cmd(&matrix, tmp.path(), &format!("{sig}"))
            .args(["--history", &url])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (code, took) = signal_when(run, || accepted.recv().unwrap(), sig);
        assert_eq!(code, Some(130), "bench matrix, {sig}");
        assert!(
            took < Duration::from_secs(1),
            "{sig}: exited {took:?} after it"
        );
    }
    // Without a signal it gives up at connect_timeout (10 s unless the URL says).
    let (url, _accepted) = silent_server();
    let t = Instant::now();
    let out = bench()
        .args([
            "history",
            "import",
            "tests/fixtures/runs/cpu-ok",
            "--history",
        ])
        .arg(format!("{url}?connect_timeout=2"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("no answer from the server within 2 s"),
        "{}",
        text(&out)
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());

    // The real server, answering but blocked: another session holds the table bench must
    // write (a nightly's import waiting on a migration, say).
    let Some(pg) = pg_url() else { return };
    let (mut admin, store) = pg_schema(&pg, "t_r2_hang");
    import("tests/fixtures/runs/cpu-ok", &store);
    let mut lock = admin.transaction().unwrap();
    lock.batch_execute("LOCK TABLE t_r2_hang.bench_runs IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let mut watcher = postgres::Client::connect(&pg, postgres::NoTls).unwrap();
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // Each import names itself, so that only its own wait is seen.
        let app = format!("r2_hang_{}", sig.as_str().to_ascii_lowercase());
        let import = bench()
            .args([
                "history",
                "import",
                "tests/fixtures/runs/cpu-slow",
                "--history",
            ])
            .arg(format!("{store}&application_name={app}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let waiting = || {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                let n: i64 = watcher
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                        &[&app],
                    )
                    .unwrap()
                    .get(0);
                if n > 0 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("bench never waited on the lock");
        };
        let (code, took) = signal_when(import, waiting, sig);
        assert_eq!(code, Some(130), "blocked import, {sig}");
        assert!(
            took < Duration::from_secs(1),
            "{sig}: exited {took:?} after it"
        );
    }
    lock.rollback().unwrap();
}

// ------------------------------------------------------------ 6. injection into reports

fn node(script: &str, args: &[PathBuf]) -> String {
    let out = Command::new("node")
        .arg(script)
        .args(args)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn names_and_reasons_stay_text_in_every_report() {
    // The hand-made fixture with every status, its names and reasons made hostile: code
    // spans closed by backticks, raw HTML, mentions, links, JavaScript's own property names.
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("tests/fixtures/runs/mixed/results.json").unwrap(),
    )
    .unwrap();
    let evil = "x` <img src=x onerror=alert(1)> @octocat [click](https://evil.example) `";
    v["matrix_name"] = "{{APP_JS}} nightly` <img src=x> @org/team".into();
    v["environment"]["gpu_model"] = "NVIDIA H100 <b>x</b> @octocat".into();
    // Axes named as JavaScript's own properties (the page threw a TypeError on the cells
    // that lack them: those only the baseline has), and a framework axis in their place.
    for list in ["cells", "dropped"] {
        for c in v[list].as_array_mut().unwrap() {
            let values = c["values"].as_object_mut().unwrap();
            for (from, to) in [
                ("dtype", "framework"),
                ("parallel", "constructor"),
                ("features", "__proto__"),
            ] {
                if let Some(x) = values.remove(from) {
                    values.insert(to.into(), x);
                }
            }
        }
    }
    let c = &mut v["cells"][0];
    c["id"] = "gpt2.`<img src=x onerror=alert(1)>`.@octocat".into();
    c["values"]["model"] = evil.into();
    c["values"]["framework"] = "hf` <img src=x> @octocat".into();
    let mfu = c["metrics"]["mfu"].clone();
    for name in ["constructor", "__proto__", "toString"] {
        c["metrics"][name] = mfu.clone();
    }
    c["repeats"][0]["summary"]["framework"] = serde_json::json!({
        "name": "<img src=x onerror=alert(1)>", "version": "@team",
        "config_file": "x", "config_sha256": "0", "method": "<b>m</b> @octocat"
    });
    v["cells"][5]["reason"] = format!("OOM {evil}").into();
    v["dropped"][0]["reason"] = "<script>alert(1)</script> @team".into();
    v["dropped"][0]["by"] = "rules[0] (@octocat `x` <i>)".into();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("results.json"), v.to_string()).unwrap();
    let out = bench()
        .arg("report")
        .arg(&run)
        .args(["--baselines", "tests/fixtures/baselines"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let summary = std::fs::read_to_string(run.join("summary.md")).unwrap();
    let frameworks = std::fs::read_to_string(run.join("frameworks.md")).unwrap();
    for md in [&summary, &frameworks] {
        // Every @ is followed by a zero-width joiner or inside a code span.
        assert!(
            !md.contains("<img src=x onerror=alert(1)> @octocat [click]"),
            "{md}"
        );
    }
    assert!(
        summary.contains("``gpt2.`<img src=x onerror=alert(1)>`.@octocat``"),
        "{summary}"
    );
    // Parentheses are escaped too since issue 42 (a `[text](url)` in foreign text is never
    // a link): the source reads `alert\(1\)`, the rendered page `alert(1)`.
    assert!(
        frameworks.contains("&lt;img src=x onerror=alert\\(1\\)&gt; @\u{200D}team"),
        "{frameworks}"
    );

    if !have(
        "BENCH_CHROMIUM (and npm ci)",
        std::env::var_os("BENCH_CHROMIUM").is_some() && Path::new("node_modules/marked").is_dir(),
    ) {
        return;
    }
    // As GitHub renders them: no element of the values' own, no live mention.
    let seen = node(
        "tests/browser/check-markdown.mjs",
        &[run.join("summary.md"), run.join("frameworks.md")],
    );
    assert_eq!(seen.lines().count(), 2, "{seen}");
    // The page draws, filters and sorts with these names (it threw a TypeError).
    let seen = node("tests/browser/check-report.mjs", &[run.join("report.html")]);
    assert!(seen.contains(r#""problems":[]"#), "{seen}");
}

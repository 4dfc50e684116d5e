//! `bench completions SHELL` and `bench man` come from the clap definition itself: every
//! shell's script names the subcommands, bash's passes `bash -n` and completes a subcommand
//! when sourced, and the manual page is roff that `man` renders (where man is installed).

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_shell_gets_a_script_naming_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = bench(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(o.stdout).unwrap();
        for sub in ["matrix", "report", "history", "bisect", "site", "ingest"] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    let o = bench(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2), "an unknown shell is bad input");
}

#[test]
fn the_bash_script_parses_and_completes_a_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.bash");
    std::fs::write(&path, bench(&["completions", "bash"]).stdout).unwrap();
    let o = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // What bash does on `bench ma<TAB>`: the completion function fills COMPREPLY.
    let probe = format!(
        "source '{}'; COMP_WORDS=(bench ma); COMP_CWORD=1; COMP_LINE='bench ma'; COMP_POINT=8; _bench bench ma bench; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display()
    );
    let o = Command::new("bash").args(["-c", &probe]).output().unwrap();
    let words = String::from_utf8_lossy(&o.stdout);
    assert!(
        words.lines().any(|w| w == "matrix") && words.lines().any(|w| w == "man"),
        "{words}{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn the_manual_page_is_roff_that_man_renders() {
    let o = bench(&["man"]);
    assert_eq!(o.status.code(), Some(0));
    let page = String::from_utf8(o.stdout).unwrap();
    assert!(page.contains(".TH bench 1"), "{page}");
    assert!(
        page.contains(".SH NAME") && page.contains("matrix"),
        "{page}"
    );
    let has_man = Command::new("man")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_man {
        eprintln!("no man(1) here: the roff is checked, not its rendering");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.1");
    std::fs::write(&path, &page).unwrap();
    let o = Command::new("man")
        .arg("-l")
        .arg(&path)
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && shown.contains("LLM-training"),
        "{shown}"
    );
}

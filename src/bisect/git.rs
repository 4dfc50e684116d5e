//! The git side of a bisection: the repository the command starts in, revisions resolved
//! to commits, the first-parent range between good and bad, and the detached worktree the
//! probes run in (removed when dropped, so every way out of the command removes it).
//!
//! Everything goes through the `git` program (as `env::git_state` does): the repositories
//! bench bisects are the user's, with their own configuration, hooks and worktrees.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::error::BisectError;
use crate::proc::{Tool, ToolOutput, GIT_TIMEOUT, GIT_WORKTREE_TIMEOUT};

/// A commit with what the reports show of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Commit {
    pub sha: String,
    pub subject: String,
    /// `Name <email>`.
    pub author: String,
}

impl Commit {
    /// The abbreviation the tables show (10 hex digits: unambiguous in any real repository).
    pub(crate) fn short(&self) -> &str {
        &self.sha[..self.sha.len().min(10)]
    }
}

/// The `git log` format of [`Commit`]: fields separated by NUL, which no subject holds.
const FORMAT: &str = "--format=%H%x00%s%x00%an <%ae>";

fn parse_commit(line: &str) -> Option<Commit> {
    let mut f = line.splitn(3, '\0');
    let (sha, subject, author) = (f.next()?, f.next()?, f.next()?);
    // A subject and an author are text someone else wrote: terminal escapes and control
    // characters go here, once, before any output (the terminal, a log line, a report)
    // shows them.
    let text = |s: &str| crate::sanitize::clean(s).replace(['\n', '\t'], " ");
    (!sha.is_empty()).then(|| Commit {
        sha: sha.to_string(),
        subject: text(subject),
        author: text(author),
    })
}

/// `git ARGS` in `dir` through the bounded runner (`crate::proc`): in a process group of
/// its own, so Ctrl-C on the terminal reaches bench only, which lets a checkout finish (a
/// git killed half-way leaves `index.lock` behind) and stops at the next step; within
/// `limit` (then SIGTERM, which git answers by removing its lock, and SIGKILL), with a
/// bound on its output; dying with bench.
fn git_run(dir: &Path, args: &[&str], limit: Duration) -> Result<ToolOutput, String> {
    Tool::git()
        .current_dir(dir)
        .args(args)
        .timeout(limit)
        .stderr()
        .run(None)
        .map_err(|e| format!("cannot run git: {e}"))
}

/// Runs `git ARGS` in `dir` (a query: [`GIT_TIMEOUT`]): its stdout (trimmed) on success,
/// else its stderr.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    git_limited(dir, args, GIT_TIMEOUT)
}

/// [`git`] with the time limit `limit` (a call that writes a work tree).
fn git_limited(dir: &Path, args: &[&str], limit: Duration) -> Result<String, String> {
    let out = git_run(dir, args, limit)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(if err.is_empty() {
            format!("git {}", out.status)
        } else {
            err
        })
    }
}

/// The repository a bisection walks.
#[derive(Debug, Clone)]
pub(crate) struct Repo {
    /// The top of its work tree; `--matrix` is relative to it.
    pub root: PathBuf,
    /// Its `.git` directory (shared by all its worktrees): the default work folder lives
    /// there, out of the work tree and so out of `git status`.
    pub common_dir: PathBuf,
}

impl Repo {
    /// The repository `dir` is in.
    pub(crate) fn discover(dir: &Path) -> Result<Repo, BisectError> {
        let not_a_repo = |message: String| BisectError::NotARepo {
            dir: dir.display().to_string(),
            message,
        };
        let root = git(dir, &["rev-parse", "--show-toplevel"]).map_err(not_a_repo)?;
        let common = git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .map_err(not_a_repo)?;
        Ok(Repo {
            root: PathBuf::from(root),
            common_dir: PathBuf::from(common),
        })
    }

    fn git(&self, args: &[&str]) -> Result<String, BisectError> {
        git(&self.root, args).map_err(|message| BisectError::Git {
            args: args.join(" "),
            message,
        })
    }

    /// The commit `rev` names (`flag` says which argument it was, for the message).
    pub(crate) fn commit(&self, rev: &str, flag: &str) -> Result<Commit, BisectError> {
        let unknown = || BisectError::UnknownRev {
            flag: flag.to_string(),
            rev: rev.to_string(),
            repo: self.root.display().to_string(),
        };
        // A revision that starts with `-` would be read as an option of rev-parse.
        if rev.is_empty() || rev.starts_with('-') {
            return Err(unknown());
        }
        let spec = format!("{rev}^{{commit}}");
        let sha =
            git(&self.root, &["rev-parse", "--verify", "--quiet", &spec]).map_err(|_| unknown())?;
        let line = self.git(&["log", "-1", FORMAT, &sha])?;
        parse_commit(&line).ok_or_else(unknown)
    }

    /// Whether `a` is an ancestor of `b` (or `b` itself).
    pub(crate) fn is_ancestor(&self, a: &Commit, b: &Commit) -> Result<bool, BisectError> {
        let st = git_run(
            &self.root,
            &["merge-base", "--is-ancestor", &a.sha, &b.sha],
            GIT_TIMEOUT,
        )
        .map_err(|message| BisectError::Git {
            args: "merge-base --is-ancestor".into(),
            message,
        })?
        .status;
        match st.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(BisectError::Git {
                args: format!("merge-base --is-ancestor {} {}", a.sha, b.sha),
                message: format!("exited with {st}"),
            }),
        }
    }

    /// The commits of `good..bad` on bad's first-parent line that descend from good, oldest
    /// first (bad last). A merge on that line stands for the whole branch it merged: the
    /// bisection can end at a merge, never inside the merged branch.
    pub(crate) fn range(&self, good: &Commit, bad: &Commit) -> Result<Vec<Commit>, BisectError> {
        let spec = format!("{}..{}", good.sha, bad.sha);
        let out = self.git(&[
            "log",
            "--first-parent",
            "--ancestry-path",
            "--reverse",
            FORMAT,
            &spec,
        ])?;
        Ok(out.lines().filter_map(parse_commit).collect())
    }

    /// A detached worktree at `at`, in a new temporary folder (a temporary folder rather
    /// than one inside the repository, where tools that look upwards for their project
    /// root, as cargo looks for a workspace, would find the repository's own).
    pub(crate) fn worktree(&self, at: &Commit) -> Result<Worktree, BisectError> {
        let dir = tempfile::Builder::new()
            .prefix("bench-bisect-")
            .tempdir()
            .map_err(|e| BisectError::Io {
                path: std::env::temp_dir().display().to_string(),
                message: format!("cannot create the worktree's folder: {e}"),
            })?;
        let path = dir.path().join("worktree");
        let shown = path.display().to_string();
        let args = ["worktree", "add", "--quiet", "--detach", &shown, &at.sha];
        git_limited(&self.root, &args, GIT_WORKTREE_TIMEOUT).map_err(|message| {
            BisectError::Git {
                args: args.join(" "),
                message,
            }
        })?;
        Ok(Worktree {
            repo_root: self.root.clone(),
            common_dir: self.common_dir.clone(),
            path,
            head: at.sha.clone(),
            _dir: dir,
        })
    }
}

/// A detached worktree of the repository; dropping it removes it (`git worktree remove`).
#[derive(Debug)]
pub(crate) struct Worktree {
    repo_root: PathBuf,
    /// The repository's git directory, where builds are kept between jobs.
    pub common_dir: PathBuf,
    /// Where the probed commit is checked out.
    pub path: PathBuf,
    /// The commit checked out now.
    head: String,
    /// Owns the folder, which goes when the worktree does.
    _dir: tempfile::TempDir,
}

impl Worktree {
    /// Checks out `sha` (force: the previous probe's setup may have changed tracked files),
    /// then removes untracked files that are not ignored, so nothing of the previous
    /// commit's tree is left; ignored files (build caches) stay, so the next build is
    /// incremental. Returns whether the checkout changed.
    pub(crate) fn checkout(&mut self, sha: &str) -> Result<bool, BisectError> {
        if self.head == sha {
            return Ok(false);
        }
        let run = |args: &[&str]| {
            git_limited(&self.path, args, GIT_WORKTREE_TIMEOUT).map_err(|message| {
                BisectError::Git {
                    args: args.join(" "),
                    message,
                }
            })
        };
        run(&["checkout", "--quiet", "--force", "--detach", sha])?;
        run(&["clean", "-ffdq"])?;
        self.head = sha.to_string();
        Ok(true)
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        let shown = self.path.display().to_string();
        if let Err(e) = git_limited(
            &self.repo_root,
            &["worktree", "remove", "--force", &shown],
            GIT_WORKTREE_TIMEOUT,
        ) {
            eprintln!("warning: git worktree remove {shown}: {e}");
        }
        // The folder is gone either way (TempDir); prune drops git's record of it.
        let _ = git(&self.repo_root, &["worktree", "prune"]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_parse_into_commits() {
        let c = parse_commit("abc123\0fix: the thing\0Ann <ann@example.com>").unwrap();
        assert_eq!(c.sha, "abc123");
        assert_eq!(c.subject, "fix: the thing");
        assert_eq!(c.author, "Ann <ann@example.com>");
        assert_eq!(c.short(), "abc123");
        assert!(parse_commit("").is_none());
        assert!(parse_commit("abc").is_none());
    }
}

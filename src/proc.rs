//! Child processes: the one way bench starts a program, bounded in time and output, so
//! that no tool (a hung driver's `nvidia-smi`, a flooding one, a `git` waiting on a lock,
//! a `--setup` that ignores signals) can hang bench, exhaust its memory or outlive it.
//!
//! Every child bench starts (through [`command`]):
//! - runs in a process group of its own, so the terminal's Ctrl-C reaches bench only
//!   (which then stops its children itself) and the whole tree a child starts can be
//!   signalled at once;
//! - gets a parent-death signal (SIGKILL), so it dies with bench even when bench is killed
//!   with SIGKILL. Where util-linux's `setpriv` (2.33 or later) is installed the child is
//!   started through it (`setpriv --pdeathsig KILL -- /bin/sh -c '<check bench is the
//!   parent>; exec "$@"'`, the same process becoming the program), which spares a fork of
//!   bench (which maps libtorch: about 30 ms per child on a loaded machine); otherwise the
//!   signal is set between fork and exec;
//! - has its process group written down by a watchdog ([`watch`]): a small shell that
//!   bench starts once, which reads the groups of its live children on a pipe and, when the
//!   pipe closes (bench exited or was killed), kills every group still listed. The
//!   parent-death signal reaches the child only, not what it started in its group (a
//!   torchrun's ranks); the watchdog reaches those.
//!
//! A one-shot tool ([`Tool`]) further gets a time limit (at which its group gets SIGTERM,
//! then SIGKILL after a grace period), a bound on the stdout it may print (read in chunks;
//! past the bound the group is killed, never more is held) and on the stderr that is kept
//! (the rest is read and dropped), and an optional stop flag. When it exits, whatever it
//! left in its group is killed with SIGKILL (its zombie is reaped only after that, so the
//! group id cannot have been reused by then). Each way a call can fail is a
//! [`ToolError`] naming the tool and the limit it hit. The limits in force are listed in
//! docs/runner.md ("Limits on external tools").

use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The time limit of a one-shot tool (`nvidia-smi`, `rocm-smi`, `amd-smi`).
pub(crate) const TOOL_TIMEOUT: Duration = Duration::from_secs(10);
/// The most stdout a one-shot tool may print (8 MiB).
pub(crate) const MAX_OUTPUT: u64 = 8 << 20;
/// The stderr of a tool that is kept (for messages); the rest is read and dropped.
pub(crate) const MAX_STDERR: usize = 64 << 10;
/// Between SIGTERM and SIGKILL of a tool's group at its time limit.
pub(crate) const TOOL_GRACE: Duration = Duration::from_secs(1);
/// The time limit of a `git` query (rev-parse, log, status, merge-base): generous for a
/// large repository on a slow disk, yet a git waiting on a lock or a prompt ends.
pub(crate) const GIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The time limit of a `git` call that writes a work tree (`worktree add`, `checkout`,
/// `clean`, `worktree remove`), which a large repository makes slow.
pub(crate) const GIT_WORKTREE_TIMEOUT: Duration = Duration::from_secs(600);
/// The time limit of a Slurm client call (`sbatch`, `squeue`, `scontrol`, `scancel`,
/// `sinfo`): a busy controller answers within seconds; a dead one must not hang the run.
pub(crate) const SLURM_TIMEOUT: Duration = Duration::from_secs(120);
/// The most stdout a `git` call may print (64 MiB: `git log` of a long range).
pub(crate) const GIT_MAX_OUTPUT: u64 = 64 << 20;
/// How long the output of a tool that exited is still read (a child it left may hold the
/// pipe), before that child is killed.
const DRAIN: Duration = Duration::from_secs(1);
/// How often a running tool is looked at.
const POLL: Duration = Duration::from_millis(5);

/// Why a call of an external tool gave no answer. Each names the tool (its program).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ToolError {
    /// The program is not installed (not on PATH).
    #[error("`{tool}` is not installed")]
    Missing { tool: String },
    #[error("`{tool}` could not be started: {message}")]
    Spawn { tool: String, message: String },
    /// It ran past its time limit; its process group was killed.
    #[error("`{tool}` did not answer within {} s", fmt_secs(*limit))]
    TimedOut { tool: String, limit: Duration },
    /// It printed more than the bound; its process group was killed.
    #[error("`{tool}` printed more than {limit} bytes")]
    TooMuchOutput { tool: String, limit: u64 },
    /// The stop flag was raised while it ran; its process group was killed.
    #[error("`{tool}` was stopped")]
    Stopped { tool: String },
    /// It exited, and something it started still held its output open (killed with it).
    #[error("`{tool}`: its output did not end when it exited")]
    OutputOpen { tool: String },
    #[error("`{tool}`: reading its output: {message}")]
    Io { tool: String, message: String },
    /// It ran to its end and failed ([`Tool::stdout`] only).
    #[error("`{tool}` exited with {status}{}", stderr_suffix(stderr))]
    Failed {
        tool: String,
        status: ExitStatus,
        stderr: String,
    },
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

impl ToolError {
    /// The message without the tool's name (`did not answer within 10 s`), for callers
    /// that name the tool (with its arguments) themselves.
    pub(crate) fn why(&self) -> String {
        match self {
            ToolError::Missing { .. } => "is not installed".into(),
            ToolError::Spawn { message, .. } => format!("could not be started: {message}"),
            ToolError::TimedOut { limit, .. } => {
                format!("did not answer within {} s", fmt_secs(*limit))
            }
            ToolError::TooMuchOutput { limit, .. } => format!("printed more than {limit} bytes"),
            ToolError::Stopped { .. } => "stopped".into(),
            ToolError::OutputOpen { .. } => "its output did not end when it exited".into(),
            ToolError::Io { message, .. } => format!("reading its output: {message}"),
            ToolError::Failed { status, .. } => format!("exited with {status}"),
        }
    }
}

/// What a tool printed, and how it ended.
#[derive(Debug)]
pub(crate) struct ToolOutput {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    /// The first [`MAX_STDERR`] bytes of its stderr (empty unless [`Tool::stderr`] asked).
    pub stderr: Vec<u8>,
}

/// A one-shot call of an external program, bounded in time and output. Built like a
/// [`Command`]; [`Tool::run`] starts it and waits for it.
pub(crate) struct Tool {
    name: String,
    cmd: Command,
    timeout: Duration,
    grace: Duration,
    max_output: u64,
    keep_stderr: bool,
}

impl Tool {
    /// `program` with the defaults of a one-shot tool: [`TOOL_TIMEOUT`], [`MAX_OUTPUT`],
    /// stderr dropped.
    pub(crate) fn new(program: impl AsRef<OsStr>) -> Tool {
        let program = program.as_ref();
        Tool {
            name: program.to_string_lossy().into_owned(),
            cmd: command(program),
            timeout: TOOL_TIMEOUT,
            grace: TOOL_GRACE,
            max_output: MAX_OUTPUT,
            keep_stderr: false,
        }
    }

    /// `git` with its limits ([`GIT_TIMEOUT`], [`GIT_MAX_OUTPUT`]).
    pub(crate) fn git() -> Tool {
        Tool::new("git")
            .timeout(GIT_TIMEOUT)
            .max_output(GIT_MAX_OUTPUT)
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Tool {
        self.cmd.arg(arg);
        self
    }

    pub(crate) fn args<I, S>(mut self, args: I) -> Tool
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub(crate) fn current_dir(mut self, dir: impl AsRef<Path>) -> Tool {
        self.cmd.current_dir(dir);
        self
    }

    pub(crate) fn timeout(mut self, limit: Duration) -> Tool {
        self.timeout = limit;
        self
    }

    pub(crate) fn max_output(mut self, bytes: u64) -> Tool {
        self.max_output = bytes;
        self
    }

    /// Keeps the first [`MAX_STDERR`] bytes of its stderr (for a failure's message).
    pub(crate) fn stderr(mut self) -> Tool {
        self.keep_stderr = true;
        self
    }

    /// Its stdout (lossy UTF-8) when it exits 0 within its limits.
    pub(crate) fn stdout(self, stop: Option<&AtomicBool>) -> Result<String, ToolError> {
        let name = self.name.clone();
        let out = self.run(stop)?;
        if !out.status.success() {
            return Err(ToolError::Failed {
                tool: name,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs it to its end or to a limit. `stop`, when raised, ends the wait early (the
    /// group is killed), so a run never waits for a tool at its end.
    pub(crate) fn run(mut self, stop: Option<&AtomicBool>) -> Result<ToolOutput, ToolError> {
        let tool = self.name.clone();
        let child = self
            .cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.keep_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn();
        let mut child = match child {
            Ok(c) => Watched::new(c),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ToolError::Missing { tool })
            }
            Err(e) => {
                return Err(ToolError::Spawn {
                    tool,
                    message: e.to_string(),
                })
            }
        };
        let over = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut streams = 0;
        if let Some(s) = child.child.stdout.take() {
            streams += 1;
            read_bounded(s, self.max_output, Some(over.clone()), 0, tx.clone());
        }
        if let Some(s) = child.child.stderr.take() {
            streams += 1;
            read_bounded(s, MAX_STDERR as u64, None, 1, tx.clone());
        }
        drop(tx);
        let started = Instant::now();
        loop {
            match child.exited() {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    return Err(ToolError::Io {
                        tool,
                        message: format!("wait: {e}"),
                    })
                }
            }
            if over.load(Ordering::Relaxed) {
                let _ = child.kill();
                return Err(ToolError::TooMuchOutput {
                    tool,
                    limit: self.max_output,
                });
            }
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                let _ = child.kill();
                return Err(ToolError::Stopped { tool });
            }
            if started.elapsed() >= self.timeout {
                let _ = child.terminate(self.grace);
                return Err(ToolError::TimedOut {
                    tool,
                    limit: self.timeout,
                });
            }
            std::thread::sleep(POLL);
        }
        // It has exited (not yet reaped, so its group id is still its own); what it started
        // may still hold the pipes, and is given a moment, then killed with the group.
        let mut outs: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
        let deadline = Instant::now() + DRAIN;
        let mut open = false;
        for _ in 0..streams {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((i, Ok(buf))) => outs[i] = buf,
                Ok((_, Err(e))) => {
                    let _ = child.kill();
                    return Err(ToolError::Io {
                        tool,
                        message: e.to_string(),
                    });
                }
                Err(_) => {
                    open = true;
                    break;
                }
            }
        }
        let status = child.kill();
        if open {
            return Err(ToolError::OutputOpen { tool });
        }
        if over.load(Ordering::Relaxed) {
            return Err(ToolError::TooMuchOutput {
                tool,
                limit: self.max_output,
            });
        }
        let [stdout, stderr] = outs;
        Ok(ToolOutput {
            status: status.map_err(|e| ToolError::Io {
                tool,
                message: format!("wait: {e}"),
            })?,
            stdout,
            stderr,
        })
    }
}

/// Reads `r` to its end in chunks on a thread of its own, keeping at most `limit` bytes.
/// With `over`, reading past the limit raises it and stops (the caller kills the writer);
/// without, the rest is read and dropped. Sends `(index, bytes)` when done.
fn read_bounded(
    mut r: impl Read + Send + 'static,
    limit: u64,
    over: Option<Arc<AtomicBool>>,
    index: usize,
    tx: mpsc::Sender<(usize, std::io::Result<Vec<u8>>)>,
) {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16 << 10];
        let result = loop {
            match r.read(&mut chunk) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    let room = (limit as usize).saturating_sub(buf.len());
                    if n > room {
                        buf.extend_from_slice(&chunk[..room]);
                        if let Some(over) = &over {
                            over.store(true, Ordering::Relaxed);
                            break Ok(());
                        }
                    } else {
                        buf.extend_from_slice(&chunk[..n]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let _ = tx.send((index, result.map(|()| buf)));
    });
}

/// A started child whose process group is watched ([`watch`]) until it is reaped, and
/// killed (SIGKILL to the group) and reaped when dropped.
pub(crate) struct Watched {
    pub child: Child,
    pgid: Pid,
    reaped: Option<ExitStatus>,
}

impl Watched {
    /// Takes over `child`, which [`command`] started (the leader of its own group).
    pub(crate) fn new(child: Child) -> Watched {
        let pgid = Pid::from_raw(child.id() as i32);
        watch(pgid);
        Watched {
            child,
            pgid,
            reaped: None,
        }
    }

    pub(crate) fn pgid(&self) -> Pid {
        self.pgid
    }

    /// Sends `sig` to the whole group.
    pub(crate) fn signal(&self, sig: Signal) {
        if self.reaped.is_none() {
            let _ = killpg(self.pgid, sig);
        }
    }

    /// Whether the leader has exited, without reaping it: while its zombie stands, the
    /// group id is not given to another process, so the group can still be killed safely.
    pub(crate) fn exited(&mut self) -> std::io::Result<bool> {
        use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
        if self.reaped.is_some() {
            return Ok(true);
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(self.pgid), flags) {
            Ok(WaitStatus::StillAlive) => Ok(false),
            Ok(_) => Ok(true),
            // Reaped elsewhere (cannot happen here: the Child is ours).
            Err(nix::errno::Errno::ECHILD) => Ok(true),
            Err(e) => Err(std::io::Error::from(e)),
        }
    }

    /// Kills the whole group with SIGKILL and reaps the leader; its status.
    pub(crate) fn kill(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(st) = self.reaped {
            return Ok(st);
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let st = self.child.wait()?;
        self.reaped = Some(st);
        unwatch(self.pgid);
        Ok(st)
    }

    /// SIGTERM to the group; SIGKILL to it once the leader has exited or `grace` has
    /// passed, whichever comes first; reaps the leader.
    pub(crate) fn terminate(&mut self, grace: Duration) -> std::io::Result<ExitStatus> {
        self.signal(Signal::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until && !self.exited().unwrap_or(true) {
            std::thread::sleep(POLL);
        }
        self.kill()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// What the setpriv shim's shell runs: `$0` is bench's pid, the rest the program's command
/// line. A child whose parent is no longer bench (it died before setpriv set the death
/// signal) would outlive it, so it stops there instead, as the fork path's check does.
const SHIM_SCRIPT: &str = r#"[ "$PPID" = "$0" ] || { echo "bench exited before the worker started" >&2; exit 1; }; exec "$@""#;

/// `setpriv` when it can set the parent-death signal (util-linux 2.33 or later), found once.
///
/// Setting the signal in the child needs code between fork and exec, and with such code
/// the standard library forks bench instead of using `posix_spawn`. bench maps libtorch
/// (hundreds of MB): copying its page tables at fork and dropping them at exec took most
/// of the runner's time per cell (a profile of 60 trivial cells: 41% of all samples in
/// `copy_page_range` and `unmap_page_range`, about 30 ms per cell on a loaded 2-core
/// machine). Started through setpriv, the child is spawned without a fork of bench, and
/// still dies with it. Without setpriv the fork path stays.
fn pdeathsig_shim() -> Option<&'static Path> {
    static SHIM: OnceLock<Option<PathBuf>> = OnceLock::new();
    SHIM.get_or_init(|| {
        let setpriv = find_in_path(Path::new("setpriv"), None)?;
        // Through posix_spawn, without the death signal: this is the one call that cannot
        // have it, and `--help` ends by itself.
        let help = Command::new(&setpriv)
            .arg("--help")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&help.stdout);
        (text.contains("--pdeathsig") && Path::new("/bin/sh").exists()).then_some(setpriv)
    })
    .as_deref()
}

/// `program` as `execvp` would find it: a name with a `/` as it is, any other in `path`
/// (bench's own `PATH` when `None`).
pub(crate) fn find_in_path(program: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.as_os_str().as_bytes().contains(&b'/') {
        return executable(program).then(|| program.to_path_buf());
    }
    let path: OsString = match path {
        Some(p) => p.to_os_string(),
        None => std::env::var_os("PATH")?,
    };
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// A [`Command`] for `program` that runs in a process group of its own and dies with
/// bench (see the module doc). `path` is the `PATH` the child will search, when its
/// environment sets its own. Add arguments, environment and folder as to any command.
///
/// The parent-death signal follows the *thread* that starts the child: start it from a
/// thread that outlives it (every caller waits for its child, or starts it from the
/// thread that runs the command).
pub(crate) fn command_in(program: impl AsRef<OsStr>, path: Option<&OsStr>) -> Command {
    let mut c = dying_with_bench(program, path);
    c.process_group(0);
    c
}

/// A [`Command`] for `program` that dies with this process (the parent-death signal, as
/// [`command_in`] sets it) but stays in this process's group: for a child that is part of
/// a worker (the framework a `bench adapt` worker runs), which the runner stops with the
/// worker's group.
pub(crate) fn dying_with_bench(program: impl AsRef<OsStr>, path: Option<&OsStr>) -> Command {
    let mut c = dying_with_bench_untagged(program, path);
    // Every descendant inherits the tag, even one that leaves the child's process group
    // or session (`setsid`, a daemon): the watchdog finds those by it.
    c.env(OWNERS_VAR, owners());
    c
}

/// The variable that tags every process bench starts with the tokens of the bench
/// processes above it ([`owner_token`]), colon-separated.
pub(crate) const OWNERS_VAR: &str = "BENCH_OWNERS";

/// This process's token: unique per bench process (its pid and start time), so the
/// watchdog's sweep matches only what this bench started.
fn owner_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("bench-owner-{}-{nanos}", std::process::id())
    })
}

/// [`OWNERS_VAR`]'s value for this process's children: the inherited tokens and its own.
fn owners() -> String {
    match std::env::var(OWNERS_VAR) {
        Ok(v) if !v.is_empty() => format!("{v}:{}", owner_token()),
        _ => owner_token().to_string(),
    }
}

fn dying_with_bench_untagged(program: impl AsRef<OsStr>, path: Option<&OsStr>) -> Command {
    let program = program.as_ref();
    let bench_pid = nix::unistd::getpid();
    // A program that is not found takes the fork path, whose spawn reports it as such
    // (the shim's shell would report exit 127).
    let shim = pdeathsig_shim().filter(|_| find_in_path(Path::new(program), path).is_some());
    match shim {
        Some(setpriv) => {
            let mut c = Command::new(setpriv);
            c.args(["--pdeathsig", "KILL", "--", "/bin/sh", "-c", SHIM_SCRIPT])
                .arg(bench_pid.to_string())
                .arg(program);
            c
        }
        None => {
            let mut c = Command::new(program);
            // SAFETY: between fork and exec the closure only makes async-signal-safe
            // system calls (prctl, getppid) and touches no memory the parent shares.
            unsafe {
                c.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                        .map_err(std::io::Error::from)?;
                    // bench may have died before the call above: then nothing would come.
                    if nix::unistd::getppid() != bench_pid {
                        return Err(std::io::Error::other(
                            "bench exited before the child started",
                        ));
                    }
                    Ok(())
                });
            }
            c
        }
    }
}

/// [`command_in`] with bench's own `PATH`.
pub(crate) fn command(program: impl AsRef<OsStr>) -> Command {
    command_in(program, None)
}

/// Starts `cmd` (made by [`command`]) and watches its group.
pub(crate) fn spawn(cmd: &mut Command) -> std::io::Result<Watched> {
    cmd.spawn().map(Watched::new)
}

/// The watchdog's script: `+PGID` lines add a group, `-PGID` lines remove one; at the end of
/// its input (bench is gone) every group still listed is killed, then every process whose
/// environment carries this bench's token (`$1`, see [`OWNERS_VAR`]): what a child started
/// in a session or group of its own (`setsid`, a daemonizing tool) escapes the group kill
/// but not its inherited environment. Twice, for a process that forked meanwhile. A
/// process that clears its environment (`env -i`) is out of reach.
const WATCHDOG_SCRIPT: &str = r#"trap '' INT HUP
live=' '
while IFS= read -r l; do
  case $l in
    +*) live="$live${l#+} " ;;
    -*) p=${l#-}; case $live in *" $p "*) live="${live%% $p *} ${live#* $p }" ;; esac ;;
  esac
done
for p in $live; do kill -s KILL -- "-$p" 2>/dev/null; done
if [ -n "${1:-}" ]; then
  for pass in 1 2; do
    for f in $(grep -lsaF -- "$1" /proc/[0-9]*/environ 2>/dev/null); do
      p=${f#/proc/}; p=${p%/environ}
      [ "$p" != "$$" ] && kill -s KILL "$p" 2>/dev/null
    done
  done
fi
"#;

/// The watchdog's stdin; `None` when it could not be started (no /bin/sh), then only the
/// parent-death signals stand.
fn watchdog() -> &'static Mutex<Option<ChildStdin>> {
    static DOG: OnceLock<Mutex<Option<ChildStdin>>> = OnceLock::new();
    DOG.get_or_init(|| {
        // Its own group, so the terminal's Ctrl-C does not stop it with bench; no death
        // signal, since the end of its input is the signal (and it must outlive bench to
        // do its work). The pipe is close-on-exec in bench, so no other child holds it.
        let child = Command::new("/bin/sh")
            .args(["-c", WATCHDOG_SCRIPT, "bench-watchdog", owner_token()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .ok();
        // Never waited for: it ends when bench does.
        Mutex::new(child.and_then(|mut c| c.stdin.take()))
    })
}

fn tell_watchdog(line: &str) {
    let mut dog = lock(watchdog());
    if let Some(stdin) = dog.as_mut() {
        // One short write (atomic on a pipe); a watchdog that died is not replaced.
        if stdin.write_all(line.as_bytes()).is_err() {
            *dog = None;
        }
    }
}

/// Asks the watchdog to kill group `pgid` should bench end before [`unwatch`].
pub(crate) fn watch(pgid: Pid) {
    tell_watchdog(&format!("+{pgid}\n"));
}

/// The group `pgid` is gone (killed and its leader reaped).
pub(crate) fn unwatch(pgid: Pid) {
    tell_watchdog(&format!("-{pgid}\n"));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pids of `me`'s children. Each thread's `/proc/<me>/task/<tid>/children` lists the
/// children it started or was given as subreaper, so this reads a handful of small files
/// instead of every process on the host: a scan of all of `/proc` after every cell cost a
/// few milliseconds per hundred processes, a real part of a short cell on a busy runner.
/// Kernels built without those files fall back to that scan.
pub(crate) fn children_of(me: u32) -> Vec<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{me}/task"));
    let mut lists = tasks
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|t| std::fs::read_to_string(t.path().join("children")))
        .peekable();
    if lists.peek().is_some_and(Result::is_ok) {
        return lists
            .flatten()
            .flat_map(|text| {
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(me)
            })
        })
        .collect()
}

/// Kills and reaps bench's children whose environment holds `needle` (`KEY=value`): the
/// processes that left a child's process group and were re-parented to bench (a
/// subreaper). Killing one re-parents its own children to bench in turn, so the scan
/// repeats until a pass finds none (at most a few passes: each removes a level of the
/// tree). bench's other children carry another value or none and are left alone.
pub(crate) fn reap_orphans(needle: &str) {
    use nix::sys::wait::waitpid;
    let me = std::process::id();
    for _ in 0..16 {
        let orphans: Vec<i32> = children_of(me)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
            })
            .collect();
        if orphans.is_empty() {
            return;
        }
        for pid in orphans {
            let pid = Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        // A zombie is dead for this purpose.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
    }

    fn wait_dead(pid: i32) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if !alive(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn tools_are_bounded_in_time_and_kill_their_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // A tool that hangs, with a child in its group: both are gone at the limit.
        let t0 = Instant::now();
        let r = Tool::new("sh")
            .args([
                "-c",
                &format!("sleep 30 & echo $! > {}; wait", pidfile.display()),
            ])
            .timeout(Duration::from_millis(300))
            .run(None);
        assert!(
            matches!(&r, Err(ToolError::TimedOut { tool, .. }) if tool == "sh"),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(wait_dead(pid), "the tool's child {pid} outlived it");
        assert_eq!(
            r.unwrap_err().to_string(),
            "`sh` did not answer within 0.3 s"
        );
    }

    #[test]
    fn a_tool_that_ignores_sigterm_is_killed_after_the_grace() {
        let t0 = Instant::now();
        let r = Tool::new("sh")
            .args(["-c", "trap '' TERM; while :; do sleep 0.1; done"])
            .timeout(Duration::from_millis(200))
            .run(None);
        assert!(matches!(r, Err(ToolError::TimedOut { .. })), "{r:?}");
        assert!(
            t0.elapsed() < TOOL_GRACE + Duration::from_secs(2),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn a_flooding_tool_is_cut_off_at_the_bound() {
        let t0 = Instant::now();
        // Endless output: stopped at the bound, not at the time limit.
        let r = Tool::new("sh")
            .args(["-c", "yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"])
            .max_output(1 << 20)
            .run(None);
        assert!(
            matches!(&r, Err(ToolError::TooMuchOutput { limit, .. }) if *limit == 1 << 20),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        // Endless stderr is read and dropped: only the time limit ends it.
        let r = Tool::new("sh")
            .args(["-c", "yes >&2"])
            .stderr()
            .timeout(Duration::from_millis(300))
            .run(None);
        assert!(matches!(r, Err(ToolError::TimedOut { .. })), "{r:?}");
    }

    #[test]
    fn a_child_holding_the_pipe_is_killed_when_the_tool_exits() {
        let r = Tool::new("sh")
            .args(["-c", "(sleep 30; echo late) & echo '[]'; exit 0"])
            .run(None);
        assert!(matches!(r, Err(ToolError::OutputOpen { .. })), "{r:?}");
        // A background child that does not hold the pipe is killed with the group.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let out = Tool::new("sh")
            .args([
                "-c",
                &format!(
                    "sleep 30 >/dev/null 2>&1 & echo $! > {}; echo ok",
                    pidfile.display()
                ),
            ])
            .stdout(None)
            .unwrap();
        assert_eq!(out, "ok\n");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            wait_dead(pid),
            "the tool's background child {pid} outlived it"
        );
    }

    #[test]
    fn tool_answers_failures_and_missing_programs() {
        assert_eq!(
            Tool::new("sh").args(["-c", "echo ok"]).stdout(None),
            Ok("ok\n".to_string())
        );
        let r = Tool::new("sh")
            .args(["-c", "echo out; echo why >&2; exit 2"])
            .stderr()
            .stdout(None);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, ToolError::Failed { stderr, .. } if stderr == "why"),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("exited with exit status: 2: why"),
            "{e}"
        );
        let out = Tool::new("sh").args(["-c", "exit 3"]).run(None).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(
            Tool::new("bench-no-such-tool-here").stdout(None),
            Err(ToolError::Missing {
                tool: "bench-no-such-tool-here".into()
            })
        );
        let stop = AtomicBool::new(true);
        assert!(matches!(
            Tool::new("sh").args(["-c", "sleep 30"]).run(Some(&stop)),
            Err(ToolError::Stopped { .. })
        ));
        assert_eq!(
            Tool::new("sh")
                .args(["-c", "pwd"])
                .current_dir("/")
                .stdout(None),
            Ok("/\n".to_string())
        );
    }

    #[test]
    fn the_watchdog_kills_watched_groups_when_its_input_ends() {
        // A watchdog of this test's own, fed by hand: a group it was told about is killed
        // when its input closes; one told gone is not (its pid is another process's now).
        let mut dog = Command::new("/bin/sh")
            .args(["-c", WATCHDOG_SCRIPT])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut keep = command("sleep").arg("30").spawn().unwrap();
        let mut doomed = command("sleep").arg("30").spawn().unwrap();
        let (k, d) = (keep.id(), doomed.id());
        let mut input = dog.stdin.take().unwrap();
        write!(input, "+{k}\n+{d}\n+999999\n-{k}\n").unwrap();
        drop(input);
        dog.wait().unwrap();
        let st = doomed.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(9));
        assert!(
            keep.try_wait().unwrap().is_none(),
            "an unwatched group was killed"
        );
        let _ = keep.kill();
        let _ = keep.wait();
    }

    #[test]
    fn commands_lead_a_process_group_of_their_own() {
        let mut c = command("sleep").arg("30").spawn().unwrap();
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(c.id() as i32))).unwrap();
        let _ = c.kill();
        let _ = c.wait();
        // The same process became `sleep` (through the shim or not): it leads its group.
        assert_eq!(pgid.as_raw(), c.id() as i32);
    }
}

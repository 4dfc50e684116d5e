//! `bench adapt --cell JSON`: runs one attempt of a framework cell and speaks the worker
//! event contract for it.
//!
//! The runner starts this process like any worker (in the cell's process group, with its
//! timeout and kill rules). It writes the framework's config into
//! `<run>/frameworks/<cell>.r<repeat>[.a<attempt>]/`, starts the framework, echoes every
//! line of its output to stderr (the cell's log keeps it), turns the lines into step events
//! through the adapter's [`LogParser`](super::log::LogParser), and ends with a summary
//! event whose figures bench computed itself, with the framework's own beside them. A log
//! that cannot be read fails the cell (exit 2, no retry) with the line that did not parse.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{mpsc, LazyLock};
use std::time::Instant;

use regex::Regex;
use sha2::{Digest, Sha256};

use super::adapter::Framework;
use super::bounds::Bounds;
use super::launch::AttemptFiles;
use super::log::{measured_median, LogEnd, LogParser, LoggedStep, ParseError};
use super::ran::RanReader;
use crate::cell::Cell;
use crate::events::FrameworkReport;
use crate::events::{ErrorKind, Event, LineSplitter, StepEvent};
use crate::exit::worker as exit;
use crate::metrics::flops;
use crate::workload::measure::{self, Recorder, RunFacts};
use crate::workload::models::presets::ModelConfig;

fn emit(ev: &Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", ev.to_line());
    let _ = out.flush();
}

fn fail(kind: ErrorKind, message: String) -> i32 {
    emit(&Event::Error { kind, message });
    kind.exit_code()
}

/// The attempt's folder: `<run>/frameworks/<cell>.r<repeat>[.a<attempt>]`.
fn attempt_dir(cell: &Cell) -> (PathBuf, PathBuf) {
    let run_dir = std::env::var_os("BENCH_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let repeat = std::env::var("BENCH_REPEAT").unwrap_or_else(|_| "0".into());
    let attempt = std::env::var("BENCH_ATTEMPT").unwrap_or_else(|_| "0".into());
    let mut name = format!("{}.r{repeat}", cell.id);
    if attempt != "0" {
        name.push_str(&format!(".a{attempt}"));
    }
    (run_dir.join("frameworks").join(name), run_dir)
}

/// Reads `stream` line by line into `tx`, each line as the runner reads worker output
/// ([`LineSplitter`]): at most [`crate::events::MAX_LINE_BYTES`] (the rest of a longer line
/// is read and dropped, so a framework printing a gigabyte in one line costs a megabyte),
/// invalid UTF-8 replaced, escape sequences and control characters removed.
fn pump<R: Read + Send + 'static>(stream: R, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        let mut stream = stream;
        let mut lines = LineSplitter::default();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut open = true;
        while open {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => lines.push(&chunk[..n], &mut |l| open &= tx.send(l).is_ok()),
            }
        }
        if let Some(l) = lines.flush() {
            let _ = tx.send(l);
        }
    });
}

/// A framework's output line as `bench adapt` echoes it into the cell's log (its stderr,
/// which the runner reads for worker events too): only the adapter's parser speaks for a
/// framework cell, so a line the runner would take for an event, a JSON object after
/// sanitizing (plain, or behind an escape or BEL byte that sanitizing removes), is prefixed
/// with `framework: ` and stays log text.
pub fn echo_line(line: &str) -> String {
    let text = crate::sanitize::clean(line);
    if text.trim_start().starts_with('{') {
        format!("framework: {text}")
    } else {
        text
    }
}

/// `bench adapt`: returns the process's exit code.
pub(crate) fn main(cell_json: &str) -> i32 {
    let cell: Cell = match serde_json::from_str(cell_json) {
        Ok(c) => c,
        Err(e) => return fail(ErrorKind::BadInput, format!("bench adapt: --cell: {e}")),
    };
    let Some((adapter, opts)) = super::adapter(&cell.params.workload) else {
        return fail(
            ErrorKind::BadInput,
            format!("bench adapt: cell {} has no framework workload", cell.id),
        );
    };
    if let Some(why) = adapter.unexpressible(&cell) {
        return fail(ErrorKind::BadInput, format!("{}: {why}", adapter.name()));
    }
    let cfg = match super::mapping::preset(&cell) {
        Ok(c) => c,
        Err(e) => return fail(ErrorKind::BadInput, e),
    };
    let (dir, run_dir) = attempt_dir(&cell);
    let exe = std::env::current_exe().unwrap_or_default();
    let scripts = super::launch::scripts_dir(&exe);
    let files = AttemptFiles {
        dir: dir.clone(),
        scripts: std::fs::canonicalize(&scripts).unwrap_or(scripts),
        python: super::launch::python(opts),
    };
    let prepared = adapter.prepare(&cell, opts, &files);
    let config_path = dir.join(format!("config.{}", prepared.config_ext));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(&config_path, &prepared.config_text))
        .and_then(|_| {
            prepared.files.iter().try_for_each(|(p, text)| {
                if let Some(parent) = p.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(p, text)
            })
        });
    if let Err(e) = written {
        return fail(
            ErrorKind::Internal,
            format!("{}: cannot write the framework's files: {e}", dir.display()),
        );
    }
    let sha = hex(&Sha256::digest(prepared.config_text.as_bytes()));
    let argv: Vec<String> = prepared
        .argv
        .iter()
        .map(|a| a.replace("{config}", &config_path.display().to_string()))
        .collect();
    eprintln!(
        "bench adapt: {} config {} (sha256 {sha})",
        adapter.name(),
        config_path.display()
    );
    eprintln!("bench adapt: {}", argv.join(" "));

    let started = Instant::now();
    // It dies with this worker (the parent-death signal), and stays in the worker's process
    // group, which the runner stops and kills as one.
    let mut child = match crate::proc::dying_with_bench(&argv[0], None)
        .args(&argv[1..])
        .envs(prepared.env.iter().map(|(k, v)| (k, v)))
        .envs(opts.env.iter())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        // A missing interpreter is the host's problem, retried like a crash before any step.
        Err(e) => {
            return fail(
                ErrorKind::Internal,
                format!("cannot start {}: {e}", argv[0]),
            )
        }
    };
    let (tx, rx) = mpsc::channel();
    if let Some(s) = child.stdout.take() {
        pump(s, tx.clone());
    }
    if let Some(s) = child.stderr.take() {
        pump(s, tx.clone());
    }
    drop(tx);

    let p = &cell.params;
    let tokens_per_step = super::log::Asked::of(&cell).tokens_per_step();
    let flops_per_token = flops_per_token(&cfg, &cell);
    let mut reader = LogReader::new(adapter, &cell, flops_per_token);
    let mut ran = RanReader::new(&cell, adapter.signatures(), adapter.torch_based());
    let mut rec = Recorder::default();
    let mut logged: Vec<LoggedStep> = Vec::new();
    let mut oom = false;
    let mut tail: Vec<String> = Vec::new();
    // The framework's own last exception line (a launcher such as torchrun prints its own
    // banner after it, so the last line alone rarely says what went wrong).
    let mut exception: Option<String> = None;
    let mut failure: Option<(ErrorKind, String)> = None;
    for (i, line) in rx.iter().enumerate() {
        eprintln!("{}", echo_line(&line));
        if failure.is_some() {
            continue;
        }
        // torch's (`CUDA out of memory`, `OutOfMemoryError`), llm.c's (`[CUDA ERROR] ... out of
        // memory`) and XLA's (`RESOURCE_EXHAUSTED`) words for it.
        oom |= line.contains("out of memory")
            || line.contains("OutOfMemoryError")
            || line.contains("RESOURCE_EXHAUSTED");
        if !line.trim().is_empty() {
            tail.push(line.clone());
            if tail.len() > 4 {
                tail.remove(0);
            }
        }
        if EXCEPTION.is_match(&line) {
            exception = Some(line.clone());
        }
        ran.line(i + 1, &super::log::split_rank(&line).1);
        match reader.line(i + 1, &line, started.elapsed().as_secs_f64()) {
            Ok(steps) => {
                for s in steps {
                    let warmup = s.step <= u64::from(p.warmup);
                    rec.record(
                        warmup,
                        s.step_time_s,
                        s.loss,
                        started.elapsed().as_secs_f64(),
                    );
                    emit(&Event::Step(StepEvent {
                        step: s.step - 1,
                        step_time_s: s.step_time_s,
                        tokens: tokens_per_step,
                        loss: s.loss,
                        warmup: Some(warmup),
                        rank: None,
                    }));
                    logged.push(s);
                }
            }
            Err(e) => failure = Some(e),
        }
        if failure.is_some() {
            // Stop the framework; the runner kills whatever it left in the group.
            let _ = child.kill();
        }
    }
    let status = child.wait();
    if let Some((kind, message)) = failure {
        return fail(kind, message);
    }
    let exited_ok = matches!(&status, Ok(s) if s.success());
    if !exited_ok {
        let how = match &status {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        let kind = if oom {
            ErrorKind::Oom
        } else {
            ErrorKind::Internal
        };
        return fail(
            kind,
            format!(
                "{} {how}: {}",
                adapter.name(),
                exception
                    .or_else(|| tail.last().cloned())
                    .unwrap_or_default()
                    .trim()
            ),
        );
    }
    let (rest, end) = match reader.finish(true, started.elapsed().as_secs_f64()) {
        Ok(x) => x,
        Err((kind, message)) => return fail(kind, message),
    };
    logged.extend(rest);
    let info = end.info;
    let facts = RunFacts {
        tokens_per_step,
        world_size: info.world_size.max(1),
        n_params: cfg.n_params(),
        flops_per_token,
        peak: flops::peak_tflops(&info.device, cell.dtype()),
        peak_mem_bytes: None,
        device: info.device.clone(),
    };
    let mut summary = measure::summary(&rec, &facts);
    summary.peak_mem_bytes = end.peak_mem_bytes;
    summary.framework = Some(Box::new(FrameworkReport {
        name: info.name.clone(),
        version: info.version.clone(),
        libraries: info.libraries.clone(),
        config_file: relative(&config_path, &run_dir),
        config_sha256: sha,
        tokens_per_s_per_gpu: measured_median(&logged, p.warmup, |s| s.tokens_per_s_per_gpu)
            .or(end.run_tokens_per_s_per_gpu),
        tflops_per_gpu: measured_median(&logged, p.warmup, |s| s.tflops_per_gpu),
        mfu: measured_median(&logged, p.warmup, |s| s.mfu),
        method: end.method,
    }));
    summary.ran = Some(Box::new(ran.finish()));
    emit(&Event::Summary(summary));
    exit::OK
}

/// A Python exception line with its message (`ValueError: Seed (0) should be ...`), also
/// behind rank prefixes; a bare `...Error: ` with nothing after it (torchrun's
/// `ChildFailedError:` banner) is not one.
static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b[A-Za-z_][\w.]*(?:Error|Exception): \S").expect("static regex")
});

/// Model FLOPs per token of a framework cell's preset at the cell's sequence length.
fn flops_per_token(cfg: &ModelConfig, cell: &Cell) -> f64 {
    flops::flops_per_token(
        cfg.n_matmul_params(),
        cfg.layers as u64,
        cfg.hidden as u64,
        u64::from(cell.params.seq_len),
    )
}

/// A framework's log read as `bench adapt` reads it: every line through the adapter's
/// parser, and every step it completes held to a finite loss (a NaN-loss failure, exit 5)
/// and to the cell's physical bounds ([`Bounds`]; exit 2, with the line).
pub(crate) struct LogReader {
    name: &'static str,
    parser: Box<dyn LogParser>,
    bounds: Bounds,
}

impl LogReader {
    pub(crate) fn new(adapter: &Framework, cell: &Cell, flops_per_token: f64) -> LogReader {
        let tokens_per_step = super::log::Asked::of(cell).tokens_per_step();
        LogReader {
            name: adapter.name(),
            parser: adapter.parser(cell),
            bounds: Bounds::new(flops_per_token, tokens_per_step, cell.gpus(), cell.dtype()),
        }
    }

    /// Takes output line `line_no` (1-based), `elapsed_s` seconds after the framework
    /// started; returns the steps it completes, or why the cell fails.
    pub(crate) fn line(
        &mut self,
        line_no: usize,
        line: &str,
        elapsed_s: f64,
    ) -> Result<Vec<LoggedStep>, (ErrorKind, String)> {
        let steps = self
            .parser
            .line(line_no, line)
            .map_err(|e| (ErrorKind::BadInput, e.to_string()))?;
        self.checked(steps, line_no, line, elapsed_s)
    }

    /// The log has ended: the steps still held back (checked) and what the parser knows.
    pub(crate) fn finish(
        &mut self,
        exited_ok: bool,
        elapsed_s: f64,
    ) -> Result<(Vec<LoggedStep>, LogEnd), (ErrorKind, String)> {
        let (rest, end) = self
            .parser
            .finish(exited_ok)
            .map_err(|e| (ErrorKind::BadInput, e.to_string()))?;
        // The ranks the framework says it ran must be the cell's GPUs: a figure per GPU
        // over another world size is made up (crate::bounds).
        if exited_ok && end.info != crate::external::log::DriverInfo::default() {
            self.bounds
                .check_world_size(u64::from(end.info.world_size))
                .map_err(|why| {
                    (
                        ErrorKind::BadInput,
                        format!("{}: the driver line reports {why}", self.name),
                    )
                })?;
            for (rank, b) in end.peak_mem_bytes.iter().enumerate() {
                crate::bounds::check("peak_mem_bytes", *b as f64).map_err(|why| {
                    (
                        ErrorKind::BadInput,
                        format!("{}: rank {rank}'s {why}", self.name),
                    )
                })?;
            }
        }
        Ok((self.checked(rest, 0, "", elapsed_s)?, end))
    }

    fn checked(
        &self,
        steps: Vec<LoggedStep>,
        line_no: usize,
        line: &str,
        elapsed_s: f64,
    ) -> Result<Vec<LoggedStep>, (ErrorKind, String)> {
        for s in &steps {
            if !s.loss.is_finite() {
                return Err((
                    ErrorKind::NanLoss,
                    format!("{}: loss {} at step {}", self.name, s.loss, s.step),
                ));
            }
            self.bounds
                .check(s, self.parser.device(), elapsed_s)
                .map_err(|why| {
                    let e = ParseError::new(self.name, line_no, line, why);
                    (ErrorKind::BadInput, e.to_string())
                })?;
        }
        Ok(steps)
    }
}

/// Reads a framework cell's output (`cell`'s adapter, its bytes as the framework printed
/// them) as `bench adapt` does, `elapsed_s` seconds into the run: the steps it gives as
/// (step, seconds, loss), or why the cell fails. For the fuzz tests.
pub fn read_log(
    cell: &Cell,
    output: &[u8],
    elapsed_s: f64,
) -> Result<Vec<(u64, f64, f64)>, String> {
    let (adapter, _) = super::adapter(&cell.params.workload).ok_or("not a framework cell")?;
    let cfg = super::mapping::preset(cell)?;
    let mut reader = LogReader::new(adapter, cell, flops_per_token(&cfg, cell));
    let mut lines = Vec::new();
    let mut split = LineSplitter::default();
    split.push(output, &mut |l| lines.push(l));
    lines.extend(split.flush());
    let mut steps = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        steps.extend(reader.line(i + 1, line, elapsed_s).map_err(|(_, m)| m)?);
    }
    steps.extend(reader.finish(true, elapsed_s).map_err(|(_, m)| m)?.0);
    Ok(steps
        .iter()
        .map(|s| (s.step, s.step_time_s, s.loss))
        .collect())
}

fn relative(path: &Path, base: &Path) -> PathBuf {
    path.strip_prefix(base).unwrap_or(path).to_path_buf()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

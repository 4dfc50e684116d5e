//! Reporters of a run's progress: they consume [`RunEvent`]s and draw nothing else.
//!
//! On a terminal, [`BarReporter`] shows an overall bar and one spinner line per running
//! cell (repeat, attempt, last step time), printing each finished cell above the bars.
//! Elsewhere (CI logs, pipes, `--no-progress`) [`LineReporter`] prints one plain line per
//! event worth a line, which reads well in a CI log. Both write to stderr: stdout is kept
//! for reports.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::events::RunEvent;
use crate::cell::CellId;
use crate::results::Outcome;

/// Something that consumes runner events.
pub trait Reporter: Send {
    fn on_event(&mut self, event: &RunEvent);
}

/// Two reporters that both hear every event (the progress display and an observer such as
/// the history recorder).
pub(crate) struct Tee<'a, 'b> {
    pub first: &'a mut dyn Reporter,
    pub second: &'b mut dyn Reporter,
}

impl Reporter for Tee<'_, '_> {
    fn on_event(&mut self, event: &RunEvent) {
        self.first.on_event(event);
        self.second.on_event(event);
    }
}

/// The reporter for this process: a bar on an interactive terminal outside CI, plain
/// lines otherwise.
pub(crate) fn for_stderr(no_progress: bool) -> Box<dyn Reporter> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    if !no_progress && !ci && std::io::stderr().is_terminal() {
        Box::new(BarReporter::new())
    } else {
        Box::new(LineReporter::new(std::io::stderr()))
    }
}

/// A short status word of an outcome.
pub(crate) fn status_word(outcome: &Outcome, flaky: bool) -> &'static str {
    match outcome {
        Outcome::Passed if flaky => "FLAKY",
        Outcome::Passed => "PASS",
        Outcome::Failed { .. } => "FAIL",
        Outcome::TimedOut { .. } => "TIMEOUT",
        Outcome::Skipped { .. } => "SKIP",
    }
}

fn reason(outcome: &Outcome) -> Option<&str> {
    match outcome {
        Outcome::Passed => None,
        Outcome::Failed { reason } | Outcome::TimedOut { reason } | Outcome::Skipped { reason } => {
            Some(reason)
        }
    }
}

/// Tokens/s with an SI suffix, e.g. `345.2K tok/s`.
fn tokens(t: f64) -> String {
    let (v, unit) = if t >= 1e6 {
        (t / 1e6, "M")
    } else if t >= 1e3 {
        (t / 1e3, "K")
    } else {
        (t, "")
    };
    format!("{v:.1}{unit} tok/s")
}

/// The line of a `CellFinished` event, numbered `done` of `total`.
fn finished_line(done: usize, total: usize, event: &RunEvent) -> Option<String> {
    let RunEvent::CellFinished {
        id,
        outcome,
        flaky,
        duration_s,
        tokens_per_s,
        resumed,
    } = event
    else {
        return None;
    };
    let mut line = format!("[{done}/{total}] {:<7} {id}", status_word(outcome, *flaky));
    if *resumed {
        line.push_str(" (kept from the resumed run)");
    } else {
        line.push_str(&format!(" {duration_s:.1}s"));
    }
    if let Some(t) = tokens_per_s {
        line.push_str(&format!(" {}", tokens(*t)));
    }
    if let Some(r) = reason(outcome) {
        line.push_str(&format!(": {r}"));
    }
    Some(line)
}

fn summary_line(passed: usize, failed: usize, skipped: usize, interrupted: bool, d: f64) -> String {
    format!(
        "{} in {d:.1}s: {passed} passed, {failed} failed, {skipped} skipped",
        if interrupted {
            "interrupted"
        } else {
            "finished"
        }
    )
}

/// The line saying whose environment the run records.
/// A job's nodes for a question about them: `node1 or node2`; past eight nodes, the list
/// as Slurm wrote it with the count (`one of gpu[001-128] (128 nodes)`).
fn nodes_or(list: &str) -> String {
    match crate::slurm::hostlist::expand(list) {
        Some(names) if names.len() == 1 => format!("node {}", names[0]),
        Some(names) if (2..=8).contains(&names.len()) => {
            let (last, rest) = names.split_last().unwrap_or((&names[0], &[]));
            format!("node {} or {last}", rest.join(", "))
        }
        _ => format!("one of {}", crate::slurm::hostlist::shown(list)),
    }
}

fn environment_line(hardware_key: &str, host: &str, job_id: &str) -> String {
    format!("ENV     hardware key {hardware_key}, from node {host} (Slurm job {job_id})")
}

/// Plain lines, one per started and finished cell, retry and stop.
pub struct LineReporter<W: Write + Send> {
    out: W,
    total: usize,
    done: usize,
}

impl<W: Write + Send> LineReporter<W> {
    pub fn new(out: W) -> Self {
        LineReporter {
            out,
            total: 0,
            done: 0,
        }
    }
}

impl<W: Write + Send> Reporter for LineReporter<W> {
    fn on_event(&mut self, event: &RunEvent) {
        let line = match event {
            RunEvent::RunStarted {
                run_id,
                run_dir,
                total,
                resumed,
                gpu_slots,
                slurm,
            } => {
                self.total = *total;
                let gpus = if let Some(s) = slurm {
                    format!("Slurm: {s}")
                } else if *gpu_slots == 0 {
                    "no GPU: cells run one at a time on CPU".to_string()
                } else {
                    format!("{gpu_slots} GPU slot(s)")
                };
                let resumed = if *resumed > 0 {
                    format!(", {resumed} kept from the resumed run")
                } else {
                    String::new()
                };
                Some(format!(
                    "run {run_id} ({}): {total} cell(s), {gpus}{resumed}",
                    run_dir.display()
                ))
            }
            RunEvent::CellStarted { id, devices } => Some(if devices.is_empty() {
                format!("START   {id}")
            } else {
                format!("START   {id} on GPU {}", devices.join(","))
            }),
            RunEvent::AttemptFailed {
                id,
                repeat,
                attempt,
                reason,
                retrying,
            } => Some(format!(
                "{}  {id} repeat {repeat} attempt {attempt}: {reason}",
                if *retrying { "RETRY" } else { "ERROR" }
            )),
            RunEvent::CellFinished { .. } => {
                self.done += 1;
                finished_line(self.done, self.total, event)
            }
            RunEvent::Stopping { reason } => Some(format!("STOP    {reason}")),
            RunEvent::EnvironmentAdopted {
                hardware_key,
                host,
                job_id,
            } => Some(environment_line(hardware_key, host, job_id)),
            RunEvent::Warning { message } => Some(format!("WARNING {message}")),
            RunEvent::RunFinished {
                passed,
                failed,
                skipped,
                interrupted,
                duration_s,
            } => Some(summary_line(
                *passed,
                *failed,
                *skipped,
                *interrupted,
                *duration_s,
            )),
            RunEvent::JobSubmitted {
                id,
                repeat,
                attempt,
                job_id,
            } => Some(format!(
                "SUBMIT  {id} repeat {repeat} attempt {attempt}: Slurm job {job_id}"
            )),
            RunEvent::JobRunning { id, job_id, nodes } => Some(format!(
                "RUNNING {id}: Slurm job {job_id} on {}",
                crate::slurm::hostlist::shown(nodes)
            )),
            RunEvent::JobAwaitingNodes {
                id,
                job_id,
                nodes,
                sign,
                limit_s,
            } => Some(format!(
                "WAIT    {id}: Slurm job {job_id} failed as a lost node makes jobs fail ({sign}); asking Slurm for up to {limit_s}s whether {} was lost",
                nodes_or(nodes)
            )),
            RunEvent::AttemptStarted { .. }
            | RunEvent::Step { .. }
            | RunEvent::CellSaved { .. } => None,
        };
        if let Some(line) = line {
            let _ = writeln!(self.out, "{line}");
        }
    }
}

/// An overall bar plus one spinner per running cell.
pub(crate) struct BarReporter {
    multi: MultiProgress,
    overall: ProgressBar,
    running: HashMap<CellId, ProgressBar>,
    total: usize,
    done: usize,
}

impl Default for BarReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl BarReporter {
    pub(crate) fn new() -> Self {
        let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
        let overall = multi.add(ProgressBar::new(0));
        overall.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} cells {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        BarReporter {
            multi,
            overall,
            running: HashMap::new(),
            total: 0,
            done: 0,
        }
    }
}

impl Reporter for BarReporter {
    fn on_event(&mut self, event: &RunEvent) {
        match event {
            RunEvent::RunStarted { total, .. } => {
                self.total = *total;
                self.overall.set_length(*total as u64);
            }
            RunEvent::CellStarted { id, devices } => {
                let bar = self.multi.add(ProgressBar::new_spinner());
                bar.set_style(
                    ProgressStyle::with_template("  {spinner} {prefix} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                let on = if devices.is_empty() {
                    String::new()
                } else {
                    format!(" [GPU {}]", devices.join(","))
                };
                bar.set_prefix(format!("{id}{on}"));
                bar.enable_steady_tick(Duration::from_millis(120));
                self.running.insert(id.clone(), bar);
            }
            RunEvent::AttemptStarted {
                id,
                repeat,
                repeats,
                attempt,
            } => {
                if let Some(bar) = self.running.get(id) {
                    let retry = if *attempt > 0 {
                        format!(" retry {attempt}")
                    } else {
                        String::new()
                    };
                    bar.set_message(format!("repeat {}/{repeats}{retry}", repeat + 1));
                }
            }
            RunEvent::Step {
                id,
                repeat,
                step,
                steps,
                step_time_s,
            } => {
                if let Some(bar) = self.running.get(id) {
                    bar.set_message(format!(
                        "repeat {} step {}/{steps} {step_time_s:.3}s",
                        repeat + 1,
                        step + 1
                    ));
                }
            }
            RunEvent::JobSubmitted { id, job_id, .. } => {
                if let Some(bar) = self.running.get(id) {
                    bar.set_message(format!("Slurm job {job_id} queued"));
                }
            }
            RunEvent::JobRunning { id, job_id, nodes } => {
                if let Some(bar) = self.running.get(id) {
                    bar.set_message(format!(
                        "Slurm job {job_id} running on {}",
                        crate::slurm::hostlist::shown(nodes)
                    ));
                }
            }
            RunEvent::JobAwaitingNodes {
                id,
                job_id,
                nodes,
                limit_s,
                ..
            } => {
                if let Some(bar) = self.running.get(id) {
                    bar.set_message(format!(
                        "Slurm job {job_id} failed; asking Slurm for up to {limit_s}s whether {} was lost",
                        nodes_or(nodes)
                    ));
                }
            }
            RunEvent::AttemptFailed {
                id,
                repeat,
                attempt,
                reason,
                retrying,
            } => {
                let _ = self.multi.println(format!(
                    "{}  {id} repeat {repeat} attempt {attempt}: {reason}",
                    if *retrying { "RETRY" } else { "ERROR" }
                ));
            }
            RunEvent::CellFinished { id, .. } => {
                if let Some(bar) = self.running.remove(id) {
                    bar.finish_and_clear();
                    self.multi.remove(&bar);
                }
                self.done += 1;
                self.overall.inc(1);
                if let Some(line) = finished_line(self.done, self.total, event) {
                    let _ = self.multi.println(line);
                }
            }
            RunEvent::CellSaved { .. } => {}
            RunEvent::Stopping { reason } => {
                self.overall.set_message(format!("stopping: {reason}"));
            }
            RunEvent::EnvironmentAdopted {
                hardware_key,
                host,
                job_id,
            } => {
                let _ = self
                    .multi
                    .println(environment_line(hardware_key, host, job_id));
            }
            RunEvent::Warning { message } => {
                let _ = self.multi.println(format!("WARNING {message}"));
            }
            RunEvent::RunFinished {
                passed,
                failed,
                skipped,
                interrupted,
                duration_s,
            } => {
                for (_, bar) in self.running.drain() {
                    bar.finish_and_clear();
                }
                self.overall.finish_and_clear();
                let _ = self.multi.println(summary_line(
                    *passed,
                    *failed,
                    *skipped,
                    *interrupted,
                    *duration_s,
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_for_a_small_run() {
        let mut buf = Vec::new();
        {
            let mut r = LineReporter::new(&mut buf);
            r.on_event(&RunEvent::RunStarted {
                run_id: "r1".into(),
                run_dir: "results/r1".into(),
                total: 2,
                resumed: 0,
                gpu_slots: 0,
                slurm: None,
            });
            r.on_event(&RunEvent::CellStarted {
                id: CellId("a".into()),
                devices: vec![],
            });
            r.on_event(&RunEvent::CellFinished {
                id: CellId("a".into()),
                outcome: Outcome::Passed,
                flaky: true,
                duration_s: 1.24,
                tokens_per_s: Some(345_200.0),
                resumed: false,
            });
            r.on_event(&RunEvent::CellFinished {
                id: CellId("b".into()),
                outcome: Outcome::Skipped {
                    reason: "needs 8 GPUs".into(),
                },
                flaky: false,
                duration_s: 0.0,
                tokens_per_s: None,
                resumed: false,
            });
        }
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            vec![
                "run r1 (results/r1): 2 cell(s), no GPU: cells run one at a time on CPU",
                "START   a",
                "[1/2] FLAKY   a 1.2s 345.2K tok/s",
                "[2/2] SKIP    b 0.0s: needs 8 GPUs",
            ]
        );
    }
}

#[cfg(test)]
mod slurm_tests {
    use super::*;

    #[test]
    fn slurm_runs_say_where_their_jobs_are() {
        let mut buf = Vec::new();
        {
            let mut r = LineReporter::new(&mut buf);
            r.on_event(&RunEvent::RunStarted {
                run_id: "r1".into(),
                run_dir: "results/r1".into(),
                total: 1,
                resumed: 0,
                gpu_slots: 0,
                slurm: Some("partition gpu, up to 32 job(s) at once".into()),
            });
            r.on_event(&RunEvent::JobSubmitted {
                id: CellId("a".into()),
                repeat: 0,
                attempt: 1,
                job_id: "4242".into(),
            });
            r.on_event(&RunEvent::JobRunning {
                id: CellId("a".into()),
                job_id: "4242".into(),
                nodes: "gpu[01-02]".into(),
            });
            // Past eight nodes, Slurm's list with the count.
            r.on_event(&RunEvent::JobRunning {
                id: CellId("b".into()),
                job_id: "4243".into(),
                nodes: "gpu[001-128]".into(),
            });
            r.on_event(&RunEvent::JobAwaitingNodes {
                id: CellId("a".into()),
                job_id: "4242".into(),
                nodes: "gpu[01-02]".into(),
                sign: "srun: error: gpu02: task 1: Killed".into(),
                limit_s: 24,
            });
            r.on_event(&RunEvent::JobAwaitingNodes {
                id: CellId("b".into()),
                job_id: "4243".into(),
                nodes: "gpu[001-128]".into(),
                sign: "rank 3 exited with status 6, a distributed failure".into(),
                limit_s: 300,
            });
        }
        let text = String::from_utf8(buf).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            vec![
                "run r1 (results/r1): 1 cell(s), Slurm: partition gpu, up to 32 job(s) at once",
                "SUBMIT  a repeat 0 attempt 1: Slurm job 4242",
                "RUNNING a: Slurm job 4242 on gpu01, gpu02",
                "RUNNING b: Slurm job 4243 on gpu[001-128] (128 nodes)",
                "WAIT    a: Slurm job 4242 failed as a lost node makes jobs fail (srun: error: gpu02: task 1: Killed); asking Slurm for up to 24s whether node gpu01 or gpu02 was lost",
                "WAIT    b: Slurm job 4243 failed as a lost node makes jobs fail (rank 3 exited with status 6, a distributed failure); asking Slurm for up to 300s whether one of gpu[001-128] (128 nodes) was lost",
            ]
        );
    }
}

//! One cell's task: its repeats, each attempt run by the launcher and judged
//! ([`super::judge`]), with retries for infrastructure failures. The task reports what it
//! hears as [`RunEvent`]s and node reports on channels; it never touches the run's state,
//! which only the dispatcher's loop owns.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::judge::{judge, Verdict};
use crate::cell::{Cell, CellId};
use crate::events::Event;
use crate::metrics::{energy, stats};
use crate::results::{Attempt, CellResult, Environment, Metrics, Outcome, Repeat};
use crate::run::events::RunEvent;
use crate::run::executor::{Cancel, Termination};
use crate::run::launcher::{AttemptIn, Launcher, News};

/// A report of the environment of the node an attempt ran on, on its way to the loop.
pub(crate) struct NodeReport {
    pub cell: CellId,
    pub job_id: String,
    pub env: Environment,
}

/// What every cell task shares.
pub(crate) struct Shared {
    pub run_dir: PathBuf,
    pub grace: Duration,
    pub launcher: Arc<dyn Launcher>,
    pub events: mpsc::UnboundedSender<RunEvent>,
    pub node_envs: mpsc::UnboundedSender<NodeReport>,
    pub cancel: watch::Receiver<Cancel>,
    pub withdraw: watch::Receiver<bool>,
    /// The run's GPU telemetry stream, when this host has one and cells run here.
    pub telemetry: Option<Arc<crate::telemetry::Stream>>,
    /// The host sampler (CPU, run queue, foreign processes), when cells run here.
    pub host: Option<Arc<crate::telemetry::host::HostSampler>>,
}

/// When one repeat's measured steps ran: from the start of its first measured step (its
/// report's time less its duration) to the report of its last.
#[derive(Default)]
struct Window {
    span: Option<(Instant, Instant)>,
}

impl Window {
    fn on_step(&mut self, step_time_s: f64) {
        let now = Instant::now();
        let began = now
            .checked_sub(Duration::from_secs_f64(step_time_s.clamp(0.0, 3600.0)))
            .unwrap_or(now);
        self.span = Some(match self.span {
            Some((a, _)) => (a, now),
            None => (began, now),
        });
    }
}

/// Turns what a launcher tells about an attempt into events for the loop.
fn on_news(shared: &Shared, cell: &CellId, repeat: u32, attempt: u32, steps: u32, n: News<'_>) {
    match n {
        News::Event(Event::Step(s)) => {
            let _ = shared.events.send(RunEvent::Step {
                id: cell.clone(),
                repeat,
                step: s.step,
                steps,
                step_time_s: s.step_time_s,
            });
        }
        News::Event(_) => {}
        News::Submitted { job_id } => {
            let _ = shared.events.send(RunEvent::JobSubmitted {
                id: cell.clone(),
                repeat,
                attempt,
                job_id: job_id.to_string(),
            });
        }
        News::Running { job_id, nodes } => {
            let _ = shared.events.send(RunEvent::JobRunning {
                id: cell.clone(),
                job_id: job_id.to_string(),
                nodes: nodes.to_string(),
            });
        }
        News::AwaitingNodes {
            job_id,
            nodes,
            sign,
            limit,
        } => {
            let _ = shared.events.send(RunEvent::JobAwaitingNodes {
                id: cell.clone(),
                job_id: job_id.to_string(),
                nodes: nodes.to_string(),
                sign: sign.to_string(),
                limit_s: limit.as_secs(),
            });
        }
        News::NodeEnv { job_id, env } => {
            let _ = shared.node_envs.send(NodeReport {
                cell: cell.clone(),
                job_id: job_id.to_string(),
                env: env.clone(),
            });
        }
    }
}

/// Runs one cell: its repeats, each with retries for infrastructure failures.
pub(crate) async fn run_cell(cell: Cell, devices: Vec<String>, shared: Arc<Shared>) -> CellResult {
    let started = Instant::now();
    let p = &cell.params;
    let repeats_n = p.repeats.max(1);
    // A timeout of 0 means no limit (a year is longer than any CI job).
    let timeout = if p.timeout_s == 0 {
        Duration::from_secs(86_400 * 365)
    } else {
        Duration::from_secs(p.timeout_s)
    };
    let mut attempts = Vec::new();
    let mut repeats = Vec::new();
    let mut logs = Vec::new();
    let mut flaky = false;
    let mut outcome: Option<Outcome> = None;
    // Each successful repeat's window of measured steps, in repeat order (`None` for a
    // repeat that reported no measured step): the telemetry over them is the cell's, and
    // each one's mean power is that repeat's.
    let mut windows: Vec<Option<(Instant, Instant)>> = Vec::new();

    'repeats: for r in 0..repeats_n {
        let mut attempt = 0u32;
        loop {
            if *shared.cancel.borrow() != Cancel::None {
                outcome = Some(Outcome::Skipped {
                    reason: "the run was interrupted while this cell ran".into(),
                });
                break 'repeats;
            }
            let _ = shared.events.send(RunEvent::AttemptStarted {
                id: cell.id.clone(),
                repeat: r,
                repeats: repeats_n,
                attempt,
            });
            let mut stem = format!("{}.r{r}", cell.id);
            if attempt > 0 {
                stem.push_str(&format!(".a{attempt}"));
            }
            let input = AttemptIn {
                cell: &cell,
                devices: &devices,
                repeat: r,
                attempt,
                run_dir: &shared.run_dir,
                log_stem: shared.run_dir.join("logs").join(&stem),
                stem: &stem,
                timeout,
                grace: shared.grace,
                cancel: shared.cancel.clone(),
                withdraw: shared.withdraw.clone(),
            };
            let id = cell.id.clone();
            let mut window = Window::default();
            let mut news = |n: News<'_>| {
                if let News::Event(Event::Step(s)) = &n {
                    if !stats::is_warmup(s, p.warmup) {
                        window.on_step(s.step_time_s);
                    }
                }
                on_news(&shared, &id, r, attempt, p.steps, n)
            };
            let report = match shared.launcher.attempt(input, &mut news).await {
                Ok(report) => report,
                Err(reason) => {
                    outcome = Some(Outcome::Failed { reason });
                    break 'repeats;
                }
            };
            let out = &report.out;
            logs.extend(
                out.logs
                    .iter()
                    .map(|l| l.strip_prefix(&shared.run_dir).unwrap_or(l).to_path_buf()),
            );
            let verdict = judge(out);
            let error = verdict.error(p.timeout_s);
            attempts.push(Attempt {
                repeat: r,
                attempt,
                exit_code: match out.termination {
                    Termination::Exited(c) => Some(c),
                    _ => None,
                },
                duration_s: out.duration.as_secs_f64(),
                error: error.clone(),
                slurm_job_id: report.placement.job_id.clone(),
                slurm_nodes: report.placement.nodes.clone(),
                slurm_node_names: report.placement.node_names.clone(),
                node_hardware_key: report.placement.node_hardware_key.clone(),
            });
            let retry = matches!(verdict, Verdict::Infra(_)) && attempt < p.retries;
            if let Some(reason) = error.filter(|_| verdict.is_noteworthy()) {
                let _ = shared.events.send(RunEvent::AttemptFailed {
                    id: cell.id.clone(),
                    repeat: r,
                    attempt,
                    reason,
                    retrying: retry,
                });
            }
            match verdict {
                Verdict::Ok => {
                    flaky |= attempt > 0;
                    windows.push(window.span);
                    let out = report.out;
                    repeats.push(Repeat {
                        steps: out.steps,
                        summary: out.summary.unwrap_or_default(),
                        notices: out.notices,
                    });
                    break;
                }
                Verdict::Infra(_) if retry => attempt += 1,
                Verdict::TimedOut => {
                    outcome = Some(Outcome::TimedOut {
                        reason: shared.launcher.timeout_reason(
                            r,
                            p.timeout_s,
                            &report,
                            shared.grace,
                        ),
                    });
                    break 'repeats;
                }
                other => {
                    outcome = Some(other.outcome(attempt));
                    break 'repeats;
                }
            }
        }
    }
    // A cell passes only with something measured (issue 13: no silent pass).
    let (outcome, mut metrics) = match outcome.unwrap_or(Outcome::Passed) {
        Outcome::Passed => {
            match stats::measured_metrics(&cell.params, cell.gpus(), cell.world_gpus(), &repeats) {
                Ok(m) => (Outcome::Passed, m),
                Err(reason) => (Outcome::Failed { reason }, Metrics::new()),
            }
        }
        other => (other, Metrics::new()),
    };
    let telemetry = match &outcome {
        Outcome::Passed => {
            let gpu = shared
                .telemetry
                .as_ref()
                .and_then(|t| t.cell(&windows, &devices));
            let spans: Vec<(Instant, Instant)> = windows.iter().flatten().copied().collect();
            let host = shared.host.as_ref().and_then(|h| h.cell(&spans));
            match (gpu, host) {
                (Some(mut t), host) => {
                    t.host = host;
                    Some(Box::new(t))
                }
                (None, Some(h)) => Some(Box::new(crate::telemetry::CellTelemetry::host_only(h))),
                (None, None) => None,
            }
        }
        _ => None,
    };
    // Tokens per joule and kWh per 1T tokens, for a cell whose telemetry read its GPUs'
    // power (absent otherwise: a CPU cell, a host without GPU telemetry).
    if let Some(t) = &telemetry {
        energy::add_energy(
            &mut metrics,
            &energy::Power {
                cell_w: t.power_w,
                repeat_w: &t.repeat_power_w,
                gpus: t.gpus.len(),
            },
        );
    }
    CellResult {
        id: cell.id,
        values: cell.values,
        params: cell.params,
        outcome,
        flaky,
        attempts,
        repeats,
        metrics,
        logs,
        duration_s: started.elapsed().as_secs_f64(),
        telemetry,
    }
}

/// A cell that did not run, with why.
pub(crate) fn skipped(cell: &Cell, reason: String) -> CellResult {
    CellResult {
        id: cell.id.clone(),
        values: cell.values.clone(),
        params: cell.params.clone(),
        outcome: Outcome::Skipped { reason },
        flaky: false,
        attempts: vec![],
        repeats: vec![],
        metrics: Metrics::new(),
        logs: vec![],
        duration_s: 0.0,
        telemetry: None,
    }
}

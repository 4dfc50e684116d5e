//! The scheduler: decides which cell runs when and on which GPUs, runs each cell's
//! repeats and retries, and writes the results document after every cell.
//!
//! GPU slots: a cell needs `gpus` devices. On a host with GPUs, cells that fit the free
//! slots start side by side (first fit in expansion order, so a small cell may pass a
//! large one waiting for slots), each with the visible-devices variable set to its slots;
//! a cell that needs more GPUs than the host has is skipped with a reason. On a host with
//! no GPU, cells run one at a time on CPU, and a built-in cell that needs several GPUs is
//! skipped (a `command` cell still runs: the command decides what a GPU count means).
//! `--jobs N` caps the cells in flight.
//!
//! Under `--launcher slurm` this host's GPUs do not count: every cell takes one of `--jobs`
//! slots (32 by default), its attempts run as Slurm jobs ([`super::slurm`]), and Slurm
//! decides where and when; a `--fail-fast` stop also withdraws jobs still queued. The
//! run's environment is then the nodes' as their jobs report it ([`super::node_env`]), not
//! this host's.
//!
//! Failures: retries are only for infrastructure failures (spawn failure, death by a
//! signal the runner did not send, a crash before the first step event); a success after
//! a retry marks the cell flaky. Worker exit 3 (unsupported) skips the cell; 2 (bad
//! input), 4 (out of memory) and 5 (NaN loss) fail it without retry. `--fail-fast` and
//! `--max-fail N` stop new cells from starting (running cells finish). The first Ctrl-C
//! (or SIGTERM) stops running cells gracefully and starts nothing new; a second one kills
//! them at once. Finished cells are never lost: the document is saved after each one.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::events::RunEvent;
use super::executor::{self, AttemptOutput, AttemptSpec, Cancel, Termination};
use super::launch::{self, AttemptCtx};
use super::node_env::{self, Decision, NodeEnvs};
use super::progress::Reporter;
use super::slurm::{self as slurm_run, JobNews, JobSpec, Queue, SlurmLaunch};
use super::{Launch, RunConfig, RunError, RunOutcome};
use crate::cell::{Cell, CellId, Workload};
use crate::env::GpuInventory;
use crate::events::{ErrorKind, Event};
use crate::matrix::Expansion;
use crate::metrics::stats;
use crate::results::{
    Attempt, CellResult, DroppedCell, Environment, EnvironmentSource, Metrics, Outcome, Repeat,
    RunResults, SCHEMA_VERSION,
};

/// A Slurm job's report of its node's environment, on its way to the scheduler's loop.
struct NodeReport {
    cell: CellId,
    job_id: String,
    env: Environment,
}

/// What the cell tasks share.
struct Shared {
    run_dir: PathBuf,
    bench_exe: PathBuf,
    grace: Duration,
    /// The visible-devices variable of this host's GPUs; `None` on a host without GPU
    /// tools. Every cell gets it set to its slots, which is empty under `--gpus 0` on a GPU
    /// host: such a run is asked to stay on CPU, so workers must not see the GPUs.
    devices_var: Option<String>,
    /// `--launcher slurm`: the settings and the queue shared by the jobs in flight.
    slurm: Option<(SlurmLaunch, Arc<Queue>)>,
    /// Where jobs' reports of their nodes' environments go (`--launcher slurm`).
    node_envs: mpsc::UnboundedSender<NodeReport>,
}

/// Under Slurm, the program each task runs: the cell's command line as this host would
/// start it (placeholders filled, the runner's variables set), without device variables
/// (Slurm assigns GPUs) or a rank contract (the job script sets it per task).
fn slurm_program(
    cell: &Cell,
    ctx: &AttemptCtx,
    bench_exe: &Path,
) -> Result<crate::dist::launch::Program, launch::LaunchError> {
    let ctx = AttemptCtx {
        visible_devices: None,
        ..ctx.clone()
    };
    let proc_ = launch::command(cell, &ctx, bench_exe)?;
    let mut argv = vec![proc_.program.to_string_lossy().into_owned()];
    argv.extend(proc_.args);
    Ok(crate::dist::launch::Program::Command {
        argv,
        env: proc_.env.into_iter().collect(),
    })
}

/// The Slurm job of one attempt of `cell`, with its script and output in `job_dir`; the
/// script also records its node's environment with `bench_exe env` (the run's
/// environment, see [`node_env`]).
fn slurm_plan(
    cell: &Cell,
    ctx: &AttemptCtx,
    bench_exe: &Path,
    sl: &SlurmLaunch,
    job_dir: &Path,
) -> Result<crate::slurm::JobPlan, RunError> {
    let program = slurm_program(cell, ctx, bench_exe)?;
    crate::slurm::script::plan_with_env_probe(
        cell,
        &program,
        &sl.settings,
        sl.use_gpus,
        job_dir,
        Some(bench_exe),
    )
    .map_err(RunError::Slurm)
}

/// How one attempt is judged.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Ok,
    /// Retried while retries remain.
    Infra(String),
    Failed(String),
    Unsupported(String),
    TimedOut,
    Cancelled,
    /// A queued Slurm job withdrawn by a `--fail-fast`/`--max-fail` stop.
    Withdrawn,
}

fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// The worker's own words about a failure: its `error` event, else its last log line.
fn detail(o: &AttemptOutput) -> String {
    if let Some((_, msg)) = &o.error {
        return msg.clone();
    }
    o.tail
        .last()
        .cloned()
        .unwrap_or_else(|| "no output".to_string())
}

fn judge(o: &AttemptOutput) -> Verdict {
    use crate::exit::worker as exit;
    match &o.termination {
        Termination::SpawnFailed(msg) => Verdict::Infra(msg.clone()),
        Termination::Lost(msg) => Verdict::Infra(msg.clone()),
        Termination::TimedOut => Verdict::TimedOut,
        Termination::Cancelled => Verdict::Cancelled,
        Termination::Withdrawn => Verdict::Withdrawn,
        Termination::Signaled(s) => Verdict::Infra(format!(
            "killed by {} after {} step event(s): {}",
            signal_name(*s),
            o.steps.len(),
            detail(o)
        )),
        Termination::Exited(0) => {
            if o.steps.is_empty() && o.summary.is_none() {
                Verdict::Failed(
                    "exited 0 without printing any step or summary event (see its log)".into(),
                )
            } else {
                Verdict::Ok
            }
        }
        Termination::Exited(exit::UNSUPPORTED) => Verdict::Unsupported(detail(o)),
        Termination::Exited(c @ (exit::BAD_INPUT | exit::OOM | exit::NAN_LOSS)) => {
            let what = match *c {
                exit::BAD_INPUT => ErrorKind::BadInput,
                exit::OOM => ErrorKind::Oom,
                _ => ErrorKind::NanLoss,
            };
            let label = match what {
                ErrorKind::BadInput => "bad input",
                ErrorKind::Oom => "out of memory",
                _ => "loss became NaN",
            };
            Verdict::Failed(format!("{label} (exit {c}): {}", detail(o)))
        }
        Termination::Exited(c) if o.steps.is_empty() => Verdict::Infra(format!(
            "crashed with exit code {c} before its first step: {}",
            detail(o)
        )),
        Termination::Exited(c) => Verdict::Failed(format!(
            "exited with code {c} after {} step event(s): {}",
            o.steps.len(),
            detail(o)
        )),
    }
}

/// Runs one cell: its repeats, each with retries for infrastructure failures.
async fn run_cell(
    cell: Cell,
    devices: Vec<String>,
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<RunEvent>,
    cancel: watch::Receiver<Cancel>,
    withdraw: watch::Receiver<bool>,
) -> CellResult {
    let started = Instant::now();
    let p = &cell.params;
    let repeats_n = p.repeats.max(1);
    // A timeout of 0 means no limit (a day is longer than any CI job).
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
    let visible = shared
        .devices_var
        .as_ref()
        .map(|v| (v.clone(), devices.join(",")));

    'repeats: for r in 0..repeats_n {
        let mut attempt = 0u32;
        loop {
            if *cancel.borrow() != Cancel::None {
                outcome = Some(Outcome::Skipped {
                    reason: "the run was interrupted while this cell ran".into(),
                });
                break 'repeats;
            }
            let _ = tx.send(RunEvent::AttemptStarted {
                id: cell.id.clone(),
                repeat: r,
                repeats: repeats_n,
                attempt,
            });
            // A multi-rank cell started here needs a rendezvous port: a free one, or
            // torchrun's default when the system will not name one (under Slurm the job
            // script derives it from the job id).
            let master_port = if launch::ranks(&cell) > 1 && shared.slurm.is_none() {
                launch::free_port().unwrap_or(29500)
            } else {
                0
            };
            let ctx = AttemptCtx {
                visible_devices: visible.clone(),
                repeat: r,
                attempt,
                run_dir: shared.run_dir.clone(),
                master_port,
            };
            let mut stem = format!("{}.r{r}", cell.id);
            if attempt > 0 {
                stem.push_str(&format!(".a{attempt}"));
            }
            let log_stem = shared.run_dir.join("logs").join(&stem);
            let steps_total = p.steps;
            let forward = |ev: &Event| {
                if let Event::Step(s) = ev {
                    let _ = tx.send(RunEvent::Step {
                        id: cell.id.clone(),
                        repeat: r,
                        step: s.step,
                        steps: steps_total,
                        step_time_s: s.step_time_s,
                    });
                }
            };
            let (out, job_id, job_nodes, node_key) = match &shared.slurm {
                None => {
                    let plan = match launch::plan(&cell, &ctx, &shared.bench_exe) {
                        Ok(plan) => plan,
                        Err(e) => {
                            outcome = Some(Outcome::Failed {
                                reason: e.to_string(),
                            });
                            break 'repeats;
                        }
                    };
                    let out = executor::execute(
                        AttemptSpec {
                            plan: &plan,
                            timeout,
                            grace: shared.grace,
                            log_stem: &log_stem,
                        },
                        cancel.clone(),
                        forward,
                    )
                    .await;
                    (out, None, None, None)
                }
                Some((sl, queue)) => {
                    let job_dir = shared.run_dir.join("slurm").join(&stem);
                    let plan = match slurm_plan(&cell, &ctx, &shared.bench_exe, sl, &job_dir) {
                        Ok(plan) => plan,
                        Err(e) => {
                            outcome = Some(Outcome::Failed {
                                reason: e.to_string(),
                            });
                            break 'repeats;
                        }
                    };
                    let id = cell.id.clone();
                    let res = slurm_run::execute(
                        JobSpec {
                            plan,
                            timeout,
                            grace: shared.grace,
                            log_stem: &log_stem,
                        },
                        queue,
                        cancel.clone(),
                        withdraw.clone(),
                        |news| match news {
                            JobNews::Submitted(job_id) => {
                                let _ = tx.send(RunEvent::JobSubmitted {
                                    id: id.clone(),
                                    repeat: r,
                                    attempt,
                                    job_id: job_id.to_string(),
                                });
                            }
                            JobNews::Running { job_id, nodes } => {
                                let _ = tx.send(RunEvent::JobRunning {
                                    id: id.clone(),
                                    job_id: job_id.to_string(),
                                    nodes: nodes.to_string(),
                                });
                            }
                            JobNews::Event(ev) => forward(ev),
                            JobNews::NodeEnv { job_id, env } => {
                                let _ = shared.node_envs.send(NodeReport {
                                    cell: id.clone(),
                                    job_id: job_id.to_string(),
                                    env: env.clone(),
                                });
                            }
                        },
                    )
                    .await;
                    let key = res.node_env.map(|e| e.hardware_key);
                    (res.out, res.job_id, res.nodes, key)
                }
            };
            logs.extend(
                out.logs
                    .iter()
                    .map(|l| l.strip_prefix(&shared.run_dir).unwrap_or(l).to_path_buf()),
            );
            let verdict = judge(&out);
            let out_escalated = out.escalated;
            let error = match &verdict {
                Verdict::Ok => None,
                Verdict::Infra(m) | Verdict::Failed(m) | Verdict::Unsupported(m) => Some(m.clone()),
                Verdict::TimedOut => Some(format!("timed out after {}s", p.timeout_s)),
                Verdict::Cancelled => Some("interrupted".into()),
                Verdict::Withdrawn => Some("withdrawn from the Slurm queue".into()),
            };
            attempts.push(Attempt {
                repeat: r,
                attempt,
                exit_code: match out.termination {
                    Termination::Exited(c) => Some(c),
                    _ => None,
                },
                duration_s: out.duration.as_secs_f64(),
                error: error.clone(),
                slurm_job_id: job_id.clone(),
                slurm_nodes: job_nodes,
                node_hardware_key: node_key,
            });
            let retry = matches!(verdict, Verdict::Infra(_)) && attempt < p.retries;
            // A skip (unsupported) or a stop on request is said once, by the cell's outcome.
            let noteworthy = !matches!(
                verdict,
                Verdict::Cancelled | Verdict::Unsupported(_) | Verdict::Withdrawn
            );
            if let Some(reason) = error.filter(|_| noteworthy) {
                let _ = tx.send(RunEvent::AttemptFailed {
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
                    repeats.push(Repeat {
                        steps: out.steps,
                        summary: out.summary.unwrap_or_default(),
                        notices: out.notices,
                    });
                    break;
                }
                Verdict::Infra(_) if retry => attempt += 1,
                Verdict::Infra(m) => {
                    outcome = Some(Outcome::Failed {
                        reason: format!(
                            "infrastructure failure in {} attempt(s): {m}",
                            attempt + 1
                        ),
                    });
                    break 'repeats;
                }
                Verdict::Failed(m) => {
                    outcome = Some(Outcome::Failed { reason: m });
                    break 'repeats;
                }
                Verdict::Unsupported(m) => {
                    outcome = Some(Outcome::Skipped {
                        reason: format!("unsupported here: {m}"),
                    });
                    break 'repeats;
                }
                Verdict::TimedOut => {
                    outcome = Some(Outcome::TimedOut {
                        reason: if let Some(job) = &job_id {
                            format!(
                                "repeat {r} ran past its {}s timeout (counted from the job's start); Slurm job {job} was stopped{}",
                                p.timeout_s,
                                if out_escalated {
                                    format!(
                                        " with scancel, and its tasks killed with SIGKILL after the {}s grace period",
                                        shared.grace.as_secs_f64()
                                    )
                                } else {
                                    String::new()
                                }
                            )
                        } else if out_escalated {
                            format!(
                                "repeat {r} ran past its {}s timeout; its process group got SIGTERM, and SIGKILL after the {}s grace period",
                                p.timeout_s,
                                shared.grace.as_secs_f64()
                            )
                        } else {
                            format!(
                                "repeat {r} ran past its {}s timeout; its process group stopped on SIGTERM",
                                p.timeout_s
                            )
                        },
                    });
                    break 'repeats;
                }
                Verdict::Cancelled => {
                    outcome = Some(Outcome::Skipped {
                        reason: "the run was interrupted while this cell ran".into(),
                    });
                    break 'repeats;
                }
                Verdict::Withdrawn => {
                    outcome = Some(Outcome::Skipped {
                        reason: "not run: its Slurm job was withdrawn from the queue before it started, because the run stopped starting cells".into(),
                    });
                    break 'repeats;
                }
            }
        }
    }
    let outcome = outcome.unwrap_or(Outcome::Passed);
    let metrics = if outcome == Outcome::Passed {
        stats::cell_metrics(&cell.params, cell.gpus(), &repeats)
    } else {
        Metrics::new()
    };
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
    }
}

/// A cell that did not run, with why.
fn skipped(cell: &Cell, reason: String) -> CellResult {
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
    }
}

/// Whether a resumed run keeps a cell's earlier result instead of running it again.
fn is_finished(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Passed | Outcome::Failed { .. } | Outcome::TimedOut { .. }
    )
}

fn is_failure(o: &Outcome) -> bool {
    matches!(o, Outcome::Failed { .. } | Outcome::TimedOut { .. })
}

/// Why a cell cannot run as a Slurm job at all, if it cannot. The submitting host's GPUs
/// do not matter (Slurm decides where a job fits); what matters is that the job's tasks
/// match the cell's ranks: one task per GPU.
pub fn unschedulable_on_slurm(cell: &Cell, use_gpus: bool) -> Option<String> {
    let need = cell.gpus();
    if cell.params.workload != Workload::Builtin || need <= 1 {
        return None;
    }
    if launch::ranks(cell) == 1 {
        return Some(format!(
            "a built-in `{}` cell is one process, but Slurm starts one task per GPU ({need}); use parallel ddp or fsdp",
            cell.parallel()
        ));
    }
    (!use_gpus).then(|| {
        format!(
            "needs {need} GPUs; the Slurm partition has none (its cells run on CPU, one rank each)"
        )
    })
}

/// Why a cell cannot run on this host at all, if it cannot.
pub fn unschedulable(cell: &Cell, gpu_slots: usize) -> Option<String> {
    let need = cell.gpus() as usize;
    if gpu_slots > 0 {
        (need > gpu_slots).then(|| format!("needs {need} GPUs; this host offers {gpu_slots}"))
    } else {
        (need > 1 && cell.params.workload == Workload::Builtin).then(|| {
            format!("needs {need} GPUs; this host has none (cells run one at a time on CPU here)")
        })
    }
}

/// UTC now as `20261122T134501Z`.
fn timestamp_id() -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    now.format(&fmt).unwrap_or_else(|_| "run".to_string())
}

/// UTC now in RFC 3339.
fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The run directory and the document to continue: a fresh one, or the one resumed.
///
/// `env` is this host's environment. Locally it is the run's, and a resumed run must
/// have been measured on the same hardware. Under Slurm it is only a fallback until a
/// job reports its node's ([`node_env`]): a resumed run whose environment came from its
/// nodes keeps it (the nodes of this session are checked against it as they report),
/// and any other starts from `env`, marked as the submitting host's.
fn open_run(
    config: &RunConfig,
    expansion: &Expansion,
    env: &Environment,
) -> Result<(PathBuf, RunResults), RunError> {
    let slurm = matches!(config.launcher, Launch::Slurm(_));
    if let Some(dir) = &config.resume {
        let mut doc = RunResults::load(dir).map_err(RunError::Resume)?;
        // Before the hardware: a run of the other launcher ran on other machines anyway,
        // and this is the error that says how to finish it.
        let now = config.launcher.name();
        if let Some(was) = doc.launcher.as_deref().filter(|was| *was != now) {
            return Err(RunError::LauncherChanged {
                path: dir.clone(),
                was: was.to_string(),
                now: now.to_string(),
            });
        }
        if !slurm && doc.environment.hardware_key != env.hardware_key {
            return Err(RunError::HardwareChanged {
                path: dir.clone(),
                was: doc.environment.hardware_key.clone(),
                now: env.hardware_key.clone(),
            });
        }
        let dir = if dir.is_dir() {
            dir.clone()
        } else {
            dir.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let from_nodes = matches!(
            doc.environment_source,
            Some(EnvironmentSource::SlurmNode { .. })
        );
        if !(slurm && from_nodes) {
            doc.environment = env.clone();
            doc.environment_source = slurm.then_some(EnvironmentSource::SubmitHost);
        }
        doc.interrupted = false;
        doc.finished_at = None;
        return Ok((dir, doc));
    }
    let (run_id, dir) = match &config.run_id {
        Some(id) => {
            let dir = config.results_dir.join(id);
            if dir.join(RunResults::FILE).exists() {
                return Err(RunError::Exists { path: dir });
            }
            (id.clone(), dir)
        }
        None => {
            // Two runs started in the same second get distinct folders.
            let base = timestamp_id();
            let mut id = base.clone();
            let mut n = 2;
            while config.results_dir.join(&id).exists() {
                id = format!("{base}-{n}");
                n += 1;
            }
            let dir = config.results_dir.join(&id);
            (id, dir)
        }
    };
    let doc = RunResults {
        schema_version: SCHEMA_VERSION,
        run_id,
        matrix: config.matrix.clone(),
        matrix_name: expansion.name.clone(),
        filters: config.filters.clone(),
        started_at: now_rfc3339(),
        finished_at: None,
        interrupted: false,
        environment: env.clone(),
        environment_source: slurm.then_some(EnvironmentSource::SubmitHost),
        launcher: None,
        cells: vec![],
        dropped: vec![],
    };
    Ok((dir, doc))
}

/// The results being built: the document's header plus one slot per expansion cell.
struct Book {
    dir: PathBuf,
    doc: RunResults,
    slots: Vec<Option<CellResult>>,
    /// Cells of a resumed run that the current expansion no longer has: kept, not run.
    others: Vec<CellResult>,
}

impl Book {
    fn save(&mut self) -> Result<(), RunError> {
        self.doc.cells = self
            .slots
            .iter()
            .flatten()
            .chain(self.others.iter())
            .cloned()
            .collect();
        self.doc.save_atomic(&self.dir).map_err(RunError::Results)
    }
}

/// Runs the expansion's cells and writes the results document (see the module docs).
pub async fn run(
    config: &RunConfig,
    expansion: Expansion,
    inv: GpuInventory,
    env: Environment,
    reporter: &mut dyn Reporter,
) -> Result<RunOutcome, RunError> {
    let run_started = Instant::now();
    let bench_exe = match &config.bench_exe {
        Some(p) => p.clone(),
        None => {
            std::env::current_exe().map_err(|e| launch::LaunchError::CurrentExe(e.to_string()))?
        }
    };
    // Bad templates (and, under Slurm, jobs that cannot be planned: a bad partition name,
    // ranks that do not split over nodes) are bad input: refuse the run before anything
    // starts or is written.
    for cell in &expansion.cells {
        launch::plan(cell, &AttemptCtx::default(), &bench_exe)?;
        if let Launch::Slurm(sl) = &config.launcher {
            if unschedulable_on_slurm(cell, sl.use_gpus).is_none() {
                slurm_plan(cell, &AttemptCtx::default(), &bench_exe, sl, Path::new("/"))?;
            }
        }
    }
    let (dir, mut doc) = open_run(config, &expansion, &env)?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|source| RunError::RunDir {
        path: dir.clone(),
        source,
    })?;
    // Slurm jobs start in the submitting directory, but their output paths and
    // BENCH_RUN_DIR must not depend on it.
    let dir = match &config.launcher {
        Launch::Local => dir,
        Launch::Slurm(_) => std::path::absolute(&dir).map_err(|source| RunError::RunDir {
            path: dir.clone(),
            source,
        })?,
    };
    // (`open_run` refused a resume with the other launcher.)
    doc.launcher = Some(config.launcher.name().to_string());
    // Under Slurm the nodes' reports decide the run's environment; a resumed run whose
    // environment came from its nodes must stay on their hardware.
    let mut node_envs = NodeEnvs::new(
        env.clone(),
        match &doc.environment_source {
            Some(EnvironmentSource::SlurmNode { .. }) => Some(doc.environment.hardware_key.clone()),
            _ => None,
        },
    );
    doc.dropped = expansion
        .dropped
        .iter()
        .map(|d| DroppedCell {
            id: d.cell.id.clone(),
            values: d.cell.values.clone(),
            by: d.by.clone(),
            reason: d.reason.clone(),
        })
        .collect();

    let cells = expansion.cells;
    let mut prior: HashMap<CellId, CellResult> = std::mem::take(&mut doc.cells)
        .into_iter()
        .map(|c| (c.id.clone(), c))
        .collect();
    let mut book = Book {
        dir: dir.clone(),
        doc,
        slots: vec![None; cells.len()],
        others: vec![],
    };
    // Under Slurm this host's GPUs are not where cells run.
    let gpu_slots = match &config.launcher {
        Launch::Local => inv.ids.len(),
        Launch::Slurm(_) => 0,
    };
    let mut pending: Vec<usize> = Vec::new();
    let mut resumed = 0;
    for (i, cell) in cells.iter().enumerate() {
        match prior.remove(&cell.id) {
            Some(r) if is_finished(&r.outcome) => {
                book.slots[i] = Some(r);
                resumed += 1;
            }
            _ => pending.push(i),
        }
    }
    book.others = prior.into_values().collect();
    book.others.sort_by(|a, b| a.id.cmp(&b.id));

    // In flight at once: every free GPU slot locally (or one cell on a CPU host), `--jobs`
    // jobs under Slurm, whose queue decides where and when each runs.
    let jobs = match &config.launcher {
        Launch::Local => config.jobs,
        Launch::Slurm(_) => Some(config.jobs.unwrap_or(slurm_run::DEFAULT_JOBS)),
    };
    reporter.on_event(&RunEvent::RunStarted {
        run_id: book.doc.run_id.clone(),
        run_dir: dir.clone(),
        total: cells.len(),
        resumed,
        gpu_slots,
        slurm: match &config.launcher {
            Launch::Local => None,
            Launch::Slurm(sl) => Some(sl.describe(jobs.unwrap_or(1))),
        },
    });
    for slot in book.slots.iter().flatten() {
        finish(reporter, slot, true);
    }
    book.save()?;

    // Cells this host can never run are settled before anything starts.
    let mut runnable = Vec::with_capacity(pending.len());
    for i in pending {
        let why = match &config.launcher {
            Launch::Local => unschedulable(&cells[i], gpu_slots),
            Launch::Slurm(sl) => unschedulable_on_slurm(&cells[i], sl.use_gpus),
        };
        match why {
            Some(reason) => {
                let r = skipped(&cells[i], reason);
                finish(reporter, &r, false);
                book.slots[i] = Some(r);
                book.save()?;
            }
            None => runnable.push(i),
        }
    }
    let mut pending = runnable;

    let (env_tx, mut env_rx) = mpsc::unbounded_channel::<NodeReport>();
    let shared = Arc::new(Shared {
        run_dir: dir.clone(),
        bench_exe,
        grace: config.grace,
        devices_var: match &config.launcher {
            Launch::Local => inv.vendor.map(|v| v.visible_devices_var().to_string()),
            Launch::Slurm(_) => None,
        },
        slurm: match &config.launcher {
            Launch::Local => None,
            Launch::Slurm(sl) => Some((sl.clone(), Queue::new(sl.poll))),
        },
        node_envs: env_tx,
    });
    // Slots are indices into `inv.ids`; a CPU host has one slot, so one cell at a time.
    // Under Slurm a slot is a job in flight, and every cell takes one.
    let capacity = match &config.launcher {
        Launch::Local => gpu_slots.max(1),
        Launch::Slurm(_) => jobs.unwrap_or(slurm_run::DEFAULT_JOBS).max(1),
    };
    let max_running = jobs.unwrap_or(usize::MAX).max(1);
    let mut free: BTreeSet<usize> = (0..capacity).collect();
    let (cancel_tx, cancel_rx) = watch::channel(Cancel::None);
    // Raised by --fail-fast / --max-fail: queued Slurm jobs are withdrawn.
    let (withdraw_tx, withdraw_rx) = watch::channel(false);
    let (tx, mut rx) = mpsc::unbounded_channel::<RunEvent>();
    let mut running: JoinSet<(usize, Vec<usize>, CellResult)> = JoinSet::new();
    let mut sigint = signal(SignalKind::interrupt()).map_err(RunError::Runtime)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RunError::Runtime)?;
    let mut stop: Option<String> = None;
    let mut interrupted = false;
    let mut failures = 0u32;
    // Set when a resumed run's nodes turn out to be other hardware: the run stops, and
    // ends with this error.
    let mut refused: Option<RunError> = None;

    loop {
        if stop.is_none() {
            // First fit in expansion order.
            let mut k = 0;
            while k < pending.len() {
                let i = pending[k];
                let need = if gpu_slots > 0 {
                    cells[i].gpus() as usize
                } else {
                    1
                };
                if running.len() >= max_running {
                    break;
                }
                if free.len() >= need {
                    pending.remove(k);
                    let taken: Vec<usize> = free.iter().copied().take(need).collect();
                    for t in &taken {
                        free.remove(t);
                    }
                    let devices: Vec<String> = if gpu_slots > 0 {
                        taken.iter().map(|t| inv.ids[*t].clone()).collect()
                    } else {
                        vec![]
                    };
                    reporter.on_event(&RunEvent::CellStarted {
                        id: cells[i].id.clone(),
                        devices: devices.clone(),
                    });
                    let fut = run_cell(
                        cells[i].clone(),
                        devices,
                        shared.clone(),
                        tx.clone(),
                        cancel_rx.clone(),
                        withdraw_rx.clone(),
                    );
                    running.spawn(async move { (i, taken, fut.await) });
                } else {
                    k += 1;
                }
            }
        }
        if running.is_empty() && (pending.is_empty() || stop.is_some()) {
            break;
        }
        tokio::select! {
            Some(ev) = rx.recv() => reporter.on_event(&ev),
            Some(report) = env_rx.recv() => {
                let stop_now = on_node_report(
                    report,
                    &mut node_envs,
                    &mut book,
                    &mut refused,
                    &config.resume,
                    reporter,
                )?;
                if let Some(why) = stop_now {
                    let _ = cancel_tx.send(Cancel::Graceful);
                    let _ = withdraw_tx.send(true);
                    reporter.on_event(&RunEvent::Stopping { reason: why.clone() });
                    stop = Some(why);
                }
            }
            done = running.join_next() => {
                let Some(done) = done else { continue };
                while let Ok(ev) = rx.try_recv() {
                    reporter.on_event(&ev);
                }
                // A job reports its node before its cell ends: decide on it first.
                while let Ok(report) = env_rx.try_recv() {
                    let stop_now = on_node_report(
                        report,
                        &mut node_envs,
                        &mut book,
                        &mut refused,
                        &config.resume,
                        reporter,
                    )?;
                    if let Some(why) = stop_now {
                        let _ = cancel_tx.send(Cancel::Graceful);
                        let _ = withdraw_tx.send(true);
                        reporter.on_event(&RunEvent::Stopping { reason: why.clone() });
                        stop = Some(why);
                    }
                }
                let (i, taken, mut result) = done.map_err(|e| RunError::Runtime(std::io::Error::other(e)))?;
                free.extend(taken);
                if matches!(book.doc.environment_source, Some(EnvironmentSource::SlurmNode { .. })) {
                    if let Some(why) = node_env::foreign_hardware(&result, &book.doc.environment.hardware_key) {
                        // Never compared with (or filed under) another hardware's baselines.
                        // A refused resume keeps it unfinished, for a resume on the right nodes.
                        result.metrics = Metrics::new();
                        result.outcome = if refused.is_some() {
                            Outcome::Skipped { reason: format!("not kept: {why}") }
                        } else {
                            Outcome::Failed { reason: why }
                        };
                    }
                }
                if is_failure(&result.outcome) {
                    failures += 1;
                }
                finish(reporter, &result, false);
                book.slots[i] = Some(result);
                book.save()?;
                if stop.is_none() {
                    let limit = if config.fail_fast { Some(1) } else { config.max_fail };
                    if let Some(n) = limit.filter(|n| failures >= (*n).max(1)) {
                        let why = format!("{failures} failed cell(s) reached the limit of {n}{}", if config.fail_fast { " (--fail-fast)" } else { " (--max-fail)" });
                        reporter.on_event(&RunEvent::Stopping { reason: why.clone() });
                        let _ = withdraw_tx.send(true);
                        stop = Some(why);
                    }
                }
            }
            _ = sigint.recv() => on_signal(&cancel_tx, &mut stop, &mut interrupted, reporter),
            _ = sigterm.recv() => on_signal(&cancel_tx, &mut stop, &mut interrupted, reporter),
        }
    }
    while let Ok(ev) = rx.try_recv() {
        reporter.on_event(&ev);
    }
    if let Some(why) = &stop {
        for i in pending {
            let r = skipped(&cells[i], format!("not run: {why}"));
            finish(reporter, &r, false);
            book.slots[i] = Some(r);
        }
    }
    if matches!(
        book.doc.environment_source,
        Some(EnvironmentSource::SubmitHost)
    ) {
        reporter.on_event(&RunEvent::Warning {
            message: format!(
                "no Slurm job reported its node's environment, so results.json records the submitting host's ({}, hardware key `{}`): the comparison with baselines/{}.yaml may be against hardware other than the nodes' (each job's log under logs/ says why its node did not report)",
                book.doc.environment.host,
                book.doc.environment.hardware_key,
                book.doc.environment.hardware_key
            ),
        });
    }
    book.doc.interrupted = stop.is_some();
    book.doc.finished_at = Some(now_rfc3339());
    book.save()?;

    let (mut passed, mut failed, mut skipped_n) = (0, 0, 0);
    for r in book.slots.iter().flatten() {
        match r.outcome {
            Outcome::Passed => passed += 1,
            Outcome::Failed { .. } | Outcome::TimedOut { .. } => failed += 1,
            Outcome::Skipped { .. } => skipped_n += 1,
        }
    }
    reporter.on_event(&RunEvent::RunFinished {
        passed,
        failed,
        skipped: skipped_n,
        interrupted,
        duration_s: run_started.elapsed().as_secs_f64(),
    });
    if let Some(e) = refused {
        return Err(e);
    }
    Ok(RunOutcome {
        run_dir: dir,
        results: book.doc,
        interrupted,
    })
}

/// Decides on a job's report of its node's environment ([`node_env`]): the first one
/// becomes the run's (saved at once), later ones of other hardware are warned about, and a
/// resumed run on other hardware is refused. Returns why the run must stop, if it must.
fn on_node_report(
    report: NodeReport,
    node_envs: &mut NodeEnvs,
    book: &mut Book,
    refused: &mut Option<RunError>,
    resume: &Option<PathBuf>,
    reporter: &mut dyn Reporter,
) -> Result<Option<String>, RunError> {
    let NodeReport { cell, job_id, env } = report;
    if refused.is_some() {
        // The run is stopping on the first refusal; the rest would only repeat it.
        return Ok(None);
    }
    match node_envs.on_report(&book.doc.environment, &env) {
        Decision::Adopt(adopted) => {
            let was = &book.doc.environment.hardware_key;
            if was != &adopted.hardware_key
                && book.doc.environment_source == Some(EnvironmentSource::SubmitHost)
                && book
                    .slots
                    .iter()
                    .flatten()
                    .chain(book.others.iter())
                    .any(|c| c.outcome == Outcome::Passed)
            {
                reporter.on_event(&RunEvent::Warning {
                    message: format!(
                        "the run being resumed recorded the submitting host's hardware key `{was}`; the nodes' is `{}`, which now applies to its kept cells too",
                        adopted.hardware_key
                    ),
                });
            }
            reporter.on_event(&RunEvent::EnvironmentAdopted {
                hardware_key: adopted.hardware_key.clone(),
                host: adopted.host.clone(),
                job_id: job_id.clone(),
            });
            book.doc.environment = *adopted;
            book.doc.environment_source = Some(EnvironmentSource::SlurmNode {
                job_id,
                cell: cell.to_string(),
            });
            book.save()?;
            Ok(None)
        }
        Decision::Matches => Ok(None),
        Decision::Mismatch { run_key } => {
            reporter.on_event(&RunEvent::Warning {
                message: format!(
                    "Slurm job {job_id} of cell {cell} runs on node {} of hardware `{}`, but this run's hardware key is `{run_key}` (from its first job's node): the cell's measurements will not be compared with `{run_key}` baselines and the cell fails; pin the partition's hardware (e.g. slurm.sbatch_args: [--constraint=...])",
                    env.host, env.hardware_key
                ),
            });
            Ok(None)
        }
        Decision::Refuse { was } => {
            let why = format!(
                "the resumed run was measured on `{was}`, but Slurm job {job_id} runs on {} of hardware `{}`",
                env.host, env.hardware_key
            );
            *refused = Some(RunError::NodesHardwareChanged {
                path: resume.clone().unwrap_or_else(|| book.dir.clone()),
                was,
                now: env.hardware_key,
                job_id,
                host: env.host,
            });
            Ok(Some(why))
        }
    }
}

fn finish(reporter: &mut dyn Reporter, r: &CellResult, resumed: bool) {
    reporter.on_event(&RunEvent::CellFinished {
        id: r.id.clone(),
        outcome: r.outcome.clone(),
        flaky: r.flaky,
        duration_s: r.duration_s,
        tokens_per_s: r.metrics.get("tokens_per_s").map(|m| m.value),
        resumed,
    });
}

/// The first Ctrl-C/SIGTERM stops gracefully; a second one kills running cells now.
fn on_signal(
    cancel: &watch::Sender<Cancel>,
    stop: &mut Option<String>,
    interrupted: &mut bool,
    reporter: &mut dyn Reporter,
) {
    if *interrupted {
        let _ = cancel.send(Cancel::Force);
        reporter.on_event(&RunEvent::Stopping {
            reason: "interrupted again: killing running cells now".into(),
        });
        return;
    }
    *interrupted = true;
    let why = "interrupted (Ctrl-C): stopping running cells, keeping finished ones".to_string();
    let _ = cancel.send(Cancel::Graceful);
    reporter.on_event(&RunEvent::Stopping {
        reason: why.clone(),
    });
    *stop = Some("the run was interrupted before this cell started".into());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{Params, Value};
    use indexmap::IndexMap;

    fn cell(gpus: i64, workload: Workload) -> Cell {
        let mut values = IndexMap::new();
        values.insert("gpus".to_string(), Value::Int(gpus));
        Cell {
            id: CellId::from_values(&values),
            values,
            params: Params {
                workload,
                ..Params::default()
            },
        }
    }

    #[test]
    fn cells_larger_than_the_host_are_unschedulable() {
        assert!(unschedulable(&cell(8, Workload::Builtin), 8).is_none());
        let why = unschedulable(&cell(16, Workload::Builtin), 8).unwrap();
        assert!(
            why.contains("needs 16 GPUs") && why.contains("offers 8"),
            "{why}"
        );
        // CPU host: one-rank cells and command cells run; multi-GPU built-in cells do not.
        assert!(unschedulable(&cell(1, Workload::Builtin), 0).is_none());
        assert!(unschedulable(&cell(2, Workload::Builtin), 0).is_some());
        let cmd = Workload::Command {
            argv: vec!["true".into()],
            env: Default::default(),
        };
        assert!(unschedulable(&cell(2, cmd), 0).is_none());
    }

    #[test]
    fn slurm_ignores_this_hosts_gpus_but_not_the_rank_contract() {
        let ddp = |gpus: i64| {
            let mut c = cell(gpus, Workload::Builtin);
            c.values.insert("parallel".into(), Value::Str("ddp".into()));
            c
        };
        // Far more GPUs than any host: Slurm decides where it fits.
        assert!(unschedulable_on_slurm(&ddp(64), true).is_none());
        assert!(unschedulable_on_slurm(&cell(1, Workload::Builtin), false).is_none());
        // A single-process built-in cell cannot be one task per GPU.
        let why = unschedulable_on_slurm(&cell(4, Workload::Builtin), true).unwrap();
        assert!(why.contains("one task per GPU"), "{why}");
        // A CPU partition cannot run multi-rank built-in cells (they need NCCL); command
        // cells decide for themselves.
        assert!(unschedulable_on_slurm(&ddp(2), false).is_some());
        let cmd = Workload::Command {
            argv: vec!["true".into()],
            env: Default::default(),
        };
        assert!(unschedulable_on_slurm(&cell(2, cmd), false).is_none());
    }

    #[test]
    fn slurm_tasks_run_the_cells_command_without_device_variables() {
        let mut c = cell(
            2,
            Workload::Command {
                argv: vec!["train".into(), "--gpus={gpus}".into()],
                env: [("MODE".to_string(), "{gpus}x".to_string())].into(),
            },
        );
        c.params.timeout_s = 30;
        let ctx = AttemptCtx {
            visible_devices: Some(("CUDA_VISIBLE_DEVICES".into(), "0,1".into())),
            repeat: 1,
            attempt: 2,
            run_dir: "/shared/results/r".into(),
            master_port: 0,
        };
        match slurm_program(&c, &ctx, Path::new("/bin/bench")).unwrap() {
            crate::dist::launch::Program::Command { argv, env } => {
                assert_eq!(argv, vec!["train", "--gpus=2"]);
                assert_eq!(env.get("MODE").map(String::as_str), Some("2x"));
                assert_eq!(env.get("BENCH_REPEAT").map(String::as_str), Some("1"));
                assert_eq!(env.get("BENCH_ATTEMPT").map(String::as_str), Some("2"));
                assert_eq!(
                    env.get("BENCH_RUN_DIR").map(String::as_str),
                    Some("/shared/results/r")
                );
                assert!(!env.contains_key("CUDA_VISIBLE_DEVICES"));
            }
            other => panic!("{other:?}"),
        }
    }

    fn output(t: Termination, steps: usize) -> AttemptOutput {
        AttemptOutput {
            termination: t,
            steps: (0..steps)
                .map(|i| crate::events::StepEvent {
                    step: i as u64,
                    step_time_s: 0.1,
                    tokens: 1,
                    loss: 1.0,
                    warmup: None,
                    rank: None,
                })
                .collect(),
            summary: None,
            notices: vec![],
            error: None,
            tail: vec!["last words".into()],
            duration: Duration::ZERO,
            escalated: false,
            logs: vec![],
        }
    }

    #[test]
    fn attempts_are_judged_by_exit_code_and_progress() {
        use Termination::*;
        assert_eq!(judge(&output(Exited(0), 3)), Verdict::Ok);
        assert!(matches!(judge(&output(Exited(0), 0)), Verdict::Failed(_)));
        assert_eq!(
            judge(&output(Exited(3), 0)),
            Verdict::Unsupported("last words".into())
        );
        for c in [2, 4, 5] {
            assert!(
                matches!(judge(&output(Exited(c), 0)), Verdict::Failed(_)),
                "{c}"
            );
        }
        // A crash before any step is infrastructure (retried); after steps it is the cell's.
        assert!(matches!(judge(&output(Exited(1), 0)), Verdict::Infra(_)));
        assert!(matches!(judge(&output(Exited(1), 2)), Verdict::Failed(_)));
        assert!(matches!(judge(&output(Signaled(9), 2)), Verdict::Infra(_)));
        assert!(matches!(
            judge(&output(SpawnFailed("x".into()), 0)),
            Verdict::Infra(_)
        ));
        assert_eq!(judge(&output(TimedOut, 1)), Verdict::TimedOut);
        assert!(matches!(
            judge(&output(Lost("NODE_FAIL".into()), 2)),
            Verdict::Infra(_)
        ));
        assert_eq!(judge(&output(Withdrawn, 0)), Verdict::Withdrawn);
    }
}

//! The dispatcher: decides which cell runs when, hands each to the run's [`Launcher`], and
//! writes the results document after every cell.
//!
//! Shaped as cargo-nextest's runner: all of the run's state lives in one [`Dispatcher`]
//! value; the loop's `select!` arms only turn what happened (a cell task's progress, a
//! node's report, a finished cell, a signal) into a [`Happening`], and one handler per kind
//! changes the state. Cells start first fit in expansion order on the launcher's slots (a
//! small cell may pass a large one waiting for slots); `--jobs N` caps the cells in
//! flight. The policies live in their own modules: judging attempts and retries
//! ([`judge`], [`cell`]), resume ([`resume`]), and the environment of cells that run
//! elsewhere ([`node_env`]).
//!
//! Stops: `--fail-fast` and `--max-fail N` stop new cells from starting (running cells
//! finish; a launcher withdraws attempts that have not started). The first Ctrl-C (or
//! SIGTERM) stops running cells gracefully and starts nothing new; a second one kills
//! them at once. Finished cells are never lost: the document is saved after each one.

pub mod cell;
pub mod judge;
pub mod node_env;
pub mod resume;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinSet};

use self::cell::{run_cell, skipped, NodeReport, Shared};
use self::node_env::NodeEnvs;
use self::resume::{is_failure, is_finished, now_rfc3339, open_run, Book};
use crate::cell::{Cell, CellId};
use crate::matrix::Expansion;
use crate::results::{CellResult, DroppedCell, Environment, EnvironmentSource, Outcome};
use crate::run::config::{RunConfig, RunOutcome};
use crate::run::error::RunError;
use crate::run::events::RunEvent;
use crate::run::executor::Cancel;
use crate::run::launcher::Launcher;
use crate::run::progress::Reporter;

/// A finished cell task: its index, the slots it held, its result.
type Done = (usize, Vec<usize>, CellResult);

/// What happened, as the loop's `select!` saw it.
enum Happening {
    Progress(RunEvent),
    NodeReport(NodeReport),
    CellDone(Option<Result<Done, JoinError>>),
    Signal,
}

/// The state of one run.
struct Dispatcher<'r> {
    config: &'r RunConfig,
    launcher: Arc<dyn Launcher>,
    reporter: &'r mut dyn Reporter,
    cells: Vec<Cell>,
    /// Indices of cells still to start, in expansion order.
    pending: Vec<usize>,
    /// Free slots of the launcher's capacity.
    free: BTreeSet<usize>,
    max_running: usize,
    running: JoinSet<Done>,
    shared: Arc<Shared>,
    book: Book,
    node_envs: NodeEnvs,
    cancel: watch::Sender<Cancel>,
    /// Raised by --fail-fast / --max-fail: attempts not started yet are withdrawn.
    withdraw: watch::Sender<bool>,
    /// Why the run stopped starting cells.
    stop: Option<String>,
    interrupted: bool,
    failures: u32,
    /// Set when a resumed run's nodes turn out to be other hardware: the run stops, and
    /// ends with this error.
    refused: Option<RunError>,
}

/// Runs the expansion's cells with `launcher` and writes the results document (see the
/// module docs). `env` is this host's environment.
pub(crate) async fn run(
    config: &RunConfig,
    launcher: Arc<dyn Launcher>,
    expansion: Expansion,
    env: Environment,
    reporter: &mut dyn Reporter,
    telemetry: Option<Arc<crate::telemetry::Stream>>,
    host: Option<Arc<crate::telemetry::host::HostSampler>>,
) -> Result<RunOutcome, RunError> {
    let run_started = Instant::now();
    // Cells that cannot even be planned are bad input: refuse the run before anything
    // starts or is written.
    for cell in &expansion.cells {
        launcher.check(cell)?;
    }
    let (dir, mut doc) = open_run(config, launcher.as_ref(), &expansion, &env)?;
    std::fs::create_dir_all(dir.join("logs")).map_err(|source| RunError::RunDir {
        path: dir.clone(),
        source,
    })?;
    // Cells that run elsewhere start in another directory, but their output paths and
    // BENCH_RUN_DIR must not depend on it.
    let dir = if launcher.runs_elsewhere() {
        std::path::absolute(&dir).map_err(|source| RunError::RunDir {
            path: dir.clone(),
            source,
        })?
    } else {
        dir
    };
    // (`open_run` refused a resume with another launcher.)
    doc.launcher = Some(launcher.name().to_string());
    // The nodes' reports decide the run's environment; a resumed run whose environment
    // came from its nodes must stay on their hardware.
    let node_envs = NodeEnvs::new(
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
    let mut pending: Vec<usize> = Vec::new();
    let mut kept = Vec::new();
    for (i, cell) in cells.iter().enumerate() {
        match prior.remove(&cell.id) {
            Some(r) if is_finished(&r.outcome) => kept.push((i, r)),
            _ => pending.push(i),
        }
    }
    let resumed = kept.len();
    let mut others: Vec<CellResult> = prior.into_values().collect();
    others.sort_by(|a, b| a.id.cmp(&b.id));
    let mut book = Book::new(dir.clone(), doc, cells.len(), others)?;
    for (i, r) in kept {
        book.set(i, r)?;
    }

    reporter.on_event(&RunEvent::RunStarted {
        run_id: book.doc.run_id.clone(),
        run_dir: dir.clone(),
        total: cells.len(),
        resumed,
        gpu_slots: launcher.gpu_slots(),
        slurm: launcher.describe(config.jobs),
    });
    for slot in book.results() {
        finish(reporter, slot, true);
    }
    book.save()?;
    for slot in book.results() {
        saved(reporter, &book.doc, slot);
    }

    // Cells the launcher can never run are settled before anything starts.
    let mut runnable = Vec::with_capacity(pending.len());
    for i in pending {
        match launcher.unschedulable(&cells[i]) {
            Some(reason) => {
                let r = skipped(&cells[i], reason);
                finish(reporter, &r, false);
                book.record(i, r.clone())?;
                saved(reporter, &book.doc, &r);
            }
            None => runnable.push(i),
        }
    }

    let (events_tx, mut events_rx) = mpsc::unbounded_channel::<RunEvent>();
    let (env_tx, mut env_rx) = mpsc::unbounded_channel::<NodeReport>();
    let (cancel, cancel_rx) = watch::channel(Cancel::None);
    let (withdraw, withdraw_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        run_dir: dir.clone(),
        grace: config.grace,
        launcher: launcher.clone(),
        events: events_tx,
        node_envs: env_tx,
        cancel: cancel_rx,
        withdraw: withdraw_rx,
        telemetry,
        host,
    });
    let mut d = Dispatcher {
        config,
        free: (0..launcher.capacity(config.jobs)).collect(),
        max_running: launcher
            .max_running(config.jobs)
            .unwrap_or(usize::MAX)
            .max(1),
        launcher,
        reporter,
        cells,
        pending: runnable,
        running: JoinSet::new(),
        shared,
        book,
        node_envs,
        cancel,
        withdraw,
        stop: None,
        interrupted: false,
        failures: 0,
        refused: None,
    };
    let mut sigint = signal(SignalKind::interrupt()).map_err(RunError::Runtime)?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(RunError::Runtime)?;
    loop {
        if d.stop.is_none() {
            d.start_ready();
        }
        if d.running.is_empty() && (d.pending.is_empty() || d.stop.is_some()) {
            break;
        }
        let happening = tokio::select! {
            Some(ev) = events_rx.recv() => Happening::Progress(ev),
            Some(report) = env_rx.recv() => Happening::NodeReport(report),
            done = d.running.join_next() => Happening::CellDone(done),
            _ = sigint.recv() => Happening::Signal,
            _ = sigterm.recv() => Happening::Signal,
        };
        match happening {
            Happening::Progress(ev) => d.reporter.on_event(&ev),
            Happening::NodeReport(report) => d.on_node_report(report)?,
            Happening::CellDone(None) => {}
            Happening::CellDone(Some(done)) => {
                while let Ok(ev) = events_rx.try_recv() {
                    d.reporter.on_event(&ev);
                }
                // A job reports its node before its cell ends: decide on it first.
                while let Ok(report) = env_rx.try_recv() {
                    d.on_node_report(report)?;
                }
                let done = done.map_err(|e| RunError::Runtime(std::io::Error::other(e)))?;
                d.on_cell_done(done)?;
            }
            Happening::Signal => d.on_signal(),
        }
    }
    while let Ok(ev) = events_rx.try_recv() {
        d.reporter.on_event(&ev);
    }
    d.finish_run(run_started)
}

impl Dispatcher<'_> {
    /// Starts pending cells that fit the free slots, first fit in expansion order.
    fn start_ready(&mut self) {
        let mut k = 0;
        while k < self.pending.len() && self.running.len() < self.max_running {
            let i = self.pending[k];
            let need = self.launcher.need(&self.cells[i]);
            if self.free.len() < need {
                k += 1;
                continue;
            }
            self.pending.remove(k);
            let taken: Vec<usize> = self.free.iter().copied().take(need).collect();
            for t in &taken {
                self.free.remove(t);
            }
            let devices = self.launcher.devices(&taken);
            self.reporter.on_event(&RunEvent::CellStarted {
                id: self.cells[i].id.clone(),
                devices: devices.clone(),
            });
            let fut = run_cell(self.cells[i].clone(), devices, self.shared.clone());
            self.running.spawn(async move { (i, taken, fut.await) });
        }
    }

    /// Stops starting cells (and withdraws attempts not started yet) for `why`.
    fn stop_starting(&mut self, why: String) {
        self.reporter.on_event(&RunEvent::Stopping {
            reason: why.clone(),
        });
        let _ = self.withdraw.send(true);
        self.stop = Some(why);
    }

    fn on_node_report(&mut self, report: NodeReport) -> Result<(), RunError> {
        let stop_now = node_env::on_report(
            report,
            &mut self.node_envs,
            &mut self.book,
            &mut self.refused,
            &self.config.resume,
            self.reporter,
        )?;
        if let Some(why) = stop_now {
            let _ = self.cancel.send(Cancel::Graceful);
            self.stop_starting(why);
        }
        Ok(())
    }

    fn on_cell_done(&mut self, (i, taken, mut result): Done) -> Result<(), RunError> {
        self.free.extend(taken);
        node_env::check_cell(&mut result, &self.book.doc, self.refused.is_some());
        if is_failure(&result.outcome) {
            self.failures += 1;
        }
        finish(self.reporter, &result, false);
        self.book.record(i, result.clone())?;
        saved(self.reporter, &self.book.doc, &result);
        if self.stop.is_none() {
            let limit = if self.config.fail_fast {
                Some(1)
            } else {
                self.config.max_fail
            };
            if let Some(n) = limit.filter(|n| self.failures >= (*n).max(1)) {
                let why = format!(
                    "{} failed cell(s) reached the limit of {n}{}",
                    self.failures,
                    if self.config.fail_fast {
                        " (--fail-fast)"
                    } else {
                        " (--max-fail)"
                    }
                );
                self.stop_starting(why);
            }
        }
        Ok(())
    }

    /// The first Ctrl-C/SIGTERM stops gracefully; a second one kills running cells now.
    fn on_signal(&mut self) {
        if self.interrupted {
            let _ = self.cancel.send(Cancel::Force);
            self.reporter.on_event(&RunEvent::Stopping {
                reason: "interrupted again: killing running cells now".into(),
            });
            return;
        }
        self.interrupted = true;
        let _ = self.cancel.send(Cancel::Graceful);
        self.reporter.on_event(&RunEvent::Stopping {
            reason: "interrupted (Ctrl-C): stopping running cells, keeping finished ones".into(),
        });
        self.stop = Some("the run was interrupted before this cell started".into());
    }

    /// Settles the cells that never started, saves the finished document and says so.
    fn finish_run(mut self, run_started: Instant) -> Result<RunOutcome, RunError> {
        if let Some(why) = &self.stop {
            for &i in &self.pending {
                let r = skipped(&self.cells[i], format!("not run: {why}"));
                finish(self.reporter, &r, false);
                self.book.set(i, r)?;
            }
        }
        if let Some(message) = node_env::submit_host_warning(&self.book.doc) {
            self.reporter.on_event(&RunEvent::Warning { message });
        }
        self.book.doc.interrupted = self.stop.is_some();
        // A signal, not --fail-fast: the reports then state the 130 the command returns.
        self.book.doc.interrupted_in = self
            .interrupted
            .then_some(crate::results::Interruption::Cells);
        self.book.doc.finished_at = Some(now_rfc3339());
        self.book.save()?;
        let (mut passed, mut failed, mut skipped_n) = (0, 0, 0);
        for r in self.book.results() {
            match r.outcome {
                Outcome::Passed => passed += 1,
                Outcome::Failed { .. } | Outcome::TimedOut { .. } => failed += 1,
                Outcome::Skipped { .. } => skipped_n += 1,
            }
        }
        self.reporter.on_event(&RunEvent::RunFinished {
            passed,
            failed,
            skipped: skipped_n,
            interrupted: self.interrupted,
            duration_s: run_started.elapsed().as_secs_f64(),
        });
        if let Some(e) = self.refused {
            return Err(e);
        }
        let (run_dir, results) = self.book.finish();
        Ok(RunOutcome {
            run_dir,
            results,
            interrupted: self.interrupted,
            telemetry: None,
        })
    }
}

/// Tells reporters that `r` is on disk now (in `results.json` or its journal).
fn saved(reporter: &mut dyn Reporter, doc: &crate::results::RunResults, r: &CellResult) {
    reporter.on_event(&RunEvent::CellSaved {
        run: Box::new(crate::run::events::RunHeader {
            run_id: doc.run_id.clone(),
            started_at: doc.started_at.clone(),
            matrix_name: doc.matrix_name.clone(),
            environment: doc.environment.clone(),
        }),
        result: Box::new(r.clone()),
    });
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

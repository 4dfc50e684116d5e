//! Resume: the run directory and results document a run continues, and the book of
//! results that is saved after every cell.
//!
//! A fresh run gets a folder named by `--run-id` or a UTC timestamp. `--resume DIR`
//! continues a run: cells it finished (passed, failed, timed out) are kept and not run
//! again; a resume with another launcher, or (locally) on other hardware, is refused.
//! A launcher whose cells run elsewhere keeps an environment its nodes reported
//! ([`super::node_env`]); any other starts from this host's.

use std::path::{Path, PathBuf};

use crate::matrix::Expansion;
use crate::results::{
    matrix_digest, CellResult, Environment, EnvironmentSource, Outcome, RunResults, SCHEMA_VERSION,
};
use crate::run::config::RunConfig;
use crate::run::error::RunError;
use crate::run::launcher::Launcher;

/// Whether a resumed run keeps a cell's earlier result instead of running it again.
pub(crate) fn is_finished(o: &Outcome) -> bool {
    matches!(
        o,
        Outcome::Passed | Outcome::Failed { .. } | Outcome::TimedOut { .. }
    )
}

pub(crate) fn is_failure(o: &Outcome) -> bool {
    matches!(o, Outcome::Failed { .. } | Outcome::TimedOut { .. })
}

/// UTC now as `20261122T134501Z`.
fn timestamp_id() -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    now.format(&fmt).unwrap_or_else(|_| "run".to_string())
}

/// UTC now in RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The run directory and the document to continue: a fresh one, or the one resumed.
///
/// `env` is this host's environment. Locally it is the run's, and a resumed run must
/// have been measured on the same hardware. Under Slurm it is only a fallback until a
/// job reports its node's ([`super::node_env`]): a resumed run whose environment came from its
/// nodes keeps it (the nodes of this session are checked against it as they report),
/// and any other starts from `env`, marked as the submitting host's.
pub(crate) fn open_run(
    config: &RunConfig,
    launcher: &dyn Launcher,
    expansion: &Expansion,
    env: &Environment,
) -> Result<(PathBuf, RunResults), RunError> {
    let elsewhere = launcher.runs_elsewhere();
    // The matrix was read moments ago, so an error here is a race with its deletion; the
    // run then records no digest rather than failing.
    let digest = matrix_digest(&config.matrix).ok();
    if let Some(dir) = &config.resume {
        let mut doc = RunResults::load(dir).map_err(RunError::Resume)?;
        // A different matrix would mix two matrices' cells in one results document.
        if let (Some(was), Some(now)) = (&doc.matrix_sha256, &digest) {
            if was != now {
                return Err(RunError::MatrixChanged {
                    path: dir.clone(),
                    was: doc.matrix.clone(),
                    now: config.matrix.clone(),
                });
            }
        }
        // Before the hardware: a run of the other launcher ran on other machines anyway,
        // and this is the error that says how to finish it.
        let now = launcher.name();
        if let Some(was) = doc.launcher.as_deref().filter(|was| *was != now) {
            return Err(RunError::LauncherChanged {
                path: dir.clone(),
                was: was.to_string(),
                now: now.to_string(),
            });
        }
        if !elsewhere && doc.environment.hardware_key != env.hardware_key {
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
        if !(elsewhere && from_nodes) {
            doc.environment = env.clone();
            doc.environment_source = elsewhere.then_some(EnvironmentSource::SubmitHost);
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
        matrix_sha256: digest,
        filters: config.filters.clone(),
        started_at: now_rfc3339(),
        finished_at: None,
        interrupted: false,
        environment: env.clone(),
        environment_source: elsewhere.then_some(EnvironmentSource::SubmitHost),
        launcher: None,
        cells: vec![],
        dropped: vec![],
    };
    Ok((dir, doc))
}

/// The results being built: the document's header plus one slot per expansion cell.
pub(crate) struct Book {
    pub dir: PathBuf,
    pub doc: RunResults,
    pub slots: Vec<Option<CellResult>>,
    /// Cells of a resumed run that the current expansion no longer has: kept, not run.
    pub others: Vec<CellResult>,
}

impl Book {
    pub(crate) fn save(&mut self) -> Result<(), RunError> {
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

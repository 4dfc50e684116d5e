//! Keeps the history of every finished cell: a run reporter ([`crate::run::progress::Reporter`])
//! that writes each cell into the store as soon as `results.json` has it
//! ([`RunEvent::CellSaved`]), so a nightly killed halfway keeps the history of the cells
//! it finished. It only consumes events; a failed write is a warning (the cell is in
//! `results.json` and the run is written whole again at its end).

use crate::run::events::RunEvent;
use crate::run::progress::Reporter;

use super::record::{CellRecord, RunRecord};
use super::store::History;

/// Records each saved cell into `store`.
pub(crate) struct Recorder<'a> {
    pub store: &'a mut History,
    pub branch: Option<String>,
    warned: bool,
}

impl<'a> Recorder<'a> {
    pub(crate) fn new(store: &'a mut History, branch: Option<String>) -> Self {
        Recorder {
            store,
            branch,
            warned: false,
        }
    }
}

impl Reporter for Recorder<'_> {
    fn on_event(&mut self, event: &RunEvent) {
        let RunEvent::CellSaved { run, result } = event else {
            return;
        };
        let header = crate::results::RunResults {
            schema_version: crate::results::SCHEMA_VERSION,
            run_id: run.run_id.clone(),
            matrix: Default::default(),
            matrix_name: run.matrix_name.clone(),
            matrix_sha256: None,
            filters: Vec::new(),
            started_at: run.started_at.clone(),
            finished_at: None,
            interrupted: false,
            interrupted_in: None,
            environment: run.environment.clone(),
            environment_source: None,
            launcher: None,
            cells: Vec::new(),
            dropped: Vec::new(),
        };
        let rec = RunRecord::from_results(&header, self.branch.clone(), None);
        let cell = CellRecord::from_result(result);
        if let Err(e) = self.store.record_cells(&rec, &[cell]) {
            if !self.warned {
                eprintln!(
                    "warning: cannot record cell {} in the history yet ({e}); the run is recorded whole at its end",
                    result.id
                );
                self.warned = true;
            }
        }
    }
}

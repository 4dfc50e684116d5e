//! Writing one run: inside the transaction [`super::History`] opens, any earlier copy of
//! the run is deleted, then its row, cells and metrics are written.

use super::backend::{json_floats, now, Backend, Sql};
use crate::history::record::{CellRecord, RunRecord};

/// The hardware key a run id is stored under, when the store has the run.
pub(super) fn stored_key(b: &mut dyn Backend, run_id: &str) -> Result<Option<String>, String> {
    let rows = b.query(
        "SELECT hardware_key FROM bench_runs WHERE run_id = ?",
        &[Sql::Text(run_id.into())],
    )?;
    Ok(rows
        .first()
        .and_then(|r| r.first())
        .and_then(|v| v.text().map(str::to_string)))
}

/// Refuses to write `run` over a run of the same id from another hardware key: two jobs of
/// one workflow (a CPU job and an H100 job) given the same `--run-id` would otherwise
/// leave only the second one's cells in a shared store.
fn refuse_other_hardware(b: &mut dyn Backend, run: &RunRecord) -> Result<(), String> {
    match stored_key(b, &run.run_id)? {
        Some(k) if k != run.hardware_key => Err(collision(&run.run_id, &k, &run.hardware_key)),
        _ => Ok(()),
    }
}

/// The message for a run id already stored under another hardware key.
pub(crate) fn collision(run_id: &str, stored: &str, this: &str) -> String {
    format!(
        "run id {} is already in the history for hardware {}, and this run is on {}: a run id names one run of one hardware; give each hardware job its own --run-id (the CI templates add the hardware key)",
        crate::sanitize::clean(run_id),
        crate::sanitize::clean(stored),
        crate::sanitize::clean(this)
    )
}

pub(super) fn write_run(b: &mut dyn Backend, run: &RunRecord) -> Result<(), String> {
    refuse_other_hardware(b, run)?;
    let id = Sql::Text(run.run_id.clone());
    b.execute(
        "DELETE FROM bench_metrics WHERE run_id = ?",
        std::slice::from_ref(&id),
    )?;
    b.execute(
        "DELETE FROM bench_cells WHERE run_id = ?",
        std::slice::from_ref(&id),
    )?;
    upsert_run_row(b, run)?;
    for cell in &run.cells {
        write_cell(b, &run.run_id, cell)?;
    }
    Ok(())
}

/// Writes the run's row and the given cells of it, replacing earlier copies of those
/// cells only: a cell is recorded as soon as it finishes, so a run killed halfway keeps the
/// history of its finished cells.
pub(super) fn write_cells(
    b: &mut dyn Backend,
    run: &RunRecord,
    cells: &[CellRecord],
) -> Result<(), String> {
    refuse_other_hardware(b, run)?;
    upsert_run_row(b, run)?;
    for cell in cells {
        let key = [
            Sql::Text(run.run_id.clone()),
            Sql::Text(cell.cell_id.clone()),
        ];
        b.execute(
            "DELETE FROM bench_metrics WHERE run_id = ? AND cell_id = ?",
            &key,
        )?;
        b.execute(
            "DELETE FROM bench_cells WHERE run_id = ? AND cell_id = ?",
            &key,
        )?;
        write_cell(b, &run.run_id, cell)?;
    }
    Ok(())
}

pub(super) fn upsert_run_row(b: &mut dyn Backend, run: &RunRecord) -> Result<(), String> {
    let id = Sql::Text(run.run_id.clone());
    let exists = !b
        .query(
            "SELECT 1 FROM bench_runs WHERE run_id = ?",
            std::slice::from_ref(&id),
        )?
        .is_empty();
    let v = &run.versions;
    let switches = serde_json::to_string(&run.switches).map_err(|e| e.to_string())?;
    let telemetry = match &run.telemetry {
        Some(t) => Sql::Text(serde_json::to_string(t).map_err(|e| e.to_string())?),
        None => Sql::Null,
    };
    let mut values = vec![
        Sql::Text(run.started_at.clone()),
        Sql::opt_text(&run.finished_at),
        Sql::opt_text(&run.commit),
        Sql::Int(run.git_dirty as i64),
        Sql::opt_text(&run.branch),
        Sql::Text(run.hardware_key.clone()),
        Sql::Text(run.host.clone()),
        Sql::Text(run.matrix_name.clone()),
        Sql::Text(v.bench.clone()),
        Sql::opt_text(&v.libtorch),
        Sql::opt_text(&v.driver),
        Sql::opt_text(&v.cuda),
        Sql::opt_text(&v.rocm),
        Sql::opt_text(&v.nccl),
        Sql::opt_text(&v.gpu_model),
        Sql::Text(switches),
        telemetry,
        Sql::Int(run.throttled() as i64),
        Sql::Text(now()),
    ];
    const COLS: &str = "started_at, finished_at, commit_sha, git_dirty, branch, hardware_key, host, matrix_name, bench_version, libtorch, driver, cuda, rocm, nccl, gpu_model, switches, telemetry, throttled, recorded_at";
    if exists {
        let set: Vec<String> = COLS.split(", ").map(|c| format!("{c} = ?")).collect();
        values.push(id);
        b.execute(
            &format!("UPDATE bench_runs SET {} WHERE run_id = ?", set.join(", ")),
            &values,
        )?;
    } else {
        values.insert(0, id);
        let marks = vec!["?"; values.len()].join(", ");
        b.execute(
            &format!("INSERT INTO bench_runs (run_id, {COLS}) VALUES ({marks})"),
            &values,
        )?;
    }
    Ok(())
}

pub(super) fn write_cell(
    b: &mut dyn Backend,
    run_id: &str,
    cell: &CellRecord,
) -> Result<(), String> {
    let telemetry = match &cell.telemetry {
        Some(t) => Sql::Text(serde_json::to_string(t).map_err(|e| e.to_string())?),
        None => Sql::Null,
    };
    let context = serde_json::to_string(&cell.context).map_err(|e| e.to_string())?;
    b.execute(
        "INSERT INTO bench_cells (run_id, cell_id, status, loss_curve, telemetry, context) VALUES (?, ?, ?, ?, ?, ?)",
        &[
            Sql::Text(run_id.into()),
            Sql::Text(cell.cell_id.clone()),
            Sql::Text(cell.status.clone()),
            Sql::Text(json_floats(&cell.loss_curve)),
            telemetry,
            Sql::Text(context),
        ],
    )?;
    for m in &cell.metrics {
        b.execute(
            "INSERT INTO bench_metrics (run_id, cell_id, metric, value, rel_spread, samples) VALUES (?, ?, ?, ?, ?, ?)",
            &[
                Sql::Text(run_id.into()),
                Sql::Text(cell.cell_id.clone()),
                Sql::Text(m.name.clone()),
                Sql::Real(m.value),
                Sql::Real(if m.rel_spread.is_finite() { m.rel_spread } else { 0.0 }),
                Sql::Text(json_floats(&m.samples)),
            ],
        )?;
    }
    Ok(())
}

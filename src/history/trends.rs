//! The trends the reports draw, read from the store itself: per cell of a run, its earlier
//! runs' tokens/s (and tokens/s per GPU, and tokens per joule where its GPUs' power was
//! read) on the run's hardware key, oldest first, this run
//! last, with the change points E-divisive finds ([`super::changepoint`]) marked. This is
//! the store's side of the seam [`crate::trend`]; `bench matrix --history` is
//! enough for `report.html` and the Markdown charts to show them.

use crate::results::RunResults;
use crate::trend::{TrendPoint, TrendSeries, Trends};

use super::changepoint::{e_divisive, Settings};
use super::error::HistoryError;
use super::store::History;

/// At most this many recent runs per series: a chart, not an archive.
pub(crate) const MAX_POINTS: usize = 60;

/// Opens the store at `location` for reading and builds the trends of `results`' cells.
/// A SQLite file that does not exist has no trends (it is not created).
pub fn for_run(location: &str, results: &RunResults) -> Result<Trends, HistoryError> {
    if !location.contains("://") && !std::path::Path::new(location).exists() {
        return Ok(Trends::default());
    }
    let mut store = super::store::open(location)?;
    of_run(&mut store, results)
}

/// The trends of `results`' passed cells in `store`.
pub(crate) fn of_run(store: &mut History, results: &RunResults) -> Result<Trends, HistoryError> {
    let key = &results.environment.hardware_key;
    let mut series = Vec::new();
    for cell in &results.cells {
        for metric in ["tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_joule"] {
            if !cell.metrics.contains_key(metric) {
                continue;
            }
            let trend = store.trend(cell.id.as_str(), key, metric)?;
            // Confirming re-runs are evidence for their own run, not points of the trend; a
            // bisection's probes and the side-by-side pairs measure commits, not nights.
            let trend: Vec<_> = trend
                .into_iter()
                .filter(|p| !super::gate::is_confirm_run(&p.run_id))
                .filter(|p| p.branch.as_deref() != Some(super::record::PROBE_BRANCH))
                .filter(|p| p.started_at <= results.started_at || p.run_id == results.run_id)
                .collect();
            let trend = &trend[trend.len().saturating_sub(MAX_POINTS)..];
            if trend.len() < 2 {
                continue;
            }
            let values: Vec<f64> = trend.iter().map(|p| p.value).collect();
            let cps = e_divisive(&values, &Settings::default());
            let points = trend
                .iter()
                .enumerate()
                .map(|(i, p)| TrendPoint {
                    time: p.started_at.clone(),
                    commit: p.commit.clone(),
                    value: p.value,
                    change_point: cps.iter().any(|c| c.index == i),
                })
                .collect();
            series.push(TrendSeries {
                cell: cell.id.as_str().to_string(),
                metric: metric.to_string(),
                points,
            });
        }
    }
    Ok(Trends { series })
}

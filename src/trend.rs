//! Trends over earlier runs, as the reports draw them: per cell and metric, a list of
//! `(run time, commit, value, change point)` in time order.
//!
//! This module owns only the shape, and reading it from a JSON file (`bench report html
//! --history FILE`). It is the seam to the run history (`src/history/`): whatever stores
//! runs turns its rows and detected change points into [`Trends`], and the Markdown comment
//! and the HTML report draw them without knowing where they came from. It lives below both
//! (it imports neither), so the store builds what the reports draw without either importing
//! the other. The file form is
//!
//! ```json
//! {"series": [{"cell": "gpt2-125m.bf16.1gpu.single.base", "metric": "tokens_per_s_per_gpu",
//!   "points": [{"time": "2026-11-20T02:00:00Z", "commit": "5e6f7a8", "value": 338000.0,
//!               "change_point": false}]}]}
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One earlier run's value of one metric of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrendPoint {
    /// When the run started (RFC 3339), as the history records it.
    pub time: String,
    /// The commit the run measured, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub value: f64,
    /// True when the history's change-point detection places a shift at this run.
    #[serde(default)]
    pub change_point: bool,
}

/// The history of one metric of one cell, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrendSeries {
    pub cell: String,
    pub metric: String,
    pub points: Vec<TrendPoint>,
}

/// Every series the reports may draw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trends {
    pub series: Vec<TrendSeries>,
}

/// Errors reading a trend file, each naming the file (and line and column when malformed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TrendError {
    #[error("{path}: cannot read history: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: malformed history: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

impl Trends {
    /// The series of `metric` of `cell`, when there is one with at least one point.
    pub(crate) fn get(&self, cell: &str, metric: &str) -> Option<&TrendSeries> {
        self.series
            .iter()
            .find(|s| s.cell == cell && s.metric == metric && !s.points.is_empty())
    }

    /// Reads a trend file (the JSON form in the module docs).
    pub(crate) fn load(path: &Path) -> Result<Trends, TrendError> {
        let text = crate::files::read_to_string_bounded(path, crate::files::MAX_RESULTS_BYTES)
            .map_err(|source| TrendError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        serde_json::from_str(&text).map_err(|e| TrendError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_file_names_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.json");
        std::fs::write(&path, "{\"series\": [\n  {\"cell\": 3}]}").unwrap();
        let err = Trends::load(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:2:", path.display())), "{err}");
        std::fs::write(
            &path,
            r#"{"series":[{"cell":"a","metric":"mfu","points":[{"time":"t","value":0.4}]}]}"#,
        )
        .unwrap();
        let t = Trends::load(&path).unwrap();
        assert_eq!(t.get("a", "mfu").unwrap().points[0].commit, None);
        assert!(t.get("a", "tokens_per_s").is_none());
    }
}

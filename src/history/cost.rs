//! What a run's verdict cost, in GPU-seconds ([`Cost`]), and how the history keeps it
//! (`bench_costs`, schema 6): the run's total, each shard's share when the run was
//! sharded, so that the shards of one run add up and a shard recorded again (a retried CI
//! job, `--resume`) replaces its own share instead of being counted twice, and the cells
//! whose verdict took more than measuring them ([`CellCost`]), for the site's run pages.
//!
//! It lives in the history, below the reports that state it (summary.md and report.json
//! through `crate::report::input`), because the store parses and checks the kept figures
//! on the way out, as it checks every stored value, and `bench site` shows them.

use std::collections::BTreeMap;

/// What a run's verdict cost, GPU-seconds (one per second of a CPU cell): measuring the
/// cells, confirming the flagged ones (side by side, and the re-runs of what the pairs could
/// not measure), and triaging the findings (bisections and traced steps).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    pub measuring_gpu_s: f64,
    pub pairs_gpu_s: f64,
    pub reruns_gpu_s: f64,
    pub triage_gpu_s: f64,
}

impl Cost {
    /// Every GPU-second the verdict took.
    pub fn total(&self) -> f64 {
        self.measuring_gpu_s + self.pairs_gpu_s + self.reruns_gpu_s + self.triage_gpu_s
    }

    /// What the verdict took beyond measuring: confirming (pairs, re-runs) and triage. The
    /// cells with any are the ones the reports and the site list, costliest first.
    pub fn beyond_measuring(&self) -> f64 {
        self.total() - self.measuring_gpu_s
    }

    /// The four parts in the order every table shows them: measuring, side by side,
    /// re-runs, triage.
    pub fn parts(&self) -> [f64; 4] {
        [
            self.measuring_gpu_s,
            self.pairs_gpu_s,
            self.reruns_gpu_s,
            self.triage_gpu_s,
        ]
    }

    /// The total against the measuring alone (`None` when nothing was measured, where a
    /// ratio would be a division by zero).
    pub fn times_the_run(&self) -> Option<f64> {
        (self.measuring_gpu_s > 0.0).then(|| self.total() / self.measuring_gpu_s)
    }

    /// `measuring 148 GPU-s, confirming 61 (side by side 61, re-runs 0), triage 22: 1.56x the run`.
    pub fn line(&self) -> String {
        let times = self
            .times_the_run()
            .map(|x| format!(": {x:.2}x the run"))
            .unwrap_or_default();
        format!(
            "measuring {:.0} GPU-s, confirming {:.0} (side by side {:.0}, re-runs {:.0}), triage {:.0}{times}",
            self.measuring_gpu_s,
            self.pairs_gpu_s + self.reruns_gpu_s,
            self.pairs_gpu_s,
            self.reruns_gpu_s,
            self.triage_gpu_s
        )
    }

    /// The sentence summary.md and the site's run page state: `Cost of this verdict: ...`.
    pub fn sentence(&self) -> String {
        format!("Cost of this verdict: {}.", self.line())
    }

    /// Why these figures cannot be what a run cost: each part must be a finite number of
    /// GPU-seconds within [`crate::bounds::check_gpu_seconds`]'s range. A row written by
    /// hand or by another tool (`-5`, `1e308`) is skipped on the way out of the store, never
    /// shown.
    pub fn implausible(&self) -> Option<String> {
        [
            ("measuring_gpu_s", self.measuring_gpu_s),
            ("pairs_gpu_s", self.pairs_gpu_s),
            ("reruns_gpu_s", self.reruns_gpu_s),
            ("triage_gpu_s", self.triage_gpu_s),
        ]
        .into_iter()
        .find_map(|(name, v)| crate::bounds::check_gpu_seconds(name, v).err())
    }

    pub(crate) fn plus(self, o: Cost) -> Cost {
        Cost {
            measuring_gpu_s: self.measuring_gpu_s + o.measuring_gpu_s,
            pairs_gpu_s: self.pairs_gpu_s + o.pairs_gpu_s,
            reruns_gpu_s: self.reruns_gpu_s + o.reruns_gpu_s,
            triage_gpu_s: self.triage_gpu_s + o.triage_gpu_s,
        }
    }
}

/// What one cell's verdict cost: measuring it, its pairs, its re-runs, and the bisections
/// that searched it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CellCost {
    pub cell_id: String,
    #[serde(flatten)]
    pub cost: Cost,
}

impl CellCost {
    /// Whether the verdict took more than measuring the cell (pairs, re-runs or triage):
    /// the cells the reports and the site list.
    pub fn confirmed(&self) -> bool {
        self.cost.beyond_measuring() > 0.0
    }
}

/// The most cells a run's row keeps (per shard): the costliest confirmations. A run
/// confirms a few cells a night, and the budget bounds them; the bound keeps a forged or
/// runaway run's row small.
pub(crate) const MAX_KEPT_CELLS: usize = 64;

/// The most cells a run's row keeps over all its shards (the costliest).
pub(crate) const MAX_ROW_CELLS: usize = 4 * MAX_KEPT_CELLS;

/// The longest cell id a kept row may name (a cell id is a few axis values joined by dots).
pub(crate) const MAX_CELL_ID: usize = 1024;

/// A run's row of `bench_costs`, as JSON: the run's total at the top (what every reader
/// takes), under `shards` each shard's own figures (`"2/4"`), from which the total of a
/// sharded run is summed, and under `cells` the cells whose verdict took more than
/// measuring them, each with the shard that recorded it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Kept {
    #[serde(flatten)]
    pub total: Cost,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shards: BTreeMap<String, Cost>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cells: BTreeMap<String, KeptCell>,
}

/// One cell of [`Kept::cells`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct KeptCell {
    /// The shard that measured it (`"2/4"`), so that the shard recorded again replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    #[serde(flatten)]
    pub cost: Cost,
}

/// The cells of `cells` a row keeps: those whose verdict took more than measuring them, the
/// costliest first, at most [`MAX_KEPT_CELLS`].
fn kept_cells(cells: &[CellCost]) -> Vec<&CellCost> {
    let mut kept: Vec<&CellCost> = cells.iter().filter(|c| c.confirmed()).collect();
    kept.sort_by(|a, b| {
        b.cost
            .beyond_measuring()
            .total_cmp(&a.cost.beyond_measuring())
    });
    kept.truncate(MAX_KEPT_CELLS);
    kept
}

impl Kept {
    /// The row of a run whose share `shard` (`None`: the whole run) cost `cost`, given the
    /// row `kept` for the run already (`None`: none). A whole run replaces what was kept; a
    /// shard replaces its own share and keeps the other shards' of the same split (a kept
    /// row of another split, or one that does not read, is an earlier run under the same
    /// id, replaced), and the total is their sum.
    /// `cells` are the cells this run (or shard) measured, with what each cost; the row
    /// keeps those of [`kept_cells`], replacing what the same run (or shard) kept before.
    pub(crate) fn join(
        kept: Option<&str>,
        shard: Option<crate::shard::Shard>,
        cost: Cost,
        cells: &[CellCost],
    ) -> Kept {
        let label = shard.map(|s| s.to_string());
        let ours = kept_cells(cells).into_iter().map(|c| {
            let cell = KeptCell {
                shard: label.clone(),
                cost: c.cost,
            };
            (c.cell_id.clone(), cell)
        });
        let Some(shard) = shard else {
            return Kept {
                total: cost,
                shards: BTreeMap::new(),
                cells: ours.collect(),
            };
        };
        let split = format!("/{}", shard.count);
        let before = kept
            .and_then(|k| serde_json::from_str::<Kept>(k).ok())
            .unwrap_or_default();
        let mut shards = before.shards;
        shards.retain(|label, _| label.ends_with(&split));
        shards.insert(shard.to_string(), cost);
        // The other shards' cells of the same split stay; this shard's earlier ones go.
        let mut cells = before.cells;
        cells.retain(|_, c| {
            c.shard
                .as_deref()
                .is_some_and(|s| s.ends_with(&split) && Some(s) != label.as_deref())
        });
        cells.extend(ours);
        if cells.len() > MAX_ROW_CELLS {
            let mut by_cost: Vec<(String, KeptCell)> = cells.into_iter().collect();
            by_cost.sort_by(|a, b| {
                b.1.cost
                    .beyond_measuring()
                    .total_cmp(&a.1.cost.beyond_measuring())
            });
            by_cost.truncate(MAX_ROW_CELLS);
            cells = by_cost.into_iter().collect();
        }
        Kept {
            total: shards.values().fold(Cost::default(), |a, c| a.plus(*c)),
            shards,
            cells,
        }
    }
}

/// What a run's verdict cost as the history kept it: the total, and the cells whose
/// verdict took more than measuring them (costliest first).
#[derive(Debug, Clone, PartialEq)]
pub struct RunCost {
    pub total: Cost,
    pub cells: Vec<CellCost>,
}

impl RunCost {
    /// A kept row read back, or why it cannot be a run's cost: the total's figures and each
    /// cell's must be GPU-seconds a run spends ([`Cost::implausible`]), each cell's id a
    /// cell id, and no more cells than a row keeps.
    pub(crate) fn read(raw: &str) -> Result<RunCost, String> {
        let kept: Kept =
            serde_json::from_str(raw).map_err(|e| format!("does not read as a cost: {e}"))?;
        if let Some(why) = kept.total.implausible() {
            return Err(why);
        }
        if kept.cells.len() > MAX_ROW_CELLS {
            return Err(format!(
                "{} cells, more than a run's cost keeps ({MAX_ROW_CELLS})",
                kept.cells.len()
            ));
        }
        let mut cells = Vec::with_capacity(kept.cells.len());
        for (id, c) in kept.cells {
            // The site shows a cell id as text; one no cell can have (a control character,
            // a runaway length) marks a row written by hand or by another tool.
            if id.is_empty() || id.len() > MAX_CELL_ID || id.chars().any(char::is_control) {
                let shown =
                    crate::sanitize::inline(&id.chars().take(64).collect::<String>()).into_owned();
                return Err(format!("cells: \"{shown}\" is no cell id"));
            }
            if let Some(why) = c.cost.implausible() {
                return Err(format!("cells.{id}: {why}"));
            }
            cells.push(CellCost {
                cell_id: id,
                cost: c.cost,
            });
        }
        cells.sort_by(|a, b| {
            b.cost
                .beyond_measuring()
                .total_cmp(&a.cost.beyond_measuring())
                .then(a.cell_id.cmp(&b.cell_id))
        });
        Ok(RunCost {
            total: kept.total,
            cells,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Shard;

    fn cost(m: f64, p: f64, r: f64, t: f64) -> Cost {
        Cost {
            measuring_gpu_s: m,
            pairs_gpu_s: p,
            reruns_gpu_s: r,
            triage_gpu_s: t,
        }
    }

    #[test]
    fn the_line_says_each_part_and_the_ratio() {
        let c = cost(148.0, 61.0, 0.0, 22.0);
        assert_eq!(
            c.sentence(),
            "Cost of this verdict: measuring 148 GPU-s, confirming 61 (side by side 61, re-runs 0), triage 22: 1.56x the run."
        );
        assert_eq!(cost(0.0, 3.0, 0.0, 0.0).times_the_run(), None);
        assert!(!cost(0.0, 3.0, 0.0, 0.0).line().contains("x the run"));
    }

    #[test]
    fn shards_add_up_and_a_shard_recorded_again_replaces_its_share() {
        let s = |i| Some(Shard { index: i, count: 2 });
        let one = serde_json::to_string(&Kept::join(None, s(1), cost(100.0, 10.0, 0.0, 5.0), &[]))
            .unwrap();
        let both = Kept::join(Some(&one), s(2), cost(50.0, 0.0, 4.0, 0.0), &[]);
        assert_eq!(both.total, cost(150.0, 10.0, 4.0, 5.0));
        // Shard 2 retried: its share is replaced, not added.
        let both = serde_json::to_string(&both).unwrap();
        let again = Kept::join(Some(&both), s(2), cost(60.0, 0.0, 0.0, 0.0), &[]);
        assert_eq!(again.total, cost(160.0, 10.0, 0.0, 5.0));
        // A whole run under the same id replaces every share; a shard of another split
        // starts over.
        let whole = Kept::join(Some(&both), None, cost(7.0, 0.0, 0.0, 0.0), &[]);
        assert!(whole.shards.is_empty());
        assert_eq!(whole.total.total(), 7.0);
        let other = Kept::join(
            Some(&both),
            Some(Shard { index: 1, count: 3 }),
            cost(1.0, 0.0, 0.0, 0.0),
            &[],
        );
        assert_eq!(other.shards.len(), 1);
        assert_eq!(other.total.total(), 1.0);
        // The row reads back as the run's total.
        let row: Cost = serde_json::from_str(&both).unwrap();
        assert_eq!(row, cost(150.0, 10.0, 4.0, 5.0));
    }

    fn cell(id: &str, c: Cost) -> CellCost {
        CellCost {
            cell_id: id.into(),
            cost: c,
        }
    }

    #[test]
    fn a_row_keeps_the_costliest_confirmed_cells_and_reads_them_back() {
        // Only cells whose verdict took more than measuring them, costliest first.
        let cells = [
            cell("quiet", cost(10.0, 0.0, 0.0, 0.0)),
            cell("paired", cost(10.0, 30.0, 0.0, 0.0)),
            cell("bisected", cost(10.0, 20.0, 0.0, 90.0)),
        ];
        let row =
            serde_json::to_string(&Kept::join(None, None, cost(30.0, 50.0, 0.0, 90.0), &cells))
                .unwrap();
        let read = RunCost::read(&row).unwrap();
        assert_eq!(read.total, cost(30.0, 50.0, 0.0, 90.0));
        let ids: Vec<&str> = read.cells.iter().map(|c| c.cell_id.as_str()).collect();
        assert_eq!(ids, ["bisected", "paired"]);
        // A runaway run keeps its MAX_KEPT_CELLS costliest.
        let many: Vec<CellCost> = (0..200)
            .map(|i| cell(&format!("c{i:03}"), cost(1.0, f64::from(i), 0.0, 0.0)))
            .collect();
        let kept = Kept::join(None, None, cost(1.0, 1.0, 0.0, 0.0), &many);
        assert_eq!(kept.cells.len(), MAX_KEPT_CELLS);
        assert!(kept.cells.contains_key("c199") && !kept.cells.contains_key("c000"));
        // Shards of one split add their cells up to MAX_ROW_CELLS, the costliest kept.
        let mut row = None::<String>;
        for i in 1..=8 {
            let ours: Vec<CellCost> = (0..MAX_KEPT_CELLS)
                .map(|j| cell(&format!("s{i}c{j}"), cost(1.0, f64::from(i), 0.0, 0.0)))
                .collect();
            let shard = Shard { index: i, count: 8 };
            let k = Kept::join(row.as_deref(), Some(shard), cost(1.0, 1.0, 0.0, 0.0), &ours);
            row = Some(serde_json::to_string(&k).unwrap());
        }
        let read = RunCost::read(row.as_deref().unwrap()).unwrap();
        assert_eq!(read.cells.len(), MAX_ROW_CELLS);
        assert!(
            read.cells.iter().all(|c| c.cost.pairs_gpu_s >= 5.0),
            "the cheapest went first"
        );
    }

    #[test]
    fn a_forged_cell_makes_the_row_unreadable() {
        let forged = |cells: &str| {
            format!(
                r#"{{"measuring_gpu_s":1,"pairs_gpu_s":0,"reruns_gpu_s":0,"triage_gpu_s":0,"cells":{cells}}}"#
            )
        };
        let figures = r#"{"measuring_gpu_s":1,"pairs_gpu_s":2,"reruns_gpu_s":0,"triage_gpu_s":0}"#;
        assert!(RunCost::read(&forged(&format!(r#"{{"ok.cell":{figures}}}"#))).is_ok());
        let e =
            RunCost::read(&forged(&format!(r#"{{"a\u001b]0;x\u0007":{figures}}}"#))).unwrap_err();
        assert!(e.contains(r"a\x1b]0;x\x07") && !e.contains('\x1b'), "{e}");
        let long = "x".repeat(MAX_CELL_ID + 1);
        assert!(RunCost::read(&forged(&format!(r#"{{"{long}":{figures}}}"#))).is_err());
        let negative =
            r#"{"a":{"measuring_gpu_s":1,"pairs_gpu_s":-2,"reruns_gpu_s":0,"triage_gpu_s":0}}"#;
        assert!(RunCost::read(&forged(negative))
            .unwrap_err()
            .contains("cells.a"));
        let many: Vec<String> = (0..=MAX_ROW_CELLS)
            .map(|i| format!(r#""c{i}":{figures}"#))
            .collect();
        let e = RunCost::read(&forged(&format!("{{{}}}", many.join(",")))).unwrap_err();
        assert!(e.contains("more than a run's cost keeps"), "{e}");
    }

    #[test]
    fn a_forged_figure_is_implausible() {
        assert_eq!(cost(1.0, 2.0, 3.0, 4.0).implausible(), None);
        assert!(cost(-1.0, 0.0, 0.0, 0.0)
            .implausible()
            .unwrap()
            .contains("measuring_gpu_s"));
        assert!(cost(1.0, 0.0, 0.0, 1e308).implausible().is_some());
        assert!(cost(1.0, f64::NAN, 0.0, 0.0).implausible().is_some());
    }
}

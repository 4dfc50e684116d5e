//! The calibration study on ordered sequences of nights, the way a nightly meets them: clean
//! nights, a commit that slows the cell, its revert, clean nights again, and nights on a
//! disturbed host. Each simulated night draws one whole real run of its kind (its repeats
//! and telemetry as measured, so a bimodal cell, an outlier repeat or a busy host come as
//! they came) and is judged by the gate's own [`decide`] against the nights before it,
//! which keep the verdicts they got: a regressed night leaves the band, as does a night left
//! suspect or unknown. A night the screen flags is measured side by side as the gate does
//! ([`super::paired`]): pairs of one repeat of the last good code (a clean run's, or a
//! disturbed run's on a disturbed night: the same host at the same time) and one of the
//! night's code, until the pairs answer, and the pairs' answer is the verdict
//! ([`super::gate::after_pairs`]). Each side's repeat is drawn from a run of its own, so a
//! cell whose processes land in two modes brings that noise into its pairs. So the false
//! alarms counted here are those of the shipped verdict over a month, which resampling
//! independent runs (`super::study`) cannot show.
//!
//! Slowdowns are the real slowed runs (a speed switch set) and, for sizes the runs lack,
//! clean runs scaled by `1 - d` (an injected slowdown of size d, the same noise). A run is
//! "disturbed" when its host telemetry shows other processes using at least
//! [`super::environment::HOST_CPU_MIN`] CPUs more than the clean runs' median, or when its
//! run id says `busy` (runs made before host sampling existed).

use std::fmt::Write as _;

use indexmap::IndexMap;

use crate::metrics::stats::median;
use crate::telemetry::CellTelemetry;

use super::changepoint::SplitMix64;
use super::detect::{HistoryVerdict, Policy, MAX_RERUNS};
use super::gate::{after_pairs, decide, Measured, SideBySide};
use super::paired::{paired, settled, PairedPolicy};
use super::record::Versions;
use super::store::Point;

/// One real run of a cell: its repeats and its telemetry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RealRun {
    pub run_id: String,
    pub samples: Vec<f64>,
    pub telemetry: Option<CellTelemetry>,
}

/// A cell's real runs by kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct CellRuns {
    pub cell: String,
    pub clean: Vec<RealRun>,
    pub disturbed: Vec<RealRun>,
    /// Per speed switch, the slowed runs.
    pub slow: IndexMap<String, Vec<RealRun>>,
}

/// What a night runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Night {
    Clean,
    /// The commit that slows the cell, until its revert.
    Slow,
    /// Clean code on a host busy with other work.
    Disturbed,
}

/// The month every sequence follows: ten clean nights, two slowed nights, the revert,
/// four clean nights, two disturbed nights, eleven clean nights.
pub(crate) fn month() -> Vec<Night> {
    let mut m = vec![Night::Clean; 10];
    m.extend([Night::Slow, Night::Slow]);
    m.extend([Night::Clean; 5]);
    m.extend([Night::Disturbed; 2]);
    m.extend([Night::Clean; 11]);
    m
}

/// Where a slowed night's runs come from.
#[derive(Debug, Clone)]
pub(crate) enum Slowdown<'a> {
    /// Real slowed runs.
    Real(&'a [RealRun]),
    /// Clean runs scaled by `1 - d`.
    Injected(f64),
}

/// What the sequences gave, summed over trials.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SequenceCounts {
    pub nights: usize,
    /// Clean and revert nights judged (every night after the first), and those regressed.
    pub clean_judged: usize,
    pub clean_alarms: usize,
    /// Disturbed nights judged, regressed, and blamed on the environment.
    pub disturbed_judged: usize,
    pub disturbed_alarms: usize,
    pub disturbed_environment: usize,
    /// Slowed nights, and those regressed.
    pub slow_judged: usize,
    pub slow_regressed: usize,
    /// Confirming re-runs made (by the nights the pairs could not settle).
    pub reruns: usize,
    /// Side-by-side pairs measured.
    pub pairs: usize,
}

fn scaled(run: &RealRun, factor: f64) -> RealRun {
    RealRun {
        run_id: run.run_id.clone(),
        samples: run.samples.iter().map(|v| v * factor).collect(),
        telemetry: run.telemetry.clone(),
    }
}

/// One real run for a night of kind `night` (the disturbed nights fall back to clean runs
/// when the cell has no disturbed run).
fn draw(cell: &CellRuns, night: Night, slow: &Slowdown<'_>, rng: &mut SplitMix64) -> RealRun {
    let pick = |runs: &[RealRun], rng: &mut SplitMix64| runs[rng.below(runs.len())].clone();
    match night {
        Night::Clean => pick(&cell.clean, rng),
        Night::Disturbed if !cell.disturbed.is_empty() => pick(&cell.disturbed, rng),
        Night::Disturbed => pick(&cell.clean, rng),
        Night::Slow => match slow {
            Slowdown::Real(runs) if !runs.is_empty() => pick(runs, rng),
            Slowdown::Real(_) => pick(&cell.clean, rng),
            Slowdown::Injected(d) => scaled(&pick(&cell.clean, rng), 1.0 - d),
        },
    }
}

/// One repeat of `run`, drawn at random: one side of a pair is one process.
fn one_repeat(run: &RealRun, rng: &mut SplitMix64) -> f64 {
    if run.samples.is_empty() {
        return f64::NAN;
    }
    run.samples[rng.below(run.samples.len())]
}

/// Replays `trials` sequences of `nights` for `cell` with `slow` on the slowed nights.
pub(crate) fn replay(
    cell: &CellRuns,
    nights: &[Night],
    slow: &Slowdown<'_>,
    policy: &Policy,
    trials: usize,
    seed: u64,
) -> SequenceCounts {
    let mut n = SequenceCounts::default();
    if cell.clean.is_empty() {
        return n;
    }
    let mut rng = SplitMix64(seed);
    for _ in 0..trials {
        let mut past: Vec<Point> = Vec::with_capacity(nights.len());
        for (i, &night) in nights.iter().enumerate() {
            let run = draw(cell, night, slow, &mut rng);
            let value = median(&run.samples).unwrap_or(f64::NAN);
            let scoped: Vec<&Point> = past.iter().collect();
            let judged = |agains: &[Vec<f64>]| {
                let views: Vec<&[f64]> = agains.iter().map(Vec::as_slice).collect();
                let now = Measured {
                    value,
                    samples: &run.samples,
                    step_sigmas: &[],
                    telemetry: run.telemetry.as_ref(),
                    confirms: &views,
                    confirm_failed: false,
                    baseline: None,
                    max_reruns: MAX_RERUNS,
                };
                decide(&scoped, None, &now, policy)
            };
            let mut d = judged(&[]);
            // As the gate does: a flagged night is measured side by side with the last good
            // code on the same host, and the pairs' answer is its verdict.
            let screened = d.judgement.verdict;
            let rel = d.judgement.rel_change;
            let drop = rel.is_some_and(|r| r < 0.0);
            let flagged = match screened {
                HistoryVerdict::Regressed | HistoryVerdict::Suspect | HistoryVerdict::Unknown => {
                    true
                }
                HistoryVerdict::Environment => drop,
                _ => false,
            };
            if flagged && i > 0 {
                let base_kind = if night == Night::Disturbed {
                    Night::Disturbed
                } else {
                    Night::Clean
                };
                let pp = PairedPolicy::default();
                let (mut a, mut b) = (Vec::new(), Vec::new());
                loop {
                    a.push(one_repeat(&draw(cell, base_kind, slow, &mut rng), &mut rng));
                    b.push(one_repeat(&draw(cell, night, slow, &mut rng), &mut rng));
                    if settled(&paired(&a, &b, rel, &pp), &pp) {
                        break;
                    }
                }
                n.pairs += a.len();
                let r = paired(&a, &b, rel, &pp);
                after_pairs(
                    &mut d.judgement,
                    &SideBySide {
                        cell_id: cell.cell.clone(),
                        base_commit: "a".into(),
                        base_run_id: None,
                        head_commit: "b".into(),
                        screened,
                        screened_rel: rel,
                        base: a,
                        head: b,
                        result: Some(r),
                        stopped: None,
                        gpu_s: 0.0,
                        logs: None,
                    },
                );
            } else {
                // A first night has no last good code: re-runs, as before pairs.
                let mut agains: Vec<Vec<f64>> = Vec::new();
                while super::detect::wants_rerun(d.judgement.verdict, agains.len()) {
                    n.reruns += 1;
                    agains.push(draw(cell, night, slow, &mut rng).samples);
                    d = judged(&agains);
                }
            }
            let verdict = d.judgement.verdict;
            n.nights += 1;
            if i > 0 {
                let regressed = verdict == HistoryVerdict::Regressed;
                match night {
                    Night::Clean => {
                        n.clean_judged += 1;
                        n.clean_alarms += usize::from(regressed);
                    }
                    Night::Disturbed => {
                        n.disturbed_judged += 1;
                        n.disturbed_alarms += usize::from(regressed);
                        n.disturbed_environment +=
                            usize::from(verdict == HistoryVerdict::Environment);
                    }
                    Night::Slow => {
                        n.slow_judged += 1;
                        n.slow_regressed += usize::from(regressed);
                    }
                }
            }
            past.push(Point {
                run_id: format!("night-{i:03}"),
                started_at: format!("2026-01-01T00:00:{i:02}Z"),
                commit: None,
                branch: None,
                host: String::new(),
                throttled: false,
                value,
                rel_spread: 0.0,
                samples: run.samples.clone(),
                loss_curve: Vec::new(),
                switches: IndexMap::new(),
                versions: Versions::default(),
                telemetry: run.telemetry.clone(),
                context: IndexMap::new(),
                verdict: Some(verdict.as_str().replace(' ', "_")),
            });
        }
    }
    n
}

/// Sorts one cell's runs into clean, disturbed and slowed (by speed switch; `switch` is
/// empty for a clean run).
pub(crate) fn add(cells: &mut IndexMap<String, CellRuns>, cell: &str, switch: &str, run: RealRun) {
    let entry = cells.entry(cell.to_string()).or_insert_with(|| CellRuns {
        cell: cell.to_string(),
        ..CellRuns::default()
    });
    if !switch.is_empty() {
        entry.slow.entry(switch.to_string()).or_default().push(run);
    } else if run.run_id.contains("busy") {
        entry.disturbed.push(run);
    } else {
        entry.clean.push(run);
    }
}

/// The cells' real runs from run folders, each run's switches deciding its kind.
pub(crate) fn from_results(runs: &[crate::results::RunResults], metric: &str) -> Vec<CellRuns> {
    let mut cells = IndexMap::new();
    for r in runs {
        let switch = super::study::switch_of(&r.environment.switches, &r.run_id);
        for c in r
            .cells
            .iter()
            .filter(|c| c.outcome == crate::results::Outcome::Passed)
        {
            let Some(m) = c.metrics.get(metric) else {
                continue;
            };
            let run = RealRun {
                run_id: r.run_id.clone(),
                samples: m.samples.clone(),
                telemetry: c.telemetry.as_deref().cloned(),
            };
            add(&mut cells, c.id.as_str(), &switch, run);
        }
    }
    finish(cells)
}

/// The cells' real runs from a history store (every hardware key its own cell), leaving
/// out the gate's confirming re-runs.
pub(crate) fn from_store(
    store: &mut super::store::History,
    metric: &str,
) -> Result<Vec<CellRuns>, super::error::HistoryError> {
    let mut cells = IndexMap::new();
    for (name, p) in super::study::store_points(store, metric)? {
        let switch = super::study::switch_of(&p.switches, &p.run_id);
        let run = RealRun {
            samples: p.repeats(),
            run_id: p.run_id,
            telemetry: p.telemetry,
        };
        add(&mut cells, &name, &switch, run);
    }
    Ok(finish(cells))
}

/// The cells with at least two clean runs, their busy-host runs set apart.
fn finish(cells: IndexMap<String, CellRuns>) -> Vec<CellRuns> {
    cells
        .into_values()
        .map(|mut c| {
            split_disturbed(&mut c);
            c
        })
        .filter(|c| c.clean.len() >= 2)
        .collect()
}

/// Moves the clean runs whose host was busy (see the module docs) to the disturbed ones.
pub(crate) fn split_disturbed(cell: &mut CellRuns) {
    let foreign = |r: &RealRun| {
        r.telemetry
            .as_ref()
            .and_then(|t| t.host.as_ref())
            .map(|h| h.foreign_cpus)
    };
    let usual: Vec<f64> = cell.clean.iter().filter_map(foreign).collect();
    let Some(centre) = median(&usual) else {
        return;
    };
    let (busy, quiet): (Vec<RealRun>, Vec<RealRun>) = cell
        .clean
        .drain(..)
        .partition(|r| foreign(r).is_some_and(|f| f >= centre + super::environment::HOST_CPU_MIN));
    cell.clean = quiet;
    cell.disturbed.extend(busy);
}

/// A rate with its counts; `< x` (the exact 95% upper bound, [`super::study::zero_event_bound`])
/// when no event happened.
fn rate(events: usize, of: usize) -> String {
    if of == 0 {
        "-".into()
    } else if events == 0 {
        format!(
            "0 of {of} (< {:.2}%)",
            100.0 * super::study::zero_event_bound(of)
        )
    } else {
        format!(
            "{events} of {of} ({:.2}%)",
            events as f64 / of as f64 * 100.0
        )
    }
}

/// The Markdown table of the month's sequences for every cell: per slowdown (each real
/// switch, then injected 2% and 3%), `trials` months.
pub(crate) fn table(cells: &[CellRuns], policy: &Policy, trials: usize) -> String {
    let nights = month();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Sequences of a month ({} nights: 10 clean, 2 slowed, the revert and 4 clean, 2 on a busy host, 11 clean), each night one real run of its kind judged by the shipped verdict against the nights before it, a flagged night measured side by side (pairs of one repeat of the last good code and one of the night's, each from a real run of its kind) until the pairs answer; {trials} months per row.\n",
        nights.len()
    );
    let _ = writeln!(out, "| cell | runs (clean / busy host / slowed) | slowdown | clean nights: false alarms | busy-host nights: false alarms | busy-host nights: environment | slowed nights: regressed | pairs per night | re-runs per night |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for c in cells {
        let Some(clean_median) = median(
            &c.clean
                .iter()
                .filter_map(|r| median(&r.samples))
                .collect::<Vec<_>>(),
        ) else {
            continue;
        };
        let mut kinds: Vec<(String, Slowdown<'_>)> = Vec::new();
        for (switch, runs) in &c.slow {
            let slow_median = median(
                &runs
                    .iter()
                    .filter_map(|r| median(&r.samples))
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(f64::NAN);
            kinds.push((
                format!(
                    "{switch} ({:.2}%, real)",
                    (1.0 - slow_median / clean_median) * 100.0
                ),
                Slowdown::Real(runs),
            ));
        }
        kinds.push(("2% (injected)".into(), Slowdown::Injected(0.02)));
        kinds.push(("3% (injected)".into(), Slowdown::Injected(0.03)));
        for (k, (name, slow)) in kinds.iter().enumerate() {
            let n = replay(c, &nights, slow, policy, trials, 0x5e9 ^ k as u64);
            let _ = writeln!(
                out,
                "| {} | {} / {} / {} | {name} | {} | {} | {} | {} | {:.2} | {:.2} |",
                c.cell,
                c.clean.len(),
                c.disturbed.len(),
                c.slow.values().map(Vec::len).sum::<usize>(),
                rate(n.clean_alarms, n.clean_judged),
                rate(n.disturbed_alarms, n.disturbed_judged),
                rate(n.disturbed_environment, n.disturbed_judged),
                rate(n.slow_regressed, n.slow_judged),
                n.pairs as f64 / n.nights.max(1) as f64,
                n.reruns as f64 / n.nights.max(1) as f64
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, samples: &[f64]) -> RealRun {
        RealRun {
            run_id: id.into(),
            samples: samples.to_vec(),
            telemetry: None,
        }
    }

    /// Real-looking clean runs: 0.3% noise around 1000, and a bimodal mode at -3.5% in
    /// one run of six (issue 31's eager SAC cell on an H100).
    fn bimodal() -> CellRuns {
        let mut c = CellRuns {
            cell: "sac".into(),
            ..CellRuns::default()
        };
        let mut rng = SplitMix64(9);
        for i in 0..24 {
            let level = if i % 6 == 5 { 965.0 } else { 1000.0 };
            let s: Vec<f64> = (0..3)
                .map(|_| level * (1.0 + 0.003 * ((rng.below(1000) as f64) / 500.0 - 1.0)))
                .collect();
            c.clean.push(run(&format!("c{i}"), &s));
        }
        c
    }

    #[test]
    fn the_month_has_its_nights() {
        let m = month();
        assert_eq!(m.len(), 30);
        assert_eq!(m.iter().filter(|n| **n == Night::Slow).count(), 2);
        assert_eq!(m[12], Night::Clean, "the revert");
    }

    /// A slowdown is regressed on its nights; clean nights of a bimodal cell do not alarm
    /// (one re-run in its slow mode does not confirm it), and the re-runs that costs are
    /// counted.
    #[test]
    fn sequences_count_alarms_detections_and_reruns() {
        let c = bimodal();
        let p = Policy::default();
        let n = replay(&c, &month(), &Slowdown::Injected(0.05), &p, 40, 1);
        assert_eq!(n.nights, 40 * 30);
        assert_eq!(n.slow_judged, 80);
        assert!(n.slow_regressed as f64 >= 0.95 * 80.0, "{n:?}");
        assert!(n.pairs > 0);
        // Measured with 300 months a row: 0.49% (37 of 7500), against 3.2% when one
        // re-run confirmed every breach.
        assert!(
            (n.clean_alarms as f64) <= 0.01 * n.clean_judged as f64,
            "{n:?}"
        );
        let t = table(&[c], &p, 5);
        assert!(t.contains("| sac | 24 / 0 / 0 | 2% (injected) |"), "{t}");
    }

    #[test]
    fn runs_sort_into_their_kinds() {
        let mut cells = IndexMap::new();
        add(&mut cells, "a", "", run("n1", &[1.0]));
        add(&mut cells, "a", "", run("n2-busy", &[1.0]));
        add(&mut cells, "a", "BENCH_FUSED_ADAMW=0", run("s1", &[0.9]));
        let a = &cells["a"];
        assert_eq!((a.clean.len(), a.disturbed.len(), a.slow.len()), (1, 1, 1));
    }
}

//! The calibration study behind the default [`Policy`]: from many clean repeats of a cell
//! and repeats of the same cell with a real slowdown of measured size, estimate by
//! resampling how often each rule detects the slowdown and how often it cries wolf.
//!
//! Model (a bootstrap, Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 6):
//! every repeat of a cell is its own worker process on one host, so the repeats of a
//! configuration are treated as draws from one distribution, estimated by their pool. A
//! simulated run with `r` repeats is the median of `r` draws with replacement from a pool,
//! with its relative half-range as spread, exactly as `results.json` summarizes a run.
//!
//! - Old rule: one clean simulated run is the stored baseline; the new run regresses when
//!   it is slower by more than max(3%, the two runs' spreads added), as `baseline::compare`
//!   decides.
//! - New rule: `lookback` clean simulated runs are the history; the new run is judged by
//!   [`detect::judge`]; a suspect is re-run (another simulated run from the same pool) and
//!   judged with it, as `--confirm` does. Only `Regressed` counts.
//!
//! A slowdown's size is measured in the same study: 1 - median(slow pool) / median(clean
//! pool). False-alarm rates this small need many trials: a rate printed as `< x` had no
//! event in the trials, `x` being the rule-of-three 95% upper bound 3 / trials (Hanley &
//! Lippman-Hand 1983, JAMA 249(13)). A bootstrap from a finite pool cannot produce values
//! outside it, so rare tail events of the real process are under-represented: the pool
//! sizes are printed with the table.

use std::fmt::Write as _;

use indexmap::IndexMap;

use crate::baseline::Direction;
use crate::metrics::stats::{median, rel_spread};

use super::changepoint::SplitMix64;
use super::detect::{self, HistoryVerdict, Observation, Policy};

/// The old rule's fixed tolerance.
pub(crate) const OLD_TOLERANCE: f64 = 0.03;

/// Clean and slowed-down repeat pools of one cell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CellPools {
    pub cell: String,
    pub clean: Vec<f64>,
    /// Clean runs the pool came from.
    pub clean_runs: usize,
    /// Per slowdown (its switch, e.g. `BENCH_FUSED_ADAMW=0`): the repeats' values.
    pub slow: IndexMap<String, Vec<f64>>,
}

/// One simulated run: the median of `r` draws and its relative spread.
fn sim_run(pool: &[f64], r: usize, rng: &mut SplitMix64) -> (f64, f64) {
    let (m, s, _) = sim_draws(pool, r, rng);
    (m, s)
}

/// [`sim_run`] with the draws themselves (the repeats the two-sample test compares).
fn sim_draws(pool: &[f64], r: usize, rng: &mut SplitMix64) -> (f64, f64, Vec<f64>) {
    let draws: Vec<f64> = (0..r).map(|_| pool[rng.below(pool.len())]).collect();
    (
        median(&draws).unwrap_or(f64::NAN),
        rel_spread(&draws),
        draws,
    )
}

/// Rates of one rule over `trials` new runs drawn from `pool` (clean for false alarms,
/// slowed for detection), with histories and baselines drawn from `clean`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rates {
    pub old: f64,
    /// Before confirmation (a single breach, i.e. suspect or regressed).
    pub new_single: f64,
    /// After confirmation.
    pub new: f64,
    pub trials: usize,
}

/// Simulates `trials` verdicts of both rules (see the module docs).
pub(crate) fn simulate(
    clean: &[f64],
    pool: &[f64],
    repeats: usize,
    policy: &Policy,
    trials: usize,
    seed: u64,
) -> Rates {
    let mut rng = SplitMix64(seed);
    let (mut old, mut single, mut new) = (0usize, 0usize, 0usize);
    let mut history = vec![0.0; policy.lookback];
    for _ in 0..trials {
        let (base, base_spread) = sim_run(clean, repeats, &mut rng);
        let (x, x_spread, x_draws) = sim_draws(pool, repeats, &mut rng);
        if base - x > OLD_TOLERANCE.max(x_spread + base_spread) * base {
            old += 1;
        }
        let mut pooled = Vec::with_capacity(history.len() * repeats);
        for h in history.iter_mut() {
            let (m, _, d) = sim_draws(clean, repeats, &mut rng);
            *h = m;
            pooled.extend(d);
        }
        let obs = Observation {
            history: &history,
            history_samples: &pooled,
            value: x,
            rel_spread: x_spread,
            samples: &x_draws,
            confirm: None,
            baseline: None,
            previous_regressed: false,
        };
        let first = detect::judge(&obs, Direction::Higher, policy).verdict;
        let verdict = if first == HistoryVerdict::Suspect {
            single += 1;
            let again = sim_draws(pool, repeats, &mut rng).2;
            detect::judge(
                &Observation {
                    confirm: Some(&again),
                    ..obs
                },
                Direction::Higher,
                policy,
            )
            .verdict
        } else {
            if first == HistoryVerdict::Regressed {
                single += 1;
            }
            first
        };
        if verdict == HistoryVerdict::Regressed {
            new += 1;
        }
    }
    let t = trials.max(1) as f64;
    Rates {
        old: old as f64 / t,
        new_single: single as f64 / t,
        new: new as f64 / t,
        trials,
    }
}

/// A rate as a percentage, or `< 3/trials` when no trial had the event.
pub(crate) fn pct(rate: f64, trials: usize) -> String {
    if rate == 0.0 {
        format!("< {:.3}%", 300.0 / trials.max(1) as f64)
    } else {
        format!("{:.2}%", rate * 100.0)
    }
}

/// The study's Markdown table for `cells` under `policy`, with `repeat_counts` repeats per
/// simulated run, `detect_trials` trials per detection rate and `alarm_trials` per
/// false-alarm rate.
pub(crate) fn table(
    cells: &[CellPools],
    policy: &Policy,
    repeat_counts: &[usize],
    detect_trials: usize,
    alarm_trials: usize,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Policy: lookback {} runs, band {} robust sigmas, floor {:.1}%, confirmation by one re-run; old rule: {:.0}% against one stored run.\n",
        policy.lookback,
        policy.threshold_sigmas,
        policy.floor_rel * 100.0,
        OLD_TOLERANCE * 100.0
    );
    let _ = writeln!(out, "| cell | run (switch) | pool | slowdown | repeats | old rule | new, one breach | new, confirmed |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for c in cells {
        let Some(clean_median) = median(&c.clean) else {
            continue;
        };
        for &r in repeat_counts {
            let fa = simulate(
                &c.clean,
                &c.clean,
                r,
                policy,
                alarm_trials,
                0xa1a2 ^ r as u64,
            );
            let _ = writeln!(
                out,
                "| {} | clean (false alarms) | {} repeats / {} runs | 0 | {r} | {} | {} | {} |",
                c.cell,
                c.clean.len(),
                c.clean_runs,
                pct(fa.old, fa.trials),
                pct(fa.new_single, fa.trials),
                pct(fa.new, fa.trials)
            );
        }
        for (switch, pool) in &c.slow {
            let slow = 1.0 - median(pool).unwrap_or(f64::NAN) / clean_median;
            for &r in repeat_counts {
                let d = simulate(&c.clean, pool, r, policy, detect_trials, 0xd1d2 ^ r as u64);
                let _ = writeln!(
                    out,
                    "| {} | {switch} (detection) | {} repeats | {:.2}% | {r} | {} | {} | {} |",
                    c.cell,
                    pool.len(),
                    slow * 100.0,
                    pct(d.old, d.trials),
                    pct(d.new_single, d.trials),
                    pct(d.new, d.trials)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "\nRates by bootstrap resampling of the pools: {detect_trials} trials per detection rate, {alarm_trials} per false-alarm rate; `< x` means no event, x = 3/trials (95% upper bound)."
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `n` values around `center` with relative noise `rel` (deterministic).
    fn pool(center: f64, rel: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut r = SplitMix64(seed);
        (0..n)
            .map(|_| {
                // Sum of uniforms: roughly normal, bounded.
                let u: f64 = (0..4)
                    .map(|_| (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
                    .sum::<f64>()
                    - 2.0;
                center * (1.0 + rel * u)
            })
            .collect()
    }

    #[test]
    fn a_large_slowdown_is_always_found_and_clean_runs_rarely_alarm() {
        let clean = pool(1000.0, 0.003, 60, 1);
        let slow: Vec<f64> = pool(1000.0, 0.003, 30, 2)
            .iter()
            .map(|v| v * 0.95)
            .collect();
        let p = Policy::default();
        let d = simulate(&clean, &slow, 3, &p, 2000, 3);
        assert!(d.new > 0.99 && d.old > 0.99, "{d:?}");
        let fa = simulate(&clean, &clean, 3, &p, 5000, 4);
        assert!(fa.new < 0.002, "{fa:?}");
        assert!(fa.new <= fa.new_single);
    }

    #[test]
    fn the_new_rule_finds_two_percent_where_the_old_one_does_not() {
        let clean = pool(1000.0, 0.003, 60, 5);
        let slow: Vec<f64> = pool(1000.0, 0.003, 30, 6)
            .iter()
            .map(|v| v * 0.98)
            .collect();
        let d = simulate(&clean, &slow, 3, &Policy::default(), 2000, 7);
        assert!(d.new > 0.9, "{d:?}");
        assert!(d.old < 0.05, "{d:?}");
    }

    #[test]
    fn the_table_states_its_pools_and_bounds() {
        let c = CellPools {
            cell: "c".into(),
            clean: pool(100.0, 0.003, 20, 8),
            clean_runs: 4,
            slow: [("BENCH_FUSED_ADAMW=0".to_string(), pool(97.0, 0.003, 10, 9))]
                .into_iter()
                .collect(),
        };
        let t = table(&[c], &Policy::default(), &[3], 200, 300);
        assert!(
            t.contains("| c | clean (false alarms) | 20 repeats / 4 runs | 0 | 3 |"),
            "{t}"
        );
        assert!(
            t.contains("BENCH_FUSED_ADAMW=0 (detection) | 10 repeats | 2.96% | 3 |"),
            "{t}"
        );
        assert!(t.contains("< 1.000%"), "{t}");
        assert_eq!(pct(0.0, 300), "< 1.000%");
    }
}

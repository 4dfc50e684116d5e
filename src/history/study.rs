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
//!   [`detect::judge`]; a suspect or unknown is re-run (another simulated run from the same
//!   pool) and judged with it, as `--confirm` does. Only `Regressed` counts.
//! - Shipped verdict: the new rule, then the environment check the gate applies
//!   ([`environment::explain`] and [`environment::excuse`], the same functions): each
//!   simulated run carries the GPU telemetry of one real run of its pool (drawn at random),
//!   the history's runs that of real clean runs, so a slowdown the telemetry would excuse
//!   (as every SW-power-capped H100 run was excused before issue 21) counts as missed.
//!   Only `Regressed` fails a job, so only it counts as detected or as a false alarm.
//!
//! A slowdown's size is measured in the same study: 1 - median(slow pool) / median(clean
//! pool). False-alarm rates this small need many trials: a rate printed as `< x` had no
//! event in the trials, `x` being the exact 95% upper bound 1 - 0.05^(1/trials) (Clopper &
//! Pearson 1934), which for many trials is the rule of three's 3 / trials (Hanley &
//! Lippman-Hand 1983, JAMA 249(13)). A bootstrap from a finite pool cannot produce values
//! outside it, so rare tail events of the real process are under-represented: the pool
//! sizes are printed with the table.

use std::fmt::Write as _;

use indexmap::IndexMap;

use crate::baseline::Direction;
use crate::metrics::stats::{median, rel_spread};

use crate::results::{Outcome, RunResults};
use crate::telemetry::CellTelemetry;

use super::changepoint::SplitMix64;
use super::detect::{self, HistoryVerdict, Observation, Policy};
use super::environment;
use super::error::HistoryError;

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
    /// The clean runs' telemetry over their measured steps, with each run's value (empty
    /// when the runs had none: the shipped verdict is then the new rule's).
    pub clean_telemetry: Vec<(f64, CellTelemetry)>,
    /// The same for each slowdown's runs.
    pub slow_telemetry: IndexMap<String, Vec<(f64, CellTelemetry)>>,
    /// Runs per slowdown.
    pub slow_runs: IndexMap<String, usize>,
}

/// One pool of a simulation: repeats' values, and the telemetry of the real runs they
/// came from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pool<'a> {
    pub values: &'a [f64],
    pub telemetry: &'a [(f64, CellTelemetry)],
}

impl<'a> Pool<'a> {
    /// A pool without telemetry.
    #[cfg(test)]
    pub(crate) fn plain(values: &'a [f64]) -> Pool<'a> {
        Pool {
            values,
            telemetry: &[],
        }
    }

    /// The telemetry of one of the pool's real runs, at random; `None` without any.
    fn telemetry(&self, rng: &mut SplitMix64) -> Option<&'a CellTelemetry> {
        (!self.telemetry.is_empty()).then(|| &self.telemetry[rng.below(self.telemetry.len())].1)
    }
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
    /// The shipped verdict: after confirmation and the environment check, regressed.
    pub shipped: f64,
    /// Confirmed regressions the environment check excused (verdict `environment`).
    pub excused: f64,
    pub trials: usize,
}

/// Simulates `trials` verdicts of both rules and of the shipped verdict (see the module
/// docs).
pub(crate) fn simulate(
    clean: Pool<'_>,
    pool: Pool<'_>,
    repeats: usize,
    policy: &Policy,
    trials: usize,
    seed: u64,
) -> Rates {
    let mut rng = SplitMix64(seed);
    let (mut old, mut single, mut new, mut shipped, mut excused) = (0usize, 0, 0, 0, 0);
    let mut history = vec![0.0; policy.lookback];
    for _ in 0..trials {
        let (base, base_spread) = sim_run(clean.values, repeats, &mut rng);
        let (x, x_spread, x_draws) = sim_draws(pool.values, repeats, &mut rng);
        let x_tele = pool.telemetry(&mut rng);
        if base - x > OLD_TOLERANCE.max(x_spread + base_spread) * base {
            old += 1;
        }
        let mut pooled = Vec::with_capacity(history.len() * repeats);
        let mut history_tele = Vec::with_capacity(history.len());
        for h in history.iter_mut() {
            let (m, _, d) = sim_draws(clean.values, repeats, &mut rng);
            *h = m;
            pooled.extend(d);
            if let Some(t) = clean.telemetry(&mut rng) {
                history_tele.push((m, t));
            }
        }
        let obs = Observation {
            history: &history,
            history_samples: &pooled,
            history_within_rel: None,
            value: x,
            within_rel: detect::within_run(&x_draws, &[]),
            samples: &x_draws,
            confirms: &[],
            baseline: None,
            max_reruns: detect::MAX_RERUNS,
        };
        let first = detect::judge(&obs, Direction::Higher, policy);
        if matches!(
            first.verdict,
            HistoryVerdict::Suspect | HistoryVerdict::Regressed
        ) {
            single += 1;
        }
        // As `--confirm` does: a suspect is re-run (an unknown cell once) until it has the
        // re-runs its breach needs or one clears it, judged with all of them.
        let mut judgement = first;
        let mut agains: Vec<Vec<f64>> = Vec::new();
        while detect::wants_rerun(judgement.verdict, agains.len()) {
            agains.push(sim_draws(pool.values, repeats, &mut rng).2);
            let views: Vec<&[f64]> = agains.iter().map(Vec::as_slice).collect();
            judgement = detect::judge(
                &Observation {
                    confirms: &views,
                    ..obs
                },
                Direction::Higher,
                policy,
            );
        }
        if judgement.verdict == HistoryVerdict::Regressed {
            new += 1;
        }
        let finding = environment::explain(
            x_tele,
            x,
            &history_tele,
            judgement.rel_change.unwrap_or(0.0),
        );
        environment::excuse(&mut judgement, finding.as_ref());
        match judgement.verdict {
            HistoryVerdict::Regressed => shipped += 1,
            HistoryVerdict::Environment => excused += 1,
            _ => {}
        }
    }
    let t = trials.max(1) as f64;
    Rates {
        old: old as f64 / t,
        new_single: single as f64 / t,
        new: new as f64 / t,
        shipped: shipped as f64 / t,
        excused: excused as f64 / t,
        trials,
    }
}

/// A rate as a percentage, or `< x` when no trial had the event, `x` the exact one-sided
/// 95% upper bound for no event in `trials` (Clopper & Pearson 1934, Biometrika 26(4)):
/// `1 - 0.05^(1/trials)`. For many trials it is the rule of three's `3/trials`; for few it
/// stays a rate (2 trials: < 77.6%), where `3/trials` printed "< 150.00%".
pub(crate) fn pct(rate: f64, trials: usize) -> String {
    if rate == 0.0 {
        format!("< {:.3}%", 100.0 * zero_event_bound(trials))
    } else {
        format!("{:.2}%", rate * 100.0)
    }
}

/// The exact 95% upper bound of a rate with no event in `trials` trials.
pub(crate) fn zero_event_bound(trials: usize) -> f64 {
    1.0 - 0.05f64.powf(1.0 / trials.max(1) as f64)
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
    // The repeats' test's floor is named only where it differs from the band's (the energy
    // policy and `--test-floor`), so the line reads as it always did for the speed.
    let test_floor = if policy.two_sample.floor_rel == policy.floor_rel {
        String::new()
    } else {
        format!(
            " (the repeats' test's {:.1}%)",
            policy.two_sample.floor_rel * 100.0
        )
    };
    let _ = writeln!(
        out,
        "Policy: lookback {} runs, band {} robust sigmas, floor {:.1}%{test_floor}, confirmation by one re-run; old rule: {:.0}% against one stored run. Shipped verdict: confirmed, then the environment check on the runs' GPU telemetry; only `regressed` fails a job.\n",
        policy.lookback,
        policy.threshold_sigmas,
        policy.floor_rel * 100.0,
        OLD_TOLERANCE * 100.0
    );
    for c in cells {
        let _ = writeln!(out, "{}\n", telemetry_summary(c));
    }
    let _ = writeln!(out, "| cell | run (switch) | pool | slowdown | repeats | old rule | new, one breach | new, confirmed | shipped: regressed | shipped: environment |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for c in cells {
        let Some(clean_median) = median(&c.clean) else {
            continue;
        };
        let clean = Pool {
            values: &c.clean,
            telemetry: &c.clean_telemetry,
        };
        for &r in repeat_counts {
            let fa = simulate(clean, clean, r, policy, alarm_trials, 0xa1a2 ^ r as u64);
            let _ = writeln!(
                out,
                "| {} | clean (false alarms) | {} repeats / {} runs | 0 | {r} | {} | {} | {} | {} | {} |",
                c.cell,
                c.clean.len(),
                c.clean_runs,
                pct(fa.old, fa.trials),
                pct(fa.new_single, fa.trials),
                pct(fa.new, fa.trials),
                pct(fa.shipped, fa.trials),
                pct(fa.excused, fa.trials)
            );
        }
        for (switch, values) in &c.slow {
            let slow = 1.0 - median(values).unwrap_or(f64::NAN) / clean_median;
            let pool = Pool {
                values,
                telemetry: c.slow_telemetry.get(switch).map_or(&[], Vec::as_slice),
            };
            for &r in repeat_counts {
                let d = simulate(clean, pool, r, policy, detect_trials, 0xd1d2 ^ r as u64);
                let _ = writeln!(
                    out,
                    "| {} | {switch} (detection) | {} repeats / {} runs | {:.2}% | {r} | {} | {} | {} | {} | {} |",
                    c.cell,
                    values.len(),
                    c.slow_runs.get(switch).copied().unwrap_or(0),
                    slow * 100.0,
                    pct(d.old, d.trials),
                    pct(d.new_single, d.trials),
                    pct(d.new, d.trials),
                    pct(d.shipped, d.trials),
                    pct(d.excused, d.trials)
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "\nRates by bootstrap resampling of the pools: {detect_trials} trials per detection rate, {alarm_trials} per false-alarm rate; `< x` means no event, x = 1 - 0.05^(1/trials) (the exact 95% upper bound; about 3/trials for many trials)."
    );
    out
}

/// One line on the telemetry the study's runs carried: how many runs had it, the SM clock
/// and the share of samples at the SW power cap in clean and slowed runs, so a reader sees
/// that the shipped verdict was measured on runs with telemetry on.
fn telemetry_summary(c: &CellPools) -> String {
    let slowed: Vec<&(f64, CellTelemetry)> = c.slow_telemetry.values().flatten().collect();
    let clean: Vec<&(f64, CellTelemetry)> = c.clean_telemetry.iter().collect();
    if clean.is_empty() && slowed.is_empty() {
        return format!(
            "Telemetry of `{}`: none in these runs (no nvidia-smi, or results older than telemetry): the shipped verdict is the new rule's.",
            c.cell
        );
    }
    let describe = |runs: &[&(f64, CellTelemetry)]| {
        let clocks: Vec<f64> = runs.iter().filter_map(|(_, t)| t.sm_clock_mhz).collect();
        let cap: Vec<f64> = runs
            .iter()
            .map(|(_, t)| t.reason_fraction("SW power cap"))
            .collect();
        let foreign = runs.iter().filter(|(_, t)| !t.foreign.is_empty()).count();
        format!(
            "{} runs, median SM clock {}, SW power cap in {} of samples (median), {} with a foreign process",
            runs.len(),
            median(&clocks).map_or("-".into(), |m| format!("{m:.0} MHz")),
            median(&cap).map_or("-".into(), |m| format!("{:.0}%", m * 100.0)),
            foreign
        )
    };
    format!(
        "Telemetry of `{}`: clean {}; slowed {}.",
        c.cell,
        describe(&clean),
        describe(&slowed)
    )
}

// The pools of the study, from run folders or from a store (`bench history study`), and the
// month's sequences (`super::sequence`) read them the same way.

/// The workload switches of a run ([`crate::env::WORKLOAD_SWITCHES`]), as `VAR=value`
/// joined by commas; empty for a clean run.
pub(crate) fn switch_of(switches: &IndexMap<String, String>, run_id: &str) -> String {
    let mut switch: Vec<String> = switches
        .iter()
        .filter(|(k, _)| crate::env::matches_switch(crate::env::WORKLOAD_SWITCHES, k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // Results written before `environment.switches` existed: scripts/gate-study.sh names
    // a slowed run after its switch (`slow-003-BENCH_FUSED_ADAMW`).
    if switch.is_empty() {
        if let Some(at) = run_id.find("BENCH_FUSED_") {
            switch.push(format!("{}=0", &run_id[at..]));
        }
    }
    switch.join(",")
}

/// Adds one cell-run (its repeats, value and telemetry) to the pools of `cell`.
fn add_run(
    cells: &mut IndexMap<String, CellPools>,
    cell: &str,
    switch: String,
    samples: &[f64],
    telemetry: Option<(f64, CellTelemetry)>,
) {
    let entry = cells.entry(cell.to_string()).or_insert_with(|| CellPools {
        cell: cell.to_string(),
        clean: vec![],
        clean_runs: 0,
        slow: IndexMap::new(),
        clean_telemetry: Vec::new(),
        slow_telemetry: IndexMap::new(),
        slow_runs: IndexMap::new(),
    });
    if switch.is_empty() {
        entry.clean.extend(samples);
        entry.clean_runs += 1;
        entry.clean_telemetry.extend(telemetry);
    } else {
        entry
            .slow
            .entry(switch.clone())
            .or_default()
            .extend(samples);
        *entry.slow_runs.entry(switch.clone()).or_default() += 1;
        entry
            .slow_telemetry
            .entry(switch)
            .or_default()
            .extend(telemetry);
    }
}

/// Groups the run folders' repeats by cell and by speed switches (none set: clean).
pub(crate) fn pools(runs: &[RunResults], metric: &str) -> Vec<CellPools> {
    let mut cells: IndexMap<String, CellPools> = IndexMap::new();
    for r in runs {
        let switch = switch_of(&r.environment.switches, &r.run_id);
        for c in r.cells.iter().filter(|c| c.outcome == Outcome::Passed) {
            let Some(m) = c.metrics.get(metric) else {
                continue;
            };
            let telemetry = c.telemetry.as_deref().map(|t| (m.value, t.clone()));
            add_run(
                &mut cells,
                c.id.as_str(),
                switch.clone(),
                &m.samples,
                telemetry,
            );
        }
    }
    cells.into_values().filter(|c| c.clean.len() >= 2).collect()
}

/// Every run of every cell a history store holds for `metric`, as (the cell's name in the
/// study: `CELL on KEY` when it was measured on several hardware keys, its point), oldest
/// first per cell, the gate's confirming re-runs left out (the studies simulate those).
pub(crate) fn store_points(
    store: &mut crate::history::store::History,
    metric: &str,
) -> Result<Vec<(String, super::store::Point)>, HistoryError> {
    let mut out = Vec::new();
    for cell in store.cells(metric)? {
        let keys = store.hardware_keys(&cell, metric)?;
        for key in &keys {
            let name = if keys.len() > 1 {
                format!("{cell} on {key}")
            } else {
                cell.clone()
            };
            for mut p in store.trend(&cell, key, metric)? {
                if !super::gate::is_confirm_run(&p.run_id) {
                    thin(&mut p.samples);
                    out.push((name.clone(), p));
                }
            }
        }
    }
    Ok(out)
}

/// The most repeats of one run the study resamples. Real runs have a few (3 to 20); a
/// store written by another tool may hold up to [`crate::bounds::MAX_SAMPLES`] per row,
/// and the bootstrap's tests grow with the pools, so 20 rows of 10,000 samples ran for
/// more than 400 s where the same store with 3 took a second.
pub(crate) const STUDY_MAX_REPEATS: usize = 20;

/// `samples` cut to [`STUDY_MAX_REPEATS`] evenly spaced ones, in order.
fn thin(samples: &mut Vec<f64>) {
    let n = samples.len();
    if n > STUDY_MAX_REPEATS {
        *samples = (0..STUDY_MAX_REPEATS)
            .map(|i| samples[i * n / STUDY_MAX_REPEATS])
            .collect();
    }
}

/// [`pools`] from a history store ([`store_points`]).
pub(crate) fn pools_from_store(
    store: &mut crate::history::store::History,
    metric: &str,
) -> Result<Vec<CellPools>, HistoryError> {
    let mut cells: IndexMap<String, CellPools> = IndexMap::new();
    for (name, p) in store_points(store, metric)? {
        let telemetry = p.telemetry.clone().map(|t| (p.value, t));
        add_run(
            &mut cells,
            &name,
            switch_of(&p.switches, &p.run_id),
            &p.repeats(),
            telemetry,
        );
    }
    Ok(cells.into_values().filter(|c| c.clean.len() >= 2).collect())
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
        let d = simulate(Pool::plain(&clean), Pool::plain(&slow), 3, &p, 2000, 3);
        assert!(d.new > 0.99 && d.old > 0.99, "{d:?}");
        assert_eq!(d.shipped, d.new, "no telemetry, nothing excused");
        let fa = simulate(Pool::plain(&clean), Pool::plain(&clean), 3, &p, 5000, 4);
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
        let d = simulate(
            Pool::plain(&clean),
            Pool::plain(&slow),
            3,
            &Policy::default(),
            2000,
            7,
        );
        assert!(d.new > 0.9, "{d:?}");
        assert!(d.old < 0.05, "{d:?}");
    }

    #[test]
    fn a_rate_with_no_event_is_bounded_below_one_hundred_percent() {
        assert_eq!(pct(0.0, 2), "< 77.639%");
        assert_eq!(pct(0.0, 1), "< 95.000%");
        // Many trials: the rule of three, 3/trials (3/3000 = 0.1%).
        let b = zero_event_bound(3000);
        assert!((b - 0.001).abs() < 2e-6, "{b}");
        for n in 1..200 {
            assert!(zero_event_bound(n) < 1.0 && zero_event_bound(n) > 0.0);
        }
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
            clean_telemetry: vec![],
            slow_telemetry: IndexMap::new(),
            slow_runs: [("BENCH_FUSED_ADAMW=0".to_string(), 1)]
                .into_iter()
                .collect(),
        };
        let t = table(&[c], &Policy::default(), &[3], 200, 300);
        assert!(
            t.contains("| c | clean (false alarms) | 20 repeats / 4 runs | 0 | 3 |"),
            "{t}"
        );
        assert!(
            t.contains("BENCH_FUSED_ADAMW=0 (detection) | 10 repeats / 1 runs | 2.96% | 3 |"),
            "{t}"
        );
        // No false alarm in 300 trials: below the exact bound 1 - 0.05^(1/300).
        assert!(t.contains("< 0.994%"), "{t}");
        assert_eq!(pct(0.0, 300), "< 0.994%");
    }

    /// A busy GPU's telemetry: `clock` MHz, SW power cap in every sample.
    fn capped(clock: f64) -> CellTelemetry {
        CellTelemetry {
            samples: 100,
            gpus: vec![0],
            sm_clock_mhz: Some(clock),
            max_sm_clock_mhz: Some(1980.0),
            power_w: Some(690.0),
            repeat_power_w: Vec::new(),
            power_limit_w: Some(700.0),
            temperature_c: Some(70.0),
            utilization_pct: Some(100.0),
            reasons: [("SW power cap".to_string(), 1.0)].into_iter().collect(),
            foreign: vec![],
            unverified: vec![],
            host: None,
        }
    }

    /// The study's shipped verdict goes through the gate's environment check: a power cap
    /// every clean run also shows excuses nothing (the H100 case of issue 21), a clock drop
    /// that accounts for the loss excuses it.
    #[test]
    fn the_shipped_verdict_excuses_only_what_the_telemetry_explains() {
        let clean = pool(1000.0, 0.003, 60, 11);
        let slow: Vec<f64> = pool(1000.0, 0.003, 30, 12)
            .iter()
            .map(|v| v * 0.97)
            .collect();
        let jitter = |i: usize| 1755.0 + (i % 2) as f64 * 15.0;
        let clean_tele: Vec<(f64, CellTelemetry)> =
            (0..12).map(|i| (1000.0, capped(jitter(i)))).collect();
        let same_tele: Vec<(f64, CellTelemetry)> =
            (0..6).map(|i| (970.0, capped(jitter(i)))).collect();
        // A lower clock at the cap excuses only with a lower power limit (or a hotter
        // chip): here the limit fell from 700 W to 600 W.
        let low_clock: Vec<(f64, CellTelemetry)> = (0..6)
            .map(|i| {
                let mut t = capped(jitter(i) * 0.96);
                t.power_limit_w = Some(600.0);
                (970.0, t)
            })
            .collect();
        let code_clock: Vec<(f64, CellTelemetry)> =
            (0..6).map(|i| (970.0, capped(jitter(i) * 0.96))).collect();
        let clean = Pool {
            values: &clean,
            telemetry: &clean_tele,
        };
        let p = Policy::default();
        let code = simulate(
            clean,
            Pool {
                values: &slow,
                telemetry: &same_tele,
            },
            3,
            &p,
            2000,
            13,
        );
        assert!(code.shipped > 0.95, "{code:?}");
        assert_eq!(code.excused, 0.0, "{code:?}");
        let env = simulate(
            clean,
            Pool {
                values: &slow,
                telemetry: &low_clock,
            },
            3,
            &p,
            2000,
            13,
        );
        assert!(env.shipped < 0.01 && env.excused > 0.95, "{env:?}");
        // The same clock drop at the same limit is the code's power, not the machine.
        let power = simulate(
            clean,
            Pool {
                values: &slow,
                telemetry: &code_clock,
            },
            3,
            &p,
            2000,
            13,
        );
        assert_eq!(power.excused, 0.0, "{power:?}");
        let fa = simulate(clean, clean, 3, &p, 5000, 14);
        assert!(fa.shipped < 0.002, "{fa:?}");
    }
}

//! Whether the environment explains a worse cell: its telemetry over its measured steps
//! ([`crate::telemetry::CellTelemetry`]) against the same figures of its own recent clean
//! runs. Pure; the gate feeds it.
//!
//! A cell is blamed on the environment only for a difference that explains the loss:
//!
//! - **A foreign process** computed on one of its GPUs during its measured steps.
//! - **A lower SM clock**: the cell's mean SM clock is below its clean runs' median by more
//!   than their noise (4 robust sigmas, 1.4826 x MAD, and never less than 1%: H100 clocks
//!   step by 15 MHz), and the drop accounts for at least half of the loss. The
//!   clock-normalised throughput (tokens/s per SM MHz) is reported beside it, so a reader
//!   sees whether the clocks explain the change: a drop in tokens/s per MHz is the code's.
//!   A GPU at its power cap (now and in its clean runs) runs the clock its power limit
//!   allows for the work, so there a lower clock excuses the loss only with a lower power
//!   limit or a chip at least 5 C hotter than in the clean runs; otherwise the code draws
//!   more power per cycle, and that is the code's.
//! - **A slowdown reason the history does not show**: a reason in at least 10% of the
//!   cell's samples that no clean run showed in more than 5% of its samples; SW power cap,
//!   which any busy GPU may show, counts only together with a lower clock. A reason that
//!   every clean run also shows (SW power cap at full load, as on every H100 under
//!   training) excuses nothing.
//!
//! - **A busy host** (`crate::telemetry::host`): processes that are not bench's own used
//!   more CPU during the measured steps than in the clean runs, by at least
//!   [`HOST_CPU_MIN`] CPUs and 4 robust sigmas of the clean runs' figures, on a contended
//!   host (at least [`HOST_CONTENDED_PCT`]% of all CPUs busy, or more runnable tasks than
//!   CPUs: a compile job on an idle core takes nothing from the benchmark); or the host
//!   swapped ([`SWAP_PAGES_MIN`] pages/s where its clean runs did not) or waited for memory
//!   (PSI above [`PRESSURE_MIN`]% where its clean runs stayed under 1%). The busiest foreign
//!   processes are named. A longer run queue is shown as a note.
//!
//! Without at least [`MIN_CLEAN`] clean runs with telemetry only a foreign process can
//! explain a loss: "nothing to compare with" is never an excuse.

use serde::{Deserialize, Serialize};

use super::detect::{HistoryVerdict, Judgement};
use crate::metrics::stats::{mad, median};
use crate::telemetry::CellTelemetry;

/// Clean runs with telemetry needed before a clock or reason can be compared.
pub(crate) const MIN_CLEAN: usize = 3;

/// Robust sigmas a clock must fall below its history to count as lower.
const CLOCK_SIGMAS: f64 = 4.0;
/// The narrowest clock band, relative.
const CLOCK_FLOOR: f64 = 0.01;
/// A reason this often in the cell's samples is "present".
const REASON_PRESENT: f64 = 0.10;
/// A reason at most this often in every clean run is "not in the history".
const REASON_ABSENT: f64 = 0.05;

/// Foreign CPUs above the clean runs' that make a busy host (one core taken away).
pub(crate) const HOST_CPU_MIN: f64 = 0.5;
/// The share of all CPUs busy (percent) at which the host counts as contended; a longer
/// run queue than CPUs counts too.
pub(crate) const HOST_CONTENDED_PCT: f64 = 90.0;
/// Pages swapped per second that count as swapping.
pub(crate) const SWAP_PAGES_MIN: f64 = 10.0;
/// Memory pressure (PSI some avg10, percent) that counts as waiting for memory.
pub(crate) const PRESSURE_MIN: f64 = 10.0;

/// The SW power cap: a busy GPU may sit at it whatever the code does.
const POWER_CAP: &str = "SW power cap";

/// The clocks beside the throughput, now and in the clean runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClockFigures {
    pub sm_clock_mhz: f64,
    /// Median of the clean runs' mean SM clocks.
    pub history_sm_clock_mhz: Option<f64>,
    /// Tokens/s per SM MHz, now and the clean runs' median.
    pub per_mhz: f64,
    pub history_per_mhz: Option<f64>,
    /// Mean GPU utilisation now and in the clean runs (median), percent.
    pub utilization_pct: Option<f64>,
    pub history_utilization_pct: Option<f64>,
}

impl ClockFigures {
    /// Relative change of the SM clock against the clean runs.
    pub(crate) fn clock_change(&self) -> Option<f64> {
        self.history_sm_clock_mhz
            .filter(|h| *h > 0.0)
            .map(|h| self.sm_clock_mhz / h - 1.0)
    }

    /// Relative change of tokens/s per SM MHz against the clean runs.
    pub(crate) fn per_mhz_change(&self) -> Option<f64> {
        self.history_per_mhz
            .filter(|h| *h > 0.0)
            .map(|h| self.per_mhz / h - 1.0)
    }
}

/// What the telemetry says about a cell against its clean runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The differences that explain the loss, each a sentence fragment with its numbers;
    /// empty when the environment is not to blame.
    pub causes: Vec<String>,
    /// Differences worth showing that do not excuse anything.
    pub notes: Vec<String>,
    pub clock: Option<ClockFigures>,
    /// Clean runs the comparison rests on.
    pub clean_runs: usize,
}

impl Finding {
    pub(crate) fn explains(&self) -> bool {
        !self.causes.is_empty()
    }
}

/// Why a capped GPU's clock is lower (see [`capped_cause`]).
enum Capped {
    /// The GPU was not at its power cap (now or in its clean runs): its clock is set by
    /// temperature, application clocks or another tenant, not by the code's power.
    No,
    /// At the cap, with a cause outside the code (the sentence fragment names it).
    Because(String),
    /// At the cap with the same limit and temperature: the code draws more power per cycle.
    ByTheCode,
}

/// The share of samples at the SW power cap above which a GPU counts as power-bound.
const CAPPED: f64 = 0.5;
/// A power limit this much lower than the clean runs' is a cause (relative).
const LIMIT_DROP: f64 = 0.02;
/// A temperature this much above the clean runs' is a cause (degrees C): at the same power,
/// a hotter chip leaks more and runs a lower clock.
const TEMP_RISE_C: f64 = 5.0;

/// At the power cap, a GPU's clock is whatever the power limit allows for the work it does:
/// unfusing a kernel or adding memory traffic raises the power per cycle and lowers the
/// clock, with nothing wrong in the machine (measured on an H100: the unfused bias+GELU
/// kernels of GPT-2 ran 0.7% lower clocks at the same 700 W limit). So when the cell and
/// its clean runs sat at the cap, a lower clock is the environment's only with a lower
/// power limit or a hotter chip than its clean runs had.
fn capped_cause(now: &CellTelemetry, clean: &[(f64, &CellTelemetry)]) -> Capped {
    let caps: Vec<f64> = clean
        .iter()
        .map(|(_, t)| t.reason_fraction(POWER_CAP))
        .collect();
    if now.reason_fraction(POWER_CAP) < CAPPED || median(&caps).is_none_or(|m| m < CAPPED) {
        return Capped::No;
    }
    let limits: Vec<f64> = clean.iter().filter_map(|(_, t)| t.power_limit_w).collect();
    if let (Some(l), Some(h)) = (now.power_limit_w, median(&limits)) {
        if l < h * (1.0 - LIMIT_DROP) {
            return Capped::Because(format!(
                "at a power limit of {l:.0} W against {h:.0} W in its clean runs"
            ));
        }
    }
    let temps: Vec<f64> = clean.iter().filter_map(|(_, t)| t.temperature_c).collect();
    if let (Some(t), Some(h)) = (now.temperature_c, median(&temps)) {
        if t >= h + TEMP_RISE_C {
            return Capped::Because(format!(
                "with the GPU at {t:.0} C against {h:.0} C in its clean runs"
            ));
        }
    }
    Capped::ByTheCode
}

/// Blames a worse suspect or regressed judgement on the environment when `finding`
/// explains it: the one place the shipped verdict (the gate) and the calibration study
/// (`bench history study`) decide it, so the study measures what users get. A drift (a
/// slow slide over several runs) is the code's whatever the telemetry says.
pub(crate) fn excuse(judgement: &mut Judgement, finding: Option<&Finding>) {
    let worse = judgement.rel_change.is_some_and(|r| r < 0.0);
    if worse
        && matches!(
            judgement.verdict,
            HistoryVerdict::Suspect | HistoryVerdict::Regressed
        )
        && !judgement.drift
        && finding.is_some_and(Finding::explains)
    {
        judgement.verdict = HistoryVerdict::Environment;
    }
}

/// Compares `now` (the cell's telemetry, with its throughput `value`) with `clean` (its
/// recent clean runs: throughput and telemetry), for a loss of `rel_change` (negative:
/// worse). `None` when the cell has no telemetry.
pub(crate) fn explain(
    now: Option<&CellTelemetry>,
    value: f64,
    clean: &[(f64, &CellTelemetry)],
    rel_change: f64,
) -> Option<Finding> {
    let now = now?;
    let mut f = Finding {
        clean_runs: clean.len(),
        ..Finding::default()
    };
    for p in &now.foreign {
        let mem = p
            .used_mib
            .map(|m| format!(", {m:.0} MiB"))
            .unwrap_or_default();
        f.causes.push(format!(
            "a foreign process computed on GPU {} during the measured steps: pid {} `{}`{mem}",
            p.gpu, p.pid, p.name
        ));
    }
    for p in &now.unverified {
        f.notes.push(format!(
            "GPU {} also ran pid {} `{}`, which this host's /proc does not show (another PID namespace), so it is not counted as foreign",
            p.gpu, p.pid, p.name
        ));
    }
    let enough = clean.len() >= MIN_CLEAN;
    // The clocks, and tokens/s per SM MHz.
    let mut clock_lower = false;
    if let Some(clk) = now.sm_clock_mhz.filter(|c| *c > 0.0) {
        let clocks: Vec<f64> = clean
            .iter()
            .filter_map(|(_, t)| t.sm_clock_mhz)
            .filter(|c| *c > 0.0)
            .collect();
        let per_mhz: Vec<f64> = clean
            .iter()
            .filter_map(|(v, t)| t.sm_clock_mhz.filter(|c| *c > 0.0).map(|c| v / c))
            .collect();
        let utils: Vec<f64> = clean
            .iter()
            .filter_map(|(_, t)| t.utilization_pct)
            .collect();
        let figures = ClockFigures {
            sm_clock_mhz: clk,
            history_sm_clock_mhz: median(&clocks),
            per_mhz: value / clk,
            history_per_mhz: median(&per_mhz),
            utilization_pct: now.utilization_pct,
            history_utilization_pct: median(&utils),
        };
        if enough && clocks.len() >= MIN_CLEAN {
            let centre = median(&clocks).unwrap_or(clk);
            let sigma = 1.4826 * mad(&clocks).unwrap_or(0.0);
            let half = (CLOCK_SIGMAS * sigma).max(CLOCK_FLOOR * centre);
            let change = clk / centre - 1.0;
            if clk < centre - half {
                clock_lower = true;
                let per = figures
                    .per_mhz_change()
                    .map(|c| format!("; tokens/s per SM MHz {:+.1}%", c * 100.0))
                    .unwrap_or_default();
                let text = format!(
                    "the SM clock averaged {clk:.0} MHz against {centre:.0} (+-{half:.0}) in its last {} clean runs ({:+.1}%){per}",
                    clocks.len(),
                    change * 100.0
                );
                // The clock explains the loss when it accounts for at least half of it,
                // and when something outside the code set it (see `capped_cause`).
                if rel_change < 0.0 && change <= rel_change / 2.0 {
                    match capped_cause(now, clean) {
                        Capped::No => f.causes.push(text),
                        Capped::Because(why) => f.causes.push(format!("{text}, {why}")),
                        Capped::ByTheCode => f.notes.push(format!(
                            "{text}, at the power cap with the same power limit and temperature as its clean runs: the clock follows the power the code draws per cycle, so it excuses nothing"
                        )),
                    }
                } else {
                    f.notes
                        .push(format!("{text}, which does not explain the loss"));
                }
            }
        }
        if let (Some(u), Some(h)) = (figures.utilization_pct, figures.history_utilization_pct) {
            if enough && (u - h).abs() >= 5.0 {
                f.notes.push(format!(
                    "GPU utilisation {u:.0}% against {h:.0}% in its clean runs"
                ));
            }
        }
        f.clock = Some(figures);
    }
    host_causes(now, clean, rel_change, &mut f);
    // Slowdown reasons the history does not show.
    if enough {
        let with: Vec<&&CellTelemetry> = clean
            .iter()
            .map(|(_, t)| t)
            .filter(|t| !t.reasons.is_empty())
            .collect();
        if with.len() >= MIN_CLEAN {
            for (reason, &frac) in &now.reasons {
                if frac < REASON_PRESENT {
                    continue;
                }
                let before = with
                    .iter()
                    .map(|t| t.reason_fraction(reason))
                    .fold(0.0, f64::max);
                if before > REASON_ABSENT {
                    continue;
                }
                let text = format!(
                    "{reason} in {:.0}% of its samples, at most {:.0}% in its last {} clean runs",
                    frac * 100.0,
                    before * 100.0,
                    with.len()
                );
                if reason != POWER_CAP || clock_lower {
                    f.causes.push(text);
                } else {
                    f.notes.push(format!("{text}, at an unchanged clock"));
                }
            }
        }
    }
    Some(f)
}

/// The host's figures against the clean runs' (see the module docs): causes when the
/// run is worse, notes otherwise.
fn host_causes(
    now: &CellTelemetry,
    clean: &[(f64, &CellTelemetry)],
    rel_change: f64,
    f: &mut Finding,
) {
    let Some(h) = &now.host else { return };
    let before: Vec<&crate::telemetry::host::HostFigures> =
        clean.iter().filter_map(|(_, t)| t.host.as_ref()).collect();
    if before.len() < MIN_CLEAN {
        return;
    }
    let worse = rel_change < 0.0;
    let mut push = |text: String| {
        if worse {
            f.causes.push(text);
        } else {
            f.notes
                .push(format!("{text}, which does not explain a loss"));
        }
    };
    let foreign: Vec<f64> = before.iter().map(|b| b.foreign_cpus).collect();
    // Adding +0.0 turns the -0.0 that stores written before the telemetry's fix hold (an
    // empty sum) into 0.0, which the verdict prints.
    let centre = median(&foreign).unwrap_or(0.0) + 0.0;
    let sigma = 1.4826 * mad(&foreign).unwrap_or(0.0);
    // Foreign load slows a cell only where it leaves no CPU idle: a spare core running a
    // compile job beside the benchmark takes nothing from it.
    let contended = h.cpu_busy_pct >= HOST_CONTENDED_PCT || h.run_queue > h.cpus as f64;
    if contended && h.foreign_cpus >= centre + HOST_CPU_MIN.max(4.0 * sigma) {
        let queue: Vec<f64> = before.iter().map(|b| b.run_queue).collect();
        let top: Vec<String> = h
            .top
            .iter()
            .map(|p| {
                format!(
                    "`{}` (pid {}) {:.0}%",
                    crate::sanitize::clean(&p.name),
                    p.pid,
                    p.cpus * 100.0
                )
            })
            .collect();
        push(format!(
            "the host was busy: other processes used {:.1} of its {} CPUs during the measured steps against {:.1} in its last {} clean runs (CPUs {:.0}% busy, run queue {:.1} against {:.1}){}",
            h.foreign_cpus,
            h.cpus,
            centre,
            before.len(),
            h.cpu_busy_pct,
            h.run_queue,
            median(&queue).unwrap_or(0.0),
            if top.is_empty() {
                String::new()
            } else {
                format!("; busiest: {}", top.join(", "))
            }
        ));
    }
    let swap: Vec<f64> = before.iter().map(|b| b.swap_pages_per_s).collect();
    let swap_before = median(&swap).unwrap_or(0.0);
    if h.swap_pages_per_s >= SWAP_PAGES_MIN && swap_before < SWAP_PAGES_MIN / 10.0 {
        push(format!(
            "the host swapped {:.0} pages/s during the measured steps against {:.1} in its clean runs",
            h.swap_pages_per_s, swap_before
        ));
    }
    let pressure: Vec<f64> = before
        .iter()
        .filter_map(|b| b.memory_pressure_pct)
        .collect();
    if let (Some(p), Some(was)) = (h.memory_pressure_pct, median(&pressure)) {
        if p >= PRESSURE_MIN && was < 1.0 {
            push(format!(
                "tasks waited for memory {p:.0}% of the time (PSI) against {was:.1}% in its clean runs"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::ForeignProcess;
    use indexmap::IndexMap;

    fn tele(clock: f64, cap: f64, thermal: f64) -> CellTelemetry {
        let mut reasons = IndexMap::new();
        reasons.insert("SW power cap".to_string(), cap);
        reasons.insert("HW thermal slowdown".to_string(), thermal);
        CellTelemetry {
            samples: 30,
            gpus: vec![0],
            sm_clock_mhz: Some(clock),
            max_sm_clock_mhz: Some(1980.0),
            power_w: Some(690.0),
            repeat_power_w: Vec::new(),
            power_limit_w: Some(700.0),
            temperature_c: Some(70.0),
            utilization_pct: Some(100.0),
            reasons,
            foreign: vec![],
            unverified: vec![],
            host: None,
        }
    }

    fn clean() -> Vec<CellTelemetry> {
        [1755.0, 1770.0, 1740.0, 1760.0, 1755.0]
            .iter()
            .map(|&c| tele(c, 1.0, 0.0))
            .collect()
    }

    fn pairs(c: &[CellTelemetry]) -> Vec<(f64, &CellTelemetry)> {
        c.iter().map(|t| (500_000.0, t)).collect()
    }

    #[test]
    fn a_power_cap_every_clean_run_shows_excuses_nothing() {
        // The case seen on an H100: SW power cap in every sample of every run, the same
        // clock, 3% slower. The code is to blame.
        let c = clean();
        let now = tele(1757.0, 1.0, 0.0);
        let f = explain(Some(&now), 485_000.0, &pairs(&c), -0.03).unwrap();
        assert!(!f.explains(), "{f:?}");
        let clock = f.clock.unwrap();
        assert!((clock.per_mhz_change().unwrap() + 0.03).abs() < 0.002);
    }

    #[test]
    fn a_lower_clock_that_accounts_for_the_loss_is_the_environment() {
        let c = clean();
        // At the cap with a lower power limit, or on a hotter chip: the machine's doing.
        let mut now = tele(1580.0, 1.0, 0.0);
        now.power_limit_w = Some(600.0);
        let f = explain(Some(&now), 450_000.0, &pairs(&c), -0.10).unwrap();
        assert!(f.explains(), "{f:?}");
        assert!(f.causes[0].contains("1580 MHz against 1755"), "{f:?}");
        assert!(f.causes[0].contains("600 W against 700 W"), "{f:?}");
        let mut now = tele(1580.0, 1.0, 0.0);
        now.temperature_c = Some(84.0);
        let f = explain(Some(&now), 450_000.0, &pairs(&c), -0.10).unwrap();
        assert!(f.causes[0].contains("84 C against 70 C"), "{f:?}");
        // At the cap with the same limit and temperature the clock follows the code's
        // power: nothing is excused (a clock only explains loss the code did not cause).
        let now = tele(1580.0, 1.0, 0.0);
        let f = explain(Some(&now), 450_000.0, &pairs(&c), -0.10).unwrap();
        assert!(!f.explains(), "{f:?}");
        assert!(
            f.notes[0].contains("follows the power the code draws"),
            "{f:?}"
        );
        // Off the cap (application clocks, thermals), a lower clock is the machine's.
        let calm: Vec<CellTelemetry> = [1755.0, 1770.0, 1740.0, 1760.0]
            .iter()
            .map(|&x| tele(x, 0.0, 0.0))
            .collect();
        let now = tele(1580.0, 0.0, 0.0);
        let f = explain(Some(&now), 450_000.0, &pairs(&calm), -0.10).unwrap();
        assert!(f.explains(), "{f:?}");
        let c = clean();
        let mut now = tele(1580.0, 1.0, 0.0);
        now.power_limit_w = Some(600.0);
        // The same clock drop beside a loss three times as large does not explain it.
        let f = explain(Some(&now), 350_000.0, &pairs(&c), -0.30).unwrap();
        assert!(!f.explains(), "{f:?}");
        assert!(f.notes[0].contains("does not explain"));
    }

    #[test]
    fn a_new_thermal_reason_or_a_foreign_process_is_the_environment() {
        let c = clean();
        let now = tele(1750.0, 1.0, 0.4);
        let f = explain(Some(&now), 480_000.0, &pairs(&c), -0.04).unwrap();
        assert!(f.explains());
        assert!(
            f.causes[0].starts_with("HW thermal slowdown in 40%"),
            "{f:?}"
        );
        let mut now = tele(1755.0, 1.0, 0.0);
        now.foreign.push(ForeignProcess {
            gpu: 0,
            pid: 4242,
            name: "python3".into(),
            used_mib: Some(2048.0),
        });
        // A foreign process needs no history.
        let f = explain(Some(&now), 300_000.0, &[], -0.4).unwrap();
        assert!(
            f.causes[0].contains("pid 4242 `python3`, 2048 MiB"),
            "{f:?}"
        );
    }

    #[test]
    fn without_history_or_telemetry_nothing_is_excused() {
        let now = tele(1200.0, 1.0, 0.9);
        let c = clean();
        let f = explain(Some(&now), 300_000.0, &pairs(&c[..2]), -0.4).unwrap();
        assert!(!f.explains(), "{f:?}");
        assert!(explain(None, 1.0, &pairs(&c), -0.4).is_none());
        // A power cap that appears at an unchanged clock is only a note.
        let calm: Vec<CellTelemetry> = [1755.0, 1760.0, 1750.0]
            .iter()
            .map(|&x| tele(x, 0.0, 0.0))
            .collect();
        let now = tele(1755.0, 0.8, 0.0);
        let f = explain(Some(&now), 485_000.0, &pairs(&calm), -0.03).unwrap();
        assert!(!f.explains(), "{f:?}");
        assert_eq!(f.notes.len(), 1);
    }

    fn host(foreign: f64, queue: f64) -> CellTelemetry {
        CellTelemetry::host_only(crate::telemetry::host::HostFigures {
            samples: 12,
            cpus: 2,
            cpu_busy_pct: 50.0 + foreign * 25.0,
            foreign_cpus: foreign,
            run_queue: queue,
            memory_pressure_pct: Some(0.0),
            swap_pages_per_s: 0.0,
            top: if foreign > 0.1 {
                vec![crate::telemetry::host::HostProcess {
                    pid: 4242,
                    name: "stress-ng\u{1b}]0;x".into(),
                    cpus: foreign,
                }]
            } else {
                vec![]
            },
        })
    }

    /// Issue 31: a cell slowed while the host's CPUs were busy with other work is the
    /// environment, naming the processes; the same load on a run that is not worse only
    /// notes it; no clean runs with host figures, no excuse.
    #[test]
    fn a_busy_host_explains_a_loss_and_names_its_processes() {
        let c: Vec<CellTelemetry> = [0.02, 0.0, 0.05, 0.01]
            .iter()
            .map(|&x| host(x, 1.0))
            .collect();
        let now = host(1.9, 4.0);
        let f = explain(Some(&now), 400.0, &pairs(&c), -0.3).unwrap();
        assert!(f.explains(), "{f:?}");
        let cause = &f.causes[0];
        assert!(
            cause.contains("other processes used 1.9 of its 2 CPUs"),
            "{cause}"
        );
        assert!(cause.contains("(pid 4242) 190%"), "{cause}");
        assert!(!cause.contains('\u{1b}'), "escapes are cleaned: {cause}");
        let same = host(0.03, 1.0);
        assert!(!explain(Some(&same), 400.0, &pairs(&c), -0.3)
            .unwrap()
            .explains());
        let faster = explain(Some(&now), 600.0, &pairs(&c), 0.1).unwrap();
        assert!(!faster.explains() && faster.notes.len() == 1, "{faster:?}");
        assert!(!explain(Some(&now), 400.0, &pairs(&c[..2]), -0.3)
            .unwrap()
            .explains());
        // Swapping where the clean runs did not.
        let mut swapping = host(0.0, 1.0);
        swapping.host.as_mut().unwrap().swap_pages_per_s = 500.0;
        let f = explain(Some(&swapping), 400.0, &pairs(&c), -0.3).unwrap();
        assert!(f.causes[0].contains("swapped 500 pages/s"), "{f:?}");
    }
}

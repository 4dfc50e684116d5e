//! The plausibility bound of every metric: what no measurement of a training step can
//! give, whatever the hardware, checked at every door a figure comes in by (a worker's
//! events, a framework's log read by `bench adapt` or `bench ingest`, a run folder
//! imported into the history). A value outside its bound is refused there with where it
//! came from; it never reaches a baseline or the history, where it would make up change
//! points (`20.03K -> infT (+inf%)`) and verdicts (`improved +inf%`).
//!
//! The bounds are physical, not statistical: loose enough for any run of the next years,
//! tight enough that a forged, misread or overflowed figure is outside.
//!
//! | metric | bound | why |
//! |---|---|---|
//! | `step_time_s` | 1 µs to 1 day | no step is shorter than a kernel launch; the collector's day |
//! | `tokens_per_s` | 1e-5 to 1e15 | one token per day at least; 1e6 GPUs at the per-GPU bound |
//! | `tokens_per_s_per_gpu` | 1e-5 to 1e10 | a 1M-parameter model at [`UNKNOWN_DEVICE_TFLOPS`] does 4e9 |
//! | `tflops_per_gpu` | above 0, at most [`UNKNOWN_DEVICE_TFLOPS`] | ten times the fastest peak known |
//! | `mfu` | above 0, at most 1 | a fraction of the peak |
//! | `peak_mem_bytes` | 0 to 1 TiB | no device has more memory (0: not measured, a CPU) |
//! | `time_to_1t_tokens_days` | above 0, at most 1.2e12 | 1e12 tokens at the slowest tokens/s |
//! | `tokens_per_joule` | above 0, at most 1e10 | the tokens/s/GPU bound on a GPU drawing a watt |
//! | `kwh_per_1t_tokens` | above 0, at most 1e14 | 1e12 tokens at the slowest tokens/s on 1e6 GPUs at 3 kW |
//! | any other metric | finite, not subnormal, magnitude below 1e300 | a number, not an overflow |
//!
//! Every value must also be a finite, normal `f64` (a subnormal is an underflow, not a
//! measurement): NaN, infinities and denormals are refused for every metric.
//!
//! A results document is held to them beyond its metrics, by every reader that renders,
//! merges or imports it (`RunResults::implausible_measurement`), with the rule the
//! worker's door holds events to (`StepEvent::implausible`, `SummaryEvent::implausible`):
//! each step of each repeat (`repeats[].steps[].step_time_s` finite, above 0 and within
//! the step time's 1 µs to 1 day; `tokens`, a count that cannot be negative, at most 2^53)
//! and each repeat's summary (each metric within its bound; the FLOPs per token above 0
//! and the time to the first step not negative, both below 1e300; a world size of 1 to
//! [`MAX_WORLD_SIZE`] ranks). The HTML report draws those step times, the gate reads them
//! and the history keeps the loss curve beside them, so a forged step of 1e308 s or a
//! summary of -1 tok/s would otherwise pass for a measurement there.
//!

/// The peak a device the table does not know (a CPU, a newer GPU) is held to: ten times the
/// fastest peak known, so no real device is refused and a forged figure still is. It lives
/// here, below every stage, so the bounds import nothing (`metrics::flops` uses it).
pub(crate) const UNKNOWN_DEVICE_TFLOPS: f64 = 26_149.0;

/// The most memory one device has (1 TiB; the largest today have under 300 GB).
pub const MAX_DEVICE_MEM_BYTES: f64 = (1u64 << 40) as f64;
/// The shortest step believed.
pub const MIN_STEP_S: f64 = 1e-6;
/// The longest step believed: a day (as `bench ingest`'s collector).
pub const MAX_STEP_S: f64 = 86_400.0;
/// The most ranks (GPUs) of one run.
pub const MAX_WORLD_SIZE: u64 = 1 << 20;
/// The most samples (repeats) one value may hold, at every door (a results folder imported
/// or merged) and on the way out of the history: no cell repeats ten thousand times, and a
/// forged row of a million samples made `bench history study` run for minutes.
pub const MAX_SAMPLES: usize = 10_000;
/// The widest relative spread (half the range of a value's repeats over their median)
/// believed, for any metric: a million times the median. Loose, since a metric whose
/// median lies near zero (a loss, an exposed-communication time) can spread wide; what it
/// refuses is an overflow or a forged figure (`1e300`, printed as 300 digits of percent).
pub const MAX_REL_SPREAD: f64 = 1e6;

/// Refuses a relative spread that is not a finite number in `[0, MAX_REL_SPREAD]`.
pub fn check_rel_spread(v: f64) -> Result<(), String> {
    if v.is_finite() && (0.0..=MAX_REL_SPREAD).contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "{v:e} is not a relative spread (a finite number from 0 to {MAX_REL_SPREAD})"
        ))
    }
}

/// The most GPU-seconds one run's verdict is believed to cost: a million GPUs for a year
/// (3.2e13). A run's measuring, confirming and triage each take at most that.
pub const MAX_GPU_S: f64 = 1e6 * 365.25 * 86_400.0;

/// Refuses GPU-seconds (`name`: which figure) that are not a finite number in
/// `[0, MAX_GPU_S]`: what a forged or overflowed cost (`-5`, `1e308`) would be.
pub fn check_gpu_seconds(name: &str, v: f64) -> Result<(), String> {
    if v.is_finite() && (0.0..=MAX_GPU_S).contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "{name} is {v:e}: not GPU-seconds of a run (a finite number from 0 to {MAX_GPU_S:e})"
        ))
    }
}

/// The closed range `[lo, hi]` a metric's value lies in (`lo_open`: above `lo`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub lo: f64,
    pub lo_open: bool,
    pub hi: f64,
    /// Why, in a few words, for the message.
    pub why: &'static str,
}

/// The bound of metric `name` ([`None`]: a metric outside the catalog, held to
/// [`check`]'s generic rule only).
pub fn bound(name: &str) -> Option<Bound> {
    let b = |lo, lo_open, hi, why| {
        Some(Bound {
            lo,
            lo_open,
            hi,
            why,
        })
    };
    match name {
        "step_time_s" => b(
            MIN_STEP_S,
            false,
            MAX_STEP_S,
            "a step takes between a microsecond and a day",
        ),
        "tokens_per_s" => b(
            1e-5,
            false,
            1e15,
            "at least a token a day, at most 1e10 tokens/s on each of a million GPUs",
        ),
        "tokens_per_s_per_gpu" => b(
            1e-5,
            false,
            1e10,
            "at least a token a day, at most what the fastest device allows the smallest model",
        ),
        "tflops_per_gpu" => b(
            0.0,
            true,
            UNKNOWN_DEVICE_TFLOPS,
            "above 0 and at most ten times the fastest peak in the table",
        ),
        "mfu" => b(0.0, true, 1.0, "a fraction of the peak: above 0, at most 1"),
        "peak_mem_bytes" => b(
            0.0,
            false,
            MAX_DEVICE_MEM_BYTES,
            "no device has more than 1 TiB",
        ),
        "time_to_1t_tokens_days" => b(
            0.0,
            true,
            1.2e12,
            "1e12 tokens at between a token a day and the tokens/s bound",
        ),
        // No accelerator that trains draws less than a watt, and the telemetry believes no
        // board above 3 kW (`telemetry::bounds::POWER_W`).
        "tokens_per_joule" => b(
            0.0,
            true,
            1e10,
            "above 0 and at most the tokens/s/GPU bound on a GPU drawing one watt",
        ),
        // 1e-5 tokens/s on a million GPUs at 3 kW each is 3.3e-15 tokens/J, or 8.3e13 kWh.
        "kwh_per_1t_tokens" => b(
            0.0,
            true,
            1e14,
            "above 0 and at most 1e12 tokens at the slowest tokens/s on a million 3 kW GPUs",
        ),
        _ => None,
    }
}

/// Checks one value of metric `name`; `Err` says why it cannot be a measurement (the
/// caller adds where it came from).
pub fn check(name: &str, v: f64) -> Result<(), String> {
    if !v.is_finite() {
        return Err(format!("{name} is {v}: not a finite number"));
    }
    if v != 0.0 && !v.is_normal() {
        return Err(format!(
            "{name} is {v:e}: a subnormal number (an underflow), not a measurement"
        ));
    }
    match bound(name) {
        Some(b) => {
            let low = if b.lo_open { v <= b.lo } else { v < b.lo };
            if low || v > b.hi {
                let lo = if b.lo_open { "(" } else { "[" };
                return Err(format!(
                    "{name} is {v:e}, outside its plausible range {lo}{:e}, {:e}] ({})",
                    b.lo, b.hi, b.why
                ));
            }
            Ok(())
        }
        None if v.abs() >= 1e300 => Err(format!(
            "{name} is {v:e}: no metric of a training run is that large"
        )),
        None => Ok(()),
    }
}

/// The metrics a workload reports as 0 when it could not compute them (a device with no
/// peak in the table has no MFU; a worker that does not count FLOPs has no TFLOP/s).
pub const ZERO_IS_NOT_COMPUTED: [&str; 2] = ["tflops_per_gpu", "mfu"];

/// Whether a stored metric is one its run could not compute, and so is no measurement:
/// a NaN value, or for [`ZERO_IS_NOT_COMPUTED`] a 0 value or sample (a worker's summary
/// with `"mfu": 0` leaves the metric absent, and a metric is present only when every
/// repeat gave it). Such a metric is left out of the history rather than refused, at
/// every door: `bench matrix --history` and `bench history import` record the same.
pub fn not_computed(name: &str, value: f64, samples: &[f64]) -> bool {
    value.is_nan()
        || (ZERO_IS_NOT_COMPUTED.contains(&name) && (value == 0.0 || samples.contains(&0.0)))
}

/// Checks an optional value (absent is fine).
pub fn check_opt(name: &str, v: Option<f64>) -> Result<(), String> {
    v.map_or(Ok(()), |v| check(name, v))
}

/// Checks a world size (ranks of a run) a framework or worker reports against the GPUs
/// of the cell: at least one rank, and exactly the cell's GPUs when it has any.
pub fn check_world_size(world_size: u64, cell_gpus: u32) -> Result<(), String> {
    if world_size == 0 || world_size > MAX_WORLD_SIZE {
        return Err(format!(
            "a world size of {world_size}: a run has 1 to {MAX_WORLD_SIZE} ranks"
        ));
    }
    if cell_gpus > 0 && world_size != u64::from(cell_gpus) {
        return Err(format!(
            "a world size of {world_size} on a cell of {cell_gpus} GPU(s): the figures per GPU would be wrong"
        ));
    }
    if cell_gpus == 0 && world_size > 1024 {
        return Err(format!(
            "a world size of {world_size} on a CPU cell: more ranks than any host runs"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_values_are_refused_for_every_metric() {
        for m in crate::metrics::catalog::CATALOG {
            for v in [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -1.0,
                1e308,
                5e-324,
            ] {
                assert!(check(m.name, v).is_err(), "{} {v}", m.name);
            }
        }
        for m in [
            "step_time_s",
            "tokens_per_s",
            "mfu",
            "tflops_per_gpu",
            "tokens_per_joule",
            "kwh_per_1t_tokens",
        ] {
            assert!(check(m, 0.0).is_err(), "{m}");
        }
        assert!(check("mfu", 1.01).is_err());
        assert!(check("my_metric", 1e301).is_err());
        assert!(check("my_metric", f64::MIN_POSITIVE / 2.0).is_err());
    }

    #[test]
    fn real_figures_pass() {
        for (m, v) in [
            ("step_time_s", 8.5),
            ("step_time_s", 0.002),
            ("tokens_per_s", 20_030.0),
            ("tokens_per_s_per_gpu", 3.5e5),
            ("tflops_per_gpu", 450.0),
            ("mfu", 0.42),
            ("peak_mem_bytes", 7.5e10),
            ("peak_mem_bytes", 0.0),
            ("time_to_1t_tokens_days", 577.8),
            // gpt2-125m on one H100 at 548 W (docs/results/gate-study-2026-11-25).
            ("tokens_per_joule", 912.4),
            ("kwh_per_1t_tokens", 304.4),
            ("my_metric", -3.0),
            ("my_metric", 0.0),
        ] {
            check(m, v).unwrap_or_else(|e| panic!("{m} {v}: {e}"));
        }
    }

    #[test]
    fn zero_is_not_computed_only_for_mfu_and_tflops() {
        assert!(not_computed("mfu", 0.0, &[0.0]));
        assert!(not_computed("tflops_per_gpu", 0.5, &[0.0, 0.5, 1.0]));
        assert!(not_computed("tokens_per_s", f64::NAN, &[]));
        assert!(!not_computed("tokens_per_s", 0.0, &[0.0]));
        assert!(!not_computed("mfu", 0.4, &[0.4]));
    }

    #[test]
    fn world_sizes() {
        check_world_size(8, 8).unwrap();
        check_world_size(1, 0).unwrap();
        assert!(check_world_size(4_000_000_000, 1).is_err());
        assert!(check_world_size(2, 1).is_err());
        assert!(check_world_size(0, 1).is_err());
    }
}

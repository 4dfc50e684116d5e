//! MaxText logs (`MaxText/metric_logger.py`, `MetricLogger.log_metrics`, 2025; earlier
//! `train.py` `record_scalar_metrics`): `completed step: 9, seconds: 1.150, TFLOP/s/device:
//! 470.000, Tokens/s/device: 57000.000, total_weights: 65536, loss: 10.880`. Steps count
//! from 0. `TFLOP/s/device` and `Tokens/s/device` are MaxText's own figures (its TFLOPs
//! count causal attention at half, so they differ from bench's by that much; listed beside
//! bench's, not used).
//!
//! `seconds` is the interval between step *dispatches* (JAX runs the step asynchronously;
//! on an H100 one step showed 0.011 s for 0.16 s of work). Where the lines carry absl's
//! timestamp (`I1125 16:36:34.648600 ...`), each printed once its step's metrics are back
//! from the device, the step time is the interval between consecutive step lines, as
//! `bench adapt` reads MaxText ([`crate::external::maxtext`]); the first line, and a log
//! without timestamps, keep `seconds`.

use std::sync::LazyLock;

use regex::Regex;

use super::parse::{count, field, pairs, Framework, LineParser, Logged, Own};
use crate::external::maxtext::StepClock;

static COMPLETED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"completed step: (\d+), seconds: ([^,]*),(.*)$").expect("static regex")
});

#[derive(Default)]
pub(crate) struct Maxtext {
    clock: StepClock,
}

impl LineParser for Maxtext {
    fn framework(&self) -> Framework {
        Framework::Maxtext
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        if !text.contains("completed step:") {
            return Ok(None);
        }
        let c = COMPLETED.captures(text).ok_or_else(|| {
            "a `completed step:` line without `, seconds: X,` (the line is cut: truncated log?)"
                .to_string()
        })?;
        // The fields after `seconds` are `key: value` pairs; a bare number there is the
        // other half of a decimal comma (`seconds: 8,5`), which would otherwise read as 8.
        let rest = c.get(3).map_or("", |m| m.as_str());
        let next = rest.split(',').next().unwrap_or("").trim();
        if !next.is_empty() && !next.contains(':') {
            return Err(format!(
                "`seconds` is `{},{next}`: a decimal comma (or a field bench does not know) where MaxText prints `seconds: X.Y, key: value`; refusing rather than reading {}",
                c[2].trim(),
                c[2].trim()
            ));
        }
        let seconds = field("seconds", &c[2])?;
        let step_time = self.clock.step_time(text.trim_start(), seconds)?;
        let f = pairs(c.get(3).map_or("", |m| m.as_str()), ",", ':');
        let get = |k: &str| f.get(k).map(|v| field(k, v)).transpose();
        Ok(Some(Logged {
            step: Some(count("completed step", &c[1])?),
            step_time_s: Some(step_time),
            loss: get("loss")?,
            own: Own {
                tokens_per_s_per_gpu: get("Tokens/s/device")?,
                tflops_per_gpu: get("TFLOP/s/device")?,
                mfu: None,
            },
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completed_step_line() {
        let line = "completed step: 9, seconds: 1.150, TFLOP/s/device: 470.000, Tokens/s/device: 57000.000, total_weights: 65536, loss: 10.880";
        let l = Maxtext::default().parse(None, line).unwrap().unwrap();
        assert_eq!(
            (l.step, l.step_time_s, l.loss),
            (Some(9), Some(1.15), Some(10.88))
        );
        assert_eq!(l.own.tokens_per_s_per_gpu, Some(57000.0));
        assert!(Maxtext::default()
            .parse(None, "completed step: 9, seconds: 1.1")
            .unwrap_err()
            .contains("cut"));
        assert!(Maxtext::default()
            .parse(None, "completed step: 9")
            .unwrap_err()
            .contains("truncated"));
        let e = Maxtext::default()
            .parse(
                None,
                "completed step: 9, seconds: 8,5, TFLOP/s/device: 470.000, loss: 10.880",
            )
            .unwrap_err();
        assert!(e.contains("decimal comma"), "{e}");
    }

    /// The captured H100 run's lines (MaxText 0.2.5): timed by their stamps, not by the
    /// dispatch intervals MaxText prints.
    #[test]
    fn stamped_lines_are_timed_between_lines() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/frameworks/maxtext-0.2.5-h100-first-steps.log"
        ))
        .unwrap();
        let mut p = Maxtext::default();
        let times: Vec<f64> = text
            .lines()
            .filter_map(|l| p.parse(None, l).unwrap())
            .map(|l| l.step_time_s.unwrap())
            .collect();
        assert_eq!(times.len(), 3);
        assert!((times[0] - 0.199).abs() < 1e-12);
        assert!((times[2] - 0.164058).abs() < 1e-9, "{times:?}");
    }
}

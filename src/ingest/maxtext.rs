//! MaxText logs (`MaxText/metric_logger.py`, `MetricLogger.log_metrics`, 2025; earlier
//! `train.py` `record_scalar_metrics`): `completed step: 9, seconds: 1.150, TFLOP/s/device:
//! 470.000, Tokens/s/device: 57000.000, total_weights: 65536, loss: 10.880`. Steps count
//! from 0. `TFLOP/s/device` and `Tokens/s/device` are MaxText's own figures (its TFLOPs
//! count causal attention at half, so they differ from bench's by that much; listed beside
//! bench's, not used).

use std::sync::LazyLock;

use regex::Regex;

use super::parse::{count, field, pairs, Framework, LineParser, Logged, Own};

static COMPLETED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"completed step: (\d+), seconds: ([^,]*),(.*)$").expect("static regex")
});

pub(crate) struct Maxtext;

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
        let f = pairs(c.get(3).map_or("", |m| m.as_str()), ",", ':');
        let get = |k: &str| f.get(k).map(|v| field(k, v)).transpose();
        Ok(Some(Logged {
            step: Some(count("completed step", &c[1])?),
            step_time_s: Some(field("seconds", &c[2])?),
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
        let l = Maxtext.parse(None, line).unwrap().unwrap();
        assert_eq!(
            (l.step, l.step_time_s, l.loss),
            (Some(9), Some(1.15), Some(10.88))
        );
        assert_eq!(l.own.tokens_per_s_per_gpu, Some(57000.0));
        assert!(Maxtext
            .parse(None, "completed step: 9, seconds: 1.1")
            .unwrap_err()
            .contains("cut"));
        assert!(Maxtext
            .parse(None, "completed step: 9")
            .unwrap_err()
            .contains("truncated"));
    }
}

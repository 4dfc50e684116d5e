//! torchtitan logs (`torchtitan/components/metrics.py`, `MetricsProcessor.log`, 0.2.x):
//! `[titan] 2026-11-22 10:00:04,500 - root - INFO - step:  2  loss:  9.80000  grad_norm:
//! 1.5000  memory: 10.02GiB(7.16%)  tps: 4,096  tflops: 10.24  mfu: 1.04%` every
//! `metrics.log_freq` steps. The step time is the interval between the reporting rank's
//! consecutive step lines over the steps between them (the interval torchtitan's own `tps`
//! divides by); the first logged step has no earlier line, so it gives no time (it is the
//! start-up step anyway). `tps`, `tflops` and `mfu` are torchtitan's own, per GPU.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

use super::parse::{count, field, percent_field, Framework, LineParser, Logged, Own};

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d{3}) - \S+ - INFO - step:\s*(\d+)\s+(.*)$",
    )
    .expect("static regex")
});
static FIELD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"([a-z_]+):\s*(\S+)").expect("static regex"));

/// The previous step line of each rank: its step and its time in seconds.
#[derive(Default)]
pub(crate) struct Torchtitan {
    last: BTreeMap<Option<u32>, (u64, f64)>,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

impl LineParser for Torchtitan {
    fn framework(&self) -> Framework {
        Framework::Torchtitan
    }

    fn parse(&mut self, rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        if !(text.contains(" - INFO - step:") && text.contains("tps:")) {
            return Ok(None);
        }
        // The line ends with `mfu: X%`; without it the line is cut and `tps` may be too.
        if !(text.contains("mfu:") && text.trim_end().ends_with('%')) {
            return Err(
                "a torchtitan step line that does not end with `mfu: X%`: the line is cut (truncated log?)"
                    .into(),
            );
        }
        let c = STEP.captures(text).ok_or_else(|| {
            "a torchtitan step line without its `YYYY-MM-DD HH:MM:SS,mmm - root - INFO - step: N` head (truncated?)".to_string()
        })?;
        let n = |i: usize| c[i].parse::<i64>().unwrap_or(0);
        let (mo, d, h, mi, s) = (n(2), n(3), n(4), n(5), n(6));
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
            return Err(format!(
                "the time stamp {}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} is not a time",
                n(1)
            ));
        }
        let at = days_from_civil(n(1), mo, d) as f64 * 86_400.0
            + (h * 3600 + mi * 60 + s) as f64
            + n(7) as f64 / 1000.0;
        let step = count("step", &c[8])?;
        let rest = c.get(9).map_or("", |m| m.as_str());
        let f: BTreeMap<&str, &str> = FIELD
            .captures_iter(rest)
            .filter_map(|m| Some((m.get(1)?.as_str(), m.get(2)?.as_str())))
            .collect();
        let get = |k: &str| f.get(k).map(|v| field(k, v)).transpose();
        let tps = f
            .get("tps")
            .ok_or_else(|| "no `tps` value (a cut line?)".to_string())?;
        let step_time_s = match self.last.get(&rank) {
            Some(&(prev, t)) if step > prev => Some((at - t) / (step - prev) as f64),
            _ => None,
        };
        self.last.insert(rank, (step, at));
        Ok(Some(Logged {
            step: Some(step),
            step_time_s,
            loss: get("loss")?,
            own: Own {
                tokens_per_s_per_gpu: Some(field("tps", tps)?),
                tflops_per_gpu: get("tflops")?,
                mfu: f
                    .get("mfu")
                    .map(|v| percent_field("mfu", v))
                    .transpose()?
                    .map(|m| m / 100.0),
            },
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_between_step_lines() {
        let mut p = Torchtitan::default();
        let l1 = "[titan] 2026-12-31 23:59:59,500 - root - INFO - step:  1  loss:  9.90000  grad_norm:  1.5000  memory: 10.01GiB(7.15%)  tps: 512  tflops: 1.28  mfu: 0.13%";
        let l3 = "[titan] 2027-01-01 00:00:00,500 - root - INFO - step:  3  loss:  9.70000  grad_norm:  1.5000  memory: 10.03GiB(7.16%)  tps: 4,096  tflops: 10.24  mfu: 1.04%";
        let a = p.parse(Some(0), l1).unwrap().unwrap();
        assert_eq!(a.step_time_s, None);
        let b = p.parse(Some(0), l3).unwrap().unwrap();
        // One second over two steps, across a year's end.
        assert_eq!(b.step_time_s, Some(0.5));
        assert_eq!(b.own.tokens_per_s_per_gpu, Some(4096.0));
        assert_eq!(b.own.mfu, Some(0.0104));
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let cut = "[titan] 2026-12-31 23:59:59,500 - root - INFO - step:  4  loss: 9.1 tps: ";
        assert!(p.parse(Some(0), cut).is_err());
    }
}

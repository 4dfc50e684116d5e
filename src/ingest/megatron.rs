//! Megatron-LM / Megatron-Core logs (`megatron/training/training.py`, `training_log`, core
//! r0.9 to r0.13): every `--log-interval` iterations the last rank prints
//! ` [2025-01-01 12:00:00] iteration 20/ 100 | consumed samples: 2560 | elapsed time per
//! iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 | learning rate:
//! 1.0E-04 | global batch size: 128 | lm loss: 7.1E+00 | loss scale: 1.0 | grad norm: 1.2 |
//! number of skipped iterations: 0 | number of nan iterations: 0 |`. The time is the mean
//! over the interval's iterations, so each line is one step of that mean length.
//! `throughput per GPU` is printed with `--log-throughput`; some forks print
//! `throughput (token/sec/GPU)` instead.

use super::parse::{count, field, Framework, LineParser, Logged, Own};
use crate::external::megatron::{TrainingLogLine, ELAPSED};

pub(crate) struct Megatron;

impl LineParser for Megatron {
    fn framework(&self) -> Framework {
        Framework::Megatron
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        let Some(line) = TrainingLogLine::read(text) else {
            return Ok(None);
        };
        let line = line?;
        let ms = line
            .get(ELAPSED)
            .ok_or_else(|| format!("no `{ELAPSED}` value (a cut line?)"))?;
        if let Some(nan) = line.get("number of nan iterations") {
            if count("number of nan iterations", nan)? > 0 {
                return Err(format!(
                    "{nan} iteration(s) of this interval had a NaN loss: the run diverged"
                ));
            }
        }
        let get = |k: &str| line.get(k).map(|v| field(k, v)).transpose();
        Ok(Some(Logged {
            step: Some(count("iteration", line.step)?),
            step_time_s: Some(field(ELAPSED, ms)? / 1000.0),
            loss: get("lm loss")?.or(get("loss")?),
            own: Own {
                tflops_per_gpu: get("throughput per GPU (TFLOP/s/GPU)")?,
                tokens_per_s_per_gpu: get("throughput (token/sec/GPU)")?,
                mfu: None,
            },
            global_batch: line
                .get("global batch size")
                .map(|v| count("global batch size", v))
                .transpose()?,
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = " [2025-03-01 10:00:05] iteration       20/     100 | consumed samples:         2560 | elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 456.7 | learning rate: 1.000000E-04 | global batch size:   128 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |";

    #[test]
    fn training_log_line() {
        let l = Megatron.parse(None, LINE).unwrap().unwrap();
        assert_eq!(l.step, Some(20));
        assert!((l.step_time_s.unwrap() - 1.2345).abs() < 1e-12);
        assert_eq!(l.own.tflops_per_gpu, Some(456.7));
        assert_eq!(l.global_batch, Some(128));
        assert!((l.loss.unwrap() - 7.123456).abs() < 1e-12);
    }

    #[test]
    fn nan_iterations_and_cut_lines() {
        let nan = LINE.replace("nan iterations:   0", "nan iterations:   3");
        assert!(Megatron.parse(None, &nan).unwrap_err().contains("NaN"));
        let cut = &LINE[..LINE.find("1234.5").unwrap() + 2];
        assert!(Megatron.parse(None, cut).unwrap_err().contains("cut"));
        let empty = LINE.replace("(ms): 1234.5", "(ms): ");
        assert!(Megatron
            .parse(None, &empty)
            .unwrap_err()
            .contains("not a number"));
        assert_eq!(
            Megatron.parse(None, "building GPT model ...").unwrap(),
            None
        );
    }
}

//! NeMo 2 / Megatron-Bridge logs, in either of the two forms NeMo prints a step:
//!
//! - the progress printer of NeMo 2 (`nemo/lightning/pytorch/callbacks/progress_printer.py`,
//!   NeMo 2.0 to 2.4, the default of the `nemo.collections.llm` recipes):
//!   `Training epoch 0, iteration 17/99 | lr: 2.699e-06 | global_batch_size: 128 |
//!   global_step: 17 | reduced_train_loss: 11.03 | train_step_timing in s: 12.64 |
//!   consumed_samples: 2304` (the iteration counts from 0; `TFLOPS_per_GPU` and
//!   `tokens_per_sec_per_gpu` are added by NeMo's FLOPs callback when it is on);
//! - Lightning's tqdm progress bar (NeMo 1 launcher, NVIDIA's DGX Cloud recipes):
//!   `Epoch 0: : 100%|██████████| 50/50 [16:26<00:00, v_num=gjbq, reduced_train_loss=11.70,
//!   global_step=49.00, consumed_samples=12600.0, train_step_timing in s=12.80]`, rewritten
//!   in place with `\r` (the reader splits those updates). Its counter counts batches done
//!   in the epoch (from 1), so steps are numbered per epoch.
//!
//! `train_step_timing in s` is NeMo's `TimingCallback`: the wall time of the step on the
//! logging rank, the figure NVIDIA's recipes divide the global batch's tokens by.

use std::sync::LazyLock;

use regex::Regex;

use super::parse::{count, field, pairs, Framework, LineParser, Logged, Own};

/// The printer's `Training epoch E, iteration N/M | k: v | ...`.
static PRINTER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Training epoch (\d+), iteration (\d+)/(\d+)\s*\|(.*)$").expect("static regex")
});
/// The bar's `Epoch E: ... N/M [elapsed<left, k=v, ...]` (or `Nit [...]` without a total).
static BAR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"Epoch (\d+):.*?(?:\|\s*(\d+)/\d+|\s(\d+)it) \[([^\]]*)\]").expect("static regex")
});

const TIMING: &str = "train_step_timing in s";

pub(crate) struct Nemo;

impl LineParser for Nemo {
    fn framework(&self) -> Framework {
        Framework::Nemo
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        if !text.contains(TIMING) {
            return Ok(None);
        }
        let (epoch, step, fields) = if let Some(c) = PRINTER.captures(text) {
            let f = pairs(c.get(4).map_or("", |m| m.as_str()), "|", ':');
            (count("epoch", &c[1])?, count("iteration", &c[2])?, f)
        } else if let Some(c) = BAR.captures(text) {
            let n = c.get(2).or(c.get(3)).map_or("", |m| m.as_str());
            let f = pairs(c.get(4).map_or("", |m| m.as_str()), ",", '=');
            (count("epoch", &c[1])?, count("step counter", n)?, f)
        } else {
            return Err(format!(
                "a `{TIMING}` line that is neither NeMo's progress printer (`Training epoch E, iteration N/M | ...`) nor its progress bar (`Epoch E: ... N/M [..., {TIMING}=X]`): truncated?"
            ));
        };
        let timing = fields
            .get(TIMING)
            .ok_or_else(|| format!("no `{TIMING}` value in the step's fields (a cut line?)"))?;
        // The printer's fields after the first step end with ` | consumed_samples: N`; a
        // timing that ends the line there may be cut short.
        if PRINTER.is_match(text) && step > 0 {
            let after = &text[text.find(TIMING).unwrap_or(0)..];
            if !after.contains('|') {
                return Err(format!(
                    "the `{TIMING}` value ends the line after iteration 0, where NeMo prints more fields: the line is cut (truncated log?)"
                ));
            }
        }
        let get = |k: &str| fields.get(k).map(|v| field(k, v)).transpose();
        Ok(Some(Logged {
            step: Some(step),
            epoch: Some(epoch),
            step_time_s: Some(field(TIMING, timing)?),
            loss: get("reduced_train_loss")?,
            own: Own {
                tokens_per_s_per_gpu: get("tokens_per_sec_per_gpu")?,
                tflops_per_gpu: get("TFLOPS_per_GPU")?,
                mfu: None,
            },
            global_batch: fields
                .get("global_batch_size")
                .map(|v| count("global_batch_size", v))
                .transpose()?,
            writer: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_progress_bar_line() {
        // NVIDIA dgxc-benchmarking, llama3.1/README_405b.md (NeMo 24.09).
        let line = "Epoch 0: : 100%|██████████| 50/50 [16:26<00:00, v_num=gjbq, reduced_train_loss=11.70, global_step=49.00, consumed_samples=12600.0, train_step_timing in s=12.80]";
        let l = Nemo.parse(None, line).unwrap().unwrap();
        assert_eq!((l.epoch, l.step), (Some(0), Some(50)));
        assert_eq!(l.step_time_s, Some(12.80));
        assert_eq!(l.loss, Some(11.70));
        let it = "Epoch 1: : 1it [00:04,  4.36s/it, v_num=d3c7, reduced_train_loss=0.674, global_step=1.000, consumed_samples=128.0, train_step_timing in s=3.370, batch_time=4.400]";
        let l = Nemo.parse(None, it).unwrap().unwrap();
        assert_eq!(
            (l.epoch, l.step, l.step_time_s),
            (Some(1), Some(1), Some(3.37))
        );
    }

    #[test]
    fn the_progress_printer() {
        let line = "Training epoch 0, iteration 45/99 | lr: 6.897e-06 | global_batch_size: 128 | global_step: 45 | reduced_train_loss: 11.96 | train_step_timing in s: 6.08 | TFLOPS_per_GPU: 1.249e+03 | consumed_samples: 5888";
        let l = Nemo.parse(None, line).unwrap().unwrap();
        assert_eq!(l.step, Some(45));
        assert_eq!(l.step_time_s, Some(6.08));
        assert_eq!(l.global_batch, Some(128));
        assert_eq!(l.own.tflops_per_gpu, Some(1249.0));
        assert_eq!(Nemo.parse(None, "[NeMo I] setup done").unwrap(), None);
    }

    #[test]
    fn broken_step_lines_are_errors() {
        let cut = "Training epoch 0, iteration 45/99 | lr: 6.897e-06 | train_step_timing in s: 6.0";
        assert!(Nemo.parse(None, cut).unwrap_err().contains("cut"));
        let empty = "Training epoch 0, iteration 0/99 | lr: 6.897e-06 | train_step_timing in s: ";
        assert!(Nemo
            .parse(None, empty)
            .unwrap_err()
            .contains("not a number"));
        let odd = "something train_step_timing in s=1.0";
        assert!(Nemo.parse(None, odd).unwrap_err().contains("truncated"));
        let nan = "Training epoch 0, iteration 4/9 | reduced_train_loss: nan | train_step_timing in s: 1.0 | consumed_samples: 40";
        assert!(Nemo
            .parse(None, nan)
            .unwrap()
            .unwrap()
            .loss
            .unwrap()
            .is_nan());
    }
}

//! llm.c logs (`train_gpt2.cu`, 2024): `step   10/5000 | loss 7.134567 (+0.12z)| norm
//! 1.2345 (+0.01z)| lr 6.00e-05 | 351.23 ms | 45.2% bf16 MFU | 1492523 tok/s`; older
//! versions print `train loss` and no z-scores. The milliseconds are the step's own
//! (cudaEvent) time; the tok/s is a bias-corrected moving average over all ranks (so it
//! lags a change), kept beside bench's per-step figure as llm.c's own, per GPU.

use super::parse::{count, field, percent_field, Framework, LineParser, Logged, Own};
use crate::external::llmc::StepLine;

pub(crate) struct Llmc {
    pub gpus: u32,
}

impl LineParser for Llmc {
    fn framework(&self) -> Framework {
        Framework::Llmc
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        let Some(line) = StepLine::read(text) else {
            return Ok(None);
        };
        let line = line?;
        let toks = line.tokens_per_s.map(|t| field("tok/s", t)).transpose()?;
        // llm.c prints -100% for a GPU its peak table lacks: no figure.
        let mfu = line
            .mfu_percent
            .map(|m| percent_field("MFU", m))
            .transpose()?
            .filter(|m| *m >= 0.0);
        Ok(Some(Logged {
            step: Some(count("step", line.step)?),
            step_time_s: Some(field("ms", line.ms)? / 1000.0),
            loss: Some(field("loss", line.loss)?),
            own: Own {
                tokens_per_s_per_gpu: toks.map(|t| t / f64::from(self.gpus.max(1))),
                tflops_per_gpu: None,
                mfu: mfu.map(|m| m / 100.0),
            },
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_lines_old_and_new() {
        let mut p = Llmc { gpus: 8 };
        let new = "step   10/5000 | loss 7.134567 (+0.12z)| norm 1.2345 (+0.01z)| lr 6.00e-05 | 351.23 ms | 45.2% bf16 MFU | 1492523 tok/s";
        let l = p.parse(None, new).unwrap().unwrap();
        assert_eq!(l.step, Some(10));
        assert!((l.step_time_s.unwrap() - 0.35123).abs() < 1e-12);
        assert_eq!(l.own.mfu, Some(0.452));
        assert!((l.own.tokens_per_s_per_gpu.unwrap() - 1_492_523.0 / 8.0).abs() < 1e-9);
        let old = "step    2/74 | train loss 4.367631 | norm 6.4123 | lr 1.00e-04 | 111.84 ms | 22.0% A100 fp16 MFU | 146516 tok/s";
        let l = p.parse(None, old).unwrap().unwrap();
        assert_eq!((l.step, l.loss), (Some(2), Some(4.367631)));
        assert!(p
            .parse(None, "step 3/74 | train loss 4.1 | norm")
            .unwrap_err()
            .contains("truncated"));
        assert_eq!(p.parse(None, "val loss 4.2").unwrap(), None);
    }
}

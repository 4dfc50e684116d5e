//! llm.c logs (`train_gpt2.cu`, 2024): `step   10/5000 | loss 7.134567 (+0.12z)| norm
//! 1.2345 (+0.01z)| lr 6.00e-05 | 351.23 ms | 45.2% bf16 MFU | 1492523 tok/s`; older
//! versions print `train loss` and no z-scores. The milliseconds are the step's own
//! (cudaEvent) time; the tok/s is a bias-corrected moving average over all ranks (so it
//! lags a change), kept beside bench's per-step figure as llm.c's own, per GPU.

use std::sync::LazyLock;

use regex::Regex;

use super::parse::{count, field, Framework, LineParser, Logged, Own};

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^step\s+(\d+)/(\d+)\s*\|\s*(?:train )?loss\s+([^\s|(]+)").expect("static regex")
});
static MS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*([^\s|]+)\s*ms\s*(?:\||$)").expect("static regex"));
static TOKS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\|\s*([^\s|]+)\s*tok/s").expect("static regex"));
static MFU: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\|\s*(?:([0-9.]+)%[^|]*MFU|MFU\s+([0-9.]+)%)").expect("static regex")
});

pub(crate) struct Llmc {
    pub gpus: u32,
}

impl LineParser for Llmc {
    fn framework(&self) -> Framework {
        Framework::Llmc
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        let text = text.trim_start();
        let Some(c) = STEP.captures(text) else {
            return Ok(None);
        };
        let ms = MS
            .captures(text)
            .ok_or_else(|| "an llm.c step line without `| X ms |` (truncated?)".to_string())?;
        let toks = TOKS
            .captures(text)
            .map(|t| field("tok/s", &t[1]))
            .transpose()?;
        let mfu = MFU
            .captures(text)
            .and_then(|m| m.get(1).or(m.get(2)))
            .map(|m| field("MFU", m.as_str()))
            .transpose()?;
        Ok(Some(Logged {
            step: Some(count("step", &c[1])?),
            step_time_s: Some(field("ms", &ms[1])? / 1000.0),
            loss: Some(field("loss", &c[3])?),
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

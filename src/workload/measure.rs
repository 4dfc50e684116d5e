//! Measurement: step timing, warm-up exclusion and the summary figures (through
//! [`crate::metrics::flops`], where every formula lives).

use crate::events::SummaryEvent;
use crate::metrics::flops::{self, Peak};

/// Step times and losses as the run produces them.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Times of measured (post-warm-up) steps.
    pub measured: Vec<f64>,
    pub last_loss: Option<f64>,
    pub time_to_first_step_s: Option<f64>,
}

impl Recorder {
    pub(crate) fn record(&mut self, warmup: bool, step_time_s: f64, loss: f64, since_start_s: f64) {
        self.last_loss = Some(loss);
        if !warmup {
            if self.measured.is_empty() {
                self.time_to_first_step_s = Some(since_start_s);
            }
            self.measured.push(step_time_s);
        }
    }
}

/// What the summary needs besides the recorded steps.
pub(crate) struct RunFacts {
    pub tokens_per_step: u64,
    pub world_size: u32,
    pub n_params: u64,
    pub flops_per_token: f64,
    pub peak: Option<Peak>,
    pub peak_mem_bytes: Option<u64>,
    pub device: String,
}

/// Median of a sample (the mean of the two middle values for even sizes).
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub(crate) fn summary(rec: &Recorder, facts: &RunFacts) -> SummaryEvent {
    let step = median(&rec.measured);
    let t = step.map(|s| {
        flops::throughput(
            flops::tokens_per_s(facts.tokens_per_step, s),
            facts.world_size,
            Some(facts.flops_per_token),
            facts.peak.as_ref().map(|p| p.tflops),
        )
    });
    SummaryEvent {
        tokens_per_s: t.map(|t| t.tokens_per_s),
        tokens_per_s_per_gpu: t.map(|t| t.tokens_per_s_per_gpu),
        step_time_s: step,
        tflops_per_gpu: t.and_then(|t| t.tflops_per_gpu),
        mfu: t.and_then(|t| t.mfu),
        mfu_policy: facts.peak.as_ref().map(|p| p.policy.clone()),
        peak_mem_bytes: facts.peak_mem_bytes.into_iter().collect(),
        n_params: Some(facts.n_params),
        flops_per_token: Some(facts.flops_per_token),
        world_size: Some(facts.world_size),
        final_loss: rec.last_loss,
        time_to_first_step_s: rec.time_to_first_step_s,
        device: Some(facts.device.clone()),
        framework: None,
        ran: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_summary() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        let mut r = Recorder::default();
        r.record(true, 9.0, 5.0, 1.0);
        r.record(false, 0.5, 4.0, 2.0);
        r.record(false, 0.5, 3.0, 2.5);
        let s = summary(
            &r,
            &RunFacts {
                tokens_per_step: 1000,
                world_size: 1,
                n_params: 10,
                flops_per_token: 1e9,
                peak: crate::metrics::flops::peak_tflops("H100", crate::axes::Dtype::Bf16),
                peak_mem_bytes: None,
                device: "x".into(),
            },
        );
        assert_eq!(s.tokens_per_s, Some(2000.0));
        // 2000 tokens/s x 1e9 FLOPs per token = 2 TFLOP/s.
        assert_eq!(s.tflops_per_gpu, Some(2.0));
        assert_eq!(s.time_to_first_step_s, Some(2.0));
        assert_eq!(s.final_loss, Some(3.0));
        assert!((s.mfu.unwrap() - 2.0 / 989.4).abs() < 1e-15);
    }
}

//! What no framework step can have measured: the physical bounds `bench adapt` holds each
//! logged step to before it becomes a step event.
//!
//! A framework's log is text bench reads, not a measurement bench made, so a figure in it
//! is only believed when a run of the cell could have produced it:
//!
//! - **Faster than the FLOPs allow**: a step does the model's FLOPs per token times the
//!   step's tokens; it cannot take less time than that work at the peak dense FLOP/s of the
//!   cell's GPUs (the table in [`crate::metrics::flops`], for the dtype the matmuls run in;
//!   fp32 against the bf16 peak, which is higher). A device the table does not know (a CPU,
//!   a newer GPU) is held to [`crate::metrics::flops::UNKNOWN_DEVICE_TFLOPS`].
//! - **Slower than the run**: a step cannot take longer than the framework has been
//!   running (plus a second for the framework's clock resolution).
//! - **A cross-entropy loss below zero**: every framework cell trains a language model on
//!   cross-entropy, which is never negative (a non-finite loss is a NaN-loss failure, exit
//!   5, elsewhere). Zero is possible as printed: a framework that prints the loss to a few
//!   decimals shows 0.000 once the model has memorised its data (MaxText's synthetic data
//!   repeats one batch; its step 12 printed `loss: 0.000` on an H100).
//!
//! A step outside them fails the cell (exit 2, not retried) with the log line that
//! completed it.

use super::log::LoggedStep;
use crate::axes::Dtype;
use crate::metrics::flops;

/// The bounds of one cell's steps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bounds {
    /// The model FLOPs of one step (all ranks).
    step_flops: f64,
    tokens_per_step: u64,
    gpus: u32,
    /// The cell's GPUs as it asks for them (0: a CPU cell).
    cell_gpus: u32,
    dtype: Dtype,
}

impl Bounds {
    pub(crate) fn new(flops_per_token: f64, tokens_per_step: u64, gpus: u32, dtype: Dtype) -> Self {
        Bounds {
            step_flops: flops_per_token * tokens_per_step as f64,
            tokens_per_step,
            gpus: gpus.max(1),
            cell_gpus: gpus,
            dtype,
        }
    }

    /// Checks `step`, logged `elapsed_s` seconds after the framework started on `device`
    /// (`None` before the driver said which); `Err` says why it cannot be a measurement.
    pub(crate) fn check(
        &self,
        step: &LoggedStep,
        device: Option<&str>,
        elapsed_s: f64,
    ) -> Result<(), String> {
        if step.loss < 0.0 {
            return Err(format!(
                "step {} logs a cross-entropy loss of {}: a cross-entropy loss is never below 0, so this is not the training's loss",
                step.step, step.loss
            ));
        }
        let t = step.step_time_s;
        let tokens_per_s = self.tokens_per_step as f64 / t;
        if !(t.is_finite() && t > 0.0) {
            return Err(format!(
                "step {} took {t} s: a step time is a finite number above 0",
                step.step
            ));
        }
        let (peak_tflops, peak) = self.peak(device);
        let fastest = self.step_flops / (peak_tflops * 1e12 * f64::from(self.gpus));
        if t < fastest {
            return Err(format!(
                "step {} took {t:e} s ({tokens_per_s:.4e} tokens/s, {:.4e} TFLOP/s per GPU): faster than {} allows for the step's {:.4e} FLOPs on {} GPU(s) ({fastest:.4e} s at least)",
                step.step,
                self.step_flops / t / 1e12 / f64::from(self.gpus),
                peak,
                self.step_flops,
                self.gpus
            ));
        }
        // The framework's clock reads whole milliseconds (torchtitan) or better.
        let longest = elapsed_s + 1.0;
        if t > longest {
            return Err(format!(
                "step {} took {t:e} s ({tokens_per_s:.4e} tokens/s): longer than the {elapsed_s:.1} s the framework has been running",
                step.step
            ));
        }
        Ok(())
    }

    /// A world size the framework reports, against the cell's GPUs
    /// ([`crate::bounds::check_world_size`]).
    pub(crate) fn check_world_size(&self, world_size: u64) -> Result<(), String> {
        crate::bounds::check_world_size(world_size, self.cell_gpus)
    }

    /// The peak TFLOP/s of one GPU the steps are held to, and the words that name it.
    fn peak(&self, device: Option<&str>) -> (f64, String) {
        let dtype = match self.dtype {
            // fp32 matmuls run below the bf16 peak (TF32 or plain), so it bounds them.
            Dtype::Fp32 => Dtype::Bf16,
            d => d,
        };
        match device.and_then(|d| flops::peak_tflops(d, dtype)) {
            Some(p) => (p.tflops, format!("the {}", p.policy)),
            None => (
                flops::UNKNOWN_DEVICE_TFLOPS,
                format!(
                    "{} TFLOP/s per device (the bound of a device the peak table does not know: {})",
                    flops::UNKNOWN_DEVICE_TFLOPS,
                    device.unwrap_or("not named yet")
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(t: f64, loss: f64) -> LoggedStep {
        LoggedStep {
            step: 3,
            step_time_s: t,
            loss,
            tokens_per_s_per_gpu: None,
            tflops_per_gpu: None,
            mfu: None,
        }
    }

    #[test]
    fn forged_and_absurd_steps_are_refused_real_ones_kept() {
        // Llama 3.1 8B: about 5e10 FLOPs per token at seq 8192; 8 H100s, 65,536 tokens.
        let b = Bounds::new(5.0e10, 65_536, 8, Dtype::Bf16);
        let h100 = Some("NVIDIA H100 80GB HBM3");
        // 3.3e15 FLOPs: 0.41 s at 8 x 989.4 TFLOP/s; a real step at 50% MFU takes 0.83 s.
        assert!(b.check(&step(0.83, 2.3), h100, 60.0).is_ok());
        let e = b.check(&step(0.2, 2.3), h100, 60.0).unwrap_err();
        assert!(
            e.contains("faster than the H100 SXM bf16 dense 989.4 TFLOP/s allows"),
            "{e}"
        );
        // The forged figures: 1.3e302 tokens/s and 4e-6 tokens/s.
        let e = b
            .check(&step(65_536.0 / 1.3e302, 2.3), h100, 60.0)
            .unwrap_err();
        assert!(e.contains("faster than"), "{e}");
        let e = b
            .check(&step(65_536.0 / 4e-6, 2.3), h100, 60.0)
            .unwrap_err();
        assert!(e.contains("longer than the 60.0 s"), "{e}");
        let e = b.check(&step(0.83, -0.5), h100, 60.0).unwrap_err();
        assert!(e.contains("cross-entropy loss of -0.5"), "{e}");
        // A loss printed as 0.000 (rounded, on a memorised batch) is one a run can log.
        assert!(b.check(&step(0.83, 0.0), h100, 60.0).is_ok());
        // A CPU is held to the unknown-device bound: a tiny model's real step passes.
        let cpu = Bounds::new(2.0e6, 128, 1, Dtype::Fp32);
        assert!(cpu.check(&step(0.05, 6.9), Some("cpu"), 10.0).is_ok());
        let e = cpu
            .check(&step(1e-300, 6.9), Some("cpu"), 10.0)
            .unwrap_err();
        assert!(e.contains("does not know: cpu"), "{e}");
        assert!(cpu.check(&step(f64::INFINITY, 6.9), None, 10.0).is_err());
    }
}

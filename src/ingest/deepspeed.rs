//! DeepSpeed logs (`deepspeed/utils/timer.py`, `ThroughputTimer.stop`, 0.14 to 0.16):
//! every `steps_per_print` optimizer steps, `epoch=0/micro_step=10/global_step=10,
//! RunningAvgSamplesPerSec=110.87, CurrSamplesPerSec=111.34, MemAllocated=1.87GB,
//! MaxMemAllocated=6.12GB`. `CurrSamplesPerSec` is the engine's `train_batch_size` (the
//! global batch) over the step's elapsed time, so the step took `global_batch /
//! CurrSamplesPerSec` seconds. The line has no loss (the Hugging Face Trainer prints it on
//! its own `{'loss': ...}` lines, not tied to a step).

use super::parse::{count, field, Framework, LineParser, Logged};
use crate::external::deepspeed::ThroughputLine;

pub(crate) struct Deepspeed {
    pub global_batch: u64,
}

impl LineParser for Deepspeed {
    fn framework(&self) -> Framework {
        Framework::Deepspeed
    }

    fn parse(&mut self, _rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        let Some(line) = ThroughputLine::read(text) else {
            return Ok(None);
        };
        let line = line?;
        let per_s = field("CurrSamplesPerSec", line.curr_samples_per_s)?;
        Ok(Some(Logged {
            step: Some(count("global_step", line.global_step)?),
            step_time_s: Some(self.global_batch as f64 / per_s),
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_timer_line() {
        let mut p = Deepspeed { global_batch: 64 };
        let line = "[2024-04-21 02:45:40,722] [INFO] [timer.py:260:stop] epoch=0/micro_step=3/global_step=3, RunningAvgSamplesPerSec=74.68528989415996, CurrSamplesPerSec=64.0, MemAllocated=4.75GB, MaxMemAllocated=15.59GB";
        let l = p.parse(None, line).unwrap().unwrap();
        assert_eq!((l.step, l.step_time_s), (Some(3), Some(1.0)));
        // Zero samples per second is an infinite step, refused by the collector.
        let zero = line.replace("CurrSamplesPerSec=64.0", "CurrSamplesPerSec=0");
        assert_eq!(
            p.parse(None, &zero).unwrap().unwrap().step_time_s,
            Some(f64::INFINITY)
        );
        assert!(p
            .parse(None, "CurrSamplesPerSec=1")
            .unwrap_err()
            .contains("truncated"));
        let cut = &line[..line.find("CurrSamplesPerSec=64").unwrap() + 19];
        assert!(p.parse(None, cut).unwrap_err().contains("cut"));
    }
}

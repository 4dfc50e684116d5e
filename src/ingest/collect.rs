//! The registry of log formats and the collector that drives them: which parser reads a
//! framework's lines ([`parser_for`], one line per format) and the [`Collector`] that
//! feeds every line of a log (every file of it, in order) to the parser, detects the
//! framework when asked (`--framework auto`) and keeps each rank's steps in order. The
//! formats implement [`super::parse::LineParser`], which lives apart from this registry, so
//! no format imports the file that lists it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::IngestError;
use super::parse::{
    split_rank, Context, Framework, LineParser, Logged, Step, MAX_STEP_LINES, MAX_STEP_S,
};

/// A fresh parser of `framework`'s log (the registry: one line per format).
pub(crate) fn parser_for(framework: Framework, ctx: &Context) -> Option<Box<dyn LineParser>> {
    Some(match framework {
        Framework::Auto => return None,
        Framework::Nemo => Box::new(super::nemo::Nemo),
        Framework::Paxml => Box::new(super::paxml::Paxml::default()),
        Framework::Megatron => Box::new(super::megatron::Megatron),
        Framework::Maxtext => Box::new(super::maxtext::Maxtext::default()),
        Framework::Torchtitan => Box::new(super::torchtitan::Torchtitan::default()),
        Framework::Llmc => Box::new(super::llmc::Llmc { gpus: ctx.gpus }),
        Framework::Deepspeed => Box::new(super::deepspeed::Deepspeed {
            global_batch: ctx.global_batch,
        }),
    })
}

/// Per-rank ordering state.
#[derive(Debug, Default)]
struct Stream {
    steps: Vec<Step>,
    last: Option<(Option<u64>, u64)>,
    stride: Option<u64>,
    /// Where the previous step came from, for the message of a gap.
    last_at: Option<(Arc<str>, usize)>,
    /// Lines the framework printed with no step time (torchtitan's first).
    untimed: usize,
    counted: u64,
}

/// Collects the step lines of a log (every file of it, in order) into the steps of the
/// reporting rank.
pub(crate) struct Collector {
    pub parser: Option<Box<dyn LineParser>>,
    ctx: Context,
    wanted: Framework,
    streams: BTreeMap<Option<u32>, Stream>,
    writer: Option<String>,
    /// The file being read, shared by its steps.
    file: Option<Arc<str>>,
    /// The step lines read so far (every rank's).
    pub step_lines: usize,
}

impl Collector {
    pub(crate) fn new(wanted: Framework, ctx: Context) -> Self {
        Collector {
            parser: parser_for(wanted, &ctx),
            ctx,
            wanted,
            streams: BTreeMap::new(),
            writer: None,
            file: None,
            step_lines: 0,
        }
    }

    /// The framework being read (`Auto` until a step line decided it).
    pub(crate) fn framework(&self) -> Framework {
        self.parser
            .as_ref()
            .map(|p| p.framework())
            .unwrap_or(self.wanted)
    }

    /// Reads one line of `file`.
    pub(crate) fn line(
        &mut self,
        file: &str,
        line_no: usize,
        raw: &str,
    ) -> Result<(), IngestError> {
        let (rank, text) = split_rank(raw);
        let err = |m: String| IngestError::at(file, line_no, raw, m);
        let logged = match self.parser.as_mut() {
            Some(p) => p.parse(rank, text).map_err(err)?,
            None => {
                // Auto-detection: the first framework whose parser takes the line decides.
                let mut found = None;
                for fw in Framework::ALL {
                    let mut p = parser_for(fw, &self.ctx).expect("a concrete framework");
                    if let Some(l) = p.parse(rank, text).map_err(&err)? {
                        found = Some((p, l));
                        break;
                    }
                }
                match found {
                    Some((p, l)) => {
                        self.parser = Some(p);
                        Some(l)
                    }
                    None => None,
                }
            }
        };
        let Some(l) = logged else { return Ok(()) };
        self.step_lines += 1;
        if self.step_lines > MAX_STEP_LINES {
            return Err(err(format!(
                "more than {MAX_STEP_LINES} step lines: more than any training log bench reads holds (several runs' logs concatenated?)"
            )));
        }
        self.take(file, line_no, raw, rank, l)
    }

    fn take(
        &mut self,
        file: &str,
        line_no: usize,
        raw: &str,
        rank: Option<u32>,
        l: Logged,
    ) -> Result<(), IngestError> {
        let err = |m: String| IngestError::at(file, line_no, raw, m);
        let shared = match &self.file {
            Some(f) if &**f == file => f.clone(),
            _ => {
                let f: Arc<str> = Arc::from(file);
                self.file = Some(f.clone());
                f
            }
        };
        if let Some(gb) = l.global_batch {
            if gb != self.ctx.global_batch {
                return Err(err(format!(
                    "the log says global batch {gb}, but --global-batch is {}: the figures would be wrong",
                    self.ctx.global_batch
                )));
            }
        }
        // Two processes' lines in one file with no rank prefix, told apart by the writer
        // the line names (absl's thread id).
        if rank.is_none() {
            if let Some(w) = &l.writer {
                match &self.writer {
                    None => self.writer = Some(w.clone()),
                    Some(first) if first != w => {
                        return Err(err(format!(
                            "a step line from writer {w} after lines from writer {first}: several processes' logs are mixed without rank prefixes (run with srun --label, or give one process's log)"
                        )))
                    }
                    Some(_) => {}
                }
            }
        }
        if let Some(loss) = l.loss {
            if loss.is_nan() || loss.is_infinite() {
                return Err(err(format!(
                    "the loss is {loss}: the run diverged, so its speed is not a measurement of training"
                )));
            }
            if loss < 0.0 {
                return Err(err(format!(
                    "the loss is {loss}: a training loss (cross-entropy) is never negative"
                )));
            }
        }
        for (name, v) in [
            ("tokens/s per GPU", l.own.tokens_per_s_per_gpu),
            ("TFLOP/s per GPU", l.own.tflops_per_gpu),
            ("MFU", l.own.mfu),
        ] {
            if let Some(v) = v {
                if !v.is_finite() || v < 0.0 {
                    return Err(err(format!(
                        "the framework's own {name} is {v}: a throughput is a finite number of 0 or more"
                    )));
                }
            }
        }
        let s = self.streams.entry(rank).or_default();
        s.counted += 1;
        let step = l.step.unwrap_or(s.counted);
        let who = match rank {
            Some(r) => format!("rank {r}"),
            None => "the log".to_string(),
        };
        if let Some((epoch, last)) = s.last {
            if epoch == l.epoch {
                if step <= last {
                    let same = s.steps.last().is_some_and(|p| {
                        p.step == step && Some(p.step_time_s) == l.step_time_s && p.loss == l.loss
                    });
                    if same && step == last {
                        // A progress bar printing its last state again (a refresh at the
                        // end of an epoch) is the same step, not a new one.
                        s.counted -= 1;
                        return Ok(());
                    }
                    return Err(err(format!(
                        "step {step} after step {last} in {who}: lines of several ranks are mixed without rank prefixes, or the log repeats itself"
                    )));
                }
                let gap = step - last;
                match s.stride {
                    None => s.stride = Some(gap),
                    Some(stride) if stride != gap => {
                        let (pf, pl) = s.last_at.clone().unwrap_or_default();
                        return Err(err(format!(
                            "step {step} follows step {last} ({pf}:{pl}), but the log reports every {stride} step(s): lines are missing (a truncated or filtered log?)"
                        )));
                    }
                    Some(_) => {}
                }
            } else {
                // A new epoch of a progress bar restarts its count; epochs only go forward.
                // One that goes back is two bars (two runs, or two processes) interleaved
                // in one file, or a log that repeats: their steps are not one run's.
                match (epoch, l.epoch) {
                    (Some(prev), Some(now)) if now < prev => {
                        return Err(err(format!(
                            "epoch {now} after epoch {prev} in {who}: epochs only go forward, so two progress bars are interleaved (two runs or processes in one file) or the log repeats itself"
                        )));
                    }
                    (Some(_), None) | (None, Some(_)) => {
                        return Err(err(format!(
                            "a step line {} an epoch after lines {} one in {who}: two kinds of step lines are mixed, so the steps are not one sequence",
                            if l.epoch.is_some() { "with" } else { "without" },
                            if l.epoch.is_some() { "without" } else { "with" },
                        )));
                    }
                    _ => {}
                }
                s.stride = None;
            }
        }
        s.last = Some((l.epoch, step));
        s.last_at = Some((shared.clone(), line_no));
        let Some(t) = l.step_time_s else {
            s.untimed += 1;
            return Ok(());
        };
        if !t.is_finite() || t <= 0.0 {
            return Err(err(format!(
                "step {step} took {t} s: a step time is a finite number of seconds above 0"
            )));
        }
        if t > MAX_STEP_S {
            return Err(err(format!(
                "step {step} took {t} s, more than a day: not a training step bench believes"
            )));
        }
        s.steps.push(Step {
            step,
            epoch: l.epoch,
            step_time_s: t,
            loss: l.loss,
            own: l.own,
            file: shared,
            line: line_no,
        });
        Ok(())
    }

    /// The steps of the reporting rank (the lowest rank that logged steps; the log itself
    /// when lines carry no prefix), which rank that is, and the other ranks that logged.
    pub(crate) fn finish(self) -> (Vec<Step>, Option<u32>, Vec<u32>, usize) {
        let mut streams = self.streams.into_iter().filter(|(_, s)| s.counted > 0);
        match streams.next() {
            None => (Vec::new(), None, Vec::new(), 0),
            Some((rank, s)) => {
                let others = streams.filter_map(|(r, _)| r).collect();
                (s.steps, rank, others, s.untimed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::parse::*;

    #[test]
    fn launcher_prefixes() {
        assert_eq!(split_rank("[rank3]:step: 1"), (Some(3), "step: 1"));
        assert_eq!(split_rank("[default0]:x"), (Some(0), "x"));
        assert_eq!(split_rank("[1,2]<stdout>:x"), (Some(2), "x"));
        assert_eq!(
            split_rank(" 0: Training epoch 0"),
            (Some(0), "Training epoch 0")
        );
        assert_eq!(split_rank("I0411 15:03:26"), (None, "I0411 15:03:26"));
    }

    #[test]
    fn numbers_as_printed() {
        assert_eq!(number("353,169"), Some(353_169.0));
        assert_eq!(number("1.249e+03"), Some(1249.0));
        assert_eq!(number("42.7%"), None);
        assert_eq!(percent_field("mfu", "42.7%"), Ok(42.7));
        assert!(field("train_step_timing in s", "8.5%")
            .unwrap_err()
            .contains("not a percentage"));
        assert_eq!(number("8,5"), None);
        assert!(field("train_step_timing in s", "8,5")
            .unwrap_err()
            .contains("decimal comma"));
        assert!(number("nan").unwrap().is_nan());
        assert_eq!(number("12.8x"), None);
        assert!(count("step", "2.5").is_err());
        assert_eq!(count("step", "49"), Ok(49));
    }

    fn logged(step: u64, t: f64) -> Logged {
        Logged {
            step: Some(step),
            step_time_s: Some(t),
            loss: Some(2.0),
            ..Logged::default()
        }
    }

    fn collector() -> Collector {
        Collector::new(
            Framework::Megatron,
            Context {
                global_batch: 8,
                gpus: 1,
            },
        )
    }

    #[test]
    fn order_stride_and_refreshes() {
        let mut c = collector();
        c.take("f", 1, "", None, logged(10, 1.0)).unwrap();
        c.take("f", 2, "", None, logged(20, 1.0)).unwrap();
        // The same state printed again is a refresh, not a step.
        c.take("f", 3, "", None, logged(20, 1.0)).unwrap();
        let e = c.take("f", 4, "", None, logged(20, 1.1)).unwrap_err();
        assert!(e.to_string().contains("mixed without rank prefixes"), "{e}");
        let e = c.take("f", 5, "", None, logged(40, 1.0)).unwrap_err();
        assert!(e.to_string().contains("lines are missing"), "{e}");
        let e = c.take("f", 6, "", None, logged(10, 1.0)).unwrap_err();
        assert!(
            e.to_string().starts_with("f:6: step 10 after step 20"),
            "{e}"
        );
        let (steps, rank, _, _) = c.finish();
        assert_eq!(steps.len(), 2);
        assert_eq!(rank, None);
    }

    #[test]
    fn epochs_only_go_forward() {
        let at = |epoch: u64, step: u64, t: f64| Logged {
            epoch: Some(epoch),
            ..logged(step, t)
        };
        let mut c = collector();
        c.take("f", 1, "", None, at(0, 1, 8.5)).unwrap();
        c.take("f", 2, "", None, at(1, 1, 0.5)).unwrap();
        let e = c.take("f", 3, "", None, at(0, 2, 8.5)).unwrap_err();
        assert!(
            e.to_string().starts_with("f:3: epoch 0 after epoch 1"),
            "{e}"
        );
        let mut c = collector();
        c.take("f", 1, "", None, at(0, 1, 8.5)).unwrap();
        let e = c.take("f", 2, "", None, logged(2, 8.5)).unwrap_err();
        assert!(e.to_string().contains("mixed"), "{e}");
    }

    #[test]
    fn steps_share_their_file_name() {
        let mut c = collector();
        let long = "d/".repeat(1500) + "x.log";
        for i in 1..=3 {
            c.take(&long, i as usize, "", None, logged(i, 1.0)).unwrap();
        }
        let (steps, ..) = c.finish();
        assert_eq!(steps.len(), 3);
        assert!(Arc::ptr_eq(&steps[0].file, &steps[2].file));
    }

    #[test]
    fn hostile_values_are_refused() {
        for (l, want) in [
            (logged(1, f64::NAN), "finite number"),
            (logged(1, 0.0), "above 0"),
            (logged(1, 1e9), "more than a day"),
            (
                Logged {
                    loss: Some(f64::NAN),
                    ..logged(1, 1.0)
                },
                "diverged",
            ),
            (
                Logged {
                    global_batch: Some(4),
                    ..logged(1, 1.0)
                },
                "global batch 4",
            ),
        ] {
            let e = collector()
                .take("f", 7, "", None, l)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{e}");
            assert!(e.starts_with("f:7:"), "{e}");
        }
    }

    #[test]
    fn lowest_rank_reports_and_writers_must_agree() {
        let mut c = collector();
        c.take("f", 1, "", Some(1), logged(1, 2.0)).unwrap();
        c.take("f", 2, "", Some(0), logged(1, 1.0)).unwrap();
        let (steps, rank, others, _) = c.finish();
        assert_eq!((rank, others), (Some(0), vec![1]));
        assert_eq!(steps[0].step_time_s, 1.0);
        let mut c = collector();
        let w = |s: &str| Logged {
            writer: Some(s.into()),
            step: None,
            ..logged(0, 1.0)
        };
        c.take("f", 1, "", None, w("11")).unwrap();
        let e = c.take("f", 2, "", None, w("22")).unwrap_err().to_string();
        assert!(e.contains("several processes"), "{e}");
    }
}

//! What every framework's log parser shares: the [`LineParser`] trait, the [`Framework`]
//! names and their detection, launcher prefixes (torchrun, srun, mpirun), numbers as
//! frameworks print them, and the [`Collector`] that turns parsed lines into the run's
//! steps or refuses them.
//!
//! The collector is where a log stops being believed: a step out of order (lines of
//! several ranks mixed without prefixes, a log that repeats), a gap in the logging
//! interval (lines lost), a step time that is not a finite number of seconds between zero
//! and a day, a NaN or negative loss, or a line that contradicts the parameters given
//! (another global batch) is an error naming the file and line, never a step.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use regex::Regex;

use super::IngestError;

/// The frameworks `bench ingest` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Detect from the first step line.
    Auto,
    /// NeMo 2 / Megatron-Bridge: the progress printer or Lightning's progress bar.
    Nemo,
    /// Paxml: `[PAX STATUS]: train_step() took X seconds.`
    Paxml,
    /// Megatron-LM / Megatron-Core: `iteration N/ M | ... elapsed time per iteration (ms)`.
    Megatron,
    /// MaxText: `completed step: N, seconds: X, ...`.
    Maxtext,
    /// torchtitan: `step: N loss: ... tps: ... tflops: ... mfu: ...%`.
    Torchtitan,
    /// llm.c: `step N/M | loss ... | X ms | Y tok/s`.
    Llmc,
    /// DeepSpeed's throughput timer: `global_step=N, ..., CurrSamplesPerSec=X`.
    Deepspeed,
}

impl Framework {
    /// Every concrete framework, in the order auto-detection tries them.
    pub(crate) const ALL: [Framework; 7] = [
        Framework::Nemo,
        Framework::Paxml,
        Framework::Megatron,
        Framework::Maxtext,
        Framework::Torchtitan,
        Framework::Llmc,
        Framework::Deepspeed,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Framework::Auto => "auto",
            Framework::Nemo => "nemo",
            Framework::Paxml => "paxml",
            Framework::Megatron => "megatron",
            Framework::Maxtext => "maxtext",
            Framework::Torchtitan => "torchtitan",
            Framework::Llmc => "llmc",
            Framework::Deepspeed => "deepspeed",
        }
    }

    /// A fresh parser of this framework's log.
    pub(crate) fn parser(self, ctx: &Context) -> Option<Box<dyn LineParser>> {
        Some(match self {
            Framework::Auto => return None,
            Framework::Nemo => Box::new(super::nemo::Nemo),
            Framework::Paxml => Box::new(super::paxml::Paxml),
            Framework::Megatron => Box::new(super::megatron::Megatron),
            Framework::Maxtext => Box::new(super::maxtext::Maxtext::default()),
            Framework::Torchtitan => Box::new(super::torchtitan::Torchtitan::default()),
            Framework::Llmc => Box::new(super::llmc::Llmc { gpus: ctx.gpus }),
            Framework::Deepspeed => Box::new(super::deepspeed::Deepspeed {
                global_batch: ctx.global_batch,
            }),
        })
    }
}

/// What a parser may need from the run's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Context {
    pub global_batch: u64,
    pub gpus: u32,
}

/// The figures a framework printed about a step itself, kept beside bench's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub(crate) struct Own {
    pub tokens_per_s_per_gpu: Option<f64>,
    pub tflops_per_gpu: Option<f64>,
    /// 0..1.
    pub mfu: Option<f64>,
}

/// One step line as a parser read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Logged {
    /// The framework's step number; `None` for frameworks that print none (Paxml), whose
    /// lines are counted.
    pub step: Option<u64>,
    /// The epoch a progress bar counts steps in (steps restart at each epoch).
    pub epoch: Option<u64>,
    /// Seconds of the step; `None` when the line gives none (torchtitan's first logged
    /// step, which has no earlier line to measure from).
    pub step_time_s: Option<f64>,
    pub loss: Option<f64>,
    pub own: Own,
    /// The global batch the line states, checked against `--global-batch`.
    pub global_batch: Option<u64>,
    /// Who printed the line when the line says (absl's thread id), so that two processes'
    /// lines mixed in one file are told apart even without rank prefixes.
    pub writer: Option<String>,
}

/// A framework's step-line reader. `Ok(None)`: not a step line. `Err`: a step line that
/// does not read as the framework prints it (the message; the caller adds file and line).
pub(crate) trait LineParser {
    fn framework(&self) -> Framework;
    fn parse(&mut self, rank: Option<u32>, text: &str) -> Result<Option<Logged>, String>;
}

static TORCHRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[(?:rank|default)(\d+)\]:").expect("static regex"));
static MPIRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\d+,(\d+)\]<std(?:out|err)>:").expect("static regex"));
static SRUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*(\d{1,6}): ").expect("static regex"));

/// Splits a launcher's rank prefix off a line: torchrun's `[rank3]:`, mpirun's
/// `[1,3]<stdout>:`, srun `--label`'s `3: `.
pub(crate) fn split_rank(line: &str) -> (Option<u32>, &str) {
    for re in [&*TORCHRUN, &*MPIRUN, &*SRUN] {
        if let Some(c) = re.captures(line) {
            let end = c.get(0).map(|m| m.end()).unwrap_or(0);
            return (c[1].parse().ok(), &line[end..]);
        }
    }
    (None, line)
}

/// A number as frameworks print it: [`crate::external::log::number`], the one reader of
/// printed numbers (a comma only as an unambiguous thousands separator; `8,5` is refused,
/// never read as 85).
pub(crate) fn number(s: &str) -> Option<f64> {
    crate::external::log::number(s)
}

/// A field of a step line that must be a number, or the message saying which is not. A
/// `%` is refused: only a percentage field ([`percent_field`]) may carry one, and a time
/// printed as `8.5%` is not 8.5 s.
pub(crate) fn field(name: &str, value: &str) -> Result<f64, String> {
    read_field(name, value, number(value))
}

/// A percentage field of a step line (an MFU): one trailing `%` allowed, the value as
/// printed (`42.7%` is 42.7).
pub(crate) fn percent_field(name: &str, value: &str) -> Result<f64, String> {
    read_field(name, value, crate::external::log::percent(value))
}

fn read_field(name: &str, value: &str, read: Option<f64>) -> Result<f64, String> {
    read.ok_or_else(|| {
        if value.contains('%') && crate::external::log::percent(value).is_some() {
            format!(
                "`{name}` is `{value}`: a `%` on a field that is not a percentage; refusing rather than reading it as {}",
                value.trim().trim_end_matches('%')
            )
        } else if value.contains(',') {
            format!(
                "`{name}` is `{value}`: a comma bench cannot read unambiguously (a decimal comma? a thousands separator is 1,234,567); refusing rather than guessing"
            )
        } else {
            format!("`{name}` is `{value}`, not a number")
        }
    })
}

/// A whole number (a step, a batch), refusing fractions and signs.
pub(crate) fn count(name: &str, value: &str) -> Result<u64, String> {
    let v = field(name, value)?;
    if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1e15 {
        Ok(v as u64)
    } else {
        Err(format!("`{name}` is `{value}`, not a whole number"))
    }
}

/// `key: value` (or `key=value`) pairs of a line whose fields are separated by `sep`.
pub(crate) fn pairs<'a>(text: &'a str, sep: &str, kv: char) -> BTreeMap<&'a str, &'a str> {
    text.split(sep)
        .filter_map(|f| {
            let (k, v) = f.split_once(kv)?;
            Some((k.trim(), v.trim()))
        })
        .collect()
}

/// The most step lines one log may have. A month-long run at 3 s per step logs under a
/// million; the bound keeps the steps held in memory to a few hundred megabytes whatever a
/// file holds.
pub(crate) const MAX_STEP_LINES: usize = 1_000_000;

/// The longest a training step may take and still be believed: a day.
pub(crate) const MAX_STEP_S: f64 = 86_400.0;

/// A step the collector accepted, with where it came from. `ingest.json` writes it as
/// `record::StepRow`, naming its file by index into the document's `logs`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    /// The framework's step number (or the count of step lines for Paxml).
    pub step: u64,
    pub epoch: Option<u64>,
    pub step_time_s: f64,
    pub loss: Option<f64>,
    pub own: Own,
    /// The file, shared by every step read from it (a long path is held once, not once
    /// per step: a million steps under a 3,000-character path are 3 GB otherwise).
    pub file: Arc<str>,
    pub line: usize,
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
            parser: wanted.parser(&ctx),
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
                    let mut p = fw.parser(&self.ctx).expect("a concrete framework");
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

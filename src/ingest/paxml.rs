//! Paxml logs: `[PAX STATUS]: train_step() took 7.47 seconds.`, printed through absl by
//! `paxml/programs.py` (`BaseTrainProgram.run`, `logging.log_first_n(logging.INFO, '[PAX
//! STATUS]: train_step() took %f seconds.', 20, train_period.elapsed)`; the rosetta
//! distribution in NVIDIA's JAX-Toolbox prints the same). The line carries no step number,
//! so steps are counted; note `log_first_n`: only the first 20 steps are printed. Every JAX
//! process logs, so the absl prefix's thread id (`I0411 15:03:26.866614 140737350317184
//! programs.py:366]`) tells two processes' lines apart when no rank prefix does.

use std::sync::LazyLock;

use regex::Regex;

use super::parse::{field, Framework, LineParser, Logged};

static STATUS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\[PAX STATUS\]: train_step\(\) took (\S*) seconds").expect("static regex")
});
static ABSL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+(\d+)\s").expect("static regex")
});

/// The step lines one Paxml process prints: `log_first_n(..., 20, ...)`.
pub(crate) const MAX_STATUS_LINES: usize = 20;

/// Counts each process's `[PAX STATUS]` lines: Paxml prints at most
/// [`MAX_STATUS_LINES`] per process, so a 21st is a log Paxml did not write as it stands
/// (lines repeated, two runs appended, or another program's), and measuring it would
/// invent steps.
#[derive(Default)]
pub(crate) struct Paxml {
    lines: std::collections::HashMap<(Option<u32>, Option<String>), usize>,
}

impl LineParser for Paxml {
    fn framework(&self) -> Framework {
        Framework::Paxml
    }

    fn parse(&mut self, rank: Option<u32>, text: &str) -> Result<Option<Logged>, String> {
        if !text.contains("[PAX STATUS]: train_step()") {
            return Ok(None);
        }
        let c = STATUS.captures(text).ok_or_else(|| {
            "a `[PAX STATUS]: train_step()` line without `took X seconds` (truncated?)".to_string()
        })?;
        let writer = ABSL.captures(text).map(|a| a[1].to_string());
        let seen = self.lines.entry((rank, writer.clone())).or_default();
        *seen += 1;
        if *seen > MAX_STATUS_LINES {
            return Err(format!(
                "`[PAX STATUS]: train_step()` line {} of one process: Paxml prints only the first {MAX_STATUS_LINES} (logging.log_first_n in paxml/programs.py), so this log holds lines Paxml did not print as one run (repeated, or two runs appended)",
                *seen
            ));
        }
        Ok(Some(Logged {
            step_time_s: Some(field("took", &c[1])?),
            writer,
            ..Logged::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_status_line() {
        // NVIDIA dgxc-benchmarking, paxml/README_175b.md (Paxml 24.11).
        let line = "I0411 15:03:26.866614 140737350317184 programs.py:366] [PAX STATUS]: train_step() took 7.47 seconds.";
        let l = Paxml::default().parse(None, line).unwrap().unwrap();
        assert_eq!(l.step_time_s, Some(7.47));
        assert_eq!(l.step, None);
        assert_eq!(l.writer.as_deref(), Some("140737350317184"));
        assert!(Paxml::default()
            .parse(None, "[PAX STATUS]: train_step() took")
            .unwrap_err()
            .contains("truncated"));
        assert!(Paxml::default()
            .parse(None, "[PAX STATUS]: train_step() took 1e999x seconds.")
            .unwrap_err()
            .contains("not a number"));
        assert_eq!(
            Paxml::default()
                .parse(None, "[PAX STATUS]: Starting")
                .unwrap(),
            None
        );
        let mut p = Paxml::default();
        let a = "I0411 15:03:26.866614 111 programs.py:366] [PAX STATUS]: train_step() took 7.47 seconds.";
        let b = "I0411 15:03:26.866614 222 programs.py:366] [PAX STATUS]: train_step() took 7.47 seconds.";
        for _ in 0..MAX_STATUS_LINES {
            assert!(p.parse(None, a).unwrap().is_some());
            assert!(p.parse(None, b).unwrap().is_some());
        }
        let e = p.parse(None, a).unwrap_err();
        assert!(
            e.contains("line 21 of one process") && e.contains("log_first_n"),
            "{e}"
        );
    }
}

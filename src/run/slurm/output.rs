//! What a Slurm job leaves behind, read as the job runs: its output file (all ranks' lines,
//! labelled by `srun --label`) read whole lines at a time as it grows, split into one log
//! per rank plus the job's own log, and passed through the same
//! [`Collector`] a local attempt uses; and the environment the job script recorded on its
//! first node.

use std::collections::HashMap;
use std::fs::File;
use std::io::{LineWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::attempt::JobNews;
use crate::events::{ErrorKind, Event};
use crate::results::Environment;
use crate::run::executor::Collector;
use crate::slurm::job;

/// Reads the environment a job script wrote (`bench env --format json`): `Ok(None)` while
/// the file does not exist, an error naming the file when it cannot be read as one.
fn read_node_env(path: &Path) -> Result<Option<Environment>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let env: Environment = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not an environment: {e}", path.display()))?;
    if env.hardware_key.trim().is_empty() {
        return Err(format!("{}: no hardware key", path.display()));
    }
    Ok(Some(env))
}

/// Why a job left no environment of its node, for its log: the probe's own error output
/// when it left some.
fn no_node_env_reason(path: &Path) -> String {
    let mut err = path.as_os_str().to_owned();
    err.push(".err");
    let err = PathBuf::from(err);
    match std::fs::read_to_string(&err) {
        Ok(t) if !t.trim().is_empty() => format!(
            "`bench env` failed on the node: {} (see {})",
            t.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim(),
            err.display()
        ),
        _ => format!(
            "the job script wrote no {} (the job ended before it got that far, or `bench` cannot run on the node)",
            path.display()
        ),
    }
}

/// The log files of one job: one per rank (as a local attempt has), plus the job's own
/// lines (Slurm's and the batch script's, e.g. a cancellation notice) in `<stem>.job.log`.
pub(super) struct JobLogs {
    ranks: Vec<Option<LineWriter<File>>>,
    job: Option<LineWriter<File>>,
    pub(super) paths: Vec<PathBuf>,
}

impl JobLogs {
    pub(super) fn open(stem: &Path, ranks: u32) -> JobLogs {
        let open = |p: &Path| {
            p.parent()
                .map(std::fs::create_dir_all)
                .transpose()
                .and_then(|_| File::create(p))
                .ok()
                .map(LineWriter::new)
        };
        let mut paths: Vec<PathBuf> = (0..ranks)
            .map(|r| {
                let mut s = stem.as_os_str().to_owned();
                if ranks > 1 {
                    s.push(format!(".rank{r}"));
                }
                s.push(".log");
                PathBuf::from(s)
            })
            .collect();
        let ranks_w = paths.iter().map(|p| open(p)).collect();
        let mut s = stem.as_os_str().to_owned();
        s.push(".job.log");
        let job_path = PathBuf::from(s);
        let job = open(&job_path);
        paths.push(job_path);
        JobLogs {
            ranks: ranks_w,
            job,
            paths,
        }
    }

    fn rank(&mut self, rank: u32, text: &str) {
        match self.ranks.get_mut(rank as usize) {
            Some(Some(w)) => {
                let _ = writeln!(w, "{text}");
            }
            // A rank beyond the plan cannot happen with srun's labels; keep the line anyway.
            _ => self.job(&format!("{rank}: {text}")),
        }
    }

    fn job(&mut self, text: &str) {
        if let Some(w) = &mut self.job {
            let _ = writeln!(w, "{text}");
        }
    }

    pub(super) fn all(&mut self, text: &str) {
        for w in self.ranks.iter_mut().flatten() {
            let _ = writeln!(w, "{text}");
        }
        self.job(text);
    }
}

/// Reads a job's output file as it grows, whole lines at a time (bounded and sanitized by
/// the same splitter as a local worker's pipes).
pub(super) struct OutputTail {
    path: PathBuf,
    offset: u64,
    partial: crate::events::LineSplitter,
}

impl OutputTail {
    /// Reads `path` from its start (it need not exist yet: a job writes it once it starts).
    pub(super) fn new(path: PathBuf) -> OutputTail {
        OutputTail {
            path,
            offset: 0,
            partial: Default::default(),
        }
    }

    /// The complete lines written since the last call (all of the rest when `last`).
    pub(super) fn read(&mut self, last: bool) -> Vec<String> {
        let mut lines = Vec::new();
        if let Ok(mut f) = File::open(&self.path) {
            if f.seek(SeekFrom::Start(self.offset)).is_ok() {
                let mut chunk = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = f.read(&mut chunk) {
                    self.offset += n as u64;
                    self.partial.push(&chunk[..n], &mut |l| lines.push(l));
                }
            }
        }
        if last {
            lines.extend(self.partial.flush());
        }
        lines
    }
}

/// Where the lines of the job's output go: logs, collector, launcher.
pub(super) struct Reader<'a, F: FnMut(JobNews<'_>)> {
    pub(super) logs: JobLogs,
    pub(super) collector: Collector,
    /// Each rank's last log lines, for the failure message of the rank that failed first.
    pub(super) tails: HashMap<u32, Collector>,
    /// The batch script's own lines, e.g. Slurm's cancellation notice.
    pub(super) job_lines: Vec<String>,
    pub(super) srun_done: bool,
    /// The first rank that exited nonzero, and its status, in output order.
    pub(super) first_failure: Option<(u32, i32)>,
    /// The first rank that printed an error event of kind `distributed` (a peer gone from
    /// a collective): one sign that the job lost a node.
    pub(super) distributed_error: Option<u32>,
    pub(super) news: &'a mut F,
    /// Each rank's line that srun cut at [`SRUN_LINE_BYTES`] and whose rest is still to come.
    pending: HashMap<u32, String>,
}

/// srun's stdio forwarding (`--label`) cuts a task's line after this many bytes and labels
/// the rest as a line of its own (a summary event with its record of what ran is longer:
/// seen on 2026-11-27 with Slurm 23.11). A labelled line of exactly this length is joined
/// with the same task's next line; a task's line of exactly 1024 bytes followed by another
/// line of its own would be joined too, which no event of bench's can be (an event ends
/// with `}` and the next starts a new object, so the joined text would not parse as one and
/// stays log text).
const SRUN_LINE_BYTES: usize = 1024;

impl<'a, F: FnMut(JobNews<'_>)> Reader<'a, F> {
    pub(super) fn new(logs: JobLogs, news: &'a mut F) -> Reader<'a, F> {
        Reader {
            logs,
            collector: Collector::default(),
            tails: HashMap::new(),
            job_lines: vec![],
            srun_done: false,
            first_failure: None,
            distributed_error: None,
            news,
            pending: HashMap::new(),
        }
    }

    /// Takes the next lines of the output: into the logs, the collector (events go on to
    /// the launcher) and the record of how the ranks and srun ended.
    pub(super) fn take(&mut self, lines: Vec<String>) {
        let chunk = job::JobOutput::parse(&lines.join("\n"));
        if self.first_failure.is_none() {
            self.first_failure = chunk.first_failure();
        }
        for l in chunk.lines {
            match l.rank {
                Some(rank) => {
                    let cut = l.text.len() == SRUN_LINE_BYTES;
                    let text = match self.pending.remove(&rank) {
                        Some(mut head) => {
                            head.push_str(&l.text);
                            head
                        }
                        None => l.text,
                    };
                    // A joined line stays bounded: the runner's own splitter cuts a worker's
                    // line at MAX_LINE_BYTES, and so does this.
                    if cut && text.len() < crate::events::MAX_LINE_BYTES {
                        self.pending.insert(rank, text);
                        continue;
                    }
                    self.rank_line(rank, text);
                }
                None => {
                    self.logs.job(&l.text);
                    if l.text.starts_with("bench: srun exited with status") {
                        self.srun_done = true;
                    } else if !l.text.trim().is_empty() {
                        self.job_lines.push(l.text);
                    }
                }
            }
        }
    }

    /// The end of the job's output: a line srun cut whose rest never came is taken as it is.
    pub(super) fn finish(&mut self) {
        let mut pending: Vec<(u32, String)> = self.pending.drain().collect();
        pending.sort_by_key(|(rank, _)| *rank);
        for (rank, text) in pending {
            self.rank_line(rank, text);
        }
    }

    /// One whole line of a task's output: into its log, its tail and the collector.
    fn rank_line(&mut self, rank: u32, text: String) {
        self.logs.rank(rank, &text);
        // The task wrapper's exit line is the runner's business, not log text.
        if text.starts_with("bench: rank ") {
            return;
        }
        self.tails.entry(rank).or_default().line(rank, &text);
        if let Some(ev) = self.collector.line(rank, &text) {
            if let Event::Error {
                kind: ErrorKind::Distributed,
                ..
            } = ev
            {
                self.distributed_error.get_or_insert(rank);
            }
            (self.news)(JobNews::Event(&ev));
        }
    }
}

/// The environment the job script records on the job's first node: read once, as soon as
/// it is there, and said once when it is unreadable.
pub(super) struct NodeEnvProbe {
    /// Where the script writes it; `None` when the plan has no probe.
    file: Option<PathBuf>,
    pub(super) env: Option<Environment>,
    /// Set once the file was found unreadable, so that it is said once.
    error: Option<String>,
}

impl NodeEnvProbe {
    pub(super) fn new(file: Option<PathBuf>) -> NodeEnvProbe {
        NodeEnvProbe {
            file,
            env: None,
            error: None,
        }
    }

    /// Reads the node's environment if it has not been read yet and is there now; says so
    /// in the job's logs and to the launcher.
    pub(super) fn read_once<F: FnMut(JobNews<'_>)>(
        &mut self,
        job_id: &str,
        reader: &mut Reader<'_, F>,
    ) {
        let Some(file) = self.file.as_deref() else {
            return;
        };
        if self.env.is_some() || self.error.is_some() {
            return;
        }
        match read_node_env(file) {
            Ok(Some(env)) => {
                reader.logs.all(&format!(
                    "bench: job {job_id}'s node {} has hardware key {} ({})",
                    env.host,
                    env.hardware_key,
                    file.display()
                ));
                (reader.news)(JobNews::NodeEnv { job_id, env: &env });
                self.env = Some(env);
            }
            Ok(None) => {}
            Err(e) => {
                reader
                    .logs
                    .all(&format!("bench: no environment of the job's node: {e}"));
                self.error = Some(e);
            }
        }
    }

    /// After the job: says in its logs why there is no environment, when there is none and
    /// nothing was said yet.
    pub(super) fn say_if_missing(&self, logs: &mut JobLogs) {
        if let (Some(f), None, None) = (self.file.as_deref(), &self.env, &self.error) {
            logs.all(&format!(
                "bench: no environment of the job's node: {}",
                no_node_env_reason(f)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_is_read_in_whole_lines_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slurm-1.out");
        let mut tail = OutputTail {
            path: path.clone(),
            offset: 0,
            partial: Default::default(),
        };
        // Not written yet (a pending job): nothing, no error.
        assert!(tail.read(false).is_empty());
        let mut f = File::create(&path).unwrap();
        write!(f, "0: one\n1: tw").unwrap();
        assert_eq!(tail.read(false), vec!["0: one"]);
        write!(f, "o\n0: thr").unwrap();
        assert_eq!(tail.read(false), vec!["1: two"]);
        assert!(tail.read(false).is_empty());
        assert_eq!(tail.read(true), vec!["0: thr"]);
    }

    #[test]
    fn each_rank_gets_its_log_and_the_first_failure_its_say() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("logs/c.r0");
        let mut seen = vec![];
        let mut news = |n: JobNews<'_>| {
            if let JobNews::Event(Event::Step(s)) = n {
                seen.push(s.rank);
            }
        };
        let mut reader = Reader::new(JobLogs::open(&stem, 2), &mut news);
        reader.take(
            [
                r#"1: {"event":"step","step":0,"step_time_s":0.2,"tokens":8,"loss":1.0,"rank":1}"#,
                r#"0: {"event":"step","step":0,"step_time_s":0.1,"tokens":8,"loss":1.0,"rank":0}"#,
                r#"1: {"event":"error","kind":"oom","message":"rank 1 ran out"}"#,
                "1: bench: rank 1 exited with status 4",
                "srun: error: node1: task 1: Exited with exit code 4",
                "0: bench: rank 0 exited with status 143",
                "bench: srun exited with status 143",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        assert_eq!(reader.first_failure, Some((1, 4)));
        assert!(reader.srun_done);
        assert_eq!(
            reader.job_lines,
            vec!["srun: error: node1: task 1: Exited with exit code 4"]
        );
        assert!(reader.tails.contains_key(&1));
        drop(reader);
        assert_eq!(seen, vec![Some(1), Some(0)]);
        let log1 = std::fs::read_to_string(dir.path().join("logs/c.r0.rank1.log")).unwrap();
        assert!(log1.contains("rank 1 ran out") && log1.contains("exited with status 4"));
        assert!(!log1.contains("\"rank\":0"));
        let job = std::fs::read_to_string(dir.path().join("logs/c.r0.job.log")).unwrap();
        assert!(job.contains("srun: error") && job.contains("srun exited"));
    }

    /// srun's `--label` cuts a task's line after 1024 bytes; the pieces, even across two
    /// reads of the output file and with another rank's line between them, are one event.
    #[test]
    fn an_event_srun_cut_at_1024_bytes_is_joined_again() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("logs/c.r0");
        let mut summaries = vec![];
        let mut news = |n: JobNews<'_>| {
            if let JobNews::Event(Event::Summary(s)) = n {
                summaries.push(s.device.clone());
            }
        };
        let line = format!(
            r#"{{"event":"summary","tokens_per_s":10.0,"device":"{}"}}"#,
            "x".repeat(1500)
        );
        let (head, tail) = line.split_at(SRUN_LINE_BYTES);
        let mut reader = Reader::new(JobLogs::open(&stem, 2), &mut news);
        reader.take(vec![format!("0: {head}")]);
        reader.take(vec![
            "1: another rank's line".to_string(),
            format!("0: {tail}"),
        ]);
        // A cut line whose rest never comes is kept as it is at the end.
        reader.take(vec![format!("1: {}", "y".repeat(SRUN_LINE_BYTES))]);
        reader.finish();
        drop(reader);
        assert_eq!(summaries, vec![Some("x".repeat(1500))]);
        let log1 = std::fs::read_to_string(dir.path().join("logs/c.r0.rank1.log")).unwrap();
        assert!(log1.contains(&"y".repeat(SRUN_LINE_BYTES)), "{log1}");
    }

    #[test]
    fn a_nodes_environment_is_read_when_there_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("node-env-7.json");
        // Not written yet: nothing, no error.
        assert_eq!(read_node_env(&f), Ok(None));
        assert!(no_node_env_reason(&f).contains("wrote no"));
        let env = Environment {
            hardware_key: "h100-sxm-80gb".into(),
            host: "gpu01".into(),
            gpu_model: Some("NVIDIA H100 80GB HBM3".into()),
            gpu_count: 8,
            ..Default::default()
        };
        std::fs::write(&f, serde_json::to_string_pretty(&env).unwrap()).unwrap();
        assert_eq!(read_node_env(&f), Ok(Some(env)));
        std::fs::write(&f, "{\"gpu_count\": 8").unwrap();
        assert!(read_node_env(&f).unwrap_err().contains("node-env-7.json"));
        std::fs::write(&f, "{\"gpu_count\":0,\"cpu\":\"\",\"host\":\"\",\"os\":\"\",\"git_dirty\":false,\"bench_version\":\"\",\"hardware_key\":\" \"}").unwrap();
        assert!(read_node_env(&f).unwrap_err().contains("no hardware key"));
        // The probe's own words, when it left some, say why there is no file.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(
            dir.path().join("node-env-7.json.err"),
            "x\nlibtorch_cpu.so: cannot open\n\n",
        )
        .unwrap();
        let why = no_node_env_reason(&f);
        assert!(why.contains("libtorch_cpu.so: cannot open"), "{why}");
    }
}

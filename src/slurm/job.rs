//! A submitted Slurm job and the Slurm client commands about it: submit, list (many jobs
//! in one `squeue` call), ask for a job's state, cancel, kill; and the output file's lines
//! split into rank and text. Every call is blocking and stateless: the runner's job loop
//! (`run::slurm`) decides when to call them and what their answers mean.
//!
//! States come from `squeue` while the job is known to the queue, then from
//! `scontrol show job` (the controller keeps finished jobs for `MinJobAge`), then from
//! `sacct` where accounting is configured. Every Slurm command is run directly (no shell).

use std::path::PathBuf;
use std::time::Duration;

use super::error::SlurmError;
use super::script::JobPlan;

/// A job in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlurmJob {
    pub id: String,
    pub cell_id: String,
    /// The job's output file (all tasks' stdout and stderr, each line labelled with
    /// its rank by `srun --label`).
    pub output: PathBuf,
}

/// Where a job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Queued, configuring, running or completing: not finished yet. The text is Slurm's.
    Active(String),
    /// Finished: Slurm's final state (COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL,
    /// OUT_OF_MEMORY...) and the batch script's exit status when Slurm knows it.
    Finished {
        state: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// No Slurm command knows the job any more (finished long ago, no accounting).
    Unknown,
}

/// One line of the job's output.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskLine {
    /// The rank that printed it (from srun's label); `None` for lines of the batch script.
    pub rank: Option<u32>,
    pub text: String,
}

/// The job's output, read back.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct JobOutput {
    pub lines: Vec<TaskLine>,
}

impl JobOutput {
    /// Parses an output file's text.
    pub(crate) fn parse(text: &str) -> JobOutput {
        let lines = text
            .lines()
            .map(|l| {
                let (rank, rest) = split_label(l);
                TaskLine {
                    rank,
                    text: rest.to_string(),
                }
            })
            .collect();
        JobOutput { lines }
    }

    /// The first rank (in output order) that exited with a nonzero status, and that
    /// status: the cause of a failed job, not the ranks srun killed afterwards.
    pub(crate) fn first_failure(&self) -> Option<(u32, i32)> {
        self.lines.iter().find_map(|l| {
            let rest = l.text.strip_prefix("bench: rank ")?;
            let (rank, code) = rest.split_once(" exited with status ")?;
            let code: i32 = code.trim().parse().ok()?;
            (code != 0).then_some((rank.parse().ok()?, code))
        })
    }
}

/// Splits srun's `--label` prefix (`"0: "`, padded to the width of the largest rank).
fn split_label(line: &str) -> (Option<u32>, &str) {
    let t = line.trim_start();
    if let Some((head, rest)) = t.split_once(": ") {
        if !head.is_empty() && head.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(r) = head.parse() {
                return (Some(r), rest);
            }
        }
    }
    if let Some(head) = t.strip_suffix(':') {
        if !head.is_empty() && head.bytes().all(|b| b.is_ascii_digit()) {
            return (head.parse().ok(), "");
        }
    }
    (None, line)
}

/// A Slurm client command in a process group of its own: the terminal's Ctrl-C is for
/// `bench`, which then cancels its jobs itself; an `sbatch` killed halfway by the same
/// keypress could leave a job submitted that `bench` never heard of.
///
/// Through the bounded runner (`crate::proc`): a time limit ([`crate::proc::SLURM_TIMEOUT`],
/// a controller that does not answer does not hang the run), a bound on its output, and
/// the parent-death signal.
fn run(tool: &'static str, args: &[&str]) -> Result<std::process::Output, SlurmError> {
    run_tool(crate::proc::Tool::new(tool).args(args), tool)
}

/// Runs a Slurm client call built by the caller; its output whatever its exit status.
pub(crate) fn run_tool(
    cmd: crate::proc::Tool,
    tool: &'static str,
) -> Result<std::process::Output, SlurmError> {
    let out = cmd
        .timeout(crate::proc::SLURM_TIMEOUT)
        .stderr()
        .run(None)
        .map_err(|e| SlurmError::Tool {
            tool,
            source: match e {
                crate::proc::ToolError::Missing { .. } => std::io::ErrorKind::NotFound.into(),
                e => std::io::Error::other(e.why()),
            },
        })?;
    Ok(std::process::Output {
        status: out.status,
        stdout: out.stdout,
        stderr: out.stderr,
    })
}

/// Writes the plan's script and submits it with `sbatch --parsable`.
pub(crate) fn submit(plan: &JobPlan) -> Result<SlurmJob, SlurmError> {
    if let Some(dir) = plan.script_path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SlurmError::Io {
            path: dir.display().to_string(),
            source,
        })?;
    }
    std::fs::write(&plan.script_path, &plan.script).map_err(|source| SlurmError::Io {
        path: plan.script_path.display().to_string(),
        source,
    })?;
    let out = run_tool(
        crate::proc::Tool::new("sbatch")
            .args(&plan.sbatch_args)
            .arg(&plan.script_path),
        "sbatch",
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // --parsable prints `jobid` or `jobid;cluster`.
    let id = stdout
        .trim()
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    if !out.status.success() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SlurmError::Submit {
            cell: plan.cell_id.clone(),
            status: out.status.to_string(),
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                stdout.trim()
            ),
        });
    }
    let output = PathBuf::from(
        plan.output_pattern
            .to_string_lossy()
            .replace("%j", &id)
            .replace("%%", "%"),
    );
    Ok(SlurmJob {
        id,
        cell_id: plan.cell_id.clone(),
        output,
    })
}

/// The `NodeList=` of a `scontrol show job -o` line; `None` when empty or `(null)`.
fn node_list(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix("NodeList="))
        .filter(|v| !v.is_empty() && *v != "(null)")
        .map(str::to_string)
}

/// Parses `ExitCode=a:b` (status and signal).
fn parse_exit(v: &str) -> (Option<i32>, Option<i32>) {
    let mut it = v.split(':');
    let code = it.next().and_then(|c| c.trim().parse().ok());
    let sig = it.next().and_then(|s| s.trim().parse().ok());
    (code, sig)
}

impl SlurmJob {
    /// The job's state now.
    pub(crate) fn state(&self) -> Result<JobState, SlurmError> {
        let q = run("squeue", &["-h", "-j", &self.id, "-o", "%T"])?;
        let text = String::from_utf8_lossy(&q.stdout);
        if q.status.success() {
            if let Some(s) = text.lines().map(str::trim).find(|s| !s.is_empty()) {
                // squeue may still list a job that has just ended (COMPLETED, FAILED...);
                // its exit code comes from scontrol below.
                if is_active(s) {
                    return Ok(JobState::Active(s.to_string()));
                }
            }
        } else {
            let err = String::from_utf8_lossy(&q.stderr);
            // squeue says "Invalid job id" for jobs it no longer lists; anything else
            // (controller down) is a real error.
            if !err.contains("Invalid job id") {
                return Err(SlurmError::Query {
                    cmd: format!("squeue -h -j {} -o %T", self.id),
                    stderr: err.trim().to_string(),
                });
            }
        }
        if let Some(s) = self.state_from_scontrol()? {
            return Ok(s);
        }
        Ok(self.state_from_sacct().unwrap_or(JobState::Unknown))
    }

    fn state_from_scontrol(&self) -> Result<Option<JobState>, SlurmError> {
        let out = run("scontrol", &["show", "job", "-o", &self.id])?;
        if !out.status.success() {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut state = None;
        let mut exit = (None, None);
        for kv in text.split_whitespace() {
            if let Some(v) = kv.strip_prefix("JobState=") {
                state = Some(v.to_string());
            } else if let Some(v) = kv.strip_prefix("ExitCode=") {
                exit = parse_exit(v);
            }
        }
        Ok(state.map(|s| classify(s, exit)))
    }

    /// The nodes the job ran on, as `scontrol` remembers them (`None` when it does not,
    /// or the job never got nodes).
    pub(crate) fn nodes(&self) -> Option<String> {
        let out = run("scontrol", &["show", "job", "-o", &self.id]).ok()?;
        if !out.status.success() {
            return None;
        }
        node_list(&String::from_utf8_lossy(&out.stdout))
    }

    fn state_from_sacct(&self) -> Option<JobState> {
        let out = run(
            "sacct",
            &["-n", "-X", "-P", "-j", &self.id, "-o", "State,ExitCode"],
        )
        .ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| !l.trim().is_empty())?;
        let (state, exit) = line.split_once('|')?;
        // sacct writes e.g. "CANCELLED by 0"; the first word is the state.
        let state = state.split_whitespace().next()?.to_string();
        Some(classify(state, parse_exit(exit)))
    }

    /// `scancel`s the job (all its steps and tasks). Cancelling a finished job is not an
    /// error.
    pub(crate) fn cancel(&self) -> Result<(), SlurmError> {
        let out = run("scancel", &[&self.id])?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || err.contains("already completing or completed")
            || err.contains("Invalid job id")
        {
            Ok(())
        } else {
            Err(SlurmError::Query {
                cmd: format!("scancel {}", self.id),
                stderr: err.trim().to_string(),
            })
        }
    }

    /// Stops the job's tasks at once with SIGKILL, then cancels the job (a second Ctrl-C,
    /// or a job that outlived the grace period after [`SlurmJob::cancel`]).
    pub(crate) fn kill(&self) -> Result<(), SlurmError> {
        // The signal reaches every step's tasks; the batch script then ends by itself,
        // and the plain cancel below covers a job that had not started a step yet.
        let _ = run("scancel", &["--signal=KILL", "--full", &self.id])?;
        self.cancel()
    }
}

/// A node that Slurm holds lost: DOWN, FAIL, or not responding to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostNode {
    pub name: String,
    /// Slurm's state as `sinfo %T` writes it, e.g. `down*` (the `*`: not responding).
    pub state: String,
    /// Why, as Slurm records it (`Not responding`, an administrator's reason); empty when
    /// Slurm gives none.
    pub reason: String,
}

impl LostNode {
    /// Why the node is lost: Slurm's reason, or its state in words when it gave none.
    pub(crate) fn why(&self) -> String {
        if !self.reason.is_empty() {
            self.reason.clone()
        } else if self.state.ends_with('*') {
            "not responding".to_string()
        } else {
            self.state.to_uppercase()
        }
    }
}

impl std::fmt::Display for LostNode {
    /// `node2 (Not responding)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.why())
    }
}

/// The lost nodes in `sinfo -h -N -o %N|%T|%E` output, each once (a node in two partitions
/// is listed twice).
pub(crate) fn parse_lost(text: &str) -> Vec<LostNode> {
    let mut lost: Vec<LostNode> = Vec::new();
    for line in text.lines() {
        let mut it = line.trim().splitn(3, '|');
        let (Some(name), Some(state)) = (it.next(), it.next()) else {
            continue;
        };
        let (name, state) = (name.trim(), state.trim());
        let base = state.trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']);
        // `*` after any state means the node does not answer the controller; DOWN and FAIL
        // are the states Slurm (or an administrator) puts a lost node in. A drained node
        // still runs its jobs, so it is not lost.
        let is_lost = state.ends_with('*') || base == "down" || base.starts_with("fail");
        if name.is_empty() || !is_lost || lost.iter().any(|l| l.name == name) {
            continue;
        }
        let reason = it.next().unwrap_or("").trim();
        lost.push(LostNode {
            name: name.to_string(),
            state: state.to_string(),
            reason: if reason == "none" || reason == "(null)" {
                String::new()
            } else {
                reason.to_string()
            },
        });
    }
    lost
}

/// The nodes Slurm holds lost now (DOWN, FAIL, or not responding): of the whole cluster
/// when `nodes` is `None`, else of that node list (e.g. a job's `node[1-2]`). Asked when a
/// job that ran failed, to tell a lost node from a failure of the cell. `sinfo` is asked
/// for those states only, so the answer stays a few lines on a cluster of thousands of
/// nodes, and one call can answer for every job in flight.
pub(crate) fn lost_nodes(nodes: Option<&str>) -> Result<Vec<LostNode>, SlurmError> {
    let mut args = vec!["-h", "-N", "-t", "down,fail,no_respond", "-o", "%N|%T|%E"];
    if let Some(n) = nodes {
        args.extend(["-n", n]);
    }
    let out = run("sinfo", &args)?;
    if !out.status.success() {
        return Err(SlurmError::Query {
            cmd: format!("sinfo {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(parse_lost(&String::from_utf8_lossy(&out.stdout)))
}

/// How long the controller takes to declare a silent node lost, from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NodeTimeouts {
    /// `SlurmdTimeout`: how long a node may stay silent before the controller sets it
    /// DOWN; `None` when it is 0, with which Slurm never does.
    pub slurmd: Option<Duration>,
    /// `MessageTimeout`: how long one of the controller's messages (a ping) may take.
    pub message: Duration,
}

/// Slurm's default `MessageTimeout`, for a configuration that does not show one.
const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The node timeouts in `scontrol show config` output (`SlurmdTimeout = 300 sec`);
/// `None` when it shows no `SlurmdTimeout`.
pub(crate) fn parse_node_timeouts(text: &str) -> Option<NodeTimeouts> {
    let secs = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.split_whitespace().next()?.parse::<u64>().ok())?
        })
    };
    let slurmd = secs("SlurmdTimeout")?;
    Some(NodeTimeouts {
        slurmd: (slurmd > 0).then(|| Duration::from_secs(slurmd)),
        message: secs("MessageTimeout")
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_MESSAGE_TIMEOUT),
    })
}

/// The controller's node timeouts, asked of `scontrol show config`.
pub(crate) fn node_timeouts() -> Result<NodeTimeouts, SlurmError> {
    let out = run("scontrol", &["show", "config"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse_node_timeouts(&text) {
        Some(t) if out.status.success() => Ok(t),
        _ => Err(SlurmError::Query {
            cmd: "scontrol show config".into(),
            stderr: if out.status.success() {
                "no SlurmdTimeout in its output".into()
            } else {
                String::from_utf8_lossy(&out.stderr).trim().to_string()
            },
        }),
    }
}

/// Whether a Slurm job state (as squeue or scontrol write it) means "not finished yet".
pub(crate) fn is_active(state: &str) -> bool {
    const ACTIVE: [&str; 8] = [
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "STAGE_OUT",
    ];
    ACTIVE.contains(&state)
}

/// A job as one `squeue` listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Slurm's state word, e.g. PENDING, RUNNING, COMPLETING.
    pub state: String,
    /// The nodes it runs on (empty while pending).
    pub nodes: String,
    /// Why it is pending (`Priority`, `Resources`, `PartitionTimeLimit`...); `None` when
    /// it runs.
    pub reason: String,
}

/// Parses `squeue -h -o %i|%T|%r|%N` output into job id -> listing.
pub(crate) fn parse_listing(text: &str) -> std::collections::HashMap<String, Listed> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.trim().splitn(4, '|');
            let id = it.next()?.trim();
            let state = it.next()?.trim();
            if id.is_empty() || state.is_empty() {
                return None;
            }
            let reason = it.next().unwrap_or("").trim();
            let nodes = it.next().unwrap_or("").trim();
            Some((
                id.to_string(),
                Listed {
                    state: state.to_string(),
                    nodes: nodes.to_string(),
                    reason: reason.to_string(),
                },
            ))
        })
        .collect()
}

/// Whether a pending job with this reason can never start as submitted: its request is
/// beyond what the partition, account or QOS allows, or it names something that does not
/// exist. Such a job would wait forever (and a CI job with it); the other reasons
/// (`Priority`, `Resources`, a node being down...) resolve with time.
pub(crate) fn never_starts(reason: &str) -> bool {
    const NEVER: [&str; 12] = [
        "PartitionTimeLimit",
        "PartitionNodeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "DependencyNeverSatisfied",
        "AssocMaxWallDurationPerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "AssocMaxNodesPerJobLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxGRESPerJob",
    ];
    NEVER.contains(&reason.trim())
}

/// The listings of `ids` in one `squeue` call (so that many jobs in flight cost the
/// controller one query per poll, not one each). Jobs squeue no longer shows are absent.
pub(crate) fn list(
    ids: &[String],
) -> Result<std::collections::HashMap<String, Listed>, SlurmError> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let joined = ids.join(",");
    let out = run("squeue", &["-h", "-j", &joined, "-o", "%i|%T|%r|%N"])?;
    if out.status.success() {
        return Ok(parse_listing(&String::from_utf8_lossy(&out.stdout)));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    // With a single id, squeue fails with "Invalid job id" for a job it no longer lists.
    if err.contains("Invalid job id") {
        return Ok(Default::default());
    }
    Err(SlurmError::Query {
        cmd: format!("squeue -h -j {joined} -o %i|%T|%r|%N"),
        stderr: err.trim().to_string(),
    })
}

fn classify(state: String, (exit_code, signal): (Option<i32>, Option<i32>)) -> JobState {
    if is_active(&state) {
        JobState::Active(state)
    } else {
        JobState::Finished {
            state,
            exit_code,
            signal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labelled_lines_split_into_rank_and_text() {
        let text = concat!(
            "0: {\"event\":\"step\",\"step\":0,\"step_time_s\":0.5,\"tokens\":8,\"loss\":2.0}\n",
            " 1: plain log text: with a colon\n",
            "10: {\"event\":\"summary\"}\n",
            "bench: srun exited with status 0\n",
            "3:\n",
            "1: bench: rank 1 exited with status 6\n",
            "0: bench: rank 0 exited with status 143\n",
        );
        let o = JobOutput::parse(text);
        assert_eq!(o.lines.len(), 7);
        assert_eq!(o.first_failure(), Some((1, 6)));
        assert_eq!(o.lines[0].rank, Some(0));
        assert!(o.lines[0].text.starts_with("{\"event\":\"step\""));
        assert_eq!(o.lines[1].rank, Some(1));
        assert_eq!(o.lines[1].text, "plain log text: with a colon");
        assert_eq!(o.lines[2].rank, Some(10));
        assert_eq!(o.lines[3].rank, None);
        assert_eq!(o.lines[4].rank, Some(3));
    }

    #[test]
    fn queue_listings_and_node_lists_parse() {
        let m = parse_listing(
            "12|RUNNING|None|gpu[01-02]\n13|PENDING|PartitionTimeLimit|\n\n bad line\n14|COMPLETING|None|n1\n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(
            m["12"],
            Listed {
                state: "RUNNING".into(),
                nodes: "gpu[01-02]".into(),
                reason: "None".into(),
            }
        );
        assert_eq!(m["13"].nodes, "");
        assert!(never_starts(&m["13"].reason));
        assert!(!never_starts("Priority") && !never_starts("Resources") && !never_starts("None"));
        assert!(is_active(&m["14"].state));
        assert!(!is_active("COMPLETED") && !is_active("CANCELLED"));
        assert_eq!(
            node_list("JobId=5 JobState=COMPLETED NodeList=vm BatchHost=vm").as_deref(),
            Some("vm")
        );
        assert_eq!(
            node_list("JobId=5 JobState=CANCELLED NodeList=(null)"),
            None
        );
    }

    #[test]
    fn lost_nodes_are_the_down_and_not_responding_ones() {
        let text = concat!(
            "node1|allocated|none\n",
            "node2|down*|Not responding\n",
            "node2|down*|Not responding\n",
            "node3|idle*|none\n",
            "node4|drained|maintenance | by admin\n",
            "node5|down|hardware: bad DIMM\n",
            "node6|failing|(null)\n",
            "\n",
        );
        let lost = parse_lost(text);
        let shown: Vec<String> = lost.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "node2 (Not responding)",
                "node3 (not responding)",
                "node5 (hardware: bad DIMM)",
                "node6 (FAILING)"
            ]
        );
        assert_eq!(lost[0].state, "down*");
        assert!(parse_lost("node1|idle|none\nnode2|mixed|none\n").is_empty());
    }

    #[test]
    fn node_timeouts_parse_from_the_controllers_config() {
        let text = "Configuration data as of 2026-11-28T00:10:00\nMessageTimeout          = 5 sec\nSlurmdTimeout           = 4 sec\nSlurmdUser              = root(0)\n";
        assert_eq!(
            parse_node_timeouts(text),
            Some(NodeTimeouts {
                slurmd: Some(Duration::from_secs(4)),
                message: Duration::from_secs(5),
            })
        );
        // 0 turns the timeout off; a missing MessageTimeout is Slurm's default.
        let t = parse_node_timeouts("SlurmdTimeout = 0 sec\n").unwrap();
        assert_eq!((t.slurmd, t.message), (None, Duration::from_secs(10)));
        assert_eq!(parse_node_timeouts("MessageTimeout = 5 sec\n"), None);
        assert_eq!(parse_node_timeouts("SlurmdTimeout = soon\n"), None);
    }

    #[test]
    fn exit_codes_and_states_classify() {
        assert_eq!(parse_exit("6:0"), (Some(6), Some(0)));
        assert_eq!(parse_exit("0:15"), (Some(0), Some(15)));
        assert!(matches!(
            classify("RUNNING".into(), (None, None)),
            JobState::Active(_)
        ));
        assert_eq!(
            classify("FAILED".into(), (Some(6), Some(0))),
            JobState::Finished {
                state: "FAILED".into(),
                exit_code: Some(6),
                signal: Some(0)
            }
        );
    }
}

//! The sbatch job of one cell: its sbatch options and batch script.
//!
//! Matrix values never reach a shell unquoted. sbatch options are passed as separate argv
//! elements to `sbatch` (no shell, no `#SBATCH` line parsing); in the script every value
//! is quoted by [`quote`] and every environment name checked to be an identifier. The
//! script's own logic is a fixed text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::SlurmError;
use super::settings::Settings;
use crate::cell::Cell;
use crate::dist::launch::Program;

/// Quotes `s` for a POSIX shell so that it is one word with exactly this value, whatever
/// it contains (spaces, quotes, `$(...)`, backticks, newlines, globs). Plain words stay
/// as they are for readability. NUL cannot be in an argument and is an error.
pub(crate) fn quote(s: &str) -> Result<String, SlurmError> {
    if s.contains('\0') {
        return Err(SlurmError::Nul {
            value: s.replace('\0', "\\0"),
        });
    }
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain {
        Ok(s.to_string())
    } else {
        // Inside single quotes nothing is special; a single quote ends the quoting, is
        // written escaped, and quoting resumes.
        Ok(format!("'{}'", s.replace('\'', r"'\''")))
    }
}

/// `s` made safe for a `#` comment line: control characters (newlines above all, which
/// would end the comment and start a command) are written as escapes.
fn comment_safe(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

fn is_identifier(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Seconds Slurm's time limit exceeds a cell's timeout by default, so that the runner's
/// own timeout (counted from the job's start) fires first and cancels the job cleanly.
pub(crate) const TIME_MARGIN_S: u64 = 60;

/// Slurm job time limit as `D-HH:MM:SS`.
pub(crate) fn time_limit(seconds: u64) -> String {
    let s = seconds.max(60);
    format!(
        "{}-{:02}:{:02}:{:02}",
        s / 86400,
        (s % 86400) / 3600,
        (s % 3600) / 60,
        s % 60
    )
}

/// Everything needed to submit one cell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JobPlan {
    pub cell_id: String,
    pub ranks: u32,
    pub nodes: u32,
    pub tasks_per_node: u32,
    /// GPUs per node requested; `None` for a CPU cell.
    pub gpus_per_node: Option<u32>,
    /// sbatch options (without `sbatch` itself and without the script path).
    pub sbatch_args: Vec<String>,
    /// The batch script's text.
    pub script: String,
    /// Where the script is written.
    pub script_path: PathBuf,
    /// The output file pattern (`%j` is the job id).
    pub output_pattern: PathBuf,
    /// Where the job script writes the environment of the job's first node (see
    /// [`plan_with_env_probe`]); `None` when it does not.
    pub node_env_dir: Option<PathBuf>,
}

impl JobPlan {
    /// The file the script of job `job_id` writes its node's environment into, when it
    /// writes one: `<job dir>/node-env-<job id>.json`. Named for the job, not the attempt,
    /// so that a resumed run never reads a file an earlier job of the same attempt left.
    pub(crate) fn node_env_file(&self, job_id: &str) -> Option<PathBuf> {
        self.node_env_dir
            .as_ref()
            .map(|d| d.join(format!("node-env-{job_id}.json")))
    }
}

/// Plans the job of `cell`: `ranks = cell.gpus()` tasks, one per GPU when `use_gpus`
/// (else CPU tasks), over `ceil(ranks / gpus_per_node)` nodes. `job_dir` holds the script
/// and the output; it must be on a file system the compute nodes share with this host.
#[cfg(test)]
pub(crate) fn plan(
    cell: &Cell,
    program: &Program,
    settings: &Settings,
    use_gpus: bool,
    job_dir: &Path,
) -> Result<JobPlan, SlurmError> {
    plan_with_env_probe(cell, program, settings, use_gpus, job_dir, None)
}

/// [`plan`], with the job script also recording the environment of the node it runs on
/// when `bench` is given: before the tasks start, the batch script (which Slurm runs on
/// the job's first node, inside the allocation, with the GPUs and variables its tasks get)
/// runs `bench env --format json` into [`JobPlan::node_env_file`]. That, not the
/// submitting host's, is the run's environment and hardware key. The probe never stops
/// the job: if it fails or is not done within two minutes, the cell still runs, and its
/// error output is kept beside the file (`.err`).
pub(crate) fn plan_with_env_probe(
    cell: &Cell,
    program: &Program,
    settings: &Settings,
    use_gpus: bool,
    job_dir: &Path,
    bench: Option<&Path>,
) -> Result<JobPlan, SlurmError> {
    let cell_id = cell.id.to_string();
    let per_node = settings.gpus_per_node.max(1);
    // A framework cell is one `bench adapt` whose launcher (torchrun, one JAX process, llm.c's
    // own processes) starts a process per GPU itself: one task holding all the cell's GPUs,
    // on one node. Every other cell is one task per GPU.
    let framework = matches!(
        cell.params.workload,
        crate::cell::Workload::Framework { .. }
    );
    if framework && cell.gpus() > per_node {
        return Err(SlurmError::FrameworkOverNodes {
            cell: cell_id,
            gpus: cell.gpus(),
            per_node,
        });
    }
    let ranks = if framework { 1 } else { cell.gpus() };
    let (nodes, tasks_per_node) = if ranks <= per_node {
        (1, ranks)
    } else if ranks.is_multiple_of(per_node) {
        (ranks / per_node, per_node)
    } else {
        return Err(SlurmError::UnevenNodes {
            cell: cell_id,
            ranks,
            per_node,
        });
    };
    let (argv, extra_env) = program
        .argv_env(cell)
        .map_err(|e| SlurmError::Launch(e.to_string()))?;

    // `%` starts a Slurm file-name pattern; `%%` is a literal percent sign.
    let dir_pattern = job_dir.to_string_lossy().replace('%', "%%");
    let output_pattern = PathBuf::from(format!("{dir_pattern}/slurm-%j.out"));
    let script_path = job_dir.join(format!("{cell_id}.sbatch"));

    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name=bench-{cell_id}"),
        format!("--nodes={nodes}"),
        format!("--ntasks-per-node={tasks_per_node}"),
        format!("--output={}", output_pattern.display()),
        // bench owns retries (a cell's `retries`, each attempt a new job with its own logs
        // and record). Slurm would otherwise requeue a batch job whose node failed
        // (JobRequeue=1 is its default), and the attempt would wait in the queue as a job
        // that had already run and failed instead of ending NODE_FAIL.
        "--no-requeue".to_string(),
    ];
    // Bench's own timeout must fire first and cancel cleanly; Slurm's limit is a backstop
    // a minute later. A cell without a timeout (0) takes the partition's default limit.
    let limit = settings
        .time_s
        .or((cell.params.timeout_s > 0).then(|| cell.params.timeout_s + TIME_MARGIN_S));
    if let Some(t) = limit {
        args.push(format!("--time={}", time_limit(t)));
    }
    let gpus_per_node = use_gpus.then_some(if framework {
        cell.gpus()
    } else {
        tasks_per_node
    });
    // One task for N GPUs would get Slurm's one CPU (and the memory that follows CPUs on
    // many sites) where a task per GPU got N: the framework's N processes keep N.
    if framework && cell.gpus() > 1 {
        args.push(format!("--cpus-per-task={}", cell.gpus()));
    }
    if let Some(g) = gpus_per_node {
        args.push(format!("--gpus-per-node={g}"));
    }
    if let Some(p) = &settings.partition {
        args.push(format!("--partition={p}"));
    }
    if let Some(a) = &settings.account {
        args.push(format!("--account={a}"));
    }
    args.extend(settings.sbatch_args.iter().cloned());

    let probe = bench.map(|b| (b, job_dir));
    let script = render_script(
        &cell_id,
        &args,
        &argv,
        &extra_env,
        ranks,
        tasks_per_node,
        probe,
    )?;
    Ok(JobPlan {
        cell_id,
        ranks,
        nodes,
        tasks_per_node,
        gpus_per_node,
        sbatch_args: args,
        script,
        script_path,
        output_pattern,
        node_env_dir: bench.map(|_| job_dir.to_path_buf()),
    })
}

fn render_script(
    cell_id: &str,
    sbatch_args: &[String],
    argv: &[String],
    env: &BTreeMap<String, String>,
    ranks: u32,
    tasks_per_node: u32,
    env_probe: Option<(&Path, &Path)>,
) -> Result<String, SlurmError> {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!(
        "# bench: Slurm job of cell {}\n",
        comment_safe(cell_id)
    ));
    let shown: Vec<String> = sbatch_args
        .iter()
        .map(|a| quote(a).map(|q| comment_safe(&q)))
        .collect::<Result<_, _>>()?;
    s.push_str(&format!(
        "# Submitted by bench as: sbatch {} <this file>\n",
        shown.join(" ")
    ));
    s.push_str(concat!(
        "# Every task gets torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n",
        "# MASTER_ADDR (the first node), MASTER_PORT (derived from the job id).\n",
        "set -u\n",
        "MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\"\n",
        "export MASTER_ADDR\n",
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n",
        "# Never enable NVLink multicast (NVLS).\n",
        "export NCCL_NVLS_ENABLE=0\n",
    ));
    for (k, v) in env {
        if !is_identifier(k) {
            return Err(SlurmError::BadEnvName {
                cell: cell_id.to_string(),
                name: comment_safe(k),
            });
        }
        if k == "NCCL_NVLS_ENABLE" {
            continue;
        }
        s.push_str(&format!("export {k}={}\n", quote(v)?));
    }
    s.push_str(&format!(
        "export WORLD_SIZE={ranks} LOCAL_WORLD_SIZE={tasks_per_node}\n"
    ));
    if let Some((bench, dir)) = env_probe {
        // After the cell's variables (they may choose the libraries or devices the tasks
        // see), before the tasks; in a subshell so that nothing it sets reaches them.
        s.push_str(concat!(
            "# The environment of this node (GPUs, driver, CUDA/ROCm, libtorch, NCCL) as the tasks\n",
            "# see it: bench adopts it as the run's environment and hardware key. A failure here\n",
            "# never stops the cell.\n",
        ));
        s.push_str(&format!(
            "(\n  f={}/node-env-\"$SLURM_JOB_ID\".json\n  limit=\n",
            quote(&dir.to_string_lossy())?
        ));
        s.push_str("  if command -v timeout >/dev/null 2>&1; then limit='timeout -k 5 120'; fi\n");
        s.push_str(&format!(
            "  if $limit {} env --format json >\"$f.tmp\" 2>\"$f.err\"; then mv -f \"$f.tmp\" \"$f\"; fi\n",
            quote(&bench.to_string_lossy())?
        ));
        s.push_str("  rm -f \"$f.tmp\"\n  [ -s \"$f.err\" ] || rm -f \"$f.err\"\n) </dev/null\n");
    }
    // The per-task part runs in each task's shell: a fixed text that takes the command as
    // its positional parameters, so no value is ever parsed as shell code. It reports the
    // rank's own exit status, because srun's is that of the ranks it killed afterwards
    // (143) rather than the first failure's (e.g. 6 for a distributed failure).
    s.push_str(
        "srun --kill-on-bad-exit=1 --label /bin/sh -c \
         'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; export RANK LOCAL_RANK; \
         \"$@\"; rc=$?; echo \"bench: rank $RANK exited with status $rc\" >&2; exit $rc' bench-task",
    );
    s.push_str(" \\\n ");
    for a in argv {
        s.push(' ');
        s.push_str(&quote(a)?);
    }
    s.push('\n');
    s.push_str("rc=$?\n");
    s.push_str("echo \"bench: srun exited with status $rc\" >&2\n");
    s.push_str("exit $rc\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellId, Params, Value, Workload};
    use indexmap::IndexMap;
    use std::process::Command;

    /// Runs `printf %s <quoted>` through a real /bin/sh and returns what it printed.
    fn through_sh(s: &str) -> String {
        let out = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("printf %s {}", quote(s).unwrap()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn quoting_survives_a_real_shell() {
        for s in [
            "plain",
            "two words",
            "it's",
            "\"double\"",
            "$(touch /tmp/bench-pwned)",
            "`id`",
            "line1\nline2",
            "$HOME ${X:-y} *",
            "'",
            "''",
            "a'b\"c`d$e\\f",
            "",
            "-n",
            "ünïcødé ☃",
        ] {
            assert_eq!(through_sh(s), s, "value {s:?} quoted as {:?}", quote(s));
        }
        assert!(!Path::new("/tmp/bench-pwned").exists());
        assert_eq!(quote("gpt2-1.5b").unwrap(), "gpt2-1.5b");
        assert_eq!(quote("a b").unwrap(), "'a b'");
        assert!(matches!(quote("a\0b"), Err(SlurmError::Nul { .. })));
    }

    #[test]
    fn time_limits_are_slurm_format() {
        assert_eq!(time_limit(90), "0-00:01:30");
        assert_eq!(time_limit(1800), "0-00:30:00");
        assert_eq!(time_limit(90000), "1-01:00:00");
        assert_eq!(time_limit(5), "0-00:01:00");
    }

    fn cell(gpus: i64, workload: Workload) -> Cell {
        let mut values = IndexMap::new();
        values.insert("model".to_string(), Value::Str("gpt2-1.5b".into()));
        values.insert("gpus".to_string(), Value::Int(gpus));
        values.insert("parallel".to_string(), Value::Str("fsdp".into()));
        Cell {
            id: CellId::from_values(&values),
            values,
            params: Params {
                workload,
                timeout_s: 600,
                ..Params::default()
            },
        }
    }

    fn settings() -> Settings {
        Settings {
            partition: Some("gpu".into()),
            account: Some("ml-infra".into()),
            time_s: None,
            gpus_per_node: 8,
            sbatch_args: vec!["--exclusive".into()],
        }
    }

    #[test]
    fn a_framework_cell_is_one_task_holding_all_its_gpus_on_one_node() {
        let fw = Workload::Framework {
            kind: "deepspeed".into(),
            opts: Default::default(),
        };
        let prog = Program::Command {
            argv: vec!["/shared/bin/bench".into(), "adapt".into()],
            env: BTreeMap::new(),
        };
        let p = plan(
            &cell(4, fw.clone()),
            &prog,
            &settings(),
            true,
            Path::new("/j"),
        )
        .unwrap();
        assert_eq!(
            (p.ranks, p.nodes, p.tasks_per_node, p.gpus_per_node),
            (1, 1, 1, Some(4))
        );
        assert!(p.sbatch_args.iter().any(|a| a == "--ntasks-per-node=1"));
        assert!(p.sbatch_args.iter().any(|a| a == "--gpus-per-node=4"));
        assert!(p.sbatch_args.iter().any(|a| a == "--cpus-per-task=4"));
        let e = plan(&cell(16, fw), &prog, &settings(), true, Path::new("/j")).unwrap_err();
        assert!(
            matches!(
                e,
                SlurmError::FrameworkOverNodes {
                    gpus: 16,
                    per_node: 8,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn sixteen_gpus_on_two_nodes() {
        let c = cell(16, Workload::Builtin);
        let prog = Program::Builtin {
            exe: PathBuf::from("/shared/bin/bench"),
        };
        let p = plan(&c, &prog, &settings(), true, Path::new("/shared/run 1/%x")).unwrap();
        assert_eq!(
            (p.nodes, p.tasks_per_node, p.gpus_per_node),
            (2, 8, Some(8))
        );
        for want in [
            "--nodes=2",
            "--ntasks-per-node=8",
            "--gpus-per-node=8",
            "--partition=gpu",
            "--account=ml-infra",
            "--time=0-00:11:00",
            "--exclusive",
            "--output=/shared/run 1/%%x/slurm-%j.out",
            "--no-requeue",
        ] {
            assert!(
                p.sbatch_args.iter().any(|a| a == want),
                "{want} in {:?}",
                p.sbatch_args
            );
        }
        assert!(p.script.contains("export WORLD_SIZE=16 LOCAL_WORLD_SIZE=8"));
        assert!(p.script.contains(
            "bench-task \\\n  /shared/bin/bench worker --cell-id gpt2-1.5b.16gpu.fsdp --model"
        ));
        assert!(p
            .script
            .contains("'--output=/shared/run 1/%%x/slurm-%j.out'"));
        assert!(p.script.contains("export NCCL_NVLS_ENABLE=0"));
    }

    #[test]
    fn a_cell_without_timeout_takes_the_partition_limit() {
        let mut c = cell(1, Workload::Builtin);
        c.params.timeout_s = 0;
        let prog = Program::Builtin {
            exe: PathBuf::from("bench"),
        };
        let p = plan(&c, &prog, &settings(), false, Path::new("/j")).unwrap();
        assert!(
            !p.sbatch_args.iter().any(|a| a.starts_with("--time")),
            "{:?}",
            p.sbatch_args
        );
        let mut s = settings();
        s.time_s = Some(3600);
        let p = plan(&c, &prog, &s, false, Path::new("/j")).unwrap();
        assert!(p.sbatch_args.iter().any(|a| a == "--time=0-01:00:00"));
    }

    #[test]
    fn uneven_split_and_bad_env_names_are_errors() {
        let prog = Program::Builtin {
            exe: PathBuf::from("bench"),
        };
        let e = plan(
            &cell(12, Workload::Builtin),
            &prog,
            &settings(),
            true,
            Path::new("/j"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("12 ranks"), "{e}");
        let mut env = BTreeMap::new();
        env.insert("BAD NAME;rm".to_string(), "x".to_string());
        let cmd = Program::Command {
            argv: vec!["true".into()],
            env,
        };
        let e = plan(
            &cell(1, Workload::Builtin),
            &cmd,
            &settings(),
            false,
            Path::new("/j"),
        )
        .unwrap_err();
        assert!(matches!(e, SlurmError::BadEnvName { .. }), "{e}");
    }

    /// Runs a planned job's script with stand-ins for `scontrol` and `srun` (on PATH),
    /// as Slurm would on the job's first node; returns its exit status.
    fn run_script(p: &JobPlan, bin: &Path, job_id: &str) -> std::process::ExitStatus {
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        Command::new("bash")
            .arg("-c")
            .arg(&p.script)
            .env("PATH", path)
            .env("SLURM_JOB_ID", job_id)
            .env("SLURM_JOB_NODELIST", "node1")
            .output()
            .unwrap()
            .status
    }

    fn executable(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn the_job_script_records_its_nodes_environment_before_the_tasks() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        executable(&bin.join("scontrol"), "#!/bin/sh\necho node1\n");
        // srun notes whether the environment was there when the tasks started.
        executable(
            &bin.join("srun"),
            "#!/bin/sh\nls \"$PROBE_DIR\" > \"$PROBE_DIR/../seen-by-srun\"\n",
        );
        // A job dir with a space and a quote: the path is data, not shell code.
        let job_dir = tmp.path().join("run 'one'/c.r0");
        std::fs::create_dir_all(&job_dir).unwrap();
        let bench = tmp.path().join("fake bench");
        executable(
            &bench,
            "#!/bin/sh\n[ \"$1 $2 $3\" = 'env --format json' ] || exit 9\nprintf '{\"hardware_key\":\"h100-sxm-80gb\",\"note\":\"%s\"}\\n' \"$NOTE\"\n",
        );
        let mut env = BTreeMap::new();
        env.insert("NOTE".to_string(), "from the cell".to_string());
        env.insert(
            "PROBE_DIR".to_string(),
            job_dir.to_string_lossy().into_owned(),
        );
        let prog = Program::Command {
            argv: vec!["true".into()],
            env,
        };
        let c = cell(1, Workload::Builtin);
        let p = plan_with_env_probe(&c, &prog, &settings(), false, &job_dir, Some(&bench)).unwrap();
        let file = p.node_env_file("42").unwrap();
        assert_eq!(file, job_dir.join("node-env-42.json"));
        assert!(run_script(&p, &bin, "42").success());
        // Written before srun started the tasks, with the cell's variables in force, and
        // nothing else left behind.
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("\"hardware_key\":\"h100-sxm-80gb\""),
            "{text}"
        );
        assert!(text.contains("from the cell"), "{text}");
        let seen = std::fs::read_to_string(job_dir.join("../seen-by-srun")).unwrap();
        assert_eq!(seen.trim(), "node-env-42.json");

        // A probe that fails leaves its error output, and the tasks still run.
        executable(
            &bench,
            "#!/bin/sh\necho 'cannot load libtorch' >&2\nexit 1\n",
        );
        let _ = std::fs::remove_file(job_dir.join("../seen-by-srun"));
        assert!(run_script(&p, &bin, "43").success());
        assert!(!job_dir.join("node-env-43.json").exists());
        let err = std::fs::read_to_string(job_dir.join("node-env-43.json.err")).unwrap();
        assert!(err.contains("cannot load libtorch"), "{err}");
        assert!(job_dir.join("../seen-by-srun").exists());

        // Without a probe the script has none.
        let p = plan(&c, &prog, &settings(), false, &job_dir).unwrap();
        assert!(p.node_env_file("42").is_none());
        assert!(!p.script.contains("env --format json"));
    }

    #[test]
    fn hostile_values_stay_data_in_the_script() {
        let mut env = BTreeMap::new();
        env.insert(
            "NOTE".to_string(),
            "x\n$(touch /tmp/bench-pwned2)".to_string(),
        );
        env.insert("NCCL_NVLS_ENABLE".to_string(), "1".to_string());
        let prog = Program::Command {
            argv: vec!["echo".into(), "`id` $(id) 'q'\nnext".into()],
            env,
        };
        let p = plan(
            &cell(1, Workload::Builtin),
            &prog,
            &settings(),
            false,
            Path::new("/j"),
        )
        .unwrap();
        assert_eq!(p.gpus_per_node, None);
        assert!(!p.sbatch_args.iter().any(|a| a.starts_with("--gpus")));
        assert!(!p.script.contains("NCCL_NVLS_ENABLE=1"));
        // Parse the script with bash without running it: it must be valid, and the hostile
        // newline must not have produced a command line of its own.
        let out = Command::new("bash")
            .arg("-n")
            .arg("-c")
            .arg(&p.script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(p
            .script
            .contains("export NOTE='x\n$(touch /tmp/bench-pwned2)'"));
        assert!(!Path::new("/tmp/bench-pwned2").exists());
    }
}

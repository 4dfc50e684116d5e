//! Launch plans: which processes one attempt of a cell starts, with which arguments and
//! environment.
//!
//! This is the only place that turns a cell into command lines. A `command` workload's
//! argv template is filled by [`crate::cell::command`] (below the matrix, whose dry run
//! checks every cell with it), element by element, and every element stays exactly one
//! argument: nothing is ever handed to a shell, so a matrix value such as
//! `x; touch /tmp/pwned` reaches the program as that literal text. A plan holds a list of
//! processes: a built-in `ddp`/`fsdp` cell starts one process per GPU with the variables
//! torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
//! every other cell starts one.

use std::path::{Path, PathBuf};

use crate::cell::command::{fill_command, Filled};
use crate::cell::{Cell, Workload};

/// One process of an attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Variables added to the runner's own environment.
    pub env: Vec<(String, String)>,
    /// The rank of this process within the cell (0 for single-process cells).
    pub rank: u32,
}

/// The processes of one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchPlan {
    pub procs: Vec<ProcSpec>,
}

/// Where and what an attempt is: the devices it owns and its place in the run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttemptCtx {
    /// e.g. `("CUDA_VISIBLE_DEVICES", "0,1")`; `None` on a CPU host.
    pub visible_devices: Option<(String, String)>,
    pub repeat: u32,
    pub attempt: u32,
    pub run_dir: PathBuf,
    /// The rendezvous port of a multi-rank cell (`MASTER_PORT`).
    pub master_port: u16,
    /// Where the workload traces one step (`BENCH_PROFILE`), when the run keeps each cell's
    /// kernels (`triage.trace_every_run`).
    pub profile: Option<PathBuf>,
}

/// A cell whose workload cannot be turned into a command line (bad input: exit 2); the
/// templates' own errors come from [`crate::cell::command`], which fills them.
pub use crate::cell::command::LaunchError;

/// The variables every worker gets, so scripts can name their outputs.
fn runner_env(cell: &Cell, ctx: &AttemptCtx) -> Vec<(String, String)> {
    let mut env = vec![
        ("BENCH_CELL_ID".to_string(), cell.id.to_string()),
        ("BENCH_REPEAT".to_string(), ctx.repeat.to_string()),
        ("BENCH_ATTEMPT".to_string(), ctx.attempt.to_string()),
        (
            "BENCH_RUN_DIR".to_string(),
            ctx.run_dir.display().to_string(),
        ),
    ];
    if let Some((var, ids)) = &ctx.visible_devices {
        env.push((var.clone(), ids.clone()));
    }
    if let Some(p) = &ctx.profile {
        env.push(("BENCH_PROFILE".to_string(), p.display().to_string()));
    }
    env
}

/// The one process of `cell` (placeholders filled, the runner's variables set, rank 0)
/// before any rank contract is added: what [`plan`] starts on this host, and what the
/// Slurm launcher hands to `srun` once per task.
pub(crate) fn command(
    cell: &Cell,
    ctx: &AttemptCtx,
    bench_exe: &Path,
) -> Result<ProcSpec, LaunchError> {
    let mut env = runner_env(cell, ctx);
    let (program, args) = match &cell.params.workload {
        Workload::Builtin => {
            let mut args = vec!["worker".to_string()];
            args.extend(cell.worker_args());
            (bench_exe.to_path_buf(), args)
        }
        Workload::Command { argv, env: extra } => {
            // The templates filled (placeholders, the program) by the one function the
            // dry run's check also calls.
            let Filled {
                program,
                args,
                env: filled,
            } = fill_command(cell, argv, extra)?;
            env.extend(filled);
            (program, args)
        }
        // Framework adapters run under `bench adapt`, which reads the framework's log into
        // worker events (crate::external).
        Workload::Framework { .. } => (bench_exe.to_path_buf(), crate::external::adapt_args(cell)),
    };
    env.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(ProcSpec {
        program,
        args,
        env,
        rank: 0,
    })
}

/// Whether `cell`'s workload can be turned into a command line (no unknown placeholder,
/// no unclosed brace, an argv with a program): the check [`command`] makes at launch
/// (both fill the templates through [`fill_command`]), made for every cell by the run
/// before its first cell; `bench matrix --dry-run` makes the same check
/// ([`crate::cell::command::check`]) during its walk, so a dry run passes exactly what the
/// run accepts.
pub(crate) fn check(cell: &Cell) -> Result<(), LaunchError> {
    crate::cell::command::check(cell)
}

/// The processes of one attempt of `cell`; `bench_exe` is the program for built-in cells.
pub fn plan(cell: &Cell, ctx: &AttemptCtx, bench_exe: &Path) -> Result<LaunchPlan, LaunchError> {
    let ProcSpec {
        program, args, env, ..
    } = command(cell, ctx, bench_exe)?;
    let ranks = ranks(cell);
    if ranks == 1 {
        return Ok(LaunchPlan {
            procs: vec![ProcSpec {
                program,
                args,
                env,
                rank: 0,
            }],
        });
    }
    // One process per GPU with the variables torchrun sets; every rank sees all of the
    // cell's GPUs and takes the one at LOCAL_RANK, so peer-to-peer paths stay usable.
    let procs = (0..ranks)
        .map(|rank| {
            let mut env = env.clone();
            env.extend([
                ("RANK".to_string(), rank.to_string()),
                ("LOCAL_RANK".to_string(), rank.to_string()),
                ("WORLD_SIZE".to_string(), ranks.to_string()),
                ("LOCAL_WORLD_SIZE".to_string(), ranks.to_string()),
                ("MASTER_ADDR".to_string(), "127.0.0.1".to_string()),
                ("MASTER_PORT".to_string(), ctx.master_port.to_string()),
                // NVLink multicast (NVLS) is always off for multi-rank NCCL cells: the lent
                // machines require it, and it buys nothing at these sizes
                // (docs/distributed.md).
                ("NCCL_NVLS_ENABLE".to_string(), "0".to_string()),
            ]);
            ProcSpec {
                program: program.clone(),
                args: args.clone(),
                env,
                rank,
            }
        })
        .collect();
    Ok(LaunchPlan { procs })
}

/// How many processes a cell starts: one per GPU for a built-in data- or
/// fully-sharded-parallel cell; one otherwise (a command starts its own ranks, e.g. through
/// torchrun, and a single-device cell has one).
pub(crate) fn ranks(cell: &Cell) -> u32 {
    match (&cell.params.workload, cell.parallel()) {
        (Workload::Builtin, p) if p.is_multi_rank() => cell.gpus().max(1),
        _ => 1,
    }
}

/// A TCP port free on the loopback interface now, for a multi-rank cell's rendezvous.
pub(crate) fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{CellId, Params, Value};
    use indexmap::IndexMap;

    fn cell(argv: &[&str]) -> Cell {
        let mut values = IndexMap::new();
        values.insert(
            "model".to_string(),
            Value::Str("x; touch /tmp/pwned".into()),
        );
        values.insert("gpus".to_string(), Value::Int(2));
        values.insert(
            "features".to_string(),
            Value::Set(["sac".to_string(), "compile".to_string()].into()),
        );
        let mut params = Params {
            workload: Workload::Command {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                env: [("MODE".to_string(), "{dtype}-{marker}".to_string())].into(),
            },
            ..Params::default()
        };
        params
            .extra
            .insert("marker".into(), serde_json::Value::String("m".into()));
        Cell {
            id: CellId::from_values(&values),
            values,
            params,
        }
    }

    #[test]
    fn fills_axes_params_and_extras_as_single_arguments() {
        let c = cell(&[
            "prog",
            "--model={model}",
            "{gpus}",
            "{features}",
            "{steps}",
            "{{lit}}",
        ]);
        let p = plan(&c, &AttemptCtx::default(), Path::new("/bench")).unwrap();
        let proc0 = &p.procs[0];
        assert_eq!(proc0.program, PathBuf::from("prog"));
        assert_eq!(
            proc0.args,
            vec![
                "--model=x; touch /tmp/pwned",
                "2",
                "compile,sac",
                "30",
                "{lit}"
            ]
        );
        assert!(proc0
            .env
            .contains(&("MODE".to_string(), "bf16-m".to_string())));
    }

    #[test]
    fn unknown_placeholder_names_cell_and_placeholder() {
        let c = cell(&["prog", "{nope}"]);
        let e = plan(&c, &AttemptCtx::default(), Path::new("/bench")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(c.id.as_str()) && msg.contains("{nope}"),
            "{msg}"
        );
        let c = cell(&["prog", "{open"]);
        assert!(matches!(
            plan(&c, &AttemptCtx::default(), Path::new("/b")),
            Err(LaunchError::Unclosed { .. })
        ));
    }

    #[test]
    fn builtin_runs_bench_worker_with_devices() {
        let mut c = cell(&[]);
        c.params.workload = Workload::Builtin;
        let ctx = AttemptCtx {
            visible_devices: Some(("CUDA_VISIBLE_DEVICES".into(), "2,3".into())),
            ..Default::default()
        };
        let p = plan(&c, &ctx, Path::new("/bin/bench")).unwrap();
        assert_eq!(p.procs[0].program, PathBuf::from("/bin/bench"));
        assert_eq!(p.procs[0].args[0], "worker");
        assert_eq!(&p.procs[0].args[1..], c.worker_args().as_slice());
        assert!(p.procs[0]
            .env
            .contains(&("CUDA_VISIBLE_DEVICES".to_string(), "2,3".to_string())));
    }

    #[test]
    fn builtin_ddp_cell_starts_one_rank_per_gpu() {
        let mut c = cell(&[]);
        c.params.workload = Workload::Builtin;
        c.values.insert("parallel".into(), Value::Str("ddp".into()));
        let ctx = AttemptCtx {
            visible_devices: Some(("CUDA_VISIBLE_DEVICES".into(), "4,5".into())),
            master_port: 29511,
            ..Default::default()
        };
        let p = plan(&c, &ctx, Path::new("/bin/bench")).unwrap();
        assert_eq!(p.procs.len(), 2);
        for (i, proc_) in p.procs.iter().enumerate() {
            // The last setting of a variable is the one the process gets.
            let get = |k: &str| {
                proc_
                    .env
                    .iter()
                    .rev()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(proc_.rank, i as u32);
            assert_eq!(get("RANK"), Some(i.to_string().as_str()));
            assert_eq!(get("LOCAL_RANK"), Some(i.to_string().as_str()));
            assert_eq!(get("WORLD_SIZE"), Some("2"));
            assert_eq!(get("MASTER_PORT"), Some("29511"));
            assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("4,5"));
            assert_eq!(get("NCCL_NVLS_ENABLE"), Some("0"));
        }
        // A command cell launches its own ranks.
        c.params.workload = Workload::Command {
            argv: vec!["torchrun".into()],
            env: Default::default(),
        };
        assert_eq!(plan(&c, &ctx, Path::new("/b")).unwrap().procs.len(), 1);
    }
}

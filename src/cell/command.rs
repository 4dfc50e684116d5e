//! A cell's `command` workload as a command line: its argv and env templates filled from
//! the cell, element by element, each element exactly one argument (nothing is ever handed
//! to a shell, so a matrix value such as `x; touch /tmp/pwned` reaches the program as that
//! literal text).
//!
//! Vocabulary below the matrix and the runner: the runner builds each attempt's command
//! line with [`fill_command`] (`run::launch::command`), and [`check`] refuses, for every cell, what
//! no process can start (an unknown placeholder, an unclosed brace, an argv without a
//! program) both before a run's first cell and during `bench matrix --dry-run`'s walk, so
//! a dry run passes exactly what the run accepts without a second walk of its own.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Cell, Value, Workload};

/// A cell whose workload cannot be turned into a command line. Bad input: exit 2.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LaunchError {
    #[error("cell {cell}: workload {field} `{template}`: unknown placeholder {{{name}}}; known: {known}")]
    UnknownPlaceholder {
        cell: String,
        field: String,
        template: String,
        name: String,
        known: String,
    },
    #[error("cell {cell}: workload {field} `{template}`: `{{` without a closing `}}` (write `{{{{` for a literal brace)")]
    Unclosed {
        cell: String,
        field: String,
        template: String,
    },
    #[error(
        "cell {cell}: workload argv is empty or names no program; it needs at least the program"
    )]
    EmptyArgv { cell: String },
    #[error("cannot locate the bench executable to start `bench worker`: {0}")]
    CurrentExe(String),
    #[error("cell {cell} uses the built-in workload, which this bench does not have: it is the runner-only build (built with --no-default-features); run the matrix with the full build (`cargo install --path . --locked`, with libtorch from scripts/env.sh) or the CUDA or ROCm image of docker/, or name a full build's binary with --worker-exe")]
    NotBuiltIn { cell: String },
}

/// The values a `command` template may name: the cell's axes, its parameters, its extra
/// parameters, and `cell_id`, `gpus`, `features` (comma-separated), `model`, `dtype`,
/// `parallel` (with the same defaults the built-in workload uses).
fn placeholders(cell: &Cell) -> BTreeMap<String, String> {
    let p = &cell.params;
    let mut vars = BTreeMap::new();
    // Parameters first, so that an axis of the same name (e.g. a `seq_len` axis) wins:
    // the axis value is the one the cell id names.
    let params: [(&str, String); 13] = [
        ("steps", p.steps.to_string()),
        ("warmup", p.warmup.to_string()),
        ("seq_len", p.seq_len.to_string()),
        ("micro_batch", p.micro_batch.to_string()),
        ("grad_accum", p.grad_accum.to_string()),
        ("global_batch", p.global_batch.to_string()),
        ("repeats", p.repeats.to_string()),
        ("timeout", p.timeout_s.to_string()),
        ("timeout_s", p.timeout_s.to_string()),
        ("retries", p.retries.to_string()),
        ("sac_every", p.sac_every.to_string()),
        ("seed", p.seed.to_string()),
        ("lr", p.lr.to_string()),
    ];
    for (k, v) in params {
        vars.insert(k.to_string(), v);
    }
    if let Some(d) = &p.data {
        vars.insert("data".into(), d.clone());
    }
    for (k, v) in &p.extra {
        let text = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        vars.insert(k.clone(), text);
    }
    for (axis, v) in &cell.values {
        let text = match v {
            Value::Set(s) => s.iter().cloned().collect::<Vec<_>>().join(","),
            other => other.id_fragment(),
        };
        vars.insert(axis.clone(), text);
    }
    vars.insert("cell_id".into(), cell.id.to_string());
    vars.insert("gpus".into(), cell.gpus().to_string());
    vars.insert(
        "features".into(),
        cell.features().into_iter().collect::<Vec<_>>().join(","),
    );
    // Defaults for cells without these axes; an axis value stays as the matrix wrote it.
    vars.insert("model".into(), cell.model().to_string());
    vars.entry("dtype".into())
        .or_insert_with(|| cell.dtype().to_string());
    vars.entry("parallel".into())
        .or_insert_with(|| cell.parallel().to_string());
    vars
}

/// Fills `{name}` placeholders in `template`; `{{` and `}}` are literal braces.
fn fill(
    cell: &Cell,
    field: &str,
    template: &str,
    vars: &BTreeMap<String, String>,
) -> Result<String, LaunchError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if let Some(after) = tail.strip_prefix('}') {
            // A lone closing brace is ordinary text (JSON fragments in arguments).
            out.push('}');
            rest = after;
            continue;
        }
        let Some(end) = tail.find('}') else {
            return Err(LaunchError::Unclosed {
                cell: cell.id.to_string(),
                field: field.to_string(),
                template: template.to_string(),
            });
        };
        let name = tail[1..end].trim();
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err(LaunchError::UnknownPlaceholder {
                    cell: cell.id.to_string(),
                    field: field.to_string(),
                    template: template.to_string(),
                    name: name.to_string(),
                    known: vars.keys().cloned().collect::<Vec<_>>().join(", "),
                })
            }
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A `command` workload's template filled from `cell`: the program, its arguments, and
/// the variables it adds to the runner's (in `env`'s order).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filled {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Fills the `command` workload `argv` and `env` of `cell`: each argument in order, then
/// each variable, then the program's name, which must not be empty.
pub(crate) fn fill_command(
    cell: &Cell,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> Result<Filled, LaunchError> {
    let vars = placeholders(cell);
    let filled = argv
        .iter()
        .enumerate()
        .map(|(i, a)| fill(cell, &format!("argv[{i}]"), a, &vars))
        .collect::<Result<Vec<_>, _>>()?;
    let env = env
        .iter()
        .map(|(k, v)| Ok((k.clone(), fill(cell, &format!("env.{k}"), v, &vars)?)))
        .collect::<Result<Vec<_>, LaunchError>>()?;
    let mut it = filled.into_iter();
    // An empty program name (`argv: [""]`, or a placeholder that filled to nothing) can
    // never start: refused like an empty argv, at the dry run too.
    let program =
        it.next()
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| LaunchError::EmptyArgv {
                cell: cell.id.to_string(),
            })?;
    Ok(Filled {
        program: PathBuf::from(program),
        args: it.collect(),
        env,
    })
}

/// Whether `cell`'s workload can be turned into a command line: a `command` workload's
/// templates fill (no unknown placeholder, no unclosed brace) and name a program; the
/// built-in workload and the framework adapters always can. What `run::launch::command`
/// refuses at launch, checked for every cell by the run before its first cell and by the
/// dry run's walk.
pub(crate) fn check(cell: &Cell) -> Result<(), LaunchError> {
    match &cell.params.workload {
        Workload::Command { argv, env } => fill_command(cell, argv, env).map(|_| ()),
        Workload::Builtin | Workload::Framework { .. } => Ok(()),
    }
}

//! The CLI stage: the raw clap types ([`args`]), their resolution into each stage's own
//! settings ([`resolve`]), and [`dispatch`], which hands one parsed command to its stage.
//!
//! This is the only module that knows clap's structs. Every domain module takes a plain
//! settings struct (`run::MatrixSettings`, `commands::report::ReportSettings`, ...), so it can be
//! called from tests or another front end without building command-line arguments, and
//! `scripts/module-graph.sh` fails when a file outside `src/cli/` and `src/main.rs`
//! imports `crate::cli`.

pub mod args;
pub mod resolve;

pub use args::*;

use crate::error::CliError;

/// Runs one parsed command and returns its exit code (see `exit::bench`).
pub fn dispatch(cli: Cli) -> Result<i32, CliError> {
    match cli.command {
        Command::Matrix(args) if args.dry_run => {
            crate::matrix::cmd::dry_run(&resolve::dry_run(&args))
        }
        Command::Matrix(args) => crate::commands::matrix::matrix(&resolve::matrix(&args)?),
        Command::Schema => crate::matrix::cmd::schema(),
        Command::Worker(args) => Ok(crate::workload::run_worker(&resolve::worker(&args))),
        Command::Baseline(args) => match &args.command {
            BaselineCommand::Update(u) => crate::baseline::cmd::update(&resolve::update(u)?),
            BaselineCommand::Accept(a) => crate::history::cmd::accept(&resolve::accept(a)?),
        },
        Command::Report(args) => match &args.command {
            Some(ReportCommand::Post(p)) => {
                crate::commands::report::post_command(&resolve::post(p)?)
            }
            Some(ReportCommand::Html(h)) => {
                crate::commands::report::html_command(&resolve::html(h)?)
            }
            Some(ReportCommand::Merge(m)) => {
                crate::commands::fleet::merge_command(&resolve::merge(m))
            }
            None => crate::commands::report::report(&resolve::report(&args)?),
        },
        Command::Env(args) => crate::env::cmd(&resolve::env(&args)),
        Command::Adapt(args) => Ok(crate::external::run::main(&args.cell)),
        Command::History(args) => match &args.command {
            Some(HistoryCommand::Import(a)) => crate::history::cmd::import(&resolve::import(a)),
            Some(HistoryCommand::Study(a)) => crate::history::cmd::study(&resolve::study(a)?),
            None => crate::history::cmd::show(&resolve::show(&args)?),
        },
        Command::Bisect(args) => crate::bisect::cmd(&resolve::bisect(&args)?),
        Command::Ingest(args) => crate::ingest::cmd(&resolve::ingest(&args)?),
        Command::Site(args) => crate::site::command(&resolve::site(&args)?),
        Command::Completions(args) => completions(args.shell),
        Command::Man => man(),
    }
}

/// `bench completions SHELL`: generated from the clap definition itself, so the script
/// completes exactly the subcommands and flags this binary has.
fn completions(shell: clap_complete::Shell) -> Result<i32, CliError> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "bench", &mut out);
    write_stdout(&out)
}

/// `bench man`: the manual page (roff), generated from the clap definition.
fn man() -> Result<i32, CliError> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd)
        .render(&mut out)
        .map_err(|e| CliError::internal(miette::miette!("cannot render the manual page: {e}")))?;
    write_stdout(&out)
}

/// Writes `bytes` to standard output; a closed pipe (`| head`) ends bench with exit 141
/// ([`crate::exit::or_broken_pipe`]), as it ends every other command.
fn write_stdout(bytes: &[u8]) -> Result<i32, CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    crate::exit::or_broken_pipe(out.write_all(bytes).and_then(|()| out.flush()))
        .map_err(|e| CliError::internal(miette::miette!("cannot write output: {e}")))?;
    Ok(crate::exit::bench::OK)
}

//! CLI entry: parse arguments, dispatch to a stage, map failures to exit codes.

use clap::Parser;

use bench::cli::{Cli, Command};
use bench::error::CliError;
use bench::exit::bench as exit;

fn main() {
    let cli = Cli::parse();
    let result: Result<i32, CliError> = match cli.command {
        Command::Matrix(args) if args.dry_run => bench::matrix::cmd::dry_run(&args),
        Command::Matrix(args) => bench::run::cmd(&args),
        Command::Schema => bench::matrix::cmd::schema(),
        Command::Worker(args) => Ok(bench::workload::run_worker(&args)),
        Command::Baseline(args) => match &args.command {
            bench::cli::BaselineCommand::Update(u) => bench::baseline::cmd::update(u),
            bench::cli::BaselineCommand::Accept(a) => bench::history::cmd::accept(a),
        },
        Command::Report(args) => match &args.command {
            Some(bench::cli::ReportCommand::Post(p)) => bench::report::post::post_command(p),
            Some(bench::cli::ReportCommand::Html(h)) => bench::report::html::html_command(h),
            None => bench::report::report_command(&args),
        },
        Command::Env(args) => bench::env::cmd(&args),
        Command::Adapt(args) => Ok(bench::external::run::main(&args.cell)),
        Command::History(args) => bench::history::cmd::command(&args),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            // Plain rendering: our messages already carry `file:line:column` and a caret
            // under the source, which a boxed, re-wrapped diagnostic would misalign.
            eprintln!("error: {:#}", e.report());
            e.exit_code()
        }
    };
    std::process::exit(if code == exit::OK { 0 } else { code });
}

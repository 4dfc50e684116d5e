//! `bench matrix` (dry run) and `bench schema`.

use crate::cli::MatrixArgs;
use crate::error::CliError;

pub fn run(args: &MatrixArgs) -> Result<i32, CliError> {
    let _ = args;
    Err(CliError::internal(miette::miette!("not built yet")))
}

pub fn schema() -> Result<i32, CliError> {
    Err(CliError::internal(miette::miette!("not built yet")))
}

//! CLI entry: parse arguments, hand the command to `cli::dispatch`, map failures to exit
//! codes.

use clap::Parser;

use bench::cli::Cli;
use bench::exit::bench as exit;

fn main() {
    let code = match bench::cli::dispatch(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            // Plain rendering: our messages already carry `file:line:column` and a caret
            // under the source, which a boxed, re-wrapped diagnostic would misalign.
            // An argument echoed in the message (a path, `--branch`, `--metric`) is the
            // user's text, not bench's: its escapes are shown, never sent to the terminal.
            let message = format!("{:#}", e.report());
            eprintln!("error: {}", bench::sanitize::terminal(&message));
            e.exit_code()
        }
    };
    std::process::exit(if code == exit::OK { 0 } else { code });
}

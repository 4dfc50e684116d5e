//! CLI entry: parse arguments, hand the command to `cli::dispatch`, map failures to exit
//! codes.

use clap::Parser;

use bench::cli::Cli;
use bench::exit::bench as exit;

fn main() {
    // Rust ignores SIGPIPE, so a message written to a closed pipe (`bench ... 2>&1 | head`
    // once head has exited) fails, and `eprintln!` panics on it (exit 101 with a
    // backtrace). Nobody is left to read a message then: the process ends as SIGPIPE would
    // have ended it, with 141. Finished cells are already saved; workers die with bench.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(exit::BROKEN_PIPE);
        }
        default(info)
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` into a pipe whose reader is gone end with 141, as every
        // other output does (clap's own printing ignored the closed pipe and exited 0). A
        // terminal gets clap's colours; usage errors go to stderr with exit 2 as before.
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) && !std::io::IsTerminal::is_terminal(&std::io::stdout()) =>
        {
            let _ = bench::exit::write_stdout(&e.to_string());
            std::process::exit(0);
        }
        Err(e) => e.exit(),
    };
    let code = match bench::cli::dispatch(cli) {
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

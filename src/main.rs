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

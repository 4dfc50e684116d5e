//! Exit codes: the one table of what the status of each of our processes means.
//!
//! Two processes report through exit codes and they answer different questions, so they
//! have two namespaces here rather than one list: [`bench`] is what CI sees from the `bench`
//! command (did the gate pass), [`worker`] is what the runner sees from one worker process
//! (why a cell failed, which decides skip, retry or fail). The numbers differ on purpose
//! and both are documented contracts (README, docs/runner.md): a worker's 1 is a crash, the
//! command's 1 is a failed gate. Keeping both here means neither can drift unnoticed.

/// Writes `text` to standard output and flushes it. A reader that went away (`bench history
/// CELL | head -c 10`) ends bench with [`bench::BROKEN_PIPE`], as SIGPIPE would end a
/// program and as a failed `println!` does (the panic hook in `main.rs`): a command whose
/// output was cut must not report success. Any other write error is returned.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    or_broken_pipe(out.write_all(text.as_bytes()).and_then(|_| out.flush()))
}

/// What a write to standard output gave, with a closed pipe ending bench with
/// [`bench::BROKEN_PIPE`] (as [`write_stdout`]); for the commands that stream their output
/// through a buffer of their own (`bench matrix --dry-run`'s million lines). Every command
/// treats a closed pipe one way, the way the reference's exit-code table says.
pub fn or_broken_pipe(written: std::io::Result<()>) -> std::io::Result<()> {
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(bench::BROKEN_PIPE)
        }
        other => other,
    }
}

/// Exit codes of the `bench` command (documented in the README and in `bench --help`).
pub mod bench {
    pub const OK: i32 = 0;
    /// Regressions, failed or timed-out cells.
    pub(crate) const FAILED: i32 = 1;
    /// Bad input: matrix, filter, baseline file, arguments.
    pub(crate) const BAD_INPUT: i32 = 2;
    /// An internal failure of bench itself (I/O, a bug).
    pub(crate) const INTERNAL: i32 = 3;
    /// Interrupted by Ctrl-C (128 + SIGINT, as shells report it).
    pub(crate) const INTERRUPTED: i32 = 130;
    /// The reader of standard error or output went away (a closed pipe): 128 + SIGPIPE, as
    /// a shell reports a program that SIGPIPE ended.
    pub const BROKEN_PIPE: i32 = 141;
}

/// Exit codes of `bench worker` (and of any command workload that wants its failures
/// classified), distinct per failure class so the runner can tell an unsupported
/// configuration (a skip) from a crash (an infrastructure failure, retried) from a training
/// failure (out of memory, NaN loss: a failed cell, not retried).
pub mod worker {
    pub(crate) const OK: i32 = 0;
    /// Internal error (a bug or an unexpected libtorch error).
    pub(crate) const INTERNAL: i32 = 1;
    /// Bad arguments or configuration.
    pub const BAD_INPUT: i32 = 2;
    /// The device cannot run this configuration (e.g. fp8 on a GPU without fp8 support).
    pub const UNSUPPORTED: i32 = 3;
    /// Out of device memory.
    pub(crate) const OOM: i32 = 4;
    /// The loss became NaN or infinite.
    pub const NAN_LOSS: i32 = 5;
    /// A collective (NCCL) or rendezvous failure in a multi-rank cell.
    pub const DISTRIBUTED: i32 = 6;
}

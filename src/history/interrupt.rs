//! Ctrl-C and SIGTERM while a history operation blocks: bench exits 130 at once.
//!
//! A history operation can block on something bench does not control: a PostgreSQL server
//! that accepted the connection and never answers, a SQLite file another writer holds. The
//! runner's own signal handling (which stops cells and keeps the finished ones) is not
//! listening then: after a run its handler is still installed but nothing reads it, and
//! `bench history ...` has none. So while a [`Guard`] lives, SIGINT and SIGTERM end the
//! process with exit 130 and one line on stderr; when the last guard is dropped the handlers
//! that were there before come back (the runner's, for a `--confirm` re-run).
//!
//! Exiting in the middle is safe for the store: a write is one transaction, which SQLite
//! rolls back from its journal and PostgreSQL when the connection drops. During a run, the
//! few milliseconds in which a finished cell is written to the store are the one moment a
//! Ctrl-C exits at once instead of stopping the cells in order: the cell is already in the
//! run folder's `results.json`, and the workers die with bench (their parent-death signal).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

use crate::exit::bench as exit;

/// Guards alive and the handlers they replaced (restored when the count returns to 0).
static STATE: Mutex<(usize, Vec<(Signal, SigAction)>)> = Mutex::new((0, Vec::new()));

const SIGNALS: [Signal; 2] = [Signal::SIGINT, Signal::SIGTERM];

/// Set by a command with its own orderly stop (`bench bisect`: remove the worktree, keep the
/// probes): the first signal during a store operation is only counted, for it to read with
/// [`deferred`]; a second one still exits at once, so a store that hangs never traps anyone.
static PATIENT: AtomicBool = AtomicBool::new(false);
/// Signals counted while [`PATIENT`].
static DEFERRED: AtomicUsize = AtomicUsize::new(0);

/// Makes the first SIGINT or SIGTERM during a store operation a counted request to stop
/// instead of an exit (see [`PATIENT`]).
pub(crate) fn defer_first_signal() {
    PATIENT.store(true, Ordering::SeqCst);
}

/// Signals that arrived during store operations and were deferred to the caller.
pub(crate) fn deferred() -> usize {
    DEFERRED.load(Ordering::SeqCst)
}

extern "C" fn on_signal(_: nix::libc::c_int) {
    // Atomics are async-signal-safe.
    if PATIENT.load(Ordering::SeqCst) && DEFERRED.fetch_add(1, Ordering::SeqCst) == 0 {
        return;
    }
    const LINE: &[u8] = b"\nbench: interrupted while waiting for the history store\n";
    // SAFETY: write(2) and _exit(2) are async-signal-safe; nothing else is touched.
    unsafe {
        nix::libc::write(2, LINE.as_ptr().cast(), LINE.len());
        nix::libc::_exit(exit::INTERRUPTED);
    }
}

/// While alive, SIGINT and SIGTERM exit the process with 130 (see the module doc).
pub(crate) struct Guard(());

impl Guard {
    pub(crate) fn new() -> Guard {
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        if state.0 == 0 {
            let action = SigAction::new(
                SigHandler::Handler(on_signal),
                SaFlags::empty(),
                SigSet::empty(),
            );
            for sig in SIGNALS {
                // SAFETY: the handler only makes async-signal-safe calls.
                if let Ok(old) = unsafe { sigaction(sig, &action) } {
                    state.1.push((sig, old));
                }
            }
        }
        state.0 += 1;
        Guard(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            for (sig, old) in std::mem::take(&mut state.1) {
                // SAFETY: restores the exact handler that was installed before.
                let _ = unsafe { sigaction(sig, &old) };
            }
        }
    }
}

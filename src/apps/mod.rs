//! What the commands run, as library code the tests call too: endpoints (a QP with its
//! CQ and one memory region), workloads that check every byte they move, and the
//! commands `demo`, `pingpong` and `stats`.

pub mod demo;
pub mod endpoint;
pub mod exchange;
pub mod perftest;
pub mod pingpong;
pub mod probe;
pub mod progress;
pub mod stats;
pub mod workload;

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes Ctrl-C (SIGINT) and SIGTERM set a flag that the workloads poll, so a command
/// stops between steps and its clean-up (QPs flushed, XDP detached, namespaces removed)
/// runs through the normal drop path.
pub fn catch_interrupts() {
    let h = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, h);
        libc::signal(libc::SIGTERM, h);
    }
}

/// True once Ctrl-C was pressed (after `catch_interrupts`).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

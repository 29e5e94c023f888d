//! The C ABI: roce-xdp as `libibverbs.so.1`, so unmodified verbs programs (rdma-core's
//! tools, perftest, anything written against `<infiniband/verbs.h>`) run on the engine.
//! `roce-xdp run` puts this library in front of the system's; nothing is installed.
//!
//! It is a second front door onto the same runtime and engine as the Rust API
//! ([`crate::runtime`]), not a second implementation: every call converts the C
//! structures to the verbs types and calls the runtime.
//!
//! - Symbols: the public API of rdma-core 44's libibverbs, each in the version node the
//!   programs name (`libibverbs.map`; build.rs and `tools/roce-xdp-cc` apply it),
//!   `ibv_query_gid_type` in IBVERBS_PRIVATE_34 (ibv_devinfo imports it), and stand-ins
//!   for the `mlx5dv_*` and `efadv_*` calls perftest links against (`standin.rs`):
//!   `roce-xdp run` points `libmlx5.so.1` and `libefa.so.1` at this same file, so the
//!   dynamic loader maps it once under all three names.
//! - Structures: generated from the installed headers with bindgen (`sys.rs`). The
//!   objects handed out (`ibv_context`, `ibv_qp`, ...) are the first field of a Rust
//!   struct that holds the runtime's handle, so the inline functions of verbs.h
//!   (`ibv_post_send`, `ibv_poll_cq`, ...) find their function pointers where they
//!   look: in `ibv_context.ops`, in `verbs_context`, in `ibv_qp_ex` and `ibv_cq_ex`.
//! - Errors are what rdma-core returns for the case: NULL with `errno`, or the errno
//!   value. Nothing unwinds across the boundary: a panic is caught ([`guard`]), logged
//!   and turned into an error return.
//! - The engine starts at `ibv_open_device` in the program's process, on AF_XDP when
//!   the process may use it, else on the UDP link (one line on stderr says so), and
//!   stops at `ibv_close_device` or exit.

mod cm;
mod compat;
mod cq;
mod device;
mod mr;
mod qp;
mod rsocket;
mod standin;
mod strings;
pub mod sys;

use std::panic::AssertUnwindSafe;

pub use device::{LIB_ENV_CALLER_ROUNDS, LIB_ENV_LINK, LIB_ENV_PCAP};

/// The runtime device behind a context `ibv_open_device` returned, for programs (and
/// benchmarks) that use both doors on one engine. `None` for a pointer that is not a
/// live context.
///
/// # Safety
/// `ctx` must be NULL or a context from `ibv_open_device` that is not closed.
pub unsafe fn runtime_of(ctx: *mut sys::ibv_context) -> Option<crate::runtime::Device> {
    // SAFETY: the caller's contract.
    unsafe { device::context(ctx) }.map(|c| c.hub.rt.clone())
}

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs one exported call, catching any panic inside it: the panic is logged and the
/// call returns `on_panic` with `errno` EIO, as a provider whose device failed would.
pub(crate) fn guard<R>(call: &'static str, on_panic: R, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            eprintln!("roce-xdp: {call}: internal error ({what}); the call fails with EIO");
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// The errno a verbs error stands for, as rdma-core and rxe return them.
pub(crate) fn errno_of(e: &crate::verbs::Error) -> i32 {
    use crate::verbs::Error as E;
    match e {
        E::QueueFull { .. } => libc::ENOMEM,
        E::Limit { .. } => libc::ENOMEM,
        E::Busy { .. } => libc::EBUSY,
        E::NoNeighbor(_) => libc::EHOSTUNREACH,
        E::NoSuch { .. } => libc::EINVAL,
        _ => libc::EINVAL,
    }
}

/// The errno of a runtime error.
pub(crate) fn errno_of_rt(e: &crate::runtime::RuntimeError) -> i32 {
    use crate::runtime::RuntimeError as R;
    match e {
        R::Verbs(v) => errno_of(v),
        R::Stopped => libc::EIO,
        R::Setup(s) if s.contains("neighbour") || s.contains("ARP") => libc::EHOSTUNREACH,
        R::Setup(_) => libc::EINVAL,
    }
}

/// Starts logging once (the filter from `ROCE_XDP_LOG`, default warnings), to stderr,
/// one plain line per message: `roce-xdp: warning: ...`.
pub(crate) fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("ROCE_XDP_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .event_format(Plain)
            .try_init();
    });
}

/// The log line format of the library: the program's own output stays readable.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        e: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *e.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        write!(w, "roce-xdp: {level}: ")?;
        ctx.field_format().format_fields(w.by_ref(), e)?;
        writeln!(w)
    }
}

/// A NUL-terminated copy of `s` into a fixed C array (truncated to fit).
pub(crate) fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

/// Waits for every event handed to the program about one object to be acknowledged
/// (`ibv_ack_cq_events`, `ibv_ack_async_event`), as rdma-core's destroy calls do.
#[derive(Default)]
pub(crate) struct Acks {
    counts: std::sync::Mutex<(u64, u64)>,
    cv: std::sync::Condvar,
}

impl Acks {
    /// One more event handed out.
    pub(crate) fn reported(&self) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).0 += 1;
    }
    /// `n` more acknowledged.
    pub(crate) fn ack(&self, n: u64) {
        let mut g = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        g.1 += n;
        self.cv.notify_all();
    }
    /// How many were acknowledged.
    pub(crate) fn acked(&self) -> u64 {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).1
    }
    /// Blocks until every event handed out was acknowledged.
    pub(crate) fn wait_all(&self) {
        let mut g = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        while g.1 < g.0 {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

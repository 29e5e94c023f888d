//! What the commands run, as library code the tests call too: endpoints (a QP with its
//! CQ and one memory region), workloads that check every byte they move, and the
//! commands `demo`, `pingpong`, `stats` and `run`.

pub mod bench;
pub mod demo;
pub mod endpoint;
pub mod exchange;
pub mod perftest;
pub mod pingpong;
pub mod probe;
pub mod progress;
pub mod run;
pub mod soak;
pub mod stats;
pub mod workload;

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

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

/// Connects to `host:port`, retrying until `timeout` (the server may not listen yet,
/// as when a script starts both sides); Ctrl-C stops it.
pub fn connect_tcp(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .collect();
    let deadline = Instant::now() + timeout;
    // The server may not listen yet: retry for a while, as a script starting both would
    // want.
    loop {
        let mut last = String::new();
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = format!("Couldn't connect to {host}:{port}: {e}"),
            }
        }
        if Instant::now() > deadline || interrupted() {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Listens on TCP `port` (all IPv4 addresses, as the rdma-core tools) and accepts one
/// client within `timeout`, then stops listening.
pub fn serve_one(port: u16, timeout: Duration) -> Result<TcpStream, String> {
    let l = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("listening on TCP port {port}: {e}"))?;
    accept(&l, timeout)
}

/// Accepts one connection on `l` within `timeout` (Ctrl-C stops it); the stream gets
/// `timeout` as its read timeout.
pub fn accept(l: &TcpListener, timeout: Duration) -> Result<TcpStream, String> {
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(timeout))
                    .map_err(|e| e.to_string())?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("no client within {} s", timeout.as_secs()));
                }
                if interrupted() {
                    return Err("interrupted".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    }
}

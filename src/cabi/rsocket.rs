//! librdmacm's rsockets (`<rdma/rsocket.h>`): sockets over RDMA. Not provided: `rsocket`
//! fails with EAFNOSUPPORT, so no descriptor is ever an rsocket, and the calls on one
//! fail with EBADF, except `rpoll` and `rselect`, which on ordinary descriptors are
//! `poll` and `select` (what librdmacm does for them). They exist because rping,
//! ucmatose and udaddy import `rpoll` (their `-U`-less paths never call it) and the
//! programs are linked BIND_NOW.

use super::set_errno;
use std::ffi::{c_int, c_void};

fn ebadf() -> c_int {
    set_errno(libc::EBADF);
    -1
}

#[unsafe(no_mangle)]
pub extern "C" fn rsocket(_domain: c_int, _type: c_int, _protocol: c_int) -> c_int {
    set_errno(libc::EAFNOSUPPORT);
    -1
}

#[unsafe(no_mangle)]
pub extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the program's array of `nfds` pollfds, as poll(2) takes it.
    unsafe { libc::poll(fds, nfds, timeout) }
}

#[unsafe(no_mangle)]
pub extern "C" fn rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: the program's sets and timeout, as select(2) takes them.
    unsafe { libc::select(nfds, r, w, e, t) }
}

macro_rules! not_an_rsocket {
    ($($name:ident($($arg:ident: $t:ty),*) -> $ret:ty = $val:expr;)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name($(_: $t),*) -> $ret {
                ebadf();
                $val
            }
        )*
    };
}

not_an_rsocket! {
    rbind(s: c_int, a: *const libc::sockaddr, l: libc::socklen_t) -> c_int = -1;
    rlisten(s: c_int, b: c_int) -> c_int = -1;
    raccept(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int = -1;
    rconnect(s: c_int, a: *const libc::sockaddr, l: libc::socklen_t) -> c_int = -1;
    rshutdown(s: c_int, h: c_int) -> c_int = -1;
    rclose(s: c_int) -> c_int = -1;
    rrecv(s: c_int, b: *mut c_void, l: usize, f: c_int) -> isize = -1;
    rrecvfrom(s: c_int, b: *mut c_void, l: usize, f: c_int, a: *mut libc::sockaddr, al: *mut libc::socklen_t) -> isize = -1;
    rrecvmsg(s: c_int, m: *mut libc::msghdr, f: c_int) -> isize = -1;
    rsend(s: c_int, b: *const c_void, l: usize, f: c_int) -> isize = -1;
    rsendto(s: c_int, b: *const c_void, l: usize, f: c_int, a: *const libc::sockaddr, al: libc::socklen_t) -> isize = -1;
    rsendmsg(s: c_int, m: *const libc::msghdr, f: c_int) -> isize = -1;
    rread(s: c_int, b: *mut c_void, l: usize) -> isize = -1;
    rreadv(s: c_int, v: *const libc::iovec, n: c_int) -> isize = -1;
    rwrite(s: c_int, b: *const c_void, l: usize) -> isize = -1;
    rwritev(s: c_int, v: *const libc::iovec, n: c_int) -> isize = -1;
    rgetpeername(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int = -1;
    rgetsockname(s: c_int, a: *mut libc::sockaddr, l: *mut libc::socklen_t) -> c_int = -1;
    rsetsockopt(s: c_int, lv: c_int, o: c_int, v: *const c_void, l: libc::socklen_t) -> c_int = -1;
    rgetsockopt(s: c_int, lv: c_int, o: c_int, v: *mut c_void, l: *mut libc::socklen_t) -> c_int = -1;
    // Variadic in C (`int rfcntl(int, int, ...)`): on the SysV ABI the third argument
    // arrives where a fixed one would, and it is not read anyway.
    rfcntl(s: c_int, c: c_int, a: usize) -> c_int = -1;
    riomap(s: c_int, b: *mut c_void, l: usize, p: c_int, f: c_int, o: libc::off_t) -> libc::off_t = -1;
    riounmap(s: c_int, b: *mut c_void, l: usize) -> c_int = -1;
    riowrite(s: c_int, b: *const c_void, l: usize, o: libc::off_t, f: c_int) -> usize = usize::MAX;
}

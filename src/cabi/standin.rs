//! Stand-ins for the direct-verbs calls perftest links against in rdma-core's mlx5 and
//! EFA providers (`libmlx5.so.1`, `libefa.so.1`, every perftest binary needs both).
//! `roce-xdp run` points those two names at this library, so the stock providers, which
//! need libibverbs' private provider interface, are never loaded. Each call answers as
//! the real one does for a device that is not an mlx5 or an EFA: EOPNOTSUPP. perftest
//! calls none of them on a device of another vendor (measured: ../shared/verbs-abi).

use super::set_errno;
use std::ffi::{c_int, c_void};

fn none<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_open_device(_device: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    none()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_create_qp(
    _context: *mut c_void,
    _qp_attr: *mut c_void,
    _mlx5_qp_attr: *mut c_void,
) -> *mut c_void {
    none()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut c_void) -> *mut c_void {
    none()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_create_mkey(_attr: *mut c_void) -> *mut c_void {
    none()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_devx_general_cmd(
    _context: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_crypto_login(_context: *mut c_void, _attr: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_dek_create(_context: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    none()
}

#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn efadv_query_device(
    _context: *mut c_void,
    _attr: *mut c_void,
    _inlen: u32,
) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn efadv_create_qp_ex(
    _context: *mut c_void,
    _attr_ex: *mut c_void,
    _efa_attr: *mut c_void,
    _inlen: u32,
) -> *mut c_void {
    none()
}

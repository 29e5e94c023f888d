//! The rest of libibverbs' exported API: the kernel-structure copies librdmacm links
//! against, and the calls that need kernel objects roce-xdp does not have (XRC domains,
//! shared PD/MR/DM handles, dma-buf regions), which fail as a provider without the
//! capability fails.

use super::sys::*;
use super::{guard, set_errno};
use std::ffi::c_int;

/// `ibv_copy_ah_attr_from_kern` (rdma-core's marshalling helper, exported for librdmacm).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut ibv_ah_attr, src: *const ib_uverbs_ah_attr) {
    guard("ibv_copy_ah_attr_from_kern", (), || {
        // SAFETY: the caller's two structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        d.grh.dgid = ibv_gid { raw: s.grh.dgid };
        d.grh.flow_label = s.grh.flow_label;
        d.grh.sgid_index = s.grh.sgid_index;
        d.grh.hop_limit = s.grh.hop_limit;
        d.grh.traffic_class = s.grh.traffic_class;
        d.dlid = s.dlid;
        d.sl = s.sl;
        d.src_path_bits = s.src_path_bits;
        d.static_rate = s.static_rate;
        d.is_global = s.is_global;
        d.port_num = s.port_num;
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut ibv_qp_attr, src: *const ib_uverbs_qp_attr) {
    guard("ibv_copy_qp_attr_from_kern", (), || {
        // SAFETY: the caller's two structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        d.cur_qp_state = s.cur_qp_state;
        d.path_mtu = s.path_mtu;
        d.path_mig_state = s.path_mig_state;
        d.qkey = s.qkey;
        d.rq_psn = s.rq_psn;
        d.sq_psn = s.sq_psn;
        d.dest_qp_num = s.dest_qp_num;
        d.qp_access_flags = s.qp_access_flags;
        d.cap = ibv_qp_cap {
            max_send_wr: s.max_send_wr,
            max_recv_wr: s.max_recv_wr,
            max_send_sge: s.max_send_sge,
            max_recv_sge: s.max_recv_sge,
            max_inline_data: s.max_inline_data,
        };
        ibv_copy_ah_attr_from_kern(&mut d.ah_attr, &s.ah_attr);
        ibv_copy_ah_attr_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
        d.pkey_index = s.pkey_index;
        d.alt_pkey_index = s.alt_pkey_index;
        d.en_sqd_async_notify = s.en_sqd_async_notify;
        d.sq_draining = s.sq_draining;
        d.max_rd_atomic = s.max_rd_atomic;
        d.max_dest_rd_atomic = s.max_dest_rd_atomic;
        d.min_rnr_timer = s.min_rnr_timer;
        d.port_num = s.port_num;
        d.timeout = s.timeout;
        d.retry_cnt = s.retry_cnt;
        d.rnr_retry = s.rnr_retry;
        d.alt_port_num = s.alt_port_num;
        d.alt_timeout = s.alt_timeout;
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    guard("ibv_copy_path_rec_from_kern", (), || {
        // SAFETY: the caller's two structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        d.dgid = ibv_gid { raw: s.dgid };
        d.sgid = ibv_gid { raw: s.sgid };
        d.dlid = s.dlid;
        d.slid = s.slid;
        d.raw_traffic = s.raw_traffic as c_int;
        d.flow_label = s.flow_label;
        d.hop_limit = s.hop_limit;
        d.traffic_class = s.traffic_class;
        d.reversible = s.reversible as c_int;
        d.numb_path = s.numb_path;
        d.pkey = s.pkey;
        d.sl = s.sl;
        d.mtu_selector = s.mtu_selector;
        d.mtu = s.mtu as u8;
        d.rate_selector = s.rate_selector;
        d.rate = s.rate;
        d.packet_life_time = s.packet_life_time;
        d.preference = s.preference;
        d.packet_life_time_selector = s.packet_life_time_selector;
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    guard("ibv_copy_path_rec_to_kern", (), || {
        // SAFETY: the caller's two structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        // SAFETY: a GID is 16 plain bytes whichever way the union is read.
        d.dgid = unsafe { s.dgid.raw };
        // SAFETY: as above.
        d.sgid = unsafe { s.sgid.raw };
        d.dlid = s.dlid;
        d.slid = s.slid;
        d.raw_traffic = s.raw_traffic as u32;
        d.flow_label = s.flow_label;
        d.hop_limit = s.hop_limit;
        d.traffic_class = s.traffic_class;
        d.reversible = s.reversible as u32;
        d.numb_path = s.numb_path;
        d.pkey = s.pkey;
        d.sl = s.sl;
        d.mtu_selector = s.mtu_selector;
        d.mtu = u32::from(s.mtu);
        d.rate_selector = s.rate_selector;
        d.rate = s.rate;
        d.packet_life_time = s.packet_life_time;
        d.preference = s.preference;
        d.packet_life_time_selector = s.packet_life_time_selector;
    })
}

/// `verbs_context.close_xrcd`: XRC domains cannot be opened here, so there is none to
/// close; the inline calls this slot without checking it, so it must exist.
pub(crate) unsafe extern "C" fn close_xrcd(_xrcd: *mut ibv_xrcd) -> c_int {
    libc::EOPNOTSUPP
}

// Sharing objects between processes needs the kernel's object handles (a command FD
// passed to another process): roce-xdp's objects live in one process.

#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_pd(_context: *mut ibv_context, _pd_handle: u32) -> *mut ibv_pd {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_pd(_pd: *mut ibv_pd) {}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_mr(_pd: *mut ibv_pd, _mr_handle: u32) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_mr(_mr: *mut ibv_mr) {}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_import_dm(_context: *mut ibv_context, _dm_handle: u32) -> *mut ibv_dm {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_unimport_dm(_dm: *mut ibv_dm) {}

/// dma-buf regions are device memory of another driver (a GPU's): the engine can only
/// reach memory mapped into the process.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

//! Queue pairs and shared receive queues: creation, `ibv_modify_qp` / `ibv_query_qp`,
//! posting (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` through
//! `ibv_context.ops`), and the extended QP's work request API (`ibv_wr_start`,
//! `ibv_wr_rdma_write`, `ibv_wr_set_sge`, ..., `ibv_wr_complete`).
//!
//! Posting converts each `ibv_send_wr` into the engine's `SendWr` on the stack and
//! hands it to the runtime's ring: no allocation, no system call unless the engine
//! thread sleeps. Errors are rxe's: EINVAL for a bad WR or a QP in the wrong state,
//! ENOMEM when the queue is full, with `*bad_wr` at the first WR not posted.

use super::cq::cq;
use super::device::{AsyncEv, Context, Hub, context, forget_events};
use super::mr::{ah, av_of, mr, mw, pd};
use super::sys::*;
use super::{Acks, errno_of, errno_of_rt, guard, set_errno};
use crate::verbs::wr::{InlineData, MAX_INLINE, MAX_SGE};
use crate::verbs::{
    AccessFlags, Mtu, MwBind, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    SendFlags, SendWr, SgList, Sge, UdDest, WrOpcode,
};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A QP: `ibv_qp_ex` first (with the `ibv_qp` programs get at its start), then ours.
/// The C part is in an `UnsafeCell`: `ibv_modify_qp` updates its `state`, and the
/// extended API reads `wr_id` and `wr_flags` the program wrote.
#[repr(C)]
pub(crate) struct Qp {
    pub ex: UnsafeCell<ibv_qp_ex>,
    pub rt: crate::runtime::Qp,
    pub hub: Arc<Hub>,
    /// Asynchronous events (QP errors, COMM_EST, ...) handed out and acknowledged.
    pub acks: Acks,
    sq_sig_all: bool,
    /// Created by `ibv_create_qp_ex`: `ibv_qp_to_qp_ex` answers for it.
    extended: bool,
    /// The extended API's WRs between `wr_start` and `wr_complete`.
    batch: UnsafeCell<Batch>,
    building: AtomicBool,
}

#[derive(Default)]
struct Batch {
    wrs: Vec<SendWr>,
    err: c_int,
}

/// # Safety
/// `q` is NULL or an `ibv_qp` from `ibv_create_qp*`, not yet destroyed.
pub(crate) unsafe fn qp<'a>(q: *mut ibv_qp) -> Option<&'a Qp> {
    // SAFETY: the caller's contract; `ex` (starting with the `ibv_qp`) is the first
    // field of the repr(C) `Qp`.
    (!q.is_null()).then(|| unsafe { &*(q as *const Qp) })
}

fn qp_type_of(t: ibv_qp_type) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        // Types a provider may lack: XRC, raw packet, driver-specific.
        IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV | IBV_QPT_RAW_PACKET | IBV_QPT_DRIVER => {
            Err(libc::EOPNOTSUPP)
        }
        _ => Err(libc::EINVAL),
    }
}

fn state_of(s: ibv_qp_state) -> Result<QpState, c_int> {
    Ok(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Err,
        _ => return Err(libc::EINVAL),
    })
}

/// Creates a QP from the common part of both init structures.
#[allow(clippy::too_many_arguments)]
fn create(
    c: &Context,
    context_: *mut ibv_context,
    p: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
    extended: bool,
    send_ops: Option<u64>,
) -> Result<*mut ibv_qp, c_int> {
    // SAFETY: the caller's PD (from ibv_alloc_pd).
    let x = unsafe { pd(p) }.ok_or(libc::EINVAL)?;
    if !Arc::ptr_eq(&x.hub, &c.hub) {
        return Err(libc::EINVAL);
    }
    let qp_type = qp_type_of(a.qp_type)?;
    // SAFETY: the caller's CQs and SRQ (from ibv_create_cq* / ibv_create_srq*).
    let (scq, rcq) = unsafe { (cq(a.send_cq), cq(a.recv_cq)) };
    let (Some(scq), Some(rcq)) = (scq, rcq) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: as above.
    let srq = if a.srq.is_null() {
        None
    } else {
        Some(unsafe { srq(a.srq) }.ok_or(libc::EINVAL)?)
    };
    // Objects of another device name another engine's tables.
    if !Arc::ptr_eq(&scq.hub, &c.hub)
        || !Arc::ptr_eq(&rcq.hub, &c.hub)
        || srq.is_some_and(|s| !Arc::ptr_eq(&s.hub, &c.hub))
    {
        return Err(libc::EINVAL);
    }
    let l = c.hub.rt.info().limits;
    if a.cap.max_inline_data > l.max_inline_data {
        return Err(libc::EINVAL);
    }
    // As rxe sizes a WQE: room for the SGEs doubles as inline room (16 bytes per SGE),
    // so programs that choose inline sends by the capacity reported see what rxe reports.
    let inline = a
        .cap
        .max_inline_data
        .max(16 * a.cap.max_send_sge)
        .min(l.max_inline_data);
    let cap = QpCap {
        max_send_wr: a.cap.max_send_wr.max(1),
        max_recv_wr: if srq.is_some() { 0 } else { a.cap.max_recv_wr },
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { a.cap.max_recv_sge },
        max_inline_data: inline,
    };
    let init = QpInitAttr {
        qp_type,
        pd: x.id,
        send_cq: scq.rt.id,
        recv_cq: rcq.rt.id,
        srq: srq.map(|s| s.rt.id),
        cap,
        sq_sig_all: a.sq_sig_all != 0,
    };
    let rt = c.hub.rt.create_qp(&init).map_err(|e| errno_of_rt(&e))?;
    a.cap = ibv_qp_cap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let qpn = rt.qpn;
    let mut ex = ibv_qp_ex {
        qp_base: ibv_qp {
            context: context_,
            qp_context: a.qp_context,
            pd: p,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qpn,
            qp_num: qpn,
            state: IBV_QPS_RESET,
            qp_type: a.qp_type,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut batch = Batch::default();
    if let Some(ops) = send_ops {
        set_send_ops(&mut ex, ops);
        batch.wrs = Vec::with_capacity(cap.max_send_wr as usize);
    }
    let q = Box::into_raw(Box::new(Qp {
        ex: UnsafeCell::new(ex),
        rt,
        hub: c.hub.clone(),
        acks: Acks::default(),
        sq_sig_all: a.sq_sig_all != 0,
        extended,
        batch: UnsafeCell::new(batch),
        building: AtomicBool::new(false),
    }));
    // SAFETY: our new box: initialise the pthread objects programs may look at.
    unsafe {
        let b = std::ptr::addr_of_mut!((*(*q).ex.get()).qp_base);
        libc::pthread_mutex_init(std::ptr::addr_of_mut!((*b).mutex).cast(), std::ptr::null());
        libc::pthread_cond_init(std::ptr::addr_of_mut!((*b).cond).cast(), std::ptr::null());
    }
    c.hub
        .routes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .qps
        .insert(qpn, (c.asyncq.clone(), q as usize));
    Ok(q.cast())
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(ctxp) = (unsafe { pd(p) }).map(|x| x.ibv.context) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: the PD's context, live while it has objects.
        let Some(c) = (unsafe { context(ctxp) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes, written back with the capacities granted.
        let a = unsafe { &mut *attr };
        match create(c, ctxp, p, a, false, None) {
            Ok(q) => q,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// The send opcodes rxe's extended QPs offer per transport (RXE_SUP_*_QP_SEND_OPS_FLAGS,
/// without the atomic write and, for UC, SEND_WITH_INV, which the engine refuses there).
fn supported_send_ops(t: QpType) -> u64 {
    let rc = IBV_QP_EX_WITH_RDMA_WRITE
        | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | IBV_QP_EX_WITH_SEND
        | IBV_QP_EX_WITH_SEND_WITH_IMM
        | IBV_QP_EX_WITH_RDMA_READ
        | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | IBV_QP_EX_WITH_LOCAL_INV
        | IBV_QP_EX_WITH_BIND_MW
        | IBV_QP_EX_WITH_SEND_WITH_INV;
    let uc = IBV_QP_EX_WITH_RDMA_WRITE
        | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
        | IBV_QP_EX_WITH_SEND
        | IBV_QP_EX_WITH_SEND_WITH_IMM
        | IBV_QP_EX_WITH_LOCAL_INV
        | IBV_QP_EX_WITH_BIND_MW;
    let ud = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    u64::from(match t {
        QpType::Rc => rc,
        QpType::Uc => uc,
        QpType::Ud => ud,
    })
}

/// `verbs_context.create_qp_ex`: the inline `ibv_create_qp_ex`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context_: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard("ibv_create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(context_) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        let supported =
            IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let fail = |e| {
            set_errno(e);
            std::ptr::null_mut()
        };
        if a.comp_mask & !supported != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let t = match qp_type_of(a.qp_type) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        if ops.is_some_and(|o| o & !supported_send_ops(t) != 0) {
            return fail(libc::EOPNOTSUPP);
        }
        let mut base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        match create(c, context_, a.pd, &mut base, true, Some(ops.unwrap_or(0))) {
            Ok(q) => {
                a.cap = base.cap;
                q
            }
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_qp_to_qp_ex(q: *mut ibv_qp) -> *mut ibv_qp_ex {
    guard("ibv_qp_to_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: a QP from ibv_create_qp*.
        match unsafe { qp(q) } {
            Some(x) if x.extended => x.ex.get(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// The engine's attributes and mask from `ibv_modify_qp`'s.
fn attr_in(c: &Context, a: &ibv_qp_attr, mask: c_int) -> Result<(QpAttr, QpAttrMask), c_int> {
    const KNOWN: u32 = ((1 << 21) - 1) | IBV_QP_RATE_LIMIT;
    let mask = mask as u32;
    if mask & !KNOWN != 0 {
        return Err(libc::EINVAL);
    }
    let m = QpAttrMask(mask);
    let mut q = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        q.qp_state = state_of(a.qp_state)?;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        q.cur_qp_state = state_of(a.cur_qp_state)?;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        q.path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(Mtu::from_code)
            .ok_or(libc::EINVAL)?;
    }
    if m.contains(QpAttrMask::AV) {
        q.ah_attr = av_of(c, &a.ah_attr)?;
    }
    if m.contains(QpAttrMask::ACCESS_FLAGS) {
        let known = IBV_ACCESS_LOCAL_WRITE
            | IBV_ACCESS_REMOTE_WRITE
            | IBV_ACCESS_REMOTE_READ
            | IBV_ACCESS_REMOTE_ATOMIC
            | IBV_ACCESS_MW_BIND;
        if a.qp_access_flags & !known != 0 {
            return Err(libc::EINVAL);
        }
        q.qp_access_flags = AccessFlags(a.qp_access_flags);
    }
    if m.contains(QpAttrMask::CAP) {
        q.cap = QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    Ok((q, m))
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_modify_qp(q: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int {
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp*.
        let Some(x) = (unsafe { qp(q) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the QP's context, live while it has objects.
        let Some(c) = (unsafe { context((*x.ex.get()).qp_base.context) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attributes.
        let (a, m) = match attr_in(c, unsafe { &*attr }, attr_mask) {
            Ok(v) => v,
            Err(e) => return e,
        };
        if let Err(e) = x.hub.rt.modify_qp(&x.rt, &a, m) {
            tracing::warn!("ibv_modify_qp on QP 0x{:06x}: {e}", x.rt.qpn);
            return errno_of_rt(&e);
        }
        if m.contains(QpAttrMask::STATE) {
            // SAFETY: the QP's C part, in its UnsafeCell (rdma-core updates it here too);
            // written through a raw pointer, no reference to the whole is made.
            unsafe { std::ptr::addr_of_mut!((*x.ex.get()).qp_base.state).write(a.qp_state as u32) };
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("ibv_query_qp", libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp*.
        let Some(x) = (unsafe { qp(q) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let a = match x.hub.rt.query_qp(&x.rt) {
            Ok(a) => a,
            Err(e) => return errno_of_rt(&e),
        };
        let cap = x.rt.cap();
        let c_cap = ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        let out = ibv_qp_attr {
            qp_state: a.qp_state as u32,
            cur_qp_state: a.cur_qp_state as u32,
            path_mtu: a.path_mtu as u32,
            path_mig_state: IBV_MIG_MIGRATED,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags.bits(),
            cap: c_cap,
            ah_attr: super::mr::ah_attr_of(&a.ah_attr),
            pkey_index: a.pkey_index,
            en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
            sq_draining: u8::from(a.sq_draining),
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: 1,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            ..Default::default()
        };
        // The QP's C part through raw pointers only: other threads read it meanwhile
        // (posting), and only `state` is written.
        // SAFETY: a place expression on our live QP; no reference is created.
        let b = unsafe { std::ptr::addr_of_mut!((*x.ex.get()).qp_base) };
        // SAFETY: the fields read are set at creation and never change; the caller
        // gives room for both structures.
        unsafe {
            *attr = out;
            *init_attr = ibv_qp_init_attr {
                qp_context: (*b).qp_context,
                send_cq: (*b).send_cq,
                recv_cq: (*b).recv_cq,
                srq: (*b).srq,
                cap: c_cap,
                qp_type: (*b).qp_type,
                sq_sig_all: c_int::from(x.sq_sig_all),
            };
            if attr_mask & IBV_QP_STATE as c_int != 0 {
                std::ptr::addr_of_mut!((*b).state).write(a.qp_state as u32);
            }
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    guard("ibv_destroy_qp", libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp*.
        let Some(x) = (unsafe { qp(q) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = x.hub.rt.destroy_qp(x.rt.clone()) {
            return errno_of_rt(&e);
        }
        x.hub
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .qps
            .remove(&x.rt.qpn);
        // SAFETY: the QP's context, live while it has objects.
        unsafe { forget_events((*x.ex.get()).qp_base.context, q as usize) };
        x.acks.wait_all();
        // SAFETY: the box create() leaked, freed once now.
        drop(unsafe { Box::from_raw(q as *mut Qp) });
        0
    })
}

// ---------------------------------------------------------------------------------
// Posting.

/// The engine's form of one `ibv_send_wr` (the list's `next` is not followed here).
///
/// # Safety
/// `w`'s pointers (SG list, inline data, AH, MW, MR) are the program's, valid as
/// `ibv_post_send` requires.
unsafe fn send_wr_in(w: &ibv_send_wr, qp_type: QpType) -> Result<SendWr, c_int> {
    let opcode = match w.opcode {
        IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        IBV_WR_SEND => WrOpcode::Send,
        IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp,
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd,
        IBV_WR_LOCAL_INV => WrOpcode::LocalInv,
        IBV_WR_BIND_MW => WrOpcode::BindMw,
        IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        _ => return Err(libc::EINVAL),
    };
    let flags = w.send_flags & !IBV_SEND_IP_CSUM;
    let known = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;
    if flags & !known != 0 {
        return Err(libc::EINVAL);
    }
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let sges: &[ibv_sge] = if n == 0 {
        &[]
    } else {
        // SAFETY: the program's SG list of `num_sge` entries.
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    let mut list = [Sge::default(); MAX_SGE];
    for (d, s) in list.iter_mut().zip(sges) {
        *d = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    let mut wr = SendWr::send(w.wr_id, &list[..n]).with_opcode(opcode);
    wr.send_flags = SendFlags(flags);
    if flags & IBV_SEND_INLINE != 0 {
        // The data is copied now, from the program's buffers; their keys do not matter.
        let mut buf = [0u8; MAX_INLINE];
        let mut len = 0usize;
        for s in sges {
            let l = s.length as usize;
            if len + l > MAX_INLINE {
                return Err(libc::EINVAL);
            }
            if l > 0 {
                // SAFETY: the program's inline buffer of `length` bytes at `addr`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.addr as usize as *const u8,
                        buf.as_mut_ptr().add(len),
                        l,
                    )
                };
            }
            len += l;
        }
        wr.inline = InlineData::new(&buf[..len]);
    }
    // SAFETY: reading the unions by the opcode that selects them.
    unsafe {
        match opcode {
            WrOpcode::RdmaWriteWithImm | WrOpcode::SendWithImm => {
                wr.imm_data = u32::from_be(w.__bindgen_anon_1.imm_data)
            }
            WrOpcode::SendWithInv | WrOpcode::LocalInv => {
                wr.invalidate_rkey = w.__bindgen_anon_1.invalidate_rkey
            }
            _ => {}
        }
        match opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                wr.remote_addr = w.wr.rdma.remote_addr;
                wr.rkey = w.wr.rdma.rkey;
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                wr.remote_addr = w.wr.atomic.remote_addr;
                wr.rkey = w.wr.atomic.rkey;
                wr.compare_add = w.wr.atomic.compare_add;
                wr.swap = w.wr.atomic.swap;
            }
            WrOpcode::BindMw => {
                let b = &w.__bindgen_anon_2.bind_mw;
                let window = mw(b.mw).ok_or(libc::EINVAL)?;
                let region = mr(b.bind_info.mr).ok_or(libc::EINVAL)?;
                let acc = b.bind_info.mw_access_flags;
                let known =
                    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
                if acc & !known != 0 {
                    return Err(libc::EINVAL);
                }
                wr.bind = Some(MwBind {
                    mw: window.mw.handle,
                    rkey: b.rkey,
                    lkey: region.info().lkey,
                    addr: b.bind_info.addr,
                    length: b.bind_info.length,
                    access: AccessFlags(acc),
                });
            }
            _ => {}
        }
        if qp_type == QpType::Ud {
            let a = ah(w.wr.ud.ah).ok_or(libc::EINVAL)?;
            wr.ud = Some(UdDest {
                ah: a.av,
                remote_qpn: w.wr.ud.remote_qpn,
                remote_qkey: w.wr.ud.remote_qkey,
            });
        }
    }
    Ok(wr)
}

/// A receive WR in the engine's form.
///
/// # Safety
/// `w.sg_list` holds `num_sge` entries.
unsafe fn recv_wr_in(w: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut list = [Sge::default(); MAX_SGE];
    if n > 0 {
        // SAFETY: the program's SG list of `num_sge` entries.
        let s = unsafe { std::slice::from_raw_parts(w.sg_list, n) };
        for (d, s) in list.iter_mut().zip(s) {
            *d = Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            };
        }
    }
    Ok(RecvWr {
        wr_id: w.wr_id,
        sg_list: SgList::new(&list[..n]).ok_or(libc::EINVAL)?,
    })
}

/// A work request of a program's linked list (`ibv_send_wr`, `ibv_recv_wr`).
trait Linked {
    fn next_wr(&self) -> *mut Self;
}
impl Linked for ibv_send_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}
impl Linked for ibv_recv_wr {
    fn next_wr(&self) -> *mut Self {
        self.next
    }
}

/// Posts a program's list of WRs in order with `post`, stopping at the first it
/// refuses: that one goes to `*bad_wr` (when given) and its errno is returned, as
/// rdma-core's providers do; the WRs before it stay posted.
///
/// # Safety
/// `wr` is NULL or the head of a list of valid WRs; `bad_wr` is NULL or writable.
#[inline]
unsafe fn post_list<W: Linked>(
    wr: *mut W,
    bad_wr: *mut *mut W,
    mut post: impl FnMut(&W) -> Result<(), c_int>,
) -> c_int {
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: the caller's list: `w` is one of its WRs.
        let x = unsafe { &*w };
        if let Err(e) = post(x) {
            if !bad_wr.is_null() {
                // SAFETY: the caller's out-pointer.
                unsafe { *bad_wr = w };
            }
            return e;
        }
        w = x.next_wr();
    }
    0
}

/// `ibv_context.ops.post_send`: the inline `ibv_post_send`.
pub(crate) unsafe extern "C" fn post_send(
    q: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard("ibv_post_send", libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp*.
        let Some(x) = (unsafe { qp(q) }) else {
            return libc::EINVAL;
        };
        let t = x.rt.qp_type();
        let post = |w: &ibv_send_wr| {
            // SAFETY: a WR of the program's list (its SG list holds num_sge entries).
            let s = unsafe { send_wr_in(w, t) }?;
            x.rt.post_send(&s).map_err(|e| errno_of(&e))
        };
        // SAFETY: the program's WR list and out-pointer, valid for the call.
        unsafe { post_list(wr, bad_wr, post) }
    })
}

/// `ibv_context.ops.post_recv`: the inline `ibv_post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    q: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_recv", libc::EIO, || {
        // SAFETY: a QP from ibv_create_qp*.
        let Some(x) = (unsafe { qp(q) }) else {
            return libc::EINVAL;
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: a WR of the program's list (its SG list holds num_sge entries).
            let r = unsafe { recv_wr_in(w) }?;
            x.rt.post_recv(&r).map_err(|e| errno_of(&e))
        };
        // SAFETY: the program's WR list and out-pointer, valid for the call.
        unsafe { post_list(wr, bad_wr, post) }
    })
}

// ---------------------------------------------------------------------------------
// The extended QP's work request API (ibv_wr_*).

fn set_send_ops(ex: &mut ibv_qp_ex, ops: u64) {
    let has = |b: u32| ops & u64::from(b) != 0;
    if has(IBV_QP_EX_WITH_RDMA_WRITE) {
        ex.wr_rdma_write = Some(wr_rdma_write);
    }
    if has(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if has(IBV_QP_EX_WITH_SEND) {
        ex.wr_send = Some(wr_send);
    }
    if has(IBV_QP_EX_WITH_SEND_WITH_IMM) {
        ex.wr_send_imm = Some(wr_send_imm);
    }
    if has(IBV_QP_EX_WITH_SEND_WITH_INV) {
        ex.wr_send_inv = Some(wr_send_inv);
    }
    if has(IBV_QP_EX_WITH_RDMA_READ) {
        ex.wr_rdma_read = Some(wr_rdma_read);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if has(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    if has(IBV_QP_EX_WITH_LOCAL_INV) {
        ex.wr_local_inv = Some(wr_local_inv);
    }
    if has(IBV_QP_EX_WITH_BIND_MW) {
        ex.wr_bind_mw = Some(wr_bind_mw);
    }
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
}

/// The QP and its batch, for a `ibv_wr_*` call between `wr_start` and `wr_complete`.
///
/// # Safety
/// `q` is an extended QP whose caller holds `building` (after `wr_start`).
unsafe fn building<'a>(q: *mut ibv_qp_ex) -> (&'a Qp, &'a mut Batch) {
    // SAFETY: the caller's contract; the batch is ours while `building` is held.
    unsafe {
        let x = &*(q as *const Qp);
        (x, &mut *x.batch.get())
    }
}

/// Starts the next WR of the batch with the QP's `wr_id` and `wr_flags`.
fn begin(q: *mut ibv_qp_ex, opcode: WrOpcode, f: impl FnOnce(&mut SendWr)) {
    guard("ibv_wr_*", (), || {
        // SAFETY: an extended QP inside wr_start/wr_complete.
        let (x, b) = unsafe { building(q) };
        if b.wrs.len() >= b.wrs.capacity() {
            b.err = libc::ENOMEM;
            return;
        }
        // SAFETY: the QP's C part; the program wrote wr_id and wr_flags before the call.
        let (id, flags) = unsafe { ((*x.ex.get()).wr_id, (*x.ex.get()).wr_flags) };
        let mut wr = SendWr::send(id, &[]).with_opcode(opcode);
        wr.send_flags = SendFlags(flags & !IBV_SEND_IP_CSUM);
        f(&mut wr);
        b.wrs.push(wr);
    })
}

/// Changes the batch's last WR (EINVAL if there is none).
fn last(q: *mut ibv_qp_ex, f: impl FnOnce(&mut SendWr) -> Result<(), c_int>) {
    guard("ibv_wr_set_*", (), || {
        // SAFETY: an extended QP inside wr_start/wr_complete.
        let (_, b) = unsafe { building(q) };
        let r = match b.wrs.last_mut() {
            Some(w) => f(w),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r
            && b.err == 0
        {
            b.err = e;
        }
    })
}

unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    guard("ibv_wr_start", (), || {
        // SAFETY: an extended QP from ibv_create_qp_ex.
        let x = unsafe { &*(q as *const Qp) };
        while x
            .building
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: we hold `building`.
        let (_, b) = unsafe { building(q) };
        b.wrs.clear();
        b.err = 0;
    })
}

unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    guard("ibv_wr_complete", libc::EIO, || {
        // SAFETY: an extended QP after wr_start.
        let (x, b) = unsafe { building(q) };
        let mut r = b.err;
        // All or nothing, as rxe's wr_complete: every WR is checked first, and the batch
        // goes only if the queue has room for all of it.
        if r == 0
            && let Some(e) = b.wrs.iter().find_map(|w| x.rt.check_send(w).err())
        {
            r = errno_of(&e);
        }
        if r == 0 && b.wrs.len() as u64 > x.rt.send_room() {
            r = libc::ENOMEM;
        }
        if r == 0 {
            for w in &b.wrs {
                if let Err(e) = x.rt.post_send(w) {
                    r = errno_of(&e);
                    break;
                }
            }
        }
        b.wrs.clear();
        b.err = 0;
        x.building.store(false, Ordering::Release);
        r
    })
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    guard("ibv_wr_abort", (), || {
        // SAFETY: an extended QP after wr_start.
        let (x, b) = unsafe { building(q) };
        b.wrs.clear();
        b.err = 0;
        x.building.store(false, Ordering::Release);
    })
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(q, WrOpcode::RdmaWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_rdma_write_imm(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm: __be32,
) {
    begin(q, WrOpcode::RdmaWriteWithImm, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.imm_data = u32::from_be(imm);
    })
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    begin(q, WrOpcode::RdmaRead, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
    })
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    begin(q, WrOpcode::Send, |_| {})
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: __be32) {
    begin(q, WrOpcode::SendWithImm, |w| w.imm_data = u32::from_be(imm))
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, rkey: u32) {
    begin(q, WrOpcode::SendWithInv, |w| w.invalidate_rkey = rkey)
}

unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, rkey: u32) {
    begin(q, WrOpcode::LocalInv, |w| w.invalidate_rkey = rkey)
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    begin(q, WrOpcode::AtomicCmpAndSwp, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = compare;
        w.swap = swap;
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    begin(q, WrOpcode::AtomicFetchAndAdd, |w| {
        w.rkey = rkey;
        w.remote_addr = remote_addr;
        w.compare_add = add;
    })
}

unsafe extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex,
    window: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: the program's window and bind information.
    let bind = unsafe {
        match (mw(window), info.as_ref()) {
            (Some(m), Some(i)) => mr(i.mr).map(|r| MwBind {
                mw: m.mw.handle,
                rkey,
                lkey: r.info().lkey,
                addr: i.addr,
                length: i.length,
                access: AccessFlags(i.mw_access_flags),
            }),
            _ => None,
        }
    };
    begin(q, WrOpcode::BindMw, |w| w.bind = bind);
    if bind.is_none() {
        last(q, |_| Err(libc::EINVAL));
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    q: *mut ibv_qp_ex,
    a: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    last(q, |w| {
        // SAFETY: the program's address handle.
        let a = unsafe { ah(a) }.ok_or(libc::EINVAL)?;
        w.ud = Some(UdDest {
            ah: a.av,
            remote_qpn,
            remote_qkey,
        });
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(q, |w| {
        w.sg_list = SgList::new(&[Sge { addr, length, lkey }]).ok_or(libc::EINVAL)?;
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last(q, |w| {
        if n > MAX_SGE || (n > 0 && list.is_null()) {
            return Err(libc::EINVAL);
        }
        let mut v = [Sge::default(); MAX_SGE];
        if n > 0 {
            // SAFETY: the program's `n` SGEs.
            for (d, s) in v
                .iter_mut()
                .zip(unsafe { std::slice::from_raw_parts(list, n) })
            {
                *d = Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                };
            }
        }
        w.sg_list = SgList::new(&v[..n]).ok_or(libc::EINVAL)?;
        Ok(())
    })
}

/// Copies inline data out of the program's buffers into the last WR.
fn set_inline(w: &mut SendWr, bufs: &[(usize, usize)]) -> Result<(), c_int> {
    let mut buf = [0u8; MAX_INLINE];
    let mut len = 0;
    for &(addr, l) in bufs {
        if len + l > MAX_INLINE {
            return Err(libc::EINVAL);
        }
        if l > 0 {
            // SAFETY: the program's inline buffer of `l` bytes at `addr`.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr().add(len), l)
            };
        }
        len += l;
    }
    w.inline = InlineData::new(&buf[..len]);
    w.send_flags |= SendFlags::INLINE;
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    last(q, |w| set_inline(w, &[(addr as usize, length)]))
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    last(q, |w| {
        if n > MAX_SGE || (n > 0 && list.is_null()) {
            return Err(libc::EINVAL);
        }
        let mut v = [(0usize, 0usize); MAX_SGE];
        if n > 0 {
            // SAFETY: the program's `n` buffers.
            for (d, s) in v
                .iter_mut()
                .zip(unsafe { std::slice::from_raw_parts(list, n) })
            {
                *d = (s.addr as usize, s.length);
            }
        }
        set_inline(w, &v[..n])
    })
}

// ---------------------------------------------------------------------------------
// Shared receive queues.

/// An SRQ. The C part is in an `UnsafeCell` like the other objects' (nothing changes
/// it after creation but the program's own fields).
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: UnsafeCell<ibv_srq>,
    pub rt: crate::runtime::Srq,
    pub hub: Arc<Hub>,
    pub acks: Acks,
}

/// # Safety
/// `s` is NULL or an `ibv_srq` from `ibv_create_srq*`, not yet destroyed.
pub(crate) unsafe fn srq<'a>(s: *mut ibv_srq) -> Option<&'a Srq> {
    // SAFETY: the caller's contract; `ibv` is the first field of the repr(C) `Srq`.
    (!s.is_null()).then(|| unsafe { &*(s as *const Srq) })
}

fn create_srq_in(
    c: &Context,
    p: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
) -> Result<*mut ibv_srq, c_int> {
    // SAFETY: the caller's PD.
    let x = unsafe { pd(p) }.ok_or(libc::EINVAL)?;
    let l = c.hub.rt.info().limits;
    if attr.max_wr == 0 || attr.max_wr > l.max_srq_wr || attr.max_sge > l.max_srq_sge {
        return Err(libc::EINVAL);
    }
    let rt = c
        .hub
        .rt
        .create_srq(x.id, attr.max_wr, attr.max_sge)
        .map_err(|e| errno_of_rt(&e))?;
    if attr.srq_limit > 0
        && let Err(e) = c.hub.rt.modify_srq(&rt, None, Some(attr.srq_limit))
    {
        let _ = c.hub.rt.destroy_srq(&rt);
        return Err(errno_of_rt(&e));
    }
    let id = rt.id;
    let s = Box::into_raw(Box::new(Srq {
        ibv: UnsafeCell::new(ibv_srq {
            context: x.ibv.context,
            srq_context,
            pd: p,
            handle: id,
            ..Default::default()
        }),
        rt,
        hub: c.hub.clone(),
        acks: Acks::default(),
    }));
    // SAFETY: our new box: initialise the pthread objects programs may look at.
    unsafe {
        let b = (*s).ibv.get();
        libc::pthread_mutex_init(std::ptr::addr_of_mut!((*b).mutex).cast(), std::ptr::null());
        libc::pthread_cond_init(std::ptr::addr_of_mut!((*b).cond).cast(), std::ptr::null());
    }
    c.hub
        .routes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .srqs
        .insert(id, (c.asyncq.clone(), s as usize));
    Ok(s.cast())
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_srq(p: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    guard("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: a PD and its live context.
        let Some(c) = (unsafe { pd(p) }).and_then(|x| unsafe { context(x.ibv.context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        match create_srq_in(c, p, a.srq_context, &mut a.attr) {
            Ok(s) => s,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// `verbs_context.create_srq_ex`: basic SRQs (no XRC, no tag matching).
pub(crate) unsafe extern "C" fn create_srq_ex(
    context_: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    guard("ibv_create_srq_ex", std::ptr::null_mut(), || {
        // SAFETY: a live context.
        let Some(c) = (unsafe { context(context_) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        let fail = |e| {
            set_errno(e);
            std::ptr::null_mut()
        };
        if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 {
            return fail(libc::EINVAL);
        }
        if a.comp_mask & !(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) != 0
            || (a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC)
        {
            return fail(libc::EOPNOTSUPP);
        }
        match create_srq_in(c, a.pd, a.srq_context, &mut a.attr) {
            Ok(s) => s,
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_modify_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    guard("ibv_modify_srq", libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq*.
        let Some(x) = (unsafe { srq(s) }) else {
            return libc::EINVAL;
        };
        let mask = mask as u32;
        if attr.is_null() || mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let max_wr = (mask & IBV_SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & IBV_SRQ_LIMIT != 0).then_some(a.srq_limit);
        match x.hub.rt.modify_srq(&x.rt, max_wr, limit) {
            Ok(()) => 0,
            Err(e) => errno_of_rt(&e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("ibv_query_srq", libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq*.
        let Some(x) = (unsafe { srq(s) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match x.hub.rt.query_srq(&x.rt) {
            Ok((max_wr, max_sge, srq_limit)) => {
                // SAFETY: the caller gives room for the attributes.
                unsafe {
                    *attr = ibv_srq_attr {
                        max_wr,
                        max_sge,
                        srq_limit,
                    }
                };
                0
            }
            Err(e) => errno_of_rt(&e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_srq(s: *mut ibv_srq) -> c_int {
    guard("ibv_destroy_srq", libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq*.
        let Some(x) = (unsafe { srq(s) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = x.hub.rt.destroy_srq(&x.rt) {
            return errno_of_rt(&e);
        }
        x.hub
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .srqs
            .remove(&x.rt.id);
        // SAFETY: the SRQ's context, live while it has objects.
        unsafe { forget_events((*x.ibv.get()).context, s as usize) };
        x.acks.wait_all();
        // SAFETY: the box create_srq_in leaked, freed once now.
        drop(unsafe { Box::from_raw(s as *mut Srq) });
        0
    })
}

/// `ibv_context.ops.post_srq_recv`: the inline `ibv_post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: an SRQ from ibv_create_srq*.
        let Some(x) = (unsafe { srq(s) }) else {
            return libc::EINVAL;
        };
        let post = |w: &ibv_recv_wr| {
            // SAFETY: a WR of the program's list (its SG list holds num_sge entries).
            let r = unsafe { recv_wr_in(w) }?;
            x.rt.post_recv(&r).map_err(|e| errno_of(&e))
        };
        // SAFETY: the program's WR list and out-pointer, valid for the call.
        unsafe { post_list(wr, bad_wr, post) }
    })
}

// ---------------------------------------------------------------------------------
// Asynchronous events: who counts an event handed out and its acknowledgement.

fn acks_of(e: AsyncEv) -> Option<&'static Acks> {
    // SAFETY: an event's element is a live object: its destroy takes its queued events
    // out and waits for the acknowledgement of those handed out, before freeing it.
    unsafe {
        match e.kind {
            IBV_EVENT_CQ_ERR => Some(&(*(e.element as *const super::cq::Cq)).async_acks),
            IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => {
                Some(&(*(e.element as *const Srq)).acks)
            }
            IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_PATH_MIG
            | IBV_EVENT_PATH_MIG_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED => Some(&(*(e.element as *const Qp)).acks),
            _ => None,
        }
    }
}

/// An event about an object was handed to the program (`ibv_get_async_event`).
pub(crate) fn async_reported(e: AsyncEv) {
    if let Some(a) = acks_of(e) {
        a.reported();
    }
}

/// The program acknowledged it (`ibv_ack_async_event`).
pub(crate) fn async_acked(e: AsyncEv) {
    if let Some(a) = acks_of(e) {
        a.ack(1);
    }
}

// ---------------------------------------------------------------------------------
// What roce-xdp does not offer, failing as a provider without it does.

/// UD multicast: the engine has no multicast groups (`max_mcast_grp` is 0).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}

/// Enhanced connection establishment: no vendor options to negotiate.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut ibv_ece) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// No guarantee of in-order data placement is given (0), as rdma-core's default.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: ibv_wr_opcode,
    _flags: u32,
) -> c_int {
    0
}

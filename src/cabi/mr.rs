//! Protection domains, memory regions, memory windows and address handles.
//!
//! `ibv_reg_mr` registers the program's own memory where it lies, without copying: the
//! engine reads and writes it in place through the region's keys, bounds and access
//! flags ([`crate::verbs::Memory::borrowed`]). The range must be mapped (and writable
//! for LOCAL_WRITE), as the kernel's pinning requires; `EFAULT` otherwise. Once
//! `ibv_dereg_mr` returns the engine touches the memory no more (work still in flight
//! that names the region then fails, as with rxe); a region with a memory window bound
//! is refused (`EBUSY`), as rdma-core refuses it. (Freeing registered memory *without*
//! deregistering it is a program error rxe survives because it pins the pages; here
//! the engine would then fault on a peer's access.) Memory windows are type 2 only:
//! `ibv_alloc_mw(IBV_MW_TYPE_1)` is EOPNOTSUPP, and `ibv_bind_mw` (type 1's call) is
//! EINVAL; a type 2 window is bound with an IBV_WR_BIND_MW work request.

use super::device::{Context, Hub, context};
use super::sys::*;
use super::{errno_of_rt, guard, set_errno};
use crate::verbs::{AccessFlags, AddressVector, Memory, MrInfo};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

#[repr(C)]
pub(crate) struct Pd {
    pub ibv: ibv_pd,
    pub id: u32,
    pub hub: Arc<Hub>,
}

/// The `Pd` behind a `ibv_pd` we handed out.
///
/// # Safety
/// `p` is NULL or an `ibv_pd` from `ibv_alloc_pd`, not yet deallocated.
pub(crate) unsafe fn pd<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
    // SAFETY: the caller's contract; `ibv` is the first field of the repr(C) `Pd`.
    (!p.is_null()).then(|| unsafe { &*(p as *const Pd) })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_alloc_pd(context_: *mut ibv_context) -> *mut ibv_pd {
    guard("ibv_alloc_pd", std::ptr::null_mut(), || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(context_) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match c.hub.rt.alloc_pd() {
            Ok(id) => Box::into_raw(Box::new(Pd {
                ibv: ibv_pd {
                    context: context_,
                    handle: id,
                },
                id,
                hub: c.hub.clone(),
            }))
            .cast(),
            Err(e) => {
                set_errno(errno_of_rt(&e));
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard("ibv_dealloc_pd", libc::EIO, || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(x) = (unsafe { pd(p) }) else {
            return libc::EINVAL;
        };
        match x.hub.rt.dealloc_pd(x.id) {
            Ok(()) => {
                // SAFETY: the box ibv_alloc_pd leaked, freed once now.
                drop(unsafe { Box::from_raw(p as *mut Pd) });
                0
            }
            Err(e) => errno_of_rt(&e),
        }
    })
}

/// A region. Its C part and keys are in `UnsafeCell`s: `ibv_rereg_mr` replaces them.
#[repr(C)]
pub(crate) struct Mr {
    pub ibv: UnsafeCell<ibv_mr>,
    info: UnsafeCell<MrInfo>,
    pub hub: Arc<Hub>,
}

impl Mr {
    /// The region's keys and range as registered now.
    pub(crate) fn info(&self) -> MrInfo {
        // SAFETY: written only by ibv_rereg_mr, which the program may not run while it
        // uses the region otherwise (rdma-core has the same rule).
        unsafe { *self.info.get() }
    }
}

/// # Safety
/// `m` is NULL or an `ibv_mr` from `ibv_reg_mr*`, not yet deregistered.
pub(crate) unsafe fn mr<'a>(m: *mut ibv_mr) -> Option<&'a Mr> {
    // SAFETY: the caller's contract; `ibv` is the first field of the repr(C) `Mr`.
    (!m.is_null()).then(|| unsafe { &*(m as *const Mr) })
}

/// The access bits rdma-core defines that roce-xdp honours; the optional ones
/// (IBV_ACCESS_OPTIONAL_RANGE, relaxed ordering among them) are dropped as rdma-core
/// drops them for a device that does not support them, and HUGETLB is only a hint.
fn access_of(a: u32) -> Result<AccessFlags, c_int> {
    const OPTIONAL: u32 = 0x3ff0_0000;
    let a = a & !OPTIONAL & !IBV_ACCESS_HUGETLB;
    if a & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND;
    if a & !known != 0 {
        return Err(libc::EINVAL);
    }
    let f = AccessFlags(a);
    crate::verbs::mr::check_access(f).map_err(|_| libc::EINVAL)?;
    Ok(f)
}

/// True when every byte of `[addr, addr+len)` is mapped readable (and writable if
/// `write`), from /proc/self/maps: what the kernel's pinning of a user MR checks.
fn mapped(addr: usize, len: usize, write: bool) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let mut at = addr;
    for l in maps.lines() {
        let mut w = l.split_whitespace();
        let (Some(range), Some(perm)) = (w.next(), w.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        if b <= at {
            continue;
        }
        if a > at {
            return false;
        }
        let p = perm.as_bytes();
        if p.first() != Some(&b'r') || (write && p.get(1) != Some(&b'w')) {
            return false;
        }
        at = b;
        if at >= end {
            return true;
        }
    }
    false
}

/// Registers `[addr, addr+length)` of the program's memory at `iova`.
fn register(
    p: &Pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<MrInfo, c_int> {
    let access = access_of(access)?;
    if length == 0 {
        return Err(libc::EINVAL);
    }
    if addr.is_null()
        || !mapped(
            addr as usize,
            length,
            access.contains(AccessFlags::LOCAL_WRITE),
        )
    {
        return Err(libc::EFAULT);
    }
    // SAFETY: the range is mapped with the permissions the access flags need (checked
    // just now); the program keeps it so until ibv_dereg_mr, which refuses while the
    // engine still holds the region (see the module doc).
    let mem = unsafe { Memory::borrowed(addr.cast(), length) };
    p.hub
        .rt
        .reg_mr_iova(p.id, &mem, 0, length, iova, access)
        .map_err(|e| errno_of_rt(&e))
}

fn new_mr(p: *mut ibv_pd, x: &Pd, addr: *mut c_void, length: usize, info: MrInfo) -> *mut ibv_mr {
    Box::into_raw(Box::new(Mr {
        ibv: UnsafeCell::new(ibv_mr {
            context: x.ibv.context,
            pd: p,
            addr,
            length,
            handle: info.lkey,
            lkey: info.lkey,
            rkey: info.rkey,
        }),
        info: UnsafeCell::new(info),
        hub: x.hub.clone(),
    }))
    .cast()
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard("ibv_reg_mr", std::ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(x) = (unsafe { pd(p) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match register(x, addr, length, iova, access) {
            Ok(info) => new_mr(p, x, addr, length, info),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(p, addr, length, addr as u64, access as u32)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(p, addr, length, iova, access as u32)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard("ibv_dereg_mr", libc::EIO, || {
        // SAFETY: a region from ibv_reg_mr*.
        let Some(x) = (unsafe { mr(m) }) else {
            return libc::EINVAL;
        };
        match x.hub.rt.dereg_mr(x.info().lkey) {
            Ok(()) => {
                // SAFETY: the box ibv_reg_mr leaked, freed once now.
                drop(unsafe { Box::from_raw(m as *mut Mr) });
                0
            }
            Err(e) => errno_of_rt(&e),
        }
    })
}

/// `ibv_rereg_mr`: a new translation, PD or access for a region, as a new registration
/// with new keys that replaces the old one (which must be free of work in flight).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_rereg_mr(
    m: *mut ibv_mr,
    flags: c_int,
    new_pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    guard("ibv_rereg_mr", ERR_CMD, || {
        // SAFETY: a region from ibv_reg_mr*.
        let Some(x) = (unsafe { mr(m) }) else {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        };
        let flags = flags as u32;
        let all =
            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
        if flags == 0 || flags & !all != 0 {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 && (length == 0 || addr.is_null()) {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        if access != 0 && flags & IBV_REREG_MR_CHANGE_ACCESS == 0 {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        // SAFETY: the region's C part, stable while the program re-registers it.
        let cur = unsafe { *x.ibv.get() };
        let old = x.info();
        let pp = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            new_pd
        } else {
            cur.pd
        };
        // SAFETY: the region's own PD, or the new one the caller passes.
        let Some(p) = (unsafe { pd(pp) }) else {
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        };
        if !Arc::ptr_eq(&p.hub, &x.hub) {
            // A PD of another device: the keys would belong to another engine.
            set_errno(libc::EINVAL);
            return ERR_INPUT;
        }
        let (a, l, iova) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (addr, length, addr as u64)
        } else {
            (cur.addr, cur.length, old.addr)
        };
        let acc = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            access as u32
        } else {
            old.access.bits()
        };
        let info = match register(p, a, l, iova, acc) {
            Ok(i) => i,
            Err(e) => {
                set_errno(e);
                return ERR_CMD;
            }
        };
        if let Err(e) = x.hub.rt.dereg_mr(old.lkey) {
            let _ = p.hub.rt.dereg_mr(info.lkey);
            set_errno(errno_of_rt(&e));
            return ERR_CMD;
        }
        // SAFETY: the region's cells; the program does not use it concurrently.
        unsafe {
            *x.info.get() = info;
            let m = &mut *x.ibv.get();
            m.pd = pp;
            m.addr = a;
            m.length = l;
            m.lkey = info.lkey;
            m.rkey = info.rkey;
            m.handle = info.lkey;
        }
        0
    })
}

// ---------------------------------------------------------------------------------
// Memory windows (type 2).

#[repr(C)]
pub(crate) struct Mw {
    pub ibv: ibv_mw,
    pub mw: crate::verbs::Mw,
    pub hub: Arc<Hub>,
}

/// # Safety
/// `w` is NULL or an `ibv_mw` from `ibv_alloc_mw`, not yet deallocated.
pub(crate) unsafe fn mw<'a>(w: *mut ibv_mw) -> Option<&'a Mw> {
    // SAFETY: the caller's contract; `ibv` is the first field of the repr(C) `Mw`.
    (!w.is_null()).then(|| unsafe { &*(w as *const Mw) })
}

/// `ibv_context.ops.alloc_mw` (the inline `ibv_alloc_mw`): type 2 windows only (the
/// engine has no type 1).
pub(crate) unsafe extern "C" fn alloc_mw(p: *mut ibv_pd, kind: ibv_mw_type) -> *mut ibv_mw {
    guard("ibv_alloc_mw", std::ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(x) = (unsafe { pd(p) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if kind != IBV_MW_TYPE_2 {
            set_errno(if kind == IBV_MW_TYPE_1 {
                libc::EOPNOTSUPP
            } else {
                libc::EINVAL
            });
            return std::ptr::null_mut();
        }
        match x.hub.rt.alloc_mw(x.id) {
            Ok(w) => Box::into_raw(Box::new(Mw {
                ibv: ibv_mw {
                    context: x.ibv.context,
                    pd: p,
                    rkey: w.rkey,
                    handle: w.handle,
                    type_: kind,
                },
                mw: w,
                hub: x.hub.clone(),
            }))
            .cast(),
            Err(e) => {
                set_errno(errno_of_rt(&e));
                std::ptr::null_mut()
            }
        }
    })
}

/// `ibv_context.ops.bind_mw` (the inline `ibv_bind_mw`): binds type 1 windows, which
/// roce-xdp has none of; a type 2 window is bound by posting IBV_WR_BIND_MW (IBA
/// 10.6.7.2.3).
pub(crate) unsafe extern "C" fn bind_mw(
    _qp: *mut ibv_qp,
    _mw: *mut ibv_mw,
    _bind: *mut ibv_mw_bind,
) -> c_int {
    set_errno(libc::EINVAL);
    libc::EINVAL
}

pub(crate) unsafe extern "C" fn dealloc_mw(w: *mut ibv_mw) -> c_int {
    guard("ibv_dealloc_mw", libc::EIO, || {
        // SAFETY: a window from ibv_alloc_mw.
        let Some(x) = (unsafe { mw(w) }) else {
            return libc::EINVAL;
        };
        match x.hub.rt.dealloc_mw(x.mw.handle) {
            Ok(()) => {
                // SAFETY: the box alloc_mw leaked, freed once now.
                drop(unsafe { Box::from_raw(w as *mut Mw) });
                0
            }
            Err(e) => errno_of_rt(&e),
        }
    })
}

// ---------------------------------------------------------------------------------
// Address handles.

#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub av: AddressVector,
}

/// # Safety
/// `a` is NULL or an `ibv_ah` from `ibv_create_ah`, not yet destroyed.
pub(crate) unsafe fn ah<'a>(a: *mut ibv_ah) -> Option<&'a Ah> {
    // SAFETY: the caller's contract; `ibv` is the first field of the repr(C) `Ah`.
    (!a.is_null()).then(|| unsafe { &*(a as *const Ah) })
}

/// The address vector of an `ibv_ah_attr`. RoCE addresses by GID, so the GRH is
/// required (`is_global`): a LID-only address cannot leave the host (rxe refuses it
/// too), and saying so beats a QP that never hears from its peer.
pub(crate) fn av_of(c: &Context, a: &ibv_ah_attr) -> Result<AddressVector, c_int> {
    if a.is_global == 0 {
        tracing::warn!(
            "RoCE needs a GRH: the address has is_global = 0 (a LID only); give the program a GID index (-g / -x)"
        );
        return Err(libc::EINVAL);
    }
    if a.port_num > 1 {
        return Err(libc::EINVAL);
    }
    let g = &a.grh;
    if c.hub.rt.gid(g.sgid_index).is_none() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a GID is 16 plain bytes whichever way the union is read.
    let dgid = unsafe { g.dgid.raw };
    Ok(AddressVector {
        dgid,
        sgid_index: g.sgid_index,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
        flow_label: g.flow_label & 0xf_ffff,
        sl: a.sl,
        dmac: None,
    })
}

/// The `ibv_ah_attr` of an address vector (`ibv_query_qp`).
pub(crate) fn ah_attr_of(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("ibv_create_ah", std::ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(x) = (unsafe { pd(p) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // SAFETY: a live context (the PD's).
        let Some(c) = (unsafe { context(x.ibv.context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes.
        let mut av = match av_of(c, unsafe { &*attr }) {
            Ok(a) => a,
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        // The next hop's MAC now, as the kernel resolves it when it creates an AH.
        if let Err(e) = x.hub.rt.complete_av(&mut av) {
            tracing::warn!("ibv_create_ah: {e}");
            set_errno(libc::EHOSTUNREACH);
            return std::ptr::null_mut();
        }
        Box::into_raw(Box::new(Ah {
            ibv: ibv_ah {
                context: x.ibv.context,
                pd: p,
                handle: 0,
            },
            av,
        }))
        .cast()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_ah(a: *mut ibv_ah) -> c_int {
    guard("ibv_destroy_ah", libc::EIO, || {
        if a.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the box ibv_create_ah leaked, freed once now.
        drop(unsafe { Box::from_raw(a as *mut Ah) });
        0
    })
}

/// The GID table index of `gid` (all entries RoCE v2), as rdma-core's
/// `ibv_find_gid_index` searches it.
fn find_gid_index(c: &Context, gid: &[u8; 16]) -> Option<u8> {
    (0..=255u8).find(|&i| c.hub.rt.gid(i).is_some_and(|g| &g == gid))
}

/// `ibv_init_ah_from_wc`: the address to answer a UD receive, from its completion and
/// the GRH area the engine wrote before the payload (RoCEv2 over IPv4: 20 zero bytes
/// then the IPv4 header; over IPv6: the IPv6 header), as rdma-core derives it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_init_ah_from_wc(
    context_: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard("ibv_init_ah_from_wc", -1, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(context_) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if wc.is_null() || ah_attr.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's completion.
        let w = unsafe { &*wc };
        let mut a = ibv_ah_attr {
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            port_num,
            ..Default::default()
        };
        if w.wc_flags & IBV_WC_GRH != 0 {
            if grh.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            // SAFETY: the 40-byte GRH area at the start of the receive buffer.
            let g = unsafe { std::slice::from_raw_parts(grh as *const u8, 40) };
            a.is_global = 1;
            let vtf = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            a.grh.flow_label = vtf & 0xf_ffff;
            let ip4 = &g[20..40];
            let v4 = if vtf >> 28 == 6 {
                // An IPv6 header, unless it is an IPv4 one whose checksum holds.
                ip4[0] == 0x45 && ipv4_checksum_ok(ip4)
            } else if ip4[0] >> 4 == 4 {
                true
            } else {
                set_errno(libc::EPROTONOSUPPORT);
                return -1;
            };
            if v4 {
                let daddr = [ip4[16], ip4[17], ip4[18], ip4[19]];
                if daddr[0] >= 224 && daddr[0] <= 239 {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let mapped = |b: [u8; 4]| {
                    let mut x = [0u8; 16];
                    x[10] = 0xff;
                    x[11] = 0xff;
                    x[12..].copy_from_slice(&b);
                    x
                };
                let Some(i) = find_gid_index(c, &mapped(daddr)) else {
                    return -1;
                };
                a.grh.dgid = ibv_gid {
                    raw: mapped([ip4[12], ip4[13], ip4[14], ip4[15]]),
                };
                a.grh.sgid_index = i;
                a.grh.hop_limit = ip4[8];
                a.grh.traffic_class = ip4[1];
            } else {
                let mut sgid = [0u8; 16];
                sgid.copy_from_slice(&g[8..24]);
                let mut dgid = [0u8; 16];
                dgid.copy_from_slice(&g[24..40]);
                if dgid[0] == 0xff {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                if g[6] != libc::IPPROTO_UDP as u8 {
                    set_errno(libc::EPROTONOSUPPORT);
                    return -1;
                }
                let Some(i) = find_gid_index(c, &dgid) else {
                    return -1;
                };
                a.grh.dgid = ibv_gid { raw: sgid };
                a.grh.sgid_index = i;
                a.grh.hop_limit = g[7];
                a.grh.traffic_class = ((vtf >> 20) & 0xff) as u8;
            }
        }
        // SAFETY: the caller gives room for the attributes.
        unsafe { *ah_attr = a };
        0
    })
}

fn ipv4_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = 0;
    for (i, c) in h[..20].chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16) == u16::from_be_bytes([h[10], h[11]])
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard("ibv_create_ah_from_wc", std::ptr::null_mut(), || {
        // SAFETY: a PD from ibv_alloc_pd.
        let Some(x) = (unsafe { pd(p) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let mut a = ibv_ah_attr::default();
        if ibv_init_ah_from_wc(x.ibv.context, port_num, wc, grh, &mut a) != 0 {
            return std::ptr::null_mut();
        }
        ibv_create_ah(p, &mut a)
    })
}

/// `ibv_resolve_eth_l2_from_gid`: the next hop's MAC for an address (the kernel's
/// neighbour table, resolved if missing, 3 s at most as rdma-core waits); `vid` the
/// source GID's VLAN, 0xffff for none (as rdma-core's).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_resolve_eth_l2_from_gid(
    context_: *mut ibv_context,
    attr: *mut ibv_ah_attr,
    eth_mac: *mut u8,
    vid: *mut u16,
) -> c_int {
    guard("ibv_resolve_eth_l2_from_gid", -libc::EIO, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(context_) }) else {
            return -libc::EINVAL;
        };
        if attr.is_null() || eth_mac.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the caller's attributes.
        let mut av = match av_of(c, unsafe { &*attr }) {
            Ok(a) => a,
            Err(e) => return -e,
        };
        if c.hub.rt.complete_av(&mut av).is_err() {
            return -libc::EHOSTUNREACH;
        }
        let mac = av.dmac.unwrap_or([0; 6]);
        let vlan = c.hub.rt.gid_vlan(av.sgid_index).map_or(0xffff, |v| v.vid);
        // SAFETY: the caller gives 6 bytes for the MAC, and a u16 or NULL for the VLAN.
        unsafe {
            std::ptr::copy_nonoverlapping(mac.as_ptr(), eth_mac, 6);
            if !vid.is_null() {
                *vid = vlan;
            }
        }
        0
    })
}

/// Fork support: roce-xdp pins nothing, so a fork leaves the parent's registered memory
/// as the engine sees it (copy-on-write happens in the child): IBV_FORK_UNNEEDED.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_ranges_follow_the_process_maps() {
        let v = vec![0u8; 8192];
        assert!(mapped(v.as_ptr() as usize, v.len(), true));
        assert!(!mapped(0, 4096, false), "page 0 is never mapped");
        assert!(!mapped(usize::MAX - 10, 100, false));
        // Code is mapped readable but not writable.
        let f = mapped_ranges_follow_the_process_maps as *const () as usize;
        assert!(mapped(f, 16, false) && !mapped(f, 16, true));
    }

    #[test]
    fn access_flags_as_rdma_core_filters_them() {
        assert_eq!(access_of(0x100003).unwrap(), AccessFlags(3));
        assert_eq!(access_of(IBV_ACCESS_ON_DEMAND), Err(libc::EOPNOTSUPP));
        assert_eq!(access_of(IBV_ACCESS_REMOTE_WRITE), Err(libc::EINVAL));
        assert_eq!(access_of(1 << 15), Err(libc::EINVAL));
    }
}

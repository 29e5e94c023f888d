//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the queries
//! (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, ...), asynchronous events,
//! and the engine each open device runs.
//!
//! Devices are [`crate::links::devices`]: one per interface (named `rxdp_<if>` unless
//! `roce-xdp link add` named it). Their `ibv_device` structures live as long as the
//! process (rdma-core also keeps a device until its last user is gone; programs keep
//! the pointer after `ibv_free_device_list`).
//!
//! Opening a device starts its engine (a [`Hub`]) unless another context of this
//! process has it open already: contexts of one device share one engine, as they share
//! one NIC. The engine stops when the last context closes.

use super::sys::*;
use super::{copy_cstr, guard, init_logging, set_errno};
use crate::links::Link;
use crate::runtime::{Device, EventHook, FdQueue, RuntimeConfig};
use crate::verbs::AsyncEvent;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

/// `roce-xdp run --link`: `xdp`, `udp` or `auto` (default).
pub const LIB_ENV_LINK: &str = "ROCE_XDP_LINK";
/// `roce-xdp run --pcap FILE`: every frame of the engine to FILE (`.DEVICE` appended when
/// several devices are opened).
pub const LIB_ENV_PCAP: &str = "ROCE_XDP_PCAP";
/// `roce-xdp run --caller-rounds on|off`: `1` or `0` for
/// `RuntimeConfig::caller_rounds` (unset: decided at open).
pub const LIB_ENV_CALLER_ROUNDS: &str = "ROCE_XDP_CALLER_ROUNDS";

/// rxe's GID table length (RXE_PORT_GID_TBL_LEN): entries past the addresses are empty.
pub(crate) const GID_TBL_LEN: u32 = 1024;

/// A device as programs see it.
#[repr(C)]
pub(crate) struct Dev {
    pub ibv: ibv_device,
    pub link: Link,
    pub ifindex: u32,
    /// The node GUID, in network order (EUI-64 of the interface's MAC, as rxe).
    pub guid_be: u64,
}

/// Every device this process has seen, never freed.
static DEVICES: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The node GUID of a MAC: EUI-64 with the universal/local bit flipped, as rxe derives
/// it (`addrconf_addr_eui48`), in network order.
pub(crate) fn guid_of(mac: [u8; 6]) -> u64 {
    u64::from_ne_bytes(crate::verbs::device::eui64_of(mac))
}

/// The device of `link`, created on first sight.
pub(crate) fn device_for(link: &Link) -> *mut ibv_device {
    let mut all = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    for &p in all.iter() {
        // SAFETY: the registry holds leaked boxes of `Dev`, never freed.
        let d = unsafe { &*(p as *const Dev) };
        if d.link.name == link.name && d.link.netdev == link.netdev {
            return p as *mut ibv_device;
        }
    }
    let ifc = crate::host::Interface::find(&link.netdev).ok();
    let mac = ifc.as_ref().and_then(|i| i.mac().ok()).unwrap_or([0; 6]);
    let i = all.len();
    let mut ibv = ibv_device {
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        ..Default::default()
    };
    copy_cstr(&mut ibv.name, &link.name);
    copy_cstr(&mut ibv.dev_name, &format!("uverbs{i}"));
    copy_cstr(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs{i}"),
    );
    copy_cstr(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{}", link.name),
    );
    let d = Box::new(Dev {
        ibv,
        link: link.clone(),
        ifindex: ifc.map_or(0, |i| i.index),
        guid_be: guid_of(mac),
    });
    let p = Box::into_raw(d) as usize;
    all.push(p);
    p as *mut ibv_device
}

/// The `Dev` behind a device pointer we handed out.
pub(crate) unsafe fn dev<'a>(d: *mut ibv_device) -> Option<&'a Dev> {
    if d.is_null() {
        return None;
    }
    let all = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: only pointers found in the registry (leaked, never freed boxes) are used.
    all.contains(&(d as usize))
        .then(|| unsafe { &*(d as *const Dev) })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard("ibv_get_device_list", std::ptr::null_mut(), || {
        init_logging();
        let devs: Vec<*mut ibv_device> = crate::links::devices().iter().map(device_for).collect();
        // SAFETY: calloc of n+1 pointers, NULL-terminated; freed by ibv_free_device_list.
        let list = unsafe {
            libc::calloc(devs.len() + 1, std::mem::size_of::<*mut ibv_device>())
                as *mut *mut ibv_device
        };
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `i` < n, inside the allocation.
            unsafe { *list.add(i) = *d };
        }
        if !num.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL.
            unsafe { *num = devs.len() as c_int };
        }
        list
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard("ibv_free_device_list", (), || {
        // SAFETY: the list came from ibv_get_device_list's calloc (or is NULL).
        unsafe { libc::free(list.cast()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    guard("ibv_get_device_name", std::ptr::null(), || {
        if device.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null();
        }
        // SAFETY: a device pointer from ibv_get_device_list: name is NUL-terminated.
        unsafe { (*device).name.as_ptr() }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> __be64 {
    guard("ibv_get_device_guid", 0, || {
        // SAFETY: a device pointer from ibv_get_device_list.
        unsafe { dev(device) }.map_or(0, |d| d.guid_be)
    })
}

/// The interface's index: unique in the namespace and telling where the device runs.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    guard("ibv_get_device_index", -1, || {
        // SAFETY: a device pointer from ibv_get_device_list.
        unsafe { dev(device) }.map_or(-1, |d| d.ifindex as c_int)
    })
}

// ---------------------------------------------------------------------------------
// The engine of an open device.

/// An asynchronous event waiting for `ibv_get_async_event`: its type and element.
#[derive(Clone, Copy)]
pub(crate) struct AsyncEv {
    pub kind: ibv_event_type,
    /// The `ibv_qp`, `ibv_cq` or `ibv_srq` address, or the port number.
    pub element: usize,
}

pub(crate) type AsyncQueue = FdQueue<AsyncEv>;

/// Which context gets the events of which object.
#[derive(Default)]
pub(crate) struct Routes {
    pub qps: HashMap<u32, (Arc<AsyncQueue>, usize)>,
    pub cqs: HashMap<u32, (Arc<AsyncQueue>, usize)>,
    pub srqs: HashMap<u32, (Arc<AsyncQueue>, usize)>,
    pub contexts: Vec<Arc<AsyncQueue>>,
}

impl Routes {
    /// Hands engine event `e` to the context that owns its object (port events to all).
    fn dispatch(&self, e: AsyncEvent) {
        let to = |m: &HashMap<u32, (Arc<AsyncQueue>, usize)>, id: u32, kind| {
            if let Some((q, p)) = m.get(&id) {
                q.notify(AsyncEv { kind, element: *p });
            }
        };
        match e {
            AsyncEvent::CqErr { cq } => to(&self.cqs, cq, IBV_EVENT_CQ_ERR),
            AsyncEvent::QpFatal { qpn } => to(&self.qps, qpn, IBV_EVENT_QP_FATAL),
            AsyncEvent::CommEst { qpn } => to(&self.qps, qpn, IBV_EVENT_COMM_EST),
            AsyncEvent::SqDrained { qpn } => to(&self.qps, qpn, IBV_EVENT_SQ_DRAINED),
            AsyncEvent::QpLastWqeReached { qpn } => {
                to(&self.qps, qpn, IBV_EVENT_QP_LAST_WQE_REACHED)
            }
            AsyncEvent::SrqLimitReached { srq } => to(&self.srqs, srq, IBV_EVENT_SRQ_LIMIT_REACHED),
            AsyncEvent::PortActive | AsyncEvent::PortErr => {
                let kind = if e == AsyncEvent::PortActive {
                    IBV_EVENT_PORT_ACTIVE
                } else {
                    IBV_EVENT_PORT_ERR
                };
                for q in &self.contexts {
                    q.notify(AsyncEv { kind, element: 1 });
                }
            }
            // Completion events are the runtime's (Cq::req_notify), not the engine's.
            AsyncEvent::CompletionNotify { .. } => {}
        }
    }
}

/// One device's engine in this process, shared by its contexts.
pub(crate) struct Hub {
    pub rt: Device,
    pub netdev: String,
    pub ifindex: u32,
    pub guid_be: u64,
    pub routes: Arc<Mutex<Routes>>,
}

static HUBS: Mutex<Vec<(String, Weak<Hub>)>> = Mutex::new(Vec::new());

/// The program's name, for the stats file and messages.
fn comm() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "verbs".into())
}

/// Starts the engine of `d` (or finds the one running): AF_XDP if the process may use
/// it, else the UDP link on the interface's first address, with a notice.
fn hub_for(d: &Dev) -> Result<Arc<Hub>, (i32, String)> {
    let mut hubs = HUBS.lock().unwrap_or_else(|e| e.into_inner());
    hubs.retain(|(_, w)| w.strong_count() > 0);
    if let Some(h) = hubs
        .iter()
        .find(|(n, _)| *n == d.link.name)
        .and_then(|(_, w)| w.upgrade())
    {
        return Ok(h);
    }
    let name = d.link.name.clone();
    let netdev = d.link.netdev.clone();
    let ifc = crate::host::Interface::find(&netdev)
        .map_err(|e| (libc::ENODEV, format!("{name}: {e}")))?;
    let want = std::env::var(LIB_ENV_LINK).unwrap_or_else(|_| "auto".into());
    let xdp_ok = crate::host::check_xdp_privileges();
    let use_xdp = match want.as_str() {
        "xdp" => true,
        "udp" => false,
        _ => xdp_ok.is_ok(),
    };
    let mut cfg = if use_xdp {
        RuntimeConfig::xdp(&netdev)
    } else {
        udp_config(&ifc, &name, want != "udp", xdp_ok.err())?
    };
    let routes = Arc::new(Mutex::new(Routes::default()));
    let r2 = routes.clone();
    cfg.event_hook = Some(EventHook(Arc::new(move |e| {
        r2.lock().unwrap_or_else(|e| e.into_inner()).dispatch(e)
    })));
    let dev_name = name.clone();
    super::cm::start_dispatcher();
    cfg.cm_hook = Some(crate::runtime::CmHook(Arc::new(move |e| {
        super::cm::on_engine_event(&dev_name, e)
    })));
    cfg.port_ifname = Some(netdev.clone());
    cfg.busy_poll = std::env::var("ROCE_XDP_BUSY_POLL").is_ok_and(|v| v == "1");
    cfg.caller_rounds = match std::env::var(LIB_ENV_CALLER_ROUNDS).as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    };
    if let Some(p) = std::env::var_os(LIB_ENV_PCAP) {
        let mut p = std::path::PathBuf::from(p);
        if hubs.iter().any(|(n, _)| *n != name) {
            p.as_mut_os_string().push(format!(".{name}"));
        }
        cfg.pcap = Some(p);
    }
    cfg.stats_file = Some(crate::apps::stats::default_path(&format!(
        "{}-{name}",
        comm()
    )));
    let rt = Device::open(cfg).map_err(|e| {
        let msg = e.to_string();
        let errno = if msg.contains("already served") {
            libc::EBUSY
        } else if msg.contains("privilege") || msg.contains("CAP_") {
            libc::EPERM
        } else {
            libc::ENODEV
        };
        (errno, format!("{name}: {msg}"))
    })?;
    let mac = ifc.mac().unwrap_or([0; 6]);
    let h = Arc::new(Hub {
        rt,
        netdev,
        ifindex: ifc.index,
        guid_be: guid_of(mac),
        routes,
    });
    hubs.push((name, Arc::downgrade(&h)));
    Ok(h)
}

/// The UDP link on the interface's first IPv4 (else IPv6) address, with the interface's
/// MAC in the GID table as rxe would have it.
fn udp_config(
    ifc: &crate::host::Interface,
    name: &str,
    notice: bool,
    why: Option<String>,
) -> Result<RuntimeConfig, (i32, String)> {
    let addrs = ifc.addresses().unwrap_or_default();
    let local = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| {
            addrs
                .iter()
                .find(|a| matches!(a, IpAddr::V6(v) if v.segments()[0] != 0xfe80))
        })
        .copied()
        .ok_or_else(|| {
            (
                libc::ENODEV,
                format!("{name}: {} has no IP address for the UDP link", ifc.name),
            )
        })?;
    if notice {
        eprintln!(
            "roce-xdp: {name}: AF_XDP is not available to this process ({}); using the UDP link on {local} port 4791",
            why.unwrap_or_else(|| "not allowed".into())
                .split(". ")
                .next()
                .unwrap_or("")
        );
    }
    let mut cfg = RuntimeConfig::udp(local);
    let mtu = ifc.mtu().unwrap_or(1500);
    let mut d =
        crate::verbs::DeviceConfig::new(ifc.mac().unwrap_or([2, 0, 0, 0, 0, 1]), [0; 4].into());
    match local {
        IpAddr::V4(a) => d.ipv4 = vec![a],
        IpAddr::V6(a) => {
            d.ipv4 = vec![];
            d.ipv6 = vec![a];
        }
    }
    d.port_mtu = crate::verbs::Mtu::for_netdev_mtu(mtu).ok_or_else(|| {
        (
            libc::ENODEV,
            format!(
                "{name}: the MTU {mtu} of {} is too small for RoCE",
                ifc.name
            ),
        )
    })?;
    d.udp_link = true;
    d.seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id());
    cfg.device = Some(d);
    Ok(cfg)
}

// ---------------------------------------------------------------------------------
// Contexts.

/// An open device: `verbs_context` (with the `ibv_context` programs get, at offset 320)
/// first, then ours.
#[repr(C)]
pub(crate) struct Context {
    pub vctx: verbs_context,
    pub hub: Arc<Hub>,
    pub asyncq: Arc<AsyncQueue>,
}

const CTX_OFFSET: usize = std::mem::offset_of!(verbs_context, context);

/// The `Context` of a context pointer we handed out.
///
/// # Safety
/// `c` must be NULL or an `ibv_context` from `ibv_open_device` not yet closed.
pub(crate) unsafe fn context<'a>(c: *mut ibv_context) -> Option<&'a Context> {
    if c.is_null() {
        return None;
    }
    // SAFETY: the caller's contract: `c` is the `context` field of a live `Context`,
    // whose first field is the `verbs_context` holding it at CTX_OFFSET.
    Some(unsafe { &*((c as *mut u8).sub(CTX_OFFSET) as *const Context) })
}

/// Drops the asynchronous events not yet handed out about an object being destroyed
/// (`element`: its C pointer), so that none names it afterwards.
///
/// # Safety
/// As [`context`]: `c` is the object's context, live while the object is.
pub(crate) unsafe fn forget_events(c: *mut ibv_context, element: usize) {
    // SAFETY: the caller's contract.
    if let Some(c) = unsafe { context(c) } {
        c.asyncq.forget(|e| e.element == element);
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard("ibv_open_device", std::ptr::null_mut(), || {
        init_logging();
        // SAFETY: a device pointer from ibv_get_device_list (checked in the registry).
        let Some(d) = (unsafe { dev(device) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let hub = match hub_for(d) {
            Ok(h) => h,
            Err((errno, msg)) => {
                eprintln!("roce-xdp: {msg}");
                set_errno(errno);
                return std::ptr::null_mut();
            }
        };
        let asyncq = match AsyncQueue::new() {
            Ok(q) => Arc::new(q),
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                return std::ptr::null_mut();
            }
        };
        hub.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contexts
            .push(asyncq.clone());
        let mut vctx = verbs_context {
            query_port: Some(query_port_ex),
            query_device_ex: Some(query_device_ex),
            create_qp_ex: Some(super::qp::create_qp_ex),
            create_cq_ex: Some(super::cq::create_cq_ex),
            create_srq_ex: Some(super::qp::create_srq_ex),
            close_xrcd: Some(super::compat::close_xrcd),
            sz: std::mem::size_of::<verbs_context>(),
            ..Default::default()
        };
        let c = &mut vctx.context;
        c.device = device;
        c.cmd_fd = -1;
        c.async_fd = asyncq.fd();
        c.num_comp_vectors = 1;
        c.abi_compat = usize::MAX as *mut c_void;
        c.ops.poll_cq = Some(super::cq::poll_cq);
        c.ops.req_notify_cq = Some(super::cq::req_notify_cq);
        c.ops.post_send = Some(super::qp::post_send);
        c.ops.post_recv = Some(super::qp::post_recv);
        c.ops.post_srq_recv = Some(super::qp::post_srq_recv);
        c.ops.alloc_mw = Some(super::mr::alloc_mw);
        c.ops.bind_mw = Some(super::mr::bind_mw);
        c.ops.dealloc_mw = Some(super::mr::dealloc_mw);
        let ctx = Box::new(Context { vctx, hub, asyncq });
        let p = Box::into_raw(ctx);
        // SAFETY: `p` is our new, live box; the mutex is initialised in place.
        unsafe {
            libc::pthread_mutex_init(
                std::ptr::addr_of_mut!((*p).vctx.context.mutex).cast(),
                std::ptr::null(),
            );
            std::ptr::addr_of_mut!((*p).vctx.context)
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_close_device(ctx_p: *mut ibv_context) -> c_int {
    guard("ibv_close_device", -1, || {
        if ctx_p.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller closes a context it opened, once.
        let ctx = unsafe { Box::from_raw((ctx_p as *mut u8).sub(CTX_OFFSET) as *mut Context) };
        ctx.hub
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contexts
            .retain(|q| !Arc::ptr_eq(q, &ctx.asyncq));
        // Dropping the last context's hub stops the engine (XDP detached, UMEM freed).
        drop(ctx);
        0
    })
}

// ---------------------------------------------------------------------------------
// Queries.

/// What `ibv_query_device` reports: rxe's capability set where roce-xdp has it, the
/// engine's limits for the numbers.
fn device_attr(h: &Hub) -> ibv_device_attr {
    let l = h.rt.info().limits;
    let mut a = ibv_device_attr::default();
    copy_cstr(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = h.guid_be;
    a.sys_image_guid = h.guid_be;
    a.max_mr_size = l.max_mr_size;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = 0;
    a.vendor_part_id = 0;
    a.hw_ver = 0;
    a.max_qp = l.max_qp as c_int;
    a.max_qp_wr = l.max_qp_wr as c_int;
    a.device_cap_flags = IBV_DEVICE_PORT_ACTIVE_EVENT
        | IBV_DEVICE_SYS_IMAGE_GUID
        | IBV_DEVICE_RC_RNR_NAK_GEN
        | IBV_DEVICE_SRQ_RESIZE
        | IBV_DEVICE_MEM_WINDOW
        | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    a.max_sge = l.max_sge as c_int;
    a.max_sge_rd = l.max_sge as c_int;
    a.max_cq = l.max_cq as c_int;
    a.max_cqe = l.max_cqe as c_int;
    a.max_mr = l.max_mr as c_int;
    a.max_pd = l.max_pd as c_int;
    a.max_qp_rd_atom = c_int::from(l.max_qp_rd_atom);
    a.max_res_rd_atom = 0x3f000;
    a.max_qp_init_rd_atom = c_int::from(l.max_qp_init_rd_atom);
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_mw = l.max_mw as c_int;
    a.max_ah = l.max_qp as c_int;
    a.max_srq = l.max_srq as c_int;
    a.max_srq_wr = l.max_srq_wr as c_int;
    a.max_srq_sge = l.max_srq_sge as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_device(ctx_p: *mut ibv_context, out: *mut ibv_device_attr) -> c_int {
    guard("ibv_query_device", libc::EIO, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { super::device::context(ctx_p) }) else {
            return libc::EINVAL;
        };
        if out.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes room for an ibv_device_attr.
        unsafe { *out = device_attr(&c.hub) };
        0
    })
}

/// `verbs_context.query_device_ex`: `ibv_query_device_ex` and, through it, ibv_devinfo.
pub(crate) unsafe extern "C" fn query_device_ex(
    ctx_p: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard("ibv_query_device_ex", libc::EIO, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context_of(ctx_p) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` is NULL or points at an input structure.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        let mut ex = ibv_device_attr_ex {
            orig_attr: device_attr(&c.hub),
            ..Default::default()
        };
        ex.device_cap_flags_ex = u64::from(ex.orig_attr.device_cap_flags);
        ex.phys_port_cnt_ex = 1;
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller gives `attr_size` writable bytes at `attr`; we write at most
        // that many, from a structure at least as long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&ex as *const ibv_device_attr_ex).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            )
        };
        0
    })
}

/// `context()` under the name the ops use.
unsafe fn context_of<'a>(c: *mut ibv_context) -> Option<&'a Context> {
    // SAFETY: forwarded contract.
    unsafe { context(c) }
}

/// The IB speed and width of the interface's Ethernet speed, as the kernel's
/// `ib_get_eth_speed` maps it for rxe (unknown speed: SDR 1X).
fn eth_speed(netdev: &str) -> (u8, u8) {
    let mbps = crate::host::Interface::find(netdev)
        .ok()
        .and_then(|i| i.speed_mbps())
        .unwrap_or(0);
    // (active_speed, active_width): SDR 1, DDR 2, QDR 4, FDR10 8, FDR 16, EDR 32;
    // 1X 1, 4X 2.
    match mbps {
        0..=1000 => (1, 1),
        1001..=10000 => (8, 1),
        10001..=20000 => (2, 2),
        20001..=25000 => (32, 1),
        25001..=40000 => (8, 2),
        _ => (32, 2),
    }
}

/// What `ibv_query_port` reports, as rxe fills it for its interface.
pub(crate) fn port_attr(h: &Hub) -> ibv_port_attr {
    let info = h.rt.info();
    let up = h.rt.port_active();
    let (speed, width) = eth_speed(&h.netdev);
    ibv_port_attr {
        state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: IBV_MTU_4096,
        active_mtu: info.port_mtu as u32,
        gid_tbl_len: GID_TBL_LEN as c_int,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: info.limits.max_msg_sz,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: width,
        active_speed: speed,
        phys_state: if up { 5 } else { 3 },
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// `verbs_context.query_port`: the inline `ibv_query_port` calls this.
pub(crate) unsafe extern "C" fn query_port_ex(
    ctx_p: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard("ibv_query_port", libc::EIO, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context_of(ctx_p) }) else {
            return libc::EINVAL;
        };
        if port_num != 1 || port_attr_out.is_null() {
            return libc::EINVAL;
        }
        let a = port_attr(&c.hub);
        let n = port_attr_len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller gives `port_attr_len` writable bytes; at most that many.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&a as *const ibv_port_attr).cast::<u8>(),
                port_attr_out.cast::<u8>(),
                n,
            )
        };
        0
    })
}

/// rdma-core's exported `ibv_query_port` takes the older, 48-byte structure
/// (`_compat_ibv_port_attr`); the inline one calls `query_port_ex` instead.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_port(
    ctx_p: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut c_void,
) -> c_int {
    const COMPAT_LEN: usize = 48;
    // SAFETY: the caller gives room for the compat structure.
    unsafe { query_port_ex(ctx_p, port_num, port_attr_out.cast(), COMPAT_LEN) }
}

/// `_ibv_query_gid_ex` (the inline `ibv_query_gid_ex` calls it): one GID table entry,
/// every one RoCE v2 as in rxe; ENODATA for an empty entry.
#[unsafe(no_mangle)]
pub extern "C" fn _ibv_query_gid_ex(
    ctx_p: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard("ibv_query_gid_ex", libc::EIO, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(ctx_p) }) else {
            return libc::EINVAL;
        };
        if flags != 0
            || port_num != 1
            || entry.is_null()
            || entry_size < std::mem::size_of::<ibv_gid_entry>()
            || gid_index >= GID_TBL_LEN
        {
            return libc::EINVAL;
        }
        match gid_entry(c, gid_index) {
            // SAFETY: the caller gives room for an ibv_gid_entry (checked above).
            Some(e) => unsafe { *entry = e },
            None => return libc::ENODATA,
        }
        0
    })
}

/// One GID table entry; a VLAN subinterface's GID names that netdev, as the kernel's
/// GID attributes do (rdma_cm and `show_gids` find the VLAN from it).
fn gid_entry(c: &Context, index: u32) -> Option<ibv_gid_entry> {
    let i = u8::try_from(index).ok()?;
    let g = c.hub.rt.gid(i)?;
    Some(ibv_gid_entry {
        gid: ibv_gid { raw: g },
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: c.hub.rt.gid_vlan(i).map_or(c.hub.ifindex, |v| v.index),
    })
}

/// `_ibv_query_gid_table`: every non-empty entry; how many, or a negative errno.
#[unsafe(no_mangle)]
pub extern "C" fn _ibv_query_gid_table(
    ctx_p: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard("ibv_query_gid_table", -(libc::EIO as isize), || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(ctx_p) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entries.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let all: Vec<ibv_gid_entry> = (0..GID_TBL_LEN).map_while(|i| gid_entry(c, i)).collect();
        if all.len() > max_entries {
            return -(libc::EINVAL as isize);
        }
        for (i, e) in all.iter().enumerate() {
            // SAFETY: the caller gives `max_entries` entries of `entry_size` bytes.
            unsafe { *((entries as *mut u8).add(i * entry_size) as *mut ibv_gid_entry) = *e };
        }
        all.len() as isize
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_gid(
    ctx_p: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard("ibv_query_gid", -1, || {
        if gid.is_null() || index < 0 {
            return -1;
        }
        let mut e = ibv_gid_entry::default();
        let r = _ibv_query_gid_ex(
            ctx_p,
            u32::from(port_num),
            index as u32,
            &mut e,
            0,
            std::mem::size_of::<ibv_gid_entry>(),
        );
        // An empty entry reads as the zero GID, as rdma-core keeps it.
        let g = match r {
            0 => e.gid,
            libc::ENODATA => ibv_gid { raw: [0; 16] },
            _ => return -1,
        };
        // SAFETY: the caller gives room for a GID.
        unsafe { *gid = g };
        0
    })
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; ibv_devinfo uses it): RoCE v2 for every
/// entry (`IBV_GID_TYPE_SYSFS_ROCE_V2`), v1 for empty ones as rdma-core reports them.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_gid_type(
    ctx_p: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    guard("ibv_query_gid_type", -1, || {
        if gid_type.is_null() {
            return -1;
        }
        let mut e = ibv_gid_entry::default();
        let r = _ibv_query_gid_ex(
            ctx_p,
            u32::from(port_num),
            index,
            &mut e,
            0,
            std::mem::size_of::<ibv_gid_entry>(),
        );
        let t = match r {
            0 => GID_TYPE_SYSFS_ROCE_V2,
            libc::ENODATA => GID_TYPE_SYSFS_IB_ROCE_V1,
            _ => return -1,
        };
        // SAFETY: the caller gives room for the enum.
        unsafe { *gid_type = t };
        0
    })
}

/// rdma-core's `enum ibv_gid_type_sysfs` (driver.h, not installed).
const GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// One P_Key, the default 0xffff at index 0 (RoCE has no partitions to manage).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_pkey(
    ctx_p: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    guard("ibv_query_pkey", -1, || {
        // SAFETY: a live context from ibv_open_device.
        if unsafe { context(ctx_p) }.is_none() || port_num != 1 || index != 0 || pkey.is_null() {
            return -1;
        }
        // SAFETY: the caller gives room for a P_Key.
        unsafe { *pkey = 0xffffu16.to_be() };
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_pkey_index(ctx_p: *mut ibv_context, port_num: u8, pkey: __be16) -> c_int {
    guard("ibv_get_pkey_index", -1, || {
        let mut p: __be16 = 0;
        if ibv_query_pkey(ctx_p, port_num, 0, &mut p) != 0 {
            return -1;
        }
        if p == pkey { 0 } else { -1 }
    })
}

// ---------------------------------------------------------------------------------
// Asynchronous events.

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_async_event(
    ctx_p: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard("ibv_get_async_event", -1, || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(ctx_p) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let got = c.asyncq.get_event_map(|e| {
            // Counted while the queue is locked: a destroy either took this event out
            // first, or waits for its acknowledgement.
            super::qp::async_reported(e);
            e
        });
        match got {
            Ok(e) => {
                let mut ev = ibv_async_event {
                    event_type: e.kind,
                    ..Default::default()
                };
                ev.element.port_num = 0;
                match e.kind {
                    IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR => {
                        ev.element.port_num = e.element as c_int
                    }
                    _ => ev.element.qp = e.element as *mut ibv_qp,
                }
                // SAFETY: the caller gives room for an event.
                unsafe { *event = ev };
                0
            }
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                -1
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    guard("ibv_ack_async_event", (), || {
        if event.is_null() {
            return;
        }
        // SAFETY: an event ibv_get_async_event filled.
        let e = unsafe { *event };
        // SAFETY: the union member the event type names.
        let element = unsafe { e.element.qp } as usize;
        super::qp::async_acked(AsyncEv {
            kind: e.event_type,
            element,
        });
    })
}

// ---------------------------------------------------------------------------------
// sysfs helpers rdma-core exports (librdmacm and ibv_devinfo call them).

/// `ibv_get_sysfs_path`: where sysfs is mounted (`SYSFS_PATH` overrides, as rdma-core).
#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::env::var("SYSFS_PATH").unwrap_or_else(|_| "/sys".into());
        let p = p.trim_end_matches('/').to_string();
        std::ffi::CString::new(p).unwrap_or_else(|_| c"/sys".to_owned())
    })
    .as_ptr()
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: the file's first `size - 1` bytes, its
/// trailing newline removed, NUL-terminated; the length read, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        let data = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::ENOENT));
                return -1;
            }
        };
        let mut n = data.len().min(size - 1);
        // SAFETY: the caller gives `size` bytes at `buf`; we write n < size, then a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), n);
            if n > 0 && *buf.add(n - 1) == b'\n' as c_char {
                n -= 1;
            }
            *buf.add(n) = 0;
        }
        n as c_int
    })
}

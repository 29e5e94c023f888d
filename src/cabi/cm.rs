//! librdmacm's API (`<rdma/rdma_cma.h>`, rdma-core 44's `librdmacm.so.1`) over the
//! engine's Communication Manager ([`crate::engine::cm`]): `roce-xdp run` points
//! `librdmacm.so.1` at this same library, so rping, ucmatose, udaddy, rdma_server,
//! rdma_client and perftest's `-R` run unmodified.
//!
//! librdmacm drives the kernel's CM through `/dev/infiniband/rdma_cm`; here the CM is
//! the engine's, and this file does what librdmacm and the kernel's `rdma_cm` do around
//! it:
//! - addresses: the route's source address for a destination (the kernel's routing,
//!   through a connected UDP socket), the device holding it, the next hop's MAC from the
//!   neighbour table (resolved as the kernel resolves it) and the path MTU from the
//!   port; no SA, as on RoCE;
//! - the QP moved through INIT, RTR and RTS with what REQ and REP carry, as librdmacm
//!   does with `rdma_init_qp_attr` (UD QPs straight to RTS with Q_Key
//!   `RDMA_UDP_QKEY`), and to ERR on a disconnect;
//! - the rdma_cm IP header (`cma_hdr`) leading the private data of REQ and SIDR_REQ,
//!   and the service ID `port space << 16 | port`;
//! - event channels whose fd (an eventfd counting the waiting events) works with
//!   `poll()`; `rdma_get_cm_event` blocks unless the program made the fd non-blocking;
//! - synchronous IDs (no channel, `rdma_create_ep`): each call waits for its event.
//!
//! The engine's CM events arrive on the thread running the data path (the engine
//! thread, or a caller running a round as it polls); one thread of this library
//! (started with the first device) turns them into rdma_cm events, since that needs
//! calls into the runtime that thread cannot wait for.

use super::device::{Hub, context, device_for};
use super::sys::*;
use super::{errno_of_rt, guard, set_errno};
use crate::engine::cm::{AcceptParams, CmEvent, ConnectParams, SidrParams, reason};
use crate::verbs::device::{gid_of, ip_of};
use crate::wire::cm::{CMA_HEADER_LEN, CmaHeader};
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr::null_mut;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// What rdma_cm puts in front of the consumer's private data in a REQ (IBA annex A11).
const CMA_HDR: usize = CMA_HEADER_LEN;
/// rdma_cm's default CM response timeout and retries (`cma.c`). The kernel's are fixed;
/// `ROCE_XDP_CM_TIMEOUT` (the code, 4.096 us x 2^t) and `ROCE_XDP_CM_RETRIES` change
/// these, so that a test (or an impatient user) sees an unanswered REQ fail in seconds
/// rather than after a minute.
const CM_RESPONSE_TIMEOUT: u8 = 20;
const MAX_CM_RETRIES: u8 = 15;

fn cm_timing() -> (u8, u8) {
    let get = |k: &str, d: u8, max: u8| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<u8>().ok())
            .map_or(d, |v| v.min(max))
    };
    (
        get("ROCE_XDP_CM_TIMEOUT", CM_RESPONSE_TIMEOUT, 31),
        get("ROCE_XDP_CM_RETRIES", MAX_CM_RETRIES, 15),
    )
}
/// The QP's local ACK timeout rdma_cm gives RoCE paths (packet lifetime 18 + 1).
const ACK_TIMEOUT: u8 = 19;

// ---------------------------------------------------------------------------------
// Event channels.

/// What a program gets as `struct rdma_event_channel *`: the fd first, as in the header.
#[repr(C)]
pub(crate) struct Channel {
    ibv: UnsafeCell<rdma_event_channel>,
    /// Shared with a thread waiting in `rdma_get_cm_event`, which may outlive the handle
    /// (rping's event thread is still waiting when its main thread destroys the channel).
    q: Arc<Queue>,
    /// IDs using the channel (it is not destroyed under them).
    users: Mutex<usize>,
    /// Threads that have called `rdma_get_cm_event` on it (a few: a program's event
    /// thread and perhaps its main thread).
    readers: Mutex<Vec<std::thread::ThreadId>>,
}

// SAFETY: `ibv` holds only the fd, written once at creation; the rest is locked.
unsafe impl Sync for Channel {}
// SAFETY: as above.
unsafe impl Send for Channel {}

/// A channel's events. The eventfd counts them (so that `poll()` on the fd works), and
/// the count changes only under the lock together with the queue: a waiter that sees a
/// readable fd and then an empty queue (someone else took the event, or the event's ID
/// was destroyed) waits again rather than failing.
struct Queue {
    fd: c_int,
    st: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    /// Leaked `Event`s, oldest first.
    events: VecDeque<usize>,
    /// The channel was destroyed: its fd is closed, nothing is queued any more.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one off the eventfd's count; called under the lock with the count >= 1,
    /// so it never blocks.
    fn uncount(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a u64 from our eventfd (semaphore mode).
        unsafe { libc::read(self.fd, &mut v as *mut u64 as *mut c_void, 8) };
    }

    /// Drops the queued events `gone` picks (their ID is being destroyed), as the
    /// kernel's ucma drops a destroyed ID's undelivered events.
    fn remove(&self, mut gone: impl FnMut(&Event) -> bool) -> Vec<Event> {
        let mut s = self.lock();
        let mut out = Vec::new();
        let mut kept = VecDeque::with_capacity(s.events.len());
        for p in s.events.drain(..) {
            // SAFETY: events queued by push and not handed out are ours.
            if gone(unsafe { &*(p as *const Event) }) {
                self.uncount();
                // SAFETY: as above; taken off the queue and freed here, once.
                out.push(*unsafe { Box::from_raw(p as *mut Event) });
            } else {
                kept.push_back(p);
            }
        }
        s.events = kept;
        out
    }
}

impl Channel {
    fn fd(&self) -> c_int {
        self.q.fd
    }

    /// Queues an event (a leaked `Event`) and makes the fd readable once more.
    fn push(&self, ev: Box<Event>) {
        let mut s = self.q.lock();
        if s.closed {
            return;
        }
        s.events.push_back(Box::into_raw(ev) as usize);
        let one: u64 = 1;
        // SAFETY: an eventfd this channel owns; 8 bytes from a valid u64.
        unsafe { libc::write(self.fd(), &one as *const u64 as *const c_void, 8) };
    }

    /// Takes the next event, waiting for one unless the fd is non-blocking (then
    /// EAGAIN), as librdmacm's `rdma_get_cm_event` waits in its `write()`. `taken` runs
    /// under the queue's lock with the event, so that an ID's destroy, which first
    /// empties the queue of its events, sees every event handed out.
    fn pop(&self, taken: impl Fn(*mut Event)) -> Result<*mut Event, c_int> {
        let q = self.q.clone();
        loop {
            {
                let mut s = q.lock();
                if let Some(p) = s.events.pop_front() {
                    q.uncount();
                    taken(p as *mut Event);
                    return Ok(p as *mut Event);
                }
                if s.closed {
                    drop(s);
                    // Destroyed while we waited: librdmacm's waiter stays in its
                    // write() for good; so does this one (until a signal).
                    // SAFETY: pause has no arguments.
                    unsafe { libc::pause() };
                    return Err(libc::EINTR);
                }
            }
            // SAFETY: fcntl on our own fd.
            let flags = unsafe { libc::fcntl(q.fd, libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                return Err(libc::EAGAIN);
            }
            let mut p = libc::pollfd {
                fd: q.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd on the stack.
            if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if e == libc::EINTR {
                    return Err(e);
                }
            }
        }
    }
}

/// Channels destroyed lately: the pointer, the destroying thread, and the threads that
/// had read events from it. rping's event thread acknowledges DISCONNECTED, which lets
/// main's `rdma_destroy_id` return, and main destroys the channel; if main gets there
/// before the event thread is back in `rdma_get_cm_event`, that call finds the channel
/// gone. Under librdmacm it would be in its blocking read by then and stay there until
/// the process ends; so a reader other than the destroyer waits like that here too,
/// where the destroyer itself (a use after its own destroy) gets EINVAL.
type DeadChannel = (usize, std::thread::ThreadId, Vec<std::thread::ThreadId>);

fn dead_channels() -> std::sync::MutexGuard<'static, std::collections::VecDeque<DeadChannel>> {
    static L: OnceLock<Mutex<std::collections::VecDeque<DeadChannel>>> = OnceLock::new();
    L.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Destroyed channels remembered (the oldest is forgotten first).
const DEAD_KEPT: usize = 64;

/// Channels not yet destroyed (a destroyed one's pointer is refused, not dereferenced).
fn live_channels() -> std::sync::MutexGuard<'static, std::collections::HashSet<usize>> {
    static L: OnceLock<Mutex<std::collections::HashSet<usize>>> = OnceLock::new();
    L.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// # Safety
/// `c` is NULL or a pointer a program got from `rdma_create_event_channel`.
unsafe fn channel<'a>(c: *mut rdma_event_channel) -> Option<&'a Channel> {
    if c.is_null() || !live_channels().contains(&(c as usize)) {
        return None;
    }
    // SAFETY: a live channel (freed only after leaving the set); `ibv` is the first
    // field of the repr(C) Channel.
    Some(unsafe { &*(c as *const Channel) })
}

fn new_channel() -> Result<*mut rdma_event_channel, c_int> {
    // SAFETY: eventfd with no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    let c = Box::new(Channel {
        ibv: UnsafeCell::new(rdma_event_channel { fd }),
        q: Arc::new(Queue {
            fd,
            st: Mutex::new(QueueState::default()),
        }),
        users: Mutex::new(0),
        readers: Mutex::new(Vec::new()),
    });
    let p = Box::into_raw(c) as *mut rdma_event_channel;
    // The allocator may hand out a destroyed channel's address again.
    dead_channels().retain(|d| d.0 != p as usize);
    live_channels().insert(p as usize);
    Ok(p)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", null_mut(), || {
        super::init_logging();
        if crate::links::devices().is_empty() {
            set_errno(libc::ENODEV);
            return null_mut();
        }
        match new_channel() {
            Ok(c) => c,
            Err(e) => {
                set_errno(e);
                null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_event_channel(channel_: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        // SAFETY: a channel from rdma_create_event_channel.
        let Some(c) = (unsafe { channel(channel_) }) else {
            return;
        };
        if *c.users.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
            // librdmacm's documented precondition; refusing beats a dangling channel.
            tracing::warn!("rdma_destroy_event_channel: IDs still use the channel; kept");
            return;
        }
        live_channels().remove(&(channel_ as usize));
        {
            let readers = std::mem::take(&mut *c.readers.lock().unwrap_or_else(|e| e.into_inner()));
            let mut d = dead_channels();
            if d.len() >= DEAD_KEPT {
                d.pop_front();
            }
            d.push_back((channel_ as usize, std::thread::current().id(), readers));
        }
        let left: Vec<usize> = {
            let mut s = c.q.lock();
            s.closed = true;
            // SAFETY: our eventfd; nothing reads or writes it once `closed` is set.
            unsafe { libc::close(c.fd()) };
            s.events.drain(..).collect()
        };
        for p in left {
            // SAFETY: events queued by push, never handed out.
            drop(unsafe { Box::from_raw(p as *mut Event) });
        }
        // SAFETY: the box new_channel leaked, freed once (a waiter keeps only `q`).
        drop(unsafe { Box::from_raw(channel_ as *mut Channel) });
    })
}

// ---------------------------------------------------------------------------------
// Events.

#[repr(C)]
struct Event {
    ibv: rdma_cm_event,
    pdata: [u8; 256],
}

fn event(id: *mut rdma_cm_id, kind: rdma_cm_event_type, status: c_int) -> Box<Event> {
    let mut e = Box::new(Event {
        ibv: rdma_cm_event::default(),
        pdata: [0; 256],
    });
    e.ibv.id = id;
    e.ibv.event = kind;
    e.ibv.status = status;
    e
}

impl Event {
    fn set_pdata(&mut self, p: &[u8]) {
        let n = p.len().min(255);
        self.pdata[..n].copy_from_slice(&p[..n]);
        // Writing a union field is safe; conn and ud put private_data and its length
        // at the same offsets, so either reads them.
        self.ibv.param.conn.private_data = self.pdata.as_ptr() as *const c_void;
        self.ibv.param.conn.private_data_len = n as u8;
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_cm_event(
    channel_: *mut rdma_event_channel,
    ev: *mut *mut rdma_cm_event,
) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        // SAFETY: a channel from rdma_create_event_channel.
        let Some(c) = (unsafe { channel(channel_) }) else {
            let me = std::thread::current().id();
            let waits = dead_channels()
                .iter()
                .any(|d| d.0 == channel_ as usize && d.1 != me && d.2.contains(&me));
            if waits {
                // SAFETY: pause has no arguments.
                unsafe { libc::pause() };
                set_errno(libc::EINTR);
            } else {
                set_errno(libc::EINVAL);
            }
            return -1;
        };
        if ev.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        {
            let me = std::thread::current().id();
            let mut r = c.readers.lock().unwrap_or_else(|e| e.into_inner());
            if !r.contains(&me) && r.len() < 16 {
                r.push(me);
            }
        }
        // Counted as handed out before the queue lets go of it: the ID's destroy then
        // waits for its acknowledgement.
        let taken = |e: *mut Event| {
            // SAFETY: an event just taken off the queue; its ID is live (a destroyed
            // ID's events leave the queue first).
            if let Some(i) = unsafe { cm_id((*e).ibv.id) } {
                i.st().unacked += 1;
            }
        };
        match c.pop(taken) {
            Ok(e) => {
                // SAFETY: the caller's out-pointer; `e` a live event, `ibv` first.
                unsafe { *ev = e as *mut rdma_cm_event };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if ev.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: an event from rdma_get_cm_event, acknowledged once.
        let e = unsafe { Box::from_raw(ev as *mut Event) };
        // SAFETY: an ID of ours.
        if let Some(i) = unsafe { cm_id(e.ibv.id) } {
            let mut s = i.st();
            s.unacked = s.unacked.saturating_sub(1);
            i.acked.notify_all();
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------------------------
// IDs.

#[repr(C)]
pub(crate) struct Id {
    ibv: UnsafeCell<rdma_cm_id>,
    st: Mutex<IdState>,
    acked: Condvar,
}

// SAFETY: `ibv` is written by the calls on this ID (the program serialises those, as
// with librdmacm) and by the dispatcher only before the event that hands it out.
unsafe impl Sync for Id {}
// SAFETY: as above.
unsafe impl Send for Id {}

#[derive(Default)]
struct IdState {
    /// The device the ID is bound to, and its shared context.
    hub: Option<Arc<Hub>>,
    dev: String,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    dmac: Option<[u8; 6]>,
    sgid_index: u8,
    /// The engine's connection (or SIDR request) ID.
    conn: Option<u32>,
    /// Listening: (device, service ID) pairs.
    listens: Vec<(Arc<Hub>, u64)>,
    /// What the peer's REQ or REP said.
    remote_qpn: u32,
    remote_psn: u32,
    remote_mtu: Option<crate::verbs::Mtu>,
    retry_count: u8,
    rnr_retry_count: u8,
    /// Our side's: READs/atomics we answer at once, and issue at once.
    responder_resources: u8,
    initiator_depth: u8,
    psn: u32,
    tos: u8,
    ack_timeout: Option<u8>,
    /// Synchronous: the ID's own channel, and calls wait for their events.
    sync: bool,
    /// Events handed out and not yet acknowledged.
    unacked: usize,
    /// The REP's private data, for the active side's ESTABLISHED.
    rep_pdata: Vec<u8>,
    /// rdma_create_ep on a passive ID: what rdma_get_request makes each QP with.
    ep_attr: Option<(usize, ibv_qp_init_attr)>,
    /// CQs and channels rdma_create_qp made (destroyed with the QP).
    own_cqs: bool,
    /// The QP rdma_create_qp made, by number (the dispatcher stops it on a DREQ without
    /// touching the program's pointer, which the program may free at any time).
    qpn: Option<u32>,
    path: Box<ibv_sa_path_rec>,
    connected: bool,
}

impl Id {
    fn st(&self) -> std::sync::MutexGuard<'_, IdState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn raw(&self) -> *mut rdma_cm_id {
        self.ibv.get()
    }
    fn ps(&self) -> rdma_port_space {
        // SAFETY: set at creation.
        unsafe { (*self.ibv.get()).ps }
    }
    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the program's own ID.
        unsafe { (*self.ibv.get()).qp }
    }
    fn channel(&self) -> Option<&Channel> {
        // SAFETY: the ID's channel outlives it (its destroy is refused before).
        unsafe { channel((*self.ibv.get()).channel) }
    }
    fn push(&self, e: Box<Event>) {
        if let Some(c) = self.channel() {
            c.push(e);
        }
    }
}

/// # Safety
/// `i` is NULL or an ID from `rdma_create_id` (or a CONNECT_REQUEST), not destroyed.
unsafe fn cm_id<'a>(i: *mut rdma_cm_id) -> Option<&'a Id> {
    // A pointer that is not a live ID of ours (a program's error path passing garbage)
    // is refused, rather than dereferenced.
    if i.is_null() || !registry().ids.contains(&(i as usize)) {
        return None;
    }
    // SAFETY: a live ID (in the registry until rdma_destroy_id); `ibv` is the first
    // field of the repr(C) Id.
    Some(unsafe { &*(i as *const Id) })
}

fn new_id(
    channel_: *mut rdma_event_channel,
    context_: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> Result<&'static Id, c_int> {
    let (ch, sync) = if channel_.is_null() {
        (new_channel()?, true)
    } else {
        (channel_, false)
    };
    // SAFETY: a live channel (the caller's or the one just made).
    if let Some(c) = unsafe { channel(ch) } {
        *c.users.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }
    let ibv = rdma_cm_id {
        channel: ch,
        context: context_,
        ps,
        port_num: 1,
        qp_type,
        ..Default::default()
    };
    let id = Box::leak(Box::new(Id {
        ibv: UnsafeCell::new(ibv),
        st: Mutex::new(IdState {
            sync,
            psn: random_psn(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        }),
        acked: Condvar::new(),
    }));
    registry().ids.insert(id.raw() as usize);
    Ok(id)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_id(
    channel_: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context_: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard("rdma_create_id", -1, || {
        super::init_logging();
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return fail(libc::EINVAL),
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match new_id(channel_, context_, ps, qp_type) {
            Ok(i) => {
                // SAFETY: the caller's out-pointer.
                unsafe { *id = i.raw() };
                0
            }
            Err(e) => fail(e),
        }
    })
}

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        // Its undelivered events go, as the kernel's ucma drops them; so do connection
        // requests a listener never handed out, with their IDs (the CM rejects them).
        // Once now, and once more when the dispatcher can add none (it may have queued
        // one in between); the children are destroyed outside the dispatcher's lock.
        let drop_queued = |i: &Id| -> Vec<*mut rdma_cm_id> {
            let queued = i
                .channel()
                .map(|c| c.q.remove(|e| e.ibv.id == id || e.ibv.listen_id == id))
                .unwrap_or_default();
            queued
                .iter()
                .filter(|e| e.ibv.id != id && e.ibv.event == RDMA_CM_EVENT_CONNECT_REQUEST)
                .map(|e| e.ibv.id)
                .collect()
        };
        for child in drop_queued(i) {
            rdma_destroy_id(child);
        }
        let (hub, conn, listens) = {
            let mut s = i.st();
            // librdmacm waits for the ID's events to be acknowledged.
            while s.unacked > 0 && !s.sync {
                s = i.acked.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            (s.hub.clone(), s.conn.take(), std::mem::take(&mut s.listens))
        };
        let late = {
            // No event is being turned into one for this ID while it goes away.
            let _quiet = DISPATCHING.lock().unwrap_or_else(|e| e.into_inner());
            unregister(i);
            for (h, sid) in listens {
                let _ = h.rt.cm_unlisten(sid);
            }
            if let (Some(h), Some(c)) = (hub, conn) {
                let _ = h.rt.cm_destroy(c);
            }
            drop_queued(i)
        };
        for child in late {
            rdma_destroy_id(child);
        }
        // The channel outlives its IDs (its destroy is refused while they exist).
        if let Some(c) = i.channel() {
            let n = {
                let mut u = c.users.lock().unwrap_or_else(|e| e.into_inner());
                *u = u.saturating_sub(1);
                *u
            };
            if i.st().sync && n == 0 {
                // SAFETY: the ID's private channel.
                rdma_destroy_event_channel(unsafe { (*i.raw()).channel });
            }
        }
        // SAFETY: the box new_id leaked; the program is done with the ID.
        drop(unsafe { Box::from_raw(id as *mut Id) });
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel_: *mut rdma_event_channel) -> c_int {
    guard("rdma_migrate_id", -1, || {
        // SAFETY: an ID of ours, a channel of ours.
        let (Some(i), Some(new)) = (unsafe { cm_id(id) }, unsafe { channel(channel_) }) else {
            return fail(libc::EINVAL);
        };
        if let Some(old) = i.channel() {
            // Events already queued on the old channel stay there, as with librdmacm
            // (which moves them in the kernel); programs migrate idle IDs.
            let mut u = old.users.lock().unwrap_or_else(|e| e.into_inner());
            *u = u.saturating_sub(1);
        }
        *new.users.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        // SAFETY: the program's ID; it serialises calls on it.
        unsafe { (*i.raw()).channel = channel_ };
        i.st().sync = false;
        0
    })
}

// ---------------------------------------------------------------------------------
// Addresses.

/// # Safety
/// `a` is NULL or a sockaddr of its family's size.
unsafe fn sockaddr_in(a: *const sockaddr) -> Option<SocketAddr> {
    if a.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    match unsafe { (*a).sa_family } as i32 {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let s = unsafe { &*(a as *const libc::sockaddr_in) };
            Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let s = unsafe { &*(a as *const libc::sockaddr_in6) };
            Some(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => None,
    }
}

/// Writes `a` into a 128-byte sockaddr_storage.
fn put_sockaddr(dst: *mut sockaddr_storage, a: SocketAddr) {
    // SAFETY: `dst` is a sockaddr_storage inside one of our IDs.
    unsafe {
        std::ptr::write_bytes(dst, 0, 1);
        match a {
            SocketAddr::V4(v) => {
                let s = dst as *mut libc::sockaddr_in;
                (*s).sin_family = libc::AF_INET as u16;
                (*s).sin_port = v.port().to_be();
                (*s).sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = dst as *mut libc::sockaddr_in6;
                (*s).sin6_family = libc::AF_INET6 as u16;
                (*s).sin6_port = v.port().to_be();
                (*s).sin6_addr.s6_addr = v.ip().octets();
            }
        }
    }
}

/// Fills the ID's `route` from its state (addresses, GIDs, the path record).
fn fill_route(i: &Id, s: &mut IdState) {
    // SAFETY: the program's own ID; its calls are serialised.
    let r = unsafe { &mut (*i.raw()).route };
    if let Some(a) = s.src {
        // SAFETY: the union's storage member spans it.
        put_sockaddr(unsafe { &mut r.addr.__bindgen_anon_1.src_storage }, a);
        r.addr.addr.ibaddr.sgid.raw = gid_of(a.ip());
    }
    if let Some(a) = s.dst {
        // SAFETY: as above.
        put_sockaddr(unsafe { &mut r.addr.__bindgen_anon_2.dst_storage }, a);
        r.addr.addr.ibaddr.dgid.raw = gid_of(a.ip());
    }
    r.addr.addr.ibaddr.pkey = 0xffffu16.to_be();
    if s.dst.is_some() {
        let p = &mut *s.path;
        p.dgid.raw = gid_of(
            s.dst
                .map(|d| d.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        );
        p.sgid.raw = gid_of(
            s.src
                .map(|d| d.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        );
        p.pkey = 0xffffu16.to_be();
        p.hop_limit = 64;
        p.mtu = s
            .hub
            .as_ref()
            .map_or(IBV_MTU_1024 as u8, |h| h.rt.info().port_mtu as u8);
        p.traffic_class = s.tos;
        p.reversible = 1;
        p.numb_path = 1;
        r.path_rec = &mut *s.path;
        r.num_paths = 1;
    }
}

/// The device (started if need be) whose interface holds `ip`, its context, and the
/// GID index of `ip` on it.
fn device_of(ip: IpAddr) -> Result<(Arc<Hub>, String, u8), c_int> {
    let want = gid_of(ip);
    for l in crate::links::devices() {
        let owns = crate::host::Interface::find(&l.netdev)
            .and_then(|i| i.addresses())
            .is_ok_and(|a| a.contains(&ip));
        if !owns {
            continue;
        }
        let ctx = shared_context(&l.name, &l)?;
        // SAFETY: a context we opened and keep open.
        let hub = unsafe { context(ctx) }.ok_or(libc::ENODEV)?.hub.clone();
        let idx = hub
            .rt
            .info()
            .gids
            .iter()
            .position(|g| *g == want)
            .ok_or(libc::EADDRNOTAVAIL)?;
        return Ok((hub, l.name, idx as u8));
    }
    Err(libc::EADDRNOTAVAIL)
}

/// One context per device for all IDs, as librdmacm keeps one (never closed: the
/// engine stops at exit).
static CONTEXTS: Mutex<Vec<(String, usize)>> = Mutex::new(Vec::new());

fn shared_context(name: &str, l: &crate::links::Link) -> Result<*mut ibv_context, c_int> {
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = all.iter().find(|(n, _)| n == name) {
        return Ok(*c as *mut ibv_context);
    }
    let ctx = super::device::ibv_open_device(device_for(l));
    if ctx.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENODEV));
    }
    if all.is_empty() {
        // librdmacm's contexts live until exit; the engines then stop as at
        // ibv_close_device (the capture written out, the XDP program detached).
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(stop_engines) };
    }
    all.push((name.to_string(), ctx as usize));
    Ok(ctx)
}

extern "C" fn stop_engines() {
    guard("rdma_cm exit", (), || {
        let all: Vec<usize> = CONTEXTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, c)| *c)
            .collect();
        for c in all {
            // SAFETY: contexts in CONTEXTS stay open until now.
            if let Some(c) = unsafe { context(c as *mut ibv_context) } {
                c.hub.rt.cm_linger(Duration::from_secs(2));
                c.hub.rt.shutdown();
            }
        }
    })
}

fn context_of(dev: &str) -> *mut ibv_context {
    CONTEXTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(n, _)| n == dev)
        .map_or(null_mut(), |(_, c)| *c as *mut ibv_context)
}

/// The source address the kernel's routing picks towards `dst`.
fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect((dst, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

fn bind(i: &Id, a: SocketAddr) -> Result<(), c_int> {
    let mut s = i.st();
    if !a.ip().is_unspecified() {
        let (hub, dev, idx) = device_of(a.ip())?;
        // SAFETY: the program's own ID.
        unsafe { (*i.raw()).verbs = context_of(&dev) };
        s.hub = Some(hub);
        s.dev = dev;
        s.sgid_index = idx;
    }
    let port = if a.port() == 0 {
        ephemeral_port()
    } else {
        a.port()
    };
    s.src = Some(SocketAddr::new(a.ip(), port));
    fill_route(i, &mut s);
    Ok(())
}

fn ephemeral_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (32768 + ((std::process::id() * 97 + n) % 28000)) as u16
}

fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom into a 4-byte buffer.
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut c_void, 4, 0) };
    u32::from_ne_bytes(b) & 0xff_ffff
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard("rdma_bind_addr", -1, || {
        // SAFETY: an ID of ours; the program's sockaddr.
        let (Some(i), Some(a)) = (unsafe { cm_id(id) }, unsafe { sockaddr_in(addr) }) else {
            return fail(libc::EINVAL);
        };
        match bind(i, a) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", -1, || {
        // SAFETY: an ID of ours; the program's sockaddrs.
        let (Some(i), Some(dst)) = (unsafe { cm_id(id) }, unsafe { sockaddr_in(dst_addr) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: as above.
        let src = unsafe { sockaddr_in(src_addr) };
        let src_ip = match src.map(|s| s.ip()).filter(|s| !s.is_unspecified()) {
            Some(s) => s,
            None => match i.st().src.map(|s| s.ip()).filter(|s| !s.is_unspecified()) {
                Some(s) => s,
                None => match route_source(dst.ip()) {
                    Some(s) => s,
                    None => return fail(libc::ENETUNREACH),
                },
            },
        };
        let port = src.map_or(0, |s| s.port());
        let port = i
            .st()
            .src
            .map_or(port, |s| if port == 0 { s.port() } else { port });
        if let Err(e) = bind(i, SocketAddr::new(src_ip, port)) {
            return fail(e);
        }
        let wait = Duration::from_millis(timeout_ms.clamp(1, 60_000) as u64);
        let Some(hub) = i.st().hub.clone() else {
            return fail(libc::EADDRNOTAVAIL);
        };
        // The next hop's MAC: ourselves, or what the kernel's neighbour table says.
        let mac = if hub.rt.info().gids.contains(&gid_of(dst.ip())) {
            Some(hub.rt.info().mac)
        } else {
            crate::host::resolve_neighbor_on(&hub.rt.netdevs(), dst.ip(), wait)
        };
        let mut s = i.st();
        s.dst = Some(dst);
        fill_route(i, &mut s);
        let ev = match mac {
            Some(m) => {
                s.dmac = Some(m);
                let _ = hub.rt.set_neighbor(dst.ip(), m);
                event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0)
            }
            None => event(id, RDMA_CM_EVENT_ADDR_ERROR, -libc::EHOSTUNREACH),
        };
        let sync = s.sync;
        drop(s);
        deliver(i, ev, sync)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        let mut s = i.st();
        if s.dmac.is_none() {
            return fail(libc::EINVAL);
        }
        // RoCE has no SA: the path is the resolved address (as the kernel's
        // cma_resolve_iboe_route builds it).
        fill_route(i, &mut s);
        let sync = s.sync;
        drop(s);
        deliver(i, event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0), sync)
    })
}

/// Queues an event for the program; a synchronous ID instead takes it at once and
/// fails the call with its status, as librdmacm's `ucma_complete` does.
fn deliver(i: &Id, ev: Box<Event>, sync: bool) -> c_int {
    let status = ev.ibv.status;
    if sync {
        drop(ev);
        return if status == 0 { 0 } else { fail(-status) };
    }
    i.push(ev);
    0
}

// ---------------------------------------------------------------------------------
// QPs.

/// Moves `qp` to `state` with `attr` (the state set here) and `mask`.
fn modify(qp: *mut ibv_qp, mut attr: ibv_qp_attr, mask: u32) -> Result<(), c_int> {
    let r = super::qp::ibv_modify_qp(qp, &mut attr, mask as c_int);
    if r != 0 { Err(r) } else { Ok(()) }
}

fn init_qp(i: &Id, qp: *mut ibv_qp) -> Result<(), c_int> {
    let ud = i.ps() == RDMA_PS_UDP || i.ps() == RDMA_PS_IPOIB;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        ..Default::default()
    };
    if ud {
        a.qkey = RDMA_UDP_QKEY;
        modify(
            qp,
            a,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        )?;
        // As librdmacm's ucma_init_ud_qp: a UD QP is ready at once.
        a.qp_state = IBV_QPS_RTR;
        modify(qp, a, IBV_QP_STATE)?;
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0;
        modify(qp, a, IBV_QP_STATE | IBV_QP_SQ_PSN)
    } else {
        let (a, mask) = qp_attr_for(&i.st(), IBV_QPS_INIT)?;
        modify(qp, a, mask)
    }
}

/// The attributes and mask that take a connection's QP to `state` (INIT, RTR or RTS)
/// with what the two sides agreed: what `rdma_init_qp_attr` reports, and what
/// rdma_connect/rdma_accept apply (the kernel's `ib_cm_init_qp_attr`, with rdma_cm's
/// own PSN as the receive PSN).
fn qp_attr_for(s: &IdState, state: ibv_qp_state) -> Result<(ibv_qp_attr, u32), c_int> {
    let mut a = ibv_qp_attr {
        qp_state: state,
        ..Default::default()
    };
    let mask = match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        }
        IBV_QPS_RTR => {
            let hub = s.hub.as_ref().ok_or(libc::EINVAL)?;
            let dst = s.dst.ok_or(libc::EINVAL)?;
            let port_mtu = hub.rt.info().port_mtu;
            a.path_mtu = s.remote_mtu.map_or(port_mtu, |m| m.min(port_mtu)) as u32;
            a.dest_qp_num = s.remote_qpn;
            // Our own PSN, the one our REQ or REP announced (see ConnectParams).
            a.rq_psn = s.psn;
            a.max_dest_rd_atomic = s.responder_resources;
            a.min_rnr_timer = 12;
            a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            if s.responder_resources > 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            }
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid.raw = gid_of(dst.ip());
            a.ah_attr.grh.sgid_index = s.sgid_index;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = s.tos;
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_ACCESS_FLAGS
        }
        IBV_QPS_RTS => {
            a.timeout = s.ack_timeout.unwrap_or(ACK_TIMEOUT);
            a.retry_cnt = s.retry_count;
            a.rnr_retry = s.rnr_retry_count;
            // The peer's PSN: the one it expects.
            a.sq_psn = s.remote_psn;
            a.max_rd_atomic = s.initiator_depth;
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((a, mask))
}

/// RTR then RTS with what the connection's two sides agreed.
fn connect_qp(i: &Id, qp: *mut ibv_qp) -> Result<(), c_int> {
    for state in [IBV_QPS_RTR, IBV_QPS_RTS] {
        let (a, mask) = qp_attr_for(&i.st(), state)?;
        modify(qp, a, mask)?;
    }
    Ok(())
}

fn qp_to_err(qp: *mut ibv_qp) {
    if !qp.is_null() {
        let a = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        let _ = modify(qp, a, IBV_QP_STATE);
    }
}

/// The default PD of a device, for `rdma_create_qp(id, NULL, ...)` and endpoints.
fn default_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    static PDS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut all = PDS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = all.iter().find(|(c, _)| *c == ctx as usize) {
        return *p as *mut ibv_pd;
    }
    let pd = super::mr::ibv_alloc_pd(ctx);
    if !pd.is_null() {
        all.push((ctx as usize, pd as usize));
    }
    pd
}

fn create_qp(i: &Id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    // SAFETY: the program's own ID.
    let ctx = unsafe { (*i.raw()).verbs };
    if ctx.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if pd.is_null() { default_pd(ctx) } else { pd };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    let mut own = false;
    // As librdmacm's ucma_create_cqs: CQs (with channels) the program did not give.
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        own = true;
        let mk = |depth: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
            let ch = super::cq::ibv_create_comp_channel(ctx);
            if ch.is_null() {
                return Err(libc::ENOMEM);
            }
            let cq = super::cq::ibv_create_cq(ctx, depth.max(1) as c_int, null_mut(), ch, 0);
            if cq.is_null() {
                super::cq::ibv_destroy_comp_channel(ch);
                return Err(libc::ENOMEM);
            }
            Ok((ch, cq))
        };
        if attr.recv_cq.is_null() {
            let (ch, cq) = mk(attr.cap.max_recv_wr)?;
            // SAFETY: the program's own ID.
            unsafe {
                (*i.raw()).recv_cq_channel = ch;
                (*i.raw()).recv_cq = cq;
            }
            attr.recv_cq = cq;
        }
        if attr.send_cq.is_null() {
            let (ch, cq) = mk(attr.cap.max_send_wr)?;
            // SAFETY: as above.
            unsafe {
                (*i.raw()).send_cq_channel = ch;
                (*i.raw()).send_cq = cq;
            }
            attr.send_cq = cq;
        }
    } else {
        // SAFETY: as above.
        unsafe {
            (*i.raw()).send_cq = attr.send_cq;
            (*i.raw()).recv_cq = attr.recv_cq;
        }
    }
    let qp = super::qp::ibv_create_qp(pd, attr);
    if qp.is_null() {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL));
    }
    if let Err(e) = init_qp(i, qp) {
        super::qp::ibv_destroy_qp(qp);
        return Err(e);
    }
    // SAFETY: as above.
    unsafe {
        (*i.raw()).qp = qp;
        (*i.raw()).pd = pd;
        (*i.raw()).srq = attr.srq;
    }
    let mut s = i.st();
    s.own_cqs = own;
    // SAFETY: the QP just created.
    s.qpn = Some(unsafe { (*qp).qp_num });
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_qp", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        if qp_init_attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the program's attributes; written back as librdmacm does (caps, CQs).
        let attr = unsafe { &mut *qp_init_attr };
        match create_qp(i, pd, attr) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    guard("rdma_create_qp_ex", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        if attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the program's attributes.
        let x = unsafe { &mut *attr };
        let extra = x.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS);
        if extra != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        let mut a = ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        };
        let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            x.pd
        } else {
            null_mut()
        };
        match create_qp(i, pd, &mut a) {
            Ok(()) => {
                x.cap = a.cap;
                0
            }
            Err(e) => fail(e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", (), || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return;
        };
        let qp = i.qp();
        if !qp.is_null() {
            super::qp::ibv_destroy_qp(qp);
        }
        i.st().qpn = None;
        // SAFETY: the program's own ID.
        let r = unsafe { &mut *i.raw() };
        r.qp = null_mut();
        if i.st().own_cqs {
            for (cq, ch) in [
                (r.send_cq, r.send_cq_channel),
                (r.recv_cq, r.recv_cq_channel),
            ] {
                if !cq.is_null() {
                    super::cq::ibv_destroy_cq(cq);
                }
                if !ch.is_null() {
                    super::cq::ibv_destroy_comp_channel(ch);
                }
            }
            r.send_cq = null_mut();
            r.recv_cq = null_mut();
            r.send_cq_channel = null_mut();
            r.recv_cq_channel = null_mut();
            i.st().own_cqs = false;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard("rdma_init_qp_attr", -1, || {
        // SAFETY: an ID of ours; the program's out-pointers.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: as above.
        let want = unsafe { (*qp_attr).qp_state };
        let (attr, mask) = match qp_attr_for(&i.st(), want) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        // SAFETY: the program's out-pointers.
        unsafe {
            *qp_attr = attr;
            *qp_attr_mask = mask as c_int;
        }
        0
    })
}

// ---------------------------------------------------------------------------------
// Connecting.

fn service_id(ps: rdma_port_space, port: u16) -> u64 {
    (u64::from(ps) << 16) | u64::from(port)
}

/// The rdma_cm header and the program's private data, as a REQ carries them.
fn req_pdata(src: SocketAddr, dst: SocketAddr, user: &[u8]) -> Vec<u8> {
    let h = CmaHeader {
        cma_version: 0,
        ip_version: if dst.is_ipv4() { 4 } else { 6 },
        src_port: src.port(),
        src: src.ip(),
        dst: dst.ip(),
    };
    let mut p = vec![0u8; CMA_HDR];
    let _ = h.emit(&mut p);
    p.extend_from_slice(user);
    p
}

/// # Safety
/// `p` is NULL or a conn param whose private data has `private_data_len` bytes.
unsafe fn user_pdata(p: *const rdma_conn_param) -> Vec<u8> {
    if p.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    let p = unsafe { &*p };
    if p.private_data.is_null() || p.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: as above.
    unsafe {
        std::slice::from_raw_parts(p.private_data as *const u8, usize::from(p.private_data_len))
    }
    .to_vec()
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    guard("rdma_connect", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: the program's conn param.
        let user = unsafe { user_pdata(conn_param) };
        let mut s = i.st();
        let (Some(hub), Some(src), Some(dst)) = (s.hub.clone(), s.src, s.dst) else {
            return fail(libc::EINVAL);
        };
        if s.dmac.is_none() {
            return fail(libc::EINVAL);
        }
        let pdata = req_pdata(src, dst, &user);
        let sid = service_id(i.ps(), dst.port());
        tracing::debug!("rdma_cm: connecting {src} -> {dst} (service ID 0x{sid:016x})");
        let ud = i.ps() == RDMA_PS_UDP || i.ps() == RDMA_PS_IPOIB;
        // The registry stays locked until the connection is in it: the REP may come
        // back before cm_connect returns, and the dispatcher must find its ID.
        let mut reg = registry();
        let timing = cm_timing();
        let r = if ud {
            if pdata.len() > crate::wire::cm::SIDR_REQ_PDATA {
                return fail(libc::EINVAL);
            }
            hub.rt.cm_sidr_request(SidrParams {
                service_id: sid,
                dgid: gid_of(dst.ip()),
                sgid_index: s.sgid_index,
                dmac: s.dmac,
                cm_response_timeout: timing.0,
                max_cm_retries: timing.1,
                private_data: pdata,
            })
        } else {
            if pdata.len() > crate::wire::cm::REQ_PDATA {
                return fail(libc::EINVAL);
            }
            let qp = i.qp();
            let qpn = if !qp.is_null() {
                // SAFETY: the ID's QP.
                unsafe { (*qp).qp_num }
            } else if !conn_param.is_null() {
                // SAFETY: the program's conn param.
                unsafe { (*conn_param).qp_num }
            } else {
                return fail(libc::EINVAL);
            };
            if !conn_param.is_null() {
                // SAFETY: as above.
                let c = unsafe { &*conn_param };
                s.responder_resources = c.responder_resources;
                s.initiator_depth = c.initiator_depth;
                s.retry_count = c.retry_count.min(7);
                s.rnr_retry_count = c.rnr_retry_count.min(7);
            }
            let mut p = ConnectParams::new(qpn, sid, gid_of(dst.ip()), s.sgid_index);
            p.starting_psn = s.psn;
            p.dmac = s.dmac;
            p.traffic_class = s.tos;
            p.path_mtu = hub.rt.info().port_mtu;
            p.responder_resources = s.responder_resources;
            p.initiator_depth = s.initiator_depth;
            p.retry_count = s.retry_count;
            p.rnr_retry_count = s.rnr_retry_count;
            p.srq = !conn_param.is_null()
                // SAFETY: as above.
                && unsafe { (*conn_param).srq } != 0;
            p.local_ack_timeout = s.ack_timeout.unwrap_or(ACK_TIMEOUT);
            (p.cm_response_timeout, p.max_cm_retries) = timing;
            p.private_data = pdata;
            hub.rt.cm_connect(p)
        };
        let conn = match r {
            Ok(c) => c,
            Err(e) => return fail(errno_of_rt(&e)),
        };
        reg.conns
            .insert((s.dev.clone(), conn), i as *const Id as usize);
        drop(reg);
        s.conn = Some(conn);
        let sync = s.sync;
        drop(s);
        if sync {
            return wait_for(i, &[RDMA_CM_EVENT_ESTABLISHED]);
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard("rdma_listen", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        let Some(src) = i.st().src else {
            return fail(libc::EINVAL);
        };
        let sid = service_id(i.ps(), src.port());
        tracing::debug!("rdma_cm: listening on {src} (service ID 0x{sid:016x})");
        // A wildcard address listens on every device, as the kernel's does.
        let mut hubs = Vec::new();
        if src.ip().is_unspecified() {
            for l in crate::links::devices() {
                let Ok(ctx) = shared_context(&l.name, &l) else {
                    continue;
                };
                // SAFETY: a context we keep open.
                if let Some(c) = unsafe { context(ctx) } {
                    hubs.push((c.hub.clone(), l.name.clone()));
                }
            }
        } else {
            let (hub, dev) = {
                let s = i.st();
                (s.hub.clone(), s.dev.clone())
            };
            if let Some(h) = hub {
                hubs.push((h, dev));
            }
        }
        if hubs.is_empty() {
            return fail(libc::ENODEV);
        }
        // Registered before the engines listen: a REQ may arrive the moment one does,
        // and the dispatcher must find whom it is for.
        let me = i as *const Id as usize;
        registry()
            .listeners
            .extend(hubs.iter().map(|(_, dev)| (dev.clone(), sid, me)));
        let mut done: Vec<(Arc<Hub>, String)> = Vec::new();
        for (h, dev) in hubs {
            if let Err(e) = h.rt.cm_listen(sid) {
                for (h, _) in &done {
                    let _ = h.rt.cm_unlisten(sid);
                }
                registry().listeners.retain(|l| l.2 != me);
                return fail(match errno_of_rt(&e) {
                    libc::EBUSY => libc::EADDRINUSE,
                    x => x,
                });
            }
            done.push((h, dev));
        }
        i.st().listens = done.into_iter().map(|(h, _)| (h, sid)).collect();
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: the program's conn param.
        let user = unsafe { user_pdata(conn_param) };
        let s = i.st();
        let (Some(hub), Some(conn)) = (s.hub.clone(), s.conn) else {
            return fail(libc::EINVAL);
        };
        let sync = s.sync;
        drop(s);
        let ud = i.ps() == RDMA_PS_UDP || i.ps() == RDMA_PS_IPOIB;
        if ud {
            let qp = i.qp();
            let (qpn, qkey) = if !qp.is_null() {
                // SAFETY: the ID's QP.
                (unsafe { (*qp).qp_num }, RDMA_UDP_QKEY)
            } else if !conn_param.is_null() {
                // SAFETY: the program's conn param.
                (unsafe { (*conn_param).qp_num }, RDMA_UDP_QKEY)
            } else {
                return fail(libc::EINVAL);
            };
            return match hub.rt.cm_sidr_reply(conn, 0, qpn, qkey, user) {
                Ok(()) => 0,
                Err(e) => fail(errno_of_rt(&e)),
            };
        }
        if i.st().connected {
            // The active side after CONNECT_RESPONSE (no QP of the ID's): the RTU.
            return match hub.rt.cm_establish(conn, user) {
                Ok(()) => 0,
                Err(e) => fail(errno_of_rt(&e)),
            };
        }
        {
            let mut s = i.st();
            if !conn_param.is_null() {
                // SAFETY: as above.
                let c = unsafe { &*conn_param };
                // What we answer at once may not exceed what the peer asked to issue.
                s.responder_resources = c.responder_resources.min(s.responder_resources);
                s.initiator_depth = c.initiator_depth.min(s.initiator_depth);
                s.rnr_retry_count = c.rnr_retry_count.min(7);
            }
        }
        let qp = i.qp();
        let qpn = if !qp.is_null() {
            if let Err(e) = connect_qp(i, qp) {
                let _ = hub.rt.cm_reject(conn, reason::CONSUMER_REJECT, Vec::new());
                return fail(e);
            }
            // SAFETY: the ID's QP.
            unsafe { (*qp).qp_num }
        } else if !conn_param.is_null() {
            // SAFETY: as above.
            unsafe { (*conn_param).qp_num }
        } else {
            return fail(libc::EINVAL);
        };
        let s = i.st();
        let p = AcceptParams {
            qpn,
            starting_psn: s.psn,
            responder_resources: s.responder_resources,
            initiator_depth: s.initiator_depth,
            rnr_retry_count: s.rnr_retry_count,
            srq: !i.qp().is_null()
                // SAFETY: the ID's QP.
                && !unsafe { (*i.qp()).srq }.is_null(),
            private_data: user,
        };
        drop(s);
        if let Err(e) = hub.rt.cm_accept(conn, p) {
            return fail(errno_of_rt(&e));
        }
        if sync {
            return wait_for(i, &[RDMA_CM_EVENT_ESTABLISHED]);
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        let s = i.st();
        let (Some(hub), Some(conn)) = (s.hub.clone(), s.conn) else {
            return fail(libc::EINVAL);
        };
        drop(s);
        match hub.rt.cm_establish(conn, Vec::new()) {
            Ok(()) => 0,
            Err(e) => fail(errno_of_rt(&e)),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        let user = if private_data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: the program's `len` bytes.
            unsafe { std::slice::from_raw_parts(private_data as *const u8, usize::from(len)) }
                .to_vec()
        };
        let s = i.st();
        let (Some(hub), Some(conn)) = (s.hub.clone(), s.conn) else {
            return fail(libc::EINVAL);
        };
        drop(s);
        let ud = i.ps() == RDMA_PS_UDP || i.ps() == RDMA_PS_IPOIB;
        let r = if ud {
            hub.rt
                .cm_sidr_reply(conn, crate::engine::cm::sidr_status::REJECTED, 0, 0, user)
        } else {
            hub.rt.cm_reject(conn, reason::CONSUMER_REJECT, user)
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail(errno_of_rt(&e)),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        // As librdmacm: the QP stops first (ERR flushes its work requests).
        qp_to_err(i.qp());
        let s = i.st();
        let (Some(hub), Some(conn)) = (s.hub.clone(), s.conn) else {
            return fail(libc::EINVAL);
        };
        drop(s);
        // After the peer's DREQ the CM has answered already; that is not an error.
        let _ = hub.rt.cm_disconnect(conn, Vec::new());
        0
    })
}

/// A synchronous ID's call: waits for one of `want` (failing on any other event).
fn wait_for(i: &Id, want: &[rdma_cm_event_type]) -> c_int {
    let Some(c) = i.channel() else {
        return fail(libc::EINVAL);
    };
    loop {
        let e = match c.pop(|_| ()) {
            Ok(e) => e,
            Err(libc::EAGAIN) => continue,
            Err(e) => return fail(e),
        };
        // SAFETY: an event of ours, taken off the queue.
        let e = unsafe { Box::from_raw(e) };
        if want.contains(&e.ibv.event) && e.ibv.status == 0 {
            return 0;
        }
        let err = match e.ibv.event {
            RDMA_CM_EVENT_REJECTED => libc::ECONNREFUSED,
            RDMA_CM_EVENT_UNREACHABLE => libc::ETIMEDOUT,
            _ if e.ibv.status < 0 => -e.ibv.status,
            _ => libc::ECONNABORTED,
        };
        return fail(err);
    }
}

// ---------------------------------------------------------------------------------
// Routing the engine's CM events to IDs.

#[derive(Default)]
struct Registry {
    /// Every live ID.
    ids: std::collections::HashSet<usize>,
    /// (device, engine connection ID) -> ID.
    conns: HashMap<(String, u32), usize>,
    /// (device, service ID, listening ID).
    listeners: Vec<(String, u64, usize)>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn register(dev: &str, conn: u32, i: &Id) {
    registry()
        .conns
        .insert((dev.to_string(), conn), i as *const Id as usize);
}

fn unregister(i: &Id) {
    let p = i as *const Id as usize;
    let mut g = registry();
    g.ids.remove(&p);
    g.conns.retain(|_, v| *v != p);
    g.listeners.retain(|l| l.2 != p);
}

/// The hook every device's engine calls with its CM events (from the thread running
/// the data path): hands them to the dispatcher thread.
pub(crate) fn on_engine_event(dev: &str, e: CmEvent) {
    let _ = dispatcher().send((dev.to_string(), e));
}

/// Starts the dispatcher thread, from the thread opening a device: started by the first
/// CM event instead, it would inherit the affinity, scheduling policy and signal mask
/// of whichever thread delivered it, a program's polling thread among them.
pub(crate) fn start_dispatcher() {
    let _ = dispatcher();
}

/// The channel to the thread that turns engine CM events into rdma_cm events.
fn dispatcher() -> &'static crossbeam::channel::Sender<(String, CmEvent)> {
    static TX: OnceLock<crossbeam::channel::Sender<(String, CmEvent)>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = crossbeam::channel::unbounded::<(String, CmEvent)>();
        let _ = std::thread::Builder::new()
            .name("roce-xdp-cm".into())
            .spawn(move || {
                while let Ok((dev, e)) = rx.recv() {
                    let _busy = DISPATCHING.lock().unwrap_or_else(|e| e.into_inner());
                    guard("rdma_cm events", (), || dispatch(&dev, e));
                }
            });
        tx
    })
}

/// Held while the dispatcher turns an event into one for an ID, and while an ID is
/// destroyed: an ID the dispatcher found stays alive until it is done with it.
static DISPATCHING: Mutex<()> = Mutex::new(());

fn lookup(dev: &str, conn: u32) -> Option<&'static Id> {
    let p = *registry().conns.get(&(dev.to_string(), conn))?;
    // SAFETY: registered IDs are live until rdma_destroy_id unregisters them.
    Some(unsafe { &*(p as *const Id) })
}

fn dispatch(dev: &str, e: CmEvent) {
    tracing::debug!("rdma_cm: {dev}: {e:?}");
    match e {
        CmEvent::ConnectRequest { id, req } => {
            let hub = hub_of(dev);
            let Some(hub) = hub else {
                return;
            };
            let Some(l) = listener_of(dev, req.service_id) else {
                let _ = hub.rt.cm_reject(id, reason::INVALID_SERVICE_ID, Vec::new());
                return;
            };
            let Ok(child) = child_of(l) else {
                let _ = hub.rt.cm_reject(id, reason::CONSUMER_REJECT, Vec::new());
                return;
            };
            let (src, dst) = match req.cma {
                Some(h) => (
                    SocketAddr::new(h.dst, l.st().src.map_or(0, |s| s.port())),
                    SocketAddr::new(h.src, h.src_port),
                ),
                None => (
                    SocketAddr::new(ip_of(&req.local_gid), 0),
                    SocketAddr::new(ip_of(&req.remote_gid), 0),
                ),
            };
            let sgid = hub
                .rt
                .info()
                .gids
                .iter()
                .position(|g| *g == gid_of(src.ip()))
                .unwrap_or(1) as u8;
            if let Some(m) = req.remote_mac {
                let _ = hub.rt.set_neighbor(dst.ip(), m);
            }
            {
                let mut s = child.st();
                s.sync = l.st().sync;
                s.hub = Some(hub.clone());
                s.dev = dev.to_string();
                s.src = Some(src);
                s.dst = Some(dst);
                s.dmac = req.remote_mac;
                s.sgid_index = sgid;
                s.conn = Some(id);
                s.remote_qpn = req.remote_qpn;
                s.remote_psn = req.starting_psn;
                s.remote_mtu = req.path_mtu;
                s.retry_count = req.retry_count;
                s.rnr_retry_count = req.rnr_retry_count;
                // Ours: answer as many READs as the peer issues, issue as many as it answers.
                s.responder_resources = req.initiator_depth;
                s.initiator_depth = req.responder_resources;
                fill_route(child, &mut s);
            }
            // SAFETY: the child is not handed out yet.
            unsafe { (*child.raw()).verbs = context_of(dev) };
            register(dev, id, child);
            let mut ev = event(child.raw(), RDMA_CM_EVENT_CONNECT_REQUEST, 0);
            ev.ibv.listen_id = l.raw();
            let user = req.private_data.get(CMA_HDR..).unwrap_or(&[]);
            ev.set_pdata(user);
            // SAFETY: the conn member of a fresh event.
            unsafe {
                let c = &mut ev.ibv.param.conn;
                c.responder_resources = req.initiator_depth;
                c.initiator_depth = req.responder_resources;
                c.flow_control = 1;
                c.retry_count = req.retry_count;
                c.rnr_retry_count = req.rnr_retry_count;
                c.srq = u8::from(req.srq);
                c.qp_num = req.remote_qpn;
            }
            l.push(ev);
        }
        CmEvent::SidrRequest {
            id,
            service_id,
            remote_gid,
            private_data,
            cma,
        } => {
            let hub = hub_of(dev);
            let (Some(hub), Some(l)) = (hub, listener_of(dev, service_id)) else {
                return;
            };
            let Ok(child) = child_of(l) else {
                return;
            };
            let dst = cma.map_or(SocketAddr::new(ip_of(&remote_gid), 0), |h| {
                SocketAddr::new(h.src, h.src_port)
            });
            let lsrc = l.st().src;
            let src = cma.map_or(lsrc.unwrap_or(dst), |h| {
                SocketAddr::new(h.dst, lsrc.map_or(0, |s| s.port()))
            });
            {
                let mut s = child.st();
                s.hub = Some(hub.clone());
                s.dev = dev.to_string();
                s.src = Some(src);
                s.dst = Some(dst);
                s.conn = Some(id);
                fill_route(child, &mut s);
            }
            // SAFETY: the child is not handed out yet.
            unsafe { (*child.raw()).verbs = context_of(dev) };
            register(dev, id, child);
            let mut ev = event(child.raw(), RDMA_CM_EVENT_CONNECT_REQUEST, 0);
            ev.ibv.listen_id = l.raw();
            ev.set_pdata(private_data.get(CMA_HDR..).unwrap_or(&[]));
            l.push(ev);
        }
        CmEvent::ConnectResponse { id, rep } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            {
                let mut s = i.st();
                s.remote_qpn = rep.remote_qpn;
                s.remote_psn = rep.starting_psn;
                s.responder_resources = s.responder_resources.min(rep.initiator_depth);
                s.initiator_depth = s.initiator_depth.min(rep.responder_resources);
                s.rnr_retry_count = rep.rnr_retry_count;
                s.rep_pdata = rep.private_data.clone();
                s.connected = true;
            }
            let qp = i.qp();
            let hub = i.st().hub.clone();
            let Some(hub) = hub else {
                return;
            };
            if qp.is_null() {
                // The program moves its own QP and calls rdma_establish/rdma_accept.
                let mut ev = event(i.raw(), RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
                ev.set_pdata(&rep.private_data);
                // SAFETY: the conn member of a fresh event.
                unsafe {
                    let c = &mut ev.ibv.param.conn;
                    c.responder_resources = rep.initiator_depth;
                    c.initiator_depth = rep.responder_resources;
                    c.rnr_retry_count = rep.rnr_retry_count;
                    c.srq = u8::from(rep.srq);
                    c.qp_num = rep.remote_qpn;
                }
                i.push(ev);
                return;
            }
            match connect_qp(i, qp) {
                Ok(()) => {
                    let _ = hub.rt.cm_establish(id, Vec::new());
                }
                Err(e) => {
                    let _ = hub.rt.cm_reject(id, reason::CONSUMER_REJECT, Vec::new());
                    i.push(event(i.raw(), RDMA_CM_EVENT_CONNECT_ERROR, -e));
                }
            }
        }
        CmEvent::Established { id } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            let mut ev = event(i.raw(), RDMA_CM_EVENT_ESTABLISHED, 0);
            let pd = i.st().rep_pdata.clone();
            ev.set_pdata(&pd);
            i.st().connected = true;
            i.push(ev);
        }
        CmEvent::Rejected {
            id,
            reason: why,
            private_data,
        } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            i.st().conn = None;
            let mut ev = event(i.raw(), RDMA_CM_EVENT_REJECTED, c_int::from(why));
            ev.set_pdata(&private_data);
            i.push(ev);
        }
        CmEvent::Unreachable { id } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            i.st().conn = None;
            i.push(event(i.raw(), RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT));
        }
        CmEvent::Disconnected { id } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            // As the kernel's rdma_cm on a DREQ or DREP: the QP stops.
            let (hub, qpn) = {
                let s = i.st();
                (s.hub.clone(), s.qpn)
            };
            if let (Some(h), Some(q)) = (hub, qpn) {
                let _ = h.rt.qp_to_error(q);
            }
            i.push(event(i.raw(), RDMA_CM_EVENT_DISCONNECTED, 0));
        }
        CmEvent::SidrResponse {
            id,
            status,
            qpn,
            qkey,
            private_data,
        } => {
            let Some(i) = lookup(dev, id) else {
                return;
            };
            i.st().conn = None;
            if status != 0 {
                i.push(event(
                    i.raw(),
                    RDMA_CM_EVENT_UNREACHABLE,
                    c_int::from(status),
                ));
                return;
            }
            let s = i.st();
            let mut ev = event(i.raw(), RDMA_CM_EVENT_ESTABLISHED, 0);
            ev.set_pdata(&private_data);
            // SAFETY: the ud member of a fresh event.
            unsafe {
                let u = &mut ev.ibv.param.ud;
                u.qp_num = qpn;
                u.qkey = qkey;
                u.ah_attr.is_global = 1;
                u.ah_attr.port_num = 1;
                if let Some(d) = s.dst {
                    u.ah_attr.grh.dgid.raw = gid_of(d.ip());
                }
                u.ah_attr.grh.sgid_index = s.sgid_index;
                u.ah_attr.grh.hop_limit = 64;
            }
            drop(s);
            i.push(ev);
        }
    }
}

/// The ID listening for `service_id` on `dev`.
fn listener_of(dev: &str, service_id: u64) -> Option<&'static Id> {
    let p = registry()
        .listeners
        .iter()
        .find(|l| l.0 == dev && l.1 == service_id)
        .map(|l| l.2)?;
    // SAFETY: registered listeners are live until rdma_destroy_id unregisters them
    // (and it waits for the dispatcher, which calls this).
    Some(unsafe { &*(p as *const Id) })
}

/// A new ID for a connection request to listener `l`: its channel, context and port
/// space (as the kernel's rdma_cm makes one per request).
fn child_of(l: &Id) -> Result<&'static Id, c_int> {
    // SAFETY: the listener's own ID, read only.
    let r = unsafe { &*l.raw() };
    new_id(r.channel, r.context, r.ps, r.qp_type)
}

fn hub_of(dev: &str) -> Option<Arc<Hub>> {
    let ctx = context_of(dev);
    // SAFETY: contexts in CONTEXTS stay open.
    unsafe { context(ctx) }.map(|c| c.hub.clone())
}

// ---------------------------------------------------------------------------------
// The rest of the API.

#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        if level as u32 != RDMA_OPTION_ID || optval.is_null() {
            return fail(libc::ENOSYS);
        }
        // SAFETY: the program's option value of `optlen` bytes.
        let byte =
            |n: usize| -> Option<u8> { (optlen >= n).then(|| unsafe { *(optval as *const u8) }) };
        match optname as u32 {
            RDMA_OPTION_ID_TOS => match byte(1) {
                Some(t) => i.st().tos = t,
                None => return fail(libc::EINVAL),
            },
            RDMA_OPTION_ID_ACK_TIMEOUT => match byte(1) {
                Some(t) => i.st().ack_timeout = Some(t.min(31)),
                None => return fail(libc::EINVAL),
            },
            // Ports are this process's own; reuse and v6-only need no kernel state.
            RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY => {}
            _ => return fail(libc::ENOSYS),
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: an ID of ours.
    unsafe { cm_id(id) }
        .and_then(|i| i.st().src)
        .map_or(0, |a| a.port().to_be())
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: an ID of ours.
    unsafe { cm_id(id) }
        .and_then(|i| i.st().dst)
        .map_or(0, |a| a.port().to_be())
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", null_mut(), || {
        let mut out = Vec::new();
        for l in crate::links::devices() {
            if let Ok(c) = shared_context(&l.name, &l) {
                out.push(c);
            }
        }
        if !num.is_null() {
            // SAFETY: the caller's out-pointer.
            unsafe { *num = out.len() as c_int };
        }
        out.push(null_mut());
        Box::leak(out.into_boxed_slice()).as_mut_ptr()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard("rdma_free_devices", (), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: a NULL-terminated list from rdma_get_devices.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: the boxed slice rdma_get_devices leaked, n + 1 long.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> c_int {
    // SAFETY: an ID of ours.
    if unsafe { cm_id(id) }.is_none() {
        return fail(libc::EINVAL);
    }
    // The engine's CM sees COMM_EST itself.
    0
}

// Multicast (UD groups) and ECE are not provided: as a device without them.
#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut rdma_cm_join_mc_attr_ex,
    _context: *mut c_void,
) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_leave_multicast(_id: *mut rdma_cm_id, _addr: *mut sockaddr) -> c_int {
    fail(libc::ENOSYS)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut ibv_ece) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_reject_ece(_id: *mut rdma_cm_id, _pd: *const c_void, _len: u8) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard("rdma_create_srq", -1, || {
        // SAFETY: an ID of ours.
        let Some(i) = (unsafe { cm_id(id) }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: the program's own ID.
        let ctx = unsafe { (*i.raw()).verbs };
        let pd = if pd.is_null() { default_pd(ctx) } else { pd };
        let srq = super::qp::ibv_create_srq(pd, attr);
        if srq.is_null() {
            return -1;
        }
        // SAFETY: as above.
        unsafe {
            (*i.raw()).srq = srq;
            (*i.raw()).pd = pd;
        }
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_srq_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    fail(libc::EOPNOTSUPP)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", (), || {
        // SAFETY: an ID of ours.
        if let Some(i) = unsafe { cm_id(id) } {
            // SAFETY: the program's own ID.
            let r = unsafe { &mut *i.raw() };
            if !r.srq.is_null() {
                super::qp::ibv_destroy_srq(r.srq);
                r.srq = null_mut();
            }
        }
    })
}

// ---------------------------------------------------------------------------------
// rdma_getaddrinfo and endpoints (rdma_server, rdma_client).

#[unsafe(no_mangle)]
pub extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", -1, || {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return fail(libc::EINVAL);
        }
        // SAFETY: the program's hints, if any.
        let h = (!hints.is_null()).then(|| unsafe { *hints });
        let passive = h.is_some_and(|h| h.ai_flags as u32 & RAI_PASSIVE != 0);
        let mut gh: libc::addrinfo = unsafe { std::mem::zeroed() };
        gh.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        gh.ai_socktype = libc::SOCK_STREAM;
        gh.ai_flags = if passive { libc::AI_PASSIVE } else { 0 };
        if h.is_some_and(|h| h.ai_flags as u32 & RAI_NUMERICHOST != 0) {
            gh.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut out: *mut libc::addrinfo = null_mut();
        // SAFETY: C strings from the program; `out` freed below.
        let r = unsafe { libc::getaddrinfo(node, service, &gh, &mut out) };
        if r != 0 || out.is_null() {
            return fail(libc::EADDRNOTAVAIL);
        }
        // SAFETY: the first result getaddrinfo gave.
        let (addr, len) = unsafe { ((*out).ai_addr, (*out).ai_addrlen) };
        // SAFETY: a sockaddr of `len` bytes.
        let sa = unsafe { sockaddr_in(addr as *const sockaddr) };
        // SAFETY: freeing what getaddrinfo returned.
        unsafe { libc::freeaddrinfo(out) };
        let Some(sa) = sa else {
            return fail(libc::EAFNOSUPPORT);
        };
        let mut ai = Box::new(rdma_addrinfo::default());
        ai.ai_flags = h.map_or(0, |h| h.ai_flags);
        ai.ai_family = if sa.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        ai.ai_qp_type = h.map_or(IBV_QPT_RC as c_int, |h| {
            if h.ai_qp_type != 0 {
                h.ai_qp_type
            } else {
                IBV_QPT_RC as c_int
            }
        });
        ai.ai_port_space = h.map_or(RDMA_PS_TCP as c_int, |h| {
            if h.ai_port_space != 0 {
                h.ai_port_space
            } else {
                RDMA_PS_TCP as c_int
            }
        });
        let boxed = |a: SocketAddr| -> *mut sockaddr {
            let st = Box::leak(Box::new(sockaddr_storage::default()));
            put_sockaddr(st, a);
            st as *mut sockaddr_storage as *mut sockaddr
        };
        if passive {
            ai.ai_src_addr = boxed(sa);
            ai.ai_src_len = len;
        } else {
            ai.ai_dst_addr = boxed(sa);
            ai.ai_dst_len = len;
            if let Some(s) = route_source(sa.ip()) {
                ai.ai_src_addr = boxed(SocketAddr::new(s, 0));
                ai.ai_src_len = len;
            }
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *res = Box::into_raw(ai) };
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", (), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: a list rdma_getaddrinfo built.
            let ai = unsafe { Box::from_raw(p) };
            for a in [ai.ai_src_addr, ai.ai_dst_addr] {
                if !a.is_null() {
                    // SAFETY: the sockaddr_storage boxes rdma_getaddrinfo leaked.
                    drop(unsafe { Box::from_raw(a as *mut sockaddr_storage) });
                }
            }
            p = ai.ai_next;
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", -1, || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the program's addrinfo (from rdma_getaddrinfo).
        let r = unsafe { &*res };
        let qp_type = r.ai_qp_type as ibv_qp_type;
        let i = match new_id(
            null_mut(),
            null_mut(),
            r.ai_port_space as rdma_port_space,
            qp_type,
        ) {
            Ok(i) => i,
            Err(e) => return fail(e),
        };
        let ret = if r.ai_flags as u32 & RAI_PASSIVE != 0 {
            let ret = rdma_bind_addr(i.raw(), r.ai_src_addr);
            if ret == 0 && !qp_init_attr.is_null() {
                // SAFETY: the program's attributes, copied for rdma_get_request; the
                // QP type is the address's, as librdmacm's rdma_create_ep sets it.
                let mut a = unsafe { *qp_init_attr };
                a.qp_type = qp_type;
                i.st().ep_attr = Some((pd as usize, a));
            }
            ret
        } else {
            let mut ret = rdma_resolve_addr(i.raw(), r.ai_src_addr, r.ai_dst_addr, 2000);
            if ret == 0 {
                ret = rdma_resolve_route(i.raw(), 2000);
            }
            if ret == 0 && !qp_init_attr.is_null() {
                // SAFETY: the program's attributes (librdmacm writes the type too).
                unsafe { (*qp_init_attr).qp_type = qp_type };
                ret = rdma_create_qp(i.raw(), pd, qp_init_attr);
            }
            ret
        };
        if ret != 0 {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            rdma_destroy_id(i.raw());
            return fail(e);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *id = i.raw() };
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", (), || {
        // SAFETY: an ID of ours.
        if unsafe { cm_id(id) }.is_some() {
            rdma_destroy_qp(id);
            rdma_destroy_id(id);
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard("rdma_get_request", -1, || {
        // SAFETY: an ID of ours.
        let Some(l) = (unsafe { cm_id(listen) }) else {
            return fail(libc::EINVAL);
        };
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let Some(c) = l.channel() else {
            return fail(libc::EINVAL);
        };
        let e = loop {
            match c.pop(|_| ()) {
                Ok(e) => break e,
                Err(libc::EAGAIN) => continue,
                Err(e) => return fail(e),
            }
        };
        // SAFETY: an event of ours.
        let e = unsafe { Box::from_raw(e) };
        if e.ibv.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            return fail(libc::EINVAL);
        }
        let child = e.ibv.id;
        // SAFETY: the child ID the event carries.
        let Some(ci) = (unsafe { cm_id(child) }) else {
            return fail(libc::EINVAL);
        };
        ci.st().sync = true;
        let ep = l.st().ep_attr;
        if let Some((pd, mut attr)) = ep
            && rdma_create_qp(child, pd as *mut ibv_pd, &mut attr) != 0
        {
            let err = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            rdma_reject(child, std::ptr::null(), 0);
            rdma_destroy_id(child);
            return fail(err);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { *id = child };
        0
    })
}

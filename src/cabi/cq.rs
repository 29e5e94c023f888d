//! Completion queues and completion channels: `ibv_create_cq`, `ibv_poll_cq` (through
//! `ibv_context.ops`), `ibv_req_notify_cq`, `ibv_get_cq_event`, and the extended CQ
//! (`ibv_create_cq_ex` with `ibv_start_poll` / `ibv_next_poll` / `ibv_wc_read_*`).
//!
//! A CQ is always laid out as an `ibv_cq_ex` (whose first part is an `ibv_cq`), so both
//! APIs work on every CQ. Polling moves completions straight from the runtime's
//! lock-free queue into the program's `ibv_wc` array: no allocation, and no system call
//! when it finds completions (or with a busy-polling engine; see `idle_poll`).
//! Completion timestamps are not offered (`ibv_create_cq_ex` with them: EOPNOTSUPP, as
//! on rxe).

use super::device::{Context, Hub, context, forget_events};
use super::sys::*;
use super::{Acks, errno_of_rt, guard, set_errno};
use crate::runtime::CompChannel;
use crate::verbs::{Wc, WcFlags};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// A completion channel. `ibv` is in an `UnsafeCell` because its `refcnt` changes while
/// other threads read the channel (rdma-core keeps that count for programs to see).
#[repr(C)]
pub(crate) struct Channel {
    pub ibv: UnsafeCell<ibv_comp_channel>,
    pub ch: Arc<CompChannel>,
}

impl Channel {
    /// The CQs using the channel: `ibv_comp_channel.refcnt`, updated atomically.
    fn users(&self) -> &AtomicI32 {
        // SAFETY: `refcnt` is an aligned i32 inside our UnsafeCell, only ever accessed
        // atomically by us; programs only read it.
        unsafe { AtomicI32::from_ptr(std::ptr::addr_of_mut!((*self.ibv.get()).refcnt)) }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_comp_channel(context_: *mut ibv_context) -> *mut ibv_comp_channel {
    guard("ibv_create_comp_channel", std::ptr::null_mut(), || {
        // SAFETY: a live context from ibv_open_device.
        if unsafe { context(context_) }.is_none() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let ch = match CompChannel::new() {
            Ok(c) => Arc::new(c),
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
                return std::ptr::null_mut();
            }
        };
        Box::into_raw(Box::new(Channel {
            ibv: UnsafeCell::new(ibv_comp_channel {
                context: context_,
                fd: ch.fd(),
                refcnt: 0,
            }),
            ch,
        }))
        .cast()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard("ibv_destroy_comp_channel", libc::EIO, || {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a channel from ibv_create_comp_channel.
        let c = unsafe { &*(channel as *const Channel) };
        if c.users().load(Ordering::SeqCst) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: the box ibv_create_comp_channel leaked, freed once now.
        drop(unsafe { Box::from_raw(channel as *mut Channel) });
        0
    })
}

/// A CQ: `ibv_cq_ex` first (an `ibv_cq` at its start), then ours. The C part is in an
/// `UnsafeCell`: the extended API writes `status` and `wr_id` into it while others may
/// read the CQ.
#[repr(C)]
pub(crate) struct Cq {
    pub ex: UnsafeCell<ibv_cq_ex>,
    pub rt: crate::runtime::Cq,
    pub hub: Arc<Hub>,
    /// Completion events handed out by `ibv_get_cq_event` and acknowledged.
    pub comp_acks: Acks,
    /// Asynchronous events (CQ errors) handed out and acknowledged.
    pub async_acks: Acks,
    /// The extended API's current completion, valid between `start_poll` and
    /// `end_poll`, which `polling` serialises as rxe's spin lock does.
    cur: UnsafeCell<Wc>,
    polling: AtomicBool,
}

/// # Safety
/// `c` is NULL or an `ibv_cq` (or `ibv_cq_ex`) from `ibv_create_cq*`, not destroyed.
pub(crate) unsafe fn cq<'a>(c: *mut ibv_cq) -> Option<&'a Cq> {
    // SAFETY: the caller's contract; `ex` (starting with the ibv_cq fields) is the
    // first field of the repr(C) `Cq`.
    (!c.is_null()).then(|| unsafe { &*(c as *const Cq) })
}

/// The C view of a completion. Immediate data travels in network order (ibv_wc's
/// `__be32`); an invalidated R_Key is host order.
#[inline]
pub(crate) fn wc_to_c(w: &Wc) -> ibv_wc {
    let imm = if w.wc_flags.contains(WcFlags::WITH_IMM) {
        w.imm_data.to_be()
    } else {
        w.imm_data
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as u32,
        opcode: w.opcode as u32,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        __bindgen_anon_1: ibv_wc__bindgen_ty_1 { imm_data: imm },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// Creates a CQ of `cqe` entries signalling `channel`.
fn create(
    c: &Context,
    context_: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, c_int> {
    let max = c.hub.rt.info().limits.max_cqe as c_int;
    if cqe < 1 || cqe > max || comp_vector != 0 {
        return Err(libc::EINVAL);
    }
    let mut b: Box<MaybeUninit<Cq>> = Box::new_uninit();
    let p = b.as_mut_ptr();
    // The channel's events name the `ibv_cq`, which is this box.
    let ch = (!channel.is_null()).then(|| {
        // SAFETY: a channel from ibv_create_comp_channel.
        let ch = unsafe { &*(channel as *const Channel) };
        (ch, (ch.ch.clone(), p as u64))
    });
    let rt = c
        .hub
        .rt
        .create_cq_with(cqe as usize, ch.as_ref().map(|(_, x)| x.clone()))
        .map_err(|e| errno_of_rt(&e))?;
    if let Some((chan, _)) = ch {
        chan.users().fetch_add(1, Ordering::SeqCst);
    }
    let ex = ibv_cq_ex {
        context: context_,
        channel,
        cq_context,
        handle: rt.id,
        cqe,
        ..Default::default()
    };
    b.write(Cq {
        ex: UnsafeCell::new(ex),
        rt,
        hub: c.hub.clone(),
        comp_acks: Acks::default(),
        async_acks: Acks::default(),
        cur: UnsafeCell::new(Wc::new(
            0,
            0,
            crate::verbs::WcOpcode::Send,
            crate::verbs::WcStatus::Success,
        )),
        polling: AtomicBool::new(false),
    });
    // SAFETY: fully written just now.
    let b = unsafe { b.assume_init() };
    let p = Box::into_raw(b);
    // SAFETY: our live box: initialise the pthread objects programs may look at.
    unsafe {
        let ex = (*p).ex.get();
        libc::pthread_mutex_init(std::ptr::addr_of_mut!((*ex).mutex).cast(), std::ptr::null());
        libc::pthread_cond_init(std::ptr::addr_of_mut!((*ex).cond).cast(), std::ptr::null());
    }
    c.hub
        .routes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .cqs
        // SAFETY: `p` is live.
        .insert(unsafe { (*p).rt.id }, (c.asyncq.clone(), p as usize));
    Ok(p)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_create_cq(
    context_: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", std::ptr::null_mut(), || {
        // SAFETY: a live context from ibv_open_device.
        let Some(c) = (unsafe { context(context_) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match create(c, context_, cqe, cq_context, channel, comp_vector) {
            Ok(p) => p.cast(),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_resize_cq(c: *mut ibv_cq, cqe: c_int) -> c_int {
    guard("ibv_resize_cq", libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq*.
        let Some(x) = (unsafe { cq(c) }) else {
            return libc::EINVAL;
        };
        if cqe < 1 {
            return libc::EINVAL;
        }
        match x.hub.rt.resize_cq(&x.rt, cqe as usize) {
            Ok(()) => {
                // SAFETY: our live CQ's C part, in its UnsafeCell.
                unsafe { (*x.ex.get()).cqe = cqe };
                0
            }
            Err(e) => errno_of_rt(&e),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    guard("ibv_destroy_cq", libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq*.
        let Some(x) = (unsafe { cq(c) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = x.hub.rt.destroy_cq(&x.rt) {
            return errno_of_rt(&e);
        }
        x.hub
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cqs
            .remove(&x.rt.id);
        // SAFETY: the C part is set at creation; context and channel never change.
        let (ctx, channel) = unsafe { ((*x.ex.get()).context, (*x.ex.get()).channel) };
        // SAFETY: the CQ's context is live while it has objects.
        unsafe { forget_events(ctx, c as usize) };
        // Events handed out must be acknowledged first, as rdma-core waits for them.
        x.comp_acks.wait_all();
        x.async_acks.wait_all();
        if !channel.is_null() {
            // SAFETY: the channel outlives its CQs (its destroy is refused before).
            let ch = unsafe { &*(channel as *const Channel) };
            ch.users().fetch_sub(1, Ordering::SeqCst);
        }
        // SAFETY: the box create() leaked, freed once now.
        drop(unsafe { Box::from_raw(c as *mut Cq) });
        0
    })
}

/// `ibv_context.ops.poll_cq`: the inline `ibv_poll_cq`.
pub(crate) unsafe extern "C" fn poll_cq(c: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard("ibv_poll_cq", -1, || {
        // SAFETY: a CQ from ibv_create_cq*.
        let Some(x) = (unsafe { cq(c) }) else {
            return -1;
        };
        if n <= 0 || wc.is_null() {
            return 0;
        }
        let got = x.rt.poll_with(n as usize, |i, w| {
            // SAFETY: the caller gives `n` ibv_wc at `wc`; `i` < n.
            unsafe { *wc.add(i) = wc_to_c(&w) }
        }) as c_int;
        if got > 0 {
            busy_again();
        } else if !x.hub.rt.busy_poll() {
            idle_poll(&x.hub.rt);
        }
        got
    })
}

/// What an empty poll does when the engine does not busy-poll. Programs poll in a tight
/// loop (a real provider's poll reads memory its NIC writes), but here the engine
/// threads that deliver the next completion need the cores the loop takes. So the loop
/// spins, then blocks, as an adaptive mutex does, by how long this thread's waits for a
/// completion have lasted lately:
/// - short waits (a ping-pong, a latency test: under [`SHORT`]) are spun out, giving
///   the core away at each poll (`sched_yield`) to the engine thread that often shares
///   it, for up to [`YIELD_FOR`]: waking a sleeping thread costs more than such a wait
///   (ib_send_lat took 2 to 3 times as long when every wait slept);
/// - long waits (a bandwidth test, one completion per 64 KiB message) sleep after
///   [`SPINS`] empty polls in a row with no completion handed out on the device
///   meanwhile: ib_write_bw's yielding poller switched with the engine thread 43 000
///   times a second and cost the transfer about 10%. The sleep ends when the engine
///   hands out a completion on any CQ of the device (the one the program waits for may
///   be another it polls in turn), or after [`NAP`], since a program may poll while it
///   waits for something no completion marks (a flag an RDMA WRITE sets).
///
/// Where the poll itself runs the data path (`RuntimeConfig::caller_rounds`), a poll
/// whose round did work (sent frames, took ACKs) is not idle: the program's loop is then
/// the engine, and polls again at once. On one CPU ([`crate::runtime::Device::callers_alone`])
/// the loop neither yields nor sleeps for the first [`ALONE_SPIN`] of a wait: the engine
/// thread sleeps whenever it is idle there (yielding finds no one to hand the core to),
/// the loop's own rounds take the frames it waits for, and naps only added wake-ups (a
/// 1-vCPU VM's ib_write_lat: 14-18 context switches per iteration with naps and yields,
/// 6-7 without, median 2.1-3.1 ms against 0.9-1.1 ms, `tools/rxe-interop --bench
/// --quick`). A longer wait (a program waiting for a peer that is not sending) naps
/// as above, so that an idle program does not hold its one CPU (or its cgroup's quota).
fn idle_poll(rt: &crate::runtime::Device) {
    let mut s = IDLE.get();
    let worked = rt.caller_work();
    let key = rt.key();
    if key != s.dev {
        // Counters of another device than the last poll's: nothing to compare with.
        s.dev = key;
        s.worked = worked;
        s.seen = rt.completion_beats();
        s.empty = 0;
    } else if worked != s.worked {
        s.worked = worked;
        s.empty = 0;
        // Still a wait for a completion, which the typical wait counts.
        s.last = crate::time::monotonic_ns();
        if s.since == 0 {
            s.since = s.last;
        }
        IDLE.set(s);
        return;
    }
    let now = crate::time::monotonic_ns();
    if s.since == 0 {
        s.since = now;
    }
    let beats = rt.completion_beats();
    if beats != s.seen {
        s.seen = beats;
        s.empty = 0;
    }
    s.empty = s.empty.saturating_add(1);
    let waited = now.saturating_sub(s.since);
    if rt.callers_alone() && waited < ALONE_SPIN {
        // Spun out: see above.
    } else if !rt.callers_alone() && s.typical < SHORT && waited < YIELD_FOR {
        std::thread::yield_now();
    } else if s.empty > SPINS {
        rt.wait_completions(s.seen, NAP);
    }
    // Read here, after the yield or the sleep, so that the poll that finds the
    // completion need not read the clock (it would cost that poll about 25 ns).
    s.last = crate::time::monotonic_ns();
    IDLE.set(s);
}

/// A successful poll: the wait (if there was one) ends, and counts into the typical.
#[inline]
fn busy_again() {
    let s = IDLE.get();
    if s.since != 0 {
        let took = s.last.saturating_sub(s.since);
        IDLE.set(Idle {
            since: 0,
            empty: 0,
            typical: (s.typical.saturating_mul(7) / 8).saturating_add(took / 8),
            ..s
        });
    }
}

/// A polling thread's waiting, kept per thread: a thread polls its own CQs in turn.
#[derive(Clone, Copy)]
struct Idle {
    /// When the polls that found nothing began (monotonic ns), 0 while polls find some.
    since: u64,
    /// When the last of those polls ended (monotonic ns): within one poll of the wait's end.
    last: u64,
    /// The device's completion beats at the last empty poll.
    seen: u64,
    /// Empty polls in a row that saw those same beats.
    empty: u32,
    /// The device's `caller_work` at the last empty poll.
    worked: u64,
    /// Which device that poll was on ([`crate::runtime::Device::key`]).
    dev: usize,
    /// How long waits lasted lately (ns; a moving average over about eight).
    typical: u64,
}

thread_local! {
    static IDLE: std::cell::Cell<Idle> = const {
        std::cell::Cell::new(Idle { since: 0, last: 0, seen: 0, empty: 0, worked: 0, dev: 0, typical: 0 })
    };
}

/// Waits shorter than this on average are spun out.
const SHORT: u64 = 100_000;
/// The longest a wait is spun out before it sleeps.
const YIELD_FOR: u64 = 200_000;
/// Empty polls (each a few nanoseconds) with nothing handed out before a sleep.
const SPINS: u32 = 4;
/// How long a wait is spun out on one CPU before it naps (a 1-vCPU VM's ib_write_lat
/// waits 0.4-0.7 ms per iteration).
const ALONE_SPIN: u64 = 5_000_000;
/// The longest sleep (a completion on the device ends it at once).
const NAP: std::time::Duration = std::time::Duration::from_micros(100);

/// `ibv_context.ops.req_notify_cq`: the inline `ibv_req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard("ibv_req_notify_cq", libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq*.
        let Some(x) = (unsafe { cq(c) }) else {
            return libc::EINVAL;
        };
        x.rt.req_notify(solicited_only != 0);
        0
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard("ibv_get_cq_event", -1, || {
        if channel.is_null() || cq_out.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a channel from ibv_create_comp_channel.
        let ch = unsafe { &*(channel as *const Channel) };
        let got = ch.ch.get_event_map(|token| {
            // SAFETY: a token is the address of a live CQ: a destroyed CQ's tokens were
            // taken out of the queue under this same lock.
            let x = unsafe { &*(token as *const Cq) };
            x.comp_acks.reported();
            token
        });
        match got {
            Ok(token) => {
                // SAFETY: as above (the CQ waits in destroy for this event's ack); the
                // caller gives room for both pointers.
                unsafe {
                    let x = &*(token as *const Cq);
                    *cq_out = token as *mut ibv_cq;
                    *cq_context = (*x.ex.get()).cq_context;
                }
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
pub extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, nevents: u32) {
    guard("ibv_ack_cq_events", (), || {
        // SAFETY: a CQ from ibv_create_cq*.
        let Some(x) = (unsafe { cq(c) }) else {
            return;
        };
        x.comp_acks.ack(u64::from(nevents));
        // SAFETY: our live CQ's C part (in its UnsafeCell): the counter rdma-core keeps.
        unsafe { (*x.ex.get()).comp_events_completed = x.comp_acks.acked() as u32 };
    })
}

// ---------------------------------------------------------------------------------
// The extended CQ.

/// The completion fields rxe's extended CQ offers (RXE_SUPPORTED_WC_FLAGS); timestamps
/// need a clock the engine does not keep per completion.
const SUPPORTED_WC_FLAGS: u64 = (IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// `verbs_context.create_cq_ex`: the inline `ibv_create_cq_ex`.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context_: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard("ibv_create_cq_ex", std::ptr::null_mut(), || {
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
        let a = unsafe { &*attr };
        let known_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD;
        let known_flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        if a.comp_mask & !known_mask != 0
            || (a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !known_flags != 0)
        {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 || a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            set_errno(libc::EOPNOTSUPP);
            return std::ptr::null_mut();
        }
        let p = match create(
            c,
            context_,
            a.cqe.min(c_int::MAX as u32) as c_int,
            a.cq_context,
            a.channel,
            a.comp_vector as c_int,
        ) {
            Ok(p) => p,
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        // SAFETY: our new CQ, not yet handed out.
        let ex = unsafe { &mut *(*p).ex.get() };
        ex.start_poll = Some(start_poll);
        ex.next_poll = Some(next_poll);
        ex.end_poll = Some(end_poll);
        ex.read_opcode = Some(read_opcode);
        ex.read_vendor_err = Some(read_vendor_err);
        ex.read_wc_flags = Some(read_wc_flags);
        let f = a.wc_flags;
        let has = |b: u32| f & u64::from(b) != 0;
        if has(IBV_WC_EX_WITH_BYTE_LEN) {
            ex.read_byte_len = Some(read_byte_len);
        }
        if has(IBV_WC_EX_WITH_IMM) {
            ex.read_imm_data = Some(read_imm_data);
        }
        if has(IBV_WC_EX_WITH_QP_NUM) {
            ex.read_qp_num = Some(read_qp_num);
        }
        if has(IBV_WC_EX_WITH_SRC_QP) {
            ex.read_src_qp = Some(read_src_qp);
        }
        if has(IBV_WC_EX_WITH_SLID) {
            ex.read_slid = Some(read_slid);
        }
        if has(IBV_WC_EX_WITH_SL) {
            ex.read_sl = Some(read_sl);
        }
        if has(IBV_WC_EX_WITH_DLID_PATH_BITS) {
            ex.read_dlid_path_bits = Some(read_dlid_path_bits);
        }
        p.cast()
    })
}

/// # Safety
/// `c` is an `ibv_cq_ex` from `ibv_create_cq_ex`, not destroyed.
unsafe fn cqx<'a>(c: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: the caller's contract (the verbs.h inlines pass the CQ they were given).
    unsafe { &*(c as *const Cq) }
}

/// Loads the next completion into the CQ's current one; ENOENT when there is none.
fn load_next(x: &Cq) -> c_int {
    match x.rt.poll_one() {
        Some(w) => {
            // SAFETY: the caller holds `polling`, so `cur` and the C part's status and
            // wr_id are ours to write (both in UnsafeCells).
            unsafe {
                *x.cur.get() = w;
                (*x.ex.get()).status = w.status as u32;
                (*x.ex.get()).wr_id = w.wr_id;
            }
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn start_poll(c: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard("ibv_start_poll", libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq_ex.
        let x = unsafe { cqx(c) };
        // SAFETY: the caller's attributes or NULL.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        while x
            .polling
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        let r = load_next(x);
        if r != 0 {
            // As rxe: no end_poll follows a start_poll that found nothing.
            x.polling.store(false, Ordering::Release);
            if !x.hub.rt.busy_poll() {
                idle_poll(&x.hub.rt);
            }
        } else {
            busy_again();
        }
        r
    })
}

unsafe extern "C" fn next_poll(c: *mut ibv_cq_ex) -> c_int {
    guard("ibv_next_poll", libc::EIO, || {
        // SAFETY: a CQ from ibv_create_cq_ex, between start_poll and end_poll.
        let x = unsafe { cqx(c) };
        load_next(x)
    })
}

unsafe extern "C" fn end_poll(c: *mut ibv_cq_ex) {
    guard("ibv_end_poll", (), || {
        // SAFETY: a CQ from ibv_create_cq_ex.
        unsafe { cqx(c) }.polling.store(false, Ordering::Release);
    })
}

/// The current completion (between start_poll and end_poll).
fn cur(c: *mut ibv_cq_ex) -> Wc {
    // SAFETY: a CQ from ibv_create_cq_ex whose poller holds `polling`.
    unsafe { *cqx(c).cur.get() }
}

unsafe extern "C" fn read_opcode(c: *mut ibv_cq_ex) -> ibv_wc_opcode {
    cur(c).opcode as u32
}
unsafe extern "C" fn read_vendor_err(c: *mut ibv_cq_ex) -> u32 {
    cur(c).vendor_err
}
unsafe extern "C" fn read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    cur(c).byte_len
}
unsafe extern "C" fn read_imm_data(c: *mut ibv_cq_ex) -> __be32 {
    // SAFETY: reading the union member the C view holds.
    unsafe { wc_to_c(&cur(c)).__bindgen_anon_1.imm_data }
}
unsafe extern "C" fn read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    cur(c).qp_num
}
unsafe extern "C" fn read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    cur(c).src_qp
}
unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq_ex) -> u32 {
    cur(c).wc_flags.bits()
}
unsafe extern "C" fn read_slid(c: *mut ibv_cq_ex) -> u32 {
    u32::from(cur(c).slid)
}
unsafe extern "C" fn read_sl(c: *mut ibv_cq_ex) -> u8 {
    cur(c).sl
}
unsafe extern "C" fn read_dlid_path_bits(c: *mut ibv_cq_ex) -> u8 {
    cur(c).dlid_path_bits
}

//! The runtime: the sans-IO engine on a poll-mode thread over a real link, used through a
//! thread-safe verbs API.
//!
//! - [`Device::open`] starts the engine thread (inside a network namespace if asked),
//!   opens the link there (AF_XDP, or UDP sockets), and hands back a handle.
//! - Control calls (`reg_mr`, `create_qp`, `modify_qp`, ...) run on the engine thread
//!   and return its answer.
//! - `post_send` / `post_recv` are checked in the caller's thread (state, queue room,
//!   SGEs, inline size: the errors ibverbs returns), copied into the QP's own bounded
//!   ring (a `crossbeam` `ArrayQueue` allocated with the QP) and rung as a doorbell: the
//!   QP's number on its engine thread's doorbell queue, once until that thread drains
//!   the ring. Posting allocates nothing and makes no system call unless the engine
//!   thread sleeps (it sleeps only when idle, and is then woken by an eventfd), or a
//!   caller runs the round itself (below: its frames' `sendto`).
//! - With one engine thread, and `busy_poll` or a process that may use one CPU only
//!   ([`RuntimeConfig::caller_rounds`]), a caller that polls an empty CQ, or posts
//!   the only WR outstanding on a send queue, runs a round of the data path itself
//!   (run-to-completion, as poll-mode drivers do: doorbells, received frames, timers,
//!   frames to send, completions) under the lock the engine thread takes for its own
//!   rounds. While callers do this the engine thread
//!   sleeps when idle instead of spinning beside them (a frame, a doorbell or a call
//!   wakes it, as in the default mode). Control calls and the port watch stay on the
//!   engine thread (the port watch needs its network namespace).
//! - Completions reach each CQ through a lock-free `crossbeam` `ArrayQueue`; `Cq::wait`
//!   sleeps on a condition variable that the engine thread touches only when someone
//!   waits (a caller that runs the data path itself spins instead). `Cq::req_notify`
//!   arms the CQ in that shared state, so the next completion handed over signals the
//!   CQ's [`CompChannel`] (a file descriptor to `poll()`).
//! - A frame the engine sends to one of its own addresses (two QPs of the same device)
//!   goes straight back into it, as rxe loops such packets back.
//! - Memory regions are `Arc<Memory>`: the engine copies into and out of them with the
//!   bounds-checked copies of `verbs::mr`, never through references, so sharing them
//!   with the application's threads is safe.
//! - Dropping the `Device` (or `shutdown`) moves every QP to ERR (flushing its WRs),
//!   detaches XDP and frees the UMEM.
//! - With `threads` > 1 (AF_XDP), the interface's queues are split among that many
//!   engine threads, each with its own engine. PDs, MRs (same keys) and CQs are
//!   replicated on every thread; a QP is created on thread 0 and, on its way to RTR,
//!   moves to the thread whose queue the peer's UDP source port selects (`port %
//!   threads`), as RSS would: two such devices line up queue for queue. A frame that
//!   arrives on another thread's queue is handed over through a pool of buffers
//!   (counted as `forwarded`). UD QPs stay on thread 0; SRQs and memory windows need one thread.

mod channel;
pub mod faults;
mod posted;
mod worker;

pub use channel::{CompChannel, FdQueue};

use crate::engine::Counters;
use crate::engine::cm::{AcceptParams, CmCounters, CmEvent, ConnectParams, SidrParams};
use crate::link::xdp::XdpConfig;
use crate::verbs::{
    AccessFlags, AddressVector, AsyncEvent, DeviceConfig, Error, Gid, Memory, MrInfo, Mtu, Mw,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendWr, Wc,
};
use crossbeam::channel::Receiver;
use crossbeam::queue::ArrayQueue;
use crossbeam::utils::CachePadded;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use worker::Stats;

/// Which link carries the frames.
#[derive(Debug, Clone)]
pub enum LinkKind {
    /// AF_XDP on an interface.
    Xdp { ifname: String, cfg: XdpConfig },
    /// A UDP socket on `local:4791` (no privileges needed). `ifname` is only used to
    /// find the MAC and MTU if given.
    Udp { local: IpAddr },
}

/// How to start a device.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub link: LinkKind,
    /// Run the engine thread (and open the link) in this network namespace.
    pub netns: Option<String>,
    /// The device; `None` builds it from the interface (MAC, addresses, MTU).
    pub device: Option<DeviceConfig>,
    /// Spin instead of sleeping when idle (lowest latency, one core busy). With one
    /// engine thread, a caller polling an empty CQ then runs the engine's data path
    /// in its own thread (see the module's notes).
    pub busy_poll: bool,
    /// Whether callers run the data path in their own thread (one engine thread only):
    /// a poll of an empty CQ, and the post of a burst's first WR, run a round of it.
    /// `None` (the default): with `busy_poll`, and when the process may run on one CPU
    /// only ([`one_cpu`]), where the caller and the engine thread never run at once and
    /// every hop between them is a context switch (a 1-vCPU VM: `ib_write_lat` made
    /// 18 of them per iteration against rxe's 0.3).
    pub caller_rounds: Option<bool>,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Stop writing the pcap after this many frames (long runs make huge captures).
    pub pcap_max_frames: Option<u64>,
    /// Write pcapng instead of pcap: needed for the comments of
    /// [`Device::capture_section`].
    pub pcap_ng: bool,
    /// Publish counters to this JSON file every 500 ms (what `roce-xdp stats` reads).
    pub stats_file: Option<PathBuf>,
    /// Override of the port MTU (IB MTU) the interface's MTU would give.
    pub port_mtu: Option<Mtu>,
    /// Engine threads (AF_XDP only): the interface's receive queues are split among
    /// them, each with its own engine. RC/UC QPs settle, at RTR, on the thread whose
    /// queue the peer's UDP source port selects, as RSS would; frames that arrive on
    /// another thread's queue are handed over.
    pub threads: usize,
    /// Pin engine thread `k` to CPU `cpus[k % cpus.len()]`; empty: the scheduler
    /// places them (`bench` puts the two sides of a measurement on different cores).
    pub cpus: Vec<usize>,
    /// Reorder and delay received frames before the engine sees them (tests, `soak`).
    pub faults: Option<faults::FaultConfig>,
    /// The interface whose state is the port's (up with a carrier: ACTIVE). Default:
    /// the AF_XDP interface; the UDP link has none unless given one.
    pub port_ifname: Option<String>,
    /// Where asynchronous events go instead of [`Device::next_event`] (called by the
    /// thread running the data path, the engine thread or a caller running a round
    /// inside `Cq::poll`, `Cq::wait` or a post (`caller_rounds`): it must not block, nor
    /// take a lock such a caller may hold).
    pub event_hook: Option<EventHook>,
    /// Where the Communication Manager's events go instead of
    /// [`Device::next_cm_event`] (called as [`RuntimeConfig::event_hook`] is).
    pub cm_hook: Option<CmHook>,
}

/// A function that takes the device's asynchronous events as they happen.
#[derive(Clone)]
pub struct EventHook(pub Arc<dyn Fn(AsyncEvent) + Send + Sync>);

impl std::fmt::Debug for EventHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventHook")
    }
}

/// A function that takes the Communication Manager's events as they happen (as
/// [`RuntimeConfig::event_hook`] is called).
#[derive(Clone)]
pub struct CmHook(pub Arc<dyn Fn(CmEvent) + Send + Sync>);

impl std::fmt::Debug for CmHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmHook")
    }
}

/// Where the engine threads put asynchronous and CM events.
#[derive(Clone)]
pub(crate) struct EventSink {
    tx: crossbeam::channel::Sender<AsyncEvent>,
    hook: Option<EventHook>,
    cm_tx: crossbeam::channel::Sender<CmEvent>,
    cm_hook: Option<CmHook>,
}

impl EventSink {
    pub(crate) fn send(&self, e: AsyncEvent) {
        match &self.hook {
            Some(h) => (h.0)(e),
            None => {
                let _ = self.tx.send(e);
            }
        }
    }

    pub(crate) fn send_cm(&self, e: CmEvent) {
        match &self.cm_hook {
            Some(h) => (h.0)(e),
            None => {
                let _ = self.cm_tx.send(e);
            }
        }
    }
}

impl RuntimeConfig {
    /// AF_XDP on `ifname` with defaults.
    pub fn xdp(ifname: &str) -> RuntimeConfig {
        RuntimeConfig {
            link: LinkKind::Xdp {
                ifname: ifname.to_string(),
                cfg: XdpConfig::default(),
            },
            netns: None,
            device: None,
            busy_poll: false,
            caller_rounds: None,
            pcap: None,
            pcap_max_frames: None,
            pcap_ng: false,
            stats_file: None,
            port_mtu: None,
            threads: 1,
            cpus: Vec::new(),
            port_ifname: None,
            faults: None,
            event_hook: None,
            cm_hook: None,
        }
    }

    /// A UDP socket on `local:4791`.
    pub fn udp(local: IpAddr) -> RuntimeConfig {
        RuntimeConfig {
            link: LinkKind::Udp { local },
            ..RuntimeConfig::xdp("lo")
        }
    }
}

/// True when this thread may run on one CPU only: its affinity mask (`taskset`, a
/// cpuset, a 1-vCPU VM) holds one CPU. A cgroup's CPU quota does not count: under
/// `--cpus=1.5` the caller and the engine thread still run on separate cores at once,
/// which is what run-to-completion on one CPU assumes they never do.
pub fn one_cpu() -> bool {
    crate::host::allowed_cpus().len() == 1
}

/// Why the runtime could not start or answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("{0}")]
    Setup(String),
    #[error("the engine thread has stopped")]
    Stopped,
    #[error(transparent)]
    Verbs(#[from] Error),
}

/// What the engine thread found when it started.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub mac: [u8; 6],
    pub gids: Vec<Gid>,
    /// The VLAN of each GID (`None`: untagged), by index.
    pub gid_vlans: Vec<Option<u16>>,
    /// The port's 802.1Q subinterfaces (their addresses are among the GIDs).
    pub vlans: Vec<crate::verbs::VlanNetdev>,
    pub port_mtu: Mtu,
    pub limits: crate::verbs::DeviceLimits,
    /// One line: the link and its modes.
    pub link: String,
    pub ifname: Option<String>,
    pub udp: bool,
}

type Call = Box<dyn FnOnce(&mut worker::Locals) + Send>;

pub(crate) enum Cmd {
    Call(Call),
}

/// Doorbells of SRQs carry this bit (QP numbers have 24 bits).
pub(crate) const SRQ_BELL: u32 = 1 << 31;

/// Most WRs a QP's or SRQ's ring holds before posting waits for the engine thread to
/// take some (the queue's own depth, counted separately, decides what is refused as
/// full): bounds the memory of deep queues to about 650 KiB of send WRs.
const RING_MAX: usize = 1024;

/// What a poster does while its ring is full: wakes engine thread `k` and gives the
/// core away (the ring is smaller than a deep queue); false if the engine stopped.
fn make_room(set: &worker::ShardSet, k: usize) -> bool {
    if set.stopped.load(Ordering::SeqCst) {
        return false;
    }
    set.links[k].wake.ring();
    std::thread::yield_now();
    true
}

/// Pushes a posted WR onto its QP's ring, waiting while the engine thread catches up;
/// `Err` if the engine stopped.
fn push_posted<W: posted::Compact + Clone>(
    ring: &posted::PostRing<W>,
    wr: &W,
    set: &worker::ShardSet,
    k: usize,
) -> Result<(), ()> {
    ring.push(wr, || make_room(set, k))
}

/// Copies `v` into `ring` (an SRQ's), waiting as [`push_posted`] does.
fn push_waiting<T>(ring: &ArrayQueue<T>, v: T, set: &worker::ShardSet, k: usize) -> Result<(), ()> {
    posted::push_until(ring, v, &mut || make_room(set, k))
}

/// The engine thread's wake-up line: an eventfd it polls while asleep.
pub(crate) struct Wake {
    pub(crate) fd: i32,
    /// Raised by the engine thread before it sleeps.
    pub(crate) sleeping: Arc<AtomicBool>,
}

impl Wake {
    pub(crate) fn new() -> Result<Wake, String> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(format!("eventfd: {}", std::io::Error::last_os_error()));
        }
        Ok(Wake {
            fd,
            sleeping: Arc::new(AtomicBool::new(false)),
        })
    }
    /// Wakes the engine thread if it sleeps.
    pub(crate) fn ring(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writing 8 bytes from a live u64 to our eventfd.
            unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
        }
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // SAFETY: our fd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

struct Shared {
    /// The engine threads' doorbells, wake-up lines, QP owners and counters.
    set: Arc<worker::ShardSet>,
    events: Receiver<AsyncEvent>,
    cm_events: Receiver<CmEvent>,
    info: DeviceInfo,
    netns: Option<String>,
    busy_poll: bool,
    /// Callers run the data path as they poll and post (`RuntimeConfig::caller_rounds`).
    rtc: bool,
}

/// What a doorbell asks of its engine thread ([`Shared::ring`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bell {
    /// The send WR is the only one outstanding on its queue.
    First,
    /// Take the WRs in soon: wake the engine thread if it sleeps.
    Wake,
    /// Take them in before the next frame: wake nobody.
    Quiet,
}

impl Shared {
    /// Rings QP (or SRQ) `id`'s doorbell on engine thread `k` unless it is rung already.
    ///
    /// `first`: the WR is the only one outstanding on its send queue. A caller that runs
    /// the data path (`caller_rounds`) then runs the round that takes it in itself, as it
    /// runs the rounds its polls wait for: its engine thread may sleep while the caller
    /// polls another device's CQ, and the wake-up would delay the WR (`roce-xdp demo
    /// --busy-poll` drives two devices from one thread: 81.9 us round trips, against
    /// 25.9 us with spinning engines). Later WRs of a burst are left to the rounds the
    /// caller's polls run, which take in all the doorbells rung since: a round per WR
    /// sent one frame per `sendto` and halved busy-polling goodput. When no round runs
    /// here, the engine thread is woken if it sleeps, as without run-to-completion.
    ///
    /// `Bell::Quiet` (receive WRs of a QP not in error) wakes nobody: only a frame uses
    /// a receive WR, and whoever takes a frame off the ring drains the doorbells first
    /// (`DataPath::round`). Waking a sleeping engine thread there cost a program on one
    /// CPU two context switches between its receive completion and the answer it sends
    /// (ib_send_lat re-posts each receive before it replies).
    fn ring(&self, k: usize, rung: &AtomicBool, id: u32, bell: Bell) -> bool {
        if !rung.swap(true, Ordering::SeqCst) && !self.set.bell(k, id) {
            return false;
        }
        match bell {
            Bell::Quiet => return true,
            Bell::First if self.rtc && self.set.run_here().is_some() => return true,
            _ => {}
        }
        self.set.links[k].wake.ring();
        true
    }
}

/// Wakes the threads waiting on `cv` for a change already made. Taking and releasing
/// `lock` first orders the wake after any waiter's check-then-sleep (which holds the
/// lock); notifying after the release keeps the woken thread from blocking at once on
/// the lock the notifier still holds.
fn wake(lock: &Mutex<()>, cv: &Condvar) {
    drop(lock.lock().unwrap_or_else(|e| e.into_inner()));
    cv.notify_all();
}

/// Completions handed out anywhere on a device: a count the engine threads bump once
/// per batch, and a wait for the next bump. A program that polls several CQs in turn
/// (a send CQ and a receive CQ) can sleep on it until any of them has work, where a
/// wait on one CQ would sleep through the others' completions.
#[derive(Default)]
pub(crate) struct Pulse {
    beats: CachePadded<AtomicU64>,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Pulse {
    /// The beats so far.
    pub(crate) fn beats(&self) -> u64 {
        self.beats.load(Ordering::SeqCst)
    }

    /// One more batch (engine threads).
    pub(crate) fn beat(&self) {
        // Against `wait`'s count and check (both SeqCst): either the waiter sees this
        // beat, or this sees the waiter and wakes it (see `wake`).
        self.beats.fetch_add(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            wake(&self.lock, &self.cv);
        }
    }

    /// Sleeps until the count passes `seen`, or `timeout` passes.
    pub(crate) fn wait(&self, seen: u64, timeout: Duration) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.beats() == seen {
            drop(self.cv.wait_timeout(g, timeout));
        } else {
            drop(g);
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A started device. Cheap to clone; the engine stops when the last clone is dropped or
/// `shutdown` is called.
#[derive(Clone)]
pub struct Device {
    sh: Arc<Shared>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
}

/// The state a CQ shares between the engine thread and its users.
pub(crate) struct CqShared {
    /// The completions waiting to be polled: a box owned by this struct, replaced only
    /// by `resize` (devices with one engine thread), which first waits for `readers` to
    /// drain.
    q: AtomicPtr<ArrayQueue<Wc>>,
    /// Pollers inside the queue right now (every poll writes it: its own cache line,
    /// away from what the engine thread reads as it pushes).
    readers: CachePadded<AtomicUsize>,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    overflowed: AtomicBool,
    /// Armed by `req_notify`: 0 no, 1 the next completion, 2 the next solicited (or
    /// unsuccessful) one.
    armed: AtomicU8,
    /// Where a completion event goes: the channel and the token it reports.
    notify: Option<(Arc<CompChannel>, u64)>,
}

impl CqShared {
    fn new(depth: usize, notify: Option<(Arc<CompChannel>, u64)>) -> CqShared {
        CqShared {
            q: AtomicPtr::new(Box::into_raw(Box::new(ArrayQueue::new(depth.max(1))))),
            readers: CachePadded::new(AtomicUsize::new(0)),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            overflowed: AtomicBool::new(false),
            armed: AtomicU8::new(0),
            notify,
        }
    }

    /// Runs `f` on the current queue, counted as a reader so `resize` waits for it.
    #[inline]
    fn with_q<R>(&self, f: impl FnOnce(&ArrayQueue<Wc>) -> R) -> R {
        self.readers.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the pointer is a live box: `resize` frees an old one only after
        // swapping it out and seeing no reader left, and we counted ourselves in before
        // loading (both SeqCst, so a `resize` either waits for us or we see its new box).
        let r = f(unsafe { &*self.q.load(Ordering::SeqCst) });
        self.readers.fetch_sub(1, Ordering::Release);
        r
    }

    /// Queues a completion (the thread running the data path) and signals the channel
    /// if the CQ is armed for it. False when full. A thread blocked in [`Cq::wait`] is
    /// not woken here but by [`wake_waiters`](Self::wake_waiters) once per batch: a
    /// wake per completion cost the engine a futex call per message while the waiter
    /// was still waking up.
    pub(crate) fn push(&self, wc: Wc, solicited: bool) -> bool {
        // SAFETY: `resize` runs only on a device with one engine thread, as a control
        // call under the data path's lock, and pushes run under that lock too (the
        // engine thread's rounds or a caller's `run_here`): the box is live here
        // without counting.
        let q = unsafe { &*self.q.load(Ordering::Acquire) };
        if q.push(wc).is_err() {
            self.overflowed.store(true, Ordering::SeqCst);
            return false;
        }
        // Against `req_notify`'s store and fence: either it sees this completion when
        // it polls again, or this sees it armed (IBA 11.4.2.2: an event for a completion
        // added after the request).
        fence(Ordering::SeqCst);
        let a = self.armed.load(Ordering::SeqCst);
        if a != 0
            && (a == 1 || solicited || wc.status != crate::verbs::WcStatus::Success)
            && self.armed.swap(0, Ordering::SeqCst) != 0
            && let Some((ch, token)) = &self.notify
        {
            ch.notify(*token);
        }
        true
    }

    /// Wakes the threads blocked in [`Cq::wait`], after a batch of [`push`](Self::push)es.
    pub(crate) fn wake_waiters(&self) {
        // Against `wait`'s increment then emptiness check (both SeqCst): either it sees
        // the batch or this sees it waiting.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            wake(&self.lock, &self.cv);
        }
    }

    fn is_empty(&self) -> bool {
        self.with_q(|q| q.is_empty())
    }

    /// Replaces the queue by one of `depth` entries (a control call of the one engine
    /// thread, under the data path's lock that every push holds): refused if more
    /// completions wait than that.
    fn resize(&self, depth: usize) -> Result<(), Error> {
        // SAFETY: as in `push`, no push runs meanwhile, so the box is live.
        let len = unsafe { &*self.q.load(Ordering::Acquire) }.len();
        if depth == 0 || depth < len {
            return Err(Error::InvalidAttribute {
                name: "cqe",
                value: depth as u64,
                reason: "must be at least the completions the CQ holds",
            });
        }
        let new = Box::into_raw(Box::new(ArrayQueue::new(depth)));
        let old = self.q.swap(new, Ordering::SeqCst);
        while self.readers.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        // SAFETY: `old` came from Box::into_raw, is no longer reachable through `q`, and
        // no reader is left inside it: we own it again.
        let old = unsafe { Box::from_raw(old) };
        // SAFETY: `new` is the live box (only this thread replaces it).
        let nq = unsafe { &*new };
        while let Some(w) = old.pop() {
            let _ = nq.push(w);
        }
        // A poller that found the new queue empty during the copy may have armed the CQ
        // and gone to sleep: the completions moved in count as new for it.
        fence(Ordering::SeqCst);
        if !nq.is_empty()
            && self.armed.swap(0, Ordering::SeqCst) != 0
            && let Some((ch, token)) = &self.notify
        {
            ch.notify(*token);
        }
        Ok(())
    }
}

impl Drop for CqShared {
    fn drop(&mut self) {
        // SAFETY: the last owner: the box is ours to free, once.
        drop(unsafe { Box::from_raw(*self.q.get_mut()) });
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    pub id: u32,
    sh: Arc<CqShared>,
    /// The device's engine threads, when a poller of an empty CQ runs the data path
    /// itself (`RuntimeConfig::caller_rounds`): see [`worker::ShardSet::run_here`].
    rtc: Option<Arc<worker::ShardSet>>,
    /// `busy_poll`: [`Cq::wait`] then spins on the data path instead of sleeping.
    spin: bool,
}

impl Cq {
    /// Run-to-completion: an empty CQ's poller runs a round of the data path (when the
    /// device lets it), so the completion it polls for may be there when it looks. On
    /// one CPU, a round it cannot run is one another thread (the engine's, preempted
    /// in it) holds: the poller gives it the core to finish, rather than spin out its
    /// time slice. Whether the poll finds completions decides whether frames wake the
    /// sleeping engine thread meanwhile ([`worker::ShardSet::polled`]).
    #[inline]
    fn drive(&self) {
        if let Some(set) = &self.rtc {
            if self.sh.is_empty() && set.run_here().is_none() && set.lone {
                std::thread::yield_now();
            }
            set.polled(!self.sh.is_empty());
        }
    }

    /// `ibv_poll_cq`: up to `out.len()` completions; how many were written.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.drive();
        self.sh.with_q(|q| {
            let mut n = 0;
            while n < out.len() {
                match q.pop() {
                    Some(w) => {
                        out[n] = w;
                        n += 1;
                    }
                    None => break,
                }
            }
            n
        })
    }

    /// Polls up to `max` completions, handing each to `f` (the C ABI converts them in
    /// place): how many.
    #[inline]
    pub fn poll_with(&self, max: usize, mut f: impl FnMut(usize, Wc)) -> usize {
        self.drive();
        self.sh.with_q(|q| {
            let mut n = 0;
            while n < max {
                match q.pop() {
                    Some(w) => {
                        f(n, w);
                        n += 1;
                    }
                    None => break,
                }
            }
            n
        })
    }

    pub fn poll_one(&self) -> Option<Wc> {
        self.drive();
        self.sh.with_q(|q| q.pop())
    }

    /// Waits until a completion is there (or `timeout` passes); true if one is. A
    /// busy-polling caller that runs the data path itself spins on it instead of
    /// sleeping; one that does not busy-poll runs a round, then sleeps.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.drive();
        if !self.sh.is_empty() {
            return true;
        }
        if let Some(set) = &self.rtc
            && self.spin
            && set.runs_here()
        {
            let start = std::time::Instant::now();
            while self.sh.is_empty() && set.runs_here() {
                if start.elapsed() >= timeout {
                    return false;
                }
                match set.run_here() {
                    // The engine thread (or another caller) runs a round: let it.
                    None => std::thread::yield_now(),
                    Some(0) => std::hint::spin_loop(),
                    Some(_) => {}
                }
            }
            if !self.sh.is_empty() {
                return true;
            }
            // The engine stopped: wait below, as without run-to-completion.
        }
        if let Some(set) = &self.rtc {
            set.watch.resume();
        }
        self.sh.waiting.fetch_add(1, Ordering::SeqCst);
        let mut g = self.sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = std::time::Instant::now() + timeout;
        while self.sh.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            g = self
                .sh
                .cv
                .wait_timeout(g, left.min(Duration::from_millis(10)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.sh.waiting.fetch_sub(1, Ordering::SeqCst);
        !self.sh.is_empty()
    }

    /// Polls one completion, waiting up to `timeout` for it.
    pub fn next(&self, timeout: Duration) -> Option<Wc> {
        if let Some(w) = self.poll_one() {
            return Some(w);
        }
        self.wait(timeout);
        self.poll_one()
    }

    /// True once a completion could not be queued (the CQ was full).
    pub fn overflowed(&self) -> bool {
        self.sh.overflowed.load(Ordering::SeqCst)
    }

    /// `ibv_req_notify_cq`: the next completion (`solicited_only`: the next solicited or
    /// unsuccessful one) added to this CQ signals its completion channel once. Arming for
    /// any completion is not narrowed by a later solicited-only request (as rxe).
    pub fn req_notify(&self, solicited_only: bool) {
        // The caller is about to sleep on the channel: frames must wake the engine.
        if let Some(set) = &self.rtc {
            set.watch.resume();
        }
        if solicited_only {
            let _ = self
                .sh
                .armed
                .compare_exchange(0, 2, Ordering::SeqCst, Ordering::SeqCst);
        } else {
            self.sh.armed.store(1, Ordering::SeqCst);
        }
        // Pairs with the fence in `CqShared::push` (see there).
        fence(Ordering::SeqCst);
    }

    /// The completion channel and token this CQ signals, if it has one.
    pub fn channel(&self) -> Option<&(Arc<CompChannel>, u64)> {
        self.sh.notify.as_ref()
    }
}

/// The state a QP shares between the engine thread and its users.
pub(crate) struct QpShared {
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    srq: bool,
    pub(crate) state: AtomicU8,
    /// The engine thread that holds the QP.
    shard: AtomicUsize,
    // What posting threads write and what the engine thread writes live on cache lines
    // of their own: sharing one made every post wait for the line the engine had just
    // written (measured by benches/verbs_abi: the same post cost 230 or 490 ns from one
    // run to the next, by where the allocator put the struct).
    sq_posted: CachePadded<PostCount>,
    rq_posted: CachePadded<PostCount>,
    /// WQEs finished by the engine, plus those it refused.
    pub(crate) sq_done: CachePadded<AtomicU64>,
    pub(crate) rq_done: CachePadded<AtomicU64>,
    /// The QP's number is on its engine thread's doorbell queue.
    pub(crate) rung: CachePadded<AtomicBool>,
    /// Send and receive WRs posted and not yet taken by the engine thread.
    pub(crate) sq_ring: posted::PostRing<SendWr>,
    pub(crate) rq_ring: posted::PostRing<RecvWr>,
}

fn state_of(v: u8) -> QpState {
    match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        _ => QpState::Err,
    }
}

impl QpShared {
    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::SeqCst);
    }
}

/// A queue's count of WRs posted, written only by posting threads, with the engine's
/// `done` count as a poster last read it.
///
/// The engine thread stores `done` at every completion, so reading it took that cache
/// line back across cores on every post (a WR reposted per receive completion, as
/// `ib_send_bw`'s server does). `done` only grows, so a queue that has room by the count
/// last read has room by the current one; the current count is read only when the old
/// one says the queue is full.
#[derive(Default)]
pub(crate) struct PostCount {
    posted: AtomicU64,
    done_seen: AtomicU64,
}

impl PostCount {
    /// Takes one slot of a queue of `depth` whose WRs finished (or refused) are counted
    /// by `done`; false (and nothing taken) when it is full. Safe against posters in
    /// several threads: the slot is claimed first and given back if it was not there.
    fn claim(&self, done: &AtomicU64, depth: u32) -> bool {
        let p = self.posted.fetch_add(1, Ordering::SeqCst);
        let room = |d: u64| p.saturating_sub(d) < u64::from(depth);
        if room(self.done_seen.load(Ordering::Relaxed)) {
            return true;
        }
        let d = done.load(Ordering::SeqCst);
        self.done_seen.fetch_max(d, Ordering::Relaxed);
        if room(d) {
            return true;
        }
        self.posted.fetch_sub(1, Ordering::SeqCst);
        false
    }

    fn posted(&self) -> u64 {
        self.posted.load(Ordering::SeqCst)
    }

    /// WRs posted and not yet finished by `done`'s current count.
    fn outstanding(&self, done: &AtomicU64) -> u64 {
        self.posted().saturating_sub(done.load(Ordering::SeqCst))
    }
}

/// A queue pair.
#[derive(Clone)]
pub struct Qp {
    pub qpn: u32,
    sh: Arc<QpShared>,
    dev: Arc<Shared>,
}

impl Qp {
    pub fn state(&self) -> QpState {
        state_of(self.sh.state.load(Ordering::SeqCst))
    }

    pub fn qp_type(&self) -> QpType {
        self.sh.qp_type
    }

    /// The queue sizes it was created with.
    pub fn cap(&self) -> QpCap {
        self.sh.cap
    }

    /// Send WRs that can be posted now before the send queue is full.
    pub fn send_room(&self) -> u64 {
        u64::from(self.sh.cap.max_send_wr).saturating_sub(self.sq_used())
    }

    /// Send WRs posted and not yet completed.
    fn sq_used(&self) -> u64 {
        self.sh.sq_posted.outstanding(&self.sh.sq_done)
    }

    /// The checks `post_send` makes of a WR (the QP's state, the WR against the QP's
    /// capacities), without posting it: for posting a batch all or nothing.
    pub fn check_send(&self, wr: &SendWr) -> Result<(), Error> {
        let st = self.state();
        if matches!(st, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(Error::WrongState {
                qpn: self.qpn,
                state: st,
                why: "send WRs can be posted from RTS on",
            });
        }
        crate::engine::requester::validate_send_wr(
            self.sh.qp_type,
            &self.sh.cap,
            self.dev.info.limits.max_msg_sz,
            wr,
        )
    }

    /// `ibv_post_send`: checked here, executed by the engine thread (or, with caller
    /// rounds, by this caller when it is the only WR outstanding: `Shared::ring`). Allocates
    /// nothing; makes a system call only to wake a sleeping engine thread or to send.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), Error> {
        self.check_send(wr)?;
        if !self
            .sh
            .sq_posted
            .claim(&self.sh.sq_done, self.sh.cap.max_send_wr)
        {
            return Err(Error::QueueFull {
                what: "send",
                owner: self.qpn,
                depth: self.sh.cap.max_send_wr,
            });
        }
        let k = self.sh.shard.load(Ordering::SeqCst);
        // The one just claimed is the only one outstanding (asked only where it matters:
        // it reads the count the engine thread writes).
        let bell = if self.dev.rtc && self.sq_used() == 1 {
            Bell::First
        } else {
            Bell::Wake
        };
        if push_posted(&self.sh.sq_ring, wr, &self.dev.set, k).is_err()
            || !self.dev.ring(k, &self.sh.rung, self.qpn, bell)
        {
            return Err(stopped());
        }
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), Error> {
        let st = self.state();
        if st == QpState::Reset {
            return Err(Error::WrongState {
                qpn: self.qpn,
                state: st,
                why: "receive WRs can be posted from INIT on",
            });
        }
        if self.sh.srq {
            return Err(Error::InvalidWr("the QP receives from an SRQ; post there"));
        }
        if wr.sg_list.len() > self.sh.cap.max_recv_sge as usize {
            return Err(Error::InvalidWr("more SGEs than the QP's max_recv_sge"));
        }
        if !self
            .sh
            .rq_posted
            .claim(&self.sh.rq_done, self.sh.cap.max_recv_wr)
        {
            return Err(Error::QueueFull {
                what: "receive",
                owner: self.qpn,
                depth: self.sh.cap.max_recv_wr,
            });
        }
        let k = self.sh.shard.load(Ordering::SeqCst);
        // A QP in error completes the WR with a flush error, which its poller waits for.
        let bell = if st == QpState::Err {
            Bell::Wake
        } else {
            Bell::Quiet
        };
        if push_posted(&self.sh.rq_ring, wr, &self.dev.set, k).is_err()
            || !self.dev.ring(k, &self.sh.rung, self.qpn, bell)
        {
            return Err(stopped());
        }
        Ok(())
    }
}

/// The state an SRQ shares between the engine thread and its users.
pub(crate) struct SrqShared {
    id: u32,
    max_sge: u32,
    max_wr: AtomicU32,
    posted: PostCount,
    /// WRs taken by QPs or refused by the engine (mirrored by the engine thread).
    pub(crate) done: AtomicU64,
    pub(crate) ring: ArrayQueue<RecvWr>,
    pub(crate) rung: AtomicBool,
}

/// A shared receive queue.
#[derive(Clone)]
pub struct Srq {
    pub id: u32,
    sh: Arc<SrqShared>,
    dev: Arc<Shared>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Srq({})", self.id)
    }
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Qp(0x{:06x} {} {})",
            self.qpn,
            self.qp_type(),
            self.state()
        )
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cq({})", self.id)
    }
}

impl Srq {
    /// `ibv_post_srq_recv`: checked here (SGEs, room), executed by the engine thread.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), Error> {
        if wr.sg_list.len() > self.sh.max_sge as usize {
            return Err(Error::InvalidWr("more SGEs than the SRQ's max_sge"));
        }
        let depth = self.sh.max_wr.load(Ordering::SeqCst);
        if !self.sh.posted.claim(&self.sh.done, depth) {
            return Err(Error::QueueFull {
                what: "SRQ",
                owner: self.id,
                depth,
            });
        }
        if push_waiting(&self.sh.ring, *wr, &self.dev.set, 0).is_err()
            || !self
                .dev
                .ring(0, &self.sh.rung, SRQ_BELL | self.id, Bell::Wake)
        {
            return Err(stopped());
        }
        Ok(())
    }

    /// Receive WRs posted and not yet taken by a QP.
    pub fn outstanding(&self) -> u64 {
        self.sh.posted.outstanding(&self.sh.done)
    }
}

fn stopped() -> Error {
    Error::WrongState {
        qpn: 0,
        state: QpState::Err,
        why: "the engine thread has stopped",
    }
}

impl Device {
    /// Starts the engine thread(s) and the link; returns when both are up.
    pub fn open(mut cfg: RuntimeConfig) -> Result<Device, RuntimeError> {
        if cfg.port_ifname.is_none()
            && let LinkKind::Xdp { ifname, .. } = &cfg.link
        {
            cfg.port_ifname = Some(ifname.clone());
        }
        let threads = cfg.threads.max(1);
        if threads > 1 && !matches!(cfg.link, LinkKind::Xdp { .. }) {
            return Err(RuntimeError::Setup(
                "several engine threads need the AF_XDP link (one socket per queue)".into(),
            ));
        }
        if !cfg.cpus.is_empty() {
            let allowed = crate::host::allowed_cpus();
            if let Some(c) = cfg.cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(RuntimeError::Setup(format!(
                    "CPU {c} is not one this process may run on (allowed: {allowed:?})"
                )));
            }
        }
        // Resolved here, once: the engine thread and the callers act on the same answer.
        let lone = one_cpu();
        let rtc = threads == 1 && cfg.caller_rounds.unwrap_or(cfg.busy_poll || lone);
        cfg.caller_rounds = Some(rtc);
        let set = Arc::new(worker::ShardSet::new(threads, lone).map_err(RuntimeError::Setup)?);
        let (tx, ev_rx) = crossbeam::channel::unbounded();
        let (cm_tx, cm_rx) = crossbeam::channel::unbounded();
        let ev_tx = EventSink {
            tx,
            hook: cfg.event_hook.clone(),
            cm_tx,
            cm_hook: cfg.cm_hook.clone(),
        };
        let (ready_tx, ready_rx) = crossbeam::channel::bounded(1);
        let netns = cfg.netns.clone();
        let busy_poll = cfg.busy_poll;
        let set2 = set.clone();
        let handle = std::thread::Builder::new()
            .name("roce-xdp-engine".into())
            .spawn(move || worker::run(cfg, set2, ev_tx, ready_tx))
            .map_err(|e| RuntimeError::Setup(format!("spawning the engine thread: {e}")))?;
        let info = match ready_rx.recv() {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                let _ = handle.join();
                return Err(RuntimeError::Setup(e));
            }
            Err(_) => {
                let _ = handle.join();
                return Err(RuntimeError::Setup(
                    "the engine thread died while starting".into(),
                ));
            }
        };
        let sh = Arc::new(Shared {
            set,
            events: ev_rx,
            cm_events: cm_rx,
            info,
            netns,
            busy_poll,
            rtc,
        });
        Ok(Device {
            sh,
            thread: Arc::new(Mutex::new(Some(handle))),
        })
    }

    /// True when callers run the data path as they poll and post
    /// ([`RuntimeConfig::caller_rounds`], resolved at open).
    pub fn caller_rounds(&self) -> bool {
        self.sh.rtc
    }

    /// True when callers run the data path and the process has one CPU: the engine
    /// thread then sleeps whenever it is idle, so a poller gains nothing by yielding.
    pub fn callers_alone(&self) -> bool {
        self.sh.rtc && self.sh.set.lone
    }

    /// How many rounds of the data path callers ran that did work: a poller that
    /// finds its CQ empty but this moved did the engine's work, and was not idle.
    pub fn caller_work(&self) -> u64 {
        self.sh.set.rtc_work.load(Ordering::Relaxed)
    }

    /// Identifies this device among those open in the process (equal for its clones).
    pub fn key(&self) -> usize {
        Arc::as_ptr(&self.sh) as usize
    }

    /// True when the engine threads spin instead of sleeping when idle (`busy_poll`;
    /// with one engine thread, they sleep while callers run the data path as they poll).
    pub fn busy_poll(&self) -> bool {
        self.sh.busy_poll
    }

    /// How many batches of completions the engine threads have handed out, on any CQ:
    /// a value to pass to [`Device::wait_completions`].
    pub fn completion_beats(&self) -> u64 {
        self.sh.set.pulse.beats()
    }

    /// Sleeps until completions are handed out to any CQ of this device after
    /// [`Device::completion_beats`] returned `seen`, or until `timeout` passes.
    pub fn wait_completions(&self, seen: u64, timeout: Duration) {
        self.sh.set.pulse.wait(seen, timeout)
    }

    /// Starts a section of the capture (`RuntimeConfig::pcap`): its first frame carries
    /// `comment` (with `pcap_ng`), and at most `limit` frames of it are kept, so that a
    /// long run's capture samples each of its steps. No-op without a capture.
    pub fn capture_section(&self, comment: &str, limit: u64) {
        let mut g = self.sh.set.tap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = g.as_mut() {
            w.begin_section(comment, limit);
        }
    }

    /// Frames the capture left out because their section was full.
    pub fn capture_skipped(&self) -> u64 {
        let g = self.sh.set.tap.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map_or(0, |w| w.skipped())
    }

    /// How many engine threads run this device.
    pub fn threads(&self) -> usize {
        self.sh.set.len()
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.sh.info
    }

    /// Runs `f` on engine thread 0 and returns its result.
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut worker::Locals) -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        self.call_on(0, f)
    }

    /// Runs `f` on engine thread `k` and returns its result.
    fn call_on<R: Send + 'static>(
        &self,
        k: usize,
        f: impl FnOnce(&mut worker::Locals) -> R + Send + 'static,
    ) -> Result<R, RuntimeError> {
        let (tx, rx) = crossbeam::channel::bounded(1);
        let c: Call = Box::new(move |l| {
            let _ = tx.send(f(l));
        });
        if !self.sh.set.send(k, Cmd::Call(c)) {
            return Err(RuntimeError::Stopped);
        }
        rx.recv().map_err(|_| RuntimeError::Stopped)
    }

    /// Runs a verbs call on every engine thread (object tables are replicas); the
    /// results must agree, as the same calls in the same order give the same handles.
    fn verbs_all<R: Send + PartialEq + std::fmt::Debug + 'static>(
        &self,
        f: impl Fn(&mut worker::Locals) -> Result<R, Error> + Send + Clone + 'static,
    ) -> Result<R, RuntimeError> {
        let first = self.verbs(f.clone())?;
        for k in 1..self.threads() {
            let r = self.call_on(k, f.clone())??;
            if r != first {
                return Err(RuntimeError::Setup(format!(
                    "engine thread {k} answered {r:?} where thread 0 answered {first:?}"
                )));
            }
        }
        Ok(first)
    }

    /// The engine thread that holds QP `qp`.
    fn owner(&self, qp: &Qp) -> usize {
        qp.sh.shard.load(Ordering::SeqCst)
    }

    fn verbs<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut worker::Locals) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, RuntimeError> {
        Ok(self.call(f)??)
    }

    pub fn alloc_pd(&self) -> Result<u32, RuntimeError> {
        self.verbs_all(|l| l.engine.alloc_pd())
    }

    /// `ibv_dealloc_pd`: refused while MRs, windows, SRQs or QPs use it.
    pub fn dealloc_pd(&self, pd: u32) -> Result<(), RuntimeError> {
        self.verbs_all(move |l| l.engine.dealloc_pd(pd))
    }

    pub fn reg_mr(
        &self,
        pd: u32,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, RuntimeError> {
        let iova = mem.addr().wrapping_add(offset as u64);
        self.reg_mr_iova(pd, mem, offset, len, iova, access)
    }

    /// `ibv_reg_mr_iova2`: as `reg_mr`, with the address peers use chosen by the caller.
    pub fn reg_mr_iova(
        &self,
        pd: u32,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, RuntimeError> {
        let m = mem.clone();
        let info = self.verbs(move |l| l.engine.reg_mr_iova(pd, &m, offset, len, iova, access))?;
        for k in 1..self.threads() {
            let m = mem.clone();
            self.call_on(k, move |l| l.engine.reg_mr_replica(&info, &m, offset))??;
        }
        Ok(info)
    }

    pub fn dereg_mr(&self, lkey: u32) -> Result<(), RuntimeError> {
        self.verbs_all(move |l| l.engine.dereg_mr(lkey))
    }

    /// `ibv_alloc_mw(pd, IBV_MW_TYPE_2)`; bind it with a BIND_MW work request
    /// ([`SendWr::bind_mw`](crate::verbs::SendWr::bind_mw)) on the QP that will use it.
    ///
    /// One engine thread only: a bind runs in the table of the thread that owns the QP,
    /// and a QP may move between threads when it connects, so with several threads the
    /// copies of a window would disagree (as with SRQs, refused rather than wrong).
    pub fn alloc_mw(&self, pd: u32) -> Result<Mw, RuntimeError> {
        if self.threads() > 1 {
            return Err(RuntimeError::Setup(
                "memory windows need a device with one engine thread (threads = 1)".into(),
            ));
        }
        self.verbs(move |l| l.engine.alloc_mw(pd))
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc_mw(&self, handle: u32) -> Result<(), RuntimeError> {
        self.verbs_all(move |l| l.engine.dealloc_mw(handle))
    }

    /// `ibv_create_cq` with `depth` entries.
    pub fn create_cq(&self, depth: usize) -> Result<Cq, RuntimeError> {
        self.create_cq_with(depth, None)
    }

    /// `ibv_create_cq` with a completion channel: after `Cq::req_notify`, the next
    /// completion queues `token` on `channel` (the C ABI passes the `ibv_cq` address).
    pub fn create_cq_with(
        &self,
        depth: usize,
        channel: Option<(Arc<CompChannel>, u64)>,
    ) -> Result<Cq, RuntimeError> {
        let sh = Arc::new(CqShared::new(depth, channel));
        let s2 = sh.clone();
        let id = self.verbs_all(move |l| {
            let id = l.engine.create_cq(depth)?;
            l.cqs.insert(id, s2.clone());
            Ok(id)
        })?;
        let rtc = self.sh.rtc.then(|| self.sh.set.clone());
        Ok(Cq {
            id,
            sh,
            rtc,
            spin: self.sh.busy_poll,
        })
    }

    /// `ibv_destroy_cq`: refused while QPs use it. Completion events it still had queued
    /// on its channel are taken out.
    pub fn destroy_cq(&self, cq: &Cq) -> Result<(), RuntimeError> {
        let id = cq.id;
        self.verbs_all(move |l| {
            l.engine.destroy_cq(id)?;
            l.cqs.remove(&id);
            Ok(())
        })?;
        if let Some((ch, token)) = cq.channel() {
            ch.forget(|t| t == token);
        }
        Ok(())
    }

    /// `ibv_resize_cq`: the CQ holds `depth` completions from now on (refused below the
    /// number it holds). One engine thread only: the queue is replaced under the lock
    /// its fillers hold, and with several engine threads each would fill it.
    pub fn resize_cq(&self, cq: &Cq, depth: usize) -> Result<(), RuntimeError> {
        if self.threads() > 1 {
            return Err(RuntimeError::Setup(
                "resizing a CQ needs a device with one engine thread (threads = 1)".into(),
            ));
        }
        let (id, sh) = (cq.id, cq.sh.clone());
        self.verbs(move |l| {
            l.engine.resize_cq(id, depth)?;
            sh.resize(depth)
        })
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInitAttr) -> Result<Qp, RuntimeError> {
        let init = *init;
        let sh = self.verbs(move |l| {
            let qpn = l.engine.create_qp(&init)?;
            let rq = if init.srq.is_some() {
                1
            } else {
                init.cap.max_recv_wr as usize
            };
            let sh = Arc::new(QpShared {
                qpn,
                qp_type: init.qp_type,
                cap: init.cap,
                srq: init.srq.is_some(),
                state: AtomicU8::new(QpState::Reset as u8),
                sq_posted: CachePadded::default(),
                sq_done: CachePadded::new(AtomicU64::new(0)),
                rq_posted: CachePadded::default(),
                rq_done: CachePadded::new(AtomicU64::new(0)),
                shard: AtomicUsize::new(0),
                sq_ring: posted::PostRing::new((init.cap.max_send_wr as usize).clamp(1, RING_MAX)),
                rq_ring: posted::PostRing::new(rq.clamp(1, RING_MAX)),
                rung: CachePadded::new(AtomicBool::new(false)),
            });
            l.qps.insert(qpn, (sh.clone(), 0, 0));
            l.set
                .owners
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qpn, 0);
            Ok(sh)
        })?;
        Ok(Qp {
            qpn: sh.qpn,
            sh,
            dev: self.sh.clone(),
        })
    }

    /// Completes an address vector with the next hop's MAC: its own `dmac` if set, this
    /// device's MAC for one of its own GIDs (looped back, never sent), else the kernel's
    /// neighbour table, resolving the address if it is missing. The UDP link needs none.
    pub fn complete_av(&self, av: &mut AddressVector) -> Result<(), RuntimeError> {
        if av.dmac.is_some() || self.sh.info.udp {
            return Ok(());
        }
        if self.sh.info.gids.contains(&av.dgid) {
            av.dmac = Some(self.sh.info.mac);
            return Ok(());
        }
        av.dmac = Some(self.resolve(crate::verbs::device::ip_of(&av.dgid))?);
        Ok(())
    }

    /// `ibv_modify_qp`. An address vector without a destination MAC is completed first
    /// (`complete_av`).
    pub fn modify_qp(&self, qp: &Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<(), RuntimeError> {
        let mut attr = *attr;
        if mask.contains(QpAttrMask::AV) {
            self.complete_av(&mut attr.ah_attr)?;
        }
        if self.threads() > 1
            && mask.contains(QpAttrMask::STATE)
            && attr.qp_state == QpState::Rtr
            && qp.state() == QpState::Init
        {
            self.settle(qp, &attr)?;
        }
        let qpn = qp.qpn;
        let sh = qp.sh.clone();
        self.call_on(self.owner(qp), move |l| {
            let r = l.engine.modify_qp(qpn, &attr, mask);
            if let Some(s) = l.engine.qp_state(qpn) {
                sh.set_state(s);
            }
            r
        })??;
        Ok(())
    }

    /// Before RTR, moves an RC/UC QP to the engine thread whose queue the peer's UDP
    /// source port selects (`port % threads`: with one thread per queue, a peer of the
    /// same kind sends on that queue and RSS-by-port NICs agree). UD QPs stay on
    /// thread 0.
    fn settle(&self, qp: &Qp, attr: &QpAttr) -> Result<(), RuntimeError> {
        let qpn = qp.qpn;
        let from = self.owner(qp);
        let a = *attr;
        let Some(port) = self.call_on(from, move |l| l.engine.peer_udp_sport(qpn, &a))? else {
            return Ok(());
        };
        let to = usize::from(port) % self.threads();
        if to == from {
            return Ok(());
        }
        let sh = qp.sh.clone();
        let moved = self.call_on(from, move |l| {
            let q = l.engine.take_qp(qpn)?;
            let reg = l.qps.remove(&qpn)?;
            // From now on `from` hands this QP's doorbells on to `to`, which holds them
            // until the QP arrives.
            l.set
                .owners
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qpn, to);
            sh.shard.store(to, Ordering::SeqCst);
            Some((q, reg))
        })?;
        let Some((q, reg)) = moved else {
            return Ok(());
        };
        self.call_on(to, move |l| {
            l.qps.insert(qpn, reg);
            let r = l.engine.adopt_qp(q);
            worker::replay_held(l, qpn);
            r
        })??;
        Ok(())
    }

    /// The MAC of a neighbour, from the kernel's table of the link's namespace, resolving
    /// it (ARP or ND) if missing. Also tells the engine.
    pub fn resolve(&self, ip: IpAddr) -> Result<[u8; 6], RuntimeError> {
        let Some(ifname) = self.sh.info.ifname.clone() else {
            return Err(RuntimeError::Setup("no interface to resolve on".into()));
        };
        let netns = self.sh.netns.clone();
        let names = self.netdevs();
        let mac = std::thread::spawn(move || {
            if let Some(ns) = &netns {
                crate::host::enter_netns(ns).map_err(|e| e.to_string())?;
            }
            let wait = Duration::from_secs(3);
            crate::host::resolve_neighbor_on(&names, ip, wait).ok_or_else(|| {
                format!(
                    "no neighbour entry for {ip} on {ifname} and no answer to ARP/ND within 3 s"
                )
            })
        })
        .join()
        .map_err(|_| RuntimeError::Setup("neighbour resolution thread panicked".into()))?
        .map_err(RuntimeError::Setup)?;
        for k in 0..self.threads() {
            self.call_on(k, move |l| l.engine.set_neighbor(ip, mac))?;
        }
        Ok(mac)
    }

    pub fn destroy_qp(&self, qp: Qp) -> Result<(), RuntimeError> {
        let qpn = qp.qpn;
        self.call_on(self.owner(&qp), move |l| {
            l.qps.remove(&qpn);
            l.set
                .owners
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&qpn);
            l.engine.destroy_qp(qpn)
        })??;
        Ok(())
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&self, qp: &Qp) -> Result<QpAttr, RuntimeError> {
        let qpn = qp.qpn;
        self.call_on(self.owner(qp), move |l| l.engine.query_qp(qpn).map(|x| x.0))?
            .map_err(RuntimeError::from)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<Srq, RuntimeError> {
        if self.threads() > 1 {
            // Its receives would be consumed by QPs on several engine threads.
            return Err(RuntimeError::Setup(
                "SRQs need a device with one engine thread (threads = 1)".into(),
            ));
        }
        let sh = self.verbs(move |l| {
            let id = l.engine.create_srq(pd, max_wr, max_sge)?;
            let sh = Arc::new(SrqShared {
                id,
                max_sge,
                max_wr: AtomicU32::new(max_wr),
                posted: PostCount::default(),
                done: AtomicU64::new(0),
                ring: ArrayQueue::new((max_wr as usize).clamp(1, RING_MAX)),
                rung: AtomicBool::new(false),
            });
            l.srqs.insert(id, (sh.clone(), 0));
            Ok(sh)
        })?;
        Ok(Srq {
            id: sh.id,
            sh,
            dev: self.sh.clone(),
        })
    }

    /// `ibv_modify_srq`: a new `max_wr` (resize) and/or an armed limit (see
    /// `Engine::modify_srq`).
    pub fn modify_srq(
        &self,
        srq: &Srq,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), RuntimeError> {
        let (id, sh) = (srq.id, srq.sh.clone());
        self.verbs(move |l| {
            // The WRs still in the ring count as held by the SRQ.
            worker::drain_srq(l, id);
            l.engine.modify_srq(id, max_wr, limit)?;
            if let Some(m) = max_wr {
                sh.max_wr.store(m, Ordering::SeqCst);
            }
            Ok(())
        })
    }

    /// `ibv_query_srq`: (max_wr, max_sge, srq_limit).
    pub fn query_srq(&self, srq: &Srq) -> Result<(u32, u32, u32), RuntimeError> {
        let id = srq.id;
        self.verbs(move |l| l.engine.query_srq(id))
    }

    /// `ibv_destroy_srq`: refused while QPs use it.
    pub fn destroy_srq(&self, srq: &Srq) -> Result<(), RuntimeError> {
        let id = srq.id;
        self.verbs(move |l| {
            l.engine.destroy_srq(id)?;
            l.srqs.remove(&id);
            Ok(())
        })
    }

    /// True while the port is active: its interface up with a carrier (always, without
    /// an interface to watch).
    pub fn port_active(&self) -> bool {
        self.sh.set.port_up.load(Ordering::SeqCst)
    }

    /// The next asynchronous event, waiting up to `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.sh.events.recv_timeout(timeout).ok()
    }

    // ----- the Communication Manager on QP1 (engine thread 0 runs it) -----

    /// Takes REQs and SIDR_REQs for `service_id` (rdma_cm: port space << 16 | port).
    pub fn cm_listen(&self, service_id: u64) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_listen(service_id))
    }

    pub fn cm_unlisten(&self, service_id: u64) -> Result<(), RuntimeError> {
        self.verbs(move |l| {
            l.engine.cm_unlisten(service_id);
            Ok(())
        })
    }

    /// Sends a REQ; the connection's ID, which the CM events name.
    pub fn cm_connect(&self, p: ConnectParams) -> Result<u32, RuntimeError> {
        self.verbs(move |l| l.engine.cm_connect(&p))
    }

    pub fn cm_accept(&self, id: u32, p: AcceptParams) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_accept(id, &p))
    }

    pub fn cm_reject(&self, id: u32, reason: u16, pdata: Vec<u8>) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_reject(id, reason, &pdata))
    }

    /// Active side, QP in RTS: sends the RTU.
    pub fn cm_establish(&self, id: u32, pdata: Vec<u8>) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_establish(id, &pdata))
    }

    pub fn cm_disconnect(&self, id: u32, pdata: Vec<u8>) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_disconnect(id, &pdata))
    }

    /// The consumer is done with connection `id`.
    pub fn cm_destroy(&self, id: u32) -> Result<(), RuntimeError> {
        self.verbs(move |l| {
            l.engine.cm_destroy(id);
            Ok(())
        })
    }

    pub fn cm_sidr_request(&self, p: SidrParams) -> Result<u32, RuntimeError> {
        self.verbs(move |l| l.engine.cm_sidr_request(&p))
    }

    pub fn cm_sidr_reply(
        &self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        pdata: Vec<u8>,
    ) -> Result<(), RuntimeError> {
        self.verbs(move |l| l.engine.cm_sidr_reply(id, status, qpn, qkey, &pdata))
    }

    /// Before the engine stops with its process: disconnects every CM connection and
    /// waits (up to `linger`) until the exchanges are done, so that the peers get their
    /// DREQs and DREPs as from a kernel CM that outlives the process.
    pub fn cm_linger(&self, linger: Duration) {
        if self
            .verbs(|l| {
                l.engine.cm_close_all();
                Ok(())
            })
            .is_err()
        {
            return;
        }
        let until = std::time::Instant::now() + linger;
        while std::time::Instant::now() < until {
            match self.verbs(|l| Ok(l.engine.cm_settling())) {
                Ok(true) => std::thread::sleep(Duration::from_millis(10)),
                _ => return,
            }
        }
    }

    /// Moves QP `qpn` to ERR if it still exists (what the kernel's rdma_cm does to a
    /// connection's QP on a DREQ): by number, since the QP's owner may destroy it at any
    /// moment; QP numbers are not reused soon (they count up through 24 bits).
    pub fn qp_to_error(&self, qpn: u32) -> Result<(), RuntimeError> {
        let k = self.sh.set.owner(qpn).unwrap_or(0);
        self.call_on(k, move |l| {
            let a = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            if l.engine.has_qp(qpn) {
                let _ = l.engine.modify_qp(qpn, &a, QpAttrMask::STATE);
            }
        })
    }

    /// Adds a neighbour entry (the MAC of `ip`) to the engine's table.
    pub fn set_neighbor(&self, ip: IpAddr, mac: [u8; 6]) -> Result<(), RuntimeError> {
        self.verbs_all(move |l| {
            l.engine.set_neighbor(ip, mac);
            Ok(())
        })
    }

    pub fn cm_counters(&self) -> Result<CmCounters, RuntimeError> {
        self.verbs(|l| Ok(*l.engine.cm_counters()))
    }

    /// The next CM event (without a [`RuntimeConfig::cm_hook`]), waiting up to `timeout`.
    pub fn next_cm_event(&self, timeout: Duration) -> Option<CmEvent> {
        self.sh.cm_events.recv_timeout(timeout).ok()
    }

    /// The engine's counters and the link's, as last published (every few ms).
    pub fn stats(&self) -> Stats {
        Stats::total(&self.sh.set.stats)
    }

    /// Each engine thread's counters as last published (one entry per thread).
    pub fn thread_stats(&self) -> Vec<Stats> {
        self.sh
            .set
            .stats
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .collect()
    }

    /// One QP's transport state (PSNs, queues, timers) in words, for stall reports.
    pub fn qp_debug(&self, qpn: u32) -> String {
        let k = self.sh.set.owner(qpn).unwrap_or(0);
        self.call_on(k, move |l| l.engine.qp_debug(qpn))
            .unwrap_or_else(|e| e.to_string())
    }

    /// Current counters, fetched from the engine thread.
    pub fn counters(&self) -> Result<Counters, RuntimeError> {
        let mut c = Counters::default();
        for k in 0..self.threads() {
            c.add(&self.call_on(k, |l| *l.engine.counters())?);
        }
        Ok(c)
    }

    /// The names of the interfaces the port's neighbours are on: its own and its VLAN
    /// subinterfaces'.
    pub fn netdevs(&self) -> Vec<String> {
        self.sh
            .info
            .ifname
            .iter()
            .cloned()
            .chain(self.sh.info.vlans.iter().map(|v| v.name.clone()))
            .collect()
    }

    /// The VLAN subinterface a GID belongs to (`None`: the port's own interface).
    pub fn gid_vlan(&self, index: u8) -> Option<&crate::verbs::VlanNetdev> {
        let vid = (*self.sh.info.gid_vlans.get(usize::from(index))?)?;
        self.sh.info.vlans.iter().find(|v| v.vid == vid)
    }

    /// The GID at `index`.
    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.sh.info.gids.get(usize::from(index)).copied()
    }

    /// The GID index of `ip`.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let g = crate::verbs::device::gid_of(ip);
        self.sh
            .info
            .gids
            .iter()
            .position(|x| *x == g)
            .map(|i| i as u8)
    }

    /// An address vector to `ip` from the local GID of the same IP version.
    pub fn av_to(&self, ip: IpAddr) -> AddressVector {
        let idx = self
            .sh
            .info
            .gids
            .iter()
            .position(|g| {
                let local = crate::verbs::device::ip_of(g);
                local.is_ipv4() == ip.is_ipv4()
                    && !matches!(local, IpAddr::V6(v) if v.segments()[0] == 0xfe80)
            })
            .unwrap_or(1) as u8;
        AddressVector::new(crate::verbs::device::gid_of(ip), idx)
    }

    /// Stops the engine: every QP to ERR (its WRs flushed), XDP detached, UMEM freed.
    pub fn shutdown(&self) {
        self.sh.set.stopped.store(true, Ordering::SeqCst);
        let _ = self.sh.set.links[0]
            .cmds
            .send(Cmd::Call(Box::new(|l| l.stop = true)));
        self.sh.set.links[0]
            .wake
            .sleeping
            .store(true, Ordering::SeqCst);
        self.sh.set.links[0].wake.ring();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if Arc::strong_count(&self.thread) == 1 {
            self.shutdown();
        }
    }
}

/// A map keyed by a QPN, CQ or SRQ handle: small integers, looked up per delivered
/// batch, so the engine's multiplicative hasher rather than SipHash.
pub(crate) type HandleMap<V> =
    HashMap<u32, V, std::hash::BuildHasherDefault<crate::engine::QpnHasher>>;
/// Engine-thread-side registries, passed to control calls.
pub(crate) type QpRegistry = HandleMap<(Arc<QpShared>, u64, u64)>;
/// SRQ -> (shared state, receive WRs refused).
pub(crate) type SrqRegistry = HandleMap<(Arc<SrqShared>, u64)>;

#[cfg(test)]
mod tests {
    use super::PostCount;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The done count a poster last read may be old: a queue that looks full by it is
    /// asked again, and one that is full by the current count refuses without keeping
    /// the slot it tried.
    #[test]
    fn a_claim_reads_done_again_before_refusing() {
        let (c, done) = (PostCount::default(), AtomicU64::new(0));
        assert!((0..4).all(|_| c.claim(&done, 4)));
        assert!(!c.claim(&done, 4));
        assert_eq!(c.posted(), 4);
        // Two finish: the count read before says full, the current one has room for two.
        done.store(2, Ordering::SeqCst);
        assert!(c.claim(&done, 4) && c.claim(&done, 4));
        assert!(!c.claim(&done, 4));
        assert_eq!(c.posted(), 6);
        // A deeper queue (an SRQ's max_wr raised) takes more on the count last read.
        assert!(c.claim(&done, 5));
        assert!(!c.claim(&done, 5));
    }

    /// Posters in several threads against a consumer that finishes WRs meanwhile never
    /// have more than `depth` outstanding, and every slot finished is taken again. The
    /// consumer stops everyone at the first excess, and a deadline bounds the run.
    #[test]
    fn claims_from_several_threads_never_exceed_the_depth() {
        use std::sync::atomic::AtomicBool;
        use std::time::{Duration, Instant};
        const DEPTH: u32 = 8;
        const ROUNDS: u64 = 20_000;
        let (c, done, taken) = (PostCount::default(), AtomicU64::new(0), AtomicU64::new(0));
        let (stop, worst) = (AtomicBool::new(false), AtomicU64::new(0));
        let until = Instant::now() + Duration::from_secs(20);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let mut got = 0;
                    while got < ROUNDS && !stop.load(Ordering::SeqCst) {
                        if c.claim(&done, DEPTH) {
                            taken.fetch_add(1, Ordering::SeqCst);
                            got += 1;
                        } else {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            // The consumer: finishes one WR at a time, of those claimed.
            s.spawn(|| {
                while done.load(Ordering::SeqCst) < 3 * ROUNDS && Instant::now() < until {
                    let (t, d) = (taken.load(Ordering::SeqCst), done.load(Ordering::SeqCst));
                    worst.fetch_max(t - d, Ordering::SeqCst);
                    if t - d > u64::from(DEPTH) {
                        break;
                    }
                    if t > d {
                        done.fetch_add(1, Ordering::SeqCst);
                    } else {
                        std::thread::yield_now();
                    }
                }
                stop.store(true, Ordering::SeqCst);
            });
        });
        let worst = worst.load(Ordering::SeqCst);
        assert!(worst <= u64::from(DEPTH), "{worst} outstanding");
        assert_eq!(done.load(Ordering::SeqCst), 3 * ROUNDS, "ran out of time");
        assert_eq!(c.posted(), 3 * ROUNDS);
    }
}

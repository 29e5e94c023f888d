//! The runtime: the sans-IO engine on a poll-mode thread over a real link, used through a
//! thread-safe verbs API.
//!
//! - [`Device::open`] starts the engine thread (inside a network namespace if asked),
//!   opens the link there (AF_XDP, or UDP sockets), and hands back a handle.
//! - Control calls (`reg_mr`, `create_qp`, `modify_qp`, ...) run on the engine thread
//!   and return its answer.
//! - `post_send` / `post_recv` are checked in the caller's thread (state, queue room,
//!   SGEs, inline size: the errors ibverbs returns) and then rung as doorbells through a
//!   `crossbeam` channel; the engine thread sleeps only when idle and is woken by an
//!   eventfd only then.
//! - Completions reach each CQ through a lock-free `crossbeam` `ArrayQueue`; `Cq::wait`
//!   sleeps on a condition variable that the engine thread touches only when someone
//!   waits.
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

mod worker;

use crate::engine::Counters;
use crate::link::xdp::XdpConfig;
use crate::verbs::{
    AccessFlags, AddressVector, AsyncEvent, DeviceConfig, Error, Gid, Memory, MrInfo, Mtu, Mw,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendWr, Wc,
};
use crossbeam::channel::Receiver;
use crossbeam::queue::ArrayQueue;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
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
    /// Spin instead of sleeping when idle (lowest latency, one core busy).
    pub busy_poll: bool,
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Stop writing the pcap after this many frames (long runs make huge captures).
    pub pcap_max_frames: Option<u64>,
    /// Publish counters to this JSON file every 500 ms (what `roce-xdp stats` reads).
    pub stats_file: Option<PathBuf>,
    /// Override of the port MTU (IB MTU) the interface's MTU would give.
    pub port_mtu: Option<Mtu>,
    /// Engine threads (AF_XDP only): the interface's receive queues are split among
    /// them, each with its own engine. RC/UC QPs settle, at RTR, on the thread whose
    /// queue the peer's UDP source port selects, as RSS would; frames that arrive on
    /// another thread's queue are handed over.
    pub threads: usize,
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
            pcap: None,
            pcap_max_frames: None,
            stats_file: None,
            port_mtu: None,
            threads: 1,
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
    PostSend(u32, Box<SendWr>),
    PostRecv(u32, RecvWr),
    PostSrqRecv(u32, RecvWr),
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
    info: DeviceInfo,
    netns: Option<String>,
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
    q: ArrayQueue<Wc>,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    overflowed: AtomicBool,
}

impl CqShared {
    /// Queues a completion (engine thread). False when full.
    pub(crate) fn push(&self, wc: Wc) -> bool {
        if self.q.push(wc).is_err() {
            self.overflowed.store(true, Ordering::SeqCst);
            return false;
        }
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
        true
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    pub id: u32,
    sh: Arc<CqShared>,
}

impl Cq {
    /// `ibv_poll_cq`: up to `out.len()` completions; how many were written.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.sh.q.pop() {
                Some(w) => {
                    out[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    pub fn poll_one(&self) -> Option<Wc> {
        self.sh.q.pop()
    }

    /// Waits until a completion is there (or `timeout` passes); true if one is.
    pub fn wait(&self, timeout: Duration) -> bool {
        if !self.sh.q.is_empty() {
            return true;
        }
        self.sh.waiting.fetch_add(1, Ordering::SeqCst);
        let mut g = self.sh.lock.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = std::time::Instant::now() + timeout;
        while self.sh.q.is_empty() {
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
        !self.sh.q.is_empty()
    }

    /// Polls one completion, waiting up to `timeout` for it.
    pub fn next(&self, timeout: Duration) -> Option<Wc> {
        if let Some(w) = self.sh.q.pop() {
            return Some(w);
        }
        self.wait(timeout);
        self.sh.q.pop()
    }

    /// True once a completion could not be queued (the CQ was full).
    pub fn overflowed(&self) -> bool {
        self.sh.overflowed.load(Ordering::SeqCst)
    }
}

/// The state a QP shares between the engine thread and its users.
pub(crate) struct QpShared {
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    srq: bool,
    state: AtomicU8,
    sq_posted: AtomicU64,
    /// WQEs finished by the engine, plus those it refused.
    pub(crate) sq_done: AtomicU64,
    rq_posted: AtomicU64,
    pub(crate) rq_done: AtomicU64,
    /// The engine thread that holds the QP.
    shard: AtomicUsize,
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

    /// `ibv_post_send`: checked here, executed by the engine thread.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), Error> {
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
        )?;
        let posted = self.sh.sq_posted.load(Ordering::SeqCst);
        let done = self.sh.sq_done.load(Ordering::SeqCst);
        if posted.saturating_sub(done) >= u64::from(self.sh.cap.max_send_wr) {
            return Err(Error::QueueFull {
                what: "send",
                owner: self.qpn,
                depth: self.sh.cap.max_send_wr,
            });
        }
        self.sh.sq_posted.fetch_add(1, Ordering::SeqCst);
        let k = self.sh.shard.load(Ordering::SeqCst);
        if !self.dev.set.send(k, Cmd::PostSend(self.qpn, Box::new(*wr))) {
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
        let posted = self.sh.rq_posted.load(Ordering::SeqCst);
        let done = self.sh.rq_done.load(Ordering::SeqCst);
        if posted.saturating_sub(done) >= u64::from(self.sh.cap.max_recv_wr) {
            return Err(Error::QueueFull {
                what: "receive",
                owner: self.qpn,
                depth: self.sh.cap.max_recv_wr,
            });
        }
        self.sh.rq_posted.fetch_add(1, Ordering::SeqCst);
        let k = self.sh.shard.load(Ordering::SeqCst);
        if !self.dev.set.send(k, Cmd::PostRecv(self.qpn, *wr)) {
            return Err(stopped());
        }
        Ok(())
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
    pub fn open(cfg: RuntimeConfig) -> Result<Device, RuntimeError> {
        let threads = cfg.threads.max(1);
        if threads > 1 && !matches!(cfg.link, LinkKind::Xdp { .. }) {
            return Err(RuntimeError::Setup(
                "several engine threads need the AF_XDP link (one socket per queue)".into(),
            ));
        }
        let set = Arc::new(worker::ShardSet::new(threads).map_err(RuntimeError::Setup)?);
        let (ev_tx, ev_rx) = crossbeam::channel::unbounded();
        let (ready_tx, ready_rx) = crossbeam::channel::bounded(1);
        let netns = cfg.netns.clone();
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
            info,
            netns,
        });
        Ok(Device {
            sh,
            thread: Arc::new(Mutex::new(Some(handle))),
        })
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

    pub fn reg_mr(
        &self,
        pd: u32,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, RuntimeError> {
        let m = mem.clone();
        let info = self.verbs(move |l| l.engine.reg_mr(pd, &m, offset, len, access))?;
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
        let sh = Arc::new(CqShared {
            q: ArrayQueue::new(depth.max(1)),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            overflowed: AtomicBool::new(false),
        });
        let s2 = sh.clone();
        let id = self.verbs_all(move |l| {
            let id = l.engine.create_cq(depth)?;
            l.cqs.insert(id, s2.clone());
            Ok(id)
        })?;
        Ok(Cq { id, sh })
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInitAttr) -> Result<Qp, RuntimeError> {
        let init = *init;
        let sh = self.verbs(move |l| {
            let qpn = l.engine.create_qp(&init)?;
            let sh = Arc::new(QpShared {
                qpn,
                qp_type: init.qp_type,
                cap: init.cap,
                srq: init.srq.is_some(),
                state: AtomicU8::new(QpState::Reset as u8),
                sq_posted: AtomicU64::new(0),
                sq_done: AtomicU64::new(0),
                rq_posted: AtomicU64::new(0),
                rq_done: AtomicU64::new(0),
                shard: AtomicUsize::new(0),
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

    /// `ibv_modify_qp`. An address vector without a destination MAC is completed from
    /// the kernel's neighbour table first, resolving the address if it is missing.
    pub fn modify_qp(&self, qp: &Qp, attr: &QpAttr, mask: QpAttrMask) -> Result<(), RuntimeError> {
        let mut attr = *attr;
        if mask.contains(QpAttrMask::AV) && attr.ah_attr.dmac.is_none() && !self.sh.info.udp {
            attr.ah_attr.dmac =
                Some(self.resolve(crate::verbs::device::ip_of(&attr.ah_attr.dgid))?);
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
        let mac = std::thread::spawn(move || {
            if let Some(ns) = &netns {
                crate::host::enter_netns(ns).map_err(|e| e.to_string())?;
            }
            crate::host::resolve_neighbor(&ifname, ip, Duration::from_secs(3)).ok_or_else(|| {
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
    pub fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<u32, RuntimeError> {
        if self.threads() > 1 {
            // Its receives would be consumed by QPs on several engine threads.
            return Err(RuntimeError::Setup(
                "SRQs need a device with one engine thread (threads = 1)".into(),
            ));
        }
        self.verbs(move |l| l.engine.create_srq(pd, max_wr, max_sge))
    }

    pub fn post_srq_recv(&self, srq: u32, wr: &RecvWr) -> Result<(), RuntimeError> {
        if !self.sh.set.send(0, Cmd::PostSrqRecv(srq, *wr)) {
            return Err(RuntimeError::Stopped);
        }
        Ok(())
    }

    /// The next asynchronous event, waiting up to `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.sh.events.recv_timeout(timeout).ok()
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

/// Engine-thread-side registries, passed to control calls.
pub(crate) type QpRegistry = HashMap<u32, (Arc<QpShared>, u64, u64)>;

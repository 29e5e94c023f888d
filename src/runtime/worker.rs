//! The engine thread: a poll-mode loop around the sans-IO engine.
//!
//! Each round: doorbells and control calls, a batch of received frames, due timers, a
//! batch of frames to send, completions handed to the CQs' queues, QP state and queue
//! occupancy mirrored for the callers' checks. When a few hundred rounds in a row find
//! nothing to do, the thread sleeps in poll(2) on the link's descriptors and an eventfd
//! until a frame, a doorbell or the next timer (`busy_poll`: it spins instead), unless
//! callers run the data path; then it sleeps after one idle round, and a caller that
//! keeps polling takes the link's descriptors out of what wakes it ([`RxWatch`]). The
//! data path of a round ([`DataPath`]) sits behind a lock, so that with one engine
//! thread and `busy_poll` or one CPU (`RuntimeConfig::caller_rounds`) an application
//! thread polling its CQ can run it too ([`ShardSet::run_here`]).
//! Busy-polling RC SEND round trips here took 27-39 us with a hop to each engine thread
//! and 15-25 us with the callers running the rounds (`bench latency`, old and new
//! binaries interleaved; a raw AF_XDP echo took 4-8 us).

use super::{
    Cmd, CqShared, DeviceInfo, EventSink, HandleMap, LinkKind, QpRegistry, RuntimeConfig, SRQ_BELL,
    SrqRegistry,
};
use crate::capture::Writer;
use crate::engine::{Counters, Engine};
use crate::link::FrameLink;
use crate::link::bpf::XdpStats;
use crate::time::Time;
use crate::verbs::{AsyncEvent, DeviceConfig, Mtu, QpAttr, QpAttrMask, QpState, RecvWr, SendWr};
use crate::wire::{Pieces, PiecesMut};
use crossbeam::channel::{Receiver, Sender, TryRecvError};
use crossbeam::queue::ArrayQueue;
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// Idle rounds (each a poll of everything, then `sched_yield`) before the thread sleeps.
const SPIN_ROUNDS: u32 = 256;
/// A yield that kept the thread off the CPU this long means another thread on its core
/// spins without yielding back.
const SLOW_YIELD: Duration = Duration::from_micros(200);
/// How long the thread then sleeps as soon as it is idle, before it tries spinning again:
/// [`SleepMode`] starts at the first and doubles up to the second.
const SLEEP_MODE_MIN: Duration = Duration::from_millis(5);
const SLEEP_MODE_MAX: Duration = Duration::from_millis(200);
/// Longest sleep (so a stop is noticed even without a wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// The shortest sleep: a timer closer than this is waited for asleep all the same,
/// rather than spun for.
const MIN_SLEEP: Duration = Duration::from_micros(20);

/// How long an idle engine thread sleeps instead of yielding after a slow yield. A
/// program spinning on memory on this core (ib_write_lat) makes the first yield after
/// each sleep mode slow again: the mode doubles, up to [`SLEEP_MODE_MAX`]. A thread that
/// only once ran long (a kernel worker, a stream's posting thread: a few slow yields in
/// seconds) gets [`SLEEP_MODE_MIN`]. Sleeping costs whoever sends the frame that wakes
/// it: with 200 ms after every slow yield, a 64 B stream's responder slept between
/// most receive batches and the requester's `sendto` paid the wake-ups.
#[derive(Debug)]
struct SleepMode {
    len: Duration,
    last: Option<Instant>,
}

impl SleepMode {
    fn new() -> SleepMode {
        SleepMode {
            len: SLEEP_MODE_MIN,
            last: None,
        }
    }

    /// A yield at `now` was slow: until when to sleep when idle. Slow again within twice
    /// the last mode's length (so right after it ended) doubles it; later starts over.
    fn slow_yield(&mut self, now: Instant) -> Instant {
        self.len = match self.last {
            Some(t) if now.saturating_duration_since(t) <= 2 * self.len => {
                (2 * self.len).min(SLEEP_MODE_MAX)
            }
            _ => SLEEP_MODE_MIN,
        };
        self.last = Some(now);
        now + self.len
    }
}

/// What control calls see on the engine thread.
pub(crate) struct Locals {
    pub engine: Engine,
    pub cqs: HandleMap<Arc<CqShared>>,
    /// QP -> (shared state, send WRs refused, receive WRs refused).
    pub qps: QpRegistry,
    /// SRQ -> (shared state, receive WRs refused).
    pub srqs: SrqRegistry,
    pub stop: bool,
    /// This engine thread's index among the device's.
    pub me: usize,
    pub set: Arc<ShardSet>,
    /// Doorbells of QPs on their way here from another engine thread.
    pub held: Vec<u32>,
    /// Where posted WRs are unpacked on their way into the engine, reused (see
    /// `PostRing::pop_into`).
    pub scratch: Box<(SendWr, RecvWr)>,
}

/// Counters of a running device: the engine's, the XDP program's, the link's.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub counters: Counters,
    /// The Communication Manager's (QP1) counters.
    pub cm: crate::engine::cm::CmCounters,
    pub xdp: Option<XdpStats>,
    pub link: String,
    pub qps: usize,
    pub uptime: Duration,
    /// Written when the engine stopped.
    pub final_report: bool,
    /// Frames received on one engine thread's queue for another's QP, handed over.
    pub forwarded: u64,
    /// Frames that could not be handed over (no buffer or a full channel).
    pub forward_dropped: u64,
    /// UDP link: received IPv4 frames whose unseen ID was solved from the ICRC.
    pub udp_ipv4_ids_solved: Option<u64>,
    /// AF_XDP: times a transmission found no free UMEM frame or TX ring slot. The
    /// frame then waits in the engine (backpressure), so a full UMEM slows the engine
    /// down and never loses or corrupts a frame.
    pub tx_waits: u64,
    /// AF_XDP: frames the kernel dropped before the engine saw them for want of a free
    /// UMEM frame or RX ring slot (the peer's retransmissions recover them).
    pub rx_no_room: u64,
    /// AF_XDP multi-buffer: frames received chained over several UMEM buffers (larger
    /// than one), handed to the engine in two pieces where they lay.
    pub rx_chained: u64,
    /// Frames the runtime's fault layer held back (reordered), when configured.
    pub fault_reordered: u64,
    /// Rounds of the data path that application threads ran as they polled, and did
    /// work in (run-to-completion: `RuntimeConfig::caller_rounds`).
    pub app_rounds: u64,
}

impl Stats {
    /// The device's counters: every engine thread's added up.
    pub(crate) fn total(all: &[Arc<Mutex<Stats>>]) -> Stats {
        let mut t = Stats::default();
        for (k, s) in all.iter().enumerate() {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            t.counters.add(&s.counters);
            t.cm.add(&s.cm);
            t.qps += s.qps;
            t.forwarded += s.forwarded;
            t.forward_dropped += s.forward_dropped;
            t.tx_waits += s.tx_waits;
            t.rx_no_room += s.rx_no_room;
            t.rx_chained += s.rx_chained;
            t.fault_reordered += s.fault_reordered;
            t.app_rounds += s.app_rounds;
            if k == 0 {
                t.xdp = s.xdp;
                t.udp_ipv4_ids_solved = s.udp_ipv4_ids_solved;
                t.link = s.link.clone();
                t.uptime = s.uptime;
                t.final_report = s.final_report;
            } else {
                t.final_report &= s.final_report;
            }
        }
        if all.len() > 1 {
            t.link = format!("{} (+{} engine threads)", t.link, all.len() - 1);
        }
        t
    }
}

impl Stats {
    /// The counters as a JSON object (what `roce-xdp stats` reads).
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("pid".into(), std::process::id().into());
        m.insert("final".into(), self.final_report.into());
        m.insert("link".into(), self.link.clone().into());
        m.insert("qps".into(), self.qps.into());
        m.insert("forwarded".into(), self.forwarded.into());
        m.insert("forward_dropped".into(), self.forward_dropped.into());
        m.insert("tx_waits".into(), self.tx_waits.into());
        m.insert("rx_no_room".into(), self.rx_no_room.into());
        m.insert("rx_chained".into(), self.rx_chained.into());
        m.insert("fault_reordered".into(), self.fault_reordered.into());
        m.insert("app_rounds".into(), self.app_rounds.into());
        m.insert("uptime_s".into(), self.uptime.as_secs_f64().into());
        let mut c = serde_json::Map::new();
        for (n, v) in self.counters.named() {
            c.insert(n.into(), v.into());
        }
        m.insert("counters".into(), c.into());
        let cm: serde_json::Map<String, serde_json::Value> = self
            .cm
            .named()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.into()))
            .collect();
        m.insert("cm".into(), cm.into());
        if let Some(n) = self.udp_ipv4_ids_solved {
            m.insert("udp".into(), serde_json::json!({ "ipv4_ids_solved": n }));
        }
        if let Some(x) = self.xdp {
            m.insert(
                "xdp".into(),
                serde_json::json!({"seen": x.seen, "redirected": x.redirected, "passed": x.passed, "dropped": x.dropped}),
            );
        }
        m.into()
    }
}

enum AnyLink {
    Xdp(crate::link::xdp::XdpLink),
    Udp(crate::link::udp::UdpLink),
}

impl AnyLink {
    fn get(&mut self) -> &mut dyn FrameLink {
        match self {
            AnyLink::Xdp(l) => l,
            AnyLink::Udp(l) => l,
        }
    }
    fn xdp_stats(&self) -> Option<XdpStats> {
        match self {
            AnyLink::Xdp(l) => l.xdp_stats(),
            AnyLink::Udp(_) => None,
        }
    }
    fn tx_waits(&self) -> u64 {
        match self {
            AnyLink::Xdp(l) => l.stats.tx_ring_full,
            AnyLink::Udp(_) => 0,
        }
    }
    fn rx_chained(&self) -> u64 {
        match self {
            AnyLink::Xdp(l) => l.stats.rx_multi_buffer,
            AnyLink::Udp(_) => 0,
        }
    }
    fn rx_no_room(&self) -> u64 {
        match self {
            AnyLink::Xdp(l) => l.rx_no_room(),
            AnyLink::Udp(_) => 0,
        }
    }
    fn udp_ipv4_ids_solved(&self) -> Option<u64> {
        match self {
            AnyLink::Xdp(_) => None,
            AnyLink::Udp(l) => Some(l.rx_ipv4_id_solved),
        }
    }
}

fn device_config(cfg: &RuntimeConfig) -> Result<(DeviceConfig, Option<String>), String> {
    if let Some(d) = &cfg.device {
        let ifname = match &cfg.link {
            LinkKind::Xdp { ifname, .. } => {
                // The kernel must own the addresses too: it answers ARP/ND for them and
                // the XDP program redirects only frames sent to them.
                let ifc = crate::host::Interface::find(ifname).map_err(|e| e.to_string())?;
                let have = ifc.addresses().map_err(|e| e.to_string())?;
                let want = d
                    .ipv4
                    .iter()
                    .map(|a| IpAddr::V4(*a))
                    .chain(d.ipv6.iter().map(|a| IpAddr::V6(*a)));
                for a in want {
                    if !have.contains(&a) {
                        return Err(format!(
                            "{a} is not an address of {ifname}: add it (ip addr add {a}/24 dev {ifname}) or configure one of {have:?}"
                        ));
                    }
                }
                Some(ifname.clone())
            }
            LinkKind::Udp { .. } => None,
        };
        return Ok((d.clone(), ifname));
    }
    match &cfg.link {
        LinkKind::Xdp { ifname, .. } => {
            let ifc = crate::host::Interface::find(ifname).map_err(|e| e.to_string())?;
            let mac = ifc.mac().map_err(|e| e.to_string())?;
            let mtu = ifc.mtu().map_err(|e| e.to_string())?;
            let addrs = ifc.addresses().map_err(|e| e.to_string())?;
            let v4: Vec<_> = addrs
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V4(x) => Some(*x),
                    _ => None,
                })
                .collect();
            let v6: Vec<_> = addrs
                .iter()
                .filter_map(|a| match a {
                    IpAddr::V6(x) if x.segments()[0] != 0xfe80 => Some(*x),
                    _ => None,
                })
                .collect();
            let vlans = vlans_of(ifname)?;
            if v4.is_empty() && v6.is_empty() && vlans.is_empty() {
                return Err(format!(
                    "{ifname} has no IP address: add one (ip addr add ... dev {ifname})"
                ));
            }
            let port_mtu = match cfg.port_mtu {
                Some(m) => {
                    let fits = Mtu::for_netdev_mtu(mtu).is_some_and(|f| m <= f);
                    if !fits {
                        return Err(format!(
                            "IB MTU {} does not fit the MTU {mtu} of {ifname}",
                            m.bytes()
                        ));
                    }
                    m
                }
                None => Mtu::for_netdev_mtu(mtu)
                    .ok_or_else(|| format!("the MTU {mtu} of {ifname} is too small for RoCE"))?,
            };
            let mut d = DeviceConfig::new(mac, v4.first().copied().unwrap_or([0; 4].into()));
            d.ipv4 = v4;
            d.ipv6 = v6;
            d.vlans = vlans;
            d.port_mtu = port_mtu;
            d.seed = random_seed();
            Ok((d, Some(ifname.clone())))
        }
        LinkKind::Udp { local } => {
            let mut d = DeviceConfig::new([0x02, 0, 0, 0, 0, 0x01], [0; 4].into());
            match local {
                IpAddr::V4(a) => d.ipv4 = vec![*a],
                IpAddr::V6(a) => {
                    d.ipv4 = vec![];
                    d.ipv6 = vec![*a];
                }
            }
            d.port_mtu = cfg.port_mtu.unwrap_or(Mtu::Mtu1024);
            d.udp_link = true;
            d.seed = random_seed();
            Ok((d, None))
        }
    }
}

/// The 802.1Q subinterfaces of `ifname` that have an address: their addresses are GIDs
/// of the port (a VLAN device's frames come and go through its parent, tagged).
fn vlans_of(ifname: &str) -> Result<Vec<crate::verbs::VlanNetdev>, String> {
    let all = crate::host::all_addresses().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mine = crate::host::vlan_subinterfaces()
        .into_iter()
        .filter(|l| l.parent == ifname);
    for crate::host::VlanLine { name, vid, .. } in mine {
        let Ok(ifc) = crate::host::Interface::find(&name) else {
            continue;
        };
        let mut v = crate::verbs::VlanNetdev {
            name: name.clone(),
            index: ifc.index,
            vid,
            ipv4: vec![],
            ipv6: vec![],
        };
        for (n, a) in &all {
            match a {
                IpAddr::V4(x) if *n == name => v.ipv4.push(*x),
                IpAddr::V6(x) if *n == name => v.ipv6.push(*x),
                _ => {}
            }
        }
        if !v.ipv4.is_empty() || !v.ipv6.is_empty() {
            out.push(v);
        }
    }
    out.sort_by_key(|v| v.vid);
    Ok(out)
}

/// The addresses the XDP program hands to the engine: the interface's, its link-local
/// one, and its VLAN subinterfaces'.
fn addresses(d: &DeviceConfig) -> Vec<IpAddr> {
    d.ipv4
        .iter()
        .map(|a| IpAddr::V4(*a))
        .chain(d.ipv6.iter().map(|a| IpAddr::V6(*a)))
        .chain(std::iter::once(IpAddr::V6(
            crate::verbs::device::link_local_of(d.mac),
        )))
        .chain(d.vlans.iter().flat_map(|v| {
            v.ipv4
                .iter()
                .map(|a| IpAddr::V4(*a))
                .chain(v.ipv6.iter().map(|a| IpAddr::V6(*a)))
        }))
        .collect()
}

type Setup = (Engine, AnyLink, DeviceInfo, crate::host::InterfaceLock);

fn setup(cfg: &RuntimeConfig) -> Result<Setup, String> {
    if let Some(ns) = &cfg.netns {
        crate::host::enter_netns(ns).map_err(|e| e.to_string())?;
    }
    // One engine per interface (or UDP address) and namespace: a second one would
    // fight the first for the XDP program or for its frames.
    let claim = match (&cfg.link, &cfg.port_ifname) {
        (LinkKind::Xdp { ifname, .. }, _) => ifname.clone(),
        (LinkKind::Udp { .. }, Some(ifname)) => ifname.clone(),
        (LinkKind::Udp { local }, None) => format!("udp-{local}"),
    };
    let lock = crate::host::InterfaceLock::take(&claim)?;
    let (dcfg, ifname) = device_config(cfg)?;
    let link = match &cfg.link {
        LinkKind::Xdp { ifname, cfg: x } => AnyLink::Xdp(crate::link::xdp::XdpLink::open(
            ifname,
            &addresses(&dcfg),
            x,
        )?),
        LinkKind::Udp { local } => AnyLink::Udp(
            crate::link::udp::UdpLink::bind(*local, crate::wire::ROCE_V2_PORT, dcfg.mac)
                .map_err(|e| format!("binding UDP {local}:4791: {e}"))?,
        ),
    };
    let engine = Engine::new(dcfg.clone());
    let mut l = link;
    let info = DeviceInfo {
        mac: dcfg.mac,
        gids: engine.gid_table().to_vec(),
        gid_vlans: dcfg.gid_entries().iter().map(|e| e.vlan).collect(),
        vlans: dcfg.vlans.clone(),
        port_mtu: dcfg.port_mtu,
        limits: dcfg.limits,
        link: l.get().describe(),
        ifname,
        udp: dcfg.udp_link,
    };
    Ok((engine, l, info, lock))
}

/// What the engine threads of one device share when there are several (one per
/// group of queues): each other's doorbells and wake-up lines, who owns which QP, and a
/// pool of buffers to hand frames over in.
pub(crate) struct ShardSet {
    pub links: Vec<ShardLink>,
    /// Each engine thread's doorbells: QPs (and SRQs, with `SRQ_BELL`) whose rings hold
    /// WRs. A QP is on at most one queue at a time (its `rung` flag), so these never fill.
    pub bells: Vec<ArrayQueue<u32>>,
    /// Set when the engine threads stop: posting then fails instead of waiting.
    pub stopped: AtomicBool,
    /// The port's state, from its interface (shard 0 watches it).
    pub port_up: AtomicBool,
    /// QP -> the shard whose engine holds it.
    pub owners: RwLock<HashMap<u32, usize>>,
    /// Frames received by one shard for another's QP.
    pub fwd: Vec<FrameChannel>,
    /// Spare buffers for `fwd`: taken, filled, sent, and given back by the receiver, so
    /// handing over allocates nothing after start.
    pub pool: ArrayQueue<Vec<u8>>,
    /// Each shard's published counters; shard 0 adds them up for the stats file.
    pub stats: Vec<Arc<Mutex<Stats>>>,
    /// Beats once per batch of completions handed out, on any CQ.
    pub pulse: super::Pulse,
    /// The capture every shard writes to (`RuntimeConfig::pcap`), shared with the
    /// device so that it can mark sections of a run.
    pub tap: Tap,
    /// The data path application threads may run as they poll (one engine thread,
    /// `RuntimeConfig::caller_rounds`), set once its engine thread started.
    pub rtc: std::sync::OnceLock<SharedPath>,
    /// When an application thread last ran it ([`crate::time::monotonic_ns`]).
    pub rtc_last: AtomicU64,
    /// Rounds application threads ran that did work (read without the lock: a poller
    /// that did the engine's work has not been idle; also [`Stats::app_rounds`]).
    pub rtc_work: AtomicU64,
    /// The process could run on one CPU only when the device was opened
    /// ([`super::one_cpu`]): decided once, for the callers and the engine thread.
    pub lone: bool,
    /// Raised by a caller whose round left work the sleeping engine thread would not
    /// see: frames still to send, or a timer due before its sleep ends (`sleep_until`).
    pub kick: AtomicBool,
    /// When the engine thread's sleep ends (engine time, ns), `u64::MAX` while awake.
    pub sleep_until: AtomicU64,
    /// Whether frames arriving wake the sleeping engine thread, or only the rounds of a
    /// polling caller take them.
    pub watch: RxWatch,
}

/// The sleeping engine thread's watch on the link's descriptors, which a caller that
/// keeps polling an empty CQ switches off while its own rounds take the frames (one
/// engine thread on one CPU, `caller_rounds`). Each frame used to wake the engine
/// thread there, which preempted the poller to take the frame the poller's next round
/// would have taken: two context switches per frame. In the rxe VMs (one vCPU),
/// ib_write_lat made 4.4-4.9 switches per iteration on each roce-xdp side against
/// 0.12-0.26 for rxe, and 3.3 with this watch: the ACK of its own WRITE comes while it
/// polls for that completion.
///
/// While a caller polls, the engine thread sleeps in `ppoll` on an epoll set: its
/// wake-up eventfd, and the link's descriptors ([`Watch`]). `epoll_ctl` from a caller
/// changes what wakes the thread without waking it. A poll that finds a completion
/// switches the watch back on (a readable descriptor then wakes the thread at once), as
/// do a caller about to sleep ([`super::Cq::wait`], `ibv_req_notify_cq`) and the engine
/// thread itself: while a caller polls it sleeps at most [`BLIND_SLEEP`], and it
/// switches the watch on when no caller ran a round for [`BLIND_HOLD_NS`]. A program
/// that stops polling without finding a completion leaves a frame waiting 1.5 ms at
/// most.
pub(crate) struct RxWatch {
    /// The engine thread's epoll descriptor and the link's descriptors in it; set once,
    /// when the watch applies.
    ep: std::sync::OnceLock<(std::os::fd::OwnedFd, Vec<i32>)>,
    /// Where the link's descriptors stand; changed under the lock, `off` mirrors
    /// whether they are [`Watch::Off`].
    state: Mutex<Watch>,
    off: AtomicBool,
    /// Polls in a row whose round left their CQ empty.
    empty: std::sync::atomic::AtomicU32,
    /// When the engine thread's planned sleep ends ([`crate::time::monotonic_ns`]),
    /// `u64::MAX` while it is awake.
    until: AtomicU64,
}

impl Default for RxWatch {
    fn default() -> RxWatch {
        RxWatch {
            ep: std::sync::OnceLock::new(),
            state: Mutex::new(Watch::Out),
            off: AtomicBool::new(false),
            empty: std::sync::atomic::AtomicU32::new(0),
            until: AtomicU64::new(u64::MAX),
        }
    }
}

/// Empty polls in a row before the watch goes off: a program that waits for events polls
/// until its CQ is empty once, then sleeps on its channel.
const BLIND_AFTER: u32 = 2;
/// Longest sleep of an engine thread while the watch is off.
const BLIND_SLEEP: Duration = Duration::from_millis(1);
/// A caller that ran no round for this long has stopped polling.
const BLIND_HOLD_NS: u64 = 500_000;

/// Where the link's descriptors stand in the engine thread's epoll set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Watch {
    /// Not in it: the engine thread sleeps on the descriptors themselves. So while no
    /// caller polls: with the link in the set throughout, pinned ib_write_bw of 64 KiB
    /// measured 422-475 MB/s against 494-547 without the watch (alternating runs). My
    /// reading, not traced: every wake-up of the receiving socket then also runs
    /// epoll's callback, on the core that does veth's receive work.
    Out,
    /// In it, waking the engine thread.
    On,
    /// In it, asking for no events: frames wake nobody.
    Off,
}

impl RxWatch {
    /// Sets the watch up: `wake` always wakes the engine thread, `link` while watched.
    fn start(&self, wake: i32, link: &[i32]) -> Result<(), String> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: epoll_create1 takes no pointers.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(format!(
                "epoll_create1: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `ep` was just created, and nothing else owns it.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        epoll_ctl(&ep, libc::EPOLL_CTL_ADD, wake, libc::EPOLLIN as u32)?;
        self.until.store(u64::MAX, Ordering::SeqCst);
        let _ = self.ep.set((ep, link.to_vec()));
        Ok(())
    }

    fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    /// Moves the link's descriptors from `from` to `to`: in (`Out` to `On`), out (to
    /// `Out`), or their events off and on again (`On` to `Off` and back). True if they
    /// moved.
    fn switch(&self, from: Watch, to: Watch) -> bool {
        let Some((ep, fds)) = self.ep.get() else {
            return false;
        };
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (op, events) = match (from, to) {
            _ if *g != from => return false,
            (Watch::Out, Watch::On) => (libc::EPOLL_CTL_ADD, libc::EPOLLIN as u32),
            (Watch::On | Watch::Off, Watch::Out) => (libc::EPOLL_CTL_DEL, 0),
            (Watch::Off, Watch::On) => (libc::EPOLL_CTL_MOD, libc::EPOLLIN as u32),
            (Watch::On, Watch::Off) => (libc::EPOLL_CTL_MOD, 0),
            _ => return false,
        };
        for &fd in fds {
            if let Err(e) = epoll_ctl(ep, op, fd, events) {
                tracing::warn!("{e}");
            }
        }
        *g = to;
        self.off.store(to == Watch::Off, Ordering::SeqCst);
        true
    }

    /// The engine thread, about to sleep: the epoll set to sleep on, with the link's
    /// descriptors in it while a caller polls (`driven`), or `None` to sleep on the
    /// descriptors themselves.
    fn engage(&self, driven: bool) -> Option<i32> {
        use std::os::fd::AsRawFd;
        let (ep, _) = self.ep.get()?;
        if driven {
            self.switch(Watch::Out, Watch::On);
        } else {
            // Only from `On`: a watch that is off is the callers' to switch on, or
            // `resume`'s.
            self.switch(Watch::On, Watch::Out);
        }
        let g = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        (g != Watch::Out).then(|| ep.as_raw_fd())
    }

    /// A caller stops polling (it is about to sleep): frames wake the engine thread again.
    pub(crate) fn resume(&self) {
        if self.is_off() {
            self.empty.store(0, Ordering::Relaxed);
            self.switch(Watch::Off, Watch::On);
        }
    }
}

/// One `epoll_ctl` on `fd`, for `events`.
fn epoll_ctl(ep: &std::os::fd::OwnedFd, op: i32, fd: i32, events: u32) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let mut ev = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: `ev` is a live epoll_event; the kernel checks both descriptors.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(format!(
            "epoll_ctl({op}, {fd}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// A channel of frames handed from one engine thread to another (the last two bytes
/// of each buffer hold the frame's length).
pub(crate) type FrameChannel = (Sender<Vec<u8>>, Receiver<Vec<u8>>);

/// One shard's doorbell and wake-up line.
pub(crate) struct ShardLink {
    pub cmds: Sender<Cmd>,
    pub cmd_rx: Receiver<Cmd>,
    pub wake: Arc<super::Wake>,
}

impl ShardSet {
    pub(crate) fn new(n: usize, lone: bool) -> Result<ShardSet, String> {
        let mut links = Vec::new();
        let mut fwd = Vec::new();
        let mut stats = Vec::new();
        let mut bells = Vec::new();
        for _ in 0..n {
            bells.push(ArrayQueue::new(BELLS));
            let (tx, rx) = crossbeam::channel::unbounded();
            links.push(ShardLink {
                cmds: tx,
                cmd_rx: rx,
                wake: Arc::new(super::Wake::new()?),
            });
            fwd.push(crossbeam::channel::bounded(FWD_POOL));
            stats.push(Arc::new(Mutex::new(Stats::default())));
        }
        let pool = ArrayQueue::new(FWD_POOL.max(1));
        if n > 1 {
            for _ in 0..FWD_POOL {
                let _ = pool.push(vec![0u8; crate::link::xdp::MAX_FRAME]);
            }
        }
        Ok(ShardSet {
            links,
            bells,
            stopped: AtomicBool::new(false),
            port_up: AtomicBool::new(true),
            owners: RwLock::new(HashMap::new()),
            fwd,
            pool,
            stats,
            pulse: super::Pulse::default(),
            tap: Arc::new(Mutex::new(None)),
            rtc: std::sync::OnceLock::new(),
            rtc_last: AtomicU64::new(0),
            rtc_work: AtomicU64::new(0),
            lone,
            kick: AtomicBool::new(false),
            sleep_until: AtomicU64::new(u64::MAX),
            watch: RxWatch::default(),
        })
    }

    /// Runs one round of the data path in the caller's thread, unless its engine
    /// thread (or another caller) is running one: what a polling application thread
    /// does when its CQ is empty, so that the frame it waits for is taken off
    /// the ring, processed and completed without a hop to the engine thread. The work
    /// done, or `None` when no round ran here (the lock was taken, the engine stopped,
    /// or the device does not share its data path). A round left half done by a panic
    /// (the lock poisoned) is not run again here; the engine thread then stops.
    pub(crate) fn run_here(&self) -> Option<usize> {
        let path = self.rtc.get()?;
        let mut g = path.try_lock().ok()?;
        let d = g.as_mut()?;
        self.rtc_last
            .store(crate::time::monotonic_ns(), Ordering::Relaxed);
        let work = d.round(self);
        if work > 0 {
            self.rtc_work.fetch_add(1, Ordering::Relaxed);
        }
        // What this round leaves undone is the engine thread's once the caller stops
        // polling: frames that did not fit one send (a large WR, copy mode's budget
        // per kick), or a timer it armed (or a frame the fault layer holds) that falls
        // due before the engine thread wakes.
        let until = self.sleep_until.load(Ordering::SeqCst);
        let before = |t: Option<Time>| t.is_some_and(|t| t.0 < until);
        // Not for timers while the watch is off: this caller's next rounds fire them,
        // and the engine thread sleeps at most `BLIND_SLEEP` then (each retransmit
        // timer a posted WR arms woke it once, a context switch on one CPU).
        let timers = !self.watch.is_off()
            && (before(d.l.engine.poll_timeout())
                || before(d.faults.as_ref().and_then(|f| f.next_due())));
        if d.l.engine.wants_transmit() || d.link.get().tx_pending() || timers {
            self.kick.store(true, Ordering::SeqCst);
            self.links[d.l.me].wake.ring();
        }
        Some(work)
    }

    /// A caller polled a CQ (after running a round if it was empty); `found`: the poll
    /// returns completions. Polling on after [`BLIND_AFTER`] empty polls switches the
    /// engine thread's watch off ([`RxWatch`]); a completion switches it on. An engine
    /// thread that planned to sleep longer than [`BLIND_SLEEP`] when the watch went off
    /// is woken to plan again, so that it notices a caller that stops polling in time.
    pub(crate) fn polled(&self, found: bool) {
        let w = &self.watch;
        // Stopped: the link's descriptors are closed.
        if w.ep.get().is_none() || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        if found {
            w.empty.store(0, Ordering::Relaxed);
            if w.is_off() {
                w.switch(Watch::Off, Watch::On);
            }
            return;
        }
        if w.empty.fetch_add(1, Ordering::Relaxed) + 1 < BLIND_AFTER || w.is_off() {
            return;
        }
        // Only from `On`: out of the set, the engine thread sleeps on the descriptors.
        if w.switch(Watch::On, Watch::Off) {
            // The engine thread publishes its plan before it reads `off`: either it saw
            // the watch off and shortened its sleep, or its long plan is read here.
            let until = w.until.load(Ordering::SeqCst);
            let soon = crate::time::monotonic_ns().saturating_add(BLIND_SLEEP.as_nanos() as u64);
            if until != u64::MAX && until > soon {
                self.kick.store(true, Ordering::SeqCst);
                self.links[0].wake.ring();
            }
        }
    }

    /// True while callers may run the data path (it is shared and its engine runs).
    pub(crate) fn runs_here(&self) -> bool {
        self.rtc.get().is_some() && !self.stopped.load(Ordering::SeqCst)
    }

    /// Whether an application thread ran the data path within the last `ns`.
    fn app_polled_within(&self, ns: u64) -> bool {
        let last = self.rtc_last.load(Ordering::Relaxed);
        last != 0 && crate::time::monotonic_ns().saturating_sub(last) < ns
    }

    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    pub(crate) fn owner(&self, qpn: u32) -> Option<usize> {
        self.owners
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&qpn)
            .copied()
    }

    /// Puts doorbell `id` on shard `k`'s queue (the caller wakes it).
    pub(crate) fn bell(&self, k: usize, id: u32) -> bool {
        self.bells.get(k).is_some_and(|b| b.push(id).is_ok())
    }

    /// Sends `c` to shard `k` and wakes it.
    pub(crate) fn send(&self, k: usize, c: Cmd) -> bool {
        let Some(l) = self.links.get(k) else {
            return false;
        };
        let ok = l.cmds.send(c).is_ok();
        l.wake.ring();
        ok
    }
}

/// Buffers in flight between shards at most (frames beyond it are dropped and counted).
const FWD_POOL: usize = 1024;
/// Room on each doorbell queue: every QP and SRQ a device may have, once each.
const BELLS: usize = 0x10000 + 0x1000;
/// Most looped-back frames (a device's QPs talking to each other) handled per send
/// batch, so a busy local conversation cannot starve the link.
const LOOPBACK_BATCH: usize = 64;

/// Pins engine thread `me` (the calling thread) to its CPU of `cfg.cpus`, if any.
/// Checked against the affinity mask at open; a cpuset changed since only costs the
/// placement.
fn pin_shard(cfg: &RuntimeConfig, me: usize) {
    if cfg.cpus.is_empty() {
        return;
    }
    let cpu = cfg.cpus[me % cfg.cpus.len()];
    if let Err(e) = crate::host::pin_to_cpu(cpu) {
        tracing::warn!("engine thread {me}: {e}");
    }
}

pub(crate) fn run(
    cfg: RuntimeConfig,
    set: Arc<ShardSet>,
    events: EventSink,
    ready: Sender<Result<DeviceInfo, String>>,
) {
    // Pinned first, so the link's rings and buffers are first touched on the engine's
    // CPU, and `Device::open` returns with every engine thread where it was asked to be.
    pin_shard(&cfg, 0);
    let (engine, link, mut info, _lock) = match setup(&cfg) {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let tap = match &cfg.pcap {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) if cfg.pcap_ng => Writer::new_ng(BufWriter::new(f)).ok(),
            Ok(f) => Writer::new(BufWriter::new(f)).ok(),
            Err(e) => {
                let _ = ready.send(Err(format!("creating {}: {e}", p.display())));
                return;
            }
        },
        None => None,
    };
    *set.tap.lock().unwrap_or_else(|e| e.into_inner()) = tap;
    let tap = set.tap.clone();
    let n = set.len();
    // Several engine threads: one link part (group of queues) and one engine each.
    let mut parts = match (n, link) {
        (1, l) => vec![l],
        (_, AnyLink::Xdp(x)) => match x.split(n) {
            Ok(v) => v.into_iter().map(AnyLink::Xdp).collect(),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        },
        (_, AnyLink::Udp(_)) => {
            let _ = ready.send(Err(
                "several engine threads need AF_XDP (one socket per queue)".into(),
            ));
            return;
        }
    };
    let mut others = Vec::new();
    let (pinned_tx, pinned_rx) = crossbeam::channel::bounded::<()>(0);
    for k in (1..n).rev() {
        let Some(part) = parts.pop() else { break };
        let engine = Engine::new(engine.config().clone());
        let (set2, ev2, cfg2, tap2) = (set.clone(), events.clone(), cfg.clone(), tap.clone());
        let pinned = pinned_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("roce-xdp-engine{k}"))
            .spawn(move || {
                pin_shard(&cfg2, k);
                drop(pinned);
                shard_loop(k, cfg2, engine, part, set2, ev2, tap2, Vec::new())
            });
        match spawned {
            Ok(h) => others.push(h),
            Err(e) => {
                let _ = ready.send(Err(format!("spawning engine thread {k}: {e}")));
                return;
            }
        }
    }
    // Each of them pinned before the device is handed out: a thread drops its sender
    // once pinned (or when it dies), and `recv` returns when every sender is gone.
    drop(pinned_tx);
    let _ = pinned_rx.recv();
    let Some(link) = parts.pop() else {
        let _ = ready.send(Err("no link part left for engine thread 0".into()));
        return;
    };
    if n > 1 {
        info.link = format!(
            "{} and {} more engine threads, one per queue",
            info.link,
            n - 1
        );
    }
    if let Some(name) = &cfg.port_ifname {
        let up = crate::host::Interface::find(name)
            .and_then(|i| i.is_running())
            .unwrap_or(false);
        set.port_up.store(up, Ordering::SeqCst);
    }
    tracing::info!("engine up: {}", info.link);
    let _ = ready.send(Ok(info));
    shard_loop(0, cfg, engine, link, set, events, tap, others);
}

pub(crate) type Tap = Arc<Mutex<Option<Writer<BufWriter<std::fs::File>>>>>;

/// What a shard's frames go through: the engine and its link, and what a round of
/// the data path needs beside them. An engine thread runs it; with one engine thread
/// (and `RuntimeConfig::caller_rounds`), an application thread polling a CQ runs it
/// too, in between
/// (run-to-completion, as poll-mode drivers do: [`ShardSet::run_here`]). The lock that
/// holds it makes the two take turns.
pub(crate) struct DataPath {
    pub l: Locals,
    link: AnyLink,
    fwd_rx: Receiver<Vec<u8>>,
    faults: Option<super::faults::Faults>,
    rec: Recorder,
    forwarded: u64,
    fwd_dropped: u64,
    overflowed_cqs: Vec<u32>,
    events: EventSink,
    /// Engine time as the last round read it: the engine thread's publish check uses it
    /// instead of reading the clock again (an idle round read it six times, now four;
    /// the vDSO clock showed as 5-10% of an engine thread's samples in perf).
    now: Time,
}

/// The capture every frame sent or received is written to, if any.
struct Recorder {
    tap: Tap,
    tapping: bool,
    max: u64,
    start: Instant,
}

impl Recorder {
    /// Engine time: nanoseconds since the shard started.
    fn now(&self) -> Time {
        Time(self.start.elapsed().as_nanos() as u64)
    }

    /// Records a frame where it lies (a chained one is joined for the capture).
    fn record(&self, f: Pieces<'_>, t: Time) {
        if !self.tapping {
            return;
        }
        let mut g = self.tap.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = g.as_mut()
            && w.frames() < self.max
        {
            let wall = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .saturating_sub(self.start.elapsed())
                + Duration::from_nanos(t.0);
            match f.contiguous() {
                Some(b) => {
                    let _ = w.write(wall, b);
                }
                None => {
                    let _ = w.write(wall, &f.to_vec());
                }
            }
        }
    }
}

impl DataPath {
    /// One round of the data path: doorbells, frames handed over by other shards, a
    /// batch of received frames, due timers, a batch of frames to send, completions
    /// handed out. Control calls and the port watch stay on the engine thread (they
    /// may need its network namespace). Returns the work done.
    fn round(&mut self, set: &ShardSet) -> usize {
        let n = set.len();
        let me = self.l.me;
        // Doorbells: WRs posted since the last round.
        let mut work = self.l.bells().drain();
        let t = self.rec.now();
        self.now = t;
        // Frames another shard received for our QPs.
        while let Ok(buf) = self.fwd_rx.try_recv() {
            work += 1;
            let len = u16::from_ne_bytes([buf[buf.len() - 2], buf[buf.len() - 1]]) as usize;
            self.l
                .engine
                .handle_frame(t, &buf[..len.min(buf.len() - 2)]);
            let _ = set.pool.push(buf);
        }
        // Received frames.
        {
            let DataPath {
                l,
                link,
                faults,
                rec,
                forwarded,
                fwd_dropped,
                ..
            } = self;
            let mut bells = l.bells();
            work += link.get().recv(256, &mut |f| {
                // A receive WR posted before this frame was sent (the program told its
                // peer, out of band, that it could send) must be there when it lands: WRs
                // rung since the doorbells were last drained go in first.
                if !set.bells[me].is_empty() {
                    bells.drain();
                }
                let engine = &mut *bells.engine;
                rec.record(f, t);
                if n > 1
                    && let Some(q) = engine.foreign_qp(f.first, f.rest)
                    && let Some(owner) = set.owner(q)
                    && owner != me
                {
                    // Another shard's QP: hand the frame over (RSS put it on our queue).
                    match set.pool.pop() {
                        Some(mut buf) if f.len() + 2 <= buf.len() => {
                            f.copy_to(&mut buf);
                            let end = buf.len();
                            buf[end - 2..].copy_from_slice(&(f.len() as u16).to_ne_bytes());
                            if set.fwd[owner].0.try_send(buf).is_ok() {
                                set.links[owner].wake.ring();
                                *forwarded += 1;
                            } else {
                                *fwd_dropped += 1;
                            }
                        }
                        Some(buf) => {
                            let _ = set.pool.push(buf);
                            *fwd_dropped += 1;
                        }
                        None => *fwd_dropped += 1,
                    }
                    return;
                }
                if let Some(fl) = faults.as_mut()
                    && fl.hold(t, f)
                {
                    return;
                }
                engine.handle_frame_parts(t, f.first, f.rest);
            });
        }
        if let Some(fl) = self.faults.as_mut() {
            let engine = &mut self.l.engine;
            work += fl.release(t, |f| engine.handle_frame(t, f));
        }
        // Timers.
        if self.l.engine.poll_timeout().is_some_and(|d| d <= t) {
            self.l.engine.handle_timeout(t);
            work += 1;
        }
        // Frames to send; those for our own addresses go straight back in.
        {
            let engine = &mut self.l.engine;
            let rec = &self.rec;
            let mut looped = 0usize;
            work += self.link.get().send(&mut |buf: PiecesMut<'_>| {
                let PiecesMut { first, rest } = buf;
                loop {
                    let k = engine.poll_transmit_parts(t, first, rest)?;
                    let f = if k <= first.len() {
                        Pieces::one(&first[..k])
                    } else {
                        Pieces {
                            first,
                            rest: &rest[..k - first.len()],
                        }
                    };
                    rec.record(f, t);
                    if !engine.is_loopback(f.first, f.rest) {
                        return Some(k);
                    }
                    engine.handle_frame_parts(t, f.first, f.rest);
                    looped += 1;
                    if looped >= LOOPBACK_BATCH {
                        return None;
                    }
                }
            });
            work += looped;
            self.link.get().flush();
        }
        // Completions, states, events.
        deliver(&mut self.l, &self.events, &mut self.overflowed_cqs);
        work
    }

    fn stats(&mut self, link_desc: &str, final_report: bool) -> Stats {
        Stats {
            counters: *self.l.engine.counters(),
            cm: *self.l.engine.cm_counters(),
            xdp: self.link.xdp_stats(),
            udp_ipv4_ids_solved: self.link.udp_ipv4_ids_solved(),
            link: link_desc.to_string(),
            qps: self.l.engine.qp_count(),
            uptime: self.rec.start.elapsed(),
            final_report,
            forwarded: self.forwarded,
            forward_dropped: self.fwd_dropped,
            tx_waits: self.link.tx_waits(),
            rx_no_room: self.link.rx_no_room(),
            rx_chained: self.link.rx_chained(),
            fault_reordered: self.faults.as_ref().map_or(0, |f| f.reordered),
            // Caller rounds need one engine thread: the device's count is this shard's.
            app_rounds: self.l.set.rtc_work.load(Ordering::Relaxed),
        }
    }
}

/// A shard's data path, taken out (`None`) when its engine thread stops.
pub(crate) type SharedPath = Arc<Mutex<Option<DataPath>>>;

/// How long after an application thread last ran the data path the engine thread stays
/// out of its way, sleeping when idle instead of spinning: two spinners on one data
/// path would take turns at its lock and at the cores.
const RTC_HOLD_NS: u64 = 2_000_000;

/// Takes a shard's data path out of the callers' reach when its engine thread ends,
/// also by unwinding (see `shard_loop`).
struct TakeOnExit<'a>(&'a SharedPath, &'a ShardSet);

impl Drop for TakeOnExit<'_> {
    fn drop(&mut self) {
        self.1.stopped.store(true, Ordering::SeqCst);
        drop(self.0.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// One engine thread's loop. Shard 0 also writes the stats file and, when it stops,
/// stops and joins the others.
#[allow(clippy::too_many_arguments)]
fn shard_loop(
    me: usize,
    cfg: RuntimeConfig,
    engine: Engine,
    link: AnyLink,
    set: Arc<ShardSet>,
    events: EventSink,
    tap: Tap,
    others: Vec<std::thread::JoinHandle<()>>,
) {
    let n = set.len();
    let cmds = set.links[me].cmd_rx.clone();
    let wake_fd = set.links[me].wake.fd;
    let stats = set.stats[me].clone();
    let mut link = link;
    let link_desc = link.get().describe();
    let mut fds = link.get().fds();
    fds.push(wake_fd);
    let tapping = tap.lock().unwrap_or_else(|e| e.into_inner()).is_some();
    let path: SharedPath = Arc::new(Mutex::new(Some(DataPath {
        l: Locals {
            engine,
            cqs: HandleMap::default(),
            qps: HandleMap::default(),
            srqs: HandleMap::default(),
            stop: false,
            me,
            set: set.clone(),
            held: Vec::new(),
            scratch: Box::new((SendWr::send(0, &[]), RecvWr::new(0, &[]))),
        },
        link,
        fwd_rx: set.fwd[me].1.clone(),
        faults: cfg.faults.map(super::faults::Faults::new),
        rec: Recorder {
            tap: tap.clone(),
            tapping,
            max: cfg.pcap_max_frames.unwrap_or(u64::MAX),
            start: Instant::now(),
        },
        forwarded: 0,
        fwd_dropped: 0,
        overflowed_cqs: Vec::new(),
        events: events.clone(),
        now: Time::ZERO,
    })));
    // Resolved by `Device::open` (one engine thread only).
    let rtc = n == 1 && cfg.caller_rounds == Some(true);
    if rtc {
        let _ = set.rtc.set(path.clone());
    }
    // On one CPU, with callers running the data path, an idle engine thread sleeps at
    // once: spinning, it could only take turns with the caller that polls (each a
    // context switch: 14-18 per ib_write_lat iteration in a 1-vCPU VM), while the caller
    // already runs the rounds and a frame or a doorbell wakes this thread anyway.
    let spin_rounds = if rtc && !cfg.busy_poll && set.lone {
        0
    } else {
        SPIN_ROUNDS
    };
    // The link's descriptors are `fds` but the last (the wake-up eventfd).
    if spin_rounds == 0
        && let Err(e) = set.watch.start(wake_fd, &fds[..fds.len() - 1])
    {
        tracing::warn!("engine thread {me}: every frame wakes it: {e}");
    }
    let mut idle = 0u32;
    let mut no_spin_until = Instant::now();
    let mut sleep_mode = SleepMode::new();
    let mut last_pub = Time::ZERO;
    let mut last_port = Instant::now();
    let mut last_file = Instant::now();
    // On the way out, also by unwinding: the data path is taken out of the callers'
    // reach (and the cycle through its `Locals` broken), and posting fails from then on.
    let _out = TakeOnExit(&path, &set);
    loop {
        // A caller that panicked inside a round left it poisoned: the engine stops, as
        // it would have had the panic been its own.
        let Ok(mut g) = path.lock() else { break };
        let Some(d) = g.as_mut() else { break };
        let mut work = 0usize;
        // Doorbells and calls.
        loop {
            match cmds.try_recv() {
                Ok(c) => {
                    work += 1;
                    apply(&mut d.l, c);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    d.l.stop = true;
                    break;
                }
            }
        }
        if d.l.stop {
            break;
        }
        work += d.round(&set);
        // The counters are copied under the lock; files and the interface are read
        // after it, so that a polling caller is not held up by them.
        let round_t = d.now;
        let published =
            (round_t.0.saturating_sub(last_pub.0) > 50_000_000).then(|| d.stats(&link_desc, false));
        // What an idle round decides on.
        // An application thread runs the data path as it polls (`driven`): sleep as an
        // idle thread does instead of spinning beside it (a frame, a doorbell or a call
        // still wakes this thread at once, for a program that stops polling to wait
        // otherwise).
        let (must_send, timeout, driven) = if work == 0 {
            let driven = rtc && set.app_polled_within(RTC_HOLD_NS);
            let due = [
                d.l.engine.poll_timeout(),
                d.faults.as_ref().and_then(|f| f.next_due()),
            ];
            // Read afresh: the round may have taken long (preempted), and a sleep
            // measured from its start could pass a due timer.
            let now = d.rec.now();
            // Sleep until a frame, a doorbell or the next timer; driven, as long: a
            // caller whose round arms a timer due before this sleep ends wakes it
            // (`run_here`); driven sleeps were once cut to 1 ms, which cost a 1-vCPU VM's
            // ib_write_lat about one wake-up per iteration (6.0-7.2 context switches per
            // iteration against 5.3-5.9). The end is published before the lock is released, so
            // that no caller's round falls between the timers read here and the sleep.
            let mut timeout = match due.into_iter().flatten().min() {
                Some(t) => Duration::from_nanos(t.0.saturating_sub(now.0)).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            // With the watch: at most `BLIND_SLEEP` while a caller polls, so that a
            // caller's switching the watch off need not wake this thread to shorten the
            // sleep (`ShardSet::polled`; that wake cost ib_write_lat two context
            // switches per iteration in the rxe VMs, where the round-trip timer is
            // longer). The plan is published before the watch is read.
            let mono = crate::time::monotonic_ns();
            let end = |t: Duration| mono.saturating_add(t.max(MIN_SLEEP).as_nanos() as u64);
            if driven && set.watch.ep.get().is_some() {
                timeout = timeout.min(BLIND_SLEEP);
            }
            set.watch.until.store(end(timeout), Ordering::SeqCst);
            if set.watch.is_off() && timeout > BLIND_SLEEP {
                timeout = BLIND_SLEEP;
                set.watch.until.store(end(timeout), Ordering::SeqCst);
            }
            // ppoll(2) sleeps at least this long.
            let slept = timeout.max(MIN_SLEEP);
            set.sleep_until.store(
                now.0.saturating_add(slept.as_nanos() as u64),
                Ordering::SeqCst,
            );
            (
                d.l.engine.wants_transmit() || d.link.get().tx_pending(),
                timeout,
                driven,
            )
        } else {
            (false, MAX_SLEEP, false)
        };
        drop(g);
        if let Some(s) = published {
            last_pub = round_t;
            *stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
            // The capture's buffer goes to the file every 50 ms: a program killed, or
            // one that exits without closing its device, keeps its last frames.
            if me == 0
                && tapping
                && let Some(w) = tap.lock().unwrap_or_else(|e| e.into_inner()).as_mut()
            {
                let _ = w.flush();
            }
            if me == 0
                && let Some(p) = &cfg.stats_file
                && last_file.elapsed() > Duration::from_millis(500)
            {
                last_file = Instant::now();
                write_stats(p, &Stats::total(&set.stats));
            }
            if me == 0 && last_port.elapsed() > PORT_WATCH {
                last_port = Instant::now();
                if watch_port(cfg.port_ifname.as_deref(), &set.port_up, &events) == Some(false)
                    && let Ok(mut g) = path.lock()
                    && let Some(d) = g.as_mut()
                {
                    d.l.engine.link_down();
                }
            }
        }
        if work > 0 {
            idle = 0;
            continue;
        }
        if must_send {
            // Frames wait for room in the link's transmit ring, or in it for the kernel
            // to take them (copy mode sends a budget of descriptors per kick, and only
            // the next flush kicks again): no descriptor wakes us for either, so come
            // back right after giving the core away. Sleeping here left a frame in the
            // ring until the retransmit timer (xdp_link's 64 MiB test at MTU 4200).
            set.sleep_until.store(u64::MAX, Ordering::SeqCst);
            std::thread::yield_now();
            continue;
        }
        idle = idle.saturating_add(1);
        let t0 = (!driven && (cfg.busy_poll || idle < spin_rounds)).then(Instant::now);
        if let Some(t0) = t0
            && (cfg.busy_poll || t0 >= no_spin_until)
        {
            // Keep polling, but give the core away between rounds: the application
            // thread that posts the next WR or polls the CQ often shares this core,
            // and a bare spin would keep it waiting for the end of our time slice.
            set.sleep_until.store(u64::MAX, Ordering::SeqCst);
            std::thread::yield_now();
            if !cfg.busy_poll && t0.elapsed() > SLOW_YIELD {
                // The core went to a thread that does not give it back (a program
                // spinning on memory, as ib_write_lat does): yielding to it again would
                // cost a scheduler tick each time. Sleep when idle instead, so that the
                // next frame or doorbell wakes this thread and preempts the spinner.
                no_spin_until = sleep_mode.slow_yield(Instant::now());
            }
            continue;
        }
        match set.watch.engage(driven) {
            Some(ep) => sleep(&[ep], timeout, &set, me),
            None => sleep(&fds, timeout, &set, me),
        }
        set.sleep_until.store(u64::MAX, Ordering::SeqCst);
        set.watch.until.store(u64::MAX, Ordering::SeqCst);
        // The caller that switched the watch off stopped polling without a completion.
        if set.watch.is_off() && !set.app_polled_within(BLIND_HOLD_NS) {
            set.watch.resume();
        }
    }
    set.stopped.store(true, Ordering::SeqCst);
    // Out of the application threads' reach from here on.
    let taken = path.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(mut d) = taken else {
        // Not reached: only this thread takes the data path out.
        return;
    };
    // Shutdown: flush every QP, hand out the last completions.
    let qpns: Vec<u32> = d.l.qps.keys().copied().collect();
    for q in qpns {
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = d.l.engine.modify_qp(q, &a, QpAttrMask::STATE);
    }
    deliver(&mut d.l, &d.events, &mut d.overflowed_cqs);
    *stats.lock().unwrap_or_else(|e| e.into_inner()) = d.stats(&link_desc, true);
    // Shard 0 stops the others (their counters are then final too), then reports.
    for k in 1..n {
        set.send(k, Cmd::Call(Box::new(|l| l.stop = true)));
    }
    for h in others {
        let _ = h.join();
    }
    if me == 0 {
        if let Some(w) = tap.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.into_inner().flush();
        }
        if let Some(p) = &cfg.stats_file {
            write_stats(p, &Stats::total(&set.stats));
        }
        tracing::info!("engine stopped");
    }
    // Dropping `d` (its link) detaches XDP (part 0, after the others stopped) and frees
    // the UMEM.
    drop(d);
}

/// Sleeps in ppoll(2) on `fds` (the link's and the wake-up eventfd) for at most
/// `timeout` (at least [`MIN_SLEEP`]), unless shard `me` has a call, a frame handed
/// over, a doorbell or a caller's kick waiting. Not poll(2): it sleeps whole
/// milliseconds, so a round-trip timer of 0.2 ms waited 1 ms and more (`bench loss` at
/// 2%: the timer went back N 1.42 ms after the last packet on average, about 200 times
/// a second, where the timer said 1.12 ms).
fn sleep(fds: &[i32], timeout: Duration, set: &ShardSet, me: usize) {
    let (cmds, fwd, bells, kick) = (
        &set.links[me].cmd_rx,
        &set.fwd[me].1,
        &set.bells[me],
        &set.kick,
    );
    let (wake_fd, sleeping) = (set.links[me].wake.fd, &*set.links[me].wake.sleeping);
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let t = timeout.clamp(MIN_SLEEP, Duration::from_secs(1));
    let ts = libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    };
    // Raise the flag, then look at the doorbells once more: a caller either sees the flag
    // and rings the eventfd, or rang before and its command is seen here. The same for
    // a caller's kick (work its round left).
    sleeping.store(true, Ordering::SeqCst);
    if cmds.is_empty() && fwd.is_empty() && bells.is_empty() && !kick.swap(false, Ordering::SeqCst)
    {
        // SAFETY: `p` is a valid array of pollfd of the given length, `ts` a live
        // timespec; no signal mask is passed.
        unsafe {
            libc::ppoll(
                p.as_mut_ptr(),
                p.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
    }
    sleeping.store(false, Ordering::SeqCst);
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a live u64 from our nonblocking eventfd.
    unsafe { libc::read(wake_fd, (&mut v as *mut u64).cast(), 8) };
}

fn apply(l: &mut Locals, c: Cmd) {
    match c {
        Cmd::Call(f) => f(l),
    }
}

/// What draining a doorbell needs of the engine thread's state: borrowed apart from the
/// link, so that the receive path can drain doorbells between taking frames off the ring
/// and handing them to the engine.
pub(crate) struct Bells<'a> {
    pub engine: &'a mut Engine,
    pub qps: &'a mut QpRegistry,
    pub srqs: &'a mut SrqRegistry,
    pub set: &'a ShardSet,
    pub me: usize,
    pub held: &'a mut Vec<u32>,
    scratch: &'a mut (SendWr, RecvWr),
}

impl Locals {
    pub(crate) fn bells(&mut self) -> Bells<'_> {
        Bells {
            engine: &mut self.engine,
            qps: &mut self.qps,
            srqs: &mut self.srqs,
            set: &self.set,
            me: self.me,
            held: &mut self.held,
            scratch: &mut self.scratch,
        }
    }
}

impl Bells<'_> {
    /// Every doorbell rung so far.
    pub(crate) fn drain(&mut self) -> usize {
        let mut n = 0;
        while let Some(b) = self.set.bells[self.me].pop() {
            n += 1;
            self.ring(b);
        }
        n
    }

    /// Takes the WRs a doorbell announces out of their ring into the engine.
    fn ring(&mut self, bell: u32) {
        if bell & SRQ_BELL != 0 {
            self.drain_srq(bell & !SRQ_BELL);
            return;
        }
        let qpn = bell;
        let Some((sh, _, _)) = self.qps.get(&qpn) else {
            match self.set.owner(qpn) {
                // The QP is on its way here: hold the doorbell until it arrives.
                Some(o) if o == self.me => self.held.push(qpn),
                // The QP moved away: hand the doorbell on.
                Some(o) if self.set.bell(o, qpn) => self.set.links[o].wake.ring(),
                Some(_) => {}
                None => {}
            }
            return;
        };
        // Borrowed, not cloned: an `Arc` clone per doorbell was a locked increment and
        // decrement on the QP's shared state, cold among a thousand QPs (`bench qps`).
        // Lowered before draining: a WR posted after this point rings again. A swap, not
        // a store: reading the poster's raising is what makes its WR visible to the drain.
        sh.rung.swap(false, Ordering::SeqCst);
        let (mut sref, mut rref) = (0u64, 0u64);
        let (swr, rwr) = &mut *self.scratch;
        while let Some(found) = sh.sq_ring.pop_into(swr) {
            if !found {
                tracing::error!("QP 0x{qpn:06x}: a posted send WR is missing from its ring");
                sref += 1;
                continue;
            }
            let wr = &*swr;
            if let Err(e) = self.engine.post_send(qpn, wr) {
                tracing::warn!("send WR {} on QP 0x{qpn:06x} refused: {e}", wr.wr_id);
                sref += 1;
            }
        }
        while let Some(found) = sh.rq_ring.pop_into(rwr) {
            if !found {
                tracing::error!("QP 0x{qpn:06x}: a posted receive WR is missing from its ring");
                rref += 1;
                continue;
            }
            let wr = &*rwr;
            if let Err(e) = self.engine.post_recv(qpn, wr) {
                tracing::warn!("receive WR {} on QP 0x{qpn:06x} refused: {e}", wr.wr_id);
                rref += 1;
            }
        }
        if sref + rref > 0
            && let Some(x) = self.qps.get_mut(&qpn)
        {
            x.1 += sref;
            x.2 += rref;
            // The mirror adds these to the engine's counts, which did not move.
            self.engine.republish_qp(qpn);
        }
    }

    /// Moves the receive WRs posted to SRQ `id` into the engine.
    pub(crate) fn drain_srq(&mut self, id: u32) {
        let Some((sh, _)) = self.srqs.get(&id) else {
            return;
        };
        sh.rung.swap(false, Ordering::SeqCst);
        let mut refused = 0u64;
        while let Some(wr) = sh.ring.pop() {
            if let Err(e) = self.engine.post_srq_recv(id, &wr) {
                tracing::warn!("receive WR {} on SRQ {id} refused: {e}", wr.wr_id);
                refused += 1;
            }
        }
        if let Some(x) = self.srqs.get_mut(&id) {
            x.1 += refused;
        }
    }
}

/// Moves the receive WRs posted to SRQ `id` into the engine.
pub(crate) fn drain_srq(l: &mut Locals, id: u32) {
    l.bells().drain_srq(id);
}

/// Applies the doorbells held for `qpn` now that it has arrived.
pub(crate) fn replay_held(l: &mut Locals, qpn: u32) {
    let held = std::mem::take(&mut l.held);
    for b in held {
        if b == qpn {
            l.bells().ring(b);
        } else {
            l.held.push(b);
        }
    }
}

/// How often shard 0 looks at the port's interface.
const PORT_WATCH: Duration = Duration::from_millis(500);

/// Follows the port's interface: up with a carrier is ACTIVE; a change raises
/// PORT_ACTIVE or PORT_ERR, as rxe reports its netdev's events. Returns the new state
/// when it changed.
fn watch_port(ifname: Option<&str>, up: &AtomicBool, events: &EventSink) -> Option<bool> {
    let name = ifname?;
    let now = crate::host::Interface::find(name)
        .and_then(|i| i.is_running())
        .unwrap_or(false);
    if up.swap(now, Ordering::SeqCst) == now {
        return None;
    }
    events.send(if now {
        AsyncEvent::PortActive
    } else {
        AsyncEvent::PortErr
    });
    Some(now)
}

fn deliver(l: &mut Locals, events: &EventSink, overflowed: &mut Vec<u32>) {
    // Queue occupancy first: a caller that sees a completion must also see its slot
    // free, or a repost right after polling would be refused as a full queue.
    let qps = &l.qps;
    l.engine.take_touched_qps(|qpn, state, sq_done, rq_done| {
        if let Some((sh, rs, rr)) = qps.get(&qpn) {
            // Stored only when changed: a store takes the cache line from the posting
            // threads that read it, even when it writes the value already there.
            let store = |a: &std::sync::atomic::AtomicU64, v: u64| {
                if a.load(Ordering::Relaxed) != v {
                    a.store(v, Ordering::SeqCst);
                }
            };
            if sh.state.load(Ordering::Relaxed) != state as u8 {
                sh.set_state(state);
            }
            store(&sh.sq_done, sq_done + rs);
            store(&sh.rq_done, rq_done + rr);
        }
    });
    let cqs = &l.cqs;
    let mut lost: Vec<(u32, u32)> = Vec::new();
    let mut handed = false;
    for (id, (sh, refused)) in &l.srqs {
        sh.done
            .store(l.engine.srq_taken(*id) + refused, Ordering::SeqCst);
    }
    // Waiters are woken once per CQ and batch (completions of one CQ come together).
    let mut last: Option<&Arc<CqShared>> = None;
    l.engine.take_touched_cqs(|cq, wc, solicited| {
        if let Some(c) = cqs.get(&cq) {
            if c.push(wc, solicited) {
                handed = true;
            } else {
                lost.push((cq, wc.qp_num));
            }
            if !last.is_some_and(|p| Arc::ptr_eq(p, c))
                && let Some(p) = last.replace(c)
            {
                p.wake_waiters();
            }
        }
    });
    if let Some(p) = last {
        p.wake_waiters();
    }
    if handed {
        l.set.pulse.beat();
    }
    for (cq, qpn) in lost {
        // A completion could not be handed over: the CQ overflowed (IBA 11.4.2.1).
        if !overflowed.contains(&cq) {
            overflowed.push(cq);
            events.send(AsyncEvent::CqErr { cq });
        }
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = l.engine.modify_qp(qpn, &a, QpAttrMask::STATE);
    }
    while let Some(e) = l.engine.poll_event() {
        events.send(e);
    }
    while let Some(e) = l.engine.poll_cm_event() {
        events.send_cm(e);
    }
}

fn write_stats(path: &std::path::Path, s: &Stats) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, s.to_json().to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// The seed of a real device's engine, from which its R_Key and L_Key bytes and its
/// starting PSNs are drawn: from the kernel's random source (getrandom(2)), so that a
/// peer who knows when the process started cannot predict them. Only if that fails, the
/// time and the process ID.
fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into the buffer it is given, which
    // is ours and that long.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_ne_bytes(b);
    }
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|t| t.as_nanos() as u64)
        .unwrap_or(1)
        ^ u64::from(std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_mode_grows_while_slow_yields_follow_it_and_starts_over_after_a_quiet_spell() {
        let t = Instant::now();
        let mut m = SleepMode::new();
        // An isolated slow yield: the short mode.
        assert_eq!(m.slow_yield(t), t + SLEEP_MODE_MIN);
        // Slow again as each mode ends (a spinner on the core): doubling to the cap.
        let mut now = t + SLEEP_MODE_MIN + Duration::from_millis(2);
        let mut lens = Vec::new();
        for _ in 0..8 {
            let until = m.slow_yield(now);
            lens.push((until - now).as_millis());
            now = until + Duration::from_millis(3);
        }
        assert_eq!(lens, [10, 20, 40, 80, 160, 200, 200, 200]);
        // Half a second with no slow yield after a 200 ms mode: the short mode again.
        let later = now + Duration::from_millis(500);
        assert_eq!(m.slow_yield(later), later + SLEEP_MODE_MIN);
        // Two slow yields a second apart never grow it.
        let again = later + Duration::from_secs(1);
        assert_eq!(m.slow_yield(again), again + SLEEP_MODE_MIN);
    }

    /// Whether `fd` is readable now, asked as the engine thread asks (`ppoll`).
    fn readable(fd: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: one live pollfd and a live timespec.
        unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) > 0 }
    }

    /// Makes eventfd `fd` readable.
    fn post(fd: i32) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a live u64 to an eventfd.
        assert_eq!(
            unsafe { libc::write(fd, (&one as *const u64).cast(), 8) },
            8
        );
    }

    /// The engine thread's epoll set: a frame waiting on the link makes it readable only
    /// while the watch is on; one that came while it was off is reported as soon as the
    /// watch is on again; the wake-up eventfd makes it readable either way. With no
    /// caller polling, the engine thread sleeps on the descriptors, out of the set.
    #[test]
    fn the_watch_off_hides_frames_but_not_wake_ups_and_on_again_shows_what_waits() {
        let set = ShardSet::new(1, true).unwrap();
        let link = super::super::Wake::new().unwrap();
        let w = &set.watch;
        w.start(set.links[0].wake.fd, &[link.fd]).unwrap();
        assert_eq!(
            w.engage(false),
            None,
            "no caller polls: the descriptors themselves"
        );
        let ep = w.engage(true).unwrap();
        assert!(!readable(ep));
        post(link.fd);
        assert!(
            readable(ep),
            "a frame wakes the engine thread while watched"
        );
        assert!(w.switch(Watch::On, Watch::Off));
        assert!(!w.switch(Watch::On, Watch::Off), "already off");
        assert!(w.is_off());
        assert!(
            !readable(ep),
            "the same frame does not while the watch is off"
        );
        post(set.links[0].wake.fd);
        assert!(readable(ep), "a doorbell or a kick always does");
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from the eventfd.
        unsafe { libc::read(set.links[0].wake.fd, (&mut v as *mut u64).cast(), 8) };
        assert!(!readable(ep));
        assert_eq!(w.engage(true), Some(ep), "off, it stays off");
        assert!(!readable(ep));
        w.resume();
        assert!(!w.is_off());
        assert!(readable(ep), "the frame that waited shows at once");
        assert_eq!(w.engage(false), None);
        assert!(!readable(ep), "out of the set");
        assert_eq!(w.engage(true), Some(ep));
        assert!(readable(ep), "back in, and it still waits");
    }

    /// Polls switch the watch: off after `BLIND_AFTER` empty ones in a row, on at the
    /// first that finds a completion. An engine thread that planned a sleep longer than
    /// `BLIND_SLEEP` is kicked when the watch goes off, one that planned a short one or
    /// is awake is not.
    #[test]
    fn empty_polls_switch_the_watch_off_a_completion_on_and_a_long_sleep_is_cut() {
        let set = ShardSet::new(1, true).unwrap();
        let link = super::super::Wake::new().unwrap();
        set.watch.start(set.links[0].wake.fd, &[link.fd]).unwrap();
        // Out of the set, the watch is not the callers' to switch off.
        for _ in 0..BLIND_AFTER {
            set.polled(false);
        }
        assert!(!set.watch.is_off());
        set.polled(true);
        set.watch.engage(true).unwrap();
        // Awake (`until` is u64::MAX): no kick.
        for _ in 0..BLIND_AFTER - 1 {
            set.polled(false);
            assert!(!set.watch.is_off());
        }
        set.polled(false);
        assert!(set.watch.is_off());
        assert!(!set.kick.load(Ordering::SeqCst));
        set.polled(false);
        assert!(set.watch.is_off());
        set.polled(true);
        assert!(!set.watch.is_off());
        // A short plan: no kick.
        let now = crate::time::monotonic_ns();
        set.watch.until.store(now + 200_000, Ordering::SeqCst);
        for _ in 0..BLIND_AFTER {
            set.polled(false);
        }
        assert!(set.watch.is_off());
        assert!(!set.kick.load(Ordering::SeqCst));
        set.polled(true);
        // A plan of 20 ms: kicked (and rung, if it sleeps).
        set.watch.until.store(now + 20_000_000, Ordering::SeqCst);
        for _ in 0..BLIND_AFTER {
            set.polled(false);
        }
        assert!(set.watch.is_off());
        assert!(set.kick.load(Ordering::SeqCst));
        // Stopped: polls leave the watch alone (the link's descriptors are closed).
        set.stopped.store(true, Ordering::SeqCst);
        set.polled(true);
        assert!(set.watch.is_off());
    }
}

//! The engine thread: a poll-mode loop around the sans-IO engine.
//!
//! Each round: doorbells and control calls, a batch of received frames, due timers, a
//! batch of frames to send, completions handed to the CQs' queues, QP state and queue
//! occupancy mirrored for the callers' checks. When a few hundred rounds in a row find
//! nothing to do, the thread sleeps in poll(2) on the link's descriptors and an eventfd
//! until a frame, a doorbell or the next timer (unless `busy_poll`).

use super::{Cmd, CqShared, DeviceInfo, LinkKind, QpRegistry, RuntimeConfig};
use crate::capture::Writer;
use crate::engine::{Counters, Engine};
use crate::link::FrameLink;
use crate::link::bpf::XdpStats;
use crate::time::Time;
use crate::verbs::{AsyncEvent, DeviceConfig, Mtu, QpAttr, QpAttrMask, QpState};
use crossbeam::channel::{Receiver, Sender, TryRecvError};
use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Idle rounds before the thread sleeps.
const SPIN_ROUNDS: u32 = 256;
/// Longest sleep (so a stop is noticed even without a wake-up).
const MAX_SLEEP: Duration = Duration::from_millis(20);

/// What control calls see on the engine thread.
pub(crate) struct Locals {
    pub engine: Engine,
    pub cqs: HashMap<u32, Arc<CqShared>>,
    /// QP -> (shared state, send WRs refused, receive WRs refused).
    pub qps: QpRegistry,
    pub stop: bool,
}

/// Counters of a running device: the engine's, the XDP program's, the link's.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub counters: Counters,
    pub xdp: Option<XdpStats>,
    pub link: String,
    pub qps: usize,
    pub uptime: Duration,
    /// Written when the engine stopped.
    pub final_report: bool,
}

impl Stats {
    /// The counters as a JSON object (what `roce-xdp stats` reads).
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("pid".into(), std::process::id().into());
        m.insert("final".into(), self.final_report.into());
        m.insert("link".into(), self.link.clone().into());
        m.insert("qps".into(), self.qps.into());
        m.insert("uptime_s".into(), self.uptime.as_secs_f64().into());
        let mut c = serde_json::Map::new();
        for (n, v) in self.counters.named() {
            c.insert(n.into(), v.into());
        }
        m.insert("counters".into(), c.into());
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
            AnyLink::Xdp(l) => Some(l.xdp_stats()),
            AnyLink::Udp(_) => None,
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
            if v4.is_empty() && v6.is_empty() {
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
            d.port_mtu = port_mtu;
            d.seed = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|t| t.as_nanos() as u64)
                .unwrap_or(1)
                ^ u64::from(std::process::id());
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
            d.seed = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|t| t.as_nanos() as u64)
                .unwrap_or(1);
            Ok((d, None))
        }
    }
}

fn addresses(d: &DeviceConfig) -> Vec<IpAddr> {
    d.ipv4
        .iter()
        .map(|a| IpAddr::V4(*a))
        .chain(d.ipv6.iter().map(|a| IpAddr::V6(*a)))
        .chain(std::iter::once(IpAddr::V6(
            crate::verbs::device::link_local_of(d.mac),
        )))
        .collect()
}

fn setup(cfg: &RuntimeConfig) -> Result<(Engine, AnyLink, DeviceInfo), String> {
    if let Some(ns) = &cfg.netns {
        crate::host::enter_netns(ns).map_err(|e| e.to_string())?;
    }
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
        port_mtu: dcfg.port_mtu,
        limits: dcfg.limits,
        link: l.get().describe(),
        ifname,
        udp: dcfg.udp_link,
    };
    Ok((engine, l, info))
}

pub(crate) fn run(
    cfg: RuntimeConfig,
    cmds: Receiver<Cmd>,
    events: Sender<AsyncEvent>,
    (wake_fd, sleeping): (i32, Arc<AtomicBool>),
    ready: Sender<Result<DeviceInfo, String>>,
    stats: Arc<Mutex<Stats>>,
) {
    let (engine, mut link, info) = match setup(&cfg) {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut tap = match &cfg.pcap {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => Writer::new(BufWriter::new(f)).ok(),
            Err(e) => {
                let _ = ready.send(Err(format!("creating {}: {e}", p.display())));
                return;
            }
        },
        None => None,
    };
    tracing::info!("engine up: {}", info.link);
    let link_desc = info.link.clone();
    let _ = ready.send(Ok(info));
    let mut l = Locals {
        engine,
        cqs: HashMap::new(),
        qps: HashMap::new(),
        stop: false,
    };
    let start = Instant::now();
    let now = || Time(start.elapsed().as_nanos() as u64);
    let wall = |t: Time| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(start.elapsed())
            + Duration::from_nanos(t.0)
    };
    let mut idle = 0u32;

    let mut last_pub = Instant::now();
    let mut last_file = Instant::now();
    let mut fds = link.get().fds();
    fds.push(wake_fd);
    let mut overflowed_cqs: Vec<u32> = Vec::new();
    let tap_max = cfg.pcap_max_frames.unwrap_or(u64::MAX);
    let mut tapped = 0u64;
    loop {
        let mut work = 0usize;
        // Doorbells and calls.
        loop {
            match cmds.try_recv() {
                Ok(c) => {
                    work += 1;
                    apply(&mut l, c);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    l.stop = true;
                    break;
                }
            }
        }
        if l.stop {
            break;
        }
        let t = now();
        // Received frames.
        {
            let engine = &mut l.engine;
            let tap = &mut tap;
            let tapped = &mut tapped;
            work += link.get().recv(256, &mut |f| {
                if let Some(w) = tap.as_mut()
                    && *tapped < tap_max
                {
                    *tapped += 1;
                    let _ = w.write(wall(t), f);
                }
                engine.handle_frame(t, f);
            });
        }
        // Timers.
        if l.engine.poll_timeout().is_some_and(|d| d <= t) {
            l.engine.handle_timeout(t);
            work += 1;
        }
        // Frames to send.
        {
            let engine = &mut l.engine;
            let tap = &mut tap;
            let tapped = &mut tapped;
            work += link.get().send(&mut |buf| {
                let n = engine.poll_transmit(t, buf)?;
                if let Some(w) = tap.as_mut()
                    && *tapped < tap_max
                {
                    *tapped += 1;
                    let _ = w.write(wall(t), &buf[..n]);
                }
                Some(n)
            });
            link.get().flush();
        }
        // Completions, states, events.
        deliver(&mut l, &events, &mut overflowed_cqs);
        if last_pub.elapsed() > Duration::from_millis(50) {
            last_pub = Instant::now();
            let s = Stats {
                counters: *l.engine.counters(),
                xdp: link.xdp_stats(),
                link: link_desc.clone(),
                qps: l.engine.qp_count(),
                uptime: start.elapsed(),
                final_report: false,
            };
            if let Some(p) = &cfg.stats_file
                && last_file.elapsed() > Duration::from_millis(500)
            {
                last_file = Instant::now();
                write_stats(p, &s);
            }
            *stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
        }
        if work > 0 {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if cfg.busy_poll || idle < SPIN_ROUNDS {
            std::hint::spin_loop();
            continue;
        }
        // Sleep until a frame, a doorbell or the next timer.
        let timeout = match l.engine.poll_timeout() {
            Some(d) => Duration::from_nanos(d.0.saturating_sub(now().0)).min(MAX_SLEEP),
            None => MAX_SLEEP,
        };
        sleep(&fds, wake_fd, &sleeping, timeout, &cmds);
    }
    // Shutdown: flush every QP, hand out the last completions.
    let qpns: Vec<u32> = l.qps.keys().copied().collect();
    for q in qpns {
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = l.engine.modify_qp(q, &a, QpAttrMask::STATE);
    }
    deliver(&mut l, &events, &mut overflowed_cqs);
    if let Some(w) = tap {
        let _ = w.into_inner().flush();
    }
    let s = Stats {
        counters: *l.engine.counters(),
        xdp: link.xdp_stats(),
        link: link_desc,
        qps: l.engine.qp_count(),
        uptime: start.elapsed(),
        final_report: true,
    };
    if let Some(p) = &cfg.stats_file {
        write_stats(p, &s);
    }
    *stats.lock().unwrap_or_else(|e| e.into_inner()) = s;
    tracing::info!("engine stopped");
    // Dropping `link` detaches XDP and frees the UMEM.
}

fn sleep(
    fds: &[i32],
    wake_fd: i32,
    sleeping: &AtomicBool,
    timeout: Duration,
    cmds: &Receiver<Cmd>,
) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().clamp(1, 1000) as i32;
    // Raise the flag, then look at the doorbells once more: a caller either sees the flag
    // and rings the eventfd, or rang before and its command is seen here.
    sleeping.store(true, Ordering::SeqCst);
    if cmds.is_empty() {
        // SAFETY: `p` is a valid array of pollfd of the given length.
        unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    }
    sleeping.store(false, Ordering::SeqCst);
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a live u64 from our nonblocking eventfd.
    unsafe { libc::read(wake_fd, (&mut v as *mut u64).cast(), 8) };
}

fn apply(l: &mut Locals, c: Cmd) {
    match c {
        Cmd::Call(f) => f(l),
        Cmd::PostSend(qpn, wr) => {
            if let Err(e) = l.engine.post_send(qpn, &wr) {
                tracing::warn!("send WR {} on QP 0x{qpn:06x} refused: {e}", wr.wr_id);
                if let Some(x) = l.qps.get_mut(&qpn) {
                    x.1 += 1;
                }
            }
        }
        Cmd::PostRecv(qpn, wr) => {
            if let Err(e) = l.engine.post_recv(qpn, &wr) {
                tracing::warn!("receive WR {} on QP 0x{qpn:06x} refused: {e}", wr.wr_id);
                if let Some(x) = l.qps.get_mut(&qpn) {
                    x.2 += 1;
                }
            }
        }
        Cmd::PostSrqRecv(srq, wr) => {
            if let Err(e) = l.engine.post_srq_recv(srq, &wr) {
                tracing::warn!("receive WR {} on SRQ {srq} refused: {e}", wr.wr_id);
            }
        }
    }
}

fn deliver(l: &mut Locals, events: &Sender<AsyncEvent>, overflowed: &mut Vec<u32>) {
    // Queue occupancy first: a caller that sees a completion must also see its slot
    // free, or a repost right after polling would be refused as a full queue.
    let qps = &l.qps;
    l.engine.take_touched_qps(|qpn, state, sq_done, rq_done| {
        if let Some((sh, rs, rr)) = qps.get(&qpn) {
            sh.set_state(state);
            sh.sq_done
                .store(sq_done + rs, std::sync::atomic::Ordering::SeqCst);
            sh.rq_done
                .store(rq_done + rr, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let cqs = &l.cqs;
    let mut lost: Vec<(u32, u32)> = Vec::new();
    l.engine.take_touched_cqs(|cq, wc| {
        if let Some(c) = cqs.get(&cq)
            && !c.push(wc)
        {
            lost.push((cq, wc.qp_num));
        }
    });
    for (cq, qpn) in lost {
        // A completion could not be handed over: the CQ overflowed (IBA 11.4.2.1).
        if !overflowed.contains(&cq) {
            overflowed.push(cq);
            let _ = events.send(AsyncEvent::CqErr { cq });
        }
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = l.engine.modify_qp(qpn, &a, QpAttrMask::STATE);
    }
    while let Some(e) = l.engine.poll_event() {
        let _ = events.send(e);
    }
}

fn write_stats(path: &std::path::Path, s: &Stats) {
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, s.to_json().to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

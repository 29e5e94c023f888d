//! `roce-xdp demo`, the main job: two engines in two private network namespaces joined
//! by a veth pair, over AF_XDP, running RC SEND ping-pong latency, RDMA WRITE and READ
//! bandwidth, atomics and a byte-exact mixed transfer; a results table; `demo.pcap`.
//! Without root it runs the same over the UDP link on loopback. Everything it creates
//! is removed when it returns (errors and Ctrl-C included): the namespaces and devices
//! are dropped on the way out.

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts};
use super::progress::Progress;
use super::workload::{self, Report, Stream};
use crate::netns::Pair;
use crate::runtime::{Device, RuntimeConfig};
use crate::verbs::{Mtu, QpType};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Instant;

/// The smallest netdev MTU a RoCEv2 packet of IB MTU 256 fits (IP, UDP, BTH, RETH and
/// ICRC around 256 bytes: `Mtu::for_netdev_mtu`).
pub const MIN_NETDEV_MTU: u32 = 316;
/// The largest the AF_XDP link takes (a 9022-byte frame buffer, Ethernet header included).
pub const MAX_NETDEV_MTU: u32 = 9000;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Netdev MTU of the veth pair: 1500 gives IB MTU 1024, 4200 gives 4096.
    pub netdev_mtu: u32,
    /// Ping-pong round trips.
    pub iters: u64,
    /// Bytes per bandwidth step.
    pub stream_bytes: u64,
    /// Message size of the bandwidth steps.
    pub stream_size: usize,
    /// Bytes of the mixed, byte-checked transfer.
    pub mixed_bytes: u64,
    /// Atomic operations.
    pub atomics: u64,
    /// Where to write the capture of engine A (pcapng): the first `pcap_per_step`
    /// frames of each step, the step named in a comment on its first frame, at most
    /// `pcap_frames` in all.
    pub pcap: Option<PathBuf>,
    pub pcap_frames: u64,
    pub pcap_per_step: u64,
    /// Drop this percentage of RoCE frames each way during the integrity step, with
    /// nftables on a bridge between the namespaces (AF_XDP only), so that the capture
    /// shows NAKs, go-back-N and retransmit timeouts.
    pub loss: u32,
    /// Use the UDP link even as root.
    pub udp: bool,
    /// Engine threads spin instead of sleeping when idle (lower latency, two busy cores).
    pub busy_poll: bool,
    /// Queues per veth end and engine threads per device (AF_XDP only).
    pub threads: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            netdev_mtu: 1500,
            iters: 5000,
            stream_bytes: 256 << 20,
            stream_size: 64 << 10,
            mixed_bytes: 64 << 20,
            atomics: 20_000,
            pcap: Some(PathBuf::from("demo.pcap")),
            pcap_frames: 20_000,
            pcap_per_step: 400,
            loss: 0,
            udp: false,
            busy_poll: false,
            threads: 1,
        }
    }
}

/// One line of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    pub step: String,
    pub result: String,
    pub detail: String,
    pub secs: f64,
}

/// What the demo did.
#[derive(Debug, Clone)]
pub struct Summary {
    pub rows: Vec<Row>,
    pub link: String,
    /// Engine counters of A and B at the end.
    pub stats: [crate::runtime::Stats; 2],
    pub pcap: Option<PathBuf>,
    /// With `loss`: frames nftables dropped towards A and towards B.
    pub lost: Option<(u64, u64)>,
    /// Frames of A the capture left out (each step keeps its first ones).
    pub pcap_skipped: u64,
}

/// The namespaces of the demo: a veth pair, or (for `--loss`) two ends behind a bridge
/// whose egress can drop frames (AF_XDP transmissions skip the sender's own egress).
enum Topology {
    /// Held for its `Drop`, which removes the namespaces.
    Pair(#[allow(dead_code)] Pair),
    Bridged(crate::netns::Bridged),
}

/// Runs the demo, printing progress through `say`.
pub fn run(o: &Opts, say: &mut dyn FnMut(&str)) -> Result<Summary, String> {
    let xdp = if o.udp {
        Err("--udp asked for the UDP link".to_string())
    } else {
        crate::netns::available().and_then(|_| crate::host::check_xdp_privileges())
    };
    // Every option checked before anything is created.
    let ib_mtu = Mtu::for_netdev_mtu(o.netdev_mtu)
        .filter(|_| o.netdev_mtu <= MAX_NETDEV_MTU)
        .ok_or_else(|| {
            format!(
                "--mtu {}: the netdev MTU must be {MIN_NETDEV_MTU} (IB MTU 256) to {MAX_NETDEV_MTU}",
                o.netdev_mtu
            )
        })?;
    if o.loss > 0 && xdp.is_err() {
        return Err(format!(
            "--loss needs AF_XDP and network namespaces (nftables drops on a bridge between them): {}",
            xdp.as_ref().err().map_or("", |e| e.as_str())
        ));
    }
    if o.loss > 0 && o.threads > 1 {
        return Err("--loss runs one engine thread per device (no --threads)".into());
    }
    if o.loss > 50 {
        return Err(format!("--loss {}: at most 50 (%)", o.loss));
    }
    // The namespaces must outlive the devices: declared first, dropped last.
    let pair;
    let (ca, cb, ip_a, ip_b) = match xdp {
        Ok(()) => {
            let (ifname, na, nb, a, b) = if o.loss > 0 {
                let br = crate::netns::Bridged::new("roce-demo", 0, 2, o.netdev_mtu)?;
                say(&format!(
                    "namespaces {} ({}) and {} ({}) behind a bridge in {}, MTU {}",
                    br.ends[0].name,
                    br.ips[0],
                    br.ends[1].name,
                    br.ips[1],
                    br.mid.name,
                    o.netdev_mtu
                ));
                let t = (
                    br.ifname.clone(),
                    br.ends[0].name.clone(),
                    br.ends[1].name.clone(),
                    br.ips[0],
                    br.ips[1],
                );
                pair = Some(Topology::Bridged(br));
                t
            } else {
                let p = Pair::with_queues("roce-demo", 0, o.netdev_mtu, o.threads.max(1) as u32)?;
                say(&format!(
                    "namespaces {} ({}) and {} ({}), veth MTU {}",
                    p.a.name, p.ip_a, p.b.name, p.ip_b, p.mtu
                ));
                let t = (
                    p.ifname.clone(),
                    p.a.name.clone(),
                    p.b.name.clone(),
                    p.ip_a,
                    p.ip_b,
                );
                pair = Some(Topology::Pair(p));
                t
            };
            let mut ca = RuntimeConfig::xdp(&ifname);
            ca.netns = Some(na);
            ca.threads = o.threads.max(1);
            let mut cb = ca.clone();
            cb.netns = Some(nb);
            (ca, cb, IpAddr::V4(a), IpAddr::V4(b))
        }
        Err(why) => {
            pair = None;
            let _ = &pair;
            say(&format!(
                "AF_XDP not possible here ({why}); running over the UDP link on loopback"
            ));
            let a = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
            let b = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
            let mut ca = RuntimeConfig::udp(a);
            let mut cb = RuntimeConfig::udp(b);
            ca.port_mtu = Some(ib_mtu);
            cb.port_mtu = Some(ib_mtu);
            (ca, cb, a, b)
        }
    };
    let mut ca = ca;
    ca.busy_poll = o.busy_poll;
    ca.pcap = o.pcap.clone();
    ca.pcap_max_frames = Some(o.pcap_frames);
    ca.pcap_ng = true;
    ca.stats_file = Some(super::stats::default_path("demo-a"));
    let mut cb = cb;
    cb.busy_poll = o.busy_poll;
    cb.stats_file = Some(super::stats::default_path("demo-b"));
    let da = Device::open(ca).map_err(|e| format!("engine A: {e}"))?;
    let db = Device::open(cb).map_err(|e| format!("engine B: {e}"))?;
    say(&format!("engine A {ip_a}: {}", da.info().link));
    say(&format!("engine B {ip_b}: {}", db.info().link));
    let mtu = da.info().port_mtu;
    let mem = (16 << 20) + 8192;
    let a = Endpoint::new(da.clone(), &EndpointOpts::new(QpType::Rc, mem))
        .map_err(|e| e.to_string())?;
    let b = Endpoint::new(db.clone(), &EndpointOpts::new(QpType::Rc, mem))
        .map_err(|e| e.to_string())?;
    let (psn_a, psn_b) = (0x00_1000, 0xff_fff0);
    let mut oa = ConnectOpts::new(mtu, psn_a);
    oa.timeout = 12; // ~17 ms
    let mut ob = ConnectOpts::new(mtu, psn_b);
    ob.timeout = 12;
    a.connect(&b.local(psn_b, ip_a), &oa)
        .map_err(|e| e.to_string())?;
    b.connect(&a.local(psn_a, ip_b), &ob)
        .map_err(|e| e.to_string())?;
    say(&format!(
        "RC QP 0x{:06x} (A) <-> QP 0x{:06x} (B), path MTU {}",
        a.qp.qpn,
        b.qp.qpn,
        mtu.bytes()
    ));
    let mut rows = Vec::new();
    let mut step_no = 0;
    // Each step keeps its first `keep` frames (and the first of each opcode after them).
    let mut step = |name: &str, keep: u64| {
        step_no += 1;
        da.capture_section(&format!("demo step {step_no}: {name}"), keep);
    };
    let keep = o.pcap_per_step;
    step("RC SEND ping-pong, 64 B", keep);
    let t = Instant::now();
    let r = workload::pingpong(&a, &b, 64, o.iters)?;
    rows.push(Row {
        step: "RC SEND ping-pong, 64 B".into(),
        result: format!("{:.1} us median RTT", r.rtt_us(0.5)),
        detail: format!("p99 {:.1} us, {} round trips", r.rtt_us(0.99), r.ops),
        secs: t.elapsed().as_secs_f64(),
    });
    say(&line(rows.last()));
    for (op, name) in [(Stream::Write, "RDMA WRITE"), (Stream::Read, "RDMA READ")] {
        let t = Instant::now();
        let label = format!("{name} {} KiB", o.stream_size >> 10);
        step(&format!("{label} bandwidth"), keep);
        let mut p = Progress::new(&label, o.stream_bytes, true);
        let r: Report = workload::stream(&a, &b, op, o.stream_size, o.stream_bytes, 16, &mut p)?;
        rows.push(Row {
            step: format!("{label} bandwidth"),
            result: format!("{:.2} Gbit/s", r.gbps()),
            detail: format!("{} messages, {:.0} msg/s", r.ops, r.rate()),
            secs: t.elapsed().as_secs_f64(),
        });
        say(&line(rows.last()));
    }
    step("atomics FETCH_ADD + CMP_SWAP", keep);
    let t = Instant::now();
    let r = workload::atomics(&a, &b, o.atomics, 16)?;
    rows.push(Row {
        step: "atomics FETCH_ADD + CMP_SWAP".into(),
        result: format!("{:.0} ops/s", r.rate()),
        detail: format!("{} ops, every result checked", r.ops),
        secs: t.elapsed().as_secs_f64(),
    });
    say(&line(rows.last()));
    let mut lost = None;
    let loss_rules = match &pair {
        Some(Topology::Bridged(br)) if o.loss > 0 => {
            br.lose(0, o.loss)?;
            br.lose(1, o.loss)?;
            say(&format!(
                "integrity step under {}% loss each way (nftables on the bridge)",
                o.loss
            ));
            Some(br)
        }
        _ => None,
    };
    if o.loss > 0 {
        step(
            &format!(
                "integrity: mixed WRITE/READ/SEND/atomics under {}% loss each way",
                o.loss
            ),
            // Everything up to the capture's own limit: NAKs and go-back-N come often,
            // a retransmit timeout only a few times in a run.
            u64::MAX,
        );
    } else {
        step("integrity: mixed WRITE/READ/SEND/atomics", keep);
    }
    let t = Instant::now();
    let mut p = Progress::new("mixed, byte-checked", o.mixed_bytes, true);
    let m = workload::mixed(&a, &b, o.mixed_bytes, 1 << 20, 0xdec0de, &mut p)?;
    rows.push(Row {
        step: "integrity: mixed WRITE/READ/SEND/atomics".into(),
        result: "every byte correct".into(),
        detail: format!(
            "{:.1} MiB in {} WRs, {:.2} Gbit/s",
            m.report.bytes as f64 / (1u64 << 20) as f64,
            m.report.ops,
            m.report.gbps()
        ),
        secs: t.elapsed().as_secs_f64(),
    });
    say(&line(rows.last()));
    if let Some(br) = loss_rules {
        lost = Some((br.lost(0), br.lost(1)));
    }
    let pcap_skipped = da.capture_skipped();
    let link = da.info().link.clone();
    drop(a);
    drop(b);
    da.shutdown();
    db.shutdown();
    let stats = [da.stats(), db.stats()];
    drop(pair);
    Ok(Summary {
        rows,
        link,
        stats,
        pcap: o.pcap.clone(),
        lost,
        pcap_skipped,
    })
}

fn line(r: Option<&Row>) -> String {
    r.map(|r| format!("  done: {:<44} {}", r.step, r.result))
        .unwrap_or_default()
}

/// The results table.
pub fn table(s: &Summary) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "\n{:<44} {:>22}  {:>7}  {}\n",
        "step", "result", "time", "detail"
    ));
    t.push_str(&format!("{}\n", "-".repeat(110)));
    for r in &s.rows {
        t.push_str(&format!(
            "{:<44} {:>22}  {:>6.2}s  {}\n",
            r.step, r.result, r.secs, r.detail
        ));
    }
    let c = [&s.stats[0].counters, &s.stats[1].counters];
    t.push_str(&format!(
        "\nlink: {}\nframes sent A/B {}/{}, received {}/{}, retransmitted {}/{}, \
         NAKs sent {}/{}, drops {}/{}\n",
        s.link,
        c[0].sent_pkts,
        c[1].sent_pkts,
        c[0].rcvd_pkts,
        c[1].rcvd_pkts,
        c[0].retransmitted_pkts,
        c[1].retransmitted_pkts,
        c[0].nak_seq_sent + c[0].nak_inv_req_sent + c[0].nak_rem_access_sent,
        c[1].nak_seq_sent + c[1].nak_inv_req_sent + c[1].nak_rem_access_sent,
        c[0].drops(),
        c[1].drops(),
    ));
    if let Some((to_a, to_b)) = s.lost {
        t.push_str(&format!(
            "loss: nftables dropped {to_a} frames towards A and {to_b} towards B; \
             A received {} PSN sequence error NAKs and retransmitted {} packets in \
             {} go-back-N rounds after a NAK and {} after a retransmit timeout; B sent {} NAKs \
             and answered {} duplicates\n",
            c[0].rcvd_seq_err,
            c[0].retransmitted_pkts,
            c[0].rcvd_seq_err,
            c[0].timeouts,
            c[1].nak_seq_sent,
            c[1].duplicate_request,
        ));
    }
    if let Some(p) = &s.pcap {
        t.push_str(&format!(
            "capture: {} (pcapng: the first frames of each step of engine A, each step's first frame \
             commented, {} later frames left out; `roce-xdp decode {} --ladder | less`, \
             or `--html demo.html`)\n",
            p.display(),
            s.pcap_skipped,
            p.display()
        ));
    }
    t
}

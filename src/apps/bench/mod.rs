//! `roce-xdp bench`: benchmarks that set up their own namespaces and print figures
//! measured side by side in one run, interleaved, with their ratios (absolute figures
//! drift between runs and machines; ratios in one run are what count).
//!
//! `bench` alone ([`all`]): goodput, the UDP link, latency, qps and loss in one run,
//! then every headline ratio beside its target.
//!
//! `bench ceiling` ([`ceiling`]): raw AF_XDP frames one way against RC WRITE and READ
//! goodput in frames of the same size.
//!
//! `bench latency` ([`latency`]): 64 B round trips, the kernel's UDP sockets and a raw
//! AF_XDP echo beside RC SEND and RC WRITE ping-pong, default, busy-polling and on the
//! UDP link.
//!
//! `bench qps` ([`qps`]): 1000 RC QPs served round-robin against one, and what an idle
//! QP costs in memory.
//!
//! `bench flood`: a third host on the segment sends frames at engine B, half to QPs that
//! do not exist and half to B's real QP with a bad ICRC, while A writes to B. What it
//! shows: how much of the clean goodput B keeps under the flood, that every flood frame
//! is dropped under its reason, that the transfer stays byte-exact, and that B's memory
//! does not grow.

pub mod all;
pub mod ceiling;
pub mod goodput;
pub mod latency;
pub mod loss;
pub mod qps;
pub mod udp;

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts};
use super::progress::Progress;
use super::workload::{self, Stream};
use crate::link::FrameLink;
use crate::link::xdp::{XdpConfig, XdpLink};
use crate::runtime::{Device, RuntimeConfig};
use crate::verbs::QpType;
use crate::wire::{
    BthRepr, EthRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr, Opcode, Psn, ROCE_V2_PORT, RethRepr,
    RoceRepr, UdpRepr,
};
use crossbeam::channel as mpsc;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// What `bench flood` does.
#[derive(Debug, Clone)]
pub struct FloodOpts {
    /// Flood frames per repetition.
    pub frames: u64,
    /// Repetitions, each a flooded run and a clean run of the same length.
    pub reps: usize,
    /// WRITE message size.
    pub size: usize,
}

impl Default for FloodOpts {
    fn default() -> Self {
        FloodOpts {
            frames: 1_000_000,
            reps: 3,
            size: 65536,
        }
    }
}

/// One repetition.
#[derive(Debug, Clone, Copy)]
pub struct FloodRep {
    /// Goodput of A's WRITEs while the flood ran.
    pub flooded_gbps: f64,
    /// Goodput of the same stream, as long, without the flood.
    pub clean_gbps: f64,
    /// Flood frames sent, and how long sending them took.
    pub sent: u64,
    pub secs: f64,
}

impl FloodRep {
    pub fn ratio(&self) -> f64 {
        self.flooded_gbps / self.clean_gbps.max(1e-9)
    }
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct FloodReport {
    pub opts: FloodOpts,
    pub reps: Vec<FloodRep>,
    /// B's drops over the whole run, by reason.
    pub dropped_unknown_qp: u64,
    pub dropped_bad_icrc: u64,
    /// Flood frames the kernel dropped before B's engine saw them (no room).
    pub rx_no_room: u64,
    /// Frames the flooder sent in all.
    pub sent: u64,
    /// Bytes A wrote, every one compared at the destination.
    pub bytes_checked: u64,
    /// This process's resident memory after the warm-up and at the end, KiB.
    pub rss_kib: (u64, u64),
    pub link: String,
}

/// Whether benches pin their two sides to different cores (`--no-pin` turns it off, to
/// compare). Process-wide: every part of one `bench` run measures the same way.
static PIN_SIDES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Sets whether the two sides of each measurement are pinned (the default) or left to
/// the scheduler.
pub fn set_pinning(on: bool) {
    PIN_SIDES.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The cores the two sides of a measurement run on: A's (the sender, or the requester)
/// on the first CPU of this process's affinity mask, B's on the second, so neither
/// steals the other's core and neither migrates mid-measurement. `None` when pinning
/// is off or there are fewer than two CPUs.
pub fn side_cpus() -> Option<[usize; 2]> {
    if !PIN_SIDES.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    match crate::host::allowed_cpus()[..] {
        [a, b, ..] => Some([a, b]),
        _ => None,
    }
}

/// Pins the calling thread to side `k`'s core (0: A, 1: B), when sides are pinned. A
/// failure is only printed: the figure is still measured, unpinned.
pub(crate) fn pin_side(k: usize) {
    if let Some(cpus) = side_cpus()
        && let Err(e) = crate::host::pin_to_cpu(cpus[k % 2])
    {
        eprintln!("bench: {e}");
    }
}

/// Every probe of [`core_round_trip`] this process made, in order, in nanoseconds.
static CORE_PROBES: std::sync::Mutex<Vec<f64>> = std::sync::Mutex::new(Vec::new());

/// How long one probe runs: long enough for a few hundred slices, short beside any
/// figure it sits next to.
const PROBE_WINDOW: Duration = Duration::from_millis(30);

/// The round trip of one cache line between the two sides' cores, in nanoseconds (the
/// median of slices of 256 round trips over about 30 ms), recorded for
/// [`probes_so_far`]; `None` when the sides are not pinned.
///
/// Every figure that hands work from one core to the other (a doorbell, a completion,
/// a ring's slots) pays this. On the 2-vCPU AMD guest this project measures on it is
/// not fixed: the host moves the vCPUs, and it was 51-61 ns for a while, then 305-357
/// ns, switching within seconds (a probe of this kind, run for a minute). Printed beside
/// each repetition, it says which of the two a figure was measured in.
pub fn core_round_trip() -> Option<f64> {
    let [a, b] = side_cpus()?;
    let ns = line_round_trip(a, b, PROBE_WINDOW)?;
    CORE_PROBES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(ns);
    Some(ns)
}

/// Every probe so far, in order (for `--json`).
pub fn probes_so_far() -> Vec<f64> {
    CORE_PROBES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The probes around one repetition: [`CoreProbe::start`] before it, one of the `end`
/// methods after it.
pub(crate) struct CoreProbe(Option<f64>);

impl CoreProbe {
    pub(crate) fn start() -> CoreProbe {
        CoreProbe(core_round_trip())
    }

    /// Probes again; what the repetition's report says of the two probes (`None`
    /// when the sides are not pinned).
    pub(crate) fn end(self) -> Option<String> {
        probe_note(self.0, core_round_trip())
    }

    /// As [`CoreProbe::end`], as a clause to append to a repetition's line (empty
    /// when there is none).
    pub(crate) fn end_clause(self) -> String {
        self.end().map(|n| format!("; {n}")).unwrap_or_default()
    }
}

/// What a repetition's report says of the probes made before and after it.
fn probe_note(before: Option<f64>, after: Option<f64>) -> Option<String> {
    Some(format!(
        "a cache line between the cores {:.0} ns round trip before, {:.0} after",
        before?, after?
    ))
}

/// Bounces one cache line between a thread pinned to CPU `a` and one pinned to CPU
/// `b` for about `window`; the median round trip of slices of 256, in nanoseconds.
/// `None` when either thread cannot be pinned or no slice finished in time (the other
/// core did not run the answering thread).
pub(crate) fn line_round_trip(a: usize, b: usize, window: Duration) -> Option<f64> {
    use crossbeam::utils::CachePadded;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const SLICE: u32 = 256;
    let line = CachePadded::new(AtomicU64::new(0));
    let (stop, pinned_b) = (AtomicBool::new(false), AtomicBool::new(false));
    let deadline = Instant::now() + window;
    std::thread::scope(|s| {
        s.spawn(|| {
            pinned_b.store(crate::host::pin_to_cpu(b).is_ok(), Ordering::SeqCst);
            let mut want = 1;
            while !stop.load(Ordering::Relaxed) {
                if line.load(Ordering::Acquire) == want {
                    line.store(want + 1, Ordering::Release);
                    want += 2;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let slices = s
            .spawn(|| {
                let mut slices = Vec::new();
                if crate::host::pin_to_cpu(a).is_ok() {
                    let mut v = 0;
                    'run: while Instant::now() < deadline {
                        let t0 = Instant::now();
                        for _ in 0..SLICE {
                            line.store(v + 1, Ordering::Release);
                            let mut spins = 0u32;
                            while line.load(Ordering::Acquire) != v + 2 {
                                spins = spins.wrapping_add(1);
                                if spins.is_multiple_of(4096) && Instant::now() >= deadline {
                                    break 'run;
                                }
                                std::hint::spin_loop();
                            }
                            v += 2;
                        }
                        slices.push(t0.elapsed().as_nanos() as f64 / f64::from(SLICE));
                    }
                }
                slices
            })
            .join()
            .unwrap_or_default();
        // Ends the answering thread, also when the timing one panicked.
        stop.store(true, Ordering::Relaxed);
        (!slices.is_empty()).then(|| median(slices))
    })
    .filter(|_| pinned_b.load(Ordering::SeqCst))
}

/// How the sides ran, and the ICRC kernel this process timed and took (see
/// [`crate::wire::icrc::kernel`]), for the reports.
pub fn pinning_line() -> String {
    let pins = match side_cpus() {
        Some([a, b]) => format!(
            "sides pinned: A's engine or sending thread on CPU {a}, B's on CPU {b} (the \
             application's thread is not pinned)"
        ),
        None if PIN_SIDES.load(std::sync::atomic::Ordering::Relaxed) => {
            "sides not pinned: this process may run on one CPU only".to_string()
        }
        None => "sides not pinned (--no-pin)".to_string(),
    };
    let probes = probes_so_far();
    let cores = match (
        probes.iter().copied().reduce(f64::min),
        probes.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => format!(
            "; a cache line's round trip between those cores {lo:.0}-{hi:.0} ns over {} \
             probes (the host places this VM's CPUs)",
            probes.len()
        ),
        _ => String::new(),
    };
    format!(
        "{pins}; ICRC on {}{cores}",
        crate::wire::icrc::kernel().name()
    )
}

/// What every `bench` report gives the command: the table it prints, and `--json`.
pub trait BenchReport {
    fn table(&self) -> String;
    fn to_json(&self) -> serde_json::Value;
}

/// The link the engines of a bench run on (`--link xdp|udp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BenchLink {
    /// AF_XDP on the namespace's interface (the default).
    #[default]
    Xdp,
    /// The kernel's UDP socket on port 4791 (unprivileged, no XDP program).
    Udp,
}

impl BenchLink {
    /// As the options spell it.
    pub fn name(self) -> &'static str {
        match self {
            BenchLink::Xdp => "xdp",
            BenchLink::Udp => "udp",
        }
    }
}

/// Two engines over AF_XDP, one in each namespace of `pair`, with an RC QP each (`mem`
/// bytes registered) connected at IB MTU `mtu` (`None`: the port's); `busy` makes the
/// engines busy-poll.
pub(crate) fn rc_pair(
    pair: &crate::netns::Pair,
    mtu: Option<crate::verbs::Mtu>,
    mem: usize,
    busy: bool,
) -> Result<(Endpoint, Endpoint), String> {
    rc_pair_on(pair, BenchLink::Xdp, mtu, mem, busy)
}

/// As [`rc_pair`], the engines on `link`.
pub(crate) fn rc_pair_on(
    pair: &crate::netns::Pair,
    link: BenchLink,
    mtu: Option<crate::verbs::Mtu>,
    mem: usize,
    busy: bool,
) -> Result<(Endpoint, Endpoint), String> {
    rc_connect(
        [(&pair.a.name, pair.ip_a), (&pair.b.name, pair.ip_b)],
        &pair.ifname,
        link,
        mtu,
        mem,
        busy,
    )
}

/// The READs and atomics one side of a bench pair keeps outstanding: the smallest of the
/// two devices' `max_qp_rd_atom` (what a responder takes) and `max_qp_init_rd_atom`
/// (what a requester may issue), at least 1.
pub(crate) fn out_reads(a: &Endpoint, b: &Endpoint) -> u8 {
    let l = |e: &Endpoint| {
        let d = &e.dev.info().limits;
        d.max_qp_rd_atom.min(d.max_qp_init_rd_atom)
    };
    l(a).min(l(b)).max(1)
}

/// As [`rc_pair_on`], for the engines in namespaces `ends` (name, address), each on its
/// interface `ifname` (AF_XDP) or its address (UDP).
pub(crate) fn rc_connect(
    ends: [(&str, Ipv4Addr); 2],
    ifname: &str,
    link: BenchLink,
    mtu: Option<crate::verbs::Mtu>,
    mem: usize,
    busy: bool,
) -> Result<(Endpoint, Endpoint), String> {
    let open = |(ns, ip): (&str, Ipv4Addr), side: usize| {
        let mut c = match link {
            BenchLink::Xdp => RuntimeConfig::xdp(ifname),
            BenchLink::Udp => {
                let mut c = RuntimeConfig::udp(IpAddr::V4(ip));
                // The UDP link's port MTU is what the bench connects at.
                c.port_mtu = mtu;
                c
            }
        };
        c.netns = Some(ns.to_string());
        c.busy_poll = busy;
        c.cpus = side_cpus().map(|s| vec![s[side]]).unwrap_or_default();
        let d = Device::open(c).map_err(|e| format!("engine in {ns}: {e}"))?;
        Endpoint::new(d, &EndpointOpts::new(QpType::Rc, mem)).map_err(|e| e.to_string())
    };
    let (a, b) = (open(ends[0], 0)?, open(ends[1], 1)?);
    let mtu = mtu.unwrap_or(a.dev.info().port_mtu);
    let (ip_a, ip_b) = (IpAddr::V4(ends[0].1), IpAddr::V4(ends[1].1));
    let (psn_a, psn_b) = (0x100, 0x200);
    // READs (and atomics) outstanding: the devices' limit, as perftest's default `-o`
    // is (`ctx_set_out_reads`). The endpoints' default of 16 bounded a READ stream of
    // small messages by 16 per round trip, not by the engine.
    let rd = out_reads(&a, &b);
    let opts = |psn| ConnectOpts {
        max_rd_atomic: rd,
        max_dest_rd_atomic: rd,
        ..ConnectOpts::new(mtu, psn)
    };
    a.connect(&b.local(psn_b, ip_a), &opts(psn_a))
        .map_err(|e| e.to_string())?;
    b.connect(&a.local(psn_a, ip_b), &opts(psn_b))
        .map_err(|e| e.to_string())?;
    Ok((a, b))
}

/// A stream of `op` in messages of `size`, `depth` in flight, for `span` (the clock is
/// read every 16 messages: reading it costs a small message's poster as much as posting).
pub(crate) fn stream_for(
    a: &Endpoint,
    b: &Endpoint,
    op: Stream,
    size: usize,
    depth: usize,
    span: Duration,
) -> Result<workload::Report, String> {
    let t = Instant::now();
    workload::stream_while(a, b, op, size, depth, &mut Progress::hidden(), |n| {
        n % 16 != 0 || t.elapsed() < span
    })
}

/// A receiver's count: calls `recv` (how many arrived now) until `count` came, or
/// 300 ms passed without one once they came, or 30 s; returns how many came and the
/// time from the first to the last.
pub(crate) fn count_arrivals(
    count: u64,
    mut recv: impl FnMut() -> Result<u64, String>,
) -> Result<(u64, Duration), String> {
    let (mut got, mut first, mut last) = (0u64, None::<Instant>, Instant::now());
    let start = Instant::now();
    while got < count && start.elapsed() < Duration::from_secs(30) {
        let n = recv()?;
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            got += n;
        } else if first.is_some() && last.elapsed() > Duration::from_millis(300) {
            break;
        } else {
            std::thread::yield_now();
        }
    }
    Ok((got, first.map_or(Duration::ZERO, |f| last - f)))
}

/// Arrivals per second from [`count_arrivals`]' figures (the first opens the span).
pub(crate) fn arrival_rate(
    got: u64,
    span: Duration,
    count: u64,
    what: &str,
) -> Result<f64, String> {
    if got < 2 {
        return Err(format!("the receiver took {got} of {count} {what}"));
    }
    Ok((got - 1) as f64 / span.as_secs_f64().max(1e-9))
}

/// Sends `count` frames from `link` as fast as its rings take them, cycling through
/// `frames`, then lets the last ones leave; at most 60 s. Returns how many were sent.
pub(crate) fn send_frames(link: &mut XdpLink, count: u64, frames: &[Vec<u8>]) -> u64 {
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < count && start.elapsed() < Duration::from_secs(60) && !frames.is_empty() {
        let n = link.send(&mut |mut buf| {
            if sent >= count {
                return None;
            }
            let f = &frames[(sent % frames.len() as u64) as usize];
            if !buf.write(f) {
                return None;
            }
            sent += 1;
            Some(f.len())
        });
        link.flush();
        if n == 0 {
            std::thread::yield_now();
        }
    }
    drain_tx(link);
    sent
}

/// Queues up to `left` copies of `frame` on `link` as its ring takes them and kicks the
/// kernel; counts them off `left` and returns how many went.
pub(crate) fn send_copies(link: &mut XdpLink, frame: &[u8], left: &mut u64) -> u64 {
    let before = *left;
    link.send(&mut |mut buf| {
        if *left == 0 || !buf.write(frame) {
            return None;
        }
        *left -= 1;
        Some(frame.len())
    });
    link.flush();
    before - *left
}

/// Lets the frames still in `link`'s transmit ring leave (copy mode sends a budget of
/// descriptors per kick), at most 1000 kicks.
pub(crate) fn drain_tx(link: &mut XdpLink) {
    for _ in 0..1000 {
        link.flush();
        if !link.tx_pending() {
            break;
        }
    }
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

impl FloodReport {
    pub fn median_ratio(&self) -> f64 {
        median(self.reps.iter().map(FloodRep::ratio).collect())
    }
}

impl BenchReport for FloodReport {
    /// The table `bench flood` prints.
    fn table(&self) -> String {
        let mut s = format!(
            "roce-xdp bench flood: {} frames per repetition at engine B from a third host \
             (half to QPs that do not exist, half to B's QP with a bad ICRC)\n\
             while A writes {} KiB messages to B; {}\n\n",
            self.opts.frames,
            self.opts.size >> 10,
            self.link
        );
        s.push_str("rep  flooded Gbit/s  clean Gbit/s  ratio  flood Mpps\n");
        for (i, r) in self.reps.iter().enumerate() {
            s.push_str(&format!(
                "{:<4} {:>14.2}  {:>12.2}  {:>5.2}  {:>10.2}\n",
                i + 1,
                r.flooded_gbps,
                r.clean_gbps,
                r.ratio(),
                r.sent as f64 / r.secs.max(1e-9) / 1e6
            ));
        }
        let ratios: Vec<f64> = self.reps.iter().map(FloodRep::ratio).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), &r| (l.min(r), h.max(r)));
        s.push_str(&format!(
            "\nflooded goodput / clean goodput: median {:.2} (from {:.2} to {:.2})\n",
            self.median_ratio(),
            lo,
            hi
        ));
        s.push_str(&format!(
            "B dropped {} frames to unknown QPs and {} with a bad ICRC; the kernel dropped {} \
             for want of room (of {} sent)\n",
            self.dropped_unknown_qp, self.dropped_bad_icrc, self.rx_no_room, self.sent
        ));
        s.push_str(&format!(
            "{:.1} MiB written, every byte compared; resident memory {:.1} MiB after the \
             warm-up, {:.1} MiB at the end\n",
            self.bytes_checked as f64 / 1048576.0,
            self.rss_kib.0 as f64 / 1024.0,
            self.rss_kib.1 as f64 / 1024.0
        ));
        s
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bench": "flood",
            "frames_per_rep": self.opts.frames,
            "message_size": self.opts.size,
            "link": self.link,
            "reps": self.reps.iter().map(|r| serde_json::json!({
                "flooded_gbps": r.flooded_gbps,
                "clean_gbps": r.clean_gbps,
                "ratio": r.ratio(),
                "flood_frames": r.sent,
                "flood_secs": r.secs,
            })).collect::<Vec<_>>(),
            "median_ratio": self.median_ratio(),
            "dropped_unknown_qp": self.dropped_unknown_qp,
            "dropped_bad_icrc": self.dropped_bad_icrc,
            "rx_no_room": self.rx_no_room,
            "flood_frames": self.sent,
            "bytes_checked": self.bytes_checked,
            "rss_kib_after_warmup": self.rss_kib.0,
            "rss_kib_end": self.rss_kib.1,
        })
    }
}

/// This process's resident set, KiB (0 if /proc cannot say).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The flood's frames: `n` templates that cycle. Even ones go to a QP number B does
/// not have; odd ones are WRITEs to B's QP `qpn` whose ICRC is wrong.
fn flood_frames(
    from: ([u8; 6], Ipv4Addr),
    to: ([u8; 6], Ipv4Addr),
    qpn: u32,
    n: usize,
) -> Vec<Vec<u8>> {
    let mut rng = crate::rng::Rng::new(0xf100d);
    (0..n)
        .map(|i| {
            let dest = if i % 2 == 0 {
                0x80_0000 | (rng.next_u32() & 0x7f_ffff)
            } else {
                qpn
            };
            let payload = [i as u8; 64];
            let repr = FrameRepr {
                eth: EthRepr {
                    dst: to.0,
                    src: from.0,
                    vlan: None,
                    ethertype: 0x0800,
                },
                ip: IpRepr::V4(Ipv4Repr::new(from.1, to.1, i as u16)),
                udp: UdpRepr {
                    src_port: 49152 + (i as u16 & 0x3fff),
                    dst_port: ROCE_V2_PORT,
                },
                roce: RoceRepr {
                    bth: BthRepr::new(
                        Opcode::RC_RDMA_WRITE_ONLY,
                        dest,
                        Psn::new(rng.next_u32() & 0xff_ffff),
                    ),
                    ext: ExtRepr {
                        reth: Some(RethRepr {
                            va: u64::from(rng.next_u32()) << 12,
                            rkey: rng.next_u32(),
                            dma_len: 64,
                        }),
                        ..ExtRepr::default()
                    },
                    payload: &payload,
                },
            };
            let mut f = vec![0u8; 256];
            let len = repr.emit(&mut f).unwrap_or(0);
            f.truncate(len);
            if i % 2 == 1 && len > 0 {
                f[len - 1] ^= 0x5a;
            }
            f
        })
        .collect()
}

/// The flooder: a thread in namespace `ns` with its own AF_XDP link (the project's
/// ring code, no engine) that sends `frames` cycled, `count` at a time, on request.
struct Flooder {
    go: mpsc::Sender<u64>,
    done: mpsc::Receiver<Result<(u64, Duration), String>>,
}

impl Flooder {
    fn start(
        ns: String,
        ifname: String,
        ip: Ipv4Addr,
        frames_for: FloodTarget,
    ) -> Result<Flooder, String> {
        let (go_tx, go_rx) = mpsc::unbounded::<u64>();
        let (done_tx, done_rx) = mpsc::unbounded();
        let (ready_tx, ready_rx) = mpsc::bounded(1);
        std::thread::Builder::new()
            .name("flooder".into())
            .spawn(move || {
                let setup = (|| {
                    crate::host::enter_netns(&ns).map_err(|e| e.to_string())?;
                    let mac = crate::host::Interface::find(&ifname)
                        .and_then(|i| i.mac())
                        .map_err(|e| e.to_string())?;
                    let link = XdpLink::open(&ifname, &[IpAddr::V4(ip)], &XdpConfig::default())?;
                    Ok::<_, String>((link, mac))
                })();
                let (mut link, mac) = match setup {
                    Ok(x) => {
                        let _ = ready_tx.send(Ok(()));
                        x
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let frames = flood_frames((mac, ip), frames_for.to, frames_for.qpn, 128);
                while let Ok(count) = go_rx.recv() {
                    let start = Instant::now();
                    let sent = send_frames(&mut link, count, &frames);
                    let _ = done_tx.send(Ok((sent, start.elapsed())));
                }
            })
            .map_err(|e| format!("starting the flooder: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "the flooder thread ended".to_string())??;
        Ok(Flooder {
            go: go_tx,
            done: done_rx,
        })
    }
}

/// Where the flood goes: B's MAC and address, and B's real QP.
#[derive(Clone, Copy)]
struct FloodTarget {
    to: ([u8; 6], Ipv4Addr),
    qpn: u32,
}

/// Runs `bench flood` (root: it creates three namespaces behind a bridge).
pub fn flood(o: &FloodOpts, say: &mut dyn FnMut(&str)) -> Result<FloodReport, String> {
    if o.frames == 0 || o.reps == 0 {
        return Err("--frames and --reps must be at least 1".into());
    }
    if !(4096..=1 << 20).contains(&o.size) {
        return Err(format!("--size {}: 4096 to 1048576 bytes", o.size));
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let br = crate::netns::Bridged::new("roce-bench", 20, 3, 1500)?;
    say(&format!(
        "A {} ({}), B {} ({}), flooder {} ({}) behind a bridge in {}",
        br.ends[0].name,
        br.ips[0],
        br.ends[1].name,
        br.ips[1],
        br.ends[2].name,
        br.ips[2],
        br.mid.name
    ));
    let open = |i: usize| {
        let mut c = RuntimeConfig::xdp(&br.ifname);
        c.netns = Some(br.ends[i].name.clone());
        c.cpus = side_cpus().map(|s| vec![s[i]]).unwrap_or_default();
        Device::open(c).map_err(|e| format!("engine {}: {e}", ["A", "B"][i]))
    };
    let (da, db) = (open(0)?, open(1)?);
    let mtu = da.info().port_mtu;
    let mem = 4 * o.size + 8192;
    let a = Endpoint::new(da.clone(), &EndpointOpts::new(QpType::Rc, mem))
        .map_err(|e| e.to_string())?;
    let b = Endpoint::new(db.clone(), &EndpointOpts::new(QpType::Rc, mem))
        .map_err(|e| e.to_string())?;
    let (ip_a, ip_b) = (IpAddr::V4(br.ips[0]), IpAddr::V4(br.ips[1]));
    let (psn_a, psn_b) = (0x10, 0x20);
    a.connect(&b.local(psn_b, ip_a), &ConnectOpts::new(mtu, psn_a))
        .map_err(|e| e.to_string())?;
    b.connect(&a.local(psn_a, ip_b), &ConnectOpts::new(mtu, psn_b))
        .map_err(|e| e.to_string())?;
    let target = FloodTarget {
        to: (db.info().mac, br.ips[1]),
        qpn: b.qp.qpn,
    };
    let flooder = Flooder::start(
        br.ends[2].name.clone(),
        br.ifname.clone(),
        br.ips[2],
        target,
    )?;
    let link = da.info().link.clone();
    let depth = 16;
    let run = |more: &mut dyn FnMut(u64) -> bool| {
        workload::stream_while(
            &a,
            &b,
            Stream::Write,
            o.size,
            depth,
            &mut Progress::hidden(),
            more,
        )
    };
    // Warm-up: a short flood and a short stream, so that what was allocated once is
    // not taken for growth.
    let _ = flooder.go.send(o.frames.min(10_000));
    let _ = flooder.done.recv();
    let t = Instant::now();
    run(&mut |_| t.elapsed() < Duration::from_millis(200))?;
    let rss0 = rss_kib();
    let before = db.counters().map_err(|e| e.to_string())?;
    let stats0 = db.stats();
    let mut reps = Vec::new();
    let (mut sent_all, mut bytes) = (0u64, 0u64);
    for rep in 0..o.reps {
        flooder
            .go
            .send(o.frames)
            .map_err(|_| "the flooder thread ended".to_string())?;
        let mut result = None;
        let flooded = run(&mut |_| {
            if result.is_none() {
                result = flooder.done.try_recv().ok();
            }
            result.is_none()
        })?;
        let (sent, secs) = match result {
            Some(r) => r?,
            None => flooder
                .done
                .recv()
                .map_err(|_| "the flooder thread ended".to_string())??,
        };
        let span = flooded.elapsed;
        let t = Instant::now();
        let clean = run(&mut |_| t.elapsed() < span)?;
        sent_all += sent;
        bytes += flooded.bytes + clean.bytes;
        let r = FloodRep {
            flooded_gbps: flooded.gbps(),
            clean_gbps: clean.gbps(),
            sent,
            secs: secs.as_secs_f64(),
        };
        say(&format!(
            "rep {}: flooded {:.2} Gbit/s, clean {:.2} Gbit/s, ratio {:.2}, {} flood frames in {:.2} s",
            rep + 1,
            r.flooded_gbps,
            r.clean_gbps,
            r.ratio(),
            sent,
            r.secs
        ));
        reps.push(r);
    }
    // Let the last flood frames reach B's counters.
    std::thread::sleep(Duration::from_millis(300));
    let after = db.counters().map_err(|e| e.to_string())?;
    let stats1 = db.stats();
    Ok(FloodReport {
        opts: o.clone(),
        reps,
        dropped_unknown_qp: after.drop_unknown_qp - before.drop_unknown_qp,
        dropped_bad_icrc: after.drop_bad_icrc - before.drop_bad_icrc,
        rx_no_room: stats1.rx_no_room - stats0.rx_no_room,
        sent: sent_all,
        bytes_checked: bytes,
        rss_kib: (rss0, rss_kib()),
        link,
    })
}

#[cfg(test)]
mod tests {
    use super::{line_round_trip, probe_note};
    use std::time::Duration;

    /// The probe bounces a line between two cores and times it; a side that cannot be
    /// pinned (a CPU that does not exist) gives no figure rather than a wrong one.
    #[test]
    fn a_line_bounced_between_two_cores_has_a_round_trip() {
        let cpus = crate::host::allowed_cpus();
        let [a, b, ..] = cpus[..] else {
            println!("SKIPPED: fewer than two CPUs to bounce a line between");
            return;
        };
        // Longer than bench's window: other tests may hold the cores meanwhile.
        let ns = line_round_trip(a, b, Duration::from_millis(300)).expect("a round trip");
        // Well above a load's cost, well below a scheduler tick.
        assert!((5.0..1_000_000.0).contains(&ns), "{ns} ns");
        assert!(line_round_trip(a, 1 << 20, Duration::from_millis(5)).is_none());
    }

    #[test]
    fn a_repetition_names_the_probes_around_it() {
        assert_eq!(
            probe_note(Some(54.4), Some(318.0)).as_deref(),
            Some("a cache line between the cores 54 ns round trip before, 318 after")
        );
        assert_eq!(probe_note(None, Some(318.0)), None);
    }
}

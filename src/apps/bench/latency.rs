//! `bench latency`: round trips of small messages between two network namespaces on a
//! veth pair, measured side by side in one run, interleaved: the kernel's UDP sockets
//! (the ceiling a userspace NIC should beat), a raw AF_XDP echo (one frame of the same
//! size each way through the project's own ring code, no RoCE work: the round trip's
//! own ceiling, sleeping in poll(2) between frames and spinning), roce-xdp's RC SEND
//! ping-pong (each side waits for its completions, as `ibv_rc_pingpong` does), and the
//! same with the engines busy-polling (`--busy-poll`), and RC SEND over the UDP link
//! (the engines on kernel UDP sockets instead of AF_XDP). Medians and 99th percentiles
//! per repetition, and the ratios to the kernel's and to the raw echo's.

use super::super::endpoint::Endpoint;
use super::super::workload::Report;
use super::{BenchLink, median};
use crate::link::FrameLink;
use crate::link::xdp::{XdpConfig, XdpLink};
use crate::netns::Pair;
use crate::verbs::{Mtu, RecvWr, SendFlags, SendWr};
use crossbeam::channel as mpsc;
use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

/// What `bench latency` does.
#[derive(Debug, Clone)]
pub struct LatencyOpts {
    /// Round trips per measurement.
    pub iters: usize,
    /// Repetitions, each measuring the three in turn.
    pub reps: usize,
    /// Message size in bytes.
    pub size: usize,
}

impl LatencyOpts {
    /// For CI: 2000 round trips, one repetition.
    pub fn quick(mut self) -> Self {
        self.iters = self.iters.min(2000);
        self.reps = 1;
        self
    }
}

impl Default for LatencyOpts {
    fn default() -> Self {
        LatencyOpts {
            iters: 20_000,
            reps: 3,
            size: 64,
        }
    }
}

/// One measurement's round trips, microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rtt {
    pub median_us: f64,
    pub p99_us: f64,
}

impl Rtt {
    /// The median and the 99th percentile, taken as the workloads take theirs.
    fn of(v: Vec<Duration>) -> Rtt {
        let mut r = Report {
            rtt_ns: v.iter().map(|d| d.as_nanos() as u64).collect(),
            ..Report::default()
        };
        r.rtt_ns.sort_unstable();
        Rtt {
            median_us: r.rtt_us(0.5),
            p99_us: r.rtt_us(0.99),
        }
    }
}

/// One repetition: the six, measured one after the other.
#[derive(Debug, Clone, Copy)]
pub struct LatencyRep {
    pub udp: Rtt,
    /// The raw AF_XDP echo, each side sleeping in poll(2) until its frame is there.
    pub raw: Rtt,
    /// The raw AF_XDP echo, each side spinning on its RX ring.
    pub raw_busy: Rtt,
    pub rc: Rtt,
    pub rc_busy: Rtt,
    /// RC SEND with the engines on the UDP link.
    pub rc_udp_link: Rtt,
}

/// Which of a repetition's RC figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcKind {
    Default,
    BusyPoll,
    UdpLink,
}

impl LatencyRep {
    pub fn rc(&self, k: RcKind) -> Rtt {
        match k {
            RcKind::Default => self.rc,
            RcKind::BusyPoll => self.rc_busy,
            RcKind::UdpLink => self.rc_udp_link,
        }
    }
}

/// What `bench latency` prints.
#[derive(Debug, Clone)]
pub struct LatencyReport {
    pub opts: LatencyOpts,
    pub reps: Vec<LatencyRep>,
    /// The link, as the engine describes it.
    pub link: String,
}

impl LatencyReport {
    /// Median over the repetitions of (RC median / kernel UDP median) for `k`.
    pub fn ratio(&self, k: RcKind) -> f64 {
        median(
            self.reps
                .iter()
                .map(|r| r.rc(k).median_us / r.udp.median_us.max(1e-9))
                .collect(),
        )
    }

    /// Median over the repetitions of (RC median / raw AF_XDP echo median): RC SEND
    /// against the sleeping echo, or busy-polling against the spinning one (`busy`).
    pub fn raw_ratio(&self, busy: bool) -> f64 {
        median(
            self.reps
                .iter()
                .map(|r| {
                    let (rc, raw) = if busy {
                        (r.rc_busy, r.raw_busy)
                    } else {
                        (r.rc, r.raw)
                    };
                    rc.median_us / raw.median_us.max(1e-9)
                })
                .collect(),
        )
    }
}

impl super::BenchReport for LatencyReport {
    fn table(&self) -> String {
        let mut s = format!(
            "roce-xdp bench latency: {} B round trips between two namespaces on veth, {} per \
             measurement; {}\n\n",
            self.opts.size, self.opts.iters, self.link
        );
        s.push_str("us, median and p99 of each repetition\n");
        s.push_str(
            "rep  kernel UDP         raw AF_XDP echo    raw echo spinning  RC SEND            \
             RC SEND busy-poll  RC SEND, UDP link\n",
        );
        for (i, r) in self.reps.iter().enumerate() {
            s.push_str(&format!("{:<4}", i + 1));
            for t in [r.udp, r.raw, r.raw_busy, r.rc, r.rc_busy, r.rc_udp_link] {
                s.push_str(&format!(" {:>8.1} {:>8.1} ", t.median_us, t.p99_us));
            }
            s.push('\n');
        }
        s.push_str(&format!(
            "\nRC SEND round trip / kernel UDP round trip (medians): {:.2}; busy-polling: {:.2}; \
             on the UDP link: {:.2}\n",
            self.ratio(RcKind::Default),
            self.ratio(RcKind::BusyPoll),
            self.ratio(RcKind::UdpLink)
        ));
        s.push_str(&format!(
            "RC SEND round trip / raw AF_XDP echo (medians): {:.2}; busy-polling / the \
             spinning echo: {:.2}\n",
            self.raw_ratio(false),
            self.raw_ratio(true)
        ));
        s
    }

    fn to_json(&self) -> serde_json::Value {
        let rtt = |r: &Rtt| serde_json::json!({"median_us": r.median_us, "p99_us": r.p99_us});
        serde_json::json!({
            "bench": "latency",
            "message_size": self.opts.size,
            "iters": self.opts.iters,
            "link": self.link,
            "reps": self.reps.iter().map(|r| serde_json::json!({
                "kernel_udp": rtt(&r.udp),
                "raw_xdp_echo": rtt(&r.raw),
                "raw_xdp_echo_spinning": rtt(&r.raw_busy),
                "rc_send": rtt(&r.rc),
                "rc_send_busy_poll": rtt(&r.rc_busy),
                "rc_send_udp_link": rtt(&r.rc_udp_link),
            })).collect::<Vec<_>>(),
            "rc_to_udp": self.ratio(RcKind::Default),
            "rc_busy_poll_to_udp": self.ratio(RcKind::BusyPoll),
            "rc_udp_link_to_udp": self.ratio(RcKind::UdpLink),
            "rc_to_raw_echo": self.raw_ratio(false),
            "rc_busy_poll_to_raw_echo_spinning": self.raw_ratio(true),
        })
    }
}

/// Runs `bench latency` (root: it creates two namespaces).
pub fn latency(o: &LatencyOpts, say: &mut dyn FnMut(&str)) -> Result<LatencyReport, String> {
    if o.iters == 0 || o.reps == 0 {
        return Err("--iters and --reps must be at least 1".into());
    }
    if !(1..=4096).contains(&o.size) {
        return Err(format!("--size {}: 1 to 4096 bytes", o.size));
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let pair = Pair::new("roce-lat", 21, 1500)?;
    say(&format!(
        "A {} ({}), B {} ({}) on {}",
        pair.a.name, pair.ip_a, pair.b.name, pair.ip_b, pair.ifname
    ));
    // Warm-up: neighbours resolved, code paged in.
    udp_pingpong(&pair, o.size, o.iters.min(200))?;
    raw_pingpong(&pair, o.size, o.iters.min(200), false)?;
    let mut link = String::new();
    rc_pingpong(
        &pair,
        BenchLink::Xdp,
        false,
        o.size,
        o.iters.min(200),
        &mut link,
    )?;
    rc_pingpong(&pair, BenchLink::Udp, false, o.size, 50, &mut String::new())?;
    let mut reps = Vec::new();
    for rep in 0..o.reps {
        let udp = Rtt::of(udp_pingpong(&pair, o.size, o.iters)?);
        let raw = Rtt::of(raw_pingpong(&pair, o.size, o.iters, false)?);
        let raw_busy = Rtt::of(raw_pingpong(&pair, o.size, o.iters, true)?);
        let rc_on = |link, busy, desc: &mut String| {
            rc_pingpong(&pair, link, busy, o.size, o.iters, desc).map(Rtt::of)
        };
        let rc = rc_on(BenchLink::Xdp, false, &mut link)?;
        let rc_busy = rc_on(BenchLink::Xdp, true, &mut String::new())?;
        let rc_udp_link = rc_on(BenchLink::Udp, false, &mut String::new())?;
        say(&format!(
            "rep {}: kernel UDP {:.1} us, raw AF_XDP echo {:.1} us (spinning {:.1}), \
             RC SEND {:.1} us, busy-polling {:.1} us, on the UDP link {:.1} us (medians)",
            rep + 1,
            udp.median_us,
            raw.median_us,
            raw_busy.median_us,
            rc.median_us,
            rc_busy.median_us,
            rc_udp_link.median_us
        ));
        reps.push(LatencyRep {
            udp,
            raw,
            raw_busy,
            rc,
            rc_busy,
            rc_udp_link,
        });
    }
    Ok(LatencyReport {
        opts: o.clone(),
        reps,
        link,
    })
}

/// The longest a single round trip may take before the measurement fails.
const STALL: Duration = Duration::from_secs(2);

/// `iters` round trips of `size` bytes between UDP sockets, A's in the first namespace,
/// an echo in the second.
fn udp_pingpong(pair: &Pair, size: usize, iters: usize) -> Result<Vec<Duration>, String> {
    let (ready_tx, ready_rx) = mpsc::bounded(1);
    let (ns_b, ip_b) = (pair.b.name.clone(), IpAddr::V4(pair.ip_b));
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let s = (|| {
            super::pin_side(1);
            crate::host::enter_netns(&ns_b).map_err(|e| e.to_string())?;
            let s = UdpSocket::bind((ip_b, 0)).map_err(|e| format!("UDP echo: {e}"))?;
            s.set_read_timeout(Some(STALL)).map_err(|e| e.to_string())?;
            Ok::<_, String>(s)
        })();
        let s = match s {
            Ok(s) => {
                let _ = ready_tx.send(s.local_addr().map(|a| a.port()).map_err(|e| e.to_string()));
                s
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return Ok(());
            }
        };
        let mut buf = vec![0u8; 65536];
        for _ in 0..iters {
            let (n, from) = s
                .recv_from(&mut buf)
                .map_err(|e| format!("UDP echo: {e}"))?;
            s.send_to(&buf[..n], from)
                .map_err(|e| format!("UDP echo: {e}"))?;
        }
        Ok(())
    });
    let port = ready_rx
        .recv()
        .map_err(|_| "the UDP echo thread ended".to_string())??;
    let (ns_a, ip_a) = (pair.a.name.clone(), IpAddr::V4(pair.ip_a));
    let client = std::thread::spawn(move || -> Result<Vec<Duration>, String> {
        super::pin_side(0);
        crate::host::enter_netns(&ns_a).map_err(|e| e.to_string())?;
        let s = UdpSocket::bind((ip_a, 0)).map_err(|e| format!("UDP client: {e}"))?;
        s.connect((ip_b, port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(STALL)).map_err(|e| e.to_string())?;
        let msg = vec![0x5au8; size];
        let mut buf = vec![0u8; 65536];
        let mut rtts = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            s.send(&msg).map_err(|e| format!("UDP client: {e}"))?;
            let n = s.recv(&mut buf).map_err(|e| format!("UDP client: {e}"))?;
            rtts.push(t.elapsed());
            if n != size {
                return Err(format!("UDP echo answered {n} bytes for {size}"));
            }
        }
        Ok(rtts)
    });
    let rtts = client
        .join()
        .map_err(|_| "the UDP client thread panicked".to_string())?;
    echo.join()
        .map_err(|_| "the UDP echo thread panicked".to_string())??;
    rtts
}

/// `iters` round trips of one raw frame between AF_XDP links in the two namespaces: A
/// sends a RoCE-sized frame of `size` payload bytes (to a QP nobody has: no RoCE work
/// anywhere), B's echo sends one back, each built once. The wire and the rings with
/// nothing on top, so the RC SEND round trip's own ceiling. Each side waits for its
/// frame in poll(2), as an idle engine thread sleeps, or spinning on its RX ring
/// (`spin`), as a busy-polling one does.
fn raw_pingpong(
    pair: &Pair,
    size: usize,
    iters: usize,
    spin: bool,
) -> Result<Vec<Duration>, String> {
    let to_b = super::ceiling::raw_frame_from(pair, true, Mtu::Mtu1024, size)?;
    let to_a = super::ceiling::raw_frame_from(pair, false, Mtu::Mtu1024, size)?;
    let open = |side: usize, ns: &str, ip| -> Result<XdpLink, String> {
        super::pin_side(side);
        crate::host::enter_netns(ns).map_err(|e| e.to_string())?;
        XdpLink::open(&pair.ifname, &[IpAddr::V4(ip)], &XdpConfig::default())
    };
    // One frame in, within STALL: sleeping in poll(2) between empty looks, or spinning.
    let wait = |link: &mut XdpLink| -> Result<(), String> {
        let start = Instant::now();
        loop {
            if link.recv(1, &mut |_| {}) > 0 {
                return Ok(());
            }
            if start.elapsed() > STALL {
                return Err("the raw echo's frame did not come back".into());
            }
            if !spin {
                link.wait_readable(STALL);
            }
        }
    };
    let send = |link: &mut XdpLink, f: &[u8]| {
        let mut once = Some(f);
        link.send(&mut |buf: &mut [u8]| {
            let f = once.take()?;
            buf[..f.len()].copy_from_slice(f);
            Some(f.len())
        });
        link.flush();
    };
    let (ready_tx, ready_rx) = mpsc::bounded::<Result<(), String>>(1);
    std::thread::scope(|sc| {
        let echo = sc.spawn(|| -> Result<(), String> {
            let mut link = match open(1, &pair.b.name, pair.ip_b) {
                Ok(l) => {
                    let _ = ready_tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.clone()));
                    return Err(e);
                }
            };
            for _ in 0..iters {
                wait(&mut link)?;
                send(&mut link, &to_a);
            }
            Ok(())
        });
        let client = sc.spawn(|| -> Result<Vec<Duration>, String> {
            ready_rx
                .recv()
                .map_err(|_| "the raw echo ended".to_string())??;
            let mut link = open(0, &pair.a.name, pair.ip_a)?;
            let mut rtts = Vec::with_capacity(iters);
            for _ in 0..iters {
                let t = Instant::now();
                send(&mut link, &to_b);
                wait(&mut link)?;
                rtts.push(t.elapsed());
            }
            Ok(rtts)
        });
        let rtts = client
            .join()
            .map_err(|_| "the raw echo's client panicked".to_string())?;
        let e = echo
            .join()
            .map_err(|_| "the raw echo panicked".to_string())?;
        // The client's error says more than the echo's (which then only timed out).
        let rtts = rtts?;
        e.map(|()| rtts)
    })
}

/// `iters` RC SEND round trips of `size` bytes between engines in the two namespaces,
/// each side on its own thread waiting for its completions, as two programs would
/// (`workload::pingpong` drives both sides from one thread, which hides the wake-ups);
/// `desc` gets the link's description.
fn rc_pingpong(
    pair: &Pair,
    on: BenchLink,
    busy: bool,
    size: usize,
    iters: usize,
    desc: &mut String,
) -> Result<Vec<Duration>, String> {
    let (a, b) = super::rc_pair_on(pair, on, None, 2 * size + 4096, busy)?;
    *desc = a.dev.info().link.clone();
    let post_recv = |e: &Endpoint| {
        e.qp.post_recv(&RecvWr::new(1, &[e.sge(size, size)]))
            .map_err(|x| x.to_string())
    };
    let send = |e: &Endpoint| {
        e.qp.post_send(&SendWr::send(2, &[e.sge(0, size)]).with_flags(SendFlags::SIGNALED))
            .map_err(|x| x.to_string())
    };
    post_recv(&b)?;
    std::thread::scope(|sc| {
        // B answers each SEND with one, reposting its receive first.
        let echo = sc.spawn(|| -> Result<(), String> {
            for _ in 0..iters {
                b.next_ok(STALL)?;
                post_recv(&b)?;
                send(&b)?;
                b.next_ok(STALL)?;
            }
            Ok(())
        });
        let mut rtts = Vec::with_capacity(iters);
        let mut run = || -> Result<(), String> {
            for _ in 0..iters {
                post_recv(&a)?;
                let t = Instant::now();
                send(&a)?;
                // Both completions, the send's and the answer's, in either order.
                a.next_ok(STALL)?;
                a.next_ok(STALL)?;
                rtts.push(t.elapsed());
            }
            Ok(())
        };
        let r = run();
        let e = echo
            .join()
            .map_err(|_| "the RC echo thread panicked".to_string())?;
        r.and(e).map(|()| rtts)
    })
}

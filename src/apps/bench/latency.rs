//! `bench latency`: round trips of small messages between two network namespaces on a
//! veth pair, measured side by side in one run, interleaved: the kernel's UDP sockets
//! (the ceiling a userspace NIC should beat), a raw AF_XDP echo (one frame of the same
//! size each way through the project's own ring code, no RoCE work: the round trip's
//! own ceiling, sleeping in poll(2) between frames and spinning), roce-xdp's RC SEND
//! ping-pong (each side waits for its completions, as `ibv_rc_pingpong` does), and the
//! same with the engines busy-polling (`--busy-poll`), and RC SEND over the UDP link
//! (the engines on kernel UDP sockets instead of AF_XDP); then the same three for RC
//! WRITE ping-pong in `ib_write_lat`'s way (each side spins on the last byte of the
//! buffer the peer writes into, and answers with a WRITE of its own). Medians and 99th
//! percentiles per repetition, and the ratios to the kernel's and to the raw echo's.

use super::super::endpoint::Endpoint;
use super::super::workload::Report;
use super::{BenchLink, median};
use crate::link::FrameLink;
use crate::link::xdp::{XdpConfig, XdpLink};
use crate::netns::Pair;
use crate::verbs::{Mtu, RecvWr, SendFlags, SendWr};
use crossbeam::channel as mpsc;
use std::net::{IpAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Round trips measured.
    pub count: usize,
}

impl Rtt {
    /// The median and the 99th percentile, taken as the workloads take theirs.
    fn of(v: Vec<Duration>) -> Rtt {
        let count = v.len();
        let mut r = Report {
            rtt_ns: v.iter().map(|d| d.as_nanos() as u64).collect(),
            ..Report::default()
        };
        r.rtt_ns.sort_unstable();
        Rtt {
            median_us: r.rtt_us(0.5),
            p99_us: r.rtt_us(0.99),
            count,
        }
    }
}

/// One repetition: the nine, measured one after the other.
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
    /// RC WRITE ping-pong, as `ib_write_lat` does it: the default, busy-polling, and
    /// on the UDP link.
    pub write: Rtt,
    pub write_busy: Rtt,
    pub write_udp_link: Rtt,
}

/// Which of a repetition's RC figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcKind {
    Default,
    BusyPoll,
    UdpLink,
    Write,
    WriteBusyPoll,
    WriteUdpLink,
}

impl LatencyRep {
    pub fn rc(&self, k: RcKind) -> Rtt {
        match k {
            RcKind::Default => self.rc,
            RcKind::BusyPoll => self.rc_busy,
            RcKind::UdpLink => self.rc_udp_link,
            RcKind::Write => self.write,
            RcKind::WriteBusyPoll => self.write_busy,
            RcKind::WriteUdpLink => self.write_udp_link,
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
        let k = if busy {
            RcKind::BusyPoll
        } else {
            RcKind::Default
        };
        self.raw_ratio_of(k, busy)
    }

    /// As [`raw_ratio`](Self::raw_ratio), for figure `k` against the sleeping echo or
    /// the spinning one (`spinning`).
    pub fn raw_ratio_of(&self, k: RcKind, spinning: bool) -> f64 {
        median(
            self.reps
                .iter()
                .map(|r| {
                    let raw = if spinning { r.raw_busy } else { r.raw };
                    r.rc(k).median_us / raw.median_us.max(1e-9)
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
             RC SEND busy-poll  RC SEND, UDP link  RC WRITE           RC WRITE busy-poll \
             RC WRITE, UDP link\n",
        );
        for (i, r) in self.reps.iter().enumerate() {
            s.push_str(&format!("{:<4}", i + 1));
            for t in [
                r.udp,
                r.raw,
                r.raw_busy,
                r.rc,
                r.rc_busy,
                r.rc_udp_link,
                r.write,
                r.write_busy,
                r.write_udp_link,
            ] {
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
        s.push_str(&format!(
            "RC WRITE round trip / kernel UDP round trip (medians): {:.2}; busy-polling: \
             {:.2}; on the UDP link: {:.2}\n",
            self.ratio(RcKind::Write),
            self.ratio(RcKind::WriteBusyPoll),
            self.ratio(RcKind::WriteUdpLink)
        ));
        let counts: Vec<String> = self
            .reps
            .iter()
            .map(|r| {
                format!(
                    "{}/{}/{}",
                    r.write.count, r.write_busy.count, r.write_udp_link.count
                )
            })
            .collect();
        s.push_str(&format!(
            "RC WRITE round trips measured per repetition (default/busy-polling/UDP link; at \
             most {:.0} s each): {}\n",
            WRITE_BUDGET.as_secs_f64(),
            counts.join(", ")
        ));
        s
    }

    fn to_json(&self) -> serde_json::Value {
        let rtt = |r: &Rtt| {
            let (m, p, n) = (r.median_us, r.p99_us, r.count);
            serde_json::json!({"median_us": m, "p99_us": p, "count": n})
        };
        let write_busy_to_spinning = self.raw_ratio_of(RcKind::WriteBusyPoll, true);
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
                "rc_write": rtt(&r.write),
                "rc_write_busy_poll": rtt(&r.write_busy),
                "rc_write_udp_link": rtt(&r.write_udp_link),
            })).collect::<Vec<_>>(),
            "rc_to_udp": self.ratio(RcKind::Default),
            "rc_busy_poll_to_udp": self.ratio(RcKind::BusyPoll),
            "rc_udp_link_to_udp": self.ratio(RcKind::UdpLink),
            "rc_to_raw_echo": self.raw_ratio(false),
            "rc_busy_poll_to_raw_echo_spinning": self.raw_ratio(true),
            "rc_write_to_udp": self.ratio(RcKind::Write),
            "rc_write_busy_poll_to_udp": self.ratio(RcKind::WriteBusyPoll),
            "rc_write_udp_link_to_udp": self.ratio(RcKind::WriteUdpLink),
            "rc_write_to_raw_echo": self.raw_ratio_of(RcKind::Write, false),
            "rc_write_busy_poll_to_raw_echo_spinning": write_busy_to_spinning,
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
    write_pingpong(&pair, BenchLink::Xdp, false, o.size, o.iters.min(200))?;
    let mut reps = Vec::new();
    for rep in 0..o.reps {
        let probe = super::CoreProbe::start();
        let udp = Rtt::of(udp_pingpong(&pair, o.size, o.iters)?);
        let raw = Rtt::of(raw_pingpong(&pair, o.size, o.iters, false)?);
        let raw_busy = Rtt::of(raw_pingpong(&pair, o.size, o.iters, true)?);
        let rc_on = |link, busy, desc: &mut String| {
            rc_pingpong(&pair, link, busy, o.size, o.iters, desc).map(Rtt::of)
        };
        let rc = rc_on(BenchLink::Xdp, false, &mut link)?;
        let rc_busy = rc_on(BenchLink::Xdp, true, &mut String::new())?;
        let rc_udp_link = rc_on(BenchLink::Udp, false, &mut String::new())?;
        let write_on = |link, busy| write_pingpong(&pair, link, busy, o.size, o.iters).map(Rtt::of);
        let write = write_on(BenchLink::Xdp, false)?;
        let write_busy = write_on(BenchLink::Xdp, true)?;
        let write_udp_link = write_on(BenchLink::Udp, false)?;
        say(&format!(
            "rep {}: kernel UDP {:.1} us, raw AF_XDP echo {:.1} us (spinning {:.1}), \
             RC SEND {:.1} us, busy-polling {:.1} us, on the UDP link {:.1} us; RC WRITE \
             {:.1} us, busy-polling {:.1} us, on the UDP link {:.1} us (medians){}",
            rep + 1,
            udp.median_us,
            raw.median_us,
            raw_busy.median_us,
            rc.median_us,
            rc_busy.median_us,
            rc_udp_link.median_us,
            write.median_us,
            write_busy.median_us,
            write_udp_link.median_us,
            probe.end_clause()
        ));
        reps.push(LatencyRep {
            udp,
            raw,
            raw_busy,
            rc,
            rc_busy,
            rc_udp_link,
            write,
            write_busy,
            write_udp_link,
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
        link.send(&mut |mut buf| {
            let f = once.take()?;
            buf.write(f).then_some(f.len())
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
        joined(client, echo, "the raw echo")
    })
}

/// The client's round trips once both sides of a ping-pong (`what`) ended: the
/// client's error first, as it says more than the echo's (which then only timed out).
fn joined(
    client: std::thread::ScopedJoinHandle<'_, Result<Vec<Duration>, String>>,
    echo: std::thread::ScopedJoinHandle<'_, Result<(), String>>,
    what: &str,
) -> Result<Vec<Duration>, String> {
    let rtts = client
        .join()
        .map_err(|_| format!("{what}'s client panicked"))?;
    let e = echo.join().map_err(|_| format!("{what} panicked"))?;
    let rtts = rtts?;
    e.map(|()| rtts)
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

/// Longest an RC WRITE ping-pong measurement runs: its round trips are bimodal on a
/// core shared with a spinner (see [`write_pingpong`]), and 20 000 of them at 4 ms would
/// take 80 s.
const WRITE_BUDGET: Duration = Duration::from_secs(2);

/// Up to `iters` RC WRITE round trips of `size` bytes (fewer if [`WRITE_BUDGET`] runs
/// out first), as `ib_write_lat` makes them: A WRITEs its buffer into B's, whose last
/// byte carries the round's tag; B spins on that byte (a volatile read of its
/// registered memory, no verbs call: the engine must bring the WRITE in by itself),
/// then WRITEs back into A's, where A spins likewise. Each side also waits for its own
/// WRITE's completion before its next one. A round trip is A's post to the answer's
/// last byte in A's memory. Each side on its own thread, not pinned, as in
/// [`rc_pingpong`].
///
/// The spinners hold their cores: on this machine an engine thread woken by a frame on
/// a core where a spinner runs waited for the next tick (4.0 ms, HZ=250), so a round
/// trip is either a few tens of microseconds or a tick. The kernel is built with
/// preempt=none; that a fair-class wake-up then only marks the spinner for a lazy
/// reschedule, with no interrupt to act on it before the tick, is a reading, not traced.
fn write_pingpong(
    pair: &Pair,
    on: BenchLink,
    busy: bool,
    size: usize,
    iters: usize,
) -> Result<Vec<Duration>, String> {
    let (a, b) = super::rc_pair_on(pair, on, None, 2 * size + 4096, busy)?;
    // Each side's memory: its source at 0, the peer's WRITEs land at `size`.
    let landed = 2 * size - 1;
    let write = |e: &Endpoint, to: &Endpoint, tag: u8| -> Result<(), String> {
        e.mem
            .write(size - 1, &[tag])
            .map_err(super::super::workload::mem_err)?;
        e.qp.post_send(
            &SendWr::write(3, &[e.sge(0, size)], to.mr.addr + size as u64, to.mr.rkey)
                .with_flags(SendFlags::SIGNALED),
        )
        .map_err(|x| x.to_string())
    };
    // Raised by A when it stops: B then stops waiting for a next round.
    let stop = AtomicBool::new(false);
    // Spins until the byte the peer's WRITE ends with reads `tag` (true), or `stop` is
    // raised (false), within STALL.
    let land = |e: &Endpoint, tag: u8| -> Result<bool, String> {
        let start = Instant::now();
        let mut n = 0u32;
        loop {
            if e.mem
                .load_volatile(landed)
                .map_err(super::super::workload::mem_err)?
                == tag
            {
                return Ok(true);
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(1024) && start.elapsed() > STALL {
                return Err(format!("RC WRITE ping-pong: round {tag} did not land"));
            }
            std::hint::spin_loop();
        }
    };
    // Round i's tag: never 0 (the memory's start), never the previous round's.
    let tag = |i: usize| (i % 255) as u8 + 1;
    std::thread::scope(|sc| {
        let echo = sc.spawn(|| -> Result<(), String> {
            for i in 0..iters {
                if !land(&b, tag(i))? {
                    break;
                }
                write(&b, &a, tag(i))?;
                b.next_ok(STALL)?;
            }
            Ok(())
        });
        let client = sc.spawn(|| -> Result<Vec<Duration>, String> {
            let start = Instant::now();
            let mut rtts = Vec::with_capacity(iters);
            let r = (|| {
                for i in 0..iters {
                    if start.elapsed() > WRITE_BUDGET {
                        break;
                    }
                    let t = Instant::now();
                    write(&a, &b, tag(i))?;
                    a.next_ok(STALL)?;
                    land(&a, tag(i))?;
                    rtts.push(t.elapsed());
                }
                Ok::<(), String>(())
            })();
            stop.store(true, Ordering::Relaxed);
            r.map(|()| rtts)
        });
        joined(client, echo, "the RC WRITE echo")
    })
}

//! `bench ceiling`: what the wire between two namespaces carries, and how much of it
//! roce-xdp's RC traffic gets, side by side in one run: raw frames of RoCE's size sent
//! one way with the project's own AF_XDP ring code and no RoCE work (counted at the
//! receiver, so it is what both ends sustain together), then RC WRITE and READ streams
//! of 64 KiB messages between two engines on the same interfaces, as frames per second
//! of the same size. Issue 11's targets are ratios of these (WRITE >= 0.95, READ
//! >= 0.90 of the raw rate).

use super::super::workload::Stream;
use super::median;
use crate::link::FrameLink;
use crate::link::xdp::{XdpConfig, XdpLink};
use crate::netns::Pair;
use crate::verbs::Mtu;
use crate::wire::{
    AethRepr, BthRepr, EthRepr, ExtRepr, FrameRepr, IpRepr, Ipv4Repr, Opcode, Psn, ROCE_V2_PORT,
    RethRepr, RoceRepr, Syndrome, UdpRepr,
};
use crossbeam::channel as mpsc;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What `bench ceiling` does.
#[derive(Debug, Clone)]
pub struct CeilingOpts {
    /// Raw frames per measurement.
    pub frames: u64,
    /// How long each RC stream runs.
    pub stream: Duration,
    pub reps: usize,
    /// IB MTUs to measure at (1024 on a 1500-byte link, 4096 on a 4200-byte one).
    pub mtus: Vec<Mtu>,
}

impl Default for CeilingOpts {
    fn default() -> Self {
        CeilingOpts {
            frames: 300_000,
            stream: Duration::from_secs(1),
            reps: 3,
            mtus: vec![Mtu::Mtu1024, Mtu::Mtu4096],
        }
    }
}

/// One repetition at one MTU.
#[derive(Debug, Clone, Copy)]
pub struct CeilingRep {
    /// Raw frames per second the receiver took.
    pub raw_pps: f64,
    /// RC WRITE and READ payload frames per second (goodput / IB MTU).
    pub write_pps: f64,
    pub read_pps: f64,
}

/// All repetitions at one MTU.
#[derive(Debug, Clone)]
pub struct CeilingRow {
    pub mtu: Mtu,
    /// The size of one full RoCE frame on the wire at this MTU (a WRITE MIDDLE).
    pub frame_bytes: usize,
    pub reps: Vec<CeilingRep>,
    pub link: String,
}

impl CeilingRow {
    fn med(&self, f: impl Fn(&CeilingRep) -> f64) -> f64 {
        median(self.reps.iter().map(f).collect())
    }
    pub fn write_ratio(&self) -> f64 {
        self.med(|r| r.write_pps / r.raw_pps.max(1e-9))
    }
    pub fn read_ratio(&self) -> f64 {
        self.med(|r| r.read_pps / r.raw_pps.max(1e-9))
    }
}

#[derive(Debug, Clone)]
pub struct CeilingReport {
    pub opts: CeilingOpts,
    pub rows: Vec<CeilingRow>,
}

impl super::BenchReport for CeilingReport {
    fn table(&self) -> String {
        let mut s = format!(
            "roce-xdp bench ceiling: raw AF_XDP frames one way ({} per repetition) against RC \
             WRITE and READ of 64 KiB messages ({:.1} s each), between two namespaces on veth\n",
            self.opts.frames,
            self.opts.stream.as_secs_f64()
        );
        for row in &self.rows {
            s.push_str(&format!(
                "\nIB MTU {} ({}-byte frames); {}\n",
                row.mtu.bytes(),
                row.frame_bytes,
                row.link
            ));
            s.push_str("rep  raw Mpps  WRITE Mpps  READ Mpps  WRITE/raw  READ/raw\n");
            for (i, r) in row.reps.iter().enumerate() {
                s.push_str(&format!(
                    "{:<4} {:>8.3}  {:>10.3}  {:>9.3}  {:>9.2}  {:>8.2}\n",
                    i + 1,
                    r.raw_pps / 1e6,
                    r.write_pps / 1e6,
                    r.read_pps / 1e6,
                    r.write_pps / r.raw_pps.max(1e-9),
                    r.read_pps / r.raw_pps.max(1e-9)
                ));
            }
            s.push_str(&format!(
                "median ratios: WRITE {:.2}, READ {:.2} of the raw frame rate\n",
                row.write_ratio(),
                row.read_ratio()
            ));
        }
        s
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bench": "ceiling",
            "raw_frames": self.opts.frames,
            "stream_secs": self.opts.stream.as_secs_f64(),
            "mtus": self.rows.iter().map(|row| serde_json::json!({
                "ib_mtu": row.mtu.bytes(),
                "frame_bytes": row.frame_bytes,
                "link": row.link,
                "reps": row.reps.iter().map(|r| serde_json::json!({
                    "raw_pps": r.raw_pps,
                    "write_pps": r.write_pps,
                    "read_pps": r.read_pps,
                })).collect::<Vec<_>>(),
                "write_to_raw": row.write_ratio(),
                "read_to_raw": row.read_ratio(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Runs `bench ceiling` (root: it creates namespaces and attaches XDP programs).
pub fn ceiling(o: &CeilingOpts, say: &mut dyn FnMut(&str)) -> Result<CeilingReport, String> {
    if o.frames == 0 || o.reps == 0 || o.mtus.is_empty() {
        return Err("--frames, --reps and the MTUs must not be empty".into());
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let mut rows = Vec::new();
    for &mtu in &o.mtus {
        let netdev_mtu = if mtu == Mtu::Mtu4096 { 4200 } else { 1500 };
        let pair = Pair::new("roce-ceil", 22, netdev_mtu)?;
        let frame = raw_frame(&pair, mtu, 65536)?;
        say(&format!(
            "IB MTU {}: {} ({}) and {} ({}), {}-byte frames",
            mtu.bytes(),
            pair.a.name,
            pair.ip_a,
            pair.b.name,
            pair.ip_b,
            frame.len()
        ));
        let mut row = CeilingRow {
            mtu,
            frame_bytes: frame.len(),
            reps: Vec::new(),
            link: String::new(),
        };
        // Warm-up of both, not counted.
        raw_rate(&pair, &frame, o.frames.min(20_000))?;
        rc_rates(&pair, mtu, Duration::from_millis(200), &mut row.link)?;
        for rep in 0..o.reps {
            let probe = super::CoreProbe::start();
            let raw_pps = raw_rate(&pair, &frame, o.frames)?;
            let (write_pps, read_pps) = rc_rates(&pair, mtu, o.stream, &mut row.link)?;
            say(&format!(
                "  rep {}: raw {:.3} Mpps, WRITE {:.3}, READ {:.3}{}",
                rep + 1,
                raw_pps / 1e6,
                write_pps / 1e6,
                read_pps / 1e6,
                probe.end_clause()
            ));
            row.reps.push(CeilingRep {
                raw_pps,
                write_pps,
                read_pps,
            });
        }
        rows.push(row);
    }
    Ok(CeilingReport {
        opts: o.clone(),
        rows,
    })
}

/// The frame an RC WRITE of `size` bytes at `mtu` sends most of, from A to B (to a QP
/// nobody has: only the receiver's ring code sees it): a WRITE MIDDLE of a full MTU, or
/// for a message that fits one frame, a WRITE ONLY with its RETH.
pub(super) fn raw_frame(pair: &Pair, mtu: Mtu, size: usize) -> Result<Vec<u8>, String> {
    raw_frame_from(pair, true, mtu, size)
}

/// [`raw_frame`] from A to B (`from_a`) or from B to A.
pub(super) fn raw_frame_from(
    pair: &Pair,
    from_a: bool,
    mtu: Mtu,
    size: usize,
) -> Result<Vec<u8>, String> {
    let full = size >= mtu.bytes() as usize;
    let payload = vec![0x3cu8; size.min(mtu.bytes() as usize)];
    let (opcode, reth) = if full {
        (Opcode::RC_RDMA_WRITE_MIDDLE, None)
    } else {
        (Opcode::RC_RDMA_WRITE_ONLY, Some(raw_reth(size)))
    };
    let ext = ExtRepr {
        reth,
        ..ExtRepr::default()
    };
    emit_raw(pair, from_a, opcode, ext, &payload)
}

/// The two frames of an RC READ of `size` bytes at `mtu`, for [`raw_echo_rate`]: the
/// request A sends (a READ REQUEST with its RETH), and the response frame B sends most
/// of (a READ RESPONSE ONLY with its AETH for a message that fits one frame, else a
/// MIDDLE of a full MTU); and how many response frames a request brings back.
pub(super) fn raw_read_frames(
    pair: &Pair,
    mtu: Mtu,
    size: usize,
) -> Result<(Vec<u8>, Vec<u8>, u64), String> {
    let m = mtu.bytes() as usize;
    let request = ExtRepr {
        reth: Some(raw_reth(size)),
        ..ExtRepr::default()
    };
    let request = emit_raw(pair, true, Opcode::RC_RDMA_READ_REQUEST, request, &[])?;
    let (opcode, aeth) = if size > m {
        (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, None)
    } else {
        let aeth = AethRepr {
            syndrome: Syndrome::ACK,
            msn: 1,
        };
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, Some(aeth))
    };
    let ext = ExtRepr {
        aeth,
        ..ExtRepr::default()
    };
    let response = emit_raw(pair, false, opcode, ext, &vec![0x3cu8; size.clamp(1, m)])?;
    Ok((request, response, size.div_ceil(m).max(1) as u64))
}

fn raw_reth(size: usize) -> RethRepr {
    RethRepr {
        va: 0x10000,
        rkey: 0x1234,
        dma_len: size as u32,
    }
}

/// One frame from A to B (`from_a`) or back, to a QP nobody has (only the other side's
/// ring code sees it).
fn emit_raw(
    pair: &Pair,
    from_a: bool,
    opcode: Opcode,
    ext: ExtRepr,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    let (from, to, ip_from, ip_to) = if from_a {
        (&pair.a, &pair.b, pair.ip_a, pair.ip_b)
    } else {
        (&pair.b, &pair.a, pair.ip_b, pair.ip_a)
    };
    let repr = FrameRepr {
        eth: EthRepr {
            dst: to.mac(&pair.ifname)?,
            src: from.mac(&pair.ifname)?,
            vlan: None,
            ethertype: 0x0800,
        },
        ip: IpRepr::V4(Ipv4Repr::new(ip_from, ip_to, 0)),
        udp: UdpRepr {
            src_port: 49152,
            dst_port: ROCE_V2_PORT,
        },
        roce: RoceRepr {
            bth: BthRepr::new(opcode, 0x7f_0001, Psn::new(1)),
            ext,
            payload,
        },
    };
    let mut f = vec![0u8; 9216];
    let n = repr
        .emit(&mut f)
        .map_err(|e| format!("building the raw frame: {e:?}"))?;
    f.truncate(n);
    Ok(f)
}

/// What the raw receiver does with each frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RawRx {
    /// Counts it and hands it back: the rings' own rate.
    Count,
    /// Reads it as an engine must: one CRC-32 pass over the frame (the ICRC's cost)
    /// and a copy of it into a 4 MiB buffer (the payload's copy into registered
    /// memory), wrapping around. A ceiling for a receiver that touches every byte.
    Read,
}

/// Bytes the reading receiver copies into before it wraps around (larger than the
/// caches, as registered memory usually is).
const READ_BUF: usize = 4 << 20;

/// Opens side `side`'s raw link (0: A, 1: B) of `pair`, in the thread that calls it:
/// pinned to that side's core, in its namespace.
fn side_opener(pair: &Pair, side: usize) -> impl FnOnce() -> Result<XdpLink, String> + use<> {
    let (ns, ip) = if side == 0 {
        (pair.a.name.clone(), pair.ip_a)
    } else {
        (pair.b.name.clone(), pair.ip_b)
    };
    let ifname = pair.ifname.clone();
    move || {
        super::pin_side(side);
        crate::host::enter_netns(&ns).map_err(|e| e.to_string())?;
        XdpLink::open(&ifname, &[IpAddr::V4(ip)], &XdpConfig::default())
    }
}

/// Opens a link with `open` and says on `ready` whether it did: the other side starts
/// sending only once this one can receive.
fn open_and_report(
    open: impl FnOnce() -> Result<XdpLink, String>,
    ready: &mpsc::Sender<Result<(), String>>,
) -> Result<XdpLink, String> {
    let link = open();
    let _ = ready.send(link.as_ref().map(|_| ()).map_err(Clone::clone));
    link
}

/// Sends `count` copies of `frame` from A's AF_XDP link as fast as the rings take them
/// and counts what B's link receives: frames per second from B's first to its last.
pub(super) fn raw_rate(pair: &Pair, frame: &[u8], count: u64) -> Result<f64, String> {
    raw_rate_rx(pair, frame, count, RawRx::Count)
}

/// As [`raw_rate`], with B's receiver doing `rx` with each frame.
pub(super) fn raw_rate_rx(pair: &Pair, frame: &[u8], count: u64, rx: RawRx) -> Result<f64, String> {
    let (ready_tx, ready_rx) = mpsc::bounded::<Result<(), String>>(1);
    let open_b = side_opener(pair, 1);
    let receiver = std::thread::spawn(move || -> Result<(u64, Duration), String> {
        let mut link = open_and_report(open_b, &ready_tx)?;
        match rx {
            RawRx::Count => super::count_arrivals(count, || Ok(link.recv(256, &mut |_| {}) as u64)),
            RawRx::Read => {
                let mut buf = vec![0u8; READ_BUF];
                let (mut at, mut sum) = (0usize, 0u32);
                let r = super::count_arrivals(count, || {
                    Ok(link.recv(256, &mut |f| {
                        for p in f.iter() {
                            sum ^= crate::wire::icrc::crc32(p);
                        }
                        if at + f.len() > buf.len() {
                            at = 0;
                        }
                        f.copy_to(&mut buf[at..]);
                        at += f.len();
                    }) as u64)
                });
                // Used, so neither the pass nor the copy is optimised away.
                std::hint::black_box((sum, &buf));
                r
            }
        }
    });
    ready_rx
        .recv()
        .map_err(|_| "the raw receiver ended".to_string())??;
    let open_a = side_opener(pair, 0);
    let frame = frame.to_vec();
    let sender = std::thread::spawn(move || -> Result<(), String> {
        let mut link = open_a()?;
        super::send_frames(&mut link, count, &[frame]);
        Ok(())
    });
    sender
        .join()
        .map_err(|_| "the raw sender panicked".to_string())??;
    let (got, span) = receiver
        .join()
        .map_err(|_| "the raw receiver panicked".to_string())??;
    super::arrival_rate(got, span, count, "raw frames")
}

/// What [`raw_echo_rate`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Echo {
    /// Requests answered per second, from the first answer's arrival to the last's.
    pub rps: f64,
    /// Times the answers stopped with requests outstanding (frames the kernel dropped,
    /// which a raw echo does not send again): the outstanding ones were written off.
    pub stalls: u64,
}

/// How long the asker waits for an outstanding answer before writing it off.
const ECHO_STALL: Duration = Duration::from_millis(5);

/// Requests a raw echo keeps outstanding, as the RC READ stream it stands beside may:
/// its messages in flight (`depth`), and no more response frames than a requester's
/// PSN window holds (`window_psns`, the device's `max_inflight_psns`).
pub(super) fn echo_window(frames_per_request: u64, depth: usize, window_psns: u32) -> u64 {
    (u64::from(window_psns) / frames_per_request.max(1)).clamp(1, depth.max(1) as u64)
}

/// The raw rings' rate of a READ stream: A sends `request` frames to B with at most
/// `window` unanswered, and B answers each with `per_request` copies of `response`, each
/// side one thread, pinned, that sends and receives on one link as an engine does. A
/// one-way stream leaves the receiver's socket to receive only; here each socket also
/// sends, from the other core than the one the kernel receives into it on.
pub(super) fn raw_echo_rate(
    pair: &Pair,
    request: &[u8],
    response: &[u8],
    per_request: u64,
    count: u64,
    window: u64,
) -> Result<Echo, String> {
    let per_request = per_request.max(1);
    let window = window.max(1);
    let done = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::bounded::<Result<(), String>>(1);
    let open_b = side_opener(pair, 1);
    let response = response.to_vec();
    let echo_done = done.clone();
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let mut link = open_and_report(open_b, &ready_tx)?;
        let mut owe = 0u64;
        let start = Instant::now();
        let mut last = start;
        while start.elapsed() < Duration::from_secs(30) {
            let n = link.recv(256, &mut |_| {}) as u64;
            owe += n * per_request;
            let sent = if owe > 0 {
                super::send_copies(&mut link, &response, &mut owe)
            } else {
                0
            };
            if n > 0 || sent > 0 {
                last = Instant::now();
            } else if link.tx_pending() {
                // Copy mode takes a budget of descriptors per kick: kick again.
                link.flush();
            } else if echo_done.load(Ordering::SeqCst) || last.elapsed() > Duration::from_secs(1) {
                break;
            } else {
                std::thread::yield_now();
            }
        }
        super::drain_tx(&mut link);
        Ok(())
    });
    ready_rx
        .recv()
        .map_err(|_| "the raw echo ended".to_string())??;
    let open_a = side_opener(pair, 0);
    let request = request.to_vec();
    let asker = std::thread::spawn(move || -> Result<(u64, Duration, u64), String> {
        let mut link = open_a()?;
        // Requests sent and response frames received, since the start or the last
        // write-off; requests answered before it.
        let (mut sent, mut frames, mut banked, mut stalls) = (0u64, 0u64, 0u64, 0u64);
        let start = Instant::now();
        let (mut first, mut last) = (None::<Instant>, start);
        let mut progress = start;
        while banked + frames / per_request < count && start.elapsed() < Duration::from_secs(30) {
            let answered = frames / per_request;
            let mut room = window
                .saturating_sub(sent - answered)
                .min(count.saturating_sub(banked + sent));
            let queued = if room > 0 {
                super::send_copies(&mut link, &request, &mut room)
            } else {
                0
            };
            sent += queued;
            let n = link.recv(256, &mut |_| {}) as u64;
            let now = Instant::now();
            if n > 0 {
                first.get_or_insert(now);
                last = now;
                progress = now;
                frames += n;
            } else if sent > answered && now - progress > ECHO_STALL {
                // Frames were lost: write the outstanding requests off and go on.
                stalls += 1;
                banked += answered;
                (sent, frames, progress) = (0, 0, now);
            } else if link.tx_pending() {
                link.flush();
            } else if queued == 0 {
                std::thread::yield_now();
            }
        }
        Ok((
            banked + frames / per_request,
            first.map_or(Duration::ZERO, |f| last - f),
            stalls,
        ))
    });
    let asked = asker
        .join()
        .map_err(|_| "the raw asker panicked".to_string());
    done.store(true, Ordering::SeqCst);
    echo.join()
        .map_err(|_| "the raw echo panicked".to_string())??;
    let (got, span, stalls) = asked??;
    Ok(Echo {
        rps: super::arrival_rate(got, span, count, "echoed requests")?,
        stalls,
    })
}

/// RC WRITE then READ streams of 64 KiB messages, `span` each, between engines in the
/// two namespaces: payload frames per second of each.
fn rc_rates(
    pair: &Pair,
    mtu: Mtu,
    span: Duration,
    link: &mut String,
) -> Result<(f64, f64), String> {
    let size = 65536;
    let (a, b) = super::rc_pair(pair, Some(mtu), 16 * size + 8192, false)?;
    *link = a.dev.info().link.clone();
    let per_frame = f64::from(mtu.bytes());
    let rate = |op| -> Result<f64, String> {
        let r = super::stream_for(&a, &b, op, size, 16, span)?;
        Ok(r.bytes as f64 / per_frame / r.elapsed.as_secs_f64().max(1e-9))
    };
    let w = rate(Stream::Write)?;
    let r = rate(Stream::Read)?;
    Ok((w, r))
}

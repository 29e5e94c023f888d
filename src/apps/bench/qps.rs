//! `bench qps`: many RC QPs busy at once against one, in the same run. A's N QPs each
//! keep `depth` WRITEs of `size` bytes outstanding to their peers on B, reposting each as
//! it completes (so the send queues are served round-robin, as perftest's `-q` does),
//! interleaved with one QP streaming the same size at the depth `bench goodput` uses.
//! What a NIC's QP scheduling and per-QP state cost shows in the ratio.
//!
//! The one QP streams before and after the N in each repetition (the stream after one
//! repetition opens the next), and the N are measured against the two pooled (their
//! WRITEs over their time): this VM's rates drift within seconds, and a single stream on
//! one side of the N carried that drift into the ratio.
//!
//! Each stream's frames are counted each way, and the ratio is split into two factors
//! whose product it is: frames per second (what a frame cost the N QPs against the one)
//! and frames per WRITE. The second is the protocol's: a QP with one WRITE outstanding
//! needs an ACK for it, while the single QP's requester asks for one every
//! `ACK_REQ_ENDS` packets, and ACKs are cumulative. For 4 KiB WRITEs at IB MTU 1024 that
//! puts the ratio at about 0.85 when both move frames at the same rate, as on a link
//! whose frames, not bytes, set the pace (veth in copy mode).
//!
//! It also measures what an idle QP costs: the resident memory a bare engine (no link,
//! no runtime) grows by per QP brought to RTS (10 000 of them), and the resident memory the whole process
//! grew by per QP while the bench created and connected its QPs (runtime and engine,
//! both sides, with the queue depths the bench uses). Resident memory is what the host
//! pays; it is page-granular, which over a thousand QPs is a few bytes each.

use super::super::endpoint::{ConnectOpts, Endpoint, EndpointOpts};
use super::super::workload::{self, Stream};
use super::{BenchLink, median, rss_kib};
use crate::engine::Engine;
use crate::netns::Pair;
use crate::verbs::device::gid_of;
use crate::verbs::{
    AccessFlags, AddressVector, DeviceConfig, Mtu, QpAttr, QpAttrMask, QpInitAttr, QpState, QpType,
    SendWr, WcOpcode,
};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

/// What `bench qps` does.
#[derive(Debug, Clone)]
pub struct QpsOpts {
    /// QPs on each side.
    pub qps: usize,
    /// WRITE message size.
    pub size: usize,
    /// WRITEs each QP keeps outstanding.
    pub depth: usize,
    pub mtu: Mtu,
    /// How long each stream runs.
    pub stream: Duration,
    pub reps: usize,
}

impl QpsOpts {
    /// For CI: 0.2 s streams, one repetition.
    pub fn quick(mut self) -> Self {
        self.stream = self.stream.min(Duration::from_millis(200));
        self.reps = 1;
        self
    }
}

impl Default for QpsOpts {
    fn default() -> Self {
        QpsOpts {
            qps: 1000,
            size: 4096,
            depth: 1,
            mtu: Mtu::Mtu1024,
            stream: Duration::from_millis(500),
            reps: 3,
        }
    }
}

/// The frames a stream put on the link each way, against the WRITEs it completed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamFrames {
    pub writes: u64,
    /// Frames A's engine sent (requests and their retransmissions), and B's (ACKs).
    pub a_sent: u64,
    pub b_sent: u64,
    /// The stream's time, the one its goodput divides by.
    pub secs: f64,
}

impl StreamFrames {
    /// Frames both ways per WRITE completed.
    pub fn per_write(&self) -> f64 {
        (self.a_sent + self.b_sent) as f64 / self.writes.max(1) as f64
    }
    /// Frames both ways per second.
    pub fn per_sec(&self) -> f64 {
        (self.a_sent + self.b_sent) as f64 / self.secs.max(1e-9)
    }
    /// B's frames (ACKs) per WRITE.
    pub fn acks_per_write(&self) -> f64 {
        self.b_sent as f64 / self.writes.max(1) as f64
    }
    /// WRITEs completed per second.
    pub fn writes_per_sec(&self) -> f64 {
        self.writes as f64 / self.secs.max(1e-9)
    }
    /// Goodput of WRITEs of `size` bytes.
    pub fn gbps(&self, size: usize) -> f64 {
        self.writes_per_sec() * size as f64 * 8.0 / 1e9
    }
    /// Two streams' frames as one stream's.
    pub fn plus(&self, o: &StreamFrames) -> StreamFrames {
        StreamFrames {
            writes: self.writes + o.writes,
            a_sent: self.a_sent + o.a_sent,
            b_sent: self.b_sent + o.b_sent,
            secs: self.secs + o.secs,
        }
    }
}

/// One repetition.
#[derive(Debug, Clone, Copy)]
pub struct QpsRep {
    /// What each stream put on the link. The one QP streams before and after the N
    /// (the stream after a repetition opens the next one); the N are measured against
    /// the two pooled ([`Self::single_frames`]), as this VM's rates drift within
    /// seconds.
    pub single_before: StreamFrames,
    pub single_after: StreamFrames,
    pub many_frames: StreamFrames,
    /// Of the N: how many completed a WRITE, and the fewest and most WRITEs one did.
    pub active: usize,
    pub fewest: u64,
    pub most: u64,
    /// A's retransmitted packets during the N-QP stream, and the frames B's receive
    /// ring had no room for.
    pub retransmitted: u64,
    pub rx_no_room: u64,
}

impl QpsRep {
    /// The one QP's two streams pooled.
    pub fn single_frames(&self) -> StreamFrames {
        self.single_before.plus(&self.single_after)
    }
    /// The N QPs' goodput over the one QP's (both write the same size).
    pub fn ratio(&self) -> f64 {
        self.many_frames.writes_per_sec() / self.single_frames().writes_per_sec().max(1e-9)
    }
    /// The N QPs' frames per second (both ways) over the one QP's: what a frame cost
    /// them, inverted.
    pub fn frame_rate_ratio(&self) -> f64 {
        self.many_frames.per_sec() / self.single_frames().per_sec().max(1e-9)
    }
    /// The one QP's frames per WRITE over the N QPs': the ratio a link that moves a
    /// fixed number of frames a second would allow. The goodput ratio is this times
    /// [`Self::frame_rate_ratio`] (both streams write the same size).
    pub fn frames_per_write_ratio(&self) -> f64 {
        self.single_frames().per_write() / self.many_frames.per_write().max(1e-9)
    }
}

/// What `bench qps` prints.
#[derive(Debug, Clone)]
pub struct QpsReport {
    pub opts: QpsOpts,
    pub reps: Vec<QpsRep>,
    /// The single QP's WRITEs outstanding.
    pub single_depth: usize,
    /// Resident bytes per idle RC QP in RTS: a bare engine's, and the whole process's
    /// (runtime and engine of both sides, per QP).
    pub engine_bytes_per_qp: f64,
    pub process_bytes_per_qp: f64,
    /// The send and receive queue depth of each of the N QPs.
    pub queue_depth: u32,
    pub link: String,
}

impl QpsReport {
    pub fn median_ratio(&self) -> f64 {
        median(self.reps.iter().map(QpsRep::ratio).collect())
    }
    pub fn median_frame_rate_ratio(&self) -> f64 {
        median(self.reps.iter().map(QpsRep::frame_rate_ratio).collect())
    }
    pub fn median_frames_per_write_ratio(&self) -> f64 {
        median(
            self.reps
                .iter()
                .map(QpsRep::frames_per_write_ratio)
                .collect(),
        )
    }
}

impl super::BenchReport for QpsReport {
    fn table(&self) -> String {
        let o = &self.opts;
        let mut s = format!(
            "roce-xdp bench qps: {} RC QPs each keeping {} WRITE(s) of {} B outstanding \
             (served round-robin) against one QP with {} outstanding, IB MTU {}, {:.2} s per \
             stream; {}\n\n",
            o.qps,
            o.depth,
            o.size,
            self.single_depth,
            o.mtu.bytes(),
            o.stream.as_secs_f64(),
            self.link
        );
        s.push_str(
            "rep  1 QP Gbit/s  N QPs Gbit/s  ratio  = frame rate  x frames/WRITE  \
             ACKs/WRITE 1 / N  QPs active  WRITEs per QP (fewest-most)  resent  no room\n",
        );
        for (i, r) in self.reps.iter().enumerate() {
            s.push_str(&format!(
                "{:<4} {:>11.2}  {:>12.2}  {:>5.2}  {:>12.2}  {:>14.2}  {:>16}  {:>10}  {:>27}  \
                 {:>6}  {:>7}\n",
                i + 1,
                r.single_frames().gbps(o.size),
                r.many_frames.gbps(o.size),
                r.ratio(),
                r.frame_rate_ratio(),
                r.frames_per_write_ratio(),
                format!(
                    "{:.2} / {:.2}",
                    r.single_frames().acks_per_write(),
                    r.many_frames.acks_per_write()
                ),
                r.active,
                format!("{}-{}", r.fewest, r.most),
                r.retransmitted,
                r.rx_no_room
            ));
        }
        s.push_str(&format!(
            "\n{} QPs / 1 QP goodput: median {:.2}\n\
             per repetition the ratio is the frames both ways per second (N QPs over 1; \
             median {:.2}) times the frames per WRITE (1 QP over N; median {:.2}): a QP with \
             one WRITE outstanding needs an ACK for each, where one QP with many asks for \
             one every {} packets\n\
             an idle RC QP in RTS: {:.0} bytes of a bare engine's resident memory; {:.0} bytes \
             of this process's per QP created and connected (runtime and engine, {}-deep \
             send and receive queues)\n",
            o.qps,
            self.median_ratio(),
            self.median_frame_rate_ratio(),
            self.median_frames_per_write_ratio(),
            crate::engine::requester::ACK_REQ_ENDS,
            self.engine_bytes_per_qp,
            self.process_bytes_per_qp,
            self.queue_depth
        ));
        s
    }

    fn to_json(&self) -> serde_json::Value {
        let o = &self.opts;
        serde_json::json!({
            "bench": "qps",
            "qps": o.qps,
            "message_size": o.size,
            "depth_per_qp": o.depth,
            "single_qp_depth": self.single_depth,
            "ib_mtu": o.mtu.bytes(),
            "stream_secs": o.stream.as_secs_f64(),
            "link": self.link,
            "reps": self.reps.iter().map(|r| serde_json::json!({
                "single_gbps": r.single_frames().gbps(o.size),
                "single_before_gbps": r.single_before.gbps(o.size),
                "single_after_gbps": r.single_after.gbps(o.size),
                "many_gbps": r.many_frames.gbps(o.size),
                "ratio": r.ratio(),
                "active_qps": r.active,
                "fewest_writes": r.fewest,
                "most_writes": r.most,
                "retransmitted_pkts": r.retransmitted,
                "rx_no_room": r.rx_no_room,
                "frame_rate_ratio": r.frame_rate_ratio(),
                "frames_per_write_ratio": r.frames_per_write_ratio(),
                "single_frames": frames_json(&r.single_frames()),
                "many_frames": frames_json(&r.many_frames),
            })).collect::<Vec<_>>(),
            "median_ratio": self.median_ratio(),
            "median_frame_rate_ratio": self.median_frame_rate_ratio(),
            "median_frames_per_write_ratio": self.median_frames_per_write_ratio(),
            "engine_bytes_per_idle_qp": self.engine_bytes_per_qp,
            "process_bytes_per_idle_qp": self.process_bytes_per_qp,
            "queue_depth": self.queue_depth,
        })
    }
}

fn frames_json(f: &StreamFrames) -> serde_json::Value {
    serde_json::json!({
        "writes": f.writes,
        "a_sent": f.a_sent,
        "b_sent": f.b_sent,
        "secs": f.secs,
        "per_write": f.per_write(),
        "acks_per_write": f.acks_per_write(),
    })
}

/// Brings `n` RC QPs of a bare engine to RTS, each towards a QP of `peer` (through one
/// PD and CQ that must exist); returns their numbers. The bench measures what this costs.
pub fn idle_engine_qps(
    e: &mut Engine,
    pd: u32,
    cq: u32,
    peer: Ipv4Addr,
    n: usize,
) -> Result<Vec<u32>, String> {
    let mut qpns = Vec::with_capacity(n);
    for i in 0..n {
        let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
        init.cap.max_send_wr = 16;
        init.cap.max_recv_wr = 16;
        let q = e.create_qp(&init).map_err(|x| x.to_string())?;
        rc_to_rts(e, q, 0x100 + i as u32, IpAddr::V4(peer), Mtu::Mtu1024)
            .map_err(|x| x.to_string())?;
        qpns.push(q);
    }
    Ok(qpns)
}

/// Takes a bare engine's RC QP `q` from RESET to RTS towards `dest_qpn` at `peer`, with
/// all access rights and `ibv_rc_pingpong`'s timers (PSNs 0, 16 READs/atomics each way).
pub fn rc_to_rts(
    e: &mut Engine,
    q: u32,
    dest_qpn: u32,
    peer: IpAddr,
    mtu: Mtu,
) -> Result<(), crate::verbs::Error> {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE;
    e.modify_qp(
        q,
        &at,
        base | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )?;
    at.qp_state = QpState::Rtr;
    at.path_mtu = mtu;
    at.dest_qp_num = dest_qpn;
    at.max_dest_rd_atomic = 16;
    at.min_rnr_timer = 12;
    at.ah_attr = AddressVector::new(gid_of(peer), 1);
    e.modify_qp(
        q,
        &at,
        base | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )?;
    at.qp_state = QpState::Rts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 16;
    e.modify_qp(
        q,
        &at,
        base | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
}

/// QPs the bare-engine measurement creates: enough that memory the allocator already
/// holds free (after other benches in the same run) hides little of the growth.
const MEASURED_QPS: usize = 10_000;

/// Resident bytes a bare engine grows by per idle QP, `n` of them, measured on a thread
/// of its own (glibc gives a new thread an arena of its own while it can, so memory
/// freed elsewhere rarely hides the growth).
fn engine_bytes_per_qp(n: usize) -> Result<f64, String> {
    std::thread::spawn(move || {
        let (me, peer) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let mut e = Engine::new(DeviceConfig::new([2, 0, 0, 0, 0, 1], me));
        e.set_neighbor(IpAddr::V4(peer), [2, 0, 0, 0, 0, 2]);
        let pd = e.alloc_pd().map_err(|x| x.to_string())?;
        let cq = e.create_cq(64).map_err(|x| x.to_string())?;
        // One first, so that what every engine allocates once is not counted.
        idle_engine_qps(&mut e, pd, cq, peer, 1)?;
        let before = rss_kib();
        idle_engine_qps(&mut e, pd, cq, peer, n)?;
        let after = rss_kib();
        if before == 0 {
            return Err("cannot read this process's resident memory".to_string());
        }
        Ok(after.saturating_sub(before) as f64 * 1024.0 / n as f64)
    })
    .join()
    .map_err(|_| "the engine measurement thread panicked".to_string())?
}

/// The many-QP stream: QP i of `a` writes into its own `depth` slots of `b`'s region at
/// `size` each; every completion is reposted on its QP until `span` has passed, then
/// the outstanding ones complete and every slot is compared. Returns the report and the
/// WRITEs each QP completed.
fn many_stream(
    a: &[Endpoint],
    b: &[Endpoint],
    size: usize,
    depth: usize,
    span: Duration,
) -> Result<(workload::Report, Vec<u64>), String> {
    let slots = a.len() * depth;
    let (src, dst) = (&a[0], &b[0]);
    let data = workload::pattern(0x9b5 + size as u64, slots * size);
    let mem_err = workload::mem_err;
    src.mem.write(0, &data).map_err(mem_err)?;
    dst.mem.fill(0, slots * size, 0).map_err(mem_err)?;
    let post = |slot: usize| {
        let off = slot * size;
        let sge = [src.sge(off, size)];
        let wr = SendWr::write(slot as u64, &sge, dst.mr.addr + off as u64, dst.mr.rkey);
        a[slot / depth].qp.post_send(&wr).map_err(|e| e.to_string())
    };
    let mut done = vec![0u64; a.len()];
    let mut out = 0usize;
    let start = Instant::now();
    // Round-robin: QP 0, 1, ..., N-1, then each QP's second WRITE, and so on.
    for j in 0..depth {
        for i in 0..a.len() {
            post(i * depth + j)?;
            out += 1;
        }
    }
    let mut open = true;
    let mut n = 0u64;
    while out > 0 {
        // All of A's QPs share one CQ.
        let w = src.next_ok(Duration::from_secs(2))?;
        if w.opcode != WcOpcode::RdmaWrite {
            return Err(format!("a {:?} completion in a WRITE stream", w.opcode));
        }
        let slot = w.wr_id as usize;
        if slot >= slots {
            return Err(format!("a completion for slot {slot} of {slots}"));
        }
        done[slot / depth] += 1;
        n += 1;
        if open && n.is_multiple_of(16) {
            open = start.elapsed() < span;
        }
        if open {
            post(slot)?;
        } else {
            out -= 1;
        }
    }
    let elapsed = start.elapsed();
    if dst.mem.to_vec(0, slots * size).map_err(mem_err)? != data {
        return Err("the N-QP stream's destination differs from its source".into());
    }
    Ok((
        workload::Report {
            ops: n,
            bytes: n * size as u64,
            elapsed,
            rtt_ns: Vec::new(),
        },
        done,
    ))
}

/// Runs `bench qps` (root: it creates two namespaces).
pub fn qps(o: &QpsOpts, say: &mut dyn FnMut(&str)) -> Result<QpsReport, String> {
    if !(2..=16384).contains(&o.qps) {
        return Err(format!("--qps {}: 2 to 16384", o.qps));
    }
    if o.reps == 0 || !(1..=16).contains(&o.depth) {
        return Err("--reps at least 1, --depth 1 to 16".into());
    }
    if !(1..=1 << 20).contains(&o.size) || o.qps * o.depth * o.size > 256 << 20 {
        return Err(format!(
            "-s {}: 1 B to 1 MiB, and at most 256 MiB for all QPs' slots",
            o.size
        ));
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let engine_bytes = engine_bytes_per_qp(MEASURED_QPS)?;
    say(&format!(
        "a bare engine: {engine_bytes:.0} resident bytes per idle RC QP in RTS \
         ({MEASURED_QPS} QPs)"
    ));
    let netdev_mtu = if o.mtu == Mtu::Mtu4096 { 4200 } else { 1500 };
    let pair = Pair::new("roce-qps", 25, netdev_mtu)?;
    say(&format!(
        "A {} ({}), B {} ({}) on {}",
        pair.a.name, pair.ip_a, pair.b.name, pair.ip_b, pair.ifname
    ));
    let single_depth = ((4 << 20) / o.size).clamp(4, 128);
    let mem = (o.qps * o.depth).max(single_depth) * o.size + 8192;
    let (a0, b0) = super::rc_pair_on(&pair, BenchLink::Xdp, Some(o.mtu), mem, false)?;
    let link = a0.dev.info().link.clone();
    let queue_depth = 16u32.max(o.depth as u32);
    let eo = EndpointOpts {
        send_wr: queue_depth,
        recv_wr: queue_depth,
        ..EndpointOpts::new(QpType::Rc, 0)
    };
    let t = Instant::now();
    let rss0 = rss_kib();
    let (mut a, mut b) = (vec![a0], vec![b0]);
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    for i in 1..o.qps {
        let (qa, qb) = (
            a[0].sharing(&eo).map_err(|e| e.to_string())?,
            b[0].sharing(&eo).map_err(|e| e.to_string())?,
        );
        let (pa, pb) = (0x1000 + i as u32, 0x80_0000 + i as u32);
        qa.connect(&qb.local(pb, ip_a), &ConnectOpts::new(o.mtu, pa))
            .map_err(|e| e.to_string())?;
        qb.connect(&qa.local(pa, ip_b), &ConnectOpts::new(o.mtu, pb))
            .map_err(|e| e.to_string())?;
        a.push(qa);
        b.push(qb);
    }
    let grew = rss_kib().saturating_sub(rss0) as f64 * 1024.0;
    let process_bytes = grew / (2 * (o.qps - 1)) as f64;
    say(&format!(
        "{} QP pairs created and connected in {:.2} s; this process grew by {:.0} bytes per QP",
        o.qps,
        t.elapsed().as_secs_f64(),
        process_bytes
    ));
    // Warm-up of both streams, not counted.
    super::stream_for(
        &a[0],
        &b[0],
        Stream::Write,
        o.size,
        single_depth,
        Duration::from_millis(100),
    )?;
    many_stream(&a, &b, o.size, o.depth, Duration::from_millis(100))?;
    let mut reps = Vec::new();
    // Frames each side's engine sent so far.
    let sent = || -> Result<(u64, u64), String> {
        let c = |e: &Endpoint| e.dev.counters().map(|c| c.sent_pkts);
        Ok((
            c(&a[0]).map_err(|e| e.to_string())?,
            c(&b[0]).map_err(|e| e.to_string())?,
        ))
    };
    let frames = |before: (u64, u64), after: (u64, u64), r: &workload::Report| StreamFrames {
        writes: r.ops,
        a_sent: after.0 - before.0,
        b_sent: after.1 - before.1,
        secs: r.elapsed.as_secs_f64(),
    };
    // The one QP's stream, with what it sent.
    let single_stream = || -> Result<StreamFrames, String> {
        let s0 = sent()?;
        let r = super::stream_for(&a[0], &b[0], Stream::Write, o.size, single_depth, o.stream)?;
        Ok(frames(s0, sent()?, &r))
    };
    // A's packets resent and the frames B had no room for, so far.
    let counts = || -> Result<(u64, u64), String> {
        let c = a[0].dev.counters().map_err(|e| e.to_string())?;
        Ok((c.retransmitted_pkts, b[0].dev.stats().rx_no_room))
    };
    let mut opening = single_stream()?;
    for rep in 0..o.reps {
        let probe = super::CoreProbe::start();
        let before = counts()?;
        let s1 = sent()?;
        let (many, per_qp) = many_stream(&a, &b, o.size, o.depth, o.stream)?;
        let many_frames = frames(s1, sent()?, &many);
        let after = counts()?;
        let closing = single_stream()?;
        let r = QpsRep {
            single_before: opening,
            single_after: closing,
            many_frames,
            active: per_qp.iter().filter(|&&n| n > 0).count(),
            fewest: per_qp.iter().copied().min().unwrap_or(0),
            most: per_qp.iter().copied().max().unwrap_or(0),
            retransmitted: after.0 - before.0,
            rx_no_room: after.1 - before.1,
        };
        say(&format!(
            "rep {}: 1 QP {:.2} Gbit/s ({:.2} before, {:.2} after), {} QPs {:.2} Gbit/s, ratio \
             {:.2} (frame rate {:.2} x frames per WRITE {:.2}; B's ACKs per WRITE {:.2} with 1 \
             QP, {:.2} with {}), {} WRITEs per QP at least, {} at most, {} packets resent, {} \
             frames B had no room for{}",
            rep + 1,
            r.single_frames().gbps(o.size),
            r.single_before.gbps(o.size),
            r.single_after.gbps(o.size),
            o.qps,
            r.many_frames.gbps(o.size),
            r.ratio(),
            r.frame_rate_ratio(),
            r.frames_per_write_ratio(),
            r.single_frames().acks_per_write(),
            r.many_frames.acks_per_write(),
            o.qps,
            r.fewest,
            r.most,
            r.retransmitted,
            r.rx_no_room,
            probe.end_clause()
        ));
        opening = closing;
        reps.push(r);
    }
    Ok(QpsReport {
        opts: o.clone(),
        reps,
        single_depth,
        engine_bytes_per_qp: engine_bytes,
        process_bytes_per_qp: process_bytes,
        queue_depth,
        link,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::bench::BenchReport;

    fn frames(writes: u64, a_sent: u64, b_sent: u64, secs: f64) -> StreamFrames {
        StreamFrames {
            writes,
            a_sent,
            b_sent,
            secs,
        }
    }

    /// The counts of one repetition of `bench qps` on the AMD machine (4 KiB WRITEs at
    /// IB MTU 1024; taken before the one QP streamed on both sides of the N, so its one
    /// 0.5 s stream is split here in two halves): the goodput ratio splits exactly into
    /// its two factors.
    #[test]
    fn the_goodput_ratio_is_the_frame_rate_ratio_times_the_frames_per_write_ratio() {
        let (before, after, many) = (
            frames(34_280, 137_184, 8_586, 0.250),
            frames(34_280, 137_184, 8_587, 0.250),
            frames(56_519, 226_076, 56_519, 0.508),
        );
        let r = QpsRep {
            single_before: before,
            single_after: after,
            many_frames: many,
            active: 1000,
            fewest: 56,
            most: 57,
            retransmitted: 0,
            rx_no_room: 0,
        };
        assert_eq!(r.single_frames(), frames(68_560, 274_368, 17_173, 0.5));
        assert!(
            (r.single_frames().gbps(4096) - 4.4931).abs() < 1e-3,
            "{r:?}"
        );
        assert!((r.ratio() - 0.8114).abs() < 1e-3, "{r:?}");
        assert!((r.ratio() - r.frame_rate_ratio() * r.frames_per_write_ratio()).abs() < 1e-9);
        assert!((r.frames_per_write_ratio() - 0.8505).abs() < 1e-3, "{r:?}");
        assert!((r.frame_rate_ratio() - 0.9540).abs() < 1e-3, "{r:?}");
        assert!((many.acks_per_write() - 1.0).abs() < 1e-9);
        let report = QpsReport {
            opts: QpsOpts::default(),
            reps: vec![r],
            single_depth: 128,
            engine_bytes_per_qp: 1350.0,
            process_bytes_per_qp: 8368.0,
            queue_depth: 16,
            link: "sim".into(),
        };
        let t = report.table();
        assert!(t.contains("0.25 / 1.00"), "{t}");
        assert!(t.contains("(N QPs over 1; median 0.95)"), "{t}");
        assert!(t.contains("(1 QP over N; median 0.85)"), "{t}");
        let j = report.to_json();
        assert_eq!(j["reps"][0]["many_frames"]["b_sent"], 56_519);
        assert_eq!(j["reps"][0]["single_frames"]["writes"], 68_560);
    }

    /// The one QP's streams before and after the N pool into one: their WRITEs over
    /// their time, so a slow stream and a fast one of the same length meet in the middle.
    #[test]
    fn two_streams_pool() {
        let (x, y) = (frames(100, 400, 25, 0.5), frames(60, 240, 15, 0.5));
        assert_eq!(x.plus(&y), frames(160, 640, 40, 1.0));
        assert_eq!(x.plus(&y).per_sec(), 680.0);
        let g = |f: StreamFrames| f.gbps(1_000_000);
        assert!((g(x.plus(&y)) - (g(x) + g(y)) / 2.0).abs() < 1e-9);
    }

    /// A stream that completed nothing divides by one, not by zero.
    #[test]
    fn an_empty_stream_gives_finite_figures() {
        let z = StreamFrames::default();
        assert_eq!(
            (z.per_write(), z.per_sec(), z.acks_per_write()),
            (0.0, 0.0, 0.0)
        );
    }
}

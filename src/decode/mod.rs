//! `roce-xdp decode FILE`: explains a capture, frame by frame, header by header.
//!
//! Four views of the same pass over the file: the full explanation (default), one line
//! per frame (`--brief`), a sequence diagram per QP connection (`--ladder`), and one JSON
//! object per frame (`--json`). The first three end with a summary. `--check` prints
//! only what is wrong: the first frame that fails a check (checksums, ICRC, structure)
//! explained in full, and the requests sent again and again (a stall: the receiver
//! dropped them or their answers), for the interop harness to name the culprit.

pub mod explain;
pub mod fields;
pub mod flows;
pub mod html;
pub mod json;
pub mod ladder;

use crate::capture::{Capture, CaptureError, LinkType, Packet};
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::{Error as WireError, Frame, Opcode};
use flows::{FlowKey, Observation, Tracker};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Full,
    /// `Full` with each frame's bytes, fields marked.
    Hex,
    Brief,
    Ladder,
    Json,
    Check,
}

/// Why `decode` stopped.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

/// Everything learnt about one RoCE frame in the pass, shared by the views.
pub struct Seen<'a> {
    pub packet: Packet<'a>,
    /// Seconds since the first frame of the file.
    pub rel_time: f64,
    pub frame: Frame<'a>,
    pub obs: Observation,
    pub icrc_ok: bool,
}

impl<'a> Seen<'a> {
    /// Checks the ICRC and feeds the frame to `tracker` (a commented frame of a sampled
    /// capture starts a section first: frames before it were left out).
    pub fn observe(
        tracker: &mut Tracker,
        packet: Packet<'a>,
        rel_time: f64,
        frame: Frame<'a>,
    ) -> Seen<'a> {
        let icrc_ok = frame.verify_icrc().is_ok();
        if packet.comment.is_some() {
            tracker.section_break();
        }
        let obs = tracker.observe(packet.index, rel_time, &frame, icrc_ok);
        Seen {
            packet,
            rel_time,
            frame,
            obs,
            icrc_ok,
        }
    }
}

/// Counts for the closing summary.
#[derive(Default)]
struct Summary {
    frames: usize,
    roce: usize,
    other: BTreeMap<String, usize>,
    malformed: Vec<(usize, String)>,
    per_opcode: BTreeMap<u8, usize>,
    icrc_bad: Vec<usize>,
    retransmitted: Vec<Resent>,
    /// Retransmitted packets by cause: after a sequence NAK, an RNR NAK, a timeout.
    causes: [usize; 3],
    naks: Vec<(usize, String)>,
    /// `--check`: the first bad frame, explained.
    first_bad: Option<String>,
    bad: usize,
    /// `--check`: request (flow, PSN) -> (first frame, times sent, explanation of it).
    sends: std::collections::HashMap<SendKey, (usize, u32)>,
    /// `--check`: the highest PSN any response of a flow carried (ACK, NAK, RNR NAK,
    /// READ response, atomic ACK): requests up to it were answered.
    answered: std::collections::HashMap<FlowKey, crate::wire::Psn>,
}

/// One retransmitted request, for the summary.
struct Resent {
    frame: usize,
    key: FlowKey,
    psn: u32,
    cause: Option<flows::Cause>,
    why: String,
}

/// Index into `Summary::causes`: go-back-N after a sequence NAK or a lost READ
/// response, after an RNR NAK, after a timeout (None: cause unknown, counted nowhere).
fn cause_class(c: Option<flows::Cause>) -> Option<usize> {
    Some(match c? {
        flows::Cause::SeqNak { .. } | flows::Cause::ReadGap { .. } => 0,
        flows::Cause::RnrNak { .. } => 1,
        flows::Cause::Timeout { .. } => 2,
    })
}

/// Whether `r` continues the round `prev` began: the same flow sent again for the same
/// reason (the same NAK or READ response; for a timeout, the next PSN).
fn same_round(prev: &Resent, r: &Resent) -> bool {
    use flows::Cause::*;
    prev.key == r.key
        && match (prev.cause, r.cause) {
            (Some(SeqNak { nak: a }), Some(SeqNak { nak: b }))
            | (Some(RnrNak { nak: a }), Some(RnrNak { nak: b }))
            | (Some(ReadGap { response: a }), Some(ReadGap { response: b })) => a == b,
            (Some(Timeout { .. }), Some(Timeout { .. })) => {
                r.psn == (prev.psn + 1) & crate::wire::Psn::MASK
            }
            _ => false,
        }
}

/// The retransmissions grouped by cause, then in rounds (one NAK or timeout resends a
/// run of PSNs): each cause's first rounds, each shown by its first packet, so a capture
/// whose first rounds were timeouts still shows a go-back-N after a NAK.
fn retransmission_rounds(out: &mut String, all: &[Resent]) {
    const ROUNDS: usize = 5;
    const TITLES: [&str; 3] = [
        "in go-back-N after a sequence NAK or a lost READ response",
        "after an RNR NAK",
        "after a retransmit timeout",
    ];
    // (class, first, last, count) per round, in capture order.
    let mut rounds: Vec<(Option<usize>, &Resent, &Resent, usize)> = Vec::new();
    for r in all {
        match rounds.last_mut() {
            Some((_, _, last, n)) if same_round(last, r) => {
                *last = r;
                *n += 1;
            }
            _ => rounds.push((cause_class(r.cause), r, r, 1)),
        }
    }
    for class in [Some(0), Some(1), Some(2), None] {
        let of: Vec<_> = rounds.iter().filter(|r| r.0 == class).collect();
        if of.is_empty() {
            continue;
        }
        let psns: usize = of.iter().map(|r| r.3).sum();
        let _ = writeln!(
            out,
            "    {}: {psns} PSNs in {} round(s){}",
            class.map_or("cause not in the capture", |c| TITLES[c]),
            of.len(),
            if of.len() > ROUNDS {
                format!(", the first {ROUNDS}")
            } else {
                String::new()
            }
        );
        for (_, first, last, n) in of.iter().take(ROUNDS) {
            let _ = writeln!(
                out,
                "      frame {}: PSN 0x{:06x} to {} QP 0x{:06x}: {}",
                first.frame, first.psn, first.key.responder, first.key.responder_qp, first.why
            );
            if *n > 1 {
                let _ = writeln!(
                    out,
                    "        and {} more PSN(s) of the same round, up to 0x{:06x} (frame {})",
                    n - 1,
                    last.psn,
                    last.frame
                );
            }
        }
    }
}

/// What kind of non-RoCE frame this is, in a few words.
fn describe_other(p: &Packet<'_>, err: &WireError) -> (String, String) {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let sliced = match p.link {
        LinkType::Ethernet => SlicedPacket::from_ethernet(p.data).ok(),
        LinkType::LinuxSll => SlicedPacket::from_linux_sll(p.data).ok(),
        _ => SlicedPacket::from_ip(p.data).ok(),
    };
    let Some(s) = sliced else {
        return ("unparsable".into(), format!("not RoCE ({err})"));
    };
    let (src, dst) = match &s.net {
        Some(NetSlice::Ipv4(h)) => (
            h.header().source_addr().to_string(),
            h.header().destination_addr().to_string(),
        ),
        Some(NetSlice::Ipv6(h)) => (
            h.header().source_addr().to_string(),
            h.header().destination_addr().to_string(),
        ),
        _ => (String::new(), String::new()),
    };
    let well_known = |port: u16| match port {
        18515 => " (the TCP side channel of ibv_*_pingpong and perftest: QPN/PSN/GID exchange)",
        4791 => " (RoCEv2, but not a valid packet)",
        _ => "",
    };
    match (&s.transport, err) {
        (Some(TransportSlice::Tcp(t)), _) => {
            let mut note = well_known(t.destination_port());
            if note.is_empty() {
                note = well_known(t.source_port());
            }
            (
                "TCP".into(),
                format!(
                    "TCP {src}:{} -> {dst}:{}{note}",
                    t.source_port(),
                    t.destination_port()
                ),
            )
        }
        (Some(TransportSlice::Udp(u)), _) => (
            format!("UDP port {}", u.destination_port()),
            format!(
                "UDP {src}:{} -> {dst}:{}",
                u.source_port(),
                u.destination_port()
            ),
        ),
        (Some(TransportSlice::Icmpv4(_)), _) => ("ICMP".into(), format!("ICMP {src} -> {dst}")),
        (Some(TransportSlice::Icmpv6(_)), _) => ("ICMPv6".into(), format!("ICMPv6 {src} -> {dst}")),
        (_, WireError::NotIp(0x0806)) => ("ARP".into(), "ARP".into()),
        (_, WireError::NotIp(t)) => (
            format!("EtherType 0x{t:04x}"),
            format!("EtherType 0x{t:04x}"),
        ),
        (_, WireError::Fragmented) => ("IP fragment".into(), format!("IP fragment {src} -> {dst}")),
        (_, e) => ("other".into(), format!("{src} -> {dst} ({e})")),
    }
}

/// A frame that claims to be RoCEv2 (UDP port 4791) but does not parse.
fn is_broken_roce(e: &WireError) -> bool {
    !e.is_not_roce()
}

/// The short label of a RoCE frame used by `--brief` and the ladder.
pub fn short_label(f: &Frame<'_>) -> String {
    let r = f.roce();
    let b = r.bth();
    let mut s = format!("{} psn 0x{:06x}", r.info().name, b.psn().value());
    if let Some(a) = r.aeth() {
        match a.syndrome() {
            Syndrome::Ack { .. } => {
                let _ = write!(s, " ACK msn {}", a.msn());
            }
            // Short names here; the ladder's marks and the full view explain them.
            Syndrome::Nak(c) => {
                let _ = write!(
                    s,
                    " NAK {}",
                    match c {
                        NakCode::PsnSequenceError => "PSN sequence error".to_string(),
                        NakCode::InvalidRequest => "invalid request".to_string(),
                        NakCode::RemoteAccessError => "remote access error".to_string(),
                        NakCode::RemoteOperationalError => "remote operational error".to_string(),
                        NakCode::InvalidRdRequest => "invalid RD request".to_string(),
                        NakCode::Reserved(x) => format!("reserved code {x}"),
                    }
                );
            }
            other => {
                let _ = write!(s, " {other}");
            }
        }
    }
    if let Some(h) = r.reth() {
        let _ = write!(s, " len {}", h.dma_len());
    }
    if b.ack_req() && r.info().request && r.info().transport == crate::wire::Transport::Rc {
        s.push_str(" ackreq");
    }
    if b.dest_qp() == 1
        && let Some(tag) = explain::cm_tag(r.payload())
    {
        let _ = write!(s, " [{tag}]");
    }
    s
}

/// Decodes `path` in `mode`; returns the number of problems `--check` found (0 in the
/// other modes).
pub fn run(path: &Path, mode: Mode, out: &mut dyn Write) -> Result<usize, DecodeError> {
    run_frames(path, mode, None, out)
}

/// As [`run`], showing only frames `first..=last` (every frame is still tracked, so
/// retransmissions and pairings are those of the whole capture); no summary then.
pub fn run_frames(
    path: &Path,
    mode: Mode,
    frames: Option<(usize, usize)>,
    out: &mut dyn Write,
) -> Result<usize, DecodeError> {
    run_capture(&Capture::open(path)?, mode, frames, out)
}

/// As [`run_frames`], on a capture already in memory (`Capture::from_bytes`).
pub fn run_capture(
    cap: &Capture,
    mode: Mode,
    frames: Option<(usize, usize)>,
    out: &mut dyn Write,
) -> Result<usize, DecodeError> {
    let packets = cap.packets()?;
    let mut tracker = Tracker::default();
    let mut ladder = ladder::Ladder::default();
    let mut sum = Summary::default();
    let mut t0 = None;
    let mut failure = None;
    let mut text = String::new();

    for item in packets {
        let p = match item {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        sum.frames += 1;
        let t0 = *t0.get_or_insert(p.time);
        let rel = p.time.saturating_sub(t0).as_secs_f64();
        text.clear();
        let shown = frames.is_none_or(|(a, b)| (a..=b).contains(&p.index));
        if !shown && mode != Mode::Check {
            if let Ok(f) = p.roce() {
                Seen::observe(&mut tracker, p, rel, f);
            }
            continue;
        }
        match p.roce() {
            Ok(f) => {
                sum.roce += 1;
                let seen = Seen::observe(&mut tracker, p, rel, f);
                record(&mut sum, &seen);
                if mode == Mode::Check {
                    check_frame(&mut sum, &seen);
                }
                match mode {
                    Mode::Full => full(&mut text, &seen, false),
                    Mode::Hex => full(&mut text, &seen, true),
                    Mode::Brief => brief(&mut text, &seen),
                    Mode::Ladder => ladder.push(&seen),
                    Mode::Json => json::roce(&mut text, &seen),
                    Mode::Check => {}
                }
            }
            Err(e) => {
                let (kind, what) = describe_other(&p, &e);
                let broken = is_broken_roce(&e);
                let cut = (p.orig_len as usize) > p.data.len();
                if broken {
                    let why = if cut {
                        format!("{e} (the capture's snap length cut the frame)")
                    } else {
                        e.to_string()
                    };
                    sum.malformed.push((p.index, why));
                } else {
                    *sum.other.entry(kind).or_insert(0) += 1;
                }
                match mode {
                    Mode::Full | Mode::Hex => {
                        if broken {
                            let _ = writeln!(
                                text,
                                "Frame {}  t={rel:.6}s  {} bytes  MALFORMED RoCEv2: {}\n",
                                p.index,
                                p.data.len(),
                                sum.malformed.last().map_or("", |m| m.1.as_str())
                            );
                        } else {
                            let _ = writeln!(
                                text,
                                "Frame {}  t={rel:.6}s  {} bytes  not RoCE: {what}\n",
                                p.index,
                                p.data.len()
                            );
                        }
                    }
                    Mode::Brief => {
                        let _ = writeln!(
                            text,
                            "{:>6} {rel:>11.6}  {}",
                            p.index,
                            if broken {
                                format!("MALFORMED RoCEv2: {e}")
                            } else {
                                format!("(not RoCE) {what}")
                            }
                        );
                    }
                    Mode::Ladder => {}
                    Mode::Check => {
                        if broken {
                            sum.bad += 1;
                            if sum.first_bad.is_none() {
                                sum.first_bad = Some(format!(
                                    "frame {} t={rel:.6}s: MALFORMED RoCEv2: {}\n",
                                    p.index,
                                    sum.malformed.last().map_or("", |m| m.1.as_str())
                                ));
                            }
                        }
                    }
                    Mode::Json => json::other(&mut text, &p, rel, &e, broken),
                }
            }
        }
        out.write_all(text.as_bytes())?;
    }

    if mode == Mode::Ladder {
        text.clear();
        ladder.render(&mut text, &tracker);
        out.write_all(text.as_bytes())?;
    }
    let mut problems = 0;
    if mode == Mode::Check {
        text.clear();
        problems = check_report(&mut text, &sum);
        out.write_all(text.as_bytes())?;
    } else if mode != Mode::Json && frames.is_none() {
        text.clear();
        summary(&mut text, &sum, &tracker);
        out.write_all(text.as_bytes())?;
    }
    out.flush()?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(problems),
    }
}

/// A request of one flow: (flow, PSN).
type SendKey = (FlowKey, u32);

/// A request sent this many times is reported as unanswered.
const STALL_SENDS: u32 = 3;

fn check_frame(sum: &mut Summary, s: &Seen<'_>) {
    let f = &s.frame;
    if let Err(e) = f.verify() {
        sum.bad += 1;
        if sum.first_bad.is_none() {
            let mut t = format!("first bad frame: {} ({e})\n", s.packet.index);
            full(&mut t, s, false);
            sum.first_bad = Some(t);
        }
    }
    let r = f.roce();
    let Some(k) = s.obs.flow else { return };
    let psn = r.bth().psn();
    // Only RC requests are answered; UC and UD (the CM's MADs on QP1 among them, whose
    // PSNs start again at 0 with every process) never are.
    if r.info().request && r.info().transport == crate::wire::opcode::Transport::Rc {
        let e = sum
            .sends
            .entry((k, psn.value()))
            .or_insert((s.packet.index, 0));
        e.1 += 1;
    } else if s.icrc_ok {
        let a = sum.answered.entry(k).or_insert(psn);
        if psn.is_after(*a) {
            *a = psn;
        }
    }
}

/// The `--check` report; returns how many problems it found.
fn check_report(out: &mut String, s: &Summary) -> usize {
    // Sent again and again and never answered: no response of its flow reached its PSN.
    let mut stalls: Vec<(&SendKey, &(usize, u32))> = s
        .sends
        .iter()
        .filter(|((k, psn), v)| {
            v.1 >= STALL_SENDS
                && s.answered
                    .get(k)
                    .is_none_or(|a| crate::wire::Psn::new(*psn).is_after(*a))
        })
        .collect();
    stalls.sort_by_key(|(_, v)| v.0);
    let _ = writeln!(
        out,
        "check: {} frames, {} RoCEv2, {} failing a check, {} requests sent {STALL_SENDS} times or more and never answered",
        s.frames,
        s.roce,
        s.bad,
        stalls.len()
    );
    if let Some(b) = &s.first_bad {
        out.push_str(b);
    }
    for ((k, psn), (first, n)) in stalls.iter().take(10) {
        let _ = writeln!(
            out,
            "unanswered: frame {first}: PSN 0x{psn:06x} from {} to {} QP 0x{:06x} was sent {n} times; \
             the receiver dropped it or its answer (bad ICRC, wrong QP state, PSN or key), or is gone",
            k.requester, k.responder, k.responder_qp
        );
    }
    if s.bad == 0 && stalls.is_empty() {
        let _ = writeln!(
            out,
            "check: every frame passes, no request was left unanswered"
        );
    }
    s.bad + stalls.len()
}

fn record(sum: &mut Summary, s: &Seen<'_>) {
    let r = s.frame.roce();
    let b = r.bth();
    *sum.per_opcode.entry(b.opcode().0).or_insert(0) += 1;
    if !s.icrc_ok {
        sum.icrc_bad.push(s.packet.index);
    }
    if s.obs.retransmission
        && let Some(k) = s.obs.flow
    {
        let cause = match s.obs.story {
            flows::Story::Retransmit { cause, .. } => Some(cause),
            _ => None,
        };
        if let Some(c) = cause_class(cause) {
            sum.causes[c] += 1;
        }
        sum.retransmitted.push(Resent {
            frame: s.packet.index,
            key: k,
            psn: b.psn().value(),
            cause,
            why: flows::story_text(&s.obs.story, b.psn()).unwrap_or_default(),
        });
    }
    if let Some(a) = r.aeth() {
        match a.syndrome() {
            Syndrome::Ack { .. } => {}
            other => {
                let t = match (s.obs.story, flows::story_text(&s.obs.story, b.psn())) {
                    (flows::Story::SeqNak { .. }, Some(x)) => x,
                    (_, Some(x)) => format!("{other}: {x}"),
                    (_, None) => other.to_string(),
                };
                sum.naks.push((s.packet.index, t));
            }
        }
    }
}

fn full(out: &mut String, s: &Seen<'_>, hex: bool) {
    let f = &s.frame;
    let _ = writeln!(
        out,
        "Frame {}  t={:.6}s  {} bytes  {}:{} -> {}:4791",
        s.packet.index,
        s.rel_time,
        s.packet.data.len(),
        f.ip().src(),
        f.src_port(),
        f.ip().dst()
    );
    explain::lower_layers(out, f);
    explain::roce_layers(out, f);
    if let Some(t) = flows::story_text(&s.obs.story, f.roce().bth().psn()) {
        let what = if s.obs.retransmission {
            "retransmission"
        } else {
            "what happened"
        };
        let _ = writeln!(out, "  ** {what}: {t}");
    }
    if hex {
        fields::hex_view(out, f);
    }
    out.push('\n');
}

fn brief(out: &mut String, s: &Seen<'_>) {
    let f = &s.frame;
    let r = f.roce();
    let mut flags = String::new();
    if s.obs.retransmission {
        flags.push_str("  RETRANSMIT");
    }
    if !s.icrc_ok {
        flags.push_str("  BAD-ICRC");
    }
    let _ = writeln!(
        out,
        "{:>6} {:>11.6}  {} > {} qp 0x{:06x}  {}  payload {}  icrc {}{}",
        s.packet.index,
        s.rel_time,
        f.ip().src(),
        f.ip().dst(),
        r.bth().dest_qp(),
        short_label(f),
        r.payload_len(),
        if s.icrc_ok { "ok" } else { "BAD" },
        flags
    );
}

fn summary(out: &mut String, s: &Summary, t: &Tracker) {
    let _ = writeln!(out, "Summary");
    let other: usize = s.other.values().sum();
    let _ = writeln!(
        out,
        "  frames: {} total, {} RoCEv2, {} other, {} malformed RoCEv2",
        s.frames,
        s.roce,
        other,
        s.malformed.len()
    );
    if other > 0 {
        let parts: Vec<String> = s.other.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let _ = writeln!(out, "  non-RoCE frames skipped: {}", parts.join(", "));
    }
    for (i, why) in s.malformed.iter().take(20) {
        let _ = writeln!(out, "  malformed: frame {i}: {why}");
    }
    if s.icrc_bad.is_empty() {
        let _ = writeln!(out, "  ICRC: all {} RoCEv2 frames ok", s.roce);
    } else {
        let list: Vec<String> = s.icrc_bad.iter().take(20).map(|i| i.to_string()).collect();
        let _ = writeln!(
            out,
            "  ICRC failures: {} (frames {}{})",
            s.icrc_bad.len(),
            list.join(", "),
            if s.icrc_bad.len() > 20 { ", ..." } else { "" }
        );
    }
    let _ = writeln!(out, "  frames per opcode:");
    for (op, n) in &s.per_opcode {
        let _ = writeln!(out, "    0x{op:02x} {:<36} {n:>7}", Opcode(*op).name());
    }
    let mut flows: Vec<(&FlowKey, &flows::FlowStats)> = t.flows.iter().collect();
    flows.sort_by_key(|(_, st)| st.first_frame);
    let _ = writeln!(out, "  QP flows (requester -> responder):");
    for (k, st) in flows {
        let _ = writeln!(
            out,
            "    {}  {} requests, {} responses, {} payload bytes{}{}{}",
            ladder::flow_title(k, st),
            st.requests,
            st.responses,
            st.payload_bytes,
            if st.retransmissions > 0 {
                format!(", {} retransmitted", st.retransmissions)
            } else {
                String::new()
            },
            if st.naks > 0 {
                format!(", {} NAKs", st.naks)
            } else {
                String::new()
            },
            if st.rnr_naks > 0 {
                format!(", {} RNR NAKs", st.rnr_naks)
            } else {
                String::new()
            }
        );
        let _ = writeln!(out, "      {}", flows::facts(st));
    }
    if s.retransmitted.is_empty() {
        let _ = writeln!(out, "  retransmitted PSNs: none");
    } else {
        let _ = writeln!(
            out,
            "  retransmitted PSNs: {} ({} in go-back-N after a sequence NAK or a lost READ response, {} after an RNR NAK, {} after a retransmit timeout)",
            s.retransmitted.len(),
            s.causes[0],
            s.causes[1],
            s.causes[2]
        );
        retransmission_rounds(out, &s.retransmitted);
    }
    if !s.naks.is_empty() {
        let _ = writeln!(out, "  NAKs: {}", s.naks.len());
        for (i, what) in s.naks.iter().take(20) {
            let _ = writeln!(out, "    frame {i}: {what}");
        }
    }
}

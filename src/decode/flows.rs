//! Conversation tracking for `decode`: which requests and responses belong to one QP
//! connection, and which requests are retransmissions.
//!
//! A request names only its destination QP; the requester's QP appears only as the
//! destination of the responses. So a request flow is keyed by (requester IP, responder
//! IP, responder QP) (plus the source QP from the DETH for UD), and a response is paired
//! with the request flow in the opposite direction whose PSN window holds the response's
//! PSN (ACKs and READ responses carry PSNs of requests). A pairing, once found, is kept.
//! A READ request reserves one PSN per response packet (IBA vol. 1, 9.4.4 and 9.7.1:
//! the next request's PSN skips them), so the window a response may fall in reaches to
//! the last PSN the flow's READs reserved, and each READ response is tied to the READ
//! whose reserved range holds its PSN.
//!
//! A request whose PSN lies inside the window already seen in its flow, i.e. from the
//! flow's first PSN (at most 2^22 back) up to its highest (requests and responses both advance it, so a READ
//! re-requested from its middle is caught too), is a retransmission. A PSN more than
//! [`NEW_CONNECTION_GAP`] before the window, or past the furthest PSN the flow could use
//! next, starts a new connection reusing the QP numbers (each rxe VM numbers its first QP 0x11, and each
//! connection starts at a random PSN): a flow of its own, numbered by `conn`.

use crate::wire::aeth::Syndrome;
use crate::wire::{Frame, Psn};
use std::collections::HashMap;
use std::net::IpAddr;

/// The requester-to-responder direction of a connection (or of a UD sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub requester: IpAddr,
    pub responder: IpAddr,
    /// The responder's QP (the DestQP of requests).
    pub responder_qp: u32,
    /// For UD: the sending QP, from the DETH.
    pub src_qp: Option<u32>,
    /// Which connection over these addresses and QP numbers: 0, 1, ... in capture order.
    pub conn: u32,
}

/// A request more than this before its flow's window, or past the furthest PSN the flow
/// could use next, is taken as a new connection's first. Requests follow each other
/// without gaps (a READ reserves the PSNs of its responses, counted at the smallest
/// MTU), and a retransmission, or a capture taken behind a lossy link, reaches back or
/// skips at most a send window (128 PSNs for rxe and roce-xdp). A new connection's random
/// start PSN is missed only when it falls inside the old connection's PSNs or within this
/// of them: for short connections (the tools' tests) once in several thousand, more often
/// after long ones or large READs.
pub const NEW_CONNECTION_GAP: u32 = 1024;

/// What is known about one flow.
#[derive(Debug, Clone, Default)]
pub struct FlowStats {
    /// The requester's QP, once a response revealed it.
    pub requester_qp: Option<u32>,
    pub first_frame: usize,
    pub requests: u64,
    pub responses: u64,
    pub payload_bytes: u64,
    pub retransmissions: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    window: Option<(Psn, Psn)>,
    /// The furthest PSN the flow may use next without a gap: its highest, or the last
    /// response PSN of a READ it asked for.
    reach: Option<Psn>,
    /// The flow's READ requests in capture order, with the responses tied to each.
    pub reads: Vec<ReadRequest>,
    /// Messages started (FIRST and ONLY requests, first transmissions).
    pub messages: u64,
    /// Lowest and highest request PSN seen.
    pub first_psn: Option<Psn>,
    pub last_psn: Option<Psn>,
    /// Highest PSN an ACK (or atomic ACK, or READ response) covered, and its frame.
    pub acked: Option<(Psn, usize)>,
    pub timeouts: u64,
    /// The latest requests: (PSN, frame, time), at most [`RECENT`].
    recent: std::collections::VecDeque<(Psn, usize, f64)>,
    /// The latest NAK or RNR NAK: (frame, PSN, sequence error?).
    last_nak: Option<(usize, Psn, bool)>,
    /// The latest response: (frame, time).
    last_response: Option<(usize, f64)>,
    /// The current retransmission burst: its last PSN, the furthest PSN its next
    /// request may take (past the responses a READ reserved), and its cause: the
    /// requests that follow on belong to the same go-back-N.
    burst: Option<(Psn, Psn, Cause)>,
    /// The NAK a retransmission burst already answered.
    nak_used: Option<usize>,
    /// Set at a section break of a sampled capture: the next request continues the
    /// flow wherever its PSN is, since the frames in between were left out.
    resync: bool,
    /// The latest READ response: (its frame, its PSN).
    read_gap: Option<(usize, Psn)>,
}

/// Requests remembered per flow to name the original of a retransmission and the
/// request a NAK refuses (a send window is 128 for rxe and roce-xdp).
const RECENT: usize = 4096;

/// Why the requester sent a PSN again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cause {
    /// Go-back-N after the PSN sequence error NAK in this frame (IBA 9.7.5.2.1).
    SeqNak { nak: usize },
    /// Sent again after the RNR NAK in this frame, once its timer ran out (IBA 9.7.5.2.8).
    RnrNak { nak: usize },
    /// A READ asked again from the response PSN that the READ response in this frame
    /// skipped (the response at that PSN was lost).
    ReadGap { response: usize },
    /// No ACK came within the local ACK timeout (IBA 9.7.6.1.3): the requester goes
    /// back to the oldest unacknowledged PSN. `since` is the time without any response
    /// of the flow (from the original's transmission or the last response, the later).
    Timeout { since: f64 },
}

/// What the capture tells about a frame beyond its headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Story {
    None,
    /// A request sent again: the first transmission's frame (if captured), why, and
    /// whether an answer had already covered it (the original then was not lost: its
    /// ACK was late or lost).
    Retransmit {
        original: Option<usize>,
        cause: Cause,
        answered_by: Option<usize>,
    },
    /// A PSN sequence error NAK: the responder expected `expected`; the request that
    /// arrived instead (latest captured request of the flow past it).
    SeqNak {
        expected: Psn,
        arrived: Option<(usize, Psn)>,
    },
    /// Any other NAK (remote access, invalid request, operational error) or an RNR NAK:
    /// the request it refuses, the one with its PSN.
    Refuses {
        request: Option<usize>,
    },
}

/// One RDMA READ request seen in a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Capture frame of the request.
    pub frame: usize,
    pub psn: Psn,
    /// DMA length asked for (RETH).
    pub len: u32,
    /// READ response packets tied to it so far (duplicates of a retransmitted READ
    /// included).
    pub responses: u32,
    /// Last PSN its responses can take: one per 256 bytes, the smallest path MTU.
    last: Psn,
    /// The response PSN expected next.
    next: Psn,
}

/// A READ response's PSN is searched among this many of its flow's latest READs (a
/// requester has at most `max_rd_atomic` of them outstanding: 128 at most for rxe and
/// roce-xdp, 16 for many hardware NICs).
const READ_LOOKBACK: usize = 512;

/// What the tracker says about one frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The flow, or `None` for a response no request flow explains.
    pub flow: Option<FlowKey>,
    pub response: bool,
    pub retransmission: bool,
    /// For a READ response: the frame of the READ request it answers.
    pub answers: Option<usize>,
    pub story: Story,
}

/// Tracks flows over a whole capture.
#[derive(Debug, Default)]
pub struct Tracker {
    pub flows: HashMap<FlowKey, FlowStats>,
    /// (responder IP, requester IP, requester QP) -> flow, learnt from responses.
    pairs: HashMap<(IpAddr, IpAddr, u32), FlowKey>,
    /// The connection number a request flow is at now.
    conns: HashMap<FlowKey, u32>,
}

/// Widest window kept: PSN comparisons hold within half the 2^24 space, so a long
/// connection's window slides forward instead of growing past it.
const MAX_WINDOW: u32 = 1 << 22;

fn widen(window: &mut Option<(Psn, Psn)>, psn: Psn) {
    match window {
        None => *window = Some((psn, psn)),
        Some((lo, hi)) if psn.is_after(*hi) => {
            *hi = psn;
            if psn.forward_from(*lo) > MAX_WINDOW {
                *lo = psn.sub(MAX_WINDOW);
            }
        }
        // A retransmission from before the first PSN captured: its answers belong here.
        Some((lo, hi)) if psn.is_before(*lo) && hi.forward_from(psn) <= MAX_WINDOW => *lo = psn,
        _ => {}
    }
}

fn extend(reach: &mut Option<Psn>, psn: Psn) {
    match reach {
        Some(r) if !psn.is_after(*r) => {}
        _ => *reach = Some(psn),
    }
}

/// The latest captured request of the flow with this PSN.
fn request_with(s: &FlowStats, psn: Psn) -> Option<usize> {
    s.recent
        .iter()
        .rev()
        .find(|(p, _, _)| *p == psn)
        .map(|&(_, i, _)| i)
}

/// Why a PSN was sent again, told from what the flow saw before it.
fn retransmit_story(s: &mut FlowStats, psn: Psn, last: Psn, read: bool, time: f64) -> Story {
    // The first transmission: the earliest remembered request with this PSN.
    let orig = s.recent.iter().find(|(p, _, _)| *p == psn).copied();
    let answered_by = s.acked.filter(|(a, _)| !psn.is_after(*a)).map(|(_, i)| i);
    // A READ asked again from the response PSN a gap skipped; a burst started at the
    // PSN of a NAK not yet answered by one; within a go-back-N burst (each request
    // following on from the last) the burst's cause; else a timeout.
    let cause = match (s.burst, s.last_nak) {
        // The latest READ response came from past this PSN: the one at it was lost,
        // and the requester asks for the rest of the READ at once. (Had it waited for
        // the timer, the responses would have stopped before this PSN.)
        _ if read && s.read_gap.is_some_and(|(_, p)| p.is_after(psn)) => {
            let g = s.read_gap.take().map_or(0, |(i, _)| i);
            Cause::ReadGap { response: g }
        }
        (_, Some((n, p, seq))) if s.nak_used != Some(n) && psn == p => {
            s.nak_used = Some(n);
            if seq {
                Cause::SeqNak { nak: n }
            } else {
                Cause::RnrNak { nak: n }
            }
        }
        (Some((prev, next, c)), _) if psn.is_after(prev) && !psn.is_after(next) => c,
        _ => {
            let from = orig.map_or(time, |o| o.2);
            let last = s.last_response.map_or(from, |(_, t)| t.max(from));
            s.timeouts += 1;
            Cause::Timeout { since: time - last }
        }
    };
    s.burst = Some((psn, last.add(1), cause));
    Story::Retransmit {
        original: orig.map(|o| o.1),
        cause,
        answered_by,
    }
}

/// A frame's story in words, citing the rules; `None` when there is nothing to tell.
pub fn story_text(story: &Story, psn: Psn) -> Option<String> {
    let p = psn.value();
    Some(match *story {
        Story::None => return None,
        Story::Retransmit {
            original,
            cause,
            answered_by,
        } => {
            let first = match original {
                Some(o) => format!("PSN 0x{p:06x} again (first sent in frame {o})"),
                None => {
                    format!("PSN 0x{p:06x} again (its first transmission is not in the capture)")
                }
            };
            let why = match cause {
                Cause::SeqNak { nak } => format!(
                    "go-back-N after the PSN sequence error NAK in frame {nak}: the requester resends from the PSN the responder expects (IBA 9.7.4, 9.7.5.2.1)"
                ),
                Cause::RnrNak { nak } => format!(
                    "after the RNR NAK in frame {nak}, once the RNR timer expired (IBA 9.7.5.2.8)"
                ),
                Cause::ReadGap { response } => format!(
                    "the READ asked again from its first missing response: the READ response in frame {response} skipped a PSN, so that response was lost (IBA 9.7.4)"
                ),
                Cause::Timeout { since } => format!(
                    "after a retransmit timeout: no response of this connection for {:.1} ms, so the requester went back to the oldest unacknowledged PSN (local ACK timeout, IBA 9.7.6.1.3)",
                    since * 1e3
                ),
            };
            let fate = match (answered_by, original) {
                (Some(a), _) => format!(
                    "; frame {a} had already acknowledged it, so the original was not lost (its answer was late, or the go-back-N resends everything after the lost packet)"
                ),
                (None, Some(o)) => format!(
                    "; nothing in the capture answered frame {o}: it or its answer was lost after the capture point"
                ),
                (None, None) => String::new(),
            };
            format!("{first}, {why}{fate}")
        }
        Story::SeqNak { expected, arrived } => match arrived {
            Some((i, got)) => format!(
                "PSN sequence error: the responder expected PSN 0x{:06x} and received PSN 0x{:06x} (frame {i}), so a packet in between was lost; it NAKs once, acknowledging everything before 0x{:06x} (IBA 9.7.5.1.1, 9.7.5.2.1)",
                expected.value(),
                got.value(),
                expected.value()
            ),
            None => format!(
                "PSN sequence error: the responder expected PSN 0x{:06x} and received a later one (not in the capture) (IBA 9.7.5.1.1, 9.7.5.2.1)",
                expected.value()
            ),
        },
        Story::Refuses { request } => match request {
            Some(i) => format!("answers the request in frame {i} (PSN 0x{p:06x})"),
            None => format!("answers PSN 0x{p:06x}, whose request is not in the capture"),
        },
    })
}

/// One line of facts about a flow: PSN range, messages, ACK coverage, retransmissions
/// by cause, READs and their responses.
pub fn facts(st: &FlowStats) -> String {
    let mut t = String::new();
    use std::fmt::Write as _;
    // The range reaches the last PSN a READ response used, past the READ's own.
    let end = match (st.last_psn, st.acked) {
        (Some(l), Some((a, _))) if a.is_after(l) => Some(a),
        (l, _) => l,
    };
    if let (Some(a), Some(b)) = (st.first_psn, end) {
        let _ = write!(
            t,
            "PSN 0x{:06x}..0x{:06x} ({} PSNs)",
            a.value(),
            b.value(),
            b.forward_from(a) + 1
        );
    }
    let _ = write!(t, ", {} messages", st.messages);
    match (st.acked, st.last_psn) {
        (Some((a, i)), Some(l)) if !a.is_before(l) => {
            let _ = write!(
                t,
                ", every request acknowledged (up to 0x{:06x}, frame {i})",
                a.value()
            );
        }
        (Some((a, i)), Some(l)) => {
            let _ = write!(
                t,
                ", acknowledged up to 0x{:06x} (frame {i}): {} PSNs after it unanswered in the capture",
                a.value(),
                l.forward_from(a)
            );
        }
        (None, Some(_)) if st.responses == 0 => {
            t.push_str(", no responses (UC/UD are not acknowledged)")
        }
        _ => t.push_str(", nothing acknowledged in the capture"),
    }
    if st.retransmissions > 0 {
        let _ = write!(
            t,
            ", {} retransmitted, {} retransmit timeout(s)",
            st.retransmissions, st.timeouts
        );
    }
    if !st.reads.is_empty() {
        let n: u32 = st.reads.iter().map(|r| r.responses).sum();
        let _ = write!(
            t,
            ", {} READs answered by {n} response packets",
            st.reads.len()
        );
    }
    t
}

impl Tracker {
    /// A section of a sampled capture starts (a pcapng comment, as `demo` writes): the
    /// frames before it were cut, so a flow's next PSN may jump. Flows continue across
    /// the jump instead of being taken for new connections.
    pub fn section_break(&mut self) {
        for s in self.flows.values_mut() {
            s.resync = true;
            s.burst = None;
        }
    }

    /// Feeds one parsed frame (in capture order). A frame with a bad ICRC is classified
    /// but does not change any state, since a receiver would have dropped it.
    pub fn observe(
        &mut self,
        index: usize,
        time: f64,
        f: &Frame<'_>,
        icrc_ok: bool,
    ) -> Observation {
        if !icrc_ok {
            let mut scratch = Tracker {
                flows: self.flows.clone(),
                pairs: self.pairs.clone(),
                conns: self.conns.clone(),
            };
            let mut o = scratch.observe(index, time, f, true);
            o.retransmission = false;
            o.story = Story::None;
            return o;
        }
        let r = f.roce();
        let info = r.info();
        let bth = r.bth();
        let psn = bth.psn();
        let (src, dst) = (f.ip().src(), f.ip().dst());
        if info.request {
            let base = FlowKey {
                requester: src,
                responder: dst,
                responder_qp: bth.dest_qp(),
                src_qp: r.deth().map(|d| d.src_qp()),
                conn: 0,
            };
            let conn = self.conns.entry(base).or_insert(0);
            let mut key = FlowKey {
                conn: *conn,
                ..base
            };
            // UD PSNs say nothing about connections (QP1 sends PSN 0 for ever).
            if let Some(s) = self.flows.get_mut(&key)
                && s.resync
            {
                s.resync = false;
                s.window = None;
                s.reach = None;
            }
            let new_conn = info.transport != crate::wire::Transport::Ud
                && self
                    .flows
                    .get(&key)
                    .is_some_and(|s| match (s.window, s.reach) {
                        (Some((lo, _)), Some(reach)) => {
                            // Far before the window (a retransmission reaches back at
                            // most a send window, even in a capture that starts
                            // mid-connection), or far past what the flow could send next.
                            (psn.is_before(lo) && lo.forward_from(psn) > NEW_CONNECTION_GAP)
                                || (psn.is_after(reach)
                                    && psn.forward_from(reach) > NEW_CONNECTION_GAP)
                        }
                        _ => false,
                    });
            if new_conn {
                *conn += 1;
                key.conn = *conn;
            }
            let s = self.flows.entry(key).or_insert_with(|| FlowStats {
                first_frame: index,
                ..FlowStats::default()
            });
            s.requests += 1;
            s.payload_bytes += r.payload_len() as u64;
            // Only RC retransmits; a repeated PSN on UC or UD (always 0 on QP1) is not one.
            let reliable = info.transport == crate::wire::Transport::Rc;
            let retx = reliable
                && match s.window {
                    Some((_, hi)) => !psn.is_after(hi),
                    None => false,
                };
            let mut story = Story::None;
            if retx {
                s.retransmissions += 1;
                let last = match r.reth() {
                    Some(h) if info.operation == crate::wire::Operation::ReadRequest => {
                        psn.add(h.dma_len().div_ceil(256).saturating_sub(1).min(MAX_WINDOW))
                    }
                    _ => psn,
                };
                let read = info.operation == crate::wire::Operation::ReadRequest;
                story = retransmit_story(s, psn, last, read, time);
            } else {
                if info.position.starts() {
                    s.messages += 1;
                }
                s.burst = None;
            }
            if s.first_psn.is_none_or(|p| psn.is_before(p)) {
                s.first_psn = Some(psn);
            }
            if s.last_psn.is_none_or(|p| psn.is_after(p)) {
                s.last_psn = Some(psn);
            }
            if s.recent.len() == RECENT {
                s.recent.pop_front();
            }
            s.recent.push_back((psn, index, time));
            widen(&mut s.window, psn);
            // A READ's responses take one PSN per packet: at most one per 256 bytes.
            let last = match r.reth() {
                Some(h) if info.operation == crate::wire::Operation::ReadRequest => {
                    // Bounded, so comparisons with it stay well inside half the space.
                    psn.add((h.dma_len().div_ceil(256).saturating_sub(1)).min(MAX_WINDOW))
                }
                _ => psn,
            };
            extend(&mut s.reach, last);
            if let Some(h) = r.reth()
                && info.operation == crate::wire::Operation::ReadRequest
            {
                s.reads.push(ReadRequest {
                    frame: index,
                    psn,
                    len: h.dma_len(),
                    responses: 0,
                    last,
                    next: psn,
                });
            }
            Observation {
                flow: Some(key),
                response: false,
                retransmission: retx,
                answers: None,
                story,
            }
        } else {
            // A response (or a CNP): sent by the responder to the requester's QP.
            let req_qp = bth.dest_qp();
            // From the flow's first PSN to the furthest it reserved (a READ's responses
            // take PSNs after the READ's own, before any later request uses them).
            let in_window = |st: &FlowStats| {
                st.window.is_some_and(|(lo, hi)| {
                    let top = st.reach.filter(|r| r.is_after(hi)).unwrap_or(hi);
                    !psn.is_before(lo) && !psn.is_after(top)
                })
            };
            // The flow this requester QP was last paired with, if the PSN still fits it;
            // QP numbers are reused by later connections (a new process, a new QP).
            let cached = self
                .pairs
                .get(&(src, dst, req_qp))
                .copied()
                .filter(|k| self.flows.get(k).is_some_and(in_window));
            let flow = match cached {
                Some(k) => Some(k),
                None => {
                    let found = self
                        .flows
                        .iter()
                        .filter(|(k, s)| {
                            k.requester == dst
                                && k.responder == src
                                && k.src_qp.is_none()
                                && s.requester_qp.is_none_or(|q| q == req_qp)
                                && in_window(s)
                        })
                        .max_by_key(|(_, s)| s.first_frame)
                        .map(|(k, _)| *k);
                    if let Some(k) = found {
                        self.pairs.insert((src, dst, req_qp), k);
                        if let Some(s) = self.flows.get_mut(&k) {
                            s.requester_qp = Some(req_qp);
                        }
                    }
                    found
                }
            };
            let mut answers = None;
            let mut story = Story::None;
            if let Some(k) = flow
                && let Some(s) = self.flows.get_mut(&k)
            {
                s.responses += 1;
                s.last_response = Some((index, time));
                let covers = match r.aeth().map(|a| a.syndrome()) {
                    Some(Syndrome::Ack { .. }) => Some(psn),
                    // A NAK acknowledges everything before its PSN (IBA 9.7.5.2).
                    Some(Syndrome::Nak(_)) => Some(psn.sub(1)),
                    Some(Syndrome::RnrNak { .. }) => Some(psn.sub(1)),
                    Some(Syndrome::Reserved(_)) => None,
                    // READ responses acknowledge only in order (below).
                    None => None,
                };
                if let Some(c) = covers
                    && s.acked.is_none_or(|(a, _)| c.is_after(a))
                    && s.first_psn.is_some_and(|f| !c.is_before(f))
                {
                    s.acked = Some((c, index));
                }
                match r.aeth().map(|a| a.syndrome()) {
                    Some(Syndrome::Nak(code)) => {
                        let seq = code == crate::wire::aeth::NakCode::PsnSequenceError;
                        s.last_nak = Some((index, psn, seq));
                        story = if seq {
                            Story::SeqNak {
                                expected: psn,
                                arrived: s
                                    .recent
                                    .iter()
                                    .rev()
                                    .find(|(p, _, _)| p.is_after(psn))
                                    .map(|&(p, i, _)| (i, p)),
                            }
                        } else {
                            Story::Refuses {
                                request: request_with(s, psn),
                            }
                        };
                    }
                    Some(Syndrome::RnrNak { .. }) => {
                        s.last_nak = Some((index, psn, false));
                        story = Story::Refuses {
                            request: request_with(s, psn),
                        };
                    }
                    _ => {}
                }
                if info.operation == crate::wire::Operation::ReadResponse {
                    // The latest READ starting at or before this PSN whose reserved
                    // range holds it: requests take PSNs in order, so no later READ can.
                    let skip = s.reads.len().saturating_sub(READ_LOOKBACK);
                    if let Some(rd) = s.reads[skip..]
                        .iter_mut()
                        .rev()
                        .find(|rd| !psn.is_before(rd.psn) && !psn.is_after(rd.last))
                    {
                        rd.responses += 1;
                        answers = Some(rd.frame);
                        s.read_gap = Some((index, psn));
                        if psn == rd.next && s.acked.is_none_or(|(a, _)| psn.is_after(a)) {
                            // In order, it acknowledges every request before it (IBA
                            // 9.7.5.1.8: a response implies the earlier ones).
                            s.acked = Some((psn, index));
                        }
                        if !psn.is_before(rd.next) {
                            rd.next = psn.add(1);
                        }
                    }
                }
                s.payload_bytes += r.payload_len() as u64;
                if let Some(a) = r.aeth() {
                    match a.syndrome() {
                        Syndrome::Nak(_) => s.naks += 1,
                        Syndrome::RnrNak { .. } => s.rnr_naks += 1,
                        _ => {}
                    }
                }
                // READ responses advance the window past the READ request's own PSN.
                if s.window.is_some() {
                    widen(&mut s.window, psn);
                    extend(&mut s.reach, psn);
                }
            }
            Observation {
                flow,
                response: true,
                retransmission: false,
                answers,
                story,
            }
        }
    }
}

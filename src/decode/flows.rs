//! Conversation tracking for `decode`: which requests and responses belong to one QP
//! connection, and which requests are retransmissions.
//!
//! A request names only its destination QP; the requester's QP appears only as the
//! destination of the responses. So a request flow is keyed by (requester IP, responder
//! IP, responder QP) (plus the source QP from the DETH for UD), and a response is paired
//! with the request flow in the opposite direction whose PSN window holds the response's
//! PSN (ACKs and READ responses carry PSNs of requests). A pairing, once found, is kept.
//!
//! A request whose PSN lies inside the window already seen in its flow, i.e. from the
//! flow's first PSN up to its highest (requests and responses both advance it, so a READ
//! re-requested from its middle is caught too), is a retransmission. A PSN before the
//! window starts a new incarnation of the flow (a new connection reusing the QP numbers).

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
}

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
}

/// What the tracker says about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// The flow, or `None` for a response no request flow explains.
    pub flow: Option<FlowKey>,
    pub response: bool,
    pub retransmission: bool,
}

/// Tracks flows over a whole capture.
#[derive(Debug, Default)]
pub struct Tracker {
    pub flows: HashMap<FlowKey, FlowStats>,
    /// (responder IP, requester IP, requester QP) -> flow, learnt from responses.
    pairs: HashMap<(IpAddr, IpAddr, u32), FlowKey>,
}

fn widen(window: &mut Option<(Psn, Psn)>, psn: Psn) {
    match window {
        None => *window = Some((psn, psn)),
        Some((_, hi)) if psn.is_after(*hi) => *hi = psn,
        _ => {}
    }
}

impl Tracker {
    /// Feeds one parsed frame (in capture order). A frame with a bad ICRC is classified
    /// but does not change any state, since a receiver would have dropped it.
    pub fn observe(&mut self, index: usize, f: &Frame<'_>, icrc_ok: bool) -> Observation {
        if !icrc_ok {
            let mut scratch = Tracker {
                flows: self.flows.clone(),
                pairs: self.pairs.clone(),
            };
            let mut o = scratch.observe(index, f, true);
            o.retransmission = false;
            return o;
        }
        let r = f.roce();
        let info = r.info();
        let bth = r.bth();
        let psn = bth.psn();
        let (src, dst) = (f.ip().src(), f.ip().dst());
        if info.request {
            let key = FlowKey {
                requester: src,
                responder: dst,
                responder_qp: bth.dest_qp(),
                src_qp: r.deth().map(|d| d.src_qp()),
            };
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
                    Some((lo, _)) if psn.is_before(lo) => {
                        // A new connection reusing these QP numbers.
                        s.window = Some((psn, psn));
                        false
                    }
                    Some((_, hi)) => !psn.is_after(hi),
                    None => false,
                };
            if retx {
                s.retransmissions += 1;
            }
            widen(&mut s.window, psn);
            Observation {
                flow: Some(key),
                response: false,
                retransmission: retx,
            }
        } else {
            // A response (or a CNP): sent by the responder to the requester's QP.
            let req_qp = bth.dest_qp();
            let in_window = |st: &FlowStats| {
                st.window
                    .is_some_and(|(lo, hi)| !psn.is_before(lo) && !psn.is_after(hi))
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
            if let Some(k) = flow
                && let Some(s) = self.flows.get_mut(&k)
            {
                s.responses += 1;
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
                }
            }
            Observation {
                flow,
                response: true,
                retransmission: false,
            }
        }
    }
}

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
//! flow's first PSN (at most 2^22 back) up to its highest (requests and responses both advance it, so a READ
//! re-requested from its middle is caught too), is a retransmission. A PSN more than
//! [`NEW_CONNECTION_GAP`] before the window, or past the furthest PSN the flow could use
//! next, starts a new connection reusing the QP numbers (every rxe or roce-xdp process numbers its first QP 0x11, and each
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

impl Tracker {
    /// Feeds one parsed frame (in capture order). A frame with a bad ICRC is classified
    /// but does not change any state, since a receiver would have dropped it.
    pub fn observe(&mut self, index: usize, f: &Frame<'_>, icrc_ok: bool) -> Observation {
        if !icrc_ok {
            let mut scratch = Tracker {
                flows: self.flows.clone(),
                pairs: self.pairs.clone(),
                conns: self.conns.clone(),
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
            if retx {
                s.retransmissions += 1;
            }
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
                    extend(&mut s.reach, psn);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ip::Ipv4Repr;
    use crate::wire::{
        AethRepr, BthRepr, EthRepr, ExtRepr, FrameRepr, IpRepr, Opcode, ROCE_V2_PORT, RoceRepr,
        UdpRepr,
    };
    use std::net::Ipv4Addr;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    /// An RC frame from `src` to `dst`'s QP `dqp`: SEND_ONLY (request) or ACK.
    fn frame(src: Ipv4Addr, dst: Ipv4Addr, dqp: u32, psn: u32, ack: bool) -> Vec<u8> {
        let (op, aeth) = if ack {
            (
                Opcode(0x11),
                Some(AethRepr {
                    syndrome: Syndrome::ACK,
                    msn: 1,
                }),
            )
        } else {
            (Opcode(0x04), None)
        };
        let repr = FrameRepr {
            eth: EthRepr {
                dst: [2, 0, 0, 0, 0, 2],
                src: [2, 0, 0, 0, 0, 1],
                vlan: None,
                ethertype: 0x0800,
            },
            ip: IpRepr::V4(Ipv4Repr::new(src, dst, 0)),
            udp: UdpRepr {
                src_port: 49152,
                dst_port: ROCE_V2_PORT,
            },
            roce: RoceRepr {
                bth: BthRepr {
                    ack_req: !ack,
                    ..BthRepr::new(op, dqp, Psn::new(psn))
                },
                ext: ExtRepr {
                    aeth,
                    ..ExtRepr::default()
                },
                payload: &[],
            },
        };
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        let n = repr.emit(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_new_connection_reusing_the_qp_numbers_is_a_flow_of_its_own() {
        let mut t = Tracker::default();
        let mut i = 0;
        let mut feed = |t: &mut Tracker, b: Vec<u8>| {
            i += 1;
            t.observe(i, &Frame::parse(&b).unwrap(), true)
        };
        // Connection 1: PSNs 0x100..0x103 from A's QP 0x11 to B's QP 0x11, each ACKed.
        for p in 0x100..0x104 {
            assert!(!feed(&mut t, frame(A, B, 0x11, p, false)).retransmission);
            feed(&mut t, frame(B, A, 0x11, p, true));
        }
        // One retransmission within it.
        assert!(feed(&mut t, frame(A, B, 0x11, 0x102, false)).retransmission);
        // Connection 2, same QP numbers, random start PSNs: one far ahead, then one
        // behind: new connections, not retransmissions.
        let o = feed(&mut t, frame(A, B, 0x11, 0x80_0000, false));
        assert!(!o.retransmission);
        assert_eq!(o.flow.unwrap().conn, 1);
        let r = feed(&mut t, frame(B, A, 0x11, 0x80_0000, true));
        assert_eq!(
            r.flow.unwrap().conn,
            1,
            "the ACK pairs with the new connection"
        );
        let o = feed(&mut t, frame(A, B, 0x11, 0x40_0000, false));
        assert!(!o.retransmission);
        assert_eq!(o.flow.unwrap().conn, 2);
        // Just before a window is a retransmission reaching back, not a new connection
        // (a capture that starts mid-connection).
        let o = feed(&mut t, frame(A, B, 0x11, 0x40_0000 - 100, false));
        assert!(o.retransmission);
        assert_eq!(o.flow.unwrap().conn, 2);
        assert_eq!(t.flows.len(), 3);
        let first = t.flows.values().find(|s| s.first_frame == 1).unwrap();
        assert_eq!(
            (first.requests, first.responses, first.retransmissions),
            (5, 4, 1)
        );
    }
}

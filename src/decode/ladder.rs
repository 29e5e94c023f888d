//! `decode --ladder`: each QP connection drawn as a two-column sequence diagram.
//!
//! The requester is the left column, the responder the right one: requests go right,
//! responses (ACKs, NAKs, READ responses, atomic ACKs) come back left. Retransmissions,
//! NAKs and bad ICRCs are marked at the end of their line.

use super::flows::{Cause, FlowKey, FlowStats, Story, Tracker};
use super::{Seen, short_label};
use crate::wire::Transport;
use crate::wire::aeth::Syndrome;
use std::collections::HashMap;
use std::fmt::Write;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    Flow(FlowKey),
    /// Responses that no request in the capture explains: (from, to, dest QP).
    Orphan(IpAddr, IpAddr, u32),
}

struct Event {
    frame: usize,
    time: f64,
    response: bool,
    label: String,
    marks: String,
}

/// Collects the events of a pass, then draws them.
#[derive(Default)]
pub struct Ladder {
    order: Vec<Section>,
    transport: HashMap<Section, Transport>,
    events: HashMap<Section, Vec<Event>>,
}

/// "A QP x -> B QP y" for a flow.
pub fn flow_title(k: &FlowKey, st: &FlowStats) -> String {
    let req_qp = k
        .src_qp
        .or(st.requester_qp)
        .map_or("?".to_string(), |q| format!("0x{q:06x}"));
    let conn = if k.conn > 0 {
        format!(" (connection {})", k.conn + 1)
    } else {
        String::new()
    };
    format!(
        "{} QP {} -> {} QP 0x{:06x}{conn}",
        k.requester, req_qp, k.responder, k.responder_qp
    )
}

/// What the ladder writes after a frame's arrow: retransmission and why, NAK and what it
/// refuses, bad ICRC.
pub fn marks(s: &Seen<'_>) -> String {
    let r = s.frame.roce();
    let mut marks = String::new();
    if s.obs.retransmission {
        marks.push_str(" RETRANSMIT");
        if let Story::Retransmit {
            original, cause, ..
        } = s.obs.story
        {
            let _ = match cause {
                Cause::SeqNak { nak } => write!(marks, " (go-back-N after the NAK in frame {nak}"),
                Cause::RnrNak { nak } => write!(marks, " (after the RNR NAK in frame {nak}"),
                Cause::ReadGap { response } => {
                    write!(
                        marks,
                        " (READ again: a response before frame {response} was lost"
                    )
                }
                Cause::Timeout { since } => {
                    write!(marks, " (TIMEOUT, {:.1} ms without a response", since * 1e3)
                }
            };
            let _ = match original {
                Some(o) => write!(marks, "; first sent in frame {o})"),
                None => write!(marks, ")"),
            };
        }
    }
    if let Some(a) = r.aeth() {
        match a.syndrome() {
            Syndrome::Nak(c) => {
                let _ = write!(marks, " NAK: {}", c.meaning());
                match s.obs.story {
                    Story::SeqNak {
                        expected,
                        arrived: Some((i, got)),
                    } => {
                        let _ = write!(
                            marks,
                            " (expected 0x{:06x}, got 0x{:06x} in frame {i})",
                            expected.value(),
                            got.value()
                        );
                    }
                    Story::Refuses { request: Some(i) } => {
                        let _ = write!(marks, " (refuses frame {i})");
                    }
                    _ => {}
                }
            }
            Syndrome::RnrNak { .. } => marks.push_str(" RNR NAK"),
            _ => {}
        }
    }
    if !s.icrc_ok {
        marks.push_str(" BAD ICRC (dropped by a receiver)");
    }
    marks
}

const ARROW: usize = 60;

impl Ladder {
    pub fn push(&mut self, s: &Seen<'_>) {
        let f = &s.frame;
        let r = f.roce();
        let key = match s.obs.flow {
            Some(k) => Section::Flow(k),
            None => Section::Orphan(f.ip().src(), f.ip().dst(), r.bth().dest_qp()),
        };
        if !self.events.contains_key(&key) {
            self.order.push(key);
            self.transport.insert(key, r.info().transport);
        }
        let marks = marks(s);
        self.events.entry(key).or_default().push(Event {
            frame: s.packet.index,
            time: s.rel_time,
            response: s.obs.response,
            label: short_label(f),
            marks,
        });
    }

    pub fn render(&self, out: &mut String, t: &Tracker) {
        for key in &self.order {
            let evs = &self.events[key];
            let tr = self.transport[key].name();
            let (left, right) = match key {
                Section::Flow(k) => {
                    let st = t.flows.get(k).cloned().unwrap_or_default();
                    let _ = writeln!(out, "=== {tr}: {} ===", flow_title(k, &st));
                    (k.requester.to_string(), k.responder.to_string())
                }
                Section::Orphan(from, to, qp) => {
                    let _ = writeln!(
                        out,
                        "=== {tr}: responses from {from} to {to} QP 0x{qp:06x} (no request for them in the capture) ==="
                    );
                    (to.to_string(), from.to_string())
                }
            };
            let _ = writeln!(
                out,
                "{:>7} {:>11}   {:<w$}{}",
                "frame",
                "time(s)",
                left,
                right,
                w = ARROW + 1
            );
            for e in evs {
                let body = format!(" {} ", e.label);
                let fill = ARROW.saturating_sub(body.len() + 4).max(2);
                let arrow = if e.response {
                    format!("|<--{body}{}-|", "-".repeat(fill))
                } else {
                    format!("|---{body}{}>|", "-".repeat(fill))
                };
                let _ = writeln!(out, "{:>7} {:>11.6}   {arrow}{}", e.frame, e.time, e.marks);
            }
            out.push('\n');
        }
    }
}

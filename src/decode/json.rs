//! `decode --json`: exactly one JSON object per frame, one per line.
//!
//! Keys for every frame: `frame` (1-based), `time` (seconds since the first frame),
//! `roce`. For RoCE frames: `opcode`, `opcode_name`, `src`, `dst`, `sport`, `dport`,
//! `dqpn`, `psn`, `ack_req`, `se`, `pad`, `pkey`, `payload_len`, `icrc`, `icrc_ok`,
//! `retransmission`, and one object per extension header present (`reth`, `aeth`, `deth`,
//! `immdt`, `ieth`, `atomic_eth`, `atomic_ack_eth`). Other frames: `kind` and, for a
//! broken RoCEv2 frame, `error`.

use super::Seen;
use crate::capture::Packet;
use crate::wire::Error as WireError;
use serde_json::{Map, Value, json};

pub fn roce(out: &mut String, s: &Seen<'_>) {
    let f = &s.frame;
    let r = f.roce();
    let b = r.bth();
    let info = r.info();
    let mut m = Map::new();
    m.insert("frame".into(), json!(s.packet.index));
    m.insert("time".into(), json!(s.rel_time));
    m.insert("roce".into(), json!(true));
    m.insert("opcode".into(), json!(b.opcode().0));
    m.insert("opcode_name".into(), json!(info.name));
    m.insert("src".into(), json!(f.ip().src().to_string()));
    m.insert("dst".into(), json!(f.ip().dst().to_string()));
    m.insert("sport".into(), json!(f.src_port()));
    m.insert("dport".into(), json!(crate::wire::ROCE_V2_PORT));
    m.insert("dqpn".into(), json!(b.dest_qp()));
    m.insert("psn".into(), json!(b.psn().value()));
    m.insert("ack_req".into(), json!(b.ack_req()));
    m.insert("se".into(), json!(b.solicited()));
    m.insert("pad".into(), json!(b.pad_count()));
    m.insert("pkey".into(), json!(b.pkey()));
    m.insert("fecn".into(), json!(b.fecn()));
    m.insert("becn".into(), json!(b.becn()));
    m.insert("payload_len".into(), json!(r.payload_len()));
    m.insert("icrc".into(), json!(r.icrc()));
    m.insert("icrc_ok".into(), json!(s.icrc_ok));
    if !s.icrc_ok {
        m.insert("icrc_computed".into(), json!(f.computed_icrc()));
    }
    m.insert("retransmission".into(), json!(s.obs.retransmission));
    if let Some(h) = r.reth() {
        m.insert(
            "reth".into(),
            json!({"va": h.va(), "rkey": h.rkey(), "len": h.dma_len()}),
        );
    }
    if let Some(h) = r.aeth() {
        m.insert(
            "aeth".into(),
            json!({"syndrome": h.syndrome_byte(), "meaning": h.syndrome().to_string(), "msn": h.msn()}),
        );
    }
    if let Some(h) = r.deth() {
        m.insert(
            "deth".into(),
            json!({"qkey": h.qkey(), "src_qp": h.src_qp()}),
        );
    }
    if let Some(v) = r.immdt() {
        m.insert("immdt".into(), json!(v));
    }
    if let Some(v) = r.ieth() {
        m.insert("ieth".into(), json!(v));
    }
    if let Some(h) = r.atomic_eth() {
        m.insert(
            "atomic_eth".into(),
            json!({"va": h.va(), "rkey": h.rkey(), "swap_add": h.swap_add(), "compare": h.compare()}),
        );
    }
    if let Some(h) = r.atomic_ack_eth() {
        m.insert("atomic_ack_eth".into(), json!({"orig": h.orig()}));
    }
    if b.dest_qp() == 1
        && let Some(tag) = super::explain::cm_tag(r.payload())
    {
        m.insert("cm".into(), json!(tag));
    }
    line(out, m);
}

pub fn other(out: &mut String, p: &Packet<'_>, rel: f64, e: &WireError, broken: bool) {
    let mut m = Map::new();
    m.insert("frame".into(), json!(p.index));
    m.insert("time".into(), json!(rel));
    m.insert("roce".into(), json!(false));
    m.insert("kind".into(), json!(super::describe_other(p, e).0));
    if broken {
        m.insert("error".into(), json!(e.to_string()));
        m.insert("error_kind".into(), json!(e.kind()));
    }
    line(out, m);
}

fn line(out: &mut String, m: Map<String, Value>) {
    out.push_str(&Value::Object(m).to_string());
    out.push('\n');
}

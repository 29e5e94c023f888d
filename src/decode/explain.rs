//! Plain-words explanations of every header field, for `decode`'s full output.
//!
//! The aim is that someone who has never read the InfiniBand spec can follow a capture:
//! each field is printed as `name = value` followed by what that value means here.

use crate::wire::cm::{self, CmMessage};
use crate::wire::eth::fmt_mac;
use crate::wire::frame::IpView;
use crate::wire::opcode::{HeaderKind, Transport};
use crate::wire::{Frame, mad};
use std::fmt::Write;

/// Width of the field-name column.
const W: usize = 9;

fn field(out: &mut String, name: &str, value: impl std::fmt::Display, meaning: &str) {
    let v = value.to_string();
    let _ = writeln!(out, "    {name:<W$} = {v:<18} {meaning}");
}

/// What an ECN codepoint means.
pub fn ecn_meaning(ecn: u8) -> &'static str {
    match ecn & 3 {
        0 => "not ECN-capable",
        1 => "ECN-capable transport (ECT(1))",
        2 => "ECN-capable transport (ECT(0))",
        _ => "congestion experienced: a switch marked it; the receiver answers with a CNP",
    }
}

/// What a P_Key means.
pub fn pkey_meaning(pkey: u16) -> String {
    let member = if pkey & 0x8000 != 0 {
        "full member"
    } else {
        "limited member"
    };
    match pkey & 0x7fff {
        0x7fff => format!("the default partition, {member}"),
        0 => "invalid partition key".to_string(),
        p => format!("partition 0x{p:04x}, {member}"),
    }
}

/// A hex dump of the first bytes.
pub fn hex_preview(b: &[u8], max: usize) -> String {
    let mut s = String::new();
    for (i, x) in b.iter().take(max).enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{x:02x}");
    }
    if b.len() > max {
        s.push_str(" ...");
    }
    s
}

/// Link, IP and UDP lines.
pub fn lower_layers(out: &mut String, f: &Frame<'_>) {
    let e = f.eth();
    if e.src != [0; 6] || e.dst != [0; 6] {
        let _ = writeln!(
            out,
            "  Ethernet  {} -> {}  EtherType 0x{:04x} ({})",
            fmt_mac(&e.src),
            fmt_mac(&e.dst),
            e.ethertype,
            if e.ethertype == 0x0800 {
                "IPv4"
            } else {
                "IPv6"
            }
        );
    }
    if let Some(v) = e.vlan {
        let _ = writeln!(
            out,
            "  802.1Q    VLAN {}  priority {} (the class PFC pauses)  DEI {}",
            v.vid,
            v.pcp,
            u8::from(v.dei)
        );
    }
    match f.ip() {
        IpView::V4(h) => {
            let csum = if f.verify_ip_checksum().is_ok() {
                "ok"
            } else {
                "BAD"
            };
            let _ = writeln!(
                out,
                "  IPv4      {} -> {}  length {}  ID 0x{:04x}{}  TTL {}  DSCP {}  ECN {} ({})  checksum {}",
                h.source_addr(),
                h.destination_addr(),
                h.total_len(),
                h.identification(),
                if h.dont_fragment() { "  DF" } else { "" },
                h.ttl(),
                h.dcp().value(),
                h.ecn().value(),
                ecn_meaning(h.ecn().value()),
                csum
            );
            if !h.options().is_empty() {
                let _ = writeln!(
                    out,
                    "            {} bytes of IP options: {}",
                    h.options().len(),
                    hex_preview(h.options(), 40)
                );
            }
        }
        IpView::V6(h) => {
            let _ = writeln!(
                out,
                "  IPv6      {} -> {}  payload {}  hop limit {}  traffic class 0x{:02x} (ECN {}: {})  flow label 0x{:05x}",
                h.source_addr(),
                h.destination_addr(),
                h.payload_length(),
                h.hop_limit(),
                h.traffic_class(),
                h.ecn().value(),
                ecn_meaning(h.ecn().value()),
                h.flow_label().value()
            );
        }
    }
    let u = f.udp();
    let csum = match (u.checksum(), f.verify_udp_checksum()) {
        (0, _) => "0x0000 (none: allowed, the ICRC protects the packet)".to_string(),
        (c, Ok(())) => format!("0x{c:04x} ok"),
        (c, Err(_)) => format!("0x{c:04x} BAD"),
    };
    let _ = writeln!(
        out,
        "  UDP       {} -> {} (RoCEv2)  length {}  checksum {}",
        u.source_port(),
        u.destination_port(),
        u.length(),
        csum
    );
}

/// The BTH, extension headers, payload (with MAD/CM decoding) and ICRC.
pub fn roce_layers(out: &mut String, f: &Frame<'_>) {
    let r = f.roce();
    let info = r.info();
    let b = r.bth();
    let transport = match info.transport {
        Transport::Rc => "Reliable Connected",
        Transport::Uc => "Unreliable Connected",
        Transport::Ud => "Unreliable Datagram",
        Transport::Cnp => "RoCEv2 congestion control",
    };
    let _ = writeln!(
        out,
        "  BTH       {} (opcode 0x{:02x}, {}): {}",
        info.name, info.code, transport, info.meaning
    );
    // The field lines come from the one field list `--hex` and `--html` use too.
    let all = super::fields::fields(f);
    let lines = |out: &mut String, layer: &str| {
        // (The OpCode is in the BTH's title line; reserved bits are only in `--hex`.)
        for x in all
            .iter()
            .filter(|x| x.layer == layer && x.name != "OpCode" && !x.name.starts_with("Resv"))
        {
            field(out, x.name, &x.value, &x.meaning);
        }
    };
    lines(out, "BTH");
    let qp = b.dest_qp();
    for &k in info.headers {
        let (layer, title) = match k {
            HeaderKind::Reth => ("RETH", "RDMA extended transport header"),
            HeaderKind::Aeth => ("AETH", "ACK extended transport header"),
            HeaderKind::AtomicEth => ("AtomicETH", "atomic extended transport header"),
            HeaderKind::AtomicAckEth => ("AtomicAckETH", "atomic ACK extended transport header"),
            HeaderKind::ImmDt => ("ImmDt", "immediate data"),
            HeaderKind::Ieth => ("IETH", "invalidate extended transport header"),
            HeaderKind::Deth => ("DETH", "datagram extended transport header"),
            HeaderKind::CnpReserved => ("CNP", "congestion notification"),
        };
        let _ = writeln!(out, "  {layer:<9} {title}");
        lines(out, layer);
    }

    let payload = r.payload();
    if !payload.is_empty() {
        let _ = writeln!(
            out,
            "  Payload   {} bytes: {}",
            payload.len(),
            hex_preview(payload, 16)
        );
        if qp == 1 && info.transport == Transport::Ud {
            mad_lines(out, payload);
        }
    } else if info.payload {
        let _ = writeln!(out, "  Payload   0 bytes");
    }
    let wire = r.icrc();
    let computed = f.computed_icrc();
    let bytes = wire.to_le_bytes();
    if wire == computed {
        let _ = writeln!(
            out,
            "  ICRC      0x{wire:08x} ok  (CRC-32 over the invariant fields; on the wire as {:02x} {:02x} {:02x} {:02x})",
            bytes[0], bytes[1], bytes[2], bytes[3]
        );
    } else {
        let _ = writeln!(
            out,
            "  ICRC      BAD (wire 0x{wire:08x}, computed 0x{computed:08x}): corrupted on the way; a receiver drops it silently"
        );
    }
}

/// Decodes a MAD carried to QP1, with the CM message it holds.
fn mad_lines(out: &mut String, payload: &[u8]) {
    let Ok(h) = mad::Header::new_checked(payload) else {
        let _ = writeln!(
            out,
            "  MAD       too short ({} bytes) for a MAD header",
            payload.len()
        );
        return;
    };
    let m = mad::Repr::parse(&h);
    let attr = if m.mgmt_class == mad::CLASS_CM {
        cm::attr_name(m.attribute_id)
    } else {
        "attribute"
    };
    let _ = writeln!(
        out,
        "  MAD       {} (class 0x{:02x} version {})  method {}  TID 0x{:016x}  attribute 0x{:04x} {} (IBA 13.4)",
        mad::class_name(m.mgmt_class),
        m.mgmt_class,
        m.class_version,
        mad::method_name(m.method),
        m.transaction_id,
        m.attribute_id,
        attr
    );
    if m.mgmt_class != mad::CLASS_CM {
        return;
    }
    match CmMessage::parse(m.attribute_id, h.data()) {
        Ok(c) => cm_lines(out, &c),
        Err(e) => {
            let _ = writeln!(out, "  CM        cannot decode: {e}");
        }
    }
}

fn gid(g: &[u8; 16]) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(*g)
}

/// The CM message's main fields.
pub fn cm_lines(out: &mut String, c: &CmMessage<'_>) {
    match c {
        CmMessage::Req(r) => {
            let _ = writeln!(
                out,
                "  CM REQ    connect request (IBA 12.6): local comm ID 0x{:08x}, service ID 0x{:016x}{}",
                r.local_comm_id,
                r.service_id,
                if cm::is_rdma_cm_service(r.service_id) {
                    format!(
                        " ({} port {})",
                        cm::port_space_name(r.service_id),
                        r.service_id & 0xffff
                    )
                } else {
                    String::new()
                }
            );
            let _ = writeln!(
                out,
                "            the active side's QP 0x{:06x} expects PSN 0x{:06x} first (the passive side sends from it); transport {}, path MTU {}, P_Key 0x{:04x}",
                r.local_qpn,
                r.starting_psn,
                cm::transport_name(r.transport),
                cm::mtu_from_code(r.path_mtu).map_or("invalid".to_string(), |m| m.to_string()),
                r.pkey
            );
            let _ = writeln!(
                out,
                "            responder resources {}, initiator depth {}, retry count {}, RNR retry count {}, local ACK timeout {}",
                r.responder_resources,
                r.initiator_depth,
                r.retry_count,
                r.rnr_retry_count,
                r.primary_local_ack_timeout
            );
            let _ = writeln!(
                out,
                "            local GID {}  remote GID {}  traffic class {}  hop limit {}",
                gid(&r.primary_local_gid),
                gid(&r.primary_remote_gid),
                r.primary_traffic_class,
                r.primary_hop_limit
            );
            if let Some(h) = r.cma {
                let _ = writeln!(
                    out,
                    "            rdma_cm header: {} port {} -> {} (IPv{})",
                    h.src, h.src_port, h.dst, h.ip_version
                );
            }
        }
        CmMessage::Rep(r) => {
            let _ = writeln!(
                out,
                "  CM REP    connect reply (IBA 12.6): local comm ID 0x{:08x}, remote comm ID 0x{:08x}",
                r.local_comm_id, r.remote_comm_id
            );
            let _ = writeln!(
                out,
                "            the passive side's QP 0x{:06x} expects PSN 0x{:06x} first (the active side sends from it); responder resources {}, initiator depth {}, RNR retry count {}",
                r.local_qpn,
                r.starting_psn,
                r.responder_resources,
                r.initiator_depth,
                r.rnr_retry_count
            );
        }
        CmMessage::Rtu {
            local_comm_id,
            remote_comm_id,
            ..
        } => {
            let _ = writeln!(
                out,
                "  CM RTU    ready to use (IBA 12.6): local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}; the connection is established"
            );
        }
        CmMessage::Rej(r) => {
            let what = match r.message_rejected {
                0 => "the REQ",
                1 => "the REP",
                _ => "no message",
            };
            let _ = writeln!(
                out,
                "  CM REJ    reject of {what}: reason {} ({}, IBA table 112); local comm ID 0x{:08x}, remote comm ID 0x{:08x}",
                r.reason,
                cm::reject_reason(r.reason),
                r.local_comm_id,
                r.remote_comm_id
            );
        }
        CmMessage::Mra(m) => {
            let _ = writeln!(
                out,
                "  CM MRA    message received, reply will take longer (IBA 12.6.6): service timeout code {}; local comm ID 0x{:08x}",
                m.service_timeout, m.local_comm_id
            );
        }
        CmMessage::Dreq {
            local_comm_id,
            remote_comm_id,
            remote_qpn,
            ..
        } => {
            let _ = writeln!(
                out,
                "  CM DREQ   disconnect request for QP 0x{remote_qpn:06x} (IBA 12.6): local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}"
            );
        }
        CmMessage::Drep {
            local_comm_id,
            remote_comm_id,
            ..
        } => {
            let _ = writeln!(
                out,
                "  CM DREP   disconnect reply (IBA 12.6): local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}"
            );
        }
        CmMessage::SidrReq(r) => {
            let _ = writeln!(
                out,
                "  CM SIDR_REQ which UD QP serves service ID 0x{:016x} ({} port {})? request ID 0x{:08x}, P_Key 0x{:04x} (IBA 12.11.1)",
                r.service_id,
                cm::port_space_name(r.service_id),
                r.service_id & 0xffff,
                r.request_id,
                r.pkey
            );
            if let Some(c) = r.cma {
                let _ = writeln!(
                    out,
                    "            rdma_cm header: {} port {} -> {} (IPv{})",
                    c.src, c.src_port, c.dst, c.ip_version
                );
            }
        }
        CmMessage::SidrRep(r) => {
            let what = match r.status {
                0 => "QP valid",
                1 => "service ID not supported",
                2 => "rejected by the service",
                3 => "no QP available",
                4 => "redirect",
                5 => "class version not supported",
                _ => "reserved status",
            };
            let _ = writeln!(
                out,
                "  CM SIDR_REP status {} ({what}): service ID 0x{:016x} is served by UD QP 0x{:06x} with Q_Key 0x{:08x}; request ID 0x{:08x} (IBA 12.11.2)",
                r.status, r.service_id, r.qpn, r.qkey, r.request_id
            );
        }
        CmMessage::Other(a) => {
            let _ = writeln!(
                out,
                "  CM        {} (not decoded further)",
                cm::attr_name(*a)
            );
        }
    }
}

/// A short tag for a CM message, for `--brief` and the ladder.
pub fn cm_tag(payload: &[u8]) -> Option<String> {
    let (m, c) = CmMessage::from_mad(payload).ok()??;
    let _ = m;
    Some(match c {
        CmMessage::Req(r) => format!(
            "CM REQ qp 0x{:06x} psn 0x{:06x}",
            r.local_qpn, r.starting_psn
        ),
        CmMessage::Rep(r) => format!(
            "CM REP qp 0x{:06x} psn 0x{:06x}",
            r.local_qpn, r.starting_psn
        ),
        CmMessage::Rtu { .. } => "CM RTU".to_string(),
        CmMessage::Rej(r) => format!(
            "CM REJ reason {} ({})",
            r.reason,
            cm::reject_reason(r.reason)
        ),
        CmMessage::Mra(_) => "CM MRA".to_string(),
        CmMessage::Dreq { .. } => "CM DREQ".to_string(),
        CmMessage::Drep { .. } => "CM DREP".to_string(),
        CmMessage::SidrReq(_) => "CM SIDR_REQ".to_string(),
        CmMessage::SidrRep(r) => format!("CM SIDR_REP status {} QP 0x{:06x}", r.status, r.qpn),
        CmMessage::Other(a) => format!("CM attr 0x{a:04x}"),
    })
}

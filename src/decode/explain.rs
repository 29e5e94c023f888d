//! Plain-words explanations of every header field, for `decode`'s full output.
//!
//! The aim is that someone who has never read the InfiniBand spec can follow a capture:
//! each field is printed as `name = value` followed by what that value means here.

use crate::wire::aeth::{CREDITS_INVALID, Syndrome};
use crate::wire::cm::{self, CmMessage};
use crate::wire::deth::GSI_QKEY;
use crate::wire::eth::fmt_mac;
use crate::wire::frame::IpView;
use crate::wire::opcode::{HeaderKind, Operation, Transport};
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
    field(
        out,
        "SE",
        u8::from(b.solicited()),
        if b.solicited() {
            "solicited event: the receiver's CQ wakes a waiting consumer"
        } else {
            "no solicited event requested"
        },
    );
    field(
        out,
        "MigReq",
        u8::from(b.mig_req()),
        "path-migration state (APM); RoCE senders do not migrate paths",
    );
    let pad = b.pad_count();
    field(
        out,
        "PadCnt",
        pad,
        &if pad == 0 {
            "no pad bytes: the payload ends on a 4-byte boundary".to_string()
        } else {
            format!("{pad} pad byte(s) after the payload bring it to a 4-byte boundary")
        },
    );
    field(
        out,
        "TVer",
        b.tver(),
        "transport header version (0 is the only one)",
    );
    field(
        out,
        "P_Key",
        format!("0x{:04x}", b.pkey()),
        &format!("partition key: {}", pkey_meaning(b.pkey())),
    );
    field(
        out,
        "FECN",
        u8::from(b.fecn()),
        if b.fecn() {
            "forward congestion seen on the way here"
        } else {
            "no congestion marked on the way here"
        },
    );
    field(
        out,
        "BECN",
        u8::from(b.becn()),
        if b.becn() {
            "congestion reported for the opposite direction"
        } else {
            "no congestion reported back"
        },
    );
    let qp = b.dest_qp();
    let qp_meaning = if info.transport == Transport::Cnp {
        "the QP whose sender should slow down".to_string()
    } else if qp == 1 {
        "QP1: the General Services QP that carries management datagrams (CM)".to_string()
    } else if info.request {
        "the responder's QP this request is for".to_string()
    } else {
        "the requester's QP this response goes back to".to_string()
    };
    field(out, "DestQP", format!("0x{qp:06x}"), &qp_meaning);
    let ack_meaning = if !info.request {
        "not used in responses"
    } else if matches!(info.transport, Transport::Uc | Transport::Ud) {
        "no meaning here: UC and UD are never acknowledged"
    } else if b.ack_req() {
        "the responder must acknowledge this packet"
    } else {
        "no acknowledgement requested (the responder may still ACK later packets)"
    };
    field(out, "AckReq", u8::from(b.ack_req()), ack_meaning);
    let psn_meaning = match info.operation {
        Operation::ReadRequest => {
            "a READ consumes one PSN per response packet it asks for (DMALen / path MTU)"
        }
        _ if info.request && info.transport == Transport::Rc => {
            "requests are numbered one by one; the responder expects them in order"
        }
        _ if info.transport == Transport::Ud => {
            "not checked by UD receivers: every datagram stands alone"
        }
        _ if info.request => {
            "UC: a gap tells the receiver a packet was lost; it drops the rest of that message"
        }
        Operation::Ack | Operation::AtomicAck => {
            "the last request PSN this response acknowledges (or NAKs)"
        }
        Operation::ReadResponse => "the PSN of the READ request packet slot this data answers",
        _ => "sequence number",
    };
    field(
        out,
        "PSN",
        format!("0x{:06x} ({})", b.psn().value(), b.psn().value()),
        psn_meaning,
    );

    for &k in info.headers {
        ext_header(out, f, k);
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

fn ext_header(out: &mut String, f: &Frame<'_>, k: HeaderKind) {
    let r = f.roce();
    let info = r.info();
    match k {
        HeaderKind::Reth => {
            let Some(h) = r.reth() else { return };
            let read = info.operation == Operation::ReadRequest;
            let _ = writeln!(out, "  RETH      RDMA extended transport header");
            field(
                out,
                "VA",
                format!("0x{:016x}", h.va()),
                if read {
                    "remote virtual address to read from"
                } else {
                    "remote virtual address the data is written to"
                },
            );
            field(
                out,
                "R_Key",
                format!("0x{:08x}", h.rkey()),
                if read {
                    "remote key; the responder checks it grants REMOTE_READ on the range"
                } else {
                    "remote key; the responder checks it grants REMOTE_WRITE on the range"
                },
            );
            field(
                out,
                "DMALen",
                h.dma_len(),
                if read {
                    "bytes to read; they come back in DMALen / path MTU response packets"
                } else {
                    "length of the whole message in bytes (all its packets)"
                },
            );
        }
        HeaderKind::Aeth => {
            let Some(h) = r.aeth() else { return };
            let _ = writeln!(out, "  AETH      ACK extended transport header");
            let s = h.syndrome();
            let extra = match s {
                Syndrome::Ack {
                    credits: CREDITS_INVALID,
                } => " (rxe always sends this)",
                Syndrome::Nak(crate::wire::aeth::NakCode::PsnSequenceError) => {
                    "; the requester goes back to this PSN"
                }
                Syndrome::RnrNak { .. } => "; no receive buffer was posted",
                _ => "",
            };
            field(
                out,
                "Syndrome",
                format!("0x{:02x}", h.syndrome_byte()),
                &format!("{s}{extra}"),
            );
            field(
                out,
                "MSN",
                h.msn(),
                "message sequence number: messages the responder has completed",
            );
        }
        HeaderKind::AtomicEth => {
            let Some(h) = r.atomic_eth() else { return };
            let cas = info.operation == Operation::CompareSwap;
            let _ = writeln!(out, "  AtomicETH atomic extended transport header");
            field(
                out,
                "VA",
                format!("0x{:016x}", h.va()),
                "remote address of the 8-byte operand (must be 8-byte aligned)",
            );
            field(
                out,
                "R_Key",
                format!("0x{:08x}", h.rkey()),
                "remote key; must grant REMOTE_ATOMIC",
            );
            field(
                out,
                if cas { "Swap" } else { "Add" },
                format!("0x{:x}", h.swap_add()),
                if cas {
                    "written if the remote value equals Compare"
                } else {
                    "added to the remote value"
                },
            );
            field(
                out,
                "Compare",
                format!("0x{:x}", h.compare()),
                if cas {
                    "value the remote 8 bytes are compared with"
                } else {
                    "unused by FETCH_ADD"
                },
            );
        }
        HeaderKind::AtomicAckEth => {
            let Some(h) = r.atomic_ack_eth() else { return };
            let _ = writeln!(out, "  AtomicAckETH");
            field(
                out,
                "OrigData",
                format!("0x{:x}", h.orig()),
                "what the remote 8 bytes held before the atomic ran",
            );
        }
        HeaderKind::ImmDt => {
            let Some(v) = r.immdt() else { return };
            let _ = writeln!(out, "  ImmDt     immediate data");
            field(
                out,
                "ImmDt",
                format!("0x{v:08x}"),
                "handed to the receiver in its completion (wc.imm_data); consumes a receive WQE",
            );
        }
        HeaderKind::Ieth => {
            let Some(v) = r.ieth() else { return };
            let _ = writeln!(out, "  IETH      invalidate extended transport header");
            field(
                out,
                "R_Key",
                format!("0x{v:08x}"),
                "the responder invalidates this R_Key when the SEND completes",
            );
        }
        HeaderKind::Deth => {
            let Some(h) = r.deth() else { return };
            let _ = writeln!(out, "  DETH      datagram extended transport header");
            let qk = if h.qkey() == GSI_QKEY {
                "queue key: 0x80010000 is the well-known key of QP1 (GSI)"
            } else {
                "queue key; the receiving QP drops the datagram unless it matches its own"
            };
            field(out, "Q_Key", format!("0x{:08x}", h.qkey()), qk);
            field(
                out,
                "SrcQP",
                format!("0x{:06x}", h.src_qp()),
                "the QP that sent this datagram (reported as wc.src_qp)",
            );
        }
        HeaderKind::CnpReserved => {
            let zero = r
                .ext(HeaderKind::CnpReserved)
                .is_some_and(|b| b.iter().all(|&x| x == 0));
            let _ = writeln!(
                out,
                "  CNP       16 reserved bytes{}",
                if zero { " (zero)" } else { " (NOT zero)" }
            );
        }
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
        "  MAD       {} (class 0x{:02x} version {})  method {}  TID 0x{:016x}  attribute 0x{:04x} {}",
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
                "  CM REQ    connect request: local comm ID 0x{:08x}, service ID 0x{:016x}{}",
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
                "  CM REP    connect reply: local comm ID 0x{:08x}, remote comm ID 0x{:08x}",
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
                "  CM RTU    ready to use: local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}; the connection is established"
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
                "  CM REJ    reject of {what}: reason {} ({}); local comm ID 0x{:08x}, remote comm ID 0x{:08x}",
                r.reason,
                cm::reject_reason(r.reason),
                r.local_comm_id,
                r.remote_comm_id
            );
        }
        CmMessage::Mra(m) => {
            let _ = writeln!(
                out,
                "  CM MRA    message received, reply will take longer: service timeout code {}; local comm ID 0x{:08x}",
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
                "  CM DREQ   disconnect request for QP 0x{remote_qpn:06x}: local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}"
            );
        }
        CmMessage::Drep {
            local_comm_id,
            remote_comm_id,
            ..
        } => {
            let _ = writeln!(
                out,
                "  CM DREP   disconnect reply: local comm ID 0x{local_comm_id:08x}, remote comm ID 0x{remote_comm_id:08x}"
            );
        }
        CmMessage::SidrReq(r) => {
            let _ = writeln!(
                out,
                "  CM SIDR_REQ which UD QP serves service ID 0x{:016x} ({} port {})? request ID 0x{:08x}, P_Key 0x{:04x}",
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
                "  CM SIDR_REP status {} ({what}): service ID 0x{:016x} is served by UD QP 0x{:06x} with Q_Key 0x{:08x}; request ID 0x{:08x}",
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

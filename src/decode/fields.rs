//! Every header field of a RoCEv2 frame with the bytes it occupies, its value and what
//! that value means, citing the rule it follows. One list serves three views: the field
//! lines of `decode`'s full output, the marked bytes of `--hex`, and the field diagram of
//! `--html`, so the three cannot disagree.
//!
//! Citations: IBA = InfiniBand Architecture Specification volume 1 (release 1.4),
//! "A17" = its RoCEv2 annex, RFC 791 (IPv4), RFC 8200 (IPv6), RFC 768 (UDP), RFC 3168
//! (ECN), IEEE 802.1Q (VLAN tags).

use super::explain::{ecn_meaning, pkey_meaning};
use crate::wire::aeth::{CREDITS_INVALID, NakCode, Syndrome};
use crate::wire::deth::GSI_QKEY;
use crate::wire::eth::fmt_mac;
use crate::wire::frame::IpView;
use crate::wire::opcode::{HeaderKind, Operation, Transport};
use crate::wire::{Frame, bth, icrc};

/// One field: where it is in the frame, what it holds, what that means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// The header it belongs to: "Ethernet", "802.1Q", "IPv4", "IPv6", "UDP", "BTH",
    /// "RETH", "AETH", ..., "Payload", "Pad", "ICRC".
    pub layer: &'static str,
    pub name: &'static str,
    /// First byte, from the start of the frame (`Frame::bytes`).
    pub start: usize,
    /// Bytes it spans (a bit field: the bytes that hold its bits).
    pub len: usize,
    /// For a field narrower than its bytes: (most significant bit, width), the bits of
    /// its `len` bytes numbered from `8 * len - 1` (the first byte's top bit) down to 0.
    pub bits: Option<(u8, u8)>,
    pub value: String,
    pub meaning: String,
}

/// Builds the field list of a parsed frame, in wire order.
pub fn fields(f: &Frame<'_>) -> Vec<Field> {
    let mut v = Vec::with_capacity(40);
    link(&mut v, f);
    ip(&mut v, f);
    udp(&mut v, f);
    roce(&mut v, f);
    v
}

/// Appends one field. (Positional on purpose: each call reads as one row of the
/// header's table.)
#[allow(clippy::too_many_arguments)]
fn push(
    v: &mut Vec<Field>,
    layer: &'static str,
    name: &'static str,
    start: usize,
    len: usize,
    bits: Option<(u8, u8)>,
    value: impl Into<String>,
    meaning: impl Into<String>,
) {
    v.push(Field {
        layer,
        name,
        start,
        len,
        bits,
        value: value.into(),
        meaning: meaning.into(),
    });
}

fn be(b: &[u8], at: usize, len: usize) -> u64 {
    b.get(at..at + len)
        .unwrap_or(&[])
        .iter()
        .fold(0u64, |n, &x| (n << 8) | u64::from(x))
}

fn link(v: &mut Vec<Field>, f: &Frame<'_>) {
    let l3 = f.l3_offset();
    if l3 < 14 {
        return; // a capture without the Ethernet header (Linux cooked, raw IP)
    }
    let e = f.eth();
    push(
        v,
        "Ethernet",
        "Destination",
        0,
        6,
        None,
        fmt_mac(&e.dst).to_string(),
        "the next hop's MAC address (the peer's, or its router's), from the neighbour table",
    );
    push(
        v,
        "Ethernet",
        "Source",
        6,
        6,
        None,
        fmt_mac(&e.src).to_string(),
        "the sending port's MAC address",
    );
    let mut at = 12;
    if let Some(t) = e.vlan {
        push(
            v,
            "802.1Q",
            "TPID",
            12,
            2,
            None,
            "0x8100",
            "an 802.1Q VLAN tag follows (IEEE 802.1Q)",
        );
        push(
            v,
            "802.1Q",
            "PCP",
            14,
            2,
            Some((15, 3)),
            t.pcp.to_string(),
            "priority code point: the traffic class that PFC pauses (RoCE traffic usually has its own, lossless one)",
        );
        push(
            v,
            "802.1Q",
            "DEI",
            14,
            2,
            Some((12, 1)),
            u8::from(t.dei).to_string(),
            "drop eligible indicator",
        );
        push(
            v,
            "802.1Q",
            "VID",
            14,
            2,
            Some((11, 12)),
            t.vid.to_string(),
            "VLAN identifier",
        );
        at = 16;
    }
    let ipname = if e.ethertype == 0x0800 {
        "IPv4"
    } else {
        "IPv6"
    };
    push(
        v,
        "Ethernet",
        "EtherType",
        at,
        2,
        None,
        format!("0x{:04x}", e.ethertype),
        format!(
            "{ipname} follows: RoCEv2 is routable, carried in IP and UDP (IBA A17.2), unlike RoCEv1's EtherType 0x8915"
        ),
    );
}

fn ip(v: &mut Vec<Field>, f: &Frame<'_>) {
    let o = f.l3_offset();
    let b = f.bytes();
    match f.ip() {
        IpView::V4(h) => {
            let ihl = usize::from(h.ihl()) * 4;
            push(
                v,
                "IPv4",
                "Version",
                o,
                1,
                Some((7, 4)),
                "4",
                "IP version 4 (RFC 791)",
            );
            push(
                v,
                "IPv4",
                "IHL",
                o,
                1,
                Some((3, 4)),
                format!("{} ({ihl} bytes)", h.ihl()),
                "header length in 32-bit words; 5 means no options (RFC 791)",
            );
            push(
                v,
                "IPv4",
                "DSCP",
                o + 1,
                1,
                Some((7, 6)),
                h.dcp().value().to_string(),
                "differentiated services code point: the class switches queue the packet in (RFC 2474)",
            );
            push(
                v,
                "IPv4",
                "ECN",
                o + 1,
                1,
                Some((1, 2)),
                h.ecn().value().to_string(),
                format!(
                    "{} (RFC 3168; RoCEv2 congestion control, IBA A17.9)",
                    ecn_meaning(h.ecn().value())
                ),
            );
            push(
                v,
                "IPv4",
                "Total Length",
                o + 2,
                2,
                None,
                h.total_len().to_string(),
                "bytes of the IP packet, header included (RFC 791)",
            );
            push(
                v,
                "IPv4",
                "Identification",
                o + 4,
                2,
                None,
                format!("0x{:04x}", h.identification()),
                "fragment identifier; RoCEv2 packets are never fragmented, so any value is fine (RFC 6864); the ICRC covers it",
            );
            push(
                v,
                "IPv4",
                "Flags",
                o + 6,
                2,
                Some((15, 3)),
                if h.dont_fragment() { "DF" } else { "-" },
                "DF: routers must not fragment it (RFC 791); RoCE sets it, since a fragment would carry no BTH",
            );
            push(
                v,
                "IPv4",
                "Fragment Offset",
                o + 6,
                2,
                Some((12, 13)),
                "0",
                "first and only fragment",
            );
            push(
                v,
                "IPv4",
                "TTL",
                o + 8,
                1,
                None,
                h.ttl().to_string(),
                "hops left; masked out of the ICRC because routers change it (IBA A17.3.3)",
            );
            push(
                v,
                "IPv4",
                "Protocol",
                o + 9,
                1,
                None,
                "17 (UDP)",
                "UDP carries RoCEv2 (IBA A17.2)",
            );
            let ok = f.verify_ip_checksum().is_ok();
            push(
                v,
                "IPv4",
                "Header Checksum",
                o + 10,
                2,
                None,
                format!(
                    "0x{:04x} {}",
                    be(b, o + 10, 2),
                    if ok { "ok" } else { "BAD" }
                ),
                "ones' complement sum of the header (RFC 791); masked out of the ICRC since TTL changes it",
            );
            push(
                v,
                "IPv4",
                "Source",
                o + 12,
                4,
                None,
                h.source_addr().to_string(),
                "the sender; its GID is this address mapped into IPv6 (::ffff:a.b.c.d)",
            );
            push(
                v,
                "IPv4",
                "Destination",
                o + 16,
                4,
                None,
                h.destination_addr().to_string(),
                "the receiver; the QP's destination GID",
            );
            if ihl > 20 {
                push(
                    v,
                    "IPv4",
                    "Options",
                    o + 20,
                    ihl - 20,
                    None,
                    format!("{} bytes", ihl - 20),
                    "IP options (unusual for RoCE)",
                );
            }
        }
        IpView::V6(h) => {
            push(
                v,
                "IPv6",
                "Version",
                o,
                1,
                Some((7, 4)),
                "6",
                "IP version 6 (RFC 8200)",
            );
            push(
                v,
                "IPv6",
                "Traffic Class",
                o,
                2,
                Some((11, 8)),
                format!("0x{:02x}", h.traffic_class()),
                format!(
                    "DSCP and ECN; ECN {}: {} (RFC 3168, IBA A17.9); masked out of the ICRC",
                    h.ecn().value(),
                    ecn_meaning(h.ecn().value())
                ),
            );
            push(
                v,
                "IPv6",
                "Flow Label",
                o + 1,
                3,
                Some((19, 20)),
                format!("0x{:05x}", h.flow_label().value()),
                "lets routers keep a flow on one path; masked out of the ICRC (IBA A17.3.3)",
            );
            push(
                v,
                "IPv6",
                "Payload Length",
                o + 4,
                2,
                None,
                h.payload_length().to_string(),
                "bytes after the 40-byte header (RFC 8200)",
            );
            push(
                v,
                "IPv6",
                "Next Header",
                o + 6,
                1,
                None,
                "17 (UDP)",
                "UDP carries RoCEv2 (IBA A17.2)",
            );
            push(
                v,
                "IPv6",
                "Hop Limit",
                o + 7,
                1,
                None,
                h.hop_limit().to_string(),
                "hops left; masked out of the ICRC because routers change it (IBA A17.3.3)",
            );
            push(
                v,
                "IPv6",
                "Source",
                o + 8,
                16,
                None,
                h.source_addr().to_string(),
                "the sender's address, which is its GID",
            );
            push(
                v,
                "IPv6",
                "Destination",
                o + 24,
                16,
                None,
                h.destination_addr().to_string(),
                "the receiver's address: the QP's destination GID",
            );
        }
    }
}

fn udp(v: &mut Vec<Field>, f: &Frame<'_>) {
    let o = f.l4_offset();
    let u = f.udp();
    push(
        v,
        "UDP",
        "Source Port",
        o,
        2,
        None,
        u.source_port().to_string(),
        "chosen by the sender per QP so that switches spread flows over paths (entropy, IBA A17.4.1); covered by the ICRC",
    );
    push(
        v,
        "UDP",
        "Destination Port",
        o + 2,
        2,
        None,
        u.destination_port().to_string(),
        "4791: the IANA port of RoCEv2 (IBA A17.4.1)",
    );
    push(
        v,
        "UDP",
        "Length",
        o + 4,
        2,
        None,
        u.length().to_string(),
        "UDP header and payload in bytes (RFC 768)",
    );
    let c = u.checksum();
    let (value, meaning) = match (c, f.verify_udp_checksum()) {
        (0, _) => ("0x0000".to_string(),
            "none: allowed over IPv4 (RFC 768) and used by rxe; the ICRC protects the packet; masked out of the ICRC (IBA A17.3.3)".to_string()),
        (c, Ok(())) => (format!("0x{c:04x} ok"), "ones' complement checksum (RFC 768); masked out of the ICRC".to_string()),
        (c, Err(_)) => (format!("0x{c:04x} BAD"), "does not match the packet (RFC 768): a receiver's IP stack drops it".to_string()),
    };
    push(v, "UDP", "Checksum", o + 6, 2, None, value, meaning);
}

fn roce(v: &mut Vec<Field>, f: &Frame<'_>) {
    let base = f.bth_offset();
    let r = f.roce();
    let info = r.info();
    let b = r.bth();
    push(
        v,
        "BTH",
        "OpCode",
        base,
        1,
        None,
        format!("0x{:02x} {}", info.code, info.name),
        format!(
            "{} (IBA 9.2.1, table 38: the top 3 bits are the transport, the low 5 the operation)",
            info.meaning
        ),
    );
    push(
        v,
        "BTH",
        "SE",
        base + 1,
        1,
        Some((7, 1)),
        u8::from(b.solicited()).to_string(),
        if b.solicited() {
            "solicited event: the receiver's CQ wakes a consumer waiting for solicited completions (IBA 9.2.2)"
        } else {
            "no solicited event requested (IBA 9.2.2)"
        },
    );
    push(
        v,
        "BTH",
        "MigReq",
        base + 1,
        1,
        Some((6, 1)),
        u8::from(b.mig_req()).to_string(),
        "path-migration state (APM, IBA 9.2.3); RoCE senders do not migrate paths",
    );
    let pad = b.pad_count();
    push(
        v,
        "BTH",
        "PadCnt",
        base + 1,
        1,
        Some((5, 2)),
        pad.to_string(),
        if pad == 0 {
            "no pad bytes: the payload ends on a 4-byte boundary (IBA 9.2.4)".to_string()
        } else {
            format!("{pad} pad byte(s) after the payload bring it to a 4-byte boundary (IBA 9.2.4)")
        },
    );
    push(
        v,
        "BTH",
        "TVer",
        base + 1,
        1,
        Some((3, 4)),
        b.tver().to_string(),
        "transport header version; 0 is the only one, a receiver drops any other (IBA 9.2.5)",
    );
    push(
        v,
        "BTH",
        "P_Key",
        base + 2,
        2,
        None,
        format!("0x{:04x}", b.pkey()),
        format!(
            "partition key: {} (IBA 9.2.6, 10.9); a mismatch is dropped silently",
            pkey_meaning(b.pkey())
        ),
    );
    push(
        v,
        "BTH",
        "FECN",
        base + 4,
        1,
        Some((7, 1)),
        u8::from(b.fecn()).to_string(),
        if b.fecn() {
            "forward congestion seen on the way here (IBA A17.9)"
        } else {
            "no congestion marked on the way here"
        },
    );
    push(
        v,
        "BTH",
        "BECN",
        base + 4,
        1,
        Some((6, 1)),
        u8::from(b.becn()).to_string(),
        if b.becn() {
            "congestion reported for the opposite direction (IBA A17.9)"
        } else {
            "no congestion reported back"
        },
    );
    push(
        v,
        "BTH",
        "Resv6",
        base + 4,
        1,
        Some((5, 6)),
        "0",
        "reserved: senders write 0; this whole byte (FECN, BECN, Resv6) is masked to ones in the ICRC (IBA A17.3.3)",
    );
    let qp = b.dest_qp();
    let qp_meaning = if info.transport == Transport::Cnp {
        "the QP whose sender should slow down (IBA A17.9.3)".to_string()
    } else if qp == 1 {
        "QP1: the General Services QP that carries management datagrams, the CM's among them (IBA 13.5.1)".to_string()
    } else if info.request {
        "the responder's QP this request is for (IBA 9.2.7)".to_string()
    } else {
        "the requester's QP this response goes back to (IBA 9.2.7)".to_string()
    };
    push(
        v,
        "BTH",
        "DestQP",
        base + 5,
        3,
        None,
        format!("0x{qp:06x}"),
        qp_meaning,
    );
    let ack_meaning = if !info.request {
        "not used in responses"
    } else if matches!(info.transport, Transport::Uc | Transport::Ud) {
        "no meaning here: UC and UD are never acknowledged"
    } else if b.ack_req() {
        "the responder must acknowledge this packet (IBA 9.2.8, 9.7.5.1.8)"
    } else {
        "no acknowledgement requested; the responder may still ACK later packets, which cover this one (IBA 9.7.5.1.8)"
    };
    push(
        v,
        "BTH",
        "AckReq",
        base + 8,
        1,
        Some((7, 1)),
        u8::from(b.ack_req()).to_string(),
        ack_meaning,
    );
    push(
        v,
        "BTH",
        "Resv7",
        base + 8,
        1,
        Some((6, 7)),
        "0",
        "reserved",
    );
    let psn_meaning = match info.operation {
        Operation::ReadRequest => {
            "a READ takes one PSN per response packet it asks for (DMALen / path MTU); the next request's PSN follows them (IBA 9.7.1)"
        }
        _ if info.request && info.transport == Transport::Rc => {
            "requests are numbered one by one, modulo 2^24; the responder expects them in order and NAKs a gap (IBA 9.7.1, 9.7.5.1.1)"
        }
        _ if info.transport == Transport::Ud => {
            "not checked by UD receivers: every datagram stands alone (IBA 9.8)"
        }
        _ if info.request => {
            "UC: a gap tells the receiver a packet was lost; it drops the rest of that message (IBA 9.6.1)"
        }
        Operation::Ack
            if matches!(
                r.aeth().map(|a| a.syndrome()),
                Some(Syndrome::Nak(_) | Syndrome::RnrNak { .. })
            ) =>
        {
            "the PSN refused: every request before it is acknowledged; this one and those after it are not (IBA 9.7.5.2)"
        }
        Operation::Ack | Operation::AtomicAck => {
            "the last request PSN this response acknowledges (or NAKs); every request up to it is covered (IBA 9.7.5.1.8, 9.7.5.2)"
        }
        Operation::ReadResponse => "the PSN slot of the READ request this data answers (IBA 9.7.1)",
        _ => "sequence number",
    };
    push(
        v,
        "BTH",
        "PSN",
        base + 9,
        3,
        None,
        format!("0x{:06x} ({})", b.psn().value(), b.psn().value()),
        psn_meaning,
    );

    for &k in info.headers {
        let Some(off) = info.offset(k) else { continue };
        ext(v, f, k, base + bth::LEN + off);
    }

    let po = base + r.payload_offset();
    let plen = r.payload_len();
    if plen > 0 || info.payload {
        let mut meaning = match info.operation {
            Operation::Send => "message data, placed in the receiver's posted receive buffer".to_string(),
            Operation::Write => "data written to the remote buffer the RETH named (later packets continue at the next address)".to_string(),
            Operation::ReadResponse => "data read from the responder's memory, for the requester's local buffer".to_string(),
            _ => "payload".to_string(),
        };
        if qp == 1 && info.transport == Transport::Ud {
            meaning = match super::explain::cm_tag(r.payload()) {
                Some(tag) => format!(
                    "a 256-byte management datagram (MAD, IBA 13.4): {tag}; decoded in the full view"
                ),
                None => "a 256-byte management datagram (MAD, IBA 13.4)".to_string(),
            };
        }
        if matches!(
            info.operation,
            Operation::Send | Operation::Write | Operation::ReadResponse
        ) {
            meaning
                .push_str("; FIRST and MIDDLE packets carry exactly one path MTU (IBA 9.7.5.1.5)");
        }
        push(
            v,
            "Payload",
            "Data",
            po,
            plen,
            None,
            format!("{plen} bytes"),
            meaning,
        );
    }
    if pad > 0 {
        push(
            v,
            "Pad",
            "Pad",
            po + plen,
            usize::from(pad),
            None,
            format!("{pad} bytes"),
            "pad bytes the PadCnt announced, zero (IBA 9.2.4); covered by the ICRC",
        );
    }
    let at = base + r.as_bytes().len() - icrc::LEN;
    let wire = r.icrc();
    let computed = f.computed_icrc();
    let (value, meaning) = if wire == computed {
        (format!("0x{wire:08x} ok"),
            "invariant CRC: CRC-32 over the IP, UDP and RoCE headers and payload with the fields routers may change (TTL, ECN/traffic class, flow label, checksums) masked to ones, sent least significant byte first (IBA A17.3.3)".to_string())
    } else {
        (
            format!("0x{wire:08x} BAD"),
            format!(
                "should be 0x{computed:08x}: corrupted on the way; a receiver drops it silently, and an RC requester times out and retransmits (IBA A17.3.3, 9.9.1)"
            ),
        )
    };
    push(v, "ICRC", "ICRC", at, icrc::LEN, None, value, meaning);
}

fn ext(v: &mut Vec<Field>, f: &Frame<'_>, k: HeaderKind, o: usize) {
    let r = f.roce();
    let info = r.info();
    match k {
        HeaderKind::Reth => {
            let Some(h) = r.reth() else { return };
            let read = info.operation == Operation::ReadRequest;
            push(
                v,
                "RETH",
                "VA",
                o,
                8,
                None,
                format!("0x{:016x}", h.va()),
                if read {
                    "remote virtual address to read from (IBA 9.3.3)"
                } else {
                    "remote virtual address the data is written to (IBA 9.3.3)"
                },
            );
            push(
                v,
                "RETH",
                "R_Key",
                o + 8,
                4,
                None,
                format!("0x{:08x}", h.rkey()),
                if read {
                    "remote key; the responder checks it grants REMOTE_READ on the whole range, or NAKs remote access error (IBA 9.7.5.1.4, 10.6.3)"
                } else {
                    "remote key; the responder checks it grants REMOTE_WRITE on the whole range, or NAKs remote access error (IBA 9.7.5.1.4, 10.6.3)"
                },
            );
            push(
                v,
                "RETH",
                "DMALen",
                o + 12,
                4,
                None,
                h.dma_len().to_string(),
                if read {
                    "bytes to read; they come back in DMALen / path MTU response packets (IBA 9.3.3, 9.7.1)"
                } else {
                    "length of the whole message in bytes, all its packets (IBA 9.3.3)"
                },
            );
        }
        HeaderKind::Aeth => {
            let Some(h) = r.aeth() else { return };
            let s = h.syndrome();
            let extra = match s {
                Syndrome::Ack {
                    credits: CREDITS_INVALID,
                } => " (credit count 31: no end-to-end flow control; rxe always sends it)",
                Syndrome::Ack { .. } => " (IBA 9.7.7.2: receive credits)",
                Syndrome::Nak(NakCode::PsnSequenceError) => {
                    "; the requester goes back to this PSN and sends everything again from it (go-back-N, IBA 9.7.5.2.1, 9.7.4)"
                }
                Syndrome::Nak(_) => {
                    "; fatal: the requester completes the WR in error and its QP goes to ERR (IBA 9.7.5.2.4-6, 10.3.1)"
                }
                Syndrome::RnrNak { .. } => {
                    "; no receive buffer was posted: the requester waits the RNR timer (IBA table 45) and sends again (IBA 9.7.5.2.8)"
                }
                Syndrome::Reserved(_) => {
                    "; a reserved syndrome: a requester treats it as a fatal error (IBA 9.7.5.2)"
                }
            };
            push(
                v,
                "AETH",
                "Syndrome",
                o,
                1,
                None,
                format!("0x{:02x}", h.syndrome_byte()),
                format!("{s}{extra} (IBA 9.3.5, tables 42-43)"),
            );
            push(
                v,
                "AETH",
                "MSN",
                o + 1,
                3,
                None,
                h.msn().to_string(),
                "message sequence number: how many messages the responder has completed, modulo 2^24 (IBA 9.7.5.1.9)",
            );
        }
        HeaderKind::AtomicEth => {
            let Some(h) = r.atomic_eth() else { return };
            let cas = info.operation == Operation::CompareSwap;
            push(
                v,
                "AtomicETH",
                "VA",
                o,
                8,
                None,
                format!("0x{:016x}", h.va()),
                "remote address of the 8-byte operand; must be 8-byte aligned or the responder NAKs invalid request (IBA 9.4.5)",
            );
            push(
                v,
                "AtomicETH",
                "R_Key",
                o + 8,
                4,
                None,
                format!("0x{:08x}", h.rkey()),
                "remote key; must grant REMOTE_ATOMIC (IBA 9.3.4, 10.6.3)",
            );
            push(
                v,
                "AtomicETH",
                if cas { "Swap" } else { "Add" },
                o + 12,
                8,
                None,
                format!("0x{:x}", h.swap_add()),
                if cas {
                    "written if the remote value equals Compare (IBA 9.4.5)"
                } else {
                    "added to the remote value (IBA 9.4.5)"
                },
            );
            push(
                v,
                "AtomicETH",
                "Compare",
                o + 20,
                8,
                None,
                format!("0x{:x}", h.compare()),
                if cas {
                    "value the remote 8 bytes are compared with (IBA 9.4.5)"
                } else {
                    "unused by FETCH_ADD"
                },
            );
        }
        HeaderKind::AtomicAckEth => {
            let Some(h) = r.atomic_ack_eth() else { return };
            push(
                v,
                "AtomicAckETH",
                "OrigData",
                o,
                8,
                None,
                format!("0x{:x}", h.orig()),
                "what the remote 8 bytes held before the atomic ran, for the requester's buffer (IBA 9.3.6, 9.4.5)",
            );
        }
        HeaderKind::ImmDt => {
            let Some(x) = r.immdt() else { return };
            push(
                v,
                "ImmDt",
                "ImmDt",
                o,
                4,
                None,
                format!("0x{x:08x}"),
                "handed to the receiver in its completion (wc.imm_data); consumes a receive WQE (IBA 9.3.7, 9.4.1)",
            );
        }
        HeaderKind::Ieth => {
            let Some(x) = r.ieth() else { return };
            push(
                v,
                "IETH",
                "R_Key",
                o,
                4,
                None,
                format!("0x{x:08x}"),
                "the responder invalidates this R_Key when the SEND completes (IBA 9.3.8, 10.6.6)",
            );
        }
        HeaderKind::Deth => {
            let Some(h) = r.deth() else { return };
            let qk = if h.qkey() == GSI_QKEY {
                "queue key: 0x80010000 is the well-known key of QP1, the GSI (IBA 13.5.1)"
            } else {
                "queue key; the receiving QP drops the datagram unless it matches its own (IBA 9.3.2, 10.2.5)"
            };
            push(
                v,
                "DETH",
                "Q_Key",
                o,
                4,
                None,
                format!("0x{:08x}", h.qkey()),
                qk,
            );
            push(v, "DETH", "Reserved", o + 4, 1, None, "0", "reserved");
            push(
                v,
                "DETH",
                "SrcQP",
                o + 5,
                3,
                None,
                format!("0x{:06x}", h.src_qp()),
                "the QP that sent this datagram, reported as wc.src_qp (IBA 9.3.2)",
            );
        }
        HeaderKind::CnpReserved => {
            let zero = r
                .ext(HeaderKind::CnpReserved)
                .is_some_and(|b| b.iter().all(|&x| x == 0));
            push(
                v,
                "CNP",
                "Reserved",
                o,
                16,
                None,
                if zero { "zero" } else { "NOT zero" },
                "16 reserved bytes of a congestion notification packet (IBA A17.9.3)",
            );
        }
    }
}

/// `decode --hex`: the frame's bytes, each field on its own line with the bytes it
/// occupies, bit fields that share bytes on one line. Long fields (the payload) show
/// their first 16 bytes.
pub fn hex_view(out: &mut String, f: &Frame<'_>) {
    use std::fmt::Write as _;
    let b = f.bytes();
    let all = fields(f);
    let _ = writeln!(
        out,
        "  Bytes ({} in the frame; offset: bytes  header field = value):",
        b.len()
    );
    let mut i = 0;
    while i < all.len() {
        let x = &all[i];
        // Bit fields packed into the same bytes go on one line.
        let mut j = i + 1;
        while j < all.len() && x.bits.is_some() && all[j].start == x.start && all[j].len == x.len {
            j += 1;
        }
        let raw = b
            .get(x.start..(x.start + x.len).min(b.len()))
            .unwrap_or(&[]);
        // Up to 16 bytes; a longer field (the payload) shows its first 8, then "...".
        let hex = super::explain::hex_preview(raw, if raw.len() > 16 { 8 } else { 16 });
        let range = if x.len > 1 {
            format!("{:04x}-{:04x}", x.start, x.start + x.len - 1)
        } else {
            format!("{:04x}     ", x.start)
        };
        let names: Vec<String> = all[i..j]
            .iter()
            .map(|y| match y.bits {
                Some((hi, w)) if w > 1 => {
                    format!("{} = {} (bits {hi}-{})", y.name, y.value, hi + 1 - w)
                }
                Some((hi, _)) => format!("{} = {} (bit {hi})", y.name, y.value),
                None => format!("{} = {}", y.name, y.value),
            })
            .collect();
        let _ = writeln!(
            out,
            "    {range}  {hex:<26} {:<9} {}",
            x.layer,
            names.join(", ")
        );
        i = j;
    }
}

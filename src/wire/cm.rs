//! Communication Manager messages (IBA 12.6, 12.11) carried in CM MADs on QP1: checked
//! decoding of every field of REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR_REQ and SIDR_REP,
//! so a handshake can be shown, and emission of the same, so the engine's CM can speak
//! them; plus the rdma_cm IP header that leads a REQ's (and SIDR_REQ's) private data.
//! `parse(emit(m)) == m`, and a real rxe message re-emits to its own bytes.
//!
//! Offsets count from the start of the MAD's class data (after the 24-byte header), as
//! in the kernel's `ibta_vol1_c12.h`. Bit fields are numbered from the most significant
//! bit of their byte.

use super::{Error, Layer, Result, get_u16, get_u24, get_u32, get_u64, mad};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// CM attribute IDs.
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001a;
}

/// Name of a CM attribute.
pub fn attr_name(id: u16) -> &'static str {
    match id {
        0x0001 => "ClassPortInfo",
        attr::REQ => "REQ (connect request)",
        attr::MRA => "MRA (message receipt acknowledgement)",
        attr::REJ => "REJ (reject)",
        attr::REP => "REP (connect reply)",
        attr::RTU => "RTU (ready to use)",
        attr::DREQ => "DREQ (disconnect request)",
        attr::DREP => "DREP (disconnect reply)",
        attr::SIDR_REQ => "SIDR_REQ (service ID resolution request)",
        attr::SIDR_REP => "SIDR_REP (service ID resolution reply)",
        attr::LAP => "LAP (load alternate path)",
        attr::APR => "APR (alternate path response)",
        _ => "unknown CM attribute",
    }
}

/// REJ reason codes (IBA table 112).
pub fn reject_reason(code: u16) -> &'static str {
    match code {
        1 => "no QP available",
        2 => "no EEC available",
        3 => "no resources available",
        4 => "timeout",
        5 => "unsupported request",
        6 => "invalid communication ID",
        7 => "invalid communication instance",
        8 => "invalid service ID (nobody listens on it)",
        9 => "invalid transport service type",
        10 => "stale connection",
        11 => "RDC does not exist",
        12 => "primary remote port GID rejected",
        13 => "primary remote port LID rejected",
        14 => "invalid primary SL",
        15 => "invalid primary traffic class",
        16 => "invalid primary hop limit",
        17 => "invalid primary packet rate",
        18 => "alternate remote port GID rejected",
        19 => "alternate remote port LID rejected",
        20 => "invalid alternate SL",
        21 => "invalid alternate traffic class",
        22 => "invalid alternate hop limit",
        23 => "invalid alternate packet rate",
        24 => "port redirection",
        26 => "invalid path MTU",
        27 => "insufficient responder resources",
        28 => "consumer reject",
        29 => "RNR retry count reject",
        30 => "duplicate local communication ID",
        31 => "unsupported class version",
        32 => "invalid primary flow label",
        33 => "invalid alternate flow label",
        _ => "reserved reason",
    }
}

/// Path MTU from its IBA code (1 = 256 ... 5 = 4096).
pub fn mtu_from_code(code: u8) -> Option<u32> {
    match code {
        1..=5 => Some(128u32 << code),
        _ => None,
    }
}

/// Name of a CM transport service type.
pub fn transport_name(t: u8) -> &'static str {
    match t {
        0 => "RC",
        1 => "UC",
        2 => "RD",
        _ => "reserved",
    }
}

/// The rdma_cm header at the start of a REQ's private data (`struct cma_hdr`, 36 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    pub cma_version: u8,
    pub ip_version: u8,
    /// The source (active side) port.
    pub src_port: u16,
    pub src: IpAddr,
    pub dst: IpAddr,
}

/// Length of the rdma_cm IP header.
pub const CMA_HEADER_LEN: usize = 36;

impl CmaHeader {
    /// Parses the header; `None` when the version nibble is neither 4 nor 6.
    pub fn parse(p: &[u8]) -> Option<CmaHeader> {
        let p = p.get(..CMA_HEADER_LEN)?;
        let ip_version = p[1] >> 4;
        let addr = |b: &[u8]| -> Option<IpAddr> {
            match ip_version {
                4 => Some(IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))),
                6 => {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&b[..16]);
                    Some(IpAddr::V6(Ipv6Addr::from(a)))
                }
                _ => None,
            }
        };
        Some(CmaHeader {
            cma_version: p[0],
            ip_version,
            src_port: get_u16(&p[2..4]),
            src: addr(&p[4..20])?,
            dst: addr(&p[20..36])?,
        })
    }
}

impl CmaHeader {
    /// Writes the 36-byte header (rdma_cm's `cma_hdr`: version 0, IP version in the high
    /// nibble of byte 1, the active side's port, then source and destination, an IPv4
    /// address in the last 4 bytes of its 16). An address of the other family than
    /// `ip_version` is written as an IPv4-mapped or zero address, as the kernel does not.
    pub fn emit(&self, p: &mut [u8]) -> Result<()> {
        super::check_len(Layer::Cm, p, CMA_HEADER_LEN)?;
        let p = &mut p[..CMA_HEADER_LEN];
        p.fill(0);
        p[0] = self.cma_version;
        p[1] = self.ip_version << 4;
        p[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        for (a, at) in [(self.src, 4), (self.dst, 20)] {
            match a {
                IpAddr::V4(v4) => p[at + 12..at + 16].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => p[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
        Ok(())
    }
}

/// True when a service ID belongs to rdma_cm's IP port spaces (TCP 0x0106, UDP 0x0111,
/// IB 0x013F, IPoIB 0x0002): then the low 16 bits are the port and the REQ's private
/// data starts with a [`CmaHeader`].
pub fn is_rdma_cm_service(sid: u64) -> bool {
    matches!(sid >> 16, 0x0106 | 0x0111 | 0x013f | 0x0002)
}

/// Name of the rdma_cm port space of a service ID.
pub fn port_space_name(sid: u64) -> &'static str {
    match sid >> 16 {
        0x0106 => "RDMA_PS_TCP",
        0x0111 => "RDMA_PS_UDP",
        0x013f => "RDMA_PS_IB",
        0x0002 => "RDMA_PS_IPOIB",
        _ => "not rdma_cm",
    }
}

/// A connect request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req<'a> {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    /// RD only (0 otherwise), as the two EECN fields.
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 2 RD.
    pub transport: u8,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    /// IBA MTU code (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport: u8,
    /// LIDs: 0xffff (permissive) on RoCE, where the GIDs address the ports.
    pub primary_local_lid: u16,
    pub primary_remote_lid: u16,
    pub primary_local_gid: [u8; 16],
    pub primary_remote_gid: [u8; 16],
    pub primary_flow_label: u32,
    pub primary_packet_rate: u8,
    pub primary_traffic_class: u8,
    pub primary_hop_limit: u8,
    pub primary_sl: u8,
    pub primary_subnet_local: bool,
    pub primary_local_ack_timeout: u8,
    /// The alternate path (bytes 96..140, APM), kept as it came: RoCE has none.
    pub alternate_path: &'a [u8],
    pub private_data: &'a [u8],
    /// The rdma_cm IP header, when the service ID is rdma_cm's.
    pub cma: Option<CmaHeader>,
}

/// A connect reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: &'a [u8],
}

/// A reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rej<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 0 REQ, 1 REP, 2 no message.
    pub message_rejected: u8,
    pub reject_info_len: u8,
    pub reason: u16,
    pub ari: &'a [u8],
    pub private_data: &'a [u8],
}

/// A message receipt acknowledgement ("I need more time").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra<'a> {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 0 REQ, 1 REP, 2 LAP.
    pub message_mraed: u8,
    pub service_timeout: u8,
    pub private_data: &'a [u8],
}

/// A service ID resolution request (IBA 12.11.1): which UD QP serves this service ID?
/// rdma_cm's RDMA_PS_UDP resolves with it (`udaddy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq<'a> {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: &'a [u8],
    /// The rdma_cm IP header, when the service ID is rdma_cm's.
    pub cma: Option<CmaHeader>,
}

/// The answer to a SIDR_REQ (IBA 12.11.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep<'a> {
    pub request_id: u32,
    /// 0 the QP is valid; 1 service ID not supported; 2 rejected by the service;
    /// 3 no QP; 4 redirect; 5 class version not supported.
    pub status: u8,
    pub additional_info_len: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    /// 72 bytes (ClassPortInfo on a redirect).
    pub additional_info: &'a [u8],
    pub private_data: &'a [u8],
}

/// A decoded CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage<'a> {
    Req(Req<'a>),
    Mra(Mra<'a>),
    Rej(Rej<'a>),
    Rep(Rep<'a>),
    /// Ready To Use: the active side's RC QP may now be used.
    Rtu {
        local_comm_id: u32,
        remote_comm_id: u32,
        private_data: &'a [u8],
    },
    Dreq {
        local_comm_id: u32,
        remote_comm_id: u32,
        remote_qpn: u32,
        private_data: &'a [u8],
    },
    Drep {
        local_comm_id: u32,
        remote_comm_id: u32,
        private_data: &'a [u8],
    },
    SidrReq(SidrReq<'a>),
    SidrRep(SidrRep<'a>),
    /// An attribute decoded only by name.
    Other(u16),
}

/// Length of a CM message: a MAD's class data (256 - 24 bytes).
pub const MESSAGE_LEN: usize = mad::MAD_LEN - mad::HEADER_LEN;
/// The most private data each message carries (IBA 12.6, tables 106-120).
pub const REQ_PDATA: usize = 92;
pub const MRA_PDATA: usize = 222;
pub const REJ_PDATA: usize = 148;
pub const REP_PDATA: usize = 196;
pub const RTU_PDATA: usize = 224;
pub const DREQ_PDATA: usize = 220;
pub const DREP_PDATA: usize = 224;
pub const SIDR_REQ_PDATA: usize = 216;
pub const SIDR_REP_PDATA: usize = 136;

/// Bits `[7 - off .. 7 - off - width + 1]` of a byte, counting from its MSB.
fn bits(b: u8, off: u8, width: u8) -> u8 {
    (b >> (8 - off - width)) & ((1u16 << width) - 1) as u8
}

/// Writes `v` into bits `[off, off + width)` of `b` (counted from its MSB), refusing a
/// value wider than the field: an emitted message never silently differs from its repr.
fn put_bits(b: &mut u8, off: u8, width: u8, v: u8, field: &'static str) -> Result<()> {
    let mask = ((1u16 << width) - 1) as u8;
    if v & !mask != 0 {
        return Err(Error::Malformed(field));
    }
    let shift = 8 - off - width;
    *b = (*b & !(mask << shift)) | (v << shift);
    Ok(())
}

/// A 24-bit field, refusing wider values.
fn put_24(b: &mut [u8], v: u32, field: &'static str) -> Result<()> {
    if v >> 24 != 0 {
        return Err(Error::Malformed(field));
    }
    super::put_u24(b, v);
    Ok(())
}

/// Copies private data to `at`, refusing more than the message holds.
fn put_pdata(d: &mut [u8], at: usize, max: usize, p: &[u8]) -> Result<()> {
    if p.len() > max {
        return Err(Error::Malformed(
            "CM private data longer than the message holds",
        ));
    }
    d[at..at + p.len()].copy_from_slice(p);
    Ok(())
}

/// Copies a fixed-size block (ARI, alternate path, additional information): it may be
/// shorter than its field (the rest stays zero), never longer.
fn put_block(d: &mut [u8], at: usize, max: usize, p: &[u8], field: &'static str) -> Result<()> {
    if p.len() > max {
        return Err(Error::Malformed(field));
    }
    d[at..at + p.len()].copy_from_slice(p);
    Ok(())
}

impl<'a> CmMessage<'a> {
    /// Decodes the class data `d` (the MAD after its header) of attribute `attr_id`.
    pub fn parse(attr_id: u16, d: &'a [u8]) -> Result<CmMessage<'a>> {
        let need = |n: usize| -> Result<()> {
            if d.len() < n {
                Err(Error::Truncated {
                    layer: Layer::Cm,
                    needed: n,
                    available: d.len(),
                })
            } else {
                Ok(())
            }
        };
        // The private data at `at`, at most `max` bytes (what the MAD holds of it).
        let pd = |at: usize, max: usize| &d[at.min(d.len())..d.len().min(at + max)];
        Ok(match attr_id {
            attr::REQ => {
                need(140)?;
                let service_id = get_u64(&d[8..16]);
                let private_data = pd(140, REQ_PDATA);
                let mut g1 = [0u8; 16];
                g1.copy_from_slice(&d[56..72]);
                let mut g2 = [0u8; 16];
                g2.copy_from_slice(&d[72..88]);
                CmMessage::Req(Req {
                    local_comm_id: get_u32(&d[0..4]),
                    service_id,
                    local_ca_guid: get_u64(&d[16..24]),
                    local_qkey: get_u32(&d[28..32]),
                    local_qpn: get_u24(&d[32..35]),
                    responder_resources: d[35],
                    local_eecn: get_u24(&d[36..39]),
                    initiator_depth: d[39],
                    remote_eecn: get_u24(&d[40..43]),
                    remote_cm_response_timeout: bits(d[43], 0, 5),
                    transport: bits(d[43], 5, 2),
                    end_to_end_flow_control: bits(d[43], 7, 1) != 0,
                    starting_psn: get_u24(&d[44..47]),
                    local_cm_response_timeout: bits(d[47], 0, 5),
                    retry_count: bits(d[47], 5, 3),
                    pkey: get_u16(&d[48..50]),
                    path_mtu: bits(d[50], 0, 4),
                    rdc_exists: bits(d[50], 4, 1) != 0,
                    rnr_retry_count: bits(d[50], 5, 3),
                    max_cm_retries: bits(d[51], 0, 4),
                    srq: bits(d[51], 4, 1) != 0,
                    extended_transport: bits(d[51], 5, 3),
                    primary_local_lid: get_u16(&d[52..54]),
                    primary_remote_lid: get_u16(&d[54..56]),
                    primary_local_gid: g1,
                    primary_remote_gid: g2,
                    primary_flow_label: get_u32(&d[88..92]) >> 12,
                    primary_packet_rate: bits(d[91], 2, 6),
                    primary_traffic_class: d[92],
                    primary_hop_limit: d[93],
                    primary_sl: bits(d[94], 0, 4),
                    primary_subnet_local: bits(d[94], 4, 1) != 0,
                    primary_local_ack_timeout: bits(d[95], 0, 5),
                    alternate_path: &d[96..140],
                    private_data,
                    cma: if is_rdma_cm_service(service_id) {
                        CmaHeader::parse(private_data)
                    } else {
                        None
                    },
                })
            }
            attr::REP => {
                need(36)?;
                CmMessage::Rep(Rep {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    local_qkey: get_u32(&d[8..12]),
                    local_qpn: get_u24(&d[12..15]),
                    local_eecn: get_u24(&d[16..19]),
                    starting_psn: get_u24(&d[20..23]),
                    responder_resources: d[24],
                    initiator_depth: d[25],
                    target_ack_delay: bits(d[26], 0, 5),
                    failover_accepted: bits(d[26], 5, 2),
                    end_to_end_flow_control: bits(d[26], 7, 1) != 0,
                    rnr_retry_count: bits(d[27], 0, 3),
                    srq: bits(d[27], 3, 1) != 0,
                    local_ca_guid: get_u64(&d[28..36]),
                    private_data: pd(36, REP_PDATA),
                })
            }
            attr::REJ => {
                need(84)?;
                CmMessage::Rej(Rej {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    message_rejected: bits(d[8], 0, 2),
                    reject_info_len: bits(d[9], 0, 7),
                    reason: get_u16(&d[10..12]),
                    ari: &d[12..84],
                    private_data: pd(84, REJ_PDATA),
                })
            }
            attr::MRA => {
                need(10)?;
                CmMessage::Mra(Mra {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    message_mraed: bits(d[8], 0, 2),
                    service_timeout: bits(d[9], 0, 5),
                    private_data: pd(10, MRA_PDATA),
                })
            }
            attr::RTU => {
                need(8)?;
                CmMessage::Rtu {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    private_data: pd(8, RTU_PDATA),
                }
            }
            attr::DREQ => {
                need(12)?;
                CmMessage::Dreq {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    remote_qpn: get_u24(&d[8..11]),
                    private_data: pd(12, DREQ_PDATA),
                }
            }
            attr::DREP => {
                need(8)?;
                CmMessage::Drep {
                    local_comm_id: get_u32(&d[0..4]),
                    remote_comm_id: get_u32(&d[4..8]),
                    private_data: pd(8, DREP_PDATA),
                }
            }
            attr::SIDR_REQ => {
                need(16)?;
                let service_id = get_u64(&d[8..16]);
                let private_data = pd(16, SIDR_REQ_PDATA);
                CmMessage::SidrReq(SidrReq {
                    request_id: get_u32(&d[0..4]),
                    pkey: get_u16(&d[4..6]),
                    service_id,
                    private_data,
                    cma: if is_rdma_cm_service(service_id) {
                        CmaHeader::parse(private_data)
                    } else {
                        None
                    },
                })
            }
            attr::SIDR_REP => {
                need(96)?;
                CmMessage::SidrRep(SidrRep {
                    request_id: get_u32(&d[0..4]),
                    status: d[4],
                    additional_info_len: d[5],
                    qpn: get_u24(&d[8..11]),
                    service_id: get_u64(&d[12..20]),
                    qkey: get_u32(&d[20..24]),
                    additional_info: &d[24..96],
                    private_data: pd(96, SIDR_REP_PDATA),
                })
            }
            other => CmMessage::Other(other),
        })
    }

    /// The MAD attribute ID of this message.
    pub fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu { .. } => attr::RTU,
            CmMessage::Dreq { .. } => attr::DREQ,
            CmMessage::Drep { .. } => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
            CmMessage::Other(a) => *a,
        }
    }

    /// Writes the message as a MAD's class data into `d` (at least [`MESSAGE_LEN`]
    /// bytes; reserved bits and unused private data zero). Fails on a value too wide
    /// for its field or private data too long, and for [`CmMessage::Other`].
    pub fn emit(&self, d: &mut [u8]) -> Result<()> {
        if d.len() < MESSAGE_LEN {
            return Err(Error::BufferTooSmall {
                needed: MESSAGE_LEN,
                available: d.len(),
            });
        }
        let d = &mut d[..MESSAGE_LEN];
        d.fill(0);
        let ids = |d: &mut [u8], local: u32, remote: u32| {
            d[0..4].copy_from_slice(&local.to_be_bytes());
            d[4..8].copy_from_slice(&remote.to_be_bytes());
        };
        match self {
            CmMessage::Req(r) => {
                d[0..4].copy_from_slice(&r.local_comm_id.to_be_bytes());
                d[8..16].copy_from_slice(&r.service_id.to_be_bytes());
                d[16..24].copy_from_slice(&r.local_ca_guid.to_be_bytes());
                d[28..32].copy_from_slice(&r.local_qkey.to_be_bytes());
                put_24(
                    &mut d[32..35],
                    r.local_qpn,
                    "REQ local QPN wider than 24 bits",
                )?;
                d[35] = r.responder_resources;
                put_24(
                    &mut d[36..39],
                    r.local_eecn,
                    "REQ local EECN wider than 24 bits",
                )?;
                d[39] = r.initiator_depth;
                put_24(
                    &mut d[40..43],
                    r.remote_eecn,
                    "REQ remote EECN wider than 24 bits",
                )?;
                let t = "REQ remote CM response timeout wider than 5 bits";
                put_bits(&mut d[43], 0, 5, r.remote_cm_response_timeout, t)?;
                put_bits(
                    &mut d[43],
                    5,
                    2,
                    r.transport,
                    "REQ transport wider than 2 bits",
                )?;
                put_bits(&mut d[43], 7, 1, r.end_to_end_flow_control.into(), "")?;
                put_24(
                    &mut d[44..47],
                    r.starting_psn,
                    "REQ starting PSN wider than 24 bits",
                )?;
                let t = "REQ local CM response timeout wider than 5 bits";
                put_bits(&mut d[47], 0, 5, r.local_cm_response_timeout, t)?;
                put_bits(
                    &mut d[47],
                    5,
                    3,
                    r.retry_count,
                    "REQ retry count wider than 3 bits",
                )?;
                d[48..50].copy_from_slice(&r.pkey.to_be_bytes());
                put_bits(
                    &mut d[50],
                    0,
                    4,
                    r.path_mtu,
                    "REQ path MTU wider than 4 bits",
                )?;
                put_bits(&mut d[50], 4, 1, r.rdc_exists.into(), "")?;
                let t = "REQ RNR retry count wider than 3 bits";
                put_bits(&mut d[50], 5, 3, r.rnr_retry_count, t)?;
                let t = "REQ max CM retries wider than 4 bits";
                put_bits(&mut d[51], 0, 4, r.max_cm_retries, t)?;
                put_bits(&mut d[51], 4, 1, r.srq.into(), "")?;
                let t = "REQ extended transport wider than 3 bits";
                put_bits(&mut d[51], 5, 3, r.extended_transport, t)?;
                d[52..54].copy_from_slice(&r.primary_local_lid.to_be_bytes());
                d[54..56].copy_from_slice(&r.primary_remote_lid.to_be_bytes());
                d[56..72].copy_from_slice(&r.primary_local_gid);
                d[72..88].copy_from_slice(&r.primary_remote_gid);
                if r.primary_flow_label >> 20 != 0 {
                    return Err(Error::Malformed("REQ flow label wider than 20 bits"));
                }
                d[88..92].copy_from_slice(&(r.primary_flow_label << 12).to_be_bytes());
                let t = "REQ packet rate wider than 6 bits";
                put_bits(&mut d[91], 2, 6, r.primary_packet_rate, t)?;
                d[92] = r.primary_traffic_class;
                d[93] = r.primary_hop_limit;
                put_bits(&mut d[94], 0, 4, r.primary_sl, "REQ SL wider than 4 bits")?;
                put_bits(&mut d[94], 4, 1, r.primary_subnet_local.into(), "")?;
                let t = "REQ local ACK timeout wider than 5 bits";
                put_bits(&mut d[95], 0, 5, r.primary_local_ack_timeout, t)?;
                let t = "REQ alternate path longer than 44 bytes";
                put_block(d, 96, 44, r.alternate_path, t)?;
                put_pdata(d, 140, REQ_PDATA, r.private_data)?;
            }
            CmMessage::Rep(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8..12].copy_from_slice(&r.local_qkey.to_be_bytes());
                put_24(
                    &mut d[12..15],
                    r.local_qpn,
                    "REP local QPN wider than 24 bits",
                )?;
                put_24(
                    &mut d[16..19],
                    r.local_eecn,
                    "REP local EECN wider than 24 bits",
                )?;
                put_24(
                    &mut d[20..23],
                    r.starting_psn,
                    "REP starting PSN wider than 24 bits",
                )?;
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                let t = "REP target ACK delay wider than 5 bits";
                put_bits(&mut d[26], 0, 5, r.target_ack_delay, t)?;
                let t = "REP failover accepted wider than 2 bits";
                put_bits(&mut d[26], 5, 2, r.failover_accepted, t)?;
                put_bits(&mut d[26], 7, 1, r.end_to_end_flow_control.into(), "")?;
                let t = "REP RNR retry count wider than 3 bits";
                put_bits(&mut d[27], 0, 3, r.rnr_retry_count, t)?;
                put_bits(&mut d[27], 3, 1, r.srq.into(), "")?;
                d[28..36].copy_from_slice(&r.local_ca_guid.to_be_bytes());
                put_pdata(d, 36, REP_PDATA, r.private_data)?;
            }
            CmMessage::Rej(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                let t = "REJ message rejected wider than 2 bits";
                put_bits(&mut d[8], 0, 2, r.message_rejected, t)?;
                let t = "REJ info length wider than 7 bits";
                put_bits(&mut d[9], 0, 7, r.reject_info_len, t)?;
                d[10..12].copy_from_slice(&r.reason.to_be_bytes());
                put_block(d, 12, 72, r.ari, "REJ ARI longer than 72 bytes")?;
                put_pdata(d, 84, REJ_PDATA, r.private_data)?;
            }
            CmMessage::Mra(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                let t = "MRA message MRAed wider than 2 bits";
                put_bits(&mut d[8], 0, 2, m.message_mraed, t)?;
                let t = "MRA service timeout wider than 5 bits";
                put_bits(&mut d[9], 0, 5, m.service_timeout, t)?;
                put_pdata(d, 10, MRA_PDATA, m.private_data)?;
            }
            CmMessage::Rtu {
                local_comm_id,
                remote_comm_id,
                private_data,
            } => {
                ids(d, *local_comm_id, *remote_comm_id);
                put_pdata(d, 8, RTU_PDATA, private_data)?;
            }
            CmMessage::Dreq {
                local_comm_id,
                remote_comm_id,
                remote_qpn,
                private_data,
            } => {
                ids(d, *local_comm_id, *remote_comm_id);
                put_24(
                    &mut d[8..11],
                    *remote_qpn,
                    "DREQ remote QPN wider than 24 bits",
                )?;
                put_pdata(d, 12, DREQ_PDATA, private_data)?;
            }
            CmMessage::Drep {
                local_comm_id,
                remote_comm_id,
                private_data,
            } => {
                ids(d, *local_comm_id, *remote_comm_id);
                put_pdata(d, 8, DREP_PDATA, private_data)?;
            }
            CmMessage::SidrReq(r) => {
                d[0..4].copy_from_slice(&r.request_id.to_be_bytes());
                d[4..6].copy_from_slice(&r.pkey.to_be_bytes());
                d[8..16].copy_from_slice(&r.service_id.to_be_bytes());
                put_pdata(d, 16, SIDR_REQ_PDATA, r.private_data)?;
            }
            CmMessage::SidrRep(r) => {
                d[0..4].copy_from_slice(&r.request_id.to_be_bytes());
                d[4] = r.status;
                d[5] = r.additional_info_len;
                put_24(&mut d[8..11], r.qpn, "SIDR_REP QPN wider than 24 bits")?;
                d[12..20].copy_from_slice(&r.service_id.to_be_bytes());
                d[20..24].copy_from_slice(&r.qkey.to_be_bytes());
                let t = "SIDR_REP additional information longer than 72 bytes";
                put_block(d, 24, 72, r.additional_info, t)?;
                put_pdata(d, 96, SIDR_REP_PDATA, r.private_data)?;
            }
            CmMessage::Other(_) => {
                return Err(Error::Malformed("only the CM messages can be emitted"));
            }
        }
        Ok(())
    }

    /// Writes a whole 256-byte CM MAD: the common header (`hdr`, with this message's
    /// attribute ID) and the message.
    pub fn emit_mad(&self, hdr: &mad::Repr, m: &mut [u8]) -> Result<()> {
        if m.len() < mad::MAD_LEN {
            return Err(Error::BufferTooSmall {
                needed: mad::MAD_LEN,
                available: m.len(),
            });
        }
        mad::Repr {
            attribute_id: self.attribute_id(),
            ..*hdr
        }
        .emit(m)?;
        self.emit(&mut m[mad::HEADER_LEN..mad::MAD_LEN])
    }

    /// Decodes a whole CM MAD; `None` if it is not of the CM class.
    pub fn from_mad(m: &'a [u8]) -> Result<Option<(mad::Repr, CmMessage<'a>)>> {
        let h = mad::Header::new_checked(m)?;
        if h.mgmt_class() != mad::CLASS_CM {
            return Ok(None);
        }
        let r = mad::Repr::parse(&h);
        Ok(Some((
            r,
            CmMessage::parse(r.attribute_id, &m[mad::HEADER_LEN..])?,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_fields_count_from_the_msb() {
        assert_eq!(bits(0b1010_1110, 0, 5), 0b10101);
        assert_eq!(bits(0b1010_1110, 5, 2), 0b11);
        assert_eq!(bits(0b1010_1110, 7, 1), 0);
        assert_eq!(bits(0b1110_0000, 0, 3), 7);
    }

    #[test]
    fn req_fields() {
        let mut d = [0u8; 232];
        d[0..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        d[8..16].copy_from_slice(&0x0000_0000_0106_4a6bu64.to_be_bytes());
        d[32..35].copy_from_slice(&[0, 0, 0x11]);
        d[35] = 4;
        d[43] = (20 << 3) | 1; // timeout 20, transport 0 (RC), e2e flow control
        d[44..47].copy_from_slice(&[0xab, 0xcd, 0xef]);
        d[47] = (20 << 3) | 7;
        d[48..50].copy_from_slice(&[0xff, 0xff]);
        d[50] = (3 << 4) | 7; // MTU 1024, rnr 7
        d[140] = 0;
        d[141] = 0x40;
        d[142..144].copy_from_slice(&[0x9c, 0x40]);
        d[140 + 16..140 + 20].copy_from_slice(&[198, 18, 0, 2]);
        d[140 + 32..140 + 36].copy_from_slice(&[198, 18, 0, 1]);
        let CmMessage::Req(r) = CmMessage::parse(attr::REQ, &d).unwrap() else {
            panic!()
        };
        assert_eq!(r.local_comm_id, 0x1234_5678);
        assert_eq!(r.local_qpn, 0x11);
        assert_eq!(r.responder_resources, 4);
        assert_eq!(r.remote_cm_response_timeout, 20);
        assert_eq!(r.transport, 0);
        assert_eq!(r.starting_psn, 0xabcdef);
        assert_eq!(r.retry_count, 7);
        assert_eq!(mtu_from_code(r.path_mtu), Some(1024));
        assert_eq!(r.rnr_retry_count, 7);
        assert_eq!(r.private_data.len(), 92);
        let c = r.cma.unwrap();
        assert_eq!(c.src_port, 40000);
        assert_eq!(c.src, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        assert_eq!(c.dst, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(port_space_name(r.service_id), "RDMA_PS_TCP");
        assert!(CmMessage::parse(attr::REQ, &d[..139]).is_err());
    }

    #[test]
    fn short_messages_are_errors_not_panics() {
        for a in [
            attr::REP,
            attr::REJ,
            attr::MRA,
            attr::RTU,
            attr::DREQ,
            attr::DREP,
        ] {
            for n in 0..8 {
                assert!(CmMessage::parse(a, &[0u8; 8][..n]).is_err());
            }
        }
        assert_eq!(reject_reason(28), "consumer reject");
    }
}

//! Hand-built hostile frames for the hostile-peer tests (simulated and AF_XDP): any
//! opcode, PSN, key, address and length, with a correct ICRC unless a test breaks it.
#![allow(dead_code)]

use roce_xdp::engine::Counters;
use roce_xdp::wire::*;
use std::net::Ipv4Addr;

/// A hand-built packet from the attacker.
pub struct Pkt {
    pub op: Opcode,
    pub qpn: u32,
    pub psn: u32,
    pub ext: ExtRepr,
    pub payload: Vec<u8>,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    pub pkey: u16,
}

/// A MAC and IPv4 address: one end of a hand-built packet.
pub type Addr = ([u8; 6], Ipv4Addr);

impl Pkt {
    /// A packet from `from` to QP `qpn` at `to`, with the default P_Key.
    pub fn new(
        op: Opcode,
        qpn: u32,
        psn: u32,
        ext: ExtRepr,
        payload: &[u8],
        from: Addr,
        to: Addr,
    ) -> Pkt {
        Pkt {
            op,
            qpn,
            psn,
            ext,
            payload: payload.to_vec(),
            src_mac: from.0,
            dst_mac: to.0,
            src_ip: from.1,
            dst_ip: to.1,
            pkey: bth::DEFAULT_PKEY,
        }
    }

    /// A WRITE ONLY of `payload` to `va` under `rkey`.
    pub fn write_only(
        qpn: u32,
        psn: u32,
        (rkey, va): (u32, u64),
        payload: &[u8],
        from: Addr,
        to: Addr,
    ) -> Pkt {
        let ext = ExtRepr {
            reth: Some(RethRepr {
                va,
                rkey,
                dma_len: payload.len() as u32,
            }),
            ..ExtRepr::default()
        };
        Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, qpn, psn, ext, payload, from, to)
    }

    pub fn emit(&self) -> Vec<u8> {
        let repr = FrameRepr {
            eth: EthRepr {
                dst: self.dst_mac,
                src: self.src_mac,
                vlan: None,
                ethertype: 0x0800,
            },
            ip: IpRepr::V4(Ipv4Repr::new(self.src_ip, self.dst_ip, 0)),
            udp: UdpRepr {
                src_port: 49152,
                dst_port: ROCE_V2_PORT,
            },
            roce: RoceRepr {
                bth: BthRepr {
                    pkey: self.pkey,
                    ack_req: true,
                    ..BthRepr::new(self.op, self.qpn, Psn::new(self.psn & 0xff_ffff))
                },
                ext: self.ext,
                payload: &self.payload,
            },
        };
        let mut buf = vec![0u8; 10_000];
        let n = repr.emit(&mut buf).unwrap();
        buf.truncate(n);
        buf
    }
}

/// Offsets in the frames `Pkt::emit` builds (IPv4 without options, no VLAN).
pub const L3: usize = 14;
pub const L4: usize = 34;
pub const BTH: usize = 42;

/// Recomputes the ICRC after bytes of `f` were changed, so the change is the only fault.
pub fn reseal(f: &mut [u8]) {
    let end = f.len() - 4;
    let crc = icrc::compute_in_place(f, L3, L4, BTH, end).unwrap();
    icrc::write(&mut f[end..], crc);
}

/// Rewrites the IPv4 and UDP lengths (and the IPv4 checksum) for a frame cut to its
/// current length: a packet whose headers agree with its size.
pub fn fix_lengths(f: &mut [u8]) {
    let ip_len = (f.len() - L3) as u16;
    f[L3 + 2..L3 + 4].copy_from_slice(&ip_len.to_be_bytes());
    f[L4 + 4..L4 + 6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f[L4 + 6..L4 + 8].fill(0);
    f[L3 + 10..L3 + 12].fill(0);
    let sum: u32 = f[L3..L4]
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    f[L3 + 10..L3 + 12].copy_from_slice(&(!(folded as u16)).to_be_bytes());
}

/// The counters that moved from `before` to `after`, and by how much, sorted by name.
pub fn moved(before: &Counters, after: &Counters) -> Vec<(&'static str, u64)> {
    let mut v: Vec<_> = before
        .named()
        .iter()
        .zip(after.named())
        .filter(|(x, y)| x.1 != y.1)
        .map(|(x, y)| (x.0, y.1 - x.1))
        .collect();
    v.sort();
    v
}

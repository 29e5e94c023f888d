//! IPv4 and IPv6 headers of RoCEv2 frames, parsed and written with `etherparse`.
//!
//! What RoCEv2 needs on top: the fields the ICRC masks (IPv4 TOS/TTL/checksum, IPv6
//! traffic class/flow label/hop limit) are carried so frames can be re-emitted exactly.

use super::{Error, Result};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use etherparse::{IpDscp, IpEcn, IpNumber, Ipv4Header, Ipv4Options, Ipv6FlowLabel, Ipv6Header};

/// The meaning of an IPv4 header (length and checksum are computed on emit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits): 0 not ECT, 1/2 ECT, 3 congestion experienced.
    pub ecn: u8,
    pub identification: u16,
    /// Don't Fragment; rxe sets it.
    pub dont_fragment: bool,
    pub ttl: u8,
    /// IP options, carried verbatim (multiple of 4 bytes, at most 40).
    pub options: Ipv4Options,
}

impl Ipv4Repr {
    /// A header as rxe writes one: DF set, TTL 64, TOS 0, no options.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, identification: u16) -> Ipv4Repr {
        Ipv4Repr {
            src,
            dst,
            dscp: 0,
            ecn: 0,
            identification,
            dont_fragment: true,
            ttl: 64,
            options: Ipv4Options::new(),
        }
    }
}

/// The meaning of an IPv6 header (payload length is computed on emit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub traffic_class: u8,
    /// 20-bit flow label.
    pub flow_label: u32,
    pub hop_limit: u8,
}

/// An IPv4 or IPv6 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpRepr {
    V4(Ipv4Repr),
    V6(Ipv6Repr),
}

impl IpRepr {
    pub fn src(&self) -> IpAddr {
        match self {
            IpRepr::V4(h) => IpAddr::V4(h.src),
            IpRepr::V6(h) => IpAddr::V6(h.src),
        }
    }
    pub fn dst(&self) -> IpAddr {
        match self {
            IpRepr::V4(h) => IpAddr::V4(h.dst),
            IpRepr::V6(h) => IpAddr::V6(h.dst),
        }
    }

    /// Header length on the wire.
    pub fn buffer_len(&self) -> usize {
        match self {
            IpRepr::V4(h) => 20 + h.options.len(),
            IpRepr::V6(_) => 40,
        }
    }

    /// Parses an IPv4 header slice checked by `etherparse`.
    pub fn from_v4(s: &etherparse::Ipv4HeaderSlice<'_>) -> Result<IpRepr> {
        let options = Ipv4Options::try_from(s.options())
            .map_err(|_| Error::Malformed("IPv4 options length"))?;
        Ok(IpRepr::V4(Ipv4Repr {
            src: s.source_addr(),
            dst: s.destination_addr(),
            dscp: s.dcp().value(),
            ecn: s.ecn().value(),
            identification: s.identification(),
            dont_fragment: s.dont_fragment(),
            ttl: s.ttl(),
            options,
        }))
    }

    /// Parses an IPv6 header slice checked by `etherparse`.
    pub fn from_v6(s: &etherparse::Ipv6HeaderSlice<'_>) -> IpRepr {
        IpRepr::V6(Ipv6Repr {
            src: s.source_addr(),
            dst: s.destination_addr(),
            traffic_class: s.traffic_class(),
            flow_label: s.flow_label().value(),
            hop_limit: s.hop_limit(),
        })
    }

    /// Writes the header for a UDP payload of `l4_len` bytes into the start of `buf`
    /// (protocol UDP, lengths and the IPv4 checksum computed).
    pub fn emit(&self, buf: &mut [u8], l4_len: usize) -> Result<usize> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        }
        let mut w = &mut buf[..len];
        let io = |_| Error::BufferTooSmall {
            needed: len,
            available: len,
        };
        match self {
            IpRepr::V4(r) => {
                let total = len + l4_len;
                if total > usize::from(u16::MAX) {
                    return Err(Error::Malformed("IPv4 total length over 65535"));
                }
                let h = Ipv4Header {
                    dscp: IpDscp::try_new(r.dscp & 0x3f).unwrap_or(IpDscp::ZERO),
                    ecn: IpEcn::try_new(r.ecn & 3).unwrap_or(IpEcn::ZERO),
                    total_len: total as u16,
                    identification: r.identification,
                    dont_fragment: r.dont_fragment,
                    more_fragments: false,
                    fragment_offset: etherparse::IpFragOffset::ZERO,
                    time_to_live: r.ttl,
                    protocol: IpNumber::UDP,
                    header_checksum: 0,
                    source: r.src.octets(),
                    destination: r.dst.octets(),
                    options: r.options.clone(),
                };
                // `write` computes the header checksum.
                h.write(&mut w).map_err(io)?;
            }
            IpRepr::V6(r) => {
                if l4_len > usize::from(u16::MAX) {
                    return Err(Error::Malformed("IPv6 payload length over 65535"));
                }
                let h = Ipv6Header {
                    traffic_class: r.traffic_class,
                    flow_label: Ipv6FlowLabel::try_new(r.flow_label & 0xf_ffff)
                        .unwrap_or(Ipv6FlowLabel::ZERO),
                    payload_length: l4_len as u16,
                    next_header: IpNumber::UDP,
                    hop_limit: r.hop_limit,
                    source: r.src.octets(),
                    destination: r.dst.octets(),
                };
                h.write(&mut w).map_err(io)?;
            }
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_round_trip_with_options() {
        let mut r = Ipv4Repr::new(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            0x1234,
        );
        r.options = Ipv4Options::try_from(&[1u8, 1, 1, 0][..]).unwrap();
        let ip = IpRepr::V4(r);
        let mut buf = [0u8; 24];
        assert_eq!(ip.emit(&mut buf, 100).unwrap(), 24);
        let s = etherparse::Ipv4HeaderSlice::from_slice(&buf).unwrap();
        assert_eq!(s.total_len(), 124);
        assert_eq!(s.ihl(), 6);
        assert!(s.dont_fragment());
        assert_eq!(s.header_checksum(), s.to_header().calc_header_checksum());
        assert_eq!(IpRepr::from_v4(&s).unwrap(), ip);
    }

    #[test]
    fn v6_round_trip() {
        let ip = IpRepr::V6(Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0x68,
            flow_label: 0x12345,
            hop_limit: 64,
        });
        let mut buf = [0u8; 40];
        ip.emit(&mut buf, 36).unwrap();
        let s = etherparse::Ipv6HeaderSlice::from_slice(&buf).unwrap();
        assert_eq!(s.payload_length(), 36);
        assert_eq!(IpRepr::from_v6(&s), ip);
        assert!(ip.emit(&mut [0u8; 39], 0).is_err());
    }
}

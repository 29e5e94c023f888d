//! Ethernet II with an optional 802.1Q tag, parsed and written with `etherparse`.

use super::{Error, Layer, Result};
use etherparse::{EtherType, Ethernet2HeaderSlice, SingleVlanHeaderSlice};

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an 802.1Q tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

/// An 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VlanTag {
    /// Priority code point (0-7), the 802.1p class PFC acts on.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (0-4095).
    pub vid: u16,
}

/// The meaning of the link-layer header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthRepr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub vlan: Option<VlanTag>,
    /// The EtherType of what follows (after the tag, if any).
    pub ethertype: u16,
}

impl EthRepr {
    /// Parses the header at the start of `frame`; returns it and its length (14 or 18).
    #[inline]
    pub fn parse(frame: &[u8]) -> Result<(EthRepr, usize)> {
        let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|e| Error::Truncated {
            layer: Layer::Ethernet,
            needed: e.required_len,
            available: e.len,
        })?;
        let mut repr = EthRepr {
            dst: eth.destination(),
            src: eth.source(),
            vlan: None,
            ethertype: eth.ether_type().0,
        };
        let mut len = eth.slice().len();
        if repr.ethertype == ETHERTYPE_VLAN {
            let tag =
                SingleVlanHeaderSlice::from_slice(&frame[len..]).map_err(|e| Error::Truncated {
                    layer: Layer::Vlan,
                    needed: len + e.required_len,
                    available: frame.len(),
                })?;
            repr.vlan = Some(VlanTag {
                pcp: tag.priority_code_point().value(),
                dei: tag.drop_eligible_indicator(),
                vid: tag.vlan_identifier().value(),
            });
            repr.ethertype = tag.ether_type().0;
            len += tag.slice().len();
        }
        Ok((repr, len))
    }

    /// 14, or 18 with a tag.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() { 18 } else { 14 }
    }

    /// Writes the header into the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        }
        let outer = if self.vlan.is_some() {
            EtherType(ETHERTYPE_VLAN)
        } else {
            EtherType(self.ethertype)
        };
        let h = etherparse::Ethernet2Header {
            source: self.src,
            destination: self.dst,
            ether_type: outer,
        };
        buf[..14].copy_from_slice(&h.to_bytes());
        if let Some(t) = self.vlan {
            let tag = etherparse::SingleVlanHeader {
                pcp: etherparse::VlanPcp::try_new(t.pcp & 7).unwrap_or(etherparse::VlanPcp::ZERO),
                drop_eligible_indicator: t.dei,
                vlan_id: etherparse::VlanId::try_new(t.vid & 0x0fff)
                    .unwrap_or(etherparse::VlanId::ZERO),
                ether_type: EtherType(self.ethertype),
            };
            buf[14..18].copy_from_slice(&tag.to_bytes());
        }
        Ok(len)
    }
}

/// Formats a MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: &[u8; 6]) -> impl core::fmt::Display + '_ {
    struct Mac<'a>(&'a [u8; 6]);
    impl core::fmt::Display for Mac<'_> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            let m = self.0;
            write!(
                f,
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            )
        }
    }
    Mac(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untagged_and_tagged_round_trip() {
        let plain = EthRepr {
            dst: [1, 2, 3, 4, 5, 6],
            src: [0x52, 0x54, 0, 0, 0, 2],
            vlan: None,
            ethertype: ETHERTYPE_IPV4,
        };
        let tagged = EthRepr {
            vlan: Some(VlanTag {
                pcp: 3,
                dei: true,
                vid: 100,
            }),
            ethertype: ETHERTYPE_IPV6,
            ..plain
        };
        for r in [plain, tagged] {
            let mut buf = [0u8; 18];
            let n = r.emit(&mut buf).unwrap();
            assert_eq!(n, r.buffer_len());
            assert_eq!(EthRepr::parse(&buf[..n]).unwrap(), (r, n));
        }
        let mut buf = [0u8; 18];
        tagged.emit(&mut buf).unwrap();
        assert_eq!(&buf[12..18], &[0x81, 0x00, 0x70, 100, 0x86, 0xdd]);
        assert_eq!(fmt_mac(&plain.src).to_string(), "52:54:00:00:00:02");
    }

    #[test]
    fn truncated() {
        assert!(matches!(
            EthRepr::parse(&[0u8; 13]),
            Err(Error::Truncated {
                layer: Layer::Ethernet,
                ..
            })
        ));
        let mut b = [0u8; 16];
        b[12] = 0x81;
        assert!(matches!(
            EthRepr::parse(&b),
            Err(Error::Truncated {
                layer: Layer::Vlan,
                needed: 18,
                available: 16
            })
        ));
        assert!(EthRepr::default().emit(&mut [0u8; 13]).is_err());
    }
}

//! Whole RoCEv2 frames: Ethernet (+802.1Q) / IPv4 or IPv6 / UDP 4791 / RoCE packet.
//!
//! [`Frame::parse`] is where every received frame enters: it checks each layer in order
//! (so the error says which one is wrong) and leaves a view whose accessors cannot fail.
//! [`Frame::verify`] then checks the UDP checksum (0 or valid) and the ICRC.
//! [`FrameRepr::emit_with`] writes a complete frame into a caller's buffer without
//! allocating, letting the caller copy the payload straight from registered memory.

use super::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, EthRepr};
use super::ip::IpRepr;
use super::roce::{RocePacket, RoceRepr};
use super::udp::{self, UdpRepr};
use super::{Error, Layer, ROCE_V2_PORT, Result, icrc};
use core::net::IpAddr;
use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, UdpHeaderSlice};

/// The IP header of a parsed frame.
#[derive(Debug, Clone, Copy)]
pub enum IpView<'a> {
    V4(Ipv4HeaderSlice<'a>),
    V6(Ipv6HeaderSlice<'a>),
}

impl<'a> IpView<'a> {
    /// The raw header bytes (IPv4 options included).
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            IpView::V4(h) => h.slice(),
            IpView::V6(h) => h.slice(),
        }
    }
    pub fn src(&self) -> IpAddr {
        match self {
            IpView::V4(h) => IpAddr::V4(h.source_addr()),
            IpView::V6(h) => IpAddr::V6(h.source_addr()),
        }
    }
    pub fn dst(&self) -> IpAddr {
        match self {
            IpView::V4(h) => IpAddr::V4(h.destination_addr()),
            IpView::V6(h) => IpAddr::V6(h.destination_addr()),
        }
    }
    /// The 2-bit ECN field (3 = congestion experienced).
    pub fn ecn(&self) -> u8 {
        match self {
            IpView::V4(h) => h.ecn().value(),
            IpView::V6(h) => h.ecn().value(),
        }
    }
}

/// Bytes that lie in one piece or in two, `first` then `rest` (empty for one): a frame
/// AF_XDP chained over two buffers, and a payload such a frame splits. Handled where it
/// lies so that it is copied once, into registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pieces<'a> {
    pub first: &'a [u8],
    pub rest: &'a [u8],
}

impl<'a> Pieces<'a> {
    #[inline]
    pub fn len(&self) -> usize {
        self.first.len() + self.rest.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first.is_empty() && self.rest.is_empty()
    }

    /// The payload as one slice when it lies in one piece.
    #[inline]
    pub fn contiguous(&self) -> Option<&'a [u8]> {
        self.rest.is_empty().then_some(self.first)
    }

    /// Its pieces in order, empty ones left out (at most two).
    #[inline]
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        [self.first, self.rest]
            .into_iter()
            .filter(|p| !p.is_empty())
    }

    /// One piece.
    #[inline]
    pub fn one(b: &'a [u8]) -> Pieces<'a> {
        Pieces {
            first: b,
            rest: &[],
        }
    }

    /// Copies it into the start of `dst`, which must hold [`Self::len`] bytes.
    pub fn copy_to(&self, dst: &mut [u8]) {
        let (a, b) = dst[..self.len()].split_at_mut(self.first.len());
        a.copy_from_slice(self.first);
        b.copy_from_slice(self.rest);
    }

    /// The bytes joined in a new vector (off the hot path: captures, held frames).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(self.first);
        v.extend_from_slice(self.rest);
        v
    }
}

/// A buffer in one piece or two, `first` then `rest` (empty for one), to build a frame
/// in where it will be sent: AF_XDP chains a frame larger than one UMEM buffer over two,
/// and its payload is then copied once, from registered memory into both.
#[derive(Debug)]
pub struct PiecesMut<'a> {
    pub first: &'a mut [u8],
    pub rest: &'a mut [u8],
}

impl<'a> PiecesMut<'a> {
    /// One piece.
    #[inline]
    pub fn one(b: &'a mut [u8]) -> PiecesMut<'a> {
        PiecesMut {
            first: b,
            rest: &mut [],
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.first.len() + self.rest.len()
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first.is_empty() && self.rest.is_empty()
    }

    /// Copies `src` to the start, across both pieces. False (nothing written) when they
    /// hold fewer bytes.
    pub fn write(&mut self, src: &[u8]) -> bool {
        if src.len() > self.len() {
            return false;
        }
        let n = src.len().min(self.first.len());
        self.first[..n].copy_from_slice(&src[..n]);
        self.rest[..src.len() - n].copy_from_slice(&src[n..]);
        true
    }
}

/// A parsed, structurally valid RoCEv2 frame.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// The frame up to the end of the IP packet (an Ethernet trailer is dropped); for a
    /// chained frame, the part in its first buffer.
    bytes: &'a [u8],
    /// A chained frame's rest of the IP packet, from its later buffers; empty otherwise.
    tail: &'a [u8],
    eth: EthRepr,
    l3: usize,
    l4: usize,
    ip: IpView<'a>,
    roce: RocePacket<&'a [u8]>,
}

fn truncated(layer: Layer, needed: usize, available: usize) -> Error {
    Error::Truncated {
        layer,
        needed,
        available,
    }
}

impl<'a> Frame<'a> {
    /// Parses a frame starting at its Ethernet header. Checks, in order: Ethernet and
    /// VLAN lengths, EtherType IPv4/IPv6, IP version, IHL, total length, no fragment,
    /// protocol UDP, UDP destination port 4791, UDP length equal to the IP payload, then
    /// the RoCE packet (see [`RocePacket::new_checked`]). Checksums are not verified here.
    pub fn parse(frame: &'a [u8]) -> Result<Frame<'a>> {
        let (eth, l3) = EthRepr::parse(frame)?;
        Self::parse_after_link(frame, &[], eth, l3)
    }

    /// Parses a frame that arrived in two pieces, `head` then `tail` (AF_XDP chains a
    /// frame larger than one UMEM buffer), where they lie: the payload is then copied
    /// once, from the buffers to registered memory, as for a frame in one piece. Checks
    /// as [`Self::parse`] does over the bytes of both; every header up to the end of the
    /// transport headers must be in `head` (a first buffer holds well over 1500 bytes),
    /// else `Malformed`. An empty `tail` is [`Self::parse`].
    pub fn parse_parts(head: &'a [u8], tail: &'a [u8]) -> Result<Frame<'a>> {
        let (eth, l3) = EthRepr::parse(head)?;
        Self::parse_after_link(head, tail, eth, l3)
    }

    /// Parses a packet that starts at its IP header (captures without an Ethernet header,
    /// such as Linux "cooked" or raw-IP captures). The link header reads as all zeros.
    pub fn parse_ip(packet: &'a [u8]) -> Result<Frame<'a>> {
        let ethertype = match packet.first().map(|b| b >> 4) {
            Some(4) => ETHERTYPE_IPV4,
            Some(6) => ETHERTYPE_IPV6,
            Some(v) => return Err(Error::BadIpVersion(v)),
            None => return Err(truncated(Layer::Ipv4, 20, 0)),
        };
        let eth = EthRepr {
            ethertype,
            ..EthRepr::default()
        };
        Self::parse_after_link(packet, &[], eth, 0)
    }

    #[inline(always)]
    fn parse_after_link(
        frame: &'a [u8],
        more: &'a [u8],
        eth: EthRepr,
        l3: usize,
    ) -> Result<Frame<'a>> {
        let rest = &frame[l3..];
        // Bytes from the IP header on, in both pieces.
        let avail = rest.len() + more.len();
        let (ip, ip_len, hdr_len) = match eth.ethertype {
            ETHERTYPE_IPV4 => {
                let h = Ipv4HeaderSlice::from_slice(rest).map_err(|e| {
                    use etherparse::err::ipv4::{HeaderError, HeaderSliceError};
                    match e {
                        HeaderSliceError::Len(l) => {
                            truncated(Layer::Ipv4, l3 + l.required_len, frame.len())
                        }
                        HeaderSliceError::Content(HeaderError::UnexpectedVersion {
                            version_number,
                        }) => Error::BadIpVersion(version_number),
                        HeaderSliceError::Content(HeaderError::HeaderLengthSmallerThanHeader {
                            ihl,
                        }) => Error::IhlTooSmall(ihl),
                    }
                })?;
                let hdr_len = h.slice().len();
                let total = usize::from(h.total_len());
                if total < hdr_len {
                    return Err(Error::BadIpLength {
                        total: h.total_len(),
                        header: hdr_len,
                    });
                }
                if total > avail {
                    return Err(truncated(Layer::Ipv4, l3 + total, l3 + avail));
                }
                // MF flag or a fragment offset (bytes 6-7, DF excluded).
                let frag = h.slice();
                if frag[6] & 0x3f != 0 || frag[7] != 0 {
                    return Err(Error::Fragmented);
                }
                if h.protocol() != etherparse::IpNumber::UDP {
                    return Err(Error::NotUdp(h.protocol().0));
                }
                (IpView::V4(h), total, hdr_len)
            }
            ETHERTYPE_IPV6 => {
                let h = Ipv6HeaderSlice::from_slice(rest).map_err(|e| {
                    use etherparse::err::ipv6::{HeaderError, HeaderSliceError};
                    match e {
                        HeaderSliceError::Len(l) => {
                            truncated(Layer::Ipv6, l3 + l.required_len, frame.len())
                        }
                        HeaderSliceError::Content(HeaderError::UnexpectedVersion {
                            version_number,
                        }) => Error::BadIpVersion(version_number),
                    }
                })?;
                let total = 40 + usize::from(h.payload_length());
                if total > avail {
                    return Err(truncated(Layer::Ipv6, l3 + total, l3 + avail));
                }
                if h.next_header() != etherparse::IpNumber::UDP {
                    return Err(Error::NotUdp(h.next_header().0));
                }
                (IpView::V6(h), total, 40)
            }
            other => return Err(Error::NotIp(other)),
        };
        let l4 = l3 + hdr_len;
        let end = l3 + ip_len;
        // The IP packet ends in the first piece (an Ethernet trailer may fill the rest),
        // or in the second.
        let (bytes, tail) = if end <= frame.len() {
            (&frame[..end], &[][..])
        } else {
            (frame, &more[..end - frame.len()])
        };
        let udp_bytes = bytes.get(l4..).unwrap_or(&[]);
        let udp = UdpHeaderSlice::from_slice(udp_bytes).map_err(|_| {
            if tail.is_empty() {
                truncated(Layer::Udp, l4 + udp::LEN, bytes.len())
            } else {
                Error::Malformed("chained frame: the UDP header crosses into the second buffer")
            }
        })?;
        if udp.destination_port() != ROCE_V2_PORT {
            return Err(Error::NotRoce(udp.destination_port()));
        }
        if usize::from(udp.length()) != udp_bytes.len() + tail.len() {
            return Err(Error::UdpLength {
                udp: udp.length(),
                ip: udp_bytes.len() + tail.len(),
            });
        }
        let transport = &udp_bytes[udp::LEN..];
        let roce = if tail.is_empty() {
            RocePacket::new_checked(transport)?
        } else {
            RocePacket::new_checked_head(transport, transport.len() + tail.len())?
        };
        Ok(Frame {
            bytes,
            tail,
            eth,
            l3,
            l4,
            ip,
            roce,
        })
    }

    /// The frame bytes up to the end of the IP packet; for a chained frame, those in its
    /// first piece.
    #[inline]
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// True when the frame arrived in two pieces ([`Self::parse_parts`]).
    #[inline]
    pub fn is_chained(&self) -> bool {
        !self.tail.is_empty()
    }

    /// The RoCE packet's length, BTH to ICRC, over both pieces.
    #[inline]
    pub fn roce_len(&self) -> usize {
        self.roce.as_bytes().len() + self.tail.len()
    }

    /// The payload, pad excluded, where it lies: in one piece, or split between a chained
    /// frame's two. What the engine copies into registered memory.
    #[inline]
    pub fn payload(&self) -> Pieces<'a> {
        if !self.tail.is_empty() {
            return self.payload_chained();
        }
        let head: &'a [u8] = &self.bytes[self.l4 + udp::LEN..];
        let off = self.roce.payload_offset();
        Pieces::one(&head[off..off + self.roce.payload_len()])
    }

    #[inline(never)]
    fn payload_chained(&self) -> Pieces<'a> {
        let head: &'a [u8] = &self.bytes[self.l4 + udp::LEN..];
        let off = self.roce.payload_offset();
        let end = head.len() + self.tail.len() - self.pad_and_icrc();
        if end <= head.len() {
            Pieces {
                first: &head[off..end],
                rest: &[],
            }
        } else {
            Pieces {
                first: &head[off..],
                rest: &self.tail[..end - head.len()],
            }
        }
    }

    /// The payload's length, pad excluded.
    #[inline]
    pub fn payload_len(&self) -> usize {
        if self.tail.is_empty() {
            return self.roce.payload_len();
        }
        self.roce_len() - self.roce.payload_offset() - self.pad_and_icrc()
    }

    fn pad_and_icrc(&self) -> usize {
        usize::from(self.roce.bth().pad_count()) + icrc::LEN
    }

    /// The ICRC as the frame carries it (its last 4 bytes, which a chained frame may split).
    #[inline]
    pub fn icrc(&self) -> u32 {
        if self.tail.is_empty() {
            return self.roce.icrc();
        }
        let mut t = [0u8; icrc::LEN];
        let n = self.tail.len().min(icrc::LEN);
        t[icrc::LEN - n..].copy_from_slice(&self.tail[self.tail.len() - n..]);
        let head = self.roce.as_bytes();
        t[..icrc::LEN - n].copy_from_slice(&head[head.len() - (icrc::LEN - n)..]);
        icrc::read(&t)
    }
    #[inline]
    pub fn eth(&self) -> &EthRepr {
        &self.eth
    }
    #[inline]
    pub fn ip(&self) -> &IpView<'a> {
        &self.ip
    }
    /// Offset of the IP header in the frame.
    #[inline]
    pub fn l3_offset(&self) -> usize {
        self.l3
    }
    /// Offset of the UDP header in the frame.
    #[inline]
    pub fn l4_offset(&self) -> usize {
        self.l4
    }
    /// Offset of the BTH in the frame.
    #[inline]
    pub fn bth_offset(&self) -> usize {
        self.l4 + udp::LEN
    }
    #[inline]
    pub fn udp(&self) -> UdpHeaderSlice<'a> {
        // In bounds: checked by `parse`.
        UdpHeaderSlice::from_slice(&self.bytes[self.l4..])
            .unwrap_or_else(|_| unreachable!("UDP header checked in parse"))
    }
    #[inline]
    pub fn udp_header(&self) -> &'a [u8] {
        &self.bytes[self.l4..self.l4 + udp::LEN]
    }
    #[inline]
    pub fn src_port(&self) -> u16 {
        let u = self.udp_header();
        u16::from_be_bytes([u[0], u[1]])
    }
    #[inline]
    pub fn udp_checksum(&self) -> u16 {
        let u = self.udp_header();
        u16::from_be_bytes([u[6], u[7]])
    }
    /// The RoCE packet: BTH to ICRC. For a chained frame the view covers the first piece
    /// only: its header accessors hold, but payload, pad and ICRC come from
    /// [`Self::payload`] and [`Self::icrc`].
    #[inline]
    pub fn roce(&self) -> &RocePacket<&'a [u8]> {
        &self.roce
    }

    /// The ICRC this frame should carry.
    #[inline]
    pub fn computed_icrc(&self) -> u32 {
        if !self.tail.is_empty() {
            return self.computed_icrc_chained();
        }
        // Cannot fail: the IP, UDP and BTH lengths were checked by `parse`.
        icrc::compute(self.ip.bytes(), self.udp_header(), self.roce.without_icrc())
            .unwrap_or(!self.roce.icrc())
    }

    /// [`Self::computed_icrc`] of a chained frame, kept out of the common path.
    #[inline(never)]
    fn computed_icrc_chained(&self) -> u32 {
        // The ICRC's 4 bytes leave the end of the tail, or all of it and some of the head.
        let head = self.roce.as_bytes();
        let end = head.len() + self.tail.len() - icrc::LEN;
        let (a, b) = if end <= head.len() {
            (&head[..end], &[][..])
        } else {
            (head, &self.tail[..end - head.len()])
        };
        icrc::compute(self.ip.bytes(), self.udp_header(), a)
            .map(|c| icrc::extend(c, b))
            .unwrap_or(!self.icrc())
    }

    /// Checks the ICRC.
    #[inline]
    pub fn verify_icrc(&self) -> Result<()> {
        let wire = self.icrc();
        let computed = self.computed_icrc();
        if wire == computed {
            Ok(())
        } else {
            Err(Error::BadIcrc { wire, computed })
        }
    }

    /// The IPv4 identification under which this frame's ICRC verifies, given the ICRC
    /// it carries (`wire`) and the one computed over the header as it stands: for a
    /// receiver that could not see the ID (the UDP link rebuilds the header with ID 0).
    /// `None` for IPv6 or when no ID explains the difference. See
    /// [`icrc::solve_u16_field`] for how, and what it costs in integrity.
    pub fn ipv4_id_explaining(&self, wire: u32, computed: u32) -> Option<u16> {
        let IpView::V4(h) = self.ip else {
            return None;
        };
        // Covered after the ID: the rest of the IP header, UDP, BTH to the ICRC.
        let after = (self.l4 - self.l3 - 6) + udp::LEN + self.roce_len() - icrc::LEN;
        icrc::solve_u16_field(wire ^ computed, after).map(|x| x ^ h.identification())
    }

    /// Checks the UDP checksum: 0 (none) or a valid one are accepted.
    pub fn verify_udp_checksum(&self) -> Result<()> {
        let wire = self.udp_checksum();
        if wire == 0 {
            return Ok(());
        }
        let udp_bytes = &self.bytes[self.l4..];
        let computed = match self.ip {
            _ if !self.tail.is_empty() => {
                // Source and destination addresses, as the pseudo-header takes them.
                let (src, dst) = match self.ip {
                    IpView::V4(h) => (&h.slice()[12..16], &h.slice()[16..20]),
                    IpView::V6(h) => (&h.slice()[8..24], &h.slice()[24..40]),
                };
                udp::checksum_parts(src, dst, udp_bytes, self.tail)?
            }
            IpView::V4(h) => udp::checksum_v4(h.source(), h.destination(), udp_bytes)?,
            IpView::V6(h) => udp::checksum_v6(h.source(), h.destination(), udp_bytes)?,
        };
        if computed == wire {
            Ok(())
        } else {
            Err(Error::BadUdpChecksum { wire, computed })
        }
    }

    /// Checks the IPv4 header checksum. The ICRC leaves it out (routers rewrite it), and
    /// AF_XDP delivers frames the kernel has not checked, so the engine checks it here.
    /// IPv6 has no header checksum.
    pub fn verify_ip_checksum(&self) -> Result<()> {
        if let IpView::V4(h) = self.ip {
            // A correct header sums to 0xffff in ones' complement.
            let sum = ones_sum(h.slice());
            if sum != 0xffff {
                return Err(Error::BadIpChecksum(h.header_checksum()));
            }
        }
        Ok(())
    }

    /// Every checksum (IPv4 header, UDP when non-zero, ICRC): what a receiver must check
    /// before trusting any field.
    pub fn verify(&self) -> Result<()> {
        self.verify_ip_checksum()?;
        self.verify_udp_checksum()?;
        self.verify_icrc()
    }
}

/// The meaning of a whole frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    /// The link header. Its `ethertype` is set from `ip` on emit.
    pub eth: EthRepr,
    pub ip: IpRepr,
    pub udp: UdpRepr,
    pub roce: RoceRepr<'a>,
}

impl<'a> FrameRepr<'a> {
    /// The meaning of a parsed frame.
    pub fn parse(f: &Frame<'a>) -> Result<FrameRepr<'a>> {
        let ip = match f.ip {
            IpView::V4(ref h) => IpRepr::from_v4(h)?,
            IpView::V6(ref h) => IpRepr::from_v6(h),
        };
        let u = f.udp_header();
        Ok(FrameRepr {
            eth: f.eth,
            ip,
            udp: UdpRepr {
                src_port: u16::from_be_bytes([u[0], u[1]]),
                dst_port: u16::from_be_bytes([u[2], u[3]]),
            },
            roce: RoceRepr::parse(&f.roce)?,
        })
    }

    /// Frame length for a payload of `payload_len` bytes.
    pub fn buffer_len_for(&self, payload_len: usize) -> Result<usize> {
        Ok(self.eth.buffer_len()
            + self.ip.buffer_len()
            + udp::LEN
            + self.roce.buffer_len_for(payload_len)?)
    }

    /// Frame length with `roce.payload`.
    pub fn buffer_len(&self) -> Result<usize> {
        self.buffer_len_for(self.roce.payload.len())
    }

    /// Writes the frame, payload copied from `roce.payload`. Returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let p = self.roce.payload;
        self.emit_with(buf, p.len(), |dst| dst.copy_from_slice(p))
    }

    /// Writes the frame with a payload of `payload_len` bytes that `fill` writes in place
    /// (`roce.payload` is ignored): headers, payload, zero pad, ICRC, and over IPv6 the
    /// UDP checksum (which covers the ICRC, so it comes last). No allocation.
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        let id = match self.ip {
            IpRepr::V4(ref h) => h.identification,
            IpRepr::V6(_) => 0,
        };
        FrameTemplate::new(&self.eth, &self.ip, &self.udp)?.emit(
            buf,
            id,
            &self.roce,
            payload_len,
            fill,
        )
    }
}

/// Where the parts of a frame [`FrameTemplate::start`] began lie, counted over its one
/// or two pieces.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    total: usize,
    payload_off: usize,
    payload_len: usize,
}

impl Layout {
    /// Where the payload goes: in `head`, or from `head` on into `tail`.
    #[inline(always)]
    pub fn payload<'b>(&self, head: &'b mut [u8], tail: &'b mut [u8]) -> PiecesMut<'b> {
        let end = self.payload_off + self.payload_len;
        if end <= head.len() {
            PiecesMut::one(&mut head[self.payload_off..end])
        } else {
            let h = head.len();
            PiecesMut {
                first: &mut head[self.payload_off..],
                rest: &mut tail[..end - h],
            }
        }
    }
}

/// The Ethernet, IP and UDP headers of a flow, written once by `etherparse` and then
/// copied in front of each packet with only the lengths, the IPv4 ID and checksum
/// patched: how a QP builds frames on its hot path.
#[derive(Debug, Clone)]
pub struct FrameTemplate {
    bytes: [u8; 18 + 60 + udp::LEN],
    l3: usize,
    l4: usize,
    v6: Option<([u8; 16], [u8; 16])>,
    /// IPv4 (0 over IPv6): the ones'-complement sum of the header with its total length, ID and
    /// checksum zero. `emit` adds the two per-packet fields to it (RFC 1624) instead of
    /// summing the header it has just copied, which read back freshly stored bytes in
    /// wider loads (a store-forwarding stall: 2-3% of the engine-alone benchmark).
    v4_sum: u16,
}

impl FrameTemplate {
    /// Writes the headers (lengths left to `emit`).
    pub fn new(eth: &EthRepr, ip: &IpRepr, udp: &UdpRepr) -> Result<FrameTemplate> {
        let mut bytes = [0u8; 18 + 60 + udp::LEN];
        let mut eth = *eth;
        eth.ethertype = match ip {
            IpRepr::V4(_) => ETHERTYPE_IPV4,
            IpRepr::V6(_) => ETHERTYPE_IPV6,
        };
        let l3 = eth.emit(&mut bytes)?;
        let l4 = l3 + ip.emit(&mut bytes[l3..], udp::LEN)?;
        udp.emit(&mut bytes[l4..], 0)?;
        let (v6, v4_sum) = match ip {
            IpRepr::V6(h) => (Some((h.src.octets(), h.dst.octets())), 0),
            IpRepr::V4(_) => {
                let mut h = [0u8; 60];
                let hl = l4 - l3;
                h[..hl].copy_from_slice(&bytes[l3..l4]);
                h[2..6].fill(0); // total length, ID
                h[10..12].fill(0); // checksum
                (None, ones_sum(&h[..hl]))
            }
        };
        Ok(FrameTemplate {
            bytes,
            l3,
            l4,
            v6,
            v4_sum,
        })
    }

    /// Length of the Ethernet, IP and UDP headers.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.l4 + udp::LEN
    }

    /// Frame length for `roce` with `payload_len` bytes of payload.
    #[inline]
    pub fn buffer_len_for(&self, roce: &RoceRepr<'_>, payload_len: usize) -> Result<usize> {
        Ok(self.header_len() + roce.buffer_len_for(payload_len)?)
    }

    /// Writes a whole frame into `buf`: these headers (IPv4 ID `ip_id`), then `roce`'s
    /// headers, the payload `fill` writes in place, zero pad, ICRC, and over IPv6 the UDP
    /// checksum (it covers the ICRC, so it comes last). Returns the frame length.
    #[inline(always)]
    pub fn emit(
        &self,
        buf: &mut [u8],
        ip_id: u16,
        roce: &RoceRepr<'_>,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize> {
        let l = self.start(buf, &[], ip_id, roce, payload_len)?;
        fill(l.payload(buf, &mut []).first);
        self.finish(&l, buf, &mut [])
    }

    /// The first half of [`Self::emit`] for a frame that may continue from `head` into
    /// `tail` (a link that chains a frame over two buffers): checks the sizes and writes
    /// every header, which must fit `head`. The caller then writes the payload where
    /// [`Layout::payload`] puts it, and [`Self::finish`] completes the frame.
    #[inline(always)]
    pub fn start(
        &self,
        head: &mut [u8],
        tail: &[u8],
        ip_id: u16,
        roce: &RoceRepr<'_>,
        payload_len: usize,
    ) -> Result<Layout> {
        let (l3, l4) = (self.l3, self.l4);
        let bth = self.header_len();
        let roce_len = roce.buffer_len_for(payload_len)?;
        let total = bth + roce_len;
        if head.len() + tail.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: head.len() + tail.len(),
            });
        }
        let udp_len = udp::LEN + roce_len;
        if l4 - l3 + udp_len > usize::from(u16::MAX) {
            return Err(Error::Malformed("IP length over 65535"));
        }
        let Some(after) = head.get_mut(bth..) else {
            return Err(Error::BufferTooSmall {
                needed: bth,
                available: head.len(),
            });
        };
        let payload_off = bth + roce.emit_headers_only(after, payload_len)?;
        self.write_lower(head, udp_len, ip_id);
        Ok(Layout {
            total,
            payload_off,
            payload_len,
        })
    }

    /// The second half of [`Self::emit`]: zero pad, ICRC and (IPv6) UDP checksum, over
    /// `head` and, for a frame longer than it, `tail`. Returns the frame length.
    #[inline(always)]
    pub fn finish(&self, l: &Layout, head: &mut [u8], tail: &mut [u8]) -> Result<usize> {
        if l.total > head.len() {
            return self.finish_chained(l, head, tail);
        }
        let (l3, l4, bth) = (self.l3, self.l4, self.header_len());
        let buf = &mut head[..l.total];
        let icrc_off = l.total - icrc::LEN;
        buf[l.payload_off + l.payload_len..icrc_off].fill(0);
        let crc = icrc::compute_in_place(buf, l3, l4, bth, icrc_off)?;
        icrc::write(&mut buf[icrc_off..], crc);
        if let Some((src, dst)) = self.v6 {
            let c = udp::checksum_v6(src, dst, &buf[l4..])?;
            buf[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        }
        Ok(l.total)
    }

    /// [`Self::finish`] for a frame that continues into `tail`: pad and ICRC may lie on
    /// either side of the cut, or across it. Out of line: multi-buffer links only.
    #[inline(never)]
    fn finish_chained(&self, l: &Layout, head: &mut [u8], tail: &mut [u8]) -> Result<usize> {
        let (l3, l4, bth) = (self.l3, self.l4, self.header_len());
        let h = head.len();
        let tail = &mut tail[..l.total - h];
        let icrc_off = l.total - icrc::LEN;
        let byte = |head: &mut [u8], tail: &mut [u8], at: usize, v: u8| {
            if at < h {
                head[at] = v;
            } else {
                tail[at - h] = v;
            }
        };
        for at in l.payload_off + l.payload_len..icrc_off {
            byte(head, tail, at, 0);
        }
        let crc = if icrc_off <= h {
            icrc::compute_in_place(head, l3, l4, bth, icrc_off)?
        } else {
            let c = icrc::compute_in_place(head, l3, l4, bth, h)?;
            icrc::extend(c, &tail[..icrc_off - h])
        };
        for (k, v) in crc.to_le_bytes().into_iter().enumerate() {
            byte(head, tail, icrc_off + k, v);
        }
        if let Some((src, dst)) = self.v6 {
            let c = udp::checksum_parts(&src, &dst, &head[l4..], tail)?;
            head[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        }
        Ok(l.total)
    }

    /// Writes the template's link, IP and UDP headers into the start of `buf`, with the
    /// packet's lengths, IPv4 ID and header checksum.
    #[inline(always)]
    fn write_lower(&self, buf: &mut [u8], udp_len: usize, ip_id: u16) {
        let (l3, l4) = (self.l3, self.l4);
        let bth = self.header_len();
        buf[..bth].copy_from_slice(&self.bytes[..bth]);
        buf[l4 + 4..l4 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        if self.v6.is_some() {
            buf[l3 + 4..l3 + 6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        } else {
            let ip_total = (l4 - l3 + udp_len) as u16;
            buf[l3 + 2..l3 + 4].copy_from_slice(&ip_total.to_be_bytes());
            buf[l3 + 4..l3 + 6].copy_from_slice(&ip_id.to_be_bytes());
            let c = !fold(u64::from(self.v4_sum) + u64::from(ip_total) + u64::from(ip_id));
            buf[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
    }
}

/// The 16-bit ones'-complement sum of a header whose length is a multiple of 4 (IPv4).
#[inline]
fn ones_sum(b: &[u8]) -> u16 {
    // 32-bit words into a u64 (at most 15 of them: no overflow), then fold.
    let mut sum: u64 = 0;
    for w in b.chunks_exact(4) {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    fold(sum)
}

/// Folds a sum of 16- or 32-bit words into a 16-bit ones'-complement sum.
#[inline]
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ip::{Ipv4Repr, Ipv6Repr};
    use crate::wire::{
        AethRepr, BthRepr, DethRepr, ExtRepr, ImmDtRepr, Opcode, Psn, RethRepr, Syndrome,
    };
    use core::net::Ipv4Addr;

    fn repr_v4(payload: &[u8]) -> FrameRepr<'_> {
        FrameRepr {
            eth: EthRepr {
                dst: [0x52, 0x54, 0, 0, 0, 1],
                src: [0x52, 0x54, 0, 0, 0, 2],
                vlan: None,
                ethertype: ETHERTYPE_IPV4,
            },
            ip: IpRepr::V4(Ipv4Repr::new(
                Ipv4Addr::new(198, 18, 0, 2),
                Ipv4Addr::new(198, 18, 0, 1),
                0x9cbe,
            )),
            udp: UdpRepr {
                src_port: 49441,
                dst_port: ROCE_V2_PORT,
            },
            roce: RoceRepr {
                bth: BthRepr {
                    opcode: Opcode::RC_SEND_ONLY,
                    solicited: false,
                    mig_req: true,
                    pad_count: 0,
                    pkey: 0xffff,
                    fecn: false,
                    becn: false,
                    dest_qp: 0x11,
                    ack_req: true,
                    psn: Psn::new(0x123456),
                },
                ext: ExtRepr::default(),
                payload,
            },
        }
    }

    #[test]
    fn build_parse_verify_v4() {
        let payload: Vec<u8> = (0..100u8).collect();
        let r = repr_v4(&payload);
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 100 + 4);
        let f = Frame::parse(&buf[..n]).unwrap();
        f.verify().unwrap();
        assert_eq!(f.udp_checksum(), 0);
        assert_eq!(FrameRepr::parse(&f).unwrap(), r);
        // An Ethernet trailer (minimum frame padding) is ignored.
        let f2 = Frame::parse(&buf[..n + 10]).unwrap();
        assert_eq!(f2.bytes().len(), n);
        // One flipped bit anywhere after the Ethernet header is caught.
        for i in 14..n {
            let mut c = buf;
            c[i] ^= 0x10;
            let bad = Frame::parse(&c[..n]).and_then(|f| f.verify());
            // Only the BTH's reserved bits are covered by nothing: the ICRC masks byte 4
            // and its other masked fields (TOS, TTL) are covered by the IPv4 checksum.
            let masked = i == 42 + 4;
            assert_eq!(bad.is_err(), !masked, "byte {i}");
        }
    }

    #[test]
    fn build_parse_verify_v6_vlan() {
        let payload = [7u8; 33];
        let mut r = repr_v4(&payload);
        r.eth.vlan = Some(crate::wire::VlanTag {
            pcp: 3,
            dei: false,
            vid: 42,
        });
        r.eth.ethertype = ETHERTYPE_IPV6;
        r.ip = IpRepr::V6(Ipv6Repr {
            src: "fd00::2".parse().unwrap(),
            dst: "fd00::1".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        });
        r.roce.bth.opcode = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE;
        r.roce.ext.deth = Some(DethRepr {
            qkey: 0x11111111,
            src_qp: 0x22,
        });
        r.roce.ext.immdt = Some(ImmDtRepr { imm: 9 });
        let mut buf = [0u8; 256];
        let n = r.emit(&mut buf).unwrap();
        let f = Frame::parse(&buf[..n]).unwrap();
        assert_ne!(f.udp_checksum(), 0);
        f.verify().unwrap();
        let mut back = FrameRepr::parse(&f).unwrap();
        assert_eq!(back.roce.bth.pad_count, 3);
        back.roce.bth.pad_count = 0;
        assert_eq!(back, r);
        // A corrupted UDP checksum is reported as such.
        buf[18 + 40 + 6] ^= 1;
        assert!(matches!(
            Frame::parse(&buf[..n]).unwrap().verify(),
            Err(Error::BadUdpChecksum { .. })
        ));
    }

    #[test]
    fn typed_errors() {
        let mut r = repr_v4(&[]);
        r.roce.bth.opcode = Opcode::RC_ACKNOWLEDGE;
        r.roce.ext.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: 3,
        });
        let mut good = [0u8; 128];
        let n = r.emit(&mut good).unwrap();
        let good = &good[..n];
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut v = good.to_vec();
            f(&mut v);
            Frame::parse(&v).map(|_| ()).unwrap_err()
        };
        assert_eq!(with(&|v| v[13] = 0x06), Error::NotIp(0x0806));
        assert_eq!(with(&|v| v[14] = 0x65), Error::BadIpVersion(6));
        assert_eq!(with(&|v| v[14] = 0x44), Error::IhlTooSmall(4));
        assert_eq!(
            with(&|v| v[16..18].copy_from_slice(&[0, 10])),
            Error::BadIpLength {
                total: 10,
                header: 20
            }
        );
        assert_eq!(with(&|v| v[20] |= 0x20), Error::Fragmented);
        assert_eq!(with(&|v| v[23] = 6), Error::NotUdp(6));
        assert_eq!(
            with(&|v| v[36..38].copy_from_slice(&4792u16.to_be_bytes())),
            Error::NotRoce(4792)
        );
        assert_eq!(
            with(&|v| v[38..40].copy_from_slice(&20u16.to_be_bytes())),
            Error::UdpLength { udp: 20, ip: 28 }
        );
        assert_eq!(with(&|v| v[43] |= 1), Error::BadTver(1));
        assert_eq!(with(&|v| v[42] = 0x15), Error::UnknownOpcode(0x15));
        // Every truncation is a typed error.
        for i in 0..n {
            assert!(
                matches!(Frame::parse(&good[..i]), Err(Error::Truncated { .. })),
                "cut at {i}: {:?}",
                Frame::parse(&good[..i]).err()
            );
        }
        let mut small = [0u8; 40];
        assert!(matches!(
            r.emit(&mut small),
            Err(Error::BufferTooSmall { .. })
        ));
    }

    #[test]
    fn emit_with_fills_in_place() {
        let mut r = repr_v4(&[]);
        r.roce.bth.opcode = Opcode::RC_RDMA_WRITE_FIRST;
        r.roce.ext.reth = Some(RethRepr {
            va: 0x7000,
            rkey: 0x1234,
            dma_len: 4096,
        });
        let mut buf = [0u8; 2048];
        let n = r
            .emit_with(&mut buf, 1024, |dst| {
                for (i, b) in dst.iter_mut().enumerate() {
                    *b = i as u8;
                }
            })
            .unwrap();
        let f = Frame::parse(&buf[..n]).unwrap();
        f.verify_icrc().unwrap();
        assert_eq!(f.roce().payload().len(), 1024);
        assert_eq!(f.roce().payload()[255], 255);
        assert_eq!(f.roce().reth().unwrap().dma_len(), 4096);
    }

    proptest::proptest! {
        /// A template patches only the lengths, ID and checksum per packet; the IPv4
        /// checksum it derives from the precomputed sum must be the header's real one for
        /// any addresses, DSCP/ECN, TTL, options, ID and length.
        #[test]
        fn template_ipv4_checksums_are_the_headers_own(
            src in proptest::prelude::any::<u32>(),
            dst in proptest::prelude::any::<u32>(),
            dscp in 0u8..64,
            ecn in 0u8..4,
            ttl in proptest::prelude::any::<u8>(),
            df in proptest::prelude::any::<bool>(),
            words in 0usize..=10,
            id in proptest::prelude::any::<u16>(),
            len in 0usize..=4096,
        ) {
            let mut r = repr_v4(&[]);
            let IpRepr::V4(ref mut h) = r.ip else { unreachable!() };
            h.src = Ipv4Addr::from(src);
            h.dst = Ipv4Addr::from(dst);
            (h.dscp, h.ecn, h.ttl, h.dont_fragment) = (dscp, ecn, ttl, df);
            let opts: Vec<u8> = (0..words * 4).map(|i| if i + 1 == words * 4 { 0 } else { 1 }).collect();
            h.options = etherparse::Ipv4Options::try_from(&opts[..]).unwrap();
            let t = FrameTemplate::new(&r.eth, &r.ip, &r.udp).unwrap();
            let mut buf = vec![0u8; 9000];
            let n = t.emit(&mut buf, id, &r.roce, len, |d| d.fill(0xa5)).unwrap();
            let f = Frame::parse(&buf[..n]).unwrap();
            proptest::prop_assert!(f.verify().is_ok());
            let ip = etherparse::Ipv4HeaderSlice::from_slice(&buf[14..]).unwrap();
            proptest::prop_assert_eq!(ip.identification(), id);
            proptest::prop_assert_eq!(
                ip.header_checksum(),
                ip.to_header().calc_header_checksum()
            );
        }
    }
}

//! The RoCE transport packet: the UDP payload, from the BTH to the ICRC.
//!
//! ```text
//!  BTH (12) | extension headers (per opcode table) | payload | pad (0-3) | ICRC (4)
//! ```
//!
//! [`RocePacket`] checks the whole layout once, driven by the [`opcode`] table, so every
//! accessor after it is in bounds. [`RoceRepr`] is the owned meaning (the payload stays
//! borrowed), with `parse` and `emit` inverse of each other.
//!
//! [`opcode`]: super::opcode

use super::opcode::{HeaderKind, OpcodeInfo};
use super::{
    AethHeader, AethRepr, AtomicAckEthHeader, AtomicAckEthRepr, AtomicEthHeader, AtomicEthRepr,
    BthHeader, BthRepr, DethHeader, DethRepr, Error, IethHeader, IethRepr, ImmDtHeader, ImmDtRepr,
    Layer, MAX_PAYLOAD, Result, bth, icrc,
};
use super::{RethHeader, RethRepr};

/// Pad bytes needed after `len` bytes of payload to reach a 4-byte boundary.
#[inline]
pub const fn pad_for(len: usize) -> u8 {
    ((4 - (len & 3)) & 3) as u8
}

/// A checked view of a RoCE transport packet (a UDP payload on port 4791).
#[derive(Debug, Clone, Copy)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
    info: &'static OpcodeInfo,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Checks, in this order: BTH present, TVer 0, opcode known, extension headers and
    /// ICRC present, PadCnt not larger than what follows the headers, payload at most
    /// 4096 bytes, no payload for opcodes that carry none, and payload plus pad a
    /// multiple of 4 bytes.
    pub fn new_checked(buffer: T) -> Result<RocePacket<T>> {
        let b = buffer.as_ref();
        let info = check_layout(b, b.len())?;
        Ok(RocePacket { buffer, info })
    }

    /// The opcode's table row.
    #[inline]
    pub fn info(&self) -> &'static OpcodeInfo {
        self.info
    }

    /// All the bytes, BTH to ICRC.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    #[inline]
    pub fn bth(&self) -> BthHeader<&[u8]> {
        BthHeader::new_unchecked(&self.buffer.as_ref()[..bth::LEN])
    }

    /// The bytes of extension header `kind`, if the opcode carries it.
    #[inline]
    pub fn ext(&self, kind: HeaderKind) -> Option<&[u8]> {
        let off = bth::LEN + self.info.offset(kind)?;
        Some(&self.buffer.as_ref()[off..off + kind.wire_len()])
    }

    pub fn reth(&self) -> Option<RethHeader<&[u8]>> {
        self.ext(HeaderKind::Reth).map(RethHeader::new_unchecked)
    }
    pub fn aeth(&self) -> Option<AethHeader<&[u8]>> {
        self.ext(HeaderKind::Aeth).map(AethHeader::new_unchecked)
    }
    pub fn deth(&self) -> Option<DethHeader<&[u8]>> {
        self.ext(HeaderKind::Deth).map(DethHeader::new_unchecked)
    }
    pub fn atomic_eth(&self) -> Option<AtomicEthHeader<&[u8]>> {
        self.ext(HeaderKind::AtomicEth)
            .map(AtomicEthHeader::new_unchecked)
    }
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEthHeader<&[u8]>> {
        self.ext(HeaderKind::AtomicAckEth)
            .map(AtomicAckEthHeader::new_unchecked)
    }
    pub fn immdt(&self) -> Option<u32> {
        self.ext(HeaderKind::ImmDt)
            .map(|b| ImmDtHeader::new_unchecked(b).imm())
    }
    pub fn ieth(&self) -> Option<u32> {
        self.ext(HeaderKind::Ieth)
            .map(|b| IethHeader::new_unchecked(b).rkey())
    }

    /// Offset of the payload from the BTH.
    #[inline]
    pub fn payload_offset(&self) -> usize {
        bth::LEN + self.info.ext_len
    }

    /// Payload length, pad excluded.
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.buffer.as_ref().len()
            - self.payload_offset()
            - usize::from(self.bth().pad_count())
            - icrc::LEN
    }

    /// The payload, pad excluded.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let off = self.payload_offset();
        &self.buffer.as_ref()[off..off + self.payload_len()]
    }

    /// The pad bytes (senders write zeros).
    #[inline]
    pub fn pad_bytes(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = b.len() - icrc::LEN;
        &b[end - usize::from(self.bth().pad_count())..end]
    }

    /// The packet without its ICRC trailer.
    #[inline]
    pub fn without_icrc(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - icrc::LEN]
    }

    /// The ICRC as stored (little-endian on the wire).
    #[inline]
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let t = &b[b.len() - icrc::LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }
}

/// The checks of [`RocePacket::new_checked`] for a packet of `len` bytes whose first
/// bytes are `b` (all of them, or the first piece of a chained frame). The BTH and the
/// extension headers must lie in `b`, and as many bytes after them as pad and ICRC take,
/// so that a view of `b` alone stays in bounds; the rest may lie elsewhere.
#[inline(always)]
fn check_layout(b: &[u8], len: usize) -> Result<&'static OpcodeInfo> {
    let bth = BthHeader::new_checked(b)?;
    if bth.tver() != 0 {
        return Err(Error::BadTver(bth.tver()));
    }
    let op = bth.opcode();
    let info = op.info().ok_or(Error::UnknownOpcode(op.0))?;
    let need = bth::LEN + info.ext_len + icrc::LEN;
    if len < need {
        // Name the first header that is cut short.
        let mut end = bth::LEN;
        for &k in info.headers {
            end += k.wire_len();
            if len < end {
                return Err(Error::Truncated {
                    layer: Layer::Ext(k),
                    needed: end,
                    available: len,
                });
            }
        }
        return Err(Error::Truncated {
            layer: Layer::Icrc,
            needed: need,
            available: len,
        });
    }
    let after_headers = len - need;
    let pad = bth.pad_count();
    if usize::from(pad) > after_headers {
        return Err(Error::PadTooLarge {
            pad,
            available: after_headers,
        });
    }
    if b.len() < need + usize::from(pad) {
        // Only a chained frame's first piece can be this short. Holding the headers plus
        // as many bytes as pad and ICRC keeps every accessor of its view in bounds.
        return Err(Error::Malformed(
            "chained frame: its first piece ends inside the transport headers",
        ));
    }
    let payload = after_headers - usize::from(pad);
    if payload > MAX_PAYLOAD {
        return Err(Error::PayloadTooLarge(payload));
    }
    if !info.payload && after_headers > 0 {
        return Err(Error::UnexpectedPayload {
            opcode: op.0,
            len: after_headers,
        });
    }
    if !after_headers.is_multiple_of(4) {
        return Err(Error::Unaligned { payload, pad });
    }
    Ok(info)
}

impl<'a> RocePacket<&'a [u8]> {
    /// The header view of a packet that arrived in two pieces (an AF_XDP multi-buffer
    /// frame), `head` first, `len` bytes in all; checked as [`Self::new_checked`] checks a
    /// whole one. Only its header accessors (BTH, extension headers, `info`) are
    /// meaningful: payload, pad and ICRC lie partly in the other piece, and
    /// [`Frame`](super::Frame)'s accessors give them (the view's own stay in bounds but
    /// see `head` only).
    pub(crate) fn new_checked_head(head: &'a [u8], len: usize) -> Result<Self> {
        let info = check_layout(head, len)?;
        Ok(RocePacket { buffer: head, info })
    }
}

/// The extension headers of a packet: exactly those the opcode table names are `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtRepr {
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
}

impl ExtRepr {
    /// Bit set of the headers present (bit `HeaderKind as u8`).
    #[inline]
    fn mask(&self) -> u8 {
        let bit = |present: bool, k: HeaderKind| u8::from(present) << k.index();
        bit(self.deth.is_some(), HeaderKind::Deth)
            | bit(self.reth.is_some(), HeaderKind::Reth)
            | bit(self.atomic_eth.is_some(), HeaderKind::AtomicEth)
            | bit(self.aeth.is_some(), HeaderKind::Aeth)
            | bit(self.atomic_ack_eth.is_some(), HeaderKind::AtomicAckEth)
            | bit(self.immdt.is_some(), HeaderKind::ImmDt)
            | bit(self.ieth.is_some(), HeaderKind::Ieth)
    }

    /// Checks that the headers present are exactly those `info` requires (the CNP block
    /// has no content and is implied by its opcode).
    pub fn check(&self, info: &OpcodeInfo) -> Result<()> {
        let want = info.header_mask() & !(1 << HeaderKind::CnpReserved.index());
        let have = self.mask();
        if want == have {
            return Ok(());
        }
        for k in HeaderKind::ALL {
            let bit = 1 << k.index();
            if want & bit != 0 && have & bit == 0 {
                return Err(Error::MissingHeader {
                    opcode: info.code,
                    header: k.name(),
                });
            }
            if want & bit == 0 && have & bit != 0 {
                return Err(Error::UnexpectedHeader {
                    opcode: info.code,
                    header: k.name(),
                });
            }
        }
        Ok(())
    }
}

/// The meaning of a RoCE transport packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr<'a> {
    /// The BTH. `pad_count` is what was received; on emit it is recomputed from the
    /// payload length.
    pub bth: BthRepr,
    pub ext: ExtRepr,
    /// The payload, pad excluded.
    pub payload: &'a [u8],
}

impl<'a> RoceRepr<'a> {
    /// Parses a checked packet.
    pub fn parse(p: &RocePacket<&'a [u8]>) -> Result<RoceRepr<'a>> {
        let bth = BthRepr::parse(&p.bth())?;
        let ext = ExtRepr {
            deth: p.deth().map(|h| DethRepr::parse(&h)),
            reth: p.reth().map(|h| RethRepr::parse(&h)),
            atomic_eth: p.atomic_eth().map(|h| AtomicEthRepr::parse(&h)),
            aeth: p.aeth().map(|h| AethRepr::parse(&h)),
            atomic_ack_eth: p.atomic_ack_eth().map(|h| AtomicAckEthRepr::parse(&h)),
            immdt: p.immdt().map(|imm| ImmDtRepr { imm }),
            ieth: p.ieth().map(|rkey| IethRepr { rkey }),
        };
        let b: &'a [u8] = p.buffer;
        let off = p.payload_offset();
        let payload = &b[off..off + p.payload_len()];
        Ok(RoceRepr { bth, ext, payload })
    }

    /// The opcode's table row, or `UnknownOpcode`.
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// BTH plus extension headers.
    pub fn header_len(&self) -> Result<usize> {
        Ok(bth::LEN + self.info()?.ext_len)
    }

    /// Bytes needed for a packet with `payload_len` bytes of payload: headers, payload,
    /// pad and ICRC.
    pub fn buffer_len_for(&self, payload_len: usize) -> Result<usize> {
        Ok(self.header_len()? + payload_len + usize::from(pad_for(payload_len)) + icrc::LEN)
    }

    /// Bytes needed for this packet.
    pub fn buffer_len(&self) -> Result<usize> {
        self.buffer_len_for(self.payload.len())
    }

    /// Writes the BTH (pad count computed for `payload_len`) and the extension headers to
    /// the start of `buf`, then zeroes the pad. Returns the payload offset. The payload
    /// and the ICRC are the caller's (see [`super::frame::FrameRepr::emit_with`]).
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let info = self.check_emit(payload_len)?;
        let pad = pad_for(payload_len);
        let payload_off = bth::LEN + info.ext_len;
        let total = payload_off + payload_len + usize::from(pad) + icrc::LEN;
        if buf.len() < total {
            return Err(Error::BufferTooSmall {
                needed: total,
                available: buf.len(),
            });
        }
        let buf = &mut buf[..total];
        self.write_headers(buf, info, pad);
        let pad_off = payload_off + payload_len;
        buf[pad_off..pad_off + usize::from(pad)].fill(0);
        Ok(payload_off)
    }

    /// The headers of [`Self::emit_headers`] alone, into `buf` (which needs room for them
    /// only): for a frame built in two pieces, whose pad may lie in the second. Returns
    /// the payload's offset.
    pub fn emit_headers_only(&self, buf: &mut [u8], payload_len: usize) -> Result<usize> {
        let info = self.check_emit(payload_len)?;
        let payload_off = bth::LEN + info.ext_len;
        if buf.len() < payload_off {
            return Err(Error::BufferTooSmall {
                needed: payload_off,
                available: buf.len(),
            });
        }
        self.write_headers(&mut buf[..payload_off], info, pad_for(payload_len));
        Ok(payload_off)
    }

    /// What emitting this packet with `payload_len` bytes of payload needs: a known
    /// opcode, the extension headers it names, a payload it may carry.
    #[inline(always)]
    fn check_emit(&self, payload_len: usize) -> Result<&'static OpcodeInfo> {
        let info = self.info()?;
        self.ext.check(info)?;
        if payload_len > MAX_PAYLOAD {
            return Err(Error::PayloadTooLarge(payload_len));
        }
        if !info.payload && payload_len > 0 {
            return Err(Error::UnexpectedPayload {
                opcode: info.code,
                len: payload_len,
            });
        }
        Ok(info)
    }

    /// Writes the BTH (with `pad`) and the extension headers `info` names into `buf`,
    /// which holds exactly them.
    #[inline(always)]
    fn write_headers(&self, buf: &mut [u8], info: &OpcodeInfo, pad: u8) {
        let mut bth = self.bth;
        bth.pad_count = pad;
        bth.emit(&mut BthHeader::new_unchecked(&mut buf[..bth::LEN]));
        for &k in info.headers {
            let off = bth::LEN + info.offset(k).unwrap_or(0);
            let dst = &mut buf[off..off + k.wire_len()];
            match k {
                HeaderKind::Deth => {
                    if let Some(r) = self.ext.deth {
                        r.emit(&mut DethHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::Reth => {
                    if let Some(r) = self.ext.reth {
                        r.emit(&mut RethHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::AtomicEth => {
                    if let Some(r) = self.ext.atomic_eth {
                        r.emit(&mut AtomicEthHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::Aeth => {
                    if let Some(r) = self.ext.aeth {
                        r.emit(&mut AethHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::AtomicAckEth => {
                    if let Some(r) = self.ext.atomic_ack_eth {
                        r.emit(&mut AtomicAckEthHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::ImmDt => {
                    if let Some(r) = self.ext.immdt {
                        r.emit(&mut ImmDtHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::Ieth => {
                    if let Some(r) = self.ext.ieth {
                        r.emit(&mut IethHeader::new_unchecked(dst));
                    }
                }
                HeaderKind::CnpReserved => dst.fill(0),
            }
        }
    }
}

impl core::fmt::Display for RoceRepr<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.bth)?;
        let e = &self.ext;
        if let Some(h) = e.deth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.reth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.atomic_eth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.aeth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.atomic_ack_eth {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.immdt {
            write!(f, " | {h}")?;
        }
        if let Some(h) = e.ieth {
            write!(f, " | {h}")?;
        }
        write!(f, " | payload {} bytes", self.payload.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Opcode, Psn, Syndrome};

    fn bth(op: Opcode) -> BthRepr {
        BthRepr {
            opcode: op,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x12,
            ack_req: true,
            psn: Psn::new(7),
        }
    }

    fn emit_full(r: &RoceRepr<'_>) -> Vec<u8> {
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        let off = r.emit_headers(&mut buf, r.payload.len()).unwrap();
        buf[off..off + r.payload.len()].copy_from_slice(r.payload);
        buf
    }

    #[test]
    fn write_only_with_imm_layout() {
        let payload = [1u8, 2, 3, 4, 5];
        let r = RoceRepr {
            bth: bth(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
            ext: ExtRepr {
                reth: Some(RethRepr {
                    va: 0x1000,
                    rkey: 0x55,
                    dma_len: 5,
                }),
                immdt: Some(ImmDtRepr { imm: 0xabcd }),
                ..Default::default()
            },
            payload: &payload,
        };
        let buf = emit_full(&r);
        // 12 BTH + 16 RETH + 4 ImmDt + 5 payload + 3 pad + 4 ICRC
        assert_eq!(buf.len(), 44);
        let p = RocePacket::new_checked(&buf[..]).unwrap();
        assert_eq!(p.bth().pad_count(), 3);
        assert_eq!(p.payload(), &payload);
        assert_eq!(p.pad_bytes(), &[0, 0, 0]);
        assert_eq!(p.immdt(), Some(0xabcd));
        let mut back = RoceRepr::parse(&p).unwrap();
        assert_eq!(back.bth.pad_count, 3);
        back.bth.pad_count = 0;
        assert_eq!(back, r);
    }

    #[test]
    fn emit_checks_headers_against_the_table() {
        let mut r = RoceRepr {
            bth: bth(Opcode::RC_ACKNOWLEDGE),
            ext: ExtRepr::default(),
            payload: &[],
        };
        let mut buf = [0u8; 64];
        assert_eq!(
            r.emit_headers(&mut buf, 0),
            Err(Error::MissingHeader {
                opcode: 0x11,
                header: "AETH"
            })
        );
        r.ext.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK,
            msn: 1,
        });
        r.ext.reth = Some(RethRepr::default());
        assert_eq!(
            r.emit_headers(&mut buf, 0),
            Err(Error::UnexpectedHeader {
                opcode: 0x11,
                header: "RETH"
            })
        );
        r.ext.reth = None;
        assert_eq!(r.emit_headers(&mut buf, 0), Ok(16));
        assert!(matches!(
            r.emit_headers(&mut buf, 4),
            Err(Error::UnexpectedPayload { .. })
        ));
        assert!(matches!(
            r.emit_headers(&mut buf[..19], 0),
            Err(Error::BufferTooSmall { .. })
        ));
    }

    #[test]
    fn checked_view_rejects() {
        // ACK missing its AETH
        let mut b = [0u8; 15];
        b[0] = 0x11;
        assert!(matches!(
            RocePacket::new_checked(&b[..]),
            Err(Error::Truncated {
                layer: Layer::Ext(HeaderKind::Aeth),
                ..
            })
        ));
        // SEND ONLY with pad 3 and only 2 bytes after the headers
        let mut b = [0u8; 18];
        b[0] = 0x04;
        b[1] = 0x30;
        assert_eq!(
            RocePacket::new_checked(&b[..]).unwrap_err(),
            Error::PadTooLarge {
                pad: 3,
                available: 2
            }
        );
        // SEND ONLY with 5 bytes and no pad: payload and pad off a 4-byte boundary
        let mut b = [0u8; 21];
        b[0] = 0x04;
        assert_eq!(
            RocePacket::new_checked(&b[..]).unwrap_err(),
            Error::Unaligned { payload: 5, pad: 0 }
        );
        // READ request with payload
        let mut b = [0u8; 36];
        b[0] = 0x0c;
        assert!(matches!(
            RocePacket::new_checked(&b[..]),
            Err(Error::UnexpectedPayload {
                opcode: 0x0c,
                len: 4
            })
        ));
        // payload over 4096
        let mut b = vec![0u8; 12 + 4097 + 4];
        b[0] = 0x04;
        assert_eq!(
            RocePacket::new_checked(&b[..]).unwrap_err(),
            Error::PayloadTooLarge(4097)
        );
        b.truncate(12 + 4096 + 4);
        assert!(RocePacket::new_checked(&b[..]).is_ok());
        // no ICRC
        let mut b = [0u8; 14];
        b[0] = 0x04;
        assert!(matches!(
            RocePacket::new_checked(&b[..]),
            Err(Error::Truncated {
                layer: Layer::Icrc,
                ..
            })
        ));
    }

    #[test]
    fn pad_for_lengths() {
        assert_eq!(pad_for(0), 0);
        assert_eq!(pad_for(1), 3);
        assert_eq!(pad_for(2), 2);
        assert_eq!(pad_for(3), 1);
        assert_eq!(pad_for(1024), 0);
    }
}

//! Base Transport Header (IBA 9.2, 12 bytes): present in every RoCEv2 packet.
//!
//! ```text
//!  byte 0      1                 2..3     4             5..7     8            9..11
//!  OpCode | SE M PadCnt TVer | P_Key | FECN BECN Resv6 | DestQP | AckReq Resv7 | PSN
//! ```

use super::{Error, Field, Layer, Result, check_len, get_u16, get_u24, put_u24};
use crate::wire::{Opcode, Psn};

mod field {
    use super::Field;
    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved; masked to ones in the ICRC.
    pub const ECN: usize = 4;
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), reserved.
    pub const ACK_REQ: usize = 8;
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const LEN: usize = 12;
/// Offset of the byte that the ICRC computation masks to 0xFF.
pub const ICRC_MASKED_BYTE: usize = field::ECN;

/// A view of a BTH at the start of a buffer.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps a buffer, rejecting one shorter than the header.
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        check_len(Layer::Bth, buffer.as_ref(), LEN)?;
        Ok(Header { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited Event: the responder should raise a completion event for this message.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq: the APM migration state (1 = migrated, what RoCE senders normally set).
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & 0x40 != 0
    }
    /// Number of pad bytes (0-3) that align the payload to 4 bytes.
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version; must be 0.
    #[inline]
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }
    #[inline]
    pub fn pkey(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::PKEY])
    }
    /// Forward ECN: the network marked congestion on the way here.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & 0x80 != 0
    }
    /// Backward ECN: congestion seen on the opposite path.
    #[inline]
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & 0x40 != 0
    }
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        get_u24(&self.buffer.as_ref()[field::DEST_QP])
    }
    /// AckReq: the responder must acknowledge this packet.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & 0x80 != 0
    }
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(&self.buffer.as_ref()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    #[inline]
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.0;
    }
    /// Writes SE, MigReq, PadCnt and TVer at once (they share one byte).
    #[inline]
    pub fn set_flags(&mut self, se: bool, mig_req: bool, pad: u8, tver: u8) {
        self.buffer.as_mut()[field::FLAGS] =
            (u8::from(se) << 7) | (u8::from(mig_req) << 6) | ((pad & 3) << 4) | (tver & 0x0f);
    }
    #[inline]
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !0x30) | ((pad & 3) << 4);
    }
    #[inline]
    pub fn set_pkey(&mut self, pkey: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&pkey.to_be_bytes());
    }
    /// Writes FECN and BECN; the reserved bits become 0.
    #[inline]
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[field::ECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    #[inline]
    pub fn set_dest_qp(&mut self, qpn: u32) {
        put_u24(&mut self.buffer.as_mut()[field::DEST_QP], qpn);
    }
    /// Writes AckReq; the reserved bits become 0.
    #[inline]
    pub fn set_ack_req(&mut self, ack_req: bool) {
        self.buffer.as_mut()[field::ACK_REQ] = u8::from(ack_req) << 7;
    }
    #[inline]
    pub fn set_psn(&mut self, psn: Psn) {
        put_u24(&mut self.buffer.as_mut()[field::PSN], psn.value());
    }
}

/// The meaning of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub opcode: Opcode,
    pub solicited: bool,
    pub mig_req: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

/// The default partition key (full membership), which rxe and roce-xdp always send.
pub const DEFAULT_PKEY: u16 = 0xffff;

impl Repr {
    /// A BTH as a sender usually writes it: no solicited event, MigReq 0, no pad, the
    /// default P_Key, no congestion marks, no AckReq. Set the other fields with struct
    /// update syntax (`BthRepr { ack_req: true, ..BthRepr::new(op, qp, psn) }`).
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses a BTH: rejects TVer != 0 and opcodes the table does not know.
    /// Reserved bits are ignored on receive, as rxe does.
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Result<Repr> {
        if h.tver() != 0 {
            return Err(Error::BadTver(h.tver()));
        }
        let opcode = h.opcode();
        if opcode.info().is_none() {
            return Err(Error::UnknownOpcode(opcode.0));
        }
        Ok(Repr {
            opcode,
            solicited: h.solicited(),
            mig_req: h.mig_req(),
            pad_count: h.pad_count(),
            pkey: h.pkey(),
            fecn: h.fecn(),
            becn: h.becn(),
            dest_qp: h.dest_qp(),
            ack_req: h.ack_req(),
            psn: h.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        LEN
    }

    /// The 12 bytes (reserved bits as 0, TVer 0).
    #[inline]
    pub fn to_bytes(&self) -> [u8; LEN] {
        let q = self.dest_qp.to_be_bytes();
        let p = self.psn.value().to_be_bytes();
        let k = self.pkey.to_be_bytes();
        [
            self.opcode.0,
            (u8::from(self.solicited) << 7)
                | (u8::from(self.mig_req) << 6)
                | ((self.pad_count & 3) << 4),
            k[0],
            k[1],
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6),
            q[1],
            q[2],
            q[3],
            u8::from(self.ack_req) << 7,
            p[1],
            p[2],
            p[3],
        ]
    }

    /// Writes all 12 bytes (reserved bits as 0, TVer 0).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.buffer.as_mut()[..LEN].copy_from_slice(&self.to_bytes());
    }
}

impl core::fmt::Display for Repr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "BTH {} dqpn=0x{:06x} psn={} pkey=0x{:04x}{}{}{}{}",
            self.opcode,
            self.dest_qp,
            self.psn,
            self.pkey,
            if self.ack_req { " ackreq" } else { "" },
            if self.solicited { " se" } else { "" },
            if self.pad_count > 0 { " pad" } else { "" },
            if self.fecn || self.becn { " ecn" } else { "" },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An RC SEND First to QP 0x11 with MigReq set and AckReq clear.
    static BYTES: [u8; 12] = [
        0x00, 0x40, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x9a, 0xbc, 0xde,
    ];

    #[test]
    fn deconstruct() {
        let h = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.opcode(), Opcode::RC_SEND_FIRST);
        assert!(!h.solicited());
        assert!(h.mig_req());
        assert_eq!(h.pad_count(), 0);
        assert_eq!(h.tver(), 0);
        assert_eq!(h.pkey(), 0xffff);
        assert!(!h.fecn() && !h.becn());
        assert_eq!(h.dest_qp(), 0x11);
        assert!(!h.ack_req());
        assert_eq!(h.psn(), Psn::new(0x9abcde));
    }

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RC_SEND_FIRST,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: false,
            psn: Psn::new(0x9abcde),
        }
    }

    #[test]
    fn parse_and_emit() {
        let h = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&h).unwrap(), repr());
        let mut buf = [0u8; 12];
        repr().emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }

    #[test]
    fn construct_every_field() {
        let mut buf = [0u8; 12];
        let mut h = Header::new_unchecked(&mut buf[..]);
        h.set_opcode(Opcode::RC_RDMA_WRITE_ONLY);
        h.set_flags(true, false, 3, 0);
        h.set_pkey(0x8001);
        h.set_ecn(true, true);
        h.set_dest_qp(0xabcdef);
        h.set_ack_req(true);
        h.set_psn(Psn::new(0xffffff));
        assert_eq!(
            buf,
            [
                0x0a, 0xb0, 0x80, 0x01, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0xff, 0xff, 0xff
            ]
        );
    }

    #[test]
    fn rejects() {
        assert!(matches!(
            Header::new_checked(&BYTES[..11]),
            Err(Error::Truncated {
                needed: 12,
                available: 11,
                ..
            })
        ));
        let mut b = BYTES;
        b[1] |= 0x01;
        assert_eq!(
            Repr::parse(&Header::new_unchecked(&b[..])),
            Err(Error::BadTver(1))
        );
        let mut b = BYTES;
        b[0] = 0x15;
        assert_eq!(
            Repr::parse(&Header::new_unchecked(&b[..])),
            Err(Error::UnknownOpcode(0x15))
        );
    }
}

//! ACK Extended Transport Header (IBA 9.3.5, 4 bytes): the syndrome (ACK, RNR NAK or
//! NAK with a code) and the responder's Message Sequence Number.
//!
//! ```text
//!  byte 0: 0 | type (2 bits) | value (5 bits)    bytes 1..4: MSN
//!  type 00 ACK (value = credit code), 01 RNR NAK (value = timer code),
//!  type 11 NAK (value = NAK code), 10 reserved
//! ```

use super::{Field, Layer, Result, check_len, get_u24, put_u24};
use core::fmt;

mod field {
    use super::Field;
    pub const SYNDROME: usize = 0;
    pub const MSN: Field = 1..4;
}

/// Length of the AETH.
pub const LEN: usize = 4;

/// The credit code rxe and most NICs send: "invalid", i.e. no end-to-end credit limit.
pub const CREDITS_INVALID: u8 = 0x1f;

/// NAK codes (IBA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: a request arrived with a PSN ahead of the expected one (a packet was lost).
    PsnSequenceError,
    /// 1: the request is malformed or not allowed (bad opcode sequence, length, ...).
    InvalidRequest,
    /// 2: R_Key, bounds or access rights check failed.
    RemoteAccessError,
    /// 3: the responder could not complete the request for a reason of its own.
    RemoteOperationalError,
    /// 4: invalid RD request (Reliable Datagram only).
    InvalidRdRequest,
    /// 5-31: reserved.
    Reserved(u8),
}

impl NakCode {
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
    /// Plain-words meaning.
    pub const fn meaning(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => {
                "PSN sequence error: a packet was lost, resend from this PSN"
            }
            NakCode::InvalidRequest => {
                "invalid request: opcode sequence, length or alignment not allowed"
            }
            NakCode::RemoteAccessError => {
                "remote access error: R_Key, bounds or access rights refused"
            }
            NakCode::RemoteOperationalError => {
                "remote operational error: the responder failed the request"
            }
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved NAK code",
        }
    }
}

/// A decoded AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit code (31 = no credit limit).
    Ack { credits: u8 },
    /// Receiver Not Ready: no receive WQE; retry after the timer code's delay.
    RnrNak { timer: u8 },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A syndrome byte with the reserved type 10 or the top bit set, kept verbatim.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub const fn from_byte(b: u8) -> Syndrome {
        if b & 0x80 != 0 {
            return Syndrome::Reserved(b);
        }
        match (b >> 5) & 3 {
            0 => Syndrome::Ack { credits: b & 0x1f },
            1 => Syndrome::RnrNak { timer: b & 0x1f },
            3 => Syndrome::Nak(NakCode::from_code(b & 0x1f)),
            _ => Syndrome::Reserved(b),
        }
    }
    /// Encodes a syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(c) => 0x60 | c.code(),
            Syndrome::Reserved(b) => b,
        }
    }
    /// The ACK rxe sends: unlimited credits.
    pub const ACK: Syndrome = Syndrome::Ack {
        credits: CREDITS_INVALID,
    };
    pub const fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Syndrome::Ack {
                credits: CREDITS_INVALID,
            } => f.write_str("ACK, credit count invalid (unlimited)"),
            Syndrome::Ack { credits } => write!(
                f,
                "ACK, {} receive credits",
                ack_credits(credits).unwrap_or(0)
            ),
            Syndrome::RnrNak { timer } => {
                let ns = rnr_timer_ns(timer);
                write!(
                    f,
                    "RNR NAK: receiver not ready, retry after {}.{:02} ms",
                    ns / 1_000_000,
                    (ns / 10_000) % 100
                )
            }
            Syndrome::Nak(c) => write!(f, "NAK, {}", c.meaning()),
            Syndrome::Reserved(b) => write!(f, "reserved syndrome 0x{b:02x}"),
        }
    }
}

/// Receive credits for an ACK credit code (IBA table 44); `None` for 31 (invalid).
pub const fn ack_credits(code: u8) -> Option<u32> {
    const T: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    let c = (code & 0x1f) as usize;
    if c < 31 { Some(T[c]) } else { None }
}

/// The RNR NAK timer for a 5-bit timer code, in nanoseconds (IBA table 45: code 0 is
/// 655.36 ms, codes 1..31 run from 0.01 ms to 491.52 ms).
pub const fn rnr_timer_ns(code: u8) -> u64 {
    // Values in units of 10 us.
    const T: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    T[(code & 0x1f) as usize] * 10_000
}

/// A view of an AETH.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        check_len(
            Layer::Ext(crate::wire::HeaderKind::Aeth),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    #[inline]
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    #[inline]
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_byte(self.syndrome_byte())
    }
    /// Message Sequence Number: how many messages the responder has completed.
    #[inline]
    pub fn msn(&self) -> u32 {
        get_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    #[inline]
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buffer.as_mut()[field::SYNDROME] = s.to_byte();
    }
    #[inline]
    pub fn set_msn(&mut self, msn: u32) {
        put_u24(&mut self.buffer.as_mut()[field::MSN], msn);
    }
}

/// The meaning of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub syndrome: Syndrome,
    /// 24-bit MSN.
    pub msn: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        }
    }
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}

impl fmt::Display for Repr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AETH {} msn={}", self.syndrome, self.msn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn decodes_the_classes() {
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::ACK);
        assert_eq!(Syndrome::from_byte(0x2e), Syndrome::RnrNak { timer: 14 });
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_byte(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            Syndrome::from_byte(0x64),
            Syndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            Syndrome::from_byte(0x65),
            Syndrome::Nak(NakCode::Reserved(5))
        );
        assert_eq!(Syndrome::from_byte(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from_byte(0x9f), Syndrome::Reserved(0x9f));
    }

    #[test]
    fn tables() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(ack_credits(0), Some(0));
        assert_eq!(ack_credits(30), Some(32768));
        assert_eq!(ack_credits(31), None);
        assert_eq!(
            Syndrome::from_byte(0x1f).to_string(),
            "ACK, credit count invalid (unlimited)"
        );
        assert!(
            Syndrome::RnrNak { timer: 14 }
                .to_string()
                .contains("1.28 ms")
        );
    }

    #[test]
    fn view_parse_emit() {
        let bytes = [0x1f, 0x00, 0x01, 0x02];
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.msn(), 0x102);
        let r = Repr::parse(&h);
        assert_eq!(r.syndrome, Syndrome::ACK);
        let mut buf = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf, bytes);
        assert!(Header::new_checked(&bytes[..3]).is_err());
    }
}

//! The RoCEv2 wire format: zero-copy views over bytes and owned representations.
//!
//! Modelled on smoltcp's `wire` module. Every header has
//! - a `Header<T: AsRef<[u8]>>` view whose checked constructor rejects a buffer too
//!   short for it, so that every accessor after it indexes safely (getters on
//!   `AsRef<[u8]>`, setters only on `AsRef + AsMut`);
//! - a `Repr` that holds the meaning, with `parse` (bytes to meaning, semantic checks),
//!   `buffer_len` and `emit` (meaning to bytes). `parse` and `emit` are inverse.
//!
//! Ethernet, 802.1Q, IPv4, IPv6 and UDP are parsed and written with `etherparse`
//! ([`eth`], [`ip`], [`udp`] hold the thin adaptors). Everything from the Base Transport
//! Header on is ours: [`bth`], the extension headers, the [`opcode`] table that says which
//! of them each opcode carries, the [`icrc`], and the whole-frame [`frame`] parser/builder.
//!
//! Wire input is hostile: nothing here panics or reads out of bounds on any input, and
//! nothing allocates.

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod eth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ip;
pub mod mad;
pub mod opcode;
pub mod psn;
pub mod reth;
pub mod roce;
pub mod udp;

pub use aeth::{Header as AethHeader, Repr as AethRepr, Syndrome};
pub use atomic_ack_eth::{Header as AtomicAckEthHeader, Repr as AtomicAckEthRepr};
pub use atomic_eth::{Header as AtomicEthHeader, Repr as AtomicEthRepr};
pub use bth::{Header as BthHeader, Repr as BthRepr};
pub use deth::{Header as DethHeader, Repr as DethRepr};
pub use eth::{EthRepr, VlanTag};
pub use frame::{Frame, FrameRepr, FrameTemplate, IpView, Pieces, PiecesMut};
pub use ieth::{Header as IethHeader, Repr as IethRepr};
pub use immdt::{Header as ImmDtHeader, Repr as ImmDtRepr};
pub use ip::{IpRepr, Ipv4Repr, Ipv6Repr};
pub use opcode::{HeaderKind, Opcode, OpcodeInfo, Operation, Position, Transport};
pub use psn::Psn;
pub use reth::{Header as RethHeader, Repr as RethRepr};
pub use roce::{ExtRepr, RocePacket, RoceRepr};
pub use udp::UdpRepr;

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;

/// The largest payload one RoCE packet may carry: the largest IB path MTU.
pub const MAX_PAYLOAD: usize = 4096;

/// A byte range inside a header, as in smoltcp's `mod field`.
pub(crate) type Field = core::ops::Range<usize>;

/// Which layer of a frame an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    Ethernet,
    Vlan,
    Ipv4,
    Ipv6,
    Udp,
    Bth,
    /// An extension header named by the opcode table.
    Ext(HeaderKind),
    Payload,
    Icrc,
    Mad,
    Cm,
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Layer::Ethernet => f.write_str("Ethernet"),
            Layer::Vlan => f.write_str("802.1Q"),
            Layer::Ipv4 => f.write_str("IPv4"),
            Layer::Ipv6 => f.write_str("IPv6"),
            Layer::Udp => f.write_str("UDP"),
            Layer::Bth => f.write_str("BTH"),
            Layer::Ext(k) => f.write_str(k.name()),
            Layer::Payload => f.write_str("payload"),
            Layer::Icrc => f.write_str("ICRC"),
            Layer::Mad => f.write_str("MAD"),
            Layer::Cm => f.write_str("CM"),
        }
    }
}

/// Why a frame or header was rejected. Every variant is a typed reason a drop counter
/// can be keyed on; none of them carries heap data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the layer does (or before the length a header claims).
    #[error("{layer} truncated: needs {needed} bytes, {available} available")]
    Truncated {
        layer: Layer,
        needed: usize,
        available: usize,
    },
    /// The EtherType is neither IPv4 nor IPv6 (after an optional 802.1Q tag).
    #[error("not IP: EtherType 0x{0:04x}")]
    NotIp(u16),
    /// The IP version nibble does not match the EtherType.
    #[error("wrong IP version {0}")]
    BadIpVersion(u8),
    /// IPv4 IHL below 5 words.
    #[error("IPv4 IHL {0} is smaller than the 20-byte header")]
    IhlTooSmall(u8),
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum 0x{0:04x}")]
    BadIpChecksum(u16),
    /// IPv4 total length shorter than its own header.
    #[error("IPv4 total length {total} is shorter than the {header}-byte header")]
    BadIpLength { total: u16, header: usize },
    /// RoCEv2 is never fragmented (rxe sets DF); a fragment cannot be a whole packet.
    #[error("IPv4 fragment (RoCEv2 packets are never fragmented)")]
    Fragmented,
    /// The IP payload is not UDP (IPv6 extension headers are not used by RoCEv2).
    #[error("not UDP: IP protocol / next header {0}")]
    NotUdp(u8),
    /// The UDP length field disagrees with the IP payload length.
    #[error("UDP length {udp} disagrees with the IP payload length {ip}")]
    UdpLength { udp: u16, ip: usize },
    /// A non-zero UDP checksum that does not verify.
    #[error("bad UDP checksum (wire 0x{wire:04x}, computed 0x{computed:04x})")]
    BadUdpChecksum { wire: u16, computed: u16 },
    /// UDP destination port is not 4791.
    #[error("not RoCEv2: UDP destination port {0}")]
    NotRoce(u16),
    /// BTH transport header version other than 0 (IBA 9.2: TVer must be 0).
    #[error("BTH TVer {0} (only 0 is defined)")]
    BadTver(u8),
    /// An opcode that is reserved or of a transport we do not implement (RD, XRC).
    #[error("unknown or unsupported opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// PadCnt claims more pad bytes than the packet carries after its headers.
    #[error("PadCnt {pad} larger than the {available} bytes after the headers")]
    PadTooLarge { pad: u8, available: usize },
    /// Payload and pad do not end on a 4-byte boundary: PadCnt is not the count that
    /// pads this payload (IBA 9.2: the pad brings the payload to a multiple of 4, and
    /// every header is a whole number of 4-byte words).
    #[error("payload of {payload} bytes with PadCnt {pad} does not end on a 4-byte boundary")]
    Unaligned { payload: usize, pad: u8 },
    /// More than 4096 bytes of payload in one packet.
    #[error("payload of {0} bytes exceeds the 4096-byte maximum")]
    PayloadTooLarge(usize),
    /// An opcode that carries no payload arrived with some.
    #[error("opcode 0x{opcode:02x} carries no payload but {len} bytes follow its headers")]
    UnexpectedPayload { opcode: u8, len: usize },
    /// A representation lacks an extension header its opcode needs.
    #[error("opcode 0x{opcode:02x} needs a {header} header")]
    MissingHeader { opcode: u8, header: &'static str },
    /// A representation has an extension header its opcode does not carry.
    #[error("opcode 0x{opcode:02x} does not carry a {header} header")]
    UnexpectedHeader { opcode: u8, header: &'static str },
    /// The ICRC does not match the packet: it was corrupted on the way.
    #[error("bad ICRC (wire 0x{wire:08x}, computed 0x{computed:08x})")]
    BadIcrc { wire: u32, computed: u32 },
    /// A field holds a value its header does not allow (the name says which).
    #[error("{0}")]
    Malformed(&'static str),
    /// The caller's buffer is too small for what is to be emitted.
    #[error("buffer of {available} bytes too small, {needed} needed")]
    BufferTooSmall { needed: usize, available: usize },
}

/// `Result` with the wire [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl Error {
    /// A short stable name for counters and JSON (`truncated`, `bad_icrc`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Truncated { .. } => "truncated",
            Error::NotIp(_) => "not_ip",
            Error::BadIpVersion(_) => "bad_ip_version",
            Error::IhlTooSmall(_) => "ihl_too_small",
            Error::BadIpLength { .. } => "bad_ip_length",
            Error::BadIpChecksum(_) => "bad_ip_checksum",
            Error::Fragmented => "fragmented",
            Error::NotUdp(_) => "not_udp",
            Error::UdpLength { .. } => "udp_length",
            Error::BadUdpChecksum { .. } => "bad_udp_checksum",
            Error::NotRoce(_) => "not_roce",
            Error::BadTver(_) => "bad_tver",
            Error::UnknownOpcode(_) => "unknown_opcode",
            Error::PadTooLarge { .. } => "pad_too_large",
            Error::Unaligned { .. } => "unaligned",
            Error::PayloadTooLarge(_) => "payload_too_large",
            Error::UnexpectedPayload { .. } => "unexpected_payload",
            Error::MissingHeader { .. } => "missing_header",
            Error::UnexpectedHeader { .. } => "unexpected_header",
            Error::BadIcrc { .. } => "bad_icrc",
            Error::Malformed(_) => "malformed",
            Error::BufferTooSmall { .. } => "buffer_too_small",
        }
    }

    /// True when the frame is simply not RoCEv2 (another protocol that shares the link),
    /// as opposed to a RoCEv2 frame that is broken.
    pub fn is_not_roce(&self) -> bool {
        matches!(
            self,
            Error::NotIp(_) | Error::NotUdp(_) | Error::NotRoce(_) | Error::Fragmented
        )
    }
}

/// Checks that `buf` holds at least `needed` bytes of `layer`.
#[inline]
pub(crate) fn check_len(layer: Layer, buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            layer,
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Reads a big-endian 24-bit value from the first three bytes of `b`.
#[inline]
pub(crate) fn get_u24(b: &[u8]) -> u32 {
    (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2])
}

/// Writes the low 24 bits of `v` big-endian into the first three bytes of `b`.
#[inline]
pub(crate) fn put_u24(b: &mut [u8], v: u32) {
    b[0] = (v >> 16) as u8;
    b[1] = (v >> 8) as u8;
    b[2] = v as u8;
}

#[inline]
pub(crate) fn get_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
pub(crate) fn get_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Defines the `Header` view and `Repr` of a 4-byte extension header that holds one
/// big-endian 32-bit value (ImmDt and IETH have exactly this shape).
macro_rules! word_header {
    ($kind:expr, $get:ident, $set:ident, $name:literal, $doc:literal) => {
        use crate::wire::{HeaderKind, Layer, Result, check_len, get_u32};

        /// Length of the header.
        pub const LEN: usize = 4;

        /// A view of the header.
        #[derive(Debug, Clone, Copy)]
        pub struct Header<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Header<T> {
            pub const fn new_unchecked(buffer: T) -> Header<T> {
                Header { buffer }
            }
            pub fn new_checked(buffer: T) -> Result<Header<T>> {
                check_len(Layer::Ext($kind), buffer.as_ref(), LEN)?;
                Ok(Header { buffer })
            }
            #[doc = $doc]
            #[inline]
            pub fn $get(&self) -> u32 {
                get_u32(&self.buffer.as_ref()[0..LEN])
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
            #[inline]
            pub fn $set(&mut self, v: u32) {
                self.buffer.as_mut()[0..LEN].copy_from_slice(&v.to_be_bytes());
            }
        }

        /// The meaning of the header.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct Repr {
            #[doc = $doc]
            pub $get: u32,
        }

        impl Repr {
            pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
                Repr { $get: h.$get() }
            }
            pub const fn buffer_len(&self) -> usize {
                LEN
            }
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
                h.$set(self.$get);
            }
        }

        impl core::fmt::Display for Repr {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, concat!($name, " 0x{:08x}"), self.$get)
            }
        }

        #[allow(dead_code)]
        const _: HeaderKind = $kind;
    };
}
pub(crate) use word_header;

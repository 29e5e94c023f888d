//! The opcode table: one entry per RC, UC and UD opcode and the CNP.
//!
//! Like rxe's `rxe_opcode.c`, this is the single place that knows, for every opcode, its
//! name, which extension headers follow the BTH and in which order, whether it may carry
//! payload, its position in a message and whether it is a request or a response. Parsing,
//! building, the engine and `decode` ask this table instead of matching opcodes by hand.
//!
//! Sources: IBA vol. 1 table 38 (opcodes) and section 9.2 (header order: DETH, RETH,
//! AtomicETH, AETH, AtomicAckETH, ImmDt, IETH); RoCEv2 annex A17.9.3 (CNP, opcode 0x81).
//! RD (0x40..) and XRC (0xA0..) are not implemented and are reported as unknown.

use core::fmt;

/// An extension header that can follow the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderKind {
    /// Datagram ETH: Q_Key and source QP (UD).
    Deth,
    /// RDMA ETH: virtual address, R_Key, DMA length (WRITE first/only, READ request).
    Reth,
    /// Atomic ETH: VA, R_Key, swap/add and compare data.
    AtomicEth,
    /// ACK ETH: syndrome and MSN (responses).
    Aeth,
    /// Atomic ACK ETH: the original remote data.
    AtomicAckEth,
    /// Immediate data.
    ImmDt,
    /// Invalidate ETH: the R_Key to invalidate.
    Ieth,
    /// The 16 reserved bytes of a RoCEv2 CNP.
    CnpReserved,
}

impl HeaderKind {
    /// All kinds, in the order IBA places them after the BTH.
    pub const ALL: [HeaderKind; 8] = [
        HeaderKind::Deth,
        HeaderKind::Reth,
        HeaderKind::AtomicEth,
        HeaderKind::Aeth,
        HeaderKind::AtomicAckEth,
        HeaderKind::ImmDt,
        HeaderKind::Ieth,
        HeaderKind::CnpReserved,
    ];

    /// Size on the wire in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            HeaderKind::Deth => 8,
            HeaderKind::Reth => 16,
            HeaderKind::AtomicEth => 28,
            HeaderKind::Aeth => 4,
            HeaderKind::AtomicAckEth => 8,
            HeaderKind::ImmDt => 4,
            HeaderKind::Ieth => 4,
            HeaderKind::CnpReserved => 16,
        }
    }

    /// The name IBA gives the header.
    pub const fn name(self) -> &'static str {
        match self {
            HeaderKind::Deth => "DETH",
            HeaderKind::Reth => "RETH",
            HeaderKind::AtomicEth => "AtomicETH",
            HeaderKind::Aeth => "AETH",
            HeaderKind::AtomicAckEth => "AtomicAckETH",
            HeaderKind::ImmDt => "ImmDt",
            HeaderKind::Ieth => "IETH",
            HeaderKind::CnpReserved => "CNP reserved",
        }
    }

    pub(crate) const fn index(self) -> usize {
        self as usize
    }
}

/// The transport service an opcode belongs to (top three bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
    /// RoCEv2 Congestion Notification Packet.
    Cnp,
}

impl Transport {
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
        }
    }
}

/// What a packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Send,
    Write,
    ReadRequest,
    ReadResponse,
    Ack,
    AtomicAck,
    CompareSwap,
    FetchAdd,
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// True for FIRST and ONLY: the packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// True for LAST and ONLY: the packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// One row of the table.
#[derive(Debug)]
pub struct OpcodeInfo {
    /// The BTH opcode byte.
    pub code: u8,
    /// The IBA name, as rxe spells it without the `IB_OPCODE_` prefix.
    pub name: &'static str,
    pub transport: Transport,
    pub operation: Operation,
    pub position: Position,
    /// True for requests (sent by the requester), false for responses.
    pub request: bool,
    /// The extension headers after the BTH, in wire order.
    pub headers: &'static [HeaderKind],
    /// True when the packet may carry payload after its headers.
    pub payload: bool,
    /// One sentence for people learning the protocol.
    pub meaning: &'static str,
    /// Total length of the extension headers.
    pub ext_len: usize,
    /// Offset after the BTH of each header kind, `NONE` when absent.
    offsets: [u8; 8],
    /// Bit `kind as u8` set for each header carried.
    mask: u8,
}

const NONE: u8 = 0xff;

impl OpcodeInfo {
    /// True when this opcode carries header `kind`.
    #[inline]
    pub const fn has(&self, kind: HeaderKind) -> bool {
        self.offsets[kind.index()] != NONE
    }

    /// Offset of header `kind` counted from the end of the BTH, if the opcode carries it.
    #[inline]
    pub const fn offset(&self, kind: HeaderKind) -> Option<usize> {
        let o = self.offsets[kind.index()];
        if o == NONE { None } else { Some(o as usize) }
    }

    /// Bit set of the headers carried (bit `HeaderKind as u8`).
    #[inline]
    pub const fn header_mask(&self) -> u8 {
        self.mask
    }

    /// True when the packet carries immediate data.
    pub const fn has_imm(&self) -> bool {
        self.has(HeaderKind::ImmDt)
    }

    /// True for SEND with Invalidate.
    pub const fn has_inv(&self) -> bool {
        self.has(HeaderKind::Ieth)
    }

    /// True for atomic requests.
    pub const fn is_atomic(&self) -> bool {
        matches!(self.operation, Operation::CompareSwap | Operation::FetchAdd)
    }
}

#[allow(clippy::too_many_arguments)] // one argument per table column
const fn row(
    code: u8,
    name: &'static str,
    transport: Transport,
    operation: Operation,
    position: Position,
    request: bool,
    headers: &'static [HeaderKind],
    payload: bool,
    meaning: &'static str,
) -> OpcodeInfo {
    let mut offsets = [NONE; 8];
    let mut mask = 0u8;
    let mut off = 0usize;
    let mut i = 0;
    while i < headers.len() {
        offsets[headers[i].index()] = off as u8;
        mask |= 1 << headers[i].index();
        off += headers[i].wire_len();
        i += 1;
    }
    OpcodeInfo {
        code,
        name,
        transport,
        operation,
        position,
        request,
        headers,
        payload,
        meaning,
        ext_len: off,
        offsets,
        mask,
    }
}

use HeaderKind as H;
use Operation as O;
use Position as P;
use Transport as T;

const NO_HDR: &[HeaderKind] = &[];
const RETH: &[HeaderKind] = &[H::Reth];
const IMM: &[HeaderKind] = &[H::ImmDt];
const RETH_IMM: &[HeaderKind] = &[H::Reth, H::ImmDt];
const AETH: &[HeaderKind] = &[H::Aeth];
const ATOMIC_ACK: &[HeaderKind] = &[H::Aeth, H::AtomicAckEth];
const ATOMIC: &[HeaderKind] = &[H::AtomicEth];
const IETH: &[HeaderKind] = &[H::Ieth];
const DETH: &[HeaderKind] = &[H::Deth];
const DETH_IMM: &[HeaderKind] = &[H::Deth, H::ImmDt];
const CNP: &[HeaderKind] = &[H::CnpReserved];

/// Every opcode roce-xdp knows, in numeric order.
#[rustfmt::skip]
pub static TABLE: [OpcodeInfo; 40] = [
    // Reliable Connected (0x00-0x1f)
    row(0x00, "RC_SEND_FIRST", T::Rc, O::Send, P::First, true, NO_HDR, true,
        "first packet of a multi-packet SEND"),
    row(0x01, "RC_SEND_MIDDLE", T::Rc, O::Send, P::Middle, true, NO_HDR, true,
        "middle packet of a multi-packet SEND"),
    row(0x02, "RC_SEND_LAST", T::Rc, O::Send, P::Last, true, NO_HDR, true,
        "last packet of a multi-packet SEND"),
    row(0x03, "RC_SEND_LAST_WITH_IMMEDIATE", T::Rc, O::Send, P::Last, true, IMM, true,
        "last packet of a SEND that delivers 4 bytes of immediate data to the receiver's completion"),
    row(0x04, "RC_SEND_ONLY", T::Rc, O::Send, P::Only, true, NO_HDR, true,
        "a whole SEND in one packet: consumes one receive WQE at the responder"),
    row(0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", T::Rc, O::Send, P::Only, true, IMM, true,
        "a whole SEND in one packet, with 4 bytes of immediate data"),
    row(0x06, "RC_RDMA_WRITE_FIRST", T::Rc, O::Write, P::First, true, RETH, true,
        "first packet of a multi-packet RDMA WRITE: RETH names the remote buffer"),
    row(0x07, "RC_RDMA_WRITE_MIDDLE", T::Rc, O::Write, P::Middle, true, NO_HDR, true,
        "middle packet of an RDMA WRITE: data goes right after the previous packet's"),
    row(0x08, "RC_RDMA_WRITE_LAST", T::Rc, O::Write, P::Last, true, NO_HDR, true,
        "last packet of an RDMA WRITE"),
    row(0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::Rc, O::Write, P::Last, true, IMM, true,
        "last packet of an RDMA WRITE whose immediate data also consumes a receive WQE"),
    row(0x0a, "RC_RDMA_WRITE_ONLY", T::Rc, O::Write, P::Only, true, RETH, true,
        "a whole RDMA WRITE in one packet: data lands at RETH's address without the remote CPU"),
    row(0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::Rc, O::Write, P::Only, true, RETH_IMM, true,
        "a whole RDMA WRITE in one packet, with immediate data for a receive WQE"),
    row(0x0c, "RC_RDMA_READ_REQUEST", T::Rc, O::ReadRequest, P::Only, true, RETH, false,
        "asks the responder to send back DMALen bytes from RETH's address"),
    row(0x0d, "RC_RDMA_READ_RESPONSE_FIRST", T::Rc, O::ReadResponse, P::First, false, AETH, true,
        "first packet of the data an RDMA READ asked for"),
    row(0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", T::Rc, O::ReadResponse, P::Middle, false, NO_HDR, true,
        "middle packet of RDMA READ response data"),
    row(0x0f, "RC_RDMA_READ_RESPONSE_LAST", T::Rc, O::ReadResponse, P::Last, false, AETH, true,
        "last packet of RDMA READ response data"),
    row(0x10, "RC_RDMA_READ_RESPONSE_ONLY", T::Rc, O::ReadResponse, P::Only, false, AETH, true,
        "all the data of an RDMA READ in one packet"),
    row(0x11, "RC_ACKNOWLEDGE", T::Rc, O::Ack, P::Only, false, AETH, false,
        "acknowledges every request up to this PSN, or NAKs it (see the AETH syndrome)"),
    row(0x12, "RC_ATOMIC_ACKNOWLEDGE", T::Rc, O::AtomicAck, P::Only, false, ATOMIC_ACK, false,
        "acknowledges an atomic and returns the value the remote memory held before it"),
    row(0x13, "RC_COMPARE_SWAP", T::Rc, O::CompareSwap, P::Only, true, ATOMIC, false,
        "atomically: if the remote 8 bytes equal Compare, replace them with Swap"),
    row(0x14, "RC_FETCH_ADD", T::Rc, O::FetchAdd, P::Only, true, ATOMIC, false,
        "atomically add to the remote 8 bytes and return what they held"),
    row(0x16, "RC_SEND_LAST_WITH_INVALIDATE", T::Rc, O::Send, P::Last, true, IETH, true,
        "last packet of a SEND that also invalidates the R_Key in IETH at the receiver"),
    row(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", T::Rc, O::Send, P::Only, true, IETH, true,
        "a whole SEND in one packet that also invalidates the R_Key in IETH"),
    // Unreliable Connected (0x20-0x3f): no ACKs, a lost packet loses its message.
    row(0x20, "UC_SEND_FIRST", T::Uc, O::Send, P::First, true, NO_HDR, true,
        "first packet of a multi-packet unreliable SEND"),
    row(0x21, "UC_SEND_MIDDLE", T::Uc, O::Send, P::Middle, true, NO_HDR, true,
        "middle packet of an unreliable SEND"),
    row(0x22, "UC_SEND_LAST", T::Uc, O::Send, P::Last, true, NO_HDR, true,
        "last packet of an unreliable SEND"),
    row(0x23, "UC_SEND_LAST_WITH_IMMEDIATE", T::Uc, O::Send, P::Last, true, IMM, true,
        "last packet of an unreliable SEND with immediate data"),
    row(0x24, "UC_SEND_ONLY", T::Uc, O::Send, P::Only, true, NO_HDR, true,
        "a whole unreliable SEND in one packet"),
    row(0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", T::Uc, O::Send, P::Only, true, IMM, true,
        "a whole unreliable SEND in one packet, with immediate data"),
    row(0x26, "UC_RDMA_WRITE_FIRST", T::Uc, O::Write, P::First, true, RETH, true,
        "first packet of an unreliable RDMA WRITE"),
    row(0x27, "UC_RDMA_WRITE_MIDDLE", T::Uc, O::Write, P::Middle, true, NO_HDR, true,
        "middle packet of an unreliable RDMA WRITE"),
    row(0x28, "UC_RDMA_WRITE_LAST", T::Uc, O::Write, P::Last, true, NO_HDR, true,
        "last packet of an unreliable RDMA WRITE"),
    row(0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", T::Uc, O::Write, P::Last, true, IMM, true,
        "last packet of an unreliable RDMA WRITE with immediate data"),
    row(0x2a, "UC_RDMA_WRITE_ONLY", T::Uc, O::Write, P::Only, true, RETH, true,
        "a whole unreliable RDMA WRITE in one packet"),
    row(0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::Uc, O::Write, P::Only, true, RETH_IMM, true,
        "a whole unreliable RDMA WRITE in one packet, with immediate data"),
    // Unreliable Datagram (0x60-0x7f): one packet per message, DETH says who sent it.
    row(0x64, "UD_SEND_ONLY", T::Ud, O::Send, P::Only, true, DETH, true,
        "a datagram: one packet, one message; DETH carries the Q_Key and the sender's QP"),
    row(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", T::Ud, O::Send, P::Only, true, DETH_IMM, true,
        "a datagram with immediate data"),
    // RoCEv2 annex A17.9.3
    row(0x81, "CNP", T::Cnp, O::Cnp, P::Only, false, CNP, false,
        "congestion notification: the receiver saw ECN-marked packets from this QP; slow down"),
    // Sentinels that keep the table size a constant; never returned by lookup.
    row(0xff, "", T::Cnp, O::Cnp, P::Only, false, NO_HDR, false, ""),
    row(0xff, "", T::Cnp, O::Cnp, P::Only, false, NO_HDR, false, ""),
];

/// Index of each opcode byte into `TABLE`, `NONE` when unknown.
static INDEX: [u8; 256] = {
    let mut idx = [NONE; 256];
    let mut i = 0;
    while i < TABLE.len() {
        if !TABLE[i].name.is_empty() {
            idx[TABLE[i].code as usize] = i as u8;
        }
        i += 1;
    }
    idx
};

/// A BTH opcode byte. Any value can be held; [`Opcode::info`] says whether it is known.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    pub const CNP: Opcode = Opcode(0x81);

    /// The table row for this opcode, or `None` for a reserved or unsupported one.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        let i = INDEX[self.0 as usize];
        if i == NONE {
            None
        } else {
            Some(&TABLE[i as usize])
        }
    }

    /// The name, or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// Every known opcode.
    pub fn all() -> impl Iterator<Item = &'static OpcodeInfo> {
        TABLE.iter().filter(|r| !r.name.is_empty())
    }

    /// The opcode of `transport` that performs `operation` at `position` with the given
    /// extras, if one exists: how the requester picks opcodes without hand-written matches.
    /// A constant-time lookup in a table derived from [`TABLE`] at compile time.
    #[inline]
    pub fn find(
        transport: Transport,
        operation: Operation,
        position: Position,
        imm: bool,
        inv: bool,
    ) -> Option<Opcode> {
        let c = FIND[find_key(transport, operation, position, imm, inv)];
        if c == NONE { None } else { Some(Opcode(c)) }
    }
}

const fn find_key(t: Transport, o: Operation, p: Position, imm: bool, inv: bool) -> usize {
    ((((t as usize) * 9 + o as usize) * 4 + p as usize) * 2 + imm as usize) * 2 + inv as usize
}

/// `find_key(..)` -> opcode byte, `NONE` where no opcode exists.
static FIND: [u8; 4 * 9 * 4 * 2 * 2] = {
    let mut t = [NONE; 4 * 9 * 4 * 2 * 2];
    let mut i = 0;
    while i < TABLE.len() {
        let r = &TABLE[i];
        if !r.name.is_empty() {
            let k = find_key(
                r.transport,
                r.operation,
                r.position,
                r.has_imm(),
                r.has_inv(),
            );
            t[k] = r.code;
        }
        i += 1;
    }
    t
};

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_opcode_round_trips_through_the_index() {
        let mut n = 0;
        for b in 0..=255u8 {
            if let Some(info) = Opcode(b).info() {
                assert_eq!(info.code, b);
                n += 1;
            }
        }
        assert_eq!(n, 38);
    }

    #[test]
    fn transport_matches_the_top_bits() {
        for r in Opcode::all() {
            let t = match r.code >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                _ => unreachable!(),
            };
            assert_eq!(r.transport, t, "{}", r.name);
        }
    }

    #[test]
    fn offsets_follow_header_order() {
        let w = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(w.offset(HeaderKind::Reth), Some(0));
        assert_eq!(w.offset(HeaderKind::ImmDt), Some(16));
        assert_eq!(w.ext_len, 20);
        let a = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!(a.offset(HeaderKind::Aeth), Some(0));
        assert_eq!(a.offset(HeaderKind::AtomicAckEth), Some(4));
        let u = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!(u.offset(HeaderKind::Deth), Some(0));
        assert_eq!(u.offset(HeaderKind::ImmDt), Some(8));
        assert_eq!(Opcode::CNP.info().unwrap().ext_len, 16);
    }

    #[test]
    fn header_lists_are_in_iba_order() {
        for r in Opcode::all() {
            let pos: Vec<usize> = r
                .headers
                .iter()
                .map(|h| HeaderKind::ALL.iter().position(|k| k == h).unwrap())
                .collect();
            assert!(pos.windows(2).all(|w| w[0] < w[1]), "{}", r.name);
        }
    }

    #[test]
    fn find_picks_the_right_opcode() {
        use Operation as O;
        use Position as P;
        assert_eq!(
            Opcode::find(Transport::Rc, O::Write, P::Last, true, false),
            Some(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE)
        );
        assert_eq!(
            Opcode::find(Transport::Rc, O::Send, P::Only, false, true),
            Some(Opcode::RC_SEND_ONLY_WITH_INVALIDATE)
        );
        assert_eq!(
            Opcode::find(Transport::Uc, O::Send, P::Middle, false, false),
            Some(Opcode::UC_SEND_MIDDLE)
        );
        assert_eq!(
            Opcode::find(Transport::Ud, O::Send, P::First, false, false),
            None
        );
        assert_eq!(
            Opcode::find(Transport::Uc, O::Send, P::Only, false, true),
            None
        );
    }

    #[test]
    fn find_agrees_with_a_search_of_the_table() {
        use Operation as O;
        use Position as P;
        for t in [Transport::Rc, Transport::Uc, Transport::Ud, Transport::Cnp] {
            for o in [
                O::Send,
                O::Write,
                O::ReadRequest,
                O::ReadResponse,
                O::Ack,
                O::AtomicAck,
                O::CompareSwap,
                O::FetchAdd,
                O::Cnp,
            ] {
                for p in [P::First, P::Middle, P::Last, P::Only] {
                    for (imm, inv) in [(false, false), (true, false), (false, true), (true, true)] {
                        let slow = Opcode::all()
                            .find(|r| {
                                r.transport == t
                                    && r.operation == o
                                    && r.position == p
                                    && r.has_imm() == imm
                                    && r.has_inv() == inv
                            })
                            .map(|r| Opcode(r.code));
                        assert_eq!(Opcode::find(t, o, p, imm, inv), slow);
                    }
                }
            }
        }
    }

    #[test]
    fn unknown_opcodes() {
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x40).info().is_none());
        assert!(Opcode(0xff).info().is_none());
        assert_eq!(Opcode(0x18).name(), "UNKNOWN");
    }
}

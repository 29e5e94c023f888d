//! Property tests of the wire layer: hostile bytes never panic, and parse(emit(x)) == x
//! for random valid frames of every opcode.

use proptest::prelude::*;
use roce_xdp::wire::aeth::Syndrome;
use roce_xdp::wire::roce::pad_for;
use roce_xdp::wire::*;
use std::net::{Ipv4Addr, Ipv6Addr};

include!("support/touch_frame.rs");

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    let v4 = (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        0u8..64,
        0u8..4,
        any::<u16>(),
        any::<bool>(),
        any::<u8>(),
        0usize..=10,
        any::<[u8; 40]>(),
    )
        .prop_map(|(s, d, dscp, ecn, id, df, ttl, words, opt)| {
            let mut r = Ipv4Repr::new(Ipv4Addr::from(s), Ipv4Addr::from(d), id);
            r.dscp = dscp;
            r.ecn = ecn;
            r.dont_fragment = df;
            r.ttl = ttl;
            r.options = etherparse::Ipv4Options::try_from(&opt[..words * 4]).unwrap();
            IpRepr::V4(r)
        });
    let v6 = (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        0u32..(1 << 20),
        any::<u8>(),
    )
        .prop_map(|(s, d, tc, fl, hl)| {
            IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class: tc,
                flow_label: fl,
                hop_limit: hl,
            })
        });
    prop_oneof![v4, v6]
}

#[derive(Debug, Clone)]
struct Case {
    eth: EthRepr,
    ip: IpRepr,
    sport: u16,
    bth: BthRepr,
    ext: ExtRepr,
    payload: Vec<u8>,
}

impl Case {
    fn repr(&self) -> FrameRepr<'_> {
        FrameRepr {
            eth: self.eth,
            ip: self.ip.clone(),
            udp: UdpRepr {
                src_port: self.sport,
                dst_port: ROCE_V2_PORT,
            },
            roce: RoceRepr {
                bth: self.bth,
                ext: self.ext,
                payload: &self.payload,
            },
        }
    }
}

fn arb_case() -> impl Strategy<Value = Case> {
    let opcodes: Vec<u8> = Opcode::all().map(|i| i.code).collect();
    (
        proptest::sample::select(opcodes),
        any::<([u8; 6], [u8; 6])>(),
        proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
        arb_ip(),
        any::<u16>(),
        any::<(bool, bool, u16, bool, bool, u32, bool, u32)>(),
        any::<(u64, u32, u32, u64, u64, u8, u32)>(),
        proptest::collection::vec(any::<u8>(), 0..=4096),
    )
        .prop_map(|(op, (dst, src), vlan, ip, sport, b, x, payload)| {
            let info = Opcode(op).info().unwrap();
            let payload = if info.payload { payload } else { vec![] };
            let (se, m, pkey, fecn, becn, dqp, ackreq, psn) = b;
            let (va, key, len, a, c, synd, msn) = x;
            let has = |k| info.has(k);
            let ext = ExtRepr {
                deth: has(HeaderKind::Deth).then_some(DethRepr {
                    qkey: key,
                    src_qp: len & 0xff_ffff,
                }),
                reth: has(HeaderKind::Reth).then_some(RethRepr {
                    va,
                    rkey: key,
                    dma_len: len,
                }),
                atomic_eth: has(HeaderKind::AtomicEth).then_some(AtomicEthRepr {
                    va,
                    rkey: key,
                    swap_add: a,
                    compare: c,
                }),
                aeth: has(HeaderKind::Aeth).then_some(AethRepr {
                    syndrome: Syndrome::from_byte(synd),
                    msn: msn & 0xff_ffff,
                }),
                atomic_ack_eth: has(HeaderKind::AtomicAckEth)
                    .then_some(AtomicAckEthRepr { orig: a }),
                immdt: has(HeaderKind::ImmDt).then_some(ImmDtRepr { imm: msn }),
                ieth: has(HeaderKind::Ieth).then_some(IethRepr { rkey: len }),
            };
            let ethertype = match ip {
                IpRepr::V4(_) => 0x0800,
                IpRepr::V6(_) => 0x86dd,
            };
            Case {
                eth: EthRepr {
                    dst,
                    src,
                    vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                    ethertype,
                },
                ip,
                sport,
                bth: BthRepr {
                    opcode: Opcode(op),
                    solicited: se,
                    mig_req: m,
                    pad_count: pad_for(payload.len()),
                    pkey,
                    fecn,
                    becn,
                    dest_qp: dqp & 0xff_ffff,
                    ack_req: ackreq,
                    psn: Psn::new(psn),
                },
                ext,
                payload,
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// Every CM attribute (and its neighbours) with class data of any length and
    /// content, alone and inside a CM-class MAD: decoding never panics, and whatever
    /// decodes only points into the bytes it was given.
    #[test]
    fn cm_messages_of_any_length_never_panic(
        attr in prop_oneof![0x0008u16..0x0022, any::<u16>()],
        data in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        if let Ok(m) = cm::CmMessage::parse(attr, &data) {
            let _ = format!("{m:?}");
        }
        let _ = cm::CmaHeader::parse(&data);
        let mut mad = vec![0u8; mad::HEADER_LEN];
        mad[0] = 1;
        mad[1] = mad::CLASS_CM;
        mad[2] = 2;
        mad[16..18].copy_from_slice(&attr.to_be_bytes());
        mad.extend_from_slice(&data);
        match cm::CmMessage::from_mad(&mad) {
            Ok(Some((r, m))) => {
                prop_assert_eq!(r.attribute_id, attr);
                let _ = format!("{m:?}");
            }
            Ok(None) => prop_assert!(false, "a CM-class MAD was not taken as CM"),
            Err(_) => {}
        }
    }

    /// Whatever decodes as a CM message re-emits to bytes that decode to the same
    /// message (emission zeroes only what decoding ignores: reserved bits).
    #[test]
    fn cm_messages_reemit_to_what_they_decoded_from(
        attr in prop_oneof![0x0010u16..0x0019],
        data in proptest::collection::vec(any::<u8>(), cm::MESSAGE_LEN..cm::MESSAGE_LEN + 1),
    ) {
        let m = cm::CmMessage::parse(attr, &data).unwrap();
        let mut out = [0u8; cm::MESSAGE_LEN];
        m.emit(&mut out).unwrap();
        prop_assert_eq!(cm::CmMessage::parse(attr, &out).unwrap(), m);
        prop_assert_eq!(m.attribute_id(), attr);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        if let Ok(f) = Frame::parse(&bytes) {
            touch(&f);
        }
        if let Ok(f) = Frame::parse_ip(&bytes) {
            touch(&f);
        }
        if let Ok(p) = RocePacket::new_checked(&bytes[..]) {
            let _ = RoceRepr::parse(&p);
        }
        let _ = cm::CmMessage::from_mad(&bytes);
    }

    #[test]
    fn arbitrary_bytes_in_two_pieces_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..1600),
        cut in any::<proptest::sample::Index>(),
    ) {
        let at = cut.index(bytes.len() + 1);
        if let Ok(f) = Frame::parse_parts(&bytes[..at], &bytes[at..]) {
            touch_chained(&f);
        }
    }

    /// A valid frame cut anywhere after its transport headers (AF_XDP chains a frame
    /// over buffers wherever the first one ends) parses, verifies and yields the same
    /// payload, ICRC and headers as whole; cut before that, it is an error, not a panic.
    #[test]
    fn frames_in_two_pieces_read_as_whole_ones(c in arb_case(), cut in any::<proptest::sample::Index>()) {
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut buf).unwrap();
        let whole = Frame::parse(&buf).unwrap();
        let at = cut.index(buf.len() + 1);
        let heads = whole.bth_offset() + whole.roce().payload_offset();
        let pad = usize::from(whole.roce().bth().pad_count());
        match Frame::parse_parts(&buf[..at], &buf[at..]) {
            Ok(f) => {
                touch_chained(&f);
                prop_assert_eq!(f.is_chained(), at < buf.len());
                f.verify().unwrap();
                prop_assert_eq!(f.payload().to_vec(), whole.roce().payload().to_vec());
                prop_assert_eq!(f.payload_len(), whole.payload_len());
                prop_assert_eq!(f.icrc(), whole.icrc());
                prop_assert_eq!(f.computed_icrc(), whole.computed_icrc());
                prop_assert_eq!(f.roce().bth().psn(), whole.roce().bth().psn());
                prop_assert_eq!(f.roce().ext(HeaderKind::Reth), whole.roce().ext(HeaderKind::Reth));
            }
            Err(e) => prop_assert!(at < heads + pad + 4, "cut at {} of {}: {:?}", at, buf.len(), e),
        }
    }

    /// A frame built in two pieces (a head cut anywhere, then a tail) is, joined, the
    /// frame built whole, byte for byte, and parses in those pieces; a head too short
    /// for the headers is an error.
    #[test]
    fn frames_built_in_two_pieces_are_the_whole_ones(c in arb_case(), cut in any::<proptest::sample::Index>(), id in any::<u16>()) {
        let r = c.repr();
        let tpl = FrameTemplate::new(&r.eth, &r.ip, &r.udp).unwrap();
        let roce = RoceRepr { payload: &[], ..r.roce };
        let len = c.payload.len();
        let total = tpl.buffer_len_for(&roce, len).unwrap();
        let mut whole = vec![0u8; total];
        tpl.emit(&mut whole, id, &roce, len, |d| d.copy_from_slice(&c.payload)).unwrap();
        let k = cut.index(total + 1);
        let (mut head, mut tail) = (vec![0xaau8; k], vec![0x55u8; total]);
        let built = tpl.start(&mut head, &tail, id, &roce, len).and_then(|l| {
            let mut p = l.payload(&mut head, &mut tail);
            assert_eq!(p.len(), len);
            assert!(p.write(&c.payload));
            tpl.finish(&l, &mut head, &mut tail)
        });
        let headers = tpl.header_len() + roce.header_len().unwrap();
        match built {
            Ok(n) => {
                prop_assert_eq!(n, total);
                let t = n.saturating_sub(k);
                let mut joined = head[..k.min(n)].to_vec();
                joined.extend_from_slice(&tail[..t]);
                prop_assert_eq!(&joined, &whole);
                if t > 0 && k >= headers + 7 {
                    Frame::parse_parts(&head, &tail[..t]).unwrap().verify().unwrap();
                }
            }
            Err(e) => prop_assert!(k < headers, "head {} of {}: {:?}", k, total, e),
        }
    }

    /// A bit flipped in the second piece of a chained frame (payload, pad or ICRC) is
    /// caught, as in a whole one.
    #[test]
    fn flips_in_the_second_piece_are_caught(c in arb_case(), cut in any::<proptest::sample::Index>(), at in any::<proptest::sample::Index>(), bit in 0u8..8) {
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut buf).unwrap();
        let whole = Frame::parse(&buf).unwrap();
        let heads = whole.bth_offset() + whole.roce().payload_offset() + 7;
        prop_assume!(heads < buf.len());
        let k = heads + cut.index(buf.len() - heads);
        let i = k + at.index(buf.len() - k);
        buf[i] ^= 1 << bit;
        let f = Frame::parse_parts(&buf[..k], &buf[k..]).unwrap();
        prop_assert!(f.verify().is_err(), "flip at {} bit {} (cut {}) unnoticed", i, bit, k);
    }

    #[test]
    fn parse_emit_round_trip(c in arb_case()) {
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        let n = r.emit(&mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        let f = Frame::parse(&buf).unwrap();
        f.verify().unwrap();
        prop_assert_eq!(FrameRepr::parse(&f).unwrap(), r);
        // Emitting the parsed frame again gives the same bytes.
        let mut again = vec![0u8; n];
        FrameRepr::parse(&f).unwrap().emit(&mut again).unwrap();
        prop_assert_eq!(&again, &buf);
    }

    #[test]
    fn truncations_are_errors(c in arb_case(), cut in any::<proptest::sample::Index>()) {
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut buf).unwrap();
        let at = cut.index(buf.len());
        let e = Frame::parse(&buf[..at]).unwrap_err();
        prop_assert!(matches!(e, Error::Truncated { .. }), "{:?}", e);
    }

    #[test]
    fn mutations_never_panic_and_are_caught(c in arb_case(), at in any::<proptest::sample::Index>(), bit in 0u8..8) {
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut buf).unwrap();
        let l2 = r.eth.buffer_len();
        let i = l2 + at.index(buf.len() - l2);
        buf[i] ^= 1 << bit;
        let bth = l2 + r.ip.buffer_len() + 8;
        if let Ok(f) = Frame::parse(&buf) {
            touch(&f);
            // Only BTH byte 4 (FECN, BECN, reserved: switches may set them) and the
            // IPv6 fields the ICRC masks (no header checksum) may change unnoticed.
            let v6_masked = matches!(r.ip, IpRepr::V6(_)) && {
                let o = i - l2;
                o == 0 && bit < 4 || o == 1 || o == 2 || o == 3 || o == 7
            };
            let resv = i == bth + 4;
            if !(v6_masked || resv) {
                prop_assert!(f.verify().is_err(), "flip at {} bit {} unnoticed", i, bit);
            }
        }
    }

    #[test]
    fn hostile_transport_headers_never_panic(c in arb_case(), junk in proptest::collection::vec(any::<u8>(), 64)) {
        // Valid Ethernet/IP/UDP around a BTH and extension headers of random bytes, so the
        // RoCE parser itself sees hostile opcodes, flags and lengths.
        let r = c.repr();
        let mut buf = vec![0u8; r.buffer_len().unwrap()];
        r.emit(&mut buf).unwrap();
        let bth = r.eth.buffer_len() + r.ip.buffer_len() + 8;
        let end = buf.len().min(bth + junk.len());
        buf[bth..end].copy_from_slice(&junk[..end - bth]);
        if let Ok(f) = Frame::parse(&buf) {
            touch(&f);
        }
    }
}

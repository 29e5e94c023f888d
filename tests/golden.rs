//! Golden data: real captures of Linux rdma_rxe (see tests/data/README.md).
//!
//! Every RoCEv2 frame must parse, verify, match the fields Wireshark's own dissector
//! reports for it (tests/data/*.tshark.tsv, produced by tshark 4.0), and re-emit from its
//! parsed representation to the original bytes.

use roce_xdp::capture::Capture;
use roce_xdp::wire::{Error, FrameRepr};
use std::collections::HashMap;
use std::path::Path;

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Parses a tshark TSV: frame number -> column name -> value (empty values dropped).
fn tshark(name: &str) -> HashMap<usize, HashMap<String, String>> {
    let text = std::fs::read_to_string(data(name)).unwrap();
    let mut lines = text.lines();
    let head = lines.next().unwrap();
    let cols: Vec<String> = head
        .split_once(':')
        .unwrap()
        .1
        .split_whitespace()
        .map(|c| c.trim_start_matches("infiniband.").to_string())
        .collect();
    let mut out = HashMap::new();
    for l in lines {
        let vals: Vec<&str> = l.split('\t').collect();
        let mut row = HashMap::new();
        for (c, v) in cols.iter().zip(&vals) {
            if !v.is_empty() {
                row.insert(c.clone(), v.to_string());
            }
        }
        out.insert(vals[0].parse().unwrap(), row);
    }
    out
}

fn num(s: &str) -> u64 {
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap()
    } else {
        s.parse().unwrap()
    }
}

#[test]
fn every_rxe_frame_parses_verifies_matches_wireshark_and_reemits_exactly() {
    let cap = Capture::open(&data("rxe-vm2vm-mtu1024.pcap")).unwrap();
    let expect = tshark("rxe-vm2vm-mtu1024.tshark.tsv");
    let (mut roce, mut other, mut fields_checked) = (0, 0, 0);
    let mut opcodes = std::collections::BTreeMap::new();
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let f = match p.roce() {
            Ok(f) => f,
            Err(e) => {
                assert!(e.is_not_roce(), "frame {}: {e}", p.index);
                assert!(!expect.contains_key(&p.index), "frame {} is RoCE", p.index);
                other += 1;
                continue;
            }
        };
        roce += 1;
        f.verify()
            .unwrap_or_else(|e| panic!("frame {}: {e}", p.index));
        let r = f.roce();
        let bth = r.bth();
        *opcodes.entry(bth.opcode().0).or_insert(0) += 1;

        let row = &expect[&p.index];
        let eq = |col: &str, ours: u64| {
            if let Some(v) = row.get(col) {
                assert_eq!(num(v), ours, "frame {} {col}", p.index);
            }
        };
        eq("bth.opcode", u64::from(bth.opcode().0));
        eq("bth.se", u64::from(bth.solicited()));
        eq("bth.m", u64::from(bth.mig_req()));
        eq("bth.padcnt", u64::from(bth.pad_count()));
        eq("bth.p_key", u64::from(bth.pkey()));
        eq("bth.destqp", u64::from(bth.dest_qp()));
        eq("bth.a", u64::from(bth.ack_req()));
        eq("bth.psn", u64::from(bth.psn().value()));
        eq("udp.srcport", u64::from(f.src_port()));
        if let Some(h) = r.reth() {
            eq("reth.va", h.va());
            eq("reth.r_key", u64::from(h.rkey()));
            eq("reth.dmalen", u64::from(h.dma_len()));
        }
        if let Some(h) = r.aeth() {
            eq("aeth.syndrome", u64::from(h.syndrome_byte()));
            eq("aeth.msn", u64::from(h.msn()));
        }
        if let Some(h) = r.deth() {
            eq("deth.q_key", u64::from(h.qkey()));
            eq("deth.srcqp", u64::from(h.src_qp()));
        }
        // Wireshark shows the ICRC bytes as a big-endian number.
        eq("invariant.crc", u64::from(r.icrc().swap_bytes()));
        assert_eq!(row["ip.src"], f.ip().src().to_string());
        assert_eq!(row["ip.dst"], f.ip().dst().to_string());
        fields_checked += row.len();

        // parse, then emit: the same bytes.
        let repr = FrameRepr::parse(&f).unwrap();
        let mut buf = vec![0u8; repr.buffer_len().unwrap()];
        let n = repr.emit(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            f.bytes(),
            "frame {} re-emitted differently",
            p.index
        );
    }
    assert_eq!(roce, 505);
    assert_eq!(other, 736 - 505);
    assert_eq!(expect.len(), 505);
    assert!(fields_checked > 505 * 12);
    // The opcodes the capture is documented to contain (shared/README.md).
    let want = [
        0u8, 1, 2, 4, 6, 7, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 32, 33, 34, 100,
    ];
    assert_eq!(opcodes.keys().copied().collect::<Vec<_>>(), want);
}

#[test]
fn the_corrupted_frame_is_the_only_bad_icrc() {
    let cap = Capture::open(&data("rxe-afxdp-peer.pcap")).unwrap();
    let expect = tshark("rxe-afxdp-peer.tshark.tsv");
    let (mut good, mut bad) = (0, vec![]);
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let Ok(f) = p.roce() else { continue };
        assert!(expect.contains_key(&p.index));
        match f.verify() {
            Ok(()) => good += 1,
            Err(Error::BadIcrc { wire, computed }) => bad.push((p.index, wire, computed)),
            Err(e) => panic!("frame {}: {e}", p.index),
        }
    }
    // icrc_check.py (two independent computations) agrees: frame 1, one bit flipped.
    assert_eq!(bad, vec![(1, 0x79e3_e1fc, 0x78e3_e1fc)]);
    assert_eq!(good, 116);
}

/// Every CM MAD in the rxe captures (rping and `ib_write_bw -R` between two rxe
/// kernels, and the REQs of the AF_XDP peer capture) decodes, and re-emits from what was
/// decoded to the exact 256 bytes the kernel's CM sent: the emitter writes what the
/// kernel writes, field by field.
#[test]
fn every_rxe_cm_mad_reemits_to_its_own_bytes() {
    use roce_xdp::wire::{cm, mad};
    let mut seen = std::collections::BTreeMap::new();
    for name in ["rxe-vm2vm-mtu1024.pcap", "rxe-afxdp-peer.pcap"] {
        let cap = Capture::open(&data(name)).unwrap();
        for p in cap.packets().unwrap() {
            let p = p.unwrap();
            let Ok(f) = p.roce() else { continue };
            let r = f.roce();
            if r.bth().dest_qp() != 1 {
                continue;
            }
            let m = r.payload();
            let (hdr, msg) = cm::CmMessage::from_mad(m)
                .unwrap_or_else(|e| panic!("{name} frame {}: {e}", p.index))
                .unwrap_or_else(|| panic!("{name} frame {}: not a CM MAD", p.index));
            assert!(!matches!(msg, cm::CmMessage::Other(_)), "frame {}", p.index);
            let mut out = [0u8; mad::MAD_LEN];
            msg.emit_mad(&hdr, &mut out).unwrap();
            assert_eq!(
                &out[..],
                &m[..mad::MAD_LEN],
                "{name} frame {}: {msg:?}",
                p.index
            );
            *seen.entry(cm::attr_name(hdr.attribute_id)).or_insert(0) += 1;
        }
    }
    println!("CM MADs re-emitted exactly: {seen:?}");
    for a in [
        cm::attr::REQ,
        cm::attr::REP,
        cm::attr::RTU,
        cm::attr::DREQ,
        cm::attr::DREP,
    ] {
        assert!(
            seen.contains_key(cm::attr_name(a)),
            "no {} in the captures",
            cm::attr_name(a)
        );
    }
}

/// SIDR and the messages the captures lack: emit then parse gives the message back, and
/// values wider than their fields or private data too long are refused, not truncated.
#[test]
fn cm_messages_emit_and_parse_back() {
    use roce_xdp::wire::cm::{self, CmMessage, CmaHeader, Mra, Rej, SidrRep, SidrReq};
    use std::net::{IpAddr, Ipv4Addr};
    let hdr = CmaHeader {
        cma_version: 0,
        ip_version: 4,
        src_port: 40000,
        src: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        dst: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
    };
    let mut pd = [0u8; cm::CMA_HEADER_LEN + 4];
    hdr.emit(&mut pd).unwrap();
    pd[cm::CMA_HEADER_LEN..].copy_from_slice(b"data");
    assert_eq!(CmaHeader::parse(&pd), Some(hdr));
    let ari = [7u8; 72];
    let msgs = [
        CmMessage::SidrReq(SidrReq {
            request_id: 0x0102_0304,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_4a6b,
            private_data: &pd,
            cma: None,
        }),
        CmMessage::SidrRep(SidrRep {
            request_id: 0x0102_0304,
            status: 0,
            additional_info_len: 0,
            qpn: 0x00_0123,
            service_id: 0x0000_0000_0111_4a6b,
            qkey: 0x0111_4a6b,
            additional_info: &[0u8; 72],
            private_data: b"reply",
        }),
        CmMessage::Mra(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: 0,
            service_timeout: 20,
            private_data: &[],
        }),
        CmMessage::Rej(Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: 0,
            reject_info_len: 0,
            reason: 28,
            ari: &ari,
            private_data: b"no",
        }),
    ];
    for m in msgs {
        let mut out = [0u8; cm::MESSAGE_LEN];
        m.emit(&mut out).unwrap();
        let mut back = CmMessage::parse(m.attribute_id(), &out).unwrap();
        // Private data comes back whole (with the zeros after it); the SIDR_REQ's
        // rdma_cm header is found in it.
        match (&mut back, &m) {
            (CmMessage::SidrReq(b), CmMessage::SidrReq(o)) => {
                assert_eq!(b.cma, Some(hdr));
                assert!(b.private_data.starts_with(o.private_data));
                b.cma = None;
                b.private_data = o.private_data;
            }
            (CmMessage::SidrRep(b), CmMessage::SidrRep(o)) => {
                assert!(b.private_data.starts_with(o.private_data));
                b.private_data = o.private_data;
            }
            (CmMessage::Mra(b), CmMessage::Mra(o)) => b.private_data = o.private_data,
            (CmMessage::Rej(b), CmMessage::Rej(o)) => {
                assert!(b.private_data.starts_with(o.private_data));
                b.private_data = o.private_data;
            }
            _ => unreachable!(),
        }
        assert_eq!(back, m);
    }
    let too_long = [0u8; cm::REJ_PDATA + 1];
    let bad = [
        CmMessage::Rej(Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: 0,
            reject_info_len: 0,
            reason: 28,
            ari: &[],
            private_data: &too_long,
        }),
        CmMessage::Mra(Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: 4,
            service_timeout: 0,
            private_data: &[],
        }),
        CmMessage::Dreq {
            local_comm_id: 1,
            remote_comm_id: 2,
            remote_qpn: 1 << 24,
            private_data: &[],
        },
        CmMessage::Other(0x0019),
    ];
    for m in bad {
        let mut out = [0u8; cm::MESSAGE_LEN];
        assert!(m.emit(&mut out).is_err(), "{m:?}");
    }
    let drep = CmMessage::Drep {
        local_comm_id: 1,
        remote_comm_id: 2,
        private_data: &[],
    };
    assert!(
        drep.emit(&mut [0u8; 100]).is_err(),
        "a short buffer is refused"
    );
}

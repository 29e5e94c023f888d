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

//! `roce-xdp decode` as a user runs it.

mod common;

use common::decode::{data_s as data, decode, text};
use std::process::Output;

#[test]
fn json_is_one_object_per_frame_with_the_required_keys() {
    let o = decode(&["--json", &data("rxe-vm2vm-mtu1024.pcap")]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 736);
    let mut roce = 0;
    for (i, l) in lines.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["frame"], i + 1);
        if v["roce"] == true {
            roce += 1;
            for k in [
                "opcode",
                "opcode_name",
                "src",
                "dst",
                "sport",
                "dqpn",
                "psn",
                "ack_req",
                "pad",
                "payload_len",
                "icrc_ok",
            ] {
                assert!(v.get(k).is_some(), "frame {} lacks {k}", i + 1);
            }
            assert_eq!(v["icrc_ok"], true);
            let op = v["opcode"].as_u64().unwrap();
            if [6, 10, 12].contains(&op) {
                assert!(
                    v["reth"]["va"].is_u64()
                        && v["reth"]["rkey"].is_u64()
                        && v["reth"]["len"].is_u64()
                );
            }
            if [13, 15, 16, 17, 18].contains(&op) {
                assert_eq!(v["aeth"]["syndrome"], 0x1f);
                assert!(v["aeth"]["msn"].is_u64());
            }
            if op == 100 {
                assert!(v["deth"]["qkey"].is_u64() && v["deth"]["src_qp"].is_u64());
            }
            if op == 18 {
                assert!(v["atomic_ack_eth"]["orig"].is_u64());
            }
            if op == 19 || op == 20 {
                assert!(v["atomic_eth"]["swap_add"].is_u64());
            }
        }
    }
    assert_eq!(roce, 505);
}

#[test]
fn json_reports_the_bad_icrc() {
    let o = decode(&["--json", &data("rxe-afxdp-peer.pcap")]);
    assert!(o.status.success());
    let first: serde_json::Value =
        serde_json::from_str(text(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["icrc_ok"], false);
    assert_eq!(first["icrc"], 0x79e3_e1fcu32);
    assert_eq!(first["icrc_computed"], 0x78e3_e1fcu32);
}

#[test]
fn full_output_explains_fields_and_flags_the_bad_frame() {
    let o = decode(&[&data("rxe-afxdp-peer.pcap")]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(out.contains("ICRC      BAD (wire 0x79e3e1fc, computed 0x78e3e1fc)"));
    assert!(out.contains("CM REJ    reject of the REQ: reason 8"));
    assert!(out.contains("AckReq    = 1"));
    assert!(out.contains("the responder must acknowledge this packet"));
    assert!(out.contains("** retransmission: PSN 0xa27234"));
    assert!(out.contains("ICRC failures: 1 (frames 1)"));
    assert!(out.contains("non-RoCE frames skipped: 5 ARP, 11 TCP"));
}

#[test]
fn brief_is_one_line_per_frame_then_a_summary() {
    let o = decode(&["--brief", &data("rxe-vm2vm-mtu1024.pcap")]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    let (frames, summary) = out.split_once("Summary\n").unwrap();
    assert_eq!(frames.lines().count(), 736);
    assert!(summary.contains("frames: 736 total, 505 RoCEv2, 231 other"));
    assert!(summary.contains("ICRC: all 505 RoCEv2 frames ok"));
    assert!(summary.contains("retransmitted PSNs: none"));
    assert!(frames.contains("RC_RDMA_READ_REQUEST psn"));
}

#[test]
fn ladder_pairs_requests_with_their_responses() {
    let o = decode(&["--ladder", &data("rxe-vm2vm-mtu1024.pcap")]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    // The ib_read_bw connection: READ requests go right, READ responses come back left.
    let sec = out
        .split("=== ")
        .find(|s| s.contains("RC_RDMA_READ_REQUEST"))
        .unwrap();
    assert!(sec.contains("|--- RC_RDMA_READ_REQUEST"));
    assert!(sec.contains("|<-- RC_RDMA_READ_RESPONSE_FIRST"));
    assert!(!sec.contains("RETRANSMIT"));
    let o = decode(&["--ladder", &data("rxe-afxdp-peer.pcap")]);
    let out = text(&o.stdout);
    assert!(out.contains("RC_SEND_FIRST psn 0xa27234") && out.contains("RETRANSMIT"));
    assert!(out.contains("BAD ICRC"));
}

fn one_error_line(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("panicked"));
    err
}

#[test]
fn missing_file() {
    let e = one_error_line(&decode(&["/nonexistent/x.pcap"]));
    assert!(e.contains("cannot read /nonexistent/x.pcap"));
}

#[test]
fn not_a_pcap() {
    let e = one_error_line(&decode(&[&format!(
        "{}/Cargo.toml",
        env!("CARGO_MANIFEST_DIR")
    )]));
    assert!(e.contains("is not a pcap or pcapng file"));
}

#[test]
fn truncated_pcap_decodes_what_is_whole_then_fails() {
    let all = std::fs::read(data("rxe-vm2vm-mtu1024.pcap")).unwrap();
    let dir = std::env::temp_dir().join(format!("roce-xdp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("cut.pcap");
    std::fs::write(&p, &all[..20_000]).unwrap();
    let o = decode(&["--json", p.to_str().unwrap()]);
    let e = one_error_line(&o);
    assert!(e.contains("truncated or corrupt after frame"));
    let n = text(&o.stdout).lines().count();
    assert!(n > 10, "{n} frames before the cut");
    // Only the global header: no frames, still not a crash.
    std::fs::write(&p, &all[..24]).unwrap();
    let o = decode(&[p.to_str().unwrap()]);
    assert!(o.status.success());
    std::fs::write(&p, &all[..10]).unwrap();
    one_error_line(&decode(&[p.to_str().unwrap()]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_passes_a_clean_capture_and_names_the_bad_frame_and_the_stall() {
    let o = decode(&["--check", &data("rxe-vm2vm-mtu1024.pcap")]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    assert!(out.contains("0 failing a check"), "{out}");
    assert!(out.contains("every frame passes"), "{out}");

    // The AF_XDP-peer capture: frame 1's ICRC was corrupted on purpose, and rxe sent
    // RC SENDs again and again to a QP that never answered.
    let o = decode(&["--check", &data("rxe-afxdp-peer.pcap")]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(out.contains("1 failing a check"), "{out}");
    assert!(out.contains("first bad frame: 1 (bad ICRC"), "{out}");
    assert!(out.contains("unanswered: frame"), "{out}");
    assert!(!out.contains("every frame passes"), "{out}");
}

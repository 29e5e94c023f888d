// Shared by tests/wire_props.rs and fuzz/fuzz_targets/wire_parse.rs (included, since
// they are different crates): exercises every accessor of a parsed frame, its owned
// representation, re-emission and the CM decoder. Must not panic whatever it holds.
fn touch(f: &Frame<'_>) {
    let _ = f.verify();
    let _ = f.verify_ip_checksum();
    let _ = f.verify_udp_checksum();
    let _ = f.computed_icrc();
    let r = f.roce();
    let _ = (r.payload(), r.pad_bytes(), r.icrc(), r.payload_len());
    let b = r.bth();
    let _ = (b.opcode(), b.psn(), b.dest_qp(), b.pkey(), b.ack_req());
    let _ = (r.reth().map(|h| h.va()), r.aeth().map(|h| h.syndrome()));
    let _ = (
        r.deth().map(|h| h.qkey()),
        r.atomic_eth().map(|h| h.compare()),
    );
    let _ = (r.atomic_ack_eth().map(|h| h.orig()), r.immdt(), r.ieth());
    if let Ok(x) = FrameRepr::parse(f) {
        let mut buf = [0u8; 9216];
        let _ = x.emit(&mut buf);
    }
    let _ = roce_xdp::decode::short_label(f);
    let _ = cm::CmMessage::from_mad(r.payload());
}

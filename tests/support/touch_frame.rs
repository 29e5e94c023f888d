// Shared by tests/wire_props.rs and fuzz/fuzz_targets/wire_parse.rs (included, since
// they are different crates): exercises every accessor of a parsed frame, its owned
// representation, re-emission, the CM decoder and decode's field views. Must not panic
// whatever it holds.
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
    // decode's views of it: every byte of the frame belongs to a field, and each field
    // lies inside the frame (the bytes --hex and --html mark).
    let fields = roce_xdp::decode::fields::fields(f);
    let len = f.bytes().len();
    let mut covered = vec![false; len];
    for x in &fields {
        assert!(x.start + x.len <= len, "{x:?} past the frame's {len} bytes");
        covered[x.start..x.start + x.len].fill(true);
    }
    assert!(covered.iter().all(|c| *c), "a byte of the frame is in no field: {fields:?}");
    let mut out = String::new();
    roce_xdp::decode::fields::hex_view(&mut out, f);
    roce_xdp::decode::explain::lower_layers(&mut out, f);
    roce_xdp::decode::explain::roce_layers(&mut out, f);
}

// A frame parsed in two pieces (`Frame::parse_parts`): the accessors the engine uses on
// it, and those of its header view, which must stay in bounds though they see the first
// piece only. Must not panic whatever it holds.
fn touch_chained(f: &Frame<'_>) {
    let _ = f.verify();
    let _ = f.computed_icrc();
    let _ = (f.icrc(), f.payload_len(), f.roce_len(), f.is_chained());
    let p = f.payload();
    assert_eq!(p.len(), f.payload_len());
    let mut joined = vec![0u8; p.len()];
    p.copy_to(&mut joined);
    let _ = p.contiguous();
    let r = f.roce();
    let _ = (r.payload(), r.pad_bytes(), r.icrc(), r.payload_len());
    let b = r.bth();
    let _ = (b.opcode(), b.psn(), b.dest_qp(), b.pkey(), b.ack_req());
    let _ = (r.reth().map(|h| h.va()), r.aeth().map(|h| h.syndrome()));
    let _ = (r.deth().map(|h| h.qkey()), r.immdt(), r.ieth());
}

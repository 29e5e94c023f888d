//! Any bytes, as an Ethernet frame (whole and in two pieces) and as an IP packet: parsing, every accessor,
//! verification, the owned representation and the one-line label never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_xdp::wire::*;

include!("../../tests/support/touch_frame.rs");

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::parse(data) {
        touch(&f);
    }
    if let Ok(f) = Frame::parse_ip(data) {
        touch(&f);
    }
    // The same bytes as a frame chained over two buffers, cut where the first byte says.
    if let Some(&b) = data.first() {
        let at = (usize::from(b) * 16).min(data.len());
        if let Ok(f) = Frame::parse_parts(&data[..at], &data[at..]) {
            touch_chained(&f);
        }
    }
    let _ = cm::CmMessage::from_mad(data);
});

//! Any bytes, as an Ethernet frame and as an IP packet: parsing, every accessor,
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
    let _ = cm::CmMessage::from_mad(data);
});

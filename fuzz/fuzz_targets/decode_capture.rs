//! Any bytes as a capture file (pcap or pcapng): every view of `roce-xdp decode` and its
//! HTML page never panic, whatever the file holds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_xdp::capture::Capture;
use roce_xdp::decode::{Mode, html, run_capture};

fuzz_target!(|data: &[u8]| {
    let cap = Capture::from_bytes("fuzz", data.to_vec());
    for mode in [Mode::Full, Mode::Hex, Mode::Brief, Mode::Ladder, Mode::Json, Mode::Check] {
        let _ = run_capture(&cap, mode, None, &mut std::io::sink());
    }
    let _ = run_capture(&cap, Mode::Ladder, Some((2, 5)), &mut std::io::sink());
    let _ = html::page(&cap, "fuzz");
});

//! roce-xdp: a software RoCEv2 NIC.
//!
//! - [`wire`]: the RoCEv2 wire format (views, representations, ICRC, opcode table).
//! - [`capture`]: reading pcap and pcapng files.

pub mod capture;
pub mod wire;

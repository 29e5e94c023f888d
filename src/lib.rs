//! roce-xdp: a software RoCEv2 NIC.
//!
//! - [`wire`]: the RoCEv2 wire format (views, representations, ICRC, opcode table).
//! - [`decode`]: `roce-xdp decode`, which explains captured traffic field by field.

pub mod apps;
pub mod cabi;
pub mod capture;
pub mod decode;
pub mod engine;
pub mod host;
pub mod link;
pub mod links;
pub mod netns;
pub mod rng;
pub mod runtime;
pub mod time;
pub mod verbs;
pub mod wire;

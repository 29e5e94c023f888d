//! Shared by the `decode` tests: the golden captures, the command, and a frame builder.

use roce_xdp::wire::aeth::Syndrome;
use roce_xdp::wire::ip::Ipv4Repr;
use roce_xdp::wire::{
    AethRepr, BthRepr, EthRepr, ExtRepr, FrameRepr, IpRepr, Opcode, Psn, ROCE_V2_PORT, RoceRepr,
    UdpRepr,
};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A file of `tests/data`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The same, as a command-line argument.
pub fn data_s(name: &str) -> String {
    data(name).display().to_string()
}

/// `roce-xdp decode ARGS`.
pub fn decode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roce-xdp"))
        .arg("decode")
        .args(args)
        .output()
        .unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// An RC frame from `src` to `dst`'s QP `dqp` with PSN `psn`: a SEND_ONLY carrying
/// `payload` (AckReq set), or an ACK with MSN `msn`.
pub fn rc_frame(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    dqp: u32,
    psn: u32,
    ack: Option<u32>,
    payload: &[u8],
) -> Vec<u8> {
    let (op, aeth, payload) = match ack {
        Some(msn) => (
            Opcode(0x11),
            Some(AethRepr {
                syndrome: Syndrome::ACK,
                msn,
            }),
            &[][..],
        ),
        None => (Opcode(0x04), None, payload),
    };
    let repr = FrameRepr {
        eth: EthRepr {
            dst: [2, 0, 0, 0, 0, 2],
            src: [2, 0, 0, 0, 0, 1],
            vlan: None,
            ethertype: 0x0800,
        },
        ip: IpRepr::V4(Ipv4Repr::new(src, dst, 0)),
        udp: UdpRepr {
            src_port: 49152,
            dst_port: ROCE_V2_PORT,
        },
        roce: RoceRepr {
            bth: BthRepr {
                ack_req: ack.is_none(),
                ..BthRepr::new(op, dqp, Psn::new(psn))
            },
            ext: ExtRepr {
                aeth,
                ..ExtRepr::default()
            },
            payload,
        },
    };
    let mut buf = vec![0u8; repr.buffer_len().unwrap()];
    let n = repr.emit(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

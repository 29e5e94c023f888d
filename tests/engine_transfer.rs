//! Byte-exact transfers of 64 MiB of mixed operations between two engines over a lossy,
//! reordering, duplicating and corrupting simulated link, with PSNs that cross 2^24.

mod common;
use common::transfer::{transfer, transfer_opts};
use roce_xdp::verbs::Mtu;

const TOTAL: u64 = 64 << 20;

#[test]
fn mtu1024_clean() {
    let st = transfer(Mtu::Mtu1024, 0.0, TOTAL, 1);
    assert!(st.bytes >= TOTAL);
    assert_eq!(st.retransmitted, 0);
}

#[test]
fn mtu1024_1pct() {
    let st = transfer(Mtu::Mtu1024, 0.01, TOTAL, 2);
    assert!(st.retransmitted > 0 && st.wrs > 50);
}

#[test]
fn mtu1024_10pct() {
    let st = transfer(Mtu::Mtu1024, 0.10, TOTAL, 3);
    assert!(st.retransmitted > 0);
}

/// `ROCE_SEEDS=N cargo test --release --test engine_transfer many_seeds -- --ignored`
/// runs N more seeds of each lossy case (a soak; bounded by N).
#[test]
#[ignore]
fn many_seeds() {
    let n: u64 = std::env::var("ROCE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    for seed in 100..100 + n {
        for (mtu, loss) in [
            (Mtu::Mtu1024, 0.1),
            (Mtu::Mtu4096, 0.1),
            (Mtu::Mtu1024, 0.01),
        ] {
            let st = transfer(mtu, loss, 16 << 20, seed);
            println!(
                "seed {seed} {mtu:?} {loss}: {} WRs, {} retransmitted",
                st.wrs, st.retransmitted
            );
        }
    }
}

#[test]
fn mtu4096_clean() {
    transfer(Mtu::Mtu4096, 0.0, TOTAL, 4);
}

#[test]
fn mtu4096_1pct() {
    transfer(Mtu::Mtu4096, 0.01, TOTAL, 5);
}

#[test]
fn mtu4096_10pct() {
    transfer(Mtu::Mtu4096, 0.10, TOTAL, 6);
}

/// Frames delivered in two pieces, as AF_XDP chains a frame larger than one UMEM buffer:
/// cut where a 4096-byte and a 2048-byte buffer end (3840 and 1792 bytes of frame), and
/// at an odd place inside IB MTU 1024 payloads. WRITE, READ response and SEND payloads
/// are placed from both pieces; every byte is checked, lossless and at 1% loss.
#[test]
fn chained_frames() {
    for (mtu, loss, cut, seed) in [
        (Mtu::Mtu4096, 0.0, 3840, 7),
        (Mtu::Mtu4096, 0.01, 1792, 8),
        (Mtu::Mtu1024, 0.0, 1001, 9),
    ] {
        let st = transfer_opts(mtu, loss, 16 << 20, seed, 1 << 20, cut);
        assert!(
            st.chained > 1000,
            "{mtu:?} cut {cut}: {} chained",
            st.chained
        );
    }
}

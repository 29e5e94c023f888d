//! Wire-layer cost next to the bare CRC it cannot avoid.
//!
//! For 64, 1024 and 4096 bytes of payload: `parse_verify` (Frame::parse + verify: IPv4
//! checksum, UDP checksum, ICRC) and `build_icrc` (FrameRepr::emit_with with the payload
//! copied in, ICRC computed), each beside `crc32fast::hash` over as many bytes as the
//! frame has. After the criterion runs, a table prints each one's ratio to the bare CRC,
//! from the same run. Targets: parse+verify <= 1.3x, build <= 1.5x.

use criterion::{BenchmarkId, Criterion, Throughput};
use roce_xdp::wire::*;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Per-iteration times of every sample, by (group, size).
static SAMPLES: Mutex<BTreeMap<(String, usize), Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(group: &str, size: usize, d: Duration, iters: u64) {
    let per = d.as_nanos() as f64 / iters.max(1) as f64;
    SAMPLES
        .lock()
        .unwrap()
        .entry((group.to_string(), size))
        .or_default()
        .push(per);
}

fn frame(payload: &[u8]) -> FrameRepr<'_> {
    FrameRepr {
        eth: EthRepr {
            dst: [2, 0, 0, 0, 0, 1],
            src: [2, 0, 0, 0, 0, 2],
            vlan: None,
            ethertype: 0x0800,
        },
        ip: IpRepr::V4(Ipv4Repr::new(
            "198.18.0.2".parse().unwrap(),
            "198.18.0.1".parse().unwrap(),
            1,
        )),
        udp: UdpRepr {
            src_port: 0xc000,
            dst_port: ROCE_V2_PORT,
        },
        roce: RoceRepr {
            bth: BthRepr {
                ack_req: true,
                ..BthRepr::new(Opcode::RC_RDMA_WRITE_ONLY, 0x11, Psn::new(7))
            },
            ext: ExtRepr {
                reth: Some(RethRepr {
                    va: 0x1000,
                    rkey: 0x1234,
                    dma_len: payload.len() as u32,
                }),
                ..ExtRepr::default()
            },
            payload,
        },
    }
}

fn benches(c: &mut Criterion) {
    for size in [64usize, 1024, 4096] {
        let payload = vec![0x5au8; size];
        let repr = frame(&payload);
        let mut buf = vec![0u8; 9000];
        let n = repr.emit(&mut buf).unwrap();
        let wire = buf[..n].to_vec();

        let mut g = c.benchmark_group("wire");
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_with_input(BenchmarkId::new("crc32fast_bare", size), &wire, |b, w| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    black_box(crc32fast::hash(black_box(w)));
                }
                let d = t.elapsed();
                record("crc32fast_bare", size, d, iters);
                d
            })
        });
        g.bench_with_input(BenchmarkId::new("parse_verify", size), &wire, |b, w| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for _ in 0..iters {
                    let f = Frame::parse(black_box(w)).unwrap();
                    black_box(f.verify().is_ok());
                }
                let d = t.elapsed();
                record("parse_verify", size, d, iters);
                d
            })
        });
        // As a QP sends: its Ethernet/IP/UDP headers prepared once, then per packet the
        // BTH and RETH, the payload copy, lengths, IPv4 ID and checksum, and the ICRC.
        let tpl = FrameTemplate::new(&repr.eth, &repr.ip, &repr.udp).unwrap();
        g.bench_with_input(BenchmarkId::new("build_icrc", size), &repr, |b, r| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                for i in 0..iters {
                    let n = tpl
                        .emit(black_box(&mut buf), i as u16, &r.roce, size, |d| {
                            d.copy_from_slice(&payload)
                        })
                        .unwrap();
                    black_box(n);
                }
                let d = t.elapsed();
                record("build_icrc", size, d, iters);
                d
            })
        });
        g.finish();
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Ratios measured side by side: rounds that time a batch of each of the three in turn,
/// so that a change of machine speed during the run hits all three alike; the median of
/// the per-round ratios is printed.
fn interleaved(size: usize) -> (f64, f64, f64) {
    let payload = vec![0x5au8; size];
    let repr = frame(&payload);
    let tpl = FrameTemplate::new(&repr.eth, &repr.ip, &repr.udp).unwrap();
    let mut buf = vec![0u8; 9000];
    let n = repr.emit(&mut buf).unwrap();
    let wire = buf[..n].to_vec();
    let batch = 20_000;
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        t.elapsed().as_nanos() as f64 / batch as f64
    };
    let (mut bare, mut rp, mut rb) = (vec![], vec![], vec![]);
    for round in 0..60u16 {
        let b = time(&mut || {
            black_box(crc32fast::hash(black_box(&wire)));
        });
        let p = time(&mut || {
            let f = Frame::parse(black_box(&wire)).unwrap();
            black_box(f.verify().is_ok());
        });
        let w = time(&mut || {
            let n = tpl
                .emit(black_box(&mut buf), round, &repr.roce, size, |d| {
                    d.copy_from_slice(&payload)
                })
                .unwrap();
            black_box(n);
        });
        bare.push(b);
        rp.push(p / b);
        rb.push(w / b);
    }
    (median(&bare), median(&rp), median(&rb))
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    // Only a real benchmark run (`cargo bench`) has samples worth a ratio.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let s = SAMPLES.lock().unwrap();
    println!("\nratios to crc32fast::hash over the same number of bytes");
    println!(
        "(a) from the criterion samples above (medians); (b) interleaved rounds, median of per-round ratios"
    );
    println!(
        "{:>8} {:>12} {:>14} {:>8} {:>14} {:>8} | {:>12} {:>10} {:>10}",
        "payload",
        "bare CRC ns",
        "parse+verify",
        "(a)",
        "build+ICRC",
        "(a)",
        "bare CRC ns",
        "parse (b)",
        "build (b)"
    );
    for size in [64usize, 1024, 4096] {
        let get = |g: &str| s.get(&(g.to_string(), size)).map(|v| median(v));
        if let (Some(bare), Some(p), Some(b)) = (
            get("crc32fast_bare"),
            get("parse_verify"),
            get("build_icrc"),
        ) {
            let (ib, ip, iw) = interleaved(size);
            println!(
                "{size:>8} {bare:>12.1} {p:>11.1} ns {:>7.2}x {b:>11.1} ns {:>7.2}x | {ib:>12.1} {ip:>9.2}x {iw:>9.2}x",
                p / bare,
                b / bare
            );
        }
    }
}

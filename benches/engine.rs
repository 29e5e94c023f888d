//! Per-packet cost of the transport core: requester, responder and completer of two
//! engines joined by the simulated link (no loss), for 1 KiB RDMA WRITE packets,
//! 64-byte SENDs and 64-byte READs (a request and its response each), and for 1000
//! WRITEs of 4 KiB over one QP against one each over 1000 QPs. Reported as packets per
//! second per core: every request, response and ACK is built, parsed, verified (ICRC)
//! and processed once, on one thread.

use criterion::{BenchmarkId, Criterion, Throughput};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::Instant;

static RESULTS: Mutex<BTreeMap<String, (u64, f64)>> = Mutex::new(BTreeMap::new());

include!("support/engine_world.rs");

/// A case: its name and a closure that moves one round of work and returns the packets
/// it took.
type Case = (&'static str, Box<dyn FnMut() -> u64>);

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = Vec::new();
    for (name, msgs, len, kind) in [
        ("write_1k_packets", 64usize, 64 * 1024usize, Kind::Write),
        ("send_64b", 4096, 64, Kind::Send),
        ("read_64b", 4096, 64, Kind::Read),
    ] {
        let mut w = world();
        v.push((name, Box::new(move || run(&mut w, msgs, len, kind))));
    }
    // Many QPs: one 4 KiB WRITE on each of 1000 QPs, against the same WRITEs on one QP
    // (`bench qps` on the wire; here without the runtime, so what is left is the
    // engine's own cost of spreading the work over QPs: their state out of cache).
    for (name, n) in [("write_4k_1qp", 1usize), ("write_4k_1000qps", 1000)] {
        let mut w = world_n(n);
        v.push((name, Box::new(move || run_spread(&mut w, 1000, 4096))));
    }
    v
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    for (name, once) in cases() {
        packets(&mut g, name, once);
    }
    g.finish();
}

/// Benchmarks `once` (which moves some work and returns the packets it took) under
/// `name`, in packets per second, adding its packets and time to `RESULTS`. Run once
/// first, untimed, for the throughput's unit.
fn packets(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut once: impl FnMut() -> u64,
) {
    let pkts_per_iter = once();
    g.throughput(Throughput::Elements(pkts_per_iter));
    g.bench_function(BenchmarkId::new(name, pkts_per_iter), |b| {
        b.iter_custom(|iters| {
            let t = Instant::now();
            let mut pkts = 0;
            for _ in 0..iters {
                pkts += once();
            }
            let d = t.elapsed();
            let mut r = RESULTS.lock().unwrap();
            let e = r.entry(name.to_string()).or_insert((0, 0.0));
            e.0 += pkts;
            e.1 += d.as_secs_f64();
            black_box(pkts);
            d
        })
    });
}

/// `ENGINE_BENCH_ROUNDS=case:n` runs `n` rounds of one case and nothing else, no
/// criterion: a fixed amount of work, so that callgrind's instruction counts divide by
/// the printed packet count (`valgrind --tool=callgrind
/// --toggle-collect='engine::cases::{{closure}}'`).
fn fixed_rounds(spec: &str) {
    let (want, n) = spec
        .split_once(':')
        .expect("ENGINE_BENCH_ROUNDS=case:rounds");
    let n: u64 = n.parse().expect("rounds: a number");
    let (name, mut once) = cases()
        .into_iter()
        .find(|(name, _)| *name == want)
        .expect("ENGINE_BENCH_ROUNDS: no such case");
    let pkts: u64 = (0..n).map(|_| once()).sum();
    println!("{name}: {n} rounds, {pkts} packets");
}

fn main() {
    if let Ok(spec) = std::env::var("ENGINE_BENCH_ROUNDS") {
        return fixed_rounds(&spec);
    }
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!("\npackets per second on one core (both engines and the link on this thread;");
    println!("a packet is a request or an ACK, each built, parsed, ICRC-checked and handled):");
    for (name, (pkts, secs)) in RESULTS.lock().unwrap().iter() {
        println!(
            "  {name:<18} {:>6.2} Mpps  ({pkts} packets in {secs:.2} s)",
            *pkts as f64 / secs / 1e6
        );
    }
}

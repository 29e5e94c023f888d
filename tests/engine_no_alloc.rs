//! The engine allocates nothing per packet once warm: 1 KiB WRITE packets, 64-byte SENDs
//! and WRITE_WITH_IMMs (each consuming a receive) through two engines and the simulated
//! link, under a counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

include!("../benches/support/engine_world.rs");

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Bytes this thread allocated less those it freed while counting.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// Adds `d` to this thread's live bytes.
fn live(d: isize) {
    LIVE.with(|c| c.set(c.get() + d));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            live(l.size() as isize);
        }
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if ON.with(|c| c.get()) {
            live(-(l.size() as isize));
        }
        // SAFETY: `p` came from `System.alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            live(n as isize - l.size() as isize);
        }
        // SAFETY: forwarding to the system allocator that allocated `p`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn steady_state_allocates_nothing_per_packet() {
    let mut w = world();
    // Warm up: queues, pools and the timer heap reach their working size.
    for _ in 0..3 {
        run(&mut w, 64, 65536, Kind::Write);
        run(&mut w, 1024, 64, Kind::Send);
        run(&mut w, 1024, 256, Kind::WriteImm);
        run(&mut w, 1024, 64, Kind::Read);
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    ON.with(|c| c.set(true));
    let mut pkts = 0;
    for _ in 0..5 {
        pkts += run(&mut w, 64, 65536, Kind::Write);
        pkts += run(&mut w, 1024, 64, Kind::Send);
        pkts += run(&mut w, 1024, 256, Kind::WriteImm);
        pkts += run(&mut w, 1024, 64, Kind::Read);
    }
    ON.with(|c| c.set(false));
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(pkts > 20_000, "{pkts}");
    assert_eq!(n, 0, "{n} allocations for {pkts} packets");
}

/// Issue 11: engine state per idle QP <= 4 KiB. A thousand RC QPs brought to RTS in a
/// bare engine (16-deep queues, 16 READ/atomic resources each way) hold this much heap
/// between them, counted by the allocator; `bench qps` prints the resident figure.
#[test]
fn an_idle_rc_qp_in_rts_holds_at_most_4_kib_of_engine_state() {
    let (me, peer) = (
        std::net::Ipv4Addr::new(198, 18, 0, 1),
        std::net::Ipv4Addr::new(198, 18, 0, 2),
    );
    let mut e = Engine::new(DeviceConfig::new([2, 0, 0, 0, 0, 1], me));
    e.set_neighbor(IpAddr::V4(peer), [2, 0, 0, 0, 0, 2]);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(64).unwrap();
    roce_xdp::apps::bench::qps::idle_engine_qps(&mut e, pd, cq, peer, 1).unwrap();
    let n = 1000;
    let before = LIVE.with(Cell::get);
    ON.with(|c| c.set(true));
    let qpns = roce_xdp::apps::bench::qps::idle_engine_qps(&mut e, pd, cq, peer, n);
    ON.with(|c| c.set(false));
    let held = LIVE.with(Cell::get) - before;
    let qpns = qpns.unwrap();
    // The list of QP numbers is the caller's, not the engine's.
    let per_qp = (held - qpns.capacity() as isize * 4) as f64 / n as f64;
    println!("engine state per idle RC QP: {per_qp:.0} bytes");
    assert!(per_qp > 0.0 && per_qp <= 4096.0, "{per_qp} bytes per QP");
}

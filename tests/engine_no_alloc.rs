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
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarding the caller's layout to the system allocator.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with this layout.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.with(|c| c.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
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
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    ON.with(|c| c.set(true));
    let mut pkts = 0;
    for _ in 0..5 {
        pkts += run(&mut w, 64, 65536, Kind::Write);
        pkts += run(&mut w, 1024, 64, Kind::Send);
        pkts += run(&mut w, 1024, 256, Kind::WriteImm);
    }
    ON.with(|c| c.set(false));
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(pkts > 20_000, "{pkts}");
    assert_eq!(n, 0, "{n} allocations for {pkts} packets");
}

//! Parsing, verifying and building frames allocate nothing on the heap.
//!
//! A counting global allocator counts allocations made by this test's thread while the
//! flag is up; the per-packet work must leave the count at zero.

use roce_xdp::wire::aeth::Syndrome;
use roce_xdp::wire::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

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
}

#[global_allocator]
static A: Counting = Counting;

fn counted<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCS.load(Ordering::Relaxed);
    ON.with(|c| c.set(true));
    let r = f();
    ON.with(|c| c.set(false));
    (r, ALLOCS.load(Ordering::Relaxed) - before)
}

#[test]
fn per_frame_work_does_not_allocate() {
    let payload = vec![0xabu8; 4096];
    let mut buf = vec![0u8; 9000];
    let ips = [
        IpRepr::V4(Ipv4Repr::new(
            "198.18.0.1".parse().unwrap(),
            "198.18.0.2".parse().unwrap(),
            7,
        )),
        IpRepr::V6(Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }),
    ];
    // The counter must work: a Vec allocation is seen.
    let (_, n) = counted(|| vec![1u8; 10]);
    assert_eq!(n, 1);

    let mut total = 0;
    for ip in &ips {
        for info in Opcode::all() {
            let len = if info.payload { 1021 } else { 0 };
            let repr = FrameRepr {
                eth: EthRepr::default(),
                ip: ip.clone(),
                udp: UdpRepr {
                    src_port: 0xc001,
                    dst_port: ROCE_V2_PORT,
                },
                roce: RoceRepr {
                    bth: BthRepr {
                        ack_req: true,
                        ..BthRepr::new(Opcode(info.code), 17, Psn::new(1))
                    },
                    ext: ExtRepr {
                        deth: info.has(HeaderKind::Deth).then_some(DethRepr::default()),
                        reth: info.has(HeaderKind::Reth).then_some(RethRepr::default()),
                        atomic_eth: info
                            .has(HeaderKind::AtomicEth)
                            .then_some(AtomicEthRepr::default()),
                        aeth: info.has(HeaderKind::Aeth).then_some(AethRepr {
                            syndrome: Syndrome::ACK,
                            msn: 0,
                        }),
                        atomic_ack_eth: info
                            .has(HeaderKind::AtomicAckEth)
                            .then_some(AtomicAckEthRepr::default()),
                        immdt: info.has(HeaderKind::ImmDt).then_some(ImmDtRepr::default()),
                        ieth: info.has(HeaderKind::Ieth).then_some(IethRepr::default()),
                    },
                    payload: &payload[..len],
                },
            };
            let (ok, n) = counted(|| {
                let mut ok = true;
                for _ in 0..100 {
                    let n = repr
                        .emit_with(&mut buf, len, |d| d.copy_from_slice(&payload[..len]))
                        .unwrap();
                    let f = Frame::parse(&buf[..n]).unwrap();
                    ok &= f.verify().is_ok();
                    ok &= f.roce().payload().len() == len;
                    ok &= FrameRepr::parse(&f).is_ok();
                }
                ok
            });
            assert!(ok, "{}", info.name);
            assert_eq!(n, 0, "{} allocated {n} times in 100 frames", info.name);
            total += 100;
        }
    }
    assert_eq!(total, 2 * 38 * 100);
}

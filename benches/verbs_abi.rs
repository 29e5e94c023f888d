//! What the C door costs: `ibv_post_send` + `ibv_poll_cq` through the C ABI (the
//! function pointers of `ibv_context.ops`, as the verbs.h inlines call them) next to
//! `Qp::post_send` + `Cq::poll` of the Rust API, on the same device, the same engine and
//! the same work: RDMA WRITEs of 8 bytes between two QPs of the device (looped back by
//! the engine), 32 in flight, every one signaled and polled.
//!
//! The time measured is the time spent inside the calls: every `post_send`, and every
//! poll that returned completions (polls of an empty CQ while the engine works are left
//! out: how many there are depends on the engine's speed, not on the door). So the
//! difference between the doors is the C door's own cost (converting `ibv_send_wr` and
//! `ibv_wc`, the panic guard, the function pointers). The engine busy-polls on the other
//! core, so neither side's polling sleeps or yields. Needs root (a namespace and
//! AF_XDP); prints SKIPPED otherwise.
//!
//!   cargo bench --bench verbs_abi

use criterion::{BenchmarkId, Criterion, Throughput};
use roce_xdp::cabi::sys::*;
use roce_xdp::runtime::{Cq, Device, Qp};
use roce_xdp::verbs::{
    AccessFlags, AddressVector, Memory, Mtu, QpAttr, QpAttrMask as M, QpInitAttr, QpState, QpType,
    SendWr, Sge, Wc,
};
use std::collections::BTreeMap;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_get_device_name(d: *mut ibv_device) -> *const std::ffi::c_char;
    fn ibv_open_device(d: *mut ibv_device) -> *mut ibv_context;
    fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_create_cq(
        c: *mut ibv_context,
        cqe: c_int,
        ctx: *mut c_void,
        ch: *mut ibv_comp_channel,
        vec: c_int,
    ) -> *mut ibv_cq;
    fn ibv_create_qp(pd: *mut ibv_pd, a: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_modify_qp(qp: *mut ibv_qp, a: *mut ibv_qp_attr, mask: c_int) -> c_int;
    fn ibv_query_gid(c: *mut ibv_context, port: u8, idx: c_int, gid: *mut ibv_gid) -> c_int;
}

const IN_FLIGHT: usize = 32;
const PER_ITER: usize = 4096;
/// Rounds of both doors, one after the other.
const ROUNDS: usize = 9;

/// ns inside the calls per WR, one sample per run of `PER_ITER` WRs, per door.
static RESULTS: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// The C side: a context, two connected QPs, one CQ, a region.
struct CSide {
    ctx: *mut ibv_context,
    a: *mut ibv_qp,
    cq: *mut ibv_cq,
    mr: *mut ibv_mr,
    buf: Vec<u8>,
}

unsafe fn c_connect(qp: *mut ibv_qp, remote: u32, gid: ibv_gid) {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        port_num: 1,
        qp_access_flags: IBV_ACCESS_REMOTE_WRITE,
        ..Default::default()
    };
    let init = (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) as c_int;
    // SAFETY: our QP and attributes.
    assert_eq!(unsafe { ibv_modify_qp(qp, &mut a, init) }, 0);
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_1024,
        dest_qp_num: remote,
        rq_psn: 1,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ibv_ah_attr {
            is_global: 1,
            port_num: 1,
            grh: ibv_global_route {
                dgid: gid,
                sgid_index: 1,
                hop_limit: 64,
                ..Default::default()
            },
            ..Default::default()
        },
        ..Default::default()
    };
    let rtr = (IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER) as c_int;
    // SAFETY: as above.
    assert_eq!(unsafe { ibv_modify_qp(qp, &mut a, rtr) }, 0);
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 1,
        max_rd_atomic: 1,
        ..Default::default()
    };
    let rts = (IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC) as c_int;
    // SAFETY: as above.
    assert_eq!(unsafe { ibv_modify_qp(qp, &mut a, rts) }, 0);
}

fn c_side() -> CSide {
    // SAFETY: the C ABI used as a C program would use it, every result checked.
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        let dev = (0..n as usize)
            .map(|i| *list.add(i))
            .find(|d| CStr::from_ptr(ibv_get_device_name(*d)).to_bytes() == b"rxdp_veth0")
            .expect("rxdp_veth0 listed");
        let ctx = ibv_open_device(dev);
        assert!(!ctx.is_null(), "ibv_open_device");
        let pd = ibv_alloc_pd(ctx);
        let mut buf = vec![0u8; 8192];
        let acc = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        let mr = ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), acc);
        let cq = ibv_create_cq(ctx, 256, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mut ia = ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            qp_type: IBV_QPT_RC,
            cap: ibv_qp_cap {
                max_send_wr: 64,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..Default::default()
        };
        let a = ibv_create_qp(pd, &mut ia);
        let b = ibv_create_qp(pd, &mut ia);
        let mut gid = ibv_gid::default();
        assert_eq!(ibv_query_gid(ctx, 1, 1, &mut gid), 0);
        c_connect(a, (*b).qp_num, gid);
        c_connect(b, (*a).qp_num, gid);
        CSide {
            ctx,
            a,
            cq,
            mr,
            buf,
        }
    }
}

/// `n` WRITEs through the C door, `IN_FLIGHT` at a time; the time spent in the calls.
fn c_run(s: &mut CSide, n: usize) -> Duration {
    let mut inside = Duration::ZERO;
    // SAFETY: our live objects; the ops are the library's, called as the inlines do.
    unsafe {
        let post = (*s.ctx).ops.post_send.expect("post_send");
        let poll = (*s.ctx).ops.poll_cq.expect("poll_cq");
        let (lkey, rkey) = ((*s.mr).lkey, (*s.mr).rkey);
        let base = s.buf.as_mut_ptr() as u64;
        let mut sge = ibv_sge {
            addr: base,
            length: 8,
            lkey,
        };
        let mut wc = [ibv_wc::default(); 16];
        let (mut posted, mut done, mut out) = (0usize, 0usize, 0usize);
        while done < n {
            while out < IN_FLIGHT && posted < n {
                let mut wr = ibv_send_wr {
                    wr_id: posted as u64,
                    sg_list: &mut sge,
                    num_sge: 1,
                    opcode: IBV_WR_RDMA_WRITE,
                    send_flags: IBV_SEND_SIGNALED,
                    ..Default::default()
                };
                wr.wr.rdma.remote_addr = base + 4096;
                wr.wr.rdma.rkey = rkey;
                let mut bad = std::ptr::null_mut();
                let t = Instant::now();
                let r = post(s.a, &mut wr, &mut bad);
                inside += t.elapsed();
                assert_eq!(r, 0);
                posted += 1;
                out += 1;
            }
            let t = Instant::now();
            let k = poll(s.cq, wc.len() as c_int, wc.as_mut_ptr());
            if k > 0 {
                inside += t.elapsed();
            }
            for w in &wc[..k as usize] {
                assert_eq!(w.status, IBV_WC_SUCCESS);
            }
            done += k as usize;
            out -= k as usize;
        }
    }
    inside
}

/// The Rust side on the same device: two connected QPs, one CQ, a region.
struct RustSide {
    a: Qp,
    cq: Cq,
    lkey: u32,
    rkey: u32,
    base: u64,
    _mem: Arc<Memory>,
}

fn rust_side(dev: &Device) -> RustSide {
    let pd = dev.alloc_pd().unwrap();
    let mem = Memory::new(8192);
    let mr = dev
        .reg_mr(
            pd,
            &mem,
            0,
            8192,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let cq = dev.create_cq(256).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, pd, cq.id);
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = 1;
    let a = dev.create_qp(&init).unwrap();
    let b = dev.create_qp(&init).unwrap();
    let gid = dev.gid(1).unwrap();
    for (q, r) in [(&a, b.qpn), (&b, a.qpn)] {
        let mut x = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        dev.modify_qp(q, &x, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .unwrap();
        x.qp_state = QpState::Rtr;
        x.path_mtu = Mtu::Mtu1024;
        x.dest_qp_num = r;
        x.rq_psn = 1;
        x.max_dest_rd_atomic = 1;
        x.min_rnr_timer = 12;
        x.ah_attr = AddressVector::new(gid, 1);
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        dev.modify_qp(q, &x, rtr).unwrap();
        x.qp_state = QpState::Rts;
        x.timeout = 14;
        x.retry_cnt = 7;
        x.rnr_retry = 7;
        x.sq_psn = 1;
        x.max_rd_atomic = 1;
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        dev.modify_qp(q, &x, rts).unwrap();
    }
    RustSide {
        a,
        cq,
        lkey: mr.lkey,
        rkey: mr.rkey,
        base: mr.addr,
        _mem: mem,
    }
}

/// `n` WRITEs through the Rust API, `IN_FLIGHT` at a time; the time spent in the calls.
fn rust_run(s: &RustSide, n: usize) -> Duration {
    let mut inside = Duration::ZERO;
    let sge = Sge {
        addr: s.base,
        length: 8,
        lkey: s.lkey,
    };
    let mut wc = [Wc::default(); 16];
    let (mut posted, mut done, mut out) = (0usize, 0usize, 0usize);
    while done < n {
        while out < IN_FLIGHT && posted < n {
            // The WR is built inside the timed call, as the C caller's ibv_send_wr is
            // converted inside its.
            let t = Instant::now();
            let w = SendWr::write(posted as u64, &[sge], s.base + 4096, s.rkey);
            let r = s.a.post_send(&w);
            inside += t.elapsed();
            r.unwrap();
            posted += 1;
            out += 1;
        }
        let t = Instant::now();
        let k = s.cq.poll(&mut wc);
        if k > 0 {
            inside += t.elapsed();
        }
        for w in &wc[..k] {
            assert_eq!(w.status, roce_xdp::verbs::WcStatus::Success);
        }
        done += k;
        out -= k;
    }
    inside
}

/// Runs `f` `iters` times; the time it reports spending inside the calls.
fn timed(name: &str, iters: u64, mut f: impl FnMut() -> Duration) -> Duration {
    let mut d = Duration::ZERO;
    let mut v = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let x = f();
        v.push(x.as_secs_f64() * 1e9 / PER_ITER as f64);
        d += x;
    }
    RESULTS
        .lock()
        .unwrap()
        .entry(name.to_string())
        .or_default()
        .extend(v);
    d
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Puts the engine thread on core 0 and this thread on core 1: both spin, and sharing a
/// core would time the scheduler instead of the calls.
fn pin_apart() {
    let pin = |tid: i32, cpu: usize| {
        // SAFETY: a zeroed cpu_set_t is valid; the calls take pointers to it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    };
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with("roce-xdp-engine")
            && let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>()
        {
            pin(tid, 0);
        }
    }
    pin(0, 1);
}

fn main() {
    if let Err(why) = roce_xdp::netns::available() {
        println!("SKIPPED: {why}");
        return;
    }
    let pair = roce_xdp::netns::Pair::new("rvbench", 61, 1500).expect("namespaces");
    roce_xdp::host::enter_netns(&pair.a.name).expect("entering the namespace");
    // SAFETY: set before any other thread of this program reads the environment.
    unsafe { std::env::set_var("ROCE_XDP_BUSY_POLL", "1") };
    let mut c_s = c_side();
    // SAFETY: the context c_side opened, still open.
    let dev = unsafe { roce_xdp::cabi::runtime_of(c_s.ctx) }.expect("the runtime device");
    let r_s = rust_side(&dev);
    pin_apart();
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let mut g = c.benchmark_group("post_send+poll_cq");
    g.throughput(Throughput::Elements(PER_ITER as u64));
    // Alternate the two doors in short rounds: this VM's speed drifts by 2x over
    // seconds (both doors alike), so each round's difference is taken from runs made
    // side by side, and the result is the median of those differences.
    let mut diffs = Vec::new();
    for round in 0..ROUNDS {
        let before = |k: &str| RESULTS.lock().unwrap().get(k).map_or(0, Vec::len);
        let (c0, r0) = (before("c_abi"), before("rust_api"));
        g.bench_function(BenchmarkId::new("c_abi", round), |b| {
            b.iter_custom(|iters| timed("c_abi", iters, || c_run(&mut c_s, PER_ITER)))
        });
        g.bench_function(BenchmarkId::new("rust_api", round), |b| {
            b.iter_custom(|iters| timed("rust_api", iters, || rust_run(&r_s, PER_ITER)))
        });
        let r = RESULTS.lock().unwrap();
        let (cm, rm) = (median(&r["c_abi"][c0..]), median(&r["rust_api"][r0..]));
        diffs.push((cm, rm));
    }
    g.finish();
    c.final_summary();
    if !diffs.is_empty() {
        println!(
            "\ntime inside the calls per WRITE (post_send + its share of the polls that found\ncompletions), {IN_FLIGHT} in flight, same engine; per round, medians of runs of {PER_ITER} WRs:"
        );
        for (i, (cm, rm)) in diffs.iter().enumerate() {
            println!(
                "  round {i}: C ABI {cm:7.1} ns, Rust API {rm:7.1} ns, C door {:+6.1} ns",
                cm - rm
            );
        }
        let d: Vec<f64> = diffs.iter().map(|(c, r)| c - r).collect();
        let q: Vec<f64> = diffs.iter().map(|(c, r)| c / r).collect();
        println!(
            "  C door: {:+.1} ns per call pair (median of {} rounds; {:.3}x)",
            median(&d),
            d.len(),
            median(&q)
        );
    }
    drop(pair);
}

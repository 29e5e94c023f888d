// Shared by benches/engine.rs and profiling: two connected engines on a clean link.
use roce_xdp::apps::bench::qps::rc_to_rts;
use roce_xdp::engine::Engine;
use roce_xdp::link::sim::{LinkConfig, Sim, SimLink};
use roce_xdp::time::Time;
use roce_xdp::verbs::*;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

const ALL: AccessFlags = AccessFlags(15);

struct World {
    s: Sim<Engine, Engine>,
    qa: u32,
    qb: u32,
    /// Every QP of A's, `qa` first (the many-QP case posts over them in turn).
    qas: Vec<u32>,
    cqa: u32,
    cqb: u32,
    mra: MrInfo,
    mrb: MrInfo,
    _mem: (Arc<Memory>, Arc<Memory>),
}

fn world() -> World {
    world_n(1)
}

/// Two engines joined by a clean link with `n` connected RC QP pairs (16-deep queues
/// but the first), all sharing one PD, CQ and region per side.
fn world_n(n: usize) -> World {
    let ip_a = Ipv4Addr::new(198, 18, 0, 1);
    let ip_b = Ipv4Addr::new(198, 18, 0, 2);
    let (mac_a, mac_b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let mut a = Engine::new(DeviceConfig::new(mac_a, ip_a));
    let mut b = Engine::new(DeviceConfig::new(mac_b, ip_b));
    a.set_neighbor(IpAddr::V4(ip_b), mac_b);
    b.set_neighbor(IpAddr::V4(ip_a), mac_a);
    let mk = |e: &mut Engine| {
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(32768).unwrap();
        let mem = Memory::new(1 << 22);
        let mr = e.reg_mr(pd, &mem, 0, 1 << 22, ALL).unwrap();
        let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
        init.cap.max_send_wr = 16384;
        init.cap.max_recv_wr = 16384;
        (cq, mem, mr, e.create_qp(&init).unwrap())
    };
    let (cqa, ma, mra, qa) = mk(&mut a);
    let (cqb, mb, mrb, qb) = mk(&mut b);
    let up = |e: &mut Engine, q: u32, rq: u32, ip: Ipv4Addr| {
        rc_to_rts(e, q, rq, IpAddr::V4(ip), Mtu::Mtu1024).unwrap();
    };
    up(&mut a, qa, qb, ip_b);
    up(&mut b, qb, qa, ip_a);
    let mut qas = vec![qa];
    for _ in 1..n {
        let qp = |e: &mut Engine, cq: u32, pd: u32| {
            let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
            init.cap.max_send_wr = 16;
            init.cap.max_recv_wr = 16;
            e.create_qp(&init).unwrap()
        };
        let (x, y) = (qp(&mut a, cqa, mra.pd), qp(&mut b, cqb, mrb.pd));
        up(&mut a, x, y, ip_b);
        up(&mut b, y, x, ip_a);
        qas.push(x);
    }
    let link = SimLink::new(LinkConfig::default(), LinkConfig::default(), 1);
    World {
        s: Sim::new(a, b, link),
        qa,
        qb,
        qas,
        cqa,
        cqb,
        mra,
        mrb,
        _mem: (ma, mb),
    }
}

/// What `run` moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // WriteImm: the no-allocation test runs it, the bench does not.
enum Kind {
    Write,
    /// RDMA READs of B's region into A's (16 outstanding at a time: the QPs'
    /// max_rd_atomic); the responses answer them, so no ACKs.
    Read,
    /// SENDs into posted receives.
    Send,
    /// WRITE_WITH_IMMs, each consuming a posted receive.
    WriteImm,
}

/// Moves `msgs` messages of `len` bytes of `kind`; returns the packets both engines sent.
fn run(w: &mut World, msgs: usize, len: usize, kind: Kind) -> u64 {
    let before = w.s.a.counters().sent_pkts + w.s.b.counters().sent_pkts;
    let src = Sge {
        addr: w.mra.addr,
        length: len as u32,
        lkey: w.mra.lkey,
    };
    let dst = Sge {
        addr: w.mrb.addr,
        length: len as u32,
        lkey: w.mrb.lkey,
    };
    for i in 0..msgs {
        let id = i as u64;
        let wr = match kind {
            Kind::Write => SendWr::write(id, &[src], w.mrb.addr, w.mrb.rkey),
            Kind::Read => SendWr::read(id, &[src], w.mrb.addr, w.mrb.rkey),
            Kind::Send => {
                w.s.b.post_recv(w.qb, &RecvWr::new(id, &[dst])).unwrap();
                SendWr::send(id, &[src])
            }
            Kind::WriteImm => {
                w.s.b.post_recv(w.qb, &RecvWr::new(id, &[])).unwrap();
                SendWr::write(id, &[src], w.mrb.addr, w.mrb.rkey).with_imm(i as u32)
            }
        };
        // Signal one in 16, as bandwidth tools do.
        let wr = if i % 16 == 15 || i + 1 == msgs {
            wr
        } else {
            wr.with_flags(SendFlags::EMPTY)
        };
        w.s.a.post_send(w.qa, &wr).unwrap();
    }
    let (cqa, cqb) = (w.cqa, w.cqb);
    let want = msgs.div_ceil(16);
    let recvs = match kind {
        Kind::Write | Kind::Read => 0,
        Kind::Send | Kind::WriteImm => msgs,
    };
    let (mut got, mut recvd) = (0, 0);
    w.s.run_until(Time::MAX, u64::MAX, |a, b| {
        while a.poll_cq_one(cqa).is_some() {
            got += 1;
        }
        while b.poll_cq_one(cqb).is_some() {
            recvd += 1;
        }
        got >= want && recvd >= recvs
    });
    w.s.a.counters().sent_pkts + w.s.b.counters().sent_pkts - before
}

/// `total` WRITEs of `len` bytes, every one signaled, posted round-robin over the
/// world's QPs (all of them at once: 16-deep queues hold one each); returns the
/// packets both engines sent. One QP or a thousand, the same work.
#[allow(dead_code)] // The no-allocation test does not run it.
fn run_spread(w: &mut World, total: usize, len: usize) -> u64 {
    let before = w.s.a.counters().sent_pkts + w.s.b.counters().sent_pkts;
    let src = Sge {
        addr: w.mra.addr,
        length: len as u32,
        lkey: w.mra.lkey,
    };
    let qps = &w.qas;
    for i in 0..total {
        // Each WRITE goes to its own slice of B's region.
        let off = (i * len) as u64 % (w.mrb.length - len as u64);
        let wr = SendWr::write(i as u64, &[src], w.mrb.addr + off, w.mrb.rkey);
        w.s.a.post_send(qps[i % qps.len()], &wr).unwrap();
    }
    let cqa = w.cqa;
    let mut got = 0;
    w.s.run_until(Time::MAX, u64::MAX, |a, _| {
        while a.poll_cq_one(cqa).is_some() {
            got += 1;
        }
        got >= total
    });
    w.s.a.counters().sent_pkts + w.s.b.counters().sent_pkts - before
}

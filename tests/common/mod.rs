//! Shared set-up for the engine tests: two engines on a simulated link, QPs connected as
//! ibv_rc_pingpong connects them.
#![allow(dead_code)]

pub mod cabi;
pub mod decode;
pub mod hostile;
pub mod rt;
pub mod transfer;

use roce_xdp::engine::Engine;
use roce_xdp::link::sim::{LinkConfig, Sim, SimLink, Stop};
use roce_xdp::time::Time;
use roce_xdp::verbs::device::gid_of;
use roce_xdp::verbs::*;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
pub const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

pub fn config(mac: [u8; 6], ip: Ipv4Addr, mtu: Mtu, seed: u64) -> DeviceConfig {
    let mut c = DeviceConfig::new(mac, ip);
    c.port_mtu = mtu;
    c.seed = seed;
    c
}

pub fn pair(mtu: Mtu, seed: u64) -> (Engine, Engine) {
    let mut a = Engine::new(config(MAC_A, IP_A, mtu, seed));
    let mut b = Engine::new(config(MAC_B, IP_B, mtu, seed ^ 0xabcdef));
    a.set_neighbor(IpAddr::V4(IP_B), MAC_B);
    b.set_neighbor(IpAddr::V4(IP_A), MAC_A);
    (a, b)
}

pub fn sim(a: Engine, b: Engine, ab: LinkConfig, ba: LinkConfig, seed: u64) -> Sim<Engine, Engine> {
    Sim::new(a, b, SimLink::new(ab, ba, seed))
}

/// One side's objects.
pub struct Side {
    pub pd: u32,
    pub cq: u32,
    pub qpn: u32,
    pub mem: Arc<Memory>,
    pub mr: MrInfo,
}

pub const ALL_ACCESS: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

/// A PD, a CQ, a memory of `size` bytes registered with every access, and a QP.
pub fn side(e: &mut Engine, qp_type: QpType, size: usize, cq_depth: usize) -> Side {
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(cq_depth).unwrap();
    let mem = Memory::new(size);
    let mr = e.reg_mr(pd, &mem, 0, size, ALL_ACCESS).unwrap();
    let mut init = QpInitAttr::new(qp_type, pd, cq);
    init.cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 16,
        max_recv_sge: 16,
        max_inline_data: 256,
    };
    let qpn = e.create_qp(&init).unwrap();
    Side {
        pd,
        cq,
        qpn,
        mem,
        mr,
    }
}

/// Brings a QP to RTS towards `remote_qpn` at `remote_ip`, as ibv_rc_pingpong does
/// (timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12) unless overridden.
#[allow(clippy::too_many_arguments)]
pub fn connect(
    e: &mut Engine,
    qpn: u32,
    qp_type: QpType,
    remote_qpn: u32,
    remote_ip: Ipv4Addr,
    mtu: Mtu,
    my_psn: u32,
    remote_psn: u32,
    tweak: impl Fn(&mut QpAttr),
) {
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: ALL_ACCESS,
        qkey: 0x11111111,
        ..QpAttr::default()
    };
    let extra = if qp_type == QpType::Ud {
        QpAttrMask::QKEY
    } else {
        QpAttrMask::ACCESS_FLAGS
    };
    e.modify_qp(qpn, &a, m | extra).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = remote_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr = AddressVector::new(gid_of(IpAddr::V4(remote_ip)), 1);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 16;
    tweak(&mut a);
    let rtr = match qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        QpType::Ud => QpAttrMask::STATE,
    };
    e.modify_qp(qpn, &a, rtr).unwrap();
    a.qp_state = QpState::Rts;
    let rts = match qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::SQ_PSN
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    e.modify_qp(qpn, &a, rts).unwrap();
}

/// Two connected QPs of `qp_type` with `size` bytes of memory each.
pub fn connected(
    qp_type: QpType,
    mtu: Mtu,
    size: usize,
    psn_a: u32,
    psn_b: u32,
    seed: u64,
) -> (Engine, Engine, Side, Side) {
    connected_with(
        qp_type,
        mtu,
        size,
        1 << 15,
        (psn_a, psn_b),
        seed,
        |_| {},
        |_| {},
    )
}

/// As [`connected`], with CQs of `cq_depth` and each side's attributes tweaked before
/// its QP is brought up (A's by `tweak_a`, B's by `tweak_b`).
#[allow(clippy::too_many_arguments)]
pub fn connected_with(
    qp_type: QpType,
    mtu: Mtu,
    size: usize,
    cq_depth: usize,
    (psn_a, psn_b): (u32, u32),
    seed: u64,
    tweak_a: impl Fn(&mut QpAttr),
    tweak_b: impl Fn(&mut QpAttr),
) -> (Engine, Engine, Side, Side) {
    let (mut a, mut b) = pair(mtu, seed);
    let sa = side(&mut a, qp_type, size, cq_depth);
    let sb = side(&mut b, qp_type, size, cq_depth);
    connect_sides(
        (&mut a, &sa),
        (&mut b, &sb),
        qp_type,
        mtu,
        (psn_a, psn_b),
        tweak_a,
        tweak_b,
    );
    (a, b, sa, sb)
}

/// Connects A's QP `sa` (at [`IP_A`]) and B's `sb` (at [`IP_B`]) to each other, A
/// sending from `psn_a` and B from `psn_b`, each side's attributes tweaked first.
pub fn connect_sides(
    (a, sa): (&mut Engine, &Side),
    (b, sb): (&mut Engine, &Side),
    qp_type: QpType,
    mtu: Mtu,
    (psn_a, psn_b): (u32, u32),
    tweak_a: impl Fn(&mut QpAttr),
    tweak_b: impl Fn(&mut QpAttr),
) {
    connect(a, sa.qpn, qp_type, sb.qpn, IP_B, mtu, psn_a, psn_b, tweak_a);
    connect(b, sb.qpn, qp_type, sa.qpn, IP_A, mtu, psn_b, psn_a, tweak_b);
}

pub fn sge(s: &Side, off: usize, len: usize) -> Sge {
    Sge {
        addr: s.mr.addr + off as u64,
        length: len as u32,
        lkey: s.mr.lkey,
    }
}

/// Runs until both engines hold `na` and `nb` completions (bounded); returns them.
pub fn run_for_completions(
    s: &mut Sim<Engine, Engine>,
    cqa: u32,
    na: usize,
    cqb: u32,
    nb: usize,
    max_sim_secs: u64,
) -> (Vec<Wc>, Vec<Wc>, Stop) {
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let stop = s.run_until(Time(max_sim_secs * 1_000_000_000), 50_000_000, |a, b| {
        while let Some(w) = a.poll_cq_one(cqa) {
            wa.push(w);
        }
        while let Some(w) = b.poll_cq_one(cqb) {
            wb.push(w);
        }
        wa.len() >= na && wb.len() >= nb
    });
    (wa, wb, stop)
}

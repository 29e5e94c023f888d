//! Set-up for tests of the runtime over real links: devices in network namespaces, QPs
//! connected across them.

use roce_xdp::netns::Pair;
use roce_xdp::runtime::{Cq, Device, Qp, RuntimeConfig};
use roce_xdp::verbs::*;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Skips (with the reason printed) when namespaces cannot be made. CI runs as root, so
/// there this never skips; `ROCE_REQUIRE_ROOT=1` turns a skip into a failure.
pub fn need_root() -> bool {
    match roce_xdp::netns::available() {
        Ok(()) => true,
        Err(why) => {
            if std::env::var_os("ROCE_REQUIRE_ROOT").is_some() {
                panic!("cannot run: {why}");
            }
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

pub struct End {
    pub dev: Device,
    pub pd: u32,
    pub cq: Cq,
    pub qp: Qp,
    pub mem: Arc<Memory>,
    pub mr: MrInfo,
}

pub fn end(dev: Device, qp_type: QpType, size: usize) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16384).unwrap();
    let mem = Memory::new(size);
    let mr = dev.reg_mr(pd, &mem, 0, size, AccessFlags(15)).unwrap();
    let mut init = QpInitAttr::new(qp_type, pd, cq.id);
    init.cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 16,
        max_recv_sge: 16,
        max_inline_data: 256,
    };
    let qp = dev.create_qp(&init).unwrap();
    End {
        dev,
        pd,
        cq,
        qp,
        mem,
        mr,
    }
}

impl End {
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + off as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }
}

/// Brings `e`'s QP to RTS towards `qpn` at `ip`.
pub fn connect(e: &End, qpn: u32, ip: IpAddr, mtu: Mtu, my_psn: u32, peer_psn: u32) {
    let d = &e.dev;
    let t = e.qp.qp_type();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags(15),
        qkey: 0x11111111,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    let extra = if t == QpType::Ud {
        QpAttrMask::QKEY
    } else {
        QpAttrMask::ACCESS_FLAGS
    };
    d.modify_qp(&e.qp, &a, m | extra).unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = qpn;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr = d.av_to(ip);
    let rtr = match t {
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
    d.modify_qp(&e.qp, &a, rtr).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 12;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 16;
    let rts = match t {
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
    d.modify_qp(&e.qp, &a, rts).unwrap();
}

/// Two AF_XDP devices, one in each namespace of `pair`, with connected QPs.
pub fn xdp_ends(
    pair: &Pair,
    qp_type: QpType,
    size: usize,
    tweak: impl Fn(&mut RuntimeConfig),
) -> (End, End) {
    let mut ca = RuntimeConfig::xdp(&pair.ifname);
    ca.netns = Some(pair.a.name.clone());
    tweak(&mut ca);
    let mut cb = ca.clone();
    cb.netns = Some(pair.b.name.clone());
    let a = end(Device::open(ca).unwrap(), qp_type, size);
    let b = end(Device::open(cb).unwrap(), qp_type, size);
    let mtu = a.dev.info().port_mtu;
    connect(&a, b.qp.qpn, IpAddr::V4(pair.ip_b), mtu, 100, 200);
    connect(&b, a.qp.qpn, IpAddr::V4(pair.ip_a), mtu, 200, 100);
    (a, b)
}

/// Waits for `n` completions on `cq`, each successful.
pub fn wait_ok(cq: &Cq, n: usize, secs: u64) -> Vec<Wc> {
    let mut v = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while v.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "timed out with {} of {n} completions: {v:?}",
            v.len()
        );
        if let Some(w) = cq.next(left) {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            v.push(w);
        }
    }
    v
}

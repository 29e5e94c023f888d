//! A live RC QP (with its own WRITEs, READs, SENDs and atomics outstanding, receives
//! posted), a UC QP on an SRQ and a UD QP, fed hostile frames: any transport bytes (BTH onward) wrapped in valid
//! Ethernet, IPv4 and UDP headers with a correct ICRC, so that they get past the
//! checksum into the responder and completer. Interleaved with time passing, the
//! engine sending, and new WRs. Nothing may panic (overflow checks are on), and the
//! read-only region must never change.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_xdp::engine::Engine;
use roce_xdp::time::Time;
use roce_xdp::verbs::device::gid_of;
use roce_xdp::verbs::*;
use roce_xdp::wire::{EthRepr, IpRepr, Ipv4Repr, ROCE_V2_PORT, UdpRepr, icrc};
use std::net::{IpAddr, Ipv4Addr};

const MAC_US: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_PEER: [u8; 6] = [2, 0, 0, 0, 0, 2];
const IP_US: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

struct Cursor<'a>(&'a [u8]);
impl Cursor<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

/// Ethernet + IPv4 + UDP around `transport` (BTH first), with the ICRC appended: the
/// wire layer's own emitters, as the UDP link's `rebuild` uses them.
fn wrap(transport: &[u8], sport: u16, out: &mut Vec<u8>) {
    let eth = EthRepr {
        dst: MAC_US,
        src: MAC_PEER,
        vlan: None,
        ethertype: 0x0800,
    };
    let udp_payload = transport.len() + icrc::LEN;
    out.clear();
    out.resize(14 + 20 + 8 + udp_payload, 0);
    let l3 = eth.emit(out).unwrap();
    let ip = IpRepr::V4(Ipv4Repr::new(IP_PEER, IP_US, 0));
    let l4 = l3 + ip.emit(&mut out[l3..], 8 + udp_payload).unwrap();
    let udp = UdpRepr {
        src_port: sport,
        dst_port: ROCE_V2_PORT,
    };
    let bth = l4 + udp.emit(&mut out[l4..], udp_payload).unwrap();
    out[bth..bth + transport.len()].copy_from_slice(transport);
    let crc = icrc::compute(&out[l3..l4], &out[l4..bth], transport).unwrap_or(0);
    icrc::write(&mut out[bth + transport.len()..], crc);
}

fuzz_target!(|data: &[u8]| {
    let mut e = Engine::new(DeviceConfig::new(MAC_US, IP_US));
    e.set_neighbor(IpAddr::V4(IP_PEER), MAC_PEER);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4096).unwrap();
    let mem = Memory::new(1 << 16);
    let ro_mem = Memory::new(4096);
    ro_mem.fill(0, 4096, 0x5a).unwrap();
    let all = AccessFlags(15);
    let mr = e.reg_mr(pd, &mem, 0, 1 << 16, all).unwrap();
    let ro = e
        .reg_mr(pd, &ro_mem, 0, 4096, AccessFlags::REMOTE_READ)
        .unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qpn = e.create_qp(&init).unwrap();
    let mut at = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: all,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = 0x11;
    at.max_dest_rd_atomic = 4;
    at.min_rnr_timer = 1;
    at.ah_attr = AddressVector::new(gid_of(IpAddr::V4(IP_PEER)), 1);
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    at.qp_state = QpState::Rts;
    at.timeout = 4;
    at.retry_cnt = 2;
    at.rnr_retry = 2;
    at.max_rd_atomic = 4;
    e.modify_qp(
        qpn,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    let sge = |off: u64, len: u32| Sge {
        addr: mr.addr + off,
        length: len,
        lkey: mr.lkey,
    };
    for i in 0..8 {
        let _ = e.post_recv(qpn, &RecvWr::new(i, &[sge(i * 2048, 2048)]));
    }
    // A UC QP on a shared receive queue, and a UD QP.
    let srq = e.create_srq(pd, 64, 4).unwrap();
    for i in 0..8 {
        let _ = e.post_srq_recv(srq, &RecvWr::new(50 + i, &[sge(i * 1024, 1024)]));
    }
    let mut uc_init = QpInitAttr::new(QpType::Uc, pd, cq);
    uc_init.srq = Some(srq);
    let uc = e.create_qp(&uc_init).unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: all,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    e.modify_qp(uc, &a, base | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = 0x12;
    a.ah_attr = AddressVector::new(gid_of(IpAddr::V4(IP_PEER)), 1);
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    e.modify_qp(uc, &a, rtr).unwrap();
    a.qp_state = QpState::Rts;
    e.modify_qp(uc, &a, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    let mut ud_init = QpInitAttr::new(QpType::Ud, pd, cq);
    ud_init.cap.max_recv_wr = 64;
    let ud = e.create_qp(&ud_init).unwrap();
    let mut u = QpAttr {
        qp_state: QpState::Init,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    e.modify_qp(ud, &u, base | QpAttrMask::QKEY).unwrap();
    u.qp_state = QpState::Rtr;
    e.modify_qp(ud, &u, QpAttrMask::STATE).unwrap();
    u.qp_state = QpState::Rts;
    e.modify_qp(ud, &u, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    for i in 0..8 {
        let _ = e.post_recv(ud, &RecvWr::new(80 + i, &[sge(32768 + i * 1100, 1100)]));
    }

    let mut c = Cursor(data);
    let mut now = Time::from_nanos(1_000_000);
    let mut frame = Vec::with_capacity(4200);
    let mut out = vec![0u8; 9000];
    let mut id = 100u64;
    while let Some(op) = c.u8() {
        match op & 7 {
            0..=3 => {
                let Some(n) = c.u16() else { break };
                let mut t = c.take(usize::from(n) % 4200).to_vec();
                // Often aim at a live QP (RC, UC or UD): the fuzzer need not find
                // their numbers.
                let aim = match op >> 6 {
                    2 => Some(qpn),
                    3 => Some(uc),
                    1 => Some(ud),
                    _ => None,
                };
                if let Some(q) = aim
                    && t.len() >= 8
                {
                    t[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
                }
                let sport = if op & 0x08 != 0 {
                    0xc000
                } else {
                    u16::from(op) << 8
                };
                wrap(&t, sport, &mut frame);
                e.handle_frame(now, &frame);
            }
            4 => {
                let dt = u64::from(c.u16().unwrap_or(0)) * 4096;
                now = now.add_nanos(dt);
                if e.poll_timeout().is_some_and(|d| d <= now) {
                    e.handle_timeout(now);
                }
            }
            5 => {
                for _ in 0..512 {
                    if e.poll_transmit(now, &mut out).is_none() {
                        break;
                    }
                }
                while e.poll_cq_one(cq).is_some() {}
            }
            6 => {
                let k = c.u8().unwrap_or(0);
                let len = u32::from(c.u8().unwrap_or(1)) * 97;
                let off = u64::from(k >> 4) * 2048;
                let remote = 0x1000 + u64::from(c.u8().unwrap_or(0)) * 64;
                id += 1;
                let wr = match k % 7 {
                    0 => SendWr::write(id, &[sge(off, len)], remote, 0x1234),
                    1 => SendWr::read(id, &[sge(off, len)], remote, 0x1234),
                    2 => SendWr::send(id, &[sge(off, len)]),
                    3 => SendWr::cmp_swap(id, sge(off, 8), remote, 0x1234, 1, 2),
                    4 => SendWr::fetch_add(id, sge(off, 8), remote, 0x1234, 3),
                    5 => SendWr::send(id, &[]).with_inline(&[7; 64]).unwrap(),
                    _ => SendWr::write(id, &[sge(off, len)], remote, 0x1234).with_imm(9),
                };
                let _ = e.post_send(qpn, &wr);
            }
            _ => {
                id += 1;
                let len = u32::from(c.u8().unwrap_or(0)) * 32;
                let _ = e.post_recv(qpn, &RecvWr::new(id, &[sge(0, len)]));
            }
        }
    }
    for _ in 0..4096 {
        if e.poll_transmit(now, &mut out).is_none() {
            break;
        }
    }
    // Only a key with REMOTE_WRITE/ATOMIC opens memory for writing.
    let _ = ro;
    assert!(
        ro_mem.to_vec(0, 4096).unwrap().iter().all(|&b| b == 0x5a),
        "the read-only region changed"
    );
});

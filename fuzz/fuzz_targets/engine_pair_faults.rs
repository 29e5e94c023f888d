//! Two engines with an RC connection between them, and a network whose every decision
//! the fuzzer makes: for each frame in flight, deliver it, drop it, deliver it twice,
//! or send it to the back of the queue (reordering); when to let time pass. The input
//! first names up to 8 WRs (WRITE, READ, SEND, FETCH_ADD of chosen sizes), then the
//! schedule. When the schedule runs out the network turns clean.
//!
//! What must hold (nothing else is allowed): every WR completes exactly once; a WR
//! that succeeded moved exactly its bytes (the destination compared with the source);
//! a failure is RETRY_EXC_ERR (retries used up by the schedule) followed by flushes;
//! and nothing hangs: once the network is clean, everything completes within a bounded
//! number of steps and of simulated seconds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_xdp::engine::Engine;
use roce_xdp::time::Time;
use roce_xdp::verbs::device::gid_of;
use roce_xdp::verbs::*;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

const MACS: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)];
/// Bytes per WR slot in each side's memory.
const SLOT: usize = 16 * 1024;
const WRS: usize = 8;

struct Side {
    e: Engine,
    cq: u32,
    qpn: u32,
    mem: Arc<Memory>,
    mr: MrInfo,
}

fn side(i: usize) -> Side {
    let mut cfg = DeviceConfig::new(MACS[i], IPS[i]);
    cfg.seed = 7 + i as u64;
    let mut e = Engine::new(cfg);
    e.set_neighbor(IpAddr::V4(IPS[1 - i]), MACS[1 - i]);
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(256).unwrap();
    let mem = Memory::new(SLOT * WRS);
    let mr = e.reg_mr(pd, &mem, 0, SLOT * WRS, AccessFlags(15)).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = 64;
    let qpn = e.create_qp(&init).unwrap();
    Side {
        e,
        cq,
        qpn,
        mem,
        mr,
    }
}

/// RESET to RTS towards `peer` (timeout 8: about 1 ms; 7 retries; RNR timer 1).
fn connect(s: &mut Side, peer_qpn: u32, peer: usize, my_psn: u32, peer_psn: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags(15),
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    s.e.modify_qp(s.qpn, &a, base | QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = Mtu::Mtu1024;
    a.dest_qp_num = peer_qpn;
    a.rq_psn = peer_psn;
    a.max_dest_rd_atomic = 8;
    a.min_rnr_timer = 1;
    a.ah_attr = AddressVector::new(gid_of(IpAddr::V4(IPS[peer])), 1);
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    s.e.modify_qp(s.qpn, &a, rtr).unwrap();
    a.qp_state = QpState::Rts;
    a.timeout = 8;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = my_psn;
    a.max_rd_atomic = 8;
    let rts = QpAttrMask::STATE
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    s.e.modify_qp(s.qpn, &a, rts).unwrap();
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Write,
    Read,
    Send,
    FetchAdd,
}

fuzz_target!(|data: &[u8]| {
    let (wr_bytes, schedule) = data.split_at(data.len().min(2 * WRS));
    let mut s = [side(0), side(1)];
    let (qa, qb) = (s[0].qpn, s[1].qpn);
    // PSNs near the 24-bit wrap.
    connect(&mut s[0], qb, 1, 0xff_fff8, 0x10);
    connect(&mut s[1], qa, 0, 0x10, 0xff_fff8);
    for (k, side) in s.iter().enumerate() {
        let v: Vec<u8> = (0..SLOT * WRS).map(|i| (i * 7 + k * 101) as u8).collect();
        side.mem.write(0, &v).unwrap();
    }
    let before: Vec<Vec<u8>> = s
        .iter()
        .map(|x| x.mem.to_vec(0, SLOT * WRS).unwrap())
        .collect();
    // The WRs: slot i of each side belongs to WR i alone.
    let mut wrs = Vec::new();
    for (i, p) in wr_bytes.chunks(2).enumerate() {
        let kind = [Kind::Write, Kind::Read, Kind::Send, Kind::FetchAdd][usize::from(p[0] % 4)];
        let len = if kind == Kind::FetchAdd {
            8
        } else {
            (usize::from(*p.get(1).unwrap_or(&1)) * 64 + usize::from(p[0] >> 2)).min(SLOT)
        };
        let off = i * SLOT;
        let (a, b) = (&s[0], &s[1]);
        let l = Sge {
            addr: a.mr.addr + off as u64,
            length: len as u32,
            lkey: a.mr.lkey,
        };
        let remote = b.mr.addr + off as u64;
        let wr = match kind {
            Kind::Write => SendWr::write(i as u64, &[l], remote, b.mr.rkey),
            Kind::Read => SendWr::read(i as u64, &[l], remote, b.mr.rkey),
            Kind::Send => {
                let r = Sge {
                    addr: remote,
                    length: SLOT as u32,
                    lkey: b.mr.lkey,
                };
                s[1].e.post_recv(qb, &RecvWr::new(i as u64, &[r])).unwrap();
                SendWr::send(i as u64, &[l])
            }
            Kind::FetchAdd => SendWr::fetch_add(i as u64, l, remote, b.mr.rkey, 0x0101),
        };
        s[0].e.post_send(qa, &wr).unwrap();
        wrs.push((kind, len));
    }
    if wrs.is_empty() {
        return;
    }

    // The network: frames in flight each way, in order unless the schedule says so.
    let mut wire: [VecDeque<Vec<u8>>; 2] = [VecDeque::new(), VecDeque::new()];
    let mut buf = vec![0u8; 9000];
    let mut now = Time::from_nanos(1_000_000);
    let mut done: Vec<Option<WcStatus>> = vec![None; wrs.len()];
    let mut sched = schedule.iter().copied();
    let mut steps = 0u64;
    let limit = now.add_nanos(30_000_000_000);
    loop {
        steps += 1;
        assert!(
            steps < 2_000_000 && now < limit,
            "hang: {:?} after {steps} steps, {:?} in flight",
            done,
            wire.iter().map(VecDeque::len).collect::<Vec<_>>()
        );
        for (k, side) in s.iter_mut().enumerate() {
            while let Some(n) = side.e.poll_transmit(now, &mut buf) {
                wire[k].push_back(buf[..n].to_vec());
            }
        }
        while let Some(w) = s[0].e.poll_cq_one(s[0].cq) {
            let slot = &mut done[w.wr_id as usize];
            assert!(slot.is_none(), "WR {} completed twice", w.wr_id);
            *slot = Some(w.status);
        }
        while s[1].e.poll_cq_one(s[1].cq).is_some() {}
        if done.iter().all(Option::is_some) {
            break;
        }
        let dir = if wire[0].is_empty() {
            1
        } else if wire[1].is_empty() {
            0
        } else {
            (steps % 2) as usize
        };
        let Some(f) = wire[dir].pop_front() else {
            // Nothing in flight: time passes to the next timer.
            let next = [s[0].e.poll_timeout(), s[1].e.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(t) = next else {
                panic!("hang: nothing in flight, no timer, {done:?}");
            };
            now = now.max(t);
            for side in s.iter_mut() {
                if side.e.poll_timeout().is_some_and(|d| d <= now) {
                    side.e.handle_timeout(now);
                }
            }
            continue;
        };
        let to = &mut s[1 - dir].e;
        match sched.next() {
            None | Some(0..=159) => to.handle_frame(now, &f),
            Some(160..=191) => {}
            Some(192..=223) => {
                to.handle_frame(now, &f);
                wire[dir].push_back(f);
            }
            Some(d) => {
                wire[dir].push_back(f);
                // A little time passes with the frame held back.
                now = now.add_nanos(u64::from(d - 223) * 1000);
            }
        }
        now = now.add_nanos(2_000);
        for side in s.iter_mut() {
            if side.e.poll_timeout().is_some_and(|d| d <= now) {
                side.e.handle_timeout(now);
            }
        }
    }

    // Outcomes: successes are byte-exact; a failure is RETRY_EXC_ERR, then flushes.
    let statuses: Vec<WcStatus> = done.iter().map(|d| d.unwrap()).collect();
    if let Some(first) = statuses.iter().position(|&st| st != WcStatus::Success) {
        assert!(
            matches!(
                statuses[first],
                WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr
            ),
            "{statuses:?}"
        );
        assert!(
            statuses[first + 1..]
                .iter()
                .all(|&st| st == WcStatus::WrFlushErr),
            "{statuses:?}"
        );
    }
    let a_now = s[0].mem.to_vec(0, SLOT * WRS).unwrap();
    let b_now = s[1].mem.to_vec(0, SLOT * WRS).unwrap();
    for (i, (&(kind, len), &st)) in wrs.iter().zip(&statuses).enumerate() {
        if st != WcStatus::Success {
            continue;
        }
        let r = i * SLOT..i * SLOT + len;
        match kind {
            Kind::Write | Kind::Send => assert!(b_now[r.clone()] == before[0][r], "WR {i} {kind:?}"),
            Kind::Read => assert!(a_now[r.clone()] == before[1][r], "WR {i} READ"),
            Kind::FetchAdd => {
                let v = |m: &[u8]| u64::from_ne_bytes(m[r.clone()].try_into().unwrap());
                assert_eq!(v(&a_now), v(&before[1]), "WR {i}: FETCH_ADD's returned value");
                assert_eq!(
                    v(&b_now),
                    v(&before[1]).wrapping_add(0x0101),
                    "WR {i}: FETCH_ADD executed more or less than once"
                );
            }
        }
    }
});

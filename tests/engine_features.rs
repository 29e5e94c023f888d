//! UC, UD, SRQ, invalidation, fences, CQ overflow, the QP state machine, 1000 QPs.
// QP attributes are set field by field, as ibverbs programs set ibv_qp_attr.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use roce_xdp::engine::Engine;
use roce_xdp::link::sim::{LinkConfig, Sim, Stop};
use roce_xdp::time::Time;
use roce_xdp::verbs::device::gid_of;
use roce_xdp::verbs::*;
use roce_xdp::wire::{Frame, Opcode, Psn};
use std::net::IpAddr;

fn clean() -> LinkConfig {
    LinkConfig::default()
}

fn drain(s: &mut Sim<Engine, Engine>, cqa: u32, cqb: u32, secs: u64) -> (Vec<Wc>, Vec<Wc>) {
    let (mut wa, mut wb) = (vec![], vec![]);
    s.run_until(Time(secs * 1_000_000_000), 10_000_000, |_, _| false);
    while let Some(w) = s.a.poll_cq_one(cqa) {
        wa.push(w);
    }
    while let Some(w) = s.b.poll_cq_one(cqb) {
        wb.push(w);
    }
    (wa, wb)
}

#[test]
fn uc_a_lost_packet_drops_only_its_message() {
    let (a, b, sa, sb) = connected(QpType::Uc, Mtu::Mtu1024, 1 << 20, 10, 20, 3);
    let mut s = sim(a, b, clean(), clean(), 3);
    // Lose the middle packet (PSN 10 + 3 + 1) of the second 3-packet message.
    s.link.filter = Some(Box::new(|dir, f| {
        dir == 0 && Frame::parse(f).is_ok_and(|f| f.roce().bth().psn() == Psn::new(14))
    }));
    for i in 0..3u64 {
        sa.mem.fill(i as usize * 4096, 3000, i as u8 + 1).unwrap();
        s.b.post_recv(
            sb.qpn,
            &RecvWr::new(100 + i, &[sge(&sb, i as usize * 4096, 4096)]),
        )
        .unwrap();
        s.a.post_send(
            sa.qpn,
            &SendWr::send(i, &[sge(&sa, i as usize * 4096, 3000)]),
        )
        .unwrap();
    }
    let (wa, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    // UC sends complete when sent, all three.
    assert_eq!(wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [0, 1, 2]);
    // Message 2 is lost; message 3 lands in the WQE message 2 would have used.
    assert_eq!(wb.len(), 2, "{wb:?}");
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (100, 3000));
    assert_eq!((wb[1].wr_id, wb[1].byte_len), (101, 3000));
    assert!(sb.mem.to_vec(4096, 3000).unwrap().iter().all(|&x| x == 3));
    assert_eq!(s.b.recv_queue_len(sb.qpn), 1);
    assert!(s.b.counters().drop_uc_msg >= 1);
    assert_eq!(s.a.counters().retransmitted_pkts, 0, "UC never retransmits");
}

fn ud_pair() -> (Sim<Engine, Engine>, Side, Side) {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 4);
    let sa = side(&mut a, QpType::Ud, 1 << 16, 64);
    let sb = side(&mut b, QpType::Ud, 1 << 16, 64);
    connect(
        &mut a,
        sa.qpn,
        QpType::Ud,
        0,
        IP_B,
        Mtu::Mtu1024,
        5,
        0,
        |_| {},
    );
    connect(
        &mut b,
        sb.qpn,
        QpType::Ud,
        0,
        IP_A,
        Mtu::Mtu1024,
        6,
        0,
        |_| {},
    );
    let s = sim(a, b, clean(), clean(), 4);
    (s, sa, sb)
}

fn ud_dest(qpn: u32, qkey: u32) -> UdDest {
    UdDest {
        ah: AddressVector::new(gid_of(IpAddr::V4(IP_B)), 1),
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

#[test]
fn ud_delivers_with_grh_and_source_qp_and_checks_the_qkey() {
    let (mut s, sa, sb) = ud_pair();
    sa.mem.fill(0, 500, 0x42).unwrap();
    for i in 0..3 {
        s.b.post_recv(
            sb.qpn,
            &RecvWr::new(i, &[sge(&sb, i as usize * 2048, 2048)]),
        )
        .unwrap();
    }
    let good = SendWr::send(1, &[sge(&sa, 0, 500)]).with_ud(ud_dest(sb.qpn, 0x11111111));
    s.a.post_send(sa.qpn, &good.with_imm(77)).unwrap();
    // A wrong Q_Key is dropped by the receiver.
    let bad = SendWr::send(2, &[sge(&sa, 0, 500)]).with_ud(ud_dest(sb.qpn, 0x2222));
    s.a.post_send(sa.qpn, &bad).unwrap();
    // A privileged Q_Key (top bit set) means the sender's own Q_Key (IBA 10.2.5).
    let privileged = SendWr::send(3, &[sge(&sa, 0, 500)]).with_ud(ud_dest(sb.qpn, 0x8000_0000));
    s.a.post_send(sa.qpn, &privileged).unwrap();
    let (wa, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa.len(), 3);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(wb.len(), 2, "{wb:?}");
    let w = wb[0];
    assert_eq!(w.byte_len, 540);
    assert_eq!(w.src_qp, sa.qpn);
    assert!(w.wc_flags.contains(WcFlags::GRH));
    assert_eq!(w.imm(), Some(77));
    // The GRH area: 20 zero bytes, then the IPv4 header of the packet.
    let grh = sb.mem.to_vec(0, 40).unwrap();
    assert!(grh[..20].iter().all(|&x| x == 0));
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[32..36], &IP_A.octets());
    assert_eq!(&grh[36..40], &IP_B.octets());
    assert!(sb.mem.to_vec(40, 500).unwrap().iter().all(|&x| x == 0x42));
    assert_eq!(wb[1].wr_id, 1);
    assert_eq!(s.b.counters().drop_bad_qkey, 1);
}

#[test]
fn ud_too_small_a_buffer_and_no_buffer() {
    let (mut s, sa, sb) = ud_pair();
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 0, 100)]))
        .unwrap();
    let w = SendWr::send(1, &[sge(&sa, 0, 500)]).with_ud(ud_dest(sb.qpn, 0x11111111));
    s.a.post_send(sa.qpn, &w).unwrap();
    s.a.post_send(sa.qpn, &w).unwrap();
    let (_, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wb.len(), 1);
    assert_eq!(wb[0].status, WcStatus::LocLenErr);
    assert_eq!(s.b.counters().drop_no_recv_wqe, 1);
    assert_eq!(s.b.qp_state(sb.qpn), Some(QpState::Rts), "UD stays up");
}

#[test]
fn srq_is_shared_by_two_qps() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 5);
    let sa1 = side(&mut a, QpType::Rc, 1 << 16, 64);
    let sa2 = side(&mut a, QpType::Rc, 1 << 16, 64);
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(64).unwrap();
    let srq = b.create_srq(pd, 16, 4).unwrap();
    let mem = Memory::new(1 << 16);
    let mr = b.reg_mr(pd, &mem, 0, 1 << 16, ALL_ACCESS).unwrap();
    let mut init = QpInitAttr::new(QpType::Rc, pd, cq);
    init.srq = Some(srq);
    let qb1 = b.create_qp(&init).unwrap();
    let qb2 = b.create_qp(&init).unwrap();
    for (sa, qb) in [(&sa1, qb1), (&sa2, qb2)] {
        connect(
            &mut a,
            sa.qpn,
            QpType::Rc,
            qb,
            IP_B,
            Mtu::Mtu1024,
            1,
            2,
            |_| {},
        );
        connect(
            &mut b,
            qb,
            QpType::Rc,
            sa.qpn,
            IP_A,
            Mtu::Mtu1024,
            2,
            1,
            |_| {},
        );
    }
    for i in 0..4u64 {
        let g = Sge {
            addr: mr.addr + i * 1024,
            length: 1024,
            lkey: mr.lkey,
        };
        b.post_srq_recv(srq, &RecvWr::new(i, &[g])).unwrap();
    }
    assert!(
        b.post_recv(qb1, &RecvWr::new(9, &[])).is_err(),
        "must post to the SRQ"
    );
    a.post_send(sa1.qpn, &SendWr::send(1, &[sge(&sa1, 0, 10)]))
        .unwrap();
    a.post_send(sa2.qpn, &SendWr::send(2, &[sge(&sa2, 0, 20)]))
        .unwrap();
    let mut s = sim(a, b, clean(), clean(), 5);
    s.run_until(Time(1_000_000_000), 1_000_000, |_, _| false);
    let mut got = vec![];
    while let Some(w) = s.b.poll_cq_one(cq) {
        got.push((w.qp_num, w.byte_len, w.wr_id));
    }
    got.sort();
    assert_eq!(got, vec![(qb1, 10, 0), (qb2, 20, 1)]);
    assert!(s.b.destroy_srq(srq).is_err(), "in use");
}

const WINDOWED: AccessFlags = AccessFlags(
    AccessFlags::LOCAL_WRITE.bits()
        | AccessFlags::REMOTE_WRITE.bits()
        | AccessFlags::REMOTE_READ.bits()
        | AccessFlags::MW_BIND.bits(),
);

/// Binds a new window of `pd` through `qpn` of `s.b` over `len` bytes at `off` of `mr`;
/// the BIND_MW completion and the window's new R_Key.
fn bind(
    s: &mut Sim<Engine, Engine>,
    side: &Side,
    mr: &MrInfo,
    off: u64,
    len: u64,
    access: AccessFlags,
) -> (Wc, u32) {
    let mw = s.b.alloc_mw(side.pd).unwrap();
    let b = MwBind {
        mw: mw.handle,
        rkey: mw.next_rkey(),
        lkey: mr.lkey,
        addr: mr.addr + off,
        length: len,
        access,
    };
    s.b.post_send(side.qpn, &SendWr::bind_mw(77, b)).unwrap();
    let (_, wb) = drain(s, 999, side.cq, 1);
    assert_eq!(wb.len(), 1, "{wb:?}");
    (wb[0], b.rkey)
}

#[test]
fn a_type_2_window_opens_its_range_until_send_with_invalidate_closes_it() {
    let (a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 6);
    let mr = b.reg_mr(sb.pd, &sb.mem, 0, 16384, WINDOWED).unwrap();
    let mut s = sim(a, b, clean(), clean(), 6);
    let (wc, wkey) = bind(&mut s, &sb, &mr, 4096, 4096, AccessFlags::REMOTE_WRITE);
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::BindMw, WcStatus::Success)
    );
    assert_ne!(wkey, mr.rkey);
    // A WRITE through the window lands where the window says.
    sa.mem.fill(0, 100, 0x5a).unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::write(1, &[sge(&sa, 0, 100)], mr.addr + 4096, wkey),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert!(sb.mem.to_vec(4096, 100).unwrap().iter().all(|&x| x == 0x5a));
    // SEND_WITH_INV closes it; the receive reports which key.
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 32768, 64)]))
        .unwrap();
    let mut w = SendWr::send(2, &[sge(&sa, 0, 16)]).with_opcode(WrOpcode::SendWithInv);
    w.invalidate_rkey = wkey;
    s.a.post_send(sa.qpn, &w).unwrap();
    let (wa, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wb[0].invalidated_rkey(), Some(wkey));
    // The region itself is untouched: its own key still works; the window's does not.
    s.a.post_send(
        sa.qpn,
        &SendWr::write(3, &[sge(&sa, 0, 8)], mr.addr, mr.rkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::write(4, &[sge(&sa, 0, 8)], mr.addr + 4096, wkey),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wa[1].status, WcStatus::RemAccessErr);
}

#[test]
fn a_window_checks_its_range_and_opens_to_its_qp_only() {
    let (mut a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 8);
    let mr = b.reg_mr(sb.pd, &sb.mem, 0, 16384, WINDOWED).unwrap();
    // A second connection, to a QP of the same PD on B.
    let sa2 = side(&mut a, QpType::Rc, 1 << 14, 64);
    let mut init = QpInitAttr::new(QpType::Rc, sb.pd, sb.cq);
    init.cap.max_send_wr = 16;
    init.cap.max_recv_wr = 16;
    let qb2 = b.create_qp(&init).unwrap();
    connect(
        &mut a,
        sa2.qpn,
        QpType::Rc,
        qb2,
        IP_B,
        Mtu::Mtu1024,
        5,
        6,
        |_| {},
    );
    connect(
        &mut b,
        qb2,
        QpType::Rc,
        sa2.qpn,
        IP_A,
        Mtu::Mtu1024,
        6,
        5,
        |_| {},
    );
    let mut s = sim(a, b, clean(), clean(), 8);
    let (wc, wkey) = bind(&mut s, &sb, &mr, 0, 8192, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::Success);
    // Bound through the first QP: the second may not use it.
    s.a.post_send(
        sa2.qpn,
        &SendWr::read(1, &[sge(&sa2, 0, 64)], mr.addr, wkey),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa2.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::RemAccessErr);
    // The first may read inside it but not past its end; the READ before the violation
    // still gets its data (the NAK comes after it, in PSN order).
    s.a.post_send(
        sa.qpn,
        &SendWr::read(2, &[sge(&sa, 0, 64)], mr.addr + 8128, wkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(3, &[sge(&sa, 0, 65)], mr.addr + 8128, wkey),
    )
    .unwrap();
    sb.mem.fill(8128, 64, 0x3c).unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert!(sa.mem.to_vec(0, 64).unwrap().iter().all(|&x| x == 0x3c));
    assert_eq!(wa[1].status, WcStatus::RemAccessErr);
}

#[test]
fn binds_are_checked_and_regions_cannot_be_invalidated() {
    // Each refusal sends B's QP to ERR, so each gets a fresh connection.
    let fresh = |seed| {
        let (a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, seed);
        let mr = b.reg_mr(sb.pd, &sb.mem, 0, 16384, WINDOWED).unwrap();
        let plain = b.reg_mr(sb.pd, &sb.mem, 0, 16384, ALL_ACCESS).unwrap();
        (sim(a, b, clean(), clean(), seed), sa, sb, mr, plain)
    };
    let (mut s, _, sb, _, plain) = fresh(20);
    let (wc, _) = bind(&mut s, &sb, &plain, 0, 64, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::MwBindErr, "a region without MW_BIND");
    assert_eq!(s.b.qp_state(sb.qpn), Some(QpState::Err));
    let (mut s, _, sb, mr, _) = fresh(21);
    let (wc, _) = bind(&mut s, &sb, &mr, 16000, 1000, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::MwBindErr, "past the region's end");
    let (mut s, _, sb, mr, _) = fresh(22);
    let (wc, _) = bind(&mut s, &sb, &mr, 0, 64, AccessFlags::LOCAL_WRITE);
    assert_eq!(wc.status, WcStatus::MwBindErr, "a local access flag");
    let (mut s, _, sb, mr, _) = fresh(27);
    let (wc, _) = bind(&mut s, &sb, &mr, 0, 0, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::MwBindErr, "length 0 (o10-37.2.40)");
    // A bound window is invalidated before it is bound again.
    let (mut s, _, sb, mr, _) = fresh(23);
    let mw = s.b.alloc_mw(sb.pd).unwrap();
    let mut b1 = MwBind {
        mw: mw.handle,
        rkey: mw.next_rkey(),
        lkey: mr.lkey,
        addr: mr.addr,
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    s.b.post_send(sb.qpn, &SendWr::bind_mw(1, b1)).unwrap();
    b1.rkey = (b1.rkey & !0xff) | ((b1.rkey + 1) & 0xff);
    s.b.post_send(sb.qpn, &SendWr::bind_mw(2, b1)).unwrap();
    let (_, wb) = drain(&mut s, 999, sb.cq, 1);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[1].status, WcStatus::MwBindErr);
    // A new key of another window's index.
    let (mut s, _, sb, mr, _) = fresh(24);
    let mw = s.b.alloc_mw(sb.pd).unwrap();
    let b2 = MwBind {
        mw: mw.handle,
        rkey: mr.rkey,
        lkey: mr.lkey,
        addr: mr.addr,
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    s.b.post_send(sb.qpn, &SendWr::bind_mw(1, b2)).unwrap();
    let (_, wb) = drain(&mut s, 999, sb.cq, 1);
    assert_eq!(wb[0].status, WcStatus::MwBindErr);

    // SEND_WITH_INV of a region's key is an invalid request (rxe: REM_INV_REQ_ERR on
    // both sides), and the region stays valid.
    let (mut s, sa, sb, _, plain) = fresh(25);
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 32768, 64)]))
        .unwrap();
    let mut w = SendWr::send(1, &[sge(&sa, 0, 16)]).with_opcode(WrOpcode::SendWithInv);
    w.invalidate_rkey = plain.rkey;
    s.a.post_send(sa.qpn, &w).unwrap();
    let (wa, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::RemInvReqErr);
    assert_eq!(wb[0].status, WcStatus::RemInvReqErr);
    // Both QPs are in ERR now; connected again, the region's key still opens it.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    s.a.modify_qp(sa.qpn, &reset, QpAttrMask::STATE).unwrap();
    s.b.modify_qp(sb.qpn, &reset, QpAttrMask::STATE).unwrap();
    connect(
        &mut s.a,
        sa.qpn,
        QpType::Rc,
        sb.qpn,
        IP_B,
        Mtu::Mtu1024,
        30,
        40,
        |_| {},
    );
    connect(
        &mut s.b,
        sb.qpn,
        QpType::Rc,
        sa.qpn,
        IP_A,
        Mtu::Mtu1024,
        40,
        30,
        |_| {},
    );
    let _ = drain(&mut s, sa.cq, sb.cq, 1);
    s.a.post_send(
        sa.qpn,
        &SendWr::write(2, &[sge(&sa, 0, 8)], plain.addr, plain.rkey),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success);
    // LOCAL_INV of a region fails too (LOC_QP_OP_ERR, as rxe), of a window it works.
    let (a, b, sa, _) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 26);
    let mut s = sim(b, a, clean(), clean(), 26);
    let mr = s.b.reg_mr(sa.pd, &sa.mem, 0, 4096, WINDOWED).unwrap();
    let (wc, wkey) = bind(&mut s, &sa, &mr, 0, 4096, AccessFlags::REMOTE_READ);
    assert_eq!(wc.status, WcStatus::Success);
    let mut inv = SendWr::send(1, &[]).with_opcode(WrOpcode::LocalInv);
    inv.invalidate_rkey = wkey;
    s.b.post_send(sa.qpn, &inv).unwrap();
    inv.invalidate_rkey = mr.lkey;
    inv.wr_id = 2;
    s.b.post_send(sa.qpn, &inv).unwrap();
    let (_, wb) = drain(&mut s, 999, sa.cq, 1);
    assert_eq!(
        (wb[0].opcode, wb[0].status),
        (WcOpcode::LocalInv, WcStatus::Success)
    );
    assert_eq!(wb[1].status, WcStatus::LocQpOpErr);
}

#[test]
fn fence_waits_for_the_read_and_max_rd_atomic_is_honoured() {
    let (a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 20, 1, 2, 8);
    let mut s = sim(a, b, clean(), clean(), 8);
    s.link.tap = Some(vec![]);
    // Two READs with max_rd_atomic 16, then a fenced WRITE: the WRITE's first packet
    // leaves only after both READs completed.
    s.a.post_send(
        sa.qpn,
        &SendWr::read(1, &[sge(&sa, 0, 8192)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(2, &[sge(&sa, 8192, 8192)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    let fenced = SendWr::write(3, &[sge(&sa, 0, 100)], sb.mr.addr + 65536, sb.mr.rkey)
        .with_flags(SendFlags::SIGNALED | SendFlags::FENCE);
    s.a.post_send(sa.qpn, &fenced).unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa.len(), 3);
    let frames: Vec<(usize, Opcode)> = s
        .link
        .tap
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, (_, f))| Some((i, Frame::parse(f).ok()?.roce().bth().opcode())))
        .collect();
    let write_at = frames
        .iter()
        .find(|x| x.1 == Opcode::RC_RDMA_WRITE_ONLY)
        .unwrap()
        .0;
    let last_resp = frames
        .iter()
        .filter(|x| x.1 == Opcode::RC_RDMA_READ_RESPONSE_LAST)
        .map(|x| x.0)
        .max()
        .unwrap();
    assert!(
        write_at > last_resp,
        "the fenced WRITE went out before the READ finished"
    );
    // Both READ requests went out before any response: max_rd_atomic allowed two.
    let reqs: Vec<usize> = frames
        .iter()
        .filter(|x| x.1 == Opcode::RC_RDMA_READ_REQUEST)
        .map(|x| x.0)
        .collect();
    assert_eq!(reqs, [0, 1]);
}

#[test]
fn max_rd_atomic_one_serialises_reads() {
    let (a, b, sa, sb) = connected_with(
        QpType::Rc,
        Mtu::Mtu1024,
        1 << 20,
        64,
        (1, 2),
        10,
        |x| x.max_rd_atomic = 1,
        |_| {},
    );
    let mut s = sim(a, b, clean(), clean(), 10);
    s.link.tap = Some(vec![]);
    for i in 0..3 {
        s.a.post_send(
            sa.qpn,
            &SendWr::read(i, &[sge(&sa, 0, 4096)], sb.mr.addr, sb.mr.rkey),
        )
        .unwrap();
    }
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa.len(), 3);
    let ops: Vec<Opcode> = s
        .link
        .tap
        .iter()
        .flatten()
        .filter_map(|(_, f)| Some(Frame::parse(f).ok()?.roce().bth().opcode()))
        .collect();
    // Each READ request follows the previous READ's last response.
    let mut outstanding = 0;
    for op in ops {
        match op {
            Opcode::RC_RDMA_READ_REQUEST => {
                outstanding += 1;
                assert!(
                    outstanding <= 1,
                    "two READs outstanding with max_rd_atomic 1"
                );
            }
            Opcode::RC_RDMA_READ_RESPONSE_LAST => outstanding -= 1,
            _ => {}
        }
    }
}

#[test]
fn cq_overflow_is_an_error_event_not_silent_loss() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 11);
    let sa = side(&mut a, QpType::Rc, 1 << 16, 1024);
    let sb = side(&mut b, QpType::Rc, 1 << 16, 2);
    connect_sides(
        (&mut a, &sa),
        (&mut b, &sb),
        QpType::Rc,
        Mtu::Mtu1024,
        (1, 2),
        |_| {},
        |_| {},
    );
    for i in 0..4 {
        b.post_recv(sb.qpn, &RecvWr::new(i, &[sge(&sb, 0, 64)]))
            .unwrap();
        a.post_send(sa.qpn, &SendWr::send(i, &[sge(&sa, 0, 8)]))
            .unwrap();
    }
    let mut s = sim(a, b, clean(), clean(), 11);
    s.run_until(Time(1_000_000_000), 1_000_000, |_, _| false);
    let mut ev = vec![];
    while let Some(e) = s.b.poll_event() {
        ev.push(e);
    }
    assert!(ev.contains(&AsyncEvent::CqErr { cq: sb.cq }), "{ev:?}");
    assert!(ev.contains(&AsyncEvent::QpFatal { qpn: sb.qpn }));
    assert_eq!(s.b.qp_state(sb.qpn), Some(QpState::Err));
    assert_eq!(s.b.cq_len(sb.cq), 2);
}

#[test]
fn state_machine_rules_and_flush() {
    let (mut a, _b) = pair(Mtu::Mtu1024, 12);
    let sa = side(&mut a, QpType::Rc, 4096, 64);
    let q = sa.qpn;
    // RESET -> RTR is not a transition.
    let mut at = QpAttr::default();
    at.qp_state = QpState::Rtr;
    let e = a.modify_qp(q, &at, QpAttrMask::STATE).unwrap_err();
    assert!(e.to_string().contains("from RESET to RTR"), "{e}");
    // Missing attributes are named.
    at.qp_state = QpState::Init;
    let e = a
        .modify_qp(q, &at, QpAttrMask::STATE | QpAttrMask::PORT)
        .unwrap_err();
    assert!(e.to_string().contains("ACCESS_FLAGS|PKEY_INDEX"), "{e}");
    // Sends need RTS; receives INIT.
    assert!(a.post_send(q, &SendWr::send(1, &[])).is_err());
    assert!(a.post_recv(q, &RecvWr::new(1, &[])).is_err());
    a.modify_qp(
        q,
        &at,
        QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    a.post_recv(q, &RecvWr::new(5, &[sge(&sa, 0, 8)])).unwrap();
    a.post_recv(q, &RecvWr::new(6, &[sge(&sa, 0, 8)])).unwrap();
    // A path MTU beyond the port's is refused; so is a bad retry count.
    at.qp_state = QpState::Rtr;
    at.path_mtu = Mtu::Mtu4096;
    at.ah_attr = AddressVector::new(gid_of(IpAddr::V4(IP_B)), 1);
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    at.dest_qp_num = 0x11;
    assert!(
        a.modify_qp(q, &at, rtr)
            .unwrap_err()
            .to_string()
            .contains("path_mtu")
    );
    at.path_mtu = Mtu::Mtu1024;
    at.ah_attr.sgid_index = 9;
    assert_eq!(a.modify_qp(q, &at, rtr).unwrap_err(), Error::BadGidIndex(9));
    at.ah_attr.sgid_index = 1;
    a.modify_qp(q, &at, rtr).unwrap();
    assert_eq!(a.qp_state(q), Some(QpState::Rtr));
    // ERR flushes both receives.
    at.qp_state = QpState::Err;
    a.modify_qp(q, &at, QpAttrMask::STATE).unwrap();
    let w1 = a.poll_cq_one(sa.cq).unwrap();
    let w2 = a.poll_cq_one(sa.cq).unwrap();
    assert_eq!((w1.wr_id, w1.status), (5, WcStatus::WrFlushErr));
    assert_eq!((w2.wr_id, w2.status), (6, WcStatus::WrFlushErr));
    // ERR -> RESET -> INIT again.
    at.qp_state = QpState::Reset;
    a.modify_qp(q, &at, QpAttrMask::STATE).unwrap();
    assert_eq!(a.qp_state(q), Some(QpState::Reset));
    // Objects in use cannot be destroyed.
    assert!(a.destroy_cq(sa.cq).is_err());
    assert!(a.dealloc_pd(sa.pd).is_err());
    a.destroy_qp(q).unwrap();
    a.dereg_mr(sa.mr.lkey).unwrap();
    a.destroy_cq(sa.cq).unwrap();
    a.dealloc_pd(sa.pd).unwrap();
}

#[test]
fn reg_mr_rules() {
    let (mut a, _b) = pair(Mtu::Mtu1024, 13);
    let pd = a.alloc_pd().unwrap();
    let m = Memory::new(4096);
    let e = a
        .reg_mr(pd, &m, 0, 4096, AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    assert!(e.to_string().contains("require LOCAL_WRITE"), "{e}");
    assert!(
        a.reg_mr(pd, &m, 100, 4096, AccessFlags::LOCAL_WRITE)
            .is_err()
    );
    let x = a.reg_mr(pd, &m, 0, 4096, ALL_ACCESS).unwrap();
    let y = a.reg_mr(pd, &m, 0, 4096, ALL_ACCESS).unwrap();
    assert_ne!(x.rkey, y.rkey);
    assert_ne!(x.lkey, x.rkey);
    assert_eq!(x.addr, m.addr());
}

#[test]
fn a_thousand_qps_at_once() {
    let (mut a, mut b) = pair(Mtu::Mtu1024, 14);
    let pd_a = a.alloc_pd().unwrap();
    let pd_b = b.alloc_pd().unwrap();
    let cq_a = a.create_cq(8192).unwrap();
    let cq_b = b.create_cq(8192).unwrap();
    let ma = Memory::new(1000 * 4096);
    let mb = Memory::new(1000 * 4096);
    let mra = a.reg_mr(pd_a, &ma, 0, ma.len(), ALL_ACCESS).unwrap();
    let mrb = b.reg_mr(pd_b, &mb, 0, mb.len(), ALL_ACCESS).unwrap();
    let mut qps = vec![];
    for _ in 0..1000 {
        let qa = a
            .create_qp(&QpInitAttr::new(QpType::Rc, pd_a, cq_a))
            .unwrap();
        let qb = b
            .create_qp(&QpInitAttr::new(QpType::Rc, pd_b, cq_b))
            .unwrap();
        qps.push((qa, qb));
    }
    for (i, &(qa, qb)) in qps.iter().enumerate() {
        let psn = (i as u32 * 7919) & 0xff_ffff;
        connect(
            &mut a,
            qa,
            QpType::Rc,
            qb,
            IP_B,
            Mtu::Mtu1024,
            psn,
            psn ^ 0x5555,
            |_| {},
        );
        connect(
            &mut b,
            qb,
            QpType::Rc,
            qa,
            IP_A,
            Mtu::Mtu1024,
            psn ^ 0x5555,
            psn,
            |_| {},
        );
        let off = i as u64 * 4096;
        ma.fill(off as usize, 2048, (i % 251) as u8).unwrap();
        let local = Sge {
            addr: mra.addr + off,
            length: 2048,
            lkey: mra.lkey,
        };
        let back = Sge {
            addr: mra.addr + off + 2048,
            length: 2048,
            lkey: mra.lkey,
        };
        let recv = Sge {
            addr: mrb.addr + off,
            length: 2048,
            lkey: mrb.lkey,
        };
        b.post_recv(qb, &RecvWr::new(i as u64, &[recv])).unwrap();
        a.post_send(qa, &SendWr::send(i as u64, &[local])).unwrap();
        a.post_send(
            qa,
            &SendWr::read(i as u64, &[back], mrb.addr + off, mrb.rkey),
        )
        .unwrap();
    }
    let mut s = sim(a, b, LinkConfig::lossy(0.01), LinkConfig::lossy(0.01), 14);
    let (mut na, mut nb) = (0, 0);
    let stop = s.run_until(Time(60_000_000_000), 50_000_000, |a, b| {
        while let Some(w) = a.poll_cq_one(cq_a) {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            na += 1;
        }
        while let Some(w) = b.poll_cq_one(cq_b) {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
            nb += 1;
        }
        na == 2000 && nb == 1000
    });
    assert_eq!(stop, Stop::Done, "{na} {nb}");
    for i in 0..1000usize {
        let want = vec![(i % 251) as u8; 2048];
        assert!(mb.to_vec(i * 4096, 2048).unwrap() == want);
        assert!(
            ma.to_vec(i * 4096 + 2048, 2048).unwrap() == want,
            "READ back {i}"
        );
    }
    assert_eq!(s.a.qp_count(), 1000);
}

#[test]
fn sqd_drains_then_resumes() {
    let (mut a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 15);
    a.post_send(
        sa.qpn,
        &SendWr::write(1, &[sge(&sa, 0, 4000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    let mut s = sim(a, b, clean(), clean(), 15);
    // Send the first packets, then ask for SQD with the async notification.
    s.step();
    let mut at = QpAttr::default();
    at.qp_state = QpState::Sqd;
    at.en_sqd_async_notify = true;
    s.a.modify_qp(
        sa.qpn,
        &at,
        QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    )
    .unwrap();
    // A WR posted while draining waits for RTS.
    s.a.post_send(
        sa.qpn,
        &SendWr::write(2, &[sge(&sa, 0, 100)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    s.run_until(Time(1_000_000_000), 1_000_000, |_, _| false);
    let mut ev = vec![];
    while let Some(e) = s.a.poll_event() {
        ev.push(e);
    }
    assert!(
        ev.contains(&AsyncEvent::SqDrained { qpn: sa.qpn }),
        "{ev:?}"
    );
    assert_eq!(s.a.poll_cq_one(sa.cq).unwrap().wr_id, 1);
    assert!(
        s.a.poll_cq_one(sa.cq).is_none(),
        "the second WR waits in SQD"
    );
    at.qp_state = QpState::Rts;
    s.a.modify_qp(sa.qpn, &at, QpAttrMask::STATE).unwrap();
    s.run_until(Time(2_000_000_000), 1_000_000, |_, _| false);
    assert_eq!(s.a.poll_cq_one(sa.cq).unwrap().wr_id, 2);
}

#[test]
fn retry_cnt_7_can_mean_infinite_as_in_rxe() {
    let mut cfg = config(MAC_A, IP_A, Mtu::Mtu1024, 16);
    cfg.retry_cnt_7_infinite = true;
    let mut a = Engine::new(cfg);
    a.set_neighbor(IpAddr::V4(IP_B), MAC_B);
    let b = Engine::new(config(MAC_B, IP_B, Mtu::Mtu1024, 17));
    let sa = side(&mut a, QpType::Rc, 4096, 16);
    connect(
        &mut a,
        sa.qpn,
        QpType::Rc,
        0x99,
        IP_B,
        Mtu::Mtu1024,
        1,
        2,
        |x| x.timeout = 8,
    );
    a.post_send(sa.qpn, &SendWr::send(1, &[sge(&sa, 0, 8)]))
        .unwrap();
    let mut s = sim(a, b, clean(), clean(), 16);
    // 2 s of ~1 ms timeouts: far more than 7 retries, and still not given up.
    s.run_until(Time(2_000_000_000), 10_000_000, |_, _| false);
    assert!(s.a.counters().timeouts > 100);
    assert!(s.a.poll_cq_one(sa.cq).is_none());
    assert_eq!(s.a.qp_state(sa.qpn), Some(QpState::Rts));
}

#[test]
fn query_qp_reports_the_psns_as_they_stand() {
    // As rxe (rxe_qp_to_attr) and hardware: rq_psn is the next PSN the responder
    // expects, sq_psn the next the requester assigns, across the 2^24 wrap.
    let (a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 0xff_fffe, 0x50, 5);
    let mut s = sim(a, b, clean(), clean(), 5);
    // 3 packets of WRITE and a READ of 2 response packets: 5 PSNs.
    s.a.post_send(
        sa.qpn,
        &SendWr::write(1, &[sge(&sa, 0, 3000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(2, &[sge(&sa, 4096, 2000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa.len(), 2, "{wa:?}");
    assert_eq!(s.a.query_qp(sa.qpn).unwrap().0.sq_psn, 3);
    assert_eq!(s.b.query_qp(sb.qpn).unwrap().0.rq_psn, 3);
    // Nothing went the other way.
    assert_eq!(s.b.query_qp(sb.qpn).unwrap().0.sq_psn, 0x50);
    assert_eq!(s.a.query_qp(sa.qpn).unwrap().0.rq_psn, 0x50);
}

#[test]
fn a_read_before_a_violation_still_gets_its_data() {
    // Both READs arrive together; the second is out of range. The first one's reply goes
    // out before the NAK, in PSN order (rxe answers a READ before it looks further).
    let (a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 9);
    let mut s = sim(a, b, clean(), clean(), 9);
    sb.mem.fill(0, 3000, 0x77).unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(1, &[sge(&sa, 0, 3000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(
            2,
            &[sge(&sa, 4096, 64)],
            sb.mr.addr + (1 << 16) - 8,
            sb.mr.rkey,
        ),
    )
    .unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    assert!(sa.mem.to_vec(0, 3000).unwrap().iter().all(|&x| x == 0x77));
    assert_eq!(wa[1].status, WcStatus::RemAccessErr);
}

#[test]
fn a_late_post_recv_on_the_errored_qp_keeps_the_replies_before_the_nak() {
    // As above, driven by hand so that B's application posts a receive after the
    // violation sent B's QP to ERR and before B sent anything: that flush must not drop
    // the reply to the good READ either.
    let (mut a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, 1, 2, 10);
    sb.mem.fill(0, 3000, 0x66).unwrap();
    a.post_send(
        sa.qpn,
        &SendWr::read(1, &[sge(&sa, 0, 3000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    a.post_send(
        sa.qpn,
        &SendWr::read(
            2,
            &[sge(&sa, 4096, 64)],
            sb.mr.addr + (1 << 16) - 8,
            sb.mr.rkey,
        ),
    )
    .unwrap();
    let mut buf = vec![0u8; 9000];
    let t = Time(1000);
    while let Some(n) = a.poll_transmit(t, &mut buf) {
        b.handle_frame(t, &buf[..n]);
    }
    assert_eq!(b.qp_state(sb.qpn), Some(QpState::Err));
    b.post_recv(sb.qpn, &RecvWr::new(9, &[sge(&sb, 8192, 64)]))
        .unwrap();
    while let Some(n) = b.poll_transmit(t, &mut buf) {
        a.handle_frame(t, &buf[..n]);
    }
    let w1 = a.poll_cq_one(sa.cq).unwrap();
    assert_eq!(w1.status, WcStatus::Success, "{w1:?}");
    assert!(sa.mem.to_vec(0, 3000).unwrap().iter().all(|&x| x == 0x66));
    assert_eq!(a.poll_cq_one(sa.cq).unwrap().status, WcStatus::RemAccessErr);
}

/// A requester with more READs outstanding than the responder's max_dest_rd_atomic (a
/// misconfigured or hostile peer): the responder keeps at most that many replies queued,
/// drops the READs beyond (counted), and the requester's retransmissions get them all
/// answered, byte-exact.
#[test]
fn reads_beyond_max_dest_rd_atomic_are_dropped_not_queued() {
    let (mut a, mut b, sa, sb) = connected_with(
        QpType::Rc,
        Mtu::Mtu1024,
        4 << 20,
        256,
        (1, 2),
        11,
        |x| {
            x.max_rd_atomic = 16;
            x.timeout = 10;
        },
        |x| x.max_dest_rd_atomic = 2,
    );
    // 8 KiB READs: 8 PSNs each, so 16 of them fit the requester's 128-PSN window.
    const SZ: usize = 8192;
    let n = 32u64;
    for i in 0..n as usize {
        sb.mem.fill(i * SZ, SZ, i as u8 + 7).unwrap();
    }
    for i in 0..n {
        let off = i * SZ as u64;
        a.post_send(
            sa.qpn,
            &SendWr::read(
                i,
                &[sge(&sa, off as usize, SZ)],
                sb.mr.addr + off,
                sb.mr.rkey,
            ),
        )
        .unwrap();
    }
    // The requester's first burst (its 16 READ requests) reaches the responder in one
    // batch, before it sends anything, as a batch of received frames does over AF_XDP.
    let mut buf = vec![0u8; 9216];
    let mut burst = 0;
    while let Some(len) = a.poll_transmit(Time(0), &mut buf) {
        b.handle_frame(Time(0), &buf[..len]);
        burst += 1;
    }
    assert_eq!(burst, 16, "max_rd_atomic 16 READs in the first burst");
    assert_eq!(
        b.counters().drop_rd_atomic_overflow,
        14,
        "2 queued, 14 dropped"
    );
    // Then the link as usual: the requester retransmits what was dropped.
    let mut s = sim(a, b, clean(), clean(), 11);
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 20);
    assert_eq!(wa.len(), n as usize);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    for i in 0..n as usize {
        let mut got = vec![0u8; SZ];
        sa.mem.read(i * SZ, &mut got).unwrap();
        assert!(got.iter().all(|&x| x == i as u8 + 7), "READ {i} data");
    }
    let dropped = s.b.counters().drop_rd_atomic_overflow;
    assert!(dropped > 0, "no READ beyond the responder's 2 was dropped");
    println!("{dropped} READ requests dropped beyond max_dest_rd_atomic 2");
}

/// 802.1Q: a QP whose source GID belongs to a VLAN subinterface sends its frames tagged
/// with the VLAN (priority from the SL), its peer answers tagged, and a frame for that GID
/// arriving untagged or on another VLAN is not for the device (rxe takes a frame from the
/// netdev it came in on and checks the GID against that netdev's).
#[test]
fn vlan_gids_send_tagged_frames_and_take_only_their_own_vlan() {
    use std::net::Ipv4Addr;
    let vlan = |vid, ip| VlanNetdev {
        name: format!("veth0.{vid}"),
        index: 9,
        vid,
        ipv4: vec![ip],
        ipv6: vec![],
    };
    let (va, vb) = (
        Ipv4Addr::new(198, 18, 100, 1),
        Ipv4Addr::new(198, 18, 100, 2),
    );
    let mut ca = config(MAC_A, IP_A, Mtu::Mtu1024, 1);
    ca.vlans = vec![vlan(100, va)];
    let mut cb = config(MAC_B, IP_B, Mtu::Mtu1024, 2);
    cb.vlans = vec![vlan(100, vb)];
    let (mut a, mut b) = (Engine::new(ca), Engine::new(cb));
    // fe80, the interface's IPv4, then the VLAN's: index 2.
    assert_eq!(a.gid_table()[2], gid_of(IpAddr::V4(va)));
    a.set_neighbor(IpAddr::V4(vb), MAC_B);
    b.set_neighbor(IpAddr::V4(va), MAC_A);
    let sa = side(&mut a, QpType::Rc, 1 << 16, 64);
    let sb = side(&mut b, QpType::Rc, 1 << 16, 64);
    connect(
        &mut a,
        sa.qpn,
        QpType::Rc,
        sb.qpn,
        vb,
        Mtu::Mtu1024,
        0x100,
        0x200,
        |x| {
            x.ah_attr.sgid_index = 2;
            x.ah_attr.sl = 3;
        },
    );
    connect(
        &mut b,
        sb.qpn,
        QpType::Rc,
        sa.qpn,
        va,
        Mtu::Mtu1024,
        0x200,
        0x100,
        |x| {
            x.ah_attr.sgid_index = 2;
        },
    );
    let mut s = sim(a, b, clean(), clean(), 5);
    s.link.tap = Some(Vec::new());
    sa.mem.fill(0, 5000, 0xa5).unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::write(1, &[sge(&sa, 0, 5000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::read(2, &[sge(&sa, 8192, 5000)], sb.mr.addr, sb.mr.rkey),
    )
    .unwrap();
    let (wa, _, _) = run_for_completions(&mut s, sa.cq, 2, sb.cq, 0, 5);
    assert_eq!(wa.len(), 2, "{wa:?}");
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(sb.mem.to_vec(0, 5000).unwrap(), vec![0xa5; 5000]);
    assert_eq!(sa.mem.to_vec(8192, 5000).unwrap(), vec![0xa5; 5000]);
    let tap = s.link.tap.take().unwrap();
    assert!(tap.len() >= 8, "{} frames", tap.len());
    let mut from_a = None;
    for (_, fr) in &tap {
        let f = Frame::parse(fr).unwrap();
        let tag = f
            .eth()
            .vlan
            .expect("every frame of the VLAN GIDs is tagged");
        assert_eq!(tag.vid, 100);
        if f.eth().src == MAC_A {
            assert_eq!(tag.pcp, 3, "A's SL 3 is its frames' priority");
            from_a.get_or_insert_with(|| fr.clone());
        } else {
            assert_eq!(tag.pcp, 0);
        }
    }
    // One of A's requests again, untagged (the tag's 4 bytes cut out), then on VLAN 200:
    // neither is for B.
    let tagged = from_a.unwrap();
    let mut untagged = tagged[..12].to_vec();
    untagged.extend_from_slice(&tagged[16..]);
    let mut other = tagged.clone();
    // VID 200 (0x0c8): the PCP and DEI bits kept.
    other[14] &= 0xf0;
    other[15] = 200;
    let before = s.b.counters().drop_not_for_us;
    let now = s.now;
    s.b.handle_frame(now, &untagged);
    s.b.handle_frame(now, &other);
    assert_eq!(s.b.counters().drop_not_for_us, before + 2);
}

/// What a threaded runtime mirrors: `take_touched_qps` hands a QP out when its state or
/// finished counts changed, once; a turn that only touched it (a posted receive) hands
/// out nothing; `republish_qp` forces it; and a QP moved to another engine (here: taken
/// out and adopted back) is handed out by the engine that adopted it.
#[test]
fn touched_qps_report_changes_once_and_follow_a_moved_qp() {
    let (a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 20, 10, 20, 41);
    let mut s = sim(a, b, clean(), clean(), 41);
    let take = |e: &mut Engine| {
        let mut v = Vec::new();
        e.take_touched_qps(|qpn, state, sq, rq| v.push((qpn, state, sq, rq)));
        v
    };
    take(&mut s.a);
    take(&mut s.b);
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 0, 4096)]))
        .unwrap();
    s.a.post_send(
        sa.qpn,
        &SendWr::send(2, &[sge(&sa, 0, 100)]).with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let (wa, wb) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!((wa.len(), wb.len()), (1, 1));
    assert_eq!(take(&mut s.a), [(sa.qpn, QpState::Rts, 1, 0)]);
    assert_eq!(take(&mut s.b), [(sb.qpn, QpState::Rts, 0, 1)]);
    assert_eq!(take(&mut s.a), [], "handed out twice");
    // Touched, nothing changed.
    s.a.post_recv(sa.qpn, &RecvWr::new(3, &[sge(&sa, 0, 4096)]))
        .unwrap();
    assert_eq!(take(&mut s.a), [], "a posted receive changes no figure");
    s.a.republish_qp(sa.qpn);
    assert_eq!(take(&mut s.a), [(sa.qpn, QpState::Rts, 1, 0)]);
    // Touched, then moved before the runtime took it.
    s.a.post_recv(sa.qpn, &RecvWr::new(4, &[sge(&sa, 0, 4096)]))
        .unwrap();
    let moved = s.a.take_qp(sa.qpn).unwrap();
    assert_eq!(take(&mut s.a), []);
    s.a.adopt_qp(moved).unwrap();
    assert_eq!(
        take(&mut s.a),
        [(sa.qpn, QpState::Rts, 1, 0)],
        "the adopting engine hands the moved QP out"
    );
}

/// Back-to-back small messages ask for an ACK every ACK_REQ_ENDS (16) packets and at
/// the last one queued, not at every message's end (ACKs are cumulative); a message
/// whose successor waits for it to complete (here a LOCAL_INV) still asks, or it would
/// complete only when a timer sent it again.
#[test]
fn back_to_back_messages_share_acks_and_a_waited_for_one_still_asks() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let (a, b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 20, 10, 20, 43);
    let mut s = sim(a, b, clean(), clean(), 43);
    // (PSN, AckReq) of every request A sends.
    let seen: Rc<RefCell<Vec<(u32, bool)>>> = Rc::default();
    let log = seen.clone();
    s.link.filter = Some(Box::new(move |dir, f| {
        if dir == 0
            && let Ok(f) = Frame::parse(f)
        {
            let bth = f.roce().bth();
            log.borrow_mut().push((bth.psn().value(), bth.ack_req()));
        }
        false
    }));
    for i in 0..64u64 {
        s.a.post_send(
            sa.qpn,
            &SendWr::write(
                i,
                &[sge(&sa, 64 * i as usize, 64)],
                sb.mr.addr + 64 * i,
                sb.mr.rkey,
            )
            .with_flags(SendFlags::SIGNALED),
        )
        .unwrap();
    }
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 1);
    assert_eq!(wa.len(), 64);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    let asked: Vec<u32> = seen
        .borrow()
        .iter()
        .filter(|(_, a)| *a)
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(seen.borrow().len(), 64, "no packet sent twice");
    assert_eq!(*asked.last().unwrap(), 10 + 63, "the last one queued asks");
    assert!(asked.len() <= 64 / 16 + 1, "AckReq at {asked:?}");
    assert_eq!(s.a.counters().retransmitted_pkts, 0);
    // A WRITE followed by a LOCAL_INV, which waits for it: the WRITE asks.
    seen.borrow_mut().clear();
    s.a.post_send(
        sa.qpn,
        &SendWr::write(100, &[sge(&sa, 0, 64)], sb.mr.addr, sb.mr.rkey)
            .with_flags(SendFlags::SIGNALED),
    )
    .unwrap();
    let mut inv = SendWr::send(101, &[]).with_opcode(WrOpcode::LocalInv);
    inv.invalidate_rkey = sa.mr.lkey;
    s.a.post_send(sa.qpn, &inv).unwrap();
    let (wa, _) = drain(&mut s, sa.cq, sb.cq, 2);
    assert_eq!(wa.len(), 2, "{wa:?}");
    assert_eq!(*seen.borrow(), [(10 + 64, true)], "the WRITE asked, once");
    assert_eq!(s.a.counters().retransmitted_pkts, 0);
}

#[test]
fn busy_qps_send_in_short_bursts_round_robin() {
    use roce_xdp::engine::TX_BURST;
    let (mut a, mut b) = pair(Mtu::Mtu1024, 21);
    let mut pairs = vec![];
    for i in 0..3u32 {
        let sa = side(&mut a, QpType::Rc, 64 * 1024, 64);
        let sb = side(&mut b, QpType::Rc, 64 * 1024, 64);
        let psn = 100 * i;
        connect_sides(
            (&mut a, &sa),
            (&mut b, &sb),
            QpType::Rc,
            Mtu::Mtu1024,
            (psn, psn),
            |_| {},
            |_| {},
        );
        pairs.push((sa, sb));
    }
    // Each QP has a 32-packet WRITE to send.
    for (sa, sb) in &pairs {
        let wr = SendWr::write(1, &[sge(sa, 0, 32 * 1024)], sb.mr.addr, sb.mr.rkey);
        a.post_send(sa.qpn, &wr).unwrap();
    }
    let mut buf = vec![0u8; 9216];
    let mut order = vec![];
    while order.len() < 96 {
        let Some(n) = a.poll_transmit(Time(0), &mut buf) else {
            break;
        };
        let f = Frame::parse(&buf[..n]).unwrap();
        order.push(f.roce().bth().dest_qp());
    }
    assert_eq!(order.len(), 96, "every packet of the three WRITEs went out");
    // Runs of TX_BURST frames of one QP, the QPs taking turns in posting order.
    let runs: Vec<(u32, usize)> = order
        .chunk_by(|x, y| x == y)
        .map(|r| (r[0], r.len()))
        .collect();
    let burst = TX_BURST as usize;
    assert_eq!(runs.len(), 96 / burst, "{runs:?}");
    for (i, &(qpn, len)) in runs.iter().enumerate() {
        assert_eq!(len, burst, "{runs:?}");
        assert_eq!(qpn, pairs[i % 3].1.qpn, "{runs:?}");
    }
}

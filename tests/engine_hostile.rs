//! Hostile peers: frames with a valid ICRC (it is a checksum, not a MAC: anyone can
//! compute it) but arbitrary opcodes, PSNs, keys, addresses, lengths, syndromes and
//! payloads, aimed at a live RC QP that has requests of its own outstanding. The engine
//! must not panic (tests build with overflow checks), must not touch memory no key
//! grants (a read-only region, a deregistered one, the bytes around a region, a region
//! opened only through a read-only window), and must still work for a fresh connection
//! afterwards.

mod common;
use common::*;
use proptest::prelude::*;
use roce_xdp::engine::Engine;
use roce_xdp::link::sim::LinkConfig;
use roce_xdp::time::Time;
use roce_xdp::verbs::*;
use roce_xdp::wire::roce::pad_for;
use roce_xdp::wire::*;
use std::sync::Arc;

/// One hostile packet, as proptest draws it: mostly near-valid values, so that the
/// frames reach deep into the responder and completer rather than the first check.
#[derive(Debug, Clone)]
struct Evil {
    op: u8,
    psn: (u8, i32, u32),
    dest: (bool, u32),
    key: (u8, u32),
    va: (u8, i64, u64),
    len: (u8, u32, u32),
    payload_len: usize,
    fill: u8,
    ack_req: bool,
    syndrome: u8,
    msn: u32,
    imm: u32,
    swap_compare: (u64, u64),
}

fn arb_evil() -> impl Strategy<Value = Evil> {
    let rc = |request: bool| -> Vec<u8> {
        Opcode::all()
            .filter(|i| i.transport == Transport::Rc && i.request == request)
            .map(|i| i.code)
            .collect()
    };
    (
        prop_oneof![
            6 => proptest::sample::select(rc(true)),
            1 => proptest::sample::select(rc(false)),
        ],
        (0u8..4, -8i32..160, any::<u32>()),
        (proptest::bool::weighted(0.95), any::<u32>()),
        (0u8..7, any::<u32>()),
        (0u8..4, -4096i64..80_000, any::<u64>()),
        (0u8..4, 0u32..70_000, any::<u32>()),
        (0usize..1100, any::<u8>(), any::<bool>(), any::<u8>()),
        (any::<u32>(), any::<u32>(), any::<(u64, u64)>()),
    )
        .prop_map(
            |(op, psn, dest, key, va, len, (payload_len, fill, ack_req, syndrome), m)| Evil {
                op,
                psn,
                dest,
                key,
                va,
                len,
                payload_len,
                fill,
                ack_req,
                syndrome,
                msn: m.0,
                imm: m.1,
                swap_compare: m.2,
            },
        )
}

/// What the victim (engine B) holds, for building frames that aim at it.
struct Target {
    qpn: u32,
    epsn: u32,
    /// Keys and the first IOVA of what they open: the main region (all access), the
    /// read-only one, the deregistered one, the read-only window, and a region in the
    /// middle of a larger memory.
    keys: [(u32, u64); 5],
}

fn frame(e: &Evil, t: &Target, buf: &mut [u8]) -> usize {
    let info = Opcode(e.op).info().unwrap();
    let payload = vec![e.fill; if info.payload { e.payload_len } else { 0 }];
    let psn = match e.psn.0 {
        0 | 1 => t.epsn,
        2 => (i64::from(t.epsn) + i64::from(e.psn.1)).rem_euclid(1 << 24) as u32,
        _ => e.psn.2 & 0xff_ffff,
    };
    let (rkey, base) = match e.key.0 {
        k @ 0..5 => t.keys[usize::from(k)],
        5 => (t.keys[0].0 ^ 0x100, t.keys[0].1),
        _ => (e.key.1, t.keys[0].1),
    };
    let va = match e.va.0 {
        // In the first 8 KiB (inside the main region, half past the end of the 4 KiB
        // ones: their range checks), around the region, or anywhere.
        0 | 1 => base + e.va.1.unsigned_abs() % 8192,
        2 => base.wrapping_add_signed(e.va.1),
        _ => e.va.2,
    };
    let len = match e.len.0 {
        // What the payload carries (a consistent WRITE ONLY), or anything.
        0 | 1 => payload.len() as u32,
        2 => e.len.1,
        _ => e.len.2,
    };
    let dest_qp = if e.dest.0 {
        t.qpn
    } else {
        e.dest.1 & 0xff_ffff
    };
    let has = |k| info.has(k);
    let ext = ExtRepr {
        deth: None,
        reth: has(HeaderKind::Reth).then_some(RethRepr {
            va,
            rkey,
            dma_len: len,
        }),
        atomic_eth: has(HeaderKind::AtomicEth).then_some(AtomicEthRepr {
            va,
            rkey,
            swap_add: e.swap_compare.0,
            compare: e.swap_compare.1,
        }),
        aeth: has(HeaderKind::Aeth).then_some(AethRepr {
            syndrome: Syndrome::from_byte(e.syndrome),
            msn: e.msn & 0xff_ffff,
        }),
        atomic_ack_eth: has(HeaderKind::AtomicAckEth).then_some(AtomicAckEthRepr {
            orig: e.swap_compare.0,
        }),
        immdt: has(HeaderKind::ImmDt).then_some(ImmDtRepr { imm: e.imm }),
        ieth: has(HeaderKind::Ieth).then_some(IethRepr { rkey }),
    };
    let repr = FrameRepr {
        eth: EthRepr {
            dst: MAC_B,
            src: MAC_A,
            vlan: None,
            ethertype: 0x0800,
        },
        ip: IpRepr::V4(Ipv4Repr::new(IP_A, IP_B, 0)),
        udp: UdpRepr {
            src_port: 49152,
            dst_port: ROCE_V2_PORT,
        },
        roce: RoceRepr {
            bth: BthRepr {
                pad_count: pad_for(payload.len()),
                ack_req: e.ack_req,
                ..BthRepr::new(Opcode(e.op), dest_qp, Psn::new(psn))
            },
            ext,
            payload: &payload,
        },
    };
    repr.emit(buf).unwrap()
}

fn pattern(m: &Memory, seed: u8) {
    let v: Vec<u8> = (0..m.len())
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    m.write(0, &v).unwrap();
}

fn unchanged(m: &Memory, seed: u8) -> bool {
    let v: Vec<u8> = (0..m.len())
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    m.to_vec(0, m.len()).unwrap() == v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn hostile_frames_never_panic_nor_touch_memory_no_key_grants(
        evil in proptest::collection::vec(arb_evil(), 1..400),
        seed in any::<u64>(),
    ) {
        let (psn_a, psn_b) = (0xff_ff00, 0x10);
        let (mut a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 16, psn_a, psn_b, seed);
        // Memory no hostile frame may change: read-only, deregistered, the 4 KiB on each
        // side of a region registered in the middle of a 12 KiB memory, and a region
        // opened only through a read-only memory window (its own R_Key is never shown).
        let ro = Memory::new(8192);
        let dead = Memory::new(8192);
        let edge = Memory::new(12288);
        let windowed = Memory::new(8192);
        for (m, s) in [(&ro, 1u8), (&dead, 2), (&edge, 3), (&windowed, 4)] {
            pattern(m, s);
        }
        let edge_mr = b.reg_mr(sb.pd, &edge, 4096, 4096, ALL_ACCESS).unwrap();
        let ro_mr = b
            .reg_mr(sb.pd, &ro, 0, 8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
            .unwrap();
        let dead_mr = b.reg_mr(sb.pd, &dead, 0, 8192, ALL_ACCESS).unwrap();
        b.dereg_mr(dead_mr.lkey).unwrap();
        let win_mr = b
            .reg_mr(sb.pd, &windowed, 0, 8192, ALL_ACCESS | AccessFlags::MW_BIND)
            .unwrap();
        let mw = b.alloc_mw(sb.pd).unwrap();
        let bind = MwBind {
            mw: mw.handle,
            rkey: mw.next_rkey(),
            lkey: win_mr.lkey,
            addr: win_mr.addr + 1024,
            length: 4096,
            access: AccessFlags::REMOTE_READ,
        };
        b.post_send(sb.qpn, &SendWr::bind_mw(9, bind)).unwrap();
        let mut out = vec![0u8; 9000];
        let _ = b.poll_transmit(Time(0), &mut out);
        let w = b.poll_cq_one(sb.cq).unwrap();
        prop_assert_eq!((w.opcode, w.status), (WcOpcode::BindMw, WcStatus::Success));
        // B has receives posted and requests of its own in flight, so hostile responses
        // meet a completer with state. A violation sends the QP to ERR (as it must);
        // it is then reset and connected again, and the barrage goes on.
        let arm = |b: &mut Engine| {
            for i in 0..8 {
                b.post_recv(sb.qpn, &RecvWr::new(i, &[sge(&sb, 4096 * i as usize, 4096)])).unwrap();
            }
            b.post_send(sb.qpn, &SendWr::write(100, &[sge(&sb, 0, 8192)], sa.mr.addr, sa.mr.rkey)).unwrap();
            b.post_send(sb.qpn, &SendWr::read(101, &[sge(&sb, 8192, 4096)], sa.mr.addr, sa.mr.rkey)).unwrap();
            b.post_send(sb.qpn, &SendWr::fetch_add(102, sge(&sb, 16384, 8), sa.mr.addr, sa.mr.rkey, 1)).unwrap();
        };
        arm(&mut b);
        let mut t = Target {
            qpn: sb.qpn,
            epsn: psn_a,
            keys: [
                (sb.mr.rkey, sb.mr.addr),
                (ro_mr.rkey, ro_mr.addr),
                (dead_mr.rkey, dead_mr.addr),
                (bind.rkey, bind.addr),
                (edge_mr.rkey, edge_mr.addr),
            ],
        };
        let mut buf = vec![0u8; 9000];
        let mut now = Time(0);
        for e in &evil {
            if b.qp_state(sb.qpn) == Some(QpState::Err) {
                let reset = QpAttr { qp_state: QpState::Reset, ..QpAttr::default() };
                b.modify_qp(sb.qpn, &reset, QpAttrMask::STATE).unwrap();
                while b.poll_cq_one(sb.cq).is_some() {}
                connect(&mut b, sb.qpn, QpType::Rc, sa.qpn, IP_A, Mtu::Mtu1024, psn_b, psn_a, |_| {});
                arm(&mut b);
            }
            // Aim near the PSN the responder expects now (query_qp reports it live).
            t.epsn = b.query_qp(sb.qpn).unwrap().0.rq_psn;
            let n = frame(e, &t, &mut buf);
            b.handle_frame(now, &buf[..n]);
            while b.poll_transmit(now, &mut out).is_some() {}
            now = now.add_nanos(20_000);
            if b.poll_timeout().is_some_and(|d| d <= now) {
                b.handle_timeout(now);
            }
            while b.poll_cq_one(sb.cq).is_some() {}
        }
        prop_assert!(unchanged(&ro, 1), "a READ-only region was written");
        prop_assert!(unchanged(&dead, 2), "a deregistered region was written");
        let around = edge.to_vec(0, 12288).unwrap();
        let want: Vec<u8> = (0..12288).map(|i| (i as u8).wrapping_mul(31) ^ 3).collect();
        prop_assert!(
            around[..4096] == want[..4096] && around[8192..] == want[8192..],
            "a byte next to a region was written"
        );
        prop_assert!(unchanged(&windowed, 4), "a read-only window let a write through");
        // Every frame was looked at: accepted for processing or dropped with a reason.
        prop_assert!(b.counters().rcvd_pkts + b.counters().drops() >= evil.len() as u64);

        // B still works: a fresh connection moves data byte-exact.
        let qa = side(&mut a, QpType::Rc, 1 << 14, 64);
        let qb = side(&mut b, QpType::Rc, 1 << 14, 64);
        connect(&mut a, qa.qpn, QpType::Rc, qb.qpn, IP_B, Mtu::Mtu1024, 7, 9, |_| {});
        connect(&mut b, qb.qpn, QpType::Rc, qa.qpn, IP_A, Mtu::Mtu1024, 9, 7, |_| {});
        let data: Vec<u8> = (0..8192).map(|i| (i * 7) as u8).collect();
        qa.mem.write(0, &data).unwrap();
        a.post_send(qa.qpn, &SendWr::write(1, &[sge(&qa, 0, 8192)], qb.mr.addr, qb.mr.rkey)).unwrap();
        let mut s = sim(a, b, LinkConfig::default(), LinkConfig::default(), seed);
        s.now = now;
        let (wa, _, _) = run_for_completions(&mut s, qa.cq, 1, qb.cq, 0, 10);
        prop_assert_eq!(wa.len(), 1);
        prop_assert_eq!(wa[0].status, WcStatus::Success);
        prop_assert_eq!(qb.mem.to_vec(0, 8192).unwrap(), data);
        let _keep: (Arc<Memory>, Arc<Memory>) = (sa.mem, sb.mem);
    }
}

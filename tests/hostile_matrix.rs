//! The hostile-peer matrix: one test per kind of bad frame a peer on the segment can
//! send, each with its outcome asserted. A hostile frame is built by hand (its ICRC is
//! right: the ICRC is a checksum, not a MAC), handed to engine B, and then the test
//! checks:
//! - what B sent back: the NAK the spec demands, an ACK, or nothing;
//! - which counters moved, exactly (a drop is counted once, under its reason);
//! - that no byte of B's memory changed that the frame's R_Key did not grant;
//! - that the victim QP is still usable (a real WRITE and READ from its peer succeed), or
//!   in the error state the spec demands;
//! - that a second connection on the same engines is unaffected.
//!
//! `engine_hostile` throws random frames at the engine; this file names each case.
// QP attributes are set field by field, as ibverbs programs set ibv_qp_attr.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::hostile::*;
use common::*;
use roce_xdp::engine::Engine;
use roce_xdp::link::sim::{LinkConfig, Sim, Stop};
use roce_xdp::time::Time;
use roce_xdp::verbs::*;
use roce_xdp::wire::aeth::NakCode;
use roce_xdp::wire::*;
use std::net::Ipv4Addr;
use std::sync::Arc;

const PSN_A: u32 = 100;
const PSN_B: u32 = 5000;
const MEM: usize = 1 << 16;

/// Engines A and B with two RC connections: the victim (`va`-`vb`) and a bystander
/// (`xa`-`xb`). B also holds a read-only region and a region in another PD. Every
/// memory of B starts with a pattern that `untouched` checks.
struct Bed {
    s: Sim<Engine, Engine>,
    va: Side,
    vb: Side,
    xa: Side,
    xb: Side,
    ro: MrInfo,
    other_pd: MrInfo,
    patterned: Vec<(Arc<Memory>, Vec<u8>)>,
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

impl Bed {
    fn new() -> Bed {
        Bed::with(Mtu::Mtu1024, |_| {}, |_| {})
    }

    /// A bed whose victim QPs are brought up with `tweak_a` / `tweak_b` applied.
    fn with(mtu: Mtu, tweak_a: impl Fn(&mut QpAttr), tweak_b: impl Fn(&mut QpAttr)) -> Bed {
        let (mut a, mut b, va, vb) = connected_with(
            QpType::Rc,
            mtu,
            MEM,
            1024,
            (PSN_A, PSN_B),
            7,
            tweak_a,
            tweak_b,
        );
        let xa = side(&mut a, QpType::Rc, MEM, 1024);
        let xb = side(&mut b, QpType::Rc, MEM, 1024);
        connect(&mut a, xa.qpn, QpType::Rc, xb.qpn, IP_B, mtu, 1, 2, |_| {});
        connect(&mut b, xb.qpn, QpType::Rc, xa.qpn, IP_A, mtu, 2, 1, |_| {});
        let ro_mem = Memory::new(8192);
        let ro = b
            .reg_mr(
                vb.pd,
                &ro_mem,
                0,
                8192,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let pd2 = b.alloc_pd().unwrap();
        let pd2_mem = Memory::new(8192);
        let other_pd = b.reg_mr(pd2, &pd2_mem, 0, 8192, ALL_ACCESS).unwrap();
        let mut patterned = Vec::new();
        for (i, m) in [&vb.mem, &xb.mem, &ro_mem, &pd2_mem]
            .into_iter()
            .enumerate()
        {
            let p = pattern(m.len(), i as u8 + 1);
            m.write(0, &p).unwrap();
            patterned.push((m.clone(), p));
        }
        let s = sim(a, b, LinkConfig::default(), LinkConfig::default(), 7);
        Bed {
            s,
            va,
            vb,
            xa,
            xb,
            ro,
            other_pd,
            patterned,
        }
    }

    /// The PSN B's victim QP expects next.
    fn epsn(&self) -> u32 {
        self.s.b.query_qp(self.vb.qpn).unwrap().0.rq_psn
    }

    /// A request or response from A's address to B's victim QP, at `psn`.
    fn pkt(&self, op: Opcode, psn: u32, ext: ExtRepr, payload: &[u8]) -> Pkt {
        Pkt::new(
            op,
            self.vb.qpn,
            psn,
            ext,
            payload,
            (MAC_A, IP_A),
            (MAC_B, IP_B),
        )
    }

    /// A WRITE ONLY of `payload` to `va` under `rkey`, at the expected PSN.
    fn write(&self, rkey: u32, va: u64, payload: &[u8]) -> Pkt {
        let psn = self.epsn();
        Pkt::write_only(
            self.vb.qpn,
            psn,
            (rkey, va),
            payload,
            (MAC_A, IP_A),
            (MAC_B, IP_B),
        )
    }

    /// B's victim QP posts a 64-byte WRITE (wr_id 9) to A; returns the frames it sent
    /// (not delivered: lost on the way, so the WRITE stays outstanding).
    fn b_writes(&mut self) -> Vec<Vec<u8>> {
        let (vb, va) = (&self.vb, &self.va);
        let wr = SendWr::write(9, &[sge(vb, 0, 64)], va.mr.addr, va.mr.rkey);
        self.s.b.post_send(vb.qpn, &wr).unwrap();
        let mut buf = vec![0u8; 10_000];
        let mut sent = Vec::new();
        while let Some(n) = self.s.b.poll_transmit(self.s.now, &mut buf) {
            sent.push(buf[..n].to_vec());
        }
        sent
    }

    /// One 64-byte WRITE ONLY (valid key, expected PSN) per value, each with `set`
    /// applied: the same frame with one field changed.
    fn writes_with(&self, values: &[u32], set: impl Fn(&mut Pkt, u32)) -> Vec<Vec<u8>> {
        values
            .iter()
            .map(|&v| {
                let mut p = self.write(self.vb.mr.rkey, self.vb.mr.addr, &[0xee; 64]);
                set(&mut p, v);
                p.emit()
            })
            .collect()
    }

    /// A READ request of `len` bytes at `va` under `rkey`, at the expected PSN.
    fn read(&self, rkey: u32, va: u64, len: u32) -> Pkt {
        let ext = ExtRepr {
            reth: Some(RethRepr {
                va,
                rkey,
                dma_len: len,
            }),
            ..ExtRepr::default()
        };
        self.pkt(Opcode::RC_RDMA_READ_REQUEST, self.epsn(), ext, &[])
    }

    /// A FETCH_ADD at `va` under `rkey`, at the expected PSN.
    fn fetch_add(&self, rkey: u32, va: u64) -> Pkt {
        let ext = ExtRepr {
            atomic_eth: Some(AtomicEthRepr {
                va,
                rkey,
                swap_add: 1,
                compare: 0,
            }),
            ..ExtRepr::default()
        };
        self.pkt(Opcode::RC_FETCH_ADD, self.epsn(), ext, &[])
    }

    /// An ACK-kind packet (AETH with `syndrome`) for B's requester at `psn`.
    fn ack(&self, psn: u32, syndrome: Syndrome) -> Pkt {
        let ext = ExtRepr {
            aeth: Some(AethRepr { syndrome, msn: 0 }),
            ..ExtRepr::default()
        };
        self.pkt(Opcode::RC_ACKNOWLEDGE, psn, ext, &[])
    }

    /// Hands `frames` to B, collects what B sends in reply (not delivered to A: the
    /// attacker would receive it) and which counters moved.
    fn inject(&mut self, frames: &[Vec<u8>]) -> Outcome {
        let before = *self.s.b.counters();
        let now = self.s.now;
        let mut sent = Vec::new();
        let mut buf = vec![0u8; 10_000];
        for f in frames {
            self.s.b.handle_frame(now, f);
        }
        while let Some(n) = self.s.b.poll_transmit(now, &mut buf) {
            sent.push(buf[..n].to_vec());
        }
        let after = *self.s.b.counters();
        let moved = moved(&before, &after);
        Outcome { sent, moved }
    }

    /// Panics if a byte of B's memory changed.
    fn untouched(&self) {
        for (i, (m, p)) in self.patterned.iter().enumerate() {
            assert!(
                m.to_vec(0, m.len()).unwrap() == *p,
                "memory {i} of B changed"
            );
        }
    }

    /// A WRITE and a READ from `a` to `b` complete byte-exact over the link.
    fn works(&mut self, victim: bool) {
        let (a, b) = if victim {
            (&self.va, &self.vb)
        } else {
            (&self.xa, &self.xb)
        };
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 5) as u8).collect();
        a.mem.write(0, &data).unwrap();
        self.s
            .a
            .post_send(
                a.qpn,
                &SendWr::write(1, &[sge(a, 0, 3000)], b.mr.addr + 100, b.mr.rkey),
            )
            .unwrap();
        self.s
            .a
            .post_send(
                a.qpn,
                &SendWr::read(2, &[sge(a, 8192, 3000)], b.mr.addr + 100, b.mr.rkey),
            )
            .unwrap();
        let deadline = Time(self.s.now.0 + 2_000_000_000);
        let (cq, qpn) = (a.cq, a.qpn);
        let mut wcs = Vec::new();
        let stop = self.s.run_until(deadline, 1_000_000, |a, _| {
            while let Some(w) = a.poll_cq_one(cq) {
                wcs.push(w);
            }
            wcs.len() >= 2
        });
        assert_eq!(stop, Stop::Done, "{wcs:?}");
        assert!(
            wcs.iter()
                .all(|w| w.status == WcStatus::Success && w.qp_num == qpn),
            "{wcs:?}"
        );
        assert_eq!(b.mem.to_vec(100, 3000).unwrap(), data);
        assert_eq!(a.mem.to_vec(8192, 3000).unwrap(), data);
    }

    /// The bystander connection is unaffected and the victim QP still works.
    fn all_well(&mut self) {
        self.untouched();
        self.works(false);
        self.works(true);
    }

    /// The victim QP answers an in-sequence WRITE (for tests whose hostile frames used
    /// A's PSNs, so that A's own are stale): an ACK, and the bytes in place.
    fn still_answers(&mut self) {
        let psn = self.epsn();
        let data = [0xc3u8; 256];
        let p = self.write(self.vb.mr.rkey, self.vb.mr.addr + 40_000, &data);
        let o = self.inject(&[p.emit()]);
        assert_eq!(o.acks(), vec![(Syndrome::ACK, psn)]);
        assert_eq!(self.vb.mem.to_vec(40_000, 256).unwrap(), data);
        assert_eq!(self.epsn(), (psn + 1) & 0xff_ffff);
    }

    /// Hands B one request, built at the expected PSN, that the responder must refuse:
    /// one NAK with `code` for that PSN, counted, and the victim QP in ERR (IBA 9.9.2).
    fn refused(&mut self, p: Pkt, code: NakCode) {
        let psn = self.epsn();
        assert_eq!(p.psn, psn, "a refused request is built at the expected PSN");
        let counter = match code {
            NakCode::RemoteAccessError => "nak_rem_access_sent",
            NakCode::InvalidRequest => "nak_inv_req_sent",
            c => unreachable!("{c:?}"),
        };
        self.inject(&[p.emit()]).nak(code, psn, counter);
        self.victim_failed();
    }

    /// The victim QP on B is in ERR (IBA 9.9.2: a responder error ends the QP), its
    /// posted receives flushed; the bystander is unaffected.
    fn victim_failed(&mut self) {
        self.untouched();
        assert_eq!(self.s.b.qp_state(self.vb.qpn), Some(QpState::Err));
        self.works(false);
    }
}

struct Outcome {
    /// Frames B sent in reply.
    sent: Vec<Vec<u8>>,
    /// Counters that moved, and by how much.
    moved: Vec<(&'static str, u64)>,
}

impl Outcome {
    /// The AETH syndromes and PSNs of what B sent.
    fn acks(&self) -> Vec<(Syndrome, u32)> {
        self.sent
            .iter()
            .filter_map(|f| {
                let f = Frame::parse(f).ok()?;
                let a = f.roce().aeth()?;
                Some((a.syndrome(), f.roce().bth().psn().value()))
            })
            .collect()
    }

    fn moved(&self, want: &[(&str, u64)]) {
        let mut got = self.moved.clone();
        got.sort();
        let mut want = want.to_vec();
        want.sort();
        assert_eq!(got, want, "counters that moved");
    }

    /// Dropped silently: nothing sent, only `counter` moved (and rcvd_pkts, which counts
    /// every packet that passed the header and ICRC checks, when `checked`).
    fn dropped(&self, counter: &str, n: u64, checked: bool) {
        assert!(self.sent.is_empty(), "B answered a frame it must drop");
        if checked {
            self.moved(&[("rcvd_pkts", n), (counter, n)]);
        } else {
            self.moved(&[(counter, n)]);
        }
    }

    /// One NAK with `code` at `psn`, counted under `counter`.
    fn nak(&self, code: NakCode, psn: u32, counter: &'static str) {
        assert_eq!(self.acks(), vec![(Syndrome::Nak(code), psn)]);
        self.moved(&[
            ("rcvd_pkts", 1),
            ("sent_pkts", 1),
            ("acks_sent", 1),
            (counter, 1),
        ]);
    }
}

fn emit_all(p: &[Pkt]) -> Vec<Vec<u8>> {
    p.iter().map(Pkt::emit).collect()
}

// --- below the transport: the frame never reaches a QP ---

#[test]
fn bad_icrc_is_dropped_and_counted() {
    let mut bed = Bed::new();
    let mut f = bed
        .write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64])
        .emit();
    let n = f.len();
    f[n - 1] ^= 1;
    bed.inject(&[f]).dropped("drop_bad_icrc", 1, false);
    bed.all_well();
}

#[test]
fn a_frame_cut_at_every_length_is_dropped() {
    let mut bed = Bed::new();
    for p in [
        bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64]),
        bed.read(bed.vb.mr.rkey, bed.vb.mr.addr, 64),
        bed.fetch_add(bed.vb.mr.rkey, bed.vb.mr.addr),
    ] {
        let full = p.emit();
        let need = BTH + 12 + p.op.info().unwrap().ext_len + 4;
        // As cut on the wire: the IP header still claims the whole length.
        let cut: Vec<Vec<u8>> = (0..full.len()).map(|k| full[..k].to_vec()).collect();
        let o = bed.inject(&cut);
        assert!(o.sent.is_empty());
        let dropped: u64 = o
            .moved
            .iter()
            .filter(|(c, _)| *c == "drop_malformed" || *c == "drop_not_roce")
            .map(|(_, n)| n)
            .sum();
        assert_eq!(dropped, full.len() as u64, "{:?}", o.moved);
        assert_eq!(o.moved.len(), dropped_kinds(&o), "{:?}", o.moved);
        // Cut inside the RoCE packet with IP and UDP lengths that agree: a packet too
        // short for its headers, or off the 4-byte boundary, is malformed; any other
        // fails its ICRC.
        for k in BTH..full.len() {
            let mut f = full[..k].to_vec();
            fix_lengths(&mut f);
            let o = bed.inject(&[f]);
            if k < need || !(k - BTH).is_multiple_of(4) {
                o.dropped("drop_malformed", 1, false);
            } else {
                o.dropped("drop_bad_icrc", 1, false);
            }
        }
    }
    bed.all_well();
}

fn dropped_kinds(o: &Outcome) -> usize {
    o.moved
        .iter()
        .filter(|(c, _)| *c == "drop_malformed" || *c == "drop_not_roce")
        .count()
}

#[test]
fn tver_other_than_zero_is_dropped() {
    // IBA 9.2: TVer is 0; a packet with another version is dropped.
    let mut bed = Bed::new();
    let mut frames = Vec::new();
    for tver in 1..16u8 {
        let mut f = bed
            .write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64])
            .emit();
        f[BTH + 1] |= tver;
        reseal(&mut f);
        frames.push(f);
    }
    bed.inject(&frames).dropped("drop_malformed", 15, false);
    bed.all_well();
}

#[test]
fn wrong_pkey_is_dropped() {
    // IBA 9.6.1.1 / C9-42: a P_Key that matches no entry of the table is dropped.
    let mut bed = Bed::new();
    let frames = bed.writes_with(&[0x0000, 0x1234, 0x8001, 0x7ffe], |p, v| p.pkey = v as u16);
    // Checked before the ICRC (a header field is cheaper than a CRC), so the frames do
    // not count as received.
    bed.inject(&frames).dropped("drop_bad_pkey", 4, false);
    bed.all_well();
}

#[test]
fn unknown_qpn_is_dropped() {
    let mut bed = Bed::new();
    let frames = bed.writes_with(&[0x00_0000, 0x00_00ff, 0x12_3456, 0xff_fffe], |p, v| {
        p.qpn = v
    });
    bed.inject(&frames).dropped("drop_unknown_qp", 4, false);
    bed.all_well();
}

#[test]
fn a_source_other_than_the_qps_peer_is_dropped() {
    // IBA 9.6.1.2 (C9-47 for RoCE: the source GID of a connected QP's packets is its
    // path's destination): a spoofed QPN from another address cannot reach the QP.
    let mut bed = Bed::new();
    let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64]);
    p.src_ip = Ipv4Addr::new(198, 18, 0, 99);
    bed.inject(&[p.emit()]).dropped("drop_wrong_path", 1, true);
    bed.all_well();
}

#[test]
fn a_qp_in_reset_init_or_err_takes_no_request() {
    // IBA 10.3.1: only RTR and later states receive; RESET, INIT and ERR drop.
    let mut bed = Bed::new();
    let b = &mut bed.s.b;
    let mut qps = Vec::new();
    for state in [QpState::Reset, QpState::Init, QpState::Err] {
        let mut init = QpInitAttr::new(QpType::Rc, bed.vb.pd, bed.vb.cq);
        init.cap.max_send_wr = 16;
        init.cap.max_recv_wr = 16;
        let qpn = b.create_qp(&init).unwrap();
        if state != QpState::Reset {
            let attr = QpAttr {
                qp_state: QpState::Init,
                qp_access_flags: ALL_ACCESS,
                ..QpAttr::default()
            };
            let m = QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS;
            b.modify_qp(qpn, &attr, m).unwrap();
        }
        if state == QpState::Err {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            b.modify_qp(qpn, &attr, QpAttrMask::STATE).unwrap();
        }
        assert_eq!(b.qp_state(qpn), Some(state));
        qps.push(qpn);
    }
    let mut frames = Vec::new();
    for &qpn in &qps {
        for psn in [0, PSN_A] {
            let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64]);
            p.qpn = qpn;
            p.psn = psn;
            frames.push(p.emit());
        }
    }
    bed.inject(&frames).dropped("drop_wrong_state", 6, true);
    bed.all_well();
}

#[test]
fn a_ud_send_with_the_wrong_qkey_is_dropped_and_takes_no_receive() {
    // IBA 10.2.4 / C10-15: a UD packet whose Q_Key differs from the QP's is dropped.
    let mut bed = Bed::new();
    let ud = side(&mut bed.s.b, QpType::Ud, 8192, 64);
    connect(
        &mut bed.s.b,
        ud.qpn,
        QpType::Ud,
        0,
        IP_A,
        Mtu::Mtu1024,
        0,
        0,
        |_| {},
    );
    bed.s
        .b
        .post_recv(ud.qpn, &RecvWr::new(77, &[sge(&ud, 0, 2048)]))
        .unwrap();
    let send = |qkey: u32| {
        let ext = ExtRepr {
            deth: Some(DethRepr { qkey, src_qp: 0x42 }),
            ..ExtRepr::default()
        };
        let mut p = bed.pkt(Opcode::UD_SEND_ONLY, 9, ext, &[0x77; 100]);
        p.qpn = ud.qpn;
        p.emit()
    };
    let frames: Vec<Vec<u8>> = [0, 0x1111_1110, 0x8000_0000]
        .into_iter()
        .map(send)
        .collect();
    let good = send(0x1111_1111);
    bed.inject(&frames).dropped("drop_bad_qkey", 3, true);
    assert_eq!(bed.s.b.recv_queue_len(ud.qpn), 1, "a receive was consumed");
    assert!(ud.mem.to_vec(0, 2048).unwrap().iter().all(|&x| x == 0));
    // The right Q_Key gets through to the same receive.
    let o = bed.inject(&[good]);
    o.moved(&[("rcvd_pkts", 1), ("rdma_recvs", 1)]);
    let wc = bed.s.b.poll_cq_one(ud.cq).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (77, WcStatus::Success, 140)
    );
    assert_eq!(ud.mem.to_vec(40, 100).unwrap(), vec![0x77; 100]);
    bed.all_well();
}

// --- the responder's checks (IBA 9.7.5.1) ---

#[test]
fn a_bad_rkey_gets_a_remote_access_nak() {
    let mut bed = Bed::new();
    let rkey = bed.vb.mr.rkey ^ 0x100;
    bed.refused(
        bed.write(rkey, bed.vb.mr.addr, &[0xee; 64]),
        NakCode::RemoteAccessError,
    );
}

#[test]
fn an_rkey_of_another_pd_gets_a_remote_access_nak() {
    // IBA 10.6.3.1 (C10-?): an R_Key is valid only on QPs of its own PD.
    let mut bed = Bed::new();
    let (rkey, va) = (bed.other_pd.rkey, bed.other_pd.addr);
    bed.refused(bed.read(rkey, va, 64), NakCode::RemoteAccessError);
}

#[test]
fn a_range_that_wraps_past_2_64_gets_a_remote_access_nak() {
    let mut bed = Bed::new();
    let rkey = bed.vb.mr.rkey;
    bed.refused(
        bed.write(rkey, u64::MAX - 31, &[0xee; 64]),
        NakCode::RemoteAccessError,
    );

    let mut bed = Bed::new();
    let rkey = bed.vb.mr.rkey;
    bed.refused(
        bed.read(rkey, bed.vb.mr.addr.wrapping_neg(), 4096),
        NakCode::RemoteAccessError,
    );
}

#[test]
fn a_length_over_2_31_gets_an_invalid_request_nak() {
    // IBA 9.4.3 / C9-24: a DMA length above 2^31 is not a valid RDMA request.
    let mut bed = Bed::new();
    let (rkey, va) = (bed.vb.mr.rkey, bed.vb.mr.addr);
    bed.refused(bed.read(rkey, va, 0x8000_0001), NakCode::InvalidRequest);

    let mut bed = Bed::new();
    let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 1024]);
    p.op = Opcode::RC_RDMA_WRITE_FIRST;
    p.ext.reth.as_mut().unwrap().dma_len = 0xffff_ffff;
    bed.refused(p, NakCode::InvalidRequest);
}

#[test]
fn read_and_atomic_without_permission_are_refused() {
    // The region forbids it: the R_Key check fails (IBA 9.7.5.1.4, C9-?): REMOTE ACCESS.
    let mut bed = Bed::new();
    let (rkey, va) = (bed.ro.rkey, bed.ro.addr);
    bed.refused(bed.fetch_add(rkey, va), NakCode::RemoteAccessError);
    let mut bed = Bed::new();
    bed.refused(bed.write(rkey, va, &[0xee; 64]), NakCode::RemoteAccessError);

    // The QP forbids it (qp_access_flags without REMOTE_READ / REMOTE_ATOMIC): the
    // operation is not valid on this QP (IBA 9.7.5.1.2; rxe's check_op_valid): INVALID
    // REQUEST.
    for atomic in [false, true] {
        let mut bed = Bed::new();
        let attr = QpAttr {
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        bed.s
            .b
            .modify_qp(bed.vb.qpn, &attr, QpAttrMask::ACCESS_FLAGS)
            .unwrap();
        let psn = bed.epsn();
        let (rkey, va) = (bed.vb.mr.rkey, bed.vb.mr.addr);
        let p = if atomic {
            bed.fetch_add(rkey, va)
        } else {
            bed.read(rkey, va, 64)
        };
        let o = bed.inject(&[p.emit()]);
        o.nak(NakCode::InvalidRequest, psn, "nak_inv_req_sent");
        bed.victim_failed();
    }
}

#[test]
fn a_misaligned_atomic_gets_an_invalid_request_nak() {
    // IBA 9.4.5 (C9-37): atomics need an 8-byte aligned VA.
    for off in [1, 4, 7] {
        let mut bed = Bed::new();
        bed.refused(
            bed.fetch_add(bed.vb.mr.rkey, bed.vb.mr.addr + off),
            NakCode::InvalidRequest,
        );
    }
}

#[test]
fn a_psn_far_ahead_gets_one_sequence_nak_then_silence() {
    // IBA 9.7.5.1.1 (C9-84): an out-of-sequence request gets one PSN SEQUENCE ERROR
    // NAK for the expected PSN; later ones are dropped until the expected PSN arrives.
    let mut bed = Bed::new();
    let epsn = bed.epsn();
    let ahead = |bed: &Bed, d: u32| {
        let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64]);
        p.psn = epsn + d;
        p.emit()
    };
    let o = bed.inject(&[ahead(&bed, 1 << 22)]);
    assert_eq!(
        o.acks(),
        vec![(Syndrome::Nak(NakCode::PsnSequenceError), epsn)]
    );
    o.moved(&[
        ("rcvd_pkts", 1),
        ("out_of_seq_request", 1),
        ("nak_seq_sent", 1),
        ("acks_sent", 1),
        ("sent_pkts", 1),
    ]);
    let frames = [
        ahead(&bed, 1),
        ahead(&bed, 1000),
        ahead(&bed, (1 << 23) - 1),
    ];
    bed.inject(&frames).dropped("drop_silent_request", 3, true);
    assert_eq!(bed.epsn(), epsn);
    bed.all_well();
}

#[test]
fn a_psn_far_behind_is_a_duplicate_acknowledged_not_executed() {
    // IBA 9.7.5.1.2 (C9-105): a duplicate SEND/WRITE is acknowledged again (with the
    // last PSN executed) and not executed a second time.
    let mut bed = Bed::new();
    bed.works(true); // some history: PSNs before the expected one were executed
    bed.vb.mem.write(0, &pattern(MEM, 1)).unwrap();
    let epsn = bed.epsn();
    let mut frames = Vec::new();
    for back in [1, 2, 1000, (1 << 23)] {
        let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64]);
        p.psn = epsn.wrapping_sub(back);
        frames.push(p.emit());
    }
    let o = bed.inject(&frames);
    // One ACK for the four (ACKs are cumulative: one not yet sent is replaced), with
    // the PSN of the last WRITE executed (`works` sent WRITE PSNs 100-102, then a READ
    // at 103-105). Not the READ's: an ACK covering a READ tells its requester the
    // responses were lost.
    assert_eq!(o.acks(), vec![(Syndrome::ACK, PSN_A + 2)]);
    o.moved(&[
        ("rcvd_pkts", 4),
        ("duplicate_request", 4),
        ("acks_sent", 1),
        ("sent_pkts", 1),
    ]);
    assert_eq!(bed.epsn(), epsn);
    bed.all_well();
}

#[test]
fn a_duplicate_read_with_a_changed_range_is_not_answered() {
    // IBA 9.7.5.1.2 (o9-?): a re-sent READ may ask for the rest of the original range
    // from a later PSN; one that asks for more, elsewhere, or under another key is not
    // a retransmission and gets no data.
    let mut bed = Bed::new();
    let first = bed.epsn();
    let (rkey, va) = (bed.vb.mr.rkey, bed.vb.mr.addr);
    // The READ A really sent: 4 KiB at va+8192, PSNs first..first+3.
    let o = bed.inject(&[bed.read(rkey, va + 8192, 4096).emit()]);
    assert_eq!(o.sent.len(), 4);
    let again = |bed: &Bed, psn: u32, rkey: u32, va: u64, len: u32| {
        let mut p = bed.read(rkey, va, len);
        p.psn = psn;
        p.emit()
    };
    let changed = [
        again(&bed, first, rkey, va + 8192, 8192),        // longer
        again(&bed, first, rkey, va + 4096, 4096),        // starts before
        again(&bed, first, rkey, va + 12288, 1024),       // past its end
        again(&bed, first, bed.ro.rkey, bed.ro.addr, 64), // another key
        again(&bed, first + 1, rkey, va, 1024),           // a later PSN, outside the range
    ];
    let o = bed.inject(&changed);
    assert!(o.sent.is_empty(), "a changed READ was answered");
    o.moved(&[
        ("rcvd_pkts", 5),
        ("duplicate_request", 5),
        ("drop_silent_request", 5),
    ]);
    // The legitimate partial retry (the last 2 KiB from PSN first+2) is answered with
    // exactly those bytes.
    let retry = again(&bed, first + 2, rkey, va + 8192 + 2048, 2048);
    let o = bed.inject(&[retry]);
    let data: Vec<u8> = o
        .sent
        .iter()
        .flat_map(|f| Frame::parse(f).unwrap().roce().payload().to_vec())
        .collect();
    assert_eq!(data, bed.vb.mem.to_vec(8192 + 2048, 2048).unwrap());
    // The attacker spoke as A with A's PSNs, so A's own next PSN is stale now: the QP
    // keeps answering at the PSN it expects.
    bed.untouched();
    bed.works(false);
    bed.still_answers();
}

#[test]
fn middle_or_last_without_first_gets_an_invalid_request_nak() {
    // IBA 9.7.5.1.3 (C9-93): a MIDDLE or LAST that does not continue a message is an
    // invalid request.
    for op in [
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_SEND_MIDDLE,
        Opcode::RC_SEND_LAST,
    ] {
        let mut bed = Bed::new();
        bed.s
            .b
            .post_recv(bed.vb.qpn, &RecvWr::new(5, &[sge(&bed.vb, 0, 4096)]))
            .unwrap();
        let psn = bed.epsn();
        let p = bed.pkt(op, psn, ExtRepr::default(), &[0xee; 1024]);
        let o = bed.inject(&[p.emit()]);
        o.nak(NakCode::InvalidRequest, psn, "nak_inv_req_sent");
        // The receive posted on the victim is flushed, not filled.
        let wc = bed.s.b.poll_cq_one(bed.vb.cq).unwrap();
        assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
        bed.victim_failed();
    }
}

#[test]
fn a_payload_longer_than_the_path_mtu_gets_an_invalid_request_nak() {
    // IBA 9.7.5.1.5 (C9-95): ONLY carries at most one path MTU, FIRST and MIDDLE
    // exactly one. The port allows 4096 here, the QP's path 1024.
    let path_1024 = |a: &mut QpAttr| a.path_mtu = Mtu::Mtu1024;
    for (op, len) in [
        (Opcode::RC_RDMA_WRITE_ONLY, 1028),
        (Opcode::RC_RDMA_WRITE_ONLY, 4096),
        (Opcode::RC_RDMA_WRITE_FIRST, 2048),
        (Opcode::RC_RDMA_WRITE_FIRST, 1020),
    ] {
        let mut bed = Bed::with(Mtu::Mtu4096, path_1024, path_1024);
        let mut p = bed.write(bed.vb.mr.rkey, bed.vb.mr.addr, &vec![0xee; len]);
        p.op = op;
        p.ext.reth.as_mut().unwrap().dma_len = 8192;
        bed.refused(p, NakCode::InvalidRequest);
    }
}

#[test]
fn a_pad_count_inconsistent_with_the_length_is_refused() {
    // A PadCnt larger than the bytes after the headers, or payload and pad that do not
    // end on a 4-byte boundary (IBA 9.2: PadCnt pads the payload to a multiple of 4;
    // every header is whole 4-byte words), make a malformed packet: dropped.
    let mut bed = Bed::new();
    let mut frames = Vec::new();
    for (payload, pad, cut) in [
        (0usize, 1u8, 0),
        (0, 3, 0),
        (61, 0, 3),
        (62, 1, 1),
        (9, 2, 1),
    ] {
        let mut f = bed
            .write(bed.vb.mr.rkey, bed.vb.mr.addr, &vec![0xee; payload])
            .emit();
        f[BTH + 1] = (f[BTH + 1] & !0x30) | (pad << 4);
        // Cut pad bytes emit added, so what follows the headers is off the boundary.
        let icrc_at = f.len() - 4;
        f.drain(icrc_at - cut..icrc_at);
        fix_lengths(&mut f);
        reseal(&mut f);
        frames.push(f);
    }
    bed.inject(&frames).dropped("drop_malformed", 5, false);
    // A pad that keeps the boundary but makes the payload (61 bytes) disagree with the
    // RETH's length (64): the length check (IBA 9.7.5.1.5, C9-95) refuses it.
    let psn = bed.epsn();
    let mut f = bed
        .write(bed.vb.mr.rkey, bed.vb.mr.addr, &[0xee; 64])
        .emit();
    f[BTH + 1] |= 3 << 4;
    reseal(&mut f);
    let o = bed.inject(&[f]);
    o.nak(NakCode::InvalidRequest, psn, "nak_inv_req_sent");
    bed.victim_failed();
}

#[test]
fn reads_beyond_max_dest_rd_atomic_are_dropped_then_retried_to_completion() {
    // A requester that ignores the responder's max_dest_rd_atomic (4 here, its own
    // max_rd_atomic 16): the READs beyond the bound are dropped, not queued; the
    // requester's retries fetch them once the queued replies are out.
    let mut bed = Bed::with(
        Mtu::Mtu1024,
        |a| a.timeout = 8,
        |a| a.max_dest_rd_atomic = 4,
    );
    let (a, b) = (&bed.va, &bed.vb);
    for i in 0..12u64 {
        bed.s
            .a
            .post_send(
                a.qpn,
                &SendWr::read(
                    i,
                    &[sge(a, 1024 * i as usize, 1024)],
                    b.mr.addr + 1024 * i,
                    b.mr.rkey,
                ),
            )
            .unwrap();
    }
    let (wcs, _, stop) = run_for_completions(&mut bed.s, a.cq, 12, b.cq, 0, 20);
    assert_eq!(stop, Stop::Done);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(
        a.mem.to_vec(0, 12 * 1024).unwrap(),
        b.mem.to_vec(0, 12 * 1024).unwrap()
    );
    assert!(bed.s.b.counters().drop_rd_atomic_overflow >= 8);
    // A hostile flood of atomics at once: only 4 executed (the counter moved by 4).
    let mut bed = Bed::with(Mtu::Mtu1024, |_| {}, |a| a.max_dest_rd_atomic = 4);
    let first = bed.epsn();
    let frames: Vec<Vec<u8>> = (0..10)
        .map(|i| {
            let mut p = bed.fetch_add(bed.vb.mr.rkey, bed.vb.mr.addr);
            p.psn = first + i;
            p.emit()
        })
        .collect();
    let before = bed.vb.mem.to_vec(0, 8).unwrap();
    let o = bed.inject(&frames);
    assert_eq!(o.sent.len(), 4);
    o.moved(&[
        ("rcvd_pkts", 10),
        ("acks_sent", 4),
        ("sent_pkts", 4),
        ("drop_rd_atomic_overflow", 6),
    ]);
    let after = bed.vb.mem.to_vec(0, 8).unwrap();
    let v = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap());
    assert_eq!(v(&after), v(&before).wrapping_add(4));
    bed.vb.mem.write(0, &before).unwrap();
    bed.untouched();
    bed.works(false);
    bed.still_answers();
}

// --- the completer's checks (IBA 9.7.5.2) ---

#[test]
fn acks_of_psns_never_sent_are_dropped() {
    // IBA 9.7.5.2.1 (C9-120): an ACK for a PSN outside the outstanding window is a
    // ghost and is dropped; it must not complete a WR.
    let mut bed = Bed::new();
    // Nothing outstanding yet.
    let o = bed.inject(&emit_all(&[
        bed.ack(PSN_B, Syndrome::ACK),
        bed.ack(PSN_B + 10, Syndrome::ACK),
    ]));
    o.dropped("drop_stale_response", 2, true);
    // One WRITE in flight (PSN_B): ACKs of PSN_B+1 and beyond were never sent.
    assert_eq!(bed.b_writes().len(), 1);
    let o = bed.inject(&emit_all(&[
        bed.ack(PSN_B + 1, Syndrome::ACK),
        bed.ack(PSN_B + 1000, Syndrome::ACK),
        bed.ack(PSN_B + (1 << 23) - 1, Syndrome::ACK),
    ]));
    o.dropped("drop_stale_response", 3, true);
    assert!(
        bed.s.b.poll_cq_one(bed.vb.cq).is_none(),
        "a ghost ACK completed a WR"
    );
    // The WRITE is still outstanding: it is retransmitted and completes.
    let (_, wcs, stop) = run_for_completions(&mut bed.s, bed.va.cq, 0, bed.vb.cq, 1, 5);
    assert_eq!(stop, Stop::Done);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    assert!(bed.s.b.counters().timeouts >= 1);
    bed.untouched();
    bed.works(false);
    bed.works(true);
}

#[test]
fn naks_with_reserved_codes_end_the_wr_with_rem_op_err() {
    // A NAK code of 5-31 is reserved (IBA table 45). rxe's completer treats it as a
    // remote operational error; so does roce-xdp. A reserved syndrome type (binary 10)
    // is not a NAK at all and is dropped.
    for code in [5u8, 17, 31] {
        let mut bed = Bed::new();
        bed.b_writes();
        let o = bed.inject(&[bed.ack(PSN_B, Syndrome::from_byte(0x60 | code)).emit()]);
        assert!(o.sent.is_empty());
        let wc = bed.s.b.poll_cq_one(bed.vb.cq).unwrap();
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemOpErr));
        assert_eq!(bed.s.b.qp_state(bed.vb.qpn), Some(QpState::Err));
        bed.untouched();
        bed.works(false);
    }
    let mut bed = Bed::new();
    bed.b_writes();
    let o = bed.inject(&emit_all(&[
        bed.ack(PSN_B, Syndrome::from_byte(0x40)),
        bed.ack(PSN_B, Syndrome::from_byte(0x5f)),
        bed.ack(PSN_B, Syndrome::from_byte(0x80)),
    ]));
    o.dropped("drop_stale_response", 3, true);
    assert!(bed.s.b.poll_cq_one(bed.vb.cq).is_none());
    let (_, wcs, stop) = run_for_completions(&mut bed.s, bed.va.cq, 0, bed.vb.cq, 1, 5);
    assert_eq!(stop, Stop::Done);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::Success));
    bed.untouched();
    bed.works(false);
    bed.works(true);
}

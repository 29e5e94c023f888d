//! The Communication Manager on QP1 between two engines over the simulated link: the
//! connection protocol both ways, its refusals, retries, timeouts, duplicates and
//! disconnects, SIDR, and what it answers to MADs it does not serve.

mod common;
use common::*;
use roce_xdp::engine::Engine;
use roce_xdp::engine::cm::{self, AcceptParams, CmEvent, ConnectParams, SidrParams};
use roce_xdp::link::sim::{LinkConfig, Sim, Stop};
use roce_xdp::time::Time;
use roce_xdp::verbs::device::gid_of;
use roce_xdp::verbs::*;
use roce_xdp::wire::{
    BthRepr, DethRepr, EthRepr, ExtRepr, Frame, FrameRepr, IpRepr, Ipv4Repr, Opcode, Psn,
    ROCE_V2_PORT, RoceRepr, UdpRepr, cm as wcm, mad,
};
use std::net::IpAddr;

/// rdma_cm's TCP port space, port 7174 (as `rping -p 7174` asks).
const SID: u64 = 0x0106_0000 | 7174;
/// A short CM response timeout (4.096 us x 2^12 = 16.8 ms) so runs stay brief.
const T: u8 = 12;

/// What the passive side answers with: its QP, its PSN (what it expects), its data.
fn acc(qpn: u32, psn: u32, private_data: Vec<u8>) -> AcceptParams {
    AcceptParams {
        qpn,
        starting_psn: psn,
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        srq: false,
        private_data,
    }
}

/// B, on A's connect request `id`: its QP to RTS (sending from A's Starting PSN
/// 0x1234, expecting `psn`), then the REP.
fn accept_on_b(s: &mut Sim<Engine, Engine>, sa: &Side, sb: &Side, id: u32, psn: u32, pd: Vec<u8>) {
    connect(
        &mut s.b,
        sb.qpn,
        QpType::Rc,
        sa.qpn,
        IP_A,
        Mtu::Mtu1024,
        0x1234,
        psn,
        |_| {},
    );
    s.b.cm_accept(id, &acc(sb.qpn, psn, pd)).unwrap();
}

/// A, on B's REP with Starting PSN `psn`: its QP to RTS (sending from it, expecting
/// 0x1234).
fn ready_on_a(s: &mut Sim<Engine, Engine>, sa: &Side, sb: &Side, psn: u32) {
    connect(
        &mut s.a,
        sa.qpn,
        QpType::Rc,
        sb.qpn,
        IP_B,
        Mtu::Mtu1024,
        psn,
        0x1234,
        |_| {},
    );
}

fn params(qpn: u32) -> ConnectParams {
    let mut p = ConnectParams::new(qpn, SID, gid_of(IpAddr::V4(IP_B)), 1);
    p.starting_psn = 0x1234;
    p.cm_response_timeout = T;
    p.max_cm_retries = 3;
    p.private_data = b"hello from A".to_vec();
    p
}

/// Runs until one side has an event, and takes it (with the side: 0 for A, 1 for B).
fn next_event(s: &mut Sim<Engine, Engine>) -> Option<(usize, CmEvent)> {
    let mut got = None;
    let stop = s.run_until(s.now.add_nanos(60_000_000_000), 1_000_000, |a, b| {
        if let Some(e) = a.poll_cm_event() {
            got = Some((0, e));
        } else if let Some(e) = b.poll_cm_event() {
            got = Some((1, e));
        }
        got.is_some()
    });
    if stop != Stop::Done {
        return None;
    }
    got
}

/// A and B with an RC QP each; B listens.
fn setup(ab: LinkConfig, ba: LinkConfig, seed: u64) -> (Sim<Engine, Engine>, Side, Side) {
    let (mut a, mut b) = pair(Mtu::Mtu1024, seed);
    let sa = side(&mut a, QpType::Rc, 1 << 16, 64);
    let sb = side(&mut b, QpType::Rc, 1 << 16, 64);
    b.cm_listen(SID).unwrap();
    (sim(a, b, ab, ba, seed), sa, sb)
}

/// The whole handshake as rdma_cm drives it, then a SEND over the connected QPs. Each
/// side's Starting PSN is the one its QP expects (its rq_psn); the peer sends from it.
fn handshake(s: &mut Sim<Engine, Engine>, sa: &Side, sb: &Side) -> (u32, u32) {
    let ida = s.a.cm_connect(&params(sa.qpn)).unwrap();
    let Some((1, CmEvent::ConnectRequest { id: idb, req })) = next_event(s) else {
        panic!("no connect request")
    };
    assert_eq!(req.service_id, SID);
    assert_eq!(req.remote_qpn, sa.qpn);
    assert_eq!(req.starting_psn, 0x1234);
    assert_eq!(req.qp_type, QpType::Rc);
    assert_eq!(req.path_mtu, Some(Mtu::Mtu1024));
    assert_eq!(req.remote_gid, gid_of(IpAddr::V4(IP_A)));
    assert_eq!(req.local_gid, gid_of(IpAddr::V4(IP_B)));
    assert!(req.private_data.starts_with(b"hello from A"));
    assert_eq!(req.private_data.len(), wcm::REQ_PDATA);
    accept_on_b(s, sa, sb, idb, 0x5678, b"welcome".to_vec());
    assert!(
        s.b.cm_accept(idb, &acc(sb.qpn, 0x5678, vec![])).is_err(),
        "a connection is accepted once"
    );
    let Some((0, CmEvent::ConnectResponse { id, rep })) = next_event(s) else {
        panic!("no connect response")
    };
    assert_eq!(id, ida);
    assert_eq!(rep.remote_qpn, sb.qpn);
    assert_eq!(rep.starting_psn, 0x5678);
    assert!(rep.private_data.starts_with(b"welcome"));
    ready_on_a(s, sa, sb, 0x5678);
    s.a.cm_establish(ida, &[]).unwrap();
    assert_eq!(s.a.poll_cm_event(), Some(CmEvent::Established { id: ida }));
    let Some((1, CmEvent::Established { id })) = next_event(s) else {
        panic!("B not established")
    };
    assert_eq!(id, idb);
    // The connection carries data.
    sa.mem.write(0, b"over the CM").unwrap();
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(sb, 0, 64)]))
        .unwrap();
    s.a.post_send(sa.qpn, &SendWr::send(2, &[sge(sa, 0, 11)]))
        .unwrap();
    let (_, wb, stop) = run_for_completions(s, sa.cq, 1, sb.cq, 1, 10);
    assert_eq!(stop, Stop::Done);
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(sb.mem.to_vec(0, 11).unwrap(), b"over the CM");
    (ida, idb)
}

#[test]
fn connect_accept_rtu_send_and_disconnect() {
    let (mut s, sa, sb) = setup(LinkConfig::default(), LinkConfig::default(), 1);
    let (ida, idb) = handshake(&mut s, &sa, &sb);
    s.a.cm_disconnect(ida, &[]).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(next_event(&mut s).expect("a disconnect event"));
    }
    got.sort_by_key(|g| g.0);
    assert_eq!(got[0], (0, CmEvent::Disconnected { id: ida }));
    assert_eq!(got[1], (1, CmEvent::Disconnected { id: idb }));
    for e in [&s.a, &s.b] {
        let c = e.cm_counters();
        assert_eq!(c.established, 1);
        assert_eq!(c.mads_resent, 0, "{c:?}");
        assert_eq!(
            c.drop_malformed + c.drop_not_gsi + c.drop_unexpected,
            0,
            "{c:?}"
        );
    }
    // REQ REP RTU DREQ DREP: five MADs on the wire.
    assert_eq!(s.a.cm_counters().mads_sent + s.b.cm_counters().mads_sent, 5);
}

#[test]
fn nobody_listening_is_rejected_with_invalid_service_id() {
    let (mut s, sa, _sb) = setup(LinkConfig::default(), LinkConfig::default(), 2);
    let mut p = params(sa.qpn);
    p.service_id = SID + 1;
    let t0 = s.now;
    let id = s.a.cm_connect(&p).unwrap();
    let Some((0, CmEvent::Rejected { id: r, reason, .. })) = next_event(&mut s) else {
        panic!("no reject")
    };
    assert_eq!((r, reason), (id, cm::reason::INVALID_SERVICE_ID));
    assert_eq!(s.b.cm_counters().rej_sent, 1);
    // The REQ waited for a listener half its response timeout (16.8 ms / 2), no more:
    // A heard the REJ before it would have sent the REQ again.
    let took = s.now.since(t0).as_nanos() as u64;
    let half = cm::timeout_ns(T) / 2;
    assert!((half..half + 1_000_000).contains(&took), "{took} ns");
    assert_eq!(s.b.cm_counters().reqs_held, 1);
    assert_eq!(s.a.cm_counters().mads_resent, 0);
}

/// perftest `-R`'s server listens for the test's connection only after the handshake
/// its client connects right after: a REQ that comes before the listener waits for it.
#[test]
fn a_req_just_before_its_listener_is_taken_by_it() {
    let (mut s, sa, sb) = setup(LinkConfig::default(), LinkConfig::default(), 21);
    s.b.cm_unlisten(SID);
    let ida = s.a.cm_connect(&params(sa.qpn)).unwrap();
    // The REQ reaches B, which has nobody listening: nothing is answered yet.
    let until = s.now.add_nanos(2_000_000);
    let stop = s.run_until(until, 1_000_000, |_, b| b.cm_counters().reqs_held == 1);
    assert_eq!(stop, Stop::Done);
    let stop = s.run_until(until, 1_000_000, |a, b| {
        a.poll_cm_event().is_some() || b.poll_cm_event().is_some()
    });
    assert_ne!(stop, Stop::Done, "an event before anybody listened");
    assert_eq!(s.b.cm_counters().mads_sent, 0);
    // The listener comes: it gets the REQ, and the connection forms as usual.
    s.b.cm_listen(SID).unwrap();
    let Some((1, CmEvent::ConnectRequest { id: idb, req })) = next_event(&mut s) else {
        panic!("the listener did not get the REQ")
    };
    assert_eq!(req.remote_qpn, sa.qpn);
    assert!(req.private_data.starts_with(b"hello from A"));
    accept_on_b(&mut s, &sa, &sb, idb, 0x5678, vec![]);
    let Some((0, CmEvent::ConnectResponse { id, .. })) = next_event(&mut s) else {
        panic!("no connect response")
    };
    assert_eq!(id, ida);
    assert_eq!(s.b.cm_counters().rej_sent, 0);
    assert_eq!(s.a.cm_counters().rej_rcvd, 0);
}

/// A REQ seen twice while it waits for a listener is kept once and refused once.
#[test]
fn a_waiting_req_sent_twice_is_refused_once() {
    let dup = LinkConfig {
        duplicate: 1.0,
        ..LinkConfig::default()
    };
    let (mut s, sa, _sb) = setup(dup, LinkConfig::default(), 22);
    let mut p = params(sa.qpn);
    p.service_id = SID + 1;
    let id = s.a.cm_connect(&p).unwrap();
    let Some((0, CmEvent::Rejected { id: r, reason, .. })) = next_event(&mut s) else {
        panic!("no reject")
    };
    assert_eq!((r, reason), (id, cm::reason::INVALID_SERVICE_ID));
    let c = s.b.cm_counters();
    assert_eq!((c.mads_rcvd, c.reqs_held, c.drop_stale), (2, 1, 1), "{c:?}");
    assert_eq!(c.rej_sent, 1, "{c:?}");
}

/// At most 32 REQs wait for a listener: the 33rd is refused at once, the 32 when their
/// hold ends, each with REJ 8.
#[test]
fn a_req_past_the_full_hold_is_refused_at_once() {
    let (mut s, _sa, _sb) = setup(LinkConfig::default(), LinkConfig::default(), 23);
    let t0 = s.now;
    let mut ids = Vec::new();
    for _ in 0..33 {
        let qpn = side(&mut s.a, QpType::Rc, 4096, 4).qpn;
        let mut p = params(qpn);
        p.service_id = SID + 1;
        ids.push(s.a.cm_connect(&p).unwrap());
    }
    let half = cm::timeout_ns(T) / 2;
    let mut rejected = Vec::new();
    let take = |a: &mut Engine, rejected: &mut Vec<u32>| {
        while let Some(e) = a.poll_cm_event() {
            if let CmEvent::Rejected { id, reason, .. } = e {
                assert_eq!(reason, cm::reason::INVALID_SERVICE_ID);
                rejected.push(id);
            }
        }
    };
    // Well before any hold ends, the REQ past the 32 held is refused, and only it.
    let stop = s.run_until(t0.add_nanos(half / 4), u64::MAX, |a, _| {
        take(a, &mut rejected);
        !rejected.is_empty()
    });
    assert_eq!(stop, Stop::Done, "nothing refused at once");
    assert_eq!(rejected, [ids[32]]);
    let c = s.b.cm_counters();
    assert_eq!((c.reqs_held, c.rej_sent), (32, 1), "{c:?}");
    // The others when their hold ends.
    let stop = s.run_until(t0.add_nanos(half * 3 / 2), u64::MAX, |a, _| {
        take(a, &mut rejected);
        rejected.len() == 33
    });
    assert_eq!(stop, Stop::Done, "{} of 33 rejected", rejected.len());
    assert!(s.now.since(t0).as_nanos() >= u128::from(half));
    rejected.sort_unstable();
    ids.sort_unstable();
    assert_eq!(rejected, ids);
    let c = s.b.cm_counters();
    assert_eq!(
        (c.reqs_held, c.rej_sent, c.drop_stale),
        (32, 33, 0),
        "{c:?}"
    );
}

#[test]
fn consumer_reject_carries_its_private_data() {
    let (mut s, sa, _sb) = setup(LinkConfig::default(), LinkConfig::default(), 3);
    let id = s.a.cm_connect(&params(sa.qpn)).unwrap();
    let Some((1, CmEvent::ConnectRequest { id: idb, .. })) = next_event(&mut s) else {
        panic!()
    };
    s.b.cm_reject(idb, cm::reason::CONSUMER_REJECT, b"go away")
        .unwrap();
    let Some((
        0,
        CmEvent::Rejected {
            id: r,
            reason,
            private_data,
        },
    )) = next_event(&mut s)
    else {
        panic!("no reject")
    };
    assert_eq!((r, reason), (id, cm::reason::CONSUMER_REJECT));
    assert!(private_data.starts_with(b"go away"));
    assert!(
        s.b.cm_accept(
            idb,
            &AcceptParams {
                qpn: 1,
                starting_psn: 0,
                responder_resources: 0,
                initiator_depth: 0,
                rnr_retry_count: 0,
                srq: false,
                private_data: vec![],
            }
        )
        .is_err()
    );
}

#[test]
fn an_unanswered_req_is_retried_then_unreachable() {
    // Nothing from A reaches B.
    let (mut s, sa, _sb) = setup(LinkConfig::lossy(1.0), LinkConfig::default(), 4);
    let t0 = s.now;
    let id = s.a.cm_connect(&params(sa.qpn)).unwrap();
    let Some((0, CmEvent::Unreachable { id: r })) = next_event(&mut s) else {
        panic!("no unreachable")
    };
    assert_eq!(r, id);
    // The REQ and its 3 retries, one response timeout apart, then the REJ "timeout".
    let waited = s.now.as_nanos() - t0.as_nanos();
    s.run_until(s.now.add_nanos(1_000), 100, |_, _| false);
    let c = s.a.cm_counters();
    assert_eq!(c.rej_sent, 1, "{c:?}");
    assert_eq!(c.mads_resent, 3, "{c:?}");
    assert_eq!(c.mads_sent, 5, "{c:?}");
    let one = cm::timeout_ns(T);
    assert!(waited >= 4 * one && waited < 5 * one, "{waited} ns");
}

#[test]
fn lost_mads_are_retried_and_never_make_a_second_connection() {
    // 40% of the frames lost, both ways: REQs, REPs and RTUs go missing and are repeated.
    let mut resent = 0;
    for seed in 10..16 {
        let (mut s, sa, sb) = setup(LinkConfig::lossy(0.4), LinkConfig::lossy(0.4), seed);
        let mut p = params(sa.qpn);
        p.max_cm_retries = 15;
        let ida = s.a.cm_connect(&p).unwrap();
        let mut requests = 0;
        let mut est = [false; 2];
        let mut idb = None;
        while !(est[0] && est[1]) {
            let Some((side, e)) = next_event(&mut s) else {
                panic!(
                    "seed {seed}: stalled; {:?} {:?}",
                    s.a.cm_counters(),
                    s.b.cm_counters()
                )
            };
            match (side, e) {
                (1, CmEvent::ConnectRequest { id, .. }) => {
                    requests += 1;
                    idb = Some(id);
                    accept_on_b(&mut s, &sa, &sb, id, 9, vec![]);
                }
                (0, CmEvent::ConnectResponse { id, .. }) => {
                    assert_eq!(id, ida);
                    ready_on_a(&mut s, &sa, &sb, 9);
                    s.a.cm_establish(id, &[]).unwrap();
                }
                (0, CmEvent::Established { .. }) => est[0] = true,
                (1, CmEvent::Established { id }) => {
                    assert_eq!(Some(id), idb);
                    est[1] = true;
                }
                (1, CmEvent::Unreachable { .. }) if !est[1] => {
                    // B's REP retries ran out before any RTU came: possible only if A
                    // established and its RTUs and data all got lost; not at 40%.
                    panic!("seed {seed}: B unreachable")
                }
                other => panic!("seed {seed}: unexpected {other:?}"),
            }
        }
        assert_eq!(
            requests, 1,
            "seed {seed}: a REQ seen again made a second connection"
        );
        resent += s.a.cm_counters().mads_resent + s.b.cm_counters().mads_resent;
    }
    assert!(resent > 5, "loss hit the handshakes only {resent} times");
}

#[test]
fn first_data_establishes_the_passive_side_without_the_rtu() {
    // Only the RTU is lost: B learns of the connection from A's first SEND.
    let (mut s, sa, sb) = setup(LinkConfig::default(), LinkConfig::default(), 5);
    let ida = s.a.cm_connect(&params(sa.qpn)).unwrap();
    let Some((1, CmEvent::ConnectRequest { id: idb, .. })) = next_event(&mut s) else {
        panic!()
    };
    accept_on_b(&mut s, &sa, &sb, idb, 7, vec![]);
    let Some((0, CmEvent::ConnectResponse { .. })) = next_event(&mut s) else {
        panic!()
    };
    ready_on_a(&mut s, &sa, &sb, 7);
    s.link.set_config(0, LinkConfig::lossy(1.0));
    s.a.cm_establish(ida, &[]).unwrap();
    assert_eq!(s.a.poll_cm_event(), Some(CmEvent::Established { id: ida }));
    // Let the RTU die on the link, then open it again for the data.
    s.run_until(s.now.add_nanos(1_000), 1000, |_, _| false);
    s.link.set_config(0, LinkConfig::default());
    s.b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 0, 64)]))
        .unwrap();
    s.a.post_send(sa.qpn, &SendWr::send(2, &[sge(&sa, 0, 8)]))
        .unwrap();
    let Some((1, CmEvent::Established { id })) = next_event(&mut s) else {
        panic!("B not established by the data")
    };
    assert_eq!(id, idb);
}

#[test]
fn sidr_resolves_a_ud_service_and_refuses_an_unknown_one() {
    let (a, mut b) = pair(Mtu::Mtu1024, 6);
    let udp_sid = 0x0111_0000 | 7174;
    b.cm_listen(udp_sid).unwrap();
    let mut s = sim(a, b, LinkConfig::default(), LinkConfig::default(), 6);
    let p = SidrParams {
        service_id: udp_sid,
        dgid: gid_of(IpAddr::V4(IP_B)),
        sgid_index: 1,
        dmac: None,
        cm_response_timeout: T,
        max_cm_retries: 3,
        private_data: b"who serves this?".to_vec(),
    };
    let id = s.a.cm_sidr_request(&p).unwrap();
    let Some((
        1,
        CmEvent::SidrRequest {
            id: idb,
            service_id,
            private_data,
            ..
        },
    )) = next_event(&mut s)
    else {
        panic!("no SIDR request")
    };
    assert_eq!(service_id, udp_sid);
    assert!(private_data.starts_with(b"who serves this?"));
    s.b.cm_sidr_reply(idb, cm::sidr_status::OK, 0x42, 0x1111_2222, b"me")
        .unwrap();
    let Some((
        0,
        CmEvent::SidrResponse {
            id: r,
            status,
            qpn,
            qkey,
            private_data,
        },
    )) = next_event(&mut s)
    else {
        panic!("no SIDR response")
    };
    assert_eq!((r, status, qpn, qkey), (id, 0, 0x42, 0x1111_2222));
    assert!(private_data.starts_with(b"me"));
    let id2 =
        s.a.cm_sidr_request(&SidrParams {
            service_id: udp_sid + 1,
            ..p
        })
        .unwrap();
    let Some((0, CmEvent::SidrResponse { id: r, status, .. })) = next_event(&mut s) else {
        panic!()
    };
    assert_eq!(
        (r, status),
        (id2, cm::sidr_status::SERVICE_ID_NOT_SUPPORTED)
    );
}

/// A MAD from A's QP1 to B's QP1, built by hand: what a hostile or foreign peer sends.
fn mad_frame(m: &[u8; mad::MAD_LEN], qkey: u32) -> Vec<u8> {
    qp1_frame(m, qkey)
}

/// A UD SEND_ONLY from A's QP1 to B's QP1 carrying `payload` (a MAD, or not quite one).
fn qp1_frame(payload: &[u8], qkey: u32) -> Vec<u8> {
    let repr = FrameRepr {
        eth: EthRepr {
            dst: MAC_B,
            src: MAC_A,
            vlan: None,
            ethertype: 0x0800,
        },
        ip: IpRepr::V4(Ipv4Repr::new(IP_A, IP_B, 0)),
        udp: UdpRepr {
            src_port: 55410,
            dst_port: ROCE_V2_PORT,
        },
        roce: RoceRepr {
            bth: BthRepr::new(Opcode::UD_SEND_ONLY, cm::GSI_QPN, Psn::new(0)),
            ext: ExtRepr {
                deth: Some(DethRepr {
                    qkey,
                    src_qp: cm::GSI_QPN,
                }),
                ..ExtRepr::default()
            },
            payload,
        },
    };
    let mut buf = vec![0u8; 512];
    let n = repr.emit(&mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn header(class: u8, version: u8, method: u8, attr: u16) -> mad::Repr {
    mad::Repr {
        base_version: 1,
        mgmt_class: class,
        class_version: version,
        method,
        status: 0,
        class_specific: 0,
        transaction_id: 0x1122_3344_5566_7788,
        attribute_id: attr,
        attribute_modifier: 0,
    }
}

/// What B sends back (the MADs of its frames).
fn replies(b: &mut Engine) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 9000];
    while let Some(n) = b.poll_transmit(Time::ZERO, &mut buf) {
        let f = Frame::parse(&buf[..n]).unwrap();
        f.verify().unwrap();
        assert_eq!(f.roce().bth().dest_qp(), cm::GSI_QPN);
        assert_eq!(f.roce().deth().unwrap().qkey(), cm::GSI_QKEY);
        out.push(f.roce().payload()[..mad::MAD_LEN].to_vec());
    }
    out
}

#[test]
fn mads_it_does_not_serve_get_the_status_iba_gives_or_are_dropped() {
    let (_, mut b) = pair(Mtu::Mtu1024, 7);
    let mut m = [0u8; mad::MAD_LEN];
    // A Get of the Performance Management class: GetResp "unsupported version/class".
    header(0x04, 1, 0x01, 0x0012).emit(&mut m).unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    let r = replies(&mut b);
    assert_eq!(r.len(), 1);
    let h = mad::Repr::parse(&mad::Header::new_checked(&r[0][..]).unwrap());
    assert_eq!((h.method, h.status), (0x81, cm::MAD_STATUS_BAD_VERSION));
    assert_eq!(h.transaction_id, 0x1122_3344_5566_7788);
    // A CM Get (the CM serves only Send): "unsupported method".
    header(mad::CLASS_CM, 2, 0x01, 0x0001).emit(&mut m).unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    let r = replies(&mut b);
    let h = mad::Repr::parse(&mad::Header::new_checked(&r[0][..]).unwrap());
    assert_eq!(
        (h.method, h.status),
        (0x81, cm::MAD_STATUS_UNSUPPORTED_METHOD)
    );
    // A CM Send of class version 1: nothing to answer a Send with; dropped.
    header(mad::CLASS_CM, 1, 0x03, wcm::attr::REQ)
        .emit(&mut m)
        .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    // Base version 2, a wrong Q_Key, an unsolicited response: dropped and counted.
    let mut bad = m;
    bad[0] = 2;
    b.handle_frame(Time::ZERO, &mad_frame(&bad, cm::GSI_QKEY));
    b.handle_frame(Time::ZERO, &mad_frame(&m, 0x1234));
    header(mad::CLASS_CM, 2, 0x81, wcm::attr::REQ)
        .emit(&mut m)
        .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    assert!(replies(&mut b).is_empty());
    let c = b.cm_counters();
    assert_eq!(c.mads_unsupported, 2, "{c:?}");
    assert_eq!(c.drop_malformed, 1, "{c:?}");
    assert_eq!(c.drop_not_gsi, 1, "{c:?}");
    assert_eq!(c.drop_unexpected, 2, "{c:?}");
}

#[test]
fn a_dreq_for_no_connection_gets_a_drep_and_stray_messages_change_nothing() {
    let (_, mut b) = pair(Mtu::Mtu1024, 8);
    let mut m = [0u8; mad::MAD_LEN];
    let dreq = wcm::CmMessage::Dreq {
        local_comm_id: 0xaaaa,
        remote_comm_id: 0xbbbb,
        remote_qpn: 0x11,
        private_data: &[],
    };
    dreq.emit_mad(&header(mad::CLASS_CM, 2, 0x03, 0), &mut m)
        .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    let r = replies(&mut b);
    assert_eq!(r.len(), 1);
    let Some((
        h,
        wcm::CmMessage::Drep {
            local_comm_id,
            remote_comm_id,
            ..
        },
    )) = wcm::CmMessage::from_mad(&r[0]).unwrap()
    else {
        panic!("no DREP")
    };
    assert_eq!((local_comm_id, remote_comm_id), (0xbbbb, 0xaaaa));
    assert_eq!(h.transaction_id, 0x1122_3344_5566_7788);
    // A REP for a connection B never asked for: REJ "invalid communication ID".
    let rep = wcm::CmMessage::Rep(wcm::Rep {
        local_comm_id: 0xcccc,
        remote_comm_id: 0xdddd,
        local_qkey: 0,
        local_qpn: 0x12,
        local_eecn: 0,
        starting_psn: 1,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 1,
        private_data: &[],
    });
    rep.emit_mad(&header(mad::CLASS_CM, 2, 0x03, 0), &mut m)
        .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    let r = replies(&mut b);
    let Some((_, wcm::CmMessage::Rej(j))) = wcm::CmMessage::from_mad(&r[0]).unwrap() else {
        panic!("no REJ")
    };
    assert_eq!(
        (j.reason, j.remote_comm_id, j.message_rejected),
        (6, 0xcccc, 1)
    );
    // An RTU, a REJ and an MRA for nothing: ignored, counted, no event.
    for msg in [
        wcm::CmMessage::Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: &[],
        },
        wcm::CmMessage::Mra(wcm::Mra {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_mraed: 0,
            service_timeout: 3,
            private_data: &[],
        }),
    ] {
        msg.emit_mad(&header(mad::CLASS_CM, 2, 0x03, 0), &mut m)
            .unwrap();
        b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    }
    assert!(replies(&mut b).is_empty());
    assert_eq!(b.poll_cm_event(), None);
    assert_eq!(b.cm_counters().drop_stale, 2);
}

/// The link drops the next frame of direction `dir` (0: A to B, 1: B to A), once.
fn lose_next(s: &mut Sim<Engine, Engine>, dir: usize) {
    s.link.set_config(dir, LinkConfig::lossy(1.0));
    s.step();
    s.link.set_config(dir, LinkConfig::default());
}

/// Runs `ns` of simulated time; the events that came, if any.
fn events_for(s: &mut Sim<Engine, Engine>, ns: u64) -> Vec<(usize, CmEvent)> {
    let mut got = Vec::new();
    let until = s.now.add_nanos(ns);
    s.run_until(until, 1_000_000, |a, b| {
        while let Some(e) = a.poll_cm_event() {
            got.push((0, e));
        }
        while let Some(e) = b.poll_cm_event() {
            got.push((1, e));
        }
        false
    });
    got
}

#[test]
fn req_rep_and_rtu_each_lost_once_are_sent_again() {
    for lost in ["REQ", "REP", "RTU"] {
        let (mut s, sa, sb) = setup(LinkConfig::default(), LinkConfig::default(), 21);
        let ida = s.a.cm_connect(&params(sa.qpn)).unwrap();
        if lost == "REQ" {
            lose_next(&mut s, 0);
        }
        let Some((1, CmEvent::ConnectRequest { id: idb, .. })) = next_event(&mut s) else {
            panic!("{lost} lost: no connect request")
        };
        accept_on_b(&mut s, &sa, &sb, idb, 0x5678, vec![]);
        if lost == "REP" {
            lose_next(&mut s, 1);
        }
        let Some((0, CmEvent::ConnectResponse { id, .. })) = next_event(&mut s) else {
            panic!("{lost} lost: no connect response")
        };
        assert_eq!(id, ida);
        ready_on_a(&mut s, &sa, &sb, 0x5678);
        s.a.cm_establish(ida, &[]).unwrap();
        assert_eq!(s.a.poll_cm_event(), Some(CmEvent::Established { id: ida }));
        if lost == "RTU" {
            lose_next(&mut s, 0);
        }
        let Some((1, CmEvent::Established { id })) = next_event(&mut s) else {
            panic!("{lost} lost: B not established")
        };
        assert_eq!(id, idb);
        // Ten response timeouts later: nothing more (no second request, no failure).
        let more = events_for(&mut s, 10 * cm::timeout_ns(T));
        assert!(more.is_empty(), "{lost} lost: {more:?}");
        let (ca, cb) = (s.a.cm_counters(), s.b.cm_counters());
        match lost {
            "REQ" => assert!(ca.mads_resent >= 1, "{ca:?}"),
            // B repeats its REP; A's REQ retry meanwhile is a duplicate B ignores.
            "REP" => assert!(cb.mads_resent >= 1, "{cb:?}"),
            // B repeats its REP, A answers it with the RTU again.
            _ => assert!(cb.mads_resent >= 1 && ca.mads_resent >= 1, "{ca:?} {cb:?}"),
        }
        assert_eq!((ca.established, cb.established), (1, 1));
    }
}

#[test]
fn a_dreq_while_data_is_in_flight_ends_both_sides() {
    let (mut s, sa, sb) = setup(LinkConfig::default(), LinkConfig::default(), 22);
    let (ida, idb) = handshake(&mut s, &sa, &sb);
    for i in 0..16 {
        s.b.post_recv(sb.qpn, &RecvWr::new(i, &[sge(&sb, 0, 4096)]))
            .unwrap();
        s.a.post_send(sa.qpn, &SendWr::send(i, &[sge(&sa, 0, 4096)]))
            .unwrap();
    }
    s.a.cm_disconnect(ida, &[]).unwrap();
    let got = events_for(&mut s, 10 * cm::timeout_ns(T));
    assert!(
        got.contains(&(0, CmEvent::Disconnected { id: ida })),
        "{got:?}"
    );
    assert!(
        got.contains(&(1, CmEvent::Disconnected { id: idb })),
        "{got:?}"
    );
    assert_eq!(got.len(), 2, "{got:?}");
}

/// A change to a REQ, making it break one rule.
type ReqEdit = Box<dyn Fn(&mut wcm::Req<'_>)>;

/// A REQ from a made-up peer (A's addresses) with `edit` applied.
fn req_mad(comm: u32, edit: impl FnOnce(&mut wcm::Req<'_>)) -> [u8; mad::MAD_LEN] {
    let mut r = wcm::Req {
        local_comm_id: comm,
        service_id: SID,
        local_ca_guid: 0x0200_00ff_fe00_000a,
        local_qkey: 0,
        local_qpn: 0x42,
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: T,
        transport: 0,
        end_to_end_flow_control: true,
        starting_psn: 0x1234,
        local_cm_response_timeout: T,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 3,
        srq: false,
        extended_transport: 0,
        primary_local_lid: 0xffff,
        primary_remote_lid: 0xffff,
        primary_local_gid: gid_of(IpAddr::V4(IP_A)),
        primary_remote_gid: gid_of(IpAddr::V4(IP_B)),
        primary_flow_label: 0,
        primary_packet_rate: 0,
        primary_traffic_class: 0,
        primary_hop_limit: 64,
        primary_sl: 0,
        primary_subnet_local: false,
        primary_local_ack_timeout: 19,
        alternate_path: &[],
        private_data: &[],
        cma: None,
    };
    edit(&mut r);
    let mut m = [0u8; mad::MAD_LEN];
    wcm::CmMessage::Req(r)
        .emit_mad(&header(mad::CLASS_CM, 2, 0x03, 0), &mut m)
        .unwrap();
    m
}

fn rej_reason(r: &[u8]) -> u16 {
    match wcm::CmMessage::from_mad(r).unwrap() {
        Some((_, wcm::CmMessage::Rej(j))) => j.reason,
        other => panic!("not a REJ: {other:?}"),
    }
}

#[test]
fn hostile_reqs_get_the_reject_reasons_and_leave_no_state() {
    let (_, mut b) = pair(Mtu::Mtu1024, 23);
    b.cm_listen(SID).unwrap();
    let cases: [(&str, u16, ReqEdit); 5] = [
        ("RD transport", 9, Box::new(|r| r.transport = 2)),
        ("QP1 as the peer's QP", 5, Box::new(|r| r.local_qpn = 1)),
        ("QP0 as the peer's QP", 5, Box::new(|r| r.local_qpn = 0)),
        (
            "the multicast QPN",
            5,
            Box::new(|r| r.local_qpn = 0xff_ffff),
        ),
        ("path MTU code 7", 26, Box::new(|r| r.path_mtu = 7)),
    ];
    for (i, (what, want, edit)) in cases.into_iter().enumerate() {
        let m = req_mad(0x100 + i as u32, |r| edit(r));
        b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
        let r = replies(&mut b);
        assert_eq!(r.len(), 1, "{what}");
        assert_eq!(rej_reason(&r[0]), want, "{what}");
        assert_eq!(b.poll_cm_event(), None, "{what}");
        assert_eq!(b.cm_connections(), 0, "{what}: state left behind");
    }
    // A truncated MAD (a REQ cut at 100 bytes): dropped, counted, nothing kept.
    let m = req_mad(0x200, |_| {});
    let mut short = [0u8; mad::MAD_LEN];
    short[..100].copy_from_slice(&m[..100]);
    let before = b.cm_counters().drop_malformed;
    // The frame carries only the first 100 bytes of the MAD.
    let fr = qp1_frame(&short[..100], cm::GSI_QKEY);
    b.handle_frame(Time::ZERO, &fr);
    assert!(replies(&mut b).is_empty());
    assert_eq!(b.cm_counters().drop_malformed, before + 1);
    assert_eq!(b.cm_connections(), 0);
}

#[test]
fn a_req_seen_again_is_ignored_then_refused_as_stale_in_timewait() {
    let (_, mut b) = pair(Mtu::Mtu1024, 24);
    b.cm_listen(SID).unwrap();
    let req = req_mad(0x77, |_| {});
    b.handle_frame(Time::ZERO, &mad_frame(&req, cm::GSI_QKEY));
    let Some(CmEvent::ConnectRequest { id, .. }) = b.poll_cm_event() else {
        panic!("no connect request")
    };
    let sb = side(&mut b, QpType::Rc, 4096, 16);
    b.cm_accept(id, &acc(sb.qpn, 0x5678, vec![])).unwrap();
    assert_eq!(replies(&mut b).len(), 1, "the REP");
    // The same REQ again (its sender retried): ignored, no second connection.
    b.handle_frame(Time::ZERO, &mad_frame(&req, cm::GSI_QKEY));
    assert!(replies(&mut b).is_empty());
    assert_eq!(b.poll_cm_event(), None);
    assert_eq!(b.cm_connections(), 1);
    // RTU, then the peer's DREQ: established, then disconnected (DREP) and in timewait.
    let mut m = [0u8; mad::MAD_LEN];
    let h = header(mad::CLASS_CM, 2, 0x03, 0);
    wcm::CmMessage::Rtu {
        local_comm_id: 0x77,
        remote_comm_id: id,
        private_data: &[],
    }
    .emit_mad(&h, &mut m)
    .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    assert_eq!(b.poll_cm_event(), Some(CmEvent::Established { id }));
    wcm::CmMessage::Dreq {
        local_comm_id: 0x77,
        remote_comm_id: id,
        remote_qpn: sb.qpn,
        private_data: &[],
    }
    .emit_mad(&h, &mut m)
    .unwrap();
    b.handle_frame(Time::ZERO, &mad_frame(&m, cm::GSI_QKEY));
    assert_eq!(b.poll_cm_event(), Some(CmEvent::Disconnected { id }));
    let r = replies(&mut b);
    assert!(matches!(
        wcm::CmMessage::from_mad(&r[0]).unwrap(),
        Some((_, wcm::CmMessage::Drep { .. }))
    ));
    // The old REQ once more, now in timewait: REJ "stale connection".
    b.handle_frame(Time::ZERO, &mad_frame(&req, cm::GSI_QKEY));
    let r = replies(&mut b);
    assert_eq!(rej_reason(&r[0]), cm::reason::STALE_CONNECTION);
    assert_eq!(b.poll_cm_event(), None);
}

/// A process that restarts (its engine seeded anew) numbers its QPs from elsewhere: a
/// peer whose CM still holds the old connection (no DREQ came from the crashed process)
/// would refuse a REQ from the same QPN as stale (REJ 10) until its timewait ends. The
/// same seed still gives the same numbers, so a run reproduces.
#[test]
fn a_restarted_engine_numbers_its_qps_from_elsewhere() {
    let first = |seed| {
        let mut e = Engine::new(config(MAC_A, IP_A, Mtu::Mtu1024, seed));
        let a = side(&mut e, QpType::Rc, 4096, 4).qpn;
        let b = side(&mut e, QpType::Rc, 4096, 4).qpn;
        assert_eq!(b, a + 1, "QPNs of one engine count up");
        a
    };
    let qpns: Vec<u32> = (0..64u64).map(|s| first(s * 0x9e37_79b9 + 1)).collect();
    for &q in &qpns {
        assert!(
            (roce_xdp::engine::FIRST_QPN..0xff_0000).contains(&q),
            "{q:#x}"
        );
    }
    let mut distinct = qpns.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        qpns.len(),
        "64 restarts, 64 first QPNs: {qpns:x?}"
    );
    assert_eq!(first(7), first(7), "the same seed, the same QPNs");
}

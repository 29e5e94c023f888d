//! Hostile frames over a real link: a raw packet socket in namespace A sends hand-built
//! frames (as any host on the segment can) to an engine on AF_XDP in namespace B, beside
//! a connection between the two engines. The subset of `hostile_matrix` that the XDP
//! program and the AF_XDP path could change: each frame is dropped under its reason or
//! answered with the NAK the spec demands, no byte of B's memory changes, and the
//! connection keeps working until a frame the spec answers by ending the QP.
//! Root is needed; without it the test prints why it skipped (CI runs as root).

mod common;
use common::hostile::*;
use common::rt::*;
use roce_xdp::engine::Counters;
use roce_xdp::netns::Pair;
use roce_xdp::runtime::Device;
use roce_xdp::verbs::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Sends `frames` out of `ifname` in namespace `ns` through a raw packet socket.
fn raw_send(ns: &str, ifname: &str, frames: Vec<Vec<u8>>) {
    let (ns, ifname) = (ns.to_string(), ifname.to_string());
    std::thread::spawn(move || {
        roce_xdp::host::enter_netns(&ns).unwrap();
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == ifname)
            .unwrap_or_else(|| panic!("no {ifname} in {ns}"));
        let pnet_datalink::Channel::Ethernet(mut tx, _rx) =
            pnet_datalink::channel(&iface, Default::default()).unwrap()
        else {
            panic!("not an Ethernet channel");
        };
        for f in &frames {
            tx.send_to(f, None).unwrap().unwrap();
        }
    })
    .join()
    .unwrap();
}

/// Waits (at most 5 s) until the counters of `dev` moved by `want` since `before`, then
/// a little longer to see that nothing else moves; asserts the exact set.
fn expect_moved(dev: &Device, before: &Counters, want: &[(&'static str, u64)]) -> Counters {
    let mut want = want.to_vec();
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = dev.counters().unwrap();
        let got = moved(before, &now);
        if got == want || Instant::now() > deadline {
            std::thread::sleep(Duration::from_millis(200));
            let now = dev.counters().unwrap();
            assert_eq!(moved(before, &now), want, "counters that moved on B");
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn hostile_frames_from_a_raw_socket_over_af_xdp() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxh", 16, 1500).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, 1 << 20, |_| {});
    let pattern: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    b.mem.write(0, &pattern).unwrap();
    let from = (a.dev.info().mac, pair.ip_a);
    let to = (b.dev.info().mac, pair.ip_b);
    let qpn = b.qp.qpn;
    let epsn = b.dev.query_qp(&b.qp).unwrap().rq_psn;
    let key = (b.mr.rkey, b.mr.addr);
    let write = |psn: u32| Pkt::write_only(qpn, psn, key, &[0xee; 64], from, to);

    // Dropped before any QP state is touched.
    let mut bad_icrc = write(epsn).emit();
    let n = bad_icrc.len();
    bad_icrc[n - 1] ^= 0x40;
    let mut cut = write(epsn).emit();
    cut.truncate(cut.len() - 9);
    let mut tver = write(epsn).emit();
    tver[BTH + 1] |= 0x02;
    reseal(&mut tver);
    let mut unaligned = write(epsn).emit();
    let icrc_at = unaligned.len() - 4;
    unaligned.remove(icrc_at - 1);
    fix_lengths(&mut unaligned);
    reseal(&mut unaligned);
    let mut pkey = write(epsn);
    pkey.pkey = 0x1234;
    let mut unknown = write(epsn);
    unknown.qpn = qpn ^ 0x5a5a;
    let mut spoofed = write(epsn);
    spoofed.src_ip = Ipv4Addr::new(198, 18, 16, 99);
    let before = b.dev.counters().unwrap();
    raw_send(
        &pair.a.name,
        &pair.ifname,
        vec![
            bad_icrc,
            cut,
            tver,
            unaligned,
            pkey.emit(),
            unknown.emit(),
            spoofed.emit(),
        ],
    );
    let c = expect_moved(
        &b.dev,
        &before,
        &[
            ("drop_bad_icrc", 1),
            ("drop_malformed", 3),
            ("rcvd_pkts", 1),
            ("drop_bad_pkey", 1),
            ("drop_unknown_qp", 1),
            ("drop_wrong_path", 1),
        ],
    );

    // Far ahead: one sequence NAK (to A, whose engine has nothing outstanding and drops
    // it), then silence; the expected PSN stays where it was.
    let ahead: Vec<Vec<u8>> = [1 << 22, 5, 1000]
        .into_iter()
        .map(|d| write(epsn + d).emit())
        .collect();
    raw_send(&pair.a.name, &pair.ifname, ahead);
    expect_moved(
        &b.dev,
        &c,
        &[
            ("rcvd_pkts", 3),
            ("out_of_seq_request", 1),
            ("nak_seq_sent", 1),
            ("acks_sent", 1),
            ("sent_pkts", 1),
            ("drop_silent_request", 2),
        ],
    );
    assert_eq!(b.dev.query_qp(&b.qp).unwrap().rq_psn, epsn);
    assert!(
        b.mem.to_vec(0, 1 << 20).unwrap() == pattern,
        "B's memory changed"
    );

    // The connection still works, byte-exact, both ways.
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 1) as u8).collect();
    a.mem.write(0, &data).unwrap();
    a.qp.post_send(&SendWr::write(
        1,
        &[a.sge(0, 20_000)],
        b.mr.addr + 4096,
        b.mr.rkey,
    ))
    .unwrap();
    a.qp.post_send(&SendWr::read(
        2,
        &[a.sge(100_000, 20_000)],
        b.mr.addr + 4096,
        b.mr.rkey,
    ))
    .unwrap();
    wait_ok(&a, 2, 10);
    assert_eq!(b.mem.to_vec(4096, 20_000).unwrap(), data);
    assert_eq!(a.mem.to_vec(100_000, 20_000).unwrap(), data);
    let mut want = pattern.clone();
    want[4096..24_096].copy_from_slice(&data);

    // A bad R_Key at the expected PSN: REMOTE ACCESS ERROR NAK, and the responder's QP
    // goes to ERR (IBA 9.9.2); nothing is written.
    let epsn = b.dev.query_qp(&b.qp).unwrap().rq_psn;
    let c = b.dev.counters().unwrap();
    let mut bad_key = write(epsn);
    bad_key.ext.reth.as_mut().unwrap().rkey ^= 0x100;
    raw_send(&pair.a.name, &pair.ifname, vec![bad_key.emit()]);
    expect_moved(
        &b.dev,
        &c,
        &[
            ("rcvd_pkts", 1),
            ("nak_rem_access_sent", 1),
            ("acks_sent", 1),
            ("sent_pkts", 1),
        ],
    );
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(
        b.mem.to_vec(0, 1 << 20).unwrap() == want,
        "B's memory changed"
    );
}

/// `bench flood --quick`: the report is well formed and accounts for the flood. (A
/// benchmark: its figures are printed, not judged, here.)
#[test]
fn bench_flood_accounts_for_every_flood_frame() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["flood", "--quick"]);
    let reps = j["reps"].as_array().unwrap();
    assert_eq!(reps.len(), 1);
    let sent = j["flood_frames"].as_u64().unwrap();
    assert_eq!(sent, 100_000);
    assert_eq!(reps[0]["flood_frames"].as_u64(), Some(sent));
    for k in ["flooded_gbps", "clean_gbps", "ratio", "flood_secs"] {
        assert!(reps[0][k].as_f64().unwrap() > 0.0, "{k}");
    }
    // Half the flood went to unknown QPs, half had a bad ICRC: each counted under its
    // reason (a few may be lost on the bridge, none counted twice).
    let (u, i, r) = (
        j["dropped_unknown_qp"].as_u64().unwrap(),
        j["dropped_bad_icrc"].as_u64().unwrap(),
        j["rx_no_room"].as_u64().unwrap(),
    );
    assert!(u <= sent / 2 && i <= sent / 2, "{u} {i}");
    assert!(u + i + r >= sent * 95 / 100, "{u} + {i} + {r} of {sent}");
    assert!(j["bytes_checked"].as_u64().unwrap() > 0);
    assert!(j["rss_kib_end"].as_u64().unwrap() > 0);
}

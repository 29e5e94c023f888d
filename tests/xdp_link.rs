//! Two engines over AF_XDP on veth between network namespaces: byte-exact transfers at
//! both path MTUs (4096 through multi-buffer AF_XDP), loss injected with nftables, the
//! kernel's own traffic beside the engine, neighbour resolution, the pingpong command.
//! Root is needed; without it each test prints why it skipped (CI runs as root).

mod common;
use common::rt::*;
use roce_xdp::apps::endpoint::Endpoint;
use roce_xdp::apps::progress::Progress;
use roce_xdp::apps::workload;
use roce_xdp::netns::{Bridged, Pair};
use roce_xdp::verbs::*;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::time::Duration;

#[test]
fn smoke_send_write_read_over_af_xdp() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxs", 0, 1500).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, 1 << 20, |_| {});
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    a.mem.write(0, &data).unwrap();
    b.qp.post_recv(&RecvWr::new(1, &[b.sge(0, 8192)])).unwrap();
    a.qp.post_send(&SendWr::send(1, &[a.sge(0, 5000)])).unwrap();
    a.qp.post_send(&SendWr::write(
        2,
        &[a.sge(0, 5000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    a.qp.post_send(&SendWr::read(
        3,
        &[a.sge(100_000, 5000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    let wa = wait_ok(&a, 3, 10);
    let wb = wait_ok(&b, 1, 10);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(b.mem.to_vec(0, 5000).unwrap(), data);
    assert_eq!(b.mem.to_vec(65536, 5000).unwrap(), data);
    assert_eq!(a.mem.to_vec(100_000, 5000).unwrap(), data);
    assert_eq!(wa.len(), 3);
    println!("{}", a.dev.info().link);
}

fn mixed_64mib(netdev_mtu: u32, third: u8, want: Mtu) {
    let pair = Pair::new("rxm", third, netdev_mtu).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, MIXED_MEM, |_| {});
    assert_eq!(a.dev.info().port_mtu, want);
    let link = a.dev.info().link.clone();
    assert_eq!(
        link.contains("multi-buffer"),
        netdev_mtu > 3000,
        "multi-buffer exactly when the MTU needs it: {link}"
    );
    let m = workload::mixed(&a, &b, 64 << 20, 1 << 20, 0x1234, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    println!(
        "{link}: {:.1} MiB in {} WRs ({:?}), {:.2} Gbit/s; A sent {} frames, B sent {}",
        m.report.bytes as f64 / 1048576.0,
        m.report.ops,
        m.per_kind,
        m.report.gbps(),
        ca.sent_pkts,
        cb.sent_pkts
    );
    assert!(m.report.bytes >= 64 << 20);
    assert!(
        m.per_kind.iter().all(|&n| n > 0),
        "every kind ran: {:?}",
        m.per_kind
    );
    // Nothing lost on a clean veth, nothing malformed. On a loaded host an ACK can be
    // later than the round-trip timer allows: A then sends again, and the answers to
    // the copies are stale, which is the only drop allowed, and only then.
    let own =
        |c: &roce_xdp::engine::Counters| c.drop_stale_response * u64::from(c.fast_retransmits > 0);
    assert_eq!(ca.drops() - own(&ca), 0, "{ca}");
    assert_eq!(cb.drops() - own(&cb), 0, "{cb}");
    assert_eq!(ca.drop_bad_icrc + cb.drop_bad_icrc, 0);
    let x = a.dev.stats().xdp.expect("XDP counters");
    assert!(x.redirected > 0, "{x:?}");
    // Frames larger than a UMEM buffer came chained and were taken in two pieces (the
    // engine's counters above show none was dropped); smaller ones never are.
    let chained = a.dev.stats().rx_chained + b.dev.stats().rx_chained;
    assert_eq!(chained > 0, netdev_mtu > 3000, "{chained} chained frames");
    // Not busy-polling: only the engine threads run the data path.
    assert_eq!(a.dev.stats().app_rounds + b.dev.stats().app_rounds, 0);
}

/// Busy-polling on one engine thread, an application thread that polls an empty CQ
/// or posts runs the data path itself (run-to-completion), and the engine thread sleeps
/// meanwhile:
/// mixed operations stay byte-exact with the two taking turns, a ping-pong completes
/// with one thread per side, and the application threads did rounds of work (without
/// busy-polling they never do: `mixed_64mib`).
#[test]
fn busy_pollers_run_the_data_path_in_their_own_threads_and_stay_byte_exact() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxr", 61, 1500).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, MIXED_MEM, |c| c.busy_poll = true);
    let m = workload::mixed(&a, &b, 32 << 20, 1 << 20, 0x7c7c, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(m.report.bytes >= 32 << 20);
    assert!(m.per_kind.iter().all(|&n| n > 0), "{:?}", m.per_kind);
    // The engine threads publish their counters every 50 ms.
    let published = || {
        std::thread::sleep(Duration::from_millis(200));
        (a.dev.stats().app_rounds, b.dev.stats().app_rounds)
    };
    let before = published();
    // One thread per side, each waiting on its own CQ, as two programs do.
    let iters = 2000u32;
    b.qp.post_recv(&RecvWr::new(1, &[b.sge(0, 64)])).unwrap();
    std::thread::scope(|sc| {
        let echo = sc.spawn(|| {
            for i in 0..iters {
                let w = b.next_ok(Duration::from_secs(5)).unwrap();
                // The next receive goes in before the answer leaves.
                b.qp.post_recv(&RecvWr::new(1, &[b.sge(0, 64)])).unwrap();
                assert_eq!((w.opcode, w.byte_len), (WcOpcode::Recv, 64), "{i}");
                b.qp.post_send(&SendWr::send(2, &[b.sge(0, 64)]).with_flags(SendFlags::SIGNALED))
                    .unwrap();
                assert_eq!(
                    b.next_ok(Duration::from_secs(5)).unwrap().opcode,
                    WcOpcode::Send
                );
            }
        });
        for i in 0..iters {
            a.qp.post_recv(&RecvWr::new(1, &[a.sge(4096, 64)])).unwrap();
            a.mem.write(0, &i.to_le_bytes()).unwrap();
            a.qp.post_send(&SendWr::send(2, &[a.sge(0, 64)]).with_flags(SendFlags::SIGNALED))
                .unwrap();
            let kinds = [
                a.next_ok(Duration::from_secs(5)).unwrap().opcode,
                a.next_ok(Duration::from_secs(5)).unwrap().opcode,
            ];
            assert_eq!(a.mem.to_vec(4096, 4).unwrap(), i.to_le_bytes(), "{i}");
            assert!(kinds.contains(&WcOpcode::Send) && kinds.contains(&WcOpcode::Recv));
        }
        echo.join().unwrap();
    });
    let after = published();
    let (da, db) = (after.0 - before.0, after.1 - before.1);
    println!("application rounds with work in the ping-pong: A {da}, B {db}");
    // At least a round per round trip on each side: the callers ran the data path
    // (with the engine threads running it, as before, there are none).
    assert!(
        da >= u64::from(iters) && db >= u64::from(iters),
        "A {da}, B {db}"
    );
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    assert_eq!(ca.drop_bad_icrc + cb.drop_bad_icrc, 0);
}

#[test]
fn mixed_64_mib_byte_exact_at_mtu_1500_path_mtu_1024() {
    if !need_root() {
        return;
    }
    mixed_64mib(1500, 1, Mtu::Mtu1024);
}

#[test]
fn mixed_64_mib_byte_exact_at_mtu_4200_path_mtu_4096_multi_buffer() {
    if !need_root() {
        return;
    }
    mixed_64mib(4200, 2, Mtu::Mtu4096);
}

#[test]
fn two_percent_loss_each_way_stays_byte_exact() {
    if !need_root() {
        return;
    }
    let br = Bridged::new("rxl", 3, 2, 1500).unwrap();
    br.lose(0, 2).unwrap();
    br.lose(1, 2).unwrap();
    let (a, b) = xdp_pair(
        &br.ifname,
        (&br.ends[0].name, IpAddr::V4(br.ips[0])),
        (&br.ends[1].name, IpAddr::V4(br.ips[1])),
        QpType::Rc,
        MIXED_MEM,
        // A short retransmit timeout: 2^10 x 4.096 us, about 4 ms, so retry_cnt 7 lasts
        // about 34 ms without progress. 2^8 (1 ms) failed in CI and here under CPU load:
        // B's engine thread was off the CPU for 15 ms while A used up all 7 retries.
        10,
        |_| {},
    );
    let m = workload::mixed(&a, &b, 64 << 20, 1 << 20, 0x1055, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    let (l0, l1) = (br.lost(0), br.lost(1));
    println!(
        "{:.1} MiB byte-exact in {:.2} s; nft dropped {l0} towards A, {l1} towards B; \
         A retransmitted {} packets ({} timeouts, {} sequence NAKs received), B answered {} duplicates",
        m.report.bytes as f64 / 1048576.0,
        m.report.elapsed.as_secs_f64(),
        ca.retransmitted_pkts,
        ca.timeouts,
        ca.rcvd_seq_err,
        cb.duplicate_request
    );
    assert!(
        l0 > 0 && l1 > 0,
        "the loss rules dropped nothing: {l0} {l1}"
    );
    assert!(ca.retransmitted_pkts > 0);
}

/// Runs a TCP echo of `n` bytes from namespace `from` to `to_ip:port` in namespace `to`.
fn tcp_echo(from: &str, to: &str, to_ip: IpAddr, port: u16, n: usize) -> usize {
    let to = to.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        roce_xdp::host::enter_netns(&to).unwrap();
        let l = std::net::TcpListener::bind((to_ip, port)).unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut total = 0;
        loop {
            let k = s.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            s.write_all(&buf[..k]).unwrap();
            total += k;
        }
        total
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let from = from.to_string();
    let client = std::thread::spawn(move || {
        roce_xdp::host::enter_netns(&from).unwrap();
        let mut s =
            std::net::TcpStream::connect_timeout(&(to_ip, port).into(), Duration::from_secs(5))
                .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut s2 = s.try_clone().unwrap();
        let w = std::thread::spawn(move || {
            s2.write_all(&data).unwrap();
            s2.shutdown(std::net::Shutdown::Write).unwrap();
            data
        });
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        let data = w.join().unwrap();
        assert!(back == data, "TCP echo differs");
        back.len()
    });
    let got = client.join().unwrap();
    assert_eq!(server.join().unwrap(), n);
    got
}

#[test]
fn ping_and_tcp_work_beside_the_engines() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxk", 4, 1500).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, MIXED_MEM, |_| {});
    let (na, nb) = (pair.a.name.clone(), pair.b.name.clone());
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    std::thread::scope(|s| {
        let rdma = s.spawn(|| {
            workload::mixed(&a, &b, 32 << 20, 1 << 20, 0x7cb, &mut Progress::hidden())
                .unwrap_or_else(|e| panic!("{e}"))
        });
        let ping = pair
            .a
            .exec(&[
                "ping",
                "-c",
                "5",
                "-i",
                "0.2",
                "-W",
                "2",
                &pair.ip_b.to_string(),
            ])
            .unwrap();
        let text = String::from_utf8_lossy(&ping.stdout).to_string();
        assert!(text.contains("5 received"), "{text}");
        assert_eq!(tcp_echo(&na, &nb, ip_b, 5001, 4 << 20), 4 << 20);
        assert_eq!(tcp_echo(&nb, &na, ip_a, 5002, 1 << 20), 1 << 20);
        let m = rdma.join().unwrap();
        assert!(m.report.bytes >= 32 << 20);
    });
    let x = a.dev.stats().xdp.expect("XDP counters");
    let y = b.dev.stats().xdp.expect("XDP counters");
    println!("XDP A {x:?}\nXDP B {y:?}");
    assert!(
        x.passed > 0 && y.passed > 0,
        "the kernel's frames were passed on"
    );
    assert!(x.redirected > 0 && y.redirected > 0);
}

#[test]
fn a_missing_neighbour_entry_is_resolved() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxn", 5, 1500).unwrap();
    for ns in [&pair.a, &pair.b] {
        ns.exec(&["ip", "neigh", "flush", "dev", "veth0"]).unwrap();
    }
    let show = |ns: &roce_xdp::netns::Netns, ip: std::net::Ipv4Addr| {
        let o = ns.exec(&["ip", "neigh", "show", &ip.to_string()]).unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert!(
        !show(&pair.a, pair.ip_b).contains("lladdr"),
        "the entry was not flushed"
    );
    // Connecting resolves the peer's MAC through the kernel (modify_qp to RTR).
    let (a, b) = xdp_ends(&pair, QpType::Rc, 1 << 20, |_| {});
    let entry = show(&pair.a, pair.ip_b);
    assert!(
        entry.contains("lladdr"),
        "no entry after connect: {entry:?}"
    );
    a.mem.write(0, b"resolved").unwrap();
    a.qp.post_send(&SendWr::write(1, &[a.sge(0, 8)], b.mr.addr, b.mr.rkey))
        .unwrap();
    wait_ok(&a, 1, 10);
    assert_eq!(b.mem.to_vec(0, 8).unwrap(), b"resolved");
    // A peer that does not exist is a clear error, not a hang.
    let ghost = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 5, 77));
    let err = a.dev.resolve(ghost).unwrap_err().to_string();
    assert!(err.contains("198.18.5.77") && err.contains("ARP"), "{err}");
}

#[test]
fn setup_errors_name_the_problem() {
    if !need_root() {
        return;
    }
    use roce_xdp::runtime::{Device, RuntimeConfig};
    let pair = Pair::new("rxe", 6, 1500).unwrap();
    let mut c = RuntimeConfig::xdp("nosuch0");
    c.netns = Some(pair.a.name.clone());
    let e = Device::open(c).err().unwrap().to_string();
    assert!(e.contains("nosuch0"), "{e}");
    let mut c = RuntimeConfig::xdp("veth0");
    c.netns = Some(pair.a.name.clone());
    let mut d = DeviceConfig::new([2, 0, 0, 0, 0, 9], std::net::Ipv4Addr::new(198, 18, 6, 99));
    d.port_mtu = Mtu::Mtu1024;
    c.device = Some(d);
    let e = Device::open(c).err().unwrap().to_string();
    assert!(e.contains("198.18.6.99 is not an address of veth0"), "{e}");
    let mut c = RuntimeConfig::xdp("veth0");
    c.netns = Some(pair.a.name.clone());
    c.port_mtu = Some(Mtu::Mtu4096);
    let e = Device::open(c).err().unwrap().to_string();
    assert!(e.contains("4096") && e.contains("1500"), "{e}");
}

fn pingpong_pair(pair: &Pair, port: u16, extra: &[&str]) -> (String, String) {
    let p = port.to_string();
    let mut a = vec![
        "pingpong",
        "-d",
        "veth0",
        "-g",
        "1",
        "-p",
        &p,
        "--timeout",
        "20",
    ];
    a.extend_from_slice(extra);
    pair_processes(pair, &a, &a)
}

#[test]
fn pingpong_processes_rc_uc_ud() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxp", 7, 1500).unwrap();
    for (i, extra) in [
        vec!["-n", "300", "-c"],
        vec!["-n", "300", "-s", "65536", "-m", "1024"],
        vec!["--uc", "-n", "200", "-s", "1"],
        vec!["--ud", "-n", "200", "-s", "1024"],
    ]
    .iter()
    .enumerate()
    {
        let (c, s) = pingpong_pair(&pair, 18515 + i as u16, extra);
        for out in [&c, &s] {
            assert!(out.contains("local address:  LID 0x0000"), "{out}");
            assert!(out.contains("GID ::ffff:198.18.7."), "{out}");
            assert!(out.contains(" iters in "), "{out}");
        }
        assert!(!s.contains("invalid data"), "{s}");
        println!("{extra:?}: {}", c.lines().last().unwrap_or(""));
    }
}

fn pair_processes(pair: &Pair, server: &[&str], client: &[&str]) -> (String, String) {
    let mut s = pair.b.command(bin());
    s.args(server);
    let s = Child::spawn(s);
    let mut c = pair.a.command(bin());
    c.args(client);
    c.arg(pair.ip_b.to_string());
    let c = Child::spawn(c);
    let (ok_c, out_c) = c.finish(60);
    let (ok_s, out_s) = s.finish(30);
    assert!(ok_c && ok_s, "client:\n{out_c}\nserver:\n{out_s}");
    (out_c, out_s)
}

#[test]
fn perftest_commands_talk_to_each_other() {
    if !need_root() {
        return;
    }
    // The rxe interop harness runs them against perftest itself; here both sides are
    // ours, over AF_XDP, each of the five tests.
    let pair = Pair::new("rxf", 9, 1500).unwrap();
    for (i, (test, extra)) in [
        ("write_bw", vec!["-s", "65536", "-n", "200"]),
        (
            "write_bw",
            vec!["-s", "65536", "-n", "200", "--report_gbits"],
        ),
        ("read_bw", vec!["-s", "65536", "-n", "200"]),
        ("read_bw", vec!["-s", "64", "-n", "2000", "-o", "4"]),
        ("send_bw", vec!["-s", "4096", "-n", "500"]),
        ("write_lat", vec!["-s", "2", "-n", "200"]),
        ("atomic_bw", vec!["-n", "500", "-A", "CMP_AND_SWAP"]),
        ("atomic_bw", vec!["-n", "500"]),
    ]
    .iter()
    .enumerate()
    {
        let port = (18800 + i).to_string();
        let mut a = vec!["perftest", test, "-d", "veth0", "-x", "1", "-p", &port];
        a.extend(extra.iter().copied());
        let (c, s) = pair_processes(&pair, &a, &a);
        assert!(c.contains("remote address"), "{c}");
        if *test == "read_bw" {
            // perftest's `-o`: the device's limit unless asked for fewer.
            let want = match extra.iter().position(|a| *a == "-o") {
                Some(i) => extra[i + 1].to_string(),
                None => roce_xdp::verbs::DeviceLimits::default()
                    .max_qp_rd_atom
                    .to_string(),
            };
            assert!(c.contains(&format!(" Outstand reads  : {want}\n")), "{c}");
        }
        if *test == "write_lat" {
            assert!(
                c.contains("t_typical") && s.contains("t_typical"),
                "{c}\n{s}"
            );
        } else {
            assert!(c.contains("BW average"), "{c}");
            // The server prints what it was told (bw tests) or measured (send_bw).
            assert!(s.contains("BW average"), "{s}");
        }
        if extra.contains(&"--report_gbits") {
            // Decimal Gbit/s, the same figure on both sides: a veth pair on this kind of
            // machine carries a few Gbit/s (the MiB/s figure would be hundreds).
            let avg = |o: &str| -> f64 {
                let l = o
                    .lines()
                    .skip_while(|l| !l.contains("BW average[Gb/sec]"))
                    .nth(1);
                l.and_then(|l| l.split_whitespace().nth(3))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(-1.0)
            };
            let (ac, as_) = (avg(&c), avg(&s));
            assert!(ac > 0.0 && ac < 40.0, "{ac} Gb/sec:\n{c}");
            assert!((ac - as_).abs() < 0.011, "client {ac}, server {as_}");
        }
        println!("{test}: {}", c.lines().last().unwrap_or(""));
    }
}

#[test]
fn probe_commands_check_every_operation_both_ways() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxo", 10, 4200).unwrap();
    let mut port = 18900;
    for (op, size, n) in [
        ("write", "65536", "4"),
        ("write_mw", "16384", "4"),
        ("write_imm", "4096", "4"),
        ("read", "1048576", "1"),
        ("send_imm", "16384", "4"),
        ("send_inv", "4096", "1"),
        ("cas", "8", "16"),
        ("faa", "8", "16"),
    ] {
        for (srv, cli) in [("tgt", "req"), ("req", "tgt")] {
            port += 1;
            let p = port.to_string();
            let base = [
                "probe", "-d", "veth0", "-g", "1", "--op", op, "-s", size, "-n", n, "-p", &p,
            ];
            let mut s: Vec<&str> = base.to_vec();
            s.extend(["--role", srv]);
            let mut c: Vec<&str> = base.to_vec();
            c.extend(["--role", cli]);
            let (oc, os) = pair_processes(&pair, &s, &c);
            assert!(oc.contains(": PASS") && os.contains(": PASS"), "{oc}\n{os}");
        }
    }
    // A bad R_Key is REM_ACCESS_ERR for the requester, and both sides agree.
    let base = [
        "probe",
        "-d",
        "veth0",
        "--op",
        "write",
        "-n",
        "1",
        "--bad-rkey",
        "-p",
        "18999",
    ];
    let mut s: Vec<&str> = base.to_vec();
    s.extend(["--role", "tgt"]);
    let mut c: Vec<&str> = base.to_vec();
    c.extend(["--role", "req"]);
    let (oc, os) = pair_processes(&pair, &s, &c);
    assert!(
        oc.contains("bad-rkey: PASS") && os.contains("bad-rkey: PASS"),
        "{oc}\n{os}"
    );
}

#[test]
fn stats_reads_what_a_command_published() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxt", 12, 1500).unwrap();
    let dir = std::env::temp_dir().join(format!("roce-stats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fa, fb) = (dir.join("a.json"), dir.join("b.json"));
    let (fa_s, fb_s) = (fa.to_string_lossy(), fb.to_string_lossy());
    let common = ["pingpong", "-d", "veth0", "-n", "100", "-p", "18530"];
    let mut s: Vec<&str> = common.to_vec();
    s.extend(["--stats-file", &fb_s]);
    let mut c: Vec<&str> = common.to_vec();
    c.extend(["--stats-file", &fa_s]);
    pair_processes(&pair, &s, &c);
    let o = std::process::Command::new(bin())
        .args(["stats", &fa_s, &fb_s])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    // Both final reports, with rxe's counter names and what they mean.
    assert_eq!(out.matches("ended: final report").count(), 2, "{out}");
    assert!(
        out.contains("rdma_sends") && out.contains("SEND work requests completed"),
        "{out}"
    );
    assert!(out.contains("XDP program: seen"), "{out}");
    let o = std::process::Command::new(bin())
        .args(["stats", "--json", &fa_s])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["final"], true);
    assert_eq!(v["counters"]["rdma_sends"], 100);
    assert_eq!(v["counters"]["rdma_recvs"], 100);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn demo_cleans_up_on_ctrl_c() {
    if !need_root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-demo-int-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = std::process::Command::new(bin());
    c.args(["demo", "--no-pcap", "--bytes", "4G"])
        .current_dir(&dir);
    let child = Child::spawn(c);
    let pid = child.0.as_ref().unwrap().id();
    // Interrupt it in the middle of the long WRITE step.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ns = || {
        let o = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| {
                l.contains(&format!("roce-demoa-{pid}-"))
                    || l.contains(&format!("roce-demob-{pid}-"))
            })
            .count()
    };
    while ns() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the demo made no namespaces"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signalling our own child by its PID.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let (ok, out) = child.finish(30);
    assert!(!ok, "{out}");
    assert!(out.contains("interrupted"), "{out}");
    assert_eq!(ns(), 0, "namespaces left behind:\n{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_engine_thread_per_queue() {
    if !need_root() {
        return;
    }
    // Two queues on each veth end, two engine threads per device: RC QPs settle at RTR
    // on the thread the peer's UDP port selects, on both sides alike, so each side's
    // frames arrive on the queue of the thread that holds their QP.
    let pair = Pair::with_queues("rxq", 13, 1500, 2).unwrap();
    let mut ca = roce_xdp::runtime::RuntimeConfig::xdp(&pair.ifname);
    ca.threads = 2;
    ca.netns = Some(pair.a.name.clone());
    let mut cb = ca.clone();
    cb.netns = Some(pair.b.name.clone());
    let da = roce_xdp::runtime::Device::open(ca).unwrap();
    let db = roce_xdp::runtime::Device::open(cb).unwrap();
    assert_eq!(da.threads(), 2);
    println!("{}", da.info().link);
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    // A QP's thread follows its UDP port, a hash of both QP numbers (which start at a
    // random number): six pairs all land on one thread in about one run of eighteen by a
    // simulation of the hash, and twice in four runs here. So pairs are added, up to 24,
    // until both threads of each device hold some (as the threads last published their
    // counts, every few ms).
    let spread = |d: &roce_xdp::runtime::Device| d.thread_stats().iter().all(|s| s.qps > 0);
    let mut ends = Vec::new();
    while ends.len() < 6 || {
        std::thread::sleep(Duration::from_millis(30));
        !(spread(&da) && spread(&db))
    } {
        assert!(
            ends.len() < 24,
            "24 QP pairs, and a thread still holds none"
        );
        let a = end(da.clone(), QpType::Rc, (4 << 20) + 4096);
        let b = end(db.clone(), QpType::Rc, (4 << 20) + 4096);
        join(&a, ip_a, &b, ip_b, 12);
        ends.push((a, b));
    }
    // Every pair at once, each from its own thread, every byte checked.
    std::thread::scope(|s| {
        for (i, (a, b)) in ends.iter().enumerate() {
            s.spawn(move || {
                workload::mixed(
                    a,
                    b,
                    8 << 20,
                    256 << 10,
                    0x700 + i as u64,
                    &mut Progress::hidden(),
                )
                .unwrap_or_else(|e| panic!("pair {i}: {e}"))
            });
        }
    });
    let per = |d: &roce_xdp::runtime::Device| -> Vec<(u64, u64, usize)> {
        d.thread_stats()
            .iter()
            .map(|s| (s.counters.rcvd_pkts, s.forwarded, s.qps))
            .collect()
    };
    std::thread::sleep(Duration::from_millis(100));
    let (pa, pb) = (per(&da), per(&db));
    println!("A per thread (received, handed over, QPs): {pa:?}\nB: {pb:?}");
    // Both threads of each device held QPs and moved traffic.
    for p in [&pa, &pb] {
        assert!(p.iter().all(|x| x.0 > 0 && x.2 > 0), "{p:?}");
        // Aligned: nothing had to be handed to the other thread.
        assert!(p.iter().all(|x| x.1 == 0), "{p:?}");
    }
    // The counters of the device add its threads up.
    let total = da.counters().unwrap();
    assert_eq!(total.rcvd_pkts, pa.iter().map(|x| x.0).sum::<u64>());
    // An SRQ cannot be shared across engine threads: a clear error.
    let e = da.create_srq(ends[0].0.pd, 16, 1).unwrap_err().to_string();
    assert!(e.contains("one engine thread"), "{e}");
}

#[test]
fn frames_on_another_threads_queue_are_handed_over() {
    if !need_root() {
        return;
    }
    // The peer has one engine thread over both queues and sends on them in turn, so
    // half of what reaches the two-thread device lands on the queue of the thread that
    // does not hold the QP: it must be handed over, and nothing lost.
    let pair = Pair::with_queues("rxh", 14, 1500, 2).unwrap();
    let mut ca = roce_xdp::runtime::RuntimeConfig::xdp(&pair.ifname);
    ca.threads = 2;
    ca.netns = Some(pair.a.name.clone());
    let mut cb = roce_xdp::runtime::RuntimeConfig::xdp(&pair.ifname);
    cb.netns = Some(pair.b.name.clone());
    let da = roce_xdp::runtime::Device::open(ca).unwrap();
    let db = roce_xdp::runtime::Device::open(cb).unwrap();
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let a = end(da.clone(), QpType::Rc, MIXED_MEM);
    let b = end(db.clone(), QpType::Rc, MIXED_MEM);
    join(&a, ip_a, &b, ip_b, 12);
    workload::mixed(&a, &b, 16 << 20, 1 << 20, 0x4a4d, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(100));
    let s = da.stats();
    println!("handed over {}, dropped {}", s.forwarded, s.forward_dropped);
    assert!(s.forwarded > 0, "nothing arrived on the other queue?");
    assert_eq!(da.counters().unwrap().drop_unknown_qp, 0);
}

/// `demo --quick --loss 2`: the integrity step runs under 2% loss each way on a bridge,
/// the table says what the loss did, and the capture shows a PSN sequence error NAK
/// tied to the request that revealed the gap, and retransmissions with their cause.
#[test]
fn demo_with_loss_captures_naks_and_retransmissions() {
    if !need_root() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("roce-demo-loss-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("demo.pcap");
    let mut c = std::process::Command::new(bin());
    c.args([
        "demo",
        "--quick",
        "--loss",
        "2",
        "--pcap",
        pcap.to_str().unwrap(),
    ])
    .current_dir(&dir);
    let (ok, out) = Child::spawn(c).finish(240);
    println!("{out}");
    assert!(ok, "{out}");
    assert!(out.contains("every byte correct"), "{out}");
    assert!(out.contains("loss: nftables dropped"), "{out}");
    let o = std::process::Command::new(bin())
        .args(["decode", "--brief", pcap.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let sum = text.split_once("Summary\n").unwrap().1;
    println!("{sum}");
    assert!(sum.contains("  NAKs: "), "no NAK in the capture:\n{sum}");
    assert!(
        sum.contains("PSN sequence error: the responder expected PSN"),
        "{sum}"
    );
    let n: usize = sum
        .split("retransmitted PSNs: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(n > 0, "no retransmission in the capture:\n{sum}");
    assert!(
        sum.contains("go-back-N after the PSN sequence error NAK in frame"),
        "{sum}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_link_flap_is_counted_outlasted_by_a_patient_qp_and_reported_by_an_impatient_one() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxf", 17, 1500).unwrap();
    // Impatient: timeout 12 (about 17 ms, 8 tries: about 0.13 s without progress).
    let (a, b) = xdp_ends(&pair, QpType::Rc, 8 << 20, |_| {});
    // Patient, on the same devices: timeout 18 (about 1.07 s, 8 tries: about 8.6 s).
    let a2 = end(a.dev.clone(), QpType::Rc, 8 << 20);
    let b2 = end(b.dev.clone(), QpType::Rc, 8 << 20);
    join(&a2, IpAddr::V4(pair.ip_a), &b2, IpAddr::V4(pair.ip_b), 18);
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 249) as u8).collect();
    for e in [&a, &a2] {
        e.mem.write(0, &data).unwrap();
    }
    let post = |e: &Endpoint, peer: &Endpoint, i: u64| {
        let off = i as usize * 65536;
        e.qp.post_send(&SendWr::write(
            i,
            &[e.sge(off, 65536)],
            peer.mr.addr + off as u64,
            peer.mr.rkey,
        ))
        .unwrap();
    };
    for i in 0..100 {
        post(&a, &b, i);
        post(&a2, &b2, i);
    }
    // Down once the transfers are under way; more WRs posted while it is down.
    a.next_ok(Duration::from_secs(10)).unwrap();
    a2.next_ok(Duration::from_secs(10)).unwrap();
    let ifname = pair.ifname.as_str();
    pair.a
        .exec(&["ip", "link", "set", "dev", ifname, "down"])
        .unwrap();
    for i in 100..110 {
        post(&a, &b, i);
        post(&a2, &b2, i);
    }
    std::thread::sleep(Duration::from_millis(1500));
    pair.a
        .exec(&["ip", "link", "set", "dev", ifname, "up"])
        .unwrap();

    // The patient QP finishes every WR, byte-exact.
    let wcs: Vec<Wc> = (1..110)
        .map(|_| a2.next_ok(Duration::from_secs(20)).unwrap())
        .collect();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    let n = 110 * 65536;
    assert!(
        b2.mem.to_vec(0, n).unwrap() == data[..n],
        "the patient QP's data differs"
    );
    // The impatient one ran out of retries: one RETRY_EXC_ERR, the rest flushed, each
    // WR completed exactly once; nothing hangs.
    let mut rest = Vec::new();
    while rest.len() < 109 {
        rest.push(a.next_wc(Duration::from_secs(20)).unwrap());
    }
    let mut ids: Vec<u64> = rest.iter().map(|w| w.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (1..110).collect::<Vec<_>>(), "each WR exactly once");
    let failed: Vec<_> = rest
        .iter()
        .filter(|w| w.status != WcStatus::Success)
        .collect();
    assert_eq!(failed[0].status, WcStatus::RetryExcErr, "{failed:?}");
    assert!(failed[1..].iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
    // Both ports saw it go down (B's veth lost its carrier).
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    println!(
        "link_downed A {} B {}; A: {} timeouts, {} packets retransmitted",
        ca.link_downed, cb.link_downed, ca.timeouts, ca.retransmitted_pkts
    );
    assert_eq!((ca.link_downed, cb.link_downed), (1, 1));
    // The port came back: a new connection works at once.
    let a3 = end(a.dev.clone(), QpType::Rc, 1 << 20);
    let b3 = end(b.dev.clone(), QpType::Rc, 1 << 20);
    join(&a3, IpAddr::V4(pair.ip_a), &b3, IpAddr::V4(pair.ip_b), 14);
    a3.mem.write(0, &data[..4096]).unwrap();
    a3.qp
        .post_send(&SendWr::write(
            1,
            &[a3.sge(0, 4096)],
            b3.mr.addr,
            b3.mr.rkey,
        ))
        .unwrap();
    wait_ok(&a3, 1, 10);
    assert_eq!(b3.mem.to_vec(0, 4096).unwrap(), data[..4096]);
}

/// The peer of `a_killed_peer_...`: run as a child process of that test (this test
/// binary again, with ROCE_PEER_HELPER="netns,ifname,peer-ip"). It opens an AF_XDP
/// device, prints its QP and memory key, connects to the QP read from stdin and then
/// serves until killed (or 60 s pass). Without the variable it does nothing.
#[test]
fn peer_helper() {
    let Ok(spec) = std::env::var("ROCE_PEER_HELPER") else {
        return;
    };
    use roce_xdp::apps::endpoint::ConnectOpts;
    use roce_xdp::apps::exchange::{pp_decode, pp_encode};
    use roce_xdp::runtime::{Device, RuntimeConfig};
    let v: Vec<&str> = spec.split(',').collect();
    let mut c = RuntimeConfig::xdp(v[1]);
    c.netns = Some(v[0].to_string());
    let e = end(Device::open(c).unwrap(), QpType::Rc, 1 << 20);
    let peer: IpAddr = v[2].parse().unwrap();
    let me = pp_encode(&e.local(0x200, peer));
    let me = String::from_utf8_lossy(&me)
        .trim_end_matches('\0')
        .to_string();
    println!("PEER {me} {:x} {:x}", e.mr.rkey, e.mr.addr);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let (_, remote) = pp_decode(line.trim().as_bytes()).unwrap();
    let mtu = e.dev.info().port_mtu;
    e.connect(&remote, &ConnectOpts::new(mtu, 0x200)).unwrap();
    println!("CONNECTED");
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts `peer_helper` in `ns`; returns it with its QP, R_Key and address.
fn spawn_peer(
    ns: &str,
    ifname: &str,
    me: IpAddr,
) -> (
    Child,
    std::io::BufReader<std::process::ChildStdout>,
    String,
    u32,
    u64,
) {
    use std::io::BufRead;
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "peer_helper",
        "--exact",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("ROCE_PEER_HELPER", format!("{ns},{ifname},{me}"))
    .stdin(std::process::Stdio::piped());
    // Killed (SIGKILL) and reaped when dropped, on every path.
    let mut child = Child::spawn(c);
    let mut out = std::io::BufReader::new(child.0.as_mut().unwrap().stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the peer exited");
        // The harness prints "test peer_helper ... " before the helper's own lines.
        if let Some(at) = line.find("PEER ") {
            let rest = line[at + 5..].trim();
            let f: Vec<&str> = rest.split(' ').collect();
            let rkey = u32::from_str_radix(f[1], 16).unwrap();
            let addr = u64::from_str_radix(f[2], 16).unwrap();
            return (child, out, f[0].to_string(), rkey, addr);
        }
    }
}

#[test]
fn a_killed_peer_ends_local_qps_with_retry_exc_err_and_frees_its_interface() {
    if !need_root() {
        return;
    }
    use roce_xdp::apps::endpoint::ConnectOpts;
    use roce_xdp::apps::exchange::{pp_decode, pp_encode};
    use roce_xdp::runtime::{Device, RuntimeConfig};
    use std::io::BufRead;
    let pair = Pair::new("rxk", 18, 1500).unwrap();
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let mut c = RuntimeConfig::xdp(&pair.ifname);
    c.netns = Some(pair.a.name.clone());
    let dev = Device::open(c).unwrap();
    let mtu = dev.info().port_mtu;
    // Connects a fresh local QP to a fresh peer process: timeout 12 (about 17 ms per
    // try, 8 tries).
    let connect = || {
        let (mut child, mut out, msg, rkey, addr) = spawn_peer(&pair.b.name, &pair.ifname, ip_a);
        let a = end(dev.clone(), QpType::Rc, 1 << 20);
        let (_, remote) = pp_decode(msg.as_bytes()).unwrap();
        let mut o = ConnectOpts::new(mtu, 0x100);
        o.timeout = 12;
        a.connect(&remote, &o).unwrap();
        let me = pp_encode(&a.local(0x100, ip_b));
        let me = String::from_utf8_lossy(&me)
            .trim_end_matches('\0')
            .to_string();
        let stdin = child.0.as_mut().unwrap().stdin.as_mut().unwrap();
        writeln!(stdin, "{me}").unwrap();
        let mut line = String::new();
        while !line.contains("CONNECTED") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the peer exited");
        }
        (child, a, rkey, addr)
    };
    let (mut child, a, rkey, addr) = connect();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 241) as u8).collect();
    a.mem.write(0, &data).unwrap();
    for i in 0..64u64 {
        let off = (i as usize % 16) * 65536;
        a.qp.post_send(&SendWr::write(
            i,
            &[a.sge(off, 65536)],
            addr + off as u64,
            rkey,
        ))
        .unwrap();
    }
    a.next_ok(Duration::from_secs(10)).unwrap();
    child.kill(); // SIGKILL: no clean-up of its own runs
    let killed = std::time::Instant::now();
    let mut wcs = Vec::new();
    while wcs.len() < 63 {
        wcs.push(a.next_wc(Duration::from_secs(10)).unwrap());
    }
    let first_err = wcs
        .iter()
        .position(|w| w.status != WcStatus::Success)
        .expect("every WR succeeded after the peer was killed");
    assert_eq!(wcs[first_err].status, WcStatus::RetryExcErr, "{wcs:?}");
    assert!(
        wcs[first_err + 1..]
            .iter()
            .all(|w| w.status == WcStatus::WrFlushErr)
    );
    let took = killed.elapsed();
    println!(
        "RETRY_EXC_ERR {:.0} ms after SIGKILL ({} WRs had completed)",
        took.as_secs_f64() * 1e3,
        first_err + 1
    );
    // 8 tries of about 17 ms: well under a second, even on a loaded machine.
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The kernel detached the killed process's XDP program (a BPF link) and freed its
    // UMEM: nothing is left on the interface, and a new engine opens there at once.
    let o = pair
        .b
        .exec(&["ip", "-details", "link", "show", "dev", &pair.ifname])
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        !shown.contains("prog/xdp"),
        "an XDP program stayed: {shown}"
    );
    let (mut child, a2, rkey, addr) = connect();
    a2.mem.write(0, &data[..8192]).unwrap();
    a2.qp
        .post_send(&SendWr::write(1, &[a2.sge(0, 8192)], addr, rkey))
        .unwrap();
    a2.qp
        .post_send(&SendWr::read(2, &[a2.sge(65536, 8192)], addr, rkey))
        .unwrap();
    wait_ok(&a2, 2, 10);
    assert_eq!(a2.mem.to_vec(65536, 8192).unwrap(), data[..8192]);
    child.kill();
}

#[test]
fn a_umem_too_small_for_the_load_slows_the_transfer_and_never_breaks_it() {
    if !need_root() {
        return;
    }
    use roce_xdp::runtime::LinkKind;
    let pair = Pair::new("rxu", 19, 1500).unwrap();
    // 64 UMEM frames per queue: 32 for receiving, 32 for sending, against a workload
    // that keeps hundreds of packets in flight.
    let (a, b) = xdp_ends(&pair, QpType::Rc, MIXED_MEM, |c| {
        if let LinkKind::Xdp { cfg, .. } = &mut c.link {
            cfg.frames = 64;
            cfg.batch = 16;
        }
    });
    let m = workload::mixed(&a, &b, 16 << 20, 1 << 20, 0x77, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    let (sa, sb) = (a.dev.stats(), b.dev.stats());
    println!(
        "{:.1} MiB byte-exact, {:.2} Gbit/s; waits for a UMEM frame to send: A {}, B {}; \
         frames the kernel dropped for want of one: A {}, B {}; retransmitted: A {}, B {}",
        m.report.bytes as f64 / 1048576.0,
        m.report.gbps(),
        sa.tx_waits,
        sb.tx_waits,
        sa.rx_no_room,
        sb.rx_no_room,
        sa.counters.retransmitted_pkts,
        sb.counters.retransmitted_pkts,
    );
    assert!(m.report.bytes >= 16 << 20);
    let ran_out = sa.tx_waits + sb.tx_waits + sa.rx_no_room + sb.rx_no_room;
    assert!(
        ran_out > 0,
        "the UMEM never ran out: the test tests nothing"
    );
    // The waits are reported where users look.
    let shown = roce_xdp::apps::stats::render(
        &roce_xdp::apps::stats::Published {
            path: "test".into(),
            running: true,
            json: sa.to_json(),
        },
        false,
    );
    assert!(
        (shown.contains("tx_waits") || sa.tx_waits == 0)
            && (shown.contains("rx_no_room") || sa.rx_no_room == 0),
        "{shown}"
    );
}

/// Mixed WRITE/READ/SEND/atomics over a bridge that loses, duplicates and corrupts
/// frames (nftables, and an XDP program that flips bits), with engines whose fault
/// layer reorders `reorder`% of what they receive (held 300 us): byte-exact, every WR
/// once.
fn faulty_bridge(tag: &str, third: u8, loss: u32, dup: u32, corrupt: f64, reorder: u32, mib: u64) {
    let br = Bridged::new(tag, third, 2, 1500).unwrap();
    let mut hold = Vec::new();
    for i in 0..2 {
        if loss > 0 {
            br.lose(i, loss).unwrap();
        }
        if dup > 0 {
            br.duplicate(i, dup).unwrap();
        }
        if corrupt > 0.0 {
            hold.push(br.corrupt(i, corrupt).unwrap());
        }
    }
    let (a, b) = xdp_pair(
        &br.ifname,
        (&br.ends[0].name, IpAddr::V4(br.ips[0])),
        (&br.ends[1].name, IpAddr::V4(br.ips[1])),
        QpType::Rc,
        MIXED_MEM,
        10,
        |c| {
            c.faults = (reorder > 0).then_some(roce_xdp::runtime::faults::FaultConfig {
                reorder_percent: reorder,
                hold: Duration::from_micros(300),
                seed: u64::from(third),
            });
        },
    );
    let m = workload::mixed(&a, &b, mib << 20, 1 << 20, 0xfa17, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    let corrupted: Vec<u64> = hold.iter().map(|c| c.corrupted()).collect();
    let reordered = (a.dev.stats().fault_reordered, b.dev.stats().fault_reordered);
    println!(
        "loss {loss}% dup {dup}% corrupt {corrupt}% reorder {reorder}% ({reordered:?} held back): {:.1} MiB byte-exact in {:.2} s ({} WRs); \
         nft dropped {}/{}; corrupted {corrupted:?}; bad ICRC dropped A {} B {}; \
         duplicates answered B {} A {}; retransmitted A {} B {}",
        m.report.bytes as f64 / 1048576.0,
        m.report.elapsed.as_secs_f64(),
        m.report.ops,
        br.lost(0),
        br.lost(1),
        ca.drop_bad_icrc,
        cb.drop_bad_icrc,
        cb.duplicate_request,
        ca.duplicate_request,
        ca.retransmitted_pkts,
        cb.retransmitted_pkts,
    );
    assert!(m.per_kind.iter().all(|&n| n > 0), "{:?}", m.per_kind);
    if corrupt > 0.0 {
        // Every corrupted frame that reached an engine failed its ICRC (a bit flipped in
        // the ICRC-masked BTH byte is harmless and passes).
        assert!(corrupted.iter().all(|&n| n > 0), "nothing was corrupted");
        assert!(ca.drop_bad_icrc + cb.drop_bad_icrc > 0);
        assert!(ca.drop_bad_icrc + cb.drop_bad_icrc <= corrupted.iter().sum::<u64>());
    }
    if dup > 0 {
        assert!(
            cb.duplicate_request + ca.drop_stale_response > 0,
            "nothing was duplicated"
        );
    }
}

#[test]
fn one_percent_loss_each_way_stays_byte_exact() {
    if need_root() {
        faulty_bridge("rxf1", 21, 1, 0, 0.0, 0, 256);
    }
}

#[test]
fn five_percent_loss_each_way_stays_byte_exact() {
    if need_root() {
        faulty_bridge("rxf5", 22, 5, 0, 0.0, 0, 256);
    }
}

#[test]
fn duplicated_frames_are_answered_not_executed_twice() {
    if need_root() {
        faulty_bridge("rxfd", 23, 0, 5, 0.0, 0, 256);
    }
}

#[test]
fn corrupted_frames_fail_their_icrc_and_are_recovered() {
    if need_root() {
        faulty_bridge("rxfc", 24, 0, 0, 1.0, 0, 256);
    }
}

#[test]
fn reordered_frames_stay_byte_exact() {
    if need_root() {
        faulty_bridge("rxfr", 26, 0, 0, 0.0, 5, 256);
    }
}

#[test]
fn loss_duplication_corruption_and_reordering_together_stay_byte_exact() {
    if need_root() {
        faulty_bridge("rxfa", 25, 1, 2, 1.0, 2, 256);
    }
}

/// `roce-xdp soak --minutes 1`, as CI runs it: 100 QPs with loss and reordering for a
/// minute, every byte verified, resident memory flat after the warm-up (the command
/// fails otherwise).
#[test]
fn soak_for_one_minute() {
    if !need_root() {
        return;
    }
    let mut c = std::process::Command::new(bin());
    c.args(["soak", "--minutes", "1"]);
    let (ok, out) = Child::spawn(c).finish(180);
    println!("{out}");
    assert!(ok && out.contains("soak: PASS"), "{out}");
    let progress = out
        .lines()
        .filter(|l| l.trim_end().ends_with(|c: char| c.is_ascii_digit()) && l.contains(" s "))
        .count();
    assert!(progress >= 10, "a progress line every 5 s: {progress}");
}

/// RC over IPv6 (RoCEv2 on 2001:2::/48, the IPv6 benchmarking range) between two
/// engines on AF_XDP: mixed operations byte-exact, every frame IPv6.
#[test]
fn mixed_operations_over_ipv6() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rx6", 27, 1500).unwrap();
    let ips: [std::net::Ipv6Addr; 2] = [
        "2001:2:0:27::1".parse().unwrap(),
        "2001:2:0:27::2".parse().unwrap(),
    ];
    for (ns, ip) in [(&pair.a, ips[0]), (&pair.b, ips[1])] {
        ns.exec(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{}.disable_ipv6=0", pair.ifname),
        ])
        .unwrap();
        ns.exec(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{ip}/64"),
            "dev",
            &pair.ifname,
            "nodad",
        ])
        .unwrap();
    }
    let cap = std::env::temp_dir().join(format!("rx6-{}.pcap", std::process::id()));
    let (a, b) = xdp_pair(
        &pair.ifname,
        (&pair.a.name, IpAddr::V6(ips[0])),
        (&pair.b.name, IpAddr::V6(ips[1])),
        QpType::Rc,
        MIXED_MEM,
        12,
        |c| c.pcap = Some(cap.clone()),
    );
    let m = workload::mixed(&a, &b, 16 << 20, 1 << 20, 0x6, &mut Progress::hidden())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(m.per_kind.iter().all(|&n| n > 0), "{:?}", m.per_kind);
    drop((a, b));
    // Every RoCE frame A captured is IPv6 between the two addresses.
    let capture = roce_xdp::capture::Capture::open(&cap).unwrap();
    let _ = std::fs::remove_file(&cap);
    let _ = std::fs::remove_file(cap.with_extension("b.pcap"));
    let frames: Vec<_> = capture.packets().unwrap().map(|p| p.unwrap()).collect();
    assert!(frames.len() > 1000, "{} frames", frames.len());
    for f in &frames {
        let p = f.roce().unwrap();
        assert!(
            matches!((p.ip().src(), p.ip().dst()), (IpAddr::V6(s), IpAddr::V6(d)) if ips.contains(&s) && ips.contains(&d))
        );
        p.verify().unwrap();
    }
    println!(
        "{:.1} MiB byte-exact over IPv6, {} frames captured, all IPv6 with a good ICRC",
        m.report.bytes as f64 / 1048576.0,
        frames.len()
    );
}

/// The RoCE frames of a capture tagged with VLAN `vid`, and all its other frames.
fn vlan_frames(pcap: &std::path::Path, vid: u16) -> (usize, usize) {
    let cap = roce_xdp::capture::Capture::open(pcap).unwrap();
    let (mut tagged, mut other) = (0, 0);
    for p in cap.packets().unwrap() {
        match p.unwrap().roce() {
            Ok(f) if f.eth().vlan.is_some_and(|t| t.vid == vid) => tagged += 1,
            _ => other += 1,
        }
    }
    (tagged, other)
}

/// 802.1Q over AF_XDP without a VLAN device (this machine kind's kernel has no 802.1Q
/// module): each device is given VLAN 100 with an address, as discovery finds a VLAN
/// subinterface, and static neighbour entries. A WRITE, a READ and a SEND from the VLAN
/// GIDs go byte-exact, and every frame of the capture carries the tag: the XDP program
/// takes tagged frames and the engine tags what it sends from a VLAN GID (the refusal of
/// untagged and wrongly tagged frames is the simulator test's, in engine_features).
#[test]
fn vlan_gids_over_af_xdp_send_and_take_tagged_frames() {
    if !need_root() {
        return;
    }
    use roce_xdp::apps::endpoint::{ConnectOpts, Remote};
    use roce_xdp::runtime::{Device, RuntimeConfig};
    use roce_xdp::verbs::device::gid_of;
    let pair = Pair::new("rxw", 74, 1500).unwrap();
    let (mac_a, mac_b) = (pair.a.mac("veth0").unwrap(), pair.b.mac("veth0").unwrap());
    let (va, vb) = (
        std::net::Ipv4Addr::new(198, 18, 75, 1),
        std::net::Ipv4Addr::new(198, 18, 75, 2),
    );
    let fmt = |m: [u8; 6]| roce_xdp::wire::eth::fmt_mac(&m).to_string();
    pair.a
        .exec(&[
            "ip",
            "neigh",
            "add",
            &vb.to_string(),
            "lladdr",
            &fmt(mac_b),
            "dev",
            "veth0",
        ])
        .unwrap();
    pair.b
        .exec(&[
            "ip",
            "neigh",
            "add",
            &va.to_string(),
            "lladdr",
            &fmt(mac_a),
            "dev",
            "veth0",
        ])
        .unwrap();
    let dir = std::env::temp_dir().join(format!("roce-vlan-x-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("a.pcap");
    let open = |ns: &roce_xdp::netns::Netns, m, ip, vip, seed, pcap: Option<&std::path::Path>| {
        let mut c = RuntimeConfig::xdp("veth0");
        c.netns = Some(ns.name.clone());
        c.pcap = pcap.map(|p| p.to_path_buf());
        let mut d = DeviceConfig::new(m, ip);
        d.port_mtu = Mtu::Mtu1024;
        d.seed = seed;
        d.vlans = vec![VlanNetdev {
            name: "veth0.100".into(),
            index: 0,
            vid: 100,
            ipv4: vec![vip],
            ipv6: vec![],
        }];
        c.device = Some(d);
        end(Device::open(c).unwrap(), QpType::Rc, 1 << 20)
    };
    let a = open(&pair.a, mac_a, pair.ip_a, va, 11, Some(&pcap));
    let b = open(&pair.b, mac_b, pair.ip_b, vb, 12, None);
    // fe80, veth0's address, then VLAN 100's.
    assert_eq!(a.dev.gid(2), Some(gid_of(IpAddr::V4(va))));
    let (pa, pb) = (0x10, 0x20);
    let mut oa = ConnectOpts::new(Mtu::Mtu1024, pa);
    oa.sgid_index = Some(2);
    let mut ob = ConnectOpts::new(Mtu::Mtu1024, pb);
    ob.sgid_index = Some(2);
    let ra = Remote {
        qpn: a.qp.qpn,
        psn: pa,
        gid: gid_of(IpAddr::V4(va)),
    };
    let rb = Remote {
        qpn: b.qp.qpn,
        psn: pb,
        gid: gid_of(IpAddr::V4(vb)),
    };
    a.connect(&rb, &oa).unwrap();
    b.connect(&ra, &ob).unwrap();
    let data: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
    a.mem.write(0, &data).unwrap();
    b.qp.post_recv(&RecvWr::new(1, &[b.sge(0, 32768)])).unwrap();
    a.qp.post_send(&SendWr::send(1, &[a.sge(0, 20000)]))
        .unwrap();
    a.qp.post_send(&SendWr::write(
        2,
        &[a.sge(0, 20000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    a.qp.post_send(&SendWr::read(
        3,
        &[a.sge(200_000, 20000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    wait_ok(&a, 3, 10);
    wait_ok(&b, 1, 10);
    assert_eq!(b.mem.to_vec(0, 20000).unwrap(), data);
    assert_eq!(b.mem.to_vec(65536, 20000).unwrap(), data);
    assert_eq!(a.mem.to_vec(200_000, 20000).unwrap(), data);
    drop(a);
    drop(b);
    let (tagged, other) = vlan_frames(&pcap, 100);
    assert!(tagged >= 40 && other == 0, "{tagged} tagged, {other} not");
    let _ = std::fs::remove_dir_all(&dir);
}

/// 802.1Q over AF_XDP: each namespace has `veth0.100`, whose address is GID 2 of the
/// veth0 device (after the link-local and veth0's own). pingpong and the probe's WRITE,
/// READ and atomics on that GID go byte-exact both ways, and every RoCE frame of the
/// captures is tagged with VLAN 100 (the XDP program takes tagged frames, the engine
/// tags what it sends from a VLAN GID).
#[test]
fn vlan_subinterface_gids_carry_tagged_traffic() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxv", 72, 1500).unwrap();
    let (_, va, vb) = match pair.add_vlan(100, 73) {
        Ok(v) => v,
        // Not a missing privilege: the kernel cannot make VLAN devices at all (this
        // machine kind's has no CONFIG_VLAN_8021Q); the test before this one covers the
        // engine and the XDP program without one.
        Err(e) if e.contains("Unknown device type") => {
            eprintln!("SKIPPED: this kernel has no 802.1Q VLAN devices: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let dir = std::env::temp_dir().join(format!("roce-vlan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut port = 19400u16;
    let mut runs: Vec<Vec<String>> = vec![vec![
        "pingpong".into(),
        "-n".into(),
        "100".into(),
        "-s".into(),
        "4096".into(),
        "-c".into(),
    ]];
    for (op, size, n) in [
        ("write", "65536", "2"),
        ("read", "65536", "2"),
        ("cas", "8", "8"),
        ("faa", "8", "8"),
    ] {
        for role in ["tgt", "req"] {
            runs.push(
                ["probe", "--op", op, "-s", size, "-n", n, "--role", role]
                    .map(String::from)
                    .to_vec(),
            );
        }
    }
    for (i, r) in runs.iter().enumerate() {
        port += 1;
        let p = port.to_string();
        let pcap = dir.join(format!("run{i}.pcap"));
        let common = ["-d", "veth0", "-g", "2", "-p", &p, "--timeout", "20"];
        let mut s: Vec<&str> = r.iter().map(String::as_str).collect();
        s.extend(common);
        // The client plays the other role of a probe.
        let mut c = s.clone();
        if let Some(k) = c.iter().position(|x| *x == "--role") {
            c[k + 1] = if c[k + 1] == "tgt" { "req" } else { "tgt" };
        }
        c.extend(["--pcap", pcap.to_str().unwrap()]);
        let (oc, os) = pair_processes(&pair, &s, &c);
        assert!(
            !os.contains("invalid data") && !oc.contains("FAIL"),
            "{oc}\n{os}"
        );
        if r[0] == "pingpong" {
            assert!(oc.contains(&format!("GID ::ffff:{va}")), "{oc}");
            assert!(oc.contains(&format!("GID ::ffff:{vb}")), "{oc}");
        } else {
            assert!(oc.contains(": PASS") && os.contains(": PASS"), "{oc}\n{os}");
        }
        let (tagged, other) = vlan_frames(&pcap, 100);
        assert!(
            tagged > 0 && other == 0,
            "{r:?}: {tagged} tagged, {other} not"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench latency --quick`: the report is well formed (a benchmark, not a timed test:
/// only that every figure was measured is checked, never how fast).
#[test]
fn bench_latency_reports_every_round_trip_figure() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["latency", "--quick"]);
    assert_eq!(j["bench"], "latency");
    assert_eq!(
        (j["iters"].as_u64(), j["message_size"].as_u64()),
        (Some(2000), Some(64))
    );
    let reps = j["reps"].as_array().unwrap();
    assert_eq!(reps.len(), 1);
    for k in [
        "kernel_udp",
        "raw_xdp_echo",
        "raw_xdp_echo_spinning",
        "rc_send",
        "rc_send_busy_poll",
        "rc_send_udp_link",
        "rc_write",
        "rc_write_busy_poll",
        "rc_write_udp_link",
    ] {
        let (m, p) = (
            reps[0][k]["median_us"].as_f64().unwrap(),
            reps[0][k]["p99_us"].as_f64().unwrap(),
        );
        assert!(m > 0.0 && p >= m, "{k}: median {m}, p99 {p}");
    }
    for k in [
        "rc_to_udp",
        "rc_busy_poll_to_udp",
        "rc_udp_link_to_udp",
        "rc_to_raw_echo",
        "rc_busy_poll_to_raw_echo_spinning",
        "rc_write_to_udp",
        "rc_write_busy_poll_to_udp",
        "rc_write_udp_link_to_udp",
        "rc_write_to_raw_echo",
        "rc_write_busy_poll_to_raw_echo_spinning",
    ] {
        assert!(j[k].as_f64().unwrap() > 0.0, "{k}");
    }
    assert!(
        j["link"].as_str().unwrap().contains("AF_XDP"),
        "{}",
        j["link"]
    );
}

/// `bench ceiling --quick`: both MTUs reported with every figure (a benchmark: only that
/// each was measured is checked).
#[test]
fn bench_ceiling_reports_raw_and_rc_frame_rates_at_both_mtus() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["ceiling", "--quick"]);
    assert_eq!(j["bench"], "ceiling");
    let rows = j["mtus"].as_array().unwrap();
    let mtus: Vec<_> = rows.iter().map(|r| r["ib_mtu"].as_u64().unwrap()).collect();
    assert_eq!(mtus, [1024, 4096]);
    // A WRITE MIDDLE: Ethernet, IPv4, UDP, BTH, the payload, the ICRC.
    for (r, payload) in rows.iter().zip([1024, 4096]) {
        assert_eq!(
            r["frame_bytes"].as_u64(),
            Some(14 + 20 + 8 + 12 + payload + 4)
        );
        let reps = r["reps"].as_array().unwrap();
        assert_eq!(reps.len(), 1);
        for k in ["raw_pps", "write_pps", "read_pps"] {
            assert!(reps[0][k].as_f64().unwrap() > 0.0, "{payload}: {k}");
        }
        for k in ["write_to_raw", "read_to_raw"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{payload}: {k}");
        }
    }
    assert!(rows[1]["link"].as_str().unwrap().contains("multi-buffer"));
}

/// `bench goodput --quick`: every verb at both sizes and both MTUs measured beside its
/// raw frame rate (a benchmark: only that each figure exists and adds up is checked).
#[test]
fn bench_goodput_reports_every_verb_beside_its_raw_frame_rate() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["goodput", "--quick"]);
    assert_eq!(j["bench"], "goodput");
    let rows = j["mtus"].as_array().unwrap();
    let mtus: Vec<_> = rows.iter().map(|r| r["ib_mtu"].as_u64().unwrap()).collect();
    assert_eq!(mtus, [1024, 4096]);
    for r in rows {
        let mtu = r["ib_mtu"].as_u64().unwrap();
        // READs outstanding are the devices' limit, as perftest's default `-o`.
        assert_eq!(
            r["out_reads"].as_u64(),
            Some(u64::from(
                roce_xdp::verbs::DeviceLimits::default().max_qp_rd_atom
            ))
        );
        let sizes = r["sizes"].as_array().unwrap();
        let got: Vec<_> = sizes.iter().map(|p| p["size"].as_u64().unwrap()).collect();
        assert_eq!(got, [64, 65536]);
        for p in sizes {
            let size = p["size"].as_u64().unwrap();
            // A 64 B WRITE ONLY carries a RETH; a 64 KiB message is full WRITE MIDDLEs.
            let frame = if size < mtu {
                14 + 20 + 8 + 12 + 16 + size + 4
            } else {
                14 + 20 + 8 + 12 + mtu + 4
            };
            assert_eq!(p["frame_bytes"].as_u64(), Some(frame), "{mtu}/{size}");
            assert_eq!(p["frames_per_msg"].as_u64(), Some(size.div_ceil(mtu)));
            // The ceiling is measured on both sides of the streams, and is their mean.
            let raw = |k: &str| p[k][0].as_f64().unwrap();
            assert!(
                raw("raw_pps_before") > 0.0 && raw("raw_pps_after") > 0.0,
                "{p}"
            );
            let mean = (raw("raw_pps_before") + raw("raw_pps_after")) / 2.0;
            assert!((raw("raw_pps") - mean).abs() <= mean * 1e-9, "{p}");
            assert!(p["raw_read_pps"][0].as_f64().unwrap() > 0.0);
            assert!(p["udp_pps"][0].as_f64().unwrap() > 0.0);
            assert_eq!(p["udp_payload"].as_u64(), Some(size.min(mtu)));
            // READ's raw echo: a READ REQUEST (RETH) out, READ RESPONSE frames back (ONLY
            // with its AETH, or full-MTU MIDDLEs), as many outstanding as a window of
            // 128 PSNs holds and the stream has in flight.
            let e = &p["raw_echo"];
            assert_eq!(e["request_bytes"].as_u64(), Some(14 + 20 + 8 + 12 + 16 + 4));
            let response = if size <= mtu {
                14 + 20 + 8 + 12 + 4 + size + 4
            } else {
                14 + 20 + 8 + 12 + mtu + 4
            };
            assert_eq!(e["response_bytes"].as_u64(), Some(response), "{e}");
            let per = size.div_ceil(mtu);
            assert_eq!(e["frames_per_request"].as_u64(), Some(per), "{e}");
            let depth = p["depth"].as_u64().unwrap();
            assert_eq!(
                e["window"].as_u64(),
                Some((128 / per).clamp(1, depth)),
                "{e}"
            );
            assert!(e["requests_per_sec"][0].as_f64().unwrap() > 0.0, "{e}");
            assert!(e["stalls"][0].is_u64(), "{e}");
            assert!(p["ops"]["READ"]["ratio_to_raw_echo"].as_f64().unwrap() > 0.0);
            assert!(p["ops"]["WRITE"]["ratio_to_raw_echo"].is_null());
            for op in ["WRITE", "READ", "SEND"] {
                let f = &p["ops"][op];
                let (gbps, rate) = (
                    f["gbps"][0].as_f64().unwrap(),
                    f["msg_rate"][0].as_f64().unwrap(),
                );
                assert!(gbps > 0.0 && rate > 0.0, "{mtu}/{size} {op}: {f}");
                // Goodput is the message rate times the message.
                let want = rate * size as f64 * 8.0 / 1e9;
                assert!((gbps - want).abs() <= want * 1e-6, "{mtu}/{size} {op}: {f}");
                assert!(f["ratio_to_raw"].as_f64().unwrap() > 0.0);
                assert!(f["ratio_to_raw_read"].as_f64().unwrap() > 0.0);
                assert!(f["ratio_to_udp"].as_f64().unwrap() > 0.0);
            }
        }
    }
}

/// `bench goodput --link udp`: the engines on the UDP link, the ceilings as over AF_XDP.
#[test]
fn bench_goodput_runs_the_engines_on_the_udp_link() {
    if !need_root() {
        return;
    }
    let j = bench_json(&[
        "goodput", "--quick", "--link", "udp", "-m", "1024", "-s", "65536", "--op", "write",
    ]);
    assert_eq!(j["engine_link"], "udp");
    let row = &j["mtus"][0];
    assert!(
        row["link"].as_str().unwrap().starts_with("UDP socket"),
        "{}",
        row["link"]
    );
    let f = &row["sizes"][0]["ops"]["WRITE"];
    assert!(f["gbps"][0].as_f64().unwrap() > 0.0, "{f}");
    assert!(f["ratio_to_udp"].as_f64().unwrap() > 0.0, "{f}");
}

/// `bench qps --quick`: every one of the 1000 QPs completed WRITEs (each had one
/// outstanding from the start, round-robin); both goodputs, the frames each stream sent
/// each way and both memory figures measured. A benchmark: beyond what the protocol
/// fixes (frames and ACKs per WRITE), no figure's size is checked here;
/// tests/engine_no_alloc.rs holds the engine to its bytes per QP.
#[test]
fn bench_qps_serves_every_qp_and_measures_what_an_idle_one_costs() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["qps", "--quick"]);
    assert_eq!(j["bench"], "qps");
    assert_eq!(j["qps"].as_u64(), Some(1000));
    let r = &j["reps"][0];
    assert_eq!(r["active_qps"].as_u64(), Some(1000), "{r}");
    assert!(r["fewest_writes"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["single_gbps"].as_f64().unwrap() > 0.0, "{r}");
    // The one QP streams on both sides of the N, and is measured as the two together.
    let (before, after) = (
        r["single_before_gbps"].as_f64().unwrap(),
        r["single_after_gbps"].as_f64().unwrap(),
    );
    assert!(before > 0.0 && after > 0.0, "{r}");
    let single = r["single_gbps"].as_f64().unwrap();
    assert!(
        single >= before.min(after) - 1e-9 && single <= before.max(after) + 1e-9,
        "{r}"
    );
    assert!(r["many_gbps"].as_f64().unwrap() > 0.0, "{r}");
    // 4 KiB WRITEs at IB MTU 1024: four request frames each at least. With one
    // outstanding per QP each of the N QPs' WRITEs needs an ACK; the single QP's ACKs
    // cover several WRITEs each. The goodput ratio is the product of the two frame
    // ratios.
    for stream in ["single_frames", "many_frames"] {
        let f = &r[stream];
        let writes = f["writes"].as_f64().unwrap();
        assert!(writes >= 1.0, "{stream}: {f}");
        assert!(
            f["a_sent"].as_f64().unwrap() >= 4.0 * writes,
            "{stream}: {f}"
        );
    }
    let acks = |stream: &str| r[stream]["acks_per_write"].as_f64().unwrap();
    assert!(acks("many_frames") >= 1.0, "{r}");
    assert!(acks("single_frames") < 1.0, "{r}");
    let product =
        r["frame_rate_ratio"].as_f64().unwrap() * r["frames_per_write_ratio"].as_f64().unwrap();
    assert!((product - r["ratio"].as_f64().unwrap()).abs() < 1e-6, "{r}");
    assert!(j["engine_bytes_per_idle_qp"].as_f64().unwrap() > 0.0, "{j}");
    assert!(
        j["process_bytes_per_idle_qp"].as_f64().unwrap() > 0.0,
        "{j}"
    );
}

/// `bench --quick`: every part ran and every headline ratio was measured, each with
/// its target where the issue sets one (a benchmark: no ratio's size is checked).
#[test]
fn bench_alone_runs_every_part_and_prints_each_ratio_beside_its_target() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["--quick"]);
    assert_eq!(
        (j["bench"].as_str(), j["quick"].as_bool()),
        (Some("all"), Some(true))
    );
    for (part, name) in [
        ("goodput", "goodput"),
        ("udp_link", "goodput"),
        ("latency", "latency"),
        ("qps", "qps"),
        ("loss", "loss"),
    ] {
        assert_eq!(j[part]["bench"], name, "{part}");
    }
    assert_eq!(j["udp_link"]["engine_link"], "udp");
    let h = j["headlines"].as_array().unwrap();
    // 64 KiB W/R/S at two MTUs against both raw ceilings, 64 KiB READ at two MTUs and
    // 64 B READ against the READ-shaped raw echo, 64 B W/R/S, three SEND and three WRITE
    // round trips over the kernel's UDP and two over the raw AF_XDP echo, one UDP-link
    // goodput, two loss rates, 1000 QPs.
    assert_eq!(h.len(), 6 + 6 + 3 + 3 + 3 + 3 + 2 + 1 + 2 + 1, "{h:?}");
    let over = |what: &str| h.iter().filter(|x| x["over"] == what).count();
    assert_eq!(over("raw frames, receiver reading"), 6, "{h:?}");
    assert_eq!(over("raw echo, READ-shaped, both ways"), 3, "{h:?}");
    for x in h {
        assert!(x["ratio"].as_f64().unwrap() > 0.0, "{x}");
        assert_eq!(x["met"].is_boolean(), !x["target"].is_null(), "{x}");
    }
    assert!(j["engine_bytes_per_idle_qp"].as_f64().unwrap() > 0.0);
    // The two sides ran on different cores (CI's machine has two), and the JSON says
    // which.
    let allowed = roce_xdp::host::allowed_cpus();
    if allowed.len() >= 2 {
        assert_eq!(
            j["side_cpus"],
            serde_json::json!([allowed[0], allowed[1]]),
            "{}",
            j["side_cpus"]
        );
        // A cache line's round trip between those cores, probed around every
        // repetition.
        let probes = j["core_round_trip_ns"].as_array().unwrap();
        assert!(!probes.is_empty(), "{j}");
        assert!(
            probes.iter().all(|p| p.as_f64().unwrap() > 0.0),
            "{probes:?}"
        );
    }
}

/// `bench send -s 4096`: one test printed in ib_send_bw's layout, with the raw ceiling.
#[test]
fn bench_send_prints_one_test_as_perftest_does() {
    if !need_root() {
        return;
    }
    let out = std::process::Command::new(bin())
        .args(["bench", "send", "-s", "4096", "-D", "0.1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("RDMA_SEND BW Test"), "{text}");
    assert!(
        text.contains("#bytes     #iterations    BW peak[Gb/sec]"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("4096 "))
        .unwrap_or_else(|| panic!("no 4096-byte row: {text}"));
    let cols: Vec<f64> = row.split_whitespace().map(|c| c.parse().unwrap()).collect();
    assert_eq!(cols.len(), 5, "{row}");
    assert!(
        cols[1] > 0.0 && cols[3] > 0.0 && cols[4] > 0.0 && cols[2] >= cols[3],
        "{row}"
    );
    assert!(text.contains("raw AF_XDP, 1082-byte frames"), "{text}");
    assert!(
        text.contains("before and after each repetition's streams, which differed by up to"),
        "{text}"
    );
    assert!(
        text.contains("raw AF_XDP, receiver reading each frame (CRC pass and copy)"),
        "{text}"
    );
    if roce_xdp::host::allowed_cpus().len() >= 2 {
        assert!(text.contains("sides pinned: A's engine"), "{text}");
        assert!(
            text.contains("rep 1: a cache line between the cores ")
                && text.contains("a cache line's round trip between those cores "),
            "{text}"
        );
    }
    assert!(text.contains("kernel UDP, 1024-byte datagrams"), "{text}");
}

/// `bench loss --quick`: lossless on both sides of both loss rates, the loss visible in
/// what nftables dropped and what A sent again (a benchmark: no figure's size is checked).
#[test]
fn bench_loss_reports_goodput_beside_lossless_with_what_recovery_took() {
    if !need_root() {
        return;
    }
    let j = bench_json(&["loss", "--quick"]);
    assert_eq!(j["bench"], "loss");
    assert_eq!(j["percents"], serde_json::json!([1, 2]));
    let reps = j["reps"].as_array().unwrap();
    assert_eq!(reps.len(), 1);
    // Lossless before and after the lossy streams, measured against their mean.
    for k in ["lossless", "lossless_after"] {
        let clean = &reps[0][k];
        assert!(clean["gbps"].as_f64().unwrap() > 0.0, "{k}: {clean}");
        assert_eq!(clean["dropped"].as_u64(), Some(0), "{k}: {clean}");
    }
    let g = |k: &str| reps[0][k]["gbps"].as_f64().unwrap();
    let mean = reps[0]["lossless_gbps"].as_f64().unwrap();
    assert!((mean - (g("lossless") + g("lossless_after")) / 2.0).abs() < 1e-9);
    for x in reps[0]["lossy"].as_array().unwrap() {
        assert!(x["gbps"].as_f64().unwrap() > 0.0, "{x}");
        assert!(x["dropped"].as_u64().unwrap() > 0, "{x}");
        assert!(x["retransmitted"].as_u64().unwrap() > 0, "{x}");
    }
    for r in j["ratios"].as_array().unwrap() {
        assert!(r["to_lossless"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// A batch of frames takes one `sendto` (copy mode transmits up to 32 descriptors per
/// call, synchronously); the turns after it must not kick again for frames the kernel
/// has already sent. Before the fix every batch cost two system calls. Nor may the
/// link hold its engine awake for them: once the kernel has taken the batch, nothing
/// waits for a kick, though the completions come later (the engine used to spin on
/// `sendto` and `sched_yield` until they did).
#[test]
fn the_tx_ring_is_kicked_once_per_batch_not_again_for_sent_frames() {
    if !need_root() {
        return;
    }
    use roce_xdp::link::FrameLink;
    use roce_xdp::link::xdp::{XdpConfig, XdpLink};
    let pair = Pair::new("rxj", 20, 1500).unwrap();
    // An Ethernet frame of a local experimental ethertype: B's kernel drops it.
    let mut frame = vec![0u8; 128];
    frame[..6].copy_from_slice(&pair.b.mac(&pair.ifname).unwrap());
    frame[6..12].copy_from_slice(&pair.a.mac(&pair.ifname).unwrap());
    frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    let (ns, ifname, ip) = (pair.a.name.clone(), pair.ifname.clone(), pair.ip_a);
    let kicks = std::thread::spawn(move || -> Vec<u64> {
        roce_xdp::host::enter_netns(&ns).unwrap();
        let mut link = XdpLink::open(&ifname, &[IpAddr::V4(ip)], &XdpConfig::default()).unwrap();
        let mut kicks = Vec::new();
        for batch in [1usize, 32] {
            let before = link.stats.tx_kicks;
            let mut left = batch;
            let sent = link.send(&mut |mut buf| {
                if left == 0 {
                    return None;
                }
                left -= 1;
                assert!(buf.write(&frame));
                Some(frame.len())
            });
            assert_eq!(sent, batch);
            assert!(
                !link.tx_pending(),
                "the sendto took all {batch} frames: none waits for another kick"
            );
            // The engine's loop turns that follow: nothing new to send.
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(2));
                link.flush();
                link.send(&mut |_| None);
            }
            assert!(!link.tx_pending(), "the kernel sent every frame");
            kicks.push(link.stats.tx_kicks - before);
        }
        kicks
    })
    .join()
    .unwrap();
    assert_eq!(kicks, vec![1, 1], "sendto calls per batch of 1 and of 32");
}

//! The UDP link: the engine over a UDP socket, where the kernel writes IP and UDP.
//! - against an AF_XDP engine, which verifies every ICRC over the header as it was on
//!   the wire: this is what shows that Linux sends our datagrams with IPv4 ID 0 and DF,
//!   the header the UDP link computed the ICRC over;
//! - without root privileges (dropped with setpriv): `demo` falls back to the UDP link on
//!   loopback, and two `pingpong` processes talk over it.

mod common;
use common::rt::*;
use roce_xdp::apps::endpoint::Endpoint;
use roce_xdp::apps::progress::Progress;
use roce_xdp::apps::workload;
use roce_xdp::capture::Capture;
use roce_xdp::netns::{Netns, Pair};
use roce_xdp::runtime::{Device, RuntimeConfig};
use roce_xdp::verbs::*;
use roce_xdp::wire::IpView;
use std::net::IpAddr;

/// A UDP-link device on `ip`, its engine in namespace `ns`.
fn udp_in(ns: &Netns, ip: std::net::Ipv4Addr) -> RuntimeConfig {
    let mut c = RuntimeConfig::udp(IpAddr::V4(ip));
    c.netns = Some(ns.name.clone());
    c
}

#[test]
fn udp_link_and_af_xdp_interoperate_with_the_kernel_writing_id_0_and_df() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxu", 8, 1500).unwrap();
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let ca = udp_in(&pair.a, pair.ip_a);
    let dir = std::env::temp_dir().join(format!("roce-udp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("b.pcap");
    let mut cb = RuntimeConfig::xdp(&pair.ifname);
    cb.netns = Some(pair.b.name.clone());
    cb.pcap = Some(pcap.clone());
    let a = end(Device::open(ca).unwrap(), QpType::Rc, MIXED_MEM);
    let b = end(Device::open(cb).unwrap(), QpType::Rc, MIXED_MEM);
    assert!(a.dev.info().link.contains("UDP"), "{}", a.dev.info().link);
    join(&a, ip_a, &b, ip_b, 12);
    let m = workload::mixed(&a, &b, 16 << 20, 1 << 20, 0x0d1, &mut Progress::hidden())
        .unwrap_or_else(|e| {
            panic!(
                "{e}\nUDP side:\n{}\nAF_XDP side:\n{}\n{:?}",
                a.dev.counters().unwrap(),
                b.dev.counters().unwrap(),
                b.dev.stats().xdp
            )
        });
    let (ca, cb) = (a.dev.counters().unwrap(), b.dev.counters().unwrap());
    println!(
        "{:.1} MiB byte-exact between the UDP link and AF_XDP; UDP side: {} sent, {} received; AF_XDP side: {} bad ICRC",
        m.report.bytes as f64 / 1048576.0,
        ca.sent_pkts,
        ca.rcvd_pkts,
        cb.drop_bad_icrc
    );
    assert_eq!(
        cb.drop_bad_icrc, 0,
        "the kernel's header differs from the ICRC's"
    );
    assert_eq!(ca.drop_bad_icrc, 0, "AF_XDP frames did not verify as ID 0");
    // They did as they came, with nothing to solve (rxe's frames are: interop row 7).
    assert_eq!(a.dev.stats().udp_ipv4_ids_solved, Some(0));
    assert_eq!(b.dev.stats().udp_ipv4_ids_solved, None);
    b.dev.shutdown();
    // On the wire (as the AF_XDP side received them): ID 0, DF, source port 4791.
    let cap = Capture::open(&pcap).unwrap();
    let mut from_udp = 0;
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let Ok(f) = p.roce() else { continue };
        let IpView::V4(h) = f.ip() else { continue };
        if IpAddr::V4(h.source_addr()) != ip_a {
            continue;
        }
        from_udp += 1;
        assert_eq!(h.identification(), 0, "frame {}", p.index);
        assert!(h.dont_fragment(), "frame {}", p.index);
        assert_eq!(f.udp().source_port(), 4791);
        assert_eq!(f.udp().checksum(), 0, "UDP checksum 0 over IPv4, as rxe");
        f.verify().unwrap();
    }
    assert!(from_udp > 1000, "only {from_udp} frames from the UDP link");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of the binary that any user can run (the build tree may not be readable).
fn public_bin(dir: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let p = dir.join("roce-xdp");
    std::fs::copy(bin(), &p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.to_string_lossy().into_owned()
}

/// A command run inside `ns` as user `nobody`, every capability dropped.
fn as_nobody(ns: &Netns, args: &[&str], cwd: &std::path::Path) -> std::process::Command {
    let mut c = ns.command("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ]);
    c.args(args);
    c.current_dir(cwd);
    c
}

#[test]
fn demo_without_root_runs_over_the_udp_link() {
    if !need_root() {
        return;
    }
    let ns = Netns::new("rxd").unwrap();
    let dir = std::env::temp_dir().join(format!("roce-nobody-{}", std::process::id()));
    let exe = public_bin(&dir);
    let c = as_nobody(&ns, &[&exe, "demo", "--quick"], &dir);
    let (ok, out) = Child::spawn(c).finish(120);
    println!("{out}");
    assert!(ok, "{out}");
    assert!(out.contains("AF_XDP not possible here (not root"), "{out}");
    assert!(out.contains("UDP socket on 127.0.0.1:4791"), "{out}");
    assert!(out.contains("every byte correct"), "{out}");
    // The capture it wrote decodes, every ICRC good; it samples every step, each
    // step's first frame commented, and every opcode the steps use appears.
    let cap = Capture::open(&dir.join("demo.pcap")).unwrap();
    let mut n = 0;
    let mut steps = Vec::new();
    let mut ops = std::collections::BTreeSet::new();
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let f = p.roce().unwrap();
        f.verify().unwrap();
        ops.insert(f.roce().info().name);
        // Step comments, and the comments on the first frame of each opcode kept
        // after a step's sample ("the first RC_COMPARE_SWAP of this section; ...").
        match p.comment {
            Some(c) if c.starts_with("demo step ") => steps.push(c.to_string()),
            Some(c) => assert!(c.starts_with("the first "), "{c}"),
            None => {}
        }
        n += 1;
    }
    assert!(n > 1000, "{n} frames in demo.pcap");
    assert_eq!(steps.len(), 5, "{steps:?}");
    assert!(
        steps[0].starts_with("demo step 1: RC SEND ping-pong"),
        "{steps:?}"
    );
    assert!(steps[4].starts_with("demo step 5: integrity"), "{steps:?}");
    for op in [
        "RC_SEND_ONLY",
        "RC_ACKNOWLEDGE",
        "RC_RDMA_WRITE_FIRST",
        "RC_RDMA_WRITE_MIDDLE",
        "RC_RDMA_WRITE_LAST",
        "RC_RDMA_READ_REQUEST",
        "RC_RDMA_READ_RESPONSE_FIRST",
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        "RC_RDMA_READ_RESPONSE_LAST",
        "RC_COMPARE_SWAP",
        "RC_FETCH_ADD",
        "RC_ATOMIC_ACKNOWLEDGE",
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        "RC_SEND_FIRST",
        "RC_SEND_LAST_WITH_IMMEDIATE",
    ] {
        assert!(ops.contains(op), "{op} not in the demo capture: {ops:?}");
    }
    assert!(n < 5 * 400 + 5 * 64, "{n} frames: the sample is bounded");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pingpong_without_root_over_the_udp_link() {
    if !need_root() {
        return;
    }
    let ns = Netns::new("rxq").unwrap();
    let dir = std::env::temp_dir().join(format!("roce-nobody-pp-{}", std::process::id()));
    let exe = public_bin(&dir);
    for (i, extra) in [vec![], vec!["--uc", "-s", "100"], vec!["--ud", "-s", "512"]]
        .iter()
        .enumerate()
    {
        let port = (19515 + i).to_string();
        let common = ["pingpong", "-n", "200", "-p", &port, "--timeout", "20"];
        let mut sa: Vec<&str> = vec![&exe];
        sa.extend(common);
        sa.extend(extra.iter().copied());
        let mut ca = sa.clone();
        sa.extend(["--udp", "127.0.0.2"]);
        ca.extend(["--udp", "127.0.0.1", "127.0.0.2"]);
        let server = Child::spawn(as_nobody(&ns, &sa, &dir));
        let client = Child::spawn(as_nobody(&ns, &ca, &dir));
        let (ok_c, out_c) = client.finish(60);
        let (ok_s, out_s) = server.finish(30);
        assert!(ok_c && ok_s, "client:\n{out_c}\nserver:\n{out_s}");
        assert!(out_c.contains("200 iters in"), "{out_c}");
        assert!(out_s.contains("GID ::ffff:127.0.0.1"), "{out_s}");
        println!("{extra:?}: {}", out_c.lines().last().unwrap_or(""));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad `--mtu` is refused before anything is created, root or not: by the command's
/// argument check (exit status 2, the valid range), and by `demo::run` itself with its
/// own message (before, as root, `ip link set mtu 7` failed after the namespaces were
/// made).
#[test]
fn demo_refuses_a_bad_mtu_before_creating_anything() {
    for bad in ["7", "315", "9001"] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_roce-xdp"))
            .args(["demo", "--no-pcap", "--mtu", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("316..=9000"), "{err}");
    }
    let o = roce_xdp::apps::demo::Opts {
        netdev_mtu: 7,
        pcap: None,
        ..roce_xdp::apps::demo::Opts::default()
    };
    let e = roce_xdp::apps::demo::run(&o, &mut |_| {}).unwrap_err();
    assert!(e.contains("316 (IB MTU 256) to 9000"), "{e}");
}

/// `RuntimeConfig::cpus` pins the engine thread (what `bench` does to keep its two
/// sides on different cores), and a CPU the process may not run on is refused at open.
#[test]
fn engine_threads_run_on_the_cpus_they_are_given() {
    if !need_root() {
        return;
    }
    let allowed = roce_xdp::host::allowed_cpus();
    let pair = Pair::new("rxc", 28, 1500).unwrap();
    let mut bad = udp_in(&pair.a, pair.ip_a);
    bad.cpus = vec![100_000];
    let e = Device::open(bad).err().expect("CPU 100000 was accepted");
    assert!(e.to_string().contains("CPU 100000"), "{e}");
    let Some(&cpu) = allowed.last() else {
        panic!("no CPU in the affinity mask")
    };
    let mut c = udp_in(&pair.a, pair.ip_a);
    c.cpus = vec![cpu];
    let dev = Device::open(c).unwrap();
    // The engine threads of this process (other tests' engines run beside) and the
    // CPUs each may run on.
    let engines: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim().starts_with("roce-xdp-engine"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .collect();
    assert!(
        engines.contains(&cpu.to_string()),
        "no engine thread pinned to CPU {cpu}: {engines:?}"
    );
    drop(dev);
}

/// Two UDP-link devices in a new namespace pair `name`/`idx`, with an RC QP each
/// (1 MiB registered) connected to the other.
fn rc_pair(name: &str, idx: u8) -> (Pair, Endpoint, Endpoint) {
    let pair = Pair::new(name, idx, 1500).unwrap();
    let (ip_a, ip_b) = (IpAddr::V4(pair.ip_a), IpAddr::V4(pair.ip_b));
    let a = end(
        Device::open(udp_in(&pair.a, pair.ip_a)).unwrap(),
        QpType::Rc,
        1 << 20,
    );
    let b = end(
        Device::open(udp_in(&pair.b, pair.ip_b)).unwrap(),
        QpType::Rc,
        1 << 20,
    );
    join(&a, ip_a, &b, ip_b, 12);
    (pair, a, b)
}

/// Streams ask for a completion once per group of messages (perftest's `--cq-mod`):
/// whatever the count, the last message is signaled, so every stream ends with all its
/// messages counted and the destination byte-exact, also when it ends on time.
#[test]
fn streams_signaled_in_groups_count_every_message() {
    if !need_root() {
        return;
    }
    use roce_xdp::apps::workload::{Stream, signal_every};
    use std::time::{Duration, Instant};
    let (_pair, a, b) = rc_pair("rxg", 31);
    let depth = 12;
    assert_eq!(signal_every(depth), 3);
    for op in [Stream::Write, Stream::Read, Stream::Send] {
        // Counts that end on a group, one past it, and one short of it.
        for n in [1u64, 2, 3, 4, 29, 30] {
            let r = workload::stream(&a, &b, op, 1000, n * 1000, depth, &mut Progress::hidden())
                .unwrap_or_else(|e| panic!("{op:?} of {n}: {e}"));
            assert_eq!((r.ops, r.bytes), (n, n * 1000), "{op:?}");
        }
        let t = Instant::now();
        let r = workload::stream_while(&a, &b, op, 1000, depth, &mut Progress::hidden(), |n| {
            n % 7 != 0 || t.elapsed() < Duration::from_millis(50)
        })
        .unwrap_or_else(|e| panic!("{op:?} for 50 ms: {e}"));
        assert!(r.ops > 0 && r.ops % 7 == 0, "{op:?}: {} messages", r.ops);
    }
}

/// WRs the posting ring holds in compact form (up to 4 SGEs) and those that wait whole
/// in its overflow ring (inline data, more SGEs) run in the order they were posted, on
/// both queues, byte-exact.
#[test]
fn compact_and_overflowing_wrs_run_in_posting_order() {
    if !need_root() {
        return;
    }
    use std::time::Duration;
    let (_pair, a, b) = rc_pair("rxq", 29);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    a.mem.write(0, &data).unwrap();
    // B's receives: one SGE, or six of 100 bytes each (overflow).
    let n = 30u64;
    for i in 0..n {
        let base = 0x8000 + i as usize * 1024;
        let wr = if i % 2 == 0 {
            RecvWr::new(i, &[b.sge(base, 600)])
        } else {
            let sges: Vec<Sge> = (0..6).map(|k| b.sge(base + k * 100, 100)).collect();
            RecvWr::new(i, &sges)
        };
        b.qp.post_recv(&wr).unwrap();
    }
    // A's SENDs: one SGE, five SGEs (overflow), or inline (overflow), 600 bytes each.
    for i in 0..n {
        let off = i as usize * 600;
        let wr = match i % 3 {
            0 => SendWr::send(i, &[a.sge(off, 600)]),
            1 => {
                let sges: Vec<Sge> = (0..5).map(|k| a.sge(off + k * 120, 120)).collect();
                SendWr::send(i, &sges)
            }
            _ => {
                let mut w = SendWr::send(i, &[]).with_flags(SendFlags::INLINE);
                w.inline = roce_xdp::verbs::wr::InlineData::new(&data[off..off + 200]);
                w
            }
        };
        a.qp.post_send(&wr.with_flags(wr.send_flags | SendFlags::SIGNALED))
            .unwrap();
    }
    let ids = |e: &Endpoint| -> Vec<(u64, u32)> {
        (0..n)
            .map(|_| {
                let w = e.next_ok(Duration::from_secs(10)).unwrap();
                (w.wr_id, w.byte_len)
            })
            .collect()
    };
    let want_len = |i: u64| if i % 3 == 2 { 200 } else { 600 };
    let wa = ids(&a);
    assert_eq!(
        wa.iter().map(|w| w.0).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    let wb = ids(&b);
    assert_eq!(
        wb,
        (0..n).map(|i| (i, want_len(i))).collect::<Vec<_>>(),
        "receives in order, each with its SEND"
    );
    for i in 0..n {
        let got = b
            .mem
            .to_vec(0x8000 + i as usize * 1024, want_len(i) as usize)
            .unwrap();
        let off = i as usize * 600;
        assert_eq!(got, data[off..off + want_len(i) as usize], "message {i}");
    }
}

//! Set-up for tests of the runtime over real links: devices in network namespaces, QPs
//! connected across them (through the same `apps::endpoint` code the commands use).

#![allow(dead_code)]

use roce_xdp::apps::endpoint::{ConnectOpts, Endpoint, EndpointOpts};
use roce_xdp::runtime::{Device, RuntimeConfig};
use roce_xdp::verbs::*;
use std::net::IpAddr;
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

/// Memory for `workload::mixed` with messages up to 1 MiB.
pub const MIXED_MEM: usize = (16 << 20) + 8192;

/// An RC/UC/UD endpoint with `size` bytes of memory.
pub fn end(dev: Device, qp_type: QpType, size: usize) -> Endpoint {
    Endpoint::new(dev, &EndpointOpts::new(qp_type, size)).unwrap()
}

/// Connects `a` and `b` to each other (PSNs near the wrap), retransmit timeout `timeout`.
pub fn join(a: &Endpoint, ip_a: IpAddr, b: &Endpoint, ip_b: IpAddr, timeout: u8) {
    let mtu = a.dev.info().port_mtu.min(b.dev.info().port_mtu);
    let (pa, pb) = (0xff_fff0, 0x00_0100);
    let mut oa = ConnectOpts::new(mtu, pa);
    oa.timeout = timeout;
    let mut ob = ConnectOpts::new(mtu, pb);
    ob.timeout = timeout;
    a.connect(&b.local(pb, ip_a), &oa).unwrap();
    b.connect(&a.local(pa, ip_b), &ob).unwrap();
}

/// AF_XDP devices in namespaces `na` and `nb` on `ifname`, with connected QPs.
pub fn xdp_pair(
    ifname: &str,
    (na, ip_a): (&str, IpAddr),
    (nb, ip_b): (&str, IpAddr),
    qp_type: QpType,
    size: usize,
    timeout: u8,
    tweak: impl Fn(&mut RuntimeConfig),
) -> (Endpoint, Endpoint) {
    let mut ca = RuntimeConfig::xdp(ifname);
    ca.netns = Some(na.to_string());
    tweak(&mut ca);
    let mut cb = ca.clone();
    cb.netns = Some(nb.to_string());
    // Each device gets its own capture (a tweak that sets one names A's).
    if let Some(p) = &ca.pcap {
        cb.pcap = Some(p.with_extension("b.pcap"));
    }
    let a = end(Device::open(ca).unwrap(), qp_type, size);
    let b = end(Device::open(cb).unwrap(), qp_type, size);
    join(&a, ip_a, &b, ip_b, timeout);
    (a, b)
}

/// Two AF_XDP devices, one in each namespace of `pair`, with connected QPs.
pub fn xdp_ends(
    pair: &roce_xdp::netns::Pair,
    qp_type: QpType,
    size: usize,
    tweak: impl Fn(&mut RuntimeConfig),
) -> (Endpoint, Endpoint) {
    xdp_pair(
        &pair.ifname,
        (&pair.a.name, IpAddr::V4(pair.ip_a)),
        (&pair.b.name, IpAddr::V4(pair.ip_b)),
        qp_type,
        size,
        12,
        tweak,
    )
}

/// Waits for `n` completions on `e`, each successful.
pub fn wait_ok(e: &Endpoint, n: usize, secs: u64) -> Vec<Wc> {
    (0..n)
        .map(|_| e.next_ok(Duration::from_secs(secs)).unwrap())
        .collect()
}

/// The path of the built `roce-xdp` binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_roce-xdp")
}

/// Spawns `c` with its output captured; the handle kills the child if dropped early.
pub struct Child(pub Option<std::process::Child>);

impl Child {
    pub fn spawn(mut c: std::process::Command) -> Child {
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        Child(Some(c.spawn().expect("spawning a child")))
    }

    /// Waits up to `secs`, then kills it (by its PID); returns (success, stdout+stderr).
    pub fn finish(mut self, secs: u64) -> (bool, String) {
        let mut ch = self.0.take().expect("child");
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        let ok = loop {
            match ch.try_wait().expect("try_wait") {
                Some(st) => break st.success(),
                None if std::time::Instant::now() > deadline => {
                    let _ = ch.kill();
                    let _ = ch.wait();
                    break false;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let out = ch.wait_with_output().expect("output");
        (
            ok,
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

impl Child {
    /// Sends SIGKILL (no clean-up of the child's own runs) and reaps it.
    pub fn kill(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `roce-xdp bench ARGS --json` (it must succeed) and returns its report.
pub fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(bin())
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    serde_json::from_str(text.trim()).unwrap()
}

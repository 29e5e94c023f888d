//! Private network namespaces joined by a veth pair: what `demo` and the tests run in.
//!
//! Everything is created with iproute2 under names that carry the process ID, and
//! removed when the value is dropped (also when a test fails and unwinds). Addresses come
//! from 198.18.0.0/15, the benchmarking range, so nothing here can reach a real network.

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Runs a command, failing with its stderr if it fails.
pub fn run(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `prefix-PID-N` with its loopback up.
    pub fn new(prefix: &str) -> Result<Netns, String> {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<Output, String> {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        run(&v)
    }

    /// The MAC of `ifname` in the namespace (its sysfs, as `ip netns exec` mounts it).
    pub fn mac(&self, ifname: &str) -> Result<[u8; 6], String> {
        let o = self.exec(&["cat", &format!("/sys/class/net/{ifname}/address")])?;
        let text = String::from_utf8_lossy(&o.stdout);
        crate::host::parse_mac(text.trim())
            .ok_or_else(|| format!("{ifname} in {}: no MAC in {text:?}", self.name))
    }

    /// A `Command` that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Two namespaces joined by a veth pair: `a` holds `ifname` with `ip_a`, `b` holds
/// `ifname` with `ip_b`.
#[derive(Debug)]
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
    pub ifname: String,
    pub ip_a: Ipv4Addr,
    pub ip_b: Ipv4Addr,
    pub mtu: u32,
}

impl Pair {
    /// Creates the namespaces and the link, addresses in 198.18.0.0/24 (`.1` and `.2`
    /// unless `third_octet` moves them to 198.18.N.0/24), MTU `mtu`, both ends up.
    pub fn new(prefix: &str, third_octet: u8, mtu: u32) -> Result<Pair, String> {
        Pair::with_queues(prefix, third_octet, mtu, 1)
    }

    /// As `new`, with `queues` receive and transmit queues on each end (for one engine
    /// thread per queue).
    pub fn with_queues(
        prefix: &str,
        third_octet: u8,
        mtu: u32,
        queues: u32,
    ) -> Result<Pair, String> {
        let a = Netns::new(&format!("{prefix}a"))?;
        let b = Netns::new(&format!("{prefix}b"))?;
        let ifname = "veth0".to_string();
        let ip_a = Ipv4Addr::new(198, 18, third_octet, 1);
        let ip_b = Ipv4Addr::new(198, 18, third_octet, 2);
        let peer = format!("vp{}", SEQ.fetch_add(1, Ordering::SeqCst));
        let q = queues.max(1).to_string();
        a.exec(&[
            "ip",
            "link",
            "add",
            &ifname,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "numtxqueues",
            &q,
            "numrxqueues",
            &q,
            "netns",
            &b.name,
        ])?;
        b.exec(&["ip", "link", "set", &peer, "name", &ifname])?;
        for (ns, ip) in [(&a, ip_a), (&b, ip_b)] {
            let m = mtu.to_string();
            ns.exec(&["ip", "link", "set", &ifname, "mtu", &m])?;
            ns.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &ifname])?;
            // No IPv6 chatter (router solicitations, DAD) on the test link.
            let _ = ns.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{ifname}.disable_ipv6=1"),
            ]);
            ns.exec(&["ip", "link", "set", &ifname, "up"])?;
        }
        // The carrier comes a moment after both ends are up (link watch); until then a
        // device on the link would report its port DOWN.
        for ns in [&a, &b] {
            wait_carrier(ns, &ifname)?;
        }
        Ok(Pair {
            a,
            b,
            ifname,
            ip_a,
            ip_b,
            mtu,
        })
    }
}

impl Pair {
    /// Adds an 802.1Q subinterface `veth0.VID` on both ends, with 198.18.`third_octet`.1
    /// and .2/24; returns their name and addresses. IPv6 stays off on it too.
    pub fn add_vlan(
        &self,
        vid: u16,
        third_octet: u8,
    ) -> Result<(String, Ipv4Addr, Ipv4Addr), String> {
        let name = format!("{}.{vid}", self.ifname);
        let ip_a = Ipv4Addr::new(198, 18, third_octet, 1);
        let ip_b = Ipv4Addr::new(198, 18, third_octet, 2);
        for (ns, ip) in [(&self.a, ip_a), (&self.b, ip_b)] {
            ns.exec(&[
                "ip",
                "link",
                "add",
                "link",
                &self.ifname,
                "name",
                &name,
                "type",
                "vlan",
                "id",
                &vid.to_string(),
            ])?;
            let _ = ns.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{name}.disable_ipv6=1"),
            ]);
            ns.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &name])?;
            ns.exec(&["ip", "link", "set", &name, "up"])?;
        }
        Ok((name, ip_a, ip_b))
    }
}

/// Waits up to 5 s for `ifname` in `ns` to have its carrier (operstate up).
fn wait_carrier(ns: &Netns, ifname: &str) -> Result<(), String> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let o = ns.exec(&["cat", &format!("/sys/class/net/{ifname}/operstate")])?;
        if String::from_utf8_lossy(&o.stdout).trim() == "up" {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(format!("{ifname} in {} has no carrier after 5 s", ns.name));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A corruption injector attached by [`Bridged::corrupt`]; detached when dropped.
pub struct Corruption {
    ask: Option<crossbeam::channel::Sender<crossbeam::channel::Sender<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Corruption {
    /// Frames corrupted so far.
    pub fn corrupted(&self) -> u64 {
        let (tx, rx) = crossbeam::channel::bounded(1);
        match &self.ask {
            Some(a) if a.send(tx).is_ok() => rx.recv().unwrap_or(0),
            _ => 0,
        }
    }
}

impl Drop for Corruption {
    fn drop(&mut self) {
        self.ask = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// True when this process may create namespaces (root with CAP_SYS_ADMIN and iproute2).
pub fn available() -> Result<(), String> {
    if !crate::host::is_root() {
        return Err("not root: network namespaces need CAP_SYS_ADMIN".into());
    }
    run(&["ip", "-V"])
        .map(|_| ())
        .map_err(|e| format!("iproute2 missing: {e}"))
}

/// Endpoint namespaces whose `veth0` hangs off a bridge in a middle namespace, so that
/// frames cross the middle's kernel forwarding path, where an nftables netdev egress
/// rule can drop them (AF_XDP transmissions skip the sender's own egress hook).
#[derive(Debug)]
pub struct Bridged {
    pub mid: Netns,
    pub ends: Vec<Netns>,
    /// The bridge port in `mid` facing each end.
    pub ports: Vec<String>,
    pub ips: Vec<Ipv4Addr>,
    pub ifname: String,
}

impl Bridged {
    /// `n` ends at 198.18.`third_octet`.1, .2, ... behind bridge `br0`, MTU `mtu`.
    pub fn new(prefix: &str, third_octet: u8, n: usize, mtu: u32) -> Result<Bridged, String> {
        let mid = Netns::new(&format!("{prefix}m"))?;
        let m = mtu.to_string();
        mid.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
        let _ = mid.exec(&["sysctl", "-qw", "net.ipv6.conf.br0.disable_ipv6=1"]);
        mid.exec(&["ip", "link", "set", "br0", "mtu", &m, "up"])?;
        let ifname = "veth0".to_string();
        let mut ends = Vec::new();
        let mut ports = Vec::new();
        let mut ips = Vec::new();
        for i in 0..n {
            let e = Netns::new(&format!("{prefix}{i}"))?;
            let port = format!("p{i}");
            mid.exec(&[
                "ip", "link", "add", &port, "type", "veth", "peer", "name", "tmp0", "netns",
                &e.name,
            ])?;
            e.exec(&["ip", "link", "set", "tmp0", "name", &ifname])?;
            let _ = mid.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{port}.disable_ipv6=1"),
            ]);
            mid.exec(&["ip", "link", "set", &port, "mtu", &m, "master", "br0", "up"])?;
            let ip = Ipv4Addr::new(198, 18, third_octet, i as u8 + 1);
            let _ = e.exec(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{ifname}.disable_ipv6=1"),
            ]);
            e.exec(&["ip", "link", "set", &ifname, "mtu", &m])?;
            e.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", &ifname])?;
            e.exec(&["ip", "link", "set", &ifname, "up"])?;
            ends.push(e);
            ports.push(port);
            ips.push(ip);
        }
        Ok(Bridged {
            mid,
            ends,
            ports,
            ips,
            ifname,
        })
    }

    /// Adds `rule` (nftables words) to a netdev egress chain of its own, table `table`,
    /// on the bridge port facing end `i`.
    fn egress_rule(&self, i: usize, table: &str, rule: &str) -> Result<(), String> {
        let port = &self.ports[i];
        self.mid.exec(&["nft", "add", "table", "netdev", table])?;
        self.mid.exec(&[
            "nft",
            "add",
            "chain",
            "netdev",
            table,
            "eg",
            &format!("{{ type filter hook egress device \"{port}\" priority 0; }}"),
        ])?;
        let mut args = vec!["nft", "add", "rule", "netdev", table, "eg"];
        args.extend(rule.split(' '));
        self.mid.exec(&args)?;
        Ok(())
    }

    /// Drops `percent`% of RoCEv2 frames leaving the bridge towards end `i`, with an
    /// nftables netdev egress rule (`numgen random`). The kernel has no netem.
    pub fn lose(&self, i: usize, percent: u32) -> Result<(), String> {
        let rule = format!("udp dport 4791 numgen random mod 100 < {percent} counter drop");
        self.egress_rule(i, &format!("loss{i}"), &rule)
    }

    /// Sends `percent`% of the RoCEv2 frames leaving the bridge towards end `i` twice,
    /// with an nftables netdev egress rule (`numgen random`, `dup to`).
    pub fn duplicate(&self, i: usize, percent: u32) -> Result<(), String> {
        let port = &self.ports[i];
        let rule =
            format!("udp dport 4791 numgen random mod 100 < {percent} counter dup to \"{port}\"");
        self.egress_rule(i, &format!("dup{i}"), &rule)
    }

    /// Corrupts (one bit flipped, BTH to ICRC) `percent`% of the RoCEv2 frames end `i`
    /// sends, with an XDP program on its bridge port (`bpf/corrupt.bpf.c`), until the
    /// returned handle is dropped.
    pub fn corrupt(&self, i: usize, percent: f64) -> Result<Corruption, String> {
        let (mid, port) = (self.mid.name.clone(), self.ports[i].clone());
        let (ready_tx, ready_rx) = crossbeam::channel::bounded(1);
        let (ask_tx, ask_rx) = crossbeam::channel::unbounded::<crossbeam::channel::Sender<u64>>();
        let thread = std::thread::spawn(move || {
            // The program and its link stay on this thread, in the bridge's namespace.
            let c = crate::host::enter_netns(&mid)
                .map_err(|e| e.to_string())
                .and_then(|_| crate::host::Interface::find(&port).map_err(|e| e.to_string()))
                .and_then(|ifc| crate::link::bpf::Corrupter::attach(&ifc, percent));
            let c = match c {
                Ok(c) => {
                    let _ = ready_tx.send(Ok(()));
                    c
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            while let Ok(reply) = ask_rx.recv() {
                let _ = reply.send(c.corrupted());
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "the corruption thread ended".to_string())??;
        Ok(Corruption {
            ask: Some(ask_tx),
            thread: Some(thread),
        })
    }

    /// Drops `percent`% of the RoCEv2 frames towards end `i` from now on, in place of
    /// what [`lose`](Self::lose) or this set before (0: none).
    pub fn set_loss(&self, i: usize, percent: u32) -> Result<(), String> {
        let table = format!("loss{i}");
        let _ = self.mid.exec(&["nft", "delete", "table", "netdev", &table]);
        if percent > 0 {
            self.lose(i, percent)?;
        }
        Ok(())
    }

    /// Packets the loss rule of end `i` dropped so far.
    pub fn lost(&self, i: usize) -> u64 {
        let out = self
            .mid
            .exec(&["nft", "list", "table", "netdev", &format!("loss{i}")])
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        out.split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

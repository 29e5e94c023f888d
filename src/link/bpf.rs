//! The XDP program of `bpf/roce.bpf.c`: loaded and attached with libbpf-rs through a
//! BPF link, so the kernel detaches it when the process exits, however it exits.

use crate::host::Interface;
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, Object, ObjectBuilder};
use std::net::IpAddr;
use std::os::fd::RawFd;

/// The compiled program (built by `build.rs`).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/roce.bpf.o"));

/// Counters of the XDP program, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XdpStats {
    pub seen: u64,
    pub redirected: u64,
    pub passed: u64,
    pub dropped: u64,
}

/// The program attached to an interface.
pub struct XdpProgram {
    xsks: MapHandle,
    stats: MapHandle,
    /// `xdp.frags` (multi-buffer) or plain `xdp`.
    pub frags: bool,
    /// "native" or "generic": how the kernel runs it on this interface.
    pub mode: String,
    _link: Link,
    _obj: Object,
}

impl XdpProgram {
    /// Loads the program (the multi-buffer variant if `frags`), lets it redirect frames
    /// for `addrs`, and attaches it to `ifc`.
    pub fn attach(ifc: &Interface, addrs: &[IpAddr], frags: bool) -> Result<XdpProgram, String> {
        let name = if frags { "roce_xdp_frags" } else { "roce_xdp" };
        let mut open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| format!("opening the XDP object: {e}"))?;
        for mut p in open.progs_mut() {
            let keep = p.name() == name;
            p.set_autoload(keep);
        }
        let obj = open
            .load()
            .map_err(|e| format!("loading the XDP program (needs CAP_BPF): {e}"))?;
        let map = |n: &str| -> Result<MapHandle, String> {
            let m = obj
                .maps()
                .find(|m| m.name() == n)
                .ok_or_else(|| format!("map {n} missing from the XDP object"))?;
            MapHandle::try_from(&m).map_err(|e| format!("map {n}: {e}"))
        };
        let xsks = map("xsks")?;
        let addr_map = map("addrs")?;
        let stats = map("stats")?;
        for a in addrs {
            let key = crate::verbs::device::gid_of(*a);
            addr_map
                .update(&key, &[1u8], MapFlags::ANY)
                .map_err(|e| format!("adding {a} to the XDP address map: {e}"))?;
        }
        let prog = obj
            .progs_mut()
            .find(|p| p.name() == name)
            .ok_or_else(|| format!("program {name} missing"))?;
        let link = prog.attach_xdp(ifc.index as i32).map_err(|e| {
            format!(
                "attaching XDP to {}: {e} (another XDP program attached? an MTU above what {} allows?)",
                ifc.name,
                if frags { "xdp.frags" } else { "a plain XDP program (3506 on veth)" }
            )
        })?;
        Ok(XdpProgram {
            xsks,
            stats,
            frags,
            mode: xdp_mode(&ifc.name),
            _link: link,
            _obj: obj,
        })
    }

    /// Sends frames of receive queue `queue` to the AF_XDP socket `fd`.
    pub fn register(&self, queue: u32, fd: RawFd) -> Result<(), String> {
        self.xsks
            .update(
                &queue.to_ne_bytes(),
                &(fd as u32).to_ne_bytes(),
                MapFlags::ANY,
            )
            .map_err(|e| format!("registering the AF_XDP socket of queue {queue}: {e}"))
    }

    pub fn stats(&self) -> XdpStats {
        let get = |k: u32| -> u64 {
            self.stats
                .lookup_percpu(&k.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|vals| {
                    vals.iter()
                        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8])))
                        .sum()
                })
                .unwrap_or(0)
        };
        XdpStats {
            seen: get(0),
            redirected: get(1),
            passed: get(2),
            dropped: get(3),
        }
    }
}

/// How XDP runs on `ifname`, from `ip -details link show`.
fn xdp_mode(ifname: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["-details", "link", "show", "dev", ifname])
        .output();
    let t = out
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    if t.contains("xdpgeneric") {
        "generic (skb)".into()
    } else if t.contains("xdpoffload") {
        "offload".into()
    } else if t.contains("xdp") {
        "native (driver)".into()
    } else {
        "unknown".into()
    }
}

static CORRUPT_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/corrupt.bpf.o"));

/// The tests' corruption injector (`bpf/corrupt.bpf.c`), attached (XDP, through a BPF
/// link) to an interface: it flips one bit, from the BTH to the ICRC, in a random
/// fraction of the RoCEv2 frames arriving there. Detached when dropped.
pub struct Corrupter {
    cfg: MapHandle,
    _link: Link,
    _obj: Object,
}

impl Corrupter {
    /// Corrupts `percent` % (0 to 100) of the RoCEv2 frames arriving on `ifc`.
    pub fn attach(ifc: &Interface, percent: f64) -> Result<Corrupter, String> {
        let obj = ObjectBuilder::default()
            .open_memory(CORRUPT_OBJECT)
            .map_err(|e| format!("opening the corruption object: {e}"))?
            .load()
            .map_err(|e| format!("loading the corruption program: {e}"))?;
        let m = obj
            .maps()
            .find(|m| m.name() == "cfg")
            .ok_or("map cfg missing from the corruption object")?;
        let cfg = MapHandle::try_from(&m).map_err(|e| format!("map cfg: {e}"))?;
        let frac = (percent.clamp(0.0, 100.0) / 100.0 * 65536.0).round() as u64;
        cfg.update(&0u32.to_ne_bytes(), &frac.to_ne_bytes(), MapFlags::ANY)
            .map_err(|e| format!("setting the corruption rate: {e}"))?;
        let prog = obj
            .progs_mut()
            .find(|p| p.name() == "corrupt")
            .ok_or("program corrupt missing")?;
        let link = prog
            .attach_xdp(ifc.index as i32)
            .map_err(|e| format!("attaching the corruption program to {}: {e}", ifc.name))?;
        Ok(Corrupter {
            cfg,
            _link: link,
            _obj: obj,
        })
    }

    /// Frames corrupted so far.
    pub fn corrupted(&self) -> u64 {
        self.cfg
            .lookup(&1u32.to_ne_bytes(), MapFlags::ANY)
            .ok()
            .flatten()
            .and_then(|v| v.try_into().ok().map(u64::from_ne_bytes))
            .unwrap_or(0)
    }
}

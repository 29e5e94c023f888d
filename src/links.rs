//! roce-xdp's RDMA devices: which exist, what they are called, which interface each runs
//! on. What `ibv_get_device_list` lists and `roce-xdp link add/show/delete` manages, as
//! iproute2's `rdma link` does for rxe.
//!
//! - By default, one device per interface that is up and has an IP address (loopback
//!   excluded), named `rxdp_<interface>` so a person sees where it runs.
//! - `roce-xdp link add NAME netdev IF` names the device of IF (scripts written for rxe
//!   can keep `-d rxe0`); it replaces IF's default device. Links are kept in a small
//!   text file, one `NAME NETDEV` per line: `/run/roce-xdp/links.conf` (root; like rxe
//!   links, gone at reboot) and, for other users, also a per-user one in the temporary
//!   directory. `ROCE_XDP_LINKS` names another file (the tests use it).
//! - Only interfaces of the caller's network namespace count: a link whose interface is
//!   not here is not listed.

use std::net::IpAddr;
use std::path::PathBuf;

/// The prefix of default device names.
pub const DEFAULT_PREFIX: &str = "rxdp_";

/// One device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The RDMA device name (`ibv_get_device_name`).
    pub name: String,
    /// The interface it runs on.
    pub netdev: String,
    /// Added with `roce-xdp link add` (else a default device).
    pub configured: bool,
}

/// The link files read, most specific last: the system file, then the user's (or only
/// `ROCE_XDP_LINKS` when set).
pub fn files() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("ROCE_XDP_LINKS") {
        return vec![PathBuf::from(p)];
    }
    let system = PathBuf::from("/run/roce-xdp/links.conf");
    if crate::host::is_root() {
        vec![system]
    } else {
        vec![system, crate::apps::stats::dir().join("links.conf")]
    }
}

/// The file `link add` and `link delete` write.
pub fn own_file() -> PathBuf {
    files().pop().unwrap_or_else(|| PathBuf::from("links.conf"))
}

/// A device name the tools accept: 1 to 63 of `[A-Za-z0-9_.-]` (IB_DEVICE_NAME_MAX
/// is 64 with the NUL).
pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() < 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Parses a link file: `NAME NETDEV` per line, `#` comments; bad lines are skipped.
pub fn parse(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let l = l.split('#').next()?.trim();
            let mut w = l.split_whitespace();
            let (n, d) = (w.next()?, w.next()?);
            (valid_name(n) && w.next().is_none()).then(|| (n.to_string(), d.to_string()))
        })
        .collect()
}

/// Every configured link of every file, the later files' names winning.
pub fn configured() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for f in files() {
        let Ok(t) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, d) in parse(&t) {
            out.retain(|(on, od)| *on != n && *od != d);
            out.push((n, d));
        }
    }
    out
}

/// Interfaces of this namespace that are up and have an address, loopback excluded, in
/// the order the kernel lists them. Up means administratively up: without a carrier the
/// device is there with its port DOWN, as rxe's follows its netdev.
fn candidate_interfaces() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (n, a) in crate::host::all_addresses().unwrap_or_default() {
        let usable = match a {
            IpAddr::V4(v) => !v.is_loopback(),
            IpAddr::V6(v) => !v.is_loopback(),
        };
        if usable && n != "lo" && !names.contains(&n) {
            names.push(n);
        }
    }
    names.retain(|n| {
        crate::host::Interface::find(n)
            .and_then(|i| i.is_up())
            .unwrap_or(false)
    });
    // A VLAN subinterface is no device of its own: its addresses are GIDs of its
    // parent's device (which has one even without an address of its own), as a NIC's
    // RDMA device has its VLAN netdevs' GIDs.
    for crate::host::VlanLine {
        name: v, parent, ..
    } in crate::host::vlan_subinterfaces()
    {
        let Some(k) = names.iter().position(|n| *n == v) else {
            continue;
        };
        let parent_up = crate::host::Interface::find(&parent)
            .and_then(|i| i.is_up())
            .unwrap_or(false);
        if parent_up {
            names.remove(k);
            if !names.contains(&parent) {
                names.insert(k, parent);
            }
        }
    }
    names
}

/// The devices of this network namespace: the configured links whose interface is here,
/// then a default device for every other interface that is up with an address.
pub fn devices() -> Vec<Link> {
    let mut out: Vec<Link> = configured()
        .into_iter()
        .filter(|(_, d)| crate::host::Interface::find(d).is_ok())
        .map(|(name, netdev)| Link {
            name,
            netdev,
            configured: true,
        })
        .collect();
    for ifname in candidate_interfaces() {
        let name = format!("{DEFAULT_PREFIX}{ifname}");
        if out.iter().any(|l| l.netdev == ifname || l.name == name) || !valid_name(&name) {
            continue;
        }
        out.push(Link {
            name,
            netdev: ifname,
            configured: false,
        });
    }
    out
}

/// `roce-xdp link add NAME netdev IF`.
pub fn add(name: &str, netdev: &str) -> Result<(), String> {
    if !valid_name(name) {
        return Err(format!(
            "{name:?} is not a device name (1 to 63 letters, digits, '_', '.', '-')"
        ));
    }
    crate::host::Interface::find(netdev).map_err(|e| e.to_string())?;
    let all = configured();
    if let Some((_, d)) = all.iter().find(|(n, _)| n == name) {
        return Err(format!("device {name} exists already (on {d})"));
    }
    if let Some((n, _)) = all.iter().find(|(_, d)| d == netdev) {
        return Err(format!("{netdev} has a device already: {n}"));
    }
    let path = own_file();
    let mut mine = std::fs::read_to_string(&path)
        .map(|t| parse(&t))
        .unwrap_or_default();
    mine.push((name.to_string(), netdev.to_string()));
    write(&path, &mine)
}

/// `roce-xdp link delete NAME`.
pub fn delete(name: &str) -> Result<(), String> {
    let path = own_file();
    let mut mine = std::fs::read_to_string(&path)
        .map(|t| parse(&t))
        .unwrap_or_default();
    let before = mine.len();
    mine.retain(|(n, _)| n != name);
    if mine.len() == before {
        return Err(if configured().iter().any(|(n, _)| n == name) {
            format!(
                "{name} is not in {} (another user added it)",
                path.display()
            )
        } else if name.starts_with(DEFAULT_PREFIX) {
            format!(
                "{name} is a default device: it goes when its interface goes down or loses its addresses"
            )
        } else {
            format!("no device {name}")
        });
    }
    write(&path, &mine)
}

fn write(path: &std::path::Path, links: &[(String, String)]) -> Result<(), String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
    }
    let mut t = String::from("# roce-xdp RDMA devices: NAME NETDEV (roce-xdp link add/delete)\n");
    for (n, d) in links {
        t.push_str(&format!("{n} {d}\n"));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, t).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_files_parse_leniently() {
        let t = "# c\nrxe0 eth0\n\nbad name eth1\nrxdp_x veth0 # why\nonlyname\n";
        assert_eq!(
            parse(t),
            vec![
                ("rxe0".to_string(), "eth0".to_string()),
                ("rxdp_x".to_string(), "veth0".to_string())
            ]
        );
        assert!(valid_name("rxe0") && valid_name("a.b-c_d"));
        assert!(!valid_name("") && !valid_name("a b") && !valid_name(&"x".repeat(64)));
    }
}

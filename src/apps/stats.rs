//! `roce-xdp stats`: the counters every running command publishes to a JSON file
//! (updated every 500 ms, final values when it ends), read back and explained.

use std::path::{Path, PathBuf};

/// Where commands publish: `/run/roce-xdp` as root, else a per-user directory in the
/// temporary directory.
pub fn dir() -> PathBuf {
    if crate::host::is_root() {
        PathBuf::from("/run/roce-xdp")
    } else {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        std::env::temp_dir().join(format!("roce-xdp-{uid}"))
    }
}

/// The stats file of this process for `label` (the directory is created).
pub fn default_path(label: &str) -> PathBuf {
    let d = dir();
    let _ = std::fs::create_dir_all(&d);
    d.join(format!("{label}-{}.json", std::process::id()))
}

/// One published file.
#[derive(Debug, Clone)]
pub struct Published {
    pub path: PathBuf,
    pub json: serde_json::Value,
    /// The publishing process still runs.
    pub running: bool,
}

fn alive(pid: u64) -> bool {
    pid > 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Reads one file.
pub fn read(path: &Path) -> Result<Published, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let pid = json["pid"].as_u64().unwrap_or(0);
    let fin = json["final"].as_bool().unwrap_or(false);
    Ok(Published {
        path: path.to_path_buf(),
        running: !fin && alive(pid),
        json,
    })
}

/// Every file in `dir`, newest first.
pub fn list(dir: &Path) -> Vec<Published> {
    let mut v: Vec<(std::time::SystemTime, Published)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let t = e.metadata().and_then(|m| m.modified()).ok()?;
            read(&e.path()).ok().map(|p| (t, p))
        })
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.0));
    v.into_iter().map(|x| x.1).collect()
}

/// The counters of one file in words; zero counters only with `all`.
pub fn render(p: &Published, all: bool) -> String {
    let j = &p.json;
    let mut s = format!(
        "{}  (pid {}, {}, up {:.1} s)\n  link: {}\n  QPs: {}\n",
        p.path.display(),
        j["pid"].as_u64().unwrap_or(0),
        if p.running {
            "running"
        } else {
            "ended: final report"
        },
        j["uptime_s"].as_f64().unwrap_or(0.0),
        j["link"].as_str().unwrap_or("?"),
        j["qps"].as_u64().unwrap_or(0),
    );
    if let Some(c) = j["counters"].as_object() {
        for (name, _) in crate::engine::Counters::default().named() {
            let v = c.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
            if v != 0 || all {
                s.push_str(&format!(
                    "  {name:<24} {v:>12}  {}\n",
                    crate::engine::Counters::help(name)
                ));
            }
        }
    }
    if let Some(c) = j["cm"].as_object() {
        for (name, _) in crate::engine::cm::CmCounters::default().named() {
            let v = c.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
            if v != 0 || all {
                s.push_str(&format!(
                    "  {name:<24} {v:>12}  {}\n",
                    crate::engine::cm::CmCounters::help(name)
                ));
            }
        }
    }
    if let Some(u) = j["udp"].as_object() {
        s.push_str(&format!(
            "  UDP link: {} IPv4 frames whose ID (hidden by the socket) was solved from the ICRC\n",
            u["ipv4_ids_solved"]
        ));
    }
    for (name, help) in [
        (
            "tx_waits",
            "AF_XDP: transmissions that waited for a free UMEM frame or TX ring slot",
        ),
        (
            "rx_no_room",
            "AF_XDP: frames the kernel dropped: no free UMEM frame or RX ring slot",
        ),
        (
            "rx_chained",
            "AF_XDP: frames received over several UMEM buffers, taken where they lay",
        ),
    ] {
        let v = j[name].as_u64().unwrap_or(0);
        if v != 0 || all {
            s.push_str(&format!("  {name:<24} {v:>12}  {help}\n"));
        }
    }
    if let Some(x) = j["xdp"].as_object() {
        s.push_str(&format!(
            "  XDP program: seen {}, redirected to AF_XDP {}, passed to the kernel {}, dropped {}\n",
            x["seen"], x["redirected"], x["passed"], x["dropped"]
        ));
    }
    s
}

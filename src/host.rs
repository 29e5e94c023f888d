//! What the runtime asks of the host: interfaces, addresses, MTU, queues, neighbours,
//! privileges, network namespaces. Linux only; everything read from /sys, /proc,
//! getifaddrs(3) or iproute2, so nothing here needs more than the caller's rights.

use std::ffi::CString;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

/// An interface by name, checked to exist.
#[derive(Debug, Clone)]
pub struct Interface {
    pub name: String,
    pub index: u32,
}

/// Why a host query failed, in words the user can act on.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("interface {0} does not exist (see `ip link`)")]
    NoInterface(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Other(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HostError {
    let what = what.into();
    move |source| HostError::Io { what, source }
}

impl Interface {
    pub fn find(name: &str) -> Result<Interface, HostError> {
        let c = CString::new(name).map_err(|_| HostError::NoInterface(name.into()))?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            return Err(HostError::NoInterface(name.into()));
        }
        Ok(Interface {
            name: name.into(),
            index,
        })
    }

    /// An `ifreq` ioctl on a datagram socket of the calling thread's namespace (sysfs
    /// shows the namespace it was mounted in, not the thread's, so it is not used).
    fn ioctl(&self, req: libc::c_ulong, ifr: &mut libc::ifreq) -> Result<(), HostError> {
        let name = self.name.as_bytes();
        if name.len() >= ifr.ifr_name.len() {
            return Err(HostError::NoInterface(self.name.clone()));
        }
        for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
            *d = *s as libc::c_char;
        }
        // SAFETY: socket(2) takes no pointers.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(HostError::Io {
                what: "socket".into(),
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `ifr` is a valid ifreq for this request; `fd` is ours.
        let r = unsafe { libc::ioctl(fd, req, ifr as *mut libc::ifreq) };
        let err = io::Error::last_os_error();
        // SAFETY: closing our own socket once.
        unsafe { libc::close(fd) };
        if r < 0 {
            return Err(HostError::Io {
                what: format!("ioctl on {}", self.name),
                source: err,
            });
        }
        Ok(())
    }

    /// The interface's MTU (the IP MTU).
    pub fn mtu(&self) -> Result<u32, HostError> {
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        self.ioctl(libc::SIOCGIFMTU, &mut ifr)?;
        // SAFETY: SIOCGIFMTU fills the ifru_mtu member.
        Ok(unsafe { ifr.ifr_ifru.ifru_mtu } as u32)
    }

    pub fn mac(&self) -> Result<[u8; 6], HostError> {
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        self.ioctl(libc::SIOCGIFHWADDR, &mut ifr)?;
        // SAFETY: SIOCGIFHWADDR fills the ifru_hwaddr member.
        let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
        let mut m = [0u8; 6];
        for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
            *d = *s as u8;
        }
        Ok(m)
    }

    fn flags(&self) -> Result<i32, HostError> {
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        self.ioctl(libc::SIOCGIFFLAGS, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS fills the ifru_flags member.
        Ok(i32::from(unsafe { ifr.ifr_ifru.ifru_flags }))
    }

    /// True when the interface is up with its carrier on (IFF_UP and IFF_RUNNING): what
    /// makes an RDMA port ACTIVE, as rxe follows its netdev.
    pub fn is_running(&self) -> Result<bool, HostError> {
        let f = self.flags()?;
        Ok(f & libc::IFF_UP != 0 && f & libc::IFF_RUNNING != 0)
    }

    /// True when the interface is administratively up (IFF_UP), carrier or not.
    pub fn is_up(&self) -> Result<bool, HostError> {
        Ok(self.flags()? & libc::IFF_UP != 0)
    }

    /// The link speed in Mbit/s, if the driver reports one (ethtool ETHTOOL_GSET).
    pub fn speed_mbps(&self) -> Option<u32> {
        #[repr(C)]
        #[derive(Default)]
        struct Cmd {
            cmd: u32,
            supported: u32,
            advertising: u32,
            speed: u16,
            duplex: u8,
            port: u8,
            phy_address: u8,
            transceiver: u8,
            autoneg: u8,
            mdio_support: u8,
            maxtxpkt: u32,
            maxrxpkt: u32,
            speed_hi: u16,
            eth_tp_mdix: u8,
            eth_tp_mdix_ctrl: u8,
            lp_advertising: u32,
            reserved: [u32; 2],
        }
        const ETHTOOL_GSET: u32 = 1;
        let mut c = Cmd {
            cmd: ETHTOOL_GSET,
            ..Cmd::default()
        };
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        ifr.ifr_ifru.ifru_data = (&mut c as *mut Cmd).cast();
        self.ioctl(libc::SIOCETHTOOL, &mut ifr).ok()?;
        let s = (u32::from(c.speed_hi) << 16) | u32::from(c.speed);
        (s != 0 && s != u32::MAX && s != 0xffff).then_some(s)
    }

    /// Number of receive queues (ethtool channels; 1 if the driver does not say).
    pub fn rx_queues(&self) -> usize {
        #[repr(C)]
        #[derive(Default)]
        struct Channels {
            cmd: u32,
            max_rx: u32,
            max_tx: u32,
            max_other: u32,
            max_combined: u32,
            rx_count: u32,
            tx_count: u32,
            other_count: u32,
            combined_count: u32,
        }
        const ETHTOOL_GCHANNELS: u32 = 0x3c;
        let mut ch = Channels {
            cmd: ETHTOOL_GCHANNELS,
            ..Channels::default()
        };
        // SAFETY: ifreq is plain data; zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        ifr.ifr_ifru.ifru_data = (&mut ch as *mut Channels).cast();
        if self.ioctl(libc::SIOCETHTOOL, &mut ifr).is_err() {
            return 1;
        }
        (ch.rx_count.max(ch.combined_count) as usize).max(1)
    }

    /// The addresses configured on the interface.
    pub fn addresses(&self) -> Result<Vec<IpAddr>, HostError> {
        Ok(all_addresses()?
            .into_iter()
            .filter(|(n, _)| *n == self.name)
            .map(|(_, a)| a)
            .collect())
    }
}

/// Every (interface, address) pair of this network namespace, from getifaddrs.
pub fn all_addresses() -> Result<Vec<(String, IpAddr)>, HostError> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `ifap`; freed with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(HostError::Io {
            what: "getifaddrs".into(),
            source: io::Error::last_os_error(),
        });
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null; its family says which sockaddr it is.
        let fam = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if fam == libc::AF_INET {
            // SAFETY: family AF_INET means a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let a = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            out.push((name, IpAddr::V4(a)));
        } else if fam == libc::AF_INET6 {
            // SAFETY: family AF_INET6 means a sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            out.push((name, IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))));
        }
    }
    // SAFETY: `ifap` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}

/// An 802.1Q subinterface, as the 8021q module's table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanLine {
    pub name: String,
    pub vid: u16,
    pub parent: String,
}

/// The 802.1Q subinterfaces of this thread's network namespace, from the 8021q module's
/// table (`/proc/net/vlan/config` as of the calling thread: the runtime enters the
/// namespace in its own thread). None when the module is not loaded (then there are no
/// VLAN devices).
pub fn vlan_subinterfaces() -> Vec<VlanLine> {
    fs::read_to_string("/proc/thread-self/net/vlan/config")
        .map(|t| parse_vlan_config(&t))
        .unwrap_or_default()
}

/// The `NAME | VID | PARENT` lines of `/proc/net/vlan/config`.
fn parse_vlan_config(t: &str) -> Vec<VlanLine> {
    t.lines()
        .filter_map(|l| {
            let mut f = l.split('|').map(str::trim);
            let (name, vid, parent) = (f.next()?, f.next()?, f.next()?);
            let vid = vid.parse::<u16>().ok()?;
            (1..4095).contains(&vid).then(|| VlanLine {
                name: name.into(),
                vid,
                parent: parent.into(),
            })
        })
        .collect()
}

/// The one interface other than `lo` with an IPv4 address, if there is exactly one
/// (what the commands use when no `-d` is given).
pub fn default_interface() -> Result<String, String> {
    let mut names: Vec<String> = all_addresses()
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|(n, a)| n != "lo" && a.is_ipv4())
        .map(|(n, _)| n)
        .collect();
    names.dedup();
    match names.len() {
        1 => Ok(names.remove(0)),
        0 => Err("no interface with an IPv4 address: name one with -d".into()),
        _ => Err(format!(
            "several interfaces have addresses ({}): name one with -d",
            names.join(", ")
        )),
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(m)
}

/// The kernel's neighbour entry for `ip` on `ifname`, if it has a usable one.
pub fn neighbor(ifname: &str, ip: IpAddr) -> Option<[u8; 6]> {
    match ip {
        IpAddr::V4(v4) => {
            // /proc/net/arp: IP address, HW type, Flags, HW address, Mask, Device
            // thread-self: the calling thread's namespace, which may not be the process's.
            let t = fs::read_to_string("/proc/thread-self/net/arp").ok()?;
            t.lines().skip(1).find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let complete = f.get(2).is_some_and(|fl| {
                    u32::from_str_radix(fl.trim_start_matches("0x"), 16).is_ok_and(|v| v & 2 != 0)
                });
                (f.len() >= 6 && f[5] == ifname && f[0].parse() == Ok(v4) && complete)
                    .then(|| parse_mac(f[3]))
                    .flatten()
            })
        }
        IpAddr::V6(v6) => {
            let out = std::process::Command::new("ip")
                .args(["-6", "neigh", "show", &v6.to_string(), "dev", ifname])
                .output()
                .ok()?;
            let t = String::from_utf8_lossy(&out.stdout);
            let f: Vec<&str> = t.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "lladdr")?;
            parse_mac(f.get(i + 1)?)
        }
    }
}

/// The MAC of `ip`: from the neighbour table, or after making the kernel resolve it (a
/// datagram to the discard port starts ARP or ND) and waiting up to `wait`.
pub fn resolve_neighbor(ifname: &str, ip: IpAddr, wait: Duration) -> Option<[u8; 6]> {
    resolve_neighbor_on(&[ifname], ip, wait)
}

/// [`resolve_neighbor`] on whichever of `ifnames` the kernel resolves `ip` on (the port's
/// interface and its VLAN subinterfaces: the route decides).
pub fn resolve_neighbor_on(
    ifnames: &[impl AsRef<str>],
    ip: IpAddr,
    wait: Duration,
) -> Option<[u8; 6]> {
    let known = || ifnames.iter().find_map(|n| neighbor(n.as_ref(), ip));
    if let Some(m) = known() {
        return Some(m);
    }
    let bind: IpAddr = match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let start = Instant::now();
    let mut last_kick = None::<Instant>;
    while start.elapsed() < wait {
        if last_kick.is_none_or(|t| t.elapsed() > Duration::from_millis(200))
            && let Ok(s) = UdpSocket::bind((bind, 0))
        {
            let _ = s.send_to(b"roce-xdp neighbour probe", (ip, 9));
            last_kick = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(5));
        if let Some(m) = known() {
            return Some(m);
        }
    }
    None
}

/// Linux capabilities the engine needs, by bit number.
pub mod cap {
    pub const NET_ADMIN: u32 = 12;
    pub const NET_RAW: u32 = 13;
    pub const IPC_LOCK: u32 = 14;
    pub const SYS_ADMIN: u32 = 21;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
}

/// The effective capability set of this process.
pub fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Checks the privileges AF_XDP and XDP need; the error names the missing ones.
pub fn check_xdp_privileges() -> Result<(), String> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    let mut missing = Vec::new();
    if !has(cap::NET_ADMIN) {
        missing.push("CAP_NET_ADMIN (attach the XDP program)");
    }
    if !has(cap::NET_RAW) {
        missing.push("CAP_NET_RAW (open AF_XDP sockets)");
    }
    if !has(cap::BPF) && !has(cap::SYS_ADMIN) {
        missing.push("CAP_BPF (load the XDP program and its maps)");
    }
    if !has(cap::PERFMON) && !has(cap::SYS_ADMIN) {
        missing.push("CAP_PERFMON (BPF programs that read packet memory)");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "missing privileges: {}. Run as root, or grant them (e.g. setcap cap_net_admin,cap_net_raw,cap_bpf,cap_perfmon,cap_ipc_lock+ep roce-xdp), or use the UDP link (--link udp)",
            missing.join(", ")
        ))
    }
}

/// Raises RLIMIT_MEMLOCK so the UMEM can be pinned; without CAP_IPC_LOCK the hard limit
/// bounds it, and the error says so.
pub fn raise_memlock(need: u64) -> Result<(), String> {
    // With CAP_IPC_LOCK the kernel does not charge the UMEM to RLIMIT_MEMLOCK.
    if effective_caps() & (1u64 << cap::IPC_LOCK) != 0 {
        return Ok(());
    }
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit to write into.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) };
    if r.rlim_cur == libc::RLIM_INFINITY || r.rlim_cur >= need {
        return Ok(());
    }
    let want = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `want` is a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &want) } == 0 {
        return Ok(());
    }
    let capped = libc::rlimit {
        rlim_cur: r.rlim_max,
        rlim_max: r.rlim_max,
    };
    // SAFETY: as above.
    if r.rlim_max >= need && unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &capped) } == 0 {
        return Ok(());
    }
    Err(format!(
        "RLIMIT_MEMLOCK is {} bytes, the UMEM needs {need}: grant CAP_IPC_LOCK or raise the limit (ulimit -l)",
        r.rlim_cur
    ))
}

/// Moves the calling thread into the named network namespace (`ip netns add NAME`).
pub fn enter_netns(name: &str) -> Result<(), HostError> {
    let path = format!("/var/run/netns/{name}");
    let f = fs::File::open(&path).map_err(io_err(format!("network namespace {name}")))?;
    use std::os::fd::AsRawFd;
    // SAFETY: `f` is an open namespace file; setns only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(HostError::Io {
            what: format!("entering network namespace {name}"),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// True when running with root's effective UID.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The inode of the calling thread's network namespace: two interfaces of the same name
/// in different namespaces are different interfaces.
pub fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// One process's claim on an interface (or a UDP address): an exclusive open-file-
/// description lock (`F_OFD_SETLK`) on a file named after the namespace and the
/// interface, holding the PID and name of the process. The kernel drops the lock when
/// the process ends, however it ends; a child forked without exec keeps it while it
/// lives. Others learn who holds it with `F_OFD_GETLK`, which takes nothing.
#[derive(Debug)]
pub struct InterfaceLock {
    _file: fs::File,
}

/// Where this process's locks go (`/run/roce-xdp/locks` as root, a per-user directory
/// otherwise), and the other directories whose locks it must respect: root's for a
/// user; every user's in the temporary directory for root.
fn lock_dirs() -> (std::path::PathBuf, Vec<std::path::PathBuf>) {
    let system = std::path::PathBuf::from("/run/roce-xdp/locks");
    if is_root() {
        let users = fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("roce-xdp-"))
            .map(|e| e.path().join("locks"))
            .collect();
        (system, users)
    } else {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        (
            std::env::temp_dir().join(format!("roce-xdp-{uid}/locks")),
            vec![system],
        )
    }
}

/// An OFD lock request for the whole file.
fn whole_file(kind: i32) -> libc::flock {
    // SAFETY: flock is plain data; zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l
}

/// Who holds the lock of `f`, if anyone: the PID and program name it wrote.
fn holder(f: &fs::File) -> Option<String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let mut l = whole_file(libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK on our open file with a valid flock; it only reports.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut l) };
    if r != 0 || i32::from(l.l_type) == libc::F_UNLCK {
        return None;
    }
    let mut t = String::new();
    let _ = (&*f).read_to_string(&mut t);
    let t = t.trim();
    Some(if t.is_empty() {
        "another process".to_string()
    } else {
        format!("process {t}")
    })
}

fn lock_name(what: &str) -> String {
    format!("{}-{}.lock", netns_id(), what.replace('/', "_"))
}

/// Who holds `what` (see [`InterfaceLock::take`]) in the calling thread's namespace.
pub fn interface_holder(what: &str) -> Option<String> {
    let name = lock_name(what);
    let (mine, others) = lock_dirs();
    std::iter::once(mine)
        .chain(others)
        .filter_map(|d| fs::File::open(d.join(&name)).ok())
        .find_map(|f| holder(&f))
}

impl InterfaceLock {
    /// Claims `what` (an interface name, or `udp-ADDR`) in the calling thread's network
    /// namespace. Fails, naming the process that holds it, if another process has it.
    pub fn take(what: &str) -> Result<InterfaceLock, String> {
        use std::io::{Seek, Write};
        use std::os::fd::AsRawFd;
        let name = lock_name(what);
        let (mine, others) = lock_dirs();
        let busy = |who: String| {
            format!(
                "{what} is already served by {who} in this network namespace: one process per interface runs the engine (stop it, or use another interface)"
            )
        };
        for dir in others {
            if let Ok(f) = fs::File::open(dir.join(&name))
                && let Some(who) = holder(&f)
            {
                return Err(busy(who));
            }
        }
        fs::create_dir_all(&mine).map_err(|e| format!("creating {}: {e}", mine.display()))?;
        let path = mine.join(&name);
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let l = whole_file(libc::F_WRLCK);
        // SAFETY: F_OFD_SETLK on our open file with a valid flock.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &l) } != 0 {
            return Err(busy(holder(&f).unwrap_or_else(|| "another process".into())));
        }
        let comm = fs::read_to_string("/proc/self/comm").unwrap_or_default();
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = write!(f, "{} ({})", std::process::id(), comm.trim());
        let _ = f.flush();
        Ok(InterfaceLock { _file: f })
    }
}

/// The CPUs the calling thread may run on (its affinity mask), in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit mask the kernel fills for this thread (pid 0); its
    // size is passed with it, and CPU_ISSET reads only inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pins the calling thread to `cpu` (benchmarks put the two sides of a measurement on
/// different cores, so neither steals the other's).
pub fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(format!("CPU {cpu}: beyond the affinity mask's size"));
    }
    // SAFETY: as in `allowed_cpus`; the mask holds one bit inside its size.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "pinning a thread to CPU {cpu}: {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_config_lines() {
        let t = "VLAN Dev name    | VLAN ID\nName-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n\
                 veth0.100      | 100  | veth0\nveth1.7        | 7  | veth1\nbad | x | veth0\n";
        let line = |name: &str, vid, parent: &str| VlanLine {
            name: name.into(),
            vid,
            parent: parent.into(),
        };
        assert_eq!(
            parse_vlan_config(t),
            vec![line("veth0.100", 100, "veth0"), line("veth1.7", 7, "veth1")]
        );
    }

    #[test]
    fn macs_and_loopback() {
        assert_eq!(
            parse_mac("52:54:00:00:00:0a"),
            Some([0x52, 0x54, 0, 0, 0, 0xa])
        );
        assert_eq!(parse_mac("52:54:00:00:00"), None);
        assert_eq!(parse_mac("52:54:00:00:00:0a:01"), None);
        let lo = Interface::find("lo").unwrap();
        assert!(lo.index > 0);
        assert!(lo.mtu().unwrap() >= 1500);
        assert!(
            lo.addresses()
                .unwrap()
                .contains(&IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert!(lo.is_running().unwrap());
        assert!(Interface::find("no-such-if0").is_err());
    }

    #[test]
    fn an_interface_lock_is_exclusive_and_names_its_holder() {
        let what = format!("test-lock-{}", std::process::id());
        let a = InterfaceLock::take(&what).unwrap();
        let e = InterfaceLock::take(&what).unwrap_err();
        assert!(e.contains(&std::process::id().to_string()), "{e}");
        drop(a);
        InterfaceLock::take(&what).unwrap();
    }
}

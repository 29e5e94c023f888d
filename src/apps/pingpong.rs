//! `roce-xdp pingpong`: rdma-core's `ibv_rc_pingpong` (and `ibv_uc_pingpong`,
//! `ibv_ud_pingpong` with `--uc`/`--ud`) on roce-xdp, wire-compatible with them: the same
//! TCP exchange on port 18515, QP attributes, buffer contents (0x7b), message pattern
//! and output lines, so either side can be the stock tool.
//!
//! The traffic loop is the tools': both sides post `rx_depth` receives; the client sends
//! first; each side sends again only when its previous send completed and one message
//! arrived; both stop after `iters` sends and `iters` receives.

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts, Remote};
use super::exchange::{gid_text, pp_client, pp_server_read, pp_server_reply};
use crate::runtime::Device;
use crate::verbs::{
    AccessFlags, Mtu, QpType, RecvWr, SendFlags, SendWr, UdDest, WcStatus, device::ip_of,
};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The 40 bytes a UD receive buffer reserves for the GRH.
pub const GRH_LEN: usize = 40;
/// The UD Q_Key of the pingpong tools.
pub const PP_QKEY: u32 = 0x1111_1111;

/// Options, named after the tools' flags.
#[derive(Debug, Clone)]
pub struct Opts {
    /// The server to connect to; `None` makes this the server.
    pub host: Option<String>,
    /// `-p`: TCP port of the exchange.
    pub port: u16,
    /// `-s`: message size (RC/UC default 4096, UD 1024).
    pub size: Option<usize>,
    /// `-m`: path MTU in bytes (RC/UC; not exchanged).
    pub mtu: u32,
    /// `-r`: receives kept posted.
    pub rx_depth: u32,
    /// `-n`: messages each way.
    pub iters: u64,
    /// `-c`: the client marks each page, the server checks the marks.
    pub check: bool,
    pub qp_type: QpType,
    /// The longest wait for one completion or for the peer's TCP connection.
    pub timeout: Duration,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            host: None,
            port: 18515,
            size: None,
            mtu: 1024,
            rx_depth: 500,
            iters: 1000,
            check: false,
            qp_type: QpType::Rc,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub local: Remote,
    pub remote: Remote,
    pub bytes: u64,
    pub elapsed: Duration,
    pub iters: u64,
    /// `-c` on the server: pages whose mark was wrong.
    pub invalid_pages: Vec<usize>,
}

impl Outcome {
    /// The tools' two closing lines.
    pub fn summary(&self) -> String {
        let s = self.elapsed.as_secs_f64();
        format!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec\n{} iters in {:.2} seconds = {:.2} usec/iter",
            self.bytes,
            s,
            self.bytes as f64 * 8.0 / s / 1e6,
            self.iters,
            s,
            s * 1e6 / self.iters as f64
        )
    }
}

/// Writes the tools' address line for `r`.
fn address_line(who: &str, r: &Remote, ud: bool) -> String {
    let sep = if ud { ":" } else { "," };
    format!(
        "  {who} address:  LID 0x0000, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        r.qpn,
        r.psn,
        gid_text(&r.gid)
    )
}

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;

/// Runs one pingpong on `dev` with the local GID `gid_index`, printing what the tools
/// print through `out`.
pub fn run(
    dev: &Device,
    gid_index: u8,
    o: &Opts,
    out: &mut dyn FnMut(&str),
) -> Result<Outcome, String> {
    let ud = o.qp_type == QpType::Ud;
    let size = o.size.unwrap_or(if ud { 1024 } else { 4096 });
    let port_mtu = dev.info().port_mtu;
    if ud && size > port_mtu.bytes() as usize {
        return Err(format!(
            "Requested size larger than port MTU ({})",
            port_mtu.bytes()
        ));
    }
    let mtu = Mtu::from_bytes(o.mtu).ok_or_else(|| format!("invalid MTU {}", o.mtu))?;
    let buf_len = size + if ud { GRH_LEN } else { 0 };
    let mut eo = EndpointOpts::new(o.qp_type, buf_len.max(1));
    eo.send_wr = 1;
    eo.recv_wr = o.rx_depth.max(1);
    eo.access = AccessFlags::LOCAL_WRITE;
    let e = Endpoint::new(dev.clone(), &eo).map_err(|e| e.to_string())?;
    e.mem.fill(0, buf_len, 0x7b).map_err(|e| format!("{e:?}"))?;
    let gid = dev
        .gid(gid_index)
        .ok_or_else(|| format!("no GID at index {gid_index}"))?;
    let psn = (crate::rng::Rng::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7)
            ^ u64::from(std::process::id()),
    )
    .next_u32())
        & 0xff_ffff;
    let me = Remote {
        qpn: e.qp.qpn,
        psn,
        gid,
    };
    let mut co = ConnectOpts::new(mtu, psn);
    co.access = AccessFlags::EMPTY;
    co.qkey = PP_QKEY;
    co.max_rd_atomic = 1;
    co.max_dest_rd_atomic = 1;
    co.sgid_index = Some(gid_index);
    e.init(&co).map_err(|e| e.to_string())?;
    // Receives before the exchange, as the tools do.
    let recv = || {
        e.qp.post_recv(&RecvWr::new(RECV_ID, &[e.sge(0, buf_len)]))
            .map_err(|x| x.to_string())
    };
    for _ in 0..o.rx_depth {
        recv()?;
    }
    out(&address_line("local", &me, ud));
    let connect = |r: &Remote| -> Result<(), String> {
        if r.gid[8..] == [0; 8] {
            return Err(
                "the peer sent no GID (interface ID 0): on RoCE run it with -g <gid index>".into(),
            );
        }
        e.connect(r, &co).map_err(|x| x.to_string())
    };
    let remote = match &o.host {
        Some(h) => {
            let mut s = super::connect_tcp(h, o.port, o.timeout)?;
            let r = pp_client(&mut s, &me)?;
            connect(&r)?;
            r
        }
        None => {
            let mut s = super::serve_one(o.port, o.timeout)?;
            let r = pp_server_read(&mut s)?;
            connect(&r)?;
            pp_server_reply(&mut s, &me)?;
            r
        }
    };
    out(&address_line("remote", &remote, ud));
    // UD sends carry the address handle; resolve the peer's MAC once.
    let ah = if ud {
        let ip = ip_of(&remote.gid);
        let mut av = dev.av_to(ip);
        av.sgid_index = gid_index;
        if !dev.info().udp {
            av.dmac = Some(dev.resolve(ip).map_err(|x| x.to_string())?);
        }
        Some(UdDest {
            ah: av,
            remote_qpn: remote.qpn,
            remote_qkey: PP_QKEY,
        })
    } else {
        None
    };
    let client = o.host.is_some();
    if client && o.check {
        // validate_buf: every page's first byte becomes `page % sizeof(char)`, i.e. 0.
        let base = if ud { GRH_LEN } else { 0 };
        let mut i = 0;
        while i < size {
            e.mem.write(base + i, &[0]).map_err(|x| format!("{x:?}"))?;
            i += 4096;
        }
    }
    let send_off = if ud { GRH_LEN } else { 0 };
    let send = || -> Result<(), String> {
        let mut wr =
            SendWr::send(SEND_ID, &[e.sge(send_off, size)]).with_flags(SendFlags::SIGNALED);
        if let Some(d) = ah {
            wr = wr.with_ud(d);
        }
        e.qp.post_send(&wr).map_err(|x| x.to_string())
    };
    let start = Instant::now();
    let mut pending = RECV_ID;
    if client {
        send()?;
        pending |= SEND_ID;
    }
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut routs = o.rx_depth;
    while rcnt < o.iters || scnt < o.iters {
        let w = e.next_wc(o.timeout).map_err(|x| {
            format!(
                "{x} after {scnt} sends and {rcnt} receives ({})",
                dev.qp_debug(e.qp.qpn)
            )
        })?;
        if w.status != WcStatus::Success {
            return Err(format!(
                "Failed status {} ({}) for wr_id {}",
                w.status.name(),
                w.status as u32,
                w.wr_id
            ));
        }
        match w.wr_id {
            SEND_ID => scnt += 1,
            RECV_ID => {
                rcnt += 1;
                routs -= 1;
                if routs <= 1 {
                    for _ in routs..o.rx_depth {
                        recv()?;
                    }
                    routs = o.rx_depth;
                }
            }
            x => return Err(format!("Completion for unknown wr_id {x}")),
        }
        pending &= !w.wr_id;
        if scnt < o.iters && pending == 0 {
            send()?;
            pending = RECV_ID | SEND_ID;
        }
    }
    let elapsed = start.elapsed();
    let mut invalid_pages = Vec::new();
    if !client && o.check {
        let base = if ud { GRH_LEN } else { 0 };
        let mut i = 0;
        while i < size {
            let mut b = [0u8];
            e.mem.read(base + i, &mut b).map_err(|x| format!("{x:?}"))?;
            if b[0] != 0 {
                invalid_pages.push(i / 4096);
                out(&format!("invalid data in page {}", i / 4096));
            }
            i += 4096;
        }
    }
    let r = Outcome {
        local: me,
        remote,
        bytes: size as u64 * o.iters * 2,
        elapsed,
        iters: o.iters,
        invalid_pages,
    };
    e.finish();
    Ok(r)
}

/// The GID index a command uses when `-g` is not given: the first IPv4 GID (as perftest
/// picks), else the first global IPv6 one.
pub fn default_gid_index(dev: &Device) -> u8 {
    let g = &dev.info().gids;
    g.iter()
        .position(|x| ip_of(x).is_ipv4())
        .or_else(|| g.iter().skip(1).position(|_| true).map(|i| i + 1))
        .unwrap_or(0) as u8
}

/// The local IP of a GID, for messages.
pub fn gid_ip(g: &[u8; 16]) -> IpAddr {
    ip_of(g)
}

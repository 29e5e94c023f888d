//! `roce-xdp perftest`: the client and server halves of perftest's `ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_write_lat` and `ib_atomic_bw` (RC, one QP), speaking
//! the TCP exchange of the Debian perftest (4.5-0.17, version string "6.06") so that the
//! unmodified tools can be either side.
//!
//! The exchange, read from perftest's `perftest_communication.c` and the tests' `main`s
//! (the client always writes first, the server reads first, one `read()` per message):
//! 1. versions: 16 bytes, `"6.06"` NUL-padded (a peer below 5.70 is refused);
//! 2. page size and cache line size: 4 bytes each, big-endian; each side takes the max;
//! 3. the MTU enum as an ASCII digit and NUL (2 bytes); each side takes the min;
//! 4. handshakes of the 108-byte record
//!    `lid:out_reads:qpn:psn:rkey:vaddr:gid[16]:srqn:` (hex; the GID byte by byte),
//!    the same record every time: bw tests one before the connect, one after, one more,
//!    then one when the client has finished; write_lat one before the per-QP records;
//!    send_bw a sync handshake after the receives are posted;
//! 5. bw tests but send_bw: the client's report, as five 8-byte big-endian fields (size,
//!    iterations, peak, average in MB/s or Gb/s, message rate in Mpps);
//! 6. a last handshake and `"done"` with its NUL, which nobody reads.
//!
//! The advertised `vaddr` is the second `max(size, page)` half of the buffer, as
//! perftest's; a client keeps its remote address inside it (advancing by
//! `roundup(size, cache line)` while `size <= page / 2`, like perftest), and sends no
//! more READs or atomics at once than the peer's `out_reads`.

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts, Remote};
use crate::runtime::Device;
use crate::verbs::{AccessFlags, Mtu, QpType, RecvWr, SendWr, WcStatus};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// perftest's VERSION for Debian 12's perftest 4.5+0.17.
pub const VERSION: &str = "6.06";
const KEY_MSG_SIZE_GID: usize = 108;

/// Which perftest program this is the peer of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    WriteBw,
    ReadBw,
    SendBw,
    WriteLat,
    AtomicBw,
}

impl Test {
    pub fn parse(s: &str) -> Option<Test> {
        Some(match s.trim_start_matches("ib_") {
            "write_bw" => Test::WriteBw,
            "read_bw" => Test::ReadBw,
            "send_bw" => Test::SendBw,
            "write_lat" => Test::WriteLat,
            "atomic_bw" => Test::AtomicBw,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "ib_write_bw",
            Test::ReadBw => "ib_read_bw",
            Test::SendBw => "ib_send_bw",
            Test::WriteLat => "ib_write_lat",
            Test::AtomicBw => "ib_atomic_bw",
        }
    }
    fn is_bw(self) -> bool {
        !matches!(self, Test::WriteLat)
    }
}

/// Options, with perftest's defaults.
#[derive(Debug, Clone)]
pub struct Opts {
    pub test: Test,
    pub host: Option<String>,
    pub port: u16,
    /// `-s` (atomics are always 8).
    pub size: Option<usize>,
    /// `-n`.
    pub iters: Option<u64>,
    /// `-m` in bytes; the port's MTU if not given.
    pub mtu: Option<u32>,
    /// `-t`.
    pub tx_depth: Option<usize>,
    /// `-o`: READs and atomics this side lets the peer have outstanding, and asks for
    /// (perftest's default, and its ceiling: the device's `max_qp_rd_atom`).
    pub out_reads: Option<u32>,
    /// `-A CMP_AND_SWAP`.
    pub cmp_and_swap: bool,
    /// `--report_gbits`.
    pub gbits: bool,
    pub gid_index: u8,
    /// Longest wait for the peer or one completion.
    pub wait: Duration,
}

/// The per-QP record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    pub lid: u16,
    pub out_reads: u32,
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    pub srqn: u32,
}

impl Dest {
    /// `KEY_PRINT_FMT_GID`, 107 characters and the NUL.
    pub fn encode(&self) -> [u8; KEY_MSG_SIZE_GID] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut m = [0u8; KEY_MSG_SIZE_GID];
        let n = s.len().min(KEY_MSG_SIZE_GID - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    /// Parses a record as `ethernet_read_keys` does (fields split at ':').
    pub fn decode(m: &[u8]) -> Result<Dest, String> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s = std::str::from_utf8(&m[..end]).map_err(|_| "the peer's record is not text")?;
        let f: Vec<&str> = s.split(':').collect();
        let bad = || format!("the peer's record {s:?} is not perftest's (with a GID)");
        if f.len() < 23 {
            return Err(bad());
        }
        let h = |x: &str| u64::from_str_radix(x, 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (k, b) in gid.iter_mut().enumerate() {
            *b = h(f[6 + k])? as u8;
        }
        Ok(Dest {
            lid: h(f[0])? as u16,
            out_reads: h(f[1])? as u32,
            qpn: h(f[2])? as u32,
            psn: h(f[3])? as u32,
            rkey: h(f[4])? as u32,
            vaddr: h(f[5])?,
            gid,
            srqn: h(f[22])? as u32,
        })
    }
}

/// The TCP side channel; `client` writes first in every exchange.
struct Comm {
    s: TcpStream,
    client: bool,
}

impl Comm {
    fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> Result<(), String> {
        let io = |e: std::io::Error| format!("perftest exchange: {e}");
        if self.client {
            self.s.write_all(mine).map_err(io)?;
            self.s.read_exact(theirs).map_err(io)?;
        } else {
            self.s.read_exact(theirs).map_err(io)?;
            self.s.write_all(mine).map_err(io)?;
        }
        Ok(())
    }

    fn hand_shake(&mut self, my: &Dest) -> Result<Dest, String> {
        let mut r = [0u8; KEY_MSG_SIZE_GID];
        self.xchg(&my.encode(), &mut r)?;
        Dest::decode(&r)
    }

    fn close(&mut self, my: &Dest) -> Result<(), String> {
        self.hand_shake(my)?;
        let _ = self.s.write_all(b"done\0");
        Ok(())
    }
}

/// What a run measured (the client's report, or the one the server received).
#[derive(Debug, Clone, Copy, Default)]
pub struct Report {
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate: f64,
    /// write_lat: typical and average one-way latency, microseconds.
    pub lat_typical: f64,
    pub lat_avg: f64,
}

/// Runs one test; prints perftest-like lines through `out`.
pub fn run(dev: &Device, o: &Opts, out: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let t = o.test;
    let size = match t {
        Test::AtomicBw => 8,
        _ => o.size.unwrap_or(match t {
            Test::WriteLat => 2,
            _ => 65536,
        }),
    };
    let iters = o
        .iters
        .unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
    let tx_depth = o
        .tx_depth
        .unwrap_or(if t.is_bw() { 128 } else { 1 })
        .min(iters as usize)
        .max(1);
    let page = 4096u32;
    let cache_line = 64u32;
    // TCP first: perftest's order.
    let client = o.host.is_some();
    let s = match &o.host {
        Some(h) => super::connect_tcp(h, o.port, o.wait)?,
        None => super::serve_one(o.port, o.wait)?,
    };
    s.set_read_timeout(Some(o.wait * 4))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    let mut c = Comm { s, client };
    // 1. versions.
    let mut v = [0u8; 16];
    v[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
    let mut rv = [0u8; 16];
    c.xchg(&v, &mut rv)?;
    let rem_version: f64 = String::from_utf8_lossy(&rv)
        .trim_end_matches('\0')
        .parse()
        .unwrap_or(0.0);
    if rem_version < 5.70 {
        return Err(format!(
            "the peer's perftest version {rem_version} is older than 5.70"
        ));
    }
    // 2. page and cache line sizes.
    let mut r4 = [0u8; 4];
    c.xchg(&page.to_be_bytes(), &mut r4)?;
    let cycle = page.max(u32::from_be_bytes(r4));
    c.xchg(&cache_line.to_be_bytes(), &mut r4)?;
    let cache_line = cache_line.max(u32::from_be_bytes(r4));
    // 3. MTU.
    let port_mtu = dev.info().port_mtu;
    let mine = match o.mtu {
        Some(b) => Mtu::from_bytes(b)
            .ok_or_else(|| format!("invalid MTU {b}"))?
            .min(port_mtu),
        None => port_mtu,
    };
    let mut rm = [0u8; 2];
    c.xchg(&[b'0' + mine as u8, 0], &mut rm)?;
    let mtu = Mtu::from_code(rm[0].wrapping_sub(b'0'))
        .map(|r| r.min(mine))
        .unwrap_or(mine);
    // Resources: one MR over two max(size, page) halves, perftest's layout.
    let half = (size as u64).max(u64::from(cycle)) as usize;
    let buf_len = 2 * half + 4096;
    let mut eo = EndpointOpts::new(QpType::Rc, buf_len);
    eo.send_wr = tx_depth.max(16) as u32;
    eo.recv_wr = 1024;
    let e = Endpoint::new(dev.clone(), &eo).map_err(|x| x.to_string())?;
    // perftest's `ctx_set_out_reads`: the device's `max_qp_rd_atom` unless `-o` asks
    // for fewer; more is cut to it, with perftest's message.
    let limits = dev.info().limits;
    let max_reads = u32::from(limits.max_qp_rd_atom);
    let out_reads = match o.out_reads {
        Some(n) if n > max_reads => {
            eprintln!(" Number of outstanding reads is above max = {max_reads}");
            eprintln!(" Changing to that max value");
            max_reads
        }
        Some(n) if n > 0 => n,
        _ => max_reads,
    };
    let psn = crate::rng::Rng::new(
        u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(5),
    )
    .next_u32()
        & 0xff_ffff;
    let my = Dest {
        lid: 0,
        out_reads,
        qpn: e.qp.qpn,
        psn,
        rkey: e.mr.rkey,
        vaddr: e.mr.addr + half as u64,
        gid: dev
            .gid(o.gid_index)
            .ok_or_else(|| format!("no GID at index {}", o.gid_index))?,
        srqn: 0,
    };
    // 4. handshakes and the connection.
    let mut rem = if t == Test::WriteLat {
        c.hand_shake(&my)?;
        c.hand_shake(&my)?
    } else {
        c.hand_shake(&my)?
    };
    if crate::verbs::device::ip_of(&rem.gid).is_ipv4()
        != crate::verbs::device::ip_of(&my.gid).is_ipv4()
    {
        return Err("Found Incompatibility issue with GID types".into());
    }
    let mut co = ConnectOpts::new(mtu, psn);
    co.access = match t {
        Test::WriteBw | Test::WriteLat => AccessFlags::REMOTE_WRITE,
        Test::ReadBw => AccessFlags::REMOTE_READ,
        Test::AtomicBw => AccessFlags::REMOTE_ATOMIC,
        Test::SendBw => AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE,
    };
    co.timeout = 14;
    co.max_dest_rd_atomic = out_reads as u8;
    // As perftest's RTS step: as many as the peer lets this side have (its record's
    // out_reads), within what this device can initiate.
    co.max_rd_atomic = rem
        .out_reads
        .clamp(1, u32::from(limits.max_qp_init_rd_atom)) as u8;
    co.sgid_index = Some(o.gid_index);
    let remote = Remote {
        qpn: rem.qpn,
        psn: rem.psn,
        gid: rem.gid,
    };
    e.connect(&remote, &co).map_err(|x| x.to_string())?;
    if matches!(t, Test::ReadBw | Test::AtomicBw) {
        out(&format!(" Outstand reads  : {}", co.max_rd_atomic));
    }
    out(&format!(
        " local address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}\n remote address: LID {:#06x} QPN {:#08x} PSN {:#08x} RKey {:#010x} VAddr {:#018x}",
        my.lid, my.qpn, my.psn, my.rkey, my.vaddr, rem.lid, rem.qpn, rem.psn, rem.rkey, rem.vaddr
    ));
    // Two more records (the tools resend the same values; take the last).
    c.hand_shake(&my)?;
    rem = c.hand_shake(&my)?;
    let ctx = Run {
        e: &e,
        t,
        size,
        iters,
        tx_depth,
        cycle,
        cache_line,
        half,
        rem,
        cas: o.cmp_and_swap,
        wait: o.wait,
        client,
    };
    let report = match t {
        Test::WriteLat => {
            let r = ctx.write_lat()?;
            out(&format!(
                " #bytes #iterations    t_typical[usec]    t_avg[usec]\n {size:<7} {iters:<10} {:>15.2} {:>14.2}",
                r.lat_typical, r.lat_avg
            ));
            r
        }
        Test::SendBw => {
            let r = if client {
                // The sync handshake: the server has posted its receives.
                c.hand_shake(&my)?;
                ctx.bw_client()?
            } else {
                let rx = iters.min(512) as usize;
                ctx.send_server_post(rx)?;
                c.hand_shake(&my)?;
                ctx.send_server(rx)?
            };
            print_bw(out, &r, o.gbits);
            c.close(&my)?;
            r
        }
        _ => {
            if client {
                let mut r = ctx.bw_client()?;
                print_bw(out, &r, o.gbits);
                c.hand_shake(&my)?;
                xchg_reports(&mut c, &mut r, o.gbits)?;
                c.close(&my)?;
                r
            } else {
                c.hand_shake(&my)?;
                let mut r = Report::default();
                xchg_reports(&mut c, &mut r, o.gbits)?;
                out(" the client's report:");
                print_bw(out, &r, o.gbits);
                c.close(&my)?;
                r
            }
        }
    };
    e.finish();
    Ok(report)
}

/// Bytes per second in one of perftest's units: `MB/sec` is 2^20 bytes per second,
/// `--report_gbits` decimal Gbit/s (perftest's `format_factor`: 0x100000 or 125000000).
fn per_unit(gbits: bool) -> f64 {
    if gbits { 125_000_000.0 } else { 1_048_576.0 }
}

/// A bandwidth kept in MiB/s (`Report`), in the unit asked for.
fn in_unit(mib_s: f64, gbits: bool) -> f64 {
    mib_s * 1_048_576.0 / per_unit(gbits)
}

fn print_bw(out: &mut dyn FnMut(&str), r: &Report, gbits: bool) {
    let unit = if gbits { "Gb/sec" } else { "MB/sec" };
    out(&format!(
        " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]\n {:<10} {:<10}       {:.2}               {:.2}                  {:.6}",
        r.size,
        r.iters,
        in_unit(r.bw_peak, gbits),
        in_unit(r.bw_avg, gbits),
        r.msg_rate
    ));
}

/// The client writes its report, the server reads it (and sends back its own, which
/// perftest's client ignores: send it zeros). The bandwidths travel in the unit both
/// sides print (perftest's client sends what it printed), so a stock perftest server
/// prints our figures right, and ours prints a stock client's.
fn xchg_reports(c: &mut Comm, r: &mut Report, gbits: bool) -> Result<(), String> {
    let mut b = [0u8; 8];
    let mine = *r;
    c.xchg(&mine.size.to_be_bytes(), &mut b)?;
    let size = u64::from_be_bytes(b);
    c.xchg(&mine.iters.to_be_bytes(), &mut b)?;
    let iters = u64::from_be_bytes(b);
    let back = |v: f64| v / in_unit(1.0, gbits);
    c.xchg(
        &in_unit(mine.bw_peak, gbits).to_bits().to_be_bytes(),
        &mut b,
    )?;
    let peak = back(f64::from_bits(u64::from_be_bytes(b)));
    c.xchg(&in_unit(mine.bw_avg, gbits).to_bits().to_be_bytes(), &mut b)?;
    let avg = back(f64::from_bits(u64::from_be_bytes(b)));
    c.xchg(&mine.msg_rate.to_bits().to_be_bytes(), &mut b)?;
    let rate = f64::from_bits(u64::from_be_bytes(b));
    if !c.client {
        *r = Report {
            size,
            iters,
            bw_peak: peak,
            bw_avg: avg,
            msg_rate: rate,
            ..Report::default()
        };
    }
    Ok(())
}

struct Run<'a> {
    e: &'a Endpoint,
    t: Test,
    size: usize,
    iters: u64,
    tx_depth: usize,
    cycle: u32,
    cache_line: u32,
    half: usize,
    rem: Dest,
    cas: bool,
    wait: Duration,
    client: bool,
}

impl Run<'_> {
    fn inc(&self) -> u64 {
        let s = self.size as u64;
        let cl = u64::from(self.cache_line);
        if s > cl { s.div_ceil(cl) * cl } else { cl }
    }

    /// The remote address of post number `n` (perftest's `increase_rem_addr`).
    fn remote_addr(&self, n: u64) -> u64 {
        if self.size as u64 <= u64::from(self.cycle) / 2 {
            let per = (u64::from(self.cycle) / self.inc()).max(1);
            self.rem.vaddr + (n % per) * self.inc()
        } else {
            self.rem.vaddr
        }
    }

    fn local_off(&self, n: u64) -> usize {
        if self.size as u64 <= u64::from(self.cycle) / 2 {
            let per = (u64::from(self.cycle) / self.inc()).max(1);
            ((n % per) * self.inc()) as usize
        } else {
            0
        }
    }

    /// The report; the peak is the best rate over any stretch of at least a tenth of
    /// the run (and 1 ms), from the completion times `t` (ns since the start): ACKs
    /// complete many WRs at once, so single intervals mean nothing.
    fn report(&self, elapsed: Duration, t: &[u64]) -> Report {
        let bytes = self.size as f64 * self.iters as f64;
        let s = elapsed.as_secs_f64().max(1e-9);
        let mbs = bytes / s / (1u64 << 20) as f64;
        let span = (elapsed.as_nanos() as u64 / 10).max(1_000_000);
        let mut peak = mbs;
        let mut j = 0;
        for i in 0..t.len() {
            j = j.max(i);
            while j < t.len() && t[j] - t[i] < span {
                j += 1;
            }
            if j == t.len() {
                break;
            }
            let rate = (j - i) as f64 * self.size as f64 / ((t[j] - t[i]) as f64 / 1e9);
            peak = peak.max(rate / (1u64 << 20) as f64);
        }
        Report {
            size: self.size as u64,
            iters: self.iters,
            bw_peak: peak,
            bw_avg: mbs,
            msg_rate: self.iters as f64 / s / 1e6,
            ..Report::default()
        }
    }

    /// WRITE, READ, SEND or atomics, `tx_depth` in flight.
    fn bw_client(&self) -> Result<Report, String> {
        let e = self.e;
        let depth = match self.t {
            Test::ReadBw | Test::AtomicBw => self.tx_depth.min(self.rem.out_reads.max(1) as usize),
            _ => self.tx_depth,
        };
        let (mut posted, mut done) = (0u64, 0u64);
        let start = Instant::now();
        let mut times = Vec::with_capacity(self.iters as usize);
        while done < self.iters {
            while posted < self.iters && (posted - done) < depth as u64 {
                let off = self.local_off(posted);
                let raddr = self.remote_addr(posted);
                let rkey = self.rem.rkey;
                let sg = [e.sge(off, self.size)];
                let wr = match self.t {
                    Test::WriteBw => SendWr::write(posted, &sg, raddr, rkey),
                    Test::ReadBw => SendWr::read(posted, &sg, raddr, rkey),
                    Test::SendBw => SendWr::send(posted, &sg),
                    Test::AtomicBw if self.cas => {
                        SendWr::cmp_swap(posted, e.sge(off, 8), raddr, rkey, 0, 0)
                    }
                    _ => SendWr::fetch_add(posted, e.sge(off, 8), raddr, rkey, 1),
                };
                e.qp.post_send(&wr).map_err(|x| x.to_string())?;
                posted += 1;
            }
            let w = e.next_wc(self.wait)?;
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Completion with error at client: {} (wr_id {})",
                    w.status.name(),
                    w.wr_id
                ));
            }
            done += 1;
            times.push(start.elapsed().as_nanos() as u64);
        }
        Ok(self.report(start.elapsed(), &times))
    }

    /// send_bw server: the first `rx` receives, before the sync handshake.
    fn send_server_post(&self, rx: usize) -> Result<(), String> {
        for k in 0..rx {
            self.post_recv(k as u64)?;
        }
        Ok(())
    }

    fn post_recv(&self, k: u64) -> Result<(), String> {
        let off = self.half + self.local_off(k).min(self.half.saturating_sub(self.size));
        self.e
            .qp
            .post_recv(&RecvWr::new(k, &[self.e.sge(off, self.size)]))
            .map_err(|x| x.to_string())
    }

    /// send_bw server: `iters` receives in all, reposted as they complete.
    fn send_server(&self, rx: usize) -> Result<Report, String> {
        let mut posted = rx as u64;
        let mut done = 0u64;
        let mut start = None;
        let mut times = Vec::with_capacity(self.iters as usize);
        while done < self.iters {
            let w = self.e.next_wc(self.wait)?;
            let t0 = *start.get_or_insert_with(Instant::now);
            times.push(t0.elapsed().as_nanos() as u64);
            if w.status != WcStatus::Success {
                return Err(format!(
                    "Completion with error at server: {}",
                    w.status.name()
                ));
            }
            if w.byte_len as usize != self.size {
                return Err(format!("received {} bytes, not {}", w.byte_len, self.size));
            }
            done += 1;
            if posted < self.iters {
                self.post_recv(posted)?;
                posted += 1;
            }
        }
        Ok(self.report(start.map(|s| s.elapsed()).unwrap_or_default(), &times))
    }

    /// ib_write_lat's loop: the last byte of each write carries the iteration number;
    /// each side writes when it has seen the peer's previous write (the server starts).
    fn write_lat(&self) -> Result<Report, String> {
        let e = self.e;
        let post_off = self.size - 1;
        let poll_off = self.half + self.size - 1;
        // The buffer is zero from its allocation (perftest zeroes it too). Zeroing it here
        // would race with the peer's first write, which may already have landed.
        let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
        let mut times = Vec::with_capacity(self.iters as usize);
        let mut t_prev: Option<Instant> = None;
        let start = Instant::now();
        while scnt < self.iters || ccnt < self.iters || rcnt < self.iters {
            // perftest: the server does not wait before its first write.
            if rcnt < self.iters && (self.client || scnt >= 1) {
                rcnt += 1;
                let deadline = Instant::now() + self.wait;
                loop {
                    // Polled without a completion in between (perftest's volatile
                    // poll_buf): a volatile load, so the compiler reads memory every time.
                    let b = e
                        .mem
                        .load_volatile(poll_off)
                        .map_err(|x| format!("{x:?}"))?;
                    if b == rcnt as u8 {
                        break;
                    }
                    if Instant::now() > deadline || super::interrupted() {
                        return Err(format!("no write {rcnt} from the peer"));
                    }
                    // Busy polling as perftest does, yielding so that an engine
                    // thread on the same core can deliver the write.
                    std::thread::yield_now();
                }
            }
            if scnt < self.iters {
                let now = Instant::now();
                if let Some(p) = t_prev {
                    times.push(now.duration_since(p).as_nanos() as u64);
                }
                t_prev = Some(now);
                scnt += 1;
                e.mem
                    .write(post_off, &[scnt as u8])
                    .map_err(|x| format!("{x:?}"))?;
                let wr = SendWr::write(scnt, &[e.sge(0, self.size)], self.rem.vaddr, self.rem.rkey);
                e.qp.post_send(&wr).map_err(|x| x.to_string())?;
            }
            if ccnt < self.iters {
                let w = e.next_wc(self.wait)?;
                if w.status != WcStatus::Success {
                    return Err(format!("Completion with error: {}", w.status.name()));
                }
                ccnt += 1;
            }
        }
        let _ = start;
        // One round trip between two of our posts; latency is half of it.
        times.sort_unstable();
        let us = |ns: u64| ns as f64 / 2000.0;
        let typical = times.get(times.len() / 2).copied().map(us).unwrap_or(0.0);
        let avg = if times.is_empty() {
            0.0
        } else {
            us(times.iter().sum::<u64>() / times.len() as u64)
        };
        Ok(Report {
            size: self.size as u64,
            iters: self.iters,
            lat_typical: typical,
            lat_avg: avg,
            ..Report::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_perftests_gid_format() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x5555_0000_1000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 100],
            srqn: 0,
        };
        let m = d.encode();
        let text = std::str::from_utf8(&m[..107]).unwrap();
        assert_eq!(
            text,
            "0000:0010:000011:abcdef:12345678:0000555500001000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:64:00000000:"
        );
        assert_eq!(m[107], 0);
        assert_eq!(Dest::decode(&m).unwrap(), d);
        assert!(Dest::decode(b"0000:0010:000011").is_err());
    }

    /// 1000 MiB/s is 8.39 decimal Gbit/s: `--report_gbits` printed MiB/s under its
    /// "Gb/sec" header before.
    #[test]
    fn report_gbits_prints_decimal_gigabits() {
        let r = Report {
            size: 65536,
            iters: 100,
            bw_peak: 1200.0,
            bw_avg: 1000.0,
            msg_rate: 0.016,
            ..Report::default()
        };
        let mut t = String::new();
        print_bw(&mut |l| t.push_str(l), &r, true);
        assert!(
            t.contains("BW average[Gb/sec]") && t.contains(" 10.07 ") && t.contains(" 8.39 "),
            "{t}"
        );
        let mut t = String::new();
        print_bw(&mut |l| t.push_str(l), &r, false);
        assert!(
            t.contains("BW average[MB/sec]") && t.contains(" 1000.00 "),
            "{t}"
        );
    }
}

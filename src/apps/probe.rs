//! `roce-xdp probe`: roce-xdp's side of the interop probe (`tools/rxe/probe.c` runs on
//! rxe). One RC QP does one operation `iters` times, as requester or as target, and
//! both sides check every byte, every immediate, every invalidated key and every atomic
//! result.
//!
//! The out-of-band exchange (TCP; the client writes first, the server connects its QP
//! before it answers), all fixed-size NUL-padded ASCII:
//! - record, 128 bytes: `RXP1 qpn psn gid rkey addr len` (hex; the GID as 32 digits);
//! - `GO inv_rkey`, 64 bytes, target to requester once its receives are posted (or, with
//!   `rnr_delay`, before: the requester's first SENDs then meet RNR NAKs);
//! - `DONE status`, 64 bytes, requester to target after its last completion;
//! - `RESULT 0|1 message`, 64 bytes, target to requester after its own checks.
//!
//! Data of iteration `i`, byte `j`: [`pat`]. Atomics act on a counter at the start of the
//! target's buffer, starting at [`seed64`]: CMP_SWAP `i` compares with the model (even
//! `i`) or the model ^ 1 (odd) and swaps in `0x10_0000_0000 + i`; FETCH_ADD `i` adds
//! `i + 1`.

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts, Remote};
use crate::runtime::Device;
use crate::verbs::{
    AccessFlags, MrInfo, Mtu, QpType, RecvWr, SendWr, WcFlags, WcOpcode, WcStatus, WrOpcode,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const REC_LEN: usize = 128;
const MSG_LEN: usize = 64;
/// The most iterations (the C probe's queue depth).
pub const MAX_ITERS: u32 = 64;

/// One operation of the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Write,
    /// WRITE through a type 2 memory window the target binds over its buffer.
    WriteMw,
    WriteImm,
    Read,
    SendImm,
    SendInv,
    Cas,
    Faa,
}

impl Op {
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "write" => Op::Write,
            "write_mw" => Op::WriteMw,
            "write_imm" => Op::WriteImm,
            "read" => Op::Read,
            "send_imm" => Op::SendImm,
            "send_inv" => Op::SendInv,
            "cas" => Op::Cas,
            "faa" => Op::Faa,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::WriteMw => "write_mw",
            Op::WriteImm => "write_imm",
            Op::Read => "read",
            Op::SendImm => "send_imm",
            Op::SendInv => "send_inv",
            Op::Cas => "cas",
            Op::Faa => "faa",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Opts {
    pub requester: bool,
    pub op: Op,
    pub size: u32,
    pub iters: u32,
    pub seed: u32,
    /// Requester: use a wrong R_Key and expect REM_ACCESS_ERR.
    pub bad_rkey: bool,
    /// Target: post the receives this long after GO.
    pub rnr_delay: Duration,
    pub mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout_exp: u8,
    /// TCP server to connect to; `None` listens.
    pub host: Option<String>,
    pub port: u16,
    pub gid_index: u8,
    /// Longest wait for the peer or one completion.
    pub wait: Duration,
}

/// Byte `j` of iteration `i` (the same function as the C probe's).
pub fn pat(seed: u32, i: u32, j: u32) -> u8 {
    let mut x = seed
        .wrapping_mul(0x9E37_79B1)
        .wrapping_add(i.wrapping_mul(0x85EB_CA77))
        .wrapping_add(j.wrapping_mul(0xC2B2_AE3D));
    x ^= x >> 15;
    x = x.wrapping_mul(0x2C1B_3C6D);
    x ^= x >> 12;
    x as u8
}

/// The atomic counter's first value.
pub fn seed64(seed: u32) -> u64 {
    (u64::from(seed) << 32) | 0x1234
}

/// The counter after `iters` operations, and the value each one must return.
fn atomic_model(op: Op, seed: u32, iters: u32) -> (Vec<u64>, u64) {
    let mut m = seed64(seed);
    let mut returned = Vec::new();
    for i in 0..iters {
        returned.push(m);
        match op {
            Op::Cas if i % 2 == 0 => m = 0x10_0000_0000 + u64::from(i),
            Op::Faa => m = m.wrapping_add(u64::from(i) + 1),
            _ => {}
        }
    }
    (returned, m)
}

fn region(o: &Opts, i: u32) -> Vec<u8> {
    (0..o.size).map(|j| pat(o.seed, i, j)).collect()
}

fn msg(s: &str, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let n = s.len().min(len - 1);
    v[..n].copy_from_slice(&s.as_bytes()[..n]);
    v
}

fn read_msg(s: &mut TcpStream, len: usize) -> Result<String, String> {
    let mut v = vec![0u8; len];
    s.read_exact(&mut v)
        .map_err(|e| format!("the peer closed the TCP connection ({e})"))?;
    let end = v.iter().position(|&b| b == 0).unwrap_or(len);
    Ok(String::from_utf8_lossy(&v[..end]).into_owned())
}

fn parse_record(r: &str) -> Result<(Remote, u64, u32), String> {
    let bad = || format!("bad record from the peer: {r:?}");
    let f: Vec<&str> = r.split_whitespace().collect();
    if f.len() != 7 || f[0] != "RXP1" || f[3].len() != 32 {
        return Err(bad());
    }
    let h32 = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
    let mut gid = [0u8; 16];
    for (k, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&f[3][2 * k..2 * k + 2], 16).map_err(|_| bad())?;
    }
    let remote = Remote {
        qpn: h32(f[1])?,
        psn: h32(f[2])?,
        gid,
    };
    let rkey = h32(f[4])?;
    let addr = u64::from_str_radix(f[5], 16).map_err(|_| bad())?;
    Ok((remote, addr, rkey))
}

/// The outcome: `Ok(line)` when both sides' checks passed.
pub fn run(dev: &Device, o: &Opts) -> Result<String, String> {
    let mut o = o.clone();
    if matches!(o.op, Op::Cas | Op::Faa) {
        o.size = 8;
    }
    if o.op == Op::SendInv {
        o.iters = 1;
    }
    if o.iters == 0 || o.iters > MAX_ITERS || o.size == 0 {
        return Err(format!(
            "iterations 1..={MAX_ITERS} and a size above 0, please"
        ));
    }
    let buf_len = o.size as usize * o.iters as usize + 4096;
    let mut eo = EndpointOpts::new(QpType::Rc, buf_len);
    eo.send_wr = 2 * MAX_ITERS;
    eo.recv_wr = 2 * MAX_ITERS;
    if o.op == Op::WriteMw {
        eo.access |= AccessFlags::MW_BIND;
    }
    let e = Endpoint::new(dev.clone(), &eo).map_err(|x| x.to_string())?;
    // SEND_WITH_INV invalidates a key the receive does not use: a type 2 window over a
    // second region (only windows can be invalidated, as in rxe), bound once connected.
    let inv_mr: Option<MrInfo> = if o.op == Op::SendInv && !o.requester {
        let m = crate::verbs::Memory::new(4096);
        Some(
            dev.reg_mr(
                e.pd,
                &m,
                0,
                4096,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::MW_BIND,
            )
            .map_err(|x| x.to_string())?,
        )
    } else {
        None
    };
    let gid = dev
        .gid(o.gid_index)
        .ok_or_else(|| format!("no GID at index {}", o.gid_index))?;
    let psn = crate::rng::Rng::new(
        u64::from(std::process::id())
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(3),
    )
    .next_u32()
        & 0xff_ffff;
    let gid_hex: String = gid.iter().map(|b| format!("{b:02x}")).collect();
    let rec = format!(
        "RXP1 {:06x} {:06x} {gid_hex} {:08x} {:016x} {:08x}",
        e.qp.qpn, psn, e.mr.rkey, e.mr.addr, buf_len
    );
    // Target memory before the exchange.
    if !o.requester {
        match o.op {
            Op::Read => {
                for i in 0..o.iters {
                    e.mem
                        .write(i as usize * o.size as usize, &region(&o, i))
                        .map_err(|x| format!("{x:?}"))?;
                }
            }
            Op::Cas | Op::Faa => e
                .mem
                .write(0, &seed64(o.seed).to_ne_bytes())
                .map_err(|x| format!("{x:?}"))?,
            _ => {}
        }
    }
    let mut co = ConnectOpts::new(o.mtu, psn);
    co.timeout = o.timeout_exp;
    co.max_rd_atomic = 8;
    co.max_dest_rd_atomic = 8;
    co.sgid_index = Some(o.gid_index);
    let mut s = match &o.host {
        Some(h) => {
            let mut s = super::connect_tcp(h, o.port, o.wait)?;
            s.write_all(&msg(&rec, REC_LEN))
                .map_err(|x| x.to_string())?;
            let peer = read_msg(&mut s, REC_LEN)?;
            let (r, addr, rkey) = parse_record(&peer)?;
            e.connect(&r, &co).map_err(|x| x.to_string())?;
            (s, r, addr, rkey)
        }
        None => {
            let mut s = super::serve_one(o.port, o.wait)?;
            let peer = read_msg(&mut s, REC_LEN)?;
            let (r, addr, rkey) = parse_record(&peer)?;
            e.connect(&r, &co).map_err(|x| x.to_string())?;
            s.write_all(&msg(&rec, REC_LEN))
                .map_err(|x| x.to_string())?;
            (s, r, addr, rkey)
        }
    };
    s.0.set_read_timeout(Some(o.wait * 2))
        .map_err(|x| x.to_string())?;
    let (ref mut sock, _remote, raddr, rkey) = s;
    let t0 = Instant::now();
    let mut fail: Option<String> = None;
    if o.requester {
        let go = read_msg(sock, MSG_LEN)?;
        let inv = go
            .strip_prefix("GO ")
            .and_then(|x| u32::from_str_radix(x.trim(), 16).ok())
            .ok_or_else(|| format!("expected GO, got {go:?}"))?;
        let status = match requester(&e, &o, raddr, rkey, inv) {
            Ok(st) => st,
            Err(x) => {
                fail = Some(x);
                "fail"
            }
        };
        sock.write_all(&msg(&format!("DONE {status}"), MSG_LEN))
            .map_err(|x| x.to_string())?;
        let r = read_msg(sock, MSG_LEN)?;
        let rest = r
            .strip_prefix("RESULT ")
            .ok_or_else(|| format!("expected RESULT, got {r:?}"))?;
        if !rest.starts_with('0') && fail.is_none() {
            fail = Some(format!("target: {}", rest.get(2..).unwrap_or("")));
        }
    } else {
        let inv = match (inv_mr, o.op) {
            (Some(m), _) => bind_window(&e, &m, o.wait)?,
            (None, Op::WriteMw) => bind_window(&e, &e.mr, o.wait)?,
            _ => 0,
        };
        if o.rnr_delay.is_zero() {
            post_receives(&e, &o)?;
        }
        sock.write_all(&msg(&format!("GO {inv:08x}"), MSG_LEN))
            .map_err(|x| x.to_string())?;
        if !o.rnr_delay.is_zero() {
            std::thread::sleep(o.rnr_delay);
            post_receives(&e, &o)?;
        }
        if !o.bad_rkey
            && let Err(x) = target_receives(&e, &o, inv)
        {
            fail = Some(x);
        }
        let d = read_msg(sock, MSG_LEN)?;
        let st = d
            .strip_prefix("DONE ")
            .ok_or_else(|| format!("expected DONE, got {d:?}"))?;
        // Memory only now: the requester's WRITEs and atomics have all completed.
        if !o.bad_rkey
            && st == "ok"
            && fail.is_none()
            && let Err(x) = target_memory(&e, &o)
        {
            fail = Some(x);
        }
        let want = if o.bad_rkey { "rem_access_err" } else { "ok" };
        if st != want && fail.is_none() {
            fail = Some(format!("requester: {st}"));
        }
        let r = match &fail {
            None => "RESULT 0 all checks passed".to_string(),
            Some(f) => format!("RESULT 1 {}", f.chars().take(50).collect::<String>()),
        };
        sock.write_all(&msg(&r, MSG_LEN))
            .map_err(|x| x.to_string())?;
    }
    let line = format!(
        "PROBE {} {} size {} iters {}{}: {} ({:.3} s)",
        if o.requester { "requester" } else { "target" },
        o.op.name(),
        o.size,
        o.iters,
        if o.bad_rkey { " bad-rkey" } else { "" },
        match &fail {
            None => "PASS".to_string(),
            Some(f) => format!("FAIL {f}"),
        },
        t0.elapsed().as_secs_f64()
    );
    e.finish();
    match fail {
        None => Ok(line),
        Some(_) => Err(line),
    }
}

fn requester(
    e: &Endpoint,
    o: &Opts,
    raddr: u64,
    rkey: u32,
    inv: u32,
) -> Result<&'static str, String> {
    let rkey = if o.bad_rkey { rkey ^ 0x5a5a_5a00 } else { rkey };
    let size = o.size as usize;
    let res = size * o.iters as usize;
    let (returns, _) = atomic_model(o.op, o.seed, o.iters);
    let mut model = seed64(o.seed);
    for i in 0..o.iters {
        let off = i as usize * size;
        let remote = raddr + off as u64;
        let sg = [e.sge(off, size)];
        let wr = match o.op {
            Op::Write | Op::WriteImm | Op::WriteMw => {
                e.mem
                    .write(off, &region(o, i))
                    .map_err(|x| format!("{x:?}"))?;
                // Through the window, the key the target sent with GO.
                let key = match (o.op, o.bad_rkey) {
                    (Op::WriteMw, false) => inv,
                    _ => rkey,
                };
                let w = SendWr::write(u64::from(i), &sg, remote, key);
                if o.op == Op::WriteImm {
                    w.with_imm(0x1000 + i)
                } else {
                    w
                }
            }
            Op::Read => {
                e.mem.fill(off, size, 0).map_err(|x| format!("{x:?}"))?;
                SendWr::read(u64::from(i), &sg, remote, rkey)
            }
            Op::SendImm => {
                e.mem
                    .write(off, &region(o, i))
                    .map_err(|x| format!("{x:?}"))?;
                SendWr::send(u64::from(i), &sg).with_imm(0x2000 + i)
            }
            Op::SendInv => {
                e.mem
                    .write(off, &region(o, i))
                    .map_err(|x| format!("{x:?}"))?;
                let mut w = SendWr::send(u64::from(i), &sg).with_opcode(WrOpcode::SendWithInv);
                w.invalidate_rkey = inv;
                w
            }
            Op::Cas => {
                let cmp = if i % 2 == 0 { model } else { model ^ 1 };
                SendWr::cmp_swap(
                    u64::from(i),
                    e.sge(res, 8),
                    raddr,
                    rkey,
                    cmp,
                    0x10_0000_0000 + u64::from(i),
                )
            }
            Op::Faa => {
                SendWr::fetch_add(u64::from(i), e.sge(res, 8), raddr, rkey, u64::from(i) + 1)
            }
        };
        e.qp.post_send(&wr).map_err(|x| x.to_string())?;
        let w = e.next_wc(o.wait)?;
        if o.bad_rkey {
            if w.status != WcStatus::RemAccessErr {
                return Err(format!(
                    "a bad rkey completed with {}, not REM_ACCESS_ERR",
                    w.status.name()
                ));
            }
            return Ok("rem_access_err");
        }
        if w.status != WcStatus::Success {
            return Err(format!("WR {i} completed with {}", w.status.name()));
        }
        match o.op {
            Op::Read => {
                if w.opcode != WcOpcode::RdmaRead {
                    return Err(format!("READ {i} completed as {:?}", w.opcode));
                }
                check(
                    &e.mem.to_vec(off, size).map_err(|x| format!("{x:?}"))?,
                    o,
                    i,
                    "READ data",
                )?;
            }
            Op::Cas | Op::Faa => {
                let mut b = [0u8; 8];
                e.mem.read(res, &mut b).map_err(|x| format!("{x:?}"))?;
                let got = u64::from_ne_bytes(b);
                let want = returns[i as usize];
                if got != want {
                    return Err(format!("atomic {i} returned {got:#x}, expected {want:#x}"));
                }
                model = match o.op {
                    Op::Cas if i % 2 == 0 => 0x10_0000_0000 + u64::from(i),
                    Op::Faa => model.wrapping_add(u64::from(i) + 1),
                    _ => model,
                };
            }
            _ => {}
        }
    }
    Ok("ok")
}

fn check(got: &[u8], o: &Opts, i: u32, what: &str) -> Result<(), String> {
    for (j, &b) in got.iter().enumerate() {
        let w = pat(o.seed, i, j as u32);
        if b != w {
            return Err(format!(
                "{what} {i}: byte {j} is {b:#04x}, expected {w:#04x}"
            ));
        }
    }
    Ok(())
}

fn post_receives(e: &Endpoint, o: &Opts) -> Result<(), String> {
    let size = o.size as usize;
    for i in 0..o.iters {
        let wr = match o.op {
            Op::SendImm | Op::SendInv => {
                RecvWr::new(u64::from(i), &[e.sge(i as usize * size, size)])
            }
            Op::WriteImm => RecvWr::new(u64::from(i), &[]),
            _ => continue,
        };
        e.qp.post_recv(&wr).map_err(|x| x.to_string())?;
    }
    Ok(())
}

/// Binds a new type 2 window over all of `mr` through the endpoint's QP; its R_Key.
fn bind_window(e: &Endpoint, mr: &MrInfo, wait: Duration) -> Result<u32, String> {
    let mw = e.dev.alloc_mw(e.pd).map_err(|x| x.to_string())?;
    let b = crate::verbs::MwBind {
        mw: mw.handle,
        rkey: mw.next_rkey(),
        lkey: mr.lkey,
        addr: mr.addr,
        length: mr.length,
        access: AccessFlags::REMOTE_WRITE,
    };
    e.qp.post_send(&SendWr::bind_mw(u64::MAX, b))
        .map_err(|x| x.to_string())?;
    let w = e.next_wc(wait)?;
    if w.status != WcStatus::Success || w.opcode != WcOpcode::BindMw {
        return Err(format!("BIND_MW completed {:?} {:?}", w.opcode, w.status));
    }
    Ok(b.rkey)
}

/// The receive completions the requester's operations produce.
fn target_receives(e: &Endpoint, o: &Opts, inv: u32) -> Result<(), String> {
    if matches!(o.op, Op::SendImm | Op::SendInv | Op::WriteImm) {
        for i in 0..o.iters {
            let w = e.next_wc(o.wait)?;
            if w.status != WcStatus::Success {
                return Err(format!("receive {i} completed with {}", w.status.name()));
            }
            if w.wr_id != u64::from(i) {
                return Err(format!("receive {} completed in place of {i}", w.wr_id));
            }
            if w.byte_len != o.size {
                return Err(format!(
                    "receive {i}: byte_len {}, expected {}",
                    w.byte_len, o.size
                ));
            }
            let ok = match o.op {
                Op::WriteImm => {
                    w.opcode == WcOpcode::RecvRdmaWithImm && w.imm() == Some(0x1000 + i)
                }
                Op::SendImm => w.opcode == WcOpcode::Recv && w.imm() == Some(0x2000 + i),
                _ => {
                    w.opcode == WcOpcode::Recv
                        && w.wc_flags.contains(WcFlags::WITH_INV)
                        && w.invalidated_rkey() == Some(inv)
                }
            };
            if !ok {
                return Err(format!(
                    "{} {i}: opcode {:?}, flags {:#x}, imm/rkey {:#x}",
                    o.op.name(),
                    w.opcode,
                    w.wc_flags.bits(),
                    w.imm_data
                ));
            }
        }
    }
    Ok(())
}

/// The target's memory after the requester is done.
fn target_memory(e: &Endpoint, o: &Opts) -> Result<(), String> {
    let size = o.size as usize;
    match o.op {
        Op::Cas | Op::Faa => {
            let (_, fin) = atomic_model(o.op, o.seed, o.iters);
            let mut b = [0u8; 8];
            e.mem.read(0, &mut b).map_err(|x| format!("{x:?}"))?;
            let got = u64::from_ne_bytes(b);
            if got != fin {
                return Err(format!("the counter is {got:#x}, expected {fin:#x}"));
            }
        }
        _ => {
            let what = if o.op == Op::Read {
                "READ source"
            } else {
                "received data"
            };
            for i in 0..o.iters {
                let got = e
                    .mem
                    .to_vec(i as usize * size, size)
                    .map_err(|x| format!("{x:?}"))?;
                check(&got, o, i, what)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_the_c_probes() {
        // Values printed by tools/rxe/probe.c's pat() compiled with gcc.
        let v: Vec<u8> = (0..8).map(|j| pat(7, 3, j)).collect();
        assert_eq!(v, [187, 164, 228, 168, 177, 66, 237, 75]);
        assert_eq!(pat(0xffff_ffff, 63, 1_048_575), 128);
        assert_eq!(pat(1, 0, 0), 227);
        let (ret, fin) = atomic_model(Op::Faa, 2, 3);
        assert_eq!(ret, [seed64(2), seed64(2) + 1, seed64(2) + 3]);
        assert_eq!(fin, seed64(2) + 6);
        let (ret, fin) = atomic_model(Op::Cas, 2, 3);
        assert_eq!(ret, [seed64(2), 0x10_0000_0000, 0x10_0000_0000]);
        assert_eq!(fin, 0x10_0000_0002);
        assert!(parse_record("RXP1 11 2 zz 1 2 3").is_err());
    }
}

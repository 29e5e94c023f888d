//! Workloads between two endpoints of this process, each checking what it moved:
//! SEND ping-pong latency, WRITE/READ streams, atomics, and the mixed transfer that
//! checks every byte and every atomic result against a model.
//!
//! The endpoints must be connected to each other (A's QP to B's). Every wait is
//! bounded, and Ctrl-C stops a workload with an error.

use super::endpoint::Endpoint;
use super::progress::Progress;
use crate::rng::Rng;
use crate::verbs::{RecvWr, SendFlags, SendWr, Sge, Wc, WcOpcode};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The longest a workload waits for one completion before it reports a stall.
pub const STALL: Duration = Duration::from_secs(20);

/// What a workload measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Round-trip latencies in ns, sorted (ping-pong only).
    pub rtt_ns: Vec<u64>,
}

impl Report {
    /// Gbit/s of payload.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// The `q` quantile (0..=1) of the round-trip times, in microseconds.
    pub fn rtt_us(&self, q: f64) -> f64 {
        if self.rtt_ns.is_empty() {
            return 0.0;
        }
        let i = ((self.rtt_ns.len() - 1) as f64 * q).round() as usize;
        self.rtt_ns[i] as f64 / 1000.0
    }
}

/// `len` pseudo-random bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = vec![0u8; len];
    r.fill(&mut v);
    v
}

fn check(what: &str, got: Vec<u8>, want: &[u8]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    Err(format!(
        "{what}: byte {at} of {} differs (got 0x{:02x}, want 0x{:02x})",
        want.len(),
        got.get(at).copied().unwrap_or(0),
        want.get(at).copied().unwrap_or(0)
    ))
}

pub(crate) fn mem_err(e: impl std::fmt::Debug) -> String {
    format!("memory access: {e:?}")
}

/// Waits for the next completion on `e` with an opcode in `want`; completions of
/// other opcodes (e.g. signalled sends) are counted into `others`.
fn wait_for(e: &Endpoint, want: WcOpcode, others: &mut u64) -> Result<Wc, String> {
    loop {
        // Poll briefly before sleeping: latency is what this step measures. Yield between
        // polls rather than spin: on a small host this thread shares a core with an
        // engine thread, and a spinning poller keeps the engine that would deliver the
        // completion off the CPU (the demo's median RTT went from about 200 to 36 us).
        let mut w = None;
        for _ in 0..200 {
            if let Some(x) = e.cq.poll_one() {
                w = Some(x);
                break;
            }
            std::thread::yield_now();
        }
        let w = match w {
            Some(x) if x.status != crate::verbs::WcStatus::Success => {
                return Err(format!(
                    "QP 0x{:06x}: {:?} completed with {}",
                    e.qp.qpn,
                    x.opcode,
                    x.status.name()
                ));
            }
            Some(x) => x,
            None => e.next_ok(STALL)?,
        };
        if w.opcode == want {
            return Ok(w);
        }
        *others += 1;
    }
}

/// RC SEND ping-pong: A sends `size` bytes, B checks them and sends them back, `iters`
/// times; one round trip per iteration.
pub fn pingpong(a: &Endpoint, b: &Endpoint, size: usize, iters: u64) -> Result<Report, String> {
    let data = pattern(0x9199, size);
    a.mem.write(0, &data).map_err(mem_err)?;
    let rx = 1 << 20;
    let depth = 64u64.min(iters);
    for _ in 0..depth {
        a.qp.post_recv(&RecvWr::new(1, &[a.sge(rx, size)]))
            .map_err(|e| e.to_string())?;
        b.qp.post_recv(&RecvWr::new(1, &[b.sge(rx, size)]))
            .map_err(|e| e.to_string())?;
    }
    let (mut sa, mut sb) = (0u64, 0u64);
    let mut rtt = Vec::with_capacity(iters as usize);
    let start = Instant::now();
    for i in 0..iters {
        let t0 = Instant::now();
        a.qp.post_send(&SendWr::send(2, &[a.sge(0, size)]))
            .map_err(|e| e.to_string())?;
        let w = wait_for(b, WcOpcode::Recv, &mut sb)?;
        if w.byte_len as usize != size {
            return Err(format!("B received {} bytes, not {size}", w.byte_len));
        }
        if i == 0 || i + 1 == iters {
            check(
                "ping-pong data at B",
                b.mem.to_vec(rx, size).map_err(mem_err)?,
                &data,
            )?;
        }
        b.qp.post_send(&SendWr::send(2, &[b.sge(rx, size)]))
            .map_err(|e| e.to_string())?;
        wait_for(a, WcOpcode::Recv, &mut sa)?;
        rtt.push(t0.elapsed().as_nanos() as u64);
        if i + depth < iters {
            a.qp.post_recv(&RecvWr::new(1, &[a.sge(rx, size)]))
                .map_err(|e| e.to_string())?;
            b.qp.post_recv(&RecvWr::new(1, &[b.sge(rx, size)]))
                .map_err(|e| e.to_string())?;
        }
    }
    let elapsed = start.elapsed();
    check(
        "ping-pong data back at A",
        a.mem.to_vec(rx, size).map_err(mem_err)?,
        &data,
    )?;
    // The last send completions.
    while sa < iters {
        a.next_ok(STALL)?;
        sa += 1;
    }
    while sb < iters {
        b.next_ok(STALL)?;
        sb += 1;
    }
    rtt.sort_unstable();
    Ok(Report {
        ops: iters,
        bytes: 2 * iters * size as u64,
        elapsed,
        rtt_ns: rtt,
    })
}

/// Which operation a stream runs: WRITEs (A into B), READs (A from B), or SENDs (A to
/// B's receive queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Write,
    Read,
    Send,
}

impl Stream {
    /// The verb's name, as perftest and the tables print it.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Write => "WRITE",
            Stream::Read => "READ",
            Stream::Send => "SEND",
        }
    }
}

/// Of a stream with `depth` messages in flight, one in this many asks for a completion:
/// a quarter of the depth, at most 100 (perftest's default `--cq-mod`), so the poster
/// refills the window in groups while three quarters of it stay in flight.
pub fn signal_every(depth: usize) -> usize {
    (depth / 4).clamp(1, 100)
}

/// A stream of `total` bytes of WRITEs (A into B) or READs (A from B) in messages of
/// `size`, `depth` outstanding; afterwards the destination is compared with the source.
pub fn stream(
    a: &Endpoint,
    b: &Endpoint,
    op: Stream,
    size: usize,
    total: u64,
    depth: usize,
    prog: &mut Progress,
) -> Result<Report, String> {
    let n = total.div_ceil(size as u64);
    stream_while(a, b, op, size, depth, prog, |posted| posted < n)
}

/// As [`stream`], posting messages while `more(messages posted so far)` holds (a
/// stream that lasts as long as something else does); every posted message completes
/// before it returns.
///
/// One message in [`signal_every`]`(depth)` asks for a completion, and the last one
/// always: an RC send queue completes in order, so one completion retires every WR
/// posted before it (unsignaled ones complete silently with it), and
/// the count stays exact while the poster wakes once per group, as perftest's
/// `--cq-mod` (default 100, at most the TX depth) makes its bandwidth tests do.
pub fn stream_while(
    a: &Endpoint,
    b: &Endpoint,
    op: Stream,
    size: usize,
    depth: usize,
    prog: &mut Progress,
    mut more: impl FnMut(u64) -> bool,
) -> Result<Report, String> {
    let slots = depth.min(a.mem.len() / size).min(b.mem.len() / size).max(1);
    let (src, dst) = match op {
        Stream::Write | Stream::Send => (a, b),
        Stream::Read => (b, a),
    };
    // SENDs land in B's receive buffers, which sit after the slots: twice as many as
    // A has in flight, so that B reposting after A's completions never leaves A
    // without one (an RNR NAK would measure the test, not the NIC).
    let recvs = if op == Stream::Send {
        (2 * slots).min(dst.mem.len() / size - slots)
    } else {
        0
    };
    if op == Stream::Send && recvs < slots {
        return Err(format!(
            "SEND stream: B's {} bytes hold {slots} messages of {size} and not {} receive buffers",
            dst.mem.len(),
            2 * slots
        ));
    }
    let rbuf = |i: usize| (slots + i % recvs.max(1)) * size;
    let data = pattern(0x57ea + op as u64, size * slots);
    src.mem.write(0, &data).map_err(mem_err)?;
    dst.mem
        .fill(0, size * (slots + recvs), 0)
        .map_err(mem_err)?;
    for i in 0..recvs {
        b.qp.post_recv(&RecvWr::new(i as u64, &[b.sge(rbuf(i), size)]))
            .map_err(|e| e.to_string())?;
    }
    let (mut posted, mut done, mut received) = (0u64, 0u64, 0u64);
    // B's receive completions, drained whenever A completes something; each one is
    // checked and its buffer posted again.
    let drain_b = |received: &mut u64| -> Result<(), String> {
        while let Some(w) = b.cq.poll_one() {
            if w.status != crate::verbs::WcStatus::Success
                || w.opcode != WcOpcode::Recv
                || w.byte_len as usize != size
            {
                return Err(format!(
                    "B's receive {} completed {:?} {} with {} bytes, not {size}",
                    w.wr_id,
                    w.opcode,
                    w.status.name(),
                    w.byte_len
                ));
            }
            let i = w.wr_id as usize;
            b.qp.post_recv(&RecvWr::new(w.wr_id, &[b.sge(rbuf(i), size)]))
                .map_err(|e| e.to_string())?;
            *received += 1;
        }
        Ok(())
    };
    let every = signal_every(slots) as u64;
    // Whether message `posted` is to be posted: asked once, ahead, so that the last
    // message is known when it is posted (and signaled).
    let mut open = more(0);
    let start = Instant::now();
    loop {
        while open && posted - done < slots as u64 {
            open = more(posted + 1);
            let slot = (posted % slots as u64) as usize;
            let off = slot * size;
            let sge = [a.sge(off, size)];
            let (addr, rkey) = (b.mr.addr + off as u64, b.mr.rkey);
            let wr = match op {
                Stream::Write => SendWr::write(posted, &sge, addr, rkey),
                Stream::Read => SendWr::read(posted, &sge, addr, rkey),
                Stream::Send => SendWr::send(posted, &sge),
            };
            let signaled = !open || (posted + 1) % every == 0;
            let wr = if signaled {
                wr
            } else {
                wr.with_flags(SendFlags::EMPTY)
            };
            a.qp.post_send(&wr).map_err(|e| e.to_string())?;
            posted += 1;
        }
        if done == posted {
            break;
        }
        let w = a.next_ok(STALL)?;
        if w.wr_id < done || w.wr_id >= posted {
            return Err(format!(
                "completion for message {} with {done} done and {posted} posted",
                w.wr_id
            ));
        }
        // It retires every message before it (RC completes in order).
        done = w.wr_id + 1;
        if recvs > 0 {
            drain_b(&mut received)?;
        }
        prog.set(done * size as u64);
    }
    let elapsed = start.elapsed();
    prog.finish();
    if recvs > 0 {
        // A's last completions came with B's ACKs; B's receive completions for them
        // were written before those ACKs left, so they are there or on their way.
        let t = Instant::now();
        while received < done && t.elapsed() < STALL {
            drain_b(&mut received)?;
            b.cq.wait(Duration::from_millis(10));
        }
        if received != done {
            return Err(format!("B received {received} of {done} SENDs"));
        }
        // The last buffers each slot's message went to: message k (slot k % slots) in
        // receive buffer k % recvs (B's receives complete in order, RC).
        let last = done.saturating_sub(recvs as u64);
        for k in last..done {
            let (slot, rb) = ((k % slots as u64) as usize, (k % recvs as u64) as usize);
            check(
                "SEND stream receive buffer",
                dst.mem.to_vec(rbuf(rb), size).map_err(mem_err)?,
                &data[slot * size..(slot + 1) * size],
            )?;
        }
        // B still has `recvs` receives posted, for messages of this size: use them up
        // with empty SENDs (not measured), so that a later stream of a larger size on
        // the same QPs does not land in them (Remote Invalid Request, IBA 9.7.5.2.5).
        let mut left = recvs as u64;
        while left > 0 {
            let n = left.min(slots as u64);
            for i in 0..n {
                a.qp.post_send(&SendWr::send(u64::MAX - i, &[]))
                    .map_err(|e| e.to_string())?;
            }
            for _ in 0..n {
                a.next_ok(STALL)?;
            }
            let mut got = 0;
            while got < n {
                let w = b.next_ok(STALL)?;
                if w.opcode != WcOpcode::Recv || w.byte_len != 0 {
                    return Err(format!(
                        "B: {:?} of {} bytes, not an empty SEND",
                        w.opcode, w.byte_len
                    ));
                }
                got += 1;
            }
            left -= n;
        }
    } else {
        // Slots used at least once (all of them unless the stream was short).
        let written = done.min(slots as u64) as usize * size;
        check(
            "stream destination",
            dst.mem.to_vec(0, written).map_err(mem_err)?,
            &data[..written],
        )?;
    }
    Ok(Report {
        ops: done,
        bytes: done * size as u64,
        elapsed,
        rtt_ns: Vec::new(),
    })
}

/// `n` FETCH_AND_ADDs pipelined `depth` deep, then `n / 4` CMP_AND_SWAPs one after the
/// other, on one counter of B: every returned value and the final value are checked
/// (the responder executes atomics in PSN order, IBA 9.4.5).
pub fn atomics(a: &Endpoint, b: &Endpoint, n: u64, depth: usize) -> Result<Report, String> {
    let counter = 0usize;
    b.mem.write(counter, &0u64.to_ne_bytes()).map_err(mem_err)?;
    let res = 4096usize;
    let depth = depth.clamp(1, 16);
    let remote = b.mr.addr + counter as u64;
    let mut expect = VecDeque::new();
    let mut model = 0u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    while done < n {
        while posted < n && (posted - done) < depth as u64 {
            let slot = (posted % depth as u64) as usize;
            let add = posted + 1;
            a.qp.post_send(&SendWr::fetch_add(
                posted,
                a.sge(res + slot * 8, 8),
                remote,
                b.mr.rkey,
                add,
            ))
            .map_err(|e| e.to_string())?;
            expect.push_back((slot, model));
            model = model.wrapping_add(add);
            posted += 1;
        }
        let w = a.next_ok(STALL)?;
        let (slot, want) = expect.pop_front().ok_or("a completion nobody posted")?;
        if w.opcode != WcOpcode::FetchAdd {
            return Err(format!(
                "expected a FETCH_ADD completion, got {:?}",
                w.opcode
            ));
        }
        let got = read_u64(a, res + slot * 8)?;
        if got != want {
            return Err(format!(
                "FETCH_ADD {} returned {got}, expected {want}",
                w.wr_id
            ));
        }
        done += 1;
    }
    let mut rng = Rng::new(0xca5);
    let cas = (n / 4).max(1);
    for i in 0..cas {
        let hit = i % 2 == 0;
        let cmp = if hit { model } else { model ^ 1 };
        let swap = rng.next_u64();
        a.qp.post_send(&SendWr::cmp_swap(
            n + i,
            a.sge(res, 8),
            remote,
            b.mr.rkey,
            cmp,
            swap,
        ))
        .map_err(|e| e.to_string())?;
        let w = a.next_ok(STALL)?;
        if w.opcode != WcOpcode::CompSwap {
            return Err(format!(
                "expected a CMP_SWAP completion, got {:?}",
                w.opcode
            ));
        }
        let got = read_u64(a, res)?;
        if got != model {
            return Err(format!("CMP_SWAP returned {got}, expected {model}"));
        }
        if hit {
            model = swap;
        }
    }
    let elapsed = start.elapsed();
    let fin = read_u64(b, counter)?;
    if fin != model {
        return Err(format!("the counter ends at {fin}, expected {model}"));
    }
    Ok(Report {
        ops: n + cas,
        bytes: 8 * (n + cas),
        elapsed,
        rtt_ns: Vec::new(),
    })
}

fn read_u64(e: &Endpoint, off: usize) -> Result<u64, String> {
    let mut b = [0u8; 8];
    e.mem.read(off, &mut b).map_err(mem_err)?;
    Ok(u64::from_ne_bytes(b))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Write,
    WriteImm,
    Read,
    Send,
    SendInline,
    Cas,
    Faa,
}

struct Pending {
    wr_id: u64,
    kind: Kind,
    slot: usize,
    len: usize,
    seed: u64,
    expect: u64,
}

/// What the mixed transfer did.
#[derive(Debug, Clone, Default)]
pub struct Mixed {
    pub report: Report,
    /// Work requests per kind: WRITE, WRITE_IMM, READ, SEND, inline SEND, CAS, FAA.
    pub per_kind: [u64; 7],
    pub recvs: u64,
}

/// Random WRITE, WRITE_WITH_IMM, READ, SEND (gathered from 4 SGEs, scattered into 2),
/// inline SEND, CMP_AND_SWP and FETCH_AND_ADD from A to B until `total` bytes moved,
/// messages up to `max_len`, 16 in flight. Every byte of every message and every atomic
/// result is checked against a model; receives must complete once each, in order.
/// Both memories need 16 slots of `max_len` plus 4 KiB.
pub fn mixed(
    a: &Endpoint,
    b: &Endpoint,
    total: u64,
    max_len: usize,
    seed: u64,
    prog: &mut Progress,
) -> Result<Mixed, String> {
    const SLOTS: usize = 16;
    let slot_len = max_len.max(64);
    let counter_off = SLOTS * slot_len;
    if a.mem.len() < counter_off + 8 || b.mem.len() < counter_off + 8 {
        return Err(format!("memories need {} bytes", counter_off + 8));
    }
    b.mem
        .write(counter_off, &0u64.to_ne_bytes())
        .map_err(mem_err)?;
    let mut rng = Rng::new(seed);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut free: Vec<usize> = (0..SLOTS).collect();
    let mut next_id = 1u64;
    let mut moved = 0u64;
    let mut counter = 0u64;
    let mut out = Mixed::default();
    let mut recv_ids: Vec<u64> = Vec::new();
    let mut recv_set: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let max_inline = a.dev.info().limits.max_inline_data.min(256) as u64;
    let kinds = [
        Kind::Write,
        Kind::WriteImm,
        Kind::Read,
        Kind::Send,
        Kind::SendInline,
        Kind::Cas,
        Kind::Faa,
    ];
    let start = Instant::now();
    let sg = |e: &Endpoint, off: usize, len: usize| -> Sge { e.sge(off, len) };
    while moved < total || !pending.is_empty() {
        while moved < total && !free.is_empty() {
            let slot = free.pop().unwrap_or(0);
            let k = rng.below(kinds.len() as u64) as usize;
            let kind = kinds[k];
            let len = match kind {
                Kind::Write | Kind::WriteImm | Kind::Read => 1 + rng.below(max_len as u64) as usize,
                Kind::Send => rng.below(max_len.min(64 * 1024) as u64 + 1) as usize,
                Kind::SendInline => rng.below(max_inline + 1) as usize,
                Kind::Cas | Kind::Faa => 8,
            };
            let pseed = rng.next_u64();
            let data = pattern(pseed, len);
            let off = slot * slot_len;
            let id = next_id;
            next_id += 1;
            let mut expect = 0;
            let remote = b.mr.addr + off as u64;
            let wr = match kind {
                Kind::Write | Kind::WriteImm => {
                    a.mem.write(off, &data).map_err(mem_err)?;
                    let w = SendWr::write(id, &[sg(a, off, len)], remote, b.mr.rkey);
                    if kind == Kind::WriteImm {
                        b.qp.post_recv(&RecvWr::new(id, &[]))
                            .map_err(|e| e.to_string())?;
                        w.with_imm(id as u32)
                    } else {
                        w
                    }
                }
                Kind::Read => {
                    b.mem.write(off, &data).map_err(mem_err)?;
                    a.mem.fill(off, len, 0).map_err(mem_err)?;
                    SendWr::read(id, &[sg(a, off, len)], remote, b.mr.rkey)
                }
                Kind::Send => {
                    a.mem.write(off, &data).map_err(mem_err)?;
                    let cuts = [0, len / 4, len / 2, 3 * len / 4, len];
                    let g: Vec<Sge> = cuts
                        .windows(2)
                        .map(|c| sg(a, off + c[0], c[1] - c[0]))
                        .collect();
                    b.qp.post_recv(&RecvWr::new(
                        id,
                        &[
                            sg(b, off, len / 3),
                            sg(b, off + len / 3, slot_len - len / 3),
                        ],
                    ))
                    .map_err(|e| e.to_string())?;
                    SendWr::send(id, &g).with_imm(!(id as u32))
                }
                Kind::SendInline => {
                    b.qp.post_recv(&RecvWr::new(id, &[sg(b, off, slot_len)]))
                        .map_err(|e| e.to_string())?;
                    SendWr::send(id, &[])
                        .with_inline(&data)
                        .ok_or("inline data too long")?
                }
                Kind::Cas => {
                    expect = counter;
                    let cmp = if rng.chance(0.5) {
                        counter
                    } else {
                        counter ^ 1
                    };
                    let swap = rng.next_u64();
                    if cmp == counter {
                        counter = swap;
                    }
                    let r = b.mr.addr + counter_off as u64;
                    SendWr::cmp_swap(id, sg(a, off, 8), r, b.mr.rkey, cmp, swap)
                }
                Kind::Faa => {
                    expect = counter;
                    let add = rng.below(1000);
                    counter = counter.wrapping_add(add);
                    let r = b.mr.addr + counter_off as u64;
                    SendWr::fetch_add(id, sg(a, off, 8), r, b.mr.rkey, add)
                }
            };
            a.qp.post_send(&wr).map_err(|e| e.to_string())?;
            out.per_kind[k] += 1;
            moved += len as u64;
            pending.push_back(Pending {
                wr_id: id,
                kind,
                slot,
                len,
                seed: pseed,
                expect,
            });
        }
        let w = a.next_ok(STALL).map_err(|e| {
            format!(
                "{e} ({} WRs in flight; A: {}; B: {})",
                pending.len(),
                a.dev.qp_debug(a.qp.qpn),
                b.dev.qp_debug(b.qp.qpn)
            )
        })?;
        // B's receive completions, drained as they come.
        while let Some(r) = b.cq.poll_one() {
            take_recv(r, &mut recv_ids, &mut recv_set)?;
        }
        let p = pending
            .pop_front()
            .ok_or("a completion for a WR never posted")?;
        if w.wr_id != p.wr_id {
            return Err(format!("completion {} arrived before {}", w.wr_id, p.wr_id));
        }
        let off = p.slot * slot_len;
        let data = pattern(p.seed, p.len);
        let (want_op, mem, what) = match p.kind {
            Kind::Write | Kind::WriteImm => (WcOpcode::RdmaWrite, &b.mem, "WRITE at B"),
            Kind::Read => (WcOpcode::RdmaRead, &a.mem, "READ at A"),
            Kind::Send | Kind::SendInline => (WcOpcode::Send, &b.mem, "SEND at B"),
            Kind::Cas => (WcOpcode::CompSwap, &a.mem, ""),
            Kind::Faa => (WcOpcode::FetchAdd, &a.mem, ""),
        };
        if w.opcode != want_op {
            return Err(format!(
                "WR {} completed as {:?}, not {want_op:?}",
                p.wr_id, w.opcode
            ));
        }
        match p.kind {
            Kind::Cas | Kind::Faa => {
                let v = read_u64(a, off)?;
                if v != p.expect {
                    return Err(format!(
                        "atomic {} returned {v}, expected {}",
                        p.wr_id, p.expect
                    ));
                }
            }
            Kind::Send | Kind::SendInline => {
                // The receive completes before the sender's ACK arrives.
                let deadline = Instant::now() + STALL;
                while !recv_set.contains(&p.wr_id) {
                    match b.cq.poll_one() {
                        Some(r) => take_recv(r, &mut recv_ids, &mut recv_set)?,
                        None if Instant::now() > deadline => {
                            return Err(format!("receive {} never completed", p.wr_id));
                        }
                        None => std::thread::yield_now(),
                    }
                }
                check(
                    &format!("{what} (WR {})", p.wr_id),
                    mem.to_vec(off, p.len).map_err(mem_err)?,
                    &data,
                )?;
            }
            _ => check(
                &format!("{what} (WR {})", p.wr_id),
                mem.to_vec(off, p.len).map_err(mem_err)?,
                &data,
            )?,
        }
        out.report.ops += 1;
        free.push(p.slot);
        prog.set(moved.min(total));
    }
    out.report.elapsed = start.elapsed();
    out.report.bytes = moved;
    prog.finish();
    // Receives for WRITE_WITH_IMM that might still be queued.
    let expected_recvs = out.per_kind[1] + out.per_kind[3] + out.per_kind[4];
    let deadline = Instant::now() + STALL;
    while (recv_ids.len() as u64) < expected_recvs {
        match b.cq.poll_one() {
            Some(r) => take_recv(r, &mut recv_ids, &mut recv_set)?,
            None if Instant::now() > deadline => {
                return Err(format!(
                    "{} of {expected_recvs} receives completed",
                    recv_ids.len()
                ));
            }
            None => std::thread::sleep(Duration::from_micros(50)),
        }
    }
    let mut sorted = recv_ids.clone();
    sorted.sort_unstable();
    if sorted != recv_ids {
        return Err("receives completed out of order".into());
    }
    if recv_set.len() != recv_ids.len() {
        return Err("a receive completed twice".into());
    }
    out.recvs = recv_ids.len() as u64;
    let fin = read_u64(b, counter_off)?;
    if fin != counter {
        return Err(format!("the counter ends at {fin}, expected {counter}"));
    }
    Ok(out)
}

fn take_recv(
    r: Wc,
    ids: &mut Vec<u64>,
    set: &mut std::collections::HashSet<u64>,
) -> Result<(), String> {
    if r.status != crate::verbs::WcStatus::Success {
        return Err(format!(
            "receive {} completed with {}",
            r.wr_id,
            r.status.name()
        ));
    }
    ids.push(r.wr_id);
    set.insert(r.wr_id);
    Ok(())
}

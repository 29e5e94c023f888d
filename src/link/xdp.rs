//! The AF_XDP link: one socket per receive queue, fed by the XDP program, on a UMEM of
//! its own (xsk-rs).
//!
//! Each UMEM is split: half its frames wait in the fill ring for received frames, half
//! are free for transmission. Rings are worked in batches; `need_wakeup` keeps the
//! kernel from being kicked when it is already busy. A frame that fits one UMEM frame is
//! parsed in place on receive and built in place on transmit, so its payload is copied
//! once between the wire and registered memory. A larger one (RoCE path MTU 4096 needs
//! about 4170 bytes, more than a 4096-byte UMEM frame minus its headroom) is chained
//! over several buffers (`XDP_USE_SG`, `XDP_PKT_CONTD`). On receive, its first buffer
//! stays where it is and the engine takes the frame in two pieces, that buffer and the
//! rest (the later buffers, gathered: one buffer at IB MTU 4096), so its payload too is
//! copied once into registered memory. On transmit, the engine builds it in its first
//! buffer, continuing in a scratch buffer whose bytes (the last few hundred at IB MTU
//! 4096) are copied into the buffers that follow.

use super::FrameLink;
use super::bpf::XdpProgram;
use crate::host::Interface;
use crate::wire::{Pieces, PiecesMut};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};
use xsk_rs::config::{
    BindFlags, FrameSize, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

/// How to set up the link.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// Receive queues to bind a socket on (default: all of the interface's).
    pub queues: Option<Vec<u32>>,
    /// UMEM frame size: 2048 or 4096.
    pub frame_size: u32,
    /// Frames per UMEM (one UMEM per queue).
    pub frames: u32,
    /// Ring entries worked per batch.
    pub batch: usize,
    /// `Some(true)`: zero-copy or fail; `Some(false)`: copy mode; `None`: zero-copy if
    /// the driver supports it, else copy.
    pub zero_copy: Option<bool>,
    /// Use the multi-buffer program and sockets; `None` decides from the MTU.
    pub multi_buffer: Option<bool>,
}

impl Default for XdpConfig {
    fn default() -> Self {
        XdpConfig {
            queues: None,
            frame_size: 4096,
            frames: 4096,
            batch: 64,
            zero_copy: None,
            multi_buffer: None,
        }
    }
}

struct Queue {
    id: u32,
    umem: Umem,
    tx: TxQueue,
    rx: RxQueue,
    fq: FillQueue,
    cq: CompQueue,
    free_tx: Vec<FrameDesc>,
    /// Scratch for consumed descriptors.
    descs: Vec<FrameDesc>,
    /// Descriptors to give back to the fill ring.
    refill: Vec<FrameDesc>,
    /// Descriptors filled, to put on the TX ring.
    pending_tx: Vec<FrameDesc>,
    /// Entries of the TX ring.
    tx_size: u32,
    /// True while the TX ring holds descriptors the kernel has not taken yet (read from
    /// the ring's consumer index after each push): only these need a kick, and only these
    /// keep the engine thread from sleeping. Frames the kernel has taken but not yet
    /// completed need neither: in copy mode their completions come when the driver
    /// frees the socket buffers, and virtio-net frees them late. Waiting for those
    /// completions, an engine in a 1-vCPU VM made 47 `sendto` calls and 23
    /// `sched_yield`s per 64 KiB WRITE it received (perf stat, `tools/rxe-interop
    /// --bench`), for one ACK sent.
    untaken: bool,
    /// A chained (multi-buffer) frame being received. Its buffers can arrive over
    /// several RX batches, so the state lives here, per queue, between `recv` calls: the
    /// first buffer, kept out of the fill ring until the frame is handed on, and the
    /// later buffers' bytes gathered behind it in `chain`.
    chain_head: Option<FrameDesc>,
    chain: Vec<u8>,
    chain_len: usize,
    chain_bad: bool,
    zero_copy: bool,
    fd: RawFd,
}

/// What the link has done.
#[derive(Debug, Clone, Copy, Default)]
pub struct XdpLinkStats {
    pub rx_frames: u64,
    pub tx_frames: u64,
    pub rx_multi_buffer: u64,
    pub tx_multi_buffer: u64,
    /// Frames dropped because a chained frame was longer than the largest frame.
    pub rx_too_long: u64,
    /// Transmissions that found no free UMEM frame or ring slot.
    pub tx_ring_full: u64,
    /// `sendto` calls that woke the kernel to transmit (copy mode needs one per batch).
    pub tx_kicks: u64,
}

/// An AF_XDP link on one interface.
pub struct XdpLink {
    ifc: Interface,
    /// The XDP program; after `split`, only the first part holds it.
    prog: Option<XdpProgram>,
    frags: bool,
    mode: String,
    queues: Vec<Queue>,
    /// Bytes of frame data one UMEM frame holds.
    frame_mtu: usize,
    batch: usize,
    scratch: Vec<u8>,
    next_tx_queue: usize,
    pub stats: XdpLinkStats,
}

/// Largest frame the link carries (jumbo 9000 plus Ethernet and VLAN headers).
pub const MAX_FRAME: usize = 9022;

fn qsize(n: u32) -> Result<QueueSize, String> {
    QueueSize::new(n).map_err(|e| format!("ring size {n}: {e}"))
}

impl XdpLink {
    /// Waits in poll(2) until a socket has a frame to receive or `timeout` passes: true
    /// if one has. For a caller that drives the link itself and sleeps between frames
    /// (the raw echo of `bench latency`), as the engine thread does when idle.
    pub fn wait_readable(&self, timeout: std::time::Duration) -> bool {
        let mut p: Vec<libc::pollfd> = self
            .queues
            .iter()
            .map(|q| libc::pollfd {
                fd: q.fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `p` is a live array of `p.len()` pollfds for the duration of the call.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        n > 0 && p.iter().any(|x| x.revents & libc::POLLIN != 0)
    }

    /// Attaches the XDP program to `ifname` for `addrs` and binds the sockets.
    pub fn open(ifname: &str, addrs: &[IpAddr], cfg: &XdpConfig) -> Result<XdpLink, String> {
        let ifc = Interface::find(ifname).map_err(|e| e.to_string())?;
        crate::host::check_xdp_privileges()?;
        let mtu = ifc.mtu().map_err(|e| e.to_string())? as usize;
        if cfg.frame_size != 2048 && cfg.frame_size != 4096 {
            return Err(format!("frame size {} (use 2048 or 4096)", cfg.frame_size));
        }
        let umem_cfg = UmemConfig::builder()
            .frame_size(FrameSize::new(cfg.frame_size).map_err(|e| e.to_string())?)
            .fill_queue_size(qsize(cfg.frames / 2)?)
            .comp_queue_size(qsize(cfg.frames / 2)?)
            .build()
            .map_err(|e| format!("UMEM config: {e}"))?;
        let frame_mtu = umem_cfg.mtu() as usize;
        // Ethernet header and a possible VLAN tag on top of the IP MTU.
        let frags = cfg.multi_buffer.unwrap_or(mtu + 18 > frame_mtu);
        if !frags && mtu + 18 > frame_mtu {
            return Err(format!(
                "MTU {mtu} of {ifname} needs frames of {} bytes, more than a {}-byte UMEM frame holds: enable multi-buffer (or lower the MTU)",
                mtu + 18,
                frame_mtu
            ));
        }
        let bytes = u64::from(cfg.frames) * u64::from(cfg.frame_size) * ifc.rx_queues() as u64;
        crate::host::raise_memlock(bytes)?;
        let prog = XdpProgram::attach(&ifc, addrs, frags)?;
        let ids: Vec<u32> = match &cfg.queues {
            Some(q) => q.clone(),
            None => (0..ifc.rx_queues() as u32).collect(),
        };
        let mut queues = Vec::new();
        for id in ids {
            let q = Self::open_queue(&ifc, id, &umem_cfg, cfg, frags)?;
            prog.register(id, q.fd)?;
            tracing::info!(
                "AF_XDP socket on {} queue {}: {} mode, XDP {}{}",
                ifc.name,
                id,
                if q.zero_copy { "zero-copy" } else { "copy" },
                prog.mode,
                if frags { ", multi-buffer" } else { "" }
            );
            queues.push(q);
        }
        let (frags, mode) = (prog.frags, prog.mode.clone());
        Ok(XdpLink {
            ifc,
            prog: Some(prog),
            frags,
            mode,
            queues,
            frame_mtu,
            batch: cfg.batch.max(1),
            scratch: vec![0u8; MAX_FRAME],
            next_tx_queue: 0,
            stats: XdpLinkStats::default(),
        })
    }

    fn open_queue(
        ifc: &Interface,
        id: u32,
        umem_cfg: &UmemConfig,
        cfg: &XdpConfig,
        frags: bool,
    ) -> Result<Queue, String> {
        let count = NonZeroU32::new(cfg.frames).ok_or("zero UMEM frames")?;
        let (umem, mut descs) =
            Umem::new(*umem_cfg, count, false).map_err(|e| format!("creating the UMEM: {e}"))?;
        let iface = ifc
            .name
            .parse()
            .map_err(|_| format!("bad interface name {}", ifc.name))?;
        let mut base = BindFlags::XDP_USE_NEED_WAKEUP;
        if frags {
            base |= BindFlags::XDP_USE_SG;
        }
        let sock_cfg = |mode: BindFlags| {
            SocketConfig::builder()
                .rx_queue_size(qsize(cfg.frames / 2).unwrap_or_else(|_| unreachable!()))
                .tx_queue_size(qsize(cfg.frames / 2).unwrap_or_else(|_| unreachable!()))
                .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
                .xdp_flags(XdpFlags::empty())
                .bind_flags(base | mode)
                .build()
        };
        let try_bind = |mode: BindFlags| {
            // A queue whose last socket was just closed stays bound until the kernel's
            // deferred UMEM release runs (EBUSY for a moment): a bench that opens the
            // interface again right after an engine on it stopped met that. Waits up
            // to 2 s for it.
            let start = std::time::Instant::now();
            loop {
                // SAFETY: the UMEM outlives the socket (both live in `Queue`, the UMEM
                // is reference counted by xsk-rs), and this UMEM is bound to one socket
                // only.
                let r = unsafe { Socket::new(sock_cfg(mode), &umem, &iface, id) };
                let errno = r.as_ref().err().and_then(|e| {
                    std::error::Error::source(e)
                        .and_then(|s| s.downcast_ref::<std::io::Error>())
                        .and_then(|io| io.raw_os_error())
                });
                match errno {
                    Some(libc::EBUSY) if start.elapsed() < std::time::Duration::from_secs(2) => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    _ => {
                        return r.map_err(|e| match errno {
                            Some(n) => format!("{e} ({})", std::io::Error::from_raw_os_error(n)),
                            None => e.to_string(),
                        });
                    }
                }
            }
        };
        let (sock, zero_copy) = match cfg.zero_copy {
            Some(true) => (
                try_bind(BindFlags::XDP_ZEROCOPY)
                    .map_err(|e| format!("zero-copy bind on {} queue {id}: {e}", ifc.name))?,
                true,
            ),
            Some(false) => (
                try_bind(BindFlags::XDP_COPY)
                    .map_err(|e| format!("AF_XDP bind on {} queue {id}: {e}", ifc.name))?,
                false,
            ),
            None => match try_bind(BindFlags::XDP_ZEROCOPY) {
                Ok(s) => (s, true),
                Err(e) => {
                    tracing::info!(
                        "zero-copy refused on {} queue {id} ({e}); using copy mode",
                        ifc.name
                    );
                    (
                        try_bind(BindFlags::XDP_COPY)
                            .map_err(|e| format!("AF_XDP bind on {} queue {id}: {e}", ifc.name))?,
                        false,
                    )
                }
            },
        };
        let (tx, rx, rings) = sock;
        let (mut fq, cq) = rings.ok_or("the UMEM came without fill and completion rings")?;
        let half = descs.len() / 2;
        let free_tx = descs.split_off(half);
        // SAFETY: these frames belong to this UMEM and nothing else uses them now.
        let n = unsafe { fq.produce(&descs) };
        if n != descs.len() {
            return Err(format!("fill ring took {n} of {} frames", descs.len()));
        }
        let fd = rx.fd().as_raw_fd();
        Ok(Queue {
            id,
            umem,
            tx,
            rx,
            fq,
            cq,
            free_tx,
            descs: vec![FrameDesc::default(); cfg.batch.max(1)],
            refill: Vec::with_capacity(cfg.batch.max(1) * 4),
            pending_tx: Vec::with_capacity(cfg.batch.max(1) * 4),
            tx_size: cfg.frames / 2,
            untaken: false,
            chain: if frags {
                vec![0u8; MAX_FRAME]
            } else {
                Vec::new()
            },
            chain_head: None,
            chain_len: 0,
            chain_bad: false,
            zero_copy,
            fd,
        })
    }

    /// The XDP program's counters.
    pub fn xdp_stats(&self) -> Option<super::bpf::XdpStats> {
        self.prog.as_ref().map(|p| p.stats())
    }

    /// Frames the kernel dropped on their way into this link's sockets because there
    /// was no room: no free UMEM frame in the fill ring, or a full RX ring (the engine
    /// did not keep up). The sockets' XDP_STATISTICS; the peer retransmits them.
    pub fn rx_no_room(&self) -> u64 {
        self.queues
            .iter()
            .filter_map(|q| q.rx.fd().xdp_statistics().ok())
            .map(|s| s.rx_dropped() + s.rx_ring_full())
            .sum()
    }

    /// How many RX queues (sockets) the link has.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Splits the link into `n` links over disjoint sets of its queues (queue index
    /// `i` goes to part `i % n`), for one engine thread per part. The first part keeps
    /// the XDP program: it stays attached, and redirecting to every part's sockets,
    /// until that part is dropped.
    pub fn split(mut self, n: usize) -> Result<Vec<XdpLink>, String> {
        if n == 0 || n > self.queues.len() {
            return Err(format!(
                "{} engine threads need as many receive queues; {} has {} (ethtool -L, or a veth made with numrxqueues)",
                n,
                self.ifc.name,
                self.queues.len()
            ));
        }
        let mut parts: Vec<XdpLink> = (0..n)
            .map(|_| XdpLink {
                ifc: self.ifc.clone(),
                prog: None,
                frags: self.frags,
                mode: self.mode.clone(),
                queues: Vec::new(),
                frame_mtu: self.frame_mtu,
                batch: self.batch,
                scratch: vec![0u8; MAX_FRAME],
                next_tx_queue: 0,
                stats: XdpLinkStats::default(),
            })
            .collect();
        for (i, q) in self.queues.drain(..).enumerate() {
            parts[i % n].queues.push(q);
        }
        // The program goes last into part 0, so it is dropped after nothing: each part
        // owns its sockets, and the program's link detaches when part 0 drops.
        parts[0].prog = self.prog.take();
        Ok(parts)
    }

    /// True when frames are chained over several buffers (`XDP_USE_SG`).
    pub fn multi_buffer(&self) -> bool {
        self.frags
    }

    fn reap_completions(q: &mut Queue) {
        loop {
            // SAFETY: completed frames go back to our free list; the kernel is done
            // with them.
            let n = unsafe { q.cq.consume(&mut q.descs) };
            if n == 0 {
                break;
            }
            q.free_tx.extend_from_slice(&q.descs[..n]);
        }
    }

    /// Moves filled descriptors to the TX ring and wakes the kernel if it waits for
    /// that. Only while the ring holds descriptors the kernel has not taken: in copy
    /// mode `need_wakeup` is always set on TX, and a `sendto` per loop turn with nothing
    /// queued cost 3.2 system calls per frame sent (perf stat, demo WRITE step). Copy
    /// mode sends a budget of descriptors per kick before it returns, so what is left
    /// after it needs the next one.
    fn push_tx(q: &mut Queue, stats: &mut XdpLinkStats) {
        if q.pending_tx.is_empty() {
            Self::reap_completions(q);
        } else {
            // SAFETY: the descriptors describe filled frames of this UMEM.
            let m = unsafe { q.tx.produce(&q.pending_tx) };
            q.pending_tx.drain(..m);
        }
        let mut free = q.tx.nb_free_exact();
        if free < q.tx_size && q.tx.needs_wakeup() {
            stats.tx_kicks += 1;
            let _ = q.tx.wakeup();
            free = q.tx.nb_free_exact();
        }
        q.untaken = free < q.tx_size;
    }
}

impl FrameLink for XdpLink {
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Pieces<'_>)) -> usize {
        let mut total = 0;
        let batch = self.batch;
        for q in &mut self.queues {
            let want = batch.min(max.saturating_sub(total));
            if want == 0 {
                break;
            }
            // SAFETY: `descs` is our scratch; consumed descriptors describe frames of this
            // UMEM the kernel has handed over until we put them back in the fill ring.
            let n = unsafe { q.rx.consume(&mut q.descs[..want]) };
            for i in 0..n {
                let d = q.descs[i];
                // SAFETY: the frame is ours (consumed from the RX ring, not yet refilled).
                let data = unsafe { q.umem.data(&d) }.contents();
                let Some(h) = q.chain_head else {
                    if d.has_more_frames() {
                        // The first buffer of a chained frame: it waits, unread and out of
                        // the fill ring, for the rest.
                        q.chain_head = Some(d);
                        continue;
                    }
                    f(Pieces::one(data));
                    total += 1;
                    q.refill.push(d);
                    continue;
                };
                // A later buffer of a chained frame: gathered behind the earlier ones (at
                // IB MTU 4096, the one later buffer holds a few hundred bytes).
                let at = q.chain_len;
                if at + data.len() <= q.chain.len() {
                    q.chain[at..at + data.len()].copy_from_slice(data);
                } else {
                    q.chain_bad = true;
                }
                q.chain_len += data.len();
                q.refill.push(d);
                if !d.has_more_frames() {
                    if q.chain_bad {
                        self.stats.rx_too_long += 1;
                    } else {
                        self.stats.rx_multi_buffer += 1;
                        // SAFETY: `h` is ours as `d` is: consumed, held back from refill.
                        let head = unsafe { q.umem.data(&h) }.contents();
                        f(Pieces {
                            first: head,
                            rest: &q.chain[..q.chain_len],
                        });
                    }
                    q.chain_head = None;
                    q.chain_len = 0;
                    q.chain_bad = false;
                    total += 1;
                    q.refill.push(h);
                }
            }
            if !q.refill.is_empty() {
                // SAFETY: these frames are ours and done with; they go back to the kernel.
                let m = unsafe { q.fq.produce(&q.refill) };
                q.refill.drain(..m);
                if q.fq.needs_wakeup() {
                    let _ = q.fq.wakeup(q.rx.fd_mut(), 0);
                }
            }
        }
        self.stats.rx_frames += total as u64;
        total
    }

    fn send(&mut self, fill: &mut dyn FnMut(PiecesMut<'_>) -> Option<usize>) -> usize {
        let nq = self.queues.len();
        if nq == 0 {
            return 0;
        }
        let qi = self.next_tx_queue % nq;
        self.next_tx_queue = self.next_tx_queue.wrapping_add(1);
        let frame_mtu = self.frame_mtu;
        let batch = self.batch;
        let scratch = &mut self.scratch;
        let q = &mut self.queues[qi];
        Self::reap_completions(q);
        let multi = self.frags;
        // A frame needs up to this many buffers.
        let need = if multi {
            MAX_FRAME.div_ceil(frame_mtu)
        } else {
            1
        };
        let mut sent = 0;
        while sent < batch {
            if q.free_tx.len() < need || q.tx.nb_free(need as u32) < need as u32 {
                self.stats.tx_ring_full += 1;
                break;
            }
            let mut d = q.free_tx.pop().unwrap_or_else(|| unreachable!());
            // Built in place: the payload is copied once, from registered memory. A frame
            // longer than one buffer (multi-buffer) continues in the scratch buffer, whose
            // bytes (a few hundred at IB MTU 4096) are then copied into the buffers it
            // is chained over.
            // SAFETY: `d` is a free TX frame of this UMEM; the kernel does not own it.
            let (cap, n) = unsafe {
                let mut data = q.umem.data_mut(&mut d);
                let mut cur = data.cursor();
                let cap = cur.buf_len();
                cur.set_pos(cap);
                let rest: &mut [u8] = if multi { &mut scratch[..] } else { &mut [] };
                let n = fill(PiecesMut {
                    first: data.contents_mut(),
                    rest,
                });
                (cap, n)
            };
            let Some(n) = n else {
                q.free_tx.push(d);
                break;
            };
            let first = n.min(cap);
            // SAFETY: as above.
            unsafe { q.umem.data_mut(&mut d).cursor().set_pos(first) };
            d.set_options(if n > first { 1 } else { 0 });
            q.pending_tx.push(d);
            if n > first {
                let chunks = (n - first).div_ceil(frame_mtu);
                for (k, chunk) in scratch[..n - first].chunks(frame_mtu).enumerate() {
                    let mut d = q.free_tx.pop().unwrap_or_else(|| unreachable!());
                    // SAFETY: `d` is a free TX frame of this UMEM; the kernel does not own it.
                    unsafe {
                        let mut data = q.umem.data_mut(&mut d);
                        let mut cur = data.cursor();
                        cur.set_pos(0);
                        use std::io::Write;
                        let _ = cur.write_all(chunk);
                    }
                    d.set_options(if k + 1 < chunks { 1 } else { 0 });
                    q.pending_tx.push(d);
                }
                self.stats.tx_multi_buffer += 1;
            }
            sent += 1;
        }
        Self::push_tx(q, &mut self.stats);
        self.stats.tx_frames += sent as u64;
        sent
    }

    fn flush(&mut self) {
        for q in &mut self.queues {
            Self::push_tx(q, &mut self.stats);
            Self::reap_completions(q);
        }
    }

    fn fds(&self) -> Vec<RawFd> {
        self.queues.iter().map(|q| q.fd).collect()
    }

    fn tx_pending(&self) -> bool {
        self.queues
            .iter()
            .any(|q| q.untaken || !q.pending_tx.is_empty())
    }

    fn describe(&self) -> String {
        let q: Vec<String> = self
            .queues
            .iter()
            .map(|q| {
                format!(
                    "queue {} {}",
                    q.id,
                    if q.zero_copy { "zero-copy" } else { "copy" }
                )
            })
            .collect();
        format!(
            "AF_XDP on {} ({}; XDP {}{})",
            self.ifc.name,
            q.join(", "),
            self.mode,
            if self.frags { ", multi-buffer" } else { "" }
        )
    }
}

//! The RDMA engine, without I/O (the design of quinn-proto).
//!
//! [`Engine`] holds every object of a device (PDs, MRs, CQs, SRQs, QPs) and runs the
//! transport. It never touches a socket, a thread or a clock:
//! - verbs calls (`reg_mr`, `create_qp`, `modify_qp`, `post_send`, `poll_cq`, ...) change
//!   its state;
//! - [`Engine::handle_frame`] takes a received frame, [`Engine::handle_timeout`] tells it
//!   time passed its deadline;
//! - [`Engine::poll_transmit`] hands out the next frame to send, [`Engine::poll_timeout`]
//!   the next deadline, [`Engine::poll_event`] the next asynchronous event.
//!
//! A driver calls, after any handler or verbs call: `poll_transmit` until `None`, then
//! `poll_timeout` to know how long it may sleep. Tests drive it over a simulated link
//! with simulated time ([`crate::link::sim`]), so every run reproduces from its seed.
//!
//! Where a packet enters: [`Engine::handle_frame`]. Where a PSN is checked: the
//! responder (`responder.rs`, `rc_request`) and the completer (`completer.rs`). Where
//! memory is touched: `mem.rs`, through keys, bounds and access flags.

pub mod cm;
pub mod completer;
pub mod counters;
pub mod mem;
mod pool;
pub mod qp;
pub mod requester;
pub mod responder;

pub use counters::Counters;

use crate::link::Node;
use crate::rng::Rng;
use crate::time::Time;
use crate::verbs::device::Gid;
use crate::verbs::{
    AccessFlags, AsyncEvent, Cq, DeviceConfig, DeviceLimits, Error, Memory, MrInfo, Mw, PortAttr,
    QpAttr, QpAttrMask, QpInitAttr, QpState, QpType, RecvWr, SendWr, Srq, Wc,
};
use crate::wire::{Frame, PiecesMut};
use mem::MrTable;
use qp::Qp;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

/// The VLAN a frame came on (a priority tag, VID 0, is none).
pub(crate) fn vid_of(f: &Frame<'_>) -> Option<u16> {
    f.eth().vlan.map(|t| t.vid).filter(|v| *v != 0)
}

/// The lowest QPN handed out, as rxe's (QP1 takes the pool index before it).
pub const FIRST_QPN: u32 = 0x11;

/// Frames one QP may send in a row before the next ready QP's turn. Round-robin per
/// frame touched a different QP's state for every frame when many QPs were busy (cold
/// on both engines); a short burst keeps it warm, and eight frames are 8 KiB at IB MTU
/// 1024 (32 KiB at 4096), so no QP waits behind another for long.
pub const TX_BURST: u32 = 8;

/// How many packets ahead of the one being built the engine prefetches a message's
/// payload (requester gathers, READ responses). The payload copy out of a buffer that is
/// not in the cache waited on memory: a 64 KiB WRITE stream over 4 MiB of buffers spent
/// a tenth of the sending core in that copy. Four packets are 4 KiB ahead at IB MTU
/// 1024, far enough for memory latency and short of what the next burst evicts.
pub const PREFETCH_PKTS: u64 = 4;

/// Where an engine starts numbering its QPs: drawn from its seed, so that a process
/// that restarts (after a crash, without a DREQ) does not come back with the QPNs its
/// peers' CMs still hold in a connection; those would refuse its REQs as stale (REJ 10,
/// IBA 12.9.8.3.1) until their timewait ends. rxe's QPNs keep counting up across
/// processes for the same reason; a hardware NIC's come from a large space.
pub fn first_qpn(seed: u64) -> u32 {
    // Not drawn from the engine's generator: keys and PSNs stay as they were per seed.
    FIRST_QPN + (Rng::new(seed.rotate_left(17) ^ 0x5150_4e00).next_u32() % 0x7f_0000)
}

/// A multiplicative hasher for the QP table: QPNs are small integers, SipHash's cost
/// per lookup is not needed.
#[derive(Default)]
pub(crate) struct QpnHasher(u64);

impl Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// QPs by number, each in a box of its own: the table stays 16 bytes a slot, so a
/// lookup among a thousand QPs finds its key in a few cache lines and then touches only
/// the QP's own lines. With the QPs (about 780 bytes each) in the slots, the table of
/// 1000 QPs was 780 KB, and the key compare and the state read of every received frame
/// each missed the cache (the engine bench's `write_4k_1000qps`).
type QpMap = HashMap<u32, Box<Qp>, BuildHasherDefault<QpnHasher>>;

/// Objects with small integer handles, starting at 1.
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    fn insert_with(&mut self, f: impl FnOnce(u32) -> T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                let id = i as u32 + 1;
                self.items[i] = Some(f(id));
                id
            }
            None => {
                let id = self.items.len() as u32 + 1;
                self.items.push(Some(f(id)));
                id
            }
        }
    }
    pub fn get(&self, id: u32) -> Option<&T> {
        self.items.get((id as usize).checked_sub(1)?)?.as_ref()
    }
    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        self.items.get_mut((id as usize).checked_sub(1)?)?.as_mut()
    }
    fn remove(&mut self, id: u32) -> Option<T> {
        let i = (id as usize).checked_sub(1)?;
        let t = self.items.get_mut(i)?.take()?;
        self.free.push(i);
        Some(t)
    }
    fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

/// A protection domain.
pub(crate) struct Pd {
    users: u32,
}

/// Everything the QPs share. Separate from the QP table so a QP and the context can be
/// borrowed at once.
pub(crate) struct Ctx {
    pub cfg: DeviceConfig,
    pub gids: Vec<Gid>,
    /// The VLAN each GID's frames carry (`None`: untagged), by GID index.
    pub gid_vlans: Vec<Option<u16>>,
    pub rng: Rng,
    pub mrs: MrTable,
    pub pds: Slab<Pd>,
    pub cqs: Slab<Cq>,
    pub srqs: Slab<Srq>,
    pub counters: Counters,
    pub events: VecDeque<AsyncEvent>,
    pub neighbors: HashMap<IpAddr, [u8; 6]>,
    /// CQs that got completions since `Engine::take_touched_cqs` last ran.
    touched_cqs: Vec<u32>,
    /// Free send and receive WQEs, reused so posting and retiring move no large values.
    pub send_wqes: pool::Pool<requester::SendWqe>,
    pub recv_wqes: pool::Pool<responder::RecvWqe>,
    /// The longest round trip the device's QPs measured lately.
    pub rtt: requester::DeviceRtt,
}

impl Ctx {
    /// The IPv4 identification of the next frame: 0. Every frame has DF set, so the ID
    /// means nothing (RFC 6864 4.1), and 0 is what Linux writes for DF datagrams of an
    /// unconnected UDP socket: frames of the UDP link and of AF_XDP then carry the same
    /// header, and a UDP-link peer (which cannot see the ID it received and assumes 0)
    /// verifies our ICRC. rxe uses a per-destination counter instead; receivers, rxe
    /// included, take the ID from the header when they check the ICRC.
    pub fn next_ip_id() -> u16 {
        0
    }

    /// Queues a completion; false (and a CQ error event) if the CQ overflowed.
    pub fn post_cqe(&mut self, cq: u32, wc: Wc, solicited: bool) -> bool {
        let Some(c) = self.cqs.get_mut(cq) else {
            return false;
        };
        let was_overflowed = c.overflowed;
        if !c.push(wc, solicited) {
            if !was_overflowed {
                self.events.push_back(AsyncEvent::CqErr { cq });
            }
            return false;
        }
        if !c.touched {
            c.touched = true;
            self.touched_cqs.push(cq);
        }
        if let Some(solicited_only) = c.armed
            && (!solicited_only || solicited || wc.status != crate::verbs::WcStatus::Success)
        {
            c.armed = None;
            self.events.push_back(AsyncEvent::CompletionNotify { cq });
        }
        true
    }
}

/// A QP on its way from one engine to another (`Engine::take_qp`, `Engine::adopt_qp`).
pub struct MovedQp(Box<Qp>);

/// A software RDMA device: the verbs objects and the RoCEv2 transport.
pub struct Engine {
    ctx: Ctx,
    qps: QpMap,
    next_qpn: u32,
    /// QPs that may have a frame to send, in round-robin order.
    ready: VecDeque<u32>,
    /// The QP that sent last and how many frames it has sent in a row ([`TX_BURST`]);
    /// kept with its QPN so that a QP leaving `ready` any other way (destroyed, moved)
    /// does not shorten the next one's turn.
    burst: (u32, u32),
    timers: BinaryHeap<Reverse<(Time, u32)>>,
    now: Time,
    /// QPs whose queues or state may have changed since `take_touched_qps`.
    touched_qps: Vec<u32>,
    /// The Communication Manager on QP1.
    cm: cm::Cm,
}

impl Engine {
    pub fn new(cfg: DeviceConfig) -> Engine {
        let entries = cfg.gid_entries();
        let gids = entries.iter().map(|e| e.gid).collect();
        let gid_vlans = entries.iter().map(|e| e.vlan).collect();
        let rng = Rng::new(cfg.seed);
        let next_qpn = first_qpn(cfg.seed);
        Engine {
            ctx: Ctx {
                gids,
                gid_vlans,
                rng,
                mrs: MrTable::default(),
                pds: Slab::default(),
                cqs: Slab::default(),
                srqs: Slab::default(),
                counters: Counters::default(),
                events: VecDeque::new(),
                neighbors: HashMap::new(),
                touched_cqs: Vec::new(),
                send_wqes: pool::Pool::default(),
                recv_wqes: pool::Pool::default(),
                rtt: requester::DeviceRtt::default(),
                cfg,
            },
            qps: QpMap::default(),
            next_qpn,
            ready: VecDeque::new(),
            burst: (0, 0),
            timers: BinaryHeap::new(),
            now: Time::ZERO,
            touched_qps: Vec::new(),
            cm: cm::Cm::new(),
        }
    }

    // ----- device -----

    pub fn config(&self) -> &DeviceConfig {
        &self.ctx.cfg
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceLimits {
        self.ctx.cfg.limits
    }

    /// `ibv_query_port`.
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            active_mtu: self.ctx.cfg.port_mtu,
            max_mtu: crate::verbs::Mtu::Mtu4096,
            gid_tbl_len: self.ctx.gids.len() as u32,
            max_msg_sz: self.ctx.cfg.limits.max_msg_sz,
            state: 4,
            lid: 0,
        }
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, index: u8) -> Option<Gid> {
        self.ctx.gids.get(usize::from(index)).copied()
    }

    pub fn gid_table(&self) -> &[Gid] {
        &self.ctx.gids
    }

    /// Tells the engine the MAC of a neighbour (the runtime reads the kernel's table).
    pub fn set_neighbor(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.ctx.neighbors.insert(ip, mac);
    }

    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }

    /// The link went down (the runtime watches the port's interface): counted as rxe
    /// counts its netdev going down (`link_downed`, in rxe_port_down). QPs are left as
    /// they are: as on a NIC, their retransmit timers decide whether they outlast the
    /// outage or end with RETRY_EXC_ERR.
    pub fn link_down(&mut self) {
        self.ctx.counters.link_downed += 1;
    }

    /// The next asynchronous event (`ibv_get_async_event`, and CQ notifications).
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.events.pop_front()
    }

    // ----- PD, MR -----

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<u32, Error> {
        let max = self.ctx.cfg.limits.max_pd as usize;
        if self.ctx.pds.len() >= max {
            return Err(Error::Limit {
                what: "protection domains",
                max: max as u64,
            });
        }
        Ok(self.ctx.pds.insert_with(|_| Pd { users: 0 }))
    }

    /// `ibv_dealloc_pd`: refused while MRs or QPs use it.
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), Error> {
        let p = self.ctx.pds.get(pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: pd,
        })?;
        if p.users > 0 {
            return Err(Error::Busy {
                what: "PD",
                handle: pd,
                users: p.users,
            });
        }
        self.ctx.pds.remove(pd);
        Ok(())
    }

    fn pd_use(&mut self, pd: u32, delta: i32) -> Result<(), Error> {
        let p = self.ctx.pds.get_mut(pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: pd,
        })?;
        p.users = p.users.saturating_add_signed(delta);
        Ok(())
    }

    /// `ibv_reg_mr`: registers `len` bytes of `mem` from `offset`, at their address.
    pub fn reg_mr(
        &mut self,
        pd: u32,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, Error> {
        let iova = mem.addr().wrapping_add(offset as u64);
        self.reg_mr_iova(pd, mem, offset, len, iova, access)
    }

    /// `ibv_reg_mr_iova`: as `reg_mr`, with the address peers use chosen by the caller.
    pub fn reg_mr_iova(
        &mut self,
        pd: u32,
        mem: &Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, Error> {
        self.ctx.pds.get(pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: pd,
        })?;
        if len as u64 > self.ctx.cfg.limits.max_mr_size {
            return Err(Error::InvalidMr("longer than max_mr_size"));
        }
        let max = self.ctx.cfg.limits.max_mr as usize;
        let info = self.ctx.mrs.register(
            &mut self.ctx.rng,
            pd,
            mem.clone(),
            offset,
            len,
            iova,
            access,
            max,
        )?;
        self.pd_use(pd, 1)?;
        Ok(info)
    }

    /// Registers a region another engine of the same device registered, with the same
    /// keys (see `runtime`: one engine per queue, identical object tables).
    pub fn reg_mr_replica(
        &mut self,
        info: &MrInfo,
        mem: &Arc<Memory>,
        offset: usize,
    ) -> Result<(), Error> {
        self.ctx.pds.get(info.pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: info.pd,
        })?;
        self.ctx.mrs.register_replica(*info, mem.clone(), offset)?;
        self.pd_use(info.pd, 1)
    }

    /// `ibv_dereg_mr`. Safe while traffic for the key is in flight: later packets are
    /// refused with a remote access NAK, a READ being answered from the region keeps its
    /// memory alive until it finishes, and a posted WR that uses it fails at its next
    /// access (LOC_PROT_ERR).
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<(), Error> {
        let pd = self.ctx.mrs.deregister(lkey)?;
        self.pd_use(pd, -1)
    }

    /// `ibv_alloc_mw(pd, IBV_MW_TYPE_2)`: a memory window, bound to nothing until a
    /// BIND_MW work request binds it (through a QP, which alone may then use it).
    pub fn alloc_mw(&mut self, pd: u32) -> Result<Mw, Error> {
        self.ctx.pds.get(pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: pd,
        })?;
        let max = self.ctx.cfg.limits.max_mw as usize;
        let rkey = self.ctx.mrs.alloc_window(&mut self.ctx.rng, pd, max)?;
        self.pd_use(pd, 1)?;
        Ok(Mw {
            handle: rkey >> 8,
            rkey,
            pd,
        })
    }

    /// `ibv_dealloc_mw`: later packets with its key are refused (remote access NAK).
    pub fn dealloc_mw(&mut self, handle: u32) -> Result<(), Error> {
        let pd = self.ctx.mrs.dealloc_window(handle)?;
        self.pd_use(pd, -1)
    }

    // ----- CQ, SRQ -----

    /// `ibv_create_cq` with `depth` entries.
    pub fn create_cq(&mut self, depth: usize) -> Result<u32, Error> {
        let lim = &self.ctx.cfg.limits;
        if depth == 0 || depth > lim.max_cqe as usize {
            return Err(Error::InvalidAttribute {
                name: "cqe",
                value: depth as u64,
                reason: "must be 1..=max_cqe",
            });
        }
        if self.ctx.cqs.len() >= lim.max_cq as usize {
            return Err(Error::Limit {
                what: "CQs",
                max: u64::from(lim.max_cq),
            });
        }
        Ok(self.ctx.cqs.insert_with(|id| Cq::new(id, depth)))
    }

    /// `ibv_destroy_cq`: refused while QPs use it.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), Error> {
        let c = self.ctx.cqs.get(cq).ok_or(Error::NoSuch {
            kind: "CQ",
            handle: cq,
        })?;
        if c.users > 0 {
            return Err(Error::Busy {
                what: "CQ",
                handle: cq,
                users: c.users,
            });
        }
        self.ctx.cqs.remove(cq);
        Ok(())
    }

    /// `ibv_resize_cq`: the CQ holds `depth` completions from now on; refused below the
    /// number it holds or above `max_cqe`.
    pub fn resize_cq(&mut self, cq: u32, depth: usize) -> Result<(), Error> {
        let max = self.ctx.cfg.limits.max_cqe as usize;
        let c = self.ctx.cqs.get_mut(cq).ok_or(Error::NoSuch {
            kind: "CQ",
            handle: cq,
        })?;
        if depth == 0 || depth > max || depth < c.entries.len() {
            return Err(Error::InvalidAttribute {
                name: "cqe",
                value: depth as u64,
                reason: "must be 1..=max_cqe and hold the completions queued",
            });
        }
        c.depth = depth;
        Ok(())
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll_cq(&mut self, cq: u32, out: &mut [Wc]) -> Result<usize, Error> {
        let c = self.ctx.cqs.get_mut(cq).ok_or(Error::NoSuch {
            kind: "CQ",
            handle: cq,
        })?;
        let mut n = 0;
        while n < out.len() {
            match c.entries.pop_front() {
                Some((w, _)) => {
                    out[n] = w;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// One completion, if any.
    pub fn poll_cq_one(&mut self, cq: u32) -> Option<Wc> {
        self.ctx.cqs.get_mut(cq)?.entries.pop_front().map(|e| e.0)
    }

    /// Completions waiting on a CQ.
    pub fn cq_len(&self, cq: u32) -> usize {
        self.ctx.cqs.get(cq).map_or(0, Cq::len)
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited one) raises
    /// `AsyncEvent::CompletionNotify`.
    pub fn req_notify_cq(&mut self, cq: u32, solicited_only: bool) -> Result<(), Error> {
        let c = self.ctx.cqs.get_mut(cq).ok_or(Error::NoSuch {
            kind: "CQ",
            handle: cq,
        })?;
        c.armed = Some(solicited_only);
        Ok(())
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32) -> Result<u32, Error> {
        let lim = self.ctx.cfg.limits;
        if max_wr == 0 || max_wr > lim.max_srq_wr || max_sge > lim.max_srq_sge {
            return Err(Error::InvalidAttribute {
                name: "srq_attr",
                value: u64::from(max_wr),
                reason: "max_wr must be 1..=max_srq_wr and max_sge <= max_srq_sge",
            });
        }
        if self.ctx.srqs.len() >= lim.max_srq as usize {
            return Err(Error::Limit {
                what: "SRQs",
                max: u64::from(lim.max_srq),
            });
        }
        self.pd_use(pd, 1)?;
        Ok(self
            .ctx
            .srqs
            .insert_with(|id| Srq::new(id, pd, max_wr as usize, max_sge as usize)))
    }

    /// Arms the SRQ limit event (`ibv_modify_srq` with IBV_SRQ_LIMIT).
    pub fn modify_srq_limit(&mut self, srq: u32, limit: u32) -> Result<(), Error> {
        self.modify_srq(srq, None, Some(limit))
    }

    /// `ibv_modify_srq`: resizes the SRQ to `max_wr` WRs (IBV_SRQ_MAX_WR; never below
    /// the WRs it holds, as rxe refuses) and/or arms the limit event at `limit`
    /// (IBV_SRQ_LIMIT; 0 disarms; above `max_wr` is refused, IBA 11.2.3.3).
    pub fn modify_srq(
        &mut self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), Error> {
        let lim = self.ctx.cfg.limits.max_srq_wr;
        let s = self.ctx.srqs.get_mut(srq).ok_or(Error::NoSuch {
            kind: "SRQ",
            handle: srq,
        })?;
        let new_max = max_wr.map_or(s.max_wr, |m| m as usize);
        if new_max == 0 || new_max > lim as usize || new_max < s.queue.len() {
            return Err(Error::InvalidAttribute {
                name: "srq_attr.max_wr",
                value: new_max as u64,
                reason: "must be 1..=max_srq_wr and hold the WRs already posted",
            });
        }
        if let Some(l) = limit
            && l as usize > new_max
        {
            return Err(Error::InvalidAttribute {
                name: "srq_attr.srq_limit",
                value: u64::from(l),
                reason: "larger than the SRQ's max_wr",
            });
        }
        s.max_wr = new_max;
        if let Some(l) = limit {
            s.limit = l as usize;
        }
        Ok(())
    }

    /// `ibv_query_srq`: (max_wr, max_sge, srq_limit).
    pub fn query_srq(&self, srq: u32) -> Result<(u32, u32, u32), Error> {
        let s = self.ctx.srqs.get(srq).ok_or(Error::NoSuch {
            kind: "SRQ",
            handle: srq,
        })?;
        Ok((s.max_wr as u32, s.max_sge as u32, s.limit as u32))
    }

    /// Receive WRs QPs have taken from SRQ `srq` so far.
    pub fn srq_taken(&self, srq: u32) -> u64 {
        self.ctx.srqs.get(srq).map_or(0, |s| s.taken)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, srq: u32, wr: &RecvWr) -> Result<(), Error> {
        let s = self.ctx.srqs.get_mut(srq).ok_or(Error::NoSuch {
            kind: "SRQ",
            handle: srq,
        })?;
        if s.queue.len() >= s.max_wr {
            return Err(Error::QueueFull {
                what: "SRQ",
                owner: srq,
                depth: s.max_wr as u32,
            });
        }
        if wr.sg_list.len() > s.max_sge {
            return Err(Error::InvalidWr("more SGEs than the SRQ's max_sge"));
        }
        s.queue.push_back(*wr);
        Ok(())
    }

    /// `ibv_destroy_srq`: refused while QPs use it.
    pub fn destroy_srq(&mut self, srq: u32) -> Result<(), Error> {
        let s = self.ctx.srqs.get(srq).ok_or(Error::NoSuch {
            kind: "SRQ",
            handle: srq,
        })?;
        if s.users > 0 {
            return Err(Error::Busy {
                what: "SRQ",
                handle: srq,
                users: s.users,
            });
        }
        let pd = s.pd;
        self.ctx.srqs.remove(srq);
        self.pd_use(pd, -1)
    }

    // ----- QP -----

    /// `ibv_create_qp`. The QP starts in RESET.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<u32, Error> {
        let lim = self.ctx.cfg.limits;
        if self.qps.len() >= lim.max_qp as usize {
            return Err(Error::Limit {
                what: "QPs",
                max: u64::from(lim.max_qp),
            });
        }
        let c = init.cap;
        let bad = |name, value: u32, reason| {
            Err(Error::InvalidAttribute {
                name,
                value: u64::from(value),
                reason,
            })
        };
        if c.max_send_wr == 0 || c.max_send_wr > lim.max_qp_wr {
            return bad("cap.max_send_wr", c.max_send_wr, "must be 1..=max_qp_wr");
        }
        if c.max_recv_wr > lim.max_qp_wr {
            return bad("cap.max_recv_wr", c.max_recv_wr, "must be <= max_qp_wr");
        }
        if c.max_send_sge > lim.max_sge || c.max_recv_sge > lim.max_sge {
            return bad(
                "cap.max_*_sge",
                c.max_send_sge.max(c.max_recv_sge),
                "must be <= max_sge",
            );
        }
        if c.max_inline_data > lim.max_inline_data {
            return bad(
                "cap.max_inline_data",
                c.max_inline_data,
                "must be <= max_inline_data",
            );
        }
        self.ctx.pds.get(init.pd).ok_or(Error::NoSuch {
            kind: "PD",
            handle: init.pd,
        })?;
        for cq in [init.send_cq, init.recv_cq] {
            self.ctx.cqs.get(cq).ok_or(Error::NoSuch {
                kind: "CQ",
                handle: cq,
            })?;
        }
        if let Some(s) = init.srq {
            let srq = self.ctx.srqs.get(s).ok_or(Error::NoSuch {
                kind: "SRQ",
                handle: s,
            })?;
            if srq.pd != init.pd {
                return Err(Error::InvalidAttribute {
                    name: "srq",
                    value: u64::from(s),
                    reason: "the SRQ belongs to another PD",
                });
            }
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) {
            qpn = if qpn >= 0xff_fffe { FIRST_QPN } else { qpn + 1 };
        }
        self.next_qpn = if qpn >= 0xff_fffe { FIRST_QPN } else { qpn + 1 };
        self.qps.insert(qpn, Box::new(Qp::new(qpn, init)));
        self.pd_use(init.pd, 1)?;
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(cq) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq
            && let Some(srq) = self.ctx.srqs.get_mut(s)
        {
            srq.users += 1;
        }
        Ok(qpn)
    }

    /// `ibv_modify_qp`: checked against the transition table and the attribute values.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<(), Error> {
        let now = self.now;
        let qp = self.qps.get_mut(&qpn).ok_or(Error::NoSuch {
            kind: "QP",
            handle: qpn,
        })?;
        qp.modify(&mut self.ctx, attr, mask, now)?;
        self.schedule(qpn);
        Ok(())
    }

    /// `ibv_query_qp`: the current attributes and the creation attributes.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpType, QpState), Error> {
        let qp = self.qps.get(&qpn).ok_or(Error::NoSuch {
            kind: "QP",
            handle: qpn,
        })?;
        let mut a = qp.attr;
        a.qp_state = qp.state;
        a.cur_qp_state = qp.state;
        a.sq_draining = qp.req.draining();
        // The PSNs as they stand, not as they were set: what rxe reports
        // (rxe_qp_to_attr: resp.psn and req.psn) and hardware reads from the QP context.
        if !matches!(qp.state, QpState::Reset | QpState::Init) {
            a.rq_psn = qp.resp.epsn.value();
        }
        if !matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            a.sq_psn = qp.req.psn.value();
        }
        Ok((a, qp.qp_type, qp.state))
    }

    /// The QP's state.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// `ibv_destroy_qp`: outstanding WRs are dropped without completions.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), Error> {
        let qp = self.qps.remove(&qpn).ok_or(Error::NoSuch {
            kind: "QP",
            handle: qpn,
        })?;
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq
            && let Some(srq) = self.ctx.srqs.get_mut(s)
        {
            srq.users = srq.users.saturating_sub(1);
        }
        self.pd_use(qp.pd, -1)?;
        self.ready.retain(|q| *q != qpn);
        Ok(())
    }

    /// True when QP `qpn` lives in this engine.
    pub fn has_qp(&self, qpn: u32) -> bool {
        self.qps.contains_key(&qpn)
    }

    /// True for a frame this engine sent to itself (a QP connected to another QP of the
    /// same device, or a UD send to one of its own GIDs): the runtime hands it straight
    /// back to `handle_frame`, as rxe loops such packets back instead of sending them
    /// (`rxe_loopback`). Only the destination MAC is compared first, so the frames that
    /// leave cost one 6-byte comparison.
    pub fn is_loopback(&self, head: &[u8], tail: &[u8]) -> bool {
        if self.ctx.cfg.udp_link || head.get(..6) != Some(&self.ctx.cfg.mac[..]) {
            return false;
        }
        Frame::parse_parts(head, tail).is_ok_and(|f| self.ctx.cfg.owns_on(f.ip().dst(), vid_of(&f)))
    }

    /// The destination QP of a RoCEv2 frame that is not one of this engine's QPs (the
    /// runtime's shards hand such frames to the engine that owns the QP). `None` for
    /// frames that are this engine's to judge, unparsable ones included.
    pub fn foreign_qp(&self, head: &[u8], tail: &[u8]) -> Option<u32> {
        let f = Frame::parse_parts(head, tail).ok()?;
        let qpn = f.roce().bth().dest_qp();
        (!self.qps.contains_key(&qpn)).then_some(qpn)
    }

    /// The UDP source port the peer of an RC/UC QP sends from, once RTR's attributes are
    /// known: rxe's port is a symmetric function of both QP numbers (or of the flow
    /// label), so it is the one this QP sends from too. The runtime places the QP on the
    /// queue that port hashes to, as RSS would.
    pub fn peer_udp_sport(&self, qpn: u32, attr: &QpAttr) -> Option<u16> {
        let qp = self.qps.get(&qpn)?;
        if qp.qp_type == QpType::Ud {
            return None;
        }
        Some(qp::udp_sport(
            qp.qp_type,
            qpn,
            attr.dest_qp_num,
            attr.ah_attr.flow_label,
        ))
    }

    /// Takes QP `qpn` out of this engine to move it into another engine of the same
    /// device (`adopt_qp`), with its queues and state. The object tables (PDs, CQs, MRs)
    /// of the two must be replicas.
    pub fn take_qp(&mut self, qpn: u32) -> Option<MovedQp> {
        if self.qps.get(&qpn)?.srq.is_some() {
            return None;
        }
        let mut qp = self.qps.remove(&qpn)?;
        self.ready.retain(|q| *q != qpn);
        self.touched_qps.retain(|q| *q != qpn);
        // Off this engine's list, so off its flag too: the adopting engine's first
        // `schedule` lists it again and hands its state out (left set, it never did).
        qp.touched = false;
        qp.published = None;
        qp.in_ready = false;
        qp.timer_at = None;
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        let _ = self.pd_use(qp.pd, -1);
        Some(MovedQp(qp))
    }

    /// Adopts a QP `take_qp` took out of another engine.
    pub fn adopt_qp(&mut self, moved: MovedQp) -> Result<u32, Error> {
        let qp = moved.0;
        let qpn = qp.qpn;
        if self.qps.contains_key(&qpn) {
            return Err(Error::InvalidAttribute {
                name: "qpn",
                value: u64::from(qpn),
                reason: "already present in the engine adopting it",
            });
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            self.ctx.cqs.get_mut(cq).ok_or(Error::NoSuch {
                kind: "CQ",
                handle: cq,
            })?;
        }
        self.pd_use(qp.pd, 1)?;
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(cq) {
                c.users += 1;
            }
        }
        self.qps.insert(qpn, qp);
        self.schedule(qpn);
        Ok(qpn)
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr) -> Result<(), Error> {
        let qp = self.qps.get_mut(&qpn).ok_or(Error::NoSuch {
            kind: "QP",
            handle: qpn,
        })?;
        qp.post_send(&mut self.ctx, wr)?;
        self.schedule(qpn);
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: u32, wr: &RecvWr) -> Result<(), Error> {
        let ctx = &mut self.ctx;
        let qp = self.qps.get_mut(&qpn).ok_or(Error::NoSuch {
            kind: "QP",
            handle: qpn,
        })?;
        if qp.state == QpState::Reset {
            return Err(Error::WrongState {
                qpn,
                state: qp.state,
                why: "receive WRs can be posted from INIT on",
            });
        }
        if qp.srq.is_some() {
            return Err(Error::InvalidWr("the QP receives from an SRQ; post there"));
        }
        if qp.resp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(Error::QueueFull {
                what: "receive",
                owner: qpn,
                depth: qp.cap.max_recv_wr,
            });
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return Err(Error::InvalidWr("more SGEs than the QP's max_recv_sge"));
        }
        let w = responder::RecvWqe::new(ctx, qp.pd, wr);
        qp.resp.rq.push_back(w);
        if qp.state == QpState::Err {
            let (q, cq, srq) = (qp.qpn, qp.recv_cq, qp.srq);
            qp.resp.flush(ctx, q, cq, srq);
        }
        Ok(())
    }

    /// Receive WRs posted on a QP and not consumed yet.
    pub fn recv_queue_len(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| q.resp.rq.len())
    }

    /// Send WRs posted on a QP and not completed yet.
    pub fn send_queue_len(&self, qpn: u32) -> usize {
        self.qps.get(&qpn).map_or(0, |q| q.req.sq.len())
    }

    /// A human-readable dump of a QP's transport state, for debugging and `stats`.
    pub fn qp_debug(&self, qpn: u32) -> String {
        use std::fmt::Write;
        let Some(q) = self.qps.get(&qpn) else {
            return format!("no QP 0x{qpn:06x}");
        };
        let r = &q.req;
        let mut s = format!(
            "QP 0x{qpn:06x} {} {}: next psn {} comp_psn {} cur {} rd_out {} retry_left {} rnr_left {} timer {:?} rnr_until {:?} retrying {} window {}\n  responder: epsn {} msn {} rq {} out {}\n",
            q.qp_type,
            q.state,
            r.psn,
            r.comp_psn,
            r.cur,
            r.rd_out,
            r.retry_left,
            r.rnr_left,
            r.timer,
            r.rnr_until,
            r.retrying,
            r.window(self.config().max_inflight_psns),
            q.resp.epsn,
            q.resp.msn,
            q.resp.rq.len(),
            q.resp.has_output(),
        );
        for (i, w) in r.sq.iter().enumerate().take(40) {
            let _ = writeln!(
                s,
                "  sq[{i}] wr {} {:?} {:?} assigned {} psn {}..{} next_pkt {}/{} read_from {} holds_rd {}",
                w.wr.wr_id,
                w.wr.opcode,
                w.state,
                w.assigned,
                w.first_psn,
                w.last_psn,
                w.next_pkt,
                w.npkts,
                w.read_from,
                w.holds_rd
            );
        }
        s
    }

    /// Calls `f(qpn, state, send WQEs finished, receive WQEs finished)` for each QP whose
    /// figures changed since it was last handed out: how a threaded runtime mirrors
    /// queue occupancy and state without scanning every QP, nor touching the mirror of
    /// a QP that only took an ACK.
    pub fn take_touched_qps(&mut self, mut f: impl FnMut(u32, QpState, u64, u64)) {
        for qpn in self.touched_qps.drain(..) {
            if let Some(q) = self.qps.get_mut(&qpn) {
                q.touched = false;
                let now = (q.state, q.req.done, q.resp.done);
                if q.published != Some(now) {
                    q.published = Some(now);
                    f(qpn, now.0, now.1, now.2);
                }
            }
        }
    }

    /// Hands QP `qpn` out at the next `take_touched_qps` even if its figures did not
    /// change (the runtime refused WRs, which its mirror counts beside the engine's).
    pub fn republish_qp(&mut self, qpn: u32) {
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.published = None;
            if !q.touched {
                q.touched = true;
                self.touched_qps.push(qpn);
            }
        }
    }

    /// Calls `f(cq, completion, solicited)` for every completion queued on CQs that got
    /// some since the last call, emptying them: how a threaded runtime hands completions
    /// over (and arms its own notifications: `solicited` says whether a solicited-only
    /// waiter wakes for it).
    pub fn take_touched_cqs(&mut self, mut f: impl FnMut(u32, Wc, bool)) {
        for cq in self.ctx.touched_cqs.drain(..) {
            if let Some(c) = self.ctx.cqs.get_mut(cq) {
                c.touched = false;
                while let Some((w, s)) = c.entries.pop_front() {
                    f(cq, w, s);
                }
            }
        }
    }

    /// Number of QPs.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    // ----- I/O -----

    /// Puts a QP on the transmit queue if it may have a frame to send, and its deadline
    /// in the timer heap if that moved earlier.
    fn schedule(&mut self, qpn: u32) {
        let now = self.now;
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !qp.touched {
            qp.touched = true;
            self.touched_qps.push(qpn);
        }
        if !qp.in_ready && qp.wants_tx(now) {
            qp.in_ready = true;
            self.ready.push_back(qpn);
        }
        if let Some(d) = qp.deadline()
            && qp.timer_at.is_none_or(|t| d < t)
        {
            qp.timer_at = Some(d);
            self.timers.push(Reverse((d, qpn)));
        }
    }

    /// The receive path. Checks, in order: Ethernet/IP/UDP/BTH structure (the wire
    /// layer), destination MAC and IP ours, P_Key, the QP exists, IPv4/UDP checksums and
    /// ICRC, its type matches the opcode's transport, and a connected QP's path matches
    /// the packet's addresses. Then requests go to the responder, responses to the
    /// completer. Every drop is counted by reason.
    pub fn handle_frame(&mut self, now: Time, frame: &[u8]) {
        self.handle_parsed(now, Frame::parse(frame));
    }

    /// [`Self::handle_frame`] for a frame that arrived in two pieces, `head` then `tail`
    /// (AF_XDP chains a frame larger than one UMEM buffer). It is checked and its payload
    /// placed where it lies, so the payload is copied once, buffers to registered memory.
    #[inline(always)]
    pub fn handle_frame_parts(&mut self, now: Time, head: &[u8], tail: &[u8]) {
        if tail.is_empty() {
            // The common case keeps the whole-frame parser, which knows there is no tail.
            self.handle_frame(now, head);
        } else {
            self.handle_chained(now, head, tail);
        }
    }

    #[inline(never)]
    fn handle_chained(&mut self, now: Time, head: &[u8], tail: &[u8]) {
        self.handle_parsed(now, Frame::parse_parts(head, tail));
    }

    /// The receive path after parsing (inlined into both entries, so that a frame in
    /// one piece pays nothing for the other kind).
    #[inline(always)]
    fn handle_parsed(&mut self, now: Time, parsed: crate::wire::Result<Frame<'_>>) {
        self.now = self.now.max(now);
        let c = &mut self.ctx.counters;
        let f = match parsed {
            Ok(f) => f,
            Err(e) => {
                if e.is_not_roce() {
                    c.drop_not_roce += 1;
                } else {
                    c.drop_malformed += 1;
                }
                return;
            }
        };
        let dst_mac = f.eth().dst;
        if dst_mac != self.ctx.cfg.mac || !self.ctx.cfg.owns_on(f.ip().dst(), vid_of(&f)) {
            c.drop_not_for_us += 1;
            return;
        }
        // The cheap checks first: P_Key and destination QP are header fields, the ICRC
        // a pass over the whole frame. A flood aimed at QPs that do not exist (or at
        // another partition) costs a lookup per frame, not a CRC (a corrupted QPN is
        // then counted as an unknown QP rather than a bad ICRC).
        let r = f.roce();
        let bth = r.bth();
        // Only the default partition exists: accept 0xffff and 0x7fff.
        if bth.pkey() & 0x7fff != 0x7fff {
            c.drop_bad_pkey += 1;
            return;
        }
        let qpn = bth.dest_qp();
        if qpn != cm::GSI_QPN && !self.qps.contains_key(&qpn) {
            c.drop_unknown_qp += 1;
            return;
        }
        match f.verify() {
            Ok(()) => {}
            Err(crate::wire::Error::BadIcrc { .. }) => {
                c.drop_bad_icrc += 1;
                return;
            }
            Err(_) => {
                c.drop_bad_checksum += 1;
                return;
            }
        }
        c.rcvd_pkts += 1;
        if qpn == cm::GSI_QPN {
            self.cm.handle_frame(&mut self.ctx, now, &f);
            return;
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        let info = r.info();
        if info.transport != qp.qp_type.transport() {
            c.drop_wrong_transport += 1;
            return;
        }
        if qp.qp_type != QpType::Ud
            && let Some(p) = &qp.path
            && (p.dst_ip != f.ip().src() || p.src_ip != f.ip().dst())
        {
            c.drop_wrong_path += 1;
            return;
        }
        if info.request {
            let was_est = qp.comm_est;
            qp.handle_request(&mut self.ctx, now, &f);
            if qp.comm_est && !was_est {
                self.cm.comm_est(qpn);
            }
        } else {
            qp.handle_response(&mut self.ctx, now, &f);
        }
        self.schedule(qpn);
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.now = self.now.max(now);
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
        }
        while let Some(Reverse((t, qpn))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if qp.timer_at == Some(t) {
                qp.timer_at = None;
            }
            if qp.deadline().is_some_and(|d| d <= now) {
                qp.handle_timer(&mut self.ctx, now);
            }
            self.schedule(qpn);
        }
    }

    /// Writes the next frame to send into `buf` (at least 9018 bytes is always enough);
    /// its length, or `None` when nothing is ready.
    #[inline]
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        self.poll_transmit_parts(now, buf, &mut [])
    }

    /// [`Self::poll_transmit`] into two pieces, `head` then `tail`, as a link that chains
    /// a frame over two buffers sends it: a frame longer than `head` continues in `tail`,
    /// its payload copied straight from registered memory into both. `head` must hold
    /// every frame without payload (a few hundred bytes: CM MADs, ACKs) and the headers
    /// of the rest.
    pub fn poll_transmit_parts(
        &mut self,
        now: Time,
        head: &mut [u8],
        tail: &mut [u8],
    ) -> Option<usize> {
        self.now = self.now.max(now);
        if self.cm.wants_transmit()
            && let Some(n) = self.cm.poll_transmit(&mut self.ctx, head)
        {
            return Some(n);
        }
        let mut buf = PiecesMut {
            first: head,
            rest: tail,
        };
        while let Some(qpn) = self.ready.pop_front() {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            qp.in_ready = false;
            let n = qp
                .next_response(&mut self.ctx, &mut buf)
                .or_else(|| qp.next_request(&mut self.ctx, now, &mut buf));
            if n.is_some() && qp.wants_tx(now) {
                qp.in_ready = true;
                let run = if self.burst.0 == qpn { self.burst.1 } else { 0 } + 1;
                if run < TX_BURST {
                    self.burst = (qpn, run);
                    self.ready.push_front(qpn);
                } else {
                    self.burst = (qpn, 0);
                    self.ready.push_back(qpn);
                }
            } else {
                self.burst = (qpn, 0);
            }
            if let Some(d) = qp.deadline()
                && qp.timer_at.is_none_or(|t| d < t)
            {
                qp.timer_at = Some(d);
                self.timers.push(Reverse((d, qpn)));
            }
            if n.is_some() {
                return n;
            }
        }
        None
    }

    /// True while some QP may have a frame to send: after `poll_transmit` was stopped
    /// by the link (its transmit ring full), the driver must come back soon rather than
    /// wait for a frame or a timer.
    pub fn wants_transmit(&self) -> bool {
        !self.ready.is_empty() || self.cm.wants_transmit()
    }

    /// The next time `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        let qps = self.timers.peek().map(|r| r.0.0);
        match (qps, self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ----- the Communication Manager (QP1) -----

    /// Takes REQs and SIDR_REQs for `service_id` ([`cm::Cm::listen`]).
    pub fn cm_listen(&mut self, service_id: u64) -> Result<(), Error> {
        let now = self.now;
        self.cm.listen(&mut self.ctx, now, service_id)
    }

    pub fn cm_unlisten(&mut self, service_id: u64) {
        self.cm.unlisten(service_id)
    }

    /// Sends a REQ for `p.qpn` ([`cm::Cm::connect`]).
    pub fn cm_connect(&mut self, p: &cm::ConnectParams) -> Result<u32, Error> {
        let now = self.now;
        self.cm.connect(&mut self.ctx, now, p)
    }

    /// Answers a connect request with a REP.
    pub fn cm_accept(&mut self, id: u32, p: &cm::AcceptParams) -> Result<(), Error> {
        let now = self.now;
        self.cm.accept(&self.ctx, now, id, p)
    }

    pub fn cm_reject(&mut self, id: u32, reason: u16, private_data: &[u8]) -> Result<(), Error> {
        self.cm.reject(id, reason, private_data)
    }

    /// Active side, QP in RTS: sends the RTU.
    pub fn cm_establish(&mut self, id: u32, private_data: &[u8]) -> Result<(), Error> {
        self.cm.establish(id, private_data)
    }

    pub fn cm_disconnect(&mut self, id: u32, private_data: &[u8]) -> Result<(), Error> {
        let now = self.now;
        self.cm.disconnect(&mut self.ctx, now, id, private_data)
    }

    /// The consumer is done with `id`.
    pub fn cm_destroy(&mut self, id: u32) {
        let now = self.now;
        self.cm.destroy(&mut self.ctx, now, id)
    }

    pub fn cm_sidr_request(&mut self, p: &cm::SidrParams) -> Result<u32, Error> {
        let now = self.now;
        self.cm.sidr_request(&mut self.ctx, now, p)
    }

    pub fn cm_sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), Error> {
        self.cm.sidr_reply(id, status, qpn, qkey, private_data)
    }

    /// Disconnects every CM connection, reporting nothing ([`cm::Cm::close_all`]).
    pub fn cm_close_all(&mut self) {
        let now = self.now;
        self.cm.close_all(&mut self.ctx, now)
    }

    /// How many connections the CM keeps (timewait included).
    pub fn cm_connections(&self) -> usize {
        self.cm.connections()
    }

    /// True while a CM exchange is under way (a connection forming or closing).
    pub fn cm_settling(&self) -> bool {
        self.cm.settling()
    }

    /// True while CM events wait for `poll_cm_event`.
    pub fn has_cm_events(&self) -> bool {
        self.cm.has_events()
    }

    /// The next CM event.
    pub fn poll_cm_event(&mut self) -> Option<cm::CmEvent> {
        self.cm.poll_event()
    }

    pub fn cm_counters(&self) -> &cm::CmCounters {
        &self.cm.counters
    }
}

impl Node for Engine {
    fn handle_frame(&mut self, now: Time, frame: &[u8]) {
        Engine::handle_frame(self, now, frame)
    }
    fn handle_frame_parts(&mut self, now: Time, head: &[u8], tail: &[u8]) {
        Engine::handle_frame_parts(self, now, head, tail)
    }
    fn handle_timeout(&mut self, now: Time) {
        Engine::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        Engine::poll_transmit_parts(self, now, buf, &mut [])
    }
    fn poll_transmit_parts(
        &mut self,
        now: Time,
        head: &mut [u8],
        tail: &mut [u8],
    ) -> Option<usize> {
        Engine::poll_transmit_parts(self, now, head, tail)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Engine::poll_timeout(self)
    }
}

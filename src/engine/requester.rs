//! The requester: turns the send queue into request packets (rxe's `rxe_req.c`).
//!
//! Each send WQE gets its PSNs when it first goes out: one per packet of a SEND or
//! WRITE (segmented by path MTU), one per expected response packet of a READ, one for an
//! atomic. A retry rewinds the queue to the first unacknowledged PSN and sends the same
//! packets again (go-back-N, IBA 9.7.4). The send queue is shared with the completer,
//! which retires WQEs in order as responses arrive.

use super::Ctx;
use super::mem::{AccessError, MrTable, Segs};
use super::pool::Recycle;
use super::qp::Qp;
use crate::time::Time;
use crate::verbs::wr::InlineData;
use crate::verbs::{
    MwBind, QpAttr, QpState, QpType, SendFlags, SendWr, UdDest, Wc, WcFlags, WcStatus, WrOpcode,
};
use crate::wire::PiecesMut;
use crate::wire::{
    AtomicEthRepr, BthRepr, DethRepr, ExtRepr, IethRepr, ImmDtRepr, Opcode, Operation, Position,
    Psn, RethRepr, Transport,
};
use std::collections::VecDeque;

/// Where a send WQE is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Has packets left to send (all of them, if no PSN was assigned yet).
    Sending,
    /// Every packet sent; waiting for the acknowledgement or the response data.
    Sent,
    /// Finished with this status; retired (and completed) in queue order.
    Done(WcStatus),
}

/// A posted send work request and its progress. Queued boxed and recycled through
/// [`Pool`]: it is written once, in place, when posted. `repr(C)` with its progress
/// first, then the WR's scalars, then the resolved buffers: the requester looks at the
/// head of a WQE it did not touch for a while (a deep queue does not stay in cache), and
/// a one-SGE WR then touches its first 192 bytes and no others (the list's unused
/// entries are never read or written; a WR with inline data, a UD destination or a bind
/// also reads the out-of-line part).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct SendWqe {
    pub state: WqeState,
    pub assigned: bool,
    /// Holds one of the `max_rd_atomic` slots.
    pub holds_rd: bool,
    pub signaled: bool,
    /// `extra` holds this WR's inline data, UD destination or bind (else it is stale).
    has_extra: bool,
    pub first_psn: Psn,
    pub last_psn: Psn,
    /// Packets (PSNs) of the message.
    pub npkts: u32,
    /// Index of the next packet to send.
    pub next_pkt: u32,
    /// Highest packet index sent so far, to count retransmissions.
    pub sent_hi: u32,
    /// For a READ: the PSN index the (re-)request starts at.
    pub read_from: u32,
    pub length: u64,
    /// For a READ: the position of the last response accepted for the current request.
    pub read_pos: Option<Position>,
    /// Why the local buffers could not be resolved at post time, reported when reached.
    pub seg_err: Option<AccessError>,
    pub wr: WqeWr,
    /// Allocated the first time this (pooled) WQE carries a WR that needs it, then kept:
    /// the inline buffer alone is `MAX_INLINE` bytes, which most WRs never use; out of
    /// line, they cost a posted WR no cache lines.
    extra: Option<Box<WrExtra>>,
    pub segs: Segs,
}

/// A posted WR's scalars (`SendWr` without its lists: the SGEs are resolved into
/// `SendWqe::segs`, the rest is in [`WrExtra`]).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct WqeWr {
    pub wr_id: u64,
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub opcode: WrOpcode,
    pub send_flags: SendFlags,
    pub imm_data: u32,
    pub invalidate_rkey: u32,
    pub rkey: u32,
}

impl WqeWr {
    fn of(wr: &SendWr) -> WqeWr {
        WqeWr {
            wr_id: wr.wr_id,
            remote_addr: wr.remote_addr,
            compare_add: wr.compare_add,
            swap: wr.swap,
            opcode: wr.opcode,
            send_flags: wr.send_flags,
            imm_data: wr.imm_data,
            invalidate_rkey: wr.invalidate_rkey,
            rkey: wr.rkey,
        }
    }

    /// True when `wr` needs [`WrExtra`]: inline data it sends, a UD destination or a
    /// window to bind.
    fn needs_extra(wr: &SendWr) -> bool {
        (wr.inline.is_some() && wr.send_flags.contains(SendFlags::INLINE))
            || wr.ud.is_some()
            || wr.bind.is_some()
    }
}

/// The parts of a send WR that few WRs have.
#[derive(Debug, Default)]
struct WrExtra {
    inline: Option<InlineData>,
    ud: Option<UdDest>,
    bind: Option<MwBind>,
}

// A one-SGE WR without inline data is read from the first 192 bytes of its WQE: the
// progress fields, the WR's scalars, the resolved list's count and its first entry
// (three cache lines when the box is 64-byte aligned, four at most). Checked when
// building: a reordering that spreads them out costs every posted WR more cache misses
// once a queue is cold.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(SendWqe, state) == 0);
    assert!(offset_of!(SendWqe, wr) < offset_of!(SendWqe, segs));
    assert!(offset_of!(SendWqe, extra) < offset_of!(SendWqe, segs));
    assert!(offset_of!(SendWqe, segs) + Segs::FIRST_ENTRY_END <= 192);
};

impl Default for SendWqe {
    fn default() -> Self {
        SendWqe {
            wr: WqeWr::of(&SendWr::send(0, &[])),
            has_extra: false,
            extra: None,
            segs: Segs::default(),
            seg_err: None,
            state: WqeState::Sending,
            assigned: false,
            first_psn: Psn::default(),
            last_psn: Psn::default(),
            npkts: 0,
            next_pkt: 0,
            sent_hi: 0,
            read_from: 0,
            read_pos: None,
            holds_rd: false,
            signaled: false,
            length: 0,
        }
    }
}

impl Recycle for SendWqe {
    /// Empties its buffer list and puts its progress back to that of a new WQE (as
    /// `Default` makes it), so `post_send` fills in only what comes from the WR. The
    /// extra part stays allocated (its contents are plain data).
    fn recycle(&mut self) {
        self.segs.clear();
        self.seg_err = None;
        self.state = WqeState::Sending;
        self.assigned = false;
        self.has_extra = false;
        self.first_psn = Psn::default();
        self.last_psn = Psn::default();
        self.npkts = 0;
        self.next_pkt = 0;
        self.sent_hi = 0;
        self.read_from = 0;
        self.read_pos = None;
        self.holds_rd = false;
    }
}

impl SendWqe {
    /// Fills this recycled WQE's WR part from `wr`.
    fn assign(&mut self, wr: &SendWr) {
        self.wr = WqeWr::of(wr);
        self.has_extra = WqeWr::needs_extra(wr);
        if self.has_extra {
            // At most once per pooled WQE: recycling keeps the box.
            let e = self.extra.get_or_insert_with(Box::default);
            match (&mut e.inline, &wr.inline) {
                (Some(d), Some(x)) => d.assign(x),
                (d, x) => *d = *x,
            }
            e.ud = wr.ud;
            e.bind = wr.bind;
        }
    }

    fn extra(&self) -> Option<&WrExtra> {
        if self.has_extra {
            self.extra.as_deref()
        } else {
            None
        }
    }

    /// The UD destination of the WR.
    fn ud(&self) -> Option<UdDest> {
        self.extra().and_then(|e| e.ud)
    }

    /// What a BIND_MW WR binds.
    fn bind(&self) -> Option<MwBind> {
        self.extra().and_then(|e| e.bind)
    }

    /// The inline data of an `IBV_SEND_INLINE` WR, which is the message itself.
    fn inline(&self) -> Option<&[u8]> {
        if self.wr.send_flags.contains(SendFlags::INLINE) {
            self.extra()
                .and_then(|e| e.inline.as_ref())
                .map(|d| d.as_slice())
        } else {
            None
        }
    }

    /// Copies message bytes `off..off + dst.len()` into `dst`, piece by piece (a frame
    /// chained over two buffers has its payload in both).
    #[inline(always)]
    fn gather(&self, mrs: &MrTable, off: u64, dst: &mut PiecesMut<'_>) -> Result<(), AccessError> {
        self.gather_one(mrs, off, dst.first)?;
        if dst.rest.is_empty() {
            return Ok(());
        }
        self.gather_one(mrs, off + dst.first.len() as u64, dst.rest)
    }

    /// Copies message bytes `off..off + dst.len()` into `dst`. Nothing to copy (a packet
    /// without payload, wherever `off` is) is no access and cannot fail.
    fn gather_one(&self, mrs: &MrTable, off: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        match self.inline() {
            Some(d) => {
                dst.copy_from_slice(inline_range(d, off, dst.len())?);
                Ok(())
            }
            None => self.segs.gather(mrs, off, dst),
        }
    }

    /// Warms the cache for message bytes `off..off + len` (nothing for inline data,
    /// which sits in the WQE).
    fn prefetch(&self, mrs: &MrTable, off: u64, len: usize) {
        if self.inline().is_none() {
            self.segs.prefetch(mrs, off, len);
        }
    }
}

fn inline_range(d: &[u8], off: u64, len: usize) -> Result<&[u8], AccessError> {
    let o = usize::try_from(off).map_err(|_| AccessError::Range)?;
    o.checked_add(len)
        .and_then(|e| d.get(o..e))
        .ok_or(AccessError::Range)
}

/// The send queue and the requester/completer state.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    pub sq: VecDeque<Box<SendWqe>>,
    /// Offset from the front of the first WQE with packets left to send.
    pub cur: usize,
    /// The next PSN to assign.
    pub psn: Psn,
    /// The oldest PSN not yet acknowledged.
    pub comp_psn: Psn,
    /// READs and atomics outstanding.
    pub rd_out: u32,
    /// Packets sent since the last AckReq.
    pub noack: u32,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// Retransmit deadline (RC).
    pub timer: Option<Time>,
    /// Waiting out an RNR NAK until then.
    pub rnr_until: Option<Time>,
    /// A retry is under way; further NAKs of the same episode are ignored (as rxe).
    pub retrying: bool,
    /// The round trip measured on acknowledged packets (RFC 6298's smoothed mean and
    /// mean deviation, ns; 0 before the first sample).
    pub srtt: u64,
    pub rttvar: u64,
    /// The longest recent round trip (each sample takes 1/16 off it first): a host
    /// whose threads wait for a core now and then sees long ones that the mean and
    /// deviation smooth away, and a timer shorter than them would retransmit what is
    /// only late.
    pub rtt_max: u64,
    /// The packet being timed: its PSN and when it first left (one at a time, never a
    /// retransmitted one: Karn's rule).
    pub probe: Option<(Psn, Time)>,
    /// Retransmit deadline from the measured round trip, well before the QP's own
    /// timeout; it retransmits without using up `retry_cnt` (only the QP's timer,
    /// `timer`, counts as the spec's timeout).
    pub fast_timer: Option<Time>,
    /// Consecutive `fast_timer` expiries without progress (each doubles the next).
    pub fast_backoff: u32,
    /// When the last RC packet left.
    pub last_sent: Time,
    /// Set when the round-trip timer went back N: when the last packet before it had
    /// left; cleared when a packet is sent again. Progress while it is set answers what
    /// was sent before, which was late, not lost (see `progress` in completer.rs).
    pub fast_fired: Option<Time>,
    /// The congestion window (RC, PSNs; 0 until the first loss: the device's
    /// `max_inflight_psns`). See [`Requester::window`].
    pub cwnd: u32,
    /// PSNs acknowledged since `cwnd` last grew.
    pub cwnd_acked: u32,
    /// The loss episode under way: `psn` when it began. Losses until `comp_psn` passes
    /// it are the same episode's and do not shrink the window again.
    pub recover: Option<Psn>,
    draining: bool,
    drain_notified: bool,
    /// WQEs that left the send queue (completed or flushed), ever.
    pub done: u64,
}

impl Requester {
    pub fn set_psn(&mut self, psn: u32) {
        self.psn = Psn::new(psn);
        self.comp_psn = self.psn;
        // A new PSN space: no loss episode of the old one carries over.
        self.cwnd = 0;
        self.cwnd_acked = 0;
        self.recover = None;
    }

    pub fn reset_retries(&mut self, a: &QpAttr) {
        self.retry_left = a.retry_cnt;
        self.rnr_left = a.rnr_retry;
    }

    pub fn start_drain(&mut self) {
        self.draining = true;
        self.drain_notified = false;
    }

    pub fn end_drain(&mut self) {
        self.draining = false;
    }

    /// True while in SQD with WQEs still outstanding.
    pub fn draining(&self) -> bool {
        self.draining
            && self
                .sq
                .iter()
                .any(|w| w.assigned && !matches!(w.state, WqeState::Done(_)))
    }

    pub fn deadline(&self) -> Option<Time> {
        // Pairwise, not `[..].into_iter().flatten().min()`: that builds the array on
        // the stack and reads it back in wider loads than it wrote, a store-forwarding
        // stall that cost 5-6% of the engine-alone benchmark (perf annotate).
        let earliest = |a: Option<Time>, b: Option<Time>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        earliest(earliest(self.timer, self.rnr_until), self.fast_timer)
    }

    /// Takes one round-trip sample (RFC 6298 2.2 and 2.3).
    pub fn sample_rtt(&mut self, ns: u64) {
        self.rtt_max = (self.rtt_max - self.rtt_max / 16).max(ns);
        if self.srtt == 0 {
            self.srtt = ns.max(1);
            self.rttvar = ns / 2;
        } else {
            self.rttvar = (3 * self.rttvar + self.srtt.abs_diff(ns)) / 4;
            self.srtt = ((7 * self.srtt + ns) / 8).max(1);
        }
    }

    /// The retransmit timeout the measured round trip gives (srtt + 4 rttvar, or four
    /// times the longest recent round trip, at least [`FAST_RTO_MIN_NS`], doubled per expiry
    /// without progress); `None` before a round trip was measured, for a QP without a
    /// timeout, or once it would not come before the QP's own timer.
    /// `device_max` is the longest round trip any QP of the device measured lately
    /// ([`DeviceRtt`]).
    pub fn fast_rto(&self, a: &QpAttr, device_max: u64) -> Option<u64> {
        if a.timeout == 0 || self.srtt == 0 {
            return None;
        }
        let rto = (self.srtt + 4 * self.rttvar)
            .max(4 * self.rtt_max.max(device_max))
            .max(FAST_RTO_MIN_NS)
            << self.fast_backoff.min(16);
        (rto < timeout_ns(a.timeout)).then_some(rto)
    }

    /// (Re)starts the round-trip retransmit timer while packets are outstanding.
    pub fn arm_fast(&mut self, now: Time, a: &QpAttr, device_max: u64) {
        self.fast_timer = if self.inflight() > 0 {
            self.fast_rto(a, device_max).map(|d| now.add_nanos(d))
        } else {
            None
        };
    }

    /// True when some WQE has packets to send and nothing blocks them.
    pub fn has_work(&self, qp: &Qp, now: Time) -> bool {
        if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
            return false;
        }
        if self.rnr_until.is_some_and(|t| t > now) {
            return false;
        }
        self.sq.get(self.cur).is_some()
    }

    /// How many PSNs may be in flight unacknowledged (RC): `max` (the device's
    /// `max_inflight_psns`) until a loss, then halved at each loss episode (down to
    /// [`MIN_CWND`]) and grown back by one per window acknowledged, as TCP's Reno does.
    /// A go-back-N sends again everything after the lost packet that left before the
    /// NAK came back, and the queues a full window fills on the way make that round
    /// trip long: `bench loss`, 64 KiB WRITEs at 2% loss each way, resent 46 packets per
    /// NAK with a fixed window of 128 and 20 with one of 32 (goodput 0.39-0.43 of
    /// lossless against 0.48-0.58), while a lossless stream needs the whole window on
    /// links with a long round trip (two TCG VMs).
    pub fn window(&self, max: u32) -> u32 {
        let max = max.max(1);
        if self.cwnd == 0 {
            max
        } else {
            self.cwnd.min(max)
        }
    }

    /// A loss (a sequence NAK, a timer): the window halves, once per episode.
    pub fn on_loss(&mut self, max: u32) {
        if self.recover.is_some() {
            return;
        }
        let w = self.window(max);
        self.cwnd = (w / 2).max(MIN_CWND.min(max.max(1)));
        self.cwnd_acked = 0;
        self.recover = Some(self.psn);
    }

    /// `acked` more PSNs were acknowledged, up to `comp_psn`: the episode ends once
    /// everything outstanding at its start is; outside one, the window grows.
    pub fn on_acked(&mut self, acked: u32, max: u32) {
        if let Some(r) = self.recover {
            if self.comp_psn.is_before(r) {
                return;
            }
            self.recover = None;
        }
        if self.cwnd == 0 {
            return;
        }
        let max = max.max(1);
        self.cwnd_acked = self.cwnd_acked.saturating_add(acked);
        while self.cwnd < max && self.cwnd_acked >= self.cwnd {
            self.cwnd_acked -= self.cwnd;
            self.cwnd += 1;
        }
        if self.cwnd >= max {
            self.cwnd = 0;
            self.cwnd_acked = 0;
        }
    }

    /// PSNs in flight unacknowledged.
    pub fn inflight(&self) -> u32 {
        self.psn.forward_from(self.comp_psn)
    }

    /// Completes every remaining WQE with WR_FLUSH_ERR (the QP went to ERR or SQE).
    pub fn flush(&mut self, ctx: &mut Ctx, qpn: u32, cq: u32) {
        while let Some(w) = self.sq.pop_front() {
            self.done += 1;
            let status = match w.state {
                WqeState::Done(s) => s,
                _ => WcStatus::WrFlushErr,
            };
            let mut wc = Wc::new(qpn, w.wr.wr_id, w.wr.opcode.wc_opcode(), status);
            if status == WcStatus::Success {
                wc.byte_len = w.length as u32;
            }
            if is_send(w.wr.opcode) {
                ctx.counters.rdma_sends += 1;
            }
            if status != WcStatus::Success || w.signaled {
                ctx.post_cqe(cq, wc, false);
            }
            ctx.send_wqes.give(w);
        }
        self.cur = 0;
        self.rd_out = 0;
        self.timer = None;
        self.rnr_until = None;
        self.retrying = false;
    }
}

/// The checks `ibv_post_send` makes on a WR before queueing it: SGE count, inline data,
/// message size, opcode allowed on the QP type, atomics' result buffer, UD destination.
/// Shared by the engine and the threaded runtime, which checks before ringing the
/// doorbell so that errors come back from the call, as in ibverbs.
pub fn validate_send_wr(
    qp_type: QpType,
    cap: &crate::verbs::QpCap,
    max_msg_sz: u32,
    wr: &SendWr,
) -> Result<(), crate::verbs::Error> {
    use crate::verbs::Error;
    let inline = wr.send_flags.contains(SendFlags::INLINE);
    if !inline && wr.sg_list.len() > cap.max_send_sge as usize {
        return Err(Error::InvalidWr("more SGEs than the QP's max_send_sge"));
    }
    if inline {
        let d = wr
            .inline
            .ok_or(Error::InvalidWr("INLINE set but no inline data"))?;
        if d.as_slice().len() > cap.max_inline_data as usize {
            return Err(Error::InvalidWr(
                "inline data longer than the QP's max_inline_data",
            ));
        }
        if !matches!(
            wr.opcode,
            WrOpcode::Send
                | WrOpcode::SendWithImm
                | WrOpcode::SendWithInv
                | WrOpcode::RdmaWrite
                | WrOpcode::RdmaWriteWithImm
        ) {
            return Err(Error::InvalidWr("inline data is only for SEND and WRITE"));
        }
    }
    let length = wr.length();
    if length > u64::from(max_msg_sz) {
        return Err(Error::InvalidWr("message longer than max_msg_sz"));
    }
    let ud = qp_type == QpType::Ud;
    match wr.opcode {
        WrOpcode::Send | WrOpcode::SendWithImm => {}
        WrOpcode::SendWithInv
        | WrOpcode::RdmaRead
        | WrOpcode::AtomicCmpAndSwp
        | WrOpcode::AtomicFetchAndAdd
            if qp_type != QpType::Rc =>
        {
            return Err(Error::InvalidWr("this opcode needs an RC QP"));
        }
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm if ud => {
            return Err(Error::InvalidWr("RDMA WRITE needs a connected QP"));
        }
        WrOpcode::LocalInv if ud => {
            return Err(Error::InvalidWr("LOCAL_INV needs a connected QP"));
        }
        WrOpcode::BindMw if ud => {
            return Err(Error::InvalidWr("BIND_MW needs a connected QP"));
        }
        WrOpcode::BindMw if wr.bind.is_none() => {
            return Err(Error::InvalidWr("a BIND_MW needs wr.bind"));
        }
        _ => {}
    }
    // A misaligned remote_addr is not refused here: the responder answers it with an
    // invalid request NAK (IBA 9.4.5), as a real NIC's peer would.
    if wr.opcode.is_atomic() && (length != 8 || wr.sg_list.len() != 1) {
        return Err(Error::InvalidWr(
            "an atomic needs one 8-byte SGE for its result",
        ));
    }
    if ud && wr.ud.is_none() {
        return Err(Error::InvalidWr(
            "a UD send needs wr.ud (address and remote QPN)",
        ));
    }
    Ok(())
}

fn is_send(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv
    )
}

/// The wire operation of a send WR.
fn operation(op: WrOpcode) -> Operation {
    match op {
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => Operation::Send,
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => Operation::Write,
        WrOpcode::RdmaRead => Operation::ReadRequest,
        WrOpcode::AtomicCmpAndSwp => Operation::CompareSwap,
        WrOpcode::AtomicFetchAndAdd => Operation::FetchAdd,
        WrOpcode::LocalInv | WrOpcode::BindMw => Operation::Send,
    }
}

fn position(i: u32, n: u32) -> Position {
    match (i == 0, i + 1 == n) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

impl Qp {
    /// Validates and queues a send WR (`ibv_post_send`).
    pub(crate) fn post_send(
        &mut self,
        ctx: &mut Ctx,
        wr: &SendWr,
    ) -> Result<(), crate::verbs::Error> {
        use crate::verbs::Error;
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(Error::WrongState {
                    qpn: self.qpn,
                    state: self.state,
                    why: "send WRs can be posted from RTS on",
                });
            }
            _ => {}
        }
        if self.req.sq.len() >= self.cap.max_send_wr as usize {
            return Err(Error::QueueFull {
                what: "send",
                owner: self.qpn,
                depth: self.cap.max_send_wr,
            });
        }
        validate_send_wr(self.qp_type, &self.cap, ctx.cfg.limits.max_msg_sz, wr)?;
        let inline = wr.send_flags.contains(SendFlags::INLINE);
        let length = wr.length();
        let write_local = wr.opcode == WrOpcode::RdmaRead || wr.opcode.is_atomic();
        // New or recycled: empty segments, no progress (`Recycle`).
        let mut w = ctx.send_wqes.take();
        if !inline {
            w.seg_err = w
                .segs
                .resolve_into(&ctx.mrs, self.pd, &wr.sg_list, write_local)
                .err();
        }
        w.assign(wr);
        w.signaled = self.sq_sig_all || wr.send_flags.contains(SendFlags::SIGNALED);
        w.length = length;
        self.req.sq.push_back(w);
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            self.req.flush(ctx, self.qpn, self.send_cq);
        }
        Ok(())
    }

    /// Retires finished WQEs from the front of the send queue, in order, completing them.
    pub(crate) fn retire_send(&mut self, ctx: &mut Ctx, now: Time) {
        let mut failed = false;
        while let Some(w) = self.req.sq.front() {
            let WqeState::Done(status) = w.state else {
                break;
            };
            let w = self.req.sq.pop_front().unwrap_or_else(|| unreachable!());
            self.req.done += 1;
            self.req.cur = self.req.cur.saturating_sub(1);
            if is_send(w.wr.opcode) {
                ctx.counters.rdma_sends += 1;
            }
            if status != WcStatus::Success || w.signaled {
                let mut wc = Wc::new(self.qpn, w.wr.wr_id, w.wr.opcode.wc_opcode(), status);
                if status == WcStatus::Success {
                    wc.byte_len = w.length as u32;
                    if matches!(
                        w.wr.opcode,
                        WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                    ) {
                        wc.wc_flags = WcFlags::WITH_IMM;
                        wc.imm_data = w.wr.imm_data;
                    }
                }
                if !ctx.post_cqe(self.send_cq, wc, false) {
                    failed = true;
                }
            }
            if status != WcStatus::Success {
                failed = true;
            }
            ctx.send_wqes.give(w);
        }
        if failed {
            self.fatal(ctx, now, true);
        }
        if self.req.draining
            && !self.req.drain_notified
            && !self.req.draining()
            && self.state == QpState::Sqd
        {
            self.req.drain_notified = true;
            if self.attr.en_sqd_async_notify {
                ctx.events
                    .push_back(crate::verbs::AsyncEvent::SqDrained { qpn: self.qpn });
            }
        }
        if self.req.sq.is_empty() {
            self.req.timer = None;
            self.req.fast_timer = None;
        }
    }

    /// Finishes the WQE at `idx` with an error raised while sending it.
    fn fail_wqe(&mut self, ctx: &mut Ctx, now: Time, idx: usize, status: WcStatus) {
        if let Some(w) = self.req.sq.get_mut(idx) {
            w.state = WqeState::Done(status);
        }
        // Everything before it is either done or will be flushed by the fatal path; the
        // failed one must come out with its own status, so retire what can be, then fail.
        for w in self.req.sq.iter_mut().take(idx) {
            if !matches!(w.state, WqeState::Done(_)) {
                w.state = WqeState::Done(WcStatus::WrFlushErr);
            }
        }
        self.retire_send(ctx, now);
    }

    /// Writes the next request packet into `buf`, if the send queue has one to go now.
    pub(crate) fn next_request(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        buf: &mut PiecesMut<'_>,
    ) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.req.rnr_until.is_some_and(|t| t > now) {
            return None;
        }
        self.req.rnr_until = None;
        let mtu = self.mtu(ctx);
        loop {
            let idx = self.req.cur;
            let w = self.req.sq.get(idx)?;
            if !matches!(w.state, WqeState::Sending) {
                self.req.cur += 1;
                continue;
            }
            if !w.assigned {
                if self.req.draining {
                    return None;
                }
                let op = w.wr.opcode;
                if op.is_local() {
                    // Waits for every earlier WQE to complete (rxe), then runs locally. A
                    // failure completes it in error and the QP goes to ERR, as in rxe:
                    // LOC_QP_OP_ERR for LOCAL_INV, MW_BIND_ERR for BIND_MW.
                    if idx != 0 {
                        return None;
                    }
                    let st = match (op, w.bind()) {
                        (WrOpcode::BindMw, Some(b)) => {
                            match ctx.mrs.bind_window(self.pd, self.qpn, &b) {
                                Ok(()) => WcStatus::Success,
                                Err(why) => {
                                    tracing::debug!(qpn = self.qpn, "BIND_MW refused: {why}");
                                    WcStatus::MwBindErr
                                }
                            }
                        }
                        (WrOpcode::BindMw, None) => WcStatus::MwBindErr,
                        _ => match ctx.mrs.invalidate(w.wr.invalidate_rkey, self.pd) {
                            Ok(()) => WcStatus::Success,
                            Err(_) => WcStatus::LocQpOpErr,
                        },
                    };
                    self.req.sq[idx].state = WqeState::Done(st);
                    self.req.sq[idx].assigned = true;
                    self.retire_send(ctx, now);
                    continue;
                }
                if w.wr.send_flags.contains(SendFlags::FENCE) && self.req.rd_out > 0 {
                    return None;
                }
                if op.is_read_or_atomic() && self.req.rd_out >= u32::from(self.attr.max_rd_atomic) {
                    return None;
                }
                if let Some(e) = w.seg_err {
                    let st = match e {
                        AccessError::Permission
                        | AccessError::BadKey
                        | AccessError::Invalidated => WcStatus::LocProtErr,
                        AccessError::Range => WcStatus::LocProtErr,
                    };
                    self.fail_wqe(ctx, now, idx, st);
                    return None;
                }
                // Assign PSNs.
                let n = match op {
                    WrOpcode::RdmaRead => (w.length.div_ceil(u64::from(mtu))).max(1) as u32,
                    o if o.is_atomic() => 1,
                    _ if self.qp_type == QpType::Ud => 1,
                    _ => (w.length.div_ceil(u64::from(mtu))).max(1) as u32,
                };
                let psn = self.req.psn;
                let w = &mut self.req.sq[idx];
                w.assigned = true;
                w.first_psn = psn;
                w.npkts = n;
                w.last_psn = psn.add(n - 1);
                if op.is_read_or_atomic() {
                    w.holds_rd = true;
                    self.req.rd_out += 1;
                }
                self.req.psn = psn.add(n);
            }
            // The RC window: at most `window` PSNs unacknowledged.
            let w = &self.req.sq[idx];
            let pkt_psn = w.first_psn.add(if w.wr.opcode == WrOpcode::RdmaRead {
                w.read_from
            } else {
                w.next_pkt
            });
            let window = self.req.window(ctx.cfg.max_inflight_psns);
            if self.qp_type == QpType::Rc && pkt_psn.forward_from(self.req.comp_psn) >= window {
                return None;
            }
            let last_in_window =
                self.qp_type == QpType::Rc && pkt_psn.forward_from(self.req.comp_psn) + 1 == window;
            return match self.qp_type {
                QpType::Ud => self.send_ud(ctx, now, buf, idx),
                _ => self.send_connected(ctx, now, buf, idx, pkt_psn, mtu, last_in_window),
            };
        }
    }

    /// Whether the WQE after `idx` is posted and will be sent without waiting for
    /// `idx` to complete.
    fn next_follows(&self, idx: usize) -> bool {
        !self.req.draining
            && self.req.sq.get(idx + 1).is_some_and(|n| {
                matches!(n.state, WqeState::Sending)
                    && !n.wr.opcode.is_local()
                    && !n.wr.send_flags.contains(SendFlags::FENCE)
            })
    }

    #[allow(clippy::too_many_arguments)]
    fn send_connected(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        buf: &mut PiecesMut<'_>,
        idx: usize,
        psn: Psn,
        mtu: u32,
        last_in_window: bool,
    ) -> Option<usize> {
        let transport = if self.qp_type == QpType::Rc {
            Transport::Rc
        } else {
            Transport::Uc
        };
        let w = &self.req.sq[idx];
        let op = w.wr.opcode;
        let oper = operation(op);
        let (pos, payload_len, pkt_index) = match oper {
            Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd => {
                (Position::Only, 0usize, w.next_pkt)
            }
            _ => {
                let i = w.next_pkt;
                let off = u64::from(i) * u64::from(mtu);
                let len = (w.length - off.min(w.length)).min(u64::from(mtu)) as usize;
                (position(i, w.npkts), len, i)
            }
        };
        let imm = matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm) && pos.ends();
        let inv = op == WrOpcode::SendWithInv && pos.ends();
        let opcode = Opcode::find(transport, oper, pos, imm, inv)?;
        let rc = transport == Transport::Rc;
        // Also at half the window: if the window's last packet is lost, the ACK for its
        // middle lets later packets leave, and they reveal the gap (a NAK), where with
        // no ACK asked for before the last one only a timer would.
        let every = ctx
            .cfg
            .ack_req_interval
            .min(self.req.window(ctx.cfg.max_inflight_psns) / 2)
            .max(1);
        // A message's last packet asks unless the next WQE goes out right behind it and
        // fewer than ACK_REQ_ENDS packets went unasked: that next one's ACK covers this
        // one (ACKs are cumulative), and 64 B messages no longer cost an ACK frame each
        // way per responder batch. A WQE that waits for this one to complete (a local
        // operation, a fence, SQ drain) is not one that goes out right behind it.
        let ends_ask = pos.ends()
            && (self.req.noack + 1 >= ACK_REQ_ENDS.min(every) || !self.next_follows(idx));
        let ack_req = rc && (ends_ask || self.req.noack >= every || last_in_window);
        let mut ext = ExtRepr::default();
        match oper {
            Operation::Write if pos.starts() => {
                ext.reth = Some(RethRepr {
                    va: w.wr.remote_addr,
                    rkey: w.wr.rkey,
                    dma_len: w.length as u32,
                });
            }
            Operation::ReadRequest => {
                let skip = u64::from(w.read_from) * u64::from(mtu);
                ext.reth = Some(RethRepr {
                    va: w.wr.remote_addr.wrapping_add(skip),
                    rkey: w.wr.rkey,
                    dma_len: (w.length - skip.min(w.length)) as u32,
                });
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                ext.atomic_eth = Some(AtomicEthRepr {
                    va: w.wr.remote_addr,
                    rkey: w.wr.rkey,
                    swap_add: if oper == Operation::CompareSwap {
                        w.wr.swap
                    } else {
                        w.wr.compare_add
                    },
                    compare: if oper == Operation::CompareSwap {
                        w.wr.compare_add
                    } else {
                        0
                    },
                });
            }
            _ => {}
        }
        if imm {
            ext.immdt = Some(ImmDtRepr { imm: w.wr.imm_data });
        }
        if inv {
            ext.ieth = Some(IethRepr {
                rkey: w.wr.invalidate_rkey,
            });
        }
        // SE on the last packet of a SEND or WRITE_WITH_IMM asked to be solicited.
        let se = w.wr.send_flags.contains(SendFlags::SOLICITED)
            && pos.ends()
            && (oper == Operation::Send || imm);
        let bth = BthRepr {
            solicited: se,
            ack_req,
            ..BthRepr::new(opcode, self.attr.dest_qp_num, psn)
        };
        let off = u64::from(pkt_index) * u64::from(mtu);
        let w = &self.req.sq[idx];
        let mrs = &ctx.mrs;
        let m = u64::from(mtu);
        let built: Result<usize, AccessError> =
            self.try_emit(&mut ctx.counters, buf, bth, ext, payload_len, |dst| {
                // Checks the regions as it reads them: one that is gone fails the WR
                // with LOC_PROT_ERR (as rxe's requester does when its copy fails).
                let mut dst = dst;
                w.gather(mrs, off, &mut dst)?;
                // The first packet warms the next PREFETCH_PKTS (a message of a few
                // packets gets them all; one of a single packet needs none); later ones
                // keep the window that far ahead. One without payload (a READ request)
                // warms nothing.
                if dst.is_empty() {
                    return Ok(());
                }
                if off == 0 {
                    if w.length > m {
                        w.prefetch(mrs, m, (super::PREFETCH_PKTS * m) as usize);
                    }
                } else {
                    w.prefetch(mrs, off + super::PREFETCH_PKTS * m, dst.len());
                }
                Ok(())
            })?;
        let Ok(n) = built else {
            self.fail_wqe(ctx, now, idx, WcStatus::LocProtErr);
            return None;
        };
        // Book-keeping after the packet is built.
        let w = &mut self.req.sq[idx];
        let first_send = pkt_index >= w.sent_hi;
        if !first_send {
            ctx.counters.retransmitted_pkts += 1;
            self.req.fast_fired = None;
        }
        w.sent_hi = w.sent_hi.max(pkt_index + 1);
        let done_sending = match oper {
            Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd => {
                w.next_pkt = w.npkts;
                true
            }
            _ => {
                w.next_pkt += 1;
                w.next_pkt >= w.npkts
            }
        };
        if ack_req {
            self.req.noack = 0;
            if first_send && self.req.probe.is_none() {
                self.req.probe = Some((psn, now));
            }
        } else {
            self.req.noack += 1;
        }
        if done_sending {
            self.req.cur = idx + 1;
            if rc {
                w.state = WqeState::Sent;
            } else {
                // UC: nothing acknowledges it; done once sent.
                w.state = WqeState::Done(WcStatus::Success);
                self.retire_send(ctx, now);
            }
        }
        if rc && self.req.timer.is_none() && self.attr.timeout != 0 {
            self.req.timer = Some(now.add_nanos(timeout_ns(self.attr.timeout)));
        }
        // The round-trip timer runs from the last packet sent, not the first outstanding
        // (a tail-loss timer: a gap before later packets gets the responder's sequence
        // NAK). A QP among many sends a message's packets one scheduling round apart,
        // each round as long as the other QPs' packets; timed from the first packet, the
        // whole message outlived a timer set from the measured round trip and was sent
        // again though nothing was lost (bench qps: 70 k resends in a lossless run).
        if rc {
            self.req.last_sent = now;
            let m = ctx.rtt.recent(now);
            self.req.arm_fast(now, &self.attr, m);
        }
        Some(n)
    }

    fn send_ud(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        buf: &mut PiecesMut<'_>,
        idx: usize,
    ) -> Option<usize> {
        let w = &self.req.sq[idx];
        let Some(dest) = w.ud() else {
            self.fail_wqe(ctx, now, idx, WcStatus::LocQpOpErr);
            return None;
        };
        let mtu = ctx.cfg.port_mtu.bytes();
        if w.length > u64::from(mtu) {
            // C10-93.1.1 (and rxe): a UD message over the MTU is not sent, yet completes.
            ctx.counters.ud_too_long += 1;
            self.req.sq[idx].state = WqeState::Done(WcStatus::Success);
            self.req.cur = idx + 1;
            self.retire_send(ctx, now);
            return None;
        }
        if self.path.as_ref().is_none_or(|p| p.av != dest.ah) {
            match super::qp::resolve_path(ctx, &dest.ah, self.sport) {
                Ok(p) => self.path = Some(p),
                Err(_) => {
                    self.fail_wqe(ctx, now, idx, WcStatus::LocQpOpErr);
                    return None;
                }
            }
        }
        let w = &self.req.sq[idx];
        let imm = w.wr.opcode == WrOpcode::SendWithImm;
        let opcode = if imm {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        // IBA 10.2.5: a WR Q_Key with the top bit set means "use the QP's Q_Key". (rxe
        // sends the WR's value verbatim.)
        let qkey = if dest.remote_qkey & crate::wire::deth::QKEY_PRIVILEGED != 0 {
            self.attr.qkey
        } else {
            dest.remote_qkey
        };
        let ext = ExtRepr {
            deth: Some(DethRepr {
                qkey,
                src_qp: self.qpn,
            }),
            immdt: imm.then_some(ImmDtRepr { imm: w.wr.imm_data }),
            ..ExtRepr::default()
        };
        let bth = BthRepr {
            solicited: w.wr.send_flags.contains(SendFlags::SOLICITED),
            ..BthRepr::new(opcode, dest.remote_qpn, w.first_psn)
        };
        let len = w.length as usize;
        let w = &self.req.sq[idx];
        let mrs = &ctx.mrs;
        let built = self.try_emit(&mut ctx.counters, buf, bth, ext, len, |mut dst| {
            w.gather(mrs, 0, &mut dst)
        })?;
        let Ok(n) = built else {
            self.fail_wqe(ctx, now, idx, WcStatus::LocProtErr);
            return None;
        };
        // UD completes when the packet is handed to the link (rxe does the same).
        self.req.sq[idx].state = WqeState::Done(WcStatus::Success);
        self.req.cur = idx + 1;
        self.retire_send(ctx, now);
        Some(n)
    }
}

/// The longest round trip the device's QPs measured lately. QPs share the device's
/// rings, its engine thread and the host's cores, so a stall one QP meets is one every
/// QP can meet; a QP among many measures rarely (one probe per round trip, and a round
/// trip lasts as long as the other QPs' turns) and its own estimate misses the stalls
/// the device saw a moment ago. Two kinds of sample: round trips measured on probes,
/// kept for one to two windows of [`DeviceRtt::WINDOW_NS`]; and how late an answer
/// came after the round-trip timer had already gone back N for it (a retransmission
/// that was not needed), kept for one to two windows of [`DeviceRtt::LATE_WINDOW_NS`],
/// as the stalls that cause them recur (bench qps: 1000 QPs on a lossless link sent
/// tens of thousands of packets again with per-QP estimates alone).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeviceRtt {
    probes: Window,
    late: Window,
}

/// The largest sample of the current window and of the one before it.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    cur: u64,
    prev: u64,
    since: Time,
}

impl Window {
    fn roll(&mut self, now: Time, len: u64) {
        let age = now.0.saturating_sub(self.since.0);
        if age >= len {
            self.prev = if age < 2 * len { self.cur } else { 0 };
            self.cur = 0;
            self.since = now;
        }
    }

    fn note(&mut self, now: Time, len: u64, ns: u64) {
        self.roll(now, len);
        self.cur = self.cur.max(ns);
    }

    fn max(&mut self, now: Time, len: u64) -> u64 {
        self.roll(now, len);
        self.cur.max(self.prev)
    }
}

impl DeviceRtt {
    pub const WINDOW_NS: u64 = 16_000_000;
    pub const LATE_WINDOW_NS: u64 = 256_000_000;

    /// Takes one QP's round-trip sample, ns.
    pub fn note(&mut self, now: Time, ns: u64) {
        self.probes.note(now, Self::WINDOW_NS, ns);
    }

    /// Takes how long an answer took that came after the round-trip timer had fired.
    pub fn note_late(&mut self, now: Time, ns: u64) {
        self.late.note(now, Self::LATE_WINDOW_NS, ns);
    }

    /// The longest sample still kept.
    pub fn recent(&mut self, now: Time) -> u64 {
        self.probes
            .max(now, Self::WINDOW_NS)
            .max(self.late.max(now, Self::LATE_WINDOW_NS))
    }
}

/// The smallest congestion window (PSNs): below about a round trip of packets a loss
/// costs more in waiting than in packets sent twice (`bench loss`: a fixed window of 16
/// gave no more goodput at 2% loss than one of 32, with more timer waits).
pub(crate) const MIN_CWND: u32 = 32;

/// The least retransmit timeout the measured round trip may give. A busy host's late
/// ACKs are covered by four times the longest round trip the device saw lately and by
/// the late answers it learns from ([`DeviceRtt`]); the floor only keeps a timer from
/// firing within a few round trips of an idle veth. It was 1 ms, and it set nearly every
/// timer in `bench loss` at 2% (the measured part said 0.5-0.7 ms), each of about 200 a
/// second a wait for the answer to a lost NAK or a lost first retransmission: 0.3 ms
/// took the median goodput there from 0.50 to 0.56 of lossless.
pub(crate) const FAST_RTO_MIN_NS: u64 = 300_000;

/// Packets a run of back-to-back messages may send before one of their last packets
/// asks for an ACK again. rxe asks at every message's end, and a responder answers each
/// receive batch it finds an AckReq in: for 64 B WRITEs at 128 in flight that was 0.24
/// to 0.4 ACK frames per message, each costing both hosts a frame's ring and system-call
/// work. Small against the window, so completions still come many times per window.
pub(crate) const ACK_REQ_ENDS: u32 = 16;

/// The local ACK timeout: 4.096 us x 2^timeout (IBA 9.7.6.1.3).
pub(crate) fn timeout_ns(t: u8) -> u64 {
    4096u64 << u32::from(t.min(31))
}

#[cfg(test)]
mod wqe_tests {
    use super::*;
    use crate::verbs::{AccessFlags, AddressVector, Gid, Sge};

    /// One recycled WQE carries WRs of every kind in turn: each sees its own inline
    /// data, UD destination and bind, never the previous WR's, and the out-of-line part
    /// is allocated once and kept.
    #[test]
    fn a_recycled_wqe_holds_only_its_own_wrs_extras() {
        let sge = Sge {
            addr: 0x1000,
            length: 64,
            lkey: 5,
        };
        let dest = UdDest {
            ah: AddressVector::new(Gid::default(), 0),
            remote_qpn: 77,
            remote_qkey: 0x1111,
        };
        let bind = MwBind {
            mw: 3,
            rkey: 0x300,
            lkey: 5,
            addr: 0x1000,
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        let long = SendWr::send(1, &[]).with_inline(&[0xaa; 200]).unwrap();
        let short = SendWr::send(2, &[]).with_inline(&[1, 2, 3]).unwrap();
        // Inline data without the INLINE flag is not the message.
        let unflagged = SendWr {
            send_flags: SendFlags::SIGNALED,
            ..short
        };
        let ud = SendWr::send(3, &[sge]).with_ud(dest);
        let bw = SendWr::bind_mw(4, bind);
        let plain = SendWr::write(5, &[sge], 0x2000, 9).with_imm(7);
        let mut w = SendWqe::default();
        let mut kept = None;
        for wr in [&long, &plain, &short, &ud, &unflagged, &bw, &plain, &long] {
            w.recycle();
            w.assign(wr);
            assert_eq!(w.wr.wr_id, wr.wr_id);
            assert_eq!(w.wr.opcode, wr.opcode);
            assert_eq!(w.wr.remote_addr, wr.remote_addr);
            assert_eq!(w.wr.rkey, wr.rkey);
            assert_eq!(w.wr.imm_data, wr.imm_data);
            let want_inline = if wr.send_flags.contains(SendFlags::INLINE) {
                wr.inline.as_ref().map(|d| d.as_slice().to_vec())
            } else {
                None
            };
            assert_eq!(
                w.inline().map(|d| d.to_vec()),
                want_inline,
                "wr {}",
                wr.wr_id
            );
            assert_eq!(w.ud(), wr.ud, "wr {}", wr.wr_id);
            assert_eq!(w.bind(), wr.bind, "wr {}", wr.wr_id);
            if let Some(e) = w.extra.as_deref() {
                let at = e as *const WrExtra;
                assert_eq!(
                    *kept.get_or_insert(at),
                    at,
                    "the extra part was reallocated"
                );
            }
        }
        assert!(kept.is_some());
    }
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn a_loss_halves_the_window_once_per_episode_and_acks_grow_it_back() {
        let mut r = Requester::default();
        r.set_psn(100);
        assert_eq!(r.window(128), 128);
        // 128 PSNs out; a NAK, then another of the same episode.
        r.psn = r.psn.add(128);
        r.on_loss(128);
        assert_eq!(r.window(128), 64);
        r.on_loss(128);
        assert_eq!(r.window(128), 64, "one halving per episode");
        // Acknowledged up to the episode's end: the next loss halves again, to the floor.
        r.comp_psn = r.psn;
        r.on_acked(128, 128);
        r.psn = r.psn.add(40);
        r.on_loss(128);
        assert_eq!(r.window(128), MIN_CWND);
        r.comp_psn = r.psn;
        r.on_acked(40, 128);
        // One PSN more per window acknowledged, back to the device's maximum.
        let mut acked = 0u32;
        while r.window(128) < 128 {
            let w = r.window(128);
            r.psn = r.psn.add(w);
            r.comp_psn = r.psn;
            r.on_acked(w, 128);
            acked += w;
            assert!(acked < 10_000, "the window never grew back");
        }
        assert_eq!((r.cwnd, r.window(128)), (0, 128));
        // A device maximum below the floor is the window.
        let mut r = Requester::default();
        r.on_loss(8);
        assert_eq!(r.window(8), 8);
    }

    /// A QP given a new send PSN (RTR->RTS again, or a reconnect) starts a new PSN space:
    /// the old one's reduced window and loss episode do not carry over.
    #[test]
    fn a_new_psn_space_starts_with_the_full_window() {
        let mut r = Requester::default();
        r.set_psn(100);
        r.psn = r.psn.add(128);
        r.on_loss(128);
        assert_eq!(r.window(128), 64);
        r.set_psn(0x00ff_fff0);
        assert_eq!(r.window(128), 128);
        // The new space's first loss halves (no episode of the old one is open).
        r.psn = r.psn.add(128);
        r.on_loss(128);
        assert_eq!(r.window(128), 64);
    }
}

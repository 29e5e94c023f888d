//! The responder: executes incoming requests against memory and answers them (rxe's
//! `rxe_resp.c`).
//!
//! The checks run in the order rxe's state machine names them and IBA 9.7.5 lists them:
//! PSN (expected, duplicate, ahead), opcode sequence, opcode allowed by the QP's access
//! flags, resources (a receive WQE, READ/atomic slots), lengths, R_Key (key, PD, bounds
//! without wrap-around, access flags), then execute, complete, acknowledge. A failed check
//! sends the NAK IBA demands; class C errors (invalid request, remote access) also
//! complete the held receive WQE in error and take the QP to ERR, as rxe does.
//!
//! Responses (ACKs, NAKs, READ response packets, atomic ACKs) leave in PSN order from one
//! queue; consecutive ACKs not yet sent coalesce into the latest (ACKs are cumulative).

use super::Ctx;
use super::mem::{AccessError, Segs};
use super::pool::Recycle;
use super::qp::Qp;
use crate::time::Time;
use crate::verbs::mr::MrInner;
use crate::verbs::{
    AccessFlags, AsyncEvent, QpState, QpType, RecvWr, Wc, WcFlags, WcOpcode, WcStatus,
};
use crate::wire::PiecesMut;
use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::frame::IpView;
use crate::wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, ExtRepr, Frame, Opcode, Operation, Position, Psn,
};
use std::collections::VecDeque;
use std::sync::Arc;

/// A posted receive WR with its buffers resolved. Queued boxed and recycled through
/// [`Pool`](super::pool::Pool), like send WQEs. `repr(C)`, the list last: a one-SGE
/// receive is read from the WQE's first cache line.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub err: Option<AccessError>,
    pub segs: Segs,
}

// Checked when building (see the send WQE's checks in `requester`).
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(RecvWqe, segs) + Segs::FIRST_ENTRY_END <= 64);
    assert!(offset_of!(RecvWqe, wr_id) < 64 && offset_of!(RecvWqe, err) < 64);
};

impl RecvWqe {
    /// A recycled WQE for `wr`, its buffers resolved against PD `pd`.
    pub fn new(ctx: &mut Ctx, pd: u32, wr: &RecvWr) -> Box<RecvWqe> {
        let mut w = ctx.recv_wqes.take();
        w.wr_id = wr.wr_id;
        w.err = w.segs.resolve_into(&ctx.mrs, pd, &wr.sg_list, true).err();
        w
    }
}

impl Recycle for RecvWqe {
    fn recycle(&mut self) {
        self.segs.clear();
    }
}

/// A multi-packet message being received.
#[derive(Debug, Default)]
enum InProgress {
    #[default]
    Idle,
    Send {
        wqe: Box<RecvWqe>,
        off: u64,
    },
    Write {
        mr: Option<Arc<MrInner>>,
        /// Offset in the region's memory of the next byte.
        off: usize,
        resid: u64,
        total: u32,
    },
}

/// What a READ or atomic left behind, to answer its duplicates (IBA 9.7.5.1.3).
#[derive(Debug, Clone, Copy)]
enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        len: u32,
        rkey: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A READ response being sent.
#[derive(Debug)]
struct ReadReply {
    mr: Option<Arc<MrInner>>,
    off: usize,
    resid: u64,
    psn: Psn,
    started: bool,
    /// A replay that starts in the middle of the original range: MIDDLE..LAST, as rxe.
    mid: bool,
}

/// One queued response.
#[derive(Debug)]
enum Out {
    Ack { psn: Psn, syndrome: Syndrome },
    AtomicAck { psn: Psn, orig: u64 },
    Read(ReadReply),
}

/// The receive side of a QP.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// The PSN expected next.
    pub epsn: Psn,
    /// Messages completed (24 bits on the wire).
    pub msn: u32,
    /// One past the PSN of the last SEND/WRITE/atomic executed (for duplicate ACKs).
    ack_psn: Psn,
    /// A PSN sequence NAK was sent for the current gap (send it once, then be silent).
    nak_sent: bool,
    cur: InProgress,
    /// UC: drop packets until the next FIRST/ONLY.
    drop_msg: bool,
    pub rq: VecDeque<Box<RecvWqe>>,
    /// Set by the responder's own fatal NAK, until the QP is reset: every flush of the
    /// QP in ERR (its own, or one a late post_recv causes) keeps what is queued.
    nak_ends_queue: bool,
    out: VecDeque<Out>,
    res: Vec<Option<Resource>>,
    res_next: usize,
    /// Receive WQEs of the QP's own queue taken or flushed, ever.
    pub done: u64,
}

/// Why a request was refused (rxe's ERR_* states, with the NAK each gets).
#[derive(Debug, Clone, Copy)]
enum Refuse {
    /// No receive WQE: RNR NAK with the QP's min_rnr_timer; nothing is consumed and the
    /// QP stays as it is.
    Rnr,
    /// NAK invalid request; the held WQE completes with this status.
    InvalidRequest(WcStatus),
    /// NAK remote access error.
    RemoteAccess,
    /// NAK remote operational error (a malformed local WQE).
    RemoteOp(WcStatus),
}

impl Responder {
    pub fn set_epsn(&mut self, psn: u32) {
        self.epsn = Psn::new(psn);
        self.ack_psn = self.epsn;
    }

    pub fn set_resources(&mut self, n: u8) {
        self.res = vec![None; usize::from(n.max(1))];
        self.res_next = 0;
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    pub fn reset(&mut self, _ctx: &mut Ctx) {
        *self = Responder::default();
    }

    /// Flushes the receive WQEs (not an SRQ's) with WR_FLUSH_ERR. Responses already queued
    /// still go out when the responder itself found the error (its NAK ends the queue):
    /// READ replies to earlier requests first, in PSN order, as rxe sends a READ's reply
    /// before it looks at the next request. When the QP was moved to ERR by its owner, no
    /// more READ data goes out.
    pub fn flush(&mut self, ctx: &mut Ctx, qpn: u32, cq: u32, srq: Option<u32>) {
        if let InProgress::Send { wqe, .. } = std::mem::take(&mut self.cur) {
            let wc = Qp::flush_wc(qpn, wqe.wr_id, WcOpcode::Recv);
            ctx.post_cqe(cq, wc, false);
            ctx.recv_wqes.give(wqe);
        }
        while let Some(w) = self.rq.pop_front() {
            self.done += 1;
            let wc = Qp::flush_wc(qpn, w.wr_id, WcOpcode::Recv);
            ctx.post_cqe(cq, wc, false);
            ctx.recv_wqes.give(w);
        }
        if !self.nak_ends_queue {
            self.out.retain(|o| !matches!(o, Out::Read(_)));
        }
        if srq.is_some() {
            ctx.events.push_back(AsyncEvent::QpLastWqeReached { qpn });
        }
    }

    fn queue_ack(&mut self, psn: Psn, syndrome: Syndrome) {
        if syndrome.is_ack()
            && let Some(Out::Ack {
                psn: p,
                syndrome: s,
            }) = self.out.back_mut()
            && s.is_ack()
        {
            // Cumulative: a newer ACK replaces one not yet sent.
            *p = psn;
            return;
        }
        self.out.push_back(Out::Ack { psn, syndrome });
    }

    /// READ replies and atomic ACKs queued (a READ's until its last packet is sent).
    fn rd_atomic_queued(&self) -> usize {
        self.out
            .iter()
            .filter(|o| matches!(o, Out::Read(_) | Out::AtomicAck { .. }))
            .count()
    }

    fn remember(&mut self, r: Resource) {
        if self.res.is_empty() {
            self.res.push(None);
        }
        let n = self.res.len();
        self.res[self.res_next % n] = Some(r);
        self.res_next = (self.res_next + 1) % n;
    }
}

impl Qp {
    /// Takes the next receive WQE from the SRQ or the QP's receive queue.
    fn take_recv(&mut self, ctx: &mut Ctx) -> Option<Box<RecvWqe>> {
        match self.srq {
            Some(s) => {
                let srq = ctx.srqs.get_mut(s)?;
                let w = srq.queue.pop_front()?;
                srq.taken += 1;
                if srq.limit > 0 && srq.queue.len() < srq.limit {
                    srq.limit = 0;
                    ctx.events.push_back(AsyncEvent::SrqLimitReached { srq: s });
                }
                let pd = srq_pd(ctx, s);
                Some(RecvWqe::new(ctx, pd, &w))
            }
            None => {
                let w = self.resp.rq.pop_front();
                if w.is_some() {
                    self.resp.done += 1;
                }
                w
            }
        }
    }

    fn has_recv(&self, ctx: &Ctx) -> bool {
        match self.srq {
            Some(s) => ctx.srqs.get(s).is_some_and(|q| !q.queue.is_empty()),
            None => !self.resp.rq.is_empty(),
        }
    }

    /// Puts a receive WQE back at the head of its queue (a UC message that was dropped).
    fn untake_recv(&mut self, ctx: &mut Ctx, w: Box<RecvWqe>) {
        match self.srq {
            // SRQ WQEs were resolved on take; the SRQ keeps WRs, so the buffers are
            // re-resolved when it is taken again. Putting it back means completing it:
            // rxe completes it in error for SRQ QPs.
            Some(_) => {
                let wc = Wc::new(self.qpn, w.wr_id, WcOpcode::Recv, WcStatus::RemInvReqErr);
                ctx.post_cqe(self.recv_cq, wc, false);
                ctx.recv_wqes.give(w);
            }
            None => {
                self.resp.done -= 1;
                self.resp.rq.push_front(w);
            }
        }
    }

    /// Completes a receive WQE.
    fn complete_recv(&mut self, ctx: &mut Ctx, now: Time, mut wc: Wc, solicited: bool) {
        wc.qp_num = self.qpn;
        if wc.status == WcStatus::Success {
            ctx.counters.rdma_recvs += 1;
        }
        if !ctx.post_cqe(self.recv_cq, wc, solicited) {
            self.fatal(ctx, now, false);
        }
    }

    /// A request packet for this QP (dispatched by the engine after the common checks).
    pub(crate) fn handle_request(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.counters.drop_wrong_state += 1;
            return;
        }
        if self.state == QpState::Rtr && !self.comm_est {
            self.comm_est = true;
            ctx.events.push_back(AsyncEvent::CommEst { qpn: self.qpn });
        }
        match self.qp_type {
            QpType::Rc => self.rc_request(ctx, now, f),
            QpType::Uc => self.uc_request(ctx, now, f),
            QpType::Ud => self.ud_request(ctx, now, f),
        }
    }

    fn rc_request(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        let r = f.roce();
        let bth = r.bth();
        let psn = bth.psn();
        // A READ or atomic beyond the responder's resources (max_dest_rd_atomic replies
        // still queued) is dropped, new or duplicate: a requester keeps its max_rd_atomic
        // within the peer's max_dest_rd_atomic (the CM's initiator depth and responder
        // resources), so only a misconfigured or hostile one gets here, and its retransmission finds
        // room once the queued replies are out. Without this bound every READ of a flood
        // would hold a queued reply. (rxe recycles its resource ring instead.)
        if matches!(
            r.info().operation,
            Operation::ReadRequest | Operation::CompareSwap | Operation::FetchAdd
        ) && self.resp.rd_atomic_queued() >= usize::from(self.attr.max_dest_rd_atomic.max(1))
        {
            ctx.counters.drop_rd_atomic_overflow += 1;
            return;
        }
        // CHK_PSN
        if psn != self.resp.epsn {
            if psn.is_after(self.resp.epsn) {
                if !self.resp.nak_sent {
                    self.resp.nak_sent = true;
                    ctx.counters.out_of_seq_request += 1;
                    let e = self.resp.epsn;
                    self.resp
                        .queue_ack(e, Syndrome::Nak(NakCode::PsnSequenceError));
                } else {
                    ctx.counters.drop_silent_request += 1;
                }
            } else {
                ctx.counters.duplicate_request += 1;
                self.duplicate(ctx, now, f);
            }
            return;
        }
        self.resp.nak_sent = false;
        if let Err(e) = self.rc_execute(ctx, now, f) {
            self.refuse(ctx, now, psn, e);
        }
    }

    /// CHK_OP_SEQ through EXECUTE and ACKNOWLEDGE for an in-sequence RC request.
    fn rc_execute(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) -> Result<(), Refuse> {
        let r = f.roce();
        let bth = r.bth();
        let psn = bth.psn();
        let info = r.info();
        let pos = info.position;
        let op = info.operation;
        // CHK_OP_SEQ
        let seq_ok = match self.resp.cur {
            InProgress::Send { .. } => op == Operation::Send && !pos.starts(),
            InProgress::Write { .. } => op == Operation::Write && !pos.starts(),
            InProgress::Idle => pos.starts(),
        };
        if !seq_ok {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        // CHK_OP_VALID
        let need = match op {
            Operation::Write => AccessFlags::REMOTE_WRITE,
            Operation::ReadRequest => AccessFlags::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => AccessFlags::REMOTE_ATOMIC,
            _ => AccessFlags::EMPTY,
        };
        if !self.attr.qp_access_flags.contains(need) {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        // CHK_LENGTH (IBA 9.7.5.1.5): FIRST/MIDDLE carry exactly one MTU, LAST 1..MTU,
        // ONLY at most one MTU.
        let mtu = u64::from(self.mtu(ctx));
        let plen = f.payload_len() as u64;
        let len_ok = match pos {
            Position::First | Position::Middle => plen == mtu,
            Position::Last => plen > 0 && plen <= mtu,
            Position::Only => plen <= mtu,
        };
        if info.payload && !len_ok {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        match op {
            Operation::Send => self.exec_send(ctx, now, f)?,
            Operation::Write => self.exec_write(ctx, now, f)?,
            Operation::ReadRequest => {
                self.exec_read(ctx, f)?;
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                self.exec_atomic(ctx, f)?;
                return Ok(());
            }
            _ => return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr)),
        }
        self.resp.epsn = psn.next();
        self.resp.ack_psn = self.resp.epsn;
        if bth.ack_req() {
            self.resp.queue_ack(psn, Syndrome::ACK);
        }
        Ok(())
    }

    fn exec_send(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) -> Result<(), Refuse> {
        let r = f.roce();
        let info = r.info();
        let payload = f.payload();
        if info.position.starts() {
            let Some(wqe) = self.take_recv(ctx) else {
                return Err(Refuse::Rnr);
            };
            if wqe.err.is_some() {
                self.resp.cur = InProgress::Send { wqe, off: 0 };
                return Err(Refuse::RemoteOp(WcStatus::LocProtErr));
            }
            self.resp.cur = InProgress::Send { wqe, off: 0 };
        }
        let InProgress::Send { wqe, off } = &mut self.resp.cur else {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        };
        if *off + payload.len() as u64 > wqe.segs.total() {
            // The message does not fit the receive buffer: the responder's WQE completes
            // with LOC_LEN_ERR (IBA 10.8.4; rxe reports REM_INV_REQ_ERR here).
            return Err(Refuse::InvalidRequest(WcStatus::LocLenErr));
        }
        if wqe.segs.scatter_payload(&ctx.mrs, *off, payload).is_err() {
            return Err(Refuse::RemoteOp(WcStatus::LocProtErr));
        }
        *off += payload.len() as u64;
        if !info.position.ends() {
            return Ok(());
        }
        let InProgress::Send { wqe, off } = std::mem::take(&mut self.resp.cur) else {
            unreachable!()
        };
        let mut wc = Wc::new(self.qpn, wqe.wr_id, WcOpcode::Recv, WcStatus::Success);
        wc.byte_len = off as u32;
        if let Some(imm) = r.immdt() {
            wc.wc_flags |= WcFlags::WITH_IMM;
            wc.imm_data = imm;
        }
        if let Some(rkey) = r.ieth() {
            if ctx.mrs.invalidate(rkey, self.pd).is_err() {
                // rxe: ERR_INVALIDATE_RKEY completes the WQE with REM_INV_REQ_ERR.
                self.resp.cur = InProgress::Send { wqe, off };
                return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
            }
            wc.wc_flags |= WcFlags::WITH_INV;
            wc.imm_data = rkey;
        }
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        ctx.recv_wqes.give(wqe);
        self.complete_recv(ctx, now, wc, r.bth().solicited());
        Ok(())
    }

    fn exec_write(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) -> Result<(), Refuse> {
        let r = f.roce();
        let info = r.info();
        let pos = info.position;
        let payload = f.payload();
        // WRITE_*_WITH_IMM consumes a receive WQE: check it before placing any data.
        if info.has_imm() && !self.has_recv(ctx) {
            return Err(Refuse::Rnr);
        }
        if pos.starts() {
            let Some(reth) = r.reth() else {
                return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
            };
            let len = reth.dma_len();
            if len > 0x8000_0000 {
                return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
            }
            let mr = if len == 0 {
                // C9-88: a zero-length RDMA operation checks no R_Key.
                None
            } else {
                match ctx.mrs.remote(
                    self.pd,
                    self.qpn,
                    reth.rkey(),
                    reth.va(),
                    u64::from(len),
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Ok((mr, off)) => Some((mr, off)),
                    Err(_) => return Err(Refuse::RemoteAccess),
                }
            };
            let (mr, off) = match mr {
                Some((m, o)) => (Some(m), o),
                None => (None, 0),
            };
            self.resp.cur = InProgress::Write {
                mr,
                off,
                resid: u64::from(len),
                total: len,
            };
        }
        let InProgress::Write { mr, off, resid, .. } = &mut self.resp.cur else {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        };
        let n = payload.len() as u64;
        // LAST/ONLY must carry exactly what remains; FIRST/MIDDLE must leave some.
        let fits = if pos.ends() { n == *resid } else { n < *resid };
        if !fits {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        if n > 0 {
            let Some(m) = mr else {
                return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
            };
            if !m.is_valid() {
                return Err(Refuse::RemoteAccess);
            }
            let mut at = *off;
            for piece in payload.iter() {
                if m.memory().write(at, piece).is_err() {
                    return Err(Refuse::RemoteAccess);
                }
                at += piece.len();
            }
        }
        *off += n as usize;
        *resid -= n;
        if !pos.ends() {
            return Ok(());
        }
        let InProgress::Write { total, .. } = std::mem::take(&mut self.resp.cur) else {
            unreachable!()
        };
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        if let Some(imm) = r.immdt() {
            let Some(wqe) = self.take_recv(ctx) else {
                return Err(Refuse::Rnr);
            };
            let status = if wqe.err.is_some() {
                WcStatus::LocProtErr
            } else {
                WcStatus::Success
            };
            let mut wc = Wc::new(self.qpn, wqe.wr_id, WcOpcode::RecvRdmaWithImm, status);
            wc.byte_len = total;
            wc.wc_flags = WcFlags::WITH_IMM;
            wc.imm_data = imm;
            ctx.recv_wqes.give(wqe);
            self.complete_recv(ctx, now, wc, r.bth().solicited());
        }
        Ok(())
    }

    fn exec_read(&mut self, ctx: &mut Ctx, f: &Frame<'_>) -> Result<(), Refuse> {
        let r = f.roce();
        let psn = r.bth().psn();
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        let Some(reth) = r.reth() else {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        };
        let len = reth.dma_len();
        if len > 0x8000_0000 {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        let mtu = self.mtu(ctx);
        let n = len.div_ceil(mtu).max(1);
        let (mr, off) = if len == 0 {
            (None, 0)
        } else {
            match ctx.mrs.remote(
                self.pd,
                self.qpn,
                reth.rkey(),
                reth.va(),
                u64::from(len),
                AccessFlags::REMOTE_READ,
            ) {
                Ok((m, o)) => (Some(m), o),
                Err(_) => return Err(Refuse::RemoteAccess),
            }
        };
        self.resp.remember(Resource::Read {
            first: psn,
            last: psn.add(n - 1),
            va: reth.va(),
            len,
            rkey: reth.rkey(),
        });
        // C9-148: MSN counts the READ as it is executed.
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        self.resp.out.push_back(Out::Read(ReadReply {
            mr,
            off,
            resid: u64::from(len),
            psn,
            started: false,
            mid: false,
        }));
        self.resp.epsn = psn.add(n);
        Ok(())
    }

    fn exec_atomic(&mut self, ctx: &mut Ctx, f: &Frame<'_>) -> Result<(), Refuse> {
        let r = f.roce();
        let psn = r.bth().psn();
        if self.attr.max_dest_rd_atomic == 0 {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        }
        let Some(a) = r.atomic_eth() else {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        };
        let (mr, off) = ctx
            .mrs
            .remote(
                self.pd,
                self.qpn,
                a.rkey(),
                a.va(),
                8,
                AccessFlags::REMOTE_ATOMIC,
            )
            .map_err(|_| Refuse::RemoteAccess)?;
        // Atomics need an 8-byte aligned target (IBA 9.4.5): INVALID_REQUEST otherwise.
        let Some(cell) = a
            .va()
            .is_multiple_of(8)
            .then(|| mr.memory().atomic_u64(off))
            .flatten()
        else {
            return Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr));
        };
        use std::sync::atomic::Ordering::SeqCst;
        let orig = if r.info().operation == Operation::CompareSwap {
            match cell.compare_exchange(a.compare(), a.swap_add(), SeqCst, SeqCst) {
                Ok(v) | Err(v) => v,
            }
        } else {
            cell.fetch_add(a.swap_add(), SeqCst)
        };
        self.resp.remember(Resource::Atomic { psn, orig });
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        self.resp.out.push_back(Out::AtomicAck { psn, orig });
        self.resp.epsn = psn.next();
        self.resp.ack_psn = self.resp.epsn;
        Ok(())
    }

    /// Sends the NAK a refused request gets; class C/A errors end the QP (rxe).
    fn refuse(&mut self, ctx: &mut Ctx, now: Time, psn: Psn, e: Refuse) {
        let (code, status) = match e {
            Refuse::Rnr => {
                ctx.counters.send_rnr_err += 1;
                let timer = self.attr.min_rnr_timer & 0x1f;
                self.resp.queue_ack(psn, Syndrome::RnrNak { timer });
                return;
            }
            Refuse::InvalidRequest(s) => {
                ctx.counters.nak_inv_req_sent += 1;
                (NakCode::InvalidRequest, s)
            }
            Refuse::RemoteAccess => {
                ctx.counters.nak_rem_access_sent += 1;
                (NakCode::RemoteAccessError, WcStatus::RemAccessErr)
            }
            Refuse::RemoteOp(s) => {
                ctx.counters.nak_rem_op_sent += 1;
                (NakCode::RemoteOperationalError, s)
            }
        };
        self.resp.queue_ack(psn, Syndrome::Nak(code));
        // The NAK ends the queue: what was queued before it still goes out (see `flush`).
        // Set before anything below can send the QP to ERR (a full CQ does).
        self.resp.nak_ends_queue = true;
        if let InProgress::Send { wqe, off } = std::mem::take(&mut self.resp.cur) {
            let mut wc = Wc::new(self.qpn, wqe.wr_id, WcOpcode::Recv, status);
            wc.byte_len = off as u32;
            ctx.recv_wqes.give(wqe);
            self.complete_recv(ctx, now, wc, false);
        }
        self.fatal(ctx, now, false);
    }

    /// A request with a PSN already executed (IBA 9.7.5.1.3).
    fn duplicate(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        let r = f.roce();
        let psn = r.bth().psn();
        match r.info().operation {
            Operation::Send | Operation::Write => {
                // C9-105: acknowledge again, up to the last request executed.
                let p = self.resp.ack_psn.sub(1);
                self.resp.queue_ack(p, Syndrome::ACK);
            }
            Operation::ReadRequest => {
                let Some(reth) = r.reth() else { return };
                let found = self.resp.res.iter().flatten().find_map(|x| match *x {
                    Resource::Read {
                        first,
                        last,
                        va,
                        len,
                        rkey,
                    } if !psn.is_before(first) && !psn.is_after(last) => {
                        Some((first, last, va, len, rkey))
                    }
                    _ => None,
                });
                let Some((first, last, va, len, rkey)) = found else {
                    ctx.counters.drop_silent_request += 1;
                    return;
                };
                // The re-request must lie inside the original one.
                let inside = reth.rkey() == rkey
                    && reth.va() >= va
                    && u64::from(reth.dma_len()) <= u64::from(len)
                    && reth.va().checked_add(u64::from(reth.dma_len()))
                        <= va.checked_add(u64::from(len));
                if !inside {
                    ctx.counters.drop_silent_request += 1;
                    return;
                }
                // A reply to this READ still being sent is replaced, not queued behind
                // (rxe restarts its current reply at the re-requested PSN): a backlog of
                // stale replays would outlast the requester's timer.
                self.resp.out.retain(|o| {
                    !matches!(o, Out::Read(x) if !x.psn.is_before(first) && !x.psn.is_after(last))
                });
                let l = reth.dma_len();
                // Replay from memory as it is now (a READ is re-executed, not cached).
                let (mr, off) = if l == 0 {
                    (None, 0)
                } else {
                    match ctx.mrs.remote(
                        self.pd,
                        self.qpn,
                        reth.rkey(),
                        reth.va(),
                        u64::from(l),
                        AccessFlags::REMOTE_READ,
                    ) {
                        Ok((m, o)) => (Some(m), o),
                        Err(_) => {
                            self.refuse(ctx, now, psn, Refuse::RemoteAccess);
                            return;
                        }
                    }
                };
                self.resp.out.push_back(Out::Read(ReadReply {
                    mr,
                    off,
                    resid: u64::from(l),
                    psn,
                    started: false,
                    mid: psn != first,
                }));
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let orig = self.resp.res.iter().flatten().find_map(|x| match *x {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                match orig {
                    // Replayed from the saved result, never executed twice.
                    Some(orig) => self.resp.out.push_back(Out::AtomicAck { psn, orig }),
                    None => ctx.counters.drop_silent_request += 1,
                }
            }
            _ => ctx.counters.drop_silent_request += 1,
        }
    }

    fn uc_request(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        let r = f.roce();
        let bth = r.bth();
        let psn = bth.psn();
        let info = r.info();
        let pos = info.position;
        if self.resp.drop_msg || psn != self.resp.epsn {
            if pos.starts() {
                // A new message: resynchronise on it, abandoning a partial one.
                self.uc_abort(ctx);
                self.resp.drop_msg = false;
            } else {
                self.uc_abort(ctx);
                self.resp.drop_msg = true;
                self.resp.epsn = psn.next();
                ctx.counters.drop_uc_msg += 1;
                return;
            }
        }
        let in_seq = match self.resp.cur {
            InProgress::Send { .. } => info.operation == Operation::Send && !pos.starts(),
            InProgress::Write { .. } => info.operation == Operation::Write && !pos.starts(),
            InProgress::Idle => pos.starts(),
        };
        if !in_seq {
            self.uc_abort(ctx);
            self.resp.drop_msg = !pos.starts();
            if !pos.starts() {
                ctx.counters.drop_uc_msg += 1;
                self.resp.epsn = psn.next();
                return;
            }
        }
        if info.operation == Operation::Write
            && !self
                .attr
                .qp_access_flags
                .contains(AccessFlags::REMOTE_WRITE)
        {
            self.resp.drop_msg = true;
            self.resp.epsn = psn.next();
            ctx.counters.drop_uc_msg += 1;
            return;
        }
        let mtu = u64::from(self.mtu(ctx));
        let plen = f.payload_len() as u64;
        let len_ok = match pos {
            Position::First | Position::Middle => plen == mtu,
            Position::Last => plen > 0 && plen <= mtu,
            Position::Only => plen <= mtu,
        };
        let res = if !len_ok {
            Err(Refuse::InvalidRequest(WcStatus::RemInvReqErr))
        } else if info.operation == Operation::Send {
            self.exec_send(ctx, now, f)
        } else {
            self.exec_write(ctx, now, f)
        };
        self.resp.epsn = psn.next();
        if let Err(e) = res {
            // UC has no NAKs: the message is dropped (a WQE without room for it stays).
            if let Refuse::Rnr = e {
                ctx.counters.drop_no_recv_wqe += 1;
            } else {
                ctx.counters.drop_uc_msg += 1;
            }
            self.uc_abort(ctx);
            self.resp.drop_msg = !pos.ends();
        }
    }

    /// Abandons a partially received UC message; its receive WQE is reused.
    fn uc_abort(&mut self, ctx: &mut Ctx) {
        if let InProgress::Send { wqe, .. } = std::mem::take(&mut self.resp.cur) {
            self.untake_recv(ctx, wqe);
        }
    }

    fn ud_request(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        let r = f.roce();
        let Some(deth) = r.deth() else { return };
        if deth.qkey() != self.attr.qkey {
            ctx.counters.drop_bad_qkey += 1;
            return;
        }
        let Some(wqe) = self.take_recv(ctx) else {
            ctx.counters.drop_no_recv_wqe += 1;
            return;
        };
        let payload = f.payload();
        let total = 40 + payload.len() as u64;
        let mut wc = Wc::new(self.qpn, wqe.wr_id, WcOpcode::Recv, WcStatus::Success);
        if wqe.err.is_some() {
            wc.status = WcStatus::LocProtErr;
        } else if total > wqe.segs.total() {
            wc.status = WcStatus::LocLenErr;
        } else {
            // The 40-byte GRH area: for IPv4, 20 zero bytes then the IPv4 header; for IPv6,
            // the IPv6 header (as rxe fills it, `union rdma_network_hdr`).
            let mut grh = [0u8; 40];
            match f.ip() {
                IpView::V4(h) => {
                    let b = h.slice();
                    let n = b.len().min(20);
                    grh[20..20 + n].copy_from_slice(&b[..n]);
                }
                IpView::V6(h) => grh.copy_from_slice(&h.slice()[..40]),
            }
            if wqe.segs.scatter(&ctx.mrs, 0, &grh).is_err()
                || wqe.segs.scatter_payload(&ctx.mrs, 40, payload).is_err()
            {
                wc.status = WcStatus::LocProtErr;
            } else {
                wc.byte_len = total as u32;
                wc.src_qp = deth.src_qp();
                wc.wc_flags = WcFlags::GRH;
                if let Some(imm) = r.immdt() {
                    wc.wc_flags |= WcFlags::WITH_IMM;
                    wc.imm_data = imm;
                }
            }
        }
        ctx.recv_wqes.give(wqe);
        self.complete_recv(ctx, now, wc, r.bth().solicited());
    }

    /// Writes the next queued response into `buf`.
    pub(crate) fn next_response(
        &mut self,
        ctx: &mut Ctx,
        buf: &mut PiecesMut<'_>,
    ) -> Option<usize> {
        let mtu = u64::from(self.mtu(ctx));
        let msn = self.resp.msn;
        let dest = self.attr.dest_qp_num;
        let bth = |opcode: Opcode, psn: Psn| BthRepr::new(opcode, dest, psn);
        let aeth = |s: Syndrome| Some(AethRepr { syndrome: s, msn });
        match self.resp.out.front_mut()? {
            Out::Ack { psn, syndrome } => {
                let (p, s) = (*psn, *syndrome);
                self.resp.out.pop_front();
                if let Syndrome::Nak(NakCode::PsnSequenceError) = s {
                    ctx.counters.nak_seq_sent += 1;
                }
                ctx.counters.acks_sent += 1;
                let ext = ExtRepr {
                    aeth: aeth(s),
                    ..ExtRepr::default()
                };
                self.emit(
                    &mut ctx.counters,
                    buf,
                    bth(Opcode::RC_ACKNOWLEDGE, p),
                    ext,
                    0,
                    |_| {},
                )
            }
            Out::AtomicAck { psn, orig } => {
                let (p, o) = (*psn, *orig);
                self.resp.out.pop_front();
                ctx.counters.acks_sent += 1;
                let ext = ExtRepr {
                    aeth: aeth(Syndrome::ACK),
                    atomic_ack_eth: Some(AtomicAckEthRepr { orig: o }),
                    ..ExtRepr::default()
                };
                self.emit(
                    &mut ctx.counters,
                    buf,
                    bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, p),
                    ext,
                    0,
                    |_| {},
                )
            }
            Out::Read(rr) => {
                let last = rr.resid <= mtu;
                let opcode = match (rr.started || rr.mid, last) {
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let n = rr.resid.min(mtu) as usize;
                let psn = rr.psn;
                let off = rr.off;
                let valid = n == 0 || rr.mr.as_ref().is_some_and(|m| m.is_valid());
                if !valid {
                    // The region went away mid-reply: refuse the rest (rxe: RKEY_VIOLATION).
                    self.resp.out.pop_front();
                    ctx.counters.nak_rem_access_sent += 1;
                    self.resp.out.push_front(Out::Ack {
                        psn,
                        syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    });
                    return self.next_response(ctx, buf);
                }
                let mr = rr.mr.clone();
                let ext = ExtRepr {
                    aeth: match opcode {
                        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE => None,
                        _ => aeth(Syndrome::ACK),
                    },
                    ..ExtRepr::default()
                };
                let (resid, first) = (rr.resid, !rr.started);
                let sent = self.emit(&mut ctx.counters, buf, bth(opcode, psn), ext, n, |dst| {
                    if let Some(m) = &mr {
                        // Cannot fail: the range was checked against the region.
                        let _ = m.memory().read(off, dst.first);
                        if !dst.rest.is_empty() {
                            let _ = m.memory().read(off + dst.first.len(), dst.rest);
                        }
                        // Within what the READ asked for: the first response warms the
                        // next PREFETCH_PKTS, later ones keep the window that far ahead.
                        let ahead = super::PREFETCH_PKTS * mtu;
                        let (from, to) = if first {
                            (mtu, ahead + mtu)
                        } else {
                            (ahead, ahead + mtu)
                        };
                        let (from, to) = (from.min(resid), to.min(resid));
                        m.memory()
                            .prefetch(off + from as usize, (to - from) as usize);
                    }
                });
                if sent.is_some()
                    && let Some(Out::Read(rr)) = self.resp.out.front_mut()
                {
                    rr.started = true;
                    rr.psn = rr.psn.next();
                    rr.off += n;
                    rr.resid -= n as u64;
                    if last {
                        self.resp.out.pop_front();
                    }
                }
                sent
            }
        }
    }
}

fn srq_pd(ctx: &Ctx, srq: u32) -> u32 {
    ctx.srqs.get(srq).map_or(0, |s| s.pd)
}

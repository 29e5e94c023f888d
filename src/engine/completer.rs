//! The completer: turns responses (ACK, NAK, READ responses, atomic ACKs) into
//! completions, and drives retries (rxe's `rxe_comp.c`).
//!
//! - An ACK is cumulative: every WQE whose last PSN it covers is done. A READ or atomic it
//!   covers without its response having arrived lost that response: an implicit NAK.
//! - A NAK implicitly acknowledges everything before its PSN. A PSN sequence NAK starts a
//!   go-back-N retry from that PSN; invalid request, remote access and remote operational
//!   NAKs complete the WQE with REM_INV_REQ_ERR, REM_ACCESS_ERR, REM_OP_ERR and take the QP
//!   to ERR; an RNR NAK waits the time its timer code says, then retries.
//! - READ response data is placed at its PSN's offset; a gap in the response PSNs means a
//!   response was lost, and the READ is re-requested from the first missing PSN (an
//!   MTU boundary), keeping what arrived.
//! - The retransmit timer is 4.096 us x 2^timeout; each retry costs one of `retry_cnt`,
//!   each RNR wait one of `rnr_retry` (7 = unlimited, IBA 9.7.5.2.8). For `retry_cnt` 7 see
//!   `DeviceConfig::retry_cnt_7_infinite`. Exhausted: RETRY_EXC_ERR / RNR_RETRY_EXC_ERR
//!   on the WQE, the QP to ERR, the rest flushed.

use super::Ctx;
use super::qp::Qp;
use super::requester::{WqeState, timeout_ns};
use crate::time::Time;
use crate::verbs::{QpState, QpType, WcStatus, WrOpcode};
use crate::wire::aeth::{NakCode, Syndrome, rnr_timer_ns};
use crate::wire::{Frame, Operation, Pieces, Position, Psn};

/// What covering a PSN with an acknowledgement found.
enum Covered {
    Ok,
    /// A READ or atomic before the PSN has not had its response: it was lost.
    LostResponse,
}

impl Qp {
    /// A response packet for this QP (dispatched by the engine after the common checks).
    pub(crate) fn handle_response(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        if self.qp_type != QpType::Rc {
            ctx.counters.drop_wrong_transport += 1;
            return;
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            ctx.counters.drop_wrong_state += 1;
            return;
        }
        let r = f.roce();
        let psn = r.bth().psn();
        // A response must be for a PSN already sent and not yet acknowledged (or the
        // last one acknowledged, a duplicate ACK). With nothing in flight nothing is
        // answered: a ghost ACK then must not move comp_psn past the PSNs sent, which
        // would make every later PSN look in flight (IBA 9.7.5.2.1, C9-120: a
        // response outside the window is dropped).
        if psn.forward_from(self.req.comp_psn) >= self.req.inflight()
            && !psn.is_before(self.req.comp_psn)
        {
            ctx.counters.drop_stale_response += 1;
            return;
        }
        // The responder is alive and answering: push the retransmit timer back, as rxe
        // does for every response it processes, so a long READ reply that is still
        // streaming after a loss is not also timed out.
        self.rearm(ctx, now);
        match r.info().operation {
            Operation::Ack => {
                let Some(a) = r.aeth() else { return };
                self.on_ack(ctx, now, psn, a.syndrome());
            }
            Operation::ReadResponse => {
                if let Some(a) = r.aeth()
                    && !a.syndrome().is_ack()
                {
                    // READ responses carry an ACK syndrome; anything else is a bad response.
                    self.fail_at(ctx, now, psn, WcStatus::BadRespErr);
                    return;
                }
                self.on_read_response(ctx, now, psn, r.info().position, f.payload());
            }
            Operation::AtomicAck => {
                let (Some(a), Some(orig)) = (r.aeth(), r.atomic_ack_eth()) else {
                    return;
                };
                if !a.syndrome().is_ack() {
                    self.fail_at(ctx, now, psn, WcStatus::BadRespErr);
                    return;
                }
                self.on_atomic_ack(ctx, now, psn, orig.orig());
            }
            _ => ctx.counters.drop_stale_response += 1,
        }
        self.retire_send(ctx, now);
    }

    /// Marks done every SEND/WRITE WQE whose last PSN is not after `psn`. Stopping at a
    /// READ or atomic whose response is missing, it moves `comp_psn` up to that WQE:
    /// what is before it was acknowledged and leaves the queue, and a `comp_psn` left
    /// behind it would count those PSNs in flight for good (with a congestion window
    /// smaller than the gap, the retry of the READ could never be sent).
    fn cover(&mut self, psn: Psn) -> Covered {
        for w in self.req.sq.iter_mut() {
            if !w.assigned {
                break;
            }
            if matches!(w.state, WqeState::Done(_)) {
                continue;
            }
            if w.last_psn.is_after(psn) {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                if w.first_psn.is_after(self.req.comp_psn) {
                    self.req.comp_psn = w.first_psn;
                }
                return Covered::LostResponse;
            }
            // Every PSN of it was sent at least once (the responder acknowledges only what
            // it received), even if a retry was about to send it again.
            w.state = WqeState::Done(WcStatus::Success);
        }
        Covered::Ok
    }

    /// After `comp_psn` moved, skips packets of the WQE being resent that the responder
    /// has already acknowledged.
    fn skip_acked(&mut self) {
        let comp = self.req.comp_psn;
        if let Some(w) = self.req.sq.get_mut(self.req.cur)
            && w.assigned
            && w.state == WqeState::Sending
            && !w.wr.opcode.is_read_or_atomic()
            && !comp.is_before(w.first_psn)
            && !comp.is_after(w.last_psn)
        {
            w.next_pkt = w.next_pkt.max(comp.forward_from(w.first_psn));
        }
    }

    /// The responder made progress: advance `comp_psn`, reset the retry counters, and push
    /// the retransmit timer back (rxe re-arms it on every response).
    fn progress(&mut self, ctx: &mut Ctx, now: Time, next: Psn) {
        if next.is_after(self.req.comp_psn) {
            let acked = next.forward_from(self.req.comp_psn);
            self.req.comp_psn = next;
            self.req.on_acked(acked, ctx.cfg.max_inflight_psns);
            self.req.retrying = false;
            self.req.fast_backoff = 0;
            if let Some((p, t)) = self.req.probe
                && next.is_after(p)
            {
                self.req.probe = None;
                let ns = now.0.saturating_sub(t.0);
                self.req.sample_rtt(ns);
                ctx.rtt.note(now, ns);
            }
            // The round-trip timer went back N, and the answer came before any packet
            // was sent again: it answers what was sent before, which was late, not
            // lost. The device learns how late (Karn's rule keeps it from the QP's own
            // estimate), and every QP's timer waits that long for a while: such delays
            // come from what QPs share, the engine threads and the cores (bench qps:
            // 1000 QPs on a lossless link).
            if let Some(sent) = self.req.fast_fired.take() {
                ctx.rtt.note_late(now, now.0.saturating_sub(sent.0));
            }
            self.skip_acked();
        }
        self.req.reset_retries(&self.attr);
        self.rearm(ctx, now);
    }

    pub(crate) fn rearm(&mut self, ctx: &mut Ctx, now: Time) {
        self.req.timer = if self.req.inflight() > 0 && self.attr.timeout != 0 {
            Some(now.add_nanos(timeout_ns(self.attr.timeout)))
        } else {
            None
        };
        let m = ctx.rtt.recent(now);
        self.req.arm_fast(now, &self.attr, m);
    }

    fn on_ack(&mut self, ctx: &mut Ctx, now: Time, psn: Psn, s: Syndrome) {
        match s {
            Syndrome::Ack { .. } => {
                if psn.is_before(self.req.comp_psn.sub(1)) {
                    ctx.counters.drop_stale_response += 1;
                    return;
                }
                match self.cover(psn) {
                    Covered::Ok => self.progress(ctx, now, psn.next()),
                    Covered::LostResponse => self.retry(ctx, now, false),
                }
            }
            Syndrome::RnrNak { timer } => {
                ctx.counters.rcvd_rnr_err += 1;
                let _ = self.cover(psn.sub(1));
                if psn.is_after(self.req.comp_psn) {
                    self.req.comp_psn = psn;
                }
                if self.req.rnr_left == 0 {
                    ctx.counters.retry_rnr_exceeded_err += 1;
                    self.fail_at(ctx, now, psn, WcStatus::RnrRetryExcErr);
                    return;
                }
                if self.req.rnr_left != 7 {
                    self.req.rnr_left -= 1;
                }
                // rxe waits what the NAK's timer code says, not its own min_rnr_timer.
                self.req.rnr_until = Some(now.add_nanos(rnr_timer_ns(timer)));
                self.rewind(self.req.comp_psn);
                self.rearm(ctx, now);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                if psn.is_after(self.req.comp_psn) {
                    ctx.counters.rcvd_seq_err += 1;
                    if let Covered::LostResponse = self.cover(psn.sub(1)) {
                        self.retry(ctx, now, false);
                        return;
                    }
                    // The NAK acknowledges everything before its PSN: progress, so the
                    // retry counters start again (retry_cnt bounds retries without it).
                    self.req.comp_psn = psn;
                    self.req.retrying = false;
                    self.req.reset_retries(&self.attr);
                }
                self.retry(ctx, now, false);
            }
            Syndrome::Nak(code) => {
                let _ = self.cover(psn.sub(1));
                let st = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail_at(ctx, now, psn, st);
            }
            Syndrome::Reserved(_) => ctx.counters.drop_stale_response += 1,
        }
    }

    fn on_read_response(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        psn: Psn,
        pos: Position,
        payload: Pieces<'_>,
    ) {
        // The WQE this response belongs to: the first unfinished one ending at or after psn.
        let Some(idx) = self.req.sq.iter().position(|w| {
            w.assigned && !matches!(w.state, WqeState::Done(_)) && !w.last_psn.is_before(psn)
        }) else {
            ctx.counters.drop_stale_response += 1;
            return;
        };
        let w = &self.req.sq[idx];
        if w.wr.opcode != WrOpcode::RdmaRead || psn.is_before(w.first_psn) {
            ctx.counters.drop_stale_response += 1;
            return;
        }
        // The response expected next for this READ: its first PSN if nothing before it is
        // acknowledged yet (lost ACKs of earlier WQEs are implied by this response), else
        // the oldest unacknowledged PSN.
        let expect = if self.req.comp_psn.is_before(w.first_psn) {
            w.first_psn
        } else {
            self.req.comp_psn
        };
        if psn.is_before(expect) {
            ctx.counters.drop_stale_response += 1;
            return;
        }
        if psn.is_after(expect) {
            // A response before this one was lost: re-request the rest now.
            self.retry(ctx, now, false);
            return;
        }
        // Everything before this READ is acknowledged by its response.
        if let Covered::LostResponse = self.cover(psn.sub(1)) {
            self.retry(ctx, now, false);
            return;
        }
        let mtu = u64::from(self.mtu(ctx));
        let w = &self.req.sq[idx];
        let k = u64::from(psn.forward_from(w.first_psn));
        let off = k * mtu;
        let want = (w.length.saturating_sub(off)).min(mtu);
        let restart = w.read_pos.is_none();
        let seq_ok = match w.read_pos {
            // The first response to a (re-)request. A re-request from the middle is
            // answered MIDDLE..LAST by rxe, FIRST..LAST by others: accept both.
            None => match pos {
                Position::First | Position::Only => true,
                Position::Middle | Position::Last => k > 0,
            },
            Some(Position::First | Position::Middle) => {
                matches!(pos, Position::Middle | Position::Last)
            }
            Some(_) => false,
        };
        let len_ok = match pos {
            Position::First | Position::Middle => {
                payload.len() as u64 == mtu && off + mtu < w.length
            }
            Position::Last | Position::Only => {
                payload.len() as u64 == want && off + want == w.length
            }
        };
        let _ = restart;
        if !seq_ok || !len_ok {
            self.fail_at(ctx, now, psn, WcStatus::BadRespErr);
            return;
        }
        if w.segs.scatter_payload(&ctx.mrs, off, payload).is_err() {
            self.fail_at(ctx, now, psn, WcStatus::LocProtErr);
            return;
        }
        let w = &mut self.req.sq[idx];
        w.read_pos = Some(pos);
        if pos.ends() {
            w.state = WqeState::Done(WcStatus::Success);
            if w.holds_rd {
                w.holds_rd = false;
                self.req.rd_out = self.req.rd_out.saturating_sub(1);
            }
        }
        self.progress(ctx, now, psn.next());
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx, now: Time, psn: Psn, orig: u64) {
        let Some(idx) = self.req.sq.iter().position(|w| {
            w.assigned && !matches!(w.state, WqeState::Done(_)) && !w.last_psn.is_before(psn)
        }) else {
            ctx.counters.drop_stale_response += 1;
            return;
        };
        let w = &self.req.sq[idx];
        if !w.wr.opcode.is_atomic() || w.first_psn != psn || psn.is_before(self.req.comp_psn) {
            ctx.counters.drop_stale_response += 1;
            return;
        }
        if let Covered::LostResponse = self.cover(psn.sub(1)) {
            self.retry(ctx, now, false);
            return;
        }
        // The original value lands in the result buffer in host byte order, as ibverbs
        // applications read it (rxe does the same).
        if self.req.sq[idx]
            .segs
            .scatter(&ctx.mrs, 0, &orig.to_ne_bytes())
            .is_err()
        {
            self.fail_at(ctx, now, psn, WcStatus::LocProtErr);
            return;
        }
        let w = &mut self.req.sq[idx];
        w.state = WqeState::Done(WcStatus::Success);
        if w.holds_rd {
            w.holds_rd = false;
            self.req.rd_out = self.req.rd_out.saturating_sub(1);
        }
        self.progress(ctx, now, psn.next());
    }

    /// Completes the WQE that holds `psn` (or the oldest unfinished one) with `status`;
    /// the QP goes to ERR and the rest is flushed.
    fn fail_at(&mut self, ctx: &mut Ctx, now: Time, psn: Psn, status: WcStatus) {
        let idx = self
            .req
            .sq
            .iter()
            .position(|w| {
                w.assigned && !matches!(w.state, WqeState::Done(_)) && !w.last_psn.is_before(psn)
            })
            .or_else(|| {
                self.req
                    .sq
                    .iter()
                    .position(|w| !matches!(w.state, WqeState::Done(_)))
            });
        if let Some(i) = idx {
            self.req.sq[i].state = WqeState::Done(status);
            for w in self.req.sq.iter_mut().take(i) {
                if !matches!(w.state, WqeState::Done(_)) {
                    w.state = WqeState::Done(WcStatus::WrFlushErr);
                }
            }
        }
        self.retire_send(ctx, now);
        if self.state != QpState::Err {
            self.fatal(ctx, now, true);
        }
    }

    /// Starts a go-back-N retry from `comp_psn`, or fails the QP if retries are used up.
    pub(crate) fn retry(&mut self, ctx: &mut Ctx, now: Time, from_timeout: bool) {
        if self.req.inflight() == 0 {
            return;
        }
        if self.req.retrying && !from_timeout {
            return;
        }
        if self.req.retry_left == 0 {
            ctx.counters.retry_exceeded_err += 1;
            let psn = self.req.comp_psn;
            self.fail_at(ctx, now, psn, WcStatus::RetryExcErr);
            return;
        }
        if !(self.attr.retry_cnt == 7 && ctx.cfg.retry_cnt_7_infinite) {
            self.req.retry_left -= 1;
        }
        ctx.counters.completer_retry_err += 1;
        self.go_back(ctx, now);
        self.req.timer = if self.attr.timeout != 0 {
            Some(now.add_nanos(timeout_ns(self.attr.timeout)))
        } else {
            None
        };
    }

    /// Goes back N from `comp_psn` and restarts the round-trip timer: the step every
    /// retry shares (a NAK, a timeout, the round-trip timer).
    fn go_back(&mut self, ctx: &mut Ctx, now: Time) {
        if self.qp_type == QpType::Rc {
            self.req.on_loss(ctx.cfg.max_inflight_psns);
        }
        self.req.retrying = true;
        self.rewind(self.req.comp_psn);
        let m = ctx.rtt.recent(now);
        self.req.arm_fast(now, &self.attr, m);
    }

    /// Sets the send queue back so the next packet sent is `psn`'s (IBA 9.7.4.2.6).
    fn rewind(&mut self, psn: Psn) {
        let Some(first) = self.req.sq.iter().position(|w| {
            w.assigned && !matches!(w.state, WqeState::Done(_)) && !w.last_psn.is_before(psn)
        }) else {
            return;
        };
        for (i, w) in self.req.sq.iter_mut().enumerate().skip(first) {
            if !w.assigned || matches!(w.state, WqeState::Done(_)) {
                continue;
            }
            let k = if i == first && !psn.is_before(w.first_psn) {
                psn.forward_from(w.first_psn)
            } else {
                0
            };
            w.state = WqeState::Sending;
            if w.wr.opcode == WrOpcode::RdmaRead {
                // Keep the data already placed: re-request from the first missing PSN.
                w.read_from = k;
                w.read_pos = None;
                w.next_pkt = 0;
            } else if w.wr.opcode.is_atomic() {
                w.next_pkt = 0;
            } else {
                w.next_pkt = k;
            }
        }
        self.req.cur = first;
        self.req.noack = 0;
        // Karn: a round trip that may have been answered by a retransmission is no sample.
        self.req.probe = None;
    }

    /// Timers of this QP that are due.
    pub(crate) fn handle_timer(&mut self, ctx: &mut Ctx, now: Time) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            if matches!(self.state, QpState::Rts | QpState::Sqd) && self.req.inflight() > 0 {
                ctx.counters.timeouts += 1;
                self.retry(ctx, now, true);
            }
        }
        if self.req.fast_timer.is_some_and(|t| t <= now) {
            self.req.fast_timer = None;
            // Nothing came back within a few round trips: the last packets or their
            // ACK or NAK were lost (a responder NAKs a gap once, IBA 9.7.5.1.2). Go back
            // now rather than at the QP's timeout, which stays armed and alone counts
            // against retry_cnt (a dead peer still fails after retry_cnt timeouts).
            // Not when a READ or atomic is the oldest outstanding: its answer can be
            // a long response stream the responder sends in PSN order after what it
            // owes before it, and asking again would have all of it sent twice.
            let read_first = self
                .req
                .sq
                .iter()
                .find(|w| w.assigned && !matches!(w.state, WqeState::Done(_)))
                .is_some_and(|w| w.wr.opcode.is_read_or_atomic());
            if matches!(self.state, QpState::Rts | QpState::Sqd)
                && self.req.inflight() > 0
                && self.req.rnr_until.is_none()
                && !read_first
            {
                ctx.counters.fast_retransmits += 1;
                self.req.fast_fired = Some(self.req.last_sent);
                self.req.fast_backoff = (self.req.fast_backoff + 1).min(16);
                self.go_back(ctx, now);
            }
        }
    }
}

//! A queue pair: its attributes, state, path, and the three roles that run on it (the
//! requester and completer share the send queue; the responder owns the receive side).

use super::requester::Requester;
use super::responder::Responder;
use super::{Counters, Ctx};
use crate::time::Time;
use crate::verbs::device::ip_of;
use crate::verbs::{
    AddressVector, AsyncEvent, Error, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, Wc, WcStatus,
};
use crate::wire::ip::{Ipv4Repr, Ipv6Repr};
use crate::wire::{BthRepr, EthRepr, ExtRepr, FrameTemplate, IpRepr, PiecesMut, RoceRepr, UdpRepr};
use std::net::IpAddr;

/// The resolved route of a connected QP (or the last UD destination): the prepared
/// Ethernet/IP/UDP headers and the addresses packets are checked against.
#[derive(Debug, Clone)]
pub(crate) struct Path {
    pub av: AddressVector,
    pub tpl: FrameTemplate,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
}

/// The UDP source port of a QP, as rxe picks it (`rxe_qp.c`): for a connected QP from
/// the flow label, or from both QP numbers when it is 0 (`rdma_get_udp_sport`); for UD
/// `0xC000 + hash_32(qpn, 14)`. ECMP and RSS then keep each QP on one path and queue.
pub fn udp_sport(qp_type: QpType, qpn: u32, dest_qpn: u32, flow_label: u32) -> u16 {
    match qp_type {
        QpType::Ud => 0xc000 + (((qpn.wrapping_mul(0x61c8_8647)) >> (32 - 14)) & 0x3fff) as u16,
        QpType::Rc | QpType::Uc => {
            let fl = if flow_label != 0 {
                flow_label & 0xf_ffff
            } else {
                let mut v = u64::from(qpn) * u64::from(dest_qpn);
                v ^= v >> 20;
                v ^= v >> 40;
                (v & 0xf_ffff) as u32
            };
            (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
        }
    }
}

/// Builds the path to `av` from the GID table and the neighbour table, with UDP source
/// port `sport`.
pub(crate) fn resolve_path(ctx: &Ctx, av: &AddressVector, sport: u16) -> Result<Path, Error> {
    let sgid = ctx
        .gids
        .get(usize::from(av.sgid_index))
        .ok_or(Error::BadGidIndex(av.sgid_index))?;
    let src_ip = ip_of(sgid);
    let dst_ip = ip_of(&av.dgid);
    let dmac = match (av.dmac, ctx.neighbors.get(&dst_ip)) {
        (Some(m), _) => m,
        (None, Some(m)) => *m,
        (None, None) if ctx.cfg.udp_link => crate::link::udp::PEER_MAC,
        (None, None) => return Err(Error::NoNeighbor(dst_ip)),
    };
    let sport = if ctx.cfg.udp_link {
        crate::wire::ROCE_V2_PORT
    } else {
        sport
    };
    // A GID of a VLAN subinterface: its frames carry the tag, the priority from the SL
    // (as a NIC maps SL to the 802.1p class).
    let vlan = ctx
        .gid_vlans
        .get(usize::from(av.sgid_index))
        .copied()
        .flatten()
        .map(|vid| crate::wire::VlanTag {
            pcp: av.sl & 7,
            dei: false,
            vid,
        });
    let eth = EthRepr {
        dst: dmac,
        src: ctx.cfg.mac,
        vlan,
        ethertype: 0,
    };
    let hop = if av.hop_limit == 0 { 64 } else { av.hop_limit };
    let ip = match (src_ip, dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut r = Ipv4Repr::new(s, d, 0);
            r.ttl = hop;
            r.dscp = av.traffic_class >> 2;
            r.ecn = av.traffic_class & 3;
            IpRepr::V4(r)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
            src: s,
            dst: d,
            traffic_class: av.traffic_class,
            // rxe sends flow label 0 (the label only seeds the UDP port).
            flow_label: 0,
            hop_limit: hop,
        }),
        _ => {
            return Err(Error::InvalidAttribute {
                name: "ah_attr.dgid",
                value: 0,
                reason: "the destination and the source GID are of different IP versions",
            });
        }
    };
    let udp = UdpRepr {
        src_port: sport,
        dst_port: crate::wire::ROCE_V2_PORT,
    };
    let tpl = FrameTemplate::new(&eth, &ip, &udp).map_err(|_| Error::InvalidAttribute {
        name: "ah_attr",
        value: 0,
        reason: "cannot build headers for this address",
    })?;
    Ok(Path {
        av: *av,
        tpl,
        src_ip,
        dst_ip,
    })
}

pub(crate) struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub sq_sig_all: bool,
    pub cap: QpCap,
    pub attr: QpAttr,
    /// Set at INIT -> RTR for RC/UC; for UD the last destination used.
    pub path: Option<Path>,
    pub sport: u16,
    pub req: Requester,
    pub resp: Responder,
    /// On the engine's transmit queue.
    pub in_ready: bool,
    /// The earliest deadline of this QP in the engine's timer heap.
    pub timer_at: Option<Time>,
    pub comm_est: bool,
    /// On the engine's list of QPs that may have changed.
    pub touched: bool,
    /// (state, send WQEs done, receive WQEs done) as `take_touched_qps` last handed
    /// them out: a QP touched by a turn that changed none of them (an ACK that
    /// completes nothing, a retransmission) is not handed out again.
    pub published: Option<(QpState, u64, u64)>,
}

impl Qp {
    pub fn new(qpn: u32, init: &crate::verbs::QpInitAttr) -> Qp {
        Qp {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            sq_sig_all: init.sq_sig_all,
            cap: init.cap,
            attr: QpAttr {
                cap: init.cap,
                ..QpAttr::default()
            },
            path: None,
            sport: udp_sport(init.qp_type, qpn, 0, 0),
            req: Requester::default(),
            resp: Responder::default(),
            in_ready: false,
            timer_at: None,
            comm_est: false,
            touched: false,
            published: None,
        }
    }

    /// The path MTU in bytes: the QP's for RC/UC, the port's for UD (rxe does the same).
    pub fn mtu(&self, ctx: &Ctx) -> u32 {
        match self.qp_type {
            QpType::Ud => ctx.cfg.port_mtu.bytes(),
            _ => self.attr.path_mtu.bytes().min(ctx.cfg.port_mtu.bytes()),
        }
    }

    /// Writes a packet of this QP: the path's headers, `bth` and `ext`, and `payload_len`
    /// bytes that `fill` writes in place (in the one or two pieces of `buf` they lie in).
    /// `None` if the QP has no path or `buf` is small.
    pub fn emit(
        &self,
        counters: &mut Counters,
        buf: &mut PiecesMut<'_>,
        bth: BthRepr,
        ext: ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(PiecesMut<'_>),
    ) -> Option<usize> {
        self.try_emit(counters, buf, bth, ext, payload_len, |d| {
            fill(d);
            Ok::<(), std::convert::Infallible>(())
        })?
        .ok()
    }

    /// [`emit`](Self::emit) with a `fill` that may fail (the message's buffers are no
    /// longer readable): `Some(Err(e))` then, and the frame left in `buf` is not one to
    /// send (nor counted as sent). The requester reads its buffers this way once per
    /// packet, where it used to check them and then read them, walking the same regions
    /// twice.
    pub fn try_emit<E>(
        &self,
        counters: &mut Counters,
        buf: &mut PiecesMut<'_>,
        bth: BthRepr,
        ext: ExtRepr,
        payload_len: usize,
        fill: impl FnOnce(PiecesMut<'_>) -> Result<(), E>,
    ) -> Option<Result<usize, E>> {
        let path = self.path.as_ref()?;
        let roce = RoceRepr {
            bth,
            ext,
            payload: &[],
        };
        let id = Ctx::next_ip_id();
        let (head, tail) = (&mut *buf.first, &mut *buf.rest);
        let Ok(l) = path.tpl.start(head, tail, id, &roce, payload_len) else {
            counters.send_err += 1;
            return None;
        };
        if let Err(e) = fill(l.payload(head, tail)) {
            return Some(Err(e));
        }
        match path.tpl.finish(&l, head, tail) {
            Ok(n) => {
                counters.sent_pkts += 1;
                Some(Ok(n))
            }
            Err(_) => {
                counters.send_err += 1;
                None
            }
        }
    }

    /// Applies a checked `modify_qp`.
    pub fn modify(
        &mut self,
        ctx: &mut Ctx,
        attr: &QpAttr,
        mask: M,
        now: Time,
    ) -> Result<(), Error> {
        let cur = if mask.contains(M::CUR_STATE) {
            attr.cur_qp_state
        } else {
            self.state
        };
        if mask.contains(M::CUR_STATE) && cur != self.state {
            return Err(Error::WrongState {
                qpn: self.qpn,
                state: self.state,
                why: "cur_qp_state does not match the QP's state",
            });
        }
        let next = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            cur
        };
        crate::verbs::qp::check_transition(self.qp_type, cur, next, mask)?;
        crate::verbs::qp::check_values(attr, mask, ctx.cfg.limits.max_qp_rd_atom)?;
        if cur == QpState::Sqd && self.req.draining() && next != QpState::Err {
            return Err(Error::WrongState {
                qpn: self.qpn,
                state: cur,
                why: "the send queue is still draining; only ERR is allowed",
            });
        }
        if mask.contains(M::PATH_MTU) && attr.path_mtu > ctx.cfg.port_mtu {
            return Err(Error::InvalidAttribute {
                name: "path_mtu",
                value: u64::from(attr.path_mtu.bytes()),
                reason: "larger than the port's active MTU",
            });
        }
        // Resolve the path before changing anything, so a failure leaves the QP as it was.
        let new_path = if mask.contains(M::AV) {
            let dest = if mask.contains(M::DEST_QPN) {
                attr.dest_qp_num
            } else {
                self.attr.dest_qp_num
            };
            let sport = udp_sport(self.qp_type, self.qpn, dest, attr.ah_attr.flow_label);
            Some((sport, resolve_path(ctx, &attr.ah_attr, sport)?))
        } else {
            None
        };

        let a = &mut self.attr;
        if mask.contains(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if mask.contains(M::PORT) {
            a.port_num = attr.port_num;
        }
        if mask.contains(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if mask.contains(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if mask.contains(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if mask.contains(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
        }
        if mask.contains(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
        }
        if mask.contains(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        if let Some((sport, path)) = new_path {
            a.ah_attr = attr.ah_attr;
            self.sport = sport;
            self.path = Some(path);
        }
        if mask.contains(M::RQ_PSN) {
            self.resp.set_epsn(attr.rq_psn);
        }
        if mask.contains(M::SQ_PSN) {
            self.req.set_psn(attr.sq_psn);
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            self.resp.set_resources(attr.max_dest_rd_atomic);
        }
        if mask.intersects(M::RETRY_CNT | M::RNR_RETRY) {
            self.req.reset_retries(&self.attr);
        }
        self.state = next;
        self.attr.qp_state = next;
        match next {
            QpState::Reset => self.reset(ctx),
            QpState::Err => self.enter_error(ctx, now),
            QpState::Sqd => self.req.start_drain(),
            QpState::Rts if cur == QpState::Sqd || cur == QpState::Sqe => self.req.end_drain(),
            _ => {}
        }
        Ok(())
    }

    /// Back to RESET: every queue emptied without completions, counters of the
    /// connection zeroed (rxe `rxe_qp_reset`).
    fn reset(&mut self, ctx: &mut Ctx) {
        // Dropped WQEs count as finished, so a runtime mirroring occupancy stays right.
        let sq_done = self.req.done + self.req.sq.len() as u64;
        let rq_done = self.resp.done + self.resp.rq.len() as u64;
        self.req = Requester::default();
        self.req.done = sq_done;
        self.resp.reset(ctx);
        self.resp.done = rq_done;
        self.path = if self.qp_type == QpType::Ud {
            None
        } else {
            self.path.take()
        };
        self.comm_est = false;
        self.attr = QpAttr {
            cap: self.cap,
            ..QpAttr::default()
        };
    }

    /// Moves the QP to ERR: every outstanding send WR and receive WR completes with
    /// WR_FLUSH_ERR (IBA 10.3.1).
    pub fn enter_error(&mut self, ctx: &mut Ctx, now: Time) {
        let _ = now;
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.req.flush(ctx, self.qpn, self.send_cq);
        self.resp.flush(ctx, self.qpn, self.recv_cq, self.srq);
    }

    /// A local or remote error made this QP unusable: ERR and an async event. For UC and
    /// UD a send-side error only takes the send queue down (SQE), per IBA 10.3.1.
    pub fn fatal(&mut self, ctx: &mut Ctx, now: Time, send_side: bool) {
        if self.state == QpState::Err {
            return;
        }
        if send_side && self.qp_type != QpType::Rc {
            self.state = QpState::Sqe;
            self.attr.qp_state = QpState::Sqe;
            self.req.flush(ctx, self.qpn, self.send_cq);
        } else {
            self.enter_error(ctx, now);
        }
        ctx.events.push_back(AsyncEvent::QpFatal { qpn: self.qpn });
    }

    /// True when the QP has a packet to send now.
    pub fn wants_tx(&self, now: Time) -> bool {
        self.resp.has_output() || self.req.has_work(self, now)
    }

    /// The next time this QP's timers need attention.
    pub fn deadline(&self) -> Option<Time> {
        self.req.deadline()
    }

    /// A flush completion for a WR of this QP.
    pub fn flush_wc(qpn: u32, wr_id: u64, opcode: crate::verbs::WcOpcode) -> Wc {
        Wc::new(qpn, wr_id, opcode, WcStatus::WrFlushErr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_source_ports_match_rxe() {
        // Seen in rxe captures: RC QP 0x11 <-> 0x11 uses 49441, QP1 (UD) 55410.
        assert_eq!(udp_sport(QpType::Rc, 0x11, 0x11, 0), 49441);
        assert_eq!(udp_sport(QpType::Ud, 1, 0, 0), 55410);
        for q in 0..5000 {
            assert!(udp_sport(QpType::Ud, q, 0, 0) >= 0xc000);
            assert!(udp_sport(QpType::Rc, q, q + 1, 0) >= 0xc000);
        }
    }
}

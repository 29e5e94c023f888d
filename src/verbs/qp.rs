//! Queue pair attributes and the state machine of `ibv_modify_qp`.
//!
//! [`check_transition`] is the table of the kernel's `ib_modify_qp_is_ok()` (from IBA
//! table 91): for each (current state, next state, QP type) whether the transition is
//! allowed, which attributes it requires and which it may also set. A call that breaks it
//! fails with an error naming the transition and the attributes at fault.

use super::Error;
use super::device::Gid;
use super::types::{AccessFlags, Mtu, QpAttrMask as M, QpState, QpType};

/// Where a connected QP sends (`ibv_ah_attr` with its GRH, for RoCEv2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// The destination GID: an IPv6 address, or `::ffff:a.b.c.d` for IPv4.
    pub dgid: Gid,
    /// Index of the source GID in the local GID table.
    pub sgid_index: u8,
    /// IPv4 TTL / IPv6 hop limit (rxe sends 64 whatever is asked; 0 means 64 here).
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label; also seeds the UDP source port when non-zero.
    pub flow_label: u32,
    /// Service level (no meaning on Ethernet; kept for ibverbs parity).
    pub sl: u8,
    /// The next hop's MAC. `None`: the engine's neighbour table must know it.
    pub dmac: Option<[u8; 6]>,
}

impl AddressVector {
    /// An address vector to `dgid` from local GID `sgid_index`.
    pub fn new(dgid: Gid, sgid_index: u8) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
            dmac: None,
        }
    }
    pub fn with_dmac(mut self, mac: [u8; 6]) -> AddressVector {
        self.dmac = Some(mac);
        self
    }
}

/// Queue sizes (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// What `create_qp` needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub pd: u32,
    pub send_cq: u32,
    pub recv_cq: u32,
    /// Receive from this SRQ instead of the QP's own receive queue.
    pub srq: Option<u32>,
    pub cap: QpCap,
    /// Every send WR completes signaled.
    pub sq_sig_all: bool,
}

impl QpInitAttr {
    pub fn new(qp_type: QpType, pd: u32, cq: u32) -> QpInitAttr {
        QpInitAttr {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}

/// QP attributes (`ibv_qp_attr`); `modify_qp` reads those named by its mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: u32,
    /// Expected PSN of the first request the responder receives.
    pub rq_psn: u32,
    /// PSN of the first request the requester sends.
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: AccessFlags,
    pub cap: QpCap,
    pub ah_attr: AddressVector,
    pub pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    /// READs and atomics this QP may have outstanding as requester.
    pub max_rd_atomic: u8,
    /// READs and atomics this QP accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this responder sends (IBA table 45).
    pub min_rnr_timer: u8,
    pub port_num: u8,
    /// Local ACK timeout: 4.096 us x 2^timeout; 0 means no retransmit timer.
    pub timeout: u8,
    /// Retries after a timeout or a PSN sequence NAK (0-7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (0-7; 7 means unlimited, IBA 9.7.5.2.8).
    pub rnr_retry: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::EMPTY,
            cap: QpCap::default(),
            ah_attr: AddressVector::new([0; 16], 0),
            pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
        }
    }
}

/// Required and optional attributes of one transition for one QP type.
#[derive(Debug, Clone, Copy)]
pub struct TransitionRule {
    pub required: M,
    pub optional: M,
}

const fn m(bits: u32) -> M {
    M(bits)
}

/// The rule for `cur -> next` on a `t` QP, or `None` if the transition is not allowed.
/// Every allowed transition also accepts `STATE` (it names the next state).
pub fn transition_rule(t: QpType, cur: QpState, next: QpState) -> Option<TransitionRule> {
    use QpState::*;
    use QpType::*;
    let r = |required: u32, optional: u32| {
        Some(TransitionRule {
            required: m(required),
            optional: m(optional),
        })
    };
    let (pkey, port, qkey, access) = (M::PKEY_INDEX.0, M::PORT.0, M::QKEY.0, M::ACCESS_FLAGS.0);
    let cur_state = M::CUR_STATE.0;
    let (alt, mig) = (M::ALT_PATH.0, M::PATH_MIG_STATE.0);
    match (cur, next) {
        // Any state may go to RESET or ERR with no attributes.
        (_, Reset) | (_, Err) => r(0, 0),
        (Reset, Init) => match t {
            Ud => r(pkey | port | qkey, 0),
            Uc | Rc => r(pkey | port | access, 0),
        },
        (Init, Init) => match t {
            Ud => r(0, pkey | port | qkey),
            Uc | Rc => r(0, pkey | port | access),
        },
        (Init, Rtr) => match t {
            Ud => r(0, pkey | qkey),
            Uc => r(
                M::AV.0 | M::PATH_MTU.0 | M::DEST_QPN.0 | M::RQ_PSN.0,
                alt | access | pkey,
            ),
            Rc => r(
                M::AV.0
                    | M::PATH_MTU.0
                    | M::DEST_QPN.0
                    | M::RQ_PSN.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | M::MIN_RNR_TIMER.0,
                alt | access | pkey,
            ),
        },
        (Rtr, Rts) => match t {
            Ud => r(M::SQ_PSN.0, cur_state | qkey),
            Uc => r(M::SQ_PSN.0, cur_state | alt | access | mig),
            Rc => r(
                M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::SQ_PSN.0
                    | M::MAX_QP_RD_ATOMIC.0,
                cur_state | alt | access | M::MIN_RNR_TIMER.0 | mig,
            ),
        },
        (Rts, Rts) => match t {
            Ud => r(0, cur_state | qkey),
            Uc => r(0, cur_state | access | alt | mig),
            Rc => r(0, cur_state | access | alt | mig | M::MIN_RNR_TIMER.0),
        },
        (Rts, Sqd) => r(0, M::EN_SQD_ASYNC_NOTIFY.0),
        (Sqd, Rts) => match t {
            Ud => r(0, cur_state | qkey),
            Uc => r(0, cur_state | alt | access | mig),
            Rc => r(0, cur_state | alt | access | M::MIN_RNR_TIMER.0 | mig),
        },
        (Sqd, Sqd) => match t {
            Ud => r(0, pkey | qkey),
            Uc => r(0, M::AV.0 | alt | access | pkey | mig),
            Rc => r(
                0,
                port | M::AV.0
                    | M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::MAX_QP_RD_ATOMIC.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | alt
                    | access
                    | pkey
                    | M::MIN_RNR_TIMER.0
                    | mig,
            ),
        },
        // SQE exists for UC and UD only: their send queue can fail alone.
        (Sqe, Rts) => match t {
            Ud => r(0, cur_state | qkey),
            Uc => r(0, cur_state | access),
            Rc => None,
        },
        _ => None,
    }
}

/// Checks a `modify_qp` call: the transition is allowed and `mask` holds every required
/// attribute and nothing else but optional ones.
pub fn check_transition(t: QpType, cur: QpState, next: QpState, mask: M) -> Result<(), Error> {
    let rule = transition_rule(t, cur, next).ok_or(Error::InvalidTransition {
        qp_type: t,
        from: cur,
        to: next,
    })?;
    let given = mask.without(M::STATE);
    let missing = rule.required.without(given);
    if missing != M::EMPTY {
        return Err(Error::MissingAttributes {
            qp_type: t,
            from: cur,
            to: next,
            missing,
        });
    }
    let extra = given.without(rule.required | rule.optional);
    if extra != M::EMPTY {
        return Err(Error::UnexpectedAttributes {
            qp_type: t,
            from: cur,
            to: next,
            extra,
        });
    }
    Ok(())
}

/// Checks the values of the attributes named by `mask`.
pub fn check_values(attr: &QpAttr, mask: M, max_rd_atom: u8) -> Result<(), Error> {
    let bad = |name: &'static str, value: u64, reason: &'static str| {
        Err(Error::InvalidAttribute {
            name,
            value,
            reason,
        })
    };
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("retry_cnt", attr.retry_cnt.into(), "must be 0-7");
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("rnr_retry", attr.rnr_retry.into(), "must be 0-7");
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("min_rnr_timer", attr.min_rnr_timer.into(), "must be 0-31");
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return bad("timeout", attr.timeout.into(), "must be 0-31");
    }
    if mask.contains(M::RQ_PSN) && attr.rq_psn > 0xff_ffff {
        return bad("rq_psn", attr.rq_psn.into(), "PSNs are 24 bits");
    }
    if mask.contains(M::SQ_PSN) && attr.sq_psn > 0xff_ffff {
        return bad("sq_psn", attr.sq_psn.into(), "PSNs are 24 bits");
    }
    if mask.contains(M::DEST_QPN) && (attr.dest_qp_num > 0xff_ffff || attr.dest_qp_num == 0) {
        return bad(
            "dest_qp_num",
            attr.dest_qp_num.into(),
            "must be a 24-bit QP number other than 0",
        );
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > max_rd_atom {
        return bad(
            "max_rd_atomic",
            attr.max_rd_atomic.into(),
            "larger than the device's max_qp_init_rd_atom",
        );
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > max_rd_atom {
        return bad(
            "max_dest_rd_atomic",
            attr.max_dest_rd_atomic.into(),
            "larger than the device's max_qp_rd_atom",
        );
    }
    if mask.contains(M::PKEY_INDEX) && attr.pkey_index != 0 {
        return bad(
            "pkey_index",
            attr.pkey_index.into(),
            "only index 0 (the default P_Key 0xffff) exists",
        );
    }
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return bad(
            "port_num",
            attr.port_num.into(),
            "the device has port 1 only",
        );
    }
    if mask.contains(M::ALT_PATH) {
        return bad("alt_path", 0, "alternate paths (APM) are not supported");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_rc_bring_up_is_allowed() {
        let t = QpType::Rc;
        check_transition(
            t,
            QpState::Reset,
            QpState::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
        check_transition(
            t,
            QpState::Init,
            QpState::Rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
        .unwrap();
        check_transition(
            t,
            QpState::Rtr,
            QpState::Rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
        check_transition(t, QpState::Rts, QpState::Err, M::STATE).unwrap();
        check_transition(t, QpState::Err, QpState::Reset, M::STATE).unwrap();
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = check_transition(QpType::Rc, QpState::Init, QpState::Rtr, M::STATE | M::AV)
            .unwrap_err();
        let s = e.to_string();
        assert!(s.contains("INIT -> RTR"), "{s}");
        assert!(
            s.contains("PATH_MTU") && s.contains("DEST_QPN") && s.contains("MIN_RNR_TIMER"),
            "{s}"
        );
        let e = check_transition(QpType::Rc, QpState::Reset, QpState::Rts, M::STATE).unwrap_err();
        assert!(matches!(e, Error::InvalidTransition { .. }));
        let e = check_transition(
            QpType::Ud,
            QpState::Reset,
            QpState::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY | M::ACCESS_FLAGS,
        )
        .unwrap_err();
        assert!(e.to_string().contains("ACCESS_FLAGS"), "{e}");
        assert!(check_transition(QpType::Rc, QpState::Sqe, QpState::Rts, M::STATE).is_err());
        assert!(check_transition(QpType::Uc, QpState::Sqe, QpState::Rts, M::STATE).is_ok());
        let a = QpAttr {
            retry_cnt: 8,
            ..QpAttr::default()
        };
        assert!(
            check_values(&a, M::RETRY_CNT, 16)
                .unwrap_err()
                .to_string()
                .contains("retry_cnt")
        );
    }
}

//! Counters, named like rxe's `hw_counters` (`rxe_hw_counters.c`) so that the names
//! users grep for mean the same thing here, plus drops by reason.
//!
//! rxe's `ack_deferred` is not kept: it counted rxe's completer being queued to a task
//! instead of run at once (RXE_CNT_COMPLETER_SCHED; rxe's "always defer tasks" patches
//! drop it). roce-xdp's completer handles every response as it arrives, so the counter
//! could never move.

/// Every counter the engine keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    // --- rxe's hw_counters, in rxe's order ---
    /// Packets sent: requests, ACKs, READ responses.
    pub sent_pkts: u64,
    /// Packets received that passed the header and ICRC checks.
    pub rcvd_pkts: u64,
    /// Responder: an RC request with a PSN already seen.
    pub duplicate_request: u64,
    /// Responder: an RC request ahead of the expected PSN (counted when the NAK is sent).
    pub out_of_seq_request: u64,
    /// Requester: RNR NAKs received.
    pub rcvd_rnr_err: u64,
    /// Responder: RNR NAKs sent (no receive WQE).
    pub send_rnr_err: u64,
    /// Requester: PSN sequence error NAKs received.
    pub rcvd_seq_err: u64,
    /// Requester: retries exhausted (RETRY_EXC_ERR).
    pub retry_exceeded_err: u64,
    /// Requester: RNR retries exhausted (RNR_RETRY_EXC_ERR).
    pub retry_rnr_exceeded_err: u64,
    /// Requester: retransmissions started (timeout, PSN NAK, lost READ response).
    pub completer_retry_err: u64,
    /// Frames that could not be built or handed to the link.
    pub send_err: u64,
    /// Times the port's interface lost its carrier or went down.
    pub link_downed: u64,
    /// Send WQEs of SEND opcodes completed (any status).
    pub rdma_sends: u64,
    /// Receive WQEs completed successfully.
    pub rdma_recvs: u64,

    // --- beyond rxe ---
    /// Request packets retransmitted.
    pub retransmitted_pkts: u64,
    /// Requester: retransmit timer expiries.
    pub timeouts: u64,
    /// Requester: go-back-N retransmissions started by the timer the measured round
    /// trip sets, before the QP's timeout (they do not use up retry_cnt).
    pub fast_retransmits: u64,
    /// NAKs sent, by kind.
    pub nak_seq_sent: u64,
    pub nak_inv_req_sent: u64,
    pub nak_rem_access_sent: u64,
    pub nak_rem_op_sent: u64,
    /// ACKs sent (including NAKs and atomic ACKs).
    pub acks_sent: u64,
    /// UD sends larger than the port MTU completed without a packet (C10-93.1.1).
    pub ud_too_long: u64,

    // --- drops by reason ---
    /// Not IP/UDP/4791: other traffic on the link.
    pub drop_not_roce: u64,
    /// Structurally invalid RoCEv2 (truncated, bad lengths, unknown opcode, ...).
    pub drop_malformed: u64,
    /// IPv4 header or UDP checksum wrong.
    pub drop_bad_checksum: u64,
    pub drop_bad_icrc: u64,
    /// Destination MAC or IP not ours.
    pub drop_not_for_us: u64,
    pub drop_unknown_qp: u64,
    /// The QP's state does not accept the packet.
    pub drop_wrong_state: u64,
    /// The opcode's transport does not match the QP's type.
    pub drop_wrong_transport: u64,
    /// Source/destination address differs from the connected QP's path.
    pub drop_wrong_path: u64,
    pub drop_bad_pkey: u64,
    pub drop_bad_qkey: u64,
    /// UC/UD: no receive WQE posted.
    pub drop_no_recv_wqe: u64,
    /// UC: packets of a message being dropped after a loss.
    pub drop_uc_msg: u64,
    /// Responses that match nothing outstanding (duplicates, stale).
    pub drop_stale_response: u64,
    /// Requests dropped silently by the responder (out of sequence after the NAK,
    /// unmatched duplicates).
    pub drop_silent_request: u64,
    /// READ and atomic requests dropped because max_dest_rd_atomic replies were queued.
    pub drop_rd_atomic_overflow: u64,
}

impl Counters {
    /// Every counter with its name, rxe's first.
    pub fn named(&self) -> [(&'static str, u64); 39] {
        [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("link_downed", self.link_downed),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("retransmitted_pkts", self.retransmitted_pkts),
            ("timeouts", self.timeouts),
            ("fast_retransmits", self.fast_retransmits),
            ("nak_seq_sent", self.nak_seq_sent),
            ("nak_inv_req_sent", self.nak_inv_req_sent),
            ("nak_rem_access_sent", self.nak_rem_access_sent),
            ("nak_rem_op_sent", self.nak_rem_op_sent),
            ("acks_sent", self.acks_sent),
            ("ud_too_long", self.ud_too_long),
            ("drop_not_roce", self.drop_not_roce),
            ("drop_malformed", self.drop_malformed),
            ("drop_bad_checksum", self.drop_bad_checksum),
            ("drop_bad_icrc", self.drop_bad_icrc),
            ("drop_not_for_us", self.drop_not_for_us),
            ("drop_unknown_qp", self.drop_unknown_qp),
            ("drop_wrong_state", self.drop_wrong_state),
            ("drop_wrong_transport", self.drop_wrong_transport),
            ("drop_wrong_path", self.drop_wrong_path),
            ("drop_bad_pkey", self.drop_bad_pkey),
            ("drop_bad_qkey", self.drop_bad_qkey),
            ("drop_no_recv_wqe", self.drop_no_recv_wqe),
            ("drop_uc_msg", self.drop_uc_msg),
            ("drop_stale_response", self.drop_stale_response),
            ("drop_silent_request", self.drop_silent_request),
            ("drop_rd_atomic_overflow", self.drop_rd_atomic_overflow),
        ]
    }

    /// What a counter of `named` means, in a few words (what `roce-xdp stats` prints
    /// beside it).
    pub fn help(name: &str) -> &'static str {
        match name {
            "sent_pkts" => "packets sent: requests, ACKs, READ responses",
            "rcvd_pkts" => "packets received that passed header and ICRC checks",
            "duplicate_request" => "responder: requests with a PSN already seen (a retransmission)",
            "out_of_seq_request" => {
                "responder: requests ahead of the expected PSN (a loss before them)"
            }
            "rcvd_rnr_err" => "requester: RNR NAKs received (the peer had no receive posted)",
            "send_rnr_err" => "responder: RNR NAKs sent (no receive posted here)",
            "rcvd_seq_err" => "requester: PSN sequence error NAKs received",
            "retry_exceeded_err" => "requester: QPs that ran out of retries (RETRY_EXC_ERR)",
            "retry_rnr_exceeded_err" => "requester: QPs that ran out of RNR retries",
            "completer_retry_err" => {
                "requester: retransmissions started (timeout, NAK, lost response)"
            }
            "send_err" => "frames that could not be built or sent",
            "link_downed" => "times the link went down",
            "rdma_sends" => "SEND work requests completed",
            "rdma_recvs" => "receive work requests completed",
            "retransmitted_pkts" => "request packets sent again",
            "timeouts" => "retransmit timer expiries",
            "fast_retransmits" => {
                "retransmissions after a few measured round trips without an answer"
            }
            "nak_seq_sent" => "PSN sequence error NAKs sent",
            "nak_inv_req_sent" => "invalid request NAKs sent",
            "nak_rem_access_sent" => "remote access error NAKs sent (bad R_Key, bounds, rights)",
            "nak_rem_op_sent" => "remote operational error NAKs sent",
            "acks_sent" => "ACKs sent (NAKs and atomic ACKs included)",
            "ud_too_long" => "UD sends larger than the MTU, completed without a packet",
            "drop_not_roce" => "frames dropped: not IP/UDP/4791",
            "drop_malformed" => "frames dropped: invalid RoCEv2 headers",
            "drop_bad_checksum" => "frames dropped: bad IPv4 or UDP checksum",
            "drop_bad_icrc" => "frames dropped: bad ICRC",
            "drop_not_for_us" => "frames dropped: MAC or IP not ours",
            "drop_unknown_qp" => "frames dropped: no such destination QP",
            "drop_wrong_state" => "frames dropped: the QP's state refuses them",
            "drop_wrong_transport" => "frames dropped: opcode of another transport",
            "drop_wrong_path" => "frames dropped: not from the connected peer",
            "drop_bad_pkey" => "frames dropped: P_Key mismatch",
            "drop_bad_qkey" => "frames dropped: Q_Key mismatch",
            "drop_no_recv_wqe" => "frames dropped: UC/UD with no receive posted",
            "drop_uc_msg" => "frames dropped: rest of a UC message after a loss",
            "drop_stale_response" => "frames dropped: responses matching nothing outstanding",
            "drop_silent_request" => "frames dropped: requests the responder ignores by rule",
            "drop_rd_atomic_overflow" => {
                "frames dropped: READ/atomic requests beyond max_dest_rd_atomic outstanding"
            }
            _ => "",
        }
    }

    /// Adds another engine's counters (the runtime's shards report one device).
    pub fn add(&mut self, o: &Counters) {
        self.sent_pkts += o.sent_pkts;
        self.rcvd_pkts += o.rcvd_pkts;
        self.duplicate_request += o.duplicate_request;
        self.out_of_seq_request += o.out_of_seq_request;
        self.rcvd_rnr_err += o.rcvd_rnr_err;
        self.send_rnr_err += o.send_rnr_err;
        self.rcvd_seq_err += o.rcvd_seq_err;
        self.retry_exceeded_err += o.retry_exceeded_err;
        self.retry_rnr_exceeded_err += o.retry_rnr_exceeded_err;
        self.completer_retry_err += o.completer_retry_err;
        self.send_err += o.send_err;
        self.link_downed += o.link_downed;
        self.rdma_sends += o.rdma_sends;
        self.rdma_recvs += o.rdma_recvs;
        self.retransmitted_pkts += o.retransmitted_pkts;
        self.timeouts += o.timeouts;
        self.fast_retransmits += o.fast_retransmits;
        self.nak_seq_sent += o.nak_seq_sent;
        self.nak_inv_req_sent += o.nak_inv_req_sent;
        self.nak_rem_access_sent += o.nak_rem_access_sent;
        self.nak_rem_op_sent += o.nak_rem_op_sent;
        self.acks_sent += o.acks_sent;
        self.ud_too_long += o.ud_too_long;
        self.drop_not_roce += o.drop_not_roce;
        self.drop_malformed += o.drop_malformed;
        self.drop_bad_checksum += o.drop_bad_checksum;
        self.drop_bad_icrc += o.drop_bad_icrc;
        self.drop_not_for_us += o.drop_not_for_us;
        self.drop_unknown_qp += o.drop_unknown_qp;
        self.drop_wrong_state += o.drop_wrong_state;
        self.drop_wrong_transport += o.drop_wrong_transport;
        self.drop_wrong_path += o.drop_wrong_path;
        self.drop_bad_pkey += o.drop_bad_pkey;
        self.drop_bad_qkey += o.drop_bad_qkey;
        self.drop_no_recv_wqe += o.drop_no_recv_wqe;
        self.drop_uc_msg += o.drop_uc_msg;
        self.drop_stale_response += o.drop_stale_response;
        self.drop_silent_request += o.drop_silent_request;
        self.drop_rd_atomic_overflow += o.drop_rd_atomic_overflow;
    }

    /// All drops added up.
    pub fn drops(&self) -> u64 {
        self.drop_not_roce
            + self.drop_malformed
            + self.drop_bad_checksum
            + self.drop_bad_icrc
            + self.drop_not_for_us
            + self.drop_unknown_qp
            + self.drop_wrong_state
            + self.drop_wrong_transport
            + self.drop_wrong_path
            + self.drop_bad_pkey
            + self.drop_bad_qkey
            + self.drop_no_recv_wqe
            + self.drop_uc_msg
            + self.drop_stale_response
            + self.drop_silent_request
            + self.drop_rd_atomic_overflow
    }
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (n, v) in self.named() {
            if v != 0 {
                writeln!(f, "{n:<24} {v}")?;
            }
        }
        Ok(())
    }
}

//! The Communication Manager on QP1, the General Services QP (IBA 12, 13.4-13.5): how
//! rdma_cm connects RC and UC QPs (REQ, MRA, REP, RTU, REJ, DREQ, DREP) and resolves the
//! UD QP behind a service ID (SIDR_REQ, SIDR_REP).
//!
//! Sans-IO like the rest of the engine: MADs arrive through [`Cm::handle_frame`], timers
//! through [`Cm::handle_timeout`]; MADs leave through [`Cm::poll_transmit`] and what the
//! consumer must hear through [`Cm::poll_event`]. The consumer (the runtime, for rdma_cm)
//! moves its QPs through INIT, RTR and RTS itself with what the events carry, as
//! librdmacm does over the kernel's CM; the CM only speaks the protocol.
//!
//! Following the kernel's `ib_cm` where IBA leaves a choice:
//! - a REQ nobody listens for is refused with REJ "invalid service ID" (8), but not at
//!   once: it is kept for [`UNHEARD_HOLD_MAX`] (at most half the response time the REQ
//!   gives the CM), and a listener that comes in that time gets it. Programs that sync
//!   over one connection and then listen for the next (perftest `-R`: the server
//!   listens only after the handshake the client connects right after) would otherwise
//!   lose a race the kernel's slower address resolution usually hides. A REQ for a
//!   transport other than RC or UC is refused with "invalid transport service type" (9);
//! - a REQ seen again (same remote communication ID and CA GUID: the peer retried) is
//!   ignored while the connection forms, and refused as a stale connection (10) once it
//!   is in timewait: never a second connection;
//! - a REP for no connection of ours gets REJ "invalid communication ID" (6); a REP seen
//!   again after the RTU went out (the RTU was lost) gets the RTU again;
//! - a DREQ for no connection gets a DREP all the same (the peer may have missed ours);
//! - the REQ and the REP are sent again each CM response timeout (4.096 us x 2^t, from
//!   the REQ's fields) up to `max_cm_retries` times; an MRA extends the wait by its
//!   service timeout; then the connection fails (UNREACHABLE for rdma_cm) with a REJ
//!   "timeout" (4) to the peer;
//! - the passive side is established by the RTU, or by the first packet on its QP
//!   (COMM_EST: IBA 12.9.7.1 lets the RTU be lost).
//!
//! MADs of other classes, or of a version the CM does not speak, get the response IBA
//! 13.4.7 gives when they ask for one (a Get or Set: GetResp with status "unsupported
//! version" or "unsupported method"); anything else malformed is dropped and counted.

use super::Ctx;
use super::qp::{resolve_path, udp_sport};
use crate::time::Time;
use crate::verbs::device::{eui64_of, ip_of};
use crate::verbs::{AddressVector, Error, Gid, Mtu, QpType};
use crate::wire::cm::{self, CmMessage, CmaHeader};
use crate::wire::{BthRepr, DethRepr, ExtRepr, Frame, Opcode, Psn, RoceRepr, mad};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};

/// The General Services QP's number.
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1 (IBA 13.5.1; every GSI MAD carries it).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The CM's class version (IBA 1.2 onward).
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD method Send, the only one the CM's messages use.
const METHOD_SEND: u8 = 0x03;
const METHOD_GET: u8 = 0x01;
const METHOD_SET: u8 = 0x02;
const METHOD_GET_RESP: u8 = 0x81;
/// MAD status (IBA 13.4.7, table 110, bits 2-4): unsupported base or class version.
pub const MAD_STATUS_BAD_VERSION: u16 = 1 << 2;
/// MAD status: the method is not supported.
pub const MAD_STATUS_UNSUPPORTED_METHOD: u16 = 2 << 2;
/// MAD status: the method/attribute combination is not supported.
pub const MAD_STATUS_UNSUPPORTED_ATTR: u16 = 3 << 2;

/// REJ reasons (IBA table 112) the CM sends.
pub mod reason {
    pub const TIMEOUT: u16 = 4;
    pub const INVALID_COMM_ID: u16 = 6;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const INVALID_TRANSPORT: u16 = 9;
    pub const STALE_CONNECTION: u16 = 10;
    pub const UNSUPPORTED_REQUEST: u16 = 5;
    pub const INVALID_PATH_MTU: u16 = 26;
    pub const CONSUMER_REJECT: u16 = 28;
}

/// The longest a REQ for a service ID nobody listens on is kept for a listener before
/// its REJ "invalid service ID" goes out. A server that learns over one connection that
/// its client is about to connect and only then listens (perftest `-R`) needs a few
/// scheduler turns on a busy host; a client that asked for nobody learns it this much
/// later. Never more than half the REQ's remote CM response timeout, so that the active
/// side hears the REJ before it sends the REQ again. In nanoseconds (200 ms).
pub const UNHEARD_HOLD_MAX: u64 = 200_000_000;
/// How many such REQs are kept at once; past it they are refused at once (a peer
/// sending REQs for nothing cannot make the CM keep much).
const UNHEARD_MAX: usize = 32;

/// SIDR_REP status values (IBA table 120).
pub mod sidr_status {
    pub const OK: u8 = 0;
    pub const SERVICE_ID_NOT_SUPPORTED: u8 = 1;
    pub const REJECTED: u8 = 2;
}

/// The time a CM response timeout code stands for: 4.096 us x 2^t (IBA 12.7.27).
pub fn timeout_ns(t: u8) -> u64 {
    4096u64 << u32::from(t.min(31))
}

/// What the active side asks for in a REQ.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// The local QP (RC or UC) and its type.
    pub qpn: u32,
    pub qp_type: QpType,
    /// The PSN the local QP expects first (its `rq_psn`): the peer sends from it. That
    /// is how Linux's CM and rdma_cm use a REQ's and a REP's Starting PSN (in rxe's
    /// captures the active side sends from the REP's, the passive from the REQ's).
    pub starting_psn: u32,
    pub service_id: u64,
    /// Where the peer is: its GID, and the local GID index to send from.
    pub dgid: Gid,
    pub sgid_index: u8,
    /// The next hop's MAC; `None`: the neighbour table's.
    pub dmac: Option<[u8; 6]>,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub path_mtu: Mtu,
    /// RDMA READs/atomics the local QP accepts at once, and issues at once.
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// The local ACK timeout code the peer's QP should use.
    pub local_ack_timeout: u8,
    /// How long the peer may take to answer (the code), and how often to ask.
    pub cm_response_timeout: u8,
    pub max_cm_retries: u8,
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// rdma_cm's defaults (`cma.c`: CMA_CM_RESPONSE_TIMEOUT 20, CMA_MAX_CM_RETRIES 15,
    /// retry and RNR retry 7, responder resources and initiator depth 1).
    pub fn new(qpn: u32, service_id: u64, dgid: Gid, sgid_index: u8) -> ConnectParams {
        ConnectParams {
            qpn,
            qp_type: QpType::Rc,
            starting_psn: 0,
            service_id,
            dgid,
            sgid_index,
            dmac: None,
            traffic_class: 0,
            hop_limit: 64,
            path_mtu: Mtu::Mtu1024,
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            local_ack_timeout: 19,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            private_data: Vec::new(),
        }
    }
}

/// What the passive side answers with in a REP.
#[derive(Debug, Clone)]
pub struct AcceptParams {
    pub qpn: u32,
    /// The PSN the local QP expects first (its `rq_psn`), as in [`ConnectParams`].
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: Vec<u8>,
}

/// The fields of a REQ a passive consumer needs to set up its QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqInfo {
    pub service_id: u64,
    pub remote_qpn: u32,
    pub qp_type: QpType,
    /// The PSN the peer expects first: the local QP's `sq_psn`.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub path_mtu: Option<Mtu>,
    pub local_ack_timeout: u8,
    pub srq: bool,
    /// The peer's GID (the REQ's primary local GID) and the local one it addressed.
    pub remote_gid: Gid,
    pub local_gid: Gid,
    /// The MAC the REQ came from: the next hop towards the peer.
    pub remote_mac: Option<[u8; 6]>,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub private_data: Vec<u8>,
    /// The rdma_cm IP header of the private data, for rdma_cm service IDs.
    pub cma: Option<CmaHeader>,
}

/// The fields of a REP the active consumer needs to finish its QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepInfo {
    pub remote_qpn: u32,
    /// The PSN the peer expects first: the local QP's `sq_psn`.
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub private_data: Vec<u8>,
}

/// What a SIDR_REQ asks.
#[derive(Debug, Clone)]
pub struct SidrParams {
    pub service_id: u64,
    pub dgid: Gid,
    pub sgid_index: u8,
    pub dmac: Option<[u8; 6]>,
    pub cm_response_timeout: u8,
    pub max_cm_retries: u8,
    pub private_data: Vec<u8>,
}

/// What the CM tells its consumer. `id` is the local communication (or SIDR request) ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for a service listened on. Answer with `accept` or `reject`.
    ConnectRequest { id: u32, req: Box<ReqInfo> },
    /// Active: the REP arrived. Move the QP to RTR and RTS, then `establish` (the RTU).
    ConnectResponse { id: u32, rep: Box<RepInfo> },
    /// The connection is established (active: the RTU went out; passive: it came, or
    /// the first packet did).
    Established { id: u32 },
    /// The peer refused (REJ) with `reason`.
    Rejected {
        id: u32,
        reason: u16,
        private_data: Vec<u8>,
    },
    /// The REQ, REP or SIDR_REQ went unanswered through every retry.
    Unreachable { id: u32 },
    /// A DREQ came, or ours was answered or timed out.
    Disconnected { id: u32 },
    /// Passive: a SIDR_REQ for a service listened on. Answer with `sidr_reply`.
    SidrRequest {
        id: u32,
        service_id: u64,
        remote_gid: Gid,
        private_data: Vec<u8>,
        cma: Option<CmaHeader>,
    },
    /// Active: the SIDR_REP arrived.
    SidrResponse {
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    },
}

/// What happened to MADs, by kind (published with the engine's counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    pub mads_rcvd: u64,
    pub mads_sent: u64,
    pub mads_resent: u64,
    /// Answered with an error status (unsupported class, version or method).
    pub mads_unsupported: u64,
    /// Dropped: not a UD SEND_ONLY with the GSI Q_Key.
    pub drop_not_gsi: u64,
    /// Dropped: shorter than a MAD, base version not 1, or undecodable CM message.
    pub drop_malformed: u64,
    /// Dropped: an unsolicited response, or a CM attribute the CM does not handle.
    pub drop_unexpected: u64,
    /// Dropped: a message for a connection in a state that ignores it (duplicates).
    pub drop_stale: u64,
    pub rej_sent: u64,
    pub rej_rcvd: u64,
    pub established: u64,
    /// REQs for a service ID nobody listened on yet, kept for a listener.
    pub reqs_held: u64,
}

impl CmCounters {
    /// Adds another engine's (the runtime's threads report one device).
    pub fn add(&mut self, o: &CmCounters) {
        self.mads_rcvd += o.mads_rcvd;
        self.mads_sent += o.mads_sent;
        self.mads_resent += o.mads_resent;
        self.mads_unsupported += o.mads_unsupported;
        self.drop_not_gsi += o.drop_not_gsi;
        self.drop_malformed += o.drop_malformed;
        self.drop_unexpected += o.drop_unexpected;
        self.drop_stale += o.drop_stale;
        self.rej_sent += o.rej_sent;
        self.rej_rcvd += o.rej_rcvd;
        self.established += o.established;
        self.reqs_held += o.reqs_held;
    }

    /// What a counter of `named` means (what `roce-xdp stats` prints beside it).
    pub fn help(name: &str) -> &'static str {
        match name {
            "cm_mads_rcvd" => "CM: MADs received on QP1",
            "cm_mads_sent" => "CM: MADs sent from QP1",
            "cm_mads_resent" => "CM: REQ, REP, DREQ or SIDR_REQ sent again (no answer in time)",
            "cm_mads_unsupported" => {
                "CM: Get/Set answered with an unsupported class/version/method"
            }
            "cm_drop_not_gsi" => "CM: dropped, not a UD SEND with the GSI Q_Key",
            "cm_drop_malformed" => "CM: dropped, short MAD, base version not 1, undecodable",
            "cm_drop_unexpected" => "CM: dropped, unsolicited response or unhandled attribute",
            "cm_drop_stale" => "CM: duplicate or stale message ignored (a retry, a late reply)",
            "cm_rej_sent" => "CM: REJs sent (nobody listens, refused, timed out)",
            "cm_rej_rcvd" => "CM: REJs received",
            "cm_established" => "CM: connections established",
            "cm_reqs_held" => "CM: REQs for a service nobody listened on yet, kept up to 200 ms",
            _ => "",
        }
    }

    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("cm_mads_rcvd", self.mads_rcvd),
            ("cm_mads_sent", self.mads_sent),
            ("cm_mads_resent", self.mads_resent),
            ("cm_mads_unsupported", self.mads_unsupported),
            ("cm_drop_not_gsi", self.drop_not_gsi),
            ("cm_drop_malformed", self.drop_malformed),
            ("cm_drop_unexpected", self.drop_unexpected),
            ("cm_drop_stale", self.drop_stale),
            ("cm_rej_sent", self.rej_sent),
            ("cm_rej_rcvd", self.rej_rcvd),
            ("cm_established", self.established),
            ("cm_reqs_held", self.reqs_held),
        ]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ReqSent,
    ReqRcvd,
    RepSent,
    RepRcvd,
    Established,
    DreqSent,
    Timewait,
    SidrReqSent,
    SidrReqRcvd,
}

/// A peer's QP1: where MADs for it go.
#[derive(Debug, Clone, Copy)]
struct Peer {
    av: AddressVector,
    qpn: u32,
}

struct Conn {
    state: State,
    peer: Peer,
    service_id: u64,
    remote_comm_id: u32,
    remote_guid: u64,
    tid: u64,
    local_qpn: u32,
    remote_qpn: u32,
    /// The MAD sent last that a timer may repeat, and how many repeats remain.
    last: Option<Box<[u8; mad::MAD_LEN]>>,
    retries_left: u8,
    /// How long the peer may take to answer what we send.
    response_ns: u64,
    deadline: Option<Time>,
    /// The consumer destroyed the ID: finish quietly, report nothing.
    orphan: bool,
}

impl Conn {
    /// A connection (or SIDR request) in `state` with `peer`, nothing sent yet.
    fn new(state: State, peer: Peer, service_id: u64, tid: u64) -> Conn {
        Conn {
            state,
            peer,
            service_id,
            remote_comm_id: 0,
            remote_guid: 0,
            tid,
            local_qpn: 0,
            remote_qpn: 0,
            last: None,
            retries_left: 0,
            response_ns: 0,
            deadline: None,
            orphan: false,
        }
    }
}

/// A REQ for a service ID nobody listens on (yet): delivered if a listener comes before
/// `until`, refused then otherwise.
struct Unheard {
    until: Time,
    peer: Peer,
    tid: u64,
    service_id: u64,
    /// The peer's communication ID (for the REJ, and to know the REQ again).
    remote_comm_id: u32,
    remote_guid: u64,
    /// The whole MAD, parsed again when a listener takes it.
    mad: Box<[u8; mad::MAD_LEN]>,
}

/// The CM of one port.
pub(crate) struct Cm {
    listening: HashSet<u64>,
    /// REQs waiting for a listener, at most [`UNHEARD_MAX`].
    unheard: Vec<Unheard>,
    conns: HashMap<u32, Conn>,
    /// (remote CA GUID, remote communication ID) -> local ID: a REQ seen again.
    by_remote: HashMap<(u64, u32), u32>,
    timers: BinaryHeap<Reverse<(Time, u32)>>,
    out: VecDeque<(Peer, Box<[u8; mad::MAD_LEN]>)>,
    events: VecDeque<CmEvent>,
    psn: u32,
    pub counters: CmCounters,
}

impl Cm {
    pub(crate) fn new() -> Cm {
        Cm {
            listening: HashSet::new(),
            unheard: Vec::new(),
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            timers: BinaryHeap::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            psn: 0,
            counters: CmCounters::default(),
        }
    }

    // ----- the consumer's calls -----

    /// Takes REQs and SIDR_REQs for `service_id`, and the REQs for it that came in the
    /// last moments while nobody listened (see [`UNHEARD_HOLD_MAX`]).
    pub(crate) fn listen(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        service_id: u64,
    ) -> Result<(), Error> {
        if !self.listening.insert(service_id) {
            return Err(Error::Busy {
                what: "CM service ID",
                handle: service_id as u32,
                users: 1,
            });
        }
        let mut i = 0;
        while i < self.unheard.len() {
            if self.unheard[i].service_id != service_id {
                i += 1;
                continue;
            }
            let u = self.unheard.remove(i);
            let Ok(h) = mad::Header::new_checked(&u.mad[..]) else {
                continue;
            };
            let attr = mad::Repr::parse(&h).attribute_id;
            if let Ok(CmMessage::Req(q)) = CmMessage::parse(attr, &u.mad[mad::HEADER_LEN..]) {
                self.on_req(ctx, now, u.peer, u.tid, &q, &u.mad[..]);
            }
        }
        Ok(())
    }

    /// Stops taking REQs for `service_id` (connections made stay).
    pub(crate) fn unlisten(&mut self, service_id: u64) {
        self.listening.remove(&service_id);
    }

    /// Sends a REQ; the connection's ID, which the events name.
    pub(crate) fn connect(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        p: &ConnectParams,
    ) -> Result<u32, Error> {
        if !matches!(p.qp_type, QpType::Rc | QpType::Uc) {
            return Err(Error::InvalidAttribute {
                name: "qp_type",
                value: p.qp_type as u64,
                reason: "the CM connects RC and UC QPs (UD resolves with SIDR)",
            });
        }
        check_pdata(&p.private_data, cm::REQ_PDATA)?;
        let peer = self.peer_for(
            ctx,
            p.dgid,
            p.sgid_index,
            p.dmac,
            p.traffic_class,
            p.hop_limit,
        )?;
        let id = self.new_id(ctx);
        let tid = self.new_tid(ctx, id);
        let sgid = ctx.gids[usize::from(p.sgid_index)];
        let req = cm::Req {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: guid(ctx),
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.cm_response_timeout.min(31),
            transport: if p.qp_type == QpType::Uc { 1 } else { 0 },
            end_to_end_flow_control: true,
            starting_psn: p.starting_psn & 0xff_ffff,
            local_cm_response_timeout: p.cm_response_timeout.min(31),
            retry_count: p.retry_count.min(7),
            pkey: 0xffff,
            path_mtu: p.path_mtu as u8,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: p.max_cm_retries.min(15),
            srq: p.srq,
            extended_transport: 0,
            primary_local_lid: 0xffff,
            primary_remote_lid: 0xffff,
            primary_local_gid: sgid,
            primary_remote_gid: p.dgid,
            primary_flow_label: 0,
            primary_packet_rate: 0,
            primary_traffic_class: p.traffic_class,
            primary_hop_limit: p.hop_limit,
            primary_sl: 0,
            primary_subnet_local: false,
            primary_local_ack_timeout: p.local_ack_timeout.min(31),
            alternate_path: &[],
            private_data: &p.private_data,
            cma: None,
        };
        let m = mad_of(tid, &CmMessage::Req(req))?;
        self.conns.insert(
            id,
            Conn {
                local_qpn: p.qpn,
                retries_left: p.max_cm_retries.min(15),
                response_ns: timeout_ns(p.cm_response_timeout),
                ..Conn::new(State::ReqSent, peer, p.service_id, tid)
            },
        );
        self.send_tracked(now, id, m);
        Ok(id)
    }

    /// Passive: answers a ConnectRequest with a REP.
    pub(crate) fn accept(
        &mut self,
        ctx: &Ctx,
        now: Time,
        id: u32,
        p: &AcceptParams,
    ) -> Result<(), Error> {
        check_pdata(&p.private_data, cm::REP_PDATA)?;
        let c = self.conn(id, &[State::ReqRcvd], "accept needs a connect request")?;
        let rep = cm::Rep {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: guid(ctx),
            private_data: &p.private_data,
        };
        let m = mad_of(c.tid, &CmMessage::Rep(rep))?;
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::RepSent;
        c.local_qpn = p.qpn;
        self.send_tracked(now, id, m);
        Ok(())
    }

    /// Refuses a ConnectRequest (or, active, a ConnectResponse) with a REJ.
    pub(crate) fn reject(
        &mut self,
        id: u32,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), Error> {
        check_pdata(private_data, cm::REJ_PDATA)?;
        let c = self.conn(id, &[State::ReqRcvd, State::RepRcvd], "nothing to reject")?;
        let what = if c.state == State::ReqRcvd { 0 } else { 1 };
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.send_rej(peer, tid, (id, remote), what, reason, private_data);
        self.remove(id);
        Ok(())
    }

    /// Active: the QP is ready (RTR, RTS); sends the RTU and reports Established.
    pub(crate) fn establish(&mut self, id: u32, private_data: &[u8]) -> Result<(), Error> {
        check_pdata(private_data, cm::RTU_PDATA)?;
        let c = self.conn(id, &[State::RepRcvd], "establish needs a connect response")?;
        let msg = CmMessage::Rtu {
            local_comm_id: id,
            remote_comm_id: c.remote_comm_id,
            private_data,
        };
        let m = mad_of(c.tid, &msg)?;
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::Established;
        // Kept: a REP seen again (our RTU lost) gets it again.
        c.last = Some(m.clone());
        c.deadline = None;
        let peer = c.peer;
        self.counters.established += 1;
        self.events.push_back(CmEvent::Established { id });
        self.send(peer, m);
        Ok(())
    }

    /// Sends a DREQ; Disconnected follows on its DREP or after its retries.
    pub(crate) fn disconnect(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        id: u32,
        pdata: &[u8],
    ) -> Result<(), Error> {
        check_pdata(pdata, cm::DREQ_PDATA)?;
        let ok = [State::Established, State::RepSent, State::RepRcvd];
        let c = self.conn(id, &ok, "only a connection can be disconnected")?;
        let (remote, rqpn) = (c.remote_comm_id, c.remote_qpn);
        let tid = self.new_tid(ctx, id);
        let msg = CmMessage::Dreq {
            local_comm_id: id,
            remote_comm_id: remote,
            remote_qpn: rqpn,
            private_data: pdata,
        };
        let m = mad_of(tid, &msg)?;
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::DreqSent;
        c.retries_left = c.retries_left.max(3);
        self.send_tracked(now, id, m);
        Ok(())
    }

    /// The consumer is done with `id` (rdma_destroy_id): what is under way ends as the
    /// kernel's `cm_destroy_id` ends it (a forming connection is refused, an
    /// established one disconnected), and no event names `id` again.
    pub(crate) fn destroy(&mut self, ctx: &mut Ctx, now: Time, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        match c.state {
            State::ReqSent => {
                let (peer, tid) = (c.peer, c.tid);
                self.send_rej(peer, tid, (id, 0), 0, reason::TIMEOUT, &[]);
                self.remove(id);
            }
            State::ReqRcvd | State::RepRcvd => {
                let _ = self.reject(id, reason::CONSUMER_REJECT, &[]);
            }
            State::Established | State::RepSent => {
                let _ = self.disconnect(ctx, now, id, &[]);
                if let Some(c) = self.conns.get_mut(&id) {
                    c.orphan = true;
                }
            }
            State::DreqSent | State::Timewait => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.orphan = true;
                }
            }
            State::SidrReqSent | State::SidrReqRcvd => self.remove(id),
        }
    }

    /// Sends a SIDR_REQ: which UD QP serves `service_id` at the peer?
    pub(crate) fn sidr_request(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        p: &SidrParams,
    ) -> Result<u32, Error> {
        check_pdata(&p.private_data, cm::SIDR_REQ_PDATA)?;
        let peer = self.peer_for(ctx, p.dgid, p.sgid_index, p.dmac, 0, 64)?;
        let id = self.new_id(ctx);
        let tid = self.new_tid(ctx, id);
        let msg = CmMessage::SidrReq(cm::SidrReq {
            request_id: id,
            pkey: 0xffff,
            service_id: p.service_id,
            private_data: &p.private_data,
            cma: None,
        });
        let m = mad_of(tid, &msg)?;
        self.conns.insert(
            id,
            Conn {
                retries_left: p.max_cm_retries.min(15),
                response_ns: timeout_ns(p.cm_response_timeout),
                ..Conn::new(State::SidrReqSent, peer, p.service_id, tid)
            },
        );
        self.send_tracked(now, id, m);
        Ok(id)
    }

    /// Passive: answers a SidrRequest.
    pub(crate) fn sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), Error> {
        check_pdata(private_data, cm::SIDR_REP_PDATA)?;
        let c = self.conn(id, &[State::SidrReqRcvd], "no SIDR request to answer")?;
        let msg = CmMessage::SidrRep(cm::SidrRep {
            request_id: c.remote_comm_id,
            status,
            additional_info_len: 0,
            qpn,
            service_id: c.service_id,
            qkey,
            additional_info: &[],
            private_data,
        });
        let (peer, m) = (c.peer, mad_of(c.tid, &msg)?);
        self.send(peer, m);
        self.remove(id);
        Ok(())
    }

    /// The consumer is going away (its process exits): every connection still open is
    /// disconnected (a DREQ) with nothing more reported. With the engine inside the
    /// process, nothing would answer the peer's DREQ afterwards, as the kernel's CM
    /// does after its process exits; [`Cm::settling`] says when it may stop.
    pub(crate) fn close_all(&mut self, ctx: &mut Ctx, now: Time) {
        // Nobody will listen now: the REQs kept for a listener are refused at once.
        for u in std::mem::take(&mut self.unheard) {
            self.refuse_unheard(u.peer, u.tid, u.service_id, u.remote_comm_id);
        }
        let ids: Vec<u32> = self.conns.keys().copied().collect();
        for id in ids {
            self.destroy(ctx, now, id);
        }
    }

    /// How many connections (and SIDR requests) the CM keeps, timewait included.
    pub(crate) fn connections(&self) -> usize {
        self.conns.len()
    }

    /// True while a connection is still being made or taken down: the engine should
    /// keep running a little to finish the exchange.
    pub(crate) fn settling(&self) -> bool {
        self.conns.values().any(|c| {
            matches!(
                c.state,
                State::ReqSent | State::RepSent | State::Established | State::DreqSent
            )
        })
    }

    /// The next event for the consumer.
    pub(crate) fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// True while events wait.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    // ----- the engine's side -----

    /// The first packet arrived on `qpn` in RTR: a connection waiting for its RTU on
    /// that QP is established (IBA 12.9.7.1).
    pub(crate) fn comm_est(&mut self, qpn: u32) {
        let id = self
            .conns
            .iter()
            .find(|(_, c)| c.state == State::RepSent && c.local_qpn == qpn)
            .map(|(id, _)| *id);
        if let Some(id) = id {
            self.established_passive(id);
        }
    }

    /// A frame for QP1 (its headers and ICRC already checked by the engine).
    pub(crate) fn handle_frame(&mut self, ctx: &mut Ctx, now: Time, f: &Frame<'_>) {
        let r = f.roce();
        let deth = r.deth();
        if r.bth().opcode() != Opcode::UD_SEND_ONLY || deth.is_none_or(|d| d.qkey() != GSI_QKEY) {
            self.counters.drop_not_gsi += 1;
            return;
        }
        let src_qp = deth.map_or(GSI_QPN, |d| d.src_qp());
        // A MAD is 256 bytes: never a frame chained over two buffers.
        let Some(payload) = f.payload().contiguous() else {
            self.counters.drop_malformed += 1;
            return;
        };
        let Ok(h) = mad::Header::new_checked(payload) else {
            self.counters.drop_malformed += 1;
            return;
        };
        if payload.len() < mad::MAD_LEN || h.base_version() != 1 {
            self.counters.drop_malformed += 1;
            return;
        }
        self.counters.mads_rcvd += 1;
        let src_ip = f.ip().src();
        // The GID the MAD came to, on the VLAN it came on: answers leave from it.
        let vid = super::vid_of(f);
        let Some(sgid_index) = ctx
            .gids
            .iter()
            .zip(&ctx.gid_vlans)
            .position(|(g, v)| ip_of(g) == f.ip().dst() && *v == vid)
            .and_then(|i| u8::try_from(i).ok())
        else {
            self.counters.drop_malformed += 1;
            return;
        };
        let mut av = AddressVector::new(crate::verbs::device::gid_of(src_ip), sgid_index);
        av.dmac = Some(f.eth().src);
        let peer = Peer { av, qpn: src_qp };
        let hdr = mad::Repr::parse(&h);
        if hdr.method & 0x80 != 0 {
            // A response nobody asked for (the CM asks nothing with Get/Set).
            self.counters.drop_unexpected += 1;
            return;
        }
        if hdr.mgmt_class != mad::CLASS_CM || hdr.class_version != CM_CLASS_VERSION {
            self.unsupported(peer, payload, MAD_STATUS_BAD_VERSION);
            return;
        }
        if hdr.method != METHOD_SEND {
            self.unsupported(peer, payload, MAD_STATUS_UNSUPPORTED_METHOD);
            return;
        }
        let msg = match CmMessage::parse(hdr.attribute_id, &payload[mad::HEADER_LEN..mad::MAD_LEN])
        {
            Ok(m) => m,
            Err(_) => {
                self.counters.drop_malformed += 1;
                return;
            }
        };
        match msg {
            CmMessage::Req(q) => self.on_req(ctx, now, peer, hdr.transaction_id, &q, payload),
            CmMessage::Rep(p) => self.on_rep(peer, hdr.transaction_id, &p),
            CmMessage::Rtu { remote_comm_id, .. } => self.on_rtu(remote_comm_id),
            CmMessage::Rej(j) => self.on_rej(&j),
            CmMessage::Mra(m) => self.on_mra(now, &m),
            CmMessage::Dreq {
                local_comm_id,
                remote_comm_id,
                remote_qpn,
                ..
            } => self.on_dreq(
                now,
                peer,
                hdr.transaction_id,
                local_comm_id,
                remote_comm_id,
                remote_qpn,
            ),
            CmMessage::Drep { remote_comm_id, .. } => self.on_drep(now, remote_comm_id),
            CmMessage::SidrReq(q) => self.on_sidr_req(ctx, peer, hdr.transaction_id, &q),
            CmMessage::SidrRep(p) => self.on_sidr_rep(&p),
            CmMessage::Other(_) => self.counters.drop_unexpected += 1,
        }
    }

    /// Fires the timers due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Time) {
        let mut i = 0;
        while i < self.unheard.len() {
            if self.unheard[i].until > now {
                i += 1;
                continue;
            }
            let u = self.unheard.swap_remove(i);
            self.refuse_unheard(u.peer, u.tid, u.service_id, u.remote_comm_id);
        }
        while let Some(Reverse((t, id))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.deadline != Some(t) {
                continue;
            }
            c.deadline = None;
            if c.state == State::Timewait {
                self.remove(id);
                continue;
            }
            if c.retries_left > 0
                && let Some(m) = c.last.clone()
            {
                c.retries_left -= 1;
                let at = now.add_nanos(c.response_ns);
                c.deadline = Some(at);
                let peer = c.peer;
                self.timers.push(Reverse((at, id)));
                self.counters.mads_resent += 1;
                self.send(peer, m);
                continue;
            }
            self.timed_out(now, id);
        }
    }

    /// The next time `handle_timeout` must run.
    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        let conns = self.timers.peek().map(|r| r.0.0);
        let unheard = self.unheard.iter().map(|u| u.until).min();
        match (conns, unheard) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// True while MADs wait to be sent.
    pub(crate) fn wants_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// Writes the next MAD's frame (a UD SEND_ONLY from QP1) into `buf`.
    pub(crate) fn poll_transmit(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<usize> {
        while let Some((peer, m)) = self.out.pop_front() {
            let sport = udp_sport(QpType::Ud, GSI_QPN, 0, 0);
            let Ok(path) = resolve_path(ctx, &peer.av, sport) else {
                ctx.counters.send_err += 1;
                continue;
            };
            let psn = self.psn;
            self.psn = (self.psn + 1) & 0xff_ffff;
            let roce = RoceRepr {
                bth: BthRepr::new(Opcode::UD_SEND_ONLY, peer.qpn, Psn::new(psn)),
                ext: ExtRepr {
                    deth: Some(DethRepr {
                        qkey: GSI_QKEY,
                        src_qp: GSI_QPN,
                    }),
                    ..ExtRepr::default()
                },
                payload: &[],
            };
            let id = Ctx::next_ip_id();
            match path
                .tpl
                .emit(buf, id, &roce, mad::MAD_LEN, |d| d.copy_from_slice(&m[..]))
            {
                Ok(n) => {
                    ctx.counters.sent_pkts += 1;
                    self.counters.mads_sent += 1;
                    return Some(n);
                }
                Err(_) => ctx.counters.send_err += 1,
            }
        }
        None
    }

    // ----- received messages -----

    /// A REQ; `raw` is the whole MAD it came in (kept if nobody listens yet).
    fn on_req(
        &mut self,
        ctx: &mut Ctx,
        now: Time,
        peer: Peer,
        tid: u64,
        q: &cm::Req<'_>,
        raw: &[u8],
    ) {
        if let Some(&id) = self.by_remote.get(&(q.local_ca_guid, q.local_comm_id)) {
            // The peer sent its REQ again: our answer is on its way or was lost.
            let state = self.conns.get(&id).map(|c| c.state);
            if state == Some(State::Timewait) {
                self.send_rej(
                    peer,
                    tid,
                    (0, q.local_comm_id),
                    0,
                    reason::STALE_CONNECTION,
                    &[],
                );
            } else {
                self.counters.drop_stale += 1;
            }
            return;
        }
        // A REQ that names a QP no connection can have (QP0, QP1, the multicast QPN) or
        // a path MTU IBA does not define is refused before anything is kept.
        let bad = if matches!(q.local_qpn, 0 | 1 | 0xff_ffff) {
            Some(reason::UNSUPPORTED_REQUEST)
        } else if Mtu::from_code(q.path_mtu).is_none() {
            Some(reason::INVALID_PATH_MTU)
        } else {
            None
        };
        if let Some(why) = bad {
            self.send_rej(peer, tid, (0, q.local_comm_id), 0, why, &[]);
            return;
        }
        if !self.listening.contains(&q.service_id) {
            let key = (q.local_ca_guid, q.local_comm_id);
            if self
                .unheard
                .iter()
                .any(|u| (u.remote_guid, u.remote_comm_id) == key)
            {
                // Sent again while it waits for a listener.
                self.counters.drop_stale += 1;
                return;
            }
            let Some(m) = raw
                .get(..mad::MAD_LEN)
                .filter(|_| self.unheard.len() < UNHEARD_MAX)
            else {
                self.refuse_unheard(peer, tid, q.service_id, q.local_comm_id);
                return;
            };
            let wait = UNHEARD_HOLD_MAX.min(timeout_ns(q.remote_cm_response_timeout) / 2);
            let mut copy = Box::new([0; mad::MAD_LEN]);
            copy.copy_from_slice(m);
            self.counters.reqs_held += 1;
            self.unheard.push(Unheard {
                until: now.add_nanos(wait),
                peer,
                tid,
                service_id: q.service_id,
                remote_comm_id: q.local_comm_id,
                remote_guid: q.local_ca_guid,
                mad: copy,
            });
            return;
        }
        let qp_type = match q.transport {
            0 => QpType::Rc,
            1 => QpType::Uc,
            _ => {
                self.send_rej(
                    peer,
                    tid,
                    (0, q.local_comm_id),
                    0,
                    reason::INVALID_TRANSPORT,
                    &[],
                );
                return;
            }
        };
        let id = self.new_id(ctx);
        self.by_remote
            .insert((q.local_ca_guid, q.local_comm_id), id);
        self.conns.insert(
            id,
            Conn {
                remote_comm_id: q.local_comm_id,
                remote_guid: q.local_ca_guid,
                remote_qpn: q.local_qpn,
                retries_left: q.max_cm_retries,
                // How long the active side may take to answer our REP.
                response_ns: timeout_ns(q.local_cm_response_timeout),
                ..Conn::new(State::ReqRcvd, peer, q.service_id, tid)
            },
        );
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            req: Box::new(ReqInfo {
                service_id: q.service_id,
                remote_qpn: q.local_qpn,
                qp_type,
                starting_psn: q.starting_psn,
                responder_resources: q.responder_resources,
                initiator_depth: q.initiator_depth,
                retry_count: q.retry_count,
                rnr_retry_count: q.rnr_retry_count,
                path_mtu: Mtu::from_code(q.path_mtu),
                local_ack_timeout: q.primary_local_ack_timeout,
                srq: q.srq,
                remote_gid: q.primary_local_gid,
                local_gid: q.primary_remote_gid,
                remote_mac: peer.av.dmac,
                traffic_class: q.primary_traffic_class,
                hop_limit: q.primary_hop_limit,
                private_data: q.private_data.to_vec(),
                cma: q.cma,
            }),
        });
    }

    fn on_rep(&mut self, peer: Peer, tid: u64, p: &cm::Rep<'_>) {
        let Some(c) = self.conns.get_mut(&p.remote_comm_id) else {
            self.send_rej(
                peer,
                tid,
                (0, p.local_comm_id),
                1,
                reason::INVALID_COMM_ID,
                &[],
            );
            return;
        };
        match c.state {
            State::ReqSent => {}
            State::Established => {
                // Our RTU was lost: the peer asks again.
                if let Some(m) = c.last.clone() {
                    let peer = c.peer;
                    self.counters.mads_resent += 1;
                    self.send(peer, m);
                } else {
                    self.counters.drop_stale += 1;
                }
                return;
            }
            _ => {
                self.counters.drop_stale += 1;
                return;
            }
        }
        c.state = State::RepRcvd;
        c.remote_comm_id = p.local_comm_id;
        c.remote_guid = p.local_ca_guid;
        c.remote_qpn = p.local_qpn;
        c.last = None;
        c.deadline = None;
        let id = p.remote_comm_id;
        if c.orphan {
            return;
        }
        self.events.push_back(CmEvent::ConnectResponse {
            id,
            rep: Box::new(RepInfo {
                remote_qpn: p.local_qpn,
                starting_psn: p.starting_psn,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                rnr_retry_count: p.rnr_retry_count,
                srq: p.srq,
                private_data: p.private_data.to_vec(),
            }),
        });
    }

    fn on_rtu(&mut self, id: u32) {
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::RepSent) => self.established_passive(id),
            _ => self.counters.drop_stale += 1,
        }
    }

    fn established_passive(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Established;
        c.last = None;
        c.deadline = None;
        self.counters.established += 1;
        if !c.orphan {
            self.events.push_back(CmEvent::Established { id });
        }
    }

    fn on_rej(&mut self, j: &cm::Rej<'_>) {
        self.counters.rej_rcvd += 1;
        let id = j.remote_comm_id;
        let Some(c) = self.conns.get(&id) else {
            self.counters.drop_stale += 1;
            return;
        };
        if !matches!(c.state, State::ReqSent | State::RepSent | State::RepRcvd) {
            self.counters.drop_stale += 1;
            return;
        }
        let orphan = c.orphan;
        self.remove(id);
        if !orphan {
            self.events.push_back(CmEvent::Rejected {
                id,
                reason: j.reason,
                private_data: j.private_data.to_vec(),
            });
        }
    }

    fn on_mra(&mut self, now: Time, m: &cm::Mra<'_>) {
        let Some(c) = self.conns.get_mut(&m.remote_comm_id) else {
            self.counters.drop_stale += 1;
            return;
        };
        let waiting = match m.message_mraed {
            0 => c.state == State::ReqSent,
            1 => c.state == State::RepSent,
            _ => false,
        };
        if !waiting {
            self.counters.drop_stale += 1;
            return;
        }
        // IBA 12.6.6: the sender of the MRA answers within its service timeout.
        let at = now.add_nanos(timeout_ns(m.service_timeout).saturating_add(c.response_ns));
        c.deadline = Some(at);
        self.timers.push(Reverse((at, m.remote_comm_id)));
    }

    fn on_dreq(&mut self, now: Time, peer: Peer, tid: u64, remote: u32, local: u32, qpn: u32) {
        let drep = |cm: &mut Cm, peer: Peer| {
            let msg = CmMessage::Drep {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: &[],
            };
            if let Ok(m) = mad_of(tid, &msg) {
                cm.send(peer, m);
            }
        };
        let Some(c) = self.conns.get_mut(&local) else {
            // Unknown (we forgot it already): a DREP all the same, as ib_cm does.
            drep(self, peer);
            return;
        };
        if c.remote_comm_id != remote || c.local_qpn != qpn {
            self.counters.drop_stale += 1;
            return;
        }
        match c.state {
            State::Established | State::RepSent | State::RepRcvd | State::DreqSent => {
                let notify = !c.orphan;
                self.enter_timewait(now, local);
                drep(self, peer);
                if notify {
                    self.events.push_back(CmEvent::Disconnected { id: local });
                }
            }
            State::Timewait => drep(self, peer),
            _ => self.counters.drop_stale += 1,
        }
    }

    fn on_drep(&mut self, now: Time, id: u32) {
        match self.conns.get(&id) {
            Some(c) if c.state == State::DreqSent => {
                let notify = !c.orphan;
                self.enter_timewait(now, id);
                if notify {
                    self.events.push_back(CmEvent::Disconnected { id });
                }
            }
            _ => self.counters.drop_stale += 1,
        }
    }

    fn on_sidr_req(&mut self, ctx: &mut Ctx, peer: Peer, tid: u64, q: &cm::SidrReq<'_>) {
        if !self.listening.contains(&q.service_id) {
            let msg = CmMessage::SidrRep(cm::SidrRep {
                request_id: q.request_id,
                status: sidr_status::SERVICE_ID_NOT_SUPPORTED,
                additional_info_len: 0,
                qpn: 0,
                service_id: q.service_id,
                qkey: 0,
                additional_info: &[],
                private_data: &[],
            });
            if let Ok(m) = mad_of(tid, &msg) {
                self.send(peer, m);
            }
            return;
        }
        let id = self.new_id(ctx);
        self.conns.insert(
            id,
            Conn {
                remote_comm_id: q.request_id,
                ..Conn::new(State::SidrReqRcvd, peer, q.service_id, tid)
            },
        );
        self.events.push_back(CmEvent::SidrRequest {
            id,
            service_id: q.service_id,
            remote_gid: peer.av.dgid,
            private_data: q.private_data.to_vec(),
            cma: q.cma,
        });
    }

    fn on_sidr_rep(&mut self, p: &cm::SidrRep<'_>) {
        let id = p.request_id;
        match self.conns.get(&id) {
            Some(c) if c.state == State::SidrReqSent => {
                let orphan = c.orphan;
                self.remove(id);
                if !orphan {
                    self.events.push_back(CmEvent::SidrResponse {
                        id,
                        status: p.status,
                        qpn: p.qpn,
                        qkey: p.qkey,
                        private_data: p.private_data.to_vec(),
                    });
                }
            }
            _ => self.counters.drop_stale += 1,
        }
    }

    // ----- helpers -----

    fn timed_out(&mut self, now: Time, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let (state, orphan, peer, tid, remote) =
            (c.state, c.orphan, c.peer, c.tid, c.remote_comm_id);
        match state {
            State::ReqSent | State::RepSent => {
                let what = if state == State::ReqSent { 0 } else { 1 };
                self.send_rej(peer, tid, (id, remote), what, reason::TIMEOUT, &[]);
                self.remove(id);
                if !orphan {
                    self.events.push_back(CmEvent::Unreachable { id });
                }
            }
            State::SidrReqSent => {
                self.remove(id);
                if !orphan {
                    self.events.push_back(CmEvent::Unreachable { id });
                }
            }
            State::DreqSent => {
                self.enter_timewait(now, id);
                if !orphan {
                    self.events.push_back(CmEvent::Disconnected { id });
                }
            }
            _ => {}
        }
    }

    fn enter_timewait(&mut self, now: Time, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::Timewait;
            c.last = None;
            let at = now.add_nanos(c.response_ns.max(timeout_ns(14)));
            c.deadline = Some(at);
            self.timers.push(Reverse((at, id)));
        }
    }

    /// The connection `id` in one of `states`, or why not.
    fn conn(&self, id: u32, states: &[State], why: &'static str) -> Result<ConnView, Error> {
        let c = self.conns.get(&id).ok_or(Error::NoSuch {
            kind: "CM connection",
            handle: id,
        })?;
        if !states.contains(&c.state) || c.orphan {
            return Err(Error::InvalidAttribute {
                name: "CM connection state",
                value: u64::from(id),
                reason: why,
            });
        }
        Ok(ConnView {
            state: c.state,
            peer: c.peer,
            tid: c.tid,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            service_id: c.service_id,
        })
    }

    fn remove(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id)
            && c.remote_guid != 0
        {
            self.by_remote.remove(&(c.remote_guid, c.remote_comm_id));
        }
    }

    /// Refuses a REQ nobody listened for: REJ "invalid service ID".
    fn refuse_unheard(&mut self, peer: Peer, tid: u64, service_id: u64, remote_comm_id: u32) {
        tracing::debug!(
            "CM: REQ for service ID 0x{service_id:016x}: nobody listens (REJ invalid service ID)"
        );
        self.send_rej(
            peer,
            tid,
            (0, remote_comm_id),
            0,
            reason::INVALID_SERVICE_ID,
            &[],
        );
    }

    /// Sends a REJ; `ids` are (local, remote) communication IDs.
    fn send_rej(
        &mut self,
        peer: Peer,
        tid: u64,
        (local, remote): (u32, u32),
        what: u8,
        why: u16,
        pdata: &[u8],
    ) {
        let msg = CmMessage::Rej(cm::Rej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: what,
            reject_info_len: 0,
            reason: why,
            ari: &[],
            private_data: pdata,
        });
        if let Ok(m) = mad_of(tid, &msg) {
            self.counters.rej_sent += 1;
            self.send(peer, m);
        }
    }

    /// Answers a Get or Set the CM cannot serve with GetResp and `status`; drops others.
    fn unsupported(&mut self, peer: Peer, m: &[u8], status: u16) {
        let Some(h) = m.get(..mad::MAD_LEN) else {
            return;
        };
        let Ok(hdr) = mad::Header::new_checked(h) else {
            return;
        };
        let r = mad::Repr::parse(&hdr);
        if r.method != METHOD_GET && r.method != METHOD_SET {
            self.counters.drop_unexpected += 1;
            return;
        }
        self.counters.mads_unsupported += 1;
        let mut out = Box::new([0u8; mad::MAD_LEN]);
        out.copy_from_slice(h);
        let resp = mad::Repr {
            method: METHOD_GET_RESP,
            status,
            ..r
        };
        if resp.emit(&mut out[..]).is_ok() {
            self.send(peer, out);
        }
    }

    /// Queues `m` and arms the connection's retry timer with it.
    fn send_tracked(&mut self, now: Time, id: u32, m: Box<[u8; mad::MAD_LEN]>) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(m.clone());
            let at = now.add_nanos(c.response_ns);
            c.deadline = Some(at);
            self.timers.push(Reverse((at, id)));
            let peer = c.peer;
            self.send(peer, m);
        }
    }

    fn send(&mut self, peer: Peer, m: Box<[u8; mad::MAD_LEN]>) {
        self.out.push_back((peer, m));
    }

    fn peer_for(
        &self,
        ctx: &Ctx,
        dgid: Gid,
        sgid_index: u8,
        dmac: Option<[u8; 6]>,
        traffic_class: u8,
        hop_limit: u8,
    ) -> Result<Peer, Error> {
        let mut av = AddressVector::new(dgid, sgid_index);
        av.dmac = dmac;
        av.traffic_class = traffic_class;
        av.hop_limit = hop_limit;
        // Checked now, so that a wrong address is the caller's error, not a silent drop.
        resolve_path(ctx, &av, 0)?;
        Ok(Peer { av, qpn: GSI_QPN })
    }

    /// A fresh, non-zero local communication ID.
    fn new_id(&mut self, ctx: &mut Ctx) -> u32 {
        loop {
            let id = ctx.rng.next_u32();
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// A transaction ID for a new exchange (the kernel's form: the local ID in the low
    /// half, the agent's sequence above).
    fn new_tid(&mut self, ctx: &mut Ctx, id: u32) -> u64 {
        u64::from(ctx.rng.next_u32()) << 32 | u64::from(id)
    }
}

/// What the consumer's calls need of a connection.
struct ConnView {
    state: State,
    peer: Peer,
    tid: u64,
    remote_comm_id: u32,
    remote_qpn: u32,
    service_id: u64,
}

/// The node GUID the CM names its CA by: the EUI-64 of the port's MAC, as rxe derives
/// it.
pub(crate) fn guid(ctx: &Ctx) -> u64 {
    u64::from_be_bytes(eui64_of(ctx.cfg.mac))
}

fn check_pdata(p: &[u8], max: usize) -> Result<(), Error> {
    if p.len() > max {
        return Err(Error::InvalidAttribute {
            name: "private_data_len",
            value: p.len() as u64,
            reason: "longer than the CM message carries",
        });
    }
    Ok(())
}

/// A whole CM MAD (method Send) with transaction ID `tid`.
fn mad_of(tid: u64, msg: &CmMessage<'_>) -> Result<Box<[u8; mad::MAD_LEN]>, Error> {
    let hdr = mad::Repr {
        base_version: 1,
        mgmt_class: mad::CLASS_CM,
        class_version: CM_CLASS_VERSION,
        method: METHOD_SEND,
        status: 0,
        class_specific: 0,
        transaction_id: tid,
        attribute_id: msg.attribute_id(),
        attribute_modifier: 0,
    };
    let mut m = Box::new([0u8; mad::MAD_LEN]);
    msg.emit_mad(&hdr, &mut m[..])
        .map_err(|_| Error::InvalidAttribute {
            name: "CM message",
            value: u64::from(msg.attribute_id()),
            reason: "a field does not fit its place in the message",
        })?;
    Ok(m)
}

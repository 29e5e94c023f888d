//! An endpoint: one QP on a started device, its CQ, and one registered memory region,
//! with the connection step (INIT, RTR, RTS) an ibverbs program would write.

use crate::runtime::{Cq, Device, Qp, RuntimeError};
use crate::verbs::{
    AccessFlags, Gid, Memory, MrInfo, Mtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    Sge, Wc, WcStatus, device::ip_of,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to build an endpoint.
#[derive(Debug, Clone, Copy)]
pub struct EndpointOpts {
    pub qp_type: QpType,
    /// Bytes of registered memory.
    pub mem: usize,
    pub send_wr: u32,
    pub recv_wr: u32,
    /// The MR's access flags.
    pub access: AccessFlags,
}

impl EndpointOpts {
    /// `mem` bytes, deep queues, all access rights.
    pub fn new(qp_type: QpType, mem: usize) -> EndpointOpts {
        EndpointOpts {
            qp_type,
            mem,
            send_wr: 4096,
            recv_wr: 4096,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        }
    }
}

/// A QP with one CQ for sends and receives and one MR over `mem`.
pub struct Endpoint {
    pub dev: Device,
    pub pd: u32,
    pub cq: Cq,
    pub qp: Qp,
    pub mem: Arc<Memory>,
    pub mr: MrInfo,
}

/// What the peer tells us out of band (pingpong's and perftest's TCP exchange).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

/// The attributes of the RTR and RTS steps; the defaults are `ibv_rc_pingpong`'s
/// except the deeper READ/atomic queues.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    pub mtu: Mtu,
    pub my_psn: u32,
    /// Access granted to the peer (RC/UC).
    pub access: AccessFlags,
    pub qkey: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    /// The local GID the QP sends from (`-g`, as the rdma-core tools' `sgid_index`);
    /// `None`: the first of the peer's IP version.
    pub sgid_index: Option<u8>,
}

impl ConnectOpts {
    pub fn new(mtu: Mtu, my_psn: u32) -> ConnectOpts {
        ConnectOpts {
            mtu,
            my_psn,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::LOCAL_WRITE,
            qkey: 0x1111_1111,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sgid_index: None,
        }
    }
}

/// The QP an endpoint creates: `o`'s type and queue depths on `pd` and `cq`.
fn qp_init(o: &EndpointOpts, pd: u32, cq: u32) -> QpInitAttr {
    let mut init = QpInitAttr::new(o.qp_type, pd, cq);
    init.cap = QpCap {
        max_send_wr: o.send_wr,
        max_recv_wr: o.recv_wr,
        max_send_sge: 16,
        max_recv_sge: 16,
        max_inline_data: 256,
    };
    init
}

/// How long a finished command keeps its QP after the last frame it received, and at most.
const LINGER_QUIET: Duration = Duration::from_millis(100);
const LINGER_MAX: Duration = Duration::from_secs(2);

impl Endpoint {
    /// Creates the PD, CQ, MR and QP (in RESET).
    pub fn new(dev: Device, o: &EndpointOpts) -> Result<Endpoint, RuntimeError> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq((o.send_wr + o.recv_wr) as usize + 1)?;
        let mem = Memory::new(o.mem);
        let mr = dev.reg_mr(pd, &mem, 0, o.mem, o.access)?;
        let qp = dev.create_qp(&qp_init(o, pd, cq.id))?;
        Ok(Endpoint {
            dev,
            pd,
            cq,
            qp,
            mem,
            mr,
        })
    }

    /// One more QP (in RESET, with `o`'s queue depths) on this endpoint's device, PD,
    /// CQ and MR: many QPs over one region, as perftest's `-q` sets them up.
    pub fn sharing(&self, o: &EndpointOpts) -> Result<Endpoint, RuntimeError> {
        let qp = self.dev.create_qp(&qp_init(o, self.pd, self.cq.id))?;
        Ok(Endpoint {
            dev: self.dev.clone(),
            pd: self.pd,
            cq: self.cq.clone(),
            qp,
            mem: self.mem.clone(),
            mr: self.mr,
        })
    }

    /// A gather/scatter element over `len` bytes at `off` of the MR.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + off as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// Moves the QP to INIT (so receives can be posted before the peer is known).
    pub fn init(&self, o: &ConnectOpts) -> Result<(), RuntimeError> {
        let a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            qkey: o.qkey,
            ..QpAttr::default()
        };
        let extra = if self.qp.qp_type() == QpType::Ud {
            QpAttrMask::QKEY
        } else {
            QpAttrMask::ACCESS_FLAGS
        };
        self.dev.modify_qp(
            &self.qp,
            &a,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | extra,
        )
    }

    /// RTR then RTS towards `r`, with the masks ibverbs requires for the QP type.
    pub fn connect(&self, r: &Remote, o: &ConnectOpts) -> Result<(), RuntimeError> {
        if self.qp.state() == QpState::Reset {
            self.init(o)?;
        }
        let t = self.qp.qp_type();
        let mut a = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: o.mtu,
            dest_qp_num: r.qpn,
            rq_psn: r.psn,
            max_dest_rd_atomic: o.max_dest_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ah_attr: self.dev.av_to(ip_of(&r.gid)),
            ..QpAttr::default()
        };
        if let Some(g) = o.sgid_index {
            a.ah_attr.sgid_index = g;
        }
        let m = QpAttrMask::STATE;
        let rtr = match t {
            QpType::Rc => {
                m | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER
            }
            QpType::Uc => {
                m | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
            }
            QpType::Ud => m,
        };
        self.dev.modify_qp(&self.qp, &a, rtr)?;
        a.qp_state = QpState::Rts;
        a.timeout = o.timeout;
        a.retry_cnt = o.retry_cnt;
        a.rnr_retry = o.rnr_retry;
        a.sq_psn = o.my_psn;
        a.max_rd_atomic = o.max_rd_atomic;
        let rts = match t {
            QpType::Rc => {
                m | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::MAX_QP_RD_ATOMIC
            }
            _ => m | QpAttrMask::SQ_PSN,
        };
        self.dev.modify_qp(&self.qp, &a, rts)
    }

    /// What the peer needs to reach this QP, with the GID of the same IP family as `to`.
    pub fn local(&self, psn: u32, to: std::net::IpAddr) -> Remote {
        let av = self.dev.av_to(to);
        Remote {
            qpn: self.qp.qpn,
            psn,
            gid: self.dev.gid(av.sgid_index).unwrap_or([0; 16]),
        }
    }

    /// Destroys the QP once the device has received nothing for `LINGER_QUIET` (at most
    /// `LINGER_MAX`): a command that is done may still owe the peer ACKs for packets the
    /// peer sends again. rxe retransmits when its timer fires even right after our last
    /// ACK, and then retries for ever (retry_cnt 7) if the QP is gone: seen as a hung
    /// `ibv_rc_pingpong` server in the interop harness once the round trip got short.
    /// `LINGER_QUIET` covers one retransmit period of the tools' timeout 14 (67 ms).
    pub fn finish(&self) {
        let t0 = Instant::now();
        let mut last = self.dev.counters().map(|c| c.rcvd_pkts).unwrap_or(0);
        let mut since = Instant::now();
        while t0.elapsed() < LINGER_MAX && since.elapsed() < LINGER_QUIET && !super::interrupted() {
            std::thread::sleep(Duration::from_millis(5));
            let now = self.dev.counters().map(|c| c.rcvd_pkts).unwrap_or(last);
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
        let _ = self.dev.destroy_qp(self.qp.clone());
    }

    /// Waits up to `timeout` for the next completion; an error names the status. Stops
    /// early on Ctrl-C.
    pub fn next_wc(&self, timeout: Duration) -> Result<Wc, String> {
        // Checked first: a busy stream always has a completion ready, and reading the
        // clock for the deadline cost a stream's thread a third of its time.
        if super::interrupted() {
            return Err("interrupted".into());
        }
        if let Some(w) = self.cq.poll_one() {
            return Ok(w);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if super::interrupted() {
                return Err("interrupted".into());
            }
            if let Some(w) = self.cq.poll_one() {
                return Ok(w);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "no completion within {:.1} s on QP 0x{:06x} (state {:?})",
                    timeout.as_secs_f64(),
                    self.qp.qpn,
                    self.qp.state()
                ));
            }
            self.cq.wait(left.min(Duration::from_millis(100)));
        }
    }

    /// As `next_wc`, and the completion must be successful.
    pub fn next_ok(&self, timeout: Duration) -> Result<Wc, String> {
        let w = self.next_wc(timeout)?;
        if w.status != WcStatus::Success {
            return Err(format!(
                "QP 0x{:06x}: {:?} completed with {} ({:?})",
                self.qp.qpn,
                w.opcode,
                w.status.name(),
                w
            ));
        }
        Ok(w)
    }
}

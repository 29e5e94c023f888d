//! The ibverbs vocabulary: flags, states, opcodes and status codes, with the names and
//! numeric values of `<infiniband/verbs.h>` so that a verbs programmer recognises them.

use core::fmt;

macro_rules! flags {
    ($(#[$m:meta])* $name:ident : $t:ty { $($(#[$fm:meta])* $f:ident = $v:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $t);
        impl $name {
            $($(#[$fm])* pub const $f: $name = $name($v);)*
            /// No flag set.
            pub const EMPTY: $name = $name(0);
            /// True when every flag of `other` is set.
            #[inline]
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }
            /// True when any flag of `other` is set.
            #[inline]
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }
            /// The flags of `self` not in `other`.
            #[inline]
            pub const fn without(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }
            /// The raw value.
            #[inline]
            pub const fn bits(self) -> $t {
                self.0
            }
        }
        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name {
                $name(self.0 | o.0)
            }
        }
        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, o: $name) {
                self.0 |= o.0;
            }
        }
        impl core::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, o: $name) -> $name {
                $name(self.0 & o.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                $(
                    if $v != 0 && self.0 & $v == $v {
                        if !first { f.write_str("|")?; }
                        f.write_str(stringify!($f))?;
                        first = false;
                    }
                )*
                let known = 0 $(| $v)*;
                if self.0 & !known != 0 {
                    if !first { f.write_str("|")?; }
                    write!(f, "0x{:x}", self.0 & !known)?;
                    first = false;
                }
                if first { f.write_str("0")?; }
                Ok(())
            }
        }
    };
}

flags! {
    /// `IBV_ACCESS_*`: what an MR (or a QP's responder) allows.
    AccessFlags: u32 {
        LOCAL_WRITE = 1,
        REMOTE_WRITE = 2,
        REMOTE_READ = 4,
        REMOTE_ATOMIC = 8,
        MW_BIND = 16,
        ZERO_BASED = 32,
        ON_DEMAND = 64,
    }
}

flags! {
    /// `IBV_SEND_*`: per-WR flags.
    SendFlags: u32 {
        /// Wait for earlier READs and atomics to complete before this WR starts.
        FENCE = 1,
        /// Generate a completion on success (errors always generate one).
        SIGNALED = 2,
        /// Set SE in the last packet: the receiver's CQ wakes a solicited waiter.
        SOLICITED = 4,
        /// The data is copied at post time; the SGEs need no lkey.
        INLINE = 8,
    }
}

flags! {
    /// `IBV_WC_*` completion flags.
    WcFlags: u32 {
        /// A UD receive: the first 40 bytes of the buffer hold the GRH area.
        GRH = 1,
        WITH_IMM = 2,
        IP_CSUM_OK = 4,
        WITH_INV = 8,
    }
}

flags! {
    /// `IBV_QP_*`: which attributes a `modify_qp` call sets.
    QpAttrMask: u32 {
        STATE = 1 << 0,
        CUR_STATE = 1 << 1,
        EN_SQD_ASYNC_NOTIFY = 1 << 2,
        ACCESS_FLAGS = 1 << 3,
        PKEY_INDEX = 1 << 4,
        PORT = 1 << 5,
        QKEY = 1 << 6,
        AV = 1 << 7,
        PATH_MTU = 1 << 8,
        TIMEOUT = 1 << 9,
        RETRY_CNT = 1 << 10,
        RNR_RETRY = 1 << 11,
        RQ_PSN = 1 << 12,
        MAX_QP_RD_ATOMIC = 1 << 13,
        ALT_PATH = 1 << 14,
        MIN_RNR_TIMER = 1 << 15,
        SQ_PSN = 1 << 16,
        MAX_DEST_RD_ATOMIC = 1 << 17,
        PATH_MIG_STATE = 1 << 18,
        CAP = 1 << 19,
        DEST_QPN = 1 << 20,
        RATE_LIMIT = 1 << 25,
    }
}

impl QpAttrMask {
    /// The names of the set bits, for error messages.
    pub fn names(self) -> String {
        format!("{self:?}")
    }
}

/// `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    /// Ready To Receive.
    Rtr = 2,
    /// Ready To Send.
    Rts = 3,
    /// Send Queue Drained.
    Sqd = 4,
    /// Send Queue Error (UC/UD only).
    Sqe = 5,
    Err = 6,
}

impl QpState {
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `enum ibv_qp_type` (the transports roce-xdp implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc = 2,
    Uc = 3,
    Ud = 4,
}

impl QpType {
    pub const fn name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        }
    }
    /// The wire transport of this QP type.
    pub const fn transport(self) -> crate::wire::Transport {
        match self {
            QpType::Rc => crate::wire::Transport::Rc,
            QpType::Uc => crate::wire::Transport::Uc,
            QpType::Ud => crate::wire::Transport::Ud,
        }
    }
}

/// `enum ibv_mtu`: the IB path MTU, 256 to 4096 bytes of payload per packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From the enum value (1..=5).
    pub const fn from_code(c: u8) -> Option<Mtu> {
        match c {
            1 => Some(Mtu::Mtu256),
            2 => Some(Mtu::Mtu512),
            3 => Some(Mtu::Mtu1024),
            4 => Some(Mtu::Mtu2048),
            5 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
    /// From a byte count that must be exactly one of the five sizes.
    pub const fn from_bytes(b: u32) -> Option<Mtu> {
        match b {
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            _ => None,
        }
    }
    /// The largest IB MTU whose RoCEv2 packets fit a netdev MTU (IP MTU), as rxe
    /// computes its active MTU: the IP, UDP, BTH, extension headers and ICRC must fit too.
    pub fn for_netdev_mtu(ip_mtu: u32) -> Option<Mtu> {
        // IPv4 20 + UDP 8 + BTH 12 + RETH 16 (largest common ext) + ICRC 4.
        const OVERHEAD: u32 = 20 + 8 + 12 + 16 + 4;
        [
            Mtu::Mtu4096,
            Mtu::Mtu2048,
            Mtu::Mtu1024,
            Mtu::Mtu512,
            Mtu::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() + OVERHEAD <= ip_mtu)
    }
}

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
}

impl WcStatus {
    /// The `IBV_WC_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        }
    }

    /// What went wrong, in the words of `ibv_wc_status_str`.
    pub const fn meaning(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.meaning())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// `enum ibv_wr_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteWithImm = 1,
    Send = 2,
    SendWithImm = 3,
    RdmaRead = 4,
    AtomicCmpAndSwp = 5,
    AtomicFetchAndAdd = 6,
    LocalInv = 7,
    BindMw = 8,
    SendWithInv = 9,
}

impl WrOpcode {
    /// The completion opcode of a send WR of this opcode.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
        }
    }
    /// True for READ and the atomics: the requester waits for response data, and
    /// `max_rd_atomic` and fences apply.
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    /// True when the WR is executed locally, without packets.
    pub const fn is_local(self) -> bool {
        matches!(self, WrOpcode::LocalInv | WrOpcode::BindMw)
    }
}

/// `enum ibv_event_type` (the asynchronous events roce-xdp raises).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A CQ overflowed: a completion could not be queued.
    CqErr { cq: u32 },
    /// A QP went to ERR because of a local or remote error.
    QpFatal { qpn: u32 },
    /// The first packet arrived on a QP in RTR.
    CommEst { qpn: u32 },
    /// A QP in SQD has no more outstanding send WRs.
    SqDrained { qpn: u32 },
    /// A QP attached to an SRQ in ERR has no more receive WRs to flush.
    QpLastWqeReached { qpn: u32 },
    /// An SRQ's free WRs fell below its limit.
    SrqLimitReached { srq: u32 },
    /// A completion arrived on a CQ armed with `req_notify_cq`.
    CompletionNotify { cq: u32 },
    /// The port became active: its interface is up with a carrier (IBV_EVENT_PORT_ACTIVE).
    PortActive,
    /// The port went down with its interface (IBV_EVENT_PORT_ERR).
    PortErr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::Mtu4096 as u8, 5);
        assert_eq!(Mtu::for_netdev_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_netdev_mtu(4200), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_netdev_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_netdev_mtu(200), None);
        // demo's MIN_NETDEV_MTU.
        assert_eq!(Mtu::for_netdev_mtu(316), Some(Mtu::Mtu256));
        assert_eq!(Mtu::for_netdev_mtu(315), None);
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
        assert_eq!(Mtu::from_bytes(2000), None);
    }

    #[test]
    fn flags_debug_and_ops() {
        let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(a.contains(AccessFlags::REMOTE_WRITE));
        assert!(!a.contains(AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE));
        assert_eq!(format!("{a:?}"), "LOCAL_WRITE|REMOTE_WRITE");
        assert_eq!(format!("{:?}", AccessFlags(0x1001)), "LOCAL_WRITE|0x1000");
        assert_eq!(format!("{:?}", AccessFlags::EMPTY), "0");
        assert_eq!(WcStatus::RetryExcErr as u32, 12);
        assert_eq!(WcStatus::RnrRetryExcErr.name(), "IBV_WC_RNR_RETRY_EXC_ERR");
        assert_eq!(WrOpcode::SendWithInv as u32, 9);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
    }
}

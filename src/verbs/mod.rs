//! The verbs API: the objects and vocabulary of ibverbs (`<infiniband/verbs.h>`).
//!
//! PDs, MRs, CQs, SRQs and QPs are created and used through the engine
//! ([`crate::engine::Engine`]); this module holds their types, the attribute rules of
//! `modify_qp`, and the errors a call can return. Names and numeric values follow
//! ibverbs, so a verbs programmer finds `IBV_ACCESS_REMOTE_WRITE` as
//! [`AccessFlags::REMOTE_WRITE`], `IBV_WC_RETRY_EXC_ERR` as [`WcStatus::RetryExcErr`],
//! and so on.

pub mod cq;
pub mod device;
pub mod mr;
pub mod qp;
pub mod types;
pub mod wr;

pub use cq::{Cq, Srq};
pub use device::{DeviceConfig, DeviceLimits, Gid, GidEntry, PortAttr, VlanNetdev};
pub use mr::{Memory, MrInfo};
pub use qp::{AddressVector, QpAttr, QpCap, QpInitAttr};
pub use types::{
    AccessFlags, AsyncEvent, Mtu, QpAttrMask, QpState, QpType, SendFlags, WcFlags, WcOpcode,
    WcStatus, WrOpcode,
};
pub use wr::{Mw, MwBind, RecvWr, SendWr, SgList, Sge, UdDest, Wc};

use std::net::IpAddr;

impl std::fmt::Display for QpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a verbs call failed. Each message names the object or attribute at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{qp_type} QP: there is no transition from {from} to {to}")]
    InvalidTransition {
        qp_type: QpType,
        from: QpState,
        to: QpState,
    },
    #[error("{qp_type} QP {from} -> {to} needs the attributes {missing:?}")]
    MissingAttributes {
        qp_type: QpType,
        from: QpState,
        to: QpState,
        missing: QpAttrMask,
    },
    #[error("{qp_type} QP {from} -> {to} does not accept the attributes {extra:?}")]
    UnexpectedAttributes {
        qp_type: QpType,
        from: QpState,
        to: QpState,
        extra: QpAttrMask,
    },
    #[error("attribute {name} = {value}: {reason}")]
    InvalidAttribute {
        name: &'static str,
        value: u64,
        reason: &'static str,
    },
    #[error("no {kind} {handle}")]
    NoSuch { kind: &'static str, handle: u32 },
    #[error("{what}: the limit of {max} is reached")]
    Limit { what: &'static str, max: u64 },
    #[error("the {what} queue of {owner} is full ({depth} entries)")]
    QueueFull {
        what: &'static str,
        owner: u32,
        depth: u32,
    },
    #[error("QP 0x{qpn:06x} is in {state}: {why}")]
    WrongState {
        qpn: u32,
        state: QpState,
        why: &'static str,
    },
    #[error("invalid work request: {0}")]
    InvalidWr(&'static str),
    #[error("invalid memory registration: {0}")]
    InvalidMr(&'static str),
    #[error("{what} {handle} is still used by {users} object(s)")]
    Busy {
        what: &'static str,
        handle: u32,
        users: u32,
    },
    #[error(
        "no MAC address known for {0}: give the address vector a dmac or add a neighbour entry"
    )]
    NoNeighbor(IpAddr),
    #[error("GID index {0} is not in the GID table")]
    BadGidIndex(u8),
}

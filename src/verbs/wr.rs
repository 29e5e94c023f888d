//! Work requests and work completions (`ibv_send_wr`, `ibv_recv_wr`, `ibv_wc`).
//!
//! Scatter/gather lists and inline data live in fixed-size arrays inside the request, so
//! posting a request copies it into the queue without a heap allocation of its own.

use super::qp::AddressVector;
use super::types::{AccessFlags, SendFlags, WcFlags, WcOpcode, WcStatus, WrOpcode};

/// Most scatter/gather entries one work request may carry.
pub const MAX_SGE: usize = 16;
/// Most bytes of inline data one send work request may carry.
pub const MAX_INLINE: usize = 256;

/// A scatter/gather element: `length` bytes at `addr` in the region of `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A scatter/gather list of at most [`MAX_SGE`] entries. Only the first `len` entries
/// mean anything (equality looks at those alone), so a recycled list is refilled by
/// copying just what the new WR uses.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct SgList {
    len: u8,
    sges: [Sge; MAX_SGE],
}

impl Default for SgList {
    fn default() -> Self {
        SgList {
            sges: [Sge::default(); MAX_SGE],
            len: 0,
        }
    }
}

const _: () = assert!(std::mem::offset_of!(SgList, len) < std::mem::offset_of!(SgList, sges));

impl SgList {
    /// A list of the given entries; `None` if there are more than [`MAX_SGE`].
    #[inline]
    pub fn new(sges: &[Sge]) -> Option<SgList> {
        if sges.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList::default();
        l.sges[..sges.len()].copy_from_slice(sges);
        l.len = sges.len() as u8;
        Some(l)
    }
    /// Makes this list `sges` by copying just those entries (the rest keep whatever
    /// they held and mean nothing); false, and unchanged, if there are more than
    /// [`MAX_SGE`].
    #[inline]
    pub(crate) fn assign(&mut self, sges: &[Sge]) -> bool {
        let Some(dst) = self.sges.get_mut(..sges.len()) else {
            return false;
        };
        dst.copy_from_slice(sges);
        self.len = sges.len() as u8;
        true
    }
    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..usize::from(self.len)]
    }
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Sum of the lengths (u64: it cannot overflow).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.length)).sum()
    }
}

impl PartialEq for SgList {
    fn eq(&self, o: &SgList) -> bool {
        self.as_slice() == o.as_slice()
    }
}
impl Eq for SgList {}

impl std::fmt::Debug for SgList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Data carried inside a send WR (`IBV_SEND_INLINE`). Only the first `len` bytes mean
/// anything (equality looks at those alone).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct InlineData {
    len: u16,
    buf: [u8; MAX_INLINE],
}

impl InlineData {
    /// `None` if `data` is longer than [`MAX_INLINE`].
    pub fn new(data: &[u8]) -> Option<InlineData> {
        if data.len() > MAX_INLINE {
            return None;
        }
        let mut d = InlineData {
            buf: [0; MAX_INLINE],
            len: data.len() as u16,
        };
        d.buf[..data.len()].copy_from_slice(data);
        Some(d)
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
    /// Becomes a copy of `o`, writing only the bytes `o` uses.
    pub(crate) fn assign(&mut self, o: &InlineData) {
        let n = usize::from(o.len);
        self.buf[..n].copy_from_slice(&o.buf[..n]);
        self.len = o.len;
    }
}

impl PartialEq for InlineData {
    fn eq(&self, o: &InlineData) -> bool {
        self.as_slice() == o.as_slice()
    }
}
impl Eq for InlineData {}

impl std::fmt::Debug for InlineData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlineData({} bytes)", self.len)
    }
}

/// A type 2 memory window (`ibv_alloc_mw(pd, IBV_MW_TYPE_2)`): a handle and the R_Key
/// it has now (each bind gives it a new one, see [`Mw::next_rkey`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mw {
    pub handle: u32,
    pub rkey: u32,
    pub pd: u32,
}

impl Mw {
    /// `ibv_inc_rkey`: the same index with the next key byte, for the next bind.
    pub fn next_rkey(&self) -> u32 {
        (self.rkey & !0xff) | (self.rkey.wrapping_add(1) & 0xff)
    }
}

/// What an `IBV_WR_BIND_MW` binds (`wr.bind_mw` of `ibv_send_wr`): window `mw` (its
/// handle) gets R_Key `rkey` and opens `length` bytes at `addr` of the region of `lkey`
/// with `access` (remote read, write, atomic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    pub mw: u32,
    pub rkey: u32,
    pub lkey: u32,
    pub addr: u64,
    pub length: u64,
    pub access: AccessFlags,
}

/// Where a UD send goes (`wr.ud` of `ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub ah: AddressVector,
    pub remote_qpn: u32,
    /// The Q_Key to send; one with the top bit set means "use the QP's own Q_Key"
    /// (IBA 10.2.5, the privileged Q_Key rule).
    pub remote_qkey: u32,
}

/// A send work request (`ibv_send_wr`).
///
/// `repr(C)` with the fields every WR uses first, so a one-SGE WR without inline data
/// spans few cache lines when the engine reads it to post it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct SendWr {
    pub wr_id: u64,
    /// RDMA and atomic target.
    pub remote_addr: u64,
    /// Atomic operands: compare (CMP_AND_SWP) or add (FETCH_AND_ADD), and swap.
    pub compare_add: u64,
    pub swap: u64,
    pub opcode: WrOpcode,
    pub send_flags: SendFlags,
    /// Immediate data for `*_WITH_IMM` (sent in network order).
    pub imm_data: u32,
    /// The R_Key `SEND_WITH_INV` asks the responder to invalidate, or the key
    /// `LOCAL_INV` invalidates.
    pub invalidate_rkey: u32,
    pub rkey: u32,
    /// The local buffers (gathered for SEND/WRITE, scattered into for READ, 8 bytes for
    /// the result of an atomic). Ignored when `inline` is set.
    pub sg_list: SgList,
    /// Inline data, used instead of `sg_list` with `SendFlags::INLINE`.
    pub inline: Option<InlineData>,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// What a BIND_MW binds.
    pub bind: Option<MwBind>,
}

impl SendWr {
    #[inline]
    fn base(wr_id: u64, opcode: WrOpcode, sges: &[Sge]) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            send_flags: SendFlags::SIGNALED,
            sg_list: SgList::new(sges).unwrap_or_default(),
            inline: None,
            imm_data: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
        }
    }
    /// A signaled SEND of `sges`.
    #[inline]
    pub fn send(wr_id: u64, sges: &[Sge]) -> SendWr {
        Self::base(wr_id, WrOpcode::Send, sges)
    }
    /// A signaled RDMA WRITE of `sges` to `remote_addr` in the region of `rkey`.
    #[inline]
    pub fn write(wr_id: u64, sges: &[Sge], remote_addr: u64, rkey: u32) -> SendWr {
        SendWr {
            remote_addr,
            rkey,
            ..Self::base(wr_id, WrOpcode::RdmaWrite, sges)
        }
    }
    /// A signaled BIND_MW: window `mw` gets R_Key `b.rkey` over the range `b` describes.
    pub fn bind_mw(wr_id: u64, b: MwBind) -> SendWr {
        SendWr {
            bind: Some(b),
            ..Self::base(wr_id, WrOpcode::BindMw, &[])
        }
    }
    /// A signaled RDMA READ into `sges` from `remote_addr` in the region of `rkey`.
    #[inline]
    pub fn read(wr_id: u64, sges: &[Sge], remote_addr: u64, rkey: u32) -> SendWr {
        SendWr {
            remote_addr,
            rkey,
            ..Self::base(wr_id, WrOpcode::RdmaRead, sges)
        }
    }
    /// A signaled compare-and-swap of the 8 bytes at `remote_addr`; the old value lands in
    /// `result`.
    pub fn cmp_swap(
        wr_id: u64,
        result: Sge,
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    ) -> SendWr {
        SendWr {
            remote_addr,
            rkey,
            compare_add: compare,
            swap,
            ..Self::base(wr_id, WrOpcode::AtomicCmpAndSwp, &[result])
        }
    }
    /// A signaled fetch-and-add on the 8 bytes at `remote_addr`.
    pub fn fetch_add(wr_id: u64, result: Sge, remote_addr: u64, rkey: u32, add: u64) -> SendWr {
        SendWr {
            remote_addr,
            rkey,
            compare_add: add,
            ..Self::base(wr_id, WrOpcode::AtomicFetchAndAdd, &[result])
        }
    }
    /// Sets the opcode (e.g. to a `*_WITH_IMM` variant) and returns the WR.
    pub fn with_opcode(mut self, op: WrOpcode) -> SendWr {
        self.opcode = op;
        self
    }
    #[inline]
    pub fn with_imm(mut self, imm: u32) -> SendWr {
        self.imm_data = imm;
        self.opcode = match self.opcode {
            WrOpcode::Send => WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite => WrOpcode::RdmaWriteWithImm,
            o => o,
        };
        self
    }
    #[inline]
    pub fn with_flags(mut self, f: SendFlags) -> SendWr {
        self.send_flags = f;
        self
    }
    /// Inline `data` instead of the SG list. `None` if longer than [`MAX_INLINE`].
    pub fn with_inline(mut self, data: &[u8]) -> Option<SendWr> {
        self.inline = Some(InlineData::new(data)?);
        self.send_flags |= SendFlags::INLINE;
        Some(self)
    }
    pub fn with_ud(mut self, d: UdDest) -> SendWr {
        self.ud = Some(d);
        self
    }
    /// The message length in bytes.
    pub fn length(&self) -> u64 {
        match (self.send_flags.contains(SendFlags::INLINE), &self.inline) {
            (true, Some(d)) => d.as_slice().len() as u64,
            _ => self.sg_list.total_len(),
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: SgList,
}

impl RecvWr {
    #[inline]
    pub fn new(wr_id: u64, sges: &[Sge]) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: SgList::new(sges).unwrap_or_default(),
        }
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Extra detail on an error: which check failed (see `engine::VendorErr`).
    pub vendor_err: u32,
    /// Bytes received (receives, including the 40-byte GRH area for UD) or transferred
    /// (READ).
    pub byte_len: u32,
    /// Immediate data (valid with `WcFlags::WITH_IMM`) or the invalidated R_Key (with
    /// `WcFlags::WITH_INV`), as `ibv_wc`'s union.
    pub imm_data: u32,
    /// The local QP.
    pub qp_num: u32,
    /// For UD receives: the sender's QP.
    pub src_qp: u32,
    pub wc_flags: WcFlags,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl Default for Wc {
    /// A successful SEND completion of WR 0 on QP 0: a value to fill arrays with before
    /// polling into them.
    fn default() -> Wc {
        Wc::new(0, 0, WcOpcode::Send, WcStatus::Success)
    }
}

impl Wc {
    pub(crate) fn new(qp_num: u32, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::EMPTY,
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
    /// The immediate data, if the completion carries some.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }
    /// The invalidated R_Key, if the completion carries one.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.imm_data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_builders() {
        assert!(SgList::new(&[Sge::default(); MAX_SGE + 1]).is_none());
        let l = SgList::new(&[
            Sge {
                addr: 0,
                length: u32::MAX,
                lkey: 1,
            },
            Sge {
                addr: 0,
                length: u32::MAX,
                lkey: 1,
            },
        ])
        .unwrap();
        assert_eq!(l.total_len(), 2 * u64::from(u32::MAX));
        let w = SendWr::send(7, &[]).with_imm(5);
        assert_eq!(w.opcode, WrOpcode::SendWithImm);
        let w = SendWr::send(7, &[]).with_inline(&[1, 2, 3]).unwrap();
        assert_eq!(w.length(), 3);
        assert!(SendWr::send(7, &[]).with_inline(&[0; 257]).is_none());
        let mut wc = Wc::new(1, 2, WcOpcode::Recv, WcStatus::Success);
        assert_eq!(wc.imm(), None);
        wc.wc_flags = WcFlags::WITH_IMM;
        wc.imm_data = 9;
        assert_eq!(wc.imm(), Some(9));
    }
}

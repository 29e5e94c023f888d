//! Memory access for the engine: the region table, key checks, and the copies between
//! frames and scatter/gather lists. This is the one place where the engine touches
//! registered memory, and every access goes through a key, a bounds check and the
//! access flags.

use crate::rng::Rng;
use crate::verbs::mr::{MrInfo, MrInner, MrKind};
use crate::verbs::wr::{MAX_SGE, MwBind, SgList, Sge};
use crate::verbs::{AccessFlags, Error, Memory};
use crate::wire::Pieces;
use std::sync::Arc;

/// Why a local or remote memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    /// No valid region has this key (or it belongs to another PD).
    BadKey,
    /// The range is not inside the region (or wraps around).
    Range,
    /// The region does not grant the access.
    Permission,
    /// Deregistered or invalidated while in use.
    Invalidated,
}

/// The regions, indexed by `key >> 8`.
#[derive(Default)]
pub struct MrTable {
    slots: Vec<Option<Arc<MrInner>>>,
    /// The key byte last used at each index, so a reused index gets a new one.
    last_byte: Vec<(u8, u8)>,
    free: Vec<usize>,
    /// Regions held (`max_mr` bounds them) and windows held (`max_mw`).
    count: usize,
    windows: usize,
}

impl MrTable {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Registers `len` bytes of `mem` starting at `offset`, seen by peers at `iova`.
    #[allow(clippy::too_many_arguments)] // the arguments of ibv_reg_mr_iova
    pub fn register(
        &mut self,
        rng: &mut Rng,
        pd: u32,
        mem: Arc<Memory>,
        offset: usize,
        len: usize,
        iova: u64,
        access: AccessFlags,
        max: usize,
    ) -> Result<MrInfo, Error> {
        crate::verbs::mr::check_access(access).map_err(Error::InvalidMr)?;
        if offset.checked_add(len).is_none_or(|e| e > mem.len()) {
            return Err(Error::InvalidMr("the range is outside the memory"));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(Error::InvalidMr("iova + length wraps around"));
        }
        if self.count >= max {
            return Err(Error::Limit {
                what: "memory regions",
                max: max as u64,
            });
        }
        let (idx, lb, rb) = self.take_index(rng, "memory regions")?;
        let info = MrInfo {
            lkey: ((idx as u32) << 8) | u32::from(lb),
            rkey: ((idx as u32) << 8) | u32::from(rb),
            addr: iova,
            length: len as u64,
            access,
            pd,
        };
        self.slots[idx] = Some(Arc::new(MrInner::new(info, mem, offset)));
        self.count += 1;
        Ok(info)
    }

    /// A free slot and fresh key bytes for it (never the ones its last user had, so
    /// stale keys stay dead).
    fn take_index(&mut self, rng: &mut Rng, what: &'static str) -> Result<(usize, u8, u8), Error> {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                // Index 0 is never used, so no key is 0x000000xx.
                if self.slots.is_empty() {
                    self.slots.push(None);
                    self.last_byte.push((0, 0));
                }
                self.slots.push(None);
                self.last_byte.push((0, 0));
                self.slots.len() - 1
            }
        };
        if idx >= 1 << 24 {
            self.free.push(idx);
            return Err(Error::Limit { what, max: 1 << 24 });
        }
        let (ol, or) = self.last_byte[idx];
        // The R_Key's byte is random (not the last one), so a peer cannot guess the
        // next key of a slot. The L_Key's counts the registrations at the slot: posted
        // WRs hold L_Keys and look them up at each access, and a key that came back on
        // another region would reach it, so one comes back only after 256 registrations
        // there. L_Keys never leave the host.
        let mut rb = rng.next_u32() as u8;
        if rb == or {
            rb = rb.wrapping_add(1);
        }
        let lb = ol.wrapping_add(1);
        self.last_byte[idx] = (lb, rb);
        Ok((idx, lb, rb))
    }

    /// `ibv_alloc_mw` (type 2): a window of PD `pd`, bound to nothing. Returns its R_Key;
    /// the index part (`rkey >> 8`) is the window's handle for binds and deallocation.
    pub fn alloc_window(&mut self, rng: &mut Rng, pd: u32, max: usize) -> Result<u32, Error> {
        if self.windows >= max {
            return Err(Error::Limit {
                what: "memory windows",
                max: max as u64,
            });
        }
        let (idx, _, rb) = self.take_index(rng, "memory windows")?;
        let rkey = ((idx as u32) << 8) | u32::from(rb);
        self.slots[idx] = Some(Arc::new(MrInner::unbound_window(rkey, pd)));
        self.windows += 1;
        Ok(rkey)
    }

    /// `ibv_dealloc_mw` of the window with handle `mw` (`rkey >> 8`); returns its PD.
    pub fn dealloc_window(&mut self, mw: u32) -> Result<u32, Error> {
        let idx = mw as usize;
        match self.slots.get(idx) {
            Some(Some(w)) if w.is_window() => {
                self.windows -= 1;
                Ok(self.release(idx))
            }
            _ => Err(Error::NoSuch {
                kind: "memory window",
                handle: mw,
            }),
        }
    }

    /// Binds window `b.mw` (type 2) of PD `pd` through QP `qpn`: `b.length` bytes at
    /// `b.addr` of the region of `b.lkey`, opened to peers with `b.access` under the new
    /// R_Key `b.rkey`. The checks of IBA 10.6.7.2 as rxe makes them (`rxe_check_bind_mw`):
    /// the window unbound (a type 2 window is invalidated before it is bound again), the
    /// new key of the window's index, a length above 0, the region valid, of the PD and
    /// with MW_BIND, the range inside it, and remote write or atomic only over LOCAL_WRITE.
    /// A bound window holds the region under it: deregistering the region invalidates the
    /// window, but its memory stays allocated until the window is bound again or freed.
    pub fn bind_window(&mut self, pd: u32, qpn: u32, b: &MwBind) -> Result<(), &'static str> {
        let idx = b.mw as usize;
        let Some(Some(w)) = self.slots.get(idx) else {
            return Err("no such memory window");
        };
        if !w.is_window() || w.info.pd != pd {
            return Err("not a memory window of the QP's PD");
        }
        if w.is_valid() {
            return Err("the window is bound: invalidate it first");
        }
        if (b.rkey >> 8) as usize != idx {
            return Err("the new R_Key is not of the window's index");
        }
        // o10-37.2.40: a type 2 window is not bound to nothing (rxe refuses it too).
        if b.length == 0 {
            return Err("a type 2 window cannot be bound with length 0");
        }
        let mr = self
            .lookup(b.lkey, false, pd)
            .map_err(|_| "no valid region of the QP's PD with that lkey")?;
        if !mr.access().contains(AccessFlags::MW_BIND) {
            return Err("the region was registered without MW_BIND");
        }
        let remote =
            AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if b.access.without(remote) != AccessFlags::EMPTY {
            return Err("a window grants only remote read, write and atomic access");
        }
        if b.access
            .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !mr.access().contains(AccessFlags::LOCAL_WRITE)
        {
            return Err("remote write or atomic through a window needs LOCAL_WRITE on the region");
        }
        let off = mr
            .range(b.addr, b.length)
            .ok_or("the range is outside the region")?;
        let info = MrInfo {
            lkey: 0,
            rkey: b.rkey,
            addr: b.addr,
            length: b.length,
            access: b.access,
            pd,
        };
        let mut inner = MrInner::new(info, mr.mem.clone(), off);
        inner.kind = MrKind::Window {
            region: mr.clone(),
            qpn,
        };
        self.last_byte[idx].1 = b.rkey as u8;
        self.slots[idx] = Some(Arc::new(inner));
        Ok(())
    }

    /// Registers a copy of a region another engine of the same device registered, with
    /// its keys (the runtime's shards keep identical tables: every shard sees the same
    /// registrations in the same order, so the slot is free here too).
    pub fn register_replica(
        &mut self,
        info: MrInfo,
        mem: Arc<Memory>,
        offset: usize,
    ) -> Result<(), Error> {
        let idx = (info.lkey >> 8) as usize;
        if idx == 0 || idx != (info.rkey >> 8) as usize || idx >= 1 << 24 {
            return Err(Error::InvalidMr("replica keys of different indices"));
        }
        if offset
            .checked_add(info.length as usize)
            .is_none_or(|e| e > mem.len())
        {
            return Err(Error::InvalidMr("the range is outside the memory"));
        }
        while self.slots.len() <= idx {
            self.slots.push(None);
            self.last_byte.push((0, 0));
        }
        if self.slots[idx].is_some() {
            return Err(Error::InvalidMr(
                "the replica's slot is taken: shards out of step",
            ));
        }
        self.free.retain(|&i| i != idx);
        self.last_byte[idx] = (info.lkey as u8, info.rkey as u8);
        self.slots[idx] = Some(Arc::new(MrInner::new(info, mem, offset)));
        self.count += 1;
        Ok(())
    }

    /// Deregisters the region of `lkey`: later packets are refused, operations already
    /// holding it (a READ being answered) finish on memory that stays allocated until
    /// they drop it. Returns the region's PD.
    ///
    /// Work in flight that uses the region (a READ being answered holds it; a posted WR
    /// looks its L_Key up again) finds it gone at its next access, made on this same
    /// engine thread:
    /// from the moment this returns the engine touches the region's memory no more, so
    /// the application may free memory it lent ([`Memory::borrowed`]). Such a region is
    /// refused while a memory window is bound to it, as rdma-core's `ibv_dereg_mr` is
    /// (EBUSY); the engine's own memory lets the windows go invalid with it.
    pub fn deregister(&mut self, lkey: u32) -> Result<u32, Error> {
        let idx = (lkey >> 8) as usize;
        match self.slots.get(idx) {
            Some(Some(mr)) if mr.info.lkey == lkey => {
                if mr.mem.is_borrowed() {
                    let windows = self
                        .slots
                        .iter()
                        .flatten()
                        .filter(|w| {
                            w.is_valid()
                                && matches!(&w.kind, MrKind::Window { region, .. } if Arc::ptr_eq(region, mr))
                        })
                        .count();
                    if windows > 0 {
                        return Err(Error::Busy {
                            what: "memory region (bound memory windows)",
                            handle: lkey,
                            users: windows as u32,
                        });
                    }
                }
                self.count -= 1;
                Ok(self.release(idx))
            }
            _ => Err(Error::NoSuch {
                kind: "memory region with lkey",
                handle: lkey,
            }),
        }
    }

    /// Empties slot `idx` (a region or window): its keys stop working at once, and what an
    /// operation in flight holds stays allocated until it drops it. Returns its PD.
    fn release(&mut self, idx: usize) -> u32 {
        let e = self.slots[idx].take().unwrap_or_else(|| unreachable!());
        e.invalidate();
        self.free.push(idx);
        e.info.pd
    }

    /// The region of a key (`remote` picks the rkey or the lkey), valid and of PD `pd`.
    #[inline]
    pub fn lookup(&self, key: u32, remote: bool, pd: u32) -> Result<&Arc<MrInner>, AccessError> {
        let mr = self
            .slots
            .get((key >> 8) as usize)
            .and_then(Option::as_ref)
            .ok_or(AccessError::BadKey)?;
        let k = if remote { mr.info.rkey } else { mr.info.lkey };
        if k != key || mr.info.pd != pd {
            return Err(AccessError::BadKey);
        }
        if !mr.is_valid() {
            return Err(AccessError::Invalidated);
        }
        Ok(mr)
    }

    /// Checks a remote access of `len` bytes at `va` with `rkey`, needing `need`; returns
    /// the region and the offset in its memory.
    pub fn remote(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<(Arc<MrInner>, usize), AccessError> {
        let mr = self.lookup(rkey, true, pd)?;
        // A type 2 window opens its range only to the QP it was bound through.
        if mr.window_qp().is_some_and(|q| q != qpn) {
            return Err(AccessError::BadKey);
        }
        if !mr.access().contains(need) {
            return Err(AccessError::Permission);
        }
        let off = mr.range(va, len).ok_or(AccessError::Range)?;
        Ok((mr.clone(), off))
    }

    /// Invalidates the bound window whose R_Key is `key` (LOCAL_INV, SEND_WITH_INV); it
    /// can be bound again. Regions cannot be invalidated (`Permission`): IBA allows it
    /// only for fast-registration regions, which roce-xdp does not have, and rxe refuses
    /// it for regions of `ibv_reg_mr`; otherwise any peer holding an R_Key could revoke
    /// the region under every other user of it.
    pub fn invalidate(&self, key: u32, pd: u32) -> Result<(), AccessError> {
        let mr = self
            .slots
            .get((key >> 8) as usize)
            .and_then(Option::as_ref)
            .ok_or(AccessError::BadKey)?;
        if !mr.is_window() {
            return Err(AccessError::Permission);
        }
        if mr.info.rkey != key || mr.info.pd != pd {
            return Err(AccessError::BadKey);
        }
        if !mr.is_valid() {
            return Err(AccessError::Invalidated);
        }
        mr.invalidate();
        Ok(())
    }
}

/// One resolved local segment: the L_Key it was checked with at post time and where it
/// lies in the region's memory. It holds no reference to the region: each access looks
/// the key up again (as rxe's `copy_data` does per packet), so a region deregistered or
/// invalidated while the WR is queued fails that access, and posting and retiring a WR
/// cost no atomic reference count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seg {
    lkey: u32,
    len: u32,
    /// Offset in the region's memory.
    off: usize,
}

impl Seg {
    /// The region holding bytes `at..at + n` of this segment, looked up again: gone (or
    /// its key reused, invalidated, or no longer covering the bytes) means the region the
    /// WR was posted with was deregistered or invalidated. The key's byte counts the
    /// registrations at its index (`take_index`), so a key comes back on another region
    /// only after 256 registrations there; the PD and range checks keep even that one
    /// inside a region the WR's PD may use.
    fn region<'a>(
        &self,
        mrs: &'a MrTable,
        pd: u32,
        at: usize,
        n: usize,
    ) -> Result<&'a MrInner, AccessError> {
        let mr = mrs
            .lookup(self.lkey, false, pd)
            .map_err(|_| AccessError::Invalidated)?;
        let start = self.off.checked_add(at).ok_or(AccessError::Range)?;
        let inside = start
            .checked_sub(mr.offset)
            .and_then(|o| (o as u64).checked_add(n as u64))
            .is_some_and(|end| end <= mr.info.length);
        if inside {
            Ok(mr)
        } else {
            Err(AccessError::Invalidated)
        }
    }
}

/// A resolved scatter/gather list: what a work request reads from or writes to, checked
/// once when posted and looked up in the region table at each access. (Inline data stays
/// in the send WQE; see `SendWqe::gather`.)
///
/// `repr(C)`, the count first: a WQE deep in a queue is cold, and a one-SGE WR then
/// finds the count and its entry on one cache line.
#[derive(Debug, Clone, Default)]
#[repr(C)]
pub struct Segs {
    n: u8,
    /// The PD the keys were checked against (a receive queue's may be its SRQ's).
    pd: u32,
    total: u64,
    segs: [Seg; MAX_SGE],
}

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(Segs, n) < offset_of!(Segs, segs));
    assert!(offset_of!(Segs, pd) < offset_of!(Segs, segs));
    assert!(offset_of!(Segs, total) < offset_of!(Segs, segs));
};

impl Segs {
    /// The bytes a one-entry list reads, counted from its start: the count, the total
    /// and the first entry (the count and total come first, checked below).
    pub(crate) const FIRST_ENTRY_END: usize =
        std::mem::offset_of!(Segs, segs) + std::mem::size_of::<Seg>();

    /// Resolves `sges` against the table, into this (recycled) list: each key valid, of PD
    /// `pd`, the range inside its region, and LOCAL_WRITE granted if the engine will write
    /// (`write`). On error the list is left empty.
    pub fn resolve_into(
        &mut self,
        mrs: &MrTable,
        pd: u32,
        sges: &SgList,
        write: bool,
    ) -> Result<(), AccessError> {
        self.clear();
        self.pd = pd;
        let r = self.fill(mrs, pd, sges, write);
        if r.is_err() {
            self.clear();
        }
        r
    }

    fn fill(
        &mut self,
        mrs: &MrTable,
        pd: u32,
        sges: &SgList,
        write: bool,
    ) -> Result<(), AccessError> {
        let mut n = 0;
        for sge in sges.as_slice() {
            if sge.length == 0 {
                continue;
            }
            let Sge { addr, length, lkey } = *sge;
            let mr = mrs.lookup(lkey, false, pd)?;
            if write && !mr.access().contains(AccessFlags::LOCAL_WRITE) {
                return Err(AccessError::Permission);
            }
            let off = mr
                .range(addr, u64::from(length))
                .ok_or(AccessError::Range)?;
            self.segs[n] = Seg {
                lkey,
                len: length,
                off,
            };
            n += 1;
            self.n = n as u8;
            self.total += u64::from(length);
        }
        Ok(())
    }

    /// Empties the list (it holds no references, so this writes two fields).
    pub fn clear(&mut self) {
        self.n = 0;
        self.total = 0;
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    fn iter(&self) -> impl Iterator<Item = &Seg> {
        self.segs[..usize::from(self.n)].iter()
    }

    /// Copies message bytes `off..off + dst.len()` into `dst`.
    pub fn gather(&self, mrs: &MrTable, off: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        self.walk(mrs, off, dst.len(), |mr, mem_off, at, n| {
            mr.memory()
                .read(mem_off, &mut dst[at..at + n])
                .map_err(|_| AccessError::Range)
        })
    }

    /// Warms the cache for message bytes `off..off + len` (see [`Memory::prefetch`]);
    /// the part past the message's end, or in a region no longer valid, is skipped.
    pub fn prefetch(&self, mrs: &MrTable, off: u64, len: usize) {
        let mut skip = off;
        let mut left = len;
        for seg in self.iter() {
            if left == 0 {
                break;
            }
            let l = u64::from(seg.len);
            if skip >= l {
                skip -= l;
                continue;
            }
            let n = ((l - skip) as usize).min(left);
            if let Ok(mr) = seg.region(mrs, self.pd, skip as usize, n) {
                mr.memory().prefetch(seg.off + skip as usize, n);
            }
            left -= n;
            skip = 0;
        }
    }

    /// Copies `src` into message bytes `off..off + src.len()`. The regions must still
    /// grant LOCAL_WRITE (checked at post time too, but a key that came back on another
    /// region may not grant it).
    pub fn scatter(&self, mrs: &MrTable, off: u64, src: &[u8]) -> Result<(), AccessError> {
        self.walk(mrs, off, src.len(), |mr, mem_off, at, n| {
            if !mr.access().contains(AccessFlags::LOCAL_WRITE) {
                return Err(AccessError::Permission);
            }
            mr.memory()
                .write(mem_off, &src[at..at + n])
                .map_err(|_| AccessError::Range)
        })
    }

    /// [`Self::scatter`] for a received payload, piece by piece (a chained frame's payload
    /// lies in two buffers).
    pub fn scatter_payload(
        &self,
        mrs: &MrTable,
        mut off: u64,
        p: Pieces<'_>,
    ) -> Result<(), AccessError> {
        if p.rest.is_empty() {
            return self.scatter(mrs, off, p.first);
        }
        for piece in p.iter() {
            self.scatter(mrs, off, piece)?;
            off += piece.len() as u64;
        }
        Ok(())
    }

    /// Calls `f(region, offset in its memory, offset in the caller's buffer, count)` for
    /// each piece of message bytes `off..off+len`, each region looked up by its key.
    fn walk(
        &self,
        mrs: &MrTable,
        off: u64,
        len: usize,
        mut f: impl FnMut(&MrInner, usize, usize, usize) -> Result<(), AccessError>,
    ) -> Result<(), AccessError> {
        if off.checked_add(len as u64).is_none_or(|e| e > self.total) {
            return Err(AccessError::Range);
        }
        let mut skip = off;
        let mut at = 0usize;
        for seg in self.iter() {
            if at == len {
                break;
            }
            let l = u64::from(seg.len);
            if skip >= l {
                skip -= l;
                continue;
            }
            let seg_off = skip as usize;
            let n = (seg.len as usize - seg_off).min(len - at);
            let mr = seg.region(mrs, self.pd, seg_off, n)?;
            f(mr, seg.off + seg_off, at, n)?;
            at += n;
            skip = 0;
        }
        if at == len {
            Ok(())
        } else {
            Err(AccessError::Range)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (MrTable, Rng, Arc<Memory>) {
        (MrTable::default(), Rng::new(1), Memory::new(4096))
    }

    #[test]
    fn a_lent_region_is_not_deregistered_under_a_bound_window() {
        let mut buf = vec![0u8; 256];
        // SAFETY: `buf` outlives the table's use of it (both end with this test).
        let lent = unsafe { Memory::borrowed(buf.as_mut_ptr(), buf.len()) };
        let (mut t, mut rng, owned) = table();
        let acc = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let a = t
            .register(&mut rng, 1, lent, 0, 256, 0x1000, acc, 10)
            .unwrap();
        let rkey = t.alloc_window(&mut rng, 1, 10).unwrap();
        let bind = MwBind {
            mw: rkey >> 8,
            rkey,
            lkey: a.lkey,
            addr: 0x1000,
            length: 64,
            access: AccessFlags::REMOTE_WRITE,
        };
        t.bind_window(1, 0x11, &bind).unwrap();
        assert!(matches!(
            t.deregister(a.lkey),
            Err(Error::Busy { users: 1, .. })
        ));
        t.dealloc_window(rkey >> 8).unwrap();
        // Work in flight holding it does not keep it: its next access finds it invalid.
        let held = t.lookup(a.lkey, false, 1).unwrap().clone();
        t.deregister(a.lkey).unwrap();
        assert!(!held.is_valid());
        // The engine's own memory lets a bound window go invalid with the region.
        let b = t
            .register(&mut rng, 1, owned, 0, 64, 0x2000, acc, 10)
            .unwrap();
        let rkey = t.alloc_window(&mut rng, 1, 10).unwrap();
        let bind = MwBind {
            lkey: b.lkey,
            addr: 0x2000,
            mw: rkey >> 8,
            rkey,
            ..bind
        };
        t.bind_window(1, 0x11, &bind).unwrap();
        t.deregister(b.lkey).unwrap();
        drop(buf);
    }

    #[test]
    fn keys_are_distinct_and_checked() {
        let (mut t, mut rng, mem) = table();
        let a = t
            .register(
                &mut rng,
                1,
                mem.clone(),
                0,
                100,
                0x1000,
                AccessFlags::REMOTE_READ,
                10,
            )
            .unwrap();
        assert_ne!(a.lkey >> 8, 0);
        assert_eq!(a.lkey >> 8, a.rkey >> 8);
        assert!(t.lookup(a.lkey, false, 1).is_ok());
        assert_eq!(t.lookup(a.lkey, false, 2).unwrap_err(), AccessError::BadKey);
        assert_eq!(
            t.lookup(a.lkey ^ 1, false, 1).unwrap_err(),
            AccessError::BadKey
        );
        assert!(
            t.remote(1, 0x11, a.rkey, 0x1000, 100, AccessFlags::REMOTE_READ)
                .is_ok()
        );
        assert_eq!(
            t.remote(1, 0x11, a.rkey, 0x1000, 100, AccessFlags::REMOTE_WRITE)
                .unwrap_err(),
            AccessError::Permission
        );
        assert_eq!(
            t.remote(1, 0x11, a.rkey, 0x1001, 100, AccessFlags::REMOTE_READ)
                .unwrap_err(),
            AccessError::Range
        );
        // A reused index gets a different key byte, so the old keys stay dead.
        t.deregister(a.lkey).unwrap();
        let mem2 = mem.clone();
        let b = t
            .register(
                &mut rng,
                1,
                mem,
                0,
                100,
                0x1000,
                AccessFlags::REMOTE_READ,
                10,
            )
            .unwrap();
        assert_eq!(b.lkey >> 8, a.lkey >> 8);
        assert_ne!(b.lkey, a.lkey);
        assert_ne!(b.rkey, a.rkey);
        assert!(t.lookup(a.lkey, false, 1).is_err());
        assert!(t.deregister(a.lkey).is_err());
        // A dead L_Key comes back at its slot only after 256 registrations there: a
        // posted WR holds the key, and must not reach the regions registered after.
        let mut seen = std::collections::HashSet::from([a.lkey]);
        let mut last = b;
        for _ in 0..254 {
            t.deregister(last.lkey).unwrap();
            last = t
                .register(
                    &mut rng,
                    1,
                    mem2.clone(),
                    0,
                    100,
                    0x1000,
                    AccessFlags::REMOTE_READ,
                    10,
                )
                .unwrap();
            assert_eq!(last.lkey >> 8, a.lkey >> 8, "the slot is reused");
            assert!(seen.insert(last.lkey), "L_Key {:#x} came back", last.lkey);
        }
        assert_eq!(seen.len(), 255);
    }

    #[test]
    fn registration_rules() {
        let (mut t, mut rng, mem) = table();
        assert!(
            t.register(
                &mut rng,
                1,
                mem.clone(),
                0,
                100,
                0,
                AccessFlags::REMOTE_WRITE,
                10
            )
            .is_err()
        );
        assert!(
            t.register(
                &mut rng,
                1,
                mem.clone(),
                4000,
                100,
                0,
                AccessFlags::EMPTY,
                10
            )
            .is_err()
        );
        assert!(
            t.register(
                &mut rng,
                1,
                mem.clone(),
                0,
                100,
                u64::MAX - 50,
                AccessFlags::EMPTY,
                10
            )
            .is_err()
        );
        t.register(&mut rng, 1, mem.clone(), 0, 1, 0, AccessFlags::EMPTY, 1)
            .unwrap();
        assert!(matches!(
            t.register(&mut rng, 1, mem, 0, 1, 0, AccessFlags::EMPTY, 1),
            Err(Error::Limit { .. })
        ));
    }

    #[test]
    fn gather_and_scatter_across_segments() {
        let (mut t, mut rng, mem) = table();
        let lw = AccessFlags::LOCAL_WRITE;
        let a = t
            .register(&mut rng, 1, mem.clone(), 0, 4096, mem.addr(), lw, 10)
            .unwrap();
        let sges = SgList::new(&[
            Sge {
                addr: mem.addr() + 10,
                length: 5,
                lkey: a.lkey,
            },
            Sge {
                addr: mem.addr() + 100,
                length: 0,
                lkey: 0,
            },
            Sge {
                addr: mem.addr() + 200,
                length: 7,
                lkey: a.lkey,
            },
        ])
        .unwrap();
        let mut s = Segs::default();
        s.resolve_into(&t, 1, &sges, true).unwrap();
        assert_eq!(s.total(), 12);
        s.scatter(&t, 3, &[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(mem.to_vec(13, 2).unwrap(), [1, 2]);
        assert_eq!(mem.to_vec(200, 3).unwrap(), [3, 4, 5]);
        let mut out = [0u8; 5];
        s.gather(&t, 3, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5]);
        assert!(s.gather(&t, 8, &mut [0u8; 5]).is_err());
        assert!(s.scatter(&t, u64::MAX, &[1]).is_err());
        // Without LOCAL_WRITE the list cannot be written.
        let b = t
            .register(
                &mut rng,
                1,
                mem.clone(),
                0,
                4096,
                mem.addr(),
                AccessFlags::EMPTY,
                10,
            )
            .unwrap();
        let sges = SgList::new(&[Sge {
            addr: mem.addr(),
            length: 5,
            lkey: b.lkey,
        }])
        .unwrap();
        assert_eq!(
            s.resolve_into(&t, 1, &sges, true).unwrap_err(),
            AccessError::Permission
        );
        assert_eq!(s.total(), 0, "a refused list is left empty");
        s.resolve_into(&t, 1, &sges, false).unwrap();
        t.deregister(b.lkey).unwrap();
        assert_eq!(
            s.gather(&t, 0, &mut [0u8; 5]).unwrap_err(),
            AccessError::Invalidated
        );
        // A region registered next takes the freed slot with another key: the list
        // resolved against the old one does not reach it.
        let c = t
            .register(&mut rng, 1, mem.clone(), 0, 4096, mem.addr(), lw, 10)
            .unwrap();
        assert_eq!(c.lkey >> 8, b.lkey >> 8, "the slot is reused");
        assert_ne!(c.lkey, b.lkey);
        assert_eq!(
            s.gather(&t, 0, &mut [0u8; 5]).unwrap_err(),
            AccessError::Invalidated
        );
        let mut fresh = Segs::default();
        fresh
            .resolve_into(
                &t,
                1,
                &SgList::new(&[Sge {
                    lkey: c.lkey,
                    ..sges.as_slice()[0]
                }])
                .unwrap(),
                true,
            )
            .unwrap();
        fresh.gather(&t, 0, &mut [0u8; 5]).unwrap();
        // Checked against the PD it was posted with: another PD's list fails.
        fresh.pd = 2;
        assert_eq!(
            fresh.gather(&t, 0, &mut [0u8; 5]).unwrap_err(),
            AccessError::Invalidated
        );
    }
}

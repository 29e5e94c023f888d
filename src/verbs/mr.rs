//! Memory and memory regions.
//!
//! [`Memory`] is a buffer the application and the engine share: page-aligned, zeroed,
//! never moved or freed while an `Arc` to it lives. All access goes through bounds-checked
//! copies ([`Memory::read`], [`Memory::write`]) and 8-byte atomics for RDMA atomics, so
//! no input from the wire can make the engine touch memory outside a registered range.
//!
//! A `Memory` can also be borrowed from the application ([`Memory::borrowed`]): the C
//! ABI registers a program's own buffers where they lie (malloc'd, mmap'd, on the stack)
//! instead of copying them. The engine then must not touch them once `ibv_dereg_mr` has
//! returned: deregistration runs on the engine thread, under the lock every access holds
//! (the engine thread's rounds, or those a caller runs as it polls), and each
//! access checks that its region is still valid, so work in flight finds it gone. A
//! borrowed region with a memory window bound is refused (busy), as by `ibv_dereg_mr`.
//!
//! As with ibverbs, the application must not read or write a range while a posted work
//! request or a remote peer may be accessing it: the bytes it sees are then unspecified.
//!
//! A memory region ([`MrInfo`] to the user, `MrInner` in the engine) grants access to a
//! range of a `Memory` at an I/O virtual address (IOVA), with a local key (lkey) and a
//! remote key (rkey). A key is the region's table index in its upper 24 bits and a random
//! byte in its low 8 bits (like rxe's), drawn independently for lkey and rkey and redrawn
//! when an index is reused, so a stale or guessed key does not match.

use super::types::AccessFlags;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Alignment of every [`Memory`]: a page, so 8-byte atomics are aligned wherever the
/// offset is.
pub const MEMORY_ALIGN: usize = 4096;

/// A byte range was outside the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}..{offset}+{len} is outside the {size}-byte memory")]
pub struct OutOfBounds {
    pub offset: usize,
    pub len: usize,
    pub size: usize,
}

/// A page-aligned, zero-initialised buffer shared by the application and the engine, or
/// a range of the application's own memory it lent ([`Memory::borrowed`]).
pub struct Memory {
    ptr: NonNull<u8>,
    len: usize,
    /// Allocated by `new` (and freed on drop), or lent by the application.
    owned: bool,
}

// SAFETY: `Memory` owns its allocation and hands out no references to its bytes; every
// access is a bounds-checked raw copy or an atomic, so sharing it between threads cannot
// produce an out-of-bounds access or a use after free. (Concurrent conflicting writes to
// the same bytes are a bug of the program that posts them, as in ibverbs; they cannot
// break memory safety of anything outside those bytes.)
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    /// Allocates `len` zeroed bytes (at least 1).
    pub fn new(len: usize) -> Arc<Memory> {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least one byte) and a valid alignment.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Arc::new(Memory {
            ptr,
            len,
            owned: true,
        })
    }

    /// The application's `len` bytes at `ptr`, used in place and never freed here.
    ///
    /// # Safety
    /// The range must be mapped, readable (and writable if anything will write to it)
    /// and stay so for as long as the engine may access it: until the region over it is
    /// deregistered with nothing in flight holding it. `ptr` may be null only if `len`
    /// is 0.
    pub unsafe fn borrowed(ptr: *mut u8, len: usize) -> Arc<Memory> {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        Arc::new(Memory {
            ptr,
            len,
            owned: false,
        })
    }

    /// True when the bytes belong to the application ([`Memory::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        !self.owned
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len.max(1), MEMORY_ALIGN)
            .unwrap_or_else(|_| panic!("memory of {len} bytes is too large"))
    }

    /// A memory holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Arc<Memory> {
        let m = Memory::new(data.len());
        m.write(0, data)
            .unwrap_or_else(|_| unreachable!("sized to fit"));
        m
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte: the IOVA a region over this memory gets by default,
    /// as ibverbs registers buffers at their virtual address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, dst.len())?;
        // SAFETY: `offset..offset+len` is inside the allocation (checked above); `dst` is
        // a valid writable slice. `copy` tolerates overlap should the caller alias us.
        unsafe {
            std::ptr::copy(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// Asks the CPU to start loading `offset..offset + len` into its caches (the part of
    /// it inside the memory; nothing outside is touched). The engine calls it for the
    /// payload of a packet a few ahead of the one it is building, so that the copy out
    /// of a cold buffer does not wait on memory: between two batches the kernel's
    /// transmit work runs on the same core and the hardware prefetcher loses the stream.
    #[inline]
    pub fn prefetch(&self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.len);
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let mut at = offset;
            while at < end {
                // SAFETY: `at` is inside the allocation (`at < end <= len`); a prefetch
                // neither faults nor changes memory, it only warms the cache.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.as_ptr().add(at).cast()) };
                at += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = end;
    }

    /// The byte at `offset`, read with a volatile load: for polling memory that the wire
    /// writes without a completion telling when (perftest's latency loop). Ordinary
    /// reads may be assumed unchanged between two of them by the compiler; after a
    /// completion was polled they are fine (the CQ orders them).
    #[inline]
    pub fn load_volatile(&self, offset: usize) -> Result<u8, OutOfBounds> {
        self.check(offset, 1)?;
        // SAFETY: `offset` is inside the allocation (checked above); a byte has no
        // alignment requirement.
        Ok(unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset)) })
    }

    /// Copies `src` into the memory at `offset`.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, src.len())?;
        // SAFETY: the destination range is inside the allocation (checked above); `src` is
        // a valid readable slice; `copy` tolerates overlap.
        unsafe {
            std::ptr::copy(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfBounds> {
        self.check(offset, len)?;
        // SAFETY: the range is inside the allocation (checked above).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// A copy of `len` bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, OutOfBounds> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// The 8 bytes at `offset` as an atomic, for RDMA atomics. `None` unless their
    /// address is a multiple of 8 and the 8 bytes are inside the memory.
    #[inline]
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        let addr = (self.ptr.as_ptr() as usize).wrapping_add(offset);
        if !addr.is_multiple_of(8) || self.check(offset, 8).is_err() {
            return None;
        }
        // SAFETY: in bounds (checked), 8-byte aligned (the address was checked), and the
        // memory outlives `&self` (owned, or lent under `borrowed`'s contract).
        // `AtomicU64` has the size and alignment of `u64`, and all other accesses to these
        // bytes are raw copies, never references, so no `&mut` aliases it.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast::<u64>()) })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: allocated in `new` with this layout and not freed since.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
        }
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Memory({} bytes at 0x{:x})", self.len, self.addr())
    }
}

/// What the user gets back from registering a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub lkey: u32,
    pub rkey: u32,
    /// The IOVA of the first byte (`ibv_mr.addr`).
    pub addr: u64,
    pub length: u64,
    pub access: AccessFlags,
    pub pd: u32,
}

/// A registered region, as the engine holds it. In-flight operations keep an `Arc` to
/// it; deregistration clears `valid`, so later packets are refused while memory that an
/// operation already holds stays allocated.
#[derive(Debug)]
pub struct MrInner {
    pub(crate) info: MrInfo,
    pub(crate) mem: Arc<Memory>,
    /// Offset in `mem` of the byte at `info.addr`.
    pub(crate) offset: usize,
    pub(crate) valid: AtomicBool,
    pub(crate) kind: MrKind,
}

/// What a key of the table opens.
#[derive(Debug)]
pub(crate) enum MrKind {
    /// A registered region.
    Region,
    /// A memory window (type 2): no lkey, and only windows can be invalidated
    /// (SEND_WITH_INV, LOCAL_INV). Unbound until a BIND_MW binds it.
    UnboundWindow,
    /// A bound window: the region under it, and the QP it was bound through, the only QP
    /// that may use it (IBA 10.6.7.2).
    Window { region: Arc<MrInner>, qpn: u32 },
}

impl MrInner {
    pub(crate) fn new(info: MrInfo, mem: Arc<Memory>, offset: usize) -> MrInner {
        MrInner {
            info,
            mem,
            offset,
            valid: AtomicBool::new(true),
            kind: MrKind::Region,
        }
    }

    /// A memory window not bound to anything: its key opens nothing.
    pub(crate) fn unbound_window(rkey: u32, pd: u32) -> MrInner {
        let info = MrInfo {
            lkey: 0,
            rkey,
            addr: 0,
            length: 0,
            access: AccessFlags::EMPTY,
            pd,
        };
        MrInner {
            info,
            mem: Memory::new(0),
            offset: 0,
            valid: AtomicBool::new(false),
            kind: MrKind::UnboundWindow,
        }
    }

    /// True for a region, or a window bound to a region that is still valid.
    #[inline]
    pub fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
            && match &self.kind {
                MrKind::Window { region, .. } => region.is_valid(),
                _ => true,
            }
    }

    /// A memory window, bound or not (not a region).
    #[inline]
    pub(crate) fn is_window(&self) -> bool {
        !matches!(self.kind, MrKind::Region)
    }

    /// The QP a bound window may be used through (`None` for a region).
    #[inline]
    pub(crate) fn window_qp(&self) -> Option<u32> {
        match &self.kind {
            MrKind::Window { qpn, .. } => Some(*qpn),
            _ => None,
        }
    }

    pub(crate) fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }

    /// The offset in the memory of `len` bytes at IOVA `va`, if the region holds them all.
    /// Wrap-around of `va + len` is refused.
    #[inline]
    pub fn range(&self, va: u64, len: u64) -> Option<usize> {
        let start = self.info.addr;
        let end = start.checked_add(self.info.length)?;
        let req_end = va.checked_add(len)?;
        if va < start || req_end > end {
            return None;
        }
        usize::try_from(va - start).ok()?.checked_add(self.offset)
    }

    #[inline]
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    #[inline]
    pub fn access(&self) -> AccessFlags {
        self.info.access
    }
}

/// Checks the ibverbs rule that remote write and atomic access need local write
/// (`ibv_reg_mr` fails with EINVAL otherwise).
pub fn check_access(access: AccessFlags) -> Result<(), &'static str> {
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE");
    }
    if access.intersects(AccessFlags::ON_DEMAND | AccessFlags::ZERO_BASED) {
        return Err("ON_DEMAND and ZERO_BASED are not supported");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_bounds_and_atomics() {
        let m = Memory::new(64);
        assert_eq!(m.addr() % MEMORY_ALIGN as u64, 0);
        m.write(60, &[1, 2, 3, 4]).unwrap();
        assert!(m.write(61, &[1, 2, 3, 4]).is_err());
        assert!(m.write(usize::MAX, &[1]).is_err());
        let mut b = [0u8; 4];
        m.read(60, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        assert!(m.read(64, &mut [0u8; 1]).is_err());
        assert!(m.read(64, &mut []).is_ok());
        let a = m.atomic_u64(8).unwrap();
        a.fetch_add(5, Ordering::SeqCst);
        assert_eq!(m.to_vec(8, 8).unwrap(), 5u64.to_ne_bytes());
        assert!(m.atomic_u64(4).is_none());
        assert!(m.atomic_u64(64).is_none());
        assert!(m.atomic_u64(56).is_some());
    }

    #[test]
    fn borrowed_memory_is_used_in_place_and_aligned_by_address() {
        let mut buf = [0u64; 4];
        let base = buf.as_mut_ptr().cast::<u8>();
        // SAFETY: the 28 bytes from base+4 lie inside `buf`, which outlives `m`.
        let m = unsafe { Memory::borrowed(base.add(4), 28) };
        assert!(m.is_borrowed() && !Memory::new(1).is_borrowed());
        m.write(0, &[0xaa; 4]).unwrap();
        assert!(m.write(25, &[1; 4]).is_err());
        // Offset 4 of the lent range is the 8-aligned address base+8; offset 0 is not.
        assert!(m.atomic_u64(0).is_none());
        m.atomic_u64(4).unwrap().fetch_add(7, Ordering::SeqCst);
        assert!(m.atomic_u64(24).is_none(), "only 4 bytes left");
        drop(m);
        assert_eq!(buf[0].to_ne_bytes()[4..], [0xaa; 4]);
        assert_eq!(buf[1], 7);
        // SAFETY: an empty range needs no memory at all.
        let e = unsafe { Memory::borrowed(std::ptr::null_mut(), 0) };
        assert!(e.read(0, &mut []).is_ok() && e.read(0, &mut [0]).is_err());
    }

    #[test]
    fn region_range_refuses_wrap_and_overrun() {
        let m = Memory::new(4096);
        let info = MrInfo {
            lkey: 1,
            rkey: 2,
            addr: u64::MAX - 100,
            length: 100,
            access: AccessFlags::REMOTE_READ,
            pd: 0,
        };
        let mr = MrInner::new(info, m, 16);
        assert_eq!(mr.range(u64::MAX - 100, 100), Some(16));
        assert_eq!(mr.range(u64::MAX - 10, 10), Some(106));
        assert_eq!(mr.range(u64::MAX - 10, 11), None);
        assert_eq!(mr.range(u64::MAX, 2), None);
        assert_eq!(mr.range(u64::MAX - 101, 1), None);
        assert!(mr.is_valid());
        mr.invalidate();
        assert!(!mr.is_valid());
    }

    #[test]
    fn access_rules() {
        assert!(check_access(AccessFlags::REMOTE_WRITE).is_err());
        assert!(check_access(AccessFlags::REMOTE_ATOMIC | AccessFlags::REMOTE_READ).is_err());
        assert!(check_access(AccessFlags::REMOTE_READ).is_ok());
        assert!(check_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).is_ok());
    }
}

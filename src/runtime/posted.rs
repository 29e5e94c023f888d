//! The rings that carry posted WRs from the posting threads to the engine thread.
//!
//! A whole `SendWr` is 664 bytes (16 SGEs and 256 bytes of inline data in place) and a
//! `RecvWr` 264, and a ring holds one per queue slot: 1000 QPs of 16-deep queues held
//! 14 MiB of ring per side, which the engine thread walked through cold (`bench qps`).
//! Most WRs use one SGE and no inline data, so a ring slot holds a compact form of up to
//! [`POSTED_SGES`] SGEs; a WR that does not fit waits whole in an overflow ring,
//! allocated the first time one is posted, and its slot says to take it from there.
//! A poster pushes the overflow WR and then its slot under a lock, so the slots that say
//! "overflow" are in the ring in the order of the WRs in the overflow ring, and every
//! poster's WRs come out in the order it posted them (a WR posted after another one
//! returned executes after it, as on a NIC that takes one post at a time).

use crate::verbs::{RecvWr, SendFlags, SendWr, SgList, Sge, WrOpcode};
use crossbeam::queue::ArrayQueue;
use std::sync::{Mutex, OnceLock};

/// SGEs a ring slot holds in place.
pub(crate) const POSTED_SGES: usize = 4;

/// A WR type with a compact form for the ring.
pub(crate) trait Compact: Sized {
    type Small: Copy;
    /// The compact form, or `None` when the WR does not fit it.
    fn compact(&self) -> Option<Self::Small>;
    /// Makes `into` the WR `s` stands for. Of the SGE array only the entries `s` holds
    /// are written; the rest keep what they held and mean nothing.
    fn expand_into(s: &Self::Small, into: &mut Self);
}

/// `list` in place, with its length; `None` when it is longer than [`POSTED_SGES`].
/// (The length stays beside the array in each compact form, so that it packs with
/// their other small fields.)
fn small_sges(list: &SgList) -> Option<([Sge; POSTED_SGES], u8)> {
    let list = list.as_slice();
    if list.len() > POSTED_SGES {
        return None;
    }
    let mut sges = [Sge::default(); POSTED_SGES];
    sges[..list.len()].copy_from_slice(list);
    Some((sges, list.len() as u8))
}

/// A send WR without inline data, UD destination or memory-window bind, with at most
/// [`POSTED_SGES`] SGEs.
#[derive(Clone, Copy)]
pub(crate) struct SmallSend {
    wr_id: u64,
    remote_addr: u64,
    compare_add: u64,
    swap: u64,
    sges: [Sge; POSTED_SGES],
    send_flags: SendFlags,
    imm_data: u32,
    invalidate_rkey: u32,
    rkey: u32,
    opcode: WrOpcode,
    n_sge: u8,
}

impl Compact for SendWr {
    type Small = SmallSend;

    fn compact(&self) -> Option<SmallSend> {
        if self.inline.is_some() || self.ud.is_some() || self.bind.is_some() {
            return None;
        }
        let (sges, n_sge) = small_sges(&self.sg_list)?;
        Some(SmallSend {
            wr_id: self.wr_id,
            remote_addr: self.remote_addr,
            compare_add: self.compare_add,
            swap: self.swap,
            sges,
            send_flags: self.send_flags,
            imm_data: self.imm_data,
            invalidate_rkey: self.invalidate_rkey,
            rkey: self.rkey,
            opcode: self.opcode,
            n_sge,
        })
    }

    fn expand_into(s: &SmallSend, w: &mut SendWr) {
        w.wr_id = s.wr_id;
        w.opcode = s.opcode;
        w.send_flags = s.send_flags;
        // Cannot fail: at most POSTED_SGES (< MAX_SGE) entries.
        w.sg_list.assign(&s.sges[..usize::from(s.n_sge)]);
        w.inline = None;
        w.imm_data = s.imm_data;
        w.invalidate_rkey = s.invalidate_rkey;
        w.remote_addr = s.remote_addr;
        w.rkey = s.rkey;
        w.compare_add = s.compare_add;
        w.swap = s.swap;
        w.ud = None;
        w.bind = None;
    }
}

/// A receive WR with at most [`POSTED_SGES`] SGEs.
#[derive(Clone, Copy)]
pub(crate) struct SmallRecv {
    wr_id: u64,
    sges: [Sge; POSTED_SGES],
    n_sge: u8,
}

impl Compact for RecvWr {
    type Small = SmallRecv;

    fn compact(&self) -> Option<SmallRecv> {
        let (sges, n_sge) = small_sges(&self.sg_list)?;
        Some(SmallRecv {
            wr_id: self.wr_id,
            sges,
            n_sge,
        })
    }

    fn expand_into(s: &SmallRecv, w: &mut RecvWr) {
        w.wr_id = s.wr_id;
        w.sg_list.assign(&s.sges[..usize::from(s.n_sge)]);
    }
}

/// One ring slot.
#[derive(Clone, Copy)]
enum Slot<S> {
    Small(S),
    /// The WR waits whole in the overflow ring.
    Overflow,
}

/// A bounded multi-producer ring of posted WRs with its overflow ring.
pub(crate) struct PostRing<W: Compact> {
    ring: ArrayQueue<Slot<W::Small>>,
    overflow: OnceLock<ArrayQueue<W>>,
    /// Held from an overflow WR's push to its slot's.
    overflow_order: Mutex<()>,
}

impl<W: Compact> PostRing<W> {
    pub(crate) fn new(cap: usize) -> Self {
        PostRing {
            ring: ArrayQueue::new(cap.max(1)),
            overflow: OnceLock::new(),
            overflow_order: Mutex::new(()),
        }
    }

    /// Pushes `wr`; while a ring is full, calls `full()`, which returns false to give up
    /// (the engine has stopped) or makes room (wakes the engine thread and yields).
    pub(crate) fn push(&self, wr: &W, mut full: impl FnMut() -> bool) -> Result<(), ()>
    where
        W: Clone,
    {
        if let Some(s) = wr.compact() {
            return push_until(&self.ring, Slot::Small(s), &mut full);
        }
        let _order = self
            .overflow_order
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let big = self
            .overflow
            .get_or_init(|| ArrayQueue::new(self.ring.capacity()));
        push_until(big, wr.clone(), &mut full)?;
        push_until(&self.ring, Slot::Overflow, &mut full)
    }

    /// Takes the oldest WR posted into `into`, which the engine thread keeps from one
    /// WR to the next: `Some(true)` when `into` now holds it, `Some(false)` for an
    /// overflow slot whose WR is missing (the push order rules that out), `None` when
    /// the ring is empty. A `SendWr` returned by value was built whole (its 16 SGEs
    /// zeroed) and moved twice on its way to the engine: 44-81 ns of `memmove` per
    /// 64 B WRITE on the requester's core (perf, `bench write -s 64`).
    pub(crate) fn pop_into(&self, into: &mut W) -> Option<bool> {
        Some(match self.ring.pop()? {
            Slot::Small(s) => {
                W::expand_into(&s, into);
                true
            }
            Slot::Overflow => match self.overflow.get().and_then(|q| q.pop()) {
                Some(w) => {
                    *into = w;
                    true
                }
                None => false,
            },
        })
    }

    /// Bytes of ring this holds (the overflow ring once it exists).
    #[cfg(test)]
    fn footprint(&self) -> usize {
        self.ring.capacity() * std::mem::size_of::<Slot<W::Small>>()
            + self
                .overflow
                .get()
                .map_or(0, |q| q.capacity() * std::mem::size_of::<W>())
    }
}

/// Pushes `v` onto `q`, calling `full()` while it is full until it returns false.
pub(crate) fn push_until<T>(
    q: &ArrayQueue<T>,
    mut v: T,
    full: &mut impl FnMut() -> bool,
) -> Result<(), ()> {
    loop {
        match q.push(v) {
            Ok(()) => return Ok(()),
            Err(back) => {
                if !full() {
                    return Err(());
                }
                v = back;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::wr::InlineData;

    fn sge(i: u32) -> Sge {
        Sge {
            addr: 0x1000 * u64::from(i),
            length: 100 + i,
            lkey: 7,
        }
    }

    #[test]
    fn compact_wrs_come_back_equal_and_in_order_with_the_overflowing_ones() {
        let ring: PostRing<SendWr> = PostRing::new(8);
        let sges: Vec<Sge> = (0..6).map(sge).collect();
        let mut imm =
            SendWr::write(3, &sges[..1], 0xabc, 9).with_opcode(WrOpcode::RdmaWriteWithImm);
        imm.imm_data = 0x1234;
        let mut inline = SendWr::send(4, &[]).with_flags(SendFlags::INLINE | SendFlags::SIGNALED);
        inline.inline = InlineData::new(b"in place");
        let wrs = [
            SendWr::send(1, &sges[..1]),
            SendWr::send(2, &sges[..6]),
            imm,
            inline,
            SendWr::read(5, &sges[..4], 0x2000, 11),
        ];
        for w in &wrs {
            ring.push(w, || false).unwrap();
        }
        let small = 8 * std::mem::size_of::<Slot<SmallSend>>();
        assert!(small < 8 * std::mem::size_of::<SendWr>() / 4, "{small}");
        assert_eq!(ring.footprint(), small + 8 * std::mem::size_of::<SendWr>());
        // One scratch WR for all, as the engine thread keeps: what an earlier WR left in
        // it (six SGEs, inline data) must not show through a later compact one.
        let mut into = SendWr::send(0, &[]);
        for w in &wrs {
            assert_eq!(ring.pop_into(&mut into), Some(true));
            assert_eq!(into, *w);
        }
        assert_eq!(ring.pop_into(&mut into), None);
        // Full: the caller is asked, and giving up fails the push.
        let ring: PostRing<RecvWr> = PostRing::new(1);
        ring.push(&RecvWr::new(1, &sges[..2]), || false).unwrap();
        let mut asked = 0;
        let r = ring.push(&RecvWr::new(2, &sges[..2]), || {
            asked += 1;
            asked < 3
        });
        assert_eq!((r, asked), (Err(()), 3));
        let mut into = RecvWr::new(9, &sges[..5]);
        assert_eq!(ring.pop_into(&mut into), Some(true));
        assert_eq!(into, RecvWr::new(1, &sges[..2]));
        assert_eq!(ring.footprint(), std::mem::size_of::<Slot<SmallRecv>>());
    }
}

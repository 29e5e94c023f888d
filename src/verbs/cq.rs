//! Completion queues (`ibv_cq`) and shared receive queues (`ibv_srq`).

use super::wr::{RecvWr, Wc};
use std::collections::VecDeque;

/// A completion queue of fixed depth. A completion that does not fit is not dropped
/// silently: the CQ enters the error state and the engine raises `AsyncEvent::CqErr`
/// (and moves the QP that lost a completion to ERR), as IBA 11.4.2.1 and rxe do.
#[derive(Debug)]
pub struct Cq {
    pub(crate) id: u32,
    pub(crate) depth: usize,
    /// Completions, each with whether it is solicited (a receive of a message whose last
    /// packet had SE set), which decides the wake-up of a solicited-only waiter.
    pub(crate) entries: VecDeque<(Wc, bool)>,
    pub(crate) overflowed: bool,
    /// Armed by `req_notify_cq`: `Some(solicited_only)`.
    pub(crate) armed: Option<bool>,
    /// QPs that use this CQ (destroying it is refused while any does).
    pub(crate) users: u32,
    /// On the engine's list of CQs with new completions.
    pub(crate) touched: bool,
}

impl Cq {
    pub(crate) fn new(id: u32, depth: usize) -> Cq {
        Cq {
            id,
            depth,
            entries: VecDeque::with_capacity(depth),
            overflowed: false,
            armed: None,
            users: 0,
            touched: false,
        }
    }

    /// Queues a completion; false if the CQ is full (or already overflowed).
    pub(crate) fn push(&mut self, wc: Wc, solicited: bool) -> bool {
        if self.overflowed || self.entries.len() >= self.depth {
            self.overflowed = true;
            return false;
        }
        self.entries.push_back((wc, solicited));
        true
    }

    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn depth(&self) -> usize {
        self.depth
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

/// A shared receive queue: receive WRs that any QP attached to it consumes.
#[derive(Debug)]
pub struct Srq {
    pub(crate) id: u32,
    pub(crate) pd: u32,
    pub(crate) max_wr: usize,
    pub(crate) max_sge: usize,
    /// `srq_limit`: raise `SrqLimitReached` when fewer WRs remain (0 = disarmed).
    pub(crate) limit: usize,
    pub(crate) queue: VecDeque<RecvWr>,
    pub(crate) users: u32,
    /// Receive WRs taken from the queue by QPs so far (what a threaded runtime mirrors
    /// to check `max_wr` in the caller's thread).
    pub(crate) taken: u64,
}

impl Srq {
    pub(crate) fn new(id: u32, pd: u32, max_wr: usize, max_sge: usize) -> Srq {
        Srq {
            id,
            pd,
            max_wr,
            max_sge,
            limit: 0,
            queue: VecDeque::with_capacity(max_wr.min(4096)),
            users: 0,
            taken: 0,
        }
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

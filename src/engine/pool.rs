//! Recycled work-queue entries.
//!
//! When this was measured a send WQE was 1096 bytes (the WR with its SG list and inline
//! buffer, plus the resolved segments) and a receive WQE 416 (x86_64). Held by value in
//! the queues, each was moved several times per message (built, pushed, popped on retire or on receive):
//! `perf` on the engine bench put those moves at ~40% of the time of 64-byte SENDs.
//! The queues hold boxes instead, written once in place and handed back here when
//! retired, so in steady state the heap is not touched: only while the free list grows
//! to the most WQEs ever outstanding at once, and when a QP that is reset or destroyed
//! drops the WQEs it still holds (the counting-allocator test checks the steady state).

/// What a pooled entry resets before it is reused: references that must not outlive the
/// work request, and state the next user expects fresh, not the plain fields it
/// overwrites. (The engine's WQEs hold no references: their buffers are keys.)
pub(crate) trait Recycle {
    fn recycle(&mut self);
}

/// A free list of boxed entries.
#[derive(Debug)]
pub(crate) struct Pool<T> {
    free: Vec<Box<T>>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Pool { free: Vec::new() }
    }
}

impl<T: Default + Recycle> Pool<T> {
    /// A recycled entry, or a new default one when the free list is empty.
    pub fn take(&mut self) -> Box<T> {
        self.free.pop().unwrap_or_default()
    }

    /// Returns an entry for reuse, dropping what it must not keep.
    pub fn give(&mut self, mut b: Box<T>) {
        b.recycle();
        self.free.push(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct E {
        held: Option<std::sync::Arc<u8>>,
        n: u32,
    }
    impl Recycle for E {
        fn recycle(&mut self) {
            self.held = None;
        }
    }

    #[test]
    fn entries_are_reused_and_release_their_references() {
        let mut p = Pool::<E>::default();
        let a = std::sync::Arc::new(7u8);
        let mut e = p.take();
        e.held = Some(a.clone());
        e.n = 3;
        let addr = &*e as *const E;
        p.give(e);
        assert_eq!(
            std::sync::Arc::strong_count(&a),
            1,
            "reference kept in the pool"
        );
        let e = p.take();
        assert_eq!(&*e as *const E, addr, "the same box comes back");
        assert!(e.held.is_none());
        assert!(p.free.is_empty());
    }
}

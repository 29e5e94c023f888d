//! Links: what carries the engine's frames.
//!
//! - [`sim`]: an in-memory network with seeded delay, loss, reordering, duplication,
//!   corruption and bandwidth limits, driving any number of [`Node`]s on simulated time.

pub mod bpf;
pub mod sim;
pub mod udp;
pub mod xdp;

use crate::time::Time;
use crate::wire::{Pieces, PiecesMut};

/// Something that sends and receives frames: the sans-IO engine's I/O surface
/// (quinn-proto's `handle_*` / `poll_*` split).
pub trait Node {
    /// A frame arrived.
    fn handle_frame(&mut self, now: Time, frame: &[u8]);
    /// A frame arrived in two pieces, `head` then `tail` (a link that chains a large
    /// frame over buffers). Nodes that take frames only whole get them joined.
    fn handle_frame_parts(&mut self, now: Time, head: &[u8], tail: &[u8]) {
        if tail.is_empty() {
            self.handle_frame(now, head);
        } else {
            let f = Pieces {
                first: head,
                rest: tail,
            }
            .to_vec();
            self.handle_frame(now, &f);
        }
    }
    /// The deadline returned by `poll_timeout` passed.
    fn handle_timeout(&mut self, now: Time);
    /// Writes the next frame to send into `buf`; its length, or `None` if nothing waits.
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize>;
    /// Writes the next frame to send into `head`, continuing in `tail` if it is longer
    /// (a link that chains a large frame over buffers). Nodes that build frames only
    /// whole write into `head`, which must then be large enough.
    fn poll_transmit_parts(
        &mut self,
        now: Time,
        head: &mut [u8],
        tail: &mut [u8],
    ) -> Option<usize> {
        let _ = tail;
        self.poll_transmit(now, head)
    }
    /// When `handle_timeout` must next be called, if ever.
    fn poll_timeout(&self) -> Option<Time>;
}

/// A link that moves whole Ethernet frames: what the runtime drives (AF_XDP, or UDP
/// sockets standing in for one).
pub trait FrameLink: Send {
    /// Receives up to `max` frames, handing each to `f` where it lies: in one piece, or
    /// in two when the link chained it over buffers (AF_XDP multi-buffer). Returns how
    /// many.
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Pieces<'_>)) -> usize;
    /// Sends frames that `fill` writes into the buffer it is given (returning the length,
    /// or `None` when there is nothing more to send), as many as the rings take. The
    /// buffer is one piece, or two when the link chains a frame over buffers: a frame
    /// longer than the first (AF_XDP multi-buffer: 3840 bytes) continues in the second.
    fn send(&mut self, fill: &mut dyn FnMut(PiecesMut<'_>) -> Option<usize>) -> usize;
    /// Pushes out anything queued and reaps transmit completions.
    fn flush(&mut self);
    /// File descriptors that become readable when frames arrive (for idle sleeps).
    fn fds(&self) -> Vec<std::os::fd::RawFd>;
    /// One line for logs: which link, which modes.
    fn describe(&self) -> String;
    /// True while frames handed to the kernel still wait to leave and only another
    /// `flush` moves them on (AF_XDP copy mode sends at most a budget of descriptors per
    /// kick): the driver must not sleep then, as no descriptor wakes it for that.
    fn tx_pending(&self) -> bool {
        false
    }
}

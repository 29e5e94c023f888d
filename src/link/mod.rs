//! Links: what carries the engine's frames.
//!
//! - [`sim`]: an in-memory network with seeded delay, loss, reordering, duplication,
//!   corruption and bandwidth limits, driving any number of [`Node`]s on simulated time.

pub mod sim;

use crate::time::Time;

/// Something that sends and receives frames: the sans-IO engine's I/O surface
/// (quinn-proto's `handle_*` / `poll_*` split).
pub trait Node {
    /// A frame arrived.
    fn handle_frame(&mut self, now: Time, frame: &[u8]);
    /// The deadline returned by `poll_timeout` passed.
    fn handle_timeout(&mut self, now: Time);
    /// Writes the next frame to send into `buf`; its length, or `None` if nothing waits.
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize>;
    /// When `handle_timeout` must next be called, if ever.
    fn poll_timeout(&self) -> Option<Time>;
}

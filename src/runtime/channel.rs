//! Completion channels (`ibv_comp_channel`): a file descriptor that becomes readable when
//! an armed CQ gets a completion, so a program can sleep in `read`, `poll` or `epoll`
//! instead of polling.
//!
//! The descriptor is an eventfd in semaphore mode: each event adds one, each read takes
//! one, so `poll()` reports it readable exactly while events wait. The events themselves
//! (which CQ) wait in a queue beside it, in the order they happened. A CQ destroyed with
//! events still queued has them taken out (`forget`); the count they leave behind makes a
//! reader find nothing and read again, which blocks (or says `EAGAIN` on a non-blocking
//! descriptor) as if the event had never been.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

/// A completion channel: where CQs created with it signal their completion events.
pub struct CompChannel {
    fd: i32,
    events: Mutex<VecDeque<u64>>,
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompChannel(fd {})", self.fd)
    }
}

impl CompChannel {
    /// A new channel with its own descriptor (blocking reads; the caller may set
    /// `O_NONBLOCK` on it, as with `ibv_comp_channel.fd`).
    pub fn new() -> io::Result<CompChannel> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(CompChannel {
            fd,
            events: Mutex::new(VecDeque::new()),
        })
    }

    /// The descriptor to read, `poll()` or `epoll` on.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Queues an event for `token` (the CQ it is for) and makes the descriptor readable.
    /// Called by the engine thread.
    pub(crate) fn notify(&self, token: u64) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(token);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// The next event: waits for one unless the descriptor is non-blocking, where it
    /// fails with `WouldBlock` when none is there (`ibv_get_cq_event`).
    pub fn get_event(&self) -> io::Result<u64> {
        loop {
            let mut v = 0u64;
            // SAFETY: reading 8 bytes into a live u64 from our eventfd.
            let n = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
            if n != 8 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if let Some(t) = self
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            {
                return Ok(t);
            }
            // The event was for a CQ destroyed since: read on.
        }
    }

    /// Waits up to `timeout` for the descriptor to be readable; true if it is.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `p` is one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    /// Takes the queued events of `token` out (its CQ is being destroyed); how many.
    pub(crate) fn forget(&self, token: u64) -> usize {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|t| *t != token);
        before - q.len()
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn events_come_out_in_order_and_forgotten_ones_never() {
        let c = CompChannel::new().unwrap();
        assert!(!c.wait(Duration::ZERO));
        c.notify(7);
        c.notify(9);
        c.notify(7);
        assert!(c.wait(Duration::ZERO));
        assert_eq!(c.forget(7), 2);
        assert_eq!(c.get_event().unwrap(), 9);
        // Two counts remain for the forgotten events: a non-blocking read finds none.
        // SAFETY: fcntl on our own descriptor.
        unsafe {
            let fl = libc::fcntl(c.fd(), libc::F_GETFL);
            libc::fcntl(c.fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let e = c.get_event().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(!c.wait(Duration::ZERO));
        c.notify(3);
        assert_eq!(c.get_event().unwrap(), 3);
    }
}

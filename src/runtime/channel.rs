//! Event queues with a file descriptor: completion channels (`ibv_comp_channel`, which
//! becomes readable when an armed CQ gets a completion) and the C ABI's asynchronous
//! event queue (`ibv_context.async_fd`), so a program can sleep in `read`, `poll` or
//! `epoll` instead of polling.
//!
//! The descriptor is an eventfd in semaphore mode: each event adds one, each read takes
//! one, so `poll()` reports it readable exactly while events wait. The events themselves
//! wait in a queue beside it, in the order they happened. Events about an object being
//! destroyed are taken out (`forget`); the count they leave behind makes a reader find
//! nothing and read again, which blocks (or says `EAGAIN` on a non-blocking descriptor)
//! as if the event had never been.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

/// Events of type `T` behind a file descriptor.
pub struct FdQueue<T> {
    fd: i32,
    events: Mutex<VecDeque<T>>,
}

/// A completion channel: where CQs created with it signal their completion events (the
/// token each CQ was given).
pub type CompChannel = FdQueue<u64>;

impl<T> std::fmt::Debug for FdQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FdQueue(fd {})", self.fd)
    }
}

impl<T> FdQueue<T> {
    /// A new queue with its own descriptor (blocking reads; the caller may set
    /// `O_NONBLOCK` on it, as with `ibv_comp_channel.fd`).
    pub fn new() -> io::Result<FdQueue<T>> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(FdQueue {
            fd,
            events: Mutex::new(VecDeque::new()),
        })
    }

    /// The descriptor to read, `poll()` or `epoll` on.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Queues an event and makes the descriptor readable (never blocks for long: called
    /// on the engine thread).
    pub fn notify(&self, event: T) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(event);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// The next event: waits for one unless the descriptor is non-blocking, where it
    /// fails with `WouldBlock` when none is there (`ibv_get_cq_event`).
    pub fn get_event(&self) -> io::Result<T> {
        self.get_event_map(|e| e)
    }

    /// As `get_event`, with `f` applied to the event while the queue is still locked,
    /// so that a `forget` cannot come between taking the event and what `f` records.
    pub fn get_event_map<R>(&self, f: impl FnOnce(T) -> R) -> io::Result<R> {
        let mut f = Some(f);
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
            let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(t) = q.pop_front()
                && let Some(f) = f.take()
            {
                return Ok(f(t));
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

    /// Takes the queued events `gone` picks out (their object is being destroyed); how
    /// many.
    pub fn forget(&self, mut gone: impl FnMut(&T) -> bool) -> usize {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|t| !gone(t));
        before - q.len()
    }
}

impl<T> Drop for FdQueue<T> {
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
        let c: CompChannel = CompChannel::new().unwrap();
        assert!(!c.wait(Duration::ZERO));
        c.notify(7);
        c.notify(9);
        c.notify(7);
        assert!(c.wait(Duration::ZERO));
        assert_eq!(c.forget(|t| *t == 7), 2);
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

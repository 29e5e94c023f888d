//! Event queues with a file descriptor: completion channels (`ibv_comp_channel`, which
//! becomes readable when an armed CQ gets a completion) and the C ABI's asynchronous
//! event queue (`ibv_context.async_fd`), so a program can sleep in `poll` or `epoll`
//! instead of polling, as it does on the kernel's event files.
//!
//! The descriptor is an eventfd in semaphore mode whose count is, at every moment the
//! queue's lock is free, the number of events queued: every change to either happens
//! under that lock (our own reads then never block, whatever flags the program set on
//! the descriptor). So `poll()` reports it readable exactly while an event waits, also
//! after events about a destroyed object were taken out (`forget`). Programs wait with
//! `poll()` or by calling `get_event` (which waits unless the program made the
//! descriptor non-blocking, and then says `EAGAIN`); they do not read it themselves,
//! as with rdma-core, where `ibv_get_cq_event` does the reading.

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
    /// by the thread running the data path).
    pub fn notify(&self, event: T) {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(event);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Takes one from the count (the queue's lock held, and an event was there, so the
    /// count is positive and the read returns at once).
    fn consume_one(&self) {
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a live u64 from our eventfd.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
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
            {
                let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = q.pop_front()
                    && let Some(f) = f.take()
                {
                    self.consume_one();
                    return Ok(f(t));
                }
            }
            // SAFETY: fcntl on our own descriptor.
            let flags = unsafe { libc::fcntl(self.fd, libc::F_GETFL) };
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            let mut p = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; waiting until an event is queued. A signal ends
            // the wait with EINTR, as it ends rdma-core's read() of the event file.
            if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                return Err(io::Error::last_os_error());
            }
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

    /// Takes the queued events `gone` picks out (their object is being destroyed), and
    /// their counts with them; how many.
    pub fn forget(&self, mut gone: impl FnMut(&T) -> bool) -> usize {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let before = q.len();
        q.retain(|t| !gone(t));
        let n = before - q.len();
        for _ in 0..n {
            self.consume_one();
        }
        n
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
        assert!(c.wait(Duration::ZERO), "one event left");
        assert_eq!(c.get_event().unwrap(), 9);
        // Nothing left: not readable, and a non-blocking read says so.
        assert!(!c.wait(Duration::ZERO));
        // SAFETY: fcntl on our own descriptor.
        unsafe {
            let fl = libc::fcntl(c.fd(), libc::F_GETFL);
            libc::fcntl(c.fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        let e = c.get_event().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        c.notify(3);
        assert_eq!(c.get_event().unwrap(), 3);
        assert_eq!(c.forget(|_| true), 0);
        assert!(!c.wait(Duration::ZERO));
    }

    #[test]
    fn a_blocked_reader_wakes_for_the_next_event() {
        let c = std::sync::Arc::new(CompChannel::new().unwrap());
        let c2 = c.clone();
        let t = std::thread::spawn(move || c2.get_event().unwrap());
        std::thread::sleep(Duration::from_millis(20));
        c.notify(5);
        assert_eq!(t.join().unwrap(), 5);
        assert!(!c.wait(Duration::ZERO));
    }
}

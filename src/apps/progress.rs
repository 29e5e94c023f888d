//! A one-line progress bar on stderr for long steps, drawn only when stderr is a
//! terminal (logs and CI output stay clean).

use std::io::Write;
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total: u64,
    bytes: bool,
    on: bool,
    last: Instant,
    start: Instant,
}

impl Progress {
    /// A bar for `total` units (bytes when `bytes`, else operations).
    pub fn new(label: &str, total: u64, bytes: bool) -> Progress {
        // SAFETY: isatty takes only a descriptor number.
        let on = unsafe { libc::isatty(2) } == 1;
        Progress {
            label: label.to_string(),
            total: total.max(1),
            bytes,
            on,
            last: Instant::now() - Duration::from_secs(1),
            start: Instant::now(),
        }
    }

    /// A bar that draws nothing (tests).
    pub fn hidden() -> Progress {
        let mut p = Progress::new("", 1, false);
        p.on = false;
        p
    }

    fn amount(&self, v: u64) -> String {
        if self.bytes {
            format!("{:.1} MiB", v as f64 / (1u64 << 20) as f64)
        } else {
            v.to_string()
        }
    }

    /// Redraws (at most every 100 ms) with `done` units finished.
    pub fn set(&mut self, done: u64) {
        if !self.on || self.last.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.last = Instant::now();
        let frac = (done as f64 / self.total as f64).min(1.0);
        let width = 30;
        let full = (frac * width as f64) as usize;
        let bar: String = "#".repeat(full) + &"-".repeat(width - full);
        let mut e = std::io::stderr().lock();
        let _ = write!(
            e,
            "\r  {:<22} [{bar}] {:>3.0}% {} of {}  {:.1} s ",
            self.label,
            frac * 100.0,
            self.amount(done),
            self.amount(self.total),
            self.start.elapsed().as_secs_f64()
        );
        let _ = e.flush();
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r{:<100}\r", "");
            let _ = e.flush();
        }
    }
}

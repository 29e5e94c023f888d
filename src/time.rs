//! Time as the sans-IO engine sees it: nanoseconds on a monotonic clock the caller owns.
//!
//! The engine never reads a clock; every call that depends on time takes `now`. The
//! runtime maps `std::time::Instant` onto it, the simulation advances it by hand.

use std::time::Duration;

/// A point in time, in nanoseconds since an origin the caller chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);
    pub const MAX: Time = Time(u64::MAX);

    pub const fn from_nanos(ns: u64) -> Time {
        Time(ns)
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
    /// `self + ns`, saturating.
    pub const fn add_nanos(self, ns: u64) -> Time {
        Time(self.0.saturating_add(ns))
    }
    /// Time from `earlier` to `self` (zero if `earlier` is later).
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl std::fmt::Display for Time {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{:06}s",
            self.0 / 1_000_000_000,
            (self.0 / 1000) % 1_000_000
        )
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`: a cheap clock reading (the vDSO, no system call)
/// for code that must not allocate or block.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

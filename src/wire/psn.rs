//! Packet sequence numbers: 24-bit counters that wrap.
//!
//! IBA 9.7.1: PSNs are compared modulo 2^24; a PSN is "ahead" of another when it lies in
//! the half of the number space that follows it. Every place a PSN appears (BTH, AETH
//! responses, QP attributes) uses this type, so that no comparison forgets the wrap.

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit packet sequence number. The invariant `value < 2^24` always holds.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The mask of the 24 valid bits.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;
    /// Half the number space: the furthest one PSN can be ahead of another.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from the low 24 bits of `value` (higher bits are dropped, as on the wire).
    #[inline]
    pub const fn new(value: u32) -> Psn {
        Psn(value & Self::MASK)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` after this one, wrapping at 2^24.
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & Self::MASK)
    }

    /// The PSN `n` before this one, wrapping at 0.
    #[inline]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// The next PSN.
    #[inline]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed distance from `other` to `self`, in `[-2^23, 2^23)`: positive when `self`
    /// is ahead of `other`.
    #[inline]
    pub const fn distance(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back, which sign-extends.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Unsigned forward distance from `other` to `self` (0 ..= 2^24-1).
    #[inline]
    pub const fn forward_from(self, other: Psn) -> u32 {
        self.0.wrapping_sub(other.0) & Self::MASK
    }

    /// True when `self` comes strictly before `other` in sequence space.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance(other) < 0
    }

    /// True when `self` comes strictly after `other` in sequence space.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.distance(other) > 0
    }

    /// Sequence-space ordering of `self` relative to `other`. Not a total order (the
    /// relation is circular), so `Psn` deliberately does not implement `Ord`.
    #[inline]
    pub const fn cmp_seq(self, other: Psn) -> Ordering {
        let d = self.distance(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// True when `self` lies in the half-open window `[start, start + len)`.
    #[inline]
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        self.forward_from(start) < len
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn(0x{:06x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        let p = Psn::new(0xff_fffe);
        assert_eq!(p.add(1).value(), 0xff_ffff);
        assert_eq!(p.add(2).value(), 0);
        assert_eq!(p.add(3).value(), 1);
        assert_eq!(Psn::new(1).sub(2).value(), 0xff_ffff);
        assert_eq!(Psn::new(0x1ff_ffff).value(), 0xff_ffff);
    }

    #[test]
    fn compares_across_the_wrap() {
        let a = Psn::new(0xff_fff0);
        let b = Psn::new(0x10);
        assert!(a.is_before(b));
        assert!(b.is_after(a));
        assert_eq!(b.distance(a), 0x20);
        assert_eq!(a.distance(b), -0x20);
        assert_eq!(a.cmp_seq(a), Ordering::Equal);
        assert!(b.in_window(a, 0x21));
        assert!(!b.in_window(a, 0x20));
    }

    #[test]
    fn half_way_is_behind() {
        // Exactly 2^23 apart: the distance is -2^23 (behind), the convention of IBA 9.7.1.
        let a = Psn::new(0);
        let b = Psn::new(Psn::HALF);
        assert_eq!(b.distance(a), -(Psn::HALF as i32));
    }

    proptest! {
        #[test]
        fn add_then_distance(start in 0u32..Psn::MODULUS, n in 0u32..Psn::HALF) {
            let a = Psn::new(start);
            let b = a.add(n);
            prop_assert_eq!(b.distance(a), n as i32);
            prop_assert_eq!(a.distance(b), -(n as i32));
            prop_assert_eq!(b.forward_from(a), n);
            prop_assert_eq!(b.sub(n), a);
            prop_assert!(n == 0 || a.is_before(b));
        }
    }
}

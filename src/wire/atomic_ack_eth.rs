//! Atomic ACK Extended Transport Header (IBA 9.5.3, 8 bytes): the value the remote
//! 8 bytes held before the atomic operation ran.

use super::{Layer, Result, check_len, get_u64};

/// Length of the AtomicAckETH.
pub const LEN: usize = 8;

/// A view of an AtomicAckETH.
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        check_len(
            Layer::Ext(crate::wire::HeaderKind::AtomicAckEth),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    /// The original remote data.
    #[inline]
    pub fn orig(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[0..LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    #[inline]
    pub fn set_orig(&mut self, v: u64) {
        self.buffer.as_mut()[0..LEN].copy_from_slice(&v.to_be_bytes());
    }
}

/// The meaning of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub orig: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr { orig: h.orig() }
    }
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_orig(self.orig);
    }
}

impl core::fmt::Display for Repr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "AtomicAckETH orig=0x{:016x}", self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit() {
        let bytes = [0, 0, 0, 0, 0, 0, 0x12, 0x34];
        let r = Repr::parse(&Header::new_checked(&bytes[..]).unwrap());
        assert_eq!(r.orig, 0x1234);
        let mut out = [0u8; 8];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..7]).is_err());
    }
}

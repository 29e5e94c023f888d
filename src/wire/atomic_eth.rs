//! Atomic Extended Transport Header (IBA 9.3.4, 28 bytes): the target of a
//! CMP_SWAP / FETCH_ADD and its operands.
//!
//! ```text
//!  0..8 VA | 8..12 R_Key | 12..20 swap (CMP_SWAP) or add (FETCH_ADD) | 20..28 compare
//! ```

use super::{Field, Layer, Result, check_len, get_u32, get_u64};

mod field {
    use super::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const SWAP_ADD: Field = 12..20;
    pub const COMPARE: Field = 20..28;
}

/// Length of the AtomicETH.
pub const LEN: usize = 28;

/// A view of an AtomicETH.
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
            Layer::Ext(crate::wire::HeaderKind::AtomicEth),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    /// Remote address of the 8-byte operand; must be 8-byte aligned.
    #[inline]
    pub fn va(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::VA])
    }
    #[inline]
    pub fn rkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RKEY])
    }
    /// The swap value (CMP_SWAP) or the addend (FETCH_ADD).
    #[inline]
    pub fn swap_add(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    /// The compare value (CMP_SWAP only).
    #[inline]
    pub fn compare(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    #[inline]
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::VA].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn set_rkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::RKEY].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn set_swap_add(&mut self, v: u64) {
        self.buffer.as_mut()[field::SWAP_ADD].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn set_compare(&mut self, v: u64) {
        self.buffer.as_mut()[field::COMPARE].copy_from_slice(&v.to_be_bytes());
    }
}

/// The meaning of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        }
    }
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

impl core::fmt::Display for Repr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "AtomicETH va=0x{:016x} rkey=0x{:08x} swap/add=0x{:x} compare=0x{:x}",
            self.va, self.rkey, self.swap_add, self.compare
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_parse_emit() {
        let mut bytes = [0u8; 28];
        bytes[..8].copy_from_slice(&0x1000u64.to_be_bytes());
        bytes[8..12].copy_from_slice(&0xdeadbeefu32.to_be_bytes());
        bytes[12..20].copy_from_slice(&7u64.to_be_bytes());
        bytes[20..28].copy_from_slice(&u64::MAX.to_be_bytes());
        let h = Header::new_checked(&bytes[..]).unwrap();
        let r = Repr::parse(&h);
        assert_eq!(
            r,
            Repr {
                va: 0x1000,
                rkey: 0xdeadbeef,
                swap_add: 7,
                compare: u64::MAX
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..27]).is_err());
    }
}

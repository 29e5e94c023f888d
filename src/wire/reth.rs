//! RDMA Extended Transport Header (IBA 9.3.3, 16 bytes): names the remote buffer of an
//! RDMA WRITE (first/only packet) or READ request.
//!
//! ```text
//!  0..8 virtual address | 8..12 R_Key | 12..16 DMA length
//! ```

use super::{Field, Layer, Result, check_len, get_u32, get_u64};

mod field {
    use super::Field;
    pub const VA: Field = 0..8;
    pub const RKEY: Field = 8..12;
    pub const DMA_LEN: Field = 12..16;
}

/// Length of the RETH.
pub const LEN: usize = 16;

/// A view of a RETH.
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
            Layer::Ext(crate::wire::HeaderKind::Reth),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    /// Remote virtual address of the first byte.
    #[inline]
    pub fn va(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::VA])
    }
    /// The remote key that grants access to the region.
    #[inline]
    pub fn rkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RKEY])
    }
    /// Total length of the whole message (all packets), not of this packet.
    #[inline]
    pub fn dma_len(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::DMA_LEN])
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
    pub fn set_dma_len(&mut self, v: u32) {
        self.buffer.as_mut()[field::DMA_LEN].copy_from_slice(&v.to_be_bytes());
    }
}

/// The meaning of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr {
            va: h.va(),
            rkey: h.rkey(),
            dma_len: h.dma_len(),
        }
    }
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_dma_len(self.dma_len);
    }
}

impl core::fmt::Display for Repr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "RETH va=0x{:016x} rkey=0x{:08x} len={}",
            self.va, self.rkey, self.dma_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 16] = [
        0x00, 0x00, 0x55, 0x8e, 0x3a, 0x6c, 0x10, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x01, 0x00,
        0x00,
    ];

    #[test]
    fn deconstruct_parse_emit() {
        let h = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.va(), 0x558e_3a6c_1000);
        assert_eq!(h.rkey(), 0x1234);
        assert_eq!(h.dma_len(), 65536);
        let r = Repr::parse(&h);
        let mut buf = [0u8; 16];
        r.emit(&mut Header::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
        assert!(Header::new_checked(&BYTES[..15]).is_err());
    }
}

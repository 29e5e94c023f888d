//! Datagram Extended Transport Header (IBA 9.3.2, 8 bytes): the Q_Key the receiving UD
//! QP checks and the QP number of the sender (reported as `ibv_wc.src_qp`).
//!
//! ```text
//!  0..4 Q_Key | 4 reserved | 5..8 source QP
//! ```

use super::{Field, Layer, Result, check_len, get_u24, get_u32, put_u24};

mod field {
    use super::Field;
    pub const QKEY: Field = 0..4;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: Field = 5..8;
}

/// Length of the DETH.
pub const LEN: usize = 8;

/// The top bit marks a privileged Q_Key (IBA 10.2.5). In a UD send WR it means "use the
/// QP's own Q_Key instead"; only privileged consumers may own such a Q_Key. The engine
/// applies the rule; this constant names the bit.
pub const QKEY_PRIVILEGED: u32 = 0x8000_0000;

/// The well-known Q_Key of QP1 (General Services Interface), used by CM MADs.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// A view of a DETH.
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
            Layer::Ext(crate::wire::HeaderKind::Deth),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    #[inline]
    pub fn qkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::QKEY])
    }
    #[inline]
    pub fn src_qp(&self) -> u32 {
        get_u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    #[inline]
    pub fn set_qkey(&mut self, v: u32) {
        self.buffer.as_mut()[field::QKEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Writes the source QP; the reserved byte becomes 0.
    #[inline]
    pub fn set_src_qp(&mut self, v: u32) {
        self.buffer.as_mut()[field::RESERVED] = 0;
        put_u24(&mut self.buffer.as_mut()[field::SRC_QP], v);
    }
}

/// The meaning of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    pub qkey: u32,
    pub src_qp: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        }
    }
    pub const fn buffer_len(&self) -> usize {
        LEN
    }
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Header<T>) {
        h.set_qkey(self.qkey);
        h.set_src_qp(self.src_qp);
    }
}

impl core::fmt::Display for Repr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "DETH qkey=0x{:08x} src_qp=0x{:06x}",
            self.qkey, self.src_qp
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit() {
        let bytes = [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01];
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.qkey(), GSI_QKEY);
        assert_eq!(h.src_qp(), 1);
        let r = Repr::parse(&h);
        let mut out = [0xffu8; 8];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..7]).is_err());
    }
}

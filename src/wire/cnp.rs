//! RoCEv2 Congestion Notification Packet body (annex A17.9.3): opcode 0x81, a BTH whose
//! DestQP names the QP to slow down, then 16 reserved bytes and the ICRC.

use super::{Layer, Result, check_len};

/// Length of the reserved block.
pub const LEN: usize = 16;

/// A view of the 16 reserved bytes.
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
            Layer::Ext(crate::wire::HeaderKind::CnpReserved),
            buffer.as_ref(),
            LEN,
        )?;
        Ok(Header { buffer })
    }
    /// True when all 16 bytes are zero, as senders must set them.
    pub fn is_zero(&self) -> bool {
        self.buffer.as_ref()[..LEN].iter().all(|&b| b == 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Zeroes the reserved block.
    pub fn clear(&mut self) {
        self.buffer.as_mut()[..LEN].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view() {
        let mut b = [0u8; 16];
        assert!(Header::new_checked(&b[..]).unwrap().is_zero());
        b[3] = 1;
        assert!(!Header::new_checked(&b[..]).unwrap().is_zero());
        Header::new_unchecked(&mut b[..]).clear();
        assert!(Header::new_unchecked(&b[..]).is_zero());
        assert!(Header::new_checked(&b[..15]).is_err());
    }
}

//! Management Datagrams (IBA 13.4): the 256-byte messages QP1 carries, here for the
//! Communication Manager (class 0x07) that rdma_cm uses to connect RC QPs.
//!
//! ```text
//!  0 BaseVersion | 1 MgmtClass | 2 ClassVersion | 3 R + Method | 4..6 Status
//!  6..8 ClassSpecific | 8..16 TransactionID | 16..18 AttributeID | 18..20 reserved
//!  20..24 AttributeModifier | 24..256 class data
//! ```

use super::{Field, Layer, Result, check_len, get_u16, get_u32, get_u64};

mod field {
    use super::Field;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Field = 4..6;
    pub const CLASS_SPECIFIC: Field = 6..8;
    pub const TID: Field = 8..16;
    pub const ATTR_ID: Field = 16..18;
    pub const ATTR_MOD: Field = 20..24;
}

/// Length of the common MAD header.
pub const HEADER_LEN: usize = 24;
/// Length of a whole MAD.
pub const MAD_LEN: usize = 256;
/// Management class of the Communication Manager.
pub const CLASS_CM: u8 = 0x07;

/// A view of a MAD (at least its common header).
#[derive(Debug, Clone, Copy)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        check_len(Layer::Mad, buffer.as_ref(), HEADER_LEN)?;
        Ok(Header { buffer })
    }
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    /// Method with the response bit (0x80) included.
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    pub fn status(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::STATUS])
    }
    pub fn class_specific(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }
    pub fn transaction_id(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::TID])
    }
    pub fn attribute_id(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::ATTR_ID])
    }
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::ATTR_MOD])
    }
    /// The class data after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// The meaning of a MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(h: &Header<T>) -> Repr {
        Repr {
            base_version: h.base_version(),
            mgmt_class: h.mgmt_class(),
            class_version: h.class_version(),
            method: h.method(),
            status: h.status(),
            class_specific: h.class_specific(),
            transaction_id: h.transaction_id(),
            attribute_id: h.attribute_id(),
            attribute_modifier: h.attribute_modifier(),
        }
    }

    /// Writes the 24-byte header (reserved bytes 0).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_len(Layer::Mad, buf, HEADER_LEN)?;
        buf[field::BASE_VERSION] = self.base_version;
        buf[field::MGMT_CLASS] = self.mgmt_class;
        buf[field::CLASS_VERSION] = self.class_version;
        buf[field::METHOD] = self.method;
        buf[field::STATUS].copy_from_slice(&self.status.to_be_bytes());
        buf[field::CLASS_SPECIFIC].copy_from_slice(&self.class_specific.to_be_bytes());
        buf[field::TID].copy_from_slice(&self.transaction_id.to_be_bytes());
        buf[field::ATTR_ID].copy_from_slice(&self.attribute_id.to_be_bytes());
        buf[18..20].fill(0);
        buf[field::ATTR_MOD].copy_from_slice(&self.attribute_modifier.to_be_bytes());
        Ok(())
    }
}

/// Name of a management class.
pub fn class_name(class: u8) -> &'static str {
    match class {
        0x01 => "Subnet Management (LID routed)",
        0x81 => "Subnet Management (directed route)",
        0x03 => "Subnet Administration",
        0x04 => "Performance Management",
        0x05 => "Baseboard Management",
        0x06 => "Device Management",
        0x07 => "Communication Management",
        0x08 => "SNMP tunneling",
        _ => "unknown class",
    }
}

/// Name of a MAD method (response bit included).
pub fn method_name(method: u8) -> &'static str {
    match method {
        0x01 => "Get",
        0x02 => "Set",
        0x03 => "Send",
        0x05 => "Trap",
        0x06 => "Report",
        0x07 => "TrapRepress",
        0x81 => "GetResp",
        0x86 => "ReportResp",
        _ => "unknown method",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit() {
        let r = Repr {
            base_version: 1,
            mgmt_class: CLASS_CM,
            class_version: 2,
            method: 0x03,
            status: 0,
            class_specific: 0,
            transaction_id: 0x1122_3344_5566_7788,
            attribute_id: 0x0010,
            attribute_modifier: 0,
        };
        let mut buf = [0u8; MAD_LEN];
        r.emit(&mut buf).unwrap();
        let h = Header::new_checked(&buf[..]).unwrap();
        assert_eq!(Repr::parse(&h), r);
        assert_eq!(h.data().len(), 232);
        assert!(Header::new_checked(&buf[..23]).is_err());
        assert_eq!(class_name(7), "Communication Management");
        assert_eq!(method_name(3), "Send");
    }
}

//! Invalidate Extended Transport Header (IBA 9.3.7, 4 bytes): the R_Key that a
//! SEND_WITH_INV asks the receiver to invalidate.

super::word_header!(
    HeaderKind::Ieth,
    rkey,
    set_rkey,
    "IETH",
    "The R_Key to invalidate at the responder."
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit() {
        let bytes = [0x00, 0x01, 0x02, 0x03];
        let r = Repr::parse(&Header::new_checked(&bytes[..]).unwrap());
        assert_eq!(r.rkey, 0x010203);
        let mut out = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..0]).is_err());
    }
}

//! Immediate Data Extended Transport Header (IBA 9.3.6, 4 bytes): 32 bits the sender
//! hands to the receiver's completion (`ibv_wc.imm_data`) with a SEND or WRITE.

super::word_header!(
    HeaderKind::ImmDt,
    imm,
    set_imm,
    "ImmDt",
    "The immediate data, as sent (network byte order on the wire)."
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_emit() {
        let bytes = [0xca, 0xfe, 0xba, 0xbe];
        let r = Repr::parse(&Header::new_checked(&bytes[..]).unwrap());
        assert_eq!(r.imm, 0xcafebabe);
        let mut out = [0u8; 4];
        r.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..3]).is_err());
        assert_eq!(r.to_string(), "ImmDt 0xcafebabe");
    }
}

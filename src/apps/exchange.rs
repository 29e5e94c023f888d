//! The out-of-band TCP exchange of rdma-core's `ibv_*_pingpong` (libibverbs/examples,
//! rdma-core 44): one 52-byte message each way, `"%04x:%06x:%06x:%s"` of LID, QPN, PSN
//! and the GID as 32 hex digits (its 16 bytes in wire order), NUL-terminated; then
//! the client sends `"done"` with its NUL (5 bytes). The client writes first; the server
//! brings its QP to RTS before it answers.

use super::endpoint::Remote;
use std::io::{Read, Write};
use std::net::TcpStream;

/// Size of one message: 51 characters and the NUL.
pub const PP_MSG_LEN: usize = 52;

/// The message for `r` (LID 0: RoCE has none).
pub fn pp_encode(r: &Remote) -> [u8; PP_MSG_LEN] {
    let mut gid = String::with_capacity(32);
    for b in r.gid {
        gid.push_str(&format!("{b:02x}"));
    }
    let s = format!(
        "{:04x}:{:06x}:{:06x}:{gid}",
        0,
        r.qpn & 0xff_ffff,
        r.psn & 0xff_ffff
    );
    let mut m = [0u8; PP_MSG_LEN];
    m[..s.len()].copy_from_slice(s.as_bytes());
    m
}

/// Parses a peer's message (as `sscanf("%x:%x:%x:%s")` would, strictly).
pub fn pp_decode(m: &[u8]) -> Result<(u16, Remote), String> {
    let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
    let s = std::str::from_utf8(&m[..end]).map_err(|_| "the peer's message is not text")?;
    let bad = || format!("the peer's message {s:?} is not LID:QPN:PSN:GID");
    let mut it = s.split(':');
    let lid = u16::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let qpn = u32::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let psn = u32::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let g = it.next().ok_or_else(bad)?;
    if g.len() != 32 || it.next().is_some() {
        return Err(bad());
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok((
        lid,
        Remote {
            qpn: qpn & 0xff_ffff,
            psn: psn & 0xff_ffff,
            gid,
        },
    ))
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Client side: sends `me`, reads the server's answer, sends "done".
pub fn pp_client(s: &mut TcpStream, me: &Remote) -> Result<Remote, String> {
    s.write_all(&pp_encode(me))
        .map_err(io("sending our address"))?;
    let mut m = [0u8; PP_MSG_LEN];
    s.read_exact(&mut m)
        .map_err(io("reading the server's address"))?;
    s.write_all(b"done\0").map_err(io("sending done"))?;
    Ok(pp_decode(&m)?.1)
}

/// Server side, first half: the client's address.
pub fn pp_server_read(s: &mut TcpStream) -> Result<Remote, String> {
    let mut m = [0u8; PP_MSG_LEN];
    s.read_exact(&mut m)
        .map_err(io("reading the client's address"))?;
    Ok(pp_decode(&m)?.1)
}

/// Server side, second half (after connecting the QP): our address, then the client's
/// "done".
pub fn pp_server_reply(s: &mut TcpStream, me: &Remote) -> Result<(), String> {
    s.write_all(&pp_encode(me))
        .map_err(io("sending our address"))?;
    let mut d = [0u8; 5];
    s.read_exact(&mut d).map_err(io("reading done"))?;
    if &d != b"done\0" {
        return Err(format!("expected \"done\" from the client, got {d:?}"));
    }
    Ok(())
}

/// A GID the way the pingpong tools print it (`inet_ntop(AF_INET6)`).
pub fn gid_text(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips_in_the_tools_format() {
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[198, 18, 0, 1]);
        let r = Remote {
            qpn: 0x11,
            psn: 0xabcdef,
            gid,
        };
        let m = pp_encode(&r);
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffffc6120001"
        );
        assert_eq!(m[51], 0);
        assert_eq!(pp_decode(&m).unwrap(), (0, r));
        assert!(pp_decode(b"0000:000011:abcdef:0000").is_err());
        assert!(pp_decode(b"zz").is_err());
        assert_eq!(gid_text(&gid), "::ffff:198.18.0.1");
    }
}

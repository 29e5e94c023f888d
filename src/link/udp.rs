//! The UDP link: the engine over an ordinary UDP socket on port 4791, for hosts where
//! AF_XDP and BPF are not allowed (no root, containers). Batches of `sendmmsg` and
//! `recvmmsg`.
//!
//! The kernel writes the IP and UDP headers, so the engine must build its frames (and
//! their ICRC) with the fields the kernel will use: source port = the socket's port,
//! IPv4 identification 0 and DF (Linux sends DF datagrams of an unconnected socket with
//! ID 0; `tests/udp_link.rs` checks it on the wire), TTL and TOS are masked by the ICRC,
//! and over IPv4 UDP checksum 0 (`SO_NO_CHECK`), as rxe.
//! `DeviceConfig::udp_link` sets that up.
//!
//! On receive the socket does not show the IP header, so a frame is rebuilt around the
//! datagram with ID 0. Its ICRC verifies when the sender is roce-xdp (either link: the
//! engine always sends ID 0). A sender that uses other IPv4 IDs (rxe: the kernel's
//! per-destination counter) would fail that check, so the ID is solved from the ICRC
//! (`wire::icrc::solve_u16_field`) and written into the rebuilt header: the engine, the
//! pcap tap and `decode` then see the header that was on the wire. The cost: one more
//! ICRC pass per received IPv4 frame, and a frame corrupted elsewhere passes the ICRC
//! with probability 2^-16 instead of 2^-32 (the link layer's FCS still guards the wire).
//! Over IPv6 there is no ID and nothing is solved.

use super::FrameLink;
use crate::wire::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::wire::ip::{Ipv4Repr, Ipv6Repr};
use crate::wire::{EthRepr, Frame, IpRepr, Pieces, PiecesMut, ROCE_V2_PORT};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

/// Datagrams per system call.
const BATCH: usize = 32;
/// Largest datagram payload handled.
const MAX_PAYLOAD: usize = 9000;
/// The MAC the rebuilt frames claim for peers (nothing reads it).
pub const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0xfe];

/// The UDP link.
pub struct UdpLink {
    sock: UdpSocket,
    local: SocketAddr,
    mac: [u8; 6],
    rx_bufs: Vec<[u8; MAX_PAYLOAD]>,
    tx_bufs: Vec<[u8; MAX_PAYLOAD]>,
    frame: Vec<u8>,
    pub rx: u64,
    pub tx: u64,
    pub tx_unparsable: u64,
    /// Received IPv4 frames whose ID was solved from the ICRC (the sender used one other
    /// than 0).
    pub rx_ipv4_id_solved: u64,
}

impl UdpLink {
    /// Binds `local:4791` (or `local:port`). `mac` is what received frames are addressed
    /// to, the engine's own MAC.
    pub fn bind(local: IpAddr, port: u16, mac: [u8; 6]) -> io::Result<UdpLink> {
        let sock = UdpSocket::bind((local, port))?;
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        let (level, opt, val) = match local {
            IpAddr::V4(_) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            ),
            IpAddr::V6(_) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            ),
        };
        // SAFETY: setting an int socket option on our own socket.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&val as *const i32).cast(),
                size_of::<i32>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        if local.is_ipv4() {
            // UDP checksum 0 over IPv4, as rxe sends (the ICRC protects the packet). It
            // also keeps a half-done checksum off the wire: over veth the kernel leaves
            // the checksum to an "offload" that never happens, and an AF_XDP receiver
            // sees the raw frame.
            let one: i32 = 1;
            // SAFETY: setting an int socket option on our own socket.
            let r = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_NO_CHECK,
                    (&one as *const i32).cast(),
                    size_of::<i32>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let local = sock.local_addr()?;
        Ok(UdpLink {
            sock,
            local,
            mac,
            rx_bufs: vec![[0u8; MAX_PAYLOAD]; BATCH],
            tx_bufs: vec![[0u8; MAX_PAYLOAD]; BATCH],
            frame: vec![0u8; MAX_PAYLOAD + 64],
            rx: 0,
            tx: 0,
            tx_unparsable: 0,
            rx_ipv4_id_solved: 0,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

fn to_sockaddr(a: &SocketAddr, out: &mut libc::sockaddr_in6) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_in6 is larger than sockaddr_in; both are plain data.
            let sin = unsafe { &mut *(out as *mut libc::sockaddr_in6 as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = v6.port().to_be();
            out.sin6_addr.s6_addr = v6.ip().octets();
            out.sin6_flowinfo = 0;
            out.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

fn from_sockaddr(s: &libc::sockaddr_in6) -> Option<SocketAddr> {
    match i32::from(s.sin6_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(s as *const libc::sockaddr_in6 as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => Some(SocketAddr::from((
            Ipv6Addr::from(s.sin6_addr.s6_addr),
            u16::from_be(s.sin6_port),
        ))),
        _ => None,
    }
}

impl FrameLink for UdpLink {
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(Pieces<'_>)) -> usize {
        let n = max.min(BATCH);
        if n == 0 {
            return 0;
        }
        // SAFETY: plain-data C structs, fully initialised below before use.
        let mut addrs: [libc::sockaddr_in6; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for i in 0..n {
            iovs[i].iov_base = self.rx_bufs[i].as_mut_ptr().cast();
            iovs[i].iov_len = MAX_PAYLOAD;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_in6).cast();
            msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        }
        // SAFETY: every mmsghdr points at a live iovec and buffer of the stated sizes.
        let got = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got <= 0 {
            return 0;
        }
        let mut delivered = 0;
        for i in 0..got as usize {
            let len = msgs[i].msg_len as usize;
            let Some(from) = from_sockaddr(&addrs[i]) else {
                continue;
            };
            if let Some(flen) = rebuild(
                &mut self.frame,
                &self.rx_bufs[i][..len],
                from,
                self.local,
                self.mac,
            ) {
                if from.is_ipv4() && restore_ipv4_id(&mut self.frame[..flen]) {
                    if self.rx_ipv4_id_solved == 0 {
                        tracing::info!(
                            "UDP link: {from} sends IPv4 IDs other than 0; solving each from \
                             its ICRC (see link::udp)"
                        );
                    }
                    self.rx_ipv4_id_solved += 1;
                }
                f(Pieces::one(&self.frame[..flen]));
                delivered += 1;
            }
        }
        self.rx += delivered as u64;
        delivered
    }

    fn send(&mut self, fill: &mut dyn FnMut(PiecesMut<'_>) -> Option<usize>) -> usize {
        // SAFETY: plain-data C structs, initialised below before use.
        let mut addrs: [libc::sockaddr_in6; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut n = 0;
        while n < BATCH {
            let Some(len) = fill(PiecesMut::one(&mut self.frame)) else {
                break;
            };
            let Ok(fr) = Frame::parse(&self.frame[..len]) else {
                self.tx_unparsable += 1;
                continue;
            };
            let start = fr.bth_offset();
            let end = fr.bytes().len();
            let body = &self.frame[start..end];
            if body.len() > MAX_PAYLOAD {
                self.tx_unparsable += 1;
                continue;
            }
            let dst = SocketAddr::new(fr.ip().dst(), ROCE_V2_PORT);
            self.tx_bufs[n][..body.len()].copy_from_slice(body);
            let alen = to_sockaddr(&dst, &mut addrs[n]);
            iovs[n].iov_base = self.tx_bufs[n].as_mut_ptr().cast();
            iovs[n].iov_len = body.len();
            msgs[n].msg_hdr.msg_iov = &mut iovs[n];
            msgs[n].msg_hdr.msg_iovlen = 1;
            msgs[n].msg_hdr.msg_name = (&mut addrs[n] as *mut libc::sockaddr_in6).cast();
            msgs[n].msg_hdr.msg_namelen = alen;
            n += 1;
        }
        let mut done = 0;
        while done < n {
            // SAFETY: messages `done..n` point at live buffers, iovecs and addresses.
            let r = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr().add(done),
                    (n - done) as u32,
                    0,
                )
            };
            if r <= 0 {
                // A full socket buffer or an unreachable peer: the frames are lost, as on
                // a wire; the transport retransmits.
                break;
            }
            done += r as usize;
        }
        self.tx += done as u64;
        n
    }

    fn flush(&mut self) {}

    fn fds(&self) -> Vec<RawFd> {
        vec![self.sock.as_raw_fd()]
    }

    fn describe(&self) -> String {
        format!("UDP socket on {} (no AF_XDP)", self.local)
    }
}

/// Wraps a received datagram into the Ethernet/IP/UDP frame the engine parses, with the
/// header fields a roce-xdp UDP sender's kernel used (IPv4 ID 0, DF, TTL 64).
fn rebuild(
    out: &mut [u8],
    payload: &[u8],
    from: SocketAddr,
    local: SocketAddr,
    mac: [u8; 6],
) -> Option<usize> {
    let (ip, ethertype) = match (from.ip(), local.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (IpRepr::V4(Ipv4Repr::new(s, d, 0)), ETHERTYPE_IPV4),
        (IpAddr::V6(s), IpAddr::V6(d)) => (
            IpRepr::V6(Ipv6Repr {
                src: s,
                dst: d,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
            }),
            ETHERTYPE_IPV6,
        ),
        _ => return None,
    };
    let eth = EthRepr {
        dst: mac,
        src: PEER_MAC,
        vlan: None,
        ethertype,
    };
    let l3 = eth.emit(out).ok()?;
    let l4 = l3 + ip.emit(&mut out[l3..], 8 + payload.len()).ok()?;
    let udp = crate::wire::UdpRepr {
        src_port: from.port(),
        dst_port: ROCE_V2_PORT,
    };
    let b = l4 + udp.emit(&mut out[l4..], payload.len()).ok()?;
    out.get_mut(b..b + payload.len())?.copy_from_slice(payload);
    Some(b + payload.len())
}

/// Puts the IPv4 ID the sender used into a frame `rebuild` made with ID 0, when its ICRC
/// says it was another one (and some ID explains the difference). True if it did.
fn restore_ipv4_id(frame: &mut [u8]) -> bool {
    let Ok(f) = Frame::parse(frame) else {
        return false;
    };
    let Err(crate::wire::Error::BadIcrc { wire, computed }) = f.verify_icrc() else {
        return false;
    };
    let Some(id) = f.ipv4_id_explaining(wire, computed) else {
        return false;
    };
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (f.ip().src(), f.ip().dst()) else {
        return false;
    };
    let (l3, l4_len) = (f.l3_offset(), f.bytes().len() - f.l4_offset());
    // The header `rebuild` wrote, now with the sender's ID (and its checksum).
    IpRepr::V4(Ipv4Repr::new(src, dst, id))
        .emit(&mut frame[l3..], l4_len)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(name: &str) -> crate::capture::Capture {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        crate::capture::Capture::open(&p.join(name)).unwrap()
    }

    /// What the socket shows of a captured frame (UDP payload and addresses), rebuilt.
    fn as_received(f: &Frame<'_>, out: &mut [u8]) -> usize {
        let from = SocketAddr::new(f.ip().src(), f.src_port());
        let local = SocketAddr::new(f.ip().dst(), ROCE_V2_PORT);
        let body = &f.bytes()[f.bth_offset()..];
        rebuild(out, body, from, local, [2, 0, 0, 0, 0, 1]).unwrap()
    }

    #[test]
    fn a_rebuilt_frame_gets_the_sender_ipv4_id_back() {
        let mut out = vec![0u8; MAX_PAYLOAD + 64];
        let mut n = 0;
        for p in capture("rxe-vm2vm-mtu1024.pcap").packets().unwrap() {
            let p = p.unwrap();
            let Ok(f) = p.roce() else { continue };
            let crate::wire::IpView::V4(h) = f.ip() else {
                continue;
            };
            // Every frame rxe sent has an ID of its own, none 0.
            assert_ne!(h.identification(), 0);
            let len = as_received(&f, &mut out);
            assert!(Frame::parse(&out[..len]).unwrap().verify().is_err());
            assert!(restore_ipv4_id(&mut out[..len]), "frame {}", p.index);
            let g = Frame::parse(&out[..len]).unwrap();
            g.verify().unwrap();
            let crate::wire::IpView::V4(gh) = g.ip() else {
                unreachable!()
            };
            assert_eq!(gh.identification(), h.identification());
            // Nothing to solve the second time.
            assert!(!restore_ipv4_id(&mut out[..len]));
            n += 1;
        }
        assert_eq!(n, 505);
    }

    #[test]
    fn a_corrupted_frame_is_not_explained_by_an_id() {
        // Frame 1 of this capture has one bit flipped (tests/golden.rs).
        let cap = capture("rxe-afxdp-peer.pcap");
        let p = cap.packets().unwrap().next().unwrap().unwrap();
        let mut out = vec![0u8; MAX_PAYLOAD + 64];
        let len = as_received(&p.roce().unwrap(), &mut out);
        assert!(!restore_ipv4_id(&mut out[..len]));
        assert!(matches!(
            Frame::parse(&out[..len]).unwrap().verify(),
            Err(crate::wire::Error::BadIcrc { .. })
        ));
    }
}

//! The kernel's UDP path as a ceiling: datagrams sent with `sendmmsg` and received with
//! `recvmmsg` (64 per call, as a tuned UDP application moves them) between the two
//! namespaces of a [`Pair`], counted at the receiver. roce-xdp's goodput is printed
//! beside it: a userspace NIC has to beat what the host's own sockets carry.

use crate::netns::Pair;
use crossbeam::channel as mpsc;
use nix::sys::socket::{MsgFlags, MultiHeaders, recvmmsg, sendmmsg, setsockopt, sockopt};
use nix::sys::time::TimeSpec;
use std::io::{IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Datagrams per `sendmmsg` / `recvmmsg` call.
const BATCH: usize = 64;

/// Socket buffers (SO_*BUFFORCE: the namespace's rmem_max would cap them at 208 KiB,
/// and a receiver that falls behind by a scheduler tick would drop, not queue).
const SOCK_BUF: usize = 8 << 20;

/// Sends `count` datagrams of `payload` bytes from A to B and returns the datagrams per
/// second B received (from its first to its last), and how many it received.
pub fn udp_rate(pair: &Pair, payload: usize, count: u64) -> Result<(f64, u64), String> {
    if payload == 0 || payload > 65507 || count < 2 {
        return Err(format!(
            "UDP: {payload}-byte datagrams, {count} of them: 1 to 65507 bytes, at least 2"
        ));
    }
    let (ready_tx, ready_rx) = mpsc::bounded::<Result<SocketAddr, String>>(1);
    let (ns_b, ip_b) = (pair.b.name.clone(), pair.ip_b);
    let receiver = std::thread::spawn(move || -> Result<(u64, Duration), String> {
        let setup = (|| {
            super::pin_side(1);
            crate::host::enter_netns(&ns_b).map_err(|e| e.to_string())?;
            let s = UdpSocket::bind((ip_b, 0)).map_err(|e| format!("UDP receiver: {e}"))?;
            setsockopt(&s, sockopt::RcvBufForce, &SOCK_BUF)
                .map_err(|e| format!("UDP receiver SO_RCVBUFFORCE: {e}"))?;
            let addr = s.local_addr().map_err(|e| e.to_string())?;
            Ok::<_, String>((s, addr))
        })();
        let s = match setup {
            Ok((s, addr)) => {
                let _ = ready_tx.send(Ok(addr));
                s
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e.clone()));
                return Err(e);
            }
        };
        let mut bufs = vec![vec![0u8; payload.max(1)]; BATCH];
        let mut hdrs = MultiHeaders::<()>::preallocate(BATCH, None);
        super::count_arrivals(count, || {
            // Built per call (nix ties the slices' borrow to the headers' for as long
            // as the results live): a 64-entry Vec beside a system call that moves up
            // to 64 datagrams.
            let mut iovs: Vec<[IoSliceMut; 1]> =
                bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
            let r = recvmmsg(
                s.as_raw_fd(),
                &mut hdrs,
                iovs.iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None::<TimeSpec>,
            );
            match r {
                Ok(res) => Ok(res.count() as u64),
                Err(nix::errno::Errno::EAGAIN) => Ok(0),
                Err(e) => Err(format!("recvmmsg: {e}")),
            }
        })
    });
    let to = ready_rx
        .recv()
        .map_err(|_| "the UDP receiver ended".to_string())??;
    let (ns_a, ip_a) = (pair.a.name.clone(), pair.ip_a);
    let sender = std::thread::spawn(move || -> Result<(), String> {
        super::pin_side(0);
        crate::host::enter_netns(&ns_a).map_err(|e| e.to_string())?;
        let s = UdpSocket::bind((IpAddr::V4(ip_a), 0)).map_err(|e| format!("UDP sender: {e}"))?;
        setsockopt(&s, sockopt::SndBufForce, &SOCK_BUF)
            .map_err(|e| format!("UDP sender SO_SNDBUFFORCE: {e}"))?;
        s.connect(to).map_err(|e| format!("UDP connect: {e}"))?;
        let data = vec![0x5au8; payload];
        let iovs: Vec<[IoSlice; 1]> = (0..BATCH).map(|_| [IoSlice::new(&data)]).collect();
        // No addresses (the socket is connected): `()` carries none, so reading the
        // results reads nothing the call did not write.
        let addrs = [None::<()>; BATCH];
        let mut hdrs = MultiHeaders::<()>::preallocate(BATCH, None);
        let start = Instant::now();
        let mut sent = 0u64;
        while sent < count && start.elapsed() < Duration::from_secs(30) {
            let n = (count - sent).min(BATCH as u64) as usize;
            match sendmmsg(
                s.as_raw_fd(),
                &mut hdrs,
                &iovs[..n],
                &addrs[..n],
                [],
                MsgFlags::empty(),
            ) {
                Ok(r) => sent += r.count() as u64,
                // The receiver's socket is full or gone for a moment (ICMP): go on.
                Err(nix::errno::Errno::ECONNREFUSED | nix::errno::Errno::ENOBUFS) => {
                    std::thread::yield_now()
                }
                Err(e) => return Err(format!("sendmmsg: {e}")),
            }
        }
        Ok(())
    });
    sender
        .join()
        .map_err(|_| "the UDP sender panicked".to_string())??;
    let (got, span) = receiver
        .join()
        .map_err(|_| "the UDP receiver panicked".to_string())??;
    Ok((super::arrival_rate(got, span, count, "UDP datagrams")?, got))
}

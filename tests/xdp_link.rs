//! Two engines over AF_XDP on a veth pair between two network namespaces.

mod common;
use common::rt::*;
use roce_xdp::netns::Pair;
use roce_xdp::verbs::*;

#[test]
fn smoke_send_write_read_over_af_xdp() {
    if !need_root() {
        return;
    }
    let pair = Pair::new("rxs", 0, 1500).unwrap();
    let (a, b) = xdp_ends(&pair, QpType::Rc, 1 << 20, |_| {});
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 253) as u8).collect();
    a.mem.write(0, &data).unwrap();
    b.qp.post_recv(&RecvWr::new(1, &[b.sge(0, 8192)])).unwrap();
    a.qp.post_send(&SendWr::send(1, &[a.sge(0, 5000)])).unwrap();
    a.qp.post_send(&SendWr::write(
        2,
        &[a.sge(0, 5000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    a.qp.post_send(&SendWr::read(
        3,
        &[a.sge(100_000, 5000)],
        b.mr.addr + 65536,
        b.mr.rkey,
    ))
    .unwrap();
    let wa = wait_ok(&a.cq, 3, 10);
    let wb = wait_ok(&b.cq, 1, 10);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(b.mem.to_vec(0, 5000).unwrap(), data);
    assert_eq!(b.mem.to_vec(65536, 5000).unwrap(), data);
    assert_eq!(a.mem.to_vec(100_000, 5000).unwrap(), data);
    assert_eq!(wa.len(), 3);
    println!("{}", a.dev.info().link);
}

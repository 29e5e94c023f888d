//! Each operation once over a clean simulated link.

mod common;
use common::*;
use roce_xdp::link::sim::{LinkConfig, Stop};
use roce_xdp::verbs::*;

#[test]
fn rc_send_write_read_atomics() {
    let (mut a, mut b, sa, sb) = connected(QpType::Rc, Mtu::Mtu1024, 1 << 20, 100, 200, 1);
    // SEND 3000 bytes (3 packets) into a posted receive.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    sa.mem.write(0, &data).unwrap();
    b.post_recv(sb.qpn, &RecvWr::new(1, &[sge(&sb, 0, 4096)]))
        .unwrap();
    a.post_send(
        sa.qpn,
        &SendWr::send(10, &[sge(&sa, 0, 3000)]).with_imm(0xdead),
    )
    .unwrap();
    // WRITE 5000 bytes.
    a.post_send(
        sa.qpn,
        &SendWr::write(11, &[sge(&sa, 0, 3000)], sb.mr.addr + 8192, sb.mr.rkey),
    )
    .unwrap();
    // READ back 3000 bytes.
    a.post_send(
        sa.qpn,
        &SendWr::read(
            12,
            &[sge(&sa, 100_000, 3000)],
            sb.mr.addr + 8192,
            sb.mr.rkey,
        ),
    )
    .unwrap();
    // FETCH_ADD and CMP_SWAP on 8 bytes.
    sb.mem.write(65536, &41u64.to_ne_bytes()).unwrap();
    a.post_send(
        sa.qpn,
        &SendWr::fetch_add(13, sge(&sa, 200_000, 8), sb.mr.addr + 65536, sb.mr.rkey, 1),
    )
    .unwrap();
    a.post_send(
        sa.qpn,
        &SendWr::cmp_swap(
            14,
            sge(&sa, 200_008, 8),
            sb.mr.addr + 65536,
            sb.mr.rkey,
            42,
            7,
        ),
    )
    .unwrap();
    let (cqa, cqb) = (sa.cq, sb.cq);
    let mut s = sim(a, b, LinkConfig::default(), LinkConfig::default(), 1);
    let (wa, wb, stop) = run_for_completions(&mut s, cqa, 5, cqb, 1, 10);
    assert_eq!(
        stop,
        Stop::Done,
        "{wa:?} {wb:?}\n{}\n{}",
        s.a.counters(),
        s.b.counters()
    );
    assert_eq!(wb[0].status, WcStatus::Success);
    assert_eq!(wb[0].byte_len, 3000);
    assert_eq!(wb[0].imm(), Some(0xdead));
    assert_eq!(sb.mem.to_vec(0, 3000).unwrap(), data);
    let ids: Vec<u64> = wa.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [10, 11, 12, 13, 14]);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(sb.mem.to_vec(8192, 3000).unwrap(), data);
    assert_eq!(sa.mem.to_vec(100_000, 3000).unwrap(), data);
    assert_eq!(sa.mem.to_vec(200_000, 8).unwrap(), 41u64.to_ne_bytes());
    assert_eq!(sa.mem.to_vec(200_008, 8).unwrap(), 42u64.to_ne_bytes());
    assert_eq!(sb.mem.to_vec(65536, 8).unwrap(), 7u64.to_ne_bytes());
    assert_eq!(wa[2].opcode, WcOpcode::RdmaRead);
    assert_eq!(wa[3].opcode, WcOpcode::FetchAdd);
}

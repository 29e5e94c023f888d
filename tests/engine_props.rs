//! Property test: random mixes of work requests over random lossy links keep every byte
//! exact and every completion complete, in order, once.

mod common;
use common::transfer::transfer_with;
use proptest::prelude::*;
use roce_xdp::verbs::Mtu;

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn random_mixes_on_random_links(
        seed in any::<u64>(),
        loss in 0.0f64..0.15,
        mtu in proptest::sample::select(vec![Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096]),
        kib in 64u64..2048,
        max_len in 1usize..200_000,
    ) {
        let st = transfer_with(mtu, loss, kib << 10, seed, max_len);
        prop_assert!(st.bytes >= kib << 10);
    }
}

// SPDX-License-Identifier: (MIT OR Apache-2.0)
// A fault injector for tests, not part of the engine: flips one bit in a random
// fraction of the RoCEv2 frames (IPv4, UDP port 4791) arriving on the interface it is
// attached to, somewhere from the BTH to the ICRC. Attached (XDP) to a bridge port, it
// corrupts what one end sends. The kernel has no netem here; this is its corruption.
//
// cfg[0]: the fraction to corrupt, in 1/65536 (set by the loader);
// cfg[1]: frames corrupted so far.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64);
} cfg SEC(".maps");

SEC("xdp")
int corrupt(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip;
    struct udphdr *udp;
    __u32 k0 = 0, k1 = 1;
    __u64 *frac, *count;
    __u8 *t, *b;
    __u32 r;

    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
        return XDP_PASS;
    udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end || udp->dest != bpf_htons(4791))
        return XDP_PASS;
    frac = bpf_map_lookup_elem(&cfg, &k0);
    count = bpf_map_lookup_elem(&cfg, &k1);
    if (!frac || !count || (bpf_get_prandom_u32() & 0xffff) >= *frac)
        return XDP_PASS;
    t = (void *)(udp + 1);
    r = bpf_get_prandom_u32();
    // A byte at a random offset after the UDP header (retried nearer the start when
    // the offset falls past the end), one of its bits flipped.
    b = t + ((r >> 3) & 0x1fff);
    if ((void *)(b + 1) > end)
        b = t + ((r >> 3) & 0x3f);
    if ((void *)(b + 1) > end)
        return XDP_PASS;
    *b ^= (__u8)(1 << (r & 7));
    __sync_fetch_and_add(count, 1);
    return XDP_PASS;
}

char _license[] SEC("license") = "Dual MIT/GPL";

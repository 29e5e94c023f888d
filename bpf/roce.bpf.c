// SPDX-License-Identifier: (MIT OR Apache-2.0)
// roce-xdp's XDP program: redirects the RoCEv2 frames meant for this engine to the
// AF_XDP socket of the receiving queue; everything else goes on to the kernel.
//
// A frame is for the engine when it is Ethernet (optionally one 802.1Q tag), IPv4 (any
// IHL) or IPv6 (UDP as next header), UDP destination port 4791, and its destination
// address is in `addrs`. Such a frame with no socket on its queue is dropped (counted)
// rather than passed: the kernel would only answer it with an ICMP port unreachable.
// Per-CPU counters: 0 seen, 1 redirected, 2 passed, 3 dropped.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ROCE_V2_PORT 4791
#define ETH_P_8021Q_ 0x8100

struct vlan_hdr_ {
    __be16 tci;
    __be16 proto;
};

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, 64);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

// Destination addresses of the engine, as 16 bytes (IPv4 mapped as ::ffff:a.b.c.d).
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 64);
    __type(key, __u8[16]);
    __type(value, __u8);
} addrs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 4);
    __type(key, __u32);
    __type(value, __u64);
} stats SEC(".maps");

enum { SEEN = 0, REDIRECTED = 1, PASSED = 2, DROPPED = 3 };

static __always_inline void bump(__u32 k)
{
    __u64 *v = bpf_map_lookup_elem(&stats, &k);
    if (v)
        *v += 1;
}

static __always_inline int pass(void)
{
    bump(PASSED);
    return XDP_PASS;
}

static __always_inline int roce_filter(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    __u8 key[16] = {};
    __u16 proto;
    void *l3;
    struct udphdr *udp;

    bump(SEEN);
    if ((void *)(eth + 1) > end)
        return pass();
    proto = eth->h_proto;
    l3 = eth + 1;
    if (proto == bpf_htons(ETH_P_8021Q_)) {
        struct vlan_hdr_ *v = l3;
        if ((void *)(v + 1) > end)
            return pass();
        proto = v->proto;
        l3 = v + 1;
    }
    if (proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = l3;
        __u32 ihl;
        if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP)
            return pass();
        ihl = ip->ihl * 4;
        if (ihl < sizeof(*ip))
            return pass();
        udp = (void *)ip + ihl;
        key[10] = 0xff;
        key[11] = 0xff;
        __builtin_memcpy(&key[12], &ip->daddr, 4);
    } else if (proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = l3;
        if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_UDP)
            return pass();
        udp = (void *)(ip6 + 1);
        __builtin_memcpy(key, &ip6->daddr, 16);
    } else {
        return pass();
    }
    if ((void *)(udp + 1) > end || udp->dest != bpf_htons(ROCE_V2_PORT))
        return pass();
    if (!bpf_map_lookup_elem(&addrs, key))
        return pass();
    if (bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_DROP) == XDP_REDIRECT) {
        bump(REDIRECTED);
        return XDP_REDIRECT;
    }
    bump(DROPPED);
    return XDP_DROP;
}

// For frames that fit one buffer (MTU up to about 3500 on veth).
SEC("xdp")
int roce_xdp(struct xdp_md *ctx)
{
    return roce_filter(ctx);
}

// Multi-buffer: frames larger than a page (RoCE path MTU 4096 needs it).
SEC("xdp.frags")
int roce_xdp_frags(struct xdp_md *ctx)
{
    return roce_filter(ctx);
}

char _license[] SEC("license") = "Dual MIT/GPL";

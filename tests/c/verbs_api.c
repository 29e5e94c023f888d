/*
 * verbs_api: walks the libibverbs API surface and its error paths against one device,
 * as an ordinary verbs program would (compiled against the system's verbs.h, linked
 * with -libverbs, run under `roce-xdp run`). Connections are loopback: two QPs of the
 * same device talking to each other.
 *
 *   verbs_api DEVICE [GID_INDEX]
 *
 * Prints "ok N - what" for every check and exits 0 only if all pass; the first failure
 * prints "not ok N - what: why" and exits 1. tests/verbs_abi.rs builds and runs it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

static int n_checks;

static void ok(int cond, const char *fmt, ...)
{
	va_list ap;

	n_checks++;
	if (cond) {
		printf("ok %d - ", n_checks);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
		return;
	}
	printf("not ok %d - ", n_checks);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" (errno %d: %s)\n", errno, strerror(errno));
	fflush(stdout);
	exit(1);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index = 1;
static union ibv_gid gid;
static struct ibv_port_attr port;

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Polls `cq` until `n` completions arrived or 5 s passed; returns how many. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	double until = now_s() + 5;
	int got = 0;

	while (got < n && now_s() < until) {
		int r = ibv_poll_cq(cq, n - got, wc + got);

		if (r < 0)
			return r;
		got += r;
	}
	return got;
}

static struct ibv_qp *make_qp(enum ibv_qp_type t, struct ibv_cq *cq, struct ibv_srq *srq,
			      int depth)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.qp_type = t,
		.cap = { .max_send_wr = depth, .max_recv_wr = srq ? 0 : depth,
			 .max_send_sge = 4, .max_recv_sge = 4, .max_inline_data = 64 },
	};

	return ibv_create_qp(pd, &a);
}

static int to_init(struct ibv_qp *qp, enum ibv_qp_type t)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC,
		.qkey = 0x11111111,
	};

	if (t == IBV_QPT_UD)
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_QKEY);
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR -> RTS towards `remote_qpn` on this device. */
static int connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, uint8_t retry)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = port.active_mtu,
		.dest_qp_num = remote_qpn,
		.rq_psn = 100,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 1,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = gid, .sgid_index = gid_index, .hop_limit = 64 } },
	};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);

	if (r)
		return r;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = retry;
	a.rnr_retry = 7;
	a.sq_psn = 100;
	a.max_rd_atomic = 4;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post_recv1(struct ibv_qp *qp, uint64_t id, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &w, &bad);
}

static int post1(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, void *buf,
		 uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, unsigned flags)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op,
				 .send_flags = flags | IBV_SEND_SIGNALED }, *bad;

	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &w, &bad);
}

/* ---------------------------------------------------------------------------------- */

static void devices_and_queries(const char *name)
{
	int n = -1, i, found = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dax;
	union ibv_gid g;
	struct ibv_gid_entry ge;
	__be16 pkey;

	ok(list && n >= 1, "ibv_get_device_list lists %d device(s)", n);
	for (i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			found = i;
	ok(found >= 0, "device %s is listed", name);
	ok(ibv_get_device_guid(list[found]) != 0, "it has a node GUID");
	ok(ibv_get_device_index(list[found]) > 0, "it has an index (%d)",
	   ibv_get_device_index(list[found]));
	ctx = ibv_open_device(list[found]);
	ok(ctx != NULL, "ibv_open_device");
	ibv_free_device_list(list);
	ok(!strcmp(ibv_get_device_name(ctx->device), name),
	   "the context's device pointer outlives ibv_free_device_list");

	ok(ibv_query_device(ctx, &da) == 0 && da.phys_port_cnt == 1 && da.max_qp > 0 &&
	   da.max_sge >= 4, "ibv_query_device: %d port, max_qp %d, max_sge %d",
	   da.phys_port_cnt, da.max_qp, da.max_sge);
	ok(da.atomic_cap == IBV_ATOMIC_HCA, "atomics are HCA-wide");
	ok(ibv_query_device_ex(ctx, NULL, &dax) == 0 &&
	   dax.orig_attr.max_qp == da.max_qp, "ibv_query_device_ex (verbs_context)");
	ok(dax.completion_timestamp_mask == 0, "no completion timestamps are offered");

	ok(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port (the verbs_context inline)");
	ok(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	   "port ACTIVE, link layer Ethernet");
	ok(port.active_mtu >= IBV_MTU_1024 && port.max_mtu == IBV_MTU_4096,
	   "active MTU %d, max 4096", 128 << port.active_mtu);
	errno = 0;
	ok(ibv_query_port(ctx, 2, &port) != 0, "port 2 does not exist");
	ibv_query_port(ctx, 1, &port);

	ok(ibv_query_gid(ctx, 1, 0, &g) == 0 && g.raw[0] == 0xfe && g.raw[1] == 0x80,
	   "GID 0 is the link-local IPv6 GID");
	ok(ibv_query_gid(ctx, 1, gid_index, &gid) == 0 && gid.raw[10] == 0xff &&
	   gid.raw[11] == 0xff, "GID %d is an IPv4-mapped one (%u.%u.%u.%u)", gid_index,
	   gid.raw[12], gid.raw[13], gid.raw[14], gid.raw[15]);
	ok(ibv_query_gid(ctx, 1, port.gid_tbl_len - 1, &g) == 0 &&
	   !memcmp(&g, &(union ibv_gid){}, sizeof(g)), "the last GID entry reads empty");
	ok(ibv_query_gid(ctx, 1, port.gid_tbl_len, &g) != 0, "past the table: an error");
	ok(ibv_query_gid_ex(ctx, 1, gid_index, &ge, 0) == 0 &&
	   ge.gid_type == IBV_GID_TYPE_ROCE_V2, "ibv_query_gid_ex: RoCE v2");
	ok(ibv_query_gid_ex(ctx, 1, port.gid_tbl_len - 1, &ge, 0) == ENODATA,
	   "ibv_query_gid_ex of an empty entry: ENODATA");
	{
		struct ibv_gid_entry t[1024];
		ssize_t k = ibv_query_gid_table(ctx, t, 1024, 0);

		ok(k >= 2 && t[1].port_num == 1, "ibv_query_gid_table: %zd entries", k);
	}
	ok(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && ntohs(pkey) == 0xffff,
	   "P_Key 0 is the default 0xffff");
	ok(ibv_get_pkey_index(ctx, 1, htons(0xffff)) == 0, "ibv_get_pkey_index");
	ok(!strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") &&
	   !strcmp(ibv_event_type_str(IBV_EVENT_QP_FATAL),
		   "local work queue catastrophic error") &&
	   !strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active") &&
	   !strcmp(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter"),
	   "status, event, port and node words are rdma-core's");
	ok(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125 &&
	   mult_to_ibv_rate(4) == IBV_RATE_10_GBPS, "rate conversions");
	ok(ibv_fork_init() == 0 && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED,
	   "fork support is not needed (nothing is pinned)");
}

static void memory_registration(void)
{
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	char stackbuf[4096 + 7];
	char *heap = malloc(100000);
	char *map = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr;
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

	ok(pd2 != NULL, "ibv_alloc_pd");
	munmap(gone, 8192);

	mr = ibv_reg_mr(pd2, heap + 3, 99990, rw);
	ok(mr && mr->addr == heap + 3 && mr->length == 99990 && mr->lkey && mr->rkey,
	   "malloc'd memory, unaligned start and length");
	ok(ibv_dealloc_pd(pd2) == EBUSY, "ibv_dealloc_pd with a region on it: EBUSY");
	ok(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	mr = ibv_reg_mr(pd2, stackbuf + 7, 4096, rw);
	ok(mr != NULL, "stack memory");
	ibv_dereg_mr(mr);
	mr = ibv_reg_mr(pd2, map, 65536, rw | IBV_ACCESS_REMOTE_ATOMIC);
	ok(mr != NULL, "mmap'd memory with remote atomics");
	ibv_dereg_mr(mr);
	mr = ibv_reg_mr_iova(pd2, map, 4096, 0x1000000, rw);
	ok(mr != NULL, "ibv_reg_mr_iova (a chosen I/O address)");
	ibv_dereg_mr(mr);
	mr = ibv_reg_mr(pd2, map, 4096, rw | IBV_ACCESS_RELAXED_ORDERING);
	ok(mr != NULL, "relaxed ordering is optional and ignored (ibv_reg_mr_iova2)");
	ibv_dereg_mr(mr);

	errno = 0;
	ok(!ibv_reg_mr(pd2, heap, 0, rw) && errno == EINVAL, "length 0: EINVAL");
	errno = 0;
	ok(!ibv_reg_mr(pd2, gone, 4096, rw) && errno == EFAULT, "unmapped memory: EFAULT");
	errno = 0;
	ok(!ibv_reg_mr(pd2, ro, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	   "read-only memory for local write: EFAULT");
	mr = ibv_reg_mr(pd2, ro, 4096, IBV_ACCESS_REMOTE_READ);
	ok(mr != NULL, "read-only memory for remote reads only");
	ibv_dereg_mr(mr);
	errno = 0;
	ok(!ibv_reg_mr(pd2, heap, 4096, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	   "remote write without local write: EINVAL");
	errno = 0;
	ok(!ibv_reg_mr(pd2, heap, 4096, IBV_ACCESS_ON_DEMAND) && errno == EOPNOTSUPP,
	   "on-demand paging: EOPNOTSUPP");

	mr = ibv_reg_mr(pd2, heap, 4096, IBV_ACCESS_LOCAL_WRITE);
	ok(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL,
			map, 8192, rw) == 0 && mr->addr == map && mr->length == 8192,
	   "ibv_rereg_mr to new memory and access");
	ok(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
	   "ibv_rereg_mr with no change: an input error");
	ok(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd2) == 0, "deregister, then free the PD");
	free(heap);
	munmap(map, 65536);
	munmap(ro, 8192);
}

static void cq_and_qp_errors(void)
{
	struct ibv_device_attr da;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr qa;
	char buf[64];
	struct ibv_mr *mr;
	int i, r;

	ibv_query_device(ctx, &da);
	ok(ch && ch->fd >= 0, "ibv_create_comp_channel gives a file descriptor");
	errno = 0;
	ok(!ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "a CQ of 0 entries: EINVAL");
	errno = 0;
	ok(!ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) && errno == EINVAL,
	   "more than max_cqe: EINVAL");
	errno = 0;
	ok(!ibv_create_cq(ctx, 16, NULL, NULL, 5) && errno == EINVAL,
	   "a completion vector that does not exist: EINVAL");
	cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	ok(cq && cq->cq_context == (void *)0x1234 && cq->cqe >= 16, "ibv_create_cq");
	ok(ibv_destroy_comp_channel(ch) == EBUSY, "a channel in use cannot be destroyed");
	ok(ibv_resize_cq(cq, 64) == 0 && cq->cqe >= 64, "ibv_resize_cq");

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 2;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_send_sge = da.max_sge + 1;
	errno = 0;
	ok(!ibv_create_qp(pd, &ia) && errno == EINVAL, "more SGEs than max_sge: EINVAL");
	ia.cap.max_send_sge = 1;
	ia.qp_type = IBV_QPT_XRC_SEND;
	errno = 0;
	ok(!ibv_create_qp(pd, &ia) && errno == EOPNOTSUPP, "XRC QPs: EOPNOTSUPP");
	ia.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &ia);
	ok(qp && qp->qp_num && qp->state == IBV_QPS_RESET && ia.cap.max_send_wr >= 4,
	   "ibv_create_qp (QPN 0x%x)", qp ? qp->qp_num : 0);
	ok(ibv_destroy_cq(cq) == EBUSY, "a CQ a QP uses cannot be destroyed");

	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	{
		struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND }, *bad = NULL;

		r = ibv_post_send(qp, &w, &bad);
		ok(r == EINVAL && bad == &w, "post_send in RESET: EINVAL, bad_wr set");
	}
	ok(post_recv1(qp, 1, buf, 8, mr->lkey) == EINVAL, "post_recv in RESET: EINVAL");

	memset(&qa, 0, sizeof(qa));
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = 1;
	ok(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PORT) == EINVAL,
	   "RESET->INIT without P_Key index and access flags: EINVAL");
	ok(ibv_modify_qp(qp, &qa, IBV_QP_STATE | (1 << 23)) == EINVAL,
	   "an attribute mask bit that does not exist: EINVAL");
	qa.qp_state = IBV_QPS_RTS;
	ok(ibv_modify_qp(qp, &qa, IBV_QP_STATE) == EINVAL, "RESET->RTS: EINVAL");
	ok(to_init(qp, IBV_QPT_RC) == 0 && qp->state == IBV_QPS_INIT,
	   "RESET->INIT (ibv_qp.state follows)");
	for (i = 0, r = 0; i < 2 && !r; i++)
		r = post_recv1(qp, i, buf, 8, mr->lkey);
	ok(r == 0, "receives can be posted from INIT on");
	ok(post_recv1(qp, 9, buf, 8, mr->lkey) == ENOMEM, "a full receive queue: ENOMEM");
	memset(&qa, 0, sizeof(qa));
	{
		struct ibv_qp_init_attr qi;

		ok(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0 &&
		   qa.qp_state == IBV_QPS_INIT && qi.send_cq == cq && qi.cap.max_recv_wr == 2,
		   "ibv_query_qp: state and creation attributes");
	}
	qa.qp_state = IBV_QPS_RTR;
	qa.path_mtu = port.active_mtu;
	qa.dest_qp_num = qp->qp_num;
	qa.ah_attr.is_global = 0;
	qa.ah_attr.port_num = 1;
	qa.max_dest_rd_atomic = 1;
	qa.min_rnr_timer = 1;
	ok(ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER) == EINVAL,
	   "an address without a GRH on RoCE: EINVAL");
	ok(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0 &&
	   ibv_destroy_comp_channel(ch) == 0, "destroy QP, CQ, then channel");
	ibv_dereg_mr(mr);
}

/* Two RC QPs of this device connected to each other: every operation, data checked. */
static void rc_loopback(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, NULL, 16), *b = make_qp(IBV_QPT_RC, cq, NULL, 16);
	size_t len = 256 * 1024;
	char *ma = malloc(len), *mb = malloc(len);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		 IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *ra = ibv_reg_mr(pd, ma, len, rw), *rb = ibv_reg_mr(pd, mb, len, rw);
	uint64_t *atom = aligned_alloc(8, 64);
	struct ibv_mr *rat = ibv_reg_mr(pd, atom, 64, rw);
	struct ibv_wc wc[4];
	size_t i;
	int n;

	ok(cq && a && b && ra && rb && rat, "two RC QPs and their memory");
	ok(to_init(a, IBV_QPT_RC) == 0 && to_init(b, IBV_QPT_RC) == 0 &&
	   connect_rc(a, b->qp_num, 7) == 0 && connect_rc(b, a->qp_num, 7) == 0,
	   "connected to each other (loopback)");

	for (i = 0; i < len; i++)
		ma[i] = (char)(i * 7 + 3);
	memset(mb, 0, len);
	ok(post1(a, IBV_WR_RDMA_WRITE, 1, ma, len, ra->lkey, (uintptr_t)mb, rb->rkey, 0) == 0 &&
	   poll_n(cq, wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 1 &&
	   wc[0].opcode == IBV_WC_RDMA_WRITE, "RDMA WRITE of 256 KiB completes");
	ok(!memcmp(ma, mb, len), "every byte arrived in place (no copy of the MR)");

	memset(ma, 0, len);
	ok(post1(a, IBV_WR_RDMA_READ, 2, ma, len, ra->lkey, (uintptr_t)mb, rb->rkey, 0) == 0 &&
	   poll_n(cq, wc, 1) == 1 && wc[0].status == IBV_WC_SUCCESS &&
	   wc[0].opcode == IBV_WC_RDMA_READ && wc[0].byte_len == len,
	   "RDMA READ of 256 KiB completes");
	ok(!memcmp(ma, mb, len), "and reads back the same bytes");

	ok(post_recv1(b, 30, mb, 4096, rb->lkey) == 0, "b posts a receive");
	{
		struct ibv_sge s = { .addr = (uintptr_t)ma, .length = 100, .lkey = ra->lkey };
		struct ibv_send_wr w = { .wr_id = 3, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND_WITH_IMM,
					 .send_flags = IBV_SEND_SIGNALED }, *bad;

		w.imm_data = htonl(0xabcd1234);
		strcpy(ma, "hello through the engine");
		ok(ibv_post_send(a, &w, &bad) == 0, "SEND_WITH_IMM posted");
	}
	n = poll_n(cq, wc, 2);
	ok(n == 2, "both completions (%d)", n);
	for (i = 0; i < 2; i++)
		if (wc[i].opcode == IBV_WC_RECV)
			ok(wc[i].wr_id == 30 && wc[i].byte_len == 100 &&
			   (wc[i].wc_flags & IBV_WC_WITH_IMM) &&
			   ntohl(wc[i].imm_data) == 0xabcd1234 && wc[i].qp_num == b->qp_num &&
			   !strcmp(mb, "hello through the engine"),
			   "the receive: length, immediate data in network order, payload");

	{
		struct ibv_send_wr w = { .wr_id = 4, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bad;
		struct ibv_sge s = { .addr = (uintptr_t)"inline!", .length = 8, .lkey = 0 };

		w.sg_list = &s;
		w.num_sge = 1;
		post_recv1(b, 31, mb, 4096, rb->lkey);
		ok(ibv_post_send(a, &w, &bad) == 0 && poll_n(cq, wc, 2) == 2 &&
		   !strcmp(mb, "inline!"), "an inline SEND (no lkey)");
	}

	atom[0] = 10;
	{
		struct ibv_sge s = { .addr = (uintptr_t)&atom[1], .length = 8, .lkey = rat->lkey };
		struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
					 .send_flags = IBV_SEND_SIGNALED }, *bad;

		w.wr.atomic.remote_addr = (uintptr_t)&atom[0];
		w.wr.atomic.rkey = rat->rkey;
		w.wr.atomic.compare_add = 5;
		ok(ibv_post_send(a, &w, &bad) == 0 && poll_n(cq, wc, 1) == 1 &&
		   wc[0].status == IBV_WC_SUCCESS && atom[1] == 10 && atom[0] == 15,
		   "FETCH_AND_ADD returns the old value and adds");
		w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		w.wr.atomic.compare_add = 15;
		w.wr.atomic.swap = 99;
		ok(ibv_post_send(a, &w, &bad) == 0 && poll_n(cq, wc, 1) == 1 &&
		   atom[1] == 15 && atom[0] == 99, "CMP_AND_SWAP swaps on a match");
		w.wr.atomic.remote_addr = (uintptr_t)&atom[0] + 4;
		ok(ibv_post_send(a, &w, &bad) == 0 && poll_n(cq, wc, 1) == 1 &&
		   wc[0].status == IBV_WC_REM_INV_REQ_ERR,
		   "a misaligned atomic: IBV_WC_REM_INV_REQ_ERR");
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* A bad R_Key: the requester sees a remote access error, both QPs go to ERR. */
	a = make_qp(IBV_QPT_RC, cq, NULL, 16);
	b = make_qp(IBV_QPT_RC, cq, NULL, 16);
	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	connect_rc(a, b->qp_num, 7);
	connect_rc(b, a->qp_num, 7);
	ok(post1(a, IBV_WR_RDMA_WRITE, 6, ma, 64, ra->lkey, (uintptr_t)mb, rb->rkey ^ 0x55, 0) ==
	   0 && poll_n(cq, wc, 1) == 1 && wc[0].status == IBV_WC_REM_ACCESS_ERR,
	   "a WRITE with a bad R_Key: IBV_WC_REM_ACCESS_ERR");
	ok(post1(a, IBV_WR_RDMA_WRITE, 7, ma, 64, ra->lkey, (uintptr_t)mb, rb->rkey, 0) == 0 &&
	   poll_n(cq, wc, 1) == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR,
	   "after it, WRs complete flushed (the QP is in ERR)");
	{
		struct ibv_async_event ev;
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
		int fl = fcntl(ctx->async_fd, F_GETFL);

		ok(poll(&p, 1, 2000) == 1, "the async event fd becomes readable");
		ok(ibv_get_async_event(ctx, &ev) == 0 && ev.event_type == IBV_EVENT_QP_FATAL &&
		   (ev.element.qp == a || ev.element.qp == b),
		   "ibv_get_async_event: QP_FATAL for one of the QPs");
		ibv_ack_async_event(&ev);
		while (poll(&p, 1, 100) == 1 && ibv_get_async_event(ctx, &ev) == 0)
			ibv_ack_async_event(&ev);
		fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
		errno = 0;
		ok(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
		   "no more events: EAGAIN on a non-blocking fd");
		fcntl(ctx->async_fd, F_SETFL, fl);
	}
	ok(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroying QPs after events");

	/* Deregistering a region a posted receive still names is allowed, as with rxe; the
	 * receive then fails when a message comes, and the memory is not touched. */
	a = make_qp(IBV_QPT_RC, cq, NULL, 16);
	b = make_qp(IBV_QPT_RC, cq, NULL, 16);
	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	connect_rc(a, b->qp_num, 7);
	connect_rc(b, a->qp_num, 7);
	{
		char *spare = malloc(4096);
		struct ibv_mr *rs = ibv_reg_mr(pd, spare, 4096, IBV_ACCESS_LOCAL_WRITE);
		int k, bad = 0, fine = 0;

		memset(spare, 0x33, 4096);
		post_recv1(b, 40, spare, 4096, rs->lkey);
		ok(ibv_dereg_mr(rs) == 0, "ibv_dereg_mr with a receive still posted on it");
		post1(a, IBV_WR_SEND, 41, ma, 64, ra->lkey, 0, 0, 0);
		n = poll_n(cq, wc, 2);
		for (k = 0; k < n; k++) {
			if (wc[k].wr_id == 40)
				bad = wc[k].status != IBV_WC_SUCCESS;
			if (wc[k].wr_id == 41)
				fine = 1;
		}
		ok(n == 2 && bad && fine && spare[0] == 0x33 && spare[63] == 0x33,
		   "the receive then fails and its memory is left alone");
		free(spare);
	}
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ok(ibv_dereg_mr(ra) == 0 && ibv_dereg_mr(rb) == 0 && ibv_dereg_mr(rat) == 0 &&
	   ibv_destroy_cq(cq) == 0, "clean up");
	free(ma);
	free(mb);
	free(atom);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* Completion events: poll() on the channel, solicited-only arming, EAGAIN. */
static void completion_events(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, (void *)0x77, ch, 0);
	struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				       .cap = { 8, 8, 1, 1, 0 } };
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	char buf[256];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *ecq;
	void *ectx;
	struct ibv_wc wc;
	int fl;

	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	ok(connect_rc(a, b->qp_num, 7) == 0 && connect_rc(b, a->qp_num, 7) == 0,
	   "a QP pair whose receive CQ has a channel");
	ok(ibv_req_notify_cq(rcq, 0) == 0, "ibv_req_notify_cq (next completion)");
	ok(poll(&p, 1, 50) == 0, "nothing to read before a completion");
	post_recv1(b, 1, buf, 64, mr->lkey);
	post1(a, IBV_WR_SEND, 2, buf + 128, 16, mr->lkey, 0, 0, 0);
	ok(poll(&p, 1, 2000) == 1, "poll() on the channel fd: readable after the receive");
	ok(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == rcq && ectx == (void *)0x77,
	   "ibv_get_cq_event names the CQ and its context");
	ibv_ack_cq_events(rcq, 1);
	ok(poll_n(rcq, &wc, 1) == 1 && wc.opcode == IBV_WC_RECV, "the receive is there");
	poll_n(scq, &wc, 1);

	fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	errno = 0;
	ok(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN,
	   "no event pending: EAGAIN on a non-blocking channel");
	fcntl(ch->fd, F_SETFL, fl);
	{
		/* A signal ends a blocked wait with EINTR, as on rdma-core's event file. */
		struct sigaction sa = { .sa_handler = on_alarm };

		sigaction(SIGALRM, &sa, NULL);
		ualarm(100000, 0);
		errno = 0;
		ok(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EINTR,
		   "a signal interrupts a blocked ibv_get_cq_event (EINTR)");
	}

	/* Solicited only: an unsolicited SEND does not wake; a solicited one does. */
	ok(ibv_req_notify_cq(rcq, 1) == 0, "ibv_req_notify_cq (solicited only)");
	post_recv1(b, 3, buf, 64, mr->lkey);
	post1(a, IBV_WR_SEND, 4, buf + 128, 16, mr->lkey, 0, 0, 0);
	poll_n(scq, &wc, 1);
	ok(poll(&p, 1, 200) == 0, "an unsolicited SEND raises no event");
	ok(poll_n(rcq, &wc, 1) == 1, "though it completes");
	post_recv1(b, 5, buf, 64, mr->lkey);
	post1(a, IBV_WR_SEND, 6, buf + 128, 16, mr->lkey, 0, 0, IBV_SEND_SOLICITED);
	ok(poll(&p, 1, 2000) == 1 && ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == rcq,
	   "a solicited SEND does");
	ibv_ack_cq_events(rcq, 1);
	poll_n(rcq, &wc, 1);
	poll_n(scq, &wc, 1);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ok(ibv_destroy_cq(rcq) == 0 && ibv_destroy_cq(scq) == 0 &&
	   ibv_destroy_comp_channel(ch) == 0, "destroy after acknowledging every event");
	ibv_dereg_mr(mr);
}

/* UD: an address handle to our own GID, the GRH area, an AH made from the completion. */
static void ud_loopback(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_UD, cq, NULL, 8), *b = make_qp(IBV_QPT_UD, cq, NULL, 8);
	char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = gid, .sgid_index = gid_index, .hop_limit = 64 } };
	struct ibv_ah *ah;
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	struct ibv_wc wc[2], rwc;
	struct ibv_sge s = { .addr = (uintptr_t)buf + 2048, .length = 200, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	int i;

	to_init(a, IBV_QPT_UD);
	to_init(b, IBV_QPT_UD);
	ibv_modify_qp(a, &qa, IBV_QP_STATE);
	ibv_modify_qp(b, &qa, IBV_QP_STATE);
	qa.qp_state = IBV_QPS_RTS;
	qa.sq_psn = 1;
	ok(ibv_modify_qp(a, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0 &&
	   ibv_modify_qp(b, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "two UD QPs in RTS");
	aa.is_global = 0;
	errno = 0;
	ok(!ibv_create_ah(pd, &aa) && errno == EINVAL, "an AH without a GRH: EINVAL");
	aa.is_global = 1;
	ah = ibv_create_ah(pd, &aa);
	ok(ah != NULL, "ibv_create_ah to our own GID");
	post_recv1(b, 8, buf, 40 + 1024, mr->lkey);
	memset(buf + 2048, 0x5a, 200);
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = b->qp_num;
	w.wr.ud.remote_qkey = 0x11111111;
	ok(ibv_post_send(a, &w, &bad) == 0 && poll_n(cq, wc, 2) == 2, "a UD SEND to b");
	for (i = 0; i < 2; i++)
		if (wc[i].opcode == IBV_WC_RECV)
			rwc = wc[i];
	ok(rwc.status == IBV_WC_SUCCESS && rwc.byte_len == 240 && (rwc.wc_flags & IBV_WC_GRH) &&
	   rwc.src_qp == a->qp_num && buf[40] == 0x5a && buf[239] == 0x5a,
	   "received with its 40-byte GRH area, src_qp %u", rwc.src_qp);
	{
		struct ibv_ah_attr back;
		struct ibv_ah *ah2;

		ok(ibv_init_ah_from_wc(ctx, 1, &rwc, (struct ibv_grh *)buf, &back) == 0 &&
		   back.is_global && !memcmp(&back.grh.dgid, &gid, 16) &&
		   back.grh.sgid_index == gid_index, "ibv_init_ah_from_wc answers the sender");
		ah2 = ibv_create_ah_from_wc(pd, &rwc, (struct ibv_grh *)buf, 1);
		ok(ah2 && ibv_destroy_ah(ah2) == 0, "ibv_create_ah_from_wc");
	}
	w.wr.ud.ah = NULL;
	ok(ibv_post_send(a, &w, &bad) == EINVAL, "a UD SEND without an AH: EINVAL");
	ibv_destroy_ah(ah);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
}

/* An SRQ shared by two QPs, its limit event, its depth. */
static void srq(void)
{
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *s = ibv_create_srq(pd, &si);
	struct ibv_srq_attr sa;
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, NULL, 8), *b = make_qp(IBV_QPT_RC, cq, s, 8);
	char buf[1024];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc[4];
	struct ibv_async_event ev;
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	int i, r = 0;

	ok(s && si.attr.max_wr >= 8, "ibv_create_srq");
	for (i = 0; i < 8 && !r; i++) {
		struct ibv_sge g = { .addr = (uintptr_t)buf + 64 * i, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &g, .num_sge = 1 }, *bad;

		r = ibv_post_srq_recv(s, &w, &bad);
	}
	ok(r == 0, "8 receives posted to it");
	{
		struct ibv_sge g = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 1, .sg_list = &g, .num_sge = 1 }, *bad;

		ok(ibv_post_srq_recv(s, &w, &bad) == ENOMEM, "a ninth: ENOMEM");
	}
	ok(post_recv1(b, 1, buf, 8, mr->lkey) == EINVAL, "a QP on an SRQ has no receive queue");
	sa.srq_limit = 6;
	ok(ibv_modify_srq(s, &sa, IBV_SRQ_LIMIT) == 0 && ibv_query_srq(s, &sa) == 0 &&
	   sa.srq_limit == 6 && sa.max_wr == 8, "ibv_modify_srq arms the limit; ibv_query_srq");
	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	connect_rc(a, b->qp_num, 7);
	connect_rc(b, a->qp_num, 7);
	for (i = 0; i < 3; i++)
		post1(a, IBV_WR_SEND, i, buf + 900, 10, mr->lkey, 0, 0, 0);
	ok(poll_n(cq, wc, 4) == 4 && poll_n(cq, wc, 2) == 2, "3 SENDs land in the SRQ's buffers");
	ok(poll(&p, 1, 2000) == 1 && ibv_get_async_event(ctx, &ev) == 0 &&
	   ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == s,
	   "IBV_EVENT_SRQ_LIMIT_REACHED below the limit");
	ibv_ack_async_event(&ev);
	sa.max_wr = 16;
	ok(ibv_modify_srq(s, &sa, IBV_SRQ_MAX_WR) == 0 && ibv_query_srq(s, &sa) == 0 &&
	   sa.max_wr == 16, "the SRQ resized to 16");
	ok(ibv_destroy_srq(s) == EBUSY, "an SRQ a QP uses cannot be destroyed");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ok(ibv_destroy_srq(s) == 0, "ibv_destroy_srq");
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
}

/* A type 2 memory window: bound with a WR, used by the peer, blocks deregistration. */
static void memory_windows(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, NULL, 8), *b = make_qp(IBV_QPT_RC, cq, NULL, 8);
	char *src = malloc(8192), *dst = malloc(8192);
	struct ibv_mr *ms = ibv_reg_mr(pd, src, 8192, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *md = ibv_reg_mr(pd, dst, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *mw;
	struct ibv_send_wr w = { .wr_id = 20, .opcode = IBV_WR_BIND_MW,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	uint32_t rkey;

	errno = 0;
	ok(!ibv_alloc_mw(pd, IBV_MW_TYPE_1) && errno == EOPNOTSUPP, "type 1 windows: EOPNOTSUPP");
	mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	ok(mw && mw->type == IBV_MW_TYPE_2, "ibv_alloc_mw (type 2)");
	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	connect_rc(a, b->qp_num, 7);
	connect_rc(b, a->qp_num, 7);
	rkey = ibv_inc_rkey(mw->rkey);
	w.bind_mw.mw = mw;
	w.bind_mw.rkey = rkey;
	w.bind_mw.bind_info.mr = md;
	w.bind_mw.bind_info.addr = (uintptr_t)dst + 4096;
	w.bind_mw.bind_info.length = 4096;
	w.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	ok(ibv_post_send(b, &w, &bad) == 0 && poll_n(cq, &wc, 1) == 1 &&
	   wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW, "BIND_MW through b");
	memset(src, 0x42, 4096);
	memset(dst, 0, 8192);
	ok(post1(a, IBV_WR_RDMA_WRITE, 21, src, 4096, ms->lkey, (uintptr_t)dst + 4096, rkey,
		 0) == 0 && poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	   dst[4096] == 0x42 && dst[8191] == 0x42 && dst[4095] == 0,
	   "a WRITE through the window lands in its range only");
	ok(ibv_dereg_mr(md) == EBUSY, "a region with a window bound cannot be deregistered");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ok(ibv_dealloc_mw(mw) == 0 && ibv_dereg_mr(md) == 0, "after ibv_dealloc_mw it can");
	ibv_dereg_mr(ms);
	ibv_destroy_cq(cq);
	free(src);
	free(dst);
}

/* The extended QP (ibv_wr_*) and CQ (ibv_start_poll ...). */
static void extended_api(void)
{
	struct ibv_cq_init_attr_ex cia = { .cqe = 32, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN |
						  IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_IMM };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cia);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
	struct ibv_qp_init_attr_ex qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { 16, 16, 2, 2, 0 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM,
	};
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *qx;
	char *buf = malloc(16384);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 16384,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_poll_cq_attr pa = {};
	int seen = 0, recv_ok = 0;

	cia.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	ok(!ibv_create_cq_ex(ctx, &cia) && errno == EOPNOTSUPP,
	   "completion timestamps: EOPNOTSUPP");
	ok(cqx != NULL, "ibv_create_cq_ex");
	a = ibv_create_qp_ex(ctx, &qia);
	qia.comp_mask = IBV_QP_INIT_ATTR_PD;
	b = ibv_create_qp_ex(ctx, &qia);
	ok(a && b, "ibv_create_qp_ex");
	qx = ibv_qp_to_qp_ex(a);
	ok(qx != NULL, "ibv_qp_to_qp_ex");
	to_init(a, IBV_QPT_RC);
	to_init(b, IBV_QPT_RC);
	connect_rc(a, b->qp_num, 7);
	connect_rc(b, a->qp_num, 7);
	memset(buf, 0x11, 4096);
	memset(buf + 8192, 0, 4096);
	post_recv1(b, 50, buf + 12288, 64, mr->lkey);
	ibv_wr_start(qx);
	qx->wr_id = 40;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)buf + 8192);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 4096);
	qx->wr_id = 41;
	ibv_wr_send_imm(qx, htonl(77));
	ibv_wr_set_inline_data(qx, "ext", 4);
	ok(ibv_wr_complete(qx) == 0, "ibv_wr_start, rdma_write, send_imm, ibv_wr_complete");
	while (seen < 3) {
		int r = ibv_start_poll(cqx, &pa), k = 0;

		if (r == ENOENT)
			continue;
		ok(r == 0, "ibv_start_poll");
		do {
			seen++;
			if (ibv_wc_read_opcode(cqx) == IBV_WC_RECV)
				recv_ok = cqx->wr_id == 50 && cqx->status == IBV_WC_SUCCESS &&
					  ibv_wc_read_byte_len(cqx) == 4 &&
					  ntohl(ibv_wc_read_imm_data(cqx)) == 77 &&
					  ibv_wc_read_qp_num(cqx) == b->qp_num;
			k++;
		} while (ibv_next_poll(cqx) == 0);
		ibv_end_poll(cqx);
	}
	ok(recv_ok && !memcmp(buf, buf + 8192, 4096) && !strcmp(buf + 12288, "ext"),
	   "the WRITE's bytes and the receive read with ibv_wc_read_*");
	ibv_wr_start(qx);
	ibv_wr_rdma_write(qx, mr->rkey, (uintptr_t)buf);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
	ibv_wr_abort(qx);
	ok(ibv_start_poll(cqx, &pa) == ENOENT, "ibv_wr_abort posts nothing");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ok(ibv_destroy_cq(cq) == 0, "destroy the extended CQ");
	ibv_dereg_mr(mr);
	free(buf);
}

/* Several threads post and poll on their own QP pairs through one shared CQ. */
#define THREADS 4
#define PER_THREAD 2000
static struct ibv_cq *shared_cq;
static volatile int polled[THREADS];

struct worker {
	int id;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
	char *buf;
};

static void *worker(void *arg)
{
	struct worker *w = arg;
	int i, posted = 0, r;

	for (i = 0; i < PER_THREAD; i++) {
		do {
			r = post1(w->a, IBV_WR_RDMA_WRITE, ((uint64_t)w->id << 32) | i, w->buf, 64,
				  w->mr->lkey, (uintptr_t)w->buf + 4096, w->mr->rkey, 0);
		} while (r == ENOMEM);
		if (r)
			return (void *)(intptr_t)r;
		posted++;
		while (1) {
			struct ibv_wc wc[8];
			int n = ibv_poll_cq(shared_cq, 8, wc), k;

			for (k = 0; k < n; k++) {
				if (wc[k].status != IBV_WC_SUCCESS)
					return (void *)(intptr_t)-1;
				__sync_fetch_and_add(&polled[wc[k].wr_id >> 32], 1);
			}
			if (n == 0)
				break;
		}
	}
	return NULL;
}

static void threads(void)
{
	struct worker w[THREADS];
	pthread_t t[THREADS];
	int i, total = 0, fails = 0;
	double until;

	shared_cq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
	for (i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].buf = malloc(8192);
		w[i].mr = ibv_reg_mr(pd, w[i].buf, 8192,
				     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		w[i].a = make_qp(IBV_QPT_RC, shared_cq, NULL, 32);
		w[i].b = make_qp(IBV_QPT_RC, shared_cq, NULL, 32);
		to_init(w[i].a, IBV_QPT_RC);
		to_init(w[i].b, IBV_QPT_RC);
		connect_rc(w[i].a, w[i].b->qp_num, 7);
		connect_rc(w[i].b, w[i].a->qp_num, 7);
	}
	for (i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, worker, &w[i]);
	for (i = 0; i < THREADS; i++) {
		void *r;

		pthread_join(t[i], &r);
		fails += r != NULL;
	}
	until = now_s() + 5;
	for (i = 0; i < THREADS; i++)
		total += polled[i];
	while (total < THREADS * PER_THREAD && now_s() < until) {
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(shared_cq, 16, wc), k;

		for (k = 0; k < n; k++)
			polled[wc[k].wr_id >> 32]++;
		total += n;
	}
	ok(fails == 0 && total == THREADS * PER_THREAD,
	   "%d threads posting and polling at once: %d of %d WRITEs completed", THREADS, total,
	   THREADS * PER_THREAD);
	for (i = 0; i < THREADS; i++)
		ok(polled[i] == PER_THREAD, "thread %d: all of its %d completions", i, PER_THREAD);
	for (i = 0; i < THREADS; i++) {
		ibv_destroy_qp(w[i].a);
		ibv_destroy_qp(w[i].b);
		ibv_dereg_mr(w[i].mr);
		free(w[i].buf);
	}
	ibv_destroy_cq(shared_cq);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s DEVICE [GID_INDEX]\n", argv[0]);
		return 2;
	}
	if (argc > 2)
		gid_index = atoi(argv[2]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	devices_and_queries(argv[1]);
	pd = ibv_alloc_pd(ctx);
	ok(pd != NULL, "ibv_alloc_pd");
	memory_registration();
	cq_and_qp_errors();
	rc_loopback();
	completion_events();
	ud_loopback();
	srq();
	memory_windows();
	extended_api();
	threads();
	ok(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	ok(ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("%d passed, 0 failed\n", n_checks);
	return 0;
}

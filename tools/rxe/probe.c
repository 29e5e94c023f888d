/*
 * roce-probe: the verbs probe of roce-xdp's rxe interop harness (tools/rxe-interop).
 *
 * It runs inside the rxe VM, against rdma-core's libibverbs and rxe, and talks to
 * `roce-xdp probe` on the other side of the wire. No stock tool exercises RDMA
 * WRITE_WITH_IMM, SEND_WITH_IMM, SEND_WITH_INV, large READs, atomics with checked
 * results or error cases; this does, as requester or as target, and checks every byte.
 *
 * Out of band (TCP, pingpong-style; the TCP client writes first):
 *   record  128 bytes  "RXP1 qpn psn gid rkey addr len"   (hex, GID as 32 digits)
 *   GO       64 bytes  "GO inv_rkey"             target -> requester, receives posted
 *   DONE     64 bytes  "DONE status"             requester -> target, all ops completed
 *   RESULT   64 bytes  "RESULT 0|1 message"      target -> requester, target's checks
 * Both sides print one "PROBE ..." line and exit 0 only if both sides' checks passed.
 *
 * The data of iteration i, byte j, is pat(seed, i, j) (the same function in
 * src/apps/probe.rs). Atomics: the target's counter starts at seed64(seed); CMP_SWAP i
 * compares with the model (i even) or with the model ^ 1 (i odd) and swaps in
 * 0x1000000000 + i; FETCH_ADD i adds i + 1. Both sides compute the model.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define REC_LEN 128
#define MSG_LEN 64
#define MAX_ITERS 64

enum op { OP_WRITE, OP_WRITE_IMM, OP_READ, OP_SEND_IMM, OP_SEND_INV, OP_CAS, OP_FAA, OP_WRITE_MW };
static const char *op_names[] = {"write", "write_imm", "read", "send_imm", "send_inv", "cas", "faa",
				 "write_mw"};

static struct {
	const char *dev, *host, *op_name;
	int port, gid_idx, mtu, timeout, requester, bad_rkey, rnr_delay_ms, wait_s;
	enum op op;
	uint32_t size, iters, seed;
} o = {.dev = "rxe0", .port = 18700, .gid_idx = 1, .mtu = 0, .timeout = 14,
       .size = 4096, .iters = 4, .seed = 1, .wait_s = 30};

static char fail_msg[48] = "";

static void failf(const char *fmt, ...)
{
	va_list ap;
	if (fail_msg[0])
		return; /* keep the first */
	va_start(ap, fmt);
	vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
	va_end(ap);
	/* The whole message (fail_msg is cut to fit the 64-byte RESULT). */
	va_start(ap, fmt);
	fprintf(stdout, "probe: ");
	vfprintf(stdout, fmt, ap);
	fprintf(stdout, "\n");
	va_end(ap);
}

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stdout, "PROBE %s %s: FAIL ", o.requester ? "requester" : "target", o.op_name);
	vfprintf(stdout, fmt, ap);
	fprintf(stdout, "\n");
	va_end(ap);
	fflush(stdout);
	exit(1);
}

static uint8_t pat(uint32_t seed, uint32_t i, uint32_t j)
{
	uint32_t x = seed * 0x9E3779B1u + i * 0x85EBCA77u + j * 0xC2B2AE3Du;
	x ^= x >> 15;
	x *= 0x2C1B3C6Du;
	x ^= x >> 12;
	return (uint8_t)x;
}

static uint64_t seed64(uint32_t seed) { return ((uint64_t)seed << 32) | 0x1234u; }

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* ---- TCP ---------------------------------------------------------------------- */

static int tcp_connect(void)
{
	char port[16];
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
	double end = now() + o.wait_s;
	snprintf(port, sizeof port, "%d", o.port);
	if (getaddrinfo(o.host, port, &hints, &res))
		die("cannot resolve %s", o.host);
	for (;;) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
			freeaddrinfo(res);
			return fd;
		}
		if (fd >= 0)
			close(fd);
		if (now() > end)
			die("cannot connect to %s:%d", o.host, o.port);
		usleep(100000);
	}
}

static int tcp_accept(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(o.port)};
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), fd;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
		die("cannot listen on port %d: %s", o.port, strerror(errno));
	fd = accept(l, NULL, NULL);
	close(l);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	return fd;
}

static void put_msg(int fd, const char *s, size_t len)
{
	char buf[REC_LEN] = {0};
	strncpy(buf, s, len - 1);
	if (write(fd, buf, len) != (ssize_t)len)
		die("TCP write failed");
}

static void get_msg(int fd, char *buf, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n <= 0)
			die("the peer closed the TCP connection");
		got += n;
	}
	buf[len - 1] = 0;
}

/* ---- verbs -------------------------------------------------------------------- */

struct remote {
	uint32_t qpn, psn, rkey, len;
	uint64_t addr;
	union ibv_gid gid;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static uint8_t *buf;
static size_t buf_len;

static void setup(void)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	for (int i = 0; l && i < n; i++)
		if (!strcmp(ibv_get_device_name(l[i]), o.dev))
			ctx = ibv_open_device(l[i]);
	if (!ctx)
		die("no device %s", o.dev);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4 * MAX_ITERS + 16, NULL, NULL, 0);
	buf_len = (size_t)o.size * o.iters + 4096;
	if (posix_memalign((void **)&buf, 4096, buf_len))
		die("out of memory");
	memset(buf, 0, buf_len);
	mr = ibv_reg_mr(pd, buf, buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
	if (!pd || !cq || !mr)
		die("verbs setup failed: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {
	    .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
	    .cap = {.max_send_wr = 2 * MAX_ITERS, .max_recv_wr = 2 * MAX_ITERS,
		    .max_send_sge = 1, .max_recv_sge = 1}};
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS))
		die("modify to INIT: %s", strerror(errno));
	if (!o.mtu) {
		struct ibv_port_attr pa;
		ibv_query_port(ctx, 1, &pa);
		o.mtu = pa.active_mtu;
	}
}

static void connect_qp(const struct remote *r, uint32_t my_psn)
{
	struct ibv_qp_attr a = {
	    .qp_state = IBV_QPS_RTR, .path_mtu = o.mtu, .dest_qp_num = r->qpn,
	    .rq_psn = r->psn, .max_dest_rd_atomic = 8, .min_rnr_timer = 12,
	    .ah_attr = {.is_global = 1, .port_num = 1,
			.grh = {.dgid = r->gid, .sgid_index = o.gid_idx, .hop_limit = 64}}};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				      IBV_QP_MIN_RNR_TIMER))
		die("modify to RTR: %s", strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = o.timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = my_psn;
	a.max_rd_atomic = 8;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify to RTS: %s", strerror(errno));
}

/* One completion, waiting up to o.wait_s. */
static struct ibv_wc next_wc(void)
{
	struct ibv_wc wc;
	double end = now() + o.wait_s;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq failed");
		if (n == 1)
			return wc;
		if (now() > end)
			die("no completion within %d s", o.wait_s);
		usleep(50);
	}
}

static void post_send(struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, wr, &bad))
		die("ibv_post_send: %s", strerror(errno));
}

static void post_recv(uint64_t id, void *addr, uint32_t len)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &s, .num_sge = len ? 1 : 0}, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv: %s", strerror(errno));
}

static void fill(uint32_t i, uint8_t *p)
{
	for (uint32_t j = 0; j < o.size; j++)
		p[j] = pat(o.seed, i, j);
}

static int check_region(uint32_t i, const uint8_t *p, const char *what)
{
	for (uint32_t j = 0; j < o.size; j++)
		if (p[j] != pat(o.seed, i, j)) {
			failf("%s %u: byte %u is 0x%02x, expected 0x%02x", what, i, j, p[j],
			      pat(o.seed, i, j));
			return 0;
		}
	return 1;
}

/* ---- requester ---------------------------------------------------------------- */

static const char *run_requester(const struct remote *r, uint32_t inv_rkey)
{
	uint32_t rkey = o.bad_rkey ? r->rkey ^ 0x5a5a5a00u : r->rkey;
	uint64_t model = seed64(o.seed);
	uint8_t *res = buf + (size_t)o.size * o.iters; /* 8-byte atomic results */
	for (uint32_t i = 0; i < o.iters; i++) {
		uint8_t *loc = buf + (size_t)i * o.size;
		struct ibv_sge s = {.addr = (uintptr_t)loc, .length = o.size, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = i, .sg_list = &s, .num_sge = 1,
					 .send_flags = IBV_SEND_SIGNALED};
		uint64_t raddr = r->addr + (uint64_t)i * o.size;
		uint64_t cmp = 0;
		switch (o.op) {
		case OP_WRITE:
		case OP_WRITE_IMM:
		case OP_WRITE_MW:
			fill(i, loc);
			wr.opcode = o.op == OP_WRITE_IMM ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
			wr.imm_data = htonl(0x1000 + i);
			wr.wr.rdma.remote_addr = raddr;
			/* write_mw: through the target's window, whose key came with GO. */
			wr.wr.rdma.rkey = o.op == OP_WRITE_MW && !o.bad_rkey ? inv_rkey : rkey;
			break;
		case OP_READ:
			memset(loc, 0, o.size);
			wr.opcode = IBV_WR_RDMA_READ;
			wr.wr.rdma.remote_addr = raddr;
			wr.wr.rdma.rkey = rkey;
			break;
		case OP_SEND_IMM:
			fill(i, loc);
			wr.opcode = IBV_WR_SEND_WITH_IMM;
			wr.imm_data = htonl(0x2000 + i);
			break;
		case OP_SEND_INV:
			fill(i, loc);
			wr.opcode = IBV_WR_SEND_WITH_INV;
			wr.invalidate_rkey = inv_rkey;
			break;
		case OP_CAS:
		case OP_FAA:
			s.addr = (uintptr_t)res;
			s.length = 8;
			memset(res, 0, 8);
			cmp = (i % 2 == 0) ? model : model ^ 1;
			wr.opcode = o.op == OP_CAS ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
			wr.wr.atomic.remote_addr = r->addr;
			wr.wr.atomic.rkey = rkey;
			wr.wr.atomic.compare_add = o.op == OP_CAS ? cmp : i + 1;
			wr.wr.atomic.swap = 0x1000000000ull + i;
			break;
		}
		post_send(&wr);
		struct ibv_wc wc = next_wc();
		if (o.bad_rkey) {
			if (wc.status != IBV_WC_REM_ACCESS_ERR) {
				failf("a bad rkey completed with %s, not REM_ACCESS_ERR",
				      ibv_wc_status_str(wc.status));
				return "fail";
			}
			return "rem_access_err";
		}
		if (wc.status != IBV_WC_SUCCESS) {
			failf("WR %u completed with %s", i, ibv_wc_status_str(wc.status));
			return "fail";
		}
		if (o.op == OP_READ) {
			if (wc.opcode != IBV_WC_RDMA_READ)
				failf("READ %u completed as opcode %d", i, wc.opcode);
			check_region(i, loc, "READ data");
		}
		if (o.op == OP_CAS || o.op == OP_FAA) {
			uint64_t got;
			memcpy(&got, res, 8);
			if (got != model)
				failf("atomic %u returned 0x%llx, expected 0x%llx", i,
				      (unsigned long long)got, (unsigned long long)model);
			if (o.op == OP_CAS && cmp == model)
				model = 0x1000000000ull + i;
			if (o.op == OP_FAA)
				model += i + 1;
		}
	}
	return fail_msg[0] ? "fail" : "ok";
}

/* ---- target ------------------------------------------------------------------- */

static struct ibv_mw *mw;

/* Prepares memory and receives before GO; returns the rkey to invalidate (send_inv). */
static uint32_t target_prepare(void)
{
	uint32_t inv = 0;
	if (o.op == OP_READ)
		for (uint32_t i = 0; i < o.iters; i++)
			fill(i, buf + (size_t)i * o.size);
	if (o.op == OP_CAS || o.op == OP_FAA) {
		uint64_t v = seed64(o.seed);
		memcpy(buf, &v, 8);
	}
	if (o.op == OP_SEND_INV || o.op == OP_WRITE_MW) {
		/* rxe invalidates only fast-registration MRs and memory windows: bind a type 2
		 * window over the buffer and hand out its rkey (send_inv invalidates it,
		 * write_mw writes through it). */
		mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!mw)
			die("ibv_alloc_mw: %s", strerror(errno));
		struct ibv_send_wr wr = {.wr_id = 999, .opcode = IBV_WR_BIND_MW,
					 .send_flags = IBV_SEND_SIGNALED};
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
		wr.bind_mw.bind_info.mr = mr;
		wr.bind_mw.bind_info.addr = (uintptr_t)buf;
		wr.bind_mw.bind_info.length = o.op == OP_WRITE_MW ? (uint64_t)o.size * o.iters : 4096;
		wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
		post_send(&wr);
		struct ibv_wc wc = next_wc();
		if (wc.status != IBV_WC_SUCCESS)
			die("binding the memory window: %s", ibv_wc_status_str(wc.status));
		inv = wr.bind_mw.rkey;
	}
	return inv;
}

static void target_post_receives(void)
{
	for (uint32_t i = 0; i < o.iters; i++) {
		if (o.op == OP_SEND_IMM || o.op == OP_SEND_INV)
			post_recv(i, buf + (size_t)i * o.size, o.size);
		if (o.op == OP_WRITE_IMM)
			post_recv(i, NULL, 0);
	}
}

/* The receive completions (before DONE: the requester's ops are done when they are). */
static void target_wait_receives(uint32_t inv_rkey)
{
	int recvs = (o.op == OP_SEND_IMM || o.op == OP_SEND_INV || o.op == OP_WRITE_IMM);
	for (uint32_t i = 0; recvs && i < o.iters; i++) {
		struct ibv_wc wc = next_wc();
		if (wc.status != IBV_WC_SUCCESS) {
			failf("receive %u completed with %s", i, ibv_wc_status_str(wc.status));
			return;
		}
		if (wc.wr_id != i)
			failf("receive %llu completed in place of %u", (unsigned long long)wc.wr_id, i);
		if (wc.byte_len != o.size)
			failf("receive %u: byte_len %u, expected %u", i, wc.byte_len, o.size);
		if (o.op == OP_WRITE_IMM) {
			if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
			    ntohl(wc.imm_data) != 0x1000 + i)
				failf("WRITE_WITH_IMM %u: opcode %d flags 0x%x imm 0x%x", i, wc.opcode,
				      wc.wc_flags, ntohl(wc.imm_data));
		} else if (o.op == OP_SEND_IMM) {
			if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
			    ntohl(wc.imm_data) != 0x2000 + i)
				failf("SEND_WITH_IMM %u: opcode %d flags 0x%x imm 0x%x", i, wc.opcode,
				      wc.wc_flags, ntohl(wc.imm_data));
		} else {
			/* rxe (Linux 6.1) writes the user CQE's flags with the kernel's values:
			 * IB_WC_WITH_INVALIDATE is 1 << 2, which libibverbs calls
			 * IBV_WC_IP_CSUM_OK (its IBV_WC_WITH_INV is 1 << 3). Accept both. */
			unsigned with_inv = IBV_WC_WITH_INV | (1u << 2);
			if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & with_inv) ||
			    wc.invalidated_rkey != inv_rkey)
				failf("SEND_WITH_INV %u: opcode %d flags 0x%x rkey 0x%x, expected 0x%x", i,
				      wc.opcode, wc.wc_flags, wc.invalidated_rkey, inv_rkey);
		}
	}
}

/* Memory, after DONE: every WRITE and atomic of the requester has completed. */
static void target_check_memory(void)
{
	uint64_t model = seed64(o.seed), got;
	switch (o.op) {
	case OP_WRITE:
	case OP_WRITE_IMM:
	case OP_WRITE_MW:
	case OP_SEND_IMM:
	case OP_SEND_INV:
	case OP_READ: /* the READ source must be unchanged */
		for (uint32_t i = 0; i < o.iters; i++)
			if (!check_region(i, buf + (size_t)i * o.size,
					  o.op == OP_READ ? "READ source" : "received data"))
				break;
		break;
	case OP_CAS:
	case OP_FAA:
		for (uint32_t i = 0; i < o.iters; i++) {
			uint64_t cmp = (i % 2 == 0) ? model : model ^ 1;
			if (o.op == OP_CAS && cmp == model)
				model = 0x1000000000ull + i;
			if (o.op == OP_FAA)
				model += i + 1;
		}
		memcpy(&got, buf, 8);
		if (got != model)
			failf("the counter is 0x%llx, expected 0x%llx", (unsigned long long)got,
			      (unsigned long long)model);
		break;
	}
}

/* ---- main --------------------------------------------------------------------- */

static void usage(void)
{
	printf("usage: roce-probe [-d dev] [-g gid_idx] [-p port] [-m mtu_enum] [-t timeout]\n"
	       "       --role req|tgt --op write|write_imm|write_mw|read|send_imm|send_inv|cas|faa\n"
	       "       [-s size] [-n iters] [-S seed] [--bad-rkey] [--rnr-delay MS] [-w secs] [host]\n");
}

int main(int argc, char **argv)
{
	static struct option lo[] = {{"role", 1, 0, 'R'}, {"op", 1, 0, 'O'},
				     {"bad-rkey", 0, 0, 'B'}, {"rnr-delay", 1, 0, 'D'},
				     {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
	int c, role = -1;
	o.op_name = "?";
	while ((c = getopt_long(argc, argv, "d:g:p:m:t:s:n:S:w:h", lo, NULL)) != -1) {
		switch (c) {
		case 'd': o.dev = optarg; break;
		case 'g': o.gid_idx = atoi(optarg); break;
		case 'p': o.port = atoi(optarg); break;
		case 'm': o.mtu = atoi(optarg); break;
		case 't': o.timeout = atoi(optarg); break;
		case 's': o.size = strtoul(optarg, NULL, 0); break;
		case 'n': o.iters = strtoul(optarg, NULL, 0); break;
		case 'S': o.seed = strtoul(optarg, NULL, 0); break;
		case 'w': o.wait_s = atoi(optarg); break;
		case 'B': o.bad_rkey = 1; break;
		case 'D': o.rnr_delay_ms = atoi(optarg); break;
		case 'R': role = !strcmp(optarg, "req") ? 1 : !strcmp(optarg, "tgt") ? 0 : -1; break;
		case 'O':
			o.op_name = optarg;
			o.op = (enum op) - 1;
			for (unsigned k = 0; k < sizeof op_names / sizeof *op_names; k++)
				if (!strcmp(optarg, op_names[k]))
					o.op = (enum op)k;
			break;
		default: usage(); return c == 'h' ? 0 : 2;
		}
	}
	if (optind < argc)
		o.host = argv[optind];
	if (role < 0 || (int)o.op < 0 || o.iters == 0 || o.iters > MAX_ITERS || o.size == 0) {
		usage();
		return 2;
	}
	o.requester = role;
	if (o.op == OP_CAS || o.op == OP_FAA)
		o.size = 8;
	if (o.op == OP_SEND_INV)
		o.iters = 1;
	srand48(getpid() * time(NULL));
	setup();
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, o.gid_idx, &gid))
		die("no GID %d", o.gid_idx);
	uint32_t my_psn = lrand48() & 0xffffff;
	char rec[REC_LEN], gidhex[33];
	for (int i = 0; i < 16; i++)
		sprintf(gidhex + 2 * i, "%02x", gid.raw[i]);
	snprintf(rec, sizeof rec, "RXP1 %06x %06x %s %08x %016llx %08x", qp->qp_num, my_psn,
		 gidhex, mr->rkey, (unsigned long long)(uintptr_t)buf, (unsigned)buf_len);
	struct remote r;
	char peer[REC_LEN], g[64];
	unsigned long long addr;
	int fd;
	if (o.host) {
		fd = tcp_connect();
		put_msg(fd, rec, REC_LEN);
		get_msg(fd, peer, REC_LEN);
	} else {
		fd = tcp_accept();
		get_msg(fd, peer, REC_LEN);
	}
	if (sscanf(peer, "RXP1 %x %x %32s %x %llx %x", &r.qpn, &r.psn, g, &r.rkey, &addr,
		   &r.len) != 6 || strlen(g) != 32)
		die("bad record from the peer: %.60s", peer);
	r.addr = addr;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(g + 2 * i, "%2x", &v);
		r.gid.raw[i] = v;
	}
	connect_qp(&r, my_psn);
	if (!o.host)
		put_msg(fd, rec, REC_LEN);
	double t0 = now();
	char msg[MSG_LEN];
	const char *status = "ok";
	if (o.requester) {
		unsigned inv = 0;
		get_msg(fd, msg, MSG_LEN);
		if (sscanf(msg, "GO %x", &inv) != 1)
			die("expected GO, got %.40s", msg);
		status = run_requester(&r, inv);
		snprintf(msg, sizeof msg, "DONE %s", status);
		put_msg(fd, msg, MSG_LEN);
		get_msg(fd, msg, MSG_LEN);
		int peer_fail = 1;
		char pm[MSG_LEN] = "";
		if (sscanf(msg, "RESULT %d %63[^\n]", &peer_fail, pm) < 1)
			die("expected RESULT, got %.40s", msg);
		if (peer_fail)
			failf("target: %s", pm);
	} else {
		uint32_t inv = target_prepare();
		if (!o.rnr_delay_ms)
			target_post_receives();
		snprintf(msg, sizeof msg, "GO %08x", inv);
		put_msg(fd, msg, MSG_LEN);
		if (o.rnr_delay_ms) {
			/* No receive yet: the requester's first SEND gets RNR NAKs. */
			usleep(o.rnr_delay_ms * 1000);
			target_post_receives();
		}
		if (!o.bad_rkey)
			target_wait_receives(inv);
		get_msg(fd, msg, MSG_LEN);
		if (strncmp(msg, "DONE ", 5))
			die("expected DONE, got %.40s", msg);
		if (!o.bad_rkey && !strcmp(msg + 5, "ok"))
			target_check_memory();
		if (strcmp(msg + 5, o.bad_rkey ? "rem_access_err" : "ok"))
			failf("requester: %s", msg + 5);
		snprintf(msg, sizeof msg, "RESULT %d %s", fail_msg[0] != 0,
			 fail_msg[0] ? fail_msg : "all checks passed");
		put_msg(fd, msg, MSG_LEN);
	}
	double dt = now() - t0;
	printf("PROBE %s %s size %u iters %u%s: %s%s%s (%.3f s)\n",
	       o.requester ? "requester" : "target", o.op_name, o.size, o.iters,
	       o.bad_rkey ? " bad-rkey" : "", fail_msg[0] ? "FAIL " : "PASS", fail_msg,
	       fail_msg[0] ? "" : "", dt);
	fflush(stdout);
	close(fd);
	return fail_msg[0] ? 1 : 0;
}

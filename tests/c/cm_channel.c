/* rdma_cm event channels as librdmacm and the kernel's ucma keep them, from an
 * unmodified program's side (run by tests/rdma_cm.rs under `roce-xdp run`):
 * - the channel's fd is readable exactly while an event waits for rdma_get_cm_event;
 * - rdma_destroy_id drops the ID's undelivered events: the fd stops being readable and
 *   no event naming the destroyed ID is ever handed out;
 * - a thread waiting in rdma_get_cm_event gets an event queued later, and stays
 *   waiting (no error, no EAGAIN) when the program destroys its last ID and the
 *   channel under it, as rping's event thread does at exit;
 * - a thread that read events from a channel and comes back to it just after another
 *   thread destroyed it waits as it would had it been back first (rping's event thread
 *   after acknowledging DISCONNECTED, racing main's teardown);
 * - a destroyed channel is refused (EINVAL) to the thread that destroyed it, not
 *   dereferenced.
 * Usage: cm_channel ADDRESS (an IPv4 address of this host's roce-xdp device). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int n_checks;

static void ok(int cond, const char *what)
{
	n_checks++;
	if (!cond) {
		printf("not ok %d - %s (errno %d: %s)\n", n_checks, what, errno, strerror(errno));
		exit(1);
	}
	printf("ok %d - %s\n", n_checks, what);
}

static int readable(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static struct sockaddr_in addr;

/* An ID on `ch` with an ADDR_RESOLVED (or ADDR_ERROR) event on its way. */
static struct rdma_cm_id *resolving(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = NULL;
	ok(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	ok(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0, "rdma_resolve_addr");
	return id;
}

struct waiter {
	struct rdma_event_channel *ch;
	volatile int got, rc, err;
	struct rdma_cm_id *id;
	int event;
};

/* Reads one event, then, once told the channel is gone, asks for the next. */
struct late {
	struct rdma_event_channel *ch;
	volatile int read_one, destroyed, returned;
};

static void *read_then_come_back(void *arg)
{
	struct late *l = arg;
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(l->ch, &ev) == 0) {
		rdma_ack_cm_event(ev);
		l->read_one = 1;
	}
	while (!l->destroyed)
		usleep(1000);
	rdma_get_cm_event(l->ch, &ev);
	l->returned = 1;
	return NULL;
}

static void *wait_one(void *arg)
{
	struct waiter *w = arg;
	struct rdma_cm_event *ev;
	w->rc = rdma_get_cm_event(w->ch, &ev);
	w->err = errno;
	if (w->rc == 0) {
		w->id = ev->id;
		w->event = ev->event;
		rdma_ack_cm_event(ev);
	}
	w->got = 1;
	return NULL;
}

int main(int argc, char **argv)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id, *id2;
	struct waiter w;
	pthread_t t;
	int i, flags;

	if (argc < 2) {
		fprintf(stderr, "usage: %s ADDRESS\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	addr.sin_family = AF_INET;
	ok(inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1, "the address parses");

	struct rdma_event_channel *ch = rdma_create_event_channel();
	ok(ch != NULL, "rdma_create_event_channel");
	ok(!readable(ch, 0), "a new channel's fd is not readable");

	/* An event waits: the fd is readable until the program takes it. */
	id = resolving(ch);
	ok(readable(ch, 5000), "the fd is readable once the address is resolved");
	ok(rdma_get_cm_event(ch, &ev) == 0 && ev->id == id, "rdma_get_cm_event: the ID's event");
	ok(ev->event == RDMA_CM_EVENT_ADDR_RESOLVED, "the event is ADDR_RESOLVED");
	ok(!readable(ch, 0), "taken: the fd is no longer readable");
	ok(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
	ok(rdma_destroy_id(id) == 0, "rdma_destroy_id");

	/* An event left waiting goes with its ID. */
	id = resolving(ch);
	ok(readable(ch, 5000), "a second ID's event waits");
	ok(rdma_destroy_id(id) == 0, "rdma_destroy_id with its event not taken");
	ok(!readable(ch, 0), "the destroyed ID's event is gone: the fd is not readable");
	flags = fcntl(ch->fd, F_GETFL);
	ok(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "the fd made non-blocking");
	errno = 0;
	ok(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN,
	   "rdma_get_cm_event on a non-blocking, empty channel: EAGAIN");
	ok(fcntl(ch->fd, F_SETFL, flags) == 0, "the fd blocking again");

	/* Of two IDs' waiting events, destroying one leaves exactly the other. */
	id = resolving(ch);
	id2 = resolving(ch);
	ok(readable(ch, 5000), "their events wait");
	ok(rdma_destroy_id(id) == 0, "rdma_destroy_id of the first of two");
	ok(rdma_get_cm_event(ch, &ev) == 0 && ev->id == id2, "the other ID's event is handed out");
	rdma_ack_cm_event(ev);
	ok(!readable(ch, 0), "and nothing else waits");

	/* A thread waiting gets an event that comes later. */
	memset(&w, 0, sizeof(w));
	w.ch = ch;
	ok(pthread_create(&t, NULL, wait_one, &w) == 0, "a thread waits in rdma_get_cm_event");
	usleep(200000);
	ok(!w.got, "with nothing queued it waits");
	ok(rdma_destroy_id(id2) == 0, "rdma_destroy_id while the thread waits");
	usleep(200000);
	ok(!w.got, "an ID destroyed under a waiting thread does not wake it");
	id = resolving(ch);
	for (i = 0; i < 250 && !w.got; i++)
		usleep(20000);
	ok(w.got && w.rc == 0 && w.id == id && w.event == RDMA_CM_EVENT_ADDR_RESOLVED,
	   "the waiting thread gets the new ID's ADDR_RESOLVED");
	pthread_join(t, NULL);

	/* rping's exit: the event thread still waits when main destroys everything. */
	memset(&w, 0, sizeof(w));
	w.ch = ch;
	ok(pthread_create(&t, NULL, wait_one, &w) == 0, "a thread waits again");
	usleep(200000);
	ok(rdma_destroy_id(id) == 0, "rdma_destroy_id of the last ID");
	rdma_destroy_event_channel(ch);
	usleep(300000);
	ok(!w.got, "the channel destroyed under the waiting thread: it goes on waiting, no error");

	/* The event thread back after main's teardown. */
	{
		static struct late l;
		pthread_t lt;
		struct rdma_cm_id *lid;
		l.ch = rdma_create_event_channel();
		ok(l.ch != NULL, "another channel");
		lid = resolving(l.ch);
		ok(pthread_create(&lt, NULL, read_then_come_back, &l) == 0, "an event thread");
		for (i = 0; i < 250 && !l.read_one; i++)
			usleep(20000);
		ok(l.read_one, "the event thread read the ID's event");
		ok(rdma_destroy_id(lid) == 0, "rdma_destroy_id");
		rdma_destroy_event_channel(l.ch);
		l.destroyed = 1;
		usleep(300000);
		ok(!l.returned, "the event thread, back after the channel went, waits: no error");
	}
	errno = 0;
	ok(rdma_get_cm_event(ch, &ev) == -1 && errno == EINVAL,
	   "rdma_get_cm_event on the destroyed channel: EINVAL");
	printf("%d passed, 0 failed\n", n_checks);
	/* The waiting thread ends with the process, as rping's does. */
	return 0;
}

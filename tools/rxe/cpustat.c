/*
 * cpustat: the sampler of `tools/rxe-interop --bench`, run inside the VMs.
 *
 *   cpustat IFACE INTERVAL_MS
 *
 * Every INTERVAL_MS until it is signalled, one line:
 *
 *   t busy idle ctxt rx_packets rx_bytes tx_packets tx_bytes user system softirq
 *
 * t: CLOCK_MONOTONIC seconds; busy: user + nice + system + irq + softirq + steal jiffies
 * of the VM (all CPUs) from /proc/stat, idle: idle + iowait; ctxt: context switches since
 * boot; the rest: IFACE's counters from /sys/class/net/IFACE/statistics (virtio-net counts
 * every frame it receives, also those XDP redirects to an AF_XDP socket); then busy split
 * into user + nice, system, and irq + softirq jiffies (where a program's own code, its
 * system calls, and the kernel's receive path and rxe run).
 *
 * rxe does its work in the kernel's softirqs and tasklets, roce-xdp in its engine's
 * threads: whole-VM jiffies count both the same way. The host takes the window that
 * carried the middle 90% of a step's bytes and divides the busy time in it by the bytes.
 * A shell loop would fork or read /proc/stat byte by byte under TCG and cost the VM
 * more than rxe's whole receive path; this costs one short read per file per sample.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 16];

/* The whole of a small file into buf (NUL-terminated); its length, or -1. */
static long slurp(const char *path)
{
	int fd = open(path, O_RDONLY);
	long n = 0, r;
	if (fd < 0)
		return -1;
	while (n < (long)sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
		n += r;
	close(fd);
	buf[n] = 0;
	return n;
}

static unsigned long long counter(const char *ifc, const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/%s", ifc, name);
	if (slurp(path) < 0)
		return 0;
	return strtoull(buf, NULL, 10);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: cpustat IFACE INTERVAL_MS\n");
		return 2;
	}
	const char *ifc = argv[1];
	int ms = atoi(argv[2]);
	if (ms <= 0)
		ms = 100;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (;;) {
		struct timespec ts;
		unsigned long long v[10] = {0}, ctxt = 0;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		if (slurp("/proc/stat") < 0) {
			perror("/proc/stat");
			return 1;
		}
		sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
		       &v[4], &v[5], &v[6], &v[7]);
		char *c = strstr(buf, "\nctxt ");
		if (c)
			ctxt = strtoull(c + 6, NULL, 10);
		unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
		unsigned long long idle = v[3] + v[4];
		printf("%ld.%03ld %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n",
		       (long)ts.tv_sec, ts.tv_nsec / 1000000, busy, idle, ctxt,
		       counter(ifc, "rx_packets"), counter(ifc, "rx_bytes"), counter(ifc, "tx_packets"),
		       counter(ifc, "tx_bytes"), v[0] + v[1], v[2], v[5] + v[6]);
		struct timespec d = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
		nanosleep(&d, NULL);
	}
}

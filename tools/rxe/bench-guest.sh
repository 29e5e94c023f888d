# The guest half of `tools/rxe-interop --bench` (tools/rxe/bench.sh puts this first in
# the script each VM gets through fw_cfg, then that VM's step lines). A step waits for
# "go ID" on the console, runs its perftest command with cpustat sampling the VM beside
# it, and prints the tool's output ("RXI-OUT ID:"), the samples ("RXI-S ID:") and
# "RXI: END ID rc=N". With BPERF set (ROCE_RXE_BENCH_PERF), perf samples the whole
# VM during write_bw steps and its reports come back as "RXI-P ID:". A server says
# "RXI: LISTENING ID" once its TCP port is open, so the host starts the client only
# then (perftest's client connects once).
stty -echo 2>/dev/null
gate() {
    while read -r line; do
        [ "$line" = "go $1" ] && return 0
        [ "$line" = quit ] && exit 0
    done
    exit 1
}
# rxe_for COMMAND: rdma_rxe opens its UDP socket on port 4791 when it loads and holds it
# until it unloads, so a roce-xdp step on the UDP link (`--link udp`) runs with the
# module unloaded; any other step gets it back with rxe0 on eth0, as /init made it.
rxe_for() {
    case "$1" in
        *"--link udp"*)
            if grep -q '^rdma_rxe ' /proc/modules; then
                rdma link delete rxe0 2>/dev/null
                rmmod rdma_rxe || echo "RXI: rmmod rdma_rxe failed"
            fi ;;
        *)
            if ! grep -q '^rdma_rxe ' /proc/modules; then
                if ! insmod "/lib/modules/$(grep rdma_rxe /etc/modules.order)" \
                    || ! rdma link add rxe0 type rxe netdev eth0; then
                    echo "RXI: rdma_rxe back failed"
                fi
            fi ;;
    esac
}
# bstep ID server|client PORT TIMEOUT COMMAND
bstep() {
    id=$1 role=$2 port=$3 tmo=$4
    shift 4
    gate "$id"
    rxe_for "$*"
    echo "RXI: BEGIN $id"
    cpustat eth0 100 > /tmp/samples 2>&1 &
    sp=$!
    pp=
    case "$*" in
        *ib_write_bw*)
            if [ -n "${BPERF:-}" ]; then
                perf record -a -g -F 499 -q -o /tmp/perf.data > /tmp/perf.log 2>&1 &
                pp=$!
            fi ;;
    esac
    timeout "$tmo" sh -c "$*" > /tmp/out 2>&1 &
    pid=$!
    if [ "$role" = server ]; then
        i=0
        while [ $i -lt 1200 ] && kill -0 "$pid" 2>/dev/null \
            && ! netstat -ltn 2>/dev/null | grep -q ":$port "; do
            sleep 0.05
            i=$((i + 1))
        done
        echo "RXI: LISTENING $id"
    fi
    wait "$pid"
    rc=$?
    kill "$sp" 2>/dev/null
    wait "$sp" 2>/dev/null
    if [ -n "$pp" ]; then
        kill -INT "$pp" 2>/dev/null
        wait "$pp" 2>/dev/null
        { perf report -i /tmp/perf.data --stdio --no-children --sort comm,dso,sym \
              --percent-limit 0.3 -g none 2>&1 | grep -v '^#' | grep -v '^ *$' | head -80
          perf report -i /tmp/perf.data --stdio --no-children --sort dso \
              --percent-limit 0.3 -g none 2>&1 | grep -v '^#' | grep -v '^ *$' | head -20
          perf report -i /tmp/perf.data --stdio --no-children --sort sym \
              --dsos '[kernel.kallsyms]' --percent-limit 1 -g callee,0.5,2 2>&1 | grep -v '^#' | grep -v '^ *$' | head -300
          tail -3 /tmp/perf.log; } | sed "s/^/RXI-P $id: /"
        rm -f /tmp/perf.data
    fi
    sed "s/^/RXI-OUT $id: /" /tmp/out
    sed "s/^/RXI-S $id: /" /tmp/samples
    echo "RXI: END $id rc=$rc"
}

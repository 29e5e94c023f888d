# The guest half of `tools/rxe-interop --bench` (tools/rxe/bench.sh puts this first in
# the script each VM gets through fw_cfg, then that VM's step lines). A step waits for
# "go ID" on the console, runs its perftest command with cpustat sampling the VM beside
# it, and prints the tool's output ("RXI-OUT ID:"), the samples ("RXI-S ID:") and
# "RXI: END ID rc=N". A server says "RXI: LISTENING ID" once its TCP port is open, so
# the host starts the client only then (perftest's client connects once).
stty -echo 2>/dev/null
gate() {
    while read -r line; do
        [ "$line" = "go $1" ] && return 0
        [ "$line" = quit ] && exit 0
    done
    exit 1
}
# bstep ID server|client PORT TIMEOUT COMMAND
bstep() {
    id=$1 role=$2 port=$3 tmo=$4
    shift 4
    gate "$id"
    echo "RXI: BEGIN $id"
    cpustat eth0 100 > /tmp/samples 2>&1 &
    sp=$!
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
    sed "s/^/RXI-OUT $id: /" /tmp/out
    sed "s/^/RXI-S $id: /" /tmp/samples
    echo "RXI: END $id rc=$rc"
}

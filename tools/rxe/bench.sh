# `tools/rxe-interop --bench`: roce-xdp against rxe on the same emulated hardware,
# sourced by tools/rxe-interop once the image and roce-xdp are built.
#
# Two VMs of the rxe image (qemu TCG, one vCPU each, Debian's kernel, virtio-net on a
# bridge) carry rxe0 and, from a second initramfs archive appended to the image's,
# roce-xdp and its verbs library. Debian's unmodified ib_write_bw and ib_write_lat run
# in both VMs, on rxe or under `roce-xdp run` (AF_XDP in copy mode on virtio-net), in
# four pairings: rxe <-> rxe, roce-xdp <-> roce-xdp, roce-xdp receiving from rxe, and
# roce-xdp sending to rxe. VM 1 is always perftest's server, so it receives the WRITEs
# of write_bw. Rounds interleave the pairings (each round starts one pairing later) in
# the same boot pair, because TCG runs drift by tens of percent between boots.
#
# Per step, cpustat (tools/rxe/cpustat.c) samples each VM every 100 ms: busy jiffies
# (split into user, system and irq + softirq), context switches and eth0's counters. A VM's CPU per GB is its busy time in the
# window that carried the middle 90% of the bytes it received (VM 1) or sent (VM 2),
# over those bytes, so setup, teardown and waiting for the peer are left out.
#
# Printed: each pairing's medians (min-max) and each ratio to rxe <-> rxe measured in
# the same round, median (min-max) of the rounds, beside the target of issue 11.
# IB MTU 1024 only: the guest kernel's virtio-net has no multi-buffer XDP, which MTU
# 4096 frames need. ROCE_RXE_BENCH_RUN adds options to every `roce-xdp run` (to compare
# modes in the same image: "--caller-rounds off", "--busy-poll", "--link udp"; a step on
# the UDP link runs with rdma_rxe unloaded in its VM, since rxe holds UDP port 4791).
# ROCE_RXE_BENCH_PERF=1 puts the host's perf into the VMs and profiles both of them
# (all CPUs, call graphs, 499 Hz) through every write_bw step: the report of each goes to
# $OUT/perf-ID-PAIRING-vmN.txt (use --keep). It slows the VMs: its figures are not
# the bench's.

BENCH_ROUNDS=${BENCH_ROUNDS:-3}
BENCH_PIDS=
bench_conf_label() {
    case "$1" in
        rxe-rxe) echo "rxe <-> rxe" ;;
        xdp-xdp) echo "roce-xdp <-> roce-xdp" ;;
        xdp-recv) echo "roce-xdp server <- rxe client" ;;
        xdp-send) echo "rxe server <- roce-xdp client" ;;
    esac
}
BENCH_CONFS="rxe-rxe xdp-xdp xdp-recv xdp-send"

# The image's initramfs with roce-xdp, its verbs library and cpustat appended as a
# second archive (the kernel unpacks concatenated archives in order).
bench_initrd() {
    local lib root=$OUT/bench-root
    lib=${ROCE_XDP_LIB:-$(dirname "$BIN")/libroce_xdp.so}
    [ -s "$lib" ] || { echo "rxe-interop: FAIL: no verbs library at $lib" >&2; return 1; }
    rm -rf "$root"
    mkdir -p "$root/usr/bin" "$root/lib/roce-xdp"
    install -m 0755 "$BIN" "$root/usr/bin/roce-xdp"
    # roce-xdp finds it in ../lib/roce-xdp of its binary (/usr/lib is /lib here).
    install -m 0755 "$lib" "$root/lib/roce-xdp/libroce_xdp.so"
    if [ -n "${ROCE_RXE_BENCH_PERF:-}" ]; then
        # The host's perf (Debian 12's linux-perf: the guest's kernel series) and the
        # libraries it loads, beside the image's own (the same Debian release).
        local perf l
        perf=$(command -v perf) || { echo "rxe-interop: FAIL: ROCE_RXE_BENCH_PERF needs perf (linux-perf)" >&2; return 1; }
        install -m 0755 "$perf" "$root/usr/bin/perf"
        for l in $(ldd "$perf" | awk '/=> \// { print $3 }'); do
            install -D -m 0755 "$(readlink -f "$l")" "$root/lib/x86_64-linux-gnu/$(basename "$l")"
        done
    fi
    ( cd "$root" && find . | LC_ALL=C sort | "$IMG/busybox" cpio -o -H newc 2>/dev/null ) \
        | gzip -1 > "$OUT/bench-extra.cpio.gz"
    cat "$IMG/initrd.img" "$OUT/bench-extra.cpio.gz" > "$OUT/bench-initrd.img"
}

bench_net_up() {
    ip netns add "$LAB"
    ip -n "$LAB" link set lo up
    ip -n "$LAB" link add br0 type bridge
    local d
    for d in tap0 tap1; do
        ip -n "$LAB" tuntap add dev "$d" mode tap
    done
    for d in br0 tap0 tap1; do
        ip netns exec "$LAB" sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1"
    done
    ip -n "$LAB" link set br0 up
    ip -n "$LAB" link set tap0 master br0 up
    ip -n "$LAB" link set tap1 master br0 up
}

# bench_plan: ID|ROUND|CONF|TEST|SERVER_COMMAND|CLIENT_COMMAND, one step per line.
bench_plan() {
    local nbw=1000 nlat=1000 r c i k id=0 confs
    [ "$QUICK" = 1 ] && nbw=200 nlat=200
    read -r -a confs <<< "$BENCH_CONFS"
    for r in $(seq 1 "$BENCH_ROUNDS"); do
        for i in 0 1 2 3; do
            c=${confs[$(( (i + r - 1) % 4 ))]}
            for t in write_bw write_lat; do
                id=$((id + 1))
                local a="-x 1 -F -m 1024 -p $((18800 + id))"
                if [ "$t" = write_bw ]; then a="$a -s 65536 -n $nbw --report_gbits"; else a="$a -s 64 -n $nlat"; fi
                local srv=rxe cli=rxe
                case "$c" in xdp-xdp) srv=xdp cli=xdp ;; xdp-recv) srv=xdp ;; xdp-send) cli=xdp ;; esac
                k="ib_$t"
                local sc cc
                local run="roce-xdp run ${ROCE_RXE_BENCH_RUN:-}"
                sc=$([ $srv = xdp ] && echo "$run -- $k -d rxdp_eth0 $a" || echo "$k -d rxe0 $a")
                cc=$([ $cli = xdp ] && echo "$run -- $k -d rxdp_eth0 $a 198.18.0.1" || echo "$k -d rxe0 $a 198.18.0.1")
                echo "$id|$r|$c|$t|$sc|$cc"
            done
        done
    done
}

bench_guest() {   # bench_guest server|client < plan
    [ -n "${ROCE_RXE_BENCH_PERF:-}" ] && echo "BPERF=1"
    cat "$HERE/rxe/bench-guest.sh"
    local id r c t sc cc cmd
    while IFS='|' read -r id r c t sc cc; do
        cmd=$([ "$1" = server ] && echo "$sc" || echo "$cc")
        echo "bstep $id $1 $((18800 + id)) 150 '$cmd'"
    done
}

bench_boot() {   # bench_boot N IP TAP MAC SCRIPT LOG
    ip netns exec "$LAB" timeout --signal=TERM --kill-after=5 1800 \
        qemu-system-x86_64 -nodefaults -no-user-config -accel tcg -cpu max -smp 1 -m 768 \
        -display none -monitor none -serial stdio -no-reboot \
        -kernel "$IMG/vmlinuz" -initrd "$OUT/bench-initrd.img" \
        -append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off rxi.ip=$2/24 rxi.mtu=1500" \
        -netdev tap,id=n0,ifname="$3",script=no,downscript=no \
        -device virtio-net-pci,netdev=n0,mac="$4",romfile= \
        -fw_cfg name=opt/rxi/script,file="$5" \
        < "$OUT/vm$1.ctl" > "$6" 2>&1 &
}

bwait() {   # bwait LOG PATTERN SECONDS [PID]: until LOG has a line matching PATTERN
    # (1 when SECONDS pass first, or when process PID, the VM that writes LOG, ends)
    local end=$(( $(date +%s) + $3 ))
    until grep -q "$2" "$1" 2>/dev/null; do
        [ "$(date +%s)" -lt "$end" ] || return 1
        [ -z "${4:-}" ] || kill -0 "$4" 2>/dev/null || return 1
        sleep 0.1
    done
}

bench_pid() { echo "$BENCH_PIDS" | cut -d' ' -f"$1"; }   # VM $1's process

# Why VM $1 (its log $2) is gone, or nothing while it runs. The VMs boot with panic=-1
# and -no-reboot, so a guest kernel panic ends qemu (rxe in Debian's 6.12.118 did, in
# its own receive path, during an rxe <-> rxe write_bw: ROCE_RXE_KPKG).
bench_gone() {
    local pid
    pid=$(bench_pid "$1")
    [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null || return 0
    if grep -q "Kernel panic" "$2"; then
        echo "VM $1's kernel panicked ($(grep -m1 -o 'RIP: [^ ]*' "$2" || echo 'no RIP'); $2)"
    else
        echo "VM $1 is gone ($2)"
    fi
}

# The lines step $2 printed with prefix $3 on console $1.
bench_lines() { sed -n "s/^$3 $2: //p" "$1" | tr -d '\r'; }

# The window of samples that carried the middle 90% of column $1's bytes (6: rx, 8: tx):
# "busy_seconds window_seconds bytes ctxt fraction_of_all_bytes user% system% softirq%"
# (the last three: shares of the busy time).
bench_window() {
    awk -v c="$1" '
        NF == 11 { n++; t[n] = $1; b[n] = $2; x[n] = $4; v[n] = $c; u[n] = $9; s[n] = $10; q[n] = $11 }
        END {
            if (n < 2) { print "0 0 0 0 0 0 0 0"; exit }
            tot = v[n] - v[1]
            if (tot <= 0) { print "0 0 0 0 0 0 0 0"; exit }
            for (i = 1; i <= n; i++) if (v[i] - v[1] >= 0.05 * tot) { a = i; break }
            for (i = 1; i <= n; i++) if (v[i] - v[1] >= 0.95 * tot) { e = i; break }
            if (e <= a) { a = 1; e = n }
            bb = b[e] - b[a]; d = bb > 0 ? bb : 1
            printf "%.2f %.2f %d %d %.3f %.0f %.0f %.0f\n", bb / 100, t[e] - t[a], v[e] - v[a], x[e] - x[a], (v[e] - v[a]) / tot,
                100 * (u[e] - u[a]) / d, 100 * (s[e] - s[a]) / d, 100 * (q[e] - q[a]) / d
        }'
}

# One step's figures into $OUT/bench.tsv:
# round conf test value(Gbit/s or us) p99(us or -) cpu1_s_per_gb cpu2_s_per_gb util1 util2 ctx1 ctx2
# split1 split2 (user/system/softirq percent of the busy time, VM 1 and VM 2)
bench_record() {
    local id=$1 r=$2 c=$3 t=$4 n=$5 out1 out2 v p99=- w1 w2
    out1=$(bench_lines "$OUT/vm1.log" "$id" RXI-OUT)
    out2=$(bench_lines "$OUT/vm2.log" "$id" RXI-OUT)
    if [ "$t" = write_bw ]; then
        # "#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]"
        v=$(echo "$out2" | awk '$1 == 65536 && NF >= 5 { print $4 }' | tail -1)
    else
        # "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (usec)
        v=$(echo "$out2" | awk '$1 == 64 && NF >= 8 { print $5 }' | tail -1)
        p99=$(echo "$out2" | awk '$1 == 64 && NF >= 8 { print $8 }' | tail -1)
    fi
    w1=$(bench_lines "$OUT/vm1.log" "$id" RXI-S | bench_window 6)
    w2=$(bench_lines "$OUT/vm2.log" "$id" RXI-S | bench_window 8)
    awk -v r="$r" -v c="$c" -v t="$t" -v v="${v:-}" -v p="$p99" -v n="$n" -v w1="$w1" -v w2="$w2" 'BEGIN {
        split(w1, a, " "); split(w2, b, " ")
        cpu1 = a[3] > 0 ? a[1] / (a[3] / 1e9) : -1; cpu2 = b[3] > 0 ? b[1] / (b[3] / 1e9) : -1
        u1 = a[2] > 0 ? a[1] / a[2] : -1; u2 = b[2] > 0 ? b[1] / b[2] : -1
        # context switches per iteration: those of the window over its share of the run
        x1 = a[5] > 0 ? a[4] / (n * a[5]) : -1; x2 = b[5] > 0 ? b[4] / (n * b[5]) : -1
        printf "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%s/%s/%s\t%s/%s/%s\n", r, c, t, (v == "" ? "-" : v), p,
            cpu1, cpu2, u1, u2, x1, x2, a[6], a[7], a[8], b[6], b[7], b[8]
    }' >> "$OUT/bench.tsv"
    [ -n "$v" ]
}

bench_step() {   # bench_step ID ROUND CONF TEST
    local id=$1 why= p1 p2
    p1=$(bench_pid 1) p2=$(bench_pid 2)
    echo "go $id" 2>/dev/null >&7
    bwait "$OUT/vm1.log" "RXI: LISTENING $id\b" 90 "$p1" || why="VM 1's server did not listen"
    echo "go $id" 2>/dev/null >&8
    bwait "$OUT/vm2.log" "RXI: END $id " 170 "$p2" || why="${why:+$why; }VM 2's client did not end"
    bwait "$OUT/vm1.log" "RXI: END $id " 20 "$p1" || why="${why:+$why; }VM 1's server did not end"
    local rc1 rc2 n
    rc1=$(grep -o "RXI: END $id rc=[0-9]*" "$OUT/vm1.log" | sed 's/.*rc=//') || true
    rc2=$(grep -o "RXI: END $id rc=[0-9]*" "$OUT/vm2.log" | sed 's/.*rc=//') || true
    [ "${rc1:-x}" = 0 ] || why="${why:+$why; }server exit ${rc1:-none}"
    [ "${rc2:-x}" = 0 ] || why="${why:+$why; }client exit ${rc2:-none}"
    n=$([ "$QUICK" = 1 ] && echo 200 || echo 1000)
    if [ -z "$why" ] && ! bench_record "$id" "$2" "$3" "$4" "$n"; then
        why="no result line in the client's output"
    fi
    if [ -n "$why" ]; then
        FAILED=1
        echo "  step $id ($(bench_conf_label "$3"), $4, round $2) FAIL: $why" >&2
        { echo "FAIL step $id ($(bench_conf_label "$3"), $4, round $2): $why"
          bench_lines "$OUT/vm1.log" "$id" RXI-OUT | tail -5 | sed 's/^/  VM 1: /'
          bench_lines "$OUT/vm2.log" "$id" RXI-OUT | tail -5 | sed 's/^/  VM 2: /'
        } >> "$OUT/failures.log"
    else
        echo "  step $id: round $2, $(bench_conf_label "$3"), $4: $(tail -1 "$OUT/bench.tsv" | cut -f4)"
    fi
    local ok=$([ -z "$why" ] && echo 0 || echo 1)
    if [ -n "${ROCE_RXE_BENCH_PERF:-}" ] && [ "$4" = write_bw ]; then
        local vm
        for vm in 1 2; do
            bench_lines "$OUT/vm$vm.log" "$id" RXI-P > "$OUT/perf-$id-$3-vm$vm.txt"
        done
        echo "    perf: $OUT/perf-$id-$3-vm1.txt (server) and -vm2.txt (client)"
    fi
    return "$ok"
}

# median (min-max) of the numbers on stdin, or "-"
bench_med() {
    sort -g | awk '$1 >= 0 { v[++n] = $1 } END {
        if (!n) { print "-"; exit }
        m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        if (n == 1) print f(m); else print f(m) " (" f(v[1]) "-" f(v[n]) ")" }
        function f(x) { return x >= 100 ? sprintf("%.0f", x) : sprintf("%.3g", x) }'
}
# column $3 of the rows of pairing $1, test $2
bench_col() { awk -F'\t' -v c="$1" -v t="$2" -v k="$3" '$2 == c && $3 == t && $k != "-" { print $k }' "$OUT/bench.tsv"; }
# the user/system/softirq split (column $2) of pairing $1's write_bw, median of each part
bench_split() {
    local i out=
    for i in 1 2 3; do
        out="$out${out:+/}$(bench_col "$1" write_bw "$2" | cut -d/ -f"$i" | bench_med | cut -d' ' -f1)"
    done
    echo "$out"
}
# per round: column $4 of pairing $1 over the same of pairing $2, test $3
bench_ratio() {
    awk -F'\t' -v a="$1" -v b="$2" -v t="$3" -v k="$4" '
        $3 == t && $k != "-" && $k >= 0 { if ($2 == a) x[$1] = $k; if ($2 == b) y[$1] = $k }
        END { for (r in x) if ((r in y) && y[r] > 0) print x[r] / y[r] }' "$OUT/bench.tsv"
}

bench_report() {
    local c
    echo
    echo "rxe-interop --bench: IB MTU 1024, $BENCH_ROUNDS round(s), two TCG VMs of one vCPU each;"
    echo "medians (min-max) of the rounds. CPU: busy seconds of the VM per GB it received"
    echo "(server, VM 1) or sent (client, VM 2) in write_bw; util: busy share of the vCPU."
    printf '\n%-32s %-20s %-18s %-18s %-16s %-16s\n' pairing "write_bw Gbit/s" "recv CPU s/GB" "send CPU s/GB" "recv util" "send util"
    for c in $BENCH_CONFS; do
        printf '%-32s %-20s %-18s %-18s %-16s %-16s\n' "$(bench_conf_label "$c")" \
            "$(bench_col "$c" write_bw 4 | bench_med)" "$(bench_col "$c" write_bw 6 | bench_med)" \
            "$(bench_col "$c" write_bw 7 | bench_med)" "$(bench_col "$c" write_bw 8 | bench_med)" \
            "$(bench_col "$c" write_bw 9 | bench_med)"
    done
    printf '\n%-32s %-34s %-34s\n' pairing "write_bw receiver: user/sys/softirq %" "sender: user/sys/softirq %"
    for c in $BENCH_CONFS; do
        printf '%-32s %-34s %-34s\n' "$(bench_conf_label "$c")" \
            "$(bench_split "$c" 12)" "$(bench_split "$c" 13)"
    done
    printf '\n%-32s %-20s %-18s %-18s %-16s\n' pairing "write_lat 64 B us" "p99 us" "ctx/iter server" "ctx/iter client"
    for c in $BENCH_CONFS; do
        printf '%-32s %-20s %-18s %-18s %-16s\n' "$(bench_conf_label "$c")" \
            "$(bench_col "$c" write_lat 4 | bench_med)" "$(bench_col "$c" write_lat 5 | bench_med)" \
            "$(bench_col "$c" write_lat 10 | bench_med)" "$(bench_col "$c" write_lat 11 | bench_med)"
    done
    echo
    echo "ratios to rxe <-> rxe in the same round (median, min-max):"
    local line name a t k want v m ok
    while IFS='|' read -r name a t k want; do
        v=$(bench_ratio "$a" rxe-rxe "$t" "$k" | bench_med)
        m=${v%% *}
        ok=$(awk -v m="$m" -v w="$want" 'BEGIN {
            if (m == "-") { print "no figure"; exit }
            op = substr(w, 1, 2); x = substr(w, 4) + 0
            print ((op == ">=" ? m >= x : m <= x) ? "met" : "not met") }')
        printf '  %-62s %-20s target %-6s %s\n' "$name" "$v" "$want" "$ok"
        echo "$name|$v|$want|$ok" >> "$OUT/bench.ratios"
    done <<'EOF'
write_bw, roce-xdp sending (rxe server <- roce-xdp client)|xdp-send|write_bw|4|>= 2
write_bw, roce-xdp receiving (roce-xdp server <- rxe client)|xdp-recv|write_bw|4|>= 2
write_bw, roce-xdp <-> roce-xdp|xdp-xdp|write_bw|4|>= 2
receiver CPU per GB, roce-xdp <-> roce-xdp|xdp-xdp|write_bw|6|<= 2
write_lat median, roce-xdp <-> roce-xdp|xdp-xdp|write_lat|4|<= 1
EOF
}

bench_json() {
    local f=$1 first=1 name v want ok
    {
        printf '{"bench":"rxe-interop","ib_mtu":1024,"rounds":%s,"steps":[' "$BENCH_ROUNDS"
        awk -F'\t' 'BEGIN { s = "" } {
            printf "%s{\"round\":%s,\"pairing\":\"%s\",\"test\":\"%s\",\"value\":%s,\"p99_us\":%s,\"recv_cpu_s_per_gb\":%s,\"send_cpu_s_per_gb\":%s,\"recv_util\":%s,\"send_util\":%s,\"ctx_per_iter_server\":%s,\"ctx_per_iter_client\":%s,\"server_user_sys_softirq_pct\":\"%s\",\"client_user_sys_softirq_pct\":\"%s\"}",
                s, $1, $2, $3, ($4 == "-" ? "null" : $4), ($5 == "-" ? "null" : $5), $6, $7, $8, $9, $10, $11, $12, $13; s = "," }' "$OUT/bench.tsv"
        printf '],"ratios":['
        while IFS='|' read -r name v want ok; do
            [ $first = 1 ] || printf ','
            first=0
            printf '{"name":"%s","median":%s,"spread":"%s","target":"%s","verdict":"%s"}' \
                "$name" "$(echo "${v%% *}" | sed 's/^-$/null/')" "$v" "$want" "$ok"
        done < "$OUT/bench.ratios"
        printf ']}\n'
    } > "$f"
}

bench_main() {
    bench_initrd
    bench_plan > "$OUT/bench-plan.txt"
    bench_guest server < "$OUT/bench-plan.txt" > "$OUT/vm1.sh"
    bench_guest client < "$OUT/bench-plan.txt" > "$OUT/vm2.sh"
    : > "$OUT/bench.tsv"
    : > "$OUT/bench.ratios"
    bench_net_up
    rm -f "$OUT/vm1.ctl" "$OUT/vm2.ctl"
    mkfifo "$OUT/vm1.ctl" "$OUT/vm2.ctl"
    bench_boot 1 198.18.0.1 tap0 52:54:00:12:34:01 "$OUT/vm1.sh" "$OUT/vm1.log"
    BENCH_PIDS=$!
    exec 7> "$OUT/vm1.ctl"
    bench_boot 2 198.18.0.2 tap1 52:54:00:12:34:02 "$OUT/vm2.sh" "$OUT/vm2.log"
    BENCH_PIDS="$BENCH_PIDS $!"
    exec 8> "$OUT/vm2.ctl"
    if ! bwait "$OUT/vm1.log" "RXI: READY" 120 || ! bwait "$OUT/vm2.log" "RXI: READY" 120; then
        echo "rxe-interop: FAIL: the VMs did not come up: $OUT/vm1.log $OUT/vm2.log" >&2
        FAILED=1
        return 1
    fi
    echo "rxe-interop --bench: $(grep -o 'RXI: READY.*' "$OUT/vm1.log" | cut -c12-)"
    local id r c t sc cc gone g2
    while IFS='|' read -r id r c t sc cc; do
        bench_step "$id" "$r" "$c" "$t" && continue
        # A VM ends by itself only after its last step (its script done), so one gone
        # at a failed step is one that died.
        gone=$(bench_gone 1 "$OUT/vm1.log")
        g2=$(bench_gone 2 "$OUT/vm2.log")
        gone="$gone${gone:+${g2:+; }}$g2"
        if [ -n "$gone" ]; then
            # The steps left would each wait out their timeouts for nobody.
            echo "rxe-interop --bench: FAIL: $gone; the steps after $id are not run" >&2
            FAILED=1
            # The other VM would wait out its step's timeout before it took "quit".
            kill $BENCH_PIDS 2>/dev/null || true
            break
        fi
    done < "$OUT/bench-plan.txt"
    echo quit >&7 2>/dev/null || true
    echo quit >&8 2>/dev/null || true
    bwait "$OUT/vm1.log" "RXI: SCRIPT" 30 "$(bench_pid 1)" || true
    bwait "$OUT/vm2.log" "RXI: SCRIPT" 30 "$(bench_pid 2)" || true
    { exec 7>&- 8>&-; } 2>/dev/null || true
    local p
    for p in $BENCH_PIDS; do wait "$p" 2>/dev/null || true; done
    BENCH_PIDS=
    bench_report
    [ -n "${BENCH_JSON:-}" ] && bench_json "$BENCH_JSON"
    if [ -s "$OUT/failures.log" ]; then echo; cat "$OUT/failures.log"; fi
    # Every step must have given its figure and every ratio must be computed: the
    # table is then well formed (targets are reported, not enforced).
    if grep -q '|no figure$' "$OUT/bench.ratios"; then FAILED=1; fi
    echo "rxe-interop --bench: $([ "$FAILED" = 0 ] && echo PASS || echo FAIL) in $(( $(date +%s) - T_START )) s"
    return "$FAILED"
}

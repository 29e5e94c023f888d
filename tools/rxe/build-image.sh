#!/usr/bin/env bash
# Builds the rxe VM image for tools/rxe-interop: Debian's stock kernel with rdma_rxe and
# rdma-core's unmodified tools (ibverbs-utils, perftest, rdmacm-utils), plus our verbs
# probe (tools/rxe/probe.c, compiled here against libibverbs-dev), in a small initramfs.
#
# Everything comes from Debian packages: `apt-get download` + `dpkg -x`, never installed
# on the host (the probe's compiler and headers are host packages installed by
# tools/setup.sh). The image is cached, keyed by the kernel package version and a hash
# of this script, the guest init and the probe source; a change of any rebuilds it.
#
#   tools/rxe/build-image.sh            prints the image directory on the last line
#   ROCE_RXE_CACHE=dir                  where images and downloads live
#                                       (default /var/cache/roce-xdp-rxe)
#   ROCE_RXE_KPKG=linux-image-...       another of Debian 12's kernel packages than the
#                                       one linux-image-amd64 points to, e.g.
#                                       linux-image-6.12.118+deb12-amd64-unsigned: rxe as
#                                       newer kernels have it (work queues, not tasklets)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${ROCE_RXE_CACHE:-/var/cache/roce-xdp-rxe}
export PATH=$PATH:/usr/sbin:/sbin
mkdir -p "$CACHE/debs"

log() { echo "build-image: $*" >&2; }

# The kernel package linux-image-amd64 points to, and its version.
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
KPKG=${ROCE_RXE_KPKG:-$(kpkg)}
if [ -z "$KPKG" ]; then
    log "no package lists: apt-get update"
    apt-get update -qq
    KPKG=$(kpkg)
fi
[ -n "$KPKG" ] || { log "cannot find Debian's kernel package (linux-image-amd64)"; exit 1; }
KVERSION=$(apt-cache policy "$KPKG" | awk '/Candidate:/{print $2}')
INPUTS=$(cat "$0" "$HERE/init" "$HERE/probe.c" "$HERE/cpustat.c" | sha256sum | cut -c1-12)
KEY="${KPKG}_${KVERSION}_${INPUTS}"
IMG=$CACHE/$KEY
if [ -s "$IMG/initrd.img" ] && [ -s "$IMG/vmlinuz" ]; then
    log "cached: $IMG"
    echo "$IMG"
    exit 0
fi
t0=$(date +%s)
log "building $KEY"

PKGS=(
    "$KPKG" busybox-static iproute2
    libibverbs1 ibverbs-providers ibverbs-utils perftest rdmacm-utils librdmacm1
    libnl-3-200 libnl-route-3-200 libibumad3 libpci3 libudev1 zlib1g libgcc-s1
    libbpf1 libelf1 libmnl0 libcap2 libdb5.3 libselinux1 libpcre2-8-0 libtirpc3
    libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
    libzstd1 liblzma5 libc6
)
( cd "$CACHE/debs" && apt-get download "${PKGS[@]}" 2>&1 | grep -v 'unsandboxed' >&2 || true )
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/stage
ROOT=$WORK/root
mkdir -p "$STAGE"
for p in "${PKGS[@]}"; do
    f=$(ls "$CACHE"/debs/"${p}"_*.deb 2>/dev/null | sort -V | tail -1)
    [ -n "$f" ] || { log "download of $p failed"; exit 1; }
    dpkg -x "$f" "$STAGE"
done
KVER=$(ls "$STAGE/lib/modules" | head -1)
depmod -b "$STAGE" "$KVER"

mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,root,lib/modules,lib64}
ln -s ../lib "$ROOT/usr/lib"
cp "$STAGE/bin/busybox" "$ROOT/bin/busybox"
for a in $("$ROOT/bin/busybox" --list); do
    [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"
done

# Kernel modules in load order: each module after the modules it depends on
# (modules.dep lists a module's dependencies; the last one must be loaded first).
# crc32_generic is named explicitly: rdma_rxe asks the crypto API for "crc32", which
# nothing loads automatically here.
MODDIR=$STAGE/lib/modules/$KVER
declare -A have=()
order=()
add_module() {
    local rel=$1 d
    [ -n "${have[$rel]:-}" ] && return 0
    for d in $(awk -v m="$rel:" '$1==m { $1=""; print }' "$MODDIR/modules.dep" | tr ' ' '\n' | tac); do
        add_module "$d"
    done
    have[$rel]=1
    # 6.12's modules are xz-compressed; the guest's busybox insmod takes them plain.
    local out=${rel%.xz}
    order+=("$out")
    mkdir -p "$(dirname "$ROOT/lib/modules/$out")"
    case $rel in
        *.xz) xz -dc "$MODDIR/$rel" > "$ROOT/lib/modules/$out" ;;
        *) install -m 0644 "$MODDIR/$rel" "$ROOT/lib/modules/$out" ;;
    esac
}
for m in virtio_pci virtio_net qemu_fw_cfg crc32_generic rdma_rxe ib_umad rdma_ucm; do
    rel=$(awk -F: -v m="/$m.ko" '{ f = $1; sub(/\.xz$/, "", f) }
        index(f, m) && substr(f, length(f)-length(m)+1) == m { print $1; exit }' "$MODDIR/modules.dep")
    if [ -z "$rel" ] && grep -q "/$m.ko\$" "$MODDIR/modules.builtin"; then
        continue # built into this kernel (6.12's virtio_pci)
    fi
    [ -n "$rel" ] || { log "kernel module $m not in $KPKG"; exit 1; }
    add_module "$rel"
done
printf '%s\n' "${order[@]}" > "$ROOT/etc/modules.order"

# Programs and the shared libraries ldd finds for them (unpacked packages first).
LIBS=$STAGE/usr/lib/x86_64-linux-gnu:$STAGE/lib/x86_64-linux-gnu
put() {   # put SRC DEST: a program or library and its libraries into the image
    install -D -m 0755 "$1" "$ROOT$2"
    local out lib dst
    out=$(LD_LIBRARY_PATH=$LIBS ldd "$1" 2>&1 || true)
    if echo "$out" | grep -q 'not found'; then
        log "missing library for $1:"; echo "$out" | grep 'not found' >&2; exit 1
    fi
    echo "$out" | awk '/=> \// {print $3}' | while read -r lib; do
        dst=${lib#"$STAGE"}; dst=${dst#/usr}
        [ -e "$ROOT$dst" ] || install -D -m 0755 "$(readlink -f "$lib")" "$ROOT$dst"
    done
}
for b in ibv_devinfo ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong \
         ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_bw \
         rping ucmatose udaddy rdma_server rdma_client; do
    put "$STAGE/usr/bin/$b" "/usr/bin/$b"
done
put "$STAGE/bin/ip" /usr/sbin/ip
put "$STAGE/usr/bin/rdma" /usr/sbin/rdma
cp -L "$STAGE/lib64/ld-linux-x86-64.so.2" "$ROOT/lib64/"
# glibc loads libgcc_s with dlopen for thread cancellation; ldd cannot see that.
install -D -m 0755 "$(readlink -f "$STAGE/lib/x86_64-linux-gnu/libgcc_s.so.1")" \
    "$ROOT/lib/x86_64-linux-gnu/libgcc_s.so.1"
# The rxe provider: libibverbs finds it through /etc/libibverbs.d/rxe.driver.
mkdir -p "$ROOT/etc/libibverbs.d"
cp "$STAGE/etc/libibverbs.d/rxe.driver" "$ROOT/etc/libibverbs.d/"
prov=$(ls "$STAGE"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
put "$prov" "/lib/x86_64-linux-gnu/libibverbs/$(basename "$prov")"

# Our verbs probe, compiled against the host's libibverbs-dev (the same rdma-core).
gcc -O2 -Wall -Wextra -Werror -o "$WORK/roce-probe" "$HERE/probe.c" -libverbs
put "$WORK/roce-probe" /usr/bin/roce-probe
# The sampler of `tools/rxe-interop --bench`.
gcc -O2 -Wall -Wextra -Werror -o "$WORK/cpustat" "$HERE/cpustat.c"
put "$WORK/cpustat" /usr/bin/cpustat

echo 'root:x:0:0:root:/root:/bin/sh' > "$ROOT/etc/passwd"
echo 'root:x:0:' > "$ROOT/etc/group"
printf '127.0.0.1 localhost\n' > "$ROOT/etc/hosts"
install -m 0755 "$HERE/init" "$ROOT/init"

# Every program must start (missing libraries show here, not in the VM).
for b in ibv_devinfo ibv_rc_pingpong ib_write_bw ib_atomic_bw roce-probe; do
    if chroot "$ROOT" "/usr/bin/$b" --help 2>&1 | grep -q 'error while loading'; then
        log "$b does not start in the image:"; chroot "$ROOT" "/usr/bin/$b" --help 2>&1 | head -3 >&2
        exit 1
    fi
done
chroot "$ROOT" /usr/sbin/ip -V >/dev/null

mkdir -p "$IMG.tmp"
cp "$STAGE/boot/vmlinuz-$KVER" "$IMG.tmp/vmlinuz"
# --bench appends an archive of its own to the initramfs: it needs a cpio.
cp "$STAGE/bin/busybox" "$IMG.tmp/busybox"
echo "$KVER" > "$IMG.tmp/KVER"
( cd "$ROOT" && find . | LC_ALL=C sort | "$ROOT/bin/busybox" cpio -o -H newc 2>/dev/null ) \
    | gzip -6 > "$IMG.tmp/initrd.img"
rm -rf "$IMG"; mv "$IMG.tmp" "$IMG"
# Other images (older keys, other kernels) are not needed any more: one rebuilds in
# about 15 s from the downloads kept in debs/.
for old in "$CACHE"/linux-image-*; do
    [ "$old" = "$IMG" ] || rm -rf "$old"
done
log "kernel $KVER, initrd $(du -h "$IMG/initrd.img" | cut -f1), $(( $(date +%s) - t0 )) s"
echo "$IMG"

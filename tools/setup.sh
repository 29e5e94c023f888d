#!/usr/bin/env bash
# Installs what roce-xdp needs to build and test on Debian 12: system packages via
# apt-get (only those missing, so a second run takes well under a second) and checks the
# Rust toolchain. Run as root. Used by README's two commands and by .ci/run.
set -euo pipefail

PKGS=(
    # build: the XDP program (clang, llvm), libbpf-sys / xsk-rs C parts, the C ABI's
    # structures (bindgen reads rdma-core's headers with libclang)
    clang llvm libclang-dev libelf-dev zlib1g-dev pkg-config m4 make gcc libc6-dev
    libibverbs-dev librdmacm-dev
    # tests: network namespaces, veth, loss injection, captures, dropping root
    iproute2 nftables tcpdump iputils-ping util-linux
    # tests: unmodified verbs programs on the C ABI (rdma-core's tools, perftest)
    ibverbs-utils perftest rdmacm-utils
    # tools/rxe-interop: the rxe VM (qemu TCG), its image (depmod; xz for the 6.12
    # kernels' compressed modules, ROCE_RXE_KPKG)
    qemu-system-x86 kmod xz-utils
    # tests: decode's HTML report in a real browser (headless), captures cut and
    # cross-checked with Wireshark's dissector
    chromium tshark
)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    for d in "$HOME/.cargo/bin" /usr/local/cargo/bin; do
        [ -x "$d/cargo" ] && export PATH="$d:$PATH"
    done
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo not found. roce-xdp needs Rust 1.88 or newer (Debian 12's rustc is too old); install it with rustup." >&2
    exit 1
fi
echo "setup: ok ($(cargo --version))"

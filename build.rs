//! Compiles the XDP program in `bpf/` with clang (through libbpf-cargo's
//! `SkeletonBuilder`) into `$OUT_DIR/roce.bpf.o`, which `src/link/bpf.rs` embeds and
//! loads with libbpf-rs.

use libbpf_cargo::SkeletonBuilder;
use std::env;
use std::path::PathBuf;

fn main() {
    let src = "bpf/roce.bpf.c";
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    // Debian keeps asm/ headers under the multiarch directory.
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    SkeletonBuilder::new()
        .source(src)
        .obj(out.join("roce.bpf.o"))
        .clang_args(["-O2", "-g", "-Wall", multiarch.as_str()])
        .build()
        .unwrap_or_else(|e| {
            panic!(
                "building {src} failed: {e:#}\n(it needs clang and the kernel UAPI headers: \
                 run tools/setup.sh)"
            )
        });
    println!("cargo:rerun-if-changed={src}");
}

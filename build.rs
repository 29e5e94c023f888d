//! Compiles the XDP program in `bpf/` with clang (through libbpf-cargo's
//! `SkeletonBuilder`) into `$OUT_DIR/roce.bpf.o`, which `src/link/bpf.rs` embeds and
//! loads with libbpf-rs; likewise the tests' corruption injector `bpf/corrupt.bpf.c`.
//!
//! Generates the C ABI's structures from the installed rdma-core headers with bindgen
//! (`$OUT_DIR/verbs_sys.rs`, included by `src/cabi/sys.rs`; its layout tests fail the
//! build if a structure differs), and gives the cdylib its SONAME and libibverbs'
//! symbol version nodes (`src/cabi/libibverbs.map`, applied through `tools/roce-xdp-cc`).

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
    // The tests' corruption injector (see bpf/corrupt.bpf.c), embedded by src/netns.rs.
    let corrupt = "bpf/corrupt.bpf.c";
    SkeletonBuilder::new()
        .source(corrupt)
        .obj(out.join("corrupt.bpf.o"))
        .clang_args(["-O2", "-g", "-Wall", multiarch.as_str()])
        .build()
        .unwrap_or_else(|e| panic!("building {corrupt} failed: {e:#}"));
    println!("cargo:rerun-if-changed={corrupt}");
    verbs_bindings(&out);
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={manifest}/src/cabi/libibverbs.map");
    println!("cargo:rerun-if-changed=src/cabi/libibverbs.map");
}

/// The verbs structures, enums and constants, as the system's headers declare them.
fn verbs_bindings(out: &std::path::Path) {
    let header = "src/cabi/verbs.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    let b = bindgen::Builder::default()
        .header(header)
        .allowlist_type("ibv_.*|_ibv_.*|verbs_.*|ib_uverbs_(qp|ah)_attr|ib_user_path_rec|rdma_.*")
        .allowlist_var("IBV_.*|VERBS_.*|IB_UVERBS_.*|RDMA_.*|RAI_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "generating the verbs bindings from {header} failed: {e}\n(it needs \
                 libibverbs-dev, librdmacm-dev and libclang: run tools/setup.sh)"
            )
        });
    b.write_to_file(out.join("verbs_sys.rs"))
        .expect("writing verbs_sys.rs");
}

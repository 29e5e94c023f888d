//! What the tests of the C ABI share: running an unmodified program under `roce-xdp
//! run` with the library these tests built, in a namespace, and the checks around it.
#![allow(dead_code)]

use super::rt::{bin, need_root};
use roce_xdp::netns::{Netns, Pair};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Root, namespaces and the named programs, or a printed reason to skip.
pub fn ready(programs: &[&str]) -> bool {
    if !need_root() {
        return false;
    }
    for p in programs {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()));
        if !found {
            let why = format!("{p} is not installed (tools/setup.sh installs it)");
            if std::env::var_os("ROCE_REQUIRE_ROOT").is_some() {
                panic!("cannot run: {why}");
            }
            eprintln!("SKIPPED: {why}");
            return false;
        }
    }
    true
}

/// The verbs library built with these tests (`cargo test` rebuilds target/*/deps only).
pub fn lib() -> PathBuf {
    let bin = Path::new(bin());
    let deps = bin.parent().unwrap().join("deps").join("libroce_xdp.so");
    if deps.is_file() {
        deps
    } else {
        bin.parent().unwrap().join("libroce_xdp.so")
    }
}

/// `roce-xdp run [extra] -- args...` inside `ns`.
pub fn run_in(ns: &Netns, extra: &[&str], args: &[&str]) -> Command {
    run_on(ns, None, extra, args)
}

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status), in
/// order: tests pin programs to these, which need not start at 0.
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("");
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            cpus.extend(a..=b);
        }
    }
    cpus
}

/// As [`run_in`], on CPU `cpu` only (`taskset -c`) when given: the program then sees
/// one CPU.
pub fn run_on(ns: &Netns, cpu: Option<usize>, extra: &[&str], args: &[&str]) -> Command {
    let mut c = match cpu {
        Some(k) => {
            let mut c = ns.command("taskset");
            c.args(["-c", &k.to_string(), bin()]);
            c
        }
        None => ns.command(bin()),
    };
    let l = lib();
    c.args(["run", "--lib", l.to_str().unwrap()]);
    c.args(extra);
    c.arg("--");
    c.args(args);
    c
}

/// No XDP program is left on the interface once the programs ended.
pub fn assert_no_xdp_left(pair: &Pair) {
    for ns in [&pair.a, &pair.b] {
        let o = ns
            .exec(&["ip", "-d", "link", "show", &pair.ifname])
            .unwrap();
        let t = String::from_utf8_lossy(&o.stdout);
        assert!(
            !t.contains("prog/xdp"),
            "an XDP program was left behind:\n{t}"
        );
    }
}

/// Builds `tests/c/NAME.c` into `dir` against the system's headers, linked with `libs`
/// (`-lrdmacm`, ...): the binary's path.
pub fn c_program(name: &str, dir: &Path, libs: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let st = std::process::Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(libs)
        .arg("-lpthread")
        .status()
        .expect("running cc");
    assert!(st.success(), "cc failed on {src}");
    out
}

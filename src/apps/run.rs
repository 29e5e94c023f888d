//! `roce-xdp run [OPTIONS] -- PROGRAM [ARGS...]`: runs an unmodified verbs program on
//! roce-xdp, with the C ABI library ([`crate::cabi`]) in front of the system's
//! libibverbs for that program only.
//!
//! The library is built beside the `roce-xdp` binary (`libroce_xdp.so`, SONAME
//! `libibverbs.so.1`). `run` keeps a directory of links to it under the names the
//! program's loader looks for (`libibverbs.so.1`, `librdmacm.so.1` for rdma_cm programs,
//! and `libmlx5.so.1` / `libefa.so.1`, which perftest links against: the loader finds
//! the same file and maps it once), puts
//! that directory first in `LD_LIBRARY_PATH`, and execs the program. Nothing is
//! installed: other programs, and hosts with real RDMA NICs, keep the system library.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The library file's name as cargo builds it.
pub const LIB_FILE: &str = "libroce_xdp.so";
/// The names the program's loader is given for it.
pub const LIB_NAMES: [&str; 4] = [
    "libibverbs.so.1",
    "librdmacm.so.1",
    "libmlx5.so.1",
    "libefa.so.1",
];

/// How to run the program.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// `auto` (AF_XDP if allowed, else the UDP link), `xdp` or `udp`.
    pub link: Option<String>,
    /// Capture every frame of the engine to this pcap file.
    pub pcap: Option<PathBuf>,
    /// The engine busy-polls (spin when idle; a caller's poll of an empty CQ runs the data path itself).
    pub busy_poll: bool,
    /// Whether the program's polls and posts run the data path in its thread
    /// (`RuntimeConfig::caller_rounds`; `None`: the library decides).
    pub caller_rounds: Option<bool>,
    /// Log what the engine does.
    pub verbose: bool,
    /// The library to use instead of the one beside this binary.
    pub lib: Option<PathBuf>,
}

/// Where the library is: `$ROCE_XDP_LIB`, beside the running binary (cargo's target
/// directory: the newer of `libroce_xdp.so` and `deps/libroce_xdp.so`, since `cargo test`
/// rebuilds only the latter), or in `../lib/roce-xdp/` of it (an installed layout).
pub fn find_lib(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        cands.push(p.to_path_buf());
    } else if let Some(p) = std::env::var_os("ROCE_XDP_LIB") {
        cands.push(PathBuf::from(p));
    } else if let Ok(exe) = std::env::current_exe()
        && let Some(d) = exe.parent()
    {
        cands.push(d.join(LIB_FILE));
        cands.push(d.join("deps").join(LIB_FILE));
        cands.push(d.join("../lib/roce-xdp").join(LIB_FILE));
    }
    let cands: Vec<PathBuf> = cands
        .into_iter()
        .map(|c| if c.is_dir() { c.join(LIB_FILE) } else { c })
        .collect();
    let newest = cands
        .iter()
        .filter_map(|c| Some((std::fs::metadata(c).ok()?.modified().ok()?, c)))
        .max_by_key(|(t, _)| *t);
    match newest {
        Some((_, c)) => std::fs::canonicalize(c).map_err(|e| format!("{}: {e}", c.display())),
        None => Err(format!(
            "the roce-xdp verbs library ({LIB_FILE}) is not built: run `cargo build --release` (looked at {})",
            cands
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A directory of this user's holding `libibverbs.so.1` etc. as links to `lib`,
/// created (or refreshed) now.
pub fn shim_dir(lib: &Path) -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    lib.hash(&mut h);
    let base = crate::apps::stats::dir();
    let dir = base.join(format!("lib-{:016x}", h.finish()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // Only this user may put libraries where its programs will load them from.
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        for d in [&base, &dir] {
            let m = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
            if m.uid() != me {
                return Err(format!(
                    "{} belongs to another user: refusing to load libraries from it",
                    d.display()
                ));
            }
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", d.display()))?;
        }
    }
    for name in LIB_NAMES {
        let link = dir.join(name);
        if std::fs::read_link(&link).ok().as_deref() == Some(lib) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(lib, &tmp)
            .map_err(|e| format!("linking {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(dir)
}

/// The environment the program runs with: the library directory first in
/// `LD_LIBRARY_PATH`, and the options for the library.
pub fn env(o: &Opts) -> Result<Vec<(String, OsString)>, String> {
    let lib = find_lib(o.lib.as_deref())?;
    let dir = shim_dir(&lib)?;
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH")
        && !old.is_empty()
    {
        path.push(":");
        path.push(old);
    }
    let mut v = vec![("LD_LIBRARY_PATH".to_string(), path)];
    if let Some(l) = &o.link {
        v.push((crate::cabi::LIB_ENV_LINK.into(), l.into()));
    }
    if let Some(p) = &o.pcap {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        v.push((crate::cabi::LIB_ENV_PCAP.into(), p.into()));
    }
    if o.busy_poll {
        v.push(("ROCE_XDP_BUSY_POLL".into(), "1".into()));
    }
    if let Some(on) = o.caller_rounds {
        v.push((
            crate::cabi::LIB_ENV_CALLER_ROUNDS.into(),
            if on { "1" } else { "0" }.into(),
        ));
    }
    if o.verbose {
        v.push(("ROCE_XDP_LOG".into(), "info".into()));
    }
    Ok(v)
}

/// Runs `program` with `args` on roce-xdp: replaces this process (so signals and the
/// exit status are the program's). Returns only on failure.
pub fn exec(o: &Opts, program: &str, args: &[String]) -> String {
    use std::os::unix::process::CommandExt;
    let vars = match env(o) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if let Some(w) = secure_exec_warning(program) {
        eprintln!("roce-xdp run: {w}");
    }
    let mut c = std::process::Command::new(program);
    c.args(args);
    for (k, v) in vars {
        c.env(k, v);
    }
    let e = c.exec();
    format!("{program}: {e}")
}

/// The loader ignores `LD_LIBRARY_PATH` for set-user-ID and file-capability programs.
fn secure_exec_warning(program: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(program))
            .find(|p| p.is_file())?
    };
    let m = std::fs::metadata(&path).ok()?;
    (m.permissions().mode() & 0o6000 != 0).then(|| {
        format!(
            "{} is set-user-ID or set-group-ID: the loader will not use roce-xdp's library for it",
            path.display()
        )
    })
}

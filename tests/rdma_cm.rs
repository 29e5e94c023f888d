//! Unmodified rdma_cm programs on roce-xdp (`roce-xdp run` puts the library in front of
//! librdmacm too): Debian's rdmacm-utils (rping, ucmatose, udaddy, rdma_server and
//! rdma_client) and perftest with `-R`, server and client each in its own network
//! namespace over AF_XDP, at IB MTU 1024 and 4096, judged as each program judges itself
//! (rping's `-v` data, exit status, perftest's verdict). Then the refusals a user sees:
//! nobody listening (REJECTED), a peer whose CM never answers (UNREACHABLE, after the
//! retries), an address nobody has (ADDR_ERROR).
//!
//! Needs root and the tools (`tools/setup.sh` installs rdmacm-utils and perftest);
//! skips with a reason otherwise, fails under `ROCE_REQUIRE_ROOT=1`.

mod common;
use common::cabi::*;
use common::rt::*;
use roce_xdp::netns::{Netns, Pair};
use std::process::Command;
use std::time::{Duration, Instant};

/// Waits until the program `pid` in `ns` runs its engine (`roce-xdp link show` names
/// the process: not the one before it, which may still be closing its connections).
fn wait_engine(ns: &Netns, pid: u32, secs: u64) -> bool {
    let until = Instant::now() + Duration::from_secs(secs);
    let want = format!("engine running in process {pid} ");
    while Instant::now() < until {
        if let Ok(o) = ns.exec(&[bin(), "link", "show"])
            && String::from_utf8_lossy(&o.stdout).contains(&want)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn pid(c: &Child) -> u32 {
    c.0.as_ref().expect("a running child").id()
}

/// A server in `pair.a` and its client in `pair.b`, each under `roce-xdp run`; both
/// outputs, after asserting both succeeded. `client` gets the server's address where
/// it says `{A}`. The server runs its engine before it listens, so a client refused
/// with "invalid service ID" (REJ 8) in the first seconds tries again, as a user would.
/// Each engine writes a capture (`run --pcap`); a failure prints every client attempt's
/// output and `decode --ladder` of the captures' last frames, and keeps them.
fn cm_run(pair: &Pair, server: &[&str], client: &[&str], secs: u64) -> (String, String) {
    let dir = std::env::temp_dir().join(format!(
        "roce-cm-{}-{}-{}",
        pair.a.name,
        server[0],
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Removed however this returns, unless a failure below keeps it.
    let mut scratch = Scratch(Some(dir.clone()));
    let pcap = |name: &str| {
        dir.join(format!("{name}.pcap"))
            .to_string_lossy()
            .into_owned()
    };
    let spcap = pcap("server");
    let s = Child::spawn(run_in(&pair.a, &["--pcap", &spcap], server));
    assert!(
        wait_engine(&pair.a, pid(&s), 20),
        "{server:?} never started its engine"
    );
    let ip = pair.ip_a.to_string();
    let cargs: Vec<&str> = client
        .iter()
        .map(|a| if *a == "{A}" { ip.as_str() } else { a })
        .collect();
    let t0 = Instant::now();
    let mut attempts = Vec::new();
    let (ok_c, out_c) = loop {
        let cpcap = pcap(&format!("client-{}", attempts.len() + 1));
        let (ok, out) = Child::spawn(run_in(&pair.b, &["--pcap", &cpcap], &cargs)).finish(secs);
        attempts.push(format!(
            "--- client attempt {} ({cpcap}):\n{out}",
            attempts.len() + 1
        ));
        let early = out.contains("REJECTED, error 8") || out.contains("REJECTED; error: 8");
        if ok || !early || t0.elapsed() > Duration::from_secs(20) {
            break (ok, out);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let (ok_s, out_s) = s.finish(10);
    if !(ok_c && ok_s) {
        let mut ladders = String::new();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        for f in files {
            let o = Command::new(bin())
                .args(["decode", "--ladder", f.to_str().unwrap()])
                .output();
            let text = o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            let text = text.unwrap_or_else(|e| format!("decode: {e}"));
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(60)..].join("\n");
            ladders.push_str(&format!(
                "--- {} (last 60 lines of the ladder):\n{tail}\n",
                f.display()
            ));
        }
        scratch.0 = None;
        panic!(
            "{server:?} / {client:?} failed (captures kept in {})\n--- server:\n{out_s}\n{}\n{ladders}",
            dir.display(),
            attempts.join("\n")
        );
    }
    drop(scratch);
    (out_s, out_c)
}

/// A directory removed when this is dropped (also by a panic's unwinding) while it
/// still holds it.
struct Scratch(Option<std::path::PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

const TOOLS: &[&str] = &[
    "rping",
    "ucmatose",
    "udaddy",
    "rdma_server",
    "rdma_client",
    "ib_write_bw",
    "ib_send_lat",
];

fn suite(pair: &Pair, mtu: u32) {
    let a = pair.ip_a.to_string();
    // rping: 10 pings of 1000 bytes, each checked by the server (-v prints the data).
    let (srv, cli) = cm_run(
        pair,
        &["rping", "-s", "-a", &a, "-v", "-C", "10", "-S", "1000"],
        &["rping", "-c", "-a", "{A}", "-v", "-C", "10", "-S", "1000"],
        60,
    );
    assert_eq!(cli.matches("ping data: rdma-ping-").count(), 10, "{cli}");
    assert_eq!(
        srv.matches("server ping data: rdma-ping-").count(),
        10,
        "{srv}"
    );
    assert!(cli.contains("rdma-ping-9: "), "{cli}");
    // ucmatose: four connections at once, each exchanging messages.
    let (srv, cli) = cm_run(
        pair,
        &["ucmatose", "-c", "4"],
        &["ucmatose", "-s", "{A}", "-c", "4"],
        60,
    );
    for o in [&srv, &cli] {
        assert!(
            o.contains("test complete") && o.contains("return status 0"),
            "{o}"
        );
    }
    // udaddy: UD with SIDR resolving the service to the server's QP.
    let (srv, cli) = cm_run(pair, &["udaddy"], &["udaddy", "-s", "{A}"], 60);
    for o in [&srv, &cli] {
        assert!(o.contains("return status 0"), "{o}");
    }
    // rdma_server / rdma_client: synchronous endpoints and the rdma_verbs.h helpers.
    let (srv, cli) = cm_run(pair, &["rdma_server"], &["rdma_client", "-s", "{A}"], 60);
    assert!(srv.contains("rdma_server: end 0"), "{srv}");
    assert!(cli.contains("rdma_client: end 0"), "{cli}");
    // perftest over rdma_cm.
    let m = mtu.to_string();
    for t in [
        vec!["ib_write_bw", "-R", "-s", "65536", "-n", "500", "-m", &m],
        vec!["ib_send_lat", "-R", "-s", "2", "-n", "500", "-m", &m],
    ] {
        let mut c = t.clone();
        c.push("{A}");
        let (srv, cli) = cm_run(pair, &t, &c, 90);
        for o in [&srv, &cli] {
            assert!(o.contains("#bytes"), "{t:?}: no result table\n{o}");
        }
    }
}

#[test]
fn rdma_cm_programs_at_ib_mtu_1024() {
    if !ready(TOOLS) {
        return;
    }
    let pair = Pair::new("rcma", 51, 1500).unwrap();
    suite(&pair, 1024);
    assert_no_xdp_left(&pair);
}

#[test]
fn rdma_cm_programs_at_ib_mtu_4096() {
    if !ready(TOOLS) {
        return;
    }
    let pair = Pair::new("rcmb", 52, 4200).unwrap();
    suite(&pair, 4096);
    assert_no_xdp_left(&pair);
}

#[test]
fn refusals_are_events_not_hangs() {
    if !ready(&["rping", "ucmatose"]) {
        return;
    }
    let pair = Pair::new("rcmc", 53, 1500).unwrap();
    let a = pair.ip_a.to_string();
    // Nobody listens on the port: the server's CM refuses the REQ (invalid service ID).
    let s = Child::spawn(run_in(&pair.a, &[], &["ucmatose", "-p", "7000"]));
    assert!(wait_engine(&pair.a, pid(&s), 20));
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let (ok, out) = Child::spawn(run_in(
        &pair.b,
        &[],
        &["rping", "-c", "-a", &a, "-p", "7001", "-C", "1"],
    ))
    .finish(30);
    assert!(!ok, "{out}");
    assert!(out.contains("RDMA_CM_EVENT_REJECTED, error 8"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // The refusal is counted where `roce-xdp stats` shows it (the engine writes its
    // stats file every half second or so).
    let mine = format!("\"pid\":{},", pid(&s));
    let until = Instant::now() + Duration::from_secs(5);
    let counted = loop {
        let st = Command::new(bin())
            .args(["stats", "--json"])
            .output()
            .unwrap();
        let st = String::from_utf8_lossy(&st.stdout).into_owned();
        let line = st
            .lines()
            .find(|l| l.contains(&mine))
            .unwrap_or("")
            .to_string();
        if line.contains("\"cm_rej_sent\":1,") || Instant::now() > until {
            break line;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(counted.contains("\"cm_rej_sent\":1,"), "{counted}");
    drop(s);
    // The peer has the address but no CM answers (no engine there): the REQ is sent
    // again each response timeout, then UNREACHABLE (ETIMEDOUT). 4.096 us x 2^16 =
    // 268 ms, 3 retries: about a second.
    std::thread::sleep(Duration::from_millis(500));
    let mut c = run_in(&pair.b, &[], &["rping", "-c", "-a", &a, "-C", "1"]);
    c.env("ROCE_XDP_CM_TIMEOUT", "16")
        .env("ROCE_XDP_CM_RETRIES", "3");
    let t0 = Instant::now();
    let (ok, out) = Child::spawn(c).finish(30);
    assert!(!ok, "{out}");
    assert!(
        out.contains("RDMA_CM_EVENT_UNREACHABLE, error -110"),
        "{out}"
    );
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(10),
        "{took:?}"
    );
    // An address nobody on the link has: address resolution fails (no neighbour).
    let nobody = "198.18.53.77";
    let (ok, out) = Child::spawn(run_in(
        &pair.b,
        &[],
        &["rping", "-c", "-a", nobody, "-C", "1"],
    ))
    .finish(30);
    assert!(!ok, "{out}");
    assert!(out.contains("RDMA_CM_EVENT_ADDR_ERROR"), "{out}");
    assert_no_xdp_left(&pair);
}

/// The event channel's contract, from a C program (`tests/c/cm_channel.c`): the fd is
/// readable exactly while an event waits, a destroyed ID's undelivered events go with
/// it, and a thread waiting on the channel is never woken with an error (rping's event
/// thread, still waiting when its main thread destroys the channel, once failed with
/// EAGAIN here: the destroy took the event the thread had been woken for).
#[test]
fn event_channels_keep_their_count_and_drop_a_destroyed_id_s_events() {
    if !ready(&["cc"]) {
        return;
    }
    let pair = Pair::new("rcmd", 54, 1500).unwrap();
    let dir = std::env::temp_dir().join(format!("roce-cm-channel-{}", std::process::id()));
    let prog = c_program("cm_channel", &dir, &["-lrdmacm", "-libverbs"]);
    let a = pair.ip_a.to_string();
    let (ok, out) = Child::spawn(run_in(&pair.a, &[], &[prog.to_str().unwrap(), &a])).finish(60);
    println!("{out}");
    assert!(ok, "{out}");
    assert!(
        out.contains(" passed, 0 failed") && !out.contains("not ok"),
        "{out}"
    );
    assert_no_xdp_left(&pair);
    let _ = std::fs::remove_dir_all(&dir);
}

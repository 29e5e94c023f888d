//! The `roce-xdp` command.

use clap::{Args, Parser, Subcommand};
use roce_xdp::apps::bench::goodput::GoodputOpts;
use roce_xdp::apps::workload::Stream;
use roce_xdp::apps::{self, demo, pingpong, stats};
use roce_xdp::decode::{self, Mode};
use roce_xdp::runtime::{Device, RuntimeConfig};
use roce_xdp::verbs::{Mtu, QpType};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "roce-xdp",
    version,
    about = "A software RoCEv2 NIC, and tools to learn the protocol"
)]
struct Cli {
    /// Log what the engine does (RUST_LOG=debug for more).
    #[arg(short = 'v', long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Explain every RoCEv2 frame of a pcap or pcapng capture, field by field.
    Decode {
        /// The capture file.
        file: PathBuf,
        /// One line per frame.
        #[arg(long, conflicts_with_all = ["ladder", "json"])]
        brief: bool,
        /// Draw each QP connection as a sequence diagram.
        #[arg(long, conflicts_with = "json")]
        ladder: bool,
        /// One JSON object per frame, one per line, nothing else on stdout.
        #[arg(long)]
        json: bool,
        /// Only what is wrong: the first frame failing a check, explained, and requests
        /// sent again and again; exit status 1 if there is any.
        #[arg(long, conflicts_with_all = ["brief", "ladder", "json"])]
        check: bool,
        /// The full explanation, and after each frame its bytes with every header and
        /// field marked.
        #[arg(long, conflicts_with_all = ["brief", "ladder", "json", "check"])]
        hex: bool,
        /// Write a self-contained HTML report (ladder diagrams, field diagrams, filters)
        /// to OUT instead of printing.
        #[arg(long, value_name = "OUT", conflicts_with_all = ["brief", "ladder", "json", "check", "hex"])]
        html: Option<PathBuf>,
        /// Show only these frames: N or FIRST-LAST (numbered as in Wireshark); the
        /// whole capture is still read, so pairings and retransmissions stay right.
        #[arg(long, value_name = "N[-M]", value_parser = parse_frames)]
        frames: Option<(usize, usize)>,
    },
    /// Two engines in two private network namespaces over AF_XDP: latency, bandwidth,
    /// atomics and a byte-exact transfer (the UDP link on loopback without root).
    Demo(DemoArgs),
    /// ibv_rc_pingpong on roce-xdp, wire-compatible with rdma-core's tools (server when
    /// no host is given).
    Pingpong(PingpongArgs),
    /// The counters of running engines, or their final reports.
    Stats(StatsArgs),
    /// One verbs operation as requester or target against tools/rxe/probe.c (or another
    /// roce-xdp), every byte checked on both sides.
    Probe(ProbeArgs),
    /// The peer of perftest's ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat and
    /// ib_atomic_bw (client when a host is given), speaking their TCP exchange.
    Perftest(PerftestArgs),
    /// Run an unmodified verbs program (rdma-core's tools, perftest, your own) on
    /// roce-xdp: `roce-xdp run -- ibv_devinfo -v`.
    Run(RunArgs),
    /// Benchmarks in their own network namespaces, figures side by side with their
    /// ceilings: `bench` alone runs goodput, the UDP link, latency, qps and loss and
    /// prints every ratio beside its target; or one: `bench goodput`, `ceiling`,
    /// `write|read|send -s SIZE`, `latency`, `qps`, `loss`, `flood` (root).
    #[command(args_conflicts_with_subcommands = true)]
    Bench {
        #[command(subcommand)]
        cmd: Option<BenchCmd>,
        #[command(flatten)]
        all: AllArgs,
        /// Leave both sides of each measurement to the scheduler instead of pinning A's
        /// engine (or sending thread) to the first CPU and B's to the second.
        #[arg(long, global = true)]
        no_pin: bool,
    },
    /// An endurance run: many RC QPs over AF_XDP with loss and reordering, mixed
    /// operations, every byte verified, resident memory watched (root).
    Soak(SoakArgs),
    /// roce-xdp's RDMA devices, as `rdma link` shows and adds rxe's: `link show`,
    /// `link add NAME netdev IF`, `link delete NAME`.
    Link {
        #[command(subcommand)]
        cmd: Option<LinkCmd>,
    },
}

#[derive(Args)]
struct SoakArgs {
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    minutes: u64,
    /// Run this many seconds instead of --minutes.
    #[arg(long, hide = true)]
    seconds: Option<u64>,
    /// RC QP pairs.
    #[arg(long, default_value_t = 100)]
    qps: usize,
    /// Percent of frames dropped each way (nftables on the bridge).
    #[arg(long, default_value_t = 1)]
    loss: u32,
    /// Percent of received frames each engine holds back (reordering).
    #[arg(long, default_value_t = 1)]
    reorder: u32,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// A third host sends frames at engine B (half to QPs that do not exist, half to
    /// B's QP with a bad ICRC) while A writes to B: flooded against clean goodput,
    /// interleaved, every flood frame's drop counted, every byte compared (root).
    Flood(FloodArgs),
    /// Round trips of small messages between two namespaces: the kernel's UDP sockets,
    /// a raw AF_XDP echo, RC SEND ping-pong and RC WRITE ping-pong (as ib_write_lat), each
    /// also busy-polling and on the UDP link, interleaved, with their ratios (root).
    Latency(LatencyArgs),
    /// Raw AF_XDP frames one way (the project's ring code, no RoCE work) against RC
    /// WRITE and READ goodput in frames of the same size, at IB MTU 1024 and 4096 (root).
    Ceiling(CeilingArgs),
    /// RC WRITE, READ and SEND goodput for 64 B to 1 MiB messages at IB MTU 1024 and
    /// 4096, each beside the raw AF_XDP rate of its frames, interleaved (root).
    Goodput(GoodputArgs),
    /// One WRITE goodput test printed as perftest's ib_write_bw prints it, with the raw
    /// AF_XDP ceiling of its frames (root).
    Write(OneArgs),
    /// One READ goodput test in ib_read_bw's style, with its raw ceiling (root).
    Read(OneArgs),
    /// One SEND goodput test in ib_send_bw's style, with its raw ceiling (root).
    Send(OneArgs),
    /// RC WRITE goodput with 1% and 2% random loss each way (nftables) beside no loss,
    /// interleaved, with the retransmissions and timeouts it took (root).
    Loss(LossArgs),
    /// 1000 RC QPs writing at once, served round-robin, against one QP, interleaved;
    /// and the memory an idle QP costs (root).
    Qps(QpsArgs),
}

#[derive(Args)]
struct AllArgs {
    /// One repetition and short streams everywhere (about 11 s here; for CI).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct QpsArgs {
    /// QPs on each side.
    #[arg(short = 'q', long, default_value_t = 1000)]
    qps: usize,
    /// WRITE message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096)]
    size: usize,
    /// WRITEs each QP keeps outstanding.
    #[arg(short = 't', long, default_value_t = 1)]
    depth: usize,
    /// IB MTU (1024 or 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Seconds each stream runs.
    #[arg(long, default_value_t = 0.5)]
    secs: f64,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// 0.2 s streams, one repetition (for CI: seconds).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LossArgs {
    /// Percent lost each way, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    loss: Vec<u32>,
    /// WRITE message size in bytes.
    #[arg(short = 's', long, default_value_t = 65536)]
    size: usize,
    /// IB MTU (1024 or 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Seconds each stream runs.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// 0.3 s streams, one repetition (for CI: seconds).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct GoodputArgs {
    /// Message sizes, bytes, comma-separated (default 64 B to 1 MiB by factors of 4).
    #[arg(short = 's', long, value_delimiter = ',')]
    size: Vec<usize>,
    /// Verbs, comma-separated: write, read, send.
    #[arg(long, value_delimiter = ',', value_parser = ["write", "read", "send"])]
    op: Vec<String>,
    /// One IB MTU only (1024 or 4096).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// Seconds each stream runs.
    #[arg(long, default_value_t = 0.25)]
    secs: f64,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Raw frames per measurement.
    #[arg(long, default_value_t = 100_000)]
    frames: u64,
    /// Messages in flight (default: by size, 4 MiB in flight, 4 to 128 messages).
    #[arg(short = 't', long)]
    tx_depth: Option<usize>,
    /// The engines busy-poll (spin when idle; a caller's poll of an empty CQ runs the data path itself).
    #[arg(long)]
    busy_poll: bool,
    /// The engines' link: xdp (AF_XDP) or udp (kernel UDP sockets).
    #[arg(long, value_enum, default_value_t = apps::bench::BenchLink::Xdp)]
    link: apps::bench::BenchLink,
    /// 64 B and 64 KiB only, 0.1 s streams, one repetition (for CI: seconds).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct OneArgs {
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 65536)]
    size: usize,
    /// IB MTU (1024 or 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Seconds the test runs, per repetition (perftest's -D).
    #[arg(short = 'D', long, default_value_t = 2.0)]
    duration: f64,
    /// Messages in flight (perftest's -t; default: by size, 4 to 128).
    #[arg(short = 't', long)]
    tx_depth: Option<usize>,
    /// Repetitions.
    #[arg(long, default_value_t = 1)]
    reps: usize,
    /// The engines busy-poll (spin when idle; a caller's poll of an empty CQ runs the data path itself).
    #[arg(long)]
    busy_poll: bool,
    /// The engines' link: xdp (AF_XDP) or udp (kernel UDP sockets).
    #[arg(long, value_enum, default_value_t = apps::bench::BenchLink::Xdp)]
    link: apps::bench::BenchLink,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CeilingArgs {
    /// Raw frames per measurement.
    #[arg(long, default_value_t = 300_000)]
    frames: u64,
    /// Seconds each RC stream runs.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Repetitions.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// One IB MTU only (1024 or 4096).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// 30000 frames, 0.2 s streams, one repetition (for CI: seconds).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct LatencyArgs {
    /// Round trips per measurement.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Repetitions (each measures every round trip in turn).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 64)]
    size: usize,
    /// 2000 round trips, one repetition (for CI: seconds).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct FloodArgs {
    /// Flood frames per repetition.
    #[arg(long, default_value_t = 1_000_000)]
    frames: u64,
    /// Repetitions (each a flooded run and a clean run as long).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// WRITE message size in bytes.
    #[arg(short = 's', long, default_value_t = 65536)]
    size: usize,
    /// 100000 frames, one repetition (for CI: seconds, not minutes).
    #[arg(long)]
    quick: bool,
    /// Print the report as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The link: auto (AF_XDP when this process may, else UDP), xdp or udp.
    #[arg(long, default_value = "auto", value_parser = ["auto", "xdp", "udp"])]
    link: String,
    /// Capture every frame the program's engine sends and receives to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// The engine busy-polls (lowest latency, one core busy): it spins when idle, and
    /// the program's polls of an empty CQ run its data path in the program's thread.
    #[arg(long)]
    busy_poll: bool,
    /// Whether the program's polls of an empty CQ (and posts of a burst's first WR)
    /// run the data path in its thread: auto does with --busy-poll, and when the
    /// program may run on one CPU only (taskset, a 1-vCPU VM).
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    caller_rounds: String,
    /// The verbs library to use instead of the one built beside roce-xdp.
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Only print the environment the program would get (for `env` or a shell).
    #[arg(long)]
    print_env: bool,
    /// The program and its arguments (after `--`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "print_env"
    )]
    program: Vec<String>,
}

#[derive(Subcommand)]
enum LinkCmd {
    /// List the devices of this network namespace (the default).
    Show {
        /// One device only.
        name: Option<String>,
    },
    /// Name the device of interface IF: `link add rxe0 netdev eth0`.
    Add {
        name: String,
        /// The word `netdev`, as in `rdma link add`.
        #[arg(value_parser = ["netdev"])]
        netdev_kw: String,
        netdev: String,
    },
    /// Remove a device added with `link add`.
    Delete { name: String },
}

/// Where a command's engine runs.
#[derive(Args, Clone)]
struct DevArgs {
    /// The interface; the only one with an IPv4 address if not given.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Use the UDP link bound to this local address instead of AF_XDP.
    #[arg(long)]
    udp: Option<IpAddr>,
    /// Write every frame to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Where to publish counters (default: a file `roce-xdp stats` finds).
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Longest wait for the peer or for one completion, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Engine threads, one per group of receive queues (AF_XDP).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args)]
struct ProbeArgs {
    /// The TCP server; none listens.
    host: Option<String>,
    #[command(flatten)]
    dev: DevArgs,
    /// req (requester) or tgt (target).
    #[arg(long)]
    role: String,
    /// write, write_mw (through a memory window the target binds), write_imm, read,
    /// send_imm, send_inv, cas or faa.
    #[arg(long)]
    op: String,
    #[arg(short = 's', long, default_value_t = 4096)]
    size: u32,
    #[arg(short = 'n', long, default_value_t = 4)]
    iters: u32,
    #[arg(short = 'S', long, default_value_t = 1)]
    seed: u32,
    /// Requester: use a wrong R_Key and expect REM_ACCESS_ERR.
    #[arg(long)]
    bad_rkey: bool,
    /// Target: post receives this many milliseconds late (RNR).
    #[arg(long, default_value_t = 0)]
    rnr_delay: u64,
    /// Path MTU in bytes (default: the port's).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    /// Local ACK timeout exponent.
    #[arg(short = 't', long = "qp-timeout", default_value_t = 14)]
    qp_timeout: u8,
    #[arg(short = 'p', long, default_value_t = 18700)]
    port: u16,
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,
}

#[derive(Args)]
struct PerftestArgs {
    /// write_bw, read_bw, send_bw, write_lat or atomic_bw.
    test: String,
    /// The server; none makes this the server.
    host: Option<String>,
    #[command(flatten)]
    dev: DevArgs,
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// GID index (default: the first IPv4 GID).
    #[arg(short = 'x', long = "gid-index")]
    gid_idx: Option<u8>,
    #[arg(short = 's', long)]
    size: Option<usize>,
    #[arg(short = 'n', long)]
    iters: Option<u64>,
    /// MTU in bytes (default: the port's).
    #[arg(short = 'm', long)]
    mtu: Option<u32>,
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<usize>,
    /// READs or atomics outstanding (read_bw, atomic_bw; default: the device's limit).
    #[arg(short = 'o', long = "outs")]
    out_reads: Option<u32>,
    /// CMP_AND_SWAP or FETCH_AND_ADD (atomic_bw).
    #[arg(short = 'A', long = "atomic_type", default_value = "FETCH_AND_ADD")]
    atomic: String,
    /// Accepted for compatibility (CPU frequency checks).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Report Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    gbits: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Netdev MTU of the veth pair: 1500 (IB MTU 1024) or 4200 (IB MTU 4096, multi-buffer);
    /// 316 (IB MTU 256) to 9000. Checked before anything is created.
    #[arg(long, default_value_t = 1500,
        value_parser = clap::value_parser!(u32).range(i64::from(demo::MIN_NETDEV_MTU)..=i64::from(demo::MAX_NETDEV_MTU)))]
    mtu: u32,
    /// Ping-pong round trips.
    #[arg(long, default_value_t = 5000)]
    iters: u64,
    /// Bytes per bandwidth step (K, M, G suffixes).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    bytes: u64,
    /// Bytes of the byte-checked mixed transfer.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    mixed: u64,
    /// Where to write the capture of the first frames.
    #[arg(long, default_value = "demo.pcap")]
    pcap: PathBuf,
    /// Write no capture.
    #[arg(long)]
    no_pcap: bool,
    /// Use the UDP link even when AF_XDP is possible.
    #[arg(long)]
    udp: bool,
    /// A short run (a few seconds).
    #[arg(long)]
    quick: bool,
    /// Drop PCT% of RoCE frames each way during the integrity step (nftables on a
    /// bridge; AF_XDP as root), so the capture shows NAKs and retransmissions.
    #[arg(long, value_name = "PCT", default_value_t = 0)]
    loss: u32,
    /// Frames of each step the capture keeps.
    #[arg(long, default_value_t = 400)]
    pcap_per_step: u64,
    /// Engine threads spin when idle: lower latency, two cores busy.
    #[arg(long)]
    busy_poll: bool,
    /// Queues on each veth end and engine threads per device (one per queue).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args)]
struct PingpongArgs {
    /// The server; none makes this the server.
    host: Option<String>,
    /// TCP port of the address exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// The interface (the "device"); the only one with an IPv4 address if not given.
    #[arg(short = 'd', long = "ib-dev")]
    dev: Option<String>,
    /// Port number (roce-xdp devices have one port).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// Message size (default 4096, UD 1024).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (RC and UC; not exchanged).
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Messages each way.
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u64,
    /// Service level (no meaning on Ethernet; accepted for compatibility).
    #[arg(short = 'l', long, default_value_t = 0)]
    sl: u8,
    /// Wait for completions by events (accepted; roce-xdp always waits without spinning).
    #[arg(short = 'e', long)]
    events: bool,
    /// Local GID index (default: the first IPv4 GID).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u8>,
    /// Mark each page on the client and check the marks on the server.
    #[arg(short = 'c', long = "chk")]
    check: bool,
    /// UD, as ibv_ud_pingpong.
    #[arg(long, conflicts_with = "uc")]
    ud: bool,
    /// UC, as ibv_uc_pingpong.
    #[arg(long)]
    uc: bool,
    /// Use the UDP link bound to this local address instead of AF_XDP (no root needed).
    #[arg(long)]
    udp: Option<IpAddr>,
    /// Write every frame to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Longest wait for the peer or for one completion, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Where to publish counters (default: a file `roce-xdp stats` finds).
    #[arg(long)]
    stats_file: Option<PathBuf>,
    /// Engine threads, one per group of receive queues (AF_XDP).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args)]
struct StatsArgs {
    /// Stats files; default: every file in the stats directory.
    files: Vec<PathBuf>,
    /// Show zero counters too.
    #[arg(long)]
    all: bool,
    /// Print the JSON as published.
    #[arg(long)]
    json: bool,
    /// Redraw every SECS seconds, COUNT times.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// Delete the final reports of ended processes.
    #[arg(long)]
    clean: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 256M)"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = if cli.verbose { "info" } else { "warn" };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .try_init();
    match cli.cmd {
        Cmd::Decode {
            file,
            brief,
            ladder,
            json,
            check,
            hex,
            html,
            frames,
        } => {
            if let Some(out) = html {
                return match decode::html::write(&file, &out) {
                    Ok(n) => {
                        println!(
                            "{}: {n} frames; open it in a browser (file://{})",
                            out.display(),
                            std::fs::canonicalize(&out).unwrap_or(out.clone()).display()
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("roce-xdp decode: {e}");
                        ExitCode::from(2)
                    }
                };
            }
            let mode = if check {
                Mode::Check
            } else if json {
                Mode::Json
            } else if ladder {
                Mode::Ladder
            } else if brief {
                Mode::Brief
            } else if hex {
                Mode::Hex
            } else {
                Mode::Full
            };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match decode::run_frames(&file, mode, frames, &mut out) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::FAILURE,
                Err(decode::DecodeError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    drop(out);
                    eprintln!("roce-xdp decode: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Demo(a) => run_demo(a),
        Cmd::Pingpong(a) => run_pingpong(a),
        Cmd::Stats(a) => run_stats(a),
        Cmd::Probe(a) => run_probe(a),
        Cmd::Perftest(a) => run_perftest(a),
        Cmd::Run(a) => run_program(a, cli.verbose),
        Cmd::Link { cmd } => run_link(cmd.unwrap_or(LinkCmd::Show { name: None })),
        Cmd::Bench {
            cmd: Some(cmd),
            no_pin,
            ..
        } => {
            apps::bench::set_pinning(!no_pin);
            run_bench(cmd)
        }
        Cmd::Bench {
            cmd: None,
            all,
            no_pin,
        } => {
            apps::bench::set_pinning(!no_pin);
            apps::catch_interrupts();
            let o = apps::bench::all::AllOpts { quick: all.quick };
            bench_out("bench", all.json, |say| apps::bench::all::all(&o, say))
        }
        Cmd::Soak(a) => run_soak(a),
    }
}

fn run_soak(a: SoakArgs) -> ExitCode {
    apps::catch_interrupts();
    let o = apps::soak::SoakOpts {
        duration: Duration::from_secs(a.seconds.unwrap_or(a.minutes.saturating_mul(60))),
        qps: a.qps,
        loss: a.loss,
        reorder: a.reorder,
        ..apps::soak::SoakOpts::default()
    };
    match apps::soak::soak(&o, &mut |l| println!("{l}")) {
        Ok(r) => {
            let mib = |k: u64| k as f64 / 1024.0;
            println!(
                "{:.1} MiB byte-exact in {:.0} s ({} WRs, {:.2} Gbit/s), {} packets retransmitted; \
                 resident memory {:.1} MiB after the warm-up, at most {:.1} MiB, {:.1} MiB at the end",
                r.bytes as f64 / 1048576.0,
                r.elapsed.as_secs_f64(),
                r.wrs,
                r.bytes as f64 * 8.0 / r.elapsed.as_secs_f64().max(1e-9) / 1e9,
                r.retransmitted,
                mib(r.rss_kib.0),
                mib(r.rss_kib.1),
                mib(r.rss_kib.2)
            );
            if r.grew() {
                eprintln!("roce-xdp soak: FAIL: resident memory grew after the warm-up");
                return ExitCode::FAILURE;
            }
            println!("soak: PASS");
            ExitCode::SUCCESS
        }
        Err(e) => failed("soak", &e),
    }
}

fn run_bench(cmd: BenchCmd) -> ExitCode {
    apps::catch_interrupts();
    match cmd {
        BenchCmd::Flood(a) => {
            let mut o = apps::bench::FloodOpts {
                frames: a.frames,
                reps: a.reps,
                size: a.size,
            };
            if a.quick {
                o.frames = o.frames.min(100_000);
                o.reps = 1;
            }
            bench_out("bench flood", a.json, |say| apps::bench::flood(&o, say))
        }
        BenchCmd::Latency(a) => {
            let mut o = apps::bench::latency::LatencyOpts {
                iters: a.iters,
                reps: a.reps,
                size: a.size,
            };
            if a.quick {
                o = o.quick();
            }
            bench_out("bench latency", a.json, |say| {
                apps::bench::latency::latency(&o, say)
            })
        }
        BenchCmd::Ceiling(a) => {
            let mut o = apps::bench::ceiling::CeilingOpts {
                frames: a.frames,
                stream: stream_secs(a.secs),
                reps: a.reps,
                ..Default::default()
            };
            if let Some(b) = a.mtu {
                match bench_mtu(b) {
                    Ok(m) => o.mtus = vec![m],
                    Err(e) => return failed("bench ceiling", &e),
                }
            }
            if a.quick {
                o.frames = o.frames.min(30_000);
                o.stream = o.stream.min(std::time::Duration::from_millis(200));
                o.reps = 1;
            }
            bench_out("bench ceiling", a.json, |say| {
                apps::bench::ceiling::ceiling(&o, say)
            })
        }
        BenchCmd::Goodput(a) => {
            let mut o = GoodputOpts {
                stream: Duration::from_secs_f64(a.secs.clamp(0.02, 60.0)),
                reps: a.reps,
                raw_frames: a.frames,
                depth: a.tx_depth,
                busy_poll: a.busy_poll,
                link: a.link,
                ..Default::default()
            };
            if !a.size.is_empty() {
                o.sizes = a.size;
            }
            if !a.op.is_empty() {
                o.ops = a.op.iter().map(|n| stream_op(n)).collect();
            }
            if let Some(b) = a.mtu {
                match bench_mtu(b) {
                    Ok(m) => o.mtus = vec![m],
                    Err(e) => return failed("bench goodput", &e),
                }
            }
            if a.quick {
                o = o.quick();
            }
            bench_out("bench goodput", a.json, |say| {
                apps::bench::goodput::goodput(&o, say)
            })
        }
        BenchCmd::Loss(a) => {
            let o = apps::bench::loss::LossOpts {
                percents: a.loss,
                size: a.size,
                mtu: match bench_mtu(a.mtu) {
                    Ok(m) => m,
                    Err(e) => return failed("bench loss", &e),
                },
                stream: stream_secs(a.secs),
                reps: a.reps,
            };
            let o = if a.quick { o.quick() } else { o };
            bench_out("bench loss", a.json, |say| apps::bench::loss::loss(&o, say))
        }
        BenchCmd::Qps(a) => {
            let o = apps::bench::qps::QpsOpts {
                qps: a.qps,
                size: a.size,
                depth: a.depth,
                mtu: match bench_mtu(a.mtu) {
                    Ok(m) => m,
                    Err(e) => return failed("bench qps", &e),
                },
                stream: stream_secs(a.secs),
                reps: a.reps,
            };
            let o = if a.quick { o.quick() } else { o };
            bench_out("bench qps", a.json, |say| apps::bench::qps::qps(&o, say))
        }
        BenchCmd::Write(a) => bench_one("write", a),
        BenchCmd::Read(a) => bench_one("read", a),
        BenchCmd::Send(a) => bench_one("send", a),
    }
}

/// `bench write|read|send`: one size of one verb, in perftest's style.
fn bench_one(verb: &str, a: OneArgs) -> ExitCode {
    let what = format!("bench {verb}");
    let mtu = match bench_mtu(a.mtu) {
        Ok(m) => m,
        Err(e) => return failed(&what, &e),
    };
    let o = GoodputOpts {
        sizes: vec![a.size],
        ops: vec![stream_op(verb)],
        mtus: vec![mtu],
        stream: Duration::from_secs_f64(a.duration.clamp(0.02, 600.0)),
        reps: a.reps,
        depth: a.tx_depth,
        perftest_style: true,
        busy_poll: a.busy_poll,
        link: a.link,
        ..Default::default()
    };
    bench_out(&what, a.json, |say| apps::bench::goodput::goodput(&o, say))
}

/// The stream a verb's name (as the options spell it) runs.
fn stream_op(name: &str) -> Stream {
    match name {
        "read" => Stream::Read,
        "send" => Stream::Send,
        _ => Stream::Write,
    }
}

/// A bench's `--secs`, kept between 50 ms and a minute.
fn stream_secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.05, 60.0))
}

/// The IB MTUs a bench can set up a link for.
fn bench_mtu(bytes: u32) -> Result<Mtu, String> {
    match Mtu::from_bytes(bytes) {
        Some(m @ (Mtu::Mtu1024 | Mtu::Mtu4096)) => Ok(m),
        _ => Err(format!("-m {bytes}: 1024 or 4096")),
    }
}

/// Runs a benchmark, printing its progress lines and then its table, or only its JSON.
fn bench_out<R: apps::bench::BenchReport>(
    what: &str,
    json: bool,
    run: impl FnOnce(&mut dyn FnMut(&str)) -> Result<R, String>,
) -> ExitCode {
    let r = run(&mut |l| {
        if !json {
            println!("{l}");
        }
    });
    match r {
        Ok(r) if json => {
            let mut j = r.to_json();
            if let Some(o) = j.as_object_mut() {
                o.insert(
                    "side_cpus".into(),
                    serde_json::json!(apps::bench::side_cpus()),
                );
                o.insert(
                    "core_round_trip_ns".into(),
                    serde_json::json!(apps::bench::probes_so_far()),
                );
            }
            println!("{j}");
            ExitCode::SUCCESS
        }
        Ok(r) => {
            println!();
            print!("{}", r.table());
            println!("{}", apps::bench::pinning_line());
            ExitCode::SUCCESS
        }
        Err(e) => failed(what, &e),
    }
}

fn run_program(a: RunArgs, verbose: bool) -> ExitCode {
    use roce_xdp::apps::run;
    let o = run::Opts {
        link: (a.link != "auto").then_some(a.link),
        pcap: a.pcap,
        busy_poll: a.busy_poll,
        caller_rounds: match a.caller_rounds.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        verbose,
        lib: a.lib,
    };
    if a.print_env {
        return match run::env(&o) {
            Ok(v) => {
                for (k, val) in v {
                    println!("{k}={}", val.to_string_lossy());
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed("run", &e),
        };
    }
    let Some((prog, args)) = a.program.split_first() else {
        return failed("run", "name the program to run after --");
    };
    let e = run::exec(&o, prog, args);
    eprintln!("roce-xdp run: {e}");
    ExitCode::from(127)
}

fn run_link(c: LinkCmd) -> ExitCode {
    use roce_xdp::links;
    match c {
        LinkCmd::Show { name } => {
            let devs = links::devices();
            let shown: Vec<_> = devs
                .iter()
                .filter(|l| name.as_ref().is_none_or(|n| *n == l.name))
                .collect();
            if let Some(n) = &name
                && shown.is_empty()
            {
                return failed("link", &format!("no device {n} in this network namespace"));
            }
            for l in shown {
                println!("{}", link_line(l));
            }
            ExitCode::SUCCESS
        }
        LinkCmd::Add { name, netdev, .. } => match links::add(&name, &netdev) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed("link", &e),
        },
        LinkCmd::Delete { name } => match links::delete(&name) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed("link", &e),
        },
    }
}

/// One device as `rdma link show` prints rxe's, then where it comes from and who runs it.
fn link_line(l: &roce_xdp::links::Link) -> String {
    let up = roce_xdp::host::Interface::find(&l.netdev)
        .and_then(|i| i.is_running())
        .unwrap_or(false);
    let (state, phys) = if up {
        ("ACTIVE", "LINK_UP")
    } else {
        ("DOWN", "DISABLED")
    };
    let mut s = format!(
        "link {}/1 state {state} physical_state {phys} netdev {}",
        l.name, l.netdev
    );
    if !l.configured {
        s.push_str(" (default device)");
    }
    if let Some(who) = roce_xdp::host::interface_holder(&l.netdev) {
        s.push_str(&format!(", engine running in {who}"));
    }
    s
}

/// `--frames N` or `--frames FIRST-LAST`.
fn parse_frames(s: &str) -> Result<(usize, usize), String> {
    let num = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("{x:?} is not a frame number"))
    };
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => (num(s)?, num(s)?),
    };
    if a == 0 || b < a {
        return Err(format!("{s}: frames are numbered from 1, FIRST <= LAST"));
    }
    Ok((a, b))
}

fn failed(cmd: &str, e: &str) -> ExitCode {
    eprintln!("roce-xdp {cmd}: {e}");
    if apps::interrupted() {
        ExitCode::from(130)
    } else {
        ExitCode::FAILURE
    }
}

fn run_demo(a: DemoArgs) -> ExitCode {
    apps::catch_interrupts();
    let mut o = demo::Opts {
        netdev_mtu: a.mtu,
        iters: a.iters,
        stream_bytes: a.bytes,
        mixed_bytes: a.mixed,
        pcap: (!a.no_pcap).then_some(a.pcap),
        udp: a.udp,
        busy_poll: a.busy_poll,
        threads: a.threads,
        loss: a.loss,
        pcap_per_step: a.pcap_per_step,
        ..demo::Opts::default()
    };
    if a.quick {
        o.iters = o.iters.min(1000);
        o.stream_bytes = o.stream_bytes.min(32 << 20);
        o.mixed_bytes = o.mixed_bytes.min(16 << 20);
        o.atomics = 4000;
    }
    println!("roce-xdp demo: two software RoCEv2 NICs talking RC over the wire");
    match demo::run(&o, &mut |l| println!("{l}")) {
        Ok(s) => {
            print!("{}", demo::table(&s));
            ExitCode::SUCCESS
        }
        Err(e) => failed("demo", &e),
    }
}

fn run_pingpong(a: PingpongArgs) -> ExitCode {
    apps::catch_interrupts();
    match pingpong_inner(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed("pingpong", &e),
    }
}

fn pingpong_inner(a: PingpongArgs) -> Result<(), String> {
    if a.ib_port != 1 {
        return Err(format!(
            "port {} does not exist: devices have port 1",
            a.ib_port
        ));
    }
    let _ = (a.sl, a.events);
    let qp_type = if a.ud {
        QpType::Ud
    } else if a.uc {
        QpType::Uc
    } else {
        QpType::Rc
    };
    let label = format!(
        "pingpong-{}",
        match qp_type {
            QpType::Rc => "rc",
            QpType::Uc => "uc",
            QpType::Ud => "ud",
        }
    );
    let mut cfg = match a.udp {
        Some(ip) => {
            let mut c = RuntimeConfig::udp(ip);
            c.port_mtu = Some(Mtu::Mtu4096);
            c
        }
        None => {
            let ifname = match a.dev {
                Some(d) => d,
                None => roce_xdp::host::default_interface()?,
            };
            RuntimeConfig::xdp(&ifname)
        }
    };
    cfg.pcap = a.pcap;
    cfg.threads = a.threads;
    cfg.stats_file = Some(a.stats_file.unwrap_or_else(|| stats::default_path(&label)));
    let dev = Device::open(cfg).map_err(|e| e.to_string())?;
    let gidx = a
        .gid_idx
        .unwrap_or_else(|| pingpong::default_gid_index(&dev));
    let o = pingpong::Opts {
        host: a.host,
        port: a.port,
        size: a.size,
        mtu: a.mtu,
        rx_depth: a.rx_depth,
        iters: a.iters,
        check: a.check,
        qp_type,
        timeout: Duration::from_secs(a.timeout),
    };
    let r = pingpong::run(&dev, gidx, &o, &mut |l| println!("{l}"))?;
    println!("{}", r.summary());
    dev.shutdown();
    Ok(())
}

fn run_stats(a: StatsArgs) -> ExitCode {
    let dir = stats::dir();
    let rounds = if a.watch.is_some() { a.count.max(1) } else { 1 };
    for round in 0..rounds {
        if round > 0 {
            std::thread::sleep(Duration::from_secs_f64(
                a.watch.unwrap_or(1.0).clamp(0.1, 60.0),
            ));
            println!();
        }
        let files: Vec<stats::Published> = if a.files.is_empty() {
            stats::list(&dir)
        } else {
            let mut v = Vec::new();
            for f in &a.files {
                match stats::read(f) {
                    Ok(p) => v.push(p),
                    Err(e) => return failed("stats", &e),
                }
            }
            v
        };
        if files.is_empty() {
            println!(
                "no engine has published counters in {} (commands write them there while they run)",
                dir.display()
            );
            return ExitCode::SUCCESS;
        }
        for p in &files {
            if a.json {
                println!("{}", p.json);
            } else {
                println!("{}", stats::render(p, a.all));
            }
        }
        if a.clean {
            for p in files.iter().filter(|p| !p.running) {
                let _ = std::fs::remove_file(&p.path);
            }
        }
    }
    ExitCode::SUCCESS
}

fn open_dev(d: &DevArgs, label: &str) -> Result<Device, String> {
    let mut cfg = match d.udp {
        Some(ip) => {
            let mut c = RuntimeConfig::udp(ip);
            c.port_mtu = Some(Mtu::Mtu4096);
            c
        }
        None => {
            let ifname = match &d.dev {
                Some(x) => x.clone(),
                None => roce_xdp::host::default_interface()?,
            };
            RuntimeConfig::xdp(&ifname)
        }
    };
    cfg.pcap = d.pcap.clone();
    cfg.threads = d.threads;
    cfg.stats_file = Some(
        d.stats_file
            .clone()
            .unwrap_or_else(|| stats::default_path(label)),
    );
    Device::open(cfg).map_err(|e| e.to_string())
}

fn run_probe(a: ProbeArgs) -> ExitCode {
    apps::catch_interrupts();
    let r = (|| -> Result<String, String> {
        use roce_xdp::apps::probe;
        let op = probe::Op::parse(&a.op).ok_or_else(|| format!("unknown --op {}", a.op))?;
        let requester = match a.role.as_str() {
            "req" | "requester" => true,
            "tgt" | "target" => false,
            x => return Err(format!("--role is req or tgt, not {x}")),
        };
        let dev = open_dev(&a.dev, "probe")?;
        let mtu = match a.mtu {
            Some(b) => Mtu::from_bytes(b).ok_or_else(|| format!("invalid MTU {b}"))?,
            None => dev.info().port_mtu,
        };
        let o = probe::Opts {
            requester,
            op,
            size: a.size,
            iters: a.iters,
            seed: a.seed,
            bad_rkey: a.bad_rkey,
            rnr_delay: Duration::from_millis(a.rnr_delay),
            mtu,
            timeout_exp: a.qp_timeout,
            host: a.host.clone(),
            port: a.port,
            gid_index: a
                .gid_idx
                .unwrap_or_else(|| pingpong::default_gid_index(&dev)),
            wait: Duration::from_secs(a.dev.timeout),
        };
        let r = probe::run(&dev, &o);
        dev.shutdown();
        r
    })();
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{e}");
            failed("probe", "failed")
        }
    }
}

fn run_perftest(a: PerftestArgs) -> ExitCode {
    apps::catch_interrupts();
    let r = (|| -> Result<(), String> {
        use roce_xdp::apps::perftest;
        let test = perftest::Test::parse(&a.test).ok_or_else(|| {
            format!(
                "unknown test {} (write_bw, read_bw, send_bw, write_lat, atomic_bw)",
                a.test
            )
        })?;
        let cas = match a.atomic.as_str() {
            "CMP_AND_SWAP" => true,
            "FETCH_AND_ADD" => false,
            x => return Err(format!("-A is CMP_AND_SWAP or FETCH_AND_ADD, not {x}")),
        };
        let _ = a.cpu_freq;
        let dev = open_dev(&a.dev, "perftest")?;
        let o = perftest::Opts {
            test,
            host: a.host.clone(),
            port: a.port,
            size: a.size,
            iters: a.iters,
            mtu: a.mtu,
            tx_depth: a.tx_depth,
            out_reads: a.out_reads,
            cmp_and_swap: cas,
            gbits: a.gbits,
            gid_index: a
                .gid_idx
                .unwrap_or_else(|| pingpong::default_gid_index(&dev)),
            wait: Duration::from_secs(a.dev.timeout),
        };
        println!(
            "roce-xdp perftest: {} {} ({})",
            test.name(),
            if o.host.is_some() { "client" } else { "server" },
            dev.info().link
        );
        let r = perftest::run(&dev, &o, &mut |l| println!("{l}"));
        dev.shutdown();
        r.map(|_| ())
    })();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed("perftest", &e),
    }
}

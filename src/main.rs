//! The `roce-xdp` command.

use clap::{Parser, Subcommand};
use roce_xdp::decode::{self, Mode};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "roce-xdp",
    version,
    about = "A software RoCEv2 NIC, and tools to learn the protocol"
)]
struct Cli {
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Decode {
            file,
            brief,
            ladder,
            json,
        } => {
            let mode = if json {
                Mode::Json
            } else if ladder {
                Mode::Ladder
            } else if brief {
                Mode::Brief
            } else {
                Mode::Full
            };
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            match decode::run(&file, mode, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
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
    }
}

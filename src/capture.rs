//! Reading and writing packet captures (pcap and pcapng) with `pcap-file`.
//!
//! The reader parses the whole file from memory, so a hostile file can make it allocate
//! no more than its own size, and a truncated file ends with [`CaptureError::Truncated`]
//! after the frames that were whole.

use crate::wire::{self, Frame};
use pcap_file::pcapng::Block;
use pcap_file::{DataLink, PcapError};
use std::path::Path;
use std::time::Duration;

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot read {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a pcap or pcapng file")]
    NotPcap(String),
    #[error("{path} is truncated or corrupt after frame {after}: {what}")]
    Truncated {
        path: String,
        after: usize,
        what: String,
    },
}

/// The link layer of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    Ethernet,
    /// Linux "cooked" capture (tcpdump -i any), 16-byte header.
    LinuxSll,
    /// Linux cooked capture v2, 20-byte header.
    LinuxSll2,
    /// Raw IPv4/IPv6, no link header.
    RawIp,
    Other(u32),
}

impl From<DataLink> for LinkType {
    fn from(d: DataLink) -> LinkType {
        match d {
            DataLink::ETHERNET => LinkType::Ethernet,
            DataLink::LINUX_SLL => LinkType::LinuxSll,
            DataLink::LINUX_SLL2 => LinkType::LinuxSll2,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => LinkType::RawIp,
            other => LinkType::Other(u32::from(other)),
        }
    }
}

/// One captured frame.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// 1-based position in the file.
    pub index: usize,
    /// Capture time since the Unix epoch.
    pub time: Duration,
    pub data: &'a [u8],
    /// Length on the wire (larger than `data` when the snap length cut it).
    pub orig_len: u32,
    pub link: LinkType,
    /// The frame's pcapng comment (`opt_comment`), if it has one.
    pub comment: Option<&'a str>,
}

impl<'a> Packet<'a> {
    /// Parses the frame as RoCEv2, whatever the link layer.
    pub fn roce(&self) -> wire::Result<Frame<'a>> {
        let d = self.data;
        match self.link {
            LinkType::Ethernet => Frame::parse(d),
            LinkType::LinuxSll => Frame::parse_ip(d.get(16..).unwrap_or(&[])),
            LinkType::LinuxSll2 => Frame::parse_ip(d.get(20..).unwrap_or(&[])),
            LinkType::RawIp => Frame::parse_ip(d),
            LinkType::Other(_) => Err(wire::Error::Malformed("unsupported link type")),
        }
    }
}

/// A capture file held in memory.
pub struct Capture {
    path: String,
    data: Vec<u8>,
}

impl Capture {
    /// Reads a capture file. The format is detected by its magic number.
    pub fn open(path: &Path) -> Result<Capture, CaptureError> {
        let p = path.display().to_string();
        let data = std::fs::read(path).map_err(|source| CaptureError::Open {
            path: p.clone(),
            source,
        })?;
        Ok(Capture { path: p, data })
    }

    /// A capture from bytes already in memory (`name` is used in error messages).
    pub fn from_bytes(name: &str, data: Vec<u8>) -> Capture {
        Capture {
            path: name.to_string(),
            data,
        }
    }

    /// Iterates over the frames.
    pub fn packets(&self) -> Result<Packets<'_>, CaptureError> {
        let d = &self.data[..];
        let magic = d.get(..4).map(|m| [m[0], m[1], m[2], m[3]]);
        let not_pcap = || CaptureError::NotPcap(self.path.clone());
        let format = match magic {
            Some([0x0a, 0x0d, 0x0d, 0x0a]) => {
                let (rest, parser) =
                    pcap_file::pcapng::PcapNgParser::new(d).map_err(|_| not_pcap())?;
                Format::Ng { parser, rest }
            }
            Some(m)
                if matches!(
                    u32::from_le_bytes(m),
                    0xa1b2_c3d4 | 0xa1b2_3c4d | 0xd4c3_b2a1 | 0x4d3c_b2a1
                ) =>
            {
                let (rest, parser) = pcap_file::pcap::PcapParser::new(d).map_err(|_| not_pcap())?;
                let link = parser.header().datalink.into();
                Format::Pcap { parser, rest, link }
            }
            _ => return Err(not_pcap()),
        };
        Ok(Packets {
            path: &self.path,
            format,
            index: 0,
            done: false,
        })
    }
}

enum Format<'a> {
    Pcap {
        parser: pcap_file::pcap::PcapParser,
        rest: &'a [u8],
        link: LinkType,
    },
    Ng {
        parser: pcap_file::pcapng::PcapNgParser,
        rest: &'a [u8],
    },
}

/// Iterator over the frames of a [`Capture`].
pub struct Packets<'a> {
    path: &'a str,
    format: Format<'a>,
    index: usize,
    done: bool,
}

impl<'a> Packets<'a> {
    fn fail(&mut self, e: PcapError) -> Option<Result<Packet<'a>, CaptureError>> {
        self.done = true;
        let what = match e {
            PcapError::IncompleteBuffer => "the last frame is cut short".to_string(),
            other => other.to_string(),
        };
        Some(Err(CaptureError::Truncated {
            path: self.path.to_string(),
            after: self.index,
            what,
        }))
    }
}

/// Timestamp of an enhanced packet block: pcap-file reports the raw count as if it were
/// nanoseconds; scale it by the interface's `if_tsresol` (default microseconds).
fn ng_time(raw: u128, tsresol: Option<u8>) -> Duration {
    let r = tsresol.unwrap_or(6);
    let (num, den): (u128, u128) = if r & 0x80 == 0 {
        let e = u32::from(r.min(19));
        (1_000_000_000, 10u128.pow(e))
    } else {
        (1_000_000_000, 1u128 << u32::from((r & 0x7f).min(63)))
    };
    let ns = raw.saturating_mul(num) / den;
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<Packet<'a>, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match &mut self.format {
            Format::Pcap { parser, rest, link } => {
                if rest.is_empty() {
                    self.done = true;
                    return None;
                }
                let link = *link;
                match parser.next_packet(rest) {
                    Ok((r, p)) => {
                        *rest = r;
                        self.index += 1;
                        let data: &'a [u8] = match p.data {
                            std::borrow::Cow::Borrowed(b) => b,
                            std::borrow::Cow::Owned(_) => &[],
                        };
                        Some(Ok(Packet {
                            index: self.index,
                            time: p.timestamp,
                            data,
                            orig_len: p.orig_len,
                            link,
                            comment: None,
                        }))
                    }
                    Err(e) => self.fail(e),
                }
            }
            Format::Ng { parser, rest } => loop {
                if rest.is_empty() {
                    self.done = true;
                    return None;
                }
                let (r, block) = match parser.next_block(rest) {
                    Ok(x) => x,
                    Err(e) => return self.fail(e),
                };
                *rest = r;
                let (iface, ts, data, orig_len, comment) = match block {
                    Block::EnhancedPacket(p) => {
                        let data: &'a [u8] = match p.data {
                            std::borrow::Cow::Borrowed(b) => b,
                            std::borrow::Cow::Owned(_) => &[],
                        };
                        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
                        let comment = p.options.into_iter().find_map(|o| match o {
                            EnhancedPacketOption::Comment(std::borrow::Cow::Borrowed(c)) => Some(c),
                            _ => None,
                        });
                        (
                            p.interface_id,
                            p.timestamp.as_nanos(),
                            data,
                            p.original_len,
                            comment,
                        )
                    }
                    Block::SimplePacket(p) => {
                        let data: &'a [u8] = match p.data {
                            std::borrow::Cow::Borrowed(b) => b,
                            std::borrow::Cow::Owned(_) => &[],
                        };
                        (0, 0, data, p.original_len, None)
                    }
                    _ => continue,
                };
                let Some(ifd) = parser.interfaces().get(iface as usize) else {
                    return self.fail(PcapError::InvalidInterfaceId(iface));
                };
                let tsresol = ifd.options.iter().find_map(|o| match o {
                    pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                    _ => None,
                });
                self.index += 1;
                return Some(Ok(Packet {
                    index: self.index,
                    time: ng_time(ts, tsresol),
                    data,
                    orig_len,
                    link: ifd.linktype.into(),
                    comment,
                }));
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ng_time_scales_by_resolution() {
        assert_eq!(ng_time(1_500_000, None), Duration::from_millis(1500));
        assert_eq!(ng_time(1_500_000_000, Some(9)), Duration::from_millis(1500));
        assert_eq!(ng_time(3, Some(0x81)), Duration::from_millis(1500));
    }

    #[test]
    fn rejects_non_pcap() {
        let c = Capture::from_bytes("x", b"hello world".to_vec());
        assert!(matches!(c.packets(), Err(CaptureError::NotPcap(_))));
        let c = Capture::from_bytes("x", vec![]);
        assert!(matches!(c.packets(), Err(CaptureError::NotPcap(_))));
    }
}

/// Writes Ethernet frames to a pcap file (nanosecond timestamps), for the engine's tap and
/// the simulator: `roce-xdp decode` and Wireshark read what it writes. The pcapng form
/// ([`Writer::new_ng`]) can also mark sections of a run: the first frame of each carries
/// a comment (Wireshark shows it as `frame.comment`), and each keeps at most its own
/// number of frames, so one capture samples every step of a long run.
pub struct Writer<W: std::io::Write> {
    inner: Inner<W>,
    frames: u64,
    /// Frames written in the current section, its limit, its comment still to write.
    in_section: u64,
    section_limit: u64,
    comment: Option<String>,
    skipped: u64,
    /// Opcodes written in the current section: past its limit, a frame whose opcode
    /// the section has not shown yet is still kept, so every opcode of a step appears.
    seen_ops: [u64; 4],
}

enum Inner<W: std::io::Write> {
    /// The classic format: the file header is pcap-file's, each record's 16-byte header
    /// is written here, since pcap-file's `PcapWriter` gives no way to flush the writer
    /// it owns (the engine's tap flushes as it runs, so that a program killed mid-run
    /// leaves a capture with its last frames).
    Pcap(W),
    Ng(pcap_file::pcapng::PcapNgWriter<W>),
}

/// The largest frame a pcap record keeps (the file header's snaplen).
const SNAPLEN: u32 = 65535;

impl<W: std::io::Write> Writer<W> {
    pub fn new(w: W) -> Result<Writer<W>, PcapError> {
        let header = pcap_file::pcap::PcapHeader {
            ts_resolution: pcap_file::TsResolution::NanoSecond,
            endianness: pcap_file::Endianness::Little,
            snaplen: SNAPLEN,
            ..Default::default()
        };
        let mut w = w;
        header.write_to(&mut w)?;
        Ok(Self::with(Inner::Pcap(w)))
    }

    /// A pcapng writer: one Ethernet interface with nanosecond timestamps.
    pub fn new_ng(w: W) -> Result<Writer<W>, PcapError> {
        use pcap_file::pcapng::blocks::interface_description::{
            InterfaceDescriptionBlock, InterfaceDescriptionOption,
        };
        let mut ng = pcap_file::pcapng::PcapNgWriter::new(w)?;
        ng.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: pcap_file::DataLink::ETHERNET,
            snaplen: 65535,
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        })?;
        Ok(Self::with(Inner::Ng(ng)))
    }

    fn with(inner: Inner<W>) -> Writer<W> {
        Writer {
            inner,
            frames: 0,
            in_section: 0,
            section_limit: u64::MAX,
            comment: None,
            skipped: 0,
            seen_ops: [0; 4],
        }
    }

    /// Starts a section: the next frame written carries `comment` (pcapng only; a pcap
    /// file has nowhere to put it), and at most `limit` frames are kept until the next.
    pub fn begin_section(&mut self, comment: &str, limit: u64) {
        self.in_section = 0;
        self.section_limit = limit;
        self.comment = Some(comment.to_string());
        self.seen_ops = [0; 4];
    }

    /// Appends one frame captured at `time` (since any origin), unless its section is
    /// full and has shown the frame's opcode already.
    pub fn write(&mut self, time: Duration, frame: &[u8]) -> Result<(), PcapError> {
        if self.section_limit != u64::MAX {
            let op = crate::wire::Frame::parse(frame)
                .ok()
                .map(|f| f.roce().bth().opcode().0);
            let new_op = op.is_some_and(|o| {
                let (w, b) = (usize::from(o / 64), o % 64);
                let fresh = self.seen_ops[w] & (1 << b) == 0;
                self.seen_ops[w] |= 1 << b;
                fresh
            });
            if self.in_section >= self.section_limit {
                if !new_op {
                    self.skipped += 1;
                    return Ok(());
                }
                // Say why this frame is here, and that frames before it were cut.
                if self.comment.is_none() && self.skipped > 0 {
                    let name = op.map_or("?", |o| crate::wire::Opcode(o).name());
                    self.comment = Some(format!(
                        "the first {name} of this section; frames before it left out"
                    ));
                }
            }
        }
        self.in_section += 1;
        self.frames += 1;
        match &mut self.inner {
            Inner::Pcap(w) => {
                // ts_sec, ts_nsec, incl_len, orig_len (little-endian, as the header says).
                let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
                let incl = len.min(SNAPLEN);
                let mut rec = [0u8; 16];
                rec[0..4].copy_from_slice(&(time.as_secs() as u32).to_le_bytes());
                rec[4..8].copy_from_slice(&time.subsec_nanos().to_le_bytes());
                rec[8..12].copy_from_slice(&incl.to_le_bytes());
                rec[12..16].copy_from_slice(&len.to_le_bytes());
                w.write_all(&rec)
                    .and_then(|_| w.write_all(&frame[..incl as usize]))
                    .map_err(PcapError::IoError)
            }
            Inner::Ng(w) => {
                use pcap_file::pcapng::blocks::enhanced_packet::{
                    EnhancedPacketBlock, EnhancedPacketOption,
                };
                let options = match self.comment.take() {
                    Some(c) => vec![EnhancedPacketOption::Comment(c.into())],
                    None => Vec::new(),
                };
                w.write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: time,
                    original_len: frame.len() as u32,
                    data: std::borrow::Cow::Borrowed(frame),
                    options,
                })
                .map(|_| ())
            }
        }
    }

    /// Frames written so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Frames left out because their section was full.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Pushes what is buffered on to the file.
    pub fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.inner {
            Inner::Pcap(w) => w.flush(),
            Inner::Ng(w) => w.get_mut().flush(),
        }
    }

    pub fn into_inner(self) -> W {
        match self.inner {
            Inner::Pcap(w) => w,
            Inner::Ng(w) => w.into_inner(),
        }
    }
}

#[cfg(test)]
mod writer_tests {
    use super::*;

    #[test]
    fn writes_what_the_reader_reads() {
        let mut w = Writer::new(Vec::new()).unwrap();
        w.write(Duration::from_nanos(1_500), &[1, 2, 3]).unwrap();
        w.write(Duration::from_secs(2), &[4; 60]).unwrap();
        let c = Capture::from_bytes("mem", w.into_inner());
        let p: Vec<_> = c.packets().unwrap().map(Result::unwrap).collect();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].data, &[1, 2, 3]);
        assert_eq!(p[0].time, Duration::from_nanos(1_500));
        assert_eq!(p[1].time, Duration::from_secs(2));
    }

    #[test]
    fn pcapng_sections_carry_their_comment_and_keep_their_limit() {
        let mut w = Writer::new_ng(Vec::new()).unwrap();
        w.begin_section("step 1: ping", 2);
        for i in 0..5u64 {
            w.write(Duration::from_nanos(1_000 + i), &[i as u8; 60])
                .unwrap();
        }
        // (Not RoCE frames: no opcode, so nothing past the limit is kept.)
        w.begin_section("step 2: write", 10);
        w.write(Duration::from_secs(3), &[9; 60]).unwrap();
        assert_eq!((w.frames(), w.skipped()), (3, 3));
        let c = Capture::from_bytes("mem", w.into_inner());
        let p: Vec<_> = c.packets().unwrap().map(Result::unwrap).collect();
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].comment, Some("step 1: ping"));
        assert_eq!(p[1].comment, None);
        assert_eq!(p[2].comment, Some("step 2: write"));
        assert_eq!(p[0].time, Duration::from_nanos(1_000));
        assert_eq!(p[2].time, Duration::from_secs(3));
        assert_eq!(p[2].data, &[9; 60]);
    }
}

//! `decode FILE --html OUT`: one self-contained page (no fetch of any kind, works from
//! `file://`) that draws each connection's ladder, shows a clicked frame's headers as a
//! field diagram over its highlighted bytes, and filters by connection and opcode.
//!
//! The page holds the same facts the text views print: the field list of
//! [`super::fields`], the flows and stories of [`super::flows`], the labels of the
//! ladder. Strings are interned in one table so a 20000-frame capture stays a few MB.

use super::flows::{self, FlowKey, Tracker};
use super::{DecodeError, Seen, fields, ladder, short_label};
use crate::capture::Capture;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

/// Payload bytes kept per frame for the byte view (the headers are always whole).
const PAYLOAD_SHOWN: usize = 64;

#[derive(Default)]
struct Strings {
    list: Vec<String>,
    index: HashMap<String, usize>,
}

impl Strings {
    fn id(&mut self, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        self.list.push(s.to_string());
        self.index.insert(s.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    Flow(FlowKey),
    Orphan(IpAddr, IpAddr, u32),
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Writes the report of `input` to `out`; returns the number of frames in the capture.
pub fn write(input: &Path, out: &Path) -> Result<usize, DecodeError> {
    let cap = Capture::open(input)?;
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (page, n, failure) = page(&cap, &name)?;
    std::fs::write(out, page)?;
    match failure {
        Some(e) => Err(e.into()),
        None => Ok(n),
    }
}

/// The page for `cap` (titled `name`), its frame count, and the error that ended the
/// file early, if one did (the page then shows the frames before it).
pub fn page(
    cap: &Capture,
    name: &str,
) -> Result<(String, usize, Option<crate::capture::CaptureError>), DecodeError> {
    let mut tracker = Tracker::default();
    let mut strings = Strings::default();
    let mut layouts: HashMap<Vec<i64>, usize> = HashMap::new();
    // The opcodes present, for the page's filter.
    let mut opcodes = std::collections::BTreeSet::new();
    let mut sections: Vec<Section> = Vec::new();
    let mut section_of: HashMap<Section, usize> = HashMap::new();
    let mut transports: Vec<&'static str> = Vec::new();
    let mut frames: Vec<Value> = Vec::new();
    let mut other = 0usize;
    let mut malformed: Vec<Value> = Vec::new();
    let mut total = 0usize;
    let mut t0 = None;
    let mut failure = None;
    for item in cap.packets()? {
        let p = match item {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        total += 1;
        let t0 = *t0.get_or_insert(p.time);
        let rel = p.time.saturating_sub(t0).as_secs_f64();
        let f = match p.roce() {
            Ok(f) => f,
            Err(e) => {
                if e.is_not_roce() {
                    other += 1;
                } else {
                    malformed.push(json!([p.index, e.to_string()]));
                }
                continue;
            }
        };
        let seen = Seen::observe(&mut tracker, p, rel, f);
        let (f, obs, icrc_ok) = (&seen.frame, seen.obs, seen.icrc_ok);
        let r = f.roce();
        opcodes.insert(r.info().code);
        let sec = match obs.flow {
            Some(k) => Section::Flow(k),
            None => Section::Orphan(f.ip().src(), f.ip().dst(), r.bth().dest_qp()),
        };
        let conn = *section_of.entry(sec).or_insert_with(|| {
            sections.push(sec);
            transports.push(r.info().transport.name());
            sections.len() - 1
        });

        // Frames of one shape share a layout (which fields, where); each frame keeps
        // only its values and meanings.
        let list = fields::fields(f);
        let mut layout: Vec<i64> = Vec::with_capacity(list.len() * 6);
        let mut vals: Vec<usize> = Vec::with_capacity(list.len() * 2);
        for x in &list {
            let (hi, w) = x
                .bits
                .map_or((-1i64, 0i64), |(h, w)| (i64::from(h), i64::from(w)));
            layout.extend([
                strings.id(x.layer) as i64,
                strings.id(x.name) as i64,
                x.start as i64,
                x.len as i64,
                hi,
                w,
            ]);
            vals.extend([strings.id(&x.value), strings.id(&x.meaning)]);
        }
        let n = layouts.len();
        let layout_id = *layouts.entry(layout).or_insert(n);
        // Bytes: everything up to PAYLOAD_SHOWN bytes into the payload, then the pad
        // and ICRC at their offset.
        let b = f.bytes();
        let po = f.bth_offset() + r.payload_offset();
        let tail_off = po + r.payload_len();
        let head_end = (po + r.payload_len().min(PAYLOAD_SHOWN)).min(b.len());
        let story = flows::story_text(&seen.obs.story, r.bth().psn()).unwrap_or_default();
        let label = short_label(f);
        let marks = ladder::marks(&seen);
        frames.push(json!([
            seen.packet.index,
            (rel * 1e6).round() / 1e6,
            conn,
            u8::from(seen.obs.response),
            strings.id(&label),
            strings.id(marks.trim()),
            r.info().code,
            hex(&b[..head_end]),
            tail_off,
            hex(b.get(tail_off..).unwrap_or(&[])),
            json!([layout_id, vals]),
            strings.id(&story),
            u8::from(seen.obs.retransmission),
            u8::from(!icrc_ok),
            seen.obs.answers,
            format!("{}:{} -> {}:4791", f.ip().src(), f.src_port(), f.ip().dst()),
            b.len(),
        ]));
    }
    let conns: Vec<Value> = sections
        .iter()
        .zip(&transports)
        .map(|(s, tr)| match s {
            Section::Flow(k) => {
                let st = tracker.flows.get(k).cloned().unwrap_or_default();
                let reads: Vec<Value> = st
                    .reads
                    .iter()
                    .map(|r| json!([r.frame, r.psn.value(), r.len, r.responses]))
                    .collect();
                json!({
                    "title": format!("{tr}: {}", ladder::flow_title(k, &st)),
                    "left": k.requester.to_string(),
                    "right": k.responder.to_string(),
                    "facts": flows::facts(&st),
                    "requests": st.requests,
                    "responses": st.responses,
                    "retransmissions": st.retransmissions,
                    "naks": st.naks + st.rnr_naks,
                    "reads": reads,
                })
            }
            Section::Orphan(from, to, qp) => json!({
                "title": format!("{tr}: responses from {from} to {to} QP 0x{qp:06x} (no request for them in the capture)"),
                "left": to.to_string(),
                "right": from.to_string(),
                "facts": "",
                "requests": 0, "responses": 0, "retransmissions": 0, "naks": 0, "reads": [],
            }),
        })
        .collect();
    let mut layout_list: Vec<(Vec<i64>, usize)> = layouts.into_iter().collect();
    layout_list.sort_by_key(|(_, i)| *i);
    let layout_list: Vec<Vec<i64>> = layout_list.into_iter().map(|(l, _)| l).collect();
    let data = json!({
        "file": name,
        "total": total,
        "other": other,
        "malformed": malformed,
        "strings": strings.list,
        "layouts": layout_list,
        "conns": conns,
        "frames": frames,
        "opcodes": opcodes
            .iter()
            .map(|&c| json!([c, crate::wire::Opcode(c).name()]))
            .collect::<Vec<_>>(),
        "error": failure.as_ref().map(|e| e.to_string()),
    });
    // Inside <script>, "</" would end the element: JSON allows "<\/" instead.
    let data = data.to_string().replace("</", "<\\/");
    Ok((PAGE.replace("/*DATA*/", &data), total, failure))
}

const PAGE: &str = include_str!("report.html");

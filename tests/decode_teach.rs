//! What `decode` teaches, checked against what tshark found in the same captures
//! (tests/data/*.tshark.tsv), and the HTML report checked in a real browser.

mod common;

use common::decode::{data, decode, rc_frame, text};
use roce_xdp::capture::Capture;
use roce_xdp::decode::flows::Tracker;
use roce_xdp::wire::Opcode;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// One tshark row: the columns of the TSV's first line.
struct Row {
    frame: usize,
    src: String,
    dst: String,
    opcode: u8,
    psn: u32,
    dmalen: Option<u32>,
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

fn tshark(name: &str) -> Vec<Row> {
    let t = std::fs::read_to_string(data(name)).unwrap();
    let mut lines = t.lines();
    let cols: Vec<&str> = lines
        .next()
        .unwrap()
        .split_once(':')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let at = |c: &str| cols.iter().position(|x| *x == c).unwrap();
    let (f, s, d, o, p, len) = (
        at("frame.number"),
        at("ip.src"),
        at("ip.dst"),
        at("infiniband.bth.opcode"),
        at("infiniband.bth.psn"),
        at("infiniband.reth.dmalen"),
    );
    lines
        .map(|l| {
            let v: Vec<&str> = l.split('\t').collect();
            Row {
                frame: v[f].parse().unwrap(),
                src: v[s].to_string(),
                dst: v[d].to_string(),
                opcode: num(v[o]) as u8,
                psn: num(v[p]) as u32,
                dmalen: v.get(len).filter(|x| !x.is_empty()).map(|x| num(x) as u32),
            }
        })
        .collect()
}

/// The capture file of `name` (pcap or pcapng).
fn capture(name: &str) -> PathBuf {
    let p = data(&format!("{name}.pcap"));
    if p.exists() {
        p
    } else {
        data(&format!("{name}.pcapng"))
    }
}

const CAPTURES: [&str; 3] = ["rxe-vm2vm-mtu1024", "rxe-afxdp-peer", "roce-xdp-loss"];

/// The summary's "frames per opcode" equals tshark's count of each opcode.
#[test]
fn frames_per_opcode_match_tshark_on_every_capture() {
    for c in CAPTURES {
        let rows = tshark(&format!("{c}.tshark.tsv"));
        let mut want: BTreeMap<u8, usize> = BTreeMap::new();
        for r in &rows {
            *want.entry(r.opcode).or_default() += 1;
        }
        let o = decode(&["--brief", capture(c).to_str().unwrap()]);
        let out = text(&o.stdout);
        let sum = out.split_once("frames per opcode:\n").unwrap().1;
        let mut got: BTreeMap<u8, usize> = BTreeMap::new();
        for l in sum.lines().take_while(|l| l.starts_with("    0x")) {
            let w: Vec<&str> = l.split_whitespace().collect();
            got.insert(num(w[0]) as u8, w[w.len() - 1].parse().unwrap());
        }
        assert_eq!(
            got, want,
            "{c}: decode's opcode counts differ from tshark's"
        );
    }
}

/// Every response tshark sees from B to A is paired with a request flow from A to B
/// (none left over as "no request for them"), and the per-direction counts of requests
/// and responses of the flows equal tshark's.
#[test]
fn requests_and_responses_pair_as_tshark_counts_them() {
    for c in CAPTURES {
        let rows = tshark(&format!("{c}.tshark.tsv"));
        // (requester, responder) -> (requests, responses), from tshark's frames.
        let mut want: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for r in &rows {
            let info = Opcode(r.opcode).info().unwrap();
            if info.request {
                want.entry((r.src.clone(), r.dst.clone())).or_default().0 += 1;
            } else if info.transport != roce_xdp::wire::Transport::Cnp {
                want.entry((r.dst.clone(), r.src.clone())).or_default().1 += 1;
            }
        }
        // A frame with a bad ICRC is dropped by any receiver: decode classifies it but
        // counts it in no flow, so it leaves tshark's counts too.
        let cap = Capture::open(&capture(c)).unwrap();
        for p in cap.packets().unwrap() {
            let p = p.unwrap();
            if let Ok(f) = p.roce()
                && f.verify_icrc().is_err()
            {
                let r = rows.iter().find(|r| r.frame == p.index).unwrap();
                let info = Opcode(r.opcode).info().unwrap();
                let k = if info.request {
                    (r.src.clone(), r.dst.clone())
                } else {
                    (r.dst.clone(), r.src.clone())
                };
                let e = want.get_mut(&k).unwrap();
                if info.request { e.0 -= 1 } else { e.1 -= 1 }
            }
        }
        let mut t = Tracker::default();
        let mut orphans = Vec::new();
        for p in cap.packets().unwrap() {
            let p = p.unwrap();
            let Ok(f) = p.roce() else { continue };
            // Like decode, a frame with a bad ICRC is classified without changing state.
            let o = t.observe(p.index, 0.0, &f, f.verify_icrc().is_ok());
            if o.flow.is_none() {
                orphans.push(p.index);
            }
        }
        let mut got: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for (k, s) in &t.flows {
            let e = got
                .entry((k.requester.to_string(), k.responder.to_string()))
                .or_default();
            e.0 += s.requests;
            e.1 += s.responses;
        }
        assert!(
            orphans.is_empty(),
            "{c}: responses paired with no request: {orphans:?}"
        );
        assert_eq!(got, want, "{c}: requests/responses per direction");
    }
}

/// Each READ is answered by DMALen / path MTU response packets (1024 in this capture):
/// counted once from tshark's rows by PSN range, and compared with decode's pairing.
/// Before the fix the last READ of the ib_read_bw burst kept only its FIRST response
/// (the summary said 33 responses for 40).
#[test]
fn every_read_is_paired_with_all_its_responses() {
    let rows = tshark("rxe-vm2vm-mtu1024.tshark.tsv");
    let mut want: HashMap<usize, u32> = HashMap::new();
    for r in rows.iter().filter(|r| r.opcode == 0x0c) {
        let n = r.dmalen.unwrap().div_ceil(1024).max(1);
        let got = rows
            .iter()
            .filter(|x| {
                (0x0d..=0x10).contains(&x.opcode)
                    && x.frame > r.frame
                    && x.src == r.dst
                    && x.psn.wrapping_sub(r.psn) & 0xff_ffff < n
            })
            .count() as u32;
        assert_eq!(
            got, n,
            "tshark: READ in frame {} has {got} of {n} responses",
            r.frame
        );
        want.insert(r.frame, n);
    }
    assert!(want.len() >= 5, "{} READs", want.len());
    let cap = Capture::open(&data("rxe-vm2vm-mtu1024.pcap")).unwrap();
    let mut t = Tracker::default();
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        if let Ok(f) = p.roce() {
            t.observe(p.index, 0.0, &f, true);
        }
    }
    let mut seen = 0;
    for s in t.flows.values() {
        for rd in &s.reads {
            assert_eq!(
                Some(&rd.responses),
                want.get(&rd.frame),
                "READ in frame {} (len {})",
                rd.frame,
                rd.len
            );
            seen += 1;
        }
    }
    assert_eq!(seen, want.len());
    let o = decode(&["--brief", data("rxe-vm2vm-mtu1024.pcap").to_str().unwrap()]);
    let out = text(&o.stdout);
    assert!(
        out.contains("198.18.0.2 QP 0x000013 -> 198.18.0.1 QP 0x000013  5 requests, 40 responses"),
        "{out}"
    );
    // The ladder shows no READ response as unpaired.
    let o = decode(&["--ladder", data("rxe-vm2vm-mtu1024.pcap").to_str().unwrap()]);
    let lad = text(&o.stdout);
    for sec in lad
        .split("=== ")
        .filter(|s| s.contains("no request for them"))
    {
        assert!(!sec.contains("READ_RESPONSE"), "{sec}");
    }
}

/// The retransmissions of rxe-afxdp-peer (rxe resends a SEND to a QP that never
/// answers) are explained: first transmission, timeout, no answer.
#[test]
fn a_retransmission_is_explained_by_what_happened() {
    let o = decode(&[data("rxe-afxdp-peer.pcap").to_str().unwrap()]);
    let out = text(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains("** retransmission: PSN 0xa27234"))
        .unwrap();
    assert!(line.contains("first sent in frame"), "{line}");
    assert!(
        line.contains("retransmit timeout") && line.contains("IBA 9.7.6.1.3"),
        "{line}"
    );
    assert!(
        line.contains("nothing in the capture answered frame"),
        "{line}"
    );
    let o = decode(&["--ladder", data("rxe-afxdp-peer.pcap").to_str().unwrap()]);
    assert!(text(&o.stdout).contains("RETRANSMIT (TIMEOUT"));
}

/// The summary groups retransmissions by cause into rounds (one NAK or timeout resends
/// a run of PSNs): the rounds add up to the counts per cause, each round's first and
/// last frame carry the PSNs it names (as tshark read them), and a go-back-N round names
/// a NAK the summary lists. Every cause appears, not only the first 20 packets' cause.
#[test]
fn retransmissions_are_summed_up_by_cause_in_rounds() {
    let rows = tshark("roce-xdp-loss.tshark.tsv");
    let psn_of: HashMap<usize, u32> = rows.iter().map(|r| (r.frame, r.psn)).collect();
    let o = decode(&["--brief", capture("roce-xdp-loss").to_str().unwrap()]);
    let out = text(&o.stdout);
    let sum = out.split_once("retransmitted PSNs: ").unwrap().1;
    let head = sum.lines().next().unwrap();
    let counts: Vec<usize> = head
        .split(['(', ',', ')'])
        .filter_map(|p| p.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(counts.len(), 4, "{head}");
    assert_eq!(counts[0], counts[1] + counts[2] + counts[3], "{head}");
    let naks: Vec<usize> = sum
        .split_once("  NAKs: ")
        .unwrap()
        .1
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.trim()
                .strip_prefix("frame ")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let mut per_cause: Vec<(String, usize, usize)> = Vec::new();
    for l in sum.lines().skip(1).take_while(|l| !l.starts_with("  NAKs")) {
        let t = l.trim_start();
        let psn = |w: &str| num(w.trim_matches(|c: char| !c.is_ascii_alphanumeric()));
        if l.starts_with("    ") && !l.starts_with("      ") {
            let (title, rest) = t.split_once(": ").unwrap();
            let n: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
            per_cause.push((title.to_string(), n, 0));
        } else if let Some(r) = t.strip_prefix("frame ") {
            let (f, rest) = r.split_once(": PSN ").unwrap();
            let p = psn(rest.split_whitespace().next().unwrap());
            assert_eq!(psn_of[&f.parse::<usize>().unwrap()] as u64, p, "{l}");
            let c = per_cause.last_mut().unwrap();
            c.2 += 1;
            if c.0.starts_with("in go-back-N") {
                let nak: usize = rest
                    .split_once("NAK in frame ")
                    .map(|(_, x)| x.split(':').next().unwrap().parse().unwrap())
                    .unwrap();
                assert!(naks.contains(&nak), "{l}: NAK {nak} not among {naks:?}");
            }
        } else if let Some(r) = t.strip_prefix("and ") {
            let more: usize = r.split_whitespace().next().unwrap().parse().unwrap();
            let p = psn(r
                .split("up to ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap());
            let f: usize = r
                .split("(frame ")
                .nth(1)
                .unwrap()
                .trim_end_matches(')')
                .parse()
                .unwrap();
            assert_eq!(psn_of[&f] as u64, p, "{l}");
            per_cause.last_mut().unwrap().2 += more;
        } else {
            panic!("unexpected line in the retransmission summary: {l}");
        }
    }
    // This capture: two go-back-N rounds after NAKs, then one timeout round, all shown.
    let titles: Vec<&str> = per_cause.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        titles,
        [
            "in go-back-N after a sequence NAK or a lost READ response",
            "after a retransmit timeout"
        ],
        "{sum}"
    );
    assert_eq!(per_cause[0].1, counts[1], "{sum}");
    assert_eq!(per_cause[1].1, counts[3], "{sum}");
    for (title, n, shown) in &per_cause {
        assert_eq!(n, shown, "{title}: the rounds shown do not add up");
    }
}

/// `--hex`: every byte of a frame belongs to a marked field, in order, and the field
/// values are those of the full view.
#[test]
fn hex_marks_every_byte_with_its_field() {
    let o = decode(&["--hex", data("rxe-vm2vm-mtu1024.pcap").to_str().unwrap()]);
    assert!(o.status.success());
    let out = text(&o.stdout);
    // A READ request: the RETH's fields at their offsets (14 Ethernet + 20 IPv4 + 8 UDP
    // + 12 BTH = 54 = 0x36).
    let fr = out
        .split("\n\n")
        .find(|f| f.contains("RC_RDMA_READ_REQUEST (opcode 0x0c"))
        .unwrap();
    assert!(fr.contains("  Bytes ("), "{fr}");
    for want in [
        "0000-0005  ",
        "Ethernet  Destination = ",
        "0036-003d  ",
        "RETH      VA = 0x",
        "003e-0041  ",
        "RETH      R_Key = 0x",
        "0042-0045  ",
        "RETH      DMALen = ",
        "ICRC      ICRC = 0x",
        "BTH       SE = 0 (bit 7), MigReq = 0 (bit 6), PadCnt = 0 (bits 5-4), TVer = 0 (bits 3-0)",
    ] {
        assert!(fr.contains(want), "{want:?} not in\n{fr}");
    }
    // Every byte covered exactly by the union of fields, for every frame of the capture.
    let cap = Capture::open(&data("rxe-vm2vm-mtu1024.pcap")).unwrap();
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let Ok(f) = p.roce() else { continue };
        let fl = roce_xdp::decode::fields::fields(&f);
        let mut covered = vec![false; f.bytes().len()];
        for x in &fl {
            for c in covered.iter_mut().skip(x.start).take(x.len) {
                *c = true;
            }
            assert!(
                x.start + x.len <= f.bytes().len(),
                "frame {}: {x:?}",
                p.index
            );
            assert!(
                !x.meaning.is_empty(),
                "frame {}: {} has no meaning",
                p.index,
                x.name
            );
        }
        let gap = covered.iter().position(|c| !c);
        assert_eq!(gap, None, "frame {}: byte not in any field", p.index);
    }
}

/// Every rule an explanation states names where it comes from.
#[test]
fn explanations_cite_their_rules() {
    let cap = Capture::open(&data("rxe-vm2vm-mtu1024.pcap")).unwrap();
    let mut cited = 0;
    for p in cap.packets().unwrap() {
        let p = p.unwrap();
        let Ok(f) = p.roce() else { continue };
        for x in roce_xdp::decode::fields::fields(&f) {
            let rule = ["must", "drops", "NAK", "masked", "checks"]
                .iter()
                .any(|w| x.meaning.contains(w));
            if rule {
                assert!(
                    x.meaning.contains("IBA ") || x.meaning.contains("RFC "),
                    "{} {}: {}",
                    x.layer,
                    x.name,
                    x.meaning
                );
                cited += 1;
            }
        }
    }
    assert!(cited > 1000, "{cited}");
}

// ---- the HTML report in a real browser ---------------------------------------------

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|c| {
            let o = Command::new("sh")
                .args(["-c", &format!("command -v {c}")])
                .output()
                .ok()?;
            let p = text(&o.stdout).trim().to_string();
            (!p.is_empty()).then(|| PathBuf::from(p))
        })
}

fn need_chromium() -> Option<PathBuf> {
    match chromium() {
        Some(c) => Some(c),
        None if std::env::var("ROCE_REQUIRE_ROOT").as_deref() == Ok("1") => {
            panic!("chromium is missing (tools/setup.sh installs it) and ROCE_REQUIRE_ROOT=1")
        }
        None => {
            println!("SKIPPED: chromium is not installed (tools/setup.sh installs it)");
            None
        }
    }
}

/// Runs headless Chromium on `page` with `args`, no network, a fresh profile.
fn headless(chrome: &Path, dir: &Path, args: &[&str], page: &Path) -> Output {
    let profile = dir.join("profile");
    let mut c = Command::new("timeout");
    c.args(["120", chrome.to_str().unwrap()]);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        &format!("--user-data-dir={}", profile.display()),
    ]);
    c.args(args);
    c.arg(format!("file://{}", page.display()));
    c.output().unwrap()
}

/// Writes the report of `capture` with the test's DOM check appended, loads it in
/// headless Chromium, and returns what the check printed (a JSON object).
fn check_in_browser(chrome: &Path, capture: &Path, tag: &str) -> serde_json::Value {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("html-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("report.html");
    let o = decode(&[capture.to_str().unwrap(), "--html", page.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: a CSP that forbids every fetch, and nothing that points outside.
    assert!(html.contains("default-src 'none'"));
    for bad in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!html.contains(bad), "{bad}");
    }
    let check =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/html/check.js"))
            .unwrap();
    let checked = dir.join("checked.html");
    std::fs::write(
        &checked,
        html.replace("</body>", &format!("<script>\n{check}\n</script>\n</body>")),
    )
    .unwrap();
    let o = headless(
        chrome,
        &dir,
        &["--virtual-time-budget=20000", "--dump-dom"],
        &checked,
    );
    let dom = text(&o.stdout);
    // The element the check appended (its own source text names it too: take the last).
    let json = dom
        .rsplit("<pre id=\"check-result\"")
        .next()
        .filter(|_| dom.contains("<pre id=\"check-result\" "))
        .and_then(|r| r.split_once('>'))
        .and_then(|(_, r)| r.split("</pre>").next())
        .unwrap_or_else(|| panic!("no check result in the DOM; stderr: {}", text(&o.stderr)));
    let json = json
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
        .replace("&quot;", "\"");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    // The screenshot the test keeps as an artifact (after a click on a frame).
    let shot = dir.join("report.png");
    let o = headless(
        chrome,
        &dir,
        &[
            "--virtual-time-budget=20000",
            "--window-size=1400,1000",
            &format!("--screenshot={}", shot.display()),
        ],
        &dir.join("checked.html"),
    );
    assert!(shot.exists(), "no screenshot: {}", text(&o.stderr));
    println!("{tag}: {v}; screenshot {}", shot.display());
    v
}

#[test]
fn html_report_works_in_a_real_browser() {
    let Some(chrome) = need_chromium() else {
        return;
    };
    let cap = data("rxe-vm2vm-mtu1024.pcap");
    let v = check_in_browser(&chrome, &cap, "rxe");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    // One diagram per connection decode finds, one arrow per RoCE frame.
    let c = Capture::open(&cap).unwrap();
    let mut t = Tracker::default();
    let (mut frames, mut orphan_secs) = (0, std::collections::HashSet::new());
    for p in c.packets().unwrap() {
        let p = p.unwrap();
        if let Ok(f) = p.roce() {
            frames += 1;
            let o = t.observe(p.index, 0.0, &f, f.verify_icrc().is_ok());
            if o.flow.is_none() {
                orphan_secs.insert((f.ip().src(), f.ip().dst(), f.roce().bth().dest_qp()));
            }
        }
    }
    assert_eq!(v["diagrams"], t.flows.len() + orphan_secs.len(), "{v}");
    assert_eq!(v["arrows"], frames, "{v}");
    // Clicking a READ request showed its fields, RETH among them, and clicking its
    // DMALen highlighted that field's 4 bytes.
    assert_eq!(v["clicked_title_has_read"], true, "{v}");
    assert!(v["field_cells"].as_u64().unwrap() > 15, "{v}");
    assert_eq!(v["highlighted_bytes"], 4, "{v}");
    assert!(v["meaning"].as_str().unwrap().contains("DMALen"), "{v}");
    // The opcode filter leaves only READ requests.
    assert_eq!(v["filtered_arrows"], 7, "{v}");
}

/// A capture of 20000 frames stays usable: the page renders (first CHUNK rows of each
/// connection) and a click works. The time to first render is printed, not asserted.
#[test]
fn html_report_of_20000_frames_renders() {
    let Some(chrome) = need_chromium() else {
        return;
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let pcap = dir.join("big-20000.pcap");
    write_big_capture(&pcap, 10_000);
    let v = check_in_browser(&chrome, &pcap, "big");
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(v["diagrams"], 1, "{v}");
    assert_eq!(v["total_frames"], 20_000, "{v}");
    println!(
        "20000 frames: page {} bytes, first render {} ms in headless Chromium",
        std::fs::metadata(dir.join("html-big/report.html"))
            .unwrap()
            .len(),
        v["render_ms"]
    );
}

/// `pairs` SEND_ONLY requests from A to B's QP 0x12, each answered by an ACK.
fn write_big_capture(path: &Path, pairs: u32) {
    let a = Ipv4Addr::new(198, 18, 7, 1);
    let b = Ipv4Addr::new(198, 18, 7, 2);
    let mut w = roce_xdp::capture::Writer::new(std::io::BufWriter::new(
        std::fs::File::create(path).unwrap(),
    ))
    .unwrap();
    let payload = [0x5au8; 64];
    for i in 0..pairs {
        let t = |us: u64| std::time::Duration::from_micros(u64::from(i) * 20 + us);
        w.write(t(0), &rc_frame(a, b, 0x12, 0x1000 + i, None, &payload))
            .unwrap();
        w.write(t(9), &rc_frame(b, a, 0x11, 0x1000 + i, Some(i + 1), &[]))
            .unwrap();
    }
    use std::io::Write as _;
    w.into_inner().flush().unwrap();
}

/// A flow is one connection: the same QP numbers coming back with a PSN far from the
/// flow's window start a new one (each process numbers its first QP 0x11 and starts at a
/// random PSN), while a PSN just before the window is a retransmission reaching back.
#[test]
fn a_new_connection_reusing_the_qp_numbers_is_a_flow_of_its_own() {
    let (a, b) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
    let mut t = Tracker::default();
    let mut i = 0;
    let mut feed = |t: &mut Tracker, f: Vec<u8>| {
        i += 1;
        t.observe(
            i,
            i as f64,
            &roce_xdp::wire::Frame::parse(&f).unwrap(),
            true,
        )
    };
    let req = |p| rc_frame(a, b, 0x11, p, None, &[]);
    let ack = |p| rc_frame(b, a, 0x11, p, Some(1), &[]);
    // Connection 1: PSNs 0x100..0x103 from A's QP 0x11 to B's QP 0x11, each ACKed.
    for p in 0x100..0x104 {
        assert!(!feed(&mut t, req(p)).retransmission);
        feed(&mut t, ack(p));
    }
    // One retransmission within it.
    assert!(feed(&mut t, req(0x102)).retransmission);
    // Connection 2, same QP numbers, random start PSNs: one far ahead, then one behind:
    // new connections, not retransmissions.
    let o = feed(&mut t, req(0x80_0000));
    assert!(!o.retransmission);
    assert_eq!(o.flow.unwrap().conn, 1);
    let r = feed(&mut t, ack(0x80_0000));
    assert_eq!(
        r.flow.unwrap().conn,
        1,
        "the ACK pairs with the new connection"
    );
    let o = feed(&mut t, req(0x40_0000));
    assert!(!o.retransmission);
    assert_eq!(o.flow.unwrap().conn, 2);
    // Just before a window is a retransmission reaching back, not a new connection (a
    // capture that starts mid-connection).
    let o = feed(&mut t, req(0x40_0000 - 100));
    assert!(o.retransmission);
    assert_eq!(o.flow.unwrap().conn, 2);
    assert_eq!(t.flows.len(), 3);
    let first = t.flows.values().find(|s| s.first_frame == 1).unwrap();
    assert_eq!(
        (first.requests, first.responses, first.retransmissions),
        (5, 4, 1)
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// A damaged capture file (cut anywhere, bytes flipped: headers, block lengths,
    /// comments, frames) never makes any view of decode, or the HTML page, panic.
    #[test]
    fn any_damaged_capture_decodes_without_panic(
        which in 0usize..3,
        cut in 0usize..12_000,
        flips in proptest::collection::vec((0usize..12_000, proptest::prelude::any::<u8>()), 0..12),
    ) {
        let name = ["rxe-vm2vm-mtu1024.pcap", "rxe-afxdp-peer.pcap", "roce-xdp-loss.pcapng"][which];
        let mut b = std::fs::read(data(name)).unwrap();
        b.truncate(cut.max(1));
        let n = b.len();
        for (at, x) in &flips {
            if let Some(v) = b.get_mut(*at % n) {
                *v ^= x;
            }
        }
        use roce_xdp::decode::{Mode, html, run_capture};
        let cap = Capture::from_bytes(name, b);
        for mode in [Mode::Full, Mode::Hex, Mode::Brief, Mode::Ladder, Mode::Json, Mode::Check] {
            let _ = run_capture(&cap, mode, None, &mut std::io::sink());
        }
        let _ = run_capture(&cap, Mode::Ladder, Some((3, 9)), &mut std::io::sink());
        let _ = html::page(&cap, name);
    }
}

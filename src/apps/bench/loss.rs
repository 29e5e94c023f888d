//! `bench loss`: RC WRITE goodput with random loss each way (an nftables netdev egress
//! rule, `numgen random`, on the bridge ports towards both engines) next to the same
//! stream without loss, interleaved in one run: how much of the lossless goodput the
//! requester's recovery keeps (issue 11: >= 0.50 at 2% each way for 64 KiB messages),
//! with what it cost in retransmitted packets, round-trip timer expiries and QP
//! timeouts. Each repetition's lossy streams sit between two lossless ones and are
//! measured against their mean (the closing one opens the next repetition), as this
//! VM's rates drift within seconds. The responder's rules are the spec's (a PSN
//! sequence error NAK on the first gap, IBA 9.7.5.1.2); everything else is the
//! requester's.

use super::super::workload::Stream;
use super::median;
use crate::netns::Bridged;
use crate::verbs::Mtu;
use std::time::Duration;

/// What `bench loss` does.
#[derive(Debug, Clone)]
pub struct LossOpts {
    /// Percent lost each way, one measurement each beside the lossless one.
    pub percents: Vec<u32>,
    /// WRITE message size.
    pub size: usize,
    pub mtu: Mtu,
    /// How long each stream runs.
    pub stream: Duration,
    pub reps: usize,
}

impl LossOpts {
    /// For CI: 0.3 s streams, one repetition.
    pub fn quick(mut self) -> Self {
        self.stream = self.stream.min(Duration::from_millis(300));
        self.reps = 1;
        self
    }
}

impl Default for LossOpts {
    fn default() -> Self {
        LossOpts {
            percents: vec![1, 2],
            size: 65536,
            mtu: Mtu::Mtu1024,
            stream: Duration::from_secs(1),
            reps: 3,
        }
    }
}

/// One stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossRun {
    pub gbps: f64,
    /// Frames the nftables rules dropped, both ways.
    pub dropped: u64,
    /// A's request packets sent again, its retransmit timer's expiries, and the
    /// sequence error NAKs it received.
    pub retransmitted: u64,
    pub timeouts: u64,
    /// Retransmissions the measured round trip's timer started (before the QP's).
    pub fast: u64,
    pub seq_naks: u64,
    /// Request packets A sent in all.
    pub sent: u64,
}

/// One repetition: the lossless stream, one per loss rate, and the lossless stream
/// again (which opens the next repetition). The lossy streams are measured against
/// the mean of the two lossless ones: this VM's rates drift within seconds.
#[derive(Debug, Clone)]
pub struct LossRep {
    pub clean: LossRun,
    pub lossy: Vec<LossRun>,
    pub clean_after: LossRun,
}

impl LossRep {
    /// The lossless goodput around the lossy streams.
    pub fn lossless_gbps(&self) -> f64 {
        (self.clean.gbps + self.clean_after.gbps) / 2.0
    }
}

#[derive(Debug, Clone)]
pub struct LossReport {
    pub opts: LossOpts,
    pub reps: Vec<LossRep>,
    pub link: String,
}

impl LossReport {
    /// Median over repetitions of lossy over lossless goodput, for the `k`th rate.
    pub fn ratio(&self, k: usize) -> f64 {
        median(
            self.reps
                .iter()
                .map(|r| r.lossy[k].gbps / r.lossless_gbps().max(1e-9))
                .collect(),
        )
    }
}

impl super::BenchReport for LossReport {
    fn table(&self) -> String {
        let mut s = format!(
            "roce-xdp bench loss: RC WRITE of {} KiB messages at IB MTU {}, {:.1} s per stream, \
             random loss each way (nftables) beside no loss, interleaved; {}\n\n",
            self.opts.size >> 10,
            self.opts.mtu.bytes(),
            self.opts.stream.as_secs_f64(),
            self.link
        );
        s.push_str(
            "rep  loss  Gbit/s  /lossless  dropped  resent (of sent)    seq NAKs  RTT timer  QP timeouts\n",
        );
        for (i, r) in self.reps.iter().enumerate() {
            let mut line = |pct: u32, x: &LossRun| {
                s.push_str(&format!(
                    "{:<4} {:>3}%  {:>6.2}  {:>9.2}  {:>7}  {:>7} ({:>8})  {:>8}  {:>9}  {:>11}\n",
                    i + 1,
                    pct,
                    x.gbps,
                    x.gbps / r.lossless_gbps().max(1e-9),
                    x.dropped,
                    x.retransmitted,
                    x.sent,
                    x.seq_naks,
                    x.fast,
                    x.timeouts
                ));
            };
            // A later repetition's opening lossless stream is the row above it.
            if i == 0 {
                line(0, &r.clean);
            }
            for (k, &p) in self.opts.percents.iter().enumerate() {
                line(p, &r.lossy[k]);
            }
            line(0, &r.clean_after);
        }
        s.push_str(
            "\n/lossless: over the mean of the lossless streams before and after the lossy ones \
             (each repetition's closing one opens the next)\n",
        );
        for (k, p) in self.opts.percents.iter().enumerate() {
            s.push_str(&format!(
                "goodput at {p}% loss each way / lossless: median {:.2}\n",
                self.ratio(k)
            ));
        }
        s
    }

    fn to_json(&self) -> serde_json::Value {
        let run = |x: &LossRun| {
            serde_json::json!({
                "gbps": x.gbps,
                "dropped": x.dropped,
                "retransmitted": x.retransmitted,
                "timeouts": x.timeouts,
                "fast_retransmits": x.fast,
                "seq_naks": x.seq_naks,
                "sent": x.sent,
            })
        };
        // A repetition's `lossless_after` is the next one's `lossless`: one stream.
        serde_json::json!({
            "bench": "loss",
            "message_size": self.opts.size,
            "ib_mtu": self.opts.mtu.bytes(),
            "stream_secs": self.opts.stream.as_secs_f64(),
            "link": self.link,
            "percents": self.opts.percents,
            "reps": self.reps.iter().map(|r| serde_json::json!({
                "lossless": run(&r.clean),
                "lossy": r.lossy.iter().map(run).collect::<Vec<_>>(),
                "lossless_after": run(&r.clean_after),
                "lossless_gbps": r.lossless_gbps(),
            })).collect::<Vec<_>>(),
            "ratios": self.opts.percents.iter().enumerate().map(|(k, p)| serde_json::json!({
                "percent": p,
                "to_lossless": self.ratio(k),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Runs `bench loss` (root: it creates three namespaces, a bridge and nftables rules).
pub fn loss(o: &LossOpts, say: &mut dyn FnMut(&str)) -> Result<LossReport, String> {
    if o.reps == 0 || o.percents.iter().any(|&p| p == 0 || p > 50) {
        return Err("--reps at least 1, loss rates 1 to 50%".into());
    }
    if !(1..=1 << 24).contains(&o.size) {
        return Err(format!("--size {}: 1 B to 16 MiB", o.size));
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let netdev_mtu = if o.mtu == Mtu::Mtu4096 { 4200 } else { 1500 };
    let br = Bridged::new("roce-loss", 24, 2, netdev_mtu)?;
    say(&format!(
        "A {} ({}), B {} ({}) behind a bridge in {}",
        br.ends[0].name, br.ips[0], br.ends[1].name, br.ips[1], br.mid.name
    ));
    let depth = ((4 << 20) / o.size).clamp(4, 64);
    let (a, b) = super::rc_connect(
        [(&br.ends[0].name, br.ips[0]), (&br.ends[1].name, br.ips[1])],
        &br.ifname,
        super::BenchLink::Xdp,
        Some(o.mtu),
        2 * o.size * depth + 8192,
        false,
    )?;
    let link = a.dev.info().link.clone();
    let run = |pct: u32| -> Result<LossRun, String> {
        br.set_loss(0, pct)?;
        br.set_loss(1, pct)?;
        let c0 = a.dev.counters().map_err(|e| e.to_string())?;
        let r = super::stream_for(&a, &b, Stream::Write, o.size, depth, o.stream)
            .map_err(|e| format!("WRITE stream at {pct}% loss: {e}"))?;
        let c1 = a.dev.counters().map_err(|e| e.to_string())?;
        let x = LossRun {
            gbps: r.gbps(),
            dropped: br.lost(0) + br.lost(1),
            retransmitted: c1.retransmitted_pkts - c0.retransmitted_pkts,
            timeouts: c1.timeouts - c0.timeouts,
            fast: c1.fast_retransmits - c0.fast_retransmits,
            seq_naks: c1.rcvd_seq_err - c0.rcvd_seq_err,
            sent: c1.sent_pkts - c0.sent_pkts,
        };
        br.set_loss(0, 0)?;
        br.set_loss(1, 0)?;
        Ok(x)
    };
    // Warm-up, not counted.
    super::stream_for(
        &a,
        &b,
        Stream::Write,
        o.size,
        depth,
        Duration::from_millis(200),
    )?;
    let mut reps = Vec::new();
    let mut clean = run(0)?;
    for rep in 0..o.reps {
        let probe = super::CoreProbe::start();
        let mut lossy = Vec::new();
        for &p in &o.percents {
            lossy.push(run(p)?);
        }
        let clean_after = run(0)?;
        let mut line = format!(
            "rep {}: lossless {:.2} Gbit/s before, {:.2} after",
            rep + 1,
            clean.gbps,
            clean_after.gbps
        );
        for (x, p) in lossy.iter().zip(&o.percents) {
            line.push_str(&format!(
                ", {p}% {:.2} ({} dropped, {} resent, {} by the RTT timer, {} timeouts)",
                x.gbps, x.dropped, x.retransmitted, x.fast, x.timeouts
            ));
        }
        line.push_str(&probe.end_clause());
        say(&line);
        reps.push(LossRep {
            clean,
            lossy,
            clean_after,
        });
        clean = clean_after;
    }
    Ok(LossReport {
        opts: o.clone(),
        reps,
        link,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lossless goodput fell from 4 to 2 Gbit/s around a repetition whose 2% stream did
    /// 1.5: that is 0.5 of the mean, where the stream before alone would say 0.375 and
    /// the one after 0.75. The next repetition opens with that 2 Gbit/s stream, which
    /// the table prints once.
    #[test]
    fn lossy_streams_are_measured_against_the_lossless_ones_on_both_sides() {
        let g = |gbps| LossRun {
            gbps,
            ..LossRun::default()
        };
        let report = LossReport {
            opts: LossOpts {
                percents: vec![2],
                reps: 2,
                ..LossOpts::default()
            },
            reps: vec![
                LossRep {
                    clean: g(4.0),
                    lossy: vec![g(1.5)],
                    clean_after: g(2.0),
                },
                LossRep {
                    clean: g(2.0),
                    lossy: vec![g(1.0)],
                    clean_after: g(2.0),
                },
            ],
            link: "sim".into(),
        };
        assert_eq!(report.ratio(0), 0.5);
        let t = super::super::BenchReport::table(&report);
        assert!(
            t.contains("2% loss each way / lossless: median 0.50"),
            "{t}"
        );
        let lossless_rows = t.lines().filter(|l| l.contains("  0%  ")).count();
        assert_eq!(lossless_rows, 3, "{t}");
        let j = super::super::BenchReport::to_json(&report);
        assert_eq!(j["reps"][0]["lossless_after"]["gbps"], 2.0);
        assert_eq!(j["reps"][0]["lossless_gbps"], 3.0);
    }
}

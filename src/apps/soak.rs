//! `roce-xdp soak`: a bounded endurance run. Many RC QPs between two engines over AF_XDP
//! on a bridge that loses frames (nftables) and engines that reorder some of what they
//! receive (the runtime's fault layer), moving mixed operations of random sizes, every
//! byte verified. It prints throughput, retransmissions and resident memory as it goes,
//! and fails if a byte is wrong, a WR fails, or memory grows after the warm-up.

use super::endpoint::{ConnectOpts, Endpoint, EndpointOpts};
use super::progress::Progress;
use super::workload;
use crate::runtime::faults::FaultConfig;
use crate::runtime::{Device, RuntimeConfig};
use crate::verbs::QpType;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What `soak` does.
#[derive(Debug, Clone)]
pub struct SoakOpts {
    pub duration: Duration,
    pub qps: usize,
    /// Percent of frames dropped each way on the bridge.
    pub loss: u32,
    /// Percent of received frames each engine's fault layer holds back.
    pub reorder: u32,
    /// Largest message.
    pub max_len: usize,
}

impl Default for SoakOpts {
    fn default() -> Self {
        SoakOpts {
            duration: Duration::from_secs(600),
            qps: 100,
            loss: 1,
            reorder: 1,
            max_len: 32 << 10,
        }
    }
}

/// The outcome.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub bytes: u64,
    pub wrs: u64,
    pub elapsed: Duration,
    pub retransmitted: u64,
    /// Resident memory after the warm-up, at its highest after it, and at the end (KiB).
    pub rss_kib: (u64, u64, u64),
}

impl SoakReport {
    /// Growth after the warm-up that fails the run: 10% and 8 MiB. What a run allocates
    /// once (QPs, memory regions, rings, queues at their high-water mark) it has by the
    /// end of the warm-up; a leak keeps growing.
    pub fn grew(&self) -> bool {
        self.rss_kib.2 > self.rss_kib.0 + self.rss_kib.0 / 10 + 8192
    }
}

/// Runs the soak, printing a line every few seconds through `say`.
pub fn soak(o: &SoakOpts, say: &mut dyn FnMut(&str)) -> Result<SoakReport, String> {
    if o.qps == 0 || o.qps > 1000 {
        return Err(format!("--qps {}: 1 to 1000", o.qps));
    }
    if o.loss > 20 || o.reorder > 20 {
        return Err("--loss and --reorder: at most 20 (%)".into());
    }
    if o.duration < Duration::from_secs(5) {
        return Err("a soak lasts at least 5 s".into());
    }
    crate::netns::available()?;
    crate::host::check_xdp_privileges()?;
    let br = crate::netns::Bridged::new("roce-soak", 30, 2, 1500)?;
    for i in 0..2 {
        if o.loss > 0 {
            br.lose(i, o.loss)?;
        }
    }
    let open = |i: usize| {
        let mut c = RuntimeConfig::xdp(&br.ifname);
        c.netns = Some(br.ends[i].name.clone());
        c.faults = (o.reorder > 0).then_some(FaultConfig {
            reorder_percent: o.reorder,
            hold: Duration::from_micros(300),
            seed: 0x50a4 + i as u64,
        });
        Device::open(c).map_err(|e| format!("engine {}: {e}", ["A", "B"][i]))
    };
    let (da, db) = (open(0)?, open(1)?);
    let mtu = da.info().port_mtu;
    let (ip_a, ip_b) = (IpAddr::V4(br.ips[0]), IpAddr::V4(br.ips[1]));
    // Queues of 128 WRs (the mixed workload keeps at most 16 outstanding): their rings
    // are first touched within the warm-up, so a page first used late is not taken
    // for growth.
    let mut eo = EndpointOpts::new(QpType::Rc, 16 * o.max_len.max(64) + 8192);
    eo.send_wr = 128;
    eo.recv_wr = 128;
    let mut pairs = Vec::new();
    for k in 0..o.qps {
        let a = Endpoint::new(da.clone(), &eo).map_err(|e| e.to_string())?;
        let b = Endpoint::new(db.clone(), &eo).map_err(|e| e.to_string())?;
        let (pa, pb) = (0xff_ff00 + k as u32, 0x100 + k as u32);
        // Timeout 12 (about 17 ms a try, 8 tries): a tail loss is recovered quickly,
        // and an engine thread kept off the CPU for a while (two cores, six busy
        // threads) does not use up the retries. 10 (4 ms) did, once in a minute.
        let mut oa = ConnectOpts::new(mtu, pa);
        oa.timeout = 12;
        let mut ob = ConnectOpts::new(mtu, pb);
        ob.timeout = 12;
        a.connect(&b.local(pb, ip_a), &oa)
            .map_err(|e| e.to_string())?;
        b.connect(&a.local(pa, ip_b), &ob)
            .map_err(|e| e.to_string())?;
        // Every page of the registered memory touched now, so that pages first touched
        // by a large message later are not taken for growth.
        for e in [&a, &b] {
            e.mem.fill(0, e.mem.len(), 0).map_err(|e| e.to_string())?;
        }
        pairs.push((a, b));
    }
    say(&format!(
        "roce-xdp soak: {} RC QPs between {} and {} over AF_XDP, {}% loss each way, {}% of \
         received frames reordered, messages up to {} KiB, for {:.0} s",
        o.qps,
        br.ips[0],
        br.ips[1],
        o.loss,
        o.reorder,
        o.max_len >> 10,
        o.duration.as_secs_f64()
    ));
    // Four workers, each cycling over its share of the QPs with bounded mixed workloads.
    let bytes = Arc::new(AtomicU64::new(0));
    let wrs = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + o.duration;
    let workers = 4.min(o.qps);
    let mut shares: Vec<Vec<(Endpoint, Endpoint)>> = (0..workers).map(|_| Vec::new()).collect();
    for (k, p) in pairs.into_iter().enumerate() {
        shares[k % workers].push(p);
    }
    let max_len = o.max_len;
    let handles: Vec<_> = shares
        .into_iter()
        .enumerate()
        .map(|(w, share)| {
            let (bytes, wrs, stop) = (bytes.clone(), wrs.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut seed = 0x50a4_0000 + (w as u64) * 1_000_000;
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    for (a, b) in &share {
                        if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                            break;
                        }
                        seed += 1;
                        let total = (4 * max_len) as u64;
                        let m =
                            workload::mixed(a, b, total, max_len, seed, &mut Progress::hidden())
                                .inspect_err(|_| stop.store(true, Ordering::SeqCst))?;
                        bytes.fetch_add(m.report.bytes, Ordering::Relaxed);
                        wrs.fetch_add(m.report.ops, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    // Progress, and memory over time.
    let warmup = (o.duration / 5).clamp(Duration::from_secs(2), Duration::from_secs(30));
    let every = if o.duration > Duration::from_secs(120) {
        10
    } else {
        5
    };
    let retx = || -> u64 {
        [&da, &db]
            .iter()
            .filter_map(|d| d.counters().ok())
            .map(|c| c.retransmitted_pkts)
            .sum()
    };
    say("   time    MiB moved   Gbit/s      WRs   retransmitted   RSS MiB");
    let (mut rss0, mut rss_max) = (0u64, 0u64);
    let mut last = (Instant::now(), 0u64);
    let mut next = start + Duration::from_secs(every);
    while Instant::now() < deadline && !stop.load(Ordering::SeqCst) && !super::interrupted() {
        std::thread::sleep(Duration::from_millis(100));
        let now = Instant::now();
        let rss = super::bench::rss_kib();
        if now >= start + warmup {
            if rss0 == 0 {
                rss0 = rss;
            }
            rss_max = rss_max.max(rss);
        }
        if now >= next {
            next += Duration::from_secs(every);
            let b = bytes.load(Ordering::Relaxed);
            let gbps = (b - last.1) as f64 * 8.0 / now.duration_since(last.0).as_secs_f64() / 1e9;
            last = (now, b);
            say(&format!(
                "{:>5.0} s {:>12.1} {:>8.2} {:>8} {:>15} {:>9.1}{}",
                now.duration_since(start).as_secs_f64(),
                b as f64 / 1048576.0,
                gbps,
                wrs.load(Ordering::Relaxed),
                retx(),
                rss as f64 / 1024.0,
                if rss0 == 0 { "  (warm-up)" } else { "" }
            ));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert("a worker thread panicked".into());
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    if super::interrupted() {
        return Err("interrupted".into());
    }
    let rss_end = super::bench::rss_kib();
    Ok(SoakReport {
        bytes: bytes.load(Ordering::Relaxed),
        wrs: wrs.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
        retransmitted: retx(),
        rss_kib: (rss0.max(1), rss_max.max(rss_end), rss_end),
    })
}

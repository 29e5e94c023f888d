//! A simulated link between two nodes, on simulated time.
//!
//! Each direction has its own [`LinkConfig`]: propagation delay with jitter, a bandwidth
//! limit (frames queue behind each other), loss, duplication, reordering (a frame held back
//! by an extra delay) and corruption (one bit flipped after the Ethernet header, which the
//! receiver's checksums must catch). Every random choice comes from one seeded [`Rng`], so
//! the same seed and the same nodes give the same run, frame for frame.
//!
//! [`Sim`] drives two nodes: it drains what they transmit, delivers frames in arrival
//! order, fires their timers, and advances time to the next event. Frame buffers are
//! recycled, so a steady flow allocates nothing per frame.

use super::Node;
use crate::rng::Rng;
use crate::time::Time;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Impairments of one direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub delay_ns: u64,
    /// Extra delay drawn uniformly from `0..jitter_ns` per frame. Jitter never reorders
    /// (a frame does not overtake the one before it, as on a real wire); `reorder` does.
    pub jitter_ns: u64,
    /// Bits per second, or 0 for unlimited.
    pub bandwidth_bps: u64,
    /// Probability a frame is dropped.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub duplicate: f64,
    /// Probability a frame is held back by `reorder_delay_ns`.
    pub reorder: f64,
    pub reorder_delay_ns: u64,
    /// Probability one bit of a frame is flipped.
    pub corrupt: f64,
    /// Frames longer than this many bytes are built by the sender in two pieces cut here
    /// (`Node::poll_transmit_parts`) and arrive in two (`Node::handle_frame_parts`), as
    /// AF_XDP chains a frame larger than one UMEM buffer; 0 keeps every frame whole.
    pub chain_at: usize,
}

impl Default for LinkConfig {
    /// A clean 10 us link of unlimited bandwidth.
    fn default() -> Self {
        LinkConfig {
            delay_ns: 10_000,
            jitter_ns: 0,
            bandwidth_bps: 0,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay_ns: 50_000,
            corrupt: 0.0,
            chain_at: 0,
        }
    }
}

impl LinkConfig {
    /// A 10 Gbit/s link that loses, duplicates, reorders and corrupts: `loss` is the loss
    /// rate, the other impairments are set to a quarter of it each.
    pub fn lossy(loss: f64) -> LinkConfig {
        LinkConfig {
            loss,
            duplicate: loss / 4.0,
            reorder: loss / 4.0,
            corrupt: loss / 4.0,
            jitter_ns: 2_000,
            bandwidth_bps: 10_000_000_000,
            ..LinkConfig::default()
        }
    }
}

/// What happened to the frames of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub sent: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub bytes: u64,
    /// Frames delivered in two pieces (`LinkConfig::chain_at`).
    pub chained: u64,
}

struct InFlight {
    arrival: Time,
    seq: u64,
    /// A pool buffer of at least `MAX_FRAME` bytes; the frame is its first `len`.
    buf: Vec<u8>,
    len: usize,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.arrival, self.seq) == (o.arrival, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.arrival, self.seq).cmp(&(o.arrival, o.seq))
    }
}

struct Direction {
    cfg: LinkConfig,
    /// Frames in arrival order (jitter never reorders them).
    fifo: VecDeque<InFlight>,
    /// Frames held back on purpose (reordered), by arrival.
    queue: BinaryHeap<Reverse<InFlight>>,
    busy_until: Time,
    /// Arrival of the last frame not deliberately reordered: later ones keep behind it.
    last_arrival: Time,
    stats: LinkStats,
}

/// Both directions of a link.
pub struct SimLink {
    dirs: [Direction; 2],
    rng: Rng,
    seq: u64,
    pool: Vec<Vec<u8>>,
    /// When set, every frame sent (before impairments) is recorded here, for a pcap.
    pub tap: Option<Vec<(Time, Vec<u8>)>>,
    /// When set, a frame of direction `dir` for which it returns true is dropped: for
    /// tests that lose one chosen packet.
    pub filter: Option<Filter>,
}

/// A test's chooser of frames to drop: `(direction, frame) -> drop?`.
pub type Filter = Box<dyn FnMut(usize, &[u8]) -> bool>;

/// Largest frame the link carries (a 9000-byte jumbo frame plus its Ethernet header).
pub const MAX_FRAME: usize = 9018;

impl SimLink {
    /// `ab` configures frames from node 0 to node 1, `ba` the other way.
    pub fn new(ab: LinkConfig, ba: LinkConfig, seed: u64) -> SimLink {
        let dir = |cfg| Direction {
            cfg,
            fifo: VecDeque::new(),
            queue: BinaryHeap::new(),
            busy_until: Time::ZERO,
            last_arrival: Time::ZERO,
            stats: LinkStats::default(),
        };
        SimLink {
            dirs: [dir(ab), dir(ba)],
            rng: Rng::new(seed),
            seq: 0,
            pool: Vec::new(),
            tap: None,
            filter: None,
        }
    }

    /// Writes what the tap recorded to a pcap file.
    pub fn write_tap(&self, path: &std::path::Path) -> std::io::Result<()> {
        let f = std::io::BufWriter::new(std::fs::File::create(path)?);
        let mut w = crate::capture::Writer::new(f).map_err(std::io::Error::other)?;
        for (t, fr) in self.tap.iter().flatten() {
            w.write(std::time::Duration::from_nanos(t.0), fr)
                .map_err(std::io::Error::other)?;
        }
        Ok(())
    }

    /// Changes one direction's impairments from now on.
    pub fn set_config(&mut self, dir: usize, cfg: LinkConfig) {
        self.dirs[dir].cfg = cfg;
    }

    pub fn stats(&self, dir: usize) -> LinkStats {
        self.dirs[dir].stats
    }

    /// A buffer of at least `MAX_FRAME` bytes from the pool (its bytes are whatever the
    /// last frame left: every user writes before it reads).
    fn buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| vec![0u8; MAX_FRAME])
    }

    /// A pool buffer holding a copy of `frame` in its first `frame.len()` bytes (grown
    /// for a frame longer than `MAX_FRAME`).
    fn copy_of(&mut self, frame: &[u8]) -> Vec<u8> {
        let mut buf = self.buffer();
        if buf.len() < frame.len() {
            buf.resize(frame.len(), 0);
        }
        buf[..frame.len()].copy_from_slice(frame);
        buf
    }

    /// Node `dir` transmits `frame` at `now`.
    pub fn send(&mut self, dir: usize, now: Time, frame: &[u8]) {
        let buf = self.copy_of(frame);
        self.carry(dir, now, buf, frame.len());
    }

    /// Node `dir` transmits the frame `fill` writes into a `MAX_FRAME`-byte buffer of
    /// the link's, returning its length (`None`: nothing to send). The frame is built
    /// where it travels, as a NIC's DMA reads the ring slot it was written in, so the
    /// engine benchmark does not count a copy the link would not make.
    /// Returns whether a frame was sent.
    pub fn send_with(
        &mut self,
        dir: usize,
        now: Time,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> bool {
        let mut buf = self.buffer();
        let Some(len) = fill(&mut buf) else {
            self.pool.push(buf);
            return false;
        };
        // A node that claims more than it was given has a bug; it is not a frame.
        assert!(
            len <= buf.len(),
            "a node sent {len} bytes from a {}-byte buffer",
            buf.len()
        );
        self.carry(dir, now, buf, len);
        true
    }

    /// Applies the direction's impairments to the frame in `buf[..len]` and queues what
    /// survives.
    fn carry(&mut self, dir: usize, now: Time, buf: Vec<u8>, len: usize) {
        let cfg = self.dirs[dir].cfg;
        let frame = &buf[..len];
        if let Some(t) = &mut self.tap {
            t.push((now, frame.to_vec()));
        }
        let d = &mut self.dirs[dir];
        d.stats.sent += 1;
        d.stats.bytes += len as u64;
        if let Some(f) = &mut self.filter
            && f(dir, frame)
        {
            self.dirs[dir].stats.dropped += 1;
            self.pool.push(buf);
            return;
        }
        let d = &mut self.dirs[dir];
        // Serialisation: a frame leaves when the previous one has.
        let start = now.max(d.busy_until);
        let tx_ns = (len as u64 * 8)
            .saturating_mul(1_000_000_000)
            .checked_div(cfg.bandwidth_bps)
            .unwrap_or(0);
        let departed = start.add_nanos(tx_ns);
        d.busy_until = departed;
        if self.rng.chance(cfg.loss) {
            self.dirs[dir].stats.dropped += 1;
            self.pool.push(buf);
            return;
        }
        let copy = if self.rng.chance(cfg.duplicate) {
            self.dirs[dir].stats.duplicated += 1;
            Some(self.copy_of(&buf[..len]))
        } else {
            None
        };
        // Each copy draws its corruption, jitter and reordering in turn (the order the
        // seeded runs of the tests were recorded with).
        self.queue_one(dir, &cfg, departed, buf, len);
        if let Some(c) = copy {
            self.queue_one(dir, &cfg, departed, c, len);
        }
    }

    /// Queues one copy of a frame that left at `departed`, after its own corruption,
    /// jitter and reordering draws. (A method rather than a loop over both copies: the
    /// iterator's drop glue cost the engine-alone bench 37 instructions a packet, and 73
    /// once an unrelated change had moved what was inlined around it.)
    fn queue_one(
        &mut self,
        dir: usize,
        cfg: &LinkConfig,
        departed: Time,
        mut buf: Vec<u8>,
        len: usize,
    ) {
        if self.rng.chance(cfg.corrupt) && len > 14 {
            let i = 14 + self.rng.below(len as u64 - 14) as usize;
            buf[i] ^= 1 << self.rng.below(8);
            self.dirs[dir].stats.corrupted += 1;
        }
        let mut arrival = departed.add_nanos(cfg.delay_ns);
        if cfg.jitter_ns > 0 {
            arrival = arrival.add_nanos(self.rng.below(cfg.jitter_ns));
        }
        self.seq += 1;
        let fl = InFlight {
            arrival,
            seq: self.seq,
            buf,
            len,
        };
        if self.rng.chance(cfg.reorder) {
            let d = &mut self.dirs[dir];
            d.stats.reordered += 1;
            d.queue.push(Reverse(InFlight {
                arrival: arrival.add_nanos(cfg.reorder_delay_ns),
                ..fl
            }));
        } else {
            let d = &mut self.dirs[dir];
            let arrival = arrival.max(d.last_arrival);
            d.last_arrival = arrival;
            d.fifo.push_back(InFlight { arrival, ..fl });
        }
    }

    /// The earliest arrival still in flight, either direction.
    pub fn next_arrival(&self) -> Option<Time> {
        self.dirs
            .iter()
            .flat_map(|d| {
                [
                    d.queue.peek().map(|f| f.0.arrival),
                    d.fifo.front().map(|f| f.arrival),
                ]
            })
            .flatten()
            .min()
    }

    /// Frames in flight.
    pub fn in_flight(&self) -> usize {
        self.dirs.iter().map(|d| d.queue.len() + d.fifo.len()).sum()
    }

    /// Hands the next frame of direction `dir` that has arrived by `now` to `f`, in two
    /// pieces when it is longer than the direction's `chain_at` (else the second is
    /// empty). Returns false when none has.
    pub fn deliver(&mut self, dir: usize, now: Time, f: impl FnOnce(&[u8], &[u8])) -> bool {
        let chain_at = self.dirs[dir].cfg.chain_at;
        let d = &mut self.dirs[dir];
        let key = |x: &InFlight| (x.arrival, x.seq);
        let from_heap = match (d.fifo.front(), d.queue.peek()) {
            (Some(a), Some(b)) => key(&b.0) < key(a),
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (None, None) => return false,
        };
        let arrival = if from_heap {
            d.queue.peek().map(|x| x.0.arrival)
        } else {
            d.fifo.front().map(|x| x.arrival)
        };
        if arrival.is_none_or(|t| t > now) {
            return false;
        }
        let fl = if from_heap {
            d.queue.pop().map(|r| r.0)
        } else {
            d.fifo.pop_front()
        };
        let Some(fl) = fl else {
            return false;
        };
        d.stats.delivered += 1;
        let frame = &fl.buf[..fl.len];
        if chain_at > 0 && fl.len > chain_at {
            d.stats.chained += 1;
            let (head, tail) = frame.split_at(chain_at);
            f(head, tail);
        } else {
            f(frame, &[]);
        }
        self.pool.push(fl.buf);
        true
    }
}

/// Two nodes joined by a [`SimLink`], on simulated time.
pub struct Sim<A: Node, B: Node> {
    pub a: A,
    pub b: B,
    pub link: SimLink,
    pub now: Time,
    /// Frames each node transmitted.
    pub transmitted: [u64; 2],
}

/// Why [`Sim::run_until`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The condition became true.
    Done,
    /// Nothing in flight and no timer pending: the condition can never become true.
    Idle,
    /// The simulated-time bound passed.
    TimeLimit,
    /// The event-count bound passed.
    StepLimit,
}

impl<A: Node, B: Node> Sim<A, B> {
    pub fn new(a: A, b: B, link: SimLink) -> Sim<A, B> {
        Sim {
            a,
            b,
            link,
            now: Time::ZERO,
            transmitted: [0; 2],
        }
    }

    /// Moves every frame the nodes want to send onto the link. A direction that chains
    /// frames (`chain_at`) has its sender build them in two pieces cut there too.
    fn transmit(&mut self) {
        let now = self.now;
        let cut = [
            self.link.dirs[0].cfg.chain_at,
            self.link.dirs[1].cfg.chain_at,
        ];
        fn poll<N: Node>(n: &mut N, now: Time, b: &mut [u8], cut: usize) -> Option<usize> {
            if cut > 0 && cut < b.len() {
                let (head, tail) = b.split_at_mut(cut);
                n.poll_transmit_parts(now, head, tail)
            } else {
                n.poll_transmit(now, b)
            }
        }
        while self
            .link
            .send_with(0, now, |b| poll(&mut self.a, now, b, cut[0]))
        {
            self.transmitted[0] += 1;
        }
        while self
            .link
            .send_with(1, now, |b| poll(&mut self.b, now, b, cut[1]))
        {
            self.transmitted[1] += 1;
        }
    }

    /// Runs one event: delivers due frames and fires due timers, or advances time to the
    /// next one. Returns false when there is nothing left to happen.
    pub fn step(&mut self) -> bool {
        self.transmit();
        let now = self.now;
        let (a, b) = (&mut self.a, &mut self.b);
        let mut did = false;
        while self
            .link
            .deliver(0, now, |h, t| b.handle_frame_parts(now, h, t))
        {
            did = true;
        }
        while self
            .link
            .deliver(1, now, |h, t| a.handle_frame_parts(now, h, t))
        {
            did = true;
        }
        if self.a.poll_timeout().is_some_and(|t| t <= now) {
            self.a.handle_timeout(now);
            did = true;
        }
        if self.b.poll_timeout().is_some_and(|t| t <= now) {
            self.b.handle_timeout(now);
            did = true;
        }
        if did {
            return true;
        }
        self.transmit();
        let next = [
            self.link.next_arrival(),
            self.a.poll_timeout(),
            self.b.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Steps until `done` holds, nothing can happen any more, simulated time passes
    /// `max_time`, or `max_steps` events ran: every run is bounded.
    pub fn run_until(
        &mut self,
        max_time: Time,
        max_steps: u64,
        mut done: impl FnMut(&mut A, &mut B) -> bool,
    ) -> Stop {
        for _ in 0..max_steps {
            if done(&mut self.a, &mut self.b) {
                return Stop::Done;
            }
            if self.now > max_time {
                return Stop::TimeLimit;
            }
            if !self.step() {
                return if done(&mut self.a, &mut self.b) {
                    Stop::Done
                } else {
                    Stop::Idle
                };
            }
        }
        Stop::StepLimit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that sends `n` numbered frames and records what it receives.
    struct Echo {
        to_send: u32,
        got: Vec<u32>,
        timer: Option<Time>,
        fired: u32,
    }

    impl Node for Echo {
        fn handle_frame(&mut self, _now: Time, frame: &[u8]) {
            self.got.push(u32::from_be_bytes([
                frame[14], frame[15], frame[16], frame[17],
            ]));
        }
        fn handle_timeout(&mut self, _now: Time) {
            self.timer = None;
            self.fired += 1;
        }
        fn poll_transmit(&mut self, _now: Time, buf: &mut [u8]) -> Option<usize> {
            if self.to_send == 0 {
                return None;
            }
            self.to_send -= 1;
            buf[..64].fill(0);
            buf[14..18].copy_from_slice(&self.to_send.to_be_bytes());
            Some(64)
        }
        fn poll_timeout(&self) -> Option<Time> {
            self.timer
        }
    }

    fn echo(n: u32) -> Echo {
        Echo {
            to_send: n,
            got: vec![],
            timer: Some(Time(1_000_000)),
            fired: 0,
        }
    }

    fn run(cfg: LinkConfig, seed: u64) -> (Vec<u32>, LinkStats) {
        let link = SimLink::new(cfg, LinkConfig::default(), seed);
        let mut s = Sim::new(echo(1000), echo(0), link);
        assert_eq!(
            s.run_until(Time(1_000_000_000), 100_000, |_, _| false),
            Stop::Idle
        );
        assert_eq!(s.a.fired, 1);
        (s.b.got.clone(), s.link.stats(0))
    }

    #[test]
    fn clean_link_delivers_in_order() {
        let (got, st) = run(LinkConfig::default(), 1);
        assert_eq!(got, (0..1000).rev().collect::<Vec<_>>());
        assert_eq!(st.delivered, 1000);
    }

    #[test]
    fn impairments_happen_at_their_rates_and_reproduce() {
        let cfg = LinkConfig {
            loss: 0.1,
            duplicate: 0.05,
            reorder: 0.05,
            corrupt: 0.05,
            jitter_ns: 1000,
            ..LinkConfig::default()
        };
        let (got, st) = run(cfg, 7);
        assert!((60..140).contains(&st.dropped), "{st:?}");
        assert!(
            st.duplicated > 20 && st.reordered > 20 && st.corrupted > 20,
            "{st:?}"
        );
        assert_eq!(got.len() as u64, st.delivered);
        let again = run(cfg, 7);
        assert_eq!(again.0, got, "same seed, same run");
        assert_ne!(run(cfg, 8).0, got);
    }

    #[test]
    fn bandwidth_spaces_frames() {
        let cfg = LinkConfig {
            bandwidth_bps: 512_000_000, // 64 bytes = 1 us
            ..LinkConfig::default()
        };
        let link = SimLink::new(cfg, LinkConfig::default(), 1);
        let mut s = Sim::new(echo(100), echo(0), link);
        s.run_until(Time(1_000_000_000), 100_000, |_, b| b.got.len() == 100);
        // 100 frames of 1 us each after a 10 us delay.
        assert_eq!(s.now, Time(10_000 + 100_000));
    }
}

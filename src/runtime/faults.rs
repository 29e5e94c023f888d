//! Fault injection of the runtime's own, between the link and the engine, on the
//! receive side: frames are held back and delivered after frames that arrived later
//! (reordering) and late (delay), as a network with several paths would deliver them.
//! The kernel has no netem here and nftables cannot reorder; this layer can, on any
//! link. Off unless [`RuntimeConfig::faults`](super::RuntimeConfig) asks for it; seeded,
//! so a run can be repeated.

use crate::rng::Rng;
use crate::time::Time;
use std::collections::VecDeque;
use std::time::Duration;

/// What the fault layer does to received frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultConfig {
    /// Percent (0-100) of received frames held back.
    pub reorder_percent: u32,
    /// How long a held frame waits; frames that arrive meanwhile overtake it.
    pub hold: Duration,
    pub seed: u64,
}

/// Most frames held at once; beyond it frames pass straight through, so a burst cannot
/// make the layer's memory grow without bound.
const MAX_HELD: usize = 4096;

pub(crate) struct Faults {
    cfg: FaultConfig,
    rng: Rng,
    held: VecDeque<(Time, Vec<u8>)>,
    /// Frames held back so far.
    pub reordered: u64,
}

impl Faults {
    pub fn new(cfg: FaultConfig) -> Faults {
        Faults {
            cfg,
            rng: Rng::new(cfg.seed),
            held: VecDeque::new(),
            reordered: 0,
        }
    }

    /// Takes `f` (true: held, the caller must not deliver it now).
    pub fn hold(&mut self, now: Time, f: crate::wire::Pieces<'_>) -> bool {
        if self.held.len() >= MAX_HELD || self.rng.next_u32() % 100 >= self.cfg.reorder_percent {
            return false;
        }
        let at = now.add_nanos(self.cfg.hold.as_nanos() as u64);
        self.held.push_back((at, f.to_vec()));
        self.reordered += 1;
        true
    }

    /// Hands every held frame whose time came to `deliver`, oldest first; how many.
    pub fn release(&mut self, now: Time, mut deliver: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while let Some((at, _)) = self.held.front()
            && *at <= now
        {
            let (_, f) = self.held.pop_front().unwrap_or_else(|| unreachable!());
            deliver(&f);
            n += 1;
        }
        n
    }

    /// When the next held frame is due.
    pub fn next_due(&self) -> Option<Time> {
        self.held.front().map(|(t, _)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_frames_are_overtaken_and_released_in_time() {
        let mut f = Faults::new(FaultConfig {
            reorder_percent: 50,
            hold: Duration::from_micros(100),
            seed: 1,
        });
        let mut seen = Vec::new();
        for i in 0..1000u32 {
            let t = Time(u64::from(i) * 1000);
            if !f.hold(t, crate::wire::Pieces::one(&i.to_ne_bytes())) {
                seen.push(i);
            }
            f.release(t, |b| seen.push(u32::from_ne_bytes(b.try_into().unwrap())));
        }
        f.release(Time(u64::MAX), |b| {
            seen.push(u32::from_ne_bytes(b.try_into().unwrap()))
        });
        // Every frame exactly once, about half of them late.
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert!((400..600).contains(&f.reordered), "{}", f.reordered);
        let late = seen.windows(2).filter(|w| w[1] < w[0]).count();
        assert!(late > 100, "{late}");
    }
}

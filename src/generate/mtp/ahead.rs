//! Whether the next MTP cycle is built while a verify runs (docs/MODEL.md §4.9). Building ahead
//! fills the device's idle time while the host builds a graph, and wastes a cycle of device work
//! each time the guess (every draft kept) is wrong: it pays on a host-bound GPU with drafts that
//! are mostly kept, and loses on a CPU, where the device is the host. Rather than guess which
//! machine this is, [`AheadChoice`] measures: cycles run with and without it in turn, the one that
//! costs less per token is kept for a while, and then both are tried again.

use crate::generate::options::CycleAhead;

pub struct AheadChoice {
    mode: CycleAhead,
    phase: Phase,
    /// Time and tokens of the current trial's cycles, per way (index: built ahead or not).
    spent: [(f64, usize); 2],
    /// What the last judgement found, ms per token (off, on).
    pub last: Option<(f64, f64)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Cycles left in a trial of one way.
    Trial { ahead: bool, left: usize },
    /// Cycles left before trying both ways again.
    Keep { ahead: bool, left: usize },
}

impl AheadChoice {
    /// Cycles in one way's trial; the first of them is not counted (it pays for, or profits from,
    /// the way before it).
    pub const TRIAL: usize = 12;
    /// Cycles the faster way is kept before the next trials.
    pub const KEEP: usize = 192;
    /// Building ahead is kept only when it costs at least this much less per token: within it the
    /// ways are a wash, and the plainer one wins.
    pub const MARGIN: f64 = 0.03;

    pub fn new(mode: CycleAhead) -> AheadChoice {
        AheadChoice { mode, phase: Phase::Trial { ahead: true, left: Self::TRIAL }, spent: [(0.0, 0); 2], last: None }
    }

    /// Whether the next cycle builds the one after it.
    pub fn ahead(&self) -> bool {
        match self.mode {
            CycleAhead::Off => false,
            CycleAhead::Always => true,
            CycleAhead::Judged => match self.phase {
                Phase::Trial { ahead, .. } | Phase::Keep { ahead, .. } => ahead,
            },
        }
    }

    /// After a cycle that took `ms` (from the previous step's return) and emitted `tokens`.
    pub fn after_cycle(&mut self, ms: f64, tokens: usize) {
        if self.mode != CycleAhead::Judged {
            return;
        }
        self.phase = match self.phase {
            Phase::Trial { ahead, left } => {
                if left < Self::TRIAL {
                    let s = &mut self.spent[usize::from(ahead)];
                    *s = (s.0 + ms, s.1 + tokens);
                }
                match (left, ahead) {
                    (1, true) => Phase::Trial { ahead: false, left: Self::TRIAL },
                    (1, false) => Phase::Keep { ahead: self.judge(), left: Self::KEEP },
                    _ => Phase::Trial { ahead, left: left - 1 },
                }
            }
            Phase::Keep { ahead, left } if left > 1 => Phase::Keep { ahead, left: left - 1 },
            Phase::Keep { .. } => Phase::Trial { ahead: true, left: Self::TRIAL },
        };
    }

    /// Whether building ahead won the trials just run (and the trials' sums cleared).
    fn judge(&mut self) -> bool {
        let per_token = |(ms, tokens): (f64, usize)| (tokens > 0).then(|| ms / tokens as f64);
        let [off, on] = std::mem::take(&mut self.spent).map(per_token);
        match (off, on) {
            (Some(off), Some(on)) => {
                self.last = Some((off, on));
                on < off * (1.0 - Self::MARGIN)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `cycles` cycles whose cost per token is `on` or `off` ms as the choice stands; returns how
    /// many were built ahead.
    fn run(choice: &mut AheadChoice, cycles: usize, off: f64, on: f64) -> usize {
        let mut built = 0;
        for _ in 0..cycles {
            let ahead = choice.ahead();
            built += usize::from(ahead);
            choice.after_cycle(3.0 * if ahead { on } else { off }, 3);
        }
        built
    }

    #[test]
    fn the_cheaper_way_is_kept_and_both_are_tried_again() {
        let t = AheadChoice::TRIAL;
        // Ahead costs less: after both trials it is kept for the whole keep.
        let mut c = AheadChoice::new(CycleAhead::Judged);
        assert_eq!(run(&mut c, 2 * t, 2.0, 1.0), t, "one trial each way");
        assert_eq!(c.last, Some((2.0, 1.0)));
        assert_eq!(run(&mut c, AheadChoice::KEEP, 2.0, 1.0), AheadChoice::KEEP);
        // Then the machine changes (say, the sequence joins a busy device): the next trials find it.
        assert_eq!(run(&mut c, 2 * t, 1.0, 2.0), t);
        assert_eq!(run(&mut c, AheadChoice::KEEP, 1.0, 2.0), 0, "building ahead lost: off for the keep");
        // Within the margin the plainer way wins.
        let mut c = AheadChoice::new(CycleAhead::Judged);
        run(&mut c, 2 * t, 1.0, 0.99);
        assert!(!c.ahead());
        // Forced either way, nothing is judged.
        let mut c = AheadChoice::new(CycleAhead::Always);
        assert_eq!(run(&mut c, 300, 1.0, 5.0), 300);
        let mut c = AheadChoice::new(CycleAhead::Off);
        assert_eq!(run(&mut c, 300, 5.0, 1.0), 0);
    }

    /// The first cycle of a trial is not counted: it pays for the way before it.
    #[test]
    fn a_trials_first_cycle_is_not_counted() {
        let mut c = AheadChoice::new(CycleAhead::Judged);
        // The first cycle of each trial is wildly off; the rest say ahead is cheaper.
        for i in 0..2 * AheadChoice::TRIAL {
            let ahead = c.ahead();
            let ms = if i % AheadChoice::TRIAL == 0 {
                1000.0
            } else if ahead {
                1.0
            } else {
                2.0
            };
            c.after_cycle(ms, 1);
        }
        assert_eq!(c.last, Some((2.0, 1.0)));
        assert!(c.ahead());
    }
}

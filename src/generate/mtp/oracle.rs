//! Oracle drafts, for pricing MTP at any acceptance on any model (random weights included): the
//! head runs as usual, but the tokens sent to verify come from a known continuation (the plain
//! greedy output of the same prompt), each the right one with probability `acceptance` and a
//! wrong one otherwise. Verify, acceptance and rollback then do their real work.

/// Where the drafts come from in an oracle run.
#[derive(Debug, Clone, PartialEq)]
pub struct Oracle {
    /// The plain greedy continuation of the prompt: `continuation[0]` is the first generated token.
    pub continuation: Vec<u32>,
    /// Probability that each draft is the right token, 0..=1.
    pub acceptance: f64,
    pub seed: u64,
}

/// Draws the oracle's drafts.
pub(super) struct OracleDrafts {
    oracle: Oracle,
    vocab: u32,
    state: u64,
}

impl OracleDrafts {
    pub fn new(oracle: &Oracle, vocab: u32) -> OracleDrafts {
        OracleDrafts { oracle: oracle.clone(), vocab: vocab.max(2), state: oracle.seed }
    }

    /// The `k` drafts after `emitted` tokens: draft j stands for `continuation[emitted + j]`. Past the
    /// continuation's end there is no right token to give: token 0 stands in.
    pub fn drafts(&mut self, emitted: usize, k: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(k);
        for j in 0..k {
            out.push(match self.oracle.continuation.get(emitted + j).copied() {
                Some(right) if self.uniform() < self.oracle.acceptance => right,
                Some(right) => (right + 1) % self.vocab,
                None => 0,
            });
        }
        out
    }

    /// A uniform draw in [0, 1) (splitmix64: a fixed, seedable stream, no dependency for one bench).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_are_right_with_the_asked_probability() {
        let continuation: Vec<u32> = (0..20_000).map(|i| (i * 7 % 100) as u32).collect();
        for p in [0.0, 0.3, 0.8, 1.0] {
            let oracle = Oracle { continuation: continuation.clone(), acceptance: p, seed: 9 };
            let mut o = OracleDrafts::new(&oracle, 100);
            let (mut right, mut n) = (0, 0);
            for emitted in (0..continuation.len() - 4).step_by(4) {
                for (j, d) in o.drafts(emitted, 4).into_iter().enumerate() {
                    right += usize::from(d == continuation[emitted + j]);
                    n += 1;
                }
            }
            let rate = right as f64 / n as f64;
            // 20,000 draws: the standard error is at most 0.0036; 0.02 is over five of them.
            assert!((rate - p).abs() < 0.02, "p {p}: {rate}");
        }
        // Past the end there is nothing right to give.
        let oracle = Oracle { continuation: vec![5, 6], acceptance: 1.0, seed: 1 };
        assert_eq!(OracleDrafts::new(&oracle, 10).drafts(1, 3), vec![6, 0, 0]);
    }
}

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
}

impl OracleDrafts {
    pub fn new(oracle: &Oracle, vocab: u32) -> OracleDrafts {
        OracleDrafts { oracle: oracle.clone(), vocab: vocab.max(2) }
    }

    /// The `k` drafts after `emitted` tokens: draft j stands for `continuation[emitted + j]`. Past the
    /// continuation's end there is no right token to give: token 0 stands in. Each position's draw
    /// depends on the seed and the position alone, so a cycle built ahead and thrown away changes
    /// no later draw.
    pub fn drafts(&self, emitted: usize, k: usize) -> Vec<u32> {
        (emitted..emitted + k)
            .map(|at| match self.oracle.continuation.get(at).copied() {
                Some(right) if self.uniform(at) < self.oracle.acceptance => right,
                Some(right) => (right + 1) % self.vocab,
                None => 0,
            })
            .collect()
    }

    /// A uniform draw in [0, 1) for position `at` (splitmix64's mix of the seed's stream at that
    /// index: fixed and seedable, no dependency for one bench).
    fn uniform(&self, at: usize) -> f64 {
        let mut z = self.oracle.seed.wrapping_add((at as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
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
            let o = OracleDrafts::new(&oracle, 100);
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
        // A position's draw is its own: the same whatever was drawn before (a cycle built ahead and
        // thrown away changes nothing), and a cycle's drafts are its positions' single draws.
        let oracle = Oracle { continuation: continuation.clone(), acceptance: 0.5, seed: 4 };
        let (a, b) = (OracleDrafts::new(&oracle, 100), OracleDrafts::new(&oracle, 100));
        let first = a.drafts(100, 6);
        b.drafts(90, 40);
        assert_eq!(b.drafts(100, 6), first);
        assert_eq!([a.drafts(100, 2), a.drafts(102, 4)].concat(), first);
        // Past the end there is nothing right to give.
        let oracle = Oracle { continuation: vec![5, 6], acceptance: 1.0, seed: 1 };
        assert_eq!(OracleDrafts::new(&oracle, 10).drafts(1, 3), vec![6, 0, 0]);
    }
}

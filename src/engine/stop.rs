//! Stop sequences over streamed text: text is released as soon as it can no longer be the start of a
//! stop sequence, and a matched stop sequence (with everything after it) never reaches the caller.

/// Watches streamed text for the first occurrence of any stop sequence.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text seen but not yet released: the longest tail that could still begin a stop sequence.
    pending: String,
    matched: Option<String>,
}

impl StopMatcher {
    /// Empty stop sequences are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> Self {
        let stops = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        StopMatcher { stops, pending: String::new(), matched: None }
    }

    /// The stop sequence that ended the text, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds new text; returns the text that is now safe to release.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return std::mem::take(&mut self.pending);
        }
        let first =
            self.stops.iter().filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s))).min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let released = self.pending[..at].to_owned();
            self.matched = Some(stop.clone());
            self.pending.clear();
            return released;
        }
        let cut = self.pending.len() - self.held_len();
        self.pending.drain(..cut).collect()
    }

    /// The end of the text: releases what was held back (no stop sequence can complete any more).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest tail of `pending` that is a proper prefix of some stop sequence.
    fn held_len(&self) -> usize {
        let mut held = 0;
        for stop in &self.stops {
            // Tails from the longest down; the first that fits is this stop's longest.
            if let Some((at, _)) = self
                .pending
                .char_indices()
                .find(|&(at, _)| self.pending.len() - at < stop.len() && stop.starts_with(&self.pending[at..]))
            {
                held = held.max(self.pending.len() - at);
            }
        }
        held
    }
}

#[cfg(test)]
mod tests;

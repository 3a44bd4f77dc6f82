//! Who waits for a generation: its events channel, its cancel handle, and its text so far (stop
//! sequences held back and cut, token bytes decoded, log-probabilities spelled).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::super::stop::StopMatcher;
use super::super::{
    cause, lock, CancelHandle, Completion, EngineError, ErrorMessage, Event, Logprob, Result, TokenText, WeakEngine,
};
use super::{Prepared, Served, Shared, Slot};
use crate::chat::Tokenizer;
use crate::generate::{Control, FinishReason, Output, Progress, TokenLogprob};

/// Running statistics ride along with text deltas at most this often.
const RUNNING_STATS_EVERY: Duration = Duration::from_millis(250);

/// What each token id spells, for log-probabilities (the tokenizer reads its table once).
fn spelling(tokenizer: &Tokenizer, width: usize) -> Vec<Vec<u8>> {
    let mut bytes = tokenizer.token_bytes(width).unwrap_or_default();
    for b in &mut bytes {
        // Special tokens carry llguidance's marker byte first.
        if b.first() == Some(&0xff) {
            b.remove(0);
        }
    }
    bytes
}

fn token_text(table: &[Vec<u8>], id: u32) -> TokenText {
    let bytes = table.get(id as usize).cloned().unwrap_or_default();
    TokenText { text: String::from_utf8_lossy(&bytes).into_owned(), bytes }
}

fn with_text(table: &[Vec<u8>], l: &TokenLogprob) -> Logprob {
    Logprob {
        token: token_text(table, l.token),
        logprob: l.logprob,
        top: l.top.iter().map(|&(t, lp)| (token_text(table, t), lp)).collect(),
    }
}

/// Who waits for a generation, and what its text has been so far: stop sequences held back and
/// cut, token bytes decoded to text, log-probabilities spelled.
pub(super) struct Stream<'t> {
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) cancel: CancelHandle,
    decoder: crate::chat::StreamDecoder<'t>,
    stopper: StopMatcher,
    text: String,
    kept: Vec<u32>,
    decode_error: Option<String>,
    stats_sent: Option<Instant>,
    table: Vec<Vec<u8>>,
    logprobs: Vec<Logprob>,
    request: u64,
}

impl<'t> Stream<'t> {
    /// A request starts running: counted as running, cancellable by unload, told so (`Started`).
    pub(super) fn running(
        served: Served<'t>,
        job: &Prepared,
        events: mpsc::UnboundedSender<Event>,
        cancel: CancelHandle,
        shared: &Shared,
    ) -> Stream<'t> {
        shared.running.fetch_add(1, Ordering::SeqCst);
        lock(&shared.current).push((job.id, cancel.clone()));
        let _ = events.send(Event::Started);
        let table = if job.opts.logprobs.is_some() {
            spelling(served.tokenizer, served.model.config.text.vocab_size.max(0) as usize)
        } else {
            Vec::new()
        };
        Stream::new(served.tokenizer, job, events, cancel, table)
    }

    pub(super) fn new(
        tokenizer: &'t Tokenizer,
        job: &Prepared,
        events: mpsc::UnboundedSender<Event>,
        cancel: CancelHandle,
        table: Vec<Vec<u8>>,
    ) -> Stream<'t> {
        Stream {
            events,
            cancel,
            decoder: tokenizer.stream_decoder(true),
            stopper: StopMatcher::new(&job.stop),
            text: String::new(),
            kept: Vec::new(),
            decode_error: None,
            stats_sent: None,
            table,
            logprobs: Vec::new(),
            request: job.id,
        }
    }

    /// Streams one step's tokens as a text delta; says whether the generation goes on.
    pub(super) fn progress(&mut self, model: &str, p: Progress<'_>, engine: &WeakEngine) -> Control {
        let mut delta = String::new();
        let mut ids = Vec::new();
        for &t in p.new_tokens {
            if self.stopper.matched().is_some() || self.decode_error.is_some() {
                break;
            }
            ids.push(t);
            match self.decoder.step(t) {
                Ok(Some(piece)) => delta.push_str(&self.stopper.push(&piece)),
                Ok(None) => {}
                Err(e) => self.decode_error = Some(e.to_string()),
            }
        }
        self.kept.extend_from_slice(&ids);
        self.text.push_str(&delta);
        let logprobs: Vec<Logprob> = p.logprobs.iter().take(ids.len()).map(|l| with_text(&self.table, l)).collect();
        self.logprobs.extend(logprobs.iter().cloned());
        let stats = if self.stats_sent.is_none_or(|t| t.elapsed() >= RUNNING_STATS_EVERY) {
            self.stats_sent = Some(Instant::now());
            Some(p.stats.clone())
        } else {
            None
        };
        let events = &self.events;
        let gone = !ids.is_empty() && events.send(Event::Delta { text: delta, tokens: ids, stats, logprobs }).is_err();
        if engine.with(|e| e.inner.live.progress(model, self.request, p.stats)) == Some(true) {
            engine.with(|e| e.publish());
        }
        let stop = gone
            || events.is_closed()
            || self.cancel.is_cancelled()
            || self.stopper.matched().is_some()
            || self.decode_error.is_some();
        if stop {
            Control::Stop
        } else {
            Control::Continue
        }
    }

    /// No longer running: out of the worker's running count and cancel list.
    pub(super) fn leave(&self, request: u64, shared: &Shared) {
        shared.running.fetch_sub(1, Ordering::SeqCst);
        lock(&shared.current).retain(|(id, _)| *id != request);
    }

    /// Tells the caller how the generation ended (its completion, or `outcome`'s error) and the live
    /// statistics; the queue place is given back first.
    pub(super) fn end(mut self, model: &str, outcome: Result<Output>, slot: Slot, engine: &WeakEngine) {
        let event = match outcome.and_then(|out| self.complete(out)) {
            Ok(done) => {
                engine.with(|e| e.inner.live.finished(model, self.request, done.finish, &done.stats));
                Event::Done(done)
            }
            Err(e) => {
                tracing::warn!(model = %model, request = self.request, "generation failed: {}", e.message());
                engine.with(|en| en.inner.live.abandoned(model, self.request));
                Event::Failed(e)
            }
        };
        drop(slot);
        let _ = self.events.send(event);
        engine.with(|e| e.publish());
    }

    /// The generation's end: the decoder's and stop matcher's held-back text, and the completion.
    pub(super) fn complete(&mut self, out: Output) -> Result<Completion> {
        if let Some(message) = self.decode_error.take() {
            return Err(EngineError::Generate(cause(ErrorMessage(format!(
                "cannot decode the generated tokens: {message}"
            )))));
        }
        let mut tail = String::new();
        if self.stopper.matched().is_none() {
            let rest = self.decoder.flush().map_err(|e| {
                EngineError::Generate(cause(ErrorMessage(format!("cannot decode the generated tokens: {e}"))))
            })?;
            if let Some(rest) = rest {
                tail.push_str(&self.stopper.push(&rest));
            }
            tail.push_str(&self.stopper.finish());
        }
        if !tail.is_empty() {
            let _ = self.events.send(Event::Delta {
                text: tail.clone(),
                tokens: Vec::new(),
                stats: None,
                logprobs: Vec::new(),
            });
            self.text.push_str(&tail);
        }
        let stop = self.stopper.matched().map(str::to_owned);
        let finish = if stop.is_some() { FinishReason::Stop } else { out.finish };
        let mut stats = out.stats;
        stats.completion_tokens = self.kept.len();
        let text = std::mem::take(&mut self.text);
        let tokens = std::mem::take(&mut self.kept);
        let logprobs = std::mem::take(&mut self.logprobs);
        Ok(Completion { text, tokens, stats, finish, stop, logprobs })
    }
}

//! The sampled sequences kept for `stable_reinforce`, and the provenance of training data that
//! names them.
//!
//! A sample request with `record_stability_info` keeps each of its sequences under the id the
//! submit answer gave it (`sample_sequence_ids`): the prompt, the sampled tokens and the
//! sampler's logprob of each. A `stable_reinforce` datum says, run by run, which sequence each
//! of its target tokens came from (`loss_fn_input_spans`); [`SequenceRecords::resolve`] checks
//! every sampled run against the record (the same tokens, in the same session) and puts the
//! sampler's own logprobs in the datum's `logprobs`, so the loss's importance ratio is the
//! server's, whatever the client copied.
//!
//! Records belong to their tenant and to the client session that sampled them (another's is
//! answered as unknown), live a day after their last use, and are kept in memory: a restarted
//! server has none (a `stable_reinforce` step then names unknown sequences), and a tenant keeps
//! at most [`MAX_PER_TENANT`] records and [`MAX_BYTES_PER_TENANT`] of their tokens and
//! logprobs, the oldest going first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::api::{
    ApiError, Datum, ForwardBackwardInput, LossInput, SampleResponse, SamplerId, SequenceId,
    SessionId, SpanSource, TenantId,
};
use crate::store::unix_now;

/// The loss that reads provenance.
pub const STABLE_REINFORCE: &str = "stable_reinforce";
/// Seconds a record lives after it was made or last named by a training request.
const TTL_SECONDS: i64 = 86_400;
/// Records one tenant keeps at most.
pub const MAX_PER_TENANT: usize = 65_536;
/// Bytes of records (prompts, tokens, logprobs) one tenant keeps at most: long prompts sampled
/// many times would otherwise fill memory within the count.
pub const MAX_BYTES_PER_TENANT: usize = 256 << 20;

struct Record {
    tenant: TenantId,
    /// The client session of the sampler that made it.
    session: String,
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// Unix seconds of its making or its last use.
    used_at: AtomicI64,
}

impl Record {
    /// What it holds, as counted against its tenant's [`MAX_BYTES_PER_TENANT`].
    fn bytes(&self) -> usize {
        4 * (self.prompt.len() + self.tokens.len() + self.logprobs.len())
    }

    fn live(&self, now: i64) -> bool {
        self.used_at.load(Ordering::Relaxed) + TTL_SECONDS > now
    }
}

#[derive(Default)]
struct Kept {
    records: HashMap<SequenceId, Arc<Record>>,
    /// Each tenant's ids, oldest first.
    order: HashMap<TenantId, VecDeque<SequenceId>>,
    /// Each tenant's records' bytes.
    bytes: HashMap<TenantId, usize>,
}

/// Every tenant's recorded sequences.
#[derive(Default)]
pub struct SequenceRecords {
    kept: Mutex<Kept>,
}

impl SequenceRecords {
    fn lock(&self) -> MutexGuard<'_, Kept> {
        // Every change is one insert or remove: the maps stay consistent across a panic.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep the sequences of `response`, sampled by `sampler` from `prompt`, under `ids`.
    pub fn record(
        &self,
        tenant: &TenantId,
        sampler: &SamplerId,
        prompt: &[u32],
        ids: &[SequenceId],
        response: &SampleResponse,
    ) {
        let now = unix_now();
        let mut kept = self.lock();
        let Kept {
            records,
            order,
            bytes,
        } = &mut *kept;
        let held = bytes.entry(tenant.clone()).or_default();
        for (id, sequence) in ids.iter().zip(&response.sequences) {
            let record = Record {
                tenant: tenant.clone(),
                session: sampler.session().to_string(),
                prompt: prompt.to_vec(),
                tokens: sequence.tokens.clone(),
                logprobs: sequence.logprobs.clone(),
                used_at: AtomicI64::new(now),
            };
            *held = held.saturating_add(record.bytes());
            match records.insert(id.clone(), Arc::new(record)) {
                Some(replaced) => *held = held.saturating_sub(replaced.bytes()),
                None => order
                    .entry(tenant.clone())
                    .or_default()
                    .push_back(id.clone()),
            }
        }
        let Some(mine) = order.get_mut(tenant) else {
            return;
        };
        while let Some(oldest) = mine.front() {
            let stale = records.get(oldest).is_none_or(|r| !r.live(now));
            if !stale && mine.len() <= MAX_PER_TENANT && *held <= MAX_BYTES_PER_TENANT {
                break;
            }
            if let Some(removed) = records.remove(oldest) {
                *held = held.saturating_sub(removed.bytes());
            }
            mine.pop_front();
        }
    }

    /// The record `id` if it is `tenant`'s, of `session`, and live.
    fn get(&self, tenant: &TenantId, session: &SessionId, id: &SequenceId) -> Option<Arc<Record>> {
        let record = self.lock().records.get(id).cloned()?;
        let yours = &record.tenant == tenant && record.session == session.as_str();
        (yours && record.live(unix_now())).then_some(record)
    }

    /// `input` with each datum's `logprobs` taken from the records its provenance names, when
    /// its loss reads provenance (`stable_reinforce`); `None` for other losses. A datum without
    /// provenance, a run past its sequence's tokens, a sampled token that is not the recorded
    /// one, or a sequence unknown to `session` is refused by name.
    pub fn resolve(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        input: &ForwardBackwardInput,
    ) -> Result<Option<ForwardBackwardInput>, ApiError> {
        if input.loss_fn != STABLE_REINFORCE {
            return Ok(None);
        }
        let mut resolved = input.clone();
        for (i, datum) in resolved.data.iter_mut().enumerate() {
            self.resolve_datum(tenant, session, datum)
                .map_err(|e| ApiError::new(e.kind, format!("datum {i}: {}", e.message)))?;
        }
        Ok(Some(resolved))
    }

    fn resolve_datum(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        datum: &mut Datum,
    ) -> Result<(), ApiError> {
        let spans = datum.loss_fn_input_spans.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "stable_reinforce needs the provenance of every datum (loss_fn_input_spans): \
                 sample with record_stability_info and name each sequence_id \
                 (Datum.with_provenance)",
            )
        })?;
        let Some(targets) = datum.target_tokens().map(<[i64]>::to_vec) else {
            // The datum's own check names what is wrong with it.
            return Ok(());
        };
        let mut logprobs = match datum.floats(LossInput::Logprobs) {
            Some(values) if values.len() == targets.len() => values.to_vec(),
            _ => vec![0.0; targets.len()],
        };
        let mut position = 0;
        for span in spans {
            let record = self.get(tenant, session, &span.sequence).ok_or_else(|| {
                ApiError::not_found(format!(
                    "sequence {} (sample it with record_stability_info in this session; \
                     sequences are kept a day after their last use)",
                    span.sequence
                ))
            })?;
            let (source, name) = match span.source {
                SpanSource::Prompt => (&record.prompt, "prompt"),
                SpanSource::Sampled => (&record.tokens, "sampled"),
            };
            let end = span.offset.checked_add(span.length);
            if end.is_none_or(|end| end > source.len()) {
                return Err(ApiError::invalid(format!(
                    "a run of {} tokens from {name} token {} of sequence {} passes its {} {name} tokens",
                    span.length,
                    span.offset,
                    span.sequence,
                    source.len()
                )));
            }
            if position + span.length > targets.len() {
                return Err(ApiError::invalid(format!(
                    "loss_fn_input_spans cover more than its {} target tokens",
                    targets.len()
                )));
            }
            if span.source == SpanSource::Sampled {
                for k in 0..span.length {
                    let (at, from) = (position + k, span.offset + k);
                    if targets[at] != i64::from(record.tokens[from]) {
                        return Err(ApiError::invalid(format!(
                            "target {at} is token {}, but sampled token {from} of sequence {} is {}",
                            targets[at], span.sequence, record.tokens[from]
                        )));
                    }
                    logprobs[at] = record.logprobs[from];
                }
            }
            record.used_at.store(unix_now(), Ordering::Relaxed);
            position += span.length;
        }
        if position != targets.len() {
            return Err(ApiError::invalid(format!(
                "loss_fn_input_spans cover {position} of its {} target tokens; they must tile them",
                targets.len()
            )));
        }
        *datum = std::mem::take(datum).with(LossInput::Logprobs, logprobs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::{ModelInput, ProvenanceSpan, SampledSequence, StopReason, TensorData};

    fn response(tokens: Vec<u32>, logprobs: Vec<f32>) -> SampleResponse {
        SampleResponse {
            sequences: vec![SampledSequence {
                stop_reason: StopReason::Length,
                tokens,
                logprobs,
                topk_logprobs: None,
            }],
            prompt_logprobs: None,
            topk_prompt_logprobs: None,
            target_prompt_logprobs: None,
            prompt_alt_tokens: None,
            prompt_cache_hit_tokens: 0,
        }
    }

    fn datum(targets: Vec<i64>, spans: Vec<ProvenanceSpan>) -> Datum {
        Datum {
            model_input: ModelInput::from_tokens(vec![1; targets.len()]),
            loss_fn_inputs: BTreeMap::from([
                ("target_tokens".into(), TensorData::i64(targets.clone())),
                (
                    "logprobs".into(),
                    TensorData::f32(vec![-9.0; targets.len()]),
                ),
            ]),
            loss_fn_input_spans: Some(spans),
        }
    }

    fn span(source: SpanSource, id: &SequenceId, offset: usize, length: usize) -> ProvenanceSpan {
        ProvenanceSpan {
            source,
            sequence: id.clone(),
            offset,
            length,
        }
    }

    fn input(data: Vec<Datum>) -> ForwardBackwardInput {
        ForwardBackwardInput {
            data,
            loss_fn: STABLE_REINFORCE.into(),
            loss_fn_config: BTreeMap::new(),
            custom_loss: None,
            temperature: 1.0,
        }
    }

    #[test]
    fn sampled_runs_take_the_recorded_logprobs_and_bad_provenance_is_refused_by_name() {
        let records = SequenceRecords::default();
        let (alice, bob) = (
            TenantId::new("alice").unwrap(),
            TenantId::new("bob").unwrap(),
        );
        let session = SessionId::new("s-1").unwrap();
        let sampler = SamplerId::of_session(&session, 0);
        let id = SequenceId::of_sample(&sampler, 1, 0);
        records.record(
            &alice,
            &sampler,
            &[5, 6, 7],
            std::slice::from_ref(&id),
            &response(vec![8, 9], vec![-0.5, -0.25]),
        );
        // The prompt from its second token (targets there need not match), then the sample.
        let good = datum(
            vec![0, 0, 8, 9],
            vec![
                span(SpanSource::Prompt, &id, 1, 2),
                span(SpanSource::Sampled, &id, 0, 2),
            ],
        );
        let resolved = records
            .resolve(&alice, &session, &input(vec![good.clone()]))
            .unwrap()
            .unwrap();
        assert_eq!(
            resolved.data[0].loss_fn_inputs["logprobs"],
            TensorData::f32(vec![-9.0, -9.0, -0.5, -0.25])
        );

        let refused = |tenant: &TenantId, datum: Datum| {
            records
                .resolve(tenant, &session, &input(vec![datum]))
                .unwrap_err()
        };
        let error = refused(&bob, good.clone());
        assert_eq!(error.kind, crate::api::ApiErrorKind::NotFound, "{error}");
        let other_session = SessionId::new("s-2").unwrap();
        assert!(
            records
                .resolve(&alice, &other_session, &input(vec![good.clone()]))
                .is_err()
        );
        let wrong_token = datum(vec![8, 7], vec![span(SpanSource::Sampled, &id, 0, 2)]);
        assert!(
            refused(&alice, wrong_token)
                .message
                .contains("sampled token 1")
        );
        let short = datum(vec![8, 9, 1], vec![span(SpanSource::Sampled, &id, 0, 2)]);
        assert!(refused(&alice, short).message.contains("cover 2 of its 3"));
        let past = datum(vec![9, 1], vec![span(SpanSource::Sampled, &id, 1, 2)]);
        assert!(
            refused(&alice, past)
                .message
                .contains("passes its 2 sampled")
        );
        let mut bare = good.clone();
        bare.loss_fn_input_spans = None;
        assert!(
            refused(&alice, bare)
                .message
                .contains("datum 0: stable_reinforce needs")
        );

        let mut other_loss = input(vec![good]);
        other_loss.loss_fn = "ppo".into();
        assert!(
            records
                .resolve(&bob, &session, &other_loss)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_tenant_keeps_at_most_its_quota_of_records() {
        let records = SequenceRecords::default();
        let alice = TenantId::new("alice").unwrap();
        let sampler = SamplerId::of_session(&SessionId::new("s-1").unwrap(), 0);
        for seq in 0..(MAX_PER_TENANT as u64 + 3) {
            let id = SequenceId::of_sample(&sampler, seq, 0);
            records.record(
                &alice,
                &sampler,
                &[1],
                &[id],
                &response(vec![2], vec![-1.0]),
            );
        }
        let kept = records.lock();
        assert_eq!(kept.records.len(), MAX_PER_TENANT);
        assert!(
            !kept
                .records
                .contains_key(&SequenceId::of_sample(&sampler, 0, 0))
        );
    }

    #[test]
    fn a_tenant_keeps_at_most_its_bytes_of_records() {
        let records = SequenceRecords::default();
        let alice = TenantId::new("alice").unwrap();
        let sampler = SamplerId::of_session(&SessionId::new("s-1").unwrap(), 0);
        // A 1 MiB prompt each: past 256 of them, the oldest go.
        let prompt = vec![1u32; 1 << 18];
        for seq in 0..300 {
            let id = SequenceId::of_sample(&sampler, seq, 0);
            let response = response(vec![2], vec![-1.0]);
            records.record(&alice, &sampler, &prompt, &[id], &response);
        }
        let kept = records.lock();
        assert!(kept.bytes[&alice] <= MAX_BYTES_PER_TENANT);
        assert!(kept.records.len() < 256, "{}", kept.records.len());
        let newest = SequenceId::of_sample(&sampler, 299, 0);
        assert!(kept.records.contains_key(&newest));
        assert!(
            !kept
                .records
                .contains_key(&SequenceId::of_sample(&sampler, 0, 0))
        );
    }
}

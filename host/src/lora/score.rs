//! Scoring token sequences through adapters: the logits of whole sequences, each run of rows
//! through its adapter (or the base model), and each token's logprob given the ones before it.

use candle_core::Tensor;

use super::{Adapter, CpuAdapters};
use crate::model::{Model, ModelError, sequence_logits};
use crate::model::{Transformer, target_logprobs};

/// Which adapter serves each run of consecutive batch rows (`None`: the base model).
#[derive(Clone, Debug, Default)]
pub struct RowAdapters<'a> {
    pub runs: Vec<(usize, Option<&'a Adapter>)>,
}

impl RowAdapters<'_> {
    pub fn rows(&self) -> usize {
        self.runs.iter().map(|(rows, _)| rows).sum()
    }

    /// Logits `(batch, time, vocab)` for token ids `(batch, time)`, each row a sequence of its
    /// own through its run's adapter.
    pub fn logits(&self, model: &Transformer, tokens: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, _) = tokens.dims2()?;
        if self.rows() != batch {
            return Err(candle_core::Error::Msg(format!(
                "adapters cover {} rows of a batch of {batch}",
                self.rows()
            )));
        }
        let mut adapters: Vec<&Adapter> = Vec::new();
        let mut per_row = Vec::with_capacity(batch);
        for (rows, adapter) in &self.runs {
            let index = adapter.map(|a| {
                adapters.push(a);
                adapters.len() - 1
            });
            per_row.extend(std::iter::repeat_n(index, *rows));
        }
        let hook = CpuAdapters::<f32>::of(&adapters)?;
        sequence_logits(model, tokens, &hook, &per_row)
    }
}

/// The logprob of each token given the ones before it (`None` for the first), under the base
/// model or under `adapter`.
pub fn token_logprobs(
    model: &Model,
    tokens: &[u32],
    adapter: Option<&Adapter>,
) -> Result<Vec<Option<f32>>, ModelError> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let config = &model.config;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= config.vocab_size) {
        return Err(ModelError::Input(format!(
            "token id {bad} is outside the model's vocabulary of {}",
            config.vocab_size
        )));
    }
    if tokens.len() > config.max_position_embeddings {
        return Err(ModelError::Input(format!(
            "{} tokens exceed the context length of {}",
            tokens.len(),
            config.max_position_embeddings
        )));
    }
    let input = Tensor::new(tokens, &candle_core::Device::Cpu)?.unsqueeze(0)?;
    let runs = RowAdapters {
        runs: vec![(1, adapter)],
    };
    let logits = runs.logits(&model.transformer, &input)?;
    let time = tokens.len();
    let mut out = vec![None];
    if time > 1 {
        let logits = logits.narrow(1, 0, time - 1)?;
        let targets = Tensor::new(&tokens[1..], &candle_core::Device::Cpu)?.unsqueeze(0)?;
        let logprobs = target_logprobs(&logits, &targets)?
            .squeeze(0)?
            .to_vec1::<f32>()?;
        out.extend(logprobs.into_iter().map(Some));
    }
    Ok(out)
}

//! Merging an adapter into its base: `W + scale · B A` at every projection it targets, so that
//! the merged model alone computes what the base computes with the adapter (up to float
//! rounding) and can be served, shared or loaded wherever a Hugging Face model can.

use crate::model::{Matrix, Site, Transformer};

use super::adapter::{Adapter, AdapterError};

/// `base` with `adapter` merged into its weights. An adapter of the unembedding on a model whose
/// unembedding is its embedding unties the two (the embedding stays as it was).
pub fn merge(base: &Transformer, adapter: &Adapter) -> Result<Transformer, AdapterError> {
    adapter.check_fits(&base.config)?;
    let mut merged = base.clone();
    for (site, pair) in &adapter.sites {
        let delta = (pair.b.as_tensor().matmul(pair.a.as_tensor())? * adapter.config.scale())?;
        let linear = match site {
            Site::Layer(layer, target) => merged.layers[*layer].linear_mut(*target),
            Site::Unembed => {
                merged.config.tie_word_embeddings = false;
                &mut merged.lm_head
            }
        };
        // A base kept in blocks merges into f32: the sum is not in the blocks' grid.
        let weight = linear.weight.dense()?;
        let delta = delta.to_dtype(weight.dtype())?;
        linear.weight = Matrix::Dense((&weight + delta)?);
    }
    Ok(merged)
}

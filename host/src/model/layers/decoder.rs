//! The decoder stack: embedding, the layers, the final norm and the unembedding of the rows
//! whose logits are wanted.

use opentinker_kernels::{Backend, Backward};

use super::attention::{
    AttentionGrads, AttentionTape, AttentionWeights, Context, Rope, attention, attention_backward,
};
use super::mlp::{MlpGrads, MlpTape, MlpWeights, mlp, mlp_backward};
use super::projection::{AdapterGrads, Adapters, Linear, LinearGrads, Run, runs};
use crate::model::{Features, ModelConfig, OutOfVocabulary, Site, Target};

/// One decoder layer's weights.
pub struct LayerWeights<'a, B: Backend + ?Sized> {
    pub input_norm: &'a B::Vector,
    pub attention: AttentionWeights<'a, B>,
    /// The MLP's input norm.
    pub post_attention_norm: &'a B::Vector,
    pub mlp: MlpWeights<'a, B>,
    /// The norms of the attention's and the MLP's outputs, before they join the residual
    /// stream (Gemma).
    pub attention_output_norm: Option<&'a B::Vector>,
    pub mlp_output_norm: Option<&'a B::Vector>,
}

/// The whole model's weights in the backend's storage, and its RoPE tables.
pub struct DecoderWeights<'a, B: Backend + ?Sized> {
    /// `vocab × hidden`.
    pub embed: B::Matrix<'a>,
    pub layers: Vec<LayerWeights<'a, B>>,
    pub norm: &'a B::Vector,
    /// The unembedding (the embedding itself when the model ties them).
    pub lm_head: Linear<'a, B>,
    pub rope: Rope<'a, B>,
    /// The local (sliding-window) layers' tables, where the model has them.
    pub local_rope: Option<Rope<'a, B>>,
    /// Positions the tables cover.
    pub context: usize,
}

impl<'a, B: Backend + ?Sized> DecoderWeights<'a, B> {
    /// The RoPE tables of layer `layer`.
    fn rope_of(&self, config: &ModelConfig, layer: usize) -> Rope<'a, B> {
        match (config.attention_window(layer), self.local_rope) {
            (Some(_), Some(local)) => local,
            _ => self.rope,
        }
    }
}

/// One sequence's part of a forward call.
#[derive(Clone, Copy, Debug)]
pub struct Sequence<'a> {
    /// New tokens, at positions `start..`.
    pub tokens: &'a [u32],
    /// Positions already in the sequence's cache.
    pub start: usize,
    /// Which of the hook's adapters the sequence goes through (`None`: the base model).
    pub adapter: Option<usize>,
    /// Logits of every new token (for prompt logprobs), or only of the last.
    pub all_logits: bool,
}

impl Sequence<'_> {
    fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.tokens.len()
        } else {
            1
        }
    }
}

/// Why a forward call was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError<E> {
    #[error(transparent)]
    OutOfVocabulary(#[from] OutOfVocabulary),
    #[error("a sequence has no new tokens")]
    NoTokens,
    #[error("a sequence reaches past the context of {context} positions")]
    PastContext { context: usize },
    #[error("a sequence has {targets} targets for {tokens} tokens")]
    Targets { tokens: usize, targets: usize },
    #[error("a sequence's temperature is {0}, not a finite number above 0")]
    Temperature(f64),
    #[error(transparent)]
    Backend(E),
}

/// The refusals every call shares: tokens outside the vocabulary, empty sequences, sequences
/// past the context.
fn check<'t, E>(
    config: &ModelConfig,
    context: usize,
    tokens: impl Iterator<Item = &'t [u32]> + Clone,
    ends: impl Iterator<Item = usize>,
) -> Result<(), ForwardError<E>> {
    config.check_tokens(tokens.clone().flatten())?;
    if tokens.clone().any(<[u32]>::is_empty) {
        return Err(ForwardError::NoTokens);
    }
    if ends.into_iter().any(|end| end > context) {
        return Err(ForwardError::PastContext { context });
    }
    Ok(())
}

/// What a layer's backward needs of its forward: its input and the residual stream between
/// its two blocks (the norms of both are recomputed), each block's own, and each block's
/// output before its output norm (where the model has one).
struct LayerTape<B: Backend> {
    x_in: B::Buffer,
    attention: AttentionTape<B>,
    attention_out: Option<B::Buffer>,
    x_mid: B::Buffer,
    mlp: MlpTape<B>,
    mlp_out: Option<B::Buffer>,
}

/// `x += block(into)`, where `block` writes a block's output (adding it into what it is given
/// when told to accumulate): straight into the residual stream, or first through the block's
/// output norm. Returns the block's tape and, with `keep` and a norm, its output before the norm.
fn add_block<B: Backend, T>(
    ops: &B,
    eps: f64,
    output_norm: Option<&B::Vector>,
    x: &mut B::Buffer,
    len: usize,
    keep: bool,
    block: impl FnOnce(&mut B::Buffer, bool) -> Result<T, B::Error>,
) -> Result<(T, Option<B::Buffer>), B::Error> {
    let Some(norm) = output_norm else {
        return Ok((block(x, true)?, None));
    };
    let mut y = ops.scratch(len)?;
    let tape = block(&mut y, false)?;
    let raw = if keep { Some(ops.copy(&y)?) } else { None };
    ops.rms_norm(&mut y, norm, eps)?;
    ops.add(x, &y)?;
    Ok((tape, raw))
}

/// Every layer over the residual stream `x`; with `keep`, what the backward needs.
fn stack<B: Backend, H: Adapters<B>>(
    cx: &mut Context<'_, '_, B, H>,
    weights: &DecoderWeights<'_, B>,
    x: &mut B::Buffer,
    keep: bool,
) -> Result<Vec<LayerTape<B>>, B::Error> {
    let ops = cx.ops;
    let eps = cx.config.rms_norm_eps;
    let mut tapes = Vec::with_capacity(if keep { weights.layers.len() } else { 0 });
    let len = cx.rows * cx.config.hidden_size;
    let mut h = ops.scratch(len)?;
    for (li, layer) in weights.layers.iter().enumerate() {
        let rope = weights.rope_of(cx.config, li);
        let x_in = if keep { Some(ops.copy(x)?) } else { None };
        ops.rms_norm_into(x, layer.input_norm, eps, &mut h)?;
        let (attention, attention_out) = add_block(
            ops,
            eps,
            layer.attention_output_norm,
            x,
            len,
            keep,
            |out, add| attention(cx, li, &layer.attention, rope, &h, out, add, keep),
        )?;
        let x_mid = if keep { Some(ops.copy(x)?) } else { None };
        ops.rms_norm_into(x, layer.post_attention_norm, eps, &mut h)?;
        let (mlp, mlp_out) =
            add_block(ops, eps, layer.mlp_output_norm, x, len, keep, |out, add| {
                mlp(cx, li, &layer.mlp, &h, out, add, keep)
            })?;
        if let (Some(x_in), Some(attention), Some(x_mid), Some(mlp)) = (x_in, attention, x_mid, mlp)
        {
            tapes.push(LayerTape {
                x_in,
                attention,
                attention_out,
                x_mid,
                mlp,
                mlp_out,
            });
        }
    }
    Ok(tapes)
}

/// The embeddings of `tokens`, scaled by the square root of the width where the model says so
/// (in f32, as `transformers` computes Gemma's).
fn embed<B: Backend>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    tokens: &[usize],
) -> Result<B::Buffer, B::Error> {
    let mut x = ops.embed(weights.embed, config.hidden_size, tokens)?;
    if let Some(scale) = embedding_scale(config) {
        ops.scale(&mut x, scale)?;
    }
    Ok(x)
}

/// The factor of the embeddings, where the model scales them.
fn embedding_scale(config: &ModelConfig) -> Option<f64> {
    config
        .features
        .scaled_embeddings
        .then(|| f64::from((config.hidden_size as f64).sqrt() as f32))
}

/// Run the new tokens of every sequence through the model, appending their keys and values to
/// the caches in `batch`. Returns the logits (`rows × vocab`) of each sequence's wanted rows
/// (every new token, or the last), sequence after sequence.
pub fn forward<B: Backend, H: Adapters<B>>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    adapters: &H,
    sequences: &[Sequence<'_>],
    batch: &mut B::Batch<'_>,
) -> Result<B::Buffer, ForwardError<B::Error>> {
    check(
        config,
        weights.context,
        sequences.iter().map(|s| s.tokens),
        sequences.iter().map(|s| s.start + s.tokens.len()),
    )?;
    let hidden = config.hidden_size;
    let rows: usize = sequences.iter().map(|s| s.tokens.len()).sum();
    let row_runs = runs(sequences.iter().map(|s| Run {
        rows: s.tokens.len(),
        adapter: s.adapter,
    }));
    let backend = ForwardError::Backend;

    let tokens: Vec<usize> = sequences
        .iter()
        .flat_map(|s| s.tokens.iter().map(|&t| t as usize))
        .collect();
    let mut x = embed(ops, config, weights, &tokens).map_err(backend)?;
    let mut cx = Context {
        ops,
        config,
        adapters,
        runs: &row_runs,
        rows,
        batch,
    };
    stack(&mut cx, weights, &mut x, false).map_err(backend)?;
    ops.advance(cx.batch);

    // Only the rows whose logits are wanted go through the unembedding.
    let mut kept = Vec::new();
    let mut end = 0;
    for s in sequences {
        end += s.tokens.len();
        kept.extend(end - s.logit_rows()..end);
    }
    let mut kept = ops.select_rows(&x, hidden, &kept).map_err(backend)?;
    ops.rms_norm(&mut kept, weights.norm, config.rms_norm_eps)
        .map_err(backend)?;
    let kept_runs = runs(sequences.iter().map(|s| Run {
        rows: s.logit_rows(),
        adapter: s.adapter,
    }));
    let kept_rows: usize = kept_runs.iter().map(|r| r.rows).sum();
    let mut logits = ops
        .scratch(kept_rows * config.vocab_size)
        .map_err(backend)?;
    adapters
        .project(
            ops,
            Site::Unembed,
            &kept_runs,
            &kept,
            &weights.lm_head,
            &mut logits,
            false,
        )
        .map_err(backend)?;
    Ok(logits)
}

/// One sequence of a training call: its tokens, the token that should follow each, and its
/// adapter.
#[derive(Clone, Copy, Debug)]
pub struct TrainSequence<'a> {
    pub tokens: &'a [u32],
    pub targets: &'a [u32],
    /// Which of the hook's adapters the sequence goes through (`None`: the base model).
    pub adapter: Option<usize>,
    /// The logprobs are of `logits / temperature` (1: the model's own distribution): an RL
    /// datum's sampling temperature, so that the learner's policy is the one sampled from.
    pub temperature: f64,
}

/// How the head computed the logprobs, and what its backward needs.
enum HeadTape<B: Backend> {
    /// A frozen, unadapted unembedding: the rows' Jacobians, no logits.
    Fused { jacobian: B::Buffer },
    /// Logits through the projection (an adapted or trained unembedding).
    Logits {
        normed: B::Buffer,
        logits: B::Buffer,
    },
}

/// What [`train_backward`] needs of [`train_forward`].
pub struct Tape<B: Backend> {
    layers: Vec<LayerTape<B>>,
    /// The residual stream before the final norm.
    x_final: B::Buffer,
    head: HeadTape<B>,
}

/// The values a training pass holds per token, at most: what its [`Tape`] keeps of every
/// layer (the input and middle residual streams, the attended queries, keys and values and
/// the attention's output, the gate and up projections, the raw queries and keys where the
/// model norms them, and each block's output before its output norm where it has one) and of
/// the head, with the backward's largest buffers of one layer at a time. `logits` says whether
/// the head keeps its logits (the unembedding is trained, by full-parameter training or an
/// adapter) or only the fused logprob's Jacobian; then the backward's logit gradient is as large
/// again. Multiply by the element's size for bytes: the training engine bounds its passes by it,
/// and the jobs' memory budget counts it.
pub fn train_values_per_token(config: &ModelConfig, logits: bool) -> usize {
    let (hidden, inter) = (config.hidden_size, config.intermediate_size);
    let q = config.num_heads * config.head_dim;
    let kv = config.num_kv_heads * config.head_dim;
    let qk_norms = match config.features.qk_norm {
        true => q + kv,
        false => 0,
    };
    let output_norms = match config.features.block_output_norms {
        true => 2 * hidden,
        false => 0,
    };
    let layer = 2 * hidden + 2 * q + 2 * kv + 2 * inter + qk_norms + output_norms;
    let head = match logits {
        true => hidden + 2 * config.vocab_size,
        false => hidden,
    };
    // The residual stream, its norm and their gradients, and a layer's backward: the
    // gradients of its projections' outputs and the recomputed gated product.
    let working = 4 * hidden + 2 * q + 2 * kv + 4 * inter;
    config.num_layers * layer + hidden + head + working
}

/// What [`train_forward`] gives.
pub struct TrainOutput<B: Backend> {
    /// The logprob of each target, sequence after sequence.
    pub logprobs: B::Buffer,
    /// What [`train_backward`] needs (when asked to keep it).
    pub tape: Option<Tape<B>>,
}

/// The gradient of every weight of the model (full-parameter training).
pub struct WeightGrads<B: Backend> {
    pub embed: B::Buffer,
    pub layers: Vec<LayerGrads<B>>,
    pub norm: B::Buffer,
    /// `None` when the unembedding is the embedding: its gradient adds to `embed`.
    pub lm_head: Option<B::Buffer>,
}

/// The gradients of one layer's weights.
pub struct LayerGrads<B: Backend> {
    pub input_norm: B::Buffer,
    pub attention: AttentionGrads<B>,
    pub post_attention_norm: B::Buffer,
    pub mlp: MlpGrads<B>,
    pub attention_output_norm: Option<B::Buffer>,
    pub mlp_output_norm: Option<B::Buffer>,
}

impl<B: Backend> WeightGrads<B> {
    /// Zero gradients for every weight of `config`'s model.
    pub fn zeros(ops: &B, config: &ModelConfig) -> Result<Self, B::Error> {
        let (hidden, head_dim) = (config.hidden_size, config.head_dim);
        let linear = |target: Target, bias: bool| {
            let (out, inp) = target.shape(config);
            LinearGrads::zeros(ops, out, inp, bias)
        };
        let qk_norm = |present: bool| -> Result<Option<B::Buffer>, B::Error> {
            present.then(|| ops.zeros(head_dim)).transpose()
        };
        let output_norm = || -> Result<Option<B::Buffer>, B::Error> {
            let present = config.features.block_output_norms;
            present.then(|| ops.zeros(hidden)).transpose()
        };
        let layers = (0..config.num_layers)
            .map(|_| {
                Ok(LayerGrads {
                    input_norm: ops.zeros(hidden)?,
                    attention: AttentionGrads {
                        q: linear(Target::Q, config.features.qkv_bias)?,
                        k: linear(Target::K, config.features.qkv_bias)?,
                        v: linear(Target::V, config.features.qkv_bias)?,
                        o: linear(Target::O, config.features.o_bias)?,
                        q_norm: qk_norm(config.features.qk_norm)?,
                        k_norm: qk_norm(config.features.qk_norm)?,
                    },
                    post_attention_norm: ops.zeros(hidden)?,
                    mlp: MlpGrads {
                        gate: linear(Target::Gate, config.features.mlp_bias)?,
                        up: linear(Target::Up, config.features.mlp_bias)?,
                        down: linear(Target::Down, config.features.mlp_bias)?,
                    },
                    attention_output_norm: output_norm()?,
                    mlp_output_norm: output_norm()?,
                })
            })
            .collect::<Result<_, B::Error>>()?;
        Ok(WeightGrads {
            embed: ops.zeros(config.vocab_size * hidden)?,
            layers,
            norm: ops.zeros(hidden)?,
            lm_head: if config.tie_word_embeddings {
                None
            } else {
                Some(ops.zeros(config.vocab_size * hidden)?)
            },
        })
    }
}

impl<B: Backend> WeightGrads<B> {
    /// Every gradient by its weight's Hugging Face name (as `Transformer::named_weights` names
    /// them).
    pub fn into_named(self, features: &Features) -> Vec<(String, B::Buffer)> {
        let (mlp_norm, output_norms) = features.layer_norm_names();
        let mut named = vec![("model.embed_tokens.weight".to_string(), self.embed)];
        for (i, layer) in self.layers.into_iter().enumerate() {
            let p = format!("model.layers.{i}");
            named.push((format!("{p}.input_layernorm.weight"), layer.input_norm));
            named.push((format!("{p}.{mlp_norm}.weight"), layer.post_attention_norm));
            let outputs = [layer.attention_output_norm, layer.mlp_output_norm];
            for (name, grad) in output_norms.into_iter().flatten().zip(outputs) {
                if let Some(grad) = grad {
                    named.push((format!("{p}.{name}.weight"), grad));
                }
            }
            let a = layer.attention;
            let norms = [("q_norm", a.q_norm), ("k_norm", a.k_norm)];
            for (norm, grad) in norms {
                if let Some(grad) = grad {
                    named.push((format!("{p}.self_attn.{norm}.weight"), grad));
                }
            }
            let m = layer.mlp;
            let linears = [
                (Target::Q, a.q),
                (Target::K, a.k),
                (Target::V, a.v),
                (Target::O, a.o),
                (Target::Gate, m.gate),
                (Target::Up, m.up),
                (Target::Down, m.down),
            ];
            for (target, grads) in linears {
                named.push((format!("{p}.{}.weight", target.module()), grads.weight));
                if let Some(bias) = grads.bias {
                    named.push((format!("{p}.{}.bias", target.module()), bias));
                }
            }
        }
        named.push(("model.norm.weight".to_string(), self.norm));
        if let Some(lm_head) = self.lm_head {
            named.push(("lm_head.weight".to_string(), lm_head));
        }
        named
    }
}

/// The rows of a training call and their runs of adapters.
fn train_rows(sequences: &[TrainSequence<'_>]) -> (usize, Vec<Run>) {
    let rows = sequences.iter().map(|s| s.tokens.len()).sum();
    let row_runs = runs(sequences.iter().map(|s| Run {
        rows: s.tokens.len(),
        adapter: s.adapter,
    }));
    (rows, row_runs)
}

/// Each row's `1 / temperature` (its sequence's), `None` when every sequence is at 1.
fn inverse_temperatures(sequences: &[TrainSequence<'_>]) -> Option<Vec<f64>> {
    sequences.iter().any(|s| s.temperature != 1.0).then(|| {
        sequences
            .iter()
            .flat_map(|s| std::iter::repeat_n(1.0 / s.temperature, s.tokens.len()))
            .collect()
    })
}

/// The logprob of every sequence's targets (`rows`, sequence after sequence), each sequence
/// whole from position 0. With `keep`, also what [`train_backward`] needs; `trained_head` says
/// the unembedding's own weight will get a gradient (full-parameter training).
#[allow(clippy::too_many_arguments)]
pub fn train_forward<B: Backward, H: Adapters<B>>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    adapters: &H,
    sequences: &[TrainSequence<'_>],
    batch: &mut B::Batch<'_>,
    keep: bool,
    trained_head: bool,
) -> Result<TrainOutput<B>, ForwardError<B::Error>> {
    check(
        config,
        weights.context,
        sequences.iter().map(|s| s.tokens),
        sequences.iter().map(|s| s.tokens.len()),
    )?;
    config.check_tokens(sequences.iter().flat_map(|s| s.targets))?;
    if let Some(s) = sequences.iter().find(|s| s.targets.len() != s.tokens.len()) {
        return Err(ForwardError::Targets {
            tokens: s.tokens.len(),
            targets: s.targets.len(),
        });
    }
    if let Some(s) = sequences
        .iter()
        .find(|s| !(s.temperature.is_finite() && s.temperature > 0.0))
    {
        return Err(ForwardError::Temperature(s.temperature));
    }
    let backend = ForwardError::Backend;
    let (hidden, vocab) = (config.hidden_size, config.vocab_size);
    let (rows, row_runs) = train_rows(sequences);
    let tokens: Vec<usize> = sequences
        .iter()
        .flat_map(|s| s.tokens.iter().map(|&t| t as usize))
        .collect();
    let targets: Vec<u32> = sequences
        .iter()
        .flat_map(|s| s.targets.iter().copied())
        .collect();
    let mut x = embed(ops, config, weights, &tokens).map_err(backend)?;
    let mut cx = Context {
        ops,
        config,
        adapters,
        runs: &row_runs,
        rows,
        batch,
    };
    let layers = stack(&mut cx, weights, &mut x, keep).map_err(backend)?;
    let x_final = if keep {
        Some(ops.copy(&x).map_err(backend)?)
    } else {
        None
    };
    let mut normed = x;
    ops.rms_norm(&mut normed, weights.norm, config.rms_norm_eps)
        .map_err(backend)?;
    let inverse = inverse_temperatures(sequences);
    let fused = !trained_head
        && weights.lm_head.bias.is_none()
        && !adapters.adapts(Site::Unembed, &row_runs);
    let (logprobs, head) = if fused {
        // Without a bias, `logits / T` is the unembedding of `normed / T`.
        if let Some(inverse) = &inverse {
            ops.scale_rows(&mut normed, inverse).map_err(backend)?;
        }
        let mut jacobian = if keep {
            Some(ops.zeros(rows * hidden).map_err(backend)?)
        } else {
            None
        };
        let logprobs = ops
            .unembed_logprobs(
                &normed,
                weights.lm_head.weight,
                hidden,
                &targets,
                jacobian.as_mut(),
            )
            .map_err(backend)?;
        (
            logprobs,
            jacobian.map(|jacobian| HeadTape::Fused { jacobian }),
        )
    } else {
        let mut logits = ops.zeros(rows * vocab).map_err(backend)?;
        adapters
            .project(
                ops,
                Site::Unembed,
                &row_runs,
                &normed,
                &weights.lm_head,
                &mut logits,
                false,
            )
            .map_err(backend)?;
        if let Some(inverse) = &inverse {
            ops.scale_rows(&mut logits, inverse).map_err(backend)?;
        }
        let logprobs = ops
            .target_logprobs(&logits, vocab, &targets)
            .map_err(backend)?;
        (
            logprobs,
            keep.then_some(HeadTape::Logits { normed, logits }),
        )
    };
    let tape = match (x_final, head) {
        (Some(x_final), Some(head)) => Some(Tape {
            layers,
            x_final,
            head,
        }),
        _ => None,
    };
    Ok(TrainOutput { logprobs, tape })
}

/// The backward of [`train_forward`] from `d_logprobs`, the gradient of each target's logprob:
/// the adapters accumulate their gradients through the hook, and `grads` (when given) every
/// weight's.
#[allow(clippy::too_many_arguments)]
pub fn train_backward<B: Backward, H: AdapterGrads<B>>(
    ops: &B,
    config: &ModelConfig,
    weights: &DecoderWeights<'_, B>,
    adapters: &H,
    sequences: &[TrainSequence<'_>],
    batch: &mut B::Batch<'_>,
    tape: &Tape<B>,
    d_logprobs: &B::Buffer,
    mut grads: Option<&mut WeightGrads<B>>,
) -> Result<(), B::Error> {
    let (hidden, vocab, eps) = (config.hidden_size, config.vocab_size, config.rms_norm_eps);
    let (rows, row_runs) = train_rows(sequences);
    let targets: Vec<u32> = sequences
        .iter()
        .flat_map(|s| s.targets.iter().copied())
        .collect();

    // The head (through each row's temperature), then the final norm.
    let inverse = inverse_temperatures(sequences);
    let mut d_normed = ops.zeros(rows * hidden)?;
    match &tape.head {
        HeadTape::Fused { jacobian } => {
            ops.unembed_logprobs_backward(jacobian, d_logprobs, &mut d_normed)?;
            if let Some(inverse) = &inverse {
                ops.scale_rows(&mut d_normed, inverse)?;
            }
        }
        HeadTape::Logits { normed, logits } => {
            let mut d_logits = ops.target_logprobs_backward(logits, vocab, &targets, d_logprobs)?;
            if let Some(inverse) = &inverse {
                ops.scale_rows(&mut d_logits, inverse)?;
            }
            adapters.project_backward(
                ops,
                Site::Unembed,
                &row_runs,
                normed,
                &weights.lm_head,
                &d_logits,
                &mut d_normed,
            )?;
            if let Some(g) = grads.as_deref_mut() {
                let d_weight = g.lm_head.as_mut().unwrap_or(&mut g.embed);
                ops.weight_gradient(normed, &d_logits, hidden, d_weight, None)?;
            }
        }
    }
    let mut dx = ops.zeros(rows * hidden)?;
    let d_norm = grads.as_deref_mut().map(|g| &mut g.norm);
    ops.rms_norm_backward(&tape.x_final, weights.norm, eps, &d_normed, &mut dx, d_norm)?;

    let mut cx = Context {
        ops,
        config,
        adapters,
        runs: &row_runs,
        rows,
        batch,
    };
    let mut h = ops.zeros(rows * hidden)?;
    for (li, (layer, layer_tape)) in weights.layers.iter().zip(&tape.layers).enumerate().rev() {
        let rope = weights.rope_of(config, li);
        let mut layer_grads = grads.as_deref_mut().map(|g| &mut g.layers[li]);
        // dx is the gradient of the layer's output; both blocks add into the residual.
        ops.rms_norm_into(&layer_tape.x_mid, layer.post_attention_norm, eps, &mut h)?;
        let d_norm = layer_grads
            .as_deref_mut()
            .and_then(|g| g.mlp_output_norm.as_mut());
        let d_out = block_output_backward(
            ops,
            eps,
            layer.mlp_output_norm,
            layer_tape.mlp_out.as_ref(),
            &dx,
            rows * hidden,
            d_norm,
        )?;
        let d_out = d_out.as_ref().unwrap_or(&dx);
        let mlp_grads = layer_grads.as_deref_mut().map(|g| &mut g.mlp);
        let dh = mlp_backward(
            &mut cx,
            li,
            &layer.mlp,
            &h,
            &layer_tape.mlp,
            d_out,
            mlp_grads,
        )?;
        let d_post = layer_grads
            .as_deref_mut()
            .map(|g| &mut g.post_attention_norm);
        ops.rms_norm_backward(
            &layer_tape.x_mid,
            layer.post_attention_norm,
            eps,
            &dh,
            &mut dx,
            d_post,
        )?;

        ops.rms_norm_into(&layer_tape.x_in, layer.input_norm, eps, &mut h)?;
        let d_norm = layer_grads
            .as_deref_mut()
            .and_then(|g| g.attention_output_norm.as_mut());
        let d_out = block_output_backward(
            ops,
            eps,
            layer.attention_output_norm,
            layer_tape.attention_out.as_ref(),
            &dx,
            rows * hidden,
            d_norm,
        )?;
        let d_out = d_out.as_ref().unwrap_or(&dx);
        let attention_grads = layer_grads.as_deref_mut().map(|g| &mut g.attention);
        let dh = attention_backward(
            &mut cx,
            li,
            &layer.attention,
            rope,
            &h,
            &layer_tape.attention,
            d_out,
            attention_grads,
        )?;
        let d_input = layer_grads.map(|g| &mut g.input_norm);
        ops.rms_norm_backward(
            &layer_tape.x_in,
            layer.input_norm,
            eps,
            &dh,
            &mut dx,
            d_input,
        )?;
    }
    if let Some(g) = grads {
        let tokens: Vec<usize> = sequences
            .iter()
            .flat_map(|s| s.tokens.iter().map(|&t| t as usize))
            .collect();
        if let Some(scale) = embedding_scale(config) {
            ops.scale(&mut dx, scale)?;
        }
        ops.embed_backward(&tokens, hidden, &dx, &mut g.embed)?;
    }
    Ok(())
}

/// The gradient of a block's output before its output norm, from `dy` after it (`None` where
/// the block has no output norm: then it is `dy`); the norm's weight gradient into `d_norm`.
fn block_output_backward<B: Backward>(
    ops: &B,
    eps: f64,
    norm: Option<&B::Vector>,
    raw: Option<&B::Buffer>,
    dy: &B::Buffer,
    len: usize,
    d_norm: Option<&mut B::Buffer>,
) -> Result<Option<B::Buffer>, B::Error> {
    let (Some(norm), Some(raw)) = (norm, raw) else {
        return Ok(None);
    };
    let mut d_raw = ops.zeros(len)?;
    ops.rms_norm_backward(raw, norm, eps, dy, &mut d_raw, d_norm)?;
    Ok(Some(d_raw))
}

//! Where a projection sits in the model: a layer's attention or MLP projection, or the
//! unembedding. Adapters and the projection hook name their places by it.

use super::config::ModelConfig;

/// One of a layer's seven projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ATTENTION: [Target; 4] = [Target::Q, Target::K, Target::V, Target::O];
    pub const MLP: [Target; 3] = [Target::Gate, Target::Up, Target::Down];
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The module name in Hugging Face (and PEFT) tensor names.
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// (out, in) of the projection.
    pub fn shape(self, config: &ModelConfig) -> (usize, usize) {
        let (h, hd, inter) = (
            config.hidden_size,
            config.head_dim,
            config.intermediate_size,
        );
        match self {
            Target::Q => (config.num_heads * hd, h),
            Target::K | Target::V => (config.num_kv_heads * hd, h),
            Target::O => (h, config.num_heads * hd),
            Target::Gate | Target::Up => (inter, h),
            Target::Down => (h, inter),
        }
    }
}

/// A projection of the model: a layer's, or the unembedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Site {
    Layer(usize, Target),
    Unembed,
}

impl Site {
    /// (out, in) of the projection at this site.
    pub fn shape(self, model: &ModelConfig) -> (usize, usize) {
        match self {
            Site::Layer(_, target) => target.shape(model),
            Site::Unembed => (model.vocab_size, model.hidden_size),
        }
    }
}

//! The model shapes the GPU benchmarks run (random weights of them, made on the device), as the
//! `config.json` each model ships, which `bench/python/gpu_peer.py` reads back to build the same
//! model in `transformers`.

use serde_json::json;

/// Qwen2.5-0.5B's and Qwen2.5-7B's shapes, by name.
pub fn shapes() -> Vec<(&'static str, serde_json::Value)> {
    let qwen2 = |layers: usize,
                 hidden: usize,
                 inter: usize,
                 heads: usize,
                 kv: usize,
                 vocab: usize,
                 tied: bool| {
        json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "tie_word_embeddings": tied, "bos_token_id": 0,
            "eos_token_id": 1,
        })
    };
    vec![
        ("qwen2.5-0.5b", qwen2(24, 896, 4864, 14, 2, 151_936, true)),
        ("qwen2.5-7b", qwen2(28, 3584, 18944, 28, 4, 152_064, false)),
    ]
}

//! Property tests of the server's request decoders (the fuzz targets of the wire): any bytes sent
//! to any route that runs as a future are read into an op or refused with a reason, never a
//! panic; well-formed `forward_backward` bodies keep every token and target.

use std::collections::BTreeMap;

use opentinker::api::{ApiErrorKind, Op, TensorValues};
use opentinker::server::{FutureRoute, accept};
use opentinker::wire::proto;
use proptest::prelude::*;
use prost::Message;

/// Bodies that look like what the SDK sends, then damaged: JSON objects with the SDK's keys and
/// random values, and random bytes.
fn bodies() -> impl Strategy<Value = Vec<u8>> {
    let keys = prop::sample::select(vec![
        "session_id",
        "model_seq_id",
        "base_model",
        "lora_config",
        "model_id",
        "seq_id",
        "adam_params",
        "path",
        "optimizer",
        "sampling_session_id",
        "prompt",
        "sampling_params",
        "num_samples",
        "sampling_session_seq_id",
    ]);
    let values = prop_oneof![
        Just("null".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        // Counts past every limit (3e17 samples once aborted the server).
        prop::sample::select(vec![300_000_000_000_000_000u64, u64::MAX, 1 << 40])
            .prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| if x.is_finite() {
            x.to_string()
        } else {
            "1e999".into()
        }),
        "[a-z:/0-9-]{0,24}".prop_map(|s| format!("{s:?}")),
        Just(r#"{"chunks": [{"type": "encoded_text", "tokens": [1, -2, 3]}]}"#.to_string()),
        Just(r#"{"rank": 0, "train_mlp": "yes"}"#.to_string()),
        Just(r#"{"max_tokens": -1, "stop": [1, "a"], "top_k": 0}"#.to_string()),
        Just(r#"{"max_tokens": 18446744073709551615}"#.to_string()),
        Just(r#""s-1:sample:0""#.to_string()),
    ];
    let json = prop::collection::btree_map(keys, values, 0..8).prop_map(|fields| {
        let inner: Vec<String> = fields.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", inner.join(", ")).into_bytes()
    });
    prop_oneof![json, prop::collection::vec(any::<u8>(), 0..512)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_body_is_an_op_or_a_named_refusal(body in bodies(), route in prop::sample::select(FutureRoute::ALL.to_vec())) {
        if let Err(error) = accept(route, &body, None) {
            prop_assert!(!error.message.is_empty());
            prop_assert!(error.kind == ApiErrorKind::InvalidRequest, "{error:?}");
        }
    }

    #[test]
    fn a_sample_of_any_count_is_read_or_refused_without_sizing_anything_from_it(n in any::<u64>(), seq in prop::option::of(any::<u64>())) {
        let body = serde_json::json!({
            "sampling_session_id": "s-1:sample:0", "seq_id": seq, "num_samples": n,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
            "sampling_params": {"max_tokens": n},
        });
        match accept(FutureRoute::Sample, body.to_string().as_bytes(), None) {
            Ok(_) => prop_assert!((1..=128).contains(&n)),
            Err(error) => prop_assert!(error.message.contains("num_samples"), "{error:?}"),
        }
    }

    #[test]
    fn forward_backward_bodies_keep_their_tokens(
        datums in prop::collection::vec(prop::collection::vec(0i32..100_000, 1..40), 1..6),
        seq in 1i32..1000,
    ) {
        let data = datums.iter().map(|tokens| proto::Datum {
            model_input: vec![proto::Chunk {
                chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                    tokens: tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
                })),
            }],
            loss_fn_inputs: BTreeMap::from([(
                "target_tokens".to_string(),
                proto::Tensor {
                    encoding: Some(proto::tensor::Encoding::Dense(
                        tokens.iter().flat_map(|&t| i64::from(t).to_le_bytes()).collect(),
                    )),
                    dtype: proto::DType::Int64 as i32,
                    shape: vec![tokens.len() as i64],
                },
            )]),
            ..Default::default()
        }).collect();
        let body = proto::ForwardBackwardRequest {
            model_id: "s-1:train:0".into(),
            seq_id: seq,
            data,
            loss_fn: "cross_entropy".into(),
            ..Default::default()
        }.encode_to_vec();
        let accepted = accept(FutureRoute::ForwardBackward, &body, None).unwrap();
        prop_assert_eq!(accepted.seq, Some(seq as u64));
        let Op::ForwardBackward { input, .. } = accepted.op else { panic!("not a forward_backward") };
        for (datum, tokens) in input.data.iter().zip(&datums) {
            let expected: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
            prop_assert_eq!(datum.model_input.tokens(), expected.clone());
            let TensorValues::Int64(targets) = &datum.loss_fn_inputs["target_tokens"].values else {
                panic!("targets are not int64")
            };
            prop_assert!(targets.iter().map(|&t| t as u32).eq(expected));
        }
    }
}

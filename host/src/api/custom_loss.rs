//! Custom losses as the `tinker` SDK's `create_custom_loss` sends them: a torch.fx trace of a
//! per-datum loss as plain data (its nodes in order: placeholders for the inputs, calls of
//! functions and methods by name, an output of the loss and its metrics), the inputs it
//! declares with their ranks, and the id the server gives it. What may run is decided where it
//! is compiled (the training engine's allow-list); here it is only data.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A traced loss as the SDK sends it: its nodes in execution order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossGraph {
    pub format: u32,
    pub nodes: Vec<Node>,
}

/// One node, as torch.fx records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub op: NodeOp,
    pub name: String,
    pub target: String,
    #[serde(default)]
    pub args: Vec<Arg>,
    #[serde(default)]
    pub kwargs: BTreeMap<String, Arg>,
}

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeOp {
    Placeholder,
    GetAttr,
    CallFunction,
    CallMethod,
    CallModule,
    Output,
}

/// An encoded argument: JSON scalars stand for themselves, lists for lists, anything else is a
/// one-key object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Arg {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    List(Vec<Arg>),
    Ref {
        #[serde(rename = "ref")]
        name: String,
    },
    Tuple {
        tuple: Vec<Arg>,
    },
    Dict {
        dict: BTreeMap<String, Arg>,
    },
    /// `inf`, `-inf` or `nan`.
    SpecialFloat {
        float: String,
    },
    /// Slices, ellipses, dtypes, devices, layouts and memory formats: none is an operation of
    /// this module's, so each is refused where it appears.
    Other(serde_json::Map<String, serde_json::Value>),
}

/// One input a custom loss declares: `logprobs` first (the policy's logprob of each target
/// token), then each `loss_fn_inputs` key it reads, in the order it takes them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomLossInput {
    pub name: String,
    /// 0 for a scalar, 1 for `[T]`, 2 for `[T, K]`.
    pub rank: u8,
}

//! Custom losses sent as graphs: the `CustomLossGraph` of the `tinker` SDK's
//! `create_custom_loss`, a torch.fx trace of a per-datum loss as plain data (placeholders, calls
//! of functions and methods by name, an output of the loss and its metrics). Nothing in it runs
//! as sent: [`CompiledLoss::compile`] rebuilds it from this module's own list of operations
//! (elementwise arithmetic, `exp`, `log`, `clamp`, `minimum`, sums and means, `detach`, ...),
//! refusing any other by name before any work, and [`CompiledLoss::evaluate`] runs it on one
//! datum's tensors as a candle graph, so that the engine's backward reaches the logprobs
//! through it as through a built-in loss.
//!
//! ```text
//! logprobs, weights ─▶ operator.mul ─▶ sum ─▶ operator.neg ─▶ output (loss, {"custom/x:sum": ...})
//! ```

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor};

use crate::api::{Arg, CustomLossInput, LossGraph, Node, NodeOp};

/// Why a graph is refused or its evaluation failed.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("custom loss graph format {0} (this server reads format 1)")]
    Format(u32),
    #[error("node {node:?}: {what} is not an operation a custom loss may use here")]
    NotAllowed { node: String, what: String },
    #[error("node {node:?}: {problem}")]
    Malformed { node: String, problem: String },
    #[error("the graph takes {given} inputs where the loss declares {declared}")]
    Inputs { given: usize, declared: usize },
    #[error("the loss must be a scalar; node {node:?} gives shape {shape:?}")]
    NotScalar { node: String, shape: Vec<usize> },
    #[error("the loss's inputs: {0}")]
    BadInputs(String),
    #[error("the graph has {nodes} nodes (at most {MAX_NODES})")]
    TooLarge { nodes: usize },
    #[error("the datum has no loss_fn_inputs[{0:?}], which the loss takes")]
    MissingInput(String),
    #[error("loss_fn_inputs[{name:?}] has shape {shape:?}; the loss declares rank {rank}")]
    InputRank {
        name: String,
        shape: Vec<usize>,
        rank: u8,
    },
    #[error("node {node:?}: {source}")]
    Tensor {
        node: String,
        source: candle_core::Error,
    },
}

impl GraphError {
    fn malformed(node: &Node, problem: impl Into<String>) -> Self {
        GraphError::Malformed {
            node: node.name.clone(),
            problem: problem.into(),
        }
    }
}

/// The operations a graph may call: `call_function` targets, then `call_method` names.
const FUNCTIONS: &[&str] = &[
    "operator.add",
    "operator.sub",
    "operator.mul",
    "operator.truediv",
    "operator.neg",
    "operator.pow",
    "torch.exp",
    "torch.log",
    "torch.abs",
    "torch.sqrt",
    "torch.square",
    "torch.tanh",
    "torch.sigmoid",
    "torch.clamp",
    "torch.minimum",
    "torch.maximum",
    "torch.sum",
    "torch.mean",
];
const METHODS: &[&str] = &[
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "abs", "sqrt", "square", "tanh",
    "sigmoid", "clamp", "sum", "mean", "detach",
];

/// The most nodes a graph may have (a loss of a few dozen operations is large).
pub const MAX_NODES: usize = 512;
/// The most inputs a loss may take (the SDK's limit).
pub const MAX_INPUTS: usize = 16;

/// Refuse inputs the engine cannot give: `logprobs` first, of rank 1 (top-k logprobs, rank 2,
/// are not served), then distinct names of rank 0 to 2.
fn check_inputs(inputs: &[CustomLossInput]) -> Result<(), GraphError> {
    let bad = |problem: String| GraphError::BadInputs(problem);
    match inputs.first() {
        Some(first) if first.name == "logprobs" && first.rank == 1 => {}
        Some(first) if first.name == "logprobs" => {
            return Err(bad(format!(
                "logprobs has rank {}; this server gives each datum's target logprobs as [T] (rank 1)",
                first.rank
            )));
        }
        _ => return Err(bad("the first input must be `logprobs`".into())),
    }
    if inputs.len() > MAX_INPUTS {
        return Err(bad(format!(
            "{} inputs (at most {MAX_INPUTS})",
            inputs.len()
        )));
    }
    for (at, input) in inputs.iter().enumerate().skip(1) {
        if input.rank > 2 {
            return Err(bad(format!(
                "{:?} has rank {} (0 to 2)",
                input.name, input.rank
            )));
        }
        if inputs[..at].iter().any(|i| i.name == input.name) {
            return Err(bad(format!("{:?} is declared twice", input.name)));
        }
    }
    Ok(())
}

/// A checked graph, ready to run on one datum's tensors.
#[derive(Debug, PartialEq)]
pub struct CompiledLoss {
    inputs: Vec<CustomLossInput>,
    nodes: Vec<Node>,
}

/// A tensor a custom loss reads from a datum's `loss_fn_inputs`, as floats (int64 values
/// converted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InputTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// A value while a graph runs.
#[derive(Clone, Debug)]
enum Value {
    Tensor(Tensor),
    Number(f64),
}

impl CompiledLoss {
    /// Check `graph` against the operations of this module and the loss's declared inputs
    /// (`logprobs` first, then the `loss_fn_inputs` it reads, in order): every node's operation
    /// allowed, every reference to an earlier node, one output last.
    pub fn compile(graph: LossGraph, inputs: &[CustomLossInput]) -> Result<Self, GraphError> {
        if graph.format != 1 {
            return Err(GraphError::Format(graph.format));
        }
        check_inputs(inputs)?;
        if graph.nodes.len() > MAX_NODES {
            return Err(GraphError::TooLarge {
                nodes: graph.nodes.len(),
            });
        }
        let mut seen: Vec<&str> = Vec::new();
        let mut placeholders = 0;
        for (at, node) in graph.nodes.iter().enumerate() {
            match node.op {
                NodeOp::Placeholder => {
                    if placeholders != at {
                        return Err(GraphError::malformed(node, "an input after an operation"));
                    }
                    placeholders += 1;
                }
                NodeOp::CallFunction if FUNCTIONS.contains(&node.target.as_str()) => {}
                NodeOp::CallMethod if METHODS.contains(&node.target.as_str()) => {}
                NodeOp::Output if at + 1 == graph.nodes.len() => {}
                NodeOp::Output => {
                    return Err(GraphError::malformed(node, "an output before the end"));
                }
                op => {
                    return Err(GraphError::NotAllowed {
                        node: node.name.clone(),
                        what: format!("{op:?} `{}`", node.target),
                    });
                }
            }
            for arg in node.args.iter().chain(node.kwargs.values()) {
                check_arg(node, arg, &seen)?;
            }
            seen.push(&node.name);
        }
        if graph.nodes.last().is_none_or(|n| n.op != NodeOp::Output) {
            return Err(GraphError::Malformed {
                node: "output".into(),
                problem: "the graph has no output".into(),
            });
        }
        if placeholders != inputs.len() {
            return Err(GraphError::Inputs {
                given: placeholders,
                declared: inputs.len(),
            });
        }
        Ok(CompiledLoss {
            inputs: inputs.to_vec(),
            nodes: graph.nodes,
        })
    }

    /// The inputs it takes, in order (`logprobs` first).
    pub fn inputs(&self) -> &[CustomLossInput] {
        &self.inputs
    }

    /// Whether the loss runs on a datum of `targets` target tokens with these `inputs`. Its
    /// shapes do not depend on the logprobs' values, so one run on zeros finds a mis-shaped or
    /// missing input before a pass computes anything.
    pub fn check_datum(
        &self,
        targets: usize,
        inputs: &BTreeMap<String, InputTensor>,
    ) -> Result<(), GraphError> {
        let zeros = Tensor::zeros(targets, DType::F32, &Device::Cpu).map_err(|source| {
            GraphError::Tensor {
                node: "logprobs".into(),
                source,
            }
        })?;
        self.evaluate_datum(&zeros, inputs).map(|_| ())
    }

    /// Run the loss on one datum: `logprobs` (its learner logprobs, `[T]`) and the
    /// `loss_fn_inputs` it reads from `inputs`, made tensors of `logprobs`' dtype and checked
    /// against the declared ranks.
    pub fn evaluate_datum(
        &self,
        logprobs: &Tensor,
        inputs: &BTreeMap<String, InputTensor>,
    ) -> Result<(Tensor, BTreeMap<String, Tensor>), GraphError> {
        let mut tensors = vec![logprobs.clone()];
        for declared in self.inputs.iter().skip(1) {
            let input = inputs
                .get(&declared.name)
                .ok_or_else(|| GraphError::MissingInput(declared.name.clone()))?;
            if input.shape.len() != usize::from(declared.rank) {
                return Err(GraphError::InputRank {
                    name: declared.name.clone(),
                    shape: input.shape.clone(),
                    rank: declared.rank,
                });
            }
            let tensor =
                Tensor::from_slice(&input.values, input.shape.as_slice(), logprobs.device())
                    .and_then(|t| t.to_dtype(logprobs.dtype()))
                    .map_err(|source| GraphError::Tensor {
                        node: declared.name.clone(),
                        source,
                    })?;
            tensors.push(tensor);
        }
        self.evaluate(&tensors)
    }

    /// Run the loss on one datum's `inputs` (in [`Self::inputs`]'s order): its scalar loss and
    /// its metrics (`custom/NAME:sum` or `:mean`), as candle tensors that keep the graph back to
    /// the inputs.
    pub fn evaluate(
        &self,
        inputs: &[Tensor],
    ) -> Result<(Tensor, BTreeMap<String, Tensor>), GraphError> {
        let mut values: HashMap<&str, Value> = HashMap::new();
        let mut next_input = inputs.iter();
        for node in &self.nodes {
            let value = match node.op {
                NodeOp::Placeholder => match next_input.next() {
                    Some(tensor) => Value::Tensor(tensor.clone()),
                    None => {
                        return Err(GraphError::Inputs {
                            given: inputs.len(),
                            declared: self.inputs.len(),
                        });
                    }
                },
                NodeOp::Output => return output(node, &values),
                _ => call(node, &values).map_err(|e| match e {
                    Failure::Graph(e) => e,
                    Failure::Tensor(source) => GraphError::Tensor {
                        node: node.name.clone(),
                        source,
                    },
                })?,
            };
            values.insert(&node.name, value);
        }
        Err(GraphError::Malformed {
            node: "output".into(),
            problem: "the graph has no output".into(),
        })
    }
}

/// Refuse an argument that is none of a number, a reference to an earlier node, or a list,
/// tuple or dict of them.
fn check_arg(node: &Node, arg: &Arg, seen: &[&str]) -> Result<(), GraphError> {
    match arg {
        Arg::Null | Arg::Bool(_) | Arg::Int(_) | Arg::Float(_) | Arg::Text(_) => Ok(()),
        Arg::SpecialFloat { float } => match float.as_str() {
            "inf" | "-inf" | "nan" => Ok(()),
            other => Err(GraphError::malformed(node, format!("the float {other:?}"))),
        },
        Arg::Ref { name } if seen.contains(&name.as_str()) => Ok(()),
        Arg::Ref { name } => Err(GraphError::malformed(
            node,
            format!("{name:?} is not an earlier node"),
        )),
        Arg::List(items) | Arg::Tuple { tuple: items } => {
            items.iter().try_for_each(|a| check_arg(node, a, seen))
        }
        Arg::Dict { dict } => dict.values().try_for_each(|a| check_arg(node, a, seen)),
        Arg::Other(object) => Err(GraphError::NotAllowed {
            node: node.name.clone(),
            what: format!(
                "an argument of kind {:?}",
                object.keys().next().map_or("", String::as_str)
            ),
        }),
    }
}

/// What went wrong in one call.
enum Failure {
    Graph(GraphError),
    Tensor(candle_core::Error),
}

impl From<candle_core::Error> for Failure {
    fn from(e: candle_core::Error) -> Self {
        Failure::Tensor(e)
    }
}

/// The value of argument `arg`.
fn value(node: &Node, arg: &Arg, values: &HashMap<&str, Value>) -> Result<Value, Failure> {
    let bad = |problem: String| Failure::Graph(GraphError::malformed(node, problem));
    match arg {
        Arg::Ref { name } => values
            .get(name.as_str())
            .cloned()
            .ok_or_else(|| bad(format!("{name:?} has no value"))),
        Arg::Int(n) => Ok(Value::Number(*n as f64)),
        Arg::Float(x) => Ok(Value::Number(*x)),
        Arg::SpecialFloat { float } => match float.as_str() {
            "inf" => Ok(Value::Number(f64::INFINITY)),
            "-inf" => Ok(Value::Number(f64::NEG_INFINITY)),
            _ => Ok(Value::Number(f64::NAN)),
        },
        other => Err(bad(format!("{other:?} where a tensor or a number belongs"))),
    }
}

/// One `call_function` or `call_method` node.
fn call(node: &Node, values: &HashMap<&str, Value>) -> Result<Value, Failure> {
    let name = node
        .target
        .rsplit('.')
        .next()
        .unwrap_or(node.target.as_str());
    let arg = |i: usize| -> Result<Value, Failure> {
        match node.args.get(i) {
            Some(a) => value(node, a, values),
            None => Err(Failure::Graph(GraphError::malformed(
                node,
                format!("`{}` needs argument {}", node.target, i + 1),
            ))),
        }
    };
    // An optional number, by position or by keyword.
    let number = |i: usize, key: &str| -> Result<Option<f64>, Failure> {
        let given = node.args.get(i).or_else(|| node.kwargs.get(key));
        match given {
            None | Some(Arg::Null) => Ok(None),
            Some(a) => match value(node, a, values)? {
                Value::Number(x) => Ok(Some(x)),
                Value::Tensor(_) => Err(Failure::Graph(GraphError::NotAllowed {
                    node: node.name.clone(),
                    what: format!("a tensor as `{key}` of `{}`", node.target),
                })),
            },
        }
    };
    let tensor = |v: Value| -> Result<Tensor, Failure> {
        match v {
            Value::Tensor(t) => Ok(t),
            Value::Number(_) => Err(Failure::Graph(GraphError::malformed(
                node,
                format!("`{}` of a plain number", node.target),
            ))),
        }
    };
    let unary = |f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>| -> Result<Value, Failure> {
        Ok(Value::Tensor(f(&tensor(arg(0)?)?)?))
    };
    Ok(match name {
        "add" | "sub" | "mul" | "truediv" | "div" => binary(name, arg(0)?, arg(1)?)?,
        "pow" => match (arg(0)?, arg(1)?) {
            (Value::Tensor(t), Value::Number(2.0)) => Value::Tensor(t.sqr()?),
            (Value::Tensor(t), Value::Number(p)) => Value::Tensor(t.powf(p)?),
            (Value::Number(x), Value::Number(p)) => Value::Number(x.powf(p)),
            _ => {
                return Err(Failure::Graph(GraphError::NotAllowed {
                    node: node.name.clone(),
                    what: "a power with a tensor exponent".into(),
                }));
            }
        },
        "neg" => match arg(0)? {
            Value::Tensor(t) => Value::Tensor(t.neg()?),
            Value::Number(x) => Value::Number(-x),
        },
        "exp" => unary(&|t| t.exp())?,
        "log" => unary(&|t| t.log())?,
        "abs" => unary(&|t| t.abs())?,
        "sqrt" => unary(&|t| t.sqrt())?,
        "square" => unary(&|t| t.sqr())?,
        "tanh" => unary(&|t| t.tanh())?,
        "sigmoid" => unary(&|t| (t.neg()?.exp()? + 1.0)?.recip())?,
        "detach" => unary(&|t| Ok(t.detach()))?,
        "clamp" => {
            let t = tensor(arg(0)?)?;
            let (low, high) = (number(1, "min")?, number(2, "max")?);
            let low = match low {
                Some(low) => t.maximum(low)?,
                None => t,
            };
            Value::Tensor(match high {
                Some(high) => low.minimum(high)?,
                None => low,
            })
        }
        "minimum" | "maximum" => {
            let (a, b) = (tensor(arg(0)?)?, tensor(arg(1)?)?);
            Value::Tensor(match name {
                "minimum" => a.broadcast_minimum(&b)?,
                _ => a.broadcast_maximum(&b)?,
            })
        }
        "sum" | "mean" => {
            let t = tensor(arg(0)?)?;
            let dim = number(1, "dim")?;
            if node.kwargs.contains_key("keepdim") {
                return Err(Failure::Graph(GraphError::NotAllowed {
                    node: node.name.clone(),
                    what: format!("`keepdim` of `{}`", node.target),
                }));
            }
            Value::Tensor(match (name, dim) {
                ("sum", None) => t.sum_all()?,
                (_, None) => t.mean_all()?,
                ("sum", Some(d)) => t.sum(dim_index(node, &t, d)?)?,
                (_, Some(d)) => t.mean(dim_index(node, &t, d)?)?,
            })
        }
        other => {
            return Err(Failure::Graph(GraphError::NotAllowed {
                node: node.name.clone(),
                what: format!("`{other}`"),
            }));
        }
    })
}

/// A dimension as torch counts it (negative from the end) in `t`'s.
fn dim_index(node: &Node, t: &Tensor, dim: f64) -> Result<usize, Failure> {
    let rank = t.rank() as i64;
    let d = dim as i64;
    let at = if d < 0 { rank + d } else { d };
    if dim.fract() != 0.0 || !(0..rank).contains(&at) {
        return Err(Failure::Graph(GraphError::malformed(
            node,
            format!("dimension {dim} of a tensor of rank {rank}"),
        )));
    }
    Ok(at as usize)
}

/// `a OP b` for tensors and numbers in any mix, tensors broadcast.
fn binary(op: &str, a: Value, b: Value) -> Result<Value, Failure> {
    use Value::{Number, Tensor as T};
    Ok(match (op, a, b) {
        ("add", T(a), T(b)) => T(a.broadcast_add(&b)?),
        ("sub", T(a), T(b)) => T(a.broadcast_sub(&b)?),
        ("mul", T(a), T(b)) => T(a.broadcast_mul(&b)?),
        (_, T(a), T(b)) => T(a.broadcast_div(&b)?),
        ("add", T(t), Number(x)) | ("add", Number(x), T(t)) => T((t + x)?),
        ("sub", T(t), Number(x)) => T((t - x)?),
        ("sub", Number(x), T(t)) => T(t.affine(-1.0, x)?),
        ("mul", T(t), Number(x)) | ("mul", Number(x), T(t)) => T((t * x)?),
        (_, T(t), Number(x)) => T((t / x)?),
        (_, Number(x), T(t)) => T((t.recip()? * x)?),
        ("add", Number(x), Number(y)) => Number(x + y),
        ("sub", Number(x), Number(y)) => Number(x - y),
        ("mul", Number(x), Number(y)) => Number(x * y),
        (_, Number(x), Number(y)) => Number(x / y),
    })
}

/// The output node: `(loss, {metric: value})`, or the loss alone.
fn output(
    node: &Node,
    values: &HashMap<&str, Value>,
) -> Result<(Tensor, BTreeMap<String, Tensor>), GraphError> {
    let as_tensor = |arg: &Arg| -> Result<Tensor, GraphError> {
        match value(node, arg, values) {
            Ok(Value::Tensor(t)) => Ok(t),
            Ok(Value::Number(_)) | Err(_) => Err(GraphError::malformed(
                node,
                "the loss and its metrics must be tensors computed by the graph",
            )),
        }
    };
    let (loss, metrics) = match node.args.first() {
        Some(Arg::Tuple { tuple }) => match &tuple[..] {
            [loss, Arg::Dict { dict }] => (loss, Some(dict)),
            [loss] => (loss, None),
            _ => {
                return Err(GraphError::malformed(
                    node,
                    "the output is not (loss, metrics)",
                ));
            }
        },
        Some(loss) => (loss, None),
        None => return Err(GraphError::malformed(node, "the output is empty")),
    };
    let loss = as_tensor(loss)?;
    if !loss.dims().is_empty() {
        return Err(GraphError::NotScalar {
            node: node.name.clone(),
            shape: loss.dims().to_vec(),
        });
    }
    let mut named = BTreeMap::new();
    for (name, arg) in metrics.into_iter().flatten() {
        named.insert(name.clone(), as_tensor(arg)?);
    }
    Ok((loss, named))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// `-(logprobs * weights).sum()` as the SDK 0.38 encodes it.
    const NEG_LL: &str = r#"{"format": 1, "nodes": [{"op": "placeholder", "name": "logprobs", "target": "logprobs", "args": [], "kwargs": {}}, {"op": "placeholder", "name": "weights", "target": "weights", "args": [], "kwargs": {}}, {"op": "call_function", "name": "mul", "target": "operator.mul", "args": [{"ref": "logprobs"}, {"ref": "weights"}], "kwargs": {}}, {"op": "call_method", "name": "sum_1", "target": "sum", "args": [{"ref": "mul"}], "kwargs": {}}, {"op": "call_function", "name": "neg", "target": "operator.neg", "args": [{"ref": "sum_1"}], "kwargs": {}}, {"op": "output", "name": "output", "target": "output", "args": [{"tuple": [{"ref": "neg"}, {"dict": {"custom/neg_ll:sum": {"ref": "neg"}}}]}], "kwargs": {}}]}"#;

    /// PPO's clipped objective (clip 0.8, 1.2) and the mean ratio, as the SDK encodes it.
    const PPO: &str = r#"{"format": 1, "nodes": [{"op": "placeholder", "name": "logprobs", "target": "logprobs", "args": [], "kwargs": {}}, {"op": "placeholder", "name": "sampler_logprobs", "target": "sampler_logprobs", "args": [], "kwargs": {}}, {"op": "placeholder", "name": "advantages", "target": "advantages", "args": [], "kwargs": {}}, {"op": "call_function", "name": "sub", "target": "operator.sub", "args": [{"ref": "logprobs"}, {"ref": "sampler_logprobs"}], "kwargs": {}}, {"op": "call_function", "name": "exp", "target": "torch.exp", "args": [{"ref": "sub"}], "kwargs": {}}, {"op": "call_function", "name": "clamp", "target": "torch.clamp", "args": [{"ref": "exp"}, 0.8, 1.2], "kwargs": {}}, {"op": "call_function", "name": "mul", "target": "operator.mul", "args": [{"ref": "exp"}, {"ref": "advantages"}], "kwargs": {}}, {"op": "call_function", "name": "mul_1", "target": "operator.mul", "args": [{"ref": "clamp"}, {"ref": "advantages"}], "kwargs": {}}, {"op": "call_function", "name": "minimum", "target": "torch.minimum", "args": [{"ref": "mul"}, {"ref": "mul_1"}], "kwargs": {}}, {"op": "call_method", "name": "sum_1", "target": "sum", "args": [{"ref": "minimum"}], "kwargs": {}}, {"op": "call_function", "name": "neg", "target": "operator.neg", "args": [{"ref": "sum_1"}], "kwargs": {}}, {"op": "call_method", "name": "mean", "target": "mean", "args": [{"ref": "exp"}], "kwargs": {}}, {"op": "call_method", "name": "detach", "target": "detach", "args": [{"ref": "mean"}], "kwargs": {}}, {"op": "output", "name": "output", "target": "output", "args": [{"tuple": [{"ref": "neg"}, {"dict": {"custom/ratio:mean": {"ref": "detach"}}}]}], "kwargs": {}}]}"#;

    fn compile(json: &str, inputs: &[&str]) -> Result<CompiledLoss, GraphError> {
        let graph: LossGraph = serde_json::from_str(json).unwrap();
        let inputs: Vec<CustomLossInput> = inputs
            .iter()
            .map(|name| CustomLossInput {
                name: name.to_string(),
                rank: 1,
            })
            .collect();
        CompiledLoss::compile(graph, &inputs)
    }

    fn tensor(values: &[f64]) -> Tensor {
        Tensor::new(values, &Device::Cpu).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_vec1::<f64>().unwrap()
    }

    #[test]
    fn the_negative_log_likelihood_has_the_negated_weights_as_its_gradient() {
        let loss = compile(NEG_LL, &["logprobs", "weights"]).unwrap();
        let logprobs = Var::from_tensor(&tensor(&[-1.0, -2.0, -0.5])).unwrap();
        let weights = tensor(&[1.0, 0.0, 2.0]);
        let (value, metrics) = loss
            .evaluate(&[logprobs.as_tensor().clone(), weights])
            .unwrap();
        assert_eq!(value.to_scalar::<f64>().unwrap(), 2.0);
        assert_eq!(
            metrics["custom/neg_ll:sum"].to_scalar::<f64>().unwrap(),
            2.0
        );
        let gradient = value.backward().unwrap();
        assert_eq!(values(gradient.get(&logprobs).unwrap()), [-1.0, 0.0, -2.0]);
    }

    #[test]
    fn ppo_as_a_graph_has_the_clipped_gradient() {
        let loss = compile(PPO, &["logprobs", "sampler_logprobs", "advantages"]).unwrap();
        let (lp, old, adv) = ([-1.0, -1.0, -1.0], [-1.0, -1.5, -0.5], [1.0, 1.0, -1.0]);
        let logprobs = Var::from_tensor(&tensor(&lp)).unwrap();
        let run = |x: &Tensor| {
            loss.evaluate(&[x.clone(), tensor(&old), tensor(&adv)])
                .unwrap()
        };
        let (value, metrics) = run(logprobs.as_tensor());
        let gradient = values(value.backward().unwrap().get(&logprobs).unwrap());
        // Ratio 1 (unclipped): -A·r; ratio e^0.5 > 1.2 with A > 0: clipped, no gradient;
        // ratio e^-0.5 < 0.8 with A < 0: min picks the clipped term, no gradient.
        let expected = [-1.0, 0.0, 0.0];
        for (g, e) in gradient.iter().zip(expected) {
            assert!((g - e).abs() < 1e-12, "{gradient:?}");
        }
        let ratios: f64 = lp.iter().zip(old).map(|(l, o)| (l - o).exp()).sum::<f64>() / 3.0;
        let mean = metrics["custom/ratio:mean"].to_scalar::<f64>().unwrap();
        assert!((mean - ratios).abs() < 1e-12);
        // The metric is detached: it adds nothing to any gradient.
        let through_metric = metrics["custom/ratio:mean"].backward().unwrap();
        assert!(through_metric.get(&logprobs).is_none());
    }

    #[test]
    fn an_operation_off_the_list_is_refused_by_name_before_any_work() {
        let forbidden = NEG_LL.replace("\"operator.neg\"", "\"builtins.eval\"");
        let err = compile(&forbidden, &["logprobs", "weights"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("builtins.eval") && err.contains("not an operation"),
            "{err}"
        );
        let method = NEG_LL.replace("\"target\": \"sum\"", "\"target\": \"numpy\"");
        let err = compile(&method, &["logprobs", "weights"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("numpy"), "{err}");
        let module = NEG_LL.replace("\"op\": \"call_method\"", "\"op\": \"call_module\"");
        let err = compile(&module, &["logprobs", "weights"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CallModule"), "{err}");
        let dtype = NEG_LL.replace(
            "\"args\": [{\"ref\": \"mul\"}]",
            "\"args\": [{\"ref\": \"mul\"}, {\"dtype\": \"float64\"}]",
        );
        let err = compile(&dtype, &["logprobs", "weights"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("dtype"), "{err}");
        // References must be to earlier nodes; the inputs must be the declared ones.
        let forward = NEG_LL.replace("{\"ref\": \"mul\"}", "{\"ref\": \"neg\"}");
        let err = compile(&forward, &["logprobs", "weights"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"neg\" is not an earlier node"), "{err}");
        let err = compile(NEG_LL, &["logprobs"]).unwrap_err().to_string();
        assert!(err.contains("2 inputs where the loss declares 1"), "{err}");
        let err = compile(
            &NEG_LL.replace("\"format\": 1", "\"format\": 2"),
            &["logprobs", "weights"],
        );
        assert!(matches!(err, Err(GraphError::Format(2))));
    }

    #[test]
    fn inputs_the_engine_cannot_give_are_refused_and_a_datum_is_checked_against_them() {
        let graph = || serde_json::from_str::<LossGraph>(NEG_LL).unwrap();
        let input = |name: &str, rank| CustomLossInput {
            name: name.into(),
            rank,
        };
        let refused = |inputs: &[CustomLossInput]| {
            CompiledLoss::compile(graph(), inputs)
                .unwrap_err()
                .to_string()
        };
        let top_k = refused(&[input("logprobs", 2), input("weights", 1)]);
        assert!(top_k.contains("logprobs has rank 2"), "{top_k}");
        let first = refused(&[input("weights", 1), input("logprobs", 1)]);
        assert!(first.contains("first input must be `logprobs`"), "{first}");
        let twice = refused(&[input("logprobs", 1), input("logprobs", 1)]);
        assert!(twice.contains("declared twice"), "{twice}");

        let loss =
            CompiledLoss::compile(graph(), &[input("logprobs", 1), input("weights", 1)]).unwrap();
        let weights = |shape: Vec<usize>, values: Vec<f32>| {
            BTreeMap::from([("weights".to_string(), InputTensor { shape, values })])
        };
        assert!(loss.check_datum(3, &weights(vec![3], vec![1.0; 3])).is_ok());
        let missing = loss.check_datum(3, &BTreeMap::new()).unwrap_err();
        assert!(matches!(missing, GraphError::MissingInput(ref n) if n == "weights"));
        let scalar = loss
            .check_datum(3, &weights(vec![], vec![1.0]))
            .unwrap_err();
        assert!(
            matches!(scalar, GraphError::InputRank { rank: 1, .. }),
            "{scalar}"
        );
        let short = loss
            .check_datum(3, &weights(vec![2], vec![1.0; 2]))
            .unwrap_err();
        assert!(short.to_string().contains("shape mismatch"), "{short}");
    }

    #[test]
    fn a_loss_that_is_not_a_scalar_is_refused() {
        let per_token = NEG_LL.replace("\"target\": \"sum\"", "\"target\": \"abs\"");
        let loss = compile(&per_token, &["logprobs", "weights"]).unwrap();
        let err = loss
            .evaluate(&[tensor(&[-1.0, -2.0]), tensor(&[1.0, 1.0])])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("must be a scalar") && err.contains("[2]"),
            "{err}"
        );
    }
}

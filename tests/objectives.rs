//! Objectives and advantage estimators (contract 0.3) in the sandbox: a PPO loss written as a
//! plugin answers with its gradient, an estimator with its advantages, and an objective that
//! loops, answers NaN or the wrong length, hoards memory or fails ends as that call's typed
//! error, the plugin answering the next call as before.

use std::time::{Duration, Instant};

use opentinker::plugin::{
    ContractVersion, ErrorKind, Limits, ObjectiveDatum, ObjectiveTensor, PluginKind,
};
use opentinker_tests::{load, test_host};

/// A datum of `logprobs` with every token counted, the sampler's logprobs and advantages.
fn datum(logprobs: &[f32], sampler: &[f32], advantages: &[f32]) -> ObjectiveDatum {
    let tensor = |name: &str, values: &[f32]| ObjectiveTensor {
        name: name.into(),
        shape: vec![values.len() as u32],
        values: values.to_vec(),
    };
    ObjectiveDatum {
        logprobs: logprobs.to_vec(),
        inputs: vec![
            tensor("mask", &vec![1.0; logprobs.len()]),
            tensor("advantages", advantages),
            tensor("logprobs", sampler),
        ],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ppo_objective_answers_each_datums_loss_and_gradient() {
    let host = test_host();
    let limits = Limits::default();
    let ppo = load(&host, "ppo-loss").await;
    assert_eq!(ppo.contract(), ContractVersion::V0_3);
    assert_eq!(ppo.description().kinds, vec![PluginKind::Objective]);
    let metadata = ppo.metadata(&limits).await.unwrap().unwrap();
    assert_eq!(metadata.kinds, vec![PluginKind::Objective]);
    assert!(metadata.config_schema.is_some());

    // Ratios 1, e^0.5 and e^-0.5: inside the clip, above it for a positive advantage, below
    // it for a negative one.
    let datums = [
        datum(&[-1.0, -0.5, -1.5], &[-1.0; 3], &[1.0, 1.0, -1.0]),
        datum(&[-2.0], &[-2.0], &[0.5]),
    ];
    let losses = ppo.objective_loss("{}", &datums, &limits).await.unwrap();
    assert_eq!(losses.len(), 2);
    assert_eq!(losses[0].gradient, vec![-1.0, 0.0, 0.0]);
    assert!((losses[0].value - -(1.0 + 1.2 - 0.8)).abs() < 1e-6);
    assert_eq!(losses[1].gradient, vec![-0.5]);
    assert_eq!(losses[0].metrics[0].name, "clipped_tokens:sum");

    // The plugin's own refusal (a config key it does not know) is its error, named.
    let error = ppo
        .objective_loss(r#"{"clip": 2}"#, &datums, &limits)
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::PluginError, "{error}");
    assert!(error.message.contains("clip"), "{error}");

    // An objective is not an estimator, and the other way round.
    let error = ppo
        .advantages("{}", &[vec![1.0]], &limits)
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert!(error.message.contains("advantage estimator"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_advantage_estimator_answers_per_turn_advantages() {
    let host = test_host();
    let limits = Limits::default();
    let rank = load(&host, "rank-advantage").await;
    assert_eq!(rank.description().kinds, vec![PluginKind::Advantage]);
    let group = [vec![0.0, 1.0], vec![5.0], vec![1.0], vec![-3.0]];
    let advantages = rank.advantages("{}", &group, &limits).await.unwrap();
    assert_eq!(
        advantages,
        vec![vec![0.0, 0.0], vec![1.0], vec![0.0], vec![-1.0]]
    );
    let error = rank
        .objective_loss("{}", &[datum(&[-1.0], &[-1.0], &[1.0])], &limits)
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidRequest);
    assert!(error.message.contains("objective"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_objective_ends_as_a_typed_error_and_answers_the_next_call() {
    let host = test_host();
    let limits = Limits {
        call_timeout_ms: 5_000,
        ..Limits::default()
    };
    let objective = load(&host, "adversarial/objective").await;
    let datums = [
        datum(&[-1.0, -2.0], &[-1.0, -2.0], &[1.0, 1.0]),
        datum(&[-0.5], &[-0.5], &[1.0]),
    ];
    let cases = [
        (
            "loop",
            &[ErrorKind::OutOfFuel, ErrorKind::Timeout][..],
            "fuel",
        ),
        ("nan", &[ErrorKind::InvalidOutput][..], "NaN at token 0"),
        (
            "short",
            &[ErrorKind::InvalidOutput][..],
            "1 values for 2 logprobs",
        ),
        ("memory", &[ErrorKind::MemoryLimit][..], "memory"),
        (
            "error",
            &[ErrorKind::PluginError][..],
            "refusing on purpose",
        ),
    ];
    for (config, kinds, said) in cases {
        let started = Instant::now();
        let error = objective
            .objective_loss(config, &datums, &limits)
            .await
            .unwrap_err();
        assert!(kinds.contains(&error.kind), "{config}: {error}");
        assert!(error.message.contains(said), "{config}: {error}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{config} took {:?}",
            started.elapsed()
        );
        // Each call has an instance of its own: the next one answers as if nothing happened.
        let losses = objective
            .objective_loss("fine", &datums, &limits)
            .await
            .unwrap();
        assert_eq!(losses[0].gradient, vec![-1.0, -1.0], "after {config}");
        assert!((losses[0].value - 3.0).abs() < 1e-9);
    }
}

/// An objective written on the Python SDK (`plugins/python/kl-penalty`, a loss the engine does
/// not have): its value and gradient are the formula's, computed here again; its metric is
/// averaged; a datum without the reference it needs is the plugin's error, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_objective_answers_its_loss_and_gradient() {
    if opentinker_test_tools::componentize_py().is_none() {
        return;
    }
    let host = test_host();
    let limits = Limits::default();
    let kl = load(&host, "python/kl-penalty").await;
    assert_eq!(kl.contract(), ContractVersion::V0_3);
    assert_eq!(kl.description().kinds, vec![PluginKind::Objective]);
    let metadata = kl.metadata(&limits).await.unwrap().unwrap();
    assert_eq!(metadata.language, "python");

    let (logprobs, sampler, advantages) = (
        [-1.0f32, -0.3, -2.0],
        [-1.2f32, -0.4, -2.5],
        [0.5f32, -1.0, 2.0],
    );
    let reference = [-1.5f32, -0.2, -3.0];
    let mut with_reference = datum(&logprobs, &sampler, &advantages);
    with_reference.inputs.push(ObjectiveTensor {
        name: "ref_logprobs".into(),
        shape: vec![3],
        values: reference.to_vec(),
    });
    let beta = 0.3f64;
    let losses = kl
        .objective_loss(r#"{"beta": 0.3}"#, &[with_reference.clone()], &limits)
        .await
        .unwrap();
    let (mut value, mut kl_sum) = (0.0f64, 0.0f64);
    for t in 0..3 {
        let (lp, q, r, a) = (
            f64::from(logprobs[t]),
            f64::from(sampler[t]),
            f64::from(reference[t]),
            f64::from(advantages[t]),
        );
        let k3 = (r - lp).exp() - (r - lp) - 1.0;
        value += -a * (lp - q).exp() + beta * k3;
        kl_sum += k3;
        let gradient = -a * (lp - q).exp() + beta * (1.0 - (r - lp).exp());
        assert!(
            (f64::from(losses[0].gradient[t]) - gradient).abs() < 1e-5,
            "token {t}: {} against {gradient}",
            losses[0].gradient[t]
        );
    }
    assert!(
        (losses[0].value - value).abs() < 1e-5,
        "{} against {value}",
        losses[0].value
    );
    let metric = &losses[0].metrics[0];
    assert_eq!(metric.name, "kl_to_reference:mean");
    assert!((metric.value - kl_sum / 3.0).abs() < 1e-5);

    let error = kl
        .objective_loss("{}", &[datum(&logprobs, &sampler, &advantages)], &limits)
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::PluginError, "{error}");
    assert!(error.message.contains("ref_logprobs"), "{error}");
}

/// An advantage estimator written on the JavaScript SDK (`plugins/js/loo-advantage`, leave-one-out
/// baselines, which the host does not have): its advantages are each return minus the mean of
/// the others', per turn, and its config is checked against the schema it declares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_estimator_answers_leave_one_out_advantages() {
    if opentinker_test_tools::js_toolchain().is_none() {
        return;
    }
    let host = test_host();
    let limits = Limits::default();
    let loo = load(&host, "js/loo-advantage").await;
    assert_eq!(loo.contract(), ContractVersion::V0_3);
    assert_eq!(loo.description().kinds, vec![PluginKind::Advantage]);
    let group = [vec![0.0, 1.0], vec![5.0], vec![0.0]];
    let advantages = loo.advantages("{}", &group, &limits).await.unwrap();
    assert_eq!(advantages, vec![vec![-1.5, -1.5], vec![4.5], vec![-3.0]]);
    let normalised = loo
        .advantages(r#"{"normalise": true}"#, &[vec![1.0], vec![3.0]], &limits)
        .await
        .unwrap();
    assert_eq!(normalised, vec![vec![-2.0], vec![2.0]]);
    let error = loo
        .check_config(r#"{"normalize": true}"#, &limits)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("normalize"), "{error}");
}

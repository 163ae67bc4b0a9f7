//! `opentinker serve` answering bad requests: each gets a 4xx with a JSON body in the Tinker
//! error shape that names the problem, never a panic, a hang or a 500. Plain HTTP/1.1 over a
//! socket, so that nothing between the test and the server is forgiving.

#[path = "common/plugin_build.rs"]
mod plugin_build;
#[path = "common/server.rs"]
mod server;
#[path = "common/tinker_http.rs"]
mod tinker_http;

use std::collections::BTreeMap;

use opentinker::wire::proto;
use plugin_build::built_plugin;
use prost::Message;
use serde_json::{Value, json};
use server::{Server, start_server};
use tinker_http::{call, exchange, get, model, post, refused, result};

/// One token sampled from the sampling session `id` of `alice`: the answer to `asample`.
fn sample_one(server: &Server, id: &str) -> (u16, Value) {
    post(
        server,
        "asample",
        json!({"sampling_session_id": id, "seq_id": 1, "num_samples": 1,
               "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
               "sampling_params": {"max_tokens": 1}}),
    )
}

fn tensor_i64(values: &[i64]) -> proto::Tensor {
    proto::Tensor {
        encoding: Some(proto::tensor::Encoding::Dense(
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )),
        dtype: proto::DType::Int64 as i32,
        shape: vec![values.len() as i64],
    }
}

fn datum(tokens: &[i32], targets: proto::Tensor) -> proto::Datum {
    proto::Datum {
        model_input: vec![proto::Chunk {
            chunk: Some(proto::chunk::Chunk::EncodedText(proto::EncodedTextChunk {
                tokens: tokens.iter().flat_map(|t| t.to_le_bytes()).collect(),
            })),
        }],
        loss_fn_inputs: BTreeMap::from([("target_tokens".to_string(), targets)]),
        ..Default::default()
    }
}

fn forward_backward(server: &Server, request: proto::ForwardBackwardRequest) -> (u16, Value) {
    call(
        server,
        "forward_backward",
        Some(&server.alice),
        "application/x-protobuf",
        &request.encode_to_vec(),
    )
}

fn request(
    model: &str,
    seq: i32,
    data: Vec<proto::Datum>,
    loss: &str,
) -> proto::ForwardBackwardRequest {
    proto::ForwardBackwardRequest {
        model_id: model.to_string(),
        seq_id: seq,
        data,
        loss_fn: loss.to_string(),
        ..Default::default()
    }
}

#[test]
fn keys_are_checked_before_anything_else() {
    let server = start_server();
    let body = br#"{"tags": []}"#;
    let (status, error) = refused(call(
        &server,
        "create_session",
        None,
        "application/json",
        body,
    ));
    assert_eq!((status, error.as_str()), (401, "no API key (X-API-Key)"));
    let (status, error) = refused(call(
        &server,
        "create_session",
        Some("tml-0000_ffff"),
        "application/json",
        body,
    ));
    assert_eq!((status, error.as_str()), (401, "invalid API key"));
}

#[test]
fn a_rotated_or_revoked_key_stops_working_on_the_running_server() {
    let server = start_server();
    let status = |key: &str| {
        call(
            &server,
            "create_session",
            Some(key),
            "application/json",
            b"{}",
        )
        .0
    };
    // The server's check of a key it has seen is at most `KEY_RECHECK` (1 s) old.
    let refused_soon = |key: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while status(key) != 401 {
            assert!(std::time::Instant::now() < deadline, "{key} still works");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    assert_eq!(status(&server.alice), 200);
    let data = server.data.path();
    let new = server::tenant_command(data, &["rotate-key", "alice"]);
    assert!(new.starts_with("tml-") && new != server.alice, "{new}");
    refused_soon(&server.alice);
    assert_eq!(status(&new), 200);
    assert_eq!(server::tenant_command(data, &["revoke", "alice"]), "");
    refused_soon(&new);
    assert_eq!(status(&server.bob), 200, "another tenant's key was touched");
    let again = server::tenant_command(data, &["rotate-key", "alice"]);
    assert_eq!(status(&again), 200);
}

#[test]
fn answers_past_their_retention_are_pruned_from_the_database() {
    let server = server::start_server_with(&[
        "--answer-retention-secs",
        "1",
        "--checkpoint-sweep-secs",
        "1",
    ]);
    let answered = || -> i64 {
        let db =
            rusqlite::Connection::open(server.data.path().join(opentinker::store::DATABASE_FILE))
                .unwrap();
        db.query_row(
            "SELECT COUNT(*) FROM requests WHERE finished = 1",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    model(&server);
    assert!(answered() >= 1, "create_model's answer is not recorded");
    // Answered at a whole second, kept a second, pruned by the next sweep (every second).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while answered() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "old answers were kept"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The model it made stays.
    assert_eq!(get(&server, "training_runs", &server.alice).0, 200);
    let (_, runs) = get(&server, "training_runs", &server.alice);
    assert_eq!(
        runs["training_runs"].as_array().map(Vec::len),
        Some(1),
        "{runs}"
    );
}

#[test]
fn malformed_and_wrong_requests_get_a_4xx_that_names_the_problem() {
    let server = start_server();
    let model = model(&server);
    let good = |seq| {
        request(
            &model,
            seq,
            vec![datum(&[1, 2, 3], tensor_i64(&[2, 3, 4]))],
            "cross_entropy",
        )
    };
    let cases: Vec<(&str, (u16, Value), u16, &str)> = vec![
        (
            "malformed JSON",
            call(
                &server,
                "create_session",
                Some(&server.alice),
                "application/json",
                b"{\"tags\": [",
            ),
            400,
            "request body",
        ),
        (
            "malformed protobuf",
            call(
                &server,
                "forward_backward",
                Some(&server.alice),
                "application/x-protobuf",
                b"\xff\xff\xff\xff",
            ),
            400,
            "malformed protobuf",
        ),
        (
            "unknown model",
            forward_backward(
                &server,
                request(
                    &model.replace(":train:0", ":train:7"),
                    1,
                    good(1).data,
                    "cross_entropy",
                ),
            ),
            404,
            "not found",
        ),
        (
            "out-of-vocabulary target",
            forward_backward(
                &server,
                request(
                    &model,
                    1,
                    vec![datum(&[1, 2, 3], tensor_i64(&[2, 3, 99_999]))],
                    "cross_entropy",
                ),
            ),
            400,
            "outside the vocabulary",
        ),
        (
            "negative token",
            forward_backward(
                &server,
                request(
                    &model,
                    1,
                    vec![datum(&[1, -2, 3], tensor_i64(&[2, 3, 4]))],
                    "cross_entropy",
                ),
            ),
            400,
            "negative",
        ),
        (
            "lengths that differ",
            forward_backward(
                &server,
                request(
                    &model,
                    1,
                    vec![datum(&[1, 2, 3], tensor_i64(&[2, 3]))],
                    "cross_entropy",
                ),
            ),
            400,
            "one per model_input token",
        ),
        (
            "wrong dtype",
            {
                let mut d = datum(&[1, 2, 3], tensor_i64(&[2, 3, 4]));
                d.loss_fn_inputs
                    .insert("weights".into(), tensor_i64(&[1, 1, 1]));
                forward_backward(&server, request(&model, 1, vec![d], "cross_entropy"))
            },
            400,
            "must be float32",
        ),
        (
            "unknown loss input",
            {
                let mut d = datum(&[1, 2, 3], tensor_i64(&[2, 3, 4]));
                d.loss_fn_inputs
                    .insert("loss_mask".into(), tensor_i64(&[1, 1, 1]));
                forward_backward(&server, request(&model, 1, vec![d], "cross_entropy"))
            },
            400,
            "unknown loss_fn_inputs key \"loss_mask\"",
        ),
        (
            "longer than the context",
            {
                let tokens: Vec<i32> = (0..40_000).map(|i| i % 500).collect();
                let targets: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
                forward_backward(
                    &server,
                    request(
                        &model,
                        1,
                        vec![datum(&tokens, tensor_i64(&targets))],
                        "cross_entropy",
                    ),
                )
            },
            400,
            "context holds",
        ),
        (
            "unknown loss",
            forward_backward(&server, request(&model, 1, good(1).data, "mse")),
            400,
            "unknown loss function \"mse\"",
        ),
        (
            "unknown loss config key",
            {
                let mut r = good(1);
                r.loss_fn = "ppo".into();
                r.loss_fn_config.insert("clip".into(), 0.2);
                forward_backward(&server, r)
            },
            400,
            "unknown config key \"clip\"",
        ),
        (
            "a bad optimizer setting",
            post(
                &server,
                "optim_step",
                json!({"model_id": model, "seq_id": 1, "adam_params": {"learning_rate": -1.0}}),
            ),
            400,
            "learning_rate",
        ),
        (
            "a path that is no checkpoint",
            post(
                &server,
                "load_weights",
                json!({"model_id": model, "seq_id": 1, "path": "file:///etc/passwd", "optimizer": false}),
            ),
            400,
            "not a checkpoint path",
        ),
        (
            "another model's checkpoint",
            post(
                &server,
                "load_weights",
                json!({"model_id": model, "seq_id": 1, "path": "tinker://s-else:train:0/weights/x", "optimizer": false}),
            ),
            404,
            "not found",
        ),
        (
            "an unknown endpoint",
            post(&server, "no_such_thing", json!({})),
            404,
            "no such endpoint",
        ),
    ];
    for (what, answer, status, text) in cases {
        let (got, error) = refused(answer);
        assert_eq!(got, status, "{what}: {error}");
        assert!(
            error.contains(text),
            "{what}: {error:?} does not say {text:?}"
        );
    }

    // A refused request takes its turn all the same (the SDK numbers its next call after it), so
    // the model's next request is seq_id 2, and it runs. A seq_id sent again with another
    // payload is refused; the same payload is the same request.
    let (status, first) = forward_backward(&server, good(2));
    assert_eq!(status, 200, "{first}");
    let (_, again) = forward_backward(&server, good(2));
    assert_eq!(first["request_id"], again["request_id"]);
    let mut other = good(2);
    other.loss_fn_config.insert("beta".into(), 1.0);
    other.loss_fn = "dro".into();
    let (status, error) = refused(forward_backward(&server, other));
    assert_eq!(status, 400);
    assert!(error.contains("different payload"), "{error}");
    let output = result(&server, first["request_id"].as_str().unwrap());
    assert!(output["protobuf_bytes"].as_u64() > Some(0), "{output}");

    // The SDK numbers a new sampler afresh on every try of one `save_weights_for_sampler`, so
    // its retry (after a restart cut the first answer) is the same request all the same; only
    // that field may differ.
    let save = |sampler: u64, ttl: Option<u64>| {
        post(
            &server,
            "save_weights_for_sampler",
            json!({"model_id": model, "seq_id": 3, "sampling_session_seq_id": sampler,
                   "ttl_seconds": ttl}),
        )
    };
    let (status, first) = save(0, None);
    assert_eq!(status, 200, "{first}");
    let (status, retry) = save(1, None);
    assert_eq!(status, 200, "{retry}");
    assert_eq!(first["request_id"], retry["request_id"]);
    let (status, error) = refused(save(2, Some(7200)));
    assert_eq!(status, 400);
    assert!(error.contains("different payload"), "{error}");
    let saved = result(&server, first["request_id"].as_str().unwrap());
    assert!(
        saved["sampling_session_id"]
            .as_str()
            .is_some_and(|id| id.ends_with(":sample:0")),
        "{saved}"
    );
}

#[test]
fn an_oversized_body_is_refused_with_the_limit_in_tinker_shape() {
    let server = start_server();
    let body = vec![b' '; opentinker::server::MAX_BODY_BYTES + 1];
    let (status, _) = refused(call(
        &server,
        "create_session",
        Some(&server.alice),
        "application/json",
        &body,
    ));
    assert_eq!(status, 413);
}

#[test]
fn the_access_log_writes_one_line_per_request_with_its_status_and_latency_and_never_a_key() {
    let data = tempfile::tempdir().unwrap();
    let alice = server::create_tenant(data.path(), "alice");
    let bob = server::create_tenant(data.path(), "bob");
    let log_path = data.path().join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (child, url, _) =
        server::spawn_server_logging(data.path(), "127.0.0.1:0", "info", log, &[]);
    let server = Server {
        child,
        url,
        data,
        alice,
        bob,
    };
    let healthy = exchange(&server, "GET", "healthz", None, "application/json", b"");
    assert_eq!(healthy.0, 200, "{}", healthy.1);
    let (status, _) = refused(get(&server, "samplers/nothing-here", &server.alice));
    assert_eq!(status, 404);
    let (status, _) = refused(call(
        &server,
        "create_session",
        Some("tml-0000_ffff"),
        "application/json",
        b"{}",
    ));
    assert_eq!(status, 401);
    let (status, _) = refused(post(&server, "no/such/route", json!({})));
    assert_eq!(status, 404);
    let (status, _) = refused(call(
        &server,
        "create_session",
        Some(&server.bob),
        "application/json",
        b"{not json",
    ));
    assert_eq!(status, 400);

    // Each line is written before its answer is sent; wait only for the file to be read whole.
    let lines: Vec<String> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .filter(|line| line.contains("opentinker::access"))
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 5, "one line per request: {lines:#?}");
    for line in &lines {
        assert!(line.contains(" INFO "), "{line}");
        assert!(line.contains("latency_ms="), "{line}");
        assert!(line.contains("id="), "{line}");
        assert!(!line.contains("tml-"), "a key in the log: {line}");
        assert!(
            !line.contains('\u{1b}'),
            "terminal colours in a file: {line}"
        );
    }
    let expect = |n: usize, parts: &[&str]| {
        for part in parts {
            assert!(
                lines[n].contains(part),
                "{part:?} missing from {}",
                lines[n]
            );
        }
    };
    expect(
        0,
        &["method=GET", "route=\"/api/v1/healthz\"", "status=200"],
    );
    assert!(!lines[0].contains("error="), "{}", lines[0]);
    expect(
        1,
        &[
            "route=\"/api/v1/samplers/{id}\"",
            "tenant=\"alice\"",
            "status=404",
            "error=\"not_found\"",
        ],
    );
    assert!(
        !lines[1].contains("nothing-here"),
        "ids stay out: {}",
        lines[1]
    );
    expect(
        2,
        &[
            "route=\"/api/v1/create_session\"",
            "status=401",
            "error=\"unauthorized\"",
        ],
    );
    expect(3, &["method=POST", "status=404", "error=\"not_found\""]);
    expect(
        4,
        &["tenant=\"bob\"", "status=400", "error=\"invalid_request\""],
    );
}

#[test]
fn an_expired_checkpoint_is_gone_at_once_and_its_files_swept_and_only_its_tenant_deletes_one() {
    let server = server::start_server_with(&["--checkpoint-sweep-secs", "1"]);
    let model = model(&server);
    let save = |name: &str, ttl: Option<u64>| {
        let (status, submitted) = post(
            &server,
            "save_weights",
            json!({"model_id": model, "path": name, "ttl_seconds": ttl}),
        );
        assert_eq!(status, 200, "{submitted}");
        let saved = result(&server, submitted["request_id"].as_str().unwrap());
        saved["path"].as_str().unwrap().to_string()
    };
    let brief = save("brief", Some(5));
    let kept = save("kept", None);
    let folder = |name: &str| {
        server
            .data
            .path()
            .join("checkpoints/alice")
            .join(&model)
            .join("weights")
            .join(name)
    };
    assert!(folder("brief").is_dir() && folder("kept").is_dir());
    let listed = |key: &str| {
        let (status, body) = get(&server, &format!("training_runs/{model}/checkpoints"), key);
        (status, body)
    };
    let (status, body) = listed(&server.alice);
    assert_eq!(status, 200, "{body}");
    let both = body["checkpoints"].as_array().unwrap();
    assert_eq!(both.len(), 2, "{body}");
    assert!(
        both.iter()
            .any(|c| c["tinker_path"] == brief.as_str() && c["expires_at"].is_string())
    );

    // Bob is answered as for an unknown run and an unknown checkpoint.
    let (status, _) = refused(listed(&server.bob));
    assert_eq!(status, 404);
    let delete = |key: &str, name: &str| {
        exchange(
            &server,
            "DELETE",
            &format!("training_runs/{model}/checkpoints/weights/{name}"),
            Some(key),
            "application/json",
            b"",
        )
    };
    let (status, bobs) = refused(delete(&server.bob, "kept"));
    let (_, unknown) = refused(delete(&server.bob, "nothing"));
    assert_eq!(status, 404);
    assert_eq!(bobs.replace("kept", "X"), unknown.replace("nothing", "X"));
    assert!(
        folder("kept").is_dir(),
        "bob's delete removed alice's files"
    );

    // Expired: not listed and not loadable at once; its files go with the next sweep.
    std::thread::sleep(std::time::Duration::from_millis(5100));
    let (_, body) = listed(&server.alice);
    let paths: Vec<&str> = body["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tinker_path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec![kept.as_str()], "{body}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while folder("brief").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the expired checkpoint was not swept"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (status, _) = refused(delete(&server.alice, "brief"));
    assert_eq!(status, 404);

    // Alice's own delete frees the files; the path is refused afterwards.
    let (status, head, _) = server::request(
        &server.url,
        "DELETE",
        &format!("/api/v1/training_runs/{model}/checkpoints/weights/kept"),
        Some(&server.alice),
        "application/json",
        b"",
    );
    assert_eq!(status, 204, "{head}");
    assert!(!folder("kept").exists());
    let (status, error) = refused(post(
        &server,
        "create_sampling_session",
        json!({"session_id": model.split(':').next().unwrap(), "sampling_session_seq_id": 0,
               "model_path": kept}),
    ));
    assert_eq!(status, 404, "{error}");
}

/// A session finished by its client (the SDK's `ServiceClient.close`) frees its models and
/// samplers at once and for good: their ops and the session's heartbeat answer 410 (what stops
/// the SDK's heartbeat), a restart does not bring them back, the run stays listed and the
/// journal keeps no state of it. A session that nothing names for `--session-idle-secs` is
/// finished by the sweep; heartbeats keep it alive. Another tenant cannot finish a session.
#[test]
fn a_finished_or_idle_session_frees_its_models_and_samplers_for_good() {
    let options = ["--session-idle-secs", "3", "--checkpoint-sweep-secs", "1"];
    let mut server = server::start_server_with(&options);
    let model = model(&server);
    let session = model.split(":train:").next().unwrap().to_string();
    let (status, body) = post(
        &server,
        "create_sampling_session",
        json!({"session_id": session, "sampling_session_seq_id": 0, "base_model": "opentinker/tiny"}),
    );
    assert_eq!(status, 200, "{body}");
    let sampler = body["sampling_session_id"].as_str().unwrap().to_string();
    let heartbeat = |server: &Server, session: &str| {
        post(
            server,
            "session_heartbeat",
            json!({"session_id": session, "type": "session_heartbeat"}),
        )
    };
    let finish = |server: &Server, key: &str, session: &str| {
        let path = format!("sessions/{session}/finish");
        let body = json!({"reason": {"type": "success"}, "detail": null}).to_string();
        call(
            server,
            &path,
            Some(key),
            "application/json",
            body.as_bytes(),
        )
    };
    let step = |server: &Server| {
        let targets = tensor_i64(&[3, 4, 5]);
        forward_backward(
            server,
            request(&model, 1, vec![datum(&[2, 3, 4], targets)], "cross_entropy"),
        )
    };
    let sample = |server: &Server| sample_one(server, &sampler);
    assert_eq!(heartbeat(&server, &session).0, 200);
    let (status, error) = refused(finish(&server, &server.bob, &session));
    assert_eq!(status, 404, "{error}");
    assert_eq!(heartbeat(&server, &session).0, 200, "bob finished it");

    assert_eq!(finish(&server, &server.alice, &session).0, 200);
    assert_eq!(finish(&server, &server.alice, &session).0, 200);
    let database = server.data.path().join(opentinker::store::DATABASE_FILE);
    let (states, samplers): (i64, i64) = {
        let db = rusqlite::Connection::open(&database).unwrap();
        let states = db
            .query_row("SELECT sum(length(state)) FROM models", [], |r| r.get(0))
            .unwrap();
        let samplers = db
            .query_row("SELECT count(*) FROM samplers", [], |r| r.get(0))
            .unwrap();
        (states, samplers)
    };
    assert_eq!(
        (states, samplers),
        (0, 0),
        "the journal kept the session's objects"
    );
    for _ in 0..2 {
        for (what, answer) in [
            ("heartbeat", heartbeat(&server, &session)),
            ("forward_backward", step(&server)),
            ("sample", sample(&server)),
        ] {
            let (status, error) = refused(answer);
            assert_eq!(status, 410, "{what}: {error}");
            assert!(error.contains("session has finished"), "{what}: {error}");
        }
        let (_, runs) = get(&server, "training_runs", &server.alice);
        assert_eq!(runs["training_runs"][0]["training_run_id"], model, "{runs}");
        // Killed and started again on the same data: the session is still finished.
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let (child, url, line) =
            server::spawn_server_with(server.data.path(), "127.0.0.1:0", &options);
        assert!(
            line.contains("restored 0 sessions, 0 models, 0 samplers"),
            "{line}"
        );
        (server.child, server.url) = (child, url);
    }

    let (_, idle) = post(
        &server,
        "create_session",
        json!({"tags": [], "user_metadata": null, "sdk_version": "test"}),
    );
    let idle = idle["session_id"].as_str().unwrap().to_string();
    for _ in 0..5 {
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(
            heartbeat(&server, &idle).0,
            200,
            "a heartbeating session was finished"
        );
    }
    // The OpenAI routes' own session goes idle too; they make a new one when it is gone.
    let complete = |server: &Server| {
        let body = json!({"model": "opentinker/tiny", "prompt": "1 + 1", "max_tokens": 2});
        let (status, _, answer) = server::request(
            &server.url,
            "POST",
            "/v1/completions",
            Some(&server.alice),
            "application/json",
            body.to_string().as_bytes(),
        );
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    let (status, answer) = complete(&server);
    assert_eq!(status, 200, "{answer}");
    // Any contact would keep it: left alone for its 3 s and two sweeps, it is finished.
    std::thread::sleep(std::time::Duration::from_secs(6));
    let (status, error) = refused(heartbeat(&server, &idle));
    assert_eq!(status, 410, "the idle session was kept: {error}");
    let (status, answer) = complete(&server);
    assert_eq!(
        status, 200,
        "after the OpenAI routes' session went idle: {answer}"
    );
}

/// A model keeps its 8 latest snapshot samplers across restarts too: after a restart the ones
/// restored count towards the limit, so the journal does not gain 8 more rows per restart.
#[test]
fn a_models_latest_snapshot_samplers_are_kept_across_restarts_and_no_more() {
    let mut server = start_server();
    let addr = server.url.trim_start_matches("http://").to_string();
    let model = model(&server);
    let mut seq = 0;
    let mut snapshot = |server: &Server| {
        seq += 1;
        let (status, submitted) = post(
            server,
            "save_weights_for_sampler",
            json!({"model_id": model, "sampling_session_seq_id": seq, "seq_id": seq}),
        );
        assert_eq!(status, 200, "{submitted}");
        let answer = result(server, submitted["request_id"].as_str().unwrap());
        answer["sampling_session_id"].as_str().unwrap().to_string()
    };
    let database = server.data.path().join(opentinker::store::DATABASE_FILE);
    let rows = || -> i64 {
        let db = rusqlite::Connection::open(&database).unwrap();
        db.query_row("SELECT count(*) FROM samplers", [], |r| r.get(0))
            .unwrap()
    };
    let mut made = Vec::new();
    for round in 0..3 {
        for _ in 0..6 {
            made.push(snapshot(&server));
        }
        assert_eq!(rows(), made.len().min(8) as i64, "round {round}");
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let (child, _, _) = server::spawn_server(server.data.path(), &addr);
        server.child = child;
    }
    let sample = |id: &str| sample_one(&server, id).0;
    assert_eq!(sample(&made[made.len() - 8]), 200);
    assert_eq!(sample(&made[made.len() - 9]), 404);
}

#[test]
fn a_session_keeps_its_latest_sampling_sessions_and_lets_the_oldest_go() {
    let server = start_server();
    let (_, session) = post(
        &server,
        "create_session",
        json!({"tags": [], "user_metadata": null, "sdk_version": "test"}),
    );
    let session = session["session_id"].as_str().unwrap().to_string();
    let mut ids = Vec::new();
    for seq in 0..65 {
        let (status, body) = post(
            &server,
            "create_sampling_session",
            json!({"session_id": session, "sampling_session_seq_id": seq, "base_model": "opentinker/tiny"}),
        );
        assert_eq!(status, 200, "{body}");
        ids.push(body["sampling_session_id"].as_str().unwrap().to_string());
    }
    let sample = |id: &str| sample_one(&server, id);
    let (status, error) = refused(sample(&ids[0]));
    assert_eq!(status, 404, "{error}");
    let (status, body) = sample(&ids[64]);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn plugins_are_uploaded_by_digest_checked_as_the_loader_checks_them_and_jobs_checked_whole() {
    let server = start_server();
    // A real component: the arithmetic environment, built as a user builds it.
    let bytes = std::fs::read(built_plugin("arithmetic")).unwrap();
    let upload =
        |key: &str, bytes: &[u8]| call(&server, "plugins", Some(key), "application/wasm", bytes);

    let (status, stored) = upload(&server.alice, &bytes);
    assert_eq!(status, 200, "{stored}");
    let digest = stored["digest"].as_str().unwrap().to_string();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 7 + 64,
        "{digest}"
    );
    assert_eq!(stored["kinds"], json!(["environment"]));
    assert_eq!(stored["wit_version"], "0.3.0");
    assert_eq!(stored["bytes"], bytes.len());
    // The same bytes again: the same digest.
    assert_eq!(upload(&server.alice, &bytes).1["digest"], digest.as_str());
    let (status, described) = get(&server, &format!("plugins/{digest}"), &server.alice);
    assert_eq!((status, &described["digest"]), (200, &json!(digest)));
    let (_, listed) = get(&server, "plugins", &server.alice);
    assert_eq!(listed["plugins"][0]["digest"], digest.as_str());

    // Another tenant's digest is unknown, exactly as one nobody uploaded.
    let (status, _) = get(&server, &format!("plugins/{digest}"), &server.bob);
    assert_eq!(status, 404);
    let nobody = format!("sha256:{}", "0".repeat(64));
    assert_eq!(
        get(&server, &format!("plugins/{nobody}"), &server.alice).0,
        404
    );
    assert_eq!(get(&server, "plugins", &server.bob).1["plugins"], json!([]));
    let (status, message) = refused(get(&server, "plugins/sha256:..%2F..", &server.alice));
    assert_eq!(status, 400, "{message}");

    // What the loader refuses is refused here, by name, with a 4xx.
    let random: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    let core_module = wat::parse_str("(module)").unwrap();
    let other_world = wat::parse_str("(component)").unwrap();
    // The real component, claiming a contract version the host does not speak.
    let other_version = replace_all(
        &bytes,
        b"opentinker:plugin/environment@0.3.0",
        b"opentinker:plugin/environment@0.9.0",
    );
    assert_ne!(other_version, bytes);
    for (what, body, expected) in [
        (
            "random bytes",
            random.as_slice(),
            "not a WebAssembly component",
        ),
        ("a core module", &core_module, "not a WebAssembly component"),
        (
            "a component of no opentinker world",
            &other_world,
            "opentinker:plugin",
        ),
        (
            "a component of another WIT version",
            &other_version,
            "0.9.0",
        ),
    ] {
        let (status, message) = refused(upload(&server.alice, body));
        assert_eq!(status, 400, "{what}: {message}");
        assert!(message.contains(expected), "{what}: {message}");
    }
    // Past the body limit: refused before it is read whole.
    let oversized = vec![0u8; (64 << 20) + 1];
    let (status, _) = upload(&server.alice, &oversized);
    assert_eq!(status, 413);
    assert_eq!(
        get(&server, "plugins", &server.alice).1["plugins"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // A job is checked whole before it is accepted: its keys, its names, its plugins.
    let submit = |job: &str| refused(post(&server, "jobs", json!({ "name": "j", "job": job })));
    let job = format!(
        "[model]\ninit_tiny = {{}}\n[environment]\nplugin = \"{digest}\"\n[rl]\nsteps = 1\n"
    );
    let (status, message) = submit(&job.replace("steps = 1", "stpes = 1"));
    assert_eq!(status, 400);
    assert!(message.contains("stpes"), "{message}");
    let (status, message) = submit(&job.replace("steps = 1", "steps = 1\nloss = \"ppo2\""));
    assert_eq!(status, 400);
    assert!(
        message.contains("ppo2") && message.contains("importance_sampling"),
        "{message}"
    );
    let (status, message) = submit(&job.replace(&digest, &nobody));
    assert_eq!(status, 400);
    assert!(
        message.contains("[environment]") && message.contains(&nobody),
        "{message}"
    );
    // The plugins are loaded as a run would load them: of their section's kind, and given a
    // config that fits the schema they declare; each named by its digest alone.
    let (status, message) = submit(&format!("{job}[agent]\nplugin = \"{digest}\"\n"));
    assert_eq!(status, 400);
    assert!(
        message.contains("[agent]")
            && message.contains("not an agent")
            && message.contains(&digest)
            && !message.contains("/plugins/"),
        "{message}"
    );
    let misspelt = job.replace("[rl]", "config = { max_operant = 9 }\n[rl]");
    let (status, message) = submit(&misspelt);
    assert_eq!(status, 400);
    assert!(
        message.contains("[environment] config") && message.contains("max_operant"),
        "{message}"
    );
    let (status, message) = submit(&job.replace(&digest, "../plugins/arithmetic"));
    assert_eq!(status, 400);
    assert!(message.contains("digest"), "{message}");
    let (status, message) = submit(&job.replace("init_tiny = {}", "base = \"no/such\""));
    assert_eq!(status, 400);
    assert!(message.contains("opentinker/tiny"), "{message}");
    assert_eq!(get(&server, "jobs", &server.alice).1["jobs"], json!([]));

    // The document of these routes is served, as kept in the repository, to anyone.
    let (status, document) = exchange(&server, "GET", "openapi.json", None, "", b"");
    assert_eq!(status, 200);
    let kept = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/jobs.json"),
    )
    .unwrap();
    assert_eq!(document, serde_json::from_str::<Value>(&kept).unwrap());
}

/// `bytes` with every `from` replaced by `to` (of the same length).
fn replace_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let mut at = 0;
    while let Some(found) = out[at..].windows(from.len()).position(|w| w == from) {
        out[at + found..at + found + from.len()].copy_from_slice(to);
        at += found + from.len();
    }
    out
}

/// `-(logprobs * weights).sum()`, as the `tinker` SDK uploads it from `create_custom_loss`.
const NEG_LL_GRAPH: &str = r#"{"format": 1, "nodes": [
    {"op": "placeholder", "name": "logprobs", "target": "logprobs", "args": [], "kwargs": {}},
    {"op": "placeholder", "name": "weights", "target": "weights", "args": [], "kwargs": {}},
    {"op": "call_function", "name": "mul", "target": "operator.mul", "args": [{"ref": "logprobs"}, {"ref": "weights"}], "kwargs": {}},
    {"op": "call_method", "name": "sum_1", "target": "sum", "args": [{"ref": "mul"}], "kwargs": {}},
    {"op": "call_function", "name": "neg", "target": "operator.neg", "args": [{"ref": "sum_1"}], "kwargs": {}},
    {"op": "output", "name": "output", "target": "output", "args": [{"tuple": [{"ref": "neg"}, {"dict": {"custom/neg_ll:sum": {"ref": "neg"}}}]}], "kwargs": {}}]}"#;

#[test]
fn a_custom_loss_is_checked_before_any_work_kept_across_a_restart_and_its_tenants_alone() {
    let mut server = start_server();
    let addr = server.url.trim_start_matches("http://").to_string();
    let model = model(&server);
    let session = model.split(":train:").next().unwrap().to_string();
    let create = |server: &Server, seq: u64, graph: &str| {
        let graph: Value = serde_json::from_str(graph).unwrap();
        post(
            server,
            "create_custom_loss",
            json!({"session_id": session, "custom_loss_seq_id": seq, "name": "neg_ll",
                   "inputs": [{"name": "logprobs", "rank": 1}, {"name": "weights", "rank": 1}],
                   "graph": graph, "type": "create_custom_loss"}),
        )
    };
    let (status, config) = post(&server, "client/config", json!({}));
    assert_eq!(
        (status, &config["custom_loss_server_side"]),
        (200, &json!(true))
    );

    // Refused before it is accepted, naming what is wrong.
    let forbidden = NEG_LL_GRAPH.replace("operator.neg", "builtins.exec");
    let (status, error) = refused(create(&server, 0, &forbidden));
    assert_eq!(status, 400);
    assert!(error.contains("builtins.exec"), "{error}");
    let (status, submitted) = create(&server, 1, NEG_LL_GRAPH);
    assert_eq!(status, 200, "{submitted}");
    let made = result(&server, submitted["request_id"].as_str().unwrap());
    let loss_id = made["loss_id"].as_str().unwrap().to_string();
    assert_eq!(loss_id, format!("{session}:loss:1"));

    let weighted = |tokens: &[i32], weights: proto::Tensor| {
        let targets: Vec<i64> = tokens.iter().map(|&t| i64::from(t) + 1).collect();
        let mut d = datum(tokens, tensor_i64(&targets));
        d.loss_fn_inputs.insert("weights".into(), weights);
        d
    };
    let floats = |values: &[f32]| proto::Tensor {
        encoding: Some(proto::tensor::Encoding::Dense(
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )),
        dtype: proto::DType::Float32 as i32,
        shape: vec![values.len() as i64],
    };
    let custom = |seq: i32, data: Vec<proto::Datum>, id: &str| {
        let mut r = request(&model, seq, data, "custom");
        let text = proto::loss_config_value::Value::Text(id.to_string());
        r.loss_fn_config_v2.insert(
            "loss_id".into(),
            proto::LossConfigValue { value: Some(text) },
        );
        r
    };
    let good = || vec![weighted(&[1, 2, 3], floats(&[1.0, 0.5, 0.0]))];

    // A datum the loss does not fit, another tenant's id, an unknown one: refused at once.
    let short = vec![weighted(&[1, 2, 3], floats(&[1.0, 0.5]))];
    let (status, error) = refused(forward_backward(&server, custom(1, short, &loss_id)));
    assert_eq!(status, 400);
    assert!(
        error.contains("datum 0") && error.contains("shape mismatch"),
        "{error}"
    );
    let unknown = format!("{session}:loss:7");
    let (status, error) = refused(forward_backward(&server, custom(2, good(), &unknown)));
    assert_eq!(status, 404, "{error}");
    let (status, error) = refused(call(
        &server,
        "forward_backward",
        Some(&server.bob),
        "application/x-protobuf",
        &custom(3, good(), &loss_id).encode_to_vec(),
    ));
    assert_eq!(status, 404, "bob reached alice's model or loss: {error}");

    // Runs, and runs again after a restart (the model's turns 1 to 3 recorded by then).
    for seq in [3, 4] {
        let (status, submitted) = forward_backward(&server, custom(seq, good(), &loss_id));
        assert_eq!(status, 200, "{submitted}");
        let output = result(&server, submitted["request_id"].as_str().unwrap());
        assert!(output["protobuf_bytes"].as_u64() > Some(0), "{output}");
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        let (child, _, _) = server::spawn_server(server.data.path(), &addr);
        server.child = child;
    }
}

//! `opentinker serve` against a hostile tenant: requests whose counts, lengths and sizes are
//! chosen to crash, wrap or exhaust the server. Each is refused with a 4xx that names the field,
//! the server stays up for everyone, and its memory grows by at most a small multiple of the
//! request's size. Plain HTTP/1.1 over a socket, as `serve_http` talks.

#[path = "common/server.rs"]
mod server;
#[path = "common/tinker_http.rs"]
mod tinker_http;

use opentinker::wire::proto;
use prost::Message;
use serde_json::{Value, json};
use server::{Server, start_server};
use tinker_http::{call, exchange, model, post, refused, result};

/// A POST of `body` as alice.
fn send(server: &Server, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
    call(server, path, Some(&server.alice), content_type, body)
}

/// The server still answers: a crash or a hang of the last request shows here.
fn assert_up(server: &Server) {
    let (status, body) = exchange(server, "GET", "healthz", None, "application/json", b"");
    assert_eq!(status, 200, "{body}");
}

/// A sampling session of alice's on the tiny base.
fn sampler(server: &Server) -> String {
    let (_, session) = post(server, "create_session", json!({}));
    let (status, body) = post(
        server,
        "create_sampling_session",
        json!({"session_id": session["session_id"], "sampling_session_seq_id": 0,
               "base_model": "opentinker/tiny"}),
    );
    assert_eq!(status, 200, "{body}");
    body["sampling_session_id"].as_str().unwrap().to_string()
}

fn sample(server: &Server, sampler: &str, num_samples: u64, max_tokens: u64) -> (u16, Value) {
    post(
        server,
        "asample",
        json!({"sampling_session_id": sampler, "seq_id": 1, "num_samples": num_samples,
               "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
               "sampling_params": {"max_tokens": max_tokens}}),
    )
}

#[test]
fn a_sample_count_past_its_limit_is_refused_before_anything_is_sized_from_it() {
    let server = start_server();
    let real = sampler(&server);
    // 3e17 samples once aborted the process (one sequence id per sample, allocated first);
    // 1e18 panicked a worker (capacity overflow). For a sampler that exists and one that does
    // not.
    for id in [real.as_str(), "s-0:sample:9"] {
        for n in [300_000_000_000_000_000, 1_000_000_000_000_000_000, u64::MAX] {
            let (status, error) = refused(sample(&server, id, n, 1));
            assert_eq!(status, 400, "{error}");
            assert!(error.contains("num_samples must be 1 to 128"), "{error}");
            assert_up(&server);
        }
    }
    let (status, body) = sample(&server, &real, 2, 1);
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_max_tokens_past_the_context_cannot_wrap_the_kv_budget() {
    let server = start_server();
    let sampler = sampler(&server);
    // `prompt + max_tokens` once wrapped to 0 in the engine's reservation, admitting what the
    // budget refuses at 4000: now a sample asks for no more than the context has room for, and
    // 128 of them are over the budget however large `max_tokens` is.
    for max_tokens in [4000, u64::MAX, u64::MAX - 1, 1 << 63] {
        let (status, body) = post(
            &server,
            "asample",
            json!({"sampling_session_id": sampler, "num_samples": 128,
                   "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                   "sampling_params": {"max_tokens": max_tokens}}),
        );
        assert_eq!(status, 200, "{body}");
        let answer = result(&server, body["request_id"].as_str().unwrap());
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("KV positions"),
            "max_tokens {max_tokens}: {answer}"
        );
        assert_up(&server);
    }
}

/// The server's peak resident memory so far, in bytes (Linux's `VmHWM`).
fn peak_memory(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// Assert that the server's peak memory grew by at most `times` the `body` it was sent (and
/// 8 MiB of slack: a worker thread's first pages, the allocator's arenas).
fn assert_small_growth(server: &Server, before: u64, body: usize, times: u64) {
    let grown = peak_memory(server).saturating_sub(before);
    assert!(
        grown <= times * body as u64 + (8 << 20),
        "a {body}-byte request grew the server's peak memory by {grown} bytes"
    );
}

#[test]
fn a_small_protobuf_body_cannot_decode_into_a_large_value() {
    let server = start_server();
    assert_up(&server);
    // 2,000,000 empty datums in 4 MB (two bytes each) once raised the server's memory by
    // 426 MiB before the unknown model was noticed.
    let body = proto::ForwardBackwardRequest {
        model_id: "s-0:train:0".into(),
        seq_id: 1,
        data: vec![proto::Datum::default(); 2_000_000],
        loss_fn: "cross_entropy".into(),
        ..Default::default()
    }
    .encode_to_vec();
    let before = peak_memory(&server);
    let (status, error) = refused(send(
        &server,
        "forward_backward",
        "application/x-protobuf",
        &body,
    ));
    assert_eq!(status, 400, "{error}");
    assert!(
        error.contains("forward_backward: the request would decode to more than"),
        "{error}"
    );
    assert_small_growth(&server, before, body.len(), 8);
    assert_up(&server);
}

#[test]
fn a_sparse_tensor_cannot_name_a_dense_shape_its_body_does_not_pay_for() {
    let server = start_server();
    let sampler = sampler(&server);
    // Shape [4096, 4096] with one listed cell: once a 128 MiB dense array from 12 KiB.
    let mut rows = vec![0usize; 4097];
    rows.iter_mut().skip(1).for_each(|r| *r = 1);
    let body = json!({"sampling_session_id": sampler, "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 1},
        "target_prompt_logprobs": {"data": [1], "dtype": "int64", "shape": [4096, 4096],
            "sparse_crow_indices": rows, "sparse_col_indices": [0]}})
    .to_string();
    let before = peak_memory(&server);
    let (status, error) = refused(send(
        &server,
        "asample",
        "application/json",
        body.as_bytes(),
    ));
    assert_eq!(status, 400, "{error}");
    assert!(error.starts_with("target_prompt_logprobs:"), "{error}");
    assert_small_growth(&server, before, body.len(), 64);
    assert_up(&server);
}

#[test]
fn healthz_answers_within_100_ms_while_long_openai_prompts_are_prepared() {
    let server = start_server();
    assert_up(&server);
    let words = "the quick brown fox jumps over the lazy dog ".repeat(200_000);
    assert!(words.len() >= 8 << 20);
    let bodies = [
        (
            "/v1/completions",
            json!({"model": "opentinker/tiny", "prompt": words, "max_tokens": 1}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "opentinker/tiny", "max_tokens": 1,
                   "messages": [{"role": "user", "content": words}]}),
        ),
    ];
    let running = std::sync::atomic::AtomicUsize::new(bodies.len());
    let mut latencies = Vec::new();
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for (path, body) in &bodies {
            let (server, running) = (&server, &running);
            scope.spawn(move || {
                let (status, _, answer) = server::request(
                    &server.url,
                    "POST",
                    path,
                    Some(&server.alice),
                    "application/json",
                    body.to_string().as_bytes(),
                );
                running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                // Too long for the context, or a base without a chat template: refused by name.
                assert!(
                    (400..500).contains(&status),
                    "{path}: {status} {}",
                    String::from_utf8_lossy(&answer)
                );
            });
        }
        // The bodies are on their way; ask while they are read and prepared.
        std::thread::sleep(std::time::Duration::from_millis(100));
        while running.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            let asked = std::time::Instant::now();
            assert_up(&server);
            latencies.push(asked.elapsed());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    // Preparing the prompts takes seconds; a health check that waited on it (the prompts
    // prepared on an async worker) would take as long, check after check. Preparations leave a
    // core free, so the checks wait on nothing: 1-7 ms here on two cores (45 ms when they took
    // both). The VM this runs on stalls a process now and then (memory reclaim, a neighbour):
    // one check in a few hundred has taken 111-139 ms under the full suite, so the bound holds
    // for the 99th percentile, and no check may wait half as long as the preparation.
    let preparing = started.elapsed();
    assert!(
        preparing > std::time::Duration::from_secs(2),
        "the prompts took only {preparing:?} to prepare: too short to show a wait"
    );
    latencies.sort();
    let percentile_99 = latencies[latencies.len() * 99 / 100];
    let slowest = latencies[latencies.len() - 1];
    assert!(
        percentile_99 < std::time::Duration::from_millis(100)
            && slowest < std::time::Duration::from_secs(1),
        "healthz took {percentile_99:?} (99th percentile), {slowest:?} at most, while prompts were \
         prepared for {preparing:?} ({} asks)",
        latencies.len()
    );
}

#[test]
fn the_openai_routes_count_against_the_tenants_queue_as_the_tinker_routes_do() {
    let server = server::start_server_with(&["--max-queued-per-tenant", "1"]);
    let sampler = sampler(&server);
    // One long sample (no stop) holds alice's only place in the queue.
    let (status, body) = post(
        &server,
        "asample",
        json!({"sampling_session_id": sampler, "num_samples": 1,
               "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
               "sampling_params": {"max_tokens": 20000, "stop": []}}),
    );
    assert_eq!(status, 200, "{body}");
    let complete = |key: &str, stream: bool| {
        let body = json!({"model": "opentinker/tiny", "prompt": "1 + 1", "max_tokens": 2,
                          "stream": stream});
        let (status, _, answer) = server::request(
            &server.url,
            "POST",
            "/v1/completions",
            Some(key),
            "application/json",
            body.to_string().as_bytes(),
        );
        (status, String::from_utf8_lossy(&answer).into_owned())
    };
    for stream in [false, true] {
        let (status, answer) = complete(&server.alice, stream);
        assert_eq!(status, 429, "a completion past the tenant's cap: {answer}");
        assert!(answer.contains("queued or running"), "{answer}");
    }
    // Another tenant's place is its own.
    let (status, answer) = complete(&server.bob, false);
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn a_call_numbered_far_ahead_is_refused_and_one_waiting_on_a_gap_fails_at_its_deadline() {
    let options = ["--max-queued-per-tenant", "8", "--turn-deadline-secs", "2"];
    let mut server = server::start_server_with(&options);
    let model = model(&server);
    let optim_step = |server: &Server, seq: u64| {
        post(
            server,
            "optim_step",
            json!({"model_id": model, "seq_id": seq, "adam_params": {}}),
        )
    };
    // Once accepted and kept forever, in memory and in the journal, holding a queue place.
    let (status, error) = refused(optim_step(&server, 2_000_000_000));
    assert_eq!(status, 400, "{error}");
    assert!(
        error.contains("seq_id 2000000000") && error.contains("at most 8"),
        "{error}"
    );
    // Within the window, after a gap that never fills (seq_ids 1 and 2 never come).
    let (status, body) = optim_step(&server, 3);
    assert_eq!(status, 200, "{body}");
    let waited = std::time::Instant::now();
    let answer = result(&server, body["request_id"].as_str().unwrap());
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.contains("waited 2s for its turn"), "{answer}");
    assert!(waited.elapsed() < std::time::Duration::from_secs(10));
    // The journal keeps nothing unfinished: a restart resumes no request.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let (child, url, line) = server::spawn_server_with(server.data.path(), "127.0.0.1:0", &options);
    (server.child, server.url) = (child, url);
    assert!(line.contains("resumed 0 unfinished requests"), "{line}");
    assert_up(&server);
}

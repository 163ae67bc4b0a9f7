//! The Tinker API's routes as the tests call them, as alice unless a key is named: a request's
//! status and JSON body, a refusal's text, a future's result, a model to train. For test crates
//! that also include `common/server.rs` as `server`.

// Each test crate that includes this uses part of it.
#![allow(dead_code)]

use serde_json::{Value, json};

use crate::server::Server;

/// One POST request; the answer's status and JSON body (a protobuf body is given as its length).
pub fn call(
    server: &Server,
    path: &str,
    key: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    exchange(server, "POST", path, key, content_type, body)
}

/// One GET request of `path` with `key`.
pub fn get(server: &Server, path: &str, key: &str) -> (u16, Value) {
    exchange(server, "GET", path, Some(key), "application/json", b"")
}

pub fn exchange(
    server: &Server,
    method: &str,
    path: &str,
    key: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    let path = format!("/api/v1/{path}");
    let (status, head, body) =
        crate::server::request(&server.url, method, &path, key, content_type, body);
    let body = String::from_utf8_lossy(&body);
    let body = match head.to_ascii_lowercase().contains("application/x-protobuf") {
        true => json!({ "protobuf_bytes": body.len() }),
        false => serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body:?}")),
    };
    (status, body)
}

pub fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    call(
        server,
        path,
        Some(&server.alice),
        "application/json",
        body.to_string().as_bytes(),
    )
}

/// The status and the error text of a refused request.
pub fn refused(answer: (u16, Value)) -> (u16, String) {
    let (status, body) = answer;
    assert!(
        body["category"].is_string(),
        "no Tinker error shape: {status} {body}"
    );
    (
        status,
        body["error"].as_str().unwrap_or_default().to_string(),
    )
}

/// The result of a future, polled until it is there.
pub fn result(server: &Server, request_id: &str) -> Value {
    loop {
        let (status, body) = post(
            server,
            "retrieve_future",
            json!({ "request_id": request_id }),
        );
        assert_eq!(status, 200, "{body}");
        if body["type"] != "try_again" {
            return body;
        }
    }
}

/// A session and a model of `alice`.
pub fn model(server: &Server) -> String {
    let (_, session) = post(
        server,
        "create_session",
        json!({"tags": [], "user_metadata": null, "sdk_version": "test"}),
    );
    let session = session["session_id"].as_str().unwrap().to_string();
    let (status, submitted) = post(
        server,
        "create_model",
        json!({"session_id": session, "model_seq_id": 0, "base_model": "opentinker/tiny", "lora_config": {"rank": 4}}),
    );
    assert_eq!(status, 200, "{submitted}");
    result(server, submitted["request_id"].as_str().unwrap())["model_id"]
        .as_str()
        .unwrap()
        .to_string()
}

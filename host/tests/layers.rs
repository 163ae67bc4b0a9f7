//! The host's layers only look down: each module names the modules it must not import, and
//! every `crate::...` path in its files (code and tests alike) is checked against them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Per module of `host/src`, the modules it must never name.
const FORBIDDEN: &[(&str, &[&str])] = &[
    // The op API is the contract between clients and the service: it stands alone.
    (
        "api",
        &[
            "text", "model", "lora", "train", "sample", "sched", "client", "rl", "server", "cli",
            "plugin",
        ],
    ),
    (
        "text",
        &[
            "api", "model", "lora", "train", "sample", "sched", "client", "rl", "server", "cli",
        ],
    ),
    // The Tinker wire's encodings: op API values in, bytes out, for the server and the client.
    (
        "wire",
        &[
            "text", "model", "lora", "train", "sample", "sched", "client", "rl", "server", "cli",
            "plugin",
        ],
    ),
    // The engine's layers: kernels <- model <- lora <- train, sample. The model's layers name no
    // adapter: LoRA comes in through their projection hook.
    (
        "model",
        &[
            "lora", "train", "sample", "sched", "client", "rl", "jobs", "server", "cli", "plugin",
            "market",
        ],
    ),
    (
        "lora",
        &[
            "train", "sample", "sched", "client", "rl", "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    (
        "train",
        &[
            "sample", "sched", "client", "rl", "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    (
        "sample",
        &[
            "train", "sched", "client", "rl", "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    ("sched", &["client", "rl", "jobs", "server", "cli"]),
    ("client", &["rl", "jobs", "server", "cli"]),
    // The jobs a server runs: the RL driver's client, below the HTTP routes.
    ("jobs", &["server", "cli"]),
    ("server", &["client", "rl", "cli"]),
    // The RL driver is a client of the engine: it reaches it through `client` only.
    (
        "rl",
        &[
            "model", "lora", "train", "sample", "sched", "jobs", "server", "cli",
        ],
    ),
    (
        "plugin",
        &[
            "model", "lora", "train", "sample", "sched", "rl", "server", "cli", "market",
        ],
    ),
    // The marketplace: beside the plugin host, whose descriptions it publishes; below the CLI.
    (
        "market",
        &[
            "api", "model", "lora", "train", "sample", "sched", "client", "rl", "jobs", "server",
            "cli",
        ],
    ),
];

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// The top-level modules a source text names through `crate::name` or `crate::{name, ...}`.
fn named_modules(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group: split on commas outside nested braces.
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        names.insert(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names
}

#[test]
fn every_module_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offences = Vec::new();
    for (module, forbidden) in FORBIDDEN {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        assert!(!files.is_empty(), "no files in src/{module}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for name in named_modules(&text) {
                if forbidden.contains(&name.as_str()) {
                    offences.push(format!("{} names crate::{name}", file.display()));
                }
            }
        }
    }
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

#[test]
fn the_scanner_sees_single_and_grouped_paths() {
    let text = "use crate::model::Model;\nuse crate::{api::Datum, sample::{A, B}, text};\n\
                let x = crate::train::Loss::CrossEntropy;";
    let names: Vec<String> = named_modules(text).into_iter().collect();
    assert_eq!(names, ["api", "model", "sample", "text", "train"]);
}

/// The RL driver runs components only: building a plugin from its source (cargo, rustup,
/// componentize-py, a tenant's `build.rs` run natively) is the CLI's, never the driver's, which
/// a server will run on tenants' jobs.
#[test]
fn the_rl_driver_never_builds_plugins() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rl"),
        &mut files,
    );
    let offences: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            ["plugin::build", "Command::new(\"cargo", "rustup"]
                .iter()
                .any(|needle| text.contains(needle))
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

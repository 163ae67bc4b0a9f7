//! The host's layers only look down: each module names the modules it must not import, and
//! every `crate::...` path in its files (code and tests alike) is checked against them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Per module of `host/src`, the modules it must never name.
const FORBIDDEN: &[(&str, &[&str])] = &[
    // The op API is the contract between clients and the service: it stands alone.
    (
        "api",
        &[
            "text", "model", "lora", "train", "sample", "service", "client", "rl", "server", "cli",
            "plugin",
        ],
    ),
    (
        "text",
        &[
            "api", "model", "lora", "train", "sample", "service", "client", "rl", "server", "cli",
        ],
    ),
    // The Tinker wire's encodings: op API values in, bytes out, for the server and the client.
    (
        "wire",
        &[
            "text", "model", "lora", "train", "sample", "service", "client", "rl", "server", "cli",
            "plugin",
        ],
    ),
    // The engine's layers: kernels <- model <- lora <- train, sample. The model's layers name no
    // adapter: LoRA comes in through their projection hook.
    (
        "model",
        &[
            "lora", "train", "sample", "service", "client", "rl", "jobs", "server", "cli",
            "plugin", "market",
        ],
    ),
    (
        "lora",
        &[
            "train", "sample", "service", "client", "rl", "jobs", "server", "cli", "plugin",
            "market",
        ],
    ),
    (
        "train",
        &[
            "sample", "service", "client", "rl", "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    (
        "sample",
        &[
            "train", "service", "client", "rl", "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    ("service", &["client", "rl", "jobs", "server", "cli"]),
    ("client", &["rl", "jobs", "server", "cli"]),
    // The jobs a server runs: the RL driver's client, below the HTTP routes.
    ("jobs", &["server", "cli"]),
    ("server", &["client", "rl", "cli"]),
    // The RL driver is a client of the engine: it reaches it through `client` only.
    (
        "rl",
        &[
            "model", "lora", "train", "sample", "service", "jobs", "server", "cli",
        ],
    ),
    (
        "plugin",
        &[
            "model", "lora", "train", "sample", "service", "rl", "server", "cli", "market",
        ],
    ),
    // Durable files and the database: the floor every stateful module stands on.
    (
        "store",
        &[
            "api", "text", "wire", "model", "lora", "train", "sample", "service", "client", "rl",
            "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    // Who may use the rollout queue: NATS's keys and users, standing on the floor alone.
    (
        "queue_auth",
        &[
            "api", "text", "wire", "model", "lora", "train", "sample", "service", "client", "rl",
            "jobs", "server", "cli", "plugin", "market",
        ],
    ),
    // The marketplace: beside the plugin host, whose descriptions it publishes; below the CLI.
    (
        "market",
        &[
            "api", "model", "lora", "train", "sample", "service", "client", "rl", "jobs", "server",
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

/// The guest side never links the host: the Rust SDK and every plugin crate depend on the SDK
/// (and crates.io), never on the `opentinker` package, so that a plugin builds for wasm32 alone
/// and the contract is the WIT, not the host's types.
#[test]
fn the_sdk_and_the_plugins_never_depend_on_the_host() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut manifests = vec![root.join("sdk/rust/Cargo.toml")];
    let mut stack = vec![root.join("plugins")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap_or_default();
            if path.is_dir() && name != "target" && name != "node_modules" {
                stack.push(path);
            } else if name == "Cargo.toml" {
                manifests.push(path);
            }
        }
    }
    assert!(manifests.len() > 5, "{manifests:?}");
    let mut offences = Vec::new();
    for manifest in &manifests {
        let table: toml::Table = std::fs::read_to_string(manifest).unwrap().parse().unwrap();
        for section in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let names = table.get(section).and_then(|s| s.as_table());
            if names.is_some_and(|names| names.contains_key("opentinker")) {
                offences.push(format!(
                    "{} [{section}] names opentinker",
                    manifest.display()
                ));
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
            ["plugin::builders", "Command::new(\"cargo", "rustup"]
                .iter()
                .any(|needle| text.contains(needle))
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

/// The RL loop is a client of the engine, as the tinker-cookbook's loop is of Tinker: it is handed
/// an `Engine` and opens its base there, and names none of the services that implement the
/// client traits (its unit tests may build one).
#[test]
fn the_rl_loop_names_no_concrete_client() {
    let concrete = [
        "LocalModel",
        "LocalService",
        "RemoteService",
        "ServedModel",
        "TenantBases",
        "FullParameterTrainer",
    ];
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rl"),
        &mut files,
    );
    let mut offences = Vec::new();
    for file in files {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for name in concrete.iter().filter(|name| code.contains(*name)) {
            offences.push(format!("{}: {name}", file.display()));
        }
    }
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

/// The submodules a module of the host may show as namespaces of functions (`checkpoint::load`,
/// `packages::install`) or of generated types (`wire::proto`), each for its reason; every other
/// submodule is private behind its module's `pub use` list, the module's face.
const NAMESPACES: [&str; 6] = [
    // The one layer definition that the model, LoRA, training and sampling build on.
    "model::layers",
    // The engine's API-to-engine conversions, which the in-process client reuses.
    "service::convert",
    // Checkpoint files: load, save, and what a folder holds.
    "train::checkpoint",
    // Watching a trained policy play (`opentinker watch`).
    "rl::watch",
    // Installing, publishing and resolving marketplace packages.
    "market::packages",
    // The Tinker wire's protobuf messages, as prost generates them.
    "wire::proto",
];

#[test]
fn every_module_keeps_its_submodules_behind_its_face() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offences = Vec::new();
    for (module, file) in module_files(&src) {
        if module.is_empty() {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for line in code.lines() {
            // A submodule in a file of its own (an inline one belongs to its file's face).
            let Some(name) = line
                .trim()
                .strip_prefix("pub mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            let path = format!("{}::{name}", module.join("::"));
            if !NAMESPACES.contains(&path.as_str()) {
                offences.push(format!("{}: pub mod {name}", file.display()));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "public submodules (make them private and list what they offer in the module's `pub use`):\n{}",
        offences.join("\n")
    );
}

/// A module of `host/src` by its path (`["service", "trainer"]`; the crate root is `[]`).
type ModPath = Vec<String>;

/// Every module file of `src` (the library's: `main.rs` is a crate of its own) by module path.
fn module_files(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let mut path: ModPath = relative
            .iter()
            .map(|part| part.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        match path.last().map(String::as_str) {
            Some("main") if path.len() == 1 => continue,
            Some("lib") if path.len() == 1 => path.clear(),
            Some("mod") => {
                path.pop();
            }
            _ => {}
        }
        modules.insert(path, file);
    }
    modules
}

/// The code of a file as imports see it: comment lines dropped, and the unit tests (an inline
/// `#[cfg(test)] mod` at its end, whose `super::` is the file itself) cut off.
fn code_of(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect();
    let code = code.join("\n");
    match code.find("#[cfg(test)]\nmod ") {
        Some(at) => code[..at].to_string(),
        None => code,
    }
}

/// Expand a use tree (`a::{b::C, d as e, f::*}`) into its paths; an alias is kept as `d as e`.
fn expand_tree(tree: &str) -> Vec<Vec<String>> {
    fn split_top(group: &str) -> Vec<&str> {
        let (mut depth, mut start, mut parts) = (0, 0, Vec::new());
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&group[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&group[start..]);
        parts
    }
    let tree = tree.trim();
    if tree.is_empty() {
        return Vec::new();
    }
    if let Some(inner) = tree.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        return split_top(inner).into_iter().flat_map(expand_tree).collect();
    }
    match tree.split_once("::") {
        Some((head, rest)) => expand_tree(rest)
            .into_iter()
            .map(|mut path| {
                path.insert(0, head.trim().to_string());
                path
            })
            .collect(),
        None => vec![vec![tree.to_string()]],
    }
}

/// The paths a file names from `crate::`, `super::` or `self::`, made absolute (the file is
/// module `module`), with the text that followed each (a use tree or a path in code).
fn absolute_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut rest = &code[at..];
            let mut base: Vec<String> = module.to_vec();
            if let Some(r) = rest.strip_prefix("crate::") {
                base.clear();
                rest = r;
            } else if let Some(r) = rest.strip_prefix("self::") {
                rest = r;
            } else {
                while let Some(r) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = r;
                }
            }
            // The use tree or path: up to the first character that cannot be in one.
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| match c {
                    '{' => {
                        depth += 1;
                        false
                    }
                    '}' if depth > 0 => {
                        depth -= 1;
                        false
                    }
                    ',' | ' ' | '\n' | '*' if depth > 0 => false,
                    c => !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '*'),
                })
                .map_or(rest.len(), |(i, _)| i);
            for path in expand_tree(&rest[..end]) {
                let mut full = base.clone();
                // `X as Y` names X.
                full.extend(
                    path.iter()
                        .map(|s| {
                            s.split(" as ")
                                .next()
                                .unwrap_or_default()
                                .trim()
                                .to_string()
                        })
                        .filter(|s| !s.is_empty()),
                );
                paths.push(full);
            }
        }
    }
    paths
}

/// What each module re-exports (`pub use x::Y;`): exported name -> the absolute path it names.
fn re_exports(module: &[String], code: &str) -> BTreeMap<String, Vec<String>> {
    let mut exported = BTreeMap::new();
    for statement in code.split(';') {
        // After any attributes (`#[cfg(...)]`) on the lines before it.
        let Some(tree) = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| statement.find(p).map(|at| &statement[at + p.len()..]))
        else {
            continue;
        };
        for path in expand_tree(tree) {
            let Some(last) = path.last() else { continue };
            let (name, path) = match last.split_once(" as ") {
                Some((original, alias)) => {
                    let mut path = path.clone();
                    *path.last_mut().unwrap() = original.trim().to_string();
                    (alias.trim().to_string(), path)
                }
                None => (last.clone(), path.clone()),
            };
            let mut absolute: Vec<String> = match path.first().map(String::as_str) {
                Some("crate") => Vec::new(),
                Some("self") => module.to_vec(),
                Some("super") => module[..module.len().saturating_sub(1)].to_vec(),
                _ => module.to_vec(),
            };
            absolute.extend(
                path.into_iter()
                    .skip_while(|s| s == "crate" || s == "self" || s == "super"),
            );
            exported.insert(name, absolute);
        }
    }
    exported
}

/// The module file a path lands in: its longest prefix that is a module, then, where that
/// module only re-exports the next segment, the module that defines it.
fn owner(
    path: &[String],
    files: &BTreeMap<ModPath, PathBuf>,
    exports: &BTreeMap<ModPath, BTreeMap<String, Vec<String>>>,
    hops: usize,
) -> Option<ModPath> {
    let length = (0..=path.len())
        .rev()
        .find(|&n| files.contains_key(&path[..n]))?;
    let module = path[..length].to_vec();
    if hops < 8
        && let Some(item) = path.get(length)
        && let Some(target) = exports.get(&module).and_then(|e| e.get(item))
        && target.as_slice() != path
    {
        return owner(target, files, exports, hops + 1);
    }
    Some(module)
}

/// The import circles between the files of `src`: groups of files (relative paths) that reach
/// each other through their imports. A module's own submodules are its to name (its face), so
/// a file's imports of its descendants are not counted; an import of an ancestor's item is
/// counted against the file that defines it.
fn import_circles(src: &Path) -> Vec<Vec<String>> {
    let files = module_files(src);
    let codes: BTreeMap<ModPath, String> = files
        .iter()
        .map(|(m, f)| (m.clone(), code_of(&std::fs::read_to_string(f).unwrap())))
        .collect();
    let exports: BTreeMap<ModPath, BTreeMap<String, Vec<String>>> = codes
        .iter()
        .map(|(m, code)| (m.clone(), re_exports(m, code)))
        .collect();
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, code) in &codes {
        let targets = edges.entry(module.clone()).or_default();
        for path in absolute_paths(code, module) {
            if let Some(target) = owner(&path, &files, &exports, 0)
                && !target.starts_with(module)
            {
                targets.insert(target);
            }
        }
    }
    let reach = |from: &ModPath| -> BTreeSet<ModPath> {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(at) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<ModPath, BTreeSet<ModPath>> =
        files.keys().map(|m| (m.clone(), reach(m))).collect();
    let mut circles: BTreeSet<Vec<String>> = BTreeSet::new();
    for (module, from) in &reached {
        let circle: Vec<String> = from
            .iter()
            .filter(|other| reached[*other].contains(module))
            .map(|m| {
                let file = files[m].strip_prefix(src).unwrap();
                file.display().to_string()
            })
            .collect();
        if circle.len() > 1 {
            circles.insert(circle);
        }
    }
    circles.into_iter().collect()
}

/// No file of `host/src` reaches itself through its imports: move the definition that ties a
/// circle to the file that owns it (`DESIGN.md`, "Layout", lists how the last ten went).
#[test]
fn no_files_import_each_other_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let circles = import_circles(&src);
    assert!(circles.is_empty(), "import circles:\n{circles:#?}");
}

#[test]
fn the_circle_finder_sees_a_circle_through_a_re_export_and_none_through_a_face() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    // a's face re-exports its files; x uses y's item through the face, y uses x's directly.
    write(
        "a/mod.rs",
        "mod x;\nmod y;\npub use x::X;\npub use y::{Y, Z as W};\n",
    );
    write("a/x.rs", "use super::W;\npub struct X;\n");
    write("a/y.rs", "use super::x::X;\npub struct Y;\npub struct Z;\n");
    // b uses a's face only, and a nothing of b: no circle.
    write(
        "b.rs",
        "use crate::a::{X, Y};\n// crate::a::x is named in a comment only\n",
    );
    let found = import_circles(dir.path());
    assert_eq!(found, [vec!["a/x.rs".to_string(), "a/y.rs".to_string()]]);
}

/// No error crosses a module boundary as a bare string: no public function (`pub`, `pub(crate)`,
/// `pub(super)`) returns `Result<_, String>`; errors are enums with a kind, as the plugin host's
/// `CallError` is.
#[test]
fn no_public_function_returns_a_string_error() {
    let mut offences = Vec::new();
    for file in host_sources() {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        offences.extend(
            string_errors(&code)
                .into_iter()
                .map(|signature| format!("{}: {signature}", file.display())),
        );
    }
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

/// The public function signatures of `code` whose error type is `String`.
fn string_errors(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
        let public = code[line_start..at].trim_start().starts_with("pub");
        let end = code[at..].find(['{', ';']).map_or(code.len(), |i| at + i);
        let signature = code[at..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let returns = signature.split_once("->").map(|(_, r)| r.trim());
        if public && returns.is_some_and(|r| r.starts_with("Result<") && r.ends_with(", String>")) {
            found.push(signature);
        }
    }
    found
}

#[test]
fn the_string_error_scan_sees_a_public_one_and_not_a_private_one() {
    let code = "pub fn a(x: u8) -> Result<u8, String> {}\nfn b() -> Result<(), String> {}\n\
                pub(crate) fn c(\n    y: u8,\n) -> Result<(), String> {}\npub fn d() -> Result<(), E> {}";
    let found = string_errors(code);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].starts_with("fn a") && found[1].starts_with("fn c"),
        "{found:?}"
    );
}

/// Every Rust file of the host's `src`.
fn host_sources() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files
}

/// The most lines a function of the host may take: a longer one does several things, and each
/// of them wants a name of its own.
const LONGEST_FUNCTION: usize = 150;

#[test]
fn no_function_is_longer_than_150_lines() {
    let mut offences = Vec::new();
    for file in host_sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (name, line, lines) in long_functions(&text, LONGEST_FUNCTION) {
            offences.push(format!(
                "{}:{line}: fn {name} has {lines} lines",
                file.display()
            ));
        }
    }
    assert!(
        offences.is_empty(),
        "functions over {LONGEST_FUNCTION} lines (split them into steps a reader can name):\n{}",
        offences.join("\n")
    );
}

/// The functions of `code` longer than `limit` lines: (name, first line, lines).
fn long_functions(code: &str, limit: usize) -> Vec<(String, usize, usize)> {
    let lines: Vec<String> = blank_literals(code).lines().map(str::to_string).collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = function_name(line) else {
            continue;
        };
        // A `;` before the first `{` ends a declaration without a body (a trait's).
        let (mut depth, mut opened, mut declared) = (0i64, false, false);
        for (at, body_line) in lines.iter().enumerate().skip(start) {
            for c in body_line.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    ';' if !opened => declared = true,
                    _ => {}
                }
                if declared {
                    break;
                }
            }
            if declared {
                break;
            }
            if opened && depth <= 0 {
                let length = at - start + 1;
                if length > limit {
                    found.push((name.to_string(), start + 1, length));
                }
                break;
            }
        }
    }
    found
}

/// The name of the function whose signature starts on `line`, if one does.
fn function_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for qualifier in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// `code` with its comments, strings and character literals blanked (their line breaks kept), so
/// that the braces left are the code's own.
fn blank_literals(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let after_identifier = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        let raw_hashes = (rest[0] == 'r' && !after_identifier)
            .then(|| rest[1..].iter().take_while(|&&c| c == '#').count())
            .filter(|&hashes| rest.get(1 + hashes) == Some(&'"'));
        let skipped = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            (2..rest.len())
                .find(|&j| rest[j - 1] == '*' && rest[j] == '/')
                .map_or(rest.len(), |j| j + 1)
        } else if let Some(hashes) = raw_hashes {
            let open = 2 + hashes;
            (open..rest.len())
                .find(|&j| rest[j] == '"' && rest[j + 1..].iter().take(hashes).all(|&c| c == '#'))
                .map_or(rest.len(), |j| j + 1 + hashes)
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            (2..rest.len())
                .find(|&j| rest[j] == '\'')
                .map_or(rest.len(), |j| j + 1)
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        let skipped = skipped.min(rest.len());
        out.extend(rest[..skipped].iter().filter(|&&c| c == '\n'));
        i += skipped;
    }
    out
}

#[test]
fn the_length_scan_counts_a_function_and_not_the_braces_of_its_literals() {
    let body = "    let x = 1;\n".repeat(150);
    let code = format!(
        "pub(crate) async fn long(\n    a: u8,\n) {{\n{body}}}\n\
         fn short() {{\n    let s = \"}}}}\"; let c = '}}'; let r = r#\"{{\"#; // }}\n}}\n\
         trait T {{\n    fn declared(&self); }}\n{{\n{body}}}\nfn lifetimes<'a>(x: &'a str) {{ let c = '\\n'; }}\n"
    );
    assert_eq!(
        long_functions(&code, 150),
        vec![("long".to_string(), 1, 154)]
    );
    assert!(long_functions(&code, 160).is_empty());
    let blanked = blank_literals("fn f() { \"{\" }\n/* { */ '{' r\"}\"");
    assert_eq!(blanked.matches('{').count(), 1, "{blanked}");
}

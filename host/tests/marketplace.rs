//! The marketplace end to end through the `opentinker` binary: plugins published by name and
//! version, signed, to a real OCI registry (Debian's `docker-registry` on loopback) and to an
//! OCI layout folder; installed by range; yanked; and every kind of tampering refused before
//! anything is cached.

#[path = "common/oci_registry.rs"]
mod oci_registry;
#[path = "common/plugin_build.rs"]
mod plugin_build;
#[path = "common/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_registry::OciRegistry;
use plugin_build::built_plugin;

const BIN: &str = env!("CARGO_BIN_EXE_opentinker");

/// A user of the marketplace: their own config (keys, trust policy) and cache folders.
struct User {
    home: tempfile::TempDir,
    /// Credentials for a registry that wants them: (tenant, API key).
    login: Option<(String, String)>,
}

impl User {
    fn new() -> User {
        User {
            home: tempfile::tempdir().unwrap(),
            login: None,
        }
    }

    /// A user who logs in to registries as `tenant` with `key`.
    fn tenant(tenant: &str, key: &str) -> User {
        User {
            login: Some((tenant.into(), key.into())),
            ..User::new()
        }
    }

    /// Run `opentinker ARGS` as this user: (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("XDG_CACHE_HOME", self.home.path().join("cache"))
            .env_remove("OPENTINKER_REGISTRY")
            .env_remove("OPENTINKER_TRUST_POLICY")
            .env_remove("OPENTINKER_REGISTRY_USERNAME")
            .env_remove("OPENTINKER_REGISTRY_PASSWORD");
        if let Some((tenant, key)) = &self.login {
            command
                .env("OPENTINKER_REGISTRY_USERNAME", tenant)
                .env("OPENTINKER_REGISTRY_PASSWORD", key);
        }
        let output = command.output().expect("running opentinker");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Run and expect success; stdout.
    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "opentinker {args:?} failed:\n{err}");
        out
    }

    /// Run and expect a refusal whose message contains `says`.
    fn refused(&self, args: &[&str], says: &str) -> String {
        let (ok, _, err) = self.run(args);
        assert!(!ok, "opentinker {args:?} should have been refused");
        assert!(err.contains(says), "opentinker {args:?}: {err}");
        err
    }

    /// The components in this user's package cache.
    fn cached(&self) -> usize {
        std::fs::read_dir(self.home.path().join("cache/opentinker/packages/sha256"))
            .map_or(0, |d| d.count())
    }
}

/// The installed component's path, from `plugin install`'s output.
fn installed(stdout: &str) -> PathBuf {
    PathBuf::from(stdout.trim())
}

/// Publishing, resolving by range, yanking and re-publishing on one registry.
fn publish_install_and_yank(user: &User, registry: &str, public_key: &str) {
    let arithmetic = built_plugin("arithmetic");
    let tictactoe = built_plugin("tictactoe");
    let arithmetic_path = arithmetic.to_str().unwrap();
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/arithmetic");
    for version in ["1.0.0", "1.1.0"] {
        let id = format!("games/arithmetic@{version}");
        // From the crate folder: built, with the crate's description, license and language.
        let published = user.ok(&[
            "plugin",
            "publish",
            folder.to_str().unwrap(),
            "--as",
            &id,
            "--registry",
            registry,
        ]);
        assert!(published.contains(public_key), "{published}");
    }
    let (_, out, err) = user.run(&[
        "plugin",
        "install",
        "games/arithmetic@^1",
        "--registry",
        registry,
    ]);
    assert!(err.contains("installed games/arithmetic@1.1.0"), "{err}");
    assert!(err.contains(&format!("signed by {public_key}")), "{err}");
    assert_eq!(
        std::fs::read(installed(&out)).unwrap(),
        std::fs::read(&arithmetic).unwrap()
    );

    let info = user.ok(&["plugin", "info", "games/arithmetic", "--registry", registry]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["package"], "games/arithmetic@1.1.0");
    assert_eq!(info["kinds"], serde_json::json!(["environment"]));
    assert_eq!(info["language"], "rust");
    assert_eq!(
        info["license"], "Apache-2.0",
        "the workspace's, which the crate inherits"
    );
    assert_eq!(info["versions"].as_array().unwrap().len(), 2);
    let found = user.ok(&[
        "plugin",
        "search",
        "arith",
        "--kind",
        "environment",
        "--registry",
        registry,
    ]);
    assert!(found.contains("games/arithmetic@1.1.0"), "{found}");
    let none = user.ok(&[
        "plugin",
        "search",
        "arith",
        "--kind",
        "agent",
        "--registry",
        registry,
    ]);
    assert!(none.is_empty(), "{none}");

    user.ok(&[
        "plugin",
        "yank",
        "games/arithmetic@1.1.0",
        "--registry",
        registry,
    ]);
    let (_, _, err) = user.run(&[
        "plugin",
        "install",
        "games/arithmetic@^1",
        "--registry",
        registry,
    ]);
    assert!(err.contains("installed games/arithmetic@1.0.0"), "{err}");
    user.refused(
        &[
            "plugin",
            "install",
            "games/arithmetic@^1.1",
            "--registry",
            registry,
        ],
        "games/arithmetic@1.1.0 is yanked",
    );
    let (_, _, err) = user.run(&[
        "plugin",
        "install",
        "games/arithmetic@=1.1.0",
        "--registry",
        registry,
    ]);
    assert!(err.contains("installed games/arithmetic@1.1.0"), "{err}");

    user.refused(
        &[
            "plugin",
            "publish",
            tictactoe.to_str().unwrap(),
            "--as",
            "games/arithmetic@1.0.0",
            "--registry",
            registry,
        ],
        "already published with other bytes",
    );
    // Published from the bare .wasm, a 0.2 component still carries what its metadata export
    // says: its crate's description and licence, its language and its config schema.
    let info = user.ok(&[
        "plugin",
        "info",
        "games/arithmetic@1.0.0",
        "--registry",
        registry,
    ]);
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["language"], "rust", "{info}");
    assert_eq!(info["license"], "Apache-2.0", "{info}");
    assert!(
        info["description"]
            .as_str()
            .is_some_and(|d| d.contains("a+b and a*b problems")),
        "{info}"
    );
    assert!(
        info["config_schema"]["properties"]["max_operand"].is_object(),
        "{info}"
    );
    let again = user.run(&[
        "plugin",
        "publish",
        arithmetic_path,
        "--as",
        "games/arithmetic@1.0.0",
        "--registry",
        registry,
    ]);
    assert!(
        again.0 && again.2.contains("already published with these bytes"),
        "{}",
        again.2
    );
    user.refused(
        &[
            "plugin",
            "install",
            "games/nothing@^1",
            "--registry",
            registry,
        ],
        "has no package games/nothing",
    );
    user.refused(
        &[
            "plugin",
            "install",
            "games/arithmetic@^2",
            "--registry",
            registry,
        ],
        "no version of games/arithmetic in `^2`",
    );
}

/// A registry on loopback and a publisher with a key of its own (trusted in its own policy),
/// or `None` where the registry cannot run here.
fn registry_and_publisher() -> Option<(OciRegistry, User, String)> {
    let registry = OciRegistry::start()?;
    let publisher = User::new();
    let public_key = publisher.ok(&["keys", "generate"]).trim().to_string();
    assert!(public_key.starts_with("ed25519:"), "{public_key}");
    Some((registry, publisher, public_key))
}

#[test]
fn plugins_publish_and_install_by_range_on_an_oci_registry_and_a_layout_folder() {
    let Some((registry, user, public_key)) = registry_and_publisher() else {
        return;
    };
    publish_install_and_yank(&user, &registry.reference(), &public_key);

    let layout = user.home.path().join("layout");
    let layout_ref = format!("oci-layout:{}", layout.display());
    publish_install_and_yank(&user, &layout_ref, &public_key);
    assert!(layout.join("oci-layout").is_file() && layout.join("index.json").is_file());

    // A third-party OCI client pulls what was published, byte for byte.
    skopeo_pulls_what_was_published(&registry.host, None, &user);
}

/// skopeo (a third-party OCI client) pulls `games/arithmetic:1.0.0` from the registry at
/// `host`, logged in with `credentials` (`USER:PASSWORD`) when given, and gets the
/// component's bytes; skipped, and counted, where skopeo is missing, except in a strict run.
fn skopeo_pulls_what_was_published(host: &str, credentials: Option<&str>, user: &User) {
    let Some(skopeo) = opentinker_test_tools::skopeo() else {
        return;
    };
    let copy = user.home.path().join("skopeo");
    let mut command = Command::new(skopeo);
    command.args(["copy", "--src-tls-verify=false"]);
    if let Some(credentials) = credentials {
        command.args(["--src-creds", credentials]);
    }
    let output = command
        .arg(format!("docker://{host}/games/arithmetic:1.0.0"))
        .arg(format!("oci:{}:arithmetic", copy.display()))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let original = std::fs::read(built_plugin("arithmetic")).unwrap();
    let digest = sha256_hex(&original);
    let pulled = std::fs::read(copy.join("blobs/sha256").join(digest)).unwrap();
    assert_eq!(pulled, original);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn tampered_unsigned_and_untrusted_plugins_are_refused_and_nothing_is_cached() {
    let Some((registry, publisher, public_key)) = registry_and_publisher() else {
        return;
    };
    let user = User::new();
    user.ok(&["keys", "trust", &public_key, "--namespace", "games"]);
    let oci = registry.reference();
    let layout = user.home.path().join("layout");
    let layout_ref = format!("oci-layout:{}", layout.display());
    let arithmetic = built_plugin("arithmetic");
    let wasm = arithmetic.to_str().unwrap();
    let publish = |who: &User, id: &str, at: &str, extra: &[&str]| {
        let mut args = vec!["plugin", "publish", wasm, "--as", id, "--registry", at];
        args.extend_from_slice(extra);
        who.ok(&args)
    };

    // Unsigned, and signed by a key the user does not trust, or not for this namespace.
    publish(&publisher, "games/plain@1.0.0", &oci, &["--unsigned"]);
    user.refused(
        &["plugin", "install", "games/plain@1", "--registry", &oci],
        "is not signed",
    );
    user.ok(&[
        "plugin",
        "install",
        "games/plain@1",
        "--registry",
        &oci,
        "--allow-unsigned",
    ]);
    let cached = user.cached();
    let stranger = User::new();
    stranger.ok(&["keys", "generate"]);
    publish(&stranger, "games/stranger@1.0.0", &oci, &[]);
    user.refused(
        &["plugin", "install", "games/stranger@1", "--registry", &oci],
        "does not trust for `games`",
    );
    publish(&publisher, "tools/arithmetic@1.0.0", &oci, &[]);
    user.refused(
        &[
            "plugin",
            "install",
            "tools/arithmetic@1",
            "--registry",
            &oci,
        ],
        "does not trust for `tools`",
    );

    // Bytes changed in the registry after publishing: the component's blob, same length.
    let out = publish(&publisher, "games/arithmetic@1.0.0", &oci, &[]);
    let published: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let digest = published["digest"].as_str().unwrap();
    let blob = registry.blob_file(digest);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    user.refused(
        &[
            "plugin",
            "install",
            "games/arithmetic@1",
            "--registry",
            &oci,
        ],
        "not the sha256:",
    );

    // The same in a layout folder: a changed component, then a signature swapped for another
    // version's.
    publish(&publisher, "games/arithmetic@1.0.0", &layout_ref, &[]);
    publish(&publisher, "games/arithmetic@1.1.0", &layout_ref, &[]);
    let blob = layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let original = std::fs::read(&blob).unwrap();
    std::fs::write(&blob, &bytes).unwrap();
    user.refused(
        &[
            "plugin",
            "install",
            "games/arithmetic@=1.0.0",
            "--registry",
            &layout_ref,
        ],
        "not the sha256:",
    );
    std::fs::write(&blob, &original).unwrap();
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let entries = index["manifests"].as_array_mut().unwrap();
    let named = |e: &serde_json::Value| {
        e["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let signatures: Vec<usize> = (0..entries.len())
        .filter(|&i| named(&entries[i]).ends_with(".sig"))
        .collect();
    assert_eq!(signatures.len(), 2);
    let (a, b) = (
        named(&entries[signatures[0]]),
        named(&entries[signatures[1]]),
    );
    entries[signatures[0]]["annotations"]["org.opencontainers.image.ref.name"] = b.into();
    entries[signatures[1]]["annotations"]["org.opencontainers.image.ref.name"] = a.into();
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    user.refused(
        &[
            "plugin",
            "install",
            "games/arithmetic@=1.0.0",
            "--registry",
            &layout_ref,
        ],
        "signature of games/arithmetic@1.0.0 is not valid",
    );
    assert_eq!(user.cached(), cached, "a refused plugin was cached");

    // Names and registries that are not.
    user.refused(
        &["plugin", "install", "Games/x@1", "--registry", &oci],
        "lowercase",
    );
    user.refused(
        &["plugin", "install", "games/x@1", "--registry", "https://x"],
        "oci-layout:DIR",
    );
}

/// Publish arithmetic as `games/arithmetic@1.0.0` on `oci`, train a job that names
/// `games/arithmetic@^1` there, and check that its lock file pins the digest: the job's folder,
/// the job file and the lock file's text.
fn a_job_by_range_is_pinned(user: &User, oci: &str) -> (tempfile::TempDir, PathBuf, String) {
    let arithmetic = built_plugin("arithmetic");
    user.ok(&[
        "plugin",
        "publish",
        arithmetic.to_str().unwrap(),
        "--as",
        "games/arithmetic@1.0.0",
        "--registry",
        oci,
    ]);
    let (dir, job) = arithmetic_job("games/arithmetic@^1");
    let (ok, _, err) = train(user, &job, "first", Some(oci));
    assert!(ok, "{err}");
    assert!(err.contains("pinned games/arithmetic@1.0.0"), "{err}");
    let lock = std::fs::read_to_string(dir.path().join("job.lock")).unwrap();
    let digest = format!(
        "sha256:{}",
        sha256_hex(&std::fs::read(&arithmetic).unwrap())
    );
    assert!(lock.contains(&digest), "{lock}");
    assert!(lock.contains("wanted = \"games/arithmetic@^1\""), "{lock}");
    (dir, job, lock)
}

/// A folder with `job.toml`, one short RL step on the arithmetic environment named `plugin`.
fn arithmetic_job(plugin: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    let text = r#"
[model]
init_tiny = { shape = "tiny", arch = "qwen2", seed = 0 }

[lora]
rank = 4

[environment]
plugin = "PLUGIN"
config = { max_operand = 4 }

[rl]
steps = 1
groups_per_batch = 1
group_size = 2
max_turns = 1
max_tokens = 4
"#;
    std::fs::write(&job, text.replace("PLUGIN", plugin)).unwrap();
    (dir, job)
}

/// `opentinker train JOB --out DIR/OUT [--registry REGISTRY]` as `user`.
fn train(user: &User, job: &Path, out: &str, registry: Option<&str>) -> (bool, String, String) {
    let out = job.with_file_name(out);
    let mut args = vec![
        "train",
        job.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(registry) = registry {
        args.extend(["--registry", registry]);
    }
    user.run(&args)
}

#[test]
fn a_job_names_a_plugin_by_range_and_its_lock_file_pins_the_digest() {
    let Some((registry, user, _)) = registry_and_publisher() else {
        return;
    };
    let oci = registry.reference();
    let (dir, job, lock) = a_job_by_range_is_pinned(&user, &oci);

    // A later version in range changes nothing while the lock file pins 1.0.0; the run uses the
    // cached component even with the registry gone.
    let tictactoe = built_plugin("tictactoe");
    user.ok(&[
        "plugin",
        "publish",
        tictactoe.to_str().unwrap(),
        "--as",
        "games/arithmetic@1.1.0",
        "--registry",
        &oci,
    ]);
    drop(registry);
    let (ok, _, err) = train(&user, &job, "second", Some(&oci));
    assert!(ok, "{err}");
    assert!(!err.contains("pinned"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("job.lock")).unwrap(),
        lock
    );

    // Without the lock file the range is resolved again, and a registry is needed for it.
    std::fs::remove_file(dir.path().join("job.lock")).unwrap();
    let (ok, _, err) = train(&user, &job, "third", Some(&oci));
    assert!(
        !ok && err.contains("[environment] plugin games/arithmetic@^1"),
        "{err}"
    );
}

/// `opentinker serve`'s own registry: the flows of any registry (publish, install by range,
/// yank, a job pinned by its lock file, a third-party client's pull), under the tenants'
/// rules, which the server keeps itself whatever the client: every request carries a tenant's
/// key, a namespace is one tenant's, a version never changes, pushes count against the quota.
#[test]
fn the_servers_registry_serves_the_same_flows_under_the_tenants_rules() {
    let server = server::start_server_with(&["--max-plugin-mib-per-tenant", "4"]);
    let oci = server.url.replace("http://", "oci://");
    let host = server.url.trim_start_matches("http://").to_string();
    let alice = User::tenant("alice", &server.alice);
    let public_key = alice.ok(&["keys", "generate"]).trim().to_string();
    publish_install_and_yank(&alice, &oci, &public_key);

    // Bob pulls what Alice published once he trusts her key, and publishes only into
    // namespaces of his own.
    let arithmetic = built_plugin("arithmetic");
    let tictactoe = built_plugin("tictactoe");
    let bob = User::tenant("bob", &server.bob);
    let install = [
        "plugin",
        "install",
        "games/arithmetic@=1.0.0",
        "--registry",
        &oci,
    ];
    bob.refused(&install, "does not trust for `games`");
    bob.ok(&["keys", "trust", &public_key, "--namespace", "games"]);
    let out = bob.ok(&install);
    assert_eq!(
        std::fs::read(installed(&out)).unwrap(),
        std::fs::read(&arithmetic).unwrap()
    );
    bob.ok(&["keys", "generate"]);
    let publish = |who: &User, wasm: &Path, id: &str| {
        who.run(&[
            "plugin",
            "publish",
            wasm.to_str().unwrap(),
            "--as",
            id,
            "--registry",
            &oci,
        ])
    };
    for id in ["games/tictactoe@1.0.0", "alice/tictactoe@1.0.0"] {
        let (ok, _, err) = publish(&bob, &tictactoe, id);
        assert!(
            !ok && err.contains("belongs to another tenant"),
            "{id}: {err}"
        );
    }
    let (ok, _, err) = publish(&bob, &tictactoe, "bob/tictactoe@1.0.0");
    assert!(ok, "{err}");

    // The server keeps the rules against any client: no key, a version moved onto other
    // bytes, a tag that is not a version, a push into another's namespace, past the quota.
    let (status, head, _) = server::request(&server.url, "GET", "/v2/", None, "text/plain", b"");
    assert_eq!(status, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic"),
        "{head}"
    );
    let path = "/v2/games/arithmetic/manifests/1.0.0";
    let (status, _, manifest) = server::request(
        &server.url,
        "GET",
        path,
        Some(&server.bob),
        "text/plain",
        b"",
    );
    assert_eq!(status, 200);
    let mut moved: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    moved["annotations"]["org.opencontainers.image.description"] = "other bytes".into();
    let moved = serde_json::to_vec(&moved).unwrap();
    let media = "application/vnd.oci.image.manifest.v1+json";
    for (key, path, says) in [
        (&server.alice, path, "a version never changes"),
        (
            &server.alice,
            "/v2/games/arithmetic/manifests/latest",
            "not a tag of this registry",
        ),
        (
            &server.bob,
            "/v2/games/arithmetic/manifests/9.0.0",
            "belongs to another tenant",
        ),
    ] {
        let (status, _, body) = server::request(&server.url, "PUT", path, Some(key), media, &moved);
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let big = vec![7u8; 5 << 20];
    let upload = format!(
        "/v2/alice/big/blobs/uploads/?digest=sha256:{}",
        sha256_hex(&big)
    );
    let (status, _, body) = server::request(
        &server.url,
        "POST",
        &upload,
        Some(&server.alice),
        "application/octet-stream",
        &big,
    );
    let body = String::from_utf8_lossy(&body);
    assert!(
        status == 403 && body.contains("quota of 4194304 bytes"),
        "{status} {body}"
    );

    // Bytes changed in the server's storage after publishing are refused, nothing cached.
    let blob = server
        .data
        .path()
        .join("registry/blobs/sha256")
        .join(sha256_hex(&std::fs::read(&arithmetic).unwrap()));
    let original = std::fs::read(&blob).unwrap();
    let mut changed = original.clone();
    let last = changed.len() - 1;
    changed[last] ^= 0xff;
    std::fs::write(&blob, &changed).unwrap();
    let bob_on_a_clean_cache = User::tenant("bob", &server.bob);
    bob_on_a_clean_cache.ok(&["keys", "trust", &public_key, "--namespace", "games"]);
    bob_on_a_clean_cache.refused(&install, "not the sha256:");
    assert_eq!(
        bob_on_a_clean_cache.cached(),
        0,
        "a refused plugin was cached"
    );
    std::fs::write(&blob, &original).unwrap();

    skopeo_pulls_what_was_published(&host, Some(&format!("bob:{}", server.bob)), &bob);
    a_job_by_range_is_pinned(&alice, &oci);

    // A job submitted to the server may leave its packages to the server, which resolves them
    // on its own registry under the submitter's trust there: the packages of the tenant's own
    // namespaces even unsigned, another's only signed by a key the tenant trusts.
    let (ok, _, err) = alice.run(&[
        "plugin",
        "publish",
        arithmetic.to_str().unwrap(),
        "--as",
        "alice/plain@1.0.0",
        "--registry",
        &oci,
        "--unsigned",
    ]);
    assert!(ok, "{err}");
    let submit = |who: &User, key: &str, plugin: &str| {
        let (dir, job) = arithmetic_job(plugin);
        let (ok, _, err) = who.run(&[
            "submit",
            job.to_str().unwrap(),
            "--server",
            &server.url,
            "--api-key",
            key,
            "--detach",
        ]);
        let lock = std::fs::read_to_string(dir.path().join("job.lock")).unwrap_or_default();
        (ok, err, lock)
    };
    let digest = format!(
        "sha256:{}",
        sha256_hex(&std::fs::read(&arithmetic).unwrap())
    );
    let (ok, err, lock) = submit(&alice, &server.alice, "alice/plain@^1");
    assert!(ok && err.contains("pinned alice/plain@1.0.0"), "{err}");
    assert!(lock.contains(&digest), "{lock}");
    let (ok, err, _) = submit(&bob, &server.bob, "alice/plain@^1");
    assert!(
        !ok && err.contains("alice/plain@1.0.0 is not signed"),
        "{err}"
    );
    let (ok, err, _) = submit(&bob, &server.bob, "games/arithmetic@^1");
    assert!(!ok && err.contains("does not trust for `games`"), "{err}");
    let policy = format!("[[publisher]]\nkey = \"{public_key}\"\nnamespaces = [\"games\"]\n");
    let (status, _, body) = server::request(
        &server.url,
        "PUT",
        "/api/v1/trust",
        Some(&server.bob),
        "application/toml",
        policy.as_bytes(),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (ok, err, lock) = submit(&bob, &server.bob, "games/arithmetic@^1");
    assert!(ok && err.contains("pinned games/arithmetic@1.0.0"), "{err}");
    assert!(lock.contains(&digest), "{lock}");
}

//! The marketplace end to end through the `opentinker` binary: plugins published by name and
//! version, signed, to a real OCI registry (Debian's `docker-registry` on loopback) and to an
//! OCI layout folder; installed by range; yanked; and every kind of tampering refused before
//! anything is cached.

#[path = "common/oci_registry.rs"]
mod oci_registry;
#[path = "common/plugin_build.rs"]
mod plugin_build;

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_registry::OciRegistry;
use plugin_build::built_plugin;

const BIN: &str = env!("CARGO_BIN_EXE_opentinker");

/// A user of the marketplace: their own config (keys, trust policy) and cache folders.
struct User {
    home: tempfile::TempDir,
}

impl User {
    fn new() -> User {
        User {
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// Run `opentinker ARGS` as this user: (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let output = Command::new(BIN)
            .args(args)
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("XDG_CACHE_HOME", self.home.path().join("cache"))
            .env_remove("OPENTINKER_REGISTRY")
            .env_remove("OPENTINKER_TRUST_POLICY")
            .output()
            .expect("running opentinker");
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
    if Path::new("/usr/bin/skopeo").exists() {
        let copy = user.home.path().join("skopeo");
        let output = Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{}/games/arithmetic:1.0.0", registry.host))
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
    } else {
        assert!(std::env::var_os("CI").is_none(), "skopeo is missing");
        eprintln!("skipped the skopeo pull: skopeo is not installed");
    }
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

#[test]
fn a_job_names_a_plugin_by_range_and_its_lock_file_pins_the_digest() {
    let Some((registry, user, _)) = registry_and_publisher() else {
        return;
    };
    let oci = registry.reference();
    let arithmetic = built_plugin("arithmetic");
    let tictactoe = built_plugin("tictactoe");
    let publish = |wasm: &Path, id: &str| {
        user.ok(&[
            "plugin",
            "publish",
            wasm.to_str().unwrap(),
            "--as",
            id,
            "--registry",
            &oci,
        ])
    };
    publish(&arithmetic, "games/arithmetic@1.0.0");
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        r#"
[model]
init_tiny = { shape = "tiny", arch = "qwen2", seed = 0 }

[lora]
rank = 4

[environment]
plugin = "games/arithmetic@^1"
config = { max_operand = 4 }

[rl]
steps = 1
groups_per_batch = 1
group_size = 2
max_turns = 1
max_tokens = 4
"#,
    )
    .unwrap();
    let train = |out: &str| {
        let out = dir.path().join(out);
        user.run(&[
            "train",
            job.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--registry",
            &oci,
        ])
    };
    let (ok, _, err) = train("first");
    assert!(ok, "{err}");
    assert!(err.contains("pinned games/arithmetic@1.0.0"), "{err}");
    let lock = std::fs::read_to_string(dir.path().join("job.lock")).unwrap();
    let digest = format!(
        "sha256:{}",
        sha256_hex(&std::fs::read(&arithmetic).unwrap())
    );
    assert!(lock.contains(&digest), "{lock}");
    assert!(lock.contains("wanted = \"games/arithmetic@^1\""), "{lock}");

    // A later version in range changes nothing while the lock file pins 1.0.0; the run uses the
    // cached component even with the registry gone.
    publish(&tictactoe, "games/arithmetic@1.1.0");
    drop(registry);
    let (ok, _, err) = train("second");
    assert!(ok, "{err}");
    assert!(!err.contains("pinned"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("job.lock")).unwrap(),
        lock
    );

    // Without the lock file the range is resolved again, and a registry is needed for it.
    std::fs::remove_file(dir.path().join("job.lock")).unwrap();
    let (ok, _, err) = train("third");
    assert!(
        !ok && err.contains("[environment] plugin games/arithmetic@^1"),
        "{err}"
    );
}

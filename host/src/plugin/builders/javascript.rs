//! Build a JavaScript plugin into a component with componentize-js.
//!
//! The plugin's module marks its class with `plugin(...)` from the `opentinker` package; the build
//! bundles that module with the SDK and the glue of its kind (the WIT exports, delegating to the
//! class) into one ES module with esbuild, then componentize-js splices it into its SpiderMonkey
//! engine and snapshots the initialised engine with Wizer. The SDK, the glue and the WIT are
//! carried inside this program, so that a build uses the SDK of the host it is for. The toolchain,
//! pinned by a lock file, is installed with `npm ci` on first use into the user's cache folder,
//! outside any project (or taken from [`JS_TOOLCHAIN_ENV`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::reuse::{Inputs, build_once};
use super::{cache_dir, write_file};
use crate::plugin::PluginKind;

/// The componentize-js the toolchain pins (its lock file pins everything else).
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";

/// Names a toolchain folder (holding the `node_modules` of the toolchain's `package.json`) to use
/// instead of the cached install.
pub const JS_TOOLCHAIN_ENV: &str = "OPENTINKER_JS_TOOLCHAIN";

/// The toolchain's build driver: (its file name, its contents).
const DRIVER: (&str, &str) = (
    "componentize.mjs",
    include_str!("../../../../sdk/js/toolchain/componentize.mjs"),
);

/// A file every installed toolchain folder holds.
const INSTALLED: &str = "node_modules/@bytecodealliance/componentize-js/package.json";

/// The toolchain's manifest, lock file and build driver, written into its folder.
const TOOLCHAIN_FILES: [(&str, &str); 3] = [
    (
        "package.json",
        include_str!("../../../../sdk/js/toolchain/package.json"),
    ),
    (
        "package-lock.json",
        include_str!("../../../../sdk/js/toolchain/package-lock.json"),
    ),
    DRIVER,
];

/// The WIT the component is built against.
const WIT: &str = include_str!("../../../../wit/v0.3/plugin.wit");

/// The SDK and its glue, written into the build folder: (path under it, contents).
const SDK_FILES: [(&str, &str); 7] = [
    (
        "sdk/index.js",
        include_str!("../../../../sdk/js/src/index.js"),
    ),
    (
        "glue/convert.js",
        include_str!("../../../../sdk/js/src/glue/convert.js"),
    ),
    (
        "glue/environment.js",
        include_str!("../../../../sdk/js/src/glue/environment.js"),
    ),
    (
        "glue/agent.js",
        include_str!("../../../../sdk/js/src/glue/agent.js"),
    ),
    (
        "glue/reward.js",
        include_str!("../../../../sdk/js/src/glue/reward.js"),
    ),
    (
        "glue/objective.js",
        include_str!("../../../../sdk/js/src/glue/objective.js"),
    ),
    (
        "glue/advantage.js",
        include_str!("../../../../sdk/js/src/glue/advantage.js"),
    ),
];

/// What a plugin's `package.json` may say.
#[derive(Debug, Default, Deserialize)]
struct PackageJson {
    name: Option<String>,
    version: Option<String>,
    description: Option<String>,
    /// An SPDX expression, or (older packages) an object with `type`.
    license: Option<serde_json::Value>,
    opentinker: Option<Settings>,
}

/// The `opentinker` field of `package.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(default)]
    kind: PluginKind,
    /// The module that marks the plugin's class, relative to the package (default `app.js`).
    #[serde(default = "default_module")]
    module: String,
}

fn default_module() -> String {
    "app.js".into()
}

/// The fields of the component's metadata, as the glue's `package.js` exports them.
#[derive(Serialize)]
struct PackageFields<'a> {
    name: &'a str,
    version: &'a str,
    description: &'a str,
    license: String,
}

/// What the build driver (`componentize.mjs`) is asked to do.
#[derive(Serialize)]
struct DriverJob<'a> {
    entry: &'a Path,
    sdk: &'a Path,
    wit: &'a Path,
    world: &'a str,
    bundle: &'a Path,
    output: &'a Path,
}

pub(super) fn is_js_plugin(dir: &Path) -> bool {
    read_package(dir).is_ok_and(|package| package.opentinker.is_some())
}

fn read_package(dir: &Path) -> anyhow::Result<PackageJson> {
    let path = dir.join("package.json");
    if !path.is_file() {
        return Ok(PackageJson::default());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid package.json", path.display()))
}

/// Build the JavaScript plugin in `dir` into `dir/target/opentinker/NAME.wasm`, or reuse the one
/// there that was built from the same inputs.
pub(super) fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let package = read_package(&dir)?;
    let Some(settings) = package.opentinker else {
        bail!(
            "{} has no `opentinker` field: add `\"opentinker\": {{\"kind\": \"environment\", \
             \"module\": \"app.js\"}}`",
            dir.join("package.json").display()
        );
    };
    let module = plugin_module(&dir, &settings.module)?;
    let name = package
        .name
        .clone()
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "plugin".into());
    // A scoped package's file is named after its last part.
    let file_name = name.rsplit('/').next().unwrap_or(&name).to_string();
    let license = match &package.license {
        Some(serde_json::Value::String(spdx)) => spdx.clone(),
        Some(serde_json::Value::Object(old)) => old
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    };
    let fields = PackageFields {
        name: &name,
        version: package.version.as_deref().unwrap_or("0.0.0"),
        description: package.description.as_deref().unwrap_or_default(),
        license,
    };

    let build_dir = dir.join("target").join("opentinker");
    let package_module = format!(
        "// The package's fields for the component's metadata, from its package.json.\n\
         export const PACKAGE = {};\n",
        serde_json::to_string(&fields)?
    );
    let kind = settings.kind.interface();
    let module_literal = serde_json::to_string(&module.to_string_lossy())?;
    let entry = format!(
        "// The component's module: the plugin's own (which marks its class), and the WIT \
         exports of its kind.\nimport {module_literal};\nexport * from \"./glue/{kind}.js\";\n"
    );
    let generated = [
        ("wit/plugin.wit", WIT),
        ("glue/package.js", package_module.as_str()),
        ("entry.js", entry.as_str()),
    ];

    let output = build_dir.join(format!("{file_name}.wasm"));
    let job = DriverJob {
        entry: &build_dir.join("entry.js"),
        sdk: &build_dir.join("sdk/index.js"),
        wit: &build_dir.join("wit/plugin.wit"),
        world: &format!("{kind}-plugin"),
        bundle: &build_dir.join("bundle.js"),
        output: &output,
    };
    let toolchain = toolchain()?;
    let mut inputs = Inputs::new(&format!(
        "componentize-js {COMPONENTIZE_JS_VERSION} at {}",
        toolchain.display()
    ));
    for (relative, contents) in TOOLCHAIN_FILES.iter().chain(&SDK_FILES).chain(&generated) {
        inputs.add(relative, contents.as_bytes());
    }
    inputs.add_folder(&dir)?;
    build_once(&build_dir, &output, inputs, || {
        for (relative, contents) in SDK_FILES.iter().chain(&generated) {
            write_file(&build_dir.join(relative), contents)?;
        }
        let status = Command::new("node")
            .arg(toolchain.join(DRIVER.0))
            .arg(serde_json::to_string(&job)?)
            // componentize-js reads the bundle and the WIT through a program that sees this
            // folder.
            .current_dir(&build_dir)
            // Its progress goes with the build's other messages, never into a command's output.
            .stdout(std::io::stderr())
            .status()
            .context(
                "running node: JavaScript plugins are built with Node.js 20 or newer, not found \
                 on PATH",
            )?;
        if !status.success() {
            bail!(
                "componentize-js could not build {} ({status}; its errors are above)",
                dir.display()
            );
        }
        Ok(())
    })
}

/// The plugin's module `relative` to its package `dir`: a file inside it.
fn plugin_module(dir: &Path, relative: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(relative);
    let resolved = path.canonicalize().with_context(|| {
        format!(
            "package.json's opentinker.module `{relative}`: no such file {}",
            path.display()
        )
    })?;
    if !resolved.starts_with(dir) || !resolved.is_file() {
        bail!("package.json's opentinker.module `{relative}` is not a file inside the package");
    }
    Ok(resolved)
}

/// The toolchain folder to build with: [`JS_TOOLCHAIN_ENV`], or the one pinned by this program's
/// lock file in the cache folder, installed there with `npm ci` on first use. Either way its
/// build driver is this program's.
fn toolchain() -> anyhow::Result<PathBuf> {
    let folder = match std::env::var_os(JS_TOOLCHAIN_ENV) {
        Some(folder) => PathBuf::from(folder),
        None => cached_toolchain()?,
    };
    let installed = folder.join(INSTALLED);
    if !installed.is_file() {
        bail!(
            "{} holds no installed JavaScript toolchain (no {}): run `npm ci` there",
            folder.display(),
            installed.display()
        );
    }
    let (driver, contents) = DRIVER;
    let path = folder.join(driver);
    if std::fs::read_to_string(&path).ok().as_deref() != Some(contents) {
        write_file(&path, contents)?;
    }
    Ok(folder)
}

fn cached_toolchain() -> anyhow::Result<PathBuf> {
    let folder = cache_dir()?.join(format!("componentize-js-{COMPONENTIZE_JS_VERSION}"));
    if folder.join(INSTALLED).is_file() {
        return Ok(folder);
    }
    eprintln!(
        "installing componentize-js {COMPONENTIZE_JS_VERSION} and esbuild with npm into {} (once)",
        folder.display()
    );
    // Installed beside, then renamed into place: a half-made toolchain is never taken for a good
    // one, and two builds installing at once both end with a whole one.
    let staging = folder.with_extension(format!("installing-{}", std::process::id()));
    for (file, contents) in TOOLCHAIN_FILES {
        write_file(&staging.join(file), contents)?;
    }
    let installed = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&staging)
        .stdout(std::io::stderr())
        .status()
        .context("running npm: JavaScript plugins are built with Node.js 20 or newer and npm")?;
    if !installed.success() {
        let _ = std::fs::remove_dir_all(&staging);
        bail!(
            "npm ci could not install the JavaScript toolchain into {}",
            staging.display()
        );
    }
    if std::fs::rename(&staging, &folder).is_err() {
        // Another build put its toolchain there first: use that one.
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(folder)
}

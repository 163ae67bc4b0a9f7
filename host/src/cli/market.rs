//! `opentinker keys generate|trust` and the marketplace's `plugin publish | search | info |
//! install | verify | yank`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;

use super::HostArgs;
use crate::market::PackageCache;
use crate::market::TrustPolicy;
use crate::market::packages::{self, Fetched};
use crate::market::{Artifact, PublishedMetadata};
use crate::market::{KeyPair, PublisherKey, public_key_path};
use crate::market::{LockFile, Locked, lock_path};
use crate::market::{MarketError, PackageId, PackageRef, Registry, RegistryRef};
use crate::plugin::build_plugin;
use crate::plugin::{Limits, PluginHost, PluginKind};
use crate::rl::Job;

/// What becomes of a published plugin that the job's lock file does not pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpinned {
    /// Resolved on the registry of the command line and installed.
    Install,
    /// Left named by its range when the command line names no registry: the server the job
    /// is submitted to resolves it on its own registry.
    LeaveToServer,
}

/// The kinds of `plugin new` and `plugin search`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Kind {
    Environment,
    Agent,
    Reward,
}

impl Kind {
    pub fn plugin_kind(self) -> PluginKind {
        match self {
            Kind::Environment => PluginKind::Environment,
            Kind::Agent => PluginKind::Agent,
            Kind::Reward => PluginKind::Reward,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make an ed25519 publisher key pair, and trust its public key in the trust policy.
    Generate {
        /// Where to write the key pair (its public key goes beside it, as KEY.pub); default:
        /// the user's key, which `plugin publish` signs with.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Leave the trust policy as it is.
        #[arg(long)]
        no_trust: bool,
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Trust a publisher's public key (`ed25519:HEX`, or a `.pub` file).
    Trust {
        key: String,
        /// Only for this namespace (repeatable); default: every namespace.
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        #[command(flatten)]
        trust: TrustArgs,
    },
}

/// The registry of a marketplace command.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// `oci://HOST[:PORT][/PREFIX]` (an OCI distribution registry) or `oci-layout:DIR`.
    #[arg(long, env = "OPENTINKER_REGISTRY")]
    registry: String,
}

impl RegistryArgs {
    fn open(&self) -> anyhow::Result<Box<dyn Registry>> {
        let reference: RegistryRef = self.registry.parse()?;
        Ok(reference.open()?)
    }
}

/// The trust policy of a command that fetches plugins.
#[derive(Debug, clap::Args)]
pub struct TrustArgs {
    /// The trust policy file (default: the user's, `~/.config/opentinker/trust.toml`).
    #[arg(long, env = "OPENTINKER_TRUST_POLICY")]
    trust_policy: Option<PathBuf>,
}

impl TrustArgs {
    fn path(&self) -> anyhow::Result<PathBuf> {
        match &self.trust_policy {
            Some(path) => Ok(path.clone()),
            None => Ok(config_folder()?.join("trust.toml")),
        }
    }

    fn load(&self) -> anyhow::Result<TrustPolicy> {
        Ok(TrustPolicy::load(&self.path()?)?)
    }
}

fn config_folder() -> anyhow::Result<PathBuf> {
    super::user_folder("XDG_CONFIG_HOME", ".config")
        .context("neither XDG_CONFIG_HOME nor HOME is set: name the file explicitly")
}

/// The user's publisher key, which `keys generate` writes and `plugin publish` signs with.
fn default_key() -> anyhow::Result<PathBuf> {
    Ok(config_folder()?.join("keys").join("publisher.key"))
}

#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The plugin: a component (.wasm) or a plugin folder to build first.
    plugin: PathBuf,
    /// `namespace/name@version` to publish it as.
    #[arg(long = "as")]
    id: String,
    #[command(flatten)]
    registry: RegistryArgs,
    /// The key to sign with (default: the user's key, when `keys generate` made one).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Publish without a signature.
    #[arg(long, conflicts_with = "key")]
    unsigned: bool,
    /// A description (default: the crate's or project's own).
    #[arg(long)]
    description: Option<String>,
    /// An SPDX license expression (default: the crate's or project's own).
    #[arg(long)]
    license: Option<String>,
    /// A JSON Schema of the plugin's config.
    #[arg(long)]
    config_schema: Option<PathBuf>,
    #[command(flatten)]
    host: HostArgs,
}

#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// `namespace/name@RANGE` (`@^1.2`, `@=1.2.0`; no range for the latest).
    package: String,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    trust: TrustArgs,
    /// Accept plugins without a trusted signature (a signature that fails is still refused).
    #[arg(long)]
    allow_unsigned: bool,
}

#[derive(Debug, clap::Args)]
pub struct SearchArgs {
    /// Text to find in names and descriptions (empty for every package).
    #[arg(default_value = "")]
    text: String,
    /// Only plugins of this kind.
    #[arg(long, value_enum)]
    kind: Option<Kind>,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct InfoArgs {
    /// `namespace/name`, with a range or version to describe (default: the latest).
    package: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, clap::Args)]
pub struct YankArgs {
    /// `namespace/name@version`.
    id: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

pub fn run_keys(command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Generate {
            out,
            no_trust,
            trust,
        } => {
            let path = match out {
                Some(path) => path,
                None => default_key()?,
            };
            let pair = KeyPair::generate()?;
            pair.save(&path)?;
            eprintln!(
                "wrote {} (secret, mode 0600) and {}",
                path.display(),
                public_key_path(&path).display()
            );
            if !no_trust {
                let policy_path = trust.path()?;
                let mut policy = TrustPolicy::load(&policy_path)?;
                policy.trust(pair.public(), None);
                policy.save(&policy_path)?;
                eprintln!("trusted in {}", policy_path.display());
            }
            println!("{}", pair.public());
            Ok(())
        }
        KeysCommand::Trust {
            key,
            namespaces,
            trust,
        } => {
            let text = if Path::new(&key).is_file() {
                std::fs::read_to_string(&key).with_context(|| format!("reading {key}"))?
            } else {
                key
            };
            let key: PublisherKey = text.trim().parse()?;
            let path = trust.path()?;
            let mut policy = TrustPolicy::load(&path)?;
            policy.trust(key, (!namespaces.is_empty()).then_some(namespaces));
            policy.save(&path)?;
            eprintln!("trusted {key} in {}", path.display());
            Ok(())
        }
    }
}

/// What a plugin's own manifest (Cargo.toml or pyproject.toml) says of it.
fn manifest_metadata(dir: &Path) -> PublishedMetadata {
    let read = |file: &str| -> Option<toml::Table> {
        toml::from_str(&std::fs::read_to_string(dir.join(file)).ok()?).ok()
    };
    let text = |table: Option<&toml::Value>, key: &str| table?.get(key)?.as_str().map(String::from);
    if let Some(cargo) = read("Cargo.toml") {
        let package = cargo.get("package");
        // `key.workspace = true` takes the workspace's `[workspace.package]` value.
        let inherited = |key: &str| {
            let from_workspace = package
                .and_then(|p| p.get(key)?.get("workspace")?.as_bool())
                .unwrap_or(false);
            text(package, key).or_else(|| {
                from_workspace.then_some(())?;
                dir.ancestors().skip(1).find_map(|up| {
                    let root: toml::Table =
                        toml::from_str(&std::fs::read_to_string(up.join("Cargo.toml")).ok()?)
                            .ok()?;
                    text(root.get("workspace")?.get("package"), key)
                })
            })
        };
        return PublishedMetadata {
            description: inherited("description"),
            license: inherited("license"),
            source: inherited("repository"),
            language: Some("rust".into()),
            config_schema: None,
        };
    }
    if let Some(pyproject) = read("pyproject.toml") {
        let project = pyproject.get("project");
        return PublishedMetadata {
            description: text(project, "description"),
            license: text(project, "license"),
            language: Some("python".into()),
            ..PublishedMetadata::default()
        };
    }
    if dir.join("app.py").is_file() {
        return PublishedMetadata {
            language: Some("python".into()),
            ..PublishedMetadata::default()
        };
    }
    PublishedMetadata::default()
}

pub fn run_publish(args: PublishArgs) -> anyhow::Result<()> {
    let id: PackageId = args.id.parse()?;
    let (component, mut metadata) = if args.plugin.is_dir() {
        (build_plugin(&args.plugin)?, manifest_metadata(&args.plugin))
    } else {
        (args.plugin.clone(), PublishedMetadata::default())
    };
    metadata.description = args.description.or(metadata.description);
    metadata.license = args.license.or(metadata.license);
    if let Some(schema) = &args.config_schema {
        let text = std::fs::read_to_string(schema)
            .with_context(|| format!("reading {}", schema.display()))?;
        metadata.config_schema = Some(
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", schema.display()))?,
        );
    }
    let key = match (&args.key, args.unsigned) {
        (_, true) => None,
        (Some(path), false) => Some(KeyPair::load(path)?),
        (None, false) => {
            let path = default_key()?;
            if path.is_file() {
                Some(KeyPair::load(&path)?)
            } else {
                anyhow::bail!(
                    "no key to sign with: make one with `opentinker keys generate`, name one with --key, or publish --unsigned"
                )
            }
        }
    };
    let registry = args.registry.open()?;
    super::runtime(2)?.block_on(async {
        let host = PluginHost::new(args.host.host_config())?;
        let plugin = host
            .load_file(&component)
            .await
            .with_context(|| format!("{} is not a plugin this host runs", component.display()))?;
        if let Some(export) = plugin
            .metadata(&Limits::default())
            .await
            .context("asking the plugin for its metadata")?
        {
            metadata.fill_from(&export);
        }
        let description = plugin.description().clone();
        let bytes = tokio::fs::read(&component)
            .await
            .with_context(|| format!("reading {}", component.display()))?;
        let artifact = Artifact::build(&id, bytes, &description, &metadata);
        let published = packages::publish(registry.as_ref(), &id, &artifact, key.as_ref()).await?;
        let how = match &published.signed_by {
            Some(key) => format!("signed by {key}"),
            None => "unsigned".into(),
        };
        let again = if published.already_published {
            " (already published with these bytes)"
        } else {
            ""
        };
        eprintln!(
            "published {id} to {}{again}: {} ({how})",
            registry.location(),
            published.digest
        );
        println!("{}", serde_json::to_string(&published)?);
        Ok(())
    })
}

/// Resolve `package` on `registry` and fetch it checked under the policy of `args`.
async fn fetch_checked(args: &FetchArgs, registry: &dyn Registry) -> anyhow::Result<Fetched> {
    let wanted: PackageRef = args.package.parse()?;
    let mut policy = args.trust.load()?;
    policy.allow_unsigned |= args.allow_unsigned;
    let id = packages::resolve(registry, &wanted).await?;
    Ok(packages::fetch(registry, &id, &policy).await?)
}

fn signer(fetched: &Fetched) -> String {
    match &fetched.signed_by {
        Some(key) => format!("signed by {key}"),
        None => "without a trusted signature (allowed by --allow-unsigned or the policy)".into(),
    }
}

pub fn run_install(args: FetchArgs) -> anyhow::Result<()> {
    let registry = args.registry.open()?;
    let cache = package_cache()?;
    let fetched = super::runtime(2)?.block_on(fetch_checked(&args, registry.as_ref()))?;
    let path = cache.put(&fetched.info.digest, &fetched.component)?;
    eprintln!(
        "installed {} ({}), {}",
        fetched.id,
        fetched.info.digest,
        signer(&fetched)
    );
    println!("{}", path.display());
    Ok(())
}

pub fn run_verify(args: FetchArgs) -> anyhow::Result<()> {
    let registry = args.registry.open()?;
    let fetched = super::runtime(2)?.block_on(fetch_checked(&args, registry.as_ref()))?;
    println!(
        "{} verified: component {}, manifest {}, {}",
        fetched.id,
        fetched.info.digest,
        fetched.info.manifest,
        signer(&fetched)
    );
    Ok(())
}

pub fn run_info(args: InfoArgs) -> anyhow::Result<()> {
    let wanted: PackageRef = args.package.parse()?;
    let registry = args.registry.open()?;
    super::runtime(2)?.block_on(async {
        let registry = registry.as_ref();
        let versions = packages::versions(registry, &wanted.name).await?;
        let id = packages::resolve(registry, &wanted).await?;
        let info = packages::info(registry, &id).await?;
        let mut shown = serde_json::to_value(&info)?;
        shown["versions"] = serde_json::to_value(&versions)?;
        println!("{}", serde_json::to_string_pretty(&shown)?);
        Ok(())
    })
}

pub fn run_search(args: SearchArgs) -> anyhow::Result<()> {
    let registry = args.registry.open()?;
    let kind = args.kind.map(Kind::plugin_kind);
    let found =
        super::runtime(2)?.block_on(packages::search(registry.as_ref(), &args.text, kind))?;
    for info in &found {
        let kinds: Vec<&str> = info.kinds.iter().map(|k| k.interface()).collect();
        println!(
            "{}\t{}\t{}",
            info.package,
            kinds.join(","),
            info.metadata.description.as_deref().unwrap_or("")
        );
    }
    if found.is_empty() {
        eprintln!("no package on {} matches", registry.location());
    }
    Ok(())
}

pub fn run_yank(args: YankArgs) -> anyhow::Result<()> {
    let id: PackageId = args.id.parse()?;
    let registry = args.registry.open()?;
    super::runtime(2)?.block_on(packages::yank(registry.as_ref(), &id))?;
    eprintln!(
        "yanked {id} on {}: ranges no longer pick it; `={}` still fetches it",
        registry.location(),
        id.version
    );
    Ok(())
}

/// How a command that runs a job file finds the plugins it names as `namespace/name@RANGE`.
#[derive(Debug, clap::Args)]
pub struct PackageArgs {
    /// The registry of the job's published plugins that its lock file does not pin yet
    /// (`oci://HOST[:PORT][/PREFIX]` or `oci-layout:DIR`).
    #[arg(long = "registry", env = "OPENTINKER_REGISTRY")]
    registry: Option<String>,
    #[command(flatten)]
    trust: TrustArgs,
    /// Accept published plugins without a trusted signature.
    #[arg(long)]
    allow_unsigned: bool,
}

fn package_cache() -> anyhow::Result<PackageCache> {
    let dir = super::user_folder("XDG_CACHE_HOME", ".cache")
        .context("neither XDG_CACHE_HOME nor HOME is set")?
        .join("packages");
    Ok(PackageCache::new(&dir))
}

impl PackageArgs {
    fn open(&self, fallback: Option<&str>) -> anyhow::Result<Box<dyn Registry>> {
        let text = self
            .registry
            .as_deref()
            .or(fallback)
            .context("no registry to find it in: give --registry or set OPENTINKER_REGISTRY")?;
        let reference: RegistryRef = text.parse()?;
        Ok(reference.open()?)
    }

    /// Replace each plugin of `job` (read from `job_file`) named `namespace/name@RANGE` by its
    /// installed component: the version the job's lock file pins, else the best in range on the
    /// registry, which is then pinned in the lock file (or, with `LeaveToServer` and no
    /// registry given, left for a server to resolve). Each is verified under the trust policy
    /// before it is cached.
    pub fn install_job_packages(
        &self,
        job_file: &Path,
        job: &mut Job,
        unpinned: Unpinned,
    ) -> anyhow::Result<()> {
        let named = job
            .plugin_paths_mut()
            .into_iter()
            .any(|(_, p)| p.to_str().is_some_and(PackageRef::looks_like));
        if !named {
            return Ok(());
        }
        let lock_file = lock_path(job_file);
        let mut lock = LockFile::load(&lock_file)?;
        let cache = package_cache()?;
        let mut policy = self.trust.load()?;
        policy.allow_unsigned |= self.allow_unsigned;
        let runtime = super::runtime(2)?;
        let mut pinned = Vec::new();
        for (section, plugin) in job.plugin_paths_mut() {
            let Some(text) = plugin.to_str().filter(|t| PackageRef::looks_like(t)) else {
                continue;
            };
            let context = || format!("{}: [{section}] plugin {text}", job_file.display());
            let wanted: PackageRef = text.parse().with_context(context)?;
            let installed = match lock.get(&wanted) {
                Some(locked) => match cache.get(&locked.digest) {
                    Some(path) => path,
                    // The server resolves the exact version; the submission checks the digest.
                    None if unpinned == Unpinned::LeaveToServer && self.registry.is_none() => {
                        *plugin = PathBuf::from(format!("{}@={}", wanted.name, locked.version));
                        continue;
                    }
                    None => {
                        let registry = self.open(Some(&locked.registry)).with_context(context)?;
                        let id = locked.id(&wanted);
                        let fetched = runtime
                            .block_on(packages::fetch(registry.as_ref(), &id, &policy))
                            .with_context(context)?;
                        if fetched.info.digest != locked.digest {
                            return Err(MarketError::DigestMismatch {
                                what: format!("{id} (pinned by {})", lock_file.display()),
                                expected: locked.digest.clone(),
                                found: fetched.info.digest,
                            })
                            .with_context(context);
                        }
                        cache.put(&locked.digest, &fetched.component)?
                    }
                },
                None if unpinned == Unpinned::LeaveToServer && self.registry.is_none() => {
                    continue;
                }
                None => {
                    let registry = self.open(None).with_context(context)?;
                    let fetched = runtime
                        .block_on(async {
                            let id = packages::resolve(registry.as_ref(), &wanted).await?;
                            packages::fetch(registry.as_ref(), &id, &policy).await
                        })
                        .with_context(context)?;
                    let path = cache.put(&fetched.info.digest, &fetched.component)?;
                    pinned.push(format!("{} ({})", fetched.id, fetched.info.digest));
                    lock.set(Locked {
                        wanted: wanted.to_string(),
                        version: fetched.id.version.clone(),
                        digest: fetched.info.digest,
                        registry: registry.location(),
                    });
                    path
                }
            };
            *plugin = installed;
        }
        if !pinned.is_empty() {
            lock.save(&lock_file)?;
            eprintln!("pinned {} in {}", pinned.join(", "), lock_file.display());
        }
        Ok(())
    }
}

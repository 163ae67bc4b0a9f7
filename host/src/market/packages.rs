//! What one does with packages, over any [`Registry`]: publish a version (signed or not),
//! list its versions, resolve a range, fetch a version checked end to end (manifest, signature
//! under a trust policy, WIT version, component digest), yank, and search.
//!
//! The chain of trust: the signature signs the manifest's digest and the component's; the
//! manifest names the component's digest; the fetched component is hashed and compared. A change
//! to any byte in the registry after publishing breaks one of the links.

use semver::Version;
use serde::Serialize;

use super::artifact::{
    Artifact, Descriptor, EMPTY_CONFIG, MANIFEST_MEDIA_TYPE, MAX_SMALL_BLOB_BYTES, Manifest,
    PackageInfo, PluginManifest, SIGNATURE_ARTIFACT_TYPE, YANK_ARTIFACT_TYPE,
};
use super::registry::{Registry, signature_tag, yank_tag};
use super::signing::{KeyPair, PublisherKey, Signature};
use super::trust::TrustPolicy;
use super::{Digest, MarketError, PackageId, PackageName, PackageRef};

/// What `publish` did.
#[derive(Debug, Serialize)]
pub struct Published {
    pub package: String,
    pub digest: Digest,
    pub manifest: Digest,
    pub signed_by: Option<PublisherKey>,
    /// The same bytes were published as this version before: nothing was pushed but a
    /// missing signature (a stored one is kept, and named in `signed_by`).
    pub already_published: bool,
}

/// One version as a listing shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Listed {
    pub version: Version,
    pub yanked: bool,
}

/// A version fetched and checked.
pub struct Fetched {
    pub id: PackageId,
    pub info: PackageInfo,
    pub component: Vec<u8>,
    /// The trusted key that signed it, or `None` where the policy allows unsigned plugins.
    pub signed_by: Option<PublisherKey>,
}

/// Publish `artifact` as `id`, signed with `key` when one is given. A version never changes:
/// publishing other bytes under a published version is refused; the same bytes again only add
/// a signature that was missing.
pub async fn publish(
    registry: &dyn Registry,
    id: &PackageId,
    artifact: &Artifact,
    key: Option<&KeyPair>,
) -> Result<Published, MarketError> {
    let name = &id.name;
    let tag = id.version.to_string();
    let mut already_published = false;
    let manifest_bytes = match registry.manifest(name, &tag).await? {
        Some(existing) => {
            let existing_manifest = PluginManifest::parse(id, &existing)?;
            if existing_manifest.component().digest != artifact.component_digest() {
                return Err(MarketError::VersionExists {
                    id: id.to_string(),
                    published: existing_manifest.component().digest.clone(),
                });
            }
            already_published = true;
            existing
        }
        None => {
            registry.push_blob(name, &artifact.component).await?;
            registry.push_blob(name, &artifact.config).await?;
            registry
                .push_manifest(name, &tag, &artifact.manifest)
                .await?;
            artifact.manifest.clone()
        }
    };
    let published = PluginManifest::parse(id, &manifest_bytes)?;
    let stored = match already_published {
        true => signature(registry, id, &published.digest).await?,
        false => None,
    };
    let signed_by = match (stored, key) {
        // A version keeps its first signature: it says who published it.
        (Some(stored), _) => Some(stored.key),
        (None, Some(key)) => {
            let signature = key.sign(&published.statement(id)).to_json();
            let subject = published.descriptor(&manifest_bytes);
            let referrer = Manifest::referrer(SIGNATURE_ARTIFACT_TYPE, subject, &signature);
            registry.push_blob(name, EMPTY_CONFIG).await?;
            registry.push_blob(name, &signature).await?;
            registry
                .push_manifest(name, &signature_tag(&published.digest), &referrer.to_json())
                .await?;
            Some(key.public())
        }
        (None, None) => None,
    };
    Ok(Published {
        package: id.to_string(),
        digest: published.component().digest.clone(),
        manifest: published.digest,
        signed_by,
        already_published,
    })
}

/// The published versions of `name`, lowest first; `NoSuchPackage` when it has none.
pub async fn versions(
    registry: &dyn Registry,
    name: &PackageName,
) -> Result<Vec<Listed>, MarketError> {
    let tags = registry.tags(name).await?;
    let mut versions: Vec<Listed> = tags
        .iter()
        .filter_map(|t| Version::parse(t).ok())
        .map(|version| Listed {
            yanked: tags.contains(&yank_tag(&version)),
            version,
        })
        .collect();
    if versions.is_empty() {
        return Err(MarketError::NoSuchPackage {
            registry: registry.location(),
            name: name.clone(),
        });
    }
    versions.sort_by(|a, b| a.version.cmp(&b.version));
    Ok(versions)
}

/// Whether `range` names one version exactly (`=1.2.0`), which may pick a yanked version.
fn exact_pin(range: &semver::VersionReq) -> bool {
    matches!(range.comparators.as_slice(),
        [c] if c.op == semver::Op::Exact && c.minor.is_some() && c.patch.is_some())
}

/// The version `wanted` picks: the highest in range that is not yanked (an exact pin may pick
/// a yanked one).
pub async fn resolve(
    registry: &dyn Registry,
    wanted: &PackageRef,
) -> Result<PackageId, MarketError> {
    let listed = versions(registry, &wanted.name).await?;
    let live: Vec<&Version> = listed
        .iter()
        .filter(|l| !l.yanked)
        .map(|l| &l.version)
        .collect();
    let id = |version: &Version| PackageId {
        name: wanted.name.clone(),
        version: version.clone(),
    };
    if let Some(best) = wanted.best(live.iter().copied()) {
        return Ok(id(best));
    }
    let yanked = wanted.best(listed.iter().filter(|l| l.yanked).map(|l| &l.version));
    match yanked {
        Some(version) if exact_pin(&wanted.range) => Ok(id(version)),
        Some(version) => Err(MarketError::Yanked { id: id(version) }),
        None => Err(MarketError::NoVersionInRange {
            registry: registry.location(),
            name: wanted.name.clone(),
            range: wanted.range.to_string(),
            available: live.into_iter().cloned().collect(),
        }),
    }
}

/// The manifest of `id`, checked to be a plugin published as `id`.
async fn plugin_manifest(
    registry: &dyn Registry,
    id: &PackageId,
) -> Result<(PluginManifest, Vec<u8>), MarketError> {
    let bytes = registry
        .manifest(&id.name, &id.version.to_string())
        .await?
        .ok_or_else(|| MarketError::NoSuchVersion {
            registry: registry.location(),
            id: id.to_string(),
        })?;
    Ok((PluginManifest::parse(id, &bytes)?, bytes))
}

/// The metadata of `id`, from its manifest alone.
pub async fn info(registry: &dyn Registry, id: &PackageId) -> Result<PackageInfo, MarketError> {
    Ok(plugin_manifest(registry, id).await?.0.info(id))
}

/// The signature stored beside the manifest `digest` of `id`, if any.
async fn signature(
    registry: &dyn Registry,
    id: &PackageId,
    digest: &Digest,
) -> Result<Option<Signature>, MarketError> {
    let Some(bytes) = registry.manifest(&id.name, &signature_tag(digest)).await? else {
        return Ok(None);
    };
    let invalid = |reason: String| MarketError::SignatureInvalid {
        id: id.to_string(),
        reason,
    };
    let referrer = Manifest::parse(&format!("the signature of {id}"), &bytes)?;
    let [layer] = referrer.layers.as_slice() else {
        return Err(invalid("its artifact has not one layer".into()));
    };
    if layer.size > MAX_SMALL_BLOB_BYTES {
        return Err(invalid(format!("its layer is {} bytes", layer.size)));
    }
    let content = registry.blob(&id.name, layer).await?;
    layer
        .digest
        .check(&format!("the signature of {id}"), &content)?;
    Signature::from_json(id, &content).map(Some)
}

/// Fetch `id` and check it end to end under `policy`: it is a plugin artifact published as
/// `id`, signed as the policy requires, of a WIT version this host runs, and its component has
/// the digest its manifest and signature name. Nothing is returned otherwise.
pub async fn fetch(
    registry: &dyn Registry,
    id: &PackageId,
    policy: &TrustPolicy,
) -> Result<Fetched, MarketError> {
    let (manifest, _) = plugin_manifest(registry, id).await?;
    let info = manifest.info(id);
    let signed = signature(registry, id, &manifest.digest).await?;
    let signed_by = policy.check(id, signed.as_ref(), &manifest.statement(id))?;
    if let Some(found) = &info.wit_version
        && !crate::plugin::supports_wit_version(found)
    {
        return Err(MarketError::UnsupportedWit {
            id: id.to_string(),
            found: found.clone(),
            supported: crate::plugin::supported_wit_range(),
        });
    }
    let layer = manifest.component();
    let component = registry.blob(&id.name, layer).await?;
    layer
        .digest
        .check(&format!("the component of {id}"), &component)?;
    Ok(Fetched {
        id: id.clone(),
        info,
        component,
        signed_by,
    })
}

/// Mark `id` yanked: ranges no longer pick it; an exact pin still fetches it.
pub async fn yank(registry: &dyn Registry, id: &PackageId) -> Result<(), MarketError> {
    let (_, bytes) = plugin_manifest(registry, id).await?;
    let subject = Descriptor::of(MANIFEST_MEDIA_TYPE, &bytes);
    let note =
        serde_json::to_vec(&serde_json::json!({ "yanked": id.to_string() })).unwrap_or_default();
    let marker = Manifest::referrer(YANK_ARTIFACT_TYPE, subject, &note);
    registry.push_blob(&id.name, EMPTY_CONFIG).await?;
    registry.push_blob(&id.name, &note).await?;
    registry
        .push_manifest(&id.name, &yank_tag(&id.version), &marker.to_json())
        .await
}

/// The latest version of every package whose name or description contains `text` (any case),
/// and, when `kind` is given, that is a plugin of that kind.
pub async fn search(
    registry: &dyn Registry,
    text: &str,
    kind: Option<crate::plugin::PluginKind>,
) -> Result<Vec<PackageInfo>, MarketError> {
    let text = text.to_lowercase();
    let mut found = Vec::new();
    for name in registry.catalog().await? {
        let Ok(id) = resolve(
            registry,
            &PackageRef {
                name: name.clone(),
                range: semver::VersionReq::STAR,
            },
        )
        .await
        else {
            continue;
        };
        let info = info(registry, &id).await?;
        let described = info
            .metadata
            .description
            .as_deref()
            .unwrap_or("")
            .to_lowercase();
        let matches = name.to_string().contains(&text) || described.contains(&text);
        if matches && kind.is_none_or(|k| info.kinds.contains(&k)) {
            found.push(info);
        }
    }
    Ok(found)
}

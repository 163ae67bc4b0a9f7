//! The server's own plugin registry: the OCI distribution API (`/v2/...`, the part that pushes
//! and pulls artifacts by tag and digest), so that `opentinker plugin publish|install|search
//! --registry oci://SERVER` and third-party OCI clients (skopeo, oras) speak to it as to any
//! registry. What it adds to a plain registry is the tenants':
//!
//! - every request is a tenant's (its API key as the password of HTTP basic auth, or as a
//!   bearer token); every tenant may pull every package;
//! - a namespace belongs to one tenant ([`owners`]), who alone publishes into it;
//! - a version never changes (a tag of a version, or of a signature, is never moved) and
//!   holds a plugin: the manifest is a plugin artifact published as that version, and its
//!   component passes the checks of any uploaded plugin (a component of a supported WIT
//!   version, only the imports the host provides, its structure within the limits);
//! - what a tenant pushes counts against its plugin quota, beside its uploads.
//!
//! It stores into an OCI image layout folder, `DATA/registry` (content-addressed blobs, an
//! index of tags), which `skopeo copy oci:DATA/registry:NS/NAME:VERSION` reads too.

mod errors;
mod hosted;
mod owners;
mod trust;
mod uploads;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;

use super::AppState;
use crate::api::TenantId;
use crate::market::{Digest, PackageId, PackageName, Registry};
use crate::market::{MANIFEST_MEDIA_TYPE, Manifest, PluginManifest};
pub use errors::{OciCode, OciError};
pub use hosted::HostedRegistry;
pub use trust::JobPackages;
use uploads::Upload;

type Shared = Arc<AppState>;
type Answer = Result<Response, OciError>;

/// The largest manifest accepted (the distribution spec's recommended limit).
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The tenants' trust routes, nested under `/api/v1`.
pub fn api_router() -> Router<Shared> {
    trust::router()
}

/// The routes, at the root (`/v2/` is the spec's).
pub fn router() -> Router<Shared> {
    Router::new()
        .route("/v2/", get(api_version))
        .route("/v2", get(api_version))
        .route(
            "/v2/{*path}",
            get(read).post(post).patch(patch).put(put).delete(delete),
        )
}

/// The tenant of a registry request: its key from HTTP basic auth (the password; the user
/// name is not checked), a bearer token, or `X-API-Key`. Without one the answer is a 401 that
/// challenges for basic auth, which registry clients answer with their credentials.
pub struct RegistryCaller(pub TenantId);

fn key_of(headers: &HeaderMap) -> Option<String> {
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(key.to_string());
    }
    let authorization = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(token) = authorization.strip_prefix("Bearer ") {
        return Some(token.trim().to_string());
    }
    let encoded = authorization.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(text.split_once(':')?.1.to_string())
}

impl FromRequestParts<Shared> for RegistryCaller {
    type Rejection = OciError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, OciError> {
        let key = key_of(&parts.headers).ok_or_else(|| {
            OciError::new(
                OciCode::Unauthorized,
                "no credentials: give a tenant's API key as the password (for opentinker, \
                 OPENTINKER_REGISTRY_USERNAME=TENANT and OPENTINKER_REGISTRY_PASSWORD=KEY)",
            )
        })?;
        Ok(RegistryCaller(state.authenticate(&key).await?))
    }
}

/// `GET /v2/`: the API is here, for this tenant.
async fn api_version(_caller: RegistryCaller) -> Response {
    (StatusCode::OK, axum::Json(serde_json::json!({}))).into_response()
}

/// What a path under `/v2/` names.
enum Target {
    Catalog,
    Tags(PackageName),
    Manifest(PackageName, String),
    Uploads(PackageName),
    Upload(PackageName, String),
    /// A blob; blobs are stored once for all packages, so the repository only has to be a
    /// package name.
    Blob(Digest),
}

fn package(text: &str) -> Result<PackageName, OciError> {
    text.parse::<PackageName>().map_err(|e| {
        OciError::new(
            OciCode::NameInvalid,
            format!("{e} (the packages of this registry are NAMESPACE/NAME)"),
        )
    })
}

fn digest(text: &str) -> Result<Digest, OciError> {
    text.parse::<Digest>()
        .map_err(|e| OciError::new(OciCode::DigestInvalid, e.to_string()))
}

impl Target {
    fn parse(path: &str) -> Result<Target, OciError> {
        if path == "_catalog" {
            return Ok(Target::Catalog);
        }
        if let Some(name) = path.strip_suffix("/tags/list") {
            return Ok(Target::Tags(package(name)?));
        }
        if let Some((name, reference)) = path.rsplit_once("/manifests/") {
            return Ok(Target::Manifest(package(name)?, reference.to_string()));
        }
        if let Some(name) = path
            .strip_suffix("/blobs/uploads/")
            .or_else(|| path.strip_suffix("/blobs/uploads"))
        {
            return Ok(Target::Uploads(package(name)?));
        }
        if let Some((name, id)) = path.rsplit_once("/blobs/uploads/") {
            return Ok(Target::Upload(package(name)?, id.to_string()));
        }
        if let Some((name, blob)) = path.rsplit_once("/blobs/") {
            package(name)?;
            return Ok(Target::Blob(digest(blob)?));
        }
        Err(OciError::new(
            OciCode::Unsupported,
            format!("/v2/{path} is not a route of the OCI distribution API this registry serves"),
        ))
    }
}

/// Run blocking work (the database, files) off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| OciError::new(OciCode::Unknown, format!("a registry task failed: {e}")))?
}

fn database(e: rusqlite::Error) -> OciError {
    OciError::new(OciCode::Unknown, format!("the registry's database: {e}"))
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> OciError {
    move |e| OciError::new(OciCode::Unknown, format!("{what}: {e}"))
}

fn with_headers(
    status: StatusCode,
    headers: &[(header::HeaderName, String)],
    body: Vec<u8>,
) -> Response {
    let mut response = (status, body).into_response();
    for (name, value) in headers {
        if let Ok(value) = HeaderValue::from_str(value) {
            response.headers_mut().insert(name.clone(), value);
        }
    }
    response
}

const DIGEST_HEADER: &str = "docker-content-digest";

fn digest_header() -> header::HeaderName {
    header::HeaderName::from_static(DIGEST_HEADER)
}

/// `GET`/`HEAD`: the catalog, a package's tags, a manifest, a blob, an upload's progress.
async fn read(
    State(state): State<Shared>,
    RegistryCaller(tenant): RegistryCaller,
    Path(path): Path<String>,
) -> Answer {
    let registry = &state.registry;
    match Target::parse(&path)? {
        Target::Catalog => {
            let repositories: Vec<String> = registry
                .store
                .catalog()
                .await?
                .iter()
                .map(ToString::to_string)
                .collect();
            Ok(axum::Json(serde_json::json!({ "repositories": repositories })).into_response())
        }
        Target::Tags(name) => {
            let tags = registry.store.tags(&name).await?;
            if tags.is_empty() {
                return Err(OciError::new(
                    OciCode::NameUnknown,
                    format!("no package {name} is published here"),
                ));
            }
            Ok(
                axum::Json(serde_json::json!({ "name": name.to_string(), "tags": tags }))
                    .into_response(),
            )
        }
        Target::Manifest(name, reference) => {
            let Some((digest, bytes)) = registry.store.find_manifest(&name, &reference).await?
            else {
                return Err(OciError::new(
                    OciCode::ManifestUnknown,
                    format!("{name} has no manifest {reference}"),
                ));
            };
            let media_type = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|m| m["mediaType"].as_str().map(String::from))
                .unwrap_or_else(|| MANIFEST_MEDIA_TYPE.to_string());
            Ok(with_headers(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE, media_type),
                    (digest_header(), digest.to_string()),
                ],
                bytes,
            ))
        }
        Target::Blob(digest) => {
            let Some((file, _)) = registry.store.blob_file(&digest).await? else {
                return Err(OciError::new(
                    OciCode::BlobUnknown,
                    format!("no blob {digest} is stored here"),
                ));
            };
            let bytes = tokio::fs::read(&file).await.map_err(io("reading a blob"))?;
            Ok(with_headers(
                StatusCode::OK,
                &[
                    (header::CONTENT_TYPE, "application/octet-stream".into()),
                    (digest_header(), digest.to_string()),
                ],
                bytes,
            ))
        }
        Target::Upload(name, id) => {
            let upload = registry.uploads.take(&id, &tenant, &name)?;
            let answer = upload_progress(StatusCode::NO_CONTENT, &name, &id, upload.size);
            registry.uploads.put_back(id, upload);
            Ok(answer)
        }
        Target::Uploads(name) => Err(OciError::new(
            OciCode::Unsupported,
            format!("begin an upload into {name} with POST"),
        )),
    }
}

/// An answer about an upload that goes on: where to send the rest, what has arrived.
fn upload_progress(status: StatusCode, name: &PackageName, id: &str, size: u64) -> Response {
    with_headers(
        status,
        &[
            (header::LOCATION, format!("/v2/{name}/blobs/uploads/{id}")),
            (header::RANGE, format!("0-{}", size.saturating_sub(1))),
            (
                header::HeaderName::from_static("docker-upload-uuid"),
                id.to_string(),
            ),
        ],
        Vec::new(),
    )
}

/// A blob (or manifest) stored: where it is.
fn created(location: String, digest: &Digest) -> Response {
    with_headers(
        StatusCode::CREATED,
        &[
            (header::LOCATION, location),
            (digest_header(), digest.to_string()),
        ],
        Vec::new(),
    )
}

/// Refuse `tenant` a push into `name` whose namespace is another tenant's (named as one, or
/// claimed by one); claim it when `claim` (a version is being published).
async fn may_publish(
    state: &Shared,
    tenant: &TenantId,
    name: &PackageName,
    claim: bool,
) -> Result<(), OciError> {
    let state = Arc::clone(state);
    let (tenant, namespace) = (tenant.clone(), name.namespace().to_string());
    blocking(move || {
        let taken = || {
            OciError::new(
                OciCode::Denied,
                format!(
                    "the namespace `{namespace}` belongs to another tenant: publish under a \
                     namespace of your own (your tenant's name, `{tenant}`, is always yours)"
                ),
            )
        };
        if namespace != tenant.as_str()
            && state
                .tenants
                .exists(&namespace)
                .map_err(|e| OciError::new(OciCode::Unknown, e.to_string()))?
        {
            return Err(taken());
        }
        let registry = &state.registry;
        let yours = match claim {
            true => registry
                .owners
                .claim(&namespace, &tenant)
                .map_err(database)?,
            false => registry
                .owners
                .owner(&namespace)
                .map_err(database)?
                .is_none_or(|owner| owner == tenant.as_str()),
        };
        if yours { Ok(()) } else { Err(taken()) }
    })
    .await
}

/// Refuse `more` bytes from `tenant` that would pass its plugin quota (uploads, what it has
/// published, and its open uploads together).
async fn within_quota(state: &Shared, tenant: &TenantId, more: u64) -> Result<(), OciError> {
    let uploaded = state.plugins.stored_bytes(tenant).await?;
    let published = {
        let (state, tenant) = (Arc::clone(state), tenant.clone());
        blocking(move || state.registry.owners.bytes_of(&tenant).map_err(database)).await?
    };
    let pending = state.registry.uploads.pending_bytes(tenant);
    let used = uploaded + published + pending;
    let limit = state.plugins.max_bytes_per_tenant();
    if used + more > limit {
        return Err(OciError::new(
            OciCode::Denied,
            format!(
                "the tenant stores {used} bytes of plugins, and {more} more would pass its quota \
                 of {limit} bytes"
            ),
        ));
    }
    Ok(())
}

/// `POST .../blobs/uploads/`: begin an upload (`?digest=` with the bytes: the whole blob at
/// once; `?mount=DIGEST`: a blob stored already).
async fn post(
    State(state): State<Shared>,
    RegistryCaller(tenant): RegistryCaller,
    Path(path): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    let Target::Uploads(name) = Target::parse(&path)? else {
        return Err(OciError::new(
            OciCode::Unsupported,
            format!("POST /v2/{path}: only uploads begin with POST"),
        ));
    };
    may_publish(&state, &tenant, &name, false).await?;
    if let Some(mount) = query.get("mount") {
        let mounted = digest(mount)?;
        if let Some((_, size)) = state.registry.store.blob_file(&mounted).await? {
            record_blob(&state, &tenant, &mounted, size).await?;
            return Ok(created(format!("/v2/{name}/blobs/{mounted}"), &mounted));
        }
    }
    within_quota(&state, &tenant, body.len() as u64).await?;
    let id = {
        let (state, tenant, name) = (Arc::clone(&state), tenant.clone(), name.clone());
        blocking(move || state.registry.uploads.begin(&tenant, &name)).await?
    };
    let upload = state.registry.uploads.take(&id, &tenant, &name)?;
    match query.get("digest") {
        Some(expected) => finish(&state, &name, upload, body, expected).await,
        None => {
            let upload = append(upload, body).await?;
            let answer = upload_progress(StatusCode::ACCEPTED, &name, &id, upload.size);
            state.registry.uploads.put_back(id, upload);
            Ok(answer)
        }
    }
}

/// Append `body` to `upload`; a failed upload is removed.
async fn append(upload: Upload, body: Bytes) -> Result<Upload, OciError> {
    if body.is_empty() {
        return Ok(upload);
    }
    blocking(move || {
        let mut upload = upload;
        match upload.append(&body) {
            Ok(()) => Ok(upload),
            Err(e) => {
                let _ = std::fs::remove_file(&upload.file);
                Err(io("writing an upload")(e))
            }
        }
    })
    .await
}

/// Close `upload` with its last bytes `body`: store it as a blob if its bytes have the
/// digest `expected`; an upload that does not is removed.
async fn finish(
    state: &Shared,
    name: &PackageName,
    upload: Upload,
    body: Bytes,
    expected: &str,
) -> Answer {
    let expected = match digest(expected) {
        Ok(expected) => expected,
        Err(e) => {
            let _ = tokio::fs::remove_file(&upload.file).await;
            return Err(e);
        }
    };
    let upload = append(upload, body).await?;
    let (tenant, size, file) = (upload.tenant.clone(), upload.size, upload.file.clone());
    let found = blocking(move || upload.digest().map_err(io("reading an upload"))).await?;
    if found != expected {
        let _ = tokio::fs::remove_file(&file).await;
        return Err(OciError::new(
            OciCode::DigestInvalid,
            format!("the upload's bytes have the digest {found}, not {expected}"),
        ));
    }
    state.registry.store.adopt_blob(file, &expected).await?;
    record_blob(state, &tenant, &expected, size).await?;
    Ok(created(format!("/v2/{name}/blobs/{expected}"), &expected))
}

async fn record_blob(
    state: &Shared,
    tenant: &TenantId,
    digest: &Digest,
    size: u64,
) -> Result<(), OciError> {
    let (state, tenant, digest) = (Arc::clone(state), tenant.clone(), digest.to_string());
    blocking(move || {
        state
            .registry
            .owners
            .record_blob(&tenant, &digest, size)
            .map_err(database)
    })
    .await
}

/// `PATCH .../blobs/uploads/ID`: a chunk of an upload (at the offset its `Content-Range`
/// says, when it says one).
async fn patch(
    State(state): State<Shared>,
    RegistryCaller(tenant): RegistryCaller,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let Target::Upload(name, id) = Target::parse(&path)? else {
        return Err(OciError::new(
            OciCode::Unsupported,
            format!("PATCH /v2/{path}: only uploads take chunks"),
        ));
    };
    let upload = state.registry.uploads.take(&id, &tenant, &name)?;
    let start = headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|range| range.split_once('-'))
        .and_then(|(start, _)| start.trim().parse::<u64>().ok());
    if start.is_some_and(|start| start != upload.size) {
        let size = upload.size;
        state.registry.uploads.put_back(id.clone(), upload);
        let mut answer = upload_progress(StatusCode::RANGE_NOT_SATISFIABLE, &name, &id, size);
        *answer.body_mut() = axum::body::Body::from(format!(
            "the chunk starts at {}, but {size} bytes have arrived",
            start.unwrap_or(0)
        ));
        return Ok(answer);
    }
    if let Err(refused) = within_quota(&state, &tenant, body.len() as u64 + upload.size).await {
        let _ = tokio::fs::remove_file(&upload.file).await;
        return Err(refused);
    }
    let upload = append(upload, body).await?;
    let answer = upload_progress(StatusCode::ACCEPTED, &name, &id, upload.size);
    state.registry.uploads.put_back(id, upload);
    Ok(answer)
}

/// `PUT .../blobs/uploads/ID?digest=`: the end of an upload; `PUT .../manifests/TAG`: publish.
async fn put(
    State(state): State<Shared>,
    RegistryCaller(tenant): RegistryCaller,
    Path(path): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Answer {
    match Target::parse(&path)? {
        Target::Upload(name, id) => {
            let upload = state.registry.uploads.take(&id, &tenant, &name)?;
            let Some(expected) = query.get("digest") else {
                state.registry.uploads.put_back(id, upload);
                return Err(OciError::new(
                    OciCode::DigestInvalid,
                    "the PUT that closes an upload names its digest (`?digest=sha256:...`)",
                ));
            };
            if let Err(refused) =
                within_quota(&state, &tenant, body.len() as u64 + upload.size).await
            {
                let _ = tokio::fs::remove_file(&upload.file).await;
                return Err(refused);
            }
            finish(&state, &name, upload, body, expected).await
        }
        Target::Manifest(name, tag) => push_manifest(&state, &tenant, &name, &tag, body).await,
        _ => Err(OciError::new(
            OciCode::Unsupported,
            format!("PUT /v2/{path}: only uploads and manifests are put"),
        )),
    }
}

/// `DELETE`: nothing published is deleted.
async fn delete(_caller: RegistryCaller, method: Method) -> Answer {
    Err(OciError::new(
        OciCode::Unsupported,
        format!(
            "{method}: a published version never changes or goes; yank it \
             (`opentinker plugin yank`) to hide it from ranges"
        ),
    ))
}

/// What a tag of this registry is.
enum Tag {
    Version(semver::Version),
    /// `sha256-HEX.sig`: the signature of the manifest `sha256:HEX`.
    Signature(Digest),
    /// `yanked-VERSION`.
    Yank(semver::Version),
}

impl Tag {
    fn parse(tag: &str) -> Result<Tag, OciError> {
        if let Ok(version) = semver::Version::parse(tag) {
            return Ok(Tag::Version(version));
        }
        if let Some(hex) = tag
            .strip_prefix("sha256-")
            .and_then(|t| t.strip_suffix(".sig"))
        {
            return Ok(Tag::Signature(digest(&format!("sha256:{hex}"))?));
        }
        if let Some(version) = tag
            .strip_prefix("yanked-")
            .and_then(|v| semver::Version::parse(v).ok())
        {
            return Ok(Tag::Yank(version));
        }
        Err(OciError::new(
            OciCode::Denied,
            format!(
                "`{tag}` is not a tag of this registry: it holds plugins, tagged by version \
                 (semver), signature (`sha256-HEX.sig`) and yank mark (`yanked-VERSION`)"
            ),
        ))
    }
}

/// Publish `body` as the manifest `tag` of `name`, after the checks of the module's doc.
async fn push_manifest(
    state: &Shared,
    tenant: &TenantId,
    name: &PackageName,
    tag: &str,
    body: Bytes,
) -> Answer {
    if body.len() > MAX_MANIFEST_BYTES {
        return Err(OciError::new(
            OciCode::SizeInvalid,
            format!(
                "a manifest of {} bytes is above the limit of {MAX_MANIFEST_BYTES}",
                body.len()
            ),
        ));
    }
    let kind = Tag::parse(tag)?;
    may_publish(state, tenant, name, true).await?;
    let registry = &state.registry;
    let invalid =
        |e: crate::market::MarketError| OciError::new(OciCode::ManifestInvalid, e.to_string());
    let manifest =
        Manifest::parse(&format!("the manifest {name}:{tag}"), &body).map_err(invalid)?;
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        match registry.store.blob_file(&blob.digest).await? {
            Some((_, size)) if size as i64 == blob.size => {}
            _ => {
                return Err(OciError::new(
                    OciCode::ManifestBlobUnknown,
                    format!(
                        "the manifest names the blob {} of {} bytes, which is not stored here: push it first",
                        blob.digest, blob.size
                    ),
                ));
            }
        }
    }
    let digest = Digest::of(&body);
    let _one_at_a_time = registry.publishing.lock().await;
    let existing = registry.store.find_manifest(name, tag).await?;
    if let Some((published, _)) = &existing
        && published == &digest
    {
        return Ok(created(format!("/v2/{name}/manifests/{digest}"), &digest));
    }
    match kind {
        Tag::Version(version) => {
            if let Some((published, _)) = existing {
                return Err(OciError::new(
                    OciCode::Denied,
                    format!(
                        "{name}@{version} is already published with other bytes (manifest {published}); a version never changes: publish a new version"
                    ),
                ));
            }
            let id = PackageId {
                name: name.clone(),
                version,
            };
            let plugin = PluginManifest::parse(&id, &body).map_err(invalid)?;
            let component = registry.store.blob(name, plugin.component()).await?;
            state.plugins.check(component).await.map_err(|e| {
                OciError::new(OciCode::ManifestInvalid, format!("{id}: {}", e.message))
            })?;
        }
        Tag::Signature(subject) => {
            if existing.is_some() {
                return Err(OciError::new(
                    OciCode::Denied,
                    format!(
                        "{name}'s manifest {subject} is signed already; a version keeps its first signature"
                    ),
                ));
            }
            about_a_version(registry, name, &manifest, &subject).await?;
        }
        Tag::Yank(version) => {
            let Some((subject, _)) = registry
                .store
                .find_manifest(name, &version.to_string())
                .await?
            else {
                return Err(OciError::new(
                    OciCode::ManifestInvalid,
                    format!("{name} has no version {version} to yank"),
                ));
            };
            about_a_version(registry, name, &manifest, &subject).await?;
        }
    }
    registry.store.push_manifest(name, tag, &body).await?;
    Ok(created(format!("/v2/{name}/manifests/{digest}"), &digest))
}

/// Refuse a signature or yank mark whose subject is not the version manifest `subject` of
/// `name`.
async fn about_a_version(
    registry: &HostedRegistry,
    name: &PackageName,
    manifest: &Manifest,
    subject: &Digest,
) -> Result<(), OciError> {
    let names_it = manifest
        .subject
        .as_ref()
        .is_some_and(|s| &s.digest == subject);
    let published = registry
        .store
        .find_manifest(name, subject.as_str())
        .await?
        .is_some();
    if names_it && published {
        Ok(())
    } else {
        Err(OciError::new(
            OciCode::ManifestInvalid,
            format!(
                "a signature or yank mark of {name} has as its subject a manifest of one of its versions ({subject})"
            ),
        ))
    }
}

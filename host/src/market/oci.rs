//! An OCI distribution registry (Docker's, the CNCF distribution, GHCR, Zot, ...) through the
//! `oci-client` crate. A package `NAMESPACE/NAME` is the repository `PREFIX/NAMESPACE/NAME`.
//! Credentials, when the registry wants them, come from `OPENTINKER_REGISTRY_USERNAME` and
//! `OPENTINKER_REGISTRY_PASSWORD` (HTTP basic; the client trades them for a token as registries
//! ask).

use async_trait::async_trait;
use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::artifact::{Descriptor, MANIFEST_MEDIA_TYPE};
use super::registry::Registry;
use super::{MarketError, PackageName};

pub struct OciRegistry {
    client: Client,
    host: String,
    prefix: String,
    auth: RegistryAuth,
}

/// Whether `host` (with its port) is this machine, spoken to over plain HTTP.
fn is_loopback(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    matches!(name, "localhost" | "127.0.0.1" | "[::1]")
}

impl OciRegistry {
    pub fn new(host: &str, prefix: &str) -> Result<Self, MarketError> {
        // rustls without a provider of its own: ring, installed once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if is_loopback(host) {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            ..ClientConfig::default()
        });
        let auth = match (
            std::env::var("OPENTINKER_REGISTRY_USERNAME"),
            std::env::var("OPENTINKER_REGISTRY_PASSWORD"),
        ) {
            (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
            _ => RegistryAuth::Anonymous,
        };
        Ok(OciRegistry {
            client,
            host: host.to_string(),
            prefix: prefix.to_string(),
            auth,
        })
    }

    fn repository(&self, name: &PackageName) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        }
    }

    fn reference(&self, name: &PackageName, tag: &str) -> Reference {
        Reference::with_tag(self.host.clone(), self.repository(name), tag.to_string())
    }

    fn error(&self, e: OciDistributionError) -> MarketError {
        MarketError::Registry {
            registry: self.location(),
            message: e.to_string(),
        }
    }

    /// A failed blob download; the client's own digest check is told as a `DigestMismatch`.
    fn stream_error(&self, descriptor: &Descriptor, e: std::io::Error) -> MarketError {
        let found = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<DigestError>())
            .and_then(|digest| match digest {
                DigestError::VerificationError { actual, .. } => actual.parse().ok(),
                _ => None,
            });
        match found {
            Some(found) => MarketError::DigestMismatch {
                what: format!("the blob {} on {}", descriptor.digest, self.location()),
                expected: descriptor.digest.clone(),
                found,
            },
            None => self.error(e.into()),
        }
    }

    async fn authenticate(&self, reference: &Reference, operation: RegistryOperation) {
        if !matches!(self.auth, RegistryAuth::Anonymous) {
            // A registry that wants no token answers without one; errors show on the request.
            let _ = self.client.auth(reference, &self.auth, operation).await;
        }
    }
}

/// Whether the registry said that what was asked for does not exist.
fn is_unknown(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::ServerError { code: 404, .. } => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown
            )
        }),
        _ => false,
    }
}

#[async_trait]
impl Registry for OciRegistry {
    fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("oci://{}", self.host)
        } else {
            format!("oci://{}/{}", self.host, self.prefix)
        }
    }

    async fn tags(&self, name: &PackageName) -> Result<Vec<String>, MarketError> {
        let reference = self.reference(name, "latest");
        self.authenticate(&reference, RegistryOperation::Pull).await;
        match self
            .client
            .list_tags(&reference, &self.auth, None, None)
            .await
        {
            Ok(response) => Ok(response.tags),
            Err(e) if is_unknown(&e) => Ok(Vec::new()),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn manifest(
        &self,
        name: &PackageName,
        tag: &str,
    ) -> Result<Option<Vec<u8>>, MarketError> {
        let reference = self.reference(name, tag);
        self.authenticate(&reference, RegistryOperation::Pull).await;
        match self
            .client
            .pull_manifest_raw(&reference, &self.auth, &[MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok((bytes, _)) => Ok(Some(bytes.to_vec())),
            Err(e) if is_unknown(&e) => Ok(None),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn blob(
        &self,
        name: &PackageName,
        descriptor: &Descriptor,
    ) -> Result<Vec<u8>, MarketError> {
        let reference = self.reference(name, "latest");
        let mut stream = self
            .client
            .pull_blob_stream(&reference, descriptor.digest.as_str())
            .await
            .map_err(|e| self.error(e))?
            .stream;
        let limit = usize::try_from(descriptor.size).unwrap_or(0);
        let mut bytes = Vec::with_capacity(limit.min(1 << 20));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.stream_error(descriptor, e))?;
            if bytes.len() + chunk.len() > limit {
                return Err(MarketError::Invalid {
                    what: format!("the blob {} of {}", descriptor.digest, self.location()),
                    message: format!("longer than the {limit} bytes its descriptor says"),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    async fn push_blob(&self, name: &PackageName, bytes: &[u8]) -> Result<(), MarketError> {
        let reference = self.reference(name, "latest");
        self.authenticate(&reference, RegistryOperation::Push).await;
        let digest = super::Digest::of(bytes);
        if self
            .client
            .blob_exists(&reference, digest.as_str())
            .await
            .unwrap_or(false)
        {
            return Ok(());
        }
        self.client
            .push_blob(&reference, bytes.to_vec(), digest.as_str())
            .await
            .map(|_| ())
            .map_err(|e| self.error(e))
    }

    async fn push_manifest(
        &self,
        name: &PackageName,
        tag: &str,
        manifest: &[u8],
    ) -> Result<(), MarketError> {
        let reference = self.reference(name, tag);
        self.authenticate(&reference, RegistryOperation::Push).await;
        self.client
            .push_manifest_raw(
                &reference,
                manifest.to_vec(),
                http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
            )
            .await
            .map(|_| ())
            .map_err(|e| self.error(e))
    }

    async fn catalog(&self) -> Result<Vec<PackageName>, MarketError> {
        let reference = self.reference(&"a/b".parse()?, "latest");
        self.authenticate(&reference, RegistryOperation::Pull).await;
        let response = self
            .client
            .catalog(&reference, &self.auth, None, None)
            .await
            .map_err(|e| self.error(e))?;
        let prefix = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        Ok(response
            .repositories
            .iter()
            .filter_map(|r| r.strip_prefix(&prefix)?.parse().ok())
            .collect())
    }
}

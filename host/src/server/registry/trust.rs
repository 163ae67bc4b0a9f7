//! Each tenant's trust policy on the server (the TOML of `market::trust`), which decides the
//! packages of the server's registry that its jobs may run: `GET /api/v1/trust` reads it,
//! `PUT /api/v1/trust` replaces it (checked first). Without one a tenant trusts no key and
//! allows no unsigned plugin; whatever it says, a job may run the packages of its own tenant's
//! namespaces unsigned (a signature they carry must still verify). Stored as
//! `DATA/trust/TENANT.toml`.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::HostedRegistry;
use crate::api::{ApiError, TenantId};
use crate::jobs::PackageSource;
use crate::market::TrustPolicy;
use crate::market::packages::{self, Fetched};
use crate::market::{MarketError, PackageRef};
use crate::server::handling::Caller;
use crate::server::{AppState, HttpError};

type Shared = Arc<AppState>;

/// The largest policy accepted.
const MAX_POLICY_BYTES: usize = 1 << 20;

/// How errors name a tenant's policy (not by where the server keeps it).
const ORIGIN: &str = "of the tenant on the server (GET/PUT /api/v1/trust)";

impl HostedRegistry {
    fn trust_file(&self, tenant: &TenantId) -> std::path::PathBuf {
        self.trust_dir.join(format!("{tenant}.toml"))
    }

    /// `tenant`'s policy (blocking: reads a file).
    fn trust(&self, tenant: &TenantId) -> Result<TrustPolicy, MarketError> {
        let path = self.trust_file(tenant);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(MarketError::io(&path)(e)),
        };
        TrustPolicy::parse(&text, ORIGIN)
    }

    /// Whether `namespace` is `tenant`'s (blocking: reads the database).
    fn owns(&self, tenant: &TenantId, namespace: &str) -> Result<bool, MarketError> {
        let owner = self
            .owners
            .owner(namespace)
            .map_err(|e| MarketError::Registry {
                registry: self.location.clone(),
                message: e.to_string(),
            })?;
        Ok(namespace == tenant.as_str() || owner.as_deref() == Some(tenant.as_str()))
    }
}

/// The server's registry as the source of its jobs' packages.
pub struct JobPackages(pub Arc<HostedRegistry>);

#[async_trait]
impl PackageSource for JobPackages {
    fn location(&self) -> String {
        self.0.location.clone()
    }

    async fn fetch(&self, tenant: &TenantId, wanted: &PackageRef) -> Result<Fetched, MarketError> {
        let registry = &self.0;
        let id = packages::resolve(&registry.store, wanted).await?;
        let (reader, tenant) = (Arc::clone(registry), tenant.clone());
        let namespace = id.name.namespace().to_string();
        let policy = tokio::task::spawn_blocking(move || {
            let mut policy = reader.trust(&tenant)?;
            policy.allow_unsigned |= reader.owns(&tenant, &namespace)?;
            Ok::<_, MarketError>(policy)
        })
        .await
        .map_err(|e| MarketError::Registry {
            registry: registry.location.clone(),
            message: e.to_string(),
        })??;
        packages::fetch(&registry.store, &id, &policy).await
    }
}

/// The routes, nested under `/api/v1`.
pub fn router() -> Router<Shared> {
    Router::new().route("/trust", get(read).put(replace))
}

async fn read(State(state): State<Shared>, Caller(tenant): Caller) -> Result<Response, HttpError> {
    let registry = Arc::clone(&state.registry);
    let text = tokio::task::spawn_blocking(move || registry.trust(&tenant)?.to_toml())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/toml")], text).into_response())
}

async fn replace(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    body: Bytes,
) -> Result<Response, HttpError> {
    if body.len() > MAX_POLICY_BYTES {
        return Err(ApiError::invalid(format!(
            "a trust policy of {} bytes is above the limit of {MAX_POLICY_BYTES}",
            body.len()
        ))
        .into());
    }
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::invalid("the trust policy is not UTF-8 text"))?;
    let policy = TrustPolicy::parse(text, ORIGIN).map_err(|e| ApiError::invalid(e.to_string()))?;
    let registry = Arc::clone(&state.registry);
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&registry.trust_dir)
            .map_err(|e| ApiError::internal(format!("the trust folder: {e}")))?;
        policy
            .save(&registry.trust_file(&tenant))
            .map_err(|e| ApiError::internal(e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(axum::Json(serde_json::json!({ "saved": true })).into_response())
}

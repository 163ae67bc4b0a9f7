//! Where a registry is, as the command line and job files name it (`oci://HOST[:PORT][/PREFIX]`
//! or `oci-layout:DIR`), and connecting to it: the one place that knows every implementation of
//! [`Registry`].

use std::path::PathBuf;

use super::MarketError;
use super::layout::LayoutRegistry;
use super::oci::OciRegistry;
use super::registry::Registry;

/// A registry as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryRef {
    /// `oci://HOST[:PORT][/PREFIX]`: an OCI distribution registry; packages are the
    /// repositories `PREFIX/NAMESPACE/NAME`. Loopback hosts are spoken to over plain HTTP,
    /// others over HTTPS.
    Oci { host: String, prefix: String },
    /// `oci-layout:DIR`: an OCI image layout folder, for offline use.
    Layout(PathBuf),
}

impl std::str::FromStr for RegistryRef {
    type Err = MarketError;

    fn from_str(text: &str) -> Result<Self, MarketError> {
        if let Some(dir) = text.strip_prefix("oci-layout:") {
            return Ok(RegistryRef::Layout(PathBuf::from(dir)));
        }
        if let Some(rest) = text.strip_prefix("oci://") {
            let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if host.is_empty() {
                return Err(MarketError::BadName {
                    text: text.into(),
                    reason: "no registry host after `oci://`".into(),
                });
            }
            return Ok(RegistryRef::Oci {
                host: host.to_string(),
                prefix: prefix.trim_end_matches('/').to_string(),
            });
        }
        Err(MarketError::BadName {
            text: text.into(),
            reason: "a registry is `oci://HOST[:PORT][/PREFIX]` or `oci-layout:DIR`".into(),
        })
    }
}

impl RegistryRef {
    /// Connect to the registry (nothing is sent until the first operation).
    pub fn open(&self) -> Result<Box<dyn Registry>, MarketError> {
        Ok(match self {
            RegistryRef::Oci { host, prefix } => Box::new(OciRegistry::new(host, prefix)?),
            RegistryRef::Layout(dir) => Box::new(LayoutRegistry::new(dir)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_named_by_scheme() {
        assert_eq!(
            "oci://127.0.0.1:5000/plugins"
                .parse::<RegistryRef>()
                .unwrap(),
            RegistryRef::Oci {
                host: "127.0.0.1:5000".into(),
                prefix: "plugins".into()
            }
        );
        assert_eq!(
            "oci-layout:out/market".parse::<RegistryRef>().unwrap(),
            RegistryRef::Layout("out/market".into())
        );
        let error = "https://x".parse::<RegistryRef>().unwrap_err().to_string();
        assert!(error.contains("oci-layout:DIR"), "{error}");
    }
}

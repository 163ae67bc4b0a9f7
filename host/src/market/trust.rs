//! Whom to trust: a TOML file listing trusted publisher keys (each for every namespace, or for
//! the namespaces it names) and whether plugins without a trusted signature may run at all.
//!
//! ```toml
//! allow_unsigned = false
//!
//! [[publisher]]
//! key = "ed25519:3b6a27bc..."
//! namespaces = ["games"]  # leave out for every namespace
//! ```
//!
//! A signature that does not verify is refused whatever the policy says. With `allow_unsigned`,
//! a plugin with no signature, or a valid one by a key the policy does not list, is accepted.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::signing::{PublisherKey, Signature, Statement};
use super::{MarketError, PackageId};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustPolicy {
    #[serde(default)]
    pub allow_unsigned: bool,
    #[serde(default, rename = "publisher")]
    pub publishers: Vec<TrustedPublisher>,
    /// Where the policy was read from, for errors.
    #[serde(skip)]
    origin: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedPublisher {
    pub key: PublisherKey,
    /// The namespaces this key may sign for; absent for all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
}

impl TrustPolicy {
    /// The policy of the file `path`; a missing file is the empty policy (nothing trusted,
    /// signatures required).
    pub fn load(path: &Path) -> Result<TrustPolicy, MarketError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(MarketError::io(path)(e)),
        };
        TrustPolicy::parse(&text, &path.display().to_string())
    }

    /// The policy written `text`, which errors call `origin`.
    pub fn parse(text: &str, origin: &str) -> Result<TrustPolicy, MarketError> {
        let mut policy: TrustPolicy = toml::from_str(text).map_err(|e| MarketError::Invalid {
            what: format!("the trust policy {origin}"),
            message: e.to_string(),
        })?;
        policy.origin = Some(origin.to_string());
        Ok(policy)
    }

    /// The policy as TOML.
    pub fn to_toml(&self) -> Result<String, MarketError> {
        toml::to_string_pretty(self).map_err(|e| MarketError::Invalid {
            what: "the trust policy".into(),
            message: e.to_string(),
        })
    }

    pub fn save(&self, path: &Path) -> Result<(), MarketError> {
        let text = self.to_toml()?;
        crate::store::write_atomic(path, text.as_bytes()).map_err(MarketError::io(path))
    }

    /// Trust `key` for `namespaces` (every namespace when `None`), replacing what the policy
    /// said of that key.
    pub fn trust(&mut self, key: PublisherKey, namespaces: Option<Vec<String>>) {
        self.publishers.retain(|p| p.key != key);
        self.publishers.push(TrustedPublisher { key, namespaces });
    }

    fn describe(&self) -> String {
        match &self.origin {
            Some(origin) => origin.clone(),
            None => "the default policy".into(),
        }
    }

    /// Whether the version `id`, fetched as `fetched`, may be used with `signature`: returns the
    /// trusted key that signed it, or `None` for an unsigned or untrusted one the policy allows.
    pub fn check(
        &self,
        id: &PackageId,
        signature: Option<&Signature>,
        fetched: &Statement,
    ) -> Result<Option<PublisherKey>, MarketError> {
        let Some(signature) = signature else {
            return if self.allow_unsigned {
                Ok(None)
            } else {
                Err(MarketError::SignatureMissing {
                    id: id.to_string(),
                    policy: self.describe(),
                })
            };
        };
        signature.verify(id, fetched)?;
        let namespace = id.name.namespace();
        let trusted = self.publishers.iter().any(|p| {
            p.key == signature.key
                && p.namespaces
                    .as_ref()
                    .is_none_or(|ns| ns.iter().any(|n| n == namespace))
        });
        if trusted {
            Ok(Some(signature.key))
        } else if self.allow_unsigned {
            Ok(None)
        } else {
            Err(MarketError::UntrustedPublisher {
                id: id.to_string(),
                key: signature.key.to_string(),
                namespace: namespace.to_string(),
                policy: self.describe(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::market::signing::KeyPair;
    use crate::market::{Digest, MarketErrorKind};

    #[test]
    fn the_policy_trusts_listed_keys_for_their_namespaces_only() {
        let id: PackageId = "games/maze@1.0.0".parse().unwrap();
        let fetched = Statement::new(&id, Digest::of(b"m"), Digest::of(b"c"));
        let publisher = KeyPair::generate().unwrap();
        let stranger = KeyPair::generate().unwrap();
        let mut policy = TrustPolicy::default();
        let kind = |r: Result<_, MarketError>| r.unwrap_err().kind();

        assert_eq!(
            kind(policy.check(&id, None, &fetched)),
            MarketErrorKind::SignatureMissing
        );
        let signed = publisher.sign(&fetched);
        assert_eq!(
            kind(policy.check(&id, Some(&signed), &fetched)),
            MarketErrorKind::UntrustedPublisher
        );
        policy.trust(publisher.public(), Some(vec!["tools".into()]));
        assert_eq!(
            kind(policy.check(&id, Some(&signed), &fetched)),
            MarketErrorKind::UntrustedPublisher
        );
        policy.trust(publisher.public(), None);
        assert_eq!(
            policy.check(&id, Some(&signed), &fetched).unwrap(),
            Some(publisher.public())
        );

        policy.allow_unsigned = true;
        assert_eq!(policy.check(&id, None, &fetched).unwrap(), None);
        let by_stranger = stranger.sign(&fetched);
        assert_eq!(
            policy.check(&id, Some(&by_stranger), &fetched).unwrap(),
            None
        );
        let changed = Statement::new(&id, Digest::of(b"m"), Digest::of(b"changed"));
        assert_eq!(
            kind(policy.check(&id, Some(&signed), &changed)),
            MarketErrorKind::SignatureInvalid
        );
    }

    #[test]
    fn a_policy_file_round_trips_and_a_wrong_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trust.toml");
        assert!(TrustPolicy::load(&path).unwrap().publishers.is_empty());
        let mut policy = TrustPolicy::default();
        policy.trust(KeyPair::generate().unwrap().public(), None);
        policy.save(&path).unwrap();
        assert_eq!(TrustPolicy::load(&path).unwrap().publishers.len(), 1);
        std::fs::write(&path, "allow_unsigned = true\nallow_everything = 1\n").unwrap();
        let error = TrustPolicy::load(&path).unwrap_err().to_string();
        assert!(error.contains("allow_everything"), "{error}");
    }
}

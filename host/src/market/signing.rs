//! Publisher keys (ed25519) and the signature of a published version: the publisher signs a
//! statement naming the package, the version, the manifest digest (which covers the metadata in
//! its annotations and config) and the component's digest, so that none of them can be changed,
//! swapped for another version's, or moved to another name without the signature failing.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::{Digest, MarketError, PackageId};

const PUBLIC_PREFIX: &str = "ed25519:";

/// A publisher's public key, written `ed25519:` and 64 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublisherKey(VerifyingKey);

impl fmt::Display for PublisherKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_PREFIX}{}", hex::encode(self.0.as_bytes()))
    }
}

impl FromStr for PublisherKey {
    type Err = MarketError;

    fn from_str(text: &str) -> Result<Self, MarketError> {
        let invalid = |message: &str| MarketError::Invalid {
            what: format!("the public key `{text}`"),
            message: message.to_string(),
        };
        let hex = text
            .trim()
            .strip_prefix(PUBLIC_PREFIX)
            .ok_or_else(|| invalid("a public key is `ed25519:` and 64 hex digits"))?;
        let bytes: [u8; 32] = hex::decode(hex)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| invalid("a public key is `ed25519:` and 64 hex digits"))?;
        VerifyingKey::from_bytes(&bytes)
            .map(PublisherKey)
            .map_err(|_| invalid("not a point of the ed25519 curve"))
    }
}

impl Serialize for PublisherKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublisherKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A publisher's key pair, kept in a file only its owner can read.
pub struct KeyPair(SigningKey);

/// The key pair file: the secret key and, for a reader's convenience, the public one.
#[derive(Serialize, Deserialize)]
struct KeyFile {
    secret_key: String,
    public_key: PublisherKey,
}

impl KeyPair {
    /// A new key pair from the operating system's randomness.
    pub fn generate() -> Result<KeyPair, MarketError> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| MarketError::Invalid {
            what: "the system's randomness".into(),
            message: e.to_string(),
        })?;
        Ok(KeyPair(SigningKey::from_bytes(&secret)))
    }

    pub fn public(&self) -> PublisherKey {
        PublisherKey(self.0.verifying_key())
    }

    /// Write the key pair to `path` (mode 0600), and its public key to `path.pub`; an existing
    /// key file is never overwritten.
    pub fn save(&self, path: &Path) -> Result<(), MarketError> {
        if path.exists() {
            return Err(MarketError::Invalid {
                what: format!("the key file {}", path.display()),
                message: "it exists already: a key is not overwritten (choose another path)".into(),
            });
        }
        let file = KeyFile {
            secret_key: hex::encode(self.0.to_bytes()),
            public_key: self.public(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| MarketError::Invalid {
            what: "the key file".into(),
            message: e.to_string(),
        })?;
        crate::store::write_atomic_with(path, |out| {
            use std::io::Write;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                out.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            out.write_all(text.as_bytes())
        })
        .map_err(MarketError::io(path))?;
        let public = public_key_path(path);
        crate::store::write_atomic(&public, format!("{}\n", self.public()).as_bytes())
            .map_err(MarketError::io(&public))
    }

    pub fn load(path: &Path) -> Result<KeyPair, MarketError> {
        let text = std::fs::read_to_string(path).map_err(MarketError::io(path))?;
        let invalid = |message: String| MarketError::Invalid {
            what: format!("the key file {}", path.display()),
            message,
        };
        let file: KeyFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let secret: [u8; 32] = hex::decode(&file.secret_key)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| invalid("secret_key is not 64 hex digits".into()))?;
        let pair = KeyPair(SigningKey::from_bytes(&secret));
        if pair.public() != file.public_key {
            return Err(invalid(
                "its public_key is not the secret key's: the file was changed".into(),
            ));
        }
        Ok(pair)
    }

    /// Sign what a published version is.
    pub fn sign(&self, statement: &Statement) -> Signature {
        let signature = self.0.sign(&statement.bytes());
        Signature {
            statement: statement.clone(),
            key: self.public(),
            signature: hex::encode(signature.to_bytes()),
        }
    }
}

/// Where `KeyPair::save` writes the public half of the key file `path`.
pub fn public_key_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    name.into()
}

/// What a publisher signs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    /// Always [`Statement::TYPE`]: a signature made for anything else does not verify as this.
    #[serde(rename = "type")]
    pub kind: String,
    /// `namespace/name@version`.
    pub package: String,
    pub manifest: Digest,
    pub component: Digest,
}

impl Statement {
    pub const TYPE: &str = "opentinker.plugin.signature/v1";

    pub fn new(id: &PackageId, manifest: Digest, component: Digest) -> Statement {
        Statement {
            kind: Self::TYPE.to_string(),
            package: id.to_string(),
            manifest,
            component,
        }
    }

    /// The signed bytes: the statement's JSON, fields in their declared order.
    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A signature as it is stored beside a published version.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Signature {
    pub statement: Statement,
    pub key: PublisherKey,
    /// The ed25519 signature of the statement, 128 hex digits.
    pub signature: String,
}

impl Signature {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    pub fn from_json(id: &PackageId, bytes: &[u8]) -> Result<Signature, MarketError> {
        serde_json::from_slice(bytes).map_err(|e| MarketError::SignatureInvalid {
            id: id.to_string(),
            reason: format!("the signature is not readable: {e}"),
        })
    }

    /// Check that this signs `expected` (the version as it was fetched) with its key.
    pub fn verify(&self, id: &PackageId, expected: &Statement) -> Result<(), MarketError> {
        let invalid = |reason: String| MarketError::SignatureInvalid {
            id: id.to_string(),
            reason,
        };
        if &self.statement != expected {
            return Err(invalid(format!(
                "it signs {} (manifest {}, component {}), not what was fetched (manifest {}, component {})",
                self.statement.package,
                self.statement.manifest,
                self.statement.component,
                expected.manifest,
                expected.component
            )));
        }
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| invalid("the signature is not 128 hex digits".into()))?;
        let signature = ed25519_dalek::Signature::from_bytes(&bytes);
        self.key
            .0
            .verify_strict(&expected.bytes(), &signature)
            .map_err(|_| invalid(format!("it does not verify with the key {}", self.key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(component: &[u8]) -> (PackageId, Statement) {
        let id: PackageId = "games/maze@1.0.0".parse().unwrap();
        let statement = Statement::new(&id, Digest::of(b"manifest"), Digest::of(component));
        (id, statement)
    }

    #[test]
    fn a_signature_verifies_only_what_it_signed_with_its_key() {
        let pair = KeyPair::generate().unwrap();
        let (id, signed) = statement(b"component");
        let signature = pair.sign(&signed);
        signature.verify(&id, &signed).unwrap();
        let read = Signature::from_json(&id, &signature.to_json()).unwrap();
        read.verify(&id, &signed).unwrap();

        let (_, other) = statement(b"other bytes");
        let error = signature.verify(&id, &other).unwrap_err();
        assert!(
            error.to_string().contains("not what was fetched"),
            "{error}"
        );

        let mut forged = signature.clone();
        forged.key = KeyPair::generate().unwrap().public();
        let error = forged.verify(&id, &signed).unwrap_err();
        assert!(error.to_string().contains("does not verify"), "{error}");
    }

    #[test]
    fn key_files_round_trip_and_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("publisher.key");
        let pair = KeyPair::generate().unwrap();
        pair.save(&path).unwrap();
        assert_eq!(KeyPair::load(&path).unwrap().public(), pair.public());
        let public = std::fs::read_to_string(public_key_path(&path)).unwrap();
        assert_eq!(
            public.trim().parse::<PublisherKey>().unwrap(),
            pair.public()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(pair.save(&path).is_err());
    }
}

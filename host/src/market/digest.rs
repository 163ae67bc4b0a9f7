//! A sha256 content digest as OCI writes it: `sha256:` and 64 lowercase hex digits.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// Bytes that are not what their digest says, or text that is not a digest (told as a
/// [`MarketError`](super::MarketError)'s `DigestMismatch` or `Invalid` once it leaves this file).
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error(
        "{what} has digest {found}, not the {expected} it was published with: the registry's copy was changed or damaged"
    )]
    Mismatch {
        what: String,
        expected: Digest,
        found: Digest,
    },
    #[error("a digest is not valid: `{text}` is not `sha256:` and 64 lowercase hex digits")]
    Invalid { text: String },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `Ok` when `bytes` have this digest; else a `DigestMismatch` naming `what` they are.
    pub fn check(&self, what: &str, bytes: &[u8]) -> Result<(), DigestError> {
        let found = Digest::of(bytes);
        if &found == self {
            Ok(())
        } else {
            Err(DigestError::Mismatch {
                what: what.to_string(),
                expected: self.clone(),
                found,
            })
        }
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(text: &str) -> Result<Self, DigestError> {
        let hex = text.strip_prefix("sha256:").unwrap_or("");
        if hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Digest(text.to_string()))
        } else {
            Err(DigestError::Invalid {
                text: text.to_string(),
            })
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked_when_parsed_and_against_bytes() {
        let digest = Digest::of(b"abc");
        assert_eq!(
            digest.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(digest.as_str().parse::<Digest>().unwrap(), digest);
        assert!(digest.check("the bytes", b"abc").is_ok());
        let error = digest
            .check("the component", b"abd")
            .unwrap_err()
            .to_string();
        assert!(error.contains("the component"), "{error}");
        for bad in ["sha256:ABC", "md5:00", "ba7816bf"] {
            assert!(bad.parse::<Digest>().is_err(), "{bad}");
        }
    }
}

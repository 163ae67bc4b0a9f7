//! NATS JWTs (version 2 of nats-io/jwt's format, which is not JOSE): a base64url header
//! `{"typ":"JWT","alg":"ed25519-nkey"}`, base64url JSON claims, and the signing nkey's ed25519
//! signature over `header.claims`, every part without padding. The claims' `jti` is the base32
//! SHA-256 of the claims with an empty `jti`, as the Go library makes it (NATS does not check it,
//! but it names the JWT in the server's logs).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use nkeys::KeyPair;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::error::QueueAuthError;

/// The JWT of `nats` (the claims NATS reads: the type, its limits or permissions) for `subject`
/// (a public key), named `name`, signed by `issuer`.
pub(super) fn sign(
    issuer: &KeyPair,
    subject: &str,
    name: &str,
    nats: Value,
) -> Result<String, QueueAuthError> {
    let mut claims = json!({
        "jti": "",
        "iat": crate::store::unix_now(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let serialized = serde_json::to_vec(&claims).map_err(QueueAuthError::encode)?;
    let id = data_encoding::BASE32_NOPAD.encode(&Sha256::digest(&serialized));
    claims["jti"] = Value::String(id);
    let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).map_err(QueueAuthError::encode)?);
    let signed = format!("{header}.{body}");
    let signature = issuer
        .sign(signed.as_bytes())
        .map_err(|e| QueueAuthError::Key(e.to_string()))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jwt_carries_its_claims_and_the_issuers_signature_over_them() {
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        let jwt = sign(&account, &user.public_key(), "w", json!({"type": "user"})).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], account.public_key());
        assert_eq!(claims["sub"], user.public_key());
        assert_eq!(claims["nats"]["type"], "user");
        assert_eq!(claims["jti"].as_str().unwrap().len(), 52);
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        let signed = format!("{}.{}", parts[0], parts[1]);
        account.verify(signed.as_bytes(), &signature).unwrap();
        assert!(user.verify(signed.as_bytes(), &signature).is_err());
    }
}

//! Exports for download (`save_weights_external`): the adapter in the external format the Tinker
//! cookbook's weights tools read, each file encrypted to the age recipients the client names
//! (its own keys, made for the download), so that the files are readable by that client alone
//! wherever they travel. The server keeps no key that opens them.

use std::io::Write;
use std::path::Path;

use age::x25519::Recipient;

use crate::api::ApiError;

/// The most recipients one export is encrypted to.
const MAX_RECIPIENTS: usize = 16;
/// The suffix of an encrypted file, as the cookbook expects it.
pub const ENCRYPTED_SUFFIX: &str = ".age";

/// The recipients named by a request (`age1...` keys), or a refusal naming the one that is not.
pub fn recipients(texts: &[String]) -> Result<Vec<Recipient>, ApiError> {
    if texts.len() > MAX_RECIPIENTS {
        return Err(ApiError::invalid(format!(
            "age_encryption_recipients: {} recipients; at most {MAX_RECIPIENTS}",
            texts.len()
        )));
    }
    texts
        .iter()
        .map(|text| {
            text.parse::<Recipient>().map_err(|_| {
                let kind = match text.starts_with("ssh-") {
                    true => "an SSH key (only native age keys, age1..., are taken here)",
                    false => "not an age recipient (age1...)",
                };
                ApiError::invalid(format!("age_encryption_recipients: {text:?} is {kind}"))
            })
        })
        .collect()
}

/// Encrypt every file of the folder `dir` to `recipients`, as `NAME.age` in place of `NAME`;
/// nothing when there are none.
pub fn seal(dir: &Path, recipients: &[Recipient]) -> std::io::Result<()> {
    if recipients.is_empty() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let plain = entry?.path();
        if !plain.is_file() {
            continue;
        }
        let mut sealed_name = plain.file_name().unwrap_or_default().to_os_string();
        sealed_name.push(ENCRYPTED_SUFFIX);
        let bytes = std::fs::read(&plain)?;
        let encryptor =
            age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
                .map_err(std::io::Error::other)?;
        let file = std::fs::File::create(dir.join(sealed_name))?;
        let mut writer = encryptor.wrap_output(std::io::BufWriter::new(file))?;
        writer.write_all(&bytes)?;
        writer.finish()?.flush()?;
        std::fs::remove_file(&plain)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn sealed_files_open_with_the_recipients_key_alone() {
        let identity = age::x25519::Identity::generate();
        let other = age::x25519::Identity::generate();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("adapter_config.json"), b"{\"r\": 4}").unwrap();
        let named = recipients(&[identity.to_public().to_string()]).unwrap();
        seal(dir.path(), &named).unwrap();
        assert!(!dir.path().join("adapter_config.json").exists());
        let sealed = std::fs::read(dir.path().join("adapter_config.json.age")).unwrap();
        let open = |key: &age::x25519::Identity| {
            let decryptor = age::Decryptor::new(&sealed[..]).unwrap();
            let mut reader = decryptor
                .decrypt(std::iter::once(key as &dyn age::Identity))
                .ok()?;
            let mut plain = Vec::new();
            reader.read_to_end(&mut plain).unwrap();
            Some(plain)
        };
        assert_eq!(open(&identity).unwrap(), b"{\"r\": 4}");
        assert!(open(&other).is_none(), "another key opened it");
    }

    #[test]
    fn bad_recipients_are_refused_by_name() {
        let err = recipients(&["ssh-ed25519 AAAA me@host".into()]).unwrap_err();
        assert!(err.message.contains("SSH key"), "{err}");
        let err = recipients(&["hello".into()]).unwrap_err();
        assert!(err.message.contains("\"hello\""), "{err}");
    }
}

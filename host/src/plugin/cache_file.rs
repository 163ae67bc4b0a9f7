//! The files of the on-disk compile caches (the component cache and Cranelift's per-function
//! cache), read as untrusted input: a regular file only, never through a link, of a bounded
//! size; and the length of the secret key their entries' MACs are made under.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The length of a cache's secret key (HMAC-SHA256's).
pub(crate) const KEY_LEN: usize = 32;

/// The bytes of `path` if it is a regular file (not followed through a link; a FIFO or device is
/// opened without blocking and refused) of at most `max` bytes.
pub(crate) fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if metadata.len() > max {
        return Err(std::io::Error::other(format!(
            "{} bytes, above the cache's limit of {max}",
            metadata.len()
        )));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    (&mut file).take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::other(
            "the file grew past the cache's limit",
        ));
    }
    Ok(bytes)
}

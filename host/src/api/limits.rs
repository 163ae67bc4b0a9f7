//! What one request may carry, checked before anything is sized from it.
//!
//! A hostile tenant controls every count and length of its requests. Each is checked here, in
//! the API's words (the refusal names the field), before a vector is allocated from it or a sum
//! is taken of it: a count over its limit is a bad request, never an allocation of that size, a
//! wrap or a panic. The wire's decoders also bound what they build by the body they read
//! ([`DecodeBudget`]), so that a small body cannot become a large value.

use super::{ApiError, UserMetadata};

/// The most samples one request may ask for.
pub const MAX_SAMPLES_PER_REQUEST: usize = 128;

/// How many bytes a decoder may build for each byte of the body it reads.
pub const DECODE_BYTES_PER_BODY_BYTE: usize = 16;

/// What any body may build however small it is (a request of a few empty datums).
pub const DECODE_FLOOR_BYTES: usize = 4 << 20;

/// The most bytes (keys and values together) of a request's `user_metadata`: it is kept with
/// the tenant's models and checkpoints for as long as they live.
pub const MAX_METADATA_BYTES: usize = 64 << 10;

/// A request's `user_metadata` (absent: empty), refused past [`MAX_METADATA_BYTES`].
pub fn check_user_metadata(metadata: Option<UserMetadata>) -> Result<UserMetadata, ApiError> {
    let metadata = metadata.unwrap_or_default();
    let bytes = metadata
        .iter()
        .fold(0usize, |n, (k, v)| n.saturating_add(k.len() + v.len()));
    if bytes > MAX_METADATA_BYTES {
        return Err(ApiError::invalid(format!(
            "user_metadata: {bytes} bytes; at most {MAX_METADATA_BYTES} are kept"
        )));
    }
    Ok(metadata)
}

/// Refuse a sample count outside `1..=MAX_SAMPLES_PER_REQUEST`; `field` is its name in the
/// request (`num_samples`, OpenAI's `n`).
pub fn check_num_samples(field: &str, n: usize) -> Result<usize, ApiError> {
    if n == 0 || n > MAX_SAMPLES_PER_REQUEST {
        return Err(ApiError::invalid(format!(
            "{field} must be 1 to {MAX_SAMPLES_PER_REQUEST}, not {n}"
        )));
    }
    Ok(n)
}

/// What a decoder may build of one body: [`DECODE_BYTES_PER_BODY_BYTE`] times its bytes, at
/// least [`DECODE_FLOOR_BYTES`]. A decoder charges what it is about to build before building
/// it, and stops with a refusal naming the request when the budget is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeBudget {
    left: usize,
}

impl DecodeBudget {
    /// The budget of a body of `body_bytes`.
    pub fn for_body(body_bytes: usize) -> Self {
        DecodeBudget {
            left: body_bytes
                .saturating_mul(DECODE_BYTES_PER_BODY_BYTE)
                .max(DECODE_FLOOR_BYTES),
        }
    }

    /// Spend `bytes` on what `what` is about to build, or refuse it.
    pub fn charge(&mut self, what: &str, bytes: usize) -> Result<(), ApiError> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(ApiError::invalid(format!(
                "{what}: the request would decode to more than {DECODE_BYTES_PER_BODY_BYTE} \
                 times its size (too many items for the bytes that carry them)"
            ))),
        }
    }

    /// What is left.
    pub fn left(&self) -> usize {
        self.left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_counts_outside_the_limit_are_refused_by_name() {
        assert_eq!(check_num_samples("n", 3).ok(), Some(3));
        for n in [0, MAX_SAMPLES_PER_REQUEST + 1, usize::MAX] {
            let error = check_num_samples("num_samples", n).err().unwrap();
            assert!(
                error.message.starts_with("num_samples must be 1 to"),
                "{error}"
            );
        }
    }

    #[test]
    fn metadata_past_its_size_is_refused_by_name() {
        let small = UserMetadata::from([("run".to_string(), "a".to_string())]);
        assert_eq!(check_user_metadata(Some(small.clone())).ok(), Some(small));
        assert_eq!(check_user_metadata(None).ok(), Some(UserMetadata::new()));
        let large = UserMetadata::from([("k".to_string(), "v".repeat(MAX_METADATA_BYTES))]);
        let error = check_user_metadata(Some(large)).unwrap_err();
        assert!(error.message.starts_with("user_metadata:"), "{error}");
    }

    #[test]
    fn a_budget_scales_with_the_body_and_refuses_past_it() {
        let mut small = DecodeBudget::for_body(10);
        assert_eq!(small.left(), DECODE_FLOOR_BYTES);
        let mut large = DecodeBudget::for_body(1 << 20);
        assert_eq!(large.left(), 16 << 20);
        large.charge("datums", 16 << 20).unwrap();
        assert!(large.charge("datums", 1).is_err());
        assert!(small.charge("datums", usize::MAX).is_err());
    }
}

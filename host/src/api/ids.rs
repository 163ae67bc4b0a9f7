//! Typed ids. Their text forms are the Tinker SDK's: a model is `{session}:train:{seq}` (the SDK
//! derives it on its own when it resumes), a sampler `{session}:sample:{seq}`, a custom loss `{session}:loss:{seq}`, a checkpoint
//! `tinker://{model}/weights/{name}` or `tinker://{model}/sampler_weights/{name}`.

use std::fmt;
use std::str::FromStr;

use super::ApiError;

/// Whether `text` may be a session id or a checkpoint name: 1 to 128 characters, letters,
/// digits, `-`, `_` and `.` (no `/` or `:`, which separate the parts of other ids).
fn is_plain_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text != "."
        && text != ".."
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// A tenant: the owner of sessions, models, samplers, checkpoints and futures.
    TenantId
);
string_id!(
    /// A client session (one `ServiceClient` of the SDK).
    SessionId
);
string_id!(
    /// A sampling session: a fixed policy (base model, or an adapter version) to sample from.
    SamplerId
);

string_id!(
    /// A job the server runs for a tenant (the jobs API, an opentinker extension).
    JobId
);

impl JobId {
    /// A fresh, unguessable id (`job-` and 16 hex digits).
    pub fn random() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes)?;
        Ok(JobId(format!("job-{}", hex::encode(bytes))))
    }

    /// A job id as a client names it: a plain name (no `/`), else refused as unknown.
    pub fn parse(id: &str) -> Result<Self, ApiError> {
        if is_plain_name(id) {
            Ok(JobId(id.to_string()))
        } else {
            Err(ApiError::not_found(format!("job {id:?}")))
        }
    }
}

impl TenantId {
    /// A tenant name: letters, digits, `-`, `_`, `.`, at most 128.
    pub fn new(name: &str) -> Result<Self, ApiError> {
        if is_plain_name(name) {
            Ok(TenantId(name.to_string()))
        } else {
            Err(ApiError::invalid(format!(
                "tenant name {name:?}: use 1 to 128 letters, digits, `-`, `_` or `.`"
            )))
        }
    }
}

impl SessionId {
    pub fn new(id: &str) -> Result<Self, ApiError> {
        if is_plain_name(id) {
            Ok(SessionId(id.to_string()))
        } else {
            Err(ApiError::invalid(format!("{id:?} is not a session id")))
        }
    }
}

string_id!(
    /// A sampled sequence (`SampledSequence.sequence_id`), which training data names in its
    /// provenance: the sample request's place in its sampler's order and the sample's index.
    SequenceId
);

impl SequenceId {
    /// The `index`-th sequence of request `seq` of `sampler`: the same for a repeat of the
    /// request, which the SDK sends under the same `seq_id`.
    pub fn of_sample(sampler: &SamplerId, seq: u64, index: usize) -> Self {
        SequenceId(format!("{sampler}#{seq}/{index}"))
    }

    /// Any id a client sends: unknown ones are answered "not found" later.
    pub fn parse(id: &str) -> Result<Self, ApiError> {
        if !id.is_empty() && id.len() <= 400 && id.chars().all(|c| c.is_ascii_graphic()) {
            Ok(SequenceId(id.to_string()))
        } else {
            Err(ApiError::invalid(format!("{id:?} is not a sequence id")))
        }
    }
}

impl SamplerId {
    /// The sampler a session numbers `seq`.
    pub fn of_session(session: &SessionId, seq: u64) -> Self {
        SamplerId(format!("{session}:sample:{seq}"))
    }

    /// The session that made the sampler (its id up to `:sample:`).
    pub fn session(&self) -> &str {
        self.0.split(":sample:").next().unwrap_or_default()
    }

    /// The sampler's number in its session (the order they were made in; 0 for an id of
    /// another form).
    pub fn seq(&self) -> u64 {
        self.0
            .rsplit_once(":sample:")
            .and_then(|(_, seq)| seq.parse().ok())
            .unwrap_or(0)
    }

    /// Any id a client sends: unknown ones are answered "not found" later.
    pub fn parse(id: &str) -> Result<Self, ApiError> {
        let ok = !id.is_empty()
            && id.len() <= 300
            && id
                .split(':')
                .all(|part| is_plain_name(part) || part.parse::<u64>().is_ok());
        if ok {
            Ok(SamplerId(id.to_string()))
        } else {
            Err(ApiError::invalid(format!("{id:?} is not a sampler id")))
        }
    }
}

/// An object a session numbers: the `seq`-th of its kind that the session created, written
/// `{session}:{kind}:{seq}`.
macro_rules! session_numbered {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            pub session: SessionId,
            pub seq: u64,
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!("{}:", $kind, ":{}"), self.session, self.seq)
            }
        }

        impl FromStr for $name {
            type Err = ApiError;

            fn from_str(text: &str) -> Result<Self, ApiError> {
                let bad = || {
                    ApiError::invalid(format!(
                        concat!("{:?} is not ", $what, " (`SESSION:", $kind, ":N`)"),
                        text
                    ))
                };
                let (session, seq) = text.rsplit_once(concat!(":", $kind, ":")).ok_or_else(bad)?;
                Ok($name {
                    session: SessionId::new(session).map_err(|_| bad())?,
                    seq: seq.parse().map_err(|_| bad())?,
                })
            }
        }
    };
}

session_numbered!(
    /// A trained model: the `seq`-th model its session created.
    ModelId, "train", "a model id"
);
session_numbered!(
    /// A custom loss: the `seq`-th loss its session created (`create_custom_loss`).
    LossId, "loss", "a custom loss id"
);

/// Serde through the text form.
macro_rules! serde_as_text {
    ($name:ident) => {
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_text!(ModelId);
serde_as_text!(LossId);
serde_as_text!(CheckpointPath);

/// What a checkpoint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CheckpointKind {
    /// The adapter and its optimizer state (`save_state`): training resumes from it.
    Weights,
    /// The adapter alone, for sampling.
    SamplerWeights,
    /// The adapter in the format the Tinker cookbook's weights tools read, each file
    /// age-encrypted if the client asked (`save_weights_external`): downloaded through signed
    /// URLs.
    External,
}

impl CheckpointKind {
    pub const ALL: [CheckpointKind; 3] = [
        CheckpointKind::Weights,
        CheckpointKind::SamplerWeights,
        CheckpointKind::External,
    ];

    /// The kind a path's segment names (`weights`, `sampler_weights`).
    pub fn from_segment(segment: &str) -> Option<Self> {
        match segment {
            "weights" => Some(CheckpointKind::Weights),
            "sampler_weights" => Some(CheckpointKind::SamplerWeights),
            "external_weights" => Some(CheckpointKind::External),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Weights => "weights",
            CheckpointKind::SamplerWeights => "sampler_weights",
            CheckpointKind::External => "external_weights",
        }
    }
}

/// `tinker://{model}/{kind}/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckpointPath {
    pub model: ModelId,
    pub kind: CheckpointKind,
    pub name: String,
}

impl CheckpointPath {
    pub fn new(model: ModelId, kind: CheckpointKind, name: &str) -> Result<Self, ApiError> {
        if !is_plain_name(name) {
            return Err(ApiError::invalid(format!(
                "checkpoint name {name:?}: use 1 to 128 letters, digits, `-`, `_` or `.`"
            )));
        }
        Ok(CheckpointPath {
            model,
            kind,
            name: name.to_string(),
        })
    }
}

impl fmt::Display for CheckpointPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tinker://{}/{}/{}",
            self.model,
            self.kind.as_str(),
            self.name
        )
    }
}

impl FromStr for CheckpointPath {
    type Err = ApiError;

    fn from_str(text: &str) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::invalid(format!(
                "{text:?} is not a checkpoint path (`tinker://MODEL/weights/NAME` or `tinker://MODEL/sampler_weights/NAME`)"
            ))
        };
        let rest = text.strip_prefix("tinker://").ok_or_else(bad)?;
        let mut parts = rest.split('/');
        let (Some(model), Some(kind), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let kind = CheckpointKind::from_segment(kind).ok_or_else(bad)?;
        CheckpointPath::new(model.parse().map_err(|_| bad())?, kind, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_and_paths_round_trip_in_the_sdks_forms() {
        let model: ModelId = "s-1a:train:3".parse().unwrap();
        assert_eq!(model.seq, 3);
        assert_eq!(model.to_string(), "s-1a:train:3");
        let path: CheckpointPath = "tinker://s-1a:train:3/sampler_weights/step-10"
            .parse()
            .unwrap();
        assert_eq!(path.kind, CheckpointKind::SamplerWeights);
        assert_eq!(
            path.to_string(),
            "tinker://s-1a:train:3/sampler_weights/step-10"
        );
    }

    #[test]
    fn ids_that_could_escape_a_folder_are_refused() {
        for bad in [
            "tinker://s:train:0/weights/..",
            "tinker://s:train:0/weights/a/b",
            "tinker://../train:0/weights/a",
            "tinker://s:train:x/weights/a",
            "file:///etc/passwd",
        ] {
            assert!(bad.parse::<CheckpointPath>().is_err(), "{bad}");
        }
        assert!("a/b".parse::<ModelId>().is_err());
        assert!(SamplerId::parse("../x").is_err());
    }
}

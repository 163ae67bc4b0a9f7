//! A plugin config checked against the JSON Schema the plugin declares in its metadata (a 0.2
//! export), so that a misspelt key or a bad value in a job is refused before any work, naming the
//! field, instead of failing the first episode.

use super::error::CallError;
use super::limits::Limits;
use super::loader::Plugin;

/// Why a config does not fit the plugin that takes it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the config is not JSON: {0}")]
    NotJson(String),
    #[error("the plugin's config schema is not a JSON Schema this host can check: {0}")]
    BadSchema(String),
    #[error("the config does not fit the plugin's schema: {}", .problems.join("; "))]
    Mismatch { problems: Vec<String> },
    #[error("asking the plugin for its metadata: {0}")]
    Metadata(#[from] CallError),
}

impl Plugin {
    /// Check `config` (JSON) against the schema the plugin declares; a plugin without one (every
    /// 0.1 component) accepts any config here and judges it itself.
    pub async fn check_config(&self, config: &str, limits: &Limits) -> Result<(), ConfigError> {
        let Some(schema) = self
            .metadata(limits)
            .await?
            .and_then(|metadata| metadata.config_schema)
        else {
            return Ok(());
        };
        check_against(&schema, config)
    }
}

/// Every way `config` breaks `schema`, each named by the field it is about.
fn check_against(schema: &serde_json::Value, config: &str) -> Result<(), ConfigError> {
    let instance: serde_json::Value =
        serde_json::from_str(config).map_err(|e| ConfigError::NotJson(e.to_string()))?;
    let validator =
        jsonschema::validator_for(schema).map_err(|e| ConfigError::BadSchema(e.to_string()))?;
    let problems: Vec<String> = validator
        .iter_errors(&instance)
        .map(|error| {
            let path = error.instance_path().as_str();
            match path.strip_prefix('/') {
                Some(field) => format!("`{}`: {error}", field.replace('/', ".")),
                None => error.to_string(),
            }
        })
        .collect();
    match problems.is_empty() {
        true => Ok(()),
        false => Err(ConfigError::Mismatch { problems }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "opponent": {"enum": ["random", "minimax"]},
                "depth": {"type": "integer", "minimum": 1}
            }
        })
    }

    #[test]
    fn a_fitting_config_passes_and_each_problem_names_its_field() {
        assert!(check_against(&schema(), r#"{"opponent": "random", "depth": 2}"#).is_ok());
        assert!(check_against(&schema(), "{}").is_ok());
        let error = check_against(&schema(), r#"{"opponent": "grandmaster", "depth": 0}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`opponent`") && error.contains("grandmaster"),
            "{error}"
        );
        assert!(error.contains("`depth`"), "{error}");
        let error = check_against(&schema(), r#"{"oponent": "random"}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("oponent"), "{error}");
    }

    #[test]
    fn a_config_that_is_not_json_or_a_schema_that_is_not_one_is_named() {
        assert!(matches!(
            check_against(&schema(), "{opponent"),
            Err(ConfigError::NotJson(_))
        ));
        let not_a_schema = serde_json::json!({"type": "no-such-type"});
        assert!(matches!(
            check_against(&not_a_schema, "{}"),
            Err(ConfigError::BadSchema(_))
        ));
    }
}

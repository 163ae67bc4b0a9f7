//! Package names (`namespace/name`), exact versions (`namespace/name@1.2.0`) and requirements
//! (`namespace/name@^1.2`), with semver's meaning of a range (a bare `1.2` is `^1.2`, as in Cargo).

use std::fmt;
use std::str::FromStr;

use semver::{Version, VersionReq};

/// A package name, version or range that does not parse: the text, and why (a
/// [`MarketError::BadName`](super::MarketError::BadName) once it leaves this file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a package name: {reason}")]
pub struct NameError {
    pub text: String,
    pub reason: String,
}

/// The longest namespace or name.
const MAX_PART: usize = 64;

/// `namespace/name`: lowercase letters, digits and inner `-`, each part at most 64 characters.
/// A namespace belongs to whoever first published into it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackageName {
    namespace: String,
    name: String,
}

impl PackageName {
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

fn check_part(text: &str, part: &str, what: &str) -> Result<(), NameError> {
    let bad = |reason: String| NameError {
        text: text.to_string(),
        reason,
    };
    if part.is_empty() || part.len() > MAX_PART {
        return Err(bad(format!(
            "the {what} must be 1 to {MAX_PART} characters"
        )));
    }
    if !part
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(bad(format!(
            "the {what} `{part}` may hold only lowercase letters, digits and `-`"
        )));
    }
    if part.starts_with('-') || part.ends_with('-') {
        return Err(bad(format!(
            "the {what} `{part}` may not begin or end with `-`"
        )));
    }
    Ok(())
}

impl FromStr for PackageName {
    type Err = NameError;

    fn from_str(text: &str) -> Result<Self, NameError> {
        let Some((namespace, name)) = text.split_once('/') else {
            return Err(NameError {
                text: text.to_string(),
                reason: "a package is named `namespace/name`".into(),
            });
        };
        check_part(text, namespace, "namespace")?;
        check_part(text, name, "name")?;
        Ok(PackageName {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for PackageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One published version: `namespace/name@1.2.0`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PackageId {
    pub name: PackageName,
    pub version: Version,
}

impl FromStr for PackageId {
    type Err = NameError;

    fn from_str(text: &str) -> Result<Self, NameError> {
        let Some((name, version)) = text.split_once('@') else {
            return Err(NameError {
                text: text.to_string(),
                reason:
                    "a published version is named `namespace/name@VERSION`, e.g. `me/maze@1.0.0`"
                        .into(),
            });
        };
        let version = Version::parse(version).map_err(|e| NameError {
            text: text.to_string(),
            reason: format!("`{version}` is not a semantic version (MAJOR.MINOR.PATCH): {e}"),
        })?;
        if !version.build.is_empty() {
            return Err(NameError {
                text: text.to_string(),
                reason: "build metadata (`+...`) is not part of a published version".into(),
            });
        }
        Ok(PackageId {
            name: name.parse()?,
            version,
        })
    }
}

impl fmt::Display for PackageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

/// A package and the versions that will do: `namespace/name@^1.2`, `namespace/name@=1.2.0`, or
/// `namespace/name` for any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageRef {
    pub name: PackageName,
    pub range: VersionReq,
}

impl PackageRef {
    /// Whether `text` is written as a package reference (`namespace/name@RANGE`) rather than a
    /// path: job files name plugins either way. A reference has one `/` before its `@`.
    pub fn looks_like(text: &str) -> bool {
        text.split_once('@')
            .is_some_and(|(name, _)| name.matches('/').count() == 1 && !name.starts_with('.'))
    }

    /// The highest of `versions` in range (the caller leaves yanked ones out).
    pub fn best<'a>(&self, versions: impl IntoIterator<Item = &'a Version>) -> Option<&'a Version> {
        versions.into_iter().filter(|v| self.range.matches(v)).max()
    }
}

impl FromStr for PackageRef {
    type Err = NameError;

    fn from_str(text: &str) -> Result<Self, NameError> {
        let (name, range) = text.split_once('@').unwrap_or((text, "*"));
        let range = VersionReq::parse(range).map_err(|e| NameError {
            text: text.to_string(),
            reason: format!(
                "`{range}` is not a version range (e.g. `^1.2`, `~1.2.3`, `=1.2.0`): {e}"
            ),
        })?;
        Ok(PackageRef {
            name: name.parse()?,
            range,
        })
    }
}

impl fmt::Display for PackageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_versions_and_ranges_parse_and_print_back() {
        let id: PackageId = "games/tic-tac-toe@1.2.0".parse().unwrap();
        assert_eq!(id.name.namespace(), "games");
        assert_eq!(id.to_string(), "games/tic-tac-toe@1.2.0");
        let wanted: PackageRef = "games/tic-tac-toe@^1.1".parse().unwrap();
        assert!(wanted.range.matches(&id.version));
        let any: PackageRef = "games/tic-tac-toe".parse().unwrap();
        assert!(any.range.matches(&id.version));
    }

    #[test]
    fn bad_names_say_what_is_wrong() {
        for (text, says) in [
            ("tictactoe", "namespace/name"),
            ("Games/x", "lowercase"),
            ("games/-x", "begin or end"),
            ("games/x/y", "lowercase"),
            ("games/", "1 to 64"),
        ] {
            let error = text.parse::<PackageName>().unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
        }
        let error = "games/x@one".parse::<PackageRef>().unwrap_err().to_string();
        assert!(error.contains("not a version range"), "{error}");
        let error = "games/x@1.2".parse::<PackageId>().unwrap_err().to_string();
        assert!(error.contains("not a semantic version"), "{error}");
        let error = "games/x@1.2.0+b1"
            .parse::<PackageId>()
            .unwrap_err()
            .to_string();
        assert!(error.contains("build metadata"), "{error}");
    }

    #[test]
    fn the_best_version_is_the_highest_in_range() {
        let wanted: PackageRef = "a/b@^1.2".parse().unwrap();
        let versions: Vec<Version> = ["1.1.0", "1.2.0", "1.9.3", "2.0.0"]
            .iter()
            .map(|v| Version::parse(v).unwrap())
            .collect();
        assert_eq!(wanted.best(&versions).unwrap().to_string(), "1.9.3");
        let none: PackageRef = "a/b@^3".parse().unwrap();
        assert!(none.best(&versions).is_none());
    }

    #[test]
    fn package_references_are_told_from_paths() {
        assert!(PackageRef::looks_like("games/maze@^1"));
        assert!(!PackageRef::looks_like("plugins/maze"));
        assert!(!PackageRef::looks_like("../plugins/maze"));
        assert!(!PackageRef::looks_like("/abs/a@b/c"));
        assert!(!PackageRef::looks_like("sha256:00ff"));
    }
}

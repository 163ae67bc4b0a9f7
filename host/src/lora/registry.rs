//! The registry of one loaded base model: the base weights and the published, immutable
//! versions of its adapters, shared (`Arc`) by the trainer, the sampler and the jobs that use
//! that model.
//!
//! Training updates an adapter's variables in place, so the sampler never reads them: it reads a
//! [`PolicyVersion`], a copy taken when the trainer publishes. A version lives as long as
//! something holds its `Arc` (a sampling client, a running request, the KL reference); the
//! registry keeps only a weak reference, so a version nothing uses is freed.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use super::{Adapter, AdapterMismatch};
use crate::model::Transformer;

/// An immutable adapter version: what the sampler decodes with.
#[derive(Debug)]
pub struct PolicyVersion {
    pub name: String,
    /// 1 for the first version published under `name`, then 2, 3, ...
    pub version: u64,
    pub adapter: Adapter,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RegistryError {
    #[error("no adapter named {0:?} was published on this base model")]
    UnknownAdapter(String),
    #[error(
        "adapter {name:?} has no version {version} (published: 1 to {latest}; a version nothing holds is freed)"
    )]
    UnknownVersion {
        name: String,
        version: u64,
        latest: u64,
    },
    #[error("adapter {name:?} does not fit this base model: {problem}")]
    Mismatch {
        name: String,
        problem: Box<AdapterMismatch>,
    },
}

#[derive(Default)]
struct Versions {
    latest: u64,
    live: BTreeMap<u64, Weak<PolicyVersion>>,
}

/// One base model and the adapter versions published on it.
pub struct AdapterRegistry {
    base: Arc<Transformer>,
    versions: Mutex<HashMap<String, Versions>>,
}

impl AdapterRegistry {
    pub fn new(base: Arc<Transformer>) -> Arc<Self> {
        Arc::new(AdapterRegistry {
            base,
            versions: Mutex::new(HashMap::new()),
        })
    }

    /// The frozen base weights.
    pub fn base(&self) -> &Arc<Transformer> {
        &self.base
    }

    /// Publish a copy of `adapter` as the next version of `name`. Later changes to `adapter`
    /// (training it further) never reach the copy.
    pub fn publish(
        &self,
        name: &str,
        adapter: &Adapter,
    ) -> Result<Arc<PolicyVersion>, RegistryError> {
        let frozen = adapter.frozen_copy().map_err(|e| RegistryError::Mismatch {
            name: name.to_string(),
            problem: Box::new(AdapterMismatch::Copy(e.to_string())),
        })?;
        if let Err(problem) = frozen.check_fits(&self.base.config) {
            return Err(RegistryError::Mismatch {
                name: name.to_string(),
                problem: Box::new(problem),
            });
        }
        let mut versions = self.lock();
        let entry = versions.entry(name.to_string()).or_default();
        entry.live.retain(|_, weak| weak.strong_count() > 0);
        entry.latest += 1;
        let version = Arc::new(PolicyVersion {
            name: name.to_string(),
            version: entry.latest,
            adapter: frozen,
        });
        entry.live.insert(entry.latest, Arc::downgrade(&version));
        Ok(version)
    }

    /// Version `version` of `name`, or its latest live version when `version` is `None`.
    pub fn get(
        &self,
        name: &str,
        version: Option<u64>,
    ) -> Result<Arc<PolicyVersion>, RegistryError> {
        let versions = self.lock();
        let entry = versions
            .get(name)
            .ok_or_else(|| RegistryError::UnknownAdapter(name.to_string()))?;
        let found = match version {
            Some(v) => entry.live.get(&v).and_then(Weak::upgrade),
            None => entry.live.values().rev().find_map(Weak::upgrade),
        };
        found.ok_or_else(|| RegistryError::UnknownVersion {
            name: name.to_string(),
            version: version.unwrap_or(entry.latest),
            latest: entry.latest,
        })
    }

    /// How many versions are alive (held by someone), over every adapter.
    pub fn live_versions(&self) -> usize {
        self.lock()
            .values()
            .map(|v| v.live.values().filter(|w| w.strong_count() > 0).count())
            .sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Versions>> {
        // A panic while holding the lock leaves the map consistent (every change is one insert).
        self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;
    use crate::lora::LoraConfig;
    use crate::model::{Architecture, Model};
    use crate::model::{TinyShape, init_tiny};

    fn values(adapter: &Adapter) -> Vec<Vec<f32>> {
        adapter
            .named_tensors()
            .iter()
            .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
            .collect()
    }

    #[test]
    fn versions_are_immutable_copies_freed_when_nothing_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        init_tiny(dir.path(), TinyShape::Tiny, Architecture::Qwen2, 3).unwrap();
        let model = Model::load(dir.path()).unwrap();
        let config = model.config.clone();
        let registry = AdapterRegistry::new(Arc::new(model.transformer));
        let live = Adapter::new(&config, LoraConfig::default(), DType::F32).unwrap();

        let first = registry.publish("policy", &live).unwrap();
        let published = values(&first.adapter);
        // Train the live adapter: the published copy does not move.
        for (_, var) in live.named_tensors() {
            var.set(&(var.as_tensor() + 1.0).unwrap()).unwrap();
        }
        assert_eq!(values(&first.adapter), published);
        assert_ne!(values(&live), published);

        let second = registry.publish("policy", &live).unwrap();
        assert_eq!((first.version, second.version), (1, 2));
        assert_eq!(registry.get("policy", None).unwrap().version, 2);
        assert_eq!(registry.get("policy", Some(1)).unwrap().version, 1);
        assert_eq!(registry.live_versions(), 2);

        drop(first);
        assert_eq!(registry.live_versions(), 1);
        let err = registry.get("policy", Some(1)).unwrap_err();
        assert!(err.to_string().contains("no version 1"), "{err}");
        let err = registry.get("nobody", None).unwrap_err();
        assert_eq!(err, RegistryError::UnknownAdapter("nobody".into()));

        let mut bigger = config.clone();
        bigger.num_layers += 1;
        let foreign = Adapter::new(&bigger, LoraConfig::default(), DType::F32).unwrap();
        let err = registry.publish("foreign", &foreign).unwrap_err();
        assert!(
            err.to_string()
                .contains("layer 4; the base model has 4 layers"),
            "{err}"
        );
    }
}

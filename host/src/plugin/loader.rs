//! The plugin host: one wasmtime engine and linker shared by every plugin, and the loading of a
//! component into a [`Plugin`]: size cap, compile in a bounded worker (or reuse the on-disk
//! cache), check its imports and exports, pre-instantiate.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use super::bindings::{v0_1, v0_2, v0_3};
use super::cache::CompileCache;
use super::compiler::{compile_in_worker, find_worker};
use super::contract::{
    AdvantageIndices, AgentIndices, EnvironmentIndices, MetadataIndices, ObjectiveIndices,
    RewardIndices,
};
use super::engine::{EngineSettings, EpochTicker, HostConfig, build_engine, slot_weight};
use super::error::{CallError, ErrorKind, LoadError};
use super::inspect::{self, ContractVersion, PluginDescription, PluginMetadata};
use super::limits::{LimitError, Limits, MAX_MEMORIES_PER_COMPONENT};
use super::sandbox::{Sandbox, StoreState, guarded_call};
use super::types::{EnvInfo, OutputSize};
use super::wasi;

/// Runs plugins: owns the engine, the linker of what plugins may import, and the compile cache.
/// Share one per process (it is cheap to clone a [`Plugin`], not to build a host).
pub struct PluginHost {
    engine: Engine,
    /// One permit per instance slot of the pooling allocator (a plugin of many memories takes
    /// several): a new instance waits for its slots instead of failing when they are in use.
    instance_slots: Arc<Semaphore>,
    linker: Linker<StoreState>,
    config: HostConfig,
    cache: Option<CompileCache>,
    _ticker: EpochTicker,
}

/// How a load went: whether the compile cache answered, and how long compiling took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadReport {
    pub cache_hit: bool,
    pub compile_time: Duration,
}

impl PluginHost {
    pub fn new(config: HostConfig) -> anyhow::Result<Self> {
        let engine = build_engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker, StoreState::clock)?;
        v0_2::opentinker::plugin::host::add_to_linker::<StoreState, HasSelf<StoreState>>(
            &mut linker,
            |state| state,
        )?;
        v0_1::opentinker::plugin::host::add_to_linker::<StoreState, HasSelf<StoreState>>(
            &mut linker,
            |state| state,
        )?;
        v0_3::opentinker::plugin::host::add_to_linker::<StoreState, HasSelf<StoreState>>(
            &mut linker,
            |state| state,
        )?;
        let cache = config.cache_dir.as_deref().and_then(|dir| {
            CompileCache::new(
                dir,
                &engine,
                config.cache_max_entry_bytes,
                config.cache_max_bytes,
            )
            .inspect_err(|error| tracing::warn!(%error, "running without a compile cache"))
            .ok()
        });
        let ticker = EpochTicker::start(engine.clone())?;
        Ok(PluginHost {
            instance_slots: Arc::new(Semaphore::new(config.max_instances as usize)),
            engine,
            linker,
            config,
            cache,
            _ticker: ticker,
        })
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Where compiled components of this engine are cached, if anywhere.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(CompileCache::dir)
    }

    /// Read and load a component file.
    pub async fn load_file(&self, path: &Path) -> Result<Plugin, LoadError> {
        let bytes = self.read(path)?;
        self.load(bytes).await
    }

    /// Load a component: compile it (or take it from the cache), refuse it if it is not a
    /// plugin this host supports, and pre-instantiate it.
    pub async fn load(&self, bytes: Vec<u8>) -> Result<Plugin, LoadError> {
        let (component, description, report) = self.compile(bytes).await?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::Link(format!("{e:#}")))?;
        let memories = component
            .resources_required()
            .map_or(MAX_MEMORIES_PER_COMPONENT, |required| required.num_memories);
        let version = inspect::check_supported(&description)?;
        let environment = EnvironmentIndices::new(&pre, version);
        let agent = AgentIndices::new(&pre, version);
        let reward = RewardIndices::new(&pre, version);
        let objective = ObjectiveIndices::new(&pre, version);
        let advantage = AdvantageIndices::new(&pre, version);
        let metadata =
            MetadataIndices::new(&pre, version).map_err(|e| LoadError::Link(format!("{e:#}")))?;
        Ok(Plugin(Arc::new(PluginInner {
            engine: self.engine.clone(),
            instance_slots: self.instance_slots.clone(),
            slot_weight: slot_weight(memories, self.config.max_instances),
            plugin_slots: Arc::new(Semaphore::new(
                self.config.max_instances_per_plugin as usize,
            )),
            plugin_slots_total: self.config.max_instances_per_plugin as usize,
            max_instances: self.config.max_instances as usize,
            pre,
            maxima: self.config.maxima.clone(),
            description,
            environment,
            agent,
            reward,
            objective,
            advantage,
            metadata,
            version,
            env_info: tokio::sync::OnceCell::new(),
            metadata_answer: tokio::sync::OnceCell::new(),
            report,
        })))
    }

    fn read(&self, path: &Path) -> Result<Vec<u8>, LoadError> {
        let read_error = |source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        };
        let size = std::fs::metadata(path).map_err(read_error)?.len();
        let max = self.config.max_component_bytes;
        if size > max as u64 {
            return Err(LoadError::TooLarge {
                size: usize::try_from(size).unwrap_or(usize::MAX),
                max,
            });
        }
        std::fs::read(path).map_err(read_error)
    }

    async fn compile(
        &self,
        bytes: Vec<u8>,
    ) -> Result<(Component, PluginDescription, LoadReport), LoadError> {
        let max = self.config.max_component_bytes;
        if bytes.len() > max {
            return Err(LoadError::TooLarge {
                size: bytes.len(),
                max,
            });
        }
        let digest = hex::encode(Sha256::digest(&bytes));
        let size = bytes.len();
        let cached = self
            .cache
            .as_ref()
            .and_then(|cache| cache.get(&self.engine, &digest));
        let (component, report) = match cached {
            Some(component) => (
                component,
                LoadReport {
                    cache_hit: true,
                    compile_time: Duration::ZERO,
                },
            ),
            None => {
                let started = Instant::now();
                let program = match &self.config.compile_worker {
                    Some(program) => program.clone(),
                    None => find_worker()?,
                };
                let settings = EngineSettings::of(&self.config);
                let component = compile_in_worker(
                    &self.engine,
                    &program,
                    &settings,
                    &self.config.compile,
                    self.cache.as_ref().map(CompileCache::functions).as_ref(),
                    &bytes,
                )
                .await?;
                // A cache that cannot be written costs the next load a compilation, not this one.
                if let Some(cache) = &self.cache
                    && let Err(error) = cache.put(&digest, &component)
                {
                    tracing::warn!(dir = %cache.dir().display(), %error, "could not cache a compiled component");
                }
                let report = LoadReport {
                    cache_hit: false,
                    compile_time: started.elapsed(),
                };
                (component, report)
            }
        };
        let description = inspect::describe(&self.engine, &component, digest, size);
        Ok((component, description, report))
    }
}

/// A loaded, pre-instantiated plugin. Cheap to clone; every episode gets a fresh instance.
#[derive(Clone)]
pub struct Plugin(pub(crate) Arc<PluginInner>);

pub(crate) struct PluginInner {
    pub(crate) engine: Engine,
    pub(crate) instance_slots: Arc<Semaphore>,
    /// The host's slots one instance of this plugin takes.
    pub(crate) slot_weight: u32,
    /// This plugin's share of the host's slots: its instances alive at once.
    pub(crate) plugin_slots: Arc<Semaphore>,
    pub(crate) plugin_slots_total: usize,
    pub(crate) max_instances: usize,
    pub(crate) pre: InstancePre<StoreState>,
    pub(crate) maxima: Limits,
    pub(crate) description: PluginDescription,
    pub(crate) environment: Option<EnvironmentIndices>,
    pub(crate) agent: Option<AgentIndices>,
    pub(crate) reward: Option<RewardIndices>,
    pub(crate) objective: Option<ObjectiveIndices>,
    pub(crate) advantage: Option<AdvantageIndices>,
    /// The metadata export (every component since 0.2 has one; 0.1 had none).
    pub(crate) metadata: Option<MetadataIndices>,
    /// The contract version the component implements.
    pub(crate) version: ContractVersion,
    pub(crate) env_info: tokio::sync::OnceCell<EnvInfo>,
    pub(crate) metadata_answer: tokio::sync::OnceCell<PluginMetadata>,
    pub(crate) report: LoadReport,
}

impl PluginInner {
    pub(crate) fn check_limits(&self, limits: &Limits) -> Result<(), LimitError> {
        limits.check_within(&self.maxima)
    }

    /// A fresh instance for one episode (or one stateless call), once `limits` are checked
    /// against the plugin's maxima and the instance has its slots: the plugin's own share
    /// first, so that a plugin at its cap waits without holding any of the host's slots (both
    /// semaphores are FIFO, so waiters are served in turn).
    pub(crate) async fn sandbox(&self, limits: &Limits, seed: u64) -> Result<Sandbox, CallError> {
        self.check_limits(limits)
            .map_err(|e| CallError::new(ErrorKind::InvalidRequest, e.to_string()))?;
        let closed = |_| {
            CallError::new(
                ErrorKind::InvalidRequest,
                "the plugin host is shutting down",
            )
        };
        let plugin_slot = self
            .plugin_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(closed)?;
        let host_slots = self
            .instance_slots
            .clone()
            .acquire_many_owned(self.slot_weight)
            .await
            .map_err(closed)?;
        let slots = (plugin_slot, host_slots);
        Sandbox::new(&self.engine, &self.pre, limits, seed, slots).await
    }
}

impl Plugin {
    pub fn description(&self) -> &PluginDescription {
        &self.0.description
    }

    /// sha256 of the component, hex.
    pub fn digest(&self) -> &str {
        &self.0.description.digest
    }

    /// The most instances (episodes, calls) of this plugin alive at once: its share of the
    /// host's slots, and the host's slots over what one instance takes.
    pub fn max_instances(&self) -> usize {
        let by_weight = self.0.max_instances / self.0.slot_weight.max(1) as usize;
        by_weight.min(self.0.plugin_slots_total)
    }

    pub fn load_report(&self) -> LoadReport {
        self.0.report
    }

    /// The contract version the plugin implements.
    pub fn contract(&self) -> ContractVersion {
        self.0.version
    }

    /// What the plugin says about itself (asked once, under `limits`, then remembered); `None`
    /// for a 0.1 component, which has no metadata export.
    pub async fn metadata(&self, limits: &Limits) -> Result<Option<PluginMetadata>, CallError> {
        let Some(indices) = &self.0.metadata else {
            return Ok(None);
        };
        if let Some(known) = self.0.metadata_answer.get() {
            return Ok(Some(known.clone()));
        }
        let mut sandbox = self.0.sandbox(limits, 0).await?;
        let instance = sandbox.instance;
        let answer = guarded_call!(&mut sandbox, 0, |store| indices.metadata(store, &instance))?;
        sandbox.check_output(OutputSize::metadata(&answer))?;
        let metadata = PluginMetadata::from_export(answer).map_err(|e| sandbox.fail(e))?;
        Ok(Some(
            self.0
                .metadata_answer
                .get_or_init(|| async { metadata })
                .await
                .clone(),
        ))
    }

    /// Check a job's limits against this host: each within the host's maxima.
    pub fn check_limits(&self, limits: &Limits) -> Result<(), LimitError> {
        self.0.check_limits(limits)
    }
}

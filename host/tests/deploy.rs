//! The Kubernetes deployment of `deploy/kubernetes/` checked against the Kubernetes API's
//! schemas and against itself: every document deserialises into its `k8s-openapi` type and
//! serialises back to the same document (a field the schema does not know, or a value of the
//! wrong type, fails), KEDA's `ScaledObject` into a strict copy of its CRD's fields, and the
//! pieces name each other rightly (the workers reach the queue's and the service's Services,
//! KEDA scales the workers' Deployment on the workers' consumer of the tasks stream, each
//! Service selects its pods).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// Every document of every manifest, with its file's name.
fn documents() -> Vec<(String, serde_json::Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .filter(|path| !path.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        for document in yaml_serde::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            documents.push((name.clone(), value));
        }
    }
    documents
}

/// `document` as a `T`, which must serialise back to the same document.
fn typed<T: DeserializeOwned + Serialize>(file: &str, document: &serde_json::Value) -> T {
    let typed: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|e| panic!("{file}: {} does not fit its schema: {e}", document["kind"]));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, document,
        "{file}: {} has fields its schema does not know, or values of the wrong type",
        document["kind"]
    );
    typed
}

/// KEDA's `ScaledObject` (`keda.sh/v1alpha1`): the fields of its CRD these manifests use, and no
/// others.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScaledObject {
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: ScaledObjectSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScaledObjectSpec {
    scale_target_ref: ScaleTargetRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_replica_count: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_replica_count: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    polling_interval: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cooldown_period: Option<i32>,
    triggers: Vec<Trigger>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScaleTargetRef {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_version: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Trigger {
    #[serde(rename = "type")]
    kind: String,
    metadata: BTreeMap<String, String>,
}

/// The manifests, typed.
#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    config_maps: Vec<ConfigMap>,
    services: Vec<Service>,
    stateful_sets: Vec<StatefulSet>,
    deployments: Vec<Deployment>,
    scaled_objects: Vec<ScaledObject>,
}

fn manifests() -> Manifests {
    let mut typed = Manifests::default();
    for (file, document) in documents() {
        let kind = document["kind"].as_str().unwrap_or_default().to_string();
        match (
            document["apiVersion"].as_str().unwrap_or_default(),
            kind.as_str(),
        ) {
            ("v1", "Namespace") => typed.namespaces.push(self::typed(&file, &document)),
            ("v1", "ConfigMap") => typed.config_maps.push(self::typed(&file, &document)),
            ("v1", "Service") => typed.services.push(self::typed(&file, &document)),
            ("apps/v1", "StatefulSet") => typed.stateful_sets.push(self::typed(&file, &document)),
            ("apps/v1", "Deployment") => typed.deployments.push(self::typed(&file, &document)),
            ("keda.sh/v1alpha1", "ScaledObject") => {
                typed.scaled_objects.push(self::typed(&file, &document))
            }
            (api, kind) => panic!("{file}: {api} {kind} is not a kind this deployment checks"),
        }
    }
    typed
}

fn name(metadata: &ObjectMeta) -> &str {
    metadata.name.as_deref().unwrap_or_default()
}

impl Manifests {
    fn service(&self, name: &str) -> &Service {
        self.services
            .iter()
            .find(|s| self::name(&s.metadata) == name)
            .unwrap_or_else(|| panic!("no Service {name}"))
    }

    /// The port named `port` of Service `service`.
    fn port(&self, service: &str, port: &str) -> i32 {
        let spec = self.service(service).spec.as_ref().unwrap();
        spec.ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port))
            .unwrap_or_else(|| panic!("Service {service} has no port {port}"))
            .port
    }

    /// Every pod template, with its labels.
    fn pods(&self) -> Vec<(&str, &BTreeMap<String, String>, &PodSpec)> {
        let sets = self.stateful_sets.iter().map(|s| {
            let template = &s.spec.as_ref().unwrap().template;
            (name(&s.metadata), template)
        });
        let deployments = self.deployments.iter().map(|d| {
            let template = &d.spec.as_ref().unwrap().template;
            (name(&d.metadata), template)
        });
        sets.chain(deployments)
            .map(|(name, template)| {
                let labels = template.metadata.as_ref().unwrap().labels.as_ref().unwrap();
                (name, labels, template.spec.as_ref().unwrap())
            })
            .collect()
    }

    fn args(&self, workload: &str) -> Vec<String> {
        let (_, _, pod) = self
            .pods()
            .into_iter()
            .find(|(name, _, _)| *name == workload)
            .unwrap_or_else(|| panic!("no workload {workload}"));
        pod.containers[0].args.clone().unwrap_or_default()
    }
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args.iter().position(|a| a == flag);
    at.and_then(|i| args.get(i + 1))
        .unwrap_or_else(|| panic!("{flag} is not given: {args:?}"))
}

#[test]
fn every_manifest_fits_the_kubernetes_schemas() {
    let typed = manifests();
    assert_eq!(typed.namespaces.len(), 1);
    assert_eq!(typed.stateful_sets.len(), 2, "NATS and the service");
    assert_eq!(typed.deployments.len(), 1, "the workers");
    assert_eq!(typed.scaled_objects.len(), 1, "the workers' autoscaling");
}

#[test]
fn the_manifests_name_each_other_rightly() {
    let typed = manifests();
    // Each Service selects pods that exist.
    let pods = typed.pods();
    for service in &typed.services {
        let selector = service.spec.as_ref().unwrap().selector.as_ref().unwrap();
        assert!(
            pods.iter()
                .any(|(_, labels, _)| selector.iter().all(|(k, v)| labels.get(k) == Some(v))),
            "Service {} selects no pod",
            name(&service.metadata)
        );
    }
    // The service listens where its Service sends.
    let serve = typed.args("opentinker-serve");
    let port = typed.port("opentinker-serve", "http");
    assert_eq!(flag(&serve, "--addr"), format!("0.0.0.0:{port}"));
    // The workers reach the queue and the service through their Services.
    let worker = typed.args("opentinker-worker");
    assert_eq!(worker[0], "worker");
    let nats = typed.port("nats", "client");
    assert_eq!(flag(&worker, "--queue"), format!("nats://nats:{nats}"));
    // The service publishes its jobs' groups to the same queue.
    assert_eq!(flag(&serve, "--rollouts"), format!("nats://nats:{nats}"));
    assert_eq!(
        flag(&worker, "--server"),
        format!("http://opentinker-serve:{port}")
    );
    // KEDA scales the workers on the pending tasks of their pool's consumer.
    let scaled = &typed.scaled_objects[0];
    assert_eq!(scaled.spec.scale_target_ref.name, "opentinker-worker");
    let trigger = &scaled.spec.triggers[0];
    assert_eq!(trigger.kind, "nats-jetstream");
    assert_eq!(trigger.metadata["stream"], opentinker::rl::TASKS_STREAM);
    let pool = opentinker::rl::Pool::new(flag(&worker, "--pool"));
    assert_eq!(trigger.metadata["consumer"], pool.consumer());
    let namespace = name(&typed.namespaces[0].metadata);
    let monitor = typed.port("nats", "monitor");
    assert_eq!(
        trigger.metadata["natsServerMonitoringEndpoint"],
        format!("nats.{namespace}.svc.cluster.local:{monitor}")
    );
    // NATS runs JetStream on its volume, its ports as the Service says.
    let config = &typed.config_maps[0].data.as_ref().unwrap()["nats.conf"];
    assert!(config.contains(&format!("port: {nats}")), "{config}");
    assert!(
        config.contains(&format!("http_port: {monitor}")),
        "{config}"
    );
    assert!(config.contains("store_dir: /data/"), "{config}");
}

/// `kustomization.yaml` applies every manifest, in the deployment's namespace.
#[test]
fn the_kustomization_lists_every_manifest() {
    #[derive(Deserialize)]
    struct Kustomization {
        namespace: String,
        resources: Vec<String>,
    }
    let text = std::fs::read_to_string(folder().join("kustomization.yaml")).unwrap();
    let kustomization: Kustomization = yaml_serde::from_str(&text).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(folder())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    files.sort();
    let mut listed = kustomization.resources.clone();
    listed.sort();
    assert_eq!(listed, files);
    let typed = manifests();
    assert_eq!(kustomization.namespace, name(&typed.namespaces[0].metadata));
}
